/*
 * bench_compress.c — `loom bench --compressors`: throughput of every compressor on GPT-2 124M's
 * matrix shapes, in GB/s of fp32 input (encode plus decode of one replica, no communication),
 * and the wire size against the input, so that a planner can cost compression. The timing is
 * loom_compress_measure's (compress/measure.c), which `loom profile` uses too.
 *
 * Not here: the bytes a run sends (metrics.jsonl), time on slow links (bench/compression.sh).
 */
#include "cli/cli.h"
#include "loom/compress.h"
#include "loom/ops.h"

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

/* Seconds of one encode + decode (median of `reps`), or < 0 on failure. */
static double time_one(const method_case *mc, const shape_case *sc, int reps, double *ratio) {
    loom_compress_opts o = {.method = mc->method,
                            .rank = mc->rank,
                            .fraction = mc->fraction,
                            .error_feedback = mc->method != LOOM_COMPRESS_BF16,
                            .seed = 1};
    double seconds = 0;
    if (loom_compress_measure(&o, sc->rows, sc->cols, reps, &seconds, ratio) != LOOM_OK) return -1;
    return seconds;
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
