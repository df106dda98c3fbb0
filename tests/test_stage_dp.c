/*
 * test_stage_dp.c — Alpa's stage DP (loom/costmodel.h) against brute force: on random tables
 * (times of every class and layer count, memory that rules some splits out) and on the cost
 * model's own tables for every layout of 8 devices and an 8-layer model, the DP's split has the
 * least closed-form latency of all splits, enumerated one by one and scored here; the tables
 * put the LM head's cost on the last stage; the search with the DP is never slower than with
 * even stages only, and gives the last stage fewer layers when the head is heavy.
 */
#include "check.h"
#include "loom/planner.h"
#include "loom/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STAGES 8
#define MAX_LAYERS 12

/* The closed form scored here, apart from the library: sum + (B - 1) max, INFINITY when a stage
 * does not fit; options[s] each stage's table (recomputation or not). */
static double score(const loom_stage_problem *p, const int *counts, const int *options) {
    double sum = 0, worst = 0;
    for (int s = 0; s < p->stages; s++) {
        int c = p->stages == 1       ? LOOM_STAGE_ONLY
                : s == 0             ? LOOM_STAGE_FIRST
                : s == p->stages - 1 ? LOOM_STAGE_LAST
                                     : LOOM_STAGE_MIDDLE;
        size_t i = ((size_t)options[s] * LOOM_STAGE_CLASSES + (size_t)c) * (size_t)(p->layers + 1) +
                   (size_t)counts[s];
        double t = p->time[i];
        if (!isfinite(t)) return INFINITY;
        if (p->memory_bytes > 0 &&
            p->memory[i] + p->per_flight[i] * p->in_flight[s] > p->memory_bytes)
            return INFINITY;
        sum += t;
        worst = t > worst ? t : worst;
    }
    return sum + (p->micro_batches - 1) * worst;
}

/* Every choice of every stage's option, the least score (INFINITY: none fits). */
static double every_option(const loom_stage_problem *p, const int *counts, int *options,
                           int stage) {
    if (stage == p->stages) return score(p, counts, options);
    double best = INFINITY;
    for (int o = 0; o < p->options; o++) {
        options[stage] = o;
        double t = every_option(p, counts, options, stage + 1);
        if (t < best) best = t;
    }
    return best;
}

/* Every split of the layers into positive counts (and every option of each stage), the least
 * score (INFINITY: none fits). */
static double brute_force(const loom_stage_problem *p, int *counts, int stage, int left) {
    if (stage == p->stages - 1) {
        counts[stage] = left;
        int options[MAX_STAGES] = {0};
        return every_option(p, counts, options, 0);
    }
    double best = INFINITY;
    for (int n = 1; n <= left - (p->stages - stage - 1); n++) {
        counts[stage] = n;
        double t = brute_force(p, counts, stage + 1, left - n);
        if (t < best) best = t;
    }
    return best;
}

/* The DP's optimum equals brute force, and its split scores what it says. */
static void check_against_brute_force(const loom_stage_problem *p, const char *what) {
    int counts[MAX_STAGES], scratch[MAX_STAGES], options[MAX_STAGES] = {0};
    double latency = 0;
    int tried = 0;
    loom_status st = loom_stage_dp(p, counts, options, &latency, &tried);
    double expected = brute_force(p, scratch, 0, p->layers);
    if (!isfinite(expected)) {
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "fits"),
              "%s: nothing fits, the DP says %d (%s)", what, st, loom_last_error());
        loom_clear_error();
        return;
    }
    CHECK(st == LOOM_OK, "%s: %s", what, loom_last_error());
    if (st != LOOM_OK) return;
    CHECK(fabs(latency - expected) <= 1e-12 * expected, "%s: DP %.17g, brute force %.17g", what,
          latency, expected);
    double own = score(p, counts, options);
    CHECK(fabs(own - latency) <= 1e-12 * expected, "%s: the split scores %.17g, the DP says %.17g",
          what, own, latency);
    CHECK(tried >= 1, "%s: %d bounds tried", what, tried);
}

