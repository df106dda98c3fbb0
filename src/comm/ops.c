/*
 * ops.c — the operations: allreduce, allgather, a blocking reduce-scatter (ring.c's ring run
 * to its end), broadcast, barrier, and point-to-point sends and receives, blocking and
 * non-blocking, with their byte counts.
 *
 * Every operation is started non-blocking; a blocking call is the start plus the timed wait
 * (wait.c), so that no call can block without a deadline. Transfers larger than one MPI call
 * should carry (16 MiB, see comm.c; fewer elements when lowered for tests) are split into
 * chunks: one MPI request per chunk, all in flight together. This is also what makes counts
 * above INT_MAX work. In a world of one, every collective is a local copy or nothing.
 *
 * Not here: communicators (comm.c), the wait and its deadline (wait.c), the reduce-scatter
 * (ring.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "comm/comm_mpi.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- requests ---------------------------------------------------------------------------- */

/* Prepares `request` for `capacity` MPI requests of operation `op`. */
static loom_status request_begin(struct loom_comm_request *request, loom_comm *comm, const char *op,
                                 int peer, int64_t capacity) {
    memset(request, 0, sizeof *request);
    request->comm = comm;
    request->op = op;
    request->peer = peer;
    request->started = loom_now();
    if (capacity > INT_MAX) {
        return loom_fail(LOOM_ERR_RUNTIME, "%s on group '%s': too many chunks (%lld)", op,
                         comm->name, (long long)capacity);
    }
    if (capacity > COMM_INLINE_REQUESTS) {
        request->heap_reqs = loom_malloc((size_t)capacity * sizeof(MPI_Request), "MPI requests");
        if (!request->heap_reqs) return LOOM_ERR_NOMEM;
    }
    return LOOM_OK;
}

/* The next free MPI request slot; the caller counts it once MPI has accepted it. */
static MPI_Request *next_slot(struct loom_comm_request *request) {
    return &comm_request_slots(request)[request->count];
}

/* After a failed start, the requests already posted cannot be cancelled (MPI forbids it for
 * collectives): the communicator is unusable, and the caller should end the job. */
static loom_status start_failed(struct loom_comm_request *request, int code) {
    loom_status status = comm_mpi_fail(code, request->comm, request->op);
    comm_request_release(request);
    return status;
}

static int64_t chunk_count(int64_t count, int64_t chunk) {
    return (count + chunk - 1) / chunk;
}

/* ---- argument checks (programming errors; every rank makes the same decision) ------------ */

static loom_status check_buffer(const loom_comm *comm, const char *op, const void *buf,
                                int64_t count) {
    if (count < 0) {
        return loom_fail(LOOM_ERR_RUNTIME, "%s on group '%s': negative count %lld", op, comm->name,
                         (long long)count);
    }
    if (count > 0 && !buf) {
        return loom_fail(LOOM_ERR_RUNTIME, "%s on group '%s': no buffer for %lld elements", op,
                         comm->name, (long long)count);
    }
    return LOOM_OK;
}

static loom_status check_rank(const loom_comm *comm, const char *op, const char *what, int rank) {
    if (rank < 0 || rank >= comm->size) {
        return loom_fail(LOOM_ERR_RUNTIME, "%s on group '%s': %s %d is not in [0, %d)", op,
                         comm->name, what, rank, comm->size);
    }
    return LOOM_OK;
}

static int overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a_bytes && b_bytes && x < y + b_bytes && y < x + a_bytes;
}

/* ---- starting each operation ------------------------------------------------------------- */

static loom_status start_allreduce(loom_comm *comm, void *buf, int64_t count, MPI_Datatype type,
                                   size_t elem_size, MPI_Op op, struct loom_comm_request *request) {
    int64_t chunk = comm_chunk_elements(elem_size);
    int64_t pieces = comm->size > 1 ? chunk_count(count, chunk) : 0;
    loom_status status = request_begin(request, comm, "allreduce", -1, pieces);
    if (status != LOOM_OK || pieces == 0) return status;
    for (int64_t offset = 0; offset < count; offset += chunk) {
        int n = (int)(count - offset < chunk ? count - offset : chunk);
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + offset * (int64_t)elem_size, n, type,
                                op, comm->mpi, next_slot(request));
        if (rc != MPI_SUCCESS) return start_failed(request, rc);
        request->count++;
    }
    return LOOM_OK;
}

