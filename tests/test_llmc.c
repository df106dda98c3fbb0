/*
 * test_llmc.c — llm.c model checkpoints: a tiny file written here by hand (raw header and a
 * known pattern, value = tensor_index*1000 + element_index) must be read with every tensor at
 * the offset computed by hand; loom_llmc_write must reproduce it byte for byte; bad files
 * (magic, bf16, version, sizes, truncated, too long) must be refused with clear messages.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "loom/io.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

static const char *tmp;

/* The tiny model: maxT 8, V 10, Vp 16, L 2, NH 2, C 4. Tensor sizes in llm.c's order, worked
 * out by hand from the shapes: wte 16*4, wpe 8*4, ln1w 2*4, ln1b 2*4, qkvw 2*12*4, qkvb 2*12,
 * attprojw 2*4*4, attprojb 2*4, ln2w 2*4, ln2b 2*4, fcw 2*16*4, fcb 2*16, fcprojw 2*4*16,
 * fcprojb 2*4, lnfw 4, lnfb 4. */
static const int tiny_sizes[16] = {64, 32, 8, 8, 96, 24, 32, 8, 8, 8, 128, 32, 128, 8, 4, 4};
enum { TINY_COUNT = 592 }; /* Vp*C + maxT*C + L*(12*C*C + 13*C) + 2*C = 64+32+488+8 */

static const char *path_in_tmp(char *buf, size_t size, const char *name) {
    snprintf(buf, size, "%s/%s", tmp, name);
    return buf;
}

static void put_le32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    fwrite(b, 1, 4, f);
}

/* Writes a checkpoint by hand: header slots h[0..7], the rest zero, then `floats` parameters
 * from the pattern (fewer or more than the model needs, to make bad files). */
static void write_by_hand(const char *path, const int32_t slots[8], int floats) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    for (int i = 0; i < 256; i++) put_le32(f, i < 8 ? (uint32_t)slots[i] : 0);
    int written = 0;
    for (int t = 0; t < 16 && written < floats; t++) {
        for (int e = 0; e < tiny_sizes[t] && written < floats; e++, written++) {
            float value = (float)(t * 1000 + e);
            uint32_t u;
            memcpy(&u, &value, 4);
            put_le32(f, u);
        }
    }
    for (; written < floats; written++) put_le32(f, 0);
    fclose(f);
}

static const int32_t tiny_slots[8] = {20240326, 3, 8, 10, 2, 2, 4, 16};

