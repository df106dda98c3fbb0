/*
 * test_model_chunks.c — model chunks (virtual pipeline stages) against the single model.
 *
 * A 6-layer model is split over two shard objects in one process, as Megatron's interleaved
 * schedule does (p 2, v 2, uneven chunks) and as zero-bubble's V shape does (rank 0 holds the
 * first chunk and the last, the embedding and the head, with the tied wte once). Running the
 * chunks in virtual-stage order, activations and input gradients passed by copy, must give the
 * single model's loss and gradients (mapped back through loom_gpt_global_index); each shard's
 * initialisation must equal the single model's parameters at the mapped indices exactly. Also:
 * B and W per chunk against the fused chunk backward, grads_ready on a rank of two chunks, slot
 * sizes, and refusals of bad chunk lists.
 */
#include "check.h"
#include "loom/model.h"

#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 6, RANKS = 2, STAGES = 4 };

static loom_gpt_config test_config(void) {
    loom_gpt_config c = {.max_seq_len = 8,
                         .vocab_size = 50,
                         .padded_vocab_size = 0,
                         .num_layers = 6,
                         .num_heads = 2,
                         .channels = 16};
    c.padded_vocab_size = loom_gpt_pad_vocab(c.vocab_size);
    return c;
}

/* Two ranks' chunk lists and the order of the virtual stages: (rank, chunk) pairs. */
typedef struct {
    const char *name;
    loom_gpt_shard shards[RANKS];
    int order[STAGES][2];
} chunk_plan;

static loom_gpt_chunk chunk(int first, int end, int has_embedding, int has_head) {
    return (loom_gpt_chunk){first, end, has_embedding, has_head};
}

static loom_gpt_shard two_chunks(loom_gpt_chunk a, loom_gpt_chunk b) {
    loom_gpt_shard s = {.tp_size = 1, .num_chunks = 2};
    s.chunks[0] = a;
    s.chunks[1] = b;
    return s;
}

/* Megatron's interleaved schedule, p 2 and v 2: rank i runs virtual stages i and i + 2, with
 * uneven chunks. */
static chunk_plan megatron_plan(void) {
    chunk_plan p = {.name = "interleaved p2 v2", .order = {{0, 0}, {1, 0}, {0, 1}, {1, 1}}};
    p.shards[0] = two_chunks(chunk(0, 1, 1, 0), chunk(3, 5, 0, 0));
    p.shards[1] = two_chunks(chunk(1, 3, 0, 0), chunk(5, 6, 0, 1));
    return p;
}

/* Zero-bubble's V: rank 0 runs the first and the last virtual stage, rank 1 the middle two. */
static chunk_plan zbv_plan(void) {
    chunk_plan p = {.name = "ZB-V p2", .order = {{0, 0}, {1, 0}, {1, 1}, {0, 1}}};
    p.shards[0] = two_chunks(chunk(0, 2, 1, 0), chunk(4, 6, 0, 1));
    p.shards[1] = two_chunks(chunk(2, 3, 0, 0), chunk(3, 4, 0, 0));
    return p;
}

typedef struct {
    int32_t tokens[B * T], targets[B * T];
} micro_batch;

static micro_batch micro_batch_make(const loom_gpt_config *c) {
    micro_batch mb;
    for (int i = 0; i < B * T; i++) {
        mb.tokens[i] = (int32_t)(loom_rng_u64(5, 1, (uint64_t)i) % (uint64_t)c->vocab_size);
        mb.targets[i] = (int32_t)(loom_rng_u64(5, 2, (uint64_t)i) % (uint64_t)c->vocab_size);
    }
    mb.targets[2] = -1;
    return mb;
}

static const float dloss = 1.0f / (B * T - 1);

/* Initialised from the same seed, weights scaled up so every path carries a visible gradient
 * (elementwise, so shards still equal the single model), gradients zero. */
static loom_gpt *make_model(const loom_gpt_config *c, const loom_gpt_shard *shard, int slots,
                            int split) {
    loom_gpt *m = NULL;
    loom_status st = shard ? loom_gpt_create_shard(&m, c, loom_backend_cpu(), shard)
                           : loom_gpt_create(&m, c, loom_backend_cpu());
    if (st != LOOM_OK || loom_gpt_reserve_slots_split(m, B, T, slots, split) != LOOM_OK) {
        fprintf(stderr, "create: %s\n", loom_last_error());
        exit(1);
    }
    loom_gpt_init_weights(m, 42);
    for (size_t i = 0; i < m->num_params; i++) m->params_memory[i] *= 4.0f;
    loom_gpt_zero_grad(m);
    return m;
}

