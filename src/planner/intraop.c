/*
 * intraop.c — Alpa's intra-operator pass (loom/intraop.h): the operator graph of a GPT-2 block
 * and of the embedding and head, every sharding strategy of each operator on a (dp, tp) mesh
 * priced with the cluster's figures, resharding costs on the edges, and the ILP that picks one
 * strategy per operator, solved with GLPK. The cost rules are stated in the header.
 *
 * Not here: the stage slicing (inter-op), the cost model of a whole plan (costmodel.c), or
 * executing anything the full space offers beyond what the runtime does.
 */
#include "loom/planner.h"

#include <glpk.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

loom_status loom_intraop_space_parse(const char *name, const char *source, const char *field,
                                     loom_intraop_space *space) {
    if (!strcmp(name, "runtime")) {
        *space = LOOM_INTRAOP_RUNTIME;
    } else if (!strcmp(name, "full")) {
        *space = LOOM_INTRAOP_FULL;
    } else {
        return loom_fail(LOOM_ERR_INPUT, "%s: %s: expected \"runtime\" or \"full\", got \"%s\"",
                         source, field, name);
    }
    return LOOM_OK;
}

/* ---- operators ------------------------------------------------------------------------- */

typedef enum {
    OP_INPUT,     /* the block's input: a layout, nothing computed */
    OP_LAYERNORM, /* ln over the width, weight and bias (width); Llama's RMSNorm: weight only */
    OP_ADD,       /* residual add of two operands */
    OP_GELU,      /* GPT-2's activation, [m, n] -> [m, n] */
    OP_SWIGLU,    /* Llama's: [m, 2n] rows [gate | up] -> [m, n] */
    OP_MATMUL,    /* Y[m,n] = X[m,k] W[k,n] + b[n] (Llama: no b) */
    OP_ATTENTION, /* causal self-attention from qkv [m, (NH + 2 KV) hs] to [m, C] */
    OP_EMBEDDING, /* wte[Vp, C] gathered by token + wpe[T, C] (Llama: no wpe) */
    OP_XENT,      /* softmax cross-entropy over the logits [m, Vp] */
} op_kind;

typedef struct {
    const char *name;
    op_kind kind;
    int count;
    int64_t k, n;     /* matmul; n is the width of a light operator's tensor */
    int weight;       /* the matmul holds its weight (the tied LM head does not) */
    int row_parallel; /* the runtime splits k over tp (else n) */
    int held;         /* the runtime keeps its unit whole under ZeRO-2/3 (embeddings, ln_f) */
} op_spec;

typedef struct {
    const loom_cluster *cluster;
    const loom_gpt_config *model;
    loom_precision precision;
    int n[2], link[2];
    int64_t seqs, T, tokens; /* the mesh's batch: dp x micro_batch sequences */
    double value_bytes;      /* activations: 4 in fp32, else 2 */
    double micro_batches;
    unsigned allowed; /* the runtime configurations the mesh allows (allowed_configs) */
} costing;

static const char *axis_name[2] = {"dp", "tp"};

static double collective_s(const costing *k, loom_collective_op op, int axis, double bytes) {
    return loom_cluster_collective_s(k->cluster, op, k->link[axis], k->n[axis], bytes);
}

/* Memory-bound work: `elements` activations streamed `passes` times. */
static double stream_s(const costing *k, double elements, double passes) {
    return elements * k->value_bytes * passes / k->cluster->memory_bandwidth;
}

/* The product of the axis sizes that split `what` (a loom_intraop_split). */
static int64_t split_factor(const costing *k, const loom_intraop_strategy *s, int what) {
    int64_t f = 1;
    for (int a = 0; a < 2; a++) {
        if ((int)s->split[a] == what) f *= k->n[a];
    }
    return f;
}

static int64_t layout_factor(const costing *k, loom_intraop_layout l, int what) {
    int64_t f = 1;
    for (int a = 0; a < 2; a++) {
        if (l.axis[a] == what) f *= k->n[a];
    }
    return f;
}

/* The output's layout: tokens as rows, n as columns; a k split's axis replicated after an
 * allreduce, split after a reduce-scatter. */
static loom_intraop_layout layout_of(const loom_intraop_strategy *s) {
    loom_intraop_layout l = {{LOOM_INTRAOP_REPL, LOOM_INTRAOP_REPL}};
    for (int a = 0; a < 2; a++) {
        if (s->split[a] == LOOM_INTRAOP_TOKENS) l.axis[a] = LOOM_INTRAOP_ROWS;
        if (s->split[a] == LOOM_INTRAOP_N) l.axis[a] = LOOM_INTRAOP_COLS;
        if (s->split[a] == LOOM_INTRAOP_K) {
            if (s->reduce[a] == LOOM_INTRAOP_SCATTER_TOKENS) l.axis[a] = LOOM_INTRAOP_ROWS;
            if (s->reduce[a] == LOOM_INTRAOP_SCATTER_N) l.axis[a] = LOOM_INTRAOP_COLS;
        }
    }
    return l;
}

/* The matmul's input X[m,k]: tokens as rows, k as columns, n replicated. */
static loom_intraop_layout matmul_input_layout(const loom_intraop_strategy *s) {
    loom_intraop_layout l = {{LOOM_INTRAOP_REPL, LOOM_INTRAOP_REPL}};
    for (int a = 0; a < 2; a++) {
        if (s->split[a] == LOOM_INTRAOP_TOKENS) l.axis[a] = LOOM_INTRAOP_ROWS;
        if (s->split[a] == LOOM_INTRAOP_K) l.axis[a] = LOOM_INTRAOP_COLS;
    }
    return l;
}

/* ZeRO stage `zero`'s traffic over dp for a weight of `bytes` (fp32) per step: the gradient's
 * reduce-scatter (every micro-batch's from stage 2 on: no full-size buffer), the weight's
 * all-gather after the update (stages 1 and 2), or before every micro-batch's forward and
 * backward (stage 3). */
static double zero_traffic_s(const costing *k, int zero, double bytes) {
    double rs = collective_s(k, LOOM_COLLECTIVE_REDUCE_SCATTER, 0, bytes);
    double ag = collective_s(k, LOOM_COLLECTIVE_ALLGATHER, 0, bytes), m = k->micro_batches;
    switch (zero) {
    case 0:
        return collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, 0, bytes);
    case 1:
        return rs + ag;
    case 2:
        return m * rs + ag;
    default:
        return m * (rs + 2.0 * ag);
    }
}

/* The weight's traffic per step for `params` fp32 values of the device's shard: its gradient
 * allreduced over every axis that splits tokens, or over dp as its ZeRO stage says. */
static double weight_sync_s(const costing *k, const loom_intraop_strategy *s, double params) {
    double t = 0;
    for (int a = 0; a < 2; a++) {
        if (s->split[a] != LOOM_INTRAOP_TOKENS || params <= 0) continue;
        t += a == 0 ? zero_traffic_s(k, s->zero, params * 4.0)
                    : collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, params * 4.0);
    }
    return t;
}

/* Bytes per device of `params` fp32 values with their gradients and AdamW's two moments, the
 * ZeRO stage's share of them over dp. */
static int64_t state_of(const costing *k, int zero, double params) {
    double n = k->n[0];
    double per = zero == 0   ? 16.0
                 : zero == 1 ? 8.0 + 8.0 / n
                 : zero == 2 ? 4.0 + 12.0 / n
                             : 16.0 / n;
    return (int64_t)(params * per);
}

/* The gradient of a weight replicated over axis a but applied to rows the axis splits after a
 * reduce-scatter (a row-parallel bias, wpe under sequence parallelism): summed over the axis. */
static double scattered_sum_s(const costing *k, const loom_intraop_strategy *s, double params) {
    double t = 0;
    for (int a = 0; a < 2; a++) {
        if (s->split[a] == LOOM_INTRAOP_K && s->reduce[a] == LOOM_INTRAOP_SCATTER_TOKENS)
            t += collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, params * 4.0);
    }
    return t;
}

