/*
 * test_simulate.c — the pipeline schedule simulator (loom_pipe_simulate). Hand-computed cases,
 * every action's start, end and slack and every message's slack written out below: 1F1B with
 * p=2, m=2; a slow gradient link that makes an activation send critical; uneven stages. Then
 * GPipe and 1F1B take the same time with free links; a deadlocking schedule, mismatched
 * messages and bad arguments are errors, not hangs. Last, for random small cases, the makespan
 * and every end time equal the longest paths that an independent relaxation over the step's
 * graph finds, and each slack is exactly how much that graph can absorb: delaying a message
 * (or lengthening a compute action) by its slack leaves the makespan, by slack + d adds d.
 */
#include "check.h"
#include "loom/parallel.h"

#include <stdlib.h>
#include <string.h>

#define MAX_STAGES  6
#define MAX_ACTIONS 160 /* per stage, in the random cases */
#define MAX_V       (MAX_STAGES * 3)

typedef struct {
    loom_pipe_shape shape;
    loom_pipe_stage_schedule stage[MAX_STAGES];
    int stages;
} pipeline;

static int build_shape(pipeline *pl, loom_schedule_kind kind, int stages, int chunks,
                       int micro_batches) {
    memset(pl, 0, sizeof *pl);
    pl->stages = stages;
    pl->shape = (loom_pipe_shape){kind, stages, chunks, micro_batches};
    for (int s = 0; s < stages; s++) {
        if (loom_pipe_schedule_build(&pl->shape, s, &pl->stage[s]) != LOOM_OK) {
            CHECK(0, "loom_pipe_schedule_build(%s, p %d, v %d, m %d, rank %d): %s",
                  loom_schedule_kind_name(kind), stages, chunks, micro_batches, s,
                  loom_last_error());
            return 0;
        }
    }
    return 1;
}

static int build(pipeline *pl, loom_schedule_kind kind, int stages, int micro_batches) {
    return build_shape(pl, kind, stages, loom_plan_schedule_chunks(kind), micro_batches);
}

static void free_pipeline(pipeline *pl) {
    for (int s = 0; s < pl->stages; s++) loom_pipe_schedule_free(&pl->stage[s]);
}

static loom_pipe_sim_times times_of(int stages, const double *forward, const double *backward,
                                    const double *act_link, const double *grad_link) {
    return (loom_pipe_sim_times){stages, stages - 1, forward, backward, act_link, grad_link,
                                 NULL,   NULL,       NULL,    NULL,     NULL};
}

static const char *abbreviation[] = {"RA", "F", "SA", "RG", "B", "SG"};

/* One row of a hand-computed table: the action ("SA1" = SEND_ACT of micro-batch 1), its start
 * and end, its slack, and for a send its message's slack. */
typedef struct {
    const char *action;
    double start, end, slack, message_slack;
} expected_action;

static void check_stage(const char *what, const pipeline *pl, const loom_pipe_sim_result *r, int s,
                        const expected_action *rows, int count) {
    CHECK(pl->stage[s].count == count, "%s stage %d: %d actions, table has %d", what, s,
          pl->stage[s].count, count);
    for (int i = 0; i < count && i < pl->stage[s].count; i++) {
        loom_pipe_action a = pl->stage[s].actions[i];
        char name[16];
        snprintf(name, sizeof name, "%s%d", abbreviation[a.op], a.micro_batch);
        const expected_action *e = &rows[i];
        const loom_pipe_sim_action *got = &r->stage[s][i];
        char label[96];
        snprintf(label, sizeof label, "%s stage %d action %d (%s)", what, s, i, name);
        CHECK(strcmp(name, e->action) == 0, "%s: table says %s", label, e->action);
        CHECK(got->start_s == e->start && got->end_s == e->end, "%s: [%g, %g], expected [%g, %g]",
              label, got->start_s, got->end_s, e->start, e->end);
        CHECK_CLOSE(got->slack_s, e->slack, 0, 1e-12, label);
        CHECK(got->critical == (e->slack == 0.0), "%s: critical %d with slack %g", label,
              got->critical, e->slack);
        int send = a.op == LOOM_PIPE_SEND_ACT || a.op == LOOM_PIPE_SEND_GRAD;
        CHECK_CLOSE(got->message_slack_s, send ? e->message_slack : 0.0, 0, 1e-12, label);
    }
}

#define ROWS(table) (table), (int)(sizeof(table) / sizeof *(table))

/* ---- hand-computed cases ------------------------------------------------------------------ */

/* 1F1B, p=2, m=2, forward 1, backward 2 on both stages, every link 0.5.
 *   stage 0: F0 SA0 F1 SA1 RG0 B0 RG1 B1        stage 1: RA0 F0 B0 RA1 SG0 F1 B1 SG1
 * Forward pass (a message arrives 0.5 after it is sent):
 *   stage 0: F0 [0,1], SA0 at 1 (arrives 1.5), F1 [1,2], SA1 at 2 (arrives 2.5), then RG0 waits.
 *   stage 1: RA0 [0,1.5], F0 [1.5,2.5], B0 [2.5,4.5], RA1 [4.5,4.5] (arrived at 2.5), SG0 at
 *            4.5 (arrives 5), F1 [4.5,5.5], B1 [5.5,7.5], SG1 at 7.5 (arrives 8).
 *   stage 0: RG0 [2,5], B0 [5,7], RG1 [7,8], B1 [8,10].   Makespan 10 = 3(m+p-1) + 2 x 0.5.
 * Backward pass, latest ends L (an action may end by L(next) - duration(next); a send also by
 * L(its receive) - link):
 *   stage 0: B1 10, RG1 8, B0 8, RG0 6.
 *   stage 1: SG1 min(10, 8 - 0.5) = 7.5, B1 7.5, F1 5.5, SG0 min(5.5 - 1, 6 - 0.5) = 4.5,
 *            RA1 4.5, B0 4.5, F0 2.5, RA0 1.5.
 *   stage 0: SA1 min(6, 4.5 - 0.5) = 4, F1 4, SA0 min(4 - 1, 1.5 - 0.5) = 1, F0 1.
 * Slack = L - end. Message slack = L(receive) - arrival: SA0 1.5 - 1.5 = 0, SA1 4.5 - 2.5 = 2,
 * SG0 6 - 5 = 1, SG1 8 - 8 = 0. The critical path: F0, SA0, stage 1 all through, SG1, RG1, B1. */
