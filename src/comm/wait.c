/*
 * wait.c — the failure rules of the comm module: the timed wait every blocking operation ends
 * in, the progress note, and the watchdog thread.
 *
 * A job must end, with a message naming a rank, when one of its processes dies or hangs. A
 * rank that dies is mpirun's to notice: it tears the job down. A rank that waits for a peer
 * that never comes is caught by its own wait deadline (the timeout, counted from the start of
 * the wait), which aborts the whole job naming the operation, the group and its ranks. A rank
 * that hangs outside communication (a deadlock in compute, an endless loop) is caught by the
 * watchdog: a thread that ends the process when nothing has called into comm for the timeout.
 * The watchdog stays quiet while the rank sits in a wait — a slow peer is the wait's business.
 * A rank that stopped altogether (SIGSTOP) runs no watchdog: a wait names it when it stops
 * answering liveness pings (liveness.c).
 *
 * The watchdog thread never calls MPI, so that nothing inside MPI can hold it up: it writes its
 * line and _exit()s, and mpirun ends the other ranks. The state below is process-wide by nature
 * (one MPI runtime, one watchdog per process), hence globals — the one exception to loom's
 * rule against global mutable state beyond the logger and the error slot.
 *
 * Not here: starting MPI, communicators, the operations themselves (comm.c, ops.c), or the
 * liveness pings (liveness.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "comm/comm_mpi.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Waits shorter than this only spin on MPI_Test: most small messages arrive within it. */
#define WAIT_SPIN_SECONDS 50e-6
/* Then the wait yields the core between polls (other ranks and threads get it when they want
 * it, and a rank alone on its core keeps polling at full speed, which large transfers need:
 * Open MPI's shared-memory and non-blocking collective engines move data only when polled). */
#define WAIT_YIELD_SECONDS 2e-3
/* After that, the wait sleeps between polls, so that oversubscribed ranks do not burn the
 * cores their peers need: short sleeps first, longer ones for long waits. */
#define WAIT_SHORT_SLEEP_NS 50000L
#define WAIT_LONG_SLEEP_NS  200000L
#define WAIT_LONG_AFTER     20e-3

static _Atomic double timeout_seconds = 60.0;
static _Atomic int64_t last_activity_ns; /* monotonic time of the last comm call */
static _Atomic int waiting;              /* 1 while inside a timed wait (its own deadline) */

static pthread_mutex_t note_lock = PTHREAD_MUTEX_INITIALIZER;
static char progress_note[256]; /* guarded by note_lock */

static pthread_mutex_t watchdog_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watchdog_wake;          /* initialised (on the monotonic clock) at start */
static int watchdog_stop_requested;           /* guarded by watchdog_lock */
static int watchdog_wanted, watchdog_running; /* main thread only */
static pthread_t watchdog_thread;

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void comm_note_activity(void) {
    atomic_store_explicit(&last_activity_ns, monotonic_ns(), memory_order_relaxed);
}

void loom_comm_progress(const char *what) {
    comm_note_activity();
    if (!what) return;
    pthread_mutex_lock(&note_lock);
    snprintf(progress_note, sizeof progress_note, "%s", what);
    pthread_mutex_unlock(&note_lock);
}

/* Copies the progress note as " during 'NOTE'" (or "" when there is none). Does not block:
 * the caller may be the watchdog, which must not wait on a thread that hangs. */
static void format_note(char *buf, size_t size) {
    buf[0] = '\0';
    if (pthread_mutex_trylock(&note_lock) != 0) return;
    if (progress_note[0]) snprintf(buf, size, " during '%s'", progress_note);
    pthread_mutex_unlock(&note_lock);
}

double loom_comm_get_timeout(void) {
    return atomic_load(&timeout_seconds);
}

void loom_comm_set_timeout(double seconds) {
    atomic_store(&timeout_seconds, seconds > 0 ? seconds : 0.0);
    comm_note_activity(); /* a new timeout starts from now, not from the last call */
    if (watchdog_running) {
        pthread_mutex_lock(&watchdog_lock);
        pthread_cond_signal(&watchdog_wake);
        pthread_mutex_unlock(&watchdog_lock);
    } else if (watchdog_wanted && seconds > 0 && comm_watchdog_start() != LOOM_OK) {
        loom_warn("%s", loom_last_error());
    }
}

/* ---- naming ranks ------------------------------------------------------------------------ */

static atomic_int island_size; /* loom_comm_set_island_size (0: no islands) */

void loom_comm_set_island_size(int ranks_per_island) {
    atomic_store(&island_size, ranks_per_island > 0 ? ranks_per_island : 0);
}

/* " (island K)" for world rank `rank` in an islands job, else "". */
static const char *island_of(int rank, char *buf, size_t size) {
    int per = atomic_load(&island_size);
    buf[0] = '\0';
    if (per > 0 && rank >= 0) snprintf(buf, size, " (island %d)", rank / per);
    return buf;
}

