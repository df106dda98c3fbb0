/*
 * plan_cmd.c — `loom plan`: writes a plan file for a model and a (dp, tp, pp) mesh with
 * contiguous, even (or --stage-layers) pipeline stages, or checks an existing plan with
 * --check FILE, optionally against a world size (--ranks). Prints the plan's summary and the
 * rank layout. --check-cluster FILE reads and checks a cluster description (loom/cluster.h) and
 * says it is ok or why not, for now the only command that reads one (the fuzzer's way in until
 * the planner takes --cluster). No MPI here: planning is for one process.
 *
 * The compression flags are `loom train`'s (cli.h, CLI_COMPRESSION_OPTS).
 *
 * Not here: choosing the layout by cost (that is the planner's job; this writes the layout it
 * is told).
 */
#include "cli/cli.h"
#include "loom/cluster.h"
#include "loom/planner.h"
#include "loom/plan.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cmd_plan(int argc, char **argv);

enum { PLAN_PATH_MAX = 1024 };

typedef struct {
    char model[32];
    int layers, heads, d_model, context, vocab;
    char arch[16];
    int kv_heads, ffn_dim;
    char tie_embeddings[8];
    double rope_theta, norm_eps;
    loom_layout_flags layout;
    int ranks;
    char out[PLAN_PATH_MAX];
    char check[PLAN_PATH_MAX];
    char check_cluster[PLAN_PATH_MAX];
    char predict[PLAN_PATH_MAX];
    char cluster[PLAN_PATH_MAX];
    char precision[16];
    int seq_len, devices;
    int intraop;
    char search_space[16];
    char allow_compression[16];
    char trace[PLAN_PATH_MAX];
    int islands_auto;    /* --islands auto (taken out of argv before parsing) */
    int max_inner_steps; /* its bound on H */
} plan_args;

/* The model of the flags: a preset with the overrides given. */
static loom_status resolve_model(const plan_args *args, loom_gpt_config *model) {
    loom_gpt_overrides o = {.preset = args->model,
                            .arch = args->arch,
                            .layers = args->layers,
                            .heads = args->heads,
                            .d_model = args->d_model,
                            .context = args->context,
                            .vocab = args->vocab,
                            .kv_heads = args->kv_heads,
                            .ffn_dim = args->ffn_dim,
                            .rope_theta = args->rope_theta,
                            .norm_eps = args->norm_eps};
    loom_status st =
        loom_gpt_tie_parse(args->tie_embeddings, "model configuration", &o.tie_embeddings);
    return st == LOOM_OK ? loom_gpt_config_resolve_with(&o, "model configuration", model) : st;
}

#define POPT(...)                     CLI_OPT(plan_args, __VA_ARGS__)
#define PLAY(flag, kind, field, help) CLI_OPT(plan_args, flag, kind, layout.field, help)

static const cli_opt plan_opts[] = {
    CLI_GROUP("model"),
    CLI_MODEL_OPTS(POPT),
    CLI_GROUP("layout"),
    CLI_LAYOUT_OPTS(PLAY),
    PLAY("--dp", OPT_INT, data_parallel, "same as --data-parallel"),
    PLAY("--tp", OPT_INT, tensor_parallel, "same as --tensor-parallel"),
    PLAY("--pp", OPT_INT, pipeline_parallel, "same as --pipeline-parallel"),
    POPT("--ranks", OPT_INT, ranks,
         "check that dp x tp x pp equals this world size (default: no check)"),
    CLI_GROUP("compression"),
    CLI_COMPRESSION_OPTS(PLAY),
    CLI_GROUP("checks, search and prediction"),
    POPT("--check", OPT_STRING, check,
         "validate this plan file instead of writing one (default: write one)"),
    POPT("--check-cluster", OPT_STRING, check_cluster,
         "read and check this cluster description (e.g. clusters/dgx-a100.json): prints "
         "\"FILE: ok (NAME, N devices per node, max M nodes)\", or the problem and exits 2 "
         "(default: none)"),
    POPT("--cluster", OPT_STRING, cluster,
         "cluster description (clusters/*.json, or loom profile's): without --predict, search "
         "every layout of --devices for the fastest that fits (default: none, no search)"),
    POPT("--devices", OPT_INT, devices, "search: devices to use (default: all of the cluster's)"),
    POPT("--allow-compression", OPT_STRING, allow_compression,
         "search: compressors it may choose where they shorten the step: none (default), dp "
         "(PowerSGD rank 4 on the data-parallel gradients), pp (low-rank rank 8 on the "
         "pipeline's backward sends) or all"),
    POPT("--max-inner-steps", OPT_INT, max_inner_steps,
         "search with --islands auto: the most inner steps between outer syncs it may choose "
         "(default 500, DiLoCo's)"),
    POPT("--predict", OPT_STRING, predict,
         "predict this plan's step time, memory and traffic on --cluster (with --out: write it "
         "back with \"predicted\" filled in; default: none)"),
    POPT("--precision", OPT_STRING, precision,
         "search, --predict, --intraop: fp32, bf16 or fp16 (default: the cluster description's "
         "training precision)"),
    POPT("--seq-len", OPT_INT, seq_len,
         "search, --predict, --intraop: tokens per sequence (default: the model's context)"),
    POPT("--intraop", OPT_FLAG, intraop,
         "Alpa's intra-operator ILP for --dp x --tp on --cluster: each operator's sharding "
         "strategy, its costs, the ILP's size and solve time"),
    POPT("--search-space", OPT_STRING, search_space,
         "--intraop: runtime (default: what loom executes) or full (every strategy, simulated)"),
    CLI_GROUP("output"),
    POPT("--out", OPT_STRING, out, "plan file to write (default: none, give one)"),
    POPT("--trace", OPT_STRING, trace,
         "search, --predict: the simulated step as a Chrome trace (the format of loom train "
         "--trace), to open beside a measured one (default: none)"),
};
#define NPLAN ((int)(sizeof plan_opts / sizeof plan_opts[0]))

static const char *plan_usage =
    "usage: loom plan [--model NAME ...] --dp N --tp N --pp N [options] --out plan.json\n"
    "       loom plan --check plan.json [--ranks N]\n"
    "       loom plan --check-cluster cluster.json\n"
    "       loom plan --predict plan.json --cluster cluster.json [--precision P] [--seq-len T] "
    "[--zero N] [--out predicted.json]\n"
    "       loom plan --model M --cluster cluster.json [--devices N] --global-batch-size G "
    "[--seq-len T] [--precision P] --out plan.json\n"
    "       loom plan --model M --cluster cluster-with-islands.json --islands auto "
    "--global-batch-size G [--max-inner-steps H] [--outer-compression int8] --out plan.json\n"
    "       loom plan --intraop --model M --cluster cluster.json --dp D --tp T "
    "[--micro-batch-size B] [--seq-len T] [--precision P] [--search-space runtime|full]";

