/*
 * test_trace.c — trace files, read back with jansson (an independent JSON parser): the
 * top-level object, metadata naming the rank and each used stream, X events with their fields
 * and optional args, JSON escaping of awkward names, the bound (drops counted), begin/end
 * spans, counters, NULL handles as no-ops, failures that leave no file.
 *
 * Run alone (test_trace_1: written with no communicator and with a world of one) and under
 * mpirun with 2 and 4 ranks: every rank records its own events, rank 0 checks the gathered
 * file (a process per rank, pids, the count of events per rank, clocks aligned at creation),
 * including a trace larger than one transfer chunk. Rank 0 prints the totals of all ranks.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "loom/comm.h"
#include "loom/trace.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;
static char tmpdir[1024];

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        loom_status check_st_ = (expr);                                                            \
        CHECK(check_st_ == LOOM_OK, "rank %d: %s", rank, loom_last_error());                       \
    } while (0)

/* ---- reading a trace file back --------------------------------------------------------------- */

static json_t *load_trace(const char *path) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL, "%s: %s (line %d)", path, err.text, err.line);
    if (!root) return NULL;
    CHECK(json_is_object(root), "%s: top level is not an object", path);
    CHECK(json_is_array(json_object_get(root, "traceEvents")), "%s: no traceEvents array", path);
    CHECK(json_is_string(json_object_get(root, "displayTimeUnit")) &&
              strcmp(json_string_value(json_object_get(root, "displayTimeUnit")), "ms") == 0,
          "%s: displayTimeUnit", path);
    if (!json_is_array(json_object_get(root, "traceEvents"))) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static const char *str_field(const json_t *ev, const char *key) {
    const char *s = json_string_value(json_object_get(ev, key));
    return s ? s : "";
}

static int has_ph(const json_t *ev, const char *ph) {
    return strcmp(str_field(ev, "ph"), ph) == 0;
}

/* The metadata event `name` ("process_name", "thread_name", ...) for pid (and tid >= 0). */
static json_t *find_metadata(json_t *events, const char *name, json_int_t pid, int tid) {
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        if (!has_ph(ev, "M") || strcmp(str_field(ev, "name"), name) != 0) continue;
        if (json_integer_value(json_object_get(ev, "pid")) != pid) continue;
        if (tid >= 0 && json_integer_value(json_object_get(ev, "tid")) != tid) continue;
        return ev;
    }
    return NULL;
}

/* The first X event named `name`. */
static json_t *find_event(json_t *events, const char *name) {
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        if (has_ph(ev, "X") && strcmp(str_field(ev, "name"), name) == 0) return ev;
    }
    return NULL;
}

static int count_phase(json_t *events, const char *ph, json_int_t pid) {
    int n = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        if (has_ph(ev, ph) && json_integer_value(json_object_get(ev, "pid")) == pid) n++;
    }
    return n;
}

static int file_exists(const char *path) {
    return access(path, F_OK) == 0;
}

/* Every X event has the fields a viewer needs, of the right JSON types. */
static void check_complete_fields(json_t *events) {
    size_t i;
    json_t *ev;
    int bad = 0;
    json_array_foreach(events, i, ev) {
        if (!has_ph(ev, "X")) continue;
        bad += !json_is_string(json_object_get(ev, "name")) ||
               !json_is_string(json_object_get(ev, "cat")) ||
               !json_is_number(json_object_get(ev, "ts")) ||
               !json_is_number(json_object_get(ev, "dur")) ||
               !json_is_integer(json_object_get(ev, "pid")) ||
               !json_is_integer(json_object_get(ev, "tid")) ||
               !json_is_object(json_object_get(ev, "args"));
    }
    CHECK(bad == 0, "%d X events lack a field", bad);
}

/* ---- one process ------------------------------------------------------------------------------
 */

static const char awkward_name[] = "say \"hi\"\\path\nnext\ttab\x01 caf\xc3\xa9";

