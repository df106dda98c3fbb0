/*
 * parallel_internal.h — what the files of src/parallel/ share and nobody else sees: compressed
 * data-parallel buckets (dp_compress.c), driven by the bucket state machine of grad_sync.c; the
 * schedules built from a reference run (schedule_order.c), behind loom_pipe_schedule_build.
 */
#ifndef LOOM_PARALLEL_INTERNAL_H
#define LOOM_PARALLEL_INTERNAL_H

#include "loom/compress.h"
#include "loom/parallel.h"

/* Compressed synchronisation of data-parallel buckets: one compressor per matrix of every
 * bucket, and the buffers of the bucket's collectives.
 *   PowerSGD       round 1: encode (M = G + E, P = M Q), one allreduce of [the uncompressed
 *                  matrices of the bucket, every P]; round 2: orthonormalise the P's, Q = M^T P,
 *                  one allreduce of every Q; then G = P Q^T (the sum's approximation).
 *   other methods  round 1: encode every matrix into this rank's wire buffer, one all-gather of
 *                  the wire buffers; then G = the sum of every rank's decoded buffer, in rank
 *                  order, so every replica gets the same bits.
 * The gradient ends as the sum over replicas, as the uncompressed allreduce leaves it. */
typedef struct loom_dp_compress loom_dp_compress;

/* keep_tensor: a tensor (LOOM_WTE...) sent uncompressed, or -1. */
loom_status loom_dp_compress_create(loom_dp_compress **out, const loom_compress_opts *opts,
                                    const loom_grad_bucket *buckets, int num_buckets, int replicas,
                                    int keep_tensor);
void loom_dp_compress_free(loom_dp_compress *dc);
/* Starts bucket b's first round: encodes from grads (the model's flat gradient buffer) and
 * starts the round's collective on dp. */
loom_status loom_dp_compress_start(loom_dp_compress *dc, int b, float *grads, loom_comm *dp,
                                   loom_comm_request **request);
/* After the round's collective completed: decodes, and starts the next round on `dp` (*request
 * set) or finishes the bucket (*request NULL). */
loom_status loom_dp_compress_next(loom_dp_compress *dc, int b, float *grads, loom_comm *dp,
                                  loom_comm_request **request);
/* Whether bucket b's completed round is the first of two (PowerSGD): the second starts with
 * loom_dp_compress_next, on a group of its own. */
int loom_dp_compress_has_second(const loom_dp_compress *dc, int b);
/* End of step: keep (accept) or drop every compressor's working state. */
void loom_dp_compress_commit(loom_dp_compress *dc, int accept);
/* The same for bucket b alone (islands: a fragment's buckets end at a step of their own). */
void loom_dp_compress_commit_bucket(loom_dp_compress *dc, int b, int accept);
/* Counters since the last call (then reset): bytes the compressed buckets did not send
 * compared with an uncompressed allreduce of them, seconds encoding and decoding, the
 * residuals' and the inputs' squared norms. */
void loom_dp_compress_take_stats(loom_dp_compress *dc, loom_compress_stats *stats);
/* Compressors of every bucket, in bucket and matrix order (for checkpoints). */
int loom_dp_compress_count(const loom_dp_compress *dc);
loom_compressor *loom_dp_compress_get(loom_dp_compress *dc, int i);
size_t loom_dp_compress_state_bytes(const loom_dp_compress *dc);

/* FNV-1a over n bytes (grad_sync.c): the replica check's and the islands' start check's. */
uint64_t loom_parallel_checksum(const void *data, size_t n);

/* ZeRO-2/3 (zero.c): per block a gradient buffer the passes write into, reduce-scattered over
 * dp as soon as that block's backward is done, this rank's block of the sum accumulated into its
 * shard of the gradient; the embeddings' and the final LayerNorm's units stay whole for the step
 * and are reduce-scattered at its end. ZeRO-3: each block's parameters gathered before a pass
 * reads them (prefetched), dropped after. Creating it frees the model's full gradient buffer. */
