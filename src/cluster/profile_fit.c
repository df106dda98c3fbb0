/*
 * profile_fit.c — the arithmetic of `loom profile`: medians over ranks, the alpha-beta fit of
 * a collective's times, and the GEMM efficiency table (sorted, equal FLOPs averaged, at most
 * the cluster's number of points). Pure functions, no communication.
 *
 * Not here: measuring (profile.c, profile_links.c).
 */
#include "cluster/profile_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double profile_median(double *values, int n) {
    qsort(values, (size_t)n, sizeof *values, compare_doubles);
    int first = 0;
    while (first < n && values[first] < 0) first++;
    int m = n - first;
    if (m == 0) return -1;
    const double *v = values + first;
    return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

loom_status profile_fit_alpha_beta(const double *bytes, const double *seconds, int n,
                                   double *alpha_s, double *beta_s_per_byte) {
    *alpha_s = 0, *beta_s_per_byte = 0;
    double largest = 0, smallest = INFINITY;
    for (int i = 0; i < n; i++) {
        if (!(isfinite(bytes[i]) && bytes[i] >= 0 && isfinite(seconds[i]) && seconds[i] > 0)) {
            return loom_fail(LOOM_ERR_RUNTIME,
                             "alpha-beta fit: point %d (%g bytes, %g s) is not a size >= 0 with "
                             "a time > 0",
                             i, bytes[i], seconds[i]);
        }
        largest = fmax(largest, bytes[i]);
        smallest = fmin(smallest, bytes[i]);
    }
    if (n < 2 || !(largest > smallest)) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "alpha-beta fit: expected two sizes or more, got %d "
                         "point(s)",
                         n);
    }
    /* Weighted normal equations in x = bytes / largest (well scaled whatever the sizes). */
    double s = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
    for (int i = 0; i < n; i++) {
        double w = 1.0 / (seconds[i] * seconds[i]), x = bytes[i] / largest;
        s += w, sx += w * x, sxx += w * x * x, st += w * seconds[i], sxt += w * x * seconds[i];
    }
    double det = s * sxx - sx * sx;
    double alpha = (sxx * st - sx * sxt) / det, beta = (s * sxt - sx * st) / det;
    if (alpha < 0) { /* through the origin */
        alpha = 0;
        beta = sxt / sxx;
    }
    if (!(beta > 0) || !isfinite(alpha) || !isfinite(beta)) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "alpha-beta fit: the times do not grow with the size (%g s at %g bytes, "
                         "%g s at the largest)",
                         seconds[0], bytes[0], seconds[n - 1]);
    }
    *alpha_s = alpha;
    *beta_s_per_byte = beta / largest;
    return LOOM_OK;
}

static int compare_flops(const void *a, const void *b) {
    double x = ((const loom_gemm_point *)a)->flops, y = ((const loom_gemm_point *)b)->flops;
    return (x > y) - (x < y);
}

int profile_gemm_table(loom_gemm_point *points, int n, int max) {
    /* weight[i]: how many measured points points[i] stands for */
    int *weight = malloc((size_t)(n > 0 ? n : 1) * sizeof *weight);
    if (!weight || max < 1) {
        free(weight);
        return 0;
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        loom_gemm_point p = points[i];
        if (!(p.flops > 0 && p.efficiency > 0 && isfinite(p.flops))) continue;
        p.efficiency = fmin(p.efficiency, 1.0);
        points[kept++] = p;
    }
    qsort(points, (size_t)kept, sizeof *points, compare_flops);
    int count = 0;
    for (int i = 0; i < kept; i++) {
        loom_gemm_point *last = count ? &points[count - 1] : NULL;
        if (last && points[i].flops <= last->flops * (1 + 1e-9)) {
            int w = weight[count - 1];
            last->efficiency = (last->efficiency * w + points[i].efficiency) / (w + 1);
            weight[count - 1] = w + 1;
        } else {
            points[count] = points[i];
            weight[count++] = 1;
        }
    }
    while (count > max) {
        int best = 0;
        for (int i = 1; i + 1 < count; i++) {
            if (points[i + 1].flops / points[i].flops < points[best + 1].flops / points[best].flops)
                best = i;
        }
        loom_gemm_point *a = &points[best], *b = &points[best + 1];
        double wa = weight[best], wb = weight[best + 1];
        a->flops = exp((wa * log(a->flops) + wb * log(b->flops)) / (wa + wb));
        a->efficiency = (wa * a->efficiency + wb * b->efficiency) / (wa + wb);
        weight[best] += weight[best + 1];
        for (int i = best + 1; i + 1 < count; i++) {
            points[i] = points[i + 1];
            weight[i] = weight[i + 1];
        }
        count--;
    }
    free(weight);
    return count;
}

static int count_bits(const unsigned char *a, const unsigned char *b, size_t bytes) {
    int n = 0;
    for (size_t i = 0; i < bytes; i++) n += __builtin_popcount(b ? a[i] & b[i] : a[i]);
    return n;
}

/* The threads on rank r's CPUs when the ranks `in` (NULL: all; plus `extra`, -1: none) run,
 * each spreading its threads evenly over its own CPUs. */
static double load_on(int n, const int *host, const unsigned char *masks, size_t mask_bytes,
                      int threads, int r, const unsigned char *in, int extra) {
    double load = 0;
    const unsigned char *mr = masks + (size_t)r * mask_bytes;
    for (int q = 0; q < n; q++) {
        if (host[q] != host[r] || (in && !in[q] && q != extra)) continue;
        const unsigned char *mq = masks + (size_t)q * mask_bytes;
        int own = count_bits(mq, NULL, mask_bytes);
        if (own > 0) load += (double)threads * count_bits(mq, mr, mask_bytes) / own;
    }
    return load;
}

double profile_core_plan(int n, const int *host, const unsigned char *masks, size_t mask_bytes,
                         int threads, unsigned char *measures, int *min_cpus) {
    if (threads < 1) threads = 1;
    memset(measures, 0, (size_t)n);
    for (int r = 0; r < n; r++) {
        int fits = 1;
        for (int q = 0; q <= r && fits; q++) {
            if (q < r && (!measures[q] || host[q] != host[r])) continue;
            double cpus = count_bits(masks + (size_t)q * mask_bytes, NULL, mask_bytes);
            double load = load_on(n, host, masks, mask_bytes, threads, q, measures, r);
            fits = load <= fmax(cpus, (double)threads) + 1e-9;
        }
        measures[r] = (unsigned char)fits;
    }
    double scale = 1.0;
    *min_cpus = 0;
    for (int r = 0; r < n; r++) {
        double cpus = count_bits(masks + (size_t)r * mask_bytes, NULL, mask_bytes);
        if (cpus < 1) cpus = 1;
        if (*min_cpus == 0 || cpus < *min_cpus) *min_cpus = (int)cpus;
        if (!measures[r]) continue;
        double trained =
            fmin(1.0, cpus / load_on(n, host, masks, mask_bytes, threads, r, NULL, -1));
        double measured =
            fmin(1.0, cpus / load_on(n, host, masks, mask_bytes, threads, r, measures, -1));
        scale = fmin(scale, trained / measured);
    }
    if (scale >= 1.0 - 1e-9) { /* every rank measures, side by side */
        memset(measures, 1, (size_t)n);
        return 1.0;
    }
    return scale;
}
