/*
 * test_compress.c — every compressor against an independent reference, in one process: replicas
 * are simulated by summing their factors here, the way an allreduce would.
 *
 * PowerSGD and lowrank recover exact rank-r matrices and match a double-precision power step
 * (Gram-Schmidt instead of LAPACK's Householder QR: the same subspaces, so the same P P^T);
 * top-k against a full sort; int8, bf16 and sign against their formulas and handcrafted bit
 * patterns; wire sizes against the header's formulas; error feedback over 50 steps; commit and
 * rollback; parse/check messages word for word; zero and tiny matrices.
 *
 * Not here: moving the bytes between ranks (parallel/, comm/), where compression applies (plan/).
 */
#include "check.h"
#include "loom/base.h"
#include "loom/compress.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static float *falloc(int64_t n) {
    return xcalloc((size_t)n, sizeof(float));
}

static void fill_normal(float *x, int64_t n, uint64_t stream) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)loom_rng_normal(1234, stream, (uint64_t)i);
}

static loom_compress_opts opts_of(loom_compress_method method, int rank, double fraction, int ef) {
    loom_compress_opts o = {0};
    o.method = method, o.rank = rank, o.fraction = fraction, o.error_feedback = ef, o.seed = 99;
    return o;
}

static loom_compressor *make(const loom_compress_opts *o, int64_t rows, int64_t cols,
                             uint64_t stream) {
    loom_compressor *c = NULL;
    loom_status st = loom_compressor_create(&c, o, rows, cols, stream);
    if (st != LOOM_OK) {
        fprintf(stderr, "create %s %lldx%lld: %s\n", loom_compress_method_name(o->method),
                (long long)rows, (long long)cols, loom_last_error());
        exit(1);
    }
    return c;
}

static int has_nan(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return 1;
    }
    return 0;
}

/* max |a - b| over max |b| */
static double rel_diff(const float *a, const double *b, int64_t n) {
    double diff = 0, size = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        size = fmax(size, fabs(b[i]));
    }
    return diff / size;
}

static double rel_diff_f(const float *a, const float *b, int64_t n) {
    double *bd = xcalloc((size_t)n, sizeof(double));
    for (int64_t i = 0; i < n; i++) bd[i] = b[i];
    double d = rel_diff(a, bd, n);
    free(bd);
    return d;
}

/* x (rows x cols) = a (rows x r) b^T (b: cols x r), in double. */
static void outer(double *x, const float *a, const float *b, int64_t rows, int64_t cols, int r) {
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) {
            double s = 0;
            for (int t = 0; t < r; t++) s += (double)a[i * r + t] * b[j * r + t];
            x[i * cols + j] = s;
        }
    }
}

/* ---- names, parsing, checks ---------------------------------------------------------------- */

static void expect_error(loom_status st, const char *want, const char *what) {
    CHECK(st == LOOM_ERR_INPUT, "%s: status %d", what, (int)st);
    CHECK(strcmp(loom_last_error(), want) == 0, "%s: got '%s', want '%s'", what, loom_last_error(),
          want);
}

static void test_parse_and_check(void) {
    static const char *const names[] = {"none", "powersgd", "lowrank", "topk",
                                        "sign", "int8",     "bf16"};
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) {
        CHECK(strcmp(loom_compress_method_name((loom_compress_method)m), names[m]) == 0, "%d", m);
        CHECK(loom_compress_is_lossy((loom_compress_method)m) == (m != 0), "lossy %d", m);
    }
    CHECK(strcmp(loom_compress_method_name(LOOM_COMPRESS_COUNT), "?") == 0, "out of range");

    loom_compress_method m = LOOM_COMPRESS_NONE;
    CHECK(loom_compress_method_parse("powersgd", LOOM_COMPRESS_FOR_DP, "p", "f", &m) == LOOM_OK &&
              m == LOOM_COMPRESS_POWERSGD,
          "powersgd for dp");
    CHECK(loom_compress_method_parse("lowrank", LOOM_COMPRESS_FOR_PP_GRAD, "p", "f", &m) ==
                  LOOM_OK &&
              m == LOOM_COMPRESS_LOWRANK,
          "lowrank for pp");
    CHECK(loom_compress_method_parse("bf16", LOOM_COMPRESS_FOR_PP_FORWARD, "p", "f", &m) ==
                  LOOM_OK &&
              m == LOOM_COMPRESS_BF16,
          "bf16 forward");
    expect_error(loom_compress_method_parse("lowrank", LOOM_COMPRESS_FOR_DP, "plan.json",
                                            "compression.dp.method", &m),
                 "plan.json: compression.dp.method: expected one of none, powersgd, topk, sign, "
                 "int8, bf16, got \"lowrank\"",
                 "lowrank for dp");
    expect_error(
        loom_compress_method_parse("powersgd", LOOM_COMPRESS_FOR_PP_GRAD, "cli", "--pp-comp", &m),
        "cli: --pp-comp: expected one of none, lowrank, topk, int8, bf16, got \"powersgd\"",
        "powersgd for pp");
    expect_error(loom_compress_method_parse("topk", LOOM_COMPRESS_FOR_PP_FORWARD, "a", "b", &m),
                 "a: b: expected one of none, int8, bf16, got \"topk\"", "topk forward");
    expect_error(loom_compress_method_parse("PowerSGD", LOOM_COMPRESS_FOR_DP, "a", "b", &m),
                 "a: b: expected one of none, powersgd, topk, sign, int8, bf16, got \"PowerSGD\"",
                 "unknown");

    loom_compress_opts o = opts_of(LOOM_COMPRESS_SIGN, 0, 0, 0);
    expect_error(loom_compress_check(&o, "flags"),
                 "flags: sign compression needs error feedback (it does not converge without "
                 "it); drop --no-error-feedback",
                 "sign without ef");
    o = opts_of(LOOM_COMPRESS_POWERSGD, 0, 0, 1);
    expect_error(loom_compress_check(&o, "plan.json: compression.dp"),
                 "plan.json: compression.dp: rank: expected > 0 for powersgd, got 0", "rank 0");
    o = opts_of(LOOM_COMPRESS_LOWRANK, -2, 0, 1);
    CHECK(loom_compress_check(&o, "s") == LOOM_ERR_INPUT, "lowrank rank -2");
    double fractions[] = {0, -0.1, 1.5, NAN};
    for (int i = 0; i < 4; i++) {
        o = opts_of(LOOM_COMPRESS_TOPK, 0, fractions[i], 1);
        CHECK(loom_compress_check(&o, "src") == LOOM_ERR_INPUT, "fraction %g", fractions[i]);
        CHECK(strncmp(loom_last_error(), "src: fraction:", 14) == 0, "%s", loom_last_error());
    }
    o = opts_of(LOOM_COMPRESS_TOPK, 0, 1.0, 0);
    CHECK(loom_compress_check(&o, "s") == LOOM_OK, "fraction 1");
    o = opts_of(LOOM_COMPRESS_POWERSGD, 2, 0, 1);
    o.min_ratio = -1;
    CHECK(loom_compress_check(&o, "s") == LOOM_ERR_INPUT, "min_ratio -1");
    o = opts_of(LOOM_COMPRESS_INT8, 0, 0, 1);
    o.block = -1;
    CHECK(loom_compress_check(&o, "s") == LOOM_ERR_INPUT, "block -1");
    o = opts_of(LOOM_COMPRESS_NONE, 0, 0, 0);
    CHECK(loom_compress_check(&o, "s") == LOOM_OK, "none");
    loom_compressor *c = NULL;
    CHECK(loom_compressor_create(&c, &o, 0, 5, 0) == LOOM_ERR_INPUT && !c, "0 rows");
}

