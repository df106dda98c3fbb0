/*
 * test_intraop.c — Alpa's intra-operator ILP (loom/intraop.h): on a (1, tp) mesh with expensive
 * links and weights that must be sharded, the full space recovers Megatron's column/row pattern
 * and its traffic (two allreduces per block forward, two backward); a (1, 1) mesh leaves
 * everything whole and a (dp, 1) mesh with cheap links is plain data parallelism; a tight
 * memory budget makes the ILP shard weights, and one below the least possible state is refused;
 * the ILP's optimum equals a brute-force enumeration of every strategy combination scored by
 * the same costs (several meshes, link speeds and budgets), and in the runtime space the best
 * enumerated combination whose operators all run in one runtime configuration (ZeRO stage and
 * sequence parallelism for the whole model; mixing them per operator would be cheaper, and the
 * ILP must not); each runtime configuration is exactly the runtime's layout, without SP its
 * tensor-parallel traffic the model's cost facts', with SP 5/4 of it (Megatron's count); the
 * runtime answer is never better than the full one, equal where the runtime follows the full
 * answer, and where it cannot the reason is named; a GPT-3 175B stage of 12 layers on (2, 4),
 * whose replicated state (83.7 GiB) exceeds an 80 GiB device, fits in the runtime space with its
 * state sharded over dp, by ZeRO-3 (the state by the ZeRO rules, counted here) under a tighter
 * budget; bad requests are refused by name.
 */
#include "check.h"
#include "loom/planner.h"

#include <string.h>

/* A cluster with perfect GEMMs and links of the given speed (bytes/s, seconds per step). */
static loom_cluster test_cluster(double bandwidth, double latency_s) {
    loom_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "test");
    c.nodes = 1, c.max_nodes = 4, c.devices_per_node = 8;
    c.memory_bytes = (int64_t)1 << 36;
    c.peak_flops[LOOM_PRECISION_FP32] = 1e12;
    c.memory_bandwidth = 1e11;
    c.gemm[0] = (loom_gemm_point){1.0, 1.0};
    c.gemm_points = 1;
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) c.links[l] = (loom_link){bandwidth, latency_s, 0.0};
    return c;
}

/* A small GPT: 2 layers, 4 heads, width 256, context 64, vocabulary 256. */
static loom_gpt_config small_model(void) {
    loom_gpt_config m;
    memset(&m, 0, sizeof m);
    m.max_seq_len = 64, m.vocab_size = 256, m.num_layers = 2, m.num_heads = 4, m.channels = 256;
    m.padded_vocab_size = 256;
    return m;
}

/* The model check_brute_force builds its graph for (small_model unless a test sets it). */
static loom_gpt_config brute_model;
static int brute_model_set;

/* A small Llama: 2 layers, width 64, 4 heads over 2 kv heads, SwiGLU 96, untied head. */
static loom_gpt_config small_llama(void) {
    loom_gpt_config m;
    memset(&m, 0, sizeof m);
    m.max_seq_len = 64, m.vocab_size = 256, m.num_layers = 2, m.num_heads = 4, m.channels = 64;
    m.padded_vocab_size = 256, m.arch = LOOM_ARCH_LLAMA, m.kv_heads = 2, m.ffn_dim = 96;
    m.untied_head = 1;
    return m;
}

static loom_intraop_request request_of(int dp, int tp, int micro_batch, loom_intraop_space space,
                                       loom_intraop_part part) {
    loom_intraop_request r;
    memset(&r, 0, sizeof r);
    r.dp = dp, r.tp = tp, r.micro_batch = micro_batch, r.micro_batches = 1;
    r.precision = LOOM_PRECISION_FP32, r.space = space, r.part = part;
    return r;
}

static int op_index(const loom_intraop_graph *g, const char *name) {
    for (int v = 0; v < g->ops; v++) {
        if (!strcmp(g->op[v].name, name)) return v;
    }
    CHECK(0, "no operator %s", name);
    return 0;
}

static const loom_intraop_strategy *chosen(const loom_intraop_graph *g,
                                           const loom_intraop_result *r, const char *name) {
    int v = op_index(g, name);
    return &g->op[v].strategy[r->choice[v]];
}

/* Builds and solves; NULL graph when either fails (the check says why). */
static loom_intraop_graph *solve(const loom_cluster *cl, const loom_intraop_request *req,
                                 loom_intraop_result *r) {
    loom_gpt_config m = small_model();
    loom_intraop_graph *g = NULL;
    loom_status st = loom_intraop_graph_create(&g, &m, cl, req);
    CHECK(st == LOOM_OK, "graph: %s", loom_last_error());
    if (st != LOOM_OK) return NULL;
    st = loom_intraop_solve(g, r);
    CHECK(st == LOOM_OK, "solve: %s", loom_last_error());
    if (st != LOOM_OK) {
        loom_intraop_graph_free(g);
        return NULL;
    }
    return g;
}

/* Megatron: one sequence (no batch to split) on (1, 4), links slow against compute, and a
 * budget a little above the runtime's sharded state: the weights must be split, and the
 * cheapest way to split them is column, row, column, row. */
