/*
 * test_schedule.c — pipeline schedules (GPipe, 1F1B) as data. For every stage count 1..6,
 * micro-batch count in {1, 2, 3, 5, 8} and both kinds: each stage forwards and backwards every
 * micro-batch once, in a dependency-respecting order; the two ends of every link list their
 * sends and receives in the same order; all stages run together finish (no deadlock) both with
 * buffered sends (the library's simulator, loom_pipe_simulate) and with synchronous (rendezvous)
 * sends (a step-by-step simulation kept here: the library models only non-blocking sends), and
 * the makespan (forward 1, backward 2, communication 0) is the ideal 3 * (m + p - 1); activation
 * memory (peak in flight) is m for GPipe and min(p - stage, m) for 1F1B. Bad arguments fail
 * with LOOM_ERR_INPUT and a message naming the value. Last, the checkers themselves are shown
 * to catch broken schedules (swapped, dropped, reordered and renumbered actions).
 */
#include "check.h"
#include "loom/parallel.h"

#include <stdlib.h>
#include <string.h>

#define MAX_STAGES 6

static const int micro_batch_counts[] = {1, 2, 3, 5, 8};
static const loom_schedule_kind kinds[] = {LOOM_SCHEDULE_GPIPE, LOOM_SCHEDULE_1F1B};

/* Checkers return NULL when the schedule is fine, else a description of the first problem
 * (in this static buffer), so that the self-test at the end can expect them to fail. */
static char problem[256];

#define PROBLEM(...) (snprintf(problem, sizeof problem, __VA_ARGS__), problem)

typedef struct {
    loom_pipe_stage_schedule stage[MAX_STAGES];
    int stages, micro_batches;
} pipeline;

static int build_pipeline(pipeline *pl, loom_schedule_kind kind, int stages, int micro_batches) {
    memset(pl, 0, sizeof *pl);
    pl->stages = stages, pl->micro_batches = micro_batches;
    for (int s = 0; s < stages; s++) {
        if (loom_pipe_schedule(kind, stages, micro_batches, s, &pl->stage[s]) != LOOM_OK) {
            fprintf(stderr, "loom_pipe_schedule(%s, %d, %d, %d): %s\n",
                    loom_schedule_kind_name(kind), stages, micro_batches, s, loom_last_error());
            return 0;
        }
    }
    return 1;
}

static void free_pipeline(pipeline *pl) {
    for (int s = 0; s < pl->stages; s++) loom_pipe_schedule_free(&pl->stage[s]);
}

static void print_pipeline(const pipeline *pl) {
    for (int s = 0; s < pl->stages; s++) {
        fprintf(stderr, "  stage %d:", s);
        for (int i = 0; i < pl->stage[s].count; i++) {
            fprintf(stderr, " %s%d", loom_pipe_op_name(pl->stage[s].actions[i].op),
                    pl->stage[s].actions[i].micro_batch);
        }
        fprintf(stderr, "\n");
    }
}

/* ---- one stage on its own ----------------------------------------------------------------- */

/* Every micro-batch: exactly one FORWARD and one BACKWARD; RECV_ACT and SEND_GRAD once except
 * on the first stage (never), SEND_ACT and RECV_GRAD once except on the last (never); and the
 * order RECV_ACT < FORWARD < SEND_ACT, FORWARD < BACKWARD, RECV_GRAD < BACKWARD < SEND_GRAD. */
