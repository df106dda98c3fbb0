/*
 * simulate.c — the pipeline schedule simulator: times one step of p ranks walking their
 * schedules together (forward pass over the actions as the executor would run them), then finds
 * each action's and each message's slack by a backward pass from the makespan. The semantics
 * are stated in loom/parallel.h. Ranks are called stages here, as they are without virtual
 * stages; durations and links are per virtual stage.
 *
 * Not here: where the durations come from (the planner's cost model, or a trace), choosing what
 * to compress, rendezvous (synchronous) sends, contention between messages on one link.
 */
#include "loom/parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int stage, index;
} action_ref;

/* Scratch of one simulation. Every action has a flat index, first[stage] + index. */
typedef struct {
    const loom_pipe_shape *shape;              /* borrowed */
    const loom_pipe_stage_schedule *schedules; /* (p,) borrowed */
    const loom_pipe_sim_times *times;          /* borrowed */
    int stages;                                /* p */
    int64_t total;                             /* actions over all stages */
    int64_t *first;                            /* (p + 1,) */
    int *partner;          /* (total,) a message's other end: its index in the peer stage's list */
    int *peer;             /* (total,) a message's other stage, else -1 */
    action_ref *order;     /* (total,) actions in the order they ran: a topological order */
    double *latest_end;    /* (total,) the backward pass's latest allowed end times */
    int *pc, *queued;      /* (p,) each stage's next action; 1 while it is on the ready stack */
    int *ready, ready_top; /* (p,) stack of stages that may be able to run */
    loom_pipe_sim_result *result;
} simulation;

static int is_send(loom_pipe_op op) {
    return op == LOOM_PIPE_SEND_ACT || op == LOOM_PIPE_SEND_GRAD;
}

static int is_receive(loom_pipe_op op) {
    return op == LOOM_PIPE_RECV_ACT || op == LOOM_PIPE_RECV_GRAD;
}

/* The virtual-stage boundary a send or receive on stage s crosses: boundary b joins virtual
 * stages b and b + 1. */
static int boundary_of(const simulation *sim, int s, loom_pipe_action a) {
    int up = a.op == LOOM_PIPE_SEND_ACT || a.op == LOOM_PIPE_RECV_GRAD;
    return loom_pipe_stage(sim->shape, s, a.chunk) - (up ? 0 : 1);
}

/* Transfer time of the message a send or receive on stage s moves. */
static double link_time(const simulation *sim, int s, loom_pipe_action a) {
    int gradient = a.op == LOOM_PIPE_SEND_GRAD || a.op == LOOM_PIPE_RECV_GRAD;
    int boundary = boundary_of(sim, s, a);
    if (gradient && sim->times->grad_link_mb_s) { /* the sender is virtual stage boundary + 1 */
        size_t m = (size_t)sim->shape->micro_batches;
        return sim->times->grad_link_mb_s[(size_t)(boundary + 1) * m + (size_t)a.micro_batch];
    }
    return (gradient ? sim->times->grad_link_s : sim->times->act_link_s)[boundary];
}

/* How long the action keeps its stage busy once the stage reaches it (a receive: once its
 * message is in hand). */
static double compute_time(const simulation *sim, int s, loom_pipe_action a) {
    int v = loom_pipe_stage(sim->shape, s, a.chunk);
    const loom_pipe_sim_times *t = sim->times;
    switch (a.op) {
    case LOOM_PIPE_RECV_ACT:
        return t->act_recv_s ? t->act_recv_s[boundary_of(sim, s, a)] : 0.0;
    case LOOM_PIPE_RECV_GRAD:
        return t->grad_recv_s ? t->grad_recv_s[boundary_of(sim, s, a)] : 0.0;
    case LOOM_PIPE_FORWARD:
        return t->forward_s[v];
    case LOOM_PIPE_BACKWARD:
        return t->backward_s[v];
    case LOOM_PIPE_BACKWARD_INPUT:
        return t->backward_input_s[v];
    case LOOM_PIPE_BACKWARD_WEIGHT:
        return t->backward_weight_s[v];
    default:
        return 0.0;
    }
}

static loom_pipe_sim_action *result_at(const simulation *sim, int s, int i) {
    return &sim->result->stage[s][i];
}

/* ---- checking the input --------------------------------------------------------------------- */

