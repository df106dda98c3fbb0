/*
 * test_safetensors.c — safetensors round trips (plain, transposed, metadata), an independent
 * byte-level check of what the writer produced, and every kind of bad file the reader must
 * refuse (each crafted here byte by byte).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "loom/io.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static const char *tmp;

static const char *path_in_tmp(char *buf, size_t size, const char *name) {
    snprintf(buf, size, "%s/%s", tmp, name);
    return buf;
}

static void fill_random(float *x, size_t n, uint64_t stream) {
    for (size_t i = 0; i < n; i++) x[i] = (float)loom_rng_normal(1234, stream, i);
}

static void write_bytes(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(bytes, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

/* A crafted file: the 8-byte little-endian `header_len` (which may lie), the header text, then
 * `data_len` bytes of data. */
static void write_crafted(const char *path, uint64_t header_len, const char *header,
                          size_t data_len) {
    size_t text_len = strlen(header);
    size_t total = 8 + text_len + data_len;
    unsigned char *bytes = calloc(1, total);
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)(header_len >> (8 * i));
    memcpy(bytes + 8, header, text_len);
    for (size_t i = 0; i < data_len; i++) bytes[8 + text_len + i] = (unsigned char)i;
    write_bytes(path, bytes, total);
    free(bytes);
}

/* Opening the crafted file must fail with LOOM_ERR_INPUT, a message naming the file and
 * containing `keyword`. */
static void expect_bad_header(const char *file, uint64_t header_len, const char *header,
                              size_t data_len, const char *keyword) {
    char path[1024];
    path_in_tmp(path, sizeof path, file);
    write_crafted(path, header_len, header, data_len);
    loom_safetensors *st = (loom_safetensors *)1;
    loom_clear_error();
    loom_status status = loom_safetensors_open(&st, path);
    const char *msg = loom_last_error();
    CHECK(status == LOOM_ERR_INPUT, "%s: status %d (%s)", file, status, msg);
    CHECK(st == NULL, "%s: handle not NULL on failure", file);
    CHECK(strstr(msg, file) != NULL, "%s: message does not name the file: %s", file, msg);
    CHECK(strstr(msg, keyword) != NULL, "%s: message lacks \"%s\": %s", file, keyword, msg);
    printf("  %-28s -> %s\n", file, msg);
    if (status == LOOM_OK) loom_safetensors_close(st);
}

static void expect_bad(const char *file, const char *header, size_t data_len, const char *keyword) {
    expect_bad_header(file, strlen(header), header, data_len, keyword);
}

/* ---- round trip -------------------------------------------------------------------------- */

enum { A_ROWS = 3, A_COLS = 4, B_LEN = 5, T_ROWS = 3, T_COLS = 5 };

