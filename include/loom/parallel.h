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
#include "loom/compress.h"
#include "loom/model.h"
#include "loom/plan.h"
#include "loom/trace.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the runtime's side of the plan ------------------------------------------------------
 * The plan (loom/plan.h) is the contract: everything it says is executed here or refused by
 * the name of its field. This build runs every field a checked plan can hold (compression
 * included); a field it cannot run is refused here, by name, as "SOURCE: FIELD: ...". */
loom_status loom_parallel_check_plan(const loom_plan *plan, const char *source);
/* The compressor options of one of the plan's compressors, for `place` (LOOM_COMPRESS_FOR_DP,
 * LOOM_COMPRESS_FOR_PP_GRAD; LOOM_COMPRESS_FOR_PP_FORWARD takes the pp compressor's forward
 * method). seed: the initial low-rank factors' (the same on every replica). */
loom_status loom_parallel_compress_opts(const loom_plan_compressor *compressor, int place,
                                        uint64_t seed, loom_compress_opts *opts);

/* ---- the rank mesh ---------------------------------------------------------------------------
 * Ranks in Megatron order (loom_plan_rank_coords): TP fastest, then DP, PP slowest. With no
 * world (one process) every size is 1 and every group NULL. */
typedef struct {
    loom_comm *world;         /* this island's ranks (without islands the job's, borrowed;
                                 with islands owned); NULL: one process */
    loom_comm *job;           /* every rank of the job (borrowed; == world without islands):
                                 what agrees on stopping and sums the metrics */
    loom_comm *across;        /* islands: the ranks of every island at this rank's place in
                                 its island (owned; NULL without islands) */
    int island, islands;      /* this rank's island and their count (0 and 1 without) */
    const loom_plan *plan;    /* borrowed */
    loom_comm *tp, *dp, *pp;  /* owned; NULL without a world */
    loom_comm *embedding;     /* the ranks of the first and the last virtual stage of this
                                 (dp, tp) position, where the tied embedding's two copies live;
                                 NULL when one rank holds both (pp 1, zb-v) */
    loom_comm *dp_second;     /* a copy of dp for compressed buckets' second collectives
                                 (compression.dp on, dp > 1; else NULL) */
    loom_comm *embedding_all; /* embedding_sync "fused": the first and last stage of every
                                 replica at this tp rank (2 dp ranks) when pp > 1; else NULL */
    int dp_size, tp_size, pp_size;
    int dp_rank, tp_rank, pp_rank;
    int lead; /* world rank 0: progress, metrics, checkpoints */
} loom_mesh;

/* Splits the world into the group kinds. islands x dp * tp * pp must equal the world size
 * (with no world, 1): the error names the launched and the required rank counts, and is the
 * same on every rank. With islands (the plan's islands.count) the world is first split into
 * islands (consecutive ranks) and the groups across them; the mesh's groups are the island's. */
loom_status loom_mesh_create(loom_comm *world, const loom_plan *plan, loom_mesh *mesh);
void loom_mesh_free(loom_mesh *mesh);
/* World rank of the given coordinates (the plan's rank formula). */
int loom_mesh_world_rank(const loom_mesh *mesh, int dp_rank, int tp_rank, int pp_rank);
/* The pipeline rank that holds slice (tensor k, layer) of the model: the rank of the layer's
 * virtual stage, the embeddings (wte, wpe) on the first's, the final LayerNorm on the last's
 * (layer -1 for the tensors that are not per layer). */
int loom_mesh_owner_rank(const loom_mesh *mesh, int k, int layer);
/* The part of the model pipeline rank pp_rank holds at TP rank tp_rank: its virtual stages as
 * chunks (the TP group only for this rank's own TP rank). */
loom_gpt_shard loom_mesh_rank_shard(const loom_mesh *mesh, int pp_rank, int tp_rank);
/* This rank's part of the model (its virtual stages, its TP rank and group). */
loom_gpt_shard loom_mesh_model_shard(const loom_mesh *mesh);

/* ---- gradient synchronisation ---------------------------------------------------------------
 * Everything that makes the replicas' and stages' gradients and parameters agree after a
 * backward: data-parallel sums (bucketed, overlapping backward) or ZeRO-1 (reduce-scatter, a
 * sharded update, all-gather), the tied embedding's two copies on the first and the last stage,
 * the loss and the global gradient norm over every rank (each parameter once), and the check
 * that the replicas hold identical parameters.
 *
 * Buckets are tensor-aligned: a bucket is a list of whole tensor slices (one layer of one
 * tensor, or a global tensor) with their (rows, cols) shapes, never a cut through one, so that a
 * compressor can work per matrix (a qkvw slice is three matrices, loom_gpt_matrix_parts). They are
 * formed from the top of the layer-major buffer down (backward finishes the last blocks first),
 * each at least bucket_bytes unless it is the last. A bucket's synchronisation is a small state
 * machine (phases, advanced by polling from the model's grads_ready hook and at the end), so that a
 * compressor can add phases (encode, a first collective, decode, a second one) without changing the
 * driver. */

