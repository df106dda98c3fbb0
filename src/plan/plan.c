/*
 * plan.c — the plan in memory: defaults, copies, the rules every plan must satisfy, the
 * uniform (even-split) plan and the plan of a request, and the Megatron rank layout.
 *
 * Every rule reports its first violation as "SOURCE: JSON.PATH: expected ..., got ...", with
 * the path of the plan-file field, so that one message serves a plan read from a file and one
 * built from flags. Reading and writing the file is plan_file.c; the compression flags are
 * compression_flags.c.
 *
 * Not here: choosing a plan by cost (the planner proper).
 */
#include "plan/plan_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- words ---------------------------------------------------------------------------------- */

static const char *const schedule_words[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};
static const char *const policy_words[] = {"all", "epilogue", "slack"};
static const char *const embedding_sync_words[] = {"separate", "fused"};

static const char *const recompute_words[] = {"none", "needed", "always", "selective"};
static const char *const zero3_gather_words[] = {"micro_batch", "step"};

const loom_words loom_plan_schedules = {schedule_words, LOOM_SCHEDULE_NUM_KINDS};
const loom_words loom_plan_policies = {policy_words, LOOM_PP_POLICY_COUNT};
const loom_words loom_plan_embedding_syncs = {embedding_sync_words, LOOM_EMBEDDING_SYNC_COUNT};
const loom_words loom_plan_recomputes = {recompute_words, LOOM_RECOMPUTE_COUNT};
const loom_words loom_plan_zero3_gathers = {zero3_gather_words, LOOM_ZERO3_GATHER_COUNT};

loom_status loom_schedule_kind_parse(const char *name, const char *source, const char *field,
                                     loom_schedule_kind *kind) {
    int index = 0;
    loom_status st = loom_word_parse(&loom_plan_schedules, name, source, field, &index);
    if (st == LOOM_OK) *kind = (loom_schedule_kind)index;
    return st;
}

const char *loom_schedule_kind_name(loom_schedule_kind kind) {
    return loom_word_name(&loom_plan_schedules, (int)kind);
}
const char *loom_pp_policy_name(loom_pp_policy policy) {
    return loom_word_name(&loom_plan_policies, (int)policy);
}
const char *loom_embedding_sync_name(loom_embedding_sync sync) {
    return loom_word_name(&loom_plan_embedding_syncs, (int)sync);
}
const char *loom_recompute_name(int recompute) {
    return loom_word_name(&loom_plan_recomputes, recompute);
}
int loom_recompute_parse(const char *word) {
    return word ? loom_word_index(&loom_plan_recomputes, word) : -1;
}
const char *loom_zero3_gather_name(loom_zero3_gather gather) {
    return loom_word_name(&loom_plan_zero3_gathers, (int)gather);
}

int loom_plan_method_has_rank(loom_compress_method method) {
    return method == LOOM_COMPRESS_POWERSGD || method == LOOM_COMPRESS_LOWRANK;
}

int loom_plan_default_rank(loom_compress_method method) {
    return method == LOOM_COMPRESS_POWERSGD  ? LOOM_PLAN_DEFAULT_DP_RANK
           : method == LOOM_COMPRESS_LOWRANK ? LOOM_PLAN_DEFAULT_PP_RANK
                                             : 0;
}

/* ---- life cycle ----------------------------------------------------------------------------- */

void loom_plan_compressor_init(loom_plan_compressor *c) {
    memset(c, 0, sizeof *c);
    c->method = c->forward = LOOM_COMPRESS_NONE;
    c->fraction = LOOM_PLAN_DEFAULT_TOPK_FRACTION;
    c->error_feedback = 1, c->lazy_error = 1;
    c->policy = LOOM_PP_POLICY_ALL;
}

void loom_plan_compressor_free(loom_plan_compressor *c) {
    free(c->stages);
    loom_plan_compressor_init(c);
}

void loom_plan_init(loom_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->schedule = LOOM_SCHEDULE_1F1B;
    plan->virtual_stages = 1;
    loom_plan_compressor_init(&plan->dp_compression);
    loom_plan_compressor_init(&plan->pp_compression);
    plan->embedding_sync = LOOM_EMBEDDING_SYNC_SEPARATE;
    plan->precision = LOOM_PRECISION_FP32;
    plan->overlap_grad_reduce = 1;
    plan->zero3_prefetch = 1;
    plan->zero3_gather = LOOM_ZERO3_GATHER_MICRO_BATCH;
    loom_plan_islands_init(&plan->islands);
}

void loom_plan_free(loom_plan *plan) {
    free(plan->stages);
    free(plan->dp_compression.stages);
    free(plan->pp_compression.stages);
    free(plan->predicted_peak_bytes);
    loom_plan_init(plan);
}

/* A copy of `count` elements of `size` bytes (NULL for none). */
static loom_status dup_array(void **dst, const void *src, int count, size_t size,
                             const char *what) {
    *dst = NULL;
    if (count <= 0 || !src) return LOOM_OK;
    *dst = loom_malloc((size_t)count * size, what);
    if (!*dst) return LOOM_ERR_NOMEM;
    memcpy(*dst, src, (size_t)count * size);
    return LOOM_OK;
}

/* A deep copy into dst (overwritten, not freed). */
static loom_status compressor_copy(loom_plan_compressor *dst, const loom_plan_compressor *src) {
    *dst = *src;
    return dup_array((void **)&dst->stages, src->stages, src->num_stages, sizeof *src->stages,
                     "plan compression stages");
}

loom_status loom_plan_copy(loom_plan *dst, const loom_plan *src) {
    *dst = *src;
    dst->stages = NULL;
    dst->dp_compression.stages = NULL;
    dst->pp_compression.stages = NULL;
    dst->predicted_peak_bytes = NULL;
    loom_status st = dup_array((void **)&dst->stages, src->stages, src->num_stages,
                               sizeof *src->stages, "plan stages");
    if (st == LOOM_OK) st = compressor_copy(&dst->dp_compression, &src->dp_compression);
    if (st == LOOM_OK) st = compressor_copy(&dst->pp_compression, &src->pp_compression);
    if (st == LOOM_OK) {
        st = dup_array((void **)&dst->predicted_peak_bytes, src->predicted_peak_bytes,
                       src->num_predicted_peak, sizeof(int64_t), "plan predictions");
    }
    if (st != LOOM_OK) loom_plan_free(dst);
    return st;
}

/* ---- the rules ------------------------------------------------------------------------------ */