/* A matmul's costs; 0 when a split does not divide its dimension. */
static int price_matmul(const costing *k, const op_spec *op, loom_intraop_strategy *s) {
    int64_t fm = split_factor(k, s, LOOM_INTRAOP_TOKENS), fk = split_factor(k, s, LOOM_INTRAOP_K),
            fn = split_factor(k, s, LOOM_INTRAOP_N);
    if (op->k % fk || op->n % fn) return 0;
    double m = (double)(k->tokens / fm), kl = (double)(op->k / fk), nl = (double)(op->n / fn);
    /* forward, input gradient, weight gradient: three GEMMs of the shard's size */
    s->compute_s =
        3.0 * loom_cluster_gemm_s(k->cluster, k->precision, m, nl, kl) * k->micro_batches;
    double comm = 0;
    for (int a = 0; a < 2; a++) {
        if (s->split[a] == LOOM_INTRAOP_K) { /* partial sums of Y */
            double y = m * nl * k->value_bytes;
            if (s->reduce[a] == LOOM_INTRAOP_ALLREDUCE) {
                comm += collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, y);
            } else { /* reduce-scatter forward, all-gather of dY in backward */
                comm += collective_s(k, LOOM_COLLECTIVE_REDUCE_SCATTER, a, y) +
                        collective_s(k, LOOM_COLLECTIVE_ALLGATHER, a, y);
            }
        }
        if (s->split[a] == LOOM_INTRAOP_N) /* dX = dY W^T sums over the split n */
            comm += collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, m * kl * k->value_bytes);
    }
    s->comm_s = comm * k->micro_batches;
    /* the bias splits with n only (Llama has none) */
    double bias = k->model->arch == LOOM_ARCH_LLAMA ? 0 : nl;
    double params = op->weight ? kl * nl + bias : 0;
    s->sync_s = weight_sync_s(k, s, params) + (op->weight ? scattered_sum_s(k, s, bias) : 0);
    s->state_bytes = state_of(k, s->zero, params);
    s->in = matmul_input_layout(s);
    s->out = layout_of(s);
    return 1;
}

static int price_attention(const costing *k, loom_intraop_strategy *s) {
    int64_t fs = split_factor(k, s, LOOM_INTRAOP_TOKENS), fh = split_factor(k, s, LOOM_INTRAOP_N);
    int64_t NH = k->model->num_heads, hs = k->model->channels / NH;
    int64_t KV = k->model->kv_heads > 0 ? k->model->kv_heads : NH;
    if (NH % fh || KV % fh) return 0; /* a split of the heads takes whole kv groups */
    double pairs = (double)(k->seqs / fs) * (double)(NH / fh); /* (sequence, head) pairs here */
    double T = (double)k->T;
    double qk = loom_cluster_gemm_s(k->cluster, k->precision, T, T, (double)hs);
    double av = loom_cluster_gemm_s(k->cluster, k->precision, T, (double)hs, T);
    /* backward is twice the forward (dQ and dK, dA and dV); the softmax streams T x T */
    s->compute_s = (3.0 * pairs * (qk + av) + stream_s(k, pairs * T * T, 6.0)) * k->micro_batches;
    s->in = s->out = layout_of(s);
    return 1;
}

static int price_embedding(const costing *k, loom_intraop_strategy *s) {
    int64_t fm = split_factor(k, s, LOOM_INTRAOP_TOKENS), fv = split_factor(k, s, LOOM_INTRAOP_K),
            fc = split_factor(k, s, LOOM_INTRAOP_N);
    int64_t C = k->model->channels, Vp = k->model->padded_vocab_size;
    if (Vp % fv || C % fc) return 0;
    double m = (double)(k->tokens / fm), cl = (double)(C / fc);
    s->compute_s = stream_s(k, m * cl, 3.0) * k->micro_batches; /* gather, add wpe, scatter */
    double comm = 0;
    for (int a = 0; a < 2; a++) { /* a vocabulary split sums every rank's rows of the lookup */
        if (s->split[a] != LOOM_INTRAOP_K) continue;
        double y = m * cl * k->value_bytes;
        if (s->reduce[a] == LOOM_INTRAOP_ALLREDUCE) {
            comm += collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, y);
        } else { /* onto the tokens: reduce-scatter, and the gradient's all-gather */
            comm += collective_s(k, LOOM_COLLECTIVE_REDUCE_SCATTER, a, y) +
                    collective_s(k, LOOM_COLLECTIVE_ALLGATHER, a, y);
        }
    }
    s->comm_s = comm * k->micro_batches;
    double wpe = k->model->arch == LOOM_ARCH_LLAMA ? 0 : (double)k->model->max_seq_len * cl;
    /* wte's sync: on the tie (tie_s); wpe's, and its sum where it is added to scattered rows */
    s->sync_s = weight_sync_s(k, s, wpe) + scattered_sum_s(k, s, wpe);
    s->state_bytes = state_of(k, s->zero, (double)(Vp / fv) * cl + wpe);
    s->in = s->out = layout_of(s);
    return 1;
}

/* Light operators: LayerNorm, add, gelu, cross-entropy, the input. */
static int price_light(const costing *k, const op_spec *op, loom_intraop_strategy *s) {
    int64_t fm = split_factor(k, s, LOOM_INTRAOP_TOKENS), fw = split_factor(k, s, LOOM_INTRAOP_N);
    if (op->n % fw) return 0;
    double m = (double)(k->tokens / fm), elements = m * (double)(op->n / fw);
    double comm = 0, passes = 0, params = 0;
    for (int a = 0; a < 2; a++) {
        if (s->split[a] != LOOM_INTRAOP_N) continue;
        if (op->kind == OP_LAYERNORM) /* mean and variance; backward's two sums */
            comm += 2 * collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, 2.0 * m * 4.0);
        if (op->kind == OP_XENT) /* row max, then [sum exp, target logit] */
            comm += collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, m * 4.0) +
                    collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, 2.0 * m * 4.0);
    }
    switch (op->kind) {
    case OP_LAYERNORM: /* weight and bias; RMSNorm's weight alone */
        passes = 6, params = (k->model->arch == LOOM_ARCH_LLAMA ? 1.0 : 2.0) * (double)(op->n / fw);
        break;
    case OP_ADD:
        passes = 3;
        break;
    case OP_GELU:
        passes = 6;
        break;
    case OP_SWIGLU: /* per output: gate and up read, out written; backward reads three, writes
                     * two */
        passes = 8;
        break;
    case OP_XENT:
        passes = 4;
        break;
    default:
        break;
    }
    s->compute_s = stream_s(k, elements, passes) * k->micro_batches;
    s->comm_s = comm * k->micro_batches;
    s->sync_s = weight_sync_s(k, s, params);
    s->state_bytes = state_of(k, s->zero, params);
    s->in = s->out = layout_of(s);
    return 1;
}

/* What loom's runtime does on axis a, with sequence parallelism or without (Megatron: tokens
 * over dp, the tensor-parallel split over tp; a size-1 axis replicates). */
static void runtime_split(const costing *k, const op_spec *op, int a, int sp,
                          loom_intraop_split *split, loom_intraop_reduce *reduce) {
    *reduce = LOOM_INTRAOP_ALLREDUCE;
    *split = LOOM_INTRAOP_REPLICATE;
    if (k->n[a] == 1) return;
    if (a == 0) {
        *split = LOOM_INTRAOP_TOKENS;
        return;
    }
    switch (op->kind) {
    case OP_MATMUL:
        *split = op->row_parallel ? LOOM_INTRAOP_K : LOOM_INTRAOP_N;
        if (op->row_parallel && sp) *reduce = LOOM_INTRAOP_SCATTER_TOKENS;
        break;
    case OP_EMBEDDING: /* under SP the lookup's sum is reduce-scattered onto the rows */
        *split = LOOM_INTRAOP_K;
        if (sp) *reduce = LOOM_INTRAOP_SCATTER_TOKENS;
        break;
    case OP_ATTENTION:
    case OP_GELU:
    case OP_SWIGLU:
    case OP_XENT:
        *split = LOOM_INTRAOP_N;
        break;
    default: /* the residual stream and its LayerNorms: whole over tp, or its rows under SP */
        if (sp) *split = LOOM_INTRAOP_TOKENS;
        break;
    }
}

