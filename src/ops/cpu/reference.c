/*
 * reference.c — the reference kernels: double precision, no threads, no BLAS, written to be
 * read against the formulas. Slow on purpose; only tests call them.
 */
#include "ops/cpu/reference.h"

#include "loom/base.h"

#include <math.h>
#include <stdlib.h>

void ref_encoder_forward(double *out, const int32_t *inp, const double *wte, const double *wpe,
                         int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((int64_t)b * T + t) * C + c] =
                    wte[(int64_t)inp[b * T + t] * C + c] + wpe[(int64_t)t * C + c];
}

void ref_encoder_backward(double *dwte, double *dwpe, const double *dout, const int32_t *inp, int B,
                          int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                double d = dout[((int64_t)b * T + t) * C + c];
                dwte[(int64_t)inp[b * T + t] * C + c] += d;
                dwpe[(int64_t)t * C + c] += d;
            }
}

void ref_layernorm_forward(double *out, double *mean, double *rstd, const double *inp,
                           const double *weight, const double *bias, int64_t N, int C) {
    for (int64_t i = 0; i < N; i++) {
        const double *x = inp + i * C;
        double m = 0.0, var = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        double s = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) out[i * C + c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

void ref_layernorm_backward(double *dinp, double *dweight, double *dbias, const double *dout,
                            const double *inp, const double *weight, const double *mean,
                            const double *rstd, int64_t N, int C) {
    for (int64_t i = 0; i < N; i++) {
        const double *x = inp + i * C;
        const double *d = dout + i * C;
        double a = 0.0, b = 0.0;
        for (int c = 0; c < C; c++) {
            double norm = (x[c] - mean[i]) * rstd[i];
            a += weight[c] * d[c];
            b += weight[c] * d[c] * norm;
        }
        a /= C;
        b /= C;
        for (int c = 0; c < C; c++) {
            double norm = (x[c] - mean[i]) * rstd[i];
            dweight[c] += norm * d[c];
            dbias[c] += d[c];
            dinp[i * C + c] += (weight[c] * d[c] - a - norm * b) * rstd[i];
        }
    }
}

void ref_matmul_forward(double *out, const double *inp, const double *weight, const double *bias,
                        int64_t N, int C, int OC) {
    for (int64_t i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) acc += inp[i * C + c] * weight[(int64_t)o * C + c];
            out[i * OC + o] = acc;
        }
}

void ref_matmul_backward(double *dinp, double *dweight, double *dbias, const double *dout,
                         const double *inp, const double *weight, int64_t N, int C, int OC) {
    for (int64_t i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double d = dout[i * OC + o];
            for (int c = 0; c < C; c++) {
                if (dinp) dinp[i * C + c] += d * weight[(int64_t)o * C + c];
                dweight[(int64_t)o * C + c] += d * inp[i * C + c];
            }
            if (dbias) dbias[o] += d;
        }
}

void ref_attention_forward(double *out, double *att, const double *qkv, int B, int T, int C,
                           int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((int64_t)b * T + t) * 3 * C + h * hs;
                double *p = att + (((int64_t)b * NH + h) * T + t) * T;
                double maxv = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const double *k = qkv + ((int64_t)b * T + s) * 3 * C + C + h * hs;
                    double dot = 0.0;
                    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                    p[s] = dot * scale;
                    if (p[s] > maxv) maxv = p[s];
                }
                double sum = 0.0;
                for (int s = 0; s <= t; s++) {
                    p[s] = exp(p[s] - maxv);
                    sum += p[s];
                }
                for (int s = 0; s <= t; s++) p[s] /= sum;
                for (int s = t + 1; s < T; s++) p[s] = 0.0;
                double *o = out + ((int64_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double acc = 0.0;
                    for (int s = 0; s <= t; s++) {
                        acc += p[s] * qkv[((int64_t)b * T + s) * 3 * C + 2 * C + h * hs + i];
                    }
                    o[i] = acc;
                }
            }
}

void ref_attention_backward(double *dqkv, const double *dout, const double *qkv, const double *att,
                            int B, int T, int C, int NH) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *dp = malloc((size_t)T * sizeof(double));
    if (!dp) loom_fatal("ref_attention_backward: cannot allocate %d doubles", T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *p = att + (((int64_t)b * NH + h) * T + t) * T;
                const double *d = dout + ((int64_t)b * T + t) * C + h * hs;
                /* out = sum_s p[s] v[s] */
                for (int s = 0; s <= t; s++) {
                    const double *v = qkv + ((int64_t)b * T + s) * 3 * C + 2 * C + h * hs;
                    double *dv = dqkv + ((int64_t)b * T + s) * 3 * C + 2 * C + h * hs;
                    dp[s] = 0.0;
                    for (int i = 0; i < hs; i++) {
                        dp[s] += d[i] * v[i];
                        dv[i] += p[s] * d[i];
                    }
                }
                /* softmax: dscore[s] = p[s] (dp[s] - sum_r p[r] dp[r]) */
                double dot = 0.0;
                for (int s = 0; s <= t; s++) dot += p[s] * dp[s];
                const double *q = qkv + ((int64_t)b * T + t) * 3 * C + h * hs;
                double *dq = dqkv + ((int64_t)b * T + t) * 3 * C + h * hs;
                for (int s = 0; s <= t; s++) {
                    double ds = p[s] * (dp[s] - dot) * scale;
                    const double *k = qkv + ((int64_t)b * T + s) * 3 * C + C + h * hs;
                    double *dk = dqkv + ((int64_t)b * T + s) * 3 * C + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                    }
                }
            }
    free(dp);
}

