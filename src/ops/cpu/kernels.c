/*
 * kernels.c — the CPU backend's fast kernels. Every GEMM (including the per-head products of
 * attention) goes through OpenBLAS cblas_sgemm; the element-wise and row-wise kernels are
 * OpenMP loops with static schedules, so that results are bit-reproducible for a fixed
 * thread count (resume relies on that). Reductions across rows (LayerNorm and bias
 * gradients) use per-thread partial sums added in a fixed order.
 *
 * Not here: the plain reference versions (reference.c) or any knowledge of the model.
 */
#include "ops/cpu/kernels.h"

#include "loom/base.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define LN_EPS 1e-5f

/* exp(x) for float, written so that loops over it vectorise (libm's expf does not without
 * -ffast-math): x = n ln2 + r with |r| <= ln2/2 (Cody–Waite split of ln2), e^r by its degree-7
 * Taylor polynomial (relative error below 2e-7 on that range), times 2^n built in the exponent
 * bits. Inputs are clamped to the normal float range; softmax only feeds it x <= 0. */
static inline float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* round to nearest by the 1.5 * 2^23 trick: floorf() would stop the loop vectorising */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

void cpu_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe, int B,
                         int T, int C) {
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int t = (int)(bt % T);
        const float *tok = wte + (int64_t)inp[bt] * C;
        const float *pos = wpe + (int64_t)t * C;
        float *o = out + bt * C;
        for (int c = 0; c < C; c++) o[c] = tok[c] + pos[c];
    }
}

void cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,
                          int T, int C) {
    /* Rows of dwte may repeat (same token twice), so the scatter stays serial over (b, t);
     * dwpe is parallel over t. Both are a small share of a step. */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *dp = dwpe + (int64_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((int64_t)b * T + t) * C;
            for (int c = 0; c < C; c++) dp[c] += d[c];
        }
    }
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        float *dt = dwte + (int64_t)inp[bt] * C;
        const float *d = dout + bt * C;
        for (int c = 0; c < C; c++) dt[c] += d[c];
    }
}

void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int64_t N, int C) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        float sum = 0.0f;
        for (int c = 0; c < C; c++) sum += x[c];
        float m = sum / (float)C;
        float var = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            var += d * d;
        }
        float s = 1.0f / sqrtf(var / (float)C + LN_EPS);
        float *o = out + i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int64_t N, int C) {
    int nthreads = omp_get_max_threads();
    float *partial = calloc((size_t)nthreads * 2 * (size_t)C, sizeof(float));
    if (!partial) {
        /* a few KB; failure here means the process is already lost */
        loom_fatal("layernorm_backward: cannot allocate %zu bytes of partial sums",
                   (size_t)nthreads * 2 * (size_t)C * sizeof(float));
    }
#pragma omp parallel num_threads(nthreads)
    {
        float *pw = partial + (size_t)omp_get_thread_num() * 2 * (size_t)C;
        float *pb = pw + C;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N; i++) {
            const float *x = inp + i * C;
            const float *d = dout + i * C;
            float m = mean[i], s = rstd[i];
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                float dnorm = weight[c] * d[c];
                dnorm_mean += dnorm;
                dnorm_norm_mean += dnorm * norm;
                pw[c] += norm * d[c];
                pb[c] += d[c];
            }
            dnorm_mean /= (float)C;
            dnorm_norm_mean /= (float)C;
            float *dx = dinp + i * C;
            for (int c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                float dnorm = weight[c] * d[c];
                dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
            }
        }
    }
    for (int t = 0; t < nthreads; t++) {
        const float *pw = partial + (size_t)t * 2 * (size_t)C;
        for (int c = 0; c < C; c++) {
            dweight[c] += pw[c];
            dbias[c] += pw[C + c];
        }
    }
    free(partial);
}

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t N,
                         int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *x = inp + i * C;
        /* the sum of squares in double: one long row of large activations would lose digits in
         * float; rstd rounded to float once */
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * (double)x[c];
        float s = (float)(1.0 / sqrt(ss / (double)C + (double)eps));
        float *o = out + i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * s * weight[c];
        rstd[i] = s;
    }
}

