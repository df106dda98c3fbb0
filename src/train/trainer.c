/*
 * trainer.c — the training loop: set-up (model, data, resume), the step (gradient
 * accumulation, global-norm clipping, AdamW, NaN/Inf skipping), validation, progress lines,
 * metrics.jsonl, checkpoints, and the loss plot at the end.
 *
 * Not here: parsing flags (cli), the model's maths (model), file formats (io, data).
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/io.h"
#include "loom/parallel.h"
#include "loom/trace.h"
#include "loom/train.h"
#include "io/checkpoint.h"
#include "train/plot.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { TAG_ACT = 1, TAG_GRAD = 2 }; /* pipeline messages */

typedef struct {
    const loom_train_config *cfg;
    loom_gpt *model;
    float *m, *v;     /* AdamW moments: the parameters' layout, or this rank's ZeRO-1 shard */
    loom_comm *world; /* NULL: one process */
    loom_mesh mesh;
    int have_mesh;
    int lead; /* world rank 0: progress, metrics, checkpoints */
    int dp, dp_rank;
    int tp, tp_rank;
    int pp, pp_rank;
    int *stage_first, *stage_end;      /* (pp) layer range of every pipeline stage */
    loom_comm *embed_comm;             /* first and last stage of this (dp, tp) position; or NULL */
    loom_pipe_stage_schedule schedule; /* this stage's actions for one step (pp > 1) */
    int32_t *mb_inputs, *mb_targets;   /* (accum, B, T): this step's micro-batches */
    float *act_in;                     /* (slots, B, T, C): activations received */
    float *grad_out;                   /* (B, T, C): gradient of this stage's output */
    loom_trace *trace;                 /* NULL: not tracing */
    int recompute;                     /* this stage recomputes activations in backward */
    int in_flight;                     /* micro-batches whose inputs this stage keeps */
    int last_forward_mb;               /* whose activations the model holds (recompute) */
    float *send_buf;                   /* (2, in_flight, B, T, C): outgoing acts and grads */
    loom_comm_request **send_req;      /* (2, in_flight): their non-blocking sends */
    loom_dp_sync *dp_sync;             /* DP > 1 without ZeRO-1 */
    loom_zero_shard zero;              /* ZeRO-1: this rank's range of the flat buffers */
    float *grad_shard;                 /* ZeRO-1: the reduced gradients of the range */
    loom_dataset *train_data, *val_data;
    loom_loader *train_loader, *val_loader;
    int32_t *inputs, *targets;
    int accum;    /* micro-batches per step on each DP rank */
    int per_rank; /* windows per step on each DP rank */
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
    loom_trace_free(t->trace);
    free(t->stage_first);
    free(t->stage_end);
    loom_comm_free(t->embed_comm);
    loom_pipe_schedule_free(&t->schedule);
    free(t->mb_inputs);
    free(t->mb_targets);
    loom_free_aligned(t->act_in);
    loom_free_aligned(t->grad_out);
    loom_free_aligned(t->send_buf);
    free(t->send_req);
    loom_dp_sync_free(t->dp_sync);
    loom_free_aligned(t->grad_shard);
    if (t->have_mesh) loom_mesh_free(&t->mesh);
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

/* Fills one rank's shard (local layout of `shard`: its TP rank and pipeline stage) from an
 * unsharded buffer in `full`'s layout. */
static void shard_from_full(const loom_gpt *shard, float *local, const loom_gpt *full,
                            const float *whole) {
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *li = &shard->info[k], *fi = &full->info[k];
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < li->numel; i++) {
            local[loom_gpt_element_offset(li, i)] =
                whole[loom_gpt_element_offset(fi, loom_gpt_global_index(shard, k, i))];
        }
    }
}

/* Whether stage `stage` appears in a comma-separated list like "0,2". */
static int stage_listed(const char *list, int stage) {
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return 0;
        if (v == stage) return 1;
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* Pipeline stage layer ranges from "3,5" (or as even as possible, earlier stages first). */
static loom_status parse_stages(trainer *t, const char *text, int layers) {
    int pp = t->pp;
    t->stage_first = loom_calloc((size_t)pp, sizeof(int), "stages");
    t->stage_end = loom_calloc((size_t)pp, sizeof(int), "stages");
    if (!t->stage_first || !t->stage_end) return LOOM_ERR_NOMEM;
    if (pp > layers) {
        return loom_fail(LOOM_ERR_INPUT, "--pipeline-parallel %d: more stages than the %d layers",
                         pp, layers);
    }
    int at = 0;
    const char *p = text;
    for (int s = 0; s < pp; s++) {
        int size = layers / pp + (s < layers % pp);
        if (text[0]) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v <= 0 || (*end != ',' && *end != '\0') ||
                (s < pp - 1) != (*end == ',')) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "--stage-layers: expected %d positive layer counts separated by "
                                 "commas, got \"%s\"",
                                 pp, text);
            }
            size = (int)v;
            p = *end ? end + 1 : end;
        }
        t->stage_first[s] = at;
        t->stage_end[s] = at + size;
        at += size;
    }
    if (at != layers) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--stage-layers: \"%s\" adds up to %d layers, the model has %d", text, at,
                         layers);
    }
    return LOOM_OK;
}

/* Resume of a sharded run: slice by slice, this rank keeps its part of the parameters and the
 * moments (then its ZeRO-1 range of the moments); nothing larger than one slice is read. */
typedef struct {
    loom_gpt *model;
    float *dst[3]; /* parameters, exp_avg, exp_avg_sq in the local layout */
} slice_take;

static loom_status take_slice(void *ctx, int b, int k, int layer, const float *slice) {
    slice_take *c = ctx;
    loom_gpt *m = c->model;
    if (layer >= 0 && (layer < m->first_layer || layer >= m->first_layer + m->num_local_layers)) {
        return LOOM_OK; /* another stage's */
    }
    const loom_gpt_tensor_info *li = &m->info[k];
    int64_t n = li->layer_numel;
    size_t local_layer = layer >= 0 ? (size_t)(layer - m->first_layer) : 0;
    float *dst = c->dst[b] + li->offset + local_layer * li->layer_stride;
    int64_t base = layer >= 0 ? (int64_t)local_layer * n : 0;
    int64_t full_layer = n * (loom_gpt_tensor_is_sharded(k) ? m->tp_size : 1);
    int64_t shift = layer >= 0 ? (int64_t)layer * full_layer : 0;
    for (int64_t j = 0; j < n; j++) dst[j] = slice[loom_gpt_global_index(m, k, base + j) - shift];
    return LOOM_OK;
}

