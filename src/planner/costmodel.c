/*
 * costmodel.c — what a plan costs on a cluster (loom/planner.h): memory per rank as the
 * runtime allocates it, and the step's time from the model's cost facts, the cluster's figures
 * and the schedule simulator. The rules are stated in the header. A prediction is a sum of
 * terms, one function each: the stages' times (stage_times), the pipeline (pipeline_term: links
 * and the simulated step), then on each pipeline rank its DP sync (dp_sync_of, dp_exposed_s),
 * the tied embedding's sum (tied_embedding_s) and AdamW (optimizer_s); the traffic figures are
 * counted along (pipeline_bytes, dp_sync_of, tp_bytes_of).
 *
 * Not here: choosing a plan (the search), measuring a cluster (profile.c), reading one
 * (cluster.c).
 */
#include "loom/planner.h"
#include "loom/compress.h"
#include "loom/model.h"
#include "loom/parallel.h"
#include "loom/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- compression ---------------------------------------------------------------------- */

/* Seconds the codec takes for `raw` fp32 bytes (encode and decode), from the cluster's measured
 * throughput, else three passes at the memory bandwidth. */
static double codec_s(const loom_cluster *cl, loom_compress_method method, double raw) {
    if (raw <= 0 || method == LOOM_COMPRESS_NONE) return 0;
    double rate = cl->compressor_bytes_per_s[method];
    return rate > 0 ? raw / rate : 3 * raw / cl->memory_bandwidth;
}

/* ---- placement ------------------------------------------------------------------------- */

int loom_plan_group_link(const loom_cluster *cl, const int *ranks, int n) {
    for (int i = 1; i < n; i++) {
        if (ranks[i] / cl->devices_per_node != ranks[0] / cl->devices_per_node)
            return LOOM_LINK_INTER_NODE;
    }
    return LOOM_LINK_INTRA_NODE;
}

/* The groups a rank belongs to: its tensor-parallel group, its data-parallel group, and its
 * pipeline neighbours. */
typedef enum { GROUP_TP, GROUP_DP, GROUP_PP } group_kind;

/* The slowest link class any group of that kind uses. */
static int kind_link(const loom_plan *plan, const loom_cluster *cl, group_kind kind) {
    int worst = LOOM_LINK_INTRA_NODE, members[2];
    for (int r = 0; r < plan->dp * plan->tp * plan->pp; r++) {
        loom_plan_coords c = loom_plan_rank_coords(plan, r), d = c;
        if (kind == GROUP_TP && plan->tp > 1) d.tp_rank = (c.tp_rank + 1) % plan->tp;
        if (kind == GROUP_DP && plan->dp > 1) d.dp_rank = (c.dp_rank + 1) % plan->dp;
        if (kind == GROUP_PP && plan->pp > 1) d.pp_rank = (c.pp_rank + 1) % plan->pp;
        members[0] = r, members[1] = loom_plan_world_rank(plan, d);
        if (loom_plan_group_link(cl, members, 2) == LOOM_LINK_INTER_NODE)
            worst = LOOM_LINK_INTER_NODE;
    }
    return worst;
}

int loom_plan_dp_link(const loom_plan *plan, const loom_cluster *cluster) {
    return kind_link(plan, cluster, GROUP_DP);
}

/* ---- time ------------------------------------------------------------------------------ */

typedef struct {
    const loom_plan *plan;
    const loom_cluster *cluster;
    loom_precision precision;
    int tp_link, dp_link;
    double bytes_per_value; /* activations and gradients on the wire and in memory */
    int seq_len;
    double *dp_stream_end_s; /* (pp) ZeRO-2/3: when each pipeline rank's DP stream is done with
                                the step's reduce-scatters and gathers (NULL: not wanted) */
    double *last_backward_s; /* (V) ZeRO-0/1 overlapped: when each virtual stage's last backward
                                of the step starts (NULL: not wanted) */
} costing;

static costing costing_of(const loom_plan *plan, const loom_cluster *cluster,
                          loom_precision precision, int seq_len) {
    costing k = {plan,
                 cluster,
                 precision,
                 kind_link(plan, cluster, GROUP_TP),
                 plan->dp > 1 ? kind_link(plan, cluster, GROUP_DP) : LOOM_LINK_INTRA_NODE,
                 4.0,
                 seq_len,
                 NULL,
                 NULL};
    if (precision != LOOM_PRECISION_FP32) k.bytes_per_value = 2.0;
    return k;
}

static double gemm_s(const costing *k, double flops, double typical) {
    double peak = k->cluster->peak_flops[k->precision];
    if (flops <= 0 || peak <= 0) return 0;
    return flops / (peak * loom_cluster_gemm_efficiency(k->cluster, typical));
}

static double tp_collective_s(const costing *k, loom_collective_op op, int64_t calls,
                              int64_t bytes) {
    if (calls <= 0 || k->plan->tp <= 1) return 0;
    double per_call = (double)bytes / (double)calls * k->bytes_per_value / 4.0;
    return (double)calls *
           loom_cluster_collective_s(k->cluster, op, k->tp_link, k->plan->tp, per_call);
}

/* A pass's tensor-parallel traffic: its allreduces, and under sequence parallelism its
 * all-gathers and reduce-scatters (`shards`, with the bytes of the whole buffer: each costs
 * what an all-gather of it costs, half an allreduce's bandwidth term on the same ring). */
static double tp_s(const costing *k, int64_t allreduces, int64_t allreduce_bytes, int64_t shards,
                   int64_t shard_bytes) {
    return tp_collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, allreduces, allreduce_bytes) +
           tp_collective_s(k, LOOM_COLLECTIVE_ALLGATHER, shards, shard_bytes);
}

/* A DP-group collective of `bytes` made as `calls` calls (buckets, units): the bytes' time plus
 * the fixed cost (the fit's alpha, the ring's latencies) of every call after the first. A
 * measured fit is of one call on one buffer (loom profile times the calls training makes), so
 * a gradient sent in buckets pays its alpha per bucket. */
static double dp_calls_s(const costing *k, loom_collective_op op, double bytes, double calls) {
    double once = loom_cluster_collective_s(k->cluster, op, k->dp_link, k->plan->dp, bytes);
    double fixed = loom_cluster_collective_s(k->cluster, op, k->dp_link, k->plan->dp, 0.0);
    return once + (calls > 1 ? calls - 1 : 0) * fixed;
}

/* The buckets of `bytes` of gradients at loom train's default bucket size for the plan's dp. */
static double buckets_of(const costing *k, double bytes) {
    double bucket = loom_grad_bucket_default_mb(k->plan->dp) * 1024 * 1024;
    return bytes > bucket ? ceil(bytes / bucket) : 1;
}

/* The units of a virtual stage ZeRO-3 gathers one at a time (blocks, embedding, head). */
static int stage_units(const loom_plan_stage *st) {
    return st->end_layer - st->first_layer + (st->embedding ? 1 : 0) + (st->head ? 1 : 0);
}

/* ZeRO-3's gathers of a virtual stage's parameters over the DP group, one pass's worth (every
 * unit once, a call each), fp32 as loom holds them (as ZeRO-1's all-gather). */
static double zero3_gather_s(const costing *k, int s, const loom_gpt_stage_cost *c) {
    return dp_calls_s(k, LOOM_COLLECTIVE_ALLGATHER, (double)c->param_bytes,
                      stage_units(&k->plan->stages[s]));
}

/* A pass of `compute_s` that needs its units gathered first (`gather_s` for all of them): with
 * prefetch, each unit's gather overlaps the previous unit's compute, so the pass takes the
 * longer of the two plus the first unit's gather; without, it waits for every gather. */
static double gathered_pass_s(const costing *k, double compute_s, double gather_s, int units) {
    if (k->plan->zero3_prefetch < 1) return compute_s + gather_s;
    return (compute_s > gather_s ? compute_s : gather_s) + gather_s / (units > 0 ? units : 1);
}

/* Bytes of the stage's gradients a weight-gradient GEMM writes: its parameters but the token
 * and position embeddings, with wte back in when the stage also holds the LM head (tied). */