/* Whether `arg` is `flag`, alone or as "flag=value". */
static int is_flag(const char *arg, const char *flag) {
    size_t len = strlen(flag);
    return strncmp(arg, flag, len) == 0 && (arg[len] == '\0' || arg[len] == '=');
}

/* With a check, only the flags in `allowed` (n of them) may come along: anything else would be
 * silently ignored. */
static loom_status check_mode_flags(int argc, char **argv, const char *mode,
                                    const char *const *allowed, int n, const char *why) {
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) continue; /* a value */
        int ok = 0;
        for (int j = 0; j < n && !ok; j++) ok = is_flag(arg, allowed[j]);
        if (ok) continue;
        char list[512] = "";
        size_t used = 0;
        for (int j = 1; j < n && used < sizeof list; j++) {
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                     j == 1       ? ""
                                     : j + 1 == n ? " or "
                                                  : ", ",
                                     allowed[j]);
        }
        return loom_fail(LOOM_ERR_INPUT, "%s: expected %s%s%s, got %.*s (%s)", mode,
                         n > 1 ? "only " : "no other option with it", n > 1 ? list : "",
                         n > 1 ? " with it" : "", (int)strcspn(arg, "="), arg, why);
    }
    return LOOM_OK;
}

static int run_check(const plan_args *args, int argc, char **argv) {
    static const char *const allowed[] = {"--check", "--ranks"};
    loom_status st =
        check_mode_flags(argc, argv, "--check", allowed, 2, "the plan file holds the layout");
    if (st == LOOM_OK && args->ranks < 0) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "--ranks: expected a positive world size (0 = no check), got %d",
                       args->ranks);
    }
    if (st != LOOM_OK) return cli_fail(st);
    loom_plan plan;
    st = loom_plan_read(args->check, &plan);
    if (st == LOOM_OK && args->ranks > 0) st = loom_plan_check(&plan, args->check, args->ranks);
    if (st != LOOM_OK) {
        loom_plan_free(&plan);
        return cli_fail(st);
    }
    loom_plan_print(&plan, stdout);
    printf("\n%s: ok (%lld ranks)\n", args->check, (long long)loom_plan_job_ranks(&plan));
    loom_plan_free(&plan);
    return 0;
}

static int run_check_cluster(const plan_args *args, int argc, char **argv) {
    static const char *const allowed[] = {"--check-cluster"};
    loom_status st = check_mode_flags(argc, argv, "--check-cluster", allowed, 1,
                                      "it only reads the description");
    if (st != LOOM_OK) return cli_fail(st);
    loom_cluster cluster;
    st = loom_cluster_read(args->check_cluster, &cluster);
    if (st != LOOM_OK) return cli_fail(st);
    printf("%s: ok (%s, %d devices per node, max %d nodes)\n", args->check_cluster, cluster.name,
           cluster.devices_per_node, cluster.max_nodes);
    return 0;
}

/* Fills a plan's predicted keys from a prediction and each rank's memory. */
loom_status cli_plan_fill_predicted(loom_plan *plan, const loom_prediction *pr, int seq_len) {
    int ranks = plan->dp * plan->tp * plan->pp;
    free(plan->predicted_peak_bytes);
    plan->predicted_peak_bytes = loom_calloc((size_t)ranks, sizeof(int64_t), "predictions");
    plan->num_predicted_peak = plan->predicted_peak_bytes ? ranks : 0;
    if (!plan->predicted_peak_bytes) return LOOM_ERR_NOMEM;
    loom_status st = LOOM_OK;
    for (int r = 0; r < ranks && st == LOOM_OK; r++) {
        loom_rank_memory mem;
        st = loom_plan_rank_memory(plan, loom_plan_rank_coords(plan, r).pp_rank, seq_len, &mem);
        plan->predicted_peak_bytes[r] = mem.total;
    }
    plan->predicted_step_s = pr->step_s, plan->predicted_tokens_per_s = pr->tokens_per_s;
    plan->predicted_seq_len = seq_len;
    return st;
}

/* The layers of each virtual stage: "even" when the plan splits as evenly as it can, else the
 * counts ("11,12,...,9" when they do not fit in cap). */
static const char *split_text(const loom_plan *p, char *text, size_t cap) {
    int S = p->num_stages, L = p->model.num_layers, even = 1;
    for (int s = 0; s < S; s++) {
        even &= p->stages[s].end_layer - p->stages[s].first_layer == L / S + (s < L % S ? 1 : 0);
    }
    if (even) return "even";
    size_t used = 0;
    for (int s = 0; s < S; s++) {
        char one[16];
        int n = snprintf(one, sizeof one, "%s%d", s ? "," : "",
                         p->stages[s].end_layer - p->stages[s].first_layer);
        if (used + (size_t)n + 8 >= cap && s < S - 1) { /* room for ",...,N" */
            const loom_plan_stage *last = &p->stages[S - 1];
            snprintf(text + used, cap - used, ",...,%d", last->end_layer - last->first_layer);
            return text;
        }
        used += (size_t)snprintf(text + used, cap - used, "%s", one);
    }
    return text;
}

/* "dp powersgd4", "pp lowrank8 slack links 1,2": a compressor as the candidates' table shows
 * it (its policy where not "all", its stages or links where not all of them); "" for none. */
static void compressor_text(const char *where, const loom_plan_compressor *c, const char *list,
                            char *text, size_t cap) {
    text[0] = '\0';
    if (c->method == LOOM_COMPRESS_NONE) return;
    size_t used = (size_t)snprintf(text, cap, "%s %s", where, loom_compress_method_name(c->method));
    if (c->rank > 0 && used < cap) used += (size_t)snprintf(text + used, cap - used, "%d", c->rank);
    if (c->policy != LOOM_PP_POLICY_ALL && used < cap)
        used += (size_t)snprintf(text + used, cap - used, " %s", loom_pp_policy_name(c->policy));
    for (int i = 0; i < c->num_stages && used < cap; i++)
        used += (size_t)snprintf(text + used, cap - used, "%s%s%d", i ? "," : " ", i ? "" : list,
                                 c->stages[i]);
}

