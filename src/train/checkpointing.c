/*
 * checkpointing.c — a run's checkpoints under any layout. The files are always the
 * single-process ones (io/checkpoint.c), so a run resumes under any other layout.
 *
 * One mapping connects a checkpoint slice (one layer of one tensor, or a global tensor, in the
 * unsharded layout) with a rank's shard: slice_part says where the shard's part of a slice lies
 * in the rank's buffer and slice_pos where each of its elements lies in the slice. Saving
 * streams: the ranks holding a part (the first replica's, or under ZeRO every replica holding a
 * piece of a sharded buffer) send it to the lead, which assembles one slice at a time; resuming
 * and --init-from take each slice as it is read and keep this rank's part of it (ZeRO: of its
 * range); so does --init-from from any model file. No rank holds more than its shard plus one
 * slice.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* realpath */
#include "train/train_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_SHARD = 100 };

/* ---- the slice <-> shard mapping ---------------------------------------------------------------
 */

typedef struct {
    size_t local;  /* where the shard's part of the slice starts in its flat buffer */
    int64_t count; /* its elements */
    int64_t base;  /* local logical index of its first element */
    int64_t shift; /* global logical index of the slice's first element */
} slice_part;

static int holds_layer(const loom_gpt *shard, int layer) {
    return layer < 0 || loom_gpt_local_layer(shard, layer) >= 0;
}

static slice_part part_of(const loom_gpt *shard, int k, int layer) {
    const loom_gpt_tensor_info *li = &shard->info[k];
    slice_part sp = {li->offset, li->layer_numel, 0, 0};
    if (layer >= 0) {
        size_t local_layer = (size_t)loom_gpt_local_layer(shard, layer);
        int64_t full_layer = li->layer_numel * (loom_gpt_tensor_is_sharded(k) ? shard->tp_size : 1);
        sp.local += local_layer * li->layer_stride;
        sp.base = (int64_t)local_layer * li->layer_numel;
        sp.shift = (int64_t)layer * full_layer;
    }
    return sp;
}

/* Position within the unsharded slice of the part's element j. */
static int64_t slice_pos(const loom_gpt *shard, int k, const slice_part *sp, int64_t j) {
    return loom_gpt_global_index(shard, k, sp->base + j) - sp->shift;
}

/* ---- reading: keep this rank's part of each slice ------------------------------------------- */

typedef struct {
    const loom_gpt *shard;
    float *dst[3];       /* parameters, exp_avg, exp_avg_sq in the local layout; NULL: not wanted */
    size_t lo[3], hi[3]; /* the flat offsets each keeps: its window (ZeRO: the rank's range) */
} slice_take;

static loom_status take_slice(void *ctx, int b, int k, int layer, const float *slice) {
    slice_take *c = ctx;
    if (!c->dst[b] || !holds_layer(c->shard, layer)) return LOOM_OK;
    slice_part sp = part_of(c->shard, k, layer);
    size_t lo = c->lo[b] > sp.local ? c->lo[b] : sp.local;
    size_t hi = c->hi[b] < sp.local + (size_t)sp.count ? c->hi[b] : sp.local + (size_t)sp.count;
    for (size_t at = lo; at < hi; at++)
        c->dst[b][at - c->lo[b]] = slice[slice_pos(c->shard, k, &sp, (int64_t)(at - sp.local))];
    return LOOM_OK;
}

static loom_status unsharded_layout(const loom_gpt *model, loom_gpt *layout) {
    loom_gpt_shard whole = {.first_layer = 0,
                            .end_layer = model->config.num_layers,
                            .tp_size = 1,
                            .tp_rank = 0,
                            .tp_comm = NULL};
    return loom_gpt_describe(layout, &model->config, &whole);
}

/* Whether the model keeps only a window of its parameters (ZeRO-3). */
static int windowed(const loom_gpt *model) {
    return model->params_begin != 0 || model->params_end != model->num_params;
}

/* What a rank keeps of each checkpoint buffer: its window of the parameters (all of them, or
 * under ZeRO-3 its range) and its range of the moments (ZeRO-1 and up: its shard). */
static slice_take take_of(loom_gpt *model, const loom_adamw *opt, int moments) {
    slice_take c = {model,
                    {model->params_memory, moments ? opt->m : NULL, moments ? opt->v : NULL},
                    {model->params_begin, opt ? opt->range.begin : 0, opt ? opt->range.begin : 0},
                    {model->params_end, opt ? opt->range.end : 0, opt ? opt->range.end : 0}};
    return c;
}

