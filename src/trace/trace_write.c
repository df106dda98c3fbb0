/*
 * trace_write.c — a trace as Chrome trace-event JSON, and the collective write: each rank
 * serializes its own events (metadata first: process and thread names and sort indices), and
 * world rank 0 writes its text, then every other rank's, received in order in 1 MiB chunks.
 *
 * The protocol, on world (tag LOOM_TRACE_TAG):
 *   1. rank 0 opens the file; broadcast of "go" (int32: 1, or 0 when it could not).
 *   2. ranks 1..n-1, each in turn: a header int64[3] {text bytes or -1 when serializing
 *      failed, events kept, events dropped}, then the text in chunks of TRACE_CHUNK_BYTES.
 *   3. rank 0 finishes the file; broadcast of the final status (int32 loom_status).
 *
 * Not here: recording (trace.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/comm.h"
#include "trace/trace_internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define TRACE_CHUNK_BYTES ((int64_t)1 << 20)

/* ---- a growing text buffer ----------------------------------------------------------------
 * An allocation failure sets `failed`; later appends do nothing, and the caller checks once. */

typedef struct {
    char *data;
    size_t len, cap;
    int failed;
} text_buf;

static int text_reserve(text_buf *buf, size_t extra) {
    if (buf->failed) return 0;
    if (buf->len + extra + 1 <= buf->cap) return 1;
    size_t cap = buf->cap ? buf->cap : 4096;
    while (cap < buf->len + extra + 1) cap *= 2;
    char *grown = realloc(buf->data, cap);
    if (!grown) {
        buf->failed = 1;
        return 0;
    }
    buf->data = grown;
    buf->cap = cap;
    return 1;
}

static void text_put(text_buf *buf, const char *s, size_t n) {
    if (!text_reserve(buf, n)) return;
    memcpy(buf->data + buf->len, s, n);
    buf->len += n;
    buf->data[buf->len] = '\0';
}

/* ---- one rank's events as JSON -------------------------------------------------------------
 * Every item is a jansson value dumped compactly; only the frame around the events array (and
 * the three totals at its end) is literal text, because the ranks' arrays are streamed into one
 * file rather than gathered into one value. Reals keep 15 significant digits: timestamps, rounded
 * to nanoseconds first, print as "1234.567"; counters as they were given. */

#define TRACE_JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(15))

/* s as a JSON string. jansson refuses bytes that are not UTF-8, and a trace must load in strict
 * parsers, so each byte that does not start a valid sequence (utf8proc decides: no overlong
 * forms, no surrogates, nothing past U+10FFFF) becomes U+FFFD. NULL only for memory. */
static json_t *json_text(const char *s) {
    size_t len = strlen(s);
    char *fixed = malloc(3 * len + 1); /* U+FFFD is 3 bytes */
    if (!fixed) return NULL;
    size_t out = 0;
    for (size_t at = 0; at < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n =
            utf8proc_iterate((const utf8proc_uint8_t *)s + at, (utf8proc_ssize_t)(len - at), &cp);
        if (n > 0) {
            memcpy(fixed + out, s + at, (size_t)n);
            out += (size_t)n, at += (size_t)n;
        } else {
            memcpy(fixed + out, "\xef\xbf\xbd", 3);
            out += 3, at++;
        }
    }
    json_t *text = json_stringn(fixed, out);
    free(fixed);
    return text;
}

/* Microseconds rounded to nanoseconds. */
static json_t *json_us(double us) {
    return json_real(round(us * 1e3) / 1e3);
}

/* Appends `item` (taking it; NULL is a failed allocation) to the buffer: dumped straight into the
 * free space, and again after growing it when it did not fit. */
