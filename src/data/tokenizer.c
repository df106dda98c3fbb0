/*
 * tokenizer.c — the byte-level tokenizer (every byte is its own token, plus an end-of-text
 * token; it needs no vocabulary file, so `loom prepare` works on any text), and the
 * loom_tokenizer handle that puts it and byte-level BPE (bpe.c: GPT-2's, Llama 3's) behind one
 * interface.
 */
#include "data/bpe_internal.h"
#include "loom/data.h"

#include <stdlib.h>
#include <string.h>

size_t loom_bytes_encode(const char *text, size_t length, uint16_t *tokens) {
    const unsigned char *bytes = (const unsigned char *)text;
    for (size_t i = 0; i < length; i++) tokens[i] = bytes[i];
    return length;
}

size_t loom_bytes_decode(const uint16_t *tokens, size_t count, char *out, size_t cap) {
    if (cap == 0) return 0;
    size_t n = count < cap - 1 ? count : cap - 1;
    for (size_t i = 0; i < n; i++) {
        uint16_t t = tokens[i];
        if (t < 256) {
            out[i] = (char)(unsigned char)t;
        } else if (t == LOOM_BYTE_EOT) {
            out[i] = '\n';
        } else {
            out[i] = '?';
        }
    }
    out[n] = '\0';
    return n;
}

/* ---- one handle for both tokenizers ------------------------------------------------------ */

struct loom_tokenizer {
    loom_bpe *bpe; /* NULL: bytes */
    char source[TOKENIZER_PATH_MAX];
    char byte_table[257]; /* bytes' tokens: byte_table[i] is byte i; EOT is "\n" */
};

struct loom_token_encoder {
    const loom_tokenizer *tok;
    loom_bpe_encoder *bpe;
};

loom_status loom_tokenizer_open(loom_tokenizer **out, const char *spec) {
    *out = NULL;
    if (!spec || !*spec)
        return loom_fail(LOOM_ERR_INPUT, "--tokenizer: expected \"bytes\" or a path");
    loom_tokenizer *tok = loom_calloc(1, sizeof *tok, "tokenizer");
    if (!tok) return LOOM_ERR_NOMEM;
    loom_status st = loom_path_join(tok->source, sizeof tok->source, NULL, spec);
    if (st != LOOM_OK) {
        free(tok);
        return st;
    }
    for (int i = 0; i < 256; i++) tok->byte_table[i] = (char)(unsigned char)i;
    tok->byte_table[256] = '\n';
    if (strcmp(spec, "bytes") != 0) {
        st = loom_bpe_open(&tok->bpe, spec);
        if (st != LOOM_OK) {
            free(tok);
            return st;
        }
    }
    *out = tok;
    return LOOM_OK;
}

void loom_tokenizer_free(loom_tokenizer *tok) {
    if (!tok) return;
    loom_bpe_free(tok->bpe);
    free(tok);
}

const char *loom_tokenizer_name(const loom_tokenizer *tok) {
    return tok->bpe ? "gpt2" : "bytes";
}

const char *loom_tokenizer_source(const loom_tokenizer *tok) {
    return tok->source;
}

int loom_tokenizer_vocab_size(const loom_tokenizer *tok) {
    return tok->bpe ? loom_bpe_vocab_size(tok->bpe) : LOOM_BYTE_VOCAB;
}

int loom_tokenizer_eot(const loom_tokenizer *tok) {
    return tok->bpe ? loom_bpe_eot(tok->bpe) : LOOM_BYTE_EOT;
}

int loom_tokenizer_document_start(const loom_tokenizer *tok) {
    int bos = tok->bpe ? loom_bpe_bos(tok->bpe) : -1;
    return bos >= 0 ? bos : loom_tokenizer_eot(tok);
}

size_t loom_tokenizer_token_bytes(const loom_tokenizer *tok, int id, const char **bytes) {
    if (tok->bpe) return loom_bpe_token_bytes(tok->bpe, id, bytes);
    if (id < 0 || id >= LOOM_BYTE_VOCAB) {
        *bytes = NULL;
        return 0;
    }
    *bytes = tok->byte_table + id;
    return 1;
}

loom_status loom_tokenizer_check_vocab(const loom_tokenizer *tok, int model_vocab,
                                       const char *model) {
    int vocab = loom_tokenizer_vocab_size(tok);
    if (model_vocab >= vocab) return LOOM_OK;
    return loom_fail(LOOM_ERR_INPUT,
                     "%s: the model's vocabulary has %d ids, the %s tokenizer (%s) has %d: they do "
                     "not belong together (give the tokenizer the model was trained with)",
                     model, model_vocab, loom_tokenizer_name(tok), tok->source, vocab);
}

loom_status loom_token_encoder_create(loom_token_encoder **out, const loom_tokenizer *tok) {
    *out = NULL;
    loom_token_encoder *enc = loom_calloc(1, sizeof *enc, "tokenizer encoder");
    if (!enc) return LOOM_ERR_NOMEM;
    enc->tok = tok;
    if (tok->bpe) {
        loom_status st = loom_bpe_encoder_create(&enc->bpe, tok->bpe);
        if (st != LOOM_OK) {
            free(enc);
            return st;
        }
    }
    *out = enc;
    return LOOM_OK;
}

void loom_token_encoder_free(loom_token_encoder *enc) {
    if (!enc) return;
    loom_bpe_encoder_free(enc->bpe);
    free(enc);
}

loom_status loom_token_encoder_run(loom_token_encoder *enc, const char *text, size_t length,
                                   int special, uint16_t *tokens, size_t *count) {
    if (!enc->bpe) {
        *count = loom_bytes_encode(text, length, tokens);
        return LOOM_OK;
    }
    int vocab = loom_tokenizer_vocab_size(enc->tok);
    if (vocab > LOOM_SHARD_MAX_VOCAB) {
        *count = 0;
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: the tokenizer has %d ids, more than 16-bit token ids hold (%d)",
                         enc->tok->source, vocab, LOOM_SHARD_MAX_VOCAB);
    }
    return loom_bpe_encode(enc->bpe, text, length, special, tokens, count);
}

loom_status loom_token_encoder_run_wide(loom_token_encoder *enc, const char *text, size_t length,
                                        int special, uint32_t *tokens, size_t *count) {
    if (!enc->bpe) {
        const unsigned char *bytes = (const unsigned char *)text;
        for (size_t i = 0; i < length; i++) tokens[i] = bytes[i];
        *count = length;
        return LOOM_OK;
    }
    return loom_bpe_encode_wide(enc->bpe, text, length, special, tokens, count);
}