static int64_t gemm_gradient_bytes(const loom_plan *plan, int s, const loom_gpt_stage_cost *c) {
    const loom_plan_stage *st = &plan->stages[s];
    if (!st->embedding) return c->param_bytes;
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout_tp(&plan->model, plan->tp, info);
    int64_t wte = info[LOOM_WTE].numel * (int64_t)sizeof(float);
    int64_t wpe = info[LOOM_WPE].numel * (int64_t)sizeof(float);
    return c->param_bytes - wpe - (st->head ? 0 : wte);
}

static loom_status stage_times(const costing *k, int s, int seq_len, loom_stage_times *t) {
    memset(t, 0, sizeof *t);
    loom_gpt_stage_cost c, kept;
    const loom_plan_stage *stage = &k->plan->stages[s];
    loom_status st = loom_plan_stage_cost(k->plan, s, seq_len, &c);
    /* the memory-bound work writes every activation whether the slot keeps it or not:
     * selective recomputation's slot lacks the softmaxes the forward still writes */
    kept = c;
    if (st == LOOM_OK && stage->recompute == LOOM_RECOMPUTE_SELECTIVE)
        st = loom_plan_stage_cost_as(k->plan, s, seq_len, LOOM_RECOMPUTE_NONE, &kept);
    if (st != LOOM_OK) return st;
    int gemms = 4 * (stage->end_layer - stage->first_layer) + (stage->head ? 1 : 0);
    double typical = gemms > 0 ? (double)c.flops_fwd / gemms : (double)c.flops_fwd;
    double bandwidth = k->cluster->memory_bandwidth;
    /* memory-bound work: the activations the part writes, read and written once more; a fused
     * attention kernel (the cluster's "attention": "fused") writes no softmax */
    int fused = k->cluster->fused_attention;
    double written = (double)(kept.act_slot_bytes - (fused ? c.softmax_bytes : 0));
    double memory = written * k->bytes_per_value / 4.0 * 2.0 / bandwidth;
    t->tp_forward_s =
        tp_s(k, c.tp_allreduces_fwd, c.tp_bytes_fwd, c.tp_shards_fwd, c.tp_shard_bytes_fwd);
    t->tp_backward_s =
        tp_s(k, c.tp_allreduces_bwd, c.tp_bytes_bwd, c.tp_shards_bwd, c.tp_shard_bytes_bwd);
    /* and every GEMM call streams its weight operand from memory once (BLAS packs it; on a
     * GPU it is read from HBM): the forward and the input gradient, once per micro-batch */
    double weights = (double)c.param_bytes * k->bytes_per_value / 4.0 / bandwidth;
    t->forward_s = gemm_s(k, (double)c.flops_fwd, typical) + memory + weights + t->tp_forward_s;
    /* the fused kernel's backward computes QK^T once more (it kept no scores) */
    double recomputed_scores = fused ? (double)c.flops_attention / 2.0 : 0.0;
    t->backward_input_s = gemm_s(k, (double)c.flops_bwd_input + recomputed_scores, typical) +
                          memory + weights + t->tp_backward_s;
    /* selective recomputation reruns the attention core before the input gradient: its GEMMs
     * and the softmaxes written again (nothing more under a fused kernel, which keeps no
     * softmax to drop and recomputes its scores anyway) */
    if (c.flops_selective > 0 && !fused) {
        double softmax = (double)(kept.act_slot_bytes - c.act_slot_bytes);
        t->backward_input_s += gemm_s(k, (double)c.flops_selective, typical) +
                               softmax * k->bytes_per_value / 4.0 * 2.0 / bandwidth;
    }
    /* and the weight-gradient GEMMs accumulate into the fp32 gradients (beta 1): every
     * micro-batch reads and writes the gradients of the weights they produce once — not the
     * embedding's (its backward adds into the rows of the batch's tokens), but wte's again when
     * the stage's LM head multiplies by it */
    double accumulate = 2.0 * (double)gemm_gradient_bytes(k->plan, s, &c) / bandwidth;
    t->backward_weight_s = gemm_s(k, (double)c.flops_bwd_weight, typical) + memory / 2 + accumulate;
    if (c.flops_recompute > 0) { /* the rerun forward: before a whole backward, or before B and
                                  * again before W (the executor reruns it when another micro-
                                  * batch used the one activation set in between) */
        t->rerun_s = t->forward_s;
    }
    /* ZeRO-3 gathering per micro-batch: every unit before its forward and again before its
     * input gradient (the weight gradient needs no weights); the rerun forward of full
     * recomputation runs on the backward's gather */
    if (k->plan->zero >= 3 && k->plan->dp > 1 &&
        k->plan->zero3_gather == LOOM_ZERO3_GATHER_MICRO_BATCH) {
        double gather = zero3_gather_s(k, s, &c), forward = t->forward_s;
        int units = stage_units(stage);
        t->forward_s = gathered_pass_s(k, forward, gather, units);
        double b = t->backward_input_s + t->rerun_s;
        t->zero_gather_s = t->forward_s - forward + gathered_pass_s(k, b, gather, units) - b;
        t->backward_input_s = gathered_pass_s(k, b, gather, units) - t->rerun_s;
    }
    t->backward_s = t->backward_input_s + t->backward_weight_s + t->rerun_s;
    t->backward_input_s += t->rerun_s, t->backward_weight_s += t->rerun_s;
    return LOOM_OK;
}

/* The simulated actions as trace events, seconds from the step's start: compute on the compute
 * stream, a send from its start to its arrival and a receive's wait on the pp stream, with the
 * micro-batch and the virtual stage, as loom train --trace records them. */
static void record_pipeline(const loom_pipe_shape *shape, const loom_pipe_stage_schedule *lists,
                            const loom_pipe_sim_result *result, loom_trace **traces) {
    for (int r = 0; r < shape->ranks; r++) {
        double origin = loom_trace_origin_us(traces[r]);
        for (int i = 0; i < lists[r].count; i++) {
            const loom_pipe_action *a = &lists[r].actions[i];
            const loom_pipe_sim_action *t = &result->stage[r][i];
            int compute = a->op == LOOM_PIPE_FORWARD || a->op == LOOM_PIPE_BACKWARD ||
                          a->op == LOOM_PIPE_BACKWARD_INPUT || a->op == LOOM_PIPE_BACKWARD_WEIGHT;
            int send = a->op == LOOM_PIPE_SEND_ACT || a->op == LOOM_PIPE_SEND_GRAD;
            double end = send ? t->arrival_s : t->end_s;
            loom_trace_event_stage(traces[r], compute ? LOOM_TRACE_COMPUTE : LOOM_TRACE_PP,
                                   loom_pipe_op_name(a->op), compute ? "compute" : "pp",
                                   origin + t->start_s * 1e6, (end - t->start_s) * 1e6, 0,
                                   a->micro_batch, loom_pipe_stage(shape, r, a->chunk));
        }
    }
}

/* Recomputation only where the schedule needs it: the executor reruns a micro-batch's forward
 * before its backward (B) unless the rank's previous compute was that very forward, and before
 * its W unless the previous compute was its B (the one activation set is still there); a stage
 * that recomputes "always" reruns it before every B, as Megatron's full recomputation. Each
 * virtual stage's B and W times, which stage_times charged a rerun forward every time, keep the
 * share of micro-batches that need it (the simulator takes one time per stage). */
