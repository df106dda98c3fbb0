/*
 * safetensors.c — Hugging Face safetensors files: validated reading and streamed, atomic F32
 * writing.
 *
 * Reading checks everything at open, before a byte of tensor data is touched: the header
 * length against the file size (so no allocation is ever larger than the file), the JSON
 * (UTF-8, no duplicate names), every entry's dtype, shape and offsets, and that the entries'
 * byte ranges tile the data buffer exactly. Tensors are then read one at a time with
 * fseek/fread from the FILE* kept in the handle; the file is never read whole.
 *
 * Not here: dtype conversion beyond widening BF16 on read (F32 is written), memory mapping, and any
 * knowledge of which tensor names a model uses.
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/io.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Transposition goes through a scratch buffer of about this many floats (1 MiB), or one row
 * when a row is longer. */
#define SCRATCH_FLOATS ((size_t)1 << 18)

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_BIG_ENDIAN 1
#else
#define HOST_BIG_ENDIAN 0
#endif

/* ---- dtypes ------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} dtype_table[] = {
    [LOOM_DTYPE_BOOL] = {"BOOL", 1}, [LOOM_DTYPE_U8] = {"U8", 1},   [LOOM_DTYPE_I8] = {"I8", 1},
    [LOOM_DTYPE_I16] = {"I16", 2},   [LOOM_DTYPE_U16] = {"U16", 2}, [LOOM_DTYPE_F16] = {"F16", 2},
    [LOOM_DTYPE_BF16] = {"BF16", 2}, [LOOM_DTYPE_I32] = {"I32", 4}, [LOOM_DTYPE_U32] = {"U32", 4},
    [LOOM_DTYPE_F32] = {"F32", 4},   [LOOM_DTYPE_F64] = {"F64", 8}, [LOOM_DTYPE_I64] = {"I64", 8},
    [LOOM_DTYPE_U64] = {"U64", 8},
};
#define DTYPE_COUNT ((int)(sizeof dtype_table / sizeof dtype_table[0]))

const char *loom_dtype_name(loom_dtype dtype) {
    if ((int)dtype < 0 || (int)dtype >= DTYPE_COUNT) return "?";
    return dtype_table[dtype].name;
}

size_t loom_dtype_size(loom_dtype dtype) {
    if ((int)dtype < 0 || (int)dtype >= DTYPE_COUNT) return 0;
    return dtype_table[dtype].size;
}

static int dtype_parse(const char *name, loom_dtype *dtype) {
    for (int i = 0; i < DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *dtype = (loom_dtype)i;
            return 1;
        }
    }
    return 0;
}

/* ---- small helpers ----------------------------------------------------------------------- */

static uint64_t load_le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static void store_le64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

/* The file stores little-endian floats; on a big-endian host they are swapped in place. */
static void f32_swap_if_big_endian(float *v, size_t n) {
#if HOST_BIG_ENDIAN
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        u = __builtin_bswap32(u);
        memcpy(&v[i], &u, 4);
    }
#else
    (void)v;
    (void)n;
#endif
}

/* a*b into *out; 0 on overflow. */
static int mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* "[3, 4]" */
static const char *shape_str(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && used < size; i++) {
        used +=
            (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

/* "3*4" (the product a size check expects); "1" for a scalar. */
static const char *dims_product_str(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "%s", ndim == 0 ? "1" : "");
    for (int i = 0; i < ndim && used < size; i++) {
        used +=
            (size_t)snprintf(buf + used, size - used, "%s%lld", i ? "*" : "", (long long)shape[i]);
    }
    return buf;
}

/* A compact, truncated rendering of a JSON value for messages. */
static const char *json_brief(char *buf, size_t size, const json_t *value) {
    char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
        snprintf(buf, size, "(unprintable)");
        return buf;
    }
    if (strlen(text) >= size && size > 4) {
        memcpy(buf, text, size - 4);
        memcpy(buf + size - 4, "...", 4);
    } else {
        snprintf(buf, size, "%s", text);
    }
    free(text);
    return buf;
}

