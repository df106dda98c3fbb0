/*
 * test_model_split.c — the split backward (zero-bubble's B and W) against the fused backward.
 *
 * B then W of one micro-batch must give the fused backward's gradients and stage input gradient
 * bit for bit, on the whole model and on a first, middle and last pipeline stage, starting from
 * gradients that already hold something (backward accumulates). Two micro-batches in flight with
 * their B and W interleaved must give the gradients of two fused backwards: the same bits when
 * the Ws run in the fused order, within a stated tolerance when they do not. The grads_ready
 * hook must see, from W, the offsets the fused backward shows it, in the same order.
 */
#include "check.h"
#include "loom/model.h"

#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 6 };

static loom_gpt_config test_config(void) {
    /* three layers, so that a pipeline has a first, a middle and a last stage */
    loom_gpt_config c = {.max_seq_len = 8,
                         .vocab_size = 50,
                         .padded_vocab_size = 0,
                         .num_layers = 3,
                         .num_heads = 2,
                         .channels = 16};
    c.padded_vocab_size = loom_gpt_pad_vocab(c.vocab_size);
    return c;
}

/* One micro-batch's inputs for any stage: tokens and targets, an input activation and an
 * output gradient (the ones a stage does not use are ignored). */
typedef struct {
    int32_t tokens[B * T], targets[B * T];
    float *input, *output_grad; /* (B, T, C) */
} micro_batch;

static void micro_batch_make(micro_batch *mb, const loom_gpt_config *c, uint64_t seed) {
    int64_t n = (int64_t)B * T * c->channels;
    mb->input = malloc((size_t)n * sizeof(float));
    mb->output_grad = malloc((size_t)n * sizeof(float));
    if (!mb->input || !mb->output_grad) abort();
    for (int i = 0; i < B * T; i++) {
        mb->tokens[i] = (int32_t)(loom_rng_u64(seed, 1, (uint64_t)i) % (uint64_t)c->vocab_size);
        mb->targets[i] = (int32_t)(loom_rng_u64(seed, 2, (uint64_t)i) % (uint64_t)c->vocab_size);
    }
    mb->targets[3] = -1; /* a position that does not count */
    for (int64_t i = 0; i < n; i++) {
        mb->input[i] = (float)loom_rng_normal(seed, 3, (uint64_t)i);
        mb->output_grad[i] = 0.01f * (float)loom_rng_normal(seed, 4, (uint64_t)i);
    }
}

static void micro_batch_free(micro_batch *mb) {
    free(mb->input);
    free(mb->output_grad);
}

/* A stage [first, end) with the same weights whatever the split, gradients pre-filled with the
 * same non-zero values, and `slots` activation slots (split or not). */
static loom_gpt *make_stage_as(const loom_gpt_config *c, int first, int end, int slots, int split,
                               int selective) {
    loom_gpt *m = NULL;
    loom_gpt_shard shard = {
        .first_layer = first, .end_layer = end, .tp_size = 1, .tp_rank = 0, .tp_comm = NULL};
    loom_gpt_slots_spec want = {B, T, slots, split, selective};
    if (loom_gpt_create_shard(&m, c, loom_backend_cpu(), &shard) != LOOM_OK ||
        loom_gpt_reserve_slots_spec(m, &want) != LOOM_OK) {
        fprintf(stderr, "create stage [%d, %d): %s\n", first, end, loom_last_error());
        exit(1);
    }
    loom_gpt_init_weights(m, 42);
    /* larger-than-init weights, so that every path carries a visible gradient */
    for (size_t i = 0; i < m->num_params; i++) m->params_memory[i] *= 4.0f;
    for (size_t i = 0; i < m->num_params; i++) {
        m->grads_memory[i] = 1e-3f * (float)loom_rng_normal(7, 0, i);
    }
    return m;
}

static loom_gpt *make_stage(const loom_gpt_config *c, int first, int end, int slots, int split) {
    return make_stage_as(c, first, end, slots, split, 0);
}

static float forward(loom_gpt *m, const micro_batch *mb) {
    return loom_gpt_forward_stage(m, mb->tokens, mb->input, mb->targets, B, T);
}

static const float *output_grad(const loom_gpt *m, const micro_batch *mb) {
    return m->has_head ? NULL : mb->output_grad;
}

static const float dloss = 1.0f / (B * T - 1);

static int same_floats(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* The first tensor whose gradients differ, for the message; "none" when all agree. */
static const char *first_differing_tensor(const loom_gpt *a, const loom_gpt *b) {
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &a->info[k];
        for (int64_t i = 0; i < ti->numel; i++) {
            size_t at = loom_gpt_element_offset(ti, i);
            if (memcmp(&a->grads_memory[at], &b->grads_memory[at], sizeof(float)) != 0) {
                return ti->name;
            }
        }
    }
    return "none";
}

