/*
 * plan_file.c — the plan file: reading (jansson, with a message naming the file, the JSON path
 * and the expectation for every problem, and unknown keys rejected) and writing (by hand, so
 * that the file reads like DESIGN.md's example: one line per section and per stage, keys in a
 * fixed order).
 *
 * Reading checks the types and the shape of the document, and the compression methods (a
 * compressor's rank defaults by method); the rules that relate fields to one another are
 * loom_plan_check's (plan.c), applied to the result. The field readers and the message format
 * are json_fields.c's, shared with the cluster description.
 */
#include "plan/plan_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- reading -------------------------------------------------------------------------------- */

static loom_status read_bool(const char *file, const json_t *object, const char *parent,
                             const char *key, int *out) {
    json_t *value = json_object_get(object, key);
    if (!value) return LOOM_OK;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    if (!json_is_boolean(value)) return loom_json_fail_type(file, path, "true or false", value);
    *out = json_is_true(value);
    return LOOM_OK;
}

/* A word from `words` as its index (the enum's value) into *out; absent keeps *out. */
static loom_status read_word(const char *file, const json_t *object, const char *parent,
                             const char *key, int required, const loom_words *words, int *out) {
    char list[128];
    loom_word_list(words, list, sizeof list);
    json_t *value;
    loom_status st = loom_json_member(file, object, parent, key, required, list, &value);
    if (st != LOOM_OK || !value) return st;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    const char *text = json_string_value(value);
    int index = loom_word_index(words, text);
    if (index < 0) return loom_json_fail_type(file, path, list, value);
    *out = index;
    return LOOM_OK;
}

static const char *const arch_words[] = {"gpt2", "llama"};
static const loom_words arch_list = {arch_words, 2};

/* model.rope_scaling (absent or null: none): Llama 3.1's, in Hugging Face's form. */
static loom_status read_rope_scaling(const char *file, const json_t *model, loom_rope_scaling *s) {
    static const char *const keys[] = {"rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    static const char *const llama3[] = {"llama3"};
    static const loom_words type_list = {llama3, 1};
    const json_t *v = json_object_get(model, "rope_scaling");
    memset(s, 0, sizeof *s);
    if (!v || json_is_null(v)) return LOOM_OK;
    const char *at = "model.rope_scaling";
    int type = 0;
    loom_status st = loom_json_as_object(file, at, v);
    if (st == LOOM_OK) st = loom_json_check_keys(file, v, at, keys, 5);
    if (st == LOOM_OK) st = read_word(file, v, at, "rope_type", 1, &type_list, &type);
    double *fields[] = {&s->factor, &s->low_freq_factor, &s->high_freq_factor,
                        &s->original_context};
    for (int i = 0; i < 4 && st == LOOM_OK; i++)
        st = loom_json_read_number(file, v, at, keys[i + 1], 1, fields[i]);
    return st == LOOM_OK ? loom_gpt_check_rope_scaling(s, file, "model.") : st;
}

/* The Llama keys (absent: GPT-2), into m; the shape rules check them after. */
static loom_status read_arch(const char *file, const json_t *model, loom_gpt_config *m) {
    loom_status st = read_word(file, model, "model", "arch", 0, &arch_list, &m->arch);
    if (st == LOOM_OK) st = loom_json_read_int(file, model, "model", "kv_heads", 0, &m->kv_heads);
    if (st == LOOM_OK) st = loom_json_read_int(file, model, "model", "ffn_dim", 0, &m->ffn_dim);
    int tie = !m->untied_head;
    if (st == LOOM_OK) st = read_bool(file, model, "model", "tie_embeddings", &tie);
    double theta = m->rope_theta, eps = m->norm_eps;
    if (st == LOOM_OK) st = loom_json_read_number(file, model, "model", "rope_theta", 0, &theta);
    if (st == LOOM_OK) st = loom_json_read_number(file, model, "model", "norm_eps", 0, &eps);
    int llama_keys = json_object_get(model, "kv_heads") || json_object_get(model, "ffn_dim") ||
                     json_object_get(model, "tie_embeddings") ||
                     json_object_get(model, "rope_theta") || json_object_get(model, "norm_eps");
    if (st == LOOM_OK && llama_keys && m->arch != LOOM_ARCH_LLAMA) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: model: kv_heads, ffn_dim, tie_embeddings, rope_theta and norm_eps "
                         "are Llama's: expected \"arch\": \"llama\" beside them",
                         file);
    }
    m->untied_head = !tie, m->rope_theta = theta, m->norm_eps = eps;
    if (st == LOOM_OK) st = read_rope_scaling(file, model, &m->rope_scaling);
    if (st == LOOM_OK && m->rope_scaling.factor > 0 && m->arch != LOOM_ARCH_LLAMA) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: model.rope_scaling: Llama's: expected \"arch\": \"llama\" beside it",
                         file);
    }
    return st;
}

