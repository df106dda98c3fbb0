/*
 * memory.c — what one rank of a plan holds, in bytes, as the runtime allocates it (weights,
 * gradients, AdamW's moments, the activation sets the schedule keeps in flight, backward
 * scratch, the compressors' state), and what the data-parallel gradient sync sends per step.
 * Here, below the planner, because both read it: `loom train` refuses a run that cannot fit
 * before allocating (train/memory.c), and the planner's cost model charges the same figures.
 *
 * Not here: time (the planner's cost model), the machine's memory (base/sys.c).
 */
#include "parallel/parallel_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int splits_backward(const loom_plan *plan) {
    return plan->schedule == LOOM_SCHEDULE_ZB_H1 || plan->schedule == LOOM_SCHEDULE_ZB_V;
}

/* ---- compression ------------------------------------------------------------------------
 * What the plan's compressors send and keep, by the formulas of loom/compress.h over the
 * matrices the runtime hands them (2-D weights one layer at a time, everything else a row). */

/* Wire bytes of one (rows x cols) matrix under a method (rank r, top-k fraction f); *state gets
 * the bytes of state it keeps (committed and working copies: the error-feedback residual, the
 * warm-start factor). */
double loom_plan_compressor_wire(const loom_plan_compressor *c, loom_compress_method method,
                                 int64_t rows, int64_t cols, double *state) {
    double n = (double)rows * (double)cols;
    int64_t r = c->rank < rows ? c->rank : rows;
    if (r > cols) r = cols;
    int lossy = method != LOOM_COMPRESS_NONE && c->error_feedback;
    *state = 0;
    switch (method) {
    case LOOM_COMPRESS_POWERSGD:
    case LOOM_COMPRESS_LOWRANK:
        if (rows < 2 || (double)r * (double)(rows + cols) >= 0.5 * n) return 4 * n;
        *state = 2 * 4 * ((lossy ? n : 0) + (double)cols * (double)r);
        return 4 * (double)r * (double)(rows + cols);
    case LOOM_COMPRESS_TOPK: {
        double k = ceil(c->fraction * n * (1 - 1e-9));
        *state = lossy ? 2 * 4 * n : 0;
        return 8 * (k < 1 ? 1 : k);
    }
    case LOOM_COMPRESS_SIGN:
        *state = 2 * 4 * n;
        return 4 + ceil(n / 8);
    case LOOM_COMPRESS_INT8:
        *state = lossy ? 2 * 4 * n : 0;
        return 4 * ceil(n / 256) + n;
    case LOOM_COMPRESS_BF16:
        *state = lossy ? 2 * 4 * n : 0;
        return 2 * n;
    default:
        return 4 * n;
    }
}

loom_dp_traffic loom_plan_dp_traffic(const loom_plan *plan, int pp_rank) {
    loom_dp_traffic t = {0, 0, 0};
    loom_gpt_chunk chunks[LOOM_GPT_MAX_CHUNKS];
    int n = 0;
    for (int s = 0; s < plan->num_stages && n < LOOM_GPT_MAX_CHUNKS; s++) {
        const loom_plan_stage *st = &plan->stages[s];
        if (st->rank != pp_rank) continue;
        chunks[n++] = (loom_gpt_chunk){st->first_layer, st->end_layer, st->embedding, st->head};
    }
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout_chunks(&plan->model, plan->tp, chunks, n, info);
    const loom_plan_compressor *c = &plan->dp_compression;
    loom_compress_method method =
        loom_plan_compresses_stage(c, pp_rank) ? c->method : LOOM_COMPRESS_NONE;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &info[k];
        if (ti->numel == 0) continue;
        int dims = ti->per_layer ? ti->ndim - 1 : ti->ndim;
        /* as the runtime's buckets hand them: qkvw as its Q, K and V row blocks */
        int parts = dims == 2 ? loom_gpt_matrix_parts(k) : 1;
        int64_t count = (ti->per_layer ? ti->shape[0] : 1) * parts;
        int64_t rows = dims == 2 ? ti->shape[ti->ndim - 2] / parts : 1;
        int64_t cols = dims == 2 ? ti->shape[ti->ndim - 1] : ti->layer_numel;
        double state, wire = loom_plan_compressor_wire(c, method, rows, cols, &state);
        double raw = 4.0 * (double)rows * (double)cols * (double)count;
        t.wire += wire * (double)count, t.state += state * (double)count;
        if (wire * (double)count < raw) t.raw += raw;
    }
    return t;
}

/* The stage's cost facts for one micro-batch (in_flight 1), under recomputation mode
 * `recompute` (LOOM_RECOMPUTE_*). */