static loom_status resume_sharded(trainer *t, const char *dir) {
    size_t local = t->model->num_params;
    float *lm = loom_alloc_aligned(local * sizeof(float), "moments");
    float *lv = loom_alloc_aligned(local * sizeof(float), "moments");
    loom_gpt layout;
    loom_gpt_shard whole = {0, t->model->config.num_layers, 1, 0, NULL};
    loom_status st =
        lm && lv ? loom_gpt_describe(&layout, &t->model->config, &whole) : LOOM_ERR_NOMEM;
    slice_take c = {t->model, {t->model->params_memory, lm, lv}};
    if (st == LOOM_OK) st = loom_checkpoint_load_take(dir, &layout, take_slice, &c, &t->state);
    if (st == LOOM_OK) {
        size_t count = t->zero.end - t->zero.begin;
        memcpy(t->m, lm + t->zero.begin, count * sizeof(float));
        memcpy(t->v, lv + t->zero.begin, count * sizeof(float));
    }
    loom_free_aligned(lm), loom_free_aligned(lv);
    return st;
}

/* The layout: the mesh over the world, or one process. */
static loom_status setup_parallel(trainer *t, const loom_train_config *cfg, int layers) {
    int world_size = t->world ? loom_comm_size(t->world) : 1;
    int dp = cfg->data_parallel, tp = cfg->tensor_parallel, pp = cfg->pipeline_parallel;
    if (!t->world) {
        if ((int64_t)dp * tp * pp != 1) {
            return loom_fail(
                LOOM_ERR_INPUT,
                "data x tensor x pipeline parallel = %d x %d x %d needs %d ranks; start "
                "with mpirun -np %d",
                dp, tp, pp, dp * tp * pp, dp * tp * pp);
        }
        t->dp = t->tp = t->pp = 1, t->dp_rank = t->tp_rank = t->pp_rank = 0, t->lead = 1;
        return parse_stages(t, cfg->stage_layers, layers);
    }
    if (world_size > 1 && dp * tp * pp == 1) dp = world_size; /* plain DP over every rank */
    loom_status st = loom_mesh_create(t->world, dp, tp, pp, &t->mesh);
    if (st != LOOM_OK) return st;
    t->have_mesh = 1;
    t->dp = t->mesh.dp_size, t->dp_rank = t->mesh.dp_rank;
    t->tp = t->mesh.tp_size, t->tp_rank = t->mesh.tp_rank;
    t->pp = t->mesh.pp_size, t->pp_rank = t->mesh.pp_rank;
    t->lead = loom_comm_rank(t->world) == 0;
    loom_comm_set_timeout(cfg->comm_timeout);
    if (cfg->global_batch_size % (cfg->micro_batch_size * t->dp) != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "config: global_batch_size: expected a multiple of micro_batch_size x "
                         "data parallel = %d x %d, got %d",
                         cfg->micro_batch_size, t->dp, cfg->global_batch_size);
    }
    if ((st = parse_stages(t, cfg->stage_layers, layers)) != LOOM_OK) return st;
    if (t->pp > 1) {
        /* the tied embedding lives on the first and the last stage: their gradients meet */
        int ends = t->pp_rank == 0 || t->pp_rank == t->pp - 1;
        st = loom_comm_split(t->world, ends ? t->dp_rank * t->tp + t->tp_rank : -1, t->pp_rank,
                             "embedding", &t->embed_comm);
    }
    return st;
}

