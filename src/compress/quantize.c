/*
 * quantize.c — the element-wise one-shot methods: top-k (values and indices of the k largest
 * magnitudes, found by a radix select in three passes, no sort and no scratch), sign (one bit per
 * entry and the mean magnitude), block-wise int8 and bf16. Each encodes M (the input plus the
 * residual, formed by compress.c) and, with error feedback, leaves M - decode(wire) in the
 * residual, computed from the same values the wire carries.
 *
 * Wire fields are read and written with memcpy: a wire buffer is only as aligned as its caller
 * made it.
 *
 * Not here: error feedback's bookkeeping and the state's steps (compress.c), low rank
 * (powersgd.c).
 */
#include "compress_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- top-k ------------------------------------------------------------------------------- */

/* The magnitude's bits: for non-negative floats the integer order is the numeric order (NaN's
 * bits sort above infinity, so a NaN is always kept: the step will be rolled back anyway). */
static inline uint32_t magnitude_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

/* The k-th largest magnitude's bits, by radix select on 10 + 11 + 11 bits: each pass counts
 * the entries that share the digits found so far, by their next digit, and descends into the
 * digit holding the k-th. *ties: how many entries equal to the threshold are kept (the rest of
 * the k are above it). */
static uint32_t topk_threshold(const float *m, int64_t n, int64_t k, int64_t *ties) {
    static const int shifts[3] = {22, 11, 0}, widths[3] = {10, 11, 11};
    uint32_t prefix = 0, mask = 0;
    int64_t need = k; /* entries still to take among those matching prefix under mask */
    for (int pass = 0; pass < 3; pass++) {
        int64_t count[2048] = {0};
        int shift = shifts[pass];
        uint32_t digits = (1u << widths[pass]) - 1;
        for (int64_t i = 0; i < n; i++) {
            uint32_t key = magnitude_bits(m[i]);
            if ((key & mask) == prefix) count[(key >> shift) & digits]++;
        }
        uint32_t d = digits;
        while (d > 0 && count[d] < need) need -= count[d--];
        prefix |= d << shift;
        mask |= digits << shift;
    }
    *ties = need;
    return prefix;
}

void loom_compress_topk_encode(loom_compressor *c, const float *m, float *residual, void *wire) {
    int64_t n = c->n, k = c->k, ties;
    uint32_t threshold = topk_threshold(m, n, k, &ties);
    unsigned char *values = wire, *indices = values + 4 * k;
    int64_t kept = 0;
    double sq = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = m[i];
        uint32_t key = magnitude_bits(v);
        int keep = key > threshold || (key == threshold && ties > 0);
        if (keep) {
            if (key == threshold) ties--;
            uint32_t index = (uint32_t)i;
            memcpy(values + 4 * kept, &v, sizeof v);
            memcpy(indices + 4 * kept, &index, sizeof index);
            kept++;
        }
        if (residual) {
            /* The kept entry is sent exactly, so sent + residual is M bit for bit. */
            float r = keep ? 0.0f : v;
            residual[i] = r;
            sq += (double)r * r;
        }
    }
    if (kept != k) loom_fatal("topk kept %lld of %lld entries", (long long)kept, (long long)k);
    c->residual_sq = sq;
}

void loom_compress_topk_decode(const loom_compressor *c, const void *wire, float *out, int add) {
    if (!add) memset(out, 0, (size_t)c->n * sizeof(float));
    const unsigned char *values = wire, *indices = values + 4 * c->k;
    for (int64_t j = 0; j < c->k; j++) {
        float v;
        uint32_t index;
        memcpy(&v, values + 4 * j, sizeof v);
        memcpy(&index, indices + 4 * j, sizeof index);
        if ((int64_t)index >= c->n) {
            loom_fatal("topk wire: index %u outside a matrix of %lld entries", index,
                       (long long)c->n);
        }
        out[index] += v;
    }
}

/* ---- sign ------------------------------------------------------------------------------- */