void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, const float *rstd, int64_t N, int C) {
    /* With norm = x * rstd and dnorm = weight * dout:
     * dx = rstd * (dnorm - norm * mean(dnorm * norm)), dweight = sum over rows of norm * dout.
     * dweight from per-thread partial sums added in thread order, as layernorm_backward. */
    int nthreads = omp_get_max_threads();
    float *partial = calloc((size_t)nthreads * (size_t)C, sizeof(float));
    if (!partial) {
        loom_fatal("rmsnorm_backward: cannot allocate %zu bytes of partial sums",
                   (size_t)nthreads * (size_t)C * sizeof(float));
    }
#pragma omp parallel num_threads(nthreads)
    {
        float *pw = partial + (size_t)omp_get_thread_num() * (size_t)C;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N; i++) {
            const float *x = inp + i * C;
            const float *d = dout + i * C;
            float s = rstd[i];
            float dnorm_norm_mean = 0.0f;
            for (int c = 0; c < C; c++) {
                float norm = x[c] * s;
                dnorm_norm_mean += weight[c] * d[c] * norm;
                pw[c] += norm * d[c];
            }
            dnorm_norm_mean /= (float)C;
            float *dx = dinp + i * C;
            for (int c = 0; c < C; c++) {
                float norm = x[c] * s;
                dx[c] += (weight[c] * d[c] - norm * dnorm_norm_mean) * s;
            }
        }
    }
    for (int t = 0; t < nthreads; t++) {
        const float *pw = partial + (size_t)t * (size_t)C;
        for (int c = 0; c < C; c++) dweight[c] += pw[c];
    }
    free(partial);
}

void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                        int64_t N, int C, int OC) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < N; i++) memcpy(out + i * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, OC, C, 1.0f, inp, C, weight, C,
                beta, out, OC);
}

void cpu_matmul_backward_input(float *dinp, const float *dout, const float *weight, int64_t N,
                               int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
}

void cpu_matmul_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                                int64_t N, int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, (int)N, 1.0f, dout, OC, inp, C,
                1.0f, dweight, C);
    if (!dbias) return;
    /* column sums of dout, a block of columns per thread so every sum is in row order */
    enum { BLOCK = 64 };
    int64_t nblocks = (OC + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < nblocks; blk++) {
        int o0 = (int)(blk * BLOCK);
        int o1 = o0 + BLOCK < OC ? o0 + BLOCK : OC;
        float acc[BLOCK] = {0};
        for (int64_t i = 0; i < N; i++) {
            const float *d = dout + i * OC;
            for (int o = o0; o < o1; o++) acc[o - o0] += d[o];
        }
        for (int o = o0; o < o1; o++) dbias[o] += acc[o - o0];
    }
}

/* The per-(batch, head) products are small; run them in parallel over (b, h) with OpenBLAS
 * single-threaded inside, and give OpenBLAS its threads back afterwards. */
static int blas_threads_push_single(void) {
    int saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
    return saved;
}

static void blas_threads_pop(int saved) {
    if (saved != 1) openblas_set_num_threads(saved);
}

/* Scores (T,T) -> causal softmax probabilities in place: row t over s <= t, zero above. */
static inline void causal_softmax_rows(float *p, int T) {
    for (int t = 0; t < T; t++) {
        float *row = p + (int64_t)t * T;
        float maxv = row[0];
        for (int s = 1; s <= t; s++) maxv = row[s] > maxv ? row[s] : maxv;
        float sum = 0.0f;
        for (int s = 0; s <= t; s++) {
            row[s] = exp_approx(row[s] - maxv);
            sum += row[s];
        }
        float inv = 1.0f / sum;
        for (int s = 0; s <= t; s++) row[s] *= inv;
        for (int s = t + 1; s < T; s++) row[s] = 0.0f;
    }
}

