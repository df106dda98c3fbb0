/*
 * test_tokenizer.c — GPT-2's byte-level BPE on small hand-made files: the byte-to-unicode table,
 * the pre-tokeniser's pieces (worked out by hand from the pattern), merges by rank on a
 * hand-worked example, the fast merge against the reference on random text, round trips of any
 * bytes, the three file formats, and bad files refused with the file and its line. Llama 3's
 * pre-tokeniser likewise (pieces worked out from its pattern), and a tiny tokenizer.json that
 * declares it: ignore_merges, special tokens past 16 bits, the 16-bit encoder refusing it, prepare
 * writing uint32 shards for it, other pre-tokenizers and normalizers refused naming the field.
 * (tokenizer_compare.sh checks GPT-2's real vocabulary against js-tiktoken, tokenizer_llama3.sh
 * Llama 3's against two JavaScript implementations.)
 */
#define _POSIX_C_SOURCE 200809L
#include "data/bpe_internal.h"
#include "loom/data.h"

#include "check.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <utf8proc.h>

static const char *tmp;

static const char *tmp_path(const char *name) {
    static char paths[16][1024];
    static int next;
    char *p = paths[next++ % 16];
    snprintf(p, sizeof paths[0], "%s/%s", tmp, name);
    return p;
}

static int error_mentions(const char *text) {
    return strstr(loom_last_error(), text) != NULL;
}

/* bytes -> GPT-2 symbols (UTF-8), into out. */
static void symbols_of(const char *bytes, size_t n, char *out) {
    uint32_t table[256];
    loom_bpe_byte_to_unicode(table);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        k += (size_t)utf8proc_encode_char((utf8proc_int32_t)table[(unsigned char)bytes[i]],
                                          (utf8proc_uint8_t *)out + k);
    }
    out[k] = '\0';
}

/* A tiny tokenizer: byte b has id b, merge i ("left right", raw bytes) makes id 256 + i, then
 * <|endoftext|>. Writes DIR/vocab.json and DIR/merges.txt (skip_byte >= 0 leaves that byte out),
 * or DIR/tokenizer.json (with merges as pairs) when as_tokenizer_json. */
static void write_tiny(const char *dir, const char *const (*merges)[2], int count, int skip_byte,
                       int as_tokenizer_json) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) exit(1);
    json_t *vocab = json_object(), *merge_list = json_array();
    char sym[1024], sym2[1024];
    for (int b = 0; b < 256; b++) {
        char byte = (char)b;
        symbols_of(&byte, 1, sym);
        if (b != skip_byte) json_object_set_new(vocab, sym, json_integer(b));
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    FILE *f = as_tokenizer_json ? NULL : fopen(path, "w");
    if (f) fprintf(f, "#version: 0.2\n");
    for (int i = 0; i < count; i++) {
        char joined[256];
        snprintf(joined, sizeof joined, "%s%s", merges[i][0], merges[i][1]);
        symbols_of(joined, strlen(joined), sym);
        json_object_set_new(vocab, sym, json_integer(256 + i));
        symbols_of(merges[i][0], strlen(merges[i][0]), sym);
        symbols_of(merges[i][1], strlen(merges[i][1]), sym2);
        if (f) fprintf(f, "%s %s\n", sym, sym2);
        json_array_append_new(merge_list, json_pack("[ss]", sym, sym2));
    }
    if (f) fclose(f);
    json_object_set_new(vocab, "<|endoftext|>", json_integer(256 + count));
    if (as_tokenizer_json) {
        json_t *root = json_pack("{s:{s:s,s:o,s:o},s:[{s:i,s:s,s:b}]}", "model", "type", "BPE",
                                 "vocab", vocab, "merges", merge_list, "added_tokens", "id",
                                 256 + count, "content", "<|endoftext|>", "special", 1);
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        json_dump_file(root, path, 0);
        json_decref(root);
    } else {
        snprintf(path, sizeof path, "%s/vocab.json", dir);
        json_dump_file(vocab, path, JSON_INDENT(1));
        json_decref(vocab);
        json_decref(merge_list);
    }
}

static const char *const hello_merges[][2] = {
    {"l", "l"},     {"h", "e"}, {"he", "ll"}, {"hell", "o"},
    {" ", "hello"}, {"b", "c"}, {"a", "b"},   {"a", "a"},
};
#define HELLO_COUNT ((int)(sizeof hello_merges / sizeof hello_merges[0]))

static size_t encode(const loom_tokenizer *tok, const char *text, size_t n, int special,
                     uint16_t *out) {
    loom_token_encoder *enc;
    size_t count = 0;
    if (loom_token_encoder_create(&enc, tok) != LOOM_OK) return 0;
    loom_token_encoder_run(enc, text, n, special, out, &count);
    loom_token_encoder_free(enc);
    return count;
}

