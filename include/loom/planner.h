/*
 * loom/planner.h — the planner: what a plan costs (the cost model), the search over layouts with
 * Alpa's stage DP, and Alpa's intra-operator ILP (below). Above parallel/, whose schedule
 * simulator and memory figure it uses; nothing in the runtime includes it.
 *
 * The cost model: what a plan costs on a cluster, per rank and per
 * step, without running it. Memory per rank is what the runtime allocates (the same function
 * `loom train` checks memory with); time comes from the model's cost facts (FLOPs, bytes,
 * tensor-parallel traffic per virtual stage) turned into seconds by the cluster description
 * (GEMM efficiency, memory bandwidth, link classes, collective fits), the pipeline step from the
 * same schedule the executor runs, in the schedule simulator.
 *
 * Placement: ranks in the plan's (Megatron) order fill the nodes in turn, devices_per_node each;
 * a group (TP, DP, the pipeline's neighbours) whose ranks share a node uses the intra-node link
 * class, otherwise the inter-node one.
 *
 * Time of one virtual stage and micro-batch:
 *   compute    each part's GEMM FLOPs at the cluster's peak x GEMM efficiency (the efficiency
 *              of a block's typical GEMM: its forward FLOPs over its four GEMMs), plus the
 *              memory-bound work (the activation bytes the part writes, read and written once
 *              more, at the memory bandwidth);
 *   TP         the stage's allreduces (count and payload) on the TP group's link class.
 * B (input gradient) and W (weight gradient) are costed apart, for the zero-bubble schedules;
 * a whole backward is their sum (with recomputation, plus a forward; B and W each one more).
 * Step = the simulated pipeline step (links: one activation of B x T x C per message on the
 * link class of the two ranks) + the data-parallel sync not hidden behind the last backward
 * (an allreduce of the rank's gradients, or ZeRO-1's reduce-scatter + all-gather, on the DP
 * group's link class) + the tied embedding's sum between the ranks of the first and the last
 * virtual stage (on the pipeline's link class; none when one rank holds both) + the AdamW update
 * (the cluster's measured parameters per second, else 28 bytes of traffic per parameter at the
 * memory bandwidth) and the passes over the gradients around it at the memory bandwidth (zeroing
 * the rank's gradient buffer, reading its range for the norm).
 *
 * Compression (the plan's compression.dp and .pp): a compressing matrix sends the wire of
 * loom/compress.h's formulas (PowerSGD's factors allreduced; top-k, sign, int8 and bf16
 * all-gathered, every replica's part decoded), the codec runs at the cluster's measured
 * throughput (else three passes at the memory bandwidth) and is never hidden (it computes);
 * a compressed pipeline link's backward message is the compressor's wire plus its codec (on a
 * link whose wire is not smaller than the message, sent as it is, as the executor does); the
 * compressors' state (both copies) counts in memory. Which backward sends compress is decided
 * per message, as the executor decides it under the plan's policy: every send of a listed link
 * ("all"), each rank's cool-down sends (loom_pipe_cooldown_sends: "epilogue"), or the sends
 * whose slack in the step simulated without compression is below what compressing saves on
 * their link (loom_pipe_slack_choose: "slack"); the simulator then takes each send's own
 * transfer time. Bytes sent by a collective are loom_cluster_ring_bytes of its buffer.
 *
 * Not modelled (yet): overlap of TP collectives with compute, contention between groups on one
 * link, what compression does to the loss (the search uses it only when allowed).
 */
#ifndef LOOM_PLANNER_H
#define LOOM_PLANNER_H

#include "loom/base.h"
#include "loom/cluster.h"
#include "loom/model.h"
#include "loom/parallel.h"
#include "loom/plan.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The link class of a group of world ranks placed as above: LOOM_LINK_INTRA_NODE when they all
 * share a node, else LOOM_LINK_INTER_NODE. */
int loom_plan_group_link(const loom_cluster *cluster, const int *ranks, int n);
/* The slowest link class any of the plan's data-parallel groups uses. */
int loom_plan_dp_link(const loom_plan *plan, const loom_cluster *cluster);

