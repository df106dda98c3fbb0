/*
 * commands.c — `loom train`, `loom prepare`, `loom sample` and `loom eval`: option tables,
 * configuration resolution (defaults, then --config FILE.json, then flags), and calls into
 * the train and data modules.
 */
#define _POSIX_C_SOURCE 200809L /* stat */
#include "cli/cli.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/io.h"
#include "loom/parallel.h"
#include "loom/plan.h"
#include "loom/train.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* rows of train_opts: a run option (loom_train_config), where the layout comes from, a layout
 * flag (loom_layout_flags) */
#define TRUN(flag, kind, field, help) CLI_OPT(cli_train_args, flag, kind, run.field, help)
#define TOPT(...)                     CLI_OPT(cli_train_args, __VA_ARGS__)
#define TLAY(flag, kind, field, help) CLI_OPT(cli_train_args, flag, kind, layout.field, help)

static const cli_opt train_opts[] = {
    CLI_GROUP("model"),
    CLI_MODEL_OPTS(TRUN),
    TRUN("--init-from", OPT_STRING, init_from,
         "start from weights: llm.c .bin, .safetensors, a Hugging Face GPT-2 folder (config.json "
         "+ model.safetensors + tokenizer files) or a checkpoint (default: random weights)"),
    CLI_GROUP("layout"),
    TOPT("--plan", OPT_STRING, plan,
         "parallel layout from a plan file (loom plan), or auto: the planner chooses it for "
         "these ranks (default: the layout flags below)"),
    TOPT("--cluster", OPT_STRING, cluster,
         "with --plan auto: the cluster description to plan on (default: loom profile of these "
         "ranks, measured once and cached)"),
    TOPT("--allow-compression", OPT_STRING, allow_compression,
         "with --plan auto: compressors the planner may choose, where they shorten the step: "
         "none, dp, pp or all (default none)"),
    CLI_LAYOUT_OPTS(TLAY),
    TRUN("--bucket-mb", OPT_DOUBLE, bucket_mb,
         "data-parallel gradient bucket size (MB; default 25, or 4 per DP rank when more)"),
    CLI_GROUP("compression"),
    CLI_COMPRESSION_OPTS(TLAY),
    CLI_GROUP("run"),
    {"--config", OPT_STRING, CLI_OPT_SKIP, 0,
     "JSON file with these settings in snake_case; flags win (default: none)", 0},
    TRUN("--data", OPT_STRING, data, "training token shards (glob, comma-separated globs)"),
    TRUN("--val-data", OPT_STRING, val_data, "validation token shards (default: none)"),
    TRUN("--tokenizer", OPT_STRING, tokenizer,
         "the data's tokenizer, recorded in checkpoints (and copied into their folders) for "
         "sample and eval: bytes, or a byte-level BPE's files, GPT-2's or Llama 3's tokenizer.json "
         "(default: the one --resume / --init-from records)"),
    TRUN("--steps", OPT_I64, steps, "optimizer steps"),
    TRUN("--seq-len", OPT_INT, seq_len, "tokens per sequence"),
    TRUN("--lr", OPT_DOUBLE, lr, "peak learning rate"),
    TRUN("--lr-schedule", OPT_STRING, lr_schedule, "constant or cosine (after warm-up)"),
    TRUN("--min-lr-ratio", OPT_DOUBLE, min_lr_ratio, "cosine floor as a fraction of --lr"),
    TRUN("--warmup-steps", OPT_I64, warmup_steps, "linear warm-up steps"),
    TRUN("--weight-decay", OPT_DOUBLE, weight_decay, "AdamW decay (2-D weights only)"),
    TRUN("--beta1", OPT_DOUBLE, beta1, "AdamW beta1"),
    TRUN("--beta2", OPT_DOUBLE, beta2, "AdamW beta2"),
    TRUN("--eps", OPT_DOUBLE, eps, "AdamW epsilon"),
    TRUN("--grad-clip", OPT_DOUBLE, grad_clip, "global gradient norm clip (0 disables)"),
    TRUN("--max-bad-steps", OPT_INT, max_bad_steps, "stop after this many NaN/Inf steps in a row"),
    TRUN("--seed", OPT_U64, seed, "seed of the initial weights and the data order"),
    TRUN("--threads", OPT_INT, threads,
         "OpenMP and OpenBLAS threads (default: as the environment gives, all cores)"),
    TRUN("--resume", OPT_STRING, resume,
         "continue from a run folder or checkpoint folder (default: a fresh start)"),
    TRUN("--exit-after-minutes", OPT_DOUBLE, exit_after_minutes,
         "save a checkpoint and stop after this many minutes; SIGTERM and SIGINT do the same at "
         "once (default: no limit)"),
    TRUN("--comm-timeout", OPT_DOUBLE, comm_timeout,
         "seconds without progress before the job is ended: 0 (never) or at least 1"),
    CLI_GROUP("output"),
    TRUN("--out", OPT_STRING, out, "output folder: metrics.jsonl, loss.svg, checkpoints/"),
    TRUN("--save-every", OPT_I64, save_every,
         "checkpoint every N steps (default: at the end only)"),
    TRUN("--no-save", OPT_FLAG, no_save, "do not write a checkpoint at the end"),
    TRUN("--keep-last", OPT_INT, keep_last, "keep only the newest N checkpoints (default: all)"),
    TRUN("--eval-every", OPT_I64, eval_every, "validation every N steps (0 disables)"),
    TRUN("--eval-batches", OPT_INT, eval_batches,
         "global batches per validation (Megatron eval-iters)"),
    TRUN("--log-every", OPT_I64, log_every, "progress line every N steps"),
    TRUN("--progress", OPT_STRING, progress,
         "progress bar: auto (a terminal, not under mpirun), on, off"),
    TRUN("--trace", OPT_STRING, trace,
         "write a Chrome trace-event JSON (Perfetto) of the run, one track per rank and stream "
         "(default: none)"),
};
#define NTRAIN ((int)(sizeof train_opts / sizeof train_opts[0]))

