/*
 * loom/compress.h — communication compressors behind one interface: PowerSGD and low-rank
 * (Optimus-CC's compressed backpropagation), top-k, sign (1-bit with a scale), block-wise int8
 * and bf16, each with its error-feedback residual and warm-start factor, the list of method
 * names the plan checker asks, and the quantised reduce-scatter and all-gather (int8 or bf16 on
 * the wire, summed in fp32) that ZeRO-2/3 and island training run their compressed gradient sums
 * and parameter gathers through.
 *
 * A compressor never calls MPI (docs/design.md, "How compression and planning fit"). It sees one
 * matrix (rows, cols), row-major fp32; a 1-D tensor is one row. parallel/ asks it to encode the
 * matrix into a wire buffer, moves the buffer, and asks it to decode.
 *
 * Two shapes of protocol:
 *   one-shot   lowrank, topk, sign, int8, bf16: encode -> wire bytes -> decode (decode_add sums
 *              into an fp32 buffer). Methods that cannot be summed on the wire are all-gathered
 *              and summed by the caller in rank order, so every replica gets the same bits.
 *   PowerSGD   (rank r, data-parallel; REFERENCE.md "Compressors"): three calls around two
 *              allreduce-sums of fp32 factors:
 *                powersgd_p      M = G + E (error feedback), P = M Q          -> sum P over ranks
 *                powersgd_q      orthonormalise the summed P (LAPACK QR), Q = M^T P -> sum Q
 *                powersgd_done   G = P Q^T (the sum's approximation), E = M - G / replicas,
 *                                the summed Q warm-starts the next step
 *              A matrix too small to pay (r (rows + cols) >= min_ratio rows cols) or 1-D is sent
 *              uncompressed (loom_compressor_compresses says which).
 *
 * State and steps. Every piece of state (the residual E, the warm-start factor Q) exists twice:
 * the committed copy (as of the last accepted step; what checkpoints save) and the working copy
 * the current step updates. The first update in a step reads the committed copy; later ones
 * (lazy error propagation over several micro-batches) read the working one. At the end of the
 * step the caller commits (accept: the working copy becomes the committed one) or rolls back
 * (a skipped step, a NaN/Inf gradient: the working copy is dropped), so a bad step never
 * pollutes the state. Neither copies memory.
 *
 * The quantised reduce-scatter is the one place in this module that communicates: it moves its
 * wires with loom_comm's point-to-point calls (never MPI itself), since quantising, exchanging
 * and summing are one algorithm whose order fixes the bits every replica ends with.
 *
 * Not here: where compression applies (the plan, parallel/), moving the bytes (comm/).
 */
#ifndef LOOM_COMPRESS_H
#define LOOM_COMPRESS_H

#include "loom/base.h"
#include "loom/comm.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- method names ------------------------------------------------------------------------- */

typedef enum {
    LOOM_COMPRESS_NONE,
    LOOM_COMPRESS_POWERSGD, /* data-parallel gradients: rank-r factors, allreduced */
    LOOM_COMPRESS_LOWRANK,  /* one sender: rank-r factors P, Q of one matrix (pipeline grads) */
    LOOM_COMPRESS_TOPK,     /* the k largest magnitudes: values + indices */
    LOOM_COMPRESS_SIGN,     /* one bit per entry + one scale; error feedback mandatory */
    LOOM_COMPRESS_INT8,     /* int8 with one fp32 scale per block */
    LOOM_COMPRESS_BF16,     /* bfloat16, round to nearest even */
    LOOM_COMPRESS_COUNT
} loom_compress_method;

/* Where a method may be used: each bit is a place. */
enum {
    LOOM_COMPRESS_FOR_DP = 1,      /* data-parallel gradients: none powersgd topk sign int8 bf16 */
    LOOM_COMPRESS_FOR_PP_GRAD = 2, /* activation gradients between stages: none lowrank topk
                                      int8 bf16 */
    LOOM_COMPRESS_FOR_PP_FORWARD = 4, /* activations between stages: none bf16 int8 */
};