/* An enum field's value, one of `words` (in the enum's order). */
static loom_status check_enum(const char *source, const char *path, int value,
                              const loom_words *words) {
    if (value >= 0 && value < words->count) return LOOM_OK;
    char list[128];
    loom_word_list(words, list, sizeof list);
    return loom_fail_field(source, path, "expected %s, got the value %d", list, value);
}

static loom_status check_model(const loom_gpt_config *m, const char *source) {
    loom_gpt_config copy = *m;
    loom_status st = loom_gpt_config_check_shape(&copy, source, "model.");
    int padded = loom_gpt_pad_vocab(m->vocab_size);
    if (st == LOOM_OK && m->padded_vocab_size != padded) { /* only a plan filled in by hand */
        return loom_fail_field(source, "model.vocab",
                               "expected padded_vocab_size %d (vocab %d rounded up to a "
                               "multiple of 128), got %d",
                               padded, m->vocab_size, m->padded_vocab_size);
    }
    return st;
}

static loom_status check_batch(const loom_plan *p, const char *source) {
    if (p->micro_batch <= 0) {
        return loom_fail_field(source, "batch.micro", "expected a positive integer, got %d",
                               p->micro_batch);
    }
    if (p->global_batch <= 0) {
        return loom_fail_field(source, "batch.global", "expected a positive integer, got %d",
                               p->global_batch);
    }
    loom_status st = check_enum(source, "batch.schedule", (int)p->schedule, &loom_plan_schedules);
    if (st != LOOM_OK) return st;
    const char *schedule = loom_schedule_kind_name(p->schedule);
    int fixed = loom_plan_schedule_chunks(p->schedule), v = p->virtual_stages;
    if (fixed > 0 && v != fixed) {
        return loom_fail_field(source, "batch.virtual_stages",
                               "expected %d for schedule \"%s\" (%s), got %d", fixed, schedule,
                               fixed == 1 ? "one model chunk per pipeline rank"
                                          : "its V runs two model chunks on every rank",
                               v);
    }
    if (fixed == 0 && v < 2) {
        return loom_fail_field(source, "batch.virtual_stages",
                               "expected at least 2 for schedule \"%s\" (model chunks per "
                               "pipeline rank; one chunk is 1f1b), got %d",
                               schedule, v);
    }
    return LOOM_OK;
}

static loom_status check_mesh(const loom_plan *p, const char *source, int world_size) {
    const struct {
        const char *path;
        int value;
    } sizes[] = {{"mesh.dp", p->dp}, {"mesh.tp", p->tp}, {"mesh.pp", p->pp}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].value <= 0) {
            return loom_fail_field(source, sizes[i].path, "expected a positive integer, got %d",
                                   sizes[i].value);
        }
    }
    if (p->zero < 0 || p->zero > 3) {
        return loom_fail_field(source, "mesh.zero", "expected a ZeRO stage 0, 1, 2 or 3, got %d",
                               p->zero);
    }
    if (p->zero3_prefetch < 0 || p->zero3_prefetch > LOOM_ZERO3_MAX_PREFETCH) {
        return loom_fail_field(source, "mesh.zero3_prefetch",
                               "expected 0 to %d units gathered ahead, got %d",
                               LOOM_ZERO3_MAX_PREFETCH, p->zero3_prefetch);
    }
    loom_status checked =
        check_enum(source, "mesh.zero3_gather", (int)p->zero3_gather, &loom_plan_zero3_gathers);
    if (checked != LOOM_OK) return checked;
    if (p->zero > 1 && p->dp_compression.method != LOOM_COMPRESS_NONE &&
        p->dp_compression.method != LOOM_COMPRESS_INT8 &&
        p->dp_compression.method != LOOM_COMPRESS_BF16) {
        /* ZeRO-2/3 sum each unit's gradients by the quantised reduce-scatter (qreduce.c), whose
         * owners add the replicas' quantised blocks: only formats that sum entry by entry fit */
        static const char *const why[LOOM_COMPRESS_COUNT] = {
            [LOOM_COMPRESS_POWERSGD] = "PowerSGD allreduces low-rank factors of whole matrices "
                                       "in two rounds and every replica keeps the whole "
                                       "approximation, not a reduce-scatter of shards",
            [LOOM_COMPRESS_TOPK] = "top-k keeps different entries on every replica, so its "
                                   "wires are all-gathered whole and summed by every replica, "
                                   "not reduce-scattered to the shards' owners",
            [LOOM_COMPRESS_SIGN] = "sign's one scale per tensor needs every replica's whole "
                                   "wire, all-gathered and summed by every replica, not "
                                   "reduce-scattered to the shards' owners"};
        const char *reason = why[p->dp_compression.method];
        return loom_fail_field(source, "compression.dp.method",
                               "%s with mesh.zero %d: not run (%s); ZeRO-2/3 compress their "
                               "reduce-scatters as int8 or bf16, or use mesh.zero 0 or 1 for "
                               "%s; expected none, int8 or bf16, got \"%s\"",
                               loom_compress_method_name(p->dp_compression.method), p->zero,
                               reason ? reason : "not a format the reduce-scatter sums",
                               loom_compress_method_name(p->dp_compression.method),
                               loom_compress_method_name(p->dp_compression.method));
    }
    if (p->zero > 1 && p->embedding_sync == LOOM_EMBEDDING_SYNC_FUSED) {
        return loom_fail_field(source, "compression.embedding_sync",
                               "expected \"separate\" with mesh.zero %d (ZeRO-2/3 sum the tied "
                               "embedding's two copies before reducing its shards; the fused sum "
                               "over every replica is for mesh.zero 0 or 1), got \"fused\"",
                               p->zero);
    }
    if (p->sequence_parallel && p->tp < 2) {
        return loom_fail_field(source, "mesh.sequence_parallel",
                               "expected false with mesh.tp %d (sequence parallelism shards the "
                               "sequence over the tensor-parallel ranks: it needs tp > 1)",
                               p->tp);
    }
    int64_t ranks = (int64_t)p->dp * p->tp * p->pp, islands = loom_plan_num_islands(p);
    if (world_size > 0 && ranks * islands != world_size) {
        if (p->islands.count > 0) {
            return loom_fail_field(
                source, "islands.count",
                "expected islands x dp*tp*pp to equal the %d ranks "
                "launched, got %" PRId64 " x %d*%d*%d = %" PRId64
                " (the world must be a multiple of the island's %" PRId64 " ranks)",
                world_size, islands, p->dp, p->tp, p->pp, ranks * islands, ranks);
        }
        return loom_fail_field(source, "mesh",
                               "expected dp*tp*pp to equal the %d ranks launched, got "
                               "%d*%d*%d = %" PRId64 " (the ranks this plan needs)",
                               world_size, p->dp, p->tp, p->pp, ranks);
    }
    if (ranks > INT_MAX) {
        return loom_fail_field(source, "mesh",
                               "expected dp*tp*pp of at most %d ranks, got %d*%d*%d = %" PRId64,
                               INT_MAX, p->dp, p->tp, p->pp, ranks);
    }
    const loom_gpt_config *m = &p->model;
    loom_status st = loom_gpt_check_tp(m, p->tp, source, "mesh.tp", "model.");
    if (st != LOOM_OK) return st;
    int64_t virtual_stages = (int64_t)p->pp * p->virtual_stages;
    if (p->virtual_stages == 1 && p->pp > m->num_layers) {
        return loom_fail_field(source, "mesh.pp",
                               "expected at most model.layers %d stages (one layer each at "
                               "least), got %d",
                               m->num_layers, p->pp);
    }
    if (virtual_stages > m->num_layers) {
        return loom_fail_field(source, "mesh.pp",
                               "expected at most model.layers %d virtual stages (one layer "
                               "each at least), got mesh.pp x batch.virtual_stages = %d x "
                               "%d = %" PRId64,
                               m->num_layers, p->pp, p->virtual_stages, virtual_stages);
    }
    int64_t per_step = (int64_t)p->micro_batch * p->dp * islands;
    if (p->global_batch % per_step != 0) {
        if (islands > 1) {
            return loom_fail_field(source, "batch.global",
                                   "expected a multiple of batch.micro * mesh.dp * "
                                   "islands.count = %d*%d*%" PRId64 " = %" PRId64
                                   " (every island trains global / islands.count sequences a "
                                   "step), got %d",
                                   p->micro_batch, p->dp, islands, per_step, p->global_batch);
        }
        return loom_fail_field(source, "batch.global",
                               "expected a multiple of batch.micro * mesh.dp = %d*%d = %" PRId64
                               ", got %d",
                               p->micro_batch, p->dp, per_step, p->global_batch);
    }
    /* Megatron's interleaved schedule runs the micro-batches in groups of pp per chunk */
    int micro_batches = loom_plan_num_micro_batches(p);
    if (p->schedule == LOOM_SCHEDULE_INTERLEAVED && micro_batches % p->pp != 0) {
        return loom_fail_field(source, "batch.global",
                               "expected a multiple of batch.micro * mesh.dp * mesh.pp = "
                               "%d*%d*%d = %" PRId64 " with schedule \"interleaved\" (its "
                               "micro-batches per step must be a multiple of mesh.pp, "
                               "Megatron's rule), got %d (%d micro-batches)",
                               p->micro_batch, p->dp, p->pp, per_step * p->pp, p->global_batch,
                               micro_batches);
    }
    return LOOM_OK;
}