static loom_status read_model(const char *file, const json_t *root, loom_gpt_config *m) {
    static const char *const keys[] = {"layers",     "heads",    "d_model",        "context",
                                       "vocab",      "arch",     "kv_heads",       "ffn_dim",
                                       "rope_theta", "norm_eps", "tie_embeddings", "rope_scaling"};
    json_t *model;
    loom_status st = loom_json_member(file, root, "", "model", 1, "an object", &model);
    if (st == LOOM_OK) st = loom_json_as_object(file, "model", model);
    if (st == LOOM_OK) st = loom_json_check_keys(file, model, "model", keys, 12);
    if (st == LOOM_OK) st = loom_json_read_int(file, model, "model", "layers", 1, &m->num_layers);
    if (st == LOOM_OK) st = loom_json_read_int(file, model, "model", "heads", 1, &m->num_heads);
    if (st == LOOM_OK) st = loom_json_read_int(file, model, "model", "d_model", 1, &m->channels);
    if (st == LOOM_OK) st = loom_json_read_int(file, model, "model", "context", 1, &m->max_seq_len);
    if (st == LOOM_OK) st = loom_json_read_int(file, model, "model", "vocab", 1, &m->vocab_size);
    if (st == LOOM_OK) st = read_arch(file, model, m);
    m->padded_vocab_size = loom_gpt_pad_vocab(m->vocab_size);
    return st;
}

static loom_status read_batch(const char *file, const json_t *root, loom_plan *plan) {
    static const char *const keys[] = {"global", "micro", "schedule", "virtual_stages"};
    json_t *batch;
    loom_status st = loom_json_member(file, root, "", "batch", 1, "an object", &batch);
    if (st == LOOM_OK) st = loom_json_as_object(file, "batch", batch);
    if (st == LOOM_OK) st = loom_json_check_keys(file, batch, "batch", keys, 4);
    if (st == LOOM_OK)
        st = loom_json_read_int(file, batch, "batch", "global", 1, &plan->global_batch);
    if (st == LOOM_OK)
        st = loom_json_read_int(file, batch, "batch", "micro", 1, &plan->micro_batch);
    int schedule = (int)plan->schedule;
    if (st == LOOM_OK)
        st = read_word(file, batch, "batch", "schedule", 0, &loom_plan_schedules, &schedule);
    plan->schedule = (loom_schedule_kind)schedule;
    /* left out: one chunk per rank, or the two of zb-v's V (interleaved's v is always written) */
    int fixed = loom_plan_schedule_chunks(plan->schedule);
    plan->virtual_stages = fixed > 0 ? fixed : 1;
    if (st == LOOM_OK) {
        st = loom_json_read_int(file, batch, "batch", "virtual_stages", 0, &plan->virtual_stages);
    }
    return st;
}

static loom_status read_mesh(const char *file, const json_t *root, loom_plan *plan) {
    static const char *const keys[] = {
        "dp", "tp", "pp", "zero", "sequence_parallel", "zero3_prefetch", "zero3_gather"};
    json_t *mesh;
    loom_status st = loom_json_member(file, root, "", "mesh", 1, "an object", &mesh);
    if (st == LOOM_OK) st = loom_json_as_object(file, "mesh", mesh);
    if (st == LOOM_OK) st = loom_json_check_keys(file, mesh, "mesh", keys, 7);
    if (st == LOOM_OK) st = loom_json_read_int(file, mesh, "mesh", "dp", 1, &plan->dp);
    if (st == LOOM_OK) st = loom_json_read_int(file, mesh, "mesh", "tp", 1, &plan->tp);
    if (st == LOOM_OK) st = loom_json_read_int(file, mesh, "mesh", "pp", 1, &plan->pp);
    if (st == LOOM_OK) st = loom_json_read_int(file, mesh, "mesh", "zero", 0, &plan->zero);
    if (st == LOOM_OK)
        st = read_bool(file, mesh, "mesh", "sequence_parallel", &plan->sequence_parallel);
    if (st == LOOM_OK) {
        st = loom_json_read_int(file, mesh, "mesh", "zero3_prefetch", 0, &plan->zero3_prefetch);
    }
    const json_t *gather = mesh ? json_object_get(mesh, "zero3_gather") : NULL;
    if (st == LOOM_OK && gather) {
        int index = loom_word_index(&loom_plan_zero3_gathers, json_string_value(gather));
        if (index < 0) {
            st = loom_json_fail_type(file, "mesh.zero3_gather", "\"micro_batch\" or \"step\"",
                                     gather);
        }
        plan->zero3_gather = (loom_zero3_gather)index;
    }
    return st;
}