static void test_megatron(void) {
    loom_cluster cl = test_cluster(1e8, 1e-5);
    loom_intraop_request req = request_of(1, 4, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_BLOCK);
    loom_intraop_result runtime, r;
    loom_intraop_graph *g = solve(&cl, &req, &runtime);
    if (!g) return;
    loom_intraop_graph_free(g);
    req.space = LOOM_INTRAOP_FULL;
    req.memory_budget = runtime.state_bytes + runtime.state_bytes / 50;
    g = solve(&cl, &req, &r);
    if (!g) return;
    static const struct {
        const char *op;
        loom_intraop_split split;
    } megatron[] = {{"c_attn", LOOM_INTRAOP_N},
                    {"attention", LOOM_INTRAOP_N},
                    {"attn_c_proj", LOOM_INTRAOP_K},
                    {"c_fc", LOOM_INTRAOP_N},
                    {"mlp_c_proj", LOOM_INTRAOP_K}};
    for (int i = 0; i < 5; i++) {
        const loom_intraop_strategy *s = chosen(g, &r, megatron[i].op);
        CHECK(s->split[1] == megatron[i].split, "megatron: %s chose \"%s\"", megatron[i].op,
              s->name);
    }
    CHECK(r.state_bytes <= req.memory_budget, "megatron: state %lld over the budget %lld",
          (long long)r.state_bytes, (long long)req.memory_budget);
    /* its traffic: allreduces of (tokens, C) after both row-parallel layers in forward and of
     * the column-parallel layers' input gradients in backward; nothing else moves */
    double tokens = 64, C = 256;
    double allreduce =
        loom_cluster_collective_s(&cl, LOOM_COLLECTIVE_ALLREDUCE, 0, 4, tokens * C * 4.0);
    CHECK_CLOSE(r.comm_s + r.reshard_s, 4 * allreduce, 1e-9, 0, "megatron: traffic");
    CHECK_CLOSE(r.objective_s, runtime.objective_s, 1e-9, 0, "megatron: the runtime's optimum");
    loom_intraop_graph_free(g);
}

/* Without devices to share, and with cheap links on (dp, 1), the trivial patterns. */
static void test_trivial(void) {
    loom_cluster cl = test_cluster(1e11, 1e-6);
    loom_intraop_request req = request_of(1, 1, 2, LOOM_INTRAOP_FULL, LOOM_INTRAOP_MODEL);
    loom_intraop_result r;
    loom_intraop_graph *g = solve(&cl, &req, &r);
    if (g) {
        for (int v = 0; v < g->ops; v++) {
            CHECK(g->op[v].strategies == 1, "(1, 1): %s offers %d strategies", g->op[v].name,
                  g->op[v].strategies);
            CHECK(!strcmp(g->op[v].strategy[r.choice[v]].name, "replicated"), "(1, 1): %s: %s",
                  g->op[v].name, g->op[v].strategy[r.choice[v]].name);
        }
        CHECK(r.comm_s == 0 && r.reshard_s == 0 && r.sync_s == 0, "(1, 1): communicates");
        loom_intraop_graph_free(g);
    }
    /* (4, 1), 4 sequences per replica, 8 micro-batches a step: the gradient sync once a step
     * costs less than moving activations every micro-batch */
    req = request_of(4, 1, 4, LOOM_INTRAOP_FULL, LOOM_INTRAOP_BLOCK);
    req.micro_batches = 8;
    g = solve(&cl, &req, &r);
    if (g) {
        for (int v = 0; v < g->ops; v++) {
            const loom_intraop_strategy *s = &g->op[v].strategy[r.choice[v]];
            CHECK(s->split[0] == LOOM_INTRAOP_TOKENS, "(4, 1): %s chose \"%s\"", g->op[v].name,
                  s->name);
        }
        CHECK(r.comm_s == 0 && r.reshard_s == 0 && r.sync_s > 0, "(4, 1): data parallel's costs");
        /* a budget of half that state binds: something is sharded, and it fits */
        int64_t replicated = r.state_bytes;
        loom_intraop_graph_free(g);
        req.memory_budget = replicated / 2;
        g = solve(&cl, &req, &r);
        if (g) {
            int sharded = 0; /* split over dp, or its state sharded by ZeRO */
            for (int v = 0; v < g->ops; v++) {
                const loom_intraop_strategy *s = &g->op[v].strategy[r.choice[v]];
                sharded +=
                    s->split[0] == LOOM_INTRAOP_K || s->split[0] == LOOM_INTRAOP_N || s->zero > 0;
            }
            CHECK(sharded > 0, "(4, 1), budget: nothing sharded");
            CHECK(r.state_bytes <= req.memory_budget, "(4, 1): state %lld over the budget %lld",
                  (long long)r.state_bytes, (long long)req.memory_budget);
            /* below the least any choice needs: refused, naming the budget */
            g->request.memory_budget = replicated / 100;
            loom_status st = loom_intraop_solve(g, &r);
            CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "memory budget"),
                  "(4, 1), tiny budget: %d %s", st, loom_last_error());
            loom_intraop_graph_free(g);
        }
    }
}

/* ---- brute force --------------------------------------------------------------------------- */

typedef struct {
    const loom_intraop_graph *g;
    int choice[LOOM_INTRAOP_MAX_OPS];
    double best;
    int64_t budget;
    int one_config; /* only combinations whose operators share a runtime configuration */
} enumeration;

/* Every combination, op by op, each edge's cost added once both its ends are chosen; a branch
 * already no better than the best (costs are >= 0), or over the budget, ends there. With
 * one_config, `runs` is the configurations every operator so far runs in. */