static loom_status check_stage_flag(const char *source, int index, const char *key, int value,
                                    int expected, const char *why) {
    if ((value != 0) == expected) return LOOM_OK;
    char path[64];
    snprintf(path, sizeof path, "stages[%d].%s", index, key);
    return loom_fail_field(source, path, "expected %s (%s), got %s", expected ? "true" : "false",
                           why, value ? "true" : "false");
}

/* stages[i] as its schedule needs it: rank and chunk where the schedule places virtual stage i
 * (loom_plan_place), and no recompute when the backward is split into B and W. */
static loom_status check_stage_schedule(const loom_plan *p, const char *source, int i) {
    const loom_plan_stage *s = &p->stages[i];
    int rank, chunk;
    loom_plan_place(p->schedule, p->pp, p->virtual_stages, i, &rank, &chunk);
    const char *what = p->virtual_stages > 1 ? "virtual stage" : "stage";
    char path[64];
    if (s->rank != rank) {
        snprintf(path, sizeof path, "stages[%d].rank", i);
        return loom_fail_field(source, path,
                               "expected %d (%s places %s %d of %d on rank %d), "
                               "got %d",
                               rank, loom_schedule_kind_name(p->schedule), what, i, p->num_stages,
                               rank, s->rank);
    }
    if (s->chunk != chunk) {
        snprintf(path, sizeof path, "stages[%d].chunk", i);
        return loom_fail_field(source, path,
                               "expected %d (%s runs %s %d of %d as chunk %d of rank %d), "
                               "got %d",
                               chunk, loom_schedule_kind_name(p->schedule), what, i, p->num_stages,
                               chunk, rank, s->chunk);
    }
    return LOOM_OK;
}

/* A stage's recomputation is a word, and the executor keeps one recomputation choice per rank,
 * so a rank's virtual stages must agree on it (its chunk 0 is virtual stage `rank` in every
 * placement). */
static loom_status check_stage_recompute(const loom_plan *p, const char *source, int i) {
    const loom_plan_stage *s = &p->stages[i];
    char path[64];
    snprintf(path, sizeof path, "stages[%d].recompute", i);
    loom_status st = check_enum(source, path, s->recompute, &loom_plan_recomputes);
    if (st != LOOM_OK || s->rank < 0 || s->rank >= p->num_stages) return st;
    const loom_plan_stage *first = &p->stages[s->rank];
    if (s->recompute != first->recompute) {
        return loom_fail_field(source, path,
                               "expected \"%s\", as stages[%d] (pipeline rank %d runs both and "
                               "recomputes all its chunks the same way), got \"%s\"",
                               loom_recompute_name(first->recompute), s->rank, s->rank,
                               loom_recompute_name(s->recompute));
    }
    return LOOM_OK;
}

