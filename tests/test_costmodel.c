/*
 * test_costmodel.c — the planner's cost model (loom/costmodel.h) against hand computation on an
 * idealised cluster: memory per rank equals the model's cost facts for the schedule's peak of
 * micro-batches (with one wte on ZB-V's rank 0, ZeRO-1's sharded moments); with perfect GEMMs
 * and free memory traffic and links, one process's step is m micro-batches of (F + 2F) at the
 * peak; a data-parallel sync is hidden behind the last backward up to its length and shows
 * beyond; tensor-parallel groups that cross nodes pay the inter-node link; the pipeline part is
 * the simulator's; islands' outer syncs cost their ring on the island link; and bad input is
 * refused by name.
 */
#include "check.h"
#include "loom/compress.h"
#include "loom/planner.h"
#include "loom/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A cluster with perfect GEMMs (efficiency 1), (nearly) free memory traffic and links. */
static loom_cluster ideal_cluster(int devices_per_node, int max_nodes) {
    loom_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "ideal");
    c.nodes = 1, c.max_nodes = max_nodes, c.devices_per_node = devices_per_node;
    c.memory_bytes = (int64_t)1 << 40;
    c.peak_flops[LOOM_PRECISION_FP32] = 1e12;
    c.memory_bandwidth = 1e30;
    c.gemm[0] = (loom_gemm_point){1.0, 1.0};
    c.gemm_points = 1;
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) c.links[l] = (loom_link){1e30, 0.0, 0.0};
    return c;
}

static loom_plan plan_of(int dp, int tp, int pp, int micro, int global,
                         loom_schedule_kind schedule) {
    loom_gpt_config model;
    loom_gpt_preset("gpt2", &model);
    loom_plan plan;
    loom_status st = loom_plan_uniform(&plan, &model, dp, tp, pp, micro, global, schedule, 0, NULL);
    CHECK(st == LOOM_OK, "plan dp %d tp %d pp %d: %s", dp, tp, pp, loom_last_error());
    return plan;
}

/* Memory: one stage per rank is the cost facts' total for the schedule's peak. */
static void test_memory(void) {
    loom_plan plan = plan_of(1, 1, 2, 2, 8, LOOM_SCHEDULE_1F1B);
    for (int r = 0; r < 2; r++) {
        loom_rank_memory mem;
        CHECK(loom_plan_rank_memory(&plan, r, 64, &mem) == LOOM_OK, "rank memory: %s",
              loom_last_error());
        const loom_plan_stage *s = &plan.stages[r];
        loom_gpt_stage_spec spec = {1,
                                    s->first_layer,
                                    s->end_layer,
                                    s->embedding,
                                    s->head,
                                    2,
                                    64,
                                    2 - r /* 1F1B: p - i in flight */,
                                    0,
                                    0,
                                    0};
        loom_gpt_stage_cost c;
        CHECK(loom_gpt_cost_stage(&plan.model, &spec, &c) == LOOM_OK, "cost facts");
        CHECK(mem.in_flight == 2 - r, "rank %d: %d in flight, expected %d", r, mem.in_flight,
              2 - r);
        CHECK(mem.total == c.total_bytes, "rank %d: %lld bytes, the cost facts say %lld", r,
              (long long)mem.total, (long long)c.total_bytes);
    }
    /* ZeRO-1 over dp 4 keeps a quarter of the moments, and the ring's receive buffers */
    loom_plan dp4 = plan_of(4, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    loom_rank_memory full, sharded;
    loom_plan_rank_memory(&dp4, 0, 64, &full);
    dp4.zero = 1;
    loom_plan_rank_memory(&dp4, 0, 64, &sharded);
    CHECK(sharded.optimizer * 4 == full.optimizer &&
              sharded.total == full.total - full.optimizer + full.optimizer / 4 + full.grads,
          "ZeRO-1: optimizer %lld of %lld", (long long)sharded.optimizer,
          (long long)full.optimizer);
    /* ZB-V's rank 0 holds the first and the last stage: wte once */
    loom_plan zbv = plan_of(1, 1, 2, 2, 8, LOOM_SCHEDULE_ZB_V);
    loom_rank_memory r0;
    loom_plan_rank_memory(&zbv, 0, 64, &r0);
    int64_t blocks = 0;
    for (int s = 0; s < zbv.num_stages; s++) {
        if (zbv.stages[s].rank != 0) continue;
        loom_gpt_stage_spec spec = {1,
                                    zbv.stages[s].first_layer,
                                    zbv.stages[s].end_layer,
                                    zbv.stages[s].embedding,
                                    zbv.stages[s].head,
                                    2,
                                    64,
                                    1,
                                    0,
                                    0,
                                    0};
        loom_gpt_stage_cost c;
        loom_gpt_cost_stage(&zbv.model, &spec, &c);
        blocks += c.param_bytes;
    }
    int64_t wte = (int64_t)zbv.model.padded_vocab_size * zbv.model.channels * 4;
    CHECK(r0.weights == blocks - wte, "zb-v rank 0: weights %lld, expected %lld (one wte)",
          (long long)r0.weights, (long long)(blocks - wte));
    loom_plan_free(&plan), loom_plan_free(&dp4), loom_plan_free(&zbv);
}

/* One process: m micro-batches of forward F and backward 2F at the peak, nothing else. */
static void test_single_process(void) {
    loom_cluster cl = ideal_cluster(8, 1);
    loom_plan plan = plan_of(1, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    loom_prediction pr;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    loom_gpt_stage_spec spec = {1, 0, 12, 1, 1, 2, 64, 1, 0, 0, 0};
    loom_gpt_stage_cost c;
    loom_gpt_cost_stage(&plan.model, &spec, &c);
    double f = (double)c.flops_fwd / 1e12, expect = 4 * 3 * f;
    CHECK_CLOSE(pr.step_s, expect, 1e-9, 1e-9, "one process: step = m (F + 2F)");
    CHECK(pr.tokens_per_s > 0 && fabs(pr.tokens_per_s - 8.0 * 64 / pr.step_s) < 1e-6, "tokens/s %g",
          pr.tokens_per_s);
    CHECK(pr.bubble < 1e-9 && pr.dp_bytes == 0 && pr.tp_bytes == 0 && pr.pp_bytes == 0,
          "one process: no bubble, no traffic");
    /* a measured AdamW rate: the update takes the parameters over it */
    cl.optimizer_params_per_s = 1e6;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict");
    CHECK_CLOSE(pr.optimizer_s, (double)c.param_bytes / 4 / 1e6, 1e-12, 0, "AdamW at 1e6 params/s");
    CHECK_CLOSE(pr.step_s, expect + (double)c.param_bytes / 4 / 1e6, 1e-9, 1e-9,
                "one process with AdamW's time");
    loom_plan_free(&plan);
}

/* Recomputation on one process (ideal cluster, F the forward's seconds, m = 4 micro-batches):
 * as needed, every backward follows its own forward, so nothing is rerun (m (F + 2F)); always,
 * every backward reruns the forward (m (F + F + 2F)). Two stages with 1F1B as needed: the last
 * stage's backwards follow their forwards, the first stage's do not. */
static void test_recompute(void) {
    loom_cluster cl = ideal_cluster(8, 1);
    loom_plan plan = plan_of(1, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    loom_gpt_stage_spec spec = {1, 0, 12, 1, 1, 2, 64, 1, 0, 0, 0};
    loom_gpt_stage_cost c;
    loom_gpt_cost_stage(&plan.model, &spec, &c);
    double f = (double)c.flops_fwd / 1e12;
    const int modes[3] = {LOOM_RECOMPUTE_NONE, LOOM_RECOMPUTE_AS_NEEDED, LOOM_RECOMPUTE_ALWAYS};
    const double expect[3] = {4 * 3 * f, 4 * 3 * f, 4 * 4 * f};
    for (int i = 0; i < 3; i++) {
        plan.stages[0].recompute = modes[i];
        loom_prediction pr;
        CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
              loom_last_error());
        CHECK(fabs(pr.step_s - expect[i]) <= 1e-9 * expect[i],
              "one process, recompute mode %d: %g s, expected %g s", modes[i], pr.step_s,
              expect[i]);
    }
    loom_plan_free(&plan);
    double step[2];
    for (int i = 0; i < 2; i++) {
        plan = plan_of(1, 1, 2, 2, 16, LOOM_SCHEDULE_1F1B);
        for (int s = 0; s < plan.num_stages; s++) plan.stages[s].recompute = modes[1 + i];
        loom_prediction pr;
        CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK,
              "predict pp 2: %s", loom_last_error());
        step[i] = pr.step_s;
        /* the last stage's backward: without its rerun as needed, with it always */
        double b = pr.stage[1].backward_s, fw = pr.stage[1].forward_s;
        CHECK(i == 0 ? b < 2.5 * fw : b > 2.5 * fw, "pp 2 %s: last stage B %g s, F %g s",
              i ? "always" : "as needed", b, fw);
        loom_plan_free(&plan);
    }
    CHECK(step[1] > step[0], "pp 2: always %g s, as needed %g s", step[1], step[0]);
}

/* The weight-gradient GEMMs accumulate into the fp32 gradients (beta 1), so each micro-batch's
 * W reads and writes them: with perfect GEMMs at 1e12 FLOP/s and memory at 1e10 B/s, W is its
 * FLOPs, plus one activation slot read, plus twice the gradients a GEMM writes — pp 2 of gpt2:
 * stage 0's without wte and wpe (the embedding adds into its rows), stage 1's with wte (the
 * tied LM head). */
static void test_gradient_accumulation(void) {
    loom_cluster cl = ideal_cluster(8, 1);
    cl.memory_bandwidth = 1e10;
    loom_plan plan = plan_of(1, 1, 2, 2, 8, LOOM_SCHEDULE_1F1B);
    loom_prediction pr;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    double wte = (double)plan.model.padded_vocab_size * plan.model.channels * 4;
    double wpe = (double)plan.model.max_seq_len * plan.model.channels * 4;
    for (int s = 0; s < 2; s++) {
        const loom_plan_stage *st = &plan.stages[s];
        loom_gpt_stage_spec spec = {
            1, st->first_layer, st->end_layer, st->embedding, st->head, 2, 64, 1, 0, 0, 0};
        loom_gpt_stage_cost c;
        CHECK(loom_gpt_cost_stage(&plan.model, &spec, &c) == LOOM_OK, "cost: %s",
              loom_last_error());
        double grads = (double)c.param_bytes - (s == 0 ? wte + wpe : 0);
        double expect =
            (double)c.flops_bwd_weight / 1e12 + (double)c.act_slot_bytes / 1e10 + 2 * grads / 1e10;
        CHECK(fabs(pr.stage[s].backward_weight_s - expect) <= 1e-9 * expect,
              "stage %d's W: %g s, expected %g s", s, pr.stage[s].backward_weight_s, expect);
    }
    loom_plan_free(&plan);
}

/* dp 2: an allreduce of G gradient bytes over a link of bandwidth b takes 2 (1/2) G / b; the
 * last backward (2F) hides that much of it. */
static void test_dp_sync(void) {
    loom_plan plan = plan_of(2, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    loom_gpt_stage_spec spec = {1, 0, 12, 1, 1, 2, 64, 1, 0, 0, 0};
    loom_gpt_stage_cost c;
    loom_gpt_cost_stage(&plan.model, &spec, &c);
    double f = (double)c.flops_fwd / 1e12, grads = (double)c.grad_bytes;
    for (int slow = 0; slow < 2; slow++) {
        loom_cluster cl = ideal_cluster(1, 2); /* the replicas on two nodes */
        /* fast: the sync fits inside the last backward; slow: it takes 10 backwards */
        double sync = slow ? 10 * 2 * f : 0.5 * 2 * f;
        cl.links[LOOM_LINK_INTER_NODE].bandwidth = grads / sync;
        loom_prediction pr;
        CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
              loom_last_error());
        double expect = 2 * 3 * f + (slow ? sync - 2 * f : 0);
        CHECK_CLOSE(pr.step_s, expect, 1e-9, 1e-9, slow ? "dp 2, slow link" : "dp 2, fast link");
        CHECK(pr.dp_bytes == (int64_t)grads * 2, "dp bytes %lld, expected %lld",
              (long long)pr.dp_bytes, (long long)grads * 2);
        /* the sync after the backward (no overlap): all of it shows */
        plan.overlap_grad_reduce = 0;
        CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
              loom_last_error());
        CHECK_CLOSE(pr.step_s, 2 * 3 * f + sync, 1e-9, 1e-9, "dp 2, sync after the backward");
        plan.overlap_grad_reduce = 1;
    }
    loom_plan_free(&plan);
}

