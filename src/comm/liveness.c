/*
 * liveness.c — telling a peer that stopped (SIGSTOP, a frozen node: alive to the OS, so mpirun
 * sees nothing, but running no code at all) from one that is merely slow, busy or hung.
 *
 * Every rank runs a responder thread that answers pings. A wait that has gone on for a quarter
 * of the timeout pings the members of its group it waits for, every ping interval, and
 * remembers the oldest ping each has left unanswered. A stopped process runs no thread, so it
 * cannot answer; every other live process answers within milliseconds, whatever its main
 * thread is doing (a long GEMM, a checkpoint, even a deadlock — which its own watchdog then
 * names). A member silent for half the timeout is therefore the stopped one, and the waiter
 * names it and ends the job (wait.c): within 3/4 of the timeout (plus two ping intervals) of
 * the later of the stop and the start of the wait, where the wait deadline alone (1.5 x the
 * timeout, with no name) came much later.
 *
 * Pings and answers are empty messages on two duplicates of the world made at start-up, so
 * they can never match a user's message, nor each other (the responder takes everything on
 * `ping_comm`, a waiter everything on `answer_comm`). The tag of a ping is its round number;
 * the answer echoes it, so an answer says the peer was alive after that round was sent — an
 * answer left over from an earlier wait carries an old time and proves nothing new.
 *
 * The responder calls MPI from its own thread, hence MPI_THREAD_MULTIPLE (comm.c asks for it);
 * where MPI does not provide it, nothing here runs and a stopped rank is caught only by the
 * wait deadline, unnamed. Process-wide state, like the watchdog's (see wait.c).
 *
 * Not here: the messages and the abort (wait.c), starting MPI (comm.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "comm/comm_mpi.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* Pings start after this fraction of the timeout of waiting, and a member that has not answered
 * for LIVENESS_SILENT of the timeout is named: 0.25 + 0.5 leaves a quarter of the timeout for
 * the abort to end the job. */
#define LIVENESS_PING_AFTER 0.25
#define LIVENESS_SILENT     0.5
/* Rounds are numbered (and tagged) modulo this; MPI guarantees tags up to 32767. */
#define LIVENESS_ROUNDS 1024
/* How often the responder looks for pings. */
#define RESPONDER_POLL_NS 10000000L

static int liveness_on; /* main thread only */
static MPI_Comm ping_comm = MPI_COMM_NULL, answer_comm = MPI_COMM_NULL;
static double round_sent[LIVENESS_ROUNDS]; /* loom_now() when each round was sent (main thread) */
static int last_round;                     /* main thread only */
static double *unanswered; /* (world size) when the oldest ping each rank has not answered yet
                              was sent; 0: none outstanding */
static int world_size;

static pthread_t responder_thread;
static atomic_int responder_stop;
/* How often the responder enters MPI (loom_comm_set_background_poll). */
static atomic_long responder_poll_ns = RESPONDER_POLL_NS;

/* Answers every ping waiting on `ping_comm`. */
static void answer_pings(void) {
    for (;;) {
        int found = 0;
        MPI_Message message;
        MPI_Status status;
        if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, ping_comm, &found, &message, &status) !=
                MPI_SUCCESS ||
            !found) {
            return;
        }
        MPI_Mrecv(NULL, 0, MPI_BYTE, &message, MPI_STATUS_IGNORE);
        /* Empty messages complete at once; nothing waits for the request. */
        MPI_Request answer;
        if (MPI_Isend(NULL, 0, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, answer_comm, &answer) ==
            MPI_SUCCESS) {
            MPI_Request_free(&answer);
        }
    }
}

static void *responder_main(void *unused) {
    (void)unused;
    while (!atomic_load(&responder_stop)) {
        answer_pings(); /* which also moves every non-blocking transfer on (MPI's progress) */
        long ns = atomic_load(&responder_poll_ns);
        struct timespec pause = {ns / 1000000000L, ns % 1000000000L};
        nanosleep(&pause, NULL);
    }
    return NULL;
}

static void free_comms(void) {
    if (ping_comm != MPI_COMM_NULL) MPI_Comm_free(&ping_comm);
    if (answer_comm != MPI_COMM_NULL) MPI_Comm_free(&answer_comm);
    free(unanswered);
    unanswered = NULL;
}