/* ---- B then W equals the fused backward ------------------------------------------------- */

static void check_stage_bit_identical(const loom_gpt_config *c, int first, int end) {
    loom_gpt *fused = make_stage(c, first, end, 1, 0);
    loom_gpt *split = make_stage(c, first, end, 1, 1);
    micro_batch mb;
    micro_batch_make(&mb, c, 11);
    float loss_fused = forward(fused, &mb), loss_split = forward(split, &mb);
    CHECK(loss_fused == loss_split, "[%d,%d): the same forward", first, end);
    size_t BTC = (size_t)B * T * (size_t)c->channels;
    CHECK(same_floats(loom_gpt_stage_output(fused), loom_gpt_stage_output(split), BTC),
          "[%d,%d): the same stage output", first, end);

    float *before = malloc(split->num_params * sizeof(float));
    if (!before) abort();
    memcpy(before, split->grads_memory, split->num_params * sizeof(float));
    loom_gpt_backward_stage(fused, dloss, output_grad(fused, &mb));
    loom_gpt_backward_input(split, dloss, output_grad(split, &mb));
    /* B alone: the input gradient is complete, the GEMM weights untouched */
    CHECK(same_floats(loom_gpt_stage_input_grad(fused), loom_gpt_stage_input_grad(split), BTC),
          "[%d,%d): B's stage input gradient equals the fused backward's", first, end);
    const loom_gpt_tensor_info *qkvw = &split->info[LOOM_QKVW], *ln1w = &split->info[LOOM_LN1W];
    CHECK(same_floats(split->grads_memory + qkvw->offset, before + qkvw->offset,
                      (size_t)qkvw->layer_numel),
          "[%d,%d): B leaves the GEMM weight gradients to W", first, end);
    CHECK(!same_floats(split->grads_memory + ln1w->offset, before + ln1w->offset,
                       (size_t)ln1w->layer_numel),
          "[%d,%d): B does the LayerNorm gradients", first, end);
    if (split->has_head) {
        const loom_gpt_tensor_info *wte = &split->info[LOOM_WTE];
        CHECK(same_floats(split->grads.wte, before + wte->offset, (size_t)wte->numel),
              "[%d,%d): B leaves the LM head's gradient to W", first, end);
    }

    loom_gpt_backward_weight(split);
    CHECK(same_floats(fused->grads_memory, split->grads_memory, fused->num_params),
          "[%d,%d): B then W gives the fused gradients bit for bit (first difference: %s)", first,
          end, first_differing_tensor(fused, split));
    CHECK(same_floats(loom_gpt_stage_input_grad(fused), loom_gpt_stage_input_grad(split), BTC),
          "[%d,%d): W leaves the stage input gradient alone", first, end);
    CHECK(!same_floats(split->grads_memory + qkvw->offset, before + qkvw->offset,
                       (size_t)qkvw->layer_numel),
          "[%d,%d): W does the GEMM weight gradients", first, end);
    free(before);
    micro_batch_free(&mb);
    loom_gpt_free(fused);
    loom_gpt_free(split);
}

static void test_bit_identical(void) {
    loom_gpt_config c = test_config();
    int stages[][2] = {{0, 3}, {0, 1}, {1, 2}, {2, 3}, {1, 3}};
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        check_stage_bit_identical(&c, stages[i][0], stages[i][1]);
    }
}

/* ---- two micro-batches in flight ------------------------------------------------------ */

/* Gradients within `rtol` of each tensor's largest gradient. */
static void check_grads_close(const loom_gpt *got, const loom_gpt *want, double rtol,
                              const char *what) {
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &want->info[k];
        double largest = 0.0, worst = 0.0;
        for (int64_t i = 0; i < ti->numel; i++) {
            size_t at = loom_gpt_element_offset(ti, i);
            double w = want->grads_memory[at], g = got->grads_memory[at];
            largest = fabs(w) > largest ? fabs(w) : largest;
            worst = fabs(g - w) > worst ? fabs(g - w) : worst;
        }
        CHECK(worst <= rtol * largest, "%s: %s differs by %.3g (largest gradient %.3g)", what,
              ti->name, worst, largest);
    }
}

