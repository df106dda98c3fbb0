/*
 * test_schedule.c — pipeline schedules as data, for every kind (GPipe, 1F1B, interleaved 1F1B,
 * ZB-H1, ZB-V). For pipeline ranks p in 1..8 and micro-batch counts m up to 32 (interleaved:
 * multiples of p, 2 and 3 chunks per rank): each virtual stage forwards and backwards every
 * micro-batch once (ZB: B then W), in a dependency-respecting order, with a message exactly
 * where the neighbouring virtual stage is on another rank; the two ends of every pair of ranks
 * list the messages between them in the same order; all ranks run together finish (no deadlock)
 * both with buffered sends (the library's simulator, loom_pipe_simulate) and with synchronous
 * (rendezvous) sends (a step-by-step simulation kept here: the library models only non-blocking
 * sends); the ideal makespan (F = B = W = 1, a whole backward 2, free links) is the paper's:
 * 3(m + p - 1) for GPipe and 1F1B, 3(m v + p - 1) for interleaved (bubble (p-1)/(v m)), 3m + p - 1
 * for ZB-H1 (a third of 1F1B's bubble), and for ZB-V the start-up bound 6m + p - 1 in chunk
 * times; the peak of activations in flight is each kind's (GPipe m, 1F1B min(p - i, m),
 * interleaved Megatron's warm-up + 1, ZB-H1 and ZB-V 1F1B's peak). Bad arguments fail with
 * LOOM_ERR_INPUT and a message naming the value. Last, the checkers themselves are shown to
 * catch broken schedules (swapped, dropped, reordered and renumbered actions).
 */
#include "check.h"
#include "loom/parallel.h"

#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 8

static const int micro_batch_counts[] = {1, 2, 3, 5, 8, 13, 32};

/* Checkers return NULL when the schedule is fine, else a description of the first problem
 * (in this static buffer), so that the self-test at the end can expect them to fail. */
static char problem[512];

#define PROBLEM(...) (snprintf(problem, sizeof problem, __VA_ARGS__), problem)

typedef struct {
    loom_pipe_shape shape;
    loom_pipe_stage_schedule stage[MAX_RANKS]; /* per rank */
    int stages, micro_batches;                 /* p, m */
} pipeline;

static int build_shape(pipeline *pl, loom_schedule_kind kind, int p, int v, int m) {
    memset(pl, 0, sizeof *pl);
    pl->shape = (loom_pipe_shape){kind, p, v, m};
    pl->stages = p, pl->micro_batches = m;
    for (int r = 0; r < p; r++) {
        if (loom_pipe_schedule_build(&pl->shape, r, &pl->stage[r]) != LOOM_OK) {
            fprintf(stderr, "loom_pipe_schedule_build(%s, p %d, v %d, m %d, rank %d): %s\n",
                    loom_schedule_kind_name(kind), p, v, m, r, loom_last_error());
            return 0;
        }
    }
    return 1;
}

static int build_pipeline(pipeline *pl, loom_schedule_kind kind, int stages, int micro_batches) {
    return build_shape(pl, kind, stages, loom_plan_schedule_chunks(kind), micro_batches);
}

static void free_pipeline(pipeline *pl) {
    for (int s = 0; s < pl->stages; s++) loom_pipe_schedule_free(&pl->stage[s]);
}

static const char *abbreviation[LOOM_PIPE_NUM_OPS] = {"RA", "F", "SA", "RG", "B", "SG", "b", "w"};

static void print_pipeline(const pipeline *pl) {
    for (int s = 0; s < pl->stages; s++) {
        fprintf(stderr, "  rank %d:", s);
        for (int i = 0; i < pl->stage[s].count; i++) {
            loom_pipe_action a = pl->stage[s].actions[i];
            fprintf(stderr, " %s%d%s", abbreviation[a.op], a.micro_batch, a.chunk ? "'" : "");
        }
        fprintf(stderr, "\n");
    }
}

static int rank_of(const pipeline *pl, int stage) {
    int rank, chunk;
    loom_pipe_place(&pl->shape, stage, &rank, &chunk);
    return rank;
}

/* ---- one rank on its own ------------------------------------------------------------------ */

enum { NOPS = LOOM_PIPE_NUM_OPS };

/* Every (chunk, micro-batch): exactly one FORWARD; one BACKWARD, or one BACKWARD_INPUT and one
 * BACKWARD_WEIGHT (zb-h1, zb-v); RECV_ACT and SEND_GRAD once where the previous virtual stage is
 * on another rank (else never), SEND_ACT and RECV_GRAD once where the next one is; and the order
 * RECV_ACT < FORWARD < SEND_ACT, FORWARD < backward, RECV_GRAD < backward < SEND_GRAD, B < W,
 * and a hand-over inside the rank in dependency order. */