loom_status loom_run_checkpoint_load(const char *dir, const loom_mesh *mesh, loom_gpt *model,
                                     loom_adamw *opt, loom_ckpt_state *state) {
    /* one process holding everything reads the file whole; any other layout keeps its part of
     * each slice as it is read, so no rank holds more than its shard plus a slice */
    int whole = mesh->tp_size == 1 && mesh->pp_size == 1 && !windowed(model) &&
                opt->range.begin == 0 && opt->range.end == model->num_params;
    if (whole) return loom_checkpoint_load(dir, model, opt->m, opt->v, state);
    slice_take c = take_of(model, opt, 1);
    return loom_run_checkpoint_read(dir, model, c.dst, c.lo, c.hi, state);
}

loom_status loom_run_checkpoint_read(const char *dir, loom_gpt *model, float *const dst[3],
                                     const size_t lo[3], const size_t hi[3],
                                     loom_ckpt_state *state) {
    loom_gpt layout;
    slice_take c = {model, {dst[0], dst[1], dst[2]}, {lo[0], lo[1], lo[2]}, {hi[0], hi[1], hi[2]}};
    loom_status st = unsharded_layout(model, &layout);
    if (st == LOOM_OK) st = loom_checkpoint_load_take(dir, &layout, take_slice, &c, state);
    return st;
}

loom_status loom_run_init_from(const char *path, loom_gpt *model) {
    loom_gpt layout;
    loom_status st = unsharded_layout(model, &layout);
    slice_take c = take_of(model, NULL, 0);
    if (st == LOOM_OK) st = loom_model_load_take(path, &layout, take_slice, &c);
    return st;
}

loom_status loom_run_tokenizer(const loom_train_config *cfg, const loom_gpt_config *model,
                               const char *resume_dir, loom_ckpt_state *state) {
    const char *file = resume_dir[0] ? resume_dir : cfg->init_from;
    const char *flag = resume_dir[0] ? "--resume" : "--init-from";
    char name[sizeof state->tokenizer] = "", source[sizeof state->tokenizer_source] = "";
    loom_status st = LOOM_OK;
    if (file[0]) st = loom_model_tokenizer_of(file, name, sizeof name, source, sizeof source);
    if (st != LOOM_OK) return st;
    if (!cfg->tokenizer[0]) {
        snprintf(state->tokenizer, sizeof state->tokenizer, "%s", name); /* same sizes */
        snprintf(state->tokenizer_source, sizeof state->tokenizer_source, "%s", source);
        return LOOM_OK;
    }
    loom_tokenizer *tok = NULL;
    st = loom_tokenizer_open(&tok, cfg->tokenizer);
    if (st == LOOM_OK) st = loom_tokenizer_check_vocab(tok, model->vocab_size, "--tokenizer");
    if (st == LOOM_OK && name[0] && strcmp(name, loom_tokenizer_name(tok)) != 0) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "--tokenizer %s is the %s tokenizer, but %s %s records the %s tokenizer%s%s",
                       cfg->tokenizer, loom_tokenizer_name(tok), flag, file, name,
                       source[0] ? " from " : "", source);
    }
    if (st == LOOM_OK) {
        snprintf(state->tokenizer, sizeof state->tokenizer, "%s", loom_tokenizer_name(tok));
        int is_bytes = !strcmp(cfg->tokenizer, "bytes");
        char *absolute = is_bytes ? NULL : realpath(cfg->tokenizer, NULL);
        st = loom_path_join(state->tokenizer_source, sizeof state->tokenizer_source, NULL,
                            is_bytes   ? ""
                            : absolute ? absolute
                                       : cfg->tokenizer);
        free(absolute);
    }
    loom_tokenizer_free(tok);
    return st;
}

/* ---- writing: the lead assembles each slice from its owners' parts ---------------------------
 * A slice's part on pipeline rank s and tensor rank r lives on the first replica (dp rank 0),
 * or, for a buffer sharded over the replicas (the moments under ZeRO-1 and up, the parameters
 * under ZeRO-3), in pieces on the replicas whose ranges it crosses: each owner sends its piece,
 * so nothing is gathered whole anywhere. */