typedef struct {
    size_t offset;      /* in floats, in the model's flat buffer */
    int64_t rows, cols; /* the matrix a compressor sees (1-D tensors: 1 x numel) */
    int tensor, layer;  /* LOOM_WTE ..., layer -1 for global tensors */
    int part;           /* which of the slice's loom_gpt_matrix_parts (qkvw: 0 Q, 1 K, 2 V) */
} loom_grad_matrix;

typedef struct {
    size_t begin, end;          /* [begin, end) of the flat buffer */
    loom_grad_matrix *matrices; /* (count) in buffer order, tiling [begin, end) */
    int count;
} loom_grad_bucket;

/* The smallest default bucket size: 25 MB (each bucket is a collective call of its own, each
 * call pays the collective's fixed cost). */
#define LOOM_GRAD_BUCKET_DEFAULT_MB 25.0
/* `loom train`'s default bucket size for a data-parallel degree dp, which the planner's cost
 * model assumes: 25 MB, or 4 MB per rank when that is more, so that each rank's share of a bucket
 * (a ring step's message) stays at 1M floats or more and the ring's dp per-step latencies stay
 * small beside its bytes at large dp (Megatron-LM's buckets grow with the same per-rank term,
 * 1M parameters a DP rank). */
double loom_grad_bucket_default_mb(int dp);
/* Splits a model's gradient buffer into tensor-aligned buckets of at least bucket_bytes (the
 * last one may be smaller; a tensor slice larger than that is a bucket of its own), from the
 * top down: buckets[0] ends at num_params. Free with loom_grad_buckets_free. */
loom_status loom_grad_buckets_make(const loom_gpt *model, size_t bucket_bytes,
                                   loom_grad_bucket **buckets, int *count);
/* The same with no bucket spanning any of `cuts` (flat offsets, each a tensor slice's start):
 * islands' fragments, whose buckets sync at steps of their own. */
loom_status loom_grad_buckets_make_cut(const loom_gpt *model, size_t bucket_bytes,
                                       const size_t *cuts, int num_cuts, loom_grad_bucket **out,
                                       int *count);
void loom_grad_buckets_free(loom_grad_bucket *buckets, int count);

/* ZeRO-1: the flat buffer (padded to a multiple of dp) is split into dp contiguous shards;
 * rank r owns [r * shard, (r + 1) * shard). */
typedef struct {
    size_t padded_count; /* buffer length, a multiple of dp */
    size_t shard;        /* padded_count / dp */
    size_t begin, end;   /* this rank's range, end clipped to the real count */
} loom_zero_shard;
loom_zero_shard loom_zero_shard_of(size_t count, int dp_size, int dp_rank);

typedef struct {
    int zero1;           /* shard the optimizer: reduce-scatter, update a range, all-gather */
    double bucket_bytes; /* data-parallel bucket size */
    uint64_t seed;       /* compressors' initial factors */
} loom_grad_sync_opts;

/* What compression did since the counters were last taken (summed over whatever the caller
 * adds up): bytes not sent thanks to it (the uncompressed traffic minus what was sent), the
 * pipeline's backward activation-gradient bytes as sent and as they would have been, seconds
 * spent encoding and decoding, the squared norms of the data-parallel residuals and of the
 * gradients they came from, and how many pipeline gradient sends there were and how many of them
 * were compressed. */
typedef struct {
    int64_t dp_bytes_saved, pp_bytes_saved;
    int64_t pp_grad_bytes, pp_grad_bytes_raw;
    double compress_s;
    double residual_sq, input_sq;
    int64_t pp_grad_sends, pp_grad_sends_compressed;
} loom_compress_stats;

typedef struct loom_grad_sync loom_grad_sync;
loom_status loom_grad_sync_create(loom_grad_sync **sync, const loom_mesh *mesh, loom_gpt *model,
                                  const loom_grad_sync_opts *opts);
void loom_grad_sync_free(loom_grad_sync *sync);
/* Installs the model's grads_ready hook for the coming backward (the one that finishes a chunk's
 * weight gradients: the last micro-batch's backward or W): buckets start as backward finishes
 * them. The first call of a step also resets the step's sync; further calls in the same step
 * (a rank's other chunks) only install the hook again. loom_grad_sync_after_backward removes
 * it. */
void loom_grad_sync_before_backward(loom_grad_sync *sync, int64_t step);
void loom_grad_sync_after_backward(loom_grad_sync *sync);
/* The pass of the schedule that reads parameters after the one about to run: chunk's forward
 * (dir +1) or backward (dir -1; a W reads none); dir 0: none. ZeRO-3 prefetches its first blocks
 * while the current pass ends; nothing otherwise. */
void loom_grad_sync_next_pass(loom_grad_sync *sync, int chunk, int dir);
/* ZeRO-3 since the start: block all-gathers, and those a pass started for the block it was
 * about to read (neither prefetched nor kept from the pass before); 0 and 0 otherwise. */
void loom_grad_sync_gather_counts(const loom_grad_sync *sync, int64_t *gathers,
                                  int64_t *just_in_time);
/* Completes the step's synchronisation: the remaining buckets (or ZeRO-1's reduce-scatter) and
 * the tied embedding's sum. */
loom_status loom_grad_sync_finish(loom_grad_sync *sync);
/* The range of the flat buffer this rank updates and the gradients for it: the whole buffer,
 * or under ZeRO-1 its shard (grads indexed from range.begin). */
