/*
 * trainer.c — the training loop. Set-up puts together what the plan asks for (the rank mesh,
 * this rank's part of the model, the pipeline executor, the gradient synchronisation, AdamW's
 * state, the data, the metrics) and the loop drives them: each step loads the replica's
 * micro-batches, runs them through the pipeline, completes the gradient sync, skips non-finite
 * steps, clips, updates, logs, validates and saves.
 *
 * Not here: parsing flags (cli), running the layout (parallel: pipeline.c, grad_sync.c),
 * checkpoint files of any layout (checkpointing.c), metrics files (metrics.c), the model's
 * maths (model), file formats (io, data).
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/comm.h"
#include "loom/trace.h"
#include "train/train_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

typedef struct {
    const loom_train_config *cfg;
    const loom_plan *plan;
    loom_mesh mesh;
    int have_mesh;
    loom_gpt *model;        /* this rank's part */
    loom_pipeline *pipe;    /* this stage's schedule executor */
    loom_grad_sync *sync;   /* DP, ZeRO-1, tied embedding, loss and norm */
    loom_outer *outer;      /* islands' outer optimiser (NULL: no islands) */
    loom_step_batch *batch; /* the steps' records until the job sums them */
    loom_adamw opt;
    loom_dataset *train_data, *val_data;
    loom_loader *train_loader, *val_loader;
    int32_t *inputs, *targets; /* (micro-batches, B, T): this step's */
    loom_metrics *metrics;     /* the lead's */
    loom_trace *trace;         /* NULL: not tracing */
    loom_ckpt_state state;
    loom_test_hooks hooks;
    double peak_gflops, flops_per_token;
    int progress_bar;
    double run_start;
    int64_t first_step;
    double last_loss, last_val_loss;
    double *step_seconds; /* (steps run) for the medians */
    int lock_fd;          /* the lead's lock on the run folder (-1: none) */
    int64_t timed;
} trainer;

static void trainer_free(trainer *t) {
    loom_trace_free(t->trace);
    loom_outer_free(t->outer);
    loom_step_batch_free(t->batch);
    loom_pipeline_free(t->pipe);
    loom_grad_sync_free(t->sync);
    loom_adamw_free(&t->opt);
    loom_gpt_free(t->model);
    if (t->have_mesh) loom_mesh_free(&t->mesh);
    loom_loader_free(t->train_loader);
    loom_loader_free(t->val_loader);
    loom_dataset_free(t->train_data);
    loom_dataset_free(t->val_data);
    free(t->inputs);
    free(t->targets);
    loom_metrics_close(t->metrics);
    free(t->step_seconds);
    if (t->lock_fd >= 0) close(t->lock_fd); /* releases the lock */
}

static loom_status check_model(const trainer *t, const char *resume_dir) {
    const loom_gpt_config *mc = &t->plan->model;
    loom_gpt_config model = *mc;
    loom_status st = loom_gpt_config_check(&model, "plan");
    if (st != LOOM_OK) return st;
    if (loom_train_config_sets_model(t->cfg)) { /* a library caller's config and plan agree */
        loom_gpt_config asked;
        if ((st = loom_train_model_config(t->cfg, &asked)) != LOOM_OK) return st;
        if (!loom_gpt_config_same(&asked, mc)) {
            char a[256], b[256];
            loom_gpt_config_describe(&asked, a, sizeof a),
                loom_gpt_config_describe(mc, b, sizeof b);
            return loom_fail(LOOM_ERR_INPUT,
                             "config: model: %s differs from the plan's (%s); train the plan's "
                             "model or make a plan for this one",
                             a, b);
        }
    }
    if (t->cfg->seq_len > mc->max_seq_len) {
        return loom_fail(LOOM_ERR_INPUT,
                         "config: seq_len: expected at most the model's context %d, got %d",
                         mc->max_seq_len, t->cfg->seq_len);
    }
    if (!resume_dir[0]) return LOOM_OK;
    char file[4200];
    loom_gpt_config saved;
    if ((st = loom_path_join(file, sizeof file, resume_dir, "model.safetensors")) != LOOM_OK)
        return st;
    if ((st = loom_gpt_config_from_safetensors(file, &saved)) != LOOM_OK) return st;
    if (!loom_gpt_config_same(&saved, mc)) {
        char a[256], b[256];
        loom_gpt_config_describe(&saved, a, sizeof a), loom_gpt_config_describe(mc, b, sizeof b);
        return loom_fail(LOOM_ERR_INPUT,
                         "--resume %s: the checkpoint's model (%s) differs from the plan's (%s)",
                         resume_dir, a, b);
    }
    return LOOM_OK;
}