static void text_json(text_buf *buf, json_t *item) {
    size_t need = 0;
    if (item && text_reserve(buf, 256)) {
        size_t room = buf->cap - buf->len - 1;
        need = json_dumpb(item, buf->data + buf->len, room, TRACE_JSON_FLAGS);
        if (need > room) {
            need = text_reserve(buf, need)
                       ? json_dumpb(item, buf->data + buf->len, need, TRACE_JSON_FLAGS)
                       : 0;
        }
    }
    if (need == 0) {
        buf->failed = 1;
    } else {
        buf->len += need;
        buf->data[buf->len] = '\0';
    }
    json_decref(item);
}

/* Every item after the first, and the first too when `leading`, is preceded by ",\n", so the
 * ranks' texts concatenate into one array. */
static void text_separator(text_buf *buf, int *first) {
    if (!*first) text_put(buf, ",\n", 2);
    *first = 0;
}

/* A metadata event {"name":NAME,"ph":"M","pid":PID[,"tid":TID],"args":ARGS} (taking args);
 * tid < 0: a process-wide one. */
static void text_metadata(text_buf *buf, int *first, const char *name, int64_t pid, int tid,
                          json_t *args) {
    text_separator(buf, first);
    json_t *ev = json_pack("{s:s, s:s, s:I}", "name", name, "ph", "M", "pid", (json_int_t)pid);
    if (ev && tid >= 0) json_object_set_new(ev, "tid", json_integer(tid));
    if (ev && json_object_set_new(ev, "args", args) != 0) {
        json_decref(ev);
        ev = NULL;
    }
    if (!ev) json_decref(args);
    text_json(buf, ev);
}

static void serialize_metadata(const loom_trace *trace, text_buf *buf, int *first) {
    int64_t pid = LOOM_TRACE_PID(trace->rank);
    char label[96];
    snprintf(label, sizeof label, "rank %d", trace->rank);
    text_metadata(buf, first, "process_name", pid, -1, json_pack("{s:s}", "name", label));
    text_metadata(buf, first, "process_sort_index", pid, -1,
                  json_pack("{s:i}", "sort_index", trace->rank));
    if (trace->dropped > 0) {
        snprintf(label, sizeof label, "dropped %" PRId64 " events (bound %zu)", trace->dropped,
                 trace->max_events);
        text_metadata(buf, first, "process_labels", pid, -1, json_pack("{s:s}", "labels", label));
    }
    for (int s = 0; s < LOOM_TRACE_STREAMS; s++) {
        if (!(trace->used_streams & (1u << s))) continue;
        const char *stream_name = loom_trace_stream_name((loom_trace_stream)s);
        text_metadata(buf, first, "thread_name", pid, LOOM_TRACE_TID(s),
                      json_pack("{s:o}", "name", json_text(stream_name)));
        text_metadata(buf, first, "thread_sort_index", pid, LOOM_TRACE_TID(s),
                      json_pack("{s:i}", "sort_index", s));
    }
}

static json_t *event_json(const loom_trace *trace, const trace_event *ev) {
    json_int_t pid = LOOM_TRACE_PID(trace->rank);
    json_t *ts = json_us(ev->ts_us - trace->origin_us);
    if (ev->phase == TRACE_PHASE_COUNTER) { /* counters belong to the process */
        return json_pack("{s:o, s:s, s:o, s:I, s:{s:f}}", "name", json_text(ev->name), "ph", "C",
                         "ts", ts, "pid", pid, "args", "value", ev->dur_us);
    }
    json_t *args = json_object();
    if (args && ev->step >= 0) json_object_set_new(args, "step", json_integer(ev->step));
    if (args && ev->micro_batch >= 0) {
        json_object_set_new(args, "micro_batch", json_integer(ev->micro_batch));
    }
    if (args && ev->stage >= 0) json_object_set_new(args, "stage", json_integer(ev->stage));
    return json_pack("{s:o, s:o, s:s, s:o, s:o, s:I, s:I, s:o}", "name", json_text(ev->name), "cat",
                     json_text(ev->category), "ph", "X", "ts", ts, "dur", json_us(ev->dur_us),
                     "pid", pid, "tid", (json_int_t)LOOM_TRACE_TID(ev->stream), "args", args);
}

