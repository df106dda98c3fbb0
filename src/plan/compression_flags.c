/*
 * compression_flags.c — the layout flags of `loom train` and `loom plan` (one field per flag,
 * loom_layout_flags) turned into a plan request, the one place that happens; and the
 * compression flags among them (loom_plan_compression_flags) turned into the plan's two
 * compressors, and back for the configuration table. Messages name the flag; the rules that need
 * the mesh (index ranges, one pipeline stage) and the value ranges are loom_plan_check's, met when
 * the request becomes a plan.
 *
 * Not here: the method names (compress/methods.c), the plan's rules (plan.c).
 */
#include "plan/plan_internal.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void loom_plan_compression_flags_defaults(loom_plan_compression_flags *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->dp_compression, sizeof f->dp_compression, "none");
    f->dp_compression_rank = LOOM_PLAN_DEFAULT_DP_RANK;
    f->dp_topk_fraction = LOOM_PLAN_DEFAULT_TOPK_FRACTION;
    snprintf(f->pp_compression, sizeof f->pp_compression, "none");
    f->pp_compression_rank = LOOM_PLAN_DEFAULT_PP_RANK;
    f->pp_topk_fraction = LOOM_PLAN_DEFAULT_TOPK_FRACTION;
    snprintf(f->pp_compression_policy, sizeof f->pp_compression_policy, "all");
    snprintf(f->pp_forward_compression, sizeof f->pp_forward_compression, "none");
    snprintf(f->embedding_sync, sizeof f->embedding_sync, "separate");
}

/* "0,2": non-negative integers separated by single commas, nothing else ("" = none). */
static loom_status parse_indices(const char *text, const char *flag, const char *item, int **out,
                                 int *count) {
    *out = NULL, *count = 0;
    if (!text[0]) return LOOM_OK;
    size_t n = 1;
    for (const char *p = text; *p; p++) n += *p == ',';
    int *list = loom_calloc(n, sizeof *list, "compression indices");
    if (!list) return LOOM_ERR_NOMEM;
    int k = 0, ok = 1;
    for (const char *p = text; ok;) {
        int64_t value = 0;
        ok = *p >= '0' && *p <= '9';
        for (; ok && *p >= '0' && *p <= '9'; p++) {
            value = value * 10 + (*p - '0');
            ok = value <= INT_MAX;
        }
        if (!ok) break;
        list[k++] = (int)value;
        if (*p == '\0') break;
        ok = *p++ == ',';
    }
    if (!ok) {
        free(list);
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: expected comma-separated %s indices such as 0,2 (non-negative "
                         "integers), got \"%s\"",
                         flag, item, text);
    }
    *out = list, *count = k;
    return LOOM_OK;
}

/* A flag the method does not use, set to something other than its default, is refused: it
 * would otherwise be dropped without a word. */
typedef struct {
    int set;
    const char *flag, *value, *who; /* who: what uses the flag */
} unused_flag;

static loom_status refuse_unused(const unused_flag *flags, int n, const char *method_flag,
                                 const char *method) {
    for (int i = 0; i < n; i++) {
        if (!flags[i].set) continue;
        return loom_fail(LOOM_ERR_INPUT, "%s%s%s: not used with %s %s (%s); drop it", flags[i].flag,
                         flags[i].value[0] ? " " : "", flags[i].value, method_flag, method,
                         flags[i].who);
    }
    return LOOM_OK;
}

static loom_status dp_from_flags(const loom_plan_compression_flags *f, loom_plan_compressor *c) {
    loom_compress_method m;
    loom_status st = loom_compress_method_parse(f->dp_compression, LOOM_COMPRESS_FOR_DP,
                                                "--dp-compression", "compression.dp.method", &m);
    if (st != LOOM_OK) return st;
    char rank[32], fraction[32], warmup[32];
    snprintf(rank, sizeof rank, "%d", f->dp_compression_rank);
    snprintf(fraction, sizeof fraction, "%g", f->dp_topk_fraction);
    snprintf(warmup, sizeof warmup, "%d", f->dp_compression_warmup_steps);
    int none = m == LOOM_COMPRESS_NONE;
    const unused_flag unused[] = {
        {!loom_plan_method_has_rank(m) && f->dp_compression_rank != LOOM_PLAN_DEFAULT_DP_RANK,
         "--dp-compression-rank", rank, "only powersgd has a rank"},
        {m != LOOM_COMPRESS_TOPK && f->dp_topk_fraction != LOOM_PLAN_DEFAULT_TOPK_FRACTION,
         "--dp-topk-fraction", fraction, "only topk keeps a fraction"},
        {none && f->dp_compression_warmup_steps != 0, "--dp-compression-warmup-steps", warmup,
         "nothing is compressed"},
        {none && f->dp_compression_stages[0], "--dp-compression-stages", f->dp_compression_stages,
         "nothing is compressed"},
        {none && f->no_error_feedback, "--no-error-feedback", "", "nothing is compressed"},
    };
    st = refuse_unused(unused, (int)(sizeof unused / sizeof unused[0]), "--dp-compression",
                       f->dp_compression);
    if (st != LOOM_OK) return st;
    c->method = m;
    c->rank = loom_plan_method_has_rank(m) ? f->dp_compression_rank : 0;
    c->fraction = f->dp_topk_fraction;
    c->error_feedback = !f->no_error_feedback;
    c->warmup_steps = f->dp_compression_warmup_steps;
    return parse_indices(f->dp_compression_stages, "--dp-compression-stages", "stage", &c->stages,
                         &c->num_stages);
}

