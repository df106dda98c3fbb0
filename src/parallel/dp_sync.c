/*
 * dp_sync.c — data-parallel gradient averaging that overlaps backward: the gradient buffer
 * is cut into buckets from the top down (the model's layer-major layout puts the last blocks,
 * which backward finishes first, at the highest offsets), and each bucket's non-blocking
 * allreduce starts as soon as backward reports that everything at or above it is final.
 */
#include "loom/parallel.h"

#include <stdlib.h>

struct loom_dp_sync {
    loom_comm *comm;
    float *grads;
    size_t count;
    int num_buckets;
    size_t *start; /* bucket b covers [start[b], start[b] + length[b]); b = 0 is the top one */
    size_t *length;
    loom_comm_request **requests; /* NULL once complete */
    loom_status error;            /* first failure of this round */
    int launched;                 /* buckets 0 .. launched-1 are in flight or done */
};

loom_status loom_dp_sync_create(loom_dp_sync **out, loom_comm *dp, float *grads, size_t count,
                                size_t bucket_bytes) {
    *out = NULL;
    size_t per_bucket = bucket_bytes / sizeof(float);
    if (per_bucket == 0) per_bucket = 1;
    size_t buckets = (count + per_bucket - 1) / per_bucket;
    if (buckets == 0) buckets = 1;
    loom_dp_sync *s = loom_calloc(1, sizeof *s, "dp sync");
    if (!s) return LOOM_ERR_NOMEM;
    s->comm = dp;
    s->grads = grads;
    s->count = count;
    s->num_buckets = (int)buckets;
    s->start = loom_calloc(buckets, sizeof *s->start, "dp buckets");
    s->length = loom_calloc(buckets, sizeof *s->length, "dp buckets");
    s->requests = loom_calloc(buckets, sizeof *s->requests, "dp requests");
    if (!s->start || !s->length || !s->requests) {
        loom_dp_sync_free(s);
        return LOOM_ERR_NOMEM;
    }
    size_t end = count;
    for (size_t b = 0; b < buckets; b++) {
        size_t begin = end > per_bucket ? end - per_bucket : 0;
        s->start[b] = begin;
        s->length[b] = end - begin;
        end = begin;
    }
    s->launched = s->num_buckets; /* nothing to wait for until begin() */
    *out = s;
    return LOOM_OK;
}

void loom_dp_sync_free(loom_dp_sync *s) {
    if (!s) return;
    free(s->start);
    free(s->length);
    free(s->requests);
    free(s);
}

int loom_dp_sync_num_buckets(const loom_dp_sync *s) {
    return s->num_buckets;
}

void loom_dp_sync_begin(loom_dp_sync *s) {
    s->launched = 0;
    s->error = LOOM_OK;
    for (int b = 0; b < s->num_buckets; b++) s->requests[b] = NULL;
}

static loom_status launch(loom_dp_sync *s, int b) {
    return loom_comm_iallreduce_f32(s->comm, s->grads + s->start[b], (int64_t)s->length[b],
                                    &s->requests[b]);
}

void loom_dp_sync_ready(void *ctx, size_t ready_offset) {
    loom_dp_sync *s = ctx;
    while (s->launched < s->num_buckets && s->start[s->launched] >= ready_offset) {
        loom_status st = launch(s, s->launched);
        if (st != LOOM_OK && s->error == LOOM_OK) s->error = st;
        s->launched++;
    }
    /* MPI moves a non-blocking collective along only inside MPI calls: poke the ones in
     * flight, so they progress while backward computes the next block */
    for (int b = 0; b < s->launched; b++) {
        if (!s->requests[b]) continue;
        int done = 0;
        loom_status st = loom_comm_test(s->requests[b], &done);
        if (done || st != LOOM_OK) s->requests[b] = NULL;
        if (st != LOOM_OK && s->error == LOOM_OK) s->error = st;
    }
}

loom_status loom_dp_sync_finish(loom_dp_sync *s) {
    loom_dp_sync_ready(s, 0);
    loom_status st = s->error;
    for (int b = 0; b < s->num_buckets; b++) {
        if (!s->requests[b]) continue;
        loom_status r = loom_comm_wait(s->requests[b]);
        s->requests[b] = NULL;
        if (st == LOOM_OK) st = r;
    }
    s->error = LOOM_OK;
    return st;
}

loom_zero_shard loom_zero_shard_of(size_t count, int dp_size, int dp_rank) {
    loom_zero_shard z;
    size_t dp = (size_t)(dp_size > 0 ? dp_size : 1);
    z.padded_count = (count + dp - 1) / dp * dp;
    z.shard = z.padded_count / dp;
    z.begin = (size_t)dp_rank * z.shard;
    z.end = z.begin + z.shard;
    if (z.end > count) z.end = count;
    if (z.begin > count) z.begin = count;
    return z;
}
