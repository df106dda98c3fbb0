/*
 * qreduce.c — the quantised reduce-scatter and all-gather: int8 (a scale per block of entries)
 * or bf16 on the wire, fp32 sums, the same bits on every replica. The one compressed path for
 * ZeRO-2/3's gradient reduce-scatter and parameter all-gather, and for island training's sums.
 * The wire formats are the one-shot compressors' (quantize.c), one wire per block of the buffer,
 * encoded and decoded by a compressor of that block's shape (1 x count, no state of its own).
 *
 * Pairwise, not a ring. Every rank sends block r straight to rank r (and in the all-gather its
 * own block straight to every rank): each contribution is quantised exactly once, by the rank
 * that computed it, and the owner sums them in rank order. A ring would send partial sums, each
 * hop requantising the last one's rounding (n - 1 roundings compounding, and a sum whose order
 * depends on where the ring starts), and could post each step only after the previous one
 * arrived, so its overlap would depend on how often the caller polls. The bytes are the same
 * ((size - 1) x the buffer's wire over all ranks); what pairwise costs is n - 1 messages in
 * flight per rank at once instead of one, which MPI handles well at data-parallel sizes. All of a
 * call's messages are posted by its start, so MPI's progress inside any call moves them, and
 * plans in flight together may be waited in any order.
 *
 * Not here: which buffers are summed and when (parallel/grad_sync.c), the formats' arithmetic
 * (quantize.c), moving bytes (comm/).
 */
#include "compress_internal.h"

#include <stdlib.h>
#include <string.h>

enum { IDLE = -1 };

struct loom_qreduce {
    loom_comm *comm;
    int size, rank, tag;
    loom_compress_method method;
    int64_t *bounds;          /* (size + 1) block r of a buffer is [bounds[r], bounds[r + 1]) */
    loom_compressor **coder;  /* (size) block r's format (1 x count); NULL for an empty block */
    int64_t *wire_at;         /* (size + 1) block r's wire is [wire_at[r], wire_at[r + 1]) */
    unsigned char *send_wire; /* (wire_at[size]) reduce-scatter: every block but this rank's;
                                 all-gather: this rank's */
    unsigned char *recv_wire; /* reduce-scatter: (size x this rank's wire) rank r's contribution
                                 at r x wire; all-gather: (wire_at[size]) block r at wire_at[r] */
    float *own;               /* (this rank's block) its own contribution, kept for the sum */
    loom_comm_request **sends, **recvs; /* (size) in flight to / from rank r; NULL when none */
    int op;                             /* the running call's loom_qreduce_op, IDLE when none */
    float *buf;                         /* the running call's buffer */
    int summed;                         /* reduce-scatter: ranks 0 .. summed-1 added so far */
    loom_status error;                  /* the running call's first failure */
};

static int64_t block_count(const loom_qreduce *q, int r) {
    return q->bounds[r + 1] - q->bounds[r];
}

static int64_t wire_bytes(const loom_qreduce *q, int r) {
    return q->wire_at[r + 1] - q->wire_at[r];
}

static void encode(const loom_qreduce *q, int r, const float *m, float *residual, void *wire) {
    if (q->method == LOOM_COMPRESS_INT8) {
        loom_compress_int8_encode(q->coder[r], m, residual, wire);
    } else {
        loom_compress_bf16_encode(q->coder[r], m, residual, wire);
    }
}

static void decode(const loom_qreduce *q, int r, const void *wire, float *out, int add) {
    if (q->method == LOOM_COMPRESS_INT8) {
        loom_compress_int8_decode(q->coder[r], wire, out, add);
    } else {
        loom_compress_bf16_decode(q->coder[r], wire, out, add);
    }
}

/* ---- plans --------------------------------------------------------------------------------- */

static loom_status check_layout(const loom_comm *comm, const int64_t *bounds,
                                loom_compress_method method, int block, int tag) {
    const char *group = loom_comm_name(comm);
    if (method != LOOM_COMPRESS_INT8 && method != LOOM_COMPRESS_BF16) {
        return loom_fail(LOOM_ERR_INPUT,
                         "quantised reduce-scatter on group '%s': method: expected int8 or bf16, "
                         "got %s",
                         group, loom_compress_method_name(method));
    }
    if (block < 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "quantised reduce-scatter on group '%s': block: expected >= 0 (0: 256), "
                         "got %d",
                         group, block);
    }
    if (tag < 0 || tag > LOOM_COMM_MAX_TAG) {
        return loom_fail(LOOM_ERR_INPUT,
                         "quantised reduce-scatter on group '%s': tag %d is not in [0, %d]", group,
                         tag, LOOM_COMM_MAX_TAG);
    }
    for (int r = 0; r < loom_comm_size(comm); r++) {
        if (bounds[0] != 0 || bounds[r + 1] < bounds[r] || bounds[r + 1] - bounds[r] > INT32_MAX) {
            return loom_fail(LOOM_ERR_INPUT,
                             "quantised reduce-scatter on group '%s': block bounds must rise from "
                             "0 up, by at most 2^31-1, got [%lld, %lld) for block %d",
                             group, (long long)bounds[r], (long long)bounds[r + 1], r);
        }
    }
    return LOOM_OK;
}

