/*
 * gpt.c — the model (GPT-2 or Llama): allocation, initialisation, forward and backward.
 *
 * Parameters, gradients, activations and backward scratch each live in one allocation with
 * a struct of pointers into it (llm.c's layout). Every kernel goes through the backend table.
 * Backward keeps only one layer's worth of activation-gradient scratch: the residual stream's
 * gradient is carried down in one (B,T,C) buffer. Backward also runs in zero-bubble's two parts:
 * B (input gradients) keeps each GEMM's output gradient in the micro-batch's slot, W (weight
 * gradients) reads them later; both use the fused backward's kernels in its order, so that the
 * two give the same bits. A rank may run several chunks of layers: parameters are indexed by
 * the rank's local layer, a slot's activations by the layer within the chunk it holds.
 * Selective recomputation keeps every activation but the attention's softmax: a slot then holds
 * one layer's, and backward recomputes each layer's from its kept qkv with the forward's kernel.
 *
 * Not here: the configuration and presets (config.c), the parameter layout (layout.c), the cost
 * facts (cost.c); optimizer, clipping, data or files.
 */
#include "model/model_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void point_tensors(loom_gpt_tensors *t, float *base,
                          const loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]) {
    float **slots[LOOM_NUM_PARAM_TENSORS] = {
        &t->wte,      &t->wpe,      &t->ln1w, &t->ln1b, &t->qkvw,  &t->qkvb,
        &t->attprojw, &t->attprojb, &t->ln2w, &t->ln2b, &t->fcw,   &t->fcb,
        &t->fcprojw,  &t->fcprojb,  &t->lnfw, &t->lnfb, &t->lmhead};
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        *slots[k] = info[k].numel > 0 ? base + info[k].offset : NULL; /* not on this stage */
    }
}

loom_status loom_gpt_create(loom_gpt **out, const loom_gpt_config *config,
                            const loom_backend *backend) {
    return loom_gpt_create_tp(out, config, backend, 1, 0, NULL);
}

loom_status loom_gpt_create_tp(loom_gpt **out, const loom_gpt_config *config,
                               const loom_backend *backend, int tp_size, int tp_rank,
                               loom_comm *tp_comm) {
    loom_gpt_shard shard = {.first_layer = 0,
                            .end_layer = config->num_layers,
                            .tp_size = tp_size,
                            .tp_rank = tp_rank,
                            .tp_comm = tp_comm};
    return loom_gpt_create_shard(out, config, backend, &shard);
}

/* A chunk list's rules: ranges inside the model, ascending and apart; the embedding on at most
 * one chunk, which starts at layer 0; the head on at most one, which ends at the last. */
static loom_status check_chunks(const loom_gpt_shard *shard, int L) {
    if (shard->num_chunks < 0 || shard->num_chunks > LOOM_GPT_MAX_CHUNKS) {
        return loom_fail(LOOM_ERR_INPUT, "model: shard num_chunks: expected 0..%d, got %d",
                         LOOM_GPT_MAX_CHUNKS, shard->num_chunks);
    }
    int embeddings = 0, heads = 0;
    for (int i = 0; i < shard->num_chunks; i++) {
        const loom_gpt_chunk *c = &shard->chunks[i];
        int floor = i > 0 ? shard->chunks[i - 1].end_layer : 0;
        if (c->first_layer < floor || c->end_layer < c->first_layer || c->end_layer > L) {
            return loom_fail(LOOM_ERR_INPUT,
                             "model: shard chunks[%d]: expected layers [first, end) with %d <= "
                             "first <= end <= %d (ascending, not overlapping), got [%d, %d)",
                             i, floor, L, c->first_layer, c->end_layer);
        }
        if (c->has_embedding && (c->first_layer != 0 || embeddings++)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "model: shard chunks[%d].has_embedding: expected on one chunk, "
                             "starting at layer 0, got layers [%d, %d)",
                             i, c->first_layer, c->end_layer);
        }
        if (c->has_head && (c->end_layer != L || heads++)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "model: shard chunks[%d].has_head: expected on one chunk, ending at "
                             "layer %d, got layers [%d, %d)",
                             i, L, c->first_layer, c->end_layer);
        }
    }
    return LOOM_OK;
}

loom_status loom_gpt_describe(loom_gpt *m, const loom_gpt_config *config,
                              const loom_gpt_shard *shard) {
    memset(m, 0, sizeof *m);
    loom_gpt_config checked = *config;
    loom_status st = loom_gpt_config_check(&checked, "model");
    if (st != LOOM_OK) return st;
    int tp_size = shard->tp_size, tp_rank = shard->tp_rank;
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
        return loom_fail(LOOM_ERR_INPUT, "model: bad tensor-parallel rank %d of %d", tp_rank,
                         tp_size);
    }
    st = loom_gpt_check_tp(&checked, tp_size, "model", "tensor parallel", "");
    if (st != LOOM_OK) return st;
    if (shard->sequence_parallel && tp_size < 2) {
        return loom_fail(LOOM_ERR_INPUT,
                         "model: sequence parallelism shards over the tensor-parallel ranks: "
                         "expected tp > 1, got %d",
                         tp_size);
    }
    if (shard->num_chunks == 0) {
        if (shard->first_layer < 0 || shard->end_layer > checked.num_layers ||
            shard->first_layer >= shard->end_layer) {
            return loom_fail(LOOM_ERR_INPUT, "model: stage layers [%d, %d) outside [0, %d)",
                             shard->first_layer, shard->end_layer, checked.num_layers);
        }
        m->num_chunks = 1;
        m->chunks[0] =
            (loom_gpt_chunk){shard->first_layer, shard->end_layer, shard->first_layer == 0,
                             shard->end_layer == checked.num_layers};
    } else {
        st = check_chunks(shard, checked.num_layers);
        if (st != LOOM_OK) return st;
        m->num_chunks = shard->num_chunks;
        memcpy(m->chunks, shard->chunks, (size_t)shard->num_chunks * sizeof *m->chunks);
    }
    m->config = checked;
    m->tp_size = tp_size;
    m->tp_rank = tp_rank;
    m->tp_comm = tp_size > 1 ? shard->tp_comm : NULL;
    m->sequence_parallel = shard->sequence_parallel != 0;
    m->first_layer = m->chunks[0].first_layer;
    for (int i = 0; i < m->num_chunks; i++) {
        const loom_gpt_chunk *chunk = &m->chunks[i];
        int layers = chunk->end_layer - chunk->first_layer;
        m->num_local_layers += layers;
        m->max_chunk_layers = layers > m->max_chunk_layers ? layers : m->max_chunk_layers;
        m->has_embedding |= chunk->has_embedding;
        m->has_head |= chunk->has_head;
    }
    int vp_local = checked.padded_vocab_size / tp_size;
    m->vocab_start = tp_rank * vp_local;
    int real = checked.vocab_size - m->vocab_start;
    m->vocab_local = real < 0 ? 0 : (real > vp_local ? vp_local : real);
    m->num_params = loom_gpt_layout_chunks(&checked, tp_size, m->chunks, m->num_chunks, m->info);
    m->layer_stride = m->info[LOOM_LN1W].layer_stride;
    return LOOM_OK;
}

static int compare_segments(const void *a, const void *b) {
    size_t x = ((const loom_gpt_segment *)a)->offset, y = ((const loom_gpt_segment *)b)->offset;
    return (x > y) - (x < y);
}

loom_status loom_gpt_create_shard(loom_gpt **out, const loom_gpt_config *config,
                                  const loom_backend *backend, const loom_gpt_shard *shard) {
    *out = NULL;
    if (shard->tp_size > 1 && !shard->tp_comm) {
        return loom_fail(LOOM_ERR_INPUT, "model: tensor parallelism needs a communicator");
    }
    loom_gpt *m = loom_calloc(1, sizeof *m, "model");
    if (!m) return LOOM_ERR_NOMEM;
    loom_status st = loom_gpt_describe(m, config, shard);
    if (st != LOOM_OK) {
        free(m);
        return st;
    }
    m->backend = backend;
    m->layer_stride = m->info[LOOM_LN1W].layer_stride;
    int L = m->num_local_layers;
    m->segments = loom_calloc(5 + 12 * (size_t)L, sizeof *m->segments, "segments");
    if (!m->segments) {
        loom_gpt_free(m);
        return LOOM_ERR_NOMEM;
    }
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &m->info[k];
        if (ti->numel == 0) continue; /* not on this stage */
        for (int l = 0; l < (ti->per_layer ? L : 1); l++) {
            m->segments[m->num_segments++] =
                (loom_gpt_segment){ti->offset + (size_t)l * ti->layer_stride, ti->layer_numel, k,
                                   ti->per_layer ? l : -1, ti->decay};
        }
    }
    /* in flat-buffer order (n log n: a model may have many layers) */
    qsort(m->segments, (size_t)m->num_segments, sizeof *m->segments, compare_segments);
    /* spare zeros after the parameters let ZeRO-1 pad the buffer to a multiple of dp */
    size_t capacity = m->num_params + LOOM_GPT_PAD_FLOATS;
    int windowed = shard->windowed;
    m->params_begin = windowed ? shard->params_begin : 0;
    m->params_end = windowed ? shard->params_end : m->num_params;
    if (m->params_begin > m->params_end || m->params_end > m->num_params) {
        size_t n = m->num_params;
        loom_gpt_free(m);
        return loom_fail(LOOM_ERR_INPUT, "model: parameter window [%zu, %zu) outside [0, %zu)",
                         shard->params_begin, shard->params_end, n);
    }
    /* a window keeps the spare zeros too: ZeRO's shards are padded to equal sizes */
    size_t window = windowed ? m->params_end - m->params_begin + LOOM_GPT_PAD_FLOATS : capacity;
    m->params_memory = loom_alloc_aligned(window * sizeof(float), "parameters");
    if (!shard->no_grads)
        m->grads_memory = loom_alloc_aligned(capacity * sizeof(float), "gradients");
    if (!m->params_memory || (!shard->no_grads && !m->grads_memory)) {
        loom_gpt_free(m);
        return LOOM_ERR_NOMEM;
    }
    if (!windowed) point_tensors(&m->params, m->params_memory, m->info);
    if (m->grads_memory) point_tensors(&m->grads, m->grads_memory, m->info);
    m->num_units = L + 2;
    m->unit_begin = loom_calloc((size_t)m->num_units + 1, sizeof *m->unit_begin, "units");
    m->unit_params = loom_calloc((size_t)m->num_units, sizeof *m->unit_params, "units");
    m->unit_grads = loom_calloc((size_t)m->num_units, sizeof *m->unit_grads, "units");
    if (!m->unit_begin || !m->unit_params || !m->unit_grads) {
        loom_gpt_free(m);
        return LOOM_ERR_NOMEM;
    }
    /* the blocks start where block 0's first tensor does; the final LayerNorm after the last */
    size_t blocks = m->info[LOOM_LN1W].offset;
    for (int u = 1; u <= L + 1; u++) m->unit_begin[u] = blocks + (size_t)(u - 1) * m->layer_stride;
    m->unit_begin[L + 2] = m->num_params;
    loom_gpt_units_reset(m);
    *out = m;
    return LOOM_OK;
}

