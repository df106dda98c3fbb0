/*
 * loom/cluster.h — a cluster description: what the planner's cost model knows of the hardware it
 * plans for. Written by `loom profile` (measured on the ranks that will train) or shipped in
 * clusters/ (vendor specifications and published microbenchmarks, each figure with its source);
 * read by `loom plan --cluster FILE`.
 *
 * The file is JSON:
 *
 *   {
 *     "name": "dgx-a100",
 *     "source": "what the description is of, and where its figures come from",
 *     "nodes": 1, "max_nodes": 140,
 *     "node": {
 *       "devices": 8,
 *       "device": {
 *         "name": "NVIDIA A100-SXM4-80GB",
 *         "memory_bytes": 85899345920,
 *         "peak_flops": {"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12},
 *         "training_precision": "bf16",
 *         "memory_bandwidth": 2.039e12,
 *         "gemm_efficiency": [{"flops": 1e6, "efficiency": 0.05}, ...,
 *                             {"flops": 1e12, "efficiency": 0.8}],
 *         "sources": {"peak_flops": "...", "gemm_efficiency": "..."}
 *       },
 *       "links": {
 *         "intra_node": {"bandwidth": 3.0e11, "latency_s": 3e-6, "call_latency_s": 8e-6,
 *                        "source": "..."},
 *         "inter_node": {"bandwidth": 2.5e10, "latency_s": 5e-6, "source": "..."}
 *       }
 *     },
 *     "collectives": [{"op": "allreduce", "link": "inter_node", "ranks": 8, "alpha_s": 1e-5,
 *                      "beta_s_per_byte": 4e-11}],
 *     "compressors": {"powersgd": 2.2e9, "int8": 4.6e8},
 *     "islands": {"nodes": 4, "link": {"bandwidth": 1.25e7, "latency_s": 0.05,
 *                                      "source": "..."}}
 *   }
 *
 * Units: bytes, seconds, FLOP/s, bytes/s (bandwidth per device, one direction). "gemm_efficiency"
 * is the share of the precision's peak a GEMM of the given FLOPs (2 m n k) reaches, a table in
 * ascending FLOPs interpolated linearly in log(FLOPs) and held flat beyond its ends; it applies
 * to every precision (a measured table is measured in fp32). "collectives" (optional) are
 * measured alpha-beta fits per collective, link class and group size, which the cost model
 * prefers to the link figures where one matches. "compressors" (optional) are bytes of fp32
 * input per second through encode + decode, per method (loom/compress.h's names).
 * "node.device.training_precision" (optional) is the precision the cluster trains in, which
 * `loom plan` plans for when --precision is not given: one the device offers a peak for (else
 * refused by name). Left out, it is "fp32": what loom's runtime trains in, what `loom profile`
 * measures (and writes), and what `loom plan` planned for before the field existed, so an older
 * description plans as it did (guessing bf16 or fp16 from the peaks would change its plans).
 * "node.device.attention" (optional: "materialized" when left out) is how the attention core runs
 * on the device: "materialized", as loom's CPU backend does (QK^T, the softmax and AV as separate
 * kernels, the (B, heads, T, T) softmax written to memory and kept for backward), or "fused", one
 * kernel that keeps the scores on chip and recomputes QK^T in its backward (FlashAttention, what
 * GPU trainers run): the cost model then charges no softmax traffic and adds backward's QK^T.
 * It prices time only; the memory model stays loom's runtime's.
 * "node.device.optimizer_params_per_s" (optional, measured by `loom profile`) is how many
 * parameters one device's AdamW update takes per second; without it the cost model assumes the
 * update streams 28 bytes per parameter at the memory bandwidth.
 * "node.links.*.call_latency_s" (optional, default 0) is a fixed cost a collective pays once per
 * call on top of its ring steps' latencies (a collective library's launch and setup: NCCL's
 * base latency); a measured fit's alpha_s already holds it, and a send does not pay it.
 * "islands" (optional) is the island level: islands of "nodes" nodes each, joined by "link" (a
 * link as above, per device and direction: what one rank gets of the slow link between islands),
 * which the cost model prices island training's outer syncs on; left out, islands meet over
 * inter_node.
 * "nodes" is how many the description was measured on (1 for a shipped node); "max_nodes" how
 * many the cluster has (`loom plan --devices N` takes up to max_nodes x devices). "sources"
 * (per device) and "source" (per link) are free text, required in shipped descriptions (the
 * checker does not read them). Unknown keys are errors.
 *
 * Plausible bounds (a figure outside them is refused naming the file and the field, so that a
 * typo is not planned with): at most LOOM_CLUSTER_MAX_DEVICES devices (max_nodes x node.devices,
 * and a collective's ranks); each peak 0 (the precision is not
 * offered) or 1e6 to 1e18 FLOP/s, at least one offered (the planner refuses a precision whose
 * peak is 0 by name); every rate, bandwidths, compressor throughputs and
 * optimizer_params_per_s, 1e3 to 1e15 (bytes or parameters per second; the optional ones may be
 * 0: not measured), a fit's beta_s_per_byte their inverse, 1e-15 to 1e-3; latencies and a fit's
 * alpha_s 0 to 10 s.
 *
 * Also here: measuring a description on the ranks that will train (`loom profile`, below).
 *
 * Not here: turning these figures into the time of a stage or a collective (the planner's cost
 * model).
 */
