/*
 * search.c — the planner's search over layouts (loom/costmodel.h): every (dp, tp, pp), micro
 * batch, schedule, recomputation and ZeRO-1 choice for a device count; for pipelines, beside the
 * even split, the stage DP's split (stage_dp.c; exact for one chunk per rank, a heuristic over
 * the virtual stages for interleaved and zb-v); each predicted by the cost model, ranked by step
 * time among those that fit.
 *
 * Not here: the cost model (costmodel.c), the DP itself (stage_dp.c), the intra-op ILP.
 */
#include "loom/planner.h"
#include "loom/model.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const loom_cluster *cluster;
    loom_cluster free_links; /* the cluster with free links and codecs: compression's bound */
    const loom_search_request *request;
    loom_plan_candidate *best;
    int found, tried, fitting, pruned;
    int64_t least_short;      /* the smallest shortfall of a layout that does not fit (bytes) */
    loom_rank_memory closest; /* that layout's fullest rank */
    /* why nothing may be found: splits of the devices the model and the batch allow, micro-batch
     * sizes left out for too many micro-batches, plans the cost model refused (and its last
     * word), plans that are no valid layout (and the last reason) */
    int splits, too_many_micro, refused, invalid;
    char refusal[256], invalidity[256];
    loom_prediction scratch;
} search;

/* The compressors the search may choose (--allow-compression): for the DP gradients PowerSGD at
 * the default rank and the two quantisers whose loss matched the uncompressed run; for the
 * pipeline's backward sends low-rank under each policy and the quantisers. top-k and sign are
 * left to the user (their loss was measured worse). */
typedef struct {
    loom_compress_method method;
    int rank;
    loom_pp_policy policy;
} compressor_choice;
static const compressor_choice dp_choices[] = {
    {LOOM_COMPRESS_POWERSGD, LOOM_PLAN_DEFAULT_DP_RANK, LOOM_PP_POLICY_ALL},
    {LOOM_COMPRESS_INT8, 0, LOOM_PP_POLICY_ALL},
    {LOOM_COMPRESS_BF16, 0, LOOM_PP_POLICY_ALL}};
static const compressor_choice pp_choices[] = {
    {LOOM_COMPRESS_LOWRANK, LOOM_PLAN_DEFAULT_PP_RANK, LOOM_PP_POLICY_ALL},
    {LOOM_COMPRESS_LOWRANK, LOOM_PLAN_DEFAULT_PP_RANK, LOOM_PP_POLICY_EPILOGUE},
    {LOOM_COMPRESS_LOWRANK, LOOM_PLAN_DEFAULT_PP_RANK, LOOM_PP_POLICY_SLACK},
    {LOOM_COMPRESS_INT8, 0, LOOM_PP_POLICY_ALL},
    {LOOM_COMPRESS_BF16, 0, LOOM_PP_POLICY_ALL}};
#define DP_CHOICES ((int)(sizeof dp_choices / sizeof dp_choices[0]))
#define PP_CHOICES ((int)(sizeof pp_choices / sizeof pp_choices[0]))

/* Keeps the candidate if it is among the best `keep` so far (the list stays sorted). */
static void consider(search *s, loom_plan *plan) {
    const loom_prediction *pr = &s->scratch;
    int keep = s->request->keep, at = s->found;
    while (at > 0 && s->best[at - 1].prediction.step_s > pr->step_s) at--;
    if (at >= keep) {
        loom_plan_free(plan);
        return;
    }
    if (s->found == keep) {
        loom_plan_free(&s->best[keep - 1].plan);
        s->found--;
    }
    memmove(&s->best[at + 1], &s->best[at], (size_t)(s->found - at) * sizeof *s->best);
    s->best[at].plan = *plan;
    s->best[at].prediction = *pr;
    s->found++;
}

static double entry_bar(const search *s);

