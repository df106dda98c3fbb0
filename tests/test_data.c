/*
 * test_data.c — the data module: byte tokenizer, llm.c shards of uint16 and of uint32 tokens
 * (against an independent byte-level parse), rejection of malformed shards, datasets from globs
 * (uint32 ones across a file boundary, a mix of widths refused), the loader's order and resume,
 * and `prepare`'s train/val split.
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/data.h"

#include "check.h"

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

static const char *tmp;

static const char *tmp_path(const char *name) {
    static char paths[64][1024]; /* a ring: results stay valid for 64 calls */
    static int next;
    char *p = paths[next++ % 64];
    snprintf(p, sizeof paths[0], "%s/%s", tmp, name);
    return p;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int error_mentions(const char *text) {
    return strstr(loom_last_error(), text) != NULL;
}

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

/* Reads a whole file with plain stdio: the test's own view of the bytes. */
static unsigned char *read_raw(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size + 1);
    *n = fread(buf, 1, (size_t)size, f);
    fclose(f);
    return buf;
}

static int32_t le_i32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

static void put_le_i32(unsigned char *p, int32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)((uint32_t)v >> (8 * i));
}

/* A hand-made shard: header (magic, version, count) and `body_tokens` tokens of value 7, each
 * `width` bytes. */
static void write_crafted(const char *path, int32_t magic, int32_t version, int32_t count,
                          size_t body_tokens, size_t extra_bytes, size_t width) {
    size_t n = 1024 + width * body_tokens + extra_bytes;
    unsigned char *buf = calloc(n, 1);
    put_le_i32(buf, magic);
    put_le_i32(buf + 4, version);
    put_le_i32(buf + 8, count);
    for (size_t i = 0; i < body_tokens; i++) buf[1024 + width * i] = 7;
    write_raw(path, buf, n);
    free(buf);
}

static void write_crafted_shard(const char *path, int32_t magic, int32_t version, int32_t count,
                                size_t body_tokens, size_t extra_bytes) {
    write_crafted(path, magic, version, count, body_tokens, extra_bytes, 2);
}

/* A shard of uint32 tokens written by the test itself: magic 20240801, version 7, count, then
 * each token as 4 little-endian bytes. */
static void write_wide_by_hand(const char *path, const uint32_t *tokens, size_t count) {
    size_t n = 1024 + 4 * count;
    unsigned char *buf = calloc(n, 1);
    put_le_i32(buf, 20240801);
    put_le_i32(buf + 4, 7);
    put_le_i32(buf + 8, (int32_t)count);
    for (size_t i = 0; i < count; i++) {
        for (int b = 0; b < 4; b++) buf[1024 + 4 * i + b] = (unsigned char)(tokens[i] >> (8 * b));
    }
    write_raw(path, buf, n);
    free(buf);
}

/* ---- tokenizer --------------------------------------------------------------------------- */

static void test_tokenizer(void) {
    char text[256];
    for (int i = 0; i < 256; i++) text[i] = (char)i;
    uint16_t tokens[258];
    CHECK(loom_bytes_encode(text, 256, tokens) == 256, "encode count");
    int ok = 1;
    for (int i = 0; i < 256; i++) ok &= tokens[i] == i;
    CHECK(ok, "every byte value is its own token");
    tokens[256] = LOOM_BYTE_EOT;
    tokens[257] = 300;
    char out[300];
    memset(out, 'x', sizeof out);
    size_t n = loom_bytes_decode(tokens, 258, out, sizeof out);
    CHECK(n == 258, "decoded %zu bytes", n);
    CHECK(memcmp(out, text, 256) == 0, "all 256 byte values round trip");
    CHECK(out[256] == '\n' && out[257] == '?' && out[258] == '\0', "EOT -> newline, 300 -> ?");

    const char *doc = "hello";
    uint16_t doc_tokens[6];
    loom_bytes_encode(doc, 5, doc_tokens);
    doc_tokens[5] = LOOM_BYTE_EOT;
    char small[5];
    n = loom_bytes_decode(doc_tokens, 6, small, sizeof small);
    CHECK(n == 4 && strcmp(small, "hell") == 0, "decode truncates to cap-1: %zu '%s'", n, small);
    n = loom_bytes_decode(doc_tokens, 6, out, sizeof out);
    CHECK(n == 6 && strcmp(out, "hello\n") == 0, "document + EOT decodes to '%s'", out);
    CHECK(loom_bytes_decode(doc_tokens, 6, out, 0) == 0, "cap 0 writes nothing");
}

/* ---- shards ------------------------------------------------------------------------------ */