static const char *stage_structure_problem(const pipeline *pl, int s) {
    const loom_pipe_stage_schedule *sched = &pl->stage[s];
    int m = pl->micro_batches, v = pl->shape.chunks, V = pl->stages * v;
    int split = pl->shape.kind == LOOM_SCHEDULE_ZB_H1 || pl->shape.kind == LOOM_SCHEDULE_ZB_V;
    int(*seen)[NOPS] = calloc((size_t)(m * v), sizeof *seen);
    int(*position)[NOPS] = calloc((size_t)(m * v), sizeof *position);
    if (!seen || !position) {
        free(seen);
        free(position);
        return PROBLEM("out of memory");
    }
    const char *found = NULL;
    for (int i = 0; i < sched->count && !found; i++) {
        loom_pipe_action a = sched->actions[i];
        if ((int)a.op < 0 || (int)a.op >= NOPS) {
            found = PROBLEM("rank %d action %d: op %d out of range", s, i, (int)a.op);
        } else if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= v) {
            found = PROBLEM("rank %d action %d: micro-batch %d chunk %d out of range", s, i,
                            a.micro_batch, a.chunk);
        } else {
            seen[a.chunk * m + a.micro_batch][a.op]++;
            position[a.chunk * m + a.micro_batch][a.op] = i;
        }
    }
    for (int c = 0; c < v && !found; c++) {
        int vs = loom_pipe_stage(&pl->shape, s, c);
        int prev_remote = vs > 0 && rank_of(pl, vs - 1) != s;
        int next_remote = vs < V - 1 && rank_of(pl, vs + 1) != s;
        int expected[NOPS] = {0};
        expected[LOOM_PIPE_RECV_ACT] = prev_remote, expected[LOOM_PIPE_SEND_GRAD] = prev_remote;
        expected[LOOM_PIPE_SEND_ACT] = next_remote, expected[LOOM_PIPE_RECV_GRAD] = next_remote;
        expected[LOOM_PIPE_FORWARD] = 1;
        expected[LOOM_PIPE_BACKWARD] = !split;
        expected[LOOM_PIPE_BACKWARD_INPUT] = split, expected[LOOM_PIPE_BACKWARD_WEIGHT] = split;
        int bwd = split ? LOOM_PIPE_BACKWARD_INPUT : LOOM_PIPE_BACKWARD;
        for (int mb = 0; mb < m && !found; mb++) {
            const int *n = seen[c * m + mb], *at = position[c * m + mb];
            for (int op = 0; op < NOPS && !found; op++) {
                if (n[op] != expected[op]) {
                    found = PROBLEM("rank %d chunk %d (virtual stage %d of %d): %s of micro-batch "
                                    "%d appears %d times, expected %d",
                                    s, c, vs, V, loom_pipe_op_name((loom_pipe_op)op), mb, n[op],
                                    expected[op]);
                }
            }
            if (found) break;
            if (at[bwd] < at[LOOM_PIPE_FORWARD]) {
                found = PROBLEM("rank %d chunk %d: backward of micro-batch %d before its forward",
                                s, c, mb);
            } else if (split && at[LOOM_PIPE_BACKWARD_WEIGHT] < at[bwd]) {
                found = PROBLEM("rank %d chunk %d: W of micro-batch %d before its B", s, c, mb);
            } else if (prev_remote && at[LOOM_PIPE_RECV_ACT] > at[LOOM_PIPE_FORWARD]) {
                found = PROBLEM("rank %d chunk %d: forward of micro-batch %d before its input "
                                "arrives",
                                s, c, mb);
            } else if (next_remote && at[LOOM_PIPE_SEND_ACT] < at[LOOM_PIPE_FORWARD]) {
                found = PROBLEM("rank %d chunk %d: activation of micro-batch %d sent before its "
                                "forward",
                                s, c, mb);
            } else if (next_remote && at[LOOM_PIPE_RECV_GRAD] > at[bwd]) {
                found = PROBLEM("rank %d chunk %d: backward of micro-batch %d before its "
                                "gradient arrives",
                                s, c, mb);
            } else if (prev_remote && at[LOOM_PIPE_SEND_GRAD] < at[bwd]) {
                found = PROBLEM("rank %d chunk %d: gradient of micro-batch %d sent before its "
                                "backward",
                                s, c, mb);
            } else if (vs < V - 1 && !next_remote) {
                /* a hand-over inside the rank: the next stage's chunk */
                int next_chunk = -1;
                for (int c2 = 0; c2 < v; c2++)
                    if (loom_pipe_stage(&pl->shape, s, c2) == vs + 1) next_chunk = c2;
                const int *up = position[next_chunk * m + mb];
                if (up[LOOM_PIPE_FORWARD] < at[LOOM_PIPE_FORWARD] || at[bwd] < up[bwd]) {
                    found = PROBLEM("rank %d: micro-batch %d crosses from chunk %d to %d inside "
                                    "the rank out of order",
                                    s, mb, c, next_chunk);
                }
            }
        }
    }
    free(seen);
    free(position);
    return found;
}

/* Within a chunk, forwards, backwards (B) and W's each run micro-batches 0..m-1 in order.
 * GPipe: every forward before any backward. 1F1B: from the first backward until the forwards
 * run out, F and B alternate (the warm-up length is checked through the peak in flight). */
static const char *compute_order_problem(const pipeline *pl, int s) {
    const loom_pipe_stage_schedule *sched = &pl->stage[s];
    loom_schedule_kind kind = pl->shape.kind;
    int next[NOPS][4] = {{0}}, backwards_started = 0;
    loom_pipe_op previous = LOOM_PIPE_BACKWARD;
    for (int i = 0; i < sched->count; i++) {
        loom_pipe_action a = sched->actions[i];
        int compute = a.op == LOOM_PIPE_FORWARD || a.op == LOOM_PIPE_BACKWARD ||
                      a.op == LOOM_PIPE_BACKWARD_INPUT || a.op == LOOM_PIPE_BACKWARD_WEIGHT;
        if (!compute) continue;
        if (a.micro_batch != next[a.op][a.chunk]) {
            return PROBLEM("rank %d chunk %d: %s of micro-batch %d, expected %d", s, a.chunk,
                           loom_pipe_op_name(a.op), a.micro_batch, next[a.op][a.chunk]);
        }
        next[a.op][a.chunk]++;
        if (a.op == LOOM_PIPE_FORWARD) {
            if (kind == LOOM_SCHEDULE_GPIPE && backwards_started) {
                return PROBLEM("rank %d: GPipe forward %d after a backward", s, a.micro_batch);
            }
            if (kind == LOOM_SCHEDULE_1F1B && backwards_started && previous == LOOM_PIPE_FORWARD) {
                return PROBLEM("rank %d: 1F1B steady state runs two forwards in a row (%d)", s,
                               a.micro_batch);
            }
        } else if (a.op == LOOM_PIPE_BACKWARD) {
            if (kind == LOOM_SCHEDULE_1F1B && backwards_started && previous == LOOM_PIPE_BACKWARD &&
                next[LOOM_PIPE_FORWARD][0] < pl->micro_batches) {
                return PROBLEM("rank %d: 1F1B steady state runs two backwards in a row (%d) "
                               "while forwards remain",
                               s, a.micro_batch);
            }
            backwards_started = 1;
        }
        previous = a.op;
    }
    return NULL;
}