static void test_1f1b_two_stages(void) {
    pipeline pl;
    if (!build(&pl, LOOM_SCHEDULE_1F1B, 2, 2)) return;
    double forward[] = {1, 1}, backward[] = {2, 2}, link[] = {0.5};
    loom_pipe_sim_times times = times_of(2, forward, backward, link, link);
    loom_pipe_sim_result r;
    loom_status st = loom_pipe_simulate(&pl.shape, pl.stage, &times, &r);
    CHECK(st == LOOM_OK, "1f1b p=2 m=2: %s", loom_last_error());
    if (st == LOOM_OK) {
        static const expected_action stage0[] = {
            {"F0", 0, 1, 0, 0},  {"SA0", 1, 1, 0, 0}, {"F1", 1, 2, 2, 0},  {"SA1", 2, 2, 2, 2},
            {"RG0", 2, 5, 1, 0}, {"B0", 5, 7, 1, 0},  {"RG1", 7, 8, 0, 0}, {"B1", 8, 10, 0, 0},
        };
        static const expected_action stage1[] = {
            {"RA0", 0, 1.5, 0, 0},   {"F0", 1.5, 2.5, 0, 0},  {"B0", 2.5, 4.5, 0, 0},
            {"RA1", 4.5, 4.5, 0, 0}, {"SG0", 4.5, 4.5, 0, 1}, {"F1", 4.5, 5.5, 0, 0},
            {"B1", 5.5, 7.5, 0, 0},  {"SG1", 7.5, 7.5, 0, 0},
        };
        CHECK(r.makespan_s == 10.0, "1f1b p=2 m=2: makespan %g, expected 10", r.makespan_s);
        CHECK(r.ranks == 2, "result has %d ranks", r.ranks);
        check_stage("1f1b p=2 m=2", &pl, &r, 0, ROWS(stage0));
        check_stage("1f1b p=2 m=2", &pl, &r, 1, ROWS(stage1));
        CHECK(r.stage[0][1].arrival_s == 1.5 && r.stage[1][4].arrival_s == 5.0,
              "arrivals: SA0 %g (expected 1.5), SG0 %g (expected 5)", r.stage[0][1].arrival_s,
              r.stage[1][4].arrival_s);
    }
    loom_pipe_sim_result_free(&r);
    free_pipeline(&pl);
}

/* 1F1B, p=2, m=3, forward 1 on both stages, backward 2 on stage 0 and 3 on stage 1; activation
 * link 0.25. The steady state has a round trip: stage 0 sends activation 2 only after gradient
 * 0 came back, while stage 1 works on micro-batch 1 meanwhile. That work (F1 + B1 = 4) covers
 * the round trip (link g + B0 + F2 on stage 0 + link 0.25 = 3.25 + g) when the gradient link g
 * is fast, and no longer when it is slow: then SA2 (an activation send) and SG0 turn critical.
 *   stage 0: F0 SA0 F1 SA1 RG0 B0 F2 SA2 RG1 B1 RG2 B2
 *   stage 1: RA0 F0 B0 RA1 SG0 F1 B1 RA2 SG1 F2 B2 SG2
 *
 * Gradient link 0.25. Forward pass:
 *   stage 0: F0 [0,1], SA0 at 1 (arrives 1.25), F1 [1,2], SA1 at 2 (2.25), RG0 waits from 2.
 *   stage 1: RA0 [0,1.25], F0 [1.25,2.25], B0 [2.25,5.25], RA1 [5.25,5.25], SG0 at 5.25
 *            (arrives 5.5), F1 [5.25,6.25], B1 [6.25,9.25], RA2 waits from 9.25.
 *   stage 0: RG0 [2,5.5], B0 [5.5,7.5], F2 [7.5,8.5], SA2 at 8.5 (arrives 8.75).
 *   stage 1: RA2 [9.25,9.25], SG1 at 9.25 (9.5), F2 [9.25,10.25], B2 [10.25,13.25], SG2 at
 *            13.25 (13.5).
 *   stage 0: RG1 [8.5,9.5], B1 [9.5,11.5], RG2 [11.5,13.5], B2 [13.5,15.5]. Makespan 15.5.
 * Latest ends: stage 0 B2 15.5, RG2 13.5, B1 13.5, RG1 11.5; stage 1 SG2 min(15.5, 13.5 -
 * 0.25) = 13.25, B2 13.25, F2 10.25, SG1 min(9.25, 11.5 - 0.25) = 9.25, RA2 9.25, B1 9.25,
 * F1 6.25; stage 0 SA2 min(11.5, 9.25 - 0.25) = 9, F2 9, B0 8, RG0 6; stage 1 SG0 min(5.25,
 * 6 - 0.25) = 5.25, RA1 5.25, B0 5.25, F0 2.25, RA0 1.25; stage 0 SA1 min(6, 5.25 - 0.25) = 5,
 * F1 5, SA0 min(4, 1) = 1, F0 1.
 * Message slacks: SA0 1.25 - 1.25 = 0, SA1 5.25 - 2.25 = 3, SA2 9.25 - 8.75 = 0.5,
 * SG0 6 - 5.5 = 0.5, SG1 11.5 - 9.5 = 2, SG2 13.5 - 13.5 = 0.
 *
 * Gradient link 1.25 (slow). Forward pass:
 *   stage 1 as before up to SG0 at 5.25, now arriving 6.5; B1 ends 9.25, RA2 waits from 9.25.
 *   stage 0: RG0 [2,6.5], B0 [6.5,8.5], F2 [8.5,9.5], SA2 at 9.5 (arrives 9.75).
 *   stage 1: RA2 [9.25,9.75], SG1 at 9.75 (11), F2 [9.75,10.75], B2 [10.75,13.75], SG2 at 13.75
 *            (15).
 *   stage 0: RG1 [9.5,11], B1 [11,13], RG2 [13,15], B2 [15,17]. Makespan 17.
 * Latest ends: stage 0 B2 17, RG2 15, B1 15, RG1 13; stage 1 SG2 min(17, 15 - 1.25) = 13.75,
 * B2 13.75, F2 10.75, SG1 min(9.75, 13 - 1.25) = 9.75, RA2 9.75, B1 9.75, F1 6.75; stage 0 SA2
 * min(13, 9.75 - 0.25) = 9.5, F2 9.5, B0 8.5, RG0 6.5; stage 1 SG0 min(6.75 - 1, 6.5 - 1.25) =
 * 5.25, RA1 5.25, B0 5.25, F0 2.25, RA0 1.25; stage 0 SA1 min(6.5, 5) = 5, F1 5, SA0 1, F0 1.
 * Message slacks: SA0 0, SA1 3, SA2 9.75 - 9.75 = 0, SG0 6.5 - 6.5 = 0, SG1 13 - 11 = 2,
 * SG2 15 - 15 = 0. Stage 1's F1 and B1 now have 0.5 to spare. */