/* `count` floats spaced `stride` floats apart: one piece of each rank's block of an allgather. */
static int column_type(int count, int64_t stride, MPI_Datatype *out) {
    MPI_Datatype piece;
    int rc = MPI_Type_contiguous(count, MPI_FLOAT, &piece);
    if (rc != MPI_SUCCESS) return rc;
    rc = MPI_Type_create_resized(piece, 0, (MPI_Aint)stride * (MPI_Aint)sizeof(float), out);
    MPI_Type_free(&piece);
    if (rc != MPI_SUCCESS) return rc;
    rc = MPI_Type_commit(out);
    if (rc != MPI_SUCCESS) MPI_Type_free(out);
    return rc;
}

static loom_status start_allgather(loom_comm *comm, const float *send, float *recv, int64_t count,
                                   struct loom_comm_request *request) {
    const int size = comm->size;
    const int64_t chunk = comm_chunk_elements(sizeof(float));
    float *own = recv + (int64_t)comm->rank * count;
    const int in_place = send == own;
    if (size == 1 || count == 0) {
        if (count && !in_place) memcpy(own, send, (size_t)count * sizeof(float));
        return request_begin(request, comm, "allgather", -1, 0);
    }
    if (count <= chunk / size) {
        loom_status status = request_begin(request, comm, "allgather", -1, 1);
        if (status != LOOM_OK) return status;
        int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)count, MPI_FLOAT, recv,
                                (int)count, MPI_FLOAT, comm->mpi, next_slot(request));
        if (rc != MPI_SUCCESS) return start_failed(request, rc);
        request->count++;
        return LOOM_OK;
    }
    /* Too large for one call: gather one column of the blocks at a time — `piece` elements
     * of every rank's block. The receive type is `piece` floats whose extent is a whole block,
     * so that rank i's piece lands in block i. */
    const int64_t piece = chunk / size > 0 ? chunk / size : 1;
    loom_status status = request_begin(request, comm, "allgather", -1, chunk_count(count, piece));
    if (status != LOOM_OK) return status;
    for (int64_t offset = 0; offset < count; offset += piece) {
        int n = (int)(count - offset < piece ? count - offset : piece);
        MPI_Datatype column = MPI_DATATYPE_NULL;
        int rc = column_type(n, count, &column);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send + offset, n, MPI_FLOAT,
                                recv + offset, 1, column, comm->mpi, next_slot(request));
        }
        /* MPI keeps the type alive for the operations still using it. */
        if (column != MPI_DATATYPE_NULL) MPI_Type_free(&column);
        if (rc != MPI_SUCCESS) return start_failed(request, rc);
        request->count++;
    }
    return LOOM_OK;
}

static loom_status start_broadcast(loom_comm *comm, void *buf, int64_t bytes, int root,
                                   struct loom_comm_request *request) {
    int64_t chunk = comm_chunk_elements(1);
    int64_t pieces = comm->size > 1 ? chunk_count(bytes, chunk) : 0;
    loom_status status = request_begin(request, comm, "broadcast", -1, pieces);
    if (status != LOOM_OK || pieces == 0) return status;
    for (int64_t offset = 0; offset < bytes; offset += chunk) {
        int n = (int)(bytes - offset < chunk ? bytes - offset : chunk);
        int rc = MPI_Ibcast((char *)buf + offset, n, MPI_BYTE, root, comm->mpi, next_slot(request));
        if (rc != MPI_SUCCESS) return start_failed(request, rc);
        request->count++;
    }
    return LOOM_OK;
}

