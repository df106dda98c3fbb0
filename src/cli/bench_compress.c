/*
 * bench_compress.c — `loom bench --compressors`: throughput of every compressor on GPT-2 124M's
 * matrix shapes, in GB/s of fp32 input (encode plus decode of one replica, no communication),
 * and the wire size against the input, so that a planner can cost compression. PowerSGD runs
 * its three calls (P, orthonormalise and Q, the approximation and residual); the others their
 * one-shot encode and decode. Medians over the timed repetitions.
 *
 * Not here: the bytes a run sends (metrics.jsonl), time on slow links (bench/compression.sh).
 */
#include "cli/cli.h"
#include "loom/compress.h"
#include "loom/ops.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *label;
    loom_compress_method method;
    int rank;
    double fraction;
} method_case;

typedef struct {
    const char *label;
    int64_t rows, cols;
} shape_case;

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds of one encode + decode (median of `reps`), or < 0 on failure. */
static double time_one(const method_case *mc, const shape_case *sc, int reps, double *ratio) {
    loom_compress_opts o = {.method = mc->method,
                            .rank = mc->rank,
                            .fraction = mc->fraction,
                            .error_feedback = mc->method != LOOM_COMPRESS_BF16,
                            .seed = 1};
    loom_compressor *c = NULL;
    if (loom_compressor_create(&c, &o, sc->rows, sc->cols, 0) != LOOM_OK) return -1;
    size_t n = (size_t)(sc->rows * sc->cols);
    int r = o.rank > 0 ? o.rank : 1;
    size_t wire_bytes = loom_compressor_wire_bytes(c);
    float *x = loom_alloc_aligned(n * sizeof(float), "input");
    float *out = loom_alloc_aligned(n * sizeof(float), "output");
    void *wire = loom_alloc_aligned(wire_bytes, "wire");
    float *p = loom_alloc_aligned((size_t)sc->rows * (size_t)r * sizeof(float), "P");
    float *q = loom_alloc_aligned((size_t)sc->cols * (size_t)r * sizeof(float), "Q");
    double *times = calloc((size_t)reps, sizeof *times);
    double result = -1;
    if (x && out && wire && p && q && times) {
        for (size_t i = 0; i < n; i++) x[i] = (float)loom_rng_normal(3, 0, i) * 1e-3f;
        for (int k = 0; k <= reps; k++) { /* repetition 0 warms up */
            double t0 = loom_now();
            if (mc->method == LOOM_COMPRESS_POWERSGD && loom_compressor_compresses(c)) {
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
        qsort(times, (size_t)reps, sizeof *times, compare_doubles);
        result = times[reps / 2];
        *ratio = (double)(n * sizeof(float)) / (double)wire_bytes;
    }
    loom_free_aligned(x), loom_free_aligned(out), loom_free_aligned(wire);
    loom_free_aligned(p), loom_free_aligned(q);
    free(times);
    loom_compressor_free(c);
    return result;
}

int cmd_bench_compressors(int argc, char **argv) {
    (void)argc, (void)argv;
    static const method_case methods[] = {
        {"powersgd r1", LOOM_COMPRESS_POWERSGD, 1, 0},
        {"powersgd r4", LOOM_COMPRESS_POWERSGD, 4, 0},
        {"powersgd r8", LOOM_COMPRESS_POWERSGD, 8, 0},
        {"lowrank r8", LOOM_COMPRESS_LOWRANK, 8, 0},
        {"topk 1%", LOOM_COMPRESS_TOPK, 0, 0.01},
        {"sign", LOOM_COMPRESS_SIGN, 0, 0},
        {"int8", LOOM_COMPRESS_INT8, 0, 0},
        {"bf16", LOOM_COMPRESS_BF16, 0, 0},
    };
    static const shape_case shapes[] = {
        {"attn qkv 2304x768", 2304, 768},
        {"mlp fc 3072x768", 3072, 768},
        {"wte 50304x768", 50304, 768},
        {"pp grad 256x768", 256, 768}, /* micro batch 4 x seq 64 tokens, width 768 */
    };
    printf("compressor throughput: GB/s of fp32 input through encode + decode (one replica, "
           "%d threads), and input/wire size\n",
           loom_ops_get_threads());
    printf("%-12s", "method");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        printf(" | %21s", shapes[s].label);
    printf("\n");
    for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++) {
        printf("%-12s", methods[m].label);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int reps = shapes[s].rows * shapes[s].cols > 10000000 ? 3 : 9;
            double ratio = 0;
            double sec = time_one(&methods[m], &shapes[s], reps, &ratio);
            double gbs = sec > 0 ? (double)(shapes[s].rows * shapes[s].cols) * 4 / sec / 1e9 : 0;
            if (sec < 0) {
                printf(" | %21s", "failed");
            } else {
                printf(" | %7.2f GB/s %5.0fx", gbs, ratio);
            }
            fflush(stdout);
        }
        printf("\n");
    }
    return 0;
}