/* ---- wire sizes and what is compressed ------------------------------------------------------ */

static void test_wire_sizes(void) {
    static const int64_t shapes[][2] = {{1, 1},    {3, 5},    {7, 9},  {16, 16},
                                        {1, 1000}, {33, 257}, {100, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        loom_compress_opts o = opts_of(LOOM_COMPRESS_TOPK, 0, 0.3, 1);
        loom_compressor *c = make(&o, rows, cols, 0);
        int64_t k = (int64_t)ceil(0.3 * (double)n);
        CHECK(loom_compressor_wire_bytes(c) == (size_t)(8 * (k < 1 ? 1 : k)), "topk %lld",
              (long long)n);
        loom_compressor_free(c);
        o = opts_of(LOOM_COMPRESS_SIGN, 0, 0, 1);
        c = make(&o, rows, cols, 0);
        CHECK(loom_compressor_wire_bytes(c) == (size_t)(4 + (n + 7) / 8), "sign %lld",
              (long long)n);
        loom_compressor_free(c);
        int blocks[] = {0, 10, 64};
        for (int b = 0; b < 3; b++) {
            o = opts_of(LOOM_COMPRESS_INT8, 0, 0, 1);
            o.block = blocks[b];
            int64_t block = blocks[b] ? blocks[b] : 256;
            c = make(&o, rows, cols, 0);
            CHECK(loom_compressor_wire_bytes(c) == (size_t)(4 * ((n + block - 1) / block) + n),
                  "int8 %lld block %lld", (long long)n, (long long)block);
            loom_compressor_free(c);
        }
        o = opts_of(LOOM_COMPRESS_BF16, 0, 0, 0);
        c = make(&o, rows, cols, 0);
        CHECK(loom_compressor_wire_bytes(c) == (size_t)(2 * n), "bf16");
        loom_compressor_free(c);
        o = opts_of(LOOM_COMPRESS_NONE, 0, 0, 0);
        c = make(&o, rows, cols, 0);
        CHECK(loom_compressor_wire_bytes(c) == (size_t)(4 * n) && !loom_compressor_compresses(c),
              "none");
        CHECK(loom_compressor_state_count(c) == 0, "none keeps no state");
        loom_compressor_free(c);
        for (int method = LOOM_COMPRESS_POWERSGD; method <= LOOM_COMPRESS_LOWRANK; method++) {
            o = opts_of((loom_compress_method)method, 2, 0, 1);
            c = make(&o, rows, cols, 0);
            int pays = rows > 1 && cols > 1 && 2.0 * (double)(rows + cols) < 0.5 * (double)n;
            CHECK(loom_compressor_compresses(c) == pays, "%s %lldx%lld",
                  loom_compress_method_name((loom_compress_method)method), (long long)rows,
                  (long long)cols);
            size_t want = pays ? (size_t)(4 * 2 * (rows + cols)) : (size_t)(4 * n);
            CHECK(loom_compressor_wire_bytes(c) == want, "low rank wire %lldx%lld", (long long)rows,
                  (long long)cols);
            CHECK(loom_compressor_rank(c) == (pays ? 2 : 0), "rank");
            if (!pays) CHECK(loom_compressor_state_count(c) == 0, "uncompressed: no state");
            loom_compressor_free(c);
        }
    }
    /* 0.07 of 100 is 7 entries, though 0.07 * 100 is 7.000000000000001 in double */
    loom_compress_opts o = opts_of(LOOM_COMPRESS_TOPK, 0, 0.07, 0);
    loom_compressor *c = make(&o, 10, 10, 0);
    CHECK(loom_compressor_wire_bytes(c) == 56, "0.07 of 100: %zu", loom_compressor_wire_bytes(c));
    loom_compressor_free(c);
}

/* ---- top-k ------------------------------------------------------------------------------- */

static const float *sort_values;

/* larger magnitude first, then lower index */
static int by_magnitude(const void *pa, const void *pb) {
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    float ma = fabsf(sort_values[a]), mb = fabsf(sort_values[b]);
    if (ma != mb) return ma > mb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int by_index(const void *pa, const void *pb) {
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return a < b ? -1 : a > b;
}

/* The wire of topk against a full sort of x; decode + residual is x bit for bit. */
static void check_topk_case(const float *x, int64_t rows, int64_t cols, double fraction,
                            const char *what) {
    int64_t n = rows * cols;
    loom_compress_opts o = opts_of(LOOM_COMPRESS_TOPK, 0, fraction, 1);
    loom_compressor *c = make(&o, rows, cols, 0);
    size_t bytes = loom_compressor_wire_bytes(c);
    int64_t k = (int64_t)bytes / 8;
    unsigned char *wire = xcalloc(bytes, 1);
    loom_compressor_encode(c, x, wire);

    uint32_t *order = xcalloc((size_t)n, sizeof *order);
    for (int64_t i = 0; i < n; i++) order[i] = (uint32_t)i;
    sort_values = x;
    qsort(order, (size_t)n, sizeof *order, by_magnitude);
    qsort(order, (size_t)k, sizeof *order, by_index);
    int same = 1;
    for (int64_t j = 0; j < k && same; j++) {
        float v;
        uint32_t index;
        memcpy(&v, wire + 4 * j, 4);
        memcpy(&index, wire + 4 * k + 4 * j, 4);
        same = index == order[j] && memcmp(&v, &x[index], 4) == 0;
    }
    CHECK(same, "%s: the k = %lld largest magnitudes", what, (long long)k);

    float *out = falloc(n);
    loom_compressor_decode(c, wire, out);
    loom_compressor_commit(c, 1);
    const float *res = loom_compressor_state_data(c, 0);
    int exact = 1;
    for (int64_t i = 0; i < n; i++) {
        float sum = out[i] + res[i];
        exact &= memcmp(&sum, &x[i], 4) == 0;
    }
    CHECK(exact, "%s: sent + residual == input bit for bit", what);
    free(out);
    free(order);
    free(wire);
    loom_compressor_free(c);
}

static void test_topk(void) {
    int64_t rows = 37, cols = 53, n = rows * cols;
    float *x = falloc(n);
    fill_normal(x, n, 1);
    check_topk_case(x, rows, cols, 0.05, "random");
    /* ties: magnitudes from a small set, both signs */
    for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 7919) % 13 + 1) * (i % 3 ? 1.0f : -1.0f);
    check_topk_case(x, rows, cols, 0.1, "ties");
    for (int64_t i = 0; i < n; i++) x[i] = 0.5f;
    check_topk_case(x, rows, cols, 0.01, "all equal");
    /* spread over exponents, so all three radix digits decide */
    for (int64_t i = 0; i < n; i++)
        x[i] = ldexpf(1.0f + (float)((i * 31) % 97) / 97.0f, (int)(i % 40) - 20);
    check_topk_case(x, rows, cols, 0.3, "exponents");
    check_topk_case(x, 1, n, 1.0, "everything");
    check_topk_case(x, 1, n, 1e-9, "one");
    free(x);
}