static int has_weights(const op_spec *op) {
    return op->kind == OP_LAYERNORM || op->kind == OP_EMBEDDING ||
           (op->kind == OP_MATMUL && op->weight);
}

/* The runtime configurations that execute strategy s of `op` (among `allowed`). */
static unsigned runtime_configs(const costing *k, const op_spec *op, const loom_intraop_strategy *s,
                                unsigned allowed) {
    unsigned mask = 0;
    for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) {
        if (!(allowed >> c & 1)) continue;
        int zero = LOOM_INTRAOP_CONFIG_ZERO(c), runs = 1;
        for (int a = 0; a < 2; a++) {
            loom_intraop_split split;
            loom_intraop_reduce reduce;
            runtime_split(k, op, a, LOOM_INTRAOP_CONFIG_SP(c), &split, &reduce);
            runs &= s->split[a] == split && (split != LOOM_INTRAOP_K || s->reduce[a] == reduce);
        }
        /* the ZeRO stage of the blocks' weights; the held units' at most 1 */
        int want = has_weights(op) && s->split[0] == LOOM_INTRAOP_TOKENS && k->n[0] > 1
                       ? (op->held && zero > 1 ? 1 : zero)
                       : 0;
        if (runs && s->zero == want) mask |= 1u << c;
    }
    return mask;
}

/* The configurations the mesh allows: ZeRO 1-3 where dp > 1 shards, sequence parallelism where
 * tp > 1 divides a replica's tokens (the runtime's rule). */
static unsigned allowed_configs(const costing *k) {
    unsigned mask = 0;
    int replica_tokens_divide = (k->tokens / k->n[0]) % k->n[1] == 0;
    for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) {
        if (LOOM_INTRAOP_CONFIG_ZERO(c) > 0 && k->n[0] == 1) continue;
        if (LOOM_INTRAOP_CONFIG_SP(c) && (k->n[1] == 1 || !replica_tokens_divide)) continue;
        mask |= 1u << c;
    }
    return mask;
}

static void append(char *dst, size_t cap, const char *text) {
    size_t used = strlen(dst), sep = used ? 2 : 0, n = strlen(text);
    if (used + sep + n + 1 > cap) return; /* the buffers hold every name; never cut one */
    memcpy(dst + used, ", ", sep);
    memcpy(dst + used + sep, text, n + 1);
}

/* "column (n over tp), tokens over dp", "row (k over tp, allreduce)", "replicated". */
static void name_strategy(const op_spec *op, loom_intraop_strategy *s) {
    const char *kdim = op->kind == OP_EMBEDDING ? "vocab" : "k";
    const char *ndim = op->kind == OP_MATMUL      ? "n"
                       : op->kind == OP_ATTENTION ? "heads"
                       : op->kind == OP_EMBEDDING ? "channels"
                       : op->kind == OP_XENT      ? "vocab"
                                                  : "hidden";
    char weights[80] = "", tokens[64] = "", part[64];
    int ks = 0, ns = 0;
    for (int a = 1; a >= 0; a--) {
        if (s->split[a] == LOOM_INTRAOP_TOKENS) {
            snprintf(part, sizeof part, "tokens over %s", axis_name[a]);
            append(tokens, sizeof tokens, part);
        } else if (s->split[a] == LOOM_INTRAOP_N) {
            snprintf(part, sizeof part, "%s over %s", ndim, axis_name[a]);
            append(weights, sizeof weights, part), ns++;
        } else if (s->split[a] == LOOM_INTRAOP_K) {
            const char *how = s->reduce[a] == LOOM_INTRAOP_ALLREDUCE ? "allreduce"
                              : s->reduce[a] == LOOM_INTRAOP_SCATTER_TOKENS
                                  ? "reduce-scatter to tokens"
                                  : "reduce-scatter to columns";
            snprintf(part, sizeof part, "%s over %s [%s]", kdim, axis_name[a], how);
            append(weights, sizeof weights, part), ks++;
        }
    }
    s->name[0] = '\0';
    if (op->kind == OP_MATMUL && (ks == 0) != (ns == 0)) {
        snprintf(s->name, sizeof s->name, "%s (%s)", ks ? "row" : "column", weights);
    } else if (weights[0]) {
        snprintf(s->name, sizeof s->name, "%s", weights);
    }
    if (tokens[0]) append(s->name, sizeof s->name, tokens);
    if (!s->name[0]) snprintf(s->name, sizeof s->name, "replicated");
    if (s->zero > 0) {
        snprintf(part, sizeof part, "ZeRO-%d", s->zero);
        append(s->name, sizeof s->name, part);
    }
}

/* The choices an axis offers an operator. */
typedef struct {
    loom_intraop_split split;
    loom_intraop_reduce reduce;
} axis_choice;

static int axis_choices(const costing *k, const op_spec *op, int a, axis_choice *out) {
    int n = 0;
    out[n++] = (axis_choice){LOOM_INTRAOP_REPLICATE, LOOM_INTRAOP_ALLREDUCE};
    if (k->n[a] == 1) return n;
    out[n++] = (axis_choice){LOOM_INTRAOP_TOKENS, LOOM_INTRAOP_ALLREDUCE};
    out[n++] = (axis_choice){LOOM_INTRAOP_N, 0};
    if (op->kind == OP_MATMUL || op->kind == OP_EMBEDDING) {
        out[n++] = (axis_choice){LOOM_INTRAOP_K, LOOM_INTRAOP_ALLREDUCE};
        out[n++] = (axis_choice){LOOM_INTRAOP_K, LOOM_INTRAOP_SCATTER_TOKENS};
    }
    if (op->kind == OP_MATMUL) out[n++] = (axis_choice){LOOM_INTRAOP_K, LOOM_INTRAOP_SCATTER_N};
    return n;
}

/* Whether the splits divide the tensors they split: attention's, the matmuls' and the
 * embedding's tokens by whole sequences, a light operator's and the activations' rows by tokens
 * (a sequence's rows over tp: sequence parallelism), and columns. */
static int layouts_divide(const costing *k, const op_spec *op, const loom_intraop_strategy *s) {
    int64_t in_cols = op->kind == OP_MATMUL      ? op->k
                      : op->kind == OP_ATTENTION ? loom_gpt_widths_of(k->model, 1).qkv
                      : op->kind == OP_SWIGLU    ? 2 * op->n
                                                 : op->n;
    int64_t out_cols =
        op->kind == OP_ATTENTION || op->kind == OP_EMBEDDING ? k->model->channels : op->n;
    int whole = op->kind == OP_ATTENTION || op->kind == OP_MATMUL || op->kind == OP_EMBEDDING;
    int64_t rows = op->kind == OP_ATTENTION ? k->seqs : k->tokens;
    return rows % layout_factor(k, s->in, LOOM_INTRAOP_ROWS) == 0 &&
           rows % layout_factor(k, s->out, LOOM_INTRAOP_ROWS) == 0 &&
           (whole ? k->seqs : k->tokens) % split_factor(k, s, LOOM_INTRAOP_TOKENS) == 0 &&
           in_cols % layout_factor(k, s->in, LOOM_INTRAOP_COLS) == 0 &&
           out_cols % layout_factor(k, s->out, LOOM_INTRAOP_COLS) == 0;
}

static int price(const costing *k, const op_spec *op, loom_intraop_strategy *s) {
    switch (op->kind) {
    case OP_MATMUL:
        return price_matmul(k, op, s);
    case OP_ATTENTION:
        return price_attention(k, s);
    case OP_EMBEDDING:
        return price_embedding(k, s);
    default:
        return price_light(k, op, s);
    }
}

