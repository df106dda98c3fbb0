/*
 * train_internal.h — the pieces of the training module the loop (trainer.c) puts together:
 * the AdamW state and update (optimizer.c), checkpoints of a run under any layout
 * (checkpointing.c), metrics.jsonl and the loss plot (metrics.c), and validation (eval.c).
 */
#ifndef LOOM_TRAIN_INTERNAL_H
#define LOOM_TRAIN_INTERNAL_H

#include "loom/data.h"
#include "loom/io.h"
#include "loom/parallel.h"
#include "loom/train.h"

#include <stdio.h>

/* ---- optimizer.c ---- */

/* AdamW's moments for the range of the flat buffer this rank updates (all of it, or its ZeRO-1
 * shard). */
typedef struct {
    loom_zero_shard range;
    float *m, *v; /* (range.shard) first and second moments, indexed from range.begin */
} loom_adamw;

loom_status loom_adamw_create(loom_adamw *opt, loom_zero_shard range);
void loom_adamw_free(loom_adamw *opt);
/* One update of params[range] from grads (indexed from range.begin), segment by segment: decay
 * on 2-D weights only; update counts applied updates (AdamW's t); grad_scale is the clipping
 * factor. */
void loom_adamw_step(loom_adamw *opt, loom_gpt *model, const float *grads,
                     const loom_train_config *cfg, double lr, int64_t update, float grad_scale);

/* ---- checkpointing.c ---- */

/* Writes the step folder `dir` of a checkpoint (the single-process files whatever the layout),
 * no pointer moved: this run's parameters and moments
 * (loom_run_checkpoint_write_model), or any three buffers in the model's flat layout, each whole
 * on every replica or cut into the replicas' ZeRO ranges (sharded: this rank's range, indexed
 * from its start; bufs[2] NULL for an islands checkpoint's state file, which holds one). The
 * mesh's lead writes the files. */
loom_status loom_run_checkpoint_write_model(const char *dir, const loom_mesh *mesh,
                                            const loom_gpt *model, const loom_adamw *opt,
                                            const loom_ckpt_state *state);
loom_status loom_run_checkpoint_write(const char *dir, const loom_mesh *mesh, const loom_gpt *model,
                                      const float *const bufs[3], const int sharded[3],
                                      const loom_ckpt_state *state);
/* OUT/checkpoints/step_NNNNNNNN. */
loom_status loom_run_step_folder(const char *out, int64_t step, char *dir, size_t cap);
/* Reads checkpoint folder dir's three buffers (parameters, and the state file's two) slice by
 * slice, keeping flat offsets [lo[b], hi[b]) of each into dst[b] (indexed from lo[b]; NULL: not
 * wanted), and the loop state. */
loom_status loom_run_checkpoint_read(const char *dir, loom_gpt *model, float *const dst[3],
                                     const size_t lo[3], const size_t hi[3],
                                     loom_ckpt_state *state);
/* Resumes from checkpoint folder dir: this rank's part of the parameters and of the moments
 * (its range), and the loop state. A sharded rank reads one slice at a time. */
loom_status loom_run_checkpoint_load(const char *dir, const loom_mesh *mesh, loom_gpt *model,
                                     loom_adamw *opt, loom_ckpt_state *state);
/* Takes the run folder's lock (OUT/.lock, flock): refused by name while another run holds it.
 * *fd keeps it until closed. */
loom_status loom_run_lock_folder(const char *out, int *fd);
/* Refuses a run whose rank part does not fit this machine's memory, shared by `sharers` ranks
 * (loom_comm_local_size) (memory.c). */
/* The memory report: at start-up what each pipeline rank is predicted to hold, by category
 * (loom_plan_rank_memory); at the end what every rank's runtime allocated by category and its
 * peak resident set (measured by the kernel, getrusage), printed by the lead and written to
 * OUT/memory.json ({"zero": Z, "ranks": [{"rank", "pp", "dp", "tp", "peak_rss", "params",
 * "grads", "optimizer", "activations", "compressor", "outer", "predicted": {...}}]}, bytes). Every
 * rank joins the second. */
void loom_run_memory_predicted(const loom_train_config *cfg, const loom_plan *plan,
                               const loom_mesh *mesh);
loom_status loom_run_memory_measured(const loom_train_config *cfg, const loom_plan *plan,
                                     const loom_mesh *mesh, loom_grad_sync *sync,
                                     const loom_gpt *model, const loom_adamw *opt,
                                     const loom_outer *outer, int64_t peak_rss);
loom_status loom_run_check_memory(const loom_train_config *cfg, const loom_plan *plan,
                                  const loom_mesh *mesh, int sharers);
/* Keeps the newest `keep` step folders of OUT/checkpoints (and always the one "latest" names),
 * deleting the others; the lead calls it after a save. */
loom_status loom_run_prune_checkpoints(const char *out, int keep);
/* Before a run writes to OUT: removes what a killed save left (temporary files, empty step
 * folders) and warns about step folders without both files (they are never "latest"). */
