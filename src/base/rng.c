/*
 * rng.c — random numbers. The counter-based generator hashes (seed, stream, index) with
 * SplitMix64-style finalisers, so any element of any tensor can be drawn on its own.
 */
#include "loom/base.h"

#include <math.h>

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t loom_rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
    h = mix64(h ^ (stream * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL));
    return mix64(h ^ (index * 0x9e3779b97f4a7c15ULL));
}

static double u64_to_unit(uint64_t x) {
    return (double)(x >> 11) * (1.0 / 9007199254740992.0); /* 53 bits */
}

double loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return u64_to_unit(loom_rng_u64(seed, stream, index));
}

double loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    /* Two independent draws per index: counters 2i and 2i+1 of the same stream. */
    double u1 = u64_to_unit(loom_rng_u64(seed, stream, 2 * index));
    double u2 = u64_to_unit(loom_rng_u64(seed, stream, 2 * index + 1));
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

void loom_rng_seed(loom_rng *rng, uint64_t seed) {
    rng->state = mix64(seed ^ 0x5851f42d4c957f2dULL);
}

uint64_t loom_rng_next(loom_rng *rng) {
    rng->state += 0x9e3779b97f4a7c15ULL;
    return mix64(rng->state);
}

double loom_rng_next_uniform(loom_rng *rng) {
    return u64_to_unit(loom_rng_next(rng));
}