/* "recompute": "none", "needed" or "always" (LOOM_RECOMPUTE_*), or older files' false and true
 * ("none", "needed"); absent keeps *out. */
static loom_status read_recompute(const char *file, const json_t *object, const char *parent,
                                  int *out) {
    const json_t *v = json_object_get(object, "recompute");
    if (!v) return LOOM_OK;
    if (json_is_boolean(v)) {
        *out = json_is_true(v) ? LOOM_RECOMPUTE_AS_NEEDED : LOOM_RECOMPUTE_NONE;
        return LOOM_OK;
    }
    int index = loom_word_index(&loom_plan_recomputes, json_string_value(v));
    if (index >= 0) {
        *out = index;
        return LOOM_OK;
    }
    char path[96];
    snprintf(path, sizeof path, "%s.recompute", parent);
    return loom_json_fail_type(file, path, "\"none\", \"needed\", \"always\" or \"selective\"", v);
}

static loom_status read_stage(const char *file, const json_t *value, int index, int last,
                              const loom_plan *plan, loom_plan_stage *stage) {
    static const char *const keys[] = {"layers", "rank", "embedding", "head", "recompute"};
    char path[64];
    snprintf(path, sizeof path, "stages[%d]", index);
    loom_status st = loom_json_as_object(file, path, value);
    if (st == LOOM_OK) st = loom_json_check_keys(file, value, path, keys, 5);
    json_t *layers = NULL;
    if (st == LOOM_OK) {
        st = loom_json_member(file, value, path, "layers", 1, "[start, end)", &layers);
    }
    if (st != LOOM_OK) return st;
    char layers_path[80];
    snprintf(layers_path, sizeof layers_path, "%s.layers", path);
    if (!json_is_array(layers) || json_array_size(layers) != 2 ||
        loom_json_as_int(file, layers_path, json_array_get(layers, 0), &stage->first_layer) !=
            LOOM_OK ||
        loom_json_as_int(file, layers_path, json_array_get(layers, 1), &stage->end_layer) !=
            LOOM_OK) {
        return loom_json_fail_type(file, layers_path, "[start, end) as two integers", layers);
    }
    /* the schedule's placement; a "rank" given must agree with it (loom_plan_check), and the
     * chunk is never written. A mesh that cannot place anything is left to loom_plan_check. */
    stage->rank = stage->chunk = 0;
    if (plan->pp > 0 && plan->virtual_stages > 0) {
        loom_plan_place(plan->schedule, plan->pp, plan->virtual_stages, index, &stage->rank,
                        &stage->chunk);
    }
    st = loom_json_read_int(file, value, path, "rank", 0, &stage->rank);
    if (st != LOOM_OK) return st;
    /* absent flags mean the usual placement: embedding on the first stage, head on the last */
    stage->embedding = index == 0;
    stage->head = index == last;
    stage->recompute = 0;
    st = read_bool(file, value, path, "embedding", &stage->embedding);
    if (st == LOOM_OK) st = read_bool(file, value, path, "head", &stage->head);
    if (st == LOOM_OK) st = read_recompute(file, value, path, &stage->recompute);
    return st;
}

static loom_status read_stages(const char *file, const json_t *root, loom_plan *plan) {
    json_t *stages;
    loom_status st = loom_json_member(file, root, "", "stages", 1, "a list of stages", &stages);
    if (st != LOOM_OK) return st;
    if (!json_is_array(stages))
        return loom_json_fail_type(file, "stages", "a list of stages", stages);
    size_t n = json_array_size(stages);
    if (n > INT_MAX) return loom_json_fail_type(file, "stages", "fewer stages", stages);
    if (n == 0) return LOOM_OK; /* loom_plan_check says how many are expected */
    plan->stages = loom_calloc(n, sizeof *plan->stages, "plan stages");
    if (!plan->stages) return LOOM_ERR_NOMEM;
    plan->num_stages = (int)n;
    for (size_t i = 0; i < n && st == LOOM_OK; i++) {
        st =
            read_stage(file, json_array_get(stages, i), (int)i, (int)n - 1, plan, &plan->stages[i]);
    }
    return st;
}

