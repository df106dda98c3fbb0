/*
 * pipeline.c — the executor of this rank's schedule: one step's micro-batches through forward
 * and backward of each of its chunks (virtual stages), activations and their gradients point to
 * point to the ranks of the neighbouring virtual stages, or handed over inside the rank where
 * the neighbour is here too (zb-v's turn). Sends are non-blocking from a pool of wire buffers
 * (the oldest completed first when the pool is empty, and all of them at the end of the step);
 * receives wait at their place in the list, which cannot deadlock (see the contract in
 * loom/parallel.h). With one virtual stage the schedule is forward, backward, forward, ...:
 * plain gradient accumulation.
 *
 * Buffers are pooled by what is in flight, as the list says: a chunk activation set (model slot)
 * from its FORWARD to its BACKWARD or BACKWARD_WEIGHT; a received (or handed-over) input until
 * its FORWARD (with recomputation until its backward); a received output gradient until its
 * backward. The pools' sizes come from walking the list once at creation with the same rules.
 *
 * Every activation or activation gradient that crosses to another rank goes through encode_send
 * and recv_decode. Activation gradients sent backward are compressed there (Optimus-CC's
 * compressed backpropagation, the plan's compression.pp) on the boundaries and sends the plan
 * selects: policy "all" or "epilogue" (the sender's cool-down sends), decided from the schedules
 * alone, or "slack", decided after every step from every rank's measured durations by the same
 * simulation on every rank; so both ends of a message know whether it is compressed and how long
 * it is. A sending chunk's residual (lazy error propagation) goes into its next compressed send,
 * never into the same micro-batch's.
 *
 * Not here: the schedules themselves (schedule.c), gradient synchronisation (grad_sync.c).
 */
#include "loom/parallel.h"

#include <stdlib.h>
#include <string.h>

enum { TAG_ACT = 1, TAG_GRAD = 2, TAG_PING = 3 };
enum { KIND_ACT = 0, KIND_GRAD = 1 }; /* what a message carries */

/* Measured per chunk for the slack policy, shared as one row per virtual stage. */
enum {
    SLACK_FORWARD,
    SLACK_BACKWARD,
    SLACK_INPUT,
    SLACK_WEIGHT,
    SLACK_ENCODE,
    SLACK_DECODE,
    SLACK_TIMED, /* the fields above are means of timed events */
    SLACK_RAW = SLACK_TIMED,
    SLACK_COMPRESSED,
    SLACK_FIELDS
};

/* Indices of a pool (buffers or slots) handed to (chunk, micro-batch) keys. */
typedef struct {
    int *of;   /* (keys) the index a key holds, -1 */
    int *free; /* (size) stack of free indices */
    int top, size;
} pool;

/* One of this rank's chunks. */
typedef struct {
    int stage;           /* its virtual stage */
    int below, above;    /* ranks of the neighbouring stages across a link; -1: none, or here */
    int local_below;     /* the chunk of the stage below when it is on this rank, else -1 */
    int local_above;     /* ... above */
    int embedding, head; /* the model's first / last virtual stage */
    int last_weight;     /* the action that finishes its weight gradients in the step */
    loom_compressor *encoder[2]; /* what it sends (activations up, gradients down); NULL: as is */
    loom_compressor *decoder[2]; /* what it receives */
    unsigned char *encode_mb[2], *decode_mb[2]; /* (m) which sends / receives are compressed */
    void *wire[2];                              /* (decoder's wire bytes) a message received */
    double sum[SLACK_TIMED], mean[SLACK_TIMED]; /* seconds this step; the last step's means */
    int count[SLACK_TIMED];
    double link_raw_s, link_comp_s; /* one gradient down its link as it is and compressed */
} chunk_state;

struct loom_pipeline {
    const loom_mesh *mesh;
    loom_gpt *model;
    int B, T;
    loom_pipe_shape shape;             /* kind, p, v, m */
    int micro_batches, chunks, stages; /* m, v, V */
    loom_pipe_stage_schedule schedule; /* this rank's actions for one step */
    int split;                         /* the list splits backward into B and W */
    int recompute;                     /* activations rebuilt in backward from the kept input
                                        * (full recomputation; LOOM_RECOMPUTE_* or NONE) */
    int selective;                     /* slots keep all but the attention's softmax, which the
                                        * model recomputes in backward (LOOM_RECOMPUTE_SELECTIVE) */
    int last_forward;                  /* the key whose activations the model holds (recompute) */
    chunk_state *chunk;                /* (v) */
    pool slots, inputs, grads;         /* model activation sets; act_in and grad_in buffers */
    pool kept;                         /* recomputation with split backward: what B leaves W */
    float *kept_buf;                   /* (kept.size, kept_floats) */
    size_t kept_floats;                /* the largest chunk's loom_gpt_weight_state_floats */
    int in_flight;                     /* peak chunk activations (what the slots pool holds) */
    float *act_in;                     /* (inputs.size, B, T, C) activations received */
    float *grad_in;                    /* (grads.size, B, T, C) output gradients received */
    float *send_buf;                   /* (2, wires, B, T, C) outgoing messages */
    loom_comm_request **send_req;      /* (2, wires) their non-blocking sends */
    int wires, next_wire[2];           /* wire buffers per kind; the next to use (round robin) */
    loom_trace *trace;                 /* NULL: not tracing */
    int64_t trace_step;                /* the step being trained, for the trace's spans */
    loom_compress_stats stats;
    /* policy "slack" */
    int slack;
    loom_pipe_stage_schedule *schedules; /* (p) every rank's list */
    double *table;                       /* (V, SLACK_FIELDS) every virtual stage's figures */
    double *times;                       /* (6, V) the simulator's arrays */
    unsigned char *choice;               /* (V, m) which gradient sends compress */
};

/* Rows of a micro-batch's activation on this rank (B*T, or B*T/tp under sequence parallelism:
 * each TP rank sends and receives its own rows). */
static int64_t rows_of(const loom_pipeline *p) {
    return loom_gpt_rows(p->model, p->B, p->T);
}

