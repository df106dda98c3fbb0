/*
 * test_dp_compress.c — the distributed compressed data-parallel sum (parallel/dp_compress.c,
 * run over MPI by 2 or 3 ranks) equals a single-process simulation of the same arithmetic:
 * every rank also plays every replica in-process, with its own compressors, adding the
 * replicas' factors (PowerSGD) or decoded wires (the others) itself. Over three steps, so that
 * warm starts and error-feedback residuals carry over, with one step rolled back. Buckets hold
 * matrices that compress and ones that do not (1-D, too small), in two buckets.
 *
 * The gather methods sum the decoded wires in rank order on both sides: bit-identical. PowerSGD
 * sums factors with MPI's allreduce, whose order of additions is its own: within 1e-5. The
 * rolled-back step carries a NaN and an Inf from one replica: the next step must not see them.
 */
#include "check.h"
#include "loom/comm.h"
#include "loom/compress.h"
#include "parallel/parallel_internal.h"

#include <stdlib.h>
#include <string.h>

enum { MATRICES = 5, STEPS = 3, MAX_REPLICAS = 4 };
static const int64_t shape[MATRICES][2] = {{32, 24}, {1, 50}, {4, 4}, {64, 8}, {16, 40}};

static int rank, size;

/* The gradient replica r holds at step s: smooth plus noise, different on every replica. */
static void gradient(float *g, size_t n, int r, int s) {
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)(loom_rng_normal(77, (uint64_t)(100 * s + r), i) * 0.1 +
                       0.05 * (double)((i * 7) % 13) / 13.0);
    }
}

static size_t total_floats(size_t *offset) {
    size_t n = 0;
    for (int i = 0; i < MATRICES; i++) {
        offset[i] = n;
        n += (size_t)(shape[i][0] * shape[i][1]);
    }
    return n;
}

/* Two buckets, from the top of the buffer down as grad_sync makes them: {3, 4} and {0, 1, 2}. */
static void make_buckets(loom_grad_bucket *b, loom_grad_matrix *m, const size_t *offset, size_t n) {
    for (int i = 0; i < MATRICES; i++) {
        m[i] = (loom_grad_matrix){offset[i], shape[i][0], shape[i][1], i, -1, 0};
    }
    b[0] = (loom_grad_bucket){offset[3], n, &m[3], 2};
    b[1] = (loom_grad_bucket){0, offset[3], &m[0], 3};
}

/* One replica's compressors in the simulation: the same streams as dp_compress.c gives them
 * (tensor << 32 | layer + 1). */
static void simulate_step(loom_compressor *c[MAX_REPLICAS][MATRICES], const size_t *offset,
                          float *grads[MAX_REPLICAS], float *sum, const loom_compress_opts *o) {
    size_t n = offset[MATRICES - 1] + (size_t)(shape[MATRICES - 1][0] * shape[MATRICES - 1][1]);
    memset(sum, 0, n * sizeof(float));
    for (int i = 0; i < MATRICES; i++) {
        int64_t rows = shape[i][0], cols = shape[i][1];
        size_t len = (size_t)(rows * cols);
        if (o->method == LOOM_COMPRESS_POWERSGD && loom_compressor_compresses(c[0][i])) {
            int r = o->rank;
            float *p = calloc((size_t)rows * (size_t)r, sizeof *p);
            float *q = calloc((size_t)cols * (size_t)r, sizeof *q);
            float *part = malloc((size_t)(rows > cols ? rows : cols) * (size_t)r * sizeof *part);
            for (int k = 0; k < size; k++) {
                loom_powersgd_p(c[k][i], grads[k] + offset[i], part);
                for (int64_t j = 0; j < rows * r; j++) p[j] += part[j];
            }
            float *p_k = malloc((size_t)rows * (size_t)r * sizeof *p_k);
            for (int k = 0; k < size; k++) {
                memcpy(p_k, p, (size_t)rows * (size_t)r * sizeof *p_k);
                loom_powersgd_q(c[k][i], grads[k] + offset[i], p_k, part);
                for (int64_t j = 0; j < cols * r; j++) q[j] += part[j];
            }
            /* p_k: the orthonormalised P, the same for every replica */
            for (int k = 0; k < size; k++) {
                loom_powersgd_done(c[k][i], grads[k] + offset[i], p_k, q, size);
            }
            memcpy(sum + offset[i], grads[0] + offset[i], len * sizeof(float));
            free(p), free(q), free(part), free(p_k);
        } else if (o->method == LOOM_COMPRESS_POWERSGD) {
            for (int k = 0; k < size; k++)
                for (size_t j = 0; j < len; j++) sum[offset[i] + j] += grads[k][offset[i] + j];
        } else {
            unsigned char *wire[MAX_REPLICAS];
            for (int k = 0; k < size; k++) {
                wire[k] = malloc(loom_compressor_wire_bytes(c[k][i]));
                loom_compressor_encode(c[k][i], grads[k] + offset[i], wire[k]);
            }
            for (int k = 0; k < size; k++) {
                loom_compressor_decode_add(c[0][i], wire[k], sum + offset[i]);
                free(wire[k]);
            }
        }
    }
}

