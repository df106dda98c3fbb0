/*
 * test_qreduce.c — the quantised reduce-scatter and all-gather (compress/qreduce.c) on 1 to 4
 * ranks (under mpirun). Every rank can make every rank's inputs, so each checks its results
 * against references it computes itself:
 *   - the exact sum (in double) of every rank's block, within the quantisation bound worked out
 *     here from the format's definition (int8: half a level, max |x| / 254 over the scale block
 *     counted from the block's start, per contribution quantised; bf16: |x| 2^-8), the owner's
 *     own contribution exact;
 *   - bit for bit, the rank-order fp32 sum of the contributions as the compressors' public API
 *     encodes and decodes them (so the order, and that each contribution is quantised once, are
 *     pinned);
 *   - after the all-gather, the same bits on every rank (buffers gathered and compared), equal to
 *     the owner's sum requantised once;
 *   - equal, uneven and empty blocks, an all-empty buffer, two plans in flight at once;
 *   - error feedback: two calls with the same gradient leave a smaller error in their total than
 *     without, and the residual is what quantisation dropped (this rank's own block untouched);
 *   - the bytes on the wire, counted by the communicator, against the formula written here;
 *   - misuse refused before anything is sent.
 * Rank 0 prints the bytes of a larger call beside the fp32 ring's, for the record.
 */
#include "check.h"
#include "loom/comm.h"
#include "loom/compress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { SCALE_BLOCK = 16, MAX_RANKS = 8 };

static int rank, size;

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        loom_status check_st_ = (expr);                                                            \
        CHECK(check_st_ == LOOM_OK, "rank %d: %s", rank, loom_last_error());                       \
    } while (0)

/* Rank r's input at call `call`: normal draws whose size changes every 16 entries (so scale
 * blocks differ), with a run of zeros on rank 1. */
static float input(int r, int64_t i, int call) {
    if (r == 1 && i % 50 < 7) return 0.0f;
    double magnitude = 1.0 + 4.0 * (double)((i / SCALE_BLOCK) % 3);
    return (float)(loom_rng_normal(31, (uint64_t)(r + 16 * call), (uint64_t)i) * magnitude);
}

static void fill(float *buf, int r, int64_t n, int call) {
    for (int64_t i = 0; i < n; i++) buf[i] = input(r, i, call);
}

/* Block sizes by rank for the three layouts: equal, uneven with empty ones, all empty. */
static void make_bounds(int layout, int64_t *bounds) {
    static const int64_t uneven[4] = {0, 37, 1, 70};
    bounds[0] = 0;
    for (int r = 0; r < size; r++) {
        int64_t count = layout == 0 ? 48 : layout == 1 ? uneven[r % 4] : 0;
        bounds[r + 1] = bounds[r] + count;
    }
}

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

/* Wire bytes of one block of c entries, from the formats' definitions. */
static int64_t wire_of(loom_compress_method method, int64_t c) {
    if (c == 0) return 0;
    return method == LOOM_COMPRESS_INT8 ? c + 4 * ceil_div(c, SCALE_BLOCK) : 2 * c;
}

/* out = decode(encode(x)) through the compressors' public API (one 1 x c matrix). */
static void roundtrip(loom_compress_method method, const float *x, int64_t c, float *out) {
    if (c == 0) return;
    loom_compress_opts opts = {.method = method, .block = SCALE_BLOCK};
    loom_compressor *coder = NULL;
    CHECK_OK(loom_compressor_create(&coder, &opts, 1, c, 0));
    if (!coder) return;
    void *wire = malloc(loom_compressor_wire_bytes(coder));
    loom_compressor_encode(coder, x, wire);
    loom_compressor_decode(coder, wire, out);
    free(wire);
    loom_compressor_free(coder);
}

/* The largest error quantising x[i] may make, x being one block (scale blocks counted from its
 * start). */
static double quant_bound(loom_compress_method method, const float *x, int64_t c, int64_t i) {
    if (method == LOOM_COMPRESS_BF16) return fabs((double)x[i]) * ldexp(1.0, -8);
    int64_t start = i / SCALE_BLOCK * SCALE_BLOCK, end = start + SCALE_BLOCK;
    double max = 0;
    for (int64_t j = start; j < end && j < c; j++) max = fmax(max, fabs((double)x[j]));
    return max / 254.0 * (1 + 1e-6);
}

/* Every rank's whole buffer for one call. */
typedef struct {
    float *x[MAX_RANKS]; /* (size, n + 1) */
} inputs;

static void inputs_make(inputs *in, int64_t n, int call) {
    for (int r = 0; r < size; r++) {
        in->x[r] = malloc((size_t)(n + 1) * sizeof(float));
        fill(in->x[r], r, n, call);
    }
}

