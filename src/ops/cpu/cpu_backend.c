/*
 * cpu_backend.c — the CPU backend table, thread control, and optional per-kernel timing
 * (used by `loom bench` to show where a step's time goes). Timing wrappers cost one
 * branch when profiling is off.
 */
#include "loom/ops.h"
#include "loom/base.h"
#include "ops/cpu/kernels.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

static int profile_enabled;
static double profile_seconds[LOOM_KERNEL_COUNT];

void loom_ops_profile_enable(int enabled) {
    profile_enabled = enabled;
}

void loom_ops_profile_reset(void) {
    for (int i = 0; i < LOOM_KERNEL_COUNT; i++) profile_seconds[i] = 0.0;
}

void loom_ops_profile_read(double seconds[LOOM_KERNEL_COUNT]) {
    for (int i = 0; i < LOOM_KERNEL_COUNT; i++) seconds[i] = profile_seconds[i];
}

const char *loom_ops_kernel_name(int kernel) {
    static const char *names[LOOM_KERNEL_COUNT] = {"encoder",      "layernorm", "matmul",
                                                   "attention",    "gelu",      "residual",
                                                   "softmax_xent", "adamw",     "other"};
    return kernel >= 0 && kernel < LOOM_KERNEL_COUNT ? names[kernel] : "?";
}

#define TIMED(kernel, call)                                                                        \
    do {                                                                                           \
        if (!profile_enabled) {                                                                    \
            call;                                                                                  \
        } else {                                                                                   \
            double t0_ = loom_now();                                                               \
            call;                                                                                  \
            profile_seconds[kernel] += loom_now() - t0_;                                           \
        }                                                                                          \
    } while (0)