void loom_compress_sign_encode(loom_compressor *c, const float *m, float *residual, void *wire) {
    int64_t n = c->n;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += fabs((double)m[i]);
    float scale = (float)(sum / (double)n);
    unsigned char *bytes = wire;
    memcpy(bytes, &scale, sizeof scale);
    bytes += 4;
    double sq = 0;
    for (int64_t b = 0; b < (n + 7) / 8; b++) {
        unsigned bits = 0;
        for (int64_t i = 8 * b; i < n && i < 8 * b + 8; i++) {
            float v = m[i];
            int positive = v >= 0; /* a NaN goes as negative */
            bits |= (unsigned)positive << (i - 8 * b);
            if (residual) {
                float r = v - (positive ? scale : -scale);
                residual[i] = r;
                sq += (double)r * r;
            }
        }
        bytes[b] = (unsigned char)bits;
    }
    c->residual_sq = sq;
}

void loom_compress_sign_decode(const loom_compressor *c, const void *wire, float *out, int add) {
    const unsigned char *bytes = wire;
    float scale;
    memcpy(&scale, bytes, sizeof scale);
    bytes += 4;
    for (int64_t i = 0; i < c->n; i++) {
        float v = (bytes[i / 8] >> (i % 8)) & 1 ? scale : -scale;
        out[i] = add ? out[i] + v : v;
    }
}

/* ---- int8, one scale per block ------------------------------------------------------------- */

/* scale = max |v| / 127 (0 for an all-zero block), level = v / scale rounded half away from zero
 * (roundf: the same on every machine whatever the rounding mode), clamped to [-127, 127]. */

void loom_compress_int8_encode(loom_compressor *c, const float *m, float *residual, void *wire) {
    int64_t n = c->n, block = c->opts.block, blocks = (n + block - 1) / block;
    unsigned char *scales = wire;
    signed char *q = (signed char *)(scales + 4 * blocks);
    double sq = 0;
    for (int64_t b = 0; b < blocks; b++) {
        int64_t start = b * block, end = start + block < n ? start + block : n;
        float max = 0;
        for (int64_t i = start; i < end; i++) max = fmaxf(max, fabsf(m[i]));
        float scale = max / 127.0f;
        memcpy(scales + 4 * b, &scale, sizeof scale);
        for (int64_t i = start; i < end; i++) {
            float v = m[i], level = 0;
            /* fmaxf/fminf return the number when one side is NaN: no undefined conversion. */
            if (scale > 0) level = roundf(fminf(fmaxf(v / scale, -127.0f), 127.0f));
            q[i] = (signed char)level;
            if (residual) {
                float r = v - level * scale;
                residual[i] = r;
                sq += (double)r * r;
            }
        }
    }
    c->residual_sq = sq;
}

void loom_compress_int8_decode(const loom_compressor *c, const void *wire, float *out, int add) {
    int64_t n = c->n, block = c->opts.block, blocks = (n + block - 1) / block;
    const unsigned char *scales = wire;
    const signed char *q = (const signed char *)(scales + 4 * blocks);
    for (int64_t b = 0; b < blocks; b++) {
        int64_t start = b * block, end = start + block < n ? start + block : n;
        float scale;
        memcpy(&scale, scales + 4 * b, sizeof scale);
        for (int64_t i = start; i < end; i++) {
            float v = (float)q[i] * scale;
            out[i] = add ? out[i] + v : v;
        }
    }
}

/* ---- bf16 ------------------------------------------------------------------------------- */

/* The upper 16 bits of the fp32, rounded to nearest, ties to even; a NaN stays a (quiet) NaN
 * instead of rounding into infinity. */
static inline uint16_t bf16_of(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float float_of_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

void loom_compress_bf16_encode(loom_compressor *c, const float *m, float *residual, void *wire) {
    unsigned char *bytes = wire;
    double sq = 0;
    for (int64_t i = 0; i < c->n; i++) {
        float v = m[i];
        uint16_t h = bf16_of(v);
        memcpy(bytes + 2 * i, &h, sizeof h);
        if (residual) {
            float r = v - float_of_bf16(h);
            residual[i] = r;
            sq += (double)r * r;
        }
    }
    c->residual_sq = sq;
}

void loom_compress_bf16_decode(const loom_compressor *c, const void *wire, float *out, int add) {
    const unsigned char *bytes = wire;
    for (int64_t i = 0; i < c->n; i++) {
        uint16_t h;
        memcpy(&h, bytes + 2 * i, sizeof h);
        float v = float_of_bf16(h);
        out[i] = add ? out[i] + v : v;
    }
}