/* PowerSGD's wire, by hand: per block the weight matrices (Q, K and V, each C x C, attention
 * projection C x C, MLP C x 4C and 4C x C, as (rows, cols) = (out, in)) each compress when
 * r (rows + cols) < rows cols / 2, else go as fp32; wte (Vp x C) and wpe (T x C) likewise;
 * every 1-D tensor as fp32. */
static double powersgd_wire(const loom_gpt_config *m, int r, double *state) {
    double C = m->channels, V = m->padded_vocab_size, T = m->max_seq_len, L = m->num_layers;
    /* qkvw as its Q, K and V: three C x C matrices a layer */
    double mats[6][3] = {{C, C, 3 * L}, {C, C, L}, {4 * C, C, L},
                         {C, 4 * C, L}, {V, C, 1}, {T, C, 1}};
    double wire = 0, vectors = L * (2 * C + 2 * C + 3 * C + C + 4 * C + C) + 2 * C;
    *state = 0;
    for (int i = 0; i < 6; i++) {
        double rows = mats[i][0], cols = mats[i][1], n = rows * cols;
        if (r * (rows + cols) < 0.5 * n) {
            wire += 4 * r * (rows + cols) * mats[i][2];
            *state += 2 * 4 * (n + cols * r) * mats[i][2]; /* residual and Q, two copies */
        } else {
            wire += 4 * n * mats[i][2];
        }
    }
    return wire + 4 * vectors;
}

/* Compression in the cost model: PowerSGD's bytes and state by hand; on a slow DP link it
 * shortens the step, on a free one it only adds its codec; the search takes it only when
 * allowed and only where it pays; low-rank pipeline sends shrink to r (n + m) values. */
static loom_plan_compressor compressor_of(loom_compress_method method, int rank) {
    loom_plan_compressor c;
    loom_plan_compressor_init(&c);
    c.method = method;
    c.rank = rank;
    return c;
}

/* gpt2 at micro 2, global 8, 1F1B on dp x pp with the given compressors (NULL: none). */
static loom_plan compressed_plan(const loom_gpt_config *model, int dp, int pp,
                                 const loom_plan_compressor *dpc, const loom_plan_compressor *ppc) {
    loom_plan_request r = {.dp = dp,
                           .tp = 1,
                           .pp = pp,
                           .micro_batch = 2,
                           .global_batch = 8,
                           .schedule = "1f1b",
                           .dp_compression = dpc,
                           .pp_compression = ppc};
    loom_plan plan;
    CHECK(loom_plan_from_request(&plan, model, &r, 0) == LOOM_OK, "plan dp %d pp %d: %s", dp, pp,
          loom_last_error());
    return plan;
}