static int ids_equal(const uint16_t *got, size_t n, const int *want, size_t m) {
    if (n != m) return 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) return 0;
    return 1;
}

static void test_byte_table(void) {
    uint32_t table[256];
    loom_bpe_byte_to_unicode(table);
    int distinct = 1;
    for (int a = 0; a < 256; a++)
        for (int b = a + 1; b < 256; b++) distinct &= table[a] != table[b];
    CHECK(distinct, "the 256 bytes map to 256 distinct symbols");
    CHECK(table['A'] == 'A' && table['~'] == '~' && table[0xE9] == 0xE9,
          "printables are themselves");
    CHECK(table[0] == 256 && table[' '] == 288 && table['\n'] == 266 && table[0xAD] == 323,
          "0 -> U+0100, space -> U+0120 (G with dot), newline -> U+010A, 0xAD -> U+0143: %u %u "
          "%u %u",
          table[0], table[' '], table['\n'], table[0xAD]);
}

/* The pieces of text by a scanner (GPT-2's unless llama3), joined by '|' into out. */
static void pieces_of(const char *text, char *out, int llama3) {
    size_t n = strlen(text), at = 0, k = 0;
    while (at < n) {
        size_t end = llama3 ? loom_bpe_piece_end_llama3((const unsigned char *)text, at, n)
                            : loom_bpe_piece_end((const unsigned char *)text, at, n);
        if (at) out[k++] = '|';
        memcpy(out + k, text + at, end - at);
        k += end - at;
        at = end;
    }
    out[k] = '\0';
}

static void pieces(const char *text, char *out) {
    pieces_of(text, out, 0);
}

static void test_pieces(void) {
    static const char *const cases[][2] = {
        {"Hello  world", "Hello| | world"},
        {"a\t\tb", "a|\t|\t|b"},
        {"x   \n", "x|   \n"},
        {"it's IT'S they're", "it|'s| IT|'|S| they|'re"},
        {"1,000 23 ab12", "1|,|000| 23| ab|12"},
        {"!!'s x''", "!!'|s| x|''"},
        {"caf\xc3\xa9 \xc2\xa0y", "caf\xc3\xa9| |\xc2\xa0|y"}, /* NBSP is JavaScript's \s */
        {"a\xc2\x85"
         "b",
         "a|\xc2\x85|b"},              /* NEL is not */
        {"e\xcc\x81!", "e|\xcc\x81!"}, /* a combining mark is "other" */
        {"\xff\xfe"
         "ab \xff",
         "\xff\xfe|ab| \xff"}, /* invalid bytes are "other" */
        {" \n x", " \n| x"},
    };
    char got[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pieces(cases[i][0], got);
        CHECK(!strcmp(got, cases[i][1]), "pieces of \"%s\": got \"%s\", want \"%s\"", cases[i][0],
              got, cases[i][1]);
    }
}

static void test_hand_worked(void) {
    const char *dir = tmp_path("hello");
    write_tiny(dir, hello_merges, HELLO_COUNT, -1, 0);
    loom_tokenizer *tok = NULL;
    loom_status st = loom_tokenizer_open(&tok, dir);
    CHECK(st == LOOM_OK, "tiny tokenizer opens: %s", loom_last_error());
    if (st != LOOM_OK) return;
    CHECK(loom_tokenizer_vocab_size(tok) == 256 + HELLO_COUNT + 1 &&
              loom_tokenizer_eot(tok) == 256 + HELLO_COUNT &&
              !strcmp(loom_tokenizer_name(tok), "gpt2"),
          "vocab %d, eot %d", loom_tokenizer_vocab_size(tok), loom_tokenizer_eot(tok));
    uint16_t ids[64];
    /* "hello" merges l+l (rank 0), h+e (1), he+ll (2), hell+o (3); " hello" then Ġ+hello (4) */
    size_t n = encode(tok, "hello hello", 11, 1, ids);
    CHECK(ids_equal(ids, n, (const int[]){259, 260}, 2), "hello hello -> 259 260 (got %zu ids)", n);
    n = encode(tok, "hel", 3, 1, ids);
    CHECK(ids_equal(ids, n, (const int[]){257, 'l'}, 2), "hel -> he l");
    /* b+c has the lower rank, so abc is a bc, not ab c */
    n = encode(tok, "abc", 3, 1, ids);
    CHECK(ids_equal(ids, n, (const int[]){'a', 261}, 2), "abc -> a bc");
    n = encode(tok, "aaa", 3, 1, ids);
    CHECK(ids_equal(ids, n, (const int[]){263, 'a'}, 2), "aaa -> aa a (leftmost first)");
    n = encode(tok, "x<|endoftext|>y", 15, 1, ids);
    CHECK(ids_equal(ids, n, (const int[]){'x', 264, 'y'}, 3), "<|endoftext|> is special");
    n = encode(tok, "<|endoftext|>", 13, 0, ids);
    CHECK(n > 1, "without special, <|endoftext|> is text (%zu ids)", n);
    const char *bytes;
    size_t len = loom_tokenizer_token_bytes(tok, 260, &bytes);
    CHECK(len == 6 && !memcmp(bytes, " hello", 6), "token 260 decodes to \" hello\"");
    len = loom_tokenizer_token_bytes(tok, 99999, &bytes);
    CHECK(len == 0 && bytes == NULL, "an id outside the vocabulary has no bytes");

    /* tokenizer.json with merges as pairs gives the same ids */
    const char *dir2 = tmp_path("hello_json");
    write_tiny(dir2, hello_merges, HELLO_COUNT, -1, 1);
    loom_tokenizer *tok2 = NULL;
    st = loom_tokenizer_open(&tok2, dir2);
    CHECK(st == LOOM_OK, "tokenizer.json opens: %s", loom_last_error());
    if (st == LOOM_OK) {
        uint16_t ids2[64];
        const char *text = "hello hello abc aaa<|endoftext|>";
        n = encode(tok, text, strlen(text), 1, ids);
        size_t n2 = encode(tok2, text, strlen(text), 1, ids2);
        CHECK(n == n2 && !memcmp(ids, ids2, n * sizeof *ids), "tokenizer.json = vocab + merges");
    }
    loom_tokenizer_free(tok2);
    loom_tokenizer_free(tok);
}

