/*
 * test_shard.c — the sharding arithmetic in one process, no MPI: how the model is cut into
 * tensor-parallel shards and pipeline stages (loom_gpt_describe, loom_gpt_global_index,
 * loom_gpt_element_offset; which stage holds wte, wpe and the final LayerNorm, and that the owner
 * of every checkpoint slice holds it), how checkpoint slices map onto shards
 * (loom_checkpoint_save_fill and loom_checkpoint_load_take, driven the way the trainer drives them
 * but from every shard of a layout at once), and ZeRO-1's ranges (loom_zero_shard_of).
 *
 * Every check is against a reference computed here from first principles — Megatron's split
 * described in heads, MLP units and vocabulary rows, GPT-2's tensor shapes, the checkpoint's
 * documented slice order — never against the code's own earlier output.
 *
 * Not here: communication (tests/mpi_parallel.sh runs the real thing on 8 ranks) or the
 * model's maths (test_model.c).
 */
#include "check.h"
#include "loom/io.h"
#include "loom/model.h"
#include "loom/ops.h"
#include "loom/parallel.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STAGES 8

static const char *tmp;

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* ---- the reference ----------------------------------------------------------------------- */

static int ref_is_sharded(int k) {
    return k == LOOM_WTE || k == LOOM_QKVW || k == LOOM_QKVB || k == LOOM_ATTPROJW ||
           k == LOOM_FCW || k == LOOM_FCB || k == LOOM_FCPROJW || k == LOOM_LMHEAD;
}

static int ref_is_per_layer(int k) {
    return k != LOOM_WTE && k != LOOM_WPE && k != LOOM_LNFW && k != LOOM_LNFB && k != LOOM_LMHEAD;
}

/* Rows and columns of one layer of tensor k (the whole tensor for a global one) as one rank of
 * tensor parallelism tp holds it: (out, in) like nn.Linear; a vector is one row. */
static void ref_dims(const loom_gpt_config *c, int tp, int k, int64_t *rows, int64_t *cols) {
    int64_t C = c->channels, hs = C / c->num_heads, heads = c->num_heads / tp;
    int64_t units = 4 * C / tp; /* MLP hidden units of this rank */
    switch (k) {
    case LOOM_WTE:
    case LOOM_LMHEAD: /* (GPT-2's is wte: held by no stage) */
        *rows = c->padded_vocab_size / tp, *cols = C;
        break;
    case LOOM_WPE:
        *rows = c->max_seq_len, *cols = C;
        break;
    case LOOM_QKVW:
        *rows = 3 * heads * hs, *cols = C;
        break;
    case LOOM_QKVB:
        *rows = 3 * heads * hs, *cols = 1;
        break;
    case LOOM_ATTPROJW:
        *rows = C, *cols = heads * hs;
        break;
    case LOOM_FCW:
        *rows = units, *cols = C;
        break;
    case LOOM_FCB:
        *rows = units, *cols = 1;
        break;
    case LOOM_FCPROJW:
        *rows = C, *cols = units;
        break;
    default:
        *rows = 1, *cols = C;
        break; /* LayerNorms, row-parallel biases, lnf */
    }
}

static int64_t ref_layer_numel(const loom_gpt_config *c, int tp, int k) {
    int64_t rows, cols;
    ref_dims(c, tp, k, &rows, &cols);
    return rows * cols;
}

static int64_t ref_numel(const loom_gpt_config *c, int tp, int layers, int k) {
    return ref_layer_numel(c, tp, k) * (ref_is_per_layer(k) ? layers : 1);
}

/* Whether stage s of `stages` holds tensor k: its blocks always; wte where it is used, as the
 * first stage's lookup and the last stage's tied LM head; wpe on the first; the final LayerNorm
 * on the last. (One stage is both and holds everything.) */
static int ref_stage_holds(int stages, int s, int k) {
    int first = s == 0, last = s == stages - 1;
    if (ref_is_per_layer(k)) return 1;
    if (k == LOOM_WTE) return first || last;
    if (k == LOOM_WPE) return first;
    if (k == LOOM_LMHEAD) return 0; /* GPT-2 ties it to wte */
    return last;                    /* lnfw, lnfb */
}

/* Where local element i of tensor k of a shard (rank r of tp, stage from first_layer) sits in
 * the unsharded tensor (llm.c order, layers outermost), by Megatron's rules:
 *   qkvw, qkvb  column-parallel: rank r holds heads [r NH/tp, (r+1) NH/tp) of each of Q, K, V;
 *   attprojw    row-parallel: the input columns of those same heads;
 *   fcw, fcb    column-parallel: MLP units [r 4C/tp, (r+1) 4C/tp);
 *   fcprojw     row-parallel: the input columns of those units;
 *   wte         vocabulary-parallel: rows [r Vp/tp, (r+1) Vp/tp);
 *   the rest is replicated. */
static int64_t ref_global_index(const loom_gpt_config *c, int tp, int r, int first_layer, int k,
                                int64_t i) {
    int64_t C = c->channels, hs = C / c->num_heads, heads = c->num_heads / tp;
    int64_t rows, cols, grows, gcols;
    ref_dims(c, tp, k, &rows, &cols);
    ref_dims(c, 1, k, &grows, &gcols);
    int64_t layer = i / (rows * cols), row = i % (rows * cols) / cols, col = i % cols;
    if (ref_is_per_layer(k)) layer += first_layer;
    int64_t grow = row, gcol = col;
    switch (k) {
    case LOOM_WTE:
        grow = r * rows + row;
        break;
    case LOOM_QKVW:
    case LOOM_QKVB: {
        int64_t part = row / (heads * hs); /* 0 Q, 1 K, 2 V */
        int64_t head = r * heads + row % (heads * hs) / hs;
        grow = part * C + head * hs + row % hs;
        break;
    }
    case LOOM_ATTPROJW:
        gcol = (r * heads + col / hs) * hs + col % hs;
        break;
    case LOOM_FCW:
    case LOOM_FCB:
        grow = r * rows + row;
        break;
    case LOOM_FCPROJW:
        gcol = r * cols + col;
        break;
    default:
        break;
    }
    return (layer * grows + grow) * gcols + gcol;
}

/* ---- the layouts under test -------------------------------------------------------------- */

