/*
 * dp_compress.c — compressed data-parallel buckets (parallel_internal.h): one compressor per
 * matrix, the layout of each bucket's collective buffers, and the rounds between them. The
 * gradient sync (grad_sync.c) decides when a bucket starts and polls its requests; this file
 * says what each round sends and what it does with what comes back.
 *
 * Not here: the compressors' arithmetic (compress/), MPI (comm/).
 */
#include "parallel_internal.h"

#include "loom/ops.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int count;                 /* matrices */
    loom_compressor **comp;    /* (count) */
    const loom_grad_matrix *m; /* (count) the bucket's matrices (borrowed) */
    size_t *first, *second;    /* (count) powersgd: offsets (floats) in round 1 / 2 buffers;
                                  others: byte offsets of each wire in this rank's buffer */
    size_t round1, round2;     /* powersgd: floats of the two rounds' buffers */
    float *buf1, *buf2;        /* powersgd: (round1), (round2) */
    size_t wire_floats;        /* others: this rank's wire buffer, padded to whole floats */
    float *wire;               /* others: (wire_floats) */
    float *gathered;           /* others: (replicas, wire_floats) */
    int round;                 /* 1 or 2: the collective in flight */
    size_t raw_floats;         /* the bucket's floats */
} dp_bucket;

struct loom_dp_compress {
    loom_compress_opts opts;
    int replicas;
    dp_bucket *buckets;
    int num_buckets;
    int total;       /* compressors */
    int keep_tensor; /* sent uncompressed (-1: none) */
    loom_compress_stats stats;
};

static int is_powersgd(const loom_dp_compress *dc) {
    return dc->opts.method == LOOM_COMPRESS_POWERSGD;
}

/* Ring-allreduce traffic of `floats`, as comm/ counts it. */
static int64_t allreduce_bytes(const loom_dp_compress *dc, size_t floats) {
    return 2 * (int64_t)(dc->replicas - 1) * (int64_t)(floats * sizeof(float)) / dc->replicas;
}

static loom_status bucket_init(loom_dp_compress *dc, dp_bucket *db, const loom_grad_bucket *b) {
    db->count = b->count;
    db->m = b->matrices;
    db->raw_floats = b->end - b->begin;
    db->comp = loom_calloc((size_t)b->count, sizeof(loom_compressor *), "compressors");
    db->first = loom_calloc((size_t)b->count, sizeof *db->first, "compressor offsets");
    db->second = loom_calloc((size_t)b->count, sizeof *db->second, "compressor offsets");
    if (!db->comp || !db->first || !db->second) return LOOM_ERR_NOMEM;
    size_t wire_bytes = 0;
    for (int i = 0; i < b->count; i++) {
        const loom_grad_matrix *m = &b->matrices[i];
        /* the stream names the matrix, so every replica starts from the same Q */
        uint64_t stream = ((uint64_t)m->part << 48) | ((uint64_t)m->tensor << 32) |
                          (uint64_t)(uint32_t)(m->layer + 1);
        loom_compress_opts opts = dc->opts;
        if (m->tensor == dc->keep_tensor) opts.method = LOOM_COMPRESS_NONE;
        loom_status st = loom_compressor_create(&db->comp[i], &opts, m->rows, m->cols, stream);
        if (st != LOOM_OK) return st;
        if (!is_powersgd(dc)) {
            db->first[i] = wire_bytes;
            wire_bytes += loom_compressor_wire_bytes(db->comp[i]);
        } else if (!loom_compressor_compresses(db->comp[i])) {
            db->first[i] = db->round1;
            db->round1 += (size_t)(m->rows * m->cols);
        }
    }
    if (is_powersgd(dc)) {
        /* the P's after the uncompressed matrices; the Q's in round 2 */
        int r = dc->opts.rank;
        for (int i = 0; i < b->count; i++) {
            if (!loom_compressor_compresses(db->comp[i])) continue;
            db->first[i] = db->round1;
            db->round1 += (size_t)db->m[i].rows * (size_t)r;
            db->second[i] = db->round2;
            db->round2 += (size_t)db->m[i].cols * (size_t)r;
        }
        db->buf1 = loom_alloc_aligned((db->round1 ? db->round1 : 1) * sizeof(float), "P factors");
        db->buf2 = loom_alloc_aligned((db->round2 ? db->round2 : 1) * sizeof(float), "Q factors");
        if (!db->buf1 || !db->buf2) return LOOM_ERR_NOMEM;
    } else {
        db->wire_floats = (wire_bytes + sizeof(float) - 1) / sizeof(float);
        size_t n = db->wire_floats ? db->wire_floats : 1;
        db->wire = loom_alloc_aligned(n * sizeof(float), "wire");
        db->gathered = loom_alloc_aligned(n * (size_t)dc->replicas * sizeof(float), "gathered");
        if (!db->wire || !db->gathered) return LOOM_ERR_NOMEM;
        memset(db->wire, 0, n * sizeof(float)); /* the padding is sent too */
    }
    return LOOM_OK;
}