/* Predicts the plan into s->scratch: its step time when it fits the device, else -1 (and
 * notes the shortfall), or -1 when the cost model refuses it or when its compute alone
 * (loom_plan_step_bound) is already no faster than every plan kept (counted as pruned). */
static double step_if_fits(search *s, const loom_plan *plan) {
    double bound;
    if (s->found == s->request->keep &&
        loom_plan_step_bound(plan, s->cluster, s->request->precision, s->request->seq_len, &bound,
                             NULL) == LOOM_OK &&
        bound >= entry_bar(s)) {
        s->pruned++;
        return -1;
    }
    /* memory first: most layouts that do not fit are known before simulating them */
    loom_rank_memory peak;
    int peak_rank;
    if (loom_plan_peak_memory(plan, s->request->seq_len, &peak_rank, &peak) == LOOM_OK &&
        peak.total > s->cluster->memory_bytes) {
        int64_t shortfall = peak.total - s->cluster->memory_bytes;
        if (s->least_short < 0 || shortfall < s->least_short)
            s->least_short = shortfall, s->closest = peak;
        s->tried++;
        return -1;
    }
    s->tried++;
    if (loom_plan_predict(plan, s->cluster, s->request->precision, s->request->seq_len,
                          &s->scratch) != LOOM_OK) {
        s->refused++;
        snprintf(s->refusal, sizeof s->refusal, "%s", loom_last_error());
        return -1;
    }
    int64_t shortfall = s->scratch.peak_bytes - s->cluster->memory_bytes;
    if (shortfall > 0) {
        if (s->least_short < 0 || shortfall < s->least_short) s->least_short = shortfall;
        return -1;
    }
    s->fitting++;
    return s->scratch.step_s;
}

/* Predicts the plan and keeps it if it fits and is among the best; the plan is consumed. */
static void predict(search *s, loom_plan *plan) {
    if (step_if_fits(s, plan) < 0) {
        loom_plan_free(plan);
        return;
    }
    consider(s, plan);
}

/* The slowest step kept so far when the list is full (a plan must beat it to enter), else
 * infinity. */
static double entry_bar(const search *s) {
    return s->found == s->request->keep ? s->best[s->found - 1].prediction.step_s : 1e300;
}

/* The stage DP's split for a pipeline, as a --stage-layers text (one count per virtual stage),
 * and each stage's recomputation (recompute[], the plan's stages; none with several chunks per
 * rank); "" when the DP found the even split without recomputation (or nothing that fits). */
static void dp_split(search *s, const loom_plan *even, char *text, size_t cap, int *recompute) {
    text[0] = '\0';
    loom_stage_problem problem;
    if (loom_plan_stage_problem(even, s->cluster, s->request->precision, s->request->seq_len, 1,
                                &problem) != LOOM_OK)
        return;
    int *counts = calloc((size_t)problem.stages, sizeof *counts);
    double latency;
    if (counts && loom_stage_dp(&problem, counts, recompute, &latency, NULL) == LOOM_OK) {
        int changed = 0;
        size_t used = 0;
        for (int i = 0; i < problem.stages && used < cap; i++) {
            const loom_plan_stage *st = &even->stages[i];
            changed |= counts[i] != st->end_layer - st->first_layer || recompute[i];
            used += (size_t)snprintf(text + used, cap - used, "%s%d", i ? "," : "", counts[i]);
        }
        if (!changed || used >= cap) text[0] = '\0';
    }
    free(counts);
    loom_stage_problem_free(&problem);
}

/* Sets a plan compressor to a choice, every stage or link listed; "none" for NULL. */
static void set_compressor(loom_plan_compressor *c, const compressor_choice *choice) {
    loom_plan_compressor_free(c); /* back to the defaults: "none", every stage */
    if (!choice) return;
    c->method = choice->method;
    c->policy = choice->policy;
    c->rank = choice->rank;
}

/* Sets the compressor's list to the stages whose flag is set ("all" when every one is, method
 * "none" when none is, with the method kept in `method`). */