static void test_read_by_hand(void) {
    char path[1024];
    path_in_tmp(path, sizeof path, "tiny.bin");
    write_by_hand(path, tiny_slots, TINY_COUNT);

    loom_llmc_header h;
    memset(&h, 0xff, sizeof h);
    loom_status status = loom_llmc_read_header(path, &h);
    CHECK(status == LOOM_OK, "read header: %s", loom_last_error());
    CHECK(h.max_seq_len == 8 && h.vocab_size == 10 && h.num_layers == 2 && h.num_heads == 2 &&
              h.channels == 4 && h.padded_vocab_size == 16,
          "header fields %d %d %d %d %d %d", h.max_seq_len, h.vocab_size, h.num_layers, h.num_heads,
          h.channels, h.padded_vocab_size);
    CHECK(loom_llmc_param_count(&h) == TINY_COUNT, "param count %zu", loom_llmc_param_count(&h));

    size_t sizes[16];
    CHECK(loom_llmc_tensor_sizes(&h, sizes) == 1, "tensor sizes");
    for (int t = 0; t < 16; t++) {
        CHECK(sizes[t] == (size_t)tiny_sizes[t], "size of %s: %zu, expected %d",
              loom_llmc_tensor_name(t), sizes[t], tiny_sizes[t]);
    }
    CHECK(strcmp(loom_llmc_tensor_name(4), "qkvw") == 0 && loom_llmc_tensor_name(16) == NULL,
          "tensor names");

    float params[TINY_COUNT];
    status = loom_llmc_read_params(path, &h, params, TINY_COUNT);
    CHECK(status == LOOM_OK, "read params: %s", loom_last_error());
    /* Spot checks at offsets worked out by hand. */
    CHECK(params[0] == 0.0f, "wte[0]");
    CHECK(params[63] == 63.0f, "wte[15][3] (last padded row)");
    CHECK(params[64] == 1000.0f, "wpe[0] at 64");
    /* qkvw starts at 64+32+8+8 = 112; layer 1 begins 3C*C = 48 later, at 160. */
    CHECK(params[160] == 4048.0f, "qkvw layer 1 first element at 160: %g", params[160]);
    /* qkvb starts at 112+96 = 208; layer 1 row 5 is element 12+5 = 17 -> index 225. */
    CHECK(params[225] == 5017.0f, "qkvb[1][5] at 225: %g", params[225]);
    /* fcprojw starts at 208+24+32+8+8+8+128+32 = 448; layer 1, row 2, col 5 of (C, 4C) is
     * element 64 + 2*16 + 5 = 101 -> index 549. */
    CHECK(params[549] == 12101.0f, "fcprojw[1][2][5] at 549: %g", params[549]);
    CHECK(params[584] == 14000.0f, "lnfw[0] at 584: %g", params[584]);
    CHECK(params[591] == 15003.0f, "lnfb[3] last: %g", params[591]);
    /* And every element. */
    int index = 0, all = 1;
    for (int t = 0; t < 16; t++) {
        for (int e = 0; e < tiny_sizes[t]; e++) all &= params[index++] == (float)(t * 1000 + e);
    }
    CHECK(all, "every element in its place");

    /* Wrong count, or a header that is not the file's. */
    status = loom_llmc_read_params(path, &h, params, TINY_COUNT - 1);
    CHECK(status == LOOM_ERR_INPUT && strstr(loom_last_error(), "591") &&
              strstr(loom_last_error(), "592"),
          "wrong count: %s", loom_last_error());
    loom_llmc_header other = h;
    other.num_layers = 1;
    status = loom_llmc_read_params(path, &other, params, TINY_COUNT);
    CHECK(status == LOOM_ERR_INPUT, "other header: %s", loom_last_error());

    /* loom_llmc_write reproduces the hand-written file byte for byte, and reads back. */
    char out[1024];
    path_in_tmp(out, sizeof out, "tiny_loom.bin");
    status = loom_llmc_write(out, &h, params, TINY_COUNT);
    CHECK(status == LOOM_OK, "write: %s", loom_last_error());
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHECK(loom_read_file(path, &a, &na) == LOOM_OK && loom_read_file(out, &b, &nb) == LOOM_OK,
          "read files");
    CHECK(na == 1024 + 4 * TINY_COUNT && na == nb && a && b && memcmp(a, b, na) == 0,
          "written file differs from the hand-written one (%zu vs %zu bytes)", na, nb);
    free(a);
    free(b);
    loom_llmc_header h2;
    float back[TINY_COUNT];
    CHECK(loom_llmc_read_header(out, &h2) == LOOM_OK && memcmp(&h, &h2, sizeof h) == 0,
          "round-trip header");
    CHECK(loom_llmc_read_params(out, &h2, back, TINY_COUNT) == LOOM_OK &&
              memcmp(back, params, sizeof back) == 0,
          "round-trip params");

    /* The writer refuses a wrong count or a bad header and leaves no file. */
    char bad[1024];
    path_in_tmp(bad, sizeof bad, "bad_write.bin");
    status = loom_llmc_write(bad, &h, params, TINY_COUNT + 1);
    CHECK(status == LOOM_ERR_INPUT && strstr(loom_last_error(), "bad_write.bin"),
          "write wrong count: %s", loom_last_error());
    loom_llmc_header odd = h;
    odd.num_heads = 3;
    status = loom_llmc_write(bad, &odd, params, TINY_COUNT);
    CHECK(status == LOOM_ERR_INPUT && strstr(loom_last_error(), "divisible"),
          "write bad header: %s", loom_last_error());
    CHECK(access(bad, F_OK) != 0, "failed write left a file");
}