/* One virtual stage's times for one micro-batch. */
typedef struct {
    double forward_s, backward_input_s, backward_weight_s, backward_s;
    double tp_forward_s, tp_backward_s; /* included above */
    double rerun_s;       /* full recomputation's rerun forward, included in each backward part
                             above (the schedule decides which micro-batches need it) */
    double zero_gather_s; /* ZeRO-3's gathers not hidden by prefetch, included above */
} loom_stage_times;

/* Islands' outer syncs (outer_cost.c): the slowest fragment's sync (seconds), one rank's syncs of
 * every fragment once (total_s, the slowest pipeline rank's), what a step carries of them on
 * average (exposed_s: each sync's time that overlap_steps inner steps do not cover, and the
 * outer step's passes over the range, divided by inner_steps), and the bytes the whole job sends
 * between islands per step on average. */
#define LOOM_PLAN_MAX_FRAGMENTS 1024
typedef struct {
    double sync_s, total_s, exposed_s;
    int64_t bytes;
} loom_outer_cost;
/* The outer syncs of a plan with islands (all zero without) on `cluster`'s island link (else
 * inter_node), for inner steps of inner_step_s. */
loom_status loom_plan_outer_cost(const loom_plan *plan, const loom_cluster *cluster,
                                 double inner_step_s, loom_outer_cost *out);

/* The planner's choice for a plan with islands (its count and outer compression set, its inner
 * layout planned): the smallest H <= max_inner_steps for which some fragments F and overlap tau
 * hide every fragment's sync behind tau inner steps of inner_step_s (tau <= floor(H / F), so that
 * a round's F syncs never share the link, and tau <= H - 1), and among those the fewest steps
 * behind, then the fewest fragments (hidden 1); when none hides within the bound, H =
 * max_inner_steps with the F and tau of the least exposed time (hidden 0). Every F from 1 to the
 * layers and H is tried; the plan's islands section is set to the choice; cost is its price.
 * PowerSGD outer gradients (one fragment, no overlap) are refused by name. */
typedef struct {
    int inner_steps, fragments, overlap_steps;
    int hidden;
    loom_outer_cost cost;
} loom_islands_choice;
loom_status loom_plan_choose_islands(loom_plan *plan, const loom_cluster *cluster,
                                     double inner_step_s, int max_inner_steps,
                                     loom_islands_choice *out);

#define LOOM_PREDICT_MAX_STAGES 256
typedef struct {
    double step_s, tokens_per_s;
    double pipeline_s;                    /* the simulated pipeline part */
    double dp_exposed_s, optimizer_s;     /* after it (optimizer_s: AdamW + gradient passes) */
    double bubble;                        /* share of the pipeline part ranks idle (mean) */
    int64_t peak_bytes;                   /* the largest rank's memory */
    int64_t dp_bytes, tp_bytes, pp_bytes; /* per step, summed over every rank */
    loom_outer_cost outer;                /* islands: their outer syncs (in step_s: exposed_s) */
    loom_stage_times stage[LOOM_PREDICT_MAX_STAGES]; /* per virtual stage */
    int stages;
} loom_prediction;

/* Predicts a checked plan on `cluster` (which must have at least dp x tp x pp devices in
 * max_nodes x devices_per_node; a plan that needs more is LOOM_ERR_INPUT naming the numbers)
 * in `precision` (a precision the cluster has no peak for is LOOM_ERR_INPUT). */
loom_status loom_plan_predict(const loom_plan *plan, const loom_cluster *cluster,
                              loom_precision precision, int seq_len, loom_prediction *out);

/* The pipeline rank with the most memory (*rank, its categories in *out) under the plan's
 * schedule: loom_plan_predict's peak_bytes without simulating, so that a plan that cannot fit
 * is known before its step is. Errors are the cost facts'. */
loom_status loom_plan_peak_memory(const loom_plan *plan, int seq_len, int *rank,
                                  loom_rank_memory *out);

