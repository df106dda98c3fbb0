/*
 * bench.c — `loom bench`: step time, tokens/s, achieved GFLOP/s and MFU of full training
 * steps (forward, backward, grad norm, AdamW) on synthetic tokens, against the sgemm peak
 * that the same command measures, with the share of step time spent in each kernel.
 *
 * Model FLOPs per token = 6 x parameters + 6 x layers x width x sequence (the standard count;
 * no recomputation). Medians over the timed steps, after warm-up.
 */
#include "cli/cli.h"
#include "loom/model.h"
#include "loom/ops.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int steps, warmup;
    char threads[64];
    char cases[64];
} bench_args;

#define BOPT(...) CLI_OPT(bench_args, __VA_ARGS__)

static const cli_opt bench_opts[] = {
    CLI_GROUP("run"),
    CLI_OPT_MAY_BE_EMPTY(bench_args, "--cases", cases,
                         "comma-separated: a (gpt2 124M, B4 T64), b (L4 C256 NH4 V50257, B4 "
                         "T64), s (small preset, B8 T128), l (a Llama of gpt2's size: L12 C768 "
                         "NH12 KV4 F2048, B4 T64); empty: none, the peak alone"),
    BOPT("--threads", OPT_STRING, threads, "comma-separated thread counts"),
    BOPT("--steps", OPT_INT, steps, "timed steps per case (median reported)"),
    BOPT("--warmup", OPT_INT, warmup, "untimed steps first"),
};
#define NBENCH ((int)(sizeof bench_opts / sizeof bench_opts[0]))

typedef struct {
    char key;
    const char *label;
    loom_gpt_config config;
    int B, T;
} bench_case;

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static loom_status run_case(const bench_case *bc, int threads, int steps, int warmup, double peak) {
    loom_gpt *m;
    loom_status st = loom_gpt_create(&m, &bc->config, loom_backend_cpu());
    if (st != LOOM_OK) return st;
    loom_gpt_init_weights(m, 1);
    size_t n = m->num_params;
    float *mom = loom_alloc_aligned(n * sizeof(float), "m");
    float *vel = loom_alloc_aligned(n * sizeof(float), "v");
    int32_t *inputs = loom_calloc((size_t)bc->B * bc->T, sizeof(int32_t), "inputs");
    int32_t *targets = loom_calloc((size_t)bc->B * bc->T, sizeof(int32_t), "targets");
    double *times = loom_calloc((size_t)steps, sizeof(double), "times");
    if (!mom || !vel || !inputs || !targets || !times || loom_gpt_reserve(m, bc->B, bc->T)) {
        st = LOOM_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < bc->B * bc->T; i++) {
        inputs[i] = (int32_t)(loom_rng_u64(2, 0, (uint64_t)i) % (uint64_t)bc->config.vocab_size);
        targets[i] = (int32_t)(loom_rng_u64(2, 1, (uint64_t)i) % (uint64_t)bc->config.vocab_size);
    }
    const loom_backend *be = m->backend;
    double kernel_total[LOOM_KERNEL_COUNT] = {0};
    for (int s = 0; s < warmup + steps; s++) {
        int timed = s >= warmup;
        loom_ops_profile_reset();
        loom_ops_profile_enable(timed);
        double t0 = loom_now();
        loom_gpt_zero_grad(m);
        loom_gpt_forward(m, inputs, targets, bc->B, bc->T);
        loom_gpt_backward(m, 1.0f / (float)(bc->B * bc->T));
        double norm = be->sum_squares(m->grads_memory, (int64_t)n);
        (void)norm;
        for (int i = 0; i < m->num_segments; i++) {
            const loom_gpt_segment *seg = &m->segments[i];
            be->adamw_update(m->params_memory + seg->offset, m->grads_memory + seg->offset,
                             mom + seg->offset, vel + seg->offset, seg->numel, 1e-4f, 0.9f, 0.95f,
                             1e-8f, seg->decay ? 0.1f : 0.0f, s + 1, 1.0f);
        }
        double dt = loom_now() - t0;
        loom_ops_profile_enable(0);
        if (timed) {
            times[s - warmup] = dt;
            double k[LOOM_KERNEL_COUNT];
            loom_ops_profile_read(k);
            for (int i = 0; i < LOOM_KERNEL_COUNT; i++) kernel_total[i] += k[i];
        }
    }
    double total = 0.0;
    for (int i = 0; i < steps; i++) total += times[i];
    qsort(times, (size_t)steps, sizeof times[0], compare_doubles);
    double median = times[steps / 2];
    double tokens = (double)bc->B * bc->T;
    double flops = loom_gpt_flops_per_token(&m->config, bc->T) * tokens;
    double gflops = flops / median / 1e9;
    printf("%-44s threads %d | %8.1f ms/step | %8.0f tok/s | %6.1f GFLOP/s | peak %6.1f | "
           "MFU %5.1f%%\n",
           bc->label, threads, median * 1e3, tokens / median, gflops, peak, 100 * gflops / peak);
    printf("    step time by kernel:");
    double accounted = 0.0;
    for (int i = 0; i < LOOM_KERNEL_COUNT; i++) {
        accounted += kernel_total[i];
        if (kernel_total[i] / total >= 0.001) {
            printf(" %s %.1f%%", loom_ops_kernel_name(i), 100 * kernel_total[i] / total);
        }
    }
    printf(" | outside kernels %.1f%%\n", 100 * (total - accounted) / total);
    printf("    non-GEMM share: %.1f%% (everything except matmul and attention)\n",
           100 * (total - kernel_total[LOOM_KERNEL_MATMUL] - kernel_total[LOOM_KERNEL_ATTENTION]) /
               total);
    fflush(stdout);
done:
    loom_free_aligned(mom), loom_free_aligned(vel);
    free(inputs), free(targets), free(times);
    loom_gpt_free(m);
    return st;
}

