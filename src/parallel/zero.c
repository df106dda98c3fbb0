/*
 * zero.c — ZeRO-2 and ZeRO-3, a unit at a time (the model's units: the embeddings, each block,
 * the final LayerNorm; loom_gpt.unit_begin).
 *
 * Gradients (ZeRO-2 and 3): no full-size gradient buffer. Each block's gradients are written into
 * a block-sized buffer handed to the model just before its backward writes them
 * (LOOM_GPT_UNIT_GRADS); as soon as that backward is done (LOOM_GPT_UNIT_GRADS_DONE: the fused
 * block, or W) the buffer is reduce-scattered over the data-parallel ranks by the unit's ring
 * (loom_comm_ring, the one ZeRO-1 and `loom profile` run), while backward goes on; when the ring
 * completes, this rank adds its block of the sum into its shard of the gradient (the ZeRO range,
 * accumulated over the step's micro-batches) and the buffer goes back to the pool. So a rank
 * holds its shard (gradients / dp), the buffers of the blocks being written or reduced, and two
 * units that stay whole for the step ("held"): the embeddings' (wte and wpe, written at both ends
 * of a backward when the rank has the head and the embedding, and summed between the first and
 * the last pipeline stage before their reduce-scatter) and the final LayerNorm's, both
 * reduce-scattered at the step's end.
 *
 * Parameters (ZeRO-3): the model keeps only this rank's range of them (its params_memory window,
 * which AdamW updates). A block's parameters are all-gathered from their owners into a
 * block-sized buffer just before a forward or a backward reads them (LOOM_GPT_UNIT_PARAMS_*; W
 * reads none), with the next `zero3_prefetch` blocks of the same chunk gathered ahead in the
 * pass's direction while it computes; the buffer goes back to the pool when the pass is done with
 * the block (zero3_gather "micro_batch"), or at the step's end ("step": gathered once, kept). The
 * held units stay gathered, refreshed from their owners after every update.
 *
 * The ranges are contiguous over the flat buffer (ZeRO-1's, so that AdamW, checkpoints and the
 * gradient norm treat every stage alike): a unit usually lies within one or two ranks' ranges,
 * so its reduce-scatter and its gather move about what a broadcast would, from or to its owner;
 * over a step every rank owns as much as any other.
 *
 * Every rank of a data-parallel group runs the same schedule, so units come in the same order
 * everywhere: rings and gathers start, and rings are waited for, in that order (a ring moves on a
 * peer only when that peer tests or waits it). A unit's next round waits for its previous one;
 * different units add into disjoint parts of the shard, so the sums' bits do not depend on which
 * ring completed first.
 *
 * Not here: the plain and ZeRO-1 buckets, the loss and norm, ZeRO-1's parameters (grad_sync.c).
 */
#include "parallel_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t begin, end;          /* flat offsets of the unit */
    size_t own_lo, own_hi;      /* this rank's block, relative to begin (maybe empty) */
    const int64_t *bounds;      /* (dp + 1) every rank's block, relative to begin */
    loom_comm_ring *ring;       /* the unit's reduce-scatter over dp, tagged with its index */
    float *writing;             /* the buffer the passes write into (NULL: none since the last) */
    float *sending;             /* the buffer the ring reduces (NULL: no ring running) */
    float *scratch;             /* a block's ring's receive buffer while it runs (pooled) */
    int held;                   /* the embeddings' or the final LayerNorm's: whole for the step */
    int first_layer, end_layer; /* a block's: the local layers of its chunk (prefetch stays in) */
    float *params;              /* ZeRO-3: gathered or being gathered parameters; NULL: none */
    loom_comm_request *gather;  /* ZeRO-3: the all-gather in flight */
} unit_state;