/* Floats of a micro-batch's activation (or its gradient) on this rank. */
static size_t btc_of(const loom_pipeline *p) {
    return (size_t)rows_of(p) * (size_t)p->model->config.channels;
}

static int key_of(const loom_pipeline *p, int chunk, int mb) {
    return chunk * p->micro_batches + mb;
}

/* ---- pools ---------------------------------------------------------------------------------- */

static loom_status pool_init(pool *pl, int keys, int size, const char *what) {
    pl->of = loom_malloc((size_t)keys * sizeof(int) + 1, what);
    pl->free = loom_malloc((size_t)size * sizeof(int) + 1, what);
    if (!pl->of || !pl->free) return LOOM_ERR_NOMEM;
    for (int k = 0; k < keys; k++) pl->of[k] = -1;
    pl->size = size, pl->top = 0;
    for (int i = size - 1; i >= 0; i--) pl->free[pl->top++] = i;
    return LOOM_OK;
}

static void pool_free(pool *pl) {
    free(pl->of), free(pl->free);
    pl->of = pl->free = NULL;
}

static int pool_take(pool *pl, int key, const char *what) {
    if (pl->of[key] >= 0) return pl->of[key];
    if (pl->top == 0) loom_fatal("pipeline: no free %s for key %d (a schedule bug)", what, key);
    return pl->of[key] = pl->free[--pl->top];
}

static void pool_drop(pool *pl, int key) {
    if (pl->of[key] < 0) return;
    pl->free[pl->top++] = pl->of[key];
    pl->of[key] = -1;
}

/* The pools an action fills and empties: per pool (POOL_INPUTS, POOL_GRADS, POOL_KEPT) the key
 * it takes (before the action fills the buffer) and the key it drops (after it used it), -1 for
 * none. The one statement of the rule, for the dry run at creation and for the step. */
enum { POOL_INPUTS, POOL_GRADS, POOL_KEPT, POOLS };
typedef struct {
    int take[POOLS], drop[POOLS];
} pool_events;

static pool_events events_of(const loom_pipeline *p, loom_pipe_action a) {
    const chunk_state *ch = &p->chunk[a.chunk];
    int key = key_of(p, a.chunk, a.micro_batch);
    int keep_for_w = p->recompute && p->split; /* inputs and B's results live until W */
    pool_events e = {{-1, -1, -1}, {-1, -1, -1}};
    switch (a.op) {
    case LOOM_PIPE_RECV_ACT:
        e.take[POOL_INPUTS] = key;
        break;
    case LOOM_PIPE_FORWARD:
        if (ch->local_above >= 0) e.take[POOL_INPUTS] = key_of(p, ch->local_above, a.micro_batch);
        if (!ch->embedding && !p->recompute) e.drop[POOL_INPUTS] = key;
        break;
    case LOOM_PIPE_RECV_GRAD:
        e.take[POOL_GRADS] = key;
        break;
    case LOOM_PIPE_BACKWARD:
    case LOOM_PIPE_BACKWARD_INPUT:
        if (ch->local_below >= 0) e.take[POOL_GRADS] = key_of(p, ch->local_below, a.micro_batch);
        if (!ch->head) e.drop[POOL_GRADS] = key;
        if (!ch->embedding && p->recompute && !keep_for_w) e.drop[POOL_INPUTS] = key;
        if (keep_for_w) e.take[POOL_KEPT] = key;
        break;
    case LOOM_PIPE_BACKWARD_WEIGHT:
        if (!ch->embedding && keep_for_w) e.drop[POOL_INPUTS] = key;
        if (keep_for_w) e.drop[POOL_KEPT] = key;
        break;
    default:
        break;
    }
    return e;
}

static pool *pool_at(loom_pipeline *p, int which) {
    return which == POOL_INPUTS ? &p->inputs : which == POOL_GRADS ? &p->grads : &p->kept;
}

static void pools_take(loom_pipeline *p, const pool_events *e) {
    static const char *const what[POOLS] = {"input buffer", "gradient buffer", "kept buffer"};
    for (int i = 0; i < POOLS; i++)
        if (e->take[i] >= 0) pool_take(pool_at(p, i), e->take[i], what[i]);
}

static void pools_drop(loom_pipeline *p, const pool_events *e) {
    for (int i = 0; i < POOLS; i++)
        if (e->drop[i] >= 0) pool_drop(pool_at(p, i), e->drop[i]);
}

static float *kept_of(loom_pipeline *p, int chunk, int mb) {
    int i = p->kept.of[key_of(p, chunk, mb)];
    return i >= 0 ? p->kept_buf + (size_t)i * p->kept_floats : NULL;
}

static float *input_of(loom_pipeline *p, int chunk, int mb) {
    int i = p->inputs.of[key_of(p, chunk, mb)];
    return i >= 0 ? p->act_in + (size_t)i * btc_of(p) : NULL;
}

static float *grad_of(loom_pipeline *p, int chunk, int mb) {
    int i = p->grads.of[key_of(p, chunk, mb)];
    return i >= 0 ? p->grad_in + (size_t)i * btc_of(p) : NULL;
}

/* ---- the slack policy ----------------------------------------------------------------------- */

/* Blocking round trips of a gradient-sized message down every compressed boundary, as it is
 * and compressed; the sender keeps the fastest of three of each (transfer plus latency). Every
 * rank walks the boundaries in one order, so each pair meets when both are there. */
