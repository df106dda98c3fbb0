/*
 * mesh.c — the rank mesh: TP, DP and PP groups split from the world once, in Megatron's
 * order (TP varies fastest, then DP, PP slowest; the formula is the plan's), so TP groups sit
 * on neighbouring ranks; plus the group of the tied embedding's two copies. Also what the
 * runtime refuses of a plan, and which stage holds which part of the model.
 */
#include "loom/parallel.h"

#include <stdio.h>
#include <string.h>

loom_status loom_parallel_check_plan(const loom_plan *plan, const char *source) {
    /* everything a checked plan says, this build runs, but a precision other than fp32 */
    if (plan->precision != LOOM_PRECISION_FP32) {
        const char *name = loom_precision_name(plan->precision);
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: precision: \"%s\" is not supported by this build (it trains in "
                         "fp32; a plan for %s is for predicting a GPU cluster)",
                         source, name, name);
    }
    return LOOM_OK;
}

loom_status loom_parallel_compress_opts(const loom_plan_compressor *c, int place, uint64_t seed,
                                        loom_compress_opts *opts) {
    memset(opts, 0, sizeof *opts);
    opts->method = place == LOOM_COMPRESS_FOR_PP_FORWARD ? c->forward : c->method;
    opts->rank = c->rank;
    opts->fraction = c->fraction;
    /* pipeline gradients: lazy error propagation is their error feedback; forward activations
     * have none (their error would land on another micro-batch's activations) */
    opts->error_feedback = place == LOOM_COMPRESS_FOR_DP        ? c->error_feedback
                           : place == LOOM_COMPRESS_FOR_PP_GRAD ? c->lazy_error
                                                                : 0;
    opts->seed = seed;
    return loom_compress_check(opts, "plan");
}

/* Islands: the world in islands of consecutive ranks (the island's world) and the groups of
 * the ranks at the same place in every island (across). */
static loom_status split_islands(loom_comm *job, int island_size, loom_mesh *mesh) {
    int rank = loom_comm_rank(job);
    mesh->island = rank / island_size;
    loom_status st = loom_comm_split(job, mesh->island, rank, "island", &mesh->world);
    if (st == LOOM_OK) {
        st =
            loom_comm_split(job, rank % island_size, mesh->island, "across islands", &mesh->across);
    }
    return st;
}

loom_status loom_mesh_create(loom_comm *world, const loom_plan *plan, loom_mesh *mesh) {
    memset(mesh, 0, sizeof *mesh);
    mesh->world = mesh->job = world;
    mesh->plan = plan;
    mesh->islands = loom_plan_num_islands(plan);
    int dp = plan->dp, tp = plan->tp, pp = plan->pp;
    int size = world ? loom_comm_size(world) : 1;
    int64_t need = loom_plan_job_ranks(plan);
    if (need != size) {
        char count[32] = "";
        if (plan->islands.count > 0) snprintf(count, sizeof count, "%d x ", mesh->islands);
        return loom_fail(LOOM_ERR_INPUT,
                         "mesh: %sdp x tp x pp = %s%d x %d x %d = %lld ranks, but %d %s "
                         "launched; start with mpirun -np %lld or change the layout",
                         count[0] ? "islands x " : "", count, dp, tp, pp, (long long)need, size,
                         size == 1 ? "was" : "were", (long long)need);
    }
    mesh->lead = !world || loom_comm_rank(world) == 0;
    if (plan->islands.count > 0 && world) {
        loom_status st = split_islands(world, dp * tp * pp, mesh);
        if (st != LOOM_OK) {
            loom_mesh_free(mesh);
            return st;
        }
        world = mesh->world;
        loom_comm_set_island_size(dp * tp * pp); /* failure messages name the island */
    }
    int rank = world ? loom_comm_rank(world) : 0;
    mesh->dp_size = dp, mesh->tp_size = tp, mesh->pp_size = pp;
    loom_plan_coords c = loom_plan_rank_coords(plan, rank);
    mesh->dp_rank = c.dp_rank, mesh->tp_rank = c.tp_rank, mesh->pp_rank = c.pp_rank;
    if (!world) return LOOM_OK;
    /* colours: the coordinates that stay fixed within a group */
    loom_status st = loom_comm_split(world, c.pp_rank * dp + c.dp_rank, c.tp_rank, "tp", &mesh->tp);
    if (st == LOOM_OK) {
        st = loom_comm_split(world, c.pp_rank * tp + c.tp_rank, c.dp_rank, "dp", &mesh->dp);
    }
    if (st == LOOM_OK) {
        st = loom_comm_split(world, c.dp_rank * tp + c.tp_rank, c.pp_rank, "pp", &mesh->pp);
    }
    if (st == LOOM_OK && dp > 1 && plan->dp_compression.method != LOOM_COMPRESS_NONE) {
        st = loom_comm_split(mesh->dp, 0, c.dp_rank, "dp (second round)", &mesh->dp_second);
    }
    int first_rank = plan->stages[0].rank, last_rank = plan->stages[plan->num_stages - 1].rank;
    if (st == LOOM_OK && first_rank != last_rank && !plan->model.untied_head) {
        /* the tied embedding lives on the first and the last virtual stage: their gradients meet
         * (zb-v puts both on rank 0, which then holds one copy); an untied head is the last
         * stage's alone */
        int ends = c.pp_rank == first_rank || c.pp_rank == last_rank;
        st = loom_comm_split(world, ends ? c.dp_rank * tp + c.tp_rank : -1, c.pp_rank, "embedding",
                             &mesh->embedding);
        /* fused embedding sync: both copies of every replica in one group (2 dp ranks) */
        int fused = plan->embedding_sync == LOOM_EMBEDDING_SYNC_FUSED;
        if (st == LOOM_OK && fused) {
            st = loom_comm_split(world, ends ? c.tp_rank : -1, rank, "embedding (all replicas)",
                                 &mesh->embedding_all);
        }
    }
    if (st != LOOM_OK) loom_mesh_free(mesh);
    return st;
}