loom_zero_shard loom_grad_sync_range(const loom_grad_sync *sync);
float *loom_grad_sync_grads(loom_grad_sync *sync);
/* Zeroes the gradients before step `step`'s first backward (0-based, as before_backward's; the
 * model's flat buffer, or ZeRO-2's shard and units, whose compression starts after the plan's
 * warm-up steps). */
void loom_grad_sync_zero_grads(loom_grad_sync *sync, int64_t step);
/* Bytes of gradient memory this rank holds: the model's flat buffer, or under ZeRO-2 the shard,
 * the whole units and the block buffers at their high-water mark. */
size_t loom_grad_sync_grad_bytes(const loom_grad_sync *sync);
/* Bytes of parameter memory this rank holds: the whole flat buffer, or under ZeRO-3 its shard,
 * the gathered embeddings and final LayerNorm, and the block buffers at their high-water mark. */
size_t loom_grad_sync_param_bytes(const loom_grad_sync *sync);
/* Mean loss over the global batch and the global gradient norm, identical on every rank:
 * loss_sum is this rank's sum of micro-batch mean losses (counted on the last stage only);
 * every parameter's gradient counts once (TP-sharded tensors summed over TP, replicated ones
 * once, the embeddings where they are first used, the final LayerNorm on the last stage). */
loom_status loom_grad_sync_loss_and_norm(loom_grad_sync *sync, double loss_sum, int micro_batches,
                                         double *loss, double *grad_norm);
/* After the update of this rank's range: under ZeRO-1 every replica gets every range back. */
loom_status loom_grad_sync_share_params(loom_grad_sync *sync);
/* Data-parallel replicas must hold bit-identical parameters, and so must the tied embedding's
 * two copies on the first and the last stage: fails (LOOM_ERR_RUNTIME, naming the replicas or
 * the copies that differ) when they do not. Collective over dp and the embedding group. */
loom_status loom_grad_sync_check_replicas(loom_grad_sync *sync);
/* Compressed buckets' encode and decode spans go to the trace (NULL: none). */
void loom_grad_sync_set_trace(loom_grad_sync *sync, loom_trace *trace);
/* End of step for the compressors (the plan's compression.dp): accept keeps the state this step
 * built (error-feedback residuals, warm-start factors), 0 (a skipped step) drops it. */
void loom_grad_sync_commit(loom_grad_sync *sync, int accept);
/* Adds this rank's compression counters since the last call to *stats and resets them. */
void loom_grad_sync_take_stats(loom_grad_sync *sync, loom_compress_stats *stats);
/* This rank's data-parallel compressors (0 when it does not compress), for checkpoints, and
 * the bytes of state they hold. */
int loom_grad_sync_compressor_count(const loom_grad_sync *sync);
loom_compressor *loom_grad_sync_compressor(loom_grad_sync *sync, int i);
size_t loom_grad_sync_state_bytes(const loom_grad_sync *sync);
/* ZeRO-2/3 compressing with error feedback: the units' residuals (the committed copies, read and
 * written by checkpoints; good until the next commit): how many, and entry i's unit index and
 * length; NULL past the end. Under ZeRO-2/3 these are the data-parallel compressor state. */
int loom_grad_sync_residual_count(const loom_grad_sync *sync);
float *loom_grad_sync_residual(loom_grad_sync *sync, int i, int *unit, size_t *floats);
/* Test hook: poisons one gradient (the first of this rank's range) with NaN. */
void loom_grad_sync_poison(loom_grad_sync *sync);

/* ---- islands: the outer optimiser (outer.c) ----------------------------------------------------
 * DiLoCo's outer step over the islands of the plan's islands section: every rank keeps its
 * data-parallel range of its stage's parameters as they were at the round's start, the outer
 * momentum and (compressed) the error-feedback residual, and averages the range's outer gradient
 * with the ranks at its place in the other islands (mesh->across). */
typedef struct loom_outer loom_outer;
typedef struct {
    int64_t bytes;     /* sent on the fragments' own copies of mesh->across (PowerSGD / top-k
                          overlapped over several fragments; the rest is mesh->across's) */
    int64_t bytes_raw; /* what fp32 ring all-reduces of the same outer gradients would send */
    int64_t syncs;     /* fragment syncs */
    double seconds;    /* spent in outer syncs (blocking: all of it waits) */
} loom_outer_stats;
/* NULL (and LOOM_OK) when the plan has no islands. The model's parameters now are the round
 * start, which must be every island's (loom_outer_check_start, run here: collective). */
loom_status loom_outer_create(loom_outer **outer, const loom_mesh *mesh, loom_gpt *model,
                              loom_grad_sync *sync);
void loom_outer_free(loom_outer *outer);
/* Fails (LOOM_ERR_RUNTIME, naming the group) when the islands' round-start parameters differ.
 * Collective over mesh->across. */
loom_status loom_outer_check_start(loom_outer *outer);
/* Whether fragment f syncs after inner step `done` (counted from 1). */
int loom_outer_due(const loom_outer *outer, int64_t done, int fragment);
/* After inner step `done`: the syncs sent overlap_steps ago are applied (land), then the
 * fragments due send theirs (send; blocking with overlap_steps 0); at the run's last step (done
 * == last_step) everything in flight is applied. loom_outer_step is both. Collective over the
 * islands and, to share a result, over the island's data-parallel group. NULL: nothing. */
