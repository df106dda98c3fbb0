/*
 * llmc.c — llm.c's GPT-2 model checkpoint: int32[256] header (magic 20240326, version 3 =
 * fp32), then every parameter as float32 in llm.c's order.
 *
 * The header is validated against the file size before any parameter is read, so a truncated
 * or padded file is refused with both sizes in the message.
 *
 * Not here: bf16 checkpoints (version 5), llm.c's optimizer state files, and the mapping of
 * the flat array onto loom's parameter struct.
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/io.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LLMC_VERSION_BF16 5

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_BIG_ENDIAN 1
#else
#define HOST_BIG_ENDIAN 0
#endif

static const char *const tensor_names[LOOM_LLMC_NUM_TENSORS] = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb",
};

const char *loom_llmc_tensor_name(int index) {
    if (index < 0 || index >= LOOM_LLMC_NUM_TENSORS) return NULL;
    return tensor_names[index];
}

/* a*b into *out; 0 on overflow. */
static int mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 0;
    *out = a * b;
    return 1;
}

int loom_llmc_tensor_sizes(const loom_llmc_header *h, size_t sizes[LOOM_LLMC_NUM_TENSORS]) {
    memset(sizes, 0, LOOM_LLMC_NUM_TENSORS * sizeof sizes[0]);
    if (h->max_seq_len <= 0 || h->vocab_size <= 0 || h->num_layers <= 0 || h->num_heads <= 0 ||
        h->channels <= 0 || h->padded_vocab_size <= 0) {
        return 0;
    }
    size_t Vp = (size_t)h->padded_vocab_size, maxT = (size_t)h->max_seq_len;
    size_t L = (size_t)h->num_layers, C = (size_t)h->channels;
    /* Per layer, in units of C (a factor of the row count) and C*C (a factor of the matrix). */
    static const size_t per_layer_rows[LOOM_LLMC_NUM_TENSORS] = {0, 0, 1, 1, 0, 3, 0, 1,
                                                                 1, 1, 0, 4, 0, 1, 0, 0};
    static const size_t per_layer_mats[LOOM_LLMC_NUM_TENSORS] = {0, 0, 0, 0, 3, 0, 1, 0,
                                                                 0, 0, 4, 0, 4, 0, 0, 0};
    size_t CC, LC, LCC;
    int ok = mul_size(C, C, &CC) && mul_size(L, C, &LC) && mul_size(L, CC, &LCC) &&
             mul_size(Vp, C, &sizes[0]) && mul_size(maxT, C, &sizes[1]);
    for (int i = 2; i < 14 && ok; i++) {
        if (per_layer_mats[i]) {
            ok = mul_size(per_layer_mats[i], LCC, &sizes[i]);
        } else {
            ok = mul_size(per_layer_rows[i], LC, &sizes[i]);
        }
    }
    sizes[14] = sizes[15] = C;
    size_t total = 0;
    for (int i = 0; i < LOOM_LLMC_NUM_TENSORS && ok; i++) {
        ok = sizes[i] <= SIZE_MAX - total;
        total += sizes[i];
    }
    if (!ok) memset(sizes, 0, LOOM_LLMC_NUM_TENSORS * sizeof sizes[0]);
    return ok;
}

size_t loom_llmc_param_count(const loom_llmc_header *h) {
    size_t sizes[LOOM_LLMC_NUM_TENSORS];
    if (!loom_llmc_tensor_sizes(h, sizes)) return 0;
    size_t total = 0;
    for (int i = 0; i < LOOM_LLMC_NUM_TENSORS; i++) total += sizes[i];
    return total;
}

/* The checks a header must pass whether read or about to be written. */
static loom_status llmc_check_header(const char *path, const loom_llmc_header *h) {
    const struct {
        const char *field;
        int slot;
        int value;
    } sizes[] = {
        {"max_seq_len", 2, h->max_seq_len}, {"vocab_size", 3, h->vocab_size},
        {"num_layers", 4, h->num_layers},   {"num_heads", 5, h->num_heads},
        {"channels", 6, h->channels},       {"padded_vocab_size", 7, h->padded_vocab_size},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].value <= 0) {
            return loom_fail(LOOM_ERR_INPUT, "%s: header[%d] %s is %d, expected a positive value",
                             path, sizes[i].slot, sizes[i].field, sizes[i].value);
        }
    }
    if (h->channels % h->num_heads != 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: header: channels %d is not divisible by num_heads %d",
                         path, h->channels, h->num_heads);
    }
    if (h->padded_vocab_size < h->vocab_size) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: header: padded_vocab_size %d is smaller than vocab_size %d", path,
                         h->padded_vocab_size, h->vocab_size);
    }
    size_t count = loom_llmc_param_count(h);
    if (count == 0 || count > (SIZE_MAX - LOOM_LLMC_HEADER_BYTES) / sizeof(float)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: header: the parameter count overflows", path);
    }
    return LOOM_OK;
}

