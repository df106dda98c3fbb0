/*
 * profile.c — `loom profile`'s measurements of the hosts and the device, and the run that puts
 * every phase together (loom/profile.h): which ranks share a host, the memory each rank can
 * have, the sgemm peak, a STREAM triad's bandwidth, the GEMM efficiency of a GPT-2 block's
 * shapes, and the compressors' throughput; the links are profile_links.c's.
 *
 * Every phase runs on all ranks at once (a barrier starts it), each rank measures what it
 * sees with the others busy beside it, and the figures are gathered to every rank; rank 0's
 * assembly is then broadcast, so that every rank returns the same bits. A phase that fails on
 * one rank fails on all (profile_agree) rather than leaving the others waiting.
 *
 * Not here: the links (profile_links.c), the arithmetic of fits and tables (profile_fit.c),
 * writing the file (cluster.c).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_ISSET */
#include "loom/ops.h"
#include "loom/plan.h" /* the compressors' default ranks, measured as training runs them */
#include "cluster/profile_internal.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- helpers every phase uses ------------------------------------------------------------ */

void profile_say(const profile_ctx *ctx, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char note[300];
    snprintf(note, sizeof note, "profile: %.280s", line);
    loom_comm_progress(note);
    if (ctx->rank == 0 && ctx->opts.verbose) {
        loom_info("profile [%6.1f s] %s", loom_now() - ctx->started, line);
    }
}

loom_status profile_agree(const profile_ctx *ctx, loom_status status, const char *what) {
    /* [0]: the worst status, [1]: the lowest failing rank, as size - rank under MAX */
    double flags[2] = {(double)status, status != LOOM_OK ? (double)(ctx->size - ctx->rank) : 0};
    loom_status st = loom_comm_allreduce_f64(ctx->world, flags, 2, LOOM_REDUCE_MAX);
    if (st != LOOM_OK) return st;
    if (flags[0] == LOOM_OK) return LOOM_OK;
    if (status != LOOM_OK) return status; /* the failing rank keeps its own message */
    return loom_fail(LOOM_ERR_RUNTIME, "profile: %s failed on rank %d", what,
                     ctx->size - (int)flags[1]);
}

loom_status profile_gather(const profile_ctx *ctx, const double *mine, int k, double *all) {
    memset(all, 0, (size_t)ctx->size * (size_t)k * sizeof *all);
    memcpy(all + (size_t)ctx->rank * (size_t)k, mine, (size_t)k * sizeof *all);
    return loom_comm_allreduce_f64(ctx->world, all, (int64_t)ctx->size * k, LOOM_REDUCE_SUM);
}

/* Gathers one figure of every rank (< 0: not measured there) and returns the median, the
 * lowest and the highest of the measured ones in out[0..2]. */
static loom_status gather_median(const profile_ctx *ctx, double mine, double out[3]) {
    double *all = loom_malloc((size_t)ctx->size * sizeof *all, "profile figures");
    if (!all) return LOOM_ERR_NOMEM;
    loom_status st = profile_gather(ctx, &mine, 1, all);
    if (st == LOOM_OK) {
        out[0] = profile_median(all, ctx->size); /* sorts: the measured ones come last */
        out[1] = out[2] = out[0];
        for (int i = 0; i < ctx->size; i++) {
            if (all[i] < 0) continue;
            out[1] = fmin(out[1], all[i]);
            out[2] = fmax(out[2], all[i]);
        }
    }
    free(all);
    return st;
}

/* ---- hosts ------------------------------------------------------------------------------- */

/* "model name" of /proc/cpuinfo ("" when there is none). */
static void cpu_model(char *model, size_t cap) {
    model[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *value = strchr(line, ':');
        if (!value) continue;
        value++;
        while (*value == ' ' || *value == '\t') value++;
        snprintf(model, cap, "%.*s", (int)strcspn(value, "\n"), value);
        break;
    }
    if (f) fclose(f);
}

/* Keeps printable ASCII, so that a name cut short never ends inside a UTF-8 sequence (the
 * cluster file's names must be UTF-8). */
static void printable(char *text) {
    for (unsigned char *c = (unsigned char *)text; *c; c++) {
        if (*c < 0x20 || *c > 0x7e) *c = '?';
    }
}

/* This rank's CPUs (its affinity: where mpirun binds ranks, their cores), as a bit set of
 * `bytes` bytes; all the machine's online CPUs when the affinity cannot be read. */
static void cpu_mask(unsigned char *mask, size_t bytes) {
    memset(mask, 0, bytes);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) {
        for (size_t c = 0; c < bytes * 8 && c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) mask[c / 8] |= (unsigned char)(1u << (c % 8));
        return;
    }
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < (online > 0 ? online : 1) && (size_t)c < bytes * 8; c++)
        mask[c / 8] |= (unsigned char)(1u << (c % 8));
}

