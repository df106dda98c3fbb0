/*
 * test_grad_buckets.c — data-parallel gradient buckets are tensor-aligned: for several models
 * (tensor-parallel shards and pipeline stages included) and bucket sizes, the buckets tile the
 * gradient buffer [0, num_params) from the top down with no gap or overlap, every bucket is a
 * list of whole tensor slices (each segment of the model lies in exactly one bucket), each
 * matrix's rows x cols is its slice's element count with the 2-D weights' true shapes, and every
 * bucket but the last holds at least the bucket size. The reference is the model's own segment
 * list and its tensors' logical shapes, checked element by element.
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
    /* every segment is exactly one matrix of one bucket, with its tensor's shape */
    for (int s = 0; s < m->num_segments; s++) {
        const loom_gpt_segment *seg = &m->segments[s];
        int found = 0;
        for (int b = 0; b < count; b++) {
            for (int i = 0; i < buckets[b].count; i++) {
                const loom_grad_matrix *mx = &buckets[b].matrices[i];
                if (mx->offset != seg->offset) continue;
                found++;
                CHECK(mx->rows * mx->cols == seg->numel && mx->tensor == seg->tensor &&
                          mx->layer == seg->layer,
                      "%s: segment %d as a %lld x %lld matrix of tensor %d", what, s,
                      (long long)mx->rows, (long long)mx->cols, mx->tensor);
                const loom_gpt_tensor_info *ti = &m->info[seg->tensor];
                int dims = ti->ndim - (ti->per_layer ? 1 : 0);
                int64_t rows = dims == 2 ? ti->shape[ti->ndim - 2] : 1;
                CHECK(mx->rows == rows, "%s: %s has %lld rows, expected %lld", what, ti->name,
                      (long long)mx->rows, (long long)rows);
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
