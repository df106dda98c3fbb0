/*
 * outer.c — islands' outer optimiser (DiLoCo): every H inner steps, the parameters' change over
 * the round is averaged over the islands and the outer optimiser moves the round-start
 * parameters by it; every island continues from them.
 *
 * Each rank owns the same range of its stage's flat parameter buffer as ZeRO shards it (its
 * data-parallel shard; the whole buffer at dp 1), keeps for it the parameters at the start of
 * the round, the outer momentum and (with compression) the error-feedback residual, and
 * averages its range with the ranks at the same place in the other islands (mesh->across): an
 * island sends the model once per round, not dp times. The replicas of an island then gather the
 * ranges again (ZeRO-3 keeps its shard and regathers its whole-held units).
 *
 * Fragments (Streaming DiLoCo): the stage's units (the embeddings, each block, the final
 * LayerNorm) fall into F groups of whole layers, the embeddings with the first and the final
 * LayerNorm with the last; the flat buffer holds units in model order, so a fragment is one
 * contiguous piece of it. Fragment f syncs after the inner steps t with t mod H = floor(f H / F)
 * (t counted from 1), so its first round is shorter when f > 0.
 *
 * The outer step, per entry, with the averaged outer gradient d = mean(start - now):
 *   m = momentum m + d;  nesterov: start -= lr (d + momentum m);  sgd: start -= lr m;
 *   now = start.
 * Outer SGD with lr 1 and momentum 0 sets start to the islands' mean: one island then trains
 * exactly as without islands.
 *
 * Overlap (--outer-overlap-steps tau > 0): a fragment's outer gradient is sent after step t and
 * its result applied after step t + tau, never "when it arrives", so training does not depend on
 * timing; meanwhile the island trains on, and it continues from the new round start plus what
 * it trained since the send (now = start + (now - sent): the island's own progress is kept, the
 * outer step replaces what it had at the send). The responder thread's MPI calls move the
 * transfers on; every step's end is a polling point, where a compressed sync whose reduce-scatter
 * is over starts its all-gather (polled without the comm deadline, which the wait that applies
 * the sync keeps). A run's last step applies every sync still in flight.
 *
 * Not here: when a step runs (the trainer), the wire formats (compress/qreduce.c).
 */
#include "loom/compress.h"
#include "parallel/parallel_internal.h"

#include <stdlib.h>
#include <string.h>

enum { OUTER_TAG = 7100 }; /* qreduce's messages on the across group */

struct loom_outer {
    const loom_mesh *mesh;
    loom_gpt *model;
    loom_grad_sync *sync;
    loom_plan_islands cfg;
    loom_zero_shard range; /* this rank's: flat offsets [begin, end) */
    size_t n;              /* end - begin */
    float *start;          /* (n) the round-start (global) parameters */
    float *momentum;       /* (n) */
    float *delta;          /* (n) scratch: the outer gradient, the island's parameters */
    float *residual;       /* (n) error feedback of compressed outer gradients (NULL: none) */
    size_t *frag;          /* (F + 1) offsets into the range of each fragment's piece */
    loom_qreduce **wires;  /* (F) compressed: one plan per fragment's piece (NULL: fp32) */
    int64_t *bounds;       /* (dp + 1) the island's ranges, for gathering them back */
    float *sent;           /* (n) overlapped syncs: the island's parameters when each was sent */
    loom_dp_compress *matrices; /* PowerSGD / top-k outer gradients of this replica's buckets */
    loom_grad_bucket *buckets;  /* the stage's buckets of whole matrices, none across fragments */
    int num_buckets;
    loom_grad_bucket *mine; /* (num_mine) this replica's of them (shallow copies), in order */
    int *mine_fragment;     /* (num_mine) the fragment of each */
    int num_mine;
    int64_t *groups;            /* ((F) x (dp + 1)) flat offsets: replica r compresses fragment f's
                                   [groups[f (dp + 1) + r], groups[f (dp + 1) + r + 1]) */
    float *full;                /* matrix methods at dp > 1: (the stage) the outer gradient, every
                                   replica's range gathered, then every group's sum */
    int64_t *pieces;            /* (dp + 1) scratch: the replicas' ranges cut to a fragment */
    loom_comm **fragment_comms; /* matrix methods with F > 1, overlapped: one copy of across a
                                   fragment (the rounds of two fragments in flight start in any
                                   order) */
    struct pending {
        int64_t apply_at;           /* the step whose end applies it (0: none in flight) */
        loom_comm_request *request; /* fp32's all-reduce; a matrix method's round */
        int bucket;                 /* a matrix method's: the index in mine in flight (num_mine:
                                       its rounds are over) */
        int summed;                 /* its sum is in delta already (loom_outer_settle) */
        int gathering;              /* compressed: its reduce-scatter is over, the all-gather on */
    } * pending;                    /* (F) one sync in flight at most per fragment */
    loom_outer_stats stats;
};

