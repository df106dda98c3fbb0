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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void text_str(text_buf *buf, const char *s) {
    text_put(buf, s, strlen(s));
}

/* Numbers go through snprintf into a local buffer (no varargs helper: clang-tidy 14's va_list
 * checker misfires on those when it analyses several files in one run). %.3f of the largest
 * double is 313 characters. */
static void text_i64(text_buf *buf, int64_t value) {
    char num[32];
    int n = snprintf(num, sizeof num, "%" PRId64, value);
    text_put(buf, num, (size_t)n);
}

/* Microseconds with 3 decimals (nanoseconds). */
static void text_us(text_buf *buf, double us) {
    char num[352];
    int n = snprintf(num, sizeof num, "%.3f", us);
    if (n < 0 || (size_t)n >= sizeof num) n = snprintf(num, sizeof num, "0.000");
    text_put(buf, num, (size_t)n);
}

/* A finite double, round-trip-ish (15 significant digits). */
static void text_number(text_buf *buf, double value) {
    char num[40];
    int n = snprintf(num, sizeof num, "%.15g", value);
    text_put(buf, num, (size_t)n);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is not one (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF) — the JSON must load in strict
 * parsers. */
static size_t utf8_sequence_length(const unsigned char *s) {
    unsigned char c = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
    }
    return n;
}

/* s as a JSON string, quotes included. Control characters are escaped; bytes that are not
 * valid UTF-8 become U+FFFD. */
static void text_json_string(text_buf *buf, const char *s) {
    text_put(buf, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        const unsigned char *run = p; /* a run of bytes that need no escaping */
        while (*p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        text_put(buf, (const char *)run, (size_t)(p - run));
        if (!*p) break;
        if (*p >= 0x80) {
            size_t n = utf8_sequence_length(p);
            if (n) {
                text_put(buf, (const char *)p, n);
                p += n;
            } else {
                text_put(buf, "\\ufffd", 6);
                p++;
            }
            continue;
        }
        switch (*p) {
        case '"':
            text_put(buf, "\\\"", 2);
            break;
        case '\\':
            text_put(buf, "\\\\", 2);
            break;
        case '\n':
            text_put(buf, "\\n", 2);
            break;
        case '\r':
            text_put(buf, "\\r", 2);
            break;
        case '\t':
            text_put(buf, "\\t", 2);
            break;
        default: {
            static const char hex[] = "0123456789abcdef";
            char esc[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 15]};
            text_put(buf, esc, sizeof esc);
            break;
        }
        }
        p++;
    }
    text_put(buf, "\"", 1);
}

/* ---- one rank's events as JSON ------------------------------------------------------------- */

/* Every item after the first, and the first too when `leading`, is preceded by ",\n", so the
 * ranks' texts concatenate into one array. */
static void text_separator(text_buf *buf, int *first) {
    if (!*first) text_put(buf, ",\n", 2);
    *first = 0;
}

/* Opens a metadata event: {"name":NAME,"ph":"M","pid":PID[,"tid":TID],"args":{ — the caller
 * writes the args and closes with "}}". tid < 0: a process-wide one. */
static void metadata_open(text_buf *buf, int *first, const char *name, int64_t pid, int tid) {
    text_separator(buf, first);
    text_str(buf, "{\"name\":\"");
    text_str(buf, name);
    text_str(buf, "\",\"ph\":\"M\",\"pid\":");
    text_i64(buf, pid);
    if (tid >= 0) {
        text_str(buf, ",\"tid\":");
        text_i64(buf, tid);
    }
    text_str(buf, ",\"args\":{");
}

static void serialize_metadata(const loom_trace *trace, text_buf *buf, int *first) {
    int64_t pid = LOOM_TRACE_PID(trace->rank);
    metadata_open(buf, first, "process_name", pid, -1);
    text_str(buf, "\"name\":\"rank ");
    text_i64(buf, trace->rank);
    text_str(buf, "\"}}");
    metadata_open(buf, first, "process_sort_index", pid, -1);
    text_str(buf, "\"sort_index\":");
    text_i64(buf, trace->rank);
    text_str(buf, "}}");
    if (trace->dropped > 0) {
        metadata_open(buf, first, "process_labels", pid, -1);
        text_str(buf, "\"labels\":\"dropped ");
        text_i64(buf, trace->dropped);
        text_str(buf, " events (bound ");
        text_i64(buf, (int64_t)trace->max_events);
        text_str(buf, ")\"}}");
    }
    for (int s = 0; s < LOOM_TRACE_STREAMS; s++) {
        if (!(trace->used_streams & (1u << s))) continue;
        metadata_open(buf, first, "thread_name", pid, LOOM_TRACE_TID(s));
        text_str(buf, "\"name\":");
        text_json_string(buf, loom_trace_stream_name((loom_trace_stream)s));
        text_str(buf, "}}");
        metadata_open(buf, first, "thread_sort_index", pid, LOOM_TRACE_TID(s));
        text_str(buf, "\"sort_index\":");
        text_i64(buf, s);
        text_str(buf, "}}");
    }
}

static void serialize_event(const loom_trace *trace, const trace_event *ev, text_buf *buf) {
    text_str(buf, "{\"name\":");
    text_json_string(buf, ev->name);
    if (ev->phase == TRACE_PHASE_COMPLETE) {
        text_str(buf, ",\"cat\":");
        text_json_string(buf, ev->category);
        text_str(buf, ",\"ph\":\"X\"");
    } else {
        text_str(buf, ",\"ph\":\"C\"");
    }
    text_str(buf, ",\"ts\":");
    text_us(buf, ev->ts_us - trace->origin_us);
    if (ev->phase == TRACE_PHASE_COMPLETE) {
        text_str(buf, ",\"dur\":");
        text_us(buf, ev->dur_us);
    }
    text_str(buf, ",\"pid\":");
    text_i64(buf, LOOM_TRACE_PID(trace->rank));
    if (ev->phase == TRACE_PHASE_COUNTER) { /* counters belong to the process */
        text_str(buf, ",\"args\":{\"value\":");
        text_number(buf, ev->dur_us);
        text_str(buf, "}}");
        return;
    }
    text_str(buf, ",\"tid\":");
    text_i64(buf, LOOM_TRACE_TID(ev->stream));
    text_str(buf, ",\"args\":{");
    if (ev->step >= 0) {
        text_str(buf, "\"step\":");
        text_i64(buf, ev->step);
    }
    if (ev->micro_batch >= 0) {
        text_str(buf, ev->step >= 0 ? ",\"micro_batch\":" : "\"micro_batch\":");
        text_i64(buf, ev->micro_batch);
    }
    if (ev->stage >= 0) {
        text_str(buf, ev->step >= 0 || ev->micro_batch >= 0 ? ",\"stage\":" : "\"stage\":");
        text_i64(buf, ev->stage);
    }
    text_str(buf, "}}");
}

/* This rank's metadata and events, each item preceded by ",\n" except the very first when
 * !leading. Fails only for memory. */
static loom_status serialize_rank(const loom_trace *trace, int leading, text_buf *buf) {
    int first = !leading;
    text_reserve(buf, 1024 + trace->count * 160);
    serialize_metadata(trace, buf, &first);
    for (size_t i = 0; i < trace->count && !buf->failed; i++) {
        text_separator(buf, &first);
        serialize_event(trace, &trace->events[i], buf);
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