/* ---- watchdog ---------------------------------------------------------------------------- */

__attribute__((noreturn)) static void watchdog_fire(double idle_seconds) {
    char note[300], line[560], island[32];
    format_note(note, sizeof note);
    int me = loom_comm_world_rank();
    int len = snprintf(line, sizeof line,
                       "[rank %d] error: no progress for %.1f s%s — this rank%s hangs; aborting "
                       "the job\n",
                       me, idle_seconds, note, island_of(me, island, sizeof island));
    if (len > 0) {
        size_t n = (size_t)len < sizeof line ? (size_t)len : sizeof line - 1;
        ssize_t written = write(STDERR_FILENO, line, n);
        (void)written;
    }
    _exit(1);
}

static void *watchdog_main(void *unused) {
    (void)unused;
    pthread_mutex_lock(&watchdog_lock);
    while (!watchdog_stop_requested) {
        double timeout = atomic_load(&timeout_seconds);
        if (timeout <= 0) {
            pthread_cond_wait(&watchdog_wake, &watchdog_lock);
            continue;
        }
        /* Checking ten times per timeout bounds the overshoot to a tenth of it. */
        double interval = timeout / 10;
        if (interval < 0.05) interval = 0.05;
        if (interval > 1.0) interval = 1.0;
        int64_t until_ns = monotonic_ns() + (int64_t)(interval * 1e9);
        struct timespec until = {.tv_sec = until_ns / 1000000000, .tv_nsec = until_ns % 1000000000};
        pthread_cond_timedwait(&watchdog_wake, &watchdog_lock, &until);
        if (watchdog_stop_requested) break;
        timeout = atomic_load(&timeout_seconds);
        if (timeout <= 0 || atomic_load(&waiting)) continue;
        double idle = 1e-9 * (double)(monotonic_ns() - atomic_load(&last_activity_ns));
        if (idle > timeout) watchdog_fire(idle);
    }
    pthread_mutex_unlock(&watchdog_lock);
    return NULL;
}

loom_status comm_watchdog_start(void) {
    watchdog_wanted = 1;
    comm_note_activity();
    if (watchdog_running || atomic_load(&timeout_seconds) <= 0) return LOOM_OK;
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) {
        return loom_fail(LOOM_ERR_RUNTIME, "cannot start the comm watchdog (condattr)");
    }
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&watchdog_wake, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0) return loom_fail(LOOM_ERR_RUNTIME, "cannot start the comm watchdog (cond)");
    watchdog_stop_requested = 0;
    if (pthread_create(&watchdog_thread, NULL, watchdog_main, NULL) != 0) {
        pthread_cond_destroy(&watchdog_wake);
        return loom_fail(LOOM_ERR_RUNTIME, "cannot start the comm watchdog thread");
    }
    watchdog_running = 1;
    return LOOM_OK;
}

void comm_watchdog_stop(void) {
    watchdog_wanted = 0;
    if (!watchdog_running) return;
    pthread_mutex_lock(&watchdog_lock);
    watchdog_stop_requested = 1;
    pthread_cond_signal(&watchdog_wake);
    pthread_mutex_unlock(&watchdog_lock);
    pthread_join(watchdog_thread, NULL);
    pthread_cond_destroy(&watchdog_wake);
    watchdog_running = 0;
}

/* ---- timed wait -------------------------------------------------------------------------- */

/* A wait gives up only at this multiple of the timeout: a peer that hangs is then caught first
 * by its own watchdog (at the timeout), and one that stopped by the liveness pings (at three
 * quarters of it), both of which name it; the waiters' message, which cannot tell which peer
 * is silent, comes only if those fail (or the peer is alive and busy but never joins). */
#define WAIT_GRACE 1.5

/* "allreduce on group 'dp' (ranks 0,1) during 'NOTE'": what this rank was waiting in. */
static void describe_wait(const struct loom_comm_request *request, char *buf, size_t size) {
    char ranks[256], note[300], peer[48] = "";
    comm_format_ranks(request->comm, ranks, sizeof ranks);
    format_note(note, sizeof note);
    if (request->peer >= 0) {
        snprintf(peer, sizeof peer, " %s rank %d", strcmp(request->op, "send") == 0 ? "to" : "from",
                 request->peer);
    }
    snprintf(buf, size, "%s%s on group '%s' (ranks %s)%s", request->op, peer, request->comm->name,
             ranks, note);
}