/* ---- int8, bf16, sign --------------------------------------------------------------------- */

static void test_int8(void) {
    int64_t rows = 10, cols = 100, n = rows * cols, block = 64, blocks = (n + block - 1) / block;
    float *x = falloc(n), *out = falloc(n);
    fill_normal(x, n, 2);
    for (int64_t i = 0; i < n; i++) x[i] *= ldexpf(1.0f, (int)((i / block) % 7) * 3 - 9);
    for (int64_t i = 128; i < 192; i++) x[i] = 0; /* an all-zero block */
    loom_compress_opts o = opts_of(LOOM_COMPRESS_INT8, 0, 0, 1);
    o.block = (int)block;
    loom_compressor *c = make(&o, rows, cols, 0);
    unsigned char *wire = xcalloc(loom_compressor_wire_bytes(c), 1);
    loom_compressor_encode(c, x, wire);
    loom_compressor_decode(c, wire, out);
    int scales_ok = 1, within = 1;
    for (int64_t b = 0; b < blocks; b++) {
        float max = 0, scale;
        for (int64_t i = b * block; i < n && i < (b + 1) * block; i++)
            max = fmaxf(max, fabsf(x[i]));
        memcpy(&scale, wire + 4 * b, 4);
        scales_ok &= scale == max / 127.0f;
        for (int64_t i = b * block; i < n && i < (b + 1) * block; i++) {
            within &= fabsf(out[i] - x[i]) <= scale * 0.5f * (1 + 1e-5f) + 1e-30f;
        }
    }
    CHECK(scales_ok, "int8 scales are max|x| / 127 per block");
    CHECK(within, "int8: |decode - x| <= scale / 2");
    CHECK(!has_nan(out, n) && out[130] == 0, "int8: a zero block decodes to zeros");
    signed char q;
    memcpy(&q, wire + 4 * blocks + 5, 1);
    float scale0;
    memcpy(&scale0, wire, 4);
    CHECK(q == (signed char)roundf(x[5] / scale0), "int8 level %d", q);
    free(wire);
    free(out);
    free(x);
    loom_compressor_free(c);
}

static float float_of(uint32_t u) {
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static void test_bf16(void) {
    /* input bits -> expected bf16 bits */
    static const uint32_t cases[][2] = {
        {0x3f800000u, 0x3f80u}, /* 1 */
        {0x3f808000u, 0x3f80u}, /* halfway, even below: down */
        {0x3f818000u, 0x3f82u}, /* halfway, odd below: up */
        {0x3f808001u, 0x3f81u}, /* above halfway */
        {0x3f807fffu, 0x3f80u}, /* below halfway */
        {0xbf818000u, 0xbf82u}, /* negative tie */
        {0x80000000u, 0x8000u}, /* -0 */
        {0x7f800000u, 0x7f80u}, /* inf */
        {0x7f7fffffu, 0x7f80u}, /* FLT_MAX rounds to inf */
        {0x00000001u, 0x0000u}, /* smallest subnormal */
    };
    size_t count = sizeof cases / sizeof cases[0];
    loom_compress_opts o = opts_of(LOOM_COMPRESS_BF16, 0, 0, 0);
    loom_compressor *c = make(&o, 1, (int64_t)count + 2, 0);
    float x[12];
    for (size_t i = 0; i < count; i++) x[i] = float_of(cases[i][0]);
    x[count] = float_of(0x7fc00001u);     /* quiet NaN */
    x[count + 1] = float_of(0xff800001u); /* NaN whose payload is only in the low bits */
    unsigned char wire[24];
    loom_compressor_encode(c, x, wire);
    for (size_t i = 0; i < count; i++) {
        uint16_t h;
        memcpy(&h, wire + 2 * i, 2);
        CHECK(h == cases[i][1], "bf16 of 0x%08x: 0x%04x, want 0x%04x", cases[i][0], h, cases[i][1]);
    }
    float out[12];
    loom_compressor_decode(c, wire, out);
    CHECK(isnan(out[count]) && isnan(out[count + 1]), "NaN stays NaN");
    CHECK(signbit(out[count + 1]), "NaN keeps its sign");
    loom_compressor_free(c);

    int64_t n = 5000;
    float *y = falloc(n), *dec = falloc(n);
    fill_normal(y, n, 3);
    for (int64_t i = 0; i < n; i++) y[i] = ldexpf(y[i], (int)(i % 60) - 30);
    c = make(&o, 50, 100, 0);
    unsigned char *w = xcalloc(loom_compressor_wire_bytes(c), 1);
    loom_compressor_encode(c, y, w);
    loom_compressor_decode(c, w, dec);
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= fabsf(dec[i] - y[i]) <= ldexpf(fabsf(y[i]), -8);
    CHECK(ok, "bf16: relative error <= 2^-8");
    free(w);
    free(y);
    free(dec);
    loom_compressor_free(c);
}

static void test_sign(void) {
    int64_t rows = 3, cols = 7, n = rows * cols; /* 21: not a multiple of 8 */
    float x[21], out[21];
    fill_normal(x, n, 4);
    x[4] = 0;
    double mean = 0;
    for (int64_t i = 0; i < n; i++) mean += fabs((double)x[i]) / (double)n;
    loom_compress_opts o = opts_of(LOOM_COMPRESS_SIGN, 0, 0, 1);
    loom_compressor *c = make(&o, rows, cols, 0);
    unsigned char wire[4 + 3];
    CHECK(loom_compressor_wire_bytes(c) == sizeof wire, "sign wire");
    loom_compressor_encode(c, x, wire);
    loom_compressor_decode(c, wire, out);
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        ok &= fabs(fabs((double)out[i]) - mean) <= 1e-6 * mean;
        ok &= (out[i] >= 0) == (x[i] >= 0);
        ok &= (int)((wire[4 + i / 8] >> (i % 8)) & 1) == (x[i] >= 0);
    }
    CHECK(ok, "sign: decode is +-mean|x|, bit 1 for non-negative, LSB first");
    CHECK((wire[4 + 2] >> 5) == 0, "sign: unused bits are zero");
    /* decode needs no state: another compressor of the same shape decodes the same */
    loom_compressor *other = make(&o, rows, cols, 5);
    float again[21] = {0};
    loom_compressor_decode_add(other, wire, again);
    CHECK(memcmp(again, out, sizeof out) == 0, "any replica decodes");
    loom_compressor_free(other);
    loom_compressor_free(c);
}