/* This rank's parameters at flat offset `offset` (ZeRO-3 holds only its range). */
static float *params_at(const loom_outer *o, size_t offset) {
    return o->model->params_memory + (offset - o->model->params_begin);
}

/* The global layer of local layer l. */
static int global_layer(const loom_gpt *m, int l) {
    for (int c = 0; c < m->num_chunks; c++) {
        int layers = m->chunks[c].end_layer - m->chunks[c].first_layer;
        if (l < layers) return m->chunks[c].first_layer + l;
        l -= layers;
    }
    return m->config.num_layers - 1;
}

/* Fragment of unit u: its layer's group, the embeddings the first's, the final LayerNorm the
 * last's. */
static int unit_fragment(const loom_gpt *m, int u, int fragments) {
    if (u == 0) return 0;
    if (u == m->num_units - 1) return fragments - 1;
    int layer = global_layer(m, u - 1);
    return (int)((int64_t)layer * fragments / m->config.num_layers);
}

/* Fragment f's start in the stage's flat buffer (f = F: its end). */
static size_t fragment_begin(const loom_outer *o, int f) {
    const loom_gpt *m = o->model;
    if (f == 0) return 0;
    for (int u = 0; f < o->cfg.fragments && u < m->num_units; u++) {
        if (unit_fragment(m, u, o->cfg.fragments) >= f) return m->unit_begin[u];
    }
    return m->num_params;
}

/* Each fragment's piece of the range: frag[f] .. frag[f + 1] (offsets from range.begin). */
static void split_fragments(loom_outer *o) {
    size_t lo = o->range.begin, hi = o->range.end;
    for (int f = 0; f <= o->cfg.fragments; f++) {
        size_t at = fragment_begin(o, f);
        at = at < lo ? lo : at > hi ? hi : at;
        o->frag[f] = at - lo;
    }
}

/* The fragment bucket b lies in. */
static int bucket_fragment(const loom_outer *o, const loom_grad_bucket *b) {
    int f = 0;
    while (f + 1 < o->cfg.fragments && b->begin >= fragment_begin(o, f + 1)) f++;
    return f;
}

/* The replica that compresses bucket b of fragment f: the one in whose dp-th of the fragment
 * the bucket's middle falls (contiguous shares in buffer order, the same on every island). */
static int bucket_owner(const loom_outer *o, const loom_grad_bucket *b, int f) {
    size_t lo = fragment_begin(o, f), len = fragment_begin(o, f + 1) - lo;
    size_t mid = (b->begin + b->end) / 2 - lo;
    int dp = o->mesh->dp_size;
    int r = len ? (int)((double)mid * dp / (double)len) : 0;
    return r < dp ? r : dp - 1;
}

/* PowerSGD and top-k: the data-parallel machinery's compressed buckets, over the islands (error
 * feedback and PowerSGD's warm starts kept across rounds; seeded alike on every island). No
 * bucket spans two fragments; each fragment's buckets fall to the island's replicas in
 * contiguous shares: each replica compresses its share over the islands (an island sends every
 * matrix once), and the island's replicas then gather the shares' sums. */
