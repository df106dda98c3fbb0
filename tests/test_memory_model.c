/*
 * test_memory_model.c — the per-rank memory model (loom_plan_rank_memory) for ZeRO stages 0-3,
 * against the parameter counts computed here from the model's shapes: ZeRO-1 divides AdamW's
 * moments by dp, ZeRO-2 also the gradients, plus what zero.c allocates: the embedding unit and
 * the final LayerNorm whole, their rings' receive buffers (each unit's largest piece among the
 * contiguous dp ranges), and two pooled block buffers (blocks + 1 when backward is split);
 * ZeRO-3 also the parameters, plus the held units and the gathered blocks (prefetch + 1 of them,
 * or every one when gathered once per step); the categories add up to the total.
 */
#include "check.h"
#include "loom/model.h"
#include "loom/parallel.h"
#include "loom/plan.h"

#include <string.h>

static loom_plan plan_of(int dp, int tp, int pp) {
    loom_gpt_config model;
    loom_gpt_preset("gpt2", &model);
    loom_plan plan;
    loom_status st =
        loom_plan_uniform(&plan, &model, dp, tp, pp, 1, 8 * dp, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_OK, "plan dp %d tp %d pp %d: %s", dp, tp, pp, loom_last_error());
    return plan;
}

static loom_rank_memory memory_of(loom_plan *plan, int zero, int pp_rank) {
    plan->zero = zero;
    loom_rank_memory m;
    loom_status st = loom_plan_rank_memory(plan, pp_rank, 64, &m);
    CHECK(st == LOOM_OK, "rank memory, zero %d: %s", zero, loom_last_error());
    int64_t sum =
        m.weights + m.grads + m.optimizer + m.gathered + m.activations + m.scratch + m.compressor;
    CHECK(sum == m.total, "zero %d: categories sum to %lld, total %lld", zero, (long long)sum,
          (long long)m.total);
    return m;
}

