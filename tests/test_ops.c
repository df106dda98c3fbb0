/*
 * test_ops.c — every kernel against its reference and against finite differences.
 *
 * For each op: (1) the double-precision reference backward equals central finite differences
 * of the reference forward (h = 1e-6), for an objective sum(out * R) with random R; (2) the
 * fast float forward and backward equal the reference within float tolerance, with gradients
 * pre-filled with random values so that accumulation (+=) is checked too.
 *
 * The tensor-parallel pieces (bias, vocabulary-parallel embedding and cross-entropy) are
 * checked the same way, and besides: a full vocabulary is cut into shards here, the shard
 * kernels run on each, the sums and maxima across shards that the model's allreduces would do
 * are done here, and the result must reproduce the unsharded kernels'.
 */
#include "check.h"
#include "loom/base.h"
#include "loom/ops.h"
#include "ops/cpu/reference.h"

#include <stdlib.h>
#include <string.h>

static uint64_t draw_counter;

static void fill_random(double *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * loom_rng_normal(7, 1, draw_counter++);
}

/* inputs the fast kernels see exactly as the reference does */
static void round_to_float(double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = (double)(float)x[i];
}

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)n, sizeof(double));
    if (!p) abort();
    return p;
}

static float *to_float(const double *x, int64_t n) {
    float *f = malloc((size_t)n * sizeof(float));
    if (!f) abort();
    for (int64_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

static void compare(const char *what, const float *fast, const double *ref, int64_t n, double rtol,
                    double atol) {
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 3; i++) {
        double a = fast[i], b = ref[i];
        if (a == b) continue; /* equal infinities included (an empty shard's max) */
        if (!(fabs(a - b) <= atol + rtol * fabs(b))) {
            bad++;
            char msg[256];
            snprintf(msg, sizeof msg, "%s[%lld]", what, (long long)i);
            CHECK_CLOSE(a, b, rtol, atol, msg);
        }
    }
    if (!bad) CHECK(1, "%s", what);
}

/* double against double, every element, within atol */
static void compare_doubles(const char *what, const double *a, const double *b, int64_t n,
                            double atol) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != b[i] && !(fabs(a[i] - b[i]) <= atol) && bad++ == 0) first = i;
    }
    CHECK(bad == 0, "%s: %lld of %lld differ (first [%lld]: %.17g vs %.17g)", what, (long long)bad,
          (long long)n, (long long)first, first >= 0 ? a[first] : 0.0, first >= 0 ? b[first] : 0.0);
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Central differences of f with respect to every x[0..n), compared to analytic. The sizes in
 * this file are small enough for all of them (a sample would miss a wrong row, head or tail). */
typedef double (*objective_fn)(void *ctx);
static void fd_check(const char *what, objective_fn f, void *ctx, double *x, int64_t n,
                     const double *analytic) {
    const double h = 1e-6;
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 3; i++) {
        double saved = x[i];
        x[i] = saved + h;
        double fp = f(ctx);
        x[i] = saved - h;
        double fm = f(ctx);
        x[i] = saved;
        double fd = (fp - fm) / (2 * h);
        if (!(fabs(analytic[i] - fd) <= 1e-6 + 1e-5 * fabs(fd))) {
            bad++;
            char msg[256];
            snprintf(msg, sizeof msg, "%s: d/dx[%lld] analytic vs finite difference", what,
                     (long long)i);
            CHECK_CLOSE(analytic[i], fd, 1e-5, 1e-6, msg);
        }
    }
    if (!bad) CHECK(1, "%s", what);
}

/* ---- layernorm ---- */
typedef struct {
    int64_t N;
    int C;
    double *inp, *w, *b, *out, *mean, *rstd, *R;
} ln_ctx;

static double ln_objective(void *p) {
    ln_ctx *c = p;
    ref_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dot(c->out, c->R, c->N * c->C);
}

static void test_layernorm(const loom_backend *be) {
    ln_ctx c = {.N = 7, .C = 24};
    int64_t NC = c.N * c.C;
    c.inp = dalloc(NC), c.w = dalloc(c.C), c.b = dalloc(c.C), c.out = dalloc(NC);
    c.mean = dalloc(c.N), c.rstd = dalloc(c.N), c.R = dalloc(NC);
    fill_random(c.inp, NC, 2.0), fill_random(c.w, c.C, 1.0), fill_random(c.b, c.C, 1.0);
    fill_random(c.R, NC, 1.0);
    ln_objective(&c);
    double *dinp = dalloc(NC), *dw = dalloc(c.C), *db = dalloc(c.C);
    ref_layernorm_backward(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
    fd_check("layernorm dinp", ln_objective, &c, c.inp, NC, dinp);
    fd_check("layernorm dweight", ln_objective, &c, c.w, c.C, dw);
    fd_check("layernorm dbias", ln_objective, &c, c.b, c.C, db);

    /* fast vs reference, gradients pre-filled */
    float *finp = to_float(c.inp, NC), *fw = to_float(c.w, c.C), *fb = to_float(c.b, c.C);
    float *fR = to_float(c.R, NC), *fout = malloc(NC * sizeof(float));
    float *fmean = malloc(c.N * sizeof(float)), *frstd = malloc(c.N * sizeof(float));
    double *pre_inp = dalloc(NC), *pre_w = dalloc(c.C), *pre_b = dalloc(c.C);
    fill_random(pre_inp, NC, 1.0), fill_random(pre_w, c.C, 1.0), fill_random(pre_b, c.C, 1.0);
    float *fdinp = to_float(pre_inp, NC), *fdw = to_float(pre_w, c.C), *fdb = to_float(pre_b, c.C);
    be->layernorm_forward(fout, fmean, frstd, finp, fw, fb, c.N, c.C);
    compare("layernorm forward fast vs ref", fout, c.out, NC, 1e-5, 1e-5);
    be->layernorm_backward(fdinp, fdw, fdb, fR, finp, fw, fmean, frstd, c.N, c.C);
    for (int64_t i = 0; i < NC; i++) dinp[i] += pre_inp[i];
    for (int i = 0; i < c.C; i++) dw[i] += pre_w[i], db[i] += pre_b[i];
    compare("layernorm dinp fast vs ref", fdinp, dinp, NC, 1e-4, 1e-4);
    compare("layernorm dweight fast vs ref", fdw, dw, c.C, 1e-4, 1e-4);
    compare("layernorm dbias fast vs ref", fdb, db, c.C, 1e-4, 1e-4);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.R);
    free(dinp), free(dw), free(db), free(finp), free(fw), free(fb), free(fR), free(fout);
    free(fmean), free(frstd), free(pre_inp), free(pre_w), free(pre_b), free(fdinp), free(fdw);
    free(fdb);
}

/* ---- matmul ---- */
typedef struct {
    int64_t N;
    int C, OC;
    double *inp, *w, *b, *out, *R;
} mm_ctx;

static double mm_objective(void *p) {
    mm_ctx *c = p;
    ref_matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
    return dot(c->out, c->R, c->N * c->OC);
}

