/*
 * cli.h — shared pieces of the `loom` command's subcommands.
 */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include "loom/base.h"
#include "loom/planner.h"
#include "loom/train.h"

#include <stddef.h>

/* `loom train`'s settings (the target of its option table and --config file): the run options,
 * and where the layout comes from — a plan file, the planner (--plan auto, on --cluster, with
 * the compressors --allow-compression allows), or the layout flags. loom_train gets the run
 * options and the plan. */
typedef struct {
    loom_train_config run;
    char plan[LOOM_PATH_MAX];    /* "" = from the layout flags; "auto": the planner chooses */
    char cluster[LOOM_PATH_MAX]; /* --plan auto: the cluster description ("" = profile these
                                    ranks, cached) */
    char allow_compression[16];  /* --plan auto: none (""), dp, pp or all */
    loom_layout_flags layout;
} cli_train_args;
void cli_train_args_defaults(cli_train_args *args);

/* offset of an option read elsewhere (like --config): parsing skips its value */
#define CLI_OPT_SKIP ((size_t)-1)

typedef enum {
    OPT_INT,
    OPT_I64,
    OPT_U64,
    OPT_DOUBLE,
    OPT_STRING,
    OPT_FLAG,
    OPT_GROUP,    /* not an option: the heading of the rows after it in --help (CLI_GROUP) */
    OPT_RECOMPUTE /* an int LOOM_RECOMPUTE_*: --recompute alone is "needed", or the word after it
                   * (none, needed, always, selective); a config file's true/false or word */
} cli_opt_type;

/* One option: its --kebab-case flag (the JSON key is the same in snake_case), where it lives
 * in the target struct, and a line of help that says the default in words where the default
 * value is 0 or "" (--help shows any other default value itself). */
typedef struct {
    const char *flag;
    cli_opt_type type;
    size_t offset;
    size_t size; /* for strings: the buffer size */
    const char *help;
    int may_be_empty; /* strings: "" is a value of its own (else it is refused by name) */
} cli_opt;

/* A heading in a table: the options after it, up to the next, are one group in --help (model,
 * layout, compression, run, output). */
#define CLI_GROUP(title)                                                                           \
    { title, OPT_GROUP, CLI_OPT_SKIP, 0, NULL, 0 }

/* One table row for field `field` of struct `type`. */
#define CLI_OPT(type, flag, kind, field, help)                                                     \
    { flag, kind, offsetof(type, field), sizeof(((type *)0)->field), help, 0 }
/* A string option whose empty value means something of its own (not the default, which an
 * empty value would otherwise hide): `loom bench --cases=` runs no case. */
#define CLI_OPT_MAY_BE_EMPTY(type, flag, field, help)                                              \
    { flag, OPT_STRING, offsetof(type, field), sizeof(((type *)0)->field), help, 1 }

/* The model flags of `loom train` and `loom plan` (fields model, layers, heads, d_model, context
 * and vocab of the option struct), as rows of a table made by ROW, the table's CLI_OPT. */
#define CLI_MODEL_OPTS(ROW)                                                                        \
    ROW("--model", OPT_STRING, model,                                                              \
        "preset: gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt3-125m ... gpt3-175b, small, tiny; "   \
        "llama-tiny, smollm-135m, llama3-8b, llama3-70b, llama3-405b (default small; loom train: " \
        "the model of --resume or --init-from when given)"),                                       \
        ROW("--layers", OPT_INT, layers, "transformer blocks (default: the preset's)"),            \
        ROW("--heads", OPT_INT, heads, "attention heads (default: the preset's)"),                 \
        ROW("--d-model", OPT_INT, d_model, "width (default: the preset's)"),                       \
        ROW("--context", OPT_INT, context, "maximum sequence length (default: the preset's)"),     \
        ROW("--vocab", OPT_INT, vocab,                                                             \
            "real vocabulary size, padded to a multiple of 128 (default: the preset's)"),          \
        ROW("--arch", OPT_STRING, arch,                                                            \
            "gpt2 or llama (default: the preset's; with llama and no --model, llama-tiny)"),       \
        ROW("--kv-heads", OPT_INT, kv_heads,                                                       \
            "Llama: key/value heads, dividing --heads (grouped-query attention; default: the "     \
            "preset's)"),                                                                          \
        ROW("--ffn-dim", OPT_INT, ffn_dim,                                                         \
            "Llama: SwiGLU's hidden width (default: the preset's)"),                               \
        ROW("--tie-embeddings", OPT_STRING, tie_embeddings,                                        \
            "Llama: on (the LM head is wte, as SmolLM) or off (its own, as Llama; default: the "   \
            "preset's)"),                                                                          \
        ROW("--rope-theta", OPT_DOUBLE, rope_theta,                                                \
            "Llama: rotary positions' base (default: the preset's)"),                              \
        ROW("--norm-eps", OPT_DOUBLE, norm_eps,                                                    \
            "Llama: RMSNorm's epsilon (default: the preset's)")