/* GPT-2 on one pipeline stage, dp 4: the shard sizes from the shapes. */
static void test_zero_stages_one_stage(void) {
    const int dp = 4;
    loom_plan plan = plan_of(dp, 1, 1);
    const loom_gpt_config *c = &plan.model;
    int64_t C = c->channels, L = c->num_layers, Vp = c->padded_vocab_size, T = c->max_seq_len;
    int64_t block = 12 * C * C + 13 * C; /* qkv, attproj, fc, fcproj weights and biases, 2 LNs */
    int64_t params = Vp * C + T * C + L * block + 2 * C;
    int64_t bytes = 4 * params;
    int64_t embedding_unit = 4 * (Vp * C + T * C), lnf_unit = 4 * 2 * C;

    loom_rank_memory z0 = memory_of(&plan, 0, 0);
    CHECK(z0.weights == bytes && z0.grads == bytes && z0.optimizer == 2 * bytes,
          "ZeRO-0: weights %lld grads %lld optimizer %lld, expected %lld, %lld, %lld",
          (long long)z0.weights, (long long)z0.grads, (long long)z0.optimizer, (long long)bytes,
          (long long)bytes, (long long)(2 * bytes));
    CHECK(z0.gathered == 0, "ZeRO-0 gathers nothing: %lld", (long long)z0.gathered);

    loom_rank_memory z1 = memory_of(&plan, 1, 0);
    CHECK(z1.optimizer == 2 * bytes / dp && z1.grads == bytes && z1.weights == bytes,
          "ZeRO-1: optimizer %lld, expected %lld", (long long)z1.optimizer,
          (long long)(2 * bytes / dp));

    /* ZeRO-2: gradients / dp; the embedding unit and the final LayerNorm whole; their rings'
     * receive buffers: the embedding unit (39.4M floats) is longer than a rank's range (n/4,
     * 31.1M) and starts at 0, so its largest piece is a whole range; the final LayerNorm lies in
     * the last rank's range; two pooled block buffers */
    int64_t range = (params + dp - 1) / dp;
    CHECK(Vp * C + T * C > range && params - 2 * C >= (dp - 1) * range, "gpt2's shapes as assumed");
    int64_t held = embedding_unit + lnf_unit, held_ring = 4 * (range + 2 * C);
    loom_rank_memory z2 = memory_of(&plan, 2, 0);
    CHECK(z2.grads == bytes / dp, "ZeRO-2: grads %lld, expected %lld = %lld / %d",
          (long long)z2.grads, (long long)(bytes / dp), (long long)bytes, dp);
    CHECK(z2.optimizer == z1.optimizer && z2.weights == bytes, "ZeRO-2 keeps ZeRO-1's moments");
    /* and, on one stage without TP, every replica's rows and tokens for the embedding's
     * backward (added into the owners' shards) */
    int64_t rows = (int64_t)plan.micro_batch * 64, lookup = 4 * dp * rows * (C + 1);
    CHECK(z2.scratch - z0.scratch == held + held_ring + 2 * 4 * block + lookup,
          "ZeRO-2: buffers %lld, expected held units %lld + their rings %lld + 2 blocks %lld + "
          "the lookup's rows %lld",
          (long long)(z2.scratch - z0.scratch), (long long)held, (long long)held_ring,
          (long long)(2 * 4 * block), (long long)lookup);
    CHECK(z2.total < z1.total, "ZeRO-2 (%lld) below ZeRO-1 (%lld)", (long long)z2.total,
          (long long)z1.total);

    /* ZeRO-3: parameters / dp + the held units' parameters + the gathered blocks */
    plan.zero3_prefetch = 1;
    loom_rank_memory z3 = memory_of(&plan, 3, 0);
    CHECK(z3.weights == bytes / dp && z3.grads == bytes / dp && z3.optimizer == 2 * bytes / dp,
          "ZeRO-3: weights %lld grads %lld optimizer %lld, expected %lld, %lld, %lld",
          (long long)z3.weights, (long long)z3.grads, (long long)z3.optimizer,
          (long long)(bytes / dp), (long long)(bytes / dp), (long long)(2 * bytes / dp));
    CHECK(z3.gathered == held + 2 * 4 * block,
          "ZeRO-3, prefetch 1: gathered %lld, expected held %lld + two blocks %lld",
          (long long)z3.gathered, (long long)held, (long long)(2 * 4 * block));
    CHECK(z3.scratch == z2.scratch + 4 * rows * C,
          "ZeRO-3 keeps ZeRO-2's buffers and its lookup's ring block %lld: scratch %lld, "
          "ZeRO-2's %lld",
          (long long)(4 * rows * C), (long long)z3.scratch, (long long)z2.scratch);
    plan.zero3_prefetch = 0;
    loom_rank_memory z3_0 = memory_of(&plan, 3, 0);
    CHECK(z3_0.gathered == held + 4 * block, "ZeRO-3, prefetch 0: gathered %lld, expected %lld",
          (long long)z3_0.gathered, (long long)(held + 4 * block));
    plan.zero3_prefetch = 3;
    loom_rank_memory z3_3 = memory_of(&plan, 3, 0);
    CHECK(z3_3.gathered == held + 4 * 4 * block, "ZeRO-3, prefetch 3: gathered %lld, expected %lld",
          (long long)z3_3.gathered, (long long)(held + 4 * 4 * block));
    plan.zero3_prefetch = 1;
    plan.zero3_gather = LOOM_ZERO3_GATHER_STEP;
    loom_rank_memory step = memory_of(&plan, 3, 0);
    CHECK(step.gathered == bytes && step.weights == bytes / dp,
          "ZeRO-3 gathered for the step: gathered %lld, expected the whole %lld",
          (long long)step.gathered, (long long)bytes);
    CHECK(z3.total < z2.total, "ZeRO-3 (%lld) below ZeRO-2 (%lld)", (long long)z3.total,
          (long long)z2.total);
    /* activations do not depend on the ZeRO stage */
    CHECK(z0.activations == z3.activations, "activations %lld vs %lld", (long long)z0.activations,
          (long long)z3.activations);
    loom_plan_free(&plan);
}