/* A lower bound on loom_plan_predict's step for the plan, without simulating: the busiest
 * pipeline rank's compute, every micro-batch's forward and backward on each of its virtual
 * stages (no recomputation, bubble, communication or optimizer). *mean_s (when not NULL) gets
 * the mean rank's, a bound for every split of the same layers over the same ranks (the layers
 * are identical, so the total does not depend on the split). The search skips layouts, and
 * stage DPs, whose bound cannot beat the plans it keeps. Errors as loom_plan_predict's, the
 * bounds then 0. */
loom_status loom_plan_step_bound(const loom_plan *plan, const loom_cluster *cluster,
                                 loom_precision precision, int seq_len, double *bound_s,
                                 double *mean_s);

/* loom_plan_predict, and the simulated step written to `path` as a Chrome trace in the format
 * of `loom train --trace` (loom/trace.h): a process per pipeline rank (the ranks of one DP or TP
 * group are alike), its compute and pp streams from the schedule simulator (micro-batch and
 * virtual stage in each event's args), then the DP sync its last backward did not hide and the
 * optimizer. */
loom_status loom_plan_predict_trace(const loom_plan *plan, const loom_cluster *cluster,
                                    loom_precision precision, int seq_len, const char *path,
                                    loom_prediction *out);

/* ---- Alpa's stage DP ------------------------------------------------------------------------
 * How many layers each of the S stages of a layout with one chunk per rank takes (stages may be
 * uneven: the LM head makes the last stage heavier). Identical layers make a stage's time and
 * memory a function of its class (first: the embedding; middle; last: the head; only: both) and
 * its layer count alone, so each is costed once. The objective is Alpa's closed-form pipeline
 * latency T = sum_i t_i + (B - 1) max_j t_j (t: a micro-batch's forward and backward on the
 * stage; B micro-batches), with every stage's memory within the device's. */
typedef enum {
    LOOM_STAGE_FIRST,
    LOOM_STAGE_MIDDLE,
    LOOM_STAGE_LAST,
    LOOM_STAGE_ONLY,
    LOOM_STAGE_CLASSES
} loom_stage_class;

typedef struct {
    int stages, layers, micro_batches;
    int options; /* 1; or 3: each stage may also recompute fully (option 1) or selectively
                    (option 2), chosen per stage (loom_stage_option_recompute) */
    /* indexed [(option * LOOM_STAGE_CLASSES + class) * (layers + 1) + n], n = 1 .. layers
     * layers; a class/count that cannot exist (a middle stage of all layers) has time INFINITY */
    double *time;         /* seconds: forward + backward of one micro-batch */
    int64_t *memory;      /* bytes with no activation set in flight */
    int64_t *per_flight;  /* bytes each activation set in flight adds */
    int *in_flight;       /* (stages) the schedule's peak of activation sets per stage */
    int64_t memory_bytes; /* per rank; <= 0: no limit */
} loom_stage_problem;

/* The plan's LOOM_RECOMPUTE_* of a stage DP option: 0 none, 1 as needed, 2 selective. */
int loom_stage_option_recompute(int option);
/* The class of stage i of S. */
loom_stage_class loom_stage_class_of(int stage, int stages);
/* T for `counts` (S positive layer counts summing to the layers) with each stage's option
 * (`recompute`, S entries of 0 or 1 below p->options; NULL: all 0), INFINITY when a stage does
 * not fit its memory or the counts are not such a split. */
double loom_stage_latency(const loom_stage_problem *p, const int *counts, const int *recompute);
/* The split minimising T (ties: the first found), and each stage's option (`recompute`, may be
 * NULL when options is 1: for a stage of a given size under a given bound the fastest option
 * that fits is the best, so the DP picks it per transition), by Alpa's DP: for each candidate
 * t_max in ascending order, the least sum of stage times with every stage <= t_max, stopping
 * once the least unconstrained sum + (B - 1) t_max reaches the best T. *candidates counts the
 * t_max tried (may be NULL). No split that fits is LOOM_ERR_INPUT. */