loom_status comm_start_transfer(loom_comm *comm, MPI_Comm channel, int sending, void *buf,
                                int64_t bytes, int peer, int tag,
                                struct loom_comm_request *request) {
    int64_t chunk = comm_chunk_elements(1);
    loom_status status = request_begin(request, comm, sending ? "send" : "recv",
                                       comm->world_ranks[peer], chunk_count(bytes, chunk));
    if (status != LOOM_OK) return status;
    /* MPI keeps messages between two ranks with one tag in order, so chunks arrive in order. */
    for (int64_t offset = 0; offset < bytes; offset += chunk) {
        int n = (int)(bytes - offset < chunk ? bytes - offset : chunk);
        int rc = sending ? MPI_Isend((char *)buf + offset, n, MPI_BYTE, peer, tag, channel,
                                     next_slot(request))
                         : MPI_Irecv((char *)buf + offset, n, MPI_BYTE, peer, tag, channel,
                                     next_slot(request));
        if (rc != MPI_SUCCESS) return start_failed(request, rc);
        request->count++;
    }
    return LOOM_OK;
}

static loom_status start_barrier(loom_comm *comm, const char *op,
                                 struct loom_comm_request *request) {
    loom_status status = request_begin(request, comm, op, -1, comm->size > 1 ? 1 : 0);
    if (status != LOOM_OK || comm->size == 1) return status;
    int rc = MPI_Ibarrier(comm->mpi, next_slot(request));
    if (rc != MPI_SUCCESS) return start_failed(request, rc);
    request->count++;
    return LOOM_OK;
}

/* ---- counting ---------------------------------------------------------------------------- */

/* Ring volumes, as nccl-tests count them: what one rank sends. */
static int64_t allreduce_bytes(const loom_comm *comm, int64_t bytes) {
    return bytes / comm->size * 2 * (comm->size - 1) +
           bytes % comm->size * 2 * (comm->size - 1) / comm->size;
}

static void count_call(loom_comm *comm, int64_t bytes) {
    comm->stats.calls++;
    comm->stats.bytes += bytes;
}

/* Waits for a started blocking operation and adds its time (since `t0`) to the stats. */
static loom_status finish_blocking(loom_comm *comm, struct loom_comm_request *request,
                                   loom_status started, double t0) {
    loom_status status = started == LOOM_OK ? comm_request_wait(request) : started;
    comm->stats.seconds += loom_now() - t0;
    return status;
}

/* A request for a non-blocking call lives on the heap until loom_comm_wait frees it. */
static loom_comm_request *new_request(void) {
    return loom_malloc(sizeof(loom_comm_request), "comm request");
}

/* Hands a started request out, or frees it when the start failed. */
static loom_status hand_out(loom_comm_request *request, loom_status started,
                            loom_comm_request **out) {
    if (started != LOOM_OK) {
        free(request);
        return started;
    }
    *out = request;
    return LOOM_OK;
}

/* ---- public operations ------------------------------------------------------------------- */

static loom_status allreduce(loom_comm *comm, void *buf, int64_t count, MPI_Datatype type,
                             size_t elem_size, loom_reduce_op op) {
    comm_note_activity();
    loom_status status = check_buffer(comm, "allreduce", buf, count);
    if (status != LOOM_OK) return status;
    double t0 = loom_now();
    struct loom_comm_request request;
    status = start_allreduce(comm, buf, count, type, elem_size,
                             op == LOOM_REDUCE_MAX ? MPI_MAX : MPI_SUM, &request);
    if (status == LOOM_OK) count_call(comm, allreduce_bytes(comm, count * (int64_t)elem_size));
    return finish_blocking(comm, &request, status, t0);
}

loom_status loom_comm_allreduce_f32(loom_comm *comm, float *buf, int64_t count, loom_reduce_op op) {
    return allreduce(comm, buf, count, MPI_FLOAT, sizeof(float), op);
}

loom_status loom_comm_allreduce_f64(loom_comm *comm, double *buf, int64_t count,
                                    loom_reduce_op op) {
    return allreduce(comm, buf, count, MPI_DOUBLE, sizeof(double), op);
}