/* ---- the links between ranks -------------------------------------------------------------- */

static int is_message(loom_pipe_op op) {
    return op == LOOM_PIPE_RECV_ACT || op == LOOM_PIPE_SEND_ACT || op == LOOM_PIPE_RECV_GRAD ||
           op == LOOM_PIPE_SEND_GRAD;
}

/* The op at the other end of a message. */
static loom_pipe_op partner_op(loom_pipe_op op) {
    switch (op) {
    case LOOM_PIPE_SEND_ACT:
        return LOOM_PIPE_RECV_ACT;
    case LOOM_PIPE_RECV_ACT:
        return LOOM_PIPE_SEND_ACT;
    case LOOM_PIPE_SEND_GRAD:
        return LOOM_PIPE_RECV_GRAD;
    default:
        return LOOM_PIPE_SEND_GRAD;
    }
}

/* The virtual-stage boundary a message action of rank s crosses. */
static int boundary(const pipeline *pl, int s, loom_pipe_action a) {
    int up = a.op == LOOM_PIPE_SEND_ACT || a.op == LOOM_PIPE_RECV_GRAD;
    return loom_pipe_stage(&pl->shape, s, a.chunk) - (up ? 0 : 1);
}

/* Every message between ranks a and b (both directions, both kinds) must pair up one to one in
 * the same order on both: the k-th on a with the k-th on b, partner ops, the same micro-batch
 * and boundary. */
static const char *link_order_problem(const pipeline *pl, int a, int b) {
    const loom_pipe_stage_schedule *sa = &pl->stage[a], *sb = &pl->stage[b];
    int i = 0, j = 0;
    for (int k = 0;; k++, i++, j++) {
        while (i < sa->count && !(is_message(sa->actions[i].op) &&
                                  loom_pipe_peer(&pl->shape, a, sa->actions[i]) == b))
            i++;
        while (j < sb->count && !(is_message(sb->actions[j].op) &&
                                  loom_pipe_peer(&pl->shape, b, sb->actions[j]) == a))
            j++;
        if (i == sa->count && j == sb->count) return NULL;
        if (i == sa->count || j == sb->count) {
            return PROBLEM("ranks %d-%d: message %d has no partner on rank %d", a, b, k,
                           i == sa->count ? a : b);
        }
        loom_pipe_action x = sa->actions[i], y = sb->actions[j];
        if (y.op != partner_op(x.op) || x.micro_batch != y.micro_batch ||
            boundary(pl, a, x) != boundary(pl, b, y)) {
            return PROBLEM("ranks %d-%d: message %d is %s %d (boundary %d) on rank %d but %s %d "
                           "(boundary %d) on rank %d",
                           a, b, k, loom_pipe_op_name(x.op), x.micro_batch, boundary(pl, a, x), a,
                           loom_pipe_op_name(y.op), y.micro_batch, boundary(pl, b, y), b);
        }
    }
}

/* ---- running all ranks together ----------------------------------------------------------- */

/* Unit durations per virtual stage: F = B = W = 1, a whole backward 2. */
static double op_duration(loom_pipe_op op) {
    switch (op) {
    case LOOM_PIPE_FORWARD:
    case LOOM_PIPE_BACKWARD_INPUT:
    case LOOM_PIPE_BACKWARD_WEIGHT:
        return 1.0;
    case LOOM_PIPE_BACKWARD:
        return 2.0;
    default:
        return 0.0;
    }
}

/* With non-blocking (buffered) sends: the library's simulator (loom_pipe_simulate) with the unit
 * durations and free links. NULL when every rank finished, else why not; *makespan is the
 * step's length. */
static const char *simulate_buffered(const pipeline *pl, double *makespan) {
    enum { MAX_V = MAX_RANKS * 4 };
    double forward[MAX_V], backward[MAX_V], input[MAX_V], weight[MAX_V], link[MAX_V] = {0};
    int V = pl->stages * pl->shape.chunks;
    for (int s = 0; s < V; s++) {
        forward[s] = op_duration(LOOM_PIPE_FORWARD), backward[s] = op_duration(LOOM_PIPE_BACKWARD);
        input[s] = op_duration(LOOM_PIPE_BACKWARD_INPUT);
        weight[s] = op_duration(LOOM_PIPE_BACKWARD_WEIGHT);
    }
    loom_pipe_sim_times times = {V,     V - 1,  forward, backward, link, link,
                                 input, weight, NULL,    NULL,     NULL};
    loom_pipe_sim_result result;
    loom_status st = loom_pipe_simulate(&pl->shape, pl->stage, &times, &result);
    *makespan = result.makespan_s;
    loom_pipe_sim_result_free(&result);
    return st == LOOM_OK ? NULL : PROBLEM("buffered sends: %s", loom_last_error());
}