static int set_listed(loom_plan_compressor *c, const unsigned char *in, int count,
                      loom_compress_method method) {
    free(c->stages);
    c->stages = NULL, c->num_stages = 0;
    int n = 0;
    for (int i = 0; i < count; i++) n += in[i];
    c->method = n ? method : LOOM_COMPRESS_NONE;
    if (n == 0 || n == count) return 1;
    c->stages = malloc((size_t)n * sizeof *c->stages);
    if (!c->stages) return 0;
    for (int i = 0; i < count; i++)
        if (in[i]) c->stages[c->num_stages++] = i;
    return 1;
}

/* Drops the stages (pipeline ranks for DP, links for the pipeline) one at a time from the
 * compressor's list where the step does not get slower without them: compression stays only
 * where it shortens the predicted step. *step is the plan's, and stays its. */
static void prune_stages(search *s, loom_plan *plan, loom_plan_compressor *c, int count,
                         double *step) {
    if (c->method == LOOM_COMPRESS_NONE || count < 1) return;
    loom_compress_method method = c->method;
    unsigned char *in = malloc((size_t)count);
    if (!in) return;
    memset(in, 1, (size_t)count);
    for (int i = 0; i < count; i++) {
        in[i] = 0;
        double t = set_listed(c, in, count, method) ? step_if_fits(s, plan) : -1;
        if (t >= 0 && t <= *step * (1 + 1e-9)) {
            *step = t;
        } else {
            in[i] = 1;
        }
    }
    if (!set_listed(c, in, count, method))
        set_listed(c, in, 0, LOOM_COMPRESS_NONE); /* out of memory */
    free(in);
}

/* Compression as a decision: for a plan that fits, every allowed pair of a DP and a pipeline
 * compressor, each on every stage and link; the fastest pair, if it beats the plan without
 * compression, then loses the stages and links where it does not help (prune_stages), and is
 * kept beside the plain plan. Skipped where no compression could win: the plan with free links
 * and codecs is a lower bound on every compressed variant. */
static void try_compression(search *s, const loom_plan *plain, double plain_step) {
    int allow = s->request->allow_compression;
    int dp_ok = (allow & LOOM_ALLOW_DP_COMPRESSION) && plain->dp > 1 && !plain->zero;
    int pp_ok = (allow & LOOM_ALLOW_PP_COMPRESSION) && plain->pp > 1;
    if (!dp_ok && !pp_ok) return;
    loom_prediction bound;
    if (loom_plan_predict(plain, &s->free_links, s->request->precision, s->request->seq_len,
                          &bound) != LOOM_OK ||
        bound.step_s >= plain_step * (1 - 1e-9) || bound.step_s >= entry_bar(s))
        return;
    loom_plan plan;
    if (loom_plan_copy(&plan, plain) != LOOM_OK) return;
    double best = plain_step;
    int best_dp = -1, best_pp = -1;
    for (int d = -1; d < (dp_ok ? DP_CHOICES : 0); d++) {
        for (int q = -1; q < (pp_ok ? PP_CHOICES : 0); q++) {
            if (d < 0 && q < 0) continue;
            set_compressor(&plan.dp_compression, d >= 0 ? &dp_choices[d] : NULL);
            set_compressor(&plan.pp_compression, q >= 0 ? &pp_choices[q] : NULL);
            double t = step_if_fits(s, &plan);
            if (t >= 0 && t < best * (1 - 1e-9)) best = t, best_dp = d, best_pp = q;
        }
    }
    if (best_dp < 0 && best_pp < 0) {
        loom_plan_free(&plan);
        return;
    }
    set_compressor(&plan.dp_compression, best_dp >= 0 ? &dp_choices[best_dp] : NULL);
    set_compressor(&plan.pp_compression, best_pp >= 0 ? &pp_choices[best_pp] : NULL);
    prune_stages(s, &plan, &plan.dp_compression, plan.pp, &best);
    prune_stages(s, &plan, &plan.pp_compression, plan.num_stages - 1, &best);
    predict(s, &plan);
}

