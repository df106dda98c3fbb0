/*
 * test_cost.c — the model's cost facts against independent references: parameter bytes against
 * the layout a real model gets (loom_gpt_describe) and a closed formula; activation bytes
 * against what loom_gpt_reserve_slots really allocates, and a middle stage of GPT-2 (no
 * embedding, no head) written out by hand; forward FLOPs against a GEMM list
 * written out here, Megatron's per-iteration count and loom_gpt_flops_per_token; the
 * tensor-parallel allreduces against Megatron's rule (test_cost_tp measures them in a real
 * tp=2 run); GPT-3 175B without overflow; and refusals of bad specs.
 */
#include "check.h"
#include "loom/model.h"

#include <limits.h>
#include <string.h>

static loom_gpt_config small_config(void) {
    /* L=3 so that a pipeline has a middle stage; C/NH = 8; Vp = 384 (divisible by 1, 2, 4) */
    loom_gpt_config c = {.max_seq_len = 32,
                         .vocab_size = 257,
                         .padded_vocab_size = 0,
                         .num_layers = 3,
                         .num_heads = 4,
                         .channels = 32};
    c.padded_vocab_size = loom_gpt_pad_vocab(c.vocab_size);
    return c;
}

static loom_gpt_config gpt3_config(void) {
    loom_gpt_config c = {.max_seq_len = 2048,
                         .vocab_size = 50257,
                         .padded_vocab_size = 0,
                         .num_layers = 96,
                         .num_heads = 96,
                         .channels = 12288};
    c.padded_vocab_size = loom_gpt_pad_vocab(c.vocab_size);
    return c;
}

static loom_gpt_stage_spec stage_spec(const loom_gpt_config *c, int tp, int first, int end, int B,
                                      int T, int in_flight, int recompute) {
    return (loom_gpt_stage_spec){.tp = tp,
                                 .first_layer = first,
                                 .end_layer = end,
                                 .has_embedding = first == 0,
                                 .has_head = end == c->num_layers,
                                 .B = B,
                                 .T = T,
                                 .in_flight = in_flight,
                                 .recompute = recompute};
}

/* ---- parameters ------------------------------------------------------------------------ */

static void test_params(void) {
    loom_gpt_config c = small_config();
    int64_t C = c.channels;
    for (int tp = 1; tp <= 4; tp *= 2) {
        loom_gpt_part_cost block, embed, head;
        CHECK(loom_gpt_cost_block(&c, tp, 2, 8, &block) == LOOM_OK, "block tp %d", tp);
        CHECK(loom_gpt_cost_embedding(&c, tp, 2, 8, &embed) == LOOM_OK, "embedding tp %d", tp);
        CHECK(loom_gpt_cost_head(&c, tp, 2, 8, &head) == LOOM_OK, "head tp %d", tp);
        /* split: qkvw 3C*C, attprojw C*C, fcw 4C*C, fcprojw 4C*C, qkvb 3C, fcb 4C; replicated:
         * ln1, ln2 (2C each), attprojb, fcprojb (C each) */
        int64_t block_floats = (12 * C * C + 7 * C) / tp + 6 * C;
        CHECK(block.param_bytes == 4 * block_floats, "block params tp %d: %lld vs %lld", tp,
              (long long)block.param_bytes, (long long)(4 * block_floats));
        int64_t wte = (int64_t)c.padded_vocab_size / tp * C, wpe = (int64_t)c.max_seq_len * C;
        CHECK(embed.param_bytes == 4 * (wte + wpe), "embedding params tp %d", tp);
        CHECK(head.param_bytes == 4 * (wte + 2 * C), "head params tp %d", tp);

        /* every stage of every split against the layout a real shard gets */
        for (int first = 0; first < c.num_layers; first++) {
            for (int end = first + 1; end <= c.num_layers; end++) {
                loom_gpt_stage_spec spec = stage_spec(&c, tp, first, end, 2, 8, 1, 0);
                loom_gpt_stage_cost cost;
                CHECK(loom_gpt_cost_stage(&c, &spec, &cost) == LOOM_OK, "stage [%d,%d)", first,
                      end);
                loom_gpt model;
                loom_gpt_shard shard = {.first_layer = first,
                                        .end_layer = end,
                                        .tp_size = tp,
                                        .tp_rank = tp - 1,
                                        .tp_comm = NULL};
                CHECK(loom_gpt_describe(&model, &c, &shard) == LOOM_OK, "describe");
                CHECK(cost.param_bytes == 4 * (int64_t)model.num_params,
                      "stage [%d,%d) tp %d params %lld vs describe %zu floats", first, end, tp,
                      (long long)cost.param_bytes, model.num_params);
                /* besides its blocks: wte on the first and the last stage (lookup, tied LM
                 * head), wpe on the first, the final LayerNorm on the last */
                int has_embedding = first == 0, has_head = end == c.num_layers;
                int64_t parts = (end - first) * block.param_bytes +
                                (has_embedding || has_head ? 4 * wte : 0) +
                                (has_embedding ? 4 * wpe : 0) + (has_head ? 4 * 2 * C : 0);
                CHECK(cost.param_bytes == parts, "stage [%d,%d) params by parts: %lld vs %lld",
                      first, end, (long long)cost.param_bytes, (long long)parts);
                CHECK(cost.grad_bytes == cost.param_bytes, "grads");
                CHECK(cost.optimizer_bytes == 2 * cost.param_bytes, "AdamW m, v");
            }
        }
    }
}

/* ---- activations against the real allocation ------------------------------------------- */

/* A token that is never used: reserving activations makes no collective call, but a shard of
 * tp > 1 needs a communicator to be created. */
static char unused_comm;

