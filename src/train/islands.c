/*
 * islands.c — the training loop's side of islands (the outer optimiser itself is
 * parallel/outer.c): which data an island reads, their checkpoints, and what island training
 * refuses.
 *
 * An islands checkpoint is one step folder, OUT/checkpoints/step_N:
 *   model.safetensors    the global model: every fragment's round start (what `loom sample`,
 *                        --init-from and evaluation read);
 *   state.safetensors    the loop state (island 0's) and the outer momentum in the model's
 *                        layout ("outer_momentum.NAME"), metadata "loom.islands" saying which
 *                        islands and layout wrote it;
 *   island_K/            island K's own checkpoint, as any run's (its parameters now, its AdamW
 *                        moments, its loop state and its compressors' files);
 *   outer_rankNNNNN.safetensors   job rank N's own outer state, when it has some: its
 *                        error-feedback residual (int8/bf16 outer gradients: each island
 *                        quantises its own; PowerSGD / top-k: each matrix's compressor state,
 *                        "outer.I.NAME", as the data-parallel compressors' files name theirs)
 *                        and its syncs in flight (--outer-overlap-steps: their sums and the
 *                        parameters when they left).
 * Every piece goes through the code that writes and reads a run's checkpoint (streamed from the
 * shard owners, each island led by its first rank), so the global state reshards like the model.
 * The lead moves "latest" when every rank of the job has written its part.
 *
 * Resume: the same islands and layout continue bit-exactly (each island its own folder, the
 * syncs in flight land at their steps). Any other islands or layout restart the round: every
 * island continues from the global model with island (K mod the saved count)'s AdamW moments,
 * the outer momentum resharded, the residuals at zero, and one warning says so. A checkpoint
 * without islands starts every island from its model (a data-parallel warm start). A run without
 * islands refuses an islands checkpoint by name.
 */
#include "train/train_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OUTER_FORMAT "loom.outer.v1"

int loom_run_data_replica(const loom_mesh *mesh, const loom_test_hooks *hooks, int *replicas) {
    int same = hooks->islands_same_data; /* every island as if it were the only one */
    *replicas = (same ? 1 : mesh->islands) * mesh->dp_size;
    return (same ? 0 : mesh->island) * mesh->dp_size + mesh->dp_rank;
}

/* What must match for a checkpoint to continue bit-exactly: the islands, the layout inside one
 * and every outer setting. */
static void signature(const loom_plan *plan, char *out, size_t cap) {
    const loom_plan_islands *is = &plan->islands;
    size_t used =
        (size_t)snprintf(out, cap, "islands=%d dp=%d tp=%d pp=%d zero=%d stages=", is->count,
                         plan->dp, plan->tp, plan->pp, plan->zero);
    for (int s = 0; s < plan->num_stages && used < cap; s++) {
        used += (size_t)snprintf(out + used, cap - used, "%s%d-%d", s ? "," : "",
                                 plan->stages[s].first_layer, plan->stages[s].end_layer);
    }
    if (used < cap) {
        snprintf(out + used, cap - used, " H=%d F=%d tau=%d outer=%s/%.9g/%.9g wire=%s/r%d/f%.9g",
                 is->inner_steps, is->fragments, is->overlap_steps,
                 loom_outer_optimizer_name(is->optimizer), is->lr, is->momentum,
                 loom_compress_method_name(is->compression), is->compression_rank,
                 is->compression_fraction);
    }
}

/* The island's own mesh: its first rank leads its checkpoint. */
static loom_mesh island_mesh(const loom_mesh *mesh) {
    loom_mesh im = *mesh;
    im.lead = !mesh->world || loom_comm_rank(mesh->world) == 0;
    return im;
}

static loom_status island_folder(const char *step_dir, int island, char *dir, size_t cap) {
    char name[32];
    snprintf(name, sizeof name, "island_%d", island);
    return loom_path_join(dir, cap, step_dir, name);
}

static loom_status in_flight_file(const char *step_dir, const loom_mesh *mesh, char *path,
                                  size_t cap) {
    char name[64];
    snprintf(name, sizeof name, "outer_rank%05d.safetensors",
             mesh->job ? loom_comm_rank(mesh->job) : 0);
    return loom_path_join(path, cap, step_dir, name);
}

/* Entry j of outer compressor i's state as the file names it, "outer.I.NAME". */
static void state_name(loom_compressor *c, int i, int j, char (*name)[40]) {
    snprintf(*name, sizeof *name, "outer.%d.%s", i, loom_compressor_state_name(c, j));
}

/* The state arrays of the outer compressors (PowerSGD / top-k), "outer.I.NAME", appended to
 * tensors/names from `count`; returns the new count (with tensors NULL: how many there are). */
