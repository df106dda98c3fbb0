/*
 * layout.c — the flat parameter buffer's layout: each tensor's shape, offset and per-layer stride
 * for a rank holding some blocks (and the embedding and/or the head) of one tensor-parallel
 * shard; the matrices a packed tensor holds; parameter and FLOP counts.
 *
 * Not here: the allocation (gpt.c), the configuration's rules (config.c).
 */
#include "model/model_internal.h"

#include <string.h>

int loom_gpt_tensor_is_sharded(int k) {
    return k == LOOM_WTE || k == LOOM_QKVW || k == LOOM_QKVB || k == LOOM_ATTPROJW ||
           k == LOOM_FCW || k == LOOM_FCB || k == LOOM_FCPROJW || k == LOOM_LMHEAD;
}

int loom_gpt_matrix_parts(const loom_gpt_config *config, int tp, int k,
                          int64_t rows[LOOM_MAX_MATRIX_PARTS]) {
    loom_gpt_widths w = loom_gpt_widths_of(config, tp);
    if (k == LOOM_QKVW) {
        rows[0] = w.q, rows[1] = rows[2] = w.kv * w.hd;
        return 3;
    }
    if (k == LOOM_FCW && config->arch == LOOM_ARCH_LLAMA) {
        rows[0] = rows[1] = w.ffn;
        return 2;
    }
    /* one matrix: its rows (the axis before the columns; a vector is one row) */
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout_tp(config, tp, info);
    const loom_gpt_tensor_info *ti = &info[k];
    int matrix_dims = ti->per_layer ? ti->ndim - 1 : ti->ndim;
    rows[0] = matrix_dims == 2 ? ti->shape[ti->ndim - 2] : 1;
    return 1;
}

size_t loom_gpt_layout(const loom_gpt_config *config,
                       loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]) {
    return loom_gpt_layout_tp(config, 1, info);
}

size_t loom_gpt_layout_tp(const loom_gpt_config *config, int tp,
                          loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]) {
    return loom_gpt_layout_shard(config, tp, 0, config->num_layers, info);
}

