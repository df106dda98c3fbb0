/*
 * pipe_sim.c — a test tool: the pipeline simulator's prediction of one step, for scripts that
 * compare it with a measured trace (sim_vs_trace.sh).
 * usage: pipe_sim KIND MICRO_BATCHES FORWARD_S BACKWARD_S [ACT_LINK_S GRAD_LINK_S]
 *   KIND          gpipe, 1f1b or zb-h1 (one chunk per rank; zb-h1's B and W each take half
 *                 of BACKWARD_S)
 *   FORWARD_S     comma-separated forward time of one micro-batch per stage, seconds; the
 *                 number of entries is the number of stages p
 *   BACKWARD_S    the same for backward (p entries)
 *   ACT_LINK_S    activation transfer time per link (p - 1 entries; all 0 when left out)
 *   GRAD_LINK_S   gradient transfer time per link (p - 1 entries)
 * Prints the makespan in seconds; then, one line per send, its stage, action, micro-batch and
 * message slack. Exits 2 on bad arguments, with the simulator's message.
 */
#include "loom/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STAGES 64

/* Reads "a,b,c" into values; returns the count, or -1 for a malformed list. */
static int parse_list(const char *text, double *values, int capacity) {
    int count = 0;
    const char *p = text;
    while (*p) {
        char *end;
        if (count == capacity) return -1;
        values[count++] = strtod(p, &end);
        if (end == p || (*end != ',' && *end != '\0')) return -1;
        p = *end == ',' ? end + 1 : end;
    }
    return count;
}

static int usage(const char *why) {
    fprintf(stderr,
            "pipe_sim: %s\nusage: pipe_sim KIND MICRO_BATCHES FORWARD_S BACKWARD_S "
            "[ACT_LINK_S GRAD_LINK_S]\n",
            why);
    return 2;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 7) return usage("expected 4 or 6 arguments");
    loom_schedule_kind kind;
    if (loom_schedule_kind_parse(argv[1], &kind) != LOOM_OK) return usage(loom_last_error());
    int micro_batches = atoi(argv[2]);
    double forward[MAX_STAGES], backward[MAX_STAGES];
    double act_link[MAX_STAGES] = {0}, grad_link[MAX_STAGES] = {0};
    int stages = parse_list(argv[3], forward, MAX_STAGES);
    if (stages < 1) return usage("FORWARD_S: expected a comma-separated list of seconds");
    int links = stages - 1;
    if (parse_list(argv[4], backward, MAX_STAGES) != stages) {
        return usage("BACKWARD_S: expected as many entries as FORWARD_S");
    }
    if (argc == 7 && (parse_list(argv[5], act_link, MAX_STAGES) != links ||
                      parse_list(argv[6], grad_link, MAX_STAGES) != links)) {
        return usage("ACT_LINK_S, GRAD_LINK_S: expected one entry per link (stages - 1)");
    }

    if (loom_schedule_kind_chunks(kind) != 1) return usage("KIND: expected gpipe, 1f1b or zb-h1");
    double half[MAX_STAGES];
    for (int s = 0; s < stages; s++) half[s] = backward[s] / 2;
    loom_pipe_shape shape = {kind, stages, 1, micro_batches};
    loom_pipe_stage_schedule schedules[MAX_STAGES] = {{0}};
    loom_status st = LOOM_OK;
    for (int s = 0; s < stages && st == LOOM_OK; s++) {
        st = loom_pipe_schedule_build(&shape, s, &schedules[s]);
    }
    loom_pipe_sim_times times = {stages, links, forward, backward, act_link, grad_link, half, half};
    loom_pipe_sim_result result;
    if (st == LOOM_OK) st = loom_pipe_simulate(&shape, schedules, &times, &result);
    if (st == LOOM_OK) {
        printf("%.9f\n", result.makespan_s);
        for (int s = 0; s < stages; s++) {
            for (int i = 0; i < schedules[s].count; i++) {
                loom_pipe_action a = schedules[s].actions[i];
                if (a.op != LOOM_PIPE_SEND_ACT && a.op != LOOM_PIPE_SEND_GRAD) continue;
                printf("stage %d action %d %s %d message_slack_s %.9f\n", s, i,
                       loom_pipe_op_name(a.op), a.micro_batch, result.stage[s][i].message_slack_s);
            }
        }
        loom_pipe_sim_result_free(&result);
    }
    for (int s = 0; s < stages; s++) loom_pipe_schedule_free(&schedules[s]);
    if (st != LOOM_OK) return usage(loom_last_error());
    return 0;
}
