/*
 * powersgd.c — the low-rank methods: PowerSGD's three calls around the two allreduce-sums
 * (data-parallel gradients) and lowrank's one-shot encode/decode (one sender's pipeline
 * activation gradient, Optimus-CC's compressed backpropagation with lazy error propagation).
 * Both take one power-iteration step from the warm-start factor Q: P = M Q, orthonormalise P
 * (Householder QR, LAPACK), Q = M^T P; the approximation is P Q^T. GEMMs are OpenBLAS's.
 *
 * Not here: summing over replicas (parallel/ through comm/), error feedback's commit/rollback
 * (compress.c).
 */
#include "compress_internal.h"

#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* LAPACK as libopenblas exports it (there is no lapacke.h here): Fortran, column-major,
 * arguments by pointer. blasint is OpenBLAS's integer (int, or 64 bits in an ILP64 build). */
void sgeqrf_(const blasint *m, const blasint *n, float *a, const blasint *lda, float *tau,
             float *work, const blasint *lwork, blasint *info);
void sorgqr_(const blasint *m, const blasint *n, const blasint *k, float *a, const blasint *lda,
             const float *tau, float *work, const blasint *lwork, blasint *info);

/* ---- scratch and the QR ------------------------------------------------------------------- */

loom_status loom_compress_lowrank_scratch(loom_compressor *c) {
    size_t rows = (size_t)c->rows, r = (size_t)c->rank;
    if (c->opts.method == LOOM_COMPRESS_LOWRANK) {
        c->p = loom_alloc_aligned(rows * r * sizeof(float), "lowrank P");
        if (!c->p) return LOOM_ERR_NOMEM;
    }
    c->qr = loom_alloc_aligned(rows * r * sizeof(float), "low-rank QR");
    c->tau = loom_alloc_aligned(r * sizeof(float), "low-rank QR");
    if (!c->qr || !c->tau) return LOOM_ERR_NOMEM;
    /* Ask both routines for their workspace (lwork = -1) and keep the larger. */
    blasint m = (blasint)c->rows, n = (blasint)c->rank, lda = m, query = -1, info = 0;
    float size_qrf = 0, size_orgqr = 0;
    sgeqrf_(&m, &n, c->qr, &lda, c->tau, &size_qrf, &query, &info);
    if (info == 0) sorgqr_(&m, &n, &n, c->qr, &lda, c->tau, &size_orgqr, &query, &info);
    if (info != 0) {
        return loom_fail(LOOM_ERR_RUNTIME, "compressor: LAPACK workspace query failed (info %d)",
                         (int)info);
    }
    c->lwork = (int64_t)(size_qrf > size_orgqr ? size_qrf : size_orgqr);
    if (c->lwork < (int64_t)n) c->lwork = n;
    c->work = loom_alloc_aligned((size_t)c->lwork * sizeof(float), "low-rank QR workspace");
    return c->work ? LOOM_OK : LOOM_ERR_NOMEM;
}

void loom_compress_lowrank_scratch_free(loom_compressor *c) {
    loom_free_aligned(c->p);
    loom_free_aligned(c->qr);
    loom_free_aligned(c->tau);
    loom_free_aligned(c->work);
    c->p = c->qr = c->tau = c->work = NULL;
}

/* Orthonormalises the r columns of p (rows x r, row-major) in place. LAPACK wants it
 * column-major, so it is transposed into c->qr, factored (sgeqrf) and its Q formed (sorgqr),
 * and transposed back. Householder reflections give orthonormal columns whatever the input: a
 * zero column has tau = 0 (the reflection is the identity) and yields a unit vector, so a zero
 * or rank-deficient P gives no NaN. */
static void orthonormalise(loom_compressor *c, float *p) {
    int64_t rows = c->rows, r = c->rank;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < r; j++) c->qr[j * rows + i] = p[i * r + j];
    }
    blasint m = (blasint)rows, n = (blasint)r, lda = m, lwork = (blasint)c->lwork, info = 0;
    sgeqrf_(&m, &n, c->qr, &lda, c->tau, c->work, &lwork, &info);
    if (info == 0) sorgqr_(&m, &n, &n, c->qr, &lda, c->tau, c->work, &lwork, &info);
    if (info != 0)
        loom_fatal("LAPACK QR of a %lld x %lld P: info %d", (long long)rows, (long long)r,
                   (int)info);
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < r; j++) p[i * r + j] = c->qr[j * rows + i];
    }
}

/* p (rows x r) = m (rows x cols) q (cols x r). */
static void multiply_mq(const loom_compressor *c, const float *m, const float *q, float *p) {
    int rows = (int)c->rows, cols = (int)c->cols, r = c->rank;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, r, cols, 1.0f, m, cols, q, r, 0.0f,
                p, r);
}

