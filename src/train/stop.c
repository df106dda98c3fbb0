/*
 * stop.c — ending a run early and cleanly. SIGTERM or SIGINT (a preempted job, Ctrl-C) and a
 * wall-clock budget (--exit-after-minutes) make the run finish the step it is in, save a
 * checkpoint and exit 0, as Megatron-LM's exit-signal handler does; --resume then continues
 * exactly. Every rank must stop after the same step (a checkpoint is collective), so the ranks
 * agree once per step: one allreduce of a flag, whichever rank the signal reached.
 *
 * A second SIGINT or SIGTERM is not caught (the handler is installed with SA_RESETHAND): it ends
 * the process at once, as users expect of a second Ctrl-C.
 */
#define _POSIX_C_SOURCE 200809L
#include "train/train_internal.h"

#include <signal.h>
#include <string.h>

/* The one flag a signal handler may set: process-wide by nature (a signal reaches the process,
 * not an object), so it is the exception to "no global mutable state". */
static volatile sig_atomic_t stop_signal;
static struct sigaction old_term, old_int; /* put back when the run ends */

static void on_signal(int sig) {
    stop_signal = sig;
}

void loom_stop_install(loom_stop *s, double minutes) {
    memset(s, 0, sizeof *s);
    stop_signal = 0;
    s->deadline = minutes > 0 ? loom_now() + minutes * 60.0 : 0.0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESETHAND; /* a second signal ends the process */
    sigemptyset(&action.sa_mask);
    s->installed =
        sigaction(SIGTERM, &action, &old_term) == 0 && sigaction(SIGINT, &action, &old_int) == 0;
}

void loom_stop_remove(loom_stop *s) {
    if (!s->installed) return;
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    s->installed = 0;
}

loom_status loom_stop_agree(loom_stop *s, const loom_mesh *mesh, int *stop) {
    /* why: 0 nothing, 1 the time budget, 2 a signal (the larger wins the agreement) */
    double why = stop_signal ? 2.0 : s->deadline > 0 && loom_now() >= s->deadline ? 1.0 : 0.0;
    loom_status st = LOOM_OK;
    if (mesh->world) st = loom_comm_allreduce_f64(mesh->world, &why, 1, LOOM_REDUCE_MAX);
    *stop = st == LOOM_OK && why > 0;
    s->reason =
        why >= 2 ? "a stop signal (SIGTERM or SIGINT)" : "the time budget (--exit-after-minutes)";
    return st;
}