static loom_status check_stages(const loom_plan *p, const char *source) {
    int expected = p->pp * p->virtual_stages; /* at most the layers (check_mesh) */
    if (p->num_stages != expected || (p->num_stages > 0 && !p->stages)) {
        int got = p->stages ? p->num_stages : 0;
        if (p->virtual_stages == 1) {
            return loom_fail_field(source, "stages", "expected mesh.pp = %d stages, got %d", p->pp,
                                   got);
        }
        return loom_fail_field(source, "stages",
                               "expected mesh.pp x batch.virtual_stages = %d x %d = %d "
                               "virtual stages, got %d",
                               p->pp, p->virtual_stages, expected, got);
    }
    int last = p->num_stages - 1;
    for (int i = 0; i < p->num_stages; i++) {
        const loom_plan_stage *s = &p->stages[i];
        char path[64];
        snprintf(path, sizeof path, "stages[%d].layers", i);
        if (s->first_layer >= s->end_layer) {
            return loom_fail_field(source, path,
                                   "expected [start, end) with start < end, got [%d, %d]",
                                   s->first_layer, s->end_layer);
        }
        if (i == 0 && s->first_layer != 0) {
            return loom_fail_field(source, path,
                                   "expected the first stage to start at layer 0, got [%d, %d]",
                                   s->first_layer, s->end_layer);
        }
        if (i > 0 && s->first_layer != p->stages[i - 1].end_layer) {
            return loom_fail_field(source, path,
                                   "expected to start where stages[%d] ends (layer %d), got "
                                   "[%d, %d]",
                                   i - 1, p->stages[i - 1].end_layer, s->first_layer, s->end_layer);
        }
        if (i == last && s->end_layer != p->model.num_layers) {
            return loom_fail_field(source, path,
                                   "expected the last stage to end at model.layers %d, got "
                                   "[%d, %d]",
                                   p->model.num_layers, s->first_layer, s->end_layer);
        }
        loom_status st = check_stage_flag(source, i, "embedding", s->embedding, i == 0,
                                          i == 0 ? "the first stage runs the embedding"
                                                 : "only the first stage runs the embedding");
        if (st != LOOM_OK) return st;
        st = check_stage_flag(source, i, "head", s->head, i == last,
                              i == last ? "the last stage runs the head"
                                        : "only the last stage runs the head");
        if (st == LOOM_OK) st = check_stage_schedule(p, source, i);
        if (st == LOOM_OK) st = check_stage_recompute(p, source, i);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

/* A method allowed in `place` (a LOOM_COMPRESS_FOR_* bit). */
static loom_status check_method(const char *source, const char *path, loom_compress_method method,
                                int place) {
    if ((int)method < 0 || method >= LOOM_COMPRESS_COUNT) {
        return loom_fail_field(source, path, "expected a compression method, got the value %d",
                               (int)method);
    }
    loom_compress_method parsed;
    return loom_compress_method_parse(loom_compress_method_name(method), place, source, path,
                                      &parsed);
}

/* rank and fraction, which only some methods have: the others keep the defaults, so that what
 * the file does not say is what the plan holds. */
static loom_status check_rank_and_fraction(const loom_plan_compressor *c, loom_compress_method m,
                                           const char *source, const char *where) {
    const char *name = loom_compress_method_name(m);
    char path[96];
    snprintf(path, sizeof path, "%s.rank", where);
    if (loom_plan_method_has_rank(m) && c->rank <= 0) {
        return loom_fail_field(source, path, "expected a positive rank for method \"%s\", got %d",
                               name, c->rank);
    }
    if (!loom_plan_method_has_rank(m) && c->rank != 0) {
        return loom_fail_field(source, path,
                               "expected no rank (0) for method \"%s\", which has none, got %d",
                               name, c->rank);
    }
    snprintf(path, sizeof path, "%s.fraction", where);
    if (m == LOOM_COMPRESS_TOPK && !(c->fraction > 0 && c->fraction <= 1)) {
        return loom_fail_field(
            source, path, "expected the share of entries kept, in (0, 1], got %g", c->fraction);
    }
    if (m != LOOM_COMPRESS_TOPK && c->fraction != LOOM_PLAN_DEFAULT_TOPK_FRACTION) {
        return loom_fail_field(source, path,
                               "expected no fraction for method \"%s\" (only topk keeps "
                               "one), got %g",
                               name, c->fraction);
    }
    return LOOM_OK;
}

/* where.key: distinct indices in [0, limit); `limit_why` says where the limit comes from. */
static loom_status check_indices(const loom_plan_compressor *c, const char *source,
                                 const char *where, const char *key, const char *item, int limit,
                                 const char *limit_why) {
    char path[96];
    snprintf(path, sizeof path, "%s.%s", where, key);
    if (c->num_stages < 0 || (c->num_stages > 0 && !c->stages)) {
        return loom_fail_field(source, path, "expected a list of %s indices, got %d of them", item,
                               c->num_stages);
    }
    for (int j = 0; j < c->num_stages; j++) {
        snprintf(path, sizeof path, "%s.%s[%d]", where, key, j);
        if (c->stages[j] < 0 || c->stages[j] >= limit) {
            return loom_fail_field(source, path, "expected a %s index in [0, %d) (%s), got %d",
                                   item, limit, limit_why, c->stages[j]);
        }
        for (int k = 0; k < j; k++) {
            if (c->stages[k] == c->stages[j]) {
                return loom_fail_field(source, path, "expected distinct %s indices, got %d again",
                                       item, c->stages[j]);
            }
        }
    }
    return LOOM_OK;
}

/* The fields of the other place have no key in the file under this compressor, so they must
 * hold their defaults (or the plan would not read back as it was written). */
static loom_status check_other_place(const loom_plan_compressor *c, const char *source, int is_pp) {
    if (!is_pp && !c->lazy_error) {
        return loom_fail_field(source, "compression.dp.lazy_error",
                               "expected true (the default; lazy error propagation is "
                               "compression.pp's), got false");
    }
    if (!is_pp && c->policy != LOOM_PP_POLICY_ALL) {
        return loom_fail_field(source, "compression.dp.policy",
                               "expected \"all\" (the default; the policy is "
                               "compression.pp's), got \"%s\"",
                               loom_pp_policy_name(c->policy));
    }
    if (!is_pp && c->forward != LOOM_COMPRESS_NONE) {
        return loom_fail_field(source, "compression.dp.forward",
                               "expected \"none\" (the default; forward compression is "
                               "compression.pp's), got \"%s\"",
                               loom_compress_method_name(c->forward));
    }
    if (is_pp && !c->error_feedback) {
        return loom_fail_field(source, "compression.pp.error_feedback",
                               "expected true (the default; error feedback is "
                               "compression.dp's, lazy_error is the pipeline's), got false");
    }
    if (is_pp && c->warmup_steps != 0) {
        return loom_fail_field(source, "compression.pp.warmup_steps",
                               "expected 0 (the default; warm-up is compression.dp's), "
                               "got %d",
                               c->warmup_steps);
    }
    return LOOM_OK;
}

static loom_status check_dp_compressor(const loom_plan *p, const char *source) {
    const loom_plan_compressor *c = &p->dp_compression;
    loom_compress_method m = c->method;
    loom_status st = check_method(source, "compression.dp.method", m, LOOM_COMPRESS_FOR_DP);
    if (st == LOOM_OK) st = check_rank_and_fraction(c, m, source, "compression.dp");
    if (st != LOOM_OK) return st;
    if (c->warmup_steps < 0) {
        return loom_fail_field(source, "compression.dp.warmup_steps",
                               "expected a number of steps >= 0, got %d", c->warmup_steps);
    }
    if (m == LOOM_COMPRESS_SIGN && !c->error_feedback) {
        return loom_fail_field(source, "compression.dp.error_feedback",
                               "sign compression needs error feedback (it does not converge "
                               "without it), got false");
    }
    char why[64];
    snprintf(why, sizeof why, "mesh.pp = %d", p->pp);
    st = check_indices(c, source, "compression.dp", "stages", "stage", p->pp, why);
    if (st == LOOM_OK) st = check_other_place(c, source, 0);
    return st;
}

static loom_status check_pp_compressor(const loom_plan *p, const char *source) {
    const loom_plan_compressor *c = &p->pp_compression;
    loom_compress_method m = c->method, forward = c->forward;
    loom_status st = check_method(source, "compression.pp.method", m, LOOM_COMPRESS_FOR_PP_GRAD);
    if (st != LOOM_OK) return st;
    int stages = p->pp * p->virtual_stages; /* links join neighbouring virtual stages */
    if (stages == 1 && m != LOOM_COMPRESS_NONE) {
        return loom_fail_field(source, "compression.pp.method",
                               "expected \"none\" with one pipeline stage, got \"%s\"",
                               loom_compress_method_name(m));
    }
    st = check_rank_and_fraction(c, m, source, "compression.pp");
    if (st == LOOM_OK) {
        st = check_enum(source, "compression.pp.policy", (int)c->policy, &loom_plan_policies);
    }
    if (st == LOOM_OK) {
        st = check_method(source, "compression.pp.forward", forward, LOOM_COMPRESS_FOR_PP_FORWARD);
    }
    if (st != LOOM_OK) return st;
    if (stages == 1 && forward != LOOM_COMPRESS_NONE) {
        return loom_fail_field(source, "compression.pp.forward",
                               "expected \"none\" with one pipeline stage, got \"%s\"",
                               loom_compress_method_name(forward));
    }
    char why[128];
    if (p->virtual_stages == 1) {
        snprintf(why, sizeof why, "link s joins stages s and s + 1 of mesh.pp = %d", p->pp);
    } else {
        snprintf(why, sizeof why,
                 "link s joins virtual stages s and s + 1 of mesh.pp x batch.virtual_stages = %d",
                 stages);
    }
    st = check_indices(c, source, "compression.pp", "links", "link", stages - 1, why);
    if (st == LOOM_OK) st = check_other_place(c, source, 1);
    return st;
}

static loom_status check_compression(const loom_plan *p, const char *source) {
    loom_status st = check_dp_compressor(p, source);
    if (st == LOOM_OK) st = check_pp_compressor(p, source);
    if (st == LOOM_OK) {
        st = check_enum(source, "compression.embedding_sync", (int)p->embedding_sync,
                        &loom_plan_embedding_syncs);
    }
    if (st == LOOM_OK && ((int)p->precision < 0 || p->precision >= LOOM_PRECISIONS)) {
        st = loom_fail_field(source, "precision",
                             "expected \"fp32\", \"bf16\" or \"fp16\", got the value %d",
                             (int)p->precision);
    }
    if (st == LOOM_OK && p->pp == 1 && p->embedding_sync == LOOM_EMBEDDING_SYNC_FUSED) {
        return loom_fail_field(source, "compression.embedding_sync",
                               "\"fused\" needs pipeline parallelism (pp > 1), got mesh.pp = "
                               "1");
    }
    return st;
}

static loom_status check_predicted(const loom_plan *p, const char *source) {
    if (p->predicted_seq_len < 0) {
        return loom_fail_field(source, "predicted.seq_len",
                               "expected a sequence length > 0 (or none), got %d",
                               p->predicted_seq_len);
    }
    if (!isfinite(p->predicted_step_s) || p->predicted_step_s < 0) {
        return loom_fail_field(source, "predicted.step_s", "expected a finite number >= 0, got %g",
                               p->predicted_step_s);
    }
    if (!isfinite(p->predicted_tokens_per_s) || p->predicted_tokens_per_s < 0) {
        return loom_fail_field(source, "predicted.tokens_per_s",
                               "expected a finite number >= 0, got %g", p->predicted_tokens_per_s);
    }
    if (p->num_predicted_peak < 0 || (p->num_predicted_peak > 0 && !p->predicted_peak_bytes)) {
        return loom_fail_field(source, "predicted.peak_bytes_per_rank",
                               "expected a list of byte counts, got %d of them",
                               p->num_predicted_peak);
    }
    for (int i = 0; i < p->num_predicted_peak; i++) {
        if (p->predicted_peak_bytes[i] < 0) {
            char path[64];
            snprintf(path, sizeof path, "predicted.peak_bytes_per_rank[%d]", i);
            return loom_fail_field(source, path, "expected a byte count >= 0, got %" PRId64,
                                   p->predicted_peak_bytes[i]);
        }
    }
    return LOOM_OK;
}

/* The rules that do not look at the stages (shared with loom_plan_uniform, which needs them
 * to hold before it can split the layers). */
static loom_status check_shape(const loom_plan *p, const char *source, int world_size) {
    loom_status st = check_model(&p->model, source);
    if (st == LOOM_OK) st = check_batch(p, source);
    if (st == LOOM_OK) st = check_mesh(p, source, world_size);
    return st;
}

loom_status loom_plan_check(const loom_plan *plan, const char *source, int world_size) {
    if (!source) source = "plan";
    loom_status st = check_shape(plan, source, world_size);
    if (st == LOOM_OK) st = check_stages(plan, source);
    if (st == LOOM_OK) st = check_compression(plan, source);
    if (st == LOOM_OK) st = loom_plan_check_islands(plan, source);
    if (st == LOOM_OK) st = check_predicted(plan, source);
    return st;
}

/* ---- building ------------------------------------------------------------------------------- */

/* "one per stage (mesh.pp = 2)" or "one per virtual stage (mesh.pp x batch.virtual_stages =
 * 2 x 2)", for the messages about the layer counts. */
static void stage_count_why(const loom_plan *plan, char *buf, size_t cap) {
    if (plan->virtual_stages == 1) {
        snprintf(buf, cap, "one per stage (mesh.pp = %d)", plan->pp);
    } else {
        snprintf(buf, cap, "one per virtual stage (mesh.pp x batch.virtual_stages = %d x %d)",
                 plan->pp, plan->virtual_stages);
    }
}

/* Parses "3,5" into the plan's pp * virtual_stages layer counts. */
static loom_status parse_stage_layers(const loom_plan *plan, const char *text, int *counts) {
    const char *source = "plan";
    int stages = plan->pp * plan->virtual_stages, layers = plan->model.num_layers;
    char why[128];
    stage_count_why(plan, why, sizeof why);
    int n = 0;
    int64_t sum = 0;
    const char *p = text;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        int bad_number = end == p || errno || v <= 0 || v > INT_MAX || (*end && *end != ',');
        if (bad_number || n >= stages) {
            return loom_fail_field(source, "stage_layers",
                                   "expected %d comma-separated positive layer counts, %s, "
                                   "got \"%s\"",
                                   stages, why, text);
        }
        counts[n++] = (int)v;
        sum += v;
        if (*end == '\0') break;
        p = end + 1;
    }
    if (n != stages) {
        return loom_fail_field(source, "stage_layers",
                               "expected %d comma-separated positive layer counts, %s, got "
                               "%d in \"%s\"",
                               stages, why, n, text);
    }
    if (sum != layers) {
        return loom_fail_field(source, "stage_layers",
                               "expected layer counts summing to model.layers %d, got \"%s\" "
                               "(sum %" PRId64 ")",
                               layers, text, sum);
    }
    return LOOM_OK;
}

/* The virtual stages in model order, each placed by the schedule (loom_plan_place). */
static loom_status build_stages(loom_plan *plan, const char *stage_layers) {
    int stages = plan->pp * plan->virtual_stages, layers = plan->model.num_layers;
    int *counts = loom_calloc((size_t)stages, sizeof *counts, "plan stage sizes");
    if (!counts) return LOOM_ERR_NOMEM;
    loom_status st = LOOM_OK;
    if (stage_layers && stage_layers[0]) {
        st = parse_stage_layers(plan, stage_layers, counts);
    } else {
        for (int i = 0; i < stages; i++)
            counts[i] = layers / stages + (i < layers % stages ? 1 : 0);
    }
    if (st == LOOM_OK) {
        plan->stages = loom_calloc((size_t)stages, sizeof *plan->stages, "plan stages");
        if (!plan->stages) st = LOOM_ERR_NOMEM;
    }
    if (st == LOOM_OK) {
        plan->num_stages = stages;
        int first = 0;
        for (int i = 0; i < stages; i++) {
            loom_plan_stage *s = &plan->stages[i];
            *s = (loom_plan_stage){.first_layer = first,
                                   .end_layer = first + counts[i],
                                   .embedding = i == 0,
                                   .head = i == stages - 1};
            loom_plan_place(plan->schedule, plan->pp, plan->virtual_stages, i, &s->rank, &s->chunk);
            first += counts[i];
        }
    }
    free(counts);
    return st;
}

/* v when none is asked for: the schedule's, LOOM_PLAN_DEFAULT_VIRTUAL_STAGES for interleaved,
 * and 1 for an unknown schedule (which the checks then name). */
static int default_virtual_stages(loom_schedule_kind schedule) {
    int fixed = loom_plan_schedule_chunks(schedule);
    return fixed > 0 ? fixed : fixed == 0 ? LOOM_PLAN_DEFAULT_VIRTUAL_STAGES : 1;
}

loom_status loom_plan_uniform(loom_plan *plan, const loom_gpt_config *model, int dp, int tp, int pp,
                              int micro_batch, int global_batch, loom_schedule_kind schedule,
                              int virtual_stages, const char *stage_layers) {
    loom_plan_init(plan);
    plan->model = *model;
    plan->model.padded_vocab_size = loom_gpt_pad_vocab(model->vocab_size);
    plan->dp = dp, plan->tp = tp, plan->pp = pp;
    plan->micro_batch = micro_batch, plan->global_batch = global_batch;
    plan->schedule = schedule;
    plan->virtual_stages = virtual_stages ? virtual_stages : default_virtual_stages(schedule);
    loom_status st = check_shape(plan, "plan", 0);
    if (st == LOOM_OK) st = build_stages(plan, stage_layers);
    if (st == LOOM_OK) st = loom_plan_check(plan, "plan", 0);
    if (st != LOOM_OK) loom_plan_free(plan);
    return st;
}

/* The request's compression into the plan (checked with the rest by loom_plan_check). */
static loom_status request_compression(loom_plan *plan, const loom_plan_request *r) {
    const char *sync = r->embedding_sync;
    if (sync && sync[0]) {
        int index = 0;
        loom_status st = loom_word_parse(&loom_plan_embedding_syncs, sync, "--embedding-sync",
                                         "compression.embedding_sync", &index);
        if (st != LOOM_OK) return st;
        plan->embedding_sync = (loom_embedding_sync)index;
    }
    loom_status st = LOOM_OK;
    if (r->dp_compression) {
        loom_plan_compressor_free(&plan->dp_compression);
        st = compressor_copy(&plan->dp_compression, r->dp_compression);
    }
    if (st == LOOM_OK && r->pp_compression) {
        loom_plan_compressor_free(&plan->pp_compression);
        st = compressor_copy(&plan->pp_compression, r->pp_compression);
    }
    return st;
}

/* The request's schedule with its virtual stages and recompute, refused by flag before the plan
 * is built (the plan's own rules would name batch.virtual_stages and stages[0].recompute). */
static loom_status request_schedule(const loom_plan_request *r, int pp, int layers,
                                    loom_schedule_kind *kind) {
    int given = r->schedule && r->schedule[0];
    const char *name = given ? r->schedule : "1f1b";
    loom_status st = loom_schedule_kind_parse(name, "--schedule", "batch.schedule", kind);
    if (st != LOOM_OK) return st;
    int fixed = loom_plan_schedule_chunks(*kind), v = r->virtual_stages;
    if (fixed > 0 && v != 0 && v != fixed) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--virtual-stages: expected %d with --schedule %s%s (%s), "
                         "got %d",
                         fixed, name, given ? "" : ", the default",
                         fixed == 1 ? "one model chunk per pipeline rank; --schedule interleaved "
                                      "takes more"
                                    : "its V runs two model chunks on every rank",
                         v);
    }
    if (fixed == 0 && v == 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--virtual-stages: expected at least 2 with --schedule interleaved "
                         "(model chunks per pipeline rank; one chunk is --schedule 1f1b), got 1");
    }
    if (fixed == 0 && v > 0 && pp <= layers && (int64_t)pp * v > layers) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--virtual-stages: expected at most %d with --pipeline-parallel %d (a "
                         "layer per virtual stage at least, of model.layers %d), got %d",
                         layers / pp, pp, layers, v);
    }
    return LOOM_OK;
}