/* The layout flags of `loom train` and `loom plan` (loom_layout_flags but the compression, the
 * field `layout` of the option struct: ROW prefixes the field with it). */
#define CLI_LAYOUT_OPTS(ROW)                                                                       \
    ROW("--data-parallel", OPT_INT, data_parallel,                                                 \
        "data-parallel replicas (default: the ranks left over, ranks / (tensor x pipeline); "      \
        "loom plan: --ranks, else 1)"),                                                            \
        ROW("--tensor-parallel", OPT_INT, tensor_parallel,                                         \
            "tensor-parallel ranks per layer (default 1)"),                                        \
        ROW("--pipeline-parallel", OPT_INT, pipeline_parallel, "pipeline stages (default 1)"),     \
        ROW("--micro-batch-size", OPT_INT, micro_batch_size,                                       \
            "sequences per forward/backward (default 8)"),                                         \
        ROW("--global-batch-size", OPT_INT, global_batch_size,                                     \
            "sequences per step = micro batch x micro-batches x data parallel (default: from "     \
            "--micro-batches)"),                                                                   \
        ROW("--micro-batches", OPT_INT, micro_batches,                                             \
            "micro-batches per step and replica (default: from the global batch, else one per "    \
            "pipeline stage)"),                                                                    \
        ROW("--schedule", OPT_STRING, schedule,                                                    \
            "pipeline schedule: 1f1b, gpipe, interleaved, zb-h1 or zb-v (default 1f1b)"),          \
        ROW("--virtual-stages", OPT_INT, virtual_stages,                                           \
            "model chunks per pipeline rank (default: the schedule's: interleaved 2, zb-v 2, the " \
            "others 1)"),                                                                          \
        ROW("--stage-layers", OPT_STRING, stage_layers,                                            \
            "layers per (virtual) pipeline stage in model order, e.g. 3,5 (default: as even as "   \
            "possible, earlier stages one more)"),                                                 \
        ROW("--recompute", OPT_RECOMPUTE, recompute,                                               \
            "activation recomputation: needed (the word left out: one set of activations per "     \
            "stage, a micro-batch's forward rerun in its backward where that set no longer holds " \
            "it), always (rerun before every backward, Megatron-LM's full recomputation), "        \
            "selective (keep all but the attention's softmax, recomputed in backward) or none "    \
            "(default)"),                                                                          \
        ROW("--recompute-always", OPT_FLAG, recompute_always,                                      \
            "the same as --recompute always (an older spelling)"),                                 \
        ROW("--sequence-parallel", OPT_FLAG, sequence_parallel,                                    \
            "Megatron's sequence parallelism: LayerNorms, residuals and dropout-free regions run " \
            "on each tensor-parallel rank's share of the sequence (requires "                      \
            "--tensor-parallel > 1)"),                                                             \
        ROW("--no-overlap-grad-reduce", OPT_FLAG, no_overlap_grad_reduce,                          \
            "start the data-parallel gradient sync after the backward, not during it "             \
            "(Megatron-LM's local DDP of 2021: slower, the same numbers)"),                        \
        ROW("--zero", OPT_INT, zero,                                                               \
            "ZeRO stage over the data-parallel ranks: 0 none, 1 AdamW's state sharded, 2 and the " \
            "gradients, 3 and the parameters (default 1 when dp > 1 without data-parallel "        \
            "compression, else 0; given, it wins over a plan file's mesh.zero)"),                  \
        ROW("--zero3-prefetch", OPT_INT, zero3_prefetch,                                           \
            "ZeRO-3: units (blocks) whose parameter gather runs ahead of the one computing "       \
            "(default 1; 0 gathers each just in time)"),                                           \
        ROW("--zero3-gather", OPT_STRING, zero3_gather,                                            \
            "ZeRO-3: gather a unit's parameters for every micro-batch (micro_batch, default) or "  \
            "once per step, kept until its last backward (step)"),                                 \
        ROW("--zero1", OPT_FLAG, zero1, "the same as --zero 1 (an older spelling)"),               \
        ROW("--no-zero1", OPT_FLAG, no_zero1, "the same as --zero 0 (an older spelling)"),         \
        ROW("--islands", OPT_INT, islands,                                                         \
            "islands: K copies of the layout, each training on its own share of the data and "     \
            "syncing with the others only every --inner-steps steps (DiLoCo; default none)"),      \
        ROW("--inner-steps", OPT_INT, inner_steps,                                                 \
            "islands: inner steps between outer syncs, H (default 100)"),                          \
        ROW("--outer-optimizer", OPT_STRING, outer_optimizer,                                      \
            "islands: the outer optimiser, nesterov (default) or sgd"),                            \
        ROW("--outer-lr", OPT_DOUBLE, outer_lr, "islands: the outer learning rate (default 0.7)"), \
        ROW("--outer-momentum", OPT_DOUBLE, outer_momentum,                                        \
            "islands: the outer momentum (default 0.9)"),                                          \
        ROW("--outer-fragments", OPT_INT, outer_fragments,                                         \
            "islands: groups of layers syncing at staggered steps of a round (default 1)"),        \
        ROW("--outer-overlap-steps", OPT_INT, outer_overlap_steps,                                 \
            "islands: inner steps an outer sync runs behind (default 0: it blocks)"),              \
        ROW("--outer-compression", OPT_STRING, outer_compression,                                  \
            "islands: outer gradients on the wire: none (default), int8, bf16, powersgd, topk"),   \
        ROW("--outer-compression-rank", OPT_INT, outer_compression_rank,                           \
            "islands: powersgd's rank for the outer gradients (default 4)"),                       \
        ROW("--outer-topk-fraction", OPT_DOUBLE, outer_topk_fraction,                              \
            "islands: topk's share of each matrix's outer gradient sent (default 0.01)")

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