/* Random merges over a small alphabet, so that long pieces merge in many orders. */
static void test_fast_equals_reference(void) {
    static char storage[300][2][64];
    const char *(*merges)[2] = calloc(300, sizeof *merges);
    int count = 0;
    char tokens[400][64];
    int ntokens = 0;
    const char *alphabet = "abc ";
    for (int i = 0; i < 4; i++) snprintf(tokens[ntokens++], 64, "%c", alphabet[i]);
    loom_rng rng;
    loom_rng_seed(&rng, 7);
    while (count < 300) {
        const char *l = tokens[loom_rng_next(&rng) % (uint64_t)ntokens];
        const char *r = tokens[loom_rng_next(&rng) % (uint64_t)ntokens];
        char joined[128];
        snprintf(joined, sizeof joined, "%s%s", l, r);
        if (strlen(joined) > 20) continue;
        int dup = 0;
        for (int t = 0; t < ntokens; t++) dup |= !strcmp(tokens[t], joined);
        if (dup) continue;
        snprintf(storage[count][0], 64, "%s", l);
        snprintf(storage[count][1], 64, "%s", r);
        merges[count][0] = storage[count][0], merges[count][1] = storage[count][1];
        snprintf(tokens[ntokens++], 64, "%.40s", joined);
        count++;
    }
    const char *dir = tmp_path("random");
    write_tiny(dir, merges, count, -1, 0);
    free(merges);
    loom_bpe *bpe = NULL;
    loom_bpe_encoder *enc = NULL;
    loom_status st = loom_bpe_open(&bpe, dir);
    if (st == LOOM_OK) st = loom_bpe_encoder_create(&enc, bpe);
    CHECK(st == LOOM_OK, "random merges open: %s", loom_last_error());
    if (st != LOOM_OK) return;
    int same = 1;
    unsigned char piece[300];
    uint32_t fast[300], slow[300];
    for (int trial = 0; trial < 2000 && same; trial++) {
        size_t n = 1 + loom_rng_next(&rng) % 299;
        for (size_t i = 0; i < n; i++) piece[i] = (unsigned char)"abc "[loom_rng_next(&rng) % 4];
        size_t nf = 0, ns = loom_bpe_merge_reference(bpe, piece, n, slow);
        loom_bpe_merge_piece(enc, piece, n, fast, &nf);
        same = nf == ns && !memcmp(fast, slow, ns * sizeof *fast);
    }
    CHECK(same, "the heap merge equals the reference on 2000 random pieces");
    loom_bpe_encoder_free(enc);
    loom_bpe_free(bpe);
}