static void recompute_as_scheduled(const loom_plan *plan, const loom_pipe_shape *shape,
                                   const loom_pipe_stage_schedule *lists, loom_prediction *out) {
    if (!lists) return;
    int needs_b[LOOM_PREDICT_MAX_STAGES] = {0}, needs_w[LOOM_PREDICT_MAX_STAGES] = {0};
    for (int r = 0; r < shape->ranks; r++) {
        const loom_pipe_action *last = NULL;
        for (int i = 0; i < lists[r].count; i++) {
            const loom_pipe_action *a = &lists[r].actions[i];
            int s = loom_pipe_stage(shape, r, a->chunk);
            int same = last && last->micro_batch == a->micro_batch && last->chunk == a->chunk;
            int always = plan->stages[s].recompute == LOOM_RECOMPUTE_ALWAYS;
            if (a->op == LOOM_PIPE_BACKWARD || a->op == LOOM_PIPE_BACKWARD_INPUT)
                needs_b[s] += always || !(same && last->op == LOOM_PIPE_FORWARD);
            if (a->op == LOOM_PIPE_BACKWARD_WEIGHT)
                needs_w[s] += !(same && last->op == LOOM_PIPE_BACKWARD_INPUT);
            if (a->op == LOOM_PIPE_FORWARD || a->op == LOOM_PIPE_BACKWARD ||
                a->op == LOOM_PIPE_BACKWARD_INPUT || a->op == LOOM_PIPE_BACKWARD_WEIGHT)
                last = a;
        }
    }
    int m = shape->micro_batches;
    for (int s = 0; s < plan->num_stages && m > 0; s++) {
        if (!loom_recompute_full(plan->stages[s].recompute)) continue;
        loom_stage_times *t = &out->stage[s];
        double f = t->rerun_s, spare_b = f * (1.0 - (double)needs_b[s] / m);
        double spare_w = f * (1.0 - (double)needs_w[s] / m);
        t->backward_input_s -= spare_b, t->backward_weight_s -= spare_w;
        t->backward_s -= spare_b; /* a whole backward: one rerun at most, as B's */
    }
}

/* The pipeline's messages: per boundary s (virtual stages s and s + 1) the activation's and the
 * uncompressed gradient's transfer, and per gradient send (the sender's virtual stage v times m
 * plus the micro-batch) its transfer and bytes, compressed where the plan's policy says. A
 * message the runtime scatters (tensor parallelism without sequence parallelism, not
 * compressed: pipeline.c's scattered_share) crosses as each TP rank's 1/tp share and costs its
 * receiver the TP group's all-gather. */
typedef struct {
    double *act_s, *grad_s;           /* (V) */
    double *grad_mb_s, *grad_bytes;   /* (V x m) */
    double *act_recv_s, *grad_recv_s; /* (V) the receiver's gather of a scattered message */
    unsigned char *act_scattered, *grad_scattered; /* (V) */
} pipeline_links;

/* Per boundary, what a compressed gradient send costs: its transfer plus encoding and decoding,
 * its bytes, and the time it saves (0 where the boundary does not compress). */
typedef struct {
    double *packed_s, *packed_bytes, *saving_s; /* (V) */
} compressed_boundaries;

/* The simulator's per-stage inputs, copied out of a prediction's stage times. */
typedef struct {
    double *forward_s, *backward_s, *backward_input_s, *backward_weight_s; /* (V) */
} stage_time_arrays;

static double *zeroed_doubles(size_t n) {
    return calloc(n > 0 ? n : 1, sizeof(double));
}

static void pipeline_links_free(pipeline_links *l) {
    free(l->act_s), free(l->grad_s), free(l->grad_mb_s), free(l->grad_bytes);
    free(l->act_recv_s), free(l->grad_recv_s), free(l->act_scattered), free(l->grad_scattered);
    memset(l, 0, sizeof *l);
}

static void compressed_boundaries_free(compressed_boundaries *c) {
    free(c->packed_s), free(c->packed_bytes), free(c->saving_s);
}

static void stage_time_arrays_free(stage_time_arrays *a) {
    free(a->forward_s), free(a->backward_s), free(a->backward_input_s), free(a->backward_weight_s);
}

static loom_status stage_time_arrays_of(const loom_prediction *out, int V, stage_time_arrays *a) {
    a->forward_s = zeroed_doubles((size_t)V), a->backward_s = zeroed_doubles((size_t)V);
    a->backward_input_s = zeroed_doubles((size_t)V);
    a->backward_weight_s = zeroed_doubles((size_t)V);
    if (!a->forward_s || !a->backward_s || !a->backward_input_s || !a->backward_weight_s) {
        stage_time_arrays_free(a);
        return loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
    }
    for (int s = 0; s < V; s++) {
        a->forward_s[s] = out->stage[s].forward_s, a->backward_s[s] = out->stage[s].backward_s;
        a->backward_input_s[s] = out->stage[s].backward_input_s;
        a->backward_weight_s[s] = out->stage[s].backward_weight_s;
    }
    return LOOM_OK;
}

static loom_pipe_sim_times sim_times_of(const stage_time_arrays *a, int V,
                                        const pipeline_links *links) {
    loom_pipe_sim_times times = {V,
                                 V - 1,
                                 a->forward_s,
                                 a->backward_s,
                                 links->act_s,
                                 links->grad_s,
                                 a->backward_input_s,
                                 a->backward_weight_s,
                                 links->grad_mb_s,
                                 links->act_recv_s,
                                 links->grad_recv_s};
    return times;
}

/* The mean share of the simulated step the pipeline ranks spend idle. */
static double pipeline_bubble(const loom_pipe_shape *shape, const loom_pipe_stage_schedule *lists,
                              const loom_pipe_sim_result *result) {
    double idle = 0;
    for (int r = 0; r < shape->ranks; r++) {
        double busy = 0;
        for (int i = 0; i < lists[r].count; i++) {
            loom_pipe_op op = lists[r].actions[i].op;
            if (op == LOOM_PIPE_FORWARD || op == LOOM_PIPE_BACKWARD ||
                op == LOOM_PIPE_BACKWARD_INPUT || op == LOOM_PIPE_BACKWARD_WEIGHT)
                busy += result->stage[r][i].end_s - result->stage[r][i].start_s;
        }
        idle += result->makespan_s > 0 ? 1 - busy / result->makespan_s : 0;
    }
    return idle / shape->ranks;
}

/* One pipeline message (an activation or its gradient) in the activations' precision, as the
 * cost facts say it (the first stage's output: (B, T, C), a TP rank's 1/tp of the rows under
 * sequence parallelism). */
static double pp_message_bytes(const costing *k) {
    const loom_plan *plan = k->plan;
    loom_gpt_stage_cost c;
    double whole = (double)plan->micro_batch * k->seq_len * plan->model.channels * 4.0;
    if (plan->num_stages > 1 && loom_plan_stage_cost(plan, 0, k->seq_len, &c) == LOOM_OK)
        whole = (double)c.pp_act_bytes;
    return whole * k->bytes_per_value / 4.0;
}

/* The pipeline's bytes over the step, every rank: each message crosses once, activations
 * forward, gradients backward (compressed where the plan says). */
static int64_t pipeline_bytes(const costing *k, const loom_pipe_shape *shape,
                              const loom_pipe_stage_schedule *lists, const pipeline_links *links,
                              int64_t *gather_bytes) {
    const loom_plan *plan = k->plan;
    int m = shape->micro_batches;
    double message = pp_message_bytes(k), share = message / plan->tp;
    double gather = loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLGATHER, plan->tp, message);
    int64_t bytes = 0, gathered = 0;
    for (int r = 0; r < shape->ranks; r++) {
        for (int i = 0; i < lists[r].count; i++) {
            const loom_pipe_action *a = &lists[r].actions[i];
            int v = loom_pipe_stage(shape, r, a->chunk);
            if (a->op == LOOM_PIPE_SEND_ACT) {
                int scattered = links->act_scattered[v];
                bytes += (int64_t)(scattered ? share : message), gathered += scattered;
            }
            if (a->op == LOOM_PIPE_SEND_GRAD) { /* into v - 1 */
                size_t i_mb = (size_t)v * (size_t)m + (size_t)a->micro_batch;
                bytes += v > 0 && a->micro_batch < m ? (int64_t)links->grad_bytes[i_mb]
                                                     : (int64_t)message;
                gathered += v > 0 && links->grad_scattered[v - 1];
            }
        }
    }
    *gather_bytes = (int64_t)gather * gathered * plan->dp * plan->tp;
    return bytes * plan->dp * plan->tp;
}

/* ZeRO-2/3's DP stream on each pipeline rank (k->dp_stream_end_s): every backward (or W) of a
 * virtual stage leaves its gradient to reduce-scatter over the DP group, unit by unit as the
 * units' backwards end, on a stream of its own. A micro-batch's reduce-scatter of the stage's
 * gradient starts once the stream is free and the backward's first unit is done, and ends no
 * sooner than the last unit's share after the backward. Gathering once per step (ZeRO-3
 * "step"), the stream first gathers every parameter; ZeRO-2 ends with ZeRO-1's all-gather of
 * the updated parameters. Contention between this stream and ZeRO-3's gathers inside the
 * passes (in their stage times) is not modelled. */