/* An allgather's buffers: valid, and send either this rank's block of recv (in place) or
 * apart from it. */
static loom_status check_allgather(const loom_comm *comm, const float *send, const float *recv,
                                   int64_t count) {
    const char *op = "allgather";
    loom_status status = check_buffer(comm, op, send, count);
    if (status == LOOM_OK) status = check_buffer(comm, op, recv, count);
    if (status != LOOM_OK) return status;
    size_t bytes = (size_t)count * sizeof(float);
    const float *own = recv + (int64_t)comm->rank * count;
    if (send != own && overlaps(send, bytes, recv, bytes * (size_t)comm->size)) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "%s on group '%s': send overlaps recv (in place, send must be this "
                         "rank's block of recv)",
                         op, comm->name);
    }
    return LOOM_OK;
}

loom_status loom_comm_allgather_f32(loom_comm *comm, const float *send, float *recv,
                                    int64_t count) {
    comm_note_activity();
    loom_status status = check_allgather(comm, send, recv, count);
    if (status != LOOM_OK) return status;
    double t0 = loom_now();
    struct loom_comm_request request;
    status = start_allgather(comm, send, recv, count, &request);
    if (status == LOOM_OK) count_call(comm, (comm->size - 1) * count * (int64_t)sizeof(float));
    return finish_blocking(comm, &request, status, t0);
}

loom_status loom_comm_reduce_scatter_f32(loom_comm *comm, float *buf, int64_t count) {
    loom_status status = check_buffer(comm, "reduce-scatter", buf, count);
    if (status != LOOM_OK || comm->size == 1) return status;
    int64_t *bounds = loom_malloc(((size_t)comm->size + 1) * sizeof *bounds, "ring bounds");
    if (!bounds) return LOOM_ERR_NOMEM;
    for (int r = 0; r <= comm->size; r++) bounds[r] = (int64_t)r * count;
    /* a ring of its own, on the top tag (the gradient buckets' rings count up from 0): made and
     * freed per call, which costs a small allocation against the transfer */
    loom_comm_ring *ring = NULL;
    status = loom_comm_ring_create(comm, bounds, LOOM_COMM_MAX_TAG, &ring);
    free(bounds);
    if (status == LOOM_OK) status = loom_comm_ring_start(ring, buf);
    if (status == LOOM_OK) status = loom_comm_ring_wait(ring);
    loom_comm_ring_free(ring);
    return status;
}

loom_status loom_comm_broadcast(loom_comm *comm, void *buf, int64_t bytes, int root) {
    comm_note_activity();
    loom_status status = check_buffer(comm, "broadcast", buf, bytes);
    if (status == LOOM_OK) status = check_rank(comm, "broadcast", "root", root);
    if (status != LOOM_OK) return status;
    double t0 = loom_now();
    struct loom_comm_request request;
    status = start_broadcast(comm, buf, bytes, root, &request);
    if (status == LOOM_OK) count_call(comm, comm->rank == root && comm->size > 1 ? bytes : 0);
    return finish_blocking(comm, &request, status, t0);
}

loom_status comm_timed_barrier(loom_comm *comm, const char *op) {
    comm_note_activity();
    struct loom_comm_request request;
    loom_status status = start_barrier(comm, op, &request);
    return status == LOOM_OK ? comm_request_wait(&request) : status;
}

loom_status loom_comm_barrier(loom_comm *comm) {
    double t0 = loom_now();
    comm_note_activity();
    struct loom_comm_request request;
    loom_status status = start_barrier(comm, "barrier", &request);
    if (status == LOOM_OK) count_call(comm, 0);
    return finish_blocking(comm, &request, status, t0);
}

static loom_status check_point_to_point(const loom_comm *comm, const char *op, const void *buf,
                                        int64_t bytes, int peer, int tag) {
    loom_status status = check_buffer(comm, op, buf, bytes);
    if (status == LOOM_OK) status = check_rank(comm, op, "peer", peer);
    if (status == LOOM_OK && (tag < 0 || tag > LOOM_COMM_MAX_TAG)) {
        status = loom_fail(LOOM_ERR_RUNTIME, "%s on group '%s': tag %d is not in [0, %d]", op,
                           comm->name, tag, LOOM_COMM_MAX_TAG);
    }
    return status;
}