loom_status loom_stage_dp(const loom_stage_problem *p, int *counts, int *recompute, double *latency,
                          int *candidates);

/* The problem for a checked plan (its stages' own split and recomputation are not used), costed
 * as loom_plan_predict costs stages; per_stage_recompute: three options per stage (none, full,
 * selective), else the plan's own (stage 0's) for all. With several chunks per rank (interleaved,
 * zb-v) the stages are the virtual stages and the DP is a heuristic: Alpa's closed form does not
 * describe chunked ranks, a rank's chunks must agree on recomputation (one option only) and share
 * its memory (no memory limit here: loom_plan_predict checks the result). Free with
 * loom_stage_problem_free. */
loom_status loom_plan_stage_problem(const loom_plan *plan, const loom_cluster *cluster,
                                    loom_precision precision, int seq_len, int per_stage_recompute,
                                    loom_stage_problem *out);
void loom_stage_problem_free(loom_stage_problem *p);

/* ---- the search ------------------------------------------------------------------------------
 * The planner's search: every layout of `devices` devices for the model and global batch —
 * tp dividing the heads and the padded vocabulary, pp up to the layers, dp the rest; every micro
 * batch that divides the replica's share; the schedules 1f1b, interleaved (v 2, when the
 * micro-batches are a multiple of pp), zb-h1 and zb-v (pp > 1); with and without recomputation
 * and (dp > 1) ZeRO-1; stages as even as possible and, for 1f1b and zb-h1, also split by the
 * stage DP (loom_stage_dp: uneven stages, memory-aware) — each predicted by loom_plan_predict,
 * those that do not fit the device's memory left out, ranked by predicted step time (the
 * simulator ranks the DP's split against the even one). */
typedef struct {
    loom_plan plan; /* owned: free with loom_plan_free; its zero says ZeRO-1 or not */
    loom_prediction prediction;
} loom_plan_candidate;

typedef struct {
    int devices;      /* how many to use, at most the cluster's */
    int global_batch; /* sequences per step */
    int seq_len;
    loom_precision precision;
    int keep;              /* how many of the best to return (>= 1) */
    int even_stages;       /* 1: stages as even as possible only (no stage DP) */
    int allow_compression; /* LOOM_ALLOW_* bits: compressors the search may choose (0: none) */
} loom_search_request;
enum { LOOM_ALLOW_DP_COMPRESSION = 1, LOOM_ALLOW_PP_COMPRESSION = 2 };

/* The search's bounds, so that its time and memory are set by the layouts, not by the sizes: at
 * most LOOM_SEARCH_MAX_DEVICES devices and a global batch of at most LOOM_SEARCH_MAX_GLOBAL_BATCH
 * sequences (larger requests are refused by name); the micro-batch sizes tried are the powers of
 * two that divide a replica's batch, and one with more than LOOM_SEARCH_MAX_MICRO_BATCHES
 * micro-batches per step is not simulated (the simulator's work grows with them). */
#define LOOM_SEARCH_MAX_DEVICES       (1 << 20)
#define LOOM_SEARCH_MAX_GLOBAL_BATCH  (1 << 20)
#define LOOM_SEARCH_MAX_MICRO_BATCHES 16384

/* Fills best[0 .. *found) (at most request->keep, fastest first); *tried and *fitting count the
 * plans predicted and those that fit, *pruned (when not NULL) the plans not simulated because
 * their compute alone (loom_plan_step_bound) could not beat the ones kept. A request outside the
 * bounds above, or a precision the cluster has no peak for, is LOOM_ERR_INPUT naming the field.
 * No layout that fits is LOOM_ERR_INPUT saying why: no split of the devices that the model's
 * heads and layers and the batch allow, too many micro-batches, the cost model's refusal, or the
 * smallest memory shortfall per rank. */
loom_status loom_plan_search(const loom_gpt_config *model, const loom_cluster *cluster,
                             const loom_search_request *request, loom_plan_candidate *best,
                             int *found, int *tried, int *fitting, int *pruned);

