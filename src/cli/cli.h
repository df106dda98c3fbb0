/*
 * cli.h — shared pieces of the `loom` command's subcommands.
 */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include "loom/base.h"
#include "loom/planner.h"
#include "loom/train.h"

#include <stddef.h>

/* offset of an option read elsewhere (like --config): parsing skips its value */
#define CLI_OPT_SKIP ((size_t)-1)

typedef enum { OPT_INT, OPT_I64, OPT_U64, OPT_DOUBLE, OPT_STRING, OPT_FLAG } cli_opt_type;

/* One option: its --kebab-case flag (the JSON key is the same in snake_case), where it lives
 * in the target struct, and a line of help. */
typedef struct {
    const char *flag;
    cli_opt_type type;
    size_t offset;
    size_t size; /* for strings: the buffer size */
    const char *help;
} cli_opt;

/* One table row for field `field` of struct `type`. */
#define CLI_OPT(type, flag, kind, field, help)                                                     \
    { flag, kind, offsetof(type, field), sizeof(((type *)0)->field), help }

/* The compression flags of `loom train` and `loom plan` (loom_plan_compression_flags, a field
 * `compression` of the option struct), as rows of a table made by ROW, the table's CLI_OPT. */
#define CLI_COMPRESSION_OPTS(ROW)                                                                  \
    ROW("--dp-compression", OPT_STRING, compression.dp_compression,                                \
        "data-parallel gradients: none (default), powersgd, topk, sign, int8 or bf16"),            \
        ROW("--dp-compression-rank", OPT_INT, compression.dp_compression_rank,                     \
            "powersgd's rank (default 4)"),                                                        \
        ROW("--dp-topk-fraction", OPT_DOUBLE, compression.dp_topk_fraction,                        \
            "topk: share of the gradient's entries sent, in (0, 1] (default 0.01)"),               \
        ROW("--dp-compression-warmup-steps", OPT_INT, compression.dp_compression_warmup_steps,     \
            "the first steps send data-parallel gradients uncompressed (default 0)"),              \
        ROW("--dp-compression-stages", OPT_STRING, compression.dp_compression_stages,              \
            "pipeline stages whose gradients are compressed, e.g. 0,1 (default all)"),             \
        ROW("--no-error-feedback", OPT_FLAG, compression.no_error_feedback,                        \
            "drop the data-parallel compression error instead of adding it to the next step "      \
            "(not with sign)"),                                                                    \
        ROW("--pp-compression", OPT_STRING, compression.pp_compression,                            \
            "activation gradients between pipeline stages: none (default), lowrank, topk, int8 "   \
            "or bf16"),                                                                            \
        ROW("--pp-compression-rank", OPT_INT, compression.pp_compression_rank,                     \
            "lowrank's rank (default 8)"),                                                         \
        ROW("--pp-topk-fraction", OPT_DOUBLE, compression.pp_topk_fraction,                        \
            "topk: share of the activation gradient's entries sent, in (0, 1] (default 0.01)"),    \
        ROW("--pp-compression-links", OPT_STRING, compression.pp_compression_links,                \
            "links whose backward sends compress, e.g. 0,2 (link s joins stages s and s + 1; "     \
            "default all)"),                                                                       \
        ROW("--pp-compression-policy", OPT_STRING, compression.pp_compression_policy,              \
            "which backward sends compress: all (default), epilogue (1F1B's cool-down) or slack "  \
            "(where the schedule has slack for it)"),                                              \
        ROW("--pp-forward-compression", OPT_STRING, compression.pp_forward_compression,            \
            "activations sent forward between stages: none (default), bf16 or int8"),              \
        ROW("--no-lazy-error", OPT_FLAG, compression.no_lazy_error,                                \
            "drop the pipeline compression error instead of adding it to the sender's next send"), \
        ROW("--embedding-sync", OPT_STRING, compression.embedding_sync,                            \
            "tied embedding's gradient: separate (default) or fused (one allreduce over the "      \
            "first and last stages of every replica; needs pp > 1)")

/* Parses one value into target + opt->offset; `source` names where it came from. */
loom_status cli_set_value(void *target, const cli_opt *opt, const char *text, const char *source);
/* Applies argv[start..argc) flags to target. Unknown flags are errors. seen (nopts entries, or
 * NULL) gets a 1 for every option that was given. */
loom_status cli_parse_flags(void *target, const cli_opt *opts, int nopts, int argc, char **argv,
                            int start, unsigned char *seen);
/* Applies a JSON object file's keys (snake_case) to target; unknown keys are errors. seen as
 * above. */
loom_status cli_parse_json(void *target, const cli_opt *opts, int nopts, const char *path,
                           unsigned char *seen);
void cli_print_help(const char *usage, const cli_opt *opts, int nopts);
/* Prints every option with its resolved value as a table. */
void cli_print_table(const void *target, const cli_opt *opts, int nopts);
/* Index of "--flag" in argv (or -1). */
int cli_find_flag(int argc, char **argv, const char *flag);

int cmd_train(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_bench_train(int argc, char **argv);
int cmd_bench_compressors(int argc, char **argv);
int cmd_profile(int argc, char **argv);

/* The planner's table of candidates, fastest first (loom plan's search, loom train --plan
 * auto). */
void cli_print_candidates(const loom_plan_candidate *best, int found);
/* `loom train --plan auto`: plans for the job's ranks (collective; world may be NULL) from
 * cfg->cluster or a cached `loom profile` of them, prints the candidates and writes
 * OUT/plan.json from rank 0. */
loom_status cli_plan_auto(const loom_train_config *cfg, struct loom_comm *world, loom_plan *plan);
/* Fills the plan's "predicted" (step time, tokens/s, every rank's peak memory). */
/* --allow-compression's word (none, dp, pp, all; "" = none) as LOOM_ALLOW_* bits. */
loom_status cli_allow_compression(const char *word, int *bits);
loom_status cli_plan_fill_predicted(loom_plan *plan, const loom_prediction *pr, int seq_len);

/* An --out file path (`what`, for the message: "a plan file"): not empty, not a folder; its
 * folder is made when missing. */
loom_status cli_prepare_out(const char *out, const char *what);

/* Prints the error and returns the exit code for status. */
int cli_fail(loom_status status);

/* Starts MPI when the process was started by a launcher (mpirun, srun, ...), sets the log
 * prefix "[rank R] " and keeps progress output to rank 0; *world stays NULL otherwise. */
struct loom_comm;
loom_status cli_start_mpi(int *argc, char ***argv, struct loom_comm **world);
/* Finalizes MPI (if started) and returns code. */
int cli_finish(struct loom_comm *world, int code);

#endif