void loom_gpt_units_reset(loom_gpt *m) {
    int whole = m->params_begin == 0 && m->params_end == m->num_params;
    for (int u = 0; u < m->num_units; u++) {
        m->unit_params[u] = whole ? m->params_memory + m->unit_begin[u] : NULL;
        m->unit_grads[u] = m->grads_memory ? m->grads_memory + m->unit_begin[u] : NULL;
    }
}

void loom_gpt_free(loom_gpt *m) {
    if (!m) return;
    free(m->segments);
    free(m->unit_begin);
    free(m->unit_params);
    free(m->unit_grads);
    loom_free_aligned(m->params_memory);
    loom_free_aligned(m->grads_memory);
    loom_free_aligned(m->acts_memory);
    loom_free_aligned(m->grad_acts_memory);
    free(m->inputs_all);
    free(m->targets_all);
    free(m);
}

int loom_gpt_global_layer(const loom_gpt *m, int local) {
    for (int i = 0; i < m->num_chunks; i++) {
        int layers = m->chunks[i].end_layer - m->chunks[i].first_layer;
        if (local < layers) return m->chunks[i].first_layer + local;
        local -= layers;
    }
    return -1; /* not a local layer */
}

int loom_gpt_local_layer(const loom_gpt *m, int layer) {
    int local = 0;
    for (int i = 0; i < m->num_chunks; i++) {
        const loom_gpt_chunk *c = &m->chunks[i];
        if (layer >= c->first_layer && layer < c->end_layer) return local + layer - c->first_layer;
        local += c->end_layer - c->first_layer;
    }
    return -1;
}

int64_t loom_gpt_global_index(const loom_gpt *m, int k, int64_t index) {
    const loom_gpt_config *c = &m->config;
    const loom_gpt_tensor_info *ti = &m->info[k];
    int64_t tp = m->tp_size;
    if (!ti->per_layer) {
        if (tp == 1 || (k != LOOM_WTE && k != LOOM_LMHEAD)) return index;
        return index + m->tp_rank * (int64_t)(c->padded_vocab_size / tp) * c->channels; /* rows */
    }
    int64_t layer = loom_gpt_global_layer(m, (int)(index / ti->layer_numel));
    int64_t within = index % ti->layer_numel;
    int64_t global_layer_numel = ti->layer_numel * (loom_gpt_tensor_is_sharded(k) ? tp : 1);
    if (tp == 1 || !loom_gpt_tensor_is_sharded(k)) return layer * global_layer_numel + within;
    int64_t C = c->channels, r = m->tp_rank;
    loom_gpt_widths w = loom_gpt_widths_of(c, (int)tp);
    int64_t g;
    switch (k) {
    case LOOM_QKVW:
    case LOOM_QKVB:
    case LOOM_FCW:
    case LOOM_FCB: { /* rows in parts ([q | k | v]; Llama's [gate | up]), this rank's 1/tp of each
                      */
        int64_t cols = k == LOOM_QKVW || k == LOOM_FCW ? C : 1;
        int64_t row = within / cols, col = within % cols, rows[LOOM_MAX_MATRIX_PARTS];
        int parts = loom_gpt_matrix_parts(c, (int)tp,
                                          k == LOOM_QKVB  ? LOOM_QKVW
                                          : k == LOOM_FCB ? LOOM_FCW
                                                          : k,
                                          rows);
        int64_t before = 0; /* the global rows of the parts before this one */
        int p = 0;
        while (p < parts - 1 && row >= rows[p]) row -= rows[p], before += rows[p] * tp, p++;
        g = (before + r * rows[p] + row) * cols + col;
        break;
    }
    default: { /* LOOM_ATTPROJW (C, C/tp) and LOOM_FCPROJW (C, F/tp): columns */
        int64_t local_cols = k == LOOM_ATTPROJW ? w.q : w.ffn;
        int64_t row = within / local_cols, col = within % local_cols;
        g = row * local_cols * tp + r * local_cols + col;
        break;
    }
    }
    return layer * global_layer_numel + g;
}

void loom_gpt_init_weights(loom_gpt *m, uint64_t seed) {
    const loom_gpt_config *c = &m->config;
    float std = 0.02f;
    float proj_std = 0.02f / sqrtf(2.0f * (float)c->num_layers);
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &m->info[k];
        int64_t n = ti->numel;
        /* element g of the logical (unsharded) tensor draws counter g of stream k, wherever it
         * lives, so every layout starts from the same weights */
        float value = (k == LOOM_LN1W || k == LOOM_LN2W || k == LOOM_LNFW) ? 1.0f : 0.0f;
        float s = (k == LOOM_ATTPROJW || k == LOOM_FCPROJW) ? proj_std : std;
        int64_t real =
            k == LOOM_WTE || k == LOOM_LMHEAD ? (int64_t)c->vocab_size * c->channels : INT64_MAX;
        int random = ti->decay;
        size_t lo = m->params_begin, hi = m->params_end; /* the window this rank keeps */
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            size_t at = loom_gpt_element_offset(ti, i);
            if (at < lo || at >= hi) continue;
            float v = value;
            if (random) {
                int64_t g = loom_gpt_global_index(m, k, i);
                v = g < real ? s * (float)loom_rng_normal(seed, (uint64_t)k, (uint64_t)g) : 0.0f;
            }
            m->params_memory[at - lo] = v;
        }
    }
}

#define NUM_ACTS LOOM_GPT_NUM_ACTS

/* Activation buffer sizes for a forward of (B, T) on this rank (local widths under TP). Every
 * stage has `encoded` (the embedding stage's output, the others' input); only the head stage
 * has the head's buffers (lnf ... row_stats), only a split reservation those W needs; the
 * others are there at size 0. */
static size_t acts_layout(const loom_gpt *m, int B, int T, int split, int selective,
                          size_t sizes[NUM_ACTS]) {
    /* one chunk's activations: the largest chunk's blocks */
    loom_gpt_slot_shape slot = {
        m->tp_size, m->max_chunk_layers, m->has_embedding,    m->has_head, split, B,
        T,          selective,           m->sequence_parallel};
    int64_t floats[LOOM_GPT_NUM_ACTS];
    loom_gpt_act_floats(&m->config, &slot, floats);
    size_t total = 0;
    for (int i = 0; i < NUM_ACTS; i++) {
        sizes[i] = (size_t)loom_gpt_act_round(floats[i]);
        total += sizes[i];
    }
    return total;
}

loom_status loom_gpt_reserve(loom_gpt *m, int B, int T) {
    return loom_gpt_reserve_slots(m, B, T, m->slots > 0 ? m->slots : 1);
}

void loom_gpt_use_slot(loom_gpt *m, int slot) {
    float **slots[NUM_ACTS] = {
        &m->acts.encoded,   &m->acts.ln1,      &m->acts.ln1_mean,  &m->acts.ln1_rstd,
        &m->acts.qkv,       &m->acts.atty,     &m->acts.att,       &m->acts.attproj,
        &m->acts.residual2, &m->acts.ln2,      &m->acts.ln2_mean,  &m->acts.ln2_rstd,
        &m->acts.fch,       &m->acts.fch_gelu, &m->acts.fcproj,    &m->acts.residual3,
        &m->acts.lnf,       &m->acts.lnf_mean, &m->acts.lnf_rstd,  &m->acts.probs,
        &m->acts.losses,    &m->acts.row_max,  &m->acts.row_stats, &m->acts.dfcproj,
        &m->acts.dfch,      &m->acts.dattproj, &m->acts.dqkv,      &m->acts.dencoded};
    size_t sizes[NUM_ACTS];
    acts_layout(m, m->B, m->T, m->split_backward, m->selective, sizes);
    float *p = m->acts_memory + (size_t)slot * m->slot_floats;
    for (int i = 0; i < NUM_ACTS; i++) {
        *slots[i] = sizes[i] > 0 ? p : NULL; /* not on this stage, or not reserved */
        p += sizes[i];
    }
    size_t BT = (size_t)m->B * (size_t)m->T;
    m->inputs = m->inputs_all + (size_t)slot * BT;
    m->targets = m->targets_all + (size_t)slot * BT;
    m->slot = slot;
}

