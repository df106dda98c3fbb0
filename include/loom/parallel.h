/*
 * loom/parallel.h — what wraps the model to run it on many ranks: the rank mesh (TP, DP and
 * PP groups split once from the world in Megatron's order) and data-parallel gradient
 * synchronisation (bucketed allreduce started while backward still runs; ZeRO-1 sharding of
 * the optimizer state).
 *
 * Not here: MPI itself (comm/), the model's maths (model/), the step loop (train/).
 */
#ifndef LOOM_PARALLEL_H
#define LOOM_PARALLEL_H

#include "loom/base.h"
#include "loom/comm.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Ranks in Megatron order: world = pp_rank * (dp * tp) + dp_rank * tp + tp_rank. */
typedef struct {
    loom_comm *world;        /* borrowed */
    loom_comm *tp, *dp, *pp; /* owned */
    int dp_size, tp_size, pp_size;
    int dp_rank, tp_rank, pp_rank;
} loom_mesh;

/* Splits the world into the three group kinds. dp * tp * pp must equal the world size: the
 * error names the launched and the required rank counts, and is the same on every rank. */
loom_status loom_mesh_create(loom_comm *world, int dp, int tp, int pp, loom_mesh *mesh);
void loom_mesh_free(loom_mesh *mesh);

/* Data-parallel gradient synchronisation over one flat gradient buffer.
 *
 * The buffer is cut into buckets of about bucket_bytes, from the top (highest offsets, whose
 * gradients backward finishes first) down. loom_dp_sync_ready(offset) starts the allreduce of
 * every bucket lying wholly at or above offset; loom_dp_sync_finish starts the rest and waits
 * for all. Gradients are SUMMED (scale the loss by 1/dp beforehand to get the mean). */
typedef struct loom_dp_sync loom_dp_sync;
loom_status loom_dp_sync_create(loom_dp_sync **sync, loom_comm *dp, float *grads, size_t count,
                                size_t bucket_bytes);
void loom_dp_sync_free(loom_dp_sync *sync);
int loom_dp_sync_num_buckets(const loom_dp_sync *sync);
/* Starts a new round (no bucket in flight). */
void loom_dp_sync_begin(loom_dp_sync *sync);
/* Gradients at offsets >= ready_offset are final: start their buckets. Fits loom_gpt's
 * grads_ready hook (ctx = the sync). */
void loom_dp_sync_ready(void *sync, size_t ready_offset);
/* Starts what is left and waits for every bucket. */
loom_status loom_dp_sync_finish(loom_dp_sync *sync);

/* ZeRO-1: the flat buffer (padded to a multiple of dp) is split into dp contiguous shards;
 * rank r owns [r * shard, (r + 1) * shard). */
typedef struct {
    size_t padded_count; /* buffer length, a multiple of dp */
    size_t shard;        /* padded_count / dp */
    size_t begin, end;   /* this rank's range, end clipped to the real count */
} loom_zero_shard;
loom_zero_shard loom_zero_shard_of(size_t count, int dp_size, int dp_rank);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PARALLEL_H */