/* Records the events the single-process checks expect; times relative to the origin. */
static void record_basic(loom_trace *trace) {
    double t0 = loom_trace_origin_us(trace);
    loom_trace_event(trace, LOOM_TRACE_COMPUTE, "forward", "compute", t0 + 1234.5678, 10.25, 3, 1);
    loom_trace_event(trace, LOOM_TRACE_DP, "allreduce", "comm", t0 + 2000.0, 5.0, 3, -1);
    loom_trace_event(trace, LOOM_TRACE_COMPUTE, "micro only", NULL, t0 + 3000.0, 1.0, -1, 0);
    loom_trace_event(trace, LOOM_TRACE_COMPUTE, "no args", "x", t0 + 4000.0, -5.0, -1, -1);
    loom_trace_event(trace, LOOM_TRACE_COMPUTE, awkward_name, "we\"ird", t0, 1.0, -1, -1);
    /* 60 characters: kept 47; then one cut inside a two-byte character */
    loom_trace_event(trace, LOOM_TRACE_COMPUTE,
                     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ01234567", "c", t0, 1.0,
                     -1, -1);
    loom_trace_event(trace, LOOM_TRACE_COMPUTE,
                     "0123456789012345678901234567890123456789012345\xc3\xa9tail", "c", t0, 1.0, -1,
                     -1);
    /* not UTF-8 (a stray byte, a truncated sequence, a surrogate): U+FFFD, still valid JSON */
    loom_trace_event(trace, LOOM_TRACE_COMPUTE, "bad\xff|\xc3(|\xed\xa0\x80", "c", t0, 1.0, -1, -1);
    loom_trace_begin(trace, LOOM_TRACE_PP, "outer", "pp");
    loom_trace_begin(trace, LOOM_TRACE_PP, "inner", "pp");
    loom_trace_end(trace, LOOM_TRACE_PP);
    loom_trace_end(trace, LOOM_TRACE_PP);
    loom_trace_counter(trace, "loss", t0 + 5000.0, 2.5);
    loom_trace_counter(trace, "skipped", t0, NAN); /* cannot be written: not kept */
}

