/*
 * shard.c — llm.c token shards: a 1024-byte header of 256 little-endian int32 slots (magic
 * 20240520, version 1, token count), then the tokens as little-endian uint16. Reading checks
 * the header and that the file size matches the count exactly before allocating anything, so a
 * corrupt count can never trigger a huge allocation. Writing is atomic.
 *
 * Not here: which shards make a dataset (dataset.c) or what the tokens mean.
 */
#define _POSIX_C_SOURCE   200809L
#define _FILE_OFFSET_BITS 64
#include "shard_stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { CHUNK_TOKENS = 1 << 15 };

/* ---- reading ----------------------------------------------------------------------------- */

loom_status loom_shard_open(const char *path, FILE **file, size_t *count) {
    *file = NULL;
    *count = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ERR_INPUT, "%s: cannot open shard: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return loom_fail(LOOM_ERR_INPUT, "%s: not a regular file", path);
    }
    long long file_bytes = (long long)st.st_size;
    int32_t slots[LOOM_I32_HEADER_SLOTS];
    loom_status status = loom_i32_header_read(f, path, LOOM_SHARD_MAGIC, slots);
    if (status != LOOM_OK) {
        fclose(f);
        return status;
    }
    int32_t version = slots[1], header_count = slots[2];
    if (version != LOOM_SHARD_VERSION) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: header slot 1 (version): expected %d, got %d", path,
                           LOOM_SHARD_VERSION, (int)version);
    } else if (header_count < 0) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: header slot 2 (token count): expected >= 0, got %d",
                           path, (int)header_count);
    } else {
        long long expected = LOOM_SHARD_HEADER_BYTES + 2LL * header_count;
        if (file_bytes != expected) {
            status =
                loom_fail(LOOM_ERR_INPUT,
                          "%s: file is %lld bytes but header count %d needs exactly %lld "
                          "(%d-byte header + 2 bytes per token): %s",
                          path, file_bytes, (int)header_count, expected, LOOM_SHARD_HEADER_BYTES,
                          file_bytes < expected ? "truncated" : "trailing bytes");
        }
    }
    if (status != LOOM_OK) {
        fclose(f);
        return status;
    }
    *file = f;
    *count = (size_t)header_count;
    return LOOM_OK;
}

static loom_status read_tokens(FILE *f, const char *path, uint16_t *dst, size_t count) {
    if (count && fread(dst, sizeof *dst, count, f) != count) {
        return loom_fail(LOOM_ERR_INPUT, "%s: short read of %zu tokens", path, count);
    }
    if (!loom_host_is_little_endian()) {
        for (size_t i = 0; i < count; i++) dst[i] = (uint16_t)(dst[i] >> 8 | dst[i] << 8);
    }
    return LOOM_OK;
}

loom_status loom_shard_probe(const char *path, size_t *count) {
    FILE *f;
    loom_status status = loom_shard_open(path, &f, count);
    if (status == LOOM_OK) fclose(f);
    return status;
}

loom_status loom_shard_read(const char *path, uint16_t **tokens, size_t *count) {
    *tokens = NULL;
    *count = 0;
    FILE *f;
    size_t n;
    loom_status status = loom_shard_open(path, &f, &n);
    if (status != LOOM_OK) return status;
    uint16_t *buf = loom_malloc(n * sizeof *buf, path);
    if (!buf) {
        fclose(f);
        return LOOM_ERR_NOMEM;
    }
    status = read_tokens(f, path, buf, n);
    fclose(f);
    if (status != LOOM_OK) {
        free(buf);
        return status;
    }
    *tokens = buf;
    *count = n;
    return LOOM_OK;
}

/* ---- writing ----------------------------------------------------------------------------- */

struct loom_shard_stream {
    loom_atomic_file *file;
    char *path;
    size_t count;
};

