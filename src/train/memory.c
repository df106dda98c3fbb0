/*
 * memory.c — whether a run fits this machine, decided before anything is allocated: this rank's
 * part of the model (weights, gradients, AdamW's moments, the activations of the micro-batches
 * it holds at once, backward scratch), from the model's cost facts, against the memory the
 * machine has for the ranks it runs. A run that cannot fit is refused by name (exit 2) rather
 * than ending "out of memory" hours later or taking the machine down.
 */
#include "train/train_internal.h"
#include "loom/parallel.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What this rank will hold (parameters, gradients, AdamW's moments, activations of the micro-
 * batches in flight, backward scratch), from the model's cost facts, against the machine's
 * memory shared by the `sharers` ranks on it: refused before anything is allocated. */
loom_status loom_run_check_memory(const loom_train_config *cfg, const loom_plan *plan,
                                  const loom_mesh *mesh, int sharers) {
    loom_rank_memory mem;
    loom_status st = loom_plan_rank_memory(plan, mesh->pp_rank, cfg->seq_len, &mem);
    if (st != LOOM_OK) return st;
    /* the rank's layer ranges, for the message */
    char ranges[128] = "";
    size_t used = 0;
    for (int s = 0; s < plan->num_stages && used < sizeof ranges; s++) {
        if (plan->stages[s].rank != mesh->pp_rank) continue;
        used += (size_t)snprintf(ranges + used, sizeof ranges - used, "%s[%d, %d)", used ? " " : "",
                                 plan->stages[s].first_layer, plan->stages[s].end_layer);
    }
    const loom_gpt_config *m = &plan->model;
    double state_gib = (double)(mem.weights + mem.grads + mem.optimizer) / 1073741824.0;
    double act_gib = (double)(mem.activations + mem.scratch) / 1073741824.0;
    char what[640];
    snprintf(what, sizeof what,
             "this rank's part of the model (layers %s of %d, d_model %d, context %d, vocab %d; "
             "tensor rank %d of %d) with --micro-batch-size %d x --seq-len %d (weights, gradients "
             "and AdamW state %.2f GiB, activations %.2f GiB)",
             ranges, m->num_layers, m->channels, m->max_seq_len, m->vocab_size, mesh->tp_rank,
             mesh->tp_size, plan->micro_batch, cfg->seq_len, state_gib, act_gib);
    return loom_memory_check(mem.total, sharers, what,
                             "choose a smaller model or micro-batch, or split the model over more "
                             "ranks (--pipeline-parallel, --tensor-parallel)");
}

/* ---- the report: predicted at start-up, allocated and measured at the end ------------------ */

static double mib(double bytes) {
    return bytes / 1048576.0;
}

void loom_run_memory_predicted(const loom_train_config *cfg, const loom_plan *plan,
                               const loom_mesh *mesh) {
    if (!mesh->lead) return;
    loom_info("memory per rank, predicted (MiB; ZeRO-%d over %d replicas): pipeline rank  "
              "parameters  gradients  optimizer  gathered  activations  scratch  compressor  "
              "%stotal",
              plan->zero, plan->dp, plan->islands.count > 0 ? "outer  " : "");
    for (int p = 0; p < plan->pp; p++) {
        loom_rank_memory m;
        if (loom_plan_rank_memory(plan, p, cfg->seq_len, &m) != LOOM_OK) return;
        char outer[32] = "";
        if (plan->islands.count > 0) snprintf(outer, sizeof outer, "%5.1f  ", mib(m.outer));
        loom_info("  %13d  %10.1f  %9.1f  %9.1f  %8.1f  %11.1f  %7.1f  %10.1f  %s%5.1f", p,
                  mib(m.weights), mib(m.grads), mib(m.optimizer), mib(m.gathered),
                  mib(m.activations), mib(m.scratch), mib(m.compressor), outer, mib(m.total));
    }
}

/* One rank's row: what the runtime allocated by category, and the peak resident set. */
enum {
    MEM_PARAMS,
    MEM_GRADS,
    MEM_OPTIMIZER,
    MEM_ACTIVATIONS,
    MEM_COMPRESSOR,
    MEM_OUTER,
    MEM_RSS,
    MEM_GATHERS,      /* ZeRO-3's block all-gathers over the run */
    MEM_JUST_IN_TIME, /* of them, those a pass waited for unprefetched */
    MEM_FIELDS
};

