/*
 * grad_sync.c — what makes gradients and parameters agree across ranks after a backward:
 * data-parallel sums in tensor-aligned buckets that start while backward still runs, or ZeRO-1
 * (reduce-scatter, the caller updates its range, all-gather); the tied embedding's sum between
 * the first and the last pipeline stage; the loss and global gradient norm over every rank; and
 * the check that replicas hold identical parameters.
 *
 * Not here: the optimizer's arithmetic (train/), MPI (comm/), the model's maths (model/).
 */
#include "parallel_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- tensor-aligned buckets ------------------------------------------------------------------ */

/* The matrices a compressor sees for one segment, into out (at most 3; returns how many): 2-D
 * weights as (rows, cols) of one layer, cut into loom_gpt_matrix_parts' row blocks (qkvw's Q, K,
 * V; Llama's gate and up), everything else as a row. */
static int matrices_of(const loom_gpt *model, const loom_gpt_segment *seg, loom_grad_matrix *out) {
    const loom_gpt_tensor_info *ti = &model->info[seg->tensor];
    int matrix_dims = ti->per_layer ? ti->ndim - 1 : ti->ndim; /* without the layer axis */
    if (matrix_dims != 2) {
        out[0] = (loom_grad_matrix){seg->offset, 1, seg->numel, seg->tensor, seg->layer, 0};
        return 1;
    }
    int64_t rows[LOOM_MAX_MATRIX_PARTS], cols = ti->shape[ti->ndim - 1];
    int parts = loom_gpt_matrix_parts(&model->config, model->tp_size, seg->tensor, rows);
    size_t at = seg->offset;
    for (int p = 0; p < parts; p++) {
        out[p] = (loom_grad_matrix){at, rows[p], cols, seg->tensor, seg->layer, p};
        at += (size_t)(rows[p] * cols);
    }
    return parts;
}

/* Whether a bucket must not reach below segment `lo`: it starts one of `cuts`. */
static int is_cut(const loom_gpt *model, int lo, const size_t *cuts, int num_cuts) {
    for (int c = 0; c < num_cuts; c++)
        if (model->segments[lo].offset == cuts[c]) return 1;
    return 0;
}

/* isolate: a tensor whose slices get buckets of their own (the fused embedding's), or -1; cuts:
 * flat offsets no bucket spans (each a segment's start). */
static loom_status make_buckets(const loom_gpt *model, size_t bucket_bytes, int isolate,
                                const size_t *cuts, int num_cuts, loom_grad_bucket **out,
                                int *count) {
    *out = NULL, *count = 0;
    size_t per_bucket = bucket_bytes / sizeof(float);
    if (per_bucket == 0) per_bucket = 1;
    int n = model->num_segments;
    loom_grad_bucket *buckets = loom_calloc((size_t)(n > 0 ? n : 1), sizeof *buckets, "buckets");
    if (!buckets) return LOOM_ERR_NOMEM;
    int made = 0;
    for (int hi = n - 1; hi >= 0;) {
        /* take segments from the top down until the bucket is full */
        int lo = hi;
        size_t size = (size_t)model->segments[lo].numel;
        int alone = model->segments[lo].tensor == isolate;
        while (!alone && lo > 0 && size < per_bucket && model->segments[lo - 1].tensor != isolate &&
               !is_cut(model, lo, cuts, num_cuts))
            size += (size_t)model->segments[--lo].numel;
        loom_grad_bucket *b = &buckets[made];
        b->matrices = loom_calloc((size_t)(hi - lo + 1) * LOOM_MAX_MATRIX_PARTS,
                                  sizeof *b->matrices, "bucket matrices");
        if (!b->matrices) {
            loom_grad_buckets_free(buckets, made);
            return LOOM_ERR_NOMEM;
        }
        b->count = 0;
        for (int i = lo; i <= hi; i++)
            b->count += matrices_of(model, &model->segments[i], b->matrices + b->count);
        b->begin = model->segments[lo].offset;
        b->end = model->segments[hi].offset + (size_t)model->segments[hi].numel;
        made++;
        hi = lo - 1;
    }
    *out = buckets, *count = made;
    return LOOM_OK;
}

loom_status loom_grad_buckets_make(const loom_gpt *model, size_t bucket_bytes,
                                   loom_grad_bucket **out, int *count) {
    return make_buckets(model, bucket_bytes, -1, NULL, 0, out, count);
}