/* Builds and predicts one plan of the layout (stage split: "" even; recompute: each stage's
 * stage-DP option, NULL: the request's), and its compressed variants where allowed. Returns
 * whether it fits (or was pruned by its compute alone, which says nothing of its memory: a
 * pruned layout counts as fitting, so that no more memory-saving variant of it is tried). */
static int try_plan(search *s, const loom_gpt_config *model, loom_plan_request *r,
                    const char *split, const int *recompute) {
    loom_plan plan;
    r->stage_layers = split[0] ? split : NULL;
    if (loom_plan_from_request(&plan, model, r, 0) != LOOM_OK) { /* not a valid layout */
        s->invalid++;
        snprintf(s->invalidity, sizeof s->invalidity, "%s", loom_last_error());
        return 0;
    }
    for (int i = 0; recompute && i < plan.num_stages; i++)
        plan.stages[i].recompute = loom_stage_option_recompute(recompute[i]);
    plan.precision = s->request->precision;
    int pruned = s->pruned;
    double step = step_if_fits(s, &plan);
    if (step < 0) {
        loom_plan_free(&plan);
        return s->pruned > pruned;
    }
    if (s->request->allow_compression) {
        loom_prediction mine = s->scratch; /* try_compression predicts others into it */
        try_compression(s, &plan, step);
        s->scratch = mine;
    }
    consider(s, &plan);
    return 1;
}

/* One layout with one recomputation mode, ZeRO stage and sequence parallelism: the even split
 * and, for a pipeline without a recomputation mode of its own, the stage DP's (which chooses
 * each stage's recomputation too where a rank runs one chunk: a rank's chunks must agree).
 * Returns whether one of them fits. */
static int try_layout(search *s, const loom_gpt_config *model, int dp, int tp, int pp, int micro,
                      const char *schedule, int recompute, int zero, int sequence_parallel) {
    loom_plan_request r = {.dp = dp,
                           .tp = tp,
                           .pp = pp,
                           .micro_batch = micro,
                           .global_batch = s->request->global_batch,
                           .schedule = schedule,
                           .recompute = recompute,
                           .zero_given = 1,
                           .zero = zero,
                           .zero3_prefetch = 1,
                           .zero3_gather = LOOM_ZERO3_GATHER_MICRO_BATCH,
                           .sequence_parallel = sequence_parallel};
    /* the DP splits every pipeline once, from the layout without recomputation */
    char split[4096] = "";
    int *stage_recompute = NULL;
    loom_plan even;
    if (!s->request->even_stages && pp > 1 && !recompute &&
        loom_plan_from_request(&even, model, &r, 0) == LOOM_OK) {
        /* no split can beat the mean rank's compute: skip the DP when that is out already */
        double busiest, mean;
        int hopeless = s->found == s->request->keep &&
                       loom_plan_step_bound(&even, s->cluster, s->request->precision,
                                            s->request->seq_len, &busiest, &mean) == LOOM_OK &&
                       mean >= entry_bar(s);
        stage_recompute =
            hopeless ? NULL : calloc((size_t)even.num_stages, sizeof *stage_recompute);
        if (stage_recompute) dp_split(s, &even, split, sizeof split, stage_recompute);
        loom_plan_free(&even);
    }
    int fits = try_plan(s, model, &r, "", NULL);
    /* the DP's split beside the even one: the simulator ranks both */
    if (split[0]) fits |= try_plan(s, model, &r, split, stage_recompute);
    free(stage_recompute);
    return fits;
}