loom_status cli_allow_compression(const char *word, int *bits) {
    static const char *const allowed[] = {"none", "dp", "pp", "all"};
    *bits = 0;
    if (!word[0]) return LOOM_OK;
    for (int i = 0; i < 4; i++) {
        if (!strcmp(word, allowed[i])) {
            *bits = i; /* the LOOM_ALLOW_* bits, in that order */
            return LOOM_OK;
        }
    }
    return loom_fail(LOOM_ERR_INPUT,
                     "--allow-compression: expected none, dp, pp or all, got \"%s\"", word);
}

void cli_print_candidates(const loom_plan_candidate *best, int found) {
    printf("  #  dp  tp  pp  sp   micro  m     schedule     recompute  zero  step s     tokens/s  "
           "bubble  peak GiB  compression                           layers per stage\n");
    for (int i = 0; i < found; i++) {
        const loom_plan *p = &best[i].plan;
        const loom_prediction *pr = &best[i].prediction;
        char split[64], compress[100], recompute[48];
        int recomputing = 0, selective = 0;
        for (int s = 0; s < p->num_stages; s++) {
            recomputing += loom_recompute_full(p->stages[s].recompute);
            selective += p->stages[s].recompute == LOOM_RECOMPUTE_SELECTIVE;
        }
        snprintf(recompute, sizeof recompute, "%s", recomputing == 0 ? "no" : "yes");
        if (recomputing > 0 && recomputing < p->num_stages)
            snprintf(recompute, sizeof recompute, "%d of %d", recomputing, p->num_stages);
        if (selective == p->num_stages) snprintf(recompute, sizeof recompute, "selective");
        if (selective > 0 && selective < p->num_stages)
            snprintf(recompute, sizeof recompute, "%d+%ds of %d", recomputing, selective,
                     p->num_stages);
        char dp_text[48], pp_text[48];
        compressor_text("dp", &p->dp_compression, "stages ", dp_text, sizeof dp_text);
        compressor_text("pp", &p->pp_compression, "links ", pp_text, sizeof pp_text);
        snprintf(compress, sizeof compress, "%s%s%s", dp_text, dp_text[0] && pp_text[0] ? ", " : "",
                 pp_text);
        printf(
            "  %d  %2d  %2d  %2d  %-3s  %5d  %-5d %-12s %-10s %-4d  %9.4f  %9.0f  %5.1f%%  %8.2f  "
            "%-37s %s\n",
            i + 1, p->dp, p->tp, p->pp, p->sequence_parallel ? "yes" : "no", p->micro_batch,
            loom_plan_num_micro_batches(p), loom_schedule_kind_name(p->schedule), recompute,
            p->zero, pr->step_s, pr->tokens_per_s, 100 * pr->bubble,
            (double)pr->peak_bytes / 1073741824.0, compress[0] ? compress : "-",
            split_text(p, split, sizeof split));
    }
}

/* --trace: the plan's simulated step as a Chrome trace. */
static loom_status write_trace(const plan_args *args, const loom_plan *plan,
                               const loom_cluster *cluster, loom_precision precision, int seq_len) {
    loom_prediction *pr = loom_calloc(1, sizeof *pr, "prediction");
    if (!pr) return LOOM_ERR_NOMEM;
    loom_status st = cli_prepare_out(args->trace, "a trace file");
    if (st == LOOM_OK)
        st = loom_plan_predict_trace(plan, cluster, precision, seq_len, args->trace, pr);
    if (st == LOOM_OK) printf("wrote %s (its simulated step)\n", args->trace);
    free(pr);
    return st;
}

/* --search-space full with the search: the intra-op ILP over the whole model on the chosen
 * layout's (dp, tp) mesh, in both spaces — what a runtime that executed every strategy would
 * gain, in simulation only (the plan written is the runtime's). */
static loom_status report_full_space(const plan_args *args, const loom_gpt_config *model,
                                     const loom_cluster *cluster, const loom_plan *plan,
                                     loom_precision precision, int seq_len) {
    loom_intraop_space space;
    loom_status st =
        loom_intraop_space_parse(args->search_space, "loom plan", "--search-space", &space);
    if (st != LOOM_OK || space != LOOM_INTRAOP_FULL) return st;
    loom_intraop_request req = {.dp = plan->dp,
                                .tp = plan->tp,
                                .micro_batch = plan->micro_batch,
                                .micro_batches = loom_plan_num_micro_batches(plan),
                                .seq_len = seq_len,
                                .precision = precision,
                                .part = LOOM_INTRAOP_MODEL,
                                /* the model's state is spread over the pipeline's stages */
                                .memory_budget = cluster->memory_bytes * plan->pp};
    loom_intraop_result result[2];
    for (int k = 0; k < 2 && st == LOOM_OK; k++) {
        loom_intraop_graph *graph = NULL;
        req.space = k ? LOOM_INTRAOP_FULL : LOOM_INTRAOP_RUNTIME;
        st = loom_intraop_graph_create(&graph, model, cluster, &req);
        if (st == LOOM_OK) st = loom_intraop_solve(graph, &result[k]);
        loom_intraop_graph_free(graph);
    }
    if (st == LOOM_ERR_NOMEM) return st;
    if (st != LOOM_OK) {
        printf("intra-op ILP on the chosen mesh (dp %d, tp %d): %s\n", plan->dp, plan->tp,
               loom_last_error());
        loom_clear_error();
        return LOOM_OK;
    }
    printf("intra-op ILP on the chosen mesh (dp %d, tp %d), whole model: the runtime's "
           "strategies %.3f ms of operator time per step, every strategy %.3f ms: %.1f %% less "
           "(simulation only: loom executes the runtime's; ILP %d variables, %d constraints, "
           "solved in %.1f ms)\n",
           plan->dp, plan->tp, result[0].objective_s * 1e3, result[1].objective_s * 1e3,
           100.0 * (result[0].objective_s - result[1].objective_s) / result[0].objective_s,
           result[1].variables, result[1].constraints, result[1].solve_s * 1e3);
    return LOOM_OK;
}

/* Without --precision, `loom plan` plans in the cluster description's training precision, and
 * says so. */
static void default_precision(const plan_args *args, const loom_cluster *cluster,
                              loom_precision *precision) {
    if (args->precision[0]) return;
    *precision = cluster->training_precision;
    printf("precision %s (the cluster description's training precision)\n",
           loom_precision_name(*precision));
}