loom_status loom_grad_buckets_make_cut(const loom_gpt *model, size_t bucket_bytes,
                                       const size_t *cuts, int num_cuts, loom_grad_bucket **out,
                                       int *count) {
    return make_buckets(model, bucket_bytes, -1, cuts, num_cuts, out, count);
}

void loom_grad_buckets_free(loom_grad_bucket *buckets, int count) {
    if (!buckets) return;
    for (int i = 0; i < count; i++) free(buckets[i].matrices);
    free(buckets);
}

/* ---- the synchroniser ------------------------------------------------------------------------ */

/* A bucket's round: IDLE until backward has finished it, then its phases, each started when
 * the previous one completes, advanced by polling (between blocks of backward) and at the end.
 *   plain DP:  REDUCING (one non-blocking allreduce of the bucket, in place) -> DONE
 *   ZeRO-1:    RING -> DONE: comm's ring reduce-scatter of the bucket (loom_comm_ring_*, the
 *              one `loom profile` times), in place, its blocks the ranks' ZeRO ranges cut to
 *              the bucket: when it completes, this rank's block (the bucket's part of its
 *              range) holds the sum.
 *   compressed (the plan's compression.dp on this stage, after its warm-up steps):
 *              COMPRESSED round 1 (encode, a first collective) -> round 2 (PowerSGD: decode,
 *              a second collective) -> DONE; dp_compress.c says what each round does. Under
 *              ZeRO-1 too: the compressed sum reaches every replica, which then updates its
 *              own range of it. */
typedef enum {
    BUCKET_IDLE,
    BUCKET_REDUCING,
    BUCKET_RING,
    BUCKET_COMPRESSED, /* a round of dp_compress.c's collectives in flight */
    BUCKET_BETWEEN,    /* compressed: round 1 done, round 2 waits for its turn */
    BUCKET_DONE
} bucket_phase;

typedef struct {
    bucket_phase phase;
    loom_comm_request *request; /* REDUCING: the allreduce; COMPRESSED: the round's */
    loom_comm_ring *ring;       /* ZeRO-1: the bucket's reduce-scatter, tagged with its index */
} bucket_state;

struct loom_grad_sync {
    const loom_mesh *mesh;
    loom_gpt *model;
    int zero1;
    loom_zero_shard range;     /* what this rank updates: all, or its ZeRO-1 shard */
    loom_grad_bucket *buckets; /* dp > 1 */
    bucket_state *state;
    int num_buckets;
    int started;       /* buckets 0 .. started-1 have left IDLE */
    int held;          /* the bucket holding wte waits for the embedding sum (-1: none) */
    int fused;         /* embedding_sync "fused": wte's bucket is summed over mesh->embedding_all */
    loom_status error; /* first failure of this round */
    loom_dp_compress *compress; /* NULL: this stage sends its gradients uncompressed */
    int warmup_steps;           /* the first steps go uncompressed */
    int compressing;            /* this step's buckets are compressed */
    int next_second;            /* the bucket whose second round starts next */
    loom_trace *trace;          /* NULL: not tracing */
    int64_t step;               /* for the trace */
    int in_step;                /* before_backward began this step's sync; finish ends it */
    loom_unit_sync *units;      /* ZeRO-2 and up: the gradients per unit (zero.c); no buckets */
};

/* The ring of bucket b over the gradient buffer: block r is the part of rank r's ZeRO range
 * inside the bucket (maybe empty), bounds (dp + 1) its scratch. */
static loom_status make_ring(loom_grad_sync *s, int b, int64_t *bounds) {
    const loom_grad_bucket *bucket = &s->buckets[b];
    int dp = s->mesh->dp_size;
    for (int r = 0; r <= dp; r++) {
        size_t at = (size_t)r * s->range.shard;
        bounds[r] = (int64_t)(at < bucket->begin ? bucket->begin
                              : at > bucket->end ? bucket->end
                                                 : at);
    }
    return loom_comm_ring_create(s->mesh->dp, bounds, b, &s->state[b].ring);
}