static loom_status zero_stream(const costing *k, const loom_pipe_shape *shape,
                               const loom_pipe_stage_schedule *lists,
                               const loom_pipe_sim_result *result) {
    const loom_plan *plan = k->plan;
    int V = plan->num_stages;
    double rs[LOOM_PREDICT_MAX_STAGES], params[LOOM_PREDICT_MAX_STAGES];
    for (int v = 0; v < V; v++) {
        loom_gpt_stage_cost cost;
        loom_status st = loom_plan_stage_cost(plan, v, k->seq_len, &cost);
        if (st != LOOM_OK) return st;
        rs[v] = dp_calls_s(k, LOOM_COLLECTIVE_REDUCE_SCATTER, (double)cost.grad_bytes,
                           stage_units(&plan->stages[v]));
        params[v] = (double)cost.param_bytes;
    }
    for (int r = 0; r < shape->ranks; r++) {
        double rank_params = 0, units = 0, free_s = 0;
        for (int c = 0; c < shape->chunks; c++) {
            int v = loom_pipe_stage(shape, r, c);
            rank_params += params[v], units += stage_units(&plan->stages[v]);
        }
        double gather = dp_calls_s(k, LOOM_COLLECTIVE_ALLGATHER, rank_params,
                                   plan->zero == 2 ? buckets_of(k, rank_params) : units);
        if (plan->zero >= 3 && plan->zero3_gather == LOOM_ZERO3_GATHER_STEP) free_s = gather;
        for (int i = 0; i < lists[r].count; i++) {
            const loom_pipe_action *a = &lists[r].actions[i];
            if (a->op != LOOM_PIPE_BACKWARD && a->op != LOOM_PIPE_BACKWARD_WEIGHT) continue;
            int v = loom_pipe_stage(shape, r, a->chunk);
            double u = stage_units(&plan->stages[v]);
            const loom_pipe_sim_action *t = &result->stage[r][i];
            double first = t->start_s + (t->end_s - t->start_s) / u;
            double start = free_s > first ? free_s : first;
            double end = start + rs[v], last = t->end_s + rs[v] / u;
            free_s = end > last ? end : last;
        }
        if (plan->zero == 2) free_s += gather;
        k->dp_stream_end_s[r] = free_s;
    }
    return LOOM_OK;
}

/* ZeRO-0/1 with overlap (k->last_backward_s): when each virtual stage's last backward (or W)
 * of the step starts, the moment loom_grad_sync starts filling that chunk's buckets; a rank's
 * later chunks finish theirs, and start their sync, while its earlier chunks still compute. */
static void last_backwards(const costing *k, const loom_pipe_shape *shape,
                           const loom_pipe_stage_schedule *lists,
                           const loom_pipe_sim_result *result) {
    for (int r = 0; r < shape->ranks; r++) {
        for (int i = 0; i < lists[r].count; i++) {
            const loom_pipe_action *a = &lists[r].actions[i];
            if (a->op != LOOM_PIPE_BACKWARD && a->op != LOOM_PIPE_BACKWARD_WEIGHT) continue;
            k->last_backward_s[loom_pipe_stage(shape, r, a->chunk)] = result->stage[r][i].start_s;
        }
    }
}

/* The pipeline part: every rank's list in the simulator, each message its link time. */
static loom_status simulate_pipeline(const costing *k, const loom_pipe_shape *shape,
                                     const loom_pipe_stage_schedule *lists,
                                     const pipeline_links *links, loom_trace **traces,
                                     loom_prediction *out) {
    stage_time_arrays arrays;
    loom_status st = stage_time_arrays_of(out, k->plan->num_stages, &arrays);
    if (st != LOOM_OK) return st;
    loom_pipe_sim_times times = sim_times_of(&arrays, k->plan->num_stages, links);
    loom_pipe_sim_result result;
    st = loom_pipe_simulate(shape, lists, &times, &result);
    if (st == LOOM_OK) {
        if (traces) record_pipeline(shape, lists, &result, traces);
        out->pipeline_s = result.makespan_s;
        out->bubble = pipeline_bubble(shape, lists, &result);
        int64_t gathered = 0;
        out->pp_bytes += pipeline_bytes(k, shape, lists, links, &gathered);
        out->tp_bytes += gathered;
        if (k->dp_stream_end_s) st = zero_stream(k, shape, lists, &result);
        if (k->last_backward_s) last_backwards(k, shape, lists, &result);
        loom_pipe_sim_result_free(&result);
    }
    stage_time_arrays_free(&arrays);
    return st;
}

/* The slowest link class between pipeline ranks a and b over every (dp, tp) coordinate: the
 * class a message between two virtual stages on them crosses. */
static int pair_link(const loom_plan *plan, const loom_cluster *cl, int a, int b) {
    int members[2];
    for (int dp = 0; dp < plan->dp; dp++) {
        for (int tp = 0; tp < plan->tp; tp++) {
            loom_plan_coords c = {.dp_rank = dp, .tp_rank = tp, .pp_rank = a}, d = c;
            d.pp_rank = b;
            members[0] = loom_plan_world_rank(plan, c), members[1] = loom_plan_world_rank(plan, d);
            if (loom_plan_group_link(cl, members, 2) == LOOM_LINK_INTER_NODE)
                return LOOM_LINK_INTER_NODE;
        }
    }
    return LOOM_LINK_INTRA_NODE;
}

/* Fills links->act_s and grad_s (every boundary's uncompressed transfer over its link class)
 * and, per boundary the plan compresses with a wire smaller than the message, the compressed
 * send's cost in *packed (elsewhere the uncompressed one). Returns whether any boundary
 * compresses. */
static int boundary_transfers(const costing *k, double message, pipeline_links *links,
                              compressed_boundaries *packed) {
    const loom_plan *plan = k->plan;
    const loom_cluster *cluster = k->cluster;
    int64_t rows = (int64_t)plan->micro_batch * k->seq_len;
    const loom_plan_compressor *pc = &plan->pp_compression;
    int compressing = 0, pairs = 0, pair[2 * LOOM_PREDICT_MAX_STAGES][3]; /* (a, b, class) */
    int scatter = plan->tp > 1 && !plan->sequence_parallel;
    double gather_s =
        scatter ? loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_ALLGATHER,
                                            kind_link(plan, cluster, GROUP_TP), plan->tp, message)
                : 0.0;
    for (int s = 0; s + 1 < plan->num_stages; s++) {
        /* the boundary's class: the pair of pipeline ranks it joins (few, each costed once) */
        int a = plan->stages[s].rank, b = plan->stages[s + 1].rank, link = -1;
        for (int i = 0; i < pairs && link < 0; i++)
            if (pair[i][0] == a && pair[i][1] == b) link = pair[i][2];
        if (link < 0) {
            link = pair_link(plan, cluster, a, b);
            if (pairs < 2 * LOOM_PREDICT_MAX_STAGES) {
                pair[pairs][0] = a, pair[pairs][1] = b, pair[pairs][2] = link;
                pairs++;
            }
        }
        double whole =
            loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_SENDRECV, link, 2, message);
        double share_s = loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_SENDRECV, link, 2,
                                                   message / plan->tp);
        packed->packed_s[s] = whole;
        packed->packed_bytes[s] = message;
        /* a link with a compressor sends whole, each direction (forward compression's own wire
         * is not priced here) */
        int forward_packs = pc->forward != LOOM_COMPRESS_NONE && loom_plan_compresses_stage(pc, s);
        double wire = message;
        if (pc->method != LOOM_COMPRESS_NONE && loom_plan_compresses_stage(pc, s)) {
            double state;
            wire = loom_plan_compressor_wire(pc, pc->method, rows, plan->model.channels, &state) *
                   k->bytes_per_value / 4.0;
        }
        links->act_scattered[s] = scatter && !forward_packs;
        links->grad_scattered[s] = scatter && wire >= message;
        links->act_s[s] = links->act_scattered[s] ? share_s : whole;
        links->act_recv_s[s] = links->act_scattered[s] ? gather_s : 0.0;
        links->grad_s[s] = links->grad_scattered[s] ? share_s : whole;
        links->grad_recv_s[s] = links->grad_scattered[s] ? gather_s : 0.0;
        if (wire >= message) continue; /* the executor sends it as it is */
        packed->packed_bytes[s] = wire;
        packed->packed_s[s] =
            loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_SENDRECV, link, 2, wire) +
            codec_s(cluster, pc->method, message);
        packed->saving_s[s] = links->grad_s[s] - packed->packed_s[s];
        compressing = 1;
    }
    return compressing;
}

