/*
 * loom/train.h — the training loop and what surrounds it: the run configuration, learning
 * rate schedules, the AdamW step with global-norm clipping, validation, metrics (progress
 * lines, metrics.jsonl, loss plot), checkpoints every N steps, resume, and generation and
 * evaluation from a checkpoint.
 *
 * The layout comes as a plan (loom/plan.h), the contract; parallel/ executes it. The run
 * configuration holds the rest: which model (for loom_train_plan), the data, the steps, the
 * optimiser and its learning-rate schedule, the output, threads and timeouts.
 *
 * Not here: parsing flags or JSON files (the CLI does that and fills loom_train_config and the
 * layout flags, loom_layout_flags of loom/plan.h).
 */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include "loom/base.h"
#include "loom/model.h"
#include "loom/plan.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_PATH_MAX 1024

typedef struct {
    /* model: a preset ("" = LOOM_GPT_DEFAULT_PRESET), with any field overridden when non-zero;
     * a run that resumes or starts from a file takes that file's model */
    char model[32];
    int layers, heads, d_model, context, vocab;
    char arch[16];          /* "" (the preset's), gpt2 or llama */
    int kv_heads, ffn_dim;  /* Llama: 0 = the preset's */
    char tie_embeddings[8]; /* Llama: "" (the preset's), on or off */
    double rope_theta, norm_eps;
    /* data */
    char data[LOOM_PATH_MAX];     /* token shards: glob or comma-separated globs */
    char val_data[LOOM_PATH_MAX]; /* "" = no validation */
    /* schedule */
    int64_t steps;
    int seq_len;
    double lr, min_lr_ratio; /* cosine decays to lr * min_lr_ratio */
    char lr_schedule[16];    /* "constant" or "cosine" */
    int64_t warmup_steps;
    /* optimizer */
    double weight_decay, beta1, beta2, eps, grad_clip; /* grad_clip 0 disables */
    int max_bad_steps; /* consecutive NaN/Inf steps before giving up */
    /* run */
    uint64_t seed;
    int threads;
    char out[LOOM_PATH_MAX];
    int64_t save_every, eval_every, log_every;
    int eval_batches;
    char resume[LOOM_PATH_MAX];    /* "" = fresh start */
    char init_from[LOOM_PATH_MAX]; /* llm.c .bin or .safetensors; "" = random init */
    char tokenizer[LOOM_PATH_MAX]; /* what the data was tokenised with, recorded in checkpoints:
                                      "bytes" or GPT-2's files; "" = the one --resume or
                                      --init-from records, if any */
    char trace[LOOM_PATH_MAX];     /* Chrome trace-event JSON of the run ("" = none) */
    int no_save;                   /* no checkpoint at the end (benchmarks) */
    int keep_last;                 /* keep the newest N checkpoints (0: all) */
    double exit_after_minutes;     /* save and stop after this much wall-clock time (0: never) */
    char progress[16];             /* progress bar: "auto" (a terminal, no launcher), "on", "off" */
    /* how the plan runs (not part of a plan) */
    double bucket_mb;    /* DP allreduce bucket size */
    double comm_timeout; /* seconds before a silent peer ends the job (0: never, else >= 1) */
} loom_train_config;

/* Megatron-like defaults: small preset, AdamW(0.9, 0.95, 1e-8), decay 0.1, clip 1.0, ... */
void loom_train_config_defaults(loom_train_config *config);
/* Checks ranges and relations of what is not the layout (the plan checks that). */
loom_status loom_train_config_check(const loom_train_config *config);
/* The model the run trains: the checkpoint's with --resume, the file's with --init-from, else
 * the preset with overrides. Explicit model settings that contradict such a file are refused
 * (LOOM_ERR_INPUT naming both). */
loom_status loom_train_model_config(const loom_train_config *config, loom_gpt_config *model);
/* Whether the config sets any part of the model (preset or a size). */
int loom_train_config_sets_model(const loom_train_config *config);
/* The plan of the layout flags (NULL: every default) for the model of loom_train_model_config
 * on world_size ranks (0 or 1: one process): loom_plan_from_flags, the constructor `loom plan`
 * uses. */
loom_status loom_train_plan(const loom_train_config *config, const loom_layout_flags *layout,
                            int world_size, loom_plan *plan);

/* Learning rate at 0-based step `step` of `total`. */
double loom_lr_at(const loom_train_config *config, int64_t step);

/* What a finished run reports, for tests and benchmarks. */
typedef struct {
    int64_t steps_done;
    double final_loss, final_val_loss;
    int64_t skipped_steps;
    double median_step_s, median_tokens_per_s; /* over the steps after the first */
    int64_t peak_rss_bytes;                    /* this rank's */
    int64_t optimizer_state_bytes;             /* this rank's AdamW moments (ZeRO shards them) */
} loom_train_result;

/* Runs the training the plan lays out (checked against the world, refused by field name where
 * this build cannot execute it) with the config's data, optimiser and output settings; prints
 * progress; writes metrics, checkpoints and the loss plot under config->out. Every layout
 * decision is the plan's. A config that sets a model must set the plan's (LOOM_ERR_INPUT naming
 * both). world: the MPI world (loom_comm_init), or NULL for one process. result may be NULL. */
struct loom_comm;
loom_status loom_train(const loom_train_config *config, const loom_plan *plan,
                       struct loom_comm *world, loom_train_result *result);
/* The same with the plan of the layout flags (loom_train_plan; layout NULL: every default). */
loom_status loom_train_run_ex(const loom_train_config *config, const loom_layout_flags *layout,
                              struct loom_comm *world, loom_train_result *result);
loom_status loom_train_run(const loom_train_config *config, const loom_layout_flags *layout);

/* One record of a metrics.jsonl file (fields absent from the record are NaN). */
typedef struct {
    int64_t step;
    int is_validation; /* a validation record (val_loss) rather than a step's */
    double loss, val_loss, lr, grad_norm, ms, tokens_per_s, mfu;
    double comm_s[3], comm_bytes[3]; /* dp, tp, pp */
    int skipped;
} loom_metrics_record;
/* Reads every record of a metrics.jsonl (lines that are not records are skipped); free
 * *records with free(). */
loom_status loom_metrics_read(const char *path, loom_metrics_record **records, size_t *count);

typedef struct {
    int tokens;
    double temperature; /* 0 = greedy */
    int top_k;          /* 0 = all */
    uint64_t seed;
} loom_sample_opts;
/* Generates after the prompt, encoded by tok (NULL: bytes), and writes the text (the prompt
 * included) to out, each token as the bytes it decodes to. An empty prompt starts from the
 * end-of-text token. The tokenizer's ids must fit the model's vocabulary (LOOM_ERR_INPUT). */
struct loom_tokenizer;
loom_status loom_sample_text(loom_gpt *model, const struct loom_tokenizer *tok, const char *prompt,
                             const loom_sample_opts *opts, FILE *out);

/* Mean loss over sequential windows of seq_len (all of them, or max_windows if > 0). */
loom_status loom_eval_loss(loom_gpt *model, const char *data, int seq_len, int batch,
                           int64_t max_windows, double *mean_loss, int64_t *tokens);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_TRAIN_H */