loom_status loom_run_memory_measured(const loom_train_config *cfg, const loom_plan *plan,
                                     const loom_mesh *mesh, loom_grad_sync *sync,
                                     const loom_gpt *model, const loom_adamw *opt,
                                     const loom_outer *outer, int64_t peak_rss) {
    int ranks = mesh->world ? loom_comm_size(mesh->world) : 1;
    int me = mesh->world ? loom_comm_rank(mesh->world) : 0;
    double *rows = loom_calloc((size_t)ranks * MEM_FIELDS, sizeof *rows, "memory report");
    if (!rows) return LOOM_ERR_NOMEM;
    double *row = rows + (size_t)me * MEM_FIELDS;
    row[MEM_PARAMS] = (double)loom_grad_sync_param_bytes(sync);
    row[MEM_GRADS] = (double)loom_grad_sync_grad_bytes(sync);
    row[MEM_OPTIMIZER] = 2.0 * (double)opt->range.shard * sizeof(float);
    row[MEM_ACTIVATIONS] = (double)loom_gpt_activation_bytes(model);
    row[MEM_COMPRESSOR] = (double)loom_grad_sync_state_bytes(sync);
    row[MEM_OUTER] = (double)loom_outer_state_bytes(outer);
    row[MEM_RSS] = (double)peak_rss;
    int64_t gathers, just_in_time;
    loom_grad_sync_gather_counts(sync, &gathers, &just_in_time);
    row[MEM_GATHERS] = (double)gathers, row[MEM_JUST_IN_TIME] = (double)just_in_time;
    loom_status st = LOOM_OK;
    if (mesh->world) {
        st = loom_comm_allreduce_f64(mesh->world, rows, ranks * MEM_FIELDS, LOOM_REDUCE_SUM);
    }
    if (st != LOOM_OK || !mesh->lead) {
        free(rows);
        return st;
    }
    char path[LOOM_PATH_MAX + 16];
    st = loom_path_join(path, sizeof path, cfg->out, "memory.json");
    FILE *f = st == LOOM_OK ? fopen(path, "w") : NULL;
    if (st == LOOM_OK && !f) st = loom_fail(LOOM_ERR_IO, "%s: cannot write", path);
    loom_info("memory per rank, at the end (MiB; allocated by the runtime, and the peak resident "
              "set measured by the kernel): rank  parameters  gradients  optimizer  activations  "
              "compressor  peak resident");
    if (f) fprintf(f, "{\"zero\": %d, \"ranks\": [\n", plan->zero);
    for (int r = 0; r < ranks; r++) {
        const double *x = rows + (size_t)r * MEM_FIELDS;
        loom_plan_coords c = loom_plan_rank_coords(plan, r);
        loom_rank_memory pred;
        if (loom_plan_rank_memory(plan, c.pp_rank, cfg->seq_len, &pred) != LOOM_OK)
            memset(&pred, 0, sizeof pred);
        loom_info("  %4d  %10.1f  %9.1f  %9.1f  %11.1f  %10.1f  %13.1f", r, mib(x[MEM_PARAMS]),
                  mib(x[MEM_GRADS]), mib(x[MEM_OPTIMIZER]), mib(x[MEM_ACTIVATIONS]),
                  mib(x[MEM_COMPRESSOR]), mib(x[MEM_RSS]));
        if (!f) continue;
        fprintf(f,
                "  {\"rank\": %d, \"pp\": %d, \"dp\": %d, \"tp\": %d, \"peak_rss\": %.0f, "
                "\"params\": %.0f, \"grads\": %.0f, \"optimizer\": %.0f, \"activations\": %.0f, "
                "\"compressor\": %.0f, \"outer\": %.0f, \"zero3_gathers\": %.0f, "
                "\"zero3_just_in_time\": %.0f, "
                "\"predicted\": {\"params\": %" PRId64 ", \"grads\": %" PRId64
                ", \"optimizer\": %" PRId64 ", \"gathered\": %" PRId64 ", \"activations\": %" PRId64
                ", \"scratch\": %" PRId64 ", \"compressor\": %" PRId64 ", \"outer\": %" PRId64
                ", \"total\": %" PRId64 "}}%s\n",
                r, c.pp_rank, c.dp_rank, c.tp_rank, x[MEM_RSS], x[MEM_PARAMS], x[MEM_GRADS],
                x[MEM_OPTIMIZER], x[MEM_ACTIVATIONS], x[MEM_COMPRESSOR], x[MEM_OUTER],
                x[MEM_GATHERS], x[MEM_JUST_IN_TIME], pred.weights, pred.grads, pred.optimizer,
                pred.gathered, pred.activations, pred.scratch, pred.compressor, pred.outer,
                pred.total, r + 1 < ranks ? "," : "");
    }
    if (f) {
        fprintf(f, "]}\n");
        if (fclose(f) != 0) st = loom_fail(LOOM_ERR_IO, "%s: cannot write", path);
    }
    free(rows);
    return st;
}