/* Which gradient sends compress (V x m: [v * m + mb] for virtual stage v's send of mb), as the
 * executor decides it under the plan's policy. */
static loom_status compressed_sends(const costing *k, const loom_pipe_shape *shape,
                                    const loom_pipe_stage_schedule *lists,
                                    const loom_prediction *out, const pipeline_links *links,
                                    const compressed_boundaries *packed, unsigned char *which) {
    int V = k->plan->num_stages, m = shape->micro_batches;
    switch (k->plan->pp_compression.policy) {
    case LOOM_PP_POLICY_ALL:
        memset(which, 1, (size_t)V * (size_t)m);
        return LOOM_OK;
    case LOOM_PP_POLICY_EPILOGUE: { /* each rank's cool-down sends, per chunk */
        unsigned char *cooldown = calloc((size_t)shape->chunks * (size_t)m + 1, 1);
        if (!cooldown) return loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
        for (int r = 0; r < shape->ranks; r++) {
            memset(cooldown, 0, (size_t)shape->chunks * (size_t)m);
            loom_pipe_cooldown_sends(&lists[r], shape->chunks, m, cooldown);
            for (int c = 0; c < shape->chunks; c++) {
                int v = loom_pipe_stage(shape, r, c);
                memcpy(which + (size_t)v * (size_t)m, cooldown + (size_t)c * (size_t)m, (size_t)m);
            }
        }
        free(cooldown);
        return LOOM_OK;
    }
    case LOOM_PP_POLICY_SLACK: { /* slack from the step simulated with every send uncompressed */
        stage_time_arrays arrays;
        loom_status st = stage_time_arrays_of(out, V, &arrays);
        if (st != LOOM_OK) return st;
        pipeline_links plain = {.act_s = links->act_s,
                                .grad_s = links->grad_s,
                                .act_recv_s = links->act_recv_s,
                                .grad_recv_s = links->grad_recv_s};
        loom_pipe_sim_times times = sim_times_of(&arrays, V, &plain);
        st = loom_pipe_slack_choose(shape, lists, &times, packed->saving_s, which);
        stage_time_arrays_free(&arrays);
        return st;
    }
    }
    return LOOM_OK;
}

/* One message (B, T, C) between neighbouring virtual stages each way, over its boundary's link
 * class; a backward send the plan compresses takes the compressor's wire plus encoding and
 * decoding. Which sends compress is the pipeline compressor's policy, decided per message as
 * the executor decides it: every send of a listed boundary ("all"), the sender's cool-down sends
 * ("epilogue"), or the sends whose simulated slack is below what compressing saves on their
 * boundary ("slack", from these same predicted times). On success *links is the caller's to
 * free (pipeline_links_free). */
static loom_status links_of(const costing *k, const loom_pipe_shape *shape,
                            const loom_pipe_stage_schedule *lists, const loom_prediction *out,
                            pipeline_links *links) {
    const loom_plan *plan = k->plan;
    int V = plan->num_stages, m = shape->micro_batches;
    size_t vm = (size_t)V * (size_t)m;
    double message = pp_message_bytes(k);
    links->act_s = zeroed_doubles((size_t)V), links->grad_s = zeroed_doubles((size_t)V);
    links->grad_mb_s = zeroed_doubles(vm), links->grad_bytes = zeroed_doubles(vm);
    links->act_recv_s = zeroed_doubles((size_t)V), links->grad_recv_s = zeroed_doubles((size_t)V);
    links->act_scattered = calloc((size_t)V, 1), links->grad_scattered = calloc((size_t)V, 1);
    compressed_boundaries packed = {zeroed_doubles((size_t)V), zeroed_doubles((size_t)V),
                                    zeroed_doubles((size_t)V)};
    unsigned char *which = calloc(vm + 1, 1); /* (V x m) the sends that compress */
    loom_status st = LOOM_OK;
    if (!links->act_s || !links->grad_s || !links->grad_mb_s || !links->grad_bytes ||
        !links->act_recv_s || !links->grad_recv_s || !links->act_scattered ||
        !links->grad_scattered || !packed.packed_s || !packed.packed_bytes || !packed.saving_s ||
        !which) {
        st = loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
    }
    if (st == LOOM_OK && boundary_transfers(k, message, links, &packed))
        st = compressed_sends(k, shape, lists, out, links, &packed, which);
    for (int v = 1; v < V && st == LOOM_OK; v++) {
        for (int mb = 0; mb < m; mb++) {
            size_t i = (size_t)v * (size_t)m + (size_t)mb;
            int packs = which[i] && packed.packed_bytes[v - 1] < message;
            links->grad_mb_s[i] = packs ? packed.packed_s[v - 1] : links->grad_s[v - 1];
            links->grad_bytes[i] = packs                          ? packed.packed_bytes[v - 1]
                                   : links->grad_scattered[v - 1] ? message / plan->tp
                                                                  : message;
        }
    }
    compressed_boundaries_free(&packed);
    free(which);
    if (st != LOOM_OK) pipeline_links_free(links);
    return st;
}

/* What every costing of a plan needs: a peak in the precision, and at most
 * LOOM_PREDICT_MAX_STAGES virtual stages (so at most that many ranks in a pipeline). */
static loom_status check_costable(const loom_plan *plan, const loom_cluster *cluster,
                                  loom_precision precision) {
    if (!(cluster->peak_flops[precision] > 0)) {
        return loom_fail(LOOM_ERR_INPUT, "cost model: the cluster \"%s\" has no %s peak",
                         cluster->name, loom_precision_name(precision));
    }
    if (plan->num_stages > LOOM_PREDICT_MAX_STAGES) {
        return loom_fail(LOOM_ERR_INPUT, "cost model: %d virtual stages, at most %d",
                         plan->num_stages, LOOM_PREDICT_MAX_STAGES);
    }
    return LOOM_OK;
}

/* The pipeline term: each virtual stage's recomputation as the schedule needs it, the messages'
 * links, and the simulated step (out's pipeline_s, bubble and pp_bytes). */
static loom_status pipeline_term(const costing *k, const loom_pipe_shape *shape,
                                 const loom_pipe_stage_schedule *lists, loom_trace **traces,
                                 loom_prediction *out) {
    recompute_as_scheduled(k->plan, shape, lists, out);
    pipeline_links links = {0};
    loom_status st = links_of(k, shape, lists, out, &links);
    if (st == LOOM_OK) st = simulate_pipeline(k, shape, lists, &links, traces, out);
    pipeline_links_free(&links);
    return st;
}

/* ---- after the pipeline: the data-parallel sync, the tied embedding, AdamW --------------- */

/* One pipeline rank's gradient sync over its DP group: the collectives' time, the codec's
 * (encoding and decoding: compute, never hidden), and the bytes each rank of the group sends. */
typedef struct {
    double sync_s, codec_s;
    double gather_s; /* of sync_s, uncompressed ZeRO-1's all-gather of the updated parameters:
                      * after AdamW, never behind a backward */
    int64_t bytes_per_rank;
} dp_sync;

/* A collective of the DP group on its link class: its time, and the (whole) bytes each rank
 * sends added to *bytes. */
static double dp_collective_s(const costing *k, loom_collective_op op, int dp_link, double buffer,
                              int64_t *bytes) {
    *bytes += (int64_t)loom_cluster_ring_bytes(op, k->plan->dp, buffer);
    return loom_cluster_collective_s(k->cluster, op, dp_link, k->plan->dp, buffer);
}

