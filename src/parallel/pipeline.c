/*
 * pipeline.c — the executor of this stage's schedule: one step's micro-batches through
 * forward and backward, activations and their gradients point to point to the neighbouring
 * stages. Sends are non-blocking from a ring of buffers (one per micro-batch in flight,
 * completed when the slot comes round again or at the end of the step); receives wait at their
 * place in the list, which cannot deadlock (see the contract in loom/parallel.h). With one stage
 * the schedule is forward, backward, forward, ...: plain gradient accumulation.
 *
 * Every activation or activation gradient that crosses a link goes through encode_send and
 * recv_decode. Activation gradients sent backward are compressed there (Optimus-CC's compressed
 * backpropagation, the plan's compression.pp) on the links and sends the plan selects: policy
 * "all" or "epilogue" (the sender's cool-down sends), decided from the schedules alone, so both
 * ends of a link know per micro-batch whether a message is compressed and how long it is. The
 * sender's residual (lazy error propagation) goes into its next compressed send, never into
 * the same micro-batch's.
 *
 * Not here: the schedules themselves (schedule.c), gradient synchronisation (grad_sync.c).
 */
#include "loom/parallel.h"

#include <stdlib.h>
#include <string.h>

enum { TAG_ACT = 1, TAG_GRAD = 2, TAG_PING = 3 };
enum { KIND_ACT = 0, KIND_GRAD = 1 }; /* what a message carries */

struct loom_pipeline {
    const loom_mesh *mesh;
    loom_gpt *model;
    int B, T;
    int micro_batches;                 /* per step on this replica */
    loom_pipe_stage_schedule schedule; /* this stage's actions for one step */
    int recompute;                     /* activations rebuilt in backward from the kept input */
    int in_flight;                     /* micro-batches whose inputs this stage keeps */
    int last_forward_mb;               /* whose activations the model holds (recompute) */
    float *act_in;                     /* (in_flight, B, T, C): activations received */
    float *grad_out;                   /* (B, T, C): gradient of this stage's output */
    float *send_buf;                   /* (2, in_flight, B, T, C): outgoing messages */
    loom_comm_request **send_req;      /* (2, in_flight): their non-blocking sends */
    loom_trace *trace;                 /* NULL: not tracing */
    /* compression per kind (KIND_ACT, KIND_GRAD); NULL / 0: that kind crosses as it is */
    loom_compressor *encoder[2]; /* what this stage sends (activations up, gradients down) */
    loom_compressor *decoder[2]; /* what it receives (decoding needs no state) */
    unsigned char *encode_mb[2]; /* (micro_batches) which of this stage's sends compress */
    unsigned char *decode_mb[2]; /* (micro_batches) which received messages are compressed */
    void *wire[2];               /* (decoder's wire bytes) a compressed message received */
    loom_compress_stats stats;
    /* policy "slack": this step's durations, shared with every stage after the step */
    int slack;
    loom_pipe_stage_schedule *schedules; /* (pp) every stage's list */
    double sum[4];                       /* seconds of SLACK_FORWARD ... SLACK_DECODE this step */
    int count[4];
    double mean[4];                 /* the last step's means (kept while no sample comes) */
    double link_raw_s, link_comp_s; /* measured at start-up: one gradient down this stage's link
                                       as it is and compressed */
    double *table;                  /* (SLACK_FIELDS, pp) every stage's figures */
    double *times;                  /* (5, pp) the simulator's arrays */
    unsigned char *choice;          /* (pp, micro_batches) which gradient sends compress */
};

enum { SLACK_FORWARD, SLACK_BACKWARD, SLACK_ENCODE, SLACK_DECODE, SLACK_FIELDS = 6 };

/* Blocking round trips of a gradient-sized message down link (stage - 1, stage) as it is and
 * compressed; the sender keeps the fastest of three of each (transfer plus latency). Every link
 * in order, so each pair meets the other when both are there. */