static unsigned next_random(unsigned *state) {
    *state = *state * 1103515245u + 12345u;
    return (*state >> 8) & 0xffffu;
}

static void test_random_tables(void) {
    double time[2 * LOOM_STAGE_CLASSES * (MAX_LAYERS + 1)];
    int64_t memory[2 * LOOM_STAGE_CLASSES * (MAX_LAYERS + 1)];
    int64_t per_flight[2 * LOOM_STAGE_CLASSES * (MAX_LAYERS + 1)];
    int in_flight[MAX_STAGES];
    unsigned seed = 7;
    int cases = 0, infeasible = 0, mixed = 0;
    for (int trial = 0; trial < 400; trial++) {
        /* every other case: a second table per stage (recomputation: slower, less memory); the
         * brute force then tries 2^S choices per split, so at most 8 layers there */
        int options = 1 + trial % 2;
        int L = 1 + (int)(next_random(&seed) % (options == 2 ? 8 : MAX_LAYERS));
        int S = 1 + (int)(next_random(&seed) % (unsigned)(L < MAX_STAGES ? L : MAX_STAGES));
        loom_stage_problem p = {.stages = S,
                                .layers = L,
                                .micro_batches = 1 + (int)(next_random(&seed) % 16),
                                .options = options,
                                .time = time,
                                .memory = memory,
                                .per_flight = per_flight,
                                .in_flight = in_flight};
        int additive = trial % 4 < 2; /* half like real layers (n x layer + a class's extra) */
        for (int c = 0; c < LOOM_STAGE_CLASSES; c++) {
            double extra = (double)(next_random(&seed) % 50) / 10.0;
            for (int n = 0; n <= L; n++) {
                size_t i = (size_t)c * (size_t)(L + 1) + (size_t)n;
                size_t j = i + (size_t)LOOM_STAGE_CLASSES * (size_t)(L + 1); /* option 1 */
                time[i] = additive ? n * 1.0 + extra : 0.5 + (double)(next_random(&seed) % 100);
                memory[i] = 100 * n + (int64_t)(next_random(&seed) % 100);
                per_flight[i] = 10 * n;
                time[j] = time[i] * (1.0 + (double)(next_random(&seed) % 60) / 100.0);
                memory[j] = memory[i] / 2 + (int64_t)(next_random(&seed) % 50);
                per_flight[j] = n;
            }
        }
        for (int s = 0; s < S; s++) in_flight[s] = S - s; /* 1F1B */
        /* a third without a limit, the rest with one that rules out some (or every) split */
        p.memory_bytes = trial % 3 == 0 ? 0 : 100 + (int64_t)(next_random(&seed) % 1500);
        char what[96];
        snprintf(what, sizeof what, "random %d (S %d, L %d, B %d, %d options, limit %lld)", trial,
                 S, L, p.micro_batches, options, (long long)p.memory_bytes);
        int counts[MAX_STAGES];
        infeasible += !isfinite(brute_force(&p, counts, 0, L));
        check_against_brute_force(&p, what);
        if (options == 2) { /* does the optimum mix the options? */
            int chosen[MAX_STAGES] = {0}, ones = 0;
            double latency;
            if (loom_stage_dp(&p, counts, chosen, &latency, NULL) == LOOM_OK) {
                for (int s = 0; s < S; s++) ones += chosen[s];
                mixed += ones > 0 && ones < S;
            }
            loom_clear_error();
        }
        cases++;
    }
    CHECK(cases == 400 && infeasible > 10 && infeasible < 300, "%d cases, %d with no split", cases,
          infeasible);
    CHECK(mixed >= 5, "%d optima recompute on some stages and not on others", mixed);
}

