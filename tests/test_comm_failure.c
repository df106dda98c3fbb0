/*
 * test_comm_failure.c — a job of 2 ranks (4 for stopped) with a 2 s timeout in which something goes
 * wrong on purpose; tests/mpi_failure.sh runs it under mpirun and checks that the job ends
 * (non-zero, quickly, naming the rank) — or, for slow_peer, that it does not. MODE is one of:
 *
 *   exit           rank 1 exits (status 3) while rank 0 enters an allreduce
 *   killed         rank 1 dies of SIGKILL while rank 0 enters an allreduce
 *   hang           rank 1 hangs (no progress) while rank 0 waits in an allreduce
 *   watchdog       rank 1 hangs while rank 0 stays busy outside comm: rank 1's watchdog fires
 *   busy_peer      rank 1 is alive but never joins; rank 0 waits in an allreduce on group 'dp'
 *   test_deadline  rank 0 polls loom_comm_test on a receive that never comes
 *   slow_peer      each rank waits for a slow (but live) peer for less than the timeout, after
 *                  working without progress notes for most of it; then rank 0 polls a receive
 *                  from rank 1 once, leaves it for a while, and waits: must succeed
 *   stopped        rank 1 stops itself (SIGSTOP) in the middle of allreduces on the world: it
 *                  neither dies nor answers, and a waiting rank must name it (2 or 4 ranks)
 *
 * Not run by CTest directly (it is meant to fail); see mpi_failure.sh.
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/comm.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_seconds(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Alive but not communicating: progress notes every 0.1 s for `seconds`. */
static void stay_busy(double seconds, const char *note) {
    double end = loom_now() + seconds;
    while (loom_now() < end) {
        loom_comm_progress(note);
        sleep_seconds(0.1);
    }
}

static void hang_forever(void) {
    loom_comm_progress("test: about to hang");
    for (;;) sleep_seconds(1.0);
}

static int run_slow_peer(loom_comm *world, int rank) {
    /* Each round, one rank works 1.5 s without a progress note, then waits ~1.5 s in the
     * allreduce for the other, which works 3 s (with notes). The watchdog must stay quiet
     * through both, and the wait must not hit its 2 s deadline. */
    for (int round = 0; round < 2; round++) {
        int waiter = round % 2;
        if (rank == waiter) {
            sleep_seconds(1.5);
        } else {
            stay_busy(3.0, "test: slow peer working");
        }
        float x = (float)(rank + 1);
        if (loom_comm_allreduce_f32(world, &x, 1, LOOM_REDUCE_SUM) != LOOM_OK || x != 3.0f) {
            fprintf(stderr, "[rank %d] slow peer: allreduce gave %g (%s)\n", rank, x,
                    loom_last_error());
            return 1;
        }
    }
    /* A receive polled once (late enough to ping the sender), then left alone for longer than
     * the half timeout that names a silent rank, then waited for: the sender, alive and busy
     * all along, must not be blamed for the time nobody asked it anything. */
    float y = 0;
    if (rank == 1) {
        stay_busy(3.0, "test: slow sender working");
        if (loom_comm_send(world, &y, sizeof y, 0, 0) != LOOM_OK) return 1;
    } else {
        loom_comm_request *request = NULL;
        int done = 0;
        if (loom_comm_irecv(world, &y, sizeof y, 1, 0, &request) != LOOM_OK) return 1;
        stay_busy(0.6, "test: before polling");
        if (loom_comm_test(request, &done) != LOOM_OK || done) return 1;
        stay_busy(1.5, "test: not polling");
        if (loom_comm_wait(request) != LOOM_OK) return 1;
    }
    if (rank == 0) printf("slow peer ok\n");
    return 0;
}

/* Allreduces on the world until rank 1, on its 20th, stops itself between starting one and
 * waiting for it: its peers are then inside that allreduce, waiting for a rank that is alive
 * to the OS but runs nothing. */
static int run_stopped(loom_comm *world, int rank) {
    for (int i = 0; i < 1000; i++) {
        loom_comm_progress("test: allreduce with a peer that stops");
        float x[16] = {0};
        loom_comm_request *request = NULL;
        if (loom_comm_iallreduce_f32(world, x, 16, &request) != LOOM_OK) return 1;
        if (rank == 1 && i == 20) {
            /* mpi_failure.sh kills this pid afterwards, should the job leave it behind. */
            fprintf(stderr, "[rank 1] test: stopping pid %ld\n", (long)getpid());
            raise(SIGSTOP);
        }
        if (loom_comm_wait(request) != LOOM_OK) return 1;
    }
    return 1; /* not reached: the job is ended */
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    loom_comm_set_timeout(2.0);
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_last_error());
        return 1;
    }
    int rank = loom_comm_rank(world);
    int size = loom_comm_size(world);
    if (size != 2 && !(size == 4 && strcmp(mode, "stopped") == 0)) {
        loom_comm_abort(2, "test_comm_failure needs 2 ranks (2 or 4 for stopped)");
    }
    float x[16] = {0};
    int status = 0;

    if (strcmp(mode, "exit") == 0 || strcmp(mode, "killed") == 0) {
        if (rank == 1) {
            if (mode[0] == 'e') _exit(3);
            raise(SIGKILL);
        }
        loom_comm_progress("test: allreduce with a dead peer");
        loom_comm_allreduce_f32(world, x, 16, LOOM_REDUCE_SUM);
        status = 1; /* not reached: the job is torn down */
    } else if (strcmp(mode, "hang") == 0) {
        if (rank == 1) hang_forever();
        loom_comm_progress("test: allreduce with a hung peer");
        loom_comm_allreduce_f32(world, x, 16, LOOM_REDUCE_SUM);
        status = 1;
    } else if (strcmp(mode, "watchdog") == 0) {
        if (rank == 1) hang_forever();
        stay_busy(30.0, "test: busy while the peer hangs");
        status = 1;
    } else if (strcmp(mode, "busy_peer") == 0) {
        loom_comm *dp = NULL;
        if (loom_comm_split(world, 0, rank, "dp", &dp) != LOOM_OK) {
            loom_comm_abort(1, loom_last_error());
        }
        if (rank == 1) stay_busy(30.0, "test: busy elsewhere");
        loom_comm_progress("step 3: backward");
        loom_comm_allreduce_f32(dp, x, 16, LOOM_REDUCE_SUM);
        status = 1;
    } else if (strcmp(mode, "test_deadline") == 0) {
        if (rank == 1) stay_busy(30.0, "test: never sending");
        loom_comm_request *request = NULL;
        if (loom_comm_irecv(world, x, sizeof x, 1, 0, &request) != LOOM_OK) {
            loom_comm_abort(1, loom_last_error());
        }
        int done = 0;
        for (double end = loom_now() + 30.0; !done && loom_now() < end;) {
            loom_comm_progress("test: polling a receive");
            loom_comm_test(request, &done);
            sleep_seconds(0.01);
        }
        status = 1;
    } else if (strcmp(mode, "slow_peer") == 0) {
        status = run_slow_peer(world, rank);
    } else if (strcmp(mode, "stopped") == 0) {
        status = run_stopped(world, rank);
    } else {
        loom_comm_abort(2, "usage: test_comm_failure exit|killed|hang|watchdog|busy_peer|"
                           "test_deadline|slow_peer|stopped");
    }
    if (status != 0) fprintf(stderr, "[rank %d] mode %s: the job was not ended\n", rank, mode);
    loom_comm_finalize(world);
    return status;
}
