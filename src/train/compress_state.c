/*
 * compress_state.c — the compressors' state (error-feedback and lazy-error residuals,
 * warm-start factors) beside a checkpoint: every rank that holds some writes
 * STEP/compress_rankNNNNN.safetensors before the lead moves "latest", and the checkpoint's state
 * file names them and the layout they belong to (metadata "loom.compress"). Each file also
 * records the layout, the step and the rank that wrote it (world rank and mesh coordinates), so
 * that a file copied from another step or another rank is refused by name, not resumed from (it
 * would resume without a word, a little off, or fail much later on a replica check). A resume in
 * the same layout and compression reads them back, so it continues bit-exactly; any other resume
 * drops them with one warning and the compressors start fresh.
 *
 * Not here: the compressors (compress/), where they sit (parallel/), the model checkpoint (io/).
 */
#include "train/train_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* metadata "format" of every compressor file; v1 files (without step and rank) are refused */
#define COMPRESS_FORMAT "loom.compress.v2"

/* What must match for saved state to fit this run: the layout, the micro-batch shape (the
 * pipeline compressors' matrices), every compression setting and whether the data-parallel
 * state is ZeRO-2/3's (one residual per unit, the same under both) or one per matrix. */
static void signature(const loom_plan *plan, int seq_len, char *out, size_t cap) {
    const loom_plan_compressor *c[2] = {&plan->dp_compression, &plan->pp_compression};
    size_t used = (size_t)snprintf(out, cap,
                                   "files=compress_rank*.safetensors qkv=3 dp=%d tp=%d pp=%d "
                                   "micro=%dx%d stages=",
                                   plan->dp, plan->tp, plan->pp, plan->micro_batch, seq_len);
    for (int s = 0; s < plan->num_stages && used < cap; s++) {
        used += (size_t)snprintf(out + used, cap - used, "%s%d-%d", s ? "," : "",
                                 plan->stages[s].first_layer, plan->stages[s].end_layer);
    }
    if (plan->zero >= 2 && used < cap)
        used += (size_t)snprintf(out + used, cap - used, " grads=units");
    for (int i = 0; i < 2 && used < cap; i++) {
        used += (size_t)snprintf(
            out + used, cap - used, " %s=%s/r%d/f%.9g/ef%d/w%d/lazy%d/%s/%s/at", i ? "pp" : "dp",
            loom_compress_method_name(c[i]->method), c[i]->rank, c[i]->fraction,
            c[i]->error_feedback, c[i]->warmup_steps, c[i]->lazy_error,
            loom_pp_policy_name(c[i]->policy), loom_compress_method_name(c[i]->forward));
        for (int s = 0; s < c[i]->num_stages && used < cap; s++) {
            used += (size_t)snprintf(out + used, cap - used, "%s%d", s ? "," : "", c[i]->stages[s]);
        }
        if (c[i]->num_stages == 0 && used < cap)
            used += (size_t)snprintf(out + used, cap - used, "all");
    }
}

/* This rank's compressors, in a fixed order: the data-parallel ones, then the pipeline's. */
static int compressors(loom_grad_sync *sync, loom_pipeline *pipe, loom_compressor **list, int cap,
                       char names[][24]) {
    int n = 0, dp = loom_grad_sync_compressor_count(sync);
    for (int i = 0; i < dp; i++) {
        if (list && n < cap) {
            list[n] = loom_grad_sync_compressor(sync, i);
            snprintf(names[n], sizeof names[n], "dp.%d", i);
        }
        n++;
    }
    for (int i = 0; i < loom_pipeline_compressor_count(pipe); i++) {
        if (list && n < cap) { /* "pp.grad", then "pp.grad.1", ... for a rank's further chunks */
            list[n] = loom_pipeline_compressor(pipe, i);
            if (i == 0)
                snprintf(names[n], sizeof names[n], "pp.grad");
            else
                snprintf(names[n], sizeof names[n], "pp.grad.%d", i);
        }
        n++;
    }
    return n;
}

/* Every state array of every compressor, named "<compressor>.<state>", then ZeRO-2/3's
 * residuals, "zero.unit<unit>.residual". */
typedef struct {
    int count;
    loom_compressor **comp;
    char (*names)[24];
    char (*tensor_names)[40];
    loom_st_tensor *tensors;
    float **data;
} state_list;

static void state_list_free(state_list *l) {
    free(l->comp), free(l->names), free(l->tensor_names), free(l->tensors), free(l->data);
    memset(l, 0, sizeof *l);
}