static void test_shard_round_trip(void) {
    enum { N = 1000 };
    uint16_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (uint16_t)(i * 2654435761u >> 7);
    tokens[0] = 0;
    tokens[1] = 255;
    tokens[2] = 256;
    tokens[3] = 65535;
    const char *path = tmp_path("round.bin");
    CHECK(loom_shard_write(path, tokens, N) == LOOM_OK, "write: %s", loom_last_error());

    size_t size;
    unsigned char *raw = read_raw(path, &size);
    CHECK(raw && size == 1024 + 2 * N, "raw size %zu", size);
    if (raw && size == 1024 + 2 * N) {
        CHECK(le_i32(raw) == 20240520 && le_i32(raw + 4) == 1 && le_i32(raw + 8) == N,
              "header %d %d %d", le_i32(raw), le_i32(raw + 4), le_i32(raw + 8));
        int zero = 1;
        for (int s = 3; s < 256; s++) zero &= le_i32(raw + 4 * s) == 0;
        CHECK(zero, "unused header slots are 0");
        int same = 1;
        for (int i = 0; i < N; i++) {
            same &= (uint16_t)(raw[1024 + 2 * i] | raw[1024 + 2 * i + 1] << 8) == tokens[i];
        }
        CHECK(same, "token bytes are little-endian uint16");
    }
    free(raw);

    uint32_t *back = NULL;
    size_t count = 0;
    CHECK(loom_shard_read(path, &back, &count) == LOOM_OK, "read: %s", loom_last_error());
    int same = count == N && back;
    for (int i = 0; same && i < N; i++) same &= back[i] == tokens[i];
    CHECK(same, "read equals written");
    free(back);
    size_t probed = 0;
    int width = 0;
    CHECK(loom_shard_probe(path, &probed, &width) == LOOM_OK && probed == N && width == 2,
          "probe %zu tokens of %d bytes", probed, width);
    CHECK(loom_shard_probe(path, &probed, NULL) == LOOM_OK && probed == N, "probe without width");

    const char *empty = tmp_path("empty.bin");
    CHECK(loom_shard_write(empty, tokens, 0) == LOOM_OK, "write empty shard");
    back = NULL;
    CHECK(loom_shard_read(empty, &back, &count) == LOOM_OK && count == 0, "empty shard reads");
    free(back);
    CHECK(!file_exists(tmp_path("round.bin.tmp")), "no temporary left");
}

/* uint32 shards: ids past 16 bits, the header llm.c's Llama 3 shards have, read back either way
 * (a shard loom wrote, and one the test wrote by hand). */
static void test_wide_shard_round_trip(void) {
    enum { N = 1000 };
    uint32_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (uint32_t)i * 2654435761u % 128256u;
    const uint32_t edges[8] = {0, 65535, 65536, 65537, 128000, 128255, 0x7fffffffu, 0xffffffffu};
    memcpy(tokens, edges, sizeof edges);
    const char *path = tmp_path("wide.bin");
    CHECK(loom_shard_write_wide(path, tokens, N) == LOOM_OK, "write wide: %s", loom_last_error());

    size_t size;
    unsigned char *raw = read_raw(path, &size);
    CHECK(raw && size == 1024 + 4 * N, "raw size %zu, expected 1024 + 4 * %d", size, N);
    if (raw && size == 1024 + 4 * N) {
        CHECK(le_i32(raw) == 20240801 && le_i32(raw + 4) == 7 && le_i32(raw + 8) == N,
              "header %d %d %d", le_i32(raw), le_i32(raw + 4), le_i32(raw + 8));
        int zero = 1;
        for (int s = 3; s < 256; s++) zero &= le_i32(raw + 4 * s) == 0;
        CHECK(zero, "unused header slots are 0");
        int same = 1;
        for (int i = 0; i < N; i++) same &= (uint32_t)le_i32(raw + 1024 + 4 * i) == tokens[i];
        CHECK(same, "token bytes are little-endian uint32");
    }
    free(raw);

    uint32_t *back = NULL;
    size_t count = 0;
    CHECK(loom_shard_read(path, &back, &count) == LOOM_OK, "read wide: %s", loom_last_error());
    CHECK(count == N && back && memcmp(back, tokens, sizeof tokens) == 0,
          "read equals written, ids past 65535 included");
    free(back);
    size_t probed = 0;
    int width = 0;
    CHECK(loom_shard_probe(path, &probed, &width) == LOOM_OK && probed == N && width == 4,
          "probe %zu tokens of %d bytes", probed, width);

    const char *by_hand = tmp_path("wide_by_hand.bin");
    write_wide_by_hand(by_hand, tokens, 40);
    back = NULL;
    CHECK(loom_shard_read(by_hand, &back, &count) == LOOM_OK && count == 40 && back &&
              memcmp(back, tokens, 40 * sizeof *tokens) == 0,
          "a shard written by hand reads: %s", loom_last_error());
    free(back);

    const char *empty = tmp_path("wide_empty.bin");
    CHECK(loom_shard_write_wide(empty, tokens, 0) == LOOM_OK, "write empty wide shard");
    back = NULL;
    CHECK(loom_shard_read(empty, &back, &count) == LOOM_OK && count == 0, "empty wide shard reads");
    CHECK(loom_shard_probe(empty, &probed, &width) == LOOM_OK && probed == 0 && width == 4,
          "an empty shard has its header's width");
    free(back);

    CHECK(loom_shard_token_width(257) == 2 && loom_shard_token_width(50257) == 2 &&
              loom_shard_token_width(65536) == 2 && loom_shard_token_width(65537) == 4 &&
              loom_shard_token_width(128256) == 4,
          "uint16 up to 65536 ids, uint32 past them");
}

static void expect_bad_shard(const char *name, const char *needle1, const char *needle2) {
    const char *path = tmp_path(name);
    uint32_t *tokens = (uint32_t *)1;
    size_t count = 99;
    loom_clear_error();
    loom_status st = loom_shard_read(path, &tokens, &count);
    CHECK(st == LOOM_ERR_INPUT, "%s: status %d", name, (int)st);
    CHECK(tokens == NULL && count == 0, "%s: outputs cleared", name);
    CHECK(error_mentions(path), "%s: message names the file: %s", name, loom_last_error());
    if (needle1)
        CHECK(error_mentions(needle1), "%s: '%s' in: %s", name, needle1, loom_last_error());
    if (needle2)
        CHECK(error_mentions(needle2), "%s: '%s' in: %s", name, needle2, loom_last_error());
    size_t probed;
    CHECK(loom_shard_probe(path, &probed, NULL) == LOOM_ERR_INPUT, "%s: probe rejects too", name);
}

