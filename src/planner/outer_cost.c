/*
 * outer_cost.c — the cost model's price of island training's outer syncs (parallel/outer.c):
 * per fragment, each rank's range of the fragment's parameters (its stage's, divided by dp) summed
 * over the islands on the link between them (the cluster's island level, else inter_node): an
 * fp32 ring all-reduce; int8 and bf16 a reduce-scatter and an all-gather of the quantised wire;
 * PowerSGD its two all-reduces of factors (the 1-D tensors whole); top-k an all-gather of every
 * island's values and indices. A sync blocks its step, or,
 * with overlap_steps tau, shows only what tau inner steps do not cover; each fragment syncs
 * once every H steps, so a step carries the sum over fragments of that, divided by H, plus the
 * outer step's passes over the range at memory bandwidth. The slowest pipeline rank's is the
 * job's.
 */
#include "loom/planner.h"

#include <math.h>
#include <string.h>

/* Ring time of a collective over `n` ranks that sends `sent` bytes per rank in `steps` latency
 * steps and `calls` calls, on link l. */
static double ring_s(const loom_link *l, double sent, int steps, int calls) {
    return sent / l->bandwidth + steps * l->latency_s + calls * l->call_latency_s;
}

/* Seconds of one sync of `bytes` of fp32 outer gradient per rank (raw: what the ring moves per
 * rank uncompressed, for the byte counts), on link l among K islands. `matrix_wire` is PowerSGD's
 * factors or top-k's values and indices per rank (bytes) when they compress. */
static double sync_s(const loom_plan_islands *is, const loom_link *l, int K, double bytes,
                     double matrix_wire, double *sent) {
    double share = (double)(K - 1) / K;
    switch (is->compression) {
    case LOOM_COMPRESS_INT8:
    case LOOM_COMPRESS_BF16: {
        double wire =
            is->compression == LOOM_COMPRESS_INT8 ? bytes / 4 * (1 + 4.0 / 256) : bytes / 2;
        *sent = 2 * share * wire;
        return ring_s(l, *sent, 2 * (K - 1), 2);
    }
    case LOOM_COMPRESS_POWERSGD:
        *sent = 2 * share * matrix_wire;
        return ring_s(l, *sent, 4 * (K - 1), 2);
    case LOOM_COMPRESS_TOPK: /* every island's wire to every other */
        *sent = (K - 1) * matrix_wire;
        return ring_s(l, *sent, K - 1, 1);
    default:
        *sent = 2 * share * bytes;
        return ring_s(l, *sent, 2 * (K - 1), 1);
    }
}

/* Pipeline rank r's fragment pieces (fp32 bytes of its TP shard, before dp): the embeddings with
 * fragment 0, the final LayerNorm with the last, each local layer with its group. */
static void fragment_bytes(const loom_plan *plan, int r, double *bytes) {
    const loom_plan_islands *is = &plan->islands;
    loom_gpt_chunk chunks[LOOM_GPT_MAX_CHUNKS];
    int n = 0;
    for (int s = 0; s < plan->num_stages && n < LOOM_GPT_MAX_CHUNKS; s++) {
        const loom_plan_stage *st = &plan->stages[s];
        if (st->rank == r)
            chunks[n++] = (loom_gpt_chunk){st->first_layer, st->end_layer, st->embedding, st->head};
    }
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout_chunks(&plan->model, plan->tp, chunks, n, info);
    double layer = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        if (info[k].per_layer) layer += 4.0 * (double)info[k].layer_numel;
    }
    int F = is->fragments, L = plan->model.num_layers;
    for (int f = 0; f < F; f++) bytes[f] = 0;
    bytes[0] += 4.0 * (double)(info[LOOM_WTE].numel + info[LOOM_WPE].numel);
    bytes[F - 1] += 4.0 * (double)(info[LOOM_LNFW].numel + info[LOOM_LNFB].numel);
    for (int c = 0; c < n; c++) {
        for (int l = chunks[c].first_layer; l < chunks[c].end_layer; l++)
            bytes[(int64_t)l * F / L] += layer;
    }
}