void cli_train_args_defaults(cli_train_args *args) {
    memset(args, 0, sizeof *args);
    loom_train_config_defaults(&args->run);
    loom_layout_flags_defaults(&args->layout);
}

static int wants_help(int argc, char **argv) {
    return cli_find_flag(argc, argv, "--help") >= 0 || cli_find_flag(argc, argv, "-h") >= 0;
}

/* The --config FILE (or --config=FILE) argument, read before the flags so that flags win. */
static loom_status find_config(int argc, char **argv, const char **path) {
    *path = NULL;
    for (int i = 2; i < argc; i++) {
        const char *value = NULL;
        if (!strcmp(argv[i], "--config")) {
            value = i + 1 < argc ? argv[i + 1] : "";
        } else if (!strncmp(argv[i], "--config=", 9)) {
            value = argv[i] + 9;
        } else {
            continue;
        }
        if (*path) return loom_fail(LOOM_ERR_INPUT, "--config: expected one file, got two");
        if (!value[0]) return loom_fail(LOOM_ERR_INPUT, "--config: expected a JSON file path");
        *path = value;
    }
    return LOOM_OK;
}

/* What a plan file sets: with --plan FILE these flags (or config keys) would contradict it, and
 * so would every compression flag (the fields of layout.compression, see plan_owns). */
static const char *const plan_owned[] = {"--model",
                                         "--layers",
                                         "--heads",
                                         "--d-model",
                                         "--context",
                                         "--vocab",
                                         "--arch",
                                         "--kv-heads",
                                         "--ffn-dim",
                                         "--tie-embeddings",
                                         "--rope-theta",
                                         "--norm-eps",
                                         "--data-parallel",
                                         "--tensor-parallel",
                                         "--pipeline-parallel",
                                         "--micro-batch-size",
                                         "--global-batch-size",
                                         "--micro-batches",
                                         "--schedule",
                                         "--virtual-stages",
                                         "--stage-layers",
                                         "--recompute",
                                         "--recompute-always",
                                         "--sequence-parallel",
                                         "--zero3-prefetch",
                                         "--zero3-gather",
                                         "--islands",
                                         "--inner-steps",
                                         "--outer-optimizer",
                                         "--outer-lr",
                                         "--outer-momentum",
                                         "--outer-fragments",
                                         "--outer-overlap-steps",
                                         "--outer-compression",
                                         "--outer-compression-rank",
                                         "--outer-topk-fraction"};

static int plan_owns(const cli_opt *opt) {
    size_t first = offsetof(cli_train_args, layout.compression);
    if (opt->offset >= first && opt->offset < first + sizeof(loom_plan_compression_flags)) return 1;
    for (size_t j = 0; j < sizeof plan_owned / sizeof plan_owned[0]; j++)
        if (!strcmp(opt->flag, plan_owned[j])) return 1;
    return 0;
}

static loom_status refuse_plan_conflicts(const cli_train_args *args, const unsigned char *seen) {
    for (int i = 0; i < NTRAIN; i++) {
        if (!seen[i] || !plan_owns(&train_opts[i])) continue;
        return loom_fail(LOOM_ERR_INPUT,
                         "--plan %s: %s sets what the plan file sets (model, layout, batch sizes, "
                         "schedule, stages, compression); change the plan (loom plan) or drop %s",
                         args->plan, train_opts[i].flag, train_opts[i].flag);
    }
    return LOOM_OK;
}

static int option_seen(const unsigned char *seen, const char *flag) {
    for (int i = 0; i < NTRAIN; i++)
        if (!strcmp(train_opts[i].flag, flag)) return seen[i];
    return 0;
}

/* A path loom_path_join refused, named with the flag it came from. */
static loom_status flag_path_error(const char *flag, loom_status st) {
    char why[2048];
    snprintf(why, sizeof why, "%s", loom_last_error());
    return loom_fail(st, "%s: %s", flag, why);
}

/* Files written at the end of a run are checked at its start: a bad path must not cost the run. */
static loom_status check_output_paths(const loom_train_config *cfg) {
    struct stat st;
    if (stat(cfg->out, &st) == 0 && !S_ISDIR(st.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT, "--out: %s exists and is not a directory", cfg->out);
    }
    if (!cfg->trace[0]) return LOOM_OK;
    if (stat(cfg->trace, &st) == 0 && S_ISDIR(st.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT, "--trace: %s is a directory; expected a file to write",
                         cfg->trace);
    }
    char dir[LOOM_PATH_MAX];
    loom_status joined = loom_path_join(dir, sizeof dir, NULL, cfg->trace);
    if (joined != LOOM_OK) return flag_path_error("--trace", joined);
    char *slash = strrchr(dir, '/');
    if (!slash)
        dir[0] = '.', dir[1] = '\0';
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    /* a folder that does not exist yet (often inside --out) is made now, not at the end */
    if (stat(dir, &st) != 0 && loom_mkdir_p(dir) != LOOM_OK) {
        return loom_fail(LOOM_ERR_INPUT, "--trace: %s: cannot make its folder %s", cfg->trace, dir);
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK) != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--trace: %s: expected a file in a writable folder, and "
                         "%s is not one",
                         cfg->trace, dir);
    }
    return LOOM_OK;
}

/* A setting's message names where the bad value came from. The checks below the CLI name a
 * setting by its key ("config: heads: ...", "model configuration: heads: ...") or by its flag
 * ("--micro-batch-size: ..."); the message is made to name the flag that set it, or the --config
 * file and its key. A value nobody set (a default, or derived) keeps the message as it is. */