static void t_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                              int B, int T, int C) {
    TIMED(LOOM_KERNEL_ENCODER, cpu_encoder_forward(out, inp, wte, wpe, B, T, C));
}
static void t_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                               int B, int T, int C) {
    TIMED(LOOM_KERNEL_ENCODER, cpu_encoder_backward(dwte, dwpe, dout, inp, B, T, C));
}
static void t_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int64_t N, int C) {
    TIMED(LOOM_KERNEL_LAYERNORM, cpu_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C));
}
static void t_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int64_t N, int C) {
    TIMED(LOOM_KERNEL_LAYERNORM,
          cpu_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C));
}
static void t_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                             int64_t N, int C, int OC) {
    TIMED(LOOM_KERNEL_MATMUL, cpu_matmul_forward(out, inp, weight, bias, N, C, OC));
}
static void t_matmul_backward_input(float *dinp, const float *dout, const float *weight, int64_t N,
                                    int C, int OC) {
    TIMED(LOOM_KERNEL_MATMUL, cpu_matmul_backward_input(dinp, dout, weight, N, C, OC));
}
static void t_matmul_backward_weight(float *dweight, float *dbias, const float *dout,
                                     const float *inp, int64_t N, int C, int OC) {
    TIMED(LOOM_KERNEL_MATMUL, cpu_matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC));
}
static void t_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                int NH) {
    TIMED(LOOM_KERNEL_ATTENTION, cpu_attention_forward(out, att, qkv, B, T, C, NH));
}
static void t_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                 int B, int T, int C, int NH) {
    TIMED(LOOM_KERNEL_ATTENTION, cpu_attention_backward(dqkv, dout, qkv, att, B, T, C, NH));
}
static void t_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                              int64_t N, int C, float eps) {
    TIMED(LOOM_KERNEL_LAYERNORM, cpu_rmsnorm_forward(out, rstd, inp, weight, N, C, eps));
}
static void t_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, int64_t N, int C) {
    TIMED(LOOM_KERNEL_LAYERNORM,
          cpu_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C));
}
static void t_rope_forward(float *x, int B, int T, int64_t stride, int heads, int hd,
                           const loom_rope *rope) {
    TIMED(LOOM_KERNEL_ATTENTION, cpu_rope_forward(x, B, T, stride, heads, hd, rope));
}
static void t_rope_backward(float *dx, int B, int T, int64_t stride, int heads, int hd,
                            const loom_rope *rope) {
    TIMED(LOOM_KERNEL_ATTENTION, cpu_rope_backward(dx, B, T, stride, heads, hd, rope));
}
static void t_attention_gqa_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                                    int KV, int hd) {
    TIMED(LOOM_KERNEL_ATTENTION, cpu_attention_gqa_forward(out, att, qkv, B, T, NH, KV, hd));
}
static void t_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv,
                                     const float *att, int B, int T, int NH, int KV, int hd) {
    TIMED(LOOM_KERNEL_ATTENTION,
          cpu_attention_gqa_backward(dqkv, dout, qkv, att, B, T, NH, KV, hd));
}
static void t_swiglu_forward(float *out, const float *inp, int64_t N, int F) {
    TIMED(LOOM_KERNEL_GELU, cpu_swiglu_forward(out, inp, N, F));
}
static void t_swiglu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int F) {
    TIMED(LOOM_KERNEL_GELU, cpu_swiglu_backward(dinp, inp, dout, N, F));
}
static void t_gelu_forward(float *out, const float *inp, int64_t N) {
    TIMED(LOOM_KERNEL_GELU, cpu_gelu_forward(out, inp, N));
}
static void t_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N) {
    TIMED(LOOM_KERNEL_GELU, cpu_gelu_backward(dinp, inp, dout, N));
}
static void t_residual_forward(float *out, const float *a, const float *b, int64_t N) {
    TIMED(LOOM_KERNEL_RESIDUAL, cpu_residual_forward(out, a, b, N));
}
static void t_bias_forward(float *out, const float *bias, int64_t N, int OC) {
    TIMED(LOOM_KERNEL_MATMUL, cpu_bias_forward(out, bias, N, OC));
}
static void t_encoder_shard_forward(float *out, const int32_t *inp, const float *wte, int64_t N,
                                    int C, int row_start, int rows) {
    TIMED(LOOM_KERNEL_ENCODER, cpu_encoder_shard_forward(out, inp, wte, N, C, row_start, rows));
}
static void t_encoder_shard_backward(float *dwte, const float *dout, const int32_t *inp, int64_t N,
                                     int C, int row_start, int rows) {
    TIMED(LOOM_KERNEL_ENCODER, cpu_encoder_shard_backward(dwte, dout, inp, N, C, row_start, rows));
}
static void t_position_forward(float *out, const float *wpe, int B, int T, int C) {
    TIMED(LOOM_KERNEL_ENCODER, cpu_position_forward(out, wpe, B, T, C));
}
static void t_position_backward(float *dwpe, const float *dout, int B, int T, int C) {
    TIMED(LOOM_KERNEL_ENCODER, cpu_position_backward(dwpe, dout, B, T, C));
}
static void t_softmax_xent_shard_max(float *row_max, const float *logits, int64_t N, int V,
                                     int Vp) {
    TIMED(LOOM_KERNEL_SOFTMAX_XENT, cpu_softmax_xent_shard_max(row_max, logits, N, V, Vp));
}
static void t_softmax_xent_shard_expsum(float *probs, float *sums, float *target_logits,
                                        const float *logits, const float *row_max,
                                        const int32_t *targets, int64_t N, int V, int Vp,
                                        int vocab_start) {
    TIMED(LOOM_KERNEL_SOFTMAX_XENT,
          cpu_softmax_xent_shard_expsum(probs, sums, target_logits, logits, row_max, targets, N, V,
                                        Vp, vocab_start));
}
static void t_softmax_xent_shard_forward(float *losses, float *probs, const float *sums,
                                         const float *target_logits, const int32_t *targets,
                                         int64_t N, int V, int Vp) {
    TIMED(LOOM_KERNEL_SOFTMAX_XENT,
          cpu_softmax_xent_shard_forward(losses, probs, sums, target_logits, targets, N, V, Vp));
}
static void t_softmax_xent_shard_backward(float *dlogits, const float *probs,
                                          const int32_t *targets, float dloss, int64_t N, int V,
                                          int Vp, int vocab_start) {
    TIMED(LOOM_KERNEL_SOFTMAX_XENT,
          cpu_softmax_xent_shard_backward(dlogits, probs, targets, dloss, N, V, Vp, vocab_start));
}
static void t_softmax_xent_forward(float *losses, float *probs, const float *logits,
                                   const int32_t *targets, int64_t N, int V, int Vp) {
    TIMED(LOOM_KERNEL_SOFTMAX_XENT,
          cpu_softmax_xent_forward(losses, probs, logits, targets, N, V, Vp));
}
static void t_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                                    float dloss, int64_t N, int V, int Vp) {
    TIMED(LOOM_KERNEL_SOFTMAX_XENT,
          cpu_softmax_xent_backward(dlogits, probs, targets, dloss, N, V, Vp));
}
static void t_adamw_update(float *params, const float *grads, float *m, float *v, int64_t n,
                           float lr, float beta1, float beta2, float eps, float weight_decay,
                           int64_t step, float grad_scale) {
    TIMED(LOOM_KERNEL_ADAMW, cpu_adamw_update(params, grads, m, v, n, lr, beta1, beta2, eps,
                                              weight_decay, step, grad_scale));
}
static double t_sum_squares(const float *x, int64_t n) {
    double r;
    TIMED(LOOM_KERNEL_OTHER, r = cpu_sum_squares(x, n));
    return r;
}
static void t_scale(float *x, float s, int64_t n) {
    TIMED(LOOM_KERNEL_OTHER, cpu_scale(x, s, n));
}