#ifndef LOOM_CLUSTER_H
#define LOOM_CLUSTER_H

#include "loom/base.h"
#include "loom/comm.h"
#include "loom/compress.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_CLUSTER_MAX_GEMM_POINTS 64
#define LOOM_CLUSTER_MAX_COLLECTIVES 64
/* the plausible bounds (above) */
#define LOOM_CLUSTER_MAX_DEVICES   (1 << 20)
#define LOOM_CLUSTER_MIN_FLOPS     1e6
#define LOOM_CLUSTER_MAX_FLOPS     1e18
#define LOOM_CLUSTER_MIN_RATE      1e3 /* bytes or parameters per second */
#define LOOM_CLUSTER_MAX_RATE      1e15
#define LOOM_CLUSTER_MAX_LATENCY_S 10.0

typedef struct {
    double flops;      /* 2 m n k of the GEMM, > 0, ascending in the table */
    double efficiency; /* share of peak, in (0, 1] */
} loom_gemm_point;

/* A link class: what one device sends in one direction. */
typedef struct {
    double bandwidth;      /* bytes/s, > 0 */
    double latency_s;      /* >= 0: per step of a ring */
    double call_latency_s; /* >= 0: once per collective call (optional, default 0) */
} loom_link;

enum { LOOM_LINK_INTRA_NODE, LOOM_LINK_INTER_NODE, LOOM_LINK_CLASSES };

typedef enum {
    LOOM_COLLECTIVE_ALLREDUCE,
    LOOM_COLLECTIVE_ALLGATHER,
    LOOM_COLLECTIVE_REDUCE_SCATTER,
    LOOM_COLLECTIVE_SENDRECV, /* point to point, one message each way */
} loom_collective_op;
#define LOOM_COLLECTIVE_OPS 4

/* A measured fit: time = alpha_s + beta_s_per_byte x bytes (the buffer's bytes). */
typedef struct {
    loom_collective_op op;
    int link;  /* LOOM_LINK_INTRA_NODE or LOOM_LINK_INTER_NODE */
    int ranks; /* group size, >= 2 */
    double alpha_s, beta_s_per_byte;
} loom_collective_fit;

typedef struct {
    char name[64];
    int nodes;            /* measured on (>= 1) */
    int max_nodes;        /* the cluster's (>= nodes) */
    int devices_per_node; /* >= 1 */
    /* one device */
    char device_name[64];
    int64_t memory_bytes;               /* > 0 */
    double peak_flops[LOOM_PRECISIONS]; /* FLOP/s; 0: the precision is not offered */
    loom_precision training_precision;  /* what the cluster trains in (one with a peak): the
                                           planner's default ("training_precision", optional:
                                           fp32) */
    int fused_attention;                /* "attention": "fused" (FlashAttention's pricing) */
    double memory_bandwidth;            /* bytes/s, > 0 (memory-bound kernels) */
    double optimizer_params_per_s;      /* AdamW parameters updated per second; 0: not measured
                                           ("optimizer_params_per_s", optional) */
    loom_gemm_point gemm[LOOM_CLUSTER_MAX_GEMM_POINTS];
    int gemm_points; /* >= 1 */
    loom_link links[LOOM_LINK_CLASSES];
    loom_collective_fit collectives[LOOM_CLUSTER_MAX_COLLECTIVES];
    int num_collectives;
    double compressor_bytes_per_s[LOOM_COMPRESS_COUNT]; /* per method; 0: not measured */
    /* the island level ("islands", optional): groups of island_nodes nodes joined by a slower
     * link (per device, one direction); island_nodes 0: none (islands then meet over
     * inter_node) */
    int island_nodes;
    loom_link island_link;
} loom_cluster;

/* Reads and fully checks a description. Every problem is LOOM_ERR_INPUT with one message naming
 * the file, the JSON path and the expectation, e.g. "cluster.json: node.device.peak_flops.fp32:
 * expected a finite number > 0, got -1"; malformed JSON names the line and column. On failure
 * *cluster is zeroed. */
loom_status loom_cluster_read(const char *path, loom_cluster *cluster);
/* The rules (the ones above, `source` naming where the description came from). */
loom_status loom_cluster_check(const loom_cluster *cluster, const char *source);
/* Checks, then writes atomically, pretty-printed, keys in the order of the example; doubles read
 * back equal. "sources"/"source" are written from `source_note` (NULL: "measured by loom
 * profile"). */
