/*
 * test_train_zero.c — a library caller of loom_train gets exactly the ZeRO stage its plan says
 * (run by 2 ranks under mpirun): a plan with mesh.zero 0 keeps every AdamW moment on every
 * replica, 2 x 4 bytes for each of the model's parameters (counted here from GPT-2's shapes, not
 * from loom's layout); mesh.zero 1 keeps half of them on each. The run configuration has no say
 * (it once did: a ZeRO-1 default in the config overrode the plan). Both runs train the same
 * numbers, so their final losses agree.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "loom/comm.h"
#include "loom/data.h"
#include "loom/plan.h"
#include "loom/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's parameter count from its shapes: token and position embeddings, per block two
 * LayerNorms (2C each), QKV (3C^2 + 3C), the attention projection (C^2 + C), the MLP (4C^2 +
 * 4C and 4C^2 + C), and the final LayerNorm (2C); the vocabulary padded to 128. */
static int64_t gpt2_params(const loom_gpt_config *m) {
    int64_t C = m->channels, L = m->num_layers, Vp = (m->vocab_size + 127) / 128 * 128;
    return Vp * C + (int64_t)m->max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
}

static loom_train_result run(loom_comm *world, const char *tmp, int zero, const char *out) {
    loom_train_config c;
    loom_train_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "tiny");
    snprintf(c.data, sizeof c.data, "%s/train.bin", tmp);
    snprintf(c.out, sizeof c.out, "%s/%s", tmp, out);
    c.steps = 3, c.seq_len = 16, c.lr = 3e-3, c.warmup_steps = 0, c.eval_every = 0;
    c.log_every = 100, c.threads = 1, c.no_save = 1;
    loom_gpt_config model;
    CHECK(loom_gpt_preset("tiny", &model) == LOOM_OK, "tiny preset");
    loom_plan plan;
    loom_status st = loom_plan_uniform(&plan, &model, 2, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_OK, "plan: %s", loom_last_error());
    loom_train_result r;
    memset(&r, 0, sizeof r);
    if (st != LOOM_OK) return r;
    plan.zero = zero;
    st = loom_train(&c, &plan, world, &r);
    CHECK(st == LOOM_OK, "train with zero %d: %s", zero, loom_last_error());
    loom_plan_free(&plan);
    return r;
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) return 1;
    int rank = loom_comm_rank(world);
    /* one rank makes the scratch folder afresh (two would race to remove and make it), then
     * every rank uses it */
    const char *tmp = rank == 0 ? check_tmpdir() : NULL;
    loom_comm_barrier(world);
    if (rank != 0) {
        const char *env = getenv("LOOM_TEST_TMP");
        tmp = env ? env : "/tmp/loom_test";
    }
    if (rank == 0) { /* a learnable stream of byte tokens */
        enum { COUNT = 4096 };
        static uint16_t tokens[COUNT];
        for (int i = 0; i < COUNT; i++) tokens[i] = (uint16_t)(i * 7 % 23);
        char path[1200];
        snprintf(path, sizeof path, "%s/train.bin", tmp);
        CHECK(loom_shard_write(path, tokens, COUNT) == LOOM_OK, "shard: %s", loom_last_error());
    }
    loom_comm_barrier(world);
    loom_gpt_config model;
    loom_gpt_preset("tiny", &model);
    int64_t all = 8 * gpt2_params(&model); /* two fp32 moments a parameter */
    loom_train_result off = run(world, tmp, 0, "zero0");
    loom_train_result on = run(world, tmp, 1, "zero1");
    CHECK(off.optimizer_state_bytes == all,
          "rank %d, mesh.zero 0: AdamW state %lld bytes, expected every parameter's %lld", rank,
          (long long)off.optimizer_state_bytes, (long long)all);
    /* ZeRO-1 over 2 replicas: half, up to the padding that aligns the two ranges */
    CHECK(on.optimizer_state_bytes * 2 >= all && on.optimizer_state_bytes * 2 <= all + 8 * 1024,
          "rank %d, mesh.zero 1: AdamW state %lld bytes, expected about half of %lld", rank,
          (long long)on.optimizer_state_bytes, (long long)all);
    CHECK(off.steps_done == 3 && on.steps_done == 3 &&
              fabs(off.final_loss - on.final_loss) <= 1e-5 * fabs(off.final_loss),
          "the same training either way: losses %.9g and %.9g", off.final_loss, on.final_loss);
    int code = check_finish();
    double bad = code != 0;
    loom_comm_allreduce_f64(world, &bad, 1, LOOM_REDUCE_SUM);
    loom_comm_finalize(world);
    return bad > 0 ? 1 : 0;
}