/* object[key], a list of stage or link indices, into c->stages (absent: all of them, no list). */
static loom_status read_indices(const char *file, const json_t *object, const char *parent,
                                const char *key, const char *item, loom_plan_compressor *c) {
    json_t *indices = json_object_get(object, key);
    if (!indices) return LOOM_OK;
    char path[96];
    loom_json_join_path(path, sizeof path, parent, key);
    size_t n = json_array_size(indices);
    if (!json_is_array(indices) || n == 0 || n > INT_MAX) {
        char expected[128];
        snprintf(expected, sizeof expected,
                 "a non-empty list of %s indices (leave the key out for every %s)", item, item);
        return loom_json_fail_type(file, path, expected, indices);
    }
    c->stages = loom_calloc(n, sizeof *c->stages, "plan compression stages");
    if (!c->stages) return LOOM_ERR_NOMEM;
    c->num_stages = (int)n;
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < n && st == LOOM_OK; i++) {
        char item_path[112];
        snprintf(item_path, sizeof item_path, "%s[%zu]", path, i);
        st = loom_json_as_int(file, item_path, json_array_get(indices, i), &c->stages[i]);
    }
    return st;
}

/* A method allowed in `place` (compress/methods.c's list) into out[cap] and *method (unless
 * NULL). Read here rather than left to loom_plan_check because a left-out rank depends on it. */
static loom_status read_method(const char *file, const json_t *object, const char *parent,
                               const char *key, int required, int place,
                               loom_compress_method *method) {
    json_t *value;
    loom_status st = loom_json_member(file, object, parent, key, required, "a method name", &value);
    if (st != LOOM_OK || !value) return st;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    const char *text = json_string_value(value);
    if (!text) return loom_json_fail_type(file, path, "a method name (a string)", value);
    return loom_compress_method_parse(text, place, file, path, method);
}

/* compression.dp: method, rank, fraction, error_feedback, warmup_steps, stages. */
static loom_status read_dp_compressor(const char *file, const json_t *compression,
                                      loom_plan_compressor *c) {
    static const char *const keys[] = {"method",         "rank",         "fraction",
                                       "error_feedback", "warmup_steps", "stages"};
    const char *path = "compression.dp";
    json_t *object = json_object_get(compression, "dp");
    if (!object) return LOOM_OK;
    loom_compress_method m = LOOM_COMPRESS_NONE;
    loom_status st = loom_json_as_object(file, path, object);
    if (st == LOOM_OK) st = loom_json_check_keys(file, object, path, keys, 6);
    if (st == LOOM_OK) {
        st = read_method(file, object, path, "method", 1, LOOM_COMPRESS_FOR_DP, &m);
    }
    c->method = m;
    c->rank = loom_plan_default_rank(m);
    if (st == LOOM_OK) st = loom_json_read_int(file, object, path, "rank", 0, &c->rank);
    if (st == LOOM_OK) st = loom_json_read_number(file, object, path, "fraction", 0, &c->fraction);
    if (st == LOOM_OK) st = read_bool(file, object, path, "error_feedback", &c->error_feedback);
    if (st == LOOM_OK)
        st = loom_json_read_int(file, object, path, "warmup_steps", 0, &c->warmup_steps);
    if (st == LOOM_OK) st = read_indices(file, object, path, "stages", "stage", c);
    return st;
}

/* compression.pp: method, rank, fraction, lazy_error, policy, forward, links. */
static loom_status read_pp_compressor(const char *file, const json_t *compression,
                                      loom_plan_compressor *c) {
    static const char *const keys[] = {"method", "rank",    "fraction", "lazy_error",
                                       "policy", "forward", "links"};
    const char *path = "compression.pp";
    json_t *object = json_object_get(compression, "pp");
    if (!object) return LOOM_OK;
    loom_compress_method m = LOOM_COMPRESS_NONE;
    loom_status st = loom_json_as_object(file, path, object);
    if (st == LOOM_OK) st = loom_json_check_keys(file, object, path, keys, 7);
    if (st == LOOM_OK) {
        st = read_method(file, object, path, "method", 1, LOOM_COMPRESS_FOR_PP_GRAD, &m);
    }
    c->method = m;
    c->rank = loom_plan_default_rank(m);
    if (st == LOOM_OK) st = loom_json_read_int(file, object, path, "rank", 0, &c->rank);
    if (st == LOOM_OK) st = loom_json_read_number(file, object, path, "fraction", 0, &c->fraction);
    if (st == LOOM_OK) st = read_bool(file, object, path, "lazy_error", &c->lazy_error);
    int policy = (int)c->policy;
    if (st == LOOM_OK)
        st = read_word(file, object, path, "policy", 0, &loom_plan_policies, &policy);
    c->policy = (loom_pp_policy)policy;
    if (st == LOOM_OK) {
        st = read_method(file, object, path, "forward", 0, LOOM_COMPRESS_FOR_PP_FORWARD,
                         &c->forward);
    }
    if (st == LOOM_OK) st = read_indices(file, object, path, "links", "link", c);
    return st;
}