/* The memory-saving choices of a layout, each tried only where the cheaper ones do not fit
 * (each costs time in the cost model: more recomputation, more data-parallel traffic): for the
 * recomputation modes none, selective, full in turn, the ZeRO stages 0 and 1 (dp > 1), then 2
 * and then 3 while none fits; a more recomputing mode only where the last one needed ZeRO-2 or
 * more, and then only below the ZeRO stage that fitted. ZeRO-3 gathers per micro-batch with one
 * unit prefetched: gathering once per step holds more than ZeRO-2 and is no faster, so the
 * search leaves it out. With one stage full recomputation holds as much as none (1F1B keeps one
 * activation set either way) and is left out. Sequence parallelism (tp > 1) is tried both ways:
 * it saves memory and may save or cost time. */
static void try_memory_choices(search *s, const loom_gpt_config *model, int dp, int tp, int pp,
                               int micro, const char *schedule) {
    static const int modes[] = {LOOM_RECOMPUTE_NONE, LOOM_RECOMPUTE_SELECTIVE,
                                LOOM_RECOMPUTE_AS_NEEDED};
    for (int sp = 0; sp < (tp > 1 ? 2 : 1); sp++) {
        int fitted = 4; /* the lowest ZeRO stage that fitted; 4: none did */
        for (int i = 0; i < 3 && fitted > 1; i++) {
            if (modes[i] == LOOM_RECOMPUTE_AS_NEEDED && pp == 1) continue;
            int lowest = fitted;
            for (int zero = 0; zero < (dp > 1 ? fitted : 1); zero++) {
                if (zero >= 2 && lowest < zero) break; /* a lower stage fitted */
                if (try_layout(s, model, dp, tp, pp, micro, schedule, modes[i], zero, sp) &&
                    zero < lowest)
                    lowest = zero;
            }
            fitted = lowest;
        }
    }
}

/* The request's sizes, each within what the search counts (loom/planner.h's bounds), and a
 * peak for its precision on the cluster's device. */
static loom_status check_request(const loom_cluster *cluster, const loom_search_request *r) {
    int64_t devices = (int64_t)cluster->max_nodes * cluster->devices_per_node;
    if (devices > LOOM_SEARCH_MAX_DEVICES) devices = LOOM_SEARCH_MAX_DEVICES;
    if (r->devices < 1 || r->devices > devices) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: devices (--devices): expected 1 to %lld (the cluster's "
                         "%d x %d, at most %d), got %d",
                         (long long)devices, cluster->max_nodes, cluster->devices_per_node,
                         LOOM_SEARCH_MAX_DEVICES, r->devices);
    }
    if (r->global_batch < 1 || r->global_batch > LOOM_SEARCH_MAX_GLOBAL_BATCH) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: global batch (--global-batch-size): expected 1 to %d "
                         "sequences (the most the search counts), got %d",
                         LOOM_SEARCH_MAX_GLOBAL_BATCH, r->global_batch);
    }
    if (r->seq_len < 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: sequence length (--seq-len): expected >= 1, got %d",
                         r->seq_len);
    }
    if (r->keep < 1) {
        return loom_fail(LOOM_ERR_INPUT, "plan search: keep: expected >= 1, got %d", r->keep);
    }
    if (!(cluster->peak_flops[r->precision] > 0)) {
        char offered[64] = "";
        size_t used = 0;
        for (int p = 0; p < LOOM_PRECISIONS; p++) {
            if (!(cluster->peak_flops[p] > 0) || used >= sizeof offered) continue;
            used += (size_t)snprintf(offered + used, sizeof offered - used, "%s%s",
                                     used ? ", " : "", loom_precision_name((loom_precision)p));
        }
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: precision (--precision) %s: the cluster %s has no %s peak "
                         "(node.device.peak_flops.%s is 0: not offered); it offers %s",
                         loom_precision_name(r->precision), cluster->name,
                         loom_precision_name(r->precision), loom_precision_name(r->precision),
                         offered[0] ? offered : "none");
    }
    return LOOM_OK;
}

/* Why the search kept nothing, from what it counted: no split of the devices, every split with
 * too many micro-batches, no valid layout, every plan refused by the cost model, or none within
 * the device's memory. */
