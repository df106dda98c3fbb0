/*
 * cost.c — the model's cost facts: FLOPs, bytes and tensor-parallel traffic of a block, the
 * embedding, the head and a whole pipeline stage, for one TP rank and one micro-batch.
 *
 * Parameter counts come from loom_gpt_layout_shard (the layout owns them); the list of
 * activation buffers lives here (loom_gpt_act_floats) and gpt.c allocates from it. The GEMM list
 * and the allreduces are read off gpt.c (block_forward, embed_forward, xent_parallel_forward,
 * the backward passes); tests/test_cost.c holds them to a hand-written count and the real
 * allocation, and tests/test_cost_tp.c to the traffic a real tp=2 run counts, so a change there
 * that is not made here fails a test.
 *
 * Not here: time (the planner turns FLOPs and bytes into seconds with a cluster's numbers),
 * data or pipeline parallelism's own traffic, or the schedule's choice of in-flight counts.
 */
#include "model/model_internal.h"

#include <string.h>

#define FP32  ((int64_t)sizeof(float))
#define INT32 ((int64_t)sizeof(int32_t))

/* Checked copies of what every cost function needs. */
typedef struct {
    loom_gpt_config config;
    int64_t tp, B, T, N, C, Cl, NHl, Vpl; /* N = B*T; local widths under TP */
    int64_t rows; /* of the residual stream on this rank: N, or N/tp under sequence parallelism */
    loom_gpt_widths w; /* this rank's block widths */
    int llama;         /* RMSNorm (no mean kept), no biases, an untied head where configured */
} cost_shape;

static void set_widths(cost_shape *s) {
    s->w = loom_gpt_widths_of(&s->config, (int)s->tp);
    s->llama = s->config.arch == LOOM_ARCH_LLAMA;
}

static loom_status cost_shape_make(const loom_gpt_config *config, int tp, int B, int T,
                                   cost_shape *s) {
    memset(s, 0, sizeof *s);
    s->config = *config;
    /* the shape rules only: a model this build cannot train can still be costed */
    loom_status st = loom_gpt_config_check_shape(&s->config, "model cost", "");
    if (st == LOOM_OK) st = loom_gpt_check_tp(&s->config, tp, "model cost", "tp", "");
    if (st != LOOM_OK) return st;
    const loom_gpt_config *c = &s->config;
    if (B < 1) return loom_fail(LOOM_ERR_INPUT, "model cost: B: expected >= 1, got %d", B);
    if (T < 1 || T > c->max_seq_len) {
        return loom_fail(LOOM_ERR_INPUT, "model cost: T: expected 1..%d (the context), got %d",
                         c->max_seq_len, T);
    }
    s->tp = tp;
    s->B = B;
    s->T = T;
    s->N = (int64_t)B * T;
    s->C = c->channels;
    s->Cl = s->C / tp;
    s->NHl = c->num_heads / tp;
    s->Vpl = c->padded_vocab_size / tp;
    s->rows = s->N;
    set_widths(s);
    return LOOM_OK;
}

/* Activation floats of one block, per buffer, in acts_layout's order (ln1 ... residual3). */
#define BLOCK_ACTS 15
#define BLOCK_ATT  5 /* att's place among them */
/* Under sequence parallelism the residual stream's buffers (`R` rows: LayerNorms, residuals,
 * the row-parallel outputs) hold this rank's rows only; the GEMMs' (qkv, atty, fch) every row. */
static void block_act_floats(const cost_shape *s, int64_t f[BLOCK_ACTS]) {
    int64_t N = s->N, R = s->rows, C = s->C;
    int64_t mean = s->llama ? 0 : R; /* RMSNorm keeps only rstd */
    int64_t v[BLOCK_ACTS] = {
        R * C,                       /* ln1 */
        mean,                        /* ln1_mean */
        R,                           /* ln1_rstd */
        N * s->w.qkv,                /* qkv (Llama: after the rotary positions) */
        N * s->w.q,                  /* atty */
        s->B * s->NHl * s->T * s->T, /* att: softmax probabilities, full T x T */
        R * C,                       /* attproj */
        R * C,                       /* residual2 */
        R * C,                       /* ln2 */
        mean,                        /* ln2_mean */
        R,                           /* ln2_rstd */
        N * s->w.fc,                 /* fch (Llama: [gate | up]) */
        N * s->w.ffn,                /* fch_gelu (Llama: SwiGLU's output) */
        R * C,                       /* fcproj */
        R * C,                       /* residual3 */
    };
    memcpy(f, v, sizeof v);
}

