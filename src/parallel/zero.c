/*
 * zero.c — ZeRO-2's gradients: no full-size gradient buffer. Each block's gradients are written
 * into a block-sized buffer handed to the model just before its backward writes them
 * (LOOM_GPT_UNIT_GRADS); as soon as that backward is done (LOOM_GPT_UNIT_GRADS_DONE: the fused
 * block, or W) the buffer is reduce-scattered over the data-parallel ranks by the unit's ring
 * (loom_comm_ring, the one ZeRO-1 and `loom profile` run), while backward goes on; when the ring
 * completes, this rank adds its block of the sum into its shard of the gradient (the ZeRO range,
 * accumulated over the step's micro-batches) and the buffer goes back to the pool. So a rank
 * holds its shard (gradients / dp), the buffers of the blocks being written or reduced, and two
 * units that stay whole for the step: the embeddings' (wte and wpe, written at both ends of a
 * backward when the rank has the head and the embedding, and summed between the first and the
 * last pipeline stage before their reduce-scatter) and the final LayerNorm's, both
 * reduce-scattered at the step's end.
 *
 * Every rank of a data-parallel group runs the same schedule, so units finish in the same order
 * everywhere: rings start, and are waited for, in that order (a ring moves on a peer only when
 * that peer tests or waits it). A unit's next round waits for its previous one; different units
 * add into disjoint parts of the shard, so the sums' bits do not depend on which ring completed
 * first.
 *
 * Not here: the plain and ZeRO-1 buckets, the loss and norm, parameters (grad_sync.c).
 */
#include "parallel_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t begin, end;     /* flat offsets of the unit */
    size_t own_lo, own_hi; /* this rank's block, relative to begin (maybe empty) */
    loom_comm_ring *ring;  /* the unit's reduce-scatter over dp, tagged with its index */
    float *writing;        /* the buffer the passes write into (NULL: none since the last) */
    float *sending;        /* the buffer the ring reduces (NULL: no ring running) */
    int held;              /* the embeddings' or the final LayerNorm's: whole for the step */
} unit_state;

struct loom_unit_sync {
    const loom_mesh *mesh;
    loom_gpt *model;
    loom_zero_shard range;
    float *shard; /* (range.shard) this rank's gradients, summed over dp and micro-batches */
    unit_state *units;
    int num_units;
    size_t block_floats;     /* a block unit's size: every pool buffer's */
    float **pool;            /* free buffers */
    int num_free, allocated; /* allocated: pool buffers in existence, the high-water mark */
    int *fifo;               /* units whose rings run, in start order */
    int fifo_head, fifo_len;
    loom_status error; /* first failure of the step */
};

static void keep_error(loom_unit_sync *u, loom_status st) {
    if (st != LOOM_OK && u->error == LOOM_OK) u->error = st;
}

/* The ring of unit i: block r is rank r's ZeRO range cut to the unit. */
static loom_status make_ring(loom_unit_sync *u, int i, int64_t *bounds) {
    unit_state *us = &u->units[i];
    int dp = u->mesh->dp_size;
    for (int r = 0; r <= dp; r++) {
        size_t at = (size_t)r * u->range.shard;
        at = at < us->begin ? us->begin : at > us->end ? us->end : at;
        bounds[r] = (int64_t)(at - us->begin);
    }
    us->own_lo = (size_t)bounds[u->mesh->dp_rank];
    us->own_hi = (size_t)bounds[u->mesh->dp_rank + 1];
    return loom_comm_ring_create(u->mesh->dp, bounds, i, &us->ring);
}

loom_status loom_unit_sync_create(loom_unit_sync **out, const loom_mesh *mesh, loom_gpt *model,
                                  loom_zero_shard range) {
    *out = NULL;
    loom_unit_sync *u = loom_calloc(1, sizeof *u, "ZeRO-2 gradient sync");
    if (!u) return LOOM_ERR_NOMEM;
    u->mesh = mesh, u->model = model, u->range = range;
    u->num_units = model->num_units;
    u->block_floats = model->layer_stride;
    loom_status st = LOOM_OK;
    u->units = loom_calloc((size_t)u->num_units, sizeof *u->units, "ZeRO-2 units");
    u->fifo = loom_calloc((size_t)u->num_units, sizeof *u->fifo, "ZeRO-2 units");
    u->pool = loom_calloc((size_t)u->num_units, sizeof *u->pool, "ZeRO-2 buffers");
    u->shard = loom_alloc_aligned((range.shard > 0 ? range.shard : 1) * sizeof(float),
                                  "ZeRO-2 gradient shard");
    int64_t *bounds = loom_malloc(((size_t)mesh->dp_size + 1) * sizeof *bounds, "ring bounds");
    if (!u->units || !u->fifo || !u->pool || !u->shard || !bounds) st = LOOM_ERR_NOMEM;
    for (int i = 0; st == LOOM_OK && i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        us->begin = model->unit_begin[i];
        us->end = model->unit_begin[i + 1];
        us->held = i == 0 || i == u->num_units - 1;
        st = make_ring(u, i, bounds);
        if (st == LOOM_OK && us->held) {
            us->writing = loom_alloc_aligned((us->end - us->begin + 1) * sizeof(float),
                                             "ZeRO-2 embedding and final LayerNorm gradients");
            if (!us->writing) st = LOOM_ERR_NOMEM;
        }
    }
    free(bounds);
    if (st != LOOM_OK) {
        loom_unit_sync_free(u);
        return st;
    }
    /* the full-size buffer goes; the held units' gradients live in their own */
    loom_gpt_drop_grads(model);
    for (int i = 0; i < u->num_units; i++) model->unit_grads[i] = u->units[i].writing;
    loom_unit_sync_zero(u);
    *out = u;
    return LOOM_OK;
}