static const loom_backend cpu_backend = {
    .name = "cpu",
    .encoder_forward = t_encoder_forward,
    .encoder_backward = t_encoder_backward,
    .layernorm_forward = t_layernorm_forward,
    .layernorm_backward = t_layernorm_backward,
    .matmul_forward = t_matmul_forward,
    .matmul_backward_input = t_matmul_backward_input,
    .matmul_backward_weight = t_matmul_backward_weight,
    .attention_forward = t_attention_forward,
    .attention_backward = t_attention_backward,
    .rmsnorm_forward = t_rmsnorm_forward,
    .rmsnorm_backward = t_rmsnorm_backward,
    .rope_forward = t_rope_forward,
    .rope_backward = t_rope_backward,
    .attention_gqa_forward = t_attention_gqa_forward,
    .attention_gqa_backward = t_attention_gqa_backward,
    .swiglu_forward = t_swiglu_forward,
    .swiglu_backward = t_swiglu_backward,
    .gelu_forward = t_gelu_forward,
    .gelu_backward = t_gelu_backward,
    .residual_forward = t_residual_forward,
    .bias_forward = t_bias_forward,
    .encoder_shard_forward = t_encoder_shard_forward,
    .encoder_shard_backward = t_encoder_shard_backward,
    .position_forward = t_position_forward,
    .position_backward = t_position_backward,
    .softmax_xent_shard_max = t_softmax_xent_shard_max,
    .softmax_xent_shard_expsum = t_softmax_xent_shard_expsum,
    .softmax_xent_shard_forward = t_softmax_xent_shard_forward,
    .softmax_xent_shard_backward = t_softmax_xent_shard_backward,
    .softmax_xent_forward = t_softmax_xent_forward,
    .softmax_xent_backward = t_softmax_xent_backward,
    .adamw_update = t_adamw_update,
    .sum_squares = t_sum_squares,
    .scale = t_scale,
};

const loom_backend *loom_backend_cpu(void) {
    return &cpu_backend;
}

void loom_ops_set_threads(int threads) {
    if (threads <= 0) return;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

int loom_ops_get_threads(void) {
    return omp_get_max_threads();
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double loom_ops_sgemm_peak_gflops(int n, int reps) {
    size_t elems = (size_t)n * (size_t)n;
    float *a = loom_alloc_aligned(elems * sizeof(float), "sgemm peak A");
    float *b = loom_alloc_aligned(elems * sizeof(float), "sgemm peak B");
    float *c = loom_alloc_aligned(elems * sizeof(float), "sgemm peak C");
    if (!a || !b || !c || reps < 1 || reps > 64) {
        loom_free_aligned(a), loom_free_aligned(b), loom_free_aligned(c);
        return 0.0;
    }
    for (size_t i = 0; i < elems; i++) {
        a[i] = (float)((i * 7) % 13) * 0.01f;
        b[i] = (float)((i * 5) % 11) * 0.01f;
    }
    double times[64];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    for (int r = 0; r < reps; r++) {
        double t0 = loom_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        times[r] = loom_now() - t0;
    }
    qsort(times, (size_t)reps, sizeof times[0], compare_doubles);
    loom_free_aligned(a), loom_free_aligned(b), loom_free_aligned(c);
    return 2.0 * (double)n * n * n / times[reps / 2] / 1e9;
}
