/*
 * ring.c — loom's reduce-scatter: a ring of point-to-point exchanges, the bandwidth-optimal
 * algorithm, and the only one loom has. ZeRO-1's gradient buckets (parallel/grad_sync.c) and
 * `loom profile`'s reduce_scatter fits (cluster/profile_links.c) both run it, so the fits
 * describe the collective training runs.
 *
 * In place, over blocks of any sizes (a ZeRO-1 bucket is cut where the ranks' ranges cut it,
 * so its blocks are uneven and often empty). Step s (0 .. n-2) sends block rank-s-1 to the next
 * rank and receives the previous rank's block rank-s-2 into scratch, then adds it into this
 * rank's copy of that block: after the last step, block rank holds the sum over every rank.
 * Steps end only inside loom_comm_ring_test and loom_comm_ring_wait, which is where the next
 * step's messages are posted: a ring overlaps compute as far as its caller polls it.
 *
 * Why not MPI's reduce-scatter: Open MPI 4.1's (blocking and non-blocking alike) runs at about
 * 0.1 GB/s here from 1 MiB up, 30-50x slower than its allreduce — it would make ZeRO's gradient
 * reduce-scatter the slowest step of training. The ring traffic goes over the communicator's
 * private duplicate (comm->ring), tagged per ring, so it can never match a user's send or
 * receive, nor another ring's.
 *
 * Not here: the other collectives (ops.c), the timed wait (wait.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "comm/comm_mpi.h"

#include <stdlib.h>
#include <string.h>

struct loom_comm_ring {
    loom_comm *comm;
    int tag;
    int64_t *bounds;   /* (size + 1) block r of a buffer is [bounds[r], bounds[r + 1]) */
    float *incoming;   /* (the largest block) the step's partial sums from the previous rank */
    int borrows;       /* incoming is the caller's, handed in per run (loom_comm_ring_start_in) */
    float *buf;        /* the running reduce-scatter's buffer; NULL when none runs */
    int step;          /* the step in flight, 0 .. size - 2 */
    int receiving;     /* the step's receive is pending */
    int sending;       /* the step's send is pending */
    loom_status error; /* the first failure of the running reduce-scatter */
    struct loom_comm_request recv, send;
};

static int modulo(int a, int n) {
    return ((a % n) + n) % n;
}

static int64_t block_count(const loom_comm_ring *ring, int block) {
    return ring->bounds[block + 1] - ring->bounds[block];
}

static loom_status ring_create(loom_comm *comm, const int64_t *bounds, int tag, int borrows,
                               loom_comm_ring **out) {
    *out = NULL;
    const int size = comm->size;
    if (tag < 0 || tag > LOOM_COMM_MAX_TAG) {
        return loom_fail(LOOM_ERR_RUNTIME, "reduce-scatter on group '%s': tag %d is not in [0, %d]",
                         comm->name, tag, LOOM_COMM_MAX_TAG);
    }
    int64_t largest = 0;
    for (int r = 0; r < size; r++) {
        if (bounds[0] < 0 || bounds[r + 1] < bounds[r]) {
            return loom_fail(LOOM_ERR_RUNTIME,
                             "reduce-scatter on group '%s': block bounds must rise from 0 up, "
                             "got [%lld, %lld) for block %d",
                             comm->name, (long long)bounds[r], (long long)bounds[r + 1], r);
        }
        if (bounds[r + 1] - bounds[r] > largest) largest = bounds[r + 1] - bounds[r];
    }
    loom_comm_ring *ring = loom_calloc(1, sizeof *ring, "reduce-scatter ring");
    if (!ring) return LOOM_ERR_NOMEM;
    ring->comm = comm;
    ring->tag = tag;
    ring->bounds = loom_malloc(((size_t)size + 1) * sizeof *ring->bounds, "ring bounds");
    ring->borrows = borrows;
    if (!borrows) {
        ring->incoming = loom_alloc_aligned((size_t)(largest ? largest : 1) * sizeof(float),
                                            "reduce-scatter scratch");
    }
    if (!ring->bounds || (!borrows && !ring->incoming)) {
        loom_comm_ring_free(ring);
        return LOOM_ERR_NOMEM;
    }
    memcpy(ring->bounds, bounds, ((size_t)size + 1) * sizeof *bounds);
    *out = ring;
    return LOOM_OK;
}

loom_status loom_comm_ring_create(loom_comm *comm, const int64_t *bounds, int tag,
                                  loom_comm_ring **out) {
    return ring_create(comm, bounds, tag, 0, out);
}

loom_status loom_comm_ring_create_borrowing(loom_comm *comm, const int64_t *bounds, int tag,
                                            loom_comm_ring **out) {
    return ring_create(comm, bounds, tag, 1, out);
}

void loom_comm_ring_free(loom_comm_ring *ring) {
    if (!ring) return;
    if (!ring->borrows) loom_free_aligned(ring->incoming);
    free(ring->bounds);
    free(ring);
}