loom_status loom_grad_sync_create(loom_grad_sync **out, const loom_mesh *mesh, loom_gpt *model,
                                  const loom_grad_sync_opts *opts) {
    *out = NULL;
    loom_grad_sync *s = loom_calloc(1, sizeof *s, "gradient sync");
    if (!s) return LOOM_ERR_NOMEM;
    s->mesh = mesh, s->model = model, s->held = -1;
    size_t n = model->num_params;
    int dp = mesh->dp_size;
    s->zero1 = opts->zero1 && dp > 1;
    s->range = loom_zero_shard_of(n, s->zero1 ? dp : 1, s->zero1 ? mesh->dp_rank : 0);
    loom_status st = LOOM_OK;
    if (s->zero1 && s->range.padded_count > n + LOOM_GPT_PAD_FLOATS) {
        st = loom_fail(LOOM_ERR_INPUT, "--zero: at most %d data-parallel ranks",
                       LOOM_GPT_PAD_FLOATS);
    }
    if (st == LOOM_OK && mesh->plan->zero >= 2) {
        st = loom_unit_sync_create(&s->units, mesh, model, s->range);
        if (st == LOOM_OK) {
            loom_unit_sync_attach(s->units);
            *out = s;
            return LOOM_OK;
        }
    }
    s->fused = mesh->embedding_all != NULL;
    if (st == LOOM_OK && dp > 1) {
        st = make_buckets(model, (size_t)opts->bucket_bytes, s->fused ? LOOM_WTE : -1, NULL, 0,
                          &s->buckets, &s->num_buckets);
    }
    if (st == LOOM_OK && dp > 1) {
        s->state = loom_calloc((size_t)s->num_buckets, sizeof *s->state, "bucket state");
        if (!s->state) st = LOOM_ERR_NOMEM;
        if (st == LOOM_OK && s->zero1 && s->num_buckets > LOOM_COMM_MAX_TAG + 1) {
            st = loom_fail(LOOM_ERR_INPUT, "--bucket-mb: %d buckets; expected at most %d",
                           s->num_buckets, LOOM_COMM_MAX_TAG + 1);
        }
    }
    const loom_plan_compressor *pc = &mesh->plan->dp_compression;
    if (st == LOOM_OK && dp > 1 && loom_plan_compresses_stage(pc, mesh->pp_rank)) {
        loom_compress_opts copts;
        st = loom_parallel_compress_opts(pc, LOOM_COMPRESS_FOR_DP, opts->seed, &copts);
        if (st == LOOM_OK) {
            /* the tied embedding's two copies must get the same update: compressed on both
             * the first and the last stage, or on neither */
            int both = loom_plan_compresses_stage(pc, 0) &&
                       loom_plan_compresses_stage(pc, mesh->pp_size - 1);
            st = loom_dp_compress_create(&s->compress, &copts, s->buckets, s->num_buckets, dp,
                                         mesh->embedding && !both ? LOOM_WTE : -1);
        }
        s->warmup_steps = pc->warmup_steps;
    }
    if (st == LOOM_OK && s->zero1) {
        int64_t *bounds = loom_malloc(((size_t)dp + 1) * sizeof *bounds, "ring bounds");
        if (!bounds) st = LOOM_ERR_NOMEM;
        for (int b = 0; st == LOOM_OK && b < s->num_buckets; b++) st = make_ring(s, b, bounds);
        free(bounds);
    }
    if (st != LOOM_OK) {
        loom_grad_sync_free(s);
        return st;
    }
    *out = s;
    return LOOM_OK;
}

void loom_grad_sync_free(loom_grad_sync *s) {
    if (!s) return;
    loom_unit_sync_free(s->units);
    for (int b = 0; s->state && b < s->num_buckets; b++) loom_comm_ring_free(s->state[b].ring);
    loom_dp_compress_free(s->compress);
    loom_grad_buckets_free(s->buckets, s->num_buckets);
    free(s->state);
    free(s);
}

static void keep_error(loom_grad_sync *s, loom_status st) {
    if (st != LOOM_OK && s->error == LOOM_OK) s->error = st;
}

/* Completes (wait) or checks (test) one request; 1 when it is done. */
static int settle(loom_grad_sync *s, loom_comm_request **request, int wait) {
    if (!*request) return 1;
    int done = 0;
    loom_status st = wait ? loom_comm_wait(*request) : loom_comm_test(*request, &done);
    if (wait || done || st != LOOM_OK) *request = NULL;
    keep_error(s, st);
    return *request == NULL;
}