static void test_slow_link_makes_send_critical(void) {
    pipeline pl;
    if (!build(&pl, LOOM_SCHEDULE_1F1B, 2, 3)) return;
    double forward[] = {1, 1}, backward[] = {2, 3}, act_link[] = {0.25};
    static const expected_action fast0[] = {
        {"F0", 0, 1, 0, 0},       {"SA0", 1, 1, 0, 0},         {"F1", 1, 2, 3, 0},
        {"SA1", 2, 2, 3, 3},      {"RG0", 2, 5.5, 0.5, 0},     {"B0", 5.5, 7.5, 0.5, 0},
        {"F2", 7.5, 8.5, 0.5, 0}, {"SA2", 8.5, 8.5, 0.5, 0.5}, {"RG1", 8.5, 9.5, 2, 0},
        {"B1", 9.5, 11.5, 2, 0},  {"RG2", 11.5, 13.5, 0, 0},   {"B2", 13.5, 15.5, 0, 0},
    };
    static const expected_action fast1[] = {
        {"RA0", 0, 1.25, 0, 0},    {"F0", 1.25, 2.25, 0, 0},    {"B0", 2.25, 5.25, 0, 0},
        {"RA1", 5.25, 5.25, 0, 0}, {"SG0", 5.25, 5.25, 0, 0.5}, {"F1", 5.25, 6.25, 0, 0},
        {"B1", 6.25, 9.25, 0, 0},  {"RA2", 9.25, 9.25, 0, 0},   {"SG1", 9.25, 9.25, 0, 2},
        {"F2", 9.25, 10.25, 0, 0}, {"B2", 10.25, 13.25, 0, 0},  {"SG2", 13.25, 13.25, 0, 0},
    };
    static const expected_action slow0[] = {
        {"F0", 0, 1, 0, 0},     {"SA0", 1, 1, 0, 0},     {"F1", 1, 2, 3, 0},
        {"SA1", 2, 2, 3, 3},    {"RG0", 2, 6.5, 0, 0},   {"B0", 6.5, 8.5, 0, 0},
        {"F2", 8.5, 9.5, 0, 0}, {"SA2", 9.5, 9.5, 0, 0}, {"RG1", 9.5, 11, 2, 0},
        {"B1", 11, 13, 2, 0},   {"RG2", 13, 15, 0, 0},   {"B2", 15, 17, 0, 0},
    };
    static const expected_action slow1[] = {
        {"RA0", 0, 1.25, 0, 0},     {"F0", 1.25, 2.25, 0, 0},   {"B0", 2.25, 5.25, 0, 0},
        {"RA1", 5.25, 5.25, 0, 0},  {"SG0", 5.25, 5.25, 0, 0},  {"F1", 5.25, 6.25, 0.5, 0},
        {"B1", 6.25, 9.25, 0.5, 0}, {"RA2", 9.25, 9.75, 0, 0},  {"SG1", 9.75, 9.75, 0, 2},
        {"F2", 9.75, 10.75, 0, 0},  {"B2", 10.75, 13.75, 0, 0}, {"SG2", 13.75, 13.75, 0, 0},
    };
    struct {
        double grad_link, makespan;
        const expected_action *stage0, *stage1;
        const char *what;
    } cases[] = {
        {0.25, 15.5, fast0, fast1, "1f1b p=2 m=3, fast gradient link"},
        {1.25, 17.0, slow0, slow1, "1f1b p=2 m=3, slow gradient link"},
    };
    for (int c = 0; c < 2; c++) {
        double grad_link[] = {cases[c].grad_link};
        loom_pipe_sim_times times = times_of(2, forward, backward, act_link, grad_link);
        loom_pipe_sim_result r;
        loom_status st = loom_pipe_simulate(&pl.shape, pl.stage, &times, &r);
        CHECK(st == LOOM_OK, "%s: %s", cases[c].what, loom_last_error());
        if (st != LOOM_OK) continue;
        CHECK(r.makespan_s == cases[c].makespan, "%s: makespan %g, expected %g", cases[c].what,
              r.makespan_s, cases[c].makespan);
        check_stage(cases[c].what, &pl, &r, 0, cases[c].stage0, 12);
        check_stage(cases[c].what, &pl, &r, 1, cases[c].stage1, 12);
        loom_pipe_sim_result_free(&r);
    }
    free_pipeline(&pl);
}