static void test_round_trip(void) {
    char path[1024];
    path_in_tmp(path, sizeof path, "round.safetensors");
    float a[A_ROWS * A_COLS], b[B_LEN], t_mem[T_COLS * T_ROWS], s[1], w[2 * 3 * 4];
    fill_random(a, A_ROWS * A_COLS, 1);
    fill_random(b, B_LEN, 2);
    fill_random(t_mem, T_COLS * T_ROWS, 3);
    fill_random(s, 1, 4);
    fill_random(w, 24, 5);
    loom_st_tensor tensors[] = {
        {.name = "a", .ndim = 2, .shape = {A_ROWS, A_COLS}, .data = a},
        {.name = "b", .ndim = 1, .shape = {B_LEN}, .data = b},
        /* stored (3, 5); in memory (5, 3) */
        {.name = "t", .ndim = 2, .shape = {T_ROWS, T_COLS}, .data = t_mem, .transpose = 1},
        {.name = "s", .ndim = 0, .data = s},
        {.name = "z", .ndim = 2, .shape = {0, 4}, .data = NULL},
        {.name = "h.0.w\xc3\xa9", .ndim = 3, .shape = {2, 3, 4}, .data = w},
    };
    const int count = (int)(sizeof tensors / sizeof tensors[0]);
    const char *meta[] = {"format", "pt", "loom_step", "42", "note", "h\xc3\xa9llo \"quoted\""};
    loom_status status = loom_safetensors_write(path, tensors, count, meta, 3);
    CHECK(status == LOOM_OK, "write: %s", loom_last_error());

    loom_safetensors *st = NULL;
    status = loom_safetensors_open(&st, path);
    CHECK(status == LOOM_OK, "open: %s", loom_last_error());
    if (status != LOOM_OK) return;
    CHECK(loom_safetensors_count(st) == count, "count %d", loom_safetensors_count(st));
    uint64_t offset = 0;
    for (int i = 0; i < count && i < loom_safetensors_count(st); i++) {
        const loom_st_entry *e = loom_safetensors_entry(st, i);
        CHECK(strcmp(e->name, tensors[i].name) == 0, "entry %d is '%s'", i, e->name);
        CHECK(e->dtype == LOOM_DTYPE_F32, "entry %d dtype %s", i, loom_dtype_name(e->dtype));
        CHECK(e->ndim == tensors[i].ndim, "entry %d ndim %d", i, e->ndim);
        uint64_t elements = 1;
        for (int d = 0; d < e->ndim; d++) {
            CHECK(e->shape[d] == tensors[i].shape[d], "entry %d dim %d", i, d);
            elements *= (uint64_t)e->shape[d];
        }
        CHECK(e->begin == offset && e->end == offset + 4 * elements, "entry %d offsets", i);
        CHECK(loom_safetensors_find(st, tensors[i].name) == e, "find '%s'", tensors[i].name);
        offset = e->end;
    }
    CHECK(loom_safetensors_entry(st, -1) == NULL && loom_safetensors_entry(st, count) == NULL,
          "entry out of range");
    CHECK(loom_safetensors_find(st, "nope") == NULL, "find missing");
    CHECK(loom_safetensors_find(st, "") == NULL, "find empty");

    float a2[A_ROWS * A_COLS], b2[B_LEN], t2[T_COLS * T_ROWS], t_stored[T_ROWS * T_COLS], s2[1];
    float w2[24];
    int64_t a_shape[] = {A_ROWS, A_COLS}, b_shape[] = {B_LEN}, t_shape[] = {T_ROWS, T_COLS};
    int64_t w_shape[] = {2, 3, 4}, z_shape[] = {0, 4};
    CHECK(loom_safetensors_read_f32(st, "a", 2, a_shape, 0, a2) == LOOM_OK, "read a");
    CHECK(memcmp(a, a2, sizeof a) == 0, "a differs");
    CHECK(loom_safetensors_read_f32(st, "b", 1, b_shape, 0, b2) == LOOM_OK, "read b");
    CHECK(memcmp(b, b2, sizeof b) == 0, "b differs");
    CHECK(loom_safetensors_read_f32(st, "t", 2, t_shape, 1, t2) == LOOM_OK, "read t transposed");
    CHECK(memcmp(t_mem, t2, sizeof t2) == 0, "t (transposed read of a transposed write) differs");
    CHECK(loom_safetensors_read_f32(st, "t", 2, t_shape, 0, t_stored) == LOOM_OK, "read t");
    int t_ok = 1;
    for (int r = 0; r < T_ROWS; r++) {
        for (int c = 0; c < T_COLS; c++) t_ok &= t_stored[r * T_COLS + c] == t_mem[c * T_ROWS + r];
    }
    CHECK(t_ok, "t as stored is not the transpose of memory");
    CHECK(loom_safetensors_read_f32(st, "s", 0, NULL, 0, s2) == LOOM_OK, "read scalar");
    CHECK(s2[0] == s[0], "scalar differs");
    CHECK(loom_safetensors_read_f32(st, "z", 2, z_shape, 0, NULL) == LOOM_OK, "read empty");
    CHECK(loom_safetensors_read_f32(st, "h.0.w\xc3\xa9", 3, w_shape, 0, w2) == LOOM_OK, "read w");
    CHECK(memcmp(w, w2, sizeof w) == 0, "w differs");
    /* read a again after others: seeks must be absolute */
    memset(a2, 0, sizeof a2);
    CHECK(loom_safetensors_read_f32(st, "a", 2, a_shape, 0, a2) == LOOM_OK, "reread a");
    CHECK(memcmp(a, a2, sizeof a) == 0, "a differs on reread");

    const char *v = loom_safetensors_metadata(st, "loom_step");
    CHECK(v && strcmp(v, "42") == 0, "metadata loom_step: %s", v ? v : "(null)");
    v = loom_safetensors_metadata(st, "note");
    CHECK(v && strcmp(v, "h\xc3\xa9llo \"quoted\"") == 0, "metadata note: %s", v ? v : "(null)");
    CHECK(loom_safetensors_metadata(st, "missing") == NULL, "missing metadata");

    /* read_f32 errors */
    int64_t wrong[] = {A_COLS, A_ROWS};
    loom_status s1 = loom_safetensors_read_f32(st, "a", 2, wrong, 0, a2);
    const char *msg = loom_last_error();
    CHECK(s1 == LOOM_ERR_INPUT && strstr(msg, "round.safetensors") && strstr(msg, "'a'") &&
              strstr(msg, "expected shape [4, 3], found [3, 4]"),
          "wrong shape: %s", msg);
    printf("  wrong shape -> %s\n", msg);
    s1 = loom_safetensors_read_f32(st, "a", 1, a_shape, 0, a2);
    CHECK(s1 == LOOM_ERR_INPUT && strstr(msg, "found [3, 4]"), "wrong ndim: %s", msg);
    s1 = loom_safetensors_read_f32(st, "missing.weight", 2, a_shape, 0, a2);
    CHECK(s1 == LOOM_ERR_INPUT && strstr(msg, "'missing.weight' not found"), "missing: %s", msg);
    printf("  missing     -> %s\n", msg);
    s1 = loom_safetensors_read_f32(st, "h.0.w\xc3\xa9", 3, w_shape, 1, w2);
    CHECK(s1 == LOOM_ERR_INPUT && strstr(msg, "2-D"), "transpose 3-D: %s", msg);
    CHECK(memcmp(a, a2, sizeof a) == 0, "failed reads must not touch dst");
    loom_safetensors_close(st);
}

