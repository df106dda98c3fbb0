/*
 * test_intraop.c — Alpa's intra-operator ILP (loom/intraop.h): on a (1, tp) mesh with expensive
 * links and weights that must be sharded, the full space recovers Megatron's column/row pattern
 * and its traffic (two allreduces per block forward, two backward); a (1, 1) mesh leaves
 * everything whole and a (dp, 1) mesh with cheap links is plain data parallelism; a tight
 * memory budget makes the ILP shard weights, and one below the least possible state is refused;
 * the ILP's optimum equals a brute-force enumeration of every strategy combination scored by
 * the same costs (several meshes, link speeds and budgets); the runtime space is exactly the
 * runtime's layout, its tensor-parallel traffic the model's cost facts'; bad requests are
 * refused by name.
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
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) c.links[l] = (loom_link){bandwidth, latency_s};
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
            int sharded = 0;
            for (int v = 0; v < g->ops; v++) {
                loom_intraop_split s = g->op[v].strategy[r.choice[v]].split[0];
                sharded += s == LOOM_INTRAOP_K || s == LOOM_INTRAOP_N;
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
    long leaves;
} enumeration;

/* Every combination, op by op; each edge's cost is added once both its ends are chosen. */
static void enumerate(enumeration *en, int v, double cost, int64_t state) {
    const loom_intraop_graph *g = en->g;
    if (v == g->ops) {
        en->leaves++;
        if ((en->budget == 0 || state <= en->budget) && cost < en->best) en->best = cost;
        return;
    }
    const loom_intraop_op *o = &g->op[v];
    for (int i = 0; i < o->strategies; i++) {
        const loom_intraop_strategy *s = &o->strategy[i];
        en->choice[v] = i;
        double c = cost + o->count * (s->compute_s + s->comm_s + s->sync_s);
        for (int k = 0; k < g->edges; k++) {
            const loom_intraop_edge *e = &g->edge[k];
            int last = e->from > e->to ? e->from : e->to;
            if (last != v) continue;
            c += e->count *
                 e->reshard_s[en->choice[e->from] * g->op[e->to].strategies + en->choice[e->to]];
        }
        enumerate(en, v + 1, c, state + (int64_t)o->count * s->state_bytes);
    }
}