static loom_status measure_links(loom_pipeline *p, int64_t raw) {
    int me = p->mesh->pp_rank;
    char ack = 0;
    loom_status st = LOOM_OK;
    for (int b = 0; b + 1 < p->stages && st == LOOM_OK; b++) {
        int sender, receiver, sc, rc;
        loom_pipe_place(&p->shape, b + 1, &sender, &sc);
        loom_pipe_place(&p->shape, b, &receiver, &rc);
        if (sender == receiver || (me != sender && me != receiver)) continue;
        chunk_state *ch = &p->chunk[me == sender ? sc : rc];
        loom_compressor *c = me == sender ? ch->encoder[KIND_GRAD] : ch->decoder[KIND_GRAD];
        if (!c) continue;
        int64_t compressed = (int64_t)loom_compressor_wire_bytes(c);
        double best[2] = {1e30, 1e30};
        for (int rep = 0; rep < 6 && st == LOOM_OK; rep++) {
            int64_t bytes = rep % 2 ? compressed : raw;
            double t0 = loom_now();
            if (me == sender) {
                st = loom_comm_send(p->mesh->pp, p->send_buf, bytes, receiver, TAG_PING);
                if (st == LOOM_OK) st = loom_comm_recv(p->mesh->pp, &ack, 1, receiver, TAG_PING);
            } else {
                st = loom_comm_recv(p->mesh->pp, p->send_buf, bytes, sender, TAG_PING);
                if (st == LOOM_OK) st = loom_comm_send(p->mesh->pp, &ack, 1, sender, TAG_PING);
            }
            double dt = loom_now() - t0;
            if (dt < best[rep % 2]) best[rep % 2] = dt;
        }
        if (me == sender) ch->link_raw_s = best[0], ch->link_comp_s = best[1];
    }
    return st;
}

static loom_status slack_create(loom_pipeline *p) {
    int pp = p->mesh->pp_size, V = p->stages, m = p->micro_batches;
    p->slack = 1;
    p->schedules = loom_calloc((size_t)pp, sizeof *p->schedules, "schedules");
    p->table = loom_calloc((size_t)V * SLACK_FIELDS, sizeof *p->table, "slack table");
    p->times = loom_calloc((size_t)V * 6, sizeof *p->times, "slack times");
    p->choice = loom_calloc((size_t)V * (size_t)m, 1, "slack choice");
    if (!p->schedules || !p->table || !p->times || !p->choice) return LOOM_ERR_NOMEM;
    loom_status st = loom_pipe_schedule_build_all(&p->shape, p->schedules);
    if (st == LOOM_OK) st = measure_links(p, (int64_t)(btc_of(p) * sizeof(float)));
    return st;
}

/* After a step: every virtual stage's durations (the pipeline group's sum of each rank's own
 * rows), then the same simulation on every rank, so both ends of each message choose alike. */
static loom_status slack_update(loom_pipeline *p) {
    int pp = p->mesh->pp_size, V = p->stages, m = p->micro_batches;
    memset(p->table, 0, (size_t)V * SLACK_FIELDS * sizeof *p->table);
    for (int c = 0; c < p->chunks; c++) {
        chunk_state *ch = &p->chunk[c];
        double *row = p->table + (size_t)ch->stage * SLACK_FIELDS;
        for (int f = 0; f < SLACK_TIMED; f++) {
            if (ch->count[f]) ch->mean[f] = ch->sum[f] / ch->count[f];
            row[f] = ch->mean[f];
            ch->sum[f] = 0.0, ch->count[f] = 0;
        }
        row[SLACK_RAW] = ch->link_raw_s, row[SLACK_COMPRESSED] = ch->link_comp_s;
    }
    loom_status st =
        loom_comm_allreduce_f64(p->mesh->pp, p->table, V * SLACK_FIELDS, LOOM_REDUCE_SUM);
    if (st != LOOM_OK) return st;
    double *forward = p->times, *backward = forward + V, *input = backward + V;
    double *weight = input + V, *link = weight + V, *saving = link + V;
    for (int s = 0; s < V; s++) {
        const double *row = p->table + (size_t)s * SLACK_FIELDS;
        forward[s] = row[SLACK_FORWARD], backward[s] = row[SLACK_BACKWARD];
        input[s] = row[SLACK_INPUT], weight[s] = row[SLACK_WEIGHT];
        if (s == 0) continue;
        /* boundary s - 1 carries stage s's gradients down (and activations up, as long) */
        link[s - 1] = row[SLACK_RAW];
        double codec = row[SLACK_ENCODE] + p->table[(size_t)(s - 1) * SLACK_FIELDS + SLACK_DECODE];
        saving[s - 1] =
            row[SLACK_COMPRESSED] > 0 ? row[SLACK_RAW] - row[SLACK_COMPRESSED] - codec : 0.0;
    }
    loom_pipe_sim_times times = {V,     V - 1,  forward, backward, link, link,
                                 input, weight, NULL,    NULL,     NULL};
    st = loom_pipe_slack_choose(&p->shape, p->schedules, &times, saving, p->choice);
    if (st != LOOM_OK) return st;
    (void)pp;
    for (int c = 0; c < p->chunks; c++) {
        chunk_state *ch = &p->chunk[c];
        if (ch->encoder[KIND_GRAD]) {
            memcpy(ch->encode_mb[KIND_GRAD], p->choice + (size_t)ch->stage * (size_t)m, (size_t)m);
        }
        if (ch->decoder[KIND_GRAD]) {
            memcpy(ch->decode_mb[KIND_GRAD], p->choice + (size_t)(ch->stage + 1) * (size_t)m,
                   (size_t)m);
        }
    }
    return LOOM_OK;
}

/* ---- compression per boundary ---------------------------------------------------------------- */

/* The compressor for messages of `kind` crossing `boundary` (between virtual stages boundary and
 * boundary + 1) and which of the sender's micro-batch sends use it, or *c NULL when they cross
 * as they are. Gradients: the plan's method and policy; activations: its forward method, every
 * send. */