static loom_status trainer_setup(trainer *t, const loom_train_config *cfg) {
    t->cfg = cfg;
    t->last_val_loss = NAN;
    loom_ops_set_threads(cfg->threads);
    const loom_backend *be = loom_backend_cpu();

    /* the model: fresh, from --init-from, or from the checkpoint being resumed */
    char resume_dir[4096] = "";
    loom_status st;
    loom_gpt_config wanted;
    if ((st = loom_train_model_config(cfg, &wanted)) != LOOM_OK) return st;
    if ((st = setup_parallel(t, cfg, wanted.num_layers)) != LOOM_OK) return st;
    t->per_rank = cfg->global_batch_size / t->dp;
    t->accum = t->per_rank / cfg->micro_batch_size;
    /* weights that come from a file are read whole (into `full`) and then cut to this rank's
     * tensor-parallel shard; TODO: read only the shard's slices for models that do not fit */
    loom_gpt *full = NULL;
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
        if (t->tp == 1 && t->pp == 1) {
            st = loom_gpt_create(&full, &saved, be);
        } else {
            wanted = saved; /* the shard is created below and filled slice by slice */
        }
    } else if (cfg->init_from[0]) {
        st = loom_model_load(cfg->init_from, be, &full);
        if (st == LOOM_OK) loom_info("initialised from %s", cfg->init_from);
    }
    if (st != LOOM_OK) return st;
    if (full && t->tp == 1 && t->pp == 1) {
        t->model = full; /* the whole model is this rank's */
    } else {
        loom_gpt_shard shard = {t->stage_first[t->pp_rank], t->stage_end[t->pp_rank], t->tp,
                                t->tp_rank, t->have_mesh ? t->mesh.tp : NULL};
        st = loom_gpt_create_shard(&t->model, full ? &full->config : &wanted, be, &shard);
        if (st == LOOM_OK && full) {
            shard_from_full(t->model, t->model->params_memory, full, full->params_memory);
        } else if (st == LOOM_OK && !cfg->resume[0]) {
            loom_gpt_init_weights(t->model, cfg->seed); /* a resume fills it from the file */
        }
        loom_gpt_free(full); /* --init-from: the shard is copied out */
        full = NULL;
    }
    if (st != LOOM_OK) {
        loom_gpt_free(full);
        return st;
    }
    if (st != LOOM_OK || !t->model) return st != LOOM_OK ? st : LOOM_ERR_RUNTIME;
    const loom_gpt_config *mc = &t->model->config;
    if (cfg->seq_len > mc->max_seq_len) {
        return loom_fail(LOOM_ERR_INPUT,
                         "config: seq_len: expected at most the model's context %d, got %d",
                         mc->max_seq_len, cfg->seq_len);
    }
    int slots = 1;
    if (t->pp > 1) {
        loom_schedule_kind kind;
        if ((st = loom_schedule_kind_parse(cfg->schedule, &kind)) != LOOM_OK) return st;
        st = loom_pipe_schedule(kind, t->pp, t->accum, t->pp_rank, &t->schedule);
        if (st != LOOM_OK) return st;
        slots = loom_pipe_peak_in_flight(&t->schedule);
        t->in_flight = slots;
        t->recompute = cfg->recompute || stage_listed(cfg->recompute_stages, t->pp_rank);
        if (t->recompute) slots = 1; /* one activation set; inputs kept for every micro-batch */
        size_t btc = (size_t)cfg->micro_batch_size * (size_t)cfg->seq_len * (size_t)mc->channels;
        size_t bt_all = (size_t)t->accum * (size_t)cfg->micro_batch_size * (size_t)cfg->seq_len;
        t->act_in = loom_alloc_aligned(btc * (size_t)t->in_flight * sizeof(float), "stage inputs");
        t->grad_out = loom_alloc_aligned(btc * sizeof(float), "stage output gradient");
        t->send_buf = loom_alloc_aligned(2 * btc * (size_t)t->in_flight * sizeof(float), "sends");
        t->send_req = loom_calloc(2 * (size_t)t->in_flight, sizeof *t->send_req, "sends");
        if (!t->send_buf || !t->send_req) return LOOM_ERR_NOMEM;
        t->mb_inputs = loom_calloc(bt_all, sizeof(int32_t), "micro-batch inputs");
        t->mb_targets = loom_calloc(bt_all, sizeof(int32_t), "micro-batch targets");
        if (!t->act_in || !t->grad_out || !t->mb_inputs || !t->mb_targets) return LOOM_ERR_NOMEM;
    }
    if ((st = loom_gpt_reserve_slots(t->model, cfg->micro_batch_size, cfg->seq_len, slots))) {
        return st;
    }
    size_t n = t->model->num_params;
    if (cfg->zero1 && t->dp > 1) {
        t->zero = loom_zero_shard_of(n, t->dp, t->dp_rank);
        if (t->zero.padded_count > n + LOOM_GPT_PAD_FLOATS) {
            return loom_fail(LOOM_ERR_INPUT, "--zero1: at most %d data-parallel ranks",
                             LOOM_GPT_PAD_FLOATS);
        }
        n = t->zero.shard;
        t->grad_shard = loom_alloc_aligned(n * sizeof(float), "ZeRO-1 gradient shard");
        if (!t->grad_shard) return LOOM_ERR_NOMEM;
    } else {
        t->zero = loom_zero_shard_of(n, 1, 0);
        if (t->dp > 1) {
            st = loom_dp_sync_create(&t->dp_sync, t->mesh.dp, t->model->grads_memory, n,
                                     (size_t)(cfg->bucket_mb * 1024 * 1024));
            if (st != LOOM_OK) return st;
        }
    }
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
    if (resume_dir[0] && !full && (t->tp > 1 || t->pp > 1)) {
        /* sharded: read the checkpoint one slice at a time, keep this rank's part */
        st = resume_sharded(t, resume_dir);
        if (st != LOOM_OK) return st;
    } else if (resume_dir[0]) {
        /* one process holds the whole model; under ZeRO-1 it keeps its range of the moments */
        size_t whole = t->model->num_params;
        float *m = loom_alloc_aligned(whole * sizeof(float), "moments");
        float *v = loom_alloc_aligned(whole * sizeof(float), "moments");
        st = m && v ? loom_checkpoint_load(resume_dir, t->model, m, v, &t->state) : LOOM_ERR_NOMEM;
        if (st == LOOM_OK) {
            size_t count = t->zero.end - t->zero.begin;
            memcpy(t->m, m + t->zero.begin, count * sizeof(float));
            memcpy(t->v, v + t->zero.begin, count * sizeof(float));
        }
        loom_free_aligned(m), loom_free_aligned(v);
        if (st != LOOM_OK) return st;
    }
    if (resume_dir[0]) {
        loom_loader_pos pos = {t->state.data_epoch, t->state.data_index};
        if (loom_loader_set_pos(t->train_loader, pos) != LOOM_OK) {
            return loom_fail(LOOM_ERR_INPUT, "%s: data position does not fit the data: %s",
                             resume_dir, loom_last_error());
        }
        loom_info("resumed from %s at step %" PRId64, resume_dir, t->state.step);
    }
    t->first_step = t->state.step;

    /* output: one writer */
    t->flops_per_token = loom_gpt_flops_per_token(mc, cfg->seq_len);
    if (!t->lead) return LOOM_OK;
    if ((st = loom_mkdir_p(cfg->out))) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->out);
    if (resume_dir[0]) {
        if ((st = metrics_truncate(path, t->state.step))) return st;
    }
    t->metrics = fopen(path, resume_dir[0] ? "a" : "w");
    if (!t->metrics) return loom_fail(LOOM_ERR_IO, "%s: cannot open for writing", path);

    /* every rank is assumed as fast as this one: the job's peak is world size x this */
    int ranks = t->world ? loom_comm_size(t->world) : 1;
    t->peak_gflops = loom_ops_sgemm_peak_gflops(1024, 3) * ranks;
    t->progress_bar = isatty(STDOUT_FILENO);
    loom_info("model: %d layers, %d heads, width %d, context %d, vocab %d (padded %d): %.2fM "
              "parameters",
              mc->num_layers, mc->num_heads, mc->channels, mc->max_seq_len, mc->vocab_size,
              mc->padded_vocab_size, (double)loom_gpt_num_real_params(mc) / 1e6);
    loom_info("data: %zu training tokens (%zu windows of %d)%s",
              loom_dataset_num_tokens(t->train_data), loom_loader_num_windows(t->train_loader),
              cfg->seq_len, t->val_data ? "" : "; no validation");
    loom_info("ranks: %d (data parallel %d%s x tensor parallel %d x pipeline parallel %d%s%s%s); "
              "threads per rank: %d; sgemm peak %.1f GFLOP/s (1024^3, measured, x ranks); MFU is "
              "against it",
              ranks, t->dp, t->grad_shard ? " with ZeRO-1" : "", t->tp, t->pp,
              t->pp > 1 ? ", schedule " : "", t->pp > 1 ? cfg->schedule : "",
              t->recompute ? ", this stage recomputes activations" : "", loom_ops_get_threads(),
              t->peak_gflops);
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
 * split's size), in micro-batches, the windows shared out among DP ranks: the same windows
 * whatever the layout. */