struct loom_unit_sync {
    const loom_mesh *mesh;
    loom_gpt *model;
    loom_zero_shard range;
    float *shard; /* (range.shard) this rank's gradients, summed over dp and micro-batches */
    unit_state *units;
    int num_units;
    size_t block_floats;     /* a block unit's size: every pool buffer's */
    float **pool;            /* free gradient buffers */
    int num_free, allocated; /* allocated: gradient buffers in existence, the high-water mark */
    int *fifo;               /* units whose rings run, in start order */
    int fifo_head, fifo_len;
    int64_t *bounds; /* (num_units, dp + 1) */
    /* ZeRO-3 */
    int zero3, prefetch, keep_for_step;
    float **param_pool; /* free parameter buffers */
    int params_free, params_allocated;
    int stale;         /* the held units' parameters wait for a refresh */
    loom_status error; /* first failure of the step */
};

static void keep_error(loom_unit_sync *u, loom_status st) {
    if (st != LOOM_OK && u->error == LOOM_OK) u->error = st;
}

/* Unit i's blocks (rank r's: its ZeRO range cut to the unit) and its ring: a block's borrows
 * its receive buffer from the pool while it runs (one ring per block must not hold a block's
 * worth of scratch each, a whole gradient in all), a held unit's has its own. */
static loom_status make_ring(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    int dp = u->mesh->dp_size;
    int64_t *bounds = u->bounds + (size_t)i * ((size_t)dp + 1);
    for (int r = 0; r <= dp; r++) {
        size_t at = (size_t)r * u->range.shard;
        at = at < us->begin ? us->begin : at > us->end ? us->end : at;
        bounds[r] = (int64_t)(at - us->begin);
    }
    us->bounds = bounds;
    us->own_lo = (size_t)bounds[u->mesh->dp_rank];
    us->own_hi = (size_t)bounds[u->mesh->dp_rank + 1];
    if (us->held) return loom_comm_ring_create(u->mesh->dp, bounds, i, &us->ring);
    return loom_comm_ring_create_borrowing(u->mesh->dp, bounds, i, &us->ring);
}

/* Unit i's buffers when it is held (whole for the step), and, for a block, its chunk's layers. */
static loom_status make_unit(loom_unit_sync *u, int i, int *chunk, int *first) {
    unit_state *us = &u->units[i];
    const loom_gpt *model = u->model;
    us->begin = model->unit_begin[i];
    us->end = model->unit_begin[i + 1];
    us->held = i == 0 || i == u->num_units - 1;
    loom_status st = make_ring(u, i);
    if (st != LOOM_OK) return st;
    if (!us->held) {
        int layers = model->chunks[*chunk].end_layer - model->chunks[*chunk].first_layer;
        while (i - 1 >= *first + layers && *chunk + 1 < model->num_chunks) {
            *first += layers, (*chunk)++;
            layers = model->chunks[*chunk].end_layer - model->chunks[*chunk].first_layer;
        }
        us->first_layer = *first, us->end_layer = *first + layers;
        return LOOM_OK;
    }
    size_t floats = us->end - us->begin + 1;
    us->writing = loom_alloc_aligned(floats * sizeof(float), "ZeRO embedding and LayerNorm grads");
    if (u->zero3) us->params = loom_alloc_aligned(floats * sizeof(float), "ZeRO-3 parameters");
    return us->writing && (!u->zero3 || us->params) ? LOOM_OK : LOOM_ERR_NOMEM;
}