static void enumerate(enumeration *en, int v, double cost, int64_t state, unsigned runs) {
    const loom_intraop_graph *g = en->g;
    if (v == g->ops) {
        if (cost < en->best) en->best = cost;
        return;
    }
    const loom_intraop_op *o = &g->op[v];
    for (int i = 0; i < o->strategies; i++) {
        const loom_intraop_strategy *s = &o->strategy[i];
        unsigned still = runs & s->runtime;
        if (en->one_config && !still) continue;
        en->choice[v] = i;
        double c = cost + o->count * (s->compute_s + s->comm_s + s->sync_s);
        for (int k = 0; k < g->edges; k++) {
            const loom_intraop_edge *e = &g->edge[k];
            int last = e->from > e->to ? e->from : e->to;
            if (last != v) continue;
            c += e->count *
                 e->reshard_s[en->choice[e->from] * g->op[e->to].strategies + en->choice[e->to]];
        }
        int64_t st = state + (int64_t)o->count * s->state_bytes;
        if (c >= en->best || (en->budget > 0 && st > en->budget)) continue;
        enumerate(en, v + 1, c, st, still);
    }
}

static double enumerated_best(const loom_intraop_graph *g, int one_config) {
    enumeration en = {g, {0}, 1e300, g->request.memory_budget, one_config};
    enumerate(&en, 0, 0.0, 0, g->configs);
    return en.best;
}

static double combinations(const loom_intraop_graph *g) {
    double n = 1;
    for (int v = 0; v < g->ops; v++) n *= g->op[v].strategies;
    return n;
}

/* A share of the state of the runtime's layout without ZeRO (the full space: of the ILP's
 * unconstrained answer): binding below 1. */
static int64_t budget_of(loom_intraop_graph *g, double share) {
    loom_intraop_result r;
    int choice[LOOM_INTRAOP_MAX_OPS];
    if (g->request.space == LOOM_INTRAOP_RUNTIME) {
        CHECK(loom_intraop_runtime_choice(g, LOOM_INTRAOP_CONFIG(0, 0), choice) == 1, "budget");
        loom_intraop_evaluate(g, choice, &r);
    } else {
        int64_t keep = g->request.memory_budget;
        g->request.memory_budget = 0;
        CHECK(loom_intraop_solve(g, &r) == LOOM_OK, "budget: %s", loom_last_error());
        g->request.memory_budget = keep;
    }
    return (int64_t)(share * (double)r.state_bytes);
}

/* Returns the ILP's objective (0 where a check failed). */
static double check_brute_force(const char *what, const loom_cluster *cl, loom_intraop_request req,
                                double budget_share) {
    loom_gpt_config m = brute_model_set ? brute_model : small_model();
    loom_intraop_graph *g = NULL;
    CHECK(loom_intraop_graph_create(&g, &m, cl, &req) == LOOM_OK, "%s: %s", what,
          loom_last_error());
    if (!g) return 0;
    int runtime = req.space == LOOM_INTRAOP_RUNTIME;
    if (budget_share > 0) g->request.memory_budget = budget_of(g, budget_share);
    double best = enumerated_best(g, runtime);
    loom_intraop_result r;
    loom_status st = loom_intraop_solve(g, &r);
    CHECK(st == LOOM_OK, "%s: %s", what, loom_last_error());
    /* the runtime space: more than one per configuration */
    CHECK(combinations(g) > (runtime ? LOOM_INTRAOP_CONFIGS : 1000), "%s: only %.0f combinations",
          what, combinations(g));
    CHECK_CLOSE(r.objective_s, best, 1e-9, 0, what);
    if (g->request.memory_budget > 0) {
        CHECK(r.state_bytes <= g->request.memory_budget, "%s: over the budget", what);
    }
    if (runtime) { /* the answer runs, and one configuration's strategies are all it uses */
        CHECK(r.config >= 0 && (g->configs >> r.config & 1), "%s: configuration %d", what,
              r.config);
        for (int v = 0; v < g->ops && r.config >= 0; v++) {
            CHECK(g->op[v].strategy[r.choice[v]].runtime >> r.config & 1, "%s: %s is not in %d",
                  what, g->op[v].name, r.config);
        }
    }
    loom_intraop_graph_free(g);
    return st == LOOM_OK ? r.objective_s : 0;
}

static void test_brute_force(void) {
    loom_cluster cheap = test_cluster(1e11, 1e-6), slow = test_cluster(1e8, 1e-5),
                 latency = test_cluster(1e12, 1e-3);
    loom_intraop_request block12 = request_of(1, 2, 2, LOOM_INTRAOP_FULL, LOOM_INTRAOP_BLOCK);
    loom_intraop_request block21 = request_of(2, 1, 1, LOOM_INTRAOP_FULL, LOOM_INTRAOP_BLOCK);
    loom_intraop_request ends = request_of(2, 2, 1, LOOM_INTRAOP_FULL, LOOM_INTRAOP_EMBEDDING_HEAD);
    check_brute_force("block (1, 2), cheap links", &cheap, block12, 0);
    check_brute_force("block (1, 2), slow links, budget", &slow, block12, 0.6);
    check_brute_force("block (2, 1), latency-bound links", &latency, block21, 0);
    check_brute_force("embedding and head (2, 2), cheap links", &cheap, ends, 0);
    check_brute_force("embedding and head (2, 2), slow links, budget", &slow, ends, 0.3);
}