static void test_matmul(const loom_backend *be, int64_t N, int C, int OC, int check_fd) {
    mm_ctx c = {.N = N, .C = C, .OC = OC};
    int64_t NC = N * C, NO = N * OC, OCC = (int64_t)OC * C;
    c.inp = dalloc(NC), c.w = dalloc(OCC), c.b = dalloc(OC), c.out = dalloc(NO), c.R = dalloc(NO);
    fill_random(c.inp, NC, 1.0), fill_random(c.w, OCC, 0.5), fill_random(c.b, OC, 1.0);
    fill_random(c.R, NO, 1.0);
    mm_objective(&c);
    double *dinp = dalloc(NC), *dw = dalloc(OCC), *db = dalloc(OC);
    ref_matmul_backward(dinp, dw, db, c.R, c.inp, c.w, N, C, OC);
    if (check_fd) {
        fd_check("matmul dinp", mm_objective, &c, c.inp, NC, dinp);
        fd_check("matmul dweight", mm_objective, &c, c.w, OCC, dw);
        fd_check("matmul dbias", mm_objective, &c, c.b, OC, db);
    }
    float *finp = to_float(c.inp, NC), *fw = to_float(c.w, OCC), *fb = to_float(c.b, OC);
    float *fR = to_float(c.R, NO), *fout = malloc(NO * sizeof(float));
    double *pre = dalloc(NC + OCC + OC);
    fill_random(pre, NC + OCC + OC, 1.0);
    float *fdinp = to_float(pre, NC), *fdw = to_float(pre + NC, OCC);
    float *fdb = to_float(pre + NC + OCC, OC);
    be->matmul_forward(fout, finp, fw, fb, N, C, OC);
    compare("matmul forward fast vs ref", fout, c.out, NO, 1e-4, 1e-4);
    /* the two halves of backward, as the model runs them: input part, then weight part */
    be->matmul_backward_input(fdinp, fR, fw, N, C, OC);
    float *fdw_nobias = malloc((size_t)OCC * sizeof(float));
    memcpy(fdw_nobias, fdw, (size_t)OCC * sizeof(float));
    be->matmul_backward_weight(fdw, fdb, fR, finp, N, C, OC);
    be->matmul_backward_weight(fdw_nobias, NULL, fR, finp, N, C, OC);
    CHECK(memcmp(fdw, fdw_nobias, (size_t)OCC * sizeof(float)) == 0,
          "matmul dweight without dbias: same bits");
    free(fdw_nobias);
    for (int64_t i = 0; i < NC; i++) dinp[i] += pre[i];
    for (int64_t i = 0; i < OCC; i++) dw[i] += pre[NC + i];
    for (int i = 0; i < OC; i++) db[i] += pre[NC + OCC + i];
    compare("matmul dinp fast vs ref", fdinp, dinp, NC, 1e-4, 1e-4);
    compare("matmul dweight fast vs ref", fdw, dw, OCC, 1e-4, 1e-4);
    compare("matmul dbias fast vs ref", fdb, db, OC, 1e-4, 1e-4);
    /* no bias */
    ref_matmul_forward(c.out, c.inp, c.w, NULL, N, C, OC);
    be->matmul_forward(fout, finp, fw, NULL, N, C, OC);
    compare("matmul forward without bias", fout, c.out, NO, 1e-4, 1e-4);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.R), free(dinp), free(dw), free(db);
    free(finp), free(fw), free(fb), free(fR), free(fout), free(pre), free(fdinp), free(fdw);
    free(fdb);
}

/* ---- attention ---- */
typedef struct {
    int B, T, C, NH;
    double *qkv, *out, *att, *R;
} att_ctx;

static double att_objective(void *p) {
    att_ctx *c = p;
    ref_attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return dot(c->out, c->R, (int64_t)c->B * c->T * c->C);
}

static void test_attention(const loom_backend *be, int B, int T, int C, int NH, int check_fd) {
    att_ctx c = {.B = B, .T = T, .C = C, .NH = NH};
    int64_t nq = (int64_t)B * T * 3 * C, no = (int64_t)B * T * C, na = (int64_t)B * NH * T * T;
    c.qkv = dalloc(nq), c.out = dalloc(no), c.att = dalloc(na), c.R = dalloc(no);
    fill_random(c.qkv, nq, 1.0), fill_random(c.R, no, 1.0);
    att_objective(&c);
    double *dqkv = dalloc(nq);
    ref_attention_backward(dqkv, c.R, c.qkv, c.att, B, T, C, NH);
    if (check_fd) fd_check("attention dqkv", att_objective, &c, c.qkv, nq, dqkv);
    float *fqkv = to_float(c.qkv, nq), *fR = to_float(c.R, no);
    float *fout = malloc(no * sizeof(float)), *fatt = malloc(na * sizeof(float));
    double *pre = dalloc(nq);
    fill_random(pre, nq, 1.0);
    float *fdqkv = to_float(pre, nq);
    be->attention_forward(fout, fatt, fqkv, B, T, C, NH);
    compare("attention forward fast vs ref", fout, c.out, no, 1e-4, 1e-5);
    compare("attention probabilities fast vs ref", fatt, c.att, na, 1e-4, 1e-6);
    be->attention_backward(fdqkv, fR, fqkv, fatt, B, T, C, NH);
    for (int64_t i = 0; i < nq; i++) dqkv[i] += pre[i];
    compare("attention dqkv fast vs ref", fdqkv, dqkv, nq, 1e-4, 1e-4);
    free(c.qkv), free(c.out), free(c.att), free(c.R), free(dqkv), free(fqkv), free(fR);
    free(fout), free(fatt), free(pre), free(fdqkv);
}

/* ---- RMSNorm ---- */
typedef struct {
    int64_t N;
    int C;
    double eps;
    double *inp, *w, *out, *rstd, *R;
} rms_ctx;

static double rms_objective(void *p) {
    rms_ctx *c = p;
    ref_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, c->eps);
    return dot(c->out, c->R, c->N * c->C);
}

static void test_rmsnorm(const loom_backend *be, int64_t N, int C, float eps) {
    rms_ctx c = {.N = N, .C = C, .eps = (double)eps};
    int64_t NC = N * C;
    char what[160];
    c.inp = dalloc(NC), c.w = dalloc(C), c.out = dalloc(NC), c.rstd = dalloc(N), c.R = dalloc(NC);
    fill_random(c.inp, NC, 2.0), fill_random(c.w, C, 1.0), fill_random(c.R, NC, 1.0);
    for (int i = 0; i < C; i++) c.inp[(N - 1) * C + i] = 0.0; /* a zero row: rstd = eps^-1/2 */
    round_to_float(c.inp, NC), round_to_float(c.w, C), round_to_float(c.R, NC);
    rms_objective(&c);
    double *dinp = dalloc(NC), *dw = dalloc(C);
    ref_rmsnorm_backward(dinp, dw, c.R, c.inp, c.w, c.rstd, N, C);
    snprintf(what, sizeof what, "rmsnorm N %lld C %d: dinp", (long long)N, C);
    fd_check(what, rms_objective, &c, c.inp, NC, dinp);
    snprintf(what, sizeof what, "rmsnorm N %lld C %d: dweight", (long long)N, C);
    fd_check(what, rms_objective, &c, c.w, C, dw);

    /* fast vs reference, gradients pre-filled (backward accumulates) */
    float *finp = to_float(c.inp, NC), *fw = to_float(c.w, C), *fR = to_float(c.R, NC);
    float *fout = malloc(NC * sizeof(float)), *frstd = malloc(N * sizeof(float));
    double *pre_inp = dalloc(NC), *pre_w = dalloc(C);
    fill_random(pre_inp, NC, 1.0), fill_random(pre_w, C, 1.0);
    round_to_float(pre_inp, NC), round_to_float(pre_w, C);
    float *fdinp = to_float(pre_inp, NC), *fdw = to_float(pre_w, C);
    be->rmsnorm_forward(fout, frstd, finp, fw, N, C, eps);
    compare("rmsnorm forward fast vs ref", fout, c.out, NC, 1e-5, 1e-6);
    compare("rmsnorm rstd fast vs ref", frstd, c.rstd, N, 1e-6, 0.0);
    be->rmsnorm_backward(fdinp, fdw, fR, finp, fw, frstd, N, C);
    for (int64_t i = 0; i < NC; i++) dinp[i] += pre_inp[i];
    for (int i = 0; i < C; i++) dw[i] += pre_w[i];
    compare("rmsnorm dinp fast vs ref (accumulates)", fdinp, dinp, NC, 1e-4, 1e-4);
    compare("rmsnorm dweight fast vs ref (accumulates)", fdw, dw, C, 1e-4, 1e-4);
    free(c.inp), free(c.w), free(c.out), free(c.rstd), free(c.R), free(dinp), free(dw);
    free(finp), free(fw), free(fR), free(fout), free(frstd), free(pre_inp), free(pre_w);
    free(fdinp), free(fdw);
}

/* ---- rotary position embedding ---- */
typedef struct {
    int B, T, heads, hd;
    int64_t stride;
    loom_rope rope;
    double *x, *work, *R;
} rope_ctx;

static double rope_objective(void *p) {
    rope_ctx *c = p;
    int64_t n = (int64_t)c->B * c->T * c->stride;
    memcpy(c->work, c->x, (size_t)n * sizeof(double));
    ref_rope_forward(c->work, c->B, c->T, c->stride, c->heads, c->hd, &c->rope);
    return dot(c->work, c->R, n);
}

