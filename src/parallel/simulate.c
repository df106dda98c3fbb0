/*
 * simulate.c — the pipeline schedule simulator: times one step of p stages walking their
 * schedules together (forward pass over the actions as the executor would run them), then finds
 * each action's and each message's slack by a backward pass from the makespan. The semantics
 * are stated in loom/parallel.h.
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
    const loom_pipe_stage_schedule *schedules; /* (p,) borrowed */
    const loom_pipe_sim_times *times;          /* borrowed */
    int stages;                                /* p */
    int64_t total;                             /* actions over all stages */
    int64_t *first;                            /* (p + 1,) */
    int *partner;          /* (total,) a message's other end: its index in the peer stage's list */
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

/* The stage at the other end of a message action on stage s. */
static int peer_of(int s, loom_pipe_op op) {
    return op == LOOM_PIPE_SEND_ACT || op == LOOM_PIPE_RECV_GRAD ? s + 1 : s - 1;
}

/* Transfer time of the message a send or receive on stage s moves. Link l joins l and l + 1. */
static double link_time(const simulation *sim, int s, loom_pipe_op op) {
    int link = op == LOOM_PIPE_SEND_ACT || op == LOOM_PIPE_RECV_GRAD ? s : s - 1;
    int gradient = op == LOOM_PIPE_SEND_GRAD || op == LOOM_PIPE_RECV_GRAD;
    return (gradient ? sim->times->grad_link_s : sim->times->act_link_s)[link];
}

/* How long the action keeps its stage busy once the stage reaches it, receives aside. */
static double compute_time(const simulation *sim, int s, loom_pipe_op op) {
    if (op == LOOM_PIPE_FORWARD) return sim->times->forward_s[s];
    if (op == LOOM_PIPE_BACKWARD) return sim->times->backward_s[s];
    return 0.0;
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

static loom_status check_times(const loom_pipe_sim_times *t, int stages) {
    if (t->stages != stages) {
        return loom_fail(LOOM_ERR_INPUT,
                         "pipeline simulation: times.stages = %d, expected %d (one per schedule)",
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
    return st;
}

static loom_status check_actions(const loom_pipe_stage_schedule *schedules, int stages) {
    for (int s = 0; s < stages; s++) {
        const loom_pipe_stage_schedule *sched = &schedules[s];
        if (sched->count < 0 || (sched->count > 0 && !sched->actions)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "pipeline simulation: stage %d: %d actions at %p, expected a count "
                             ">= 0 and a list",
                             s, sched->count, (const void *)sched->actions);
        }
        for (int i = 0; i < sched->count; i++) {
            loom_pipe_action a = sched->actions[i];
            if ((int)a.op < LOOM_PIPE_RECV_ACT || (int)a.op > LOOM_PIPE_SEND_GRAD) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "pipeline simulation: stage %d action %d: op %d out of range", s,
                                 i, (int)a.op);
            }
            if (a.micro_batch < 0) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "pipeline simulation: stage %d action %d: micro-batch %d, "
                                 "expected >= 0",
                                 s, i, a.micro_batch);
            }
            int peer = peer_of(s, a.op);
            if ((is_send(a.op) || is_receive(a.op)) && (peer < 0 || peer >= stages)) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "pipeline simulation: stage %d action %d: %s across the end of "
                                 "a %d-stage pipeline",
                                 s, i, loom_pipe_op_name(a.op), stages);
            }
        }
    }
    return LOOM_OK;
}

/* Pairs the k-th send_op on stage `from` with the k-th recv_op on stage `to` (MPI's order for
 * one source and tag) and checks that both are the same micro-batch. */
