/*
 * memory.c — whether a run fits this machine, decided before anything is allocated: this rank's
 * part of the model (weights, gradients, AdamW's moments, the activations of the micro-batches
 * it holds at once, backward scratch), from the model's cost facts, against the memory the
 * machine has for the ranks it runs. A run that cannot fit is refused by name (exit 2) rather
 * than ending "out of memory" hours later or taking the machine down.
 */
#include "train/train_internal.h"

#include <stdlib.h>
#include <string.h>

/* What this rank will hold (parameters, gradients, AdamW's moments, activations of the micro-
 * batches in flight, backward scratch), from the model's cost facts, against the machine's
 * memory shared by the ranks on it: refused before anything is allocated. */
loom_status loom_run_check_memory(const loom_train_config *cfg, const loom_plan *plan,
                                  const loom_mesh *mesh) {
    /* the rank's virtual stages, each costed on its own: weights, gradients and moments add up
     * (the tied embedding once when the rank holds both of its uses); activation sets are sized
     * for the largest chunk, as many as the schedule keeps in flight */
    int v = plan->num_stages / plan->pp, peak = loom_pipeline_peak_in_flight(plan, mesh->pp_rank);
    int split = !strcmp(plan->schedule, "zb-h1") || !strcmp(plan->schedule, "zb-v");
    int64_t state = 0, slot = 0, input = 0, scratch = 0, optimizer = 0, kept = 0;
    int embedding = 0, head = 0, recompute = 0;
    char ranges[128] = "";
    size_t used = 0;
    for (int s = 0; s < plan->num_stages; s++) {
        int rank, chunk;
        loom_plan_place(plan->schedule, plan->pp, v, s, &rank, &chunk);
        if (rank != mesh->pp_rank) continue;
        const loom_plan_stage *stage = &plan->stages[s];
        recompute = stage->recompute && plan->num_stages > 1;
        loom_gpt_stage_spec spec = {
            mesh->tp_size, stage->first_layer, stage->end_layer, stage->embedding,
            stage->head,   plan->micro_batch,  cfg->seq_len,     1,
            recompute};
        loom_gpt_stage_cost cost;
        loom_status st = loom_gpt_cost_stage(&plan->model, &spec, &cost);
        if (st != LOOM_OK) return st;
        state += cost.param_bytes + cost.grad_bytes + cost.optimizer_bytes;
        optimizer += cost.optimizer_bytes;
        int64_t chunk_slot = cost.act_slot_bytes + (split ? cost.act_slot_split_bytes : 0);
        if (chunk_slot > slot) slot = chunk_slot;
        if (cost.act_bytes_recompute - cost.act_slot_bytes > input)
            input = cost.act_bytes_recompute - cost.act_slot_bytes;
        if (cost.grad_scratch_bytes > scratch) scratch = cost.grad_scratch_bytes;
        if (split && cost.act_slot_split_bytes > kept) kept = cost.act_slot_split_bytes;
        embedding |= stage->embedding, head |= stage->head;
        if (used < sizeof ranges) {
            used += (size_t)snprintf(ranges + used, sizeof ranges - used, "%s[%d, %d)",
                                     used ? " " : "", stage->first_layer, stage->end_layer);
        }
    }
    const loom_gpt_config *m = &plan->model;
    if (embedding && head) { /* one wte: parameters, gradients, two moments */
        int64_t wte = (int64_t)(m->padded_vocab_size / mesh->tp_size) * m->channels * 4;
        state -= 4 * wte, optimizer -= 2 * wte;
    }
    /* recomputation keeps one set, each micro-batch's input, and under split backward what B
     * leaves for W (the head's logit gradient aside: an underestimate on the head's rank) */
    int64_t act = recompute ? slot + (input + kept) * peak : slot * peak;
    int64_t bytes = state + act + scratch;
    if (cfg->zero1 && !cfg->no_zero1 && mesh->dp_size > 1) {
        bytes -= optimizer - optimizer / mesh->dp_size;
    }
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); /* ranks on this machine */
    int sharers = local ? atoi(local) : 1;
    double state_gib = (double)(bytes - act - scratch) / 1073741824.0;
    double act_gib = (double)(act + scratch) / 1073741824.0;
    char what[640];
    snprintf(what, sizeof what,
             "this rank's part of the model (layers %s of %d, d_model %d, context %d, vocab %d; "
             "tensor rank %d of %d) with --micro-batch-size %d x --seq-len %d (weights, gradients "
             "and AdamW state %.2f GiB, activations %.2f GiB)",
             ranges, m->num_layers, m->channels, m->max_seq_len, m->vocab_size, mesh->tp_rank,
             mesh->tp_size, plan->micro_batch, cfg->seq_len, state_gib, act_gib);
    return loom_memory_check(bytes, sharers, what,
                             "choose a smaller model or micro-batch, or split the model over more "
                             "ranks (--pipeline-parallel, --tensor-parallel)");
}