static void test_compression(void) {
    loom_gpt_config model;
    loom_gpt_preset("gpt2", &model);
    loom_plan_compressor psgd = compressor_of(LOOM_COMPRESS_POWERSGD, 4);
    loom_plan plan = compressed_plan(&model, 2, 1, &psgd, NULL);
    loom_plan plain = plan_of(2, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    double state, wire = powersgd_wire(&plan.model, 4, &state);
    loom_rank_memory mem;
    loom_plan_rank_memory(&plan, 0, 64, &mem);
    CHECK_CLOSE((double)mem.compressor, state, 1e-12, 0, "PowerSGD state bytes");
    double step[2][2];
    for (int slow = 0; slow < 2; slow++) {
        loom_cluster cl = ideal_cluster(1, 2);
        cl.links[LOOM_LINK_INTER_NODE].bandwidth = slow ? 1e8 : 1e30;
        cl.compressor_bytes_per_s[LOOM_COMPRESS_POWERSGD] = 1e10;
        loom_prediction pr;
        for (int c = 0; c < 2; c++) {
            CHECK(loom_plan_predict(c ? &plan : &plain, &cl, LOOM_PRECISION_FP32, 64, &pr) ==
                      LOOM_OK,
                  "predict: %s", loom_last_error());
            step[slow][c] = pr.step_s;
            if (c) {
                CHECK_CLOSE((double)pr.dp_bytes, wire * 2, 1e-9, 2, "PowerSGD dp bytes");
            }
        }
    }
    CHECK(step[1][1] < 0.5 * step[1][0], "slow link: PowerSGD %g s, none %g s", step[1][1],
          step[1][0]);
    CHECK(step[0][1] > step[0][0], "free link: PowerSGD %g s (its codec), none %g s", step[0][1],
          step[0][0]);
    /* the search: allowed on the slow link it compresses; not allowed, or on the free link, not */
    for (int k = 0; k < 3; k++) {
        loom_cluster cl = ideal_cluster(1, 2);
        cl.links[LOOM_LINK_INTER_NODE].bandwidth = k == 2 ? 1e30 : 1e8;
        cl.compressor_bytes_per_s[LOOM_COMPRESS_POWERSGD] = 1e10;
        loom_search_request req = {.devices = 2,
                                   .global_batch = 8,
                                   .seq_len = 64,
                                   .precision = LOOM_PRECISION_FP32,
                                   .keep = 1,
                                   .allow_compression = k ? LOOM_ALLOW_DP_COMPRESSION : 0};
        loom_plan_candidate best;
        int found, tried, fitting;
        CHECK(loom_plan_search(&plan.model, &cl, &req, &best, &found, &tried, &fitting, NULL) ==
                  LOOM_OK,
              "search: %s", loom_last_error());
        int compressed = best.plan.dp_compression.method != LOOM_COMPRESS_NONE;
        CHECK(compressed == (k == 1), "search %d: compression %s (dp %d, pp %d)", k,
              loom_compress_method_name(best.plan.dp_compression.method), best.plan.dp,
              best.plan.pp);
        loom_plan_free(&best.plan);
    }
    loom_plan_free(&plan);
    loom_plan_free(&plain);
    /* low-rank pipeline gradients: every backward message is 4 r (n + m) bytes */
    loom_plan_compressor lowrank = compressor_of(LOOM_COMPRESS_LOWRANK, 8);
    plan = compressed_plan(&model, 1, 2, NULL, &lowrank);
    loom_cluster cl = ideal_cluster(1, 2);
    loom_prediction pr;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict");
    double n = 2 * 64, m = model.channels, wte = (double)model.padded_vocab_size * m * 4;
    double expect = 4 * (n * m * 4 + 8 * (n + m) * 4) + 2 * wte; /* 4 micro-batches, tied sum */
    CHECK_CLOSE((double)pr.pp_bytes, expect, 1e-12, 0, "low-rank pp bytes");
    loom_plan_free(&plan);
}

/* tp 2 on one node of 2 devices uses the intra-node link, on nodes of 1 device the inter-node
 * one: a slower inter-node link makes the step longer. */
/* The pipeline compressor's policies, pp 2 1F1B, 4 micro-batches of 2 x 64 on a slow link: "all"
 * packs all 4 backward sends of the last stage; "epilogue" only its cool-down send (its last
 * forward is micro-batch 3's, so the one after it); "slack" packs exactly the sends whose slack
 * is below the saving, so the step equals "all"'s (a packed send only arrives sooner) while its
 * bytes lie between the two. */
static void test_pp_policies(void) {
    loom_gpt_config model;
    loom_gpt_preset("gpt2", &model);
    loom_cluster cl = ideal_cluster(1, 2);
    cl.links[LOOM_LINK_INTER_NODE].bandwidth = 1e8;
    cl.compressor_bytes_per_s[LOOM_COMPRESS_LOWRANK] = 1e10;
    double n = 2 * 64, c = model.channels, wte = (double)model.padded_vocab_size * c * 4;
    double message = n * c * 4, wire = 4 * 8 * (n + c);
    const char *policies[4] = {"none", "all", "epilogue", "slack"};
    double step[4], bytes[4];
    for (int i = 0; i < 4; i++) {
        loom_plan_compressor lowrank =
            compressor_of(i ? LOOM_COMPRESS_LOWRANK : LOOM_COMPRESS_NONE, i ? 8 : 0);
        lowrank.policy = i ? (loom_pp_policy)(i - 1) : LOOM_PP_POLICY_ALL;
        loom_plan plan = compressed_plan(&model, 1, 2, NULL, &lowrank);
        loom_prediction pr;
        CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK,
              "predict %s: %s", policies[i], loom_last_error());
        step[i] = pr.step_s, bytes[i] = (double)pr.pp_bytes - 2 * wte - 4 * message;
        loom_plan_free(&plan);
    }
    CHECK_CLOSE(bytes[0], 4 * message, 1e-12, 0, "none: 4 plain gradient sends");
    CHECK_CLOSE(bytes[1], 4 * wire, 1e-12, 0, "all: 4 packed sends");
    CHECK_CLOSE(bytes[2], 3 * message + wire, 1e-12, 0, "epilogue: the cool-down send packed");
    CHECK(step[1] <= step[2] && step[2] < step[0], "all %g s <= epilogue %g s < none %g s", step[1],
          step[2], step[0]);
    CHECK(fabs(step[3] - step[1]) <= 1e-9 * step[1], "slack %g s, all %g s", step[3], step[1]);
    CHECK(bytes[3] >= bytes[1] - 1 && bytes[3] <= bytes[0] + 1, "slack bytes %g in [%g, %g]",
          bytes[3], bytes[1], bytes[0]);
}

/* Compression where it shortens the step, per stage and per link: 2 nodes of 3 devices, slow
 * between them, dp 2 x pp 3 puts pipeline rank 1's DP pair across the nodes (ranks 2 and 3)
 * and the boundary between stages 1 and 2 across them too. For every plan the search keeps,
 * each listed DP rank and pipeline link must make the step shorter (dropping it is slower), and
 * each unlisted one must not (adding it is not faster), by the cost model's own prediction. */
static int listed_in(const loom_plan_compressor *c, int i) {
    if (c->method == LOOM_COMPRESS_NONE) return 0;
    if (c->num_stages == 0) return 1;
    for (int k = 0; k < c->num_stages; k++)
        if (c->stages[k] == i) return 1;
    return 0;
}