static void test_bad_shards(void) {
    write_crafted_shard(tmp_path("magic.bin"), 20240326, 1, 3, 3, 0);
    expect_bad_shard("magic.bin", "20240520", "20240326");
    expect_bad_shard("magic.bin", "or 20240801", NULL); /* both accepted magics listed */
    write_crafted_shard(tmp_path("version.bin"), 20240520, 2, 3, 3, 0);
    expect_bad_shard("version.bin", "version", "got 2");
    write_crafted_shard(tmp_path("truncated.bin"), 20240520, 1, 5, 3, 0);
    expect_bad_shard("truncated.bin", "1030", "1034"); /* both sizes */
    write_crafted_shard(tmp_path("trailing.bin"), 20240520, 1, 3, 3, 1);
    expect_bad_shard("trailing.bin", "1031", "1030");
    /* A count that would need 4 GiB in a 1028-byte file: rejected from the size, before any
     * allocation (under ASan a 4 GiB malloc would be reported as an allocation-size failure). */
    write_crafted_shard(tmp_path("huge.bin"), 20240520, 1, INT32_MAX, 2, 0);
    expect_bad_shard("huge.bin", "1028", "4294968318");
    write_crafted_shard(tmp_path("negative.bin"), 20240520, 1, -4, 0, 0);
    expect_bad_shard("negative.bin", "-4", NULL);
    unsigned char short_file[100] = {0};
    put_le_i32(short_file, 20240520);
    write_raw(tmp_path("short.bin"), short_file, sizeof short_file);
    expect_bad_shard("short.bin", "100", "1024");
    write_raw(tmp_path("zero.bin"), short_file, 0);
    expect_bad_shard("zero.bin", "0 bytes", NULL);
    expect_bad_shard("missing.bin", "cannot open", NULL);

    uint16_t t[3] = {1, 2, 3};
    CHECK(loom_shard_write(tmp_path("no_such_dir/x.bin"), t, 3) == LOOM_ERR_IO,
          "write into a missing directory fails");

    /* uint32 shards: each magic with its own version, and sizes at 4 bytes a token. */
    write_crafted(tmp_path("wide_v1.bin"), 20240801, 1, 3, 3, 0, 4);
    expect_bad_shard("wide_v1.bin", "expected 7, got 1", "magic 20240801");
    write_crafted(tmp_path("narrow_v7.bin"), 20240520, 7, 3, 3, 0, 2);
    expect_bad_shard("narrow_v7.bin", "expected 1, got 7", "magic 20240520");
    write_crafted(tmp_path("wide_truncated.bin"), 20240801, 7, 5, 3, 0, 4);
    expect_bad_shard("wide_truncated.bin", "1036 bytes", "1044"); /* both sizes */
    write_crafted(tmp_path("wide_trailing.bin"), 20240801, 7, 3, 3, 2, 4);
    expect_bad_shard("wide_trailing.bin", "1038 bytes", "1036");
    /* uint16 tokens under the uint32 magic: half the bytes the count needs */
    write_crafted(tmp_path("wide_as_narrow.bin"), 20240801, 7, 3, 3, 0, 2);
    expect_bad_shard("wide_as_narrow.bin", "1030 bytes", "4 bytes per token");
    write_crafted(tmp_path("wide_huge.bin"), 20240801, 7, INT32_MAX, 2, 0, 4);
    expect_bad_shard("wide_huge.bin", "1032", "8589935612");
    uint32_t w[2] = {1, 70000};
    CHECK(loom_shard_write_wide(tmp_path("no_such_dir/w.bin"), w, 2) == LOOM_ERR_IO,
          "wide write into a missing directory fails");
}

/* ---- datasets ---------------------------------------------------------------------------- */

/* All of a dataset's tokens, copied out with loom_dataset_read (free() it; NULL on failure). */
static uint32_t *dataset_tokens(const loom_dataset *ds) {
    size_t n = loom_dataset_num_tokens(ds);
    uint32_t *tokens = malloc((n + 1) * sizeof *tokens);
    if (tokens && loom_dataset_read(ds, 0, n, tokens) != LOOM_OK) {
        fprintf(stderr, "read %s: %s\n", loom_dataset_pattern(ds), loom_last_error());
        free(tokens);
        return NULL;
    }
    return tokens;
}

static int dataset_holds(const loom_dataset *ds, const uint32_t *expect, size_t n) {
    uint32_t *tokens = dataset_tokens(ds);
    int same = tokens && loom_dataset_num_tokens(ds) == n &&
               memcmp(tokens, expect, n * sizeof *expect) == 0;
    free(tokens);
    return same;
}

static void write_shard_values(const char *name, uint16_t first, size_t count) {
    uint16_t *tokens = malloc(count * sizeof *tokens);
    for (size_t i = 0; i < count; i++) tokens[i] = (uint16_t)(first + i);
    if (loom_shard_write(tmp_path(name), tokens, count) != LOOM_OK) {
        fprintf(stderr, "setup: %s\n", loom_last_error());
        exit(1);
    }
    free(tokens);
}