static loom_status add_op(loom_intraop_graph *g, const costing *k, const op_spec *op,
                          loom_intraop_space space) {
    loom_intraop_op *o = &g->op[g->ops];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", op->name);
    o->count = op->count;
    o->weights = has_weights(op), o->held = op->held;
    axis_choice c0[8], c1[8];
    int n0 = axis_choices(k, op, 0, c0), n1 = axis_choices(k, op, 1, c1);
    for (int i = 0; i < n0; i++) {
        /* the ZeRO stages: where the weights are replicated over a dp that splits the tokens */
        int zeros = has_weights(op) && c0[i].split == LOOM_INTRAOP_TOKENS && k->n[0] > 1 ? 4 : 1;
        for (int j = 0; j < n1; j++) {
            for (int z = 0; z < zeros; z++) {
                loom_intraop_strategy s;
                memset(&s, 0, sizeof s);
                s.split[0] = c0[i].split, s.reduce[0] = c0[i].reduce;
                s.split[1] = c1[j].split, s.reduce[1] = c1[j].reduce;
                s.zero = z;
                s.runtime = runtime_configs(k, op, &s, k->allowed);
                if (space == LOOM_INTRAOP_RUNTIME && !s.runtime) continue;
                if (!price(k, op, &s) || !layouts_divide(k, op, &s)) continue;
                if (o->strategies == LOOM_INTRAOP_MAX_STRATEGIES) {
                    return loom_fail(LOOM_ERR_RUNTIME, "intra-op: %s: more than %d strategies",
                                     op->name, LOOM_INTRAOP_MAX_STRATEGIES);
                }
                name_strategy(op, &s);
                o->strategy[o->strategies++] = s;
            }
        }
    }
    if (o->strategies == 0) { /* only the runtime's, and it does not divide */
        return loom_fail(LOOM_ERR_INPUT,
                         "intra-op: %s: the runtime's layout does not divide its tensors on the "
                         "mesh (dp %d, tp %d)",
                         op->name, k->n[0], k->n[1]);
    }
    g->ops++;
    return LOOM_OK;
}

/* ---- resharding ------------------------------------------------------------------------- */

/* Forward and backward of passing a (rows x cols) activation from layout `from` to `to`. */
static double reshard_s(const costing *k, int64_t rows, int64_t cols, loom_intraop_layout from,
                        loom_intraop_layout to) {
    double t = 0;
    for (int a = 0; a < 2; a++) {
        if (from.axis[a] == to.axis[a] || k->n[a] == 1) continue;
        int o = 1 - a; /* the other axis divides what this one moves, where both split it */
        int64_t other =
            (from.axis[o] != LOOM_INTRAOP_REPL && to.axis[o] != LOOM_INTRAOP_REPL) ? k->n[o] : 1;
        double bytes = (double)rows * (double)cols * k->value_bytes / (double)other;
        if (from.axis[a] == LOOM_INTRAOP_REPL || to.axis[a] == LOOM_INTRAOP_REPL) {
            /* all-gather one way, a free slice the other */
            t += collective_s(k, LOOM_COLLECTIVE_ALLGATHER, a, bytes);
        } else { /* rows <-> columns: an all-to-all each way */
            t += 2 * collective_s(k, LOOM_COLLECTIVE_ALLGATHER, a, bytes / k->n[a]);
        }
    }
    return t * k->micro_batches;
}

static loom_status add_edge(loom_intraop_graph *g, const costing *k, int from, int to, int count,
                            int64_t cols) {
    loom_intraop_edge *e = &g->edge[g->edges];
    const loom_intraop_op *u = &g->op[from], *v = &g->op[to];
    e->from = from, e->to = to, e->count = count;
    e->rows = k->tokens, e->cols = cols;
    e->reshard_s = loom_calloc((size_t)u->strategies * (size_t)v->strategies, sizeof(double),
                               "intra-op graph");
    if (!e->reshard_s) return LOOM_ERR_NOMEM;
    g->edges++;
    for (int i = 0; i < u->strategies; i++) {
        for (int j = 0; j < v->strategies; j++) {
            e->reshard_s[i * v->strategies + j] =
                reshard_s(k, e->rows, cols, u->strategy[i].out, v->strategy[j].in);
        }
    }
    return LOOM_OK;
}

/* Which wte dimension a strategy splits over axis a: the embedding's vocabulary rows (k) or
 * channels (n); the LM head's W[C, Vp] its channels (k) or vocabulary (n). 0: none. */
enum { WTE_NONE, WTE_VOCAB, WTE_CHANNELS };
static int wte_split(const loom_intraop_strategy *s, int a, int head) {
    if (s->split[a] == LOOM_INTRAOP_K) return head ? WTE_CHANNELS : WTE_VOCAB;
    if (s->split[a] == LOOM_INTRAOP_N) return head ? WTE_VOCAB : WTE_CHANNELS;
    return WTE_NONE;
}

/* The tied wte between the embedding (which holds it) and the LM head, per step: where the two
 * split it differently over an axis, the head gathers it (fp32) and reduce-scatters its
 * gradient back; where either splits the tokens, the summed gradient of the head's shard is
 * allreduced over the axis (the one sync of wte) — over dp, as the embedding's ZeRO stage says
 * (stage 3: wte gathered before every micro-batch's forward and backward, for the head). */
static double tie_s(const costing *k, const loom_intraop_strategy *emb,
                    const loom_intraop_strategy *head) {
    double wte = (double)k->model->padded_vocab_size * (double)k->model->channels * 4.0;
    double t = 0, shard = 1;
    for (int a = 0; a < 2; a++) {
        if (wte_split(head, a, 1) != WTE_NONE) shard *= k->n[a];
    }
    for (int a = 0; a < 2; a++) {
        int ours = wte_split(emb, a, 0), theirs = wte_split(head, a, 1);
        if (ours != theirs && k->n[a] > 1) {
            int o = 1 - a;
            double other =
                wte_split(emb, o, 0) != WTE_NONE && wte_split(head, o, 1) != WTE_NONE ? k->n[o] : 1;
            t += 2 * collective_s(k, LOOM_COLLECTIVE_ALLGATHER, a, wte / other);
        }
        if (emb->split[a] == LOOM_INTRAOP_TOKENS || head->split[a] == LOOM_INTRAOP_TOKENS) {
            t += a == 0 ? zero_traffic_s(k, emb->zero, wte / shard)
                        : collective_s(k, LOOM_COLLECTIVE_ALLREDUCE, a, wte / shard);
        }
    }
    return t;
}

static loom_status add_tie(loom_intraop_graph *g, const costing *k, int embedding, int head) {
    loom_intraop_edge *e = &g->edge[g->edges];
    const loom_intraop_op *u = &g->op[embedding], *v = &g->op[head];
    e->from = embedding, e->to = head, e->count = 1, e->tied = 1;
    e->rows = k->model->padded_vocab_size, e->cols = k->model->channels;
    e->reshard_s = loom_calloc((size_t)u->strategies * (size_t)v->strategies, sizeof(double),
                               "intra-op graph");
    if (!e->reshard_s) return LOOM_ERR_NOMEM;
    g->edges++;
    for (int i = 0; i < u->strategies; i++) {
        for (int j = 0; j < v->strategies; j++)
            e->reshard_s[i * v->strategies + j] = tie_s(k, &u->strategy[i], &v->strategy[j]);
    }
    return LOOM_OK;
}

/* ---- the graph -------------------------------------------------------------------------- */

enum {
    B_INPUT,
    B_LN1,
    B_ATTN_IN,
    B_ATTN,
    B_ATTN_OUT,
    B_ADD1,
    B_LN2,
    B_FC,
    B_GELU,
    B_FCPROJ,
    B_ADD2
};

/* A block's operators: GPT-2's (LayerNorm, QKV of 3C, GELU over 4C) or a Llama's (RMSNorm, QKV
 * of (NH + 2 KV) hs, gate and up of 2F into SwiGLU, down from F); the names are GPT-2's. */
