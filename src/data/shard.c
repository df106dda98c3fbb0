/*
 * shard.c — llm.c token shards: a 1024-byte header of 256 little-endian int32 slots (magic,
 * version, token count), then the tokens, little-endian, in one of llm.c's two widths: uint16
 * (magic 20240520, version 1: its GPT-2 shards) or uint32 (magic 20240801, version 7: its
 * Llama 3 shards). The magic decides the width. Reading checks the header and that the file size
 * matches the count exactly before allocating anything, so a corrupt count can never trigger a
 * huge allocation. Writing is atomic.
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

enum { CHUNK_TOKENS = 1 << 14 }; /* a chunk of uint32 tokens: 64 KiB on the stack */

/* The two formats, told apart by the magic. */
static const struct {
    int32_t magic, version;
    int token_width; /* bytes */
} shard_formats[] = {
    {LOOM_SHARD_MAGIC, LOOM_SHARD_VERSION, 2},
    {LOOM_SHARD_WIDE_MAGIC, LOOM_SHARD_WIDE_VERSION, 4},
};
enum { NUM_FORMATS = sizeof shard_formats / sizeof shard_formats[0] };

int loom_shard_token_width(int vocab_size) {
    return vocab_size <= LOOM_SHARD_MAX_VOCAB ? 2 : 4;
}

/* ---- reading ----------------------------------------------------------------------------- */

/* The header's format (an index in shard_formats) and count, checked against the file size. */
static loom_status check_header(const char *path, const int32_t *slots, long long file_bytes,
                                int *format) {
    int f = slots[0] == LOOM_SHARD_WIDE_MAGIC ? 1 : 0; /* the magic was one of the two */
    int32_t version = slots[1], header_count = slots[2];
    int width = shard_formats[f].token_width;
    if (version != shard_formats[f].version) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: header slot 1 (version): expected %d, got %d (the version of "
                         "magic %d, uint%d tokens)",
                         path, (int)shard_formats[f].version, (int)version,
                         (int)shard_formats[f].magic, 8 * width);
    }
    if (header_count < 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: header slot 2 (token count): expected >= 0, got %d",
                         path, (int)header_count);
    }
    long long expected = LOOM_SHARD_HEADER_BYTES + (long long)width * header_count;
    if (file_bytes != expected) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: file is %lld bytes but header count %d needs exactly %lld "
                         "(%d-byte header + %d bytes per token): %s",
                         path, file_bytes, (int)header_count, expected, LOOM_SHARD_HEADER_BYTES,
                         width, file_bytes < expected ? "truncated" : "trailing bytes");
    }
    *format = f;
    return LOOM_OK;
}

loom_status loom_shard_open(const char *path, FILE **file, size_t *count, int *token_width) {
    *file = NULL;
    *count = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ERR_INPUT, "%s: cannot open shard: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return loom_fail(LOOM_ERR_INPUT, "%s: not a regular file", path);
    }
    const int32_t magics[NUM_FORMATS] = {shard_formats[0].magic, shard_formats[1].magic};
    int32_t slots[LOOM_I32_HEADER_SLOTS];
    int format = 0;
    loom_status status = loom_i32_header_read_any(f, path, magics, NUM_FORMATS, slots);
    if (status == LOOM_OK) status = check_header(path, slots, (long long)st.st_size, &format);
    if (status != LOOM_OK) {
        fclose(f);
        return status;
    }
    *file = f;
    *count = (size_t)slots[2];
    *token_width = shard_formats[format].token_width;
    return LOOM_OK;
}

