/*
 * test_base_files.c — base's file helpers: the reader of llm.c's 1024-byte little-endian int32
 * headers (against bytes laid out by hand here: byte order, negative slots, a short file, an
 * empty one, a wrong magic named as the llm.c format it is), and the checked path join (a path
 * that just fits, one byte too many refused by name and never cut).
 */
#include "check.h"
#include "loom/base.h"

#include <stdint.h>
#include <string.h>

static int error_has(const char *text) {
    return strstr(loom_last_error(), text) != NULL;
}

/* Slot i of a hand-made header: bytes b0..b3 are the value's least to most significant. */
static void put_slot(unsigned char *header, int i, uint32_t value) {
    header[4 * i + 0] = (unsigned char)(value & 0xff);
    header[4 * i + 1] = (unsigned char)((value >> 8) & 0xff);
    header[4 * i + 2] = (unsigned char)((value >> 16) & 0xff);
    header[4 * i + 3] = (unsigned char)((value >> 24) & 0xff);
}

static void hand_header(unsigned char header[1024]) {
    memset(header, 0, 1024);
    put_slot(header, 0, 20240520);
    put_slot(header, 1, 0x01020304u);
    put_slot(header, 2, 0xfffffffdu); /* -3 */
    put_slot(header, 3, 0x80000000u); /* INT32_MIN */
    put_slot(header, 255, 0x7fffffffu);
}

static void test_decode(void) {
    unsigned char header[1024 + 8];
    hand_header(header);
    int32_t slots[LOOM_I32_HEADER_SLOTS];
    loom_status st = loom_i32_header_decode(header, sizeof header, "a.bin", 20240520, slots);
    CHECK(st == LOOM_OK, "decode: %s", loom_last_error());
    CHECK(slots[0] == 20240520 && slots[1] == 16909060 && slots[2] == -3 && slots[3] == INT32_MIN &&
              slots[4] == 0 && slots[255] == INT32_MAX,
          "slots %d %d %d %d %d %d", slots[0], slots[1], slots[2], slots[3], slots[4], slots[255]);

    unsigned char encoded[1024];
    loom_i32_header_encode(encoded, slots);
    CHECK(memcmp(encoded, header, 1024) == 0, "encode gives the hand-made bytes back");

    st = loom_i32_header_decode(header, 1023, "short.bin", 20240520, slots);
    CHECK(st == LOOM_ERR_INPUT && error_has("short.bin: file is 1023 bytes, shorter than the "
                                            "1024-byte header of an llm.c token shard"),
          "1023 bytes: %s", loom_last_error());
    st = loom_i32_header_decode(header, 0, "empty.bin", 12345, slots);
    CHECK(st == LOOM_ERR_INPUT &&
              error_has("empty.bin: file is 0 bytes, shorter than the 1024-byte "
                        "header") &&
              !error_has(" of "),
          "empty, unknown format: %s", loom_last_error());

    st = loom_i32_header_decode(header, 1024, "model.bin", 20240326, slots);
    CHECK(st == LOOM_ERR_INPUT &&
              error_has("model.bin: header slot 0 (magic): expected 20240326 (an llm.c model "
                        "checkpoint), got 20240520 (an llm.c token shard)"),
          "a shard given for a checkpoint: %s", loom_last_error());
    /* token shards have two magics: either is taken, anything else names both */
    const int32_t shard_magics[2] = {20240520, 20240801};
    put_slot(header, 0, 20240801);
    st = loom_i32_header_decode_any(header, 1024, "wide.bin", shard_magics, 2, slots);
    CHECK(st == LOOM_OK && slots[0] == 20240801, "the second magic is taken: %s",
          loom_last_error());
    put_slot(header, 0, 20240326);
    st = loom_i32_header_decode_any(header, 1024, "model.bin", shard_magics, 2, slots);
    CHECK(st == LOOM_ERR_INPUT &&
              error_has("model.bin: header slot 0 (magic): expected 20240520 (an llm.c token "
                        "shard) or 20240801 (an llm.c token shard of uint32 tokens), got 20240326 "
                        "(an llm.c model checkpoint)"),
          "neither magic: %s", loom_last_error());
    put_slot(header, 0, 12345);
    st = loom_i32_header_decode(header, 1024, "tok.bin", 20240328, slots);
    CHECK(st == LOOM_ERR_INPUT &&
              error_has("tok.bin: header slot 0 (magic): expected 20240328 (an llm.c tokenizer), "
                        "got 12345") &&
              !error_has("12345 ("),
          "unknown magic: %s", loom_last_error());
}

static void write_bytes(const char *path, const unsigned char *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

static void test_read(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/header.bin", dir);
    unsigned char bytes[1024 + 3];
    hand_header(bytes);
    bytes[1024] = 'x', bytes[1025] = 'y', bytes[1026] = 'z';
    write_bytes(path, bytes, sizeof bytes);
    int32_t slots[LOOM_I32_HEADER_SLOTS];
    FILE *f = fopen(path, "rb");
    loom_status st = loom_i32_header_read(f, path, 20240520, slots);
    CHECK(st == LOOM_OK && slots[2] == -3 && slots[255] == INT32_MAX, "read: %s",
          loom_last_error());
    CHECK(ftell(f) == 1024 && fgetc(f) == 'x', "the file stands after the header");
    fclose(f);

    write_bytes(path, bytes, 10);
    f = fopen(path, "rb");
    st = loom_i32_header_read(f, path, 20240520, slots);
    CHECK(st == LOOM_ERR_INPUT && error_has("header.bin: file is 10 bytes, shorter than"),
          "short file: %s", loom_last_error());
    fclose(f);
}

static void test_path_join(void) {
    char buf[12];
    loom_status st = loom_path_join(buf, sizeof buf, "runs/a", "b.tx"); /* 11 bytes: fits */
    CHECK(st == LOOM_OK && strcmp(buf, "runs/a/b.tx") == 0, "join: '%s' %s", buf,
          loom_last_error());
    st = loom_path_join(buf, sizeof buf, NULL, "plain/name");
    CHECK(st == LOOM_OK && strcmp(buf, "plain/name") == 0, "no folder: '%s'", buf);
    st = loom_path_join(buf, sizeof buf, "", "x");
    CHECK(st == LOOM_OK && strcmp(buf, "/x") == 0, "empty folder is the root: '%s'", buf);

    st = loom_path_join(buf, sizeof buf, "runs/ab", "b.tx"); /* 12 bytes: one too many */
    CHECK(st == LOOM_ERR_INPUT && buf[0] == '\0', "one byte over: refused, buffer emptied");
    CHECK(strcmp(loom_last_error(), "path too long: runs/ab/b.tx (12 bytes, at most 11)") == 0,
          "message: %s", loom_last_error());
    st = loom_path_join(buf, sizeof buf, NULL, "a-long-file-name");
    CHECK(st == LOOM_ERR_INPUT &&
              strcmp(loom_last_error(), "path too long: a-long-file-name (16 bytes, at most 11)") ==
                  0,
          "no folder, too long: %s", loom_last_error());

    char big[5000];
    memset(big, 'd', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char path[4096];
    st = loom_path_join(path, sizeof path, big, "model.safetensors");
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "path too long: ddd") &&
              path[0] == '\0',
          "a folder longer than the buffer: %.40s", loom_last_error());
}

int main(void) {
    const char *dir = check_tmpdir();
    test_decode();
    test_read(dir);
    test_path_join();
    return check_finish();
}
