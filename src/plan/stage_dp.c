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
 * Not here: the tables (costmodel.c costs each class and layer count once), choosing among
 * layouts (search.c).
 */
#include "loom/costmodel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

loom_stage_class loom_stage_class_of(int stage, int stages) {
    if (stages == 1) return LOOM_STAGE_ONLY;
    if (stage == 0) return LOOM_STAGE_FIRST;
    return stage == stages - 1 ? LOOM_STAGE_LAST : LOOM_STAGE_MIDDLE;
}

static size_t at(const loom_stage_problem *p, int stage, int n) {
    return (size_t)loom_stage_class_of(stage, p->stages) * (size_t)(p->layers + 1) + (size_t)n;
}

/* Stage `stage` with n layers fits its memory. */
static int fits(const loom_stage_problem *p, int stage, int n) {
    if (p->memory_bytes <= 0) return 1;
    size_t i = at(p, stage, n);
    return p->memory[i] + p->per_flight[i] * p->in_flight[stage] <= p->memory_bytes;
}

double loom_stage_latency(const loom_stage_problem *p, const int *counts) {
    double sum = 0, worst = 0;
    int layers = 0;
    for (int s = 0; s < p->stages; s++) {
        if (counts[s] < 1 || counts[s] > p->layers - layers) return INFINITY;
        layers += counts[s];
        double t = p->time[at(p, s, counts[s])];
        if (!isfinite(t) || !fits(p, s, counts[s])) return INFINITY;
        sum += t;
        if (t > worst) worst = t;
    }
    if (layers != p->layers) return INFINITY;
    return sum + (p->micro_batches - 1) * worst;
}

/* The least sum of stage times with every stage <= bound (INFINITY: none); choice[s][l] the
 * layers of stage s - 1 on the best path to (s stages, l layers). sum is (S+1) x (L+1). */
static double least_sum(const loom_stage_problem *p, double bound, double *sum, int *choice) {
    int S = p->stages, L = p->layers;
    for (size_t i = 0; i < (size_t)(S + 1) * (size_t)(L + 1); i++) sum[i] = INFINITY;
    sum[0] = 0;
    for (int s = 0; s < S; s++) {
        /* stage s starts after at least s layers and leaves at least one for each later stage */
        for (int l = s; l <= L - (S - s); l++) {
            double here = sum[(size_t)s * (size_t)(L + 1) + (size_t)l];
            if (!isfinite(here)) continue;
            for (int n = 1; l + n <= L - (S - s - 1); n++) {
                double t = p->time[at(p, s, n)];
                if (!(t <= bound) || !fits(p, s, n)) continue;
                size_t next = (size_t)(s + 1) * (size_t)(L + 1) + (size_t)(l + n);
                if (here + t < sum[next]) {
                    sum[next] = here + t;
                    choice[next] = n;
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

loom_status loom_stage_dp(const loom_stage_problem *p, int *counts, double *latency,
                          int *candidates) {
    int S = p->stages, L = p->layers;
    if (candidates) *candidates = 0;
    *latency = INFINITY;
    if (S < 1 || L < S || p->micro_batches < 1) {
        return loom_fail(LOOM_ERR_INPUT, "stage DP: %d stages of %d layers, %d micro-batches", S, L,
                         p->micro_batches);
    }
    size_t cells = (size_t)(S + 1) * (size_t)(L + 1);
    double *sum = malloc(cells * sizeof *sum);
    int *choice = calloc(cells, sizeof *choice);
    double *bounds = malloc((size_t)LOOM_STAGE_CLASSES * (size_t)(L + 1) * sizeof *bounds);
    if (!sum || !choice || !bounds) {
        free(sum), free(choice), free(bounds);
        return loom_fail(LOOM_ERR_NOMEM, "stage DP: out of memory");
    }
    int nb = 0;
    for (int c = 0; c < LOOM_STAGE_CLASSES; c++) {
        for (int n = 1; n <= L; n++) {
            double t = p->time[(size_t)c * (size_t)(L + 1) + (size_t)n];
            if (isfinite(t)) bounds[nb++] = t;
        }
    }
    qsort(bounds, (size_t)nb, sizeof *bounds, compare_double);
    double floor_sum = least_sum(p, INFINITY, sum, choice), best = INFINITY;
    for (int b = 0; b < nb && isfinite(floor_sum); b++) {
        if (b > 0 && bounds[b] == bounds[b - 1]) continue;
        if (floor_sum + (p->micro_batches - 1) * bounds[b] >= best) break;
        if (candidates) (*candidates)++;
        double total = least_sum(p, bounds[b], sum, choice);
        if (!isfinite(total)) continue;
        double T = total + (p->micro_batches - 1) * bounds[b];
        if (T < best) {
            best = T;
            for (int s = S, l = L; s > 0; s--) { /* walk the choices back */
                counts[s - 1] = choice[(size_t)s * (size_t)(L + 1) + (size_t)l];
                l -= counts[s - 1];
            }
        }
    }
    free(sum), free(choice), free(bounds);
    if (!isfinite(best)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "stage DP: no split of %d layers into %d stages fits %.2f GiB per rank", L,
                         S, (double)p->memory_bytes / 1073741824.0);
    }
    *latency = loom_stage_latency(p, counts);
    return LOOM_OK;
}