/* Opens `path`, reads and checks the header and the file size; on success *file is positioned
 * at the first parameter. */
static loom_status llmc_open(const char *path, FILE **file, loom_llmc_header *h) {
    *file = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fileno(f), &info) != 0 || !S_ISREG(info.st_mode)) {
        fclose(f);
        return loom_fail(LOOM_ERR_INPUT, "%s: not a regular file", path);
    }
    unsigned long long file_size = (unsigned long long)info.st_size;
    int32_t slot[LOOM_I32_HEADER_SLOTS];
    loom_status status = loom_i32_header_read(f, path, LOOM_LLMC_MAGIC, slot);
    if (status != LOOM_OK) {
        fclose(f);
        return status;
    }
    if (slot[1] == LLMC_VERSION_BF16) {
        status = loom_fail(LOOM_ERR_INPUT,
                           "%s: version 5: bf16 checkpoints are not supported; expected version "
                           "3 (fp32)",
                           path);
    } else if (slot[1] != LOOM_LLMC_VERSION_FP32) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: unsupported version %d; expected version 3 (fp32)",
                           path, (int)slot[1]);
    }
    if (status == LOOM_OK) {
        h->max_seq_len = slot[2];
        h->vocab_size = slot[3];
        h->num_layers = slot[4];
        h->num_heads = slot[5];
        h->channels = slot[6];
        h->padded_vocab_size = slot[7];
        status = llmc_check_header(path, h);
    }
    if (status == LOOM_OK) {
        unsigned long long count = loom_llmc_param_count(h);
        unsigned long long expected = LOOM_LLMC_HEADER_BYTES + 4ULL * count;
        if (file_size != expected) {
            status = loom_fail(LOOM_ERR_INPUT,
                               "%s: file is %s: it has %llu bytes, expected %llu (the %d-byte "
                               "header + 4 * %llu parameters)",
                               path, file_size < expected ? "truncated" : "too long", file_size,
                               expected, LOOM_LLMC_HEADER_BYTES, count);
        }
    }
    if (status != LOOM_OK) {
        fclose(f);
        return status;
    }
    *file = f;
    return LOOM_OK;
}

loom_status loom_llmc_read_header(const char *path, loom_llmc_header *h) {
    FILE *f;
    loom_llmc_header read;
    loom_status status = llmc_open(path, &f, &read);
    if (status != LOOM_OK) return status;
    fclose(f);
    *h = read;
    return LOOM_OK;
}

/* Opens the file at its parameters, after checking that its header is still *h. */
static loom_status llmc_open_same(const char *path, const loom_llmc_header *h, FILE **f) {
    loom_llmc_header read;
    loom_status status = llmc_open(path, f, &read);
    if (status != LOOM_OK) return status;
    if (memcmp(&read, h, sizeof read) != 0) {
        fclose(*f);
        *f = NULL;
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: header changed since it was read (L=%d C=%d Vp=%d now, L=%d C=%d "
                         "Vp=%d given)",
                         path, read.num_layers, read.channels, read.padded_vocab_size,
                         h->num_layers, h->channels, h->padded_vocab_size);
    }
    return LOOM_OK;
}

loom_status loom_llmc_read_params(const char *path, const loom_llmc_header *h, float *dst,
                                  size_t count) {
    FILE *f;
    loom_status status = llmc_open_same(path, h, &f);
    if (status != LOOM_OK) return status;
    size_t expected = loom_llmc_param_count(h);
    if (count != expected) {
        fclose(f);
        return loom_fail(LOOM_ERR_INPUT, "%s: asked for %zu parameters, the checkpoint holds %zu",
                         path, count, expected);
    }
    if (fread(dst, sizeof(float), count, f) != count) {
        status = loom_fail(LOOM_ERR_IO, "%s: reading %zu parameters failed", path, count);
    }
    fclose(f);
#if HOST_BIG_ENDIAN
    for (size_t i = 0; i < count && status == LOOM_OK; i++) {
        uint32_t u;
        memcpy(&u, &dst[i], 4);
        u = __builtin_bswap32(u);
        memcpy(&dst[i], &u, 4);
    }
#endif
    return status;
}