static void name_origin(const char *path, const unsigned char *in_file,
                        const unsigned char *in_flags) {
    static const char *const prefixes[] = {"config: ", "model configuration: "};
    const char *msg = loom_last_error();
    const char *rest = msg;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        if (!strncmp(msg, prefixes[i], strlen(prefixes[i]))) rest = msg + strlen(prefixes[i]);
    }
    for (int i = 0; i < NTRAIN; i++) {
        if (train_opts[i].offset == CLI_OPT_SKIP || !(in_file[i] || in_flags[i])) continue;
        char key[64];
        snprintf(key, sizeof key, "%s", train_opts[i].flag + 2);
        for (char *p = key; *p; p++) *p = *p == '-' ? '_' : *p;
        size_t kn = strlen(key), fn = strlen(train_opts[i].flag);
        const char *tail = NULL;
        if (rest != msg && !strncmp(rest, key, kn) && rest[kn] == ':') tail = rest + kn;
        if (!strncmp(msg, train_opts[i].flag, fn) && (msg[fn] == ':' || msg[fn] == ' ')) {
            tail = msg + fn;
        }
        if (!tail) continue;
        char renamed[2048];
        if (in_flags[i]) { /* a flag wins over the file */
            snprintf(renamed, sizeof renamed, "%s%s", train_opts[i].flag, tail);
        } else {
            snprintf(renamed, sizeof renamed, "%s: key \"%s\"%s", path, key, tail);
        }
        loom_fail(LOOM_ERR_INPUT, "%s", renamed);
        return;
    }
}

/* --plan auto plans the layout from the model, the global batch and the sequence length; the
 * flags that would set the rest (layout, micro batch, schedule, stages, compression) are refused
 * by name. */
static loom_status refuse_auto_conflicts(const unsigned char *seen) {
    static const char *const inputs[] = {"--model",
                                         "--layers",
                                         "--heads",
                                         "--d-model",
                                         "--context",
                                         "--vocab",
                                         "--arch",
                                         "--kv-heads",
                                         "--ffn-dim",
                                         "--tie-embeddings",
                                         "--rope-theta",
                                         "--norm-eps",
                                         "--global-batch-size"};
    for (int i = 0; i < NTRAIN; i++) {
        if (!seen[i] || !plan_owns(&train_opts[i])) continue;
        int input = 0;
        for (size_t j = 0; j < sizeof inputs / sizeof inputs[0]; j++)
            input |= !strcmp(train_opts[i].flag, inputs[j]);
        if (input) continue;
        if (!strncmp(train_opts[i].flag, "--islands", 9) ||
            !strncmp(train_opts[i].flag, "--inner", 7) ||
            !strncmp(train_opts[i].flag, "--outer", 7)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "--plan auto: %s: the planner does not plan islands yet; write the "
                             "plan with loom plan (its flags take --islands) and pass --plan FILE",
                             train_opts[i].flag);
        }
        return loom_fail(LOOM_ERR_INPUT,
                         "--plan auto: %s sets what the planner chooses (layout, micro batch, "
                         "schedule, stages; it plans without compression); drop %s, or write "
                         "the plan yourself (loom plan) and pass --plan FILE",
                         train_opts[i].flag, train_opts[i].flag);
    }
    return LOOM_OK;
}

/* A plan file's layout is the file's, but for the flags that say how it runs over the
 * data-parallel ranks (--zero and its aliases, --no-overlap-grad-reduce): given, they win over
 * the file and are written into the plan, which is checked again. Every decision is then the
 * plan's before the runtime starts. */
static loom_status settle_plan_flags(const cli_train_args *args, loom_plan *plan,
                                     const char *source, int world_size) {
    int zero;
    loom_status st = loom_layout_flags_zero(&args->layout, &zero);
    if (st != LOOM_OK) return st;
    if (zero >= 0) plan->zero = zero;
    if (args->layout.no_overlap_grad_reduce) plan->overlap_grad_reduce = 0;
    st = loom_plan_check(plan, source, world_size);
    /* what this build cannot run of it, named by the file now (loom_train names "plan") */
    if (st == LOOM_OK) st = loom_parallel_check_plan(plan, source);
    return st;
}

static loom_status build_plan(const cli_train_args *args, const unsigned char *seen,
                              loom_comm *world, loom_plan *plan) {
    int world_size = world ? loom_comm_size(world) : 1;
    loom_plan_init(plan);
    if (args->cluster[0] && strcmp(args->plan, "auto") != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--cluster %s: only with --plan auto (the planner's "
                         "input)",
                         args->cluster);
    }
    if (args->allow_compression[0] && strcmp(args->plan, "auto") != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--allow-compression %s: only with --plan auto (the planner's choice; "
                         "to compress yourself use --dp-compression / --pp-compression)",
                         args->allow_compression);
    }
    if (!strcmp(args->plan, "auto")) {
        loom_status st = refuse_auto_conflicts(seen);
        if (st == LOOM_OK) st = cli_plan_auto(args, world, plan);
        if (st == LOOM_OK) st = settle_plan_flags(args, plan, "--plan auto", world_size);
        return st;
    }
    if (!args->plan[0]) return loom_train_plan(&args->run, &args->layout, world_size, plan);
    loom_status st = refuse_plan_conflicts(args, seen);
    if (st == LOOM_OK) st = loom_plan_read(args->plan, plan);
    if (st == LOOM_OK) st = settle_plan_flags(args, plan, args->plan, world_size);
    return st;
}

