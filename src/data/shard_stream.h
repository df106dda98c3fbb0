/*
 * shard_stream.h — private to src/data: writing an llm.c shard token by token (so `prepare`
 * never holds a whole shard in memory), and reading a validated shard into memory the caller
 * owns (so a dataset concatenates shards without a second copy).
 */
#ifndef LOOM_DATA_SHARD_STREAM_H
#define LOOM_DATA_SHARD_STREAM_H

#include "loom/data.h"

typedef struct loom_shard_stream loom_shard_stream;

/* Starts an atomic write of a shard at path; the header is written at commit. */
loom_status loom_shard_stream_open(loom_shard_stream **stream, const char *path);
/* Fails (LOOM_ERR_INPUT) if the shard would exceed LOOM_SHARD_MAX_TOKENS tokens. */
loom_status loom_shard_stream_append(loom_shard_stream *stream, const uint16_t *tokens,
                                     size_t count);
size_t loom_shard_stream_count(const loom_shard_stream *stream);
/* Writes the header, fsyncs and renames; frees the stream whatever happens. */
loom_status loom_shard_stream_commit(loom_shard_stream *stream);
/* Drops the temporary file; frees the stream. NULL is fine. */
void loom_shard_stream_abort(loom_shard_stream *stream);

/* Reads the shard at path into dst, which has room for exactly expected_count tokens (from an
 * earlier loom_shard_probe); a file whose count changed since is an error. */
loom_status loom_shard_read_into(const char *path, uint16_t *dst, size_t expected_count);

#endif