/* Forward through the virtual stages in order, activations passed by copy; each (rank, chunk)
 * uses slot `chunk`. Returns the loss. */
static float forward_chunks(const chunk_plan *plan, loom_gpt *models[RANKS],
                            const micro_batch *mb) {
    size_t BTC = (size_t)B * T * (size_t)models[0]->config.channels;
    float *act = calloc(BTC, sizeof(float));
    if (!act) abort();
    float loss = 0.0f;
    for (int s = 0; s < STAGES; s++) {
        loom_gpt *m = models[plan->order[s][0]];
        int c = plan->order[s][1];
        loom_gpt_use_slot(m, c);
        loss = loom_gpt_forward_chunk(m, c, mb->tokens, act, mb->targets, B, T);
        memcpy(act, loom_gpt_chunk_output(m, c), BTC * sizeof(float));
    }
    free(act);
    return loss;
}

/* Backward in reverse virtual-stage order, input gradients passed by copy: fused, or B for every
 * stage and then W for every stage in the same reverse order. */
static void backward_chunks(const chunk_plan *plan, loom_gpt *models[RANKS], int split) {
    size_t BTC = (size_t)B * T * (size_t)models[0]->config.channels;
    float *grad = calloc(BTC, sizeof(float));
    if (!grad) abort();
    for (int s = STAGES - 1; s >= 0; s--) {
        loom_gpt *m = models[plan->order[s][0]];
        int c = plan->order[s][1];
        const float *output_grad = m->chunks[c].has_head ? NULL : grad;
        loom_gpt_use_slot(m, c);
        if (split) {
            loom_gpt_backward_chunk_input(m, c, dloss, output_grad);
        } else {
            loom_gpt_backward_chunk(m, c, dloss, output_grad);
        }
        memcpy(grad, loom_gpt_chunk_input_grad(m), BTC * sizeof(float));
    }
    for (int s = STAGES - 1; split && s >= 0; s--) {
        loom_gpt *m = models[plan->order[s][0]];
        loom_gpt_use_slot(m, plan->order[s][1]);
        loom_gpt_backward_chunk_weight(m, plan->order[s][1]);
    }
    free(grad);
}

static float run_chunks(const chunk_plan *plan, loom_gpt *models[RANKS], const micro_batch *mb,
                        int split) {
    float loss = forward_chunks(plan, models, mb);
    backward_chunks(plan, models, split);
    return loss;
}

/* The single model's flat-buffer offset of shard element (k, i). */
static size_t single_offset(const loom_gpt *single, const loom_gpt *shard, int k, int64_t i) {
    return loom_gpt_element_offset(&single->info[k], loom_gpt_global_index(shard, k, i));
}

static void check_init(const chunk_plan *plan, const loom_gpt *single, loom_gpt *shards[RANKS]) {
    int owners[16] = {0};
    for (int r = 0; r < RANKS; r++) {
        const loom_gpt *m = shards[r];
        int64_t differ = 0;
        for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
            for (int64_t i = 0; i < m->info[k].numel; i++) {
                float mine = m->params_memory[loom_gpt_element_offset(&m->info[k], i)];
                float want = single->params_memory[single_offset(single, m, k, i)];
                differ += memcmp(&mine, &want, sizeof mine) != 0;
            }
        }
        CHECK(differ == 0, "%s rank %d: %lld parameters differ from the single model's", plan->name,
              r, (long long)differ);
        for (int l = 0; l < single->config.num_layers; l++)
            owners[l] += loom_gpt_local_layer(m, l) >= 0;
    }
    for (int l = 0; l < single->config.num_layers; l++) {
        CHECK(owners[l] == 1, "%s: layer %d held by %d ranks", plan->name, l, owners[l]);
    }
}