static void test_dataset(void) {
    /* Written out of order; s_00 holds 100.., s_01 200.., s_02 300.. */
    write_shard_values("s_02.bin", 300, 5);
    write_shard_values("s_00.bin", 100, 3);
    write_shard_values("s_01.bin", 200, 4);
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/s_*.bin", tmp);
    loom_dataset *ds = NULL;
    CHECK(loom_dataset_open(&ds, pattern, 1000) == LOOM_OK, "open: %s", loom_last_error());
    if (ds) {
        const uint32_t expect[12] = {100, 101, 102, 200, 201, 202, 203, 300, 301, 302, 303, 304};
        CHECK(loom_dataset_num_tokens(ds) == 12, "token count %zu", loom_dataset_num_tokens(ds));
        CHECK(dataset_holds(ds, expect, 12), "shards concatenated in name order");
        CHECK(loom_dataset_num_files(ds) == 3 && strstr(loom_dataset_file(ds, 0), "s_00.bin") &&
                  strstr(loom_dataset_file(ds, 2), "s_02.bin"),
              "file list sorted");
        CHECK(strcmp(loom_dataset_pattern(ds), pattern) == 0, "pattern kept");
        CHECK(loom_dataset_token_width(ds) == 2, "uint16 shards");
        loom_dataset_free(ds);
    }

    /* A list: given in reverse order, with a duplicate, and blanks around items. */
    snprintf(pattern, sizeof pattern, "%s/s_02.bin , %s/s_00.bin,%s/s_0[02].bin", tmp, tmp, tmp);
    ds = NULL;
    CHECK(loom_dataset_open(&ds, pattern, 1000) == LOOM_OK, "open list: %s", loom_last_error());
    if (ds) {
        const uint32_t expect[8] = {100, 101, 102, 300, 301, 302, 303, 304};
        CHECK(dataset_holds(ds, expect, 8), "list sorted, deduplicated, concatenated (%zu tokens)",
              loom_dataset_num_tokens(ds));
        loom_dataset_free(ds);
    }

    snprintf(pattern, sizeof pattern, "%s/s_00.bin,%s/nothing_*.bin", tmp, tmp);
    ds = (loom_dataset *)1;
    CHECK(loom_dataset_open(&ds, pattern, 1000) == LOOM_ERR_INPUT && ds == NULL,
          "unmatched pattern rejected");
    CHECK(error_mentions("nothing_*.bin"), "names the pattern: %s", loom_last_error());
    snprintf(pattern, sizeof pattern, "%s/s_00.bin,,%s/s_01.bin", tmp, tmp);
    CHECK(loom_dataset_open(&ds, pattern, 1000) == LOOM_ERR_INPUT, "empty list item rejected");
    snprintf(pattern, sizeof pattern, "%s/s_00.bin", tmp);
    CHECK(loom_dataset_open(&ds, pattern, 0) == LOOM_ERR_INPUT, "vocab 0 rejected");

    /* Vocabulary check: token 304 is at position 4 of s_02.bin. */
    snprintf(pattern, sizeof pattern, "%s/s_*.bin", tmp);
    CHECK(loom_dataset_open(&ds, pattern, 304) == LOOM_ERR_INPUT, "token >= vocab rejected");
    CHECK(error_mentions("s_02.bin") && error_mentions("position 4") && error_mentions("304"),
          "error names file, position, token: %s", loom_last_error());
    ds = NULL;
    CHECK(loom_dataset_open(&ds, pattern, 305) == LOOM_OK, "largest token = vocab-1 accepted");
    loom_dataset_free(ds);

    /* A bad shard inside the glob fails the dataset, naming it. */
    write_crafted_shard(tmp_path("s_03.bin"), 20240520, 1, 9, 3, 0);
    CHECK(loom_dataset_open(&ds, pattern, 1000) == LOOM_ERR_INPUT && error_mentions("s_03.bin"),
          "bad shard in dataset named: %s", loom_last_error());
    remove(tmp_path("s_03.bin"));
}

/* A dataset of uint32 shards: one written by hand, one by loom; ids past 16 bits read and
 * loaded across the file boundary; the vocabulary check at 32 bits. */
static void test_wide_dataset(void) {
    const uint32_t first[5] = {70000, 70001, 65535, 65536, 128000};
    const uint32_t second[4] = {5, 128255, 128001, 99999};
    write_wide_by_hand(tmp_path("w_00.bin"), first, 5);
    CHECK(loom_shard_write_wide(tmp_path("w_01.bin"), second, 4) == LOOM_OK, "write: %s",
          loom_last_error());
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/w_*.bin", tmp);
    loom_dataset *ds = NULL;
    CHECK(loom_dataset_open(&ds, pattern, 128256) == LOOM_OK, "open: %s", loom_last_error());
    if (ds) {
        const uint32_t all[9] = {70000, 70001, 65535, 65536, 128000, 5, 128255, 128001, 99999};
        CHECK(dataset_holds(ds, all, 9), "both files' ids, in order");
        CHECK(loom_dataset_token_width(ds) == 4, "uint32 shards");
        uint32_t across[4] = {0};
        const uint32_t expect[4] = {65536, 128000, 5, 128255};
        CHECK(loom_dataset_read(ds, 3, 4, across) == LOOM_OK &&
                  memcmp(across, expect, sizeof expect) == 0,
              "a read across the file boundary: %u %u %u %u", across[0], across[1], across[2],
              across[3]);
        /* 9 tokens, seq_len 4: windows [0, 4] and [4, 8]; the second spans both files. */
        loom_loader *ld = NULL;
        CHECK(loom_loader_create(&ld, ds, 4, 0, 1) == LOOM_OK && loom_loader_num_windows(ld) == 2,
              "loader: %s", loom_last_error());
        if (ld) {
            int32_t in[8], tg[8];
            CHECK(loom_loader_next(ld, 2, in, tg) == LOOM_OK, "next: %s", loom_last_error());
            const int32_t want_in[8] = {70000, 70001, 65535, 65536, 128000, 5, 128255, 128001};
            const int32_t want_tg[8] = {70001, 65535, 65536, 128000, 5, 128255, 128001, 99999};
            CHECK(memcmp(in, want_in, sizeof in) == 0 && memcmp(tg, want_tg, sizeof tg) == 0,
                  "int32 inputs and targets hold the ids past 16 bits (in[5] %d, tg[7] %d)",
                  (int)in[5], (int)tg[7]);
        }
        loom_loader_free(ld);
        loom_dataset_free(ds);
    }

    /* 128255 at position 1 of w_01.bin is the first id outside a vocabulary of 128255. */
    ds = (loom_dataset *)1;
    CHECK(loom_dataset_open(&ds, pattern, 128255) == LOOM_ERR_INPUT && ds == NULL,
          "an id >= vocab refused");
    CHECK(error_mentions(tmp_path("w_01.bin")) && error_mentions("position 1 is 128255") &&
              error_mentions("vocab size 128255"),
          "names file, position, id and vocabulary: %s", loom_last_error());
    /* The largest uint32 is no int32 id, whatever the vocabulary. */
    const uint32_t top[3] = {1, 0xffffffffu, 2};
    write_wide_by_hand(tmp_path("top.bin"), top, 3);
    CHECK(loom_dataset_open(&ds, tmp_path("top.bin"), INT32_MAX) == LOOM_ERR_INPUT &&
              error_mentions("position 1 is 4294967295"),
          "id 2^32-1 refused under the largest vocabulary: %s", loom_last_error());
}