/* "none", "powersgd", ... ("?" out of range). */
const char *loom_compress_method_name(loom_compress_method method);
/* Parses a method allowed in `place` (one LOOM_COMPRESS_FOR_* bit). Anything else is
 * LOOM_ERR_INPUT: "SOURCE: FIELD: expected one of none, powersgd, topk, sign, int8, bf16, got
 * \"x\"". */
loom_status loom_compress_method_parse(const char *name, int place, const char *source,
                                       const char *field, loom_compress_method *method);
/* Whether the method is lossy (everything but none); lossy methods keep an error-feedback
 * residual unless it is turned off. */
int loom_compress_is_lossy(loom_compress_method method);

/* ---- options ---------------------------------------------------------------------------- */

typedef struct {
    loom_compress_method method;
    int rank;           /* powersgd, lowrank: > 0 */
    double fraction;    /* topk: share of entries kept, in (0, 1]; k = max(1, ceil(f n)), f n
                           rounded to 1e-9 relative first (0.07 of 100 keeps 7, not 8) */
    int error_feedback; /* keep the residual and add it to the next encode (sign: must be 1) */
    double min_ratio;   /* powersgd, lowrank: send uncompressed when r (rows + cols) >= min_ratio
                           rows cols; 0 means the default 0.5. A min_ratio above 1 can let r
                           exceed min(rows, cols): the rank used is then min(rows, cols) */
    int block;          /* int8: entries per scale; 0 means the default 256 */
    uint64_t seed;      /* powersgd, lowrank: the initial Q (same seed on every replica) */
} loom_compress_opts;

/* Checks the options for a method (rank > 0 where needed, fraction in (0, 1], sign without
 * error feedback refused by name: "sign compression needs error feedback (it does not converge
 * without it); drop --no-error-feedback"). Messages start with `source`. */
loom_status loom_compress_check(const loom_compress_opts *opts, const char *source);

/* ---- one matrix's compressor ------------------------------------------------------------- */

typedef struct loom_compressor loom_compressor;

/* A compressor for one (rows x cols) matrix (rows, cols >= 1). `stream` separates matrices
 * under one seed (the initial Q of matrix i is drawn from (seed, stream)). */
loom_status loom_compressor_create(loom_compressor **c, const loom_compress_opts *opts,
                                   int64_t rows, int64_t cols, uint64_t stream);
void loom_compressor_free(loom_compressor *c);
const loom_compress_opts *loom_compressor_opts(const loom_compressor *c);
int64_t loom_compressor_rows(const loom_compressor *c);
int64_t loom_compressor_cols(const loom_compressor *c);
/* 0 when this matrix is sent as it is (powersgd/lowrank: too small to pay, or one row; none);
 * then encode is a copy of the fp32 values and there is no state. */
int loom_compressor_compresses(const loom_compressor *c);
/* powersgd, lowrank, compressing: the rank used, min(rank, rows, cols) — the r of P (rows x r)
 * and Q (cols x r) below; 0 otherwise. */
int loom_compressor_rank(const loom_compressor *c);

/* Exact wire size of one encoded matrix, in bytes (one-shot methods; for powersgd, the bytes of
 * P and Q together, each summed once). Formulas, n = rows cols, r = loom_compressor_rank:
 *   not compressing  4 n                    lowrank, powersgd  4 r (rows + cols)
 *   topk             8 k (fp32 value, uint32 index)
 *   sign             4 + ceil(n / 8)        int8     4 ceil(n / block) + n
 *   bf16             2 n */
size_t loom_compressor_wire_bytes(const loom_compressor *c);

/* One-shot encode: x (rows x cols) plus the residual (with error feedback) is encoded into wire
 * (wire_bytes); the working residual becomes (x + E) - decode(wire). x is not changed. */