/* Who measures the device (ctx->measured_by, `measures`, `core_scale`; profile_core_plan),
 * from every rank's real host (names, name_bytes each; not --pretend-hosts: CPUs are the
 * machine's) and CPU affinity (masks, mask_bytes each). */
static loom_status find_cores(profile_ctx *ctx, const char *names, size_t name_bytes,
                              const unsigned char *masks, size_t mask_bytes) {
    int threads = loom_ops_get_threads() > 0 ? loom_ops_get_threads() : 1;
    ctx->measured_by = loom_calloc((size_t)ctx->size, 1, "measuring ranks");
    int *host = loom_calloc((size_t)ctx->size, sizeof *host, "hosts");
    if (!ctx->measured_by || !host) {
        free(host);
        return LOOM_ERR_NOMEM;
    }
    for (int r = 0; r < ctx->size; r++) {
        while (strcmp(names + (size_t)host[r] * name_bytes, names + (size_t)r * name_bytes) != 0)
            host[r]++; /* the first rank with the same name */
    }
    ctx->core_scale = profile_core_plan(ctx->size, host, masks, mask_bytes, threads,
                                        ctx->measured_by, &ctx->min_cores);
    free(host);
    ctx->measuring = 0;
    for (int r = 0; r < ctx->size; r++) ctx->measuring += ctx->measured_by[r];
    ctx->measures = ctx->measured_by[ctx->rank];
    return LOOM_OK;
}

/* Every rank's host name, by one broadcast per rank (names are bytes, and a profile has few
 * enough ranks that this costs nothing beside the measurements); ranks with equal names share
 * a host. */
static loom_status find_hosts(profile_ctx *ctx, loom_cluster *out) {
    enum { NAME = 256, MASK = 128 };
    char *names = loom_calloc((size_t)ctx->size, NAME, "host names");
    unsigned char *masks = loom_calloc((size_t)ctx->size, MASK, "CPU masks");
    ctx->host_of = loom_calloc((size_t)ctx->size, sizeof(int), "hosts");
    ctx->host_ranks = loom_calloc((size_t)ctx->size, sizeof(int), "hosts");
    loom_status st = names && masks && ctx->host_of && ctx->host_ranks ? LOOM_OK : LOOM_ERR_NOMEM;
    if (st == LOOM_OK) st = loom_comm_host_name(names + (size_t)ctx->rank * NAME, NAME);
    if (st == LOOM_OK) cpu_mask(masks + (size_t)ctx->rank * MASK, MASK);
    st = profile_agree(ctx, st, "finding the host name");
    for (int r = 0; r < ctx->size && st == LOOM_OK; r++) {
        st = loom_comm_broadcast(ctx->world, names + (size_t)r * NAME, NAME, r);
        if (st == LOOM_OK) st = loom_comm_broadcast(ctx->world, masks + (size_t)r * MASK, MASK, r);
    }
    if (st != LOOM_OK) {
        free(names), free(masks);
        return st;
    }
    st = find_cores(ctx, names, NAME, masks, MASK);
    free(masks);
    st = profile_agree(ctx, st, "finding the cores");
    if (st != LOOM_OK) {
        free(names);
        return st;
    }
    ctx->hosts = 0;
    for (int r = 0; r < ctx->size; r++) {
        int h = 0;
        while (h < r && strcmp(names + (size_t)h * NAME, names + (size_t)r * NAME) != 0) h++;
        ctx->host_of[r] = h == r ? ctx->hosts++ : ctx->host_of[h];
    }
    int pretend = ctx->opts.pretend_hosts;
    if (pretend > 0) {
        ctx->hosts = pretend;
        for (int r = 0; r < ctx->size; r++)
            ctx->host_of[r] = (int)((int64_t)r * pretend / ctx->size);
    }
    memset(ctx->host_ranks, 0, (size_t)ctx->size * sizeof(int));
    for (int r = 0; r < ctx->size; r++) ctx->host_ranks[ctx->host_of[r]]++;
    out->nodes = out->max_nodes = ctx->hosts;
    out->devices_per_node = 0;
    for (int h = 0; h < ctx->hosts; h++) {
        if (ctx->host_ranks[h] > out->devices_per_node) out->devices_per_node = ctx->host_ranks[h];
    }
    snprintf(out->name, sizeof out->name, "%.40s%s", names, ctx->hosts > 1 ? " and more" : "");
    char model[128];
    cpu_model(model, sizeof model);
    int threads = loom_ops_get_threads();
    snprintf(out->device_name, sizeof out->device_name, "%.40s, %d thread%s",
             model[0] ? model : "CPU", threads, threads == 1 ? "" : "s");
    printable(out->name), printable(out->device_name);
    profile_say(ctx, "hosts: %d rank%s on %d host%s%s (%s%s), at most %d on one; device %s",
                ctx->size, ctx->size == 1 ? "" : "s", ctx->hosts, ctx->hosts == 1 ? "" : "s",
                pretend > 0 ? " (pretended)" : "", names, ctx->hosts > 1 ? " and others" : "",
                out->devices_per_node, out->device_name);
    if (ctx->core_scale < 1.0) {
        profile_say(ctx,
                    "cores: more threads than CPUs (a rank's CPUs: %d at the fewest): %d "
                    "rank%s measure the device, the others wait; its figures are scaled by "
                    "%.3f, the share of the CPUs each rank gets when all of them train",
                    ctx->min_cores, ctx->measuring, ctx->measuring == 1 ? "" : "s",
                    ctx->core_scale);
    }
    free(names);
    return LOOM_OK;
}