static const char *stage_structure_problem(const pipeline *pl, int s) {
    enum { NOPS = 6 };
    const loom_pipe_stage_schedule *sched = &pl->stage[s];
    int m = pl->micro_batches, is_first = s == 0, is_last = s == pl->stages - 1;
    int expected[NOPS];
    expected[LOOM_PIPE_RECV_ACT] = !is_first, expected[LOOM_PIPE_SEND_GRAD] = !is_first;
    expected[LOOM_PIPE_SEND_ACT] = !is_last, expected[LOOM_PIPE_RECV_GRAD] = !is_last;
    expected[LOOM_PIPE_FORWARD] = 1, expected[LOOM_PIPE_BACKWARD] = 1;

    int(*seen)[NOPS] = calloc((size_t)m, sizeof *seen);         /* how often, per micro-batch */
    int(*position)[NOPS] = calloc((size_t)m, sizeof *position); /* where, per micro-batch */
    if (!seen || !position) {
        free(seen);
        free(position);
        return PROBLEM("out of memory");
    }
    const char *found = NULL;
    for (int i = 0; i < sched->count && !found; i++) {
        loom_pipe_action a = sched->actions[i];
        if ((int)a.op < 0 || (int)a.op >= NOPS) {
            found = PROBLEM("stage %d action %d: op %d out of range", s, i, (int)a.op);
        } else if (a.micro_batch < 0 || a.micro_batch >= m) {
            found = PROBLEM("stage %d action %d: micro-batch %d out of range", s, i, a.micro_batch);
        } else {
            seen[a.micro_batch][a.op]++;
            position[a.micro_batch][a.op] = i;
        }
    }
    for (int mb = 0; mb < m && !found; mb++) {
        for (int op = 0; op < NOPS && !found; op++) {
            if (seen[mb][op] != expected[op]) {
                found =
                    PROBLEM("stage %d of %d: %s of micro-batch %d appears %d times, expected %d", s,
                            pl->stages, loom_pipe_op_name((loom_pipe_op)op), mb, seen[mb][op],
                            expected[op]);
            }
        }
        if (found) break;
        const int *at = position[mb];
        if (at[LOOM_PIPE_BACKWARD] < at[LOOM_PIPE_FORWARD]) {
            found = PROBLEM("stage %d: backward of micro-batch %d before its forward", s, mb);
        } else if (!is_first && at[LOOM_PIPE_RECV_ACT] > at[LOOM_PIPE_FORWARD]) {
            found = PROBLEM("stage %d: forward of micro-batch %d before its input arrives", s, mb);
        } else if (!is_last && at[LOOM_PIPE_SEND_ACT] < at[LOOM_PIPE_FORWARD]) {
            found =
                PROBLEM("stage %d: activation of micro-batch %d sent before its forward", s, mb);
        } else if (!is_last && at[LOOM_PIPE_RECV_GRAD] > at[LOOM_PIPE_BACKWARD]) {
            found =
                PROBLEM("stage %d: backward of micro-batch %d before its gradient arrives", s, mb);
        } else if (!is_first && at[LOOM_PIPE_SEND_GRAD] < at[LOOM_PIPE_BACKWARD]) {
            found = PROBLEM("stage %d: gradient of micro-batch %d sent before its backward", s, mb);
        }
    }
    free(seen);
    free(position);
    return found;
}

/* Forwards run micro-batches 0..m-1 in order, and so do backwards (both kinds). GPipe: every
 * forward before any backward. 1F1B: from the first backward until the forwards run out, F and
 * B alternate (the warm-up length is checked through the peak in flight). */
static const char *compute_order_problem(const pipeline *pl, int s, loom_schedule_kind kind) {
    const loom_pipe_stage_schedule *sched = &pl->stage[s];
    int next_forward = 0, next_backward = 0, backwards_started = 0;
    loom_pipe_op previous = LOOM_PIPE_BACKWARD;
    for (int i = 0; i < sched->count; i++) {
        loom_pipe_action a = sched->actions[i];
        if (a.op == LOOM_PIPE_FORWARD) {
            if (a.micro_batch != next_forward) {
                return PROBLEM("stage %d: forward of micro-batch %d, expected %d", s, a.micro_batch,
                               next_forward);
            }
            if (kind == LOOM_SCHEDULE_GPIPE && backwards_started) {
                return PROBLEM("stage %d: GPipe forward %d after a backward", s, a.micro_batch);
            }
            if (kind == LOOM_SCHEDULE_1F1B && backwards_started && previous == LOOM_PIPE_FORWARD) {
                return PROBLEM("stage %d: 1F1B steady state runs two forwards in a row (%d)", s,
                               a.micro_batch);
            }
            next_forward++;
            previous = a.op;
        } else if (a.op == LOOM_PIPE_BACKWARD) {
            if (a.micro_batch != next_backward) {
                return PROBLEM("stage %d: backward of micro-batch %d, expected %d", s,
                               a.micro_batch, next_backward);
            }
            if (kind == LOOM_SCHEDULE_1F1B && backwards_started && previous == LOOM_PIPE_BACKWARD &&
                next_forward < pl->micro_batches) {
                return PROBLEM("stage %d: 1F1B steady state runs two backwards in a row (%d) "
                               "while forwards remain",
                               s, a.micro_batch);
            }
            backwards_started = 1;
            next_backward++;
            previous = a.op;
        }
    }
    return NULL;
}

/* ---- the links between stages ------------------------------------------------------------- */

