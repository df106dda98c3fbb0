/*
 * loom/base.h — what every module stands on: status codes with a per-thread
 * error message, logging, a counter-based random number generator, timers,
 * and small file helpers (atomic writes).
 *
 * Not here: anything that knows about models, tensors or MPI.
 */
#ifndef LOOM_BASE_H
#define LOOM_BASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------------------------ */

typedef enum {
    LOOM_OK = 0,
    LOOM_ERR_INPUT,   /* bad input: missing/malformed file, flag or value (CLI exit 2) */
    LOOM_ERR_IO,      /* a read or write failed on a file we own (CLI exit 1) */
    LOOM_ERR_NOMEM,   /* an allocation failed (CLI exit 1) */
    LOOM_ERR_NUMERIC, /* NaN/Inf where training cannot go on (CLI exit 1) */
    LOOM_ERR_RUNTIME, /* any other failure while running (CLI exit 1) */
} loom_status;

/* A short fixed description of a status code. */
const char *loom_strerror(loom_status status);

/* Records a message in the calling thread's error slot and returns `status`, so that a
 * failing function can `return loom_fail(LOOM_ERR_INPUT, "%s: field: expected ...", path);` */
loom_status loom_fail(loom_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The message of the last loom_fail on this thread ("" if none). */
const char *loom_last_error(void);
void loom_clear_error(void);

/* The CLI's exit code for a status: 0 ok, 2 bad input, 1 anything else. */
int loom_exit_code(loom_status status);

/* For a broken invariant or a failure that cannot be handed back (a kernel's scratch
 * allocation, a forward called before its buffers were reserved): prints "internal error:
 * MESSAGE" to stderr and aborts, so that no abort is silent. Not for bad input, which returns
 * a status. */
void loom_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* ---- logging ----------------------------------------------------------------------------- */

typedef enum { LOOM_LOG_DEBUG, LOOM_LOG_INFO, LOOM_LOG_WARN, LOOM_LOG_ERROR } loom_log_level;

void loom_log_set_level(loom_log_level level);
/* Prefix put before every line (for example "[rank 3] "); NULL for none. */
void loom_log_set_prefix(const char *prefix);
void loom_log(loom_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define loom_info(...)  loom_log(LOOM_LOG_INFO, __VA_ARGS__)
#define loom_warn(...)  loom_log(LOOM_LOG_WARN, __VA_ARGS__)
#define loom_error(...) loom_log(LOOM_LOG_ERROR, __VA_ARGS__)

/* ---- random numbers ----------------------------------------------------------------------
 * Counter-based: the value at (seed, stream, index) does not depend on which other values were
 * drawn, so every rank of a parallel run can create exactly its shard of a tensor and get the
 * numbers the single-process run would have. */

uint64_t loom_rng_u64(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1). */
double loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box–Muller on two counter draws). */
double loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* A small sequential generator for sampling and shuffling; its whole state is `state`,
 * so it can be checkpointed as one integer. */
typedef struct {
    uint64_t state;
} loom_rng;
void loom_rng_seed(loom_rng *rng, uint64_t seed);
uint64_t loom_rng_next(loom_rng *rng);
double loom_rng_next_uniform(loom_rng *rng); /* [0, 1) */

/* ---- time -------------------------------------------------------------------------------- */

/* Monotonic seconds. */
double loom_now(void);

/* ---- memory and files -------------------------------------------------------------------- */

/* malloc/calloc that record a loom error on failure (NULL returned). */
void *loom_malloc(size_t bytes, const char *what);
void *loom_calloc(size_t count, size_t size, const char *what);
/* 64-byte aligned, zeroed allocation; free with loom_free_aligned. */
void *loom_alloc_aligned(size_t bytes, const char *what);
void loom_free_aligned(void *ptr);

/* Reads a whole file; fails with LOOM_ERR_INPUT naming the path when it is missing or
 * unreadable. *data is NUL-terminated (not counted in *size). */
loom_status loom_read_file(const char *path, char **data, size_t *size);

/* Atomic file write: data goes to PATH.tmp.PID, is fsynced, renamed over PATH, and the
 * directory is fsynced. A crash leaves either the old file or the new one. */
typedef struct loom_atomic_file loom_atomic_file;
loom_status loom_atomic_open(loom_atomic_file **file, const char *path);
FILE *loom_atomic_stream(loom_atomic_file *file);
/* Flushes, fsyncs and renames; frees the handle whatever happens. */
loom_status loom_atomic_commit(loom_atomic_file *file);
/* Removes the temporary file; frees the handle. */
void loom_atomic_abort(loom_atomic_file *file);
loom_status loom_write_file_atomic(const char *path, const void *data, size_t size);

/* mkdir -p; fails naming the path. */
loom_status loom_mkdir_p(const char *path);

/* DIR/NAME into buf (cap bytes; NAME alone when dir is NULL). A path that does not fit is
 * refused, never cut: LOOM_ERR_INPUT "path too long: DIR/NAME (N bytes, at most M)", and buf is
 * left empty. buf must not overlap dir or name. */
loom_status loom_path_join(char *buf, size_t cap, const char *dir, const char *name);

/* llm.c's binary files — token shards (magic 20240520 with uint16 tokens, 20240801 with uint32
 * tokens), tokenizers (20240328) and model checkpoints (20240326) — start with a header of 256
 * little-endian int32 slots, slot 0 the magic. loom_i32_header_decode reads it from the first
 * `size` bytes of `path` (already in memory) into slots[]; LOOM_ERR_INPUT naming `path` when the
 * file is shorter than the header ("file is 10 bytes, shorter than the 1024-byte header of an llm.c
 * token shard") or slot 0 is not `magic`
 * ("header slot 0 (magic): expected 20240520 (an llm.c token shard), got 20240326 (an llm.c
 * model checkpoint)"). The other slots are the caller's to check. */
#define LOOM_I32_HEADER_SLOTS 256
#define LOOM_I32_HEADER_BYTES 1024
loom_status loom_i32_header_decode(const void *bytes, size_t size, const char *path, int32_t magic,
                                   int32_t slots[LOOM_I32_HEADER_SLOTS]);
/* The same, read from the open file `f` positioned at its start; on success `f` stands at the
 * first byte after the header. */
loom_status loom_i32_header_read(FILE *f, const char *path, int32_t magic,
                                 int32_t slots[LOOM_I32_HEADER_SLOTS]);
/* Both for a format with several magics (token shards): slot 0 must be one of magics[0..count),
 * which slots[0] then tells apart; the message lists them ("expected 20240520 (an llm.c token
 * shard) or 20240801 (...), got ..."), and a short file is named by magics[0]'s format. */
loom_status loom_i32_header_decode_any(const void *bytes, size_t size, const char *path,
                                       const int32_t *magics, int count,
                                       int32_t slots[LOOM_I32_HEADER_SLOTS]);
loom_status loom_i32_header_read_any(FILE *f, const char *path, const int32_t *magics, int count,
                                     int32_t slots[LOOM_I32_HEADER_SLOTS]);
/* The header's bytes for slots[], as the writers of these formats put them. */
void loom_i32_header_encode(unsigned char bytes[LOOM_I32_HEADER_BYTES],
                            const int32_t slots[LOOM_I32_HEADER_SLOTS]);

/* Bytes of memory this machine can still give a process (MemAvailable of /proc/meminfo, else the
 * physical memory), shared by the ranks that run on it; 0 when unknown. */
int64_t loom_memory_available(void);
/* Refuses (LOOM_ERR_INPUT) a need of `bytes` that exceeds what the machine has for each of
 * `sharers` processes: "WHAT needs X GiB ..., this machine has Y GiB available[ for each of N
 * ranks]; HINT". Unknown memory passes. */
loom_status loom_memory_check(int64_t bytes, int sharers, const char *what, const char *hint);

/* Precisions a plan and a cluster description name: fp32 (what loom trains), bf16 and fp16
 * (simulated GPU clusters; fp32 master weights). Here because both descriptions use them. */
typedef enum { LOOM_PRECISION_FP32, LOOM_PRECISION_BF16, LOOM_PRECISION_FP16 } loom_precision;
#define LOOM_PRECISIONS 3
/* "fp32", "bf16", "fp16"; anything else is LOOM_ERR_INPUT naming `source` and `field`. */
loom_status loom_precision_parse(const char *name, const char *source, const char *field,
                                 loom_precision *precision);
const char *loom_precision_name(loom_precision precision);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_BASE_H */