loom_status loom_comm_send(loom_comm *comm, const void *buf, int64_t bytes, int peer, int tag) {
    comm_note_activity();
    loom_status status = check_point_to_point(comm, "send", buf, bytes, peer, tag);
    if (status != LOOM_OK) return status;
    double t0 = loom_now();
    struct loom_comm_request request;
    /* MPI_Isend does not write the buffer; its C binding just predates const. */
    status = comm_start_transfer(comm, comm->mpi, 1, (void *)buf, bytes, peer, tag, &request);
    if (status == LOOM_OK) count_call(comm, bytes);
    return finish_blocking(comm, &request, status, t0);
}

loom_status loom_comm_recv(loom_comm *comm, void *buf, int64_t bytes, int peer, int tag) {
    comm_note_activity();
    loom_status status = check_point_to_point(comm, "recv", buf, bytes, peer, tag);
    if (status != LOOM_OK) return status;
    double t0 = loom_now();
    struct loom_comm_request request;
    status = comm_start_transfer(comm, comm->mpi, 0, buf, bytes, peer, tag, &request);
    if (status == LOOM_OK) count_call(comm, 0);
    return finish_blocking(comm, &request, status, t0);
}

loom_status loom_comm_iallreduce_f32(loom_comm *comm, float *buf, int64_t count,
                                     loom_comm_request **out) {
    *out = NULL;
    comm_note_activity();
    loom_status status = check_buffer(comm, "allreduce", buf, count);
    if (status != LOOM_OK) return status;
    loom_comm_request *request = new_request();
    if (!request) return LOOM_ERR_NOMEM;
    status = start_allreduce(comm, buf, count, MPI_FLOAT, sizeof(float), MPI_SUM, request);
    if (status == LOOM_OK) count_call(comm, allreduce_bytes(comm, count * (int64_t)sizeof(float)));
    return hand_out(request, status, out);
}

loom_status loom_comm_iallgather_f32(loom_comm *comm, const float *send, float *recv, int64_t count,
                                     loom_comm_request **out) {
    *out = NULL;
    comm_note_activity();
    loom_status status = check_allgather(comm, send, recv, count);
    if (status != LOOM_OK) return status;
    loom_comm_request *request = new_request();
    if (!request) return LOOM_ERR_NOMEM;
    status = start_allgather(comm, send, recv, count, request);
    if (status == LOOM_OK) count_call(comm, (comm->size - 1) * count * (int64_t)sizeof(float));
    return hand_out(request, status, out);
}

loom_status loom_comm_isend(loom_comm *comm, const void *buf, int64_t bytes, int peer, int tag,
                            loom_comm_request **out) {
    *out = NULL;
    comm_note_activity();
    loom_status status = check_point_to_point(comm, "send", buf, bytes, peer, tag);
    if (status != LOOM_OK) return status;
    loom_comm_request *request = new_request();
    if (!request) return LOOM_ERR_NOMEM;
    status = comm_start_transfer(comm, comm->mpi, 1, (void *)buf, bytes, peer, tag, request);
    if (status == LOOM_OK) count_call(comm, bytes);
    return hand_out(request, status, out);
}

loom_status loom_comm_irecv(loom_comm *comm, void *buf, int64_t bytes, int peer, int tag,
                            loom_comm_request **out) {
    *out = NULL;
    comm_note_activity();
    loom_status status = check_point_to_point(comm, "recv", buf, bytes, peer, tag);
    if (status != LOOM_OK) return status;
    loom_comm_request *request = new_request();
    if (!request) return LOOM_ERR_NOMEM;
    status = comm_start_transfer(comm, comm->mpi, 0, buf, bytes, peer, tag, request);
    if (status == LOOM_OK) count_call(comm, 0);
    return hand_out(request, status, out);
}