/* decode(encode(x)) == x for random bytes (invalid UTF-8 included) and text with specials. */
static void test_round_trip(void) {
    loom_tokenizer *tok = NULL;
    if (loom_tokenizer_open(&tok, tmp_path("hello")) != LOOM_OK) {
        CHECK(0, "tiny tokenizer opens: %s", loom_last_error());
        return;
    }
    loom_rng rng;
    loom_rng_seed(&rng, 3);
    size_t n = 20000;
    char *text = malloc(n), *back = malloc(n + 16);
    uint16_t *ids = malloc(n * sizeof *ids);
    int exact = 1;
    for (int trial = 0; trial < 4; trial++) {
        for (size_t i = 0; i < n; i++) {
            uint64_t r = loom_rng_next(&rng);
            text[i] = trial < 2 ? (char)(r & 0xff) : "hel o\n\t'sab"[r % 11];
        }
        if (trial == 3) memcpy(text + 100, "<|endoftext|>", 13);
        size_t count = encode(tok, text, n, 1, ids), k = 0;
        for (size_t i = 0; i < count && k <= n; i++) {
            const char *bytes;
            size_t len = loom_tokenizer_token_bytes(tok, ids[i], &bytes);
            if (k + len > n) break;
            memcpy(back + k, bytes, len);
            k += len;
        }
        exact &= k == n && !memcmp(back, text, n);
    }
    CHECK(exact, "decode(encode(x)) == x on random bytes and text");
    free(text), free(back), free(ids);
    loom_tokenizer_free(tok);
}

static void expect_refused(const char *spec, const char *needle1, const char *needle2,
                           const char *what) {
    loom_tokenizer *tok = NULL;
    loom_status st = loom_tokenizer_open(&tok, spec);
    CHECK(st == LOOM_ERR_INPUT && error_mentions(needle1) && error_mentions(needle2),
          "%s is refused naming \"%s\" and \"%s\": status %d, %s", what, needle1, needle2, st,
          loom_last_error());
    loom_tokenizer_free(tok);
}

static void test_bad_files(void) {
    char path[1200];
    const char *dir = tmp_path("bad_json");
    write_tiny(dir, hello_merges, HELLO_COUNT, -1, 0);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    check_write_text(path, "{\"a\": 1,\n\"b\": 2,\n\"c\" 3}\n");
    expect_refused(dir, "vocab.json:3:", "malformed JSON", "malformed vocab.json");

    dir = tmp_path("bad_merge");
    write_tiny(dir, hello_merges, HELLO_COUNT, -1, 0);
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    check_write_text(path, "#version: 0.2\nl l\nzz q\n");
    expect_refused(dir, "merges.txt:3:", "\"zz\" is not in the vocabulary", "an unknown symbol");
    check_write_text(path, "#version: 0.2\nl l\nh e x\n");
    expect_refused(dir, "merges.txt:3:", "two symbols", "a line of three symbols");
    check_write_text(path, "#version: 0.2\nh l\n");
    expect_refused(dir, "merges.txt:2:", "lacks", "a merge whose result is not in the vocabulary");

    dir = tmp_path("bad_cover");
    write_tiny(dir, hello_merges, HELLO_COUNT, 'q', 0);
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    expect_refused(path, "vocab.json", "does not cover the 256 bytes: byte 0x71",
                   "a vocabulary without byte q");

    dir = tmp_path("bad_tokjson");
    write_tiny(dir, hello_merges, HELLO_COUNT, -1, 1);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    check_write_text(path,
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}}");
    expect_refused(path, "tokenizer.json", "does not cover", "tokenizer.json without the bytes");
    check_write_text(path,
                     "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}");
    expect_refused(path, "model.vocab key \"a\"", "integer", "a non-integer id");

    expect_refused(tmp_path("missing"), "missing", "cannot open", "a missing tokenizer");
    dir = tmp_path("empty_dir");
    snprintf(path, sizeof path, "mkdir -p '%s'", dir);
    if (system(path) != 0) exit(1);
    expect_refused(dir, "empty_dir", "expected a tokenizer", "a folder without tokenizer files");
}

static void write_le32(unsigned char *p, int32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)((uint32_t)v >> (8 * i));
}

static void test_llmc_tokenizer(void) {
    const char *path = tmp_path("gpt2_tokenizer.bin");
    unsigned char buf[1024 + 300 * 3] = {0};
    write_le32(buf, 20240328), write_le32(buf + 4, 2), write_le32(buf + 8, 258);
    write_le32(buf + 12, 257);
    size_t at = 1024;
    for (int b = 0; b < 256; b++) buf[at++] = 1, buf[at++] = (unsigned char)b;
    buf[at++] = 2, buf[at++] = 'h', buf[at++] = 'i';
    buf[at++] = 1, buf[at++] = '!';
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, at, f);
    fclose(f);
    loom_tokenizer *tok = NULL;
    loom_status st = loom_tokenizer_open(&tok, path);
    CHECK(st == LOOM_OK, "llm.c tokenizer opens: %s", loom_last_error());
    if (st == LOOM_OK) {
        const char *bytes;
        size_t len = loom_tokenizer_token_bytes(tok, 256, &bytes);
        CHECK(len == 2 && !memcmp(bytes, "hi", 2), "token 256 is \"hi\"");
        CHECK(loom_tokenizer_eot(tok) == 257, "eot from the v2 header");
        loom_token_encoder *enc = NULL;
        st = loom_token_encoder_create(&enc, tok);
        CHECK(st == LOOM_ERR_INPUT && error_mentions("decodes only"), "encoding is refused: %s",
              loom_last_error());
        loom_token_encoder_free(enc);
    }
    loom_tokenizer_free(tok);
    f = fopen(path, "wb");
    fwrite(buf, 1, at - 3, f);
    fclose(f);
    expect_refused(path, "gpt2_tokenizer.bin: token 256", "expected a length", "a truncated file");
}