static loom_status measure_links(loom_pipeline *p, int64_t raw, int64_t compressed) {
    int stage = p->mesh->pp_rank;
    char ack = 0;
    loom_status st = LOOM_OK;
    for (int side = 0; side < 2 && st == LOOM_OK; side++) {
        /* side 0: the link below (this stage sends), 1: the link above (it receives) */
        int peer = side == 0 ? stage - 1 : stage + 1;
        if (peer < 0 || peer >= p->mesh->pp_size) continue;
        if (side == 0 && !p->encoder[KIND_GRAD]) continue;
        if (side == 1 && !p->decoder[KIND_GRAD]) continue;
        double best[2] = {1e30, 1e30};
        for (int rep = 0; rep < 6 && st == LOOM_OK; rep++) {
            int64_t bytes = rep % 2 ? compressed : raw;
            double t0 = loom_now();
            if (side == 0) {
                st = loom_comm_send(p->mesh->pp, p->send_buf, bytes, peer, TAG_PING);
                if (st == LOOM_OK) st = loom_comm_recv(p->mesh->pp, &ack, 1, peer, TAG_PING);
            } else {
                st = loom_comm_recv(p->mesh->pp, p->grad_out, bytes, peer, TAG_PING);
                if (st == LOOM_OK) st = loom_comm_send(p->mesh->pp, &ack, 1, peer, TAG_PING);
            }
            double dt = loom_now() - t0;
            if (dt < best[rep % 2]) best[rep % 2] = dt;
        }
        if (side == 0) p->link_raw_s = best[0], p->link_comp_s = best[1];
    }
    return st;
}

static loom_status slack_create(loom_pipeline *p, int64_t rows, int64_t cols) {
    const loom_plan *plan = p->mesh->plan;
    int pp = p->mesh->pp_size, m = p->micro_batches;
    p->slack = 1;
    p->schedules = loom_calloc((size_t)pp, sizeof *p->schedules, "schedules");
    p->table = loom_calloc((size_t)pp * SLACK_FIELDS, sizeof *p->table, "slack table");
    p->times = loom_calloc((size_t)pp * 5, sizeof *p->times, "slack times");
    p->choice = loom_calloc((size_t)pp * (size_t)m, 1, "slack choice");
    if (!p->schedules || !p->table || !p->times || !p->choice) return LOOM_ERR_NOMEM;
    loom_schedule_kind kind;
    loom_status st = loom_schedule_kind_parse(plan->schedule, &kind);
    for (int s = 0; s < pp && st == LOOM_OK; s++) {
        st = loom_pipe_schedule(kind, pp, m, s, &p->schedules[s]);
    }
    loom_compressor *c = p->encoder[KIND_GRAD] ? p->encoder[KIND_GRAD] : p->decoder[KIND_GRAD];
    int64_t raw = rows * cols * (int64_t)sizeof(float);
    if (st == LOOM_OK) st = measure_links(p, raw, c ? (int64_t)loom_compressor_wire_bytes(c) : raw);
    return st;
}

/* After a step: every stage's durations (the pipeline group's sum of each stage's own row),
 * then the same simulation on every stage, so both ends of each link choose the same sends. */
static loom_status slack_update(loom_pipeline *p) {
    int pp = p->mesh->pp_size, stage = p->mesh->pp_rank, m = p->micro_batches;
    memset(p->table, 0, (size_t)pp * SLACK_FIELDS * sizeof *p->table);
    double *mine = p->table + (size_t)stage * SLACK_FIELDS;
    for (int f = 0; f < 4; f++) {
        if (p->count[f]) p->mean[f] = p->sum[f] / p->count[f];
        mine[f] = p->mean[f];
        p->sum[f] = 0.0, p->count[f] = 0;
    }
    mine[4] = p->link_raw_s, mine[5] = p->link_comp_s;
    loom_status st =
        loom_comm_allreduce_f64(p->mesh->pp, p->table, pp * SLACK_FIELDS, LOOM_REDUCE_SUM);
    if (st != LOOM_OK) return st;
    double *forward = p->times, *backward = forward + pp, *link = backward + pp;
    double *saving = link + pp;
    for (int s = 0; s < pp; s++) {
        const double *row = p->table + (size_t)s * SLACK_FIELDS;
        forward[s] = row[SLACK_FORWARD], backward[s] = row[SLACK_BACKWARD];
        if (s == 0) continue;
        /* link s - 1 carries stage s's gradients down (and activations up, as long) */
        link[s - 1] = row[4];
        double codec = row[SLACK_ENCODE] + p->table[(size_t)(s - 1) * SLACK_FIELDS + SLACK_DECODE];
        saving[s - 1] = row[5] > 0 ? row[4] - row[5] - codec : 0.0;
    }
    loom_pipe_sim_times times = {.stages = pp,
                                 .links = pp - 1,
                                 .forward_s = forward,
                                 .backward_s = backward,
                                 .act_link_s = link,
                                 .grad_link_s = link};
    loom_pipe_shape shape = {LOOM_SCHEDULE_1F1B, pp, 1, m};
    st = loom_schedule_kind_parse(p->mesh->plan->schedule, &shape.kind);
    if (st == LOOM_OK) st = loom_pipe_slack_choose(&shape, p->schedules, &times, saving, p->choice);
    if (st != LOOM_OK) return st;
    if (p->encoder[KIND_GRAD]) {
        memcpy(p->encode_mb[KIND_GRAD], p->choice + (size_t)stage * (size_t)m, (size_t)m);
    }
    if (p->decoder[KIND_GRAD]) {
        memcpy(p->decode_mb[KIND_GRAD], p->choice + (size_t)(stage + 1) * (size_t)m, (size_t)m);
    }
    return LOOM_OK;
}

