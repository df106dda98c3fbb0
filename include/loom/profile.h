/*
 * loom/profile.h — `loom profile`: measures a cluster description (loom/cluster.h) on the ranks
 * that will train, every rank measuring at the same time, so that shared cores,
 * oversubscription and the contention for memory and links are in the figures:
 *
 *   hosts        which ranks share a host (by host name): nodes, devices (ranks) per node, the
 *                device's name (the CPU model and the threads each rank uses)
 *   device       the fp32 peak (the faster of a large square sgemm and the fastest of a GPT-2
 *                block's GEMMs below; bf16 and fp16 are left at 0, not offered: the runtime
 *                trains fp32), the memory each rank can have (available memory / ranks on its
 *                host), a STREAM triad's bandwidth, and the share of the peak that a GPT-2
 *                block's GEMMs (forward, input and weight gradients) reach, measured in passes
 *                that interleave them with the square sgemm
 *   links        ping-pong latency and bandwidth between two ranks of one host and of two
 *                hosts, and alpha-beta fits of send-receive, allreduce, all-gather and
 *                reduce-scatter over the world and over each host's ranks
 *   compressors  bytes of fp32 input per second through encode + decode, per method
 *
 * Figures measured on several ranks are the median over the ranks (the memory the smallest
 * share, a collective the slowest rank); every rank returns the same description.
 *
 * Not here: writing the file (loom_cluster_write), turning the figures into times (the cost
 * model).
 */
#ifndef LOOM_PROFILE_H
#define LOOM_PROFILE_H

#include "loom/base.h"
#include "loom/cluster.h"
#include "loom/comm.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

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
loom_status loom_profile_run(loom_comm *world, const loom_profile_opts *opts, loom_cluster *out);

/* The "source" note for loom_cluster_write: what was measured, on how many ranks and threads,
 * and which link class was copied from the other (one host: inter_node is intra_node's; one
 * rank per host: the other way round). */
void loom_profile_source_note(const loom_cluster *cluster, char *note, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PROFILE_H */