/* At most this many entries: the --threads text holds 63 characters. */
enum { MAX_THREAD_COUNTS = 32 };

/* --threads "1,2": each entry through the checked integer parser, and at least 1. */
static loom_status parse_thread_counts(const char *list, int counts[MAX_THREAD_COUNTS],
                                       int *count) {
    static const cli_opt entry_opt = {"--threads", OPT_INT, 0, sizeof(int), NULL, 0};
    char copy[64];
    snprintf(copy, sizeof copy, "%s", list);
    *count = 0;
    for (char *entry = strtok(copy, ","); entry; entry = strtok(NULL, ",")) {
        int threads = 0;
        loom_status st = cli_set_value(&threads, &entry_opt, entry, "--threads");
        if (st != LOOM_OK) return st;
        if (threads < 1) {
            return loom_fail(LOOM_ERR_INPUT, "--threads: expected counts >= 1, got %d", threads);
        }
        if (*count == MAX_THREAD_COUNTS) {
            return loom_fail(LOOM_ERR_INPUT, "--threads: expected at most %d counts in '%s'",
                             MAX_THREAD_COUNTS, list);
        }
        counts[(*count)++] = threads;
    }
    if (*count == 0) {
        return loom_fail(LOOM_ERR_INPUT, "--threads: expected thread counts such as 1,2, got '%s'",
                         list);
    }
    return LOOM_OK;
}

int cmd_bench(int argc, char **argv) {
    if (cli_find_flag(argc, argv, "--train") >= 0) return cmd_bench_train(argc, argv);
    if (cli_find_flag(argc, argv, "--compressors") >= 0) return cmd_bench_compressors(argc, argv);
    bench_args args = {.steps = 10, .warmup = 2};
    snprintf(args.threads, sizeof args.threads, "1,2");
    snprintf(args.cases, sizeof args.cases, "a,b");
    if (cli_find_flag(argc, argv, "--help") >= 0) {
        cli_print_help("usage: loom bench [--cases a,b] [--threads 1,2] [--steps 10]\n"
                       "       [mpirun -np N] loom bench --train [--warmup 2] [loom train flags: "
                       "--model --data-parallel --tensor-parallel --pipeline-parallel ...]\n"
                       "       (training steps of a parallel layout on synthetic tokens; gpt2, "
                       "micro 4, seq 64, global 8, 12 steps by default)\n"
                       "       loom bench --compressors (every compressor's GB/s on gpt2 shapes)",
                       bench_opts, NBENCH, &args);
        return 0;
    }
    loom_status st = cli_parse_flags(&args, bench_opts, NBENCH, argc, argv, 2, NULL);
    if (st == LOOM_OK && args.steps < 1) {
        st = loom_fail(LOOM_ERR_INPUT, "--steps: expected >= 1, got %d", args.steps);
    }
    if (st == LOOM_OK && args.warmup < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--warmup: expected >= 0, got %d", args.warmup);
    }
    int thread_counts[MAX_THREAD_COUNTS], nthreads = 0;
    if (st == LOOM_OK) st = parse_thread_counts(args.threads, thread_counts, &nthreads);
    if (st != LOOM_OK) return cli_fail(st);

    bench_case cases[] = {
        {'a', "(a) gpt2 124M, micro batch 4, seq 64", {0}, 4, 64},
        {'b', "(b) L4 C256 NH4 V50257, micro batch 4, seq 64", {0}, 4, 64},
        {'s', "(s) small preset, micro batch 8, seq 128", {0}, 8, 128},
        {'l', "(l) llama L12 C768 NH12/KV4 F2048, micro 4, seq 64", {0}, 4, 64},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    loom_gpt_preset("gpt2", &cases[0].config);
    cases[1].config = (loom_gpt_config){.max_seq_len = 1024,
                                        .vocab_size = 50257,
                                        .padded_vocab_size = 0,
                                        .num_layers = 4,
                                        .num_heads = 4,
                                        .channels = 256};
    loom_gpt_preset("small", &cases[2].config);
    /* a Llama of GPT-2 124M's size: its width, depth and vocabulary, 4 kv heads, SwiGLU 2048 */
    loom_gpt_overrides llama = {.arch = "llama",
                                .layers = 12,
                                .heads = 12,
                                .d_model = 768,
                                .context = 1024,
                                .vocab = 50257,
                                .kv_heads = 4,
                                .ffn_dim = 2048};
    st = loom_gpt_config_resolve_with(&llama, "bench case l", &cases[3].config);
    if (st != LOOM_OK) return cli_fail(st);

    for (int t = 0; t < nthreads; t++) {
        int threads = thread_counts[t];
        loom_ops_set_threads(threads);
        double peak = loom_ops_sgemm_peak_gflops(2048, 5);
        printf("threads %d: OpenBLAS sgemm 2048^3 peak %.1f GFLOP/s (measured)\n", threads, peak);
        for (int c = 0; c < ncases; c++) {
            if (!strchr(args.cases, cases[c].key)) continue;
            st = run_case(&cases[c], threads, args.steps, args.warmup, peak);
            if (st != LOOM_OK) return cli_fail(st);
        }
    }
    return 0;
}