loom_status loom_shard_stream_open(loom_shard_stream **stream, const char *path) {
    *stream = NULL;
    loom_shard_stream *s = loom_calloc(1, sizeof *s, "shard stream");
    if (!s) return LOOM_ERR_NOMEM;
    s->path = strdup(path);
    if (!s->path) {
        free(s);
        return loom_fail(LOOM_ERR_NOMEM, "out of memory opening %s", path);
    }
    loom_status status = loom_atomic_open(&s->file, path);
    if (status == LOOM_OK) {
        /* A zeroed header keeps the token offsets right; the real one is written at commit. */
        static const unsigned char zero_header[LOOM_SHARD_HEADER_BYTES];
        if (fwrite(zero_header, 1, sizeof zero_header, loom_atomic_stream(s->file)) !=
            sizeof zero_header) {
            loom_atomic_abort(s->file);
            status = loom_fail(LOOM_ERR_IO, "%s: write failed", path);
        }
    }
    if (status != LOOM_OK) {
        free(s->path);
        free(s);
        return status;
    }
    *stream = s;
    return LOOM_OK;
}

loom_status loom_shard_stream_append(loom_shard_stream *stream, const uint16_t *tokens,
                                     size_t count) {
    if (count > LOOM_SHARD_MAX_TOKENS - stream->count) {
        return loom_fail(LOOM_ERR_INPUT, "%s: a shard holds at most %zu tokens, got %zu + %zu",
                         stream->path, LOOM_SHARD_MAX_TOKENS, stream->count, count);
    }
    FILE *out = loom_atomic_stream(stream->file);
    unsigned char bytes[2 * CHUNK_TOKENS];
    for (size_t done = 0; done < count;) {
        size_t n = count - done < CHUNK_TOKENS ? count - done : CHUNK_TOKENS;
        for (size_t i = 0; i < n; i++) {
            bytes[2 * i] = (unsigned char)(tokens[done + i] & 0xff);
            bytes[2 * i + 1] = (unsigned char)(tokens[done + i] >> 8);
        }
        if (fwrite(bytes, 2, n, out) != n) {
            return loom_fail(LOOM_ERR_IO, "%s: write failed: %s", stream->path, strerror(errno));
        }
        done += n;
    }
    stream->count += count;
    return LOOM_OK;
}

size_t loom_shard_stream_count(const loom_shard_stream *stream) {
    return stream->count;
}

static void stream_free(loom_shard_stream *stream) {
    free(stream->path);
    free(stream);
}

loom_status loom_shard_stream_commit(loom_shard_stream *stream) {
    int32_t slots[LOOM_I32_HEADER_SLOTS] = {LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION,
                                            (int32_t)stream->count};
    unsigned char header[LOOM_SHARD_HEADER_BYTES];
    loom_i32_header_encode(header, slots);
    FILE *out = loom_atomic_stream(stream->file);
    if (fseek(out, 0, SEEK_SET) != 0 || fwrite(header, 1, sizeof header, out) != sizeof header) {
        loom_status status = loom_fail(LOOM_ERR_IO, "%s: writing the header failed: %s",
                                       stream->path, strerror(errno));
        loom_atomic_abort(stream->file);
        stream_free(stream);
        return status;
    }
    loom_status status = loom_atomic_commit(stream->file);
    stream_free(stream);
    return status;
}

void loom_shard_stream_abort(loom_shard_stream *stream) {
    if (!stream) return;
    loom_atomic_abort(stream->file);
    stream_free(stream);
}

loom_status loom_shard_write(const char *path, const uint16_t *tokens, size_t count) {
    if (count > LOOM_SHARD_MAX_TOKENS) {
        return loom_fail(LOOM_ERR_INPUT, "%s: a shard holds at most %zu tokens, got %zu", path,
                         LOOM_SHARD_MAX_TOKENS, count);
    }
    loom_shard_stream *stream;
    loom_status status = loom_shard_stream_open(&stream, path);
    if (status != LOOM_OK) return status;
    status = loom_shard_stream_append(stream, tokens, count);
    if (status != LOOM_OK) {
        loom_shard_stream_abort(stream);
        return status;
    }
    return loom_shard_stream_commit(stream);
}