static loom_status read_compression(const char *file, const json_t *root, loom_plan *plan) {
    static const char *const keys[] = {"dp", "pp", "embedding_sync"};
    json_t *compression = json_object_get(root, "compression");
    if (!compression) return LOOM_OK;
    loom_status st = loom_json_as_object(file, "compression", compression);
    if (st == LOOM_OK) st = loom_json_check_keys(file, compression, "compression", keys, 3);
    if (st == LOOM_OK) st = read_dp_compressor(file, compression, &plan->dp_compression);
    if (st == LOOM_OK) st = read_pp_compressor(file, compression, &plan->pp_compression);
    int sync = (int)plan->embedding_sync;
    if (st == LOOM_OK) {
        st = read_word(file, compression, "compression", "embedding_sync", 0,
                       &loom_plan_embedding_syncs, &sync);
    }
    plan->embedding_sync = (loom_embedding_sync)sync;
    return st;
}

static loom_status read_predicted(const char *file, const json_t *root, loom_plan *plan) {
    static const char *const keys[] = {"seq_len", "step_s", "tokens_per_s", "peak_bytes_per_rank"};
    json_t *predicted = json_object_get(root, "predicted");
    if (!predicted) return LOOM_OK;
    loom_status st = loom_json_as_object(file, "predicted", predicted);
    if (st == LOOM_OK) st = loom_json_check_keys(file, predicted, "predicted", keys, 4);
    if (st == LOOM_OK)
        st = loom_json_read_int(file, predicted, "predicted", "seq_len", 0,
                                &plan->predicted_seq_len);
    if (st == LOOM_OK)
        st = loom_json_read_number(file, predicted, "predicted", "step_s", 0,
                                   &plan->predicted_step_s);
    if (st == LOOM_OK) {
        st = loom_json_read_number(file, predicted, "predicted", "tokens_per_s", 0,
                                   &plan->predicted_tokens_per_s);
    }
    json_t *peaks = json_object_get(predicted, "peak_bytes_per_rank");
    if (st != LOOM_OK || !peaks) return st;
    size_t n = json_array_size(peaks);
    if (!json_is_array(peaks) || n > INT_MAX) {
        return loom_json_fail_type(file, "predicted.peak_bytes_per_rank", "a list of byte counts",
                                   peaks);
    }
    if (n == 0) return LOOM_OK;
    plan->predicted_peak_bytes = loom_calloc(n, sizeof(int64_t), "plan predictions");
    if (!plan->predicted_peak_bytes) return LOOM_ERR_NOMEM;
    plan->num_predicted_peak = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(peaks, i);
        if (!json_is_integer(item)) {
            char path[80];
            snprintf(path, sizeof path, "predicted.peak_bytes_per_rank[%zu]", i);
            return loom_json_fail_type(file, path, "an integer byte count", item);
        }
        plan->predicted_peak_bytes[i] = (int64_t)json_integer_value(item);
    }
    return LOOM_OK;
}

/* The ZeRO stage: mesh.zero, or an older file's top-level "zero1" (true/false), not both; else
 * the default (loom_plan_default_zero), so that the plan read says it. */
static loom_status read_zero(const char *file, const json_t *root, loom_plan *plan) {
    const json_t *zero1 = json_object_get(root, "zero1");
    if (!zero1) {
        if (plan->zero < 0) plan->zero = loom_plan_default_zero(plan);
        return LOOM_OK;
    }
    if (plan->zero >= 0) {
        return loom_fail_field(file, "zero1",
                               "expected either mesh.zero or (in older files) zero1, got both");
    }
    if (!json_is_boolean(zero1)) return loom_json_fail_type(file, "zero1", "true or false", zero1);
    plan->zero = json_is_true(zero1) ? 1 : 0;
    return LOOM_OK;
}

/* islands: count (required), inner_steps, outer_optimizer, outer_lr, outer_momentum, fragments,
 * overlap_steps, compression; left out: no islands. */
