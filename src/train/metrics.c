/*
 * metrics.c — metrics.jsonl: one JSON object per step (loss, lr, grad norm, time, tokens/s,
 * MFU, and per group the bytes sent and seconds spent waiting) and one per validation, written
 * with jansson; the one reader of such files; and the loss series kept in memory for the plot
 * (a resumed run starts from the records it keeps).
 *
 * Not here: drawing (plot.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "train/plot.h"
#include "train/train_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- reading ------------------------------------------------------------------------------------
 */

static double number_or_nan(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

loom_status loom_metrics_read(const char *path, loom_metrics_record **records, size_t *count) {
    *records = NULL, *count = 0;
    char *text;
    size_t size;
    loom_status st = loom_read_file(path, &text, &size);
    if (st != LOOM_OK) return st;
    size_t cap = 1;
    for (size_t i = 0; i < size; i++) cap += text[i] == '\n';
    loom_metrics_record *out = loom_calloc(cap, sizeof *out, "metrics records");
    if (!out) {
        free(text);
        return LOOM_ERR_NOMEM;
    }
    size_t n = 0;
    static const char *const groups[3] = {"dp", "tp", "pp"};
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        size_t len = next ? (size_t)(next - line) : strlen(line);
        json_t *obj = json_loadb(line, len, 0, NULL);
        json_t *step = json_object_get(obj, "step");
        if (json_is_integer(step)) {
            loom_metrics_record *r = &out[n++];
            r->step = json_integer_value(step);
            r->val_loss = number_or_nan(obj, "val_loss");
            r->is_validation = json_object_get(obj, "val_loss") != NULL;
            r->loss = number_or_nan(obj, "loss");
            r->lr = number_or_nan(obj, "lr");
            r->grad_norm = number_or_nan(obj, "grad_norm");
            r->ms = number_or_nan(obj, "ms");
            r->tokens_per_s = number_or_nan(obj, "tokens_per_s");
            r->mfu = number_or_nan(obj, "mfu");
            for (int g = 0; g < 3; g++) {
                char key[16];
                snprintf(key, sizeof key, "%s_s", groups[g]);
                r->comm_s[g] = number_or_nan(obj, key);
                snprintf(key, sizeof key, "%s_bytes", groups[g]);
                r->comm_bytes[g] = number_or_nan(obj, key);
            }
            r->skipped = json_is_true(json_object_get(obj, "skipped"));
        }
        json_decref(obj);
        line = next ? next + 1 : NULL;
    }
    free(text);
    *records = out, *count = n;
    return LOOM_OK;
}

/* ---- writing ------------------------------------------------------------------------------------
 */

struct loom_metrics {
    char path[LOOM_PATH_MAX + 32];
    FILE *file;
    int64_t *steps, *val_steps; /* the series for the plot */
    double *loss, *val_loss;
    size_t n, n_val, cap, cap_val;
};

static int grow(void **array, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 1;
    size_t bigger = *cap ? *cap * 2 : 256;
    while (bigger < need) bigger *= 2;
    void *p = realloc(*array, bigger * size);
    if (!p) return 0;
    *array = p, *cap = bigger;
    return 1;
}

/* Appends a point; a series' two arrays grow in step from the same capacity, so one count
 * of it serves both. */
static loom_status keep_point(loom_metrics *m, int validation, int64_t step, double value) {
    if (validation) {
        size_t cap = m->cap_val;
        if (!grow((void **)&m->val_steps, &cap, m->n_val + 1, sizeof *m->val_steps) ||
            !grow((void **)&m->val_loss, &m->cap_val, m->n_val + 1, sizeof *m->val_loss)) {
            return loom_fail(LOOM_ERR_NOMEM, "out of memory keeping the loss series");
        }
        m->val_steps[m->n_val] = step, m->val_loss[m->n_val++] = value;
    } else {
        size_t cap = m->cap;
        if (!grow((void **)&m->steps, &cap, m->n + 1, sizeof *m->steps) ||
            !grow((void **)&m->loss, &m->cap, m->n + 1, sizeof *m->loss)) {
            return loom_fail(LOOM_ERR_NOMEM, "out of memory keeping the loss series");
        }
        m->steps[m->n] = step, m->loss[m->n++] = value;
    }
    return LOOM_OK;
}