static double step_with(loom_plan *plan, loom_plan_compressor *c, int count, int flip,
                        const loom_cluster *cl) {
    loom_plan_compressor saved = *c;
    int list[LOOM_PREDICT_MAX_STAGES], n = 0;
    for (int i = 0; i < count; i++)
        if (listed_in(c, i) != (i == flip)) list[n++] = i;
    c->stages = list, c->num_stages = n;
    if (n == 0) c->method = LOOM_COMPRESS_NONE;
    loom_prediction pr;
    double step =
        loom_plan_predict(plan, cl, LOOM_PRECISION_FP32, 16, &pr) == LOOM_OK ? pr.step_s : -1;
    if (step < 0) fprintf(stderr, "step_with: %s\n", loom_last_error());
    *c = saved;
    return step;
}

static void test_search_per_stage(void) {
    loom_cluster cl = ideal_cluster(3, 2);
    cl.links[LOOM_LINK_INTRA_NODE] = (loom_link){1e11, 1e-6, 0.0};
    cl.links[LOOM_LINK_INTER_NODE] = (loom_link){1e8, 1e-5, 0.0};
    cl.compressor_bytes_per_s[LOOM_COMPRESS_POWERSGD] = 1e10;
    cl.compressor_bytes_per_s[LOOM_COMPRESS_LOWRANK] = 1e10;
    cl.memory_bandwidth = 1e11;
    loom_gpt_config model;
    loom_gpt_preset("tiny", &model);
    model.num_layers = 6;
    loom_search_request req = {.devices = 6,
                               .global_batch = 12,
                               .seq_len = 16,
                               .precision = LOOM_PRECISION_FP32,
                               .keep = 8,
                               .allow_compression =
                                   LOOM_ALLOW_DP_COMPRESSION | LOOM_ALLOW_PP_COMPRESSION};
    loom_plan_candidate best[8];
    int found = 0, tried = 0, fitting = 0, partial = 0, compressing = 0;
    CHECK(loom_plan_search(&model, &cl, &req, best, &found, &tried, &fitting, NULL) == LOOM_OK,
          "search: %s", loom_last_error());
    for (int i = 0; i < found; i++) {
        loom_plan *p = &best[i].plan;
        double step = best[i].prediction.step_s;
        loom_plan_compressor *cs[2] = {&p->dp_compression, &p->pp_compression};
        int counts[2] = {p->pp, p->num_stages - 1};
        for (int w = 0; w < 2; w++) {
            if (cs[w]->method == LOOM_COMPRESS_NONE) continue;
            compressing++;
            partial += cs[w]->num_stages > 0;
            for (int k = 0; k < counts[w]; k++) {
                double t = step_with(p, cs[w], counts[w], k, &cl);
                int on = listed_in(cs[w], k);
                CHECK(on ? t > step * (1 + 1e-9) : t >= step * (1 - 1e-9),
                      "plan %d (dp %d pp %d): %s %s %d: step %g s, flipped %g s", i, p->dp, p->pp,
                      w ? "pp link" : "dp rank", on ? "listed" : "unlisted", k, step, t);
            }
        }
    }
    CHECK(compressing > 0 && partial > 0,
          "the search compressed in %d plans, %d of them on some stages only", compressing,
          partial);
    for (int i = 0; i < found; i++) loom_plan_free(&best[i].plan);
}

static void test_tp_placement(void) {
    loom_plan plan = plan_of(1, 2, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    double step[2];
    for (int nodes = 0; nodes < 2; nodes++) {
        loom_cluster cl = ideal_cluster(nodes ? 1 : 2, 2);
        cl.links[LOOM_LINK_INTER_NODE] = (loom_link){1e9, 1e-5, 0.0};
        loom_prediction pr;
        CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
              loom_last_error());
        step[nodes] = pr.step_s;
        CHECK(pr.tp_bytes > 0, "tp 2 sends bytes");
    }
    CHECK(step[1] > step[0] * 1.01, "tp across nodes %g s, inside a node %g s", step[1], step[0]);
    loom_plan_free(&plan);
}

/* Megatron's scatter-gather of pipeline messages: tp 2 x pp 2 on nodes of 2 devices (TP inside
 * a node, the pipeline across nodes), one micro-batch, so the step's pipeline is one chain:
 * F0, the activation across, F1, B1, the gradient back, B0. Without sequence parallelism each
 * TP rank sends half the message (L = (message / 2) / inter-node bandwidth) and its receiver
 * all-gathers it over the node (g = (message / 2) / intra-node bandwidth): pipeline = stages'
 * compute + 2 (L + g); each rank's pipeline bytes are the halves. With sequence parallelism the
 * message is already each rank's own rows: 2 L, no gather. */
static void test_scattered_messages(void) {
    loom_cluster cl = ideal_cluster(2, 2);
    cl.links[LOOM_LINK_INTER_NODE] = (loom_link){1e8, 0.0, 0.0};
    cl.links[LOOM_LINK_INTRA_NODE] = (loom_link){1e9, 0.0, 0.0};
    for (int sp = 0; sp < 2; sp++) {
        loom_plan plan = plan_of(1, 2, 2, 2, 2, LOOM_SCHEDULE_1F1B);
        plan.sequence_parallel = sp;
        loom_prediction pr;
        CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK,
              "predict sp %d: %s", sp, loom_last_error());
        double message = 2.0 * 64 * plan.model.channels * 4; /* B T C fp32, whole */
        double L = message / 2 / 1e8, g = sp ? 0 : message / 2 / 1e9;
        double compute = pr.stage[0].forward_s + pr.stage[1].forward_s + pr.stage[0].backward_s +
                         pr.stage[1].backward_s;
        CHECK_CLOSE(pr.pipeline_s, compute + 2 * (L + g), 1e-12, 1e-15,
                    sp ? "sequence parallel: each rank's rows across" : "scattered, gathered");
        /* the tied embedding's sum: each TP rank's half of wte, both ends of 2 pairs */
        double wte = (double)plan.model.padded_vocab_size * plan.model.channels * 4 / 2;
        CHECK_CLOSE((double)pr.pp_bytes - 4 * wte, 2 * (message / 2) * 2, 1e-12, 0,
                    "pipeline bytes: 2 messages of half each, 2 TP ranks");
        if (!sp) { /* the TP group's allreduces (each rank sends its buffers' bytes at tp 2),
                    * plus each receive's gather: half the message from each of the 2 ranks */
            double allreduces = 0;
            for (int st = 0; st < plan.num_stages; st++) {
                loom_gpt_stage_cost c;
                CHECK(loom_plan_stage_cost(&plan, st, 64, &c) == LOOM_OK, "stage cost");
                allreduces += (double)(c.tp_bytes_fwd + c.tp_bytes_bwd + c.tp_bytes_recompute);
            }
            CHECK_CLOSE((double)pr.tp_bytes, allreduces * 2 + 2 * (message / 2) * 2, 1e-12, 0,
                        "tp bytes: the allreduces and the 2 receives' gathers");
        }
        loom_plan_free(&plan);
    }
}

/* The pipeline part is the simulator's, and schedules with a smaller bubble predict less. */
static void test_pipeline(void) {
    loom_cluster cl = ideal_cluster(8, 1);
    double step[3];
    const loom_schedule_kind schedules[3] = {LOOM_SCHEDULE_1F1B, LOOM_SCHEDULE_ZB_H1,
                                             LOOM_SCHEDULE_ZB_V};
    for (int i = 0; i < 3; i++) {
        loom_plan plan = plan_of(1, 1, 2, 2, 16, schedules[i]);
        loom_prediction pr;
        CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "%s: %s",
              loom_schedule_kind_name(schedules[i]), loom_last_error());
        step[i] = pr.step_s;
        CHECK(pr.bubble > 0 && pr.bubble < 0.5 && pr.pp_bytes > 0, "%s: bubble %g",
              loom_schedule_kind_name(schedules[i]), pr.bubble);
        loom_plan_free(&plan);
    }
    CHECK(step[1] < step[0] && step[2] < step[0], "1f1b %g s, zb-h1 %g s, zb-v %g s", step[0],
          step[1], step[2]);
}