/* Block r's format, and the wire offsets they give. */
static loom_status make_coders(loom_qreduce *q, int block) {
    loom_compress_opts opts = {.method = q->method, .block = block};
    q->wire_at[0] = 0;
    for (int r = 0; r < q->size; r++) {
        int64_t bytes = 0;
        if (block_count(q, r) > 0) {
            loom_status st = loom_compressor_create(&q->coder[r], &opts, 1, block_count(q, r), 0);
            if (st != LOOM_OK) return st;
            bytes = (int64_t)loom_compressor_wire_bytes(q->coder[r]);
        }
        q->wire_at[r + 1] = q->wire_at[r] + bytes;
    }
    return LOOM_OK;
}

static size_t recv_wire_bytes(const loom_qreduce *q) {
    int64_t gather = q->wire_at[q->size], scatter = q->size * wire_bytes(q, q->rank);
    return (size_t)(gather > scatter ? gather : scatter);
}

loom_status loom_qreduce_create(loom_comm *comm, const int64_t *bounds, loom_compress_method method,
                                int block, int tag, loom_qreduce **out) {
    *out = NULL;
    loom_status st = check_layout(comm, bounds, method, block, tag);
    if (st != LOOM_OK) return st;
    loom_qreduce *q = loom_calloc(1, sizeof *q, "quantised reduce-scatter");
    if (!q) return LOOM_ERR_NOMEM;
    q->comm = comm;
    q->size = loom_comm_size(comm), q->rank = loom_comm_rank(comm), q->tag = tag;
    q->method = method;
    q->op = IDLE;
    const size_t n = (size_t)q->size;
    q->bounds = loom_malloc((n + 1) * sizeof *q->bounds, "quantised reduce-scatter bounds");
    q->wire_at = loom_malloc((n + 1) * sizeof *q->wire_at, "quantised reduce-scatter wires");
    q->coder = loom_calloc(n, sizeof *q->coder, "quantised reduce-scatter formats");
    q->sends = loom_calloc(n, sizeof *q->sends, "quantised reduce-scatter requests");
    q->recvs = loom_calloc(n, sizeof *q->recvs, "quantised reduce-scatter requests");
    if (!q->bounds || !q->wire_at || !q->coder || !q->sends || !q->recvs) {
        loom_qreduce_free(q);
        return LOOM_ERR_NOMEM;
    }
    memcpy(q->bounds, bounds, (n + 1) * sizeof *bounds);
    st = make_coders(q, block);
    if (st == LOOM_OK) {
        /* +1: a plan of empty blocks still gets buffers, so NULL means only a failed malloc */
        q->send_wire = loom_alloc_aligned((size_t)q->wire_at[n] + 1, "quantised send wires");
        q->recv_wire = loom_alloc_aligned(recv_wire_bytes(q) + 1, "quantised receive wires");
        q->own = loom_alloc_aligned(((size_t)block_count(q, q->rank) + 1) * sizeof(float),
                                    "quantised reduce-scatter own block");
        if (!q->send_wire || !q->recv_wire || !q->own) st = LOOM_ERR_NOMEM;
    }
    if (st != LOOM_OK) {
        loom_qreduce_free(q);
        return st;
    }
    *out = q;
    return LOOM_OK;
}

void loom_qreduce_free(loom_qreduce *q) {
    if (!q) return;
    for (int r = 0; q->coder && r < q->size; r++) loom_compressor_free(q->coder[r]);
    free(q->coder);
    free(q->bounds);
    free(q->wire_at);
    free(q->sends);
    free(q->recvs);
    loom_free_aligned(q->send_wire);
    loom_free_aligned(q->recv_wire);
    loom_free_aligned(q->own);
    free(q);
}

