/*
 * trace.c — recording trace events: the bounded event store, begin/end spans, counters and
 * the clock. Every entry point returns at once for a NULL handle (tracing off).
 *
 * Not here: JSON and gathering the ranks (trace_write.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "trace/trace_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Storage starts this big and doubles up to the bound, so a generous bound costs nothing
 * until it is used. */
#define TRACE_INITIAL_CAPACITY 1024

loom_status loom_trace_create(loom_trace **trace, int rank, size_t max_events) {
    *trace = NULL;
    if (rank < 0) return loom_fail(LOOM_ERR_INPUT, "trace: rank must be >= 0, got %d", rank);
    if (max_events == 0) return loom_fail(LOOM_ERR_INPUT, "trace: max_events must be >= 1");
    loom_trace *t = loom_calloc(1, sizeof *t, "trace");
    if (!t) return LOOM_ERR_NOMEM;
    t->rank = rank;
    t->max_events = max_events;
    t->origin_us = loom_trace_now_us();
    *trace = t;
    return LOOM_OK;
}

void loom_trace_free(loom_trace *trace) {
    if (!trace) return;
    free(trace->events);
    free(trace);
}

double loom_trace_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

double loom_trace_origin_us(const loom_trace *trace) {
    return trace ? trace->origin_us : 0.0;
}

size_t loom_trace_count(const loom_trace *trace) {
    return trace ? trace->count : 0;
}

int64_t loom_trace_dropped(const loom_trace *trace) {
    return trace ? trace->dropped : 0;
}

const char *loom_trace_stream_name(loom_trace_stream stream) {
    switch (stream) {
    case LOOM_TRACE_COMPUTE:
        return "compute";
    case LOOM_TRACE_DP:
        return "dp comm";
    case LOOM_TRACE_TP:
        return "tp comm";
    case LOOM_TRACE_PP:
        return "pp comm";
    case LOOM_TRACE_STREAMS:
        break;
    }
    return "unknown";
}

/* Copies src (NULL: "") into dst (max + 1 bytes). A cut never splits a UTF-8 character: it
 * backs off to the start of the character that would be split. */
static void copy_truncated(char *dst, const char *src, size_t max) {
    if (!src) src = "";
    size_t len = strnlen(src, max + 1);
    if (len > max) {
        len = max;
        while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80) len--;
    }
    memcpy(dst, src, len);
    dst[len] = '\0';
}

/* A slot for one more event, or NULL (counted as dropped) past the bound or when growing the
 * storage fails: tracing must never stop the run. */
static trace_event *next_slot(loom_trace *trace) {
    if (trace->count == trace->capacity) {
        size_t cap = trace->capacity ? trace->capacity * 2 : TRACE_INITIAL_CAPACITY;
        if (cap > trace->max_events) cap = trace->max_events;
        if (cap > SIZE_MAX / sizeof(trace_event)) cap = SIZE_MAX / sizeof(trace_event);
        trace_event *grown =
            cap > trace->capacity ? realloc(trace->events, cap * sizeof(trace_event)) : NULL;
        if (!grown) {
            trace->dropped++;
            return NULL;
        }
        trace->events = grown;
        trace->capacity = cap;
    }
    return &trace->events[trace->count++];
}

static double finite_or_zero(double x) {
    return isfinite(x) ? x : 0.0;
}

void loom_trace_event(loom_trace *trace, loom_trace_stream stream, const char *name,
                      const char *category, double start_us, double dur_us, int64_t step,
                      int micro_batch) {
    loom_trace_event_stage(trace, stream, name, category, start_us, dur_us, step, micro_batch, -1);
}

void loom_trace_event_stage(loom_trace *trace, loom_trace_stream stream, const char *name,
                            const char *category, double start_us, double dur_us, int64_t step,
                            int micro_batch, int stage) {
    if (!trace) return;
    if ((unsigned)stream >= (unsigned)LOOM_TRACE_STREAMS) {
        trace->dropped++;
        return;
    }
    trace_event *ev = next_slot(trace);
    if (!ev) return;
    dur_us = finite_or_zero(dur_us);
    ev->ts_us = finite_or_zero(start_us);
    ev->dur_us = dur_us > 0.0 ? dur_us : 0.0;
    ev->step = step >= 0 ? step : -1;
    ev->micro_batch = micro_batch >= 0 ? micro_batch : -1;
    ev->stage = stage >= 0 ? stage : -1;
    ev->phase = TRACE_PHASE_COMPLETE;
    ev->stream = (uint8_t)stream;
    copy_truncated(ev->name, name, LOOM_TRACE_NAME_MAX);
    copy_truncated(ev->category, category, LOOM_TRACE_CATEGORY_MAX);
    trace->used_streams |= 1u << stream;
}

void loom_trace_begin(loom_trace *trace, loom_trace_stream stream, const char *name,
                      const char *category) {
    if (!trace) return;
    if ((unsigned)stream >= (unsigned)LOOM_TRACE_STREAMS) {
        trace->dropped++;
        return;
    }
    int depth = trace->depth[stream]++;
    if (depth >= LOOM_TRACE_MAX_DEPTH) return; /* counted as dropped at its end */
    trace_span *span = &trace->spans[stream][depth];
    copy_truncated(span->name, name, LOOM_TRACE_NAME_MAX);
    copy_truncated(span->category, category, LOOM_TRACE_CATEGORY_MAX);
    span->start_us = loom_trace_now_us();
}

void loom_trace_end(loom_trace *trace, loom_trace_stream stream) {
    if (!trace) return;
    double now = loom_trace_now_us();
    if ((unsigned)stream >= (unsigned)LOOM_TRACE_STREAMS || trace->depth[stream] == 0) {
        trace->dropped++; /* an end without a begin */
        return;
    }
    int depth = --trace->depth[stream];
    if (depth >= LOOM_TRACE_MAX_DEPTH) { /* its begin was too deep to be stored */
        trace->dropped++;
        return;
    }
    const trace_span *span = &trace->spans[stream][depth];
    loom_trace_event(trace, stream, span->name, span->category, span->start_us,
                     now - span->start_us, -1, -1);
}

void loom_trace_counter(loom_trace *trace, const char *name, double ts_us, double value) {
    if (!trace || !isfinite(value)) return;
    trace_event *ev = next_slot(trace);
    if (!ev) return;
    ev->ts_us = finite_or_zero(ts_us);
    ev->dur_us = value;
    ev->step = -1;
    ev->micro_batch = -1;
    ev->stage = -1;
    ev->phase = TRACE_PHASE_COUNTER;
    ev->stream = 0;
    copy_truncated(ev->name, name, LOOM_TRACE_NAME_MAX);
    ev->category[0] = '\0';
}