static void test_refused(void) {
    loom_cluster cl = ideal_cluster(2, 1);
    loom_plan plan = plan_of(2, 2, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    loom_prediction pr;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "needs dp x tp x pp = 4 devices"),
          "too few devices: %s", loom_last_error());
    loom_cluster big = ideal_cluster(8, 1);
    CHECK(loom_plan_predict(&plan, &big, LOOM_PRECISION_BF16, 64, &pr) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "no bf16 peak"),
          "no bf16: %s", loom_last_error());
    loom_plan_free(&plan);
}

/* The search: its best is no slower than any layout predicted by hand, its list is sorted, and a
 * device too small for every layout is refused with the shortfall. */
static void test_search(void) {
    loom_cluster cl = ideal_cluster(4, 1);
    cl.links[LOOM_LINK_INTRA_NODE] = (loom_link){1e10, 1e-5, 0.0};
    loom_gpt_config model;
    loom_gpt_preset("gpt2", &model);
    loom_search_request req = {.devices = 4,
                               .global_batch = 16,
                               .seq_len = 64,
                               .precision = LOOM_PRECISION_FP32,
                               .keep = 5};
    loom_plan_candidate best[5];
    int found = 0, tried = 0, fitting = 0;
    loom_status st = loom_plan_search(&model, &cl, &req, best, &found, &tried, &fitting, NULL);
    CHECK(st == LOOM_OK && found == 5 && tried >= fitting && fitting >= 5, "search: %s (%d of %d)",
          loom_last_error(), found, tried);
    for (int i = 1; i < found; i++) {
        CHECK(best[i].prediction.step_s >= best[i - 1].prediction.step_s, "sorted at %d", i);
    }
    static const struct {
        int dp, tp, pp, micro;
        loom_schedule_kind schedule;
    } layouts[] = {{4, 1, 1, 1, LOOM_SCHEDULE_1F1B}, {4, 1, 1, 4, LOOM_SCHEDULE_1F1B},
                   {2, 2, 1, 2, LOOM_SCHEDULE_1F1B}, {1, 1, 4, 1, LOOM_SCHEDULE_1F1B},
                   {2, 1, 2, 2, LOOM_SCHEDULE_ZB_V}, {1, 2, 2, 1, LOOM_SCHEDULE_INTERLEAVED}};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0] && found > 0; i++) {
        loom_plan plan;
        if (loom_plan_uniform(&plan, &model, layouts[i].dp, layouts[i].tp, layouts[i].pp,
                              layouts[i].micro, 16, layouts[i].schedule, 0, NULL) != LOOM_OK)
            continue;
        for (int zero1 = 0; zero1 < 2; zero1++) {
            loom_prediction pr;
            plan.zero = zero1;
            if (loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK) {
                CHECK(best[0].prediction.step_s <= pr.step_s,
                      "search's best %g s slower than dp %d tp %d pp %d %s: %g s",
                      best[0].prediction.step_s, layouts[i].dp, layouts[i].tp, layouts[i].pp,
                      loom_schedule_kind_name(layouts[i].schedule), pr.step_s);
            }
        }
        loom_plan_free(&plan);
    }
    /* the compute bound is never above the predicted step, and pruning with it keeps the same
     * best plans as a search that keeps every plan (and so never prunes) */
    static loom_plan_candidate all[4096];
    int all_found = 0, all_tried = 0, all_fitting = 0, pruned = -1, all_pruned = -1;
    loom_search_request every = req;
    every.keep = 4096;
    st = loom_plan_search(&model, &cl, &every, all, &all_found, &all_tried, &all_fitting,
                          &all_pruned);
    CHECK(st == LOOM_OK && all_pruned == 0 && all_found == all_fitting && all_found < 4096,
          "search keeping every plan: %s (%d found, %d pruned)", loom_last_error(), all_found,
          all_pruned);
    int below = 0;
    for (int i = 0; i < all_found; i++) {
        double bound, mean;
        CHECK(loom_plan_step_bound(&all[i].plan, &cl, LOOM_PRECISION_FP32, 64, &bound, &mean) ==
                      LOOM_OK &&
                  mean <= bound * (1 + 1e-12) && bound <= all[i].prediction.step_s * (1 + 1e-12),
              "plan %d: bound %g s above its step %g s", i, bound, all[i].prediction.step_s);
        below += bound > 0;
    }
    CHECK(below == all_found, "bounds above zero: %d of %d", below, all_found);
    loom_plan_candidate again[5];
    int again_found = 0;
    st = loom_plan_search(&model, &cl, &req, again, &again_found, &tried, &fitting, &pruned);
    CHECK(st == LOOM_OK && again_found == 5 && pruned > 0, "pruned search: %d pruned", pruned);
    for (int i = 0; i < again_found && i < all_found; i++) {
        CHECK(again[i].prediction.step_s == all[i].prediction.step_s,
              "pruned search's plan %d: %g s, keeping every plan: %g s", i,
              again[i].prediction.step_s, all[i].prediction.step_s);
        loom_plan_free(&again[i].plan);
    }
    for (int i = 0; i < all_found; i++) loom_plan_free(&all[i].plan);
    for (int i = 0; i < found; i++) loom_plan_free(&best[i].plan);
    cl.memory_bytes = (int64_t)1 << 20;
    st = loom_plan_search(&model, &cl, &req, best, &found, &tried, &fitting, NULL);
    CHECK(st == LOOM_ERR_INPUT && found == 0 && strstr(loom_last_error(), "GiB short per rank"),
          "nothing fits: %s", loom_last_error());
}

/* Selective recomputation on one process (ideal cluster): every backward reruns the attention
 * core, QK^T and x V over the whole T x T (2 x 2 B T T C FLOPs per layer): m (F + 2F + S). */
static void test_selective_time(void) {
    loom_cluster cl = ideal_cluster(8, 1);
    loom_plan plan = plan_of(1, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    loom_gpt_stage_spec spec = {1, 0, 12, 1, 1, 2, 64, 1, 0, 0, 0};
    loom_gpt_stage_cost c;
    loom_gpt_cost_stage(&plan.model, &spec, &c);
    double f = (double)c.flops_fwd / 1e12;
    double B = 2, T = 64, C = plan.model.channels, L = plan.model.num_layers;
    double attention = L * 2 * (2 * B * T * T * C) / 1e12;
    plan.stages[0].recompute = LOOM_RECOMPUTE_SELECTIVE;
    loom_prediction pr;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    CHECK_CLOSE(pr.step_s, 4 * (3 * f + attention), 1e-9, 1e-12,
                "one process, selective: m (F + 2F + attention core)");
    loom_plan_free(&plan);
}

/* A fused attention kernel ("attention": "fused"): with free memory traffic the step gains one
 * QK^T per micro-batch's backward (half the forward's attention core); with a finite bandwidth
 * the forward sheds exactly the softmax's write and read (its bytes twice over the bandwidth). */
static void test_fused_attention(void) {
    loom_plan plan = plan_of(1, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    loom_gpt_stage_spec spec = {1, 0, 12, 1, 1, 2, 64, 1, 0, 0, 0};
    loom_gpt_stage_cost c;
    loom_gpt_cost_stage(&plan.model, &spec, &c);
    double f = (double)c.flops_fwd / 1e12;
    double B = 2, T = 64, C = plan.model.channels, L = plan.model.num_layers;
    double attention = L * 2 * (2 * B * T * T * C) / 1e12; /* QK^T and AV, by hand */
    double softmax = L * B * plan.model.num_heads * T * T * 4.0;
    CHECK_CLOSE((double)c.flops_attention / 1e12, attention, 1e-12, 1e-12, "attention FLOPs");
    CHECK_CLOSE((double)c.softmax_bytes, softmax, 0, 0, "softmax bytes");
    loom_cluster cl = ideal_cluster(8, 1);
    cl.fused_attention = 1;
    loom_prediction pr, mat;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    CHECK_CLOSE(pr.step_s, 4 * (3 * f + attention / 2), 1e-9, 1e-12,
                "one process, fused: m (F + 2F + QK^T again)");
    /* selective recomputation adds nothing to a fused kernel */
    plan.stages[0].recompute = LOOM_RECOMPUTE_SELECTIVE;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &mat) == LOOM_OK, "predict: %s",
          loom_last_error());
    CHECK_CLOSE(mat.step_s, pr.step_s, 1e-12, 1e-12, "fused: selective recomputation is free");
    plan.stages[0].recompute = LOOM_RECOMPUTE_NONE;
    cl.memory_bandwidth = 1e11;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    cl.fused_attention = 0;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &mat) == LOOM_OK, "predict: %s",
          loom_last_error());
    CHECK_CLOSE(mat.stage[0].forward_s - pr.stage[0].forward_s, 2 * softmax / 1e11, 1e-9, 1e-15,
                "fused: the forward sheds the softmax's traffic");
    loom_plan_free(&plan);
}