static loom_status pp_from_flags(const loom_plan_compression_flags *f, loom_plan_compressor *c) {
    loom_compress_method m, forward;
    loom_status st = loom_compress_method_parse(f->pp_compression, LOOM_COMPRESS_FOR_PP_GRAD,
                                                "--pp-compression", "compression.pp.method", &m);
    if (st == LOOM_OK) {
        st = loom_compress_method_parse(f->pp_forward_compression, LOOM_COMPRESS_FOR_PP_FORWARD,
                                        "--pp-forward-compression", "compression.pp.forward",
                                        &forward);
    }
    if (st != LOOM_OK) return st;
    int policy = 0;
    st = loom_word_parse(&loom_plan_policies, f->pp_compression_policy, "--pp-compression-policy",
                         "compression.pp.policy", &policy);
    if (st != LOOM_OK) return st;
    char rank[32], fraction[32];
    snprintf(rank, sizeof rank, "%d", f->pp_compression_rank);
    snprintf(fraction, sizeof fraction, "%g", f->pp_topk_fraction);
    int none = m == LOOM_COMPRESS_NONE;
    const char *no_send = "no backward send is compressed";
    const unused_flag unused[] = {
        {!loom_plan_method_has_rank(m) && f->pp_compression_rank != LOOM_PLAN_DEFAULT_PP_RANK,
         "--pp-compression-rank", rank, "only lowrank has a rank"},
        {m != LOOM_COMPRESS_TOPK && f->pp_topk_fraction != LOOM_PLAN_DEFAULT_TOPK_FRACTION,
         "--pp-topk-fraction", fraction, "only topk keeps a fraction"},
        {none && f->pp_compression_links[0], "--pp-compression-links", f->pp_compression_links,
         no_send},
        {none && policy != LOOM_PP_POLICY_ALL, "--pp-compression-policy", f->pp_compression_policy,
         no_send},
        {none && f->no_lazy_error, "--no-lazy-error", "", no_send},
    };
    st = refuse_unused(unused, (int)(sizeof unused / sizeof unused[0]), "--pp-compression",
                       f->pp_compression);
    if (st != LOOM_OK) return st;
    c->method = m;
    c->rank = loom_plan_method_has_rank(m) ? f->pp_compression_rank : 0;
    c->fraction = f->pp_topk_fraction;
    c->lazy_error = !f->no_lazy_error;
    c->policy = (loom_pp_policy)policy;
    c->forward = forward;
    return parse_indices(f->pp_compression_links, "--pp-compression-links", "link", &c->stages,
                         &c->num_stages);
}

loom_status loom_plan_compression_from_flags(const loom_plan_compression_flags *f,
                                             loom_plan_compressor *dp, loom_plan_compressor *pp) {
    loom_plan_compressor_init(dp);
    loom_plan_compressor_init(pp);
    loom_status st = dp_from_flags(f, dp);
    if (st == LOOM_OK) st = pp_from_flags(f, pp);
    if (st != LOOM_OK) {
        loom_plan_compressor_free(dp);
        loom_plan_compressor_free(pp);
    }
    return st;
}

void loom_layout_flags_defaults(loom_layout_flags *f) {
    memset(f, 0, sizeof *f);
    loom_plan_compression_flags_defaults(&f->compression);
    f->zero = -1;
    f->zero3_prefetch = -1;
    /* the islands' outer settings at their defaults, so that a value given is checked as the
     * plan file's would be (0 inner steps refused, not taken for "not given") */
    f->inner_steps = LOOM_PLAN_DEFAULT_INNER_STEPS;
    f->outer_lr = LOOM_PLAN_DEFAULT_OUTER_LR;
    f->outer_momentum = LOOM_PLAN_DEFAULT_OUTER_MOMENTUM;
    f->outer_fragments = 1;
    f->outer_compression_rank = LOOM_PLAN_DEFAULT_DP_RANK;
    f->outer_topk_fraction = LOOM_PLAN_DEFAULT_TOPK_FRACTION;
}

loom_status loom_layout_flags_zero(const loom_layout_flags *f, int *zero) {
    *zero = f->zero;
    if (f->zero1 && f->no_zero1)
        return loom_fail(LOOM_ERR_INPUT, "--zero1 and --no-zero1 contradict each other: give one");
    int alias = f->zero1 ? 1 : f->no_zero1 ? 0 : -1;
    if (alias >= 0 && f->zero >= 0 && alias != f->zero) {
        return loom_fail(LOOM_ERR_INPUT, "%s and --zero %d contradict each other: give one",
                         f->zero1 ? "--zero1" : "--no-zero1", f->zero);
    }
    if (alias >= 0) *zero = alias;
    if (*zero < -1 || *zero > 3) {
        return loom_fail(LOOM_ERR_INPUT, "--zero: expected a ZeRO stage 0, 1, 2 or 3, got %d",
                         *zero);
    }
    return LOOM_OK;
}