/* One dataset, one width: a uint16 shard and a uint32 one under one pattern are refused by
 * open and describe alike, naming the file of the other width and the first file. */
static void test_mixed_widths(void) {
    const uint16_t narrow[3] = {1, 2, 3};
    const uint32_t wide[3] = {4, 5, 6};
    CHECK(loom_shard_write(tmp_path("mix_a_00.bin"), narrow, 3) == LOOM_OK &&
              loom_shard_write_wide(tmp_path("mix_a_01.bin"), wide, 3) == LOOM_OK &&
              loom_shard_write_wide(tmp_path("mix_b_00.bin"), wide, 3) == LOOM_OK &&
              loom_shard_write(tmp_path("mix_b_01.bin"), narrow, 3) == LOOM_OK,
          "write: %s", loom_last_error());
    const char *names[2][3] = {{"mix_a_*.bin", "mix_a_01.bin: uint32 tokens", "mix_a_00.bin"},
                               {"mix_b_*.bin", "mix_b_01.bin: uint16 tokens", "mix_b_00.bin"}};
    const char *first_width[2] = {"has uint16 tokens", "has uint32 tokens"};
    for (int k = 0; k < 2; k++) {
        loom_dataset *ds = (loom_dataset *)1;
        CHECK(loom_dataset_open(&ds, tmp_path(names[k][0]), 1000) == LOOM_ERR_INPUT && ds == NULL,
              "%s: a mix of widths refused", names[k][0]);
        CHECK(error_mentions(names[k][1]) && error_mentions(names[k][2]) &&
                  error_mentions(first_width[k]),
              "%s: names the file, its width and the first file's: %s", names[k][0],
              loom_last_error());
        ds = (loom_dataset *)1;
        CHECK(loom_dataset_describe(&ds, tmp_path(names[k][0])) == LOOM_ERR_INPUT && ds == NULL &&
                  error_mentions(names[k][1]),
              "%s: describe refuses it too: %s", names[k][0], loom_last_error());
    }
    /* each width alone is fine */
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/mix_a_00.bin,%s/mix_b_01.bin", tmp, tmp);
    loom_dataset *ds = NULL;
    CHECK(loom_dataset_open(&ds, pattern, 1000) == LOOM_OK, "two uint16 shards: %s",
          loom_last_error());
    loom_dataset_free(ds);
}

/* ---- loader ------------------------------------------------------------------------------ */

/* A dataset whose token i is i, so a window is identified by its first input / T. */
static loom_dataset *open_counting_dataset(const char *name, size_t count) {
    write_shard_values(name, 0, count);
    loom_dataset *ds = NULL;
    if (loom_dataset_open(&ds, tmp_path(name), 65536) != LOOM_OK) {
        fprintf(stderr, "setup: %s\n", loom_last_error());
        exit(1);
    }
    return ds;
}

enum { T = 4, WINDOWS = 100, BATCH = 7 };

/* Reads `count` windows in batches of BATCH (the last one partial) and records their ids. */
static int read_windows(loom_loader *ld, const loom_dataset *ds, size_t count, size_t *ids) {
    int32_t inputs[BATCH * T], targets[BATCH * T];
    uint32_t *tokens = dataset_tokens(ds);
    if (!tokens) return 0;
    int consistent = 1;
    for (size_t done = 0; done < count;) {
        int b = count - done < BATCH ? (int)(count - done) : BATCH;
        consistent &= loom_loader_next(ld, b, inputs, targets) == LOOM_OK;
        for (int i = 0; i < b; i++) {
            size_t start = (size_t)inputs[i * T];
            ids[done + i] = start / T;
            consistent &= start % T == 0;
            for (int t = 0; t < T; t++) {
                consistent &= (uint32_t)inputs[i * T + t] == tokens[start + t];
                consistent &= (uint32_t)targets[i * T + t] == tokens[start + t + 1];
                if (t + 1 < T) consistent &= targets[i * T + t] == inputs[i * T + t + 1];
            }
        }
        done += (size_t)b;
    }
    free(tokens);
    return consistent;
}