static const char *json_type_name(const json_t *value) {
    switch (json_typeof(value)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "an unknown value";
}

/* ---- the handle -------------------------------------------------------------------------- */

struct loom_safetensors {
    FILE *file;
    char *path;
    uint64_t file_size;
    uint64_t header_len;
    uint64_t data_start;  /* 8 + header_len: where the buffer starts in the file */
    uint64_t buffer_size; /* file_size - data_start */
    int count;
    loom_st_entry *entries;        /* (count) sorted by begin */
    const loom_st_entry **by_name; /* (count) sorted by name, for loom_safetensors_find */
    json_t *metadata;              /* "__metadata__" object, NULL when absent */
};

void loom_safetensors_close(loom_safetensors *st) {
    if (!st) return;
    if (st->file) fclose(st->file);
    for (int i = 0; i < st->count; i++) free(st->entries[i].name);
    free(st->entries);
    free(st->by_name);
    json_decref(st->metadata);
    free(st->path);
    free(st);
}

int loom_safetensors_count(const loom_safetensors *st) {
    return st->count;
}

const loom_st_entry *loom_safetensors_entry(const loom_safetensors *st, int index) {
    if (index < 0 || index >= st->count) return NULL;
    return &st->entries[index];
}

const loom_st_entry *loom_safetensors_find(const loom_safetensors *st, const char *name) {
    int lo = 0, hi = st->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int cmp = strcmp(name, st->by_name[mid]->name);
        if (cmp == 0) return st->by_name[mid];
        if (cmp < 0) {
            hi = mid - 1;
        } else {
            lo = mid + 1;
        }
    }
    return NULL;
}

const char *loom_safetensors_metadata(const loom_safetensors *st, const char *key) {
    if (!st->metadata) return NULL;
    return json_string_value(json_object_get(st->metadata, key));
}

/* ---- open: length prefix and header bytes ------------------------------------------------ */

/* Opens the file, checks the 8-byte length against the limits and the file size, and reads the
 * header bytes into *header (NUL-terminated). */
static loom_status st_read_header_bytes(loom_safetensors *st, char **header) {
    *header = NULL;
    const char *path = st->path;
    st->file = fopen(path, "rb");
    if (!st->file) return loom_fail(LOOM_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fileno(st->file), &info) != 0 || !S_ISREG(info.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: not a regular file", path);
    }
    st->file_size = (uint64_t)info.st_size;
    if (st->file_size < 8) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: file is %llu bytes, shorter than the 8-byte header length that "
                         "starts a safetensors file",
                         path, (unsigned long long)st->file_size);
    }
    unsigned char prefix[8];
    if (fread(prefix, 1, 8, st->file) != 8) {
        return loom_fail(LOOM_ERR_INPUT, "%s: cannot read the 8-byte header length", path);
    }
    uint64_t n = load_le64(prefix);
    if (n > LOOM_ST_MAX_HEADER) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: header length %llu exceeds the limit of %llu bytes (not a "
                         "safetensors file, or a corrupt one)",
                         path, (unsigned long long)n, (unsigned long long)LOOM_ST_MAX_HEADER);
    }
    if (n > st->file_size - 8) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: header length %llu exceeds the %llu bytes that follow the length "
                         "field (file truncated?)",
                         path, (unsigned long long)n, (unsigned long long)(st->file_size - 8));
    }
    if (n == 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: header length is 0, expected a JSON object starting with '{'", path);
    }
    st->header_len = n;
    st->data_start = 8 + n;
    st->buffer_size = st->file_size - st->data_start;

    char *text = loom_malloc((size_t)n + 1, "safetensors header");
    if (!text) return LOOM_ERR_NOMEM;
    if (fread(text, 1, (size_t)n, st->file) != (size_t)n) {
        free(text);
        return loom_fail(LOOM_ERR_INPUT, "%s: cannot read the %llu-byte header", path,
                         (unsigned long long)n);
    }
    text[n] = '\0';
    if (text[0] != '{') {
        loom_status status =
            loom_fail(LOOM_ERR_INPUT,
                      "%s: header does not start with '{' (first byte is 0x%02x); expected a "
                      "JSON object",
                      path, (unsigned)(unsigned char)text[0]);
        free(text);
        return status;
    }
    *header = text;
    return LOOM_OK;
}

/* ---- open: header entries ---------------------------------------------------------------- */

static loom_status st_parse_dtype(const char *path, const char *name, const json_t *value,
                                  loom_st_entry *entry) {
    const json_t *dtype = json_object_get(value, "dtype");
    char brief[96];
    if (!dtype) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': missing field \"dtype\"", path, name);
    }
    if (!json_is_string(dtype) || !dtype_parse(json_string_value(dtype), &entry->dtype)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': unknown dtype %s, expected one of BOOL U8 I8 I16 U16 "
                         "F16 BF16 I32 U32 F32 F64 I64 U64",
                         path, name, json_brief(brief, sizeof brief, dtype));
    }
    return LOOM_OK;
}