/* ZeRO-1 on dp 2 across two nodes, one stage: the reduce-scatter (g) starts with the last
 * backward and hides behind it, the updated parameters' all-gather (g, fp32; g / 2 when priced
 * in bf16, a 16-bit copy) comes after AdamW and always shows. With pp 2 and interleaving, a
 * rank's later chunk starts its share of the reduce-scatter at its own last backward, before
 * the pipeline ends: the sync left after the pipeline shrinks. */
static void test_zero1_sync(void) {
    loom_plan plan = plan_of(2, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    plan.zero = 1;
    loom_gpt_stage_spec spec = {1, 0, 12, 1, 1, 2, 64, 1, 0, 0, 0};
    loom_gpt_stage_cost c;
    loom_gpt_cost_stage(&plan.model, &spec, &c);
    double f = (double)c.flops_fwd / 1e12, grads = (double)c.grad_bytes;
    loom_cluster cl = ideal_cluster(1, 2);
    double g = 0.5 * 2 * f; /* half a backward */
    cl.links[LOOM_LINK_INTER_NODE].bandwidth = grads / 2 / g;
    loom_prediction pr;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    CHECK_CLOSE(pr.step_s, 2 * 3 * f + g, 1e-9, 1e-9, "ZeRO-1: the all-gather shows");
    CHECK_CLOSE(pr.dp_exposed_s, g, 1e-9, 1e-12, "ZeRO-1: exposed = the all-gather");
    cl.peak_flops[LOOM_PRECISION_BF16] = 1e12;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_BF16, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    CHECK_CLOSE(pr.dp_exposed_s, g / 2, 1e-9, 1e-12, "ZeRO-1 in bf16: a 16-bit all-gather");
    loom_plan_free(&plan);

    /* interleaved pp 2 x v 2 on dp 2: the rank-0 sync left after the pipeline is less than its
     * whole reduce-scatter once a later chunk's share runs early */
    /* an untied head (a Llama's), so that no tied-embedding sum joins the sync */
    loom_gpt_config model;
    loom_gpt_preset("llama-tiny", &model);
    model.num_layers = 8;
    loom_gpt_config_check_shape(&model, "test", "");
    loom_plan il;
    loom_status st =
        loom_plan_uniform(&il, &model, 2, 1, 2, 1, 16, LOOM_SCHEDULE_INTERLEAVED, 2, NULL);
    CHECK(st == LOOM_OK, "interleaved plan: %s", loom_last_error());
    if (st != LOOM_OK) return;
    il.zero = 1;
    cl = ideal_cluster(1, 4);
    cl.links[LOOM_LINK_INTRA_NODE].bandwidth = 1e30;
    double rank0 = 0;
    for (int v = 0; v < il.num_stages; v++) {
        loom_gpt_stage_cost sc;
        if (il.stages[v].rank == 0 && loom_plan_stage_cost(&il, v, 64, &sc) == LOOM_OK)
            rank0 += (double)sc.grad_bytes;
    }
    /* slow: rank 0's reduce-scatter takes rs = 1 ms, several of its backwards */
    double rs = 1e-3;
    cl.links[LOOM_LINK_INTER_NODE].bandwidth = rank0 / 2 / rs;
    CHECK(loom_plan_predict(&il, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    /* rank 0 holds virtual stages 0 and 2: its reduce-scatter and all-gather each take rs;
     * hidden only behind its last backward (the rule before chunks started their own), that
     * would expose rs - B0 + rs */
    double whole_rank = rs - pr.stage[0].backward_s + rs;
    CHECK(pr.stage[0].backward_s < rs && pr.dp_exposed_s < whole_rank - 0.1 * rs,
          "interleaved ZeRO-1: exposed %.6f s, not under the last-backward rule's %.6f s by the "
          "later chunk's early start",
          pr.dp_exposed_s, whole_rank);
    double exposed_overlapped = pr.dp_exposed_s;
    il.overlap_grad_reduce = 0;
    CHECK(loom_plan_predict(&il, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "predict: %s",
          loom_last_error());
    CHECK(exposed_overlapped < pr.dp_exposed_s - 1e-9,
          "interleaved ZeRO-1: overlapped %.6f s exposed, not less than without overlap %.6f s",
          exposed_overlapped, pr.dp_exposed_s);
    loom_plan_free(&il);
}

/* ZeRO-2 and ZeRO-3 on dp 2 across two nodes, compute free (peak 1e30): the step is the DP
 * traffic. G bytes of gradients (= parameters, fp32, from the shapes), a reduce-scatter or an
 * all-gather of them over the link of bandwidth b takes g = G / 2b. ZeRO-2 with m = 2: a
 * reduce-scatter per micro-batch, then ZeRO-1's all-gather: 3g. ZeRO-3 per micro-batch gathers
 * before the forward and before the backward, each pass then takes g + g/u with prefetch (u
 * units: 12 blocks, embedding, head) and g without; traffic 1.5 m times ZeRO-1's. */
static void test_zero_time(void) {
    loom_plan plan = plan_of(2, 1, 1, 2, 8, LOOM_SCHEDULE_1F1B);
    const loom_gpt_config *m = &plan.model;
    double C = m->channels, Vp = m->padded_vocab_size, T = m->max_seq_len, L = m->num_layers;
    double G = 4 * (Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C), b = 1e9;
    double g = G / 2 / b, u = L + 2;
    loom_cluster cl = ideal_cluster(1, 2);
    cl.peak_flops[LOOM_PRECISION_FP32] = 1e30;
    cl.links[LOOM_LINK_INTER_NODE] = (loom_link){b, 0.0, 0.0};
    loom_prediction pr, z1;
    plan.zero = 1;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &z1) == LOOM_OK, "ZeRO-1: %s",
          loom_last_error());
    CHECK_CLOSE(z1.dp_bytes, 2 * G, 1e-9, 2, "ZeRO-1 bytes: 2 ranks x G");
    plan.zero = 2;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "ZeRO-2: %s",
          loom_last_error());
    CHECK_CLOSE(pr.step_s, 3 * g, 1e-6, 0, "ZeRO-2, m 2: two reduce-scatters and an all-gather");
    CHECK_CLOSE(pr.dp_bytes, 2 * 3 * G / 2, 1e-9, 4, "ZeRO-2 bytes");
    plan.zero = 3, plan.zero3_prefetch = 1;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "ZeRO-3: %s",
          loom_last_error());
    CHECK_CLOSE(pr.pipeline_s, 4 * (g + g / u), 1e-6, 0, "ZeRO-3 prefetch 1: 2 m (g + g/u)");
    CHECK_CLOSE(pr.dp_bytes, 1.5 * 2 * z1.dp_bytes, 1e-9, 8, "ZeRO-3 traffic: 1.5 m x ZeRO-1's");
    CHECK(pr.step_s >= pr.pipeline_s, "ZeRO-3: step %g s, pipeline %g s", pr.step_s, pr.pipeline_s);
    plan.zero3_prefetch = 0;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "ZeRO-3: %s",
          loom_last_error());
    CHECK_CLOSE(pr.pipeline_s, 4 * g, 1e-6, 0, "ZeRO-3 without prefetch: 2 m g");
    plan.zero3_gather = LOOM_ZERO3_GATHER_STEP;
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "ZeRO-3: %s",
          loom_last_error());
    CHECK_CLOSE(pr.step_s, 3 * g, 1e-6, 0, "ZeRO-3 gathered per step: a gather, 2 reduce-scatters");
    CHECK_CLOSE(pr.dp_bytes, 2 * 3 * G / 2, 1e-9, 4, "ZeRO-3 per step bytes");
    loom_plan_free(&plan);
}

