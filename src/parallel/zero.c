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
 * reads none), with the next `zero3_prefetch` blocks gathered ahead in the pass's direction
 * while it computes — those of its chunk, then those the schedule's next pass reads first (the
 * pipeline says which, loom_grad_sync_next_pass); the buffer goes back to the pool when the pass
 * is done with
 * the block (zero3_gather "micro_batch"), or at the step's end ("step": gathered once, kept). The
 * held units stay gathered for the step, refreshed from their owners after every update in
 * pieces of about a block, one started beside each block's gather (start_held_piece), waited for
 * where a forward reads them (the final LayerNorm, the LM head); without tensor parallelism the
 * embedding's lookup reads only the owners' ranges (embed_lookup), so the first block need not
 * wait for wte.
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
 * Compression (the plan's compression.dp int8 or bf16 on this stage, after its warm-up steps): a
 * unit's reduce-scatter, the blocks' and the held units', is the quantised one (loom_qreduce,
 * tagged like the unit's ring): each rank quantises the blocks it sends, the owner sums the
 * replicas' decoded blocks and its own unquantised one in fp32, in rank order, so the shard's
 * sums are the same bits whatever arrives first. A plan lives only while its round runs (its wire
 * buffers, about a quarter (int8) or half (bf16) of the unit, are not held between rounds, as the
 * rings borrow their scratch). Under int8 the embeddings' unit stays fp32 when the tied embedding
 * has a copy on another stage: the two stages cut it into different blocks, so int8 would scale
 * the two copies' gradients differently and they would drift apart (bf16 rounds entry by entry:
 * both copies, summed before, get the same bits). ZeRO-3's parameter gathers stay fp32:
 * replicas must hold exact parameters. PowerSGD, top-k and sign are refused by the plan check.
 *
 * Error feedback (the plan's error_feedback): what quantisation dropped from every block a rank
 * sent is kept, per unit, and added to that block the next time the unit is sent (every
 * micro-batch's round). So a compressing rank holds a residual sized like each compressing unit,
 * twice (the committed copy, as of the last accepted step, and the working copy the step
 * updates): 2 x 4 bytes per parameter of the stage, more than the gradient memory ZeRO-2 saves;
 * turn error feedback off to keep ZeRO-2's memory, at some accuracy. A skipped step drops the
 * working copies (loom_unit_sync_commit); checkpoints save the committed ones.
 *
 * Not here: the plain and ZeRO-1 buckets, the loss and norm, ZeRO-1's parameters (grad_sync.c).
 */
#include "parallel_internal.h"

#include "loom/ops.h"

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
    int compress;               /* its rounds are quantised once the step compresses */
    loom_qreduce *qreduce;      /* the quantised round running (NULL: none, or the ring's) */
    float *residual;            /* error feedback: (end - begin) the working residual */
    float *committed;           /* error feedback: (end - begin) as of the last accepted step */
    int residual_live;          /* the working residual was taken from the committed this step */
    /* ZeRO-3, a held unit: its parameters are gathered in `pieces` parts (every rank's bounds
     * cut to each: piece_bounds, pieces x (dp + 1)); the first next_piece have been started */
    int pieces, next_piece;
    int64_t *piece_bounds;
    loom_comm_request **piece_gather; /* (pieces) those in flight */
    int early; /* unit 0: its reduce-scatter started before the step's end (1), collected (2) */
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
    int *chunk_first; /* (model's chunks + 1) chunk c's blocks are units [chunk_first[c] + 1,
                         chunk_first[c + 1] + 1) */
    int next_chunk, next_dir; /* the schedule's next pass that reads parameters (dir 0: none) */
    int64_t gathers, just_in_time; /* all-gathers started; those a pass waited for unprefetched */
    int pass_dir;                  /* the running pass's direction (+1 forward, -1 backward) */
    float **param_pool;            /* free parameter buffers */
    int params_free, params_allocated;
    int stale;         /* the held units' parameters wait for a refresh */
    float *lookup;     /* the embedding lookup's every replica's rows and tokens (embed_lookup) */
    size_t lookup_cap; /* floats */
    loom_comm_ring *lookup_ring; /* ZeRO-3's lookup: the rows' reduce-scatter, for lookup_rows */
    int64_t *lookup_bounds, lookup_rows;
    /* pp 1, tp 1: the lookup's gradients go straight into the shard (embed_lookup_backward), so
     * unit 0's reduce-scatter starts after the step's last LM-head weight gradient */
    int early_embedding, micro_batches, head_backwards;
    /* compression */
    loom_compress_method method; /* int8 or bf16; NONE: every round is the fp32 ring */
    int block;                   /* int8: entries per scale (0: 256) */
    int warmup_steps;            /* the first steps go uncompressed */
    int compressing;             /* this step's rounds are quantised */
    loom_compress_stats stats;   /* since loom_unit_sync_take_stats */
    loom_status error;           /* first failure of the step */
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

/* ZeRO-3: held unit us's parameter buffer and its pieces, about a block each (at least one), with
 * every rank's block of the unit cut to each piece. */
static loom_status make_pieces(loom_unit_sync *u, unit_state *us) {
    size_t n = us->end - us->begin, block = u->block_floats > 0 ? u->block_floats : 1;
    int dp = u->mesh->dp_size;
    us->pieces = n == 0 ? 1 : (int)((n + block - 1) / block);
    us->params = loom_alloc_aligned((n + 1) * sizeof(float), "ZeRO-3 parameters");
    us->piece_bounds = loom_calloc((size_t)us->pieces * ((size_t)dp + 1), sizeof *us->piece_bounds,
                                   "ZeRO-3 pieces");
    us->piece_gather = loom_calloc((size_t)us->pieces, sizeof *us->piece_gather, "ZeRO-3 pieces");
    if (!us->params || !us->piece_bounds || !us->piece_gather) return LOOM_ERR_NOMEM;
    size_t per = (n + (size_t)us->pieces - 1) / (size_t)us->pieces;
    for (int k = 0; k < us->pieces; k++) {
        int64_t lo = (int64_t)(per * (size_t)k), hi = (int64_t)(per * (size_t)(k + 1));
        if (lo > (int64_t)n) lo = (int64_t)n;
        if (hi > (int64_t)n) hi = (int64_t)n;
        for (int r = 0; r <= dp; r++) {
            int64_t at = us->bounds[r] < lo ? lo : us->bounds[r] > hi ? hi : us->bounds[r];
            us->piece_bounds[(size_t)k * ((size_t)dp + 1) + (size_t)r] = at - lo;
        }
    }
    us->next_piece = us->pieces; /* nothing to gather before the first refresh */
    return LOOM_OK;
}

/* Unit i's buffers when it is held (whole for the step), and, for a block, its chunk's layers. */
static loom_status make_unit(loom_unit_sync *u, int i, int *chunk, int *first, int error_feedback) {
    unit_state *us = &u->units[i];
    const loom_gpt *model = u->model;
    us->begin = model->unit_begin[i];
    us->end = model->unit_begin[i + 1];
    us->held = i == 0 || i == u->num_units - 1;
    loom_status st = make_ring(u, i);
    if (st != LOOM_OK) return st;
    /* the tied embedding's two copies must get the same sum: compressed on both its stages or
     * on neither, and then bf16 only, which rounds entry by entry (int8 scales blocks counted
     * from each rank's block of the unit, which the two stages cut differently) */
    const loom_plan_compressor *pc = &u->mesh->plan->dp_compression;
    int tied = i == 0 && u->mesh->embedding;
    int both =
        loom_plan_compresses_stage(pc, 0) && loom_plan_compresses_stage(pc, u->mesh->pp_size - 1);
    us->compress =
        u->method != LOOM_COMPRESS_NONE && (!tied || (both && u->method == LOOM_COMPRESS_BF16));
    if (us->compress && error_feedback && us->end > us->begin) {
        size_t bytes = (us->end - us->begin) * sizeof(float);
        us->residual = loom_alloc_aligned(bytes, "ZeRO error-feedback residual");
        us->committed = loom_alloc_aligned(bytes, "ZeRO error-feedback residual");
        if (!us->residual || !us->committed) return LOOM_ERR_NOMEM;
        memset(us->committed, 0, bytes);
    }
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
    if (!us->writing) return LOOM_ERR_NOMEM;
    return u->zero3 ? make_pieces(u, us) : LOOM_OK;
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
    u->micro_batches = loom_plan_num_micro_batches(mesh->plan);
    /* transfers run beside compute: the responder thread moves them on every millisecond (on
     * a 2 Gbit/s link ZeRO-3 with prefetch measured 0.94x ZeRO-1 with the 10 ms default, 0.97x
     * with 1 ms; bench/zero.sh, docs/results.md) */
    if (mesh->dp_size > 1) loom_comm_set_background_poll(1e-3);
    loom_compress_opts copts = {.method = LOOM_COMPRESS_NONE};
    const loom_plan_compressor *pc = &mesh->plan->dp_compression;
    loom_status st = LOOM_OK;
    if (mesh->dp_size > 1 && loom_plan_compresses_stage(pc, mesh->pp_rank)) {
        st = loom_parallel_compress_opts(pc, LOOM_COMPRESS_FOR_DP, 0, &copts);
        if (st == LOOM_OK && copts.method != LOOM_COMPRESS_INT8 &&
            copts.method != LOOM_COMPRESS_BF16) {
            st = loom_fail(LOOM_ERR_INPUT,
                           "compression.dp.method: %s with mesh.zero %d: not run (ZeRO-2/3 "
                           "compress their reduce-scatters as int8 or bf16 only)",
                           loom_compress_method_name(copts.method), mesh->plan->zero);
        }
        u->method = copts.method, u->block = copts.block, u->warmup_steps = pc->warmup_steps;
    }
    size_t n = (size_t)u->num_units;
    u->units = loom_calloc(n, sizeof *u->units, "ZeRO units");
    u->fifo = loom_calloc(n, sizeof *u->fifo, "ZeRO units");
    u->pool = loom_calloc(2 * n, sizeof *u->pool, "ZeRO buffers");
    u->param_pool = loom_calloc(n, sizeof *u->param_pool, "ZeRO-3 buffers");
    u->bounds = loom_calloc(n * ((size_t)mesh->dp_size + 1), sizeof *u->bounds, "ZeRO bounds");
    u->chunk_first =
        loom_calloc((size_t)model->num_chunks + 1, sizeof *u->chunk_first, "ZeRO units");
    u->shard = loom_alloc_aligned((range.shard > 0 ? range.shard : 1) * sizeof(float),
                                  "ZeRO gradient shard");
    if (st == LOOM_OK && (!u->units || !u->fifo || !u->pool || !u->param_pool || !u->bounds ||
                          !u->shard || !u->chunk_first))
        st = LOOM_ERR_NOMEM;
    for (int c = 0; st == LOOM_OK && c < model->num_chunks; c++)
        u->chunk_first[c + 1] =
            u->chunk_first[c] + model->chunks[c].end_layer - model->chunks[c].first_layer;
    if (st == LOOM_OK && u->zero3 &&
        (model->params_begin != range.begin || model->params_end != range.end)) {
        st = loom_fail(LOOM_ERR_RUNTIME,
                       "ZeRO-3: the model keeps parameters [%zu, %zu), the shard is [%zu, %zu)",
                       model->params_begin, model->params_end, range.begin, range.end);
    }
    int chunk = 0, first = 0;
    for (int i = 0; st == LOOM_OK && i < u->num_units; i++)
        st = make_unit(u, i, &chunk, &first, copts.error_feedback);
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
    loom_comm_set_background_poll(0); /* the default again */
    for (int i = 0; u->units && i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        loom_comm_ring_wait(us->ring);
        loom_comm_ring_free(us->ring);
        if (us->qreduce) loom_qreduce_wait(us->qreduce);
        loom_qreduce_free(us->qreduce);
        loom_free_aligned(us->residual);
        loom_free_aligned(us->committed);
        if (us->gather) loom_comm_wait(us->gather);
        for (int k = 0; us->piece_gather && k < us->pieces; k++)
            if (us->piece_gather[k]) loom_comm_wait(us->piece_gather[k]);
        free(us->piece_gather);
        free(us->piece_bounds);
        loom_free_aligned(us->writing);
        if (us->sending != us->writing) loom_free_aligned(us->sending);
        loom_free_aligned(us->scratch);
        loom_free_aligned(us->params);
    }
    for (int i = 0; u->pool && i < u->num_free; i++) loom_free_aligned(u->pool[i]);
    for (int i = 0; u->param_pool && i < u->params_free; i++) loom_free_aligned(u->param_pool[i]);
    loom_free_aligned(u->shard);
    loom_free_aligned(u->lookup);
    if (u->lookup_ring) loom_comm_ring_wait(u->lookup_ring);
    loom_comm_ring_free(u->lookup_ring);
    free(u->lookup_bounds);
    free(u->bounds);
    free(u->chunk_first);
    free(u->param_pool);
    free(u->pool);
    free(u->fifo);
    free(u->units);
    free(u);
}

/* ---- gradients ------------------------------------------------------------------------------ */

static void complete_oldest(loom_unit_sync *u);

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

/* A unit's round: the quantised reduce-scatter when one runs, else its ring. */
static loom_status round_test(unit_state *us, int *done) {
    return us->qreduce ? loom_qreduce_test(us->qreduce, done) : loom_comm_ring_test(us->ring, done);
}

static loom_status round_wait(unit_state *us) {
    return us->qreduce ? loom_qreduce_wait(us->qreduce) : loom_comm_ring_wait(us->ring);
}

/* Error feedback: the unit's working residual, taken from the committed one at its first round
 * of the step (later rounds, the step's further micro-batches, go on from the working one). */
static float *working_residual(unit_state *us) {
    if (!us->residual) return NULL;
    if (!us->residual_live) {
        memcpy(us->residual, us->committed, (us->end - us->begin) * sizeof(float));
        us->residual_live = 1;
    }
    return us->residual;
}

/* Squared norm of x outside this rank's block of the unit: what the rank quantised and sent. */
static double sent_sq(const unit_state *us, const float *x) {
    const loom_backend *cpu = loom_backend_cpu();
    return cpu->sum_squares(x, (int64_t)us->own_lo) +
           cpu->sum_squares(x + us->own_hi, (int64_t)(us->end - us->begin - us->own_hi));
}

/* Starts unit i's quantised reduce-scatter of us->sending; counts the bytes it saves against the
 * fp32 ring (which sends every block but this rank's). */
static void start_quantised(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    double t0 = loom_now();
    float *residual = working_residual(us);
    u->stats.input_sq += sent_sq(us, us->sending);
    loom_status st =
        loom_qreduce_create(u->mesh->dp, us->bounds, u->method, u->block, i, &us->qreduce);
    if (st == LOOM_OK) st = loom_qreduce_reduce_scatter_start(us->qreduce, us->sending, residual);
    if (st == LOOM_OK) {
        int64_t ring =
            (int64_t)((us->end - us->begin) - (us->own_hi - us->own_lo)) * (int64_t)sizeof(float);
        u->stats.dp_bytes_saved +=
            ring -
            loom_qreduce_bytes_sent(us->qreduce, LOOM_QREDUCE_REDUCE_SCATTER, u->mesh->dp_rank);
        if (residual) u->stats.residual_sq += sent_sq(us, residual);
    } else {
        loom_qreduce_free(us->qreduce); /* not running: the step fails with st */
        us->qreduce = NULL;
        keep_error(u, st);
    }
    u->stats.compress_s += loom_now() - t0;
}

/* Starts unit i's reduce-scatter of us->sending: quantised when the step compresses and the unit
 * does, else the fp32 ring (a block's borrowing its scratch from the pool). */
static void start_round(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    if (u->compressing && us->compress) {
        start_quantised(u, i);
    } else if (us->held) {
        keep_error(u, loom_comm_ring_start(us->ring, us->sending));
    } else {
        us->scratch = take_buffer(u);
        keep_error(u, loom_comm_ring_start_in(us->ring, us->sending, us->scratch));
    }
}

/* This rank's block of unit i's sum into the shard. */
static void add_own(loom_unit_sync *u, int i, const float *sum) {
    unit_state *us = &u->units[i];
    float *dst = u->shard + (us->begin + us->own_lo - u->range.begin);
    const float *src = sum + us->own_lo;
    for (size_t k = 0; k < us->own_hi - us->own_lo; k++) dst[k] += src[k];
}

/* Unit i's round has completed: its block of the sum into the shard (unit 0's early round:
 * later, loom_unit_sync_finish), the buffers back to the pool (a held unit keeps its own), the
 * quantised round's plan freed. */
static void collect(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    if (us->early == 1) {
        us->early = 2;
    } else {
        add_own(u, i, us->sending);
    }
    if (!us->held) {
        u->pool[u->num_free++] = us->sending;
        if (us->scratch) u->pool[u->num_free++] = us->scratch;
    }
    us->sending = us->scratch = NULL;
    loom_qreduce_free(us->qreduce);
    us->qreduce = NULL;
}

/* Waits for the oldest running round and collects it. */
static void complete_oldest(loom_unit_sync *u) {
    int i = u->fifo[u->fifo_head];
    u->fifo_head = (u->fifo_head + 1) % u->num_units;
    u->fifo_len--;
    keep_error(u, round_wait(&u->units[i]));
    collect(u, i);
}

/* Moves running rings and gathers on without waiting (MPI moves them only inside its calls);
 * collects, in start order, the rings at the front that have completed. */
static void poke(loom_unit_sync *u) {
    for (int k = 0; k < u->fifo_len; k++) {
        int done = 0;
        keep_error(u, round_test(&u->units[u->fifo[(u->fifo_head + k) % u->num_units]], &done));
        if (k == 0 && done) {
            complete_oldest(u);
            k = -1; /* the new front */
        }
    }
    for (int i = 0; u->zero3 && i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        for (int k = 0; k < us->next_piece; k++) {
            int done = 0;
            if (!us->piece_gather[k]) continue;
            keep_error(u, loom_comm_test(us->piece_gather[k], &done));
            if (done) us->piece_gather[k] = NULL;
        }
        int done = 0;
        if (!us->gather) continue;
        keep_error(u, loom_comm_test(us->gather, &done));
        if (done) us->gather = NULL;
    }
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
    us->sending = us->writing;
    us->writing = NULL;
    start_round(u, i);
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
    u->gathers++;
}

/* Starts the next piece of the held units' gathers (the embeddings' first, then the final
 * LayerNorm's), if any is left: one beside each block's gather, so that they cross the wire
 * while the blocks compute. */
static void start_held_piece(loom_unit_sync *u) {
    int dp = u->mesh->dp_size;
    for (int i = 0; i < u->num_units; i += u->num_units - 1) {
        unit_state *us = &u->units[i];
        if (us->next_piece >= us->pieces) continue;
        int k = us->next_piece++;
        const int64_t *bounds = us->piece_bounds + (size_t)k * ((size_t)dp + 1);
        size_t lo = (us->end - us->begin + (size_t)us->pieces - 1) / (size_t)us->pieces * (size_t)k;
        keep_error(u, loom_comm_iallgatherv_f32(u->mesh->dp, us->params + lo, bounds,
                                                &us->piece_gather[k]));
        return;
    }
}

/* Held unit i's parameters, every piece gathered (those not started yet start now). */
static void wait_held(loom_unit_sync *u, int i) {
    unit_state *us = &u->units[i];
    while (us->next_piece < us->pieces) start_held_piece(u);
    for (int k = 0; k < us->pieces; k++) {
        if (us->piece_gather[k]) keep_error(u, loom_comm_wait(us->piece_gather[k]));
        us->piece_gather[k] = NULL;
    }
}

/* Whether block unit i, the running pass's last, is the one the next pass reads first (the
 * pass turns on it: the forward's last block is the backward's first, and back). */
static int turns_on(const loom_unit_sync *u, int i) {
    const unit_state *us = &u->units[i];
    if (u->next_dir == 0 || i != (u->pass_dir > 0 ? us->end_layer : us->first_layer + 1)) return 0;
    int c = u->next_chunk;
    return i == (u->next_dir > 0 ? u->chunk_first[c] + 1 : u->chunk_first[c + 1]);
}

/* Block unit i's parameters, gathered and handed to the model; the next `prefetch` blocks in
 * the pass's direction (dir +1 forward, -1 backward) start gathering: those of its chunk, then,
 * past the chunk's end, the first ones of the next pass the schedule runs
 * (loom_unit_sync_next_pass). A block already there or on its way is left as it is. */
static void params_begin(loom_unit_sync *u, int i, int dir) {
    unit_state *us = &u->units[i];
    if (!us->params) u->just_in_time++;
    u->pass_dir = dir;
    start_gather(u, i);
    int ahead = 0;
    for (; ahead < u->prefetch; ahead++) {
        int next = i + dir * (ahead + 1), layer = next - 1;
        if (layer < us->first_layer || layer >= us->end_layer) break;
        start_gather(u, next);
    }
    if (u->next_dir != 0) { /* the block in use, where the next pass starts, stays (unit_event) */
        int lo = u->chunk_first[u->next_chunk] + 1, hi = u->chunk_first[u->next_chunk + 1] + 1;
        for (int k = 0; ahead < u->prefetch && k < hi - lo; k++) {
            int next = u->next_dir > 0 ? lo + k : hi - 1 - k;
            if (next != i) start_gather(u, next), ahead++;
        }
    }
    start_held_piece(u);
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

void loom_unit_sync_next_pass(loom_unit_sync *u, int chunk, int dir) {
    int ok = dir != 0 && chunk >= 0 && chunk < u->model->num_chunks;
    u->next_chunk = ok ? chunk : 0, u->next_dir = ok ? dir : 0;
}

/* After an update: the gathered blocks go (stale), and the held units take this rank's block
 * of theirs from the shard; their gathers start piece by piece beside the next passes' block
 * gathers (start_held_piece), and a pass waits for them only where it reads them. */
loom_status loom_unit_sync_refresh(loom_unit_sync *u) {
    if (!u->zero3) return LOOM_OK;
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (!us->held) { /* kept for the step: stale after an update */
            params_free(u, i);
            continue;
        }
        wait_held(u, i); /* the last round's pieces, if a stage never read them */
        own_block(u, us, us->params);
        us->next_piece = 0;
    }
    u->stale = 0;
    loom_status st = u->error;
    u->error = LOOM_OK;
    return st;
}

void loom_unit_sync_wait_params(loom_unit_sync *u) {
    if (!u->zero3) return;
    wait_held(u, 0);
    wait_held(u, u->num_units - 1);
}

/* ---- the embedding's lookup where wte is sharded (no tensor parallelism) --------------------- */

/* The part of a row of C entries at unit offset `at` that this rank owns: unit offsets [lo, hi)
 * (empty when lo >= hi). */
typedef struct {
    size_t at, lo, hi;
} own_part;

static own_part part_of(const unit_state *us, size_t at, size_t C) {
    own_part p = {at, at > us->own_lo ? at : us->own_lo, at + C < us->own_hi ? at + C : us->own_hi};
    return p;
}

/* Waits for a collective the lookup started while moving the running rounds on: a peer may be
 * waiting for one of them (a ring moves on a rank only when it tests it) before it joins. */
static void wait_moving(loom_unit_sync *u, loom_comm_request *request, loom_comm_ring *ring) {
    for (int done = 0; !done;) {
        poke(u);
        loom_status st =
            request ? loom_comm_test(request, &done) : loom_comm_ring_test(ring, &done);
        if (st != LOOM_OK) {
            keep_error(u, st);
            return;
        }
    }
}

/* All-gathers every rank's count floats (this rank's at buf + rank x count) into buf. */
static void allgather_moving(loom_unit_sync *u, float *buf, size_t count) {
    loom_comm_request *request = NULL;
    float *mine = buf + (size_t)u->mesh->dp_rank * count;
    loom_status st = loom_comm_iallgather_f32(u->mesh->dp, mine, buf, (int64_t)count, &request);
    if (st == LOOM_OK) wait_moving(u, request, NULL);
    keep_error(u, st);
}

/* One lookup call (either direction): the buffer of every replica's rows (dp N C floats, `rows`)
 * and tokens (dp N), grown as needed, with this replica's tokens gathered with every other's (as
 * floats: ids under 2^24 are exact). */
typedef struct {
    size_t dp, C, N, T;
    float *rows, *tokens;
} lookup_call;

static lookup_call lookup_begin(loom_unit_sync *u, const int32_t *inputs, int B, int T) {
    lookup_call c = {(size_t)u->mesh->dp_size,
                     (size_t)u->model->config.channels,
                     (size_t)B * (size_t)T,
                     (size_t)T,
                     NULL,
                     NULL};
    size_t need = c.dp * c.N * c.C + c.dp * c.N;
    if (need > u->lookup_cap) {
        loom_free_aligned(u->lookup);
        u->lookup = loom_alloc_aligned(need * sizeof(float), "ZeRO embedding lookup");
        if (!u->lookup) loom_comm_abort(1, "out of memory for ZeRO's embedding lookup");
        u->lookup_cap = need;
    }
    c.rows = u->lookup, c.tokens = u->lookup + c.dp * c.N * c.C;
    float *mine = c.tokens + (size_t)u->mesh->dp_rank * c.N;
    for (size_t n = 0; n < c.N; n++) mine[n] = (float)inputs[n];
    allgather_moving(u, c.tokens, c.N);
    return c;
}

/* The parts this rank owns of the wte row and the wpe row that replica row n (of dp N) reads. */
static void row_parts(const loom_unit_sync *u, const lookup_call *c, size_t n, own_part *w,
                      own_part *p) {
    const unit_state *us = &u->units[0];
    const loom_gpt_tensor_info *info = u->model->info;
    *w = part_of(us, info[LOOM_WTE].offset - us->begin + (size_t)c->tokens[n] * c->C, c->C);
    *p = part_of(us, info[LOOM_WPE].offset - us->begin + n % c->N % c->T * c->C, c->C);
    if (info[LOOM_WPE].numel == 0) p->lo = p->hi = 0; /* Llama: rotary positions, no wpe */
}

/* ZeRO-3's embedding forward without wte gathered: this rank writes, for every replica's rows,
 * the entries of their wte and wpe rows it owns (zeros elsewhere), and a reduce-scatter hands
 * each replica the sums of its rows. Each entry of wte and of wpe has one owner, so an output is
 * wte + wpe added once, as the gathered lookup adds them: the same bits, for (dp - 1) B T C
 * floats sent, while the embeddings' gather has until the LM head to arrive. */
static void embed_lookup(void *ctx, float *out, const int32_t *inputs, int B, int T) {
    loom_unit_sync *u = ctx;
    const unit_state *us = &u->units[0];
    lookup_call c = lookup_begin(u, inputs, B, T);
    size_t N = c.N, C = c.C;
    float *rows = c.rows;
    memset(rows, 0, c.dp * N * C * sizeof(float));
    for (size_t n = 0; us->own_lo < us->own_hi && n < c.dp * N; n++) {
        /* this rank's entries, unit offsets [own_lo, own_hi), from its shard */
        const float *own = u->model->params_memory + (us->begin + us->own_lo - u->range.begin);
        float *row = rows + n * C;
        own_part w, p;
        row_parts(u, &c, n, &w, &p);
        for (size_t k = w.lo; k < w.hi; k++) row[k - w.at] = own[k - us->own_lo];
        for (size_t k = p.lo; k < p.hi; k++) row[k - p.at] += own[k - us->own_lo];
    }
    /* the reduce-scatter of equal blocks, one per replica: a ring of its own (tagged past the
     * units'), made again when the rows change */
    int dpi = u->mesh->dp_size;
    if (!u->lookup_ring || u->lookup_rows != (int64_t)N) {
        loom_comm_ring_free(u->lookup_ring);
        u->lookup_ring = NULL;
        if (!u->lookup_bounds)
            u->lookup_bounds = loom_calloc((size_t)dpi + 1, sizeof *u->lookup_bounds, "ZeRO-3");
        if (!u->lookup_bounds) loom_comm_abort(1, "out of memory for ZeRO-3's embedding lookup");
        for (int r = 0; r <= dpi; r++) u->lookup_bounds[r] = (int64_t)(N * C) * r;
        keep_error(
            u, loom_comm_ring_create(u->mesh->dp, u->lookup_bounds, u->num_units, &u->lookup_ring));
        u->lookup_rows = (int64_t)N;
    }
    if (u->lookup_ring) {
        loom_status st = loom_comm_ring_start(u->lookup_ring, rows);
        if (st == LOOM_OK) wait_moving(u, NULL, u->lookup_ring);
        keep_error(u, st);
    }
    memcpy(out, rows + (size_t)u->mesh->dp_rank * N * C, N * C * sizeof(float));
}

/* ZeRO-2/3's embedding backward (pp 1): every replica's output gradient rows are gathered, and
 * this rank adds, replica by replica and row by row, the entries that fall in its range of wte's
 * and wpe's gradients straight into its shard. (dp - 1) B T C floats are sent, and unit 0's
 * whole-size buffer holds only the LM head's gradient, whose reduce-scatter can then start after
 * the step's last head backward instead of after the whole backward. */
static void embed_lookup_backward(void *ctx, const float *dout, const int32_t *inputs, int B,
                                  int T) {
    loom_unit_sync *u = ctx;
    const unit_state *us = &u->units[0];
    lookup_call c = lookup_begin(u, inputs, B, T);
    memcpy(c.rows + (size_t)u->mesh->dp_rank * c.N * c.C, dout, c.N * c.C * sizeof(float));
    allgather_moving(u, c.rows, c.N * c.C);
    for (size_t n = 0; us->own_lo < us->own_hi && n < c.dp * c.N; n++) {
        float *grads = u->shard + (us->begin + us->own_lo - u->range.begin);
        const float *row = c.rows + n * c.C;
        own_part w, p;
        row_parts(u, &c, n, &w, &p);
        for (size_t k = w.lo; k < w.hi; k++) grads[k - us->own_lo] += row[k - w.at];
        for (size_t k = p.lo; k < p.hi; k++) grads[k - us->own_lo] += row[k - p.at];
    }
}

/* Unit 0's reduce-scatter, started after the step's last LM-head weight gradient (its buffer
 * then holds the head's gradient only: the lookup's went into the shard). */
static void start_embedding_early(loom_unit_sync *u) {
    unit_state *us = &u->units[0];
    if (!u->early_embedding || us->early || ++u->head_backwards < u->micro_batches) return;
    us->sending = us->writing;
    us->early = 1;
    start_round(u, 0);
    u->fifo[(u->fifo_head + u->fifo_len) % u->num_units] = 0;
    u->fifo_len++;
}

/* ---- the hook and the step ------------------------------------------------------------------- */

static void unit_event(void *ctx, int i, int event) {
    loom_unit_sync *u = ctx;
    if (event == LOOM_GPT_UNIT_PROGRESS) {
        poke(u);
        return;
    }
    if (u->units[i].held) {
        if (u->zero3 && event == LOOM_GPT_UNIT_PARAMS_FORWARD) wait_held(u, i);
        if (i == 0 && event == LOOM_GPT_UNIT_GRADS_DONE) start_embedding_early(u);
        return;
    }
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
    case LOOM_GPT_UNIT_PARAMS_DONE: /* kept when the next pass starts with it (the pass turns) */
        if (u->zero3 && !u->keep_for_step && !turns_on(u, i)) params_free(u, i);
        break;
    default:
        break;
    }
    poke(u);
}

void loom_unit_sync_attach(loom_unit_sync *u) {
    loom_gpt_set_unit_events(u->model, unit_event, u);
    const loom_mesh *mesh = u->mesh;
    int lookup = mesh->tp_size == 1 && mesh->dp_size > 1 && u->model->has_embedding;
    /* (an untied head's gradient is not wte's: nothing to start early) */
    u->early_embedding =
        lookup && mesh->pp_size == 1 && u->model->has_head && !u->model->config.untied_head;
    loom_gpt_set_embed_lookup(u->model, lookup && u->zero3 ? embed_lookup : NULL,
                              u->early_embedding ? embed_lookup_backward : NULL, u);
}

void loom_unit_sync_zero(loom_unit_sync *u, int64_t step) {
    if (u->stale) keep_error(u, loom_unit_sync_refresh(u));
    u->compressing = u->method != LOOM_COMPRESS_NONE && step >= u->warmup_steps;
    memset(u->shard, 0, u->range.shard * sizeof(float));
    u->head_backwards = 0;
    u->units[0].early = 0;
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (us->held) memset(us->writing, 0, (us->end - us->begin) * sizeof(float));
    }
}