/* Reads count tokens of `width` bytes into dst, widened to uint32. */
static loom_status read_tokens(FILE *f, const char *path, uint32_t *dst, size_t count, int width) {
    if (width == 4 && loom_host_is_little_endian()) {
        if (count && fread(dst, sizeof *dst, count, f) != count) {
            return loom_fail(LOOM_ERR_INPUT, "%s: short read of %zu tokens", path, count);
        }
        return LOOM_OK;
    }
    unsigned char bytes[4 * CHUNK_TOKENS];
    for (size_t done = 0; done < count;) {
        size_t n = count - done < CHUNK_TOKENS ? count - done : CHUNK_TOKENS;
        if (fread(bytes, (size_t)width, n, f) != n) {
            return loom_fail(LOOM_ERR_INPUT, "%s: short read at token %zu of %zu", path, done,
                             count);
        }
        for (size_t i = 0; i < n; i++) {
            const unsigned char *b = bytes + (size_t)width * i;
            uint32_t token = (uint32_t)b[0] | (uint32_t)b[1] << 8;
            if (width == 4) token |= (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
            dst[done + i] = token;
        }
        done += n;
    }
    return LOOM_OK;
}

loom_status loom_shard_probe(const char *path, size_t *count, int *token_width) {
    FILE *f;
    int width = 0;
    loom_status status = loom_shard_open(path, &f, count, &width);
    if (status == LOOM_OK) fclose(f);
    if (token_width) *token_width = width;
    return status;
}

loom_status loom_shard_read(const char *path, uint32_t **tokens, size_t *count) {
    *tokens = NULL;
    *count = 0;
    FILE *f;
    size_t n;
    int width;
    loom_status status = loom_shard_open(path, &f, &n, &width);
    if (status != LOOM_OK) return status;
    uint32_t *buf = loom_malloc(n * sizeof *buf, path);
    if (!buf) {
        fclose(f);
        return LOOM_ERR_NOMEM;
    }
    status = read_tokens(f, path, buf, n, width);
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
    int format; /* index in shard_formats */
};

loom_status loom_shard_stream_open(loom_shard_stream **stream, const char *path, int token_width) {
    *stream = NULL;
    if (token_width != 2 && token_width != 4) {
        return loom_fail(LOOM_ERR_INPUT, "%s: token width: expected 2 or 4 bytes, got %d", path,
                         token_width);
    }
    loom_shard_stream *s = loom_calloc(1, sizeof *s, "shard stream");
    if (!s) return LOOM_ERR_NOMEM;
    s->format = token_width == 4 ? 1 : 0;
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

/* Appends narrow[0..count) or wide[0..count) (one is NULL) in the stream's width. */
static loom_status stream_append(loom_shard_stream *stream, const uint16_t *narrow,
                                 const uint32_t *wide, size_t count) {
    if (count > LOOM_SHARD_MAX_TOKENS - stream->count) {
        return loom_fail(LOOM_ERR_INPUT, "%s: a shard holds at most %zu tokens, got %zu + %zu",
                         stream->path, LOOM_SHARD_MAX_TOKENS, stream->count, count);
    }
    size_t width = (size_t)shard_formats[stream->format].token_width;
    FILE *out = loom_atomic_stream(stream->file);
    unsigned char bytes[4 * CHUNK_TOKENS];
    for (size_t done = 0; done < count;) {
        size_t n = count - done < CHUNK_TOKENS ? count - done : CHUNK_TOKENS;
        for (size_t i = 0; i < n; i++) {
            uint32_t token = narrow ? narrow[done + i] : wide[done + i];
            if (width == 2 && token > UINT16_MAX) {
                return loom_fail(LOOM_ERR_INPUT,
                                 "%s: token %u at position %zu does not fit a shard of uint16 "
                                 "tokens",
                                 stream->path, (unsigned)token, stream->count + done + i);
            }
            for (size_t b = 0; b < width; b++) {
                bytes[width * i + b] = (unsigned char)(token >> (8 * b));
            }
        }
        if (fwrite(bytes, width, n, out) != n) {
            return loom_fail(LOOM_ERR_IO, "%s: write failed: %s", stream->path, strerror(errno));
        }
        done += n;
    }
    stream->count += count;
    return LOOM_OK;
}

loom_status loom_shard_stream_append(loom_shard_stream *stream, const uint16_t *tokens,
                                     size_t count) {
    return stream_append(stream, tokens, NULL, count);
}

loom_status loom_shard_stream_append_wide(loom_shard_stream *stream, const uint32_t *tokens,
                                          size_t count) {
    return stream_append(stream, NULL, tokens, count);
}

size_t loom_shard_stream_count(const loom_shard_stream *stream) {
    return stream->count;
}

static void stream_free(loom_shard_stream *stream) {
    free(stream->path);
    free(stream);
}

loom_status loom_shard_stream_commit(loom_shard_stream *stream) {
    int32_t slots[LOOM_I32_HEADER_SLOTS] = {shard_formats[stream->format].magic,
                                            shard_formats[stream->format].version,
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

/* One shard of narrow[0..count) or wide[0..count) (one is NULL), token_width bytes a token. */
static loom_status write_shard(const char *path, const uint16_t *narrow, const uint32_t *wide,
                               size_t count, int token_width) {
    if (count > LOOM_SHARD_MAX_TOKENS) {
        return loom_fail(LOOM_ERR_INPUT, "%s: a shard holds at most %zu tokens, got %zu", path,
                         LOOM_SHARD_MAX_TOKENS, count);
    }
    loom_shard_stream *stream;
    loom_status status = loom_shard_stream_open(&stream, path, token_width);
    if (status != LOOM_OK) return status;
    status = stream_append(stream, narrow, wide, count);
    if (status != LOOM_OK) {
        loom_shard_stream_abort(stream);
        return status;
    }
    return loom_shard_stream_commit(stream);
}

loom_status loom_shard_write(const char *path, const uint16_t *tokens, size_t count) {
    return write_shard(path, tokens, NULL, count, 2);
}

loom_status loom_shard_write_wide(const char *path, const uint32_t *tokens, size_t count) {
    return write_shard(path, NULL, tokens, count, 4);
}