static int compressor_arrays(loom_outer *outer, loom_st_tensor *tensors, char (*names)[40],
                             int count) {
    for (int i = 0; i < loom_outer_compressor_count(outer); i++) {
        loom_compressor *c = loom_outer_compressor(outer, i);
        for (int j = 0; j < loom_compressor_state_count(c); j++, count++) {
            if (!tensors) continue;
            state_name(c, i, j, &names[count]);
            tensors[count] =
                (loom_st_tensor){.name = names[count],
                                 .ndim = 1,
                                 .shape = {(int64_t)loom_compressor_state_floats(c, j)},
                                 .data = loom_compressor_state_data(c, j)};
        }
    }
    return count;
}

/* This rank's own outer state, when it has any: its error-feedback residual (what its island's
 * quantisation left out, its own; PowerSGD / top-k: their compressors' state) and its syncs in
 * flight (settled: their sums and sent parameters, and the steps that apply them). */
static loom_status save_rank_state(const char *step_dir, const loom_mesh *mesh, loom_outer *outer,
                                   const char *sig, int64_t step) {
    loom_outer_buffers_view view;
    loom_outer_buffers(outer, &view);
    int F = view.fragments, count = 0;
    size_t cap = 2 * (size_t)F + 1 + (size_t)compressor_arrays(outer, NULL, NULL, 0);
    loom_st_tensor *tensors = loom_calloc(cap, sizeof *tensors, "outer syncs");
    char(*names)[40] = loom_calloc(cap, sizeof *names, "outer sync names");
    char apply[512] = "", steps[24];
    loom_status st = tensors && names ? LOOM_OK : LOOM_ERR_NOMEM;
    size_t used = 0;
    if (st == LOOM_OK && view.residual) {
        int64_t n = (int64_t)(view.range.end - view.range.begin);
        tensors[count++] = (loom_st_tensor){
            .name = "residual", .ndim = 1, .shape = {n > 0 ? n : 0}, .data = view.residual};
    }
    if (st == LOOM_OK) count = compressor_arrays(outer, tensors, names, count);
    for (int f = 0; f < F && st == LOOM_OK; f++) {
        float *sum, *sent;
        size_t lo, hi;
        int64_t at = loom_outer_in_flight(outer, f, &sum, &sent, &lo, &hi);
        used += (size_t)snprintf(apply + used, used < sizeof apply ? sizeof apply - used : 0,
                                 "%s%" PRId64, f ? "," : "", at);
        if (at <= 0) continue;
        int64_t n = (int64_t)(hi - lo);
        snprintf(names[count], sizeof names[count], "fragment.%d.sum", f);
        tensors[count] =
            (loom_st_tensor){.name = names[count], .ndim = 1, .shape = {n}, .data = sum};
        count++;
        if (sent) {
            snprintf(names[count], sizeof names[count], "fragment.%d.sent", f);
            tensors[count] =
                (loom_st_tensor){.name = names[count], .ndim = 1, .shape = {n}, .data = sent};
            count++;
        }
    }
    char path[LOOM_PATH_MAX + 96];
    snprintf(steps, sizeof steps, "%" PRId64, step);
    if (st == LOOM_OK && count > 0) st = in_flight_file(step_dir, mesh, path, sizeof path);
    if (st == LOOM_OK && count > 0) {
        const char *meta[] = {"format", OUTER_FORMAT, "loom.islands", sig,
                              "step",   steps,        "apply_at",     apply};
        st = loom_safetensors_write(path, tensors, count, meta, 4);
    }
    free(tensors), free(names);
    return st;
}

/* Reads them back into the outer optimiser (the same islands and layout: the file's
 * signature and step checked). */