/* Middle pipeline stages need neither tokens nor targets: their datasets are described (sizes,
 * no token pages), so that their loaders still move in step with the others'. */
static loom_status open_dataset(const trainer *t, loom_dataset **ds, const char *pattern) {
    if (t->model->has_embedding || t->model->has_head) {
        return loom_dataset_open(ds, pattern, t->plan->model.vocab_size);
    }
    return loom_dataset_describe(ds, pattern);
}

static loom_status open_data(trainer *t) {
    const loom_train_config *cfg = t->cfg;
    loom_status st = open_dataset(t, &t->train_data, cfg->data);
    if (st == LOOM_OK) {
        st = loom_loader_create(&t->train_loader, t->train_data, cfg->seq_len, 1, cfg->seed);
    }
    if (st == LOOM_OK && cfg->val_data[0] && cfg->eval_every > 0) {
        st = open_dataset(t, &t->val_data, cfg->val_data);
        if (st == LOOM_OK) {
            st = loom_loader_create(&t->val_loader, t->val_data, cfg->seq_len, 0, cfg->seed);
        }
    }
    size_t tokens = (size_t)loom_plan_num_micro_batches(t->plan) * (size_t)t->plan->micro_batch *
                    (size_t)cfg->seq_len;
    t->inputs = loom_calloc(tokens, sizeof(int32_t), "inputs");
    t->targets = loom_calloc(tokens, sizeof(int32_t), "targets");
    t->step_seconds = loom_calloc((size_t)cfg->steps + 1, sizeof(double), "step times");
    if (st == LOOM_OK && (!t->inputs || !t->targets || !t->step_seconds)) st = LOOM_ERR_NOMEM;
    return st;
}

/* This rank's part of the model: fresh, from --init-from, or (later) from the checkpoint. */
static loom_status make_model(trainer *t) {
    const loom_train_config *cfg = t->cfg;
    loom_gpt_shard shard = loom_mesh_model_shard(&t->mesh);
    loom_status st = loom_gpt_create_shard(&t->model, &t->plan->model, loom_backend_cpu(), &shard);
    if (st != LOOM_OK) return st;
    if (cfg->init_from[0]) {
        st = loom_run_init_from(cfg->init_from, t->model);
        if (st == LOOM_OK) loom_info("initialised from %s", cfg->init_from);
    } else if (!cfg->resume[0]) {
        loom_gpt_init_weights(t->model, cfg->seed);
    }
    return st;
}

