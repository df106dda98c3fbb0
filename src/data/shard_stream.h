/*
 * shard_stream.h — private to src/data: writing an llm.c shard (of uint16 or uint32 tokens)
 * token by token (so `prepare` never holds a whole shard in memory), and opening a validated
 * shard as a stream (so a dataset can check its tokens and map it through one open file).
 */
#ifndef LOOM_DATA_SHARD_STREAM_H
#define LOOM_DATA_SHARD_STREAM_H

#include "loom/data.h"

/* Shards are little-endian; on such a host their token bytes can be copied as they are. */
static inline int loom_host_is_little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}

typedef struct loom_shard_stream loom_shard_stream;

/* Starts an atomic write of a shard at path with tokens of token_width bytes (2: magic 20240520,
 * 4: magic 20240801); the header is written at commit. */
loom_status loom_shard_stream_open(loom_shard_stream **stream, const char *path, int token_width);
/* Either kind of ids goes into either width of shard; an id that a uint16 shard cannot hold is
 * LOOM_ERR_INPUT naming the shard. Both fail (LOOM_ERR_INPUT) if the shard would exceed
 * LOOM_SHARD_MAX_TOKENS tokens. */
loom_status loom_shard_stream_append(loom_shard_stream *stream, const uint16_t *tokens,
                                     size_t count);
loom_status loom_shard_stream_append_wide(loom_shard_stream *stream, const uint32_t *tokens,
                                          size_t count);
size_t loom_shard_stream_count(const loom_shard_stream *stream);
/* Writes the header, fsyncs and renames; frees the stream whatever happens. */
loom_status loom_shard_stream_commit(loom_shard_stream *stream);
/* Drops the temporary file; frees the stream. NULL is fine. */
void loom_shard_stream_abort(loom_shard_stream *stream);

/* Opens the shard at path and validates it like loom_shard_probe (magic and version, and a file
 * size of exactly 1024 + width*count bytes, measured on this open file). On success *file is
 * positioned at the first token (fclose it) and *token_width is 2 or 4; on error *file is NULL,
 * *count 0, and the message names path. */
loom_status loom_shard_open(const char *path, FILE **file, size_t *count, int *token_width);

#endif