/* RMSNorm: out = x * r * w with r = (mean(x^2) + eps)^(-1/2) */
void ref_rmsnorm_forward(double *out, double *rstd, const double *inp, const double *weight,
                         int64_t N, int C, double eps) {
    for (int64_t i = 0; i < N; i++) {
        const double *x = inp + i * C;
        double ms = 0.0;
        for (int c = 0; c < C; c++) ms += x[c] * x[c];
        ms /= C;
        double r = 1.0 / sqrt(ms + eps);
        for (int c = 0; c < C; c++) out[i * C + c] = x[c] * r * weight[c];
        rstd[i] = r;
    }
}

/* dr/dx[j] = -r^3 x[j] / C, so
 * dx[j] = d[j] w[j] r - (r^3 / C) x[j] sum_c d[c] w[c] x[c]; dw[c] = sum over rows of d x r */
void ref_rmsnorm_backward(double *dinp, double *dweight, const double *dout, const double *inp,
                          const double *weight, const double *rstd, int64_t N, int C) {
    for (int64_t i = 0; i < N; i++) {
        const double *x = inp + i * C;
        const double *d = dout + i * C;
        double r = rstd[i];
        double a = 0.0;
        for (int c = 0; c < C; c++) a += d[c] * weight[c] * x[c];
        for (int c = 0; c < C; c++) {
            dweight[c] += d[c] * x[c] * r;
            dinp[i * C + c] += d[c] * weight[c] * r - r * r * r / C * x[c] * a;
        }
    }
}

/* rotate the pairs (x[i], x[i + hd/2]) of the first `heads` heads of every row by sign * angle */
static void ref_rope_rotate(double *x, int B, int T, int64_t stride, int heads, int hd,
                            const loom_rope *rope, double sign) {
    int half = hd / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < heads; h++) {
                double *v = x + ((int64_t)b * T + t) * stride + (int64_t)h * hd;
                for (int i = 0; i < half; i++) {
                    double angle = sign * t * loom_rope_inv_freq(rope, i, hd);
                    double x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * cos(angle) - x2 * sin(angle);
                    v[i + half] = x2 * cos(angle) + x1 * sin(angle);
                }
            }
}

void ref_rope_forward(double *x, int B, int T, int64_t stride, int heads, int hd,
                      const loom_rope *rope) {
    ref_rope_rotate(x, B, T, stride, heads, hd, rope, 1.0);
}

void ref_rope_backward(double *dx, int B, int T, int64_t stride, int heads, int hd,
                       const loom_rope *rope) {
    ref_rope_rotate(dx, B, T, stride, heads, hd, rope, -1.0);
}

/* element i of query head h, kv head g's key or value, at row (b, t) of qkv */
static int64_t gqa_q(int b, int t, int h, int i, int T, int NH, int KV, int hd) {
    return ((int64_t)b * T + t) * (NH + 2 * KV) * hd + (int64_t)h * hd + i;
}
static int64_t gqa_k(int b, int t, int g, int i, int T, int NH, int KV, int hd) {
    return ((int64_t)b * T + t) * (NH + 2 * KV) * hd + (int64_t)(NH + g) * hd + i;
}
static int64_t gqa_v(int b, int t, int g, int i, int T, int NH, int KV, int hd) {
    return ((int64_t)b * T + t) * (NH + 2 * KV) * hd + (int64_t)(NH + KV + g) * hd + i;
}