static loom_status read_islands(const char *file, const json_t *root, loom_plan *plan) {
    static const char *const keys[] = {"count",
                                       "inner_steps",
                                       "outer_optimizer",
                                       "outer_lr",
                                       "outer_momentum",
                                       "fragments",
                                       "overlap_steps",
                                       "compression",
                                       "compression_rank",
                                       "compression_fraction"};
    json_t *islands = json_object_get(root, "islands");
    if (!islands) return LOOM_OK;
    loom_plan_islands *is = &plan->islands;
    loom_status st = loom_json_as_object(file, "islands", islands);
    if (st == LOOM_OK) st = loom_json_check_keys(file, islands, "islands", keys, 10);
    if (st == LOOM_OK) st = loom_json_read_int(file, islands, "islands", "count", 1, &is->count);
    if (st == LOOM_OK && is->count < 1) {
        return loom_fail_field(file, "islands.count",
                               "expected a positive number of islands, got %d", is->count);
    }
    if (st == LOOM_OK)
        st = loom_json_read_int(file, islands, "islands", "inner_steps", 0, &is->inner_steps);
    int optimizer = (int)is->optimizer;
    if (st == LOOM_OK) {
        st = read_word(file, islands, "islands", "outer_optimizer", 0, &loom_plan_outer_optimizers,
                       &optimizer);
    }
    is->optimizer = (loom_outer_optimizer)optimizer;
    if (st == LOOM_OK) st = loom_json_read_number(file, islands, "islands", "outer_lr", 0, &is->lr);
    if (st == LOOM_OK)
        st = loom_json_read_number(file, islands, "islands", "outer_momentum", 0, &is->momentum);
    if (st == LOOM_OK)
        st = loom_json_read_int(file, islands, "islands", "fragments", 0, &is->fragments);
    if (st == LOOM_OK) {
        st = loom_json_read_int(file, islands, "islands", "overlap_steps", 0, &is->overlap_steps);
    }
    if (st == LOOM_OK) {
        st = read_method(file, islands, "islands", "compression", 0, LOOM_COMPRESS_FOR_DP,
                         &is->compression);
    }
    if (is->compression == LOOM_COMPRESS_POWERSGD) is->compression_rank = LOOM_PLAN_DEFAULT_DP_RANK;
    if (st == LOOM_OK) {
        st = loom_json_read_int(file, islands, "islands", "compression_rank", 0,
                                &is->compression_rank);
    }
    if (is->compression == LOOM_COMPRESS_TOPK)
        is->compression_fraction = LOOM_PLAN_DEFAULT_TOPK_FRACTION;
    if (st == LOOM_OK) {
        st = loom_json_read_number(file, islands, "islands", "compression_fraction", 0,
                                   &is->compression_fraction);
    }
    return st;
}

static loom_status read_document(const char *file, const json_t *root, loom_plan *plan) {
    static const char *const keys[] = {"model",     "batch",       "mesh",
                                       "stages",    "compression", "predicted",
                                       "precision", "zero1",       "overlap_grad_reduce",
                                       "islands"};
    if (!json_is_object(root))
        return loom_json_fail_type(file, "(top level)", "a JSON object", root);
    loom_status st = loom_json_check_keys(file, root, "", keys, 10);
    if (st == LOOM_OK) st = read_islands(file, root, plan);
    plan->zero = -1; /* not said yet */
    if (st == LOOM_OK) st = read_model(file, root, &plan->model);
    if (st == LOOM_OK) st = read_batch(file, root, plan);
    if (st == LOOM_OK) st = read_mesh(file, root, plan);
    if (st == LOOM_OK) st = read_stages(file, root, plan);
    if (st == LOOM_OK) st = read_compression(file, root, plan);
    if (st == LOOM_OK) st = read_predicted(file, root, plan);
    const json_t *precision = json_object_get(root, "precision");
    if (st == LOOM_OK && precision) {
        st =
            loom_precision_parse(json_string_value(precision), file, "precision", &plan->precision);
    }
    if (st == LOOM_OK)
        st = read_bool(file, root, "", "overlap_grad_reduce", &plan->overlap_grad_reduce);
    if (st == LOOM_OK) st = read_zero(file, root, plan);
    return st;
}

loom_status loom_plan_read(const char *path, loom_plan *plan) {
    loom_plan_init(plan);
    json_t *root;
    loom_status st = loom_json_load(path, &root);
    if (st != LOOM_OK) return st;
    st = read_document(path, root, plan);
    json_decref(root);
    if (st == LOOM_OK) st = loom_plan_check(plan, path, 0);
    if (st != LOOM_OK) loom_plan_free(plan);
    return st;
}

/* ---- writing -------------------------------------------------------------------------------- */

