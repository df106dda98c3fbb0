/*
 * pipe_sim.c — a test tool: the pipeline simulator's prediction of one step, for scripts that
 * compare it with a measured trace (bench/sim_vs_trace.sh, bench/schedules.sh).
 * usage: pipe_sim KIND MICRO_BATCHES FORWARD_S BACKWARD_S [ACT_LINK_S GRAD_LINK_S
 *                 [INPUT_S WEIGHT_S]]
 *   KIND          gpipe, 1f1b, zb-h1, zb-v, or interleaved:V (V virtual stages per rank)
 *   FORWARD_S     comma-separated forward time of one micro-batch per virtual stage, seconds;
 *                 the number of entries is p v (p pipeline ranks, v chunks each)
 *   BACKWARD_S    the same for a whole backward (p v entries)
 *   ACT_LINK_S    activation transfer time per virtual-stage boundary (p v - 1 entries; all 0
 *                 when left out)
 *   GRAD_LINK_S   gradient transfer time per boundary (p v - 1 entries)
 *   INPUT_S       zb-h1, zb-v: B per virtual stage (default: half of BACKWARD_S)
 *   WEIGHT_S      zb-h1, zb-v: W per virtual stage (default: half of BACKWARD_S)
 * Prints the makespan in seconds; then, one line per rank, the seconds it computes ("rank R
 * busy_s X"); then, one line per send, its rank, action, micro-batch and message slack. Exits 2
 * on bad arguments, with the simulator's message.
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
            "pipe_sim: %s\nusage: pipe_sim KIND[:V] MICRO_BATCHES FORWARD_S BACKWARD_S "
            "[ACT_LINK_S GRAD_LINK_S [INPUT_S WEIGHT_S]]\n",
            why);
    return 2;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 7 && argc != 9) return usage("expected 4, 6 or 8 arguments");
    char kind_name[32];
    snprintf(kind_name, sizeof kind_name, "%s", argv[1]);
    char *colon = strchr(kind_name, ':');
    int chunks = 0;
    if (colon) *colon = '\0', chunks = atoi(colon + 1);
    loom_schedule_kind kind;
    if (loom_schedule_kind_parse(kind_name, "KIND", "schedule", &kind) != LOOM_OK)
        return usage(loom_last_error());
    if (!colon) chunks = loom_plan_schedule_chunks(kind);
    if (chunks < 1) return usage("KIND: interleaved needs :V, the virtual stages per rank");
    int micro_batches = atoi(argv[2]);
    double forward[MAX_STAGES], backward[MAX_STAGES], input[MAX_STAGES], weight[MAX_STAGES];
    double act_link[MAX_STAGES] = {0}, grad_link[MAX_STAGES] = {0};
    int stages = parse_list(argv[3], forward, MAX_STAGES);
    if (stages < 1 || stages % chunks != 0) {
        return usage(
            "FORWARD_S: expected a comma-separated list of seconds, one per virtual stage");
    }
    int links = stages - 1;
    if (parse_list(argv[4], backward, MAX_STAGES) != stages) {
        return usage("BACKWARD_S: expected as many entries as FORWARD_S");
    }
    if (argc >= 7 && (parse_list(argv[5], act_link, MAX_STAGES) != links ||
                      parse_list(argv[6], grad_link, MAX_STAGES) != links)) {
        return usage("ACT_LINK_S, GRAD_LINK_S: expected one entry per boundary (stages - 1)");
    }
    for (int s = 0; s < stages; s++) input[s] = weight[s] = backward[s] / 2;
    if (argc == 9 && (parse_list(argv[7], input, MAX_STAGES) != stages ||
                      parse_list(argv[8], weight, MAX_STAGES) != stages)) {
        return usage("INPUT_S, WEIGHT_S: expected as many entries as FORWARD_S");
    }
    loom_pipe_shape shape = {kind, stages / chunks, chunks, micro_batches};
    loom_pipe_stage_schedule schedules[MAX_STAGES] = {{0}};
    loom_status st = loom_pipe_shape_check(&shape);
    for (int r = 0; r < shape.ranks && st == LOOM_OK; r++) {
        st = loom_pipe_schedule_build(&shape, r, &schedules[r]);
    }
    loom_pipe_sim_times times = {stages, links,  forward, backward, act_link, grad_link,
                                 input,  weight, NULL,    NULL,     NULL};
    loom_pipe_sim_result result;
    if (st == LOOM_OK) st = loom_pipe_simulate(&shape, schedules, &times, &result);
    if (st == LOOM_OK) {
        printf("%.9f\n", result.makespan_s);
        for (int r = 0; r < shape.ranks; r++) {
            double busy = 0;
            for (int i = 0; i < schedules[r].count; i++) {
                loom_pipe_op op = schedules[r].actions[i].op;
                int compute = op == LOOM_PIPE_FORWARD || op == LOOM_PIPE_BACKWARD ||
                              op == LOOM_PIPE_BACKWARD_INPUT || op == LOOM_PIPE_BACKWARD_WEIGHT;
                if (compute) busy += result.stage[r][i].end_s - result.stage[r][i].start_s;
            }
            printf("rank %d busy_s %.9f\n", r, busy);
        }
        for (int r = 0; r < shape.ranks; r++) {
            for (int i = 0; i < schedules[r].count; i++) {
                loom_pipe_action a = schedules[r].actions[i];
                if (a.op != LOOM_PIPE_SEND_ACT && a.op != LOOM_PIPE_SEND_GRAD) continue;
                printf("stage %d action %d %s %d message_slack_s %.9f\n", r, i,
                       loom_pipe_op_name(a.op), a.micro_batch, result.stage[r][i].message_slack_s);
            }
        }
        loom_pipe_sim_result_free(&result);
    }
    for (int r = 0; r < shape.ranks; r++) loom_pipe_schedule_free(&schedules[r]);
    if (st != LOOM_OK) return usage(loom_last_error());
    return 0;
}