/* The head's buffers, in acts_layout's order (lnf ... row_stats). */
#define HEAD_ACTS 7
static void head_act_floats(const cost_shape *s, int64_t f[HEAD_ACTS]) {
    int64_t N = s->N, R = s->rows;
    int64_t v[HEAD_ACTS] = {
        N * s->C,         /* lnf: every row (gathered under SP, for the LM head) */
        s->llama ? 0 : R, /* lnf_mean */
        R,                /* lnf_rstd */
        N * s->Vpl,       /* probs: logits of this rank's vocabulary rows */
        N,                /* losses */
        N,                /* row_max */
        2 * N,            /* row_stats */
    };
    memcpy(f, v, sizeof v);
}

/* What a split backward's B keeps for W, per block (dfcproj ... dqkv): the output gradients of
 * the four GEMMs. */
#define BLOCK_W_ACTS 4
static void block_w_act_floats(const cost_shape *s, int64_t f[BLOCK_W_ACTS]) {
    int64_t N = s->N, C = s->C;
    int64_t v[BLOCK_W_ACTS] = {
        N * C,        /* dfcproj */
        N * s->w.fc,  /* dfch */
        N * C,        /* dattproj */
        N * s->w.qkv, /* dqkv */
    };
    memcpy(f, v, sizeof v);
}

static int64_t sum(const int64_t *v, int n) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += v[i];
    return total;
}

void loom_gpt_act_floats(const loom_gpt_config *c, const loom_gpt_slot_shape *slot,
                         int64_t out[LOOM_GPT_NUM_ACTS]) {
    cost_shape s = {.config = *c, .tp = slot->tp, .B = slot->B, .T = slot->T};
    s.N = s.B * s.T, s.C = c->channels, s.Cl = s.C / s.tp, s.NHl = c->num_heads / s.tp;
    s.Vpl = c->padded_vocab_size / s.tp;
    s.rows = slot->sequence_parallel ? s.N / s.tp : s.N;
    set_widths(&s);
    int64_t block[BLOCK_ACTS], head[HEAD_ACTS], block_w[BLOCK_W_ACTS];
    block_act_floats(&s, block);
    head_act_floats(&s, head);
    block_w_act_floats(&s, block_w);
    int64_t *o = out;
    *o++ = s.rows * s.C; /* encoded: the stage's input (or the embedding's output) */
    for (int i = 0; i < BLOCK_ACTS; i++) {
        /* selective recomputation keeps no layer's softmax: one layer's is backward's scratch */
        int64_t layers = i == BLOCK_ATT && slot->selective && slot->layers > 0 ? 1 : slot->layers;
        *o++ = layers * block[i];
    }
    for (int i = 0; i < HEAD_ACTS; i++) *o++ = slot->has_head ? head[i] : 0;
    for (int i = 0; i < BLOCK_W_ACTS; i++) *o++ = slot->split ? slot->layers * block_w[i] : 0;
    *o++ = slot->split && slot->has_embedding ? s.rows * s.C : 0; /* dencoded */
}

/* Floats of one activation slot, as allocated. */
static int64_t slot_floats(const cost_shape *s, int64_t layers, int has_embedding, int has_head,
                           int split, int selective) {
    loom_gpt_slot_shape slot = {s->tp, layers, has_embedding, has_head,       split,
                                s->B,  s->T,   selective,     s->rows != s->N};
    int64_t f[LOOM_GPT_NUM_ACTS], total = 0;
    loom_gpt_act_floats(&s->config, &slot, f);
    for (int i = 0; i < LOOM_GPT_NUM_ACTS; i++) total += loom_gpt_act_round(f[i]);
    return total;
}