loom_status loom_plan_from_flags(loom_plan *plan, const loom_gpt_config *model,
                                 const loom_layout_flags *f, int world_size) {
    loom_plan_init(plan);
    int zero;
    loom_status st = loom_layout_flags_zero(f, &zero);
    if (st != LOOM_OK) return st;
    int recompute = f->recompute;
    if (recompute < 0 || recompute >= LOOM_RECOMPUTE_COUNT) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--recompute: expected none, needed, always or selective, got %d",
                         recompute);
    }
    if (f->recompute_always && recompute != LOOM_RECOMPUTE_NONE &&
        recompute != LOOM_RECOMPUTE_AS_NEEDED && recompute != LOOM_RECOMPUTE_ALWAYS) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--recompute-always and --recompute %s contradict each other: give one",
                         loom_recompute_name(recompute));
    }
    if (f->recompute_always) recompute = LOOM_RECOMPUTE_ALWAYS;
    int gather = 0;
    if (f->zero3_gather[0]) {
        st = loom_word_parse(&loom_plan_zero3_gathers, f->zero3_gather, "--zero3-gather",
                             "mesh.zero3_gather", &gather);
        if (st != LOOM_OK) return st;
    }
    if (zero != 3 && (f->zero3_gather[0] || f->zero3_prefetch >= 0)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: expected only with --zero 3 (it says how ZeRO-3 "
                         "gathers parameters), got ZeRO stage %s",
                         f->zero3_gather[0] ? "--zero3-gather" : "--zero3-prefetch",
                         zero < 0    ? "the default"
                         : zero == 0 ? "0"
                         : zero == 1 ? "1"
                                     : "2");
    }
    loom_plan_islands islands;
    st = loom_plan_islands_from_flags(f, &islands);
    if (st != LOOM_OK) return st;
    loom_plan_compressor dp, pp;
    st = loom_plan_compression_from_flags(&f->compression, &dp, &pp);
    if (st != LOOM_OK) return st;
    loom_plan_request request = {.dp = f->data_parallel,
                                 .tp = f->tensor_parallel,
                                 .pp = f->pipeline_parallel,
                                 .micro_batch = f->micro_batch_size,
                                 .global_batch = f->global_batch_size,
                                 .micro_batches = f->micro_batches,
                                 .schedule = f->schedule,
                                 .virtual_stages = f->virtual_stages,
                                 .stage_layers = f->stage_layers,
                                 .recompute = recompute,
                                 .zero_given = zero >= 0,
                                 .zero = zero,
                                 .zero3_prefetch = f->zero3_prefetch,
                                 .zero3_gather = (loom_zero3_gather)gather,
                                 .sequence_parallel = f->sequence_parallel,
                                 .no_overlap_grad_reduce = f->no_overlap_grad_reduce,
                                 .dp_compression = &dp,
                                 .pp_compression = &pp,
                                 .embedding_sync = f->compression.embedding_sync,
                                 .islands = &islands};
    st = loom_plan_from_request(plan, model, &request, world_size);
    loom_plan_compressor_free(&dp);
    loom_plan_compressor_free(&pp);
    return st;
}

/* "0,2" (empty for none), truncated to cap. */
static void format_indices(const int *list, int n, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%d", i ? "," : "", list[i]);
}

void loom_plan_compression_flags_of(const loom_plan *plan, loom_plan_compression_flags *f) {
    loom_plan_compression_flags_defaults(f);
    const loom_plan_compressor *dp = &plan->dp_compression, *pp = &plan->pp_compression;
    snprintf(f->dp_compression, sizeof f->dp_compression, "%.15s",
             loom_compress_method_name(dp->method));
    if (dp->rank) f->dp_compression_rank = dp->rank;
    f->dp_topk_fraction = dp->fraction;
    f->dp_compression_warmup_steps = dp->warmup_steps;
    format_indices(dp->stages, dp->num_stages, f->dp_compression_stages,
                   sizeof f->dp_compression_stages);
    f->no_error_feedback = !dp->error_feedback;
    snprintf(f->pp_compression, sizeof f->pp_compression, "%.15s",
             loom_compress_method_name(pp->method));
    if (pp->rank) f->pp_compression_rank = pp->rank;
    f->pp_topk_fraction = pp->fraction;
    format_indices(pp->stages, pp->num_stages, f->pp_compression_links,
                   sizeof f->pp_compression_links);
    snprintf(f->pp_compression_policy, sizeof f->pp_compression_policy, "%.15s",
             loom_pp_policy_name(pp->policy));
    snprintf(f->pp_forward_compression, sizeof f->pp_forward_compression, "%.15s",
             loom_compress_method_name(pp->forward));
    f->no_lazy_error = !pp->lazy_error;
    snprintf(f->embedding_sync, sizeof f->embedding_sync, "%.15s",
             loom_embedding_sync_name(plan->embedding_sync));
}