static loom_status trainer_setup(trainer *t, loom_comm *world) {
    const loom_train_config *cfg = t->cfg;
    loom_ops_set_threads(cfg->threads);
    t->hooks = loom_test_hooks_read();
    char resume_dir[4096] = "";
    loom_status st = loom_parallel_check_plan(t->plan, "plan");
    if (st == LOOM_OK && cfg->resume[0]) {
        st = loom_checkpoint_resolve(cfg->resume, resume_dir, sizeof resume_dir);
    }
    if (st == LOOM_OK) st = check_model(t, resume_dir);
    loom_ckpt_state tokenizer = {0}; /* what the checkpoints will record */
    if (st == LOOM_OK) st = loom_run_tokenizer(cfg, &t->plan->model, resume_dir, &tokenizer);
    if (st == LOOM_OK) st = loom_mesh_create(world, t->plan, &t->mesh);
    if (st != LOOM_OK) return st;
    t->have_mesh = 1;
    if (world) loom_comm_set_timeout(cfg->comm_timeout);
    int sharers; /* ranks on this machine */
    if ((st = loom_comm_local_size(world, &sharers)) != LOOM_OK) return st;
    if ((st = loom_run_check_memory(cfg, t->plan, &t->mesh, sharers)) != LOOM_OK) return st;
    loom_run_memory_predicted(cfg, t->plan, &t->mesh);
    if ((st = make_model(t)) != LOOM_OK) return st;
    int B = t->plan->micro_batch, T = cfg->seq_len;
    if ((st = loom_pipeline_create(&t->pipe, &t->mesh, t->model, B, T)) != LOOM_OK) return st;
    double bucket_mb =
        cfg->bucket_mb > 0 ? cfg->bucket_mb : loom_grad_bucket_default_mb(t->plan->dp);
    loom_grad_sync_opts opts = {t->plan->zero >= 1, bucket_mb * 1024 * 1024, cfg->seed};
    if ((st = loom_grad_sync_create(&t->sync, &t->mesh, t->model, &opts)) != LOOM_OK) return st;
    if ((st = loom_adamw_create(&t->opt, loom_grad_sync_range(t->sync))) != LOOM_OK) return st;
    if ((st = open_data(t)) != LOOM_OK) return st;

    loom_rng rng;
    loom_rng_seed(&rng, cfg->seed);
    t->state = (loom_ckpt_state){.rng_state = rng.state};
    loom_run_parts parts = {cfg, &t->mesh, t->model, &t->opt, t->sync, t->pipe, NULL};
    int more = 0; /* an islands checkpoint: the outer optimiser's and the islands' state */
    if (resume_dir[0] && (st = loom_run_resume(&parts, resume_dir, &t->state, &more)) != LOOM_OK)
        return st;
    if ((st = loom_outer_create(&t->outer, &t->mesh, t->model, t->sync)) != LOOM_OK) return st;
    parts.outer = t->outer;
    if (more && (st = loom_run_islands_resume(&parts, resume_dir, &t->state)) != LOOM_OK) return st;
    st = loom_step_batch_create(&t->batch, &t->mesh, loom_outer_meeting_gap(t->outer) + 1);
    if (st != LOOM_OK) return st;
    if (resume_dir[0]) {
        loom_loader_pos pos = {t->state.data_epoch, t->state.data_index};
        if (loom_loader_set_pos(t->train_loader, pos) != LOOM_OK) {
            return loom_fail(LOOM_ERR_INPUT, "%s: data position does not fit the data", resume_dir);
        }
        loom_info("resumed from %s at step %" PRId64, resume_dir, t->state.step);
        if (t->state.step >= cfg->steps && t->mesh.lead) {
            loom_warn("--steps %" PRId64 ": the checkpoint is at step %" PRId64
                      " already; nothing to train (raise --steps to go on)",
                      cfg->steps, t->state.step);
        }
    }
    snprintf(t->state.tokenizer, sizeof t->state.tokenizer, "%s", tokenizer.tokenizer);
    snprintf(t->state.tokenizer_source, sizeof t->state.tokenizer_source, "%s",
             tokenizer.tokenizer_source);
    t->first_step = t->state.step;
    t->flops_per_token = loom_gpt_flops_per_token(&t->plan->model, cfg->seq_len);
    if (!t->mesh.lead) return LOOM_OK;
    if ((st = loom_mkdir_p(cfg->out)) != LOOM_OK) return st;
    if ((st = loom_run_lock_folder(cfg->out, &t->lock_fd)) != LOOM_OK) return st;
    if ((st = loom_run_clean_checkpoints(cfg->out)) != LOOM_OK) return st;
    st = loom_metrics_open(&t->metrics, cfg->out, resume_dir[0] ? t->state.step : -1);
    if (st != LOOM_OK) return st;
    /* every rank is assumed as fast as this one: the job's peak is world size x this */
    int ranks = world ? loom_comm_size(world) : 1;
    t->peak_gflops = loom_ops_sgemm_peak_gflops(1024, 3) * ranks;
    /* under a launcher stdout is often a pseudo-terminal even when mpirun's output goes to a
     * file: "auto" draws the bar only for one process on a terminal */
    t->progress_bar = !strcmp(cfg->progress, "on") ||
                      (!strcmp(cfg->progress, "auto") && !world && isatty(STDOUT_FILENO));
    loom_run_print_setup(t->cfg, t->plan, &t->mesh, t->train_data, t->val_data, t->train_loader,
                         t->peak_gflops);
    loom_run_compress_report(&t->mesh, t->sync, t->pipe);
    return LOOM_OK;
}

static void clear_progress_line(const trainer *t) {
    if (t->progress_bar) printf("\r\033[K");
}

/* Forward and backward of this replica's share of the global batch through the pipeline, then
 * the gradient synchronisation. */