/* The shards' gradients summed into the single model's layout (wte may be held twice, by the
 * embedding's rank and the head's, as in a pipeline whose tied copies are summed later) against
 * the single model's, within 1e-5 of each tensor's largest gradient: the same float terms, but
 * forward and backward see the blocks through other buffers, and a tied wte held twice adds its
 * two parts in another order. Returns whether all were equal bit for bit. */
static int check_grads(const chunk_plan *plan, const loom_gpt *single, loom_gpt *shards[RANKS]) {
    float *mapped = calloc(single->num_params, sizeof(float));
    int *covered = calloc(single->num_params, sizeof(int));
    if (!mapped || !covered) abort();
    for (int r = 0; r < RANKS; r++) {
        const loom_gpt *m = shards[r];
        for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
            for (int64_t i = 0; i < m->info[k].numel; i++) {
                size_t at = single_offset(single, m, k, i);
                mapped[at] += m->grads_memory[loom_gpt_element_offset(&m->info[k], i)];
                covered[at]++;
            }
        }
    }
    int bits = 1;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
        const loom_gpt_tensor_info *ti = &single->info[k];
        int holders = 0;
        if (ti->numel == 0) continue; /* not in this model (GPT-2's untied head) */
        for (int r = 0; r < RANKS; r++) holders += shards[r]->info[k].numel > 0;
        double largest = 0.0, worst = 0.0;
        int64_t wrong_cover = 0;
        for (int64_t i = 0; i < ti->numel; i++) {
            size_t at = loom_gpt_element_offset(ti, i);
            double want = single->grads_memory[at], got = mapped[at];
            largest = fabs(want) > largest ? fabs(want) : largest;
            worst = fabs(got - want) > worst ? fabs(got - want) : worst;
            bits &= memcmp(&mapped[at], &single->grads_memory[at], sizeof(float)) == 0;
            wrong_cover += covered[at] != (ti->per_layer ? 1 : holders);
        }
        CHECK(wrong_cover == 0 && holders >= 1,
              "%s: %s: %lld elements held a wrong number of times", plan->name, ti->name,
              (long long)wrong_cover);
        CHECK(worst <= 1e-5 * largest && largest > 0.0,
              "%s: %s gradient differs by %.3g (largest %.3g)", plan->name, ti->name, worst,
              largest);
    }
    free(mapped);
    free(covered);
    return bits;
}

static void test_plan(const chunk_plan *plan) {
    loom_gpt_config c = test_config();
    micro_batch mb = micro_batch_make(&c);
    loom_gpt *single = make_model(&c, NULL, 1, 0);
    float single_loss = loom_gpt_forward(single, mb.tokens, mb.targets, B, T);
    loom_gpt_backward(single, dloss);

    loom_gpt *fused[RANKS], *split[RANKS];
    for (int r = 0; r < RANKS; r++) {
        fused[r] = make_model(&c, &plan->shards[r], 2, 0);
        split[r] = make_model(&c, &plan->shards[r], 2, 1);
    }
    check_init(plan, single, fused);
    float loss = run_chunks(plan, fused, &mb, 0);
    CHECK_CLOSE(loss, single_loss, 1e-6, 0.0, "chunked loss vs the single model's");
    int bits = check_grads(plan, single, fused);
    printf("%s: loss %s, gradients %s the single model's bit for bit\n", plan->name,
           loss == single_loss ? "equal to" : "not equal to", bits ? "equal" : "not all equal");

    /* B and W per chunk, the Ws in the fused backward's order: the same bits */
    float split_loss = run_chunks(plan, split, &mb, 1);
    CHECK(split_loss == loss, "%s: split run, the same loss", plan->name);
    for (int r = 0; r < RANKS; r++) {
        CHECK(memcmp(fused[r]->grads_memory, split[r]->grads_memory,
                     fused[r]->num_params * sizeof(float)) == 0,
              "%s rank %d: B and W per chunk equal the fused chunk backward bit for bit",
              plan->name, r);
        loom_gpt_free(fused[r]);
        loom_gpt_free(split[r]);
    }
    loom_gpt_free(single);
}

/* ---- the tied embedding under ZB-V ---------------------------------------------------- */