loom_status loom_outer_land(loom_outer *outer, int64_t done, int64_t last_step);
loom_status loom_outer_send(loom_outer *outer, int64_t done, int64_t last_step);
loom_status loom_outer_step(loom_outer *outer, int64_t done, int64_t last_step);
/* Whether the islands meet after step `done` (between land and send): a fragment sends then,
 * or it is the last step; every step without islands (NULL). Only then is the link between
 * islands free of outer syncs for sure, so the job's other collectives (metrics, the stop
 * agreement) wait for a meeting: a small message sent while a sync is in flight queues behind
 * it. loom_outer_meeting_gap: the most steps between two meetings (1 without islands). */
int loom_outer_meets(const loom_outer *outer, int64_t done, int64_t last_step);
int loom_outer_meeting_gap(const loom_outer *outer);
/* Swaps the island's parameters with the global ones (the round starts): evaluation runs on the
 * global model between two calls. Collective over the data-parallel group. NULL: nothing. */
loom_status loom_outer_swap(loom_outer *outer);
/* Adds the counters since the last call to *stats and resets them. */
void loom_outer_take_stats(loom_outer *outer, loom_outer_stats *stats);
/* Checkpoints of island training (train/islands.c). This rank's outer state: its range of the
 * stage's flat buffer and, indexed from range.begin, the round start, the momentum and the
 * error-feedback residual (NULL without int8/bf16 outer gradients). */
typedef struct {
    loom_zero_shard range;
    float *start, *momentum, *residual;
    int fragments;
} loom_outer_buffers_view;
void loom_outer_buffers(loom_outer *outer, loom_outer_buffers_view *view);
/* Finishes the transfer of every sync in flight (overlapped syncs; its result is still applied
 * at its step, so training does not change): what a checkpoint saves. Collective over the
 * islands. */
loom_status loom_outer_settle(loom_outer *outer);
/* Fragment f's sync in flight: the step that applies it (0: none) and, over the fragment's piece
 * [*lo, *hi) of the range, its summed outer gradient and the island's parameters when it was sent
 * (after loom_outer_settle; sent NULL without overlap). */
int64_t loom_outer_in_flight(loom_outer *outer, int f, float **sum, float **sent, size_t *lo,
                             size_t *hi);
/* A resumed sync in flight: its sum and sent parameters filled in (loom_outer_in_flight's
 * pointers), applied after step apply_at (0: none). */
void loom_outer_set_in_flight(loom_outer *outer, int f, int64_t apply_at);
/* Every fragment's round restarts from its round start (the island's parameters set to it,
 * nothing in flight): a resume that cannot continue the round. Collective over the island's
 * data-parallel group. */
loom_status loom_outer_restart(loom_outer *outer);
/* Bytes of outer state this rank holds (round start, momentum, scratch, residual). */
size_t loom_outer_state_bytes(const loom_outer *outer);
/* PowerSGD / top-k outer gradients' compressors (0 without), in a fixed order: their state
 * (error feedback, warm-start factors) goes into checkpoints. */
int loom_outer_compressor_count(const loom_outer *outer);
loom_compressor *loom_outer_compressor(loom_outer *outer, int i);

/* ---- the pipeline executor ------------------------------------------------------------------
 * Runs this stage's schedule (below) for one step: micro-batches through forward and backward,
 * activations and their gradients point to point to the neighbouring stages (non-blocking sends
 * from a ring of buffers, receives where the schedule has them). With one stage it is the plain
 * gradient-accumulation loop. Every send and receive of activations or their gradients passes
 * an encode and a decode point (identity now; compression fills them in). Validation runs
 * forward-only through the same executor. */
typedef struct loom_pipeline loom_pipeline;
/* B, T: micro-batch shape; the model's activation slots are reserved here. */
loom_status loom_pipeline_create(loom_pipeline **pipe, const loom_mesh *mesh, loom_gpt *model,
                                 int B, int T);
void loom_pipeline_free(loom_pipeline *pipe);
/* Micro-batches whose activations stage `stage` of the plan holds at once (its schedule's peak),
 * for memory estimates before anything is allocated; 0 on a bad plan. */
int loom_pipeline_peak_in_flight(const loom_plan *plan, int stage);
int loom_pipeline_micro_batches(const loom_pipeline *pipe);
/* Whether this stage recomputes activations in backward (the plan's stages[].recompute). */
int loom_pipeline_recomputes(const loom_pipeline *pipe);
void loom_pipeline_set_trace(loom_pipeline *pipe, loom_trace *trace);
/* One training step's forward and backward. inputs, targets: (m, B, T) for this replica (every
 * stage passes them; the first uses the tokens, the last the targets). dloss: each token's
 * weight in the objective. sync (or NULL): its hook runs during the last micro-batch's
 * backward. *loss_sum: the sum of the micro-batches' mean losses (last stage; 0 elsewhere). */
loom_status loom_pipeline_train(loom_pipeline *pipe, const int32_t *inputs, const int32_t *targets,
                                float dloss, loom_grad_sync *sync, int64_t step, double *loss_sum);