/* The runtime space: the ILP's optimum is the best combination of runtime strategies that one
 * runtime configuration runs (ZeRO stage and SP alike for every operator). */
static void test_brute_force_runtime(void) {
    loom_cluster cheap = test_cluster(1e11, 1e-6), slow = test_cluster(1e8, 1e-5);
    loom_intraop_request block = request_of(2, 2, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_BLOCK);
    block.micro_batches = 3;
    loom_intraop_request ends =
        request_of(2, 2, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_EMBEDDING_HEAD);
    loom_intraop_request model = request_of(2, 2, 2, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_MODEL);
    /* ZeRO-1 keeps 12/16 of the state on dp 2, ZeRO-2 10/16, ZeRO-3 8/16; the embedding and
     * ln_f at most ZeRO-1's */
    check_brute_force("runtime, block (2, 2), cheap links", &cheap, block, 0);
    check_brute_force("runtime, block (2, 2), slow links, budget", &slow, block, 0.6);
    check_brute_force("runtime, embedding and head (2, 2), budget", &slow, ends, 0.8);
    check_brute_force("runtime, model (2, 2), slow links, budget", &slow, model, 0.7);
    /* the configuration constraint binds: per operator, the same strategies would do better
     * (ZeRO-3 only where the budget needs it) — an ILP without it would find that */
    loom_gpt_config m = small_model();
    loom_intraop_graph *g = NULL;
    CHECK(loom_intraop_graph_create(&g, &m, &slow, &block) == LOOM_OK, "%s", loom_last_error());
    if (!g) return;
    loom_intraop_result r;
    g->request.memory_budget = budget_of(g, 0.55);
    CHECK(loom_intraop_solve(g, &r) == LOOM_OK, "%s", loom_last_error());
    double mixed = enumerated_best(g, 0);
    CHECK(mixed < r.objective_s * (1 - 1e-9), "mixing configurations: %g, one: %g", mixed,
          r.objective_s);
    CHECK(r.config >= 0 && LOOM_INTRAOP_CONFIG_ZERO(r.config) == 3,
          "a budget of 55 %% of the replicated state: configuration %d", r.config);
    loom_intraop_graph_free(g);
}

/* ---- the runtime space ------------------------------------------------------------------- */

/* Configuration `config`'s strategies of the (2, 2) model: the runtime's layout operator by
 * operator (tokens over dp; Megatron over tp, the residual stream's rows with SP). */
static void check_runtime_layout(const loom_intraop_graph *g, int config) {
    int sp = LOOM_INTRAOP_CONFIG_SP(config), zero = LOOM_INTRAOP_CONFIG_ZERO(config);
    loom_intraop_split stream = sp ? LOOM_INTRAOP_TOKENS : LOOM_INTRAOP_REPLICATE;
    loom_intraop_reduce row = sp ? LOOM_INTRAOP_SCATTER_TOKENS : LOOM_INTRAOP_ALLREDUCE;
    const struct {
        const char *op;
        loom_intraop_split tp;
        loom_intraop_reduce reduce;
        int zero; /* the ZeRO stage of its weights */
    } runtime[] = {{"input", stream, 0, 0},
                   {"ln_1", stream, 0, zero},
                   {"c_attn", LOOM_INTRAOP_N, 0, zero},
                   {"attention", LOOM_INTRAOP_N, 0, 0},
                   {"attn_c_proj", LOOM_INTRAOP_K, row, zero},
                   {"add_1", stream, 0, 0},
                   {"ln_2", stream, 0, zero},
                   {"c_fc", LOOM_INTRAOP_N, 0, zero},
                   {"gelu", LOOM_INTRAOP_N, 0, 0},
                   {"mlp_c_proj", LOOM_INTRAOP_K, row, zero},
                   {"add_2", stream, 0, 0},
                   {"embedding", LOOM_INTRAOP_K, row, zero > 1 ? 1 : zero}, /* held whole */
                   {"ln_f", stream, 0, zero > 1 ? 1 : zero},
                   {"lm_head", LOOM_INTRAOP_N, 0, 0},
                   {"cross_entropy", LOOM_INTRAOP_N, 0, 0}};
    int n = (int)(sizeof runtime / sizeof runtime[0]), choice[LOOM_INTRAOP_MAX_OPS];
    CHECK(g->ops == n, "runtime: %d operators, expected %d", g->ops, n);
    CHECK(loom_intraop_runtime_choice(g, config, choice) == 1, "configuration %d: none", config);
    for (int i = 0; i < n; i++) {
        int v = op_index(g, runtime[i].op), runs = 0;
        for (int k = 0; k < g->op[v].strategies; k++)
            runs += g->op[v].strategy[k].runtime >> config & 1;
        CHECK(runs == 1, "configuration %d: %s offers %d", config, runtime[i].op, runs);
        const loom_intraop_strategy *s = &g->op[v].strategy[choice[v]];
        CHECK(s->split[0] == LOOM_INTRAOP_TOKENS && s->split[1] == runtime[i].tp &&
                  (s->split[1] != LOOM_INTRAOP_K || s->reduce[1] == runtime[i].reduce) &&
                  s->zero == runtime[i].zero,
              "configuration %d: %s is \"%s\"", config, runtime[i].op, s->name);
    }
}