static loom_status check_time_array(const double *values, int count, const char *name) {
    if (count > 0 && !values) {
        return loom_fail(LOOM_ERR_INPUT, "pipeline simulation: %s is NULL, expected %d times", name,
                         count);
    }
    for (int i = 0; i < count; i++) {
        if (!(values[i] >= 0.0) || isinf(values[i])) {
            return loom_fail(LOOM_ERR_INPUT,
                             "pipeline simulation: %s[%d] = %g, expected a finite time >= 0", name,
                             i, values[i]);
        }
    }
    return LOOM_OK;
}

/* The durations for V virtual stages and m micro-batches; the split backward's arrays only when
 * some list uses BACKWARD_INPUT (split[0]) or BACKWARD_WEIGHT (split[1]). */
static loom_status check_times(const loom_pipe_sim_times *t, int stages, int m,
                               const int split[2]) {
    if (t->stages != stages) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline simulation: times.stages = %d, expected %d (one per virtual "
                         "stage)",
                         t->stages, stages);
    }
    if (t->links != stages - 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline simulation: times.links = %d, expected %d for %d stages",
                         t->links, stages - 1, stages);
    }
    loom_status st = check_time_array(t->forward_s, t->stages, "forward_s");
    if (st == LOOM_OK) st = check_time_array(t->backward_s, t->stages, "backward_s");
    if (st == LOOM_OK) st = check_time_array(t->act_link_s, t->links, "act_link_s");
    if (st == LOOM_OK) st = check_time_array(t->grad_link_s, t->links, "grad_link_s");
    if (st == LOOM_OK && (split[0] || t->backward_input_s))
        st = check_time_array(t->backward_input_s, t->stages, "backward_input_s");
    if (st == LOOM_OK && (split[1] || t->backward_weight_s))
        st = check_time_array(t->backward_weight_s, t->stages, "backward_weight_s");
    if (st == LOOM_OK && t->grad_link_mb_s)
        st = check_time_array(t->grad_link_mb_s, t->stages * m, "grad_link_mb_s");
    if (st == LOOM_OK && t->act_recv_s)
        st = check_time_array(t->act_recv_s, t->links, "act_recv_s");
    if (st == LOOM_OK && t->grad_recv_s)
        st = check_time_array(t->grad_recv_s, t->links, "grad_recv_s");
    return st;
}

/* Every action in range; messages between two different stages; records each message's peer
 * and which split-backward ops occur. */
static loom_status check_lists(const loom_pipe_stage_schedule *schedules, int stages) {
    for (int s = 0; s < stages; s++) {
        const loom_pipe_stage_schedule *sched = &schedules[s];
        if (sched->count < 0 || (sched->count > 0 && !sched->actions)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "pipeline simulation: stage %d: %d actions at %p, expected a count "
                             ">= 0 and a list",
                             s, sched->count, (const void *)sched->actions);
        }
    }
    return LOOM_OK;
}

static loom_status check_actions(simulation *sim, int split[2]) {
    for (int s = 0; s < sim->stages; s++) {
        const loom_pipe_stage_schedule *sched = &sim->schedules[s];
        for (int i = 0; i < sched->count; i++) {
            loom_pipe_action a = sched->actions[i];
            if ((int)a.op < 0 || (int)a.op >= LOOM_PIPE_NUM_OPS) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "pipeline simulation: stage %d action %d: op %d out of range", s,
                                 i, (int)a.op);
            }
            if (a.micro_batch < 0 || a.chunk < 0 || a.chunk >= sim->shape->chunks) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "pipeline simulation: stage %d action %d: micro-batch %d, chunk "
                                 "%d, expected >= 0 and a chunk below %d",
                                 s, i, a.micro_batch, a.chunk, sim->shape->chunks);
            }
            split[0] |= a.op == LOOM_PIPE_BACKWARD_INPUT;
            split[1] |= a.op == LOOM_PIPE_BACKWARD_WEIGHT;
            int message = is_send(a.op) || is_receive(a.op);
            int peer = loom_pipe_peer(sim->shape, s, a);
            sim->peer[sim->first[s] + i] = peer;
            if (message && peer < 0) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "pipeline simulation: stage %d action %d: %s across the end of "
                                 "a %d-stage pipeline",
                                 s, i, loom_pipe_op_name(a.op),
                                 loom_pipe_virtual_stages(sim->shape));
            }
            if (message && peer == s) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "pipeline simulation: stage %d action %d: %s to its own stage "
                                 "(a hand-over inside a rank has no action)",
                                 s, i, loom_pipe_op_name(a.op));
            }
        }
    }
    return LOOM_OK;
}

/* Whether action i of stage s is a send_op to stage `to` (or a recv_op from it). */
static int is_message(const simulation *sim, int s, int i, loom_pipe_op op, int to) {
    return sim->schedules[s].actions[i].op == op && sim->peer[sim->first[s] + i] == to;
}