/* Forward only, one micro-batch of b <= B sequences, stage after stage; *loss: its mean loss on
 * the last stage, 0 elsewhere. */
loom_status loom_pipeline_forward(loom_pipeline *pipe, const int32_t *inputs,
                                  const int32_t *targets, int b, double *loss);

/* End of step for the gradient compressor (lazy error residual, warm-start factor): accept
 * keeps what this step built, 0 (a skipped step) drops it. */
void loom_pipeline_commit(loom_pipeline *pipe, int accept);
/* Adds the pipeline's compression counters since the last call to *stats and resets them. */
void loom_pipeline_take_stats(loom_pipeline *pipe, loom_compress_stats *stats);
/* The compressors of the gradients this rank sends (one per chunk that compresses), in chunk
 * order, for checkpoints. */
int loom_pipeline_compressor_count(const loom_pipeline *pipe);
loom_compressor *loom_pipeline_compressor(loom_pipeline *pipe, int i);

/* ---- pipeline schedules (as data) ---------------------------------------------------------
 * p pipeline ranks, each running v model chunks ("virtual stages"; v = 1 without them), and m
 * micro-batches. The model is cut into V = p v virtual stages, 0 .. V-1, in layer order; a
 * micro-batch's forward goes through them in order and its backward in reverse. Where a
 * virtual stage lives (loom_pipe_place):
 *   gpipe, 1f1b, zb-h1  v = 1: virtual stage s on rank s.
 *   interleaved         v >= 2, Megatron's: stage s on rank s mod p, as its chunk s / p.
 *   zb-v                v = 2, a V: stages 0 .. p-1 on ranks 0 .. p-1 (chunk 0), stages
 *                       p .. 2p-1 back down on ranks p-1 .. 0 (chunk 1). Rank 0 holds the first
 *                       and the last stage, so the tied embedding's two uses are on one rank.
 * For each rank the schedule is the ordered list of actions it executes in one training step;
 * the executor walks the list. The kinds:
 *
 *   gpipe        all forwards (micro-batches 0..m-1), then all backwards, also in order 0..m-1
 *                (as Megatron does); every stage holds the activations of all m micro-batches.
 *   1f1b         PipeDream-Flush, Megatron's non-interleaved schedule: stage i runs
 *                w = min(p - i - 1, m) warm-up forwards, then alternates one forward and one
 *                backward until the forwards run out, then drains the w remaining backwards.
 *                Stage i holds at most min(p - i, m) micro-batches of activations.
 *   interleaved  Megatron's interleaved 1F1B: forwards and backwards go round the chunks in
 *                groups of p micro-batches; m must be a multiple of p. Bubble (p-1)/(v m) of
 *                1F1B's step instead of (p-1)/m, for about 1 + (p-1)/(p v) times 1F1B's
 *                activation memory on the first rank.
 *   zb-h1        zero-bubble H1 (Qi et al., ICLR'24): 1F1B with the backward split into B (the
 *                input gradient, which the previous stage waits for) and W (the weight
 *                gradients); stage i defers its first i W passes, which then fill the
 *                cool-down. Peak activations p micro-batches on every stage: 1F1B's peak (the
 *                first stage's). With F = B = W the bubble is a third of 1F1B's.
 *   zb-v         zero-bubble V: two chunks per rank in a V, split backward, built greedily
 *                (below) under 1F1B's peak memory (2p chunk activations per rank, i.e. p
 *                micro-batches of a whole stage).
 * With equal stage times and free communication, 1F1B and GPipe take 3(m + p - 1) forward
 * times (backward = 2 forwards).
 *
 * Send/receive contract for the executor. Messages go between virtual stages s and s + 1
 * (activations up, gradients down); between two stages on one rank (zb-v's turn at rank p-1)
 * there is no message and no action: the executor hands the tensor over itself. Take every
 * message between two ranks a and b (both directions, both kinds): a's list and b's list name
 * them in the SAME order (the k-th such action on a is the k-th on b, for the same micro-batch
 * and virtual stage). So
 *   - running every list with plain BLOCKING sends and receives in list order never deadlocks,
 *     even with synchronous (rendezvous) sends such as MPI_Ssend or large MPI_Send;
 *   - messages of one kind between two ranks are sent and received in the same order, so
 *     matching by (source, one tag per kind) pairs them right;
 *   - relaxing that order is safe too: sends may be non-blocking (MPI_Isend, waited for before
 *     the buffer is reused and at the latest at the end of the step), receives may be posted
 *     early (in list order), and a SEND and RECV adjacent in the list may be fused into one
 *     sendrecv, as Megatron's send_forward_recv_backward does.
 * In 1F1B's steady state a stage receives the next micro-batch's activation before sending the
 * gradient of the one it just finished (RECV_ACT k+1, then SEND_GRAD j): that keeps the two
 * ends of a link in the same order at no cost. The schedules beyond 1F1B get their order from a
 * reference run instead (loom_pipe_schedule_build): every action gets the time it has when all
 * ranks run the compute order with unit durations and free links, each message the time it is
 * sent, and each list is sorted by (time, messages before compute, the message's identity) — a
 * key both ends of a message share, so a rank blocked on a message waits for one with a smaller
 * key, and no cycle of waits can form. */