static loom_status st_parse_shape(const char *path, const char *name, const json_t *value,
                                  loom_st_entry *entry) {
    const json_t *shape = json_object_get(value, "shape");
    char brief[96];
    if (!shape) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': missing field \"shape\"", path, name);
    }
    if (!json_is_array(shape)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': shape must be an array of non-negative integers, "
                         "found %s",
                         path, name, json_brief(brief, sizeof brief, shape));
    }
    size_t ndim = json_array_size(shape);
    if (ndim > LOOM_ST_MAX_DIMS) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': shape has %zu dims, at most %d are supported", path,
                         name, ndim, LOOM_ST_MAX_DIMS);
    }
    entry->ndim = (int)ndim;
    for (size_t i = 0; i < ndim; i++) {
        const json_t *dim = json_array_get(shape, i);
        if (!json_is_integer(dim) || json_integer_value(dim) < 0) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: tensor '%s': shape[%zu] must be a non-negative integer, "
                             "found %s",
                             path, name, i, json_brief(brief, sizeof brief, dim));
        }
        entry->shape[i] = (int64_t)json_integer_value(dim);
    }
    return LOOM_OK;
}

static loom_status st_parse_offsets(const char *path, const char *name, const json_t *value,
                                    loom_st_entry *entry) {
    const json_t *offsets = json_object_get(value, "data_offsets");
    char brief[96];
    if (!offsets) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': missing field \"data_offsets\"", path,
                         name);
    }
    const json_t *begin = json_array_get(offsets, 0), *end = json_array_get(offsets, 1);
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 || !json_is_integer(begin) ||
        !json_is_integer(end) || json_integer_value(begin) < 0 ||
        json_integer_value(end) < json_integer_value(begin)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': data_offsets must be [begin, end] with integers "
                         "0 <= begin <= end, found %s",
                         path, name, json_brief(brief, sizeof brief, offsets));
    }
    entry->begin = (uint64_t)json_integer_value(begin);
    entry->end = (uint64_t)json_integer_value(end);
    return LOOM_OK;
}

/* The byte count the shape and dtype call for must be what the offsets cover. */
static loom_status st_check_entry_size(const char *path, const char *name,
                                       const loom_st_entry *entry) {
    char shape[200], dims[200];
    uint64_t elements = 1;
    for (int i = 0; i < entry->ndim; i++) {
        if (!mul_u64(elements, (uint64_t)entry->shape[i], &elements)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: tensor '%s': the element count of shape %s overflows 64 bits",
                             path, name, shape_str(shape, sizeof shape, entry->ndim, entry->shape));
        }
    }
    size_t dsize = loom_dtype_size(entry->dtype);
    uint64_t bytes;
    if (!mul_u64(elements, dsize, &bytes)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': the byte count of shape %s (%s) overflows 64 bits", path,
                         name, shape_str(shape, sizeof shape, entry->ndim, entry->shape),
                         loom_dtype_name(entry->dtype));
    }
    if (entry->end - entry->begin != bytes) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': data_offsets [%llu, %llu] cover %llu bytes, expected "
                         "%s*%zu=%llu for %s shape %s",
                         path, name, (unsigned long long)entry->begin,
                         (unsigned long long)entry->end,
                         (unsigned long long)(entry->end - entry->begin),
                         dims_product_str(dims, sizeof dims, entry->ndim, entry->shape), dsize,
                         (unsigned long long)bytes, loom_dtype_name(entry->dtype),
                         shape_str(shape, sizeof shape, entry->ndim, entry->shape));
    }
    return LOOM_OK;
}

static loom_status st_parse_entry(const char *path, const char *name, const json_t *value,
                                  loom_st_entry *entry) {
    if (!json_is_object(value)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': expected an object with dtype, shape and "
                         "data_offsets, found %s",
                         path, name, json_type_name(value));
    }
    const char *key;
    const json_t *field;
    json_object_foreach((json_t *)value, key, field) {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: tensor '%s': unknown field \"%s\" (expected dtype, shape, "
                             "data_offsets)",
                             path, name, key);
        }
    }
    loom_status status = st_parse_dtype(path, name, value, entry);
    if (status == LOOM_OK) status = st_parse_shape(path, name, value, entry);
    if (status == LOOM_OK) status = st_parse_offsets(path, name, value, entry);
    if (status == LOOM_OK) status = st_check_entry_size(path, name, entry);
    return status;
}

