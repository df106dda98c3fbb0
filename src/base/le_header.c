/*
 * le_header.c — llm.c's binary headers: 256 little-endian int32 slots at the start of a token
 * shard, a tokenizer or a model checkpoint, slot 0 the format's magic number. One reader for the
 * three formats, so a short file or a wrong magic is refused the same way everywhere, and a file
 * of one llm.c format given where another is expected is named as what it is.
 *
 * Not here: the other slots (version, counts, sizes) — each format checks its own.
 */
#include "loom/base.h"

#include <stdio.h>
#include <string.h>

static const struct {
    int32_t magic;
    const char *format;
} known_formats[] = {
    {20240520, "an llm.c token shard"},
    {20240801, "an llm.c token shard of uint32 tokens"},
    {20240328, "an llm.c tokenizer"},
    {20240326, "an llm.c model checkpoint"},
};

/* "an llm.c token shard" for a known magic, NULL otherwise. */
static const char *format_of(int32_t magic) {
    for (size_t i = 0; i < sizeof known_formats / sizeof known_formats[0]; i++) {
        if (known_formats[i].magic == magic) return known_formats[i].format;
    }
    return NULL;
}

static int32_t load_le_i32(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t value;
    memcpy(&value, &u,
           sizeof value); /* two's complement, without the implementation-defined cast */
    return value;
}

/* "20240520 (an llm.c token shard)", or the number alone for an unknown magic. */
static void describe_magic(char *out, size_t cap, int32_t magic) {
    const char *format = format_of(magic);
    if (format) {
        snprintf(out, cap, "%d (%s)", (int)magic, format);
    } else {
        snprintf(out, cap, "%d", (int)magic);
    }
}

loom_status loom_i32_header_decode_any(const void *bytes, size_t size, const char *path,
                                       const int32_t *magics, int count,
                                       int32_t slots[LOOM_I32_HEADER_SLOTS]) {
    const char *expected = format_of(magics[0]);
    if (size < LOOM_I32_HEADER_BYTES) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: file is %zu bytes, shorter than the %d-byte header%s%s", path, size,
                         LOOM_I32_HEADER_BYTES, expected ? " of " : "", expected ? expected : "");
    }
    const unsigned char *p = bytes;
    for (int i = 0; i < LOOM_I32_HEADER_SLOTS; i++) slots[i] = load_le_i32(p + 4 * i);
    for (int k = 0; k < count; k++) {
        if (slots[0] == magics[k]) return LOOM_OK;
    }
    char wanted[256] = "", one[96], got[96];
    for (int k = 0; k < count; k++) {
        describe_magic(one, sizeof one, magics[k]);
        size_t used = strlen(wanted);
        snprintf(wanted + used, sizeof wanted - used, "%s%s", k == 0 ? "" : " or ", one);
    }
    describe_magic(got, sizeof got, slots[0]);
    return loom_fail(LOOM_ERR_INPUT, "%s: header slot 0 (magic): expected %s, got %s", path, wanted,
                     got);
}

loom_status loom_i32_header_decode(const void *bytes, size_t size, const char *path, int32_t magic,
                                   int32_t slots[LOOM_I32_HEADER_SLOTS]) {
    return loom_i32_header_decode_any(bytes, size, path, &magic, 1, slots);
}

loom_status loom_i32_header_read_any(FILE *f, const char *path, const int32_t *magics, int count,
                                     int32_t slots[LOOM_I32_HEADER_SLOTS]) {
    unsigned char raw[LOOM_I32_HEADER_BYTES];
    size_t got = fread(raw, 1, sizeof raw, f);
    if (got < sizeof raw && ferror(f)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: cannot read the %d-byte header", path,
                         LOOM_I32_HEADER_BYTES);
    }
    return loom_i32_header_decode_any(raw, got, path, magics, count, slots);
}

loom_status loom_i32_header_read(FILE *f, const char *path, int32_t magic,
                                 int32_t slots[LOOM_I32_HEADER_SLOTS]) {
    return loom_i32_header_read_any(f, path, &magic, 1, slots);
}

void loom_i32_header_encode(unsigned char bytes[LOOM_I32_HEADER_BYTES],
                            const int32_t slots[LOOM_I32_HEADER_SLOTS]) {
    for (int i = 0; i < LOOM_I32_HEADER_SLOTS; i++) {
        uint32_t u;
        memcpy(&u, &slots[i], sizeof u);
        for (int b = 0; b < 4; b++) bytes[4 * i + b] = (unsigned char)(u >> (8 * b));
    }
}