static void test_loader_shuffle(void) {
    loom_dataset *ds = open_counting_dataset("count.bin", WINDOWS * T + 3); /* 100 windows */
    loom_loader *a = NULL, *b = NULL, *c = NULL;
    CHECK(loom_loader_create(&a, ds, T, 1, 42) == LOOM_OK, "create: %s", loom_last_error());
    CHECK(loom_loader_create(&b, ds, T, 1, 42) == LOOM_OK, "create same seed");
    CHECK(loom_loader_create(&c, ds, T, 1, 43) == LOOM_OK, "create other seed");
    if (!a || !b || !c) return;
    CHECK(loom_loader_num_windows(a) == WINDOWS, "windows %zu", loom_loader_num_windows(a));

    size_t ids_a[3 * WINDOWS], ids_b[3 * WINDOWS], ids_c[3 * WINDOWS];
    CHECK(read_windows(a, ds, 3 * WINDOWS, ids_a), "inputs match the dataset, targets shifted");
    read_windows(b, ds, 3 * WINDOWS, ids_b);
    read_windows(c, ds, 3 * WINDOWS, ids_c);
    for (int epoch = 0; epoch < 3; epoch++) {
        int visits[WINDOWS] = {0};
        int in_range = 1;
        for (int i = 0; i < WINDOWS; i++) {
            size_t id = ids_a[epoch * WINDOWS + i];
            if (id < WINDOWS)
                visits[id]++;
            else
                in_range = 0;
        }
        int once = in_range;
        for (int w = 0; w < WINDOWS; w++) once &= visits[w] == 1;
        CHECK(once, "epoch %d visits every window exactly once", epoch);
    }
    int identity = 1;
    for (int i = 0; i < WINDOWS; i++) identity &= ids_a[i] == (size_t)i;
    CHECK(!identity, "shuffle mode does not keep file order");
    CHECK(memcmp(ids_a, ids_a + WINDOWS, WINDOWS * sizeof *ids_a) != 0 &&
              memcmp(ids_a + WINDOWS, ids_a + 2 * WINDOWS, WINDOWS * sizeof *ids_a) != 0,
          "order differs between epochs");
    CHECK(memcmp(ids_a, ids_b, sizeof ids_a) == 0, "equal seeds give identical orders");
    CHECK(memcmp(ids_a, ids_c, WINDOWS * sizeof *ids_a) != 0, "another seed, another order");
    loom_loader_pos pos = loom_loader_get_pos(a);
    CHECK(pos.epoch == 3 && pos.index == 0, "position after 3 epochs (%llu, %llu)",
          (unsigned long long)pos.epoch, (unsigned long long)pos.index);
    loom_loader_free(a);
    loom_loader_free(b);
    loom_loader_free(c);
    loom_dataset_free(ds);
}

static void test_loader_resume(int shuffle) {
    loom_dataset *ds = open_counting_dataset("resume.bin", WINDOWS * T + 1);
    loom_loader *run = NULL, *resumed = NULL, *skipped = NULL;
    loom_loader_create(&run, ds, T, shuffle, 7);
    loom_loader_create(&resumed, ds, T, shuffle, 7);
    loom_loader_create(&skipped, ds, T, shuffle, 7);
    if (!run || !resumed || !skipped) {
        CHECK(0, "create loaders: %s", loom_last_error());
        return;
    }
    size_t before[23], after_run[250], after_resumed[250], after_skipped[250];
    read_windows(run, ds, 23, before);
    loom_loader_pos pos = loom_loader_get_pos(run);
    CHECK(pos.epoch == 0 && pos.index == 23, "position after 23 windows");
    read_windows(run, ds, 250, after_run); /* crosses two epoch boundaries */

    CHECK(loom_loader_set_pos(resumed, pos) == LOOM_OK, "set_pos: %s", loom_last_error());
    read_windows(resumed, ds, 250, after_resumed);
    CHECK(memcmp(after_run, after_resumed, sizeof after_run) == 0,
          "resumed loader continues like the uninterrupted one (shuffle=%d)", shuffle);
    loom_loader_pos end_run = loom_loader_get_pos(run), end_resumed = loom_loader_get_pos(resumed);
    CHECK(end_run.epoch == end_resumed.epoch && end_run.index == end_resumed.index &&
              end_run.epoch == 2 && end_run.index == 73,
          "same final position");

    /* A position in a later epoch, restored on a loader that is still in epoch 0. */
    loom_loader_pos late = {5, 17};
    loom_loader_skip(skipped, 5 * WINDOWS + 17);
    pos = loom_loader_get_pos(skipped);
    CHECK(pos.epoch == 5 && pos.index == 17, "skip advances the position");
    loom_loader *fresh = NULL;
    loom_loader_create(&fresh, ds, T, shuffle, 7);
    CHECK(loom_loader_set_pos(fresh, late) == LOOM_OK, "set_pos to a later epoch");
    read_windows(skipped, ds, 250, after_skipped);
    read_windows(fresh, ds, 250, after_resumed);
    CHECK(memcmp(after_skipped, after_resumed, sizeof after_skipped) == 0,
          "set_pos to epoch 5 equals skipping there");

    loom_loader_pos bad = {0, WINDOWS};
    CHECK(loom_loader_set_pos(fresh, bad) == LOOM_ERR_INPUT, "index >= windows rejected");
    CHECK(error_mentions("100"), "names the window count: %s", loom_last_error());
    loom_loader_free(run);
    loom_loader_free(resumed);
    loom_loader_free(skipped);
    loom_loader_free(fresh);
    loom_dataset_free(ds);
}

static void test_loader_sequential(void) {
    loom_dataset *ds = open_counting_dataset("seq.bin", 10 * T + 2); /* 10 windows */
    loom_loader *ld = NULL;
    CHECK(loom_loader_create(&ld, ds, T, 0, 1) == LOOM_OK, "create sequential");
    if (!ld) return;
    size_t ids[25];
    CHECK(read_windows(ld, ds, 25, ids), "sequential samples consistent");
    int in_order = 1;
    for (int i = 0; i < 25; i++) in_order &= ids[i] == (size_t)(i % 10);
    CHECK(in_order, "sequential mode goes in file order and wraps");
    loom_loader_pos pos = loom_loader_get_pos(ld);
    CHECK(pos.epoch == 2 && pos.index == 5, "position (2, 5)");
    loom_loader_free(ld);
    loom_dataset_free(ds);
}