typedef struct {
    int count;              /* pipeline stages */
    int layers[MAX_STAGES]; /* blocks per stage */
} stage_split;

typedef struct {
    const char *name;
    loom_gpt_config config;
    int num_tps;
    int tps[4];
    int num_splits;
    stage_split splits[6];
} shard_case;

/* config: {maxT, V, Vp (0: padded to 128), L, NH, C}; every tensor under 65536 elements, so
 * that the round trip's values stay exact in float */
static const shard_case cases[] = {
    {"4 layers, V 257 -> Vp 384",
     {.max_seq_len = 16,
      .vocab_size = 257,
      .padded_vocab_size = 0,
      .num_layers = 4,
      .num_heads = 4,
      .channels = 32},
     3,
     {1, 2, 4},
     5,
     {{1, {4}}, {2, {2, 2}}, {2, {1, 3}}, {2, {3, 1}}, {4, {1, 1, 1, 1}}}},
    {"5 layers, V 257 -> Vp 384",
     {.max_seq_len = 16,
      .vocab_size = 257,
      .padded_vocab_size = 0,
      .num_layers = 5,
      .num_heads = 4,
      .channels = 32},
     3,
     {1, 2, 4},
     6,
     {{1, {5}}, {2, {2, 3}}, {2, {3, 2}}, {3, {1, 2, 2}}, {3, {2, 2, 1}}, {5, {1, 1, 1, 1, 1}}}},
    /* tp 4: the last rank holds 32 rows, only 4 of them real */
    {"V 100 -> Vp 128",
     {.max_seq_len = 8,
      .vocab_size = 100,
      .padded_vocab_size = 0,
      .num_layers = 2,
      .num_heads = 4,
      .channels = 32},
     3,
     {1, 2, 4},
     2,
     {{1, {2}}, {2, {1, 1}}}},
    /* Vp given: 13 rows per rank at tp 4, not a multiple of 128; one head per rank */
    {"V 50, Vp 52 given",
     {.max_seq_len = 8,
      .vocab_size = 50,
      .padded_vocab_size = 52,
      .num_layers = 3,
      .num_heads = 4,
      .channels = 16},
     3,
     {1, 2, 4},
     2,
     {{1, {3}}, {2, {1, 2}}}},
    /* odd tensor parallelism; tp 6: one head and 64 vocabulary rows per rank */
    {"tp 3 and 6, V 300 -> Vp 384",
     {.max_seq_len = 8,
      .vocab_size = 300,
      .padded_vocab_size = 0,
      .num_layers = 3,
      .num_heads = 6,
      .channels = 48},
     3,
     {1, 3, 6},
     3,
     {{1, {3}}, {3, {1, 1, 1}}, {2, {2, 1}}}},
};
#define NUM_CASES ((int)(sizeof cases / sizeof cases[0]))

/* One way of cutting a model: tp ranks by stages, every shard described. */
typedef struct {
    loom_gpt_config config; /* padded vocabulary filled in */
    int tp, stages;
    int first[MAX_STAGES], end[MAX_STAGES];
    loom_gpt *shards; /* (stages, tp), stage-major */
    loom_gpt full;    /* the unsharded model */
    char label[160];
} layout;

static loom_gpt *shard_at(const layout *lo, int s, int r) {
    return &lo->shards[s * lo->tp + r];
}

/* Describes every shard; 0 (and a failed check) when the code refuses one. */
static int layout_init(layout *lo, const shard_case *sc, int tp, const stage_split *split) {
    memset(lo, 0, sizeof *lo);
    lo->config = sc->config;
    if (!lo->config.padded_vocab_size) {
        lo->config.padded_vocab_size = (lo->config.vocab_size + 127) / 128 * 128;
    }
    lo->tp = tp;
    lo->stages = split->count;
    int n = snprintf(lo->label, sizeof lo->label, "%s, tp %d, stages [", sc->name, tp);
    for (int s = 0, at = 0; s < split->count; s++) {
        lo->first[s] = at;
        at += split->layers[s];
        lo->end[s] = at;
        n += snprintf(lo->label + n, sizeof lo->label - (size_t)n, "%s%d", s ? "," : "",
                      split->layers[s]);
    }
    snprintf(lo->label + n, sizeof lo->label - (size_t)n, "]");
    lo->shards = xcalloc((size_t)(tp * lo->stages), sizeof *lo->shards);
    loom_gpt_shard whole = {.first_layer = 0,
                            .end_layer = lo->config.num_layers,
                            .tp_size = 1,
                            .tp_rank = 0,
                            .tp_comm = NULL};
    loom_status st = loom_gpt_describe(&lo->full, &lo->config, &whole);
    CHECK(st == LOOM_OK, "%s: describe the whole model: %s", lo->label, loom_last_error());
    if (st != LOOM_OK) return 0;
    for (int s = 0; s < lo->stages; s++) {
        for (int r = 0; r < tp; r++) {
            loom_gpt_shard shard = {.first_layer = lo->first[s],
                                    .end_layer = lo->end[s],
                                    .tp_size = tp,
                                    .tp_rank = r,
                                    .tp_comm = NULL};
            st = loom_gpt_describe(shard_at(lo, s, r), &lo->config, &shard);
            CHECK(st == LOOM_OK, "%s: describe stage %d rank %d: %s", lo->label, s, r,
                  loom_last_error());
            if (st != LOOM_OK) return 0;
        }
    }
    return 1;
}

static void layout_free(layout *lo) {
    free(lo->shards);
    lo->shards = NULL;
}

/* The stage that owns a checkpoint slice: its layer's; the embeddings the first, lnf the last.
 * (The last stage's wte is a copy: the tied LM head; the owner's is the one saved.) */
static int ref_owner_stage(const layout *lo, int k, int layer) {
    for (int s = 0; s < lo->stages; s++)
        if (layer >= lo->first[s] && layer < lo->end[s]) return s;
    return (k == LOOM_WTE || k == LOOM_WPE) ? 0 : lo->stages - 1;
}

static int stage_owns_tensor(const layout *lo, int s, int k) {
    if (ref_is_per_layer(k)) return 1;
    return ref_owner_stage(lo, k, -1) == s;
}

/* ---- 1. shards tile every tensor; replicated tensors are the same on every rank ---------- */

