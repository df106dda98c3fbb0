/*
 * prepare.c — `loom prepare`: text files -> train/val token shards, with the byte tokenizer or
 * a byte-level BPE (GPT-2's, Llama 3's), on all cores. Each file is one document; its tail
 * (val_fraction of its tokens, with a floor of one window-worth when the file is long enough) goes
 * to validation, so both splits see every source. Each part carries an EOT (after it for bytes,
 * before it for a BPE, as llm.c's GPT-2 scripts do), so documents never run into each other. Shards
 * are written as they fill: memory is one batch of input files (64 MB, or one larger file) and its
 * tokens. A tokenizer whose ids fit 16 bits gets llm.c's uint16 shards, a larger one (Llama 3's)
 * its uint32 shards; the tokens are held at the shards' width, so a GPT-2 run's memory is not
 * doubled.
 *
 * Not here: deduplication or any cleaning of the text.
 */
#define _POSIX_C_SOURCE 200809L
#include "shard_stream.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
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

/* The documented rule (see data.h): how many trailing tokens of an n-token file go to val. */
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

/* Tokens at one of the two widths: exactly one of the pointers is set. */
typedef struct {
    const uint16_t *narrow;
    const uint32_t *wide;
} token_span;

/* The span's tokens from `at` on. */
static token_span span_from(token_span span, size_t at) {
    return span.narrow ? (token_span){span.narrow + at, NULL} : (token_span){NULL, span.wide + at};
}