typedef enum {
    LOOM_PIPE_RECV_ACT,        /* receive micro-batch mb's input activation from stage - 1 */
    LOOM_PIPE_FORWARD,         /* forward of micro-batch mb */
    LOOM_PIPE_SEND_ACT,        /* send mb's output activation to stage + 1 */
    LOOM_PIPE_RECV_GRAD,       /* receive the gradient of mb's output from stage + 1 */
    LOOM_PIPE_BACKWARD,        /* the whole backward of mb (B then W) */
    LOOM_PIPE_SEND_GRAD,       /* send the gradient of mb's input to stage - 1 */
    LOOM_PIPE_BACKWARD_INPUT,  /* B: the gradient of mb's input, kept for W what W needs */
    LOOM_PIPE_BACKWARD_WEIGHT, /* W: mb's weight gradients, after its B; frees its activations */
} loom_pipe_op;
#define LOOM_PIPE_NUM_OPS 8

typedef struct {
    loom_pipe_op op;
    int micro_batch; /* 0 .. m-1 */
    int chunk;       /* which of the rank's chunks, 0 .. v-1 (its virtual stage: loom_pipe_stage) */
} loom_pipe_action;

typedef struct {
    loom_pipe_action *actions; /* (count,) owned; free with loom_pipe_schedule_free */
    int count;
} loom_pipe_stage_schedule;

/* One step's pipeline: the schedule, p ranks, v chunks per rank, m micro-batches. */
typedef struct {
    loom_schedule_kind kind;
    int ranks;         /* p >= 1 */
    int chunks;        /* v: 1 for gpipe, 1f1b, zb-h1; 2 for zb-v; >= 2 for interleaved */
    int micro_batches; /* m >= 1; a multiple of p for interleaved */
} loom_pipe_shape;

/* A checked plan's step as a shape: its schedule, pp ranks, virtual stages and micro-batches per
 * step. */
loom_status loom_pipe_shape_of(const loom_plan *plan, loom_pipe_shape *shape);
/* The shape's rules above (and sizes that keep every count an int), as LOOM_ERR_INPUT naming
 * the value and the rule, e.g. "interleaved needs micro-batches a multiple of the pipeline
 * ranks (4), got 6". */
loom_status loom_pipe_shape_check(const loom_pipe_shape *shape);
/* Virtual stages: p v. The virtual stage of (rank, chunk), and the rank and chunk of a virtual
 * stage (the placement above). Arguments must be in range. */
int loom_pipe_virtual_stages(const loom_pipe_shape *shape);
int loom_pipe_stage(const loom_pipe_shape *shape, int rank, int chunk);
void loom_pipe_place(const loom_pipe_shape *shape, int stage, int *rank, int *chunk);
/* The rank at the other end of a communication action of (rank, chunk) (SEND_ACT/RECV_GRAD: the
 * next virtual stage's, RECV_ACT/SEND_GRAD: the previous one's); -1 when there is none (the end
 * of the pipeline) or the action is not a message. */
int loom_pipe_peer(const loom_pipe_shape *shape, int rank, loom_pipe_action action);

/* Fills rank `rank`'s list (0 <= rank < p) for a checked shape. The first virtual stage has no
 * RECV_ACT/SEND_GRAD, the last none of SEND_ACT/RECV_GRAD, and a hand-over inside a rank none;
 * gpipe, 1f1b and interleaved use BACKWARD, zb-h1 and zb-v BACKWARD_INPUT and
 * BACKWARD_WEIGHT. Bad arguments give LOOM_ERR_INPUT naming the value; *out is then empty. */
loom_status loom_pipe_schedule_build(const loom_pipe_shape *shape, int rank,
                                     loom_pipe_stage_schedule *out);
/* Every rank's list at once (out: shape->ranks lists), from one reference run: what a caller that
 * needs them all (the simulator's users) should call. On failure every list is empty. */
loom_status loom_pipe_schedule_build_all(const loom_pipe_shape *shape,
                                         loom_pipe_stage_schedule *out);
/* The same for v = 1 kinds (gpipe, 1f1b, zb-h1) and zb-v (v = 2), with stage = rank. */
loom_status loom_pipe_schedule(loom_schedule_kind kind, int stages, int micro_batches, int stage,
                               loom_pipe_stage_schedule *out);
void loom_pipe_schedule_free(loom_pipe_stage_schedule *s);

/* "recv_act", "forward", ... for traces and messages ("?" for a value out of range). */
const char *loom_pipe_op_name(loom_pipe_op op);

/* The largest number of chunk activations the rank holds at once (a FORWARD done, its
 * BACKWARD or BACKWARD_WEIGHT not yet): the activation sets it must plan for. With one chunk,
 * micro-batches in flight. */
int loom_pipe_peak_in_flight(const loom_pipe_stage_schedule *s);

/* Optimus-CC's epilogue: the gradient sends of a rank's cool-down, the SEND_GRADs after its
 * last FORWARD (under 1F1B the drain's, which nothing else overlaps; under GPipe all of them).
 * cooldown (chunks x micro_batches): cooldown[chunk * micro_batches + mb] = 1 for the sends that
 * are. Returns how many there are. */
int loom_pipe_cooldown_sends(const loom_pipe_stage_schedule *s, int chunks, int micro_batches,
                             unsigned char *cooldown);