static loom_status make_matrices(loom_outer *o) {
    loom_compress_opts opts = {.method = o->cfg.compression,
                               .rank = o->cfg.compression_rank,
                               .fraction = o->cfg.compression_fraction,
                               .error_feedback = 1,
                               .seed = 0x15a4d5};
    const int F = o->cfg.fragments, dp = o->mesh->dp_size;
    size_t *cuts = loom_calloc((size_t)F, sizeof *cuts, "fragment starts");
    if (!cuts) return LOOM_ERR_NOMEM;
    for (int f = 1; f < F; f++) cuts[f - 1] = fragment_begin(o, f);
    loom_status st =
        loom_grad_buckets_make_cut(o->model, (size_t)LOOM_GRAD_BUCKET_DEFAULT_MB * 1048576, cuts,
                                   F - 1, &o->buckets, &o->num_buckets);
    free(cuts);
    if (st != LOOM_OK) return st;
    int n = o->num_buckets > 0 ? o->num_buckets : 1;
    o->mine = loom_calloc((size_t)n, sizeof *o->mine, "outer buckets");
    o->mine_fragment = loom_calloc((size_t)n, sizeof *o->mine_fragment, "outer buckets");
    o->groups = loom_calloc((size_t)F * (size_t)(dp + 1), sizeof *o->groups, "outer groups");
    if (!o->mine || !o->mine_fragment || !o->groups) return LOOM_ERR_NOMEM;
    for (int f = 0; f < F; f++) {
        int64_t *g = o->groups + (size_t)f * (size_t)(dp + 1);
        for (int r = 1; r <= dp; r++) g[r] = (int64_t)fragment_begin(o, f + 1);
        g[0] = (int64_t)fragment_begin(o, f);
    }
    for (int b = 0; b < o->num_buckets; b++) {
        const loom_grad_bucket *bk = &o->buckets[b];
        int f = bucket_fragment(o, bk), r = bucket_owner(o, bk, f);
        int64_t *g = o->groups + (size_t)f * (size_t)(dp + 1);
        for (int q = 1; q <= r; q++) /* replicas 1 .. r start at or before this bucket */
            if ((int64_t)bk->begin < g[q]) g[q] = (int64_t)bk->begin;
        if (r != o->mesh->dp_rank) continue;
        o->mine_fragment[o->num_mine] = f;
        o->mine[o->num_mine++] = *bk;
    }
    if (dp > 1) {
        size_t floats = o->model->num_params ? o->model->num_params : 1;
        o->full = loom_alloc_aligned(floats * sizeof(float), "outer gradient");
        o->pieces = loom_calloc((size_t)dp + 1, sizeof *o->pieces, "outer pieces");
        if (!o->full || !o->pieces) return LOOM_ERR_NOMEM;
    }
    if (F > 1 && o->cfg.overlap_steps > 0) { /* blocking syncs: one fragment's at a time */
        o->fragment_comms = loom_calloc((size_t)F, sizeof *o->fragment_comms, "outer groups");
        if (!o->fragment_comms) return LOOM_ERR_NOMEM;
        for (int f = 0; f < F && st == LOOM_OK; f++) {
            st = loom_comm_split(o->mesh->across, 0, loom_comm_rank(o->mesh->across),
                                 "islands (a fragment's outer gradients)", &o->fragment_comms[f]);
        }
    }
    if (st == LOOM_OK) {
        st = loom_dp_compress_create(&o->matrices, &opts, o->mine, o->num_mine, o->mesh->islands,
                                     -1);
    }
    return st;
}

static loom_status make_wires(loom_outer *o) {
    if (loom_plan_islands_by_matrix(&o->cfg)) return make_matrices(o);
    int K = o->mesh->islands;
    o->wires = loom_calloc((size_t)o->cfg.fragments, sizeof(loom_qreduce *), "outer wire plans");
    int64_t *bounds = loom_calloc((size_t)K + 1, sizeof *bounds, "outer wire bounds");
    loom_status st = o->wires && bounds ? LOOM_OK : LOOM_ERR_NOMEM;
    for (int f = 0; f < o->cfg.fragments && st == LOOM_OK; f++) {
        int64_t len = (int64_t)(o->frag[f + 1] - o->frag[f]);
        for (int k = 0; k <= K; k++) bounds[k] = len * k / K;
        st = loom_qreduce_create(o->mesh->across, bounds, o->cfg.compression, 0, OUTER_TAG + f,
                                 &o->wires[f]);
    }
    free(bounds);
    return st;
}