loom_status loom_llmc_read_slices(const char *path, const loom_llmc_header *h,
                                  loom_llmc_slice_fn fn, void *ctx) {
    size_t sizes[LOOM_LLMC_NUM_TENSORS];
    if (!loom_llmc_tensor_sizes(h, sizes)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: header sizes overflow", path);
    }
    FILE *f;
    loom_status status = llmc_open_same(path, h, &f);
    if (status != LOOM_OK) return status;
    /* wte, wpe, lnfw, lnfb are whole; the other twelve have one slice per layer */
    size_t largest = 0;
    for (int k = 0; k < LOOM_LLMC_NUM_TENSORS; k++) {
        int global = k == 0 || k == 1 || k >= 14;
        size_t n = global ? sizes[k] : sizes[k] / (size_t)h->num_layers;
        if (n > largest) largest = n;
    }
    float *slice = loom_alloc_aligned((largest ? largest : 1) * sizeof(float), "llm.c slice");
    if (!slice) status = LOOM_ERR_NOMEM;
    for (int k = 0; k < LOOM_LLMC_NUM_TENSORS && status == LOOM_OK; k++) {
        int global = k == 0 || k == 1 || k >= 14;
        int layers = global ? 1 : h->num_layers;
        size_t n = global ? sizes[k] : sizes[k] / (size_t)h->num_layers;
        for (int l = 0; l < layers && status == LOOM_OK; l++) {
            if (fread(slice, sizeof(float), n, f) != n) {
                status = loom_fail(LOOM_ERR_IO, "%s: reading tensor %s failed", path,
                                   loom_llmc_tensor_name(k));
                break;
            }
#if HOST_BIG_ENDIAN
            for (size_t i = 0; i < n; i++) {
                uint32_t u;
                memcpy(&u, &slice[i], 4);
                u = __builtin_bswap32(u);
                memcpy(&slice[i], &u, 4);
            }
#endif
            status = fn(ctx, k, global ? -1 : l, slice);
        }
    }
    loom_free_aligned(slice);
    fclose(f);
    return status;
}

static int llmc_write_params(FILE *f, const float *params, size_t count) {
#if HOST_BIG_ENDIAN
    for (size_t i = 0; i < count; i++) {
        uint32_t u;
        memcpy(&u, &params[i], 4);
        u = __builtin_bswap32(u);
        if (fwrite(&u, 4, 1, f) != 1) return 0;
    }
    return 1;
#else
    return fwrite(params, sizeof(float), count, f) == count;
#endif
}

loom_status loom_llmc_write(const char *path, const loom_llmc_header *h, const float *params,
                            size_t count) {
    loom_status status = llmc_check_header(path, h);
    if (status != LOOM_OK) return status;
    size_t expected = loom_llmc_param_count(h);
    if (count != expected) {
        return loom_fail(LOOM_ERR_INPUT, "%s: given %zu parameters, the header calls for %zu", path,
                         count, expected);
    }
    int32_t slots[LOOM_I32_HEADER_SLOTS] = {LOOM_LLMC_MAGIC, LOOM_LLMC_VERSION_FP32, h->max_seq_len,
                                            h->vocab_size,   h->num_layers,          h->num_heads,
                                            h->channels,     h->padded_vocab_size};
    unsigned char raw[LOOM_LLMC_HEADER_BYTES];
    loom_i32_header_encode(raw, slots);
    loom_atomic_file *af;
    status = loom_atomic_open(&af, path);
    if (status != LOOM_OK) return status;
    FILE *f = loom_atomic_stream(af);
    if (fwrite(raw, 1, sizeof raw, f) != sizeof raw || !llmc_write_params(f, params, count)) {
        status = loom_fail(LOOM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        loom_atomic_abort(af);
        return status;
    }
    return loom_atomic_commit(af);
}