static void test_runtime_space(void) {
    loom_cluster cl = test_cluster(1e10, 1e-6);
    loom_intraop_request req = request_of(2, 2, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_MODEL);
    loom_intraop_result r;
    loom_intraop_graph *g = solve(&cl, &req, &r);
    if (!g) return;
    CHECK(g->configs == 0xff, "runtime: configurations %#x, expected all 8", g->configs);
    for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) check_runtime_layout(g, c);
    int choice[LOOM_INTRAOP_MAX_OPS];
    loom_intraop_runtime_choice(g, LOOM_INTRAOP_CONFIG(0, 0), choice);
    CHECK(!strcmp(g->op[op_index(g, "c_attn")].strategy[choice[op_index(g, "c_attn")]].name,
                  "column (n over tp), tokens over dp"),
          "runtime: c_attn named \"%s\"",
          g->op[op_index(g, "c_attn")].strategy[choice[op_index(g, "c_attn")]].name);
    /* without SP the runtime reshards nothing, and a block's tensor-parallel traffic is the
     * cost facts' */
    loom_intraop_result tp_only, sp;
    loom_intraop_evaluate(g, choice, &tp_only);
    CHECK(tp_only.reshard_s == 0, "runtime: the runtime reshards nothing, got %g s",
          tp_only.reshard_s);
    loom_gpt_config m = small_model();
    loom_gpt_part_cost facts;
    CHECK(loom_gpt_cost_block(&m, 2, 1, 64, &facts) == LOOM_OK, "cost facts");
    double per_call = (double)facts.tp_bytes_fwd / (double)facts.tp_allreduces_fwd;
    double tp = (double)(facts.tp_allreduces_fwd + facts.tp_allreduces_bwd) *
                loom_cluster_collective_s(&cl, LOOM_COLLECTIVE_ALLREDUCE, 0, 2, per_call);
    double block_comm = 0;
    for (int v = 0; v < op_index(g, "embedding"); v++)
        block_comm += g->op[v].strategy[choice[v]].comm_s;
    CHECK_CLOSE(block_comm, tp, 1e-9, 0, "runtime: a block's allreduces");
    loom_intraop_graph_free(g);
    /* the runtime's ILP answer is its cheapest configuration */
    double cheapest = 1e300;
    req.part = LOOM_INTRAOP_MODEL;
    CHECK(loom_intraop_graph_create(&g, &m, &cl, &req) == LOOM_OK, "%s", loom_last_error());
    if (!g) return;
    for (int c = 0; c < LOOM_INTRAOP_CONFIGS; c++) {
        loom_intraop_result priced;
        loom_intraop_runtime_choice(g, c, choice);
        loom_intraop_evaluate(g, choice, &priced);
        CHECK(priced.config == c, "configuration %d priced as %d", c, priced.config);
        if (priced.objective_s < cheapest) cheapest = priced.objective_s;
    }
    CHECK_CLOSE(r.objective_s, cheapest, 1e-9, 0, "runtime: the cheapest configuration");
    loom_intraop_graph_free(g);
    /* Megatron's sequence parallelism moves 5/4 of TP's bytes per block: on (1, 4) with free
     * latency, a block's collectives with SP over those without */
    loom_cluster bandwidth = test_cluster(1e10, 0);
    loom_intraop_request one = request_of(1, 4, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_BLOCK);
    CHECK(loom_intraop_graph_create(&g, &m, &bandwidth, &one) == LOOM_OK, "%s", loom_last_error());
    if (!g) return;
    CHECK(g->configs == (1u << LOOM_INTRAOP_CONFIG(0, 0) | 1u << LOOM_INTRAOP_CONFIG(0, 1)),
          "(1, 4): configurations %#x", g->configs);
    loom_intraop_runtime_choice(g, LOOM_INTRAOP_CONFIG(0, 0), choice);
    loom_intraop_evaluate(g, choice, &tp_only);
    loom_intraop_runtime_choice(g, LOOM_INTRAOP_CONFIG(0, 1), choice);
    loom_intraop_evaluate(g, choice, &sp);
    CHECK_CLOSE(sp.comm_s + sp.reshard_s, 1.25 * (tp_only.comm_s + tp_only.reshard_s), 1e-9, 0,
                "(1, 4): SP's traffic over TP's");
    CHECK(sp.compute_s < tp_only.compute_s, "(1, 4): SP's LayerNorms and adds on a quarter");
    loom_intraop_graph_free(g);
    /* SP needs a replica's tokens divided by tp: 62 tokens over tp 4 are not */
    one.seq_len = 62;
    CHECK(loom_intraop_graph_create(&g, &m, &bandwidth, &one) == LOOM_OK, "%s", loom_last_error());
    if (g) {
        CHECK(g->configs == 1u << LOOM_INTRAOP_CONFIG(0, 0),
              "(1, 4), 62 tokens: configurations %#x", g->configs);
        loom_intraop_graph_free(g);
    }
}

/* ZeRO's stages on c_fc (p = C x 4C + 4C parameters, tp 1) over dp 4, 3 micro-batches: state
 * and traffic by ZeRO's rules (RS reduce-scatter, AG all-gather, AR allreduce of 4p bytes). */
