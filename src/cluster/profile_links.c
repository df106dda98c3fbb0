/*
 * profile_links.c — the links of `loom profile`. Ping-pong between pairs of ranks on one host
 * (intra_node) and on two hosts (inter_node), every pair of a class at once: the link's latency
 * is half the round trip of 8 bytes, its bandwidth a large message over half its round trip,
 * and the four sizes together fit a send-receive (one message one way) as alpha + beta x
 * bytes. Then allreduce, all-gather and reduce-scatter at several sizes over the world (its
 * link class: inter_node when there are several hosts) and over each host's ranks, each fitted
 * the same way. A collective's time is the slowest rank's: it is over when the last rank is
 * done. Each collective is called as training calls it (run_collective), so that the fits
 * describe what training runs: the reduce-scatter is comm's ring, which ZeRO-1's gradient
 * buckets run.
 *
 * Not here: the fit itself (profile_fit.c), the device (profile.c).
 */
#include "cluster/profile_internal.h"

#include <stdlib.h>
#include <string.h>

enum { PINGPONG_SIZES = 4, PINGPONG_TAG = 11, COLLECTIVE_SIZES = 4, COLLECTIVE_TRIALS = 5 };

/* Sizes of one message and round trips timed at each (the median is kept). */
typedef struct {
    int64_t bytes[PINGPONG_SIZES];
    int reps[PINGPONG_SIZES];
} pingpong_plan;

static const pingpong_plan pingpong_full = {{8, 64 << 10, 1 << 20, 32 << 20}, {1000, 200, 50, 9}};
static const pingpong_plan pingpong_quick = {{8, 64 << 10, 1 << 20, 4 << 20}, {50, 20, 10, 5}};

/* Buffer sizes of the collectives, calls back to back in one timed trial at each, and trials
 * (the median is kept). */
typedef struct {
    int trials, sizes;
    int64_t bytes[COLLECTIVE_SIZES];
    int calls[COLLECTIVE_SIZES];
} collective_plan;

static const collective_plan collective_full = {
    COLLECTIVE_TRIALS, 4, {4 << 10, 256 << 10, 4 << 20, 32 << 20}, {100, 40, 10, 3}};
static const collective_plan collective_quick = {3, 3, {4 << 10, 256 << 10, 2 << 20}, {20, 10, 3}};

static const loom_collective_op timed_ops[] = {LOOM_COLLECTIVE_ALLREDUCE, LOOM_COLLECTIVE_ALLGATHER,
                                               LOOM_COLLECTIVE_REDUCE_SCATTER};
#define TIMED_OPS ((int)(sizeof timed_ops / sizeof timed_ops[0]))

static const char *op_name(loom_collective_op op) {
    static const char *const names[LOOM_COLLECTIVE_OPS] = {"allreduce", "allgather",
                                                           "reduce_scatter", "sendrecv"};
    return names[op];
}

static const char *link_name(int link) {
    return link == LOOM_LINK_INTRA_NODE ? "intra_node" : "inter_node";
}

/* ---- ping-pong --------------------------------------------------------------------------- */

/* The rank that is the `local`-th of host `host` (-1 when the host has fewer). */
static int rank_on_host(const profile_ctx *ctx, int host, int local) {
    for (int r = 0; r < ctx->size; r++) {
        if (ctx->host_of[r] == host && local-- == 0) return r;
    }
    return -1;
}

/* This rank's partner in link class `link` (-1: none) and whether it starts the round trips:
 * on one host, its ranks two by two in order; between hosts, the i-th rank of host 2k with
 * the i-th of host 2k + 1. */
static int partner(const profile_ctx *ctx, int link, int *initiator) {
    int host = ctx->host_of[ctx->rank], local = 0;
    for (int r = 0; r < ctx->rank; r++) local += ctx->host_of[r] == host;
    if (link == LOOM_LINK_INTRA_NODE) {
        *initiator = local % 2 == 0;
        return rank_on_host(ctx, host, *initiator ? local + 1 : local - 1);
    }
    *initiator = host % 2 == 0;
    int other = host ^ 1;
    return other < ctx->hosts ? rank_on_host(ctx, other, local) : -1;
}

/* Half the round trip of `bytes` to `peer` and back: the median of `reps` after two warm-ups
 * (the initiator's; the other side's is -1). */