static loom_status link_compressor(loom_pipeline *p, int kind, int boundary, int64_t rows,
                                   int64_t cols, loom_compressor **c, unsigned char *which) {
    const loom_plan *plan = p->mesh->plan;
    const loom_plan_compressor *pc = &plan->pp_compression;
    *c = NULL;
    loom_compress_method method = kind == KIND_GRAD ? pc->method : pc->forward;
    if (method == LOOM_COMPRESS_NONE || !loom_plan_compresses_stage(pc, boundary)) return LOOM_OK;
    loom_compress_opts opts;
    int place = kind == KIND_GRAD ? LOOM_COMPRESS_FOR_PP_GRAD : LOOM_COMPRESS_FOR_PP_FORWARD;
    loom_status st = loom_parallel_compress_opts(pc, place, 0x6c6f6f6d ^ (uint64_t)boundary, &opts);
    if (st == LOOM_OK) st = loom_compressor_create(c, &opts, rows, cols, (uint64_t)boundary);
    if (st != LOOM_OK) return st;
    if (!loom_compressor_compresses(*c) ||
        loom_compressor_wire_bytes(*c) >= (size_t)(rows * cols) * sizeof(float)) {
        loom_compressor_free(*c); /* a message it would not make shorter */
        *c = NULL;
        return LOOM_OK;
    }
    int m = p->micro_batches;
    if (kind == KIND_ACT || pc->policy != LOOM_PP_POLICY_EPILOGUE) {
        memset(which, 1, (size_t)m);
        return LOOM_OK;
    }
    /* epilogue: the sender's cool-down sends (the gradient's sender is stage boundary + 1) */
    int sender, chunk;
    loom_pipe_place(&p->shape, boundary + 1, &sender, &chunk);
    loom_pipe_stage_schedule list = {0};
    unsigned char *cool = loom_calloc((size_t)p->chunks * (size_t)m, 1, "cool-down sends");
    st = cool ? loom_pipe_schedule_build(&p->shape, sender, &list) : LOOM_ERR_NOMEM;
    if (st == LOOM_OK) {
        loom_pipe_cooldown_sends(&list, p->chunks, m, cool);
        memcpy(which, cool + (size_t)chunk * (size_t)m, (size_t)m);
    }
    loom_pipe_schedule_free(&list);
    free(cool);
    return st;
}

static loom_status compression_create(loom_pipeline *p, int64_t rows, int64_t cols) {
    int m = p->micro_batches;
    loom_status st = LOOM_OK;
    for (int c = 0; c < p->chunks && st == LOOM_OK; c++) {
        chunk_state *ch = &p->chunk[c];
        for (int kind = 0; kind < 2 && st == LOOM_OK; kind++) {
            ch->encode_mb[kind] = loom_calloc((size_t)m, 1, "compressed sends");
            ch->decode_mb[kind] = loom_calloc((size_t)m, 1, "compressed receives");
            if (!ch->encode_mb[kind] || !ch->decode_mb[kind]) return LOOM_ERR_NOMEM;
            /* activations go up (sent across the boundary above, received across the one
             * below); gradients come down */
            int sends_to = kind == KIND_ACT ? ch->above : ch->below;
            int receives_from = kind == KIND_ACT ? ch->below : ch->above;
            int send_boundary = kind == KIND_ACT ? ch->stage : ch->stage - 1;
            int recv_boundary = kind == KIND_ACT ? ch->stage - 1 : ch->stage;
            if (sends_to >= 0) {
                st = link_compressor(p, kind, send_boundary, rows, cols, &ch->encoder[kind],
                                     ch->encode_mb[kind]);
            }
            if (st == LOOM_OK && receives_from >= 0) {
                st = link_compressor(p, kind, recv_boundary, rows, cols, &ch->decoder[kind],
                                     ch->decode_mb[kind]);
            }
            if (st == LOOM_OK && ch->decoder[kind]) {
                ch->wire[kind] =
                    loom_alloc_aligned(loom_compressor_wire_bytes(ch->decoder[kind]), "wire");
                if (!ch->wire[kind]) st = LOOM_ERR_NOMEM;
            }
        }
    }
    return st;
}

/* ---- creation ------------------------------------------------------------------------------- */

/* The chunks' places: virtual stages, neighbours, and the action that finishes each one's
 * weight gradients. */
static void chunks_init(loom_pipeline *p) {
    int me = p->mesh->pp_rank;
    for (int c = 0; c < p->chunks; c++) {
        chunk_state *ch = &p->chunk[c];
        ch->stage = loom_pipe_stage(&p->shape, me, c);
        ch->embedding = ch->stage == 0, ch->head = ch->stage == p->stages - 1;
        ch->below = ch->above = ch->local_below = ch->local_above = -1;
        ch->last_weight = -1;
        int rank, chunk;
        if (!ch->embedding) {
            loom_pipe_place(&p->shape, ch->stage - 1, &rank, &chunk);
            if (rank == me)
                ch->local_below = chunk;
            else
                ch->below = rank;
        }
        if (!ch->head) {
            loom_pipe_place(&p->shape, ch->stage + 1, &rank, &chunk);
            if (rank == me)
                ch->local_above = chunk;
            else
                ch->above = rank;
        }
    }
    for (int i = 0; i < p->schedule.count; i++) {
        loom_pipe_action a = p->schedule.actions[i];
        if (a.op == LOOM_PIPE_BACKWARD || a.op == LOOM_PIPE_BACKWARD_WEIGHT)
            p->chunk[a.chunk].last_weight = i;
        p->split |= a.op == LOOM_PIPE_BACKWARD_WEIGHT;
    }
}

/* Pool sizes from a dry run of the list. */
static loom_status pools_create(loom_pipeline *p) {
    int counts[POOLS] = {0}, peak[POOLS] = {0}, keys = p->chunks * p->micro_batches;
    for (int i = 0; i < p->schedule.count; i++) {
        /* an action takes before it drops: both count at once */
        pool_events e = events_of(p, p->schedule.actions[i]);
        for (int k = 0; k < POOLS; k++) {
            counts[k] += e.take[k] >= 0;
            if (counts[k] > peak[k]) peak[k] = counts[k];
        }
        for (int k = 0; k < POOLS; k++) counts[k] -= e.drop[k] >= 0;
    }
    p->in_flight = loom_pipe_peak_in_flight(&p->schedule);
    if (p->in_flight < 1) p->in_flight = 1;
    loom_status st =
        pool_init(&p->slots, keys, p->recompute ? 1 : p->in_flight, "activation slots");
    if (st == LOOM_OK) st = pool_init(&p->inputs, keys, peak[POOL_INPUTS], "input buffers");
    if (st == LOOM_OK) st = pool_init(&p->grads, keys, peak[POOL_GRADS], "gradient buffers");
    if (st == LOOM_OK) st = pool_init(&p->kept, keys, peak[POOL_KEPT], "kept buffers");
    if (st != LOOM_OK || p->stages == 1) return st;
    size_t btc = btc_of(p);
    p->wires = 2 * p->in_flight + 2;
    if (peak[POOL_INPUTS])
        p->act_in = loom_alloc_aligned(btc * (size_t)peak[POOL_INPUTS] * sizeof(float), "inputs");
    if (peak[POOL_GRADS])
        p->grad_in = loom_alloc_aligned(btc * (size_t)peak[POOL_GRADS] * sizeof(float), "grads");
    p->send_buf = loom_alloc_aligned(2 * btc * (size_t)p->wires * sizeof(float), "sends");
    p->send_req = loom_calloc(2 * (size_t)p->wires, sizeof(loom_comm_request *), "sends");
    if ((peak[POOL_INPUTS] && !p->act_in) || (peak[POOL_GRADS] && !p->grad_in) || !p->send_buf ||
        !p->send_req)
        return LOOM_ERR_NOMEM;
    return LOOM_OK;
}