static loom_status st_parse_metadata(loom_safetensors *st, json_t *metadata) {
    if (!json_is_object(metadata)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: __metadata__ must be an object of string values, found %s", st->path,
                         json_type_name(metadata));
    }
    const char *key;
    const json_t *value;
    json_object_foreach(metadata, key, value) {
        if (!json_is_string(value)) {
            return loom_fail(LOOM_ERR_INPUT, "%s: __metadata__[\"%s\"] must be a string, found %s",
                             st->path, key, json_type_name(value));
        }
    }
    st->metadata = json_incref(metadata);
    return LOOM_OK;
}

static loom_status st_parse_entries(loom_safetensors *st, json_t *root) {
    size_t total = json_object_size(root);
    st->entries = loom_calloc(total, sizeof *st->entries, "safetensors entries");
    if (!st->entries) return LOOM_ERR_NOMEM;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) {
            loom_status status = st_parse_metadata(st, value);
            if (status != LOOM_OK) return status;
            continue;
        }
        loom_st_entry *entry = &st->entries[st->count];
        entry->name = strdup(key);
        if (!entry->name) return loom_fail(LOOM_ERR_NOMEM, "out of memory reading %s", st->path);
        st->count++;
        loom_status status = st_parse_entry(st->path, key, value, entry);
        if (status != LOOM_OK) return status;
    }
    return LOOM_OK;
}

/* ---- open: layout of the buffer ---------------------------------------------------------- */

static int entry_by_offset(const void *a, const void *b) {
    const loom_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int entry_by_name(const void *a, const void *b) {
    const loom_st_entry *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Sorted by begin, the entries must run from 0 to the buffer size with no hole and no
 * overlap. */
static loom_status st_check_layout(loom_safetensors *st) {
    const char *path = st->path;
    if (st->count > 0) qsort(st->entries, (size_t)st->count, sizeof *st->entries, entry_by_offset);
    uint64_t covered = 0;
    const char *previous = NULL;
    for (int i = 0; i < st->count; i++) {
        const loom_st_entry *e = &st->entries[i];
        if (e->begin > covered) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: tensor '%s': data_offsets [%llu, %llu] leave a hole: bytes "
                             "[%llu, %llu) of the buffer belong to no tensor (%s%s%s)",
                             path, e->name, (unsigned long long)e->begin,
                             (unsigned long long)e->end, (unsigned long long)covered,
                             (unsigned long long)e->begin,
                             previous ? "previous tensor '" : "it is the first tensor",
                             previous ? previous : "", previous ? "'" : "");
        }
        if (e->begin < covered) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s', "
                             "which ends at %llu",
                             path, e->name, (unsigned long long)e->begin,
                             (unsigned long long)e->end, previous, (unsigned long long)covered);
        }
        if (e->end > st->buffer_size) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: tensor '%s': data_offsets [%llu, %llu] extend beyond the data "
                             "buffer of %llu bytes (file truncated?)",
                             path, e->name, (unsigned long long)e->begin,
                             (unsigned long long)e->end, (unsigned long long)st->buffer_size);
        }
        covered = e->end;
        previous = e->name;
    }
    if (covered != st->buffer_size) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: the tensors cover %llu bytes but the data buffer has %llu (file "
                         "size %llu - 8 - header length %llu); expected them to cover it exactly",
                         path, (unsigned long long)covered, (unsigned long long)st->buffer_size,
                         (unsigned long long)st->file_size, (unsigned long long)st->header_len);
    }
    st->by_name = loom_calloc((size_t)st->count, sizeof *st->by_name, "safetensors index");
    if (!st->by_name) return LOOM_ERR_NOMEM;
    for (int i = 0; i < st->count; i++) st->by_name[i] = &st->entries[i];
    if (st->count > 0) qsort(st->by_name, (size_t)st->count, sizeof *st->by_name, entry_by_name);
    return LOOM_OK;
}

/* jansson names no key in its duplicate-key error; the key is the last string before the
 * error position (skipping the ':' and blanks). Empty when that guess fails. */
static const char *duplicate_key_near(const char *header, int position, char *out, size_t size) {
    out[0] = '\0';
    int end = position - 1;
    while (end >= 0 && strchr(" \t\r\n:", header[end])) end--;
    if (end <= 0 || header[end] != '"') return out;
    int start = end - 1;
    while (start >= 0 && !(header[start] == '"' && (start == 0 || header[start - 1] != '\\'))) {
        start--;
    }
    if (start >= 0) snprintf(out, size, "%.*s", end - start - 1, header + start + 1);
    return out;
}