/* Pipeline rank r's sync of its fp32 gradients (`grads` bytes: loom's; the sync moves them):
 * an allreduce, or under ZeRO-1 a reduce-scatter and the updated parameters' all-gather. A rank
 * the plan's dp compressor lists sends the compressed wire instead (PowerSGD sums its factors
 * with allreduces; the other methods all-gather every replica's wire and decode each part), and
 * ZeRO-1's all-gather of the parameters stays uncompressed; the ranks it does not list sync as
 * they are. */
static dp_sync dp_sync_of(const costing *k, int r, double grads, int dp_link) {
    const loom_plan *plan = k->plan;
    dp_sync out = {0, 0, 0, 0};
    int zero1 = plan->zero >= 1, n = plan->dp;
    if (n <= 1) return out;
    if (plan->zero >= 2) { /* the stream's work (zero_stream): bytes only */
        double m = loom_plan_num_micro_batches(plan), weights = grads;
        double scatter = loom_cluster_ring_bytes(LOOM_COLLECTIVE_REDUCE_SCATTER, n, grads);
        double gather = loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLGATHER, n, weights);
        double gathers = plan->zero == 2 || plan->zero3_gather == LOOM_ZERO3_GATHER_STEP
                             ? 1
                             : 2 * m; /* before every forward and every backward */
        out.bytes_per_rank = (int64_t)(m * scatter + gathers * gather);
        return out;
    }
    loom_compress_method method = loom_plan_compresses_stage(&plan->dp_compression, r)
                                      ? plan->dp_compression.method
                                      : LOOM_COMPRESS_NONE;
    /* a call per bucket: every bucket after the first adds the collective's fixed cost */
    double buckets = buckets_of(k, grads);
    if (method == LOOM_COMPRESS_NONE && !zero1) {
        out.sync_s =
            dp_collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, dp_link, grads, &out.bytes_per_rank) +
            dp_calls_s(k, LOOM_COLLECTIVE_ALLREDUCE, 0.0, buckets) -
            dp_calls_s(k, LOOM_COLLECTIVE_ALLREDUCE, 0.0, 1);
    } else if (method == LOOM_COMPRESS_NONE) {
        /* the fp32 gradients reduce-scattered; the updated parameters all-gathered as the
         * forward computes with them: fp32 as loom trains, a 16-bit copy in mixed precision (as
         * Megatron-LM's distributed optimizer gathers them) */
        double weights = grads * k->bytes_per_value / 4.0;
        out.gather_s = dp_calls_s(k, LOOM_COLLECTIVE_ALLGATHER, weights, buckets);
        out.sync_s = dp_calls_s(k, LOOM_COLLECTIVE_REDUCE_SCATTER, grads, buckets) + out.gather_s;
        out.bytes_per_rank =
            (int64_t)(loom_cluster_ring_bytes(LOOM_COLLECTIVE_REDUCE_SCATTER, n, grads) +
                      loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLGATHER, n, weights));
    } else {
        loom_dp_traffic traffic = loom_plan_dp_traffic(plan, r);
        out.codec_s = codec_s(k->cluster, method, traffic.raw);
        if (method == LOOM_COMPRESS_POWERSGD) {
            out.sync_s = dp_collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, dp_link, traffic.wire,
                                         &out.bytes_per_rank);
        } else {
            out.sync_s = dp_collective_s(k, LOOM_COLLECTIVE_ALLGATHER, dp_link, traffic.wire * n,
                                         &out.bytes_per_rank);
            out.codec_s *= (1.0 + (n - 1) / 2.0); /* decoding dp - 1 more */
        }
        if (zero1) { /* the parameters' all-gather, uncompressed, as above */
            out.gather_s = dp_collective_s(k, LOOM_COLLECTIVE_ALLGATHER, dp_link,
                                           grads * k->bytes_per_value / 4.0, &out.bytes_per_rank);
            out.sync_s += out.gather_s;
        }
    }
    return out;
}

/* The tied embedding's gradient sum between the ranks of the first and the last virtual stage
 * (an allreduce of two over the pipeline's link class; none when one rank holds both): its
 * time, and every pair's bytes added to out->pp_bytes. */
static double tied_embedding_s(const costing *k, loom_prediction *out) {
    const loom_plan *plan = k->plan;
    /* an untied head (a Llama's) has no second copy to sum */
    if (plan->model.untied_head) return 0;
    if (plan->stages[0].rank == plan->stages[plan->num_stages - 1].rank) return 0;
    double wte = (double)(plan->model.padded_vocab_size / plan->tp) * plan->model.channels * 4;
    int64_t pairs = (int64_t)plan->dp * plan->tp;
    out->pp_bytes +=
        (int64_t)loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLREDUCE, 2, wte) * 2 * pairs;
    return loom_cluster_collective_s(k->cluster, LOOM_COLLECTIVE_ALLREDUCE,
                                     kind_link(plan, k->cluster, GROUP_PP), 2, wte);
}

/* When pipeline rank r's overlapped reduction (`reduce_s` for all its gradients) is done: each
 * chunk's share (by its gradient bytes) starts with the chunk's last backward of the step, after
 * the share before it, in the order the chunks get there. */
static double chunk_syncs_end_s(const costing *k, int r, double reduce_s) {
    const loom_plan *plan = k->plan;
    int order[LOOM_PREDICT_MAX_STAGES], n = 0;
    double bytes[LOOM_PREDICT_MAX_STAGES], total = 0;
    for (int v = 0; v < plan->num_stages; v++) {
        if (plan->stages[v].rank != r) continue;
        loom_gpt_stage_cost c;
        bytes[v] = loom_plan_stage_cost(plan, v, k->seq_len, &c) == LOOM_OK ? c.grad_bytes : 0;
        total += bytes[v];
        int at = n++; /* insertion by the time the chunk's last backward starts */
        while (at > 0 && k->last_backward_s[order[at - 1]] > k->last_backward_s[v]) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = v;
    }
    double free_s = 0;
    for (int i = 0; i < n; i++) {
        int v = order[i];
        double start = k->last_backward_s[v] > free_s ? k->last_backward_s[v] : free_s;
        free_s = start + (total > 0 ? reduce_s * bytes[v] / total : reduce_s / n);
    }
    return free_s;
}

/* Pipeline rank r's sync not hidden: its last backward (its chunk 0's: virtual stage r) hides
 * that much of the collectives unless the plan starts the buckets only after it; the codec and
 * the tied embedding's sum (on the ranks that hold it) are not hidden. */
static double dp_exposed_s(const costing *k, int r, const dp_sync *sync, double tied_s,
                           const loom_prediction *out) {
    const loom_plan *plan = k->plan;
    double hidden = plan->overlap_grad_reduce ? out->stage[r].backward_s : 0.0;
    double reduce = sync->sync_s - sync->gather_s; /* ZeRO-1's all-gather follows AdamW */
    double exposed = (reduce > hidden ? reduce - hidden : 0) + sync->gather_s + sync->codec_s;
    if (k->last_backward_s && sync->codec_s == 0) { /* uncompressed ZeRO-0/1, overlapped */
        double left = chunk_syncs_end_s(k, r, sync->sync_s - sync->gather_s) - out->pipeline_s;
        exposed = (left > 0 ? left : 0) + sync->gather_s;
    }
    if (k->dp_stream_end_s) { /* ZeRO-2/3: what the DP stream has left after the pipeline */
        double left = k->dp_stream_end_s[r] - out->pipeline_s;
        exposed = (left > 0 ? left : 0) + sync->codec_s;
    }
    int first_rank = plan->stages[0].rank, last_rank = plan->stages[plan->num_stages - 1].rank;
    if (r == first_rank || r == last_rank) exposed += tied_s;
    return exposed;
}

/* AdamW on a rank holding `weight_bytes` of fp32 parameters (ZeRO-1: updating a dp-th of them):
 * the cluster's measured parameters per second, or 28 bytes per parameter streamed (it reads
 * parameter, gradient and both moments and writes three of them back). */
static double optimizer_s(const costing *k, int64_t weight_bytes) {
    const loom_plan *plan = k->plan;
    double params = (double)weight_bytes / 4.0 / (plan->zero >= 1 && plan->dp > 1 ? plan->dp : 1);
    return k->cluster->optimizer_params_per_s > 0 ? params / k->cluster->optimizer_params_per_s
                                                  : params * 28.0 / k->cluster->memory_bandwidth;
}