static uint32_t *read_shard(const char *path, size_t *count) {
    uint32_t *tokens = NULL;
    *count = 0;
    return loom_shard_read(path, &tokens, count) == LOOM_OK ? tokens : NULL;
}

/* got[0..n) == want[0..n), a shard's ids against 16-bit ones. */
static int ids_match(const uint32_t *got, const uint16_t *want, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) return 0;
    }
    return 1;
}

/* prepare with a GPT-2 tokenizer: EOT before each document, the tokens of the whole file (the
 * chunks it is cut into for the threads change nothing), the same shards on 1 and 3 threads. */
static void test_prepare(void) {
    loom_tokenizer *tok = NULL;
    if (loom_tokenizer_open(&tok, tmp_path("hello")) != LOOM_OK) {
        CHECK(0, "tiny tokenizer opens: %s", loom_last_error());
        return;
    }
    size_t n = (size_t)3 << 20; /* three chunks */
    char *text = malloc(n);
    loom_rng rng;
    loom_rng_seed(&rng, 9);
    for (size_t i = 0; i < n; i++) text[i] = "hello abc\n\n  'sx\t"[loom_rng_next(&rng) % 17];
    char path[1200];
    snprintf(path, sizeof path, "%s", tmp_path("doc.txt"));
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, n, f);
    fclose(f);
    uint16_t *whole = malloc(n * sizeof *whole);
    size_t whole_n = encode(tok, text, n, 0, whole);
    const char *paths[] = {path, path};
    uint32_t *train[2] = {NULL, NULL};
    size_t train_n[2] = {0, 0};
    for (int run = 0; run < 2; run++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s", tmp_path(run ? "prep3" : "prep1"));
        loom_prepare_opts opts = loom_prepare_default_opts();
        opts.tokenizer = tok, opts.threads = run ? 3 : 1, opts.val_fraction = 0.1;
        CHECK(loom_prepare_text(paths, 2, dir, &opts) == LOOM_OK, "prepare: %s", loom_last_error());
        char shard[1300];
        snprintf(shard, sizeof shard, "%s/train_000000.bin", dir);
        train[run] = read_shard(shard, &train_n[run]);
    }
    size_t val = (size_t)(0.1 * (double)whole_n + 0.5), part = whole_n - val;
    int layout = train[0] && train_n[0] == 2 * (part + 1) && train[0][0] == 264 &&
                 train[0][part + 1] == 264 && ids_match(train[0] + 1, whole, part) &&
                 ids_match(train[0] + part + 2, whole, part);
    CHECK(layout, "train = (EOT + the file's first %zu tokens) x 2, got %zu tokens", part,
          train_n[0]);
    CHECK(train[1] && train_n[0] == train_n[1] &&
              !memcmp(train[0], train[1], train_n[0] * sizeof *train[0]),
          "1 and 3 threads write the same shard");
    free(train[0]), free(train[1]), free(whole), free(text);
    loom_tokenizer_free(tok);
}

/* Llama 3's pattern, (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+, by hand: the first alternative that
 * matches at a place wins, each quantifier as long as the rest still matches. */