/* Pairs the k-th send_op on stage `from` to stage `to` with the k-th recv_op on `to` from
 * `from` (MPI's order for one source and tag) and checks that both are the same micro-batch and
 * boundary. */
static loom_status pair_messages(simulation *sim, int from, loom_pipe_op send_op, int to,
                                 loom_pipe_op recv_op) {
    const loom_pipe_stage_schedule *sender = &sim->schedules[from], *receiver = &sim->schedules[to];
    const char *kind = send_op == LOOM_PIPE_SEND_ACT ? "activation" : "gradient";
    int i = 0, j = 0;
    for (int k = 0;; k++, i++, j++) {
        while (i < sender->count && !is_message(sim, from, i, send_op, to)) i++;
        while (j < receiver->count && !is_message(sim, to, j, recv_op, from)) j++;
        if (i == sender->count && j == receiver->count) return LOOM_OK;
        if (i == sender->count || j == receiver->count) {
            int missing_on = i == sender->count ? from : to;
            int s = i == sender->count ? to : from, at = i == sender->count ? j : i;
            loom_pipe_action a = sim->schedules[s].actions[at];
            return loom_fail(LOOM_ERR_INPUT,
                             "pipeline simulation: stages %d -> %d: %s message %d (stage %d "
                             "action %d, %s of micro-batch %d) has no partner on stage %d",
                             from, to, kind, k, s, at, loom_pipe_op_name(a.op), a.micro_batch,
                             missing_on);
        }
        loom_pipe_action sent = sender->actions[i], received = receiver->actions[j];
        int b_sent = boundary_of(sim, from, sent), b_received = boundary_of(sim, to, received);
        if (sent.micro_batch != received.micro_batch || b_sent != b_received) {
            return loom_fail(LOOM_ERR_INPUT,
                             "pipeline simulation: stages %d -> %d: %s message %d is micro-batch "
                             "%d across boundary %d on stage %d (action %d) but micro-batch %d "
                             "across boundary %d on stage %d (action %d)",
                             from, to, kind, k, sent.micro_batch, b_sent, from, i,
                             received.micro_batch, b_received, to, j);
        }
        sim->partner[sim->first[from] + i] = j;
        sim->partner[sim->first[to] + j] = i;
    }
}

/* ---- forward pass: run the step ------------------------------------------------------------- */

static void make_ready(simulation *sim, int s) {
    if (sim->queued[s]) return;
    sim->queued[s] = 1;
    sim->ready[sim->ready_top++] = s;
}

/* Runs stage s until it finishes or reaches a receive whose message is not sent yet; the send,
 * when it runs, makes the stage ready again. Appends what ran to sim->order. */
static void run_stage(simulation *sim, int s, int64_t *ran) {
    const loom_pipe_stage_schedule *sched = &sim->schedules[s];
    for (; sim->pc[s] < sched->count; sim->pc[s]++) {
        int i = sim->pc[s];
        loom_pipe_action action = sched->actions[i];
        loom_pipe_op op = action.op;
        loom_pipe_sim_action *a = result_at(sim, s, i);
        a->start_s = i > 0 ? result_at(sim, s, i - 1)->end_s : 0.0;
        int peer = sim->peer[sim->first[s] + i], partner = sim->partner[sim->first[s] + i];
        if (is_receive(op)) {
            if (sim->pc[peer] <= partner) return; /* not sent yet */
            a->end_s = fmax(a->start_s, result_at(sim, peer, partner)->arrival_s) +
                       compute_time(sim, s, action);
        } else if (is_send(op)) {
            a->end_s = a->start_s;
            a->arrival_s = a->end_s + link_time(sim, s, action);
            if (sim->pc[peer] == partner) make_ready(sim, peer); /* it may be waiting for this */
        } else {
            a->end_s = a->start_s + compute_time(sim, s, action);
        }
        sim->order[(*ran)++] = (action_ref){s, i};
    }
}

/* Names every stage that did not finish and what it waits for. */
static loom_status deadlock(const simulation *sim) {
    char stuck[1024];
    size_t used = 0;
    for (int s = 0; s < sim->stages && used < sizeof stuck; s++) {
        int i = sim->pc[s];
        if (i == sim->schedules[s].count) continue;
        loom_pipe_action a = sim->schedules[s].actions[i];
        used += (size_t)snprintf(
            stuck + used, sizeof stuck - used,
            "%sstage %d waits at action %d (%s of micro-batch %d) for stage %d", used ? "; " : "",
            s, i, loom_pipe_op_name(a.op), a.micro_batch, sim->peer[sim->first[s] + i]);
    }
    return loom_fail(LOOM_ERR_INPUT,
                     "pipeline simulation: deadlock, the schedules cannot finish: %s", stuck);
}