static void check_allocation(const loom_gpt_config *c, int tp, int first, int end, int B, int T,
                             int slots) {
    loom_gpt *m = NULL;
    loom_gpt_shard shard = {.first_layer = first,
                            .end_layer = end,
                            .tp_size = tp,
                            .tp_rank = 0,
                            .tp_comm = tp > 1 ? (loom_comm *)(void *)&unused_comm : NULL};
    if (loom_gpt_create_shard(&m, c, loom_backend_cpu(), &shard) != LOOM_OK ||
        loom_gpt_reserve_slots(m, B, T, slots) != LOOM_OK) {
        CHECK(0, "create and reserve: %s", loom_last_error());
        loom_gpt_free(m);
        return;
    }
    loom_gpt_stage_spec spec = stage_spec(c, tp, first, end, B, T, slots, 0);
    loom_gpt_stage_cost cost;
    CHECK(loom_gpt_cost_stage(c, &spec, &cost) == LOOM_OK, "stage cost");
    int64_t token_bytes = 2 * (int64_t)B * T * (int64_t)sizeof(int32_t);
    CHECK(cost.act_slot_token_bytes == token_bytes, "token bytes");
    CHECK(cost.act_slot_bytes - token_bytes == 4 * (int64_t)m->slot_floats,
          "tp %d [%d,%d) B %d T %d: slot %lld vs allocated %lld", tp, first, end, B, T,
          (long long)(cost.act_slot_bytes - token_bytes), (long long)(4 * m->slot_floats));
    CHECK(cost.act_bytes_keep == (int64_t)m->slots * cost.act_slot_bytes, "%d slots", m->slots);
    if (slots > 1) {
        /* slots sit one after another: the distance between two is one slot */
        loom_gpt_use_slot(m, 0);
        const char *acts0 = (const char *)m->acts.encoded, *tokens0 = (const char *)m->inputs;
        loom_gpt_use_slot(m, 1);
        CHECK((const char *)m->acts.encoded - acts0 == cost.act_slot_bytes - token_bytes,
              "slot stride");
        CHECK(2 * ((const char *)m->inputs - tokens0) == token_bytes, "token stride");
    }
    /* a split reservation grows each slot by what the cost facts say */
    size_t plain = m->slot_floats;
    if (loom_gpt_reserve_slots_split(m, B, T, slots, 1) != LOOM_OK) {
        CHECK(0, "reserve split: %s", loom_last_error());
    } else {
        CHECK(cost.act_slot_split_bytes == 4 * (int64_t)(m->slot_floats - plain),
              "tp %d [%d,%d) B %d T %d: split slot grows by %lld bytes, allocated %lld", tp, first,
              end, B, T, (long long)cost.act_slot_split_bytes,
              (long long)(4 * (int64_t)(m->slot_floats - plain)));
    }
    /* backward scratch: one block from dresidual to the end of dfch2 (B,T,4C); a Llama's the
     * wider of (B,T,F) and (B,T,C) */
    int64_t F = loom_gpt_widths_of(c, 1).ffn, wide = F > c->channels ? F : c->channels;
    int64_t scratch = (const char *)m->grad_acts.dfch2 - (const char *)m->grad_acts.dresidual +
                      (int64_t)B * T * wide * (int64_t)sizeof(float);
    CHECK(cost.grad_scratch_bytes == scratch, "grad scratch %lld vs %lld",
          (long long)cost.grad_scratch_bytes, (long long)scratch);
    loom_gpt_free(m);
}

static void test_activations(void) {
    loom_gpt_config c = small_config();
    int shapes[][2] = {{2, 16}, {1, 7}, {3, 5}, {4, 32}};
    for (int tp = 1; tp <= 4; tp *= 2) {
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            int B = shapes[i][0], T = shapes[i][1];
            check_allocation(&c, tp, 0, 3, B, T, 1);
            check_allocation(&c, tp, 0, 1, B, T, 3);
            check_allocation(&c, tp, 1, 2, B, T, 2);
            check_allocation(&c, tp, 1, 3, B, T, 1);
        }
    }
    /* With B*T a multiple of 16 no buffer is rounded, and a slot is exactly the parts: every
     * stage's slot holds the embedding output (its input), the head stage's also the head's
     * buffers. */
    for (int tp = 1; tp <= 4; tp *= 2) {
        loom_gpt_part_cost block, embed, head;
        loom_gpt_cost_block(&c, tp, 2, 16, &block);
        loom_gpt_cost_embedding(&c, tp, 2, 16, &embed);
        loom_gpt_cost_head(&c, tp, 2, 16, &head);
        int64_t C = c.channels, N = 32, NH = c.num_heads;
        int64_t block_floats = N * (6 * C + 12 * C / tp + 4) + 2 * NH / tp * 16 * 16;
        CHECK(block.act_bytes == 4 * block_floats, "block acts tp %d: %lld vs %lld", tp,
              (long long)block.act_bytes, (long long)(4 * block_floats));
        CHECK(embed.act_bytes == 4 * N * C, "embedding acts");
        CHECK(head.act_bytes == 4 * N * (C + c.padded_vocab_size / tp + 6), "head acts");
        /* a split backward keeps the output gradients of the four GEMMs, fcproj and attproj
         * (N, C), fc (N, 4C/tp), qkv (N, 3C/tp), and of the embedding (N, C) */
        CHECK(block.act_bytes_split == 4 * N * (2 * C + 7 * C / tp), "block split acts");
        CHECK(embed.act_bytes_split == 4 * N * C && head.act_bytes_split == 0, "split acts");
        for (int first = 0; first < c.num_layers; first++) {
            for (int end = first + 1; end <= c.num_layers; end++) {
                loom_gpt_stage_spec spec = stage_spec(&c, tp, first, end, 2, 16, 1, 0);
                loom_gpt_stage_cost cost;
                loom_gpt_cost_stage(&c, &spec, &cost);
                CHECK(cost.act_slot_bytes - cost.act_slot_token_bytes ==
                          (end - first) * block.act_bytes + embed.act_bytes +
                              (spec.has_head ? head.act_bytes : 0),
                      "slot = parts, stage [%d,%d) tp %d", first, end, tp);
                CHECK(cost.act_slot_split_bytes ==
                          (end - first) * block.act_bytes_split +
                              (spec.has_embedding ? embed.act_bytes_split : 0),
                      "split slot = parts, stage [%d,%d) tp %d", first, end, tp);
            }
        }
    }
    /* recomputation: one slot, plus every in-flight micro-batch's (B,T,C) input */
    loom_gpt_stage_spec spec = stage_spec(&c, 2, 0, 2, 3, 5, 4, 1);
    loom_gpt_stage_cost keep, recompute;
    CHECK(loom_gpt_cost_stage(&c, &spec, &recompute) == LOOM_OK, "recompute");
    spec.recompute = 0;
    CHECK(loom_gpt_cost_stage(&c, &spec, &keep) == LOOM_OK, "keep");
    int64_t input = 3 * 5 * (int64_t)c.channels * 4;
    CHECK(recompute.act_bytes == recompute.act_slot_bytes + 4 * input, "recompute acts");
    CHECK(keep.act_bytes == 4 * keep.act_slot_bytes, "kept acts");
    CHECK(recompute.act_bytes_keep == keep.act_bytes &&
              keep.act_bytes_recompute == recompute.act_bytes,
          "both figures either way");
    CHECK(recompute.flops_recompute == recompute.flops_fwd && keep.flops_recompute == 0,
          "recompute FLOPs");
    CHECK(recompute.tp_bytes_recompute == recompute.tp_bytes_fwd && keep.tp_bytes_recompute == 0,
          "recompute TP bytes");
    CHECK(keep.total_bytes == keep.param_bytes * 4 + keep.act_bytes + keep.grad_scratch_bytes,
          "total");
}