loom_status loom_run_clean_checkpoints(const char *out);
/* --init-from: fills this rank's part of the parameters from any model file. */
loom_status loom_run_init_from(const char *path, loom_gpt *model);
/* What the run records as its tokenizer (state->tokenizer, tokenizer_source): --tokenizer,
 * opened and checked against the model's vocabulary and against what the resumed checkpoint or
 * the --init-from file records (a different tokenizer is refused by name); else what that file
 * records; else nothing. */
loom_status loom_run_tokenizer(const loom_train_config *cfg, const loom_gpt_config *model,
                               const char *resume_dir, loom_ckpt_state *state);

/* What a save or a resume works on. */
typedef struct {
    const loom_train_config *cfg;
    const loom_mesh *mesh;
    loom_gpt *model;
    loom_adamw *opt;
    loom_grad_sync *sync;
    loom_pipeline *pipe;
    loom_outer *outer; /* NULL without islands */
} loom_run_parts;
/* OUT/checkpoints/step_N of the run at state->step (the compressors' files, the model and
 * moments, then the "latest" pointer; with islands, islands.c's), then the lead prunes old ones.
 * Collective over the job. */
loom_status loom_run_save(const loom_run_parts *parts, loom_ckpt_state *state);
/* --resume dir, before the outer optimiser exists: the model, moments, compressors and loop
 * state; with islands from an islands checkpoint only the global model (*more: the rest comes
 * from loom_run_islands_resume once the outer optimiser starts from it). */
loom_status loom_run_resume(const loom_run_parts *parts, const char *dir, loom_ckpt_state *state,
                            int *more);

/* ---- islands.c ---- */

/* The islands checkpoint of state->step into its step folder `dir` (see islands.c). Collective
 * over the job. */
loom_status loom_run_islands_save(const loom_run_parts *parts, const char *dir,
                                  loom_ckpt_state *state);
/* An islands checkpoint's signature (metadata "loom.islands" of its state file; "" for any
 * other checkpoint). */
loom_status loom_run_checkpoint_islands(const char *dir, char *sig, size_t cap);
/* loom_run_resume's islands part: any checkpoint but an islands one is every island's start;
 * an islands checkpoint gives the global model now (*islands_checkpoint set), the rest later. */
loom_status loom_run_islands_resume_start(const loom_run_parts *parts, const char *dir,
                                          loom_ckpt_state *state, int *islands_checkpoint);
/* The rest, with the outer optimiser started from the global model: outer state, each island's
 * own parameters and moments, the syncs in flight (the same islands and layout), or the round
 * restarted (anything else; one warning). Collective. */
loom_status loom_run_islands_resume(const loom_run_parts *parts, const char *dir,
                                    loom_ckpt_state *state);

/* ---- compress_state.c ---- */

/* Writes this rank's compressor state into the coming checkpoint's step folder `dir` (each
 * rank its own file, then a barrier) and fills state->compress for the lead's state file;
 * nothing without compression. Collective over the world. */
loom_status loom_run_compress_save(const char *dir, const loom_mesh *mesh, int seq_len,
                                   loom_grad_sync *sync, loom_pipeline *pipe,
                                   loom_ckpt_state *state);
/* Reads it back when the checkpoint's (state->compress) fits this run's layout and
 * compression; otherwise warns once (lead) and leaves the compressors fresh. */
loom_status loom_run_compress_load(const char *dir, const loom_mesh *mesh, int seq_len,
                                   loom_grad_sync *sync, loom_pipeline *pipe,
                                   const loom_ckpt_state *state);
/* The start-up line on the compressors' memory (lead; nothing without compression). */
void loom_run_compress_report(const loom_mesh *mesh, loom_grad_sync *sync, loom_pipeline *pipe);

/* ---- metrics.c ---- */

/* metrics.jsonl (rank 0 writes it) and the series kept for the loss plot. */
typedef struct loom_metrics loom_metrics;
/* Opens OUT/metrics.jsonl: fresh, or (resume_step >= 0) keeping the records up to that step,
 * whose series the plot keeps too. */
loom_status loom_metrics_open(loom_metrics **out, const char *dir, int64_t resume_step);
void loom_metrics_close(loom_metrics *metrics);
typedef struct {
    int64_t step;
    double loss, lr, grad_norm, seconds, tokens_per_s, mfu;
    int skipped;
    const loom_mesh *mesh; /* its groups' byte and time counters are written, then reset */
    loom_grad_sync *sync;  /* compression counters (taken, so reset) */
    loom_pipeline *pipe;
    loom_outer *outer;    /* islands: outer counters (taken); NULL without islands */
    char compression[96]; /* out: " | dp 134x ..." for the progress line ("" without) */
    char islands[96];     /* out: " | round 3, islands' loss 4.21 +- 0.02" ("" without) */
} loom_step_record;
/* The job's view of each step (counters summed over every rank, every island's loss), taken on
 * every rank at each step's end (add; the outer syncs sent after it and their seconds,
 * add_outer) and summed over
 * the job in one collective at a flush: every step without islands; with islands when they
 * meet (loom_outer_meets), since a collective between islands while an outer sync is in flight
 * would queue behind it — there the newest step stays (keep_newest) until the syncs it sends
 * are counted, and the run's end flushes the rest. At a flush the lead writes each step's
 * record (metrics not NULL) and shown(ctx, record) gets it with its notes. */