/* The actions of stage s (SEND_ACT/RECV_GRAD) and of stage s + 1 (RECV_ACT/SEND_GRAD) that use
 * their link must pair up one to one, in the same order, for the same micro-batches. */
static const char *link_order_problem(const pipeline *pl, int s) {
    const loom_pipe_stage_schedule *lower = &pl->stage[s], *upper = &pl->stage[s + 1];
    int i = 0, j = 0, k = 0;
    for (;; k++) {
        while (i < lower->count && lower->actions[i].op != LOOM_PIPE_SEND_ACT &&
               lower->actions[i].op != LOOM_PIPE_RECV_GRAD) {
            i++;
        }
        while (j < upper->count && upper->actions[j].op != LOOM_PIPE_RECV_ACT &&
               upper->actions[j].op != LOOM_PIPE_SEND_GRAD) {
            j++;
        }
        if (i == lower->count && j == upper->count) return NULL;
        if (i == lower->count || j == upper->count) {
            return PROBLEM("link %d-%d: message %d has no partner on stage %d", s, s + 1, k,
                           i == lower->count ? s : s + 1);
        }
        loom_pipe_action a = lower->actions[i++], b = upper->actions[j++];
        int paired = (a.op == LOOM_PIPE_SEND_ACT && b.op == LOOM_PIPE_RECV_ACT) ||
                     (a.op == LOOM_PIPE_RECV_GRAD && b.op == LOOM_PIPE_SEND_GRAD);
        if (!paired || a.micro_batch != b.micro_batch) {
            return PROBLEM("link %d-%d: message %d is %s %d on stage %d but %s %d on stage %d", s,
                           s + 1, k, loom_pipe_op_name(a.op), a.micro_batch, s,
                           loom_pipe_op_name(b.op), b.micro_batch, s + 1);
        }
    }
}

/* ---- running all stages together ---------------------------------------------------------- */

/* With non-blocking (buffered) sends: the library's simulator (loom_pipe_simulate), forward 1,
 * backward 2, free links. NULL when every stage finished, else why not; *makespan is the step's
 * length. */
static const char *simulate_buffered(const pipeline *pl, double *makespan) {
    double forward[MAX_STAGES], backward[MAX_STAGES], link[MAX_STAGES] = {0};
    for (int s = 0; s < pl->stages; s++) forward[s] = 1.0, backward[s] = 2.0;
    loom_pipe_sim_times times = {pl->stages, pl->stages - 1, forward, backward, link, link};
    loom_pipe_sim_result result;
    loom_status st = loom_pipe_simulate(pl->stage, pl->stages, &times, &result);
    *makespan = result.makespan_s;
    loom_pipe_sim_result_free(&result);
    return st == LOOM_OK ? NULL : PROBLEM("buffered sends: %s", loom_last_error());
}

/* With synchronous (rendezvous) sends, which the library does not model: a send blocks until
 * the peer is at the matching receive (MPI_Ssend), and both complete together. */
typedef struct {
    const pipeline *pl;
    int pc[MAX_STAGES];
    double clock[MAX_STAGES];
    const char *error; /* a message matched to the wrong micro-batch */
} simulation;

static double op_duration(loom_pipe_op op) {
    return op == LOOM_PIPE_FORWARD ? 1.0 : op == LOOM_PIPE_BACKWARD ? 2.0 : 0.0;
}

static const loom_pipe_action *next_action(const simulation *sim, int s) {
    const loom_pipe_stage_schedule *sched = &sim->pl->stage[s];
    return sim->pc[s] < sched->count ? &sched->actions[sim->pc[s]] : NULL;
}

/* The send on stage s to stage peer completes, together with the peer's receive, only when the
 * peer's next action is that receive. */
static int try_rendezvous(simulation *sim, int s, int peer, loom_pipe_op receive,
                          const loom_pipe_action *a) {
    const loom_pipe_action *b = next_action(sim, peer);
    if (!b || b->op != receive) return 0;
    if (b->micro_batch != a->micro_batch) {
        sim->error = PROBLEM("stage %d: %s %d met %s %d on stage %d", s, loom_pipe_op_name(a->op),
                             a->micro_batch, loom_pipe_op_name(b->op), b->micro_batch, peer);
        return 0;
    }
    double t = sim->clock[s] > sim->clock[peer] ? sim->clock[s] : sim->clock[peer];
    sim->clock[s] = sim->clock[peer] = t;
    sim->pc[peer]++;
    return 1;
}

