/*
 * compress.c — what every compressor shares: method names and where each may be used, the
 * options' checks, creating a compressor for one matrix (whether it compresses, its effective
 * rank or k, its state), the one-shot encode/decode (error feedback added here, the method's
 * arithmetic in quantize.c and powersgd.c), commit/rollback, and the state list checkpoints save.
 *
 * Not here: the methods' arithmetic, moving bytes (comm/), deciding where to compress (plan/,
 * parallel/).
 */
#include "compress_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- method names ------------------------------------------------------------------------- */

static const char *const method_names[LOOM_COMPRESS_COUNT] = {"none", "powersgd", "lowrank", "topk",
                                                              "sign", "int8",     "bf16"};

/* The places (LOOM_COMPRESS_FOR_* bits) each method may be used in. */
static const int method_places[LOOM_COMPRESS_COUNT] = {
    [LOOM_COMPRESS_NONE] =
        LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD | LOOM_COMPRESS_FOR_PP_FORWARD,
    [LOOM_COMPRESS_POWERSGD] = LOOM_COMPRESS_FOR_DP,
    [LOOM_COMPRESS_LOWRANK] = LOOM_COMPRESS_FOR_PP_GRAD,
    [LOOM_COMPRESS_TOPK] = LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD,
    [LOOM_COMPRESS_SIGN] = LOOM_COMPRESS_FOR_DP,
    [LOOM_COMPRESS_INT8] =
        LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD | LOOM_COMPRESS_FOR_PP_FORWARD,
    [LOOM_COMPRESS_BF16] =
        LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD | LOOM_COMPRESS_FOR_PP_FORWARD,
};

const char *loom_compress_method_name(loom_compress_method method) {
    if ((int)method < 0 || method >= LOOM_COMPRESS_COUNT) return "?";
    return method_names[method];
}

loom_status loom_compress_method_parse(const char *name, int place, const char *source,
                                       const char *field, loom_compress_method *method) {
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) {
        if ((method_places[m] & place) && name && strcmp(name, method_names[m]) == 0) {
            *method = (loom_compress_method)m;
            return LOOM_OK;
        }
    }
    char allowed[128] = "";
    size_t used = 0;
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) {
        if (!(method_places[m] & place)) continue;
        int w = snprintf(allowed + used, sizeof allowed - used, "%s%s", used ? ", " : "",
                         method_names[m]);
        if (w > 0 && (size_t)w < sizeof allowed - used) used += (size_t)w;
    }
    return loom_fail(LOOM_ERR_INPUT, "%s: %s: expected one of %s, got \"%s\"", source, field,
                     allowed, name ? name : "");
}

int loom_compress_is_lossy(loom_compress_method method) {
    return method != LOOM_COMPRESS_NONE;
}

/* ---- options ---------------------------------------------------------------------------- */

loom_status loom_compress_check(const loom_compress_opts *opts, const char *source) {
    loom_compress_method m = opts->method;
    if ((int)m < 0 || m >= LOOM_COMPRESS_COUNT) {
        return loom_fail(LOOM_ERR_INPUT, "%s: method: unknown compression method %d", source,
                         (int)m);
    }
    if ((m == LOOM_COMPRESS_POWERSGD || m == LOOM_COMPRESS_LOWRANK) && opts->rank <= 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: rank: expected > 0 for %s, got %d", source,
                         method_names[m], opts->rank);
    }
    if (m == LOOM_COMPRESS_TOPK && !(opts->fraction > 0 && opts->fraction <= 1)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: fraction: expected a share in (0, 1] for topk, got %g", source,
                         opts->fraction);
    }
    if (m == LOOM_COMPRESS_SIGN && !opts->error_feedback) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: sign compression needs error feedback (it does not converge "
                         "without it); drop --no-error-feedback",
                         source);
    }
    if (!(opts->min_ratio >= 0) || isinf(opts->min_ratio)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: min_ratio: expected a finite value >= 0, got %g",
                         source, opts->min_ratio);
    }
    if (opts->block < 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: block: expected >= 0 (0: 256), got %d", source,
                         opts->block);
    }
    return LOOM_OK;
}