static loom_status accumulate_gradients(trainer *t, double *loss_sum) {
    const loom_mesh *mesh = &t->mesh;
    int B = t->plan->micro_batch, T = t->cfg->seq_len, m = loom_pipeline_micro_batches(t->pipe);
    uint64_t per_replica = (uint64_t)m * (uint64_t)B;
    size_t bt = (size_t)B * (size_t)T;
    /* the mean over the global batch: every token of every replica weighs 1/(G*T) */
    float dloss = 1.0f / ((float)B * (float)T * (float)m * (float)mesh->dp_size);
    loom_grad_sync_zero_grads(t->sync, t->state.step);
    /* every stage reads the same windows (the first needs the tokens, the last the targets) */
    int replicas, replica = loom_run_data_replica(mesh, &t->hooks, &replicas);
    loom_loader_skip(t->train_loader, (uint64_t)replica * per_replica);
    loom_status st = LOOM_OK;
    for (int a = 0; a < m && st == LOOM_OK; a++) {
        if (loom_dataset_has_tokens(t->train_data)) {
            st = loom_loader_next(t->train_loader, B, t->inputs + (size_t)a * bt,
                                  t->targets + (size_t)a * bt);
        } else {
            loom_loader_skip(t->train_loader, (uint64_t)B);
        }
    }
    loom_loader_skip(t->train_loader, (uint64_t)(replicas - 1 - replica) * per_replica);
    if (st == LOOM_OK) {
        st = loom_pipeline_train(t->pipe, t->inputs, t->targets, dloss, t->sync, t->state.step,
                                 loss_sum);
    }
    if (st != LOOM_OK) return st;
    double t0 = loom_trace_now_us();
    st = loom_grad_sync_finish(t->sync);
    loom_trace_event(t->trace, LOOM_TRACE_DP, "gradient sync (wait)", "dp", t0,
                     loom_trace_now_us() - t0, t->state.step + 1, -1);
    return st;
}

/* Clipping and AdamW on this rank's range, then (ZeRO-1) every replica gets every range. */
static loom_status apply_update(trainer *t, int64_t step, double lr, double grad_norm) {
    const loom_train_config *cfg = t->cfg;
    float grad_scale = 1.0f;
    if (cfg->grad_clip > 0 && grad_norm > cfg->grad_clip) {
        grad_scale = (float)(cfg->grad_clip / grad_norm);
    }
    double t0 = loom_trace_now_us();
    int64_t update = step + 1 - t->state.skipped_total; /* AdamW's t counts applied updates */
    loom_adamw_step(&t->opt, t->model, loom_grad_sync_grads(t->sync), cfg, lr, update, grad_scale);
    loom_status st = loom_grad_sync_share_params(t->sync);
    loom_trace_event(t->trace, LOOM_TRACE_COMPUTE, "optimizer", "compute", t0,
                     loom_trace_now_us() - t0, step + 1, -1);
    return st;
}

/* A step's progress line (the lead's, every --log-every steps), once the job has summed it. */
static void show(void *ctx, const loom_step_record *r) {
    trainer *t = ctx;
    int64_t done = r->step, steps = t->cfg->steps;
    if (!t->mesh.lead ||
        !(done == 1 || done % t->cfg->log_every == 0 || done == steps || r->skipped))
        return;
    clear_progress_line(t);
    loom_info("step %6" PRId64 "/%" PRId64 " | loss %.4f | lr %.3e | grad norm %.3f | %.1f ms | "
              "%.0f tok/s | MFU %.1f%%%s%s",
              done, steps, r->loss, r->lr, r->grad_norm, r->seconds * 1e3, r->tokens_per_s,
              100 * r->mfu, r->compression, r->islands);
}