/* ---- selective recomputation ------------------------------------------------------------ */

/* A selective slot keeps one layer's softmax (backward's scratch) instead of every layer's: the
 * real allocation (plain and split) equals the cost facts, and is smaller than a keeping slot by
 * exactly (layers - 1) x (B, NH/tp, T, T) (T*T a multiple of 16: nothing rounded); the FLOPs
 * rerun are the attention core's, counted here from its two batched GEMMs per head. */
static void check_selective(const loom_gpt_config *c, int tp, int first, int end, int B, int T,
                            int slots) {
    loom_gpt *m = NULL;
    loom_gpt_shard shard = {.first_layer = first,
                            .end_layer = end,
                            .tp_size = tp,
                            .tp_rank = 0,
                            .tp_comm = tp > 1 ? (loom_comm *)(void *)&unused_comm : NULL};
    loom_gpt_stage_spec spec = stage_spec(c, tp, first, end, B, T, slots, 0);
    loom_gpt_stage_cost keep, sel;
    CHECK(loom_gpt_cost_stage(c, &spec, &keep) == LOOM_OK, "keep cost");
    spec.selective = 1;
    CHECK(loom_gpt_cost_stage(c, &spec, &sel) == LOOM_OK, "selective cost");
    for (int split = 0; split <= 1; split++) {
        loom_gpt_slots_spec want = {B, T, slots, split, 1};
        if (loom_gpt_create_shard(&m, c, loom_backend_cpu(), &shard) != LOOM_OK ||
            loom_gpt_reserve_slots_spec(m, &want) != LOOM_OK) {
            CHECK(0, "create and reserve selective: %s", loom_last_error());
            loom_gpt_free(m);
            return;
        }
        int64_t want_bytes =
            sel.act_slot_bytes - sel.act_slot_token_bytes + (split ? sel.act_slot_split_bytes : 0);
        CHECK(want_bytes == 4 * (int64_t)m->slot_floats && m->selective,
              "selective tp %d [%d,%d) B %d T %d split %d: cost %lld bytes, allocated %lld", tp,
              first, end, B, T, split, (long long)want_bytes, (long long)(4 * m->slot_floats));
        loom_gpt_free(m);
        m = NULL;
    }
    int64_t layers = end - first, NHl = c->num_heads / tp;
    int64_t att = (int64_t)B * NHl * T * T * 4;
    CHECK(keep.act_slot_bytes - sel.act_slot_bytes == (layers - 1) * att,
          "selective tp %d [%d,%d): %lld bytes less per slot, expected (L-1) x att = %lld", tp,
          first, end, (long long)(keep.act_slot_bytes - sel.act_slot_bytes),
          (long long)((layers - 1) * att));
    CHECK(sel.act_bytes == slots * sel.act_slot_bytes && sel.act_bytes_keep == sel.act_bytes,
          "selective keeps every in-flight slot");
    CHECK(sel.act_slot_split_bytes == keep.act_slot_split_bytes, "W keeps as much");
    /* per layer, NH/tp heads of hs = C/NH: QK^T (T x hs x T) and AV (T x T x hs), 2mnk each */
    int64_t hs = c->channels / c->num_heads;
    int64_t core = layers * B * NHl * (2 * T * hs * T + 2 * T * T * hs);
    CHECK(sel.flops_selective == core && keep.flops_selective == 0,
          "selective FLOPs tp %d [%d,%d): %lld, expected %lld", tp, first, end,
          (long long)sel.flops_selective, (long long)core);
    CHECK(sel.flops_fwd == keep.flops_fwd && sel.flops_bwd == keep.flops_bwd &&
              sel.flops_recompute == 0 && sel.tp_bytes_recompute == 0,
          "selective changes nothing else");
    /* full recomputation wins over selective: one whole slot rerun, no softmax rerun */
    spec.recompute = 1;
    loom_gpt_stage_cost full;
    CHECK(loom_gpt_cost_stage(c, &spec, &full) == LOOM_OK && full.flops_selective == 0 &&
              full.act_slot_bytes == keep.act_slot_bytes,
          "recompute and selective: full recomputation");
}

static void test_selective(void) {
    loom_gpt_config c = small_config();
    for (int tp = 1; tp <= 4; tp *= 2) {
        check_selective(&c, tp, 0, 3, 2, 16, 1);
        check_selective(&c, tp, 0, 1, 2, 16, 3);
        check_selective(&c, tp, 1, 3, 1, 8, 2);
        check_selective(&c, tp, 2, 3, 3, 4, 2);
    }
    /* a selective caller is served by a keeping reservation; a keeping caller is not by a
     * selective one */
    loom_gpt *m = NULL;
    loom_gpt_shard shard = {.first_layer = 0, .end_layer = 3, .tp_size = 1};
    loom_gpt_slots_spec keep = {2, 16, 1, 0, 0}, sel = {2, 16, 1, 0, 1};
    if (loom_gpt_create_shard(&m, &c, loom_backend_cpu(), &shard) == LOOM_OK) {
        CHECK(loom_gpt_reserve_slots_spec(m, &keep) == LOOM_OK && !m->selective, "keep");
        CHECK(loom_gpt_reserve_slots_spec(m, &sel) == LOOM_OK && !m->selective,
              "a keeping reservation serves a selective caller");
        loom_gpt_free(m);
    }
    if (loom_gpt_create_shard(&m, &c, loom_backend_cpu(), &shard) == LOOM_OK) {
        size_t small;
        CHECK(loom_gpt_reserve_slots_spec(m, &sel) == LOOM_OK && m->selective, "selective");
        small = m->slot_floats;
        CHECK(loom_gpt_reserve_slots_spec(m, &keep) == LOOM_OK && !m->selective &&
                  m->slot_floats > small,
              "a keeping caller gets every layer's softmax back");
        loom_gpt_free(m);
    }
}

/* ---- sequence parallelism ------------------------------------------------------------------ */

/* Under SP the residual stream's buffers hold N/tp rows: per block the six (N, C) ones (ln1,
 * attproj, residual2, ln2, fcproj, residual3) and four (N) statistics; the stage input (and its
 * split-backward gradient) and lnf's statistics too. The GEMMs' buffers and the softmax stay. The
 * real allocation equals the cost facts; pipeline sends shrink by tp; traffic (test_cost_tp
 * counts it for real): per block 4 gathers/scatters of (N, C) forward, 6 backward, one allreduce
 * of the 4C LayerNorm gradients; the embedding one each way, the head one each way and its loss
 * allreduces; 5/4 of TP's bytes on the wire. */