static void inputs_free(inputs *in) {
    for (int r = 0; r < size; r++) free(in->x[r]);
}

/* Checks this rank's block after a reduce-scatter of x (every rank's input; m: what each rank
 * quantised, x plus its residual) against the exact sum and the rank-order reference. */
static void check_sum(loom_compress_method method, const int64_t *bounds, float *const *x,
                      float *const *m, const float *got, const char *what) {
    int64_t start = bounds[rank], c = bounds[rank + 1] - start;
    if (c == 0) return;
    float *ref = calloc((size_t)c, sizeof(float)), *dec = malloc((size_t)c * sizeof(float));
    int exact_ok = 1, bits_ok = 1;
    for (int r = 0; r < size; r++) {
        if (r == rank) {
            memcpy(dec, x[r] + start, (size_t)c * sizeof(float));
        } else {
            roundtrip(method, m[r] + start, c, dec);
        }
        for (int64_t i = 0; i < c; i++) ref[i] = r == 0 ? dec[i] : ref[i] + dec[i];
    }
    for (int64_t i = 0; i < c; i++) {
        double exact = 0, bound = 0, magnitude = 0;
        for (int r = 0; r < size; r++) {
            exact += m[r][start + i];
            magnitude += fabs((double)m[r][start + i]);
            if (r != rank) bound += quant_bound(method, m[r] + start, c, i);
        }
        bound += 1e-6 * size * magnitude + 1e-30;
        if (fabs(got[i] - exact) > bound && exact_ok) {
            exact_ok = 0;
            CHECK(0, "rank %d %s: entry %lld of block: %.9g, exact sum %.9g, bound %.3g", rank,
                  what, (long long)i, got[i], exact, bound);
        }
        if (got[i] != ref[i] && bits_ok) {
            bits_ok = 0;
            CHECK(0, "rank %d %s: entry %lld: %.9g, rank-order sum of decoded contributions %.9g",
                  rank, what, (long long)i, got[i], ref[i]);
        }
    }
    CHECK(exact_ok, "rank %d %s: within the quantisation bound", rank, what);
    CHECK(bits_ok, "rank %d %s: the rank-order sum, bit for bit", rank, what);
    free(ref);
    free(dec);
}

/* Every rank's reduce-scatter result (the block it owns), computed here: rank-order sums of
 * decoded contributions, as check_sum pins them; then requantised once, as the all-gather must
 * leave every block. */
static void gathered_reference(loom_compress_method method, const int64_t *bounds, float *const *x,
                               float *out) {
    for (int o = 0; o < size; o++) {
        int64_t start = bounds[o], c = bounds[o + 1] - start;
        if (c == 0) continue;
        float *sum = out + start, *dec = malloc((size_t)c * sizeof(float));
        for (int r = 0; r < size; r++) {
            if (r == o) {
                memcpy(dec, x[r] + start, (size_t)c * sizeof(float));
            } else {
                roundtrip(method, x[r] + start, c, dec);
            }
            for (int64_t i = 0; i < c; i++) sum[i] = r == 0 ? dec[i] : sum[i] + dec[i];
        }
        roundtrip(method, sum, c, dec);
        memcpy(sum, dec, (size_t)c * sizeof(float));
        free(dec);
    }
}

/* Identical bits on every rank: the buffers gathered and compared with rank 0's. */
static void check_identical(loom_comm *world, const float *buf, int64_t n, const char *what) {
    if (n == 0) return;
    float *all = malloc((size_t)(n * size) * sizeof(float));
    CHECK_OK(loom_comm_allgather_f32(world, buf, all, n));
    int same = 1;
    for (int r = 1; r < size; r++) same &= memcmp(all, all + r * n, (size_t)n * sizeof(float)) == 0;
    CHECK(same, "rank %d %s: all-gathered buffers differ between ranks", rank, what);
    free(all);
}