/* Moves bucket b on as far as it can go without waiting (or, with wait, to DONE). */
static void bucket_advance(loom_grad_sync *s, int b, int wait) {
    bucket_state *bs = &s->state[b];
    const loom_grad_bucket *bucket = &s->buckets[b];
    if (bs->phase == BUCKET_IDLE && s->compressing) {
        double t0 = loom_trace_now_us();
        loom_status st = loom_dp_compress_start(s->compress, b, s->model->grads_memory, s->mesh->dp,
                                                &bs->request);
        loom_trace_event(s->trace, LOOM_TRACE_DP, "encode", "compress", t0,
                         loom_trace_now_us() - t0, s->step + 1, b);
        keep_error(s, st);
        bs->phase = st == LOOM_OK ? BUCKET_COMPRESSED : BUCKET_DONE;
    } else if (bs->phase == BUCKET_IDLE && !s->zero1) {
        double t0 = loom_trace_now_us();
        loom_status st =
            loom_comm_iallreduce_f32(s->mesh->dp, s->model->grads_memory + bucket->begin,
                                     (int64_t)(bucket->end - bucket->begin), &bs->request);
        loom_trace_event(s->trace, LOOM_TRACE_DP, "bucket start", "dp", t0,
                         loom_trace_now_us() - t0, s->step + 1, b);
        keep_error(s, st);
        bs->phase = st == LOOM_OK ? BUCKET_REDUCING : BUCKET_DONE;
    } else if (bs->phase == BUCKET_IDLE) {
        double t0 = loom_trace_now_us();
        loom_status st = loom_comm_ring_start(bs->ring, s->model->grads_memory);
        loom_trace_event(s->trace, LOOM_TRACE_DP, "bucket start", "dp", t0,
                         loom_trace_now_us() - t0, s->step + 1, b);
        keep_error(s, st);
        bs->phase = st == LOOM_OK ? BUCKET_RING : BUCKET_DONE;
    }
    if (bs->phase == BUCKET_REDUCING && settle(s, &bs->request, wait)) bs->phase = BUCKET_DONE;
    for (;;) {
        if (bs->phase == BUCKET_COMPRESSED) {
            if (!settle(s, &bs->request, wait)) return;
            bs->phase = s->error != LOOM_OK                           ? BUCKET_DONE
                        : loom_dp_compress_has_second(s->compress, b) ? BUCKET_BETWEEN
                                                                      : BUCKET_COMPRESSED;
            if (bs->phase != BUCKET_COMPRESSED) continue;
        } else if (bs->phase == BUCKET_BETWEEN) {
            /* second rounds start in bucket order on their own group, as every rank must start
             * a group's collectives in the same order, whichever first round completed first */
            if (b != s->next_second) return;
            s->next_second++;
        } else {
            break;
        }
        double t0 = loom_trace_now_us();
        loom_status st = loom_dp_compress_next(s->compress, b, s->model->grads_memory,
                                               s->mesh->dp_second, &bs->request);
        loom_trace_event(s->trace, LOOM_TRACE_DP, bs->request ? "decode, encode" : "decode",
                         "compress", t0, loom_trace_now_us() - t0, s->step + 1, b);
        keep_error(s, st);
        bs->phase = st == LOOM_OK && bs->request ? BUCKET_COMPRESSED : BUCKET_DONE;
    }
    if (bs->phase == BUCKET_RING) {
        int done = 1;
        loom_status st =
            wait ? loom_comm_ring_wait(bs->ring) : loom_comm_ring_test(bs->ring, &done);
        keep_error(s, st);
        if (done) bs->phase = BUCKET_DONE;
    }
}

/* The model's grads_ready hook: every gradient at or above ready_offset is final. The bucket
 * holding the tied embedding waits for finish: the embedding's two copies are summed first
 * (under ZeRO-1 the stages' ranges differ), and a blocking sum here, inside backward, would
 * stall the pipeline. */
static void grads_ready(void *ctx, size_t ready_offset) {
    loom_grad_sync *s = ctx;
    while (s->started < s->num_buckets && s->buckets[s->started].begin >= ready_offset) {
        if (s->started == s->held) break;
        bucket_advance(s, s->started++, 0);
    }
    /* MPI moves non-blocking operations along only inside MPI calls: poke the ones in flight,
     * so they progress while backward computes the next block */
    for (int b = 0; b < s->started; b++) bucket_advance(s, b, 0);
}