static void check_sp(const loom_gpt_config *c, int tp, int first, int end, int B, int T) {
    loom_gpt_stage_spec spec = stage_spec(c, tp, first, end, B, T, 2, 0);
    loom_gpt_stage_cost plain, sp;
    CHECK(loom_gpt_cost_stage(c, &spec, &plain) == LOOM_OK, "TP cost");
    spec.sequence_parallel = 1;
    CHECK(loom_gpt_cost_stage(c, &spec, &sp) == LOOM_OK, "SP cost: %s", loom_last_error());
    for (int split = 0; split <= 1; split++) {
        loom_gpt *m = NULL;
        loom_gpt_shard shard = {.first_layer = first,
                                .end_layer = end,
                                .tp_size = tp,
                                .tp_rank = tp - 1,
                                .tp_comm = (loom_comm *)(void *)&unused_comm,
                                .sequence_parallel = 1};
        if (loom_gpt_create_shard(&m, c, loom_backend_cpu(), &shard) != LOOM_OK ||
            loom_gpt_reserve_slots_split(m, B, T, 2, split) != LOOM_OK) {
            CHECK(0, "SP create and reserve: %s", loom_last_error());
            loom_gpt_free(m);
            return;
        }
        int64_t want =
            sp.act_slot_bytes - sp.act_slot_token_bytes + (split ? sp.act_slot_split_bytes : 0);
        CHECK(want == 4 * (int64_t)m->slot_floats,
              "SP tp %d [%d,%d) B %d T %d split %d: cost %lld bytes, allocated %lld", tp, first,
              end, B, T, split, (long long)want, (long long)(4 * m->slot_floats));
        int64_t scratch = (const char *)m->grad_acts.dnorm - (const char *)m->grad_acts.dresidual +
                          4 * (int64_t)c->channels * (int64_t)sizeof(float);
        CHECK(sp.grad_scratch_bytes == scratch, "SP grad scratch %lld vs %lld",
              (long long)sp.grad_scratch_bytes, (long long)scratch);
        loom_gpt_free(m);
    }
    int64_t N = (int64_t)B * T, C = c->channels, L = end - first, R = N / tp;
    int emb = first == 0, head = end == c->num_layers;
    /* nothing rounded when N/tp is a multiple of 16 */
    int64_t saved = L * (N - R) * (6 * C + 4) + (N - R) * C + (head ? 2 * (N - R) : 0);
    CHECK(plain.act_slot_bytes - sp.act_slot_bytes == 4 * saved,
          "SP tp %d [%d,%d): slot smaller by %lld bytes, expected %lld", tp, first, end,
          (long long)(plain.act_slot_bytes - sp.act_slot_bytes), (long long)(4 * saved));
    CHECK(sp.pp_act_bytes * tp == plain.pp_act_bytes &&
              sp.pp_grad_bytes * tp == plain.pp_grad_bytes,
          "SP: pipeline sends shrink by tp");
    int64_t btc = 4 * N * C;
    CHECK(sp.tp_shards_fwd == 4 * L + emb + head && sp.tp_shards_bwd == 6 * L + emb + head &&
              sp.tp_shard_bytes_fwd == sp.tp_shards_fwd * btc &&
              sp.tp_shard_bytes_bwd == sp.tp_shards_bwd * btc,
          "SP tp %d [%d,%d): gathers and scatters", tp, first, end);
    CHECK(sp.tp_allreduces_fwd == 2 * head && sp.tp_bytes_fwd == 4 * 3 * N * head &&
              sp.tp_allreduces_bwd == L + head && sp.tp_bytes_bwd == 4 * (4 * C * L + 2 * C * head),
          "SP tp %d [%d,%d): what stays an allreduce", tp, first, end);
    /* on the wire (ring volumes): a block's SP traffic is 5/4 of TP's */
    double sp_wire = (double)(sp.tp_shard_bytes_fwd + sp.tp_shard_bytes_bwd) * (tp - 1) / tp;
    double tp_wire = 2.0 * (double)(plain.tp_bytes_fwd + plain.tp_bytes_bwd) * (tp - 1) / tp;
    if (!emb && !head) CHECK_CLOSE(sp_wire, 1.25 * tp_wire, 1e-12, 0, "SP's bytes 5/4 of TP's");
    CHECK(sp.flops_fwd == plain.flops_fwd && sp.flops_bwd == plain.flops_bwd, "SP: same FLOPs");
}

static void test_sequence_parallel(void) {
    loom_gpt_config c = small_config();
    for (int tp = 2; tp <= 4; tp *= 2) {
        check_sp(&c, tp, 0, 3, 2, 32);
        check_sp(&c, tp, 0, 1, 4, 16);
        check_sp(&c, tp, 1, 2, 2, 32);
        check_sp(&c, tp, 1, 3, 4, 16);
    }
    /* recomputation reruns forward's gathers and scatters too */
    loom_gpt_stage_spec spec = stage_spec(&c, 2, 0, 3, 2, 16, 1, 1);
    spec.sequence_parallel = 1;
    loom_gpt_stage_cost cost;
    CHECK(loom_gpt_cost_stage(&c, &spec, &cost) == LOOM_OK &&
              cost.tp_shards_recompute == cost.tp_shards_fwd &&
              cost.tp_shard_bytes_recompute == cost.tp_shard_bytes_fwd,
          "SP recompute traffic");
}

/* ---- a middle pipeline stage holds only its blocks --------------------------------------- */

/* GPT-2 124M in four stages of three blocks, B 4, T 64: the middle stages' parameters and
 * activation slot, written out here from GPT-2's shapes, against a real allocation and the cost
 * facts; and what the head's buffers, which only the last stage has, take. */