static void check_shard_fields(const layout *lo, int s, int r) {
    const loom_gpt *m = shard_at(lo, s, r);
    const loom_gpt_config *c = &lo->config;
    int rows = c->padded_vocab_size / lo->tp, start = r * rows;
    int real = c->vocab_size - start < 0 ? 0 : c->vocab_size - start;
    if (real > rows) real = rows;
    CHECK(m->first_layer == lo->first[s] && m->num_local_layers == lo->end[s] - lo->first[s] &&
              m->has_embedding == (s == 0) && m->has_head == (s == lo->stages - 1) &&
              m->tp_size == lo->tp && m->tp_rank == r,
          "%s: stage %d rank %d: layers [%d,+%d) embedding %d head %d tp %d/%d", lo->label, s, r,
          m->first_layer, m->num_local_layers, m->has_embedding, m->has_head, m->tp_rank,
          m->tp_size);
    CHECK(m->vocab_start == start && m->vocab_local == real,
          "%s: stage %d rank %d: vocabulary rows from %d, %d real; expected from %d, %d real",
          lo->label, s, r, m->vocab_start, m->vocab_local, start, real);
    int64_t held = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &m->info[k];
        int layers = lo->end[s] - lo->first[s], holds = ref_stage_holds(lo->stages, s, k);
        int64_t numel = holds ? ref_numel(c, lo->tp, layers, k) : 0;
        int64_t layer_numel = holds ? ref_layer_numel(c, lo->tp, k) : 0;
        CHECK(ti->numel == numel && ti->layer_numel == layer_numel &&
                  ti->per_layer == ref_is_per_layer(k),
              "%s: stage %d rank %d: %s has %lld elements (%lld per layer, per_layer %d); "
              "expected %lld (%lld)",
              lo->label, s, r, ti->name, (long long)ti->numel, (long long)ti->layer_numel,
              ti->per_layer, (long long)numel, (long long)layer_numel);
        held += numel;
    }
    CHECK((int64_t)m->num_params == held, "%s: stage %d rank %d: %zu parameters, held %lld",
          lo->label, s, r, m->num_params, (long long)held);
}

static void check_permutation(const layout *lo) {
    const loom_gpt_config *c = &lo->config;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        if (lo->full.info[k].numel == 0) continue; /* GPT-2's untied head: none */
        int64_t total = ref_numel(c, 1, c->num_layers, k);
        int *counts = xcalloc((size_t)total, sizeof *counts);
        int64_t out_of_range = 0, differs = 0, first_differs = -1;
        for (int s = 0; s < lo->stages; s++) {
            if (!stage_owns_tensor(lo, s, k)) continue;
            const loom_gpt *rank0 = shard_at(lo, s, 0);
            for (int r = 0; r < lo->tp; r++) {
                const loom_gpt *m = shard_at(lo, s, r);
                for (int64_t i = 0; i < m->info[k].numel; i++) {
                    int64_t g = loom_gpt_global_index(m, k, i);
                    if (g < 0 || g >= total) {
                        out_of_range++;
                        continue;
                    }
                    counts[g]++;
                    if (!ref_is_sharded(k) && g != loom_gpt_global_index(rank0, k, i)) {
                        if (differs++ == 0) first_differs = i;
                    }
                }
            }
        }
        int expected = ref_is_sharded(k) ? 1 : lo->tp;
        int64_t wrong = 0, first_wrong = -1;
        for (int64_t g = 0; g < total; g++) {
            if (counts[g] != expected && wrong++ == 0) first_wrong = g;
        }
        CHECK(out_of_range == 0 && wrong == 0,
              "%s: %s: %lld indices out of range; %lld of %lld elements not held %d times "
              "(first %lld, held %d times)",
              lo->label, lo->full.info[k].name, (long long)out_of_range, (long long)wrong,
              (long long)total, expected, (long long)first_wrong,
              first_wrong >= 0 ? counts[first_wrong] : 0);
        CHECK(differs == 0,
              "%s: replicated %s differs between tp ranks at %lld local elements "
              "(first %lld)",
              lo->label, lo->full.info[k].name, (long long)differs, (long long)first_differs);
        free(counts);
    }
}

/* ---- 2. the Megatron slicing itself, element by element ---------------------------------- */

static void check_against_reference(const layout *lo) {
    for (int s = 0; s < lo->stages; s++) {
        for (int r = 0; r < lo->tp; r++) {
            const loom_gpt *m = shard_at(lo, s, r);
            for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
                int64_t wrong = 0, first = -1, got = 0, want = 0;
                for (int64_t i = 0; i < m->info[k].numel; i++) {
                    int64_t g = loom_gpt_global_index(m, k, i);
                    int64_t e = ref_global_index(&lo->config, lo->tp, r, lo->first[s], k, i);
                    if (g != e && wrong++ == 0) first = i, got = g, want = e;
                }
                CHECK(wrong == 0,
                      "%s: stage %d rank %d: %s: %lld elements misplaced; local %lld went to "
                      "%lld, expected %lld",
                      lo->label, s, r, m->info[k].name, (long long)wrong, (long long)first,
                      (long long)got, (long long)want);
            }
        }
    }
}

/* A few elements worked out by hand, so the reference above is not the only witness. Model:
 * C 32, NH 4 (head size 8), 4 layers, Vp 384. */
