/*
 * schedule_order.c — the schedules beyond 1F1B (interleaved, zb-h1, zb-v), built in two steps:
 *
 *   1. A reference run: every rank executes compute actions (F, B, W or a whole backward) with
 *      unit durations (F = B = W = 1, a whole backward 2) and free links, on integer time. A
 *      rank either follows a fixed order (interleaved: Megatron's; zb-h1: 1F1B with deferred W)
 *      or, for zb-v, picks greedily whenever it is free: a ready B first (the critical path),
 *      then a ready F while its activations stay under 1F1B's peak (the later chunk first), then
 *      the oldest pending W.
 *   2. Communication placed by time: each rank's compute actions, its sends (at their
 *      producer's end) and its receives (at the sender's send time) sorted by (time, messages
 *      before compute, the message's identity). Both ends of a message give it the same key,
 *      which is what loom/parallel.h's contract needs.
 *
 * Not here: gpipe and 1f1b (schedule.c, written out directly), running a list (the executor),
 * timing one with real durations (simulate.c).
 */
#include "parallel_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A compute action of the reference run: op is FORWARD, BACKWARD, BACKWARD_INPUT or
 * BACKWARD_WEIGHT; stage is the virtual stage. */
typedef struct {
    loom_pipe_op op;
    int stage, mb;
    int64_t start, end;
} run_action;

typedef struct {
    const loom_pipe_shape *shape;
    int p, v, m, V;
    int split;         /* backward as B and W (zb-h1, zb-v) or whole */
    int64_t *f_end;    /* (V, m) when the forward of (stage, mb) ended, -1 before */
    int64_t *b_end;    /* (V, m) ... its B or whole backward */
    int64_t *w_end;    /* (V, m) ... its W (split only) */
    run_action **done; /* (p,) compute actions each rank ran, in order */
    int *done_count;   /* (p,) */
    int *in_flight;    /* (p,) chunk activations held: F done, W (or backward) not yet */
    int *cursor;       /* (3, V) the lowest micro-batch whose F, B, W is not started yet */
    /* fixed orders (interleaved, zb-h1): order[r][i], next[r] */
    run_action **order;
    int *order_count, *next;
} reference_run;

static int64_t *cell(int64_t *table, const reference_run *run, int stage, int mb) {
    return &table[(size_t)stage * (size_t)run->m + (size_t)mb];
}

static int64_t duration(loom_pipe_op op) {
    return op == LOOM_PIPE_BACKWARD ? 2 : 1;
}

/* Whether compute action (op, stage, mb) may start at time t: its inputs are in hand. */
static int ready(reference_run *run, loom_pipe_op op, int stage, int mb, int64_t t) {
    int64_t f = *cell(run->f_end, run, stage, mb), b = *cell(run->b_end, run, stage, mb);
    switch (op) {
    case LOOM_PIPE_FORWARD:
        if (f >= 0) return 0;
        return stage == 0 || (*cell(run->f_end, run, stage - 1, mb) >= 0 &&
                              *cell(run->f_end, run, stage - 1, mb) <= t);
    case LOOM_PIPE_BACKWARD:
    case LOOM_PIPE_BACKWARD_INPUT:
        if (b >= 0 || f < 0 || f > t) return 0;
        return stage == run->V - 1 || (*cell(run->b_end, run, stage + 1, mb) >= 0 &&
                                       *cell(run->b_end, run, stage + 1, mb) <= t);
    case LOOM_PIPE_BACKWARD_WEIGHT:
        return *cell(run->w_end, run, stage, mb) < 0 && b >= 0 && b <= t;
    default:
        return 0;
    }
}

static void start(reference_run *run, int rank, loom_pipe_op op, int stage, int mb, int64_t t) {
    int64_t end = t + duration(op);
    if (op == LOOM_PIPE_FORWARD) *cell(run->f_end, run, stage, mb) = end, run->in_flight[rank]++;
    if (op == LOOM_PIPE_BACKWARD || op == LOOM_PIPE_BACKWARD_INPUT)
        *cell(run->b_end, run, stage, mb) = end;
    if (op == LOOM_PIPE_BACKWARD_WEIGHT) *cell(run->w_end, run, stage, mb) = end;
    if (op == LOOM_PIPE_BACKWARD || op == LOOM_PIPE_BACKWARD_WEIGHT) run->in_flight[rank]--;
    run->done[rank][run->done_count[rank]++] = (run_action){op, stage, mb, t, end};
}