/* The other choice of K: one job (K = 1) over every device, the slow link in its rings. The
 * cluster description has one inter-node link, so every inter-node link is priced as the slower
 * of it and the island link (a ring across the islands runs at its slowest link; a layout that
 * keeps its tensor and pipeline groups inside an island is priced pessimistically). When that
 * plan's step is no longer than the islands' (the slow link barely slows it), it replaces them:
 * one job trains exactly, islands change the optimisation. */
static loom_status one_job_instead(const loom_gpt_config *model, const loom_cluster *cluster,
                                   loom_search_request req, loom_plan *plan, loom_prediction *pr) {
    loom_cluster flat = *cluster;
    flat.island_nodes = 0;
    loom_link *inter = &flat.links[LOOM_LINK_INTER_NODE];
    const loom_link *slow = &cluster->island_link;
    inter->bandwidth = fmin(inter->bandwidth, slow->bandwidth);
    inter->latency_s = fmax(inter->latency_s, slow->latency_s);
    inter->call_latency_s = fmax(inter->call_latency_s, slow->call_latency_s);
    /* measured inter-node collectives (loom profile's) were measured on the fast link */
    int kept = 0;
    for (int i = 0; i < flat.num_collectives; i++) {
        if (flat.collectives[i].link != LOOM_LINK_INTER_NODE)
            flat.collectives[kept++] = flat.collectives[i];
    }
    flat.num_collectives = kept;
    req.keep = 1;
    loom_plan_candidate one;
    int found = 0, tried = 0, fitting = 0, pruned = 0;
    loom_status st = loom_plan_search(model, &flat, &req, &one, &found, &tried, &fitting, &pruned);
    if (st != LOOM_OK || !found) { /* nothing of every device fits: the islands stand */
        printf("K = 1 (one job over the slow link): no layout of %d devices fits (%s); islands\n",
               req.devices, st != LOOM_OK ? loom_last_error() : "none found");
        loom_clear_error();
        return LOOM_OK;
    }
    double t = one.prediction.step_s;
    if (t > pr->step_s) {
        printf("K = 1 (one job over the slow link): %.4f s a step, %.1fx the islands'; islands\n",
               t, t / pr->step_s);
        loom_plan_free(&one.plan);
        return LOOM_OK;
    }
    printf("K = 1 (one job over the slow link): %.4f s a step, no longer than the islands' %.4f s: "
           "one job, which trains exactly (islands change the optimisation; the outer settings "
           "do not apply); its layout:\n",
           t, pr->step_s);
    cli_print_candidates(&one, 1);
    loom_plan_free(plan);
    *plan = one.plan;
    *pr = one.prediction;
    return LOOM_OK;
}

/* `loom plan --cluster C` without --predict: the search, a table of the best layouts, the best
 * written with its prediction. */
/* --islands auto: the cluster's islands (its island level) each run the layout the search finds
 * for an island's devices and share of the global batch; then the outer syncs' H, fragments and
 * overlap (loom_plan_choose_islands) for the slow link between them. */
static loom_status plan_islands(const plan_args *args, const loom_gpt_config *model,
                                const loom_cluster *cluster, loom_search_request req,
                                loom_plan *plan, loom_prediction *pr) {
    const loom_layout_flags *f = &args->layout;
    const char *chosen = f->inner_steps != LOOM_PLAN_DEFAULT_INNER_STEPS ? "--inner-steps"
                         : f->outer_fragments != 1                       ? "--outer-fragments"
                         : f->outer_overlap_steps                        ? "--outer-overlap-steps"
                                                                         : NULL;
    if (chosen) {
        return loom_fail(LOOM_ERR_INPUT, "--islands auto: %s is what it chooses; drop %s", chosen,
                         chosen);
    }
    int per = cluster->island_nodes * cluster->devices_per_node;
    if (cluster->island_nodes <= 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--islands auto: %s has no island level; describe it with a top-level "
                         "\"islands\": {\"nodes\": N, \"link\": {...}} (the nodes that share fast "
                         "links, and the slow link between those groups)",
                         args->cluster);
    }
    if (req.devices % per != 0 || req.devices / per < 2) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--islands auto: expected --devices a multiple of an island's %d devices "
                         "(%d nodes of %d), 2 islands at least, got %d",
                         per, cluster->island_nodes, cluster->devices_per_node, req.devices);
    }
    int K = req.devices / per;
    if (req.global_batch % K != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--global-batch-size: expected a multiple of the %d islands (each trains "
                         "its share), got %d",
                         K, req.global_batch);
    }
    loom_search_request whole = req;
    loom_cluster island = *cluster;
    island.max_nodes = cluster->island_nodes;
    req.devices = per, req.global_batch /= K, req.keep = 1;
    loom_plan_candidate best;
    int found = 0, tried = 0, fitting = 0, pruned = 0;
    double t0 = loom_now();
    loom_status st =
        loom_plan_search(model, &island, &req, &best, &found, &tried, &fitting, &pruned);
    if (st != LOOM_OK) return st;
    printf("%d islands of %d devices (%d nodes of %d) on %s: searched %d layouts of an island "
           "(global batch %d each) in %.2f s; the fastest:\n",
           K, per, cluster->island_nodes, cluster->devices_per_node, cluster->name, tried + pruned,
           req.global_batch, loom_now() - t0);
    cli_print_candidates(&best, found);
    *plan = best.plan;
    plan->global_batch = req.global_batch * K; /* the job's: every island's share */
    loom_layout_flags with = *f;
    with.islands = K;
    st = loom_plan_islands_from_flags(&with, &plan->islands);
    loom_islands_choice choice;
    int bound = args->max_inner_steps ? args->max_inner_steps : 500;
    if (st == LOOM_OK) {
        st = loom_plan_choose_islands(plan, cluster, best.prediction.step_s, bound, &choice);
    }
    if (st == LOOM_OK) st = loom_plan_check(plan, "plan", 0);
    if (st == LOOM_OK) st = loom_plan_predict(plan, cluster, req.precision, req.seq_len, pr);
    if (st != LOOM_OK) return st;
    const loom_link *l = &cluster->island_link;
    printf("\nislands over the %.3g MB/s link (a device's share, latency %.3g s): H = %d inner "
           "steps, %d fragment%s, each sync applied %d step%s after it leaves; the largest "
           "fragment's sync %.4f s against an inner step of %.4f s: %s; a step %.4f s, %.3g MB "
           "between islands a step\n",
           l->bandwidth / 1e6, l->latency_s, choice.inner_steps, choice.fragments,
           choice.fragments == 1 ? "" : "s", choice.overlap_steps,
           choice.overlap_steps == 1 ? "" : "s", choice.cost.sync_s, best.prediction.step_s,
           choice.hidden ? "hidden" : "NOT hidden within --max-inner-steps", pr->step_s,
           (double)pr->outer.bytes / 1e6);
    if (!choice.hidden) {
        printf("  %.4f s a step exposed at H = %d; raise --max-inner-steps, compress the outer "
               "gradients (--outer-compression int8) or use a faster link\n",
               pr->outer.exposed_s, bound);
    }
    return one_job_instead(model, cluster, whole, plan, pr);
}