/* Shapes large enough that the bounded scratch buffer is used in several blocks, and rows
 * longer than the scratch buffer. */
static void test_large_transpose(void) {
    static const int64_t shapes[][2] = {{2000, 300}, {3, 300000}, {1, 7}, {7, 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        size_t rows = (size_t)shapes[k][0], cols = (size_t)shapes[k][1], n = rows * cols;
        float *mem = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
        float *stored = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) mem[i] = (float)i;
        char path[1024];
        path_in_tmp(path, sizeof path, "large.safetensors");
        loom_st_tensor t = {.name = "x",
                            .ndim = 2,
                            .shape = {shapes[k][0], shapes[k][1]},
                            .data = mem,
                            .transpose = 1};
        CHECK(loom_safetensors_write(path, &t, 1, NULL, 0) == LOOM_OK, "write large: %s",
              loom_last_error());
        loom_safetensors *st = NULL;
        CHECK(loom_safetensors_open(&st, path) == LOOM_OK, "open large: %s", loom_last_error());
        if (st) {
            CHECK(loom_safetensors_read_f32(st, "x", 2, shapes[k], 1, back) == LOOM_OK, "read T");
            CHECK(memcmp(mem, back, n * sizeof(float)) == 0, "large transposed %zux%zu", rows,
                  cols);
            CHECK(loom_safetensors_read_f32(st, "x", 2, shapes[k], 0, stored) == LOOM_OK, "read");
            int ok = 1;
            for (size_t r = 0; r < rows && ok; r++) {
                for (size_t c = 0; c < cols; c++) ok &= stored[r * cols + c] == mem[c * rows + r];
            }
            CHECK(ok, "large stored layout %zux%zu", rows, cols);
            loom_safetensors_close(st);
        }
        free(mem);
        free(back);
        free(stored);
    }
}