loom_status loom_plan_stage_cost_as(const loom_plan *plan, int s, int seq_len, int recompute,
                                    loom_gpt_stage_cost *c) {
    const loom_plan_stage *st = &plan->stages[s];
    loom_gpt_stage_spec spec = {plan->tp,
                                st->first_layer,
                                st->end_layer,
                                st->embedding,
                                st->head,
                                plan->micro_batch,
                                seq_len,
                                1,
                                loom_recompute_full(recompute),
                                recompute == LOOM_RECOMPUTE_SELECTIVE,
                                plan->sequence_parallel};
    return loom_gpt_cost_stage(&plan->model, &spec, c);
}

loom_status loom_plan_stage_cost(const loom_plan *plan, int s, int seq_len,
                                 loom_gpt_stage_cost *c) {
    return loom_plan_stage_cost_as(plan, s, seq_len, plan->stages[s].recompute, c);
}

/* ---- ZeRO-2 and ZeRO-3 -------------------------------------------------------------------
 * The units ZeRO-3 gathers and ZeRO-2/3 reduce-scatter one at a time: each transformer block,
 * the embedding (wte and wpe) and the head (the final LayerNorm and the tied wte it multiplies
 * by: gathered for the head even on a rank whose embedding also holds it). */

/* Bytes of the `k` largest units of pipeline rank pp_rank's chunks together (fp32, this TP
 * rank's shard of each unit before the DP sharding): what k units in flight hold at most. */
int64_t loom_plan_zero_unit_bytes(const loom_plan *plan, int pp_rank, int k) {
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout_tp(&plan->model, plan->tp, info);
    int64_t block = (int64_t)info[LOOM_LN1W].layer_stride * 4;
    int64_t embedding = (info[LOOM_WTE].numel + info[LOOM_WPE].numel) * 4;
    int64_t head = (info[LOOM_WTE].numel + info[LOOM_LNFW].numel + info[LOOM_LNFB].numel) * 4;
    int64_t blocks = 0, ends[2] = {0, 0}; /* the embedding's and the head's units */
    for (int s = 0; s < plan->num_stages; s++) {
        const loom_plan_stage *st = &plan->stages[s];
        if (st->rank != pp_rank) continue;
        blocks += st->end_layer - st->first_layer;
        if (st->embedding) ends[0] = embedding;
        if (st->head) ends[1] = head;
    }
    if (ends[0] < ends[1]) { /* the larger end unit first */
        int64_t larger = ends[1];
        ends[1] = ends[0], ends[0] = larger;
    }
    /* the largest units first: an end unit while it is larger than a block, then blocks */
    int64_t total = 0;
    for (int e = 0; k > 0; k--) {
        if (e < 2 && ends[e] > 0 && (blocks == 0 || ends[e] > block)) {
            total += ends[e++];
        } else if (blocks > 0) {
            total += block, blocks--;
        } else {
            break;
        }
    }
    return total;
}

/* What ZeRO shards over the data-parallel group (optimizer from stage 1, gradients from 2,
 * parameters from 3) and the buffers it adds: stage 1's reduce-scatter ring receives into
 * buffers of one gradient's worth (scratch); from stage 2 the backward writes each unit's
 * gradient whole into a unit-sized bucket that is reduce-scattered and freed, one being
 * filled while the previous one is reduced (two in flight: scratch); stage 3 gathers a unit's
 * parameters into a buffer before use, zero3_prefetch units ahead of the one computing
 * (prefetch + 1 in flight: gathered), or, gathering once per step, keeps every unit gathered
 * (the whole stage's parameters). */
static void zero_shard(const loom_plan *plan, int pp_rank, loom_rank_memory *out) {
    int64_t dp = plan->dp;
    if (plan->zero < 1 || dp <= 1) return;
    int64_t full_grads = out->grads;
    out->optimizer /= dp;
    if (plan->zero == 1) {
        out->scratch += full_grads;
        return;
    }
    out->grads = full_grads / dp;
    out->scratch += loom_plan_zero_unit_bytes(plan, pp_rank, LOOM_ZERO_GRAD_UNITS_IN_FLIGHT);
    if (plan->zero < 3) return;
    int64_t full_weights = out->weights;
    out->weights = full_weights / dp;
    out->gathered = plan->zero3_gather == LOOM_ZERO3_GATHER_STEP
                        ? full_weights
                        : loom_plan_zero_unit_bytes(plan, pp_rank, plan->zero3_prefetch + 1);
}