static loom_status train_step(trainer *t, int64_t step) {
    const loom_train_config *cfg = t->cfg;
    double t0 = loom_now();
    double lr = loom_lr_at(cfg, step);
    char note[64];
    snprintf(note, sizeof note, "step %" PRId64, step + 1);
    loom_comm_progress(note);
    loom_test_hooks_fail(&t->hooks, t->mesh.job, step + 1);

    double loss_sum, loss, grad_norm;
    loom_status st = accumulate_gradients(t, &loss_sum);
    if (st != LOOM_OK) return st;
    if (loom_test_hooks_nan(&t->hooks, step + 1)) loom_grad_sync_poison(t->sync);
    st = loom_grad_sync_loss_and_norm(t->sync, loss_sum, loom_pipeline_micro_batches(t->pipe),
                                      &loss, &grad_norm);
    if (st != LOOM_OK) return st;
    int skipped = !isfinite(loss) || !isfinite(grad_norm);
    if (skipped) {
        t->state.bad_steps++;
        t->state.skipped_total++;
        loom_warn("step %" PRId64 ": loss %g, grad norm %g: not finite, step skipped (%" PRId64
                  " in a row, limit %d)",
                  step + 1, loss, grad_norm, t->state.bad_steps, cfg->max_bad_steps);
    } else {
        t->state.bad_steps = 0;
        if ((st = apply_update(t, step, lr, grad_norm)) != LOOM_OK) return st;
    }
    loom_grad_sync_commit(t->sync, !skipped); /* a skipped step leaves compressors as they were */
    loom_pipeline_commit(t->pipe, !skipped);
    if ((st = loom_outer_land(t->outer, step + 1, cfg->steps)) != LOOM_OK) return st;
    t->state.step = step + 1;
    loom_loader_pos pos = loom_loader_get_pos(t->train_loader);
    t->state.data_epoch = pos.epoch;
    t->state.data_index = pos.index;
    t->last_loss = loss;

    double seconds = loom_now() - t0;
    t->step_seconds[t->timed++] = seconds;
    double tokens_per_s = (double)t->plan->global_batch * cfg->seq_len / seconds;
    double mfu =
        t->peak_gflops > 0 ? t->flops_per_token * tokens_per_s / (t->peak_gflops * 1e9) : 0.0;
    loom_step_record record = {step + 1, loss,     lr,      grad_norm, seconds,  tokens_per_s, mfu,
                               skipped,  &t->mesh, t->sync, t->pipe,   t->outer, "",           ""};
    if ((st = loom_step_batch_add(t->batch, &record)) != LOOM_OK) return st;
    int64_t done = step + 1;
    if (t->state.bad_steps >= cfg->max_bad_steps) {
        return loom_fail(LOOM_ERR_NUMERIC,
                         "training stopped at step %" PRId64 ": %" PRId64
                         " steps in a row had a non-finite loss or gradient norm (limit "
                         "--max-bad-steps %d); try a lower --lr or --grad-clip",
                         done, t->state.bad_steps, cfg->max_bad_steps);
    }
    return LOOM_OK;
}

static loom_status evaluate(trainer *t) {
    double val;
    loom_status st = loom_run_validation(t->cfg, &t->mesh, t->pipe, t->outer, t->val_data,
                                         t->val_loader, t->inputs, t->targets, &val);
    if (st != LOOM_OK) return st;
    t->last_val_loss = val;
    if (!t->mesh.lead) return LOOM_OK;
    clear_progress_line(t);
    loom_info("step %6" PRId64 "/%" PRId64 " | val loss %.4f | val perplexity %.2f", t->state.step,
              t->cfg->steps, val, exp(val));
    return loom_metrics_validation(t->metrics, t->state.step, val);
}

static loom_status save(trainer *t) {
    clear_progress_line(t);
    loom_run_parts parts = {t->cfg, &t->mesh, t->model, &t->opt, t->sync, t->pipe, t->outer};
    return loom_run_save(&parts, &t->state);
}

/* The end of a run: a last validation (not when stopping early), the checkpoint, the replica
 * check, the plot and the measurements. */
static loom_status finish_run(trainer *t, loom_train_result *r, int stopped) {
    const loom_train_config *cfg = t->cfg;
    loom_status st = LOOM_OK;
    clear_progress_line(t);
    if (t->val_loader && !stopped && cfg->steps % cfg->eval_every != 0) st = evaluate(t);
    if (st == LOOM_OK && !cfg->no_save) st = save(t);
    if (st == LOOM_OK && t->hooks.diverge && t->mesh.dp_rank == 1) t->model->params_memory[0] += 1;
    if (st == LOOM_OK) st = loom_grad_sync_check_replicas(t->sync);
    if (st == LOOM_OK && t->metrics) st = loom_metrics_plot(t->metrics, cfg->out);
    loom_run_measure(t->step_seconds, t->timed, (double)t->plan->global_batch * cfg->seq_len, r);
    if (st == LOOM_OK) st = loom_run_report_prediction(t->plan, &t->mesh, r);
    if (st == LOOM_OK)
        st = loom_run_memory_measured(cfg, t->plan, &t->mesh, t->sync, t->model, &t->opt, t->outer,
                                      r->peak_rss_bytes);
    return st;
}

/* One rank's bad file must not leave the others waiting: agree before training. */
static loom_status agree_on_setup(loom_comm *world, loom_status st) {
    double code = loom_exit_code(st);
    loom_status agreed = loom_comm_allreduce_f64(world, &code, 1, LOOM_REDUCE_MAX);
    if (agreed != LOOM_OK) return agreed;
    if (st == LOOM_OK && code > 0) {
        return loom_fail(code >= 2 ? LOOM_ERR_INPUT : LOOM_ERR_RUNTIME,
                         "another rank failed while setting up (its message says why)");
    }
    return st;
}