/* the part of every row that rope must leave alone: [heads * hd, stride) */
static int rope_untouched_same(const float *a, const float *b, int B, int T, int64_t stride,
                               int heads, int hd) {
    int64_t used = (int64_t)heads * hd;
    for (int64_t r = 0; r < (int64_t)B * T; r++) {
        if (memcmp(a + r * stride + used, b + r * stride + used,
                   (size_t)(stride - used) * sizeof(float)) != 0) {
            return 0;
        }
    }
    return 1;
}

static void test_rope(const loom_backend *be, int B, int T, int heads, int hd, int64_t stride,
                      loom_rope rope, int check_fd) {
    rope_ctx c = {.B = B, .T = T, .heads = heads, .hd = hd, .stride = stride, .rope = rope};
    const loom_rope *rp = &c.rope;
    int64_t n = (int64_t)B * T * stride;
    char what[200], cfg[140];
    snprintf(cfg, sizeof cfg, "rope B %d T %d heads %d hd %d stride %lld theta %g scaling %g", B, T,
             heads, hd, (long long)stride, rope.theta, rope.scaling.factor);
    c.x = dalloc(n), c.work = dalloc(n), c.R = dalloc(n);
    fill_random(c.x, n, 1.0), fill_random(c.R, n, 1.0);
    round_to_float(c.x, n), round_to_float(c.R, n);

    /* reference backward (in place on the upstream gradient) against finite differences; the
     * untouched part of each row passes its gradient through */
    double *dx = dalloc(n);
    memcpy(dx, c.R, (size_t)n * sizeof(double));
    ref_rope_backward(dx, B, T, stride, heads, hd, rp);
    if (check_fd) {
        snprintf(what, sizeof what, "%s: ref dx vs finite differences", cfg);
        fd_check(what, rope_objective, &c, c.x, n, dx);
    }
    /* the reference: backward undoes forward */
    double *ref_y = dalloc(n), *ref_back = dalloc(n);
    memcpy(ref_y, c.x, (size_t)n * sizeof(double));
    ref_rope_forward(ref_y, B, T, stride, heads, hd, rp);
    memcpy(ref_back, ref_y, (size_t)n * sizeof(double));
    ref_rope_backward(ref_back, B, T, stride, heads, hd, rp);
    snprintf(what, sizeof what, "%s: ref backward(forward(x)) = x", cfg);
    compare_doubles(what, ref_back, c.x, n, 1e-12);

    /* fast forward vs reference; the rest of each row and the rows at t = 0 unchanged */
    float *fx0 = to_float(c.x, n), *fx = to_float(c.x, n);
    be->rope_forward(fx, B, T, stride, heads, hd, rp);
    snprintf(what, sizeof what, "%s: forward fast vs ref", cfg);
    compare(what, fx, ref_y, n, 1e-6, 1e-6);
    CHECK(rope_untouched_same(fx, fx0, B, T, stride, heads, hd),
          "%s: forward changed floats past the first heads of a row", cfg);
    int t0_same = 1;
    for (int b = 0; b < B; b++) {
        int64_t r = (int64_t)b * T * stride;
        t0_same &= memcmp(fx + r, fx0 + r, (size_t)heads * hd * sizeof(float)) == 0;
    }
    CHECK(t0_same, "%s: forward at t = 0 is not the identity", cfg);

    /* fast backward(forward(x)) = x */
    be->rope_backward(fx, B, T, stride, heads, hd, rp);
    snprintf(what, sizeof what, "%s: fast backward(forward(x)) = x", cfg);
    compare(what, fx, c.x, n, 1e-6, 1e-6);
    CHECK(rope_untouched_same(fx, fx0, B, T, stride, heads, hd),
          "%s: backward changed floats past the first heads of a row", cfg);

    /* fast backward vs reference backward, on the upstream gradient R */
    float *fR = to_float(c.R, n), *fR0 = to_float(c.R, n);
    be->rope_backward(fR, B, T, stride, heads, hd, rp);
    snprintf(what, sizeof what, "%s: backward fast vs ref", cfg);
    compare(what, fR, dx, n, 1e-6, 1e-6);
    CHECK(rope_untouched_same(fR, fR0, B, T, stride, heads, hd),
          "%s: backward changed floats past the first heads of a row", cfg);
    free(c.x), free(c.work), free(c.R), free(dx), free(ref_y), free(ref_back), free(fx0);
    free(fx), free(fR), free(fR0);
}

/* Llama 3.1's frequency scaling, by its properties rather than its formula: frequencies whose
 * wavelength is under original_context / high_freq_factor are theta's own, those over
 * original_context / low_freq_factor are theta's divided by factor, and between them the scaled
 * frequency moves continuously and monotonically from one to the other (sweeping theta moves a
 * frequency across both edges); Llama 3.1's own settings leave pair 0 alone and divide the last
 * pair of a 128-wide head by 8. */
static void test_rope_scaling(void) {
    loom_rope_scaling s = {8.0, 1.0, 4.0, 8192.0};
    const double two_pi = 6.283185307179586;
    double prev = 0, worst_jump = 0;
    int kept = 0, divided = 0, blended = 0, monotone = 1, bounded = 1;
    for (double w = 1000.0; w <= 20000.0; w *= 1.0005) { /* the wavelength of pair 1 at hd 4 */
        loom_rope rope = {w / two_pi * (w / two_pi), s}; /* theta^(-1/2) = 2 pi / w */
        double freq = two_pi / w, scaled = loom_rope_inv_freq(&rope, 1, 4);
        double ratio = scaled / freq; /* 1 kept ... 1/8 divided */
        kept += w < 2048.0 * 0.999 && fabs(ratio - 1.0) < 1e-12;
        divided += w > 8192.0 * 1.001 && fabs(ratio - 0.125) < 1e-12;
        blended +=
            w > 2048.0 * 1.001 && w < 8192.0 * 0.999 && ratio < 1.0 - 1e-9 && ratio > 0.125 + 1e-9;
        bounded &= ratio <= 1.0 + 1e-12 && ratio >= 0.125 - 1e-12;
        if (prev > 0) {
            monotone &= scaled <= prev * (1.0 + 1e-12);
            double jump = fabs(scaled - prev) / prev;
            if (jump > worst_jump) worst_jump = jump;
        }
        prev = scaled;
    }
    CHECK(kept > 100 && divided > 100 && blended > 100,
          "rope scaling: %d kept, %d divided, %d blended frequencies in the sweep", kept, divided,
          blended);
    CHECK(bounded && monotone, "rope scaling: scaled frequencies not between f / 8 and f, or not "
                               "falling as the wavelength grows");
    CHECK(worst_jump < 0.002,
          "rope scaling: a jump of %.4f between neighbouring wavelengths "
          "(discontinuous at an edge)",
          worst_jump);
    loom_rope l31 = {500000.0, s};
    CHECK(loom_rope_inv_freq(&l31, 0, 128) == 1.0, "rope scaling: pair 0 changed");
    double last = pow(500000.0, -126.0 / 128.0);
    CHECK(fabs(loom_rope_inv_freq(&l31, 63, 128) - last / 8) < 1e-15 * last,
          "rope scaling: the last pair of Llama 3.1 is not divided by 8");
}

/* ---- grouped-query attention ---- */
typedef struct {
    int B, T, NH, KV, hd;
    double *qkv, *out, *att, *R;
} gqa_ctx;

static double gqa_objective(void *p) {
    gqa_ctx *c = p;
    ref_attention_gqa_forward(c->out, c->att, c->qkv, c->B, c->T, c->NH, c->KV, c->hd);
    return dot(c->out, c->R, (int64_t)c->B * c->T * c->NH * c->hd);
}

