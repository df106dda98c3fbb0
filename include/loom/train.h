/*
 * loom/train.h — the training loop and what surrounds it: the run configuration, learning
 * rate schedules, the AdamW step with global-norm clipping, validation, metrics (progress
 * lines, metrics.jsonl, loss plot), checkpoints every N steps, resume, and generation and
 * evaluation from a checkpoint.
 *
 * Not here: parsing flags or JSON files (the CLI does that and fills loom_train_config).
 */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include "loom/base.h"
#include "loom/model.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_PATH_MAX 1024

typedef struct {
    /* model: a preset, with any field overridden when non-zero */
    char model[32];
    int layers, heads, d_model, context, vocab;
    /* data */
    char data[LOOM_PATH_MAX];     /* token shards: glob or comma-separated globs */
    char val_data[LOOM_PATH_MAX]; /* "" = no validation */
    /* schedule */
    int64_t steps;
    int micro_batch_size, seq_len, global_batch_size; /* global = micro x accumulation */
    double lr, min_lr_ratio;                          /* cosine decays to lr * min_lr_ratio */
    char lr_schedule[16];                             /* "constant" or "cosine" */
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
    /* parallelism: the layout (a plan file, or the shortcut flags) */
    char plan[LOOM_PATH_MAX]; /* "" = from the flags below */
    int data_parallel, tensor_parallel, pipeline_parallel;
    double bucket_mb;           /* DP allreduce bucket size */
    int zero1;                  /* shard AdamW state across DP ranks */
    double comm_timeout;        /* seconds before a silent peer ends the job */
    char schedule[16];          /* pipeline schedule: "1f1b" or "gpipe" */
    int micro_batches;          /* > 0: global batch = micro x this x data parallel */
    char stage_layers[256];     /* pipeline stage sizes, e.g. "3,5"; "" = as even as possible */
    char trace[LOOM_PATH_MAX];  /* Chrome trace-event JSON of the run ("" = none) */
    int no_save;                /* no checkpoint at the end (benchmarks) */
    int recompute;              /* pipeline stages keep only their inputs; backward recomputes */
    char recompute_stages[256]; /* ... only these stages, e.g. "0,2" (from a plan file) */
} loom_train_config;

/* Megatron-like defaults: small preset, AdamW(0.9, 0.95, 1e-8), decay 0.1, clip 1.0, ... */
void loom_train_config_defaults(loom_train_config *config);
/* Checks ranges and relations (global batch a multiple of micro batch, ...). */
loom_status loom_train_config_check(const loom_train_config *config);
/* The model configuration the run config describes (preset + overrides). */
loom_status loom_train_model_config(const loom_train_config *config, loom_gpt_config *model);

/* Learning rate at 0-based step `step` of `total`. */
double loom_lr_at(const loom_train_config *config, int64_t step);

/* Runs the training described by config; prints progress; writes metrics, checkpoints and
 * the loss plot under config->out. */
loom_status loom_train_run(const loom_train_config *config);

/* What a finished run reports, for tests and benchmarks. */
typedef struct {
    int64_t steps_done;
    double final_loss, final_val_loss;
    int64_t skipped_steps;
} loom_train_result;
/* world: the MPI world (loom_comm_init), or NULL for one process. */
struct loom_comm;
loom_status loom_train_run_ex(const loom_train_config *config, struct loom_comm *world,
                              loom_train_result *result);

/* Loads a model from a checkpoint: a run folder, its checkpoints/ folder, one step folder,
 * a .safetensors file (loom or Hugging Face GPT-2), or an llm.c .bin. */
loom_status loom_model_load(const char *path, const loom_backend *backend, loom_gpt **model);

typedef struct {
    int tokens;
    double temperature; /* 0 = greedy */
    int top_k;          /* 0 = all */
    uint64_t seed;
} loom_sample_opts;
/* Generates after the byte-tokenised prompt and writes the text (prompt included) to out. */
loom_status loom_sample_text(loom_gpt *model, const char *prompt, const loom_sample_opts *opts,
                             FILE *out);

/* Mean loss over sequential windows of seq_len (all of them, or max_windows if > 0). */
loom_status loom_eval_loss(loom_gpt *model, const char *data, int seq_len, int batch,
                           int64_t max_windows, double *mean_loss, int64_t *tokens);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_TRAIN_H */
