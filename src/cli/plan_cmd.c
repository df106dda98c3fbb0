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
#define _POSIX_C_SOURCE 200809L /* stat */
#include "cli/cli.h"
#include "loom/cluster.h"
#include "loom/plan.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int cmd_plan(int argc, char **argv);

enum { PLAN_PATH_MAX = 1024 };

typedef struct {
    char model[64];
    int layers, heads, d_model, context, vocab;
    int dp, tp, pp;
    int micro_batch_size, global_batch_size, micro_batches, recompute;
    char schedule[64];
    int virtual_stages;
    char stage_layers[256];
    loom_plan_compression_flags compression;
    int ranks;
    char out[PLAN_PATH_MAX];
    char check[PLAN_PATH_MAX];
    char check_cluster[PLAN_PATH_MAX];
} plan_args;

#define POPT(...) CLI_OPT(plan_args, __VA_ARGS__)

static const cli_opt plan_opts[] = {
    POPT("--model", OPT_STRING, model,
         "preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, small, tiny"),
    POPT("--layers", OPT_INT, layers, "transformer blocks (0 = preset)"),
    POPT("--heads", OPT_INT, heads, "attention heads (0 = preset)"),
    POPT("--d-model", OPT_INT, d_model, "width (0 = preset)"),
    POPT("--context", OPT_INT, context, "maximum sequence length (0 = preset)"),
    POPT("--vocab", OPT_INT, vocab, "real vocabulary size (0 = preset; padded to 128)"),
    POPT("--dp", OPT_INT, dp, "data-parallel replicas (0 = the ranks left: --ranks / (tp x pp))"),
    POPT("--data-parallel", OPT_INT, dp, "same as --dp"),
    POPT("--tp", OPT_INT, tp, "tensor-parallel ranks per layer"),
    POPT("--tensor-parallel", OPT_INT, tp, "same as --tp"),
    POPT("--pp", OPT_INT, pp, "pipeline stages"),
    POPT("--pipeline-parallel", OPT_INT, pp, "same as --pp"),
    POPT("--micro-batch-size", OPT_INT, micro_batch_size, "sequences per forward/backward"),
    POPT("--global-batch-size", OPT_INT, global_batch_size,
         "sequences per step (0 = micro x micro-batches x dp)"),
    POPT("--micro-batches", OPT_INT, micro_batches,
         "micro-batches per step and replica (0 = from the global batch, else pp)"),
    POPT("--recompute", OPT_FLAG, recompute, "every stage recomputes activations in backward"),
    POPT("--schedule", OPT_STRING, schedule,
         "pipeline schedule: 1f1b (default), gpipe, interleaved, zb-h1 or zb-v"),
    POPT("--virtual-stages", OPT_INT, virtual_stages,
         "model chunks per pipeline rank for --schedule interleaved (0 = 2; zb-v runs 2, the "
         "others 1)"),
    POPT("--stage-layers", OPT_STRING, stage_layers,
         "layers per (virtual) stage in model order, comma-separated (e.g. 3,5; default: even, "
         "earlier stages +1)"),
    CLI_COMPRESSION_OPTS(POPT),
    POPT("--ranks", OPT_INT, ranks, "check that dp*tp*pp equals this world size (0 = no check)"),
    POPT("--out", OPT_STRING, out, "plan file to write"),
    POPT("--check", OPT_STRING, check, "validate this plan file instead of writing one"),
    POPT("--check-cluster", OPT_STRING, check_cluster,
         "read and check this cluster description (e.g. clusters/dgx-a100.json): prints "
         "\"FILE: ok (NAME, N devices per node, max M nodes)\", or the problem and exits 2"),
};
#define NPLAN ((int)(sizeof plan_opts / sizeof plan_opts[0]))

static const char *plan_usage =
    "usage: loom plan [--model NAME ...] --dp N --tp N --pp N [options] --out plan.json\n"
    "       loom plan --check plan.json [--ranks N]\n"
    "       loom plan --check-cluster cluster.json";

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
        return loom_fail(LOOM_ERR_INPUT, "%s: expected %s, got %.*s (%s)", mode,
                         n > 1 ? "only --ranks with it" : "no other option with it",
                         (int)strcspn(arg, "="), arg, why);
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
    printf("\n%s: ok (%d ranks)\n", args->check, plan.dp * plan.tp * plan.pp);
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

/* The output must be a file path; its folder is made if missing. */
static loom_status prepare_out(const char *out) {
    if (!out[0]) return loom_fail(LOOM_ERR_INPUT, "--out: expected a plan file to write");
    struct stat st_out;
    if (stat(out, &st_out) == 0 && S_ISDIR(st_out.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT, "--out: %s is a directory; expected a file path", out);
    }
    const char *slash = strrchr(out, '/');
    if (!slash || slash == out) return LOOM_OK;
    char dir[PLAN_PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - out), out);
    if (stat(dir, &st_out) == 0 && !S_ISDIR(st_out.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT, "--out: %s is not a directory", dir);
    }
    return loom_mkdir_p(dir);
}

static int run_build(const plan_args *args) {
    loom_gpt_config model;
    loom_status st =
        loom_gpt_config_resolve(args->model, args->layers, args->heads, args->d_model,
                                args->context, args->vocab, "model configuration", &model);
    if (st == LOOM_OK && args->ranks < 0) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "--ranks: expected a positive world size (0 = no check), got %d",
                       args->ranks);
    }
    loom_plan_request request = {.dp = args->dp,
                                 .tp = args->tp,
                                 .pp = args->pp,
                                 .micro_batch = args->micro_batch_size,
                                 .global_batch = args->global_batch_size,
                                 .micro_batches = args->micro_batches,
                                 .schedule = args->schedule,
                                 .virtual_stages = args->virtual_stages,
                                 .stage_layers = args->stage_layers,
                                 .recompute = args->recompute};
    loom_plan plan;
    loom_plan_init(&plan);
    if (st == LOOM_OK) {
        st = loom_plan_from_flags(&plan, &model, request, &args->compression, args->ranks);
    }
    if (st == LOOM_OK) st = prepare_out(args->out);
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

int cmd_plan(int argc, char **argv) {
    if (cli_find_flag(argc, argv, "--help") >= 0 || cli_find_flag(argc, argv, "-h") >= 0) {
        cli_print_help(plan_usage, plan_opts, NPLAN);
        return 0;
    }
    plan_args args; /* zero: the defaults loom train has too (loom_plan_request) */
    memset(&args, 0, sizeof args);
    loom_plan_compression_flags_defaults(&args.compression);
    loom_status st = cli_parse_flags(&args, plan_opts, NPLAN, argc, argv, 2, NULL);
    int check_given = 0, cluster_given = 0;
    for (int i = 2; i < argc; i++) {
        check_given |= is_flag(argv[i], "--check");
        cluster_given |= is_flag(argv[i], "--check-cluster");
    }
    if (st == LOOM_OK && check_given && !args.check[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--check: expected a plan file to validate");
    }
    if (st == LOOM_OK && cluster_given && !args.check_cluster[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--check-cluster: expected a cluster description to check");
    }
    if (st != LOOM_OK) return cli_fail(st);
    if (cluster_given) return run_check_cluster(&args, argc, argv);
    return check_given ? run_check(&args, argc, argv) : run_build(&args);
}
