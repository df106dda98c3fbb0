/*
 * loom/costmodel.h — the planner's cost model: what a plan costs on a cluster, per rank and per
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
 * memory bandwidth).
 *
 * Compression (the plan's compression.dp and .pp): a compressing matrix sends the wire of
 * loom/compress.h's formulas (PowerSGD's factors allreduced; top-k, sign, int8 and bf16
 * all-gathered, every replica's part decoded), the codec runs at the cluster's measured
 * throughput (else three passes at the memory bandwidth) and is never hidden (it computes);
 * a compressed pipeline link's backward message is the low-rank wire plus its codec; the
 * compressors' state (both copies) counts in memory. The epilogue and slack policies are costed
 * as "all" (every backward send compressed), a bound on what they save.
 *
 * Not modelled (yet): overlap of TP collectives with compute, contention between groups on one
 * link, what compression does to the loss (the search uses it only when allowed).
 */
#ifndef LOOM_COSTMODEL_H
#define LOOM_COSTMODEL_H

#include "loom/base.h"
#include "loom/cluster.h"
#include "loom/plan.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The link class of a group of world ranks placed as above: LOOM_LINK_INTRA_NODE when they all
 * share a node, else LOOM_LINK_INTER_NODE. */
int loom_plan_group_link(const loom_cluster *cluster, const int *ranks, int n);

/* What one rank holds, in bytes, as the runtime allocates it (train/memory.c checks it). */
typedef struct {
    int64_t weights, grads, optimizer; /* optimizer: AdamW m and v, ZeRO-1 sharded when asked */
    int64_t activations;               /* the schedule's peak of activation sets (and kept
                                          inputs and W state with recomputation) */
    int64_t scratch;                   /* backward scratch; with ZeRO-1 the reduce-scatter
                                          ring's receive buffers (one gradient's worth) */
    int64_t compressor;                /* compressors' state (error feedback, lazy error,
                                          warm-start factors), both copies */
    int64_t total;
    int in_flight; /* the schedule's peak of chunk activation sets */
} loom_rank_memory;

/* Pipeline rank pp_rank's memory (any TP rank: they are alike) for sequences of seq_len tokens;
 * zero1: AdamW's moments sharded over the plan's dp. Errors are the cost facts'. */
loom_status loom_plan_rank_memory(const loom_plan *plan, int pp_rank, int seq_len, int zero1,
                                  loom_rank_memory *out);

/* One virtual stage's times for one micro-batch. */
typedef struct {
    double forward_s, backward_input_s, backward_weight_s, backward_s;
    double tp_forward_s, tp_backward_s; /* included above */
} loom_stage_times;

#define LOOM_PREDICT_MAX_STAGES 256
typedef struct {
    double step_s, tokens_per_s;
    double pipeline_s;                    /* the simulated pipeline part */
    double dp_exposed_s, optimizer_s;     /* after it */
    double bubble;                        /* share of the pipeline part ranks idle (mean) */
    int64_t peak_bytes;                   /* the largest rank's memory */
    int64_t dp_bytes, tp_bytes, pp_bytes; /* per step, summed over every rank */
    loom_stage_times stage[LOOM_PREDICT_MAX_STAGES]; /* per virtual stage */
    int stages;
} loom_prediction;

/* Predicts a checked plan on `cluster` (which must have at least dp x tp x pp devices in
 * max_nodes x devices_per_node; a plan that needs more is LOOM_ERR_INPUT naming the numbers)
 * in `precision` (a precision the cluster has no peak for is LOOM_ERR_INPUT). */
loom_status loom_plan_predict(const loom_plan *plan, const loom_cluster *cluster,
                              loom_precision precision, int seq_len, int zero1,
                              loom_prediction *out);

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
                                    loom_precision precision, int seq_len, int zero1,
                                    const char *path, loom_prediction *out);

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
    int options; /* 1; or 2: each stage may also recompute (option 1), chosen per stage */
    /* indexed [(option * LOOM_STAGE_CLASSES + class) * (layers + 1) + n], n = 1 .. layers
     * layers; a class/count that cannot exist (a middle stage of all layers) has time INFINITY */
    double *time;         /* seconds: forward + backward of one micro-batch */
    int64_t *memory;      /* bytes with no activation set in flight */
    int64_t *per_flight;  /* bytes each activation set in flight adds */
    int *in_flight;       /* (stages) the schedule's peak of activation sets per stage */
    int64_t memory_bytes; /* per rank; <= 0: no limit */
} loom_stage_problem;

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
 * as loom_plan_predict costs stages; per_stage_recompute: two options per stage (no, yes), else
 * the plan's own (stage 0's) for all. With several chunks per rank (interleaved, zb-v) the
 * stages are the virtual stages and the DP is a heuristic: Alpa's closed form does not describe
 * chunked ranks, a rank's chunks must agree on recomputation (one option only) and share its
 * memory (no memory limit here: loom_plan_predict checks the result). Free with
 * loom_stage_problem_free. */
loom_status loom_plan_stage_problem(const loom_plan *plan, const loom_cluster *cluster,
                                    loom_precision precision, int seq_len, int zero1,
                                    int per_stage_recompute, loom_stage_problem *out);
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
    loom_plan plan; /* owned: free with loom_plan_free */
    int zero1;
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

/* Fills best[0 .. *found) (at most request->keep, fastest first); *tried and *fitting count the
 * plans predicted and those that fit, *pruned (when not NULL) the plans not simulated because
 * their compute alone (loom_plan_step_bound) could not beat the ones kept. No layout that fits
 * is LOOM_ERR_INPUT naming the smallest memory shortfall per rank. */
loom_status loom_plan_search(const loom_gpt_config *model, const loom_cluster *cluster,
                             const loom_search_request *request, loom_plan_candidate *best,
                             int *found, int *tried, int *fitting, int *pruned);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_COSTMODEL_H */