static void check_brute_force(const char *what, const loom_cluster *cl, loom_intraop_request req,
                              double budget_share) {
    loom_gpt_config m = small_model();
    loom_intraop_graph *g = NULL;
    CHECK(loom_intraop_graph_create(&g, &m, cl, &req) == LOOM_OK, "%s: %s", what,
          loom_last_error());
    if (!g) return;
    if (budget_share > 0) { /* a share of the largest state: binding */
        loom_intraop_result unconstrained;
        CHECK(loom_intraop_solve(g, &unconstrained) == LOOM_OK, "%s", what);
        g->request.memory_budget = (int64_t)(budget_share * (double)unconstrained.state_bytes);
    }
    enumeration en = {g, {0}, 1e300, g->request.memory_budget, 0};
    enumerate(&en, 0, 0.0, 0);
    loom_intraop_result r;
    loom_status st = loom_intraop_solve(g, &r);
    CHECK(st == LOOM_OK, "%s: %s", what, loom_last_error());
    CHECK(en.leaves > 1000, "%s: only %ld combinations", what, en.leaves);
    CHECK_CLOSE(r.objective_s, en.best, 1e-9, 0, what);
    if (g->request.memory_budget > 0) {
        CHECK(r.state_bytes <= g->request.memory_budget, "%s: over the budget", what);
    }
    loom_intraop_graph_free(g);
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

/* ---- the runtime space ------------------------------------------------------------------- */

static void test_runtime_space(void) {
    loom_cluster cl = test_cluster(1e10, 1e-6);
    loom_intraop_request req = request_of(2, 2, 1, LOOM_INTRAOP_RUNTIME, LOOM_INTRAOP_MODEL);
    loom_intraop_result r;
    loom_intraop_graph *g = solve(&cl, &req, &r);
    if (!g) return;
    static const struct {
        const char *op;
        loom_intraop_split tp;
    } runtime[] = {{"input", LOOM_INTRAOP_REPLICATE}, {"ln_1", LOOM_INTRAOP_REPLICATE},
                   {"c_attn", LOOM_INTRAOP_N},        {"attention", LOOM_INTRAOP_N},
                   {"attn_c_proj", LOOM_INTRAOP_K},   {"add_1", LOOM_INTRAOP_REPLICATE},
                   {"ln_2", LOOM_INTRAOP_REPLICATE},  {"c_fc", LOOM_INTRAOP_N},
                   {"gelu", LOOM_INTRAOP_N},          {"mlp_c_proj", LOOM_INTRAOP_K},
                   {"add_2", LOOM_INTRAOP_REPLICATE}, {"embedding", LOOM_INTRAOP_K},
                   {"ln_f", LOOM_INTRAOP_REPLICATE},  {"lm_head", LOOM_INTRAOP_N},
                   {"cross_entropy", LOOM_INTRAOP_N}};
    int n = (int)(sizeof runtime / sizeof runtime[0]);
    CHECK(g->ops == n, "runtime: %d operators, expected %d", g->ops, n);
    for (int i = 0; i < n; i++) {
        int v = op_index(g, runtime[i].op);
        const loom_intraop_strategy *s = &g->op[v].strategy[r.choice[v]];
        CHECK(g->op[v].strategies == 1 && s->runtime, "runtime: %s offers %d", runtime[i].op,
              g->op[v].strategies);
        CHECK(s->split[0] == LOOM_INTRAOP_TOKENS && s->split[1] == runtime[i].tp &&
                  (s->split[1] != LOOM_INTRAOP_K || s->reduce[1] == LOOM_INTRAOP_ALLREDUCE),
              "runtime: %s is \"%s\"", runtime[i].op, s->name);
    }
    CHECK(!strcmp(chosen(g, &r, "c_attn")->name, "column (n over tp), tokens over dp"),
          "runtime: c_attn named \"%s\"", chosen(g, &r, "c_attn")->name);
    CHECK(r.reshard_s == 0, "runtime: the runtime reshards nothing, got %g s", r.reshard_s);
    /* the block's tensor-parallel traffic is the cost facts' */
    loom_gpt_config m = small_model();
    loom_gpt_part_cost facts;
    CHECK(loom_gpt_cost_block(&m, 2, 1, 64, &facts) == LOOM_OK, "cost facts");
    double per_call = (double)facts.tp_bytes_fwd / (double)facts.tp_allreduces_fwd;
    double tp = (double)(facts.tp_allreduces_fwd + facts.tp_allreduces_bwd) *
                loom_cluster_collective_s(&cl, LOOM_COLLECTIVE_ALLREDUCE, 0, 2, per_call);
    double block_comm = 0;
    for (int v = 0; v < op_index(g, "embedding"); v++)
        block_comm += g->op[v].strategy[r.choice[v]].comm_s;
    CHECK_CLOSE(block_comm, tp, 1e-9, 0, "runtime: a block's allreduces");
    /* the same strategies in the full space, priced alike */
    loom_intraop_graph *full = NULL;
    req.space = LOOM_INTRAOP_FULL;
    CHECK(loom_intraop_graph_create(&full, &m, &cl, &req) == LOOM_OK, "full: %s",
          loom_last_error());
    if (full) {
        int choice[LOOM_INTRAOP_MAX_OPS];
        CHECK(loom_intraop_runtime_choice(full, choice) == 1, "full: the runtime's strategies");
        loom_intraop_result priced, best;
        loom_intraop_evaluate(full, choice, &priced);
        CHECK_CLOSE(priced.objective_s, r.objective_s, 1e-12, 0, "full: the runtime's choice");
        CHECK(loom_intraop_solve(full, &best) == LOOM_OK, "full: %s", loom_last_error());
        CHECK(best.objective_s <= r.objective_s * (1 + 1e-12), "full: worse than the runtime");
        CHECK(best.variables > full->ops && best.constraints > full->ops && best.nonzeros > 0,
              "full: ILP size %d x %d", best.variables, best.constraints);
        loom_intraop_graph_free(full);
    }
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

int main(void) {
    double t0 = loom_now();
    test_megatron();
    test_trivial();
    test_brute_force();
    test_runtime_space();
    test_bad_requests();
    printf("test_intraop: %.2f s\n", loom_now() - t0);
    return check_finish();
}