void loom_gpt_grad_scratch_floats(const loom_gpt_config *c, int64_t N, int sequence_parallel,
                                  int64_t out[LOOM_GPT_GRAD_SCRATCH]) {
    /* full widths even under TP; dfch2 also holds (N, C) gathered inputs under SP */
    loom_gpt_widths w = loom_gpt_widths_of(c, 1);
    int64_t C = c->channels;
    int64_t sizes[LOOM_GPT_GRAD_SCRATCH] = {N * C,
                                            N * C,
                                            N * C,
                                            N * w.qkv,
                                            N * w.fc,
                                            N * (w.ffn > C ? w.ffn : C),
                                            sequence_parallel ? 4 * C : 0};
    memcpy(out, sizes, sizeof sizes);
}

size_t loom_gpt_activation_bytes(const loom_gpt *m) {
    if (!m->acts_memory) return 0;
    size_t BT = (size_t)m->B * (size_t)m->T;
    size_t tokens = 2 * BT * (size_t)m->slots * sizeof(int32_t); /* inputs and targets */
    int64_t scratch[LOOM_GPT_GRAD_SCRATCH], total = 0;
    loom_gpt_grad_scratch_floats(&m->config, (int64_t)BT, m->sequence_parallel, scratch);
    for (int i = 0; i < LOOM_GPT_GRAD_SCRATCH; i++) total += scratch[i];
    return (m->slot_floats * (size_t)m->slots + (size_t)total) * sizeof(float) + tokens;
}

loom_status loom_gpt_reserve_slots(loom_gpt *m, int B, int T, int nslots) {
    return loom_gpt_reserve_slots_split(m, B, T, nslots, 0);
}

loom_status loom_gpt_reserve_slots_split(loom_gpt *m, int B, int T, int nslots, int split) {
    loom_gpt_slots_spec spec = {B, T, nslots, split, 0};
    return loom_gpt_reserve_slots_spec(m, &spec);
}

loom_status loom_gpt_reserve_slots_spec(loom_gpt *m, const loom_gpt_slots_spec *spec) {
    int B = spec->B, T = spec->T, nslots = spec->slots;
    int split = spec->split != 0, selective = spec->selective != 0;
    if (B <= 0 || T <= 0 || T > m->config.max_seq_len) {
        return loom_fail(LOOM_ERR_INPUT,
                         "seq_len: expected 1..%d (the model's context), got %d (batch %d)",
                         m->config.max_seq_len, T, B);
    }
    if (nslots < 1) return loom_fail(LOOM_ERR_INPUT, "model: expected at least one slot");
    if (m->sequence_parallel) {
        loom_status st = loom_gpt_check_sequence_rows(B, T, m->tp_size, "model");
        if (st != LOOM_OK) return st;
    }
    /* a split reservation serves callers that do not split too, one that keeps every layer's
     * softmax selective callers too */
    if (m->acts_memory && B <= m->B && T <= m->T && (int64_t)B * T <= (int64_t)m->B * m->T &&
        nslots <= m->slots && split <= m->split_backward && m->selective <= selective) {
        return LOOM_OK;
    }
    loom_free_aligned(m->acts_memory);
    loom_free_aligned(m->grad_acts_memory);
    free(m->inputs_all);
    free(m->targets_all);
    m->acts_memory = m->grad_acts_memory = NULL;
    m->inputs_all = m->targets_all = m->inputs = m->targets = NULL;

    size_t sizes[NUM_ACTS];
    m->slot_floats = acts_layout(m, B, T, split, selective, sizes);
    m->acts_memory =
        loom_alloc_aligned(m->slot_floats * (size_t)nslots * sizeof(float), "activations");
    size_t BT = (size_t)B * (size_t)T;
    int64_t grad_sizes[LOOM_GPT_GRAD_SCRATCH];
    loom_gpt_grad_scratch_floats(&m->config, (int64_t)BT, m->sequence_parallel, grad_sizes);
    size_t grad_total = 0;
    for (int i = 0; i < LOOM_GPT_GRAD_SCRATCH; i++) grad_total += (size_t)grad_sizes[i];
    m->grad_acts_memory = loom_alloc_aligned(grad_total * sizeof(float), "activation gradients");
    m->inputs_all = loom_calloc(BT * (size_t)nslots, sizeof(int32_t), "inputs");
    m->targets_all = loom_calloc(BT * (size_t)nslots, sizeof(int32_t), "targets");
    if (!m->acts_memory || !m->grad_acts_memory || !m->inputs_all || !m->targets_all) {
        return LOOM_ERR_NOMEM;
    }
    float **gslots[LOOM_GPT_GRAD_SCRATCH] = {
        &m->grad_acts.dresidual, &m->grad_acts.dbtc,  &m->grad_acts.dbtc2, &m->grad_acts.dqkv,
        &m->grad_acts.dfch,      &m->grad_acts.dfch2, &m->grad_acts.dnorm};
    float *p = m->grad_acts_memory;
    for (int i = 0; i < LOOM_GPT_GRAD_SCRATCH; i++) {
        *gslots[i] = grad_sizes[i] ? p : NULL;
        p += grad_sizes[i];
    }
    m->B = B;
    m->T = T;
    m->slots = nslots;
    m->split_backward = split;
    m->selective = selective;
    loom_gpt_use_slot(m, 0);
    return LOOM_OK;
}

/* Tensor k's slice of local layer l (l unused for a tensor not per layer) in `units`, the
 * parameters' or the gradients' unit pointers. */
static float *unit_tensor_at(const loom_gpt *m, float *const *units, int k, int l) {
    const loom_gpt_tensor_info *ti = &m->info[k];
    int u = ti->per_layer                                          ? loom_gpt_block_unit(l)
            : k == LOOM_LNFW || k == LOOM_LNFB || k == LOOM_LMHEAD ? m->num_units - 1
                                                                   : 0;
    size_t at = ti->offset + (ti->per_layer ? (size_t)l * ti->layer_stride : 0);
    return units[u] + (at - m->unit_begin[u]);
}

/* A tensor that is not per layer (wte, wpe, lnfw, lnfb, lmhead); NULL where it has no elements
 * (Llama's wpe and lnfb). */
static float *unit_tensor(const loom_gpt *m, float *const *units, int k) {
    return m->info[k].numel > 0 ? unit_tensor_at(m, units, k, 0) : NULL;
}

/* The LM head's weight: wte when tied, else its own. */
static int head_tensor(const loom_gpt *m) {
    return m->config.untied_head ? LOOM_LMHEAD : LOOM_WTE;
}

/* Local layer l's slice of every per-layer tensor (the others NULL). */
static loom_gpt_tensors block_tensors(const loom_gpt *m, float *const *units, int l) {
    loom_gpt_tensors t = {0};
    float **slots[] = {&t.ln1w, &t.ln1b, &t.qkvw, &t.qkvb, &t.attprojw, &t.attprojb,
                       &t.ln2w, &t.ln2b, &t.fcw,  &t.fcb,  &t.fcprojw,  &t.fcprojb};
    for (int k = LOOM_LN1W; k <= LOOM_FCPROJB; k++) /* Llama's biases: none */
        *slots[k - LOOM_LN1W] = m->info[k].numel > 0 ? unit_tensor_at(m, units, k, l) : NULL;
    return t;
}

/* A block's four GEMMs, in backward order. */
enum { GEMM_FCPROJ, GEMM_FC, GEMM_ATTPROJ, GEMM_QKV, BLOCK_GEMMS };

/* Per-layer activation views for a forward of shape (B, T); strides use the current shape so
 * that smaller batches pack densely into the reserved buffers. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *residual2, *ln2, *ln2_mean,
        *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3;
    float *dout[BLOCK_GEMMS]; /* the GEMMs' output gradients a split backward keeps; NULL if not */
} layer_acts;

/* p + n, or NULL for a buffer the slot does not have (RMSNorm keeps no mean). */
static float *at(float *p, size_t n) {
    return p ? p + n : NULL;
}

static layer_acts layer_view(loom_gpt *m, int l, int B, int T) {
    const loom_gpt_acts *a = &m->acts;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    size_t C = (size_t)m->config.channels, NHl = (size_t)w.heads;
    size_t BT = (size_t)B * (size_t)T;
    size_t lbt = (size_t)l * BT;
    /* the residual stream's buffers hold this rank's rows (all of them without SP) */
    size_t lrows = (size_t)l * (size_t)loom_gpt_rows(m, B, T);
    size_t att_layer = m->selective ? 0 : (size_t)l; /* selective: one layer's, scratch */
    layer_acts v = {
        a->ln1 + lrows * C,
        at(a->ln1_mean, lrows),
        a->ln1_rstd + lrows,
        a->qkv + lbt * (size_t)w.qkv,
        a->atty + lbt * (size_t)w.q,
        a->att + att_layer * (size_t)B * NHl * (size_t)T * (size_t)T,
        a->attproj + lrows * C,
        a->residual2 + lrows * C,
        a->ln2 + lrows * C,
        at(a->ln2_mean, lrows),
        a->ln2_rstd + lrows,
        a->fch + lbt * (size_t)w.fc,
        a->fch_gelu + lbt * (size_t)w.ffn,
        a->fcproj + lrows * C,
        a->residual3 + lrows * C,
        {NULL},
    };
    if (a->dqkv) {
        v.dout[GEMM_FCPROJ] = a->dfcproj + lbt * C;
        v.dout[GEMM_FC] = a->dfch + lbt * (size_t)w.fc;
        v.dout[GEMM_ATTPROJ] = a->dattproj + lbt * C;
        v.dout[GEMM_QKV] = a->dqkv + lbt * (size_t)w.qkv;
    }
    return v;
}