/* 1F1B, p=2, m=2, stage 0 twice as slow as stage 1 (forward 2, backward 4 against 1 and 2),
 * free links.
 *   stage 0: F0 [0,2], SA0 at 2, F1 [2,4], SA1 at 4, RG0 [4,5], B0 [5,9], RG1 [9,9], B1 [9,13].
 *   stage 1: RA0 [0,2], F0 [2,3], B0 [3,5], RA1 [5,5], SG0 at 5, F1 [5,6], B1 [6,8], SG1 at 8.
 * Makespan 13: F0 on stage 0, F0 and B0 on stage 1, then stage 0's two backwards.
 * Latest ends: stage 0 B1 13, RG1 9, B0 9, RG0 5; stage 1 SG1 min(13, 9) = 9, B1 9, F1 7, SG0
 * min(6, 5) = 5, RA1 5, B0 5, F0 3, RA0 2; stage 0 SA1 min(5, 5) = 5, F1 5, SA0 min(3, 2) = 2,
 * F0 2. Message slacks: SA0 2 - 2 = 0, SA1 5 - 4 = 1, SG0 5 - 5 = 0, SG1 9 - 8 = 1. */
static void test_uneven_stages(void) {
    pipeline pl;
    if (!build(&pl, LOOM_SCHEDULE_1F1B, 2, 2)) return;
    double forward[] = {2, 1}, backward[] = {4, 2}, link[] = {0};
    loom_pipe_sim_times times = times_of(2, forward, backward, link, link);
    loom_pipe_sim_result r;
    loom_status st = loom_pipe_simulate(&pl.shape, pl.stage, &times, &r);
    CHECK(st == LOOM_OK, "uneven: %s", loom_last_error());
    if (st == LOOM_OK) {
        static const expected_action stage0[] = {
            {"F0", 0, 2, 0, 0},  {"SA0", 2, 2, 0, 0}, {"F1", 2, 4, 1, 0},  {"SA1", 4, 4, 1, 1},
            {"RG0", 4, 5, 0, 0}, {"B0", 5, 9, 0, 0},  {"RG1", 9, 9, 0, 0}, {"B1", 9, 13, 0, 0},
        };
        static const expected_action stage1[] = {
            {"RA0", 0, 2, 0, 0}, {"F0", 2, 3, 0, 0}, {"B0", 3, 5, 0, 0}, {"RA1", 5, 5, 0, 0},
            {"SG0", 5, 5, 0, 0}, {"F1", 5, 6, 1, 0}, {"B1", 6, 8, 1, 0}, {"SG1", 8, 8, 1, 1},
        };
        CHECK(r.makespan_s == 13.0, "uneven: makespan %g, expected 13", r.makespan_s);
        check_stage("uneven", &pl, &r, 0, ROWS(stage0));
        check_stage("uneven", &pl, &r, 1, ROWS(stage1));
    }
    loom_pipe_sim_result_free(&r);
    free_pipeline(&pl);
}

/* With equal stages and free links both schedules take (m + p - 1)(F + B): the same bubble. A
 * single stage (no links at all) takes m(F + B). */
static void test_gpipe_equals_1f1b(void) {
    double forward[MAX_STAGES], backward[MAX_STAGES], link[MAX_STAGES] = {0};
    for (int s = 0; s < MAX_STAGES; s++) forward[s] = 0.75, backward[s] = 1.5;
    for (int p = 1; p <= MAX_STAGES; p++) {
        for (int m = 1; m <= 8; m++) {
            double makespan[2];
            for (int k = 0; k < 2; k++) {
                loom_schedule_kind kind = k ? LOOM_SCHEDULE_1F1B : LOOM_SCHEDULE_GPIPE;
                pipeline pl;
                makespan[k] = -1;
                if (!build(&pl, kind, p, m)) continue;
                loom_pipe_sim_times times = times_of(p, forward, backward, link, link);
                if (p == 1) times.act_link_s = times.grad_link_s = NULL;
                loom_pipe_sim_result r;
                if (loom_pipe_simulate(&pl.shape, pl.stage, &times, &r) == LOOM_OK) {
                    makespan[k] = r.makespan_s;
                } else {
                    CHECK(0, "%s p=%d m=%d: %s", loom_schedule_kind_name(kind), p, m,
                          loom_last_error());
                }
                loom_pipe_sim_result_free(&r);
                free_pipeline(&pl);
            }
            double ideal = (m + p - 1) * 2.25;
            CHECK(makespan[0] == ideal && makespan[1] == ideal,
                  "p=%d m=%d: gpipe %g, 1f1b %g, expected %g", p, m, makespan[0], makespan[1],
                  ideal);
        }
    }
}

/* ---- errors ------------------------------------------------------------------------------- */

static void expect_input_error(loom_status st, const loom_pipe_sim_result *r, const char *needle,
                               const char *what) {
    CHECK(st == LOOM_ERR_INPUT, "%s: status %d, expected LOOM_ERR_INPUT", what, (int)st);
    CHECK(strstr(loom_last_error(), needle) != NULL, "%s: message \"%s\" does not name \"%s\"",
          what, loom_last_error(), needle);
    if (r) {
        CHECK(r->stage == NULL && r->memory == NULL && r->ranks == 0, "%s: output not emptied",
              what);
    }
}

