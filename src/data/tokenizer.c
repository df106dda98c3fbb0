/*
 * tokenizer.c — the byte-level tokenizer: every byte is its own token, plus an end-of-text
 * token. It needs no vocabulary file, so `loom prepare` works on any text.
 *
 * Not here: BPE. GPT-2-tokenised data comes in as llm.c shards.
 */
#include "loom/data.h"

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