static void run_layout(loom_comm *world, loom_compress_method method, int layout) {
    char what[64];
    snprintf(what, sizeof what, "%s layout %d", loom_compress_method_name(method), layout);
    int64_t bounds[MAX_RANKS + 1];
    make_bounds(layout, bounds);
    const int64_t n = bounds[size], own = bounds[rank + 1] - bounds[rank];
    loom_qreduce *q = NULL;
    CHECK_OK(loom_qreduce_create(world, bounds, method, SCALE_BLOCK, 5, &q));
    if (!q) return;
    inputs in = {{0}};
    inputs_make(&in, n, 0);
    float *buf = malloc((size_t)(n + 1) * sizeof(float));
    memcpy(buf, in.x[rank], (size_t)n * sizeof(float));

    /* the bytes this rank sends, from the formula */
    int64_t scatter_bytes = 0;
    for (int r = 0; r < size; r++)
        scatter_bytes += r == rank ? 0 : wire_of(method, bounds[r + 1] - bounds[r]);
    int64_t gather_bytes = (size - 1) * wire_of(method, own);

    loom_comm_reset_stats(world);
    CHECK_OK(loom_qreduce_reduce_scatter_start(q, buf, NULL));
    CHECK_OK(loom_qreduce_wait(q));
    loom_comm_stats stats = loom_comm_get_stats(world);
    CHECK(stats.bytes == scatter_bytes, "rank %d %s: reduce-scatter sent %lld bytes, formula %lld",
          rank, what, (long long)stats.bytes, (long long)scatter_bytes);
    CHECK(loom_qreduce_bytes_sent(q, LOOM_QREDUCE_REDUCE_SCATTER, rank) == scatter_bytes,
          "rank %d %s: bytes_sent reduce-scatter %lld, formula %lld", rank, what,
          (long long)loom_qreduce_bytes_sent(q, LOOM_QREDUCE_REDUCE_SCATTER, rank),
          (long long)scatter_bytes);
    check_sum(method, bounds, in.x, in.x, buf + bounds[rank], what);
    int others_kept = 1;
    for (int64_t i = 0; i < n; i++) {
        if (i < bounds[rank] || i >= bounds[rank + 1]) others_kept &= buf[i] == in.x[rank][i];
    }
    CHECK(others_kept, "rank %d %s: the blocks of other ranks left as they were", rank, what);

    loom_comm_reset_stats(world);
    CHECK_OK(loom_qreduce_allgather_start(q, buf));
    int done = 0;
    while (!done) CHECK_OK(loom_qreduce_test(q, &done));
    stats = loom_comm_get_stats(world);
    CHECK(stats.bytes == gather_bytes, "rank %d %s: all-gather sent %lld bytes, formula %lld", rank,
          what, (long long)stats.bytes, (long long)gather_bytes);
    CHECK(loom_qreduce_bytes_sent(q, LOOM_QREDUCE_ALLGATHER, rank) == gather_bytes,
          "rank %d %s: bytes_sent all-gather", rank, what);
    float *ref = malloc((size_t)(n + 1) * sizeof(float));
    gathered_reference(method, bounds, in.x, ref);
    CHECK(memcmp(buf, ref, (size_t)n * sizeof(float)) == 0,
          "rank %d %s: all-gathered buffer is not every owner's sum requantised once", rank, what);
    check_identical(world, buf, n, what);

    free(ref);
    free(buf);
    inputs_free(&in);
    loom_qreduce_free(q);
}

/* Sum of squared errors over this rank's block of the total of two calls, both with the same
 * input, against twice the exact sum; with or without error feedback. */
static double two_call_error(loom_comm *world, loom_compress_method method, int feedback) {
    int64_t bounds[MAX_RANKS + 1];
    make_bounds(0, bounds);
    const int64_t n = bounds[size], start = bounds[rank], own = bounds[rank + 1] - start;
    loom_qreduce *q = NULL;
    CHECK_OK(loom_qreduce_create(world, bounds, method, SCALE_BLOCK, 6, &q));
    if (!q) return 0;
    inputs in = {{0}};
    inputs_make(&in, n, 1);
    float *buf = malloc((size_t)n * sizeof(float)), *residual = calloc((size_t)n, sizeof(float));
    float *total = calloc((size_t)own, sizeof(float));
    /* this rank's own block of the residual must be neither read nor written */
    for (int64_t i = start; i < start + own; i++) residual[i] = 123.0f;
    float *m[MAX_RANKS], *e[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        m[r] = malloc((size_t)n * sizeof(float));
        e[r] = calloc((size_t)n, sizeof(float));
    }
    for (int call = 0; call < 2; call++) {
        /* what each rank quantises, and the residual it should keep, computed here */
        for (int r = 0; r < size; r++) {
            for (int64_t i = 0; i < n; i++) m[r][i] = in.x[r][i] + (feedback ? e[r][i] : 0.0f);
            for (int o = 0; o < size && feedback; o++) {
                int64_t s = bounds[o], c = bounds[o + 1] - s;
                if (o == r || c == 0) continue;
                roundtrip(method, m[r] + s, c, e[r] + s);
                for (int64_t i = s; i < s + c; i++) e[r][i] = m[r][i] - e[r][i];
            }
        }
        memcpy(buf, in.x[rank], (size_t)n * sizeof(float));
        CHECK_OK(loom_qreduce_reduce_scatter_start(q, buf, feedback ? residual : NULL));
        CHECK_OK(loom_qreduce_wait(q));
        char what[64];
        snprintf(what, sizeof what, "%s feedback %d call %d", loom_compress_method_name(method),
                 feedback, call);
        check_sum(method, bounds, in.x, m, buf + start, what);
        for (int64_t i = 0; i < own; i++) total[i] += buf[start + i];
        if (feedback) {
            int kept = 1, own_untouched = 1;
            for (int64_t i = 0; i < n; i++) {
                if (i >= start && i < start + own) {
                    own_untouched &= residual[i] == 123.0f;
                } else {
                    kept &= residual[i] == e[rank][i];
                }
            }
            CHECK(kept, "rank %d %s: the residual is what quantisation dropped", rank, what);
            CHECK(own_untouched, "rank %d %s: own block of the residual untouched", rank, what);
        }
    }
    double sq = 0;
    for (int64_t i = 0; i < own; i++) {
        double exact = 0;
        for (int r = 0; r < size; r++) exact += in.x[r][start + i];
        sq += (total[i] - 2 * exact) * (total[i] - 2 * exact);
    }
    CHECK_OK(loom_comm_allreduce_f64(world, &sq, 1, LOOM_REDUCE_SUM));
    for (int r = 0; r < size; r++) {
        free(m[r]);
        free(e[r]);
    }
    free(total);
    free(residual);
    free(buf);
    inputs_free(&in);
    loom_qreduce_free(q);
    return sq;
}