/* ---- Alpa's intra-operator pass ----------------------------------------------------------
 * which sharding strategy each operator of a GPT-2
 * training step takes on a 2-D logical mesh (dp, tp), chosen by an integer linear program
 * solved with GLPK.
 *
 * The graph. One transformer block (input, ln_1, c_attn, attention, attn c_proj, residual add,
 * ln_2, c_fc, gelu, MLP c_proj, residual add; the block's output feeds the next block's input)
 * and the embedding and head (wte gather + wpe, ln_f, the tied LM head x wte^T, softmax
 * cross-entropy over the padded vocabulary). The mesh runs dp x micro_batch sequences of seq_len
 * tokens at once (micro_batch is per data-parallel replica, as in a plan). An operator's costs
 * cover a training step: forward and backward of every micro-batch, and the weight-gradient sync
 * once per step, folded into the operator as Alpa does.
 *
 * Strategies. Mesh axis 0 has dp devices, axis 1 tp; a device's rank is dp_rank x tp + tp_rank,
 * so an axis-1 group is tp consecutive ranks (inside a node when they fit) and axis 0 strides
 * across (loom_plan_group_link picks each axis's link class). Each axis of size > 1 splits one
 * dimension of the operator or replicates it: a matmul Y[m,n] = X[m,k] W[k,n] splits tokens (m),
 * the contraction (k: partial sums, reduced by an allreduce or a reduce-scatter onto the tokens or
 * the columns) or the output columns (n); attention splits sequences or heads; the embedding
 * tokens, vocabulary rows (partial sums, allreduced) or channels; light operators (LayerNorm,
 * add, gelu, cross-entropy) the tokens or the hidden (vocabulary) columns; a k split's
 * reduce-scatter onto the tokens also ends the embedding's vocabulary split. Both axes may split
 * one dimension. A split must divide its dimension: attention's, the matmuls' and the
 * embedding's split of the tokens by whole sequences; the light operators and the activations
 * between operators by tokens (a sequence's rows over tp: Megatron's sequence parallelism).
 * Per strategy:
 *   compute   a matmul's forward, input-gradient and weight-gradient GEMMs on the device's
 *             shard (loom_cluster_gemm_s: peak x the GEMM efficiency of the shard's FLOPs);
 *             attention's per-head GEMMs likewise; light operators as memory traffic (their
 *             elements streamed a few times) at the memory bandwidth;
 *   comm      the collectives inside the operator, forward and backward: a k split's allreduce
 *             of the output (or reduce-scatter, and the all-gather of its gradient in backward),
 *             an n split's allreduce of the input gradient, a LayerNorm over split columns its
 *             statistics, a vocabulary-parallel cross-entropy its max and sums;
 *   sync      the weight's traffic: its fp32 gradient allreduced once per step over every axis
 *             that splits the tokens (the weight is replicated there) — or, over dp, ZeRO's
 *             (below);
 *   state     bytes per device of parameters, gradients and AdamW's two moments (16 per fp32
 *             parameter, as loom holds them; ZeRO divides some by dp); the tied wte counts with
 *             the embedding only.
 * ZeRO (Rajbhandari et al.). An operator with weights whose tokens are split over dp offers four
 * variants, the stage z of sharding its state over dp (p parameters of the device's shard, n =
 * dp, m micro-batches; RS reduce-scatter, AG all-gather, of 4p bytes over dp):
 *   z 0  state 16p,          sync an allreduce once per step;
 *   z 1  state (8 + 8/n)p,   sync RS + AG once per step (AdamW's moments sharded);
 *   z 2  state (4 + 12/n)p,  sync m RS + AG (the gradient too: each micro-batch's
 * reduce-scattered); z 3  state 16p/n,        sync m (RS + 2 AG): the weight gathered whole before
 * every micro-batch's forward and backward (the runtime's "micro_batch" gathering; gathering once
 * per step is z 2's state and traffic here). Gathered buffers and gradient buckets are scratch, not
 * state (as activations, not modelled). Resharding on an edge (producer's output layout to the
 * consumer's input layout), per mesh axis on its own: equal, nothing; a split to replicated or
 * back, one all-gather (forward, or of the gradient in backward: the other direction is a free
 * slice); rows to columns or back, an all-to-all each way (costed as an all-gather of 1/n of the
 * bytes: the same traffic). Collective times are loom_cluster_collective_s (allreduce a + b
 * 2(n-1)/n B, all-gather and reduce-scatter a + b (n-1)/n B per ring). Activations move in the
 * precision's bytes (4 for fp32, else 2).
 *
 * Search spaces. LOOM_INTRAOP_RUNTIME offers only what loom's runtime executes for (dp, tp), in
 * each of its configurations: a ZeRO stage 0-3 and sequence parallelism on or off, each for the
 * whole model (plan keys "zero" and "sequence_parallel"). Over dp the tokens are split, and the
 * weights' state sharded as the ZeRO stage says — the blocks' at that stage; the embedding's and
 * ln_f's at most at stage 1 (under ZeRO-2/3 the runtime holds those units whole for the step:
 * ZeRO-1's state and traffic). Over tp Megatron's tensor parallelism: c_attn and c_fc
 * column-parallel, both c_proj row-parallel, attention by heads, the embedding, the LM head and
 * cross-entropy vocabulary-parallel, gelu following c_fc's columns; without sequence
 * parallelism the row-parallel layers and the embedding allreduce and the residual stream, its
 * LayerNorms and adds are replicated over tp; with it they reduce-scatter onto the tokens, the
 * residual stream, LayerNorms and adds are split by tokens over tp, and the column-parallel
 * layers and the LM head all-gather their input (the edge's resharding). The ILP picks one
 * configuration for the whole graph (below), so the answer always runs. LOOM_INTRAOP_FULL offers
 * every strategy, the runtime's among them, and lets each operator pick its own; what it gains
 * over the runtime space is simulation only, and loom_intraop_unfollowed says where.
 *
 * The ILP (REFERENCE.md, Alpa): a binary s_v,i per operator v and strategy i, sum_i s_v,i = 1;
 * per edge (u, v) variables e_uv,ij in [0, 1] with sum_j e_uv,ij = s_u,i and
 * sum_i e_uv,ij = s_v,j (with s integral these force e = s_u s_v^T, so e need not be declared
 * integral: the solver branches on s only); minimise sum count_v (compute + comm + sync) s +
 * sum count_uv reshard e; optionally sum count_v state s <= the memory budget. An edge's
 * variables pair classes of strategies rather than strategies: those of an operator whose
 * resharding costs on the edge are alike (an activation edge's: one output or input layout) share
 * one class indicator, the sum of their s, which keeps the program small however many variants
 * (ZeRO stages) an operator offers. The runtime space adds a binary y_c per runtime
 * configuration c, sum_c y_c = 1, and s_v,i <= sum of y_c over the configurations that run
 * strategy i.
 *
 * Not modelled: activation memory (the budget covers parameters, gradients and AdamW state; so
 * sequence parallelism's saving does not show), the order of two axes splitting one dimension,
 * overlap of communication with compute (ZeRO-3's prefetch), a collective per operator where the
 * runtime gathers and reduce-scatters a block's weights in one, a tied wte held in two layouts
 * (the head uses the embedding's copy at no cost).
 */