loom_status loom_unit_sync_create(loom_unit_sync **out, const loom_mesh *mesh, loom_gpt *model,
                                  loom_zero_shard range) {
    *out = NULL;
    loom_unit_sync *u = loom_calloc(1, sizeof *u, "ZeRO gradient sync");
    if (!u) return LOOM_ERR_NOMEM;
    u->mesh = mesh, u->model = model, u->range = range;
    u->num_units = model->num_units;
    u->block_floats = model->layer_stride;
    u->zero3 = mesh->plan->zero == 3;
    u->prefetch = mesh->plan->zero3_prefetch;
    u->keep_for_step = mesh->plan->zero3_gather == LOOM_ZERO3_GATHER_STEP;
    size_t n = (size_t)u->num_units;
    u->units = loom_calloc(n, sizeof *u->units, "ZeRO units");
    u->fifo = loom_calloc(n, sizeof *u->fifo, "ZeRO units");
    u->pool = loom_calloc(2 * n, sizeof *u->pool, "ZeRO buffers");
    u->param_pool = loom_calloc(n, sizeof *u->param_pool, "ZeRO-3 buffers");
    u->bounds = loom_calloc(n * ((size_t)mesh->dp_size + 1), sizeof *u->bounds, "ZeRO bounds");
    u->shard = loom_alloc_aligned((range.shard > 0 ? range.shard : 1) * sizeof(float),
                                  "ZeRO gradient shard");
    loom_status st = LOOM_OK;
    if (!u->units || !u->fifo || !u->pool || !u->param_pool || !u->bounds || !u->shard)
        st = LOOM_ERR_NOMEM;
    if (st == LOOM_OK && u->zero3 &&
        (model->params_begin != range.begin || model->params_end != range.end)) {
        st = loom_fail(LOOM_ERR_RUNTIME,
                       "ZeRO-3: the model keeps parameters [%zu, %zu), the shard is [%zu, %zu)",
                       model->params_begin, model->params_end, range.begin, range.end);
    }
    int chunk = 0, first = 0;
    for (int i = 0; st == LOOM_OK && i < u->num_units; i++) st = make_unit(u, i, &chunk, &first);
    if (st != LOOM_OK) {
        loom_unit_sync_free(u);
        return st;
    }
    /* whatever full-size gradient buffer the model has goes; the held units' gradients (and,
     * ZeRO-3, parameters) live in their own buffers, the blocks' in the pools' */
    loom_gpt_drop_grads(model);
    for (int i = 0; i < u->num_units; i++) {
        model->unit_grads[i] = u->units[i].writing;
        if (u->zero3) model->unit_params[i] = u->units[i].params;
    }
    u->stale = u->zero3;
    *out = u;
    return LOOM_OK;
}

void loom_unit_sync_free(loom_unit_sync *u) {
    if (!u) return;
    for (int i = 0; u->units && i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        loom_comm_ring_wait(us->ring);
        loom_comm_ring_free(us->ring);
        if (us->gather) loom_comm_wait(us->gather);
        loom_free_aligned(us->writing);
        if (us->sending != us->writing) loom_free_aligned(us->sending);
        loom_free_aligned(us->scratch);
        loom_free_aligned(us->params);
    }
    for (int i = 0; u->pool && i < u->num_free; i++) loom_free_aligned(u->pool[i]);
    for (int i = 0; u->param_pool && i < u->params_free; i++) loom_free_aligned(u->param_pool[i]);
    loom_free_aligned(u->shard);
    free(u->bounds);
    free(u->param_pool);
    free(u->pool);
    free(u->fifo);
    free(u->units);
    free(u);
}

/* ---- gradients ------------------------------------------------------------------------------ */

/* Unit i's ring has completed: its block of the sum into the shard, the buffer back to the pool
 * (a held unit keeps its own). */
static void collect(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    float *dst = u->shard + (us->begin + us->own_lo - u->range.begin);
    const float *src = us->sending + us->own_lo;
    for (size_t k = 0; k < us->own_hi - us->own_lo; k++) dst[k] += src[k];
    if (!us->held) {
        u->pool[u->num_free++] = us->sending;
        u->pool[u->num_free++] = us->scratch;
    }
    us->sending = us->scratch = NULL;
}

/* Waits for the oldest running ring and collects it. */
static void complete_oldest(loom_unit_sync *u) {
    int i = u->fifo[u->fifo_head];
    u->fifo_head = (u->fifo_head + 1) % u->num_units;
    u->fifo_len--;
    keep_error(u, loom_comm_ring_wait(u->units[i].ring));
    collect(u, i);
}

/* Moves running rings and gathers on without waiting (MPI moves them only inside its calls);
 * collects, in start order, the rings at the front that have completed. */
