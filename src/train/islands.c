/*
 * islands.c — the training loop's side of islands (the outer optimiser itself is
 * parallel/outer.c): which data an island reads, and what island training refuses for now.
 */
#include "train/train_internal.h"

loom_status loom_run_islands_check(const loom_train_config *cfg, const loom_mesh *mesh) {
    if (mesh->plan->islands.count < 1) return LOOM_OK;
    if (!cfg->no_save || cfg->save_every > 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "islands: checkpoints of island training (each island's model and "
                         "optimiser mid-round, the outer state) are not built yet; train with "
                         "--no-save and without --save-every");
    }
    if (cfg->resume[0]) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--resume %s: islands cannot resume yet (their checkpoints are not "
                         "built); start the island run afresh or use --init-from",
                         cfg->resume);
    }
    return LOOM_OK;
}

int loom_run_data_replica(const loom_mesh *mesh, const loom_test_hooks *hooks, int *replicas) {
    int same = hooks->islands_same_data; /* every island as if it were the only one */
    *replicas = (same ? 1 : mesh->islands) * mesh->dp_size;
    return (same ? 0 : mesh->island) * mesh->dp_size + mesh->dp_rank;
}