static loom_status pingpong(const profile_ctx *ctx, int peer, int initiator, void *buf,
                            int64_t bytes, int reps, double *one_way) {
    double *times = loom_malloc((size_t)reps * sizeof *times, "ping-pong times");
    if (!times) return LOOM_ERR_NOMEM;
    loom_status st = LOOM_OK;
    for (int r = -2; r < reps && st == LOOM_OK; r++) {
        double t0 = loom_now();
        if (initiator) {
            st = loom_comm_send(ctx->world, buf, bytes, peer, PINGPONG_TAG);
            if (st == LOOM_OK) st = loom_comm_recv(ctx->world, buf, bytes, peer, PINGPONG_TAG);
        } else {
            st = loom_comm_recv(ctx->world, buf, bytes, peer, PINGPONG_TAG);
            if (st == LOOM_OK) st = loom_comm_send(ctx->world, buf, bytes, peer, PINGPONG_TAG);
        }
        if (r >= 0) times[r] = (loom_now() - t0) / 2;
    }
    *one_way = initiator ? profile_median(times, reps) : -1;
    free(times);
    return st;
}

/* One link class: every pair of the class at once, each size in turn; seconds (one way) per
 * size, the median over the pairs. */
static loom_status measure_link(const profile_ctx *ctx, int link, const pingpong_plan *plan,
                                double seconds[PINGPONG_SIZES]) {
    int initiator = 0, peer = partner(ctx, link, &initiator), pairs = 0;
    for (int r = 0; r < ctx->size; r++) {
        profile_ctx as_r = *ctx;
        as_r.rank = r;
        int starts = 0;
        pairs += partner(&as_r, link, &starts) >= 0 && starts;
    }
    profile_say(ctx, "links: %s ping-pong, %d pair%s at once, %lld bytes to %lld MiB",
                link_name(link), pairs, pairs == 1 ? "" : "s", (long long)plan->bytes[0],
                (long long)(plan->bytes[PINGPONG_SIZES - 1] >> 20));
    int64_t largest = plan->bytes[PINGPONG_SIZES - 1];
    void *buf = loom_alloc_aligned((size_t)largest, "ping-pong buffer");
    loom_status st = profile_agree(ctx, buf ? LOOM_OK : LOOM_ERR_NOMEM, "the ping-pong buffer");
    double mine[PINGPONG_SIZES];
    for (int i = 0; i < PINGPONG_SIZES && st == LOOM_OK; i++) {
        mine[i] = -1;
        st = loom_comm_barrier(ctx->world);
        if (st == LOOM_OK && peer >= 0) {
            st = pingpong(ctx, peer, initiator, buf, plan->bytes[i], plan->reps[i], &mine[i]);
        }
    }
    loom_free_aligned(buf);
    double *all = loom_malloc((size_t)ctx->size * PINGPONG_SIZES * sizeof *all, "ping-pong");
    double *column = loom_malloc((size_t)ctx->size * sizeof *column, "ping-pong times");
    if (st == LOOM_OK)
        st = profile_agree(ctx, all && column ? LOOM_OK : LOOM_ERR_NOMEM, "ping-pong");
    if (st == LOOM_OK) st = profile_gather(ctx, mine, PINGPONG_SIZES, all);
    for (int i = 0; i < PINGPONG_SIZES && st == LOOM_OK; i++) {
        for (int r = 0; r < ctx->size; r++) column[r] = all[(size_t)r * PINGPONG_SIZES + i];
        seconds[i] = profile_median(column, ctx->size);
    }
    free(all), free(column);
    return st;
}

/* ---- collectives ------------------------------------------------------------------------- */

/* Elements each rank passes for a buffer of `bytes` in a group of `ranks`: the whole buffer
 * for allreduce; its share for all-gather (what each rank sends) and reduce-scatter (what each
 * gets). */
static int64_t op_count(loom_collective_op op, int64_t bytes, int ranks) {
    int64_t floats = bytes / (int64_t)sizeof(float);
    return op == LOOM_COLLECTIVE_ALLREDUCE ? floats : floats / ranks;
}

/* One call of op on buf, the way training makes it (parallel/grad_sync.c): an allreduce in
 * place (a data-parallel bucket's, whose non-blocking start and wait are the same operation);
 * an all-gather in place (ZeRO-1's parameters); a reduce-scatter by `ring`, over equal blocks
 * of count elements, started and run to its end (a ZeRO-1 gradient bucket's, whose ring is
 * the same function). */