typedef struct loom_unit_sync loom_unit_sync;
loom_status loom_unit_sync_create(loom_unit_sync **out, const loom_mesh *mesh, loom_gpt *model,
                                  loom_zero_shard range);
void loom_unit_sync_free(loom_unit_sync *u);
/* Installs the model's unit hook (for every backward of the run). */
void loom_unit_sync_attach(loom_unit_sync *u);
/* Start of step `step` (0-based): the shard and the held units zeroed; the step's rounds are
 * quantised when the plan compresses this stage and the warm-up is over. */
void loom_unit_sync_zero(loom_unit_sync *u, int64_t step);
/* End of a step's backward: every ring completed, the tied embedding summed over `embedding`
 * (NULL: none), the held units reduce-scattered; the shard then holds the step's gradients. */
loom_status loom_unit_sync_finish(loom_unit_sync *u, loom_comm *embedding);
/* The shard's gradients, indexed from range.begin. */
float *loom_unit_sync_grads(loom_unit_sync *u);
/* Bytes of gradient memory it holds: the shard, the held units and the pool's buffers at their
 * high-water mark. */
size_t loom_unit_sync_buffer_bytes(const loom_unit_sync *u);
/* ZeRO-3, after an update: block units kept for the step are dropped, and the held units'
 * parameters are gathered again from the shards, in the background (piece by piece beside the
 * next passes' block gathers; a forward waits where it reads them); nothing under ZeRO-2. */
loom_status loom_unit_sync_refresh(loom_unit_sync *u);
/* ZeRO-3: waits until the held units' parameters are gathered (before reading them outside a
 * pass); nothing under ZeRO-2. */
void loom_unit_sync_wait_params(loom_unit_sync *u);
/* The next pass the schedule runs that reads parameters: chunk's forward (dir +1) or backward
 * (-1); dir 0: none (the step's last). ZeRO-3 prefetches its first blocks past a chunk's end. */
void loom_unit_sync_next_pass(loom_unit_sync *u, int chunk, int dir);
/* ZeRO-3 since creation: block all-gathers started, and those a pass had to start for the block
 * it was about to read (not prefetched, not kept from the pass before). */
void loom_unit_sync_gather_counts(const loom_unit_sync *u, int64_t *gathers, int64_t *just_in_time);
/* ZeRO-3: bytes of gathered parameters it holds (held units, the pool at its high-water mark). */
size_t loom_unit_sync_param_bytes(const loom_unit_sync *u);
/* End of step for the error-feedback residuals: accept keeps the working copies the step built,
 * 0 (a skipped step) drops them. */
void loom_unit_sync_commit(loom_unit_sync *u, int accept);
/* Adds the quantised rounds' counters since the last call (bytes saved against the fp32 rings,
 * seconds encoding, residuals' and inputs' squared norms) to *stats and resets them. */
void loom_unit_sync_take_stats(loom_unit_sync *u, loom_compress_stats *stats);
/* Error feedback's residuals, one per compressing unit: how many, and entry k's unit, length and
 * committed copy (read/write, for checkpoints; good until the next commit), NULL past the end. */
int loom_unit_sync_residual_count(const loom_unit_sync *u);
float *loom_unit_sync_residual(loom_unit_sync *u, int k, int *unit, size_t *floats);
/* Bytes of the residuals, both copies. */
size_t loom_unit_sync_state_bytes(const loom_unit_sync *u);
/* ZeRO-3: held unit k's gathered parameters (0 the embeddings, 1 the final LayerNorm) and their
 * count. */
const float *loom_unit_sync_held_params(loom_unit_sync *u, int k, size_t *floats);

/* The schedules built from a reference run (interleaved, zb-h1, zb-v; schedule_order.c): the
 * lists of ranks first .. first + count - 1 (out[0 .. count)) for a checked shape, from one
 * run. */
loom_status loom_pipe_schedule_ordered(const loom_pipe_shape *shape, int first, int count,
                                       loom_pipe_stage_schedule *out);

#endif /* LOOM_PARALLEL_INTERNAL_H */