/* Keeps the records of steps up to `step` (a resumed run rewrites the rest) and their series. */
static loom_status keep_until(loom_metrics *m, int64_t step) {
    if (access(m->path, F_OK) != 0) return LOOM_OK;
    char *text;
    size_t size;
    loom_status st = loom_read_file(m->path, &text, &size);
    if (st != LOOM_OK) return st;
    char *kept = loom_malloc(size + 1, "metrics");
    if (!kept) {
        free(text);
        return LOOM_ERR_NOMEM;
    }
    size_t used = 0;
    for (char *line = text; st == LOOM_OK && line && *line;) {
        char *next = strchr(line, '\n');
        size_t len = next ? (size_t)(next - line) : strlen(line);
        json_t *obj = json_loadb(line, len, 0, NULL);
        json_t *s = json_object_get(obj, "step");
        if (json_is_integer(s) && json_integer_value(s) <= step) {
            memcpy(kept + used, line, len);
            used += len;
            kept[used++] = '\n';
            json_t *l = json_object_get(obj, "loss"), *vl = json_object_get(obj, "val_loss");
            if (json_is_number(l))
                st = keep_point(m, 0, json_integer_value(s), json_number_value(l));
            if (st == LOOM_OK && json_is_number(vl)) {
                st = keep_point(m, 1, json_integer_value(s), json_number_value(vl));
            }
        }
        json_decref(obj);
        line = next ? next + 1 : NULL;
    }
    if (st == LOOM_OK) st = loom_write_file_atomic(m->path, kept, used);
    free(text);
    free(kept);
    return st;
}

loom_status loom_metrics_open(loom_metrics **out, const char *dir, int64_t resume_step) {
    *out = NULL;
    loom_metrics *m = loom_calloc(1, sizeof *m, "metrics");
    if (!m) return LOOM_ERR_NOMEM;
    loom_status st = loom_path_join(m->path, sizeof m->path, dir, "metrics.jsonl");
    if (st == LOOM_OK && resume_step >= 0) st = keep_until(m, resume_step);
    if (st == LOOM_OK) {
        m->file = fopen(m->path, resume_step >= 0 ? "a" : "w");
        if (!m->file) st = loom_fail(LOOM_ERR_IO, "%s: cannot open for writing", m->path);
    }
    if (st != LOOM_OK) {
        loom_metrics_close(m);
        return st;
    }
    *out = m;
    return LOOM_OK;
}

void loom_metrics_close(loom_metrics *m) {
    if (!m) return;
    if (m->file) fclose(m->file);
    free(m->steps), free(m->loss), free(m->val_steps), free(m->val_loss);
    free(m);
}

/* A finite number, or null (JSON has no NaN). */
static json_t *number(double value) {
    return isfinite(value) ? json_real(value) : json_null();
}

static loom_status write_record(loom_metrics *m, json_t *obj) {
    int bad = !obj || json_dumpf(obj, m->file, JSON_REAL_PRECISION(9)) != 0 ||
              fputc('\n', m->file) == EOF || fflush(m->file) != 0;
    json_decref(obj);
    return bad ? loom_fail(LOOM_ERR_IO, "%s: cannot write a metrics record", m->path) : LOOM_OK;
}

/* Counters summed over every rank of the job (so a compressed send on any stage shows). */
enum {
    SUM_DP_BYTES,
    SUM_TP_BYTES,
    SUM_PP_BYTES,
    SUM_DP_SAVED,
    SUM_PP_SAVED,
    SUM_PP_GRAD,
    SUM_PP_GRAD_RAW,
    SUM_COMPRESS_S,
    SUM_RESIDUAL_SQ,
    SUM_INPUT_SQ,
    SUM_SENDS,
    SUM_SENDS_COMPRESSED,
    SUM_OUTER_BYTES,
    SUM_OUTER_RAW,
    SUM_OUTER_SYNCS,
    SUM_OUTER_S,
    SUM_LOSS, /* islands: of every rank, each its island's */
    SUM_LOSS_SQ,
    SUM_COUNT
};

