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

/* What compressor c (method, with its rank, fraction, error feedback) sends and keeps for
 * pipeline rank pp_rank's matrices. */
static loom_dp_traffic traffic_of(const loom_plan *plan, int pp_rank, const loom_plan_compressor *c,
                                  loom_compress_method method) {
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
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &info[k];
        if (ti->numel == 0) continue;
        int dims = ti->per_layer ? ti->ndim - 1 : ti->ndim;
        /* as the runtime's buckets hand them: qkvw as its Q, K and V row blocks (Llama's fcw
         * as gate and up) */
        int64_t rows[LOOM_MAX_MATRIX_PARTS] = {1};
        int parts = dims == 2 ? loom_gpt_matrix_parts(&plan->model, plan->tp, k, rows) : 1;
        int64_t count = ti->per_layer ? ti->shape[0] : 1;
        int64_t cols = dims == 2 ? ti->shape[ti->ndim - 1] : ti->layer_numel;
        for (int p = 0; p < parts; p++) {
            double state, wire = loom_plan_compressor_wire(c, method, rows[p], cols, &state);
            double raw = 4.0 * (double)rows[p] * (double)cols * (double)count;
            t.wire += wire * (double)count, t.state += state * (double)count;
            if (wire * (double)count < raw) t.raw += raw;
        }
    }
    return t;
}

loom_dp_traffic loom_plan_dp_traffic(const loom_plan *plan, int pp_rank) {
    const loom_plan_compressor *c = &plan->dp_compression;
    return traffic_of(plan, pp_rank, c,
                      loom_plan_compresses_stage(c, pp_rank) ? c->method : LOOM_COMPRESS_NONE);
}

/* Islands' outer state on a rank whose stage holds `stage_bytes` of parameters (outer.c):
 * round starts, momentum and scratch on its 1/dp range, int8/bf16's residual, overlap's sent
 * copy, or PowerSGD's / top-k's per-matrix state (a replica's share of the matrices; at dp > 1
 * also the stage's outer gradient, gathered). */