loom_status loom_outer_create(loom_outer **outer, const loom_mesh *mesh, loom_gpt *model,
                              loom_grad_sync *sync) {
    *outer = NULL;
    const loom_plan *plan = mesh->plan;
    if (plan->islands.count < 1) return LOOM_OK;
    loom_outer *o = loom_calloc(1, sizeof *o, "outer optimiser");
    if (!o) return LOOM_ERR_NOMEM;
    o->mesh = mesh, o->model = model, o->sync = sync, o->cfg = plan->islands;
    o->range = loom_zero_shard_of(model->num_params, mesh->dp_size, mesh->dp_rank);
    o->n = o->range.end > o->range.begin ? o->range.end - o->range.begin : 0;
    size_t bytes = (o->n ? o->n : 1) * sizeof(float);
    o->start = loom_alloc_aligned(bytes, "outer round-start parameters");
    o->momentum = loom_alloc_aligned(bytes, "outer momentum");
    o->delta = loom_alloc_aligned(bytes, "outer gradient");
    o->frag = loom_calloc((size_t)o->cfg.fragments + 1, sizeof *o->frag, "outer fragments");
    o->bounds = loom_calloc((size_t)mesh->dp_size + 1, sizeof *o->bounds, "outer ranges");
    loom_status st =
        o->start && o->momentum && o->delta && o->frag && o->bounds ? LOOM_OK : LOOM_ERR_NOMEM;
    int compressed = o->cfg.compression != LOOM_COMPRESS_NONE;
    if (st == LOOM_OK && compressed && !loom_plan_islands_by_matrix(&o->cfg)) {
        o->residual = loom_alloc_aligned(bytes, "outer error feedback");
        if (!o->residual) st = LOOM_ERR_NOMEM;
    }
    o->pending = loom_calloc((size_t)o->cfg.fragments, sizeof *o->pending, "outer syncs");
    if (st == LOOM_OK && !o->pending) st = LOOM_ERR_NOMEM;
    if (st == LOOM_OK && o->cfg.overlap_steps > 0) {
        o->sent = loom_alloc_aligned(bytes, "outer sent parameters");
        if (!o->sent) st = LOOM_ERR_NOMEM;
    }
    if (st == LOOM_OK) {
        memcpy(o->start, params_at(o, o->range.begin), o->n * sizeof(float));
        memset(o->momentum, 0, o->n * sizeof(float));
        if (o->residual) memset(o->residual, 0, o->n * sizeof(float));
        for (int r = 0; r <= mesh->dp_size; r++) {
            size_t at = (size_t)r * o->range.shard;
            o->bounds[r] = (int64_t)(at < model->num_params ? at : model->num_params);
        }
        split_fragments(o);
        if (compressed && mesh->across) st = make_wires(o);
    }
    if (st == LOOM_OK) st = loom_outer_check_start(o);
    if (st == LOOM_OK && mesh->lead) {
        const loom_plan_islands *is = &o->cfg;
        int size = mesh->dp_size * mesh->tp_size * mesh->pp_size;
        loom_info("islands: %d of %d rank%s each; a round is %d inner steps, then outer %s (lr "
                  "%g, momentum %g) over %d fragment%s, outer gradients %s; outer state %.1f MiB "
                  "a rank",
                  is->count, size, size == 1 ? "" : "s", is->inner_steps,
                  loom_outer_optimizer_name(is->optimizer), is->lr, is->momentum, is->fragments,
                  is->fragments == 1 ? "" : "s", loom_compress_method_name(is->compression),
                  (double)loom_outer_state_bytes(o) / 1048576.0);
    }
    if (st != LOOM_OK) {
        loom_outer_free(o);
        return st;
    }
    *outer = o;
    return LOOM_OK;
}