static void check_by_hand(void) {
    loom_gpt_config c = {.max_seq_len = 16,
                         .vocab_size = 257,
                         .padded_vocab_size = 0,
                         .num_layers = 4,
                         .num_heads = 4,
                         .channels = 32};
    struct {
        int first, end, tp, r, k;
        int64_t local, global;
        const char *why;
    } cases_by_hand[] = {
        /* tp 2 rank 1: heads 2, 3 = channels 16..31 of Q, K and V */
        {0, 4, 2, 1, LOOM_QKVW, 0, 16 * 32, "first Q row of head 2"},
        {0, 4, 2, 1, LOOM_QKVW, 16 * 32 + 5, 48 * 32 + 5, "K row of head 2 (global row 32+16)"},
        {0, 4, 2, 1, LOOM_QKVW, 48 * 32, 96 * 32 + 16 * 32, "layer 1's first Q row"},
        {0, 4, 2, 1, LOOM_QKVB, 40, 2 * 32 + 24, "V bias of channel 24"},
        {0, 4, 2, 1, LOOM_ATTPROJW, 3 * 16 + 7, 3 * 32 + 23, "row 3, input column 16+7"},
        {0, 4, 2, 1, LOOM_FCW, 0, 64 * 32, "first of units 64..127"},
        {0, 4, 2, 1, LOOM_FCB, 10, 74, "unit 64+10"},
        {0, 4, 2, 1, LOOM_FCPROJW, 2 * 64 + 5, 2 * 128 + 69, "row 2, input column 64+5"},
        {0, 4, 2, 1, LOOM_WTE, 33, 193 * 32 + 1, "vocabulary row 192+1, column 1"},
        {0, 4, 2, 1, LOOM_ATTPROJB, 7, 7, "replicated"},
        /* tp 4 rank 3: head 3 = channels 24..31 */
        {0, 4, 4, 3, LOOM_QKVW, 8 * 32, 56 * 32, "K row of head 3 (global row 32+24)"},
        {0, 4, 4, 3, LOOM_QKVB, 23, 64 + 31, "last V bias"},
        {0, 4, 4, 3, LOOM_WTE, 0, 288 * 32, "vocabulary row 288"},
        /* stage of layers [1, 4), tp 2 rank 0: local layer 0 is layer 1 */
        {1, 4, 2, 0, LOOM_LN1W, 3, 32 + 3, "layer 1's ln1w[3]"},
        {1, 4, 2, 0, LOOM_QKVW, 0, 96 * 32, "layer 1's first Q row"},
        {1, 4, 2, 0, LOOM_FCPROJW, 64 + 1, 4096 + 1 * 128 + 1, "layer 1, row 1, column 1"},
        {0, 2, 2, 1, LOOM_WPE, 100, 100, "wpe, whole on the first stage"},
        /* the last stage's tied LM head: the same vocabulary rows as the first stage's wte */
        {2, 4, 2, 1, LOOM_WTE, 33, 193 * 32 + 1, "tied wte: vocabulary row 192+1, column 1"},
    };
    for (size_t i = 0; i < sizeof cases_by_hand / sizeof cases_by_hand[0]; i++) {
        loom_gpt m;
        loom_gpt_shard shard = {.first_layer = cases_by_hand[i].first,
                                .end_layer = cases_by_hand[i].end,
                                .tp_size = cases_by_hand[i].tp,
                                .tp_rank = cases_by_hand[i].r,
                                .tp_comm = NULL};
        loom_status st = loom_gpt_describe(&m, &c, &shard);
        int64_t g = st == LOOM_OK
                        ? loom_gpt_global_index(&m, cases_by_hand[i].k, cases_by_hand[i].local)
                        : -1;
        CHECK(g == cases_by_hand[i].global,
              "tp %d rank %d, layers [%d,%d): %s: local %lld -> %lld, "
              "expected %lld",
              cases_by_hand[i].tp, cases_by_hand[i].r, cases_by_hand[i].first, cases_by_hand[i].end,
              cases_by_hand[i].why, (long long)cases_by_hand[i].local, (long long)g,
              (long long)cases_by_hand[i].global);
    }
    CHECK(ref_global_index(&c, 2, 1, 0, LOOM_QKVW, 16 * 32 + 5) == 48 * 32 + 5,
          "the reference agrees with the hand-worked K row");
}

static void check_sharded_set(void) {
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        CHECK(!loom_gpt_tensor_is_sharded(k) == !ref_is_sharded(k),
              "tensor %d: sharded %d, expected %d", k, loom_gpt_tensor_is_sharded(k),
              ref_is_sharded(k));
    }
}

/* Shards the code must refuse. */
static void check_refusals(void) {
    loom_gpt m;
    loom_gpt_config c = {.max_seq_len = 16,
                         .vocab_size = 50,
                         .padded_vocab_size = 50,
                         .num_layers = 4,
                         .num_heads = 4,
                         .channels = 32};
    struct {
        int first, end, tp, r;
        const char *why;
    } bad[] = {
        {0, 4, 4, 0, "tp 4 does not divide Vp 50"},
        {0, 4, 3, 0, "tp 3 does not divide 4 heads"},
        {2, 2, 1, 0, "empty stage"},
        {0, 5, 1, 0, "stage past the last layer"},
        {-1, 2, 1, 0, "stage before the first layer"},
        {0, 4, 2, 2, "tp rank out of range"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_gpt_shard shard = {.first_layer = bad[i].first,
                                .end_layer = bad[i].end,
                                .tp_size = bad[i].tp,
                                .tp_rank = bad[i].r,
                                .tp_comm = NULL};
        CHECK(loom_gpt_describe(&m, &c, &shard) == LOOM_ERR_INPUT, "not refused: %s", bad[i].why);
    }
}

/* ---- 3. local offsets tile the flat buffer ----------------------------------------------- */

/* Returns whether the shard's offsets tile its buffer (the round trip relies on it). */
static int check_offsets(const layout *lo, int s, int r) {
    const loom_gpt *m = shard_at(lo, s, r);
    const loom_gpt_config *c = &lo->config;
    int tp = lo->tp;
    int64_t layers = lo->end[s] - lo->first[s];
    /* layer-major: wte, wpe, the blocks (each tensor's layer slice in enum order), lnfw, lnfb,
     * each global tensor only where the stage holds it (taking no space elsewhere) */
    size_t want[LOOM_NUM_PARAM_TENSORS];
    size_t at = 0, block = 0;
    int stages = lo->stages;
    for (int k = LOOM_LN1W; k <= LOOM_FCPROJB; k++) block += (size_t)ref_layer_numel(c, tp, k);
    want[LOOM_WTE] = at;
    if (ref_stage_holds(stages, s, LOOM_WTE)) at += (size_t)ref_layer_numel(c, tp, LOOM_WTE);
    want[LOOM_WPE] = at;
    if (ref_stage_holds(stages, s, LOOM_WPE)) at += (size_t)ref_layer_numel(c, tp, LOOM_WPE);
    for (int k = LOOM_LN1W; k <= LOOM_FCPROJB; k++) {
        want[k] = at, at += (size_t)ref_layer_numel(c, tp, k);
    }
    at = want[LOOM_LN1W] + block * (size_t)layers;
    size_t lnf = ref_stage_holds(stages, s, LOOM_LNFW) ? (size_t)c->channels : 0;
    want[LOOM_LNFW] = at, at += lnf;
    want[LOOM_LNFB] = at, at += lnf;
    want[LOOM_LMHEAD] = at; /* GPT-2's is wte: no space */
    CHECK(m->num_params == at, "%s: stage %d rank %d: %zu parameters, expected %zu", lo->label, s,
          r, m->num_params, at);

    int *hits = xcalloc(m->num_params, sizeof *hits);
    int64_t outside = 0, misplaced = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &m->info[k];
        int64_t per = ref_layer_numel(c, tp, k);
        CHECK(ti->offset == want[k] && (!ref_is_per_layer(k) || ti->layer_stride == block),
              "%s: stage %d rank %d: %s at %zu stride %zu, expected %zu stride %zu", lo->label, s,
              r, ti->name, ti->offset, ti->layer_stride, want[k], block);
        for (int64_t i = 0; i < ti->numel; i++) {
            size_t off = loom_gpt_element_offset(ti, i);
            if (off != want[k] + (size_t)(i / per) * block + (size_t)(i % per)) misplaced++;
            if (off >= m->num_params) {
                outside++;
                continue;
            }
            hits[off]++;
        }
    }
    int64_t gaps = 0, overlaps = 0;
    for (size_t o = 0; o < m->num_params; o++) gaps += hits[o] == 0, overlaps += hits[o] > 1;
    CHECK(outside == 0 && gaps == 0 && overlaps == 0 && misplaced == 0,
          "%s: stage %d rank %d: offsets: %lld outside, %lld gaps, %lld overlaps, %lld misplaced",
          lo->label, s, r, (long long)outside, (long long)gaps, (long long)overlaps,
          (long long)misplaced);
    free(hits);
    return m->num_params == at && outside == 0 && gaps == 0 && overlaps == 0 && misplaced == 0;
}