static loom_status run_collective(loom_comm *group, loom_collective_op op, int64_t count,
                                  float *buf, loom_comm_ring *ring) {
    if (op == LOOM_COLLECTIVE_ALLREDUCE)
        return loom_comm_allreduce_f32(group, buf, count, LOOM_REDUCE_SUM);
    if (op == LOOM_COLLECTIVE_ALLGATHER) {
        return loom_comm_allgather_f32(group, buf + loom_comm_rank(group) * count, buf, count);
    }
    loom_status st = loom_comm_ring_start(ring, buf);
    return st == LOOM_OK ? loom_comm_ring_wait(ring) : st;
}

/* Seconds of one call on this rank: the median of the trials, each `calls` calls back to back
 * after a barrier (at most COLLECTIVE_TRIALS). The buffer is zero, so sums stay zero. A
 * reduce-scatter's ring is made before the timing, as training makes its buckets' rings
 * once. */
static loom_status time_collective(loom_comm *group, loom_collective_op op, int64_t count,
                                   float *buf, int calls, int trials, double *seconds) {
    double times[COLLECTIVE_TRIALS];
    loom_comm_ring *ring = NULL;
    loom_status st = LOOM_OK;
    if (op == LOOM_COLLECTIVE_REDUCE_SCATTER) {
        int ranks = loom_comm_size(group);
        int64_t *bounds = loom_malloc(((size_t)ranks + 1) * sizeof *bounds, "ring bounds");
        if (!bounds) return LOOM_ERR_NOMEM;
        for (int r = 0; r <= ranks; r++) bounds[r] = r * count;
        st = loom_comm_ring_create(group, bounds, 0, &ring);
        free(bounds);
    }
    for (int t = -1; t < trials && st == LOOM_OK; t++) { /* t = -1 warms up */
        st = loom_comm_barrier(group);
        double t0 = loom_now();
        for (int c = 0; c < (t < 0 ? 1 : calls) && st == LOOM_OK; c++) {
            st = run_collective(group, op, count, buf, ring);
        }
        if (t >= 0) times[t] = (loom_now() - t0) / calls;
    }
    loom_comm_ring_free(ring);
    *seconds = profile_median(times, trials);
    return st;
}

/* Appends a fit of (bytes, seconds) to out->collectives. Times that do not grow with the size
 * (noise on shared cores, where every size costs about the same) give no fit: the description
 * then leaves that collective to the ring model of the link figures, and the log says so. */
static loom_status add_fit(const profile_ctx *ctx, loom_cluster *out, loom_collective_op op,
                           int link, int ranks, const double *bytes, const double *seconds, int n) {
    double alpha = 0, beta = 0;
    loom_status st = profile_fit_alpha_beta(bytes, seconds, n, &alpha, &beta);
    if (st != LOOM_OK) {
        profile_say(ctx,
                    "collectives: %-14s over %d ranks (%s): no fit (%s); the link's ring model "
                    "stands for it",
                    op_name(op), ranks, link_name(link), loom_last_error());
        loom_clear_error();
        return LOOM_OK;
    }
    if (out->num_collectives >= LOOM_CLUSTER_MAX_COLLECTIVES) {
        return loom_fail(LOOM_ERR_RUNTIME, "profile: more than %d collective fits",
                         LOOM_CLUSTER_MAX_COLLECTIVES);
    }
    out->collectives[out->num_collectives++] = (loom_collective_fit){op, link, ranks, alpha, beta};
    profile_say(ctx, "collectives: %-14s over %d ranks (%s): alpha %.1f us, 1/beta %.2f GB/s",
                op_name(op), ranks, link_name(link), alpha * 1e6, 1e-9 / beta);
    return LOOM_OK;
}

/* Every timed op at every size on `group` (the world, or with per_host this rank's host's),
 * all groups at once; the fits are of the groups of `ranks` members (the world; the fullest
 * hosts), each time the slowest member's. */