void loom_outer_free(loom_outer *o) {
    if (!o) return;
    /* a sync still in flight (a run stopped early) ends before its buffers go */
    for (int f = 0; o->pending && f < o->cfg.fragments; f++) {
        if (o->pending[f].request) loom_comm_wait(o->pending[f].request);
        if (o->pending[f].apply_at && !o->pending[f].summed && o->wires)
            loom_qreduce_wait(o->wires[f]);
    }
    free(o->pending);
    free(o->sent);
    loom_dp_compress_free(o->matrices);
    loom_grad_buckets_free(o->buckets, o->num_buckets);
    free(o->mine);
    free(o->mine_fragment);
    free(o->groups);
    loom_free_aligned(o->full);
    free(o->pieces);
    for (int f = 0; o->fragment_comms && f < o->cfg.fragments; f++)
        loom_comm_free(o->fragment_comms[f]);
    free(o->fragment_comms);
    for (int f = 0; o->wires && f < o->cfg.fragments; f++) loom_qreduce_free(o->wires[f]);
    free(o->wires);
    free(o->start);
    free(o->momentum);
    free(o->delta);
    free(o->residual);
    free(o->frag);
    free(o->bounds);
    free(o);
}

loom_status loom_outer_check_start(loom_outer *o) {
    if (!o || !o->mesh->across) return LOOM_OK;
    uint64_t h = loom_parallel_checksum(o->start, o->n * sizeof(float));
    double hi[2] = {(double)(h >> 32), (double)(h & 0xffffffffu)};
    double lo[2] = {-hi[0], -hi[1]};
    loom_status st = loom_comm_allreduce_f64(o->mesh->across, hi, 2, LOOM_REDUCE_MAX);
    if (st == LOOM_OK) st = loom_comm_allreduce_f64(o->mesh->across, lo, 2, LOOM_REDUCE_MAX);
    if (st != LOOM_OK) return st;
    if (hi[0] != -lo[0] || hi[1] != -lo[1]) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "islands: the islands start from different parameters (rank %d of "
                         "the job, island %d, and its places in the other islands); every "
                         "island must start from the same model (the same --seed, --init-from "
                         "or checkpoint)",
                         loom_comm_rank(o->mesh->job), o->mesh->island);
    }
    return LOOM_OK;
}

/* The group fragment f's matrix rounds run on. */
static loom_comm *fragment_comm(const loom_outer *o, int f) {
    return o->fragment_comms ? o->fragment_comms[f] : o->mesh->across;
}

/* The buffer the matrix rounds read and write, by flat offset: the gathered outer gradient at
 * dp > 1, else delta (whose range is then the whole buffer). */
static float *matrix_work(const loom_outer *o) {
    return o->full ? o->full : o->delta;
}

/* The first of this replica's buckets at index `from` or later in fragment f (num_mine: none). */
static int next_mine(const loom_outer *o, int f, int from) {
    while (from < o->num_mine && o->mine_fragment[from] != f) from++;
    return from;
}

/* An all-gather over the island's replicas of the blocks bounds[r] .. bounds[r + 1] of `full`. */
static loom_status gather_island(loom_outer *o, const int64_t *bounds) {
    loom_comm_request *request = NULL;
    loom_status st = loom_comm_iallgatherv_f32(o->mesh->dp, o->full, bounds, &request);
    return st == LOOM_OK ? loom_comm_wait(request) : st;
}

/* Starts fragment f's matrix rounds: at dp > 1 the island first gathers the fragment's outer
 * gradient from every replica's range (fast links), then each replica compresses its share. */
static loom_status start_matrices(loom_outer *o, int f, size_t lo, size_t hi) {
    struct pending *p = &o->pending[f];
    loom_status st = LOOM_OK;
    if (o->full) {
        const int dp = o->mesh->dp_size;
        const int64_t *g = o->groups + (size_t)f * (size_t)(dp + 1);
        for (int r = 0; r <= dp; r++) { /* the replicas' ranges, cut to the fragment */
            int64_t at = o->bounds[r];
            o->pieces[r] = at < g[0] ? g[0] : at > g[dp] ? g[dp] : at;
        }
        memcpy(o->full + o->range.begin + lo, o->delta + lo, (hi - lo) * sizeof(float));
        st = gather_island(o, o->pieces);
    }
    p->bucket = next_mine(o, f, 0);
    if (st == LOOM_OK && p->bucket < o->num_mine)
        st = loom_dp_compress_start(o->matrices, p->bucket, matrix_work(o), fragment_comm(o, f),
                                    &p->request);
    return st;
}

/* Moves fragment f's matrix rounds on: each completed round starts the next (a bucket's second,
 * or the next bucket's first); waits for each when `wait`, else returns at the first still
 * running. */