/* GPT-2 124M's real sizes, as a check of the count formula at scale. */
/* Slice by slice: the slices, in file order, are the tensors whole (wte, wpe, lnf) or one layer
 * at a time, and laid end to end they are the file's parameters. */
typedef struct {
    float *all;
    size_t at;
    int calls, order_ok;
    int last_tensor, last_layer;
    const loom_llmc_header *h;
} slice_log;

static loom_status log_slice(void *ctx, int tensor, int layer, const float *slice) {
    slice_log *c = ctx;
    size_t sizes[16];
    loom_llmc_tensor_sizes(c->h, sizes);
    int global = tensor == 0 || tensor == 1 || tensor >= 14;
    size_t n = global ? sizes[tensor] : sizes[tensor] / (size_t)c->h->num_layers;
    int expected_layer = tensor == c->last_tensor ? c->last_layer + 1 : (global ? -1 : 0);
    if (global) expected_layer = -1;
    if (tensor < c->last_tensor || layer != expected_layer) c->order_ok = 0;
    memcpy(c->all + c->at, slice, n * sizeof(float));
    c->at += n;
    c->calls++;
    c->last_tensor = tensor, c->last_layer = layer;
    return LOOM_OK;
}

static void test_read_slices(void) {
    char path[1024];
    path_in_tmp(path, sizeof path, "tiny_slices.bin");
    write_by_hand(path, tiny_slots, TINY_COUNT);
    loom_llmc_header h;
    CHECK(loom_llmc_read_header(path, &h) == LOOM_OK, "header: %s", loom_last_error());
    float whole[TINY_COUNT], sliced[TINY_COUNT];
    CHECK(loom_llmc_read_params(path, &h, whole, TINY_COUNT) == LOOM_OK, "read params");
    slice_log c = {sliced, 0, 0, 1, -1, -1, &h};
    CHECK(loom_llmc_read_slices(path, &h, log_slice, &c) == LOOM_OK, "read slices: %s",
          loom_last_error());
    CHECK(c.at == TINY_COUNT, "slices hold %zu floats, expected %d", c.at, TINY_COUNT);
    CHECK(c.calls == 4 + 12 * h.num_layers, "%d slices, expected %d", c.calls,
          4 + 12 * h.num_layers);
    CHECK(c.order_ok, "slices in file order, layers counting up");
    CHECK(memcmp(whole, sliced, sizeof whole) == 0, "slices end to end equal the parameters");
}

static void test_gpt2_count(void) {
    loom_llmc_header h = {1024, 50257, 12, 12, 768, 50304};
    CHECK(loom_llmc_param_count(&h) == 124475904u, "GPT-2 124M count %zu",
          loom_llmc_param_count(&h));
    loom_llmc_header zero = {0, 50257, 12, 12, 768, 50304};
    CHECK(loom_llmc_param_count(&zero) == 0, "non-positive size gives 0");
    loom_llmc_header huge = {1 << 30, 1 << 30, 1, 1, 1 << 14, 1 << 30};
    uint64_t C = 1 << 14, expect = (2ULL << 44) + 12 * C * C + 13 * C + 2 * C;
    size_t count = loom_llmc_param_count(&huge);
    CHECK(sizeof(size_t) < 8 || count == expect, "huge but representable: %zu", count);
    loom_llmc_header overflow = {2147483647, 2147483647, 2147483647, 1, 2147483647, 2147483647};
    CHECK(loom_llmc_param_count(&overflow) == 0, "overflow gives 0");
}