static void keep_error(loom_comm_ring *ring, loom_status status) {
    if (status != LOOM_OK && ring->error == LOOM_OK) ring->error = status;
}

/* Posts the current step: the receive of block rank-step-2's partial sums from the previous
 * rank, and the send of block rank-step-1 to the next. */
static loom_status post_step(loom_comm_ring *ring) {
    loom_comm *comm = ring->comm;
    const int size = comm->size, rank = comm->rank;
    const int out = modulo(rank - ring->step - 1, size), in = modulo(rank - ring->step - 2, size);
    loom_status status = comm_start_transfer(comm, comm->ring, 0, ring->incoming,
                                             block_count(ring, in) * (int64_t)sizeof(float),
                                             modulo(rank - 1, size), ring->tag, &ring->recv);
    if (status != LOOM_OK) return status;
    ring->receiving = 1;
    status = comm_start_transfer(comm, comm->ring, 1, ring->buf + ring->bounds[out],
                                 block_count(ring, out) * (int64_t)sizeof(float),
                                 modulo(rank + 1, size), ring->tag, &ring->send);
    ring->sending = status == LOOM_OK;
    return status;
}

loom_status loom_comm_ring_start(loom_comm_ring *ring, float *buf) {
    if (ring->borrows) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "reduce-scatter on group '%s' (tag %d): this ring borrows its scratch; "
                         "start it with loom_comm_ring_start_in",
                         ring->comm->name, ring->tag);
    }
    return loom_comm_ring_start_in(ring, buf, ring->incoming);
}

loom_status loom_comm_ring_start_in(loom_comm_ring *ring, float *buf, float *scratch) {
    comm_note_activity();
    loom_comm *comm = ring->comm;
    const int size = comm->size;
    if (!scratch && size > 1) {
        return loom_fail(LOOM_ERR_RUNTIME, "reduce-scatter on group '%s' (tag %d): no scratch",
                         comm->name, ring->tag);
    }
    if (ring->buf) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "reduce-scatter on group '%s' (tag %d): started again while running",
                         comm->name, ring->tag);
    }
    if (!buf && ring->bounds[size] > 0) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "reduce-scatter on group '%s': no buffer for %lld elements", comm->name,
                         (long long)ring->bounds[size]);
    }
    comm->stats.calls++;
    if (size == 1) return LOOM_OK; /* this rank's block is the sum already */
    comm->stats.bytes += (ring->bounds[size] - ring->bounds[0] - block_count(ring, comm->rank)) *
                         (int64_t)sizeof(float);
    ring->buf = buf;
    ring->incoming = scratch;
    ring->step = 0;
    ring->error = LOOM_OK;
    loom_status status = post_step(ring);
    if (status != LOOM_OK) {
        /* a receive already posted cannot be taken back: after an MPI error the communicator is
         * unusable anyway (loom/comm.h) */
        ring->buf = NULL;
        ring->receiving = ring->sending = 0;
    }
    return status;
}

/* Completes (wait) or checks one of the step's transfers; *pending = 0 once it is over. */
static void settle(loom_comm_ring *ring, struct loom_comm_request *request, int *pending,
                   int wait) {
    if (!*pending) return;
    int done = 0;
    loom_status status = wait ? comm_request_wait(request) : comm_request_test(request, &done, 1);
    if (wait || done || status != LOOM_OK) *pending = 0;
    keep_error(ring, status);
}

/* Moves the ring on as far as it goes without waiting (or, with wait, to its end). */
static void advance(loom_comm_ring *ring, int wait) {
    const int size = ring->comm->size;
    while (ring->buf) {
        settle(ring, &ring->recv, &ring->receiving, wait);
        settle(ring, &ring->send, &ring->sending, wait);
        if (ring->receiving || ring->sending) return;
        if (ring->error == LOOM_OK) {
            int in = modulo(ring->comm->rank - ring->step - 2, size);
            float *sum = ring->buf + ring->bounds[in];
            const int64_t count = block_count(ring, in);
            for (int64_t i = 0; i < count; i++) sum[i] += ring->incoming[i];
            if (++ring->step < size - 1) {
                loom_status status = post_step(ring);
                keep_error(ring, status);
                if (status == LOOM_OK) continue;
            }
        }
        ring->buf = NULL;
        ring->receiving = ring->sending = 0;
    }
}

/* The outcome of a run that is over: its first error, handed out once. */
static loom_status take_error(loom_comm_ring *ring) {
    loom_status status = ring->error;
    ring->error = LOOM_OK;
    return status;
}

loom_status loom_comm_ring_test(loom_comm_ring *ring, int *done) {
    comm_note_activity();
    double start = loom_now();
    advance(ring, 0);
    ring->comm->stats.seconds += loom_now() - start;
    *done = ring->buf == NULL;
    return *done ? take_error(ring) : LOOM_OK;
}

loom_status loom_comm_ring_wait(loom_comm_ring *ring) {
    comm_note_activity();
    double start = loom_now();
    advance(ring, 1);
    ring->comm->stats.seconds += loom_now() - start;
    return take_error(ring);
}
