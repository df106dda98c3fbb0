/*
 * schedule.c — pipeline schedules as plain data: the shape of a step (p ranks, v chunks, m
 * micro-batches) and where each virtual stage lives; GPipe's and 1F1B's lists written out
 * directly; names, the peak of activations in flight and the cool-down sends of any list. The
 * ordering rules and the contract the executor relies on are in loom/parallel.h.
 *
 * Not here: the schedules built from a reference run (interleaved, zb-h1, zb-v:
 * schedule_order.c), running a list (the executor), any communication.
 */
#include "parallel_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Appends actions to a list sized beforehand; the stage's position decides which
 * communication actions exist at all. */
typedef struct {
    loom_pipe_action *actions;
    int count;
    int is_first, is_last;
} schedule_builder;

static void push(schedule_builder *b, loom_pipe_op op, int micro_batch) {
    b->actions[b->count++] = (loom_pipe_action){op, micro_batch, 0};
}

static void push_recv_act(schedule_builder *b, int mb) {
    if (!b->is_first) push(b, LOOM_PIPE_RECV_ACT, mb);
}

static void push_forward_and_send(schedule_builder *b, int mb) {
    push(b, LOOM_PIPE_FORWARD, mb);
    if (!b->is_last) push(b, LOOM_PIPE_SEND_ACT, mb);
}

static void push_recv_grad_and_backward(schedule_builder *b, int mb) {
    if (!b->is_last) push(b, LOOM_PIPE_RECV_GRAD, mb);
    push(b, LOOM_PIPE_BACKWARD, mb);
}

static void push_send_grad(schedule_builder *b, int mb) {
    if (!b->is_first) push(b, LOOM_PIPE_SEND_GRAD, mb);
}

static void build_gpipe(schedule_builder *b, int micro_batches) {
    for (int mb = 0; mb < micro_batches; mb++) {
        push_recv_act(b, mb);
        push_forward_and_send(b, mb);
    }
    /* Backwards in forward order, as Megatron does; with equal stage times the makespan is the
     * same as in reverse order. */
    for (int mb = 0; mb < micro_batches; mb++) {
        push_recv_grad_and_backward(b, mb);
        push_send_grad(b, mb);
    }
}

static void build_1f1b(schedule_builder *b, int stages, int micro_batches, int stage) {
    int warmup = stages - stage - 1;
    if (warmup > micro_batches) warmup = micro_batches;
    int steady = micro_batches - warmup;

    for (int mb = 0; mb < warmup; mb++) {
        push_recv_act(b, mb);
        push_forward_and_send(b, mb);
    }
    if (steady > 0) push_recv_act(b, warmup);
    for (int i = 0; i < steady; i++) {
        int forward_mb = warmup + i, backward_mb = i;
        push_forward_and_send(b, forward_mb);
        push_recv_grad_and_backward(b, backward_mb);
        /* The next activation is received before this gradient is sent: the stage below sends
         * that activation before it waits for this gradient, so both ends of the link list
         * their messages in one order and blocking point-to-point cannot deadlock. */
        if (i + 1 < steady) push_recv_act(b, forward_mb + 1);
        push_send_grad(b, backward_mb);
    }
    for (int mb = steady; mb < micro_batches; mb++) {
        push_recv_grad_and_backward(b, mb);
        push_send_grad(b, mb);
    }
}

/* ---- shapes and placement ------------------------------------------------------------------ */