/* This rank's counters of the step, taken (and reset) into v[SUM_COUNT]; its own waiting
 * seconds per group into own_s. */
static void take_counters(const loom_step_record *r, double v[SUM_COUNT], double own_s[3]) {
    loom_comm *groups[3] = {r->mesh->dp, r->mesh->tp, r->mesh->pp};
    loom_comm_stats stats[3];
    for (int g = 0; g < 3; g++) {
        stats[g] = (loom_comm_stats){0};
        if (!groups[g]) continue;
        stats[g] = loom_comm_get_stats(groups[g]);
        loom_comm_reset_stats(groups[g]);
    }
    if (r->mesh->dp_second) { /* the data-parallel traffic's second group */
        loom_comm_stats second = loom_comm_get_stats(r->mesh->dp_second);
        loom_comm_reset_stats(r->mesh->dp_second);
        stats[0].bytes += second.bytes, stats[0].seconds += second.seconds;
    }
    loom_compress_stats cs = {0};
    if (r->sync) loom_grad_sync_take_stats(r->sync, &cs);
    if (r->pipe) loom_pipeline_take_stats(r->pipe, &cs);
    double taken[SUM_COUNT] = {(double)stats[0].bytes,
                               (double)stats[1].bytes,
                               (double)stats[2].bytes,
                               (double)cs.dp_bytes_saved,
                               (double)cs.pp_bytes_saved,
                               (double)cs.pp_grad_bytes,
                               (double)cs.pp_grad_bytes_raw,
                               cs.compress_s,
                               cs.residual_sq,
                               cs.input_sq,
                               (double)cs.pp_grad_sends,
                               (double)cs.pp_grad_sends_compressed,
                               0.0,
                               0.0,
                               0.0,
                               0.0,
                               r->loss,
                               r->loss * r->loss};
    memcpy(v, taken, sizeof taken);
    for (int g = 0; g < 3; g++) own_s[g] = stats[g].seconds;
}

/* Adds the outer syncs' counters since they were last taken into v. */
static void take_outer(const loom_mesh *mesh, loom_outer *outer, double v[SUM_COUNT]) {
    if (mesh->across) {
        loom_comm_stats across = loom_comm_get_stats(mesh->across);
        loom_comm_reset_stats(mesh->across);
        v[SUM_OUTER_BYTES] += (double)across.bytes;
    }
    loom_outer_stats os = {0};
    loom_outer_take_stats(outer, &os);
    v[SUM_OUTER_BYTES] += (double)os.bytes;
    v[SUM_OUTER_RAW] += (double)os.bytes_raw;
    v[SUM_OUTER_SYNCS] += (double)os.syncs;
    v[SUM_OUTER_S] += os.seconds;
}

/* The progress line's note on islands: the round, the islands' mean loss and its spread. */
static void islands_note(loom_step_record *r, const double *sums) {
    const loom_plan_islands *is = &r->mesh->plan->islands;
    r->islands[0] = '\0';
    if (is->count < 1) return;
    double spread = sqrt(fmax(0.0, sums[SUM_LOSS_SQ] - sums[SUM_LOSS] * sums[SUM_LOSS]));
    snprintf(r->islands, sizeof r->islands, " | round %" PRId64 ", islands' loss %.4f +- %.4f",
             (r->step - 1) / is->inner_steps + 1, sums[SUM_LOSS], spread);
}

/* The progress line's note: how much less each compressed kind of traffic sent. */
static void compression_note(loom_step_record *r, const double *sums) {
    const loom_plan *plan = r->mesh->plan;
    size_t used = 0, cap = sizeof r->compression;
    r->compression[0] = '\0';
    if (plan->dp_compression.method != LOOM_COMPRESS_NONE && sums[SUM_DP_BYTES] > 0) {
        used += (size_t)snprintf(r->compression + used, cap - used, " | dp bytes /%.1f",
                                 (sums[SUM_DP_BYTES] + sums[SUM_DP_SAVED]) / sums[SUM_DP_BYTES]);
    }
    if (plan->pp_compression.method != LOOM_COMPRESS_NONE && sums[SUM_PP_GRAD] > 0 && used < cap) {
        snprintf(r->compression + used, cap - used, " | pp grads /%.1f, %.0f of %.0f sends",
                 sums[SUM_PP_GRAD_RAW] / sums[SUM_PP_GRAD], sums[SUM_SENDS_COMPRESSED],
                 sums[SUM_SENDS]);
    }
}

