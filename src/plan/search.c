/*
 * search.c — the planner's search over layouts (loom/costmodel.h): every (dp, tp, pp), micro
 * batch, schedule, recomputation and ZeRO-1 choice for a device count; for layouts of one chunk
 * per rank, beside the even split, the stage DP's split (stage_dp.c); each predicted by the cost
 * model, ranked by step time among those that fit.
 *
 * Not here: the cost model (costmodel.c), the DP itself (stage_dp.c), the intra-op ILP.
 */
#include "loom/costmodel.h"
#include "loom/model.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const loom_cluster *cluster;
    const loom_search_request *request;
    loom_plan_candidate *best;
    int found, tried, fitting;
    int64_t least_short; /* the smallest shortfall of a layout that does not fit (bytes) */
    loom_prediction scratch;
} search;

/* Keeps the candidate if it is among the best `keep` so far (the list stays sorted). */
static void consider(search *s, loom_plan *plan, int zero1) {
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
    s->best[at].zero1 = zero1;
    s->best[at].prediction = *pr;
    s->found++;
}

/* Predicts the plan and keeps it if it fits and is among the best; the plan is consumed. */
static void predict(search *s, loom_plan *plan, int zero1) {
    s->tried++;
    if (loom_plan_predict(plan, s->cluster, s->request->precision, s->request->seq_len, zero1,
                          &s->scratch) != LOOM_OK) {
        loom_plan_free(plan);
        return;
    }
    int64_t shortfall = s->scratch.peak_bytes - s->cluster->memory_bytes;
    if (shortfall > 0) {
        if (s->least_short < 0 || shortfall < s->least_short) s->least_short = shortfall;
        loom_plan_free(plan);
        return;
    }
    s->fitting++;
    consider(s, plan, zero1);
}

/* The stage DP's split for a layout of one chunk per rank, as a --stage-layers text, and each
 * stage's recomputation (recompute[], the plan's stages); "" when the DP found the even split
 * without recomputation (or nothing that fits). */