void loom_grad_sync_before_backward(loom_grad_sync *s, int64_t step) {
    if (!s || !s->buckets) return;
    if (!s->in_step || s->step != step) { /* else a later chunk's last backward in the step */
        s->in_step = 1;
        s->compressing = s->compress && step >= s->warmup_steps;
        s->step = step;
        s->next_second = 0;
        s->started = 0;
        s->error = LOOM_OK;
        s->held = -1;
        if (s->mesh->embedding) {
            const loom_gpt_tensor_info *wte = &s->model->info[LOOM_WTE];
            for (int b = 0; b < s->num_buckets; b++) {
                if (s->buckets[b].begin <= wte->offset && wte->offset < s->buckets[b].end)
                    s->held = b;
            }
        }
        for (int b = 0; b < s->num_buckets; b++) s->state[b].phase = BUCKET_IDLE;
    }
    /* without overlap every bucket starts in loom_grad_sync_finish, after the backward */
    if (s->mesh->plan->overlap_grad_reduce) loom_gpt_set_grads_ready(s->model, grads_ready, s);
}

void loom_grad_sync_after_backward(loom_grad_sync *s) {
    if (s) loom_gpt_set_grads_ready(s->model, NULL, NULL);
}

/* The tied embedding's two copies (first and last stage) get the sum of both gradients; fused,
 * the sum of both copies of every replica, in one allreduce (Optimus-CC). */
static loom_status sync_embedding(loom_grad_sync *s) {
    if (!s->mesh->embedding) return LOOM_OK;
    const loom_gpt_tensor_info *wte = &s->model->info[LOOM_WTE];
    loom_comm *group = s->fused ? s->mesh->embedding_all : s->mesh->embedding;
    return loom_comm_allreduce_f32(group, s->model->grads_memory + wte->offset, wte->numel,
                                   LOOM_REDUCE_SUM);
}

void loom_grad_sync_next_pass(loom_grad_sync *s, int chunk, int dir) {
    if (s && s->units) loom_unit_sync_next_pass(s->units, chunk, dir);
}

void loom_grad_sync_gather_counts(const loom_grad_sync *s, int64_t *gathers,
                                  int64_t *just_in_time) {
    *gathers = *just_in_time = 0;
    if (s && s->units) loom_unit_sync_gather_counts(s->units, gathers, just_in_time);
}

void loom_grad_sync_zero_grads(loom_grad_sync *s, int64_t step) {
    loom_gpt_zero_grad(s->model);
    if (s->units) loom_unit_sync_zero(s->units, step);
}

loom_status loom_grad_sync_finish(loom_grad_sync *s) {
    s->in_step = 0;
    if (s->units) return loom_unit_sync_finish(s->units, s->mesh->embedding);
    if (!s->buckets) return sync_embedding(s);
    /* the held bucket (the tied embedding's) may start once both copies are summed */
    loom_status st = s->held >= 0 ? sync_embedding(s) : LOOM_OK;
    keep_error(s, st);
    if (s->fused && s->held >= 0) s->state[s->held].phase = BUCKET_DONE; /* wte alone: summed */
    s->held = -1;
    grads_ready(s, 0); /* whatever backward did not start */
    for (int b = 0; b < s->num_buckets; b++) bucket_advance(s, b, 1);
    st = s->error;
    s->error = LOOM_OK;
    return st;
}

void loom_grad_sync_set_trace(loom_grad_sync *s, loom_trace *trace) {
    s->trace = trace;
}

void loom_grad_sync_commit(loom_grad_sync *s, int accept) {
    if (s->compress) loom_dp_compress_commit(s->compress, accept);
    if (s->units) loom_unit_sync_commit(s->units, accept);
}

void loom_grad_sync_take_stats(loom_grad_sync *s, loom_compress_stats *stats) {
    if (s->compress) loom_dp_compress_take_stats(s->compress, stats);
    if (s->units) loom_unit_sync_take_stats(s->units, stats);
}

int loom_grad_sync_compressor_count(const loom_grad_sync *s) {
    return s->compress ? loom_dp_compress_count(s->compress) : 0;
}

loom_compressor *loom_grad_sync_compressor(loom_grad_sync *s, int i) {
    return s->compress ? loom_dp_compress_get(s->compress, i) : NULL;
}

size_t loom_grad_sync_state_bytes(const loom_grad_sync *s) {
    if (s->units) return loom_unit_sync_state_bytes(s->units);
    return s->compress ? loom_dp_compress_state_bytes(s->compress) : 0;
}

int loom_grad_sync_residual_count(const loom_grad_sync *s) {
    return s->units ? loom_unit_sync_residual_count(s->units) : 0;
}