/* This rank's metadata and events, each item preceded by ",\n" except the very first when
 * !leading. Fails only for memory. */
static loom_status serialize_rank(const loom_trace *trace, int leading, text_buf *buf) {
    int first = !leading;
    text_reserve(buf, 1024 + trace->count * 160);
    serialize_metadata(trace, buf, &first);
    for (size_t i = 0; i < trace->count && !buf->failed; i++) {
        text_separator(buf, &first);
        text_json(buf, event_json(trace, &trace->events[i]));
    }
    if (buf->failed) {
        return loom_fail(LOOM_ERR_NOMEM, "trace: out of memory serializing %zu events of rank %d",
                         trace->count, trace->rank);
    }
    return LOOM_OK;
}

/* ---- the collective write -------------------------------------------------------------------- */

typedef struct {
    int64_t ranks, events, dropped;
} trace_totals;

/* Rank 0's side of step 2: receive rank `peer`'s text and append it (unless the file has
 * already failed: the text is still received, so the sender is not left waiting). Returns
 * a comm failure only; a rank that could not serialize, or a failed write, lands in *st. */
static loom_status receive_rank(struct loom_comm *world, int peer, FILE *out, char *chunk,
                                const char *path, trace_totals *totals, loom_status *st) {
    int64_t header[3];
    loom_status cst = loom_comm_recv(world, header, (int64_t)sizeof header, peer, LOOM_TRACE_TAG);
    if (cst != LOOM_OK) return cst;
    if (header[0] < 0) {
        if (*st == LOOM_OK) {
            *st = loom_fail(LOOM_ERR_NOMEM,
                            "trace: rank %d ran out of memory serializing its "
                            "events; %s not written",
                            peer, path);
        }
        return LOOM_OK;
    }
    for (int64_t left = header[0]; left > 0;) {
        int64_t n = left < TRACE_CHUNK_BYTES ? left : TRACE_CHUNK_BYTES;
        cst = loom_comm_recv(world, chunk, n, peer, LOOM_TRACE_TAG);
        if (cst != LOOM_OK) return cst;
        if (*st == LOOM_OK && fwrite(chunk, 1, (size_t)n, out) != (size_t)n) {
            *st = loom_fail(LOOM_ERR_IO, "%s: write failed", path);
        }
        left -= n;
    }
    totals->ranks++;
    totals->events += header[1];
    totals->dropped += header[2];
    return LOOM_OK;
}

/* The file's end: the events array closed, then the totals. */
static void write_footer(FILE *out, const trace_totals *totals) {
    fprintf(out,
            "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"ranks\":%" PRId64
            ",\"events\":%" PRId64 ",\"dropped_events\":%" PRId64 "}}\n",
            totals->ranks, totals->events, totals->dropped);
}

static loom_status broadcast_int(struct loom_comm *world, int32_t *value) {
    if (!world || loom_comm_size(world) == 1) return LOOM_OK;
    return loom_comm_broadcast(world, value, (int64_t)sizeof *value, 0);
}

static loom_status write_root(const loom_trace *trace, struct loom_comm *world, const char *path,
                              const text_buf *own, loom_status st) {
    int size = world ? loom_comm_size(world) : 1;
    loom_atomic_file *file = NULL;
    char *chunk = NULL;
    if (st == LOOM_OK) st = loom_atomic_open(&file, path);
    if (st == LOOM_OK && size > 1) {
        chunk = loom_malloc((size_t)TRACE_CHUNK_BYTES, "trace chunk");
        if (!chunk) st = LOOM_ERR_NOMEM;
    }
    int32_t go = st == LOOM_OK;
    loom_status cst = broadcast_int(world, &go);
    if (cst != LOOM_OK || !go) {
        loom_atomic_abort(file);
        free(chunk);
        return cst != LOOM_OK ? cst : st;
    }

    FILE *out = loom_atomic_stream(file);
    trace_totals totals = {1, (int64_t)trace->count, trace->dropped};
    fputs("{\"traceEvents\":[\n", out);
    if (fwrite(own->data, 1, own->len, out) != own->len) {
        st = loom_fail(LOOM_ERR_IO, "%s: write failed", path);
    }
    for (int peer = 1; peer < size && cst == LOOM_OK; peer++) {
        loom_comm_progress("trace: writing the trace file");
        cst = receive_rank(world, peer, out, chunk, path, &totals, &st);
    }
    free(chunk);
    if (cst != LOOM_OK) {
        loom_atomic_abort(file);
        return cst;
    }
    write_footer(out, &totals);
    if (st == LOOM_OK) {
        st = loom_atomic_commit(file);
    } else {
        loom_atomic_abort(file);
    }
    int32_t final_status = (int32_t)st;
    cst = broadcast_int(world, &final_status);
    if (st == LOOM_OK && totals.dropped > 0) {
        loom_warn("trace: %" PRId64 " events were dropped (the bound is %zu per rank)",
                  totals.dropped, trace->max_events);
    }
    return st != LOOM_OK ? st : cst;
}