static void write_indices(FILE *out, const char *key, const loom_plan_compressor *c) {
    if (c->num_stages == 0) return; /* every stage or link */
    fprintf(out, ", \"%s\": [", key);
    for (int i = 0; i < c->num_stages; i++) fprintf(out, "%s%d", i ? ", " : "", c->stages[i]);
    fprintf(out, "]");
}

static void write_rank_and_fraction(FILE *out, const loom_plan_compressor *c) {
    if (c->rank != 0) fprintf(out, ", \"rank\": %d", c->rank);
    if (c->method == LOOM_COMPRESS_TOPK) {
        char fraction[32];
        loom_json_format_double(c->fraction, fraction, sizeof fraction);
        fprintf(out, ", \"fraction\": %s", fraction);
    }
}

/* A compressor's line: the keys that matter for its method, and under method "none" those that
 * differ from their defaults, so that the plan reads back equal (loom_plan_check has made sure
 * that the fields without a key hold their defaults). */
static void write_dp_compressor(FILE *out, const loom_plan_compressor *c) {
    int on = c->method != LOOM_COMPRESS_NONE;
    fprintf(out, "    \"dp\": {\"method\": \"%s\"", loom_compress_method_name(c->method));
    write_rank_and_fraction(out, c);
    if (on || !c->error_feedback)
        fprintf(out, ", \"error_feedback\": %s", c->error_feedback ? "true" : "false");
    if (on || c->warmup_steps != 0) fprintf(out, ", \"warmup_steps\": %d", c->warmup_steps);
    write_indices(out, "stages", c);
    fprintf(out, "},\n");
}

static void write_pp_compressor(FILE *out, const loom_plan_compressor *c) {
    int on = c->method != LOOM_COMPRESS_NONE;
    fprintf(out, "    \"pp\": {\"method\": \"%s\"", loom_compress_method_name(c->method));
    write_rank_and_fraction(out, c);
    if (on || !c->lazy_error)
        fprintf(out, ", \"lazy_error\": %s", c->lazy_error ? "true" : "false");
    if (on || c->policy != LOOM_PP_POLICY_ALL)
        fprintf(out, ", \"policy\": \"%s\"", loom_pp_policy_name(c->policy));
    if (on || c->forward != LOOM_COMPRESS_NONE)
        fprintf(out, ", \"forward\": \"%s\"", loom_compress_method_name(c->forward));
    write_indices(out, "links", c);
    fprintf(out, "},\n");
}

