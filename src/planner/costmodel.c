/*
 * costmodel.c — what a plan costs on a cluster (loom/costmodel.h): memory per rank as the
 * runtime allocates it, and the step's time from the model's cost facts, the cluster's figures
 * and the schedule simulator. The rules are stated in the header.
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

/* The slowest class any group of that kind uses: 0 TP, 1 DP, 2 PP neighbours. */
static int kind_link(const loom_plan *plan, const loom_cluster *cl, int kind) {
    int worst = LOOM_LINK_INTRA_NODE, members[2];
    for (int r = 0; r < plan->dp * plan->tp * plan->pp; r++) {
        loom_plan_coords c = loom_plan_rank_coords(plan, r), d = c;
        if (kind == 0 && plan->tp > 1) d.tp_rank = (c.tp_rank + 1) % plan->tp;
        if (kind == 1 && plan->dp > 1) d.dp_rank = (c.dp_rank + 1) % plan->dp;
        if (kind == 2 && plan->pp > 1) d.pp_rank = (c.pp_rank + 1) % plan->pp;
        members[0] = r, members[1] = loom_plan_world_rank(plan, d);
        if (loom_plan_group_link(cl, members, 2) == LOOM_LINK_INTER_NODE)
            worst = LOOM_LINK_INTER_NODE;
    }
    return worst;
}

/* ---- time ------------------------------------------------------------------------------ */

typedef struct {
    const loom_plan *plan;
    const loom_cluster *cluster;
    loom_precision precision;
    int tp_link;
    double bytes_per_value; /* activations and gradients on the wire and in memory */
    int seq_len;
} costing;

static costing costing_of(const loom_plan *plan, const loom_cluster *cluster,
                          loom_precision precision, int seq_len) {
    costing k = {plan, cluster, precision, kind_link(plan, cluster, 0), 4.0, seq_len};
    if (precision != LOOM_PRECISION_FP32) k.bytes_per_value = 2.0;
    return k;
}

static double gemm_s(const costing *k, double flops, double typical) {
    double peak = k->cluster->peak_flops[k->precision];
    if (flops <= 0 || peak <= 0) return 0;
    return flops / (peak * loom_cluster_gemm_efficiency(k->cluster, typical));
}

static double tp_s(const costing *k, int64_t calls, int64_t bytes) {
    if (calls <= 0 || k->plan->tp <= 1) return 0;
    double per_call = (double)bytes / (double)calls * k->bytes_per_value / 4.0;
    return (double)calls * loom_cluster_collective_s(k->cluster, LOOM_COLLECTIVE_ALLREDUCE,
                                                     k->tp_link, k->plan->tp, per_call);
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
    loom_gpt_stage_cost c;
    loom_status st = loom_plan_stage_cost(k->plan, s, seq_len, &c);
    if (st != LOOM_OK) return st;
    const loom_plan_stage *stage = &k->plan->stages[s];
    int gemms = 4 * (stage->end_layer - stage->first_layer) + (stage->head ? 1 : 0);
    double typical = gemms > 0 ? (double)c.flops_fwd / gemms : (double)c.flops_fwd;
    /* memory-bound work: the activations the part writes, read and written once more */
    double memory =
        (double)c.act_slot_bytes * k->bytes_per_value / 4.0 * 2.0 / k->cluster->memory_bandwidth;
    t->tp_forward_s = tp_s(k, c.tp_allreduces_fwd, c.tp_bytes_fwd);
    t->tp_backward_s = tp_s(k, c.tp_allreduces_bwd, c.tp_bytes_bwd);
    /* and every GEMM call streams its weight operand from memory once (BLAS packs it; on a
     * GPU it is read from HBM): the forward and the input gradient, once per micro-batch */
    double weights =
        (double)c.param_bytes * k->bytes_per_value / 4.0 / k->cluster->memory_bandwidth;
    t->forward_s = gemm_s(k, (double)c.flops_fwd, typical) + memory + weights + t->tp_forward_s;
    t->backward_input_s =
        gemm_s(k, (double)c.flops_bwd_input, typical) + memory + weights + t->tp_backward_s;
    /* and the weight-gradient GEMMs accumulate into the fp32 gradients (beta 1): every
     * micro-batch reads and writes the gradients of the weights they produce once — not the
     * embedding's (its backward adds into the rows of the batch's tokens), but wte's again when
     * the stage's LM head multiplies by it */
    double accumulate =
        2.0 * (double)gemm_gradient_bytes(k->plan, s, &c) / k->cluster->memory_bandwidth;
    t->backward_weight_s = gemm_s(k, (double)c.flops_bwd_weight, typical) + memory / 2 + accumulate;
    t->backward_s = t->backward_input_s + t->backward_weight_s;
    if (c.flops_recompute > 0) { /* the rerun forward: before a whole backward, or before B and
                                  * again before W (the executor reruns it when another micro-
                                  * batch used the one activation set in between) */
        t->backward_s += t->forward_s;
        t->backward_input_s += t->forward_s, t->backward_weight_s += t->forward_s;
    }
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
        if (!plan->stages[s].recompute) continue;
        loom_stage_times *t = &out->stage[s];
        double f = t->forward_s, spare_b = f * (1.0 - (double)needs_b[s] / m);
        double spare_w = f * (1.0 - (double)needs_w[s] / m);
        t->backward_input_s -= spare_b, t->backward_weight_s -= spare_w;
        t->backward_s -= spare_b; /* a whole backward: one rerun at most, as B's */
    }
}