/* ---- schedule simulator --------------------------------------------------------------------
 * Times one training step of p ranks running their schedules together, as the pipeline
 * executor runs them, from how long each piece takes. The planner uses it to predict a step;
 * the compression policy uses the slack to see which messages are worth compressing.
 *
 * Semantics. Each rank walks its list in order, all starting at time 0.
 *   FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT
 *                      take the virtual stage's forward_s, backward_s, backward_input_s,
 *                      backward_weight_s (one micro-batch).
 *   SEND_ACT/SEND_GRAD are non-blocking and take no time on the sender; the message arrives at
 *                      send time + the boundary's transfer time (act_link_s for activations
 *                      going up, grad_link_s for gradients coming down; they may differ, e.g.
 *                      when only one direction is compressed).
 *   RECV_ACT/RECV_GRAD block until the matching message has arrived; the action starts when
 *                      the rank reaches it and ends when the message is in hand, plus the
 *                      boundary's receive time (act_recv_s, grad_recv_s: work the receiver
 *                      does once the message is there, e.g. gathering a scattered message).
 * Matching: the k-th send of one kind from rank a to rank b pairs with the k-th receive of that
 * kind on b from a (MPI's order for one source and tag); by the schedule contract above both
 * are the same micro-batch and boundary, and a pair that is not is an error. A send without a
 * receive is an error too, and a schedule that cannot finish (receives waiting on sends that
 * come after them) is reported as a deadlock naming the stuck ranks and actions; the simulator
 * never loops. A hand-over inside a rank is its list's order: no time, no message.
 *
 * Slack is the critical-path analysis of the step as a graph: one node per action, edges from
 * each action to the next on its rank (weighted by the next one's duration) and from each send
 * to its receive (weighted by the link time). Earliest times come from running the step as
 * above; latest allowed times from a backward pass from the makespan. A message's slack is its
 * latest allowed arrival (its receive's latest end) minus its arrival: how much later it could
 * arrive without delaying the step. An action's slack is the same for its end.
 *
 * Not modelled: a send's cost on the sender (encoding, copies), link contention between
 * messages, recomputation (fold it into backward_s), the data-parallel gradient sync and the
 * optimizer after the pipeline. */

/* How long things take, in seconds: finite and >= 0, per VIRTUAL stage (p entries without
 * chunks). The lengths are stated so that they can be checked against the schedules. */
typedef struct {
    int stages;                /* V = p v: entries of the compute arrays */
    int links;                 /* V - 1: entries of act_link_s and grad_link_s */
    const double *forward_s;   /* (stages,) one micro-batch's forward on each virtual stage */
    const double *backward_s;  /* (stages,) its whole backward (BACKWARD) */
    const double *act_link_s;  /* (links,) [s]: activation from stage s to s + 1, send to arrival
                                  (unused where both are on one rank); NULL when links is 0 */
    const double *grad_link_s; /* (links,) [s]: gradient from stage s + 1 to s; NULL when 0 */
    const double *backward_input_s;  /* (stages,) B; NULL when no list has BACKWARD_INPUT */
    const double *backward_weight_s; /* (stages,) W; NULL when no list has BACKWARD_WEIGHT */
    /* (stages x micro_batches) or NULL: [v * micro_batches + mb] the transfer of the gradient
     * virtual stage v sends back for micro-batch mb, in place of grad_link_s[v - 1] (a policy
     * that compresses some sends of a boundary and not others); row 0 is not read */
    const double *grad_link_mb_s;
    /* (links,) or NULL (none): [s] the receiver's own time for a message across boundary s
     * once it has arrived (activations received by stage s + 1, gradients by stage s) */
    const double *act_recv_s;
    const double *grad_recv_s;
} loom_pipe_sim_times;

typedef struct {
    double start_s, end_s; /* when the rank reached the action; when it finished it (for a
                              receive: when the message was in hand; for a send: start_s) */
    double slack_s;        /* how much later the action could end without delaying the step */
    int critical;          /* 1 when slack_s is zero (up to LOOM_PIPE_SIM_TOLERANCE) */
    /* sends only (0 for other actions): */
    double arrival_s;       /* when the message reaches the receiving rank */
    double message_slack_s; /* how much later it could arrive without delaying the step */
} loom_pipe_sim_action;

/* Slack at most this fraction of the makespan counts as zero (rounding in the backward pass). */
#define LOOM_PIPE_SIM_TOLERANCE 1e-9

typedef struct {
    int ranks;                    /* p */
    loom_pipe_sim_action **stage; /* (p,) stage[r][i]: action i of rank r's schedule */
    loom_pipe_sim_action *memory; /* (total actions,) what stage[] points into */
    double makespan_s;            /* when the last action of any rank ends */
} loom_pipe_sim_result;

/* Simulates the p = shape->ranks schedules (schedules[r] is rank r's list) with `times`. Bad
 * arguments (NULL, a bad shape, lengths in times that do not match, a negative or non-finite
 * time, an action out of range or across the end of the pipeline, unmatched or mismatched
 * messages, deadlock) give LOOM_ERR_INPUT naming the value; *out is then empty. Free the result
 * with loom_pipe_sim_result_free. */