/* Forward mb0 (slot 0), forward mb1 (slot 1), B mb0, B mb1, then W in the order given. */
static void run_interleaved(loom_gpt *m, const micro_batch mb[2], const int w_order[2]) {
    for (int i = 0; i < 2; i++) {
        loom_gpt_use_slot(m, i);
        forward(m, &mb[i]);
    }
    for (int i = 0; i < 2; i++) {
        loom_gpt_use_slot(m, i);
        loom_gpt_backward_input(m, dloss, output_grad(m, &mb[i]));
    }
    for (int i = 0; i < 2; i++) {
        loom_gpt_use_slot(m, w_order[i]);
        loom_gpt_backward_weight(m);
    }
}

static void check_interleaved(const loom_gpt_config *c, int first, int end) {
    micro_batch mb[2];
    micro_batch_make(&mb[0], c, 21);
    micro_batch_make(&mb[1], c, 22);
    loom_gpt *fused = make_stage(c, first, end, 1, 0);
    for (int i = 0; i < 2; i++) {
        forward(fused, &mb[i]);
        loom_gpt_backward_stage(fused, dloss, output_grad(fused, &mb[i]));
    }

    /* Ws in the fused order: every gradient is summed in the same order, so the same bits */
    loom_gpt *in_order = make_stage(c, first, end, 2, 1);
    run_interleaved(in_order, mb, (const int[2]){0, 1});
    CHECK(same_floats(fused->grads_memory, in_order->grads_memory, fused->num_params),
          "[%d,%d): B0 B1 W0 W1 equals two fused backwards bit for bit (first difference: %s)",
          first, end, first_differing_tensor(fused, in_order));

    /* Ws reversed: each weight gradient is the same terms summed in another order (mb1's before
     * mb0's; wte's LM-head and embedding terms interleave differently), and float addition is
     * not associative. The difference is a few roundings of sums of a handful of terms, ~1e-7
     * of the largest gradient; 1e-5 leaves room and still fails when a micro-batch's term is
     * lost or counted twice (an O(1) relative error). */
    loom_gpt *reversed = make_stage(c, first, end, 2, 1);
    run_interleaved(reversed, mb, (const int[2]){1, 0});
    char what[64];
    snprintf(what, sizeof what, "[%d,%d): B0 B1 W1 W0", first, end);
    check_grads_close(reversed, fused, 1e-5, what);

    loom_gpt_free(fused);
    loom_gpt_free(in_order);
    loom_gpt_free(reversed);
    micro_batch_free(&mb[0]);
    micro_batch_free(&mb[1]);
}

static void test_interleaved(void) {
    loom_gpt_config c = test_config();
    check_interleaved(&c, 0, 3);
    check_interleaved(&c, 1, 2);
}

/* ---- selective recomputation ------------------------------------------------------------ */

/* Two micro-batches, each forward then backward (fused, or B then W), on the model's slots
 * 0 and 1 in turn. */
static void run_two(loom_gpt *m, const micro_batch mb[2], int split) {
    for (int i = 0; i < 2; i++) {
        loom_gpt_use_slot(m, i % m->slots);
        forward(m, &mb[i]);
    }
    for (int i = 0; i < 2; i++) {
        loom_gpt_use_slot(m, i % m->slots);
        if (split) {
            loom_gpt_backward_input(m, dloss, output_grad(m, &mb[i]));
            loom_gpt_backward_weight(m);
        } else {
            loom_gpt_backward_stage(m, dloss, output_grad(m, &mb[i]));
        }
    }
}

/* A selective slot keeps one layer's softmax and backward recomputes every layer's from its
 * qkv: the gradients and the stage input gradient must be the keeping model's bit for bit, fused
 * and split, with two micro-batches in flight (each slot's scratch is its own: the second
 * forward must not disturb the first micro-batch's backward). The keeping model's backward reads
 * the softmax it stored, so a recomputation that differs in any bit fails here. */
static void check_selective(const loom_gpt_config *c, int first, int end) {
    micro_batch mb[2];
    micro_batch_make(&mb[0], c, 41);
    micro_batch_make(&mb[1], c, 42);
    size_t BTC = (size_t)B * T * (size_t)c->channels;
    for (int split = 0; split <= 1; split++) {
        loom_gpt *keep = make_stage_as(c, first, end, 2, split, 0);
        loom_gpt *sel = make_stage_as(c, first, end, 2, split, 1);
        CHECK(sel->selective && !keep->selective &&
                  (end - first > 1 ? sel->slot_floats < keep->slot_floats
                                   : sel->slot_floats == keep->slot_floats),
              "[%d,%d) split %d: the selective slot is smaller (with more than one layer)", first,
              end, split);
        run_two(keep, mb, split);
        run_two(sel, mb, split);
        CHECK(same_floats(keep->grads_memory, sel->grads_memory, keep->num_params),
              "[%d,%d) split %d: selective gradients equal the keeping model's bit for bit "
              "(first difference: %s)",
              first, end, split, first_differing_tensor(keep, sel));
        CHECK(same_floats(loom_gpt_stage_input_grad(keep), loom_gpt_stage_input_grad(sel), BTC),
              "[%d,%d) split %d: the same stage input gradient", first, end, split);
        loom_gpt_free(keep);
        loom_gpt_free(sel);
    }
    micro_batch_free(&mb[0]);
    micro_batch_free(&mb[1]);
}