static int run_search(const plan_args *args) {
    loom_gpt_config model;
    loom_status st = resolve_model(args, &model);
    loom_cluster cluster;
    memset(&cluster, 0, sizeof cluster);
    if (st == LOOM_OK) st = loom_cluster_read(args->cluster, &cluster);
    loom_search_request req = {.devices = args->devices,
                               .global_batch = args->layout.global_batch_size,
                               .seq_len = args->seq_len ? args->seq_len : model.max_seq_len,
                               .precision = LOOM_PRECISION_FP32,
                               .keep = 8};
    if (st == LOOM_OK && args->precision[0]) {
        st = loom_precision_parse(args->precision, "loom plan", "--precision", &req.precision);
    }
    if (st == LOOM_OK) st = cli_allow_compression(args->allow_compression, &req.allow_compression);
    if (st == LOOM_OK && req.devices == 0)
        req.devices = cluster.max_nodes * cluster.devices_per_node;
    if (st == LOOM_OK && req.global_batch < 1) {
        st = loom_fail(LOOM_ERR_INPUT, "--global-batch-size: expected the sequences per step to "
                                       "plan for (the search needs it)");
    }
    if (st == LOOM_OK && !args->out[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--out: expected a plan file to write the best layout to");
    }
    if (st != LOOM_OK) return cli_fail(st);
    default_precision(args, &cluster, &req.precision);
    if (args->islands_auto) {
        loom_plan plan;
        loom_prediction pr;
        memset(&plan, 0, sizeof plan);
        st = plan_islands(args, &model, &cluster, req, &plan, &pr);
        if (st == LOOM_OK) st = cli_plan_fill_predicted(&plan, &pr, req.seq_len);
        if (st == LOOM_OK) st = cli_prepare_out(args->out, "a plan file");
        if (st == LOOM_OK) st = loom_plan_write(args->out, &plan);
        if (st == LOOM_OK) printf("\nwrote %s\n", args->out);
        loom_plan_free(&plan);
        return st == LOOM_OK ? 0 : cli_fail(st);
    }
    loom_plan_candidate *best = loom_calloc((size_t)req.keep, sizeof *best, "plan search");
    if (!best) return cli_fail(LOOM_ERR_NOMEM);
    int found = 0, tried = 0, fitting = 0, pruned = 0;
    double t0 = loom_now();
    st = loom_plan_search(&model, &cluster, &req, best, &found, &tried, &fitting, &pruned);
    double took = loom_now() - t0;
    if (st == LOOM_OK) {
        printf("searched %d layouts of %d devices on %s (%s, sequence %d, global batch %d) in "
               "%.2f s; %d simulated, %d of them fit the device's %.1f GiB; %d ruled out by "
               "their compute alone\n",
               tried + pruned, req.devices, cluster.name, loom_precision_name(req.precision),
               req.seq_len, req.global_batch, took, tried, fitting,
               (double)cluster.memory_bytes / 1073741824.0, pruned);
        cli_print_candidates(best, found);
        st = cli_plan_fill_predicted(&best[0].plan, &best[0].prediction, req.seq_len);
        if (st == LOOM_OK) st = cli_prepare_out(args->out, "a plan file");
        if (st == LOOM_OK) st = loom_plan_write(args->out, &best[0].plan);
        if (st == LOOM_OK) {
            printf("\nwrote %s (the fastest)\n", args->out);
        }
        if (st == LOOM_OK && args->search_space[0]) {
            st = report_full_space(args, &model, &cluster, &best[0].plan, req.precision,
                                   req.seq_len);
        }
        if (st == LOOM_OK && args->trace[0])
            st = write_trace(args, &best[0].plan, &cluster, req.precision, req.seq_len);
    }
    for (int i = 0; i < found; i++) loom_plan_free(&best[i].plan);
    free(best);
    return st == LOOM_OK ? 0 : cli_fail(st);
}

/* Each pipeline rank's predicted peak by category (GiB), and for a rank over the device's
 * memory, why: by how much, and the categories that exceed it alone or dominate. */
static void print_memory(const loom_plan *plan, const loom_cluster *cluster,
                         const loom_rank_memory *mem) {
    const double gib = 1073741824.0;
    int islands = plan->islands.count > 0; /* their outer state, a category of its own */
    printf("  rank  peak GiB = weights + grads + optimizer + gathered + activations (sets) + "
           "scratch + compressor%s\n",
           islands ? " + outer" : "");
    for (int r = 0; r < plan->pp; r++) {
        const loom_rank_memory *m = &mem[r];
        printf("  %4d  %8.2f = %.2f + %.2f + %.2f + %.2f + %.2f (%d) + %.2f + %.2f", r,
               (double)m->total / gib, (double)m->weights / gib, (double)m->grads / gib,
               (double)m->optimizer / gib, (double)m->gathered / gib, (double)m->activations / gib,
               m->in_flight, (double)m->scratch / gib, (double)m->compressor / gib);
        if (islands) printf(" + %.2f", (double)m->outer / gib);
        printf("\n");
    }
    for (int r = 0; r < plan->pp && cluster->memory_bytes > 0; r++) {
        char why[160];
        if (loom_rank_memory_why(&mem[r], cluster->memory_bytes, why, sizeof why))
            printf("  rank %d does not fit: %s\n", r, why);
    }
}

/* The prediction as a table: each virtual stage's times per micro-batch, each pipeline rank's
 * memory, the step and its parts, the traffic. */
static void print_prediction(const loom_plan *plan, const loom_cluster *cluster,
                             const loom_prediction *pr, const loom_rank_memory *mem,
                             loom_precision precision, int seq_len, int zero1) {
    char zero_text[64];
    snprintf(zero_text, sizeof zero_text, ", ZeRO-%d%s", zero1 ? plan->zero : 0,
             plan->zero >= 3
                 ? (plan->zero3_gather == LOOM_ZERO3_GATHER_STEP ? " (gathered per step)"
                                                                 : " (gathered per "
                                                                   "micro-batch)")
                 : "");
    printf("prediction on %s (%d x %d devices available), %s, sequence %d%s%s:\n", cluster->name,
           cluster->max_nodes, cluster->devices_per_node, loom_precision_name(precision), seq_len,
           plan->dp > 1 ? zero_text : "", plan->sequence_parallel ? ", sequence parallel" : "");
    printf("  stage  rank  layers      forward ms  B ms      W ms      (per micro-batch)\n");
    for (int s = 0; s < pr->stages; s++) {
        const loom_stage_times *t = &pr->stage[s];
        char range[32];
        snprintf(range, sizeof range, "[%d, %d)", plan->stages[s].first_layer,
                 plan->stages[s].end_layer);
        printf("  %5d  %4d  %-10s  %10.3f  %8.3f  %8.3f\n", s, plan->stages[s].rank, range,
               t->forward_s * 1e3, t->backward_input_s * 1e3, t->backward_weight_s * 1e3);
    }
    print_memory(plan, cluster, mem);
    printf(
        "  step %.4f s = pipeline %.4f s (bubble %.1f %%) + data-parallel sync not hidden %.4f s "
        "+ optimizer %.4f s (AdamW, zeroing the gradients, their norm)\n",
        pr->step_s - pr->outer.exposed_s, pr->pipeline_s, 100 * pr->bubble, pr->dp_exposed_s,
        pr->optimizer_s);
    const loom_plan_islands *is = &plan->islands;
    if (is->count > 0) {
        printf("  islands: a sync of the largest fragment %.4f s (outer gradients %s; every "
               "fragment once %.4f s) every %d inner steps, %d behind: %.4f s a step not hidden, "
               "so a step %.4f s; %.3g MB a step between islands (every rank's, summed)\n",
               pr->outer.sync_s, loom_compress_method_name(is->compression), pr->outer.total_s,
               is->inner_steps, is->overlap_steps, pr->outer.exposed_s, pr->step_s,
               (double)pr->outer.bytes / 1e6);
    }
    double flops = loom_gpt_flops_per_token(&plan->model, seq_len) * pr->tokens_per_s;
    int devices = (int)loom_plan_job_ranks(plan);
    printf("  %.0f tokens/s; %.1f TFLOP/s per device (%.1f %% of the %s peak); per step: dp %.3g "
           "GB, tp %.3g GB, pp %.3g GB (every rank's, summed)\n",
           pr->tokens_per_s, flops / devices / 1e12,
           100 * flops / devices / cluster->peak_flops[precision], loom_precision_name(precision),
           (double)pr->dp_bytes / 1e9, (double)pr->tp_bytes / 1e9, (double)pr->pp_bytes / 1e9);
    if (cluster->memory_bytes > 0) {
        printf("  peak memory %.2f GiB of the device's %.2f GiB%s\n",
               (double)pr->peak_bytes / 1073741824.0, (double)cluster->memory_bytes / 1073741824.0,
               pr->peak_bytes > cluster->memory_bytes ? ": DOES NOT FIT" : "");
    }
}

static int run_predict(const plan_args *args, int argc, char **argv) {
    static const char *const allowed[] = {"--predict",  "--cluster", "--precision",
                                          "--seq-len",  "--zero",    "--zero1",
                                          "--no-zero1", "--out",     "--trace"};
    loom_status st = check_mode_flags(argc, argv, "--predict", allowed,
                                      (int)(sizeof allowed / sizeof allowed[0]),
                                      "the plan file holds the layout");
    if (st == LOOM_OK && !args->cluster[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--predict: expected --cluster FILE (clusters/*.json, or "
                                       "loom profile's)");
    }
    loom_precision precision = LOOM_PRECISION_FP32; /* or the cluster's, below */
    if (st == LOOM_OK && args->precision[0]) {
        st = loom_precision_parse(args->precision, "loom plan", "--precision", &precision);
    }
    if (st == LOOM_OK && args->seq_len < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--seq-len: expected a positive length, got %d",
                       args->seq_len);
    }
    if (st != LOOM_OK) return cli_fail(st);
    loom_plan plan;
    loom_cluster cluster;
    st = loom_plan_read(args->predict, &plan);
    if (st != LOOM_OK) return cli_fail(st);
    /* the ZeRO stage: --zero or its aliases (as loom train's), else the plan's mesh.zero */
    int zero;
    st = loom_layout_flags_zero(&args->layout, &zero);
    if (st == LOOM_OK && zero >= 0) {
        plan.zero = zero;
        st = loom_plan_check(&plan, args->predict, 0);
    }
    int zero1 = plan.zero >= 1;
    if (st == LOOM_OK) st = loom_cluster_read(args->cluster, &cluster);
    if (st == LOOM_OK) default_precision(args, &cluster, &precision);
    int seq_len = args->seq_len ? args->seq_len : plan.model.max_seq_len;
    if (st == LOOM_OK && seq_len > plan.model.max_seq_len) {
        st = loom_fail(LOOM_ERR_INPUT, "--seq-len: expected at most the model's context %d, got %d",
                       plan.model.max_seq_len, seq_len);
    }
    loom_prediction *pr = loom_calloc(1, sizeof *pr, "prediction");
    loom_rank_memory *mem = loom_calloc((size_t)plan.pp, sizeof *mem, "prediction");
    if (st == LOOM_OK && (!pr || !mem)) st = LOOM_ERR_NOMEM;
    if (st == LOOM_OK && args->trace[0]) {
        st = cli_prepare_out(args->trace, "a trace file");
        if (st == LOOM_OK)
            st = loom_plan_predict_trace(&plan, &cluster, precision, seq_len, args->trace, pr);
        if (st == LOOM_OK) printf("wrote %s (the simulated step)\n", args->trace);
    } else if (st == LOOM_OK) {
        st = loom_plan_predict(&plan, &cluster, precision, seq_len, pr);
    }
    for (int r = 0; r < plan.pp && st == LOOM_OK; r++) {
        st = loom_plan_rank_memory(&plan, r, seq_len, &mem[r]);
    }
    if (st == LOOM_OK) print_prediction(&plan, &cluster, pr, mem, precision, seq_len, zero1);
    if (st == LOOM_OK && args->out[0]) {
        plan.precision = precision; /* what its predictions are for */
        st = cli_plan_fill_predicted(&plan, pr, seq_len);
        if (st == LOOM_OK) st = cli_prepare_out(args->out, "a plan file");
        if (st == LOOM_OK) st = loom_plan_write(args->out, &plan);
        if (st == LOOM_OK) printf("\nwrote %s\n", args->out);
    }
    free(pr), free(mem);
    loom_plan_free(&plan);
    return st == LOOM_OK ? 0 : cli_fail(st);
}

/* The intra-op ILP's answer as a table: each operator's strategy and costs (x its count), the
 * totals, the ILP's size and solve time. */
static void print_intraop(const loom_intraop_graph *g, const loom_intraop_result *r) {
    printf("  %-13s %3s  %-64s %10s %9s %10s %9s %10s\n", "operator", "x", "strategy", "compute ms",
           "comm ms", "reshard ms", "sync ms", "state MiB");
    for (int v = 0; v < g->ops; v++) {
        const loom_intraop_op *o = &g->op[v];
        const loom_intraop_strategy *s = &o->strategy[r->choice[v]];
        double n = o->count;
        printf("  %-13s %3d  %-64s %10.3f %9.3f %10.3f %9.3f %10.1f\n", o->name, o->count, s->name,
               n * s->compute_s * 1e3, n * s->comm_s * 1e3, r->op_reshard_s[v] * 1e3,
               (n * s->sync_s + r->op_tied_s[v]) * 1e3, n * (double)s->state_bytes / 1048576.0);
    }
    printf("  step %.3f ms = compute %.3f + in-op communication %.3f + resharding %.3f + "
           "gradient sync %.3f; state %.3f GiB per device\n",
           r->objective_s * 1e3, r->compute_s * 1e3, r->comm_s * 1e3, r->reshard_s * 1e3,
           r->sync_s * 1e3, (double)r->state_bytes / 1073741824.0);
    printf("  ILP: %d variables, %d constraints, %d nonzeros; solved in %.3f s\n", r->variables,
           r->constraints, r->nonzeros, r->solve_s);
}

/* "ZeRO-3 with sequence parallelism": a runtime configuration in the plan's words. */
static void config_words(int config, char *out, size_t cap) {
    snprintf(out, cap, "ZeRO-%d %s sequence parallelism", LOOM_INTRAOP_CONFIG_ZERO(config),
             LOOM_INTRAOP_CONFIG_SP(config) ? "with" : "without");
}

/* The full space's answer against the runtime space's: the gain, and where the runtime cannot
 * follow the full answer (each operator it cannot, and why). */
static void print_full_against_runtime(const loom_intraop_graph *g, const loom_intraop_result *full,
                                       const loom_intraop_result *runtime) {
    char words[64];
    config_words(runtime->config, words, sizeof words);
    printf("  runtime space: step %.3f ms, state %.3f GiB per device, %s; the full space gains "
           "%.1f %% (simulation only: loom's runtime executes the runtime space)\n",
           runtime->objective_s * 1e3, (double)runtime->state_bytes / 1073741824.0, words,
           100.0 * (runtime->objective_s - full->objective_s) / runtime->objective_s);
    char why[LOOM_INTRAOP_MAX_OPS][LOOM_INTRAOP_WHY_CHARS];
    int config, n = loom_intraop_unfollowed(g, full->choice, &config, why);
    if (n == 0) {
        config_words(config, words, sizeof words);
        printf("  the runtime follows the full space's answer (%s)\n", words);
        return;
    }
    printf("  where the runtime cannot follow the full space's answer:\n");
    for (int v = 0; v < g->ops; v++) { /* the operators with one reason on one line */
        if (!why[v][0]) continue;
        printf("    %s", g->op[v].name);
        for (int u = v + 1; u < g->ops; u++) {
            if (strcmp(why[u], why[v])) continue;
            printf(", %s", g->op[u].name);
            why[u][0] = '\0';
        }
        printf(": %s\n", why[v]);
    }
}

/* `loom plan --intraop`: the ILP over the model's operator graph on a (dp, tp) mesh; with
 * --search-space full, also the runtime space's optimum for the gain. */
static int run_intraop(const plan_args *args, int argc, char **argv) {
    static const char *const allowed[] = {
        "--intraop",       "--model",           "--layers",  "--heads",     "--d-model",
        "--context",       "--vocab",           "--cluster", "--dp",        "--tp",
        "--data-parallel", "--tensor-parallel", "--seq-len", "--precision", "--micro-batch-size",
        "--micro-batches", "--search-space"};
    int nallowed = (int)(sizeof allowed / sizeof allowed[0]);
    loom_status st = check_mode_flags(argc, argv, "--intraop", allowed, nallowed,
                                      "the ILP plans one (dp, tp) mesh");
    loom_gpt_config model = {0};
    if (st == LOOM_OK) st = resolve_model(args, &model);
    loom_intraop_request req = {
        .dp = args->layout.data_parallel ? args->layout.data_parallel : 1,
        .tp = args->layout.tensor_parallel ? args->layout.tensor_parallel : 1,
        .micro_batch = args->layout.micro_batch_size ? args->layout.micro_batch_size : 1,
        .micro_batches = args->layout.micro_batches,
        .seq_len = args->seq_len,
        .precision = LOOM_PRECISION_FP32,
        .space = LOOM_INTRAOP_RUNTIME,
        .part = LOOM_INTRAOP_MODEL};
    static const char *const counts[] = {"--dp", "--tp", "--micro-batch-size", "--micro-batches",
                                         "--seq-len"};
    int values[] = {args->layout.data_parallel, args->layout.tensor_parallel,
                    args->layout.micro_batch_size, args->layout.micro_batches, args->seq_len};
    for (int i = 0; i < 5 && st == LOOM_OK; i++) { /* 0: the default */
        if (values[i] < 0) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: expected a positive number, got %d", counts[i],
                           values[i]);
        }
    }
    if (st == LOOM_OK && !args->cluster[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--intraop: expected --cluster FILE (clusters/*.json, or "
                                       "loom profile's)");
    }
    if (st == LOOM_OK && args->seq_len > model.max_seq_len) {
        st = loom_fail(LOOM_ERR_INPUT, "--seq-len: expected at most the model's context %d, got %d",
                       model.max_seq_len, args->seq_len);
    }
    if (st == LOOM_OK && args->precision[0])
        st = loom_precision_parse(args->precision, "loom plan", "--precision", &req.precision);
    if (st == LOOM_OK && args->search_space[0])
        st =
            loom_intraop_space_parse(args->search_space, "loom plan", "--search-space", &req.space);
    loom_cluster cluster;
    memset(&cluster, 0, sizeof cluster);
    if (st == LOOM_OK) st = loom_cluster_read(args->cluster, &cluster);
    if (st == LOOM_OK) default_precision(args, &cluster, &req.precision);
    int64_t devices = (int64_t)cluster.max_nodes * cluster.devices_per_node;
    if (st == LOOM_OK && (int64_t)req.dp * req.tp > devices) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "--dp x --tp: expected at most the %lld devices of %s, got %lld",
                       (long long)devices, args->cluster, (long long)req.dp * req.tp);
    }
    if (st != LOOM_OK) return cli_fail(st);
    req.memory_budget = cluster.memory_bytes;
    loom_intraop_graph *graph = NULL, *runtime_graph = NULL;
    loom_intraop_result result, runtime;
    st = loom_intraop_graph_create(&graph, &model, &cluster, &req);
    if (st == LOOM_OK) {
        printf("intra-op ILP on %s: mesh (dp %d, tp %d), %d x %d sequences of %d tokens per "
               "micro-batch, %d micro-batch%s per step, %s, %s space, state budget %.1f GiB per "
               "device\n",
               cluster.name, req.dp, req.tp, req.dp, req.micro_batch, graph->request.seq_len,
               graph->request.micro_batches, graph->request.micro_batches == 1 ? "" : "es",
               loom_precision_name(req.precision),
               req.space == LOOM_INTRAOP_FULL ? "full" : "runtime",
               (double)req.memory_budget / 1073741824.0);
        st = loom_intraop_solve(graph, &result);
    }
    if (st == LOOM_OK) print_intraop(graph, &result);
    if (st == LOOM_OK && req.space == LOOM_INTRAOP_FULL) {
        loom_intraop_request rt = req;
        rt.space = LOOM_INTRAOP_RUNTIME;
        loom_status rst = loom_intraop_graph_create(&runtime_graph, &model, &cluster, &rt);
        if (rst == LOOM_OK) rst = loom_intraop_solve(runtime_graph, &runtime);
        if (rst == LOOM_ERR_NOMEM) st = rst;
        if (rst == LOOM_OK) {
            print_full_against_runtime(graph, &result, &runtime);
        } else if (st == LOOM_OK) { /* the runtime cannot run this mesh: say why, not fail */
            printf("  runtime space: none (%s)\n", loom_last_error());
            loom_clear_error();
        }
    } else if (st == LOOM_OK) {
        char words[64];
        config_words(result.config, words, sizeof words);
        printf("  (the runtime space: loom executes this layout, %s)\n", words);
    }
    loom_intraop_graph_free(graph);
    loom_intraop_graph_free(runtime_graph);
    return st == LOOM_OK ? 0 : cli_fail(st);
}

static int run_build(const plan_args *args) {
    loom_gpt_config model;
    loom_status st = resolve_model(args, &model);
    if (st == LOOM_OK && args->ranks < 0) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "--ranks: expected a positive world size (0 = no check), got %d",
                       args->ranks);
    }
    loom_plan plan;
    loom_plan_init(&plan);
    if (st == LOOM_OK) {
        st = loom_plan_from_flags(&plan, &model, &args->layout, args->ranks);
    }
    if (st == LOOM_OK) st = cli_prepare_out(args->out, "a plan file");
    if (st == LOOM_OK) st = loom_plan_write(args->out, &plan);
    if (st != LOOM_OK) {
        loom_plan_free(&plan);
        return cli_fail(st);
    }
    loom_plan_print(&plan, stdout);
    printf("\nwrote %s\n", args->out);
    loom_plan_free(&plan);
    return 0;
}

