/*
 * memory.c — whether a run fits this machine, decided before anything is allocated: this rank's
 * part of the model (weights, gradients, AdamW's moments, the activations of the micro-batches
 * it holds at once, backward scratch), from the model's cost facts, against the memory the
 * machine has for the ranks it runs. A run that cannot fit is refused by name (exit 2) rather
 * than ending "out of memory" hours later or taking the machine down.
 */
#include "train/train_internal.h"

#include <stdlib.h>

/* What this rank will hold (parameters, gradients, AdamW's moments, activations of the micro-
 * batches in flight, backward scratch), from the model's cost facts, against the machine's
 * memory shared by the ranks on it: refused before anything is allocated. */
loom_status loom_run_check_memory(const loom_train_config *cfg, const loom_plan *plan,
                                  const loom_mesh *mesh) {
    const loom_plan_stage *stage = &plan->stages[mesh->pp_rank];
    loom_gpt_stage_spec spec = {mesh->tp_size,
                                stage->first_layer,
                                stage->end_layer,
                                stage->embedding,
                                stage->head,
                                plan->micro_batch,
                                cfg->seq_len,
                                loom_pipeline_peak_in_flight(plan, mesh->pp_rank),
                                stage->recompute && mesh->pp_size > 1};
    loom_gpt_stage_cost cost;
    loom_status st = loom_gpt_cost_stage(&plan->model, &spec, &cost);
    if (st != LOOM_OK) return st;
    int64_t bytes = cost.total_bytes;
    if (cfg->zero1 && !cfg->no_zero1 && mesh->dp_size > 1) {
        bytes -= cost.optimizer_bytes - cost.optimizer_bytes / mesh->dp_size;
    }
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); /* ranks on this machine */
    int sharers = local ? atoi(local) : 1;
    const loom_gpt_config *m = &plan->model;
    double state_gib = (double)(bytes - cost.act_bytes - cost.grad_scratch_bytes) / 1073741824.0;
    double act_gib = (double)(cost.act_bytes + cost.grad_scratch_bytes) / 1073741824.0;
    char what[512];
    snprintf(what, sizeof what,
             "this rank's part of the model (layers [%d, %d) of %d, d_model %d, context %d, vocab "
             "%d; tensor rank %d of %d) with --micro-batch-size %d x --seq-len %d (weights, "
             "gradients and AdamW state %.2f GiB, activations %.2f GiB)",
             stage->first_layer, stage->end_layer, m->num_layers, m->channels, m->max_seq_len,
             m->vocab_size, mesh->tp_rank, mesh->tp_size, plan->micro_batch, cfg->seq_len,
             state_gib, act_gib);
    return loom_memory_check(bytes, sharers, what,
                             "choose a smaller model or micro-batch, or split the model over more "
                             "ranks (--pipeline-parallel, --tensor-parallel)");
}
