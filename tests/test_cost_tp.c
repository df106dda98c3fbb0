/*
 * test_cost_tp.c — the tensor-parallel traffic the cost facts predict, counted in a real run:
 * every rank of the world is one TP rank of a small model; each pipeline stage's forward and
 * backward run once, and the communicator's own counters (calls; bytes, which for an allreduce
 * are 2(n-1)/n of the buffer) must equal loom_gpt_cost_stage's allreduce count and payload.
 * The split backward's B carries all of backward's allreduces and W none, and B then W gives
 * the fused backward's bits under tensor parallelism too. The same under sequence parallelism:
 * its all-gathers and reduce-scatters and the fewer allreduces, and the slot it allocates.
 * Run under mpirun with a world size dividing 4 (the heads).
 */
#include "check.h"
#include "loom/comm.h"
#include "loom/model.h"

#include <stdlib.h>
#include <string.h>

static int rank, size;

/* `calls` allreduces of `payload` bytes in all and `shards` all-gathers or reduce-scatters of
 * `shard_payload` bytes (whole buffers), against the communicator's counters: an allreduce sends
 * 2(n-1)/n of its buffer, the other two (n-1)/n. */
static void check_traffic(loom_comm *world, const char *phase, int first, int end, int sp,
                          int64_t calls, int64_t payload, int64_t shards, int64_t shard_payload) {
    loom_comm_stats stats = loom_comm_get_stats(world);
    int64_t wire = payload * 2 * (size - 1) / size + shard_payload * (size - 1) / size;
    CHECK(stats.calls == calls + shards && stats.bytes == wire,
          "rank %d stage [%d,%d)%s %s: counted %lld calls, %lld bytes; predicted %lld, %lld", rank,
          first, end, sp ? " SP" : "", phase, (long long)stats.calls, (long long)stats.bytes,
          (long long)(calls + shards), (long long)wire);
}