/* ---- independent byte-level check -------------------------------------------------------- */

static void test_bytes(void) {
    char path[1024];
    path_in_tmp(path, sizeof path, "bytes.safetensors");
    float a[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.125f, 1e-3f};
    float t_mem[6] = {10, 11, 12, 13, 14, 15}; /* memory (3, 2) -> stored (2, 3) */
    loom_st_tensor tensors[] = {
        {.name = "first", .ndim = 1, .shape = {6}, .data = a},
        {.name = "second", .ndim = 2, .shape = {2, 3}, .data = t_mem, .transpose = 1},
    };
    const char *meta[] = {"format", "pt"};
    CHECK(loom_safetensors_write(path, tensors, 2, meta, 1) == LOOM_OK, "write: %s",
          loom_last_error());
    char *bytes = NULL;
    size_t size = 0;
    CHECK(loom_read_file(path, &bytes, &size) == LOOM_OK, "read back");
    if (!bytes || size < 8) return;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (unsigned char)bytes[i];
    CHECK(n % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)n);
    CHECK(8 + n + 48 == size, "file size %zu, header %llu", size, (unsigned long long)n);
    CHECK(bytes[8] == '{', "header starts with 0x%02x", (unsigned)(unsigned char)bytes[8]);
    int no_nul = memchr(bytes + 8, '\0', n) == NULL;
    size_t last = 8 + n - 1;
    while (last > 8 && bytes[last] == ' ') last--;
    CHECK(no_nul && bytes[last] == '}', "header must end with '}' then spaces");
    CHECK(8 + n - 1 - last < 8, "more than 7 padding spaces");

    json_error_t error;
    json_t *root = json_loadb(bytes + 8, n, JSON_REJECT_DUPLICATES, &error);
    CHECK(root != NULL, "header JSON: %s", root ? "" : error.text);
    if (root) {
        CHECK(json_object_size(root) == 3, "3 keys");
        CHECK(strcmp(json_string_value(
                         json_object_get(json_object_get(root, "__metadata__"), "format")),
                     "pt") == 0,
              "metadata format");
        json_t *first = json_object_get(root, "first"), *second = json_object_get(root, "second");
        CHECK(strcmp(json_string_value(json_object_get(first, "dtype")), "F32") == 0, "dtype");
        json_t *shape = json_object_get(second, "shape");
        CHECK(json_array_size(shape) == 2 && json_integer_value(json_array_get(shape, 0)) == 2 &&
                  json_integer_value(json_array_get(shape, 1)) == 3,
              "second shape");
        json_t *off1 = json_object_get(first, "data_offsets");
        json_t *off2 = json_object_get(second, "data_offsets");
        CHECK(json_integer_value(json_array_get(off1, 0)) == 0 &&
                  json_integer_value(json_array_get(off1, 1)) == 24,
              "first offsets");
        long long begin2 = json_integer_value(json_array_get(off2, 0));
        CHECK(begin2 == 24 && json_integer_value(json_array_get(off2, 1)) == 48, "second offsets");
        /* first: every float, decoded from little-endian bytes by hand */
        for (int i = 0; i < 6; i++) {
            const unsigned char *p = (const unsigned char *)bytes + 8 + n + 4 * i;
            uint32_t u =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            float f;
            memcpy(&f, &u, 4);
            CHECK(f == a[i], "first[%d] = %g at byte level, expected %g", i, f, a[i]);
        }
        /* second stored (2, 3): element [r][c] is memory [c][r] = t_mem[c*2 + r] */
        for (int r = 0; r < 2; r++) {
            for (int c = 0; c < 3; c++) {
                const unsigned char *p =
                    (const unsigned char *)bytes + 8 + n + begin2 + 4 * (r * 3 + c);
                uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24;
                float f;
                memcpy(&f, &u, 4);
                CHECK(f == t_mem[c * 2 + r], "second[%d][%d] = %g", r, c, f);
            }
        }
        json_decref(root);
    }
    free(bytes);
}

/* ---- files the reader must accept -------------------------------------------------------- */

