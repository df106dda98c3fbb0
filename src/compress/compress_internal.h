/*
 * compress_internal.h — the compressor's fields, shared by compress.c (names, options, lifetime,
 * state, the one-shot methods' dispatch), quantize.c (topk, sign, int8, bf16) and powersgd.c
 * (the low-rank methods).
 *
 * Not here: anything a caller outside src/compress/ may see (include/loom/compress.h).
 */
#ifndef LOOM_COMPRESS_INTERNAL_H
#define LOOM_COMPRESS_INTERNAL_H

#include "loom/compress.h"

/* One piece of state twice: the copy as of the last accepted step and the copy this step
 * writes. Accepting swaps the pointers; nothing is copied. */
typedef struct {
    float *committed; /* (floats) */
    float *working;   /* (floats) */
    size_t floats;    /* 0: this compressor keeps no such state */
} compress_state;

struct loom_compressor {
    loom_compress_opts opts; /* as given, with min_ratio and block defaults filled in */
    int64_t rows, cols;
    int64_t n; /* rows * cols */
    int compresses;
    int rank;                /* powersgd, lowrank: effective rank, min(opts.rank, rows, cols) */
    int64_t k;               /* topk: entries kept */
    int dirty;               /* the working state was written in this step */
    compress_state residual; /* (rows, cols) error feedback E */
    compress_state q;        /* (cols, rank) warm-start factor */
    double residual_sq;      /* |working E|^2 as of the last update */
    /* Scratch of the low-rank methods (NULL otherwise). */
    float *p;    /* (rows, rank) lowrank's P, row-major */
    float *qr;   /* (rank, rows): P column-major, what LAPACK factors in place */
    float *tau;  /* (rank) Householder scalars */
    float *work; /* (lwork) LAPACK workspace */
    int64_t lwork;
};

/* The state an update reads: the committed copy on the first update of a step, the working
 * copy on later ones. */
static inline float *compress_state_read(const loom_compressor *c, const compress_state *s) {
    return c->dirty ? s->working : s->committed;
}

/* quantize.c: encode m (rows x cols) into wire; when residual is not NULL (it may be m itself)
 * it receives m - decode(wire), and c->residual_sq its squared norm. */
void loom_compress_topk_encode(loom_compressor *c, const float *m, float *residual, void *wire);
void loom_compress_sign_encode(loom_compressor *c, const float *m, float *residual, void *wire);
void loom_compress_int8_encode(loom_compressor *c, const float *m, float *residual, void *wire);
void loom_compress_bf16_encode(loom_compressor *c, const float *m, float *residual, void *wire);
/* out = decode(wire), or out += decode(wire) when add is 1. */
void loom_compress_topk_decode(const loom_compressor *c, const void *wire, float *out, int add);
void loom_compress_sign_decode(const loom_compressor *c, const void *wire, float *out, int add);
void loom_compress_int8_decode(const loom_compressor *c, const void *wire, float *out, int add);
void loom_compress_bf16_decode(const loom_compressor *c, const void *wire, float *out, int add);

/* powersgd.c: lowrank's encode (error feedback and warm start included) and decode; the scratch
 * of the low-rank methods (LAPACK's workspace size is asked once, here). */
void loom_compress_lowrank_encode(loom_compressor *c, const float *x, void *wire);
void loom_compress_lowrank_decode(const loom_compressor *c, const void *wire, float *out, int add);
loom_status loom_compress_lowrank_scratch(loom_compressor *c);
void loom_compress_lowrank_scratch_free(loom_compressor *c);

#endif
