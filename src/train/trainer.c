/*
 * trainer.c — the training loop: set-up (model, data, resume), the step (gradient
 * accumulation, global-norm clipping, AdamW, NaN/Inf skipping), validation, progress lines,
 * metrics.jsonl, checkpoints, and the loss plot at the end.
 *
 * Not here: parsing flags (cli), the model's maths (model), file formats (io, data).
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/data.h"
#include "loom/io.h"
#include "loom/train.h"
#include "io/checkpoint.h"
#include "train/plot.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const loom_train_config *cfg;
    loom_gpt *model;
    float *m, *v; /* AdamW moments, same layout as the parameters */
    loom_dataset *train_data, *val_data;
    loom_loader *train_loader, *val_loader;
    int32_t *inputs, *targets;
    int accum; /* micro-batches per step */
    FILE *metrics;
    double peak_gflops, flops_per_token;
    loom_ckpt_state state;
    int progress_bar;
    double run_start;
    int64_t first_step;
    double last_val_loss;
    double last_loss;
} trainer;

static void trainer_free(trainer *t) {
    loom_gpt_free(t->model);
    loom_free_aligned(t->m);
    loom_free_aligned(t->v);
    loom_loader_free(t->train_loader);
    loom_loader_free(t->val_loader);
    loom_dataset_free(t->train_data);
    loom_dataset_free(t->val_data);
    free(t->inputs);
    free(t->targets);
    if (t->metrics) fclose(t->metrics);
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

loom_status loom_model_load(const char *path, const loom_backend *backend, loom_gpt **model) {
    *model = NULL;
    loom_gpt_config config;
    loom_status st;
    if (has_suffix(path, ".bin")) {
        loom_llmc_header h;
        st = loom_llmc_read_header(path, &h);
        if (st != LOOM_OK) return st;
        config = (loom_gpt_config){h.max_seq_len, h.vocab_size, h.padded_vocab_size,
                                   h.num_layers,  h.num_heads,  h.channels};
        st = loom_gpt_create(model, &config, backend);
        if (st != LOOM_OK) return st;
        if ((*model)->num_params != loom_llmc_param_count(&h)) {
            loom_gpt_free(*model);
            *model = NULL;
            return loom_fail(LOOM_ERR_INPUT, "%s: header sizes do not give loom's layout", path);
        }
        /* llm.c keeps each tensor whole (tensor-major); loom's buffer is layer-major */
        float *flat = loom_alloc_aligned((*model)->num_params * sizeof(float), "llm.c import");
        st = flat ? loom_llmc_read_params(path, &h, flat, (*model)->num_params) : LOOM_ERR_NOMEM;
        if (st == LOOM_OK) {
            size_t at = 0;
            for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
                const loom_gpt_tensor_info *ti = &(*model)->info[k];
                for (int64_t i = 0; i < ti->numel; i++) {
                    (*model)->params_memory[loom_gpt_element_offset(ti, i)] = flat[at++];
                }
            }
        }
        loom_free_aligned(flat);
    } else {
        char file[4200];
        if (has_suffix(path, ".safetensors")) {
            snprintf(file, sizeof file, "%s", path);
        } else {
            char dir[4096];
            st = loom_checkpoint_resolve(path, dir, sizeof dir);
            if (st != LOOM_OK) return st;
            snprintf(file, sizeof file, "%s/model.safetensors", dir);
        }
        st = loom_gpt_config_from_safetensors(file, &config);
        if (st != LOOM_OK) return st;
        st = loom_gpt_create(model, &config, backend);
        if (st != LOOM_OK) return st;
        st = loom_gpt_load_safetensors(file, *model);
    }
    if (st != LOOM_OK) {
        loom_gpt_free(*model);
        *model = NULL;
    }
    return st;
}

static int same_model(const loom_gpt_config *a, const loom_gpt_config *b) {
    return a->num_layers == b->num_layers && a->num_heads == b->num_heads &&
           a->channels == b->channels && a->max_seq_len == b->max_seq_len &&
           a->vocab_size == b->vocab_size;
}