/* Islands' outer syncs against hand arithmetic: gpt2 on 2 islands of one rank, 2 fragments
 * (fragment 0: wte, wpe and layers 0-5; fragment 1: layers 6-11 and the final LayerNorm), the
 * island link at 1e8 bytes/s with 10 ms a ring step: a fragment's fp32 all-reduce sends its bytes
 * once per rank (2 (K - 1) / K = 1) in 2 steps; int8 twice a quarter (and the scales) in 2 steps
 * and 2 calls of 1 ms; overlap hides up to tau steps of a sync. */
static void test_islands(void) {
    loom_plan plan = plan_of(1, 1, 1, 2, 4, LOOM_SCHEDULE_1F1B);
    plan.islands.count = 2, plan.islands.inner_steps = 10, plan.islands.fragments = 2;
    const loom_gpt_config *m = &plan.model;
    double C = m->channels, L = m->num_layers;
    double layer = 12 * C * C + 13 * C;
    double f0 = 4 * ((double)m->padded_vocab_size * C + m->max_seq_len * C + L / 2 * layer);
    double f1 = 4 * (L / 2 * layer + 2 * C);
    loom_cluster cl = ideal_cluster(1, 2);
    cl.island_nodes = 1;
    cl.island_link = (loom_link){1e8, 0.01, 0.001};
    double inner = 0.05; /* an inner step, made up */
    loom_outer_cost oc;
    CHECK(loom_plan_outer_cost(&plan, &cl, inner, &oc) == LOOM_OK, "%s", loom_last_error());
    double s0 = f0 / 1e8 + 0.02 + 0.001, s1 = f1 / 1e8 + 0.02 + 0.001;
    CHECK_CLOSE(oc.sync_s, fmax(s0, s1), 1e-9, 0, "islands fp32: the largest fragment's sync");
    CHECK_CLOSE(oc.total_s, s0 + s1, 1e-9, 0, "islands fp32: both fragments");
    CHECK_CLOSE(oc.exposed_s, (s0 + s1) / 10, 1e-9, 1e-12, "islands fp32: a step's share");
    CHECK(llabs(oc.bytes - (int64_t)((f0 + f1) * 2 / 10)) <= 2, "islands fp32: %lld bytes a step",
          (long long)oc.bytes);
    plan.islands.overlap_steps = 3; /* 0.15 s of inner steps hide each sync's first 0.15 s */
    CHECK(loom_plan_outer_cost(&plan, &cl, inner, &oc) == LOOM_OK, "%s", loom_last_error());
    CHECK_CLOSE(oc.exposed_s, (fmax(0, s0 - 0.15) + fmax(0, s1 - 0.15)) / 10, 1e-9, 1e-12,
                "islands fp32, 3 steps behind");
    plan.islands.overlap_steps = 0, plan.islands.compression = LOOM_COMPRESS_INT8;
    CHECK(loom_plan_outer_cost(&plan, &cl, inner, &oc) == LOOM_OK, "%s", loom_last_error());
    double w0 = 2 * 0.5 * f0 / 4 * (1 + 4.0 / 256), w1 = 2 * 0.5 * f1 / 4 * (1 + 4.0 / 256);
    CHECK_CLOSE(oc.total_s, (w0 + w1) / 1e8 + 2 * (0.02 + 0.002), 1e-9, 0, "islands int8");
    /* top-k at 1 % (one fragment): every matrix as the runtime hands it (Q, K and V apart, each
     * 1-D tensor one row) sends 8 bytes for each of its ceil(n / 100) entries, all-gathered: the
     * other island's wire in 1 step and 1 call */
    plan.islands.fragments = 1, plan.islands.compression = LOOM_COMPRESS_TOPK;
    plan.islands.compression_fraction = 0.01;
    CHECK(loom_plan_outer_cost(&plan, &cl, inner, &oc) == LOOM_OK, "%s", loom_last_error());
    double per_layer[] = {C * C, C * C, C * C, C * C, 4 * C * C, 4 * C * C, C,
                          C,     3 * C, C,     C,     C,         4 * C,     C};
    double topk = 8 * (ceil(0.01 * m->padded_vocab_size * C) + ceil(0.01 * m->max_seq_len * C) +
                       2 * ceil(0.01 * C));
    for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++)
        topk += 8 * L * ceil(0.01 * per_layer[i]);
    CHECK_CLOSE(oc.total_s, topk / 1e8 + 0.01 + 0.001, 1e-9, 0, "islands topk 1 %%");
    /* PowerSGD rank 4 (one fragment): each matrix sends its factors, (rows + cols) x 4 fp32,
     * the 1-D tensors whole, over two all-reduces: 2 (K - 1) / K of it in 4 (K - 1) steps and 2
     * calls */
    plan.islands.compression = LOOM_COMPRESS_POWERSGD, plan.islands.compression_rank = 4;
    plan.islands.compression_fraction = 0;
    CHECK(loom_plan_outer_cost(&plan, &cl, inner, &oc) == LOOM_OK, "%s", loom_last_error());
    double V = m->padded_vocab_size, T = m->max_seq_len;
    double psgd = 4 * 4 * ((V + C) + (T + C) + L * (4 * (C + C) + 2 * (4 * C + C))) +
                  4 * (2 * C + L * (C + C + 3 * C + C + C + C + 4 * C + C));
    CHECK_CLOSE(oc.total_s, 2 * 0.5 * psgd / 1e8 + 4 * 0.01 + 2 * 0.001, 1e-9, 0,
                "islands powersgd r4");
    plan.islands.compression_rank = 0;
    loom_plan_free(&plan);
    /* bf16 inside islands of dp 2 x pp 2: each pipeline rank's stage (rank 0: the embeddings and
     * 6 blocks; rank 1: 6 blocks, the tied head's copy of wte and the final LayerNorm), each
     * replica its half, half the bytes on the wire, a reduce-scatter and an all-gather: the
     * slower rank's sync (rank 0, with wpe) is the job's; every rank of both islands sends */
    plan = plan_of(2, 1, 2, 2, 8, LOOM_SCHEDULE_1F1B);
    plan.islands.count = 2, plan.islands.inner_steps = 10;
    plan.islands.compression = LOOM_COMPRESS_BF16;
    CHECK(loom_plan_outer_cost(&plan, &cl, inner, &oc) == LOOM_OK, "%s", loom_last_error());
    double r0 = 4 * (V * C + T * C + 6 * layer) / 2, r1 = 4 * (V * C + 6 * layer + 2 * C) / 2;
    double b0 = 2 * 0.5 * r0 / 2, b1 = 2 * 0.5 * r1 / 2;
    CHECK_CLOSE(oc.sync_s, b0 / 1e8 + 2 * 0.01 + 2 * 0.001, 1e-9, 0, "islands bf16, dp 2 x pp 2");
    CHECK_CLOSE(oc.exposed_s, (b0 / 1e8 + 2 * 0.01 + 2 * 0.001) / 10, 1e-9, 1e-12,
                "islands bf16, dp 2 x pp 2: a step's share");
    CHECK(llabs(oc.bytes - (int64_t)((b0 + b1) * 2 * 2 / 10)) <= 4,
          "islands bf16, dp 2 x pp 2: %lld bytes a step, expected %.0f", (long long)oc.bytes,
          (b0 + b1) * 2 * 2 / 10);
    loom_plan_free(&plan);
    plan = plan_of(1, 1, 1, 2, 4, LOOM_SCHEDULE_1F1B);
    plan.islands.count = 2, plan.islands.inner_steps = 10, plan.islands.fragments = 2;
    plan.islands.compression = LOOM_COMPRESS_INT8;
    /* the step carries it: predict's step is the inner step plus the exposed share */
    loom_prediction pr, inner_pr;
    loom_plan one = plan; /* one island's plan: its share of the global batch */
    one.islands.count = 0, one.global_batch = plan.global_batch / 2;
    CHECK(loom_plan_predict(&one, &cl, LOOM_PRECISION_FP32, 64, &inner_pr) == LOOM_OK, "%s",
          loom_last_error());
    CHECK(loom_plan_predict(&plan, &cl, LOOM_PRECISION_FP32, 64, &pr) == LOOM_OK, "%s",
          loom_last_error());
    CHECK_CLOSE(pr.step_s, inner_pr.step_s + pr.outer.exposed_s, 1e-12, 1e-15,
                "islands: the step with its outer share");
    CHECK(pr.outer.exposed_s > 0, "islands: the outer share is priced");
    loom_plan_free(&plan);
}