typedef struct {
    const char *dir;
    const char *name; /* "train" or "val" */
    size_t shard_tokens;
    int token_width;         /* bytes per token of the shards: 2 or 4 */
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

static loom_status split_append(split_writer *w, token_span tokens, size_t count) {
    for (size_t done = 0; count > 0;) {
        if (!w->open) {
            char *path = shard_path(w, w->shards_done);
            if (!path) return LOOM_ERR_NOMEM;
            loom_status status = loom_shard_stream_open(&w->open, path, w->token_width);
            free(path);
            if (status != LOOM_OK) return status;
        }
        size_t room = w->shard_tokens - loom_shard_stream_count(w->open);
        size_t n = count < room ? count : room;
        token_span part = span_from(tokens, done);
        loom_status status = part.narrow ? loom_shard_stream_append(w->open, part.narrow, n)
                                         : loom_shard_stream_append_wide(w->open, part.wide, n);
        if (status != LOOM_OK) return status;
        done += n;
        count -= n;
        w->total_tokens += n;
        if (loom_shard_stream_count(w->open) == w->shard_tokens) {
            status = split_close_shard(w);
            if (status != LOOM_OK) return status;
        }
    }
    return LOOM_OK;
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
    if (opts->tokenizer) {
        loom_token_encoder *enc = NULL;
        loom_status st = loom_token_encoder_create(&enc, opts->tokenizer);
        loom_token_encoder_free(enc);
        if (st != LOOM_OK) return st;
        if (loom_tokenizer_document_start(opts->tokenizer) < 0) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: the tokenizer has no <|endoftext|> token (nor "
                             "<|begin_of_text|>); prepare puts one between documents",
                             loom_tokenizer_source(opts->tokenizer));
        }
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

/* ---- tokenising in parallel --------------------------------------------------------------
 * A batch of files (up to BATCH_BYTES of text, at least one file) is cut into chunks of about
 * CHUNK_BYTES at places where every tokenizer starts a new token whatever came before: after a
 * newline, before a printable ASCII character (GPT-2's pattern ends a whitespace piece there, and
 * no piece or special token spans a newline into such a character). The chunks are encoded on all
 * threads, each into its own range of its file's token array (a token covers at least one byte),
 * then closed up in order, so the output does not depend on the number of threads. */

#define CHUNK_BYTES (1u << 20)
#define BATCH_BYTES ((size_t)64 << 20)

typedef struct {
    int file;          /* index in the batch */
    size_t start, end; /* bytes of that file */
    size_t count;      /* tokens written at tokens[file] + start */
    loom_status status;
} text_chunk;

typedef struct {
    const char *path;
    char *text;
    size_t bytes;
    uint16_t *narrow; /* (bytes) the tokens, for shards of uint16 tokens; else NULL */
    uint32_t *wide;   /* (bytes) the tokens, for shards of uint32 tokens; else NULL */
    size_t count;
} batch_file;

static token_span file_tokens(const batch_file *file) {
    return (token_span){file->narrow, file->wide};
}

static size_t next_cut(const char *text, size_t from, size_t n) {
    for (size_t p = from; p < n; p++) {
        unsigned char c = (unsigned char)text[p];
        if (text[p - 1] == '\n' && c > ' ' && c < 0x7f) return p;
    }
    return n;
}

/* Appends the chunks of file f to *chunks (growing *cap). */
static loom_status cut_file(const batch_file *file, int f, text_chunk **chunks, size_t *count,
                            size_t *cap) {
    for (size_t start = 0; start < file->bytes;) {
        size_t end = start + CHUNK_BYTES >= file->bytes
                         ? file->bytes
                         : next_cut(file->text, start + CHUNK_BYTES, file->bytes);
        if (*count == *cap) {
            size_t grown_cap = *cap ? 2 * *cap : 64;
            text_chunk *grown = realloc(*chunks, grown_cap * sizeof *grown);
            if (!grown) return loom_fail(LOOM_ERR_NOMEM, "prepare: out of memory");
            *chunks = grown, *cap = grown_cap;
        }
        (*chunks)[(*count)++] = (text_chunk){f, start, end, 0, LOOM_OK};
        start = end;
    }
    return LOOM_OK;
}

/* Encodes every file of the batch into its tokens; *seconds += the time spent encoding. */
static loom_status encode_batch(batch_file *files, int nfiles, loom_token_encoder **encoders,
                                int threads, double *seconds) {
    text_chunk *chunks = NULL;
    size_t nchunks = 0, cap = 0;
    loom_status st = LOOM_OK;
    for (int f = 0; f < nfiles && st == LOOM_OK; f++)
        st = cut_file(&files[f], f, &chunks, &nchunks, &cap);
    if (st != LOOM_OK) {
        free(chunks);
        return st;
    }
    double t0 = loom_now();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t c = 0; c < nchunks; c++) {
        text_chunk *ch = &chunks[c];
        batch_file *file = &files[ch->file];
        loom_token_encoder *enc = encoders[omp_get_thread_num()];
        const char *text = file->text + ch->start;
        size_t length = ch->end - ch->start;
        ch->status = file->wide ? loom_token_encoder_run_wide(enc, text, length, 0,
                                                              file->wide + ch->start, &ch->count)
                                : loom_token_encoder_run(enc, text, length, 0,
                                                         file->narrow + ch->start, &ch->count);
    }
    *seconds += loom_now() - t0;
    for (size_t c = 0; c < nchunks; c++) {
        const text_chunk *ch = &chunks[c];
        batch_file *file = &files[ch->file];
        if (ch->status != LOOM_OK && st == LOOM_OK) {
            st = loom_fail(ch->status, "%s: cannot tokenise bytes %zu..%zu (%s)", file->path,
                           ch->start, ch->end, loom_strerror(ch->status));
        }
        if (file->wide) {
            memmove(file->wide + file->count, file->wide + ch->start, ch->count * sizeof(uint32_t));
        } else {
            memmove(file->narrow + file->count, file->narrow + ch->start,
                    ch->count * sizeof(uint16_t));
        }
        file->count += ch->count;
    }
    free(chunks);
    return st;
}

/* A document part: GPT-2 shards put EOT before each document (llm.c's preparation scripts),
 * byte shards after it. */
static loom_status append_part(split_writer *w, token_span tokens, size_t count, int eot,
                               int eot_first) {
    const uint32_t eot_id = (uint32_t)eot;
    const token_span mark = {NULL, &eot_id}; /* fits either width: the tokenizer's id */
    loom_status status = eot_first ? split_append(w, mark, 1) : LOOM_OK;
    if (status == LOOM_OK) status = split_append(w, tokens, count);
    if (status == LOOM_OK && !eot_first) status = split_append(w, mark, 1);
    return status;
}

static loom_status split_file(const batch_file *file, const loom_prepare_opts *opts, int eot,
                              int eot_first, split_writer *train, split_writer *val) {
    size_t n = file->count;
    size_t val_tokens = val_bytes_for(n, opts);
    size_t train_tokens = n - val_tokens;
    token_span tokens = file_tokens(file);
    loom_status status = append_part(train, tokens, train_tokens, eot, eot_first);
    if (status == LOOM_OK && val_tokens > 0) {
        status = append_part(val, span_from(tokens, train_tokens), val_tokens, eot, eot_first);
    }
    if (status == LOOM_OK) {
        loom_info("prepare: %s: %zu bytes -> %zu train + %zu val tokens", file->path, file->bytes,
                  train_tokens + 1, val_tokens ? val_tokens + 1 : 0);
    }
    return status;
}

/* Files [first, first + nfiles): read, encode, split; the texts are freed before returning. */
static loom_status prepare_batch(const char *const *paths, int first, int nfiles,
                                 const loom_prepare_opts *opts, loom_token_encoder **encoders,
                                 int threads, split_writer *train, split_writer *val,
                                 double *seconds, size_t *bytes) {
    batch_file *files = loom_calloc((size_t)nfiles, sizeof *files, "prepare");
    if (!files) return LOOM_ERR_NOMEM;
    loom_status status = LOOM_OK;
    for (int f = 0; f < nfiles && status == LOOM_OK; f++) {
        files[f].path = paths[first + f];
        status = loom_read_file(files[f].path, &files[f].text, &files[f].bytes);
        if (status == LOOM_OK && files[f].bytes == 0) {
            status = loom_fail(LOOM_ERR_INPUT, "%s: input text is empty", files[f].path);
        }
        if (status == LOOM_OK && train->token_width == 4) {
            files[f].wide = loom_malloc(files[f].bytes * sizeof(uint32_t), files[f].path);
            if (!files[f].wide) status = LOOM_ERR_NOMEM;
        } else if (status == LOOM_OK) {
            files[f].narrow = loom_malloc(files[f].bytes * sizeof(uint16_t), files[f].path);
            if (!files[f].narrow) status = LOOM_ERR_NOMEM;
        }
        if (status == LOOM_OK) *bytes += files[f].bytes;
    }
    if (status == LOOM_OK) status = encode_batch(files, nfiles, encoders, threads, seconds);
    /* each document's mark: <|begin_of_text|> for Llama 3's tokenizer, else end-of-text */
    int eot = opts->tokenizer ? loom_tokenizer_document_start(opts->tokenizer) : LOOM_BYTE_EOT;
    int eot_first = opts->tokenizer && strcmp(loom_tokenizer_name(opts->tokenizer), "bytes") != 0;
    for (int f = 0; f < nfiles; f++) {
        if (status == LOOM_OK) status = split_file(&files[f], opts, eot, eot_first, train, val);
        free(files[f].text), free(files[f].narrow), free(files[f].wide);
    }
    free(files);
    return status;
}

/* Runs every batch with one encoder per thread. */
static loom_status prepare_all(const char *const *paths, int count, const loom_prepare_opts *opts,
                               const loom_tokenizer *tok, split_writer *train, split_writer *val) {
    int threads = opts->threads > 0 ? opts->threads : omp_get_max_threads();
    loom_token_encoder **encoders =
        loom_calloc((size_t)threads, sizeof(loom_token_encoder *), "prepare");
    loom_status status = encoders ? LOOM_OK : LOOM_ERR_NOMEM;
    for (int t = 0; t < threads && status == LOOM_OK; t++) {
        status = loom_token_encoder_create(&encoders[t], tok);
    }
    double seconds = 0.0;
    size_t bytes = 0;
    for (int i = 0; i < count && status == LOOM_OK;) {
        int j = i;
        for (size_t batch_bytes = 0; j < count && (j == i || batch_bytes < BATCH_BYTES); j++) {
            struct stat st;
            batch_bytes += stat(paths[j], &st) == 0 ? (size_t)st.st_size : 0;
        }
        status =
            prepare_batch(paths, i, j - i, opts, encoders, threads, train, val, &seconds, &bytes);
        i = j;
    }
    for (int t = 0; encoders && t < threads; t++) loom_token_encoder_free(encoders[t]);
    free(encoders);
    if (status == LOOM_OK) {
        loom_info("prepare: tokenised %.1f MB in %.2f s (%.1f MB/s, %d thread%s, %s tokenizer)",
                  (double)bytes / 1e6, seconds, seconds > 0 ? (double)bytes / 1e6 / seconds : 0.0,
                  threads, threads == 1 ? "" : "s", loom_tokenizer_name(tok));
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

    loom_tokenizer *bytes_tokenizer = NULL;
    const loom_tokenizer *tok = opts->tokenizer;
    if (!tok) {
        status = loom_tokenizer_open(&bytes_tokenizer, "bytes");
        if (status != LOOM_OK) return status;
        tok = bytes_tokenizer;
    }
    int width = loom_shard_token_width(loom_tokenizer_vocab_size(tok));
    split_writer train = {
        .dir = out_dir, .name = "train", .shard_tokens = opts->shard_tokens, .token_width = width};
    split_writer val = {
        .dir = out_dir, .name = "val", .shard_tokens = opts->shard_tokens, .token_width = width};
    status = prepare_all(paths, count, opts, tok, &train, &val);
    int vocab = loom_tokenizer_vocab_size(tok);
    const char *name = loom_tokenizer_name(tok);
    loom_tokenizer_free(bytes_tokenizer);
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
              "vocab %d (%s), uint%d tokens",
              out_dir, train.total_tokens, train.shards_done, val.total_tokens, val.shards_done,
              vocab, name, 8 * width);
    return LOOM_OK;
}