/* The smallest share of memory any rank gets: its host's available memory over its ranks. */
static loom_status measure_memory(const profile_ctx *ctx, int64_t available, loom_cluster *out) {
    double share =
        available > 0 ? (double)available / ctx->host_ranks[ctx->host_of[ctx->rank]] : -1;
    double found[3];
    loom_status st = gather_median(ctx, share, found);
    if (st != LOOM_OK) return st;
    if (!(found[1] > 0)) {
        return loom_fail(LOOM_ERR_RUNTIME, "profile: cannot find the available memory "
                                           "(/proc/meminfo)");
    }
    out->memory_bytes = (int64_t)found[1];
    profile_say(ctx,
                "memory: %.2f GiB per rank (available memory / ranks on the host; the "
                "smallest share)",
                (double)out->memory_bytes / 1073741824.0);
    return LOOM_OK;
}

/* ---- the device ---------------------------------------------------------------------------- */

/* STREAM's triad, a = b + s c, over arrays far larger than the caches; bytes counted as
 * STREAM counts them (three arrays of doubles per pass). */
static loom_status measure_bandwidth(const profile_ctx *ctx, loom_cluster *out) {
    const int64_t n = ctx->opts.quick ? (int64_t)4 << 20 : (int64_t)8 << 20; /* 32, 64 MiB */
    const int reps = ctx->opts.quick ? 5 : 20;
    profile_say(ctx,
                "memory bandwidth: STREAM triad over 3 x %lld MiB, median of %d, on every "
                "rank at once",
                (long long)(n * 8 >> 20), reps);
    double *a = loom_alloc_aligned((size_t)n * sizeof(double), "triad a");
    double *b = loom_alloc_aligned((size_t)n * sizeof(double), "triad b");
    double *c = loom_alloc_aligned((size_t)n * sizeof(double), "triad c");
    loom_status st = profile_agree(ctx, a && b && c ? LOOM_OK : LOOM_ERR_NOMEM, "the triad");
    double times[20], bandwidth = 0;
    if (st == LOOM_OK) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) a[i] = 0, b[i] = 1, c[i] = 2; /* placed by its threads */
        st = loom_comm_barrier(ctx->world);
    }
    if (st == LOOM_OK) {
        for (int r = 0; r < reps; r++) {
            double t0 = loom_now();
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
            times[r] = loom_now() - t0;
        }
        bandwidth = 3.0 * (double)n * sizeof(double) / profile_median(times, reps);
        if (a[n - 1] != 7.0) st = loom_fail(LOOM_ERR_RUNTIME, "profile: the triad went wrong");
        st = profile_agree(ctx, st, "the triad");
    }
    loom_free_aligned(a), loom_free_aligned(b), loom_free_aligned(c);
    double found[3];
    if (st == LOOM_OK) st = gather_median(ctx, bandwidth, found);
    if (st != LOOM_OK) return st;
    out->memory_bandwidth = found[0];
    profile_say(ctx, "memory bandwidth: %.2f GB/s per rank (median; ranks %.2f to %.2f)",
                found[0] / 1e9, found[1] / 1e9, found[2] / 1e9);
    return LOOM_OK;
}

/* ---- GEMM efficiency --------------------------------------------------------------------- */

/* A linear layer of a GPT-2 block: out (N, OC) = in (N, C) W^T (model/gpt.c, block_forward). */
typedef struct {
    int64_t N;
    int C, OC;
} gemm_shape;

enum { GEMM_KERNELS = 3 }; /* forward, input gradient, weight gradient */

typedef struct {
    float *x, *w, *b, *y, *dx, *dw, *db; /* the largest shape's buffers */
} gemm_buffers;

/* The block's four layers (qkv, attention projection, fc, fc projection) for every width and
 * row count, into shapes; returns how many, and the most rows and the widest width. */