/* Megatron's interleaved rule, micro-batches per step a multiple of pp, named by the flag that
 * set the batch. */
static loom_status request_interleaved_batch(const loom_plan_request *r, loom_schedule_kind kind,
                                             int pp, int micro, int dp, int64_t global) {
    if (kind != LOOM_SCHEDULE_INTERLEAVED) return LOOM_OK;
    int64_t per_replica = (int64_t)micro * dp, micro_batches = global / per_replica;
    if (micro_batches % pp == 0) return LOOM_OK;
    if (r->micro_batches > 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--micro-batches: expected a multiple of --pipeline-parallel %d with "
                         "--schedule interleaved (Megatron's rule), got %d",
                         pp, r->micro_batches);
    }
    return loom_fail(
        LOOM_ERR_INPUT,
        "--global-batch-size: expected a multiple of micro batch %d x data parallel "
        "%d x --pipeline-parallel %d = %lld with --schedule interleaved (micro-batches "
        "per step a multiple of the pipeline ranks, Megatron's rule), got %lld",
        micro, dp, pp, (long long)(per_replica * pp), (long long)global);
}

loom_status loom_plan_from_request(loom_plan *plan, const loom_gpt_config *model,
                                   const loom_plan_request *r, int world_size) {
    loom_plan_init(plan);
    int tp = r->tp ? r->tp : 1, pp = r->pp ? r->pp : 1, dp = r->dp;
    const struct {
        const char *flag;
        int value;
    } counts[] = {{"--data-parallel", r->dp},
                  {"--tensor-parallel", r->tp},
                  {"--pipeline-parallel", r->pp},
                  {"--micro-batch-size", r->micro_batch},
                  {"--global-batch-size", r->global_batch},
                  {"--micro-batches", r->micro_batches},
                  {"--virtual-stages", r->virtual_stages}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        if (counts[i].value < 0) {
            return loom_fail(LOOM_ERR_INPUT, "%s: expected a positive integer, got %d",
                             counts[i].flag, counts[i].value);
        }
    }
    loom_schedule_kind schedule = LOOM_SCHEDULE_1F1B;
    loom_status st = request_schedule(r, pp, model->num_layers, &schedule);
    if (st != LOOM_OK) return st;
    int micro = r->micro_batch ? r->micro_batch : LOOM_PLAN_DEFAULT_MICRO_BATCH;
    int islands = r->islands && r->islands->count > 0 ? r->islands->count : 1;
    int64_t model_parallel = (int64_t)tp * pp * islands;
    if (dp == 0 && world_size > 0) {
        if (world_size % model_parallel != 0) {
            return loom_fail(LOOM_ERR_INPUT,
                             "--tensor-parallel %d x --pipeline-parallel %d%s = %lld: expected "
                             "a divisor of the %d ranks launched (data parallel takes the rest)",
                             tp, pp, islands > 1 ? " x --islands" : "", (long long)model_parallel,
                             world_size);
        }
        dp = (int)(world_size / model_parallel);
    } else if (dp == 0) {
        dp = 1;
    }
    int64_t per_replica = (int64_t)micro * dp * islands, global = r->global_batch;
    if (r->micro_batches > 0) {
        int64_t implied = per_replica * r->micro_batches;
        if (global > 0 && global != implied) {
            return loom_fail(LOOM_ERR_INPUT,
                             "--global-batch-size %lld and --micro-batches %d disagree: micro "
                             "batch %d x %d micro-batches x data parallel %d = %lld",
                             (long long)global, r->micro_batches, micro, r->micro_batches, dp,
                             (long long)implied);
        }
        global = implied;
    } else if (global == 0) {
        global = per_replica * pp;
    }
    if (global % per_replica != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--global-batch-size: expected a multiple of micro batch %d x data "
                         "parallel %d%s = %lld, got %lld",
                         micro, dp, islands > 1 ? " x islands" : "", (long long)per_replica,
                         (long long)global);
    }
    if (global > INT_MAX) {
        return loom_fail(LOOM_ERR_INPUT, "--global-batch-size: expected at most %d, got %lld",
                         INT_MAX, (long long)global);
    }
    st = request_interleaved_batch(r, schedule, pp, micro, dp, global);
    if (st != LOOM_OK) return st;
    if (r->zero_given && (r->zero < 0 || r->zero > 3)) {
        return loom_fail(LOOM_ERR_INPUT, "--zero: expected a ZeRO stage 0, 1, 2 or 3, got %d",
                         r->zero);
    }
    st = loom_plan_uniform(plan, model, dp, tp, pp, micro, (int)global, schedule, r->virtual_stages,
                           r->stage_layers);
    if (st == LOOM_OK) st = request_compression(plan, r);
    if (st == LOOM_OK) {
        for (int i = 0; i < plan->num_stages; i++) plan->stages[i].recompute = r->recompute;
        plan->zero = r->zero_given ? r->zero : loom_plan_default_zero(plan);
        plan->zero3_prefetch = r->zero3_prefetch >= 0 ? r->zero3_prefetch : 1;
        plan->zero3_gather = r->zero3_gather;
        plan->sequence_parallel = r->sequence_parallel;
        plan->overlap_grad_reduce = !r->no_overlap_grad_reduce;
        if (r->islands) plan->islands = *r->islands;
        st = loom_plan_check(plan, "plan", world_size);
    }
    if (st != LOOM_OK) loom_plan_free(plan);
    return st;
}

