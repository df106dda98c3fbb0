/*
 * reference.h — plain, obviously correct double-precision versions of every kernel. Tests
 * check the fast float kernels against these, and these against finite differences.
 * Same argument order and accumulation rules as loom_backend (loom/ops.h).
 */
#ifndef LOOM_OPS_CPU_REFERENCE_H
#define LOOM_OPS_CPU_REFERENCE_H

#include "loom/ops.h"

#include <stdint.h>

void ref_encoder_forward(double *out, const int32_t *inp, const double *wte, const double *wpe,
                         int B, int T, int C);
void ref_encoder_backward(double *dwte, double *dwpe, const double *dout, const int32_t *inp, int B,
                          int T, int C);
void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp,
                           const double *weight, const double *bias, int64_t N, int C);
void ref_layernorm_backward(double *dinp, double *dweight, double *dbias, const double *dout,
                            const double *inp, const double *weight, const double *mean,
                            const double *rstd, int64_t N, int C);
void ref_matmul_forward(double *out, const double *inp, const double *weight, const double *bias,
                        int64_t N, int C, int OC);
void ref_matmul_backward(double *dinp, double *dweight, double *dbias, const double *dout,
                         const double *inp, const double *weight, int64_t N, int C, int OC);
void ref_attention_forward(double *out, double *att, const double *qkv, int B, int T, int C,
                           int NH);
void ref_attention_backward(double *dqkv, const double *dout, const double *qkv, const double *att,
                            int B, int T, int C, int NH);
void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *weight,
                         int64_t N, int C, double eps);
void ref_rmsnorm_backward(double *dinp, double *dweight, const double *dout, const double *inp,
                          const double *weight, const double *rstd, int64_t N, int C);
void ref_rope_forward(double *x, int B, int T, int64_t stride, int heads, int hd,
                      const loom_rope *rope);
void ref_rope_backward(double *dx, int B, int T, int64_t stride, int heads, int hd,
                       const loom_rope *rope);
void ref_attention_gqa_forward(double *out, double *att, const double *qkv, int B, int T, int NH,
                               int KV, int hd);
void ref_attention_gqa_backward(double *dqkv, const double *dout, const double *qkv,
                                const double *att, int B, int T, int NH, int KV, int hd);
void ref_swiglu_forward(double *out, const double *inp, int64_t N, int F);
void ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int64_t N, int F);
void ref_gelu_forward(double *out, const double *inp, int64_t N);
void ref_gelu_backward(double *dinp, const double *inp, const double *dout, int64_t N);
void ref_residual_forward(double *out, const double *a, const double *b, int64_t N);
void ref_bias_forward(double *out, const double *bias, int64_t N, int OC);
void ref_encoder_shard_forward(double *out, const int32_t *inp, const double *wte, int64_t N, int C,
                               int row_start, int rows);
void ref_encoder_shard_backward(double *dwte, const double *dout, const int32_t *inp, int64_t N,
                                int C, int row_start, int rows);
void ref_position_forward(double *out, const double *wpe, int B, int T, int C);
void ref_position_backward(double *dwpe, const double *dout, int B, int T, int C);
void ref_softmax_xent_shard_max(double *row_max, const double *logits, int64_t N, int V, int Vp);
void ref_softmax_xent_shard_expsum(double *probs, double *sums, double *target_logits,
                                   const double *logits, const double *row_max,
                                   const int32_t *targets, int64_t N, int V, int Vp,
                                   int vocab_start);
void ref_softmax_xent_shard_forward(double *losses, double *probs, const double *sums,
                                    const double *target_logits, const int32_t *targets, int64_t N,
                                    int V, int Vp);
void ref_softmax_xent_shard_backward(double *dlogits, const double *probs, const int32_t *targets,
                                     double dloss, int64_t N, int V, int Vp, int vocab_start);
void ref_softmax_xent_forward(double *losses, double *probs, const double *logits,
                              const int32_t *targets, int64_t N, int V, int Vp);
void ref_softmax_xent_backward(double *dlogits, const double *probs, const int32_t *targets,
                               double dloss, int64_t N, int V, int Vp);
void ref_adamw_update(double *params, const double *grads, double *m, double *v, int64_t n,
                      double lr, double beta1, double beta2, double eps, double weight_decay,
                      int64_t step, double grad_scale);

#endif