static void poke(loom_unit_sync *u) {
    for (int k = 0; k < u->fifo_len; k++) {
        int done = 0;
        loom_comm_ring *ring = u->units[u->fifo[(u->fifo_head + k) % u->num_units]].ring;
        keep_error(u, loom_comm_ring_test(ring, &done));
        if (k == 0 && done) {
            complete_oldest(u);
            k = -1; /* the new front */
        }
    }
    for (int i = 0; u->zero3 && i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        int done = 0;
        if (!us->gather) continue;
        keep_error(u, loom_comm_test(us->gather, &done));
        if (done) us->gather = NULL;
    }
}

/* A zeroed block-sized gradient buffer: a free one, else the oldest ring's once it completes,
 * else a new one. */
static float *take_buffer(loom_unit_sync *u) {
    if (u->num_free == 0 && u->fifo_len > 0) complete_oldest(u);
    float *buf = NULL;
    if (u->num_free > 0) {
        buf = u->pool[--u->num_free];
    } else {
        buf = loom_alloc_aligned(u->block_floats * sizeof(float), "ZeRO gradient buffer");
        if (!buf) loom_comm_abort(1, "out of memory for a ZeRO gradient buffer");
        u->allocated++;
    }
    memset(buf, 0, u->block_floats * sizeof(float));
    return buf;
}

static void grads_begin(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    if (us->writing) return;
    us->writing = take_buffer(u);
    u->model->unit_grads[i] = us->writing;
}

static void grads_done(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    if (!us->writing) return;
    /* the unit's previous round must end before its ring runs again */
    while (us->sending) complete_oldest(u);
    us->scratch = take_buffer(u);
    us->sending = us->writing;
    us->writing = NULL;
    keep_error(u, loom_comm_ring_start_in(us->ring, us->sending, us->scratch));
    u->fifo[(u->fifo_head + u->fifo_len) % u->num_units] = i;
    u->fifo_len++;
}

/* ---- ZeRO-3's parameters --------------------------------------------------------------------- */

/* This rank's block of unit i's parameters, from its shard into buf. */
static void own_block(const loom_unit_sync *u, const unit_state *us, float *buf) {
    memcpy(buf + us->own_lo, u->model->params_memory + (us->begin + us->own_lo - u->range.begin),
           (us->own_hi - us->own_lo) * sizeof(float));
}

/* Starts gathering block unit i's parameters (nothing when they are there or on their way). */
static void start_gather(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    if (us->params || us->held) return;
    if (u->params_free > 0) {
        us->params = u->param_pool[--u->params_free];
    } else {
        us->params = loom_alloc_aligned(u->block_floats * sizeof(float), "ZeRO-3 parameters");
        if (!us->params) loom_comm_abort(1, "out of memory for a ZeRO-3 parameter buffer");
        u->params_allocated++;
    }
    own_block(u, us, us->params);
    keep_error(u, loom_comm_iallgatherv_f32(u->mesh->dp, us->params, us->bounds, &us->gather));
}

/* Block unit i's parameters, gathered and handed to the model; the next ones of its chunk in the
 * pass's direction (dir +1 forward, -1 backward) start gathering. */
static void params_begin(loom_unit_sync *u, int i, int dir) {
    unit_state *us = &u->units[i];
    start_gather(u, i);
    for (int k = 1; k <= u->prefetch; k++) {
        int next = i + dir * k, layer = next - 1;
        if (layer < us->first_layer || layer >= us->end_layer) break;
        start_gather(u, next);
    }
    if (us->gather) keep_error(u, loom_comm_wait(us->gather));
    us->gather = NULL;
    u->model->unit_params[i] = us->params;
}

/* Block unit i's gathered parameters back to the pool. */
static void params_free(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    if (!us->params || us->held) return;
    if (us->gather) keep_error(u, loom_comm_wait(us->gather));
    us->gather = NULL;
    u->param_pool[u->params_free++] = us->params;
    us->params = NULL;
    u->model->unit_params[i] = NULL;
}