static loom_status drive_matrices(loom_outer *o, int f, int wait) {
    struct pending *p = &o->pending[f];
    float *work = matrix_work(o);
    loom_status st = LOOM_OK;
    while (p->bucket < o->num_mine && st == LOOM_OK) {
        if (p->request) {
            int done = 1;
            st = wait ? loom_comm_wait(p->request) : loom_comm_poll(p->request, &done);
            if (st != LOOM_OK || done) p->request = NULL;
            if (st != LOOM_OK || !done) break;
        }
        st = loom_dp_compress_next(o->matrices, p->bucket, work, fragment_comm(o, f), &p->request);
        if (st != LOOM_OK || p->request) continue;
        loom_dp_compress_commit_bucket(o->matrices, p->bucket, 1);
        p->bucket = next_mine(o, f, p->bucket + 1);
        if (p->bucket < o->num_mine) {
            st = loom_dp_compress_start(o->matrices, p->bucket, work, fragment_comm(o, f),
                                        &p->request);
        }
    }
    return st;
}

/* Ends fragment f's matrix rounds; at dp > 1 the island gathers every share's sum and each
 * replica takes its range's. */
static loom_status finish_matrices(loom_outer *o, int f, size_t lo, size_t hi) {
    loom_status st = drive_matrices(o, f, 1);
    if (st == LOOM_OK && o->full) {
        st = gather_island(o, o->groups + (size_t)f * (size_t)(o->mesh->dp_size + 1));
        memcpy(o->delta + lo, o->full + o->range.begin + lo, (hi - lo) * sizeof(float));
    }
    return st;
}

/* Starts summing fragment f's outer gradient over the islands in delta[lo, hi) (fp32: an
 * all-reduce; compressed: the quantised reduce-scatter, whose all-gather finish_sum starts;
 * PowerSGD / top-k: the matrix rounds). */
static loom_status start_sum(loom_outer *o, int f, size_t lo, size_t hi) {
    if (!o->mesh->across) return LOOM_OK;
    if (o->matrices) return start_matrices(o, f, lo, hi);
    if (hi == lo) return LOOM_OK;
    if (o->wires)
        return loom_qreduce_reduce_scatter_start(o->wires[f], o->delta + lo, o->residual + lo);
    return loom_comm_iallreduce_f32(o->mesh->across, o->delta + lo, (int64_t)(hi - lo),
                                    &o->pending[f].request);
}

/* Ends fragment f's sum: every island holds it in delta[lo, hi). */
static loom_status finish_sum(loom_outer *o, int f, size_t lo, size_t hi) {
    if (o->pending[f].summed) {
        o->pending[f].summed = 0;
        return LOOM_OK;
    }
    if (!o->mesh->across) return LOOM_OK;
    if (o->matrices) return finish_matrices(o, f, lo, hi);
    if (hi == lo) return LOOM_OK;
    if (!o->wires) {
        loom_status st = loom_comm_wait(o->pending[f].request);
        o->pending[f].request = NULL;
        return st;
    }
    loom_qreduce *wire = o->wires[f];
    loom_status st = LOOM_OK;
    if (!o->pending[f].gathering) {
        st = loom_qreduce_wait(wire);
        if (st == LOOM_OK) st = loom_qreduce_allgather_start(wire, o->delta + lo);
    }
    o->pending[f].gathering = 0;
    if (st == LOOM_OK) st = loom_qreduce_wait(wire);
    return st;
}

/* A polling point (every step's end): each compressed sync in flight whose reduce-scatter has
 * ended starts its all-gather, and each matrix sync's completed round starts the next, so the
 * whole sync runs behind the inner steps (the result is the same bits whenever they start).
 * Polled without the deadline: the wait that applies the sync keeps it. */
static loom_status progress(loom_outer *o) {
    loom_status st = LOOM_OK;
    for (int f = 0; f < o->cfg.fragments && st == LOOM_OK; f++) {
        struct pending *p = &o->pending[f];
        if (!p->apply_at || p->summed) continue;
        if (o->matrices) {
            st = drive_matrices(o, f, 0);
            continue;
        }
        if (!o->wires || p->gathering || o->frag[f + 1] == o->frag[f]) continue;
        int done = 0;
        st = loom_qreduce_poll(o->wires[f], &done);
        if (st == LOOM_OK && done) {
            st = loom_qreduce_allgather_start(o->wires[f], o->delta + o->frag[f]);
            p->gathering = 1;
        }
    }
    return st;
}