static void check_basic_file(const char *path) {
    json_t *root = load_trace(path);
    if (!root) return;
    json_t *events = json_object_get(root, "traceEvents");
    json_int_t pid = LOOM_TRACE_PID(0);

    json_t *pname = find_metadata(events, "process_name", pid, -1);
    CHECK(pname && strcmp(str_field(json_object_get(pname, "args"), "name"), "rank 0") == 0,
          "process_name of pid %lld is not \"rank 0\"", (long long)pid);
    json_t *psort = find_metadata(events, "process_sort_index", pid, -1);
    CHECK(psort && json_integer_value(
                       json_object_get(json_object_get(psort, "args"), "sort_index")) == 0,
          "process_sort_index");
    const loom_trace_stream used[] = {LOOM_TRACE_COMPUTE, LOOM_TRACE_DP, LOOM_TRACE_PP};
    for (size_t i = 0; i < sizeof used / sizeof used[0]; i++) {
        int tid = LOOM_TRACE_TID(used[i]);
        json_t *tname = find_metadata(events, "thread_name", pid, tid);
        CHECK(tname && strcmp(str_field(json_object_get(tname, "args"), "name"),
                              loom_trace_stream_name(used[i])) == 0,
              "thread_name for tid %d", tid);
        json_t *tsort = find_metadata(events, "thread_sort_index", pid, tid);
        CHECK(tsort && json_integer_value(json_object_get(json_object_get(tsort, "args"),
                                                          "sort_index")) == (json_int_t)used[i],
              "thread_sort_index for tid %d", tid);
    }
    CHECK(find_metadata(events, "thread_name", pid, LOOM_TRACE_TID(LOOM_TRACE_TP)) == NULL,
          "an unused stream got a thread_name");
    CHECK(find_metadata(events, "process_labels", pid, -1) == NULL, "labels without drops");

    check_complete_fields(events);
    CHECK(count_phase(events, "X", pid) == 10, "X events: %d", count_phase(events, "X", pid));
    CHECK(count_phase(events, "C", pid) == 1, "C events: %d", count_phase(events, "C", pid));

    json_t *fwd = find_event(events, "forward");
    CHECK(fwd != NULL, "no forward event");
    if (fwd) {
        json_t *args = json_object_get(fwd, "args");
        CHECK_CLOSE(json_number_value(json_object_get(fwd, "ts")), 1234.568, 0, 1e-9, "ts");
        CHECK_CLOSE(json_number_value(json_object_get(fwd, "dur")), 10.25, 0, 1e-9, "dur");
        CHECK(json_integer_value(json_object_get(fwd, "pid")) == pid, "pid");
        CHECK(json_integer_value(json_object_get(fwd, "tid")) == LOOM_TRACE_TID(0), "tid");
        CHECK(strcmp(str_field(fwd, "cat"), "compute") == 0, "cat");
        CHECK(json_integer_value(json_object_get(args, "step")) == 3, "step arg");
        CHECK(json_integer_value(json_object_get(args, "micro_batch")) == 1, "micro_batch arg");
        CHECK(json_object_size(args) == 2, "forward args: %zu keys", json_object_size(args));
    }
    json_t *ar = find_event(events, "allreduce");
    CHECK(ar && json_object_get(json_object_get(ar, "args"), "step") &&
              !json_object_get(json_object_get(ar, "args"), "micro_batch") &&
              json_integer_value(json_object_get(ar, "tid")) == LOOM_TRACE_TID(LOOM_TRACE_DP),
          "allreduce: step only, on the dp stream");
    json_t *mb = find_event(events, "micro only");
    CHECK(mb && !json_object_get(json_object_get(mb, "args"), "step") &&
              json_integer_value(json_object_get(json_object_get(mb, "args"), "micro_batch")) == 0,
          "micro-batch only (0 is a value, not absent)");
    CHECK(mb && strcmp(str_field(mb, "cat"), "") == 0, "NULL category is empty");
    json_t *none = find_event(events, "no args");
    CHECK(none && json_object_size(json_object_get(none, "args")) == 0, "no args: empty object");
    CHECK(none && json_number_value(json_object_get(none, "dur")) == 0.0,
          "negative duration clamped to 0");

    json_t *awk = find_event(events, awkward_name);
    CHECK(awk != NULL, "the name with quotes, backslash, newline, tab, \\x01, UTF-8 is lost");
    CHECK(awk && strcmp(str_field(awk, "cat"), "we\"ird") == 0, "escaped category");
    CHECK(find_event(events, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU") != NULL,
          "a long name is cut to 47 characters");
    CHECK(find_event(events, "0123456789012345678901234567890123456789012345") != NULL,
          "a cut backs off to a UTF-8 character boundary");

    CHECK(find_event(events,
                     "bad\xef\xbf\xbd|\xef\xbf\xbd(|\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd") != NULL,
          "invalid UTF-8 becomes U+FFFD, byte by byte");
    json_t *outer = find_event(events, "outer"), *inner = find_event(events, "inner");
    CHECK(outer && inner, "begin/end spans recorded");
    if (outer && inner) {
        double ots = json_number_value(json_object_get(outer, "ts"));
        double odur = json_number_value(json_object_get(outer, "dur"));
        double its = json_number_value(json_object_get(inner, "ts"));
        double idur = json_number_value(json_object_get(inner, "dur"));
        CHECK(ots <= its && its + idur <= ots + odur + 0.002,
              "inner [%g, +%g] not in outer "
              "[%g, +%g]",
              its, idur, ots, odur);
        CHECK(json_integer_value(json_object_get(outer, "tid")) == LOOM_TRACE_TID(LOOM_TRACE_PP),
              "span on the pp stream");
        CHECK(ots >= 0.0 && ots < 60e6, "span ts %g not relative to the creation", ots);
    }

    size_t i;
    json_t *ev, *counter = NULL;
    json_array_foreach(events, i, ev) {
        if (has_ph(ev, "C")) counter = ev;
    }
    CHECK(counter && strcmp(str_field(counter, "name"), "loss") == 0 &&
              json_number_value(json_object_get(json_object_get(counter, "args"), "value")) ==
                  2.5 &&
              json_integer_value(json_object_get(counter, "pid")) == pid,
          "counter loss = 2.5");
    CHECK(counter && fabs(json_number_value(json_object_get(counter, "ts")) - 5000.0) < 1e-6,
          "counter ts");

    json_t *other = json_object_get(root, "otherData");
    CHECK(json_integer_value(json_object_get(other, "ranks")) == 1 &&
              json_integer_value(json_object_get(other, "events")) == 11 &&
              json_integer_value(json_object_get(other, "dropped_events")) == 0,
          "otherData");
    json_decref(root);

    /* rounded to nanoseconds (three decimals at most), as text */
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(loom_read_file(path, &text, &len));
    CHECK(text && strstr(text, "\"ts\":1234.568,") && strstr(text, "\"dur\":10.25,"),
          "timestamps rounded to 3 decimals");
    free(text);
}

static void test_single(loom_comm *world) {
    char path[1200];
    snprintf(path, sizeof path, "%s/basic_%s.json", tmpdir, world ? "world" : "null");
    loom_trace *trace = NULL;
    CHECK_OK(loom_trace_create(&trace, 0, 1000));
    record_basic(trace);
    CHECK(loom_trace_count(trace) == 11, "count %zu", loom_trace_count(trace));
    CHECK(loom_trace_dropped(trace) == 0, "dropped %lld", (long long)loom_trace_dropped(trace));
    CHECK_OK(loom_trace_write(trace, world, path));
    check_basic_file(path);

    /* written twice: the events stay, the file is replaced, no temporary left behind */
    CHECK_OK(loom_trace_write(trace, world, path));
    check_basic_file(path);
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(!file_exists(tmp), "temporary file left: %s", tmp);

    /* a path that cannot be written: an error naming it, no file */
    char bad[1300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/t.json", tmpdir);
    loom_status st = loom_trace_write(trace, world, bad);
    CHECK(st == LOOM_ERR_IO, "bad path: status %d", st);
    CHECK(strstr(loom_last_error(), "no/such/dir") != NULL, "message: %s", loom_last_error());
    loom_trace_free(trace);
}

static void test_bound(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/bound.json", tmpdir);
    loom_trace *trace = NULL;
    CHECK_OK(loom_trace_create(&trace, 0, 5));
    for (int i = 0; i < 7; i++) {
        loom_trace_event(trace, LOOM_TRACE_COMPUTE, "e", "c", loom_trace_now_us(), 1.0, i, -1);
    }
    loom_trace_counter(trace, "past the bound", loom_trace_now_us(), 1.0);
    CHECK(loom_trace_count(trace) == 5, "kept %zu of 8", loom_trace_count(trace));
    CHECK(loom_trace_dropped(trace) == 3, "dropped %lld", (long long)loom_trace_dropped(trace));
    loom_log_set_level(LOOM_LOG_ERROR); /* the expected warning about drops */
    CHECK_OK(loom_trace_write(trace, NULL, path));
    loom_log_set_level(LOOM_LOG_INFO);
    json_t *root = load_trace(path);
    if (root) {
        json_t *events = json_object_get(root, "traceEvents");
        CHECK(count_phase(events, "X", LOOM_TRACE_PID(0)) == 5, "X events in the file");
        json_t *other = json_object_get(root, "otherData");
        CHECK(json_integer_value(json_object_get(other, "dropped_events")) == 3,
              "dropped_events in otherData");
        json_t *labels = find_metadata(events, "process_labels", LOOM_TRACE_PID(0), -1);
        CHECK(labels && strstr(str_field(json_object_get(labels, "args"), "labels"), "dropped 3"),
              "process_labels names the drops");
        /* the first five are the ones kept */
        size_t i;
        json_t *ev;
        json_int_t expect = 0;
        int in_order = 1;
        json_array_foreach(events, i, ev) {
            if (!has_ph(ev, "X")) continue;
            in_order &= json_integer_value(json_object_get(json_object_get(ev, "args"), "step")) ==
                        expect++;
        }
        CHECK(in_order, "the first events are kept");
        json_decref(root);
    }
    loom_trace_free(trace);

    /* spans: too deep, and an end without a begin */
    CHECK_OK(loom_trace_create(&trace, 0, 100));
    for (int i = 0; i < LOOM_TRACE_MAX_DEPTH + 2; i++) {
        loom_trace_begin(trace, LOOM_TRACE_TP, "nest", "tp");
    }
    for (int i = 0; i < LOOM_TRACE_MAX_DEPTH + 2; i++) loom_trace_end(trace, LOOM_TRACE_TP);
    loom_trace_end(trace, LOOM_TRACE_TP);
    loom_trace_end(trace, LOOM_TRACE_COMPUTE);
    loom_trace_event(trace, (loom_trace_stream)LOOM_TRACE_STREAMS, "bad stream", "", 0, 0, -1, -1);
    CHECK(loom_trace_count(trace) == LOOM_TRACE_MAX_DEPTH, "spans kept %zu",
          loom_trace_count(trace));
    CHECK(loom_trace_dropped(trace) == 5, "spans dropped %lld",
          (long long)loom_trace_dropped(trace));
    loom_trace_free(trace);
}

static void test_null_and_bad_args(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/null.json", tmpdir);
    loom_trace_event(NULL, LOOM_TRACE_COMPUTE, "x", "y", 0.0, 1.0, 1, 1);
    loom_trace_begin(NULL, LOOM_TRACE_DP, "x", "y");
    loom_trace_end(NULL, LOOM_TRACE_DP);
    loom_trace_end(NULL, LOOM_TRACE_PP);
    loom_trace_counter(NULL, "x", 0.0, 1.0);
    CHECK(loom_trace_count(NULL) == 0 && loom_trace_dropped(NULL) == 0, "NULL counts");
    CHECK(loom_trace_origin_us(NULL) == 0.0, "NULL origin");
    CHECK(loom_trace_write(NULL, NULL, path) == LOOM_OK, "NULL write");
    CHECK(!file_exists(path), "NULL write made a file");
    loom_trace_free(NULL);

    loom_trace *trace = NULL;
    CHECK(loom_trace_create(&trace, 0, 0) == LOOM_ERR_INPUT && trace == NULL, "max_events 0");
    CHECK(loom_trace_create(&trace, -1, 10) == LOOM_ERR_INPUT && trace == NULL, "rank -1");

    double a = loom_trace_now_us(), b = loom_trace_now_us();
    CHECK(b >= a && a > 0.0, "clock: %g then %g", a, b);
    CHECK(strcmp(loom_trace_stream_name(LOOM_TRACE_DP), "dp comm") == 0, "stream name");
}

/* ---- many ranks ------------------------------------------------------------------------------ */

/* Rank r records r + 2 X events (compute, and dp on odd ranks) and one counter. */
static int events_of_rank(int r) {
    return r + 2;
}

static void check_gathered_file(const char *path, int per_rank_extra) {
    json_t *root = load_trace(path);
    if (!root) return;
    json_t *events = json_object_get(root, "traceEvents");
    check_complete_fields(events);
    int64_t total = 0;
    for (int r = 0; r < size; r++) {
        json_int_t pid = LOOM_TRACE_PID(r);
        char want[32];
        snprintf(want, sizeof want, "rank %d", r);
        json_t *pname = find_metadata(events, "process_name", pid, -1);
        CHECK(pname && strcmp(str_field(json_object_get(pname, "args"), "name"), want) == 0,
              "process_name of rank %d", r);
        json_t *psort = find_metadata(events, "process_sort_index", pid, -1);
        CHECK(psort && json_integer_value(
                           json_object_get(json_object_get(psort, "args"), "sort_index")) == r,
              "process_sort_index of rank %d", r);
        int want_x = events_of_rank(r) + per_rank_extra;
        CHECK(count_phase(events, "X", pid) == want_x, "rank %d: %d X events, expected %d", r,
              count_phase(events, "X", pid), want_x);
        CHECK(count_phase(events, "C", pid) == 1, "rank %d: counter", r);
        CHECK((find_metadata(events, "thread_name", pid, LOOM_TRACE_TID(LOOM_TRACE_DP)) != NULL) ==
                  (r % 2 == 1),
              "rank %d: dp thread_name only when used", r);
        total += want_x + 1;
    }
    /* no pid outside 1..size */
    size_t i;
    json_t *ev;
    int stray = 0;
    json_array_foreach(events, i, ev) {
        json_int_t pid = json_integer_value(json_object_get(ev, "pid"));
        stray += pid < LOOM_TRACE_PID(0) || pid > LOOM_TRACE_PID(size - 1);
    }
    CHECK(stray == 0, "%d events with a pid outside the ranks", stray);
    json_t *other = json_object_get(root, "otherData");
    CHECK(json_integer_value(json_object_get(other, "ranks")) == size, "otherData.ranks");
    CHECK(json_integer_value(json_object_get(other, "events")) == total, "otherData.events %lld",
          (long long)json_integer_value(json_object_get(other, "events")));

    /* clocks: each rank's first event was recorded right after its creation, which followed a
     * barrier; relative timestamps start near 0 on every rank (raw clocks would be ~1e12) */
    for (int r = 0; r < size; r++) {
        double first = -1.0;
        json_array_foreach(events, i, ev) {
            if (has_ph(ev, "X") &&
                json_integer_value(json_object_get(ev, "pid")) == LOOM_TRACE_PID(r)) {
                double ts = json_number_value(json_object_get(ev, "ts"));
                if (first < 0.0 || ts < first) first = ts;
            }
        }
        CHECK(first >= 0.0 && first < 30e6, "rank %d: first ts %g us after creation", r, first);
    }
    json_decref(root);
}

static void record_rank(loom_trace *trace, int extra) {
    for (int i = 0; i < events_of_rank(rank); i++) {
        int dp = rank % 2 == 1 && i == 0;
        double t = loom_trace_now_us();
        loom_trace_event(trace, dp ? LOOM_TRACE_DP : LOOM_TRACE_COMPUTE, dp ? "allreduce" : "fwd",
                         "c", t, 3.0, 1, i);
    }
    for (int i = 0; i < extra; i++) {
        loom_trace_event(trace, LOOM_TRACE_COMPUTE, "many \"quoted\" events", "bulk",
                         loom_trace_now_us(), 1.5, i, i % 8);
    }
    loom_trace_counter(trace, "tokens", loom_trace_now_us(), 1000.0 * rank);
}

static void test_gather(loom_comm *world, int extra) {
    char path[1200];
    snprintf(path, sizeof path, "%s/gathered_%d.json", tmpdir, extra);
    CHECK_OK(loom_comm_barrier(world));
    loom_trace *trace = NULL;
    CHECK_OK(loom_trace_create(&trace, rank, (size_t)(events_of_rank(rank) + extra + 1)));
    record_rank(trace, extra);
    CHECK_OK(loom_trace_write(trace, world, path));
    if (rank == 0) check_gathered_file(path, extra);

    /* a path rank 0 cannot write: every rank sees the failure, nobody hangs */
    char bad[1300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/t.json", tmpdir);
    loom_status st = loom_trace_write(trace, world, bad);
    CHECK(st == LOOM_ERR_IO, "rank %d: bad path: status %d", rank, st);
    loom_trace_free(trace);
    CHECK_OK(loom_comm_barrier(world));
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_last_error());
        return 1;
    }
    rank = loom_comm_rank(world);
    size = loom_comm_size(world);
    if (rank == 0) snprintf(tmpdir, sizeof tmpdir, "%s", check_tmpdir());
    CHECK_OK(loom_comm_broadcast(world, tmpdir, (int64_t)sizeof tmpdir, 0));

    if (size == 1) {
        test_single(NULL);
        test_single(world);
        test_bound();
        test_null_and_bad_args();
    }
    test_gather(world, 0);
    test_gather(world, 20000); /* a few MiB per rank: several transfer chunks */

    /* Totals over every rank, printed once. */
    double counts[2] = {check_passed, check_failed};
    int local_failed = check_failed;
    if (loom_comm_allreduce_f64(world, counts, 2, LOOM_REDUCE_SUM) != LOOM_OK) {
        fprintf(stderr, "rank %d: summing the results: %s\n", rank, loom_last_error());
        local_failed = 1;
    }
    loom_comm_finalize(world);
    if (rank == 0) {
        check_passed = (int)counts[0];
        check_failed = (int)counts[1];
        if (check_finish() != 0) return 1;
    }
    return local_failed ? 1 : 0;
}