/* ---- rank layout ---------------------------------------------------------------------------- */

loom_plan_coords loom_plan_rank_coords(const loom_plan *plan, int world_rank) {
    loom_plan_coords c;
    c.tp_rank = world_rank % plan->tp;
    c.dp_rank = world_rank / plan->tp % plan->dp;
    c.pp_rank = world_rank / (plan->tp * plan->dp);
    return c;
}

int loom_plan_world_rank(const loom_plan *plan, loom_plan_coords coords) {
    return coords.tp_rank + plan->tp * (coords.dp_rank + plan->dp * coords.pp_rank);
}

void loom_plan_place(loom_schedule_kind schedule, int pp, int virtual_stages, int stage, int *rank,
                     int *chunk) {
    (void)virtual_stages; /* the rules need only pp */
    if (schedule == LOOM_SCHEDULE_ZB_V && stage >= pp) {
        *rank = 2 * pp - 1 - stage, *chunk = 1;
    } else {
        *rank = stage % pp, *chunk = stage / pp;
    }
}

int loom_plan_schedule_chunks(loom_schedule_kind schedule) {
    switch (schedule) {
    case LOOM_SCHEDULE_GPIPE:
    case LOOM_SCHEDULE_1F1B:
    case LOOM_SCHEDULE_ZB_H1:
        return 1;
    case LOOM_SCHEDULE_INTERLEAVED:
        return 0;
    case LOOM_SCHEDULE_ZB_V:
        return 2;
    }
    return -1;
}