loom_status loom_pipe_simulate(const loom_pipe_shape *shape,
                               const loom_pipe_stage_schedule *schedules,
                               const loom_pipe_sim_times *times, loom_pipe_sim_result *out);
void loom_pipe_sim_result_free(loom_pipe_sim_result *result);

/* The "slack" pipeline compression policy (ours): simulates the step with every gradient sent
 * uncompressed (times: grad_link_s the uncompressed transfer), then compresses exactly the
 * gradient sends whose message slack is smaller than the time compressing saves on their
 * boundary (saving_s[s], boundary s from virtual stage s + 1 to s: uncompressed transfer minus
 * compressed transfer, encoding and decoding); none on a boundary whose saving is not positive.
 * compress (V x micro_batches): compress[stage * micro_batches + mb] = 1 when virtual stage
 * `stage` compresses mb's gradient send (row 0 stays 0: the first stage sends none). Errors are
 * the simulator's. */
loom_status loom_pipe_slack_choose(const loom_pipe_shape *shape,
                                   const loom_pipe_stage_schedule *schedules,
                                   const loom_pipe_sim_times *times, const double *saving_s,
                                   unsigned char *compress);

/* ---- memory (memory.c) ---------------------------------------------------------------------
 * What one rank holds, in bytes, as the runtime allocates it: `loom train` checks it before
 * allocating (train/memory.c) and the planner's cost model charges it. */
typedef struct {
    int64_t weights, grads, optimizer; /* this rank's shard under the plan's ZeRO stage: AdamW's
                                          m and v from stage 1, gradients from 2, parameters
                                          from 3 (divided by dp) */
    int64_t gathered;                  /* ZeRO-3: units' parameters gathered whole for use
                                          (zero3_prefetch + 1 units, or every unit when gathered
                                          once per step) */
    int64_t activations;               /* the schedule's peak of activation sets (and kept
                                          inputs and W state with recomputation) */
    int64_t scratch;                   /* backward scratch; with ZeRO-1 the reduce-scatter
                                          ring's receive buffers (one gradient's worth); from
                                          ZeRO-2 the unit-sized gradient buckets in flight */
    int64_t compressor;                /* compressors' state (error feedback, lazy error,
                                          warm-start factors), both copies */
    int64_t outer;                     /* islands: the outer optimiser's state on this rank's
                                          range (round starts, momentum, scratch; int8/bf16's
                                          residual; with overlap the sent copy; PowerSGD's) */
    int64_t total;
    int in_flight; /* the schedule's peak of chunk activation sets */
} loom_rank_memory;

/* Pipeline rank pp_rank's memory (any TP rank: they are alike) for sequences of seq_len tokens;
 * the plan's ZeRO stage says what is sharded over its dp. Errors are the cost facts'. */
loom_status loom_plan_rank_memory(const loom_plan *plan, int pp_rank, int seq_len,
                                  loom_rank_memory *out);

/* loom_plan_rank_memory with the schedule's peak of activation sets given (the planner's
 * simulator knows it without building the rank's list again). */
loom_status loom_plan_rank_memory_at(const loom_plan *plan, int pp_rank, int seq_len,
                                     int peak_in_flight, loom_rank_memory *out);
/* Why a rank's memory does not fit a device of device_bytes: by how much, its two largest
 * categories (and whether the largest alone exceeds the device), as one phrase in text;
 * returns 0 (text "") when it fits. */
int loom_rank_memory_why(const loom_rank_memory *m, int64_t device_bytes, char *text, size_t cap);
/* ZeRO-2/3's units on pipeline rank pp_rank (fp32 bytes, this TP rank's shard, before DP
 * sharding): the two held whole for the step (everything before the first block, everything
 * after the last), their reduce-scatter rings' receive buffers, one block's, the rank's blocks
 * and its largest chunk's. */
typedef struct {
    int64_t held, held_ring, block;
    int blocks, chunk_blocks;
} loom_zero_units;
loom_zero_units loom_plan_zero_units(const loom_plan *plan, int pp_rank);
/* Virtual stage s's cost facts for one micro-batch (one activation set); _as under another
 * recomputation mode than the stage's (LOOM_RECOMPUTE_*). */
loom_status loom_plan_stage_cost(const loom_plan *plan, int s, int seq_len,
                                 loom_gpt_stage_cost *out);
loom_status loom_plan_stage_cost_as(const loom_plan *plan, int s, int seq_len, int recompute,
                                    loom_gpt_stage_cost *out);
/* Wire bytes of one (rows x cols) matrix under `method` with the compressor's rank, fraction
 * and error feedback, by loom/compress.h's formulas; *state gets the bytes of state it keeps
 * (committed and working copies: the error-feedback residual, the warm-start factor). */
double loom_plan_compressor_wire(const loom_plan_compressor *compressor,
                                 loom_compress_method method, int64_t rows, int64_t cols,
                                 double *state);
/* One pipeline rank's gradients under the plan's DP compressor, as the gradient sync's buckets
 * hand them to it: the bytes sent (wire), the fp32 bytes the codec reads (raw: the compressing
 * matrices) and the state kept. */
typedef struct {
    double wire, raw, state;
} loom_dp_traffic;
loom_dp_traffic loom_plan_dp_traffic(const loom_plan *plan, int pp_rank);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PARALLEL_H */
