/*
 * test_outer.c — islands' outer step (parallel/outer.c, run over MPI by 1 to 3 ranks, each an
 * island of one rank) equals a single-process simulation of every island's arithmetic in
 * double precision: each rank also plays every island, with the islands' synthetic inner
 * updates, the averaged outer gradient, Nesterov momentum (and SGD with momentum), and the
 * fragments' staggered sync steps, computed here from the documented rules (docs/islands.md):
 * fragment of a unit by its layer, t mod H = floor(f H / F), and with overlap the result applied
 * tau steps after the send on top of the island's progress since. Also: the global-model swap and
 * back, and that islands starting from different parameters are refused.
 */
#include "check.h"
#include "loom/comm.h"
#include "loom/parallel.h"

#include <stdlib.h>
#include <string.h>

enum { LAYERS = 4, STEPS = 9, MAX_ISLANDS = 4 };

static int rank, size;

/* Island k's inner update of entry i at step t: small, smooth, different on every island. */
static double inner(int k, int t, size_t i) {
    return 1e-3 * (double)((int)((i * 7 + (size_t)t * 3 + (size_t)k * 5) % 11) - 5) +
           1e-4 * (double)(k + 1);
}

/* The fragment of flat offset i: the unit holding it, by the rules. */
static int fragment_of(const loom_gpt *m, size_t i, int F) {
    int u = 0;
    while (u + 1 < m->num_units && m->unit_begin[u + 1] <= i) u++;
    if (u == 0) return 0;
    if (u == m->num_units - 1) return F - 1;
    return (u - 1) * F / LAYERS;
}

/* The simulation's outer step of fragment f, once its sum is in: d from the islands' outer
 * gradients at the send, and each island continues from the new start plus its own progress
 * since the send. */
static void simulate_apply(const loom_gpt *model, int F, int f, loom_outer_optimizer optimizer,
                           double mu, double lr, double *start, double *m, double **now,
                           double **delta, double **sent) {
    for (size_t i = 0; i < model->num_params; i++) {
        if (fragment_of(model, i, F) != f) continue;
        double d = 0;
        for (int k = 0; k < size; k++) d += delta[k][i];
        d /= size;
        m[i] = mu * m[i] + d;
        start[i] -= lr * (optimizer == LOOM_OUTER_NESTEROV ? d + mu * m[i] : m[i]);
        for (int k = 0; k < size; k++) now[k][i] = start[i] + (now[k][i] - sent[k][i]);
    }
}