static void test_error_feedback(loom_comm *world, loom_compress_method method) {
    double without = two_call_error(world, method, 0), with = two_call_error(world, method, 1);
    if (size == 1) {
        CHECK(without == 0 && with == 0, "one rank: nothing quantised, %g %g", without, with);
        return;
    }
    /* without feedback the same rounding is made twice (4 e^2); with it the second call sends
     * the first one's loss back (about e^2) */
    CHECK(with < 0.5 * without,
          "rank %d %s: squared error of two calls with feedback %.4g, without %.4g", rank,
          loom_compress_method_name(method), with, without);
    if (rank == 0) {
        printf("%s: squared error of two calls' total: %.4g with error feedback, %.4g without\n",
               loom_compress_method_name(method), with, without);
    }
}

/* Two plans in flight at once (different tags), polled and finished in the opposite order. */
static void test_two_in_flight(loom_comm *world) {
    int64_t ba[MAX_RANKS + 1], bb[MAX_RANKS + 1];
    make_bounds(0, ba);
    make_bounds(1, bb);
    loom_qreduce *a = NULL, *b = NULL;
    CHECK_OK(loom_qreduce_create(world, ba, LOOM_COMPRESS_INT8, SCALE_BLOCK, 7, &a));
    CHECK_OK(loom_qreduce_create(world, bb, LOOM_COMPRESS_BF16, 0, 8, &b));
    if (!a || !b) return;
    inputs ia = {{0}}, ib = {{0}};
    inputs_make(&ia, ba[size], 2);
    inputs_make(&ib, bb[size], 3);
    float *bufa = malloc((size_t)ba[size] * sizeof(float));
    float *bufb = malloc((size_t)(bb[size] + 1) * sizeof(float));
    memcpy(bufa, ia.x[rank], (size_t)ba[size] * sizeof(float));
    memcpy(bufb, ib.x[rank], (size_t)bb[size] * sizeof(float));
    CHECK_OK(loom_qreduce_reduce_scatter_start(a, bufa, NULL));
    CHECK_OK(loom_qreduce_reduce_scatter_start(b, bufb, NULL));
    CHECK(loom_qreduce_reduce_scatter_start(a, bufa, NULL) == LOOM_ERR_RUNTIME &&
              strstr(loom_last_error(), "started again while running"),
          "rank %d: a second start on a running plan refused: %s", rank, loom_last_error());
    int done_b = 0;
    while (!done_b) CHECK_OK(loom_qreduce_test(b, &done_b));
    CHECK_OK(loom_qreduce_wait(a));
    check_sum(LOOM_COMPRESS_INT8, ba, ia.x, ia.x, bufa + ba[rank], "two in flight, int8");
    check_sum(LOOM_COMPRESS_BF16, bb, ib.x, ib.x, bufb + bb[rank], "two in flight, bf16");
    int done = 0;
    CHECK_OK(loom_qreduce_test(a, &done));
    CHECK(done, "rank %d: test on a finished plan says done", rank);
    free(bufa);
    free(bufb);
    inputs_free(&ia);
    inputs_free(&ib);
    loom_qreduce_free(a);
    loom_qreduce_free(b);
}

