/*
 * loom/intraop.h — Alpa's intra-operator pass: which sharding strategy each operator of a GPT-2
 * training step takes on a 2-D logical mesh (dp, tp), chosen by an integer linear program
 * solved with GLPK.
 *
 * The graph. One transformer block (input, ln_1, c_attn, attention, attn c_proj, residual add,
 * ln_2, c_fc, gelu, MLP c_proj, residual add; the block's output feeds the next block's input)
 * and the embedding and head (wte gather + wpe, ln_f, the tied LM head x wte^T, softmax
 * cross-entropy over the padded vocabulary). The mesh runs dp x micro_batch sequences of seq_len
 * tokens at once (micro_batch is per data-parallel replica, as in a plan). An operator's costs
 * cover a training step: forward and backward of every micro-batch, and the weight-gradient sync
 * once per step, folded into the operator as Alpa does.
 *
 * Strategies. Mesh axis 0 has dp devices, axis 1 tp; a device's rank is dp_rank x tp + tp_rank,
 * so an axis-1 group is tp consecutive ranks (inside a node when they fit) and axis 0 strides
 * across (loom_plan_group_link picks each axis's link class). Each axis of size > 1 splits one
 * dimension of the operator or replicates it: a matmul Y[m,n] = X[m,k] W[k,n] splits tokens (m),
 * the contraction (k: partial sums, reduced by an allreduce or a reduce-scatter onto the tokens or
 * the columns) or the output columns (n); attention splits sequences or heads; the embedding
 * tokens, vocabulary rows (partial sums, allreduced) or channels; light operators (LayerNorm,
 * add, gelu, cross-entropy) the tokens or the hidden (vocabulary) columns. Both axes may split
 * one dimension. Tokens split by whole sequences only; a split must divide its dimension.
 * Per strategy:
 *   compute   a matmul's forward, input-gradient and weight-gradient GEMMs on the device's
 *             shard (loom_cluster_gemm_s: peak x the GEMM efficiency of the shard's FLOPs);
 *             attention's per-head GEMMs likewise; light operators as memory traffic (their
 *             elements streamed a few times) at the memory bandwidth;
 *   comm      the collectives inside the operator, forward and backward: a k split's allreduce
 *             of the output (or reduce-scatter, and the all-gather of its gradient in backward),
 *             an n split's allreduce of the input gradient, a LayerNorm over split columns its
 *             statistics, a vocabulary-parallel cross-entropy its max and sums;
 *   sync      the weight-gradient allreduce over every axis that splits the tokens (the weight
 *             is replicated there), fp32 gradients of the device's shard, once per step;
 *   state     bytes per device of parameters, gradients and AdamW's two moments (16 per fp32
 *             parameter, as loom holds them); the tied wte counts with the embedding only.
 * Resharding on an edge (producer's output layout to the consumer's input layout), per mesh axis
 * on its own: equal, nothing; a split to replicated or back, one all-gather (forward, or of the
 * gradient in backward: the other direction is a free slice); rows to columns or back, an
 * all-to-all each way (costed as an all-gather of 1/n of the bytes: the same traffic).
 * Collective times are loom_cluster_collective_s (allreduce a + b 2(n-1)/n B, all-gather and
 * reduce-scatter a + b (n-1)/n B per ring). Activations move in the precision's bytes (4 for
 * fp32, else 2).
 *
 * Search spaces. LOOM_INTRAOP_RUNTIME offers only what loom's runtime executes for (dp, tp):
 * tokens over dp with replicated weights, and Megatron's tensor parallelism over tp (c_attn and
 * c_fc column-parallel, both c_proj row-parallel with an allreduce, attention by heads, the
 * embedding and the LM head vocabulary-parallel, cross-entropy vocabulary-parallel, LayerNorms,
 * adds and the residual stream replicated over tp, gelu following c_fc's columns) — one strategy
 * per operator, so the answer always runs. LOOM_INTRAOP_FULL offers every strategy; what it gains
 * over the runtime space is simulation only.
 *
 * The ILP (REFERENCE.md, Alpa): a binary s_v,i per operator v and strategy i, sum_i s_v,i = 1;
 * per edge (u, v) variables e_uv,ij in [0, 1] with sum_j e_uv,ij = s_u,i and
 * sum_i e_uv,ij = s_v,j (with s integral these force e = s_u s_v^T, so e need not be declared
 * integral: the solver branches on s only); minimise sum count_v (compute + comm + sync) s +
 * sum count_uv reshard e; optionally sum count_v state s <= the memory budget.
 *
 * Not modelled: activation memory (the budget covers parameters, gradients and AdamW state),
 * the order of two axes splitting one dimension, overlap of communication with compute, a tied
 * wte held in two layouts (the head uses the embedding's copy at no cost).
 */
#ifndef LOOM_INTRAOP_H
#define LOOM_INTRAOP_H

#include "loom/base.h"
#include "loom/cluster.h"
#include "loom/model.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_FULL } loom_intraop_space;
/* "runtime", "full"; anything else is LOOM_ERR_INPUT naming `source` and `field`. */
loom_status loom_intraop_space_parse(const char *name, const char *source, const char *field,
                                     loom_intraop_space *space);

/* Which part of the model the graph holds. */
typedef enum {
    LOOM_INTRAOP_MODEL,          /* every block (one block's operators, count L) and the
                                    embedding and head around them */
    LOOM_INTRAOP_BLOCK,          /* one block, its output feeding its own input */
    LOOM_INTRAOP_EMBEDDING_HEAD, /* the embedding's output straight into ln_f */
} loom_intraop_part;

