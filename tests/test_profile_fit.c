/*
 * test_profile_fit.c — the arithmetic of `loom profile` (plan/profile_fit.c) against data whose
 * answer is known: the alpha-beta fit recovers exact synthetic collectives (whatever the
 * scale of the sizes) and refits a negative alpha through the origin; the GEMM table sorts,
 * averages equal FLOPs, clamps efficiencies above 1, drops bad points and merges down to the
 * cluster's limit in ascending order; the median skips the "not measured" marks.
 */
#include "check.h"
#include "cluster/profile_internal.h"

#include <math.h>
#include <string.h>

static void test_fit_exact(void) {
    /* a 2-rank allreduce-like line, and a slow wide-area one */
    const double cases[][2] = {{1e-5, 4e-11}, {2.5e-3, 1e-9}, {0.0, 1e-10}, {3e-6, 2.5e-12}};
    const double sizes[] = {4096, 262144, 4194304, 33554432};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double seconds[4];
        for (int i = 0; i < 4; i++) seconds[i] = cases[c][0] + cases[c][1] * sizes[i];
        double alpha = -1, beta = -1;
        CHECK(profile_fit_alpha_beta(sizes, seconds, 4, &alpha, &beta) == LOOM_OK, "%s",
              loom_last_error());
        CHECK_CLOSE(alpha, cases[c][0], 1e-9, 1e-15, "alpha");
        CHECK_CLOSE(beta, cases[c][1], 1e-9, 0, "beta");
    }
    /* two points, the smallest a zero-byte message */
    const double two_sizes[] = {0, 1e6}, two_seconds[] = {2e-6, 2e-6 + 1e6 * 5e-11};
    double alpha = 0, beta = 0;
    CHECK(profile_fit_alpha_beta(two_sizes, two_seconds, 2, &alpha, &beta) == LOOM_OK, "%s",
          loom_last_error());
    CHECK_CLOSE(alpha, 2e-6, 1e-9, 0, "alpha of two points");
    CHECK_CLOSE(beta, 5e-11, 1e-9, 0, "beta of two points");
}

static void test_fit_clamps_and_refuses(void) {
    /* a line through the origin, with the smallest time too fast: alpha < 0 becomes 0 and
     * beta the weighted fit through the origin, which lies near the slope */
    const double sizes[] = {1e3, 1e5, 1e7}, seconds[] = {0.5e-7, 1e-5, 1e-3};
    double alpha = -1, beta = -1;
    CHECK(profile_fit_alpha_beta(sizes, seconds, 3, &alpha, &beta) == LOOM_OK, "%s",
          loom_last_error());
    CHECK(alpha == 0, "alpha %g: expected clamped to 0", alpha);
    CHECK(beta > 0.5e-10 && beta <= 1e-10 * (1 + 1e-12),
          "beta %g: expected within the points' "
          "slopes",
          beta);
    /* times that fall with size, one size, a zero time, too few points */
    const double falling[] = {1e-3, 1e-4, 1e-5};
    CHECK(profile_fit_alpha_beta(sizes, falling, 3, &alpha, &beta) == LOOM_ERR_RUNTIME,
          "falling times accepted");
    CHECK(strstr(loom_last_error(), "do not grow") != NULL, "message: %s", loom_last_error());
    const double same[] = {1e3, 1e3, 1e3};
    CHECK(profile_fit_alpha_beta(same, seconds, 3, &alpha, &beta) == LOOM_ERR_RUNTIME,
          "one size accepted");
    const double zero[] = {0, 1e-5, 1e-3};
    CHECK(profile_fit_alpha_beta(sizes, zero, 3, &alpha, &beta) == LOOM_ERR_RUNTIME,
          "a zero time accepted");
    CHECK(profile_fit_alpha_beta(sizes, seconds, 1, &alpha, &beta) == LOOM_ERR_RUNTIME,
          "one point accepted");
    CHECK(alpha == 0 && beta == 0, "outputs on failure: %g %g", alpha, beta);
}