static int plan_main(const plan_args *a, int argc, char **argv);

int cmd_plan(int argc, char **argv) {
    if (cli_find_flag(argc, argv, "--help") >= 0 || cli_find_flag(argc, argv, "-h") >= 0) {
        plan_args defaults;
        memset(&defaults, 0, sizeof defaults);
        loom_layout_flags_defaults(&defaults.layout);
        cli_print_help(plan_usage, plan_opts, NPLAN, &defaults);
        return 0;
    }
    plan_args args; /* the layout flags' defaults are loom train's */
    memset(&args, 0, sizeof args);
    loom_layout_flags_defaults(&args.layout);
    /* --islands auto asks the search to choose the islands: taken out here, as --islands
     * otherwise takes a number */
    char **kept = loom_calloc((size_t)argc + 1, sizeof *kept, "arguments");
    if (!kept) return cli_fail(LOOM_ERR_NOMEM);
    int nkept = 0;
    for (int i = 0; i < argc; i++) {
        if (i >= 2 && !strcmp(argv[i], "--islands") && i + 1 < argc &&
            !strcmp(argv[i + 1], "auto")) {
            args.islands_auto = 1, i++;
        } else if (i >= 2 && !strcmp(argv[i], "--islands=auto")) {
            args.islands_auto = 1;
        } else {
            kept[nkept++] = argv[i];
        }
    }
    argc = nkept, argv = kept;
    int rc = plan_main(&args, argc, argv);
    free(kept);
    return rc;
}