static loom_status state_list_make(loom_grad_sync *sync, loom_pipeline *pipe, state_list *l) {
    memset(l, 0, sizeof *l);
    int n = compressors(sync, pipe, NULL, 0, NULL);
    int residuals = loom_grad_sync_residual_count(sync);
    if (n + residuals == 0) return LOOM_OK;
    l->comp = loom_calloc((size_t)(n ? n : 1), sizeof(loom_compressor *), "compressors");
    l->names = loom_calloc((size_t)(n ? n : 1), sizeof *l->names, "compressor names");
    if (!l->comp || !l->names) return LOOM_ERR_NOMEM;
    compressors(sync, pipe, l->comp, n, l->names);
    int arrays = residuals;
    for (int i = 0; i < n; i++) arrays += loom_compressor_state_count(l->comp[i]);
    l->tensor_names = loom_calloc((size_t)(arrays ? arrays : 1), sizeof *l->tensor_names, "names");
    l->tensors = loom_calloc((size_t)(arrays ? arrays : 1), sizeof *l->tensors, "tensors");
    l->data = loom_calloc((size_t)(arrays ? arrays : 1), sizeof *l->data, "state arrays");
    if (!l->tensor_names || !l->tensors || !l->data) return LOOM_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < loom_compressor_state_count(l->comp[i]); j++) {
            int k = l->count++;
            snprintf(l->tensor_names[k], sizeof l->tensor_names[k], "%s.%s", l->names[i],
                     loom_compressor_state_name(l->comp[i], j));
            l->data[k] = loom_compressor_state_data(l->comp[i], j);
            l->tensors[k] =
                (loom_st_tensor){.name = l->tensor_names[k],
                                 .ndim = 1,
                                 .shape = {(int64_t)loom_compressor_state_floats(l->comp[i], j)},
                                 .data = l->data[k]};
        }
    }
    for (int i = 0; i < residuals; i++) {
        int k = l->count++, unit = 0;
        size_t floats = 0;
        l->data[k] = loom_grad_sync_residual(sync, i, &unit, &floats);
        snprintf(l->tensor_names[k], sizeof l->tensor_names[k], "zero.unit%d.residual", unit);
        l->tensors[k] = (loom_st_tensor){
            .name = l->tensor_names[k], .ndim = 1, .shape = {(int64_t)floats}, .data = l->data[k]};
    }
    return LOOM_OK;
}

/* The first tensor of `file` that is none of the list's (NULL when there is none). */
static const char *unknown_tensor(const loom_safetensors *file, const state_list *l) {
    for (int i = 0; i < loom_safetensors_count(file); i++) {
        const char *name = loom_safetensors_entry(file, i)->name;
        int known = 0;
        for (int k = 0; k < l->count && !known; k++) known = !strcmp(name, l->tensor_names[k]);
        if (!known) return name;
    }
    return NULL;
}

static int world_rank(const loom_mesh *mesh) {
    return mesh->world ? loom_comm_rank(mesh->world) : 0;
}

static loom_status file_of(const char *dir, const loom_mesh *mesh, char *path, size_t cap) {
    char name[64];
    snprintf(name, sizeof name, "compress_rank%05d.safetensors", world_rank(mesh));
    return loom_path_join(path, cap, dir, name);
}

/* Who wrote a file: its step, its world rank and its place in the mesh, as metadata text. */
typedef struct {
    char step[24], rank[16], coords[64];
} file_owner;

static void owner_of(const loom_mesh *mesh, int64_t step, file_owner *o) {
    snprintf(o->step, sizeof o->step, "%" PRId64, step);
    snprintf(o->rank, sizeof o->rank, "%d", world_rank(mesh));
    snprintf(o->coords, sizeof o->coords, "pp=%d dp=%d tp=%d", mesh->pp_rank, mesh->dp_rank,
             mesh->tp_rank);
}

/* Metadata `key` of `file` must be `want`; `whose` says whose value that is. */
static loom_status check_meta(const char *path, loom_safetensors *file, const char *key,
                              const char *want, const char *whose) {
    const char *got = loom_safetensors_metadata(file, key);
    if (got && strcmp(got, want) == 0) return LOOM_OK;
    return loom_fail(LOOM_ERR_INPUT, "%s: metadata '%s': expected \"%s\" (%s), got %s%s%s", path,
                     key, want, whose, got ? "\"" : "", got ? got : "none", got ? "\"" : "");
}