/* dP (T,T) -> dS = P * (dP - rowsum(dP * P)) in place, for the causal P; zero above. */
static inline void causal_softmax_backward_rows(float *dp, const float *p, int T) {
    for (int t = 0; t < T; t++) {
        float *drow = dp + (int64_t)t * T;
        const float *prow = p + (int64_t)t * T;
        float dot = 0.0f;
        for (int s = 0; s <= t; s++) dot += drow[s] * prow[s];
        for (int s = 0; s <= t; s++) drow[s] = prow[s] * (drow[s] - dot);
        for (int s = t + 1; s < T; s++) drow[s] = 0.0f;
    }
}

void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int saved = blas_threads_push_single();
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < (int64_t)B * NH; bh++) {
        int b = (int)(bh / NH), h = (int)(bh % NH);
        const float *q = qkv + (int64_t)b * T * C3 + h * hs;
        const float *k = q + C;
        const float *v = q + 2 * C;
        float *p = att + bh * T * T;
        /* scores (T,T) = q k^T * scale; only the causal lower triangle is used */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, p,
                    T);
        causal_softmax_rows(p, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, v, C3, 0.0f,
                    out + (int64_t)b * T * C + h * hs, C);
    }
    blas_threads_pop(saved);
}

void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                            int B, int T, int C, int NH) {
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int nthreads = omp_get_max_threads();
    /* one T x T scratch per thread: the gradient of the scores, never the whole (B,NH,T,T) */
    size_t scratch_bytes = (size_t)nthreads * (size_t)T * (size_t)T * sizeof(float);
    float *scratch = malloc(scratch_bytes);
    if (!scratch) {
        loom_fatal("attention_backward: cannot allocate %zu bytes of score-gradient scratch",
                   scratch_bytes);
    }
    int saved = blas_threads_push_single();
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t bh = 0; bh < (int64_t)B * NH; bh++) {
        int b = (int)(bh / NH), h = (int)(bh % NH);
        float *dp = scratch + (size_t)omp_get_thread_num() * (size_t)T * (size_t)T;
        const float *q = qkv + (int64_t)b * T * C3 + h * hs;
        const float *k = q + C;
        const float *v = q + 2 * C;
        float *dq = dqkv + (int64_t)b * T * C3 + h * hs;
        float *dk = dq + C;
        float *dv = dq + 2 * C;
        const float *p = att + bh * T * T;
        const float *dO = dout + (int64_t)b * T * C + h * hs;
        /* dP = dO v^T ; dv += P^T dO */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, C, v, C3, 0.0f, dp,
                    T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, dO, C, 1.0f, dv,
                    C3);
        /* softmax backward: dS = P * (dP - sum(dP * P)) */
        causal_softmax_backward_rows(dp, p, T);
        /* dq += scale * dS k ; dk += scale * dS^T q */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, dp, T, k, C3, 1.0f,
                    dq, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, dp, T, q, C3, 1.0f,
                    dk, C3);
    }
    blas_threads_pop(saved);
    free(scratch);
}

/* RoPE, in place, by +angle (sign 1) or -angle (sign -1). inv_freq (loom_rope_inv_freq) and
 * the angle t * inv_freq are computed in double (at t in the thousands a float angle would be off
 * by far more than an ulp of its sine), then cos and sin in double, rounded to float once
 * into a (T, hd/2) table; the rotation itself is float arithmetic. */
static void rope_rotate(float *x, int B, int T, int64_t stride, int heads, int hd,
                        const loom_rope *rope, float sign) {
    int half = hd / 2;
    size_t table_bytes = 2 * (size_t)T * (size_t)half * sizeof(float);
    float *cos_t = malloc(table_bytes ? table_bytes : 1);
    if (!cos_t) loom_fatal("rope: cannot allocate %zu bytes of cos/sin table", table_bytes);
    float *sin_t = cos_t + (size_t)T * (size_t)half;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double angle = (double)t * loom_rope_inv_freq(rope, i, hd);
            cos_t[(size_t)t * half + i] = (float)cos(angle);
            sin_t[(size_t)t * half + i] = sign * (float)sin(angle);
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int t = (int)(bt % T);
        const float *cs = cos_t + (size_t)t * half;
        const float *sn = sin_t + (size_t)t * half;
        float *row = x + bt * stride;
        for (int h = 0; h < heads; h++) {
            float *x1 = row + (int64_t)h * hd;
            float *x2 = x1 + half;
            for (int i = 0; i < half; i++) {
                float a = x1[i], b = x2[i];
                x1[i] = a * cs[i] - b * sn[i];
                x2[i] = b * cs[i] + a * sn[i];
            }
        }
    }
    free(cos_t);
}