/* The resolved values of the model and the layout, for the configuration table. */
static void show_plan(cli_train_args *args, const loom_plan *plan) {
    const loom_gpt_config *m = &plan->model;
    loom_train_config *run = &args->run;
    run->layers = m->num_layers, run->heads = m->num_heads, run->d_model = m->channels;
    run->context = m->max_seq_len, run->vocab = m->vocab_size;
    if (run->bucket_mb <= 0) run->bucket_mb = loom_grad_bucket_default_mb(plan->dp);
    loom_layout_flags *l = &args->layout;
    l->data_parallel = plan->dp, l->tensor_parallel = plan->tp, l->pipeline_parallel = plan->pp;
    l->micro_batch_size = plan->micro_batch, l->global_batch_size = plan->global_batch;
    l->micro_batches = loom_plan_num_micro_batches(plan);
    snprintf(l->schedule, sizeof l->schedule, "%s", loom_schedule_kind_name(plan->schedule));
    l->zero = plan->zero, l->zero1 = l->no_zero1 = 0;
    l->no_overlap_grad_reduce = !plan->overlap_grad_reduce;
    l->virtual_stages = plan->virtual_stages;
    size_t used = 0;
    l->stage_layers[0] = '\0';
    for (int s = 0; s < plan->num_stages && used < sizeof l->stage_layers; s++) {
        used +=
            (size_t)snprintf(l->stage_layers + used, sizeof l->stage_layers - used, "%s%d",
                             s ? "," : "", plan->stages[s].end_layer - plan->stages[s].first_layer);
    }
    loom_plan_compression_flags_of(plan, &l->compression);
    /* the islands' settings as the plan has them (a plan file's, or the flags' resolved) */
    const loom_plan_islands *is = &plan->islands;
    l->islands = is->count;
    if (is->count > 0) {
        l->inner_steps = is->inner_steps, l->outer_lr = is->lr, l->outer_momentum = is->momentum;
        l->outer_fragments = is->fragments, l->outer_overlap_steps = is->overlap_steps;
        snprintf(l->outer_optimizer, sizeof l->outer_optimizer, "%s",
                 loom_outer_optimizer_name(is->optimizer));
        snprintf(l->outer_compression, sizeof l->outer_compression, "%s",
                 is->compression == LOOM_COMPRESS_NONE
                     ? ""
                     : loom_compress_method_name(is->compression));
        if (is->compression_rank > 0) l->outer_compression_rank = is->compression_rank;
        if (is->compression_fraction > 0) l->outer_topk_fraction = is->compression_fraction;
    }
}

/* Rank 0 says where the ZeRO stage came from when there are replicas: the plan file's, a flag,
 * or the default rule (loom_plan_default_zero), naming data-parallel compression when it is
 * what turned ZeRO-1 off. */
static void say_zero(const cli_train_args *args, const loom_plan *plan) {
    if (plan->dp < 2) return;
    const char *on = plan->zero ? "on" : "off";
    const loom_layout_flags *l = &args->layout;
    int given = l->zero >= 0 || l->zero1 || l->no_zero1;
    if (given) {
        loom_info("ZeRO-1 %s: --zero %d", on, plan->zero);
    } else if (args->plan[0]) {
        loom_info("ZeRO-1 %s: the plan's mesh.zero", on);
    } else if (plan->dp_compression.method != LOOM_COMPRESS_NONE) {
        loom_info("ZeRO-1 off: data-parallel compression (%s) — ZeRO-1's parameter all-gather "
                  "cannot be compressed and is as large as the gradient; pass --zero 1 to "
                  "combine them",
                  loom_compress_method_name(plan->dp_compression.method));
    }
}

int cmd_train(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        cli_train_args defaults;
        cli_train_args_defaults(&defaults);
        cli_print_help("usage: loom train [--config FILE.json] [options]", train_opts, NTRAIN,
                       &defaults);
        return 0;
    }
    loom_comm *world = NULL;
    loom_status init = cli_start_mpi(&argc, &argv, &world);
    if (init != LOOM_OK) return cli_fail(init);
    cli_train_args args;
    cli_train_args_defaults(&args);
    unsigned char seen[NTRAIN], in_file[NTRAIN], in_flags[NTRAIN];
    memset(in_file, 0, sizeof in_file);
    memset(in_flags, 0, sizeof in_flags);
    const char *config_path = NULL;
    loom_status st = find_config(argc, argv, &config_path);
    if (st == LOOM_OK && config_path) {
        st = cli_parse_json(&args, train_opts, NTRAIN, config_path, in_file);
    }
    if (st == LOOM_OK) st = cli_parse_flags(&args, train_opts, NTRAIN, argc, argv, 2, in_flags);
    for (int i = 0; i < NTRAIN; i++) seen[i] = in_file[i] || in_flags[i];
    loom_train_config *cfg = &args.run;
    if (st == LOOM_OK) st = loom_train_config_check(cfg);
    if (st == LOOM_OK) st = check_output_paths(cfg);
    if (st == LOOM_OK && !cfg->val_data[0] && cfg->eval_every > 0 &&
        option_seen(seen, "--eval-every") && (!world || loom_comm_rank(world) == 0)) {
        loom_warn("--eval-every %lld: there is no --val-data, so no validation runs",
                  (long long)cfg->eval_every);
    }
    loom_plan plan;
    loom_plan_init(&plan);
    if (st == LOOM_OK) st = build_plan(&args, seen, world, &plan);
    if (st != LOOM_OK) name_origin(config_path, in_file, in_flags);
    /* a bad configuration is the same on every rank: each says so and exits cleanly */
    if (st != LOOM_OK) {
        loom_plan_free(&plan);
        return cli_finish(world, cli_fail(st));
    }
    int rank0 = !world || loom_comm_rank(world) == 0;
    if (rank0) say_zero(&args, &plan);
    if (rank0) {
        cli_train_args shown = args;
        show_plan(&shown, &plan);
        cli_print_table(&shown, train_opts, NTRAIN);
    }
    st = loom_train(cfg, &plan, world, NULL);
    loom_plan_free(&plan);
    return cli_finish(world, st == LOOM_OK ? 0 : cli_fail(st));
}

/* ---- prepare ---- */

typedef struct {
    char out[LOOM_PATH_MAX];
    double val_fraction;
    int seq_len;
    int64_t shard_tokens;
    char tokenizer[LOOM_PATH_MAX];
    int threads;
    char text_placeholder[2];
} prepare_args;

#define POPT(...) CLI_OPT(prepare_args, __VA_ARGS__)

static const cli_opt prepare_opts[] = {
    CLI_GROUP("run"),
    {"--text", OPT_STRING, CLI_OPT_SKIP, 0,
     "text files (one document each); several allowed (default: none, give one)", 0},
    POPT("--tokenizer", OPT_STRING, tokenizer,
         "bytes (default), or a byte-level BPE (GPT-2's, or Llama 3's tokenizer.json): a folder "
         "with vocab.json + merges.txt or tokenizer.json, or one of those files"),
    POPT("--val-fraction", OPT_DOUBLE, val_fraction, "share of each file kept for validation"),
    POPT("--seq-len", OPT_INT, seq_len,
         "planned training sequence length: each file's val part gets at least one window"),
    POPT("--threads", OPT_INT, threads, "threads that tokenise (default: all cores)"),
    CLI_GROUP("output"),
    POPT("--out", OPT_STRING, out,
         "output folder for train_*.bin and val_*.bin (default: none, give one)"),
    POPT("--shard-tokens", OPT_I64, shard_tokens, "tokens per shard at most"),
};