/* Keeps only the metrics records of steps up to `step` (a resumed run rewrites the rest). */
static loom_status metrics_truncate(const char *path, int64_t step) {
    char *text;
    size_t size;
    if (access(path, F_OK) != 0) return LOOM_OK;
    loom_status st = loom_read_file(path, &text, &size);
    if (st != LOOM_OK) return st;
    char *kept = loom_malloc(size + 1, "metrics");
    if (!kept) {
        free(text);
        return LOOM_ERR_NOMEM;
    }
    size_t used = 0;
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        size_t len = next ? (size_t)(next - line) : strlen(line);
        json_t *obj = json_loadb(line, len, 0, NULL);
        json_t *s = obj ? json_object_get(obj, "step") : NULL;
        if (json_is_integer(s) && json_integer_value(s) <= step) {
            memcpy(kept + used, line, len);
            used += len;
            kept[used++] = '\n';
        }
        json_decref(obj);
        line = next ? next + 1 : NULL;
    }
    st = loom_write_file_atomic(path, kept, used);
    free(text);
    free(kept);
    return st;
}

static loom_status trainer_setup(trainer *t, const loom_train_config *cfg) {
    t->cfg = cfg;
    t->accum = cfg->global_batch_size / cfg->micro_batch_size;
    t->last_val_loss = NAN;
    loom_ops_set_threads(cfg->threads);
    const loom_backend *be = loom_backend_cpu();

    /* the model: fresh, from --init-from, or from the checkpoint being resumed */
    char resume_dir[4096] = "";
    loom_status st;
    loom_gpt_config wanted;
    if ((st = loom_train_model_config(cfg, &wanted)) != LOOM_OK) return st;
    if (cfg->resume[0]) {
        if ((st = loom_checkpoint_resolve(cfg->resume, resume_dir, sizeof resume_dir))) return st;
        char file[4200];
        snprintf(file, sizeof file, "%s/model.safetensors", resume_dir);
        loom_gpt_config saved;
        if ((st = loom_gpt_config_from_safetensors(file, &saved)) != LOOM_OK) return st;
        if (!same_model(&saved, &wanted) && !cfg->init_from[0]) {
            loom_warn("resume: the checkpoint's model (%d layers, %d heads, width %d) replaces the "
                      "configured one",
                      saved.num_layers, saved.num_heads, saved.channels);
        }
        st = loom_gpt_create(&t->model, &saved, be);
    } else if (cfg->init_from[0]) {
        st = loom_model_load(cfg->init_from, be, &t->model);
        if (st == LOOM_OK) loom_info("initialised from %s", cfg->init_from);
    } else {
        st = loom_gpt_create(&t->model, &wanted, be);
        if (st == LOOM_OK) loom_gpt_init_weights(t->model, cfg->seed);
    }
    if (st != LOOM_OK || !t->model) return st != LOOM_OK ? st : LOOM_ERR_RUNTIME;
    const loom_gpt_config *mc = &t->model->config;
    if (cfg->seq_len > mc->max_seq_len) {
        return loom_fail(LOOM_ERR_INPUT,
                         "config: seq_len: expected at most the model's context %d, got %d",
                         mc->max_seq_len, cfg->seq_len);
    }
    if ((st = loom_gpt_reserve(t->model, cfg->micro_batch_size, cfg->seq_len))) return st;
    size_t n = t->model->num_params;
    t->m = loom_alloc_aligned(n * sizeof(float), "AdamW first moment");
    t->v = loom_alloc_aligned(n * sizeof(float), "AdamW second moment");
    size_t bt = (size_t)cfg->micro_batch_size * (size_t)cfg->seq_len;
    t->inputs = loom_calloc(bt, sizeof(int32_t), "inputs");
    t->targets = loom_calloc(bt, sizeof(int32_t), "targets");
    if (!t->m || !t->v || !t->inputs || !t->targets) return LOOM_ERR_NOMEM;

    /* data */
    if ((st = loom_dataset_open(&t->train_data, cfg->data, mc->vocab_size))) return st;
    if ((st = loom_loader_create(&t->train_loader, t->train_data, cfg->seq_len, 1, cfg->seed)))
        return st;
    if (cfg->val_data[0] && cfg->eval_every > 0) {
        if ((st = loom_dataset_open(&t->val_data, cfg->val_data, mc->vocab_size))) return st;
        if ((st = loom_loader_create(&t->val_loader, t->val_data, cfg->seq_len, 0, cfg->seed)))
            return st;
    }

    /* state */
    loom_rng rng;
    loom_rng_seed(&rng, cfg->seed);
    t->state = (loom_ckpt_state){.rng_state = rng.state};
    if (resume_dir[0]) {
        if ((st = loom_checkpoint_load(resume_dir, t->model, t->m, t->v, &t->state))) return st;
        loom_loader_pos pos = {t->state.data_epoch, t->state.data_index};
        if (loom_loader_set_pos(t->train_loader, pos) != LOOM_OK) {
            return loom_fail(LOOM_ERR_INPUT, "%s: data position does not fit the data: %s",
                             resume_dir, loom_last_error());
        }
        loom_info("resumed from %s at step %" PRId64, resume_dir, t->state.step);
    }
    t->first_step = t->state.step;

    /* output */
    if ((st = loom_mkdir_p(cfg->out))) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->out);
    if (resume_dir[0]) {
        if ((st = metrics_truncate(path, t->state.step))) return st;
    }
    t->metrics = fopen(path, resume_dir[0] ? "a" : "w");
    if (!t->metrics) return loom_fail(LOOM_ERR_IO, "%s: cannot open for writing", path);

    t->peak_gflops = loom_ops_sgemm_peak_gflops(1024, 3);
    t->flops_per_token = loom_gpt_flops_per_token(mc, cfg->seq_len);
    t->progress_bar = isatty(STDOUT_FILENO);
    loom_info("model: %d layers, %d heads, width %d, context %d, vocab %d (padded %d): %.2fM "
              "parameters",
              mc->num_layers, mc->num_heads, mc->channels, mc->max_seq_len, mc->vocab_size,
              mc->padded_vocab_size, (double)loom_gpt_num_real_params(mc) / 1e6);
    loom_info("data: %zu training tokens (%zu windows of %d)%s",
              loom_dataset_num_tokens(t->train_data), loom_loader_num_windows(t->train_loader),
              cfg->seq_len, t->val_data ? "" : "; no validation");
    loom_info("threads: %d; sgemm peak %.1f GFLOP/s (1024^3, measured); MFU is against it",
              loom_ops_get_threads(), t->peak_gflops);
    return LOOM_OK;
}