loom_status loom_train(const loom_train_config *cfg, const loom_plan *plan, loom_comm *world,
                       loom_train_result *result) {
    loom_status st = loom_train_config_check(cfg);
    if (st != LOOM_OK) return st;
    trainer t;
    memset(&t, 0, sizeof t);
    t.cfg = cfg, t.plan = plan, t.last_val_loss = NAN, t.lock_fd = -1;
    st = trainer_setup(&t, world);
    int multi = world && loom_comm_size(world) > 1;
    if (multi) st = agree_on_setup(world, st);
    int setup_ok = st == LOOM_OK;
    if (st == LOOM_OK && cfg->trace[0]) {
        /* a common time origin: every rank starts its clock as the barrier releases */
        if (world) st = loom_comm_barrier(world);
        if (st == LOOM_OK) {
            st = loom_trace_create(&t.trace, world ? loom_comm_rank(world) : 0, (size_t)1 << 20);
        }
        loom_pipeline_set_trace(t.pipe, t.trace);
        loom_grad_sync_set_trace(t.sync, t.trace);
    }
    t.run_start = loom_now();
    loom_stop stop;
    loom_stop_install(&stop, cfg->exit_after_minutes);
    int stopped = 0;
    for (int64_t step = t.state.step; st == LOOM_OK && step < cfg->steps; step++) {
        st = train_step(&t, step);
        int64_t done = step + 1;
        /* the job's collectives when the islands meet, before the outer syncs leave */
        int stop_now = 0, meets = loom_outer_meets(t.outer, done, cfg->steps), keep = !!t.outer;
        if (st == LOOM_OK && meets) st = loom_step_batch_flush(t.batch, t.metrics, keep, show, &t);
        if (st == LOOM_OK && meets) st = loom_stop_agree(&stop, &t.mesh, &stop_now);
        double sent = loom_now();
        if (st == LOOM_OK) st = loom_outer_send(t.outer, done, cfg->steps);
        sent = loom_now() - sent;
        if (st == LOOM_OK && t.timed > 0) t.step_seconds[t.timed - 1] += sent;
        if (st == LOOM_OK) loom_step_batch_add_outer(t.batch, t.outer, sent);
        if (st == LOOM_OK && t.val_loader && done % cfg->eval_every == 0) st = evaluate(&t);
        if (st == LOOM_OK && stop_now && done < cfg->steps) {
            stopped = 1;
            clear_progress_line(&t);
            if (t.mesh.lead) { /* a signal's on stderr: see stop.c on launchers */
                loom_log(stop.signalled ? LOOM_LOG_WARN : LOOM_LOG_INFO,
                         "stopping after step %" PRId64 " of %" PRId64 ": %s; saving a "
                         "checkpoint (continue with --resume %s)",
                         done, cfg->steps, stop.reason, cfg->out);
            }
            break;
        }
        if (st == LOOM_OK && cfg->save_every > 0 && done % cfg->save_every == 0 &&
            done != cfg->steps) {
            st = save(&t);
        }
        if (st == LOOM_OK && t.progress_bar) {
            loom_run_progress_bar(done - t.first_step, cfg->steps - t.first_step, done, cfg->steps,
                                  loom_now() - t.run_start);
        }
    }
    if (st == LOOM_OK) st = loom_step_batch_flush(t.batch, t.metrics, 0, show, &t);
    loom_train_result r = {0};
    if (st == LOOM_OK && t.state.step > t.first_step) st = finish_run(&t, &r, stopped);
    loom_stop_remove(&stop); /* after the stop checkpoint: see stop.c on launchers */
    if (st == LOOM_OK && t.trace) {
        st = loom_trace_write(t.trace, world, cfg->trace);
        if (st == LOOM_OK && t.mesh.lead) loom_info("trace: %s (open in Perfetto)", cfg->trace);
    }
    if (multi && setup_ok && st != LOOM_OK) {
        /* a failure mid-training may be this rank's alone: end the whole job now */
        char message[2048];
        snprintf(message, sizeof message, "%s", loom_last_error());
        loom_comm_abort(loom_exit_code(st), message);
    }
    if (result) {
        *result = r;
        result->steps_done = t.state.step;
        result->final_loss = t.last_loss;
        result->final_val_loss = t.last_val_loss;
        result->skipped_steps = t.state.skipped_total;
        result->optimizer_state_bytes = (int64_t)(2 * sizeof(float) * t.opt.range.shard);
    }
    trainer_free(&t);
    return st;
}
