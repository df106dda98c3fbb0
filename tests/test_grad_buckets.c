/*
 * test_grad_buckets.c — data-parallel gradient buckets are tensor-aligned: for several models
 * (tensor-parallel shards and pipeline stages included) and bucket sizes, the buckets tile the
 * gradient buffer [0, num_params) from the top down with no gap or overlap, every bucket is a
 * list of whole tensor slices (each segment of the model lies in exactly one bucket), each
 * matrix's rows x cols is its slice's element count with the 2-D weights' true shapes — but a
 * qkvw slice is three matrices, its Q, K and V (C/tp rows each, in that order) — and every
 * bucket but the last holds at least the bucket size. The reference is the model's own segment
 * list, its tensors' logical shapes and the width C, checked element by element.
 */
#include "check.h"
#include "loom/parallel.h"

#include <stdlib.h>
#include <string.h>

static void check_buckets(const loom_gpt *m, size_t bucket_bytes, const char *what) {
    loom_grad_bucket *buckets;
    int count;
    CHECK(loom_grad_buckets_make(m, bucket_bytes, &buckets, &count) == LOOM_OK, "%s: make: %s",
          what, loom_last_error());
    if (!buckets) return;
    /* tiling, from the top down */
    size_t top = m->num_params;
    for (int b = 0; b < count; b++) {
        CHECK(buckets[b].end == top, "%s: bucket %d ends at %zu, expected %zu", what, b,
              buckets[b].end, top);
        CHECK(buckets[b].begin < buckets[b].end, "%s: bucket %d empty", what, b);
        size_t at = buckets[b].begin, floats = buckets[b].end - buckets[b].begin;
        for (int i = 0; i < buckets[b].count; i++) {
            const loom_grad_matrix *mx = &buckets[b].matrices[i];
            CHECK(mx->offset == at, "%s: bucket %d matrix %d at %zu, expected %zu", what, b, i,
                  mx->offset, at);
            at += (size_t)(mx->rows * mx->cols);
        }
        CHECK(at == buckets[b].end, "%s: bucket %d matrices end at %zu, not %zu", what, b, at,
              buckets[b].end);
        if (b < count - 1) {
            CHECK(floats * sizeof(float) >= bucket_bytes, "%s: bucket %d holds %zu bytes < %zu",
                  what, b, floats * sizeof(float), bucket_bytes);
        }
        top = buckets[b].begin;
    }
    CHECK(top == 0, "%s: buckets stop at %zu, not 0", what, top);
    /* every segment is exactly one matrix of one bucket, with its tensor's shape; qkvw's are
     * three in a row: Q, K and V, C/tp rows of C each */
    for (int s = 0; s < m->num_segments; s++) {
        const loom_gpt_segment *seg = &m->segments[s];
        const loom_gpt_tensor_info *ti = &m->info[seg->tensor];
        int qkv = seg->tensor == LOOM_QKVW, parts = qkv ? 3 : 1, found = 0;
        int dims = ti->ndim - (ti->per_layer ? 1 : 0);
        int64_t rows =
            qkv ? m->config.channels / m->tp_size : (dims == 2 ? ti->shape[ti->ndim - 2] : 1);
        int64_t cols = seg->numel / (rows * parts);
        for (int b = 0; b < count; b++) {
            for (int i = 0; i < buckets[b].count; i++) {
                const loom_grad_matrix *mx = &buckets[b].matrices[i];
                if (mx->offset != seg->offset) continue;
                found++;
                CHECK(i + parts <= buckets[b].count, "%s: segment %d's matrices cut at %d", what, s,
                      buckets[b].count);
                for (int p = 0; p < parts && i + p < buckets[b].count; p++) {
                    const loom_grad_matrix *part = &buckets[b].matrices[i + p];
                    CHECK(part->offset == seg->offset + (size_t)(p * rows * cols) &&
                              part->rows == rows && part->cols == cols &&
                              part->tensor == seg->tensor && part->layer == seg->layer &&
                              part->part == p,
                          "%s: segment %d (%s) part %d as a %lld x %lld matrix of tensor %d part "
                          "%d, expected %lld x %lld",
                          what, s, ti->name, p, (long long)part->rows, (long long)part->cols,
                          part->tensor, part->part, (long long)rows, (long long)cols);
                }
            }
        }
        CHECK(found == 1, "%s: segment %d in %d buckets", what, s, found);
    }
    loom_grad_buckets_free(buckets, count);
}

int main(void) {
    loom_gpt_config c;
    loom_gpt_preset("tiny", &c);
    c.num_layers = 5;
    const size_t sizes[] = {1, 4, 1000, 4096, 20000, (size_t)1 << 30};
    const struct {
        int first, end, tp, rank;
    } shards[] = {{0, 5, 1, 0}, {0, 2, 1, 0}, {2, 5, 1, 0}, {1, 4, 2, 1}, {0, 5, 2, 0}};
    for (size_t s = 0; s < sizeof shards / sizeof shards[0]; s++) {
        loom_gpt m;
        loom_gpt_shard shard = {.first_layer = shards[s].first,
                                .end_layer = shards[s].end,
                                .tp_size = shards[s].tp,
                                .tp_rank = shards[s].rank,
                                .tp_comm = NULL};
        CHECK(loom_gpt_describe(&m, &c, &shard) == LOOM_OK, "describe: %s", loom_last_error());
        /* describe leaves the segment list out: build a model of the same layout */
        loom_gpt *real = NULL;
        CHECK(loom_gpt_create_shard(&real, &c, loom_backend_cpu(), &shard) == LOOM_OK ||
                  shards[s].tp > 1,
              "create: %s", loom_last_error());
        if (!real) continue; /* a tp > 1 model needs a communicator */
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            char what[128];
            snprintf(what, sizeof what, "layers [%d, %d) tp %d, %zu-byte buckets", shards[s].first,
                     shards[s].end, shards[s].tp, sizes[i]);
            check_buckets(real, sizes[i], what);
        }
        loom_gpt_free(real);
    }
    return check_finish();
}