static prepare_args prepare_defaults(void) {
    prepare_args args = {.val_fraction = 0.1, .seq_len = 256, .shard_tokens = 100000000};
    snprintf(args.tokenizer, sizeof args.tokenizer, "bytes");
    return args;
}
#define NPREPARE ((int)(sizeof prepare_opts / sizeof prepare_opts[0]))

int cmd_prepare(int argc, char **argv) {
    const char *usage = "usage: loom prepare --text FILE [FILE...] --out DIR [options]";
    prepare_args args = prepare_defaults();
    if (wants_help(argc, argv)) {
        cli_print_help(usage, prepare_opts, NPREPARE, &args);
        return 0;
    }
    const char **texts = calloc((size_t)argc, sizeof *texts);
    char **rest = calloc((size_t)argc, sizeof *rest);
    if (!texts || !rest) {
        free(texts), free(rest);
        return cli_fail(loom_fail(LOOM_ERR_NOMEM, "out of memory"));
    }
    int ntexts = 0, nrest = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--text")) {
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) texts[ntexts++] = argv[++i];
        } else if (!strncmp(argv[i], "--text=", 7) && argv[i][7]) {
            texts[ntexts++] = argv[i] + 7;
        } else {
            rest[nrest++] = argv[i];
        }
    }
    loom_status st = cli_parse_flags(&args, prepare_opts, NPREPARE, nrest, rest, 0, NULL);
    if (st == LOOM_OK && ntexts == 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--text: expected at least one text file (%s)", usage);
    }
    if (st == LOOM_OK && !args.out[0]) st = loom_fail(LOOM_ERR_INPUT, "--out: expected a folder");
    if (st == LOOM_OK && !(args.val_fraction >= 0 && args.val_fraction < 1)) {
        st = loom_fail(LOOM_ERR_INPUT, "--val-fraction: expected a number in [0, 1), got %g",
                       args.val_fraction);
    }
    if (st == LOOM_OK && args.seq_len <= 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--seq-len: expected a positive integer, got %d",
                       args.seq_len);
    }
    if (st == LOOM_OK && args.shard_tokens <= 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--shard-tokens: expected a positive integer, got %lld",
                       (long long)args.shard_tokens);
    }
    if (st == LOOM_OK && args.threads < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--threads: expected >= 0 (0 = all cores), got %d",
                       args.threads);
    }
    loom_tokenizer *tok = NULL;
    if (st == LOOM_OK) st = loom_tokenizer_open(&tok, args.tokenizer);
    if (st == LOOM_OK) {
        loom_prepare_opts opts = loom_prepare_default_opts();
        opts.val_fraction = args.val_fraction;
        opts.shard_tokens = (size_t)args.shard_tokens;
        opts.min_val_tokens = (size_t)args.seq_len + 1;
        opts.tokenizer = tok;
        opts.threads = args.threads;
        st = loom_prepare_text(texts, ntexts, args.out, &opts);
    }
    loom_tokenizer_free(tok);
    free(texts), free(rest);
    return st == LOOM_OK ? 0 : cli_fail(st);
}

/* ---- sample ---- */

/* The tokenizer for the model at `path`: --tokenizer (`given`) when set, else the one the model
 * records, else bytes unless the vocabulary is GPT-2's size or more (then one must be given). A
 * tokenizer the model's vocabulary cannot hold, or another than the model records, is refused
 * by name. */
static loom_status model_tokenizer(const char *path, const char *given, loom_tokenizer **tok) {
    *tok = NULL;
    loom_gpt_config config;
    char name[16], source[1024];
    loom_status st = loom_model_config_of(path, &config);
    if (st == LOOM_OK) st = loom_model_tokenizer_of(path, name, sizeof name, source, sizeof source);
    if (st != LOOM_OK) return st;
    const char *spec = given;
    if (!spec[0] && !strcmp(name, "bytes")) spec = "bytes";
    if (!spec[0] && !strcmp(name, "gpt2") && source[0]) spec = source;
    if (!spec[0] && (name[0] || config.vocab_size >= LOOM_GPT2_VOCAB)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: the model (vocabulary %d) %s; give --tokenizer (GPT-2's folder with "
                         "vocab.json + merges.txt, tokenizer.json or gpt2_tokenizer.bin)",
                         path, config.vocab_size,
                         name[0] ? "records GPT-2's tokenizer but not its files"
                                 : "records no tokenizer");
    }
    if (!spec[0]) spec = "bytes"; /* loom's byte models from before tokenizers were recorded */
    st = loom_tokenizer_open(tok, spec);
    if (st != LOOM_OK && !given[0]) {
        char why[2048];
        snprintf(why, sizeof why, "%s", loom_last_error());
        return loom_fail(st,
                         "%s records the %s tokenizer from %s, which cannot be opened (%s); "
                         "give --tokenizer",
                         path, name, source, why);
    }
    if (st == LOOM_OK) st = loom_tokenizer_check_vocab(*tok, config.vocab_size, path);
    if (st == LOOM_OK && name[0] && strcmp(name, loom_tokenizer_name(*tok)) != 0) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "--tokenizer %s is the %s tokenizer, but the model %s was trained with the "
                       "%s tokenizer%s%s",
                       given, loom_tokenizer_name(*tok), path, name, source[0] ? " from " : "",
                       source);
    }
    if (st != LOOM_OK) {
        loom_tokenizer_free(*tok);
        *tok = NULL;
    }
    return st;
}

typedef struct {
    char checkpoint[LOOM_PATH_MAX];
    char tokenizer[LOOM_PATH_MAX];
    char prompt[4096];
    int tokens, top_k, threads;
    double temperature;
    uint64_t seed;
} sample_args;

#define SOPT(...) CLI_OPT(sample_args, __VA_ARGS__)