/* Hand-made two-stage schedules of one micro-batch. */
static loom_status simulate_two(loom_pipe_action *stage0, int count0, loom_pipe_action *stage1,
                                int count1, loom_pipe_sim_result *r) {
    loom_pipe_stage_schedule schedules[2] = {{stage0, count0}, {stage1, count1}};
    double forward[] = {1, 1}, backward[] = {2, 2}, link[] = {0};
    loom_pipe_sim_times times = times_of(2, forward, backward, link, link);
    loom_pipe_shape shape = {LOOM_SCHEDULE_1F1B, 2, 1, 1};
    return loom_pipe_simulate(&shape, schedules, &times, r);
}

#define A(op, mb) ((loom_pipe_action){LOOM_PIPE_##op, (mb), 0})

static void test_bad_schedules(void) {
    loom_pipe_sim_result r;
    /* both stages receive first: stage 0 the gradient, stage 1 the activation */
    loom_pipe_action wait0[] = {A(RECV_GRAD, 0), A(FORWARD, 0), A(SEND_ACT, 0), A(BACKWARD, 0)};
    loom_pipe_action wait1[] = {A(RECV_ACT, 0), A(FORWARD, 0), A(BACKWARD, 0), A(SEND_GRAD, 0)};
    expect_input_error(simulate_two(wait0, 4, wait1, 4, &r), &r,
                       "deadlock, the schedules cannot finish: stage 0 waits at action 0 "
                       "(recv_grad of micro-batch 0) for stage 1; stage 1 waits at action 0 "
                       "(recv_act of micro-batch 0) for stage 0",
                       "both stages receive first");

    /* a deadlock after some progress: stage 1 waits for a second activation never sent before
     * stage 0's gradient wait */
    loom_pipe_action fine0[] = {A(FORWARD, 0), A(SEND_ACT, 0), A(RECV_GRAD, 0), A(BACKWARD, 0),
                                A(FORWARD, 1), A(SEND_ACT, 1), A(RECV_GRAD, 1), A(BACKWARD, 1)};
    loom_pipe_action late1[] = {A(RECV_ACT, 0),  A(FORWARD, 0), A(RECV_ACT, 1), A(BACKWARD, 0),
                                A(SEND_GRAD, 0), A(FORWARD, 1), A(BACKWARD, 1), A(SEND_GRAD, 1)};
    expect_input_error(simulate_two(fine0, 8, late1, 8, &r), &r,
                       "stage 0 waits at action 2 (recv_grad of micro-batch 0) for stage 1; "
                       "stage 1 waits at action 2 (recv_act of micro-batch 1)",
                       "deadlock after progress");

    loom_pipe_action swapped1[] = {A(RECV_ACT, 1), A(FORWARD, 0), A(BACKWARD, 0), A(SEND_GRAD, 0)};
    loom_pipe_action plain0[] = {A(FORWARD, 0), A(SEND_ACT, 0), A(RECV_GRAD, 0), A(BACKWARD, 0)};
    expect_input_error(simulate_two(plain0, 4, swapped1, 4, &r), &r,
                       "stages 0 -> 1: activation message 0 is micro-batch 0 across boundary 0 "
                       "on stage 0 (action 1) but micro-batch 1 across boundary 0 on stage 1 "
                       "(action 0)",
                       "mismatched micro-batch");
    expect_input_error(simulate_two(plain0, 4, wait1, 3, &r), &r,
                       "stages 1 -> 0: gradient message 0 (stage 0 action 2, recv_grad of "
                       "micro-batch 0) has no partner on stage 1",
                       "receive without a send");
    loom_pipe_action extra0[] = {A(FORWARD, 0), A(SEND_ACT, 0), A(SEND_ACT, 0), A(RECV_GRAD, 0),
                                 A(BACKWARD, 0)};
    expect_input_error(simulate_two(extra0, 5, wait1, 4, &r), &r,
                       "activation message 1 (stage 0 action 2, send_act of micro-batch 0) has "
                       "no partner on stage 1",
                       "send without a receive");
    loom_pipe_action across[] = {A(RECV_ACT, 0), A(FORWARD, 0), A(BACKWARD, 0)};
    expect_input_error(simulate_two(across, 3, wait1, 4, &r), &r,
                       "stage 0 action 0: recv_act across the end of a 2-stage pipeline",
                       "receive from before the first stage");
    loom_pipe_action bad_op[] = {A(FORWARD, 0), {(loom_pipe_op)9, 0, 0}};
    expect_input_error(simulate_two(bad_op, 2, wait1, 4, &r), &r, "stage 0 action 1: op 9",
                       "op out of range");
    loom_pipe_action bad_mb[] = {A(FORWARD, -3)};
    expect_input_error(simulate_two(plain0, 4, bad_mb, 1, &r), &r,
                       "stage 1 action 0: micro-batch -3", "negative micro-batch");
    expect_input_error(simulate_two(plain0, -1, wait1, 4, &r), &r, "stage 0: -1 actions",
                       "negative count");
    expect_input_error(simulate_two(NULL, 2, wait1, 4, &r), &r, "stage 0: 2 actions", "NULL list");
}