static void test_middle_stage(void) {
    loom_gpt_config c;
    loom_gpt_preset("gpt2", &c);
    const int B = 4, T = 64, first = 3, end = 6;
    int64_t C = c.channels, NH = c.num_heads, Vp = c.padded_vocab_size, N = (int64_t)B * T;
    for (int tp = 1; tp <= 2; tp++) {
        /* per block: qkv (3C x C + 3C) and fc (4C x C + 4C) split by rows, attproj (C x C) and
         * fcproj (C x 4C) by columns, their biases (C each) and ln1, ln2 (2C each) whole */
        int64_t block =
            (3 * C * C + 3 * C + 4 * C * C + 4 * C) / tp + (C * C + 4 * C * C) / tp + 2 * C + 4 * C;
        int64_t params = (end - first) * block; /* no wte, wpe or lnf */
        /* per block (B*T a multiple of 16: nothing rounded): ln1, attproj, residual2, ln2,
         * fcproj, residual3 (N, C); four (N) statistics; qkv (N, 3C/tp), atty (N, C/tp), fch and
         * fch_gelu (N, 4C/tp); att (B, NH/tp, T, T); plus the stage input (N, C) */
        int64_t block_acts = 6 * N * C + 4 * N + N * (3 * C + C + 8 * C) / tp + B * NH / tp * T * T;
        int64_t slot = N * C + (end - first) * block_acts;

        loom_gpt *m = NULL;
        loom_gpt_shard shard = {.first_layer = first,
                                .end_layer = end,
                                .tp_size = tp,
                                .tp_rank = 0,
                                .tp_comm = tp > 1 ? (loom_comm *)(void *)&unused_comm : NULL};
        if (loom_gpt_create_shard(&m, &c, loom_backend_cpu(), &shard) != LOOM_OK ||
            loom_gpt_reserve_slots(m, B, T, 1) != LOOM_OK) {
            CHECK(0, "gpt2 middle stage tp %d: %s", tp, loom_last_error());
            loom_gpt_free(m);
            continue;
        }
        CHECK((int64_t)m->num_params == params,
              "gpt2 middle stage tp %d: %zu parameters, "
              "expected %lld",
              tp, m->num_params, (long long)params);
        CHECK((int64_t)m->slot_floats == slot,
              "gpt2 middle stage tp %d: slot of %zu floats, "
              "expected %lld",
              tp, m->slot_floats, (long long)slot);
        CHECK(!m->params.wte && !m->params.wpe && !m->params.lnfw && !m->acts.probs && !m->acts.lnf,
              "gpt2 middle stage tp %d: no embedding or head tensors", tp);
        loom_gpt_free(m);

        loom_gpt_stage_spec middle = stage_spec(&c, tp, first, end, B, T, 1, 0);
        loom_gpt_stage_spec last = stage_spec(&c, tp, 9, 12, B, T, 1, 0);
        loom_gpt_stage_cost mid_cost, last_cost;
        CHECK(loom_gpt_cost_stage(&c, &middle, &mid_cost) == LOOM_OK &&
                  loom_gpt_cost_stage(&c, &last, &last_cost) == LOOM_OK,
              "gpt2 stage costs");
        CHECK(mid_cost.param_bytes == 4 * params &&
                  mid_cost.act_slot_bytes == 4 * slot + mid_cost.act_slot_token_bytes,
              "gpt2 middle stage tp %d: cost facts", tp);
        /* the last stage of as many blocks also has the head: lnf (N, C), probs (N, Vp/tp), six
         * (N) statistics; and wte's Vp/tp rows and lnf's 2C parameters */
        int64_t head = N * C + N * Vp / tp + 6 * N;
        CHECK(last_cost.act_slot_bytes - mid_cost.act_slot_bytes == 4 * head,
              "gpt2 tp %d: the head's buffers only on the last stage", tp);
        CHECK(last_cost.param_bytes - mid_cost.param_bytes == 4 * (Vp / tp * C + 2 * C),
              "gpt2 tp %d: tied wte and lnf only on the last stage", tp);
        printf("GPT-2 124M, pp 4, tp %d, middle stage (3 blocks), B %d, T %d: parameters %.1f MiB "
               "(wte, wpe, lnf left out: %.1f MiB each of params, grads, m, v); activation slot "
               "%.1f MiB (the head's buffers left out: %.1f MiB per slot)\n",
               tp, B, T, 4.0 * params / 0x1p20,
               4.0 * (Vp / tp * C + c.max_seq_len * C + 2 * C) / 0x1p20, 4.0 * slot / 0x1p20,
               4.0 * head / 0x1p20);
    }
}

/* ---- FLOPs ----------------------------------------------------------------------------- */

typedef struct {
    int64_t m, n, k, count;
} gemm;

/* Every GEMM of one forward of the whole model on one TP rank, written from the model's
 * shapes: (m x k) times (k x n), `count` times. */
static int64_t forward_gemm_flops(const loom_gpt_config *c, int64_t tp, int64_t B, int64_t T) {
    int64_t C = c->channels, NH = c->num_heads, hs = C / NH, L = c->num_layers;
    int64_t Vp = c->padded_vocab_size;
    gemm list[] = {
        {B * T, 3 * C / tp, C, L},   /* ln1 @ qkvw^T, this rank's heads */
        {T, T, hs, L * B * NH / tp}, /* q @ k^T per head */
        {T, hs, T, L * B * NH / tp}, /* softmax @ v per head */
        {B * T, C, C / tp, L},       /* atty @ attprojw^T (then the TP sum) */
        {B * T, 4 * C / tp, C, L},   /* ln2 @ fcw^T */
        {B * T, C, 4 * C / tp, L},   /* gelu @ fcprojw^T */
        {B * T, Vp / tp, C, 1},      /* lnf @ wte^T, this rank's vocabulary rows */
    };
    int64_t flops = 0;
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        flops += 2 * list[i].m * list[i].n * list[i].k * list[i].count;
    }
    return flops;
}