static void bucket_free(dp_bucket *db) {
    for (int i = 0; db->comp && i < db->count; i++) loom_compressor_free(db->comp[i]);
    free(db->comp);
    free(db->first);
    free(db->second);
    loom_free_aligned(db->buf1);
    loom_free_aligned(db->buf2);
    loom_free_aligned(db->wire);
    loom_free_aligned(db->gathered);
}

loom_status loom_dp_compress_create(loom_dp_compress **out, const loom_compress_opts *opts,
                                    const loom_grad_bucket *buckets, int num_buckets, int replicas,
                                    int keep_tensor) {
    *out = NULL;
    loom_dp_compress *dc = loom_calloc(1, sizeof *dc, "data-parallel compression");
    if (!dc) return LOOM_ERR_NOMEM;
    dc->opts = *opts;
    dc->replicas = replicas;
    dc->keep_tensor = keep_tensor;
    dc->num_buckets = num_buckets;
    dc->buckets = loom_calloc((size_t)(num_buckets > 0 ? num_buckets : 1), sizeof *dc->buckets,
                              "compressed buckets");
    loom_status st = dc->buckets ? LOOM_OK : LOOM_ERR_NOMEM;
    for (int b = 0; st == LOOM_OK && b < num_buckets; b++) {
        st = bucket_init(dc, &dc->buckets[b], &buckets[b]);
        dc->total += buckets[b].count;
    }
    if (st != LOOM_OK) {
        loom_dp_compress_free(dc);
        return st;
    }
    *out = dc;
    return LOOM_OK;
}

void loom_dp_compress_free(loom_dp_compress *dc) {
    if (!dc) return;
    for (int b = 0; dc->buckets && b < dc->num_buckets; b++) bucket_free(&dc->buckets[b]);
    free(dc->buckets);
    free(dc);
}

/* Notes the input's size before a lossy encode, for the compression-error metric (the
 * compressors run on the CPU, so the CPU backend's threaded sum). */
static void note_input(loom_dp_compress *dc, const float *g, const loom_grad_matrix *m) {
    dc->stats.input_sq += loom_backend_cpu()->sum_squares(g, m->rows * m->cols);
}

loom_status loom_dp_compress_start(loom_dp_compress *dc, int b, float *grads, loom_comm *dp,
                                   loom_comm_request **request) {
    dp_bucket *db = &dc->buckets[b];
    double t0 = loom_now();
    loom_status st;
    db->round = 1;
    if (is_powersgd(dc)) {
        for (int i = 0; i < db->count; i++) {
            float *g = grads + db->m[i].offset;
            size_t n = (size_t)(db->m[i].rows * db->m[i].cols);
            if (!loom_compressor_compresses(db->comp[i])) {
                memcpy(db->buf1 + db->first[i], g, n * sizeof(float));
                continue;
            }
            note_input(dc, g, &db->m[i]);
            loom_powersgd_p(db->comp[i], g, db->buf1 + db->first[i]);
        }
        dc->stats.compress_s += loom_now() - t0;
        dc->stats.dp_bytes_saved += allreduce_bytes(dc, db->raw_floats) -
                                    allreduce_bytes(dc, db->round1) -
                                    allreduce_bytes(dc, db->round2);
        st = loom_comm_iallreduce_f32(dp, db->buf1, (int64_t)db->round1, request);
    } else {
        unsigned char *wire = (unsigned char *)db->wire;
        for (int i = 0; i < db->count; i++) {
            const float *g = grads + db->m[i].offset;
            note_input(dc, g, &db->m[i]);
            loom_compressor_encode(db->comp[i], g, wire + db->first[i]);
        }
        dc->stats.compress_s += loom_now() - t0;
        dc->stats.dp_bytes_saved +=
            allreduce_bytes(dc, db->raw_floats) -
            (int64_t)(dc->replicas - 1) * (int64_t)(db->wire_floats * sizeof(float));
        st =
            loom_comm_iallgather_f32(dp, db->wire, db->gathered, (int64_t)db->wire_floats, request);
    }
    return st;
}