/* ---- PowerSGD and lowrank against a double-precision power step ------------------------------ */

/* The algorithm of REFERENCE.md "Compressors" in double, for `replicas` replicas sharing Q, with
 * error feedback: M_i = G_i + E_i, P = orth(sum M_i Q), Q = sum M_i^T P, approx = P Q^T,
 * E_i = M_i - approx / replicas. Modified Gram-Schmidt stands in for Householder QR: the columns
 * may differ in sign, P P^T does not. */
typedef struct {
    int64_t rows, cols;
    int r, replicas;
    double *q;  /* (cols, r) */
    double **e; /* replicas x (rows, cols) */
} ref_power;

static void ref_init(ref_power *ref, int64_t rows, int64_t cols, int r, int replicas, uint64_t seed,
                     uint64_t stream) {
    ref->rows = rows, ref->cols = cols, ref->r = r, ref->replicas = replicas;
    ref->q = xcalloc((size_t)(cols * r), sizeof(double));
    for (int64_t i = 0; i < cols * r; i++) {
        ref->q[i] = (double)(float)loom_rng_normal(seed, stream, (uint64_t)i);
    }
    ref->e = xcalloc((size_t)replicas, sizeof(double *));
    for (int i = 0; i < replicas; i++) ref->e[i] = xcalloc((size_t)(rows * cols), sizeof(double));
}

static void ref_free(ref_power *ref) {
    for (int i = 0; i < ref->replicas; i++) free(ref->e[i]);
    free(ref->e);
    free(ref->q);
}

static void ref_step(ref_power *ref, float *const *g, double *approx) {
    int64_t rows = ref->rows, cols = ref->cols, n = rows * cols;
    int r = ref->r;
    double *p = xcalloc((size_t)(rows * r), sizeof(double));
    for (int k = 0; k < ref->replicas; k++) {
        double *m = ref->e[k]; /* becomes M */
        for (int64_t i = 0; i < n; i++) m[i] += g[k][i];
        for (int64_t i = 0; i < rows; i++) {
            for (int t = 0; t < r; t++) {
                for (int64_t j = 0; j < cols; j++)
                    p[i * r + t] += m[i * cols + j] * ref->q[j * r + t];
            }
        }
    }
    for (int t = 0; t < r; t++) {
        for (int u = 0; u < t; u++) {
            double dot = 0;
            for (int64_t i = 0; i < rows; i++) dot += p[i * r + t] * p[i * r + u];
            for (int64_t i = 0; i < rows; i++) p[i * r + t] -= dot * p[i * r + u];
        }
        double norm = 0;
        for (int64_t i = 0; i < rows; i++) norm += p[i * r + t] * p[i * r + t];
        for (int64_t i = 0; i < rows; i++) p[i * r + t] /= sqrt(norm);
    }
    memset(ref->q, 0, (size_t)(cols * r) * sizeof(double));
    for (int k = 0; k < ref->replicas; k++) {
        for (int64_t i = 0; i < rows; i++) {
            for (int64_t j = 0; j < cols; j++) {
                for (int t = 0; t < r; t++)
                    ref->q[j * r + t] += ref->e[k][i * cols + j] * p[i * r + t];
            }
        }
    }
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) {
            double s = 0;
            for (int t = 0; t < r; t++) s += p[i * r + t] * ref->q[j * r + t];
            approx[i * cols + j] = s;
        }
    }
    for (int k = 0; k < ref->replicas; k++) {
        for (int64_t i = 0; i < n; i++) ref->e[k][i] -= approx[i] / ref->replicas;
    }
    free(p);
}

/* One PowerSGD step of simulated replicas: m[i] holds replica i's gradient and receives the
 * approximation of the sum; the two sums an allreduce would do are done here. Returns whether
 * every replica's orthonormal P came out identical. */
static int powersgd_step(loom_compressor **c, float **m, int replicas) {
    int64_t rows = loom_compressor_rows(c[0]), cols = loom_compressor_cols(c[0]);
    int r = loom_compressor_rank(c[0]);
    float *p_sum = falloc(rows * r), *q_sum = falloc(cols * r), *p = falloc(rows * r),
          *q = falloc(cols * r), *p_first = falloc(rows * r);
    for (int i = 0; i < replicas; i++) {
        loom_powersgd_p(c[i], m[i], p);
        for (int64_t j = 0; j < rows * r; j++) p_sum[j] += p[j];
    }
    int same = 1;
    for (int i = 0; i < replicas; i++) {
        memcpy(p, p_sum, (size_t)(rows * r) * sizeof(float));
        loom_powersgd_q(c[i], m[i], p, q);
        for (int64_t j = 0; j < cols * r; j++) q_sum[j] += q[j];
        if (i == 0) memcpy(p_first, p, (size_t)(rows * r) * sizeof(float));
        same &= memcmp(p, p_first, (size_t)(rows * r) * sizeof(float)) == 0;
    }
    for (int i = 0; i < replicas; i++) loom_powersgd_done(c[i], m[i], p_first, q_sum, replicas);
    free(p_sum);
    free(q_sum);
    free(p);
    free(q);
    free(p_first);
    return same;
}