typedef struct {
    const loom_mesh *mesh;
    const float *mine[3]; /* this rank's parameters, exp_avg, exp_avg_sq: its local layout, or
                           * from its range's start when sharded */
    int sharded[3];       /* the buffer is cut into the replicas' ZeRO ranges */
} stream_bufs;

typedef struct {
    stream_bufs bufs;
    const loom_gpt *model;
    loom_gpt full; /* the unsharded layout (no memory) */
    float *slice;  /* one unsharded slice, assembled */
    float *recv;   /* one piece of it */
} slice_stream;

/* Replica d's piece [*lo, *hi) of a part [at, at + count) of a (pipeline, tensor) rank's buffer
 * of n floats, b sharded or not; 0 when it has none. */
static int piece_of(const stream_bufs *bufs, int b, size_t n, int d, size_t at, int64_t count,
                    size_t *lo, size_t *hi) {
    size_t begin = 0, end = n;
    if (bufs->sharded[b]) {
        loom_zero_shard z = loom_zero_shard_of(n, bufs->mesh->dp_size, d);
        begin = z.begin, end = z.end;
    } else if (d != 0) {
        return 0;
    }
    *lo = at > begin ? at : begin;
    *hi = at + (size_t)count < end ? at + (size_t)count : end;
    return *lo < *hi;
}

static const float *stream_fill(void *ctx, int b, int k, int layer) {
    slice_stream *c = ctx;
    const loom_mesh *mesh = c->bufs.mesh;
    int s = loom_mesh_owner_rank(mesh, k, layer);
    int parts = loom_gpt_tensor_is_sharded(k) ? mesh->tp_size : 1; /* replicated: TP rank 0 */
    for (int r = 0; r < parts; r++) {
        loom_gpt desc;
        loom_gpt_shard shard = loom_mesh_rank_shard(mesh, s, r);
        if (loom_gpt_describe(&desc, &c->model->config, &shard) != LOOM_OK) return NULL;
        slice_part sp = part_of(&desc, k, layer);
        for (int d = 0; d < mesh->dp_size; d++) {
            size_t lo, hi;
            if (!piece_of(&c->bufs, b, desc.num_params, d, sp.local, sp.count, &lo, &hi)) continue;
            int sender = loom_mesh_world_rank(mesh, d, r, s);
            const float *src = NULL;
            if (sender == 0) { /* the lead's own piece */
                size_t base = c->bufs.sharded[b]
                                  ? loom_zero_shard_of(desc.num_params, mesh->dp_size, 0).begin
                                  : 0;
                src = c->bufs.mine[b] + (lo - base);
            } else {
                if (loom_comm_recv(mesh->world, c->recv,
                                   (int64_t)(hi - lo) * (int64_t)sizeof(float), sender,
                                   TAG_SHARD + b) != LOOM_OK) {
                    return NULL;
                }
                src = c->recv;
            }
            for (size_t at = lo; at < hi; at++)
                c->slice[slice_pos(&desc, k, &sp, (int64_t)(at - sp.local))] = src[at - lo];
        }
    }
    return c->slice;
}

/* The senders' side: the same slices, in the same order, for the pieces this rank owns. */
static loom_status stream_send(const stream_bufs *bufs, const loom_gpt *model) {
    const loom_mesh *mesh = bufs->mesh;
    size_t most = 4 + 12 * (size_t)model->config.num_layers;
    int *tensors = loom_calloc(most, sizeof(int), "slices");
    int *layers = loom_calloc(most, sizeof(int), "slices");
    int count = tensors && layers ? loom_checkpoint_slices(&model->config, tensors, layers) : -1;
    loom_status st = count < 0 ? LOOM_ERR_NOMEM : LOOM_OK;
    size_t base = loom_zero_shard_of(model->num_params, mesh->dp_size, mesh->dp_rank).begin;
    for (int b = 0; b < 3 && st == LOOM_OK; b++) {
        if (!bufs->mine[b]) continue; /* a buffer the file does not hold */
        for (int i = 0; i < count && st == LOOM_OK; i++) {
            int k = tensors[i], layer = layers[i];
            if (loom_mesh_owner_rank(mesh, k, layer) != mesh->pp_rank) continue;
            if (!loom_gpt_tensor_is_sharded(k) && mesh->tp_rank != 0) continue;
            slice_part sp = part_of(model, k, layer);
            size_t lo, hi;
            if (!piece_of(bufs, b, model->num_params, mesh->dp_rank, sp.local, sp.count, &lo, &hi))
                continue;
            const float *src = bufs->mine[b] + (lo - (bufs->sharded[b] ? base : 0));
            st = loom_comm_send(mesh->world, src, (int64_t)(hi - lo) * (int64_t)sizeof(float), 0,
                                TAG_SHARD + b);
        }
    }
    free(tensors), free(layers);
    return st;
}