static void json_number(FILE *f, const char *key, double value, int last) {
    if (isfinite(value)) {
        fprintf(f, "\"%s\": %.9g%s", key, value, last ? "" : ", ");
    } else {
        fprintf(f, "\"%s\": null%s", key, last ? "" : ", ");
    }
}

/* Mean loss over the first eval_batches global batches of the validation split (capped at the
 * split's size), in micro-batches: the same windows whatever the micro-batch size. */
static double validation_loss(trainer *t) {
    const loom_train_config *cfg = t->cfg;
    loom_loader_set_pos(t->val_loader, (loom_loader_pos){0, 0});
    int64_t windows = (int64_t)cfg->eval_batches * cfg->global_batch_size;
    int64_t available = (int64_t)loom_loader_num_windows(t->val_loader);
    if (windows > available) windows = available;
    double sum = 0.0;
    for (int64_t done = 0; done < windows;) {
        int b =
            windows - done < cfg->micro_batch_size ? (int)(windows - done) : cfg->micro_batch_size;
        loom_loader_next(t->val_loader, b, t->inputs, t->targets);
        sum += (double)loom_gpt_forward(t->model, t->inputs, t->targets, b, cfg->seq_len) * b;
        done += b;
    }
    return sum / (double)windows;
}

static int nan_injected(const loom_train_config *cfg, int64_t step) {
    /* test hook: LOOM_DEBUG_NAN_STEPS="3,4,5" poisons those (1-based) steps' gradients */
    const char *env = getenv("LOOM_DEBUG_NAN_STEPS");
    if (!env) return 0;
    for (const char *p = env; *p;) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p) break;
        if (v == step) return 1;
        p = *end ? end + 1 : end;
    }
    (void)cfg;
    return 0;
}

static void progress_bar(const trainer *t, int64_t done) {
    const loom_train_config *cfg = t->cfg;
    int64_t run_done = done - t->first_step, run_total = cfg->steps - t->first_step;
    double elapsed = loom_now() - t->run_start;
    double eta = run_done > 0 ? elapsed / (double)run_done * (double)(run_total - run_done) : 0.0;
    int width = 30, filled = (int)(width * (double)done / (double)cfg->steps);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '=' : ' ';
    bar[width] = '\0';
    printf("\r[%s] %" PRId64 "/%" PRId64 "  ETA %dm%02ds", bar, done, cfg->steps, (int)(eta / 60),
           (int)eta % 60);
    fflush(stdout);
}