/* tp 2, pp 2: each TP rank shards its own slice; the first stage's held units are the embedding
 * (its half of wte, and wpe) and nothing after its blocks, the last stage's its half of the tied
 * wte and the final LayerNorm. A held unit starting at 0 has a ring piece of min(unit, range);
 * the final LayerNorm lies in the last rank's range. */
static void test_zero_stages_tp_pp(void) {
    const int dp = 2, tp = 2;
    loom_plan plan = plan_of(dp, tp, 2);
    const loom_gpt_config *c = &plan.model;
    int64_t C = c->channels, Vp = c->padded_vocab_size, T = c->max_seq_len;
    int64_t block = 12 * C * C / tp + 7 * C / tp + 6 * C;
    for (int r = 0; r < 2; r++) {
        const loom_plan_stage *st = &plan.stages[r];
        int64_t layers = st->end_layer - st->first_layer;
        int64_t front = r == 0 ? Vp / tp * C + T * C : Vp / tp * C, back = r == 0 ? 0 : 2 * C;
        int64_t floats = layers * block + front + back, bytes = 4 * floats;
        int64_t range = (floats + dp - 1) / dp;
        CHECK(floats - back >= (dp - 1) * range, "rank %d: the final LayerNorm in the last range",
              r);
        int64_t held = 4 * (front + back);
        int64_t held_ring = 4 * ((front < range ? front : range) + back);
        loom_rank_memory z0 = memory_of(&plan, 0, r);
        CHECK(z0.weights == bytes, "rank %d: weights %lld, expected %lld", r, (long long)z0.weights,
              (long long)bytes);
        loom_rank_memory z2 = memory_of(&plan, 2, r);
        CHECK(z2.grads == bytes / dp, "rank %d ZeRO-2: grads %lld, expected %lld", r,
              (long long)z2.grads, (long long)(bytes / dp));
        CHECK(z2.scratch - z0.scratch == held + held_ring + 2 * 4 * block,
              "rank %d ZeRO-2: buffers %lld, expected %lld + %lld + 2 x %lld", r,
              (long long)(z2.scratch - z0.scratch), (long long)held, (long long)held_ring,
              (long long)(4 * block));
        plan.zero3_prefetch = 1;
        loom_rank_memory z3 = memory_of(&plan, 3, r);
        CHECK(z3.weights == bytes / dp && z3.gathered == held + 2 * 4 * block,
              "rank %d ZeRO-3: weights %lld gathered %lld, expected %lld and %lld", r,
              (long long)z3.weights, (long long)z3.gathered, (long long)(bytes / dp),
              (long long)(held + 2 * 4 * block));
    }
    loom_plan_free(&plan);
}

/* Backward split into B and W (zb-h1): every block holds its gradient buffer from its B to its W,
 * so ZeRO-2 pools a buffer per block and one ring receive, not two. */
static void test_zero_split_backward(void) {
    loom_gpt_config model;
    loom_gpt_preset("gpt2", &model);
    loom_plan plan;
    loom_status st = loom_plan_uniform(&plan, &model, 2, 1, 2, 1, 8, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_OK, "1f1b plan: %s", loom_last_error());
    int64_t fused = memory_of(&plan, 2, 0).scratch - memory_of(&plan, 0, 0).scratch;
    loom_plan_free(&plan);
    st = loom_plan_uniform(&plan, &model, 2, 1, 2, 1, 8, LOOM_SCHEDULE_ZB_H1, 0, NULL);
    CHECK(st == LOOM_OK, "zb-h1 plan: %s", loom_last_error());
    int64_t layers = plan.stages[0].end_layer - plan.stages[0].first_layer;
    int64_t block = 4 * (12 * (int64_t)model.channels * model.channels + 13 * model.channels);
    int64_t split = memory_of(&plan, 2, 0).scratch - memory_of(&plan, 0, 0).scratch;
    CHECK(
        split - fused == (layers + 1 - 2) * block,
        "zb-h1 ZeRO-2: %lld more bytes of buffers than 1f1b, expected (%lld blocks + 1 - 2) x %lld",
        (long long)(split - fused), (long long)layers, (long long)block);
    loom_plan_free(&plan);
}