static void test_zero_stages(void) {
    loom_cluster cl = test_cluster(1e9, 1e-5);
    loom_gpt_config m = small_model();
    loom_intraop_request req = request_of(4, 1, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_BLOCK);
    req.micro_batches = 3;
    loom_intraop_graph *g = NULL;
    CHECK(loom_intraop_graph_create(&g, &m, &cl, &req) == LOOM_OK, "%s", loom_last_error());
    if (!g) return;
    double C = m.channels, p = C * 4 * C + 4 * C, bytes = 4 * p, n = 4, mb = 3;
    double ar = loom_cluster_collective_s(&cl, LOOM_COLLECTIVE_ALLREDUCE, 0, 4, bytes);
    double rs = loom_cluster_collective_s(&cl, LOOM_COLLECTIVE_REDUCE_SCATTER, 0, 4, bytes);
    double ag = loom_cluster_collective_s(&cl, LOOM_COLLECTIVE_ALLGATHER, 0, 4, bytes);
    const double sync[4] = {ar, rs + ag, mb * rs + ag, mb * (rs + 2 * ag)};
    const double state[4] = {16 * p, (8 + 8 / n) * p, (4 + 12 / n) * p, 16 * p / n};
    CHECK(g->configs == 0x0f, "(4, 1): configurations %#x", g->configs);
    for (int z = 0; z < 4; z++) {
        int choice[LOOM_INTRAOP_MAX_OPS];
        CHECK(loom_intraop_runtime_choice(g, LOOM_INTRAOP_CONFIG(z, 0), choice) == 1, "ZeRO-%d", z);
        const loom_intraop_strategy *s =
            &g->op[op_index(g, "c_fc")].strategy[choice[op_index(g, "c_fc")]];
        char what[64];
        snprintf(what, sizeof what, "ZeRO-%d: c_fc's traffic", z);
        CHECK_CLOSE(s->sync_s, sync[z], 1e-12, 0, what);
        snprintf(what, sizeof what, "ZeRO-%d: c_fc's state", z);
        CHECK_CLOSE((double)s->state_bytes, state[z], 0, 1, what);
    }
    loom_intraop_graph_free(g);
}

/* The runtime answer against the full one on several meshes, budgets and links: never better;
 * equal where the runtime follows the full answer; else each operator it cannot follow named. */
static void test_runtime_against_full(void) {
    loom_cluster cheap = test_cluster(1e11, 1e-6), slow = test_cluster(1e8, 1e-5);
    const struct {
        int dp, tp, micro_batch, micro_batches;
        loom_intraop_part part;
        const loom_cluster *cluster;
        double budget_share; /* of the runtime's state without ZeRO (budget_of) */
    } cases[] = {{2, 2, 1, 1, LOOM_INTRAOP_MODEL, &cheap, 0},
                 {2, 2, 2, 4, LOOM_INTRAOP_MODEL, &slow, 0},
                 {4, 1, 1, 2, LOOM_INTRAOP_MODEL, &cheap, 0.5},
                 {1, 4, 1, 1, LOOM_INTRAOP_MODEL, &slow, 1.02},
                 {2, 4, 1, 1, LOOM_INTRAOP_MODEL, &slow, 0.6},
                 {4, 2, 1, 8, LOOM_INTRAOP_MODEL, &cheap, 0.3},
                 {8, 1, 1, 1, LOOM_INTRAOP_MODEL, &slow, 0.2},
                 {1, 4, 1, 1, LOOM_INTRAOP_BLOCK, &slow, 1.02},
                 {2, 4, 1, 1, LOOM_INTRAOP_BLOCK, &slow, 0},
                 {2, 2, 2, 2, LOOM_INTRAOP_BLOCK, &cheap, 0.7}};
    loom_gpt_config m = small_model();
    int followed = 0, unfollowed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        loom_intraop_request req = request_of(cases[i].dp, cases[i].tp, cases[i].micro_batch,
                                              LOOM_INTRAOP_RUNTIME, cases[i].part);
        req.micro_batches = cases[i].micro_batches;
        loom_intraop_graph *rg = NULL, *fg = NULL;
        loom_intraop_result rt, full;
        CHECK(loom_intraop_graph_create(&rg, &m, cases[i].cluster, &req) == LOOM_OK, "%s",
              loom_last_error());
        if (!rg) continue;
        if (cases[i].budget_share > 0) req.memory_budget = budget_of(rg, cases[i].budget_share);
        rg->request.memory_budget = req.memory_budget;
        CHECK(loom_intraop_solve(rg, &rt) == LOOM_OK, "case %zu: %s", i, loom_last_error());
        req.space = LOOM_INTRAOP_FULL;
        CHECK(loom_intraop_graph_create(&fg, &m, cases[i].cluster, &req) == LOOM_OK, "%s",
              loom_last_error());
        if (fg && loom_intraop_solve(fg, &full) == LOOM_OK) {
            CHECK(full.objective_s <= rt.objective_s * (1 + 1e-9),
                  "case %zu: the runtime %g better than the full space %g", i, rt.objective_s,
                  full.objective_s);
            /* the runtime's answer, priced in the full space: the same */
            int choice[LOOM_INTRAOP_MAX_OPS];
            CHECK(loom_intraop_runtime_choice(fg, rt.config, choice) == 1, "case %zu", i);
            loom_intraop_result priced;
            loom_intraop_evaluate(fg, choice, &priced);
            CHECK_CLOSE(priced.objective_s, rt.objective_s, 1e-9, 0, "the runtime's in full");
            char why[LOOM_INTRAOP_MAX_OPS][LOOM_INTRAOP_WHY_CHARS];
            int config, n = loom_intraop_unfollowed(fg, full.choice, &config, why);
            CHECK((n == 0) == (config >= 0) && (full.config < 0 || n == 0),
                  "case %zu: %d unfollowed, config %d (exactly %d)", i, n, config, full.config);
            if (n == 0) {
                followed++;
                CHECK_CLOSE(full.objective_s, rt.objective_s, 1e-9, 0, "followed: equal");
            } else {
                unfollowed++;
                for (int v = 0; v < fg->ops; v++) {
                    int runs = fg->op[v].strategy[full.choice[v]].runtime != 0;
                    CHECK(!why[v][0] || !runs || strstr(why[v], "the rest runs"),
                          "case %zu: %s: %s", i, fg->op[v].name, why[v]);
                }
            }
        }
        loom_intraop_graph_free(rg);
        loom_intraop_graph_free(fg);
    }
    CHECK(followed > 0 && unfollowed > 0, "followed %d, unfollowed %d: both kinds expected",
          followed, unfollowed);
}