static loom_status train_step(trainer *t, int64_t step) {
    const loom_train_config *cfg = t->cfg;
    loom_gpt *model = t->model;
    const loom_backend *be = model->backend;
    int B = cfg->micro_batch_size, T = cfg->seq_len;
    double t0 = loom_now();
    double lr = loom_lr_at(cfg, step);

    loom_gpt_zero_grad(model);
    double loss_sum = 0.0;
    float dloss = 1.0f / ((float)B * (float)T * (float)t->accum);
    for (int a = 0; a < t->accum; a++) {
        loom_loader_next(t->train_loader, B, t->inputs, t->targets);
        loss_sum += loom_gpt_forward(model, t->inputs, t->targets, B, T);
        loom_gpt_backward(model, dloss);
    }
    double loss = loss_sum / t->accum;
    if (nan_injected(cfg, step + 1)) model->grads_memory[0] = NAN;
    double grad_norm = sqrt(be->sum_squares(model->grads_memory, (int64_t)model->num_params));

    int skipped = !isfinite(loss) || !isfinite(grad_norm);
    if (skipped) {
        t->state.bad_steps++;
        t->state.skipped_total++;
        loom_warn("step %" PRId64 ": loss %g, grad norm %g: not finite, step skipped (%" PRId64
                  " in a row, limit %d)",
                  step + 1, loss, grad_norm, t->state.bad_steps, cfg->max_bad_steps);
    } else {
        t->state.bad_steps = 0;
        float grad_scale = 1.0f;
        if (cfg->grad_clip > 0 && grad_norm > cfg->grad_clip) {
            grad_scale = (float)(cfg->grad_clip / grad_norm);
        }
        int64_t update = step + 1 - t->state.skipped_total; /* AdamW's t counts applied updates */
        for (int i = 0; i < model->num_segments; i++) {
            const loom_gpt_segment *seg = &model->segments[i];
            be->adamw_update(model->params_memory + seg->offset, model->grads_memory + seg->offset,
                             t->m + seg->offset, t->v + seg->offset, seg->numel, (float)lr,
                             (float)cfg->beta1, (float)cfg->beta2, (float)cfg->eps,
                             seg->decay ? (float)cfg->weight_decay : 0.0f, update, grad_scale);
        }
    }
    t->state.step = step + 1;
    loom_loader_pos pos = loom_loader_get_pos(t->train_loader);
    t->state.data_epoch = pos.epoch;
    t->state.data_index = pos.index;
    t->last_loss = loss;

    double seconds = loom_now() - t0;
    double tokens_per_s = (double)cfg->global_batch_size * T / seconds;
    double mfu =
        t->peak_gflops > 0 ? t->flops_per_token * tokens_per_s / (t->peak_gflops * 1e9) : 0.0;
    FILE *f = t->metrics;
    fprintf(f, "{\"step\": %" PRId64 ", ", step + 1);
    json_number(f, "loss", loss, 0);
    json_number(f, "lr", lr, 0);
    json_number(f, "grad_norm", grad_norm, 0);
    json_number(f, "ms", seconds * 1e3, 0);
    json_number(f, "tokens_per_s", tokens_per_s, 0);
    json_number(f, "mfu", mfu, 0);
    fprintf(f, "\"skipped\": %s}\n", skipped ? "true" : "false");
    fflush(f);

    int64_t done = step + 1;
    if (done == 1 || done % cfg->log_every == 0 || done == cfg->steps || skipped) {
        if (t->progress_bar) printf("\r\033[K");
        loom_info("step %6" PRId64 "/%" PRId64 " | loss %.4f | lr %.3e | grad norm %.3f | "
                  "%.1f ms | %.0f tok/s | MFU %.1f%%",
                  done, cfg->steps, loss, lr, grad_norm, seconds * 1e3, tokens_per_s, 100 * mfu);
    }
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
    double val = validation_loss(t);
    t->last_val_loss = val;
    if (t->progress_bar) printf("\r\033[K");
    loom_info("step %6" PRId64 "/%" PRId64 " | val loss %.4f | val perplexity %.2f", t->state.step,
              t->cfg->steps, val, exp(val));
    fprintf(t->metrics, "{\"step\": %" PRId64 ", ", t->state.step);
    json_number(t->metrics, "val_loss", val, 1);
    fprintf(t->metrics, "}\n");
    fflush(t->metrics);
    return LOOM_OK;
}

