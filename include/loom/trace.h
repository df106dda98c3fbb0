/*
 * loom/trace.h — a timeline of the run as Chrome trace-event JSON, which opens in Perfetto
 * (ui.perfetto.dev) and chrome://tracing: one process per rank, one thread per stream
 * (compute, dp comm, tp comm, pp comm), complete ("X") events for spans and "C" events for
 * counters.
 *
 * Events are kept in memory, bounded by max_events per rank; past the bound further events
 * are dropped and counted (the file says how many, per rank and in total). At the end,
 * loom_trace_write gathers every rank's events to world rank 0, which writes one file.
 *
 * Tracing off is a NULL handle: every call below then returns at once (loom_trace_write
 * returns LOOM_OK and writes nothing), so instrumented code needs no `if`.
 *
 * Clock alignment: every timestamp is on loom_trace_now_us's clock; the file holds them
 * relative to the moment the rank's trace was created. Call loom_trace_create right after a
 * barrier on the world, so that time 0 is (within the barrier's exit skew, microseconds on
 * one machine) the same instant on every rank. No clock-offset estimation beyond that.
 *
 * Identifiers in the file: pid = rank + 1 and tid = stream + 1 (LOOM_TRACE_PID/TID), named
 * "rank R" and "compute"/"dp comm"/"tp comm"/"pp comm" by "M" events and sorted by rank and
 * stream. Not 0-based: Perfetto treats pid 0 and tid 0 as the kernel's idle task (swapper).
 *
 * Threads: a handle is not thread-safe; record from the thread that created it (the one that
 * drives MPI). loom_trace_write is collective over the world and uses loom_comm.
 *
 * Not here: when to record what (train/, parallel/), flow arrows, async ("b"/"e") events.
 */
#ifndef LOOM_TRACE_H
#define LOOM_TRACE_H

#include "loom/base.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct loom_comm;

typedef enum {
    LOOM_TRACE_COMPUTE,
    LOOM_TRACE_DP,
    LOOM_TRACE_TP,
    LOOM_TRACE_PP,
    LOOM_TRACE_STREAMS
} loom_trace_stream;

/* Characters kept of an event's name and category (longer ones are cut at a UTF-8 character
 * boundary), and how deep loom_trace_begin spans may nest per stream. */
#define LOOM_TRACE_NAME_MAX     47
#define LOOM_TRACE_CATEGORY_MAX 31
#define LOOM_TRACE_MAX_DEPTH    16

/* The pid and tid a rank and a stream get in the file. */
#define LOOM_TRACE_PID(rank)   ((int64_t)(rank) + 1)
#define LOOM_TRACE_TID(stream) ((int)(stream) + 1)

typedef struct loom_trace loom_trace;

/* A trace for world rank `rank` (its pid in the file) keeping at most max_events events
 * (memory grows with use, about 120 bytes an event, up to the bound). Records the creation
 * time, the origin of this rank's timestamps in the file: call it right after a barrier on the
 * world. Fails with LOOM_ERR_INPUT for rank < 0 or max_events == 0. */
loom_status loom_trace_create(loom_trace **trace, int rank, size_t max_events);
void loom_trace_free(loom_trace *trace);

/* Monotonic microseconds (CLOCK_MONOTONIC). The zero point is arbitrary (boot, on Linux) and
 * the same for every process of one machine; only differences matter, since the file holds
 * times relative to each trace's creation. */
double loom_trace_now_us(void);
/* The creation time of `trace` on that clock (0 for NULL). */
double loom_trace_origin_us(const loom_trace *trace);

/* A complete ("X") event on `stream`: name (copied, cut to LOOM_TRACE_NAME_MAX bytes),
 * category (copied, cut to LOOM_TRACE_CATEGORY_MAX; NULL for none), start and duration in
 * microseconds on loom_trace_now_us's clock, and args step / micro_batch (-1 = absent, left
 * out of the event's args). A non-finite start or duration becomes 0, a negative duration 0.
 * An invalid stream drops the event (counted). */
void loom_trace_event(loom_trace *trace, loom_trace_stream stream, const char *name,
                      const char *category, double start_us, double dur_us, int64_t step,
                      int micro_batch);
/* The same with the pipeline's virtual stage as one more arg, "stage" (-1 = absent): with model
 * chunks a rank runs several, and a trace reader tells them apart by it. */
void loom_trace_event_stage(loom_trace *trace, loom_trace_stream stream, const char *name,
                            const char *category, double start_us, double dur_us, int64_t step,
                            int micro_batch, int stage);

/* Spans with a per-stream stack: begin notes the name and the time, the matching end records
 * an X event (no step/micro-batch args: use loom_trace_event for those). Spans nested deeper
 * than LOOM_TRACE_MAX_DEPTH, and an end without a begin, are dropped and counted. */
void loom_trace_begin(loom_trace *trace, loom_trace_stream stream, const char *name,
                      const char *category);
void loom_trace_end(loom_trace *trace, loom_trace_stream stream);

/* A counter sample ("C" event, process-wide, series "value"): e.g. ("loss", now, 3.21). A
 * non-finite value cannot be written in JSON: such a sample is skipped (not counted). */
void loom_trace_counter(loom_trace *trace, const char *name, double ts_us, double value);

/* Events kept, and events dropped (past the bound, too deep, unmatched end, bad stream). */
size_t loom_trace_count(const loom_trace *trace);
int64_t loom_trace_dropped(const loom_trace *trace);

/* "compute", "dp comm", "tp comm", "pp comm" (the thread names in the file). */
const char *loom_trace_stream_name(loom_trace_stream stream);

/* Writes the whole job's trace to `path` (atomic: temporary file, fsync, rename) as
 * {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"ranks", "events",
 * "dropped_events"}}. Collective over `world` (NULL: this process alone); tracing must be on
 * (trace not NULL) on every rank or on none, and each rank's trace should carry its world
 * rank.
 *
 * Every rank serializes its own events; rank 0 opens the file, then receives the ranks' text
 * one after another in chunks of 1 MiB (point-to-point, tag LOOM_TRACE_TAG on world) and
 * appends it, so rank 0 holds its own text plus one chunk, never another rank's whole trace.
 * The other ranks wait in their sends meanwhile, under loom_comm's deadline: the whole write
 * must finish within the comm timeout.
 *
 * Every rank returns the same outcome: LOOM_OK, or an error (rank 0's names the cause; the
 * others say that rank 0 failed). A loom_comm failure is returned at once, the communicator is
 * then unusable (see comm.h). The events stay in the trace (it may be written again). Logs a
 * warning on rank 0 when events were dropped. */
#define LOOM_TRACE_TAG 32101
loom_status loom_trace_write(loom_trace *trace, struct loom_comm *world, const char *path);

/* Writes several ranks' traces held by this one process (a simulated run: `loom plan
 * --trace`) to `path` in the same format, atomically. */
loom_status loom_trace_write_all(loom_trace *const *traces, int count, const char *path);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_TRACE_H */