static void test_loader_too_short(void) {
    loom_dataset *ds = open_counting_dataset("short_data.bin", 8);
    loom_loader *ld = (loom_loader *)1;
    CHECK(loom_loader_create(&ld, ds, 8, 1, 1) == LOOM_ERR_INPUT && ld == NULL,
          "8 tokens cannot make a window of 8+1");
    CHECK(error_mentions("short_data.bin") && error_mentions("8 tokens") && error_mentions("9"),
          "error names the pattern and sizes: %s", loom_last_error());
    CHECK(loom_loader_create(&ld, ds, 0, 1, 1) == LOOM_ERR_INPUT, "seq_len 0 rejected");
    ld = NULL;
    CHECK(loom_loader_create(&ld, ds, 7, 1, 1) == LOOM_OK && loom_loader_num_windows(ld) == 1,
          "8 tokens make exactly one window of 7+1");
    int32_t in[7], tg[7];
    if (ld) {
        loom_loader_next(ld, 1, in, tg);
        loom_loader_next(ld, 1, in, tg);
        CHECK(in[0] == 0 && tg[6] == 7 && loom_loader_get_pos(ld).epoch == 2, "one-window epochs");
    }
    loom_loader_free(ld);
    loom_dataset_free(ds);
}

/* ---- prepare ----------------------------------------------------------------------------- */

/* Appends bytes[begin, end) and EOT to out; returns the new length. */
static size_t append_part(uint16_t *out, size_t len, const char *bytes, size_t begin, size_t end) {
    for (size_t i = begin; i < end; i++) out[len++] = (unsigned char)bytes[i];
    out[len++] = LOOM_BYTE_EOT;
    return len;
}

static int dataset_equals(const char *pattern, const uint16_t *expect, size_t n) {
    loom_dataset *ds = NULL;
    if (loom_dataset_open(&ds, pattern, LOOM_BYTE_VOCAB) != LOOM_OK) {
        fprintf(stderr, "open %s: %s\n", pattern, loom_last_error());
        return 0;
    }
    uint32_t *wide = malloc((n + 1) * sizeof *wide);
    for (size_t i = 0; i < n; i++) wide[i] = expect[i];
    int same = dataset_holds(ds, wide, n);
    free(wide);
    if (!same)
        fprintf(stderr, "%s: %zu tokens, expected %zu\n", pattern, loom_dataset_num_tokens(ds), n);
    loom_dataset_free(ds);
    return same;
}

static size_t shard_count(const char *dir, const char *name, int index) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s_%06d.bin", dir, name, index);
    size_t count = 0;
    if (loom_shard_probe(path, &count, NULL) != LOOM_OK) return (size_t)-1;
    return count;
}

static void test_prepare_split(void) {
    /* a.txt: 40 bytes including a NUL, 0xff and a newline; b.txt: 25 bytes. */
    char a[40], b[25];
    for (int i = 0; i < 40; i++) a[i] = (char)('A' + i % 26);
    a[3] = '\0';
    a[10] = (char)0xff;
    a[35] = '\n';
    for (int i = 0; i < 25; i++) b[i] = (char)('a' + i);
    write_raw(tmp_path("a.txt"), a, sizeof a);
    write_raw(tmp_path("b.txt"), b, sizeof b);
    const char *paths[2] = {tmp_path("a.txt"), tmp_path("b.txt")};
    char *dir = strdup(tmp_path("prepared"));

    /* First run with tiny shards, to check that the second removes its extra shards. */
    loom_prepare_opts opts = {.val_fraction = 0.25, .shard_tokens = 4, .min_val_tokens = 0};
    CHECK(loom_prepare_text(paths, 2, dir, &opts) == LOOM_OK, "prepare: %s", loom_last_error());
    CHECK(shard_count(dir, "train", 12) == 3, "51 train tokens in shards of 4: last holds 3");

    opts.shard_tokens = 16;
    CHECK(loom_prepare_text(paths, 2, dir, &opts) == LOOM_OK, "prepare: %s", loom_last_error());
    /* a: round(0.25*40) = 10 val bytes; b: round(6.25) = 6. */
    uint16_t train[64], val[64];
    size_t n_train = append_part(train, 0, a, 0, 30);
    n_train = append_part(train, n_train, b, 0, 19);
    size_t n_val = append_part(val, 0, a, 30, 40);
    n_val = append_part(val, n_val, b, 19, 25);
    CHECK(n_train == 51 && n_val == 18, "expected sizes");
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", dir);
    CHECK(dataset_equals(pattern, train, n_train), "train shards hold the documented split");
    snprintf(pattern, sizeof pattern, "%s/val_*.bin", dir);
    CHECK(dataset_equals(pattern, val, n_val), "val shards hold the documented split");
    CHECK(shard_count(dir, "train", 0) == 16 && shard_count(dir, "train", 3) == 3 &&
              shard_count(dir, "train", 4) == (size_t)-1,
          "train shards 16,16,16,3 and the stale ones removed");
    CHECK(shard_count(dir, "val", 0) == 16 && shard_count(dir, "val", 1) == 2 &&
              shard_count(dir, "val", 2) == (size_t)-1,
          "val shards 16,2 and the stale ones removed");

    /* The decoded text: each part is the file's bytes followed by EOT (decoded as newline). */
    char text[80], expect_text[80];
    loom_bytes_decode(val, n_val, text, sizeof text);
    memcpy(expect_text, a + 30, 10);
    expect_text[10] = '\n';
    memcpy(expect_text + 11, b + 19, 6);
    expect_text[17] = '\n';
    CHECK(memcmp(text, expect_text, 18) == 0, "val decodes to the tails of a.txt and b.txt");
    free(dir);
}