static void test_flops(void) {
    loom_gpt_config configs[2] = {small_config(), {0}};
    loom_gpt_preset("gpt2", &configs[1]);
    for (int ci = 0; ci < 2; ci++) {
        const loom_gpt_config *c = &configs[ci];
        int L = c->num_layers, B = 2, T = ci == 0 ? 16 : 1024;
        loom_gpt_stage_cost whole1 = {0};
        for (int tp = 1; tp <= 4; tp *= 2) {
            loom_gpt_stage_spec spec = stage_spec(c, tp, 0, L, B, T, 1, 0);
            loom_gpt_stage_cost whole;
            CHECK(loom_gpt_cost_stage(c, &spec, &whole) == LOOM_OK, "whole model");
            int64_t expected = forward_gemm_flops(c, tp, B, T);
            CHECK(whole.flops_fwd == expected, "config %d tp %d: forward %lld vs GEMM list %lld",
                  ci, tp, (long long)whole.flops_fwd, (long long)expected);
            CHECK(whole.flops_bwd == 2 * whole.flops_fwd, "backward = 2 x forward");
            CHECK(whole.flops_bwd == whole.flops_bwd_input + whole.flops_bwd_weight, "B + W");
            if (tp == 1) whole1 = whole;
            /* each rank does 1/tp of every GEMM */
            CHECK(whole.flops_fwd * tp == whole1.flops_fwd, "tp %d splits FLOPs evenly", tp);

            /* a pipeline's stages add up to the whole */
            int64_t fwd = 0, bwd_input = 0, bwd_weight = 0;
            int cuts[] = {0, 1, L - 1, L};
            for (int s = 0; s < 3; s++) {
                if (cuts[s] >= cuts[s + 1]) continue;
                loom_gpt_stage_spec part = stage_spec(c, tp, cuts[s], cuts[s + 1], B, T, 1, 0);
                loom_gpt_stage_cost cost;
                CHECK(loom_gpt_cost_stage(c, &part, &cost) == LOOM_OK, "stage");
                fwd += cost.flops_fwd;
                bwd_input += cost.flops_bwd_input;
                bwd_weight += cost.flops_bwd_weight;
            }
            CHECK(fwd == whole.flops_fwd && bwd_input == whole.flops_bwd_input &&
                      bwd_weight == whole.flops_bwd_weight,
                  "stages sum to the model");
        }
        /* The weight-gradient GEMMs equal the forward's weight GEMMs: everything but attention's
         * 4*B*T*T*C per layer. */
        double attention = 4.0 * B * (double)T * T * c->channels * L;
        CHECK_CLOSE((double)whole1.flops_bwd_weight, (double)whole1.flops_fwd - attention, 0, 0,
                    "weight-gradient GEMMs");

        /* Megatron (Narayanan et al. 2021) without recomputation, per micro-batch:
         * 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) = forward + backward (tp = 1), V padded. */
        double h = c->channels, s = T, l = L, V = c->padded_vocab_size;
        double megatron = 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
        CHECK_CLOSE((double)(whole1.flops_fwd + whole1.flops_bwd), megatron, 1e-12, 0,
                    "Megatron's count");
        /* With recomputation Megatron counts 96 B s l h^2 (1 + s/(6h) + V/(16 l h)): the blocks'
         * forward once more, not the head's. loom's trainer reruns the whole stage forward, the
         * head included, so ours is that plus one head GEMM 2 B s h V. */
        loom_gpt_stage_spec spec = stage_spec(c, 1, 0, L, B, T, 1, 1);
        loom_gpt_stage_cost rec;
        CHECK(loom_gpt_cost_stage(c, &spec, &rec) == LOOM_OK, "recompute");
        double megatron_rec = 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
        CHECK_CLOSE((double)(rec.flops_fwd + rec.flops_bwd + rec.flops_recompute),
                    megatron_rec + 2.0 * B * s * h * V, 1e-12, 0, "Megatron's count, recompute");

        /* loom_gpt_flops_per_token = 6 N + 6 L C T: N the real parameters (wpe, biases and
         * LayerNorms included, padded vocabulary rows not), attention at half of the full
         * T x T (Kaplan's causal count). Ours per token, 3 x forward, is 6 x (GEMM weights:
         * 12 L C^2 + Vp C) + 12 L C T. So ours - 6LCT - 6(Vp - V)C + 6(13 L C + maxT C + 2C)
         * is that figure exactly. */
        double Cd = c->channels, tokens = (double)B * T;
        double ours = (double)(whole1.flops_fwd + whole1.flops_bwd) / tokens;
        double converted = ours - 6.0 * l * Cd * T - 6.0 * (V - c->vocab_size) * Cd +
                           6.0 * (13.0 * l * Cd + c->max_seq_len * Cd + 2.0 * Cd);
        CHECK_CLOSE(converted, loom_gpt_flops_per_token(c, T), 1e-12, 0, "6N + 6LCT");
    }
}

/* ---- tensor-parallel traffic ----------------------------------------------------------- */

/* From gpt.c (and Megatron's rule "one allreduce of B*T*C in forward and one in backward, per
 * attention and per MLP"): a block's forward sums attention-out and MLP-down, its backward the
 * input gradients of MLP-up and QKV; the embedding's forward sums the lookup; the head's
 * forward sums row max (B,T) and [sum exp, target logit] (2,B,T), its backward d(lnf).
 * test_cost_tp counts them in a real run on two ranks. */
static void test_tp_traffic(void) {
    loom_gpt_config c = small_config();
    int B = 3, T = 5;
    int64_t btc = 4LL * B * T * c.channels, bt = 4LL * B * T;
    for (int tp = 1; tp <= 4; tp *= 2) {
        int on = tp > 1;
        loom_gpt_part_cost block, embed, head;
        loom_gpt_cost_block(&c, tp, B, T, &block);
        loom_gpt_cost_embedding(&c, tp, B, T, &embed);
        loom_gpt_cost_head(&c, tp, B, T, &head);
        CHECK(block.tp_allreduces_fwd == 2 * on && block.tp_bytes_fwd == 2 * btc * on &&
                  block.tp_allreduces_bwd == 2 * on && block.tp_bytes_bwd == 2 * btc * on,
              "block tp %d", tp);
        CHECK(embed.tp_allreduces_fwd == on && embed.tp_bytes_fwd == btc * on &&
                  embed.tp_allreduces_bwd == 0 && embed.tp_bytes_bwd == 0,
              "embedding tp %d", tp);
        CHECK(head.tp_allreduces_fwd == 2 * on && head.tp_bytes_fwd == 3 * bt * on &&
                  head.tp_allreduces_bwd == on && head.tp_bytes_bwd == btc * on,
              "head tp %d", tp);
        loom_gpt_stage_spec spec = stage_spec(&c, tp, 1, 2, B, T, 1, 0);
        loom_gpt_stage_cost middle;
        loom_gpt_cost_stage(&c, &spec, &middle);
        CHECK(middle.tp_allreduces_fwd == 2 * on && middle.tp_bytes_bwd == 2 * btc * on,
              "middle stage tp %d", tp);
        CHECK(middle.pp_act_bytes == btc && middle.pp_grad_bytes == btc, "middle p2p");
        spec = stage_spec(&c, tp, 0, 3, B, T, 1, 0);
        loom_gpt_stage_cost whole;
        loom_gpt_cost_stage(&c, &spec, &whole);
        CHECK(whole.tp_allreduces_fwd == (3 * 2 + 1 + 2) * on &&
                  whole.tp_allreduces_bwd == (3 * 2 + 1) * on,
              "whole model tp %d", tp);
        CHECK(whole.tp_bytes_fwd == (7 * btc + 3 * bt) * on && whole.tp_bytes_bwd == 7 * btc * on,
              "whole model bytes tp %d", tp);
        CHECK(whole.pp_act_bytes == 0 && whole.pp_grad_bytes == 0, "no p2p on one stage");
    }
}