/* ---- creating one matrix's compressor ------------------------------------------------------ */

static int is_low_rank(loom_compress_method m) {
    return m == LOOM_COMPRESS_POWERSGD || m == LOOM_COMPRESS_LOWRANK;
}

/* Whether the low-rank factors pay: r (rows + cols) < min_ratio rows cols, with the rank as
 * asked (before it is clamped to the matrix), and never for one row. */
static int low_rank_pays(const loom_compressor *c) {
    if (c->rows < 2 || c->cols < 2) return 0;
    double r = c->opts.rank;
    return r * (double)(c->rows + c->cols) < c->opts.min_ratio * (double)c->rows * (double)c->cols;
}

/* k = max(1, ceil(f n)), at most n. f n is first rounded to 1e-9 relative, so that a product
 * like 0.07 * 100 = 7.000000000000001 keeps 7 entries, not 8. */
static int64_t topk_count(double fraction, int64_t n) {
    double kf = fraction * (double)n;
    int64_t k = (int64_t)ceil(kf - 1e-9 * kf);
    if (k < 1) k = 1;
    return k > n ? n : k;
}

static loom_status state_alloc(compress_state *s, size_t floats, const char *what) {
    s->floats = floats;
    s->committed = loom_alloc_aligned(floats * sizeof(float), what);
    s->working = s->committed ? loom_alloc_aligned(floats * sizeof(float), what) : NULL;
    return s->working ? LOOM_OK : LOOM_ERR_NOMEM;
}

static void state_free(compress_state *s) {
    loom_free_aligned(s->committed);
    loom_free_aligned(s->working);
    s->committed = s->working = NULL;
}

/* The residual starts at zero, the warm-start factor as normal draws of (seed, stream), the
 * same on every replica. */
static loom_status create_state(loom_compressor *c, uint64_t stream) {
    if (!c->compresses) return LOOM_OK;
    loom_status st = LOOM_OK;
    if (c->opts.error_feedback) {
        st = state_alloc(&c->residual, (size_t)c->n, "compressor residual");
    }
    if (st == LOOM_OK && is_low_rank(c->opts.method)) {
        size_t floats = (size_t)c->cols * (size_t)c->rank;
        st = state_alloc(&c->q, floats, "compressor warm-start factor");
        for (size_t i = 0; st == LOOM_OK && i < floats; i++) {
            c->q.committed[i] = (float)loom_rng_normal(c->opts.seed, stream, i);
        }
        if (st == LOOM_OK) st = loom_compress_lowrank_scratch(c);
    }
    return st;
}

loom_status loom_compressor_create(loom_compressor **out, const loom_compress_opts *opts,
                                   int64_t rows, int64_t cols, uint64_t stream) {
    *out = NULL;
    loom_status st = loom_compress_check(opts, "compressor");
    if (st != LOOM_OK) return st;
    if (rows < 1 || cols < 1 || rows > INT32_MAX || cols > INT32_MAX) {
        return loom_fail(LOOM_ERR_INPUT,
                         "compressor: expected a matrix of 1 to 2^31-1 rows and columns, got "
                         "%lld x %lld",
                         (long long)rows, (long long)cols);
    }
    if (opts->method == LOOM_COMPRESS_TOPK && rows * cols > (int64_t)UINT32_MAX) {
        return loom_fail(LOOM_ERR_INPUT,
                         "compressor: topk indexes entries with 32 bits, got %lld x %lld entries",
                         (long long)rows, (long long)cols);
    }
    loom_compressor *c = loom_calloc(1, sizeof *c, "compressor");
    if (!c) return LOOM_ERR_NOMEM;
    c->opts = *opts;
    if (c->opts.min_ratio == 0) c->opts.min_ratio = 0.5;
    if (c->opts.block == 0) c->opts.block = 256;
    c->rows = rows, c->cols = cols, c->n = rows * cols;
    if (is_low_rank(opts->method)) {
        c->compresses = low_rank_pays(c);
        int64_t smaller = rows < cols ? rows : cols;
        c->rank = opts->rank < smaller ? opts->rank : (int)smaller;
    } else {
        c->compresses = opts->method != LOOM_COMPRESS_NONE;
    }
    if (opts->method == LOOM_COMPRESS_TOPK) c->k = topk_count(opts->fraction, c->n);
    st = create_state(c, stream);
    if (st != LOOM_OK) {
        loom_compressor_free(c);
        return st;
    }
    *out = c;
    return LOOM_OK;
}