/* GPT-3 175B, 12 layers, on (2, 4) (docs/results.md): replicated over dp its state per device
 * is 83.7 GiB, over an 80 GiB device; the runtime space now shards it over dp and fits. */
static void test_gpt3_stage(void) {
    loom_gpt_config m;
    CHECK(loom_gpt_config_resolve("gpt3-175b", 12, 0, 0, 0, 0, "test", &m) == LOOM_OK, "%s",
          loom_last_error());
    loom_cluster cl = test_cluster(1e11, 1e-5);
    cl.memory_bytes = (int64_t)80 << 30;
    /* parameters per device, tensor-parallel over 4 (Megatron's shards; biases of the
     * row-parallel layers and the LayerNorms whole) */
    double C = m.channels, t = 4;
    double block = 2 * 2 * C + (C * 3 * C + 3 * C) / t + (C * C / t + C) + (C * 4 * C + 4 * C) / t +
                   (4 * C * C / t + C);
    double blocks = 12 * block;
    double held = (double)m.padded_vocab_size / t * C + (double)m.max_seq_len * C + 2 * C;
    double replicated = 16 * (blocks + held), zero3 = 16 * blocks / 2 + (8 + 8.0 / 2) * held;
    CHECK_CLOSE(replicated / 1073741824.0, 83.7, 0, 0.05, "175B stage: replicated state, GiB");
    loom_intraop_request req = request_of(2, 4, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_MODEL);
    req.seq_len = 2048, req.memory_budget = cl.memory_bytes;
    loom_intraop_graph *g = NULL;
    CHECK(loom_intraop_graph_create(&g, &m, &cl, &req) == LOOM_OK, "%s", loom_last_error());
    if (!g) return;
    loom_intraop_result r, full;
    CHECK(loom_intraop_solve(g, &r) == LOOM_OK, "175B stage, 80 GiB: %s", loom_last_error());
    CHECK(r.state_bytes <= cl.memory_bytes && r.config >= 0 &&
              LOOM_INTRAOP_CONFIG_ZERO(r.config) >= 1,
          "175B stage, 80 GiB: state %.1f GiB, configuration %d",
          (double)r.state_bytes / 1073741824.0, r.config);
    /* 45 GiB: only ZeRO-3 fits (ZeRO-2 needs 4 + 12/2 bytes per block parameter, 52.6 GiB) */
    g->request.memory_budget = (int64_t)45 << 30;
    CHECK(loom_intraop_solve(g, &r) == LOOM_OK, "175B stage, 45 GiB: %s", loom_last_error());
    CHECK(r.config >= 0 && LOOM_INTRAOP_CONFIG_ZERO(r.config) == 3, "45 GiB: configuration %d",
          r.config);
    CHECK_CLOSE((double)r.state_bytes, zero3, 1e-6, 0, "175B stage, ZeRO-3's state");
    CHECK(!strcmp(chosen(g, &r, "c_fc")->name, "column (n over tp), tokens over dp, ZeRO-3"),
          "45 GiB: c_fc \"%s\"", chosen(g, &r, "c_fc")->name);
    loom_intraop_graph_free(g);
    /* the full space at 80 GiB: no worse, and what the runtime cannot follow is named — the
     * weights split over both axes at once */
    req.space = LOOM_INTRAOP_FULL;
    CHECK(loom_intraop_graph_create(&g, &m, &cl, &req) == LOOM_OK, "%s", loom_last_error());
    if (!g) return;
    g->request.memory_budget = cl.memory_bytes;
    CHECK(loom_intraop_solve(g, &full) == LOOM_OK, "%s", loom_last_error());
    req.space = LOOM_INTRAOP_RUNTIME;
    loom_intraop_graph *rg = NULL;
    CHECK(loom_intraop_graph_create(&rg, &m, &cl, &req) == LOOM_OK && rg, "%s", loom_last_error());
    if (rg && loom_intraop_solve(rg, &r) == LOOM_OK) {
        CHECK(full.objective_s <= r.objective_s, "175B: full %g, runtime %g", full.objective_s,
              r.objective_s);
    }
    char why[LOOM_INTRAOP_MAX_OPS][LOOM_INTRAOP_WHY_CHARS];
    int config, n = loom_intraop_unfollowed(g, full.choice, &config, why);
    const loom_intraop_strategy *fc = chosen(g, &full, "c_fc");
    int both = (fc->split[0] == LOOM_INTRAOP_K || fc->split[0] == LOOM_INTRAOP_N) &&
               (fc->split[1] == LOOM_INTRAOP_K || fc->split[1] == LOOM_INTRAOP_N);
    CHECK(n > 0 && config < 0 && full.config < 0, "175B full: %d unfollowed", n);
    CHECK(!both || strstr(why[op_index(g, "c_fc")], "split over both axes at once"),
          "175B full: c_fc \"%s\": %s", fc->name, why[op_index(g, "c_fc")]);
    loom_intraop_graph_free(rg);
    loom_intraop_graph_free(g);
}