static loom_status build_block(loom_intraop_graph *g, const costing *k, int count,
                               loom_intraop_space space) {
    int64_t C = k->model->channels;
    loom_gpt_widths w = loom_gpt_widths_of(k->model, 1);
    int llama = k->model->arch == LOOM_ARCH_LLAMA;
    op_kind act = llama ? OP_SWIGLU : OP_GELU;
    op_spec ops[] = {
        {"input", OP_INPUT, count, 0, C, 0, 0, 0},
        {"ln_1", OP_LAYERNORM, count, 0, C, 0, 0, 0},
        {"c_attn", OP_MATMUL, count, C, w.qkv, 1, 0, 0},
        {"attention", OP_ATTENTION, count, 0, C, 0, 0, 0},
        {"attn_c_proj", OP_MATMUL, count, C, C, 1, 1, 0},
        {"add_1", OP_ADD, count, 0, C, 0, 0, 0},
        {"ln_2", OP_LAYERNORM, count, 0, C, 0, 0, 0},
        {"c_fc", OP_MATMUL, count, C, w.fc, 1, 0, 0},
        {llama ? "swiglu" : "gelu", act, count, 0, w.ffn, 0, 0, 0},
        {"mlp_c_proj", OP_MATMUL, count, w.ffn, C, 1, 1, 0},
        {"add_2", OP_ADD, count, 0, C, 0, 0, 0},
    };
    int base = g->ops;
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0] && st == LOOM_OK; i++)
        st = add_op(g, k, &ops[i], space);
    const int64_t edges[][3] = {
        /* from, to, width */
        {B_INPUT, B_LN1, C},       {B_LN1, B_ATTN_IN, C},   {B_ATTN_IN, B_ATTN, w.qkv},
        {B_ATTN, B_ATTN_OUT, C},   {B_ATTN_OUT, B_ADD1, C}, {B_INPUT, B_ADD1, C},
        {B_ADD1, B_LN2, C},        {B_LN2, B_FC, C},        {B_FC, B_GELU, w.fc},
        {B_GELU, B_FCPROJ, w.ffn}, {B_FCPROJ, B_ADD2, C},   {B_ADD1, B_ADD2, C}};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0] && st == LOOM_OK; i++)
        st = add_edge(g, k, base + (int)edges[i][0], base + (int)edges[i][1], count, edges[i][2]);
    return st;
}

/* The embedding, and the head from ln_f on; returns the embedding's and ln_f's indices. */
static loom_status build_ends(loom_intraop_graph *g, const costing *k, loom_intraop_space space,
                              int *embedding, int *ln_f) {
    int64_t C = k->model->channels, Vp = k->model->padded_vocab_size;
    int untied = k->model->untied_head != 0;
    op_spec ops[] = {
        {"embedding", OP_EMBEDDING, 1, 0, C, 1, 0, 1},
        {"ln_f", OP_LAYERNORM, 1, 0, C, 0, 0, 1},
        /* tied: wte, counted with the embedding; untied: its own weight, held with ln_f */
        {"lm_head", OP_MATMUL, 1, C, Vp, untied, 0, untied},
        {"cross_entropy", OP_XENT, 1, 0, Vp, 0, 0, 0},
    };
    int base = g->ops;
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0] && st == LOOM_OK; i++)
        st = add_op(g, k, &ops[i], space);
    if (st == LOOM_OK) st = add_edge(g, k, base + 1, base + 2, 1, C);
    if (st == LOOM_OK) st = add_edge(g, k, base + 2, base + 3, 1, Vp);
    if (st == LOOM_OK && !untied) st = add_tie(g, k, base, base + 2);
    *embedding = base, *ln_f = base + 1;
    return st;
}

static loom_status check_request(const loom_gpt_config *model, const loom_cluster *cluster,
                                 const loom_intraop_request *r, int seq_len) {
    if (r->dp < 1 || r->tp < 1) {
        return loom_fail(LOOM_ERR_INPUT, "intra-op: mesh: expected dp and tp >= 1, got (%d, %d)",
                         r->dp, r->tp);
    }
    int64_t devices = (int64_t)cluster->max_nodes * cluster->devices_per_node;
    if ((int64_t)r->dp * r->tp > devices) {
        return loom_fail(LOOM_ERR_INPUT,
                         "intra-op: mesh: dp x tp = %lld devices, the cluster \"%s\" has %lld",
                         (long long)r->dp * r->tp, cluster->name, (long long)devices);
    }
    if (r->micro_batch < 1) {
        return loom_fail(LOOM_ERR_INPUT, "intra-op: micro_batch: expected >= 1, got %d",
                         r->micro_batch);
    }
    if (r->micro_batches < 0) {
        return loom_fail(LOOM_ERR_INPUT, "intra-op: micro_batches: expected >= 1, got %d",
                         r->micro_batches);
    }
    if (seq_len < 1 || seq_len > model->max_seq_len) {
        return loom_fail(LOOM_ERR_INPUT,
                         "intra-op: seq_len: expected 1..%d (the model's context), got %d",
                         model->max_seq_len, seq_len);
    }
    if (!(cluster->peak_flops[r->precision] > 0)) {
        return loom_fail(LOOM_ERR_INPUT, "intra-op: the cluster \"%s\" has no %s peak",
                         cluster->name, loom_precision_name(r->precision));
    }
    if (r->memory_budget < 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "intra-op: memory_budget: expected bytes >= 0 (0: none), got %lld",
                         (long long)r->memory_budget);
    }
    return LOOM_OK;
}

/* Each axis's link class: the slowest any of its groups uses, ranks dp_rank x tp + tp_rank. */
static int axis_link(const loom_cluster *cluster, int dp, int tp, int axis) {
    int worst = LOOM_LINK_INTRA_NODE, members[2];
    for (int d = 0; d < dp; d++) {
        for (int t = 0; t < tp; t++) {
            members[0] = d * tp + t;
            members[1] = axis == 0 ? ((d + 1) % dp) * tp + t : d * tp + (t + 1) % tp;
            if (loom_plan_group_link(cluster, members, 2) == LOOM_LINK_INTER_NODE)
                worst = LOOM_LINK_INTER_NODE;
        }
    }
    return worst;
}