static void write_document(FILE *out, const loom_plan *plan) {
    const loom_gpt_config *m = &plan->model;
    fprintf(out, "{\n");
    fprintf(out,
            "  \"model\": {\"layers\": %d, \"heads\": %d, \"d_model\": %d, \"context\": %d, "
            "\"vocab\": %d",
            m->num_layers, m->num_heads, m->channels, m->max_seq_len, m->vocab_size);
    if (m->arch == LOOM_ARCH_LLAMA) { /* GPT-2's plans read as they always did */
        char theta[32], eps[32];
        loom_json_format_double(m->rope_theta, theta, sizeof theta);
        loom_json_format_double(m->norm_eps, eps, sizeof eps);
        fprintf(out,
                ", \"arch\": \"llama\", \"kv_heads\": %d, \"ffn_dim\": %d, \"tie_embeddings\": "
                "%s, \"rope_theta\": %s, \"norm_eps\": %s",
                m->kv_heads, m->ffn_dim, m->untied_head ? "false" : "true", theta, eps);
        const loom_rope_scaling *r = &m->rope_scaling;
        if (r->factor > 0) {
            char v[4][32];
            double values[] = {r->factor, r->low_freq_factor, r->high_freq_factor,
                               r->original_context};
            for (int i = 0; i < 4; i++) loom_json_format_double(values[i], v[i], sizeof v[i]);
            fprintf(out,
                    ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %s, "
                    "\"low_freq_factor\": %s, \"high_freq_factor\": %s, "
                    "\"original_max_position_embeddings\": %s}",
                    v[0], v[1], v[2], v[3]);
        }
    }
    fprintf(out, "},\n");
    if (plan->precision != LOOM_PRECISION_FP32)
        fprintf(out, "  \"precision\": \"%s\",\n", loom_precision_name(plan->precision));
    if (!plan->overlap_grad_reduce) fprintf(out, "  \"overlap_grad_reduce\": false,\n");
    /* virtual stages are written only when there are some, so that a v = 1 plan reads as a plan
     * written before they existed */
    int placed = plan->virtual_stages > 1;
    fprintf(out, "  \"batch\": {\"global\": %d, \"micro\": %d, \"schedule\": \"%s\"",
            plan->global_batch, plan->micro_batch, loom_schedule_kind_name(plan->schedule));
    if (placed) fprintf(out, ", \"virtual_stages\": %d", plan->virtual_stages);
    fprintf(out, "},\n");
    fprintf(out, "  \"mesh\": {\"dp\": %d, \"tp\": %d, \"pp\": %d, \"zero\": %d", plan->dp,
            plan->tp, plan->pp, plan->zero);
    if (plan->sequence_parallel) fprintf(out, ", \"sequence_parallel\": true");
    if (plan->zero == 3) {
        fprintf(out, ", \"zero3_prefetch\": %d, \"zero3_gather\": \"%s\"", plan->zero3_prefetch,
                loom_zero3_gather_name(plan->zero3_gather));
    }
    fprintf(out, "},\n");
    const loom_plan_islands *is = &plan->islands;
    if (is->count > 0) {
        char lr[32], momentum[32];
        loom_json_format_double(is->lr, lr, sizeof lr);
        loom_json_format_double(is->momentum, momentum, sizeof momentum);
        fprintf(out,
                "  \"islands\": {\"count\": %d, \"inner_steps\": %d, \"outer_optimizer\": \"%s\", "
                "\"outer_lr\": %s, \"outer_momentum\": %s, \"fragments\": %d, "
                "\"overlap_steps\": %d, \"compression\": \"%s\"",
                is->count, is->inner_steps, loom_outer_optimizer_name(is->optimizer), lr, momentum,
                is->fragments, is->overlap_steps, loom_compress_method_name(is->compression));
        if (is->compression_rank > 0)
            fprintf(out, ", \"compression_rank\": %d", is->compression_rank);
        if (is->compression_fraction > 0) {
            char fraction[32];
            loom_json_format_double(is->compression_fraction, fraction, sizeof fraction);
            fprintf(out, ", \"compression_fraction\": %s", fraction);
        }
        fprintf(out, "},\n");
    }
    fprintf(out, "  \"stages\": [\n");
    for (int i = 0; i < plan->num_stages; i++) {
        const loom_plan_stage *s = &plan->stages[i];
        fprintf(out, "    {\"layers\": [%d, %d]", s->first_layer, s->end_layer);
        if (placed) fprintf(out, ", \"rank\": %d", s->rank);
        if (s->embedding) fprintf(out, ", \"embedding\": true");
        if (s->head) fprintf(out, ", \"head\": true");
        fprintf(out, ", \"recompute\": \"%s\"}%s\n", loom_recompute_name(s->recompute),
                i + 1 < plan->num_stages ? "," : "");
    }
    fprintf(out, "  ],\n");
    int predicted = plan->predicted_step_s != 0 || plan->predicted_tokens_per_s != 0 ||
                    plan->num_predicted_peak > 0;
    fprintf(out, "  \"compression\": {\n");
    write_dp_compressor(out, &plan->dp_compression);
    write_pp_compressor(out, &plan->pp_compression);
    fprintf(out, "    \"embedding_sync\": \"%s\"\n",
            loom_embedding_sync_name(plan->embedding_sync));
    fprintf(out, "  }%s\n", predicted ? "," : "");
    if (predicted) {
        char step[32], tokens[32];
        loom_json_format_double(plan->predicted_step_s, step, sizeof step);
        loom_json_format_double(plan->predicted_tokens_per_s, tokens, sizeof tokens);
        fprintf(out, "  \"predicted\": {");
        if (plan->predicted_seq_len > 0) fprintf(out, "\"seq_len\": %d, ", plan->predicted_seq_len);
        fprintf(out, "\"step_s\": %s, \"tokens_per_s\": %s", step, tokens);
        fprintf(out, ", \"peak_bytes_per_rank\": [");
        for (int i = 0; i < plan->num_predicted_peak; i++) {
            fprintf(out, "%s%" PRId64, i ? ", " : "", plan->predicted_peak_bytes[i]);
        }
        fprintf(out, "]}\n");
    }
    fprintf(out, "}\n");
}

loom_status loom_plan_write(const char *path, const loom_plan *plan) {
    /* only a plan that reads back is written: the words are known ones, so need no escaping */
    loom_status st = loom_plan_check(plan, path, 0);
    if (st != LOOM_OK) return st;
    loom_atomic_file *file;
    st = loom_atomic_open(&file, path);
    if (st != LOOM_OK || !file) return st != LOOM_OK ? st : LOOM_ERR_IO;
    write_document(loom_atomic_stream(file), plan);
    return loom_atomic_commit(file);
}