/* How deep header[0, end) leaves the parse (1: inside the top-level object) and the last
 * top-level key read: for a duplicate key, the object that holds it ("__metadata__", a tensor's
 * name) or, at depth 1, the key itself. */
static int header_depth_at(const char *header, int end, char *top_key, size_t size) {
    int depth = 0, in_string = 0, expect_key = 0, key_start = -1;
    top_key[0] = '\0';
    for (int i = 0; i < end; i++) {
        char c = header[i];
        if (in_string) {
            if (c == '\\') {
                i++;
            } else if (c == '"') {
                in_string = 0;
                if (key_start >= 0) {
                    snprintf(top_key, size, "%.*s", i - key_start, header + key_start);
                }
            }
        } else if (c == '"') {
            in_string = 1;
            key_start = depth == 1 && expect_key ? i + 1 : -1;
            expect_key = 0;
        } else if (c == '{' || c == '[') {
            depth++;
            expect_key = depth == 1;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',' && depth == 1) {
            expect_key = 1;
        }
    }
    return depth;
}

static loom_status duplicate_key_error(const loom_safetensors *st, const char *header,
                                       const json_error_t *error) {
    char key[128], holder[128], place[160];
    duplicate_key_near(header, error->position, key, sizeof key);
    int depth = header_depth_at(header, error->position, holder, sizeof holder);
    const char *rule = "tensor names must be unique";
    place[0] = '\0';
    if (depth >= 2 && !strcmp(holder, "__metadata__")) {
        snprintf(place, sizeof place, " in __metadata__");
        rule = "metadata keys must be unique";
    } else if (depth >= 2) {
        snprintf(place, sizeof place, " in tensor '%s'", holder);
        rule = "a tensor's fields must be unique";
    } else if (!strcmp(key, "__metadata__")) {
        rule = "__metadata__ may appear once";
    }
    return loom_fail(LOOM_ERR_INPUT,
                     "%s: header: duplicate key \"%s\"%s near header byte %d (line %d, column %d); "
                     "%s",
                     st->path, key, place, error->position, error->line, error->column, rule);
}

static loom_status st_parse_header(loom_safetensors *st, const char *header) {
    json_error_t error;
    json_t *root = json_loadb(header, (size_t)st->header_len, JSON_REJECT_DUPLICATES, &error);
    if (!root) {
        enum json_error_code code = json_error_code(&error);
        if (code == json_error_duplicate_key) return duplicate_key_error(st, header, &error);
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: header is not valid %sJSON: %s (header byte %d, line %d, column %d)",
                         st->path, code == json_error_invalid_utf8 ? "UTF-8 " : "", error.text,
                         error.position, error.line, error.column);
    }
    loom_status status = LOOM_OK;
    if (!json_is_object(root)) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: header must be a JSON object", st->path);
    }
    if (status == LOOM_OK) status = st_parse_entries(st, root);
    json_decref(root);
    if (status == LOOM_OK) status = st_check_layout(st);
    return status;
}

loom_status loom_safetensors_open(loom_safetensors **out, const char *path) {
    *out = NULL;
    loom_safetensors *st = loom_calloc(1, sizeof *st, "safetensors handle");
    if (!st) return LOOM_ERR_NOMEM;
    st->path = strdup(path);
    if (!st->path) {
        free(st);
        return loom_fail(LOOM_ERR_NOMEM, "out of memory opening %s", path);
    }
    char *header = NULL;
    loom_status status = st_read_header_bytes(st, &header);
    if (status == LOOM_OK) status = st_parse_header(st, header);
    free(header);
    if (status != LOOM_OK) {
        loom_safetensors_close(st);
        return status;
    }
    *out = st;
    return LOOM_OK;
}

/* ---- reading tensors --------------------------------------------------------------------- */

static loom_status st_read_floats(loom_safetensors *st, const char *name, float *dst, size_t n) {
    if (n && fread(dst, sizeof(float), n, st->file) != n) {
        return loom_fail(LOOM_ERR_IO, "%s: tensor '%s': read of %zu floats failed (%s)", st->path,
                         name, n, ferror(st->file) ? strerror(errno) : "file shorter than at open");
    }
    f32_swap_if_big_endian(dst, n);
    return LOOM_OK;
}

/* n stored elements of `dtype` (F32, or BF16 widened exactly: its bits are a float's upper
 * half) into dst. BF16's are read into dst's upper half and widened front to back: element i's
 * float ends at byte 4i + 4, never past the next unread one's 2n + 2(i + 1). */