int loom_plan_default_zero(const loom_plan *plan) {
    return plan->dp > 1 && plan->dp_compression.method == LOOM_COMPRESS_NONE ? 1 : 0;
}

int loom_plan_num_micro_batches(const loom_plan *plan) {
    int64_t per_pipeline = (int64_t)plan->micro_batch * plan->dp * loom_plan_num_islands(plan);
    return per_pipeline > 0 ? (int)(plan->global_batch / per_pipeline) : 0;
}

int loom_plan_compresses(const loom_plan *plan) {
    return plan->dp_compression.method != LOOM_COMPRESS_NONE ||
           plan->pp_compression.method != LOOM_COMPRESS_NONE;
}

int loom_plan_compresses_stage(const loom_plan_compressor *compressor, int stage) {
    if (compressor->method == LOOM_COMPRESS_NONE) return 0;
    if (compressor->num_stages == 0) return 1;
    for (int i = 0; i < compressor->num_stages; i++)
        if (compressor->stages[i] == stage) return 1;
    return 0;
}

/* ---- summary -------------------------------------------------------------------------------- */

/* "powersgd r4 ef stages 0", "lowrank r8 lazy all links 0,2 forward bf16", "topk 1% ef". */
static void print_compressor(FILE *out, const char *name, const loom_plan_compressor *c,
                             int is_pp) {
    fprintf(out, "%s %s", name, loom_compress_method_name(c->method));
    if (c->method != LOOM_COMPRESS_NONE) {
        if (c->rank > 0) fprintf(out, " r%d", c->rank);
        if (c->method == LOOM_COMPRESS_TOPK) fprintf(out, " %g%%", 100 * c->fraction);
        if (!is_pp) fprintf(out, " %s", c->error_feedback ? "ef" : "no-ef");
        if (!is_pp && c->warmup_steps > 0) fprintf(out, " warmup %d", c->warmup_steps);
        if (is_pp) {
            fprintf(out, " %s %s", c->lazy_error ? "lazy" : "no-lazy",
                    loom_pp_policy_name(c->policy));
        }
        for (int i = 0; i < c->num_stages; i++) {
            fprintf(out, "%s%d", i > 0 ? "," : is_pp ? " links " : " stages ", c->stages[i]);
        }
    }
    if (is_pp && c->forward != LOOM_COMPRESS_NONE)
        fprintf(out, " forward %s", loom_compress_method_name(c->forward));
}