static void test_bad_requests(void) {
    loom_cluster cl = test_cluster(1e10, 1e-6);
    loom_gpt_config m = small_model();
    loom_intraop_graph *g = NULL;
    loom_intraop_request req = request_of(1, 3, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_MODEL);
    CHECK(loom_intraop_graph_create(&g, &m, &cl, &req) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "tp: expected a divisor of heads"),
          "tp 3: %s", loom_last_error());
    req = request_of(8, 8, 1, LOOM_INTRAOP_FULL, LOOM_INTRAOP_MODEL);
    CHECK(loom_intraop_graph_create(&g, &m, &cl, &req) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "64 devices"),
          "64 devices: %s", loom_last_error());
    req = request_of(1, 1, 1, LOOM_INTRAOP_FULL, LOOM_INTRAOP_MODEL);
    req.seq_len = 65;
    CHECK(loom_intraop_graph_create(&g, &m, &cl, &req) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "seq_len"),
          "seq_len: %s", loom_last_error());
    req.seq_len = 0, req.precision = LOOM_PRECISION_BF16;
    CHECK(loom_intraop_graph_create(&g, &m, &cl, &req) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "no bf16 peak"),
          "bf16: %s", loom_last_error());
    loom_intraop_space space;
    CHECK(loom_intraop_space_parse("fast", "x", "--search-space", &space) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "--search-space: expected \"runtime\" or \"full\""),
          "space: %s", loom_last_error());
    CHECK(g == NULL, "a refused graph is NULL");
}

/* A Llama's graph: GQA's narrower QKV, SwiGLU over gate and up, RMSNorm, the untied head (no
 * tie). The ILP's optimum equals the brute force over every combination (full and runtime
 * space), the graph's operators have the Llama's widths, a head split over tp must divide the
 * kv heads, and the runtime's Megatron layout is one of the runtime space's answers. */
static void test_llama(void) {
    loom_cluster cheap = test_cluster(1e11, 1e-6), slow = test_cluster(1e8, 1e-5);
    brute_model = small_llama(), brute_model_set = 1;
    check_brute_force("llama block (1, 2), cheap links", &cheap,
                      request_of(1, 2, 2, LOOM_INTRAOP_FULL, LOOM_INTRAOP_BLOCK), 0);
    check_brute_force("llama embedding and head (2, 2), slow links, budget", &slow,
                      request_of(2, 2, 1, LOOM_INTRAOP_FULL, LOOM_INTRAOP_EMBEDDING_HEAD), 0.3);
    check_brute_force("llama runtime, model (2, 2), slow links, budget", &slow,
                      request_of(2, 2, 2, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_MODEL), 0.7);
    brute_model_set = 0;
    loom_gpt_config m = small_llama();
    loom_intraop_request req = request_of(1, 2, 2, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_MODEL);
    loom_intraop_graph *g = NULL;
    CHECK(loom_intraop_graph_create(&g, &m, &cheap, &req) == LOOM_OK, "llama graph: %s",
          loom_last_error());
    if (!g) return;
    int qkv = op_index(g, "c_attn"), act = op_index(g, "swiglu"), down = op_index(g, "mlp_c_proj");
    CHECK(qkv >= 0 && act >= 0 && down >= 0, "llama operators");
    int tied = 0;
    for (int e = 0; e < g->edges; e++) tied += g->edge[e].tied;
    CHECK(tied == 0, "an untied head has no tie edge, got %d", tied);
    /* QKV's output (N, (4 + 2 x 2) x 16 = 128) feeds attention */
    int found = 0;
    for (int e = 0; e < g->edges; e++) {
        if (g->edge[e].from == qkv && g->edge[e].to == op_index(g, "attention"))
            found = g->edge[e].cols == 128;
    }
    CHECK(found, "QKV -> attention carries (NH + 2 KV) hs = 128 columns");
    loom_intraop_graph_free(g);
    /* tp 4 over 2 kv heads: the runtime refuses it (the model's rule) */
    req = request_of(1, 4, 2, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_MODEL);
    CHECK(loom_intraop_graph_create(&g, &m, &cheap, &req) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "kv_heads"),
          "tp 4 over 2 kv heads refused: %s", loom_last_error());
}

int main(void) {
    double t0 = loom_now();
    test_llama();
    test_megatron();
    test_trivial();
    test_brute_force();
    test_brute_force_runtime();
    test_runtime_space();
    test_zero_stages();
    test_runtime_against_full();
    test_gpt3_stage();
    test_bad_requests();
    printf("test_intraop: %.2f s\n", loom_now() - t0);
    return check_finish();
}