void cpu_rope_forward(float *x, int B, int T, int64_t stride, int heads, int hd,
                      const loom_rope *rope) {
    rope_rotate(x, B, T, stride, heads, hd, rope, 1.0f);
}

/* the transpose of forward's rotation is the rotation by minus the angle */
void cpu_rope_backward(float *dx, int B, int T, int64_t stride, int heads, int hd,
                       const loom_rope *rope) {
    rope_rotate(dx, B, T, stride, heads, hd, rope, -1.0f);
}

/* Grouped-query attention: attention_forward with the row layout [q: NH | k: KV | v: KV] heads
 * of hd and query head h reading kv head h / (NH / KV). With KV == NH it does the same float
 * operations as attention_forward/backward. */
void cpu_attention_gqa_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                               int KV, int hd) {
    int group = NH / KV;
    int C = NH * hd;            /* width of q, and of a row of out */
    int W = (NH + 2 * KV) * hd; /* width of a row of qkv */
    float scale = 1.0f / sqrtf((float)hd);
    int saved = blas_threads_push_single();
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < (int64_t)B * NH; bh++) {
        int b = (int)(bh / NH), h = (int)(bh % NH), g = h / group;
        const float *base = qkv + (int64_t)b * T * W;
        const float *q = base + (int64_t)h * hd;
        const float *k = base + C + (int64_t)g * hd;
        const float *v = base + C + (int64_t)KV * hd + (int64_t)g * hd;
        float *p = att + bh * T * T;
        /* scores (T,T) = q k^T * scale; only the causal lower triangle is used */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, q, W, k, W, 0.0f, p,
                    T);
        causal_softmax_rows(p, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, p, T, v, W, 0.0f,
                    out + (int64_t)b * T * C + (int64_t)h * hd, C);
    }
    blas_threads_pop(saved);
}

void cpu_attention_gqa_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                int B, int T, int NH, int KV, int hd) {
    int group = NH / KV;
    int C = NH * hd;
    int W = (NH + 2 * KV) * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int nthreads = omp_get_max_threads();
    /* one T x T scratch per thread: the gradient of the scores, never the whole (B,NH,T,T) */
    size_t scratch_bytes = (size_t)nthreads * (size_t)T * (size_t)T * sizeof(float);
    float *scratch = malloc(scratch_bytes);
    if (!scratch) {
        loom_fatal("attention_gqa_backward: cannot allocate %zu bytes of score-gradient scratch",
                   scratch_bytes);
    }
    int saved = blas_threads_push_single();
    /* Parallel over (b, kv head): the group's query heads all add into that kv head's dk and
     * dv, so one thread does the whole group, in head order (race-free and reproducible). */
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t bg = 0; bg < (int64_t)B * KV; bg++) {
        int b = (int)(bg / KV), g = (int)(bg % KV);
        float *dp = scratch + (size_t)omp_get_thread_num() * (size_t)T * (size_t)T;
        const float *base = qkv + (int64_t)b * T * W;
        float *dbase = dqkv + (int64_t)b * T * W;
        const float *k = base + C + (int64_t)g * hd;
        const float *v = base + C + (int64_t)KV * hd + (int64_t)g * hd;
        float *dk = dbase + C + (int64_t)g * hd;
        float *dv = dbase + C + (int64_t)KV * hd + (int64_t)g * hd;
        for (int j = 0; j < group; j++) {
            int h = g * group + j;
            const float *q = base + (int64_t)h * hd;
            float *dq = dbase + (int64_t)h * hd;
            const float *p = att + ((int64_t)b * NH + h) * T * T;
            const float *dO = dout + (int64_t)b * T * C + (int64_t)h * hd;
            /* dP = dO v^T ; dv += P^T dO */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dO, C, v, W, 0.0f,
                        dp, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, p, T, dO, C, 1.0f,
                        dv, W);
            /* softmax backward: dS = P * (dP - sum(dP * P)) */
            causal_softmax_backward_rows(dp, p, T);
            /* dq += scale * dS k ; dk += scale * dS^T q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, scale, dp, T, k, W,
                        1.0f, dq, W);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, scale, dp, T, q, W, 1.0f,
                        dk, W);
        }
    }
    blas_threads_pop(saved);
    free(scratch);
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through one exp, so the loop vectorises where expf does */
static inline float tanh_fast(float u) {
    float e = exp_approx(-2.0f * fabsf(u));
    float t = (1.0f - e) / (1.0f + e);
    return u < 0.0f ? -t : t;
}

void cpu_gelu_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanh_fast(u));
    }
}