static void run_method(loom_comm *world, loom_compress_opts opts) {
    size_t offset[MATRICES];
    size_t n = total_floats(offset);
    loom_grad_matrix m[MATRICES];
    loom_grad_bucket buckets[2];
    make_buckets(buckets, m, offset, n);
    loom_dp_compress *dc = NULL;
    loom_status st = loom_dp_compress_create(&dc, &opts, buckets, 2, size, -1);
    CHECK(st == LOOM_OK, "create: %s", loom_last_error());
    if (st != LOOM_OK) return;
    loom_compressor *sim[MAX_REPLICAS][MATRICES];
    for (int k = 0; k < size; k++) {
        for (int i = 0; i < MATRICES; i++) {
            uint64_t stream = ((uint64_t)i << 32) | 0u;
            st = loom_compressor_create(&sim[k][i], &opts, shape[i][0], shape[i][1], stream);
            CHECK(st == LOOM_OK, "simulated compressor: %s", loom_last_error());
        }
    }
    float *mine = malloc(n * sizeof *mine), *expect = malloc(n * sizeof *expect);
    float *grads[MAX_REPLICAS];
    for (int k = 0; k < size; k++) grads[k] = malloc(n * sizeof(float));
    const char *name = loom_compress_method_name(opts.method);
    for (int s = 0; s < STEPS; s++) {
        gradient(mine, n, rank, s);
        for (int k = 0; k < size; k++) gradient(grads[k], n, k, s);
        if (s == 1) { /* replica 0's gradient is not finite: the step is rolled back below */
            if (rank == 0) mine[1] = NAN, mine[offset[3] + 5] = INFINITY;
            grads[0][1] = NAN, grads[0][offset[3] + 5] = INFINITY;
        }
        for (int b = 0; b < 2; b++) {
            loom_comm_request *request = NULL;
            st = loom_dp_compress_start(dc, b, mine, world, &request);
            while (st == LOOM_OK && request) {
                st = loom_comm_wait(request);
                if (st == LOOM_OK) st = loom_dp_compress_next(dc, b, mine, world, &request);
            }
            CHECK(st == LOOM_OK, "%s step %d bucket %d: %s", name, s, b, loom_last_error());
        }
        simulate_step(sim, offset, grads, expect, &opts);
        double worst = 0.0, scale = 0.0;
        int same = 1;
        for (size_t j = 0; j < n; j++) {
            double d = (double)mine[j] - (double)expect[j];
            if (d < 0) d = -d;
            if (d > worst) worst = d;
            if (expect[j] > scale || -expect[j] > scale)
                scale = expect[j] > 0 ? expect[j] : -expect[j];
            same &= memcmp(&mine[j], &expect[j], sizeof(float)) == 0;
        }
        int finite = 1;
        for (size_t j = 0; j < n; j++) finite &= isfinite(mine[j]) != 0;
        if (s == 1) {
            /* nothing to compare; what matters is that step 2 no longer sees it */
        } else if (!finite) {
            CHECK(0, "%s rank %d step %d: not finite after a rolled-back non-finite step", name,
                  rank, s);
        } else if (opts.method == LOOM_COMPRESS_POWERSGD) {
            CHECK(worst <= 1e-5 * scale + 1e-7, "%s rank %d step %d: differs by %g (scale %g)",
                  name, rank, s, worst, scale);
        } else {
            CHECK(same, "%s rank %d step %d: not bit-identical (worst %g)", name, rank, s, worst);
        }
        /* step 1 is rolled back on both sides: step 2 must continue from step 0's state */
        int accept = s != 1;
        loom_dp_compress_commit(dc, accept);
        for (int k = 0; k < size; k++)
            for (int i = 0; i < MATRICES; i++) loom_compressor_commit(sim[k][i], accept);
    }
    loom_compress_stats stats = {0};
    loom_dp_compress_take_stats(dc, &stats);
    CHECK(stats.dp_bytes_saved > 0, "%s: saved %lld bytes", name, (long long)stats.dp_bytes_saved);
    for (int k = 0; k < size; k++) {
        free(grads[k]);
        for (int i = 0; i < MATRICES; i++) loom_compressor_free(sim[k][i]);
    }
    free(mine), free(expect);
    loom_dp_compress_free(dc);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) return 1;
    rank = loom_comm_rank(world), size = loom_comm_size(world);
    if (size > MAX_REPLICAS) {
        fprintf(stderr, "at most %d ranks\n", MAX_REPLICAS);
        loom_comm_finalize(world);
        return 1;
    }
    loom_compress_opts base = {.error_feedback = 1, .seed = 9};
    loom_compress_opts powersgd = base, topk = base, sign = base, int8 = base, bf16 = base;
    powersgd.method = LOOM_COMPRESS_POWERSGD, powersgd.rank = 2;
    topk.method = LOOM_COMPRESS_TOPK, topk.fraction = 0.1;
    sign.method = LOOM_COMPRESS_SIGN;
    int8.method = LOOM_COMPRESS_INT8, int8.block = 16;
    bf16.method = LOOM_COMPRESS_BF16;
    loom_compress_opts all[] = {powersgd, topk, sign, int8, bf16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) run_method(world, all[i]);
    loom_compress_opts no_feedback = powersgd;
    no_feedback.error_feedback = 0;
    run_method(world, no_feedback);
    int bad = check_failed;
    int code = check_finish();
    double any = bad;
    loom_comm_allreduce_f64(world, &any, 1, LOOM_REDUCE_SUM);
    loom_comm_finalize(world);
    return any > 0 ? 1 : code;
}