/* The passes over a rank's gradients around AdamW, at the memory bandwidth: zeroing the buffer
 * it holds before the step's first backward (a write; under ZeRO-2/3 the shards) and their norm
 * for clipping (a read of the rank's range: a dp-th under ZeRO, else the whole). A measured
 * optimizer rate (loom profile) times the update alone, so these are charged either way. */
static double gradient_passes_s(const costing *k, const loom_rank_memory *mem,
                                const loom_rank_memory *whole) {
    const loom_plan *plan = k->plan;
    double normed = (double)whole->grads / (plan->zero >= 1 && plan->dp > 1 ? plan->dp : 1);
    return ((double)mem->grads + normed) / k->cluster->memory_bandwidth;
}

/* The part of the step after the pipeline, on the slowest pipeline rank: its sync not hidden,
 * then AdamW with its gradient passes (out's dp_exposed_s and optimizer_s, *after_s their sum);
 * every rank's memory peak
 * and sync bytes go into out too. */
static loom_status after_pipeline(const costing *k, const loom_pipe_stage_schedule *lists,
                                  loom_trace **traces, loom_prediction *out, double *after_s) {
    const loom_plan *plan = k->plan;
    loom_plan unsharded = *plan; /* the whole gradients and parameters the sync moves */
    unsharded.zero = 0;
    double tied_s = tied_embedding_s(k, out);
    *after_s = 0;
    for (int r = 0; r < plan->pp; r++) {
        loom_rank_memory mem, whole;
        int peak = loom_pipe_peak_in_flight(&lists[r]);
        loom_status st = loom_plan_rank_memory_at(plan, r, k->seq_len, peak, &mem);
        if (st == LOOM_OK) st = loom_plan_rank_memory_at(&unsharded, r, k->seq_len, peak, &whole);
        if (st != LOOM_OK) return st;
        if (mem.total > out->peak_bytes) out->peak_bytes = mem.total;
        dp_sync sync = dp_sync_of(k, r, (double)whole.grads, k->dp_link);
        out->dp_bytes += sync.bytes_per_rank * plan->dp * plan->tp;
        double exposed = dp_exposed_s(k, r, &sync, tied_s, out);
        double optimizer = optimizer_s(k, whole.weights) + gradient_passes_s(k, &mem, &whole);
        if (traces) { /* after the pipeline: the sync not hidden, then AdamW */
            double at = loom_trace_origin_us(traces[r]) + out->pipeline_s * 1e6;
            if (exposed > 0) {
                loom_trace_event(traces[r], LOOM_TRACE_DP, "gradient sync (exposed)", "dp", at,
                                 exposed * 1e6, 0, -1);
            }
            loom_trace_event(traces[r], LOOM_TRACE_COMPUTE, "optimizer", "compute",
                             at + exposed * 1e6, optimizer * 1e6, 0, -1);
        }
        if (exposed + optimizer > *after_s) {
            *after_s = exposed + optimizer;
            out->dp_exposed_s = exposed, out->optimizer_s = optimizer;
        }
    }
    return LOOM_OK;
}

/* The tensor-parallel allreduces' bytes over the step, summed over every rank: each virtual
 * stage's forward, backward and rerun-forward buffers, every micro-batch, in the activations'
 * precision. */
static loom_status tp_bytes_of(const costing *k, int64_t *tp_bytes) {
    const loom_plan *plan = k->plan;
    if (plan->tp <= 1) return LOOM_OK;
    /* the share of its buffers each rank sends, then times the buffers: the order every
     * prediction has been rounded in */
    double share = loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLREDUCE, plan->tp, 1.0);
    for (int s = 0; s < plan->num_stages; s++) {
        loom_gpt_stage_cost c;
        loom_status st = loom_plan_stage_cost(plan, s, k->seq_len, &c);
        if (st != LOOM_OK) return st;
        double shard_share = loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLGATHER, plan->tp, 1.0);
        double per_rank = share * (double)(c.tp_bytes_fwd + c.tp_bytes_bwd + c.tp_bytes_recompute) +
                          shard_share * (double)(c.tp_shard_bytes_fwd + c.tp_shard_bytes_bwd +
                                                 c.tp_shard_bytes_recompute);
        *tp_bytes +=
            (int64_t)(per_rank * k->bytes_per_value / 4.0 * loom_plan_num_micro_batches(plan)) *
            plan->tp * plan->dp;
    }
    return LOOM_OK;
}

/* The plan must fit the cluster's devices. */
static loom_status check_devices(const loom_plan *plan, const loom_cluster *cluster) {
    int64_t devices = (int64_t)cluster->max_nodes * cluster->devices_per_node;
    int64_t ranks = loom_plan_job_ranks(plan);
    if (ranks <= devices) return LOOM_OK;
    return loom_fail(LOOM_ERR_INPUT,
                     "cost model: the plan needs %sdp x tp x pp = %lld devices, the cluster "
                     "\"%s\" has %d nodes x %d = %lld",
                     plan->islands.count > 0 ? "islands x " : "", (long long)ranks, cluster->name,
                     cluster->max_nodes, cluster->devices_per_node, (long long)devices);
}

/* Step = the pipeline term + what follows it on the slowest rank (the sync not hidden, the tied
 * embedding's sum, AdamW); the traffic figures are counted along. */
static loom_status predict(const loom_plan *plan, const loom_cluster *cluster,
                           loom_precision precision, int seq_len, loom_trace **traces,
                           loom_prediction *out) {
    memset(out, 0, sizeof *out);
    loom_status st = check_devices(plan, cluster);
    if (st == LOOM_OK) st = check_costable(plan, cluster, precision);
    if (st != LOOM_OK) return st;
    costing k = costing_of(plan, cluster, precision, seq_len);
    double stream_end[LOOM_PREDICT_MAX_STAGES], last_backward[LOOM_PREDICT_MAX_STAGES];
    if (plan->zero >= 2 && plan->dp > 1) k.dp_stream_end_s = stream_end;
    if (plan->zero <= 1 && plan->dp > 1 && plan->overlap_grad_reduce)
        k.last_backward_s = last_backward;
    out->stages = plan->num_stages;
    for (int s = 0; s < plan->num_stages && st == LOOM_OK; s++) {
        st = stage_times(&k, s, seq_len, &out->stage[s]);
    }
    /* every rank's list once: the simulator's input and each rank's peak of activation sets */
    loom_pipe_shape shape;
    loom_pipe_stage_schedule *lists = calloc((size_t)plan->pp, sizeof *lists);
    if (st == LOOM_OK && !lists) st = loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
    if (st == LOOM_OK) st = loom_pipe_shape_of(plan, &shape);
    if (st == LOOM_OK) st = loom_pipe_schedule_build_all(&shape, lists);
    if (st == LOOM_OK) st = pipeline_term(&k, &shape, lists, traces, out);
    double after_s = 0;
    if (st == LOOM_OK) st = after_pipeline(&k, lists, traces, out, &after_s);
    if (st == LOOM_OK) st = tp_bytes_of(&k, &out->tp_bytes);
    for (int r = 0; lists && r < plan->pp; r++) loom_pipe_schedule_free(&lists[r]);
    free(lists);
    if (st != LOOM_OK) {
        memset(out, 0, sizeof *out);
        return st;
    }
    out->step_s = out->pipeline_s + after_s;
    st = loom_plan_outer_cost(plan, cluster, out->step_s, &out->outer);
    if (st != LOOM_OK) {
        memset(out, 0, sizeof *out);
        return st;
    }
    out->step_s += out->outer.exposed_s;
    int islands = loom_plan_num_islands(plan); /* every island's ranks send what one island's do */
    out->dp_bytes *= islands, out->tp_bytes *= islands, out->pp_bytes *= islands;
    out->tokens_per_s = out->step_s > 0 ? (double)plan->global_batch * seq_len / out->step_s : 0;
    return LOOM_OK;
}

/* ---- the stage DP's tables ------------------------------------------------------------- */