loom_status loom_dp_compress_next(loom_dp_compress *dc, int b, float *grads, loom_comm *dp,
                                  loom_comm_request **request) {
    dp_bucket *db = &dc->buckets[b];
    double t0 = loom_now();
    *request = NULL;
    loom_status st = LOOM_OK;
    if (is_powersgd(dc) && db->round == 1) {
        for (int i = 0; i < db->count; i++) {
            float *g = grads + db->m[i].offset;
            size_t n = (size_t)(db->m[i].rows * db->m[i].cols);
            if (!loom_compressor_compresses(db->comp[i])) {
                memcpy(g, db->buf1 + db->first[i], n * sizeof(float));
                continue;
            }
            loom_powersgd_q(db->comp[i], g, db->buf1 + db->first[i], db->buf2 + db->second[i]);
        }
        db->round = 2;
        dc->stats.compress_s += loom_now() - t0;
        return loom_comm_iallreduce_f32(dp, db->buf2, (int64_t)db->round2, request);
    }
    if (is_powersgd(dc)) {
        for (int i = 0; i < db->count; i++) {
            if (!loom_compressor_compresses(db->comp[i])) continue;
            loom_powersgd_done(db->comp[i], grads + db->m[i].offset, db->buf1 + db->first[i],
                               db->buf2 + db->second[i], dc->replicas);
            dc->stats.residual_sq += loom_compressor_residual_sq(db->comp[i]);
        }
    } else {
        for (int i = 0; i < db->count; i++) {
            float *g = grads + db->m[i].offset;
            memset(g, 0, (size_t)(db->m[i].rows * db->m[i].cols) * sizeof(float));
            dc->stats.residual_sq += loom_compressor_residual_sq(db->comp[i]);
        }
        /* the sum in rank order: the same bits on every replica */
        for (int r = 0; r < dc->replicas; r++) {
            const unsigned char *wire = (const unsigned char *)(db->gathered + r * db->wire_floats);
            for (int i = 0; i < db->count; i++) {
                loom_compressor_decode_add(db->comp[i], wire + db->first[i],
                                           grads + db->m[i].offset);
            }
        }
    }
    db->round = 0;
    dc->stats.compress_s += loom_now() - t0;
    return st;
}

int loom_dp_compress_has_second(const loom_dp_compress *dc, int b) {
    return is_powersgd(dc) && dc->buckets[b].round == 1;
}

void loom_dp_compress_commit(loom_dp_compress *dc, int accept) {
    for (int b = 0; b < dc->num_buckets; b++) {
        for (int i = 0; i < dc->buckets[b].count; i++) {
            loom_compressor_commit(dc->buckets[b].comp[i], accept);
        }
    }
}

void loom_dp_compress_commit_bucket(loom_dp_compress *dc, int b, int accept) {
    for (int i = 0; i < dc->buckets[b].count; i++) {
        loom_compressor_commit(dc->buckets[b].comp[i], accept);
    }
}

void loom_dp_compress_take_stats(loom_dp_compress *dc, loom_compress_stats *stats) {
    stats->dp_bytes_saved += dc->stats.dp_bytes_saved;
    stats->compress_s += dc->stats.compress_s;
    stats->residual_sq += dc->stats.residual_sq;
    stats->input_sq += dc->stats.input_sq;
    memset(&dc->stats, 0, sizeof dc->stats);
}

int loom_dp_compress_count(const loom_dp_compress *dc) {
    return dc->total;
}

loom_compressor *loom_dp_compress_get(loom_dp_compress *dc, int i) {
    for (int b = 0; b < dc->num_buckets; b++) {
        if (i < dc->buckets[b].count) return dc->buckets[b].comp[i];
        i -= dc->buckets[b].count;
    }
    return NULL;
}

size_t loom_dp_compress_state_bytes(const loom_dp_compress *dc) {
    size_t bytes = 0;
    for (int b = 0; b < dc->num_buckets; b++) {
        for (int i = 0; i < dc->buckets[b].count; i++) {
            bytes += loom_compressor_state_bytes(dc->buckets[b].comp[i]);
        }
    }
    return bytes;
}
