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