/* What a mesh axis does to an operator. */
typedef enum {
    LOOM_INTRAOP_REPLICATE, /* every device of the axis does the whole operator */
    LOOM_INTRAOP_TOKENS,    /* splits the sequences */
    LOOM_INTRAOP_K,         /* splits a contracted dimension (matmul k, the embedding's
                               vocabulary rows): partial sums, reduced as `reduce` says */
    LOOM_INTRAOP_N,         /* splits the columns (matmul n, heads, channels, hidden,
                               vocabulary of the logits) */
} loom_intraop_split;

typedef enum {
    LOOM_INTRAOP_ALLREDUCE,      /* output replicated over the axis */
    LOOM_INTRAOP_SCATTER_TOKENS, /* reduce-scatter: output split by tokens over the axis */
    LOOM_INTRAOP_SCATTER_N,      /* reduce-scatter: output split by columns over the axis */
} loom_intraop_reduce;

/* A 2-D activation's layout: per mesh axis, replicated, rows (tokens) or columns split. */
enum { LOOM_INTRAOP_REPL, LOOM_INTRAOP_ROWS, LOOM_INTRAOP_COLS };
typedef struct {
    int8_t axis[2];
} loom_intraop_layout;

typedef struct {
    char name[96];                 /* e.g. "column: n over tp, tokens over dp" */
    loom_intraop_split split[2];   /* per mesh axis (0: dp, 1: tp) */
    loom_intraop_reduce reduce[2]; /* for LOOM_INTRAOP_K */
    loom_intraop_layout in, out;   /* of the activation operand(s), of the output */
    double compute_s, comm_s;      /* per step: every micro-batch's forward and backward */
    double sync_s;                 /* per step: the weight-gradient allreduce */
    int64_t state_bytes;           /* per device: parameters, gradients, AdamW moments */
    int runtime;                   /* loom's runtime executes it */
} loom_intraop_strategy;

#define LOOM_INTRAOP_MAX_OPS        16
#define LOOM_INTRAOP_MAX_EDGES      24
#define LOOM_INTRAOP_MAX_STRATEGIES 64

typedef struct {
    char name[16];  /* "c_attn" */
    int count;      /* how often it runs per step (a block's operators: the layers) */
    int strategies; /* >= 1 */
    loom_intraop_strategy strategy[LOOM_INTRAOP_MAX_STRATEGIES];
} loom_intraop_op;

typedef struct {
    int from, to;       /* producer and consumer operators */
    int count;          /* how often per step (0: the edge is in the graph but costs nothing) */
    int tied;           /* not an activation: the tied wte between the embedding and the LM head
                           (its gathers where they split it differently, and its gradient sync) */
    int64_t rows, cols; /* the tensor passed: (tokens, width) */
    double *reshard_s;  /* (from's strategies, to's strategies): forward + backward, per step */
} loom_intraop_edge;

typedef struct {
    int dp, tp;        /* the logical mesh, each >= 1 */
    int micro_batch;   /* sequences per data-parallel replica (the mesh runs dp x this) */
    int micro_batches; /* per step (>= 1); 0: 1 */
    int seq_len;       /* tokens per sequence; 0: the model's context */
    loom_precision precision;
    loom_intraop_space space;
    loom_intraop_part part;
    int64_t memory_budget; /* bytes per device for state (parameters, gradients, AdamW);
                              0: no constraint */
} loom_intraop_request;

typedef struct {
    loom_intraop_request request;
    loom_gpt_config model;
    int ops, edges;
    loom_intraop_op op[LOOM_INTRAOP_MAX_OPS];
    loom_intraop_edge edge[LOOM_INTRAOP_MAX_EDGES];
    int link[2]; /* each axis's link class (LOOM_LINK_INTRA_NODE or LOOM_LINK_INTER_NODE) */
} loom_intraop_graph;

/* Builds the graph of `request->part` for `model` on `cluster` (which must have dp x tp
 * devices and a peak for the precision; the mesh, batch and sequence are checked, each problem
 * LOOM_ERR_INPUT naming the field). Free with loom_intraop_graph_free. */
loom_status loom_intraop_graph_create(loom_intraop_graph **graph, const loom_gpt_config *model,
                                      const loom_cluster *cluster,
                                      const loom_intraop_request *request);
void loom_intraop_graph_free(loom_intraop_graph *graph);

/* A choice of one strategy per operator, priced. */
typedef struct {
    int choice[LOOM_INTRAOP_MAX_OPS];
    double objective_s; /* = compute + comm + reshard + sync (the tied wte counts as sync) */
    double compute_s, comm_s, reshard_s, sync_s;
    int64_t state_bytes;                       /* per device */
    double op_reshard_s[LOOM_INTRAOP_MAX_OPS]; /* the edges into each operator, times count */
    double op_tied_s[LOOM_INTRAOP_MAX_OPS];    /* the tied wte's, on the LM head (in sync_s) */
    /* the solve (loom_intraop_solve only) */
    int variables, constraints, nonzeros;
    double solve_s;
} loom_intraop_result;

/* Prices choice[] (every operator's strategy index) on the graph: the ILP's objective. */
void loom_intraop_evaluate(const loom_intraop_graph *graph, const int *choice,
                           loom_intraop_result *out);
/* The runtime's strategy of every operator; 0 when some operator has none (a mesh the runtime
 * cannot run, in the full space: its choice[] is -1), else 1. */
int loom_intraop_runtime_choice(const loom_intraop_graph *graph, int *choice);

/* Solves the ILP with glp_intopt (GLPK silent). A memory budget no choice meets is
 * LOOM_ERR_INPUT naming the budget and the least state any choice needs. */
loom_status loom_intraop_solve(const loom_intraop_graph *graph, loom_intraop_result *out);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_INTRAOP_H */