static void test_attention_gqa(const loom_backend *be, int B, int T, int NH, int KV, int hd,
                               int check_fd) {
    gqa_ctx c = {.B = B, .T = T, .NH = NH, .KV = KV, .hd = hd};
    int64_t nq = (int64_t)B * T * (NH + 2 * KV) * hd, no = (int64_t)B * T * NH * hd;
    int64_t na = (int64_t)B * NH * T * T;
    char what[200], cfg[100];
    snprintf(cfg, sizeof cfg, "attention_gqa B %d T %d NH %d KV %d hd %d", B, T, NH, KV, hd);
    c.qkv = dalloc(nq), c.out = dalloc(no), c.att = dalloc(na), c.R = dalloc(no);
    fill_random(c.qkv, nq, 1.0), fill_random(c.R, no, 1.0);
    round_to_float(c.qkv, nq), round_to_float(c.R, no);
    gqa_objective(&c);
    double *dqkv = dalloc(nq);
    ref_attention_gqa_backward(dqkv, c.R, c.qkv, c.att, B, T, NH, KV, hd);
    if (check_fd) {
        snprintf(what, sizeof what, "%s: ref dqkv vs finite differences", cfg);
        fd_check(what, gqa_objective, &c, c.qkv, nq, dqkv);
    }
    float *fqkv = to_float(c.qkv, nq), *fR = to_float(c.R, no);
    float *fout = malloc(no * sizeof(float)), *fatt = malloc(na * sizeof(float));
    double *pre = dalloc(nq);
    fill_random(pre, nq, 1.0);
    round_to_float(pre, nq);
    float *fdqkv = to_float(pre, nq);
    be->attention_gqa_forward(fout, fatt, fqkv, B, T, NH, KV, hd);
    snprintf(what, sizeof what, "%s: forward fast vs ref", cfg);
    compare(what, fout, c.out, no, 1e-4, 1e-5);
    snprintf(what, sizeof what, "%s: probabilities fast vs ref", cfg);
    compare(what, fatt, c.att, na, 1e-4, 1e-6);
    be->attention_gqa_backward(fdqkv, fR, fqkv, fatt, B, T, NH, KV, hd);
    for (int64_t i = 0; i < nq; i++) dqkv[i] += pre[i];
    snprintf(what, sizeof what, "%s: dqkv fast vs ref (accumulates)", cfg);
    compare(what, fdqkv, dqkv, nq, 1e-4, 1e-4);
    free(c.qkv), free(c.out), free(c.att), free(c.R), free(dqkv), free(fqkv), free(fR);
    free(fout), free(fatt), free(pre), free(fdqkv);
}

/* With KV == NH the layouts coincide (C = NH hd): grouped-query attention is attention */
static void test_attention_gqa_is_mha(const loom_backend *be, int B, int T, int NH, int hd) {
    int C = NH * hd;
    int64_t nq = (int64_t)B * T * 3 * C, no = (int64_t)B * T * C, na = (int64_t)B * NH * T * T;
    char what[200];
    double *qkv = dalloc(nq), *R = dalloc(no), *pre = dalloc(nq);
    fill_random(qkv, nq, 1.0), fill_random(R, no, 1.0), fill_random(pre, nq, 1.0);
    round_to_float(qkv, nq), round_to_float(R, no), round_to_float(pre, nq);

    /* the references */
    double *out_mha = dalloc(no), *att_mha = dalloc(na), *out_gqa = dalloc(no);
    double *att_gqa = dalloc(na), *d_mha = dalloc(nq), *d_gqa = dalloc(nq);
    ref_attention_forward(out_mha, att_mha, qkv, B, T, C, NH);
    ref_attention_gqa_forward(out_gqa, att_gqa, qkv, B, T, NH, NH, hd);
    ref_attention_backward(d_mha, R, qkv, att_mha, B, T, C, NH);
    ref_attention_gqa_backward(d_gqa, R, qkv, att_gqa, B, T, NH, NH, hd);
    snprintf(what, sizeof what, "ref attention_gqa KV = NH = %d is attention", NH);
    compare_doubles(what, out_gqa, out_mha, no, 1e-12);
    compare_doubles(what, att_gqa, att_mha, na, 1e-12);
    compare_doubles(what, d_gqa, d_mha, nq, 1e-12);

    /* the fast kernels, gradients pre-filled alike */
    float *fqkv = to_float(qkv, nq), *fR = to_float(R, no);
    float *fo_mha = malloc(no * sizeof(float)), *fa_mha = malloc(na * sizeof(float));
    float *fo_gqa = malloc(no * sizeof(float)), *fa_gqa = malloc(na * sizeof(float));
    float *fd_mha = to_float(pre, nq), *fd_gqa = to_float(pre, nq);
    be->attention_forward(fo_mha, fa_mha, fqkv, B, T, C, NH);
    be->attention_gqa_forward(fo_gqa, fa_gqa, fqkv, B, T, NH, NH, hd);
    be->attention_backward(fd_mha, fR, fqkv, fa_mha, B, T, C, NH);
    be->attention_gqa_backward(fd_gqa, fR, fqkv, fa_gqa, B, T, NH, NH, hd);
    double *as_double = dalloc(nq);
    snprintf(what, sizeof what, "fast attention_gqa KV = NH = %d out = attention", NH);
    for (int64_t i = 0; i < no; i++) as_double[i] = fo_mha[i];
    compare(what, fo_gqa, as_double, no, 1e-6, 1e-7);
    snprintf(what, sizeof what, "fast attention_gqa KV = NH = %d att = attention", NH);
    for (int64_t i = 0; i < na; i++) as_double[i] = fa_mha[i];
    compare(what, fa_gqa, as_double, na, 1e-6, 1e-7);
    snprintf(what, sizeof what, "fast attention_gqa KV = NH = %d dqkv = attention", NH);
    for (int64_t i = 0; i < nq; i++) as_double[i] = fd_mha[i];
    compare(what, fd_gqa, as_double, nq, 1e-6, 1e-6);
    free(qkv), free(R), free(pre), free(out_mha), free(att_mha), free(out_gqa), free(att_gqa);
    free(d_mha), free(d_gqa), free(fqkv), free(fR), free(fo_mha), free(fa_mha), free(fo_gqa);
    free(fa_gqa), free(fd_mha), free(fd_gqa), free(as_double);
}

/* ---- SwiGLU ---- */
typedef struct {
    int64_t N;
    int F;
    double *inp, *out, *R;
} swiglu_ctx;

static double swiglu_objective(void *p) {
    swiglu_ctx *c = p;
    ref_swiglu_forward(c->out, c->inp, c->N, c->F);
    return dot(c->out, c->R, c->N * c->F);
}

static void test_swiglu(const loom_backend *be, int64_t N, int F) {
    swiglu_ctx c = {.N = N, .F = F};
    int64_t ni = N * 2 * F, no = N * F;
    char what[160];
    c.inp = dalloc(ni), c.out = dalloc(no), c.R = dalloc(no);
    fill_random(c.inp, ni, 3.0), fill_random(c.R, no, 1.0);
    /* gates at 0 and saturated both ways, in row 0 */
    c.inp[0] = 0.0, c.inp[1] = 20.0, c.inp[2] = -20.0, c.inp[3] = -100.0, c.inp[4] = 100.0;
    round_to_float(c.inp, ni), round_to_float(c.R, no);
    swiglu_objective(&c);
    double *dinp = dalloc(ni);
    ref_swiglu_backward(dinp, c.inp, c.R, N, F);
    snprintf(what, sizeof what, "swiglu N %lld F %d: dinp", (long long)N, F);
    fd_check(what, swiglu_objective, &c, c.inp, ni, dinp);
    float *finp = to_float(c.inp, ni), *fR = to_float(c.R, no);
    float *fout = malloc(no * sizeof(float));
    double *pre = dalloc(ni);
    fill_random(pre, ni, 1.0);
    round_to_float(pre, ni);
    float *fdinp = to_float(pre, ni);
    be->swiglu_forward(fout, finp, N, F);
    compare("swiglu forward fast vs ref", fout, c.out, no, 1e-5, 1e-6);
    be->swiglu_backward(fdinp, finp, fR, N, F);
    for (int64_t i = 0; i < ni; i++) dinp[i] += pre[i];
    compare("swiglu dinp fast vs ref (accumulates)", fdinp, dinp, ni, 1e-5, 1e-6);
    free(c.inp), free(c.out), free(c.R), free(dinp), free(finp), free(fR), free(fout), free(pre);
    free(fdinp);
}

/* ---- gelu ---- */
typedef struct {
    int64_t N;
    double *inp, *out, *R;
} gelu_ctx;

