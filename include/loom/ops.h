/*
 * loom/ops.h — the kernels of a GPT-2 step, each a forward/backward pair, behind a backend
 * table so that the model never #ifdefs on the device (CPU now, CUDA later).
 *
 * Conventions (llm.c's): outputs first, then inputs and weights, then sizes. Backward
 * functions ACCUMULATE (+=) into parameter gradients and into input gradients unless the
 * comment says otherwise. Shapes use B (batch), T (time), C (channels), NH (heads),
 * V (real vocabulary), Vp (padded vocabulary), N (rows = B*T), OC (output channels).
 * Linear weights are stored (OC, C) as in nn.Linear.
 *
 * Not here: parameter layout, communication, or anything that loops over layers.
 */
#ifndef LOOM_OPS_H
#define LOOM_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rotary positions (Llama): the base theta, and Llama 3.1's frequency scaling for long contexts
 * (Hugging Face's rope_scaling with rope_type "llama3"; factor 0: none). */
typedef struct {
    double factor;           /* 0: no scaling; else long wavelengths' frequencies divide by it */
    double low_freq_factor;  /* wavelengths over original_context / low_freq_factor: divided */
    double high_freq_factor; /* under original_context / high_freq_factor: kept; between: blended */
    double original_context; /* the context the unscaled frequencies were trained at */
} loom_rope_scaling;
typedef struct {
    double theta;
    loom_rope_scaling scaling;
} loom_rope;
/* The angle per position of pair i of a head of width hd: theta^(-2i/hd), and with scaling,
 * wavelength w = 2 pi / that: over original_context / low_freq_factor it is divided by factor,
 * under original_context / high_freq_factor kept, and between blended as (1 - a) f / factor + a f
 * with a = (original_context / w - low_freq_factor) / (high_freq_factor - low_freq_factor). */
double loom_rope_inv_freq(const loom_rope *rope, int i, int hd);

typedef struct loom_backend {
    const char *name;

    /* out (B,T,C) = wte[inp] + wpe[t] */
    void (*encoder_forward)(float *out, const int32_t *inp, const float *wte, const float *wpe,
                            int B, int T, int C);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                             int T, int C);

    /* out (N,C), mean (N), rstd (N); eps 1e-5 */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int64_t N, int C);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int64_t N, int C);

    /* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be NULL */
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           int64_t N, int C, int OC);
    /* matmul_forward's backward, in two parts that may run apart (zero-bubble pipelines: the
     * input gradient is on the critical path, the weight gradient can wait). They read the same
     * inputs and write disjoint outputs, so apart or together they give the same bits.
     * dinp (N,C) += dout (N,OC) @ weight (OC,C) */
    void (*matmul_backward_input)(float *dinp, const float *dout, const float *weight, int64_t N,
                                  int C, int OC);
    /* dweight (OC,C) += dout^T @ inp (N,C); dbias (OC) += column sums of dout (may be NULL) */
    void (*matmul_backward_weight)(float *dweight, float *dbias, const float *dout,
                                   const float *inp, int64_t N, int C, int OC);

    /* qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) keeps the causal softmax probabilities,
     * the only extra memory backward needs. Scale 1/sqrt(C/NH). */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
    void (*attention_backward)(float *dqkv, const float *dout, const float *qkv, const float *att,
                               int B, int T, int C, int NH);

    /* ---- the Llama family's kernels (RMSNorm, rotary positions, grouped-query attention,
     * SwiGLU); GPT-2 never calls them */

    /* RMSNorm: rstd (N) = 1 / sqrt(mean over C of inp^2 + eps), out (N,C) = inp * rstd * weight;
     * computed in fp32 (the sum of squares in double) */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight,
                            int64_t N, int C, float eps);
    /* dinp (N,C) += and dweight (C) += the gradients from dout, with forward's rstd */
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int64_t N, int C);
    /* Rotary position embedding in place, Hugging Face's rotate-half convention: in each of the
     * B*T rows of x (row (b, t) at x + (b*T + t) * stride, position t), the first `heads` heads of
     * hd floats each (hd even) have pairs (x[i], x[i + hd/2]), i < hd/2, rotated by the angle
     * t * loom_rope_inv_freq(rope, i, hd): (x1 cos - x2 sin, x2 cos + x1 sin). Backward rotates
     * by minus the angle (the rotation's transpose), turning the gradient of the rotated values
     * into the gradient of the values before it, in place. */
    void (*rope_forward)(float *x, int B, int T, int64_t stride, int heads, int hd,
                         const loom_rope *rope);
    void (*rope_backward)(float *dx, int B, int T, int64_t stride, int heads, int hd,
                          const loom_rope *rope);
    /* Grouped-query causal attention: qkv (B,T,(NH + 2 KV) hd), each row [q: NH heads | k: KV
     * heads | v: KV heads]; query head h reads kv head h / (NH / KV) (KV divides NH; KV == NH is
     * multi-head attention). out (B,T,NH hd); att (B,NH,T,T) the softmax probabilities. Scale
     * 1/sqrt(hd). Backward ACCUMULATES into dqkv (B,T,(NH + 2 KV) hd). */
    void (*attention_gqa_forward)(float *out, float *att, const float *qkv, int B, int T, int NH,
                                  int KV, int hd);
    void (*attention_gqa_backward)(float *dqkv, const float *dout, const float *qkv,
                                   const float *att, int B, int T, int NH, int KV, int hd);
    /* SwiGLU: inp (N, 2F) rows [gate | up], out (N,F) = silu(gate) * up, silu(g) = g / (1 +
     * exp(-g)). Backward ACCUMULATES into dinp (N, 2F). */
    void (*swiglu_forward)(float *out, const float *inp, int64_t N, int F);
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, int64_t N, int F);

    /* GELU, tanh approximation */
    void (*gelu_forward)(float *out, const float *inp, int64_t N);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, int64_t N);

    /* out = a + b */
    void (*residual_forward)(float *out, const float *a, const float *b, int64_t N);

    /* ---- tensor-parallel pieces: the arithmetic between two of the model's TP allreduces.
     * With one rank the model calls the whole kernels above instead. */

    /* out (N,OC) += bias (OC): a row-parallel layer's bias, added once after the sum over
     * ranks (each rank's GEMM leaves it out). Its gradient is matmul_backward_weight's
     * dbias. */
    void (*bias_forward)(float *out, const float *bias, int64_t N, int OC);
    /* Vocabulary-parallel embedding: this rank holds wte rows [row_start, row_start + rows).
     * out (N,C) = wte[inp - row_start] for the tokens it holds, 0 for the others (the sum over
     * ranks completes every row); backward scatters dout into the rows it holds. */
    void (*encoder_shard_forward)(float *out, const int32_t *inp, const float *wte, int64_t N,
                                  int C, int row_start, int rows);
    void (*encoder_shard_backward)(float *dwte, const float *dout, const int32_t *inp, int64_t N,
                                   int C, int row_start, int rows);
    /* out (B,T,C) += wpe[t]: the positions, added after the embedding's sum over ranks */
    void (*position_forward)(float *out, const float *wpe, int B, int T, int C);
    void (*position_backward)(float *dwpe, const float *dout, int B, int T, int C);
    /* Vocabulary-parallel softmax cross-entropy (Megatron): this rank holds logits (N,Vp) of
     * the vocabulary rows [vocab_start, vocab_start + Vp), the first V of them real (V may be
     * 0). Between the steps the model sums over ranks: the max of row_max, then the sum of
     * sums and of target_logits.
     * 1. row_max (N) = the max over this rank's V real logits (-inf when V is 0). */
    void (*softmax_xent_shard_max)(float *row_max, const float *logits, int64_t N, int V, int Vp);
    /* 2. probs (N,Vp) = exp(logits - row_max) over the V real columns, 0 in the padded ones
     *    (probs may alias logits); sums (N) their sum; target_logits (N) = the target's
     *    logit - row_max where this rank holds the target, else 0. */
    void (*softmax_xent_shard_expsum)(float *probs, float *sums, float *target_logits,
                                      const float *logits, const float *row_max,
                                      const int32_t *targets, int64_t N, int V, int Vp,
                                      int vocab_start);
    /* 3. probs (N,Vp) /= sums in place; losses (N) = log(sums) - target_logits, 0 where the
     *    target < 0. Takes the summed sums and target_logits. */
    void (*softmax_xent_shard_forward)(float *losses, float *probs, const float *sums,
                                       const float *target_logits, const int32_t *targets,
                                       int64_t N, int V, int Vp);
    /* dlogits (N,Vp) = dloss * (probs - onehot(target)) on this rank's columns, 0 in the padded
     * ones and in rows whose target < 0; OVERWRITES (may alias probs) */
    void (*softmax_xent_shard_backward)(float *dlogits, const float *probs, const int32_t *targets,
                                        float dloss, int64_t N, int V, int Vp, int vocab_start);

    /* Softmax cross-entropy over the first V of Vp logits per row (padded logits are left out
     * and get zero gradient). Forward: losses (N) and probs (N,Vp) (probs may alias logits).
     * A target < 0 marks a row that does not count (loss 0, zero gradient). */
    void (*softmax_xent_forward)(float *losses, float *probs, const float *logits,
                                 const int32_t *targets, int64_t N, int V, int Vp);
    /* dlogits (N,Vp) = dloss * (probs - onehot); OVERWRITES (may alias probs) */
    void (*softmax_xent_backward)(float *dlogits, const float *probs, const int32_t *targets,
                                  float dloss, int64_t N, int V, int Vp);

    /* AdamW on a contiguous range: m, v updated; decay applied when weight_decay != 0.
     * step is 1-based (bias correction). Gradients are multiplied by grad_scale first (global
     * norm clipping fused in: one pass over memory instead of two). */
    void (*adamw_update)(float *params, const float *grads, float *m, float *v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int64_t step,
                         float grad_scale);

    /* sum of squares, accumulated in double */
    double (*sum_squares)(const float *x, int64_t n);
    /* x *= s */
    void (*scale)(float *x, float s, int64_t n);
} loom_backend;