static void test_prepare_min_val(void) {
    char big[100], small[40];
    memset(big, 'x', sizeof big);
    memset(small, 'y', sizeof small);
    write_raw(tmp_path("big.txt"), big, sizeof big);
    write_raw(tmp_path("small.txt"), small, sizeof small);
    const char *paths[2] = {tmp_path("big.txt"), tmp_path("small.txt")};
    char *dir = strdup(tmp_path("minval"));
    /* big: max(round(10), min(32, 50)) = 32 val bytes; small: max(4, min(32, 20)) = 20. */
    loom_prepare_opts opts = {.val_fraction = 0.1, .shard_tokens = 1000, .min_val_tokens = 33};
    CHECK(loom_prepare_text(paths, 2, dir, &opts) == LOOM_OK, "prepare: %s", loom_last_error());
    CHECK(shard_count(dir, "val", 0) == 33 + 21, "val = (32+EOT) + (20+EOT): %zu",
          shard_count(dir, "val", 0));
    CHECK(shard_count(dir, "train", 0) == 69 + 21, "train = (68+EOT) + (20+EOT): %zu",
          shard_count(dir, "train", 0));

    /* A tiny file: round(0.1 * 3) = 0 is raised to 1 val byte; a 1-byte file cannot split. */
    write_raw(tmp_path("tiny.txt"), "abc", 3);
    write_raw(tmp_path("one.txt"), "z", 1);
    const char *tiny_paths[2] = {tmp_path("tiny.txt"), tmp_path("one.txt")};
    char *dir_tiny = strdup(tmp_path("tiny"));
    opts.min_val_tokens = 0;
    CHECK(loom_prepare_text(tiny_paths, 2, dir_tiny, &opts) == LOOM_OK, "prepare tiny");
    const uint16_t tiny_train[5] = {'a', 'b', LOOM_BYTE_EOT, 'z', LOOM_BYTE_EOT};
    const uint16_t tiny_val[2] = {'c', LOOM_BYTE_EOT};
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", dir_tiny);
    CHECK(dataset_equals(pattern, tiny_train, 5), "tiny train split");
    snprintf(pattern, sizeof pattern, "%s/val_*.bin", dir_tiny);
    CHECK(dataset_equals(pattern, tiny_val, 2), "tiny val split: one byte + EOT");
    free(dir_tiny);

    /* Without val: no val shard at all. */
    char *dir0 = strdup(tmp_path("noval"));
    opts.val_fraction = 0;
    CHECK(loom_prepare_text(paths, 2, dir0, &opts) == LOOM_OK, "prepare without val");
    CHECK(shard_count(dir0, "train", 0) == 142 && shard_count(dir0, "val", 0) == (size_t)-1,
          "all 140 bytes + 2 EOT in train, no val shard");

    /* Defaults. */
    loom_prepare_opts d = loom_prepare_default_opts();
    CHECK(d.val_fraction == 0.1 && d.shard_tokens == 100000000 &&
              d.min_val_tokens == LOOM_PREPARE_MIN_VAL_TOKENS,
          "default options");
    char *dir1 = strdup(tmp_path("defaults"));
    CHECK(loom_prepare_text(paths, 2, dir1, NULL) == LOOM_OK, "prepare with NULL opts");
    /* big: max(10, min(1024, 50)) = 50; small: max(4, min(1024, 20)) = 20. */
    CHECK(shard_count(dir1, "val", 0) == 51 + 21, "default val split %zu",
          shard_count(dir1, "val", 0));
    free(dir);
    free(dir0);
    free(dir1);
}

static void test_prepare_errors(void) {
    char *dir = strdup(tmp_path("never"));
    write_raw(tmp_path("empty.txt"), "", 0);
    const char *missing[2] = {tmp_path("a.txt"), tmp_path("missing.txt")};
    const char *empty[1] = {tmp_path("empty.txt")};
    const char *good[1] = {tmp_path("a.txt")};
    loom_prepare_opts opts = loom_prepare_default_opts();

    CHECK(loom_prepare_text(missing, 2, dir, &opts) == LOOM_ERR_INPUT &&
              error_mentions("missing.txt"),
          "missing input named: %s", loom_last_error());
    CHECK(loom_prepare_text(empty, 1, dir, &opts) == LOOM_ERR_INPUT &&
              error_mentions("empty.txt") && error_mentions("empty"),
          "empty input named: %s", loom_last_error());
    CHECK(loom_prepare_text(good, 0, dir, &opts) == LOOM_ERR_INPUT, "no inputs rejected");
    const char *dir_input[1] = {tmp};
    CHECK(loom_prepare_text(dir_input, 1, dir, &opts) == LOOM_ERR_INPUT,
          "a directory is not a text file");
    double bad_fractions[4] = {1.0, -0.1, NAN, 2.0};
    for (int i = 0; i < 4; i++) {
        opts.val_fraction = bad_fractions[i];
        CHECK(loom_prepare_text(good, 1, dir, &opts) == LOOM_ERR_INPUT &&
                  error_mentions("fraction"),
              "fraction %g rejected", bad_fractions[i]);
    }
    opts = loom_prepare_default_opts();
    opts.shard_tokens = 0;
    CHECK(loom_prepare_text(good, 1, dir, &opts) == LOOM_ERR_INPUT, "shard_tokens 0 rejected");
    CHECK(!file_exists(dir), "nothing written when the input is bad");
    free(dir);
}

int main(void) {
    tmp = check_tmpdir();
    loom_log_set_level(LOOM_LOG_WARN); /* prepare's progress lines would drown the verdicts */
    test_tokenizer();
    test_shard_round_trip();
    test_wide_shard_round_trip();
    test_bad_shards();
    test_dataset();
    test_wide_dataset();
    test_mixed_widths();
    test_loader_shuffle();
    test_loader_resume(1);
    test_loader_resume(0);
    test_loader_sequential();
    test_loader_too_short();
    test_prepare_split();
    test_prepare_min_val();
    test_prepare_errors();
    return check_finish();
}