loom_status loom_run_compress_save(const char *dir, const loom_mesh *mesh, int seq_len,
                                   loom_grad_sync *sync, loom_pipeline *pipe,
                                   loom_ckpt_state *state) {
    state->compress[0] = '\0';
    const loom_plan *plan = mesh->plan;
    if (!loom_plan_compresses(plan)) return LOOM_OK;
    signature(plan, seq_len, state->compress, sizeof state->compress);
    state_list l;
    loom_status st = state_list_make(sync, pipe, &l);
    char path[4200];
    if (st == LOOM_OK && l.count > 0) st = loom_mkdir_p(dir);
    if (st == LOOM_OK && l.count > 0) st = file_of(dir, mesh, path, sizeof path);
    if (st == LOOM_OK && l.count > 0) {
        file_owner owner;
        owner_of(mesh, state->step, &owner);
        const char *meta[] = {"format", COMPRESS_FORMAT, "loom.compress", state->compress,
                              "step",   owner.step,      "rank",          owner.rank,
                              "coords", owner.coords};
        st = loom_safetensors_write(path, l.tensors, l.count, meta, 5);
    }
    state_list_free(&l);
    /* every rank's file is on disk before the lead moves "latest", and a rank that could not
     * write its file stops every rank here, before the checkpoint's own collectives */
    if (!mesh->world) return st;
    double failed = st != LOOM_OK;
    loom_status agreed = loom_comm_allreduce_f64(mesh->world, &failed, 1, LOOM_REDUCE_MAX);
    if (st != LOOM_OK || agreed != LOOM_OK) return st != LOOM_OK ? st : agreed;
    return failed > 0 ? loom_fail(LOOM_ERR_IO, "another rank could not write its compressor "
                                               "state (its message says why)")
                      : LOOM_OK;
}

loom_status loom_run_compress_load(const char *dir, const loom_mesh *mesh, int seq_len,
                                   loom_grad_sync *sync, loom_pipeline *pipe,
                                   const loom_ckpt_state *state) {
    const loom_plan *plan = mesh->plan;
    if (!loom_plan_compresses(plan)) return LOOM_OK;
    char want[sizeof state->compress];
    signature(plan, seq_len, want, sizeof want);
    if (strcmp(want, state->compress) != 0) {
        if (mesh->lead) {
            loom_warn("%s: %s; the compressors start fresh (error-feedback residuals and "
                      "warm-start factors at zero), so this resume is not bit-exact",
                      dir,
                      state->compress[0] ? "its compressor state belongs to another layout or "
                                           "compression setting: dropped"
                                         : "the checkpoint holds no compressor state");
        }
        return LOOM_OK;
    }
    state_list l;
    loom_status st = state_list_make(sync, pipe, &l);
    char path[4200];
    if (st == LOOM_OK) st = file_of(dir, mesh, path, sizeof path);
    loom_safetensors *file = NULL;
    if (st == LOOM_OK && l.count > 0) st = loom_safetensors_open(&file, path);
    /* the file is this run's kind, of this layout, of the checkpoint's step and of this rank */
    file_owner owner;
    owner_of(mesh, state->step, &owner);
    static const char *const keys[] = {"format", "loom.compress", "step", "rank", "coords"};
    const char *wants[] = {COMPRESS_FORMAT, want, owner.step, owner.rank, owner.coords};
    static const char *const whose[] = {
        "this build's compressor files", "the checkpoint's layout and compression",
        "the checkpoint's step", "this rank's world rank", "this rank's place in the mesh"};
    for (int i = 0; st == LOOM_OK && l.count > 0 && i < 5; i++) {
        st = check_meta(path, file, keys[i], wants[i], whose[i]);
    }
    for (int k = 0; st == LOOM_OK && k < l.count; k++) {
        st =
            loom_safetensors_read_f32(file, l.tensor_names[k], 1, l.tensors[k].shape, 0, l.data[k]);
        for (int64_t i = 0; st == LOOM_OK && i < l.tensors[k].shape[0]; i++) {
            if (!isfinite(l.data[k][i])) {
                st = loom_fail(LOOM_ERR_INPUT,
                               "%s: tensor '%s': expected finite values, got %g at index %" PRId64,
                               path, l.tensor_names[k], (double)l.data[k][i], i);
            }
        }
    }
    if (st == LOOM_OK && file && loom_safetensors_count(file) != l.count) {
        const char *extra = unknown_tensor(file, &l);
        st = loom_fail(LOOM_ERR_INPUT,
                       "%s: tensor '%s' is none of this rank's compressor state (expected %d "
                       "tensors, got %d)",
                       path, extra ? extra : "?", l.count, loom_safetensors_count(file));
    }
    loom_safetensors_close(file);
    state_list_free(&l);
    return st;
}

void loom_run_compress_report(const loom_mesh *mesh, loom_grad_sync *sync, loom_pipeline *pipe) {
    const loom_plan *plan = mesh->plan;
    if (!loom_plan_compresses(plan)) return;
    size_t dp = loom_grad_sync_state_bytes(sync);
    size_t pp_bytes = 0;
    for (int i = 0; i < loom_pipeline_compressor_count(pipe); i++) {
        pp_bytes += loom_compressor_state_bytes(loom_pipeline_compressor(pipe, i));
    }
    loom_info("compression: dp %s, pp %s; compressor state on rank 0: %.1f MiB (data-parallel "
              "%.1f MiB, pipeline %.1f MiB; error feedback keeps a gradient-sized residual, "
              "twice: committed and working)",
              loom_compress_method_name(plan->dp_compression.method),
              loom_compress_method_name(plan->pp_compression.method),
              (double)(dp + pp_bytes) / 1048576.0, (double)dp / 1048576.0,
              (double)pp_bytes / 1048576.0);
}