static void set_tp(const cost_shape *s, loom_gpt_part_cost *cost, int64_t fwd_calls,
                   int64_t fwd_floats, int64_t bwd_calls, int64_t bwd_floats) {
    if (s->tp == 1) return; /* tp_allreduce returns at once */
    cost->tp_allreduces_fwd = fwd_calls;
    cost->tp_bytes_fwd = fwd_floats * FP32;
    cost->tp_allreduces_bwd = bwd_calls;
    cost->tp_bytes_bwd = bwd_floats * FP32;
}

static void block_cost(const cost_shape *s, loom_gpt_part_cost *cost) {
    int64_t N = s->N, C = s->C;
    const loom_gpt_widths *w = &s->w;
    memset(cost, 0, sizeof *cost);
    /* per head (T, hs) x (hs, T) and (T, T) x (T, hs), NH/tp heads of hs = C/NH: B*T*T*C/tp
     * (grouped-query attention reads fewer k/v heads, but every query head still multiplies) */
    int64_t attention = 2 * s->B * s->T * s->T * w->q * 2; /* QK^T and AV */
    int64_t weights = 2 * N * C * w->qkv    /* qkv: (N, C) x (C, (NH + 2 KV) hs / tp) */
                      + 2 * N * w->q * C    /* attproj: (N, C/tp) x (C/tp, C), row-parallel */
                      + 2 * N * C * w->fc   /* fc: (N, C) x (C, 4C/tp; Llama 2F/tp) */
                      + 2 * N * w->ffn * C; /* fcproj: (N, F/tp) x (F/tp, C), row-parallel */
    cost->flops_fwd = weights + attention;
    cost->flops_bwd_input = weights + 2 * attention; /* dQ and dK; dA and dV */
    cost->flops_bwd_weight = weights;
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout_tp(&s->config, (int)s->tp, info);
    cost->param_bytes = (int64_t)info[LOOM_LN1W].layer_stride * FP32;
    int64_t acts[BLOCK_ACTS];
    block_act_floats(s, acts);
    cost->act_bytes = sum(acts, BLOCK_ACTS) * FP32;
    int64_t kept[BLOCK_W_ACTS];
    block_w_act_floats(s, kept);
    cost->act_bytes_split = sum(kept, BLOCK_W_ACTS) * FP32;
    /* forward: after attention-out and after MLP-down (row-parallel); backward: the input
     * gradients of MLP-up and of QKV (column-parallel) */
    set_tp(s, cost, 2, 2 * N * C, 2, 2 * N * C);
}

static void embedding_cost(const cost_shape *s, loom_gpt_part_cost *cost) {
    memset(cost, 0, sizeof *cost);
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout_tp(&s->config, (int)s->tp, info);
    cost->param_bytes = (info[LOOM_WTE].numel + info[LOOM_WPE].numel) * FP32;
    cost->act_bytes = s->N * s->C * FP32;       /* encoded */
    cost->act_bytes_split = s->N * s->C * FP32; /* dencoded */
    /* forward sums every rank's rows of the lookup; backward scatters into wte's own rows */
    set_tp(s, cost, 1, s->N * s->C, 0, 0);
}

static void head_cost(const cost_shape *s, loom_gpt_part_cost *cost) {
    memset(cost, 0, sizeof *cost);
    int64_t lm_head = 2 * s->N * s->C * s->Vpl; /* (N, C) x (C, Vp/tp) */
    cost->flops_fwd = lm_head;
    cost->flops_bwd_input = lm_head;
    cost->flops_bwd_weight = lm_head;
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout_tp(&s->config, (int)s->tp, info);
    int64_t head_weight = s->config.untied_head ? info[LOOM_LMHEAD].numel : info[LOOM_WTE].numel;
    cost->param_bytes = (head_weight + info[LOOM_LNFW].numel + info[LOOM_LNFB].numel) * FP32;
    int64_t acts[HEAD_ACTS];
    head_act_floats(s, acts);
    cost->act_bytes = sum(acts, HEAD_ACTS) * FP32;
    /* forward: row max (N), then [sum exp, target logit] (2, N); backward: d(lnf) (N, C) */
    set_tp(s, cost, 2, 3 * s->N, 1, s->N * s->C);
}