/* Parses one value into target + opt->offset; `source` names where it came from. An empty string
 * is refused (leaving the option out gives its default) unless opt->may_be_empty. */
loom_status cli_set_value(void *target, const cli_opt *opt, const char *text, const char *source);
/* Applies argv[start..argc) flags to target. Unknown flags are errors. seen (nopts entries, or
 * NULL) gets a 1 for every option that was given. */
loom_status cli_parse_flags(void *target, const cli_opt *opts, int nopts, int argc, char **argv,
                            int start, unsigned char *seen);
/* Applies a JSON object file's keys (snake_case) to target; unknown keys are errors. seen as
 * above. */
loom_status cli_parse_json(void *target, const cli_opt *opts, int nopts, const char *path,
                           unsigned char *seen);
/* The usage text, then every option by group with a placeholder for its value (N, X, VALUE) and
 * its help; where the help does not say the default, the value in `defaults` (a target filled
 * with the defaults, or NULL) is shown when it is not 0 or "". */
void cli_print_help(const char *usage, const cli_opt *opts, int nopts, const void *defaults);
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
 * args->cluster or a cached `loom profile` of them, prints the candidates and writes
 * OUT/plan.json from rank 0. */
loom_status cli_plan_auto(const cli_train_args *args, struct loom_comm *world, loom_plan *plan);
/* --allow-compression's word (none, dp, pp, all; "" = none) as LOOM_ALLOW_* bits. */
loom_status cli_allow_compression(const char *word, int *bits);
/* Fills the plan's "predicted" (step time, tokens/s, every rank's peak memory, and the sequence
 * length they are for). */
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