/* Rank-3 sums are recovered exactly whenever the rank is >= 3. */
static void test_powersgd_exact(void) {
    int64_t rows = 64, cols = 48, n = rows * cols;
    const int true_rank = 3;
    float *a = falloc(rows * true_rank), *b = falloc(cols * true_rank);
    fill_normal(a, rows * true_rank, 10);
    double *want = xcalloc((size_t)n, sizeof(double)), *part = xcalloc((size_t)n, sizeof(double));
    for (int replicas = 1; replicas <= 3; replicas++) {
        for (int rank = 3; rank <= 5; rank += 2) {
            loom_compress_opts o = opts_of(LOOM_COMPRESS_POWERSGD, rank, 0, 1);
            loom_compressor *c[3];
            float *m[3];
            memset(want, 0, (size_t)n * sizeof(double));
            for (int i = 0; i < replicas; i++) {
                c[i] = make(&o, rows, cols, 7);
                m[i] = falloc(n);
                fill_normal(b, cols * true_rank, 20 + (uint64_t)i); /* same column space A */
                outer(part, a, b, rows, cols, true_rank);
                for (int64_t j = 0; j < n; j++) {
                    m[i][j] = (float)part[j];
                    want[j] += (float)part[j];
                }
            }
            CHECK(loom_compressor_compresses(c[0]) && loom_compressor_rank(c[0]) == rank, "rank");
            int same = powersgd_step(c, m, replicas);
            CHECK(same, "replicas orthonormalise the same P");
            for (int i = 0; i < replicas; i++) {
                double d = rel_diff(m[i], want, n);
                CHECK(d < 1e-5, "replicas %d rank %d: replica %d recovers the sum: %g", replicas,
                      rank, i, d);
            }
            /* exact: the residuals sum to zero */
            double *e_sum = xcalloc((size_t)n, sizeof(double));
            for (int i = 0; i < replicas; i++) {
                loom_compressor_commit(c[i], 1);
                const float *e = loom_compressor_state_data(c[i], 0);
                for (int64_t j = 0; j < n; j++) e_sum[j] += e[j];
            }
            double worst = 0;
            for (int64_t j = 0; j < n; j++) worst = fmax(worst, fabs(e_sum[j]));
            double size = 0;
            for (int64_t j = 0; j < n; j++) size = fmax(size, fabs(want[j]));
            CHECK(worst < 1e-5 * size, "residuals sum to zero: %g", worst / size);
            free(e_sum);
            for (int i = 0; i < replicas; i++) {
                free(m[i]);
                loom_compressor_free(c[i]);
            }
        }
    }
    free(a);
    free(b);
    free(want);
    free(part);
}

/* Random (full-rank) gradients, rank 2, error feedback: two steps against the reference. */
static void test_powersgd_reference(void) {
    int64_t rows = 40, cols = 30, n = rows * cols;
    const int replicas = 3, rank = 2;
    loom_compress_opts o = opts_of(LOOM_COMPRESS_POWERSGD, rank, 0, 1);
    loom_compressor *c[3];
    float *g[3], *m[3];
    ref_power ref;
    ref_init(&ref, rows, cols, rank, replicas, o.seed, 11);
    double *approx = xcalloc((size_t)n, sizeof(double));
    for (int i = 0; i < replicas; i++) {
        c[i] = make(&o, rows, cols, 11);
        g[i] = falloc(n), m[i] = falloc(n);
    }
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < replicas; i++) {
            fill_normal(g[i], n, 100 + (uint64_t)(step * replicas + i));
            memcpy(m[i], g[i], (size_t)n * sizeof(float));
        }
        powersgd_step(c, m, replicas);
        ref_step(&ref, g, approx);
        for (int i = 0; i < replicas; i++) {
            double d = rel_diff(m[i], approx, n);
            CHECK(d < 1e-4, "step %d replica %d: the approximation matches: %g", step, i, d);
            loom_compressor_commit(c[i], 1);
            d = rel_diff(loom_compressor_state_data(c[i], 0), ref.e[i], n);
            CHECK(d < 1e-4, "step %d replica %d: the residual matches: %g", step, i, d);
            double sq = 0;
            for (int64_t j = 0; j < n; j++) sq += ref.e[i][j] * ref.e[i][j];
            CHECK_CLOSE(loom_compressor_residual_sq(c[i]), sq, 1e-4, 0, "residual_sq");
        }
    }
    /* the committed Q is the summed one: q^T q spans the same as the reference (norms agree) */
    const float *q = loom_compressor_state_data(c[0], 1);
    for (int t = 0; t < rank; t++) {
        double norm = 0, ref_norm = 0;
        for (int64_t j = 0; j < cols; j++) {
            norm += (double)q[j * rank + t] * q[j * rank + t];
            ref_norm += ref.q[j * rank + t] * ref.q[j * rank + t];
        }
        CHECK_CLOSE(norm, ref_norm, 1e-4, 0, "warm-start column norm");
    }
    for (int i = 0; i < replicas; i++) {
        free(g[i]);
        free(m[i]);
        loom_compressor_free(c[i]);
    }
    free(approx);
    ref_free(&ref);
}

/* A zero gradient and a rank-1 one with rank 4: P is zero or rank-deficient, never NaN. */
static void test_powersgd_degenerate(void) {
    int64_t rows = 32, cols = 24, n = rows * cols;
    const int rank = 4;
    loom_compress_opts o = opts_of(LOOM_COMPRESS_POWERSGD, rank, 0, 1);
    loom_compressor *c = make(&o, rows, cols, 3);
    float *m = falloc(n), *p = falloc(rows * rank), *q = falloc(cols * rank);
    for (int kind = 0; kind < 2; kind++) {
        float u[32], v[24];
        fill_normal(u, rows, 40);
        fill_normal(v, cols, 41);
        for (int64_t i = 0; i < n; i++) m[i] = kind ? u[i / cols] * v[i % cols] : 0;
        float *g = falloc(n);
        memcpy(g, m, (size_t)n * sizeof(float));
        loom_powersgd_p(c, m, p);
        loom_powersgd_q(c, m, p, q);
        int orthonormal = 1;
        for (int s = 0; s < rank; s++) {
            for (int t = 0; t < rank; t++) {
                double dot = 0;
                for (int64_t i = 0; i < rows; i++) dot += (double)p[i * rank + s] * p[i * rank + t];
                orthonormal &= fabs(dot - (s == t)) < 1e-5;
            }
        }
        CHECK(!has_nan(p, rows * rank) && orthonormal, "%s: P orthonormal, no NaN",
              kind ? "rank 1" : "zero");
        loom_powersgd_done(c, m, p, q, 1);
        CHECK(!has_nan(m, n) && !has_nan(q, cols * rank), "%s: no NaN", kind ? "rank 1" : "zero");
        CHECK(rel_diff_f(m, g, n) < 1e-5 || (kind == 0 && m[0] == 0), "%s: recovered",
              kind ? "rank 1" : "zero");
        loom_compressor_commit(c, 0);
        free(g);
    }
    free(m);
    free(p);
    free(q);
    loom_compressor_free(c);
}

/* ---- lowrank ------------------------------------------------------------------------------ */