static loom_status st_read_elements(loom_safetensors *st, const char *name, loom_dtype dtype,
                                    float *dst, size_t n) {
    if (dtype == LOOM_DTYPE_F32) return st_read_floats(st, name, dst, n);
    unsigned char *half = (unsigned char *)dst + 2 * n;
    if (n && fread(half, 2, n, st->file) != n) {
        return loom_fail(LOOM_ERR_IO, "%s: tensor '%s': read of %zu bf16 values failed (%s)",
                         st->path, name, n,
                         ferror(st->file) ? strerror(errno) : "file shorter than at open");
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = ((uint32_t)half[2 * i] | (uint32_t)half[2 * i + 1] << 8) << 16;
        memcpy(&dst[i], &bits, sizeof bits);
    }
    return LOOM_OK;
}

/* Stored (rows, cols) -> dst (cols, rows), a block of stored rows at a time. */
static loom_status st_read_transposed(loom_safetensors *st, const char *name, loom_dtype dtype,
                                      size_t rows, size_t cols, float *dst) {
    if (rows == 0 || cols == 0) return LOOM_OK;
    size_t block = cols >= SCRATCH_FLOATS ? 1 : SCRATCH_FLOATS / cols;
    if (block > rows) block = rows;
    float *scratch = loom_malloc(block * cols * sizeof(float), "transpose scratch");
    if (!scratch) return LOOM_ERR_NOMEM;
    loom_status status = LOOM_OK;
    for (size_t r0 = 0; r0 < rows && status == LOOM_OK; r0 += block) {
        size_t nr = rows - r0 < block ? rows - r0 : block;
        status = st_read_elements(st, name, dtype, scratch, nr * cols);
        for (size_t c = 0; c < cols && status == LOOM_OK; c++) {
            float *out = dst + c * rows + r0;
            const float *in = scratch + c;
            for (size_t r = 0; r < nr; r++) out[r] = in[r * cols];
        }
    }
    free(scratch);
    return status;
}

loom_status loom_safetensors_read_f32(loom_safetensors *st, const char *name, int ndim,
                                      const int64_t *shape, int transpose, float *dst) {
    const loom_st_entry *e = loom_safetensors_find(st, name);
    char want[200], have[200];
    if (!e) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s' not found (the file holds %d tensors)",
                         st->path, name, st->count);
    }
    if (e->dtype != LOOM_DTYPE_F32 && e->dtype != LOOM_DTYPE_BF16) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': dtype %s, expected F32 or BF16 (widened to float32)",
                         st->path, name, loom_dtype_name(e->dtype));
    }
    if (ndim < 0 || ndim > LOOM_ST_MAX_DIMS) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': asked for %d dims, expected 0..%d",
                         st->path, name, ndim, LOOM_ST_MAX_DIMS);
    }
    int same = e->ndim == ndim;
    for (int i = 0; i < ndim && same; i++) same = e->shape[i] == shape[i];
    if (!same) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': expected shape %s, found %s", st->path,
                         name, shape_str(want, sizeof want, ndim, shape),
                         shape_str(have, sizeof have, e->ndim, e->shape));
    }
    if (transpose && ndim != 2) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': a transposed read needs a 2-D tensor, shape is %s",
                         st->path, name, shape_str(have, sizeof have, e->ndim, e->shape));
    }
    uint64_t bytes = e->end - e->begin;
    if (bytes > SIZE_MAX || st->data_start + e->begin > (uint64_t)INT64_MAX) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': too large for this machine", st->path,
                         name);
    }
    if (fseeko(st->file, (off_t)(st->data_start + e->begin), SEEK_SET) != 0) {
        return loom_fail(LOOM_ERR_IO, "%s: tensor '%s': seek failed: %s", st->path, name,
                         strerror(errno));
    }
    if (transpose) {
        return st_read_transposed(st, name, e->dtype, (size_t)shape[0], (size_t)shape[1], dst);
    }
    return st_read_elements(st, name, e->dtype, dst, (size_t)(bytes / loom_dtype_size(e->dtype)));
}

/* ---- writing ----------------------------------------------------------------------------- */

/* Checks one tensor to be written and returns its byte count. */
/* Set while a fill callback provides the data (the table then carries shapes only). */
static _Thread_local int st_data_may_be_null;