static double gelu_objective(void *p) {
    gelu_ctx *c = p;
    ref_gelu_forward(c->out, c->inp, c->N);
    return dot(c->out, c->R, c->N);
}

static void test_gelu(const loom_backend *be) {
    gelu_ctx c = {.N = 1000};
    c.inp = dalloc(c.N), c.out = dalloc(c.N), c.R = dalloc(c.N);
    fill_random(c.inp, c.N, 3.0), fill_random(c.R, c.N, 1.0);
    c.inp[0] = 0.0, c.inp[1] = 12.0, c.inp[2] = -12.0; /* saturated tails */
    gelu_objective(&c);
    double *dinp = dalloc(c.N);
    ref_gelu_backward(dinp, c.inp, c.R, c.N);
    fd_check("gelu dinp", gelu_objective, &c, c.inp, c.N, dinp);
    float *finp = to_float(c.inp, c.N), *fR = to_float(c.R, c.N);
    float *fout = malloc(c.N * sizeof(float)), *fd = calloc(c.N, sizeof(float));
    be->gelu_forward(fout, finp, c.N);
    compare("gelu forward fast vs ref", fout, c.out, c.N, 1e-5, 1e-6);
    be->gelu_backward(fd, finp, fR, c.N);
    compare("gelu backward fast vs ref", fd, dinp, c.N, 1e-4, 1e-5);
    free(c.inp), free(c.out), free(c.R), free(dinp), free(finp), free(fR), free(fout), free(fd);
}

/* ---- encoder ---- */
typedef struct {
    int B, T, C, V;
    int32_t *inp;
    double *wte, *wpe, *out, *R;
} enc_ctx;

static double enc_objective(void *p) {
    enc_ctx *c = p;
    ref_encoder_forward(c->out, c->inp, c->wte, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->R, (int64_t)c->B * c->T * c->C);
}

static void test_encoder(const loom_backend *be) {
    enc_ctx c = {.B = 3, .T = 4, .C = 8, .V = 5};
    int32_t inp[12] = {0, 1, 2, 3, 4, 4, 4, 1, 0, 2, 2, 3}; /* repeated tokens */
    c.inp = inp;
    int64_t no = (int64_t)c.B * c.T * c.C;
    c.wte = dalloc(c.V * c.C), c.wpe = dalloc(c.T * c.C), c.out = dalloc(no), c.R = dalloc(no);
    fill_random(c.wte, c.V * c.C, 1.0), fill_random(c.wpe, c.T * c.C, 1.0);
    fill_random(c.R, no, 1.0);
    enc_objective(&c);
    double *dwte = dalloc(c.V * c.C), *dwpe = dalloc(c.T * c.C);
    ref_encoder_backward(dwte, dwpe, c.R, c.inp, c.B, c.T, c.C);
    fd_check("encoder dwte", enc_objective, &c, c.wte, c.V * c.C, dwte);
    fd_check("encoder dwpe", enc_objective, &c, c.wpe, c.T * c.C, dwpe);
    float *fwte = to_float(c.wte, c.V * c.C), *fwpe = to_float(c.wpe, c.T * c.C);
    float *fR = to_float(c.R, no), *fout = malloc(no * sizeof(float));
    float *fdwte = calloc(c.V * c.C, sizeof(float)), *fdwpe = calloc(c.T * c.C, sizeof(float));
    be->encoder_forward(fout, c.inp, fwte, fwpe, c.B, c.T, c.C);
    compare("encoder forward fast vs ref", fout, c.out, no, 1e-6, 1e-6);
    be->encoder_backward(fdwte, fdwpe, fR, c.inp, c.B, c.T, c.C);
    compare("encoder dwte fast vs ref", fdwte, dwte, c.V * c.C, 1e-5, 1e-5);
    compare("encoder dwpe fast vs ref", fdwpe, dwpe, c.T * c.C, 1e-5, 1e-5);
    free(c.wte), free(c.wpe), free(c.out), free(c.R), free(dwte), free(dwpe), free(fwte);
    free(fwpe), free(fR), free(fout), free(fdwte), free(fdwpe);
}

/* ---- softmax cross-entropy ---- */
typedef struct {
    int64_t N;
    int V, Vp;
    const int32_t *targets;
    double *logits, *probs, *losses, dloss;
} xent_ctx;

static double xent_objective(void *p) {
    xent_ctx *c = p;
    ref_softmax_xent_forward(c->losses, c->probs, c->logits, c->targets, c->N, c->V, c->Vp);
    double s = 0.0;
    for (int64_t i = 0; i < c->N; i++) s += c->losses[i];
    return c->dloss * s;
}

static void test_softmax_xent(const loom_backend *be) {
    int32_t targets[6] = {0, 9, 3, -1, 5, 2}; /* -1: a row that does not count */
    xent_ctx c = {.N = 6, .V = 10, .Vp = 16, .targets = targets, .dloss = 1.0 / 5.0};
    int64_t n = c.N * c.Vp;
    c.logits = dalloc(n), c.probs = dalloc(n), c.losses = dalloc(c.N);
    fill_random(c.logits, n, 3.0);
    xent_objective(&c);
    double *dlogits = dalloc(n);
    ref_softmax_xent_backward(dlogits, c.probs, targets, c.dloss, c.N, c.V, c.Vp);
    fd_check("softmax_xent dlogits", xent_objective, &c, c.logits, n, dlogits);
    int padded_zero = 1;
    for (int64_t i = 0; i < c.N; i++)
        for (int j = c.V; j < c.Vp; j++) padded_zero &= dlogits[i * c.Vp + j] == 0.0;
    CHECK(padded_zero, "padded logits must get zero gradient");
    float *flog = to_float(c.logits, n), *flosses = malloc(c.N * sizeof(float));
    be->softmax_xent_forward(flosses, flog, flog, targets, c.N, c.V, c.Vp); /* in place */
    compare("softmax_xent losses fast vs ref", flosses, c.losses, c.N, 1e-5, 1e-6);
    compare("softmax_xent probs fast vs ref", flog, c.probs, n, 1e-5, 1e-7);
    be->softmax_xent_backward(flog, flog, targets, (float)c.dloss, c.N, c.V, c.Vp);
    compare("softmax_xent dlogits fast vs ref", flog, dlogits, n, 1e-5, 1e-7);
    free(c.logits), free(c.probs), free(c.losses), free(dlogits), free(flog), free(flosses);
}

/* ---- tensor-parallel pieces ---- */

/* a row-parallel layer: GEMM without bias, (the sum over ranks,) then bias_forward */
static void test_bias(const loom_backend *be) {
    int64_t N = 7;
    int C = 9, OC = 13;
    double *inp = dalloc(N * C), *w = dalloc((int64_t)OC * C), *bias = dalloc(OC);
    double *out = dalloc(N * OC), *with_bias = dalloc(N * OC);
    fill_random(inp, N * C, 1.0), fill_random(w, (int64_t)OC * C, 1.0);
    fill_random(bias, OC, 1.0), fill_random(out, N * OC, 1.0);
    round_to_float(bias, OC), round_to_float(out, N * OC);
    float *fout = to_float(out, N * OC), *fbias = to_float(bias, OC);
    ref_bias_forward(out, bias, N, OC);
    be->bias_forward(fout, fbias, N, OC);
    /* one float addition of two floats: the double sum rounded, within half an ulp */
    compare("bias_forward fast vs ref (accumulates)", fout, out, N * OC, 0x1p-24, 0.0);

    ref_matmul_forward(with_bias, inp, w, bias, N, C, OC);
    ref_matmul_forward(out, inp, w, NULL, N, C, OC);
    ref_bias_forward(out, bias, N, OC);
    compare_doubles("ref: matmul then bias_forward = matmul with bias", out, with_bias, N * OC,
                    1e-14);
    float *finp = to_float(inp, N * C), *fw = to_float(w, (int64_t)OC * C);
    be->matmul_forward(fout, finp, fw, NULL, N, C, OC);
    be->bias_forward(fout, fbias, N, OC);
    compare("fast: matmul then bias_forward = matmul with bias", fout, with_bias, N * OC, 1e-5,
            1e-5);
    free(inp), free(w), free(bias), free(out), free(with_bias), free(fout), free(fbias);
    free(finp), free(fw);
}