static loom_status validation_loss(trainer *t, double *mean) {
    const loom_train_config *cfg = t->cfg;
    int64_t windows = (int64_t)cfg->eval_batches * cfg->global_batch_size;
    int64_t available = (int64_t)loom_loader_num_windows(t->val_loader);
    if (windows > available) windows = available;
    int64_t first = windows * t->dp_rank / t->dp, last = windows * (t->dp_rank + 1) / t->dp;
    double sum = 0.0;
    if (first < last) loom_loader_set_pos(t->val_loader, (loom_loader_pos){0, (uint64_t)first});
    for (int64_t done = first; done < last;) {
        int b = last - done < cfg->micro_batch_size ? (int)(last - done) : cfg->micro_batch_size;
        loom_loader_next(t->val_loader, b, t->inputs, t->targets);
        loom_comm_progress("validation");
        if (t->pp == 1) {
            sum += (double)loom_gpt_forward(t->model, t->inputs, t->targets, b, cfg->seq_len) * b;
        } else {
            /* forward only, stage after stage */
            loom_gpt *m = t->model;
            int64_t bytes = (int64_t)b * cfg->seq_len * m->config.channels * (int64_t)sizeof(float);
            loom_status st = LOOM_OK;
            loom_gpt_use_slot(m, 0);
            if (!m->has_embedding)
                st = loom_comm_recv(t->mesh.pp, t->act_in, bytes, t->pp_rank - 1, TAG_ACT);
            if (st != LOOM_OK) return st;
            float loss =
                loom_gpt_forward_stage(m, t->inputs, t->act_in, t->targets, b, cfg->seq_len);
            if (m->has_head) sum += (double)loss * b;
            if (!m->has_head)
                st = loom_comm_send(t->mesh.pp, loom_gpt_stage_output(m), bytes, t->pp_rank + 1,
                                    TAG_ACT);
            if (st != LOOM_OK) return st;
        }
        done += b;
    }
    if (t->dp > 1) {
        loom_status st = loom_comm_allreduce_f64(t->mesh.dp, &sum, 1, LOOM_REDUCE_SUM);
        if (st != LOOM_OK) return st;
    }
    if (t->pp > 1) {
        loom_status st = loom_comm_allreduce_f64(t->mesh.pp, &sum, 1, LOOM_REDUCE_SUM);
        if (st != LOOM_OK) return st;
    }
    *mean = sum / (double)windows;
    return LOOM_OK;
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

/* Test hook: LOOM_DEBUG_FAIL="RANK:STEP:exit|hang" makes world rank RANK die or hang at the
 * start of (1-based) step STEP, to check that the job still ends, in bounded time. */
static void injected_failure(const trainer *t, int64_t step) {
    const char *env = getenv("LOOM_DEBUG_FAIL");
    if (!env || !t->world) return;
    int rank = -1;
    long long at = -1;
    char mode[16] = "";
    if (sscanf(env, "%d:%lld:%15s", &rank, &at, mode) != 3) return;
    if (rank != loom_comm_rank(t->world) || at != step) return;
    if (!strcmp(mode, "exit")) _exit(3);
    if (!strcmp(mode, "hang")) {
        for (;;) pause();
    }
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

/* AdamW over [lo, hi) of the flat buffer, segment by segment (decay on 2-D weights only);
 * grads, m and v are indexed from `base` (0 for whole buffers, the shard start for ZeRO-1). */
static void adamw_range(trainer *t, size_t lo, size_t hi, size_t base, const float *grads,
                        double lr, int64_t update, float grad_scale) {
    const loom_train_config *cfg = t->cfg;
    loom_gpt *model = t->model;
    for (int i = 0; i < model->num_segments; i++) {
        const loom_gpt_segment *seg = &model->segments[i];
        size_t a = seg->offset > lo ? seg->offset : lo;
        size_t b = seg->offset + (size_t)seg->numel < hi ? seg->offset + (size_t)seg->numel : hi;
        if (a >= b) continue;
        model->backend->adamw_update(
            model->params_memory + a, grads + (a - base), t->m + (a - base), t->v + (a - base),
            (int64_t)(b - a), (float)lr, (float)cfg->beta1, (float)cfg->beta2, (float)cfg->eps,
            seg->decay ? (float)cfg->weight_decay : 0.0f, update, grad_scale);
    }
}

/* Sums of squares over [lo, hi) of the flat buffer (grads indexed from base), split into
 * tensor-parallel-sharded tensors (out[0]) and replicated ones (out[1]). */
static void sum_squares_split(trainer *t, const float *grads, size_t base, size_t lo, size_t hi,
                              double out[2]) {
    loom_gpt *model = t->model;
    out[0] = out[1] = 0.0;
    for (int i = 0; i < model->num_segments; i++) {
        const loom_gpt_segment *seg = &model->segments[i];
        size_t a = seg->offset > lo ? seg->offset : lo;
        size_t b = seg->offset + (size_t)seg->numel < hi ? seg->offset + (size_t)seg->numel : hi;
        if (a >= b) continue;
        /* each parameter once: the embeddings where they are used first, the final LayerNorm
         * on the head stage (other stages' copies are idle or mirror them) */
        int k = seg->tensor;
        if ((k == LOOM_WTE || k == LOOM_WPE) && !model->has_embedding) continue;
        if ((k == LOOM_LNFW || k == LOOM_LNFB) && !model->has_head) continue;
        double s = model->backend->sum_squares(grads + (a - base), (int64_t)(b - a));
        out[t->tp > 1 && loom_gpt_tensor_is_sharded(seg->tensor) ? 0 : 1] += s;
    }
}

/* Forward and backward of this rank's share of the global batch, with the DP gradient
 * allreduce started bucket by bucket during the last micro-batch's backward. */
static void start_dp_overlap(trainer *t) {
    if (!t->dp_sync) return;
    loom_dp_sync_begin(t->dp_sync);
    t->model->grads_ready = loom_dp_sync_ready;
    t->model->grads_ready_ctx = t->dp_sync;
}

/* Sends `bytes` from src to the neighbouring stage without waiting: the data is copied into a
 * ring slot (kind 0: activations, 1: gradients; one slot per micro-batch in flight), whose
 * previous send is completed first. */
static loom_status send_async(trainer *t, int kind, int mb, const float *src, int64_t bytes,
                              int peer, int tag) {
    int slot = kind * t->in_flight + mb % t->in_flight;
    loom_status st = LOOM_OK;
    if (t->send_req[slot]) st = loom_comm_wait(t->send_req[slot]);
    t->send_req[slot] = NULL;
    if (st != LOOM_OK) return st;
    float *buf = t->send_buf + (size_t)slot * (size_t)(bytes / (int64_t)sizeof(float));
    memcpy(buf, src, (size_t)bytes);
    return loom_comm_isend(t->mesh.pp, buf, bytes, peer, tag, &t->send_req[slot]);
}

static loom_status wait_sends(trainer *t) {
    loom_status st = LOOM_OK;
    for (int i = 0; i < 2 * t->in_flight; i++) {
        if (!t->send_req[i]) continue;
        loom_status r = loom_comm_wait(t->send_req[i]);
        t->send_req[i] = NULL;
        if (st == LOOM_OK) st = r;
    }
    return st;
}

/* One step's micro-batches through the pipeline, following this stage's schedule (plain data:
 * see loom_pipe_schedule). Activations and their gradients go point to point to the
 * neighbouring stages: sends are non-blocking (completed when their buffer comes round again,
 * or at the end of the step), receives wait at their place in the list, which cannot
 * deadlock. */
static loom_status run_pipeline(trainer *t, float dloss, double *loss_sum) {
    const loom_train_config *cfg = t->cfg;
    loom_gpt *model = t->model;
    int B = cfg->micro_batch_size, T = cfg->seq_len, slots = model->slots;
    size_t bt = (size_t)B * (size_t)T, btc = bt * (size_t)model->config.channels;
    int64_t bytes = (int64_t)(btc * sizeof(float));
    loom_comm *pp = t->mesh.pp;
    loom_status st = LOOM_OK;
    t->last_forward_mb = -1;
    for (int i = 0; i < t->schedule.count && st == LOOM_OK; i++) {
        loom_pipe_action act = t->schedule.actions[i];
        int mb = act.micro_batch, slot = t->recompute ? 0 : mb % slots;
        float *input = t->act_in + (size_t)(mb % t->in_flight) * btc;
        int compute = act.op == LOOM_PIPE_FORWARD || act.op == LOOM_PIPE_BACKWARD;
        double t0 = loom_trace_now_us();
        const int32_t *tokens = t->mb_inputs + (size_t)mb * bt;
        const int32_t *targets = t->mb_targets + (size_t)mb * bt;
        switch (act.op) {
        case LOOM_PIPE_RECV_ACT:
            st = loom_comm_recv(pp, input, bytes, t->pp_rank - 1, TAG_ACT);
            break;
        case LOOM_PIPE_FORWARD:
            loom_gpt_use_slot(model, slot);
            loom_comm_progress("pipeline forward");
            *loss_sum += loom_gpt_forward_stage(model, tokens, input, targets, B, T);
            t->last_forward_mb = mb;
            break;
        case LOOM_PIPE_SEND_ACT:
            loom_gpt_use_slot(model, slot);
            if (t->recompute && t->last_forward_mb != mb) {
                loom_gpt_forward_stage(model, tokens, input, targets, B, T);
                t->last_forward_mb = mb;
            }
            st = send_async(t, 0, mb, loom_gpt_stage_output(model), bytes, t->pp_rank + 1, TAG_ACT);
            break;
        case LOOM_PIPE_RECV_GRAD:
            st = loom_comm_recv(pp, t->grad_out, bytes, t->pp_rank + 1, TAG_GRAD);
            break;
        case LOOM_PIPE_BACKWARD:
            loom_gpt_use_slot(model, slot);
            if (t->recompute && t->last_forward_mb != mb) {
                /* activations were dropped: rebuild them from the kept input */
                loom_comm_progress("pipeline recompute");
                loom_gpt_forward_stage(model, tokens, input, targets, B, T);
                t->last_forward_mb = mb;
            }
            if (mb == t->accum - 1) start_dp_overlap(t);
            loom_comm_progress("pipeline backward");
            loom_gpt_backward_stage(model, dloss, model->has_head ? NULL : t->grad_out);
            model->grads_ready = NULL;
            break;
        case LOOM_PIPE_SEND_GRAD:
            st = send_async(t, 1, mb, loom_gpt_stage_input_grad(model), bytes, t->pp_rank - 1,
                            TAG_GRAD);
            break;
        }
        loom_trace_event(t->trace, compute ? LOOM_TRACE_COMPUTE : LOOM_TRACE_PP,
                         loom_pipe_op_name(act.op), compute ? "compute" : "pp",
                         t0 - loom_trace_origin_us(t->trace), loom_trace_now_us() - t0,
                         t->state.step + 1, mb);
    }
    loom_status sent = wait_sends(t);
    return st != LOOM_OK ? st : sent;
}

/* The tied embedding's two copies (first and last stage) get the sum of both gradients. */
static loom_status sync_embedding(trainer *t, float *grads) {
    if (!t->embed_comm) return LOOM_OK;
    const loom_gpt_tensor_info *wte = &t->model->info[LOOM_WTE];
    return loom_comm_allreduce_f32(t->embed_comm, grads + wte->offset, wte->numel, LOOM_REDUCE_SUM);
}

static loom_status reduce_gradients(trainer *t);

/* Forward and backward of this rank's share of the global batch (through the pipeline when
 * there is one), with the DP gradient allreduce started bucket by bucket during the last
 * micro-batch's backward. */
static loom_status accumulate_gradients(trainer *t, double *loss_sum) {
    const loom_train_config *cfg = t->cfg;
    loom_gpt *model = t->model;
    int B = cfg->micro_batch_size, T = cfg->seq_len;
    /* the mean over the global batch: every token of every rank weighs 1/(G*T) */
    float dloss = 1.0f / ((float)B * (float)T * (float)t->accum * (float)t->dp);
    loom_gpt_zero_grad(model);
    loom_loader_skip(t->train_loader, (uint64_t)t->dp_rank * (uint64_t)t->per_rank);
    *loss_sum = 0.0;
    loom_status st = LOOM_OK;
    if (t->pp > 1) {
        /* every stage reads the same windows: the first needs the tokens, the last the targets */
        size_t bt = (size_t)B * (size_t)T;
        for (int a = 0; a < t->accum; a++) {
            loom_loader_next(t->train_loader, B, t->mb_inputs + (size_t)a * bt,
                             t->mb_targets + (size_t)a * bt);
        }
        st = run_pipeline(t, dloss, loss_sum);
    } else {
        for (int a = 0; a < t->accum; a++) {
            loom_loader_next(t->train_loader, B, t->inputs, t->targets);
            loom_comm_progress("forward");
            double t0 = loom_trace_now_us();
            *loss_sum += loom_gpt_forward(model, t->inputs, t->targets, B, T);
            double t1 = loom_trace_now_us();
            if (a == t->accum - 1) start_dp_overlap(t);
            loom_comm_progress("backward");
            loom_gpt_backward(model, dloss);
            model->grads_ready = NULL;
            double origin = loom_trace_origin_us(t->trace);
            loom_trace_event(t->trace, LOOM_TRACE_COMPUTE, "forward", "compute", t0 - origin,
                             t1 - t0, t->state.step + 1, a);
            loom_trace_event(t->trace, LOOM_TRACE_COMPUTE, "backward", "compute", t1 - origin,
                             loom_trace_now_us() - t1, t->state.step + 1, a);
        }
    }
    loom_loader_skip(t->train_loader, (uint64_t)(t->dp - 1 - t->dp_rank) * (uint64_t)t->per_rank);
    if (st != LOOM_OK) return st;
    double t0 = loom_trace_now_us();
    st = reduce_gradients(t);
    loom_trace_event(t->trace, LOOM_TRACE_DP, "gradient sync (wait)", "dp",
                     t0 - loom_trace_origin_us(t->trace), loom_trace_now_us() - t0,
                     t->state.step + 1, -1);
    return st;
}

/* Data-parallel reduction (finishing the overlapped buckets, or ZeRO-1's reduce-scatter) and
 * the tied embedding's sum between first and last stage. */
static loom_status reduce_gradients(trainer *t) {
    loom_gpt *model = t->model;
    loom_status st;
    if (t->dp_sync) {
        st = loom_dp_sync_finish(t->dp_sync);
        if (st == LOOM_OK) st = sync_embedding(t, model->grads_memory);
        return st;
    }
    if (t->grad_shard) {
        /* the embedding first: ZeRO ranges differ between the stages' buffers */
        st = sync_embedding(t, model->grads_memory);
        if (st != LOOM_OK) return st;
        return loom_comm_reduce_scatter_f32(t->mesh.dp, model->grads_memory, t->grad_shard,
                                            (int64_t)t->zero.shard);
    }
    return sync_embedding(t, model->grads_memory);
}

static void write_comm_metrics(trainer *t) {
    if (!t->have_mesh) return;
    loom_comm *groups[3] = {t->mesh.dp, t->mesh.tp, t->mesh.pp};
    const char *names[3] = {"dp", "tp", "pp"};
    for (int g = 0; g < 3; g++) {
        loom_comm_stats s = loom_comm_get_stats(groups[g]);
        if (t->metrics) {
            fprintf(t->metrics, "\"%s_bytes\": %" PRId64 ", \"%s_s\": %.6f, ", names[g], s.bytes,
                    names[g], s.seconds);
        }
        loom_comm_reset_stats(groups[g]);
    }
}

static loom_status train_step(trainer *t, int64_t step) {
    const loom_train_config *cfg = t->cfg;
    loom_gpt *model = t->model;
    int T = cfg->seq_len;
    double t0 = loom_now();
    double lr = loom_lr_at(cfg, step);
    char note[64];
    snprintf(note, sizeof note, "step %" PRId64, step + 1);
    loom_comm_progress(note);
    injected_failure(t, step + 1);

    double loss_sum;
    loom_status st = accumulate_gradients(t, &loss_sum);
    if (st != LOOM_OK) return st;
    if (nan_injected(cfg, step + 1)) {
        (t->grad_shard ? t->grad_shard : model->grads_memory)[0] = NAN;
    }
    /* loss: mean over DP ranks. Squared gradient norm, every parameter once: tensors split
     * across TP ranks are summed over the TP group, replicated ones counted once; under ZeRO-1
     * each DP rank adds its range. Every rank ends with the same numbers. */
    double sums[3] = {loss_sum / t->accum, 0.0, 0.0}; /* loss, sharded, replicated */
    if (t->grad_shard) {
        sum_squares_split(t, t->grad_shard, t->zero.begin, t->zero.begin, t->zero.end, sums + 1);
    } else {
        sum_squares_split(t, model->grads_memory, 0, 0, model->num_params, sums + 1);
    }
    if (t->dp > 1) {
        /* under plain DP every rank holds the whole gradient: take the largest of the (equal)
         * values rather than trusting that every rank's allreduce rounded alike */
        double norms[2] = {sums[1], sums[2]};
        if (!t->grad_shard) sums[1] = sums[2] = 0.0;
        st = loom_comm_allreduce_f64(t->mesh.dp, sums, 3, LOOM_REDUCE_SUM);
        if (st == LOOM_OK && !t->grad_shard) {
            st = loom_comm_allreduce_f64(t->mesh.dp, norms, 2, LOOM_REDUCE_MAX);
            sums[1] = norms[0], sums[2] = norms[1];
        }
        if (st != LOOM_OK) return st;
        sums[0] /= t->dp;
    }
    if (t->tp > 1) {
        st = loom_comm_allreduce_f64(t->mesh.tp, sums + 1, 1, LOOM_REDUCE_SUM);
        if (st != LOOM_OK) return st;
    }
    if (t->pp > 1) {
        /* the loss lives on the last stage, the norm's parts on every stage */
        if (!t->model->has_head) sums[0] = 0.0;
        st = loom_comm_allreduce_f64(t->mesh.pp, sums, 3, LOOM_REDUCE_SUM);
        if (st != LOOM_OK) return st;
    }
    sums[1] += sums[2];
    double loss = sums[0];
    double grad_norm = sqrt(sums[1]);

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
        double t_opt = loom_trace_now_us();
        int64_t update = step + 1 - t->state.skipped_total; /* AdamW's t counts applied updates */
        if (t->grad_shard) {
            adamw_range(t, t->zero.begin, t->zero.end, t->zero.begin, t->grad_shard, lr, update,
                        grad_scale);
            /* in place: this rank's range already sits at rank x shard in the buffer */
            st = loom_comm_allgather_f32(t->mesh.dp, model->params_memory + t->zero.begin,
                                         model->params_memory, (int64_t)t->zero.shard);
            if (st != LOOM_OK) return st;
        } else {
            adamw_range(t, 0, model->num_params, 0, model->grads_memory, lr, update, grad_scale);
        }
        loom_trace_event(t->trace, LOOM_TRACE_COMPUTE, "optimizer", "compute",
                         t_opt - loom_trace_origin_us(t->trace), loom_trace_now_us() - t_opt,
                         step + 1, -1);
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
    if (f) {
        fprintf(f, "{\"step\": %" PRId64 ", ", step + 1);
        json_number(f, "loss", loss, 0);
        json_number(f, "lr", lr, 0);
        json_number(f, "grad_norm", grad_norm, 0);
        json_number(f, "ms", seconds * 1e3, 0);
        json_number(f, "tokens_per_s", tokens_per_s, 0);
        json_number(f, "mfu", mfu, 0);
    }
    write_comm_metrics(t);
    if (f) {
        fprintf(f, "\"skipped\": %s}\n", skipped ? "true" : "false");
        fflush(f);
    }

    int64_t done = step + 1;
    if (t->lead && (done == 1 || done % cfg->log_every == 0 || done == cfg->steps || skipped)) {
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
    double val;
    loom_status st = validation_loss(t, &val);
    if (st != LOOM_OK) return st;
    t->last_val_loss = val;
    if (!t->lead) return LOOM_OK;
    if (t->progress_bar) printf("\r\033[K");
    loom_info("step %6" PRId64 "/%" PRId64 " | val loss %.4f | val perplexity %.2f", t->state.step,
              t->cfg->steps, val, exp(val));
    fprintf(t->metrics, "{\"step\": %" PRId64 ", ", t->state.step);
    json_number(t->metrics, "val_loss", val, 1);
    fprintf(t->metrics, "}\n");
    fflush(t->metrics);
    return LOOM_OK;
}

/* ---- checkpoints of a sharded model, streamed slice by slice ----------------------------
 * The lead writes the single-process files; the first replica's other ranks send it their
 * part of each tensor slice (one layer of one tensor) in file order, so no process ever holds
 * more than its shard plus one slice. */

enum { TAG_SHARD = 100 };

/* The pipeline stage that holds a slice: its layer's, the embeddings on the first, lnf on the
 * last. */
static int owner_stage(const trainer *t, int k, int layer) {
    if (layer >= 0) {
        for (int s = 0; s < t->pp; s++)
            if (layer >= t->stage_first[s] && layer < t->stage_end[s]) return s;
    }
    return (k == LOOM_WTE || k == LOOM_WPE) ? 0 : t->pp - 1;
}

/* This rank's local copy of slice (k, layer) of buffer b and its length. */
static const float *local_slice(const loom_gpt *shard, const float *buf, int k, int layer,
                                int64_t *count) {
    const loom_gpt_tensor_info *li = &shard->info[k];
    *count = li->layer_numel;
    size_t local_layer = layer >= 0 ? (size_t)(layer - shard->first_layer) : 0;
    return buf + li->offset + local_layer * li->layer_stride;
}

typedef struct {
    trainer *t;
    const float *mine[3]; /* this rank's parameters, exp_avg, exp_avg_sq (local layout) */
    loom_gpt full;        /* the unsharded layout (no memory) */
    float *slice;         /* one unsharded slice, assembled */
    float *recv;          /* one rank's part of it */
} slice_stream;

static const float *stream_fill(void *ctx, int b, int k, int layer) {
    slice_stream *c = ctx;
    trainer *t = c->t;
    int s = owner_stage(t, k, layer);
    int parts = loom_gpt_tensor_is_sharded(k) ? t->tp : 1; /* replicated: TP rank 0 sends */
    const loom_gpt_tensor_info *fi = &c->full.info[k];
    for (int r = 0; r < parts; r++) {
        loom_gpt desc;
        loom_gpt_shard shard = {t->stage_first[s], t->stage_end[s], t->tp, r, NULL};
        if (loom_gpt_describe(&desc, &t->model->config, &shard) != LOOM_OK) return NULL;
        int sender = s * t->dp * t->tp + r; /* Megatron order, data-parallel rank 0 */
        int64_t n;
        const float *src = local_slice(&desc, c->mine[b], k, layer, &n);
        if (sender != 0) {
            if (loom_comm_recv(t->world, c->recv, n * (int64_t)sizeof(float), sender,
                               TAG_SHARD + b) != LOOM_OK) {
                return NULL;
            }
            src = c->recv;
        }
        int64_t base = layer >= 0 ? (int64_t)(layer - desc.first_layer) * n : 0;
        int64_t shift = layer >= 0 ? (int64_t)layer * fi->layer_numel : 0;
        for (int64_t j = 0; j < n; j++) {
            c->slice[loom_gpt_global_index(&desc, k, base + j) - shift] = src[j];
        }
    }
    return c->slice;
}

/* The senders' side: the same slices, in the same order, for the ones this rank provides. */
static loom_status stream_send(trainer *t, const float *const mine[3]) {
    size_t most = 4 + 12 * (size_t)t->model->config.num_layers;
    int *tensors = loom_calloc(most, sizeof(int), "slices"),
        *layers = loom_calloc(most, sizeof(int), "slices");
    int count = tensors && layers ? loom_checkpoint_slices(&t->model->config, tensors, layers) : -1;
    loom_status st = count < 0 ? LOOM_ERR_NOMEM : LOOM_OK;
    for (int b = 0; b < 3 && st == LOOM_OK; b++) {
        for (int i = 0; i < count && st == LOOM_OK; i++) {
            int k = tensors[i], layer = layers[i];
            if (owner_stage(t, k, layer) != t->pp_rank) continue;
            if (!loom_gpt_tensor_is_sharded(k) && t->tp_rank != 0) continue;
            int64_t n;
            const float *src = local_slice(t->model, mine[b], k, layer, &n);
            st = loom_comm_send(t->world, src, n * (int64_t)sizeof(float), 0, TAG_SHARD + b);
        }
    }
    free(tensors), free(layers);
    return st;
}

static loom_status save_streamed(trainer *t, const float *m, const float *v) {
    const float *mine[3] = {t->model->params_memory, m, v};
    if (!t->lead) return stream_send(t, mine);
    slice_stream c;
    memset(&c, 0, sizeof c);
    c.t = t;
    for (int b = 0; b < 3; b++) c.mine[b] = mine[b];
    loom_gpt_shard whole = {0, t->model->config.num_layers, 1, 0, NULL};
    loom_status st = loom_gpt_describe(&c.full, &t->model->config, &whole);
    if (st != LOOM_OK) return st;
    size_t largest = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        if ((size_t)c.full.info[k].layer_numel > largest)
            largest = (size_t)c.full.info[k].layer_numel;
    }
    c.slice = loom_alloc_aligned(largest * sizeof(float), "checkpoint slice");
    c.recv = loom_alloc_aligned(largest * sizeof(float), "checkpoint slice");
    if (!c.slice || !c.recv) st = LOOM_ERR_NOMEM;
    if (st == LOOM_OK)
        st = loom_checkpoint_save_fill(t->cfg->out, &c.full, stream_fill, &c, &t->state);
    loom_free_aligned(c.slice);
    loom_free_aligned(c.recv);
    return st;
}

/* The lead writes. Under ZeRO-1 the moment ranges are gathered over DP first (every rank
 * joins); under TP or PP the first replica's ranks stream their slices to the lead. */
static loom_status save_checkpoint(trainer *t) {
    const float *m = t->m, *v = t->v;
    float *dp_m = NULL, *dp_v = NULL;
    loom_status st = LOOM_OK;
    loom_comm_progress("saving a checkpoint");
    if (t->grad_shard) {
        size_t padded = t->zero.padded_count;
        dp_m = loom_alloc_aligned(padded * sizeof(float), "moments");
        dp_v = loom_alloc_aligned(padded * sizeof(float), "moments");
        if (!dp_m || !dp_v) st = LOOM_ERR_NOMEM;
        if (st == LOOM_OK) {
            st = loom_comm_allgather_f32(t->mesh.dp, t->m, dp_m, (int64_t)t->zero.shard);
        }
        if (st == LOOM_OK) {
            st = loom_comm_allgather_f32(t->mesh.dp, t->v, dp_v, (int64_t)t->zero.shard);
        }
        m = dp_m, v = dp_v;
    }
    if (st == LOOM_OK && (t->tp > 1 || t->pp > 1)) {
        if (t->dp_rank == 0) st = save_streamed(t, m, v);
    } else if (st == LOOM_OK && t->lead) {
        st = loom_checkpoint_save(t->cfg->out, t->model, m, v, &t->state);
    }
    if (st == LOOM_OK && t->lead) {
        if (t->progress_bar) printf("\r\033[K");
        loom_info("saved checkpoint %s/checkpoints/step_%08" PRId64, t->cfg->out, t->state.step);
    }
    loom_free_aligned(dp_m), loom_free_aligned(dp_v);
    return st;
}

/* Data-parallel replicas must hold bit-identical parameters: compare a checksum of them. */
static loom_status check_replicas(trainer *t) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a over the parameter bytes */
    const unsigned char *bytes = (const unsigned char *)t->model->params_memory;
    for (size_t i = 0; i < t->model->num_params * sizeof(float); i++) {
        h = (h ^ bytes[i]) * 1099511628211ULL;
    }
    double hi[2] = {(double)(h >> 32), -(double)(h >> 32)},
           lo[2] = {(double)(h & 0xffffffffu), -(double)(h & 0xffffffffu)};
    loom_status st = loom_comm_allreduce_f64(t->mesh.dp, hi, 2, LOOM_REDUCE_MAX);
    if (st == LOOM_OK) st = loom_comm_allreduce_f64(t->mesh.dp, lo, 2, LOOM_REDUCE_MAX);
    if (st != LOOM_OK) return st;
    if (hi[0] != -hi[1] || lo[0] != -lo[1]) {
        loom_warn("data-parallel replicas hold different parameters (checksums differ)");
    } else if (t->lead) {
        loom_info("data-parallel replicas hold bit-identical parameters (checksum %016llx)",
                  (unsigned long long)h);
    }
    return LOOM_OK;
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

loom_status loom_train_run_ex(const loom_train_config *cfg, loom_comm *world,
                              loom_train_result *result) {
    loom_status st = loom_train_config_check(cfg);
    if (st != LOOM_OK) return st;
    trainer t;
    memset(&t, 0, sizeof t);
    t.world = world;
    st = trainer_setup(&t, cfg);
    int multi = world && loom_comm_size(world) > 1;
    if (multi) {
        /* one rank's bad file must not leave the others waiting: agree before training */
        double code = loom_exit_code(st);
        loom_status agreed = loom_comm_allreduce_f64(world, &code, 1, LOOM_REDUCE_MAX);
        if (agreed != LOOM_OK) {
            st = agreed;
        } else if (st == LOOM_OK && code > 0) {
            st = loom_fail(code >= 2 ? LOOM_ERR_INPUT : LOOM_ERR_RUNTIME,
                           "another rank failed while setting up (its message says why)");
        }
    }
    int setup_ok = st == LOOM_OK;
    if (st == LOOM_OK && cfg->trace[0]) {
        /* a common time origin: every rank starts its clock as the barrier releases */
        if (world) st = loom_comm_barrier(world);
        if (st == LOOM_OK) {
            st = loom_trace_create(&t.trace, world ? loom_comm_rank(world) : 0, (size_t)1 << 20);
        }
    }
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
        if (st == LOOM_OK && !cfg->no_save) st = save_checkpoint(&t);
        if (st == LOOM_OK && t.dp > 1) st = check_replicas(&t);
        if (st == LOOM_OK && t.lead) st = write_plot(cfg->out);
    }
    if (st == LOOM_OK && t.trace) {
        st = loom_trace_write(t.trace, world, cfg->trace);
        if (st == LOOM_OK && t.lead) loom_info("trace: %s (open in Perfetto)", cfg->trace);
    }
    if (multi && setup_ok && st != LOOM_OK) {
        /* a failure mid-training may be this rank's alone: end the whole job now */
        char message[2048];
        snprintf(message, sizeof message, "%s", loom_last_error());
        loom_comm_abort(loom_exit_code(st), message);
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
    return loom_train_run_ex(cfg, NULL, NULL);
}
