/*
 * profile_internal.h — what the files of `loom profile` share: the measuring context (the world,
 * the options, which rank runs on which host), the collective helpers every phase uses to
 * agree and to gather its figures, and the arithmetic the tests check on their own (the
 * alpha-beta fit, the GEMM table, the median).
 *
 * profile.c runs the phases and measures the device; profile_links.c the links and
 * collectives; profile_fit.c the arithmetic.
 */
#ifndef LOOM_PROFILE_INTERNAL_H
#define LOOM_PROFILE_INTERNAL_H

#include "loom/cluster.h"
#include "loom/comm.h"
#include "loom/cluster.h"

typedef struct {
    loom_comm *world;
    loom_profile_opts opts;
    int rank, size;
    int hosts;       /* distinct hosts */
    int *host_of;    /* (size) every rank's host, 0 .. hosts - 1 in order of their first rank */
    int *host_ranks; /* (hosts) ranks on each host */
    double started;  /* loom_now() when the profile began */
    /* CPUs: where the ranks' threads outnumber the CPUs they may run on (their affinity), only
     * some ranks measure the device while the others wait, and its figures are scaled by
     * `core_scale` (< 1), the share of the CPUs a rank gets when all of them train
     * (find_cores). */
    unsigned char *measured_by; /* (size) 1 for the ranks that measure the device */
    int measures;               /* this rank does */
    int measuring;              /* how many ranks do */
    double core_scale;          /* 1: every rank measures, side by side, as it will train */
    int min_cores;              /* the fewest CPUs of any rank's affinity */
} profile_ctx;

/* Rank 0 with opts.verbose: one progress line "profile [  12.3 s] ...". Every rank: notes the
 * phase for the comm watchdog (loom_comm_progress). */
void profile_say(const profile_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Collective: LOOM_OK when `status` is LOOM_OK on every rank. Otherwise every rank fails, the
 * failing rank with its own message, the others with "WHAT failed on rank R". */
loom_status profile_agree(const profile_ctx *ctx, loom_status status, const char *what);
/* Collective: all (size x k) = every rank's `mine` (k), in rank order. */
loom_status profile_gather(const profile_ctx *ctx, const double *mine, int k, double *all);

/* Measures node.links and the collective fits into out (collective). Needs out->nodes and
 * out->devices_per_node. */
loom_status profile_measure_links(const profile_ctx *ctx, loom_cluster *out);

/* ---- arithmetic ---- */

/* The median of the n values that are >= 0 (negative ones mark "not measured here"); sorts
 * `values`. -1 when there are none. */
double profile_median(double *values, int n);

/* Fits seconds = alpha + beta x bytes to n >= 2 points (at least two distinct sizes) by least
 * squares on the relative error (each point weighted 1 / seconds^2), so that a 4 KiB point
 * counts as much as a 32 MiB one. A negative alpha (noise at small sizes) is refitted as 0
 * with beta through the origin. LOOM_ERR_RUNTIME when the points cannot give a beta > 0 (times
 * that do not grow with the bytes) or a point is not finite and positive. */
loom_status profile_fit_alpha_beta(const double *bytes, const double *seconds, int n,
                                   double *alpha_s, double *beta_s_per_byte);

/* Turns n measured points (any order, efficiency = achieved / peak) into at most `max`
 * points in ascending FLOPs: efficiencies above 1 (a GEMM faster than the noisy peak) are
 * clamped to 1, points of equal FLOPs averaged, and while there are too many the two
 * neighbours closest in log(FLOPs) are merged (means weighted by how many points each holds).
 * Points with FLOPs or efficiency not > 0 are dropped. Works in place; returns the count. */
int profile_gemm_table(loom_gemm_point *points, int n, int max);

/* Which ranks measure the device, and the factor its figures are scaled by. n ranks, host[r]
 * (ranks with equal ids share a machine), masks (n x mask_bytes: each rank's CPU affinity as
 * bits), `threads` per rank. Training, rank r's threads compete with every rank of its host on
 * its CPUs, each rank's threads spread evenly over its own CPUs: r's share is min(1, |m_r| /
 * load) (a host's ranks all unbound: cores / (ranks x threads); pinned one a core: 1 /
 * threads). measures[r] = 1 for the ranks taken, in rank order, while none of them would have
 * more threads on its CPUs than max(its CPUs, threads); each measures at its own share among
 * them. Returns the smallest ratio of training's share to the measuring one over the measuring
 * ranks; 1, with every rank measuring, when that is 1. *min_cpus: the fewest CPUs of a rank. */
double profile_core_plan(int n, const int *host, const unsigned char *masks, size_t mask_bytes,
                         int threads, unsigned char *measures, int *min_cpus);

#endif