/* ---- vocabulary-parallel embedding ---- */
typedef struct {
    int B, T, C, tp, rows; /* rows: wte rows per shard */
    const int32_t *inp;
    double *wte, *wpe, *out, *part, *R;
} enc_shard_ctx;

/* the model's forward under TP: every shard's lookup, summed, then the positions */
static double enc_shard_objective(void *p) {
    enc_shard_ctx *c = p;
    int64_t n = (int64_t)c->B * c->T * c->C;
    for (int64_t i = 0; i < n; i++) c->out[i] = 0.0;
    for (int r = 0; r < c->tp; r++) {
        ref_encoder_shard_forward(c->part, c->inp, c->wte + (int64_t)r * c->rows * c->C,
                                  (int64_t)c->B * c->T, c->C, r * c->rows, c->rows);
        for (int64_t i = 0; i < n; i++) c->out[i] += c->part[i];
    }
    ref_position_forward(c->out, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->R, n);
}

static void test_encoder_shards(const loom_backend *be, int tp) {
    enum { B = 3, T = 4, C = 8, VP = 12 };
    /* every shard's rows, repeated tokens, the first and the last row */
    const int32_t inp[B * T] = {0, 11, 5, 5, 3, 7, 11, 2, 9, 0, 6, 5};
    int64_t N = B * T, no = N * C, nw = (int64_t)VP * C, np = (int64_t)T * C;
    int rows = VP / tp;
    char what[160];
    enc_shard_ctx c = {B, T, C, tp, rows, inp, NULL, NULL, NULL, NULL, NULL};
    c.wte = dalloc(nw), c.wpe = dalloc(np), c.out = dalloc(no), c.part = dalloc(no);
    c.R = dalloc(no);
    fill_random(c.wte, nw, 1.0), fill_random(c.wpe, np, 1.0), fill_random(c.R, no, 1.0);
    double *pre_wte = dalloc(nw), *pre_wpe = dalloc(np);
    fill_random(pre_wte, nw, 1.0), fill_random(pre_wpe, np, 1.0);
    round_to_float(c.wte, nw), round_to_float(c.wpe, np), round_to_float(c.R, no);

    /* reference backward against finite differences of the sharded forward */
    double *dwte = dalloc(nw), *dwpe = dalloc(np);
    for (int r = 0; r < tp; r++) {
        ref_encoder_shard_backward(dwte + (int64_t)r * rows * C, c.R, inp, N, C, r * rows, rows);
    }
    ref_position_backward(dwpe, c.R, B, T, C);
    snprintf(what, sizeof what, "encoder shards tp %d: dwte", tp);
    fd_check(what, enc_shard_objective, &c, c.wte, nw, dwte);
    snprintf(what, sizeof what, "encoder shards tp %d: dwpe", tp);
    fd_check(what, enc_shard_objective, &c, c.wpe, np, dwpe);

    /* the sharded reference is the unsharded one */
    double *whole = dalloc(no), *whole_dwte = dalloc(nw), *whole_dwpe = dalloc(np);
    enc_shard_objective(&c);
    ref_encoder_forward(whole, inp, c.wte, c.wpe, B, T, C);
    ref_encoder_backward(whole_dwte, whole_dwpe, c.R, inp, B, T, C);
    snprintf(what, sizeof what, "encoder shards tp %d: ref shards = ref encoder", tp);
    compare_doubles(what, c.out, whole, no, 0.0);
    compare_doubles(what, dwte, whole_dwte, nw, 0.0);
    compare_doubles(what, dwpe, whole_dwpe, np, 0.0);

    /* fast vs reference, shard by shard; then the fast shards against the fast encoder */
    float *fwte = to_float(c.wte, nw), *fwpe = to_float(c.wpe, np), *fR = to_float(c.R, no);
    float *fpart = malloc(no * sizeof(float)), *fsum = calloc(no, sizeof(float));
    float *fdwte = to_float(pre_wte, nw), *fdwpe = to_float(pre_wpe, np);
    double *part_ref = dalloc(no), *dwte_ref = dalloc(nw), *dwpe_ref = dalloc(np);
    for (int64_t i = 0; i < nw; i++) dwte_ref[i] = (double)fdwte[i];
    for (int64_t i = 0; i < np; i++) dwpe_ref[i] = (double)fdwpe[i];
    for (int r = 0; r < tp; r++) {
        int64_t at = (int64_t)r * rows * C;
        be->encoder_shard_forward(fpart, inp, fwte + at, N, C, r * rows, rows);
        ref_encoder_shard_forward(part_ref, inp, c.wte + at, N, C, r * rows, rows);
        snprintf(what, sizeof what, "encoder_shard_forward tp %d shard %d fast vs ref", tp, r);
        compare(what, fpart, part_ref, no, 1e-7, 0.0);
        for (int64_t i = 0; i < no; i++) fsum[i] += fpart[i];
        be->encoder_shard_backward(fdwte + at, fR, inp, N, C, r * rows, rows);
        ref_encoder_shard_backward(dwte_ref + at, c.R, inp, N, C, r * rows, rows);
    }
    snprintf(what, sizeof what, "encoder_shard_backward tp %d fast vs ref (accumulates)", tp);
    compare(what, fdwte, dwte_ref, nw, 1e-6, 1e-6);
    double *pos_ref = dalloc(no);
    for (int64_t i = 0; i < no; i++) pos_ref[i] = (double)fsum[i];
    ref_position_forward(pos_ref, c.wpe, B, T, C);
    be->position_forward(fsum, fwpe, B, T, C);
    snprintf(what, sizeof what, "position_forward tp %d fast vs ref (accumulates)", tp);
    compare(what, fsum, pos_ref, no, 0x1p-24, 0.0);
    be->position_backward(fdwpe, fR, B, T, C);
    ref_position_backward(dwpe_ref, c.R, B, T, C);
    snprintf(what, sizeof what, "position_backward tp %d fast vs ref (accumulates)", tp);
    compare(what, fdwpe, dwpe_ref, np, 1e-6, 1e-6);

    /* the model's tp > 1 path reproduces its tp = 1 path: lookups and gradients exactly */
    float *fwhole = malloc(no * sizeof(float));
    float *fwhole_dwte = to_float(pre_wte, nw), *fwhole_dwpe = to_float(pre_wpe, np);
    be->encoder_forward(fwhole, inp, fwte, fwpe, B, T, C);
    be->encoder_backward(fwhole_dwte, fwhole_dwpe, fR, inp, B, T, C);
    int same = memcmp(fsum, fwhole, no * sizeof(float)) == 0;
    same &= memcmp(fdwte, fwhole_dwte, nw * sizeof(float)) == 0;
    same &= memcmp(fdwpe, fwhole_dwpe, np * sizeof(float)) == 0;
    CHECK(same, "encoder tp %d: shards + sum + positions differ from encoder_forward/backward", tp);
    free(c.wte), free(c.wpe), free(c.out), free(c.part), free(c.R), free(pre_wte), free(pre_wpe);
    free(dwte), free(dwpe), free(whole), free(whole_dwte), free(whole_dwpe), free(fwte);
    free(fwpe), free(fR), free(fpart), free(fsum), free(fdwte), free(fdwpe), free(part_ref);
    free(dwte_ref), free(dwpe_ref), free(pos_ref), free(fwhole), free(fwhole_dwte);
    free(fwhole_dwpe);
}

/* ---- vocabulary-parallel softmax cross-entropy ---- */
enum { XS_N = 8, XS_V = 10, XS_VP = 16 };
/* -1: a row that does not count; 4 and 8 open a shard (at tp 4, and at tp 2 and 4), 9 the last
 * real column */
static const int32_t xs_targets[XS_N] = {0, 9, 3, -1, 5, 2, 4, 8};

typedef struct {
    int tp, Vpl;
    double dloss;
    double *logits;          /* (tp, N, Vpl): shard r's logits at r * N * Vpl */
    double *probs;           /* (tp, N, Vpl) */
    double *max, *sums, *tl; /* (tp, N) per shard */
    double *all_max, *all_sums, *all_tl, *losses; /* (N) across shards; losses of shard 0 */
} xs_ctx;

static int xs_real(int Vpl, int r) {
    int real = XS_V - r * Vpl;
    return real < 0 ? 0 : (real > Vpl ? Vpl : real);
}