static loom_safetensors *open_crafted(const char *file, const char *header, size_t data_len) {
    char path[1024];
    path_in_tmp(path, sizeof path, file);
    write_crafted(path, strlen(header), header, data_len);
    loom_safetensors *st = NULL;
    loom_status status = loom_safetensors_open(&st, path);
    CHECK(status == LOOM_OK, "%s should open: %s", file, loom_last_error());
    return st;
}

static void test_good_files(void) {
    loom_safetensors *st = open_crafted("empty.safetensors", "{}", 0);
    if (st) {
        CHECK(loom_safetensors_count(st) == 0, "empty count");
        CHECK(loom_safetensors_metadata(st, "x") == NULL, "empty metadata");
        loom_safetensors_close(st);
    }
    /* Header order differs from data order; padded with spaces; other dtypes; metadata last. */
    st = open_crafted("order.safetensors",
                      "{\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"c\":{\"dtype\":\"BF16\",\"shape\":[1,1],\"data_offsets\":[12,14]},"
                      "\"d\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[14,14]},"
                      "\"e\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[14,16]},"
                      "\"__metadata__\":{\"k\":\"v\"}}      ",
                      16);
    if (st) {
        CHECK(loom_safetensors_count(st) == 5, "order count");
        const loom_st_entry *e0 = loom_safetensors_entry(st, 0),
                            *e1 = loom_safetensors_entry(st, 1);
        CHECK(strcmp(e0->name, "a") == 0 && strcmp(e1->name, "b") == 0, "sorted by offset");
        CHECK(e1->dtype == LOOM_DTYPE_I32, "b is I32");
        CHECK(loom_safetensors_find(st, "c")->dtype == LOOM_DTYPE_BF16, "c is BF16");
        const char *k = loom_safetensors_metadata(st, "k");
        CHECK(k && strcmp(k, "v") == 0, "metadata k");
        int64_t shape[] = {1};
        float x;
        loom_status status = loom_safetensors_read_f32(st, "b", 1, shape, 0, &x);
        const char *msg = loom_last_error();
        CHECK(status == LOOM_ERR_INPUT && strstr(msg, "order.safetensors") &&
                  strstr(msg, "dtype I32, expected F32"),
              "I32 read: %s", msg);
        printf("  wrong dtype -> %s\n", msg);
        int64_t ashape[] = {2};
        float a[2];
        CHECK(loom_safetensors_read_f32(st, "a", 1, ashape, 0, a) == LOOM_OK, "read a");
        /* crafted data bytes are 0,1,2,...: a[0] has bytes 00 01 02 03 */
        uint32_t u = 0x03020100u;
        float expect;
        memcpy(&expect, &u, 4);
        CHECK(memcmp(&a[0], &expect, 4) == 0, "a[0] bytes");
        loom_safetensors_close(st);
    }
    CHECK(loom_dtype_size(LOOM_DTYPE_BF16) == 2 && loom_dtype_size(LOOM_DTYPE_U64) == 8 &&
              loom_dtype_size(LOOM_DTYPE_BOOL) == 1 && loom_dtype_size((loom_dtype)99) == 0,
          "dtype sizes");
    CHECK(strcmp(loom_dtype_name(LOOM_DTYPE_F32), "F32") == 0 &&
              strcmp(loom_dtype_name((loom_dtype)-1), "?") == 0,
          "dtype names");
}

/* ---- files the reader must refuse -------------------------------------------------------- */

#define ENTRY(name, dtype, shape, offsets)                                                         \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offsets "}"