static void test_lowrank(void) {
    int64_t rows = 40, cols = 30, n = rows * cols;
    const int true_rank = 3;
    float *a = falloc(rows * true_rank), *b = falloc(cols * true_rank), *x = falloc(n),
          *out = falloc(n);
    double *xd = xcalloc((size_t)n, sizeof(double)), *approx = xcalloc((size_t)n, sizeof(double));
    fill_normal(a, rows * true_rank, 50);
    fill_normal(b, cols * true_rank, 51);
    outer(xd, a, b, rows, cols, true_rank);
    for (int64_t i = 0; i < n; i++) x[i] = (float)xd[i];
    for (int rank = 3; rank <= 4; rank++) {
        loom_compress_opts o = opts_of(LOOM_COMPRESS_LOWRANK, rank, 0, 1);
        loom_compressor *c = make(&o, rows, cols, 8);
        size_t bytes = loom_compressor_wire_bytes(c);
        CHECK(bytes == (size_t)(4 * rank * (rows + cols)), "lowrank wire");
        unsigned char *wire = xcalloc(bytes + 1, 1);
        loom_compressor_encode(c, x, wire);
        loom_compressor_decode(c, wire, out);
        CHECK(rel_diff(out, xd, n) < 1e-5, "rank %d recovers rank 3: %g", rank,
              rel_diff(out, xd, n));
        /* a wire at an odd address decodes the same */
        memmove(wire + 1, wire, bytes);
        float *odd = falloc(n);
        loom_compressor_decode(c, wire + 1, odd);
        CHECK(memcmp(odd, out, (size_t)n * sizeof(float)) == 0, "misaligned wire");
        free(odd);
        loom_compressor_commit(c, 1);
        CHECK(loom_compressor_residual_sq(c) < 1e-8 * n, "residual ~0: %g",
              loom_compressor_residual_sq(c));
        free(wire);
        loom_compressor_free(c);
    }

    /* a random matrix, rank 2, two steps with error feedback and the warm start, against the
     * reference power step (one replica) */
    loom_compress_opts o = opts_of(LOOM_COMPRESS_LOWRANK, 2, 0, 1);
    loom_compressor *c = make(&o, rows, cols, 9);
    ref_power ref;
    ref_init(&ref, rows, cols, 2, 1, o.seed, 9);
    unsigned char *wire = xcalloc(loom_compressor_wire_bytes(c), 1);
    for (int step = 0; step < 2; step++) {
        fill_normal(x, n, 60 + (uint64_t)step);
        loom_compressor_encode(c, x, wire);
        loom_compressor_decode(c, wire, out);
        ref_step(&ref, &x, approx);
        CHECK(rel_diff(out, approx, n) < 1e-4, "lowrank step %d: %g", step,
              rel_diff(out, approx, n));
        loom_compressor_commit(c, 1);
        CHECK(rel_diff(loom_compressor_state_data(c, 0), ref.e[0], n) < 1e-4, "lowrank residual");
    }
    ref_free(&ref);
    free(wire);
    loom_compressor_free(c);

    /* min_ratio 10 lets rank 8 through on 4 x 4: the rank is clamped to 4, exact on any matrix */
    o = opts_of(LOOM_COMPRESS_LOWRANK, 8, 0, 0);
    o.min_ratio = 10;
    c = make(&o, 4, 4, 0);
    CHECK(loom_compressor_compresses(c) && loom_compressor_rank(c) == 4, "clamped rank %d",
          loom_compressor_rank(c));
    CHECK(loom_compressor_wire_bytes(c) == 4 * 4 * 8, "clamped wire");
    CHECK(loom_compressor_state_count(c) == 1 && loom_compressor_state_floats(c, 0) == 16,
          "clamped q");
    float y[16], w[32], back[16];
    fill_normal(y, 16, 70);
    loom_compressor_encode(c, y, w);
    loom_compressor_decode(c, w, back);
    CHECK(rel_diff_f(back, y, 16) < 1e-5, "full rank recovered: %g", rel_diff_f(back, y, 16));
    loom_compressor_free(c);
    free(a);
    free(b);
    free(x);
    free(out);
    free(xd);
    free(approx);
}

/* ---- what every lossy method shares -------------------------------------------------------- */

/* sent + residual = input within a few ulps, one replica, first step. */
static void test_residual_identity(void) {
    int64_t rows = 24, cols = 40, n = rows * cols;
    float *x = falloc(n), *out = falloc(n);
    fill_normal(x, n, 80);
    for (int method = LOOM_COMPRESS_POWERSGD; method < LOOM_COMPRESS_COUNT; method++) {
        loom_compress_opts o = opts_of((loom_compress_method)method, 3, 0.1, 1);
        loom_compressor *c = make(&o, rows, cols, 1);
        CHECK(loom_compressor_compresses(c), "%s compresses", loom_compress_method_name(o.method));
        if (method == LOOM_COMPRESS_POWERSGD) {
            memcpy(out, x, (size_t)n * sizeof(float));
            powersgd_step(&c, &out, 1);
        } else {
            unsigned char *wire = xcalloc(loom_compressor_wire_bytes(c), 1);
            loom_compressor_encode(c, x, wire);
            loom_compressor_decode(c, wire, out);
            free(wire);
        }
        double sq = loom_compressor_residual_sq(c);
        loom_compressor_commit(c, 1);
        CHECK(strcmp(loom_compressor_state_name(c, 0), "residual") == 0, "residual first");
        const float *e = loom_compressor_state_data(c, 0);
        int ok = 1;
        double e_sq = 0;
        for (int64_t i = 0; i < n; i++) {
            float scale = fmaxf(fabsf(x[i]), fabsf(out[i]));
            ok &= fabsf(out[i] + e[i] - x[i]) <= 4 * ldexpf(scale, -24);
            e_sq += (double)e[i] * e[i];
        }
        CHECK(ok, "%s: sent + residual = input", loom_compress_method_name(o.method));
        CHECK_CLOSE(sq, e_sq, 1e-9, 0, "residual_sq");
        CHECK(sq > 0, "%s is lossy here", loom_compress_method_name(o.method));
        loom_compressor_free(c);
    }
    free(x);
    free(out);
}

/* Top-k 1 % of the same x, 50 and then 400 times: with error feedback the decoded sum is t x
 * minus the final residual, whose norm stays bounded, so the mean approaches x (in 50 steps at
 * most half the entries can have been sent, hence the looser bound there); without, the mean
 * stays the top 1 % of x. */