void loom_stage_problem_free(loom_stage_problem *p) {
    free(p->time), free(p->memory), free(p->per_flight), free(p->in_flight);
    memset(p, 0, sizeof *p);
}

/* A stage of class c with n layers under option o (1: recompute): time and memory, costed on a
 * copy of the plan whose stage `s` (of that class) holds n layers; INFINITY time when no stage
 * of that class can hold n. */
static loom_status cost_class(const costing *k, loom_plan *copy, int o, int c, int n,
                              loom_stage_problem *out) {
    int S = copy->num_stages, L = copy->model.num_layers;
    size_t i = ((size_t)o * LOOM_STAGE_CLASSES + (size_t)c) * (size_t)(L + 1) + (size_t)n;
    out->time[i] = INFINITY;
    int s = c == LOOM_STAGE_FIRST || c == LOOM_STAGE_ONLY ? 0 : c == LOOM_STAGE_LAST ? S - 1 : 1;
    /* the other S - 1 stages hold at least a layer each */
    int need = c == LOOM_STAGE_ONLY     ? S == 1 && n == L
               : c == LOOM_STAGE_MIDDLE ? S >= 3 && n <= L - (S - 1)
                                        : S >= 2 && n <= L - (S - 1);
    if (!need) return LOOM_OK;
    loom_plan_stage keep = copy->stages[s];
    copy->stages[s].first_layer = c == LOOM_STAGE_LAST ? L - n : c == LOOM_STAGE_MIDDLE ? 1 : 0;
    copy->stages[s].end_layer = copy->stages[s].first_layer + n;
    if (out->options > 1) copy->stages[s].recompute = loom_stage_option_recompute(o);
    loom_stage_times t;
    loom_rank_memory none, one;
    loom_status st = stage_times(k, s, k->seq_len, &t);
    if (st == LOOM_OK) st = loom_plan_rank_memory_at(copy, s, k->seq_len, 0, &none);
    if (st == LOOM_OK) st = loom_plan_rank_memory_at(copy, s, k->seq_len, 1, &one);
    copy->stages[s] = keep;
    if (st != LOOM_OK) return st;
    out->time[i] = t.forward_s + t.backward_s;
    out->memory[i] = none.total;
    out->per_flight[i] = one.total - none.total;
    return LOOM_OK;
}

loom_status loom_plan_stage_problem(const loom_plan *plan, const loom_cluster *cluster,
                                    loom_precision precision, int seq_len, int per_stage_recompute,
                                    loom_stage_problem *out) {
    memset(out, 0, sizeof *out);
    int S = plan->num_stages, L = plan->model.num_layers, chunked = plan->virtual_stages > 1;
    out->options = per_stage_recompute && !chunked ? 3 : 1;
    size_t cells = (size_t)out->options * LOOM_STAGE_CLASSES * (size_t)(L + 1);
    out->stages = S, out->layers = L;
    out->micro_batches = loom_plan_num_micro_batches(plan);
    out->memory_bytes = chunked ? INT64_MAX : cluster->memory_bytes;
    out->time = malloc(cells * sizeof *out->time);
    out->memory = calloc(cells, sizeof *out->memory);
    out->per_flight = calloc(cells, sizeof *out->per_flight);
    out->in_flight = calloc((size_t)S, sizeof *out->in_flight);
    /* a shallow copy: only its stage list is edited, and that is its own */
    loom_plan copy = *plan;
    copy.stages = malloc((size_t)S * sizeof *copy.stages);
    loom_pipe_shape shape;
    loom_pipe_stage_schedule *lists = calloc((size_t)S, sizeof *lists);
    if (!out->time || !out->memory || !out->per_flight || !out->in_flight || !copy.stages ||
        !lists) {
        free(lists), free(copy.stages);
        loom_stage_problem_free(out);
        return loom_fail(LOOM_ERR_NOMEM, "stage DP: out of memory");
    }
    memcpy(copy.stages, plan->stages, (size_t)S * sizeof *copy.stages);
    for (size_t i = 0; i < cells; i++) out->time[i] = INFINITY;
    loom_status st = loom_pipe_shape_of(plan, &shape);
    if (st == LOOM_OK) st = loom_pipe_schedule_build_all(&shape, lists);
    for (int s = 0; s < S && st == LOOM_OK; s++)
        out->in_flight[s] = loom_pipe_peak_in_flight(&lists[s]);
    costing k = costing_of(&copy, cluster, precision, seq_len);
    for (int o = 0; o < out->options && st == LOOM_OK; o++) {
        for (int c = 0; c < LOOM_STAGE_CLASSES && st == LOOM_OK; c++) {
            for (int n = 1; n <= L && st == LOOM_OK; n++) st = cost_class(&k, &copy, o, c, n, out);
        }
    }
    for (int s = 0; lists && s < S; s++) loom_pipe_schedule_free(&lists[s]);
    free(lists), free(copy.stages);
    if (st != LOOM_OK) loom_stage_problem_free(out);
    return st;
}

loom_status loom_plan_step_bound(const loom_plan *plan, const loom_cluster *cluster,
                                 loom_precision precision, int seq_len, double *bound_s,
                                 double *mean_s) {
    *bound_s = 0;
    if (mean_s) *mean_s = 0;
    loom_status checked = check_costable(plan, cluster, precision);
    if (checked != LOOM_OK) return checked;
    costing k = costing_of(plan, cluster, precision, seq_len);
    double busy[LOOM_PREDICT_MAX_STAGES] = {0};
    for (int s = 0; s < plan->num_stages; s++) {
        loom_stage_times t;
        loom_status st = stage_times(&k, s, seq_len, &t);
        if (st != LOOM_OK) return st;
        /* stage_times charges a rerun forward to the backward of a recomputing stage */
        busy[plan->stages[s].rank] += t.forward_s + t.backward_s - t.rerun_s;
    }
    double most = 0, total = 0;
    for (int r = 0; r < plan->pp; r++) most = busy[r] > most ? busy[r] : most, total += busy[r];
    *bound_s = most * loom_plan_num_micro_batches(plan);
    if (mean_s) *mean_s = total / plan->pp * loom_plan_num_micro_batches(plan);
    return LOOM_OK;
}

loom_status loom_plan_peak_memory(const loom_plan *plan, int seq_len, int *rank,
                                  loom_rank_memory *out) {
    memset(out, 0, sizeof *out);
    *rank = 0;
    loom_pipe_shape shape;
    loom_pipe_stage_schedule *lists = calloc((size_t)plan->pp, sizeof *lists);
    loom_status st = lists ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
    if (st == LOOM_OK) st = loom_pipe_shape_of(plan, &shape);
    if (st == LOOM_OK) st = loom_pipe_schedule_build_all(&shape, lists);
    for (int r = 0; r < plan->pp && st == LOOM_OK; r++) {
        loom_rank_memory mem;
        st = loom_plan_rank_memory_at(plan, r, seq_len, loom_pipe_peak_in_flight(&lists[r]), &mem);
        if (st == LOOM_OK && (r == 0 || mem.total > out->total)) *out = mem, *rank = r;
    }
    for (int r = 0; lists && r < plan->pp; r++) loom_pipe_schedule_free(&lists[r]);
    free(lists);
    return st;
}

loom_status loom_plan_predict(const loom_plan *plan, const loom_cluster *cluster,
                              loom_precision precision, int seq_len, loom_prediction *out) {
    return predict(plan, cluster, precision, seq_len, NULL, out);
}

loom_status loom_plan_predict_trace(const loom_plan *plan, const loom_cluster *cluster,
                                    loom_precision precision, int seq_len, const char *path,
                                    loom_prediction *out) {
    loom_trace **traces = calloc((size_t)plan->pp, sizeof(loom_trace *));
    loom_status st = traces ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
    for (int r = 0; r < plan->pp && st == LOOM_OK; r++) {
        st = loom_trace_create(&traces[r], r, (size_t)1 << 20);
    }
    if (st == LOOM_OK) st = predict(plan, cluster, precision, seq_len, traces, out);
    if (st == LOOM_OK) st = loom_trace_write_all(traces, plan->pp, path);
    for (int r = 0; traces && r < plan->pp; r++) loom_trace_free(traces[r]);
    free(traces);
    return st;
}