/* With synchronous (rendezvous) sends, which the library does not model: a send blocks until
 * the peer is at the matching receive (MPI_Ssend), and both complete together. */
typedef struct {
    const pipeline *pl;
    int pc[MAX_RANKS];
    double clock[MAX_RANKS];
    const char *error; /* a message matched to the wrong micro-batch */
} simulation;

static const loom_pipe_action *next_action(const simulation *sim, int s) {
    const loom_pipe_stage_schedule *sched = &sim->pl->stage[s];
    return sim->pc[s] < sched->count ? &sched->actions[sim->pc[s]] : NULL;
}

/* The send on rank s completes, together with the peer's receive, only when the peer's next
 * action is that receive. */
static int try_rendezvous(simulation *sim, int s, const loom_pipe_action *a) {
    int peer = loom_pipe_peer(&sim->pl->shape, s, *a);
    const loom_pipe_action *b = next_action(sim, peer);
    if (!b || b->op != partner_op(a->op) || loom_pipe_peer(&sim->pl->shape, peer, *b) != s)
        return 0;
    if (b->micro_batch != a->micro_batch ||
        boundary(sim->pl, s, *a) != boundary(sim->pl, peer, *b)) {
        sim->error = PROBLEM("rank %d: %s %d met %s %d on rank %d", s, loom_pipe_op_name(a->op),
                             a->micro_batch, loom_pipe_op_name(b->op), b->micro_batch, peer);
        return 0;
    }
    double t = sim->clock[s] > sim->clock[peer] ? sim->clock[s] : sim->clock[peer];
    sim->clock[s] = sim->clock[peer] = t;
    sim->pc[peer]++;
    return 1;
}

/* Runs rank s's next action if it can complete now; 1 if it did. */
static int step(simulation *sim, int s) {
    const loom_pipe_action *a = next_action(sim, s);
    if (!a) return 0;
    int done = 0;
    if (!is_message(a->op)) {
        sim->clock[s] += op_duration(a->op);
        done = 1;
    } else if (loom_pipe_peer(&sim->pl->shape, s, *a) < 0) {
        sim->error =
            PROBLEM("rank %d: %s across the end of the pipeline", s, loom_pipe_op_name(a->op));
    } else if (a->op == LOOM_PIPE_SEND_ACT || a->op == LOOM_PIPE_SEND_GRAD) {
        done = try_rendezvous(sim, s, a);
    } /* a receive completes when its sender steps */
    if (done) sim->pc[s]++;
    return done;
}

/* Runs every rank as far as it can until none can move. Returns NULL when every rank finished,
 * else what stopped them; *makespan is the latest rank clock. */
static const char *simulate_rendezvous(const pipeline *pl, double *makespan) {
    simulation sim;
    memset(&sim, 0, sizeof sim);
    sim.pl = pl;
    int progress = 1;
    while (progress && !sim.error) {
        progress = 0;
        for (int s = 0; s < pl->stages && !sim.error; s++)
            while (step(&sim, s)) progress = 1;
    }
    *makespan = 0.0;
    for (int s = 0; s < pl->stages; s++)
        if (sim.clock[s] > *makespan) *makespan = sim.clock[s];
    if (sim.error) return sim.error;
    for (int s = 0; s < pl->stages; s++) {
        const loom_pipe_action *a = next_action(&sim, s);
        if (a) {
            return PROBLEM("deadlock (rendezvous sends): rank %d stuck at action %d, %s %d", s,
                           sim.pc[s], loom_pipe_op_name(a->op), a->micro_batch);
        }
    }
    return NULL;
}

/* Every check that does not depend on the kind's makespan and memory; NULL when all pass. */
static const char *pipeline_problem(const pipeline *pl) {
    const char *p = NULL;
    for (int s = 0; s < pl->stages && !p; s++) p = stage_structure_problem(pl, s);
    for (int s = 0; s < pl->stages && !p; s++) p = compute_order_problem(pl, s);
    for (int a = 0; a < pl->stages && !p; a++)
        for (int b = a + 1; b < pl->stages && !p; b++) p = link_order_problem(pl, a, b);
    double makespan;
    if (!p) p = simulate_buffered(pl, &makespan);
    if (!p) p = simulate_rendezvous(pl, &makespan);
    return p;
}

/* ---- the tests ---------------------------------------------------------------------------- */

/* The ideal makespan (unit durations, free links) and the peak of chunk activations each rank
 * may hold; *at_most: the makespan is an upper bound (and lower_bound a lower one), not exact. */
static double expected_makespan(const loom_pipe_shape *sh, int *at_most, double *lower_bound) {
    double p = sh->ranks, m = sh->micro_batches, v = sh->chunks;
    *at_most = 0;
    *lower_bound = 0;
    switch (sh->kind) {
    case LOOM_SCHEDULE_INTERLEAVED:
        return 3.0 * (m * v + p - 1); /* bubble 3(p - 1) chunk times = (p-1)/(v m) of 3mv */
    case LOOM_SCHEDULE_ZB_H1:
        if (m >= p) return 3.0 * m + (p - 1); /* bubble (p - 1)(F + B - W) */
        *at_most = 1;
        return 3.0 * (m + p - 1);
    case LOOM_SCHEDULE_ZB_V:
        /* each rank's 6m chunk passes, and the last rank cannot start before the first chunk
         * of micro-batch 0 has crossed p - 1 ranks; the greedy build stays within p - 1 of that
         * (measured: exactly the bound up to p = 4, 4 above it at p = 8), while ZB-H1's equal
         * in chunk times is 6m + 2(p - 1) */
        *at_most = 1;
        *lower_bound = 6.0 * m + (p - 1);
        return m >= p ? *lower_bound + (p - 1) : 2.0 * 3.0 * (m + p - 1);
    default:
        return 3.0 * (m + p - 1);
    }
}