/* The compressor for messages of `kind` crossing `link` (between stages link and link + 1) and
 * which of the sender's micro-batch sends use it, or *c NULL when they cross as they are.
 * Gradients: the plan's method and policy; activations: its forward method, every send. */
static loom_status link_compressor(loom_pipeline *p, int kind, int link, int64_t rows, int64_t cols,
                                   loom_compressor **c, unsigned char *which) {
    const loom_plan *plan = p->mesh->plan;
    const loom_plan_compressor *pc = &plan->pp_compression;
    *c = NULL;
    const char *method = kind == KIND_GRAD ? pc->method : pc->forward;
    int listed = pc->num_stages == 0; /* no list: every link */
    for (int i = 0; i < pc->num_stages; i++) listed |= pc->stages[i] == link;
    if (!strcmp(method, "none") || !listed) return LOOM_OK;
    loom_compress_opts opts;
    int place = kind == KIND_GRAD ? LOOM_COMPRESS_FOR_PP_GRAD : LOOM_COMPRESS_FOR_PP_FORWARD;
    loom_status st = loom_parallel_compress_opts(pc, place, 0x6c6f6f6d ^ (uint64_t)link, &opts);
    if (st == LOOM_OK) st = loom_compressor_create(c, &opts, rows, cols, (uint64_t)link);
    if (st != LOOM_OK) return st;
    if (!loom_compressor_compresses(*c) ||
        loom_compressor_wire_bytes(*c) >= (size_t)(rows * cols) * sizeof(float)) {
        loom_compressor_free(*c); /* a message it would not make shorter */
        *c = NULL;
        return LOOM_OK;
    }
    if (kind == KIND_ACT || strcmp(pc->policy, "epilogue") != 0) {
        memset(which, 1, (size_t)p->micro_batches);
        return LOOM_OK;
    }
    loom_schedule_kind schedule;
    loom_pipe_stage_schedule sender = {0};
    st = loom_schedule_kind_parse(plan->schedule, &schedule);
    if (st == LOOM_OK) {
        st = loom_pipe_schedule(schedule, plan->pp, p->micro_batches, link + 1, &sender);
    }
    if (st == LOOM_OK) loom_pipe_cooldown_sends(&sender, 1, p->micro_batches, which);
    loom_pipe_schedule_free(&sender);
    return st;
}

static loom_status compression_create(loom_pipeline *p, int64_t rows, int64_t cols) {
    int stage = p->mesh->pp_rank, m = p->micro_batches;
    loom_status st = LOOM_OK;
    for (int kind = 0; kind < 2 && st == LOOM_OK; kind++) {
        p->encode_mb[kind] = loom_calloc((size_t)m, 1, "compressed sends");
        p->decode_mb[kind] = loom_calloc((size_t)m, 1, "compressed receives");
        if (!p->encode_mb[kind] || !p->decode_mb[kind]) return LOOM_ERR_NOMEM;
        /* activations go up (sent on the link above, received from the one below); gradients
         * come down */
        int send_link = kind == KIND_ACT ? stage : stage - 1;
        int recv_link = kind == KIND_ACT ? stage - 1 : stage;
        if (send_link >= 0 && send_link < p->mesh->pp_size - 1) {
            st = link_compressor(p, kind, send_link, rows, cols, &p->encoder[kind],
                                 p->encode_mb[kind]);
        }
        if (st == LOOM_OK && recv_link >= 0 && recv_link < p->mesh->pp_size - 1) {
            st = link_compressor(p, kind, recv_link, rows, cols, &p->decoder[kind],
                                 p->decode_mb[kind]);
        }
        if (st == LOOM_OK && p->decoder[kind]) {
            p->wire[kind] =
                loom_alloc_aligned(loom_compressor_wire_bytes(p->decoder[kind]), "wire");
            if (!p->wire[kind]) st = LOOM_ERR_NOMEM;
        }
    }
    return st;
}