static int block_shapes(int quick, gemm_shape *shapes, int64_t *max_rows, int *max_width) {
    static const int widths_full[] = {64, 128, 256, 768}, widths_quick[] = {64, 256, 768};
    static const int64_t rows_full[] = {64, 512, 2048}, rows_quick[] = {64, 512};
    const int *widths = quick ? widths_quick : widths_full;
    const int64_t *rows = quick ? rows_quick : rows_full;
    int nw = quick ? 3 : 4, nr = quick ? 2 : 3, count = 0;
    *max_rows = rows[nr - 1], *max_width = widths[nw - 1];
    for (int w = 0; w < nw; w++) {
        for (int r = 0; r < nr; r++) {
            int d = widths[w];
            shapes[count++] = (gemm_shape){rows[r], d, 3 * d};
            shapes[count++] = (gemm_shape){rows[r], d, d};
            shapes[count++] = (gemm_shape){rows[r], d, 4 * d};
            shapes[count++] = (gemm_shape){rows[r], 4 * d, d};
        }
    }
    return count;
}

/* Seconds of one call of `kernel` on `shape`, `reps` times into times (each timing of enough
 * calls to last about `target_s`, estimated from the peak), after one warm-up. */
static void time_gemm(const loom_backend *be, const gemm_buffers *g, gemm_shape s, int kernel,
                      int reps, double target_s, double peak, double *times) {
    double flops = 2.0 * (double)s.N * s.C * s.OC;
    int calls = (int)fmin(fmax(target_s * peak / flops, 1), 1000);
    for (int r = -1; r < reps; r++) { /* r = -1 warms up */
        double t0 = loom_now();
        for (int i = 0; i < calls; i++) {
            if (kernel == 0) be->matmul_forward(g->y, g->x, g->w, g->b, s.N, s.C, s.OC);
            if (kernel == 1) be->matmul_backward_input(g->dx, g->y, g->w, s.N, s.C, s.OC);
            if (kernel == 2) be->matmul_backward_weight(g->dw, g->db, g->y, g->x, s.N, s.C, s.OC);
        }
        if (r >= 0) times[r] = (loom_now() - t0) / calls;
        loom_comm_progress(NULL); /* a long pass makes no comm call for the watchdog to see */
    }
}

/* Buffers for every shape of widths up to d (layers up to d x 4d) and up to max_rows rows. */
static loom_status alloc_gemm(gemm_buffers *g, int64_t max_rows, int d) {
    size_t act = (size_t)max_rows * 4 * (size_t)d, weight = 4 * (size_t)d * (size_t)d;
    g->x = loom_alloc_aligned(act * sizeof(float), "GEMM input");
    g->y = loom_alloc_aligned(act * sizeof(float), "GEMM output");
    g->dx = loom_alloc_aligned(act * sizeof(float), "GEMM input gradient");
    g->w = loom_alloc_aligned(weight * sizeof(float), "GEMM weight");
    g->dw = loom_alloc_aligned(weight * sizeof(float), "GEMM weight gradient");
    g->b = loom_alloc_aligned(4 * (size_t)d * sizeof(float), "GEMM bias");
    g->db = loom_alloc_aligned(4 * (size_t)d * sizeof(float), "GEMM bias gradient");
    if (!g->x || !g->y || !g->dx || !g->w || !g->dw || !g->b || !g->db) return LOOM_ERR_NOMEM;
    /* small values: gradients accumulate over thousands of calls without growing large */
    for (size_t i = 0; i < act; i++) g->x[i] = (float)((i * 7) % 13) * 1e-3f;
    for (size_t i = 0; i < weight; i++) g->w[i] = (float)((i * 5) % 11) * 1e-3f;
    return LOOM_OK;
}

static void free_gemm(gemm_buffers *g) {
    loom_free_aligned(g->x), loom_free_aligned(g->y), loom_free_aligned(g->dx);
    loom_free_aligned(g->w), loom_free_aligned(g->dw);
    loom_free_aligned(g->b), loom_free_aligned(g->db);
}

/* How the peak and the GEMM table are measured. */
typedef struct {
    gemm_shape shapes[64];
    int nshapes;
    int64_t max_rows;
    int max_width;
    int passes;      /* over the peak and every shape */
    int reps;        /* timings of each (shape, kernel) per pass */
    double target_s; /* each timing lasts about this long (several calls of a small GEMM) */
    int peak_n;      /* the square GEMM of the peak */
    int peak_reps;   /* its timings per pass */
} gemm_plan;