static int expected_peak(const loom_pipe_shape *sh, int r, int *at_most) {
    int p = sh->ranks, m = sh->micro_batches, v = sh->chunks;
    *at_most = 0;
    switch (sh->kind) {
    case LOOM_SCHEDULE_GPIPE:
        return m;
    case LOOM_SCHEDULE_1F1B:
        return p - r < m ? p - r : m;
    case LOOM_SCHEDULE_INTERLEAVED: {
        int warmup = m == p ? m * v : (p - r - 1) * 2 + (v - 1) * p;
        return warmup + 1 < m * v ? warmup + 1 : m * v;
    }
    case LOOM_SCHEDULE_ZB_H1: /* 1F1B's peak, the first stage's, on every stage */
        *at_most = r > 0;
        return p < m ? p : m;
    default: /* zb-v: 1F1B's peak in chunks, p micro-batches of a whole stage */
        *at_most = 1;
        return 2 * p < 2 * m ? 2 * p : 2 * m;
    }
}

static void check_layout(loom_schedule_kind kind, int p, int v, int m) {
    const char *name = loom_schedule_kind_name(kind);
    pipeline pl;
    int built = build_shape(&pl, kind, p, v, m);
    CHECK(built, "%s p=%d v=%d m=%d: schedule not built", name, p, v, m);
    if (!built) {
        free_pipeline(&pl);
        return;
    }
    int failed_before = check_failed;
    const char *p_problem = pipeline_problem(&pl);
    CHECK(p_problem == NULL, "%s p=%d v=%d m=%d: %s", name, p, v, m, p_problem);

    int at_most;
    double lower, ideal = expected_makespan(&pl.shape, &at_most, &lower), buffered = 0,
                  rendezvous = 0;
    const char *sim_problem = simulate_buffered(&pl, &buffered);
    int ok = at_most ? buffered <= ideal && buffered >= lower : buffered == ideal;
    CHECK(!sim_problem && ok, "%s p=%d v=%d m=%d: buffered makespan %g, expected %s%g (%s)", name,
          p, v, m, buffered, at_most ? "at most " : "", ideal,
          sim_problem ? sim_problem : "finished");
    /* rendezvous sends only check deadlock freedom beyond 1F1B: blocking sends cost time there */
    int direct = kind == LOOM_SCHEDULE_GPIPE || kind == LOOM_SCHEDULE_1F1B;
    sim_problem = simulate_rendezvous(&pl, &rendezvous);
    CHECK(!sim_problem && rendezvous >= buffered && (!direct || rendezvous == ideal),
          "%s p=%d v=%d m=%d: rendezvous makespan %g (buffered %g) (%s)", name, p, v, m, rendezvous,
          buffered, sim_problem ? sim_problem : "finished");

    for (int s = 0; s < p; s++) {
        int peak = loom_pipe_peak_in_flight(&pl.stage[s]),
            bound = expected_peak(&pl.shape, s, &at_most);
        CHECK(at_most ? peak <= bound : peak == bound,
              "%s p=%d v=%d m=%d rank %d: peak in flight %d, expected %s%d", name, p, v, m, s, peak,
              at_most ? "at most " : "", bound);
    }
    if (check_failed != failed_before) print_pipeline(&pl);
    free_pipeline(&pl);
}

/* loom_pipe_stage is loom_plan_place's rule backwards: every virtual stage once. */
static void test_placement(void) {
    for (int k = 0; k < LOOM_SCHEDULE_NUM_KINDS; k++) {
        for (int p = 1; p <= MAX_RANKS; p++) {
            int v = loom_plan_schedule_chunks((loom_schedule_kind)k);
            if (v == 0) v = 3;
            loom_pipe_shape shape = {(loom_schedule_kind)k, p, v, p};
            for (int s = 0; s < p * v; s++) {
                int rank, chunk;
                loom_pipe_place(&shape, s, &rank, &chunk);
                CHECK(rank >= 0 && rank < p && chunk >= 0 && chunk < v &&
                          loom_pipe_stage(&shape, rank, chunk) == s,
                      "%s p=%d v=%d: stage %d placed at rank %d chunk %d, which maps back to %d",
                      loom_schedule_kind_name((loom_schedule_kind)k), p, v, s, rank, chunk,
                      loom_pipe_stage(&shape, rank, chunk));
            }
        }
    }
}

static void test_all_layouts(void) {
    int counts = (int)(sizeof micro_batch_counts / sizeof *micro_batch_counts);
    loom_schedule_kind fixed[] = {LOOM_SCHEDULE_GPIPE, LOOM_SCHEDULE_1F1B, LOOM_SCHEDULE_ZB_H1,
                                  LOOM_SCHEDULE_ZB_V};
    for (int p = 1; p <= MAX_RANKS; p++) {
        for (int ki = 0; ki < 4; ki++) {
            for (int mi = 0; mi < counts; mi++) {
                check_layout(fixed[ki], p, loom_plan_schedule_chunks(fixed[ki]),
                             micro_batch_counts[mi]);
            }
        }
        for (int v = 2; v <= 3; v++)
            for (int m = p; m <= 32; m += m < 4 * p ? p : 4 * p)
                check_layout(LOOM_SCHEDULE_INTERLEAVED, p, v, m);
    }
}

