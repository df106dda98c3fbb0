/*
 * loom/comm.h — the only door to MPI. Communicators (world and the TP/DP/PP groups split from
 * it), blocking and non-blocking collectives and point-to-point transfers on float buffers,
 * loom's ring reduce-scatter, per-communicator counters of bytes and seconds, and the failure
 * rules: every wait has a deadline, a watchdog ends the whole job when this process stops
 * making progress, and a wait names a peer that stops answering altogether, so a dead, hung or
 * stopped rank never leaves the others waiting forever.
 *
 * Not here: what is communicated or when (parallel/, model/), or anything about models.
 */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include "loom/base.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_comm loom_comm;
typedef struct loom_comm_request loom_comm_request;

/* Threads: call everything here from the thread that called loom_comm_init, except
 * loom_comm_progress, which any thread may call. (MPI itself runs at MPI_THREAD_MULTIPLE, for
 * the thread that answers liveness pings; see loom_comm_set_timeout.) Errors: functions that
 * return loom_status fail with LOOM_ERR_RUNTIME (LOOM_ERR_NOMEM for allocations) and a message
 * naming the operation and the group. Misuse (a negative count, a rank outside the group) is
 * caught before anything is sent, identically on every rank; an error from MPI itself leaves
 * the communicator unusable, and the caller should end the job (loom_comm_abort). */

/* Starts MPI (or notes that it is already started) and returns the world communicator
 * (named "world"). Safe to call in a process started without mpirun (a world of 1). In a world
 * of more than one, starts the watchdog (see loom_comm_set_timeout); a world of one has none,
 * since there is no peer to keep waiting. */
loom_status loom_comm_init(int *argc, char ***argv, loom_comm **world);
/* Meets the other ranks in a barrier (with the usual deadline), frees the world communicator,
 * finalizes MPI when loom_comm_init started it, and stops the watchdog. Free the groups split
 * from the world first. */
void loom_comm_finalize(loom_comm *world);
/* Ends every process of the job now (MPI_Abort on the world), after printing
 * "[rank R] error: MESSAGE" (if `message` is not NULL) on stderr. Without MPI running (before
 * init, after finalize), exit(exit_code). Never returns. */
void loom_comm_abort(int exit_code, const char *message) __attribute__((noreturn));

int loom_comm_rank(const loom_comm *comm);
int loom_comm_size(const loom_comm *comm);
const char *loom_comm_name(const loom_comm *comm);
/* This process's rank in the world (0 before init). */
int loom_comm_world_rank(void);
/* The world rank of member `rank` of comm (-1 when out of range). */
int loom_comm_world_rank_of(const loom_comm *comm, int rank);
/* The name of the host this process runs on (MPI_Get_processor_name; the host name before MPI
 * starts or after it ends), at most cap - 1 characters, NUL-terminated. Ranks whose names are
 * equal share a machine. LOOM_ERR_RUNTIME when no name can be had. */
loom_status loom_comm_host_name(char *name, size_t cap);
/* *ranks: how many of comm's ranks run on this process's machine and share its memory
 * (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED: any MPI, any launcher, mpirun or srun).
 * Collective over comm, with the usual deadline; 1 for a NULL comm (no MPI). */
loom_status loom_comm_local_size(loom_comm *comm, int *ranks);

/* MPI_Comm_split: ranks with the same colour form a group, ordered by key (ties by rank in
 * parent). A rank with colour < 0 joins no group and gets *out = NULL. Collective over parent,
 * with the usual deadline; `name` (truncated to 63 characters) is used in messages. */
loom_status loom_comm_split(loom_comm *parent, int color, int key, const char *name,
                            loom_comm **out);
void loom_comm_free(loom_comm *comm);

/* Deadline (seconds) for every wait, and for the watchdog. Default 60; <= 0 disables both.
 * May be called before loom_comm_init; every rank should use the same value.
 *
 * Wait deadline: a blocking call (or loom_comm_wait) that has waited 1.5 x this long for its
 * peers (later than the two rules below, which name the rank at fault) prints "[rank R] error:
 * timed out after N s waiting in OP on group 'G' (ranks ...) during 'NOTE'; ..." and aborts the
 * job. A loop of loom_comm_test is a wait too: past 1.5 x this long after the operation
 * started, the test aborts the same way.
 *
 * Stopped peer: a rank stopped by a signal (SIGSTOP) or frozen runs neither its code nor its
 * watchdog. A wait that has lasted a quarter of the timeout pings the members it waits for,
 * which answer from a thread whatever their main thread is doing; one that has not answered
 * for half the timeout is named: "[rank R] error: rank N stopped responding (no answer to
 * liveness pings for X s while waiting in OP on group 'G' (ranks ...) during 'NOTE') —
 * aborting the job", and the job ends. (Not when MPI lacks MPI_THREAD_MULTIPLE: then only the
 * wait deadline ends such a job, at 1.5 x the timeout.)
 *
 * Watchdog: when this process has gone this long without any comm call or loom_comm_progress,
 * while not inside a wait, a thread prints "[rank R] error: no progress for N s during 'NOTE'
 * — this rank hangs; ..." and ends the process; mpirun then ends the job. So any stretch of
 * work without communication longer than the timeout (a long evaluation, writing a big
 * checkpoint, a slow first step) must call loom_comm_progress now and then, and work that one
 * rank does while the others wait for it (rank 0 saving a checkpoint while the rest sit in a
 * barrier) must take less than the timeout. */