/* ---- fixed orders --------------------------------------------------------------------------- */

static void push_order(reference_run *run, int rank, loom_pipe_op op, int stage, int mb) {
    run->order[rank][run->order_count[rank]++] = (run_action){op, stage, mb, 0, 0};
}

/* Megatron's interleaved 1F1B on rank r: virtual micro-batch k (0 .. m v - 1) is micro-batch
 * (k / (p v)) p + k mod p of chunk (k / p) mod v going forward, of chunk v - 1 - that going
 * backward. Warm-up: (p - r - 1) 2 + (v - 1) p forwards (all of them when m == p), then one
 * forward and one backward at a time, then the remaining backwards. */
static void order_interleaved(reference_run *run, int r) {
    int p = run->p, v = run->v, total = run->m * v;
    int warmup = run->m == p ? total : (p - r - 1) * 2 + (v - 1) * p;
    if (warmup > total) warmup = total;
    for (int k = 0, b = 0; k < total || b < total;) {
        int forward = k < total && (k < warmup || k - warmup <= b);
        int j = forward ? k++ : b++;
        int chunk = (j / p) % v, mb = (j / (p * v)) * p + j % p;
        if (!forward) chunk = v - 1 - chunk;
        push_order(run, r, forward ? LOOM_PIPE_FORWARD : LOOM_PIPE_BACKWARD,
                   loom_pipe_stage(run->shape, r, chunk), mb);
    }
}

/* ZB-H1 on stage i: 1F1B's warm-up w = min(p - i - 1, m) forwards, then F, B and — from the
 * (i+1)-th round on — the oldest deferred W; then each remaining B with the oldest W; then the
 * W's left. Stage i defers i W passes: p micro-batches in flight on every stage. */
static void order_zb_h1(reference_run *run, int i) {
    int p = run->p, m = run->m, w = p - i - 1 < m ? p - i - 1 : m, next_w = 0;
    for (int mb = 0; mb < w; mb++) push_order(run, i, LOOM_PIPE_FORWARD, i, mb);
    for (int k = 0; k < m - w; k++) {
        push_order(run, i, LOOM_PIPE_FORWARD, i, w + k);
        push_order(run, i, LOOM_PIPE_BACKWARD_INPUT, i, k);
        if (k >= i) push_order(run, i, LOOM_PIPE_BACKWARD_WEIGHT, i, next_w++);
    }
    for (int k = m - w; k < m; k++) {
        push_order(run, i, LOOM_PIPE_BACKWARD_INPUT, i, k);
        push_order(run, i, LOOM_PIPE_BACKWARD_WEIGHT, i, next_w++);
    }
    while (next_w < m) push_order(run, i, LOOM_PIPE_BACKWARD_WEIGHT, i, next_w++);
}

/* ---- zb-v's greedy choice ------------------------------------------------------------------- */

/* The lowest micro-batch of (kind: 0 F, 1 B, 2 W; stage) not started yet, advanced past the
 * started ones. Each kind runs its micro-batches in order on a stage and becomes ready in that
 * order too (F after the stage below's F, B after the stage above's B, W after its own B, each in
 * micro-batch order), so the lowest one not started is the only candidate to look at. */
static int next_mb(reference_run *run, int kind, int stage) {
    int *c = &run->cursor[(size_t)kind * (size_t)run->V + (size_t)stage];
    int64_t *table = kind == 0 ? run->f_end : kind == 1 ? run->b_end : run->w_end;
    while (*c < run->m && *cell(table, run, stage, *c) >= 0) (*c)++;
    return *c;
}

/* The rank's next action at time t, or 0 when nothing may start: a ready B (the lowest
 * micro-batch, the later stage on a tie), else a ready F while the rank holds fewer than 1F1B's
 * peak of chunk activations (the later stage first), else a W (the lowest micro-batch, the later
 * stage on a tie). */