void loom_unit_sync_free(loom_unit_sync *u) {
    if (!u) return;
    for (int i = 0; u->units && i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        loom_comm_ring_wait(us->ring);
        loom_comm_ring_free(us->ring);
        loom_free_aligned(us->writing);
        if (us->sending != us->writing) loom_free_aligned(us->sending);
    }
    for (int i = 0; u->pool && i < u->num_free; i++) loom_free_aligned(u->pool[i]);
    loom_free_aligned(u->shard);
    free(u->pool);
    free(u->fifo);
    free(u->units);
    free(u);
}

void loom_unit_sync_zero(loom_unit_sync *u) {
    memset(u->shard, 0, u->range.shard * sizeof(float));
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (us->held) memset(us->writing, 0, (us->end - us->begin) * sizeof(float));
    }
    u->error = LOOM_OK;
}

/* Unit i's ring has completed: its block of the sum into the shard, the buffer back to the pool
 * (a held unit keeps its own). */
static void collect(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    float *dst = u->shard + (us->begin + us->own_lo - u->range.begin);
    const float *src = us->sending + us->own_lo;
    for (size_t k = 0; k < us->own_hi - us->own_lo; k++) dst[k] += src[k];
    if (!us->held) u->pool[u->num_free++] = us->sending;
    us->sending = NULL;
}

/* Waits for the oldest running ring and collects it. */
static void complete_oldest(loom_unit_sync *u) {
    int i = u->fifo[u->fifo_head];
    u->fifo_head = (u->fifo_head + 1) % u->num_units;
    u->fifo_len--;
    keep_error(u, loom_comm_ring_wait(u->units[i].ring));
    collect(u, i);
}

/* Moves running rings on without waiting; collects, in start order, the ones at the front that
 * have completed. */
static void poke(loom_unit_sync *u) {
    for (int k = 0; k < u->fifo_len; k++) {
        int done = 0;
        keep_error(u, loom_comm_ring_test(u->units[u->fifo[(u->fifo_head + k) % u->num_units]].ring,
                                          &done));
        if (k == 0 && done) {
            complete_oldest(u);
            k = -1; /* the new front */
        }
    }
}

/* A zeroed block-sized buffer: a free one, else the oldest ring's once it completes, else a new
 * one. */
static float *take_buffer(loom_unit_sync *u) {
    if (u->num_free == 0 && u->fifo_len > 0) complete_oldest(u);
    float *buf = NULL;
    if (u->num_free > 0) {
        buf = u->pool[--u->num_free];
    } else {
        buf = loom_alloc_aligned(u->block_floats * sizeof(float), "ZeRO-2 gradient buffer");
        if (!buf) loom_comm_abort(1, "out of memory for a ZeRO-2 gradient buffer");
        u->allocated++;
    }
    memset(buf, 0, u->block_floats * sizeof(float));
    return buf;
}

/* The model's unit hook. */
static void unit_event(void *ctx, int i, int event) {
    loom_unit_sync *u = ctx;
    unit_state *us = &u->units[i];
    if (us->held) return;
    if (event == LOOM_GPT_UNIT_GRADS && !us->writing) {
        us->writing = take_buffer(u);
        u->model->unit_grads[i] = us->writing;
    } else if (event == LOOM_GPT_UNIT_GRADS_DONE && us->writing) {
        if (us->sending) { /* the unit's previous round must end before its ring runs again */
            while (u->units[i].sending) complete_oldest(u);
        }
        us->sending = us->writing;
        us->writing = NULL;
        keep_error(u, loom_comm_ring_start(us->ring, us->sending));
        u->fifo[(u->fifo_head + u->fifo_len) % u->num_units] = i;
        u->fifo_len++;
    }
    poke(u);
}

void loom_unit_sync_attach(loom_unit_sync *u) {
    loom_gpt_set_unit_events(u->model, unit_event, u);
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

size_t loom_unit_sync_buffer_bytes(const loom_unit_sync *u) {
    size_t held = 0;
    for (int i = 0; i < u->num_units; i++)
        if (u->units[i].held) held += u->units[i].end - u->units[i].begin;
    return ((size_t)u->allocated * u->block_floats + held + u->range.shard) * sizeof(float);
}