void loom_compressor_free(loom_compressor *c) {
    if (!c) return;
    state_free(&c->residual);
    state_free(&c->q);
    loom_compress_lowrank_scratch_free(c);
    free(c);
}

const loom_compress_opts *loom_compressor_opts(const loom_compressor *c) {
    return &c->opts;
}
int64_t loom_compressor_rows(const loom_compressor *c) {
    return c->rows;
}
int64_t loom_compressor_cols(const loom_compressor *c) {
    return c->cols;
}
int loom_compressor_compresses(const loom_compressor *c) {
    return c->compresses;
}
int loom_compressor_rank(const loom_compressor *c) {
    return c->compresses && is_low_rank(c->opts.method) ? c->rank : 0;
}

size_t loom_compressor_wire_bytes(const loom_compressor *c) {
    size_t n = (size_t)c->n;
    if (!c->compresses) return 4 * n;
    switch (c->opts.method) {
    case LOOM_COMPRESS_POWERSGD:
    case LOOM_COMPRESS_LOWRANK:
        return 4 * (size_t)c->rank * (size_t)(c->rows + c->cols);
    case LOOM_COMPRESS_TOPK:
        return 8 * (size_t)c->k;
    case LOOM_COMPRESS_SIGN:
        return 4 + (n + 7) / 8;
    case LOOM_COMPRESS_INT8:
        return 4 * ((n + (size_t)c->opts.block - 1) / (size_t)c->opts.block) + n;
    case LOOM_COMPRESS_BF16:
        return 2 * n;
    default:
        return 4 * n;
    }
}

/* ---- one-shot encode and decode ------------------------------------------------------------ */

void loom_compressor_encode(loom_compressor *c, const float *x, void *wire) {
    if (!c->compresses) {
        memcpy(wire, x, (size_t)c->n * sizeof(float));
        return;
    }
    loom_compress_method method = c->opts.method;
    if (method == LOOM_COMPRESS_POWERSGD) {
        loom_fatal("loom_compressor_encode: a compressing powersgd matrix (%lld x %lld) goes "
                   "through loom_powersgd_p/_q/_done",
                   (long long)c->rows, (long long)c->cols);
    }
    if (method == LOOM_COMPRESS_LOWRANK) {
        loom_compress_lowrank_encode(c, x, wire);
        return;
    }
    /* M = x + E, formed in the working residual, which the method then turns into M - sent. */
    const float *m = x;
    float *residual = NULL;
    if (c->opts.error_feedback) {
        const float *e = compress_state_read(c, &c->residual);
        residual = c->residual.working;
        for (int64_t i = 0; i < c->n; i++) residual[i] = x[i] + e[i];
        m = residual;
        c->dirty = 1;
    } else {
        c->residual_sq = 0;
    }
    switch (method) {
    case LOOM_COMPRESS_TOPK:
        loom_compress_topk_encode(c, m, residual, wire);
        break;
    case LOOM_COMPRESS_SIGN:
        loom_compress_sign_encode(c, m, residual, wire);
        break;
    case LOOM_COMPRESS_INT8:
        loom_compress_int8_encode(c, m, residual, wire);
        break;
    default:
        loom_compress_bf16_encode(c, m, residual, wire);
        break;
    }
}

