/*
 * plan_cmd.c — `loom plan`: writes a plan file for a model and a (dp, tp, pp) mesh with
 * contiguous, even (or --stage-layers) pipeline stages, or checks an existing plan with
 * --check FILE, optionally against a world size (--ranks). Prints the plan's summary and the
 * rank layout. No MPI here: planning is for one process.
 *
 * The compression flags are `loom train`'s (cli.h, CLI_COMPRESSION_OPTS).
 *
 * Not here: choosing the layout by cost (that is the planner's job; this writes the layout it
 * is told).
 */
#include "cli/cli.h"
#include "loom/plan.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

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
};
#define NPLAN ((int)(sizeof plan_opts / sizeof plan_opts[0]))

static const char *plan_usage =
    "usage: loom plan [--model NAME ...] --dp N --tp N --pp N [options] --out plan.json\n"
    "       loom plan --check plan.json [--ranks N]";

/* With --check, only --ranks may come along: anything else would be silently ignored. */
static loom_status check_mode_flags(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0) continue; /* a value */
        size_t len = strcspn(arg, "=");
        if ((len == 7 && !strncmp(arg, "--check", len)) ||
            (len == 7 && !strncmp(arg, "--ranks", len))) {
            continue;
        }
        return loom_fail(LOOM_ERR_INPUT,
                         "--check: expected only --ranks with it, got %.*s (the plan file "
                         "holds the layout)",
                         (int)len, arg);
    }
    return LOOM_OK;
}

static int run_check(const plan_args *args, int argc, char **argv) {
    loom_status st = check_mode_flags(argc, argv);
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

int cmd_plan(int argc, char **argv) {
    if (cli_find_flag(argc, argv, "--help") >= 0 || cli_find_flag(argc, argv, "-h") >= 0) {
        cli_print_help(plan_usage, plan_opts, NPLAN);
        return 0;
    }
    plan_args args; /* zero: the defaults loom train has too (loom_plan_request) */
    memset(&args, 0, sizeof args);
    loom_plan_compression_flags_defaults(&args.compression);
    loom_status st = cli_parse_flags(&args, plan_opts, NPLAN, argc, argv, 2, NULL);
    int check_given = 0;
    for (int i = 2; i < argc; i++) check_given |= !strncmp(argv[i], "--check", 7);
    if (st == LOOM_OK && check_given && !args.check[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--check: expected a plan file to validate");
    }
    if (st != LOOM_OK) return cli_fail(st);
    return args.check[0] ? run_check(&args, argc, argv) : run_build(&args);
}