/* Sends fragment f's outer gradient (start - now on its piece); applied after `apply_at`. */
static loom_status send_fragment(loom_outer *o, int f, int64_t apply_at) {
    size_t lo = o->frag[f], hi = o->frag[f + 1];
    float *now = params_at(o, o->range.begin);
    for (size_t i = lo; i < hi; i++) o->delta[i] = o->start[i] - now[i];
    if (o->sent) memcpy(o->sent + lo, now + lo, (hi - lo) * sizeof(float));
    o->pending[f].apply_at = apply_at;
    int64_t n = (int64_t)(hi - lo), K = o->mesh->islands;
    o->stats.bytes_raw += K > 1 ? 2 * (K - 1) * n * (int64_t)sizeof(float) / K : 0;
    o->stats.syncs++;
    return start_sum(o, f, lo, hi);
}

/* Fragment f's outer step, once its sum is in: the outer optimiser on the round starts, and the
 * island continues from them plus what it trained since the send (nothing when the sync
 * blocked). */
static loom_status apply_fragment(loom_outer *o, int f) {
    size_t lo = o->frag[f], hi = o->frag[f + 1];
    o->pending[f].apply_at = 0;
    loom_status st = finish_sum(o, f, lo, hi);
    if (st != LOOM_OK) return st;
    float *now = params_at(o, o->range.begin);
    float inv = 1.0f / (float)o->mesh->islands, mu = (float)o->cfg.momentum;
    float lr = (float)o->cfg.lr;
    int nesterov = o->cfg.optimizer == LOOM_OUTER_NESTEROV;
    for (size_t i = lo; i < hi; i++) {
        float d = o->delta[i] * inv;
        float m = mu * o->momentum[i] + d;
        o->momentum[i] = m;
        o->start[i] -= lr * (nesterov ? d + mu * m : m);
        now[i] = o->sent ? o->start[i] + (now[i] - o->sent[i]) : o->start[i];
    }
    return LOOM_OK;
}

/* Every replica of the island gets every range back (ZeRO-3: its whole-held units). */
static loom_status share(loom_outer *o) {
    if (o->mesh->plan->zero >= 1) return loom_grad_sync_share_params(o->sync);
    if (o->mesh->dp_size < 2) return LOOM_OK;
    loom_comm_request *request = NULL;
    loom_status st =
        loom_comm_iallgatherv_f32(o->mesh->dp, o->model->params_memory, o->bounds, &request);
    if (st == LOOM_OK) st = loom_comm_wait(request);
    return st;
}

int loom_outer_due(const loom_outer *o, int64_t done, int fragment) {
    int64_t H = o->cfg.inner_steps, offset = (int64_t)fragment * H / o->cfg.fragments;
    return done > 0 && done % H == offset;
}

loom_status loom_outer_land(loom_outer *o, int64_t done, int64_t last_step) {
    if (!o) return LOOM_OK;
    int last = done >= last_step, applied = 0;
    double t0 = loom_now();
    loom_status st = o->mesh->across ? progress(o) : LOOM_OK;
    /* the syncs sent overlap_steps ago land now (all of them after the last step) */
    for (int f = 0; f < o->cfg.fragments && st == LOOM_OK; f++) {
        int64_t at = o->pending[f].apply_at;
        if (at > 0 && (at <= done || last)) st = apply_fragment(o, f), applied++;
    }
    if (applied && st == LOOM_OK) st = share(o);
    o->stats.seconds += loom_now() - t0;
    return st;
}

loom_status loom_outer_send(loom_outer *o, int64_t done, int64_t last_step) {
    if (!o) return LOOM_OK;
    int last = done >= last_step, applied = 0, tau = o->cfg.overlap_steps;
    double t0 = loom_now();
    loom_status st = LOOM_OK;
    /* the fragments due send theirs: at once (blocking) or to land overlap_steps later */
    for (int f = 0; f < o->cfg.fragments && st == LOOM_OK; f++) {
        if (!loom_outer_due(o, done, f)) continue;
        st = send_fragment(o, f, done + tau);
        if (st == LOOM_OK && (tau == 0 || last)) st = apply_fragment(o, f), applied++;
    }
    if (applied && st == LOOM_OK) st = share(o);
    o->stats.seconds += loom_now() - t0;
    return st;
}