loom_status loom_pipe_shape_check(const loom_pipe_shape *shape) {
    if (!shape) return loom_fail(LOOM_ERR_INPUT, "pipeline schedule: no shape given");
    if ((int)shape->kind < 0 || (int)shape->kind >= LOOM_SCHEDULE_NUM_KINDS) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: unknown schedule kind %d; expected gpipe, 1f1b, "
                         "interleaved, zb-h1 or zb-v",
                         (int)shape->kind);
    }
    const char *name = loom_schedule_kind_name(shape->kind);
    if (shape->ranks < 1) {
        return loom_fail(LOOM_ERR_INPUT, "pipeline schedule: stages must be at least 1, got %d",
                         shape->ranks);
    }
    int chunks = loom_plan_schedule_chunks(shape->kind);
    if (chunks == 0 && shape->chunks < 2) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: interleaved needs at least 2 virtual stages per "
                         "rank, got %d",
                         shape->chunks);
    }
    if (chunks != 0 && shape->chunks != chunks) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: %s runs %d chunk%s per rank, got %d virtual stages",
                         name, chunks, chunks == 1 ? "" : "s", shape->chunks);
    }
    /* 8 actions per micro-batch and chunk at most, and a reference run of 3 per rank: the
     * counts stay ints */
    int64_t per_rank = (int64_t)shape->micro_batches * shape->chunks;
    if (shape->micro_batches < 1 || per_rank * shape->ranks > INT_MAX / 8) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: micro-batches must be in [1, %lld], got %d",
                         (long long)(INT_MAX / 8 / ((int64_t)shape->chunks * shape->ranks)),
                         shape->micro_batches);
    }
    if (shape->kind == LOOM_SCHEDULE_INTERLEAVED && shape->micro_batches % shape->ranks != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: interleaved needs micro-batches a multiple of the "
                         "pipeline ranks (%d), got %d",
                         shape->ranks, shape->micro_batches);
    }
    return LOOM_OK;
}

loom_status loom_pipe_shape_of(const loom_plan *plan, loom_pipe_shape *shape) {
    shape->ranks = plan->pp;
    shape->chunks = plan->virtual_stages;
    shape->micro_batches = loom_plan_num_micro_batches(plan);
    shape->kind = plan->schedule;
    return LOOM_OK;
}

int loom_pipe_virtual_stages(const loom_pipe_shape *shape) {
    return shape->ranks * shape->chunks;
}

/* loom_plan_place's rule backwards (test_schedule checks that the two agree) */
int loom_pipe_stage(const loom_pipe_shape *shape, int rank, int chunk) {
    if (shape->kind == LOOM_SCHEDULE_ZB_V && chunk == 1) return 2 * shape->ranks - 1 - rank;
    return chunk * shape->ranks + rank;
}

void loom_pipe_place(const loom_pipe_shape *shape, int stage, int *rank, int *chunk) {
    loom_plan_place(shape->kind, shape->ranks, shape->chunks, stage, rank, chunk);
}

int loom_pipe_peer(const loom_pipe_shape *shape, int rank, loom_pipe_action action) {
    int up = action.op == LOOM_PIPE_SEND_ACT || action.op == LOOM_PIPE_RECV_GRAD;
    int down = action.op == LOOM_PIPE_RECV_ACT || action.op == LOOM_PIPE_SEND_GRAD;
    if (!up && !down) return -1;
    int stage = loom_pipe_stage(shape, rank, action.chunk) + (up ? 1 : -1), peer, chunk;
    if (stage < 0 || stage >= loom_pipe_virtual_stages(shape)) return -1;
    loom_pipe_place(shape, stage, &peer, &chunk);
    return peer;
}

/* ---- building ------------------------------------------------------------------------------- */

static loom_status build_direct(const loom_pipe_shape *shape, int stage,
                                loom_pipe_stage_schedule *out) {
    int stages = shape->ranks, micro_batches = shape->micro_batches;
    schedule_builder b = {.is_first = stage == 0, .is_last = stage == stages - 1};
    int per_micro_batch = 2 + (b.is_first ? 0 : 2) + (b.is_last ? 0 : 2);
    size_t capacity = (size_t)per_micro_batch * (size_t)micro_batches;
    b.actions = loom_malloc(capacity * sizeof *b.actions, "pipeline schedule");
    if (!b.actions) return LOOM_ERR_NOMEM;

    if (shape->kind == LOOM_SCHEDULE_GPIPE) {
        build_gpipe(&b, micro_batches);
    } else {
        build_1f1b(&b, stages, micro_batches, stage);
    }
    if ((size_t)b.count != capacity) { /* a builder bug, never bad input */
        free(b.actions);
        return loom_fail(LOOM_ERR_RUNTIME,
                         "pipeline schedule: built %d actions for stage %d of %d, expected %zu",
                         b.count, stage, stages, capacity);
    }
    out->actions = b.actions;
    out->count = b.count;
    return LOOM_OK;
}