/* ---- 3b. a created shard: segments and pointers for what it holds, nothing else ----------- */

/* Never used for communication: creating a shard of tp > 1 only needs a communicator. */
static char unused_comm;

static void check_created(const layout *lo, int s, int r) {
    loom_gpt *m = NULL;
    loom_gpt_shard shard = {.first_layer = lo->first[s],
                            .end_layer = lo->end[s],
                            .tp_size = lo->tp,
                            .tp_rank = r,
                            .tp_comm = lo->tp > 1 ? (loom_comm *)(void *)&unused_comm : NULL};
    loom_status st = loom_gpt_create_shard(&m, &lo->config, loom_backend_cpu(), &shard);
    CHECK(st == LOOM_OK, "%s: create stage %d rank %d: %s", lo->label, s, r, loom_last_error());
    if (st != LOOM_OK) return;
    int layers = lo->end[s] - lo->first[s];
    /* segments: in buffer order, tiling it, one per held tensor and layer */
    size_t at = 0;
    int tiled = 1, count[LOOM_NUM_PARAM_TENSORS] = {0};
    for (int i = 0; i < m->num_segments; i++) {
        const loom_gpt_segment *seg = &m->segments[i];
        tiled &= seg->offset == at && seg->numel > 0;
        at += (size_t)seg->numel;
        count[seg->tensor]++;
    }
    CHECK(tiled && at == m->num_params, "%s: stage %d rank %d: segments do not tile the buffer",
          lo->label, s, r);
    const float *pointers[LOOM_NUM_PARAM_TENSORS] = {
        m->params.wte,     m->params.wpe,     m->params.ln1w,     m->params.ln1b,
        m->params.qkvw,    m->params.qkvb,    m->params.attprojw, m->params.attprojb,
        m->params.ln2w,    m->params.ln2b,    m->params.fcw,      m->params.fcb,
        m->params.fcprojw, m->params.fcprojb, m->params.lnfw,     m->params.lnfb};
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        int holds = ref_stage_holds(lo->stages, s, k);
        int want = holds ? (ref_is_per_layer(k) ? layers : 1) : 0;
        CHECK(count[k] == want, "%s: stage %d rank %d: %s has %d segments, expected %d", lo->label,
              s, r, m->info[k].name, count[k], want);
        const float *expected = holds ? m->params_memory + m->info[k].offset : NULL;
        CHECK(pointers[k] == expected, "%s: stage %d rank %d: params.%s %s", lo->label, s, r,
              m->info[k].name, holds ? "not at its offset" : "not NULL on a stage without it");
    }
    loom_gpt_free(m);
}

/* The owner of every checkpoint slice (loom_mesh_owner_rank, the trainer's rule) holds it
 * whole; a global tensor held elsewhere is only the last stage's tied wte, which maps to the
 * same vocabulary rows as the first stage's. */
static void check_ownership(const layout *lo) {
    loom_plan_stage stages[MAX_STAGES];
    for (int s = 0; s < lo->stages; s++) {
        stages[s] =
            (loom_plan_stage){lo->first[s], lo->end[s], s == 0, s == lo->stages - 1, 0, s, 0};
    }
    loom_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.model = lo->config;
    plan.tp = lo->tp, plan.pp = lo->stages, plan.dp = 1;
    plan.stages = stages, plan.num_stages = lo->stages;
    loom_mesh mesh;
    memset(&mesh, 0, sizeof mesh);
    mesh.plan = &plan;
    mesh.tp_size = lo->tp, mesh.pp_size = lo->stages, mesh.dp_size = 1;
    const loom_gpt_config *c = &lo->config;
    int64_t unowned = 0, stray = 0, untied = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        if (lo->full.info[k].numel == 0) continue; /* GPT-2's untied head: none */
        int per_layer = ref_is_per_layer(k);
        for (int layer = per_layer ? 0 : -1; layer < (per_layer ? c->num_layers : 0); layer++) {
            int owner = loom_mesh_owner_rank(&mesh, k, layer);
            for (int r = 0; r < lo->tp; r++) {
                unowned +=
                    shard_at(lo, owner, r)->info[k].layer_numel != ref_layer_numel(c, lo->tp, k);
            }
            for (int s = 0; s < lo->stages && !per_layer; s++) {
                if (s == owner) continue;
                for (int r = 0; r < lo->tp; r++) {
                    const loom_gpt *copy = shard_at(lo, s, r), *own = shard_at(lo, owner, r);
                    if (copy->info[k].numel == 0) continue;
                    if (k != LOOM_WTE || s != lo->stages - 1) {
                        stray++;
                        continue;
                    }
                    for (int64_t i = 0; i < copy->info[k].numel; i++) {
                        untied +=
                            loom_gpt_global_index(copy, k, i) != loom_gpt_global_index(own, k, i);
                    }
                }
            }
        }
    }
    CHECK(unowned == 0 && stray == 0 && untied == 0,
          "%s: %lld slices whose owner lacks them, %lld copies of global tensors off their "
          "stages, %lld tied wte elements on other rows",
          lo->label, (long long)unowned, (long long)stray, (long long)untied);
}