static const cli_opt sample_opts[] = {
    CLI_GROUP("model"),
    SOPT("--checkpoint", OPT_STRING, checkpoint,
         "run folder, checkpoint folder, .safetensors or llm.c .bin (default: none, give one)"),
    SOPT("--tokenizer", OPT_STRING, tokenizer,
         "bytes, or a byte-level BPE's files, GPT-2's or Llama 3's (default: the one the model "
         "records, or the copy in its folder)"),
    CLI_GROUP("run"),
    SOPT("--prompt", OPT_STRING, prompt,
         "text to continue (default: none, start from the end-of-text token)"),
    SOPT("--tokens", OPT_INT, tokens, "tokens to generate"),
    SOPT("--temperature", OPT_DOUBLE, temperature, "softmax temperature (0 = greedy)"),
    SOPT("--top-k", OPT_INT, top_k, "sample among the k most likely (0 = all)"),
    SOPT("--seed", OPT_U64, seed, "sampling seed"),
    SOPT("--threads", OPT_INT, threads, "threads (default: all cores)"),
};
#define NSAMPLE ((int)(sizeof sample_opts / sizeof sample_opts[0]))

int cmd_sample(int argc, char **argv) {
    sample_args args = {.tokens = 200, .top_k = 40, .temperature = 0.8, .seed = 42};
    if (wants_help(argc, argv)) {
        cli_print_help("usage: loom sample --checkpoint PATH [--prompt TEXT] [--tokens N]",
                       sample_opts, NSAMPLE, &args);
        return 0;
    }
    loom_status st = cli_parse_flags(&args, sample_opts, NSAMPLE, argc, argv, 2, NULL);
    if (st == LOOM_OK && !args.checkpoint[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--checkpoint: expected a path");
    }
    /* checked here too, so that a bad value is reported before the model is loaded */
    if (st == LOOM_OK && args.tokens < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--tokens: expected >= 0, got %d", args.tokens);
    }
    if (st == LOOM_OK && args.top_k < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--top-k: expected >= 0 (0 = all), got %d", args.top_k);
    }
    if (st == LOOM_OK && args.temperature < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--temperature: expected a number >= 0, got %g",
                       args.temperature);
    }
    if (st == LOOM_OK && args.threads < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--threads: expected >= 0 (0 = default), got %d",
                       args.threads);
    }
    if (st != LOOM_OK) return cli_fail(st);
    loom_ops_set_threads(args.threads);
    loom_tokenizer *tok = NULL;
    st = model_tokenizer(args.checkpoint, args.tokenizer, &tok);
    if (st != LOOM_OK) return cli_fail(st);
    loom_gpt *model;
    st = loom_model_load(args.checkpoint, loom_backend_cpu(), &model);
    if (st == LOOM_OK) {
        loom_sample_opts opts = {args.tokens, args.temperature, args.top_k, args.seed};
        st = loom_sample_text(model, tok, args.prompt, &opts, stdout);
        loom_gpt_free(model);
    }
    loom_tokenizer_free(tok);
    return st == LOOM_OK ? 0 : cli_fail(st);
}

/* ---- eval ---- */

typedef struct {
    char checkpoint[LOOM_PATH_MAX];
    char data[LOOM_PATH_MAX];
    char text[LOOM_PATH_MAX];
    char tokenizer[LOOM_PATH_MAX];
    int seq_len, batch, threads;
    int64_t max_windows;
} eval_args;

#define EOPT(...) CLI_OPT(eval_args, __VA_ARGS__)

static const cli_opt eval_opts[] = {
    CLI_GROUP("model"),
    EOPT("--checkpoint", OPT_STRING, checkpoint,
         "run folder, checkpoint folder, .safetensors or llm.c .bin (default: none, give one)"),
    EOPT("--tokenizer", OPT_STRING, tokenizer,
         "bytes, or a byte-level BPE's files, GPT-2's or Llama 3's (default: the one the model "
         "records, or the copy in its folder); checked against the model"),
    CLI_GROUP("run"),
    EOPT("--data", OPT_STRING, data, "token shards (glob; default: none, give it or --text)"),
    EOPT("--text", OPT_STRING, text,
         "a text file instead of --data, tokenised as prepare does (one document; default: "
         "none)"),
    EOPT("--seq-len", OPT_INT, seq_len, "window length (default: the model's context)"),
    EOPT("--batch", OPT_INT, batch, "windows per forward pass"),
    EOPT("--max-windows", OPT_I64, max_windows, "stop after this many windows (default: all)"),
    EOPT("--threads", OPT_INT, threads, "threads (default: all cores)"),
};
#define NEVAL ((int)(sizeof eval_opts / sizeof eval_opts[0]))

/* --text FILE: the file as `loom prepare` tokenises it (one document, no validation split), in
 * a scratch folder made here; data gets the shard's path. */
static loom_status tokenise_for_eval(const char *text, const loom_tokenizer *tok, char *scratch,
                                     char *data) {
    snprintf(scratch, 64, "/tmp/loom-eval-XXXXXX");
    if (!mkdtemp(scratch)) {
        scratch[0] = '\0';
        return loom_fail(LOOM_ERR_IO, "--text: cannot make a scratch folder in /tmp");
    }
    loom_prepare_opts opts = loom_prepare_default_opts();
    opts.val_fraction = 0, opts.min_val_tokens = 0, opts.tokenizer = tok;
    const char *paths[] = {text};
    loom_log_set_level(LOOM_LOG_WARN);
    loom_status st = loom_prepare_text(paths, 1, scratch, &opts);
    loom_log_set_level(LOOM_LOG_INFO);
    if (st == LOOM_OK) st = loom_path_join(data, LOOM_PATH_MAX, scratch, "train_000000.bin");
    return st;
}

static void remove_scratch(const char *scratch) {
    char path[128];
    if (loom_path_join(path, sizeof path, scratch, "train_000000.bin") == LOOM_OK) unlink(path);
    rmdir(scratch);
}