void ref_attention_gqa_forward(double *out, double *att, const double *qkv, int B, int T, int NH,
                               int KV, int hd) {
    double scale = 1.0 / sqrt((double)hd);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / KV);
            for (int t = 0; t < T; t++) {
                double *p = att + (((int64_t)b * NH + h) * T + t) * T;
                double maxv = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    double dot = 0.0;
                    for (int i = 0; i < hd; i++) {
                        dot += qkv[gqa_q(b, t, h, i, T, NH, KV, hd)] *
                               qkv[gqa_k(b, s, g, i, T, NH, KV, hd)];
                    }
                    p[s] = dot * scale;
                    if (p[s] > maxv) maxv = p[s];
                }
                double sum = 0.0;
                for (int s = 0; s <= t; s++) {
                    p[s] = exp(p[s] - maxv);
                    sum += p[s];
                }
                for (int s = 0; s <= t; s++) p[s] /= sum;
                for (int s = t + 1; s < T; s++) p[s] = 0.0;
                for (int i = 0; i < hd; i++) {
                    double acc = 0.0;
                    for (int s = 0; s <= t; s++)
                        acc += p[s] * qkv[gqa_v(b, s, g, i, T, NH, KV, hd)];
                    out[((int64_t)b * T + t) * NH * hd + (int64_t)h * hd + i] = acc;
                }
            }
        }
}

void ref_attention_gqa_backward(double *dqkv, const double *dout, const double *qkv,
                                const double *att, int B, int T, int NH, int KV, int hd) {
    double scale = 1.0 / sqrt((double)hd);
    double *dp = malloc((size_t)(T > 0 ? T : 1) * sizeof(double));
    if (!dp) loom_fatal("ref_attention_gqa_backward: cannot allocate %d doubles", T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / KV);
            for (int t = 0; t < T; t++) {
                const double *p = att + (((int64_t)b * NH + h) * T + t) * T;
                const double *d = dout + ((int64_t)b * T + t) * NH * hd + (int64_t)h * hd;
                /* out = sum_s p[s] v[s] */
                for (int s = 0; s <= t; s++) {
                    dp[s] = 0.0;
                    for (int i = 0; i < hd; i++) {
                        dp[s] += d[i] * qkv[gqa_v(b, s, g, i, T, NH, KV, hd)];
                        dqkv[gqa_v(b, s, g, i, T, NH, KV, hd)] += p[s] * d[i];
                    }
                }
                /* softmax: dscore[s] = p[s] (dp[s] - sum_r p[r] dp[r]) */
                double dot = 0.0;
                for (int s = 0; s <= t; s++) dot += p[s] * dp[s];
                for (int s = 0; s <= t; s++) {
                    double ds = p[s] * (dp[s] - dot) * scale;
                    for (int i = 0; i < hd; i++) {
                        dqkv[gqa_q(b, t, h, i, T, NH, KV, hd)] +=
                            ds * qkv[gqa_k(b, s, g, i, T, NH, KV, hd)];
                        dqkv[gqa_k(b, s, g, i, T, NH, KV, hd)] +=
                            ds * qkv[gqa_q(b, t, h, i, T, NH, KV, hd)];
                    }
                }
            }
        }
    free(dp);
}

/* out = silu(gate) * up, silu(g) = g / (1 + e^-g) */
void ref_swiglu_forward(double *out, const double *inp, int64_t N, int F) {
    for (int64_t i = 0; i < N; i++)
        for (int f = 0; f < F; f++) {
            double g = inp[i * 2 * F + f], u = inp[i * 2 * F + F + f];
            out[i * F + f] = g / (1.0 + exp(-g)) * u;
        }
}

/* d silu(g)/dg = sigmoid(g) + g sigmoid(g) (1 - sigmoid(g)) */
void ref_swiglu_backward(double *dinp, const double *inp, const double *dout, int64_t N, int F) {
    for (int64_t i = 0; i < N; i++)
        for (int f = 0; f < F; f++) {
            double g = inp[i * 2 * F + f], u = inp[i * 2 * F + F + f];
            double sig = 1.0 / (1.0 + exp(-g));
            double d = dout[i * F + f];
            dinp[i * 2 * F + f] += d * u * (sig + g * sig * (1.0 - sig));
            dinp[i * 2 * F + F + f] += d * g * sig;
        }
}

static const double gelu_scale = 0.79788456080286535588; /* sqrt(2/pi) */

void ref_gelu_forward(double *out, const double *inp, int64_t N) {
    for (int64_t i = 0; i < N; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(gelu_scale * (x + 0.044715 * x * x * x)));
    }
}

void ref_gelu_backward(double *dinp, const double *inp, const double *dout, int64_t N) {
    for (int64_t i = 0; i < N; i++) {
        double x = inp[i];
        double u = gelu_scale * (x + 0.044715 * x * x * x);
        double th = tanh(u);
        double du = gelu_scale * (1.0 + 3.0 * 0.044715 * x * x);
        dinp[i] += (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du) * dout[i];
    }
}