static void test_zbv_tied_embedding(void) {
    loom_gpt_config c = test_config();
    chunk_plan plan = zbv_plan();
    loom_gpt *r0 = make_model(&c, &plan.shards[0], 2, 0),
             *r1 = make_model(&c, &plan.shards[1], 2, 0);
    loom_gpt_tensor_info whole[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout(&c, whole);
    CHECK(r0->has_embedding && r0->has_head && r0->info[LOOM_WTE].numel == whole[LOOM_WTE].numel,
          "ZB-V rank 0 holds wte once");
    /* wte, wpe, blocks 0, 1, 4, 5, lnf */
    size_t expected = (size_t)(whole[LOOM_WTE].numel + whole[LOOM_WPE].numel) +
                      4 * r0->layer_stride + 2 * (size_t)c.channels;
    CHECK(r0->num_params == expected, "ZB-V rank 0: %zu parameters, expected %zu", r0->num_params,
          expected);
    CHECK(!r1->params.wte && !r1->params.wpe && !r1->params.lnfw && r1->num_local_layers == 2,
          "ZB-V rank 1: blocks 2 and 3 only");
    CHECK(loom_gpt_global_layer(r0, 2) == 4 && loom_gpt_local_layer(r0, 5) == 3 &&
              loom_gpt_local_layer(r0, 2) == -1 && loom_gpt_global_layer(r1, 1) == 3,
          "local and global layers");

    /* wte's gradient is the LM head's (from the head chunk) plus the embedding's (chunk 0):
     * the full backward against the head chunk's alone, which is all there is in the rows of
     * tokens that are not in the input */
    micro_batch mb = micro_batch_make(&c);
    loom_gpt *models[RANKS] = {r0, r1};
    run_chunks(&plan, models, &mb, 0);
    int64_t n = r0->info[LOOM_WTE].numel;
    float *both = malloc((size_t)n * sizeof(float));
    if (!both) abort();
    memcpy(both, r0->grads.wte, (size_t)n * sizeof(float));
    loom_gpt_zero_grad(r0);
    forward_chunks(&plan, models, &mb);
    loom_gpt_use_slot(r0, 1);
    loom_gpt_backward_chunk(r0, 1, dloss, NULL);
    /* rows of wte: the padded vocabulary (numel / channels), more than the real one */
    unsigned char *seen = calloc((size_t)(n / c.channels), 1);
    if (!seen) abort();
    for (int i = 0; i < B * T; i++) seen[mb.tokens[i]] = 1;
    int64_t input_rows_differ = 0, other_rows_differ = 0;
    for (int64_t i = 0; i < n; i++) {
        int differs = memcmp(&r0->grads.wte[i], &both[i], sizeof(float)) != 0;
        if (seen[i / c.channels]) {
            input_rows_differ += differs;
        } else {
            other_rows_differ += differs;
        }
    }
    CHECK(input_rows_differ > 0 && other_rows_differ == 0,
          "ZB-V rank 0: wte's gradient adds the embedding's to the LM head's (input rows "
          "differing %lld, other rows %lld)",
          (long long)input_rows_differ, (long long)other_rows_differ);
    free(seen);
    free(both);
    loom_gpt_free(r0);
    loom_gpt_free(r1);
}

/* ---- grads_ready on a rank of two chunks ------------------------------------------------ */

typedef struct {
    size_t offsets[16];
    int count;
} hook_log;

static void record_offset(void *ctx, size_t ready_offset) {
    hook_log *log = ctx;
    if (log->count < 16) log->offsets[log->count] = ready_offset;
    log->count++;
}

static void test_grads_ready(void) {
    loom_gpt_config c = test_config();
    chunk_plan plan = zbv_plan();
    for (int split = 0; split <= 1; split++) {
        loom_gpt *models[RANKS];
        hook_log logs[RANKS] = {{{0}, 0}, {{0}, 0}};
        for (int r = 0; r < RANKS; r++) {
            models[r] = make_model(&c, &plan.shards[r], 2, split);
            loom_gpt_set_grads_ready(models[r], record_offset, &logs[r]);
        }
        micro_batch mb = micro_batch_make(&c);
        run_chunks(&plan, models, &mb, split);
        for (int r = 0; r < RANKS; r++) {
            /* the last chunk's blocks, then the first's, each from the top; 0 after chunk 0 */
            const loom_gpt *m = models[r];
            int L = m->num_local_layers;
            int ok = logs[r].count == L + 1 && logs[r].offsets[L] == 0;
            for (int i = 0; ok && i < L; i++) {
                size_t block = m->info[LOOM_LN1W].offset + (size_t)(L - 1 - i) * m->layer_stride;
                ok = logs[r].offsets[i] == block;
            }
            CHECK(ok, "%s rank %d: grads_ready after each block from the top, then 0 (%d calls)",
                  split ? "W" : "fused", r, logs[r].count);
            loom_gpt_free(models[r]);
        }
    }
}

/* ---- layout, slots and refusals ---------------------------------------------------------- */

static size_t slot_floats(const loom_gpt_config *c, const loom_gpt_shard *shard) {
    loom_gpt *m = make_model(c, shard, 1, 0);
    size_t floats = m->slot_floats;
    loom_gpt_free(m);
    return floats;
}

static void test_layout(void) {
    loom_gpt_config c = test_config();
    /* one chunk in the list is the stage of num_chunks 0 */
    loom_gpt as_stage, as_chunk;
    loom_gpt_shard stage = {.first_layer = 2, .end_layer = 6, .tp_size = 1};
    loom_gpt_shard one = {.tp_size = 1, .num_chunks = 1};
    one.chunks[0] = chunk(2, 6, 0, 1);
    CHECK(loom_gpt_describe(&as_stage, &c, &stage) == LOOM_OK &&
              loom_gpt_describe(&as_chunk, &c, &one) == LOOM_OK,
          "describe");
    CHECK(as_stage.num_params == as_chunk.num_params &&
              memcmp(as_stage.info, as_chunk.info, sizeof as_stage.info) == 0 &&
              as_stage.first_layer == 2 && as_stage.num_chunks == 1 && as_stage.has_head &&
              !as_stage.has_embedding,
          "a one-chunk list lays out as the stage");

    /* a slot holds one chunk: the largest chunk's blocks, the head's buffers on its rank */
    chunk_plan megatron = megatron_plan();
    loom_gpt_shard blocks_3_5 = {.first_layer = 3, .end_layer = 5, .tp_size = 1};
    loom_gpt_shard blocks_4_6 = {.first_layer = 4, .end_layer = 6, .tp_size = 1};
    CHECK(slot_floats(&c, &megatron.shards[0]) == slot_floats(&c, &blocks_3_5),
          "interleaved rank 0's slot: two blocks, no head");
    CHECK(slot_floats(&c, &megatron.shards[1]) == slot_floats(&c, &blocks_4_6),
          "interleaved rank 1's slot: two blocks and the head");

    /* bad lists are refused, naming the chunk */
    struct {
        loom_gpt_shard shard;
        const char *expect;
    } bad[] = {
        {two_chunks(chunk(0, 3, 1, 0), chunk(2, 4, 0, 0)), "chunks[1]: expected layers"},
        {two_chunks(chunk(1, 2, 1, 0), chunk(3, 4, 0, 0)), "chunks[0].has_embedding"},
        {two_chunks(chunk(0, 2, 0, 0), chunk(3, 5, 0, 1)), "chunks[1].has_head"},
        {two_chunks(chunk(0, 6, 0, 1), chunk(6, 6, 0, 1)), "chunks[1].has_head"},
        {two_chunks(chunk(2, 1, 0, 0), chunk(3, 4, 0, 0)), "chunks[0]: expected layers"},
        {two_chunks(chunk(0, 2, 0, 0), chunk(3, 7, 0, 0)), "chunks[1]: expected layers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_gpt m;
        CHECK(loom_gpt_describe(&m, &c, &bad[i].shard) == LOOM_ERR_INPUT &&
                  strstr(loom_last_error(), bad[i].expect),
              "bad chunk list %zu refused with '%s': %s", i, bad[i].expect, loom_last_error());
    }
    loom_gpt_shard too_many = {.tp_size = 1, .num_chunks = LOOM_GPT_MAX_CHUNKS + 1};
    loom_gpt m;
    CHECK(loom_gpt_describe(&m, &c, &too_many) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "num_chunks"),
          "too many chunks: %s", loom_last_error());
}

int main(void) {
    chunk_plan megatron = megatron_plan(), zbv = zbv_plan();
    test_plan(&megatron);
    test_plan(&zbv);
    test_zbv_tied_embedding();
    test_grads_ready();
    test_layout();
    return check_finish();
}