loom_status loom_unit_sync_finish(loom_unit_sync *u, loom_comm *embedding) {
    while (u->fifo_len > 0) complete_oldest(u);
    /* unit 0's early round (start_embedding_early), collected in the queue's order like the
     * blocks' but added to the shard only now, after every lookup gradient went into the same
     * entries: the sums' order, and so their bits, do not depend on when it completed */
    if (u->units[0].early == 2 && u->error == LOOM_OK) add_own(u, 0, u->units[0].writing);
    /* the tied embedding's two copies (first and last stage) sum before their reduce-scatter */
    const loom_gpt_tensor_info *wte = &u->model->info[LOOM_WTE];
    if (embedding && u->error == LOOM_OK) {
        keep_error(u, loom_comm_allreduce_f32(embedding, u->units[0].writing + wte->offset,
                                              wte->numel, LOOM_REDUCE_SUM));
    }
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (!us->held || us->early || u->error != LOOM_OK) continue;
        us->sending = us->writing;
        start_round(u, i);
        keep_error(u, round_wait(us));
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
    size_t lookup = u->lookup_cap + (size_t)u->lookup_rows * (size_t)u->model->config.channels;
    return ((size_t)u->allocated * u->block_floats + held_floats(u) + u->range.shard + lookup) *
           sizeof(float);
}