static void test_pieces_llama3(void) {
    static const char *const cases[][2] = {
        {"1234567", "123|456|7"},               /* \p{N}{1,3} */
        {"x 1234 ab12c", "x| |123|4| ab|12|c"}, /* a space before digits is its own \s+ */
        {"I'M", "I|'M"},                        /* the contractions ignore case */
        {"it's IT'S they're WE'LL I'D", "it|'s| IT|'S| they|'re| WE|'LL| I|'D"},
        {"x'\305\277a", "x|'\305\277|a"},   /* U+017F (long s) folds to s */
        {"'sup 'hello", "'s|up| '|hello"},  /* " ?[^\s\p{L}\p{N}]+" takes " '" */
        {"(hello $x", "(hello| $|x"},       /* one non-letter joins the letters after it */
        {" (hello", " (|hello"},            /* two do not: a space and others, then letters */
        {"\thello \nhi", "\thello| \n|hi"}, /* a tab joins letters, a newline does not */
        {" \n\n", " \n\n"},                 /* \s*[\r\n]+ to the last newline */
        {" \n\n x", " \n\n| x"},
        {"\r\n\r\n  x", "\r\n\r\n| | x"}, /* then \s+(?!\S) leaves one space to the word */
        {"hello!!!\n", "hello|!!!\n"},    /* others, then their newlines */
        {"hello!!!\n\nworld", "hello|!!!\n\n|world"},
        {".. \nx", "..| \n|x"},   /* [\r\n]* takes no space */
        {"a  \t b", "a|  \t| b"}, /* \s+(?!\S): the run less its last space */
        {"a1b .5", "a|1|b| .|5"}, /* a digit does not join letters */
        {"\xc2\xb9\xc2\xb2\xc2\xb3\xe2\x81\xb4",
         "\xc2\xb9\xc2\xb2\xc2\xb3|\xe2\x81\xb4"},      /* \p{N}: No too */
        {"x\xc2\xa0\xc2\xa0y", "x|\xc2\xa0|\xc2\xa0y"}, /* NBSP is \s and joins letters */
        {"!\xc2\x85", "!|\xc2\x85"},              /* NEL is White_Space (not JavaScript's \s) */
        {"!\xef\xbb\xbf", "!\xef\xbb\xbf"},       /* U+FEFF is not (it is JavaScript's) */
        {"\377\376ab \377", "\377\376|ab| \377"}, /* an invalid byte is "other" */
        {"\377ab", "\377ab"},
        {"x  ", "x|  "}, /* at the end, \s+(?!\S) takes the whole run */
    };
    char got[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pieces_of(cases[i][0], got, 1);
        CHECK(!strcmp(got, cases[i][1]), "Llama 3 pieces of \"%s\": got \"%s\", want \"%s\"",
              cases[i][0], got, cases[i][1]);
    }
}

/* Llama 3's pattern as its tokenizer.json holds it. */
#define LLAMA3_REGEX                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* A tiny tokenizer.json as Llama 3's is made: the 256 bytes (byte b = id b), merges "3 4" (256),
 * "1 2" (257), "12 3" (258), "hello" = 300 (no merge makes it), <|begin_of_text|> = 128000 and
 * <|end_of_text|> = 128001 special, ignore_merges, Llama 3's pre_tokenizer and decoder. */
static json_t *llama3_json(void) {
    json_t *vocab = json_object(), *merges = json_array();
    char sym[1024], sym2[1024];
    for (int b = 0; b < 256; b++) {
        char byte = (char)b;
        symbols_of(&byte, 1, sym);
        json_object_set_new(vocab, sym, json_integer(b));
    }
    static const char *const pairs[][2] = {{"3", "4"}, {"1", "2"}, {"12", "3"}};
    for (int i = 0; i < 3; i++) {
        char joined[16];
        snprintf(joined, sizeof joined, "%s%s", pairs[i][0], pairs[i][1]);
        json_object_set_new(vocab, joined, json_integer(256 + i));
        symbols_of(pairs[i][0], strlen(pairs[i][0]), sym);
        symbols_of(pairs[i][1], strlen(pairs[i][1]), sym2);
        json_array_append_new(merges, json_pack("s+++", sym, " ", sym2, ""));
    }
    json_object_set_new(vocab, "hello", json_integer(300));
    return json_pack("{s:[{s:i,s:s,s:b},{s:i,s:s,s:b}],s:n,"
                     "s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]},s:{s:s,s:b},"
                     "s:{s:s,s:n,s:b,s:o,s:o}}",
                     "added_tokens", "id", 128000, "content", "<|begin_of_text|>", "special", 1,
                     "id", 128001, "content", "<|end_of_text|>", "special", 1, "normalizer",
                     "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split",
                     "pattern", "Regex", LLAMA3_REGEX, "behavior", "Isolated", "invert", 0, "type",
                     "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
                     "decoder", "type", "ByteLevel", "use_regex", 1, "model", "type", "BPE",
                     "dropout", "ignore_merges", 1, "vocab", vocab, "merges", merges);
}

/* Writes root with root[key] (model[key] for "model.KEY") set to the JSON text value. */
static const char *write_variant(const char *name, const json_t *base, const char *key,
                                 const char *value) {
    json_t *root = json_deep_copy(base);
    if (key) {
        json_t *holder = root;
        if (!strncmp(key, "model.", 6)) holder = json_object_get(root, "model"), key += 6;
        json_object_set_new(holder, key, json_loads(value, JSON_DECODE_ANY, NULL));
    }
    const char *dir = tmp_path(name);
    char path[1200];
    snprintf(path, sizeof path, "mkdir -p '%s'", dir);
    if (system(path) != 0) exit(1);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_dump_file(root, path, 0);
    json_decref(root);
    return dir;
}