/* One data-parallel rank: nothing to shard, whatever the plan's stage. */
static void test_zero_without_dp(void) {
    loom_plan plan = plan_of(1, 1, 1);
    loom_rank_memory z0 = memory_of(&plan, 0, 0);
    plan.zero3_prefetch = 1;
    loom_rank_memory z3 = memory_of(&plan, 3, 0);
    CHECK(z0.total == z3.total, "dp 1: ZeRO-3 %lld, ZeRO-0 %lld", (long long)z3.total,
          (long long)z0.total);
    loom_plan_free(&plan);
}

/* Selective recomputation keeps every activation but the attention's softmax (B, NH/tp, T, T)
 * per layer: the 5as/h term of Korthikanti et al.'s sbh(34 + 5as/h), here in fp32 and without
 * dropout; one layer's softmax stays as the recomputation's scratch. */
static void test_selective(void) {
    for (int tp = 1; tp <= 2; tp++) {
        loom_plan plan = plan_of(1, tp, 2);
        const loom_gpt_config *c = &plan.model;
        const int T = 64;
        for (int r = 0; r < 2; r++) {
            loom_rank_memory none = memory_of(&plan, 0, r);
            plan.stages[r].recompute = LOOM_RECOMPUTE_SELECTIVE;
            loom_rank_memory selective = memory_of(&plan, 0, r);
            plan.stages[r].recompute = LOOM_RECOMPUTE_NONE;
            int64_t layers = plan.stages[r].end_layer - plan.stages[r].first_layer;
            int64_t softmax = (int64_t)plan.micro_batch * (c->num_heads / tp) * T * T * 4;
            int64_t expected = none.in_flight * (layers - 1) * softmax;
            CHECK(none.activations - selective.activations == expected,
                  "tp %d rank %d: selective saves %lld bytes, expected %d in flight x %lld "
                  "layers' softmax %lld = %lld",
                  tp, r, (long long)(none.activations - selective.activations), none.in_flight,
                  (long long)(layers - 1), (long long)softmax, (long long)expected);
            CHECK(none.weights == selective.weights && none.scratch == selective.scratch,
                  "selective changes only activations");
        }
        loom_plan_free(&plan);
    }
}

/* Sequence parallelism keeps the regions outside the GEMMs on each TP rank's 1/t of the rows:
 * per layer the six (N, C) buffers there (ln1, attproj, residual2, ln2, fcproj, residual3) and
 * the four (N) LayerNorm statistics, and the stage's input (N, C); the GEMMs' own buffers
 * (12 C / t per token) and the softmax stay. A middle stage of pp 3, tp 2: the saving per
 * activation set is (1 - 1/t) (layers (6 N C + 4 N) + N C), floats in fp32 (each buffer rounded
 * to 16 floats: a tolerance of 16 floats per buffer). */
static void test_sequence_parallel(void) {
    const int tp = 2;
    loom_plan plan = plan_of(1, tp, 3);
    const loom_gpt_config *c = &plan.model;
    int64_t N = 64, C = c->channels; /* micro-batch 1 of 64 tokens */
    loom_rank_memory whole = memory_of(&plan, 0, 1);
    plan.sequence_parallel = 1;
    loom_rank_memory sp = memory_of(&plan, 0, 1);
    int64_t layers = plan.stages[1].end_layer - plan.stages[1].first_layer;
    double saved = (double)(whole.activations - sp.activations) / whole.in_flight / 4;
    double expected = (1.0 - 1.0 / tp) * (double)(layers * (6 * N * C + 4 * N) + N * C);
    CHECK_CLOSE(saved, expected, 0, 16.0 * (double)(10 * layers + 1),
                "sequence parallel: floats saved per activation set");
    CHECK(whole.weights == sp.weights, "sequence parallelism keeps the weights");
    loom_plan_free(&plan);
}

int main(void) {
    test_zero_stages_one_stage();
    test_sequence_parallel();
    test_selective();
    test_zero_stages_tp_pp();
    test_zero_split_backward();
    test_zero_without_dp();
    return check_finish();
}