/* ---- 4. checkpoint slices: assembled from shards, taken back into shards ----------------- */

/* A distinct, exactly representable value per (buffer, tensor, logical element). */
static float value_of(int b, int k, int64_t g) {
    return (float)((int64_t)(b * LOOM_NUM_PARAM_TENSORS + k) * 65536 + g);
}

/* What a load must give back: the value, except the padded vocabulary rows, which are not
 * stored and come back zero. */
static float loaded_value(const loom_gpt_config *c, int b, int k, int64_t g) {
    if (k == LOOM_WTE && g >= (int64_t)c->vocab_size * c->channels) return 0.0f;
    return value_of(b, k, g);
}

/* The documented file order: wte, wpe, each layer's 12 tensors in enum order, lnfw, lnfb. */
static int ref_slices(const loom_gpt_config *c, int *tensors, int *layers) {
    int n = 0;
    tensors[n] = LOOM_WTE, layers[n++] = -1;
    tensors[n] = LOOM_WPE, layers[n++] = -1;
    for (int l = 0; l < c->num_layers; l++)
        for (int k = LOOM_LN1W; k <= LOOM_FCPROJB; k++) tensors[n] = k, layers[n++] = l;
    tensors[n] = LOOM_LNFW, layers[n++] = -1;
    tensors[n] = LOOM_LNFB, layers[n++] = -1;
    return n;
}

typedef struct {
    const layout *lo;
    float **local[3]; /* per shard (stage-major), its three buffers in the local layout */
    float *slice;     /* fill: one unsharded slice, assembled */
    int *tensors, *layers, count; /* the expected slice order */
    int next;                     /* calls so far */
    int64_t order_errors, index_errors, holes;
} slice_run;

/* Each call must be the next slice in file order, buffers 0, 1, 2 in turn. */
static void expect_next(slice_run *run, int b, int k, int layer) {
    int i = run->next++;
    if (i >= 3 * run->count || b != i / run->count || k != run->tensors[i % run->count] ||
        layer != run->layers[i % run->count]) {
        run->order_errors++;
    }
}

/* Like the trainer's stream_fill, in one process: the owner stage's tp ranks each place their
 * part (a replicated tensor: rank 0's) by loom_gpt_global_index. */
static const float *fill_from_shards(void *ctx, int b, int k, int layer) {
    slice_run *run = ctx;
    const layout *lo = run->lo;
    expect_next(run, b, k, layer);
    int64_t full_n = lo->full.info[k].layer_numel;
    for (int64_t j = 0; j < full_n; j++) run->slice[j] = NAN;
    int s = ref_owner_stage(lo, k, layer);
    int parts = ref_is_sharded(k) ? lo->tp : 1;
    for (int r = 0; r < parts; r++) {
        const loom_gpt *m = shard_at(lo, s, r);
        const loom_gpt_tensor_info *li = &m->info[k];
        int64_t n = li->layer_numel, local_layer = layer >= 0 ? layer - m->first_layer : 0;
        const float *src =
            run->local[b][s * lo->tp + r] + li->offset + (size_t)local_layer * li->layer_stride;
        int64_t shift = layer >= 0 ? layer * full_n : 0;
        for (int64_t j = 0; j < n; j++) {
            int64_t g = loom_gpt_global_index(m, k, local_layer * n + j) - shift;
            if (g < 0 || g >= full_n) {
                run->index_errors++;
                continue;
            }
            run->slice[g] = src[j];
        }
    }
    for (int64_t j = 0; j < full_n; j++) run->holes += run->slice[j] != run->slice[j];
    return run->slice;
}

/* Like the trainer's take_slice, for every shard of the layout at once: each keeps its part. */
static loom_status take_into_shards(void *ctx, int b, int k, int layer, const float *slice) {
    slice_run *run = ctx;
    const layout *lo = run->lo;
    expect_next(run, b, k, layer);
    int64_t full_n = lo->full.info[k].layer_numel;
    for (int s = 0; s < lo->stages; s++) {
        if (layer >= 0 && (layer < lo->first[s] || layer >= lo->end[s])) continue;
        for (int r = 0; r < lo->tp; r++) {
            const loom_gpt *m = shard_at(lo, s, r);
            const loom_gpt_tensor_info *li = &m->info[k];
            int64_t n = li->layer_numel, local_layer = layer >= 0 ? layer - m->first_layer : 0;
            float *dst =
                run->local[b][s * lo->tp + r] + li->offset + (size_t)local_layer * li->layer_stride;
            int64_t shift = layer >= 0 ? layer * full_n : 0;
            for (int64_t j = 0; j < n; j++) {
                int64_t g = loom_gpt_global_index(m, k, local_layer * n + j) - shift;
                if (g < 0 || g >= full_n) {
                    run->index_errors++;
                    continue;
                }
                dst[j] = slice[g];
            }
        }
    }
    return LOOM_OK;
}

/* Every shard's buffers against the reference; `stored` uses loaded_value (after a load). */
static int64_t count_wrong_locals(const layout *lo, float **local[3], int stored) {
    int64_t wrong = 0;
    for (int s = 0; s < lo->stages; s++) {
        for (int r = 0; r < lo->tp; r++) {
            const loom_gpt *m = shard_at(lo, s, r);
            for (int b = 0; b < 3; b++) {
                const float *buf = local[b][s * lo->tp + r];
                for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
                    for (int64_t i = 0; i < m->info[k].numel; i++) {
                        int64_t g = ref_global_index(&lo->config, lo->tp, r, lo->first[s], k, i);
                        float want =
                            stored ? loaded_value(&lo->config, b, k, g) : value_of(b, k, g);
                        wrong += buf[loom_gpt_element_offset(&m->info[k], i)] != want;
                    }
                }
            }
        }
    }
    return wrong;
}

