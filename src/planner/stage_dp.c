/*
 * stage_dp.c — Alpa's inter-operator stage DP (loom/costmodel.h): how many layers each pipeline
 * stage takes, minimising the closed-form latency T = sum_i t_i + (B - 1) max_j t_j under every
 * stage's memory limit.
 *
 * For one bound t_max the least sum of stage times with every t_i <= t_max is a shortest path
 * over (stages placed, layers placed); the optimum T is the least sum + (B - 1) t_max over the
 * bounds that are a stage time somewhere, tried in ascending order. The search stops once the
 * least sum without a bound plus (B - 1) t_max reaches the best T found: larger bounds cannot do
 * better. The split found has a true maximum <= its bound, so its T is the optimum.
 *
 * Recomputation per stage (Alpa chooses it per stage too): with two options a stage of a given
 * size contributes its time and memory under one of them, and nothing else depends on the
 * choice, so under a bound the fastest option that fits is the right one for that transition.
 *
 * Not here: the tables (costmodel.c costs each class and layer count once), choosing among
 * layouts (search.c).
 */
#include "loom/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int loom_stage_option_recompute(int option) {
    static const int modes[3] = {LOOM_RECOMPUTE_NONE, LOOM_RECOMPUTE_AS_NEEDED,
                                 LOOM_RECOMPUTE_SELECTIVE};
    return option >= 0 && option < 3 ? modes[option] : LOOM_RECOMPUTE_NONE;
}

loom_stage_class loom_stage_class_of(int stage, int stages) {
    if (stages == 1) return LOOM_STAGE_ONLY;
    if (stage == 0) return LOOM_STAGE_FIRST;
    return stage == stages - 1 ? LOOM_STAGE_LAST : LOOM_STAGE_MIDDLE;
}

static size_t at(const loom_stage_problem *p, int option, int stage, int n) {
    size_t row =
        (size_t)option * LOOM_STAGE_CLASSES + (size_t)loom_stage_class_of(stage, p->stages);
    return row * (size_t)(p->layers + 1) + (size_t)n;
}

/* Stage `stage` with n layers under an option fits its memory. */
static int fits(const loom_stage_problem *p, int option, int stage, int n) {
    if (p->memory_bytes <= 0) return 1;
    size_t i = at(p, option, stage, n);
    return p->memory[i] + p->per_flight[i] * p->in_flight[stage] <= p->memory_bytes;
}

/* The fastest option for stage `stage` of n layers within bound that fits (-1: none). */
static int best_option(const loom_stage_problem *p, int stage, int n, double bound) {
    int best = -1;
    for (int o = 0; o < p->options; o++) {
        double t = p->time[at(p, o, stage, n)];
        if (!(t <= bound) || !fits(p, o, stage, n)) continue;
        if (best < 0 || t < p->time[at(p, best, stage, n)]) best = o;
    }
    return best;
}

double loom_stage_latency(const loom_stage_problem *p, const int *counts, const int *recompute) {
    double sum = 0, worst = 0;
    int layers = 0;
    for (int s = 0; s < p->stages; s++) {
        int o = recompute ? recompute[s] : 0;
        if (counts[s] < 1 || counts[s] > p->layers - layers || o < 0 || o >= p->options)
            return INFINITY;
        layers += counts[s];
        double t = p->time[at(p, o, s, counts[s])];
        if (!isfinite(t) || !fits(p, o, s, counts[s])) return INFINITY;
        sum += t;
        if (t > worst) worst = t;
    }
    if (layers != p->layers) return INFINITY;
    return sum + (p->micro_batches - 1) * worst;
}

/* The least sum of stage times with every stage <= bound (INFINITY: none); choice[s][l] the
 * layers of stage s - 1 on the best path to (s stages, l layers), option[s][l] its option. sum
 * is (S+1) x (L+1). */
static double least_sum(const loom_stage_problem *p, double bound, double *sum, int *choice,
                        int *option) {
    int S = p->stages, L = p->layers;
    for (size_t i = 0; i < (size_t)(S + 1) * (size_t)(L + 1); i++) sum[i] = INFINITY;
    sum[0] = 0;
    for (int s = 0; s < S; s++) {
        /* stage s starts after at least s layers and leaves at least one for each later stage */
        for (int l = s; l <= L - (S - s); l++) {
            double here = sum[(size_t)s * (size_t)(L + 1) + (size_t)l];
            if (!isfinite(here)) continue;
            for (int n = 1; l + n <= L - (S - s - 1); n++) {
                int o = best_option(p, s, n, bound);
                if (o < 0) continue;
                double t = p->time[at(p, o, s, n)];
                size_t next = (size_t)(s + 1) * (size_t)(L + 1) + (size_t)(l + n);
                if (here + t < sum[next]) {
                    sum[next] = here + t;
                    choice[next] = n, option[next] = o;
                }
            }
        }
    }
    return sum[(size_t)S * (size_t)(L + 1) + (size_t)L];
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

loom_status loom_stage_dp(const loom_stage_problem *p, int *counts, int *recompute, double *latency,
                          int *candidates) {
    int S = p->stages, L = p->layers;
    if (candidates) *candidates = 0;
    *latency = INFINITY;
    if (S < 1 || L < S || p->micro_batches < 1 || p->options < 1 || p->options > 3 ||
        (p->options > 1 && !recompute)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "stage DP: %d stages of %d layers, %d micro-batches, %d options", S, L,
                         p->micro_batches, p->options);
    }
    size_t cells = (size_t)(S + 1) * (size_t)(L + 1);
    size_t entries = (size_t)p->options * LOOM_STAGE_CLASSES * (size_t)(L + 1);
    double *sum = malloc(cells * sizeof *sum);
    int *choice = calloc(cells, sizeof *choice), *option = calloc(cells, sizeof *option);
    double *bounds = malloc(entries * sizeof *bounds);
    if (!sum || !choice || !option || !bounds) {
        free(sum), free(choice), free(option), free(bounds);
        return loom_fail(LOOM_ERR_NOMEM, "stage DP: out of memory");
    }
    int nb = 0;
    for (size_t i = 0; i < entries; i++) {
        if (i % (size_t)(L + 1) != 0 && isfinite(p->time[i])) bounds[nb++] = p->time[i];
    }
    qsort(bounds, (size_t)nb, sizeof *bounds, compare_double);
    double floor_sum = least_sum(p, INFINITY, sum, choice, option), best = INFINITY;
    for (int b = 0; b < nb && isfinite(floor_sum); b++) {
        if (b > 0 && bounds[b] == bounds[b - 1]) continue;
        if (floor_sum + (p->micro_batches - 1) * bounds[b] >= best) break;
        if (candidates) (*candidates)++;
        double total = least_sum(p, bounds[b], sum, choice, option);
        if (!isfinite(total)) continue;
        double T = total + (p->micro_batches - 1) * bounds[b];
        if (T < best) {
            best = T;
            for (int s = S, l = L; s > 0; s--) { /* walk the choices back */
                size_t cell = (size_t)s * (size_t)(L + 1) + (size_t)l;
                counts[s - 1] = choice[cell];
                if (recompute) recompute[s - 1] = option[cell];
                l -= counts[s - 1];
            }
        }
    }
    free(sum), free(choice), free(option), free(bounds);
    if (!isfinite(best)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "stage DP: no split of %d layers into %d stages fits %.2f GiB per rank", L,
                         S, (double)p->memory_bytes / 1073741824.0);
    }
    *latency = loom_stage_latency(p, counts, recompute);
    return LOOM_OK;
}
