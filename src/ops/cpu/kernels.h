/*
 * kernels.h — the CPU backend's kernels (private to src/ops/cpu). They follow the signatures
 * of loom_backend in loom/ops.h; cpu_backend.c puts them in the table, with optional timing.
 */
#ifndef LOOM_OPS_CPU_KERNELS_H
#define LOOM_OPS_CPU_KERNELS_H

#include "loom/ops.h"

#include <stdint.h>

void cpu_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                         int T, int C);
void cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                          int T, int C);
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int64_t N, int C);
void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int64_t N, int C);
void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                        int64_t N, int C, int OC);
void cpu_matmul_backward_input(float *dinp, const float *dout, const float *weight, int64_t N,
                               int C, int OC);
void cpu_matmul_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                                int64_t N, int C, int OC);
void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                            int B, int T, int C, int NH);
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t N,
                         int C, float eps);
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int64_t N, int C);
void cpu_rope_forward(float *x, int B, int T, int64_t stride, int heads, int hd,
                      const loom_rope *rope);
void cpu_rope_backward(float *dx, int B, int T, int64_t stride, int heads, int hd,
                       const loom_rope *rope);
void cpu_attention_gqa_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                               int KV, int hd);
void cpu_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                int B, int T, int NH, int KV, int hd);
void cpu_swiglu_forward(float *out, const float *inp, int64_t N, int F);
void cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int F);
void cpu_gelu_forward(float *out, const float *inp, int64_t N);
void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N);
void cpu_residual_forward(float *out, const float *a, const float *b, int64_t N);
void cpu_bias_forward(float *out, const float *bias, int64_t N, int OC);
void cpu_encoder_shard_forward(float *out, const int32_t *inp, const float *wte, int64_t N, int C,
                               int row_start, int rows);
void cpu_encoder_shard_backward(float *dwte, const float *dout, const int32_t *inp, int64_t N,
                                int C, int row_start, int rows);
void cpu_position_forward(float *out, const float *wpe, int B, int T, int C);
void cpu_position_backward(float *dwpe, const float *dout, int B, int T, int C);
void cpu_softmax_xent_shard_max(float *row_max, const float *logits, int64_t N, int V, int Vp);
void cpu_softmax_xent_shard_expsum(float *probs, float *sums, float *target_logits,
                                   const float *logits, const float *row_max,
                                   const int32_t *targets, int64_t N, int V, int Vp,
                                   int vocab_start);
void cpu_softmax_xent_shard_forward(float *losses, float *probs, const float *sums,
                                    const float *target_logits, const int32_t *targets, int64_t N,
                                    int V, int Vp);
void cpu_softmax_xent_shard_backward(float *dlogits, const float *probs, const int32_t *targets,
                                     float dloss, int64_t N, int V, int Vp, int vocab_start);
void cpu_softmax_xent_forward(float *losses, float *probs, const float *logits,
                              const int32_t *targets, int64_t N, int V, int Vp);
void cpu_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                               float dloss, int64_t N, int V, int Vp);
void cpu_adamw_update(float *params, const float *grads, float *m, float *v, int64_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int64_t step,
                      float grad_scale);
double cpu_sum_squares(const float *x, int64_t n);
void cpu_scale(float *x, float s, int64_t n);

#endif