loom_status loom_unit_sync_refresh(loom_unit_sync *u) {
    if (!u->zero3) return LOOM_OK;
    loom_status st = LOOM_OK;
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (!us->held) { /* kept for the step: stale after an update */
            params_free(u, i);
            continue;
        }
        loom_comm_request *request = NULL;
        own_block(u, us, us->params);
        if (st == LOOM_OK) {
            st = loom_comm_iallgatherv_f32(u->mesh->dp, us->params, us->bounds, &request);
        }
        if (st == LOOM_OK) st = loom_comm_wait(request);
    }
    u->stale = 0;
    return st;
}

/* ---- the hook and the step ------------------------------------------------------------------- */

static void unit_event(void *ctx, int i, int event) {
    loom_unit_sync *u = ctx;
    if (u->units[i].held) return;
    switch (event) {
    case LOOM_GPT_UNIT_GRADS:
        grads_begin(u, i);
        break;
    case LOOM_GPT_UNIT_GRADS_DONE:
        grads_done(u, i);
        break;
    case LOOM_GPT_UNIT_PARAMS_FORWARD:
    case LOOM_GPT_UNIT_PARAMS_BACKWARD:
        if (u->zero3) params_begin(u, i, event == LOOM_GPT_UNIT_PARAMS_FORWARD ? 1 : -1);
        break;
    case LOOM_GPT_UNIT_PARAMS_DONE:
        if (u->zero3 && !u->keep_for_step) params_free(u, i);
        break;
    default:
        break;
    }
    poke(u);
}

void loom_unit_sync_attach(loom_unit_sync *u) {
    loom_gpt_set_unit_events(u->model, unit_event, u);
}

void loom_unit_sync_zero(loom_unit_sync *u) {
    if (u->stale) keep_error(u, loom_unit_sync_refresh(u));
    memset(u->shard, 0, u->range.shard * sizeof(float));
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (us->held) memset(us->writing, 0, (us->end - us->begin) * sizeof(float));
    }
}

loom_status loom_unit_sync_finish(loom_unit_sync *u, loom_comm *embedding) {
    while (u->fifo_len > 0) complete_oldest(u);
    /* the tied embedding's two copies (first and last stage) sum before their reduce-scatter */
    const loom_gpt_tensor_info *wte = &u->model->info[LOOM_WTE];
    if (embedding && u->error == LOOM_OK) {
        keep_error(u, loom_comm_allreduce_f32(embedding, u->units[0].writing + wte->offset,
                                              wte->numel, LOOM_REDUCE_SUM));
    }
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (!us->held || u->error != LOOM_OK) continue;
        us->sending = us->writing;
        keep_error(u, loom_comm_ring_start(us->ring, us->sending));
        keep_error(u, loom_comm_ring_wait(us->ring));
        collect(u, i);
    }
    loom_status st = u->error;
    u->error = LOOM_OK;
    return st;
}

float *loom_unit_sync_grads(loom_unit_sync *u) {
    return u->shard;
}

/* Floats of the held units. */
static size_t held_floats(const loom_unit_sync *u) {
    size_t held = 0;
    for (int i = 0; i < u->num_units; i++)
        if (u->units[i].held) held += u->units[i].end - u->units[i].begin;
    return held;
}

size_t loom_unit_sync_buffer_bytes(const loom_unit_sync *u) {
    return ((size_t)u->allocated * u->block_floats + held_floats(u) + u->range.shard) *
           sizeof(float);
}

size_t loom_unit_sync_param_bytes(const loom_unit_sync *u) {
    if (!u->zero3) return 0;
    return ((size_t)u->params_allocated * u->block_floats + held_floats(u)) * sizeof(float);
}

const float *loom_unit_sync_held_params(const loom_unit_sync *u, int k, size_t *floats) {
    const unit_state *us = &u->units[k == 0 ? 0 : u->num_units - 1];
    *floats = us->end - us->begin;
    return us->params;
}
