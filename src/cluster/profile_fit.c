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