static void expect_bad(const char *file, const int32_t slots[8], int floats, const char *keyword,
                       const char *keyword2) {
    char path[1024];
    path_in_tmp(path, sizeof path, file);
    write_by_hand(path, slots, floats);
    loom_llmc_header h;
    loom_status status = loom_llmc_read_header(path, &h);
    const char *msg = loom_last_error();
    CHECK(status == LOOM_ERR_INPUT, "%s: status %d: %s", file, status, msg);
    CHECK(strstr(msg, file) != NULL, "%s: message does not name the file: %s", file, msg);
    CHECK(strstr(msg, keyword) != NULL, "%s: message lacks \"%s\": %s", file, keyword, msg);
    CHECK(!keyword2 || strstr(msg, keyword2) != NULL, "%s: message lacks \"%s\": %s", file,
          keyword2, msg);
    printf("  %-22s -> %s\n", file, msg);
    /* read_params refuses the same file on its own */
    loom_llmc_header tiny = {8, 10, 2, 2, 4, 16};
    float params[TINY_COUNT];
    CHECK(loom_llmc_read_params(path, &tiny, params, TINY_COUNT) == LOOM_ERR_INPUT,
          "%s: read_params accepted it", file);
}

static void test_bad_files(void) {
    int32_t s[8];
#define WITH(slot, value) (memcpy(s, tiny_slots, sizeof s), s[slot] = (value), s)
    expect_bad("bad_magic.bin", WITH(0, 12345), TINY_COUNT, "got 12345", "expected 20240326");
    expect_bad("shard_magic.bin", WITH(0, 20240520), TINY_COUNT, "token shard", NULL);
    expect_bad("bf16.bin", WITH(1, 5), TINY_COUNT,
               "bf16 checkpoints are not supported; expected version 3 (fp32)", NULL);
    expect_bad("version2.bin", WITH(1, 2), TINY_COUNT, "unsupported version 2", "version 3");
    expect_bad("zero_layers.bin", WITH(4, 0), TINY_COUNT, "num_layers is 0", "positive");
    expect_bad("neg_seq.bin", WITH(2, -8), TINY_COUNT, "max_seq_len is -8", NULL);
    expect_bad("zero_channels.bin", WITH(6, 0), TINY_COUNT, "channels is 0", NULL);
    expect_bad("heads.bin", WITH(5, 3), TINY_COUNT, "not divisible by num_heads 3", NULL);
    expect_bad("padded.bin", WITH(7, 8), TINY_COUNT, "padded_vocab_size 8 is smaller", NULL);
    expect_bad("truncated.bin", tiny_slots, TINY_COUNT - 1, "truncated",
               "3388 bytes, expected 3392");
    expect_bad("too_long.bin", tiny_slots, TINY_COUNT + 1, "too long", "3396 bytes, expected 3392");
    expect_bad("header_only.bin", tiny_slots, 0, "truncated", "1024 bytes");
#undef WITH

    char path[1024];
    path_in_tmp(path, sizeof path, "short.bin");
    FILE *f = fopen(path, "wb");
    put_le32(f, 20240326);
    put_le32(f, 3);
    fclose(f);
    loom_llmc_header h;
    loom_status status = loom_llmc_read_header(path, &h);
    CHECK(status == LOOM_ERR_INPUT && strstr(loom_last_error(), "short.bin") &&
              strstr(loom_last_error(), "shorter than the 1024-byte"),
          "short: %s", loom_last_error());
    printf("  %-22s -> %s\n", "short.bin", loom_last_error());
    status = loom_llmc_read_header("/nonexistent/model.bin", &h);
    CHECK(status == LOOM_ERR_INPUT && strstr(loom_last_error(), "model.bin"), "missing: %s",
          loom_last_error());
}

int main(void) {
    tmp = check_tmpdir();
    test_read_by_hand();
    test_read_slices();
    test_gpt2_count();
    test_bad_files();
    return check_finish();
}