typedef struct loom_step_batch loom_step_batch;
loom_status loom_step_batch_create(loom_step_batch **out, const loom_mesh *mesh, int capacity);
void loom_step_batch_free(loom_step_batch *batch);
loom_status loom_step_batch_add(loom_step_batch *batch, const loom_step_record *record);
void loom_step_batch_add_outer(loom_step_batch *batch, loom_outer *outer, double seconds);
loom_status loom_step_batch_flush(loom_step_batch *batch, loom_metrics *metrics, int keep_newest,
                                  void (*shown)(void *ctx, const loom_step_record *record),
                                  void *ctx);
loom_status loom_metrics_validation(loom_metrics *metrics, int64_t step, double val_loss);
/* The progress bar (a terminal's): steps done of the run's total (this invocation's run_done of
 * run_total, for the ETA), overall done of steps. */
void loom_run_progress_bar(int64_t run_done, int64_t run_total, int64_t done, int64_t steps,
                           double elapsed_s);
/* The start-up lines on the model, the data and the layout (the lead's). */
void loom_run_print_setup(const loom_train_config *cfg, const loom_plan *plan,
                          const loom_mesh *mesh, const loom_dataset *train_data,
                          const loom_dataset *val_data, const loom_loader *train_loader,
                          double peak_gflops);
/* Writes OUT/loss.svg from the series. */
loom_status loom_metrics_plot(loom_metrics *metrics, const char *out);

/* ---- eval.c ---- */

/* Mean loss over the first eval_batches global batches of the validation split (capped at the
 * split's size), micro-batch by micro-batch through the pipeline, the windows shared out among
 * the replicas: the same windows whatever the layout; with islands (outer not NULL) of the
 * global model, swapped in for the run and back. Collective. */
loom_status loom_run_validation(const loom_train_config *cfg, const loom_mesh *mesh,
                                loom_pipeline *pipe, loom_outer *outer, const loom_dataset *data,
                                loom_loader *loader, int32_t *inputs, int32_t *targets,
                                double *mean);

/* ---- stopping early (stop.c) ---- */

typedef struct {
    double deadline; /* loom_now() past which the run stops; 0: no budget */
    int installed;
    const char *reason; /* why the ranks agreed to stop */
    int signalled;      /* ... and that was a signal (to some rank) */
} loom_stop;

/* Catches SIGTERM and SIGINT (once) and starts the clock of a budget of `minutes` (0: none). */
void loom_stop_install(loom_stop *stop, double minutes);
void loom_stop_remove(loom_stop *stop);
/* After a step, collectively: *stop when any rank got a signal or the budget is spent. */
loom_status loom_stop_agree(loom_stop *stop, const loom_mesh *mesh, int *stop_now);

/* ---- test hooks (trainer.c) ---- */

/* Failures and numeric trouble on demand, for the tests; read from the environment once
 * (hooks.c), and all empty in a build without LOOM_TEST_HOOKS. */
typedef struct {
    int64_t nan_steps[16]; /* LOOM_DEBUG_NAN_STEPS="3,4,5": poison these (1-based) steps */
    int num_nan_steps;
    int fail_rank;     /* LOOM_DEBUG_FAIL="RANK:STEP:exit|hang": world rank RANK dies or */
    int64_t fail_step; /* hangs at the start of STEP */
    char fail_mode[16];
    int diverge; /* LOOM_DEBUG_DIVERGE=1: replica 1 changes a parameter before the check */
    int islands_same_data; /* LOOM_DEBUG_ISLANDS_SAME_DATA=1: every island reads island 0's */
} loom_test_hooks;

loom_test_hooks loom_test_hooks_read(void);
/* At the start of 1-based `step`: this rank exits or hangs when LOOM_DEBUG_FAIL names it. */
void loom_test_hooks_fail(const loom_test_hooks *hooks, loom_comm *world, int64_t step);
/* Whether 1-based `step`'s gradients are to be poisoned (LOOM_DEBUG_NAN_STEPS). */
int loom_test_hooks_nan(const loom_test_hooks *hooks, int64_t step);

/* ---- islands (islands.c) ---- */

/* This rank's replica among all islands' (island x dp + dp rank; their count in *replicas): the
 * share of each step's global batch it reads. The islands_same_data hook makes every island
 * read as the only one would. */
int loom_run_data_replica(const loom_mesh *mesh, const loom_test_hooks *hooks, int *replicas);

/* ---- measuring a run (metrics.c) ---- */

/* Medians over the steps after the first (which pays for first touches), and this rank's peak
 * resident memory, into r. */
void loom_run_measure(double *step_seconds, int64_t steps, double tokens_per_step,
                      loom_train_result *r);
/* The plan's predictions (information, not instructions) beside what was measured; the peak is
 * the largest of any rank's. Collective. */
loom_status loom_run_report_prediction(const loom_plan *plan, const loom_mesh *mesh,
                                       const loom_train_result *r);

#endif