/* The pipeline's messages: per boundary s (virtual stages s and s + 1) the activation's and the
 * uncompressed gradient's transfer, and per gradient send (the sender's virtual stage v times m
 * plus the micro-batch) its transfer and bytes, compressed where the plan's policy says. */
typedef struct {
    double *act_s, *grad_s;         /* (V) */
    double *grad_mb_s, *grad_bytes; /* (V x m) */
} pipeline_links;

/* The stage times of out as the simulator's arrays (f, b, bi, bw: V each, allocated by the
 * caller) and links. */
static loom_pipe_sim_times sim_times_of(const loom_prediction *out, int V, double *f, double *b,
                                        double *bi, double *bw, const pipeline_links *links) {
    for (int s = 0; s < V; s++) {
        f[s] = out->stage[s].forward_s, b[s] = out->stage[s].backward_s;
        bi[s] = out->stage[s].backward_input_s, bw[s] = out->stage[s].backward_weight_s;
    }
    loom_pipe_sim_times times = {V,  V - 1,           f, b, links->act_s, links->grad_s, bi,
                                 bw, links->grad_mb_s};
    return times;
}

/* The pipeline part: every rank's list in the simulator, each message its link time; the
 * bubble is the mean idle share of the ranks. */
static loom_status simulate_pipeline(const costing *k, const loom_pipe_shape *shape,
                                     const loom_pipe_stage_schedule *lists,
                                     const pipeline_links *links, loom_trace **traces,
                                     loom_prediction *out) {
    const loom_plan *plan = k->plan;
    int V = plan->num_stages, p = plan->pp, m = shape->micro_batches;
    loom_status st = LOOM_OK;
    double *f = calloc((size_t)V * 4 + 1, sizeof(double));
    if (!f) return loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
    loom_pipe_sim_times times = sim_times_of(out, V, f, f + V, f + 2 * V, f + 3 * V, links);
    loom_pipe_sim_result result;
    if (st == LOOM_OK) st = loom_pipe_simulate(shape, lists, &times, &result);
    if (st == LOOM_OK && traces) record_pipeline(shape, lists, &result, traces);
    if (st == LOOM_OK) {
        out->pipeline_s = result.makespan_s;
        double idle = 0;
        for (int r = 0; r < p; r++) {
            double busy = 0;
            for (int i = 0; i < lists[r].count; i++) {
                loom_pipe_op op = lists[r].actions[i].op;
                if (op == LOOM_PIPE_FORWARD || op == LOOM_PIPE_BACKWARD ||
                    op == LOOM_PIPE_BACKWARD_INPUT || op == LOOM_PIPE_BACKWARD_WEIGHT)
                    busy += result.stage[r][i].end_s - result.stage[r][i].start_s;
            }
            idle += result.makespan_s > 0 ? 1 - busy / result.makespan_s : 0;
        }
        out->bubble = idle / p;
        /* every message crosses once: activations forward, gradients backward (compressed
         * where the plan says) */
        int64_t message = (int64_t)plan->micro_batch * k->seq_len * plan->model.channels *
                          (int64_t)k->bytes_per_value;
        for (int r = 0; r < p; r++) {
            for (int i = 0; i < lists[r].count; i++) {
                const loom_pipe_action *a = &lists[r].actions[i];
                if (a->op == LOOM_PIPE_SEND_ACT) out->pp_bytes += message;
                if (a->op == LOOM_PIPE_SEND_GRAD) {
                    int v = loom_pipe_stage(shape, r, a->chunk); /* into v - 1 */
                    out->pp_bytes +=
                        v > 0 && a->micro_batch < m
                            ? (int64_t)
                                  links->grad_bytes[(size_t)v * (size_t)m + (size_t)a->micro_batch]
                            : message;
                }
            }
        }
        out->pp_bytes *= (int64_t)plan->dp * plan->tp;
        loom_pipe_sim_result_free(&result);
    }
    free(f);
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

/* One message (B, T, C) between neighbouring virtual stages each way, over its boundary's link
 * class; a backward send the plan compresses takes the compressor's wire plus encoding and
 * decoding. Which sends compress is the pipeline compressor's policy, as the executor decides
 * it: every send of a listed boundary ("all"), the sender's cool-down sends ("epilogue"), or
 * the sends whose simulated slack is below what compressing saves on their boundary ("slack",
 * from these same predicted times). */
static loom_status links_of(const costing *k, const loom_pipe_shape *shape,
                            const loom_pipe_stage_schedule *lists, const loom_prediction *out,
                            pipeline_links *links) {
    const loom_plan *plan = k->plan;
    const loom_cluster *cluster = k->cluster;
    int V = plan->num_stages, m = shape->micro_batches;
    size_t vm = (size_t)V * (size_t)m;
    links->act_s = calloc((size_t)V * 9 + 2 * vm + 1, sizeof(double));
    unsigned char *which = calloc(vm + (size_t)shape->chunks * (size_t)m + 1, 1);
    if (!links->act_s || !which) {
        free(which);
        return loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
    }
    links->grad_s = links->act_s + V;
    double *packed = links->grad_s + V, *packed_bytes = packed + V, *saving = packed_bytes + V;
    double *f = saving + V;
    links->grad_mb_s = f + 4 * V; /* after the four stage-time arrays */
    links->grad_bytes = links->grad_mb_s + vm;
    int64_t rows = (int64_t)plan->micro_batch * k->seq_len;
    double message = (double)rows * plan->model.channels * k->bytes_per_value;
    const loom_plan_compressor *pc = &plan->pp_compression;
    loom_compress_method method = pc->method;
    int compressing = 0, pairs = 0, pair[2 * LOOM_PREDICT_MAX_STAGES][3]; /* (a, b, class) */
    for (int s = 0; s + 1 < V; s++) {
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
        links->act_s[s] =
            loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_SENDRECV, link, 2, message);
        links->grad_s[s] = packed[s] = links->act_s[s], packed_bytes[s] = message;
        if (method == LOOM_COMPRESS_NONE || !loom_plan_compresses_stage(pc, s)) continue;
        double state,
            wire = loom_plan_compressor_wire(pc, method, rows, plan->model.channels, &state);
        wire *= k->bytes_per_value / 4.0;
        if (wire >= message) continue; /* the executor sends it as it is */
        packed_bytes[s] = wire;
        packed[s] = loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_SENDRECV, link, 2, wire) +
                    codec_s(cluster, method, message);
        saving[s] = links->grad_s[s] - packed[s];
        compressing = 1;
    }
    loom_status st = LOOM_OK;
    if (compressing && pc->policy == LOOM_PP_POLICY_SLACK) {
        double *t = f; /* the four stage-time arrays, V each */
        pipeline_links plain = {links->act_s, links->grad_s, NULL, NULL};
        loom_pipe_sim_times times = sim_times_of(out, V, t, t + V, t + 2 * V, t + 3 * V, &plain);
        st = loom_pipe_slack_choose(shape, lists, &times, saving, which);
    } else if (compressing && pc->policy == LOOM_PP_POLICY_EPILOGUE) {
        unsigned char *cool = which + vm;
        for (int r = 0; r < shape->ranks; r++) {
            memset(cool, 0, (size_t)shape->chunks * (size_t)m);
            loom_pipe_cooldown_sends(&lists[r], shape->chunks, m, cool);
            for (int c = 0; c < shape->chunks; c++) {
                int v = loom_pipe_stage(shape, r, c);
                memcpy(which + (size_t)v * (size_t)m, cool + (size_t)c * (size_t)m, (size_t)m);
            }
        }
    } else if (compressing) {
        memset(which, 1, vm);
    }
    for (int v = 1; v < V; v++) {
        for (int mb = 0; mb < m; mb++) {
            size_t i = (size_t)v * (size_t)m + (size_t)mb;
            int packs = which[i] && packed_bytes[v - 1] < message;
            links->grad_mb_s[i] = packs ? packed[v - 1] : links->grad_s[v - 1];
            links->grad_bytes[i] = packs ? packed_bytes[v - 1] : message;
        }
    }
    free(which);
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