static gemm_plan make_gemm_plan(int quick) {
    gemm_plan plan = {.passes = quick ? 2 : 5,
                      .reps = 2,
                      .target_s = quick ? 1e-3 : 3e-3,
                      .peak_n = quick ? 1024 : 2048,
                      .peak_reps = 3};
    plan.nshapes = block_shapes(quick, plan.shapes, &plan.max_rows, &plan.max_width);
    return plan;
}

/* One pass on this rank: the peak (GFLOP/s, the median of the pass's timings), then every
 * (shape, kernel), its timings into times (npoints x passes x reps, this pass's slots). */
static loom_status gemm_pass(const profile_ctx *ctx, const gemm_plan *plan, const gemm_buffers *g,
                             int pass, double *peak_gflops, double *times) {
    loom_status st = loom_comm_barrier(ctx->world);
    if (st != LOOM_OK) return st;
    *peak_gflops = loom_ops_sgemm_peak_gflops(plan->peak_n, plan->peak_reps);
    st = profile_agree(ctx, *peak_gflops > 0 ? LOOM_OK : LOOM_ERR_NOMEM, "the sgemm peak");
    const loom_backend *be = loom_backend_cpu();
    const int timings = plan->passes * plan->reps;
    for (int s = 0; s < plan->nshapes && st == LOOM_OK; s++) {
        if (s % 4 == 0) st = loom_comm_barrier(ctx->world); /* the ranks side by side */
        for (int k = 0; k < GEMM_KERNELS; k++) {
            double *t = times + (size_t)(s * GEMM_KERNELS + k) * timings + pass * plan->reps;
            time_gemm(be, g, plan->shapes[s], k, plan->reps, plan->target_s, *peak_gflops * 1e9, t);
        }
    }
    return st;
}

/* From every rank's times (npoints x timings): each point's median on each rank, then the
 * median over the ranks, gives its rate. (The measuring ranks have a core each: where ranks
 * would share cores, measure_device lets a core's worth of them measure and scales the result.)
 * The peak is the square GEMM's `square_peak` or
 * the fastest point's rate if that is higher (when the ranks contend for memory, the square GEMM,
 * whose matrices outgrow the shared cache, can be slower than a block's smaller ones): each
 * efficiency is then its rate over the peak, at most 1, and peak x efficiency is the rate
 * measured. */
static loom_status gemm_table(const profile_ctx *ctx, const gemm_plan *plan, double *times,
                              double square_peak, loom_cluster *out) {
    const int npoints = plan->nshapes * GEMM_KERNELS, timings = plan->passes * plan->reps;
    double *mine = loom_calloc((size_t)npoints, sizeof *mine, "GEMM times");
    double *all = loom_calloc((size_t)npoints * (size_t)ctx->size, sizeof *all, "GEMM times");
    double *column = loom_calloc((size_t)ctx->size, sizeof *column, "GEMM times");
    loom_gemm_point *points = loom_calloc((size_t)npoints, sizeof *points, "GEMM points");
    loom_status st = profile_agree(ctx, mine && all && column && points ? LOOM_OK : LOOM_ERR_NOMEM,
                                   "the GEMM table");
    for (int p = 0; p < npoints && st == LOOM_OK; p++) {
        mine[p] = profile_median(times + (size_t)p * timings, timings);
    }
    if (st == LOOM_OK) st = profile_gather(ctx, mine, npoints, all);
    double peak = square_peak, best = 0;
    for (int p = 0; p < npoints && st == LOOM_OK; p++) {
        for (int r = 0; r < ctx->size; r++) column[r] = all[(size_t)r * npoints + p];
        gemm_shape s = plan->shapes[p / GEMM_KERNELS];
        points[p].flops = 2.0 * (double)s.N * s.C * s.OC;
        points[p].efficiency = points[p].flops / profile_median(column, ctx->size); /* rate */
        if (isfinite(points[p].efficiency)) best = fmax(best, points[p].efficiency);
    }
    if (st == LOOM_OK) {
        peak = fmax(peak, best);
        out->peak_flops[LOOM_PRECISION_FP32] = peak;
        out->training_precision = LOOM_PRECISION_FP32; /* the only one measured: what loom trains */
        for (int p = 0; p < npoints; p++) points[p].efficiency /= peak;
        profile_say(ctx,
                    "sgemm peak: %.1f GFLOP/s per rank (the square GEMM %.1f, the fastest block "
                    "GEMM %.1f: the higher)",
                    peak / 1e9, square_peak / 1e9, best / 1e9);
        out->gemm_points = profile_gemm_table(points, npoints, LOOM_CLUSTER_MAX_GEMM_POINTS);
        memcpy(out->gemm, points, (size_t)out->gemm_points * sizeof *points);
        if (out->gemm_points < 1) st = loom_fail(LOOM_ERR_RUNTIME, "profile: no GEMM point");
    }
    free(mine), free(all), free(column), free(points);
    return st;
}