float *loom_grad_sync_residual(loom_grad_sync *s, int i, int *unit, size_t *floats) {
    return s->units ? loom_unit_sync_residual(s->units, i, unit, floats) : NULL;
}

loom_zero_shard loom_grad_sync_range(const loom_grad_sync *s) {
    return s->range;
}

float *loom_grad_sync_grads(loom_grad_sync *s) {
    if (s->units) return loom_unit_sync_grads(s->units);
    return s->model->grads_memory + s->range.begin;
}

size_t loom_grad_sync_param_bytes(const loom_grad_sync *s) {
    if (s->mesh->plan->zero == 3) {
        return (s->range.end - s->range.begin) * sizeof(float) +
               loom_unit_sync_param_bytes(s->units);
    }
    return s->model->num_params * sizeof(float);
}

size_t loom_grad_sync_grad_bytes(const loom_grad_sync *s) {
    if (s->units) return loom_unit_sync_buffer_bytes(s->units);
    return s->model->num_params * sizeof(float);
}

void loom_grad_sync_poison(loom_grad_sync *s) {
    loom_grad_sync_grads(s)[0] = NAN;
}

/* Sums of squares over this rank's range, split into TP-sharded tensors (out[0]) and the rest
 * (out[1]); each parameter once: the embeddings where they are used first, the final LayerNorm
 * on the head stage (other stages' copies are idle or mirror them). */
static void sum_squares(loom_grad_sync *s, double out[2]) {
    const loom_gpt *model = s->model;
    const float *grads = loom_grad_sync_grads(s); /* from range.begin */
    size_t lo = s->range.begin, hi = s->range.end;
    out[0] = out[1] = 0.0;
    for (int i = 0; i < model->num_segments; i++) {
        const loom_gpt_segment *seg = &model->segments[i];
        size_t a = seg->offset > lo ? seg->offset : lo;
        size_t b = seg->offset + (size_t)seg->numel < hi ? seg->offset + (size_t)seg->numel : hi;
        if (a >= b) continue;
        int k = seg->tensor;
        if ((k == LOOM_WTE || k == LOOM_WPE) && !model->has_embedding) continue;
        if ((k == LOOM_LNFW || k == LOOM_LNFB) && !model->has_head) continue;
        double sq = model->backend->sum_squares(grads + (a - lo), (int64_t)(b - a));
        out[s->mesh->tp_size > 1 && loom_gpt_tensor_is_sharded(k) ? 0 : 1] += sq;
    }
}

loom_status loom_grad_sync_loss_and_norm(loom_grad_sync *s, double loss_sum, int micro_batches,
                                         double *loss, double *grad_norm) {
    const loom_mesh *mesh = s->mesh;
    double sums[3] = {loss_sum / micro_batches, 0.0, 0.0}; /* loss, sharded, replicated */
    sum_squares(s, sums + 1);
    loom_status st = LOOM_OK;
    if (mesh->dp_size > 1) {
        /* under plain DP every rank holds the whole gradient: take the largest of the (equal)
         * values rather than trusting that every rank's allreduce rounded alike; under ZeRO-1
         * each rank adds its range */
        double norms[2] = {sums[1], sums[2]};
        if (!s->zero1) sums[1] = sums[2] = 0.0;
        st = loom_comm_allreduce_f64(mesh->dp, sums, 3, LOOM_REDUCE_SUM);
        if (st == LOOM_OK && !s->zero1) {
            st = loom_comm_allreduce_f64(mesh->dp, norms, 2, LOOM_REDUCE_MAX);
            sums[1] = norms[0], sums[2] = norms[1];
        }
        sums[0] /= mesh->dp_size;
    }
    if (st == LOOM_OK && mesh->tp_size > 1) {
        st = loom_comm_allreduce_f64(mesh->tp, sums + 1, 1, LOOM_REDUCE_SUM);
    }
    if (st == LOOM_OK && mesh->pp_size > 1) {
        /* the loss lives on the last stage, the norm's parts on every stage */
        if (!s->model->has_head) sums[0] = 0.0;
        st = loom_comm_allreduce_f64(mesh->pp, sums, 3, LOOM_REDUCE_SUM);
    }
    *loss = sums[0];
    *grad_norm = sqrt(sums[1] + sums[2]);
    return st;
}

