/*
 * comm_mpi.h — what the files of src/comm share: the layout of a communicator and of a
 * request, and the timed wait. The only header of loom that includes <mpi.h>; it must not be
 * included from outside src/comm.
 */
#ifndef LOOM_COMM_MPI_H
#define LOOM_COMM_MPI_H

#include "loom/comm.h"

#include <mpi.h>

struct loom_comm {
    MPI_Comm mpi;     /* owned: freed with the communicator */
    MPI_Comm ring;    /* owned: a duplicate for loom's own algorithms (ring.c), whose messages
                         must never match the user's */
    char name[64];    /* "world", "dp", "tp", ... — named in messages */
    int rank, size;   /* this process's rank in the group, and the group's size */
    int *world_ranks; /* (size) world rank of every member, for messages */
    loom_comm_stats stats;
};

/* MPI requests held inline by a loom request; more (chunked transfers) go to the heap. */
#define COMM_INLINE_REQUESTS 4

struct loom_comm_request {
    loom_comm *comm;
    const char *op;         /* "allreduce", "send", ... (a string literal) */
    int peer;               /* world rank of the other side of a send or recv; -1 otherwise */
    double started;         /* loom_now() when the operation was started */
    double pings_began;     /* loom_now() of its first liveness ping (liveness.c); 0: none yet */
    double pinged_at;       /* loom_now() of its latest liveness ping */
    int count;              /* MPI requests posted */
    int done;               /* leading requests seen complete */
    MPI_Request *heap_reqs; /* (count) when more than fit inline; NULL otherwise */
    int *scratch;           /* what MPI reads until completion (allgatherv's counts); or NULL */
    MPI_Request inline_reqs[COMM_INLINE_REQUESTS];
};

/* The MPI requests of a loom request (an index rather than a stored pointer to itself, so that
 * a request may be copied). */
static inline MPI_Request *comm_request_slots(struct loom_comm_request *request) {
    return request->heap_reqs ? request->heap_reqs : request->inline_reqs;
}

/* Elements per MPI call for elements of `elem_size` bytes (see loom_comm_set_max_chunk). */
int64_t comm_chunk_elements(size_t elem_size);

/* Starts a send (sending = 1) or receive of `bytes` to or from member `peer` of comm on
 * `channel` (comm->mpi, or comm->ring for loom's own algorithms), in chunks, into `request`
 * (no MPI request at all for 0 bytes). Arguments are the caller's to check; not counted in
 * the stats. */
loom_status comm_start_transfer(loom_comm *comm, MPI_Comm channel, int sending, void *buf,
                                int64_t bytes, int peer, int tag,
                                struct loom_comm_request *request);

/* A barrier with a deadline that does not count in the communicator's stats; `op` names it
 * in the timeout message ("split", "finalize"). */
loom_status comm_timed_barrier(loom_comm *comm, const char *op);

/* Turns an MPI error code into a loom error naming the operation and the group. */
loom_status comm_mpi_fail(int code, const loom_comm *comm, const char *op);

/* Marks that the process is doing something (any comm call counts), for the watchdog. */
void comm_note_activity(void);

/* Waits for every MPI request of `request` to complete, up to the timeout from the start of
 * the wait; past it, prints one line naming the rank, the operation, the group and the last
 * progress note, and aborts the job. Releases the request's MPI request array (not the
 * request itself). */
loom_status comm_request_wait(struct loom_comm_request *request);
/* One poll; *done = 1 when every MPI request is complete (the array is then released). Past
 * the timeout counted from when the request was started, aborts the job like a wait (deadline
 * 0: never; loom_comm_poll). */
loom_status comm_request_test(struct loom_comm_request *request, int *done, int deadline);
/* Frees the heap array of MPI requests, if any. */
void comm_request_release(struct loom_comm_request *request);

/* The watchdog thread: started once MPI runs in a world of more than one process, stopped
 * before MPI is finalized. */
loom_status comm_watchdog_start(void);
void comm_watchdog_stop(void);

/* Liveness pings (liveness.c), on when MPI provides MPI_THREAD_MULTIPLE and the world has more
 * than one process: start after MPI_Init_thread, stop before MPI_Finalize. */
loom_status comm_liveness_start(void);
void comm_liveness_stop(void);
/* Called on every poll of a wait on `request` that has lasted `waited` seconds so far: pings
 * the members it waits for now and then, and returns the world rank of one that has not
 * answered for half the timeout (and how long, in *silent_for) — a stopped process — or -1. */
int comm_liveness_check(struct loom_comm_request *request, double waited, double timeout,
                        double *silent_for);

/* Formats "0,1,2" (at most a few dozen ranks, then "... (N in all)") into buf. */
void comm_format_ranks(const loom_comm *comm, char *buf, size_t size);

#endif