static loom_status save_streamed(const char *dir, const stream_bufs *bufs, const loom_gpt *model,
                                 const loom_ckpt_state *state) {
    if (!bufs->mesh->lead) return stream_send(bufs, model);
    slice_stream c;
    memset(&c, 0, sizeof c);
    c.bufs = *bufs, c.model = model;
    loom_status st = unsharded_layout(model, &c.full);
    if (st != LOOM_OK) return st;
    size_t largest = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        if ((size_t)c.full.info[k].layer_numel > largest) {
            largest = (size_t)c.full.info[k].layer_numel;
        }
    }
    c.slice = loom_alloc_aligned(largest * sizeof(float), "checkpoint slice");
    c.recv = loom_alloc_aligned(largest * sizeof(float), "checkpoint slice");
    if (!c.slice || !c.recv) st = LOOM_ERR_NOMEM;
    if (st == LOOM_OK) st = loom_checkpoint_write(dir, &c.full, NULL, stream_fill, &c, state);
    loom_free_aligned(c.slice);
    loom_free_aligned(c.recv);
    return st;
}

loom_status loom_run_checkpoint_write(const char *dir, const loom_mesh *mesh, const loom_gpt *model,
                                      const float *const bufs[3], const int sharded[3],
                                      const loom_ckpt_state *state) {
    stream_bufs sb = {mesh, {bufs[0], bufs[1], bufs[2]}, {sharded[0], sharded[1], sharded[2]}};
    int replicas_hold_parts = sharded[0] || sharded[1];
    if (mesh->tp_size > 1 || mesh->pp_size > 1 || replicas_hold_parts) {
        if (mesh->dp_rank == 0 || replicas_hold_parts) return save_streamed(dir, &sb, model, state);
        return LOOM_OK;
    }
    return mesh->lead ? loom_checkpoint_write(dir, model, bufs, NULL, NULL, state) : LOOM_OK;
}

loom_status loom_run_checkpoint_write_model(const char *dir, const loom_mesh *mesh,
                                            const loom_gpt *model, const loom_adamw *opt,
                                            const loom_ckpt_state *state) {
    const float *bufs[3] = {model->params_memory, opt->m, opt->v};
    /* ZeRO-1 and up shard the moments, ZeRO-3 the parameters too, over the replicas */
    int moments = opt->range.shard != opt->range.padded_count;
    int sharded[3] = {windowed(model), moments, moments};
    return loom_run_checkpoint_write(dir, mesh, model, bufs, sharded, state);
}

/* A tokenizer recorded from one of this run's own step folders (a resume whose tokenizer had
 * moved takes the copy there) is recorded from the newest one once it holds a copy: pruning may
 * delete the older, and every save copies from the recorded place. */
static void follow_tokenizer(const char *out, const char *dir, loom_ckpt_state *state) {
    char *run = realpath(out, NULL), *newest = realpath(dir, NULL);
    char prefix[LOOM_PATH_MAX + 16];
    if (run && newest && state->tokenizer_source[0] &&
        loom_path_join(prefix, sizeof prefix, run, "checkpoints/") == LOOM_OK &&
        !strncmp(state->tokenizer_source, prefix, strlen(prefix)) &&
        strlen(newest) < sizeof state->tokenizer_source) {
        snprintf(state->tokenizer_source, sizeof state->tokenizer_source, "%s", newest);
    }
    free(run), free(newest);
}