int cmd_eval(int argc, char **argv) {
    eval_args args = {.batch = 4};
    if (wants_help(argc, argv)) {
        cli_print_help("usage: loom eval --checkpoint PATH --data FILE|--text FILE", eval_opts,
                       NEVAL, &args);
        return 0;
    }
    loom_status st = cli_parse_flags(&args, eval_opts, NEVAL, argc, argv, 2, NULL);
    if (st == LOOM_OK && !args.checkpoint[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--checkpoint: expected a path (both --checkpoint and "
                                       "--data are required)");
    }
    if (st == LOOM_OK && !args.data[0] && !args.text[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--data: expected token shards (a glob; both --checkpoint "
                                       "and --data are required)");
    }
    if (st == LOOM_OK && args.data[0] && args.text[0]) {
        st = loom_fail(LOOM_ERR_INPUT, "--data and --text: expected one of them");
    }
    if (st == LOOM_OK && args.seq_len < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--seq-len: expected >= 0 (0 = the model's context), got %d",
                       args.seq_len);
    }
    if (st == LOOM_OK && args.batch <= 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--batch: expected a positive integer, got %d", args.batch);
    }
    if (st == LOOM_OK && args.max_windows < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--max-windows: expected >= 0 (0 = all), got %lld",
                       (long long)args.max_windows);
    }
    if (st == LOOM_OK && args.threads < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--threads: expected >= 0 (0 = default), got %d",
                       args.threads);
    }
    if (st != LOOM_OK) return cli_fail(st);
    loom_ops_set_threads(args.threads);
    /* shards need no tokenizer: one is resolved (and checked against the model) for --text, or
     * when --tokenizer is given */
    loom_tokenizer *tok = NULL;
    if (args.text[0] || args.tokenizer[0])
        st = model_tokenizer(args.checkpoint, args.tokenizer, &tok);
    char scratch[64] = "";
    if (st == LOOM_OK && args.text[0]) st = tokenise_for_eval(args.text, tok, scratch, args.data);
    loom_tokenizer_free(tok);
    loom_gpt *model = NULL;
    if (st == LOOM_OK) st = loom_model_load(args.checkpoint, loom_backend_cpu(), &model);
    int T = model && args.seq_len > 0 ? args.seq_len : model ? model->config.max_seq_len : 0;
    double loss = 0.0;
    int64_t tokens = 0;
    if (st == LOOM_OK) {
        st = loom_eval_loss(model, args.data, T, args.batch, args.max_windows, &loss, &tokens);
    }
    loom_gpt_free(model);
    if (scratch[0]) remove_scratch(scratch);
    if (st != LOOM_OK && scratch[0] && strstr(loom_last_error(), scratch)) {
        char why[2048];
        snprintf(why, sizeof why, "%s", loom_last_error());
        st = loom_fail(st, "--text %s: %s", args.text, why);
    }
    if (st != LOOM_OK) return cli_fail(st);
    printf("loss %.6f  perplexity %.4f  tokens %lld  (windows of %d)\n", loss, exp(loss),
           (long long)tokens, T);
    return 0;
}

/* ---- bench --train: training steps of any layout on synthetic tokens ---- */

/* count uniform tokens of the model's vocabulary as a shard at path, in the width `prepare`
 * would write for it (uint32 past 65536 ids, as Llama 3's). */
