/*
 * prepare.c — `loom prepare`: text files -> byte-level train/val shards. Each file is one
 * document; its tail (val_fraction of its bytes, with a floor of one window-worth when the file
 * is long enough) goes to validation, so both splits see every source. Each part is followed by
 * EOT, so documents never run into each other. Shards are written as they fill: memory is one
 * input file at a time.
 *
 * Not here: BPE tokenisation, deduplication or any cleaning of the text.
 */
#define _POSIX_C_SOURCE 200809L
#include "shard_stream.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

loom_prepare_opts loom_prepare_default_opts(void) {
    loom_prepare_opts opts = {
        .val_fraction = 0.1,
        .shard_tokens = 100000000,
        .min_val_tokens = LOOM_PREPARE_MIN_VAL_TOKENS,
    };
    return opts;
}

/* The documented rule (see data.h): how many trailing bytes of an n-byte file go to val. */
static size_t val_bytes_for(size_t n, const loom_prepare_opts *opts) {
    if (opts->val_fraction <= 0 || n < 2) return 0;
    size_t val = (size_t)floor(opts->val_fraction * (double)n + 0.5);
    if (val < 1) val = 1;
    if (opts->min_val_tokens > 1) {
        size_t floor_bytes = opts->min_val_tokens - 1;
        if (floor_bytes > n / 2) floor_bytes = n / 2;
        if (val < floor_bytes) val = floor_bytes;
    }
    if (val > n - 1) val = n - 1;
    return val;
}

/* ---- one split's shard sequence ---------------------------------------------------------- */

typedef struct {
    const char *dir;
    const char *name; /* "train" or "val" */
    size_t shard_tokens;
    loom_shard_stream *open; /* the shard being filled, or NULL */
    int shards_done;
    size_t total_tokens;
} split_writer;

static char *shard_path(const split_writer *w, int index) {
    size_t len = strlen(w->dir) + strlen(w->name) + 32;
    char *path = loom_malloc(len, "shard path");
    if (path) snprintf(path, len, "%s/%s_%06d.bin", w->dir, w->name, index);
    return path;
}

static loom_status split_close_shard(split_writer *w) {
    size_t count = loom_shard_stream_count(w->open);
    loom_status status = loom_shard_stream_commit(w->open);
    w->open = NULL;
    if (status != LOOM_OK) return status;
    char *path = shard_path(w, w->shards_done);
    if (path) loom_info("prepare: wrote %s (%zu tokens)", path, count);
    free(path);
    w->shards_done++;
    return LOOM_OK;
}

static loom_status split_append(split_writer *w, const uint16_t *tokens, size_t count) {
    while (count > 0) {
        if (!w->open) {
            char *path = shard_path(w, w->shards_done);
            if (!path) return LOOM_ERR_NOMEM;
            loom_status status = loom_shard_stream_open(&w->open, path);
            free(path);
            if (status != LOOM_OK) return status;
        }
        size_t room = w->shard_tokens - loom_shard_stream_count(w->open);
        size_t n = count < room ? count : room;
        loom_status status = loom_shard_stream_append(w->open, tokens, n);
        if (status != LOOM_OK) return status;
        tokens += n;
        count -= n;
        w->total_tokens += n;
        if (loom_shard_stream_count(w->open) == w->shard_tokens) {
            status = split_close_shard(w);
            if (status != LOOM_OK) return status;
        }
    }
    return LOOM_OK;
}

/* A document part followed by EOT. */
static loom_status split_append_document(split_writer *w, const uint16_t *tokens, size_t count) {
    static const uint16_t eot = LOOM_BYTE_EOT;
    loom_status status = split_append(w, tokens, count);
    return status == LOOM_OK ? split_append(w, &eot, 1) : status;
}

/* Removes DIR/NAME_NNNNNN.bin left by an earlier, larger run, so a glob sees only ours. */
static loom_status split_remove_stale(const split_writer *w) {
    for (int index = w->shards_done;; index++) {
        char *path = shard_path(w, index);
        if (!path) return LOOM_ERR_NOMEM;
        int rc = unlink(path);
        int err = errno;
        if (rc == 0) loom_info("prepare: removed stale shard %s", path);
        if (rc != 0 && err != ENOENT) {
            loom_status status =
                loom_fail(LOOM_ERR_IO, "%s: cannot remove stale shard: %s", path, strerror(err));
            free(path);
            return status;
        }
        free(path);
        if (rc != 0) return LOOM_OK;
    }
}

/* ---- driver ------------------------------------------------------------------------------ */