/* Builds `kind` for p stages and m micro-batches and checks each rank's list, written out
 * ("F0 SA0 ..."), against expected[rank]. Returns the built pipeline (the caller frees it), or
 * 0 when it was not built. */
static int check_lists(pipeline *pl, loom_schedule_kind kind, int p, int m,
                       const char *const *expected) {
    const char *name = loom_schedule_kind_name(kind);
    if (!build_pipeline(pl, kind, p, m)) {
        CHECK(0, "%s p=%d m=%d not built", name, p, m);
        free_pipeline(pl);
        return 0;
    }
    for (int s = 0; s < p; s++) {
        char text[512] = "";
        size_t used = 0;
        for (int i = 0; i < pl->stage[s].count && used < sizeof text; i++) {
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%s%d", i ? " " : "",
                                     abbreviation[pl->stage[s].actions[i].op],
                                     pl->stage[s].actions[i].micro_batch);
        }
        CHECK(strcmp(text, expected[s]) == 0, "%s p=%d m=%d rank %d:\n  got      %s\n  expected %s",
              name, p, m, s, text, expected[s]);
    }
    return 1;
}

/* The exact lists for one small case, so that a reader sees what the schedule is. */
static void test_example(void) {
    static const char *expected[3] = {
        "F0 SA0 F1 SA1 F2 SA2 RG0 B0 F3 SA3 RG1 B1 RG2 B2 RG3 B3",
        "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 RA2 SG0 F2 SA2 RG1 B1 RA3 SG1 F3 SA3 RG2 B2 SG2 RG3 B3 SG3",
        "RA0 F0 B0 RA1 SG0 F1 B1 RA2 SG1 F2 B2 RA3 SG2 F3 B3 SG3",
    };
    pipeline pl;
    if (check_lists(&pl, LOOM_SCHEDULE_1F1B, 3, 4, expected)) free_pipeline(&pl);
}

/* ZB-H1, p = 2, m = 3, worked by hand (b = B, w = W, unit times). Rank 0: 1 warm-up forward,
 * then F B W rounds; rank 1 defers its first W. Rank 0 runs F0 [0,1] F1 [1,2], waits for
 * rank 1's b0 ([2,3]: F0 [1,2] first), b0 [3,4] w0 [4,5] F2 [5,6] b1 [6,7] (rank 1's b1 ended at
 * 5) w1 [7,8] b2 [8,9] w2 [9,10]: makespan 10 = 3m + p - 1. Gradient 1 arrives at 5, when F2
 * starts: a message goes before compute at the same time, hence RG1 before F2. */
static void test_example_zb_h1(void) {
    static const char *expected[2] = {
        "F0 SA0 F1 SA1 RG0 b0 w0 RG1 F2 SA2 b1 w1 RG2 b2 w2",
        "RA0 F0 RA1 b0 SG0 F1 b1 SG1 w0 RA2 F2 b2 SG2 w1 w2",
    };
    pipeline pl;
    if (!check_lists(&pl, LOOM_SCHEDULE_ZB_H1, 2, 3, expected)) return;
    double makespan;
    CHECK(simulate_buffered(&pl, &makespan) == NULL && makespan == 10.0,
          "zb-h1 p=2 m=3: makespan %g, expected 10", makespan);
    free_pipeline(&pl);
}

static void expect_input_error(loom_status st, const char *needle, const char *what) {
    CHECK(st == LOOM_ERR_INPUT, "%s: status %d, expected LOOM_ERR_INPUT", what, (int)st);
    CHECK(strstr(loom_last_error(), needle) != NULL, "%s: message \"%s\" does not name \"%s\"",
          what, loom_last_error(), needle);
}