loom_status comm_liveness_start(void) {
    if (liveness_on) return LOOM_OK;
    int rc = MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &ping_comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &answer_comm);
    if (rc != MPI_SUCCESS) {
        free_comms();
        return comm_mpi_fail(rc, NULL, "starting the liveness pings");
    }
    unanswered = loom_calloc((size_t)world_size, sizeof *unanswered, "liveness table");
    if (!unanswered) {
        free_comms();
        return LOOM_ERR_NOMEM;
    }
    atomic_store(&responder_stop, 0);
    if (pthread_create(&responder_thread, NULL, responder_main, NULL) != 0) {
        free_comms();
        return loom_fail(LOOM_ERR_RUNTIME, "cannot start the liveness responder thread");
    }
    liveness_on = 1;
    return LOOM_OK;
}

void comm_liveness_stop(void) {
    if (!liveness_on) return;
    atomic_store(&responder_stop, 1);
    pthread_join(responder_thread, NULL);
    free_comms();
    liveness_on = 0;
}

/* The world rank of member i of the members this request waits for (the peer of a send or
 * receive, every member of a collective's group). */
static int waited_member(const struct loom_comm_request *request, int i) {
    return request->peer >= 0 ? request->peer : request->comm->world_ranks[i];
}

static int waited_count(const struct loom_comm_request *request) {
    return request->peer >= 0 ? 1 : request->comm->size;
}

/* Takes every answer that has arrived; one to a rank's oldest unanswered ping, or a later one,
 * clears it. */
static void collect_answers(void) {
    for (;;) {
        int found = 0;
        MPI_Message message;
        MPI_Status status;
        if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, answer_comm, &found, &message, &status) !=
                MPI_SUCCESS ||
            !found) {
            return;
        }
        MPI_Mrecv(NULL, 0, MPI_BYTE, &message, MPI_STATUS_IGNORE);
        int from = status.MPI_SOURCE, round = status.MPI_TAG;
        if (from < 0 || from >= world_size || round < 0 || round >= LIVENESS_ROUNDS) continue;
        if (round_sent[round] >= unanswered[from]) unanswered[from] = 0;
    }
}

static void send_round(const struct loom_comm_request *request, double now) {
    last_round = (last_round + 1) % LIVENESS_ROUNDS;
    round_sent[last_round] = now;
    int self = loom_comm_world_rank();
    for (int i = 0; i < waited_count(request); i++) {
        int member = waited_member(request, i);
        if (member == self) continue;
        /* An error (a peer that died) just leaves the peer silent; mpirun handles the dead. */
        MPI_Request ping;
        if (MPI_Isend(NULL, 0, MPI_BYTE, member, last_round, ping_comm, &ping) == MPI_SUCCESS) {
            MPI_Request_free(&ping);
        }
        if (unanswered[member] == 0) unanswered[member] = now;
    }
}

int comm_liveness_check(struct loom_comm_request *request, double waited, double timeout,
                        double *silent_for) {
    if (!liveness_on || timeout <= 0 || waited < LIVENESS_PING_AFTER * timeout) return -1;
    double interval = timeout / 10;
    if (interval < 0.05) interval = 0.05;
    if (interval > 1.0) interval = 1.0;
    double now = loom_now();
    if (now - request->pinged_at < interval) return -1;
    if (request->pings_began == 0) request->pings_began = now;
    collect_answers();
    int self = loom_comm_world_rank();
    for (int i = 0; i < waited_count(request); i++) {
        int member = waited_member(request, i);
        if (member == self) continue;
        /* The rule that names a rank: its silence runs from the oldest ping it has left
         * unanswered — not from its last answer, which would count against it the time this
         * rank was not asking (the gaps of a loop of tests, compute between waits). An answer
         * clears that ping only if it answers it or a later one (its round carries the send
         * time), so an answer left over from an earlier wait proves nothing; and silence never
         * counts from before this request's first ping. */
        if (unanswered[member] == 0) continue;
        double since =
            unanswered[member] > request->pings_began ? unanswered[member] : request->pings_began;
        if (now - since > LIVENESS_SILENT * timeout) {
            *silent_for = now - since;
            return member;
        }
    }
    send_round(request, now);
    request->pinged_at = now;
    return -1;
}

void loom_comm_set_background_poll(double seconds) {
    long ns = seconds > 0 ? (long)(seconds * 1e9) : RESPONDER_POLL_NS;
    atomic_store(&responder_poll_ns, ns < 100000L ? 100000L : ns);
}