loom_status loom_pipeline_create(loom_pipeline **out, const loom_mesh *mesh, loom_gpt *model, int B,
                                 int T) {
    *out = NULL;
    loom_pipeline *p = loom_calloc(1, sizeof *p, "pipeline");
    if (!p) return LOOM_ERR_NOMEM;
    const loom_plan *plan = mesh->plan;
    p->mesh = mesh, p->model = model, p->B = B, p->T = T;
    loom_status st = loom_pipe_shape_of(plan, &p->shape);
    p->micro_batches = p->shape.micro_batches, p->chunks = p->shape.chunks;
    p->stages = plan->num_stages;
    p->last_forward = -1;
    p->chunk = loom_calloc((size_t)p->chunks, sizeof *p->chunk, "pipeline chunks");
    if (!p->chunk) st = LOOM_ERR_NOMEM;
    if (st == LOOM_OK) st = loom_pipe_schedule_build(&p->shape, mesh->pp_rank, &p->schedule);
    if (st == LOOM_OK) {
        /* the rank's chunks agree on recomputation (loom_parallel_check_plan) */
        int first = loom_pipe_stage(&p->shape, mesh->pp_rank, 0);
        int recompute = plan->stages[first].recompute;
        p->recompute = loom_recompute_full(recompute) ? recompute : LOOM_RECOMPUTE_NONE;
        p->selective = recompute == LOOM_RECOMPUTE_SELECTIVE;
        chunks_init(p);
        st = pools_create(p);
    }
    if (st == LOOM_OK) {
        loom_gpt_slots_spec slots = {B, T, p->slots.size, p->split, p->selective};
        st = loom_gpt_reserve_slots_spec(model, &slots);
    }
    if (st == LOOM_OK && p->kept.size > 0) {
        for (int c = 0; c < p->chunks; c++) {
            size_t n = loom_gpt_weight_state_floats(model, c, B, T);
            if (n > p->kept_floats) p->kept_floats = n;
        }
        p->kept_buf =
            loom_alloc_aligned(p->kept_floats * (size_t)p->kept.size * sizeof(float), "kept for W");
        if (!p->kept_buf) st = LOOM_ERR_NOMEM;
    }
    if (st == LOOM_OK && p->stages > 1) {
        st = compression_create(p, rows_of(p), model->config.channels);
        const loom_plan_compressor *pc = &plan->pp_compression;
        if (st == LOOM_OK && pc->method != LOOM_COMPRESS_NONE &&
            pc->policy == LOOM_PP_POLICY_SLACK) {
            st = slack_create(p);
        }
    }
    if (st != LOOM_OK) {
        loom_pipeline_free(p);
        return st;
    }
    *out = p;
    return LOOM_OK;
}

int loom_pipeline_peak_in_flight(const loom_plan *plan, int stage) {
    loom_pipe_shape shape;
    loom_pipe_stage_schedule schedule = {0};
    int peak = 0;
    if (plan->pp > 0 && loom_pipe_shape_of(plan, &shape) == LOOM_OK &&
        loom_pipe_schedule_build(&shape, stage, &schedule) == LOOM_OK) {
        peak = loom_pipe_peak_in_flight(&schedule);
    }
    loom_pipe_schedule_free(&schedule);
    return peak;
}

void loom_pipeline_free(loom_pipeline *p) {
    if (!p) return;
    loom_pipe_schedule_free(&p->schedule);
    pool_free(&p->slots), pool_free(&p->inputs), pool_free(&p->grads), pool_free(&p->kept);
    loom_free_aligned(p->kept_buf);
    loom_free_aligned(p->act_in);
    loom_free_aligned(p->grad_in);
    loom_free_aligned(p->send_buf);
    free(p->send_req);
    for (int r = 0; p->schedules && r < p->mesh->pp_size; r++) {
        loom_pipe_schedule_free(&p->schedules[r]);
    }
    free(p->schedules), free(p->table), free(p->times), free(p->choice);
    for (int c = 0; p->chunk && c < p->chunks; c++) {
        chunk_state *ch = &p->chunk[c];
        for (int kind = 0; kind < 2; kind++) {
            loom_compressor_free(ch->encoder[kind]);
            loom_compressor_free(ch->decoder[kind]);
            free(ch->encode_mb[kind]);
            free(ch->decode_mb[kind]);
            loom_free_aligned(ch->wire[kind]);
        }
    }
    free(p->chunk);
    free(p);
}

int loom_pipeline_micro_batches(const loom_pipeline *p) {
    return p->micro_batches;
}

int loom_pipeline_recomputes(const loom_pipeline *p) {
    return p->recompute;
}

void loom_pipeline_set_trace(loom_pipeline *p, loom_trace *trace) {
    p->trace = trace;
}

/* ---- links: encode/decode points ------------------------------------------------------------ */

/* The share of a message this rank sends when the message is scattered and gathered (Megatron's
 * scatter-gather of pipeline tensors), else 0. Under tensor parallelism without sequence
 * parallelism every TP rank holds the same whole activation and the same input gradient, so
 * each sends only its 1/tp of the flat message to the rank of its own TP place in the
 * neighbouring stage, and the receiving TP group all-gathers the shares over its own (fast)
 * link: the pipeline's link carries the message once, not tp times. A compressed link (`codec`
 * set on either end: both ends have one or neither) sends its wire whole. */