void ref_residual_forward(double *out, const double *a, const double *b, int64_t N) {
    for (int64_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void ref_bias_forward(double *out, const double *bias, int64_t N, int OC) {
    for (int64_t i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) out[i * OC + o] += bias[o];
}

void ref_encoder_shard_forward(double *out, const int32_t *inp, const double *wte, int64_t N, int C,
                               int row_start, int rows) {
    for (int64_t i = 0; i < N; i++) {
        int64_t row = (int64_t)inp[i] - row_start;
        int held = row >= 0 && row < rows;
        for (int c = 0; c < C; c++) out[i * C + c] = held ? wte[row * C + c] : 0.0;
    }
}

void ref_encoder_shard_backward(double *dwte, const double *dout, const int32_t *inp, int64_t N,
                                int C, int row_start, int rows) {
    for (int64_t i = 0; i < N; i++) {
        int64_t row = (int64_t)inp[i] - row_start;
        if (row < 0 || row >= rows) continue;
        for (int c = 0; c < C; c++) dwte[row * C + c] += dout[i * C + c];
    }
}

void ref_position_forward(double *out, const double *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((int64_t)b * T + t) * C + c] += wpe[(int64_t)t * C + c];
}

void ref_position_backward(double *dwpe, const double *dout, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                dwpe[(int64_t)t * C + c] += dout[((int64_t)b * T + t) * C + c];
}

void ref_softmax_xent_shard_max(double *row_max, const double *logits, int64_t N, int V, int Vp) {
    for (int64_t i = 0; i < N; i++) {
        row_max[i] = -INFINITY;
        for (int j = 0; j < V; j++)
            if (logits[i * Vp + j] > row_max[i]) row_max[i] = logits[i * Vp + j];
    }
}

void ref_softmax_xent_shard_expsum(double *probs, double *sums, double *target_logits,
                                   const double *logits, const double *row_max,
                                   const int32_t *targets, int64_t N, int V, int Vp,
                                   int vocab_start) {
    for (int64_t i = 0; i < N; i++) {
        int64_t t = (int64_t)targets[i] - vocab_start;
        target_logits[i] = t >= 0 && t < V ? logits[i * Vp + t] - row_max[i] : 0.0;
        sums[i] = 0.0;
        for (int j = 0; j < Vp; j++) {
            probs[i * Vp + j] = j < V ? exp(logits[i * Vp + j] - row_max[i]) : 0.0;
            sums[i] += probs[i * Vp + j];
        }
    }
}

void ref_softmax_xent_shard_forward(double *losses, double *probs, const double *sums,
                                    const double *target_logits, const int32_t *targets, int64_t N,
                                    int V, int Vp) {
    for (int64_t i = 0; i < N; i++) {
        for (int j = 0; j < V; j++) probs[i * Vp + j] /= sums[i];
        losses[i] = targets[i] >= 0 ? log(sums[i]) - target_logits[i] : 0.0;
    }
}

void ref_softmax_xent_shard_backward(double *dlogits, const double *probs, const int32_t *targets,
                                     double dloss, int64_t N, int V, int Vp, int vocab_start) {
    for (int64_t i = 0; i < N; i++)
        for (int j = 0; j < Vp; j++) {
            double d = 0.0;
            if (targets[i] >= 0 && j < V) {
                d = dloss * (probs[i * Vp + j] - (j + (int64_t)vocab_start == targets[i]));
            }
            dlogits[i * Vp + j] = d;
        }
}

void ref_softmax_xent_forward(double *losses, double *probs, const double *logits,
                              const int32_t *targets, int64_t N, int V, int Vp) {
    for (int64_t i = 0; i < N; i++) {
        const double *x = logits + i * Vp;
        double maxv = -INFINITY, sum = 0.0;
        for (int j = 0; j < V; j++) maxv = x[j] > maxv ? x[j] : maxv;
        for (int j = 0; j < V; j++) sum += exp(x[j] - maxv);
        for (int j = 0; j < Vp; j++) probs[i * Vp + j] = j < V ? exp(x[j] - maxv) / sum : 0.0;
        losses[i] = targets[i] >= 0 ? -log(probs[i * Vp + targets[i]]) : 0.0;
    }
}

void ref_softmax_xent_backward(double *dlogits, const double *probs, const int32_t *targets,
                               double dloss, int64_t N, int V, int Vp) {
    for (int64_t i = 0; i < N; i++)
        for (int j = 0; j < Vp; j++) {
            double d = 0.0;
            if (targets[i] >= 0 && j < V) d = dloss * (probs[i * Vp + j] - (j == targets[i]));
            dlogits[i * Vp + j] = d;
        }
}

void ref_adamw_update(double *params, const double *grads, double *m, double *v, int64_t n,
                      double lr, double beta1, double beta2, double eps, double weight_decay,
                      int64_t step, double grad_scale) {
    for (int64_t i = 0; i < n; i++) {
        double g = grads[i] * grad_scale;
        m[i] = beta1 * m[i] + (1.0 - beta1) * g;
        v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
        double mhat = m[i] / (1.0 - pow(beta1, (double)step));
        double vhat = v[i] / (1.0 - pow(beta2, (double)step));
        params[i] -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * params[i]);
    }
}