static loom_status pair_messages(simulation *sim, int from, loom_pipe_op send_op, int to,
                                 loom_pipe_op recv_op) {
    const loom_pipe_stage_schedule *sender = &sim->schedules[from], *receiver = &sim->schedules[to];
    const char *kind = send_op == LOOM_PIPE_SEND_ACT ? "activation" : "gradient";
    int lower = from < to ? from : to;
    int i = 0, j = 0;
    for (int k = 0;; k++, i++, j++) {
        while (i < sender->count && sender->actions[i].op != send_op) i++;
        while (j < receiver->count && receiver->actions[j].op != recv_op) j++;
        if (i == sender->count && j == receiver->count) return LOOM_OK;
        if (i == sender->count || j == receiver->count) {
            int missing_on = i == sender->count ? from : to;
            int s = i == sender->count ? to : from, at = i == sender->count ? j : i;
            loom_pipe_action a = sim->schedules[s].actions[at];
            return loom_fail(LOOM_ERR_INPUT,
                             "pipeline simulation: link %d-%d: %s message %d (stage %d action %d, "
                             "%s of micro-batch %d) has no partner on stage %d",
                             lower, lower + 1, kind, k, s, at, loom_pipe_op_name(a.op),
                             a.micro_batch, missing_on);
        }
        int sent = sender->actions[i].micro_batch, received = receiver->actions[j].micro_batch;
        if (sent != received) {
            return loom_fail(LOOM_ERR_INPUT,
                             "pipeline simulation: link %d-%d: %s message %d is micro-batch %d on "
                             "stage %d (action %d) but %d on stage %d (action %d)",
                             lower, lower + 1, kind, k, sent, from, i, received, to, j);
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
        loom_pipe_op op = sched->actions[i].op;
        loom_pipe_sim_action *a = result_at(sim, s, i);
        a->start_s = i > 0 ? result_at(sim, s, i - 1)->end_s : 0.0;
        int peer = peer_of(s, op), partner = sim->partner[sim->first[s] + i];
        if (is_receive(op)) {
            if (sim->pc[peer] <= partner) return; /* not sent yet */
            a->end_s = fmax(a->start_s, result_at(sim, peer, partner)->arrival_s);
        } else if (is_send(op)) {
            a->end_s = a->start_s;
            a->arrival_s = a->end_s + link_time(sim, s, op);
            if (sim->pc[peer] == partner) make_ready(sim, peer); /* it may be waiting for this */
        } else {
            a->end_s = a->start_s + compute_time(sim, s, op);
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
            s, i, loom_pipe_op_name(a.op), a.micro_batch, peer_of(s, a.op));
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
        loom_pipe_op op = sim->schedules[s].actions[i].op;
        loom_pipe_sim_action *a = result_at(sim, s, i);
        double latest = makespan;
        if (i + 1 < sim->schedules[s].count) {
            loom_pipe_op next = sim->schedules[s].actions[i + 1].op;
            latest = fmin(latest, sim->latest_end[flat + 1] - compute_time(sim, s, next));
        }
        if (is_send(op)) {
            int peer = peer_of(s, op);
            double latest_arrival = sim->latest_end[sim->first[peer] + sim->partner[flat]];
            a->message_slack_s = fmax(0.0, latest_arrival - a->arrival_s);
            latest = fmin(latest, latest_arrival - link_time(sim, s, op));
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
    sim->order = loom_calloc(total, sizeof *sim->order, "pipeline simulation");
    sim->latest_end = loom_calloc(total, sizeof *sim->latest_end, "pipeline simulation");
    sim->pc = loom_calloc((size_t)p, sizeof *sim->pc, "pipeline simulation");
    sim->queued = loom_calloc((size_t)p, sizeof *sim->queued, "pipeline simulation");
    sim->ready = loom_calloc((size_t)p, sizeof *sim->ready, "pipeline simulation");
    out->stage =
        loom_calloc((size_t)p, sizeof(loom_pipe_sim_action *), "pipeline simulation result");
    out->memory = loom_calloc(total, sizeof *out->memory, "pipeline simulation result");
    if (!sim->partner || !sim->order || !sim->latest_end || !sim->pc || !sim->queued ||
        !sim->ready || !out->stage || !out->memory) {
        return LOOM_ERR_NOMEM;
    }
    out->stages = p;
    for (int s = 0; s < p; s++) out->stage[s] = out->memory + sim->first[s];
    return LOOM_OK;
}

static void free_scratch(simulation *sim) {
    free(sim->first);
    free(sim->partner);
    free(sim->order);
    free(sim->latest_end);
    free(sim->pc);
    free(sim->queued);
    free(sim->ready);
}

loom_status loom_pipe_simulate(const loom_pipe_stage_schedule *schedules, int stages,
                               const loom_pipe_sim_times *times, loom_pipe_sim_result *out) {
    if (!out) return loom_fail(LOOM_ERR_INPUT, "pipeline simulation: no output given");
    memset(out, 0, sizeof *out);
    if (!schedules || !times) {
        return loom_fail(LOOM_ERR_INPUT, "pipeline simulation: %s is NULL",
                         !schedules ? "schedules" : "times");
    }
    if (stages < 1) {
        return loom_fail(LOOM_ERR_INPUT, "pipeline simulation: stages must be at least 1, got %d",
                         stages);
    }
    loom_status st = check_times(times, stages);
    if (st == LOOM_OK) st = check_actions(schedules, stages);
    if (st != LOOM_OK) return st;

    simulation sim = {.schedules = schedules, .times = times, .stages = stages, .result = out};
    st = allocate(&sim, out);
    for (int s = 0; s + 1 < stages && st == LOOM_OK; s++) {
        st = pair_messages(&sim, s, LOOM_PIPE_SEND_ACT, s + 1, LOOM_PIPE_RECV_ACT);
        if (st == LOOM_OK)
            st = pair_messages(&sim, s + 1, LOOM_PIPE_SEND_GRAD, s, LOOM_PIPE_RECV_GRAD);
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

loom_status loom_pipe_slack_choose(const loom_pipe_stage_schedule *schedules, int stages,
                                   int micro_batches, const loom_pipe_sim_times *times,
                                   const double *saving_s, unsigned char *compress) {
    memset(compress, 0, (size_t)stages * (size_t)micro_batches);
    loom_pipe_sim_result result;
    loom_status st = loom_pipe_simulate(schedules, stages, times, &result);
    if (st != LOOM_OK) return st;
    for (int s = 1; s < stages && result.stage; s++) {
        double saving = saving_s[s - 1];
        for (int i = 0; i < schedules[s].count; i++) {
            const loom_pipe_action *a = &schedules[s].actions[i];
            if (a->op != LOOM_PIPE_SEND_GRAD || a->micro_batch < 0 ||
                a->micro_batch >= micro_batches)
                continue;
            double slack = result.stage[s][i].message_slack_s;
            compress[(size_t)s * (size_t)micro_batches + (size_t)a->micro_batch] =
                saving > 0 && slack < saving;
        }
    }
    loom_pipe_sim_result_free(&result);
    return LOOM_OK;
}