typedef enum { LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_FULL } loom_intraop_space;
/* "runtime", "full"; anything else is LOOM_ERR_INPUT naming `source` and `field`. */
loom_status loom_intraop_space_parse(const char *name, const char *source, const char *field,
                                     loom_intraop_space *space);

/* Which part of the model the graph holds. */
typedef enum {
    LOOM_INTRAOP_MODEL,          /* every block (one block's operators, count L) and the
                                    embedding and head around them */
    LOOM_INTRAOP_BLOCK,          /* one block, its output feeding its own input */
    LOOM_INTRAOP_EMBEDDING_HEAD, /* the embedding's output straight into ln_f */
} loom_intraop_part;

/* What a mesh axis does to an operator. */
typedef enum {
    LOOM_INTRAOP_REPLICATE, /* every device of the axis does the whole operator */
    LOOM_INTRAOP_TOKENS,    /* splits the sequences */
    LOOM_INTRAOP_K,         /* splits a contracted dimension (matmul k, the embedding's
                               vocabulary rows): partial sums, reduced as `reduce` says */
    LOOM_INTRAOP_N,         /* splits the columns (matmul n, heads, channels, hidden,
                               vocabulary of the logits) */
} loom_intraop_split;

typedef enum {
    LOOM_INTRAOP_ALLREDUCE,      /* output replicated over the axis */
    LOOM_INTRAOP_SCATTER_TOKENS, /* reduce-scatter: output split by tokens over the axis */
    LOOM_INTRAOP_SCATTER_N,      /* reduce-scatter: output split by columns over the axis */
} loom_intraop_reduce;