static void test_bad_arguments(void) {
    static loom_pipe_action stale[1];
    loom_pipe_stage_schedule s = {stale, 99}; /* must be emptied on failure */
    expect_input_error(loom_pipe_schedule(LOOM_SCHEDULE_1F1B, 0, 4, 0, &s),
                       "stages must be at least 1, got 0", "stages 0");
    CHECK(s.actions == NULL && s.count == 0, "output not emptied on failure");
    expect_input_error(loom_pipe_schedule(LOOM_SCHEDULE_GPIPE, -2, 4, 0, &s), "got -2",
                       "stages -2");
    expect_input_error(loom_pipe_schedule(LOOM_SCHEDULE_1F1B, 4, 0, 0, &s), "micro-batches",
                       "micro 0");
    expect_input_error(loom_pipe_schedule(LOOM_SCHEDULE_GPIPE, 4, -1, 0, &s), "got -1", "micro -1");
    expect_input_error(loom_pipe_schedule(LOOM_SCHEDULE_1F1B, 4, 8, 4, &s),
                       "stage 4 out of range, expected 0 <= stage < 4", "stage 4 of 4");
    expect_input_error(loom_pipe_schedule(LOOM_SCHEDULE_1F1B, 4, 8, -1, &s), "stage -1",
                       "stage -1");
    expect_input_error(loom_pipe_schedule((loom_schedule_kind)7, 4, 8, 0, &s),
                       "unknown schedule kind 7", "kind 7");
    loom_pipe_shape shape = {LOOM_SCHEDULE_INTERLEAVED, 4, 2, 6};
    expect_input_error(
        loom_pipe_schedule_build(&shape, 0, &s),
        "interleaved needs micro-batches a multiple of the pipeline ranks (4), got 6",
        "interleaved m=6 p=4");
    shape = (loom_pipe_shape){LOOM_SCHEDULE_INTERLEAVED, 4, 1, 8};
    expect_input_error(loom_pipe_schedule_build(&shape, 0, &s), "at least 2 virtual stages",
                       "interleaved v=1");
    shape = (loom_pipe_shape){LOOM_SCHEDULE_ZB_V, 4, 3, 8};
    expect_input_error(loom_pipe_schedule_build(&shape, 0, &s),
                       "zb-v runs 2 chunks per rank, got 3", "zb-v v=3");
    shape = (loom_pipe_shape){LOOM_SCHEDULE_1F1B, 4, 2, 8};
    expect_input_error(loom_pipe_schedule_build(&shape, 0, &s), "1f1b runs 1 chunk per rank",
                       "1f1b v=2");
    expect_input_error(loom_pipe_schedule_build(NULL, 0, &s), "no shape", "NULL shape");
    expect_input_error(loom_pipe_schedule(LOOM_SCHEDULE_1F1B, 4, 8, 0, NULL), "no output",
                       "NULL output");

    loom_schedule_kind kind = LOOM_SCHEDULE_GPIPE;
    CHECK(loom_schedule_kind_parse("1f1b", "test", "schedule", &kind) == LOOM_OK &&
              kind == LOOM_SCHEDULE_1F1B,
          "parse 1f1b");
    CHECK(loom_schedule_kind_parse("gpipe", "test", "schedule", &kind) == LOOM_OK &&
              kind == LOOM_SCHEDULE_GPIPE,
          "parse gpipe");
    for (int k = 0; k < LOOM_SCHEDULE_NUM_KINDS; k++) {
        CHECK(loom_schedule_kind_parse(loom_schedule_kind_name((loom_schedule_kind)k), "test",
                                       "schedule", &kind) == LOOM_OK &&
                  (int)kind == k,
              "name of kind %d does not parse back", k);
    }
    expect_input_error(loom_schedule_kind_parse("zb-h2", "test", "schedule", &kind),
                       "test: schedule: expected one of \"gpipe\", \"1f1b\", "
                       "\"interleaved\", \"zb-h1\" or \"zb-v\", got \"zb-h2\"",
                       "kind zb-h2");
    expect_input_error(loom_schedule_kind_parse("", "test", "schedule", &kind), "got \"\"",
                       "kind \"\"");
    expect_input_error(loom_schedule_kind_parse("1F1B ", "test", "schedule", &kind), "1F1B ",
                       "kind \"1F1B \"");
    expect_input_error(loom_schedule_kind_parse(NULL, "test", "schedule", &kind), "got \"\"",
                       "kind NULL");
    CHECK(strcmp(loom_schedule_kind_name((loom_schedule_kind)9), "?") == 0, "name of kind 9");
    CHECK(strcmp(loom_pipe_op_name((loom_pipe_op)9), "?") == 0, "name of op 9");
}

/* ---- the checkers catch broken schedules -------------------------------------------------- */

static loom_pipe_action *find_action(loom_pipe_stage_schedule *sched, loom_pipe_op op, int mb) {
    for (int i = 0; i < sched->count; i++)
        if (sched->actions[i].op == op && sched->actions[i].micro_batch == mb)
            return &sched->actions[i];
    return NULL;
}

static void swap_actions(loom_pipe_action *a, loom_pipe_action *b) {
    loom_pipe_action t = *a;
    *a = *b;
    *b = t;
}

/* Builds 1F1B p=3 m=4, breaks it with `mutation`, and expects pipeline_problem to say so. */
static void expect_caught(int mutation, const char *what) {
    pipeline pl;
    if (!build_pipeline(&pl, LOOM_SCHEDULE_1F1B, 3, 4)) {
        CHECK(0, "1f1b p=3 m=4 not built");
        return;
    }
    CHECK(pipeline_problem(&pl) == NULL, "unbroken schedule flagged: %s", problem);
    loom_pipe_stage_schedule *s0 = &pl.stage[0], *s1 = &pl.stage[1], *s2 = &pl.stage[2];
    switch (mutation) {
    case 0: /* stage 1 waits for a gradient before sending the activation stage 2 waits for */
        swap_actions(find_action(s1, LOOM_PIPE_SEND_ACT, 2),
                     find_action(s1, LOOM_PIPE_RECV_GRAD, 1));
        break;
    case 1: /* stage 2 sends the gradient before receiving the next activation: with buffered
             * sends harmless, with rendezvous sends a deadlock */
        swap_actions(find_action(s2, LOOM_PIPE_RECV_ACT, 2),
                     find_action(s2, LOOM_PIPE_SEND_GRAD, 1));
        break;
    case 2: /* a dropped action */
        s1->count--;
        break;
    case 3: /* backward before its forward */
        swap_actions(find_action(s2, LOOM_PIPE_FORWARD, 1), find_action(s2, LOOM_PIPE_BACKWARD, 1));
        break;
    case 4: /* stage 0 sends activation 1 before 0 (each still after its forward) */
        s0->actions[1] = (loom_pipe_action){LOOM_PIPE_FORWARD, 1, 0};
        s0->actions[2] = (loom_pipe_action){LOOM_PIPE_SEND_ACT, 1, 0};
        s0->actions[3] = (loom_pipe_action){LOOM_PIPE_SEND_ACT, 0, 0};
        break;
    case 5: /* micro-batches forwarded out of order (consistently on every stage) */
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < pl.stage[s].count; i++)
                if (pl.stage[s].actions[i].micro_batch < 2) pl.stage[s].actions[i].micro_batch ^= 1;
        break;
    default:
        break;
    }
    const char *found = pipeline_problem(&pl);
    CHECK(found != NULL, "broken schedule (%s) not caught", what);
    if (found) printf("caught %s: %s\n", what, found);
    free_pipeline(&pl);
}