static void test_misuse(loom_comm *world) {
    int64_t bounds[MAX_RANKS + 1];
    make_bounds(0, bounds);
    loom_qreduce *q = NULL;
    CHECK(loom_qreduce_create(world, bounds, LOOM_COMPRESS_TOPK, 0, 1, &q) == LOOM_ERR_INPUT &&
              !q && strstr(loom_last_error(), "expected int8 or bf16, got topk"),
          "topk refused by name: %s", loom_last_error());
    CHECK(loom_qreduce_create(world, bounds, LOOM_COMPRESS_INT8, -1, 1, &q) == LOOM_ERR_INPUT,
          "negative block refused");
    CHECK(loom_qreduce_create(world, bounds, LOOM_COMPRESS_INT8, 0, LOOM_COMM_MAX_TAG + 1, &q) ==
              LOOM_ERR_INPUT,
          "tag out of range refused");
    bounds[size] = bounds[size - 1] - 1;
    CHECK(loom_qreduce_create(world, bounds, LOOM_COMPRESS_INT8, 0, 1, &q) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "block bounds must rise"),
          "falling bounds refused: %s", loom_last_error());
    make_bounds(0, bounds);
    CHECK_OK(loom_qreduce_create(world, bounds, LOOM_COMPRESS_INT8, 0, 1, &q));
    if (!q) return;
    CHECK(loom_qreduce_reduce_scatter_start(q, NULL, NULL) == LOOM_ERR_RUNTIME &&
              strstr(loom_last_error(), "no buffer"),
          "no buffer refused: %s", loom_last_error());
    CHECK_OK(loom_qreduce_wait(q)); /* not running: nothing to do */
    loom_qreduce_free(q);
}

/* A larger call's bytes per rank beside the fp32 ring reduce-scatter's, for the record. */
static void report_bytes(loom_comm *world) {
    const int64_t per_rank = 1 << 16;
    int64_t bounds[MAX_RANKS + 1];
    for (int r = 0; r <= size; r++) bounds[r] = r * per_rank;
    float *buf = malloc((size_t)bounds[size] * sizeof(float));
    fill(buf, rank, bounds[size], 4);
    loom_compress_method methods[2] = {LOOM_COMPRESS_INT8, LOOM_COMPRESS_BF16};
    for (int k = 0; k < 2; k++) {
        loom_qreduce *q = NULL;
        CHECK_OK(loom_qreduce_create(world, bounds, methods[k], 0, 9, &q));
        if (!q) continue;
        loom_comm_reset_stats(world);
        CHECK_OK(loom_qreduce_reduce_scatter_start(q, buf, NULL));
        CHECK_OK(loom_qreduce_wait(q));
        int64_t sent = loom_comm_get_stats(world).bytes;
        int64_t c = per_rank, expect = methods[k] == LOOM_COMPRESS_INT8
                                           ? (size - 1) * (c + 4 * ceil_div(c, 256))
                                           : (size - 1) * 2 * c;
        CHECK(sent == expect, "rank %d %s (block 256): %lld bytes sent, formula %lld", rank,
              loom_compress_method_name(methods[k]), (long long)sent, (long long)expect);
        int64_t ring = (size - 1) * per_rank * 4;
        if (rank == 0 && size > 1) {
            printf("%s reduce-scatter of %d x %lld floats: %lld bytes sent per rank, fp32 ring "
                   "%lld (%.4f)\n",
                   loom_compress_method_name(methods[k]), size, (long long)per_rank,
                   (long long)sent, (long long)ring, (double)sent / (double)ring);
        }
        loom_qreduce_free(q);
    }
    free(buf);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) return 1;
    rank = loom_comm_rank(world), size = loom_comm_size(world);
    if (size > MAX_RANKS) {
        fprintf(stderr, "at most %d ranks\n", MAX_RANKS);
        loom_comm_finalize(world);
        return 1;
    }
    loom_compress_method methods[2] = {LOOM_COMPRESS_INT8, LOOM_COMPRESS_BF16};
    for (int k = 0; k < 2; k++) {
        for (int layout = 0; layout < 3; layout++) run_layout(world, methods[k], layout);
        test_error_feedback(world, methods[k]);
    }
    test_two_in_flight(world);
    test_misuse(world);
    report_bytes(world);
    int bad = check_failed;
    int code = check_finish();
    double any = bad;
    loom_comm_allreduce_f64(world, &any, 1, LOOM_REDUCE_SUM);
    loom_comm_finalize(world);
    return any > 0 ? 1 : code;
}