/* The step's record, from the job's sums (and with islands each island's loss, step time and
 * seconds in outer syncs: each_island, 3 x islands). */
static loom_status write_step(loom_metrics *m, const loom_step_record *r, const double *own_s,
                              const double *sums, const double *each_island) {
    static const char *const names[3] = {"dp", "tp", "pp"};
    json_t *obj = json_object();
    json_object_set_new(obj, "step", json_integer(r->step));
    json_object_set_new(obj, "loss", number(r->loss));
    json_object_set_new(obj, "lr", number(r->lr));
    json_object_set_new(obj, "grad_norm", number(r->grad_norm));
    json_object_set_new(obj, "ms", number(r->seconds * 1e3));
    json_object_set_new(obj, "tokens_per_s", number(r->tokens_per_s));
    json_object_set_new(obj, "mfu", number(r->mfu));
    for (int g = 0; g < 3 && r->mesh->world; g++) {
        char key[16];
        snprintf(key, sizeof key, "%s_bytes", names[g]);
        json_object_set_new(obj, key, json_integer((json_int_t)sums[SUM_DP_BYTES + g]));
        snprintf(key, sizeof key, "%s_s", names[g]);
        json_object_set_new(obj, key, number(own_s[g]));
    }
    if (r->mesh->world && loom_plan_compresses(r->mesh->plan)) {
        static const struct {
            const char *key;
            int a, b; /* sums[a] + sums[b] (b < 0: none) */
        } fields[] = {{"dp_bytes_raw", SUM_DP_BYTES, SUM_DP_SAVED},
                      {"pp_bytes_raw", SUM_PP_BYTES, SUM_PP_SAVED},
                      {"pp_grad_bytes", SUM_PP_GRAD, -1},
                      {"pp_grad_bytes_raw", SUM_PP_GRAD_RAW, -1},
                      {"pp_grad_sends", SUM_SENDS, -1},
                      {"pp_grad_sends_compressed", SUM_SENDS_COMPRESSED, -1}};
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
            double v = sums[fields[i].a] + (fields[i].b >= 0 ? sums[fields[i].b] : 0.0);
            json_object_set_new(obj, fields[i].key, json_integer((json_int_t)v));
        }
        json_object_set_new(obj, "compress_s", number(sums[SUM_COMPRESS_S]));
        double error =
            sums[SUM_INPUT_SQ] > 0 ? sqrt(sums[SUM_RESIDUAL_SQ] / sums[SUM_INPUT_SQ]) : NAN;
        json_object_set_new(obj, "dp_compression_error", number(error));
    }
    if (r->mesh->plan->islands.count > 0) {
        json_object_set_new(obj, "outer_bytes", json_integer((json_int_t)sums[SUM_OUTER_BYTES]));
        json_object_set_new(obj, "outer_bytes_raw", json_integer((json_int_t)sums[SUM_OUTER_RAW]));
        json_object_set_new(obj, "outer_syncs", json_integer((json_int_t)sums[SUM_OUTER_SYNCS]));
        json_object_set_new(obj, "outer_s", number(sums[SUM_OUTER_S]));
        json_object_set_new(obj, "islands_loss", number(sums[SUM_LOSS]));
        double spread = sqrt(fmax(0.0, sums[SUM_LOSS_SQ] - sums[SUM_LOSS] * sums[SUM_LOSS]));
        json_object_set_new(obj, "islands_loss_spread", number(spread));
        /* every island's loss, step time (its first rank's) and time blocked in outer syncs
         * (its ranks' mean): islands run free between syncs and drift apart, and the first
         * to reach a sync waits longest */
        static const char *const per_island[3] = {"islands_losses", "islands_ms",
                                                  "islands_outer_s"};
        for (int f = 0; f < 3; f++) {
            json_t *each = json_array();
            for (int k = 0; k < r->mesh->islands; k++)
                json_array_append_new(each, number(each_island[f * r->mesh->islands + k]));
            json_object_set_new(obj, per_island[f], each);
        }
    }
    json_object_set_new(obj, "skipped", json_boolean(r->skipped));
    loom_status st = write_record(m, obj);
    if (st == LOOM_OK) st = keep_point(m, 0, r->step, r->loss);
    return st;
}