/* Under interleaved p = 2, rank 1 receives chunk 1's input from rank 0 (which got it back from
 * rank 1's chunk 0): swapping the receive of chunk 1's micro-batch 0 with the send of chunk 0's
 * micro-batch 1 breaks the order between the two ranks. */
static void expect_caught_interleaved(void) {
    pipeline pl;
    if (!build_shape(&pl, LOOM_SCHEDULE_INTERLEAVED, 2, 2, 2)) {
        CHECK(0, "interleaved p=2 v=2 m=2 not built");
        return;
    }
    CHECK(pipeline_problem(&pl) == NULL, "unbroken interleaved schedule flagged: %s", problem);
    loom_pipe_stage_schedule *r1 = &pl.stage[1];
    loom_pipe_action *send = NULL, *recv = NULL;
    for (int i = 0; i < r1->count; i++) {
        loom_pipe_action *a = &r1->actions[i];
        if (a->op == LOOM_PIPE_SEND_ACT && a->micro_batch == 1 && a->chunk == 0) send = a;
        if (a->op == LOOM_PIPE_RECV_ACT && a->micro_batch == 0 && a->chunk == 1) recv = a;
    }
    CHECK(send && recv, "interleaved p=2: rank 1 lacks SA1 or RA0'");
    if (send && recv) {
        loom_pipe_action t = *send;
        *send = *recv;
        *recv = t;
        const char *found = pipeline_problem(&pl);
        CHECK(found != NULL, "interleaved messages out of order not caught");
        if (found) printf("caught interleaved messages out of order: %s\n", found);
    }
    free_pipeline(&pl);
}

static void test_checkers_catch_breakage(void) {
    expect_caught_interleaved();
    expect_caught(0, "send after a receive that waits for it");
    expect_caught(1, "link order that only buffered sends survive");
    expect_caught(2, "dropped action");
    expect_caught(3, "backward before forward");
    expect_caught(4, "activations sent out of order");
    expect_caught(5, "forwards out of micro-batch order");

    /* the simulation alone: mutation 1 deadlocks with rendezvous sends but not buffered ones */
    pipeline pl;
    if (build_pipeline(&pl, LOOM_SCHEDULE_1F1B, 3, 4)) {
        swap_actions(find_action(&pl.stage[2], LOOM_PIPE_RECV_ACT, 2),
                     find_action(&pl.stage[2], LOOM_PIPE_SEND_GRAD, 1));
        double makespan;
        const char *buffered = simulate_buffered(&pl, &makespan);
        CHECK(buffered == NULL, "buffered sends should survive the swap: %s", buffered);
        const char *rendezvous = simulate_rendezvous(&pl, &makespan);
        CHECK(rendezvous && strstr(rendezvous, "deadlock"), "rendezvous sends should deadlock");
    }
    free_pipeline(&pl);

    /* mutation 0 deadlocks even with buffered sends: stage 1 waits for gradient 1 before it
     * sends activation 2, which stage 2 waits for before it sends that gradient */
    if (build_pipeline(&pl, LOOM_SCHEDULE_1F1B, 3, 4)) {
        swap_actions(find_action(&pl.stage[1], LOOM_PIPE_SEND_ACT, 2),
                     find_action(&pl.stage[1], LOOM_PIPE_RECV_GRAD, 1));
        double makespan;
        const char *buffered = simulate_buffered(&pl, &makespan);
        CHECK(buffered && strstr(buffered, "deadlock") && strstr(buffered, "stage 1 waits") &&
                  strstr(buffered, "stage 2 waits"),
              "buffered sends should deadlock on stages 1 and 2: %s",
              buffered ? buffered : "finished");
        if (buffered) printf("caught by the simulator alone: %s\n", buffered);
    }
    free_pipeline(&pl);
}

/* Optimus-CC's epilogue: under 1F1B stage s (>= 1) of p sends min(p - s, m) gradients after its
 * last forward, those of the last micro-batches; under GPipe all m; the first stage none. */
static void test_cooldown_sends(void) {
    for (int kind = 0; kind < 2; kind++) {
        for (int p = 1; p <= 5; p++) {
            for (int m = 1; m <= 7; m++) {
                for (int s = 0; s < p; s++) {
                    loom_pipe_stage_schedule sched;
                    if (loom_pipe_schedule((loom_schedule_kind)kind, p, m, s, &sched) != LOOM_OK)
                        continue;
                    unsigned char cool[8];
                    int n = loom_pipe_cooldown_sends(&sched, 1, m, cool);
                    int expect = s == 0                        ? 0
                                 : kind == LOOM_SCHEDULE_GPIPE ? m
                                 : p - s < m                   ? p - s
                                                               : m;
                    int last = 1;
                    for (int mb = 0; mb < m; mb++) last &= cool[mb] == (mb >= m - expect);
                    CHECK(n == expect && last,
                          "%s p=%d m=%d stage %d: %d cool-down sends, "
                          "expected the last %d",
                          loom_schedule_kind_name((loom_schedule_kind)kind), p, m, s, n, expect);
                    loom_pipe_schedule_free(&sched);
                }
            }
        }
    }
}

int main(void) {
    test_cooldown_sends();
    test_placement();
    test_all_layouts();
    test_example();
    test_example_zb_h1();
    test_bad_arguments();
    test_checkers_catch_breakage();
    return check_finish();
}