static void test_bad_arguments(void) {
    pipeline pl;
    if (!build(&pl, LOOM_SCHEDULE_1F1B, 2, 2)) return;
    double forward[] = {1, 1}, backward[] = {2, 2}, link[] = {0.5};
    loom_pipe_sim_times good = times_of(2, forward, backward, link, link), t;
    loom_pipe_sim_result r = {0};

    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, &good, NULL), NULL, "no output",
                       "NULL output");
    expect_input_error(loom_pipe_simulate(&pl.shape, NULL, &good, &r), &r, "schedules is NULL",
                       "NULL schedules");
    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, NULL, &r), &r, "times is NULL",
                       "NULL times");
    loom_pipe_shape none = {LOOM_SCHEDULE_1F1B, 0, 1, 2};
    expect_input_error(loom_pipe_simulate(&none, pl.stage, &good, &r), &r,
                       "stages must be at least 1, got 0", "stages 0");
    expect_input_error(loom_pipe_simulate(NULL, pl.stage, &good, &r), &r, "no shape", "NULL shape");
    t = good, t.stages = 3;
    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, &t, &r), &r,
                       "times.stages = 3, expected 2", "3 stage times for 2 stages");
    t = good, t.links = 2;
    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, &t, &r), &r,
                       "times.links = 2, expected 1 for 2 stages", "2 links for 2 stages");
    double negative[] = {1, -0.5}, not_a_number[] = {NAN, 1}, infinite[] = {INFINITY};
    t = good, t.forward_s = negative;
    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, &t, &r), &r,
                       "forward_s[1] = -0.5, expected a finite time >= 0", "negative forward");
    t = good, t.backward_s = not_a_number;
    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, &t, &r), &r, "backward_s[0] = nan",
                       "NaN backward");
    t = good, t.grad_link_s = infinite;
    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, &t, &r), &r, "grad_link_s[0] = inf",
                       "infinite link");
    double negative_link[] = {-0.5};
    t = good, t.grad_recv_s = negative_link;
    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, &t, &r), &r,
                       "grad_recv_s[0] = -0.5, expected a finite time >= 0",
                       "negative receive time");
    t = good, t.act_link_s = NULL;
    expect_input_error(loom_pipe_simulate(&pl.shape, pl.stage, &t, &r), &r,
                       "act_link_s is NULL, expected 1 times", "NULL links");

    double weights[] = {1, 1};
    pipeline zb;
    if (build(&zb, LOOM_SCHEDULE_ZB_H1, 2, 2)) {
        expect_input_error(loom_pipe_simulate(&zb.shape, zb.stage, &good, &r), &r,
                           "backward_input_s is NULL, expected 2 times", "split without B times");
        t = good, t.backward_input_s = weights, t.backward_weight_s = negative;
        expect_input_error(loom_pipe_simulate(&zb.shape, zb.stage, &t, &r), &r,
                           "backward_weight_s[1] = -0.5", "negative W time");
        free_pipeline(&zb);
    }
    CHECK(loom_pipe_simulate(&pl.shape, pl.stage, &good, &r) == LOOM_OK, "good input: %s",
          loom_last_error());
    loom_pipe_sim_result_free(&r);
    loom_pipe_sim_result_free(&r); /* a second free is harmless */
    loom_pipe_sim_result_free(NULL);
    free_pipeline(&pl);
}

/* ---- against an independent longest-path computation -------------------------------------- */

typedef struct {
    const pipeline *pl;
    /* per virtual stage (V,), links per boundary (V - 1,) */
    const double *forward, *backward, *input, *weight, *act_link, *grad_link;
    const double *act_recv, *grad_recv; /* per boundary, NULL: none */
    int delayed_stage, delayed_index;   /* this action's duration (or message) gets `delay` more */
    double delay;
} graph;

/* The index, on the other rank, of the message action i of rank s pairs with: the k-th action
 * of its op to that rank pairs with the k-th of the opposite op there from this one. */
static int partner_of(const pipeline *pl, int s, int i, int *peer) {
    static const loom_pipe_op opposite[] = {[LOOM_PIPE_RECV_ACT] = LOOM_PIPE_SEND_ACT,
                                            [LOOM_PIPE_SEND_ACT] = LOOM_PIPE_RECV_ACT,
                                            [LOOM_PIPE_RECV_GRAD] = LOOM_PIPE_SEND_GRAD,
                                            [LOOM_PIPE_SEND_GRAD] = LOOM_PIPE_RECV_GRAD};
    loom_pipe_action a = pl->stage[s].actions[i];
    *peer = loom_pipe_peer(&pl->shape, s, a);
    int k = 0;
    for (int j = 0; j < i; j++) {
        loom_pipe_action b = pl->stage[s].actions[j];
        k += b.op == a.op && loom_pipe_peer(&pl->shape, s, b) == *peer;
    }
    for (int j = 0; j < pl->stage[*peer].count; j++) {
        loom_pipe_action b = pl->stage[*peer].actions[j];
        if (b.op == opposite[a.op] && loom_pipe_peer(&pl->shape, *peer, b) == s && k-- == 0)
            return j;
    }
    return -1;
}

/* Longest path to every action's end, by relaxing every edge until nothing changes (at most
 * one round per action in a graph without cycles). end: (p, MAX_ACTIONS). */