/* A 2-D activation's layout: per mesh axis, replicated, rows (tokens) or columns split. */
enum { LOOM_INTRAOP_REPL, LOOM_INTRAOP_ROWS, LOOM_INTRAOP_COLS };
typedef struct {
    int8_t axis[2];
} loom_intraop_layout;

typedef struct {
    char name[96];                 /* e.g. "column: n over tp, tokens over dp" */
    loom_intraop_split split[2];   /* per mesh axis (0: dp, 1: tp) */
    loom_intraop_reduce reduce[2]; /* for LOOM_INTRAOP_K */
    loom_intraop_layout in, out;   /* of the activation operand(s), of the output */
    double compute_s, comm_s;      /* per step: every micro-batch's forward and backward */
    double sync_s;                 /* per step: the weight's gradient sync (ZeRO: and gathers) */
    int64_t state_bytes;           /* per device: parameters, gradients, AdamW moments */
    int zero;                      /* ZeRO stage of its weight's state over dp (0-3); 0 without
                                      weights or without tokens split over dp */
    unsigned runtime;              /* the runtime configurations that execute it: bit
                                      LOOM_INTRAOP_CONFIG(zero, sp); 0: simulation only */
} loom_intraop_strategy;

/* The runtime's configurations: a ZeRO stage (0-3) and sequence parallelism (0 or 1). */
#define LOOM_INTRAOP_CONFIGS          8
#define LOOM_INTRAOP_CONFIG(zero, sp) ((zero) + 4 * (sp))
#define LOOM_INTRAOP_CONFIG_ZERO(c)   ((c) % 4)
#define LOOM_INTRAOP_CONFIG_SP(c)     ((c) / 4)

#define LOOM_INTRAOP_MAX_OPS        16
#define LOOM_INTRAOP_MAX_EDGES      24
#define LOOM_INTRAOP_MAX_STRATEGIES 96

typedef struct {
    char name[16];  /* "c_attn" */
    int count;      /* how often it runs per step (a block's operators: the layers) */
    int weights;    /* it holds weights (the tied LM head does not: the embedding does) */
    int held;       /* the runtime keeps its weights whole under ZeRO-2/3 (embedding, ln_f) */
    int strategies; /* >= 1 */
    loom_intraop_strategy strategy[LOOM_INTRAOP_MAX_STRATEGIES];
} loom_intraop_op;

typedef struct {
    int from, to;       /* producer and consumer operators */
    int count;          /* how often per step (0: the edge is in the graph but costs nothing) */
    int tied;           /* not an activation: the tied wte between the embedding and the LM head
                           (its gathers where they split it differently, and its gradient sync) */
    int64_t rows, cols; /* the tensor passed: (tokens, width) */
    double *reshard_s;  /* (from's strategies, to's strategies): forward + backward, per step */
} loom_intraop_edge;

typedef struct {
    int dp, tp;        /* the logical mesh, each >= 1 */
    int micro_batch;   /* sequences per data-parallel replica (the mesh runs dp x this) */
    int micro_batches; /* per step (>= 1); 0: 1 */
    int seq_len;       /* tokens per sequence; 0: the model's context */
    loom_precision precision;
    loom_intraop_space space;
    loom_intraop_part part;
    int64_t memory_budget; /* bytes per device for state (parameters, gradients, AdamW);
                              0: no constraint */
} loom_intraop_request;