static void test_error_feedback_steps(void) {
    int64_t rows = 50, cols = 40, n = rows * cols;
    float *x = falloc(n), *out = falloc(n);
    double *sum = xcalloc((size_t)n, sizeof(double));
    fill_normal(x, n, 90);
    double x_norm = 0;
    for (int64_t i = 0; i < n; i++) x_norm += (double)x[i] * x[i];
    x_norm = sqrt(x_norm);
    double err[2][2]; /* [ef][50 steps, 400 steps] */
    for (int ef = 0; ef <= 1; ef++) {
        loom_compress_opts o = opts_of(LOOM_COMPRESS_TOPK, 0, 0.01, ef);
        loom_compressor *c = make(&o, rows, cols, 0);
        CHECK(loom_compressor_state_count(c) == ef, "topk state with ef %d", ef);
        unsigned char *wire = xcalloc(loom_compressor_wire_bytes(c), 1);
        memset(sum, 0, (size_t)n * sizeof(double));
        for (int s = 1; s <= 400; s++) {
            loom_compressor_encode(c, x, wire);
            loom_compressor_decode(c, wire, out);
            for (int64_t i = 0; i < n; i++) sum[i] += out[i];
            loom_compressor_commit(c, 1);
            if (s != 50 && s != 400) continue;
            double dist = 0;
            for (int64_t i = 0; i < n; i++) {
                double d = sum[i] - s * (double)x[i];
                dist += d * d;
            }
            dist = sqrt(dist);
            err[ef][s == 400] = dist / s / x_norm;
            if (ef) {
                double e_norm = sqrt(loom_compressor_residual_sq(c));
                CHECK_CLOSE(dist, e_norm, 1e-4, 0, "|sum decoded - t x| = |final residual|");
            }
        }
        free(wire);
        loom_compressor_free(c);
    }
    CHECK(err[0][0] > 0.9 && err[0][1] > 0.9, "without ef the mean stays off: %.3f, %.3f",
          err[0][0], err[0][1]);
    CHECK(err[1][0] < 0.6 && err[1][1] < 0.2 && err[1][1] < err[1][0] / 3,
          "with ef the mean approaches x: %.3f, %.3f", err[1][0], err[1][1]);
    free(x);
    free(out);
    free(sum);
}

/* ---- steps: commit, rollback, lazy updates ------------------------------------------------- */

/* Encodes x with a fresh compressor three ways: step; rollback; step again (must equal the
 * first); accept; step (must differ); and two updates in one step (the second reads the first's
 * working state, so it equals the accepted case). */
static void check_steps(const loom_compress_opts *o, const char *what) {
    int64_t rows = 20, cols = 30, n = rows * cols;
    float *x = falloc(n);
    fill_normal(x, n, 95);
    loom_compressor *c = make(o, rows, cols, 4), *lazy = make(o, rows, cols, 4);
    size_t bytes = loom_compressor_wire_bytes(c);
    unsigned char *w1 = xcalloc(bytes, 1), *w2 = xcalloc(bytes, 1), *w3 = xcalloc(bytes, 1),
                  *w4 = xcalloc(bytes, 1);
    loom_compressor_encode(c, x, w1);
    loom_compressor_commit(c, 0);
    loom_compressor_encode(c, x, w2);
    CHECK(memcmp(w1, w2, bytes) == 0, "%s: a rolled-back step leaves no trace", what);
    loom_compressor_commit(c, 1);
    loom_compressor_encode(c, x, w3);
    CHECK(memcmp(w1, w3, bytes) != 0, "%s: an accepted step carries state", what);
    loom_compressor_encode(lazy, x, w4);
    loom_compressor_encode(lazy, x, w4);
    CHECK(memcmp(w3, w4, bytes) == 0, "%s: a second update in a step reads the first's", what);
    free(w1);
    free(w2);
    free(w3);
    free(w4);
    free(x);
    loom_compressor_free(c);
    loom_compressor_free(lazy);
}

static void test_steps(void) {
    loom_compress_opts o = opts_of(LOOM_COMPRESS_TOPK, 0, 0.05, 1);
    check_steps(&o, "topk");
    o = opts_of(LOOM_COMPRESS_INT8, 0, 0, 1);
    check_steps(&o, "int8");
    o = opts_of(LOOM_COMPRESS_LOWRANK, 2, 0, 1);
    check_steps(&o, "lowrank");
    o = opts_of(LOOM_COMPRESS_LOWRANK, 2, 0, 0);
    check_steps(&o, "lowrank, warm start only");

    /* PowerSGD: the same, through the three calls */
    int64_t rows = 20, cols = 30, n = rows * cols;
    o = opts_of(LOOM_COMPRESS_POWERSGD, 2, 0, 1);
    loom_compressor *c = make(&o, rows, cols, 4);
    float *g = falloc(n), *m[3];
    fill_normal(g, n, 96);
    for (int i = 0; i < 3; i++) {
        m[i] = falloc(n);
        memcpy(m[i], g, (size_t)n * sizeof(float));
        powersgd_step(&c, &m[i], 1);
        loom_compressor_commit(c, i == 1);
    }
    CHECK(memcmp(m[0], m[1], (size_t)n * sizeof(float)) == 0, "powersgd: rollback");
    CHECK(memcmp(m[0], m[2], (size_t)n * sizeof(float)) != 0, "powersgd: accept");
    for (int i = 0; i < 3; i++) free(m[i]);
    free(g);
    loom_compressor_free(c);
}

/* ---- state lists, uncompressed matrices ---------------------------------------------------- */