static void test_gemm_table(void) {
    loom_gemm_point p[] = {
        {8e6, 0.5}, {1e6, 0.2}, {8e6, 0.7},  {1e9, 1.2}, /* above the peak: clamped to 1 */
        {1e6, 0.4}, {0, 0.5},   {5e7, -1.0}, {2e7, NAN}, /* three bad points dropped */
    };
    int n = profile_gemm_table(p, 8, LOOM_CLUSTER_MAX_GEMM_POINTS);
    CHECK(n == 3, "points %d: expected 3", n);
    CHECK(p[0].flops == 1e6 && fabs(p[0].efficiency - 0.3) < 1e-12, "1e6: %g %g", p[0].flops,
          p[0].efficiency);
    CHECK(p[1].flops == 8e6 && fabs(p[1].efficiency - 0.6) < 1e-12, "8e6: %g %g", p[1].flops,
          p[1].efficiency);
    CHECK(p[2].flops == 1e9 && p[2].efficiency == 1.0, "1e9: %g %g", p[2].flops, p[2].efficiency);

    /* 200 distinct points merged to the limit: ascending, within the measured range, the
     * efficiencies' weighted mean kept */
    enum { MANY = 200 };
    loom_gemm_point many[MANY];
    for (int i = 0; i < MANY; i++) {
        many[i].flops = 1e5 * pow(1.07, (i * 37) % MANY); /* shuffled */
        many[i].efficiency = 0.1 + 0.8 * ((i * 37) % MANY) / (double)MANY;
    }
    n = profile_gemm_table(many, MANY, LOOM_CLUSTER_MAX_GEMM_POINTS);
    CHECK(n == LOOM_CLUSTER_MAX_GEMM_POINTS, "merged to %d", n);
    int ascending = 1;
    for (int i = 1; i < n; i++) ascending &= many[i].flops > many[i - 1].flops;
    CHECK(ascending, "merged table not ascending");
    CHECK(many[0].flops >= 1e5 && many[n - 1].flops <= 1e5 * pow(1.07, MANY - 1) * (1 + 1e-9),
          "range %g .. %g", many[0].flops, many[n - 1].flops);
    /* efficiency rose with FLOPs in the input; merged means of neighbours keep that */
    int rising = 1;
    for (int i = 1; i < n; i++) rising &= many[i].efficiency > many[i - 1].efficiency;
    CHECK(rising, "merged efficiencies not rising with FLOPs");
    CHECK(many[0].efficiency >= 0.1 && many[n - 1].efficiency <= 0.9, "efficiency range %g .. %g",
          many[0].efficiency, many[n - 1].efficiency);

    CHECK(profile_gemm_table(p, 0, 64) == 0, "empty table");
    loom_gemm_point bad[] = {{-1, 0.5}, {1e6, 0}};
    CHECK(profile_gemm_table(bad, 2, 64) == 0, "only bad points");
}

static void test_median(void) {
    double odd[] = {3, -1, 1, 2, -1};
    CHECK(profile_median(odd, 5) == 2, "median of 1 2 3 (two unmeasured): %g", odd[0]);
    double even[] = {4, 1, 3, 2};
    CHECK(profile_median(even, 4) == 2.5, "median of 1 2 3 4");
    double none[] = {-1, -1};
    CHECK(profile_median(none, 2) == -1, "no measured value");
}

/* Masks of `n` ranks on hosts of 8 CPUs: cpus[r] a bit string of the CPUs rank r may use. */
static double plan_of(int n, const int *host, const char *const *cpus, int threads,
                      unsigned char *measures) {
    unsigned char masks[8];
    for (int r = 0; r < n; r++) {
        masks[r] = 0;
        for (int c = 0; cpus[r][c]; c++)
            if (cpus[r][c] == '1') masks[r] |= (unsigned char)(1u << c);
    }
    int min_cpus = 0;
    return profile_core_plan(n, host, masks, 1, threads, measures, &min_cpus);
}

/* Who measures and the scale, worked by hand: every rank's share when all train over its
 * share while the measuring ones run. */
static void test_core_plan(void) {
    const int one[8] = {0}, two_hosts[4] = {0, 0, 1, 1};
    unsigned char m[8];
    /* 2 ranks x 1 thread, 2 CPUs, unbound: one a core, all measure, nothing scaled */
    const char *unbound2[] = {"11", "11"};
    CHECK(plan_of(2, one, unbound2, 1, m) == 1.0 && m[0] && m[1], "2 ranks on 2 CPUs");
    /* 4 ranks x 1 thread on 2 CPUs, unbound: 2 measure (one a core), trained at 2/4 */
    const char *unbound4[] = {"11", "11", "11", "11"};
    double s = plan_of(4, one, unbound4, 1, m);
    CHECK(s == 0.5 && m[0] && m[1] && !m[2] && !m[3], "4 ranks on 2 CPUs: %g %d%d%d%d", s, m[0],
          m[1], m[2], m[3]);
    /* 2 ranks x 2 threads on 2 CPUs, unbound: 1 measures with both CPUs, trained at 2/4 */
    s = plan_of(2, one, unbound2, 2, m);
    CHECK(s == 0.5 && m[0] && !m[1], "2 ranks x 2 threads on 2 CPUs: %g", s);
    /* 2 ranks x 2 threads pinned one CPU each: measuring alone is as crowded as training */
    const char *pinned2[] = {"10", "01"};
    CHECK(plan_of(2, one, pinned2, 2, m) == 1.0 && m[0] && m[1], "pinned, 2 threads a CPU");
    /* 4 ranks pinned two to a CPU: one per CPU measures, trained at half */
    const char *pinned4[] = {"10", "01", "10", "01"};
    s = plan_of(4, one, pinned4, 1, m);
    CHECK(s == 0.5 && m[0] && m[1] && !m[2] && !m[3], "4 pinned on 2 CPUs: %g", s);
    /* two hosts (CPU numbers are per machine): 2 ranks on 2 CPUs each, nothing scaled */
    CHECK(plan_of(4, two_hosts, unbound4, 1, m) == 1.0 && m[2] && m[3], "2 hosts of 2 ranks");
    /* two hosts, one of 1 CPU: its 2 ranks get half; one of them measures */
    const char *uneven[] = {"11", "11", "1", "1"};
    s = plan_of(4, two_hosts, uneven, 1, m);
    CHECK(s == 0.5 && m[0] && m[1] && m[2] && !m[3], "a 1-CPU host of 2 ranks: %g", s);
}

int main(void) {
    test_core_plan();
    test_fit_exact();
    test_fit_clamps_and_refuses();
    test_gemm_table();
    test_median();
    return check_finish();
}