loom_status loom_pipe_schedule_build(const loom_pipe_shape *shape, int rank,
                                     loom_pipe_stage_schedule *out) {
    if (!out) return loom_fail(LOOM_ERR_INPUT, "pipeline schedule: no output given");
    out->actions = NULL;
    out->count = 0;
    loom_status st = loom_pipe_shape_check(shape);
    if (st != LOOM_OK) return st;
    if (rank < 0 || rank >= shape->ranks) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: stage %d out of range, expected 0 <= stage < %d", rank,
                         shape->ranks);
    }
    if (shape->kind == LOOM_SCHEDULE_GPIPE || shape->kind == LOOM_SCHEDULE_1F1B) {
        return build_direct(shape, rank, out);
    }
    return loom_pipe_schedule_ordered(shape, rank, 1, out);
}

loom_status loom_pipe_schedule_build_all(const loom_pipe_shape *shape,
                                         loom_pipe_stage_schedule *out) {
    if (!out) return loom_fail(LOOM_ERR_INPUT, "pipeline schedule: no output given");
    loom_status st = loom_pipe_shape_check(shape);
    if (st != LOOM_OK) return st;
    memset(out, 0, (size_t)shape->ranks * sizeof *out);
    if (shape->kind == LOOM_SCHEDULE_GPIPE || shape->kind == LOOM_SCHEDULE_1F1B) {
        for (int r = 0; r < shape->ranks && st == LOOM_OK; r++)
            st = build_direct(shape, r, &out[r]);
    } else {
        st = loom_pipe_schedule_ordered(shape, 0, shape->ranks, out);
    }
    if (st != LOOM_OK) {
        for (int r = 0; r < shape->ranks; r++) loom_pipe_schedule_free(&out[r]);
    }
    return st;
}

loom_status loom_pipe_schedule(loom_schedule_kind kind, int stages, int micro_batches, int stage,
                               loom_pipe_stage_schedule *out) {
    int chunks =
        (int)kind >= 0 && (int)kind < LOOM_SCHEDULE_NUM_KINDS ? loom_plan_schedule_chunks(kind) : 1;
    loom_pipe_shape shape = {kind, stages, chunks, micro_batches};
    return loom_pipe_schedule_build(&shape, stage, out);
}

void loom_pipe_schedule_free(loom_pipe_stage_schedule *s) {
    if (!s) return;
    free(s->actions);
    s->actions = NULL;
    s->count = 0;
}

const char *loom_pipe_op_name(loom_pipe_op op) {
    switch (op) {
    case LOOM_PIPE_RECV_ACT:
        return "recv_act";
    case LOOM_PIPE_FORWARD:
        return "forward";
    case LOOM_PIPE_SEND_ACT:
        return "send_act";
    case LOOM_PIPE_RECV_GRAD:
        return "recv_grad";
    case LOOM_PIPE_BACKWARD:
        return "backward";
    case LOOM_PIPE_SEND_GRAD:
        return "send_grad";
    case LOOM_PIPE_BACKWARD_INPUT:
        return "backward_input";
    case LOOM_PIPE_BACKWARD_WEIGHT:
        return "backward_weight";
    }
    return "?";
}

int loom_pipe_peak_in_flight(const loom_pipe_stage_schedule *s) {
    int in_flight = 0, peak = 0;
    for (int i = 0; i < s->count; i++) {
        if (s->actions[i].op == LOOM_PIPE_FORWARD) {
            in_flight++;
            if (in_flight > peak) peak = in_flight;
        } else if (s->actions[i].op == LOOM_PIPE_BACKWARD ||
                   s->actions[i].op == LOOM_PIPE_BACKWARD_WEIGHT) {
            in_flight--;
        }
    }
    return peak;
}

int loom_pipe_cooldown_sends(const loom_pipe_stage_schedule *s, int chunks, int micro_batches,
                             unsigned char *cooldown) {
    memset(cooldown, 0, (size_t)chunks * (size_t)micro_batches);
    int last_forward = -1, count = 0;
    for (int i = 0; i < s->count; i++)
        if (s->actions[i].op == LOOM_PIPE_FORWARD) last_forward = i;
    for (int i = last_forward + 1; i < s->count; i++) {
        const loom_pipe_action *a = &s->actions[i];
        if (a->op != LOOM_PIPE_SEND_GRAD || a->micro_batch < 0 || a->micro_batch >= micro_batches ||
            a->chunk < 0 || a->chunk >= chunks)
            continue;
        cooldown[(size_t)a->chunk * (size_t)micro_batches + (size_t)a->micro_batch] = 1;
        count++;
    }
    return count;
}