/* The layout of a rank holding L blocks, and the embedding and/or the head. */
static size_t layout(const loom_gpt_config *config, int tp, int64_t L, int has_embedding,
                     int has_head, loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]) {
    int64_t C = config->channels;
    int llama = config->arch == LOOM_ARCH_LLAMA, untied = config->untied_head != 0;
    /* what a rank does not use it does not hold (0 rows): wte is the embedding's lookup and the
     * head's tied LM head, wpe only the embedding's, the final LayerNorm the head's; an untied
     * head is the head's own */
    int64_t Vpl = config->padded_vocab_size / tp;
    int64_t Vp = has_embedding || (has_head && !untied) ? Vpl : 0;
    int64_t maxT = has_embedding && !llama ? config->max_seq_len : 0, Cf = has_head ? C : 0;
    int64_t Cl = C / tp; /* this rank's columns */
    loom_gpt_widths w = loom_gpt_widths_of(config, tp);
    int64_t bias = llama ? 0 : 1; /* Llama has no biases: their tensors take no space */
    const struct {
        const char *name;
        int ndim;
        int64_t shape[3];
        int decay;
    } spec[LOOM_NUM_PARAM_TENSORS] = {
        {"wte", 2, {Vp, C}, 1},
        {"wpe", 2, {maxT, C}, 1},
        {"ln1w", 2, {L, C}, 0},
        {"ln1b", 2, {L, bias * C}, 0},
        {"qkvw", 3, {L, w.qkv, C}, 1},
        {"qkvb", 2, {L, bias * w.qkv}, 0},
        {"attprojw", 3, {L, C, Cl}, 1},
        {"attprojb", 2, {L, bias * C}, 0},
        {"ln2w", 2, {L, C}, 0},
        {"ln2b", 2, {L, bias * C}, 0},
        {"fcw", 3, {L, w.fc, C}, 1},
        {"fcb", 2, {L, bias * w.fc}, 0},
        {"fcprojw", 3, {L, C, w.ffn}, 1},
        {"fcprojb", 2, {L, bias * C}, 0},
        {"lnfw", 1, {Cf}, 0},
        {"lnfb", 1, {bias * Cf}, 0},
        {"lmhead", 2, {has_head && untied ? Vpl : 0, C}, 1},
    };
    /* layer-major: global tensors first (wte, wpe), then the blocks, then lnfw, lnfb; a tensor
     * the stage does not hold takes no space where it would be */
    size_t layer_numel_total = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        loom_gpt_tensor_info *ti = &info[k];
        ti->name = spec[k].name;
        ti->ndim = spec[k].ndim;
        ti->numel = 1;
        for (int d = 0; d < 3; d++) {
            ti->shape[d] = d < spec[k].ndim ? spec[k].shape[d] : 1;
            if (d < spec[k].ndim) ti->numel *= spec[k].shape[d];
        }
        ti->decay = spec[k].decay;
        ti->per_layer = k >= LOOM_LN1W && k <= LOOM_FCPROJB;
        /* a block's elements: the shape after L (a rank may hold no block) */
        ti->layer_numel =
            ti->per_layer ? spec[k].shape[1] * (ti->ndim == 3 ? spec[k].shape[2] : 1) : ti->numel;
        if (ti->per_layer) layer_numel_total += (size_t)ti->layer_numel;
    }
    size_t offset = (size_t)(info[LOOM_WTE].numel + info[LOOM_WPE].numel);
    info[LOOM_WTE].offset = 0;
    info[LOOM_WPE].offset = (size_t)info[LOOM_WTE].numel;
    for (int k = LOOM_LN1W; k <= LOOM_FCPROJB; k++) {
        info[k].offset = offset;
        info[k].layer_stride = layer_numel_total;
        offset += (size_t)info[k].layer_numel;
    }
    offset = info[LOOM_LN1W].offset + layer_numel_total * (size_t)L;
    for (int k = LOOM_LNFW; k <= LOOM_LMHEAD; k++) {
        info[k].offset = offset;
        info[k].layer_stride = 0;
        offset += (size_t)info[k].numel;
    }
    info[LOOM_WTE].layer_stride = info[LOOM_WPE].layer_stride = 0;
    return offset;
}

size_t loom_gpt_layout_shard(const loom_gpt_config *config, int tp, int first_layer, int end_layer,
                             loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]) {
    return layout(config, tp, end_layer - first_layer, first_layer == 0,
                  end_layer == config->num_layers, info);
}

size_t loom_gpt_layout_chunks(const loom_gpt_config *config, int tp, const loom_gpt_chunk *chunks,
                              int num_chunks, loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]) {
    int64_t layers = 0;
    int has_embedding = 0, has_head = 0;
    for (int i = 0; i < num_chunks; i++) {
        layers += chunks[i].end_layer - chunks[i].first_layer;
        has_embedding |= chunks[i].has_embedding;
        has_head |= chunks[i].has_head;
    }
    return layout(config, tp, layers, has_embedding, has_head, info);
}

size_t loom_gpt_element_offset(const loom_gpt_tensor_info *info, int64_t index) {
    if (!info->per_layer) return info->offset + (size_t)index;
    int64_t layer = index / info->layer_numel, within = index % info->layer_numel;
    return info->offset + (size_t)layer * info->layer_stride + (size_t)within;
}

int64_t loom_gpt_num_real_params(const loom_gpt_config *config) {
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    size_t total = loom_gpt_layout(config, info);
    int64_t padding = (int64_t)(config->padded_vocab_size - config->vocab_size) * config->channels;
    return (int64_t)total - padding * (config->untied_head ? 2 : 1); /* wte's and the head's */
}

double loom_gpt_flops_per_token(const loom_gpt_config *config, int T) {
    double n = (double)loom_gpt_num_real_params(config);
    /* an untied head's GEMM is counted; the input embedding is a lookup */
    if (config->untied_head) n -= (double)config->vocab_size * config->channels;
    return 6.0 * n + 6.0 * config->num_layers * (double)config->channels * T;
}
