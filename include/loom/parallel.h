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

/* ---- pipeline schedules (as data) ---------------------------------------------------------
 * For p stages and m micro-batches, each stage gets the ordered list of actions it executes in
 * one training step; the executor walks the list. Two schedules:
 *
 *   GPipe  all forwards (micro-batches 0..m-1), then all backwards, also in order 0..m-1 (as
 *          Megatron does); every stage holds the activations of all m micro-batches.
 *   1F1B   PipeDream-Flush, Megatron's non-interleaved schedule: stage i runs
 *          w = min(p - i - 1, m) warm-up forwards, then alternates one forward and one backward
 *          until the forwards run out, then drains the w remaining backwards. Stage i holds at
 *          most min(p - i, m) micro-batches of activations.
 *
 * Both have the same bubble, (p - 1) forward+backward times (with equal stage times and free
 * communication a step takes 3(m + p - 1) forward times, backward = 2 forwards); 1F1B needs
 * less activation memory.
 *
 * Send/receive contract for the executor. Take the actions that use the link between stages s
 * and s + 1: SEND_ACT/RECV_GRAD in s's list, RECV_ACT/SEND_GRAD in s + 1's. Both ends list them
 * in the SAME order: the k-th message one end sends (receives) is the k-th the other receives
 * (sends), for the same micro-batch. So
 *   - running every list with plain BLOCKING sends and receives in list order never deadlocks,
 *     even with synchronous (rendezvous) sends such as MPI_Ssend or large MPI_Send;
 *   - messages of one kind on one link are sent and received in the same order, so matching by
 *     (source, one tag per kind) pairs them right; a tag per micro-batch also works;
 *   - relaxing that order is safe too: sends may be non-blocking (MPI_Isend, waited for before
 *     the buffer is reused and at the latest at the end of the step), receives may be posted
 *     early (MPI_Irecv, posted in list order or tagged by micro-batch, waited for at the latest
 *     where the list has them), and a SEND and RECV adjacent in the list may be fused into one
 *     sendrecv, as Megatron's send_forward_recv_backward does.
 * In 1F1B's steady state a stage receives the next micro-batch's activation before sending the
 * gradient of the one it just finished (RECV_ACT k+1, then SEND_GRAD j): that is what keeps the
 * two ends of a link in the same order. It costs no time: the upstream stage sends that
 * activation before it waits for the gradient. */

typedef enum {
    LOOM_PIPE_RECV_ACT,  /* receive micro-batch mb's input activation from stage - 1 */
    LOOM_PIPE_FORWARD,   /* forward of micro-batch mb */
    LOOM_PIPE_SEND_ACT,  /* send mb's output activation to stage + 1 */
    LOOM_PIPE_RECV_GRAD, /* receive the gradient of mb's output from stage + 1 */
    LOOM_PIPE_BACKWARD,  /* backward of mb */
    LOOM_PIPE_SEND_GRAD, /* send the gradient of mb's input to stage - 1 */
} loom_pipe_op;

typedef struct {
    loom_pipe_op op;
    int micro_batch; /* 0 .. m-1 */
} loom_pipe_action;

typedef struct {
    loom_pipe_action *actions; /* (count,) owned; free with loom_pipe_schedule_free */
    int count;
} loom_pipe_stage_schedule;

typedef enum { LOOM_SCHEDULE_GPIPE, LOOM_SCHEDULE_1F1B } loom_schedule_kind;

/* Fills one stage's list (stage in [0, stages)). The first stage has no RECV_ACT/SEND_GRAD, the
 * last no SEND_ACT/RECV_GRAD; a single stage only computes. Bad arguments (stages or
 * micro_batches below 1, stage out of range, unknown kind) give LOOM_ERR_INPUT naming the value;
 * *out is then empty. */
loom_status loom_pipe_schedule(loom_schedule_kind kind, int stages, int micro_batches, int stage,
                               loom_pipe_stage_schedule *out);
void loom_pipe_schedule_free(loom_pipe_stage_schedule *s);

/* "gpipe" or "1f1b" (the plan file's batch.schedule); anything else is LOOM_ERR_INPUT. */
loom_status loom_schedule_kind_parse(const char *name, loom_schedule_kind *kind);
/* The name loom_schedule_kind_parse reads back ("?" for a value out of range). */
const char *loom_schedule_kind_name(loom_schedule_kind kind);
/* "recv_act", "forward", ... for traces and messages ("?" for a value out of range). */
const char *loom_pipe_op_name(loom_pipe_op op);

/* The largest number of micro-batches whose activations the stage holds at once (forward done,
 * backward not yet): the activation memory the stage must plan for. */
int loom_pipe_peak_in_flight(const loom_pipe_stage_schedule *s);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PARALLEL_H */