/* The planner's H, fragments and overlap against a brute-force search over every (H, F, tau)
 * with the syncs' times by hand (test_islands' setting: fp32 over 1e8 bytes/s, 2 islands): the
 * smallest H at which some F's largest fragment syncs within tau <= min(H - 1, H / F) inner
 * steps, then the smallest tau, then the fewest fragments. Below that H (a bound too small), H is
 * the bound and the exposed time the least of every F's. */
static void test_choose_islands(void) {
    loom_plan plan = plan_of(1, 1, 1, 2, 4, LOOM_SCHEDULE_1F1B);
    plan.islands.count = 2;
    const loom_gpt_config *m = &plan.model;
    int L = m->num_layers;
    double C = m->channels, layer = 12 * C * C + 13 * C;
    loom_cluster cl = ideal_cluster(1, 2);
    cl.island_nodes = 1;
    cl.island_link = (loom_link){1e8, 0.01, 0.001};
    double inner = 0.05;
    int want_h = 0, want_f = 0, want_tau = 0;
    for (int H = 1; H <= 1000 && !want_h; H++) {
        for (int F = 1; F <= L && F <= H; F++) {
            double worst = 0;
            for (int f = 0; f < F; f++) {
                double bytes = 0;
                for (int l = 0; l < L; l++) bytes += l * F / L == f ? 4 * layer : 0;
                if (f == 0) bytes += 4 * ((double)m->padded_vocab_size * C + m->max_seq_len * C);
                if (f == F - 1) bytes += 4 * 2 * C;
                worst = fmax(worst, bytes / 1e8 + 0.02 + 0.001);
            }
            int cap = H / F < H - 1 ? H / F : H - 1, need = (int)ceil(worst / inner);
            if (need <= cap && (!want_h || need < want_tau))
                want_h = H, want_f = F, want_tau = need;
        }
    }
    loom_islands_choice got;
    CHECK(loom_plan_choose_islands(&plan, &cl, inner, 1000, &got) == LOOM_OK, "%s",
          loom_last_error());
    CHECK(got.hidden && got.inner_steps == want_h && got.fragments == want_f &&
              got.overlap_steps == want_tau,
          "choose islands: H %d, F %d, tau %d (hidden %d), brute force H %d, F %d, tau %d",
          got.inner_steps, got.fragments, got.overlap_steps, got.hidden, want_h, want_f, want_tau);
    CHECK(plan.islands.inner_steps == want_h && plan.islands.fragments == want_f &&
              plan.islands.overlap_steps == want_tau,
          "choose islands: the plan holds the choice");
    /* a bound below it: H is the bound, the least exposed time of every F there */
    int bound = want_h / 2;
    CHECK(loom_plan_choose_islands(&plan, &cl, inner, bound, &got) == LOOM_OK, "%s",
          loom_last_error());
    double least = -1;
    for (int F = 1; F <= L && F <= bound; F++) {
        loom_plan p = plan;
        p.islands.inner_steps = bound, p.islands.fragments = F, p.islands.overlap_steps = 0;
        loom_outer_cost oc;
        CHECK(loom_plan_outer_cost(&p, &cl, inner, &oc) == LOOM_OK, "%s", loom_last_error());
        int cap = bound / F < bound - 1 ? bound / F : bound - 1;
        p.islands.overlap_steps = cap; /* nothing hides: as far behind as allowed */
        CHECK(loom_plan_outer_cost(&p, &cl, inner, &oc) == LOOM_OK, "%s", loom_last_error());
        if (least < 0 || oc.exposed_s < least) least = oc.exposed_s;
    }
    CHECK(!got.hidden && got.inner_steps == bound, "choose islands below: H %d hidden %d",
          got.inner_steps, got.hidden);
    CHECK_CLOSE(got.cost.exposed_s, least, 1e-12, 1e-15, "choose islands below: least exposed");
    /* PowerSGD outer gradients (rank 4 of gpt2's matrices, far fewer bytes than fp32's) hide
     * behind fewer steps */
    loom_islands_choice fp32 = got;
    CHECK(loom_plan_choose_islands(&plan, &cl, inner, bound, &fp32) == LOOM_OK, "%s",
          loom_last_error());
    plan.islands.compression = LOOM_COMPRESS_POWERSGD, plan.islands.compression_rank = 4;
    CHECK(loom_plan_choose_islands(&plan, &cl, inner, bound, &got) == LOOM_OK, "%s",
          loom_last_error());
    CHECK(got.cost.sync_s < fp32.cost.sync_s / 4 && got.cost.exposed_s <= fp32.cost.exposed_s,
          "choose islands: powersgd's sync %g s (fp32 %g s), exposed %g s (fp32 %g s)",
          got.cost.sync_s, fp32.cost.sync_s, got.cost.exposed_s, fp32.cost.exposed_s);
    loom_plan_free(&plan);
}

int main(void) {
    test_islands();
    test_choose_islands();
    test_search();
    test_selective_time();
    test_fused_attention();
    test_zero1_sync();
    test_zero_time();
    test_memory();
    test_single_process();
    test_recompute();
    test_gradient_accumulation();
    test_dp_sync();
    test_compression();
    test_pp_policies();
    test_search_per_stage();
    test_tp_placement();
    test_pipeline();
    test_scattered_messages();
    test_refused();
    return check_finish();
}