static loom_status explain_none(const search *s, const loom_gpt_config *model, int n) {
    const loom_search_request *r = s->request;
    if (s->splits == 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: no layout of %d devices: a split dp x tp x pp = %d needs "
                         "tp dividing the model's %d heads and its padded vocabulary %d, pp at "
                         "most its %d layers, and dp dividing the global batch %d; none does",
                         n, n, model->num_heads, model->padded_vocab_size, model->num_layers,
                         r->global_batch);
    }
    if (s->tried == 0 && s->invalid == 0 && s->too_many_micro > 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: no layout of %d devices for global batch %d: every one "
                         "runs more than %d micro-batches per step (the most the search "
                         "simulates; micro-batch sizes are the powers of two dividing a "
                         "replica's share of the batch)",
                         n, r->global_batch, LOOM_SEARCH_MAX_MICRO_BATCHES);
    }
    if (s->tried == 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: no valid layout of %d devices; the last "
                         "refused: %s",
                         n, s->invalidity);
    }
    if (s->least_short < 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: the cost model refused all %d layouts of %d devices; the "
                         "last: %s",
                         s->tried, n, s->refusal);
    }
    char why[256];
    loom_rank_memory_why(&s->closest, s->cluster->memory_bytes, why, sizeof why);
    return loom_fail(LOOM_ERR_INPUT,
                     "plan search: none of the %d layouts of %d devices fits the device's "
                     "%.2f GiB; the closest is %.2f GiB short per rank (%s)",
                     s->tried, n, (double)s->cluster->memory_bytes / 1073741824.0,
                     (double)s->least_short / 1073741824.0, why);
}

loom_status loom_plan_search(const loom_gpt_config *model, const loom_cluster *cluster,
                             const loom_search_request *request, loom_plan_candidate *best,
                             int *found, int *tried, int *fitting, int *pruned) {
    *found = *tried = *fitting = 0;
    if (pruned) *pruned = 0;
    loom_status st = check_request(cluster, request);
    if (st != LOOM_OK) return st;
    search s = {.cluster = cluster, .request = request, .best = best, .least_short = -1};
    s.free_links = *cluster;
    s.free_links.num_collectives = 0;
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) s.free_links.links[l] = (loom_link){1e30, 0.0, 0.0};
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) s.free_links.compressor_bytes_per_s[m] = 1e30;
    static const char *const schedules[] = {"1f1b", "interleaved", "zb-h1", "zb-v"};
    int n = request->devices;
    /* the work is bounded by the layouts, not the sizes: tp up to the heads, pp up to the layers,
     * micro-batch sizes the powers of two dividing a replica's batch (at most 21 of them), each
     * simulated only with at most LOOM_SEARCH_MAX_MICRO_BATCHES micro-batches per step */
    for (int tp = 1; tp <= n && tp <= model->num_heads; tp++) {
        if (n % tp || loom_gpt_check_tp(model, tp, "search", "tp", "") != LOOM_OK) continue;
        for (int pp = 1; pp <= n / tp && pp <= model->num_layers; pp++) {
            if ((n / tp) % pp) continue;
            int dp = n / (tp * pp);
            if (request->global_batch % dp) continue;
            s.splits++;
            int64_t per_replica = request->global_batch / dp;
            for (int64_t micro = 1; micro <= per_replica; micro *= 2) {
                if (per_replica % micro) break; /* no larger power of two divides it either */
                if (per_replica / micro > LOOM_SEARCH_MAX_MICRO_BATCHES) {
                    s.too_many_micro++;
                    continue;
                }
                for (int k = 0; k < (pp > 1 ? 4 : 1); k++)
                    try_memory_choices(&s, model, dp, tp, pp, (int)micro, schedules[k]);
            }
        }
    }
    loom_clear_error();
    *found = s.found, *tried = s.tried, *fitting = s.fitting;
    if (pruned) *pruned = s.pruned;
    return s.found == 0 ? explain_none(&s, model, n) : LOOM_OK;
}