static int choose_greedy(reference_run *run, int rank, int64_t t, run_action *out) {
    int stages[2] = {loom_pipe_stage(run->shape, rank, 1), loom_pipe_stage(run->shape, rank, 0)};
    int cap = 2 * run->p; /* p micro-batches of a whole stage = 2p chunks */
    static const loom_pipe_op ops[3] = {LOOM_PIPE_FORWARD, LOOM_PIPE_BACKWARD_INPUT,
                                        LOOM_PIPE_BACKWARD_WEIGHT};
    static const int order[3] = {1, 0, 2}; /* B, then F, then W */
    for (int o = 0; o < 3; o++) {
        int kind = order[o];
        if (kind == 0 && run->in_flight[rank] >= cap) continue;
        int best_stage = -1, best_mb = run->m;
        for (int c = 0; c < 2; c++) {
            int mb = next_mb(run, kind, stages[c]);
            if (mb < run->m && ready(run, ops[kind], stages[c], mb, t)) {
                /* F: the later stage first; B and W: the lowest micro-batch, then the later */
                if (kind == 0 ? best_stage < 0 : mb < best_mb) best_stage = stages[c], best_mb = mb;
            }
        }
        if (best_stage >= 0) {
            *out = (run_action){ops[kind], best_stage, best_mb, t, 0};
            return 1;
        }
    }
    return 0;
}

/* ---- the reference run ---------------------------------------------------------------------- */

static loom_status run_reference(reference_run *run) {
    int p = run->p, per_rank = run->m * run->v * (run->split ? 3 : 2);
    int64_t *busy = loom_calloc((size_t)p, sizeof *busy, "schedule reference run");
    if (!busy) return LOOM_ERR_NOMEM;
    int64_t horizon = (int64_t)per_rank * p * 2 + 2; /* far past any schedule's end */
    int left = per_rank * p;
    for (int64_t t = 0; left > 0 && t <= horizon; t++) {
        for (int r = 0; r < p; r++) {
            if (busy[r] > t || run->done_count[r] == per_rank) continue;
            run_action a;
            int go;
            if (run->order) {
                a = run->order[r][run->next[r]];
                go = ready(run, a.op, a.stage, a.mb, t);
                if (go) run->next[r]++;
            } else {
                go = choose_greedy(run, r, t, &a);
            }
            if (!go) continue;
            start(run, r, a.op, a.stage, a.mb, t);
            busy[r] = t + duration(a.op);
            left--;
        }
    }
    free(busy);
    if (left > 0) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "pipeline schedule %s (p %d, v %d, m %d): the reference run did not "
                         "finish (%d actions left); a builder bug",
                         loom_schedule_kind_name(run->shape->kind), p, run->v, run->m, left);
    }
    return LOOM_OK;
}

/* ---- placing communication ------------------------------------------------------------------ */

typedef struct {
    int64_t time;
    int compute; /* 0: a message, 1: compute (after the messages of the same time) */
    int64_t id;  /* a message's identity, the same on both ends; a compute action's position */
    loom_pipe_action action;
} keyed_action;

static int compare_keyed(const void *pa, const void *pb) {
    const keyed_action *a = pa, *b = pb;
    if (a->time != b->time) return a->time < b->time ? -1 : 1;
    if (a->compute != b->compute) return a->compute - b->compute;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* kind 0: the activation from stage s to s + 1; 1: the gradient from s + 1 to s. */
static int64_t message_id(const reference_run *run, int kind, int boundary, int mb) {
    return ((int64_t)kind * run->V + boundary) * run->m + mb;
}

static loom_status place(const reference_run *run, int rank, loom_pipe_stage_schedule *out) {
    int count = run->done_count[rank], V = run->V;
    keyed_action *items = loom_calloc((size_t)count * 3, sizeof *items, "pipeline schedule");
    if (!items) return LOOM_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < count; i++) {
        run_action a = run->done[rank][i];
        int s = a.stage, chunk, other;
        loom_pipe_place(run->shape, s, &other, &chunk);
        int below = -1, above = -1; /* ranks of the neighbouring stages, if remote */
        if (s > 0) loom_pipe_place(run->shape, s - 1, &below, &other);
        if (s < V - 1) loom_pipe_place(run->shape, s + 1, &above, &other);
        if (below == rank) below = -1;
        if (above == rank) above = -1;
        items[n++] = (keyed_action){a.start, 1, i, {a.op, a.mb, chunk}};
        if (a.op == LOOM_PIPE_FORWARD) {
            if (below >= 0) {
                int64_t sent = *cell(run->f_end, run, s - 1, a.mb);
                items[n++] = (keyed_action){
                    sent, 0, message_id(run, 0, s - 1, a.mb), {LOOM_PIPE_RECV_ACT, a.mb, chunk}};
            }
            if (above >= 0) {
                items[n++] = (keyed_action){
                    a.end, 0, message_id(run, 0, s, a.mb), {LOOM_PIPE_SEND_ACT, a.mb, chunk}};
            }
        } else if (a.op != LOOM_PIPE_BACKWARD_WEIGHT) {
            if (above >= 0) {
                int64_t sent = *cell(run->b_end, run, s + 1, a.mb);
                items[n++] = (keyed_action){
                    sent, 0, message_id(run, 1, s, a.mb), {LOOM_PIPE_RECV_GRAD, a.mb, chunk}};
            }
            if (below >= 0) {
                items[n++] = (keyed_action){
                    a.end, 0, message_id(run, 1, s - 1, a.mb), {LOOM_PIPE_SEND_GRAD, a.mb, chunk}};
            }
        }
    }
    qsort(items, (size_t)n, sizeof *items, compare_keyed);
    out->actions = loom_malloc((size_t)n * sizeof *out->actions + 1, "pipeline schedule");
    if (!out->actions) {
        free(items);
        return LOOM_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) out->actions[i] = items[i].action;
    out->count = n;
    free(items);
    return LOOM_OK;
}