loom_status loom_plan_outer_cost(const loom_plan *plan, const loom_cluster *cluster,
                                 double inner_step_s, loom_outer_cost *out) {
    memset(out, 0, sizeof *out);
    const loom_plan_islands *is = &plan->islands;
    int K = is->count;
    if (K < 1) return LOOM_OK;
    if (is->fragments > LOOM_PLAN_MAX_FRAGMENTS) {
        return loom_fail(LOOM_ERR_INPUT, "cost model: islands.fragments %d: at most %d priced",
                         is->fragments, LOOM_PLAN_MAX_FRAGMENTS);
    }
    const loom_link *l =
        cluster->island_nodes > 0 ? &cluster->island_link : &cluster->links[LOOM_LINK_INTER_NODE];
    const int matrix = loom_plan_islands_by_matrix(is);
    const int dp_link = matrix && plan->dp > 1 ? loom_plan_dp_link(plan, cluster) : 0;
    double worst = 0;
    for (int r = 0; r < plan->pp; r++) {
        double bytes[LOOM_PLAN_MAX_FRAGMENTS], all = 0;
        fragment_bytes(plan, r, bytes);
        for (int f = 0; f < is->fragments; f++) all += bytes[f];
        /* PowerSGD / top-k: their wire for the rank's matrices, a fragment's share of it, each
         * replica its dp-th of the fragment's matrices */
        double wire = 0;
        if (matrix) {
            loom_plan copy = *plan;
            loom_plan_compressor_init(&copy.dp_compression);
            copy.dp_compression.method = is->compression;
            copy.dp_compression.rank = is->compression_rank;
            copy.dp_compression.fraction = is->compression_fraction;
            copy.dp_compression.error_feedback = 1;
            wire = loom_plan_dp_traffic(&copy, r).wire;
        }
        double exposed = 0, total = 0, sent_step = 0;
        for (int f = 0; f < is->fragments; f++) {
            double range = bytes[f] / plan->dp, sent = 0;
            double share = all > 0 ? wire * bytes[f] / all / plan->dp : 0;
            double t = K > 1 ? sync_s(is, l, K, range, share, &sent) : 0;
            if (t > out->sync_s) out->sync_s = t;
            exposed += fmax(0.0, t - is->overlap_steps * inner_step_s);
            total += t;
            sent_step += sent;
            /* the outer step: start, momentum, delta (and sent) read and written once */
            exposed += 7.0 * range / cluster->memory_bandwidth;
            /* a matrix method at dp > 1: the island gathers the fragment's outer gradient before
             * the rounds and the shares' sums after them, blocking, inside the island */
            if (matrix && plan->dp > 1) {
                exposed += 2 * loom_cluster_collective_s(cluster, LOOM_COLLECTIVE_ALLGATHER,
                                                         dp_link, plan->dp, bytes[f]);
            }
        }
        if (exposed > worst) worst = exposed;
        if (r == 0 || total > out->total_s) out->total_s = total;
        /* the job's bytes per step: every rank of every island, each fragment once in H */
        out->bytes += (int64_t)(sent_step * plan->dp * plan->tp * K / is->inner_steps);
    }
    out->exposed_s = worst / is->inner_steps;
    return LOOM_OK;
}

/* ---- choosing H, fragments and overlap ----------------------------------------------------- */

loom_status loom_plan_choose_islands(loom_plan *plan, const loom_cluster *cluster,
                                     double inner_step_s, int max_inner_steps,
                                     loom_islands_choice *out) {
    memset(out, 0, sizeof *out);
    loom_plan_islands *is = &plan->islands;
    if (is->count < 2) {
        return loom_fail(LOOM_ERR_INPUT, "islands: expected at least 2 islands to plan, got %d",
                         is->count);
    }
    if (max_inner_steps < 1 || inner_step_s <= 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "islands: expected at least 1 inner step a round and a positive inner "
                         "step, got %d and %g s",
                         max_inner_steps, inner_step_s);
    }
    int L = plan->model.num_layers;
    double best_exposed = -1;
    loom_status st = LOOM_OK;
    for (int H = 1; H <= max_inner_steps && !out->hidden && st == LOOM_OK; H++) {
        for (int F = 1; F <= L && F <= H && F <= LOOM_PLAN_MAX_FRAGMENTS && st == LOOM_OK; F++) {
            is->inner_steps = H, is->fragments = F, is->overlap_steps = 0;
            loom_outer_cost c;
            st = loom_plan_outer_cost(plan, cluster, inner_step_s, &c);
            if (st != LOOM_OK) break;
            /* a sync lands before the next fragment's leaves (F syncs in a round never share the
             * link, as the cost model prices them), and within the round */
            int cap = H / F < H - 1 ? H / F : H - 1;
            double steps = c.sync_s / inner_step_s;
            int need = steps > cap ? cap + 1 : (int)ceil(steps - 1e-12);
            int hides = need <= cap;
            is->overlap_steps = hides ? need : cap;
            st = loom_plan_outer_cost(plan, cluster, inner_step_s, &c);
            if (st != LOOM_OK) break;
            /* hidden: the smallest H, then the fewest steps behind, then the fewest fragments;
             * else, at the largest H, the least exposed time */
            int better = hides ? !out->hidden || is->overlap_steps < out->overlap_steps
                               : !out->hidden && H == max_inner_steps &&
                                     (best_exposed < 0 || c.exposed_s < best_exposed);
            if (!better) continue;
            out->hidden = hides;
            out->inner_steps = H, out->fragments = F, out->overlap_steps = is->overlap_steps;
            out->cost = c;
            best_exposed = c.exposed_s;
        }
    }
    if (st != LOOM_OK) return st;
    is->inner_steps = out->inner_steps, is->fragments = out->fragments;
    is->overlap_steps = out->overlap_steps;
    return LOOM_OK;
}