/* The files hold the whole model: a plain load must give every logical element its value. */
static void check_plain_load(const layout *lo, const char *dir, const loom_ckpt_state *saved) {
    loom_gpt *model;
    loom_status st = loom_gpt_create(&model, &lo->config, loom_backend_cpu());
    CHECK(st == LOOM_OK, "%s: create the whole model: %s", lo->label, loom_last_error());
    if (st != LOOM_OK) return;
    float *m = xcalloc(model->num_params, sizeof(float)),
          *v = xcalloc(model->num_params, sizeof(float));
    loom_ckpt_state state;
    memset(&state, 0, sizeof state);
    st = loom_checkpoint_load(dir, model, m, v, &state);
    CHECK(st == LOOM_OK, "%s: plain load: %s", lo->label, loom_last_error());
    const float *bufs[3] = {model->params_memory, m, v};
    int64_t wrong = 0;
    for (int b = 0; b < 3 && st == LOOM_OK; b++) {
        for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
            for (int64_t g = 0; g < model->info[k].numel; g++) {
                size_t off = loom_gpt_element_offset(&model->info[k], g);
                wrong +=
                    off >= model->num_params || bufs[b][off] != loaded_value(&lo->config, b, k, g);
            }
        }
    }
    CHECK(st == LOOM_OK && wrong == 0, "%s: plain load: %lld elements differ from the model",
          lo->label, (long long)wrong);
    CHECK(state.step == saved->step && state.data_index == saved->data_index &&
              state.rng_state == saved->rng_state && state.skipped_total == saved->skipped_total,
          "%s: loop state did not survive", lo->label);
    free(m), free(v);
    loom_gpt_free(model);
}

static float **alloc_locals(const layout *lo) {
    float **bufs = xcalloc((size_t)(lo->stages * lo->tp), sizeof *bufs);
    for (int i = 0; i < lo->stages * lo->tp; i++) {
        bufs[i] = xcalloc(lo->shards[i].num_params, sizeof(float));
    }
    return bufs;
}

static void free_locals(const layout *lo, float **bufs) {
    for (int i = 0; i < lo->stages * lo->tp; i++) free(bufs[i]);
    free(bufs);
}

/* Sets every shard's buffers to the model's values, placed by the reference. */
static void fill_locals(const layout *lo, float **local[3]) {
    for (int s = 0; s < lo->stages; s++) {
        for (int r = 0; r < lo->tp; r++) {
            const loom_gpt *m = shard_at(lo, s, r);
            for (int b = 0; b < 3; b++) {
                for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
                    for (int64_t i = 0; i < m->info[k].numel; i++) {
                        int64_t g = ref_global_index(&lo->config, lo->tp, r, lo->first[s], k, i);
                        local[b][s * lo->tp + r][loom_gpt_element_offset(&m->info[k], i)] =
                            value_of(b, k, g);
                    }
                }
            }
        }
    }
}

/* Reads the checkpoint in dir back into poisoned shard buffers (anything not written shows). */
static void check_take(slice_run *run, const char *dir, const loom_ckpt_state *saved) {
    const layout *lo = run->lo;
    for (int b = 0; b < 3; b++) {
        for (int i = 0; i < lo->stages * lo->tp; i++) {
            for (size_t o = 0; o < lo->shards[i].num_params; o++) run->local[b][i][o] = NAN;
        }
    }
    run->next = 0;
    run->order_errors = run->index_errors = 0;
    loom_ckpt_state back;
    memset(&back, 0, sizeof back);
    loom_status st = loom_checkpoint_load_take(dir, &lo->full, take_into_shards, run, &back);
    CHECK(st == LOOM_OK, "%s: load_take: %s", lo->label, loom_last_error());
    CHECK(run->next == 3 * run->count && run->order_errors == 0,
          "%s: take got %d slices, %lld out of file order (expected %d)", lo->label, run->next,
          (long long)run->order_errors, 3 * run->count);
    CHECK(run->index_errors == 0, "%s: take: %lld indices outside the slice", lo->label,
          (long long)run->index_errors);
    int64_t wrong = count_wrong_locals(lo, run->local, 1);
    CHECK(wrong == 0, "%s: load_take: %lld local elements differ from the model", lo->label,
          (long long)wrong);
    CHECK(back.step == saved->step && back.data_epoch == saved->data_epoch &&
              back.rng_state == saved->rng_state && back.skipped_total == saved->skipped_total,
          "%s: load_take: loop state did not survive", lo->label);
}

/* Saves the layout's shards through save_fill, then loads the files whole and into shards. */
static void check_round_trip(const layout *lo, int id) {
    const loom_gpt_config *c = &lo->config;
    int64_t largest = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        if (ref_numel(c, 1, c->num_layers, k) >= 65536) {
            fprintf(stderr, "%s: too large for exact values\n", lo->label);
            exit(1);
        }
        if (ref_layer_numel(c, 1, k) > largest) largest = ref_layer_numel(c, 1, k);
    }
    size_t most = 4 + 12 * (size_t)c->num_layers;
    slice_run run;
    memset(&run, 0, sizeof run);
    run.lo = lo;
    run.tensors = xcalloc(most, sizeof(int));
    run.layers = xcalloc(most, sizeof(int));
    run.count = ref_slices(c, run.tensors, run.layers);
    run.slice = xcalloc((size_t)largest, sizeof(float));
    for (int b = 0; b < 3; b++) run.local[b] = alloc_locals(lo);
    fill_locals(lo, run.local);
    CHECK(count_wrong_locals(lo, run.local, 0) == 0, "%s: shards set up", lo->label);

    char out[1200], dir[1400];
    snprintf(out, sizeof out, "%s/layout_%d", tmp, id);
    loom_ckpt_state state = {7 + id, 1, 123, 0x5eed + (uint64_t)id, 0, 2, "", "", "", ""};
    loom_status st = loom_checkpoint_save_fill(out, &lo->full, fill_from_shards, &run, &state);
    CHECK(st == LOOM_OK, "%s: save_fill: %s", lo->label, loom_last_error());
    CHECK(run.next == 3 * run.count && run.order_errors == 0,
          "%s: fill asked for %d slices, %lld out of file order (expected %d)", lo->label, run.next,
          (long long)run.order_errors, 3 * run.count);
    CHECK(run.index_errors == 0 && run.holes == 0,
          "%s: fill: %lld indices outside the slice, %lld slice elements no shard supplied",
          lo->label, (long long)run.index_errors, (long long)run.holes);
    if (st == LOOM_OK) {
        st = loom_checkpoint_resolve(out, dir, sizeof dir);
        CHECK(st == LOOM_OK, "%s: resolve: %s", lo->label, loom_last_error());
    }
    if (st == LOOM_OK) {
        check_plain_load(lo, dir, &state);
        check_take(&run, dir, &state);
    }
    for (int b = 0; b < 3; b++) free_locals(lo, run.local[b]);
    free(run.tensors), free(run.layers), free(run.slice);
}