loom_status loom_run_save(const loom_run_parts *p, loom_ckpt_state *state) {
    const char *out = p->cfg->out;
    char dir[LOOM_PATH_MAX + 64];
    loom_comm_progress("saving a checkpoint");
    loom_status st = loom_run_step_folder(out, state->step, dir, sizeof dir);
    if (st == LOOM_OK && p->outer) {
        st = loom_run_islands_save(p, dir, state);
    } else if (st == LOOM_OK) {
        st = loom_run_compress_save(dir, p->mesh, p->cfg->seq_len, p->sync, p->pipe, state);
        if (st == LOOM_OK)
            st = loom_run_checkpoint_write_model(dir, p->mesh, p->model, p->opt, state);
        /* only now does "latest" move: a crash before this leaves the previous one current */
        if (st == LOOM_OK && p->mesh->lead) st = loom_checkpoint_point_latest(out, state->step);
        if (st == LOOM_OK && p->mesh->lead) loom_info("saved checkpoint %s", dir);
    }
    if (st == LOOM_OK) follow_tokenizer(out, dir, state);
    if (st == LOOM_OK && p->mesh->lead) st = loom_run_prune_checkpoints(out, p->cfg->keep_last);
    return st;
}

loom_status loom_run_resume(const loom_run_parts *p, const char *dir, loom_ckpt_state *state,
                            int *more) {
    *more = 0;
    if (p->mesh->plan->islands.count > 0) return loom_run_islands_resume_start(p, dir, state, more);
    char islands[256];
    loom_status st = loom_run_checkpoint_islands(dir, islands, sizeof islands);
    if (st == LOOM_OK && islands[0]) return loom_run_islands_resume_start(p, dir, state, more);
    if (st == LOOM_OK) st = loom_run_checkpoint_load(dir, p->mesh, p->model, p->opt, state);
    if (st == LOOM_OK)
        st = loom_run_compress_load(dir, p->mesh, p->cfg->seq_len, p->sync, p->pipe, state);
    return st;
}

loom_status loom_run_step_folder(const char *out, int64_t step, char *dir, size_t cap) {
    char name[64];
    snprintf(name, sizeof name, "checkpoints/step_%08" PRId64, step);
    return loom_path_join(dir, cap, out, name);
}

/* ---- the run folder: one run at a time ----------------------------------------------------------
 */

/* One run per folder: two runs with the same --out would interleave their checkpoints and
 * metrics. The lock is the kernel's (flock), so it goes away with the process, however it
 * ends. */
loom_status loom_run_lock_folder(const char *out, int *fd) {
    char path[LOOM_PATH_MAX + 16];
    *fd = -1;
    loom_status st = loom_path_join(path, sizeof path, out, ".lock");
    if (st != LOOM_OK) return st;
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return loom_fail(LOOM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--out %s: another run is writing to this folder (it holds %s); wait "
                         "for it or choose another --out",
                         out, path);
    }
    return LOOM_OK;
}

/* The plan's model, this build's limits, and a resumed checkpoint's agreement with the plan. */

/* ---- housekeeping of OUT/checkpoints ------------------------------------------------------- */

/* step_NNNNNNNN: its number, or -1 for any other name. */
static int64_t step_of(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return -1;
    int64_t step = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || step > INT64_MAX / 10 - 9) return -1;
        step = step * 10 + (*p - '0');
    }
    return step;
}

/* *step: the step "latest" names, or -1. */
static loom_status latest_step(const char *checkpoints, int64_t *step) {
    char path[LOOM_PATH_MAX + 64], *text = NULL;
    size_t size;
    *step = -1;
    loom_status st = loom_path_join(path, sizeof path, checkpoints, "latest");
    if (st != LOOM_OK) return st;
    if (access(path, F_OK) != 0 || loom_read_file(path, &text, &size) != LOOM_OK) return LOOM_OK;
    text[strcspn(text, "\n")] = '\0';
    *step = step_of(text);
    free(text);
    return LOOM_OK;
}

/* Removes a step folder and the files in it, and its subfolders' (an islands checkpoint's
 * island_K, depth 1). */