static int64_t outer_bytes(const loom_plan *plan, int pp_rank, int64_t stage_bytes) {
    const loom_plan_islands *is = &plan->islands;
    if (is->count < 1) return 0;
    int64_t range = (stage_bytes / 4 + plan->dp - 1) / plan->dp * 4;
    int buffers = 3 + (is->overlap_steps > 0) +
                  (is->compression == LOOM_COMPRESS_INT8 || is->compression == LOOM_COMPRESS_BF16);
    int64_t bytes = range * buffers;
    if (loom_plan_islands_by_matrix(is)) {
        loom_plan_compressor c;
        loom_plan_compressor_init(&c);
        c.method = is->compression, c.rank = is->compression_rank, c.error_feedback = 1;
        c.fraction = is->compression_fraction;
        /* each replica keeps its share of the matrices' state, and the stage's outer gradient */
        bytes += (int64_t)traffic_of(plan, pp_rank, &c, c.method).state / plan->dp;
        if (plan->dp > 1) bytes += stage_bytes;
    }
    return bytes;
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
 * The buffers zero.c allocates, from pipeline rank pp_rank's flat layout (its chunks' tensors,
 * this TP rank's shard of each): the units are each transformer block, the "embedding" unit
 * (everything before the first block: wte and wpe on the first stage, the tied wte on a head
 * stage) and the "final LayerNorm" unit (everything after the last block). */

loom_zero_units loom_plan_zero_units(const loom_plan *plan, int pp_rank) {
    loom_zero_units z = {0, 0, 0, 0, 0};
    loom_gpt_chunk chunks[LOOM_GPT_MAX_CHUNKS];
    int n = 0;
    for (int s = 0; s < plan->num_stages && n < LOOM_GPT_MAX_CHUNKS; s++) {
        const loom_plan_stage *st = &plan->stages[s];
        if (st->rank != pp_rank) continue;
        chunks[n++] = (loom_gpt_chunk){st->first_layer, st->end_layer, st->embedding, st->head};
        int layers = st->end_layer - st->first_layer;
        z.blocks += layers;
        if (layers > z.chunk_blocks) z.chunk_blocks = layers;
    }
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    int64_t floats = (int64_t)loom_gpt_layout_chunks(&plan->model, plan->tp, chunks, n, info);
    int64_t stride = (int64_t)info[LOOM_LN1W].layer_stride;
    int64_t head_begin = (int64_t)info[LOOM_LN1W].offset; /* the embedding unit: [0, here) */
    int64_t tail_begin = head_begin + z.blocks * stride;  /* the final LayerNorm's: [here, end) */
    z.block = stride * 4;
    z.held = floats * 4 - z.blocks * z.block;
    /* a held unit's ring has a receive buffer of its largest block: the unit cut by the
     * contiguous ZeRO ranges (loom_zero_shard_of) of the data-parallel ranks */
    int64_t dp = plan->dp > 0 ? plan->dp : 1, shard = (floats + dp - 1) / dp;
    const int64_t held[2][2] = {{0, head_begin}, {tail_begin, floats}};
    for (int u = 0; u < 2 && shard > 0; u++) {
        int64_t largest = 0;
        for (int64_t at = held[u][0]; at < held[u][1];) {
            int64_t end = (at / shard + 1) * shard;
            if (end > held[u][1]) end = held[u][1];
            if (end - at > largest) largest = end - at;
            at = end;
        }
        z.held_ring += largest * 4;
    }
    return z;
}

/* What ZeRO shards over the data-parallel group (optimizer from stage 1, gradients from 2,
 * parameters from 3) and the buffers it adds (zero.c, grad_sync.c):
 *   stage 1   each bucket's reduce-scatter ring receives into a buffer of its largest block;
 *             the ranges are contiguous, so most buckets lie in one rank's range and the
 *             buffers add up to about one gradient (scratch)
 *   stage 2   the gradient shard; the two held units' gradients whole for the step, and their
 *             rings' receive buffers; block-sized pooled buffers: the block being written and
 *             the previous block's ring receive (2), or, when backward is split into B and W,
 *             every block between its B and its W, and one ring receive (blocks + 1) (scratch)
 *   stage 3   the parameter shard; the held units' parameters whole; the gathered blocks:
 *             prefetch + 1 (within a chunk), or every block when gathered once per step
 *             (gathered) */
static void zero_shard(const loom_plan *plan, int pp_rank, loom_rank_memory *out) {
    int64_t dp = plan->dp;
    if (plan->zero < 1 || dp <= 1) return;
    int64_t full_grads = out->grads;
    out->optimizer /= dp;
    if (plan->zero == 1) {
        out->scratch += full_grads;
        return;
    }
    loom_zero_units z = loom_plan_zero_units(plan, pp_rank);
    out->grads = full_grads / dp;
    int64_t pooled = z.blocks == 0 ? 0 : splits_backward(plan) ? z.blocks + 1 : 2;
    out->scratch += z.held + z.held_ring + pooled * z.block;
    if (plan->zero < 3) return;
    out->weights /= dp;
    int64_t gathered = plan->zero3_prefetch + 1;
    if (gathered > z.chunk_blocks) gathered = z.chunk_blocks;
    if (plan->zero3_gather == LOOM_ZERO3_GATHER_STEP) gathered = z.blocks;
    out->gathered = z.held + gathered * z.block;
}

loom_status loom_plan_rank_memory_at(const loom_plan *plan, int pp_rank, int seq_len, int peak,
                                     loom_rank_memory *out) {
    memset(out, 0, sizeof *out);
    int split = splits_backward(plan);
    out->in_flight = peak;
    int64_t slot = 0, input = 0, kept = 0;
    int embedding = 0, head = 0, recompute = 0, lookup = 0;
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
        lookup |= plan->stages[s].embedding;
        head |= plan->stages[s].head && !plan->stages[s].embedding;
    }
    const loom_gpt_config *m = &plan->model;
    if (embedding && head) { /* one wte: its parameters, gradients and two moments once */
        int64_t wte = (int64_t)(m->padded_vocab_size / plan->tp) * m->channels * 4;
        out->weights -= wte, out->grads -= wte, out->optimizer -= 2 * wte;
    }
    int64_t stage_bytes = out->weights; /* before ZeRO-3 shards them */
    zero_shard(plan, pp_rank, out);
    /* without TP, ZeRO-3 looks the embedding up where wte is sharded, and ZeRO-2/3 on one stage
     * add the lookup's gradients into the owners' shards (zero.c): every replica's rows and
     * tokens, and ZeRO-3's reduce-scatter ring's receive block */
    if (plan->zero >= 2 && plan->tp == 1 && plan->dp > 1 && lookup) {
        int64_t rows = (int64_t)plan->micro_batch * seq_len, C = m->channels;
        if (plan->zero == 3 || plan->pp == 1) out->scratch += plan->dp * rows * (C + 1) * 4;
        if (plan->zero == 3) out->scratch += rows * C * 4;
    }
    out->outer = outer_bytes(plan, pp_rank, stage_bytes);
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
                 out->scratch + out->compressor + out->outer;
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
    const char *names[] = {"weights",     "gradients", "optimizer",  "gathered",
                           "activations", "scratch",   "compressor", "outer state"};
    const int64_t sizes[] = {m->weights,     m->grads,   m->optimizer,  m->gathered,
                             m->activations, m->scratch, m->compressor, m->outer};
    int first = 0, second = -1;
    for (int i = 1; i < 8; i++) {
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