/* Upper bounds of the totals, in double: refuse before int64 arithmetic could overflow. */
static loom_status check_range(const cost_shape *s, int64_t layers, int in_flight) {
    double N = (double)s->N, C = (double)s->C, T = (double)s->T, L = (double)layers;
    double Vp = (double)s->config.padded_vocab_size, NH = (double)s->config.num_heads;
    double maxT = (double)s->config.max_seq_len;
    /* the widest GEMM output over C, at tp 1 (GPT-2: 4) */
    loom_gpt_widths w1 = loom_gpt_widths_of(&s->config, 1);
    double wide = (double)(w1.fc > w1.qkv ? w1.fc : w1.qkv) / C + 1.0;
    double fwd = L * (6.0 * wide * N * C * C + 4.0 * N * T * C) + 2.0 * N * C * Vp;
    double slot = 4.0 * (L * (N * ((7.0 + 5.0 * wide) * C + 4.0) + N * T * NH) +
                         N * (3.0 * C + Vp + 6.0) + 16.0 * LOOM_GPT_NUM_ACTS) +
                  8.0 * N; /* split backward's buffers included */
    double params = L * (3.0 * wide * C * C + 13.0 * C) + C * (2.0 * Vp + maxT + 2.0);
    double bytes =
        (double)in_flight * (slot + 4.0 * N * C) + 16.0 * params + 4.0 * (3.0 + 3.0 * wide) * N * C;
    if (4.0 * fwd > 0x1p62 || bytes > 0x1p62) {
        return loom_fail(LOOM_ERR_INPUT,
                         "model cost: stage of %lld layers, B*T %lld, %d in flight: totals too "
                         "large to count in 64 bits",
                         (long long)layers, (long long)s->N, in_flight);
    }
    return LOOM_OK;
}

/* One part's cost after the shared checks. */
static loom_status part_cost(const loom_gpt_config *config, int tp, int B, int T,
                             void (*part)(const cost_shape *, loom_gpt_part_cost *),
                             loom_gpt_part_cost *cost) {
    cost_shape s;
    loom_status st = cost_shape_make(config, tp, B, T, &s);
    if (st == LOOM_OK) st = check_range(&s, 1, 1);
    if (st == LOOM_OK) part(&s, cost);
    return st;
}

loom_status loom_gpt_cost_block(const loom_gpt_config *config, int tp, int B, int T,
                                loom_gpt_part_cost *cost) {
    return part_cost(config, tp, B, T, block_cost, cost);
}

loom_status loom_gpt_cost_embedding(const loom_gpt_config *config, int tp, int B, int T,
                                    loom_gpt_part_cost *cost) {
    return part_cost(config, tp, B, T, embedding_cost, cost);
}

loom_status loom_gpt_cost_head(const loom_gpt_config *config, int tp, int B, int T,
                               loom_gpt_part_cost *cost) {
    return part_cost(config, tp, B, T, head_cost, cost);
}

static loom_status check_stage_spec(const loom_gpt_config *c, const loom_gpt_stage_spec *spec) {
    int L = c->num_layers;
    if (spec->first_layer < 0 || spec->end_layer > L || spec->first_layer >= spec->end_layer) {
        return loom_fail(LOOM_ERR_INPUT,
                         "model cost: stage layers: expected [first, end) with 0 <= first < end "
                         "<= %d, got [%d, %d)",
                         L, spec->first_layer, spec->end_layer);
    }
    if (!spec->has_embedding != !(spec->first_layer == 0)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "model cost: stage has_embedding: expected %s for layers [%d, %d) (the "
                         "embedding goes with layer 0), got %s",
                         spec->first_layer == 0 ? "true" : "false", spec->first_layer,
                         spec->end_layer, spec->has_embedding ? "true" : "false");
    }
    if (!spec->has_head != !(spec->end_layer == L)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "model cost: stage has_head: expected %s for layers [%d, %d) (the head "
                         "goes with layer %d), got %s",
                         spec->end_layer == L ? "true" : "false", spec->first_layer,
                         spec->end_layer, L - 1, spec->has_head ? "true" : "false");
    }
    if (spec->in_flight < 1) {
        return loom_fail(LOOM_ERR_INPUT, "model cost: stage in_flight: expected >= 1, got %d",
                         spec->in_flight);
    }
    if (spec->sequence_parallel && spec->tp < 2) {
        return loom_fail(LOOM_ERR_INPUT,
                         "model cost: stage sequence_parallel: expected tp > 1 (it shards over "
                         "the tensor-parallel ranks), got tp %d",
                         spec->tp);
    }
    if (spec->sequence_parallel)
        return loom_gpt_check_sequence_rows(spec->B, spec->T, spec->tp, "model cost");
    return LOOM_OK;
}