static loom_status send_to_root(const loom_trace *trace, struct loom_comm *world, const char *path,
                                const text_buf *own, loom_status st) {
    int32_t go = 0;
    loom_status cst = broadcast_int(world, &go);
    if (cst != LOOM_OK) return cst;
    if (!go) {
        if (st != LOOM_OK) return st;
        return loom_fail(LOOM_ERR_IO, "trace: rank 0 could not start writing %s", path);
    }
    int64_t header[3] = {st == LOOM_OK ? (int64_t)own->len : -1, (int64_t)trace->count,
                         trace->dropped};
    cst = loom_comm_send(world, header, (int64_t)sizeof header, 0, LOOM_TRACE_TAG);
    for (int64_t off = 0; cst == LOOM_OK && header[0] > 0 && off < header[0];) {
        int64_t n = header[0] - off < TRACE_CHUNK_BYTES ? header[0] - off : TRACE_CHUNK_BYTES;
        cst = loom_comm_send(world, own->data + off, n, 0, LOOM_TRACE_TAG);
        off += n;
    }
    if (cst != LOOM_OK) return cst;
    int32_t final_status = LOOM_OK;
    cst = broadcast_int(world, &final_status);
    if (cst != LOOM_OK) return cst;
    if (st != LOOM_OK) return st;
    if (final_status != LOOM_OK) {
        return loom_fail((loom_status)final_status, "trace: rank 0 failed writing %s", path);
    }
    return LOOM_OK;
}

loom_status loom_trace_write(loom_trace *trace, struct loom_comm *world, const char *path) {
    if (!trace) return LOOM_OK;
    int rank = world ? loom_comm_rank(world) : 0;
    text_buf own = {0};
    loom_status st = serialize_rank(trace, rank != 0, &own);
    if (rank == 0) {
        st = write_root(trace, world, path, &own, st);
    } else {
        st = send_to_root(trace, world, path, &own, st);
    }
    free(own.data);
    return st;
}

loom_status loom_trace_write_all(loom_trace *const *traces, int count, const char *path) {
    loom_atomic_file *file = NULL;
    loom_status st = loom_atomic_open(&file, path);
    if (st != LOOM_OK) return st;
    FILE *out = loom_atomic_stream(file);
    trace_totals totals = {0, 0, 0};
    fputs("{\"traceEvents\":[\n", out);
    for (int i = 0; i < count && st == LOOM_OK; i++) {
        text_buf text = {0};
        st = serialize_rank(traces[i], i > 0, &text);
        if (st == LOOM_OK && fwrite(text.data, 1, text.len, out) != text.len)
            st = loom_fail(LOOM_ERR_IO, "%s: write failed", path);
        free(text.data);
        totals.ranks++;
        totals.events += (int64_t)traces[i]->count;
        totals.dropped += traces[i]->dropped;
    }
    write_footer(out, &totals);
    if (st == LOOM_OK) return loom_atomic_commit(file);
    loom_atomic_abort(file);
    return st;
}