/* Earliest times: every stage runs as far as it can, in any order (the times do not depend on
 * it); a stage that stops at a receive is resumed by the matching send. */
static loom_status run_forward(simulation *sim) {
    for (int s = sim->stages - 1; s >= 0; s--) make_ready(sim, s);
    int64_t ran = 0;
    while (sim->ready_top > 0) {
        int s = sim->ready[--sim->ready_top];
        sim->queued[s] = 0;
        run_stage(sim, s, &ran);
    }
    if (ran < sim->total) return deadlock(sim);
    double makespan = 0.0;
    for (int s = 0; s < sim->stages; s++) {
        int count = sim->schedules[s].count;
        if (count > 0) makespan = fmax(makespan, result_at(sim, s, count - 1)->end_s);
    }
    sim->result->makespan_s = makespan;
    return LOOM_OK;
}

/* ---- backward pass: latest times and slack -------------------------------------------------- */

/* In reverse of the order the actions ran, so that both successors of an action (the next one on
 * its stage; for a send, its receive) are done before it. An action must end early enough for
 * its successors to end by their latest: the next on the stage needs its compute time after it,
 * a receive needs the message to arrive by the receive's latest end. */
static void run_backward(simulation *sim) {
    double makespan = sim->result->makespan_s, zero = LOOM_PIPE_SIM_TOLERANCE * makespan;
    for (int64_t n = sim->total - 1; n >= 0; n--) {
        int s = sim->order[n].stage, i = sim->order[n].index;
        int64_t flat = sim->first[s] + i;
        loom_pipe_action action = sim->schedules[s].actions[i];
        loom_pipe_sim_action *a = result_at(sim, s, i);
        double latest = makespan;
        if (i + 1 < sim->schedules[s].count) {
            loom_pipe_action next = sim->schedules[s].actions[i + 1];
            latest = fmin(latest, sim->latest_end[flat + 1] - compute_time(sim, s, next));
        }
        if (is_send(action.op)) {
            int peer = sim->peer[flat], partner = sim->partner[flat];
            double latest_arrival = sim->latest_end[sim->first[peer] + partner] -
                                    compute_time(sim, peer, sim->schedules[peer].actions[partner]);
            a->message_slack_s = fmax(0.0, latest_arrival - a->arrival_s);
            latest = fmin(latest, latest_arrival - link_time(sim, s, action));
        }
        sim->latest_end[flat] = latest;
        a->slack_s = fmax(0.0, latest - a->end_s);
        a->critical = a->slack_s <= zero;
    }
}

/* ---- the API -------------------------------------------------------------------------------- */

static loom_status allocate(simulation *sim, loom_pipe_sim_result *out) {
    int p = sim->stages;
    sim->first = loom_calloc((size_t)p + 1, sizeof *sim->first, "pipeline simulation");
    if (!sim->first) return LOOM_ERR_NOMEM;
    for (int s = 0; s < p; s++) sim->first[s + 1] = sim->first[s] + sim->schedules[s].count;
    sim->total = sim->first[p];
    size_t total = (size_t)sim->total + 1; /* + 1: no zero-sized allocations */
    sim->partner = loom_calloc(total, sizeof *sim->partner, "pipeline simulation");
    sim->peer = loom_calloc(total, sizeof *sim->peer, "pipeline simulation");
    sim->order = loom_calloc(total, sizeof *sim->order, "pipeline simulation");
    sim->latest_end = loom_calloc(total, sizeof *sim->latest_end, "pipeline simulation");
    sim->pc = loom_calloc((size_t)p, sizeof *sim->pc, "pipeline simulation");
    sim->queued = loom_calloc((size_t)p, sizeof *sim->queued, "pipeline simulation");
    sim->ready = loom_calloc((size_t)p, sizeof *sim->ready, "pipeline simulation");
    out->stage =
        loom_calloc((size_t)p, sizeof(loom_pipe_sim_action *), "pipeline simulation result");
    out->memory = loom_calloc(total, sizeof *out->memory, "pipeline simulation result");
    if (!sim->partner || !sim->peer || !sim->order || !sim->latest_end || !sim->pc ||
        !sim->queued || !sim->ready || !out->stage || !out->memory) {
        return LOOM_ERR_NOMEM;
    }
    out->ranks = p;
    for (int s = 0; s < p; s++) out->stage[s] = out->memory + sim->first[s];
    return LOOM_OK;
}