/* ---- the job's view of each step, summed when the islands meet ------------------------------ */

struct loom_step_batch {
    const loom_mesh *mesh;
    int cap, n, width;     /* width: SUM_COUNT + islands' losses, step times, outer seconds */
    loom_step_record *rec; /* (cap) the steps taken since the last flush */
    double *own_s;         /* (cap x 3) this rank's waiting seconds per group */
    double *sums;          /* (cap x width) this rank's counters, then the job's sums */
};

/* Whether this rank fills its island's loss and step-time slots (islands, its first rank). */
static int island_slots(const loom_step_batch *b) {
    return b->width > SUM_COUNT && (!b->mesh->world || loom_comm_rank(b->mesh->world) == 0);
}

/* take_outer, and this rank's share of its island's mean seconds in outer syncs in the island's
 * slot. */
static void take_island_outer(loom_step_batch *b, loom_outer *outer, double *v) {
    double before = v[SUM_OUTER_S];
    take_outer(b->mesh, outer, v);
    if (b->width <= SUM_COUNT) return;
    int ranks = b->mesh->world ? loom_comm_size(b->mesh->world) : 1;
    v[SUM_COUNT + 2 * b->mesh->islands + b->mesh->island] += (v[SUM_OUTER_S] - before) / ranks;
}

loom_status loom_step_batch_create(loom_step_batch **out, const loom_mesh *mesh, int capacity) {
    loom_step_batch *b = loom_calloc(1, sizeof *b, "step batch");
    if (!b) return LOOM_ERR_NOMEM;
    b->mesh = mesh, b->cap = capacity > 0 ? capacity : 1;
    b->width = SUM_COUNT + (mesh->plan->islands.count > 0 ? 3 * mesh->islands : 0);
    b->rec = loom_calloc((size_t)b->cap, sizeof *b->rec, "step batch");
    b->own_s = loom_calloc((size_t)b->cap * 3, sizeof *b->own_s, "step batch");
    b->sums = loom_calloc((size_t)b->cap * (size_t)b->width, sizeof *b->sums, "step batch");
    *out = b;
    if (b->rec && b->own_s && b->sums) return LOOM_OK;
    loom_step_batch_free(b);
    *out = NULL;
    return LOOM_ERR_NOMEM;
}

void loom_step_batch_free(loom_step_batch *b) {
    if (!b) return;
    free(b->rec), free(b->own_s), free(b->sums);
    free(b);
}

loom_status loom_step_batch_add(loom_step_batch *b, const loom_step_record *r) {
    if (b->n == b->cap) {
        return loom_fail(LOOM_ERR_RUNTIME,
                         "metrics: more than %d steps between two meetings of "
                         "the islands",
                         b->cap);
    }
    double *v = b->sums + (size_t)b->n * (size_t)b->width;
    memset(v, 0, (size_t)b->width * sizeof *v);
    take_counters(r, v, b->own_s + 3 * b->n);
    take_island_outer(b, r->outer, v);
    /* every island's loss and step time, its first rank's, in its slots */
    if (island_slots(b)) {
        v[SUM_COUNT + b->mesh->island] = r->loss;
        v[SUM_COUNT + b->mesh->islands + b->mesh->island] = r->seconds * 1e3;
    }
    b->rec[b->n++] = *r;
    return LOOM_OK;
}

void loom_step_batch_add_outer(loom_step_batch *b, loom_outer *outer, double seconds) {
    if (b->n == 0) return;
    double *v = b->sums + (size_t)(b->n - 1) * (size_t)b->width;
    take_island_outer(b, outer, v);
    if (island_slots(b)) v[SUM_COUNT + b->mesh->islands + b->mesh->island] += seconds * 1e3;
    loom_step_record *r = &b->rec[b->n - 1]; /* the step's time holds its syncs' */
    double was = r->seconds;
    r->seconds += seconds;
    if (r->seconds > 0) r->tokens_per_s *= was / r->seconds, r->mfu *= was / r->seconds;
}