static void run_case(loom_comm *world, loom_outer_optimizer optimizer, int H, int F, int tau) {
    loom_gpt_config config;
    loom_gpt_preset("tiny", &config);
    config.num_layers = LAYERS;
    loom_plan_islands islands;
    loom_plan_islands_init(&islands);
    islands.count = size, islands.inner_steps = H, islands.fragments = F;
    islands.optimizer = optimizer, islands.overlap_steps = tau;
    loom_plan_request request = {.micro_batch = 1, .islands = &islands};
    loom_plan plan;
    loom_mesh mesh;
    loom_gpt *model = NULL;
    loom_outer *outer = NULL;
    loom_status st = loom_plan_from_request(&plan, &config, &request, size);
    CHECK(st == LOOM_OK, "plan: %s", loom_last_error());
    if (st != LOOM_OK) return;
    st = loom_mesh_create(world, &plan, &mesh);
    CHECK(st == LOOM_OK && mesh.island == rank && mesh.islands == size, "mesh: %s",
          loom_last_error());
    loom_gpt_shard shard = loom_mesh_model_shard(&mesh);
    if (st == LOOM_OK) st = loom_gpt_create_shard(&model, &plan.model, loom_backend_cpu(), &shard);
    if (st == LOOM_OK) {
        loom_gpt_init_weights(model, 11);
        st = loom_outer_create(&outer, &mesh, model, NULL);
    }
    CHECK(st == LOOM_OK && outer, "outer: %s", loom_last_error());
    if (st != LOOM_OK) return;
    size_t n = model->num_params;
    double *start = malloc(n * sizeof *start), *m = calloc(n, sizeof *m);
    double *now[MAX_ISLANDS], *delta[MAX_ISLANDS], *sent[MAX_ISLANDS];
    for (int k = 0; k < size; k++) {
        now[k] = malloc(n * sizeof(double));
        delta[k] = malloc(n * sizeof(double));
        sent[k] = malloc(n * sizeof(double));
    }
    for (size_t i = 0; i < n; i++) {
        start[i] = model->params_memory[i];
        for (int k = 0; k < size; k++) now[k][i] = start[i];
    }
    double mu = islands.momentum, lr = islands.lr, worst = 0;
    int syncs = 0, apply_at[8] = {0};
    for (int t = 1; t <= STEPS; t++) {
        for (size_t i = 0; i < n; i++) {
            model->params_memory[i] += (float)inner(rank, t, i);
            for (int k = 0; k < size; k++) now[k][i] = (float)(now[k][i] + inner(k, t, i));
        }
        st = loom_outer_step(outer, t, STEPS);
        CHECK(st == LOOM_OK, "outer step %d: %s", t, loom_last_error());
        /* what lands now (everything at the last step), then what is sent now */
        for (int f = 0; f < F; f++) {
            if (!apply_at[f] || (apply_at[f] > t && t < STEPS)) continue;
            simulate_apply(model, F, f, optimizer, mu, lr, start, m, now, delta, sent);
            apply_at[f] = 0;
        }
        for (int f = 0; f < F; f++) {
            if (t % H != f * H / F) continue;
            syncs++;
            for (size_t i = 0; i < n; i++) {
                if (fragment_of(model, i, F) != f) continue;
                for (int k = 0; k < size; k++) {
                    delta[k][i] = start[i] - now[k][i];
                    sent[k][i] = now[k][i];
                }
            }
            apply_at[f] = t + tau;
            if (tau == 0 || t == STEPS) {
                simulate_apply(model, F, f, optimizer, mu, lr, start, m, now, delta, sent);
                apply_at[f] = 0;
            }
        }
        for (size_t i = 0; i < n; i++) {
            double e = fabs(model->params_memory[i] - now[rank][i]) / (fabs(now[rank][i]) + 1e-3);
            if (e > worst) worst = e;
        }
    }
    CHECK(syncs >= STEPS / H * F - F && worst < 2e-5,
          "%s H %d F %d tau %d on %d islands: worst relative difference from the simulation "
          "%.3g (%d fragment syncs)",
          loom_outer_optimizer_name(optimizer), H, F, tau, size, worst, syncs);
    /* the global model swapped in is the simulation's round starts, and swapped back */
    float *mine = malloc(n * sizeof *mine);
    memcpy(mine, model->params_memory, n * sizeof *mine);
    st = loom_outer_swap(outer);
    double off = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(model->params_memory[i] - start[i]) / (fabs(start[i]) + 1e-3);
        if (e > off) off = e;
    }
    CHECK(st == LOOM_OK && off < 2e-5, "swapped in: the global model within %.3g", off);
    st = loom_outer_swap(outer);
    CHECK(st == LOOM_OK && !memcmp(mine, model->params_memory, n * sizeof *mine),
          "swapped back: the island's own parameters");
    free(mine);
    for (int k = 0; k < size; k++) free(now[k]), free(delta[k]), free(sent[k]);
    free(start);
    free(m);
    loom_outer_free(outer);
    /* islands that start apart are refused, on every island */
    if (size > 1) {
        if (rank == 1) model->params_memory[3] += 1.0f;
        st = loom_outer_create(&outer, &mesh, model, NULL);
        CHECK(st == LOOM_ERR_RUNTIME && strstr(loom_last_error(), "start from different"),
              "islands apart: %s", st == LOOM_OK ? "accepted" : loom_last_error());
        if (st == LOOM_OK) loom_outer_free(outer);
    }
    loom_gpt_free(model);
    loom_mesh_free(&mesh);
    loom_plan_free(&plan);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) return 1;
    rank = world ? loom_comm_rank(world) : 0, size = world ? loom_comm_size(world) : 1;
    if (size > MAX_ISLANDS) {
        fprintf(stderr, "at most %d ranks\n", MAX_ISLANDS);
        loom_comm_finalize(world);
        return 1;
    }
    run_case(world, LOOM_OUTER_NESTEROV, 3, 1, 0);
    run_case(world, LOOM_OUTER_NESTEROV, 4, 2, 0);
    run_case(world, LOOM_OUTER_SGD, 2, 2, 0);
    run_case(world, LOOM_OUTER_NESTEROV, 3, 3, 0);
    /* overlapped: applied tau steps after the send (the last step applies what is in flight) */
    run_case(world, LOOM_OUTER_NESTEROV, 4, 1, 2);
    run_case(world, LOOM_OUTER_NESTEROV, 4, 2, 3);
    run_case(world, LOOM_OUTER_SGD, 3, 3, 1);
    int bad = check_failed;
    int code = check_finish();
    double any = bad;
    if (world) loom_comm_allreduce_f64(world, &any, 1, LOOM_REDUCE_SUM);
    loom_comm_finalize(world);
    return any > 0 ? 1 : code;
}