/* ---- the entry point ------------------------------------------------------------------------ */

static void free_run(reference_run *run) {
    for (int r = 0; r < run->p; r++) {
        if (run->done) free(run->done[r]);
        if (run->order) free(run->order[r]);
    }
    free(run->f_end), free(run->b_end), free(run->w_end), free(run->done), free(run->done_count);
    free(run->in_flight), free(run->order), free(run->order_count), free(run->next);
    free(run->cursor);
}

loom_status loom_pipe_schedule_ordered(const loom_pipe_shape *shape, int first, int count,
                                       loom_pipe_stage_schedule *out) {
    reference_run run = {
        .shape = shape, .p = shape->ranks, .v = shape->chunks, .m = shape->micro_batches};
    run.V = run.p * run.v;
    run.split = shape->kind != LOOM_SCHEDULE_INTERLEAVED;
    size_t cells = (size_t)run.V * (size_t)run.m, p = (size_t)run.p;
    size_t per_rank = (size_t)run.m * (size_t)run.v * 3;
    run.f_end = loom_malloc(cells * sizeof(int64_t), "schedule reference run");
    run.b_end = loom_malloc(cells * sizeof(int64_t), "schedule reference run");
    run.w_end = loom_malloc(cells * sizeof(int64_t), "schedule reference run");
    run.done = loom_calloc(p, sizeof(run_action *), "schedule reference run");
    run.done_count = loom_calloc(p, sizeof(int), "schedule reference run");
    run.in_flight = loom_calloc(p, sizeof(int), "schedule reference run");
    run.cursor = loom_calloc((size_t)run.V * 3, sizeof(int), "schedule reference run");
    int fixed = shape->kind != LOOM_SCHEDULE_ZB_V;
    if (fixed) {
        run.order = loom_calloc(p, sizeof(run_action *), "schedule reference run");
        run.order_count = loom_calloc(p, sizeof(int), "schedule reference run");
        run.next = loom_calloc(p, sizeof(int), "schedule reference run");
    }
    loom_status st = LOOM_OK;
    if (!run.f_end || !run.b_end || !run.w_end || !run.done || !run.done_count || !run.in_flight ||
        !run.cursor || (fixed && (!run.order || !run.order_count || !run.next))) {
        st = LOOM_ERR_NOMEM;
    }
    for (size_t r = 0; r < p && st == LOOM_OK; r++) {
        run.done[r] = loom_malloc(per_rank * sizeof(run_action), "schedule reference run");
        if (fixed) run.order[r] = loom_malloc(per_rank * sizeof(run_action), "schedule order");
        if (!run.done[r] || (fixed && !run.order[r])) st = LOOM_ERR_NOMEM;
    }
    if (st == LOOM_OK) {
        for (size_t i = 0; i < cells; i++) run.f_end[i] = run.b_end[i] = run.w_end[i] = -1;
        for (int r = 0; fixed && r < run.p; r++) {
            if (shape->kind == LOOM_SCHEDULE_INTERLEAVED)
                order_interleaved(&run, r);
            else
                order_zb_h1(&run, r);
        }
        st = run_reference(&run);
    }
    for (int i = 0; i < count && st == LOOM_OK; i++) st = place(&run, first + i, &out[i]);
    free_run(&run);
    return st;
}