void loom_comm_set_timeout(double seconds);
double loom_comm_get_timeout(void);
/* Records that this process is alive and what it is doing ("step 12: backward"); the
 * watchdog and timeout messages name it (the first 255 characters). Cheap (a clock read and a
 * short copy under an uncontended lock): call it often. NULL only records that the process is
 * alive. Thread-safe. */
void loom_comm_progress(const char *what);

typedef enum { LOOM_REDUCE_SUM, LOOM_REDUCE_MAX } loom_reduce_op;

/* Blocking collectives (all ranks of comm call them in the same order, with the same count).
 * Counts are elements and may exceed INT_MAX (split into several MPI calls). In a group of one
 * they are local: nothing, or a copy. */
loom_status loom_comm_allreduce_f32(loom_comm *comm, float *buf, int64_t count, loom_reduce_op op);
loom_status loom_comm_allreduce_f64(loom_comm *comm, double *buf, int64_t count, loom_reduce_op op);
/* recv (size*count) = concatenation of every rank's send (count), in rank order. In place
 * when send is this rank's block of recv (recv + rank*count); otherwise no overlap. */
loom_status loom_comm_allgather_f32(loom_comm *comm, const float *send, float *recv, int64_t count);
/* Sums block r = buf[r*count, (r+1)*count) of every rank's buf (size*count) into this rank's
 * block, in place (the other blocks are left holding partial sums): a blocking run of loom's
 * ring reduce-scatter below over equal blocks ((n-1)/n of the buffer sent, one call counted). */
loom_status loom_comm_reduce_scatter_f32(loom_comm *comm, float *buf, int64_t count);
/* buf (bytes) on every rank = buf on `root`. */
loom_status loom_comm_broadcast(loom_comm *comm, void *buf, int64_t bytes, int root);
loom_status loom_comm_barrier(loom_comm *comm);

/* Point-to-point, blocking: the sender's and the receiver's byte counts must be equal (the
 * transfer may be split in chunks). `peer` is a rank of comm; tags are 0..LOOM_COMM_MAX_TAG.
 * Messages between two ranks with one tag arrive in the order they were sent. */
#define LOOM_COMM_MAX_TAG 32767
loom_status loom_comm_send(loom_comm *comm, const void *buf, int64_t bytes, int peer, int tag);
loom_status loom_comm_recv(loom_comm *comm, void *buf, int64_t bytes, int peer, int tag);

/* Non-blocking: start, then loom_comm_wait (which frees the request). Buffers must stay
 * untouched until then. Several operations may be in flight on one communicator; collectives
 * must still be started in the same order on every rank. Open MPI moves non-blocking
 * collectives forward only inside MPI calls: to overlap an iallreduce with compute, call
 * loom_comm_test on it now and then (between layers, say). */
loom_status loom_comm_iallreduce_f32(loom_comm *comm, float *buf, int64_t count,
                                     loom_comm_request **request);
/* Non-blocking allgather: as loom_comm_allgather_f32 (in place allowed likewise). */
loom_status loom_comm_iallgather_f32(loom_comm *comm, const float *send, float *recv, int64_t count,
                                     loom_comm_request **request);
/* All-gather of uneven blocks, in place: block r of buf is buf[bounds[r] .. bounds[r+1]) (size
 * + 1 non-decreasing offsets, blocks and offsets below 2^31 elements), this rank's already in
 * place; every rank ends with every block. Counts this rank's block times (size - 1) bytes sent. */
loom_status loom_comm_iallgatherv_f32(loom_comm *comm, float *buf, const int64_t *bounds,
                                      loom_comm_request **request);
loom_status loom_comm_isend(loom_comm *comm, const void *buf, int64_t bytes, int peer, int tag,
                            loom_comm_request **request);
loom_status loom_comm_irecv(loom_comm *comm, void *buf, int64_t bytes, int peer, int tag,
                            loom_comm_request **request);
/* Waits up to the timeout; past it, ends the job with a message naming this rank, the
 * operation, the group and its ranks, and the last progress note. */
loom_status loom_comm_wait(loom_comm_request *request);
/* Non-blocking check: *done = 1 (and the request freed) when complete. On an error the
 * request is freed too. Past the timeout since the operation started, aborts like a wait. */
loom_status loom_comm_test(loom_comm_request *request, int *done);
/* loom_comm_test without the deadline: moves a transfer that runs in the background for a set
 * number of steps (islands' overlapped outer syncs) on, however long ago it started; the wait
 * that finally ends it keeps the deadline (from its own start) and the liveness check. */
loom_status loom_comm_poll(loom_comm_request *request, int *done);