loom_status loom_grad_sync_share_params(loom_grad_sync *s) {
    if (s->mesh->plan->zero == 3) return loom_unit_sync_refresh(s->units);
    if (!s->zero1) return LOOM_OK;
    /* in place: this rank's range already sits at rank x shard in the buffer */
    float *params = s->model->params_memory;
    return loom_comm_allgather_f32(s->mesh->dp, params + s->range.begin, params,
                                   (int64_t)s->range.shard);
}

uint64_t loom_parallel_checksum(const void *data, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *bytes = data;
    for (size_t i = 0; i < n; i++) h = (h ^ bytes[i]) * 1099511628211ULL;
    return h;
}

/* The tied embedding's two copies (first and last stage) must stay equal: they get the same
 * gradient and the same update. */
static loom_status check_tied_embedding(loom_grad_sync *s) {
    const loom_mesh *mesh = s->mesh;
    if (!mesh->embedding) return LOOM_OK;
    const loom_gpt_tensor_info *wte = &s->model->info[LOOM_WTE];
    uint64_t h = loom_parallel_checksum(s->model->unit_params[0] + wte->offset,
                                        (size_t)wte->numel * sizeof(float));
    double both[4] = {0, 0, 0, 0};
    int end = mesh->pp_rank == 0 ? 0 : 1;
    both[2 * end] = (double)(h >> 32), both[2 * end + 1] = (double)(h & 0xffffffffu);
    loom_status st = loom_comm_allreduce_f64(mesh->embedding, both, 4, LOOM_REDUCE_SUM);
    if (st != LOOM_OK) return st;
    if (both[0] != both[2] || both[1] != both[3]) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "the tied embedding's copies on the first and the last pipeline stage "
                         "differ (replica %d, tensor rank %d); the stages no longer train the "
                         "same model",
                         mesh->dp_rank, mesh->tp_rank);
    }
    return LOOM_OK;
}

loom_status loom_grad_sync_check_replicas(loom_grad_sync *s) {
    const loom_mesh *mesh = s->mesh;
    if (s->units) loom_unit_sync_wait_params(s->units);
    loom_status tied = check_tied_embedding(s);
    if (tied != LOOM_OK || mesh->dp_size < 2) return tied;
    /* ZeRO-3's replicas share only what they hold gathered: the embeddings and the final
     * LayerNorm (each rank's shard is its own) */
    uint64_t h = 0;
    if (s->mesh->plan->zero == 3) {
        for (int k = 0; k < 2; k++) {
            size_t floats;
            const float *p = loom_unit_sync_held_params(s->units, k, &floats);
            h = h * 31 + loom_parallel_checksum(p, floats * sizeof(float));
        }
    } else {
        h = loom_parallel_checksum(s->model->params_memory, s->model->num_params * sizeof(float));
    }
    /* every replica's checksum, in two exactly representable halves */
    int dp = mesh->dp_size;
    double *all = loom_calloc(2 * (size_t)dp, sizeof *all, "replica checksums");
    if (!all) return LOOM_ERR_NOMEM;
    all[2 * mesh->dp_rank] = (double)(h >> 32);
    all[2 * mesh->dp_rank + 1] = (double)(h & 0xffffffffu);
    loom_status st = loom_comm_allreduce_f64(mesh->dp, all, 2 * dp, LOOM_REDUCE_SUM);
    char differing[256] = "";
    size_t used = 0;
    for (int r = 1; st == LOOM_OK && r < dp && used < sizeof differing - 16; r++) {
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
            used += (size_t)snprintf(differing + used, sizeof differing - used, "%s%d",
                                     used ? ", " : "", r);
        }
    }
    free(all);
    if (st != LOOM_OK) return st;
    if (used > 0) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "data-parallel replicas differ: replica(s) %s of stage %d, tensor rank "
                         "%d hold parameters other than replica 0's (checksums differ); the "
                         "replicas no longer train the same model",
                         differing, mesh->pp_rank, mesh->tp_rank);
    }
    if (mesh->lead) {
        loom_info("data-parallel replicas hold bit-identical parameters (checksum %016" PRIx64 ")",
                  h);
    }
    return LOOM_OK;
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

double loom_grad_bucket_default_mb(int dp) {
    double per_rank = 4.0 * (dp > 1 ? dp : 1);
    return per_rank > LOOM_GRAD_BUCKET_DEFAULT_MB ? per_rank : LOOM_GRAD_BUCKET_DEFAULT_MB;
}