loom_status loom_plan_rank_memory_at(const loom_plan *plan, int pp_rank, int seq_len, int peak,
                                     loom_rank_memory *out) {
    memset(out, 0, sizeof *out);
    int split = splits_backward(plan);
    out->in_flight = peak;
    int64_t slot = 0, input = 0, kept = 0;
    int embedding = 0, head = 0, recompute = 0;
    for (int s = 0; s < plan->num_stages; s++) {
        if (plan->stages[s].rank != pp_rank) continue;
        loom_gpt_stage_cost c;
        loom_status st = loom_plan_stage_cost(plan, s, seq_len, &c);
        if (st != LOOM_OK) return st;
        recompute = loom_recompute_full(plan->stages[s].recompute);
        out->weights += c.param_bytes, out->grads += c.grad_bytes;
        out->optimizer += c.optimizer_bytes;
        int64_t chunk_slot = c.act_slot_bytes + (split ? c.act_slot_split_bytes : 0);
        if (chunk_slot > slot) slot = chunk_slot;
        if (c.act_bytes_recompute - c.act_slot_bytes > input)
            input = c.act_bytes_recompute - c.act_slot_bytes;
        if (c.grad_scratch_bytes > out->scratch) out->scratch = c.grad_scratch_bytes;
        if (split && c.act_slot_split_bytes > kept) kept = c.act_slot_split_bytes;
        /* a chunk with the embedding and another with the head each count wte */
        embedding |= plan->stages[s].embedding && !plan->stages[s].head;
        head |= plan->stages[s].head && !plan->stages[s].embedding;
    }
    const loom_gpt_config *m = &plan->model;
    if (embedding && head) { /* one wte: its parameters, gradients and two moments once */
        int64_t wte = (int64_t)(m->padded_vocab_size / plan->tp) * m->channels * 4;
        out->weights -= wte, out->grads -= wte, out->optimizer -= 2 * wte;
    }
    zero_shard(plan, pp_rank, out);
    /* compressor state: DP's per rank, and a compressing pipeline link's sender's lazy error */
    if (plan->dp > 1 && plan->dp_compression.method != LOOM_COMPRESS_NONE)
        out->compressor += (int64_t)loom_plan_dp_traffic(plan, pp_rank).state;
    const loom_plan_compressor *pc = &plan->pp_compression;
    for (int s = 1; s < plan->num_stages && pc->method != LOOM_COMPRESS_NONE; s++) {
        if (plan->stages[s].rank != pp_rank || !loom_plan_compresses_stage(pc, s - 1)) continue;
        double state;
        loom_plan_compressor_wire(pc, pc->method, (int64_t)plan->micro_batch * seq_len,
                                  plan->model.channels, &state);
        out->compressor += (int64_t)state;
    }
    /* recomputation keeps one set, each micro-batch's input, and under split backward what B
     * leaves for W (the head's logit gradient aside) */
    out->activations = recompute ? slot + (input + kept) * out->in_flight : slot * out->in_flight;
    out->total = out->weights + out->grads + out->optimizer + out->gathered + out->activations +
                 out->scratch + out->compressor;
    return LOOM_OK;
}

loom_status loom_plan_rank_memory(const loom_plan *plan, int pp_rank, int seq_len,
                                  loom_rank_memory *out) {
    return loom_plan_rank_memory_at(plan, pp_rank, seq_len,
                                    loom_pipeline_peak_in_flight(plan, pp_rank), out);
}

int loom_rank_memory_why(const loom_rank_memory *m, int64_t device_bytes, char *text, size_t cap) {
    text[0] = '\0';
    if (device_bytes <= 0 || m->total <= device_bytes) return 0;
    const char *names[] = {"weights",     "gradients", "optimizer", "gathered",
                           "activations", "scratch",   "compressor"};
    const int64_t sizes[] = {m->weights,     m->grads,   m->optimizer, m->gathered,
                             m->activations, m->scratch, m->compressor};
    int first = 0, second = -1;
    for (int i = 1; i < 7; i++) {
        if (sizes[i] > sizes[first]) {
            second = first, first = i;
        } else if (second < 0 || sizes[i] > sizes[second]) {
            second = i;
        }
    }
    const double gib = 1073741824.0;
    size_t used =
        (size_t)snprintf(text, cap, "%.2f GiB over the device's %.2f GiB; most: %s %.2f GiB",
                         (double)(m->total - device_bytes) / gib, (double)device_bytes / gib,
                         names[first], (double)sizes[first] / gib);
    if (first == 4 && used < cap)
        used += (size_t)snprintf(text + used, cap - used, " (%d sets in flight)", m->in_flight);
    if (used < cap)
        used += (size_t)snprintf(text + used, cap - used, ", then %s %.2f GiB", names[second],
                                 (double)sizes[second] / gib);
    if (sizes[first] > device_bytes && used < cap)
        snprintf(text + used, cap - used, " (%s alone exceed the device)", names[first]);
    return 1;
}