static size_t encode_wide(const loom_tokenizer *tok, const char *text, int special, uint32_t *out) {
    loom_token_encoder *enc;
    size_t count = 0;
    if (loom_token_encoder_create(&enc, tok) != LOOM_OK) return 0;
    if (loom_token_encoder_run_wide(enc, text, strlen(text), special, out, &count) != LOOM_OK)
        count = 0;
    loom_token_encoder_free(enc);
    return count;
}

static int wide_equal(const uint32_t *got, size_t n, const uint32_t *want, size_t m) {
    return n == m && !memcmp(got, want, n * sizeof *got);
}

static void test_llama3_json(void) {
    json_t *base = llama3_json();
    loom_tokenizer *tok = NULL;
    loom_status st = loom_tokenizer_open(&tok, write_variant("llama3", base, NULL, NULL));
    CHECK(st == LOOM_OK, "a Llama 3 tokenizer.json opens: %s", loom_last_error());
    if (st != LOOM_OK) {
        json_decref(base);
        return;
    }
    CHECK(loom_tokenizer_vocab_size(tok) == 128002 && loom_tokenizer_eot(tok) == 128001,
          "vocab %d (128002), eot %d (<|end_of_text|> = 128001)", loom_tokenizer_vocab_size(tok),
          loom_tokenizer_eot(tok));
    /* pieces <|begin_of_text|> hello " " 123 4 <|end_of_text|> x: hello is a token (ignore_merges),
     * 123 merges 1+2 then 12+3 (3+4, rank 0, is in another piece) */
    const char *text = "<|begin_of_text|>hello 1234<|end_of_text|>x";
    uint32_t ids[64];
    size_t n = encode_wide(tok, text, 1, ids);
    CHECK(wide_equal(ids, n, (const uint32_t[]){128000, 300, ' ', 258, '4', 128001, 'x'}, 7),
          "Llama 3's pieces, ignore_merges and specials: %zu ids", n);
    n = encode_wide(tok, "<|end_of_text|>", 0, ids);
    CHECK(n > 1, "without special, <|end_of_text|> is text (%zu ids)", n);
    const char *bytes;
    size_t len = loom_tokenizer_token_bytes(tok, 128000, &bytes);
    CHECK(len == 17 && !memcmp(bytes, "<|begin_of_text|>", 17), "128000 decodes to its text");
    uint16_t narrow[64];
    loom_token_encoder *enc = NULL;
    size_t count = 0;
    st = loom_token_encoder_create(&enc, tok);
    if (st == LOOM_OK) st = loom_token_encoder_run(enc, "hi", 2, 1, narrow, &count);
    CHECK(st == LOOM_ERR_INPUT && error_mentions("128002 ids") && error_mentions("16-bit"),
          "16-bit encoding refuses 128002 ids: %s", loom_last_error());
    loom_token_encoder_free(enc);
    char doc[1200], out[1200];
    snprintf(doc, sizeof doc, "%s", tmp_path("llama3_doc.txt"));
    check_write_text(doc, "hello 1234\n");
    snprintf(out, sizeof out, "%s", tmp_path("llama3_prep"));
    loom_prepare_opts opts = loom_prepare_default_opts();
    opts.tokenizer = tok, opts.val_fraction = 0;
    const char *docs[] = {doc};
    st = loom_prepare_text(docs, 1, out, &opts);
    CHECK(st == LOOM_OK, "prepare takes the 128002-id tokenizer: %s", loom_last_error());
    /* the shard, parsed here: llm.c's Llama 3 header, then <|begin_of_text|> (the document's
     * start, as Llama 3's tokenizer and llm.c's Llama 3 shards put it) and the text's ids as
     * uint32 */
    uint32_t want[64] = {128000};
    size_t want_n = 1 + encode_wide(tok, "hello 1234\n", 0, want + 1);
    char shard[1300];
    snprintf(shard, sizeof shard, "%s/train_000000.bin", out);
    unsigned char raw[1024 + 4 * 64] = {0};
    FILE *f = fopen(shard, "rb");
    size_t got = f ? fread(raw, 1, sizeof raw, f) : 0;
    if (f) fclose(f);
    uint32_t word[3 + 64];
    for (size_t i = 0; i < 3 + 64; i++) {
        size_t at = i < 3 ? 4 * i : 1024 + 4 * (i - 3);
        word[i] = (uint32_t)raw[at] | (uint32_t)raw[at + 1] << 8 | (uint32_t)raw[at + 2] << 16 |
                  (uint32_t)raw[at + 3] << 24;
    }
    CHECK(want_n > 2 && got == 1024 + 4 * want_n && word[0] == 20240801 && word[1] == 7 &&
              word[2] == want_n && !memcmp(word + 3, want, want_n * sizeof *want),
          "a uint32 shard (magic 20240801, version 7) of BOS + the ids: %zu bytes, header %u %u %u",
          got, (unsigned)word[0], (unsigned)word[1], (unsigned)word[2]);
    loom_tokenizer_free(tok);

    /* GPT-2's ByteLevel pre-tokenizer, said explicitly, and no ignore_merges: " 1234" is one
     * piece (3+4 first, then 1+2), hello is merged from bytes (no merge makes it) */
    json_t *gpt2 = json_deep_copy(base);
    json_object_set_new(json_object_get(gpt2, "model"), "ignore_merges", json_false());
    tok = NULL;
    st = loom_tokenizer_open(&tok,
                             write_variant("gpt2_bytelevel", gpt2, "pre_tokenizer",
                                           "{\"type\": \"ByteLevel\", \"add_prefix_space\": "
                                           "false, \"trim_offsets\": true, \"use_regex\": true}"));
    CHECK(st == LOOM_OK, "GPT-2's ByteLevel pre_tokenizer opens: %s", loom_last_error());
    if (st == LOOM_OK) {
        n = encode_wide(tok, text, 1, ids);
        CHECK(wide_equal(
                  ids, n,
                  (const uint32_t[]){128000, 'h', 'e', 'l', 'l', 'o', ' ', 257, 256, 128001, 'x'},
                  11),
              "GPT-2's pieces with the same files: %zu ids", n);
    }
    loom_tokenizer_free(tok);
    json_decref(gpt2);

    /* what is not Llama 3's or GPT-2's is refused naming the file and the field */
    static const char *const refused[][4] = {
        {"normalizer", "{\"type\": \"NFC\"}", "normalizer: a \"NFC\" normalizer", "expected null"},
        {"pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\"}",
         "pre_tokenizer: a \"Metaspace\" pre-tokenizer is not supported", "Llama 3's Sequence"},
        {"pre_tokenizer", "null", "pre_tokenizer: null", "GPT-2's ByteLevel"},
        {"pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, {\"type\": "
         "\"ByteLevel\"}]}",
         "pre_tokenizer.pretokenizers: expected [Split, ByteLevel]", "got [Digits, ByteLevel]"},
        {"pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"\\\\p{N}+\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", "
         "\"use_regex\": false}]}",
         "pretokenizers[0].pattern: expected {\"Regex\": Llama 3's pattern}", "\\p{N}+"},
        {"pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}",
         "pre_tokenizer.add_prefix_space: expected false", "GPT-2's ByteLevel"},
        {"pre_tokenizer", "{\"type\": \"ByteLevel\", \"use_regex\": false}",
         "pre_tokenizer.use_regex: expected true", "Llama 3's"},
        {"decoder", "{\"type\": \"Metaspace\"}", "decoder: a \"Metaspace\" decoder", "ByteLevel"},
        {"model.end_of_word_suffix", "\"</w>\"", "model.end_of_word_suffix", "expected null"},
        {"model.ignore_merges", "\"yes\"", "model.ignore_merges", "boolean"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char name[32], path[1200];
        snprintf(name, sizeof name, "llama3_bad%zu", i);
        snprintf(path, sizeof path, "%s/tokenizer.json",
                 write_variant(name, base, refused[i][0], refused[i][1]));
        char what[128];
        snprintf(what, sizeof what, "tokenizer.json with %s = %.60s", refused[i][0], refused[i][1]);
        expect_refused(path, path, refused[i][2], what);
        CHECK(error_mentions(refused[i][3]), "%s: the message also says \"%s\": %s", what,
              refused[i][3], loom_last_error());
    }
    json_t *split =
        json_array_get(json_object_get(json_object_get(base, "pre_tokenizer"), "pretokenizers"), 0);
    json_object_set_new(split, "behavior", json_string("Removed"));
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json",
             write_variant("llama3_removed", base, NULL, NULL));
    expect_refused(path, "pretokenizers[0].behavior: expected \"Isolated\"", "Removed",
                   "a Split that removes its matches");
    json_decref(base);
}

int main(void) {
    tmp = check_tmpdir();
    test_byte_table();
    test_pieces();
    test_pieces_llama3();
    test_hand_worked();
    test_fast_equals_reference();
    test_round_trip();
    test_bad_files();
    test_llmc_tokenizer();
    test_prepare();
    test_llama3_json();
    return check_finish();
}