static void check_slice_order(void) {
    const loom_gpt_config *c = &cases[1].config;
    size_t most = 4 + 12 * (size_t)c->num_layers;
    int *tensors = xcalloc(most, sizeof(int)), *layers = xcalloc(most, sizeof(int));
    int *want_t = xcalloc(most, sizeof(int)), *want_l = xcalloc(most, sizeof(int));
    int n = loom_checkpoint_slices(c, tensors, layers), want = ref_slices(c, want_t, want_l);
    int same = n == want;
    for (int i = 0; same && i < n; i++) same = tensors[i] == want_t[i] && layers[i] == want_l[i];
    CHECK(same, "loom_checkpoint_slices: %d slices, expected %d in file order", n, want);
    free(tensors), free(layers), free(want_t), free(want_l);
}

/* ---- 5. ZeRO-1 ranges -------------------------------------------------------------------- */

static void check_zero_shards(void) {
    const size_t counts[] = {0,
                             1,
                             2,
                             3,
                             5,
                             7,
                             8,
                             9,
                             15,
                             16,
                             17,
                             63,
                             64,
                             65,
                             100,
                             127,
                             128,
                             129,
                             999,
                             1000,
                             4095,
                             4096,
                             4097,
                             12345,
                             123457,
                             (size_t)1 << 40,
                             ((size_t)1 << 40) + 3};
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        size_t count = counts[ci];
        int marked = count <= ((size_t)1 << 20);
        for (int dp = 1; dp <= 8; dp++) {
            unsigned char *hits = marked ? xcalloc(count, 1) : NULL;
            int bad = 0;
            size_t prev_end = 0;
            loom_zero_shard z0 = loom_zero_shard_of(count, dp, 0);
            size_t udp = (size_t)dp;
            /* the least multiple of dp that holds count */
            bad += z0.padded_count % udp != 0 || z0.padded_count < count ||
                   z0.padded_count >= count + udp || z0.shard * udp != z0.padded_count;
            for (int r = 0; r < dp; r++) {
                loom_zero_shard z = loom_zero_shard_of(count, dp, r);
                size_t lo = (size_t)r * z0.shard, hi = lo + z0.shard;
                lo = lo < count ? lo : count, hi = hi < count ? hi : count;
                bad += z.padded_count != z0.padded_count || z.shard != z0.shard;
                bad += z.begin != lo || z.end != hi; /* [r shard, (r+1) shard) within the data */
                bad += z.begin != prev_end;          /* contiguous, in rank order */
                bad += (size_t)r * z0.shard >= count && z.begin != z.end; /* beyond: empty */
                prev_end = z.end;
                for (size_t i = z.begin; marked && i < z.end && i < count; i++) hits[i]++;
            }
            bad += prev_end != count;
            for (size_t i = 0; marked && i < count; i++) bad += hits[i] != 1;
            CHECK(bad == 0, "zero shards of %zu over dp %d: %d violations (padded %zu, shard %zu)",
                  count, dp, bad, z0.padded_count, z0.shard);
            free(hits);
        }
    }
    /* 3 elements over 8 ranks: one each for ranks 0..2, nothing for 3..7 */
    loom_zero_shard z2 = loom_zero_shard_of(3, 8, 2), z5 = loom_zero_shard_of(3, 8, 5);
    CHECK(z2.padded_count == 8 && z2.shard == 1 && z2.begin == 2 && z2.end == 3,
          "3 over 8, rank 2: [%zu, %zu) of %zu", z2.begin, z2.end, z2.padded_count);
    CHECK(z5.begin == 3 && z5.end == 3, "3 over 8, rank 5: [%zu, %zu)", z5.begin, z5.end);
    /* 10 over 4: shards of 3 -> [0,3) [3,6) [6,9) [9,10) */
    loom_zero_shard z3 = loom_zero_shard_of(10, 4, 3);
    CHECK(z3.padded_count == 12 && z3.shard == 3 && z3.begin == 9 && z3.end == 10,
          "10 over 4, rank 3: [%zu, %zu) of %zu", z3.begin, z3.end, z3.padded_count);
}

int main(void) {
    tmp = check_tmpdir();
    check_sharded_set();
    check_by_hand();
    check_refusals();
    check_slice_order();
    int id = 0;
    for (int ci = 0; ci < NUM_CASES; ci++) {
        const shard_case *sc = &cases[ci];
        for (int ti = 0; ti < sc->num_tps; ti++) {
            for (int si = 0; si < sc->num_splits; si++) {
                layout lo;
                if (layout_init(&lo, sc, sc->tps[ti], &sc->splits[si])) {
                    int tiled = 1;
                    for (int s = 0; s < lo.stages; s++) {
                        for (int r = 0; r < lo.tp; r++) {
                            check_shard_fields(&lo, s, r);
                            tiled &= check_offsets(&lo, s, r);
                            check_created(&lo, s, r);
                        }
                    }
                    check_permutation(&lo);
                    check_against_reference(&lo);
                    check_ownership(&lo);
                    /* broken offsets would send the round trip outside its buffers */
                    if (tiled) check_round_trip(&lo, id++);
                }
                layout_free(&lo);
            }
        }
    }
    check_zero_shards();
    return check_finish();
}
