/*
 * stop.c — ending a run early and cleanly. SIGTERM or SIGINT (a preempted job, Ctrl-C) and a
 * wall-clock budget (--exit-after-minutes) make the run finish the step it is in, save a
 * checkpoint and exit 0, as Megatron-LM's exit-signal handler does; --resume then continues
 * exactly. Every rank must stop after the same step (a checkpoint is collective), so the ranks
 * agree once per step: one allreduce of a flag, whichever rank the signal reached.
 *
 * A second SIGINT or SIGTERM is not caught (the handler is installed with SA_RESETHAND): it ends
 * the process at once, as users expect of a second Ctrl-C.
 *
 * Under a launcher. A signal to one rank (a scheduler's preemption) takes the path above. A
 * signal to Open MPI's mpirun (4.1: SIGTERM and SIGINT cannot be forwarded, see
 * ess_base_forward_signals) ends the job its own way: SIGCONT to every rank, a wait of
 * odls_base_sigkill_timeout seconds (default 1), SIGTERM, the same wait, then SIGKILL. So the
 * ranks get SIGTERM, and the stop (finish the step, agree, save) must end within that delay:
 * launch long steps with a longer one, e.g. `mpirun --mca odls_base_sigkill_timeout 60 ...`
 * (or OMPI_MCA_odls_base_sigkill_timeout=60 in the environment). mpirun itself exits 1 after
 * such a stop, whatever the ranks return; the ranks exit 0 and OUT/checkpoints/latest names
 * the stop checkpoint. While it waits, mpirun does not drain the ranks' output pipes: a rank
 * that logs every step fills its stdout pipe and would block in a write until the SIGKILL. So
 * the handler makes stdout and stderr non-blocking when they are pipes or sockets (a line that
 * does not fit is dropped, never waited for) until loom_stop_remove; the trainer says why it
 * stops on stderr, a pipe of its own that the progress lines do not fill.
 */
#define _POSIX_C_SOURCE 200809L
#include "train/train_internal.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>

/* The one flag a signal handler may set: process-wide by nature (a signal reaches the process,
 * not an object), so it is the exception to "no global mutable state". */
static volatile sig_atomic_t stop_signal;
static struct sigaction old_term, old_int; /* put back when the run ends */
/* stdout's and stderr's file status flags before the handler made them non-blocking (-1: left
 * as they were); written by the handler only, read by loom_stop_remove after it */
static volatile sig_atomic_t output_flags[2] = {-1, -1};

/* Async-signal-safe: fstat and fcntl only. */
static void output_nonblocking(void) {
    for (int fd = 1; fd <= 2; fd++) {
        struct stat info;
        if (output_flags[fd - 1] >= 0 || fstat(fd, &info) != 0 ||
            !(S_ISFIFO(info.st_mode) || S_ISSOCK(info.st_mode)))
            continue;
        int flags = fcntl(fd, F_GETFL);
        if (flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0) output_flags[fd - 1] = flags;
    }
}

static void on_signal(int sig) {
    stop_signal = sig;
    output_nonblocking();
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
    for (int fd = 1; fd <= 2; fd++) {
        if (output_flags[fd - 1] < 0) continue;
        fflush(fd == 1 ? stdout : stderr);
        fcntl(fd, F_SETFL, (int)output_flags[fd - 1]);
        output_flags[fd - 1] = -1;
    }
}

loom_status loom_stop_agree(loom_stop *s, const loom_mesh *mesh, int *stop) {
    /* why: 0 nothing, 1 the time budget, 2 a signal (the larger wins the agreement) */
    double why = stop_signal ? 2.0 : s->deadline > 0 && loom_now() >= s->deadline ? 1.0 : 0.0;
    loom_status st = LOOM_OK;
    if (mesh->job) st = loom_comm_allreduce_f64(mesh->job, &why, 1, LOOM_REDUCE_MAX);
    *stop = st == LOOM_OK && why > 0;
    s->signalled = why >= 2;
    s->reason =
        why >= 2 ? "a stop signal (SIGTERM or SIGINT)" : "the time budget (--exit-after-minutes)";
    return st;
}