void loom_compressor_encode(loom_compressor *c, const float *x, void *wire);
/* For a send that goes uncompressed from a compressor with a residual (lazy error propagation
 * when the policy skips a send): out = x + E, and the working residual becomes 0. out may be x.
 * Without a residual, out = x. */
void loom_compressor_flush(loom_compressor *c, const float *x, float *out);
/* out (rows x cols) += decode(wire). Needs no state: any replica's wire of the same shape and
 * options decodes with any replica's compressor. */
void loom_compressor_decode_add(const loom_compressor *c, const void *wire, float *out);
/* out = decode(wire). */
void loom_compressor_decode(const loom_compressor *c, const void *wire, float *out);

/* PowerSGD (method powersgd, compressing). Sizes: P is rows x r, Q is cols x r, row-major.
 * m: the gradient (rows x cols), updated in place: after powersgd_p it holds M = G + E; after
 * powersgd_done it holds the approximation of the replicas' sum. */
void loom_powersgd_p(loom_compressor *c, float *m, float *p);
/* p: the P summed over the replicas; orthonormalised in place (LAPACK sgeqrf/sorgqr; a zero or
 * rank-deficient P gives orthonormal columns all the same, never NaN); q = M^T p. */
void loom_powersgd_q(loom_compressor *c, const float *m, float *p, float *q);
/* p: the orthonormal P; q: Q summed over the replicas. m = p q^T; working residual = M -
 * m / replicas; the working Q = q. */
void loom_powersgd_done(loom_compressor *c, float *m, const float *p, const float *q, int replicas);

/* Squared norm of the working residual as of the last encode / powersgd_done (0 without error
 * feedback), for the compression-error metric. */
double loom_compressor_residual_sq(const loom_compressor *c);

/* End of step: accept (1) makes the working state the committed one; 0 drops it. */
void loom_compressor_commit(loom_compressor *c, int accept);

/* ---- state for checkpoints ---------------------------------------------------------------
 * The committed state as a list of named fp32 arrays ("residual" rows x cols, "q" cols x r);
 * what is listed depends on method and options only. */
int loom_compressor_state_count(const loom_compressor *c);
/* Entry i: its name, length in floats, and the committed array (read/write, so that a loader
 * can fill it; loading then needs no commit). An accepted commit swaps the two copies, so the
 * address is good until the next commit only. */
const char *loom_compressor_state_name(const loom_compressor *c, int i);
size_t loom_compressor_state_floats(const loom_compressor *c, int i);
float *loom_compressor_state_data(loom_compressor *c, int i);
/* Bytes of state this compressor holds (both copies). */
size_t loom_compressor_state_bytes(const loom_compressor *c);

/* ---- quantised reduce-scatter and all-gather (qreduce.c) ---------------------------------
 * A buffer of fp32 is cut into one block per rank of a communicator (bounds as
 * loom_comm_ring_create's: size + 1 offsets, non-decreasing from 0; uneven and empty blocks
 * allowed); block r belongs to rank r.
 *
 *   reduce-scatter  every rank quantises each block but its own (int8 with one scale per `block`
 *                   entries, or bf16: the compressors' one-shot formats) and sends block r to
 *                   rank r directly; rank r decodes the n - 1 wires and sums all n
 *                   contributions in fp32 in rank order 0 .. n-1, its own unquantised, into its
 *                   block of the buffer. The other blocks of the buffer are left as they were.
 *                   With a residual (error feedback), what quantisation dropped from each block a
 *                   rank sent is kept there and added to that block next time.
 *   all-gather      every owner quantises its block once and sends the same wire to every
 *                   rank; every rank, the owner too, overwrites each block with its decoded
 *                   wire, so all ranks end with the same bits.
 *
 * Run reduce-scatter then all-gather on one plan for a quantised allreduce (the owner's sum
 * requantised once). Non-blocking like loom_comm_ring: a call's messages are all posted by its
 * start; loom_qreduce_test (at polling points) and loom_qreduce_wait finish it, decoding and
 * summing what has arrived. Since everything is posted at start, plans in flight together may be
 * tested and waited in any order. One call at a time per plan; every rank starts the plans'
 * calls in the same order. The messages use `tag` on the communicator: give plans in flight
 * together different tags, and keep other point-to-point traffic on that communicator off it. */