static void dp_split(search *s, const loom_plan *even, int zero1, char *text, size_t cap,
                     int *recompute) {
    text[0] = '\0';
    loom_stage_problem problem;
    if (loom_plan_stage_problem(even, s->cluster, s->request->precision, s->request->seq_len, zero1,
                                1, &problem) != LOOM_OK)
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

/* Builds and predicts one plan of the layout (stage split: "" even; recompute: each stage's,
 * NULL: the request's); the request's compressors as given. */
static void try_plan(search *s, const loom_gpt_config *model, loom_plan_request *r,
                     const char *split, const int *recompute, int zero1) {
    loom_plan plan;
    r->stage_layers = split[0] ? split : NULL;
    if (loom_plan_from_request(&plan, model, r, 0) != LOOM_OK) return; /* not a valid layout */
    for (int i = 0; recompute && i < plan.num_stages; i++) plan.stages[i].recompute = recompute[i];
    snprintf(plan.precision, sizeof plan.precision, "%s",
             loom_precision_name(s->request->precision));
    predict(s, &plan, zero1);
}

static void try_layout(search *s, const loom_gpt_config *model, int dp, int tp, int pp, int micro,
                       const char *schedule, int recompute, int zero1) {
    loom_plan_request r = {.dp = dp,
                           .tp = tp,
                           .pp = pp,
                           .micro_batch = micro,
                           .global_batch = s->request->global_batch,
                           .schedule = schedule,
                           .recompute = recompute};
    /* the DP chooses each stage's recomputation too: once, from the layout without it, for the
     * schedules of one chunk per rank */
    char split[4096] = "";
    int *stage_recompute = NULL;
    loom_plan even;
    if (!s->request->even_stages && pp > 1 && !recompute &&
        loom_plan_schedule_chunks(schedule) == 1 &&
        loom_plan_from_request(&even, model, &r, 0) == LOOM_OK) {
        stage_recompute = calloc((size_t)even.num_stages, sizeof *stage_recompute);
        if (stage_recompute) dp_split(s, &even, zero1, split, sizeof split, stage_recompute);
        loom_plan_free(&even);
    }
    /* compression, where allowed and where it can apply: PowerSGD on the DP gradients (not
     * with ZeRO-1, whose parameter all-gather it cannot compress), low-rank on the pipeline's
     * backward sends, or both */
    loom_plan_compressor none, powersgd, lowrank;
    loom_plan_compressor_init(&none);
    loom_plan_compressor_init(&powersgd);
    loom_plan_compressor_init(&lowrank);
    snprintf(powersgd.method, sizeof powersgd.method, "powersgd");
    powersgd.rank = LOOM_PLAN_DEFAULT_DP_RANK;
    snprintf(lowrank.method, sizeof lowrank.method, "lowrank");
    lowrank.rank = LOOM_PLAN_DEFAULT_PP_RANK;
    int allow = s->request->allow_compression;
    int dp_ok = (allow & LOOM_ALLOW_DP_COMPRESSION) && dp > 1 && !zero1;
    int pp_ok = (allow & LOOM_ALLOW_PP_COMPRESSION) && pp > 1;
    for (int c = 0; c < 4; c++) {
        if (((c & 1) && !dp_ok) || ((c & 2) && !pp_ok)) continue;
        r.dp_compression = c & 1 ? &powersgd : &none;
        r.pp_compression = c & 2 ? &lowrank : &none;
        try_plan(s, model, &r, "", NULL, zero1);
        /* the DP's split beside the even one: the simulator ranks both */
        if (split[0]) try_plan(s, model, &r, split, stage_recompute, zero1);
    }
    free(stage_recompute);
}

loom_status loom_plan_search(const loom_gpt_config *model, const loom_cluster *cluster,
                             const loom_search_request *request, loom_plan_candidate *best,
                             int *found, int *tried, int *fitting) {
    *found = *tried = *fitting = 0;
    int64_t devices = (int64_t)cluster->max_nodes * cluster->devices_per_node;
    if (request->devices < 1 || request->devices > devices || request->keep < 1 ||
        request->global_batch < 1 || request->seq_len < 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: expected 1..%lld devices (got %d), a global batch >= 1 (got "
                         "%d), a sequence length >= 1 (got %d)",
                         (long long)devices, request->devices, request->global_batch,
                         request->seq_len);
    }
    search s = {.cluster = cluster, .request = request, .best = best, .least_short = -1};
    static const char *const schedules[] = {"1f1b", "interleaved", "zb-h1", "zb-v"};
    int n = request->devices;
    for (int tp = 1; tp <= n; tp++) {
        if (n % tp || loom_gpt_check_tp(model, tp, "search", "tp", "") != LOOM_OK) continue;
        for (int pp = 1; pp <= n / tp && pp <= model->num_layers; pp++) {
            if ((n / tp) % pp) continue;
            int dp = n / (tp * pp);
            if (request->global_batch % dp) continue;
            for (int micro = 1; micro <= request->global_batch / dp; micro *= 2) {
                if ((request->global_batch / dp) % micro) continue;
                for (int k = 0; k < (pp > 1 ? 4 : 1); k++) {
                    /* with one stage 1F1B holds one activation set whether or not it recomputes:
                     * recomputation there only costs time */
                    for (int recompute = 0; recompute < (pp > 1 ? 2 : 1); recompute++) {
                        for (int zero1 = 0; zero1 < (dp > 1 ? 2 : 1); zero1++) {
                            try_layout(&s, model, dp, tp, pp, micro, schedules[k], recompute,
                                       zero1);
                        }
                    }
                }
            }
        }
    }
    loom_clear_error();
    *found = s.found, *tried = s.tried, *fitting = s.fitting;
    if (s.found == 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "plan search: none of the %d layouts of %d devices fits the device's "
                         "%.2f GiB; the closest is %.2f GiB short per rank",
                         s.tried, n, (double)cluster->memory_bytes / 1073741824.0,
                         s.least_short > 0 ? (double)s.least_short / 1073741824.0 : 0.0);
    }
    return LOOM_OK;
}