loom_status loom_step_batch_flush(loom_step_batch *b, loom_metrics *m, int keep_newest,
                                  void (*shown)(void *ctx, const loom_step_record *r), void *ctx) {
    int n = b->n - (keep_newest && b->n > 0);
    if (n <= 0) return LOOM_OK;
    loom_status st = LOOM_OK;
    int64_t count = (int64_t)n * b->width;
    if (b->mesh->job) st = loom_comm_allreduce_f64(b->mesh->job, b->sums, count, LOOM_REDUCE_SUM);
    int ranks = b->mesh->job ? loom_comm_size(b->mesh->job) : 1;
    for (int i = 0; i < n && st == LOOM_OK; i++) {
        double *sums = b->sums + (size_t)i * (size_t)b->width;
        loom_step_record *r = &b->rec[i];
        sums[SUM_COMPRESS_S] /= ranks;                              /* a rank's mean */
        sums[SUM_OUTER_S] /= ranks, sums[SUM_OUTER_SYNCS] /= ranks; /* a rank's */
        sums[SUM_LOSS] /= ranks, sums[SUM_LOSS_SQ] /= ranks; /* every island has as many ranks */
        compression_note(r, sums);
        islands_note(r, sums);
        if (m) st = write_step(m, r, b->own_s + 3 * i, sums, sums + SUM_COUNT);
        if (st == LOOM_OK && shown) shown(ctx, r);
    }
    if (n < b->n) { /* the newest waits for its outer counters */
        memmove(b->sums, b->sums + (size_t)n * (size_t)b->width,
                (size_t)b->width * sizeof *b->sums);
        memmove(b->own_s, b->own_s + 3 * n, 3 * sizeof *b->own_s);
        b->rec[0] = b->rec[n];
    }
    b->n -= n;
    return st;
}

loom_status loom_metrics_validation(loom_metrics *m, int64_t step, double val_loss) {
    if (!m) return LOOM_OK;
    json_t *obj = json_object();
    json_object_set_new(obj, "step", json_integer(step));
    json_object_set_new(obj, "val_loss", number(val_loss));
    loom_status st = write_record(m, obj);
    if (st == LOOM_OK) st = keep_point(m, 1, step, val_loss);
    return st;
}

loom_status loom_metrics_plot(loom_metrics *m, const char *out) {
    char path[LOOM_PATH_MAX + 32];
    loom_status st = loom_path_join(path, sizeof path, out, "loss.svg");
    if (st != LOOM_OK) return st;
    st = loom_plot_loss_svg(path, "loom: training loss", m->steps, m->loss, m->n, m->val_steps,
                            m->val_loss, m->n_val);
    if (st == LOOM_OK) loom_info("loss plot: %s", path);
    return st;
}

/* ---- measuring a run ------------------------------------------------------------------------ */