/* The sgemm peak and the GEMM table, measured together in passes: each pass times the square
 * GEMM of the peak, then every (shape, kernel). A burst of other work on the machine then
 * slows a few timings of the peak and of each point alike, rather than all of one of them (a
 * peak measured apart, in a quiet or a busy moment, would put every efficiency too low or
 * above 1). The peak is the median of the passes' medians on each rank, then over the ranks. */
static loom_status measure_gemm(const profile_ctx *ctx, loom_cluster *out) {
    gemm_plan plan = make_gemm_plan(ctx->opts.quick);
    const int npoints = plan.nshapes * GEMM_KERNELS, timings = plan.passes * plan.reps;
    profile_say(ctx,
                "sgemm peak and GEMM efficiency: %d passes, each the peak (%d^3, median of %d) "
                "and %d shapes of a GPT-2 block x (forward, input gradient, weight gradient) x "
                "%d, on every rank at once",
                plan.passes, plan.peak_n, plan.peak_reps, plan.nshapes, plan.reps);
    gemm_buffers g = {0};
    double *times = loom_calloc((size_t)npoints * (size_t)timings, sizeof *times, "GEMM times");
    double peaks[8];
    loom_status st = times ? alloc_gemm(&g, plan.max_rows, plan.max_width) : LOOM_ERR_NOMEM;
    st = profile_agree(ctx, st, "allocating the GEMM buffers");
    for (int pass = 0; pass < plan.passes && st == LOOM_OK; pass++) {
        profile_say(ctx, "sgemm peak and GEMM efficiency: pass %d of %d", pass + 1, plan.passes);
        st = gemm_pass(ctx, &plan, &g, pass, &peaks[pass], times);
    }
    double found[3];
    if (st == LOOM_OK) st = gather_median(ctx, profile_median(peaks, plan.passes), found);
    if (st == LOOM_OK) {
        profile_say(ctx,
                    "sgemm peak: the square GEMM %.1f GFLOP/s per rank (median; ranks %.1f "
                    "to %.1f)",
                    found[0], found[1], found[2]);
        st = gemm_table(ctx, &plan, times, found[0] * 1e9, out);
    }
    if (st == LOOM_OK) {
        const loom_gemm_point *first = &out->gemm[0], *last = &out->gemm[out->gemm_points - 1];
        profile_say(ctx, "GEMM efficiency: %d points, %.2f at %.3g FLOPs to %.2f at %.3g FLOPs",
                    out->gemm_points, first->efficiency, first->flops, last->efficiency,
                    last->flops);
    }
    free_gemm(&g);
    free(times);
    return st;
}

/* ---- compressors ------------------------------------------------------------------------- */

/* Each method with the options training uses by default, on the shape of a GPT-2 124M MLP
 * weight (768 x 3072). */
/* AdamW's parameters per second: the CPU backend's update (the one loom trains with) over a range
 * much larger than the caches, on every rank at once. */
static loom_status measure_optimizer(const profile_ctx *ctx, loom_cluster *out) {
    const int64_t n = ctx->opts.quick ? (int64_t)1 << 20 : (int64_t)4 << 20;
    const int reps = ctx->opts.quick ? 3 : 9;
    profile_say(ctx, "optimizer: AdamW over %lld M parameters, median of %d, on every rank at once",
                (long long)(n >> 20), reps);
    float *p = loom_alloc_aligned((size_t)n * 4 * sizeof(float), "AdamW");
    loom_status st = profile_agree(ctx, p ? LOOM_OK : LOOM_ERR_NOMEM, "the AdamW buffers");
    double times[9], rate = 0;
    if (st == LOOM_OK) {
        for (int64_t i = 0; i < 4 * n; i++) p[i] = 1e-3f * (float)(i % 1000);
        st = loom_comm_barrier(ctx->world);
    }
    if (st == LOOM_OK) {
        const loom_backend *be = loom_backend_cpu();
        for (int r = 0; r < reps; r++) {
            double t0 = loom_now();
            be->adamw_update(p, p + n, p + 2 * n, p + 3 * n, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                             r + 1, 1.0f);
            times[r] = loom_now() - t0;
        }
        rate = (double)n / profile_median(times, reps);
    }
    loom_free_aligned(p);
    double found[3];
    if (st == LOOM_OK) st = gather_median(ctx, rate, found);
    if (st != LOOM_OK) return st;
    out->optimizer_params_per_s = found[0];
    profile_say(ctx, "optimizer: %.1f M parameters/s per rank (median; ranks %.1f to %.1f)",
                found[0] / 1e6, found[1] / 1e6, found[2] / 1e6);
    return LOOM_OK;
}