int64_t loom_qreduce_bytes_sent(const loom_qreduce *q, loom_qreduce_op op, int rank) {
    if (rank < 0 || rank >= q->size || q->size == 1) return 0;
    if (op == LOOM_QREDUCE_ALLGATHER) return (q->size - 1) * wire_bytes(q, rank);
    return q->wire_at[q->size] - wire_bytes(q, rank);
}

size_t loom_qreduce_scratch_bytes(const loom_qreduce *q) {
    return (size_t)q->wire_at[q->size] + recv_wire_bytes(q) +
           (size_t)block_count(q, q->rank) * sizeof(float);
}

/* ---- starting a call ----------------------------------------------------------------------- */

static void keep_error(loom_qreduce *q, loom_status status) {
    if (status != LOOM_OK && q->error == LOOM_OK) q->error = status;
}

static loom_status take_error(loom_qreduce *q) {
    loom_status status = q->error;
    q->error = LOOM_OK;
    return status;
}

static loom_status begin(loom_qreduce *q, loom_qreduce_op op, float *buf, const char *what) {
    if (q->op != IDLE) {
        return loom_fail(LOOM_ERR_RUNTIME, "%s on group '%s' (tag %d): started again while running",
                         what, loom_comm_name(q->comm), q->tag);
    }
    if (!buf && q->bounds[q->size] > 0) {
        return loom_fail(LOOM_ERR_RUNTIME, "%s on group '%s': no buffer for %lld entries", what,
                         loom_comm_name(q->comm), (long long)q->bounds[q->size]);
    }
    q->op = op;
    q->buf = buf;
    q->summed = 0;
    q->error = LOOM_OK;
    return LOOM_OK;
}

/* After a transfer failed to start: the call is abandoned with the transfers already posted,
 * which cannot be taken back (after an MPI error the communicator is unusable anyway:
 * loom/comm.h). */
static loom_status abandon(loom_qreduce *q) {
    q->op = IDLE;
    q->buf = NULL;
    memset(q->sends, 0, (size_t)q->size * sizeof *q->sends);
    memset(q->recvs, 0, (size_t)q->size * sizeof *q->recvs);
    return take_error(q);
}

/* Posts a receive from and a send to every other rank that has bytes for the other (receives
 * first, so that no message waits unexpected; sends to rank + 1, rank + 2, ... so that the ranks
 * do not all send to one at once). recv_at/send_at: offsets into the wire buffers, -1 none. */
static void post(loom_qreduce *q, int64_t (*recv_at)(const loom_qreduce *, int, int64_t *),
                 int64_t (*send_at)(const loom_qreduce *, int, int64_t *)) {
    for (int k = 1; k < q->size && q->error == LOOM_OK; k++) {
        int peer = (q->rank - k + q->size) % q->size;
        int64_t bytes, at = recv_at(q, peer, &bytes);
        if (bytes == 0) continue;
        keep_error(
            q, loom_comm_irecv(q->comm, q->recv_wire + at, bytes, peer, q->tag, &q->recvs[peer]));
    }
    for (int k = 1; k < q->size && q->error == LOOM_OK; k++) {
        int peer = (q->rank + k) % q->size;
        int64_t bytes, at = send_at(q, peer, &bytes);
        if (bytes == 0) continue;
        keep_error(
            q, loom_comm_isend(q->comm, q->send_wire + at, bytes, peer, q->tag, &q->sends[peer]));
    }
}

/* Reduce-scatter: rank `peer`'s contribution to this rank's block, and this rank's wire of
 * block `peer`. */
static int64_t scatter_recv_at(const loom_qreduce *q, int peer, int64_t *bytes) {
    *bytes = wire_bytes(q, q->rank);
    return peer * *bytes;
}
static int64_t scatter_send_at(const loom_qreduce *q, int peer, int64_t *bytes) {
    *bytes = wire_bytes(q, peer);
    return q->wire_at[peer];
}

/* All-gather: block `peer` from its owner, and this rank's block to every peer. */
static int64_t gather_recv_at(const loom_qreduce *q, int peer, int64_t *bytes) {
    *bytes = wire_bytes(q, peer);
    return q->wire_at[peer];
}
static int64_t gather_send_at(const loom_qreduce *q, int peer, int64_t *bytes) {
    *bytes = wire_bytes(q, q->rank);
    return q->wire_at[q->rank];
}