/* Sequence parallelism's TP traffic, read off gpt.c (block_forward_sp, block_backward_sp,
 * embed_forward, embed_backward, the head's passes). Every all-gather and reduce-scatter is of
 * an (N, C) buffer. A block's forward gathers ln1 and ln2 and reduce-scatters attention-out's
 * and MLP-down's sums (4, where TP alone allreduces 2); its backward gathers the output
 * gradients of MLP-down and attention-out, reduce-scatters the input gradients of MLP-up and QKV
 * and gathers ln2 and ln1 again for their weight gradients (6, where TP allreduces 2; with
 * forward's, 10 half-allreduces against 4 allreduces: 5/4 of TP's bytes on the wire), and
 * allreduces its four LayerNorm gradients (4C) once. The embedding
 * reduce-scatters its lookup in forward and gathers its output gradient in backward. The head
 * gathers lnf in forward (its loss allreduces stay as they are, on every row) and
 * reduce-scatters d(lnf) in backward, then allreduces lnf's two gradients (2C). The re-gathers
 * and the embedding's gather run in W when B and W run apart. */
static void sp_traffic(const cost_shape *s, int64_t layers, int has_embedding, int has_head,
                       loom_gpt_stage_cost *cost) {
    int64_t btc = s->N * s->C * FP32, C = s->C;
    int64_t emb = has_embedding, head = has_head;
    cost->tp_shards_fwd = 4 * layers + emb + head;
    cost->tp_shards_bwd = 6 * layers + emb + head;
    cost->tp_shard_bytes_fwd = cost->tp_shards_fwd * btc;
    cost->tp_shard_bytes_bwd = cost->tp_shards_bwd * btc;
    cost->tp_allreduces_fwd = 2 * head; /* row max (N); sum exp and target logit (2, N) */
    cost->tp_bytes_fwd = 3 * s->N * FP32 * head;
    cost->tp_allreduces_bwd = layers + head;
    cost->tp_bytes_bwd = (4 * C * layers + 2 * C * head) * FP32;
}

static void add_tp(loom_gpt_stage_cost *cost, const loom_gpt_part_cost *part, int64_t times) {
    cost->tp_allreduces_fwd += times * part->tp_allreduces_fwd;
    cost->tp_bytes_fwd += times * part->tp_bytes_fwd;
    cost->tp_allreduces_bwd += times * part->tp_allreduces_bwd;
    cost->tp_bytes_bwd += times * part->tp_bytes_bwd;
}