/* ---- GPT-3 175B ------------------------------------------------------------------------ */

static void test_gpt3(void) {
    loom_gpt_config c = gpt3_config();
    int64_t L = 96, C = 12288, V = 50257, maxT = 2048;
    /* 12 L C^2 (weights) + 13 L C (biases, LayerNorms) + V C + maxT C + 2C */
    int64_t formula = 12 * L * C * C + 13 * L * C + V * C + maxT * C + 2 * C;
    CHECK(loom_gpt_num_real_params(&c) == formula, "real params %lld vs %lld",
          (long long)loom_gpt_num_real_params(&c), (long long)formula);
    CHECK_CLOSE((double)formula, 174.6e9, 0.001, 0, "GPT-3's 175B");

    loom_gpt_stage_spec spec = stage_spec(&c, 1, 0, 96, 1, 2048, 1, 0);
    loom_gpt_stage_cost whole;
    CHECK(loom_gpt_cost_stage(&c, &spec, &whole) == LOOM_OK, "175B whole: %s", loom_last_error());
    int64_t padded = formula + (int64_t)(c.padded_vocab_size - V) * C;
    CHECK(whole.param_bytes == 4 * padded, "175B param bytes");
    CHECK(whole.flops_fwd == forward_gemm_flops(&c, 1, 1, 2048), "175B forward FLOPs");
    CHECK(whole.flops_fwd > 0 && whole.total_bytes > whole.param_bytes, "no overflow");

    /* tp = 8 divides heads and the padded vocabulary; 8 stages of 12 layers, 1F1B in flight */
    int64_t sum_params = 0, sum_fwd = 0, sum_tp = 0;
    for (int s = 0; s < 8; s++) {
        spec = stage_spec(&c, 8, 12 * s, 12 * s + 12, 1, 2048, 8 - s, 0);
        loom_gpt_stage_cost cost;
        CHECK(loom_gpt_cost_stage(&c, &spec, &cost) == LOOM_OK, "175B stage %d: %s", s,
              loom_last_error());
        sum_params += cost.param_bytes;
        sum_fwd += cost.flops_fwd;
        sum_tp += cost.tp_bytes_fwd;
        CHECK(cost.act_bytes > 0 && cost.total_bytes > cost.act_bytes, "stage %d sizes", s);
        if (s == 0) {
            printf("GPT-3 175B, tp 8, stage 0 of 8 (12 layers, 8 in flight, B 1, T 2048): "
                   "params %.2f GiB, optimizer %.2f GiB, activations %.2f GiB (recompute %.2f), "
                   "total %.2f GiB; forward %.3e FLOPs; TP forward %.1f MiB in %lld allreduces\n",
                   cost.param_bytes / 0x1p30, cost.optimizer_bytes / 0x1p30,
                   cost.act_bytes_keep / 0x1p30, cost.act_bytes_recompute / 0x1p30,
                   cost.total_bytes / 0x1p30, (double)cost.flops_fwd, cost.tp_bytes_fwd / 0x1p20,
                   (long long)cost.tp_allreduces_fwd);
        }
    }
    /* eight TP ranks of eight stages hold the model once, plus the last stage's copy of wte
     * (the tied LM head; Vp/8 rows per TP rank) */
    int64_t extra = 4 * ((int64_t)c.padded_vocab_size / 8 * C);
    int64_t replicated = 4 * (13 * L * C - 7 * L * C + maxT * C + 2 * C); /* per TP rank */
    CHECK(8 * (sum_params - extra) - 7 * replicated == whole.param_bytes,
          "stages x tp hold the model: %lld vs %lld", (long long)(8 * (sum_params - extra)),
          (long long)whole.param_bytes);
    CHECK(8 * sum_fwd == whole.flops_fwd, "stages x tp compute the model");
    printf("GPT-3 175B: %lld parameters (%lld padded); forward %.4e FLOPs per sequence of 2048, "
           "training (3x) %.4e; TP forward payload at tp 8, one rank per stage, summed over the 8 "
           "stages: %.1f MiB\n",
           (long long)formula, (long long)padded, (double)whole.flops_fwd,
           3.0 * (double)whole.flops_fwd, sum_tp / 0x1p20);

    /* too large to count in 64 bits is refused, not wrapped */
    spec = stage_spec(&c, 1, 0, 96, INT_MAX, 2048, 1, 0);
    CHECK(loom_gpt_cost_stage(&c, &spec, &whole) == LOOM_ERR_INPUT, "overflow refused");
    loom_gpt_part_cost block;
    CHECK(loom_gpt_cost_block(&c, 1, INT_MAX, 2048, &block) == LOOM_ERR_INPUT,
          "block overflow refused");
}

/* ---- refusals -------------------------------------------------------------------------- */

static void expect_refused(const loom_gpt_config *c, loom_gpt_stage_spec spec, const char *field) {
    loom_gpt_stage_cost cost;
    loom_status st = loom_gpt_cost_stage(c, &spec, &cost);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), field),
          "expected a refusal naming '%s', got status %d: %s", field, st, loom_last_error());
}

static void test_refusals(void) {
    loom_gpt_config c = small_config();
    loom_gpt_stage_spec good = stage_spec(&c, 2, 0, 2, 2, 8, 1, 0), spec;
    spec = good, spec.tp = 3;
    expect_refused(&c, spec, "tp");
    spec = good, spec.tp = 0;
    expect_refused(&c, spec, "tp");
    spec = good, spec.T = 33;
    expect_refused(&c, spec, "T");
    spec = good, spec.B = 0;
    expect_refused(&c, spec, "B");
    spec = good, spec.first_layer = 2;
    expect_refused(&c, spec, "layers");
    spec = good, spec.end_layer = 4;
    expect_refused(&c, spec, "layers");
    spec = good, spec.has_embedding = 0;
    expect_refused(&c, spec, "has_embedding");
    spec = good, spec.has_head = 1;
    expect_refused(&c, spec, "has_head");
    spec = good, spec.in_flight = 0;
    expect_refused(&c, spec, "in_flight");
    spec = good, spec.sequence_parallel = 1, spec.tp = 1;
    expect_refused(&c, spec, "sequence_parallel: expected tp > 1");
    spec = good, spec.sequence_parallel = 1, spec.B = 1, spec.T = 7;
    expect_refused(&c, spec, "--micro-batch-size x --seq-len");
    loom_gpt_config bad = c;
    bad.num_heads = 5;
    expect_refused(&bad, good, "heads");
    loom_gpt_part_cost part;
    CHECK(loom_gpt_cost_block(&c, 8, 1, 1, &part) == LOOM_ERR_INPUT, "tp 8 does not divide 4");
}