static loom_status load_rank_state(const char *step_dir, const loom_mesh *mesh, loom_outer *outer,
                                   const char *sig, int64_t step) {
    char path[LOOM_PATH_MAX + 96];
    loom_status st = in_flight_file(step_dir, mesh, path, sizeof path);
    if (st != LOOM_OK || access(path, F_OK) != 0) return st; /* nothing of its own */
    loom_safetensors *file = NULL;
    if ((st = loom_safetensors_open(&file, path)) != LOOM_OK) return st;
    char steps[24];
    snprintf(steps, sizeof steps, "%" PRId64, step);
    const char *format = loom_safetensors_metadata(file, "format");
    const char *saved = loom_safetensors_metadata(file, "loom.islands");
    const char *at_step = loom_safetensors_metadata(file, "step");
    const char *apply = loom_safetensors_metadata(file, "apply_at");
    if (!format || strcmp(format, OUTER_FORMAT) != 0 || !saved || strcmp(saved, sig) != 0 ||
        !at_step || strcmp(at_step, steps) != 0 || !apply) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "%s: metadata: expected format \"%s\", this run's islands \"%s\" and step "
                       "%s (a file of this checkpoint's), got format %s, islands %s, step %s",
                       path, OUTER_FORMAT, sig, steps, format ? format : "none",
                       saved ? saved : "none", at_step ? at_step : "none");
    }
    loom_outer_buffers_view view;
    loom_outer_buffers(outer, &view);
    if (st == LOOM_OK && view.residual) {
        int64_t shape[1] = {(int64_t)(view.range.end - view.range.begin)};
        st = loom_safetensors_read_f32(file, "residual", 1, shape, 0, view.residual);
    }
    for (int i = 0; i < loom_outer_compressor_count(outer) && st == LOOM_OK; i++) {
        loom_compressor *c = loom_outer_compressor(outer, i);
        for (int j = 0; j < loom_compressor_state_count(c) && st == LOOM_OK; j++) {
            char name[40];
            state_name(c, i, j, &name);
            int64_t shape[1] = {(int64_t)loom_compressor_state_floats(c, j)};
            st = loom_safetensors_read_f32(file, name, 1, shape, 0,
                                           loom_compressor_state_data(c, j));
        }
    }
    const char *p = apply ? apply : "";
    for (int f = 0; f < view.fragments && st == LOOM_OK; f++) {
        char *end = NULL;
        long long at = strtoll(p, &end, 10);
        if (end == p || at < 0 || (*end != ',' && *end != '\0')) {
            st = loom_fail(LOOM_ERR_INPUT,
                           "%s: metadata 'apply_at': expected %d comma-separated steps, got \"%s\"",
                           path, view.fragments, apply);
            break;
        }
        p = *end ? end + 1 : end;
        float *sum, *sent;
        size_t lo, hi;
        loom_outer_in_flight(outer, f, &sum, &sent, &lo, &hi);
        if (at == 0) continue;
        int64_t shape[1] = {(int64_t)(hi - lo)};
        char name[40];
        snprintf(name, sizeof name, "fragment.%d.sum", f);
        st = loom_safetensors_read_f32(file, name, 1, shape, 0, sum);
        snprintf(name, sizeof name, "fragment.%d.sent", f);
        if (st == LOOM_OK && sent) st = loom_safetensors_read_f32(file, name, 1, shape, 0, sent);
        if (st == LOOM_OK) loom_outer_set_in_flight(outer, f, (int64_t)at);
    }
    loom_safetensors_close(file);
    return st;
}

/* Whether every rank of the job got here without a failure (each rank's own message says why). */
static loom_status agree(const loom_mesh *mesh, loom_status st, const char *what) {
    if (!mesh->job) return st;
    double failed = st != LOOM_OK;
    loom_status agreed = loom_comm_allreduce_f64(mesh->job, &failed, 1, LOOM_REDUCE_MAX);
    if (st != LOOM_OK || agreed != LOOM_OK) return st != LOOM_OK ? st : agreed;
    return failed > 0
               ? loom_fail(LOOM_ERR_IO, "another rank could not %s (its message says why)", what)
               : LOOM_OK;
}

loom_status loom_run_islands_save(const loom_run_parts *p, const char *dir,
                                  loom_ckpt_state *state) {
    const loom_mesh *mesh = p->mesh;
    char own_dir[LOOM_PATH_MAX + 96], sig[sizeof state->islands];
    signature(mesh->plan, sig, sizeof sig);
    loom_mesh im = island_mesh(mesh);
    loom_status st = island_folder(dir, mesh->island, own_dir, sizeof own_dir);
    /* the island's own checkpoint: its parameters now, its moments and compressors */
    loom_ckpt_state own = *state;
    own.islands[0] = '\0';
    if (st == LOOM_OK) {
        st = loom_run_compress_save(own_dir, &im, p->cfg->seq_len, p->sync, p->pipe, &own);
    }
    if (st == LOOM_OK) st = loom_run_checkpoint_write_model(own_dir, &im, p->model, p->opt, &own);
    /* the syncs in flight, finished (collective over the islands) and kept per rank */
    if (st == LOOM_OK) st = loom_outer_settle(p->outer);
    if (st == LOOM_OK) st = save_rank_state(dir, mesh, p->outer, sig, state->step);
    /* the global state, once (island 0's ranks hold every range of it) */
    loom_outer_buffers_view view;
    loom_outer_buffers(p->outer, &view);
    if (st == LOOM_OK && mesh->island == 0) {
        loom_ckpt_state global = *state;
        global.compress[0] = '\0';
        snprintf(global.islands, sizeof global.islands, "%s", sig);
        const float *bufs[3] = {view.start, view.momentum, NULL};
        int sharded[3] = {1, 1, 1}; /* the replicas' ranges, as ZeRO cuts them */
        st = loom_run_checkpoint_write(dir, &im, p->model, bufs, sharded, &global);
    }
    st = agree(mesh, st, "write its part of the islands checkpoint");
    if (st == LOOM_OK && mesh->lead) {
        st = loom_checkpoint_point_latest(p->cfg->out, state->step);
        if (st == LOOM_OK)
            loom_info("saved checkpoint %s (and its %d islands')", dir, mesh->islands);
    }
    return st;
}