static double longest_paths(const graph *g, double end[][MAX_ACTIONS]) {
    const pipeline *pl = g->pl;
    for (int s = 0; s < pl->stages; s++)
        for (int i = 0; i < pl->stage[s].count; i++) end[s][i] = 0;
    for (int changed = 1, rounds = 0; changed; rounds++) {
        if (rounds > pl->stages * MAX_ACTIONS) {
            CHECK(0, "relaxation does not settle: the graph has a cycle");
            break;
        }
        changed = 0;
        for (int s = 0; s < pl->stages; s++) {
            for (int i = 0; i < pl->stage[s].count; i++) {
                loom_pipe_action a = pl->stage[s].actions[i];
                loom_pipe_op op = a.op;
                int v = loom_pipe_stage(&pl->shape, s, a.chunk);
                double extra = s == g->delayed_stage && i == g->delayed_index ? g->delay : 0;
                double duration = op == LOOM_PIPE_FORWARD           ? g->forward[v] + extra
                                  : op == LOOM_PIPE_BACKWARD        ? g->backward[v] + extra
                                  : op == LOOM_PIPE_BACKWARD_INPUT  ? g->input[v] + extra
                                  : op == LOOM_PIPE_BACKWARD_WEIGHT ? g->weight[v] + extra
                                                                    : 0;
                double t = (i > 0 ? end[s][i - 1] : 0) + duration;
                if (op == LOOM_PIPE_RECV_ACT || op == LOOM_PIPE_RECV_GRAD) {
                    int peer, j = partner_of(pl, s, i, &peer);
                    int link = op == LOOM_PIPE_RECV_ACT ? v - 1 : v;
                    double link_s =
                        op == LOOM_PIPE_RECV_ACT ? g->act_link[link] : g->grad_link[link];
                    const double *recv = op == LOOM_PIPE_RECV_ACT ? g->act_recv : g->grad_recv;
                    if (peer == g->delayed_stage && j == g->delayed_index) link_s += g->delay;
                    if (end[peer][j] + link_s > t) t = end[peer][j] + link_s;
                    /* the receiver's own work once the message is in hand */
                    t += recv ? recv[link] : 0;
                }
                if (t > end[s][i]) end[s][i] = t, changed = 1;
            }
        }
    }
    double makespan = 0;
    for (int s = 0; s < pl->stages; s++)
        for (int i = 0; i < pl->stage[s].count; i++)
            if (end[s][i] > makespan) makespan = end[s][i];
    return makespan;
}

/* A time in quarters from 0 to 3 (exact in binary: sums and differences are exact). */
static double random_time(loom_rng *rng, int allow_zero) {
    int quarters = (int)(loom_rng_next_uniform(rng) * 12) + !allow_zero;
    return quarters * 0.25;
}

static void test_against_longest_paths(void) {
    loom_rng rng;
    loom_rng_seed(&rng, 20240611);
    double end[MAX_STAGES][MAX_ACTIONS];
    int cases = 0, messages = 0, computes = 0, with_receives = 0;
    /* the reference is slow (every action's predecessors searched anew): under the sanitizers,
     * a fifth of the cases, every kind still among them */
    int trials = getenv("LOOM_SANITIZED") ? 60 : 300;
    for (int trial = 0; trial < trials; trial++) {
        int p = 1 + (int)(loom_rng_next_uniform(&rng) * 4);
        int m = 1 + (int)(loom_rng_next_uniform(&rng) * 5);
        loom_schedule_kind kind = (loom_schedule_kind)(trial % LOOM_SCHEDULE_NUM_KINDS);
        int v = loom_plan_schedule_chunks(kind);
        if (kind == LOOM_SCHEDULE_INTERLEAVED) v = 2 + trial % 2, m = p * (1 + m % 2);
        int V = p * v;
        double forward[MAX_V], backward[MAX_V], input[MAX_V], weight[MAX_V], act[MAX_V],
            grad[MAX_V], act_recv[MAX_V], grad_recv[MAX_V];
        for (int s = 0; s < V; s++) {
            forward[s] = random_time(&rng, 0), backward[s] = random_time(&rng, 0);
            input[s] = random_time(&rng, 0), weight[s] = random_time(&rng, 0);
            act[s] = random_time(&rng, 1), grad[s] = random_time(&rng, 1);
            act_recv[s] = random_time(&rng, 1), grad_recv[s] = random_time(&rng, 1);
        }
        /* every other trial with receive times (a scattered message's gather) */
        int receives = (trial / LOOM_SCHEDULE_NUM_KINDS) % 2;
        pipeline pl;
        if (!build_shape(&pl, kind, p, v, m)) return;
        loom_pipe_sim_times times = {V,
                                     V - 1,
                                     forward,
                                     backward,
                                     act,
                                     grad,
                                     input,
                                     weight,
                                     NULL,
                                     receives ? act_recv : NULL,
                                     receives ? grad_recv : NULL};
        loom_pipe_sim_result r;
        loom_status st = loom_pipe_simulate(&pl.shape, pl.stage, &times, &r);
        CHECK(st == LOOM_OK, "trial %d: %s", trial, loom_last_error());
        if (st != LOOM_OK) {
            free_pipeline(&pl);
            continue;
        }
        char what[128];
        snprintf(what, sizeof what, "trial %d (%s p=%d v=%d m=%d%s)", trial,
                 loom_schedule_kind_name(kind), p, v, m, receives ? ", receive times" : "");
        graph g = {&pl,  forward,          backward,          input, weight, act,
                   grad, times.act_recv_s, times.grad_recv_s, -1,    -1,     0};
        double makespan = longest_paths(&g, end);
        CHECK(r.makespan_s == makespan, "%s: makespan %g, longest path %g", what, r.makespan_s,
              makespan);
        for (int s = 0; s < p; s++) {
            for (int i = 0; i < pl.stage[s].count; i++) {
                const loom_pipe_sim_action *a = &r.stage[s][i];
                loom_pipe_op op = pl.stage[s].actions[i].op;
                CHECK(a->end_s == end[s][i], "%s: stage %d action %d ends at %g, longest path %g",
                      what, s, i, a->end_s, end[s][i]);
                CHECK(a->start_s == (i > 0 ? end[s][i - 1] : 0), "%s: stage %d action %d start",
                      what, s, i);
                int send = op == LOOM_PIPE_SEND_ACT || op == LOOM_PIPE_SEND_GRAD;
                int compute = op == LOOM_PIPE_FORWARD || op == LOOM_PIPE_BACKWARD ||
                              op == LOOM_PIPE_BACKWARD_INPUT || op == LOOM_PIPE_BACKWARD_WEIGHT;
                if (!send && !compute) continue;
                /* delaying it by its slack costs nothing; by slack + 0.5 costs 0.5 */
                double slack = send ? a->message_slack_s : a->slack_s;
                g.delayed_stage = s, g.delayed_index = i;
                g.delay = slack;
                double same = longest_paths(&g, end);
                g.delay = slack + 0.5;
                double later = longest_paths(&g, end);
                g.delayed_stage = g.delayed_index = -1;
                longest_paths(&g, end); /* restore the undelayed ends */
                CHECK_CLOSE(same, makespan, 0, 1e-9, what);
                CHECK_CLOSE(later, makespan + 0.5, 0, 1e-9, what);
                messages += send, computes += compute;
            }
        }
        cases++, with_receives += receives;
        loom_pipe_sim_result_free(&r);
        free_pipeline(&pl);
    }
    printf("longest paths: %d random cases (%d with receive times), %d message slacks and %d "
           "compute slacks confirmed\n",
           cases, with_receives, messages, computes);
}