static loom_status check_inputs(const char *const *paths, int count, const char *out_dir,
                                const loom_prepare_opts *opts) {
    if (!(opts->val_fraction >= 0 && opts->val_fraction < 1)) {
        return loom_fail(LOOM_ERR_INPUT, "prepare: validation fraction: expected in [0, 1), got %g",
                         opts->val_fraction);
    }
    if (opts->shard_tokens < 1 || opts->shard_tokens > LOOM_SHARD_MAX_TOKENS) {
        return loom_fail(LOOM_ERR_INPUT, "prepare: shard tokens: expected 1..%zu, got %zu",
                         LOOM_SHARD_MAX_TOKENS, opts->shard_tokens);
    }
    if (!out_dir || !*out_dir) {
        return loom_fail(LOOM_ERR_INPUT, "prepare: output directory: expected a path, got none");
    }
    struct stat out_st;
    if (stat(out_dir, &out_st) == 0 && !S_ISDIR(out_st.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: output directory: exists and is not a directory; expected a new or "
                         "existing directory",
                         out_dir);
    }
    if (count < 1 || !paths) {
        return loom_fail(LOOM_ERR_INPUT, "prepare: expected at least one input text file");
    }
    for (int i = 0; i < count; i++) {
        FILE *f = paths[i] ? fopen(paths[i], "rb") : NULL;
        if (!f) {
            return loom_fail(LOOM_ERR_INPUT, "%s: cannot open input text: %s",
                             paths[i] ? paths[i] : "(null)", strerror(errno));
        }
        struct stat st;
        int ok = fstat(fileno(f), &st) == 0;
        fclose(f);
        if (!ok || !S_ISREG(st.st_mode)) {
            return loom_fail(LOOM_ERR_INPUT, "%s: input text is not a regular file", paths[i]);
        }
        if (st.st_size == 0) {
            return loom_fail(LOOM_ERR_INPUT, "%s: input text is empty", paths[i]);
        }
    }
    return LOOM_OK;
}

static loom_status prepare_file(const char *path, const loom_prepare_opts *opts,
                                split_writer *train, split_writer *val) {
    char *text;
    size_t n;
    loom_status status = loom_read_file(path, &text, &n);
    if (status != LOOM_OK) return status;
    if (n == 0) {
        free(text);
        return loom_fail(LOOM_ERR_INPUT, "%s: input text is empty", path);
    }
    uint16_t *tokens = loom_malloc(n * sizeof *tokens, path);
    if (!tokens) {
        free(text);
        return LOOM_ERR_NOMEM;
    }
    loom_bytes_encode(text, n, tokens);
    free(text);
    size_t val_bytes = val_bytes_for(n, opts);
    size_t train_bytes = n - val_bytes;
    status = split_append_document(train, tokens, train_bytes);
    if (status == LOOM_OK && val_bytes > 0) {
        status = split_append_document(val, tokens + train_bytes, val_bytes);
    }
    free(tokens);
    if (status == LOOM_OK) {
        loom_info("prepare: %s: %zu bytes -> %zu train + %zu val tokens", path, n, train_bytes + 1,
                  val_bytes ? val_bytes + 1 : 0);
    }
    return status;
}

loom_status loom_prepare_text(const char *const *paths, int count, const char *out_dir,
                              const loom_prepare_opts *opts) {
    loom_prepare_opts defaults = loom_prepare_default_opts();
    if (!opts) opts = &defaults;
    loom_status status = check_inputs(paths, count, out_dir, opts);
    if (status != LOOM_OK) return status;
    status = loom_mkdir_p(out_dir);
    if (status != LOOM_OK) return status;

    split_writer train = {.dir = out_dir, .name = "train", .shard_tokens = opts->shard_tokens};
    split_writer val = {.dir = out_dir, .name = "val", .shard_tokens = opts->shard_tokens};
    for (int i = 0; i < count && status == LOOM_OK; i++) {
        status = prepare_file(paths[i], opts, &train, &val);
    }
    if (status == LOOM_OK && train.open) status = split_close_shard(&train);
    if (status == LOOM_OK && val.open) status = split_close_shard(&val);
    if (status != LOOM_OK) {
        loom_shard_stream_abort(train.open);
        loom_shard_stream_abort(val.open);
        return status;
    }
    status = split_remove_stale(&train);
    if (status == LOOM_OK) status = split_remove_stale(&val);
    if (status != LOOM_OK) return status;
    loom_info("prepare: %s: %zu train tokens in %d shard(s), %zu val tokens in %d shard(s), "
              "vocab %d (bytes + EOT)",
              out_dir, train.total_tokens, train.shards_done, val.total_tokens, val.shards_done,
              LOOM_BYTE_VOCAB);
    return LOOM_OK;
}
