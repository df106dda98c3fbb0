/*
 * eval.c — validation during training: the mean loss over a fixed set of windows, shared out
 * among the data-parallel replicas and run forward-only through the pipeline executor, so the
 * figure is the same whatever the layout; with islands, of the global model.
 */
#include "train/train_internal.h"

static loom_status validate(const loom_train_config *cfg, const loom_mesh *mesh,
                            loom_pipeline *pipe, const loom_dataset *data, loom_loader *loader,
                            int32_t *inputs, int32_t *targets, double *mean) {
    const loom_plan *plan = mesh->plan;
    int64_t windows = (int64_t)cfg->eval_batches * plan->global_batch;
    int64_t available = (int64_t)loom_loader_num_windows(loader);
    if (windows > available) windows = available;
    int dp = mesh->dp_size;
    int64_t first = windows * mesh->dp_rank / dp, last = windows * (mesh->dp_rank + 1) / dp;
    double sum = 0.0;
    loom_status st = LOOM_OK;
    if (first < last) st = loom_loader_set_pos(loader, (loom_loader_pos){0, (uint64_t)first});
    for (int64_t done = first; done < last && st == LOOM_OK;) {
        int b = last - done < plan->micro_batch ? (int)(last - done) : plan->micro_batch;
        double loss = 0.0;
        if (loom_dataset_has_tokens(data)) st = loom_loader_next(loader, b, inputs, targets);
        if (st == LOOM_OK) st = loom_pipeline_forward(pipe, inputs, targets, b, &loss);
        sum += loss * b;
        done += b;
    }
    if (st == LOOM_OK && dp > 1) st = loom_comm_allreduce_f64(mesh->dp, &sum, 1, LOOM_REDUCE_SUM);
    if (st == LOOM_OK && mesh->pp_size > 1) {
        st = loom_comm_allreduce_f64(mesh->pp, &sum, 1, LOOM_REDUCE_SUM);
    }
    *mean = sum / (double)windows;
    return st;
}

loom_status loom_run_validation(const loom_train_config *cfg, const loom_mesh *mesh,
                                loom_pipeline *pipe, loom_outer *outer, const loom_dataset *data,
                                loom_loader *loader, int32_t *inputs, int32_t *targets,
                                double *mean) {
    /* islands: of the global model, swapped in for the island's and back (every island runs
     * the same windows on the same model) */
    loom_status st = loom_outer_swap(outer);
    if (st == LOOM_OK) st = validate(cfg, mesh, pipe, data, loader, inputs, targets, mean);
    if (st == LOOM_OK) st = loom_outer_swap(outer);
    return st;
}