loom_status loom_intraop_graph_create(loom_intraop_graph **graph, const loom_gpt_config *model,
                                      const loom_cluster *cluster,
                                      const loom_intraop_request *request) {
    *graph = NULL;
    loom_gpt_config m = *model;
    loom_status st = loom_gpt_config_check_shape(&m, "intra-op", "");
    int seq_len = request->seq_len ? request->seq_len : m.max_seq_len;
    if (st == LOOM_OK) st = check_request(&m, cluster, request, seq_len);
    /* the runtime's own rule (heads and vocabulary rows per rank) */
    if (st == LOOM_OK && request->space == LOOM_INTRAOP_RUNTIME)
        st = loom_gpt_check_tp(&m, request->tp, "intra-op", "tp", "");
    if (st != LOOM_OK) return st;
    loom_intraop_graph *g = loom_calloc(1, sizeof *g, "intra-op graph");
    if (!g) return LOOM_ERR_NOMEM;
    g->request = *request;
    g->request.seq_len = seq_len;
    if (g->request.micro_batches == 0) g->request.micro_batches = 1;
    g->model = m;
    costing k;
    memset(&k, 0, sizeof k);
    k.cluster = cluster, k.model = &g->model, k.precision = request->precision;
    k.n[0] = request->dp, k.n[1] = request->tp;
    for (int a = 0; a < 2; a++)
        k.link[a] = g->link[a] = axis_link(cluster, request->dp, request->tp, a);
    k.seqs = (int64_t)request->dp * request->micro_batch;
    k.T = seq_len;
    k.tokens = k.seqs * k.T;
    k.value_bytes = request->precision == LOOM_PRECISION_FP32 ? 4.0 : 2.0;
    k.micro_batches = g->request.micro_batches;
    k.allowed = allowed_configs(&k);
    int L = m.num_layers, embedding = -1, ln_f = -1;
    switch (request->part) {
    case LOOM_INTRAOP_BLOCK:
        st = build_block(g, &k, 1, request->space);
        if (st == LOOM_OK) /* the next block's input */
            st = add_edge(g, &k, B_ADD2, B_INPUT, 1, m.channels);
        break;
    case LOOM_INTRAOP_EMBEDDING_HEAD:
        st = build_ends(g, &k, request->space, &embedding, &ln_f);
        if (st == LOOM_OK) st = add_edge(g, &k, embedding, ln_f, 1, m.channels);
        break;
    default:
        st = build_block(g, &k, L, request->space);
        if (st == LOOM_OK) st = add_edge(g, &k, B_ADD2, B_INPUT, L - 1, m.channels);
        if (st == LOOM_OK) st = build_ends(g, &k, request->space, &embedding, &ln_f);
        if (st == LOOM_OK) st = add_edge(g, &k, embedding, B_INPUT, 1, m.channels);
        if (st == LOOM_OK) st = add_edge(g, &k, B_ADD2, ln_f, 1, m.channels);
        break;
    }
    /* a configuration runs where every operator offers a strategy in it */
    g->configs = k.allowed;
    for (int v = 0; v < g->ops; v++) {
        unsigned any = 0;
        for (int i = 0; i < g->op[v].strategies; i++) any |= g->op[v].strategy[i].runtime;
        g->configs &= any;
    }
    for (int v = 0; v < g->ops; v++) {
        for (int i = 0; i < g->op[v].strategies; i++) g->op[v].strategy[i].runtime &= g->configs;
    }
    if (st == LOOM_OK && request->space == LOOM_INTRAOP_RUNTIME && !g->configs) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "intra-op: the runtime's layouts do not divide the tensors on the mesh "
                       "(dp %d, tp %d) in any configuration",
                       request->dp, request->tp);
    }
    if (st != LOOM_OK) {
        loom_intraop_graph_free(g);
        return st;
    }
    *graph = g;
    return LOOM_OK;
}

void loom_intraop_graph_free(loom_intraop_graph *graph) {
    if (!graph) return;
    for (int e = 0; e < graph->edges; e++) free(graph->edge[e].reshard_s);
    free(graph);
}

/* ---- pricing a choice ------------------------------------------------------------------- */

void loom_intraop_evaluate(const loom_intraop_graph *g, const int *choice,
                           loom_intraop_result *out) {
    memset(out, 0, sizeof *out);
    for (int v = 0; v < g->ops; v++) {
        const loom_intraop_strategy *s = &g->op[v].strategy[choice[v]];
        double n = g->op[v].count;
        out->choice[v] = choice[v];
        out->compute_s += n * s->compute_s, out->comm_s += n * s->comm_s;
        out->sync_s += n * s->sync_s;
        out->state_bytes += (int64_t)g->op[v].count * s->state_bytes;
    }
    unsigned runs = g->configs;
    for (int v = 0; v < g->ops; v++) runs &= g->op[v].strategy[choice[v]].runtime;
    out->config = -1; /* the least ZeRO stage, then without SP */
    for (int z = 0; z < 4 && out->config < 0; z++) {
        for (int sp = 0; sp < 2 && out->config < 0; sp++) {
            if (runs >> LOOM_INTRAOP_CONFIG(z, sp) & 1) out->config = LOOM_INTRAOP_CONFIG(z, sp);
        }
    }
    for (int i = 0; i < g->edges; i++) {
        const loom_intraop_edge *e = &g->edge[i];
        double r =
            e->count * e->reshard_s[choice[e->from] * g->op[e->to].strategies + choice[e->to]];
        if (e->tied) {
            out->sync_s += r, out->op_tied_s[e->to] += r;
        } else {
            out->reshard_s += r, out->op_reshard_s[e->to] += r;
        }
    }
    out->objective_s = out->compute_s + out->comm_s + out->reshard_s + out->sync_s;
}

int loom_intraop_runtime_choice(const loom_intraop_graph *g, int config, int *choice) {
    int all = 1;
    for (int v = 0; v < g->ops; v++) {
        choice[v] = -1;
        for (int i = 0; i < g->op[v].strategies && choice[v] < 0; i++) {
            if (config >= 0 && config < LOOM_INTRAOP_CONFIGS &&
                g->op[v].strategy[i].runtime >> config & 1)
                choice[v] = i;
        }
        all &= choice[v] >= 0;
    }
    return all;
}

/* ---- where the runtime cannot follow ----------------------------------------------------- */

/* Axis a's split in words: "tokens over tp", "k over tp [reduce-scatter to tokens]". */
static void axis_words(const loom_intraop_strategy *s, int a, char *out, size_t cap) {
    static const char *reduce[] = {"allreduce", "reduce-scatter to tokens",
                                   "reduce-scatter to columns"};
    switch (s->split[a]) {
    case LOOM_INTRAOP_TOKENS:
        snprintf(out, cap, "tokens over %s", axis_name[a]);
        break;
    case LOOM_INTRAOP_N:
        snprintf(out, cap, "columns over %s", axis_name[a]);
        break;
    case LOOM_INTRAOP_K:
        snprintf(out, cap, "k over %s [%s]", axis_name[a], reduce[s->reduce[a]]);
        break;
    default:
        snprintf(out, cap, "replicated over %s", axis_name[a]);
        break;
    }
}

/* Why no runtime configuration runs strategy s of operator o. */
static void why_never(const loom_intraop_graph *g, const loom_intraop_op *o,
                      const loom_intraop_strategy *s, char *why, size_t cap) {
    int dp = g->request.dp, tp = g->request.tp, weight_dp = 0, weight_tp = 0, tp_known = 0;
    char ours[64], theirs[160] = "", part[64];
    weight_dp = s->split[0] == LOOM_INTRAOP_K || s->split[0] == LOOM_INTRAOP_N;
    weight_tp = s->split[1] == LOOM_INTRAOP_K || s->split[1] == LOOM_INTRAOP_N;
    for (int i = 0; i < o->strategies; i++) { /* the runtime's splits over tp, in words */
        const loom_intraop_strategy *r = &o->strategy[i];
        if (!r->runtime) continue;
        tp_known |= r->split[1] == s->split[1] &&
                    (s->split[1] != LOOM_INTRAOP_K || r->reduce[1] == s->reduce[1]);
        axis_words(r, 1, part, sizeof part);
        if (!strstr(theirs, part)) append(theirs, sizeof theirs, part);
    }
    if (!theirs[0]) {
        snprintf(why, cap, "the runtime has no layout for it on this mesh");
    } else if (dp > 1 && weight_dp && o->weights) {
        snprintf(why, cap,
                 "its weight split over %s (the runtime splits only the tokens over dp; ZeRO "
                 "shards a weight's storage and gathers it whole for compute)",
                 weight_tp ? "both axes at once" : "dp");
    } else if (dp > 1 && s->split[0] != LOOM_INTRAOP_TOKENS) {
        axis_words(s, 0, ours, sizeof ours);
        snprintf(why, cap, "%s (the runtime splits every operator's tokens over dp)", ours);
    } else if (tp > 1 && !tp_known) {
        axis_words(s, 1, ours, sizeof ours);
        snprintf(why, cap, "%s: loom's tensor parallelism has no kernel for that here (it runs %s)",
                 ours, theirs);
    } else if (o->held && s->zero > 1) {
        snprintf(why, cap,
                 "ZeRO-%d, where the runtime holds this unit whole under ZeRO-2/3 (ZeRO-1's "
                 "state)",
                 s->zero);
    } else {
        snprintf(why, cap, "a combination no runtime configuration runs");
    }
}

/* The strategy of operator v that configuration c runs in place of strategy i at no cost: i
 * itself, or one with the same splits (so the same layouts on every edge) and the same time
 * (ZeRO-0 and ZeRO-1 cost alike where an allreduce is a reduce-scatter and an all-gather), the
 * least state of those; -1: none. */