/* ---- the two architectures' differences inside a block: the norm (LayerNorm or RMSNorm), the
 * rotary positions on q and k (Llama), the attention (multi-head or grouped-query) and the MLP's
 * activation (GELU or SwiGLU) */

static int is_llama(const loom_gpt *m) {
    return m->config.arch == LOOM_ARCH_LLAMA;
}

static void norm_forward(const loom_gpt *m, float *out, float *mean, float *rstd, const float *inp,
                         const float *weight, const float *bias, int64_t N) {
    int C = m->config.channels;
    if (is_llama(m)) {
        m->backend->rmsnorm_forward(out, rstd, inp, weight, N, C, (float)m->config.norm_eps);
    } else {
        m->backend->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    }
}

static void norm_backward(const loom_gpt *m, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight,
                          const float *mean, const float *rstd, int64_t N) {
    int C = m->config.channels;
    if (is_llama(m)) {
        m->backend->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C);
    } else {
        m->backend->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    }
}

/* The QKV GEMM's output made ready for attention: Llama rotates q and k in place (the slot
 * keeps the rotated values, which attention and its backward read). */
static void qkv_positions(const loom_gpt *m, float *qkv, int B, int T) {
    if (!is_llama(m)) return;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    loom_rope rope = {m->config.rope_theta, m->config.rope_scaling};
    m->backend->rope_forward(qkv, B, T, w.qkv, (int)(w.heads + w.kv), (int)w.hd, &rope);
}

/* The gradient of the rotated q and k turned into that of the QKV GEMM's output, in place. */
static void qkv_positions_backward(const loom_gpt *m, float *dqkv, int B, int T) {
    if (!is_llama(m)) return;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    loom_rope rope = {m->config.rope_theta, m->config.rope_scaling};
    m->backend->rope_backward(dqkv, B, T, w.qkv, (int)(w.heads + w.kv), (int)w.hd, &rope);
}

static void attention_forward(const loom_gpt *m, float *out, float *att, const float *qkv, int B,
                              int T) {
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    if (is_llama(m)) {
        m->backend->attention_gqa_forward(out, att, qkv, B, T, (int)w.heads, (int)w.kv, (int)w.hd);
    } else {
        m->backend->attention_forward(out, att, qkv, B, T, (int)w.q, (int)w.heads);
    }
}

static void attention_backward(const loom_gpt *m, float *dqkv, const float *dout, const float *qkv,
                               const float *att, int B, int T) {
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    if (is_llama(m)) {
        m->backend->attention_gqa_backward(dqkv, dout, qkv, att, B, T, (int)w.heads, (int)w.kv,
                                           (int)w.hd);
    } else {
        m->backend->attention_backward(dqkv, dout, qkv, att, B, T, (int)w.q, (int)w.heads);
    }
}

/* The MLP's activation: fch (N, fc) -> out (N, ffn). */
static void mlp_activation(const loom_gpt *m, float *out, const float *fch, int64_t N) {
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    if (is_llama(m)) {
        m->backend->swiglu_forward(out, fch, N, (int)w.ffn);
    } else {
        m->backend->gelu_forward(out, fch, N * w.ffn);
    }
}

static void mlp_activation_backward(const loom_gpt *m, float *dfch, const float *fch,
                                    const float *dout, int64_t N) {
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    if (is_llama(m)) {
        m->backend->swiglu_backward(dfch, fch, dout, N, (int)w.ffn);
    } else {
        m->backend->gelu_backward(dfch, fch, dout, N * w.ffn);
    }
}

/* Sums a buffer over the tensor-parallel group (no-op without TP). A failure here cannot be
 * handed back through forward/backward, and leaving the group out of step would hang it, so
 * it ends the job. */
static void tp_allreduce(loom_gpt *m, float *buf, int64_t n, loom_reduce_op op) {
    if (m->tp_size == 1) return;
    if (loom_comm_allreduce_f32(m->tp_comm, buf, n, op) != LOOM_OK) {
        loom_comm_abort(1, loom_last_error());
    }
}

int64_t loom_gpt_rows(const loom_gpt *m, int B, int T) {
    int64_t N = (int64_t)B * T;
    return m->sequence_parallel ? N / m->tp_size : N;
}

/* ---- sequence parallelism's collectives: rows in, rows out (failures end the job, as
 * tp_allreduce's) */

/* full (N, C) = every rank's rows (N/tp, C) of a (N, C) tensor, in rank order. */
static void sp_gather(loom_gpt *m, float *full, const float *rows, int64_t N, int C) {
    if (loom_comm_allgather_f32(m->tp_comm, rows, full, N / m->tp_size * C) != LOOM_OK) {
        loom_comm_abort(1, loom_last_error());
    }
}

/* rows (N/tp, C) = this rank's rows of the sum over ranks of partial (N, C), which the ring
 * leaves holding partial sums. */
static void sp_scatter(loom_gpt *m, float *rows, float *partial, int64_t N, int C) {
    int64_t count = N / m->tp_size * C;
    if (loom_comm_reduce_scatter_f32(m->tp_comm, partial, count) != LOOM_OK) {
        loom_comm_abort(1, loom_last_error());
    }
    const float *own = partial + m->tp_rank * count;
    if (rows != own) memcpy(rows, own, (size_t)count * sizeof(float));
}

/* out (N/tp, OC) = this rank's rows of inp (N,K) @ w^T summed over TP ranks, + bias: Megatron's
 * row-parallel layer under sequence parallelism, the sum reduce-scattered into `scratch`
 * (N, OC). */
static void row_parallel_forward_sp(loom_gpt *m, float *out, float *scratch, const float *inp,
                                    const float *w, const float *bias, int64_t N, int K, int OC) {
    const loom_backend *be = m->backend;
    be->matmul_forward(scratch, inp, w, NULL, N, K, OC);
    sp_scatter(m, out, scratch, N, OC);
    if (bias) be->bias_forward(out, bias, N / m->tp_size, OC);
}

/* out (rows, C) += wpe[t] for this rank's rows of a (B, T) micro-batch, rows (b, t) from
 * `first` on: the position kernel run on each piece of one sequence. */
static void position_forward_rows(loom_gpt *m, float *out, const float *wpe, int64_t first,
                                  int64_t rows, int T, int C) {
    for (int64_t r = 0; r < rows;) {
        int t = (int)((first + r) % T);
        int n = (int)(T - t < rows - r ? T - t : rows - r);
        m->backend->position_forward(out + r * C, wpe + (int64_t)t * C, 1, n, C);
        r += n;
    }
}

/* The replicated LayerNorm parameters' gradients of one micro-batch computed on this rank's rows
 * (dnorm, `n` floats) summed over the TP group, then added into their gradients (ws[i] gets
 * dnorm[i*C, (i+1)*C)). Summing each micro-batch's contribution before it is accumulated keeps
 * the gradient buffer exactly what it is without SP (the sum over every row of every
 * micro-batch so far), so gradient accumulation, pipeline schedules and DP (whichever ZeRO
 * stage) see what they always do. */
static void sp_norm_grads_add(loom_gpt *m, float *const *ws, int count) {
    int C = m->config.channels;
    tp_allreduce(m, m->grad_acts.dnorm, (int64_t)count * C, LOOM_REDUCE_SUM);
    for (int i = 0; i < count; i++) {
        const float *d = m->grad_acts.dnorm + (size_t)i * C;
        if (!ws[i]) continue; /* Llama's norms have no bias */
        for (int c = 0; c < C; c++) ws[i][c] += d[c];
    }
}

/* out (N,OC) = inp (N,K) @ w^T, summed over TP ranks, + bias: a row-parallel layer. Without
 * TP the bias goes into the GEMM as usual. */
static void row_parallel_forward(loom_gpt *m, float *out, const float *inp, const float *w,
                                 const float *bias, int64_t N, int K, int OC) {
    const loom_backend *be = m->backend;
    if (m->tp_size == 1) {
        be->matmul_forward(out, inp, w, bias, N, K, OC);
        return;
    }
    be->matmul_forward(out, inp, w, NULL, N, K, OC);
    tp_allreduce(m, out, N * OC, LOOM_REDUCE_SUM);
    if (bias) be->bias_forward(out, bias, N, OC);
}

/* A chunk as the passes see it: its block i is the rank's local layer first + i (parameters)
 * and the slot's layer i (activations). */
typedef struct {
    int index;
    int first, layers;
    int has_embedding, has_head;
} chunk_view;

/* Chunk `chunk`, checked where a caller hands it in. */
static chunk_view chunk_of(const loom_gpt *m, int chunk, const char *caller) {
    if (chunk < 0 || chunk >= m->num_chunks) {
        loom_fatal("%s: chunk %d, expected 0..%d", caller, chunk, m->num_chunks - 1);
    }
    chunk_view v = {chunk, 0, 0, m->chunks[chunk].has_embedding, m->chunks[chunk].has_head};
    for (int i = 0; i < chunk; i++) v.first += m->chunks[i].end_layer - m->chunks[i].first_layer;
    v.layers = m->chunks[chunk].end_layer - m->chunks[chunk].first_layer;
    return v;
}

/* The residual stream after the chunk's last block: its output, and the head's input. */
static const float *chunk_last_residual(loom_gpt *m, const chunk_view *ch, int B, int T) {
    return ch->layers > 0 ? layer_view(m, ch->layers - 1, B, T).residual3 : m->acts.encoded;
}

/* Lets the unit hook (if any) move its transfers on between a block's GEMMs: ZeRO-3's prefetched
 * gathers and ZeRO-2/3's reduce-scatters progress only inside MPI calls, so once per block would
 * leave a prefetch little to overlap. */