loom_status loom_cluster_write(const char *path, const loom_cluster *cluster,
                               const char *source_note);

/* The share of peak a GEMM of `flops` (2 m n k) reaches: the table, linear in log(flops),
 * flat beyond its ends. */
double loom_cluster_gemm_efficiency(const loom_cluster *cluster, double flops);
/* Seconds for a GEMM of m x n x k in `precision` on one device (0 when the precision has no
 * peak). */
double loom_cluster_gemm_s(const loom_cluster *cluster, loom_precision precision, double m,
                           double n, double k);
/* Bytes each of `ranks` devices sends in a ring collective of a `bytes` buffer: an allreduce
 * 2(n-1)/n of it (a reduce-scatter, then an all-gather), an all-gather or a reduce-scatter
 * (n-1)/n, a send-receive all of it; 0 for ranks <= 1. Computed as bytes x 2(n-1) / n (or
 * (n-1) / n), so a whole buffer that n divides gives whole bytes. The one place the ring's
 * traffic is stated: the collective's time below and the planner's byte counts use it. */
double loom_cluster_ring_bytes(loom_collective_op op, int ranks, double bytes);
/* Seconds for a collective of `bytes` (the buffer) over `ranks` devices on link class `link`:
 * the measured fit for (op, link, ranks) when there is one, else the ring model from the link
 * figures (what loom_cluster_ring_bytes says each device sends, at the link's bandwidth, plus a
 * latency per ring step: 2(n-1) for an allreduce (reduce-scatter, then all-gather), n-1 for an
 * all-gather or a reduce-scatter, 1 for a send, and the link's call_latency_s once for every
 * collective but a send). 0 for ranks <= 1. */
double loom_cluster_collective_s(const loom_cluster *cluster, loom_collective_op op, int link,
                                 int ranks, double bytes);

/* ---- measuring: `loom profile` ------------------------------------------------------------
 * `loom profile` measures a cluster description (above) on the ranks
 * that will train, every rank measuring at the same time, so that shared caches and the
 * contention for memory and links are in the figures. Where a host has more ranks x threads
 * than cores (its ranks' CPU affinity together), only a core's worth of ranks per host measure
 * the device (the others sleep) and its figures are scaled by the share of a core each rank
 * gets when all train (*core_scale, < 1; 1 otherwise): timings of a few milliseconds among more
 * runnable ranks than cores are a whole core's rate or a share of it by chance:
 *
 *   hosts        which ranks share a host (by host name): nodes, devices (ranks) per node, the
 *                device's name (the CPU model and the threads each rank uses)
 *   device       the fp32 peak (the faster of a large square sgemm and the fastest of a GPT-2
 *                block's GEMMs below; bf16 and fp16 are left at 0, not offered, and the
 *                training precision is fp32: the runtime trains fp32), the memory each rank can
 *                have (available memory / ranks on its host), a STREAM triad's bandwidth, and
 *                the share of the peak that a GPT-2 block's GEMMs (forward, input and weight
 *                gradients) reach, measured in passes that interleave them with the square sgemm
 *   links        ping-pong latency and bandwidth between two ranks of one host and of two
 *                hosts, and alpha-beta fits of send-receive, allreduce, all-gather and
 *                reduce-scatter over the world and over each host's ranks, each called as
 *                training calls it (the reduce-scatter: comm's ring, as a ZeRO-1 bucket runs)
 *   compressors  bytes of fp32 input per second through encode + decode, per method
 *
 * Figures measured on several ranks are the median over the ranks (the memory the smallest
 * share, a collective the slowest rank); every rank returns the same description.
 *
 * Not here: writing the file (loom_cluster_write), turning the figures into times (the cost
 * model).
 */
typedef struct {
    int threads;       /* OpenMP and OpenBLAS threads per rank while measuring: the ones training
                          will use (0 = leave them as they are) */
    int quick;         /* fewer and smaller repetitions: seconds instead of a minute (tests) */
    int verbose;       /* rank 0 prints each phase as it starts and what it found */
    int pretend_hosts; /* > 0: take the ranks as this many hosts, contiguous blocks of ranks,
                          whatever their host names (<= the ranks) — to exercise the
                          measurements between hosts on one machine */
} loom_profile_opts;

/* Collective over `world` (at least 2 ranks: links are measured between ranks); every rank
 * passes the same options and gets the same *out. Failures (a bad option, an allocation, a
 * transfer) are returned on every rank, naming the phase and the rank that failed. */
loom_status loom_profile_run(loom_comm *world, const loom_profile_opts *opts, loom_cluster *out,
                             double *core_scale);

/* The "source" note for loom_cluster_write: what was measured, on how many ranks and threads,
 * and which link class was copied from the other (one host: inter_node is intra_node's; one
 * rank per host: the other way round). */
void loom_profile_source_note(const loom_cluster *cluster, double core_scale, char *note,
                              size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_CLUSTER_H */