static loom_status write_synthetic_tokens(const char *path, size_t count,
                                          const loom_gpt_config *model, uint64_t seed) {
    uint64_t vocab = (uint64_t)model->vocab_size;
    if (loom_shard_token_width(model->vocab_size) == 2) {
        uint16_t *tokens = loom_malloc(count * sizeof *tokens, "synthetic tokens");
        if (!tokens) return LOOM_ERR_NOMEM;
        for (size_t i = 0; i < count; i++) tokens[i] = (uint16_t)(loom_rng_u64(seed, 7, i) % vocab);
        loom_status st = loom_shard_write(path, tokens, count);
        free(tokens);
        return st;
    }
    uint32_t *tokens = loom_malloc(count * sizeof *tokens, "synthetic tokens");
    if (!tokens) return LOOM_ERR_NOMEM;
    for (size_t i = 0; i < count; i++) tokens[i] = (uint32_t)(loom_rng_u64(seed, 7, i) % vocab);
    loom_status st = loom_shard_write_wide(path, tokens, count);
    free(tokens);
    return st;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Summarises metrics.jsonl after `warmup` steps: medians of ms and tokens/s and MFU, and the
 * share of the step each group's communication kept this rank waiting. */
static loom_status bench_report(const loom_train_config *cfg, const loom_plan *plan, int ranks,
                                int warmup) {
    char path[LOOM_PATH_MAX + 32];
    loom_metrics_record *records;
    size_t count;
    loom_status st = loom_path_join(path, sizeof path, cfg->out, "metrics.jsonl");
    if (st == LOOM_OK) st = loom_metrics_read(path, &records, &count);
    if (st != LOOM_OK) return st;
    double *ms = calloc(count + 1, sizeof(double)), *tps = calloc(count + 1, sizeof(double));
    double *mfu = calloc(count + 1, sizeof(double)), wait[3] = {0}, total_s = 0.0;
    size_t n = 0;
    for (size_t i = 0; ms && tps && mfu && i < count; i++) {
        const loom_metrics_record *r = &records[i];
        if (r->is_validation || r->step <= warmup || !isfinite(r->ms)) continue;
        ms[n] = r->ms, tps[n] = r->tokens_per_s, mfu[n] = r->mfu;
        total_s += r->ms / 1e3;
        for (int g = 0; g < 3; g++) wait[g] += isfinite(r->comm_s[g]) ? r->comm_s[g] : 0.0;
        n++;
    }
    if (!ms || !tps || !mfu) {
        st = loom_fail(LOOM_ERR_NOMEM, "bench: out of memory");
    } else if (n == 0) {
        st = loom_fail(LOOM_ERR_INPUT, "bench: no timed steps (steps %lld <= warmup %d)",
                       (long long)cfg->steps, warmup);
    } else {
        qsort(ms, n, sizeof(double), compare_double);
        qsort(tps, n, sizeof(double), compare_double);
        qsort(mfu, n, sizeof(double), compare_double);
        printf("layout dp %d tp %d pp %d (%s, %d ranks, %d threads each), micro %d seq %d global "
               "%d | %8.1f ms/step | %8.0f tok/s | MFU %5.1f%% | waiting on dp %4.1f%% tp %4.1f%% "
               "pp %4.1f%% of the step (rank 0)\n",
               plan->dp, plan->tp, plan->pp,
               plan->pp > 1 ? loom_schedule_kind_name(plan->schedule) : "no pipeline", ranks,
               loom_ops_get_threads(), plan->micro_batch, cfg->seq_len, plan->global_batch,
               ms[n / 2], tps[n / 2], 100 * mfu[n / 2], 100 * wait[0] / total_s,
               100 * wait[1] / total_s, 100 * wait[2] / total_s);
    }
    free(records), free(ms), free(tps), free(mfu);
    return st;
}

/* bench --train's defaults: gpt2, micro 4, global 8, sequences of 64, 12 steps, no checkpoint. */
static void bench_train_defaults(cli_train_args *args) {
    cli_train_args_defaults(args);
    loom_train_config *cfg = &args->run;
    snprintf(cfg->model, sizeof cfg->model, "gpt2");
    args->layout.micro_batch_size = 4, args->layout.global_batch_size = 8;
    cfg->seq_len = 64, cfg->steps = 12;
    cfg->warmup_steps = 0, cfg->eval_every = 0, cfg->no_save = 1, cfg->log_every = 1000000;
    snprintf(cfg->out, sizeof cfg->out, "runs/bench");
}

/* --warmup N (or --warmup=N) at argv[*i]: the untimed steps, a checked integer >= 0. */
static loom_status bench_warmup(int argc, char **argv, int *i, int *warmup) {
    static const cli_opt warmup_opt = {"--warmup", OPT_INT, 0, sizeof(int), NULL, 0};
    const char *arg = argv[*i], *value = NULL;
    if (arg[8] == '=') {
        value = arg + 9;
    } else if (*i + 1 < argc) {
        value = argv[++*i];
    } else {
        return loom_fail(LOOM_ERR_INPUT, "--warmup: expected a value after it");
    }
    loom_status st = cli_set_value(warmup, &warmup_opt, value, "--warmup");
    if (st == LOOM_OK && *warmup < 0) {
        st = loom_fail(LOOM_ERR_INPUT, "--warmup: expected >= 0, got %d", *warmup);
    }
    return st;
}

int cmd_bench_train(int argc, char **argv) {
    cli_train_args args;
    bench_train_defaults(&args);
    if (wants_help(argc, argv)) {
        cli_print_help(
            "usage: [mpirun -np N] loom bench --train [--warmup N] [loom train options]\n"
            "       Training steps of a layout on synthetic tokens; reports the medians of the "
            "steps\n"
            "       after --warmup N (default 2). Defaults that differ from loom train's: "
            "--model gpt2\n"
            "       --micro-batch-size 4 --global-batch-size 8 --seq-len 64 --steps 12 "
            "--warmup-steps 0\n"
            "       --eval-every 0 --no-save --out runs/bench",
            train_opts, NTRAIN, &args);
        return 0;
    }
    loom_comm *world = NULL;
    loom_status st = cli_start_mpi(&argc, &argv, &world);
    if (st != LOOM_OK) return cli_fail(st);
    int ranks = world ? loom_comm_size(world) : 1, rank = world ? loom_comm_rank(world) : 0;
    loom_train_config *cfg = &args.run;
    int warmup = 2;
    /* drop --train and --warmup N; the rest are train flags */
    char **rest = calloc((size_t)argc, sizeof *rest);
    int nrest = 0;
    if (!rest) return cli_finish(world, cli_fail(loom_fail(LOOM_ERR_NOMEM, "out of memory")));
    for (int i = 2; i < argc && st == LOOM_OK; i++) {
        if (!strcmp(argv[i], "--train")) continue;
        if (!strncmp(argv[i], "--warmup", 8) && (argv[i][8] == '\0' || argv[i][8] == '=')) {
            st = bench_warmup(argc, argv, &i, &warmup);
            continue;
        }
        rest[nrest++] = argv[i];
    }
    unsigned char given[NTRAIN];
    memset(given, 0, sizeof given);
    if (st == LOOM_OK) st = cli_parse_flags(&args, train_opts, NTRAIN, nrest, rest, 0, given);
    free(rest);
    /* a plan file's model is the file's, and --arch llama's its default preset, not bench's
     * default (gpt2) */
    if (args.plan[0] && strcmp(args.plan, "auto") != 0 && !option_seen(given, "--model")) {
        cfg->model[0] = '\0';
    }
    if (option_seen(given, "--arch") && !option_seen(given, "--model")) cfg->model[0] = '\0';
    loom_plan plan;
    loom_plan_init(&plan);
    if (st == LOOM_OK) st = build_plan(&args, given, world, &plan);
    /* synthetic tokens, written once by rank 0: enough windows for every step */
    if (st == LOOM_OK) {
        st = loom_path_join(cfg->data, sizeof cfg->data, cfg->out, "synthetic.bin");
        if (st != LOOM_OK) st = flag_path_error("--out", st);
    }
    if (st == LOOM_OK && rank == 0) {
        size_t count =
            ((size_t)cfg->steps * (size_t)plan.global_batch + 2) * (size_t)cfg->seq_len + 1;
        st = loom_mkdir_p(cfg->out);
        if (st == LOOM_OK) st = write_synthetic_tokens(cfg->data, count, &plan.model, cfg->seed);
    }
    if (world && loom_comm_barrier(world) != LOOM_OK && st == LOOM_OK) st = LOOM_ERR_RUNTIME;
    if (st == LOOM_OK) {
        loom_log_set_level(LOOM_LOG_WARN);
        st = loom_train(cfg, &plan, world, NULL);
    }
    if (st == LOOM_OK && rank == 0) st = bench_report(cfg, &plan, ranks, warmup);
    loom_plan_free(&plan);
    return cli_finish(world, st == LOOM_OK ? 0 : cli_fail(st));
}
