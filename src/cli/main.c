/*
 * main.c — the `loom` command: dispatches to train, prepare, tokenize, sample, eval, bench, plan
 * and profile. Exit status: 0 success, 1 runtime failure, 2 bad usage or bad input.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: loom <command> [options]\n\n"
            "commands:\n"
            "  train     train a GPT model (loom train --help)\n"
            "  prepare   turn text files into token shards\n"
            "  tokenize  text -> token ids, or ids -> text (loom tokenize --help)\n"
            "  sample    generate text from a checkpoint\n"
            "  eval      mean loss of a checkpoint over a token file\n"
            "  bench     measure step time, tokens/s and MFU\n"
            "  plan      write or check a parallel layout (loom plan --help)\n"
            "  profile   measure the cluster description under mpirun (loom profile --help)\n\n"
            "loom <command> --help lists the command's options by group (model, layout,\n"
            "compression, run, output) with their defaults.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        loom_error(
            "expected a command: train, prepare, tokenize, sample, eval, bench, plan or profile");
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "train")) return cmd_train(argc, argv);
    if (!strcmp(cmd, "prepare")) return cmd_prepare(argc, argv);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(cmd, "sample")) return cmd_sample(argc, argv);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc, argv);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc, argv);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc, argv);
    if (!strcmp(cmd, "profile")) return cmd_profile(argc, argv);
    loom_error("unknown command '%s'; expected train, prepare, tokenize, sample, eval, bench, plan "
               "or profile",
               cmd);
    usage(stderr);
    return 2;
}
