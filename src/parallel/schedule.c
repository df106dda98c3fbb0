/*
 * schedule.c — pipeline schedules as plain data: for one stage of p, the ordered list of
 * receives, forwards, sends and backwards it runs for m micro-batches, under GPipe or 1F1B
 * (PipeDream-Flush, Megatron's non-interleaved schedule). The ordering rules and the contract
 * the executor relies on are in loom/parallel.h.
 *
 * Not here: running the list (the executor), any communication, interleaved or zero-bubble
 * schedules.
 */
#include "loom/parallel.h"

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
    b->actions[b->count].op = op;
    b->actions[b->count].micro_batch = micro_batch;
    b->count++;
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

loom_status loom_pipe_schedule(loom_schedule_kind kind, int stages, int micro_batches, int stage,
                               loom_pipe_stage_schedule *out) {
    if (!out) return loom_fail(LOOM_ERR_INPUT, "pipeline schedule: no output given");
    out->actions = NULL;
    out->count = 0;
    if (kind != LOOM_SCHEDULE_GPIPE && kind != LOOM_SCHEDULE_1F1B) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: unknown schedule kind %d; expected gpipe or 1f1b",
                         (int)kind);
    }
    if (stages < 1) {
        return loom_fail(LOOM_ERR_INPUT, "pipeline schedule: stages must be at least 1, got %d",
                         stages);
    }
    /* 6 actions per micro-batch at most; the count is an int */
    if (micro_batches < 1 || micro_batches > INT_MAX / 6) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: micro-batches must be in [1, %d], got %d", INT_MAX / 6,
                         micro_batches);
    }
    if (stage < 0 || stage >= stages) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline schedule: stage %d out of range, expected 0 <= stage < %d",
                         stage, stages);
    }

    schedule_builder b = {.is_first = stage == 0, .is_last = stage == stages - 1};
    int per_micro_batch = 2 + (b.is_first ? 0 : 2) + (b.is_last ? 0 : 2);
    size_t capacity = (size_t)per_micro_batch * (size_t)micro_batches;
    b.actions = loom_malloc(capacity * sizeof *b.actions, "pipeline schedule");
    if (!b.actions) return LOOM_ERR_NOMEM;

    if (kind == LOOM_SCHEDULE_GPIPE) {
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

void loom_pipe_schedule_free(loom_pipe_stage_schedule *s) {
    if (!s) return;
    free(s->actions);
    s->actions = NULL;
    s->count = 0;
}

loom_status loom_schedule_kind_parse(const char *name, loom_schedule_kind *kind) {
    if (name && strcmp(name, "gpipe") == 0) {
        *kind = LOOM_SCHEDULE_GPIPE;
        return LOOM_OK;
    }
    if (name && strcmp(name, "1f1b") == 0) {
        *kind = LOOM_SCHEDULE_1F1B;
        return LOOM_OK;
    }
    return loom_fail(LOOM_ERR_INPUT,
                     "pipeline schedule: unknown schedule \"%s\"; expected \"gpipe\" or \"1f1b\"",
                     name ? name : "(null)");
}

const char *loom_schedule_kind_name(loom_schedule_kind kind) {
    switch (kind) {
    case LOOM_SCHEDULE_GPIPE:
        return "gpipe";
    case LOOM_SCHEDULE_1F1B:
        return "1f1b";
    }
    return "?";
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
    }
    return "?";
}

int loom_pipe_peak_in_flight(const loom_pipe_stage_schedule *s) {
    int in_flight = 0, peak = 0;
    for (int i = 0; i < s->count; i++) {
        if (s->actions[i].op == LOOM_PIPE_FORWARD) {
            in_flight++;
            if (in_flight > peak) peak = in_flight;
        } else if (s->actions[i].op == LOOM_PIPE_BACKWARD) {
            in_flight--;
        }
    }
    return peak;
}

int loom_pipe_cooldown_sends(const loom_pipe_stage_schedule *s, int micro_batches,
                             unsigned char *cooldown) {
    memset(cooldown, 0, (size_t)micro_batches);
    int last_forward = -1, count = 0;
    for (int i = 0; i < s->count; i++)
        if (s->actions[i].op == LOOM_PIPE_FORWARD) last_forward = i;
    for (int i = last_forward + 1; i < s->count; i++) {
        const loom_pipe_action *a = &s->actions[i];
        if (a->op != LOOM_PIPE_SEND_GRAD || a->micro_batch < 0 || a->micro_batch >= micro_batches)
            continue;
        cooldown[a->micro_batch] = 1;
        count++;
    }
    return count;
}