void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanh_fast(u);
        float sech2 = 1.0f - th * th;
        float grad =
            0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += grad * dout[i];
    }
}

/* SwiGLU: out = silu(g) * up with silu(g) = g * sigmoid(g); the sigmoid through exp_approx so
 * that the loop vectorises (exp_approx clamps its input to [-87, 88], so for g below -88 the
 * sigmoid is e^-88 rather than e^g: a silu of about g * 6e-39 instead of a smaller one, zero for
 * any purpose). */
static inline float sigmoid_fast(float g) {
    return 1.0f / (1.0f + exp_approx(-g));
}

void cpu_swiglu_forward(float *out, const float *inp, int64_t N, int F) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *gate = inp + i * 2 * F;
        const float *up = gate + F;
        float *o = out + i * F;
        for (int f = 0; f < F; f++) {
            float g = gate[f];
            o[f] = g * sigmoid_fast(g) * up[f];
        }
    }
}

void cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, int64_t N, int F) {
    /* d silu(g)/dg = s (1 + g (1 - s)) with s = sigmoid(g) */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *gate = inp + i * 2 * F;
        const float *up = gate + F;
        const float *d = dout + i * F;
        float *dgate = dinp + i * 2 * F;
        float *dup = dgate + F;
        for (int f = 0; f < F; f++) {
            float g = gate[f];
            float s = sigmoid_fast(g);
            dgate[f] += d[f] * up[f] * s * (1.0f + g * (1.0f - s));
            dup[f] += d[f] * g * s;
        }
    }
}

void cpu_residual_forward(float *out, const float *a, const float *b, int64_t N) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void cpu_bias_forward(float *out, const float *bias, int64_t N, int OC) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) out[i * OC + o] += bias[o];
}

void cpu_encoder_shard_forward(float *out, const int32_t *inp, const float *wte, int64_t N, int C,
                               int row_start, int rows) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        int64_t row = (int64_t)inp[i] - row_start;
        float *o = out + i * C;
        if (row >= 0 && row < rows) {
            memcpy(o, wte + row * C, (size_t)C * sizeof(float));
        } else {
            memset(o, 0, (size_t)C * sizeof(float));
        }
    }
}

void cpu_encoder_shard_backward(float *dwte, const float *dout, const int32_t *inp, int64_t N,
                                int C, int row_start, int rows) {
    /* rows may repeat (the same token twice): serial, like encoder_backward's scatter */
    for (int64_t i = 0; i < N; i++) {
        int64_t row = (int64_t)inp[i] - row_start;
        if (row < 0 || row >= rows) continue;
        float *dw = dwte + row * C;
        const float *d = dout + i * C;
        for (int c = 0; c < C; c++) dw[c] += d[c];
    }
}

void cpu_position_forward(float *out, const float *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        const float *pos = wpe + (bt % T) * C;
        float *o = out + bt * C;
        for (int c = 0; c < C; c++) o[c] += pos[c];
    }
}

void cpu_position_backward(float *dwpe, const float *dout, int B, int T, int C) {
    /* parallel over t; each position sums its batch rows in order b = 0, 1, ... */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *dp = dwpe + (int64_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((int64_t)b * T + t) * C;
            for (int c = 0; c < C; c++) dp[c] += d[c];
        }
    }
}

