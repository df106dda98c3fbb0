/*
 * trace_internal.h — the trace handle, shared by recording (trace.c) and writing
 * (trace_write.c).
 */
#ifndef LOOM_TRACE_INTERNAL_H
#define LOOM_TRACE_INTERNAL_H

#include "loom/trace.h"

#include <stdint.h>

typedef enum { TRACE_PHASE_COMPLETE = 'X', TRACE_PHASE_COUNTER = 'C' } trace_phase;

/* One recorded event, as given (times on loom_trace_now_us's clock, not yet relative). */
typedef struct {
    double ts_us;    /* X: start; C: the sample's time */
    double dur_us;   /* X: duration (>= 0); C: the counter's value */
    int64_t step;    /* -1: absent */
    int micro_batch; /* -1: absent */
    int stage;       /* the pipeline's virtual stage; -1: absent */
    uint8_t phase;   /* trace_phase */
    uint8_t stream;  /* loom_trace_stream (X only) */
    char name[LOOM_TRACE_NAME_MAX + 1];
    char category[LOOM_TRACE_CATEGORY_MAX + 1];
} trace_event;

/* An open loom_trace_begin span. */
typedef struct {
    double start_us;
    char name[LOOM_TRACE_NAME_MAX + 1];
    char category[LOOM_TRACE_CATEGORY_MAX + 1];
} trace_span;

struct loom_trace {
    int rank;
    double origin_us;    /* creation time: subtracted from every timestamp in the file */
    size_t max_events;   /* the bound */
    trace_event *events; /* (capacity), the first `count` used; grows up to max_events */
    size_t count, capacity;
    int64_t dropped;       /* events not kept, for any reason */
    unsigned used_streams; /* bit s: stream s has an X event (gets a thread_name) */
    trace_span spans[LOOM_TRACE_STREAMS][LOOM_TRACE_MAX_DEPTH];
    int depth[LOOM_TRACE_STREAMS]; /* open spans; may exceed LOOM_TRACE_MAX_DEPTH (not stored) */
};

#endif