static size_t scattered_share(const loom_pipeline *p, const loom_compressor *codec, size_t floats) {
    const loom_gpt *model = p->model;
    int tp = model->tp_size;
    if (tp <= 1 || model->sequence_parallel || codec || floats % (size_t)tp) return 0;
    return floats / (size_t)tp;
}

/* Sends rows x cols floats of `kind` from chunk `c` to `peer` without waiting: encoded into the
 * kind's next wire buffer, whose previous send is completed first. */
static loom_status encode_send(loom_pipeline *p, int kind, int c, int mb, const float *src,
                               int64_t rows, int64_t cols, int peer) {
    int slot = kind * p->wires + p->next_wire[kind];
    p->next_wire[kind] = (p->next_wire[kind] + 1) % p->wires;
    loom_status st = LOOM_OK;
    if (p->send_req[slot]) st = loom_comm_wait(p->send_req[slot]);
    p->send_req[slot] = NULL;
    if (st != LOOM_OK) return st;
    size_t floats = (size_t)rows * (size_t)cols;
    float *wire = p->send_buf + (size_t)slot * btc_of(p);
    chunk_state *ch = &p->chunk[c];
    /* training sends only (validation's may be shorter): the compressor's shape */
    loom_compressor *encoder = ch->encoder[kind];
    size_t share = scattered_share(p, encoder, floats);
    if (share) src += (size_t)p->model->tp_rank * share, floats = share;
    int64_t raw_bytes = (int64_t)(floats * sizeof(float)), wire_bytes = raw_bytes;
    int compress = encoder && ch->encode_mb[kind][mb] && rows == loom_compressor_rows(encoder);
    if (compress) {
        double t0 = loom_trace_now_us();
        loom_compressor_encode(encoder, src, wire);
        wire_bytes = (int64_t)loom_compressor_wire_bytes(encoder);
        double us = loom_trace_now_us() - t0;
        p->stats.compress_s += us * 1e-6;
        if (kind == KIND_GRAD) ch->sum[SLACK_ENCODE] += us * 1e-6, ch->count[SLACK_ENCODE]++;
        loom_trace_event(p->trace, LOOM_TRACE_PP, "encode", "compress", t0, us, -1, mb);
    } else if (encoder && rows == loom_compressor_rows(encoder)) {
        loom_compressor_flush(encoder, src, wire); /* a lazy-error residual goes with it */
    } else {
        memcpy(wire, src, floats * sizeof(float));
    }
    p->stats.pp_bytes_saved += raw_bytes - wire_bytes;
    if (kind == KIND_GRAD) {
        p->stats.pp_grad_bytes += wire_bytes, p->stats.pp_grad_bytes_raw += raw_bytes;
        p->stats.pp_grad_sends++;
        p->stats.pp_grad_sends_compressed += compress;
    }
    return loom_comm_isend(p->mesh->pp, wire, wire_bytes, peer,
                           kind == KIND_ACT ? TAG_ACT : TAG_GRAD, &p->send_req[slot]);
}

/* Receives a message of `kind` for chunk `c` from `peer` and decodes it into dst (rows x cols
 * floats). With the identity encoding the wire buffer is dst itself. */
static loom_status recv_decode(loom_pipeline *p, int kind, int c, int mb, float *dst, int64_t rows,
                               int64_t cols, int peer) {
    chunk_state *ch = &p->chunk[c];
    loom_compressor *decoder = ch->decoder[kind];
    if (decoder && ch->decode_mb[kind][mb] && rows == loom_compressor_rows(decoder)) {
        loom_status st = loom_comm_recv(p->mesh->pp, ch->wire[kind],
                                        (int64_t)loom_compressor_wire_bytes(decoder), peer,
                                        kind == KIND_ACT ? TAG_ACT : TAG_GRAD);
        if (st != LOOM_OK) return st;
        double t0 = loom_trace_now_us();
        loom_compressor_decode(decoder, ch->wire[kind], dst);
        double us = loom_trace_now_us() - t0;
        p->stats.compress_s += us * 1e-6;
        if (kind == KIND_GRAD) ch->sum[SLACK_DECODE] += us * 1e-6, ch->count[SLACK_DECODE]++;
        loom_trace_event(p->trace, LOOM_TRACE_PP, "decode", "compress", t0, us, -1, mb);
        return LOOM_OK;
    }
    size_t floats = (size_t)rows * (size_t)cols, share = scattered_share(p, decoder, floats);
    if (share) { /* this TP place's share, then the others' from the TP group */
        float *mine = dst + (size_t)p->model->tp_rank * share;
        loom_status st = loom_comm_recv(p->mesh->pp, mine, (int64_t)(share * sizeof(float)), peer,
                                        kind == KIND_ACT ? TAG_ACT : TAG_GRAD);
        if (st != LOOM_OK) return st;
        double t0 = loom_trace_now_us();
        st = loom_comm_allgather_f32(p->model->tp_comm, mine, dst, (int64_t)share);
        loom_trace_event(p->trace, LOOM_TRACE_PP, "gather", "comm", t0, loom_trace_now_us() - t0,
                         -1, mb);
        return st;
    }
    return loom_comm_recv(p->mesh->pp, dst, (int64_t)(floats * sizeof(float)), peer,
                          kind == KIND_ACT ? TAG_ACT : TAG_GRAD);
}

static loom_status wait_sends(loom_pipeline *p) {
    loom_status st = LOOM_OK;
    for (int i = 0; p->send_req && i < 2 * p->wires; i++) {
        if (!p->send_req[i]) continue;
        loom_status r = loom_comm_wait(p->send_req[i]);
        p->send_req[i] = NULL;
        if (st == LOOM_OK) st = r;
    }
    return st;
}

/* ---- training ------------------------------------------------------------------------------- */

/* Whether a backward (or, backward 0, a W) of `key` reruns its forward first, `last` being the
 * key of the last forward run (use_activations' rule). */
static int reruns(const loom_pipeline *p, int last, int key, int backward) {
    if (!p->recompute) return 0;
    return last != key || (backward && p->recompute == LOOM_RECOMPUTE_ALWAYS);
}