size_t loom_unit_sync_param_bytes(const loom_unit_sync *u) {
    if (!u->zero3) return 0;
    return ((size_t)u->params_allocated * u->block_floats + held_floats(u)) * sizeof(float);
}

void loom_unit_sync_gather_counts(const loom_unit_sync *u, int64_t *gathers,
                                  int64_t *just_in_time) {
    *gathers = u->gathers, *just_in_time = u->just_in_time;
}

const float *loom_unit_sync_held_params(loom_unit_sync *u, int k, size_t *floats) {
    loom_unit_sync_wait_params(u);
    const unit_state *us = &u->units[k == 0 ? 0 : u->num_units - 1];
    *floats = us->end - us->begin;
    return us->params;
}

/* ---- compression's state and counters -------------------------------------------------------- */

void loom_unit_sync_commit(loom_unit_sync *u, int accept) {
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (us->residual_live && accept) {
            float *kept = us->committed;
            us->committed = us->residual, us->residual = kept;
        }
        us->residual_live = 0;
    }
}

void loom_unit_sync_take_stats(loom_unit_sync *u, loom_compress_stats *stats) {
    stats->dp_bytes_saved += u->stats.dp_bytes_saved;
    stats->compress_s += u->stats.compress_s;
    stats->residual_sq += u->stats.residual_sq;
    stats->input_sq += u->stats.input_sq;
    memset(&u->stats, 0, sizeof u->stats);
}

int loom_unit_sync_residual_count(const loom_unit_sync *u) {
    int n = 0;
    for (int i = 0; i < u->num_units; i++) n += u->units[i].committed != NULL;
    return n;
}

float *loom_unit_sync_residual(loom_unit_sync *u, int k, int *unit, size_t *floats) {
    for (int i = 0; i < u->num_units; i++) {
        unit_state *us = &u->units[i];
        if (!us->committed || k-- > 0) continue;
        *unit = i, *floats = us->end - us->begin;
        return us->committed;
    }
    return NULL;
}

size_t loom_unit_sync_state_bytes(const loom_unit_sync *u) {
    size_t bytes = 0;
    for (int i = 0; i < u->num_units; i++) {
        const unit_state *us = &u->units[i];
        if (us->committed) bytes += 2 * (us->end - us->begin) * sizeof(float);
    }
    return bytes;
}