typedef struct {
    loom_intraop_request request;
    loom_gpt_config model;
    int ops, edges;
    loom_intraop_op op[LOOM_INTRAOP_MAX_OPS];
    loom_intraop_edge edge[LOOM_INTRAOP_MAX_EDGES];
    int link[2];      /* each axis's link class (LOOM_LINK_INTRA_NODE or LOOM_LINK_INTER_NODE) */
    unsigned configs; /* the runtime configurations the mesh allows (ZeRO 1-3 with dp > 1,
                         sequence parallelism with tp > 1 dividing a replica's tokens) and every
                         operator offers a strategy in */
} loom_intraop_graph;

/* Builds the graph of `request->part` for `model` on `cluster` (which must have dp x tp
 * devices and a peak for the precision; the mesh, batch and sequence are checked, each problem
 * LOOM_ERR_INPUT naming the field). Free with loom_intraop_graph_free. */
loom_status loom_intraop_graph_create(loom_intraop_graph **graph, const loom_gpt_config *model,
                                      const loom_cluster *cluster,
                                      const loom_intraop_request *request);
void loom_intraop_graph_free(loom_intraop_graph *graph);

/* A choice of one strategy per operator, priced. */
typedef struct {
    int choice[LOOM_INTRAOP_MAX_OPS];
    double objective_s; /* = compute + comm + reshard + sync (the tied wte counts as sync) */
    double compute_s, comm_s, reshard_s, sync_s;
    int64_t state_bytes; /* per device */
    int config;          /* the runtime configuration that executes the whole choice (the least ZeRO
                            stage, then without SP, where several do); -1: none (simulation only) */
    double op_reshard_s[LOOM_INTRAOP_MAX_OPS]; /* the edges into each operator, times count */
    double op_tied_s[LOOM_INTRAOP_MAX_OPS];    /* the tied wte's, on the LM head (in sync_s) */
    /* the solve (loom_intraop_solve only) */
    int variables, constraints, nonzeros;
    double solve_s;
} loom_intraop_result;

/* Prices choice[] (every operator's strategy index) on the graph: the ILP's objective. */
void loom_intraop_evaluate(const loom_intraop_graph *graph, const int *choice,
                           loom_intraop_result *out);
/* The runtime's strategy of every operator in configuration `config`; 0 when some operator has
 * none (a mesh or configuration the runtime cannot run: its choice[] is -1), else 1. */
int loom_intraop_runtime_choice(const loom_intraop_graph *graph, int config, int *choice);

/* Where the runtime cannot follow choice[]. It follows when one runtime configuration runs every
 * operator's strategy, or one with the same splits and time (ZeRO-1 for ZeRO-0: an allreduce is
 * a reduce-scatter and an all-gather), within the graph's budget: returns 0 and that
 * configuration in *config (the least ZeRO stage, then without SP). Else *config is -1, and
 * why[v] says what operator v's strategy does that no runtime configuration does (a weight split
 * over dp, or over both axes at once; a split over tp loom has no kernel for; ZeRO-2/3 for a
 * unit the runtime holds whole), or that it needs another configuration than most of the choice
 * (ZeRO stage or sequence parallelism per operator, where the runtime has one for the model);
 * "" where the runtime follows. Returns how many operators it cannot follow. */
#define LOOM_INTRAOP_WHY_CHARS 200
int loom_intraop_unfollowed(const loom_intraop_graph *graph, const int *choice, int *config,
                            char why[][LOOM_INTRAOP_WHY_CHARS]);

/* Solves the ILP with glp_intopt (GLPK silent). A memory budget no choice meets is
 * LOOM_ERR_INPUT naming the budget and the least state any choice needs. */
loom_status loom_intraop_solve(const loom_intraop_graph *graph, loom_intraop_result *out);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PLANNER_H */