/* Runs stage s's next action if it can complete now; 1 if it did. */
static int step(simulation *sim, int s) {
    const loom_pipe_action *a = next_action(sim, s);
    if (!a) return 0;
    int done = 0;
    if (a->op == LOOM_PIPE_FORWARD || a->op == LOOM_PIPE_BACKWARD) {
        sim->clock[s] += op_duration(a->op);
        done = 1;
    } else if ((a->op == LOOM_PIPE_RECV_ACT || a->op == LOOM_PIPE_SEND_GRAD)
                   ? s == 0
                   : s == sim->pl->stages - 1) {
        sim->error =
            PROBLEM("stage %d: %s across the end of the pipeline", s, loom_pipe_op_name(a->op));
    } else if (a->op == LOOM_PIPE_SEND_ACT) {
        done = try_rendezvous(sim, s, s + 1, LOOM_PIPE_RECV_ACT, a);
    } else if (a->op == LOOM_PIPE_SEND_GRAD) {
        done = try_rendezvous(sim, s, s - 1, LOOM_PIPE_RECV_GRAD, a);
    } /* a receive completes when its sender steps */
    if (done) sim->pc[s]++;
    return done;
}

/* Runs every stage as far as it can until none can move. Returns NULL when every stage finished,
 * else what stopped them; *makespan is the latest stage clock. */
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
            return PROBLEM("deadlock (rendezvous sends): stage %d stuck at action %d, %s %d", s,
                           sim.pc[s], loom_pipe_op_name(a->op), a->micro_batch);
        }
    }
    return NULL;
}

/* Every check that does not depend on the kind's memory bound; NULL when all pass. */
static const char *pipeline_problem(const pipeline *pl, loom_schedule_kind kind) {
    const char *p = NULL;
    for (int s = 0; s < pl->stages && !p; s++) p = stage_structure_problem(pl, s);
    for (int s = 0; s < pl->stages && !p; s++) p = compute_order_problem(pl, s, kind);
    for (int s = 0; s + 1 < pl->stages && !p; s++) p = link_order_problem(pl, s);
    double makespan;
    if (!p) p = simulate_buffered(pl, &makespan);
    if (!p) p = simulate_rendezvous(pl, &makespan);
    return p;
}

/* ---- the tests ---------------------------------------------------------------------------- */

static void test_all_layouts(void) {
    for (int ki = 0; ki < 2; ki++) {
        loom_schedule_kind kind = kinds[ki];
        const char *name = loom_schedule_kind_name(kind);
        for (int p = 1; p <= MAX_STAGES; p++) {
            for (int mi = 0; mi < (int)(sizeof micro_batch_counts / sizeof *micro_batch_counts);
                 mi++) {
                int m = micro_batch_counts[mi];
                pipeline pl;
                int built = build_pipeline(&pl, kind, p, m);
                CHECK(built, "%s p=%d m=%d: schedule not built", name, p, m);
                if (!built) {
                    free_pipeline(&pl);
                    continue;
                }
                int failed_before = check_failed;

                const char *p_problem = pipeline_problem(&pl, kind);
                CHECK(p_problem == NULL, "%s p=%d m=%d: %s", name, p, m, p_problem);

                /* Ideal makespan: m forward+backward pairs on the slowest path plus the (p - 1)
                 * fill and drain, i.e. bubble (p - 1) * (F + B), for both kinds and semantics. */
                double ideal = 3.0 * (m + p - 1), buffered = 0, rendezvous = 0;
                const char *sim_problem = simulate_buffered(&pl, &buffered);
                CHECK(!sim_problem && buffered == ideal,
                      "%s p=%d m=%d: buffered makespan %g, expected %g (%s)", name, p, m, buffered,
                      ideal, sim_problem ? sim_problem : "finished");
                sim_problem = simulate_rendezvous(&pl, &rendezvous);
                CHECK(!sim_problem && rendezvous == ideal,
                      "%s p=%d m=%d: rendezvous makespan %g, expected %g (%s)", name, p, m,
                      rendezvous, ideal, sim_problem ? sim_problem : "finished");

                for (int s = 0; s < p; s++) {
                    int peak = loom_pipe_peak_in_flight(&pl.stage[s]);
                    int bound = kind == LOOM_SCHEDULE_GPIPE ? m : (p - s < m ? p - s : m);
                    CHECK(peak == bound, "%s p=%d m=%d stage %d: peak in flight %d, expected %d",
                          name, p, m, s, peak, bound);
                    CHECK(peak <= m, "%s p=%d m=%d stage %d: peak %d above m", name, p, m, s, peak);
                }
                if (check_failed != failed_before) print_pipeline(&pl);
                free_pipeline(&pl);
            }
        }
    }
}