loom_status loom_pipeline_create(loom_pipeline **out, const loom_mesh *mesh, loom_gpt *model, int B,
                                 int T) {
    *out = NULL;
    loom_pipeline *p = loom_calloc(1, sizeof *p, "pipeline");
    if (!p) return LOOM_ERR_NOMEM;
    const loom_plan *plan = mesh->plan;
    p->mesh = mesh, p->model = model, p->B = B, p->T = T;
    p->micro_batches = loom_plan_num_micro_batches(plan);
    p->recompute = plan->stages[mesh->pp_rank].recompute && mesh->pp_size > 1;
    loom_schedule_kind kind;
    loom_status st = loom_schedule_kind_parse(plan->schedule, &kind);
    if (st == LOOM_OK) {
        st = loom_pipe_schedule(kind, mesh->pp_size, p->micro_batches, mesh->pp_rank, &p->schedule);
    }
    if (st == LOOM_OK) {
        p->in_flight = loom_pipe_peak_in_flight(&p->schedule);
        /* recomputation keeps one activation set; inputs are kept for every micro-batch */
        st = loom_gpt_reserve_slots(model, B, T, p->recompute ? 1 : p->in_flight);
    }
    if (st == LOOM_OK && mesh->pp_size > 1) {
        size_t btc = (size_t)B * (size_t)T * (size_t)model->config.channels;
        /* the first stage receives no activations, the last no gradients */
        if (!model->has_embedding) {
            p->act_in = loom_alloc_aligned(btc * (size_t)p->in_flight * sizeof(float), "inputs");
            if (!p->act_in) st = LOOM_ERR_NOMEM;
        }
        if (!model->has_head) {
            p->grad_out = loom_alloc_aligned(btc * sizeof(float), "stage output gradient");
            if (!p->grad_out) st = LOOM_ERR_NOMEM;
        }
        p->send_buf = loom_alloc_aligned(2 * btc * (size_t)p->in_flight * sizeof(float), "sends");
        p->send_req = loom_calloc(2 * (size_t)p->in_flight, sizeof(loom_comm_request *), "sends");
        if (!p->send_buf || !p->send_req) st = LOOM_ERR_NOMEM;
        if (st == LOOM_OK) st = compression_create(p, (int64_t)B * T, model->config.channels);
        const loom_plan_compressor *pc = &plan->pp_compression;
        if (st == LOOM_OK && strcmp(pc->method, "none") != 0 && !strcmp(pc->policy, "slack")) {
            st = slack_create(p, (int64_t)B * T, model->config.channels);
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
    loom_schedule_kind kind;
    loom_pipe_stage_schedule schedule = {0};
    int peak = 0;
    if (loom_schedule_kind_parse(plan->schedule, &kind) == LOOM_OK &&
        loom_pipe_schedule(kind, plan->pp, loom_plan_num_micro_batches(plan), stage, &schedule) ==
            LOOM_OK) {
        peak = loom_pipe_peak_in_flight(&schedule);
    }
    loom_pipe_schedule_free(&schedule);
    return peak;
}

void loom_pipeline_free(loom_pipeline *p) {
    if (!p) return;
    loom_pipe_schedule_free(&p->schedule);
    loom_free_aligned(p->act_in);
    loom_free_aligned(p->grad_out);
    loom_free_aligned(p->send_buf);
    free(p->send_req);
    for (int s = 0; p->schedules && s < p->mesh->pp_size; s++) {
        loom_pipe_schedule_free(&p->schedules[s]);
    }
    free(p->schedules), free(p->table), free(p->times), free(p->choice);
    for (int kind = 0; kind < 2; kind++) {
        loom_compressor_free(p->encoder[kind]);
        loom_compressor_free(p->decoder[kind]);
        free(p->encode_mb[kind]);
        free(p->decode_mb[kind]);
        loom_free_aligned(p->wire[kind]);
    }
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

/* ---- links: encode/decode points --------------------------------------------------------------
 */

/* Sends rows x cols floats of `kind` to `peer` without waiting: encoded into a ring slot (one per
 * micro-batch in flight and kind) whose previous send is completed first. */
static loom_status encode_send(loom_pipeline *p, int kind, int mb, const float *src, int64_t rows,
                               int64_t cols, int peer) {
    int slot = kind * p->in_flight + mb % p->in_flight;
    loom_status st = LOOM_OK;
    if (p->send_req[slot]) st = loom_comm_wait(p->send_req[slot]);
    p->send_req[slot] = NULL;
    if (st != LOOM_OK) return st;
    size_t floats = (size_t)rows * (size_t)cols;
    float *wire = p->send_buf + (size_t)slot * floats;
    int64_t raw_bytes = (int64_t)(floats * sizeof(float)), wire_bytes = raw_bytes;
    /* training sends only (validation's may be shorter): the compressor's shape */
    loom_compressor *encoder = p->encoder[kind];
    int compress = encoder && p->encode_mb[kind][mb] && rows == loom_compressor_rows(encoder);
    if (compress) {
        double t0 = loom_trace_now_us();
        loom_compressor_encode(encoder, src, wire);
        wire_bytes = (int64_t)loom_compressor_wire_bytes(encoder);
        double us = loom_trace_now_us() - t0;
        p->stats.compress_s += us * 1e-6;
        if (kind == KIND_GRAD) p->sum[SLACK_ENCODE] += us * 1e-6, p->count[SLACK_ENCODE]++;
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

/* Receives a message of `kind` from `peer` and decodes it into dst (rows x cols floats). With
 * the identity encoding the wire buffer is dst itself. */
static loom_status recv_decode(loom_pipeline *p, int kind, int mb, float *dst, int64_t rows,
                               int64_t cols, int peer) {
    loom_compressor *decoder = p->decoder[kind];
    if (decoder && p->decode_mb[kind][mb] && rows == loom_compressor_rows(decoder)) {
        loom_status st =
            loom_comm_recv(p->mesh->pp, p->wire[kind], (int64_t)loom_compressor_wire_bytes(decoder),
                           peer, kind == KIND_ACT ? TAG_ACT : TAG_GRAD);
        if (st != LOOM_OK) return st;
        double t0 = loom_trace_now_us();
        loom_compressor_decode(decoder, p->wire[kind], dst);
        double us = loom_trace_now_us() - t0;
        p->stats.compress_s += us * 1e-6;
        if (kind == KIND_GRAD) p->sum[SLACK_DECODE] += us * 1e-6, p->count[SLACK_DECODE]++;
        loom_trace_event(p->trace, LOOM_TRACE_PP, "decode", "compress", t0, us, -1, mb);
        return LOOM_OK;
    }
    int64_t wire_bytes = rows * cols * (int64_t)sizeof(float);
    return loom_comm_recv(p->mesh->pp, dst, wire_bytes, peer,
                          kind == KIND_ACT ? TAG_ACT : TAG_GRAD);
}

static loom_status wait_sends(loom_pipeline *p) {
    loom_status st = LOOM_OK;
    for (int i = 0; p->send_req && i < 2 * p->in_flight; i++) {
        if (!p->send_req[i]) continue;
        loom_status r = loom_comm_wait(p->send_req[i]);
        p->send_req[i] = NULL;
        if (st == LOOM_OK) st = r;
    }
    return st;
}

/* ---- training ----------------------------------------------------------------------------------
 */

/* Rebuilds micro-batch mb's activations from its kept input when recomputation dropped them. */
static void ensure_activations(loom_pipeline *p, int mb, const int32_t *tokens, const float *input,
                               const int32_t *targets) {
    if (!p->recompute || p->last_forward_mb == mb) return;
    loom_comm_progress("pipeline recompute");
    loom_gpt_forward_stage(p->model, tokens, input, targets, p->B, p->T);
    p->last_forward_mb = mb;
}

loom_status loom_pipeline_train(loom_pipeline *p, const int32_t *inputs, const int32_t *targets,
                                float dloss, loom_grad_sync *sync, int64_t step, double *loss_sum) {
    loom_gpt *model = p->model;
    int B = p->B, T = p->T, stage = p->mesh->pp_rank;
    size_t bt = (size_t)B * (size_t)T;
    int64_t rows = (int64_t)bt, cols = model->config.channels;
    loom_status st = LOOM_OK;
    *loss_sum = 0.0;
    p->last_forward_mb = -1;
    for (int i = 0; i < p->schedule.count && st == LOOM_OK; i++) {
        loom_pipe_action act = p->schedule.actions[i];
        int mb = act.micro_batch, slot = p->recompute ? 0 : mb % model->slots;
        float *input =
            p->act_in ? p->act_in + (size_t)(mb % p->in_flight) * bt * (size_t)cols : NULL;
        const int32_t *tokens = inputs + (size_t)mb * bt, *mb_targets = targets + (size_t)mb * bt;
        int compute = act.op == LOOM_PIPE_FORWARD || act.op == LOOM_PIPE_BACKWARD;
        double t0 = loom_trace_now_us();
        switch (act.op) {
        case LOOM_PIPE_RECV_ACT:
            st = recv_decode(p, KIND_ACT, mb, input, rows, cols, stage - 1);
            break;
        case LOOM_PIPE_FORWARD:
            loom_gpt_use_slot(model, slot);
            loom_comm_progress("forward");
            *loss_sum += loom_gpt_forward_stage(model, tokens, input, mb_targets, B, T);
            p->last_forward_mb = mb;
            break;
        case LOOM_PIPE_SEND_ACT:
            loom_gpt_use_slot(model, slot);
            ensure_activations(p, mb, tokens, input, mb_targets);
            st = encode_send(p, KIND_ACT, mb, loom_gpt_stage_output(model), rows, cols, stage + 1);
            break;
        case LOOM_PIPE_RECV_GRAD:
            st = recv_decode(p, KIND_GRAD, mb, p->grad_out, rows, cols, stage + 1);
            break;
        case LOOM_PIPE_BACKWARD:
            loom_gpt_use_slot(model, slot);
            ensure_activations(p, mb, tokens, input, mb_targets);
            if (mb == p->micro_batches - 1) loom_grad_sync_before_backward(sync, step);
            loom_comm_progress("backward");
            loom_gpt_backward_stage(model, dloss, model->has_head ? NULL : p->grad_out);
            loom_grad_sync_after_backward(sync);
            break;
        case LOOM_PIPE_SEND_GRAD:
            st = encode_send(p, KIND_GRAD, mb, loom_gpt_stage_input_grad(model), rows, cols,
                             stage - 1);
            break;
        case LOOM_PIPE_BACKWARD_INPUT:
        case LOOM_PIPE_BACKWARD_WEIGHT: /* the plan admits no split-backward schedule yet */
            loom_fatal("pipeline executor: %s is not supported yet", loom_pipe_op_name(act.op));
        }
        if (compute) {
            int f = act.op == LOOM_PIPE_FORWARD ? SLACK_FORWARD : SLACK_BACKWARD;
            p->sum[f] += (loom_trace_now_us() - t0) * 1e-6, p->count[f]++;
        }
        loom_trace_event(p->trace, compute ? LOOM_TRACE_COMPUTE : LOOM_TRACE_PP,
                         loom_pipe_op_name(act.op), compute ? "compute" : "pp", t0,
                         loom_trace_now_us() - t0, step + 1, mb);
    }
    loom_status sent = wait_sends(p);
    if (st == LOOM_OK) st = sent;
    if (st == LOOM_OK && p->slack) st = slack_update(p);
    return st;
}

/* ---- forward only (validation) --------------------------------------------------------------- */

loom_status loom_pipeline_forward(loom_pipeline *p, const int32_t *inputs, const int32_t *targets,
                                  int b, double *loss) {
    loom_gpt *model = p->model;
    int T = p->T, stage = p->mesh->pp_rank;
    int64_t rows = (int64_t)b * T, cols = model->config.channels;
    loom_status st = LOOM_OK;
    loom_gpt_use_slot(model, 0);
    if (!model->has_embedding) st = recv_decode(p, KIND_ACT, 0, p->act_in, rows, cols, stage - 1);
    if (st != LOOM_OK) return st;
    loom_comm_progress("validation");
    float mean = loom_gpt_forward_stage(model, inputs, p->act_in, targets, b, T);
    *loss = model->has_head ? (double)mean : 0.0;
    if (!model->has_head) {
        st = encode_send(p, KIND_ACT, 0, loom_gpt_stage_output(model), rows, cols, stage + 1);
        loom_status sent = wait_sends(p);
        if (st == LOOM_OK) st = sent;
    }
    return st;
}

/* ---- compression state ------------------------------------------------------------------------
 */

void loom_pipeline_commit(loom_pipeline *p, int accept) {
    if (p->encoder[KIND_GRAD]) loom_compressor_commit(p->encoder[KIND_GRAD], accept);
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

loom_compressor *loom_pipeline_compressor(loom_pipeline *p) {
    return p->encoder[KIND_GRAD];
}