loom_status loom_outer_step(loom_outer *o, int64_t done, int64_t last_step) {
    loom_status st = loom_outer_land(o, done, last_step);
    return st == LOOM_OK ? loom_outer_send(o, done, last_step) : st;
}

int loom_outer_meets(const loom_outer *o, int64_t done, int64_t last_step) {
    if (!o || !o->mesh->across || done >= last_step) return 1;
    for (int f = 0; f < o->cfg.fragments; f++)
        if (loom_outer_due(o, done, f)) return 1;
    return 0;
}

int loom_outer_meeting_gap(const loom_outer *o) {
    if (!o || !o->mesh->across) return 1;
    return o->cfg.inner_steps; /* sends are never further apart than a round */
}

loom_status loom_outer_swap(loom_outer *o) {
    if (!o) return LOOM_OK;
    float *now = params_at(o, o->range.begin);
    for (size_t i = 0; i < o->n; i++) {
        float x = now[i];
        now[i] = o->start[i];
        o->start[i] = x;
    }
    return share(o);
}

void loom_outer_take_stats(loom_outer *o, loom_outer_stats *stats) {
    if (!o) return;
    for (int f = 0; o->fragment_comms && f < o->cfg.fragments; f++) {
        stats->bytes += loom_comm_get_stats(o->fragment_comms[f]).bytes;
        loom_comm_reset_stats(o->fragment_comms[f]);
    }
    stats->bytes_raw += o->stats.bytes_raw;
    stats->syncs += o->stats.syncs;
    stats->seconds += o->stats.seconds;
    o->stats = (loom_outer_stats){0};
}

int loom_outer_compressor_count(const loom_outer *o) {
    return o && o->matrices ? loom_dp_compress_count(o->matrices) : 0;
}

loom_compressor *loom_outer_compressor(loom_outer *o, int i) {
    return loom_dp_compress_get(o->matrices, i);
}

size_t loom_outer_state_bytes(const loom_outer *o) {
    if (!o) return 0;
    return o->n * sizeof(float) * (size_t)(3 + (o->residual != NULL) + (o->sent != NULL)) +
           (o->matrices ? loom_dp_compress_state_bytes(o->matrices) : 0) +
           (o->full ? o->model->num_params * sizeof(float) : 0);
}

/* ---- checkpoints --------------------------------------------------------------------------- */

void loom_outer_buffers(loom_outer *o, loom_outer_buffers_view *view) {
    view->range = o->range;
    view->start = o->start, view->momentum = o->momentum, view->residual = o->residual;
    view->fragments = o->cfg.fragments;
}

loom_status loom_outer_settle(loom_outer *o) {
    loom_status st = LOOM_OK;
    for (int f = 0; o && f < o->cfg.fragments && st == LOOM_OK; f++) {
        if (!o->pending[f].apply_at || o->pending[f].summed) continue;
        st = finish_sum(o, f, o->frag[f], o->frag[f + 1]);
        o->pending[f].summed = 1;
    }
    return st;
}

int64_t loom_outer_in_flight(loom_outer *o, int f, float **sum, float **sent, size_t *lo,
                             size_t *hi) {
    *lo = o->frag[f], *hi = o->frag[f + 1];
    *sum = o->delta + *lo;
    *sent = o->sent ? o->sent + *lo : NULL;
    return o->pending[f].apply_at;
}

void loom_outer_set_in_flight(loom_outer *o, int f, int64_t apply_at) {
    o->pending[f].apply_at = apply_at;
    o->pending[f].summed = apply_at > 0;
    o->pending[f].gathering = 0;
}

loom_status loom_outer_restart(loom_outer *o) {
    if (!o) return LOOM_OK;
    for (int f = 0; f < o->cfg.fragments; f++) loom_outer_set_in_flight(o, f, 0);
    memcpy(params_at(o, o->range.begin), o->start, o->n * sizeof(float));
    return share(o);
}