/* The exact lists for one small case, so that a reader sees what the schedule is. */
static void test_example(void) {
    pipeline pl;
    if (!build_pipeline(&pl, LOOM_SCHEDULE_1F1B, 3, 4)) {
        CHECK(0, "1f1b p=3 m=4 not built");
        return;
    }
    static const char *expected[3] = {
        "F0 SA0 F1 SA1 F2 SA2 RG0 B0 F3 SA3 RG1 B1 RG2 B2 RG3 B3",
        "RA0 F0 SA0 RA1 F1 SA1 RG0 B0 RA2 SG0 F2 SA2 RG1 B1 RA3 SG1 F3 SA3 RG2 B2 SG2 RG3 B3 SG3",
        "RA0 F0 B0 RA1 SG0 F1 B1 RA2 SG1 F2 B2 RA3 SG2 F3 B3 SG3",
    };
    static const char *abbreviation[] = {"RA", "F", "SA", "RG", "B", "SG"};
    for (int s = 0; s < 3; s++) {
        char text[512] = "";
        size_t used = 0;
        for (int i = 0; i < pl.stage[s].count && used < sizeof text; i++) {
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%s%d", i ? " " : "",
                                     abbreviation[pl.stage[s].actions[i].op],
                                     pl.stage[s].actions[i].micro_batch);
        }
        CHECK(strcmp(text, expected[s]) == 0,
              "1f1b p=3 m=4 stage %d:\n  got      %s\n  expected %s", s, text, expected[s]);
    }
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
    expect_input_error(loom_pipe_schedule(LOOM_SCHEDULE_1F1B, 4, 8, 0, NULL), "no output",
                       "NULL output");

    loom_schedule_kind kind = LOOM_SCHEDULE_GPIPE;
    CHECK(loom_schedule_kind_parse("1f1b", &kind) == LOOM_OK && kind == LOOM_SCHEDULE_1F1B,
          "parse 1f1b");
    CHECK(loom_schedule_kind_parse("gpipe", &kind) == LOOM_OK && kind == LOOM_SCHEDULE_GPIPE,
          "parse gpipe");
    for (int ki = 0; ki < 2; ki++) {
        CHECK(loom_schedule_kind_parse(loom_schedule_kind_name(kinds[ki]), &kind) == LOOM_OK &&
                  kind == kinds[ki],
              "name of kind %d does not parse back", (int)kinds[ki]);
    }
    expect_input_error(loom_schedule_kind_parse("interleaved", &kind),
                       "unknown schedule \"interleaved\"; expected \"gpipe\" or \"1f1b\"",
                       "kind interleaved");
    expect_input_error(loom_schedule_kind_parse("", &kind), "unknown schedule \"\"", "kind \"\"");
    expect_input_error(loom_schedule_kind_parse("1F1B ", &kind), "1F1B ", "kind \"1F1B \"");
    expect_input_error(loom_schedule_kind_parse(NULL, &kind), "(null)", "kind NULL");
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
    CHECK(pipeline_problem(&pl, LOOM_SCHEDULE_1F1B) == NULL, "unbroken schedule flagged: %s",
          problem);
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
        s0->actions[1] = (loom_pipe_action){LOOM_PIPE_FORWARD, 1};
        s0->actions[2] = (loom_pipe_action){LOOM_PIPE_SEND_ACT, 1};
        s0->actions[3] = (loom_pipe_action){LOOM_PIPE_SEND_ACT, 0};
        break;
    case 5: /* micro-batches forwarded out of order (consistently on every stage) */
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < pl.stage[s].count; i++)
                if (pl.stage[s].actions[i].micro_batch < 2) pl.stage[s].actions[i].micro_batch ^= 1;
        break;
    default:
        break;
    }
    const char *found = pipeline_problem(&pl, LOOM_SCHEDULE_1F1B);
    CHECK(found != NULL, "broken schedule (%s) not caught", what);
    if (found) printf("caught %s: %s\n", what, found);
    free_pipeline(&pl);
}

static void test_checkers_catch_breakage(void) {
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
                    int n = loom_pipe_cooldown_sends(&sched, m, cool);
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
    test_all_layouts();
    test_example();
    test_bad_arguments();
    test_checkers_catch_breakage();
    return check_finish();
}