static loom_status remove_step(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return loom_fail(LOOM_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
    struct dirent *e;
    loom_status st = LOOM_OK;
    while ((e = readdir(d)) != NULL && st == LOOM_OK) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[LOOM_PATH_MAX + 600];
        struct stat sb;
        st = loom_path_join(path, sizeof path, dir, e->d_name);
        if (st != LOOM_OK) break;
        if (depth > 0 && lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            st = remove_step(path, depth - 1);
        } else if (unlink(path) != 0) {
            st = loom_fail(LOOM_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        }
    }
    closedir(d);
    if (st == LOOM_OK && rmdir(dir) != 0) {
        st = loom_fail(LOOM_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    }
    return st;
}

typedef loom_status (*step_visit)(const char *checkpoints, const char *name, int64_t step,
                                  void *ctx);

/* Calls visit for every step folder of OUT/checkpoints (none when it does not exist). */
static loom_status each_step(const char *out, step_visit visit, void *ctx) {
    char checkpoints[LOOM_PATH_MAX + 32];
    loom_status st = loom_path_join(checkpoints, sizeof checkpoints, out, "checkpoints");
    if (st != LOOM_OK) return st;
    DIR *d = opendir(checkpoints);
    if (!d) return LOOM_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && st == LOOM_OK) {
        int64_t step = step_of(e->d_name);
        if (step >= 0) st = visit(checkpoints, e->d_name, step, ctx);
    }
    closedir(d);
    return st;
}

typedef struct {
    int64_t *steps;
    size_t count, cap;
} step_list;

static loom_status collect(const char *checkpoints, const char *name, int64_t step, void *ctx) {
    step_list *list = ctx;
    if (list->count == list->cap) {
        size_t cap = list->cap ? 2 * list->cap : 64;
        int64_t *grown = realloc(list->steps, cap * sizeof *grown);
        if (!grown)
            return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory listing %s", checkpoints, name);
        list->steps = grown, list->cap = cap;
    }
    list->steps[list->count++] = step;
    return LOOM_OK;
}

static int compare_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

loom_status loom_run_prune_checkpoints(const char *out, int keep) {
    if (keep <= 0) return LOOM_OK;
    step_list list = {0};
    char checkpoints[LOOM_PATH_MAX + 32];
    int64_t latest = -1;
    loom_status st = loom_path_join(checkpoints, sizeof checkpoints, out, "checkpoints");
    if (st == LOOM_OK) st = latest_step(checkpoints, &latest);
    if (st == LOOM_OK) st = each_step(out, collect, &list);
    if (st == LOOM_OK && list.count > 0)
        qsort(list.steps, list.count, sizeof *list.steps, compare_desc);
    for (size_t i = (size_t)keep; st == LOOM_OK && i < list.count; i++) {
        if (list.steps[i] == latest) continue; /* never the checkpoint a resume would read */
        char dir[LOOM_PATH_MAX + 64], name[32];
        snprintf(name, sizeof name, "step_%08" PRId64, list.steps[i]);
        st = loom_path_join(dir, sizeof dir, checkpoints, name);
        if (st == LOOM_OK) st = remove_step(dir, 1);
    }
    free(list.steps);
    return st;
}

/* A killed save leaves FILE.tmp.PID files (tens of MB each) and perhaps an empty folder. */
static loom_status clean_step(const char *checkpoints, const char *name, int64_t step, void *ctx) {
    (void)step, (void)ctx;
    char dir[LOOM_PATH_MAX + 600];
    loom_status st = loom_path_join(dir, sizeof dir, checkpoints, name);
    if (st != LOOM_OK) return st;
    DIR *d = opendir(dir);
    if (!d) return LOOM_OK;
    struct dirent *e;
    int files = 0, model = 0, state = 0;
    while ((e = readdir(d)) != NULL && st == LOOM_OK) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[LOOM_PATH_MAX + 1200];
        st = loom_path_join(path, sizeof path, dir, e->d_name);
        if (st != LOOM_OK) break;
        if (strstr(e->d_name, ".tmp.")) {
            loom_warn("removing %s, left by an interrupted save", path);
            if (unlink(path) != 0)
                st = loom_fail(LOOM_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
            continue;
        }
        files++;
        model |= !strcmp(e->d_name, "model.safetensors");
        state |= !strcmp(e->d_name, "state.safetensors");
    }
    closedir(d);
    if (st == LOOM_OK && files == 0) {
        loom_warn("removing %s: an empty checkpoint folder left by an interrupted save", dir);
        if (rmdir(dir) != 0)
            st = loom_fail(LOOM_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    } else if (st == LOOM_OK && !(model && state)) {
        loom_warn("%s is incomplete (an interrupted save); it is not the latest checkpoint", dir);
    }
    return st;
}

loom_status loom_run_clean_checkpoints(const char *out) {
    return each_step(out, clean_step, NULL);
}