void loom_mesh_free(loom_mesh *mesh) {
    loom_comm_free(mesh->tp);
    loom_comm_free(mesh->dp);
    loom_comm_free(mesh->pp);
    loom_comm_free(mesh->embedding);
    loom_comm_free(mesh->embedding_all);
    loom_comm_free(mesh->dp_second);
    mesh->tp = mesh->dp = mesh->pp = mesh->embedding = mesh->embedding_all = mesh->dp_second = NULL;
    loom_comm_free(mesh->across); /* islands: these two are the mesh's own */
    if (mesh->world != mesh->job) loom_comm_free(mesh->world);
    mesh->across = NULL;
    mesh->world = mesh->job;
}

int loom_mesh_world_rank(const loom_mesh *mesh, int dp_rank, int tp_rank, int pp_rank) {
    return loom_plan_world_rank(mesh->plan, (loom_plan_coords){dp_rank, tp_rank, pp_rank});
}

int loom_mesh_owner_rank(const loom_mesh *mesh, int k, int layer) {
    const loom_plan *plan = mesh->plan;
    int stage = (k == LOOM_WTE || k == LOOM_WPE) ? 0 : plan->num_stages - 1;
    for (int s = 0; layer >= 0 && s < plan->num_stages; s++) {
        if (layer >= plan->stages[s].first_layer && layer < plan->stages[s].end_layer) stage = s;
    }
    return plan->stages[stage].rank;
}

loom_gpt_shard loom_mesh_rank_shard(const loom_mesh *mesh, int pp_rank, int tp_rank) {
    const loom_plan *plan = mesh->plan;
    loom_gpt_shard shard = {.tp_size = mesh->tp_size,
                            .tp_rank = tp_rank,
                            .tp_comm =
                                mesh->tp_size > 1 && tp_rank == mesh->tp_rank ? mesh->tp : NULL,
                            .sequence_parallel = plan->sequence_parallel && mesh->tp_size > 1};
    /* the rank's virtual stages in model order are its chunks in ascending order */
    for (int s = 0; s < plan->num_stages && shard.num_chunks < LOOM_GPT_MAX_CHUNKS; s++) {
        const loom_plan_stage *st = &plan->stages[s];
        if (st->rank != pp_rank) continue;
        shard.chunks[shard.num_chunks++] =
            (loom_gpt_chunk){st->first_layer, st->end_layer, s == 0, s == plan->num_stages - 1};
    }
    return shard;
}

loom_gpt_shard loom_mesh_model_shard(const loom_mesh *mesh) {
    loom_gpt_shard shard = loom_mesh_rank_shard(mesh, mesh->pp_rank, mesh->tp_rank);
    const loom_plan *plan = mesh->plan;
    /* ZeRO-2/3: no full-size gradient buffer; ZeRO-3: only this rank's range of the parameters
     * (the range loom_grad_sync shards the optimizer by) */
    shard.no_grads = plan->zero >= 2;
    if (plan->zero == 3) {
        loom_gpt layout;
        if (loom_gpt_describe(&layout, &plan->model, &shard) == LOOM_OK) {
            loom_zero_shard range =
                loom_zero_shard_of(layout.num_params, mesh->dp_size, mesh->dp_rank);
            shard.windowed = 1;
            shard.params_begin = range.begin;
            shard.params_end = range.end;
        }
    }
    return shard;
}