/* A cluster with perfect GEMMs and slow memory, so that the head's logits cost. */
static loom_cluster cluster_of(int devices, int64_t memory) {
    loom_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "test");
    c.nodes = 1, c.max_nodes = 1, c.devices_per_node = devices;
    c.memory_bytes = memory;
    c.peak_flops[LOOM_PRECISION_FP32] = 1e12;
    c.memory_bandwidth = 1e11;
    c.gemm[0] = (loom_gemm_point){1.0, 1.0};
    c.gemm_points = 1;
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) c.links[l] = (loom_link){1e10, 1e-6, 0.0};
    return c;
}

static loom_gpt_config model_of(int layers) {
    loom_gpt_config m;
    loom_gpt_preset("gpt2", &m);
    m.num_layers = layers, m.channels = 256, m.num_heads = 4;
    return m;
}

/* The cost model's tables: classes and counts as the cost model costs whole plans. */
static void test_tables(void) {
    loom_gpt_config model = model_of(8);
    loom_cluster cl = cluster_of(8, (int64_t)1 << 40);
    loom_plan plan;
    CHECK(loom_plan_uniform(&plan, &model, 1, 1, 4, 2, 16, LOOM_SCHEDULE_1F1B, 0, NULL) == LOOM_OK,
          "plan: %s", loom_last_error());
    loom_stage_problem p;
    CHECK(loom_plan_stage_problem(&plan, &cl, LOOM_PRECISION_FP32, 64, 0, &p) == LOOM_OK,
          "problem: %s", loom_last_error());
    size_t row = (size_t)p.layers + 1;
    CHECK(p.stages == 4 && p.layers == 8 && p.micro_batches == 8, "shape %d %d %d", p.stages,
          p.layers, p.micro_batches);
    for (int s = 0; s < 4; s++) CHECK(p.in_flight[s] == 4 - s, "stage %d in flight", s);
    /* the even plan's own predicted stage times are the table's */
    loom_prediction pr;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict");
    for (int s = 0; s < 4; s++) {
        double t = p.time[(size_t)loom_stage_class_of(s, 4) * row + 2];
        CHECK_CLOSE(t, pr.stage[s].forward_s + pr.stage[s].backward_s, 1e-12, 0, "stage time");
    }
    CHECK(p.time[LOOM_STAGE_LAST * row + 2] > 1.2 * p.time[LOOM_STAGE_MIDDLE * row + 2],
          "the head costs: last %g, middle %g", p.time[LOOM_STAGE_LAST * row + 2],
          p.time[LOOM_STAGE_MIDDLE * row + 2]);
    CHECK(!isfinite(p.time[LOOM_STAGE_ONLY * row + 8]) &&
              !isfinite(p.time[LOOM_STAGE_MIDDLE * row + 6]),
          "classes that cannot exist");
    for (int n = 2; n <= 5; n++) { /* a middle stage of 4 holds at most 8 - 3 */
        size_t i = LOOM_STAGE_MIDDLE * row + (size_t)n;
        CHECK(p.time[i] > p.time[i - 1] && p.memory[i] > p.memory[i - 1] &&
                  p.per_flight[i] > p.per_flight[i - 1],
              "middle stage grows with its layers at %d", n);
    }
    /* the heavy head: the DP takes layers off the last stage */
    int counts[4];
    double latency;
    CHECK(loom_stage_dp(&p, counts, NULL, &latency, NULL) == LOOM_OK, "dp: %s", loom_last_error());
    CHECK(counts[3] < 2 && counts[0] + counts[1] + counts[2] + counts[3] == 8,
          "the last stage keeps %d layers (%d %d %d %d)", counts[3], counts[0], counts[1],
          counts[2], counts[3]);
    int even[4] = {2, 2, 2, 2};
    CHECK(latency < loom_stage_latency(&p, even, NULL), "the DP's split beats the even one");
    loom_stage_problem_free(&p);
    /* three options per stage: full recomputation costs time and saves memory per activation
     * set; selective costs less time than full and saves less memory, more than none */
    CHECK(loom_plan_stage_problem(&plan, &cl, LOOM_PRECISION_FP32, 64, 1, &p) == LOOM_OK &&
              p.options == 3,
          "per-stage problem: %s", loom_last_error());
    size_t off = (size_t)LOOM_STAGE_CLASSES * row, sel = 2 * off;
    for (int n = 1; n <= 5; n++) {
        size_t i = LOOM_STAGE_MIDDLE * row + (size_t)n;
        CHECK(p.time[off + i] > p.time[i] && p.per_flight[off + i] < p.per_flight[i],
              "recompute at %d layers: %g s vs %g s, %lld vs %lld bytes per set", n,
              p.time[off + i], p.time[i], (long long)p.per_flight[off + i],
              (long long)p.per_flight[i]);
        CHECK(p.time[sel + i] > p.time[i] && p.time[sel + i] < p.time[off + i] &&
                  p.per_flight[sel + i] <= p.per_flight[i] &&
                  p.per_flight[sel + i] > p.per_flight[off + i],
              "selective at %d layers: %g s, %lld bytes per set", n, p.time[sel + i],
              (long long)p.per_flight[sel + i]);
    }
    CHECK(loom_stage_option_recompute(0) == LOOM_RECOMPUTE_NONE &&
              loom_stage_option_recompute(1) == LOOM_RECOMPUTE_AS_NEEDED &&
              loom_stage_option_recompute(2) == LOOM_RECOMPUTE_SELECTIVE,
          "options' recomputation modes");
    loom_stage_problem_free(&p);
    loom_plan_free(&plan);
    /* interleaved (pp 2, two chunks per rank): the problem is over the 4 virtual stages, one
     * option (a rank's chunks agree on recomputation), no memory limit (they share a device;
     * loom_plan_predict checks the result), and its times are the even plan's predicted ones */
    CHECK(loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 8, LOOM_SCHEDULE_INTERLEAVED, 2, NULL) ==
              LOOM_OK,
          "interleaved plan");
    CHECK(loom_plan_stage_problem(&plan, &cl, LOOM_PRECISION_FP32, 64, 1, &p) == LOOM_OK &&
              p.stages == 4 && p.options == 1 && p.memory_bytes == INT64_MAX,
          "interleaved problem: %s (%d stages, %d options)", loom_last_error(), p.stages,
          p.options);
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict");
    for (int s = 0; s < 4 && p.time; s++) {
        double t = p.time[(size_t)loom_stage_class_of(s, 4) * row + 2];
        CHECK_CLOSE(t, pr.stage[s].forward_s + pr.stage[s].backward_s, 1e-12, 0,
                    "interleaved stage time");
    }
    loom_stage_problem_free(&p);
    loom_plan_free(&plan);
}

