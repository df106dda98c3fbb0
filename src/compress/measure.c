/*
 * measure.c — how fast a compressor is: seconds of one encode + decode of one matrix on one
 * replica (no communication), the median of a few repetitions, and the ratio of input to wire
 * bytes. PowerSGD runs its three calls (P, orthonormalise and Q, the approximation and
 * residual) on a fresh copy of the gradient each time, since it works in place; the other
 * methods their one-shot encode and decode. `loom bench --compressors` prints these, and
 * `loom profile` records them in the cluster description (bytes of fp32 input per second).
 *
 * Not here: the bytes a run sends (metrics), time on a link (the cost model).
 */
#include "loom/compress.h"

#include <stdlib.h>
#include <string.h>

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times `reps` encode + decode rounds after one warm-up; fills times (reps). */
static void time_rounds(loom_compressor *c, const float *x, float *out, void *wire, float *p,
                        float *q, int reps, double *times) {
    size_t n = (size_t)(loom_compressor_rows(c) * loom_compressor_cols(c));
    int powersgd =
        loom_compressor_opts(c)->method == LOOM_COMPRESS_POWERSGD && loom_compressor_compresses(c);
    for (int k = 0; k <= reps; k++) { /* round 0 warms up */
        double t0 = loom_now();
        if (powersgd) {
            memcpy(out, x, n * sizeof(float)); /* the gradient it works in place on */
            t0 = loom_now();
            loom_powersgd_p(c, out, p);
            loom_powersgd_q(c, out, p, q);
            loom_powersgd_done(c, out, p, q, 1);
        } else {
            loom_compressor_encode(c, x, wire);
            loom_compressor_decode(c, wire, out);
        }
        if (k > 0) times[k - 1] = loom_now() - t0;
        loom_compressor_commit(c, 1);
    }
}

loom_status loom_compress_measure(const loom_compress_opts *opts, int64_t rows, int64_t cols,
                                  int reps, double *seconds, double *ratio) {
    *seconds = 0, *ratio = 0;
    if (rows < 1 || cols < 1 || reps < 1) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "measuring a compressor: expected rows, cols and reps >= 1, got %lld, "
                         "%lld, %d",
                         (long long)rows, (long long)cols, reps);
    }
    loom_compressor *c = NULL;
    loom_status st = loom_compressor_create(&c, opts, rows, cols, 0);
    if (st != LOOM_OK) return st;
    size_t n = (size_t)(rows * cols);
    int r = loom_compressor_rank(c) > 0 ? loom_compressor_rank(c) : 1;
    size_t wire_bytes = loom_compressor_wire_bytes(c);
    float *x = loom_alloc_aligned(n * sizeof(float), "compressor input");
    float *out = loom_alloc_aligned(n * sizeof(float), "compressor output");
    void *wire = loom_alloc_aligned(wire_bytes, "compressor wire");
    float *p = loom_alloc_aligned((size_t)rows * (size_t)r * sizeof(float), "PowerSGD P");
    float *q = loom_alloc_aligned((size_t)cols * (size_t)r * sizeof(float), "PowerSGD Q");
    double *times = loom_calloc((size_t)reps, sizeof *times, "compressor times");
    if (x && out && wire && p && q && times) {
        for (size_t i = 0; i < n; i++) x[i] = (float)loom_rng_normal(3, 0, i) * 1e-3f;
        time_rounds(c, x, out, wire, p, q, reps, times);
        qsort(times, (size_t)reps, sizeof *times, compare_doubles);
        *seconds = times[reps / 2];
        *ratio = (double)(n * sizeof(float)) / (double)wire_bytes;
    } else {
        st = LOOM_ERR_NOMEM;
    }
    loom_free_aligned(x), loom_free_aligned(out), loom_free_aligned(wire);
    loom_free_aligned(p), loom_free_aligned(q);
    free(times);
    loom_compressor_free(c);
    return st;
}