static loom_status predict(const loom_plan *plan, const loom_cluster *cluster,
                           loom_precision precision, int seq_len, loom_trace **traces,
                           loom_prediction *out) {
    memset(out, 0, sizeof *out);
    int zero1 = plan->zero >= 1;
    int64_t devices = (int64_t)cluster->max_nodes * cluster->devices_per_node;
    int64_t ranks = (int64_t)plan->dp * plan->tp * plan->pp;
    if (ranks > devices) {
        return loom_fail(LOOM_ERR_INPUT,
                         "cost model: the plan needs dp x tp x pp = %lld devices, the cluster "
                         "\"%s\" has %d nodes x %d = %lld",
                         (long long)ranks, cluster->name, cluster->max_nodes,
                         cluster->devices_per_node, (long long)devices);
    }
    loom_status checked = check_costable(plan, cluster, precision);
    if (checked != LOOM_OK) return checked;
    costing k = costing_of(plan, cluster, precision, seq_len);
    out->stages = plan->num_stages;
    loom_status st = LOOM_OK;
    for (int s = 0; s < plan->num_stages && st == LOOM_OK; s++) {
        st = stage_times(&k, s, seq_len, &out->stage[s]);
    }
    /* every rank's list once: the simulator's input and each rank's peak of activation sets */
    loom_pipe_shape shape;
    loom_pipe_stage_schedule *lists = calloc((size_t)plan->pp, sizeof *lists);
    if (st == LOOM_OK && !lists) st = loom_fail(LOOM_ERR_NOMEM, "cost model: out of memory");
    if (st == LOOM_OK) st = loom_pipe_shape_of(plan, &shape);
    if (st == LOOM_OK) st = loom_pipe_schedule_build_all(&shape, lists);
    if (st == LOOM_OK) recompute_as_scheduled(plan, &shape, lists, out);
    pipeline_links links = {NULL, NULL, NULL, NULL};
    if (st == LOOM_OK) st = links_of(&k, &shape, lists, out, &links);
    if (st == LOOM_OK) st = simulate_pipeline(&k, &shape, lists, &links, traces, out);
    free(links.act_s);
    /* after the pipeline: each rank's DP sync (what its last backward did not hide), the tied
     * embedding's sum between the ranks of the first and the last virtual stage (none when one
     * rank holds both), and AdamW */
    int dp_link = kind_link(plan, cluster, 1);
    int first_rank = plan->stages[0].rank, last_rank = plan->stages[plan->num_stages - 1].rank;
    double wte = (double)(plan->model.padded_vocab_size / plan->tp) * plan->model.channels * 4;
    double tied = first_rank != last_rank
                      ? loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_ALLREDUCE,
                                                  kind_link(plan, cluster, 2), 2, wte)
                      : 0.0;
    if (tied > 0) out->pp_bytes += (int64_t)wte * 2 * plan->dp * plan->tp;
    double after = 0;
    for (int r = 0; r < plan->pp && st == LOOM_OK; r++) {
        loom_rank_memory mem;
        st = loom_plan_rank_memory_at(plan, r, seq_len, loom_pipe_peak_in_flight(&lists[r]), &mem);
        if (st != LOOM_OK) break;
        if (mem.total > out->peak_bytes) out->peak_bytes = mem.total;
        double grads = (double)mem.grads; /* fp32 gradients: loom's; the sync moves them */
        double sync = 0, codec = 0;
        /* the pipeline ranks the plan does not list sync as they are */
        loom_compress_method dp_method = loom_plan_compresses_stage(&plan->dp_compression, r)
                                             ? plan->dp_compression.method
                                             : LOOM_COMPRESS_NONE;
        if (plan->dp > 1 && dp_method != LOOM_COMPRESS_NONE) {
            /* PowerSGD sums its factors (two allreduces); the others are all-gathered, and every
             * replica's part decoded */
            loom_dp_traffic traffic = loom_plan_dp_traffic(plan, r);
            codec = codec_s(cluster, dp_method, traffic.raw);
            if (dp_method == LOOM_COMPRESS_POWERSGD) {
                sync = loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_ALLREDUCE, dp_link,
                                                 plan->dp, traffic.wire);
                out->dp_bytes +=
                    (int64_t)(2.0 * traffic.wire * (plan->dp - 1) / plan->dp) * plan->dp * plan->tp;
            } else {
                sync = loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_ALLGATHER, dp_link,
                                                 plan->dp, traffic.wire * plan->dp);
                codec *= (1.0 + (plan->dp - 1) / 2.0); /* decoding dp - 1 more */
                out->dp_bytes += (int64_t)(traffic.wire * (plan->dp - 1)) * plan->dp * plan->tp;
            }
            if (zero1) { /* the parameters' all-gather is not compressed */
                sync += loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_ALLGATHER, dp_link,
                                                  plan->dp, grads);
                out->dp_bytes += (int64_t)(grads * (plan->dp - 1) / plan->dp) * plan->dp * plan->tp;
            }
        } else if (plan->dp > 1) {
            if (zero1) {
                sync = loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_REDUCE_SCATTER, dp_link,
                                                 plan->dp, grads) +
                       loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_ALLGATHER, dp_link,
                                                 plan->dp, grads);
                out->dp_bytes +=
                    (int64_t)(2.0 * grads * (plan->dp - 1) / plan->dp) * plan->dp * plan->tp;
            } else {
                sync = loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_ALLREDUCE, dp_link,
                                                 plan->dp, grads);
                out->dp_bytes +=
                    (int64_t)(2.0 * grads * (plan->dp - 1) / plan->dp) * plan->dp * plan->tp;
            }
        }
        /* the rank's last backward (its chunk 0's: virtual stage r) hides that much sync, unless
         * the plan starts the buckets only after it */
        double hidden = plan->overlap_grad_reduce ? out->stage[r].backward_s : 0.0;
        double exposed = (sync > hidden ? sync - hidden : 0) + codec; /* the codec computes */
        if (r == first_rank || r == last_rank) exposed += tied;
        /* AdamW: measured parameters per second, or 28 bytes per parameter streamed (it reads
         * parameter, gradient and both moments and writes three of them back) */
        double params = (double)mem.weights / 4.0 / (zero1 && plan->dp > 1 ? plan->dp : 1);
        double optimizer = cluster->optimizer_params_per_s > 0
                               ? params / cluster->optimizer_params_per_s
                               : params * 28.0 / cluster->memory_bandwidth;
        if (traces) { /* after the pipeline: the sync not hidden, then AdamW */
            double at = loom_trace_origin_us(traces[r]) + out->pipeline_s * 1e6;
            if (exposed > 0) {
                loom_trace_event(traces[r], LOOM_TRACE_DP, "gradient sync (exposed)", "dp", at,
                                 exposed * 1e6, 0, -1);
            }
            loom_trace_event(traces[r], LOOM_TRACE_COMPUTE, "optimizer", "compute",
                             at + exposed * 1e6, optimizer * 1e6, 0, -1);
        }
        if (exposed + optimizer > after) {
            after = exposed + optimizer;
            out->dp_exposed_s = exposed, out->optimizer_s = optimizer;
        }
    }
    for (int s = 0; s < plan->num_stages && st == LOOM_OK; s++) {
        loom_gpt_stage_cost c;
        st = loom_plan_stage_cost(plan, s, seq_len, &c);
        if (st == LOOM_OK && plan->tp > 1) {
            double per_rank = 2.0 * (plan->tp - 1) / plan->tp *
                              (double)(c.tp_bytes_fwd + c.tp_bytes_bwd + c.tp_bytes_recompute);
            out->tp_bytes +=
                (int64_t)(per_rank * k.bytes_per_value / 4.0 * loom_plan_num_micro_batches(plan)) *
                plan->tp * plan->dp;
        }
    }
    for (int r = 0; lists && r < plan->pp; r++) loom_pipe_schedule_free(&lists[r]);
    free(lists);
    if (st != LOOM_OK) {
        memset(out, 0, sizeof *out);
        return st;
    }
    out->step_s = out->pipeline_s + after;
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
    if (out->options > 1) copy->stages[s].recompute = o;
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
    out->options = per_stage_recompute && !chunked ? 2 : 1;
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
        double rerun = plan->stages[s].recompute ? t.forward_s : 0;
        busy[plan->stages[s].rank] += t.forward_s + t.backward_s - rerun;
    }
    double most = 0, total = 0;
    for (int r = 0; r < plan->pp; r++) most = busy[r] > most ? busy[r] : most, total += busy[r];
    *bound_s = most * loom_plan_num_micro_batches(plan);
    if (mean_s) *mean_s = total / plan->pp * loom_plan_num_micro_batches(plan);
    return LOOM_OK;
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
