/*
 * memory.c — whether a run fits this machine, decided before anything is allocated: this rank's
 * part of the model (weights, gradients, AdamW's moments, the activations of the micro-batches
 * it holds at once, backward scratch), from the model's cost facts, against the memory the
 * machine has for the ranks it runs. A run that cannot fit is refused by name (exit 2) rather
 * than ending "out of memory" hours later or taking the machine down.
 */
#include "train/train_internal.h"
#include "loom/parallel.h"

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