__attribute__((noreturn)) static void abort_job(void) {
    fflush(stderr);
    /* Should MPI_Abort itself hang, the watchdog (no longer held off by the wait) ends us. */
    atomic_store(&waiting, 0);
    comm_note_activity();
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

__attribute__((noreturn)) static void timeout_abort(const struct loom_comm_request *request,
                                                    double waited) {
    char wait[700];
    describe_wait(request, wait, sizeof wait);
    fprintf(stderr,
            "[rank %d] error: timed out after %.1f s waiting in %s; a peer rank has died or "
            "hangs — aborting the job\n",
            loom_comm_world_rank(), waited, wait);
    abort_job();
}

/* Ends the job when a member this request waits for has stopped answering liveness pings. */
static void check_liveness(struct loom_comm_request *request, double waited, double timeout) {
    double silent_for = 0;
    int stopped = comm_liveness_check(request, waited, timeout, &silent_for);
    if (stopped < 0) return;
    char wait[700], island[32];
    describe_wait(request, wait, sizeof wait);
    fprintf(stderr,
            "[rank %d] error: rank %d%s stopped responding (no answer to liveness pings for %.1f s "
            "while waiting in %s) — aborting the job\n",
            loom_comm_world_rank(), stopped, island_of(stopped, island, sizeof island), silent_for,
            wait);
    abort_job();
}

void comm_request_release(struct loom_comm_request *request) {
    free(request->heap_reqs);
    request->heap_reqs = NULL;
    free(request->scratch);
    request->scratch = NULL;
    request->count = request->done = 0;
}

/* Tests the first request not yet seen complete, and the ones after it while they are. That
 * is enough: every MPI_Test drives the progress of all outstanding requests. Returns
 * MPI_SUCCESS or the first error. */
static int poll_requests(struct loom_comm_request *request, int *complete) {
    while (request->done < request->count) {
        int flag = 0;
        int rc = MPI_Test(&comm_request_slots(request)[request->done], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
        if (!flag) break;
        request->done++;
    }
    *complete = request->done == request->count;
    return MPI_SUCCESS;
}

static void wait_backoff(double elapsed) {
    if (elapsed < WAIT_SPIN_SECONDS) return;
    if (elapsed < WAIT_YIELD_SECONDS) {
        sched_yield();
        return;
    }
    struct timespec pause = {0,
                             elapsed < WAIT_LONG_AFTER ? WAIT_SHORT_SLEEP_NS : WAIT_LONG_SLEEP_NS};
    nanosleep(&pause, NULL);
}

loom_status comm_request_wait(struct loom_comm_request *request) {
    comm_note_activity();
    loom_status status = LOOM_OK;
    double timeout = atomic_load(&timeout_seconds);
    double start = loom_now();
    atomic_store(&waiting, 1);
    for (;;) {
        int complete = 0;
        int rc = poll_requests(request, &complete);
        if (rc != MPI_SUCCESS) {
            status = comm_mpi_fail(rc, request->comm, request->op);
            break;
        }
        if (complete) break;
        double elapsed = loom_now() - start;
        if (timeout > 0 && elapsed > WAIT_GRACE * timeout) timeout_abort(request, elapsed);
        check_liveness(request, elapsed, timeout);
        wait_backoff(elapsed);
    }
    atomic_store(&waiting, 0);
    comm_note_activity();
    comm_request_release(request);
    return status;
}

loom_status comm_request_test(struct loom_comm_request *request, int *done, int deadline) {
    comm_note_activity();
    *done = 0;
    int complete = 0;
    int rc = poll_requests(request, &complete);
    if (rc != MPI_SUCCESS) {
        loom_status status = comm_mpi_fail(rc, request->comm, request->op);
        comm_request_release(request);
        return status;
    }
    if (complete) {
        comm_request_release(request);
        *done = 1;
        return LOOM_OK;
    }
    /* A loop that only tests is a wait too, and must not hang: the deadline runs from the
     * start of the operation (a background poll leaves it to the wait that ends it). */
    if (!deadline) return LOOM_OK;
    double timeout = atomic_load(&timeout_seconds);
    double waited = loom_now() - request->started;
    if (timeout > 0 && waited > WAIT_GRACE * timeout) timeout_abort(request, waited);
    check_liveness(request, waited, timeout);
    return LOOM_OK;
}

/* ---- public wait and test ---------------------------------------------------------------- */

loom_status loom_comm_wait(loom_comm_request *request) {
    if (!request) return loom_fail(LOOM_ERR_RUNTIME, "comm wait: no request");
    double start = loom_now();
    loom_status status = comm_request_wait(request);
    request->comm->stats.seconds += loom_now() - start;
    free(request);
    return status;
}

static loom_status test_request(loom_comm_request *request, int *done, int deadline) {
    *done = 0;
    if (!request) return loom_fail(LOOM_ERR_RUNTIME, "comm test: no request");
    double start = loom_now();
    loom_status status = comm_request_test(request, done, deadline);
    request->comm->stats.seconds += loom_now() - start;
    if (status != LOOM_OK || *done) free(request);
    return status;
}

loom_status loom_comm_test(loom_comm_request *request, int *done) {
    return test_request(request, done, 1);
}

loom_status loom_comm_poll(loom_comm_request *request, int *done) {
    return test_request(request, done, 0);
}