static loom_status measure_compressors(const profile_ctx *ctx, loom_cluster *out) {
    const int64_t rows = 768, cols = 3072;
    const int reps = ctx->opts.quick ? 3 : 9;
    profile_say(ctx,
                "compressors: encode + decode of %lld x %lld, median of %d, on every rank "
                "at once",
                (long long)rows, (long long)cols, reps);
    loom_status st = LOOM_OK;
    for (int m = LOOM_COMPRESS_NONE + 1; m < LOOM_COMPRESS_COUNT && st == LOOM_OK; m++) {
        loom_compress_opts o = {.method = (loom_compress_method)m,
                                .error_feedback = m != LOOM_COMPRESS_BF16,
                                .seed = 1};
        if (m == LOOM_COMPRESS_POWERSGD) o.rank = LOOM_PLAN_DEFAULT_DP_RANK;
        if (m == LOOM_COMPRESS_LOWRANK) o.rank = LOOM_PLAN_DEFAULT_PP_RANK;
        if (m == LOOM_COMPRESS_TOPK) o.fraction = LOOM_PLAN_DEFAULT_TOPK_FRACTION;
        st = loom_comm_barrier(ctx->world);
        double seconds = 0, ratio = 0, found[3];
        if (st == LOOM_OK) st = loom_compress_measure(&o, rows, cols, reps, &seconds, &ratio);
        st = profile_agree(ctx, st, "measuring a compressor");
        if (st == LOOM_OK) {
            double rate = seconds > 0 ? (double)(rows * cols) * sizeof(float) / seconds : -1;
            st = gather_median(ctx, rate, found);
        }
        if (st != LOOM_OK) break;
        out->compressor_bytes_per_s[m] = found[0] > 0 ? found[0] : 0;
        profile_say(ctx, "compressors: %-8s %8.2f GB/s (wire %.0fx smaller)",
                    loom_compress_method_name((loom_compress_method)m), found[0] / 1e9, ratio);
    }
    return st;
}

/* ---- the device, on the ranks that measure it ------------------------------------------ */

static loom_status measure_device_here(const profile_ctx *ctx, loom_cluster *out) {
    loom_status st = measure_bandwidth(ctx, out);
    if (st == LOOM_OK) st = measure_optimizer(ctx, out);
    if (st == LOOM_OK) st = measure_gemm(ctx, out);
    if (st == LOOM_OK) st = measure_compressors(ctx, out);
    return st;
}

enum { TAG_MEASURED = 7 };

/* A rank that does not measure waits for world rank 0's word that the measuring is over,
 * asleep between looks so that the measuring ranks have the cores to themselves. */
static loom_status wait_for_device(const profile_ctx *ctx) {
    int word = 0, done = 0;
    loom_comm_request *request = NULL;
    loom_status st = loom_comm_irecv(ctx->world, &word, sizeof word, 0, TAG_MEASURED, &request);
    const struct timespec nap = {0, 5 * 1000 * 1000};
    while (st == LOOM_OK && !done) {
        loom_comm_progress("profile: waiting while the other ranks measure the device");
        st = loom_comm_poll(request, &done);
        if (st == LOOM_OK && !done) nanosleep(&nap, NULL);
    }
    return st; /* how the measuring went, profile_agree says next */
}

/* The device's figures (memory bandwidth, AdamW, the GEMMs, the compressors). Every rank
 * measures, side by side as they will train, unless a host has more ranks x threads than
 * cores: then a core's worth of ranks per host measure (a timing of a few milliseconds among
 * more runnable ranks than cores is a core alone's rate or a share, by chance), the others
 * sleep, and the figures are scaled by the share each rank gets when all train (find_cores). */
static loom_status measure_device(const profile_ctx *ctx, loom_cluster *out) {
    if (ctx->core_scale >= 1.0) return measure_device_here(ctx, out);
    loom_comm *measuring = NULL;
    loom_status st = loom_comm_split(ctx->world, ctx->measures ? 0 : -1, ctx->rank,
                                     "the ranks measuring the device", &measuring);
    if (st != LOOM_OK) return st;
    if (ctx->measures) {
        profile_ctx here = *ctx;
        here.world = measuring;
        here.rank = loom_comm_rank(measuring), here.size = loom_comm_size(measuring);
        st = measure_device_here(&here, out);
        loom_comm_free(measuring);
        int word = 1; /* the word to everyone waiting; then all agree and get the figures */
        for (int r = 1; r < ctx->size && ctx->rank == 0; r++) {
            if (ctx->measured_by[r]) continue;
            loom_status sent = loom_comm_send(ctx->world, &word, sizeof word, r, TAG_MEASURED);
            if (st == LOOM_OK) st = sent;
        }
    } else {
        st = wait_for_device(ctx);
    }
    st = profile_agree(ctx, st, "measuring the device");
    if (st == LOOM_OK) st = loom_comm_broadcast(ctx->world, out, (int64_t)sizeof *out, 0);
    if (st != LOOM_OK) return st;
    out->memory_bandwidth *= ctx->core_scale;
    out->optimizer_params_per_s *= ctx->core_scale;
    for (int p = 0; p < LOOM_PRECISIONS; p++) out->peak_flops[p] *= ctx->core_scale;
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) out->compressor_bytes_per_s[m] *= ctx->core_scale;
    profile_say(ctx,
                "cores: scaled by %.3f: sgemm peak %.1f GFLOP/s, memory bandwidth %.2f GB/s, "
                "AdamW %.1f M parameters/s per rank",
                ctx->core_scale, out->peak_flops[LOOM_PRECISION_FP32] / 1e9,
                out->memory_bandwidth / 1e9, out->optimizer_params_per_s / 1e6);
    return LOOM_OK;
}