static int same_in(const loom_intraop_graph *g, int v, int i, int c) {
    const loom_intraop_op *o = &g->op[v];
    const loom_intraop_strategy *s = &o->strategy[i];
    if (s->runtime >> c & 1) return i;
    double t = s->compute_s + s->comm_s + s->sync_s;
    int best = -1;
    for (int j = 0; j < o->strategies; j++) {
        const loom_intraop_strategy *r = &o->strategy[j];
        if (!(r->runtime >> c & 1) || memcmp(r->split, s->split, sizeof s->split)) continue;
        int same_reduce = 1;
        for (int a = 0; a < 2; a++)
            same_reduce &= s->split[a] != LOOM_INTRAOP_K || r->reduce[a] == s->reduce[a];
        double u = r->compute_s + r->comm_s + r->sync_s;
        if (!same_reduce || fabs(u - t) > 1e-12 * t) continue;
        if (best < 0 || r->state_bytes < o->strategy[best].state_bytes) best = j;
    }
    return best;
}

/* Whether configuration c runs choice[] at its cost within the budget (each operator's
 * strategy, or the same at no cost: same_in). */
static int runs_at_cost(const loom_intraop_graph *g, const int *choice, int c) {
    int64_t state = 0;
    for (int v = 0; v < g->ops; v++) {
        int j = same_in(g, v, choice[v], c);
        if (j < 0) return 0;
        state += (int64_t)g->op[v].count * g->op[v].strategy[j].state_bytes;
    }
    return g->request.memory_budget <= 0 || state <= g->request.memory_budget;
}

int loom_intraop_unfollowed(const loom_intraop_graph *g, const int *choice, int *config,
                            char why[][LOOM_INTRAOP_WHY_CHARS]) {
    *config = -1; /* the least ZeRO stage, then without SP */
    for (int z = 0; z < 4 && *config < 0; z++) {
        for (int sp = 0; sp < 2 && *config < 0; sp++) {
            int c = LOOM_INTRAOP_CONFIG(z, sp);
            if (g->configs >> c & 1 && runs_at_cost(g, choice, c)) *config = c;
        }
    }
    for (int v = 0; v < g->ops; v++) why[v][0] = '\0';
    if (*config >= 0) return 0;
    /* the configuration the most operators run in: the others are said to mix */
    int best = -1, best_ops = -1, unfollowed = 0;
    for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) {
        if (!(g->configs >> c & 1)) continue;
        int ops = 0;
        for (int v = 0; v < g->ops; v++) ops += same_in(g, v, choice[v], c) >= 0;
        if (ops > best_ops) best = c, best_ops = ops;
    }
    for (int v = 0; v < g->ops; v++) {
        const loom_intraop_op *o = &g->op[v];
        const loom_intraop_strategy *s = &o->strategy[choice[v]];
        if (best >= 0 && same_in(g, v, choice[v], best) >= 0) continue;
        unfollowed++;
        if (!s->runtime || best < 0) {
            why_never(g, o, s, why[v], LOOM_INTRAOP_WHY_CHARS);
            continue;
        }
        int zero = LOOM_INTRAOP_CONFIG_ZERO(best), sp = LOOM_INTRAOP_CONFIG_SP(best);
        int zero_runs = 0, sp_runs = 0;
        for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) {
            if (!(s->runtime >> c & 1)) continue;
            zero_runs |= LOOM_INTRAOP_CONFIG_ZERO(c) == zero;
            sp_runs |= LOOM_INTRAOP_CONFIG_SP(c) == sp;
        }
        if (!zero_runs) {
            snprintf(why[v], LOOM_INTRAOP_WHY_CHARS,
                     "ZeRO-%d where the rest runs ZeRO-%d (the runtime has one ZeRO stage for the "
                     "model)",
                     s->zero, zero);
        } else if (!sp_runs) {
            snprintf(why[v], LOOM_INTRAOP_WHY_CHARS,
                     "%s sequence parallelism where the rest runs %s (the runtime has it in every "
                     "block or none)",
                     sp ? "without" : "with", sp ? "with it" : "without");
        } else {
            snprintf(why[v], LOOM_INTRAOP_WHY_CHARS,
                     "ZeRO and sequence parallelism combined as no runtime configuration does");
        }
    }
    return unfollowed;
}

/* ---- the ILP ---------------------------------------------------------------------------- */

/* GLPK's matrix as 1-based triplets (index 0 unused), grown as rows are added. */
typedef struct {
    int *ia, *ja;
    double *ar;
    int nz, cap;
} triplets;

static int triplet_add(triplets *t, int row, int col, double value) {
    if (t->nz + 1 >= t->cap) {
        int cap = t->cap ? 2 * t->cap : 1024;
        int *ia = realloc(t->ia, (size_t)cap * sizeof *ia);
        if (ia) t->ia = ia;
        int *ja = realloc(t->ja, (size_t)cap * sizeof *ja);
        if (ja) t->ja = ja;
        double *ar = realloc(t->ar, (size_t)cap * sizeof *ar);
        if (ar) t->ar = ar;
        if (!ia || !ja || !ar) return 0;
        t->cap = cap;
    }
    t->nz++;
    t->ia[t->nz] = row, t->ja[t->nz] = col, t->ar[t->nz] = value;
    return 1;
}

/* Objective coefficients in microseconds: GLPK's tolerances are absolute near 1. */
#define ILP_UNITS_PER_S 1e6

/* s: one binary per operator and strategy, costed, one strategy per operator. */
static int add_strategy_columns(const loom_intraop_graph *g, glp_prob *lp, triplets *t,
                                int *s_col) {
    int ok = 1;
    for (int v = 0; v < g->ops; v++) {
        const loom_intraop_op *o = &g->op[v];
        s_col[v] = glp_add_cols(lp, o->strategies);
        int row = glp_add_rows(lp, 1);
        glp_set_row_bnds(lp, row, GLP_FX, 1.0, 1.0);
        for (int i = 0; i < o->strategies; i++) {
            const loom_intraop_strategy *s = &o->strategy[i];
            glp_set_col_kind(lp, s_col[v] + i, GLP_BV);
            glp_set_obj_coef(lp, s_col[v] + i,
                             o->count * (s->compute_s + s->comm_s + s->sync_s) * ILP_UNITS_PER_S);
            ok &= triplet_add(t, row, s_col[v] + i, 1.0);
        }
    }
    return ok;
}

/* The classes of one end of an edge (by_row: the producer's strategies, the rows of its
 * (nu, nv) costs; else the consumer's, the columns): strategies whose costs on the edge are
 * alike share one. cls[i] is strategy i's class, first[c] a member of class c; returns the
 * number of classes. */
static int cost_classes(const double *cost, int nu, int nv, int by_row, int *cls, int *first) {
    int n = by_row ? nu : nv, len = by_row ? nv : nu, classes = 0;
    for (int i = 0; i < n; i++) {
        cls[i] = -1;
        for (int c = 0; c < classes && cls[i] < 0; c++) {
            int same = 1;
            for (int x = 0; x < len && same; x++) {
                same = by_row ? cost[i * nv + x] == cost[first[c] * nv + x]
                              : cost[x * nv + i] == cost[x * nv + first[c]];
            }
            if (same) cls[i] = c;
        }
        if (cls[i] < 0) first[classes] = i, cls[i] = classes++;
    }
    return classes;
}

/* e of one edge over its ends' classes: e_pq in [0, 1], costed; row p sums to the s of class
 * p's strategies of the producer, column q to those of class q of the consumer. */