/* what the model does under TP, with the allreduces done here; returns dloss * sum(losses) */
static double xs_objective(void *p) {
    xs_ctx *c = p;
    int64_t N = XS_N, sn = N * c->Vpl;
    for (int64_t i = 0; i < N; i++) c->all_max[i] = -INFINITY, c->all_sums[i] = c->all_tl[i] = 0;
    for (int r = 0; r < c->tp; r++) {
        ref_softmax_xent_shard_max(c->max + r * N, c->logits + r * sn, N, xs_real(c->Vpl, r),
                                   c->Vpl);
        for (int64_t i = 0; i < N; i++) {
            if (c->max[r * N + i] > c->all_max[i]) c->all_max[i] = c->max[r * N + i];
        }
    }
    for (int r = 0; r < c->tp; r++) {
        ref_softmax_xent_shard_expsum(c->probs + r * sn, c->sums + r * N, c->tl + r * N,
                                      c->logits + r * sn, c->all_max, xs_targets, N,
                                      xs_real(c->Vpl, r), c->Vpl, r * c->Vpl);
        for (int64_t i = 0; i < N; i++) {
            c->all_sums[i] += c->sums[r * N + i];
            c->all_tl[i] += c->tl[r * N + i];
        }
    }
    for (int r = 0; r < c->tp; r++) {
        ref_softmax_xent_shard_forward(c->losses, c->probs + r * sn, c->all_sums, c->all_tl,
                                       xs_targets, N, xs_real(c->Vpl, r), c->Vpl);
    }
    double s = 0.0;
    for (int64_t i = 0; i < N; i++) s += c->losses[i];
    return c->dloss * s;
}

/* shard r's column j of row i in the full (N, Vp) matrix */
static int64_t xs_full(int Vpl, int r, int64_t i, int j) {
    return i * XS_VP + (int64_t)r * Vpl + j;
}

static void test_softmax_xent_shards(const loom_backend *be, int tp) {
    int64_t N = XS_N, n = N * XS_VP;
    int Vpl = XS_VP / tp;
    int64_t sn = N * Vpl;
    char what[160];
    xs_ctx c = {.tp = tp, .Vpl = Vpl, .dloss = 1.0 / 5.0};
    c.logits = dalloc(n), c.probs = dalloc(n), c.max = dalloc(tp * N), c.sums = dalloc(tp * N);
    c.tl = dalloc(tp * N), c.all_max = dalloc(N), c.all_sums = dalloc(N), c.all_tl = dalloc(N);
    c.losses = dalloc(N);
    double *full = dalloc(n);
    fill_random(full, n, 3.0);
    round_to_float(full, n);
    for (int r = 0; r < tp; r++)
        for (int64_t i = 0; i < N; i++)
            for (int j = 0; j < Vpl; j++)
                c.logits[r * sn + i * Vpl + j] = full[xs_full(Vpl, r, i, j)];

    /* reference backward against finite differences of the sharded forward */
    xs_objective(&c);
    double *dlogits = dalloc(n);
    for (int r = 0; r < tp; r++) {
        ref_softmax_xent_shard_backward(dlogits + r * sn, c.probs + r * sn, xs_targets, c.dloss, N,
                                        xs_real(Vpl, r), Vpl, r * Vpl);
    }
    snprintf(what, sizeof what, "softmax_xent shards tp %d: dlogits", tp);
    fd_check(what, xs_objective, &c, c.logits, n, dlogits);

    /* the sharded reference is the unsharded one */
    xs_objective(&c);
    double *probs = dalloc(n), *losses = dalloc(N), *whole_d = dalloc(n);
    ref_softmax_xent_forward(losses, probs, full, xs_targets, N, XS_V, XS_VP);
    ref_softmax_xent_backward(whole_d, probs, xs_targets, c.dloss, N, XS_V, XS_VP);
    double *gathered = dalloc(n), *gathered_d = dalloc(n);
    for (int r = 0; r < tp; r++)
        for (int64_t i = 0; i < N; i++)
            for (int j = 0; j < Vpl; j++) {
                gathered[xs_full(Vpl, r, i, j)] = c.probs[r * sn + i * Vpl + j];
                gathered_d[xs_full(Vpl, r, i, j)] = dlogits[r * sn + i * Vpl + j];
            }
    snprintf(what, sizeof what, "softmax_xent tp %d: ref shards = ref softmax_xent", tp);
    compare_doubles(what, gathered, probs, n, 1e-12);
    compare_doubles(what, c.losses, losses, N, 1e-12);
    compare_doubles(what, gathered_d, whole_d, n, 1e-12);

    /* fast vs reference, step by step; the cross-shard max is exact, so both see the same */
    float *flog = to_float(c.logits, n); /* probs alias logits, as in the model */
    float *fmax = malloc(N * sizeof(float)), *fsums = malloc(N * sizeof(float));
    float *ftl = malloc(N * sizeof(float)), *flosses = malloc(N * sizeof(float));
    float *all_max = calloc(N, sizeof(float)), *all_sums = calloc(N, sizeof(float));
    float *all_tl = calloc(N, sizeof(float));
    for (int64_t i = 0; i < N; i++) all_max[i] = -INFINITY;
    for (int r = 0; r < tp; r++) {
        be->softmax_xent_shard_max(fmax, flog + r * sn, N, xs_real(Vpl, r), Vpl);
        snprintf(what, sizeof what, "softmax_xent_shard_max tp %d shard %d fast vs ref", tp, r);
        compare(what, fmax, c.max + r * N, N, 1e-7, 0.0);
        for (int64_t i = 0; i < N; i++) all_max[i] = fmax[i] > all_max[i] ? fmax[i] : all_max[i];
    }
    double *exps = dalloc(sn), *sums = dalloc(N), *tl = dalloc(N);
    float *fexps = malloc(sn * sizeof(float));
    for (int r = 0; r < tp; r++) {
        /* into a separate buffer (padded columns must be written), then in place as the model
         * calls it: the same */
        for (int64_t i = 0; i < sn; i++) fexps[i] = NAN;
        be->softmax_xent_shard_expsum(fexps, fsums, ftl, flog + r * sn, all_max, xs_targets, N,
                                      xs_real(Vpl, r), Vpl, r * Vpl);
        ref_softmax_xent_shard_expsum(exps, sums, tl, c.logits + r * sn, c.all_max, xs_targets, N,
                                      xs_real(Vpl, r), Vpl, r * Vpl);
        snprintf(what, sizeof what, "softmax_xent_shard_expsum tp %d shard %d fast vs ref", tp, r);
        compare(what, fexps, exps, sn, 1e-6, 0.0);
        compare(what, fsums, sums, N, 1e-6, 0.0);
        compare(what, ftl, tl, N, 0x1p-24, 0.0); /* a float difference: within half an ulp */
        for (int64_t i = 0; i < N; i++) all_sums[i] += fsums[i], all_tl[i] += ftl[i];
        be->softmax_xent_shard_expsum(flog + r * sn, fsums, ftl, flog + r * sn, all_max, xs_targets,
                                      N, xs_real(Vpl, r), Vpl, r * Vpl);
        CHECK(memcmp(flog + r * sn, fexps, sn * sizeof(float)) == 0,
              "softmax_xent_shard_expsum tp %d shard %d: in place = out of place", tp, r);
    }
    for (int r = 0; r < tp; r++) {
        be->softmax_xent_shard_forward(flosses, flog + r * sn, all_sums, all_tl, xs_targets, N,
                                       xs_real(Vpl, r), Vpl);
        snprintf(what, sizeof what, "softmax_xent_shard_forward tp %d shard %d fast vs ref", tp, r);
        compare(what, flosses, c.losses, N, 1e-6, 1e-6);
        compare(what, flog + r * sn, c.probs + r * sn, sn, 1e-6, 1e-7);
    }
    /* the fast shards reproduce the fast unsharded kernel (its exp is a polynomial) */
    float *fwhole = to_float(gathered, n), *fwhole_losses = malloc(N * sizeof(float));
    for (int r = 0; r < tp; r++)
        for (int64_t i = 0; i < N; i++)
            for (int j = 0; j < Vpl; j++) {
                fwhole[xs_full(Vpl, r, i, j)] = (float)c.logits[r * sn + i * Vpl + j];
            }
    be->softmax_xent_forward(fwhole_losses, fwhole, fwhole, xs_targets, N, XS_V, XS_VP);
    float *fgathered = malloc(n * sizeof(float));
    for (int r = 0; r < tp; r++)
        for (int64_t i = 0; i < N; i++)
            for (int j = 0; j < Vpl; j++)
                fgathered[xs_full(Vpl, r, i, j)] = flog[r * sn + i * Vpl + j];
    double *as_double = dalloc(n);
    for (int64_t i = 0; i < n; i++) as_double[i] = fwhole[i];
    snprintf(what, sizeof what, "softmax_xent tp %d: fast shards = fast softmax_xent probs", tp);
    compare(what, fgathered, as_double, n, 0.0, 1e-6);
    for (int64_t i = 0; i < N; i++) as_double[i] = fwhole_losses[i];
    snprintf(what, sizeof what, "softmax_xent tp %d: fast shards = fast softmax_xent losses", tp);
    compare(what, flosses, as_double, N, 0.0, 1e-6);

    /* backward in place, fast vs reference, then against the unsharded fast backward */
    for (int r = 0; r < tp; r++) {
        for (int64_t i = 0; i < sn; i++) fexps[i] = NAN; /* OVERWRITES: every element written */
        be->softmax_xent_shard_backward(fexps, flog + r * sn, xs_targets, (float)c.dloss, N,
                                        xs_real(Vpl, r), Vpl, r * Vpl);
        snprintf(what, sizeof what, "softmax_xent_shard_backward tp %d shard %d fast vs ref", tp,
                 r);
        compare(what, fexps, dlogits + r * sn, sn, 1e-5, 1e-7);
        be->softmax_xent_shard_backward(flog + r * sn, flog + r * sn, xs_targets, (float)c.dloss, N,
                                        xs_real(Vpl, r), Vpl, r * Vpl);
        CHECK(memcmp(flog + r * sn, fexps, sn * sizeof(float)) == 0,
              "softmax_xent_shard_backward tp %d shard %d: in place = out of place", tp, r);
    }
    be->softmax_xent_backward(fwhole, fwhole, xs_targets, (float)c.dloss, N, XS_V, XS_VP);
    for (int r = 0; r < tp; r++)
        for (int64_t i = 0; i < N; i++)
            for (int j = 0; j < Vpl; j++)
                fgathered[xs_full(Vpl, r, i, j)] = flog[r * sn + i * Vpl + j];
    for (int64_t i = 0; i < n; i++) as_double[i] = fwhole[i];
    snprintf(what, sizeof what, "softmax_xent tp %d: fast shards = fast softmax_xent dlogits", tp);
    compare(what, fgathered, as_double, n, 0.0, 1e-6);

    free(c.logits), free(c.probs), free(c.max), free(c.sums), free(c.tl), free(c.all_max);
    free(c.all_sums), free(c.all_tl), free(c.losses), free(full), free(dlogits), free(probs);
    free(losses), free(whole_d), free(gathered), free(gathered_d), free(flog), free(fmax);
    free(fsums), free(ftl), free(flosses), free(all_max), free(all_sums), free(all_tl);
    free(fwhole), free(fwhole_losses), free(fgathered), free(as_double), free(exps), free(sums);
    free(tl), free(fexps);
}