void cpu_softmax_xent_shard_max(float *row_max, const float *logits, int64_t N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * Vp;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        row_max[i] = mx;
    }
}

void cpu_softmax_xent_shard_expsum(float *probs, float *sums, float *target_logits,
                                   const float *logits, const float *row_max,
                                   const int32_t *targets, int64_t N, int V, int Vp,
                                   int vocab_start) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * Vp;
        float *p = probs + i * Vp;
        float mx = row_max[i];
        int64_t t = (int64_t)targets[i] - vocab_start;
        /* read before the exponentials overwrite it (probs may alias logits); shifted by the
         * max like them, so that log(sum) - it is the loss */
        target_logits[i] = t >= 0 && t < V ? x[t] - mx : 0.0f;
        float sum = 0.0f;
        for (int j = 0; j < V; j++) {
            p[j] = expf(x[j] - mx);
            sum += p[j];
        }
        for (int j = V; j < Vp; j++) p[j] = 0.0f;
        sums[i] = sum;
    }
}

void cpu_softmax_xent_shard_forward(float *losses, float *probs, const float *sums,
                                    const float *target_logits, const int32_t *targets, int64_t N,
                                    int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float inv = 1.0f / sums[i];
        float *p = probs + i * Vp;
        for (int j = 0; j < V; j++) p[j] *= inv;
        losses[i] = targets[i] >= 0 ? logf(sums[i]) - target_logits[i] : 0.0f;
    }
}

void cpu_softmax_xent_shard_backward(float *dlogits, const float *probs, const int32_t *targets,
                                     float dloss, int64_t N, int V, int Vp, int vocab_start) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *p = probs + i * Vp;
        float *d = dlogits + i * Vp;
        if (targets[i] < 0) {
            memset(d, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        for (int j = 0; j < V; j++) d[j] = dloss * p[j];
        for (int j = V; j < Vp; j++) d[j] = 0.0f;
        int64_t t = (int64_t)targets[i] - vocab_start;
        if (t >= 0 && t < V) d[t] -= dloss;
    }
}

void cpu_softmax_xent_forward(float *losses, float *probs, const float *logits,
                              const int32_t *targets, int64_t N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * Vp;
        float *p = probs + i * Vp;
        float maxv = -INFINITY;
        for (int j = 0; j < V; j++) maxv = x[j] > maxv ? x[j] : maxv;
        float sum = 0.0f;
        for (int j = 0; j < V; j++) {
            p[j] = exp_approx(x[j] - maxv);
            sum += p[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j < V; j++) p[j] *= inv;
        for (int j = V; j < Vp; j++) p[j] = 0.0f;
        int32_t target = targets[i];
        losses[i] = target >= 0 ? -logf(p[target]) : 0.0f;
    }
}

void cpu_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                               float dloss, int64_t N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float *p = probs + i * Vp;
        float *d = dlogits + i * Vp;
        int32_t target = targets[i];
        if (target < 0) {
            memset(d, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        for (int j = 0; j < V; j++) d[j] = dloss * p[j];
        d[target] -= dloss;
        for (int j = V; j < Vp; j++) d[j] = 0.0f;
    }
}

void cpu_adamw_update(float *params, const float *grads, float *m, float *v, int64_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int64_t step,
                      float grad_scale) {
    float bc1 = 1.0f - powf(beta1, (float)step);
    float bc2 = 1.0f - powf(beta2, (float)step);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        params[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * params[i]);
    }
}

double cpu_sum_squares(const float *x, int64_t n) {
    /* per-thread partial sums added in thread order: the result must not depend on timing */
    enum { MAX_THREADS = 256 };
    double partial[MAX_THREADS] = {0};
    int nthreads = omp_get_max_threads();
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
#pragma omp parallel num_threads(nthreads)
    {
        double acc = 0.0;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
        partial[omp_get_thread_num()] = acc;
    }
    double total = 0.0;
    for (int t = 0; t < nthreads; t++) total += partial[t];
    return total;
}

void cpu_scale(float *x, float s, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}