/* The CPU backend: OpenBLAS sgemm for every GEMM, OpenMP for the rest. */
const loom_backend *loom_backend_cpu(void);

/* Threads for both OpenMP kernels and OpenBLAS (0 = leave as is). */
void loom_ops_set_threads(int threads);
int loom_ops_get_threads(void);

/* Measured single-precision GEMM throughput in GFLOP/s: the median of `reps` timed
 * cblas_sgemm calls on n x n x n after one warm-up, with the current thread count. MFU is
 * reported against this, the machine's practical peak. */
double loom_ops_sgemm_peak_gflops(int n, int reps);

/* Per-kernel timing for `loom bench`: when enabled, each backend call adds its wall time to
 * a slot. Names are the kernel names above. */
enum {
    LOOM_KERNEL_ENCODER,
    LOOM_KERNEL_LAYERNORM,
    LOOM_KERNEL_MATMUL,
    LOOM_KERNEL_ATTENTION,
    LOOM_KERNEL_GELU,
    LOOM_KERNEL_RESIDUAL,
    LOOM_KERNEL_SOFTMAX_XENT,
    LOOM_KERNEL_ADAMW,
    LOOM_KERNEL_OTHER,
    LOOM_KERNEL_COUNT
};
void loom_ops_profile_enable(int enabled);
void loom_ops_profile_reset(void);
/* seconds spent per kernel since the last reset */
void loom_ops_profile_read(double seconds[LOOM_KERNEL_COUNT]);
const char *loom_ops_kernel_name(int kernel);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_OPS_H */