loom_status loom_qreduce_reduce_scatter_start(loom_qreduce *q, float *buf, float *residual) {
    loom_status st = begin(q, LOOM_QREDUCE_REDUCE_SCATTER, buf, "quantised reduce-scatter");
    if (st != LOOM_OK) return st;
    for (int r = 0; r < q->size; r++) {
        if (r == q->rank || block_count(q, r) == 0) continue;
        float *x = buf + q->bounds[r], *e = residual ? residual + q->bounds[r] : NULL;
        if (e) { /* M = x + E, formed in E, which the encoder turns into M - sent */
            for (int64_t i = 0; i < block_count(q, r); i++) e[i] += x[i];
        }
        encode(q, r, e ? e : x, e, q->send_wire + q->wire_at[r]);
    }
    memcpy(q->own, buf + q->bounds[q->rank], (size_t)block_count(q, q->rank) * sizeof(float));
    post(q, scatter_recv_at, scatter_send_at);
    return q->error == LOOM_OK ? LOOM_OK : abandon(q);
}

loom_status loom_qreduce_allgather_start(loom_qreduce *q, float *buf) {
    loom_status st = begin(q, LOOM_QREDUCE_ALLGATHER, buf, "quantised all-gather");
    if (st != LOOM_OK) return st;
    if (block_count(q, q->rank) > 0) {
        float *x = buf + q->bounds[q->rank];
        unsigned char *wire = q->send_wire + q->wire_at[q->rank];
        encode(q, q->rank, x, NULL, wire);
        decode(q, q->rank, wire, x, 0); /* the owner keeps what everyone else decodes */
    }
    post(q, gather_recv_at, gather_send_at);
    return q->error == LOOM_OK ? LOOM_OK : abandon(q);
}

/* ---- finishing a call ---------------------------------------------------------------------- */

/* Completes (wait) or checks one transfer; 1 when it is over (or there was none). */
enum { TEST, WAIT, POLL }; /* how a transfer is settled: loom_comm_test, _wait, _poll */

static int settle(loom_qreduce *q, loom_comm_request **request, int how) {
    if (!*request) return 1;
    int done = 0, wait = how == WAIT;
    loom_status status = wait          ? loom_comm_wait(*request)
                         : how == POLL ? loom_comm_poll(*request, &done)
                                       : loom_comm_test(*request, &done);
    if (wait || done || status != LOOM_OK) *request = NULL;
    keep_error(q, status);
    return *request == NULL;
}

/* Adds the contributions of ranks summed, summed + 1, ... that have arrived, in rank order:
 * rank 0's is written, the others added, this rank's own taken unquantised. */
static void sum_in_order(loom_qreduce *q) {
    const int64_t count = block_count(q, q->rank);
    float *sum = q->buf + q->bounds[q->rank];
    for (; q->summed < q->size && !q->recvs[q->summed]; q->summed++) {
        int r = q->summed;
        if (count == 0) continue;
        if (r != q->rank) {
            decode(q, q->rank, q->recv_wire + r * wire_bytes(q, q->rank), sum, r > 0);
        } else if (r == 0) {
            memcpy(sum, q->own, (size_t)count * sizeof(float));
        } else {
            for (int64_t i = 0; i < count; i++) sum[i] += q->own[i];
        }
    }
}

/* Moves the running call on as far as it goes without waiting (how TEST or POLL) or to its end
 * (WAIT); 1 when it is over. After a failure the remaining transfers are still settled, but
 * nothing more is decoded: the communicator is unusable after an MPI error anyway
 * (loom/comm.h). */
static int advance(loom_qreduce *q, int how) {
    int pending = 0;
    for (int r = 0; r < q->size; r++) {
        int arriving = q->recvs[r] != NULL;
        int arrived = settle(q, &q->recvs[r], how);
        if (arriving && arrived && q->error == LOOM_OK && q->op == LOOM_QREDUCE_ALLGATHER) {
            decode(q, r, q->recv_wire + q->wire_at[r], q->buf + q->bounds[r], 0);
        }
        pending += !arrived;
        pending += !settle(q, &q->sends[r], how);
    }
    if (q->op == LOOM_QREDUCE_REDUCE_SCATTER && q->error == LOOM_OK) sum_in_order(q);
    if (pending) return 0;
    q->op = IDLE;
    q->buf = NULL;
    return 1;
}

loom_status loom_qreduce_test(loom_qreduce *q, int *done) {
    *done = q->op == IDLE || advance(q, TEST);
    return *done ? take_error(q) : LOOM_OK;
}

loom_status loom_qreduce_poll(loom_qreduce *q, int *done) {
    *done = q->op == IDLE || advance(q, POLL);
    return *done ? take_error(q) : LOOM_OK;
}

loom_status loom_qreduce_wait(loom_qreduce *q) {
    if (q->op != IDLE) advance(q, WAIT);
    return take_error(q);
}