loom_status loom_gpt_cost_stage(const loom_gpt_config *config, const loom_gpt_stage_spec *spec,
                                loom_gpt_stage_cost *cost) {
    memset(cost, 0, sizeof *cost);
    cost_shape s;
    loom_status st = cost_shape_make(config, spec->tp, spec->B, spec->T, &s);
    if (st != LOOM_OK) return st;
    if ((st = check_stage_spec(&s.config, spec)) != LOOM_OK) return st;
    int64_t layers = spec->end_layer - spec->first_layer;
    if ((st = check_range(&s, layers, spec->in_flight)) != LOOM_OK) return st;
    if (spec->sequence_parallel) s.rows = s.N / s.tp;

    loom_gpt_part_cost block, embedding, head;
    block_cost(&s, &block);
    embedding_cost(&s, &embedding);
    head_cost(&s, &head);

    /* the embedding has no GEMM, so only blocks and head compute */
    cost->flops_fwd = layers * block.flops_fwd + (spec->has_head ? head.flops_fwd : 0);
    cost->flops_bwd_input =
        layers * block.flops_bwd_input + (spec->has_head ? head.flops_bwd_input : 0);
    cost->flops_bwd_weight =
        layers * block.flops_bwd_weight + (spec->has_head ? head.flops_bwd_weight : 0);
    cost->flops_bwd = cost->flops_bwd_input + cost->flops_bwd_weight;
    /* full recomputation keeps the one slot it reruns whole; selective is a mode of keeping */
    int selective = spec->selective && !spec->recompute;
    /* the trainer reruns loom_gpt_forward_stage whole, head and loss included */
    cost->flops_recompute = spec->recompute ? cost->flops_fwd : 0;
    /* selective: every block's attention core (QK^T and AV) once more, before its backward;
     * a block's forward is its weight GEMMs (= its weight gradients) plus that core */
    int64_t attention = block.flops_fwd - block.flops_bwd_weight;
    cost->flops_selective = selective ? layers * attention : 0;
    cost->flops_attention = layers * attention;
    int64_t softmax[BLOCK_ACTS];
    block_act_floats(&s, softmax);
    cost->softmax_bytes = layers * softmax[BLOCK_ATT] * FP32;

    /* the stage's own layout: wte, wpe and lnf only where it uses them */
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    cost->param_bytes = (int64_t)loom_gpt_layout_shard(&s.config, (int)s.tp, spec->first_layer,
                                                       spec->end_layer, info) *
                        FP32;
    cost->grad_bytes = cost->param_bytes;
    cost->optimizer_bytes = 2 * cost->param_bytes;

    cost->act_slot_token_bytes = 2 * s.N * INT32;
    int64_t slot = slot_floats(&s, layers, spec->has_embedding, spec->has_head, 0, selective);
    cost->act_slot_bytes = slot * FP32 + cost->act_slot_token_bytes;
    cost->act_slot_split_bytes =
        (slot_floats(&s, layers, spec->has_embedding, spec->has_head, 1, selective) - slot) * FP32;
    cost->act_bytes_keep = spec->in_flight * cost->act_slot_bytes;
    cost->act_bytes_recompute = cost->act_slot_bytes + spec->in_flight * s.rows * s.C * FP32;
    cost->act_bytes = spec->recompute ? cost->act_bytes_recompute : cost->act_bytes_keep;
    /* dresidual, dbtc, dbtc2 (B,T,C); dqkv (B,T,3C); dfch, dfch2 (B,T,4C); under SP dnorm (4C)
     * (Llama: dqkv and dfch the QKV and MLP-up GEMMs' full widths, dfch2 the wider of F and C) */
    int64_t scratch[LOOM_GPT_GRAD_SCRATCH];
    loom_gpt_grad_scratch_floats(&s.config, s.N, spec->sequence_parallel, scratch);
    cost->grad_scratch_bytes = sum(scratch, LOOM_GPT_GRAD_SCRATCH) * FP32;
    cost->total_bytes = cost->param_bytes + cost->grad_bytes + cost->optimizer_bytes +
                        cost->act_bytes + cost->grad_scratch_bytes;

    if (spec->sequence_parallel) {
        sp_traffic(&s, layers, spec->has_embedding, spec->has_head, cost);
    } else {
        add_tp(cost, &block, layers);
        if (spec->has_embedding) add_tp(cost, &embedding, 1);
        if (spec->has_head) add_tp(cost, &head, 1);
    }
    if (spec->recompute) {
        cost->tp_allreduces_recompute = cost->tp_allreduces_fwd;
        cost->tp_bytes_recompute = cost->tp_bytes_fwd;
        cost->tp_shards_recompute = cost->tp_shards_fwd;
        cost->tp_shard_bytes_recompute = cost->tp_shard_bytes_fwd;
    }

    /* each TP rank sends its own rows under SP */
    cost->pp_act_bytes = spec->has_head ? 0 : s.rows * s.C * FP32;
    cost->pp_grad_bytes = spec->has_embedding ? 0 : s.rows * s.C * FP32;
    return LOOM_OK;
}