void loom_plan_print(const loom_plan *plan, FILE *out) {
    static const char *const zero_words[] = {", no ZeRO", ", ZeRO-1", ", ZeRO-2", ", ZeRO-3"};
    const loom_gpt_config *m = &plan->model;
    fprintf(out, "model    %d layers, %d heads, d_model %d, context %d, vocab %d (padded %d)\n",
            m->num_layers, m->num_heads, m->channels, m->max_seq_len, m->vocab_size,
            m->padded_vocab_size);
    fprintf(out, "batch    global %d, micro %d, %d micro-batches per step, schedule %s",
            plan->global_batch, plan->micro_batch, loom_plan_num_micro_batches(plan),
            loom_schedule_kind_name(plan->schedule));
    if (plan->virtual_stages > 1) {
        fprintf(out, " with %d virtual stages per rank", plan->virtual_stages);
    }
    fprintf(out, "\n");
    int ranks = plan->dp * plan->tp * plan->pp;
    fprintf(out, "mesh     dp %d x tp %d x pp %d = %d ranks%s%s\n", plan->dp, plan->tp, plan->pp,
            ranks, plan->dp > 1 ? zero_words[plan->zero & 3] : "",
            plan->overlap_grad_reduce || plan->dp < 2 ? "" : "; gradient sync after the backward");
    if (plan->sequence_parallel) fprintf(out, "         sequence parallel over tp\n");
    const loom_plan_islands *is = &plan->islands;
    if (is->count > 0) {
        fprintf(out,
                "islands  %d x %d ranks, %d inner steps a round, outer %s lr %g momentum %g, "
                "%d fragment%s, each sync applied %d step%s after it leaves, outer gradients "
                "%s\n",
                is->count, ranks, is->inner_steps, loom_outer_optimizer_name(is->optimizer), is->lr,
                is->momentum, is->fragments, is->fragments == 1 ? "" : "s", is->overlap_steps,
                is->overlap_steps == 1 ? "" : "s", loom_compress_method_name(is->compression));
    }
    if (plan->zero == 3) {
        fprintf(out, "         ZeRO-3 gathers per %s, prefetching %d unit%s\n",
                plan->zero3_gather == LOOM_ZERO3_GATHER_STEP ? "step" : "micro-batch",
                plan->zero3_prefetch, plan->zero3_prefetch == 1 ? "" : "s");
    }
    fprintf(out, "compress ");
    print_compressor(out, "dp", &plan->dp_compression, 0);
    print_compressor(out, ", pp", &plan->pp_compression, 1);
    fprintf(out, ", embedding sync %s\n", loom_embedding_sync_name(plan->embedding_sync));
    if (plan->predicted_step_s > 0 || plan->predicted_tokens_per_s > 0) {
        fprintf(out, "predicted %.4g s/step, %.4g tokens/s\n", plan->predicted_step_s,
                plan->predicted_tokens_per_s);
    }
    /* with virtual stages, which rank runs each and as which of its chunks */
    int placed = plan->virtual_stages > 1;
    fprintf(out, "\nstage  %slayers        blocks  embedding  head  recompute\n",
            placed ? "rank  chunk  " : "");
    for (int i = 0; i < plan->num_stages; i++) {
        const loom_plan_stage *s = &plan->stages[i];
        char range[32];
        snprintf(range, sizeof range, "[%d, %d)", s->first_layer, s->end_layer);
        fprintf(out, "%5d  ", i);
        if (placed) fprintf(out, "%4d  %5d  ", s->rank, s->chunk);
        fprintf(out, "%-12s  %6d  %-9s  %-4s  %s\n", range, s->end_layer - s->first_layer,
                s->embedding ? "yes" : "no", s->head ? "yes" : "no",
                s->recompute == LOOM_RECOMPUTE_NONE ? "no" : loom_recompute_name(s->recompute));
    }
    enum { MAX_ROWS = 64 };
    fprintf(out, "\nrank -> (pp, dp, tp)\n");
    for (int r = 0; r < ranks && r < MAX_ROWS; r++) {
        loom_plan_coords c = loom_plan_rank_coords(plan, r);
        fprintf(out, "%4d -> (%d, %d, %d)\n", r, c.pp_rank, c.dp_rank, c.tp_rank);
    }
    if (ranks > MAX_ROWS) fprintf(out, "... %d more ranks\n", ranks - MAX_ROWS);
}