/* A model this build cannot train (d_model 25600: its MLP weight has more elements than the BLAS
 * interface's int) can still be costed, as the planner must for a trillion parameters:
 * 12 L C^2 of the blocks alone is 1.007e12 at L 128, C 25600. */
static void test_trillion(void) {
    loom_gpt_config c = {.max_seq_len = 2048,
                         .vocab_size = 50257,
                         .padded_vocab_size = 0,
                         .num_layers = 128,
                         .num_heads = 160,
                         .channels = 25600};
    loom_gpt_config trainable = c;
    CHECK(loom_gpt_config_check(&trainable, "t") == LOOM_ERR_INPUT, "too wide to train here");
    loom_gpt_stage_spec spec = stage_spec(&c, 8, 0, 16, 1, 2048, 1, 0);
    loom_gpt_stage_cost cost;
    CHECK(loom_gpt_cost_stage(&c, &spec, &cost) == LOOM_OK, "1T stage cost: %s", loom_last_error());
    int64_t C = 25600, L = 16;
    double blocks = 12.0 * (double)L * (double)C * (double)C / 8.0; /* this TP rank's share */
    CHECK(cost.param_bytes > 4.0 * blocks && cost.param_bytes < 4.0 * blocks * 1.1,
          "1T stage parameters %lld bytes, about 4 x %.4g expected", (long long)cost.param_bytes,
          blocks);
}

/* ---- the Llama family ------------------------------------------------------------------- */

/* A Llama's cost facts against its real allocation (every stage, tp 1 and 2) and against its
 * GEMMs counted by hand: QKV (C -> (NH + 2 KV) hs), attention (NH heads of hs over T x T), o
 * (C -> C), gate and up (C -> 2F), down (F -> C), the untied head (C -> Vp); parameters against
 * the model's layout. GQA's narrower k and v show in QKV only. */
static void test_llama(void) {
    loom_gpt_config c;
    loom_gpt_preset("llama-tiny", &c);
    c.num_layers = 3, c.ffn_dim = 48; /* 4 heads over 2 kv heads, C 32, F 48 (wider than C) */
    loom_gpt_config_check_shape(&c, "test", "");
    int64_t C = c.channels, NH = c.num_heads, KV = c.kv_heads, hs = C / NH, F = c.ffn_dim;
    int64_t L = c.num_layers, Vp = c.padded_vocab_size;
    for (int tp = 1; tp <= 2; tp *= 2) {
        check_allocation(&c, tp, 0, 3, 2, 16, 1);
        check_allocation(&c, tp, 0, 1, 3, 5, 2);
        check_allocation(&c, tp, 1, 3, 2, 7, 1);
        int64_t B = 2, T = 16;
        gemm list[] = {
            {B * T, (NH + 2 * KV) * hs / tp, C, L}, /* ln1 @ qkvw^T: q, k, v of this rank */
            {T, T, hs, L * B * NH / tp},            /* q @ k^T per query head */
            {T, hs, T, L * B * NH / tp},            /* softmax @ v per query head */
            {B * T, C, C / tp, L},                  /* o_proj */
            {B * T, 2 * F / tp, C, L},              /* gate and up */
            {B * T, C, F / tp, L},                  /* down_proj */
            {B * T, Vp / tp, C, 1},                 /* the untied head */
        };
        int64_t want = 0;
        for (size_t i = 0; i < sizeof list / sizeof list[0]; i++)
            want += 2 * list[i].m * list[i].n * list[i].k * list[i].count;
        loom_gpt_stage_spec spec = stage_spec(&c, tp, 0, 3, 2, 16, 1, 0);
        loom_gpt_stage_cost cost;
        CHECK(loom_gpt_cost_stage(&c, &spec, &cost) == LOOM_OK, "llama stage tp %d", tp);
        CHECK(cost.flops_fwd == want, "llama tp %d: forward %lld vs GEMM list %lld", tp,
              (long long)cost.flops_fwd, (long long)want);
        CHECK(cost.flops_bwd == 2 * cost.flops_fwd, "llama backward = 2 x forward");
        /* parameters: per block 2C (norms) + (NH + 2 KV) hs C + C^2 + 3 F C over tp (the norms
         * whole), the embedding and the head Vp C / tp each, the final norm C; no wpe, no bias */
        int64_t block = 2 * C + ((NH + 2 * KV) * hs * C + C * C + 3 * F * C) / tp;
        int64_t params = L * block + 2 * Vp * C / tp + C;
        CHECK(cost.param_bytes == 4 * params, "llama tp %d: parameters %lld vs %lld", tp,
              (long long)(cost.param_bytes / 4), (long long)params);
    }
    /* the head's weight is the last stage's own: a first stage holds wte alone */
    loom_gpt_stage_spec first = stage_spec(&c, 1, 0, 1, 2, 16, 1, 0);
    loom_gpt_stage_spec last = stage_spec(&c, 1, 1, 3, 2, 16, 1, 0);
    loom_gpt_stage_cost a, b;
    CHECK(loom_gpt_cost_stage(&c, &first, &a) == LOOM_OK &&
              loom_gpt_cost_stage(&c, &last, &b) == LOOM_OK,
          "llama stages");
    int64_t block = 2 * C + (NH + 2 * KV) * hs * C + C * C + 3 * F * C;
    CHECK(a.param_bytes == 4 * (block + Vp * C) && b.param_bytes == 4 * (2 * block + Vp * C + C),
          "llama stage parameters: %lld and %lld", (long long)a.param_bytes / 4,
          (long long)b.param_bytes / 4);
    /* 6N + 6LCT, N without the padded rows and without the input embedding (a lookup) */
    double N = (double)(L * block + (int64_t)c.vocab_size * C + C);
    CHECK_CLOSE(loom_gpt_flops_per_token(&c, 16), 6.0 * N + 6.0 * (double)(L * C * 16), 1e-12, 0,
                "llama 6N + 6LCT");
    /* tp must divide the kv heads */
    loom_gpt_stage_spec four = stage_spec(&c, 4, 0, 3, 2, 16, 1, 0);
    loom_gpt_stage_cost refused;
    CHECK(loom_gpt_cost_stage(&c, &four, &refused) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "kv_heads 2"),
          "tp 4 over 2 kv heads refused by name: %s", loom_last_error());
}

int main(void) {
    test_llama();
    test_trillion();
    test_params();
    test_activations();
    test_selective();
    test_sequence_parallel();
    test_middle_stage();
    test_flops();
    test_tp_traffic();
    test_gpt3();
    test_refusals();
    return check_finish();
}