static loom_status measure_collectives(const profile_ctx *ctx, loom_comm *group, int per_host,
                                       int link, int ranks, loom_cluster *out) {
    const collective_plan *plan = ctx->opts.quick ? &collective_quick : &collective_full;
    const int k = TIMED_OPS * plan->sizes;
    int64_t largest = plan->bytes[plan->sizes - 1];
    float *buf = loom_alloc_aligned((size_t)largest, "collective buffer");
    double *all = loom_calloc((size_t)ctx->size * (size_t)k, sizeof *all, "collective times");
    loom_status st =
        profile_agree(ctx, buf && all ? LOOM_OK : LOOM_ERR_NOMEM, "the collective buffers");
    double mine[TIMED_OPS * COLLECTIVE_SIZES];
    int group_size = group ? loom_comm_size(group) : 0;
    for (int o = 0; o < TIMED_OPS && st == LOOM_OK; o++) {
        for (int s = 0; s < plan->sizes && st == LOOM_OK; s++) {
            int64_t count = op_count(timed_ops[o], plan->bytes[s], group_size);
            st = time_collective(group, timed_ops[o], count, buf, plan->calls[s], plan->trials,
                                 &mine[o * plan->sizes + s]);
        }
    }
    st = profile_agree(ctx, st, "timing the collectives");
    if (st == LOOM_OK) st = profile_gather(ctx, mine, k, all);
    for (int o = 0; o < TIMED_OPS && st == LOOM_OK; o++) {
        double bytes[COLLECTIVE_SIZES], seconds[COLLECTIVE_SIZES];
        for (int s = 0; s < plan->sizes; s++) {
            int64_t count = op_count(timed_ops[o], plan->bytes[s], ranks);
            bytes[s] = (double)(timed_ops[o] == LOOM_COLLECTIVE_ALLREDUCE ? count : count * ranks) *
                       sizeof(float);
            seconds[s] = 0;
            for (int r = 0; r < ctx->size; r++) {
                int in_group = !per_host || ctx->host_ranks[ctx->host_of[r]] == ranks;
                double t = all[(size_t)r * k + o * plan->sizes + s];
                if (in_group && t > seconds[s]) seconds[s] = t;
            }
        }
        st = add_fit(ctx, out, timed_ops[o], link, ranks, bytes, seconds, plan->sizes);
    }
    loom_free_aligned(buf);
    free(all);
    return st;
}

/* ---- the phase --------------------------------------------------------------------------- */

loom_status profile_measure_links(const profile_ctx *ctx, loom_cluster *out) {
    const pingpong_plan *plan = ctx->opts.quick ? &pingpong_quick : &pingpong_full;
    int measured[LOOM_LINK_CLASSES] = {out->devices_per_node >= 2, ctx->hosts >= 2};
    loom_status st = LOOM_OK;
    for (int link = 0; link < LOOM_LINK_CLASSES && st == LOOM_OK; link++) {
        if (!measured[link]) continue;
        double seconds[PINGPONG_SIZES], bytes[PINGPONG_SIZES];
        st = measure_link(ctx, link, plan, seconds);
        if (st != LOOM_OK) break;
        for (int i = 0; i < PINGPONG_SIZES; i++) bytes[i] = (double)plan->bytes[i];
        out->links[link].latency_s = seconds[0];
        out->links[link].bandwidth = bytes[PINGPONG_SIZES - 1] / seconds[PINGPONG_SIZES - 1];
        profile_say(ctx, "links: %s latency %.1f us, bandwidth %.2f GB/s (one way)",
                    link_name(link), seconds[0] * 1e6, out->links[link].bandwidth / 1e9);
        st = add_fit(ctx, out, LOOM_COLLECTIVE_SENDRECV, link, 2, bytes, seconds, PINGPONG_SIZES);
    }
    if (st != LOOM_OK) return st;
    /* A class with nothing to measure it on takes the other's figures (the note says so). */
    if (!measured[LOOM_LINK_INTER_NODE]) out->links[LOOM_LINK_INTER_NODE] = out->links[0];
    if (!measured[LOOM_LINK_INTRA_NODE]) out->links[LOOM_LINK_INTRA_NODE] = out->links[1];

    int world_link = ctx->hosts >= 2 ? LOOM_LINK_INTER_NODE : LOOM_LINK_INTRA_NODE;
    profile_say(ctx,
                "collectives: allreduce, allgather, reduce_scatter over the world (%d "
                "ranks), %d sizes",
                ctx->size, ctx->opts.quick ? collective_quick.sizes : collective_full.sizes);
    st = measure_collectives(ctx, ctx->world, 0, world_link, ctx->size, out);
    if (st != LOOM_OK || ctx->hosts < 2 || out->devices_per_node < 2) return st;
    profile_say(ctx, "collectives: over each host's ranks, every host at once");
    loom_comm *host = NULL;
    st = loom_comm_split(ctx->world, ctx->host_of[ctx->rank], ctx->rank, "host", &host);
    if (st == LOOM_OK) {
        st = measure_collectives(ctx, host, 1, LOOM_LINK_INTRA_NODE, out->devices_per_node, out);
    }
    loom_comm_free(host);
    return st;
}
