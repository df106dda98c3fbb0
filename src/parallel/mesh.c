/*
 * mesh.c — the rank mesh: TP, DP and PP groups split from the world once, in Megatron's
 * order (TP varies fastest, then DP, PP slowest), so TP groups sit on neighbouring ranks.
 */
#include "loom/parallel.h"

#include <string.h>

loom_status loom_mesh_create(loom_comm *world, int dp, int tp, int pp, loom_mesh *mesh) {
    memset(mesh, 0, sizeof *mesh);
    int size = loom_comm_size(world), rank = loom_comm_rank(world);
    if (dp <= 0 || tp <= 0 || pp <= 0) {
        return loom_fail(LOOM_ERR_INPUT, "mesh: dp, tp and pp must be positive, got %d, %d, %d", dp,
                         tp, pp);
    }
    if ((int64_t)dp * tp * pp != size) {
        return loom_fail(LOOM_ERR_INPUT,
                         "mesh: dp x tp x pp = %d x %d x %d = %lld ranks, but %d were launched; "
                         "start with mpirun -np %lld or change the layout",
                         dp, tp, pp, (long long)dp * tp * pp, size, (long long)dp * tp * pp);
    }
    mesh->world = world;
    mesh->dp_size = dp, mesh->tp_size = tp, mesh->pp_size = pp;
    mesh->tp_rank = rank % tp;
    mesh->dp_rank = (rank / tp) % dp;
    mesh->pp_rank = rank / (tp * dp);
    /* colours: the coordinates that stay fixed within a group */
    loom_status st =
        loom_comm_split(world, mesh->pp_rank * dp + mesh->dp_rank, mesh->tp_rank, "tp", &mesh->tp);
    if (st == LOOM_OK) {
        st = loom_comm_split(world, mesh->pp_rank * tp + mesh->tp_rank, mesh->dp_rank, "dp",
                             &mesh->dp);
    }
    if (st == LOOM_OK) {
        st = loom_comm_split(world, mesh->dp_rank * tp + mesh->tp_rank, mesh->pp_rank, "pp",
                             &mesh->pp);
    }
    if (st != LOOM_OK) loom_mesh_free(mesh);
    return st;
}

void loom_mesh_free(loom_mesh *mesh) {
    loom_comm_free(mesh->tp);
    loom_comm_free(mesh->dp);
    loom_comm_free(mesh->pp);
    mesh->tp = mesh->dp = mesh->pp = NULL;
}