void loom_compressor_flush(loom_compressor *c, const float *x, float *out) {
    if (!c->residual.floats) {
        if (out != x) memcpy(out, x, (size_t)c->n * sizeof(float));
        return;
    }
    const float *e = compress_state_read(c, &c->residual);
    for (int64_t i = 0; i < c->n; i++) out[i] = x[i] + e[i];
    memset(c->residual.working, 0, c->residual.floats * sizeof(float));
    if (c->q.floats && !c->dirty) {
        /* a commit swaps every piece of state: the warm start goes on unchanged */
        memcpy(c->q.working, c->q.committed, c->q.floats * sizeof(float));
    }
    c->residual_sq = 0;
    c->dirty = 1;
}

static void decode(const loom_compressor *c, const void *wire, float *out, int add) {
    if (!c->compresses) {
        if (!add) {
            memcpy(out, wire, (size_t)c->n * sizeof(float));
            return;
        }
        const unsigned char *bytes = wire;
        for (int64_t i = 0; i < c->n; i++) {
            float v;
            memcpy(&v, bytes + 4 * i, sizeof v);
            out[i] += v;
        }
        return;
    }
    switch (c->opts.method) {
    case LOOM_COMPRESS_LOWRANK:
        loom_compress_lowrank_decode(c, wire, out, add);
        break;
    case LOOM_COMPRESS_TOPK:
        loom_compress_topk_decode(c, wire, out, add);
        break;
    case LOOM_COMPRESS_SIGN:
        loom_compress_sign_decode(c, wire, out, add);
        break;
    case LOOM_COMPRESS_INT8:
        loom_compress_int8_decode(c, wire, out, add);
        break;
    case LOOM_COMPRESS_BF16:
        loom_compress_bf16_decode(c, wire, out, add);
        break;
    default:
        loom_fatal("loom_compressor_decode: a compressing powersgd matrix has no wire format");
    }
}

void loom_compressor_decode_add(const loom_compressor *c, const void *wire, float *out) {
    decode(c, wire, out, 1);
}

void loom_compressor_decode(const loom_compressor *c, const void *wire, float *out) {
    decode(c, wire, out, 0);
}

/* ---- steps and state ----------------------------------------------------------------------- */

double loom_compressor_residual_sq(const loom_compressor *c) {
    return c->residual.floats ? c->residual_sq : 0;
}

void loom_compressor_commit(loom_compressor *c, int accept) {
    if (accept && c->dirty) {
        compress_state *states[2] = {&c->residual, &c->q};
        for (int i = 0; i < 2; i++) {
            float *t = states[i]->committed;
            states[i]->committed = states[i]->working;
            states[i]->working = t;
        }
    }
    c->dirty = 0;
}

/* Which state entry i of the list is: 0 the residual (listed when kept), 1 the warm-start
 * factor (when kept). */
static int state_which(const loom_compressor *c, int i) {
    int count = loom_compressor_state_count(c);
    if (i < 0 || i >= count) loom_fatal("compressor state entry %d of %d", i, count);
    return c->residual.floats && i == 0 ? 0 : 1;
}

int loom_compressor_state_count(const loom_compressor *c) {
    return (c->residual.floats > 0) + (c->q.floats > 0);
}

const char *loom_compressor_state_name(const loom_compressor *c, int i) {
    return state_which(c, i) == 0 ? "residual" : "q";
}

size_t loom_compressor_state_floats(const loom_compressor *c, int i) {
    return state_which(c, i) == 0 ? c->residual.floats : c->q.floats;
}

float *loom_compressor_state_data(loom_compressor *c, int i) {
    return state_which(c, i) == 0 ? c->residual.committed : c->q.committed;
}

size_t loom_compressor_state_bytes(const loom_compressor *c) {
    return 2 * sizeof(float) * (c->residual.floats + c->q.floats);
}