static loom_status st_check_tensor(const char *path, int index, const loom_st_tensor *t,
                                   uint64_t *bytes) {
    const char *name = t->name ? t->name : "(null)";
    if (!t->name || strcmp(t->name, "__metadata__") == 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensors[%d]: name '%s' is missing or reserved", path,
                         index, name);
    }
    if (t->ndim < 0 || t->ndim > LOOM_ST_MAX_DIMS) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': ndim %d, expected 0..%d", path, name,
                         t->ndim, LOOM_ST_MAX_DIMS);
    }
    if (t->transpose && t->ndim != 2) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: tensor '%s': transpose needs a 2-D tensor, ndim is %d", path, name,
                         t->ndim);
    }
    uint64_t elements = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || !mul_u64(elements, (uint64_t)t->shape[i], &elements)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: tensor '%s': shape[%d] = %lld is negative or overflows the "
                             "element count",
                             path, name, i, (long long)t->shape[i]);
        }
    }
    if (!mul_u64(elements, sizeof(float), bytes) || *bytes > (uint64_t)INT64_MAX ||
        *bytes > SIZE_MAX) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': too large", path, name);
    }
    if (elements > 0 && !t->data && !st_data_may_be_null) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s': data is NULL", path, name);
    }
    return LOOM_OK;
}

static int is_utf8(const char *text) {
    json_t *probe = json_string(text); /* NULL for invalid UTF-8 */
    json_decref(probe);
    return probe != NULL;
}

static loom_status st_build_metadata(const char *path, json_t *root, const char *const *meta,
                                     int meta_count) {
    if (meta_count == 0) return LOOM_OK;
    json_t *object = json_object();
    if (!object || json_object_set_new(root, "__metadata__", object) != 0) {
        return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory building the header", path);
    }
    for (int i = 0; i < meta_count; i++) {
        const char *key = meta[2 * i], *value = meta[2 * i + 1];
        if (!key || !value || !is_utf8(key) || !is_utf8(value)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: metadata pair %d: key and value must be non-NULL UTF-8 strings",
                             path, i);
        }
        if (json_object_get(object, key)) {
            return loom_fail(LOOM_ERR_INPUT, "%s: metadata key \"%s\" given twice", path, key);
        }
        if (json_object_set_new(object, key, json_string(value)) != 0) {
            return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory building the header", path);
        }
    }
    return LOOM_OK;
}

static loom_status st_build_entry(const char *path, json_t *root, const loom_st_tensor *t,
                                  uint64_t begin, uint64_t end) {
    if (!is_utf8(t->name)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor name '%s' is not valid UTF-8", path, t->name);
    }
    if (json_object_get(root, t->name)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s' given twice", path, t->name);
    }
    json_t *shape = json_array();
    for (int i = 0; shape && i < t->ndim; i++) {
        if (json_array_append_new(shape, json_integer((json_int_t)t->shape[i])) != 0) {
            json_decref(shape);
            shape = NULL;
        }
    }
    json_t *entry = json_pack("{s:s, s:o*, s:[I, I]}", "dtype", "F32", "shape", shape,
                              "data_offsets", (json_int_t)begin, (json_int_t)end);
    if (!shape || !entry || json_object_set_new(root, t->name, entry) != 0) {
        return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory building the header", path);
    }
    return LOOM_OK;
}

/* The header JSON, padded with spaces to a multiple of 8 bytes; *text is malloc'ed. */
static loom_status st_build_header(const char *path, const loom_st_tensor *tensors, int count,
                                   const char *const *meta, int meta_count, char **text,
                                   size_t *padded_len) {
    *text = NULL;
    json_t *root = json_object();
    if (!root) return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory building the header", path);
    loom_status status = st_build_metadata(path, root, meta, meta_count);
    uint64_t offset = 0;
    for (int i = 0; i < count && status == LOOM_OK; i++) {
        uint64_t bytes = 0;
        status = st_check_tensor(path, i, &tensors[i], &bytes);
        if (status == LOOM_OK && bytes > (uint64_t)INT64_MAX - offset) {
            status = loom_fail(LOOM_ERR_INPUT, "%s: the tensors' total size overflows", path);
        }
        if (status == LOOM_OK)
            status = st_build_entry(path, root, &tensors[i], offset, offset + bytes);
        offset += bytes;
    }
    char *json = status == LOOM_OK ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (status != LOOM_OK) return status;
    if (!json) return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory building the header", path);
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    char *out = realloc(json, padded + 1);
    if (!out) {
        free(json);
        return loom_fail(LOOM_ERR_NOMEM, "%s: out of memory building the header", path);
    }
    memset(out + len, ' ', padded - len);
    out[padded] = '\0';
    *text = out;
    *padded_len = padded;
    return LOOM_OK;
}