static void progress(loom_gpt *m) {
    if (m->unit_event) m->unit_event(m->unit_event_ctx, -1, LOOM_GPT_UNIT_PROGRESS);
}

/* Tells the unit hook (if any) about local layer `layer`'s block unit. */
static void fire_unit_event(loom_gpt *m, int layer, int event) {
    if (m->unit_event) m->unit_event(m->unit_event_ctx, loom_gpt_block_unit(layer), event);
}

/* Tells the unit hook (if any) that a forward reads held unit `unit` (0: the embeddings, the last:
 * the final LayerNorm). */
static void fire_held_event(loom_gpt *m, int unit) {
    if (m->unit_event) m->unit_event(m->unit_event_ctx, unit, LOOM_GPT_UNIT_PARAMS_FORWARD);
}

/* block_forward under sequence parallelism: the LayerNorms and residual adds on this rank's rows,
 * their outputs all-gathered into grad scratch for the column-parallel GEMMs (not kept: backward
 * gathers them again), the row-parallel GEMMs' sums reduce-scattered back to rows. Forward never
 * runs inside a backward, so the backward scratch is free, but for dresidual (the last
 * backward's input gradient, which a pipeline may not have sent yet). */
static void block_forward_sp(loom_gpt *m, const chunk_view *ch, int i, const float *residual, int B,
                             int T) {
    const loom_backend *be = m->backend;
    int C = m->config.channels, tp = m->tp_size;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, tp);
    int64_t N = (int64_t)B * T, rows = N / tp;
    float *gathered = m->grad_acts.dbtc, *partial = m->grad_acts.dbtc2; /* (N, C) each */
    layer_acts a = layer_view(m, i, B, T);
    loom_gpt_tensors p = block_tensors(m, m->unit_params, ch->first + i);
    norm_forward(m, a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1w, p.ln1b, rows);
    sp_gather(m, gathered, a.ln1, N, C);
    be->matmul_forward(a.qkv, gathered, p.qkvw, p.qkvb, N, C, (int)w.qkv);
    qkv_positions(m, a.qkv, B, T);
    progress(m);
    attention_forward(m, a.atty, a.att, a.qkv, B, T);
    progress(m);
    row_parallel_forward_sp(m, a.attproj, partial, a.atty, p.attprojw, p.attprojb, N, (int)w.q, C);
    be->residual_forward(a.residual2, residual, a.attproj, rows * C);
    norm_forward(m, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2w, p.ln2b, rows);
    sp_gather(m, gathered, a.ln2, N, C);
    progress(m);
    be->matmul_forward(a.fch, gathered, p.fcw, p.fcb, N, C, (int)w.fc);
    progress(m);
    mlp_activation(m, a.fch_gelu, a.fch, N);
    row_parallel_forward_sp(m, a.fcproj, partial, a.fch_gelu, p.fcprojw, p.fcprojb, N, (int)w.ffn,
                            C);
    be->residual_forward(a.residual3, a.residual2, a.fcproj, rows * C);
}

static void block_forward(loom_gpt *m, const chunk_view *ch, int i, const float *residual, int B,
                          int T) {
    if (m->sequence_parallel) {
        block_forward_sp(m, ch, i, residual, B, T);
        return;
    }
    const loom_backend *be = m->backend;
    int C = m->config.channels, tp = m->tp_size;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, tp);
    int64_t N = (int64_t)B * T;
    layer_acts a = layer_view(m, i, B, T);
    /* this block's slice of every per-layer tensor */
    loom_gpt_tensors p = block_tensors(m, m->unit_params, ch->first + i);
    norm_forward(m, a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1w, p.ln1b, N);
    /* column-parallel QKV: this rank's heads */
    be->matmul_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, N, C, (int)w.qkv);
    qkv_positions(m, a.qkv, B, T);
    progress(m);
    attention_forward(m, a.atty, a.att, a.qkv, B, T);
    progress(m);
    row_parallel_forward(m, a.attproj, a.atty, p.attprojw, p.attprojb, N, (int)w.q, C);
    be->residual_forward(a.residual2, residual, a.attproj, N * C);
    norm_forward(m, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2w, p.ln2b, N);
    progress(m);
    be->matmul_forward(a.fch, a.ln2, p.fcw, p.fcb, N, C, (int)w.fc);
    progress(m);
    mlp_activation(m, a.fch_gelu, a.fch, N);
    row_parallel_forward(m, a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb, N, (int)w.ffn, C);
    be->residual_forward(a.residual3, a.residual2, a.fcproj, N * C);
}

/* Vocabulary-parallel embedding: each rank looks up the rows it holds, the sum completes them. */
static void embed_forward(loom_gpt *m, const int32_t *inputs, int B, int T) {
    const loom_backend *be = m->backend;
    int C = m->config.channels;
    if (m->tp_size == 1 && m->embed_lookup) {
        m->embed_lookup(m->embed_lookup_ctx, m->acts.encoded, inputs, B, T);
        return;
    }
    fire_held_event(m, 0);
    if (m->tp_size == 1 && !is_llama(m)) {
        be->encoder_forward(m->acts.encoded, inputs, unit_tensor(m, m->unit_params, LOOM_WTE),
                            unit_tensor(m, m->unit_params, LOOM_WPE), B, T, C);
        return;
    }
    /* (Llama, or TP): the lookup of the rows this rank holds (all of them at tp 1), then GPT-2's
     * positions after the sum; Llama's positions are rotary, inside attention */
    int64_t N = (int64_t)B * T;
    int rows = m->config.padded_vocab_size / m->tp_size;
    const float *wpe = unit_tensor(m, m->unit_params, LOOM_WPE);
    if (m->sequence_parallel) {
        /* every row's partial lookup, reduce-scattered: this rank's rows, then their positions */
        float *partial = m->grad_acts.dbtc;
        be->encoder_shard_forward(partial, inputs, unit_tensor(m, m->unit_params, LOOM_WTE), N, C,
                                  m->vocab_start, rows);
        sp_scatter(m, m->acts.encoded, partial, N, C);
        int64_t own = N / m->tp_size;
        if (wpe) position_forward_rows(m, m->acts.encoded, wpe, m->tp_rank * own, own, T, C);
        return;
    }
    be->encoder_shard_forward(m->acts.encoded, inputs, unit_tensor(m, m->unit_params, LOOM_WTE), N,
                              C, m->vocab_start, rows);
    tp_allreduce(m, m->acts.encoded, N * C, LOOM_REDUCE_SUM);
    if (wpe) be->position_forward(m->acts.encoded, wpe, B, T, C);
}

/* Vocabulary-parallel softmax cross-entropy (Megatron): no rank sees all logits; the loss
 * needs only the max, the sum of exponentials and the target's logit, summed over ranks. */
static void xent_parallel_forward(loom_gpt *m, const int32_t *targets, int64_t N) {
    const loom_backend *be = m->backend;
    int Vpl = m->config.padded_vocab_size / m->tp_size, Vl = m->vocab_local;
    float *probs = m->acts.probs, *row_max = m->acts.row_max;
    float *sums = m->acts.row_stats, *target_logits = m->acts.row_stats + N;
    be->softmax_xent_shard_max(row_max, probs, N, Vl, Vpl);
    tp_allreduce(m, row_max, N, LOOM_REDUCE_MAX);
    be->softmax_xent_shard_expsum(probs, sums, target_logits, probs, row_max, targets, N, Vl, Vpl,
                                  m->vocab_start);
    tp_allreduce(m, sums, 2 * N, LOOM_REDUCE_SUM); /* sums and target_logits, adjacent */
    be->softmax_xent_shard_forward(m->acts.losses, probs, sums, target_logits, targets, N, Vl, Vpl);
}

static float forward_chunk(loom_gpt *m, const chunk_view *ch, const int32_t *inputs,
                           const float *input, const int32_t *targets, int B, int T) {
    const loom_backend *be = m->backend;
    const loom_gpt_config *c = &m->config;
    int C = c->channels, V = c->vocab_size;
    int Vpl = c->padded_vocab_size / m->tp_size;
    int64_t N = (int64_t)B * T;
    /* callers reserve first; the check is cheap and turns misuse into a clear message */
    if (!m->acts_memory || (int64_t)B * T > (int64_t)m->B * m->T || T > m->T) {
        loom_fatal("loom_gpt_forward_stage: B %d x T %d does not fit the reserved activations "
                   "(B %d x T %d%s); call loom_gpt_reserve_slots first",
                   B, T, m->B, m->T, m->acts_memory ? "" : ", none reserved");
    }
    m->cur_B = B;
    m->cur_T = T;

    if (m->sequence_parallel && N % m->tp_size != 0) {
        loom_fatal("loom_gpt_forward_stage: sequence parallelism: B %d x T %d rows do not divide "
                   "by tp %d",
                   B, T, m->tp_size);
    }
    int64_t rows = loom_gpt_rows(m, B, T); /* of the residual stream on this rank */
    if (ch->has_embedding) {
        memcpy(m->inputs, inputs, (size_t)N * sizeof(int32_t));
        embed_forward(m, inputs, B, T);
    } else {
        if (!input) loom_fatal("forward of a chunk without the embedding: no input given");
        memcpy(m->acts.encoded, input, (size_t)(rows * C) * sizeof(float));
    }
    const float *residual = m->acts.encoded;
    for (int i = 0; i < ch->layers; i++) {
        fire_unit_event(m, ch->first + i, LOOM_GPT_UNIT_PARAMS_FORWARD);
        block_forward(m, ch, i, residual, B, T);
        fire_unit_event(m, ch->first + i, LOOM_GPT_UNIT_PARAMS_DONE);
        residual = layer_view(m, i, B, T).residual3;
    }
    if (!ch->has_head) return 0.0f;
    /* the final LayerNorm on this rank's rows; under SP its output is gathered whole (the
     * vocabulary-parallel loss needs every row) and kept so, for the LM head's weight gradient */
    float *lnf_rows = m->sequence_parallel ? m->grad_acts.dbtc : m->acts.lnf;
    fire_held_event(m, m->num_units - 1);
    if (!m->config.untied_head) fire_held_event(m, 0);
    norm_forward(m, lnf_rows, m->acts.lnf_mean, m->acts.lnf_rstd, residual,
                 unit_tensor(m, m->unit_params, LOOM_LNFW),
                 unit_tensor(m, m->unit_params, LOOM_LNFB), rows);
    if (m->sequence_parallel) sp_gather(m, m->acts.lnf, lnf_rows, N, C);
    /* logits of this rank's vocabulary rows (all of them without TP) */
    be->matmul_forward(m->acts.probs, m->acts.lnf, unit_tensor(m, m->unit_params, head_tensor(m)),
                       NULL, N, C, Vpl);
    if (!targets) {
        m->mean_loss = 0.0f;
        return 0.0f;
    }
    memcpy(m->targets, targets, (size_t)N * sizeof(int32_t));
    if (m->tp_size == 1) {
        be->softmax_xent_forward(m->acts.losses, m->acts.probs, m->acts.probs, targets, N, V, Vpl);
    } else {
        xent_parallel_forward(m, targets, N);
    }
    double sum = 0.0;
    int64_t counted = 0;
    for (int64_t i = 0; i < N; i++) {
        if (targets[i] >= 0) {
            sum += m->acts.losses[i];
            counted++;
        }
    }
    m->mean_loss = counted ? (float)(sum / (double)counted) : 0.0f;
    return m->mean_loss;
}