static void test_selective(void) {
    loom_gpt_config c = test_config();
    int stages[][2] = {{0, 3}, {0, 1}, {1, 2}, {2, 3}};
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        check_selective(&c, stages[i][0], stages[i][1]);
    }
}

/* ---- grads_ready ------------------------------------------------------------------------ */

typedef struct {
    size_t offsets[64];
    int count;
} hook_log;

static void record_offset(void *ctx, size_t ready_offset) {
    hook_log *log = ctx;
    if (log->count < 64) log->offsets[log->count] = ready_offset;
    log->count++;
}

static void check_hook(const loom_gpt_config *c, int first, int end) {
    micro_batch mb;
    micro_batch_make(&mb, c, 31);
    hook_log from_fused = {0}, from_b = {0}, from_w = {0};
    loom_gpt *fused = make_stage(c, first, end, 1, 0);
    loom_gpt *split = make_stage(c, first, end, 1, 1);
    forward(fused, &mb);
    forward(split, &mb);
    loom_gpt_set_grads_ready(fused, record_offset, &from_fused);
    loom_gpt_backward_stage(fused, dloss, output_grad(fused, &mb));
    loom_gpt_set_grads_ready(split, record_offset, &from_b);
    loom_gpt_backward_input(split, dloss, output_grad(split, &mb));
    loom_gpt_set_grads_ready(split, record_offset, &from_w);
    loom_gpt_backward_weight(split);
    CHECK(from_fused.count == end - first + 1,
          "[%d,%d): fused backward: one call per block and "
          "a last one, got %d",
          first, end, from_fused.count);
    CHECK(from_b.count == 0, "[%d,%d): B does not call grads_ready, got %d calls", first, end,
          from_b.count);
    CHECK(from_w.count == from_fused.count && memcmp(from_w.offsets, from_fused.offsets,
                                                     (size_t)from_w.count * sizeof(size_t)) == 0,
          "[%d,%d): W calls grads_ready with the fused backward's offsets, in its order", first,
          end);
    CHECK(from_w.offsets[from_w.count - 1] == 0, "[%d,%d): the last call says everything", first,
          end);
    loom_gpt_free(fused);
    loom_gpt_free(split);
    micro_batch_free(&mb);
}

static void test_grads_ready(void) {
    loom_gpt_config c = test_config();
    check_hook(&c, 0, 3);
    check_hook(&c, 1, 3);
}

/* ---- reservation ------------------------------------------------------------------------- */

static void test_reservation(void) {
    loom_gpt_config c = test_config();
    loom_gpt *m = make_stage(&c, 0, 3, 2, 0);
    size_t plain = m->slot_floats;
    CHECK(!m->acts.dqkv && !m->acts.dencoded, "no W buffers unless asked for");
    CHECK(loom_gpt_reserve_slots_split(m, B, T, 2, 1) == LOOM_OK && m->split_backward,
          "a split reservation after a plain one");
    size_t split = m->slot_floats;
    CHECK(split > plain && m->acts.dqkv && m->acts.dencoded, "W buffers in every slot");
    CHECK(loom_gpt_reserve_slots(m, B, T, 2) == LOOM_OK && m->slot_floats == split &&
              m->split_backward,
          "a plain reservation keeps a split one that is large enough");
    loom_gpt_stage_spec spec = {.tp = 1,
                                .first_layer = 0,
                                .end_layer = 3,
                                .has_embedding = 1,
                                .has_head = 1,
                                .B = B,
                                .T = T,
                                .in_flight = 2};
    loom_gpt_stage_cost cost;
    CHECK(loom_gpt_cost_stage(&c, &spec, &cost) == LOOM_OK, "cost");
    CHECK(cost.act_slot_split_bytes == 4 * (int64_t)(split - plain),
          "cost facts: a split slot grows by %lld bytes, allocated %lld",
          (long long)cost.act_slot_split_bytes, (long long)(4 * (split - plain)));
    loom_gpt_free(m);
}

int main(void) {
    test_bit_identical();
    test_interleaved();
    test_grads_ready();
    test_selective();
    test_reservation();
    return check_finish();
}