/* Every layout of 8 devices, 8 layers: the DP equals brute force on the cost model's tables,
 * also under a memory limit that rules some splits out. */
static void test_every_small_layout(void) {
    loom_gpt_config model = model_of(8);
    static const loom_schedule_kind schedules[] = {LOOM_SCHEDULE_1F1B, LOOM_SCHEDULE_ZB_H1};
    int layouts = 0;
    for (int limit = 0; limit < 2; limit++) {
        for (int pp = 2; pp <= 8; pp *= 2) {
            for (int tp = 1; tp * pp <= 8; tp *= 2) {
                int dp = 8 / (tp * pp);
                for (int micro = 1; micro <= 4; micro *= 2) {
                    for (int k = 0; k < 2; k++) {
                        for (int recompute = 0; recompute < 2; recompute++) {
                            loom_plan plan;
                            if (loom_plan_uniform(&plan, &model, dp, tp, pp, micro, 32,
                                                  schedules[k], 0, NULL) != LOOM_OK)
                                continue;
                            /* recompute: the DP chooses it per stage (two options) */
                            loom_cluster cl = cluster_of(8, (int64_t)1 << 40);
                            loom_stage_problem p;
                            CHECK(loom_plan_stage_problem(&plan, &cl, LOOM_PRECISION_FP32, 64,
                                                          recompute, &p) == LOOM_OK,
                                  "problem: %s", loom_last_error());
                            if (limit) { /* between the least and the largest stage's need */
                                int64_t lo = INT64_MAX, hi = 0;
                                for (int s = 0; s < p.stages; s++) {
                                    size_t i = (size_t)loom_stage_class_of(s, p.stages) *
                                                   (size_t)(p.layers + 1) +
                                               (size_t)(p.layers / p.stages);
                                    int64_t need = p.memory[i] + p.per_flight[i] * p.in_flight[s];
                                    lo = need < lo ? need : lo, hi = need > hi ? need : hi;
                                }
                                p.memory_bytes = lo + (hi - lo) / 2;
                            }
                            char what[128];
                            snprintf(what, sizeof what, "dp %d tp %d pp %d micro %d %s%s%s", dp, tp,
                                     pp, micro, loom_schedule_kind_name(schedules[k]),
                                     recompute ? " per-stage recompute" : "",
                                     limit ? " limited" : "");
                            check_against_brute_force(&p, what);
                            loom_stage_problem_free(&p);
                            loom_plan_free(&plan);
                            layouts++;
                        }
                    }
                }
            }
        }
    }
    CHECK(layouts >= 100, "%d layouts", layouts);
}