static void run_stage(loom_comm *world, const loom_gpt_config *c, int first, int end, int sp) {
    const int B = 2, T = 8;
    int64_t N = (int64_t)B * T, C = c->channels;
    loom_gpt *m = NULL;
    loom_gpt_shard shard = {.first_layer = first,
                            .end_layer = end,
                            .tp_size = size,
                            .tp_rank = rank,
                            .tp_comm = size > 1 ? world : NULL,
                            .sequence_parallel = sp};
    if (loom_gpt_create_shard(&m, c, loom_backend_cpu(), &shard) != LOOM_OK ||
        loom_gpt_reserve_slots(m, B, T, 1) != LOOM_OK) {
        CHECK(0, "create: %s", loom_last_error());
        loom_comm_abort(1, "test_cost_tp: cannot create the model");
    }
    loom_gpt_init_weights(m, 7);
    int32_t *tokens = malloc((size_t)N * sizeof *tokens);
    int32_t *targets = malloc((size_t)N * sizeof *targets);
    float *input = malloc((size_t)(N * C) * sizeof *input);
    float *output_grad = malloc((size_t)(N * C) * sizeof *output_grad);
    if (!tokens || !targets || !input || !output_grad) abort();
    for (int64_t i = 0; i < N; i++) {
        tokens[i] = (int32_t)((i * 37) % c->vocab_size);
        targets[i] = (int32_t)((i * 101 + 5) % c->vocab_size);
    }
    for (int64_t i = 0; i < N * C; i++) {
        input[i] = 0.01f * (float)((i % 13) - 6);
        output_grad[i] = 0.001f * (float)((i % 7) - 3);
    }

    loom_gpt_stage_spec spec = {.tp = size,
                                .first_layer = first,
                                .end_layer = end,
                                .has_embedding = first == 0,
                                .has_head = end == c->num_layers,
                                .B = B,
                                .T = T,
                                .in_flight = 1,
                                .sequence_parallel = sp};
    loom_gpt_stage_cost cost;
    CHECK(loom_gpt_cost_stage(c, &spec, &cost) == LOOM_OK, "cost: %s", loom_last_error());
    if (sp) {
        /* the activation slot the cost facts describe is the one allocated */
        CHECK(cost.act_slot_bytes - cost.act_slot_token_bytes == 4 * (int64_t)m->slot_floats,
              "rank %d stage [%d,%d) SP: slot %lld bytes, allocated %lld", rank, first, end,
              (long long)(cost.act_slot_bytes - cost.act_slot_token_bytes),
              (long long)(4 * m->slot_floats));
        CHECK(cost.pp_act_bytes == (spec.has_head ? 0 : 4 * N * C / size) &&
                  loom_gpt_rows(m, B, T) == N / size,
              "SP: each TP rank sends its own rows");
    }

    loom_comm_reset_stats(world);
    loom_gpt_forward_stage(m, tokens, input, targets, B, T);
    check_traffic(world, "forward", first, end, sp, cost.tp_allreduces_fwd, cost.tp_bytes_fwd,
                  cost.tp_shards_fwd, cost.tp_shard_bytes_fwd);
    loom_comm_reset_stats(world);
    loom_gpt_backward_stage(m, 1.0f / (float)N, spec.has_head ? NULL : output_grad);
    check_traffic(world, "backward", first, end, sp, cost.tp_allreduces_bwd, cost.tp_bytes_bwd,
                  cost.tp_shards_bwd, cost.tp_shard_bytes_bwd);

    /* B and W apart: every allreduce is B's (W's weight gradients are this rank's own), and B
     * then W gives the fused backward's gradients and input gradient bit for bit */
    loom_gpt *split = NULL;
    if (loom_gpt_create_shard(&split, c, loom_backend_cpu(), &shard) != LOOM_OK ||
        loom_gpt_reserve_slots_split(split, B, T, 1, 1) != LOOM_OK) {
        CHECK(0, "create: %s", loom_last_error());
        loom_comm_abort(1, "test_cost_tp: cannot create the model");
    }
    loom_gpt_init_weights(split, 7);
    loom_gpt_forward_stage(split, tokens, input, targets, B, T);
    /* under SP, W gathers ln1 and ln2 of every block again for their GEMMs' weight gradients, and
     * the embedding's output gradient (gpt.c: gathered_input, embed_backward); B the rest */
    int64_t w_shards = sp ? 2 * (end - first) + spec.has_embedding : 0;
    int64_t w_bytes = w_shards * 4 * N * C;
    loom_comm_reset_stats(world);
    loom_gpt_backward_input(split, 1.0f / (float)N, spec.has_head ? NULL : output_grad);
    check_traffic(world, "backward B", first, end, sp, cost.tp_allreduces_bwd, cost.tp_bytes_bwd,
                  cost.tp_shards_bwd - w_shards, cost.tp_shard_bytes_bwd - w_bytes);
    loom_comm_reset_stats(world);
    loom_gpt_backward_weight(split);
    check_traffic(world, "backward W", first, end, sp, 0, 0, w_shards, w_bytes);
    CHECK(memcmp(split->grads_memory, m->grads_memory, m->num_params * sizeof(float)) == 0 &&
              memcmp(loom_gpt_stage_input_grad(split), loom_gpt_stage_input_grad(m),
                     (size_t)(loom_gpt_rows(m, B, T) * C) * sizeof(float)) == 0,
          "rank %d stage [%d,%d)%s: B then W equals the fused backward bit for bit", rank, first,
          end, sp ? " SP" : "");
    loom_gpt_free(split);

    free(tokens);
    free(targets);
    free(input);
    free(output_grad);
    loom_gpt_free(m);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_last_error());
        return 1;
    }
    rank = loom_comm_rank(world);
    size = loom_comm_size(world);
    loom_gpt_config c = {.max_seq_len = 32,
                         .vocab_size = 257,
                         .padded_vocab_size = 0,
                         .num_layers = 3,
                         .num_heads = 4,
                         .channels = 32};
    c.padded_vocab_size = loom_gpt_pad_vocab(c.vocab_size);
    int stages[][2] = {{0, 3}, {0, 1}, {1, 2}, {2, 3}, {1, 3}};
    for (int sp = 0; sp <= (size > 1); sp++) {
        for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
            run_stage(world, &c, stages[i][0], stages[i][1], sp);
        }
    }

    /* Totals over every rank, printed once. */
    double counts[2] = {check_passed, check_failed};
    int local_failed = check_failed;
    if (loom_comm_allreduce_f64(world, counts, 2, LOOM_REDUCE_SUM) != LOOM_OK) {
        fprintf(stderr, "rank %d: summing the results: %s\n", rank, loom_last_error());
        local_failed = 1;
    }
    loom_comm_finalize(world);
    if (rank == 0) {
        check_passed = (int)counts[0];
        check_failed = (int)counts[1];
        if (check_finish() != 0) return 1;
    }
    return local_failed ? 1 : 0;
}