/* q (cols x r) = m^T (cols x rows) p (rows x r). */
static void multiply_mtp(const loom_compressor *c, const float *m, const float *p, float *q) {
    int rows = (int)c->rows, cols = (int)c->cols, r = c->rank;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, r, rows, 1.0f, m, cols, p, r, 0.0f,
                q, r);
}

/* out (rows x cols) = alpha p q^T + beta out. */
static void multiply_pqt(const loom_compressor *c, float alpha, const float *p, const float *q,
                         float beta, float *out) {
    int rows = (int)c->rows, cols = (int)c->cols, r = c->rank;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, r, alpha, p, r, q, r, beta,
                out, cols);
}

static double sum_sq(const float *v, int64_t n) {
    double sq = 0;
    for (int64_t i = 0; i < n; i++) sq += (double)v[i] * v[i];
    return sq;
}

static void require_powersgd(const loom_compressor *c, const char *what) {
    if (c->opts.method != LOOM_COMPRESS_POWERSGD || !c->compresses) {
        loom_fatal("%s on a %s compressor that %s (%lld x %lld)", what,
                   loom_compress_method_name(c->opts.method),
                   c->compresses ? "compresses" : "does not compress", (long long)c->rows,
                   (long long)c->cols);
    }
}

/* ---- PowerSGD ----------------------------------------------------------------------------- */

void loom_powersgd_p(loom_compressor *c, float *m, float *p) {
    require_powersgd(c, "loom_powersgd_p");
    if (c->opts.error_feedback) {
        const float *e = compress_state_read(c, &c->residual);
        for (int64_t i = 0; i < c->n; i++) m[i] += e[i];
    }
    multiply_mq(c, m, compress_state_read(c, &c->q), p);
}

void loom_powersgd_q(loom_compressor *c, const float *m, float *p, float *q) {
    require_powersgd(c, "loom_powersgd_q");
    orthonormalise(c, p);
    multiply_mtp(c, m, p, q);
}

void loom_powersgd_done(loom_compressor *c, float *m, const float *p, const float *q,
                        int replicas) {
    require_powersgd(c, "loom_powersgd_done");
    float *e = c->residual.working;
    if (c->opts.error_feedback) memcpy(e, m, (size_t)c->n * sizeof(float)); /* M */
    multiply_pqt(c, 1.0f, p, q, 0.0f, m);
    if (c->opts.error_feedback) {
        float share = (float)replicas;
        double sq = 0;
        for (int64_t i = 0; i < c->n; i++) {
            e[i] -= m[i] / share;
            sq += (double)e[i] * e[i];
        }
        c->residual_sq = sq;
    }
    memcpy(c->q.working, q, c->q.floats * sizeof(float));
    c->dirty = 1;
}

/* ---- lowrank: one sender, wire [P (rows x r), Q (cols x r)] ------------------------------- */

void loom_compress_lowrank_encode(loom_compressor *c, const float *x, void *wire) {
    const float *m = x;
    float *e = NULL;
    if (c->opts.error_feedback) {
        /* Lazy error propagation: this call's M = x + the residual of the previous one. */
        const float *e_read = compress_state_read(c, &c->residual);
        e = c->residual.working;
        for (int64_t i = 0; i < c->n; i++) e[i] = x[i] + e_read[i];
        m = e;
    }
    float *q = c->q.working; /* written only after the warm start below is read */
    multiply_mq(c, m, compress_state_read(c, &c->q), c->p);
    orthonormalise(c, c->p);
    multiply_mtp(c, m, c->p, q);
    size_t p_bytes = (size_t)c->rows * (size_t)c->rank * sizeof(float);
    memcpy(wire, c->p, p_bytes);
    memcpy((unsigned char *)wire + p_bytes, q, c->q.floats * sizeof(float));
    if (e) {
        multiply_pqt(c, -1.0f, c->p, q, 1.0f, e); /* E = M - P Q^T */
        c->residual_sq = sum_sq(e, c->n);
    }
    c->dirty = 1;
}

void loom_compress_lowrank_decode(const loom_compressor *c, const void *wire, float *out, int add) {
    size_t p_floats = (size_t)c->rows * (size_t)c->rank;
    size_t floats = p_floats + (size_t)c->cols * (size_t)c->rank;
    const float *factors = wire;
    float *copy = NULL;
    if ((uintptr_t)wire % _Alignof(float) != 0) {
        /* BLAS reads floats in place; a misaligned wire is copied out first. */
        copy = loom_malloc(floats * sizeof(float), "lowrank decode");
        if (!copy) loom_fatal("lowrank decode: %s", loom_last_error());
        memcpy(copy, wire, floats * sizeof(float));
        factors = copy;
    }
    multiply_pqt(c, 1.0f, factors, factors + p_floats, add ? 1.0f : 0.0f, out);
    free(copy);
}