typedef struct loom_qreduce loom_qreduce;

typedef enum { LOOM_QREDUCE_REDUCE_SCATTER, LOOM_QREDUCE_ALLGATHER } loom_qreduce_op;

/* A plan for buffers of this layout (copied), method LOOM_COMPRESS_INT8 (block: entries per
 * scale, 0 for 256) or LOOM_COMPRESS_BF16 (block unused); anything else is refused by name. A
 * block of the buffer holds at most 2^31 - 1 entries. Local: no communication. Wire buffers are
 * allocated here (loom_qreduce_scratch_bytes). */
loom_status loom_qreduce_create(loom_comm *comm, const int64_t *bounds, loom_compress_method method,
                                int block, int tag, loom_qreduce **plan);
/* Frees a plan that is not running (NULL: nothing). */
void loom_qreduce_free(loom_qreduce *plan);
/* Starts the reduce-scatter of buf (bounds[size] entries, untouched until the call completes).
 * residual: NULL, or the caller's error-feedback state for the same layout (bounds[size]
 * entries, zero at first): the blocks this rank sends are quantised as buf + residual, and the
 * residual becomes (buf + residual) - decoded, as soon as this returns; this rank's own block
 * of it is neither read nor written. A skipped step rolls back by restoring a copy. Every
 * start, in a group of one too, is finished by loom_qreduce_test or loom_qreduce_wait. */
loom_status loom_qreduce_reduce_scatter_start(loom_qreduce *plan, float *buf, float *residual);
/* Starts the all-gather of buf (bounds[size] entries): this rank's block is sent, every block
 * is overwritten with its decoded wire (this rank's own at once). */
loom_status loom_qreduce_allgather_start(loom_qreduce *plan, float *buf);
/* Moves the running call on without waiting: *done = 1 when it is complete (then, or on a plan
 * not running, the first error of the call is returned). Past the communicator's timeout,
 * aborts like loom_comm_test. */
loom_status loom_qreduce_test(loom_qreduce *plan, int *done);
/* The same without the deadline (loom_comm_poll): for a call that runs in the background for a
 * set number of steps. */
loom_status loom_qreduce_poll(loom_qreduce *plan, int *done);
/* Runs the call to its end; returns its first error. Nothing to do on a plan not running. */
loom_status loom_qreduce_wait(loom_qreduce *plan);
/* Payload bytes `rank` sends in one call of `op`, counted on the communicator as loom_comm_isend
 * counts them. Writing wire(c) for one block of c entries (int8: c + 4 ceil(c / block), bf16:
 * 2 c): reduce-scatter sum over blocks r != rank of wire(count r); all-gather (size - 1)
 * wire(count rank). Over all ranks both are (size - 1) x the whole buffer's wire: about 1/4
 * (int8) or 1/2 (bf16) of the fp32 ring's. */
int64_t loom_qreduce_bytes_sent(const loom_qreduce *plan, loom_qreduce_op op, int rank);
/* Bytes of wire buffers and scratch the plan holds (memory reports: compressor state). */
size_t loom_qreduce_scratch_bytes(const loom_qreduce *plan);

/* ---- throughput ------------------------------------------------------------------------ */

/* Seconds of one encode + decode of a (rows x cols) matrix of random values on one replica (for
 * powersgd its three calls), the median of `reps` after one warm-up, and *ratio = input bytes /
 * wire bytes. For `loom bench --compressors` and `loom profile`. */
loom_status loom_compress_measure(const loom_compress_opts *opts, int64_t rows, int64_t cols,
                                  int reps, double *seconds, double *ratio);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_COMPRESS_H */