loom_status loom_run_checkpoint_islands(const char *dir, char *sig, size_t cap) {
    char path[LOOM_PATH_MAX + 64];
    loom_safetensors *file = NULL;
    sig[0] = '\0';
    loom_status st = loom_path_join(path, sizeof path, dir, "state.safetensors");
    if (st == LOOM_OK) st = loom_safetensors_open(&file, path);
    if (st != LOOM_OK) return st;
    const char *saved = loom_safetensors_metadata(file, "loom.islands");
    if (saved) snprintf(sig, cap, "%s", saved);
    loom_safetensors_close(file);
    return LOOM_OK;
}

loom_status loom_run_islands_resume_start(const loom_run_parts *p, const char *dir,
                                          loom_ckpt_state *state, int *islands_checkpoint) {
    char saved[sizeof state->islands];
    loom_status st = loom_run_checkpoint_islands(dir, saved, sizeof saved);
    *islands_checkpoint = saved[0] != '\0';
    if (st != LOOM_OK) return st;
    if (!saved[0]) { /* any other checkpoint: every island starts from it */
        st = loom_run_checkpoint_load(dir, p->mesh, p->model, p->opt, state);
        if (st == LOOM_OK)
            st = loom_run_compress_load(dir, p->mesh, p->cfg->seq_len, p->sync, p->pipe, state);
        return st;
    }
    if (p->mesh->plan->islands.count < 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--resume %s: a checkpoint of island training (%s); resume it with "
                         "--islands, or start one model from its global model with --init-from",
                         dir, saved);
    }
    /* the global model: the round start every island's outer optimiser begins from */
    const loom_gpt *m = p->model;
    float *dst[3] = {p->model->params_memory, NULL, NULL};
    size_t lo[3] = {m->params_begin, 0, 0}, hi[3] = {m->params_end, 0, 0};
    return loom_run_checkpoint_read(dir, p->model, dst, lo, hi, state);
}

loom_status loom_run_islands_resume(const loom_run_parts *p, const char *dir,
                                    loom_ckpt_state *state) {
    const loom_mesh *mesh = p->mesh;
    char saved[sizeof state->islands], sig[sizeof state->islands];
    loom_status st = loom_run_checkpoint_islands(dir, saved, sizeof saved);
    if (st != LOOM_OK) return st;
    int before = 0;
    if (sscanf(saved, "islands=%d", &before) != 1 || before < 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: metadata 'loom.islands': expected \"islands=K ...\" with K >= 1, "
                         "got \"%s\"",
                         dir, saved);
    }
    signature(mesh->plan, sig, sizeof sig);
    int same = !strcmp(saved, sig);
    /* the outer momentum, this rank's range of it */
    loom_outer_buffers_view view;
    loom_outer_buffers(p->outer, &view);
    loom_ckpt_state global = *state;
    float *dst[3] = {NULL, view.momentum, NULL};
    size_t lo[3] = {0, view.range.begin, 0}, hi[3] = {0, view.range.end, 0};
    st = loom_run_checkpoint_read(dir, p->model, dst, lo, hi, &global);
    char own_dir[LOOM_PATH_MAX + 96];
    if (st == LOOM_OK) st = island_folder(dir, mesh->island % before, own_dir, sizeof own_dir);
    loom_mesh im = island_mesh(mesh);
    if (st == LOOM_OK && same) { /* each island where it was */
        st = loom_run_checkpoint_load(own_dir, &im, p->model, p->opt, state);
        if (st == LOOM_OK) st = load_rank_state(dir, mesh, p->outer, sig, state->step);
    } else if (st == LOOM_OK) { /* from the round start, with the moments of an island */
        if (mesh->lead) {
            loom_warn("--resume %s: the checkpoint's islands (%s) are not this run's (%s): every "
                      "island restarts the round from the global model, with the AdamW moments "
                      "of island (its number mod %d); the outer momentum carries over, the "
                      "error-feedback residuals start at zero; not a bit-exact resume",
                      dir, saved, sig, before);
        }
        float *moments[3] = {NULL, p->opt->m, p->opt->v};
        size_t mlo[3] = {0, p->opt->range.begin, p->opt->range.begin};
        size_t mhi[3] = {0, p->opt->range.end, p->opt->range.end};
        st = loom_run_checkpoint_read(own_dir, p->model, moments, mlo, mhi, state);
        if (st == LOOM_OK) st = loom_outer_restart(p->outer);
    }
    if (st == LOOM_OK)
        st = loom_run_compress_load(own_dir, &im, p->cfg->seq_len, p->sync, p->pipe, state);
    return st;
}