static int add_edge_columns(const loom_intraop_graph *g, const loom_intraop_edge *e, glp_prob *lp,
                            triplets *t, const int *s_col) {
    int nu = g->op[e->from].strategies, nv = g->op[e->to].strategies, ok = 1;
    int ucls[LOOM_INTRAOP_MAX_STRATEGIES], ufirst[LOOM_INTRAOP_MAX_STRATEGIES];
    int vcls[LOOM_INTRAOP_MAX_STRATEGIES], vfirst[LOOM_INTRAOP_MAX_STRATEGIES];
    int cu = cost_classes(e->reshard_s, nu, nv, 1, ucls, ufirst);
    int cv = cost_classes(e->reshard_s, nu, nv, 0, vcls, vfirst);
    int col = glp_add_cols(lp, cu * cv);
    for (int p = 0; p < cu; p++) {
        for (int q = 0; q < cv; q++) {
            glp_set_col_bnds(lp, col + p * cv + q, GLP_DB, 0.0, 1.0);
            glp_set_obj_coef(lp, col + p * cv + q,
                             e->count * e->reshard_s[ufirst[p] * nv + vfirst[q]] * ILP_UNITS_PER_S);
        }
    }
    int rows = glp_add_rows(lp, cu + cv);
    for (int r = 0; r < cu + cv; r++) glp_set_row_bnds(lp, rows + r, GLP_FX, 0.0, 0.0);
    for (int i = 0; i < nu; i++) ok &= triplet_add(t, rows + ucls[i], s_col[e->from] + i, -1.0);
    for (int j = 0; j < nv; j++) ok &= triplet_add(t, rows + cu + vcls[j], s_col[e->to] + j, -1.0);
    for (int p = 0; p < cu; p++) {
        for (int q = 0; q < cv; q++) {
            ok &= triplet_add(t, rows + p, col + p * cv + q, 1.0);
            ok &= triplet_add(t, rows + cu + q, col + p * cv + q, 1.0);
        }
    }
    return ok;
}

/* The runtime space: one configuration y_c for the whole graph, and each strategy only where a
 * configuration that runs it is chosen. */
static int add_config_rows(const loom_intraop_graph *g, glp_prob *lp, triplets *t,
                           const int *s_col) {
    int y[LOOM_INTRAOP_CONFIGS], n = 0, ok = 1;
    for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) y[c] = g->configs >> c & 1 ? n++ : -1;
    if (n < 2) return 1; /* one configuration: every strategy left runs in it */
    int col = glp_add_cols(lp, n), one = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, one, GLP_FX, 1.0, 1.0);
    for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) {
        if (y[c] < 0) continue;
        glp_set_col_kind(lp, col + y[c], GLP_BV);
        ok &= triplet_add(t, one, col + y[c], 1.0);
    }
    for (int v = 0; v < g->ops; v++) {
        for (int i = 0; i < g->op[v].strategies; i++) {
            unsigned runs = g->op[v].strategy[i].runtime & g->configs;
            if (runs == g->configs) continue; /* in every configuration: no constraint */
            int row = glp_add_rows(lp, 1);
            glp_set_row_bnds(lp, row, GLP_UP, 0.0, 0.0);
            ok &= triplet_add(t, row, s_col[v] + i, 1.0);
            for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) {
                if (runs >> c & 1) ok &= triplet_add(t, row, col + y[c], -1.0);
            }
        }
    }
    return ok;
}

/* The state per device within the budget, in units of the budget. */
static int add_budget_row(const loom_intraop_graph *g, glp_prob *lp, triplets *t,
                          const int *s_col) {
    double budget = (double)g->request.memory_budget;
    int row = glp_add_rows(lp, 1), ok = 1;
    glp_set_row_bnds(lp, row, GLP_UP, 0.0, 1.0);
    for (int v = 0; v < g->ops; v++) {
        for (int i = 0; i < g->op[v].strategies; i++) {
            double bytes = (double)g->op[v].count * (double)g->op[v].strategy[i].state_bytes;
            if (bytes > 0) ok &= triplet_add(t, row, s_col[v] + i, bytes / budget);
        }
    }
    return ok;
}

/* Builds the program, solves it, prices the choice. The budget was checked feasible. */
static loom_status solve_ilp(const loom_intraop_graph *g, loom_intraop_result *out) {
    int s_col[LOOM_INTRAOP_MAX_OPS], choice[LOOM_INTRAOP_MAX_OPS] = {0};
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    triplets t = {0};
    int ok = add_strategy_columns(g, lp, &t, s_col);
    for (int k = 0; k < g->edges; k++) { /* an edge that never runs costs nothing */
        if (g->edge[k].count > 0) ok &= add_edge_columns(g, &g->edge[k], lp, &t, s_col);
    }
    if (g->request.memory_budget > 0) ok &= add_budget_row(g, lp, &t, s_col);
    if (g->request.space == LOOM_INTRAOP_RUNTIME) ok &= add_config_rows(g, lp, &t, s_col);
    loom_status st = ok ? LOOM_OK : loom_fail(LOOM_ERR_NOMEM, "intra-op ILP: out of memory");
    int variables = glp_get_num_cols(lp), constraints = glp_get_num_rows(lp), nonzeros = t.nz;
    if (st == LOOM_OK) {
        glp_load_matrix(lp, t.nz, t.ia, t.ja, t.ar);
        glp_iocp parm;
        glp_init_iocp(&parm);
        parm.presolve = GLP_ON; /* solves the LP relaxation itself */
        parm.msg_lev = GLP_MSG_OFF;
        glp_term_out(GLP_OFF);
        int ret = glp_intopt(lp, &parm), status = glp_mip_status(lp);
        if (ret != 0 || status != GLP_OPT) {
            st = loom_fail(LOOM_ERR_RUNTIME, "intra-op ILP: glp_intopt returned %d, status %d", ret,
                           status);
        }
        for (int v = 0; v < g->ops && st == LOOM_OK; v++) {
            for (int i = 0; i < g->op[v].strategies; i++) {
                if (glp_mip_col_val(lp, s_col[v] + i) > 0.5) choice[v] = i;
            }
        }
    }
    glp_delete_prob(lp);
    free(t.ia), free(t.ja), free(t.ar);
    if (st == LOOM_OK) {
        loom_intraop_evaluate(g, choice, out);
        out->variables = variables, out->constraints = constraints, out->nonzeros = nonzeros;
    }
    return st;
}

/* The least state per operator over the strategies that `runs` (a set of configurations; all
 * ones: any strategy) allows, summed. */
static int64_t least_state_in(const loom_intraop_graph *g, unsigned runs) {
    int64_t least = 0;
    for (int v = 0; v < g->ops; v++) {
        int64_t smallest = INT64_MAX;
        for (int i = 0; i < g->op[v].strategies; i++) {
            const loom_intraop_strategy *s = &g->op[v].strategy[i];
            if ((runs == ~0u || (s->runtime & runs)) && s->state_bytes < smallest)
                smallest = s->state_bytes;
        }
        least += (int64_t)g->op[v].count * smallest;
    }
    return least;
}

/* The budget is a sum over operators: it can be met iff the least state of each meets it — in
 * the runtime space, within one configuration. */
static int64_t least_state(const loom_intraop_graph *g) {
    if (g->request.space != LOOM_INTRAOP_RUNTIME) return least_state_in(g, ~0u);
    int64_t least = INT64_MAX;
    for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) {
        if (!(g->configs >> c & 1)) continue;
        int64_t in_c = least_state_in(g, 1u << c);
        if (in_c < least) least = in_c;
    }
    return least;
}

loom_status loom_intraop_solve(const loom_intraop_graph *g, loom_intraop_result *out) {
    memset(out, 0, sizeof *out);
    int64_t least = least_state(g);
    int64_t budget = g->request.memory_budget;
    if (budget > 0 && least > budget) {
        return loom_fail(LOOM_ERR_INPUT,
                         "intra-op ILP: no strategy fits the memory budget of %.3f GiB per device "
                         "(the least state any choice needs is %.3f GiB)",
                         (double)budget / 1073741824.0, (double)least / 1073741824.0);
    }
    double t0 = loom_now();
    loom_status st = solve_ilp(g, out);
    out->solve_s = loom_now() - t0;
    return st;
}