float loom_gpt_forward_chunk(loom_gpt *m, int chunk, const int32_t *inputs, const float *input,
                             const int32_t *targets, int B, int T) {
    chunk_view ch = chunk_of(m, chunk, "loom_gpt_forward_chunk");
    return forward_chunk(m, &ch, inputs, input, targets, B, T);
}

float loom_gpt_forward_stage(loom_gpt *m, const int32_t *inputs, const float *input,
                             const int32_t *targets, int B, int T) {
    chunk_view ch = chunk_of(m, 0, "loom_gpt_forward_stage");
    return forward_chunk(m, &ch, inputs, input, targets, B, T);
}

float loom_gpt_forward(loom_gpt *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    return loom_gpt_forward_stage(m, inputs, NULL, targets, B, T);
}

const float *loom_gpt_chunk_output(loom_gpt *m, int chunk) {
    chunk_view ch = chunk_of(m, chunk, "loom_gpt_chunk_output");
    return chunk_last_residual(m, &ch, m->cur_B, m->cur_T);
}

const float *loom_gpt_stage_output(loom_gpt *m) {
    return loom_gpt_chunk_output(m, 0);
}

const float *loom_gpt_chunk_input_grad(const loom_gpt *m) {
    return m->grad_acts.dresidual;
}

const float *loom_gpt_stage_input_grad(const loom_gpt *m) {
    return loom_gpt_chunk_input_grad(m);
}

/* A column-parallel GEMM's input for its weight gradient: the LayerNorm output it kept, which
 * under sequence parallelism is this rank's rows, gathered again (as Megatron does, trading an
 * all-gather for (N, C) of memory per LayerNorm) into dfch2, free wherever a weight gradient is
 * computed (after GELU's backward in the MLP, after attention-out's in attention, and in W). */
static const float *gathered_input(loom_gpt *m, const float *kept, int64_t N) {
    if (!m->sequence_parallel) return kept;
    sp_gather(m, m->grad_acts.dfch2, kept, N, m->config.channels);
    return m->grad_acts.dfch2;
}

/* The row-parallel GEMMs' bias gradients (attprojb, fcprojb) come out of their weight gradient
 * from the whole (N, C) output gradient, which under sequence parallelism is gathered before the
 * GEMM's backward: every rank then sums every row, so they need no TP sum (Megatron sums each
 * rank's rows over the group instead; the same numbers).
 * The weight half of block l's GEMM `which`: dW += dout^T inp, db += the column sums of dout. */
static void block_weight_grad(loom_gpt *m, const layer_acts *a, int l, int which, const float *dout,
                              int64_t N) {
    const loom_backend *be = m->backend;
    loom_gpt_tensors g = block_tensors(m, m->unit_grads, l);
    int C = m->config.channels;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    switch (which) {
    case GEMM_FCPROJ: /* row-parallel: (N, F/tp) -> (N, C) */
        be->matmul_backward_weight(g.fcprojw, g.fcprojb, dout, a->fch_gelu, N, (int)w.ffn, C);
        break;
    case GEMM_FC: /* column-parallel: (N, C) -> (N, 4C/tp; Llama's [gate | up] 2F/tp) */
        be->matmul_backward_weight(g.fcw, g.fcb, dout, gathered_input(m, a->ln2, N), N, C,
                                   (int)w.fc);
        break;
    case GEMM_ATTPROJ: /* row-parallel: (N, C/tp) -> (N, C) */
        be->matmul_backward_weight(g.attprojw, g.attprojb, dout, a->atty, N, (int)w.q, C);
        break;
    default: /* GEMM_QKV, column-parallel: (N, C) -> (N, (NH + 2 KV) hs / tp) */
        be->matmul_backward_weight(g.qkvw, g.qkvb, dout, gathered_input(m, a->ln1, N), N, C,
                                   (int)w.qkv);
        break;
    }
    progress(m);
}

/* After a GEMM's input gradient: its weight gradient at once (fused backward), or its output
 * gradient kept for W (split; nothing to copy when it was computed in place there). */
static void weight_grad_or_keep(loom_gpt *m, const layer_acts *a, int l, int which,
                                const float *dout, int64_t N, int64_t width, int split) {
    progress(m); /* after the input gradient's GEMM */
    if (!split) {
        block_weight_grad(m, a, l, which, dout, N);
    } else if (a->dout[which] != dout) {
        if (!a->dout[which]) loom_fatal("split backward without its slots reserved split");
        memcpy(a->dout[which], dout, (size_t)(N * width) * sizeof(float));
    }
}

static void block_backward_sp(loom_gpt *m, const chunk_view *ch, int i, const float *residual,
                              int B, int T, int split);

/* Block i of a chunk, backward from d(residual3) in dresidual to d(residual) there: the input
 * gradients, LayerNorm's gradients, and (fused) the GEMMs' weight gradients as each GEMM is done,
 * or (split) their output gradients kept in the slot for block_backward_weight. */
static void block_backward(loom_gpt *m, const chunk_view *ch, int i, const float *residual, int B,
                           int T, int split) {
    if (m->sequence_parallel) {
        block_backward_sp(m, ch, i, residual, B, T, split);
        return;
    }
    const loom_backend *be = m->backend;
    const loom_gpt_grad_acts *ga = &m->grad_acts;
    int C = m->config.channels, tp = m->tp_size;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, tp);
    int64_t N = (int64_t)B * T;
    size_t btc = (size_t)N * (size_t)C, n = (size_t)N;
    layer_acts a = layer_view(m, i, B, T);
    int l = ch->first + i; /* the local layer: its parameters */
    loom_gpt_tensors p = block_tensors(m, m->unit_params, l);
    loom_gpt_tensors g = block_tensors(m, m->unit_grads, l);
    float *dres = ga->dresidual; /* holds d(residual3) on entry, d(residual) on exit */
    /* a split backward computes these two straight into the slot */
    float *dfch = split ? a.dout[GEMM_FC] : ga->dfch;
    float *dqkv = split ? a.dout[GEMM_QKV] : ga->dqkv;

    /* MLP: residual3 = residual2 + fcproj(act(fc(ln2(residual2)))) */
    memset(ga->dfch2, 0, n * (size_t)w.ffn * sizeof(float));
    be->matmul_backward_input(ga->dfch2, dres, p.fcprojw, N, (int)w.ffn, C);
    weight_grad_or_keep(m, &a, l, GEMM_FCPROJ, dres, N, C, split);
    memset(dfch, 0, n * (size_t)w.fc * sizeof(float));
    mlp_activation_backward(m, dfch, a.fch, ga->dfch2, N);
    memset(ga->dbtc, 0, btc * sizeof(float));
    be->matmul_backward_input(ga->dbtc, dfch, p.fcw, N, C, (int)w.fc);
    weight_grad_or_keep(m, &a, l, GEMM_FC, dfch, N, w.fc, split);
    tp_allreduce(m, ga->dbtc, N * C, LOOM_REDUCE_SUM); /* column-parallel input gradient */
    norm_backward(m, dres, g.ln2w, g.ln2b, ga->dbtc, a.residual2, p.ln2w, a.ln2_mean, a.ln2_rstd,
                  N);

    /* attention: residual2 = residual + attproj(attention(qkv(ln1(residual)))) */
    memset(ga->dbtc2, 0, n * (size_t)w.q * sizeof(float));
    be->matmul_backward_input(ga->dbtc2, dres, p.attprojw, N, (int)w.q, C);
    weight_grad_or_keep(m, &a, l, GEMM_ATTPROJ, dres, N, C, split);
    if (m->selective) {
        /* the softmax again, by the forward's kernel from the kept qkv: the same bits; its
         * attention output is thrown away (dbtc is free until the QKV input gradient) */
        attention_forward(m, ga->dbtc, a.att, a.qkv, B, T);
    }
    memset(dqkv, 0, n * (size_t)w.qkv * sizeof(float));
    attention_backward(m, dqkv, ga->dbtc2, a.qkv, a.att, B, T);
    qkv_positions_backward(m, dqkv, B, T);
    memset(ga->dbtc, 0, btc * sizeof(float));
    be->matmul_backward_input(ga->dbtc, dqkv, p.qkvw, N, C, (int)w.qkv);
    weight_grad_or_keep(m, &a, l, GEMM_QKV, dqkv, N, w.qkv, split);
    tp_allreduce(m, ga->dbtc, N * C, LOOM_REDUCE_SUM);
    norm_backward(m, dres, g.ln1w, g.ln1b, ga->dbtc, residual, p.ln1w, a.ln1_mean, a.ln1_rstd, N);
}