/* The search with the DP is at least as fast as with even stages, and uneven where the head is
 * heavy. */
static void test_search(void) {
    loom_gpt_config model = model_of(8);
    loom_cluster cl = cluster_of(4, (int64_t)1 << 40);
    loom_search_request req = {.devices = 4,
                               .global_batch = 32,
                               .seq_len = 64,
                               .precision = LOOM_PRECISION_FP32,
                               .keep = 200};
    loom_plan_candidate *with = calloc(200, sizeof *with), *without = calloc(200, sizeof *without);
    int found[2], tried[2], fitting[2];
    CHECK(loom_plan_search(&model, &cl, &req, with, &found[0], &tried[0], &fitting[0], NULL) ==
              LOOM_OK,
          "search: %s", loom_last_error());
    req.even_stages = 1;
    CHECK(loom_plan_search(&model, &cl, &req, without, &found[1], &tried[1], &fitting[1], NULL) ==
              LOOM_OK,
          "search, even: %s", loom_last_error());
    CHECK(tried[0] > tried[1], "the DP adds uneven candidates: %d vs %d", tried[0], tried[1]);
    CHECK(with[0].prediction.step_s <= without[0].prediction.step_s, "DP %g s, even %g s",
          with[0].prediction.step_s, without[0].prediction.step_s);
    int uneven = 0, uneven_chunked = 0;
    for (int i = 0; i < found[0]; i++) {
        const loom_plan *p = &with[i].plan;
        if (p->pp < 2) continue;
        const loom_plan_stage *last = &p->stages[p->num_stages - 1], *first = &p->stages[0];
        int fewer = last->end_layer - last->first_layer < first->end_layer - first->first_layer;
        if (p->virtual_stages == 1) uneven |= fewer;
        if (p->virtual_stages > 1) uneven_chunked |= fewer;
    }
    CHECK(uneven, "some pipeline candidate gives the last stage fewer layers");
    CHECK(uneven_chunked, "some interleaved or zb-v candidate gives the last stage fewer layers");
    /* among interleaved and zb-v alone, the DP's candidates never make the best slower */
    double best_chunked[2] = {1e300, 1e300};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < found[k]; i++) {
            const loom_plan_candidate *c = &(k ? without : with)[i];
            if (c->plan.virtual_stages > 1 && c->prediction.step_s < best_chunked[k])
                best_chunked[k] = c->prediction.step_s;
        }
    }
    CHECK(best_chunked[0] <= best_chunked[1] && best_chunked[1] < 1e300,
          "chunked schedules: with the DP %g s, even %g s", best_chunked[0], best_chunked[1]);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < found[k]; i++) loom_plan_free(&(k ? without : with)[i].plan);
    }
    free(with), free(without);
}

int main(void) {
    test_random_tables();
    test_tables();
    test_every_small_layout();
    test_search();
    return check_finish();
}