static void test_bad_files(void) {
    char path[1024];
    /* shorter than the length field */
    path_in_tmp(path, sizeof path, "short.safetensors");
    write_bytes(path, "\x02\0\0\0\0", 5);
    loom_safetensors *st = NULL;
    loom_status status = loom_safetensors_open(&st, path);
    CHECK(status == LOOM_ERR_INPUT && strstr(loom_last_error(), "short.safetensors") &&
              strstr(loom_last_error(), "shorter than the 8-byte"),
          "short: %s", loom_last_error());
    printf("  %-28s -> %s\n", "short.safetensors", loom_last_error());
    status = loom_safetensors_open(&st, "/nonexistent/missing.safetensors");
    CHECK(status == LOOM_ERR_INPUT && strstr(loom_last_error(), "missing.safetensors") &&
              strstr(loom_last_error(), "cannot open"),
          "missing: %s", loom_last_error());
    CHECK(loom_safetensors_open(&st, tmp) == LOOM_ERR_INPUT, "a directory");

    /* header length: absurd (must fail before any allocation), over the limit, past the end */
    expect_bad_header("len_2p62.safetensors", (uint64_t)1 << 62, "{}", 0, "exceeds the limit");
    expect_bad_header("len_max.safetensors", UINT64_MAX, "{}", 0, "exceeds the limit");
    expect_bad_header("len_limit.safetensors", 100000001, "{}", 0, "100000000");
    expect_bad_header("len_past_end.safetensors", 1000, "{}", 16, "follow the length field");
    expect_bad_header("len_zero.safetensors", 0, "{}", 0, "length is 0");

    /* not a JSON object */
    expect_bad("not_brace.safetensors", "[]", 0, "does not start with '{'");
    expect_bad("leading_space.safetensors", " {}", 0, "does not start with '{'");
    expect_bad("bad_json.safetensors", "{\"a\": ", 0, "not valid JSON");
    expect_bad("trailing.safetensors", "{} x", 0, "not valid JSON");
    expect_bad("bad_utf8.safetensors", "{\"\xff\xfe\":1}", 0, "UTF-8");
    expect_bad("nul_byte.safetensors", "{\"a\\u0000b\":1}", 0, "JSON");
    expect_bad("big_int.safetensors", "{" ENTRY("a", "F32", "[99999999999999999999]", "[0,4]") "}",
               4, "JSON");
    expect_bad("duplicate.safetensors",
               "{" ENTRY("a", "F32", "[1]", "[0,4]") "," ENTRY("a", "F32", "[1]", "[4,8]") "}", 8,
               "duplicate key \"a\"");
    expect_bad("duplicate_spaced.safetensors",
               "{ \"h.0.x\" : {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]} ,\n"
               "  \"h.0.x\"  :\t{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               8, "duplicate key \"h.0.x\"");

    /* entries */
    expect_bad("entry_number.safetensors", "{\"a\":5}", 0, "expected an object");
    expect_bad("unknown_dtype.safetensors", "{" ENTRY("w", "F8", "[1]", "[0,1]") "}", 1,
               "unknown dtype \"F8\"");
    expect_bad("dtype_number.safetensors",
               "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
    expect_bad("dtype_missing.safetensors", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "missing field \"dtype\"");
    expect_bad("shape_missing.safetensors", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
               "missing field \"shape\"");
    expect_bad("offsets_missing.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
               "missing field \"data_offsets\"");
    expect_bad("unknown_field.safetensors",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
               "unknown field \"x\"");
    expect_bad("shape_number.safetensors", "{" ENTRY("w", "F32", "3", "[0,12]") "}", 12,
               "shape must be an array");
    expect_bad("shape_negative.safetensors", "{" ENTRY("w", "F32", "[2,-1]", "[0,0]") "}", 0,
               "shape[1] must be a non-negative integer");
    expect_bad("shape_real.safetensors", "{" ENTRY("w", "F32", "[2.0]", "[0,8]") "}", 8,
               "shape[0]");
    expect_bad("shape_string.safetensors", "{" ENTRY("w", "F32", "[\"2\"]", "[0,8]") "}", 8,
               "shape[0]");
    expect_bad("too_many_dims.safetensors",
               "{" ENTRY("w", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, "at most 8");
    expect_bad("offsets_one.safetensors", "{" ENTRY("w", "F32", "[1]", "[0]") "}", 4,
               "data_offsets must be [begin, end]");
    expect_bad("offsets_three.safetensors", "{" ENTRY("w", "F32", "[1]", "[0,4,8]") "}", 4,
               "data_offsets");
    expect_bad("offsets_reversed.safetensors", "{" ENTRY("w", "F32", "[1]", "[8,4]") "}", 8,
               "begin <= end");
    expect_bad("offsets_string.safetensors", "{" ENTRY("w", "F32", "[1]", "[\"0\",4]") "}", 4,
               "data_offsets");
    expect_bad("offsets_negative.safetensors", "{" ENTRY("w", "F32", "[0]", "[-4,-4]") "}", 0,
               "data_offsets");
    expect_bad("offsets_object.safetensors", "{" ENTRY("w", "F32", "[1]", "{}") "}", 4,
               "data_offsets");
    expect_bad("size_mismatch.safetensors", "{" ENTRY("h.0.ln_1.weight", "F32", "[3]", "[0,8]") "}",
               8, "'h.0.ln_1.weight': data_offsets [0, 8] cover 8 bytes, expected 3*4=12");
    expect_bad("size_mismatch_2d.safetensors", "{" ENTRY("w", "F16", "[2,3]", "[0,10]") "}", 10,
               "expected 2*3*2=12");
    expect_bad("size_scalar.safetensors", "{" ENTRY("w", "F64", "[]", "[0,4]") "}", 4,
               "expected 1*8=8");
    expect_bad("count_overflow.safetensors",
               "{" ENTRY("w", "F32", "[4294967296,4294967296,16]", "[0,0]") "}", 0,
               "overflows 64 bits");
    expect_bad("bytes_overflow.safetensors",
               "{" ENTRY("w", "F32", "[4611686018427387904]", "[0,0]") "}", 0, "overflows 64 bits");

    /* layout of the buffer */
    expect_bad("overlap.safetensors",
               "{" ENTRY("a", "F32", "[2]", "[0,8]") "," ENTRY("b", "F32", "[2]", "[4,12]") "}", 12,
               "overlap tensor 'a'");
    expect_bad("same_range.safetensors",
               "{" ENTRY("a", "F32", "[2]", "[0,8]") "," ENTRY("b", "F32", "[2]", "[0,8]") "}", 8,
               "overlap");
    expect_bad("hole.safetensors",
               "{" ENTRY("a", "F32", "[2]", "[0,8]") "," ENTRY("b", "F32", "[1]", "[12,16]") "}",
               16, "hole");
    expect_bad("hole_at_start.safetensors", "{" ENTRY("a", "F32", "[1]", "[4,8]") "}", 8, "hole");
    expect_bad("beyond.safetensors", "{" ENTRY("a", "F32", "[2]", "[0,8]") "}", 4,
               "beyond the data buffer of 4 bytes");
    expect_bad("tail.safetensors", "{" ENTRY("a", "F32", "[2]", "[0,8]") "}", 12,
               "cover it exactly");
    expect_bad("no_tensors_data.safetensors", "{}", 4, "cover 0 bytes but the data buffer has 4");

    /* metadata */
    expect_bad("meta_number.safetensors", "{\"__metadata__\":5}", 0, "__metadata__ must be");
    expect_bad("meta_array.safetensors", "{\"__metadata__\":[\"a\"]}", 0, "__metadata__");
    expect_bad("meta_value.safetensors", "{\"__metadata__\":{\"step\":1}}", 0,
               "__metadata__[\"step\"] must be a string");
    expect_bad("meta_duplicate.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", 0,
               "duplicate key \"__metadata__\"");
    /* a duplicate inside an object is named with the object that holds it */
    expect_bad("meta_key_duplicate.safetensors",
               "{\"__metadata__\":{\"a\":\"1\",\"b,\\\"{\":\"}\",\"a\":\"2\"}}", 0,
               "duplicate key \"a\" in __metadata__ near header byte");
    expect_bad("field_duplicate.safetensors",
               "{\"__metadata__\":{\"x\":\"[\"}, \"w\":{\"dtype\":\"F32\",\"shape\":[1],"
               "\"dtype\":\"F32\",\"data_offsets\":[0,4]}}",
               4, "duplicate key \"dtype\" in tensor 'w' near header byte");
}

/* ---- the writer refuses bad arguments and leaves no file ---------------------------------- */

static void expect_write_fails(const char *file, const loom_st_tensor *tensors, int count,
                               const char *const *meta, int meta_count, loom_status expected,
                               const char *keyword) {
    char path[1024];
    path_in_tmp(path, sizeof path, file);
    loom_status status = loom_safetensors_write(path, tensors, count, meta, meta_count);
    const char *msg = loom_last_error();
    CHECK(status == expected, "%s: status %d: %s", file, status, msg);
    CHECK(strstr(msg, file) && strstr(msg, keyword), "%s: message lacks \"%s\": %s", file, keyword,
          msg);
    CHECK(access(path, F_OK) != 0, "%s: a failed write left a file", file);
    printf("  write %-22s -> %s\n", file, msg);
}

static void test_bad_writes(void) {
    float x[6] = {0};
    loom_st_tensor dup[] = {{.name = "a", .ndim = 1, .shape = {2}, .data = x},
                            {.name = "a", .ndim = 1, .shape = {2}, .data = x}};
    expect_write_fails("dup.safetensors", dup, 2, NULL, 0, LOOM_ERR_INPUT, "given twice");
    loom_st_tensor reserved = {.name = "__metadata__", .ndim = 1, .shape = {2}, .data = x};
    expect_write_fails("reserved.safetensors", &reserved, 1, NULL, 0, LOOM_ERR_INPUT, "reserved");
    loom_st_tensor t3 = {.name = "t", .ndim = 3, .shape = {1, 2, 3}, .data = x, .transpose = 1};
    expect_write_fails("t3.safetensors", &t3, 1, NULL, 0, LOOM_ERR_INPUT, "2-D");
    loom_st_tensor negative = {.name = "n", .ndim = 2, .shape = {2, -3}, .data = x};
    expect_write_fails("negative.safetensors", &negative, 1, NULL, 0, LOOM_ERR_INPUT, "shape[1]");
    loom_st_tensor nodata = {.name = "n", .ndim = 1, .shape = {2}, .data = NULL};
    expect_write_fails("nodata.safetensors", &nodata, 1, NULL, 0, LOOM_ERR_INPUT, "NULL");
    loom_st_tensor bad_name = {.name = "a\xff", .ndim = 1, .shape = {2}, .data = x};
    expect_write_fails("badname.safetensors", &bad_name, 1, NULL, 0, LOOM_ERR_INPUT, "UTF-8");
    loom_st_tensor ok = {.name = "a", .ndim = 1, .shape = {2}, .data = x};
    const char *meta_dup[] = {"k", "1", "k", "2"};
    expect_write_fails("metadup.safetensors", &ok, 1, meta_dup, 2, LOOM_ERR_INPUT, "twice");
    const char *meta_null[] = {"k", NULL};
    expect_write_fails("metanull.safetensors", &ok, 1, meta_null, 1, LOOM_ERR_INPUT, "UTF-8");

    loom_status status = loom_safetensors_write("/nonexistent-dir/x.safetensors", &ok, 1, NULL, 0);
    CHECK(status == LOOM_ERR_IO && strstr(loom_last_error(), "x.safetensors"),
          "unwritable dir: %d %s", status, loom_last_error());

    /* An empty file with no tensors is valid and readable. */
    char path[1024];
    path_in_tmp(path, sizeof path, "none.safetensors");
    CHECK(loom_safetensors_write(path, NULL, 0, NULL, 0) == LOOM_OK, "write none");
    loom_safetensors *st = NULL;
    CHECK(loom_safetensors_open(&st, path) == LOOM_OK, "open none: %s", loom_last_error());
    if (st) {
        CHECK(loom_safetensors_count(st) == 0, "none count");
        loom_safetensors_close(st);
    }
}

int main(void) {
    tmp = check_tmpdir();
    test_round_trip();
    test_large_transpose();
    test_bytes();
    test_good_files();
    test_bad_files();
    test_bad_writes();
    return check_finish();
}