static loom_status save_checkpoint(trainer *t) {
    loom_status st = loom_checkpoint_save(t->cfg->out, t->model, t->m, t->v, &t->state);
    if (st == LOOM_OK) {
        if (t->progress_bar) printf("\r\033[K");
        loom_info("saved checkpoint %s/checkpoints/step_%08" PRId64, t->cfg->out, t->state.step);
    }
    return st;
}

/* Reads metrics.jsonl back and plots training and validation loss. */
static loom_status write_plot(const char *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    char *text;
    size_t size;
    loom_status st = loom_read_file(path, &text, &size);
    if (st != LOOM_OK) return st;
    size_t cap = 1, n = 0, nv = 0; /* one record per line at most */
    for (size_t i = 0; i < size; i++) cap += text[i] == '\n';
    int64_t *steps = malloc(cap * sizeof *steps), *vsteps = malloc(cap * sizeof *vsteps);
    double *loss = malloc(cap * sizeof *loss), *vloss = malloc(cap * sizeof *vloss);
    for (char *line = text; line && *line && steps && vsteps && loss && vloss;) {
        char *next = strchr(line, '\n');
        size_t len = next ? (size_t)(next - line) : strlen(line);
        json_t *obj = json_loadb(line, len, 0, NULL);
        json_t *s = json_object_get(obj, "step");
        json_t *l = json_object_get(obj, "loss"), *vl = json_object_get(obj, "val_loss");
        if (json_is_integer(s) && json_is_number(l)) {
            steps[n] = json_integer_value(s), loss[n++] = json_number_value(l);
        }
        if (json_is_integer(s) && json_is_number(vl)) {
            vsteps[nv] = json_integer_value(s), vloss[nv++] = json_number_value(vl);
        }
        json_decref(obj);
        line = next ? next + 1 : NULL;
    }
    if (steps && loss && vsteps && vloss) {
        snprintf(path, sizeof path, "%s/loss.svg", out);
        st = loom_plot_loss_svg(path, "loom: training loss", steps, loss, n, vsteps, vloss, nv);
        if (st == LOOM_OK) loom_info("loss plot: %s", path);
    } else {
        st = loom_fail(LOOM_ERR_NOMEM, "out of memory plotting %s", path);
    }
    free(text), free(steps), free(loss), free(vsteps), free(vloss);
    return st;
}

loom_status loom_train_run_ex(const loom_train_config *cfg, loom_train_result *result) {
    loom_status st = loom_train_config_check(cfg);
    if (st != LOOM_OK) return st;
    trainer t;
    memset(&t, 0, sizeof t);
    st = trainer_setup(&t, cfg);
    t.run_start = loom_now();
    for (int64_t step = t.state.step; st == LOOM_OK && step < cfg->steps; step++) {
        st = train_step(&t, step);
        int64_t done = step + 1;
        if (st == LOOM_OK && t.val_loader && done % cfg->eval_every == 0) st = evaluate(&t);
        if (st == LOOM_OK && cfg->save_every > 0 && done % cfg->save_every == 0 &&
            done != cfg->steps) {
            st = save_checkpoint(&t);
        }
        if (st == LOOM_OK && t.progress_bar) progress_bar(&t, done);
    }
    if (st == LOOM_OK && t.state.step > t.first_step) {
        if (t.progress_bar) printf("\r\033[K");
        if (t.val_loader && cfg->steps % cfg->eval_every != 0) st = evaluate(&t);
        if (st == LOOM_OK) st = save_checkpoint(&t);
        if (st == LOOM_OK) st = write_plot(cfg->out);
    }
    if (result) {
        result->steps_done = t.state.step;
        result->final_loss = t.last_loss;
        result->final_val_loss = t.last_val_loss;
        result->skipped_steps = t.state.skipped_total;
    }
    trainer_free(&t);
    return st;
}

loom_status loom_train_run(const loom_train_config *cfg) {
    return loom_train_run_ex(cfg, NULL);
}