void loom_run_print_setup(const loom_train_config *cfg, const loom_plan *plan,
                          const loom_mesh *mesh, const loom_dataset *train_data,
                          const loom_dataset *val_data, const loom_loader *train_loader,
                          double peak_gflops) {
    static const char *const zero_words[] = {"", " with ZeRO-1", " with ZeRO-2", " with ZeRO-3"};
    const loom_gpt_config *mc = &plan->model;
    char llama[240] = "", scaling[80] = "";
    if (mc->rope_scaling.factor > 0) {
        snprintf(scaling, sizeof scaling, " scaled as Llama 3.1's (factor %g from context %g)",
                 mc->rope_scaling.factor, mc->rope_scaling.original_context);
    }
    if (mc->arch == LOOM_ARCH_LLAMA) {
        snprintf(llama, sizeof llama,
                 " (arch llama: %d kv heads, SwiGLU %d, %s head, rope theta %g%s, RMSNorm eps %g)",
                 mc->kv_heads, mc->ffn_dim, mc->untied_head ? "untied" : "tied", mc->rope_theta,
                 scaling, mc->norm_eps);
    }
    loom_info("model: %d layers, %d heads, width %d, context %d, vocab %d (padded %d)%s: %.2fM "
              "parameters",
              mc->num_layers, mc->num_heads, mc->channels, mc->max_seq_len, mc->vocab_size,
              mc->padded_vocab_size, llama, (double)loom_gpt_num_real_params(mc) / 1e6);
    loom_info("data: %zu training tokens (%zu windows of %d)%s",
              loom_dataset_num_tokens(train_data), loom_loader_num_windows(train_loader),
              cfg->seq_len, val_data ? "" : "; no validation");
    char islands[32] = "";
    if (plan->islands.count > 0) snprintf(islands, sizeof islands, "%d islands x ", mesh->islands);
    loom_info("ranks: %lld (%sdata parallel %d%s x tensor parallel %d x pipeline parallel %d%s%s); "
              "global batch %d = micro %d x %d micro-batches x %d%s; threads per rank: %d; sgemm "
              "peak %.1f GFLOP/s (1024^3, measured, x ranks); MFU is against it",
              (long long)loom_plan_job_ranks(plan), islands, mesh->dp_size,
              zero_words[mesh->dp_size > 1 ? plan->zero : 0], mesh->tp_size, mesh->pp_size,
              mesh->pp_size > 1 ? ", schedule " : "",
              mesh->pp_size > 1 ? loom_schedule_kind_name(plan->schedule) : "", plan->global_batch,
              plan->micro_batch, loom_plan_num_micro_batches(plan), mesh->dp_size,
              islands[0] ? " x islands" : "", loom_ops_get_threads(), peak_gflops);
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void loom_run_measure(double *step_seconds, int64_t steps, double tokens_per_step,
                      loom_train_result *r) {
    int64_t from = steps > 1 ? 1 : 0, n = steps - from;
    double median = 0.0;
    if (n > 0) {
        qsort(step_seconds + from, (size_t)n, sizeof(double), compare_double);
        median = step_seconds[from + n / 2];
    }
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    r->median_step_s = median;
    r->median_tokens_per_s = median > 0 ? tokens_per_step / median : 0.0;
    r->peak_rss_bytes = (int64_t)usage.ru_maxrss * 1024;
}

loom_status loom_run_report_prediction(const loom_plan *plan, const loom_mesh *mesh,
                                       const loom_train_result *r) {
    double peak = (double)r->peak_rss_bytes;
    loom_status st = LOOM_OK;
    if (mesh->world) st = loom_comm_allreduce_f64(mesh->world, &peak, 1, LOOM_REDUCE_MAX);
    if (st != LOOM_OK || !mesh->lead) return st;
    int64_t predicted_peak = 0;
    for (int i = 0; i < plan->num_predicted_peak; i++) {
        if (plan->predicted_peak_bytes[i] > predicted_peak) {
            predicted_peak = plan->predicted_peak_bytes[i];
        }
    }
    if (plan->predicted_step_s > 0) {
        loom_info("step time: predicted %.4g s, measured %.4g s (median)", plan->predicted_step_s,
                  r->median_step_s);
    }
    if (plan->predicted_tokens_per_s > 0) {
        loom_info("tokens/s: predicted %.4g, measured %.4g", plan->predicted_tokens_per_s,
                  r->median_tokens_per_s);
    }
    if (predicted_peak > 0) {
        loom_info("peak memory per rank: predicted %.1f MiB, measured %.1f MiB (largest resident "
                  "set of any rank)",
                  (double)predicted_peak / 1048576.0, peak / 1048576.0);
    }
    return LOOM_OK;
}

void loom_run_progress_bar(int64_t run_done, int64_t run_total, int64_t done, int64_t steps,
                           double elapsed_s) {
    double eta = run_done > 0 ? elapsed_s / (double)run_done * (double)(run_total - run_done) : 0.0;
    int width = 30, filled = (int)(width * (double)done / (double)steps);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '=' : ' ';
    bar[width] = '\0';
    printf("\r[%s] %" PRId64 "/%" PRId64 "  ETA %dm%02ds", bar, done, steps, (int)(eta / 60),
           (int)eta % 60);
    fflush(stdout);
}