/* ---- residual, adamw, reductions ---- */
static void test_elementwise(const loom_backend *be) {
    int64_t n = 1003;
    double *a = dalloc(n), *b = dalloc(n), *out = dalloc(n);
    fill_random(a, n, 1.0), fill_random(b, n, 1.0);
    ref_residual_forward(out, a, b, n);
    float *fa = to_float(a, n), *fb = to_float(b, n), *fo = malloc(n * sizeof(float));
    be->residual_forward(fo, fa, fb, n);
    compare("residual fast vs ref", fo, out, n, 1e-6, 1e-6);

    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)fa[i] * fa[i];
    CHECK_CLOSE(be->sum_squares(fa, n), ss, 1e-12, 0.0, "sum_squares");
    /* scale: every element against a double reference. By 0.5 the float product is exact; by
     * 0.3f it is the double product rounded to float, within half an ulp (2^-24 relative). */
    double *scaled = dalloc(n);
    for (int64_t i = 0; i < n; i++) scaled[i] = 0.5 * (double)fa[i];
    be->scale(fa, 0.5f, n);
    compare("scale by 0.5 (exact)", fa, scaled, n, 0.0, 0.0);
    for (int64_t i = 0; i < n; i++) scaled[i] = (double)0.3f * (double)fa[i];
    be->scale(fa, 0.3f, n);
    compare("scale by 0.3", fa, scaled, n, 0x1p-24, 0.0);
    free(scaled);

    /* AdamW: five steps with decay, fast (float) vs reference (double) */
    double *p = dalloc(n), *g = dalloc(n), *m = dalloc(n), *v = dalloc(n);
    fill_random(p, n, 1.0);
    float *fp = to_float(p, n), *fm = calloc(n, sizeof(float)), *fv = calloc(n, sizeof(float));
    for (int step = 1; step <= 5; step++) {
        fill_random(g, n, 0.1);
        float *fg = to_float(g, n);
        ref_adamw_update(p, g, m, v, n, 1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.75);
        be->adamw_update(fp, fg, fm, fv, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.75f);
        free(fg);
    }
    compare("adamw params fast vs ref", fp, p, n, 1e-5, 1e-6);
    compare("adamw m fast vs ref", fm, m, n, 1e-5, 1e-7);
    compare("adamw v fast vs ref", fv, v, n, 1e-5, 1e-9);
    free(a), free(b), free(out), free(fa), free(fb), free(fo), free(p), free(g), free(m);
    free(v), free(fp), free(fm), free(fv);
}

int main(void) {
    const loom_backend *be = loom_backend_cpu();
    test_layernorm(be);
    test_matmul(be, 6, 8, 12, 1);
    test_matmul(be, 67, 96, 130, 0); /* sizes that are not multiples of any block */
    test_attention(be, 2, 5, 8, 2, 1);
    test_attention(be, 2, 37, 48, 3, 0);
    test_rmsnorm(be, 7, 24, 1e-5f);
    test_rmsnorm(be, 5, 131, 1e-6f);
    /* stride past the rotated heads (the rest of the row must stay); then the positions of a
     * long sequence, where an angle in float would be off */
    loom_rope plain = {10000.0, {0, 0, 0, 0}}, llama3 = {500000.0, {0, 0, 0, 0}};
    /* Llama 3.1's scaling at a small original context, so that the three regimes (kept,
     * blended, divided) all fall among a 16-wide head's eight frequencies */
    loom_rope scaled = {10000.0, {8.0, 1.0, 4.0, 64.0}};
    test_rope(be, 2, 6, 3, 8, 3 * 8 + 12, plain, 1);
    test_rope(be, 2, 5, 2, 8, 2 * 8, plain, 1);
    test_rope(be, 2, 7, 2, 16, 2 * 16, scaled, 1);
    test_rope(be, 2, 2048, 2, 16, 2 * 16 + 16, llama3, 0);
    test_rope_scaling();
    test_attention_gqa(be, 2, 5, 4, 2, 8, 1);
    test_attention_gqa(be, 2, 5, 4, 1, 8, 1);
    test_attention_gqa(be, 2, 5, 4, 4, 8, 1);
    test_attention_gqa(be, 2, 37, 6, 2, 16, 0);
    test_attention_gqa(be, 3, 29, 8, 1, 12, 0);
    test_attention_gqa_is_mha(be, 2, 5, 4, 8);
    test_attention_gqa_is_mha(be, 2, 37, 3, 16);
    test_swiglu(be, 7, 13);
    test_gelu(be);
    test_encoder(be);
    test_softmax_xent(be);
    test_bias(be);
    for (int tp = 1; tp <= 4; tp++) test_encoder_shards(be, tp); /* 12 rows: 12, 6, 4, 3 each */
    /* 16 columns, 10 real: at tp 4 shard 2 holds 2 real columns and shard 3 none */
    for (int tp = 1; tp <= 4; tp *= 2) test_softmax_xent_shards(be, tp);
    test_elementwise(be);
    return check_finish();
}