static void free_scratch(simulation *sim) {
    free(sim->first);
    free(sim->partner);
    free(sim->peer);
    free(sim->order);
    free(sim->latest_end);
    free(sim->pc);
    free(sim->queued);
    free(sim->ready);
}

loom_status loom_pipe_simulate(const loom_pipe_shape *shape,
                               const loom_pipe_stage_schedule *schedules,
                               const loom_pipe_sim_times *times, loom_pipe_sim_result *out) {
    if (!out) return loom_fail(LOOM_ERR_INPUT, "pipeline simulation: no output given");
    memset(out, 0, sizeof *out);
    if (!schedules || !times) {
        return loom_fail(LOOM_ERR_INPUT, "pipeline simulation: %s is NULL",
                         !schedules ? "schedules" : "times");
    }
    loom_status st = loom_pipe_shape_check(shape);
    if (st != LOOM_OK) return st;

    simulation sim = {.shape = shape,
                      .schedules = schedules,
                      .times = times,
                      .stages = shape->ranks,
                      .result = out};
    int split[2] = {0, 0};
    st = check_lists(schedules, sim.stages);
    if (st == LOOM_OK) st = allocate(&sim, out);
    if (st == LOOM_OK) st = check_actions(&sim, split);
    if (st == LOOM_OK)
        st = check_times(times, loom_pipe_virtual_stages(shape), shape->micro_batches, split);
    /* pair the messages of every two ranks that have any between them: the ranks a rank's own
     * messages name, both directions (the few there are, not every pair of ranks) */
    for (int a = 0; a < sim.stages && st == LOOM_OK; a++) {
        int peers[2 * LOOM_GPT_MAX_CHUNKS + 2], n = 0;
        for (int i = 0; i < schedules[a].count; i++) {
            int b = sim.peer[sim.first[a] + i], known = b < 0;
            for (int j = 0; j < n && !known; j++) known = peers[j] == b;
            if (!known && n < (int)(sizeof peers / sizeof *peers)) peers[n++] = b;
        }
        for (int j = 0; j < n && st == LOOM_OK; j++) {
            int b = peers[j];
            st = pair_messages(&sim, a, LOOM_PIPE_SEND_ACT, b, LOOM_PIPE_RECV_ACT);
            if (st == LOOM_OK)
                st = pair_messages(&sim, a, LOOM_PIPE_SEND_GRAD, b, LOOM_PIPE_RECV_GRAD);
            if (st == LOOM_OK)
                st = pair_messages(&sim, b, LOOM_PIPE_SEND_ACT, a, LOOM_PIPE_RECV_ACT);
            if (st == LOOM_OK)
                st = pair_messages(&sim, b, LOOM_PIPE_SEND_GRAD, a, LOOM_PIPE_RECV_GRAD);
        }
    }
    if (st == LOOM_OK) st = run_forward(&sim);
    if (st == LOOM_OK) run_backward(&sim);
    free_scratch(&sim);
    if (st != LOOM_OK) loom_pipe_sim_result_free(out);
    return st;
}

void loom_pipe_sim_result_free(loom_pipe_sim_result *result) {
    if (!result) return;
    free(result->stage);
    free(result->memory);
    memset(result, 0, sizeof *result);
}

/* ---- the slack compression policy ------------------------------------------------------------ */

loom_status loom_pipe_slack_choose(const loom_pipe_shape *shape,
                                   const loom_pipe_stage_schedule *schedules,
                                   const loom_pipe_sim_times *times, const double *saving_s,
                                   unsigned char *compress) {
    loom_pipe_sim_result result;
    loom_status st = loom_pipe_simulate(shape, schedules, times, &result);
    if (st != LOOM_OK) return st;
    int m = shape->micro_batches;
    memset(compress, 0, (size_t)loom_pipe_virtual_stages(shape) * (size_t)m);
    for (int r = 0; r < shape->ranks && result.stage; r++) {
        for (int i = 0; i < schedules[r].count; i++) {
            const loom_pipe_action *a = &schedules[r].actions[i];
            if (a->op != LOOM_PIPE_SEND_GRAD || a->micro_batch >= m) continue;
            int stage = loom_pipe_stage(shape, r, a->chunk);
            double saving = saving_s[stage - 1], slack = result.stage[r][i].message_slack_s;
            compress[(size_t)stage * (size_t)m + (size_t)a->micro_batch] =
                saving > 0 && slack < saving;
        }
    }
    loom_pipe_sim_result_free(&result);
    return LOOM_OK;
}