static int st_write_floats(FILE *f, const float *data, size_t n, float *scratch, size_t scratch_n) {
#if HOST_BIG_ENDIAN
    for (size_t done = 0; done < n;) {
        size_t k = n - done < scratch_n ? n - done : scratch_n;
        memcpy(scratch, data + done, k * sizeof(float));
        f32_swap_if_big_endian(scratch, k);
        if (fwrite(scratch, sizeof(float), k, f) != k) return 0;
        done += k;
    }
    return 1;
#else
    (void)scratch;
    (void)scratch_n;
    return n == 0 || fwrite(data, sizeof(float), n, f) == n; /* data may be NULL if n == 0 */
#endif
}

/* Memory (cols, rows) -> stored (rows, cols), a block of stored rows at a time. */
static int st_write_transposed(FILE *f, const float *data, size_t rows, size_t cols, float *scratch,
                               size_t scratch_n) {
    if (rows == 0 || cols == 0) return 1;
    size_t block = scratch_n / cols;
    if (block > rows) block = rows;
    for (size_t r0 = 0; r0 < rows; r0 += block) {
        size_t nr = rows - r0 < block ? rows - r0 : block;
        for (size_t c = 0; c < cols; c++) {
            const float *in = data + c * rows + r0;
            float *out = scratch + c;
            for (size_t r = 0; r < nr; r++) out[r * cols] = in[r];
        }
        f32_swap_if_big_endian(scratch, nr * cols);
        if (fwrite(scratch, sizeof(float), nr * cols, f) != nr * cols) return 0;
    }
    return 1;
}

loom_status loom_safetensors_write(const char *path, const loom_st_tensor *tensors, int count,
                                   const char *const *meta, int meta_count) {
    return loom_safetensors_write_fill(path, tensors, count, meta, meta_count, NULL, NULL);
}

loom_status loom_safetensors_write_fill(const char *path, const loom_st_tensor *tensors, int count,
                                        const char *const *meta, int meta_count, loom_st_fill fill,
                                        void *ctx) {
    if (count < 0 || meta_count < 0 || (count > 0 && !tensors) || (meta_count > 0 && !meta)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: bad arguments (count %d, meta_count %d)", path, count,
                         meta_count);
    }
    char *header = NULL;
    size_t header_len = 0;
    st_data_may_be_null = fill != NULL;
    loom_status status =
        st_build_header(path, tensors, count, meta, meta_count, &header, &header_len);
    st_data_may_be_null = 0;
    if (status != LOOM_OK) return status;

    /* One scratch buffer, large enough for a row of the widest transposed tensor. */
    size_t scratch_n = SCRATCH_FLOATS;
    for (int i = 0; i < count; i++) {
        if (tensors[i].transpose && (size_t)tensors[i].shape[1] > scratch_n) {
            scratch_n = (size_t)tensors[i].shape[1];
        }
    }
    float *scratch = loom_malloc(scratch_n * sizeof(float), "safetensors write scratch");
    loom_atomic_file *af = NULL;
    if (!scratch) status = LOOM_ERR_NOMEM;
    if (status == LOOM_OK) status = loom_atomic_open(&af, path);
    if (status != LOOM_OK) {
        free(scratch);
        free(header);
        return status;
    }
    FILE *f = loom_atomic_stream(af);
    unsigned char prefix[8];
    store_le64(prefix, header_len);
    int ok = fwrite(prefix, 1, 8, f) == 8 && fwrite(header, 1, header_len, f) == header_len;
    loom_status fill_status = LOOM_OK;
    for (int i = 0; i < count && ok; i++) {
        const loom_st_tensor *t = &tensors[i];
        size_t elements = 1;
        for (int d = 0; d < t->ndim; d++) elements *= (size_t)t->shape[d];
        const float *data = t->data;
        if (fill) {
            data = fill(ctx, i);
            if (!data && elements > 0) {
                fill_status = LOOM_ERR_RUNTIME;
                ok = 0;
                break;
            }
        }
        if (t->transpose) {
            ok = st_write_transposed(f, data, (size_t)t->shape[0], (size_t)t->shape[1], scratch,
                                     scratch_n);
        } else {
            ok = st_write_floats(f, data, elements, scratch, scratch_n);
        }
    }
    free(scratch);
    free(header);
    if (!ok) {
        /* a failed fill has recorded its own message */
        status = fill_status != LOOM_OK
                     ? fill_status
                     : loom_fail(LOOM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        loom_atomic_abort(af);
        return status;
    }
    return loom_atomic_commit(af);
}