/* Makes (chunk, mb)'s activation set current; rebuilds it from the kept input when
 * recomputation dropped it, and before every backward (whole or B) when the plan says
 * "always" (backward is 1 for those). */
static void use_activations(loom_pipeline *p, int c, int mb, const int32_t *tokens,
                            const int32_t *targets, int backward) {
    int key = key_of(p, c, mb);
    loom_gpt_use_slot(p->model, p->slots.of[key] >= 0 ? p->slots.of[key] : 0);
    if (!reruns(p, p->last_forward, key, backward)) return;
    loom_comm_progress("pipeline recompute");
    double t0 = loom_trace_now_us();
    loom_gpt_forward_chunk(p->model, c, tokens, input_of(p, c, mb), targets, p->B, p->T);
    p->last_forward = key;
    /* inside the action's own span on the same stream */
    loom_trace_event_stage(p->trace, LOOM_TRACE_COMPUTE, "recompute", "compute", t0,
                           loom_trace_now_us() - t0, p->trace_step, mb, p->chunk[c].stage);
}

/* After a backward (whole or B) of (c, mb): the input gradient handed to the chunk below when
 * it is on this rank. */
static void hand_down(loom_pipeline *p, int c, int mb) {
    const chunk_state *ch = &p->chunk[c];
    if (ch->local_below < 0) return;
    memcpy(grad_of(p, ch->local_below, mb), loom_gpt_chunk_input_grad(p->model),
           btc_of(p) * sizeof(float));
}

/* Tells the sync which pass after action i reads parameters next (ZeRO-3's prefetch crosses
 * into it, and a block the pass turns on stays): the next forward (dir +1) or backward (dir -1)
 * in the schedule, a rerun forward where recomputation reruns one first; a W reads none. */
static void announce_next_pass(const loom_pipeline *p, int i, loom_grad_sync *sync) {
    int last = p->last_forward, chunk = 0, dir = 0;
    for (int j = i; j < p->schedule.count && dir == 0; j++) {
        loom_pipe_action a = p->schedule.actions[j];
        int key = key_of(p, a.chunk, a.micro_batch), next = 0;
        int backward = a.op == LOOM_PIPE_BACKWARD || a.op == LOOM_PIPE_BACKWARD_INPUT;
        if (a.op == LOOM_PIPE_FORWARD) {
            next = 1;
        } else if (backward || a.op == LOOM_PIPE_BACKWARD_WEIGHT) {
            next = reruns(p, last, key, backward) ? 1 : backward ? -1 : 0;
        } else {
            continue;
        }
        if (j > i && next != 0) chunk = a.chunk, dir = next;
        if (a.op == LOOM_PIPE_FORWARD || next == 1) last = key; /* as it will be after j */
    }
    loom_grad_sync_next_pass(sync, chunk, dir);
}

/* One action of the list. */
static loom_status run_action(loom_pipeline *p, int i, const int32_t *inputs,
                              const int32_t *targets, float dloss, loom_grad_sync *sync,
                              int64_t step, double *loss_sum) {
    loom_gpt *model = p->model;
    loom_pipe_action a = p->schedule.actions[i];
    int c = a.chunk, mb = a.micro_batch, key = key_of(p, c, mb);
    chunk_state *ch = &p->chunk[c];
    size_t bt = (size_t)p->B * (size_t)p->T;
    int64_t rows = rows_of(p), cols = model->config.channels;
    const int32_t *tokens = inputs + (size_t)mb * bt, *mb_targets = targets + (size_t)mb * bt;
    pool_events events = events_of(p, a);
    pools_take(p, &events);
    loom_status st = LOOM_OK;
    switch (a.op) {
    case LOOM_PIPE_RECV_ACT:
        st = recv_decode(p, KIND_ACT, c, mb, input_of(p, c, mb), rows, cols, ch->below);
        break;
    case LOOM_PIPE_FORWARD: {
        /* with recomputation every micro-batch shares the one activation set */
        int slot = p->recompute ? 0 : pool_take(&p->slots, key, "activation slot");
        loom_gpt_use_slot(model, slot);
        loom_comm_progress("forward");
        *loss_sum +=
            loom_gpt_forward_chunk(model, c, tokens, input_of(p, c, mb), mb_targets, p->B, p->T);
        p->last_forward = key;
        if (ch->local_above >= 0) {
            memcpy(input_of(p, ch->local_above, mb), loom_gpt_chunk_output(model, c),
                   btc_of(p) * sizeof(float));
        }
        break;
    }
    case LOOM_PIPE_SEND_ACT:
        use_activations(p, c, mb, tokens, mb_targets, 0);
        st =
            encode_send(p, KIND_ACT, c, mb, loom_gpt_chunk_output(model, c), rows, cols, ch->above);
        break;
    case LOOM_PIPE_RECV_GRAD:
        st = recv_decode(p, KIND_GRAD, c, mb, grad_of(p, c, mb), rows, cols, ch->above);
        break;
    case LOOM_PIPE_BACKWARD:
    case LOOM_PIPE_BACKWARD_INPUT: {
        /* a rerun forward (recomputation) turns into this backward, which then runs ahead of
         * the schedule's next pass */
        loom_grad_sync_next_pass(sync, c, -1);
        use_activations(p, c, mb, tokens, mb_targets, 1);
        announce_next_pass(p, i, sync);
        int last = i == ch->last_weight; /* a whole backward that finishes the chunk */
        if (last) loom_grad_sync_before_backward(sync, step);
        loom_comm_progress("backward");
        const float *output_grad = ch->head ? NULL : grad_of(p, c, mb);
        if (a.op == LOOM_PIPE_BACKWARD) {
            loom_gpt_backward_chunk(model, c, dloss, output_grad);
        } else {
            loom_gpt_backward_chunk_input(model, c, dloss, output_grad);
        }
        if (last) loom_grad_sync_after_backward(sync);
        hand_down(p, c, mb);
        if (a.op == LOOM_PIPE_BACKWARD && !p->recompute) pool_drop(&p->slots, key);
        /* recomputation: the one activation set will serve others before this W */
        if (p->kept.size > 0) loom_gpt_weight_state_save(model, c, kept_of(p, c, mb));
        break;
    }
    case LOOM_PIPE_BACKWARD_WEIGHT: {
        use_activations(p, c, mb, tokens, mb_targets, 0);
        if (p->kept.size > 0) loom_gpt_weight_state_load(model, c, kept_of(p, c, mb));
        int last = i == ch->last_weight;
        if (last) loom_grad_sync_before_backward(sync, step);
        loom_comm_progress("backward (weights)");
        loom_gpt_backward_chunk_weight(model, c);
        if (last) loom_grad_sync_after_backward(sync);
        if (!p->recompute) pool_drop(&p->slots, key);
        break;
    }
    case LOOM_PIPE_SEND_GRAD:
        st = encode_send(p, KIND_GRAD, c, mb, loom_gpt_chunk_input_grad(model), rows, cols,
                         ch->below);
        break;
    }
    pools_drop(p, &events);
    return st;
}