/* block_backward under sequence parallelism: dresidual holds this rank's rows. The row-parallel
 * GEMMs' output gradients are gathered whole before their backward, the column-parallel GEMMs'
 * input gradients reduce-scattered to rows before the LayerNorms' backward, whose replicated
 * weight and bias gradients (of this rank's rows) are summed over TP once per block. Scratch:
 * dbtc2 and dfch2 take the gathered gradients in turn, dbtc the partial sums (and selective
 * recomputation's throw-away attention output), dfch2 the re-gathered LayerNorm outputs. */
static void block_backward_sp(loom_gpt *m, const chunk_view *ch, int i, const float *residual,
                              int B, int T, int split) {
    const loom_backend *be = m->backend;
    const loom_gpt_grad_acts *ga = &m->grad_acts;
    int C = m->config.channels, tp = m->tp_size;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, tp);
    int64_t N = (int64_t)B * T, rows = N / tp;
    size_t n = (size_t)N;
    layer_acts a = layer_view(m, i, B, T);
    int l = ch->first + i;
    loom_gpt_tensors p = block_tensors(m, m->unit_params, l);
    loom_gpt_tensors g = block_tensors(m, m->unit_grads, l);
    float *dres = ga->dresidual; /* this rank's rows: d(residual3) on entry, d(residual) on exit */
    float *dfch = split ? a.dout[GEMM_FC] : ga->dfch;
    float *dqkv = split ? a.dout[GEMM_QKV] : ga->dqkv;
    float *own = ga->dbtc + m->tp_rank * rows * C; /* this rank's block after a reduce-scatter */
    memset(ga->dnorm, 0, 4 * (size_t)C * sizeof(float)); /* ln1w, ln1b, ln2w, ln2b */

    /* MLP */
    sp_gather(m, ga->dbtc2, dres, N, C);
    memset(ga->dfch2, 0, n * (size_t)w.ffn * sizeof(float));
    be->matmul_backward_input(ga->dfch2, ga->dbtc2, p.fcprojw, N, (int)w.ffn, C);
    weight_grad_or_keep(m, &a, l, GEMM_FCPROJ, ga->dbtc2, N, C, split);
    memset(dfch, 0, n * (size_t)w.fc * sizeof(float));
    mlp_activation_backward(m, dfch, a.fch, ga->dfch2, N);
    memset(ga->dbtc, 0, (size_t)(N * C) * sizeof(float));
    be->matmul_backward_input(ga->dbtc, dfch, p.fcw, N, C, (int)w.fc);
    weight_grad_or_keep(m, &a, l, GEMM_FC, dfch, N, w.fc, split);
    sp_scatter(m, own, ga->dbtc, N, C);
    norm_backward(m, dres, ga->dnorm + 2 * C, ga->dnorm + 3 * C, own, a.residual2, p.ln2w,
                  a.ln2_mean, a.ln2_rstd, rows);

    /* attention */
    sp_gather(m, ga->dfch2, dres, N, C);
    memset(ga->dbtc2, 0, n * (size_t)w.q * sizeof(float));
    be->matmul_backward_input(ga->dbtc2, ga->dfch2, p.attprojw, N, (int)w.q, C);
    weight_grad_or_keep(m, &a, l, GEMM_ATTPROJ, ga->dfch2, N, C, split);
    if (m->selective) attention_forward(m, ga->dbtc, a.att, a.qkv, B, T);
    memset(dqkv, 0, n * (size_t)w.qkv * sizeof(float));
    attention_backward(m, dqkv, ga->dbtc2, a.qkv, a.att, B, T);
    qkv_positions_backward(m, dqkv, B, T);
    memset(ga->dbtc, 0, (size_t)(N * C) * sizeof(float));
    be->matmul_backward_input(ga->dbtc, dqkv, p.qkvw, N, C, (int)w.qkv);
    weight_grad_or_keep(m, &a, l, GEMM_QKV, dqkv, N, w.qkv, split);
    sp_scatter(m, own, ga->dbtc, N, C);
    norm_backward(m, dres, ga->dnorm, ga->dnorm + C, own, residual, p.ln1w, a.ln1_mean, a.ln1_rstd,
                  rows);
    /* (Llama: no biases, so the bias slots of dnorm stay zero and go nowhere) */
    float *norms[4] = {g.ln1w, g.ln1b, g.ln2w, g.ln2b};
    sp_norm_grads_add(m, norms, 4);
}

/* W of a chunk's block i: its four GEMMs' weight gradients from the output gradients B kept. */
static void block_backward_weight(loom_gpt *m, const chunk_view *ch, int i, int B, int T) {
    layer_acts a = layer_view(m, i, B, T);
    for (int which = 0; which < BLOCK_GEMMS; which++) {
        block_weight_grad(m, &a, ch->first + i, which, a.dout[which], (int64_t)B * T);
    }
}

/* The embeddings' gradients from dout, the gradient of the embedding's output (B,T,C). */
static void embed_backward(loom_gpt *m, const float *dout, int B, int T) {
    const loom_backend *be = m->backend;
    int C = m->config.channels;
    if (m->tp_size == 1 && m->embed_lookup_backward) {
        m->embed_lookup_backward(m->embed_lookup_ctx, dout, m->inputs, B, T);
        return;
    }
    if (m->tp_size == 1 && !is_llama(m)) {
        be->encoder_backward(unit_tensor(m, m->unit_grads, LOOM_WTE),
                             unit_tensor(m, m->unit_grads, LOOM_WPE), dout, m->inputs, B, T, C);
        return;
    }
    int rows = m->config.padded_vocab_size / m->tp_size;
    if (m->sequence_parallel) {
        /* every row's gradient, gathered: the lookup's rows of wte are anyone's tokens, and wpe's
         * gradient then sums every row on every rank (no TP sum needed) */
        sp_gather(m, m->grad_acts.dbtc, dout, (int64_t)B * T, C);
        dout = m->grad_acts.dbtc;
    }
    float *dwpe = unit_tensor(m, m->unit_grads, LOOM_WPE); /* none in Llama */
    if (dwpe) be->position_backward(dwpe, dout, B, T, C);
    be->encoder_shard_backward(unit_tensor(m, m->unit_grads, LOOM_WTE), dout, m->inputs,
                               (int64_t)B * T, C, m->vocab_start, rows);
}

/* The LM head's weight gradient: dW += dlogits^T lnf (dlogits in probs), W wte when tied (its
 * unit then hears of it), else the untied head (held with the final norm, synced at the end). */
static void head_backward_weight(loom_gpt *m) {
    const loom_gpt_config *c = &m->config;
    m->backend->matmul_backward_weight(unit_tensor(m, m->unit_grads, head_tensor(m)), NULL,
                                       m->acts.probs, m->acts.lnf, (int64_t)m->cur_B * m->cur_T,
                                       c->channels, c->padded_vocab_size / m->tp_size);
    if (m->unit_event && !c->untied_head)
        m->unit_event(m->unit_event_ctx, 0, LOOM_GPT_UNIT_GRADS_DONE);
}

/* The head's backward into dresidual: probs -> dlogits in place, the tied LM head's input
 * gradient (and, fused, its weight gradient; split, W reads dlogits from probs), then the final
 * LayerNorm. */
static void head_backward(loom_gpt *m, const chunk_view *ch, float dloss, int split) {
    const loom_backend *be = m->backend;
    const loom_gpt_config *c = &m->config;
    int B = m->cur_B, T = m->cur_T, C = c->channels;
    int Vpl = c->padded_vocab_size / m->tp_size;
    int64_t N = (int64_t)B * T;
    const loom_gpt_grad_acts *ga = &m->grad_acts;
    if (m->tp_size == 1) {
        be->softmax_xent_backward(m->acts.probs, m->acts.probs, m->targets, dloss, N, c->vocab_size,
                                  Vpl);
    } else {
        be->softmax_xent_shard_backward(m->acts.probs, m->acts.probs, m->targets, dloss, N,
                                        m->vocab_local, Vpl, m->vocab_start);
    }
    memset(ga->dbtc, 0, (size_t)N * C * sizeof(float));
    be->matmul_backward_input(ga->dbtc, m->acts.probs,
                              unit_tensor(m, m->unit_params, head_tensor(m)), N, C, Vpl);
    if (!split) head_backward_weight(m);
    int64_t rows = loom_gpt_rows(m, B, T);
    float *dlnf = ga->dbtc;
    float *dlnfw = unit_tensor(m, m->unit_grads, LOOM_LNFW);
    float *dlnfb = unit_tensor(m, m->unit_grads, LOOM_LNFB);
    if (m->sequence_parallel) {
        /* this rank's rows of d(lnf); the final LayerNorm's gradients of them, summed over TP */
        dlnf = ga->dbtc + m->tp_rank * rows * C;
        sp_scatter(m, dlnf, ga->dbtc, N, C);
        memset(ga->dnorm, 0, 2 * (size_t)C * sizeof(float));
        dlnfw = ga->dnorm, dlnfb = ga->dnorm + C;
    } else {
        tp_allreduce(m, ga->dbtc, N * C, LOOM_REDUCE_SUM);
    }
    memset(ga->dresidual, 0, (size_t)(rows * C) * sizeof(float));
    const float *last = chunk_last_residual(m, ch, B, T);
    norm_backward(m, ga->dresidual, dlnfw, dlnfb, dlnf, last,
                  unit_tensor(m, m->unit_params, LOOM_LNFW), m->acts.lnf_mean, m->acts.lnf_rstd,
                  rows);
    if (m->sequence_parallel) {
        float *norms[2] = {unit_tensor(m, m->unit_grads, LOOM_LNFW),
                           unit_tensor(m, m->unit_grads, LOOM_LNFB)};
        sp_norm_grads_add(m, norms, 2);
    }
}