/* ---- the run ----------------------------------------------------------------------------- */

static loom_status check_opts(const loom_comm *world, const loom_profile_opts *opts) {
    int size = loom_comm_size(world);
    if (size < 2) {
        return loom_fail(LOOM_ERR_INPUT,
                         "loom profile measures the links between ranks: run it under mpirun on "
                         "the ranks that will train (at least 2), e.g. mpirun -np 2 loom profile "
                         "--out cluster.json");
    }
    if (opts->threads < 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--threads: expected >= 0 (0 = as the environment "
                         "gives), got %d",
                         opts->threads);
    }
    if (opts->pretend_hosts < 0 || opts->pretend_hosts > size) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--pretend-hosts: expected 0 (the host names) to %d "
                         "(the ranks), got %d",
                         size, opts->pretend_hosts);
    }
    return LOOM_OK;
}

loom_status loom_profile_run(loom_comm *world, const loom_profile_opts *opts, loom_cluster *out,
                             double *core_scale) {
    memset(out, 0, sizeof *out);
    if (core_scale) *core_scale = 1.0;
    loom_status st = check_opts(world, opts);
    if (st != LOOM_OK) return st;
    int64_t available = loom_memory_available(); /* before this profile takes any */
    profile_ctx ctx = {.world = world,
                       .opts = *opts,
                       .rank = loom_comm_rank(world),
                       .size = loom_comm_size(world),
                       .started = loom_now()};
    loom_ops_set_threads(opts->threads);
    profile_say(&ctx, "%d ranks, %d thread%s each, %s", ctx.size, loom_ops_get_threads(),
                loom_ops_get_threads() == 1 ? "" : "s",
                opts->quick ? "quick (fewer, smaller repetitions)" : "full");
    st = find_hosts(&ctx, out);
    if (st == LOOM_OK) st = measure_memory(&ctx, available, out);
    if (st == LOOM_OK) st = measure_device(&ctx, out);
    if (st == LOOM_OK) st = profile_measure_links(&ctx, out);
    /* rank 0's assembly for everyone: the same bits on every rank */
    if (st == LOOM_OK) st = loom_comm_broadcast(world, out, (int64_t)sizeof *out, 0);
    if (st == LOOM_OK) profile_say(&ctx, "done in %.1f s", loom_now() - ctx.started);
    if (st == LOOM_OK && core_scale) *core_scale = ctx.core_scale;
    free(ctx.host_of), free(ctx.host_ranks), free(ctx.measured_by);
    if (st != LOOM_OK) memset(out, 0, sizeof *out);
    return st;
}

void loom_profile_source_note(const loom_cluster *cluster, double core_scale, char *note,
                              size_t cap) {
    const char *copied = "";
    char cores[160] = "";
    if (core_scale < 1.0) {
        snprintf(cores, sizeof cores,
                 "; more ranks x threads than cores: the device's figures measured by a core's "
                 "worth of ranks alone and scaled by %.3f, the share each rank trains with",
                 core_scale);
    }
    if (cluster->nodes == 1) {
        copied = "; one host: inter_node is a copy of intra_node (nothing measured between hosts)";
    } else if (cluster->devices_per_node == 1) {
        copied = "; one rank per host: intra_node is a copy of inter_node";
    }
    snprintf(note, cap,
             "loom profile on %d host%s x %d rank%s (%s), %s; peak: the faster of a large square "
             "sgemm and the fastest GPT-2 block GEMM, the efficiencies the block GEMMs' share of "
             "it%s%s",
             cluster->nodes, cluster->nodes == 1 ? "" : "s", cluster->devices_per_node,
             cluster->devices_per_node == 1 ? "" : "s", cluster->device_name,
             core_scale < 1.0 ? "the links measured by every rank at once"
                              : "every rank measuring at once (shared caches and memory included)",
             cores, copied);
}