static int plan_main(const plan_args *a, int argc, char **argv) {
    plan_args args = *a;
    loom_status st = cli_parse_flags(&args, plan_opts, NPLAN, argc, argv, 2, NULL);
    if (st == LOOM_OK && args.islands_auto && !args.cluster[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--islands auto: expected --cluster FILE with an island "
                                       "level (the search plans the islands on it)");
    }
    if (st == LOOM_OK && args.max_inner_steps && !args.islands_auto) {
        st = loom_fail(LOOM_ERR_INPUT, "--max-inner-steps: expected only with --islands auto");
    }
    int check_given = 0, cluster_given = 0; /* (with a value: an empty one is refused) */
    for (int i = 2; i < argc; i++) {
        check_given |= is_flag(argv[i], "--check");
        cluster_given |= is_flag(argv[i], "--check-cluster");
    }
    if (st != LOOM_OK) return cli_fail(st);
    if (cluster_given) return run_check_cluster(&args, argc, argv);
    for (int i = 2; i < argc; i++) {
        if (is_flag(argv[i], "--predict")) return run_predict(&args, argc, argv);
    }
    if (args.intraop) return run_intraop(&args, argc, argv);
    if (args.cluster[0]) return run_search(&args);
    return check_given ? run_check(&args, argc, argv) : run_build(&args);
}