static void test_state_and_small(void) {
    loom_compress_opts o = opts_of(LOOM_COMPRESS_POWERSGD, 3, 0, 1);
    loom_compressor *c = make(&o, 50, 20, 0);
    CHECK(loom_compressor_state_count(c) == 2, "powersgd ef: residual and q");
    CHECK(strcmp(loom_compressor_state_name(c, 0), "residual") == 0 &&
              loom_compressor_state_floats(c, 0) == 1000,
          "residual entry");
    CHECK(strcmp(loom_compressor_state_name(c, 1), "q") == 0 &&
              loom_compressor_state_floats(c, 1) == 60,
          "q entry");
    CHECK(loom_compressor_state_bytes(c) == 2 * 4 * 1060, "both copies counted");
    const float *q = loom_compressor_state_data(c, 1);
    CHECK(q[5] == (float)loom_rng_normal(o.seed, 0, 5), "initial q from (seed, stream)");
    loom_compressor_free(c);
    o.error_feedback = 0;
    c = make(&o, 50, 20, 0);
    CHECK(loom_compressor_state_count(c) == 1 && strcmp(loom_compressor_state_name(c, 0), "q") == 0,
          "powersgd without ef: q only");
    loom_compressor_free(c);
    for (int method = LOOM_COMPRESS_TOPK; method < LOOM_COMPRESS_COUNT; method++) {
        o = opts_of((loom_compress_method)method, 0, 0.5, method == LOOM_COMPRESS_SIGN);
        c = make(&o, 3, 3, 0);
        int want = method == LOOM_COMPRESS_SIGN;
        CHECK(loom_compressor_state_count(c) == want, "%s state",
              loom_compress_method_name(o.method));
        loom_compressor_free(c);
    }

    /* one row and small matrices go as they are */
    static const int64_t shapes[][2] = {{1, 4096}, {4, 4}, {8, 8}};
    for (int s = 0; s < 3; s++) {
        for (int method = LOOM_COMPRESS_POWERSGD; method <= LOOM_COMPRESS_LOWRANK; method++) {
            int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
            o = opts_of((loom_compress_method)method, 2, 0, 1);
            c = make(&o, rows, cols, 0);
            CHECK(!loom_compressor_compresses(c), "%lldx%lld sent as it is", (long long)rows,
                  (long long)cols);
            CHECK(loom_compressor_wire_bytes(c) == (size_t)(4 * n), "4 n bytes");
            CHECK(loom_compressor_state_count(c) == 0 && loom_compressor_state_bytes(c) == 0,
                  "no state");
            float *x = falloc(n), *w = falloc(n), *out = falloc(n);
            fill_normal(x, n, 97);
            loom_compressor_encode(c, x, w);
            loom_compressor_decode(c, w, out);
            loom_compressor_decode_add(c, w, out);
            int ok = 1;
            for (int64_t i = 0; i < n; i++) ok &= out[i] == 2 * x[i];
            CHECK(ok, "copied exactly");
            free(x);
            free(w);
            free(out);
            loom_compressor_free(c);
        }
    }
}

/* A large top-k (2^21 entries, 0.1 %), checked in linear time: k kept, every kept magnitude >=
 * every dropped one, and among equal magnitudes the lower indices kept. */
static void test_topk_large(void) {
    int64_t n = (int64_t)1 << 21;
    float *x = falloc(n);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(loom_rng_uniform(5, 5, (uint64_t)i) * 1000.0) - 500.0f;
    for (int64_t i = 0; i < n; i += 1000) x[i] = 499.5f; /* a crowd of ties near the top */
    loom_compress_opts o = opts_of(LOOM_COMPRESS_TOPK, 0, 0.001, 0);
    loom_compressor *c = make(&o, 1024, n / 1024, 0);
    size_t bytes = loom_compressor_wire_bytes(c);
    int64_t k = (int64_t)bytes / 8;
    unsigned char *wire = xcalloc(bytes, 1);
    unsigned char *kept = xcalloc((size_t)n, 1);
    double t0 = loom_now();
    loom_compressor_encode(c, x, wire);
    double seconds = loom_now() - t0;
    float min_kept = INFINITY;
    int64_t last_kept_tie = -1, sorted = 1;
    for (int64_t j = 0; j < k; j++) {
        uint32_t index, prev = 0;
        memcpy(&index, wire + 4 * k + 4 * j, 4);
        if (j) memcpy(&prev, wire + 4 * k + 4 * (j - 1), 4);
        sorted &= j == 0 || index > prev;
        kept[index] = 1;
        min_kept = fminf(min_kept, fabsf(x[index]));
    }
    float max_dropped = 0;
    int64_t first_dropped_tie = n;
    for (int64_t i = 0; i < n; i++) {
        if (!kept[i]) max_dropped = fmaxf(max_dropped, fabsf(x[i]));
        if (fabsf(x[i]) == min_kept) {
            if (kept[i])
                last_kept_tie = i;
            else if (first_dropped_tie == n)
                first_dropped_tie = i;
        }
    }
    CHECK(sorted, "indices ascending");
    CHECK(min_kept >= max_dropped, "kept %g >= dropped %g", min_kept, max_dropped);
    CHECK(last_kept_tie < first_dropped_tie, "ties: lower indices kept");
    CHECK(seconds < 0.5, "2M entries in %.3f s", seconds);
    free(kept);
    free(wire);
    free(x);
    loom_compressor_free(c);
}

/* Lazy error propagation when a send goes uncompressed: flush adds the residual to that send
 * exactly and clears it, so the next compressed send starts from no residual; a rolled-back
 * flush leaves the residual as it was. */
static void test_flush(void) {
    loom_compress_opts o = opts_of(LOOM_COMPRESS_LOWRANK, 2, 0, 1);
    int64_t rows = 20, cols = 30, n = rows * cols;
    float *x = falloc(n), *y = falloc(n), *out = falloc(n), *sent = falloc(n);
    fill_normal(x, n, 97);
    fill_normal(y, n, 98);
    loom_compressor *c = make(&o, rows, cols, 4), *fresh = make(&o, rows, cols, 4);
    size_t bytes = loom_compressor_wire_bytes(c);
    unsigned char *w = xcalloc(bytes, 1), *w_fresh = xcalloc(bytes, 1),
                  *w_again = xcalloc(bytes, 1);
    loom_compressor_encode(c, x, w);
    loom_compressor_decode(c, w, sent);
    loom_compressor_commit(c, 1);
    loom_compressor_flush(c, y, out); /* out = y + (x - sent) */
    int exact = 1;
    for (int64_t i = 0; i < n; i++) exact &= out[i] == y[i] + (x[i] - sent[i]);
    CHECK(exact, "flush adds the residual x - sent to the uncompressed send");
    /* after the flush the next encode starts from no residual: its residual is y - sent(y) */
    loom_compressor_encode(c, y, w);
    loom_compressor_decode(c, w, out);
    double sq = 0;
    for (int64_t i = 0; i < n; i++) sq += ((double)y[i] - out[i]) * ((double)y[i] - out[i]);
    CHECK_CLOSE(loom_compressor_residual_sq(c), sq, 1e-4, 1e-9, "residual after a flush");
    (void)fresh;
    loom_compressor_commit(c, 0); /* roll back the flush and the encode: E = x - sent again */
    loom_compressor_flush(c, y, out);
    exact = 1;
    for (int64_t i = 0; i < n; i++) exact &= out[i] == y[i] + (x[i] - sent[i]);
    CHECK(exact, "a rolled-back flush leaves the residual");
    (void)w_again;
    free(w), free(w_fresh), free(w_again), free(x), free(y), free(out), free(sent);
    loom_compressor_free(c);
    loom_compressor_free(fresh);
}

int main(void) {
    test_parse_and_check();
    test_wire_sizes();
    test_topk();
    test_topk_large();
    test_int8();
    test_bf16();
    test_sign();
    test_powersgd_exact();
    test_powersgd_reference();
    test_powersgd_degenerate();
    test_lowrank();
    test_residual_identity();
    test_error_feedback_steps();
    test_steps();
    test_flush();
    test_state_and_small();
    return check_finish();
}