/* The reduce-scatter: loom's ring, the one that training (ZeRO-1's gradient buckets,
 * parallel/grad_sync.c) and `loom profile` (the reduce_scatter fits) both run. A buffer is cut
 * into one block per rank, of any sizes (empty ones too); in n-1 steps every rank sends one
 * block of partial sums to the next rank and adds the block arriving from the previous one
 * into its own copy, in place, so that after the last step this rank's block holds the sum of
 * every rank's (the other blocks then hold partial sums). Each rank sends all blocks but its
 * own: the bandwidth-optimal (n-1)/n of the buffer when the blocks are equal.
 *
 * Why not MPI's: Open MPI 4.1's reduce-scatter (blocking and non-blocking alike) runs at about
 * 0.1 GB/s here from 1 MiB up, 30-50x slower than its allreduce.
 *
 * A ring is made once for a buffer layout (its receive scratch allocated then) and run as often
 * as wanted, non-blocking so that it can overlap compute: loom_comm_ring_start, then
 * loom_comm_ring_test at polling points, then loom_comm_ring_wait. Open MPI moves the messages
 * only inside MPI calls, and each step's end (the sum, the next step's messages) happens only
 * inside a test or the wait: a ring left alone does not progress. Several rings may be in flight
 * on one communicator, started in any order; but a wait moves only its own ring, and a ring
 * moves on a peer only when that peer tests or waits it, so every rank waits for its rings in
 * the same order. Their messages go over a private duplicate of the communicator, so they never
 * match the user's sends and receives. */
typedef struct loom_comm_ring loom_comm_ring;
/* bounds (size + 1 offsets in elements, non-decreasing, from 0 up): block r of a buffer is
 * buf[bounds[r] .. bounds[r+1]). Every rank gives a ring the same bounds and tag; rings in
 * flight together on one communicator need different tags (0..LOOM_COMM_MAX_TAG). Local: no
 * communication. */
loom_status loom_comm_ring_create(loom_comm *comm, const int64_t *bounds, int tag,
                                  loom_comm_ring **ring);
/* The same without scratch of its own: each run borrows the caller's (loom_comm_ring_start_in),
 * so that many rings made at once hold no memory while idle (ZeRO-2/3's one ring per unit). */
loom_status loom_comm_ring_create_borrowing(loom_comm *comm, const int64_t *bounds, int tag,
                                            loom_comm_ring **ring);
/* Frees a ring that is not running (NULL: nothing). */
void loom_comm_ring_free(loom_comm_ring *ring);
/* Starts the reduce-scatter of buf (at least bounds[size] elements), which must stay untouched
 * until the ring completes. Counts one operation and the bytes this rank sends (all blocks but
 * its own). In a group of one, complete at once. Fails (without starting) on a ring that is
 * still running. */
loom_status loom_comm_ring_start(loom_comm_ring *ring, float *buf);
/* The same with scratch of at least the largest block's floats, untouched until the ring
 * completes (the only way to start a borrowing ring). */
loom_status loom_comm_ring_start_in(loom_comm_ring *ring, float *buf, float *scratch);
/* Moves the running reduce-scatter on as far as it can go without waiting: *done = 1 when it
 * is complete (then, or on a ring not running, the first error of the run is returned). Past
 * the timeout since a step's messages were posted, aborts like a wait. */
loom_status loom_comm_ring_test(loom_comm_ring *ring, int *done);
/* Runs the reduce-scatter to its end (each step's messages waited for as loom_comm_wait
 * does); returns its first error. Nothing to do on a ring not running. */
loom_status loom_comm_ring_wait(loom_comm_ring *ring);

/* Every rank's liveness responder thread (liveness.c) enters MPI every `seconds` (default 0.01;
 * 0: the default; at least 1e-4), and each entry moves every non-blocking transfer of the
 * process on, as Open MPI moves them only inside its calls: transfers overlapped with compute
 * (ZeRO-2/3's gathers and reduce-scatters, which ask for 1 ms) then keep the link busy between
 * the main thread's own polls. Process-wide. */
void loom_comm_set_background_poll(double seconds);
/* Islands (the plan's islands section): world ranks come in islands of ranks_per_island
 * consecutive ranks, and the failure messages name a rank's island beside it ("rank 5 (island
 * 1)"); 0 (the default): no islands. */
void loom_comm_set_island_size(int ranks_per_island);

/* Traffic and waiting per communicator since the last reset: bytes this rank sent (payload,
 * the ring algorithms' volume as nccl-tests count it, whatever algorithm MPI picks: allreduce
 * 2(n-1)/n of the buffer; allgather (n-1)/n of the full (size*count) buffer; the ring
 * reduce-scatter every block but this rank's ((n-1)/n of the buffer for equal blocks);
 * broadcast the bytes on the root and 0 elsewhere; send the bytes; recv 0 — and 0 for
 * collectives in a group of one), seconds spent in blocking calls, loom_comm_wait,
 * loom_comm_test, loom_comm_ring_test and loom_comm_ring_wait, and operations started (blocking
 * or not; a ring's run is one; barriers count, the barriers inside split and finalize do
 * not). */
typedef struct {
    int64_t bytes;
    double seconds;
    int64_t calls;
} loom_comm_stats;
loom_comm_stats loom_comm_get_stats(const loom_comm *comm);
void loom_comm_reset_stats(loom_comm *comm);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_COMM_H */