/* The slack policy on the hand-computed case above (1F1B, p=2, m=3, gradient link 0.25): the
 * gradient sends' message slacks are SG0 0.5, SG1 2, SG2 0, so a link saving of 1 compresses
 * SG0 and SG2, 0.3 only SG2, 3 all three, and no saving (0 or less) none. */
static void test_slack_policy(void) {
    pipeline pl;
    if (!build(&pl, LOOM_SCHEDULE_1F1B, 2, 3)) return;
    double forward[] = {1, 1}, backward[] = {2, 3}, act_link[] = {0.25}, grad_link[] = {0.25};
    loom_pipe_sim_times times = times_of(2, forward, backward, act_link, grad_link);
    static const struct {
        double saving;
        unsigned char sg[3]; /* stage 1's sends of micro-batches 0, 1, 2 */
    } cases[] = {
        {1.0, {1, 0, 1}}, {0.3, {0, 0, 1}}, {3.0, {1, 1, 1}}, {0.0, {0, 0, 0}}, {-1.0, {0, 0, 0}}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned char choice[2 * 3];
        memset(choice, 7, sizeof choice);
        loom_status st =
            loom_pipe_slack_choose(&pl.shape, pl.stage, &times, &cases[c].saving, choice);
        CHECK(st == LOOM_OK, "slack choose: %s", loom_last_error());
        CHECK(choice[0] == 0 && choice[1] == 0 && choice[2] == 0,
              "saving %g: stage 0 sends no gradient, got %d %d %d", cases[c].saving, choice[0],
              choice[1], choice[2]);
        CHECK(memcmp(choice + 3, cases[c].sg, 3) == 0,
              "saving %g: compressed SG0..2 = %d %d %d, expected %d %d %d", cases[c].saving,
              choice[3], choice[4], choice[5], cases[c].sg[0], cases[c].sg[1], cases[c].sg[2]);
    }
    free_pipeline(&pl);
}

/* Per-message gradient times (grad_link_mb_s), on the fast case of
 * test_slow_link_makes_send_critical (makespan 15.5; message slacks SG0 0.5, SG1 2, SG2 0): the
 * same times as grad_link_s give the same step; SG1 later by 1.5 (within its slack) changes
 * nothing, later by 3 (1 past it) ends the step 1 later; SG2 later by 0.5 ends it 0.5 later; a
 * negative time is refused by name. */
static void test_per_message_gradients(void) {
    pipeline pl;
    if (!build(&pl, LOOM_SCHEDULE_1F1B, 2, 3)) return;
    double forward[] = {1, 1}, backward[] = {2, 3}, link[] = {0.25};
    static const struct {
        int mb;
        double extra, makespan;
    } cases[] = {{0, 0, 15.5}, {1, 1.5, 15.5}, {1, 3, 16.5}, {2, 0.5, 16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double per[6] = {0, 0, 0, 0.25, 0.25, 0.25};
        per[3 + cases[i].mb] += cases[i].extra;
        loom_pipe_sim_times times = times_of(2, forward, backward, link, link);
        times.grad_link_mb_s = per;
        loom_pipe_sim_result r;
        loom_status st = loom_pipe_simulate(&pl.shape, pl.stage, &times, &r);
        CHECK(st == LOOM_OK && r.makespan_s == cases[i].makespan,
              "SG%d later by %g: makespan %g, expected %g (%s)", cases[i].mb, cases[i].extra,
              st == LOOM_OK ? r.makespan_s : -1.0, cases[i].makespan,
              st == LOOM_OK ? "ok" : loom_last_error());
        if (st == LOOM_OK) loom_pipe_sim_result_free(&r);
    }
    double bad[6] = {0, 0, 0, 0.25, -1, 0.25};
    loom_pipe_sim_times times = times_of(2, forward, backward, link, link);
    times.grad_link_mb_s = bad;
    loom_pipe_sim_result r;
    CHECK(loom_pipe_simulate(&pl.shape, pl.stage, &times, &r) == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "grad_link_mb_s[4]"),
          "a negative per-message time: %s", loom_last_error());
    free_pipeline(&pl);
}

int main(void) {
    test_1f1b_two_stages();
    test_slow_link_makes_send_critical();
    test_per_message_gradients();
    test_uneven_stages();
    test_gpipe_equals_1f1b();
    test_slack_policy();
    test_bad_schedules();
    test_bad_arguments();
    test_against_longest_paths();
    return check_finish();
}