static void notify_grads_ready(loom_gpt *m, size_t ready_offset) {
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, ready_offset);
}

/* Where block l's gradients begin: once it is done, only lower offsets change. */
static size_t block_grads_offset(const loom_gpt *m, int l) {
    return m->info[LOOM_LN1W].offset + (size_t)l * m->layer_stride;
}

/* The chunk's backward from the loss (head) or output_grad, down to d(input) in dresidual:
 * fused (the weight gradients as it goes, grads_ready after each block) or B only. */
static void backward(loom_gpt *m, const chunk_view *ch, float dloss, const float *output_grad,
                     int split) {
    int B = m->cur_B, T = m->cur_T, C = m->config.channels;
    size_t btc = (size_t)loom_gpt_rows(m, B, T) * (size_t)C; /* this rank's rows */
    if (ch->has_head) {
        head_backward(m, ch, dloss, split);
    } else {
        if (!output_grad) loom_fatal("backward of a chunk without the head: no output gradient");
        memcpy(m->grad_acts.dresidual, output_grad, btc * sizeof(float));
    }
    for (int i = ch->layers - 1; i >= 0; i--) {
        const float *residual = i > 0 ? layer_view(m, i - 1, B, T).residual3 : m->acts.encoded;
        fire_unit_event(m, ch->first + i, LOOM_GPT_UNIT_PARAMS_BACKWARD);
        fire_unit_event(m, ch->first + i, LOOM_GPT_UNIT_GRADS);
        block_backward(m, ch, i, residual, B, T, split);
        fire_unit_event(m, ch->first + i, LOOM_GPT_UNIT_PARAMS_DONE);
        if (!split) fire_unit_event(m, ch->first + i, LOOM_GPT_UNIT_GRADS_DONE);
        if (!split) notify_grads_ready(m, block_grads_offset(m, ch->first + i));
    }
    /* the embedding chunk ends in the embeddings; others leave d(input) in dresidual */
    if (split) {
        if (ch->has_embedding) {
            memcpy(m->acts.dencoded, m->grad_acts.dresidual, btc * sizeof(float));
        }
        return;
    }
    if (ch->has_embedding) embed_backward(m, m->grad_acts.dresidual, B, T);
    /* after the rank's lowest chunk nothing of this backward is left to run here */
    if (ch->index == 0) notify_grads_ready(m, 0);
}

static void backward_weight(loom_gpt *m, const chunk_view *ch) {
    int B = m->cur_B, T = m->cur_T;
    /* the fused backward's order, so that its gradients come out the same bits */
    if (ch->has_head) head_backward_weight(m);
    for (int i = ch->layers - 1; i >= 0; i--) {
        fire_unit_event(m, ch->first + i, LOOM_GPT_UNIT_GRADS);
        block_backward_weight(m, ch, i, B, T);
        fire_unit_event(m, ch->first + i, LOOM_GPT_UNIT_GRADS_DONE);
        notify_grads_ready(m, block_grads_offset(m, ch->first + i));
    }
    if (ch->has_embedding) embed_backward(m, m->acts.dencoded, B, T);
    if (ch->index == 0) notify_grads_ready(m, 0);
}

static void require_split(const loom_gpt *m, const char *caller) {
    if (!m->split_backward) {
        loom_fatal("%s: the activation slots keep nothing for W; reserve them with "
                   "loom_gpt_reserve_slots_split",
                   caller);
    }
}

void loom_gpt_backward_chunk(loom_gpt *m, int chunk, float dloss, const float *output_grad) {
    chunk_view ch = chunk_of(m, chunk, "loom_gpt_backward_chunk");
    backward(m, &ch, dloss, output_grad, 0);
}

void loom_gpt_backward_chunk_input(loom_gpt *m, int chunk, float dloss, const float *output_grad) {
    chunk_view ch = chunk_of(m, chunk, "loom_gpt_backward_chunk_input");
    require_split(m, "loom_gpt_backward_chunk_input");
    backward(m, &ch, dloss, output_grad, 1);
}

void loom_gpt_backward_chunk_weight(loom_gpt *m, int chunk) {
    chunk_view ch = chunk_of(m, chunk, "loom_gpt_backward_chunk_weight");
    require_split(m, "loom_gpt_backward_chunk_weight");
    backward_weight(m, &ch);
}

/* What B left for W in the current slot, as (pointer, floats) pieces in a fixed order: every
 * block's four GEMM output gradients (the chunk's layers, packed by the current shape), the
 * embedding's, and on the head chunk the logits' gradient (B leaves it in probs). */
static int weight_state_pieces(loom_gpt *m, const chunk_view *ch, float *ptr[6], size_t n[6]) {
    size_t N = (size_t)m->cur_B * (size_t)m->cur_T, C = (size_t)m->config.channels;
    size_t L = (size_t)ch->layers;
    loom_gpt_widths w = loom_gpt_widths_of(&m->config, m->tp_size);
    size_t rows = (size_t)loom_gpt_rows(m, m->cur_B, m->cur_T);
    int k = 0;
    ptr[k] = m->acts.dfcproj, n[k++] = L * N * C;
    ptr[k] = m->acts.dfch, n[k++] = L * N * (size_t)w.fc;
    ptr[k] = m->acts.dattproj, n[k++] = L * N * C;
    ptr[k] = m->acts.dqkv, n[k++] = L * N * (size_t)w.qkv;
    if (ch->has_embedding) ptr[k] = m->acts.dencoded, n[k++] = rows * C;
    if (ch->has_head) {
        ptr[k] = m->acts.probs;
        n[k++] = N * (size_t)(m->config.padded_vocab_size / m->tp_size);
    }
    return k;
}

size_t loom_gpt_weight_state_floats(loom_gpt *m, int chunk, int B, int T) {
    chunk_view ch = chunk_of(m, chunk, "loom_gpt_weight_state_floats");
    require_split(m, "loom_gpt_weight_state_floats");
    int shape[2] = {m->cur_B, m->cur_T};
    m->cur_B = B, m->cur_T = T;
    float *ptr[6];
    size_t n[6], total = 0;
    int k = weight_state_pieces(m, &ch, ptr, n);
    for (int i = 0; i < k; i++) total += n[i];
    m->cur_B = shape[0], m->cur_T = shape[1];
    return total;
}

void loom_gpt_weight_state_save(loom_gpt *m, int chunk, float *dst) {
    chunk_view ch = chunk_of(m, chunk, "loom_gpt_weight_state_save");
    require_split(m, "loom_gpt_weight_state_save");
    float *ptr[6];
    size_t n[6];
    int k = weight_state_pieces(m, &ch, ptr, n);
    for (int i = 0; i < k; i++) {
        memcpy(dst, ptr[i], n[i] * sizeof(float));
        dst += n[i];
    }
}

void loom_gpt_weight_state_load(loom_gpt *m, int chunk, const float *src) {
    chunk_view ch = chunk_of(m, chunk, "loom_gpt_weight_state_load");
    require_split(m, "loom_gpt_weight_state_load");
    float *ptr[6];
    size_t n[6];
    int k = weight_state_pieces(m, &ch, ptr, n);
    for (int i = 0; i < k; i++) {
        memcpy(ptr[i], src, n[i] * sizeof(float));
        src += n[i];
    }
}

void loom_gpt_backward_stage(loom_gpt *m, float dloss, const float *output_grad) {
    loom_gpt_backward_chunk(m, 0, dloss, output_grad);
}

void loom_gpt_backward(loom_gpt *m, float dloss) {
    loom_gpt_backward_stage(m, dloss, NULL);
}

void loom_gpt_backward_input(loom_gpt *m, float dloss, const float *output_grad) {
    loom_gpt_backward_chunk_input(m, 0, dloss, output_grad);
}

void loom_gpt_backward_weight(loom_gpt *m) {
    loom_gpt_backward_chunk_weight(m, 0);
}

void loom_gpt_zero_grad(loom_gpt *m) {
    if (m->grads_memory) memset(m->grads_memory, 0, m->num_params * sizeof(float));
}

void loom_gpt_set_unit_events(loom_gpt *m, void (*event)(void *ctx, int unit, int event),
                              void *ctx) {
    m->unit_event = event;
    m->unit_event_ctx = ctx;
}

void loom_gpt_set_embed_lookup(
    loom_gpt *m, void (*lookup)(void *ctx, float *out, const int32_t *inputs, int B, int T),
    void (*lookup_backward)(void *ctx, const float *dout, const int32_t *inputs, int B, int T),
    void *ctx) {
    m->embed_lookup = lookup;
    m->embed_lookup_backward = lookup_backward;
    m->embed_lookup_ctx = ctx;
}

void loom_gpt_drop_grads(loom_gpt *m) {
    loom_free_aligned(m->grads_memory);
    m->grads_memory = NULL;
    memset(&m->grads, 0, sizeof m->grads);
}

void loom_gpt_set_grads_ready(loom_gpt *m, void (*grads_ready)(void *ctx, size_t ready_offset),
                              void *ctx) {
    m->grads_ready = grads_ready;
    m->grads_ready_ctx = ctx;
}