/* Which slack field a compute action's time goes to (-1: none). */
static int timed_field(loom_pipe_op op) {
    switch (op) {
    case LOOM_PIPE_FORWARD:
        return SLACK_FORWARD;
    case LOOM_PIPE_BACKWARD:
        return SLACK_BACKWARD;
    case LOOM_PIPE_BACKWARD_INPUT:
        return SLACK_INPUT;
    case LOOM_PIPE_BACKWARD_WEIGHT:
        return SLACK_WEIGHT;
    default:
        return -1;
    }
}

loom_status loom_pipeline_train(loom_pipeline *p, const int32_t *inputs, const int32_t *targets,
                                float dloss, loom_grad_sync *sync, int64_t step, double *loss_sum) {
    loom_status st = LOOM_OK;
    *loss_sum = 0.0;
    p->last_forward = -1;
    p->trace_step = step + 1;
    for (int i = 0; i < p->schedule.count && st == LOOM_OK; i++) {
        loom_pipe_action a = p->schedule.actions[i];
        int field = timed_field(a.op);
        if (field >= 0) announce_next_pass(p, i, sync);
        double t0 = loom_trace_now_us();
        st = run_action(p, i, inputs, targets, dloss, sync, step, loss_sum);
        double us = loom_trace_now_us() - t0;
        if (field >= 0) p->chunk[a.chunk].sum[field] += us * 1e-6, p->chunk[a.chunk].count[field]++;
        loom_trace_event_stage(p->trace, field >= 0 ? LOOM_TRACE_COMPUTE : LOOM_TRACE_PP,
                               loom_pipe_op_name(a.op), field >= 0 ? "compute" : "pp", t0, us,
                               step + 1, a.micro_batch, p->chunk[a.chunk].stage);
    }
    loom_grad_sync_next_pass(sync, 0, 0); /* validation and the next step start afresh */
    loom_status sent = wait_sends(p);
    if (st == LOOM_OK) st = sent;
    if (st == LOOM_OK && p->slack) st = slack_update(p);
    return st;
}

/* ---- forward only (validation) -------------------------------------------------------------- */

loom_status loom_pipeline_forward(loom_pipeline *p, const int32_t *inputs, const int32_t *targets,
                                  int b, double *loss) {
    loom_gpt *model = p->model;
    int T = p->T;
    int64_t rows = loom_gpt_rows(model, b, T), cols = model->config.channels;
    if (model->sequence_parallel) {
        loom_status st = loom_gpt_check_sequence_rows(b, T, model->tp_size, "validation batch");
        if (st != LOOM_OK) return st;
    }
    size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
    loom_status st = LOOM_OK;
    *loss = 0.0;
    loom_gpt_use_slot(model, 0);
    /* every chunk of this rank in virtual-stage order; its input (received or handed over) in
     * the first input buffer, which is free between steps */
    float *in = p->act_in;
    for (int c = 0; c < p->chunks && st == LOOM_OK; c++) {
        const chunk_state *ch = &p->chunk[c];
        if (ch->below >= 0) st = recv_decode(p, KIND_ACT, c, 0, in, rows, cols, ch->below);
        if (st != LOOM_OK) break;
        const float *input = ch->embedding ? NULL : in;
        loom_comm_progress("validation");
        float mean = loom_gpt_forward_chunk(model, c, inputs, input, targets, b, T);
        if (ch->head) *loss = (double)mean;
        if (ch->above >= 0) {
            st = encode_send(p, KIND_ACT, c, 0, loom_gpt_chunk_output(model, c), rows, cols,
                             ch->above);
            loom_status sent = wait_sends(p);
            if (st == LOOM_OK) st = sent;
        } else if (ch->local_above >= 0) {
            memcpy(in, loom_gpt_chunk_output(model, c), bytes);
        }
    }
    return st;
}

/* ---- compression state ---------------------------------------------------------------------- */

void loom_pipeline_commit(loom_pipeline *p, int accept) {
    for (int c = 0; c < p->chunks; c++) {
        if (p->chunk[c].encoder[KIND_GRAD])
            loom_compressor_commit(p->chunk[c].encoder[KIND_GRAD], accept);
    }
}

void loom_pipeline_take_stats(loom_pipeline *p, loom_compress_stats *stats) {
    stats->pp_bytes_saved += p->stats.pp_bytes_saved;
    stats->pp_grad_bytes += p->stats.pp_grad_bytes;
    stats->pp_grad_bytes_raw += p->stats.pp_grad_bytes_raw;
    stats->compress_s += p->stats.compress_s;
    stats->pp_grad_sends += p->stats.pp_grad_sends;
    stats->pp_grad_sends_compressed += p->stats.pp_grad_sends_compressed;
    memset(&p->stats, 0, sizeof p->stats);
}

int loom_pipeline_compressor_count(const loom_pipeline *p) {
    int n = 0;
    for (int c = 0; c < p->chunks; c++) n += p->chunk[c].encoder[KIND_GRAD] != NULL;
    return n;
}

loom_compressor *loom_pipeline_compressor(loom_pipeline *p, int i) {
    for (int c = 0; c < p->chunks; c++) {
        if (p->chunk[c].encoder[KIND_GRAD] && i-- == 0) return p->chunk[c].encoder[KIND_GRAD];
    }
    return NULL;
}
