/*
 * json_fields.c — reading the fields of loom's JSON inputs (the plan file, the cluster
 * description) with one message per problem, "FILE: JSON.PATH: expected ..., got VALUE", where
 * VALUE is the value as it appears in the file; unknown keys are named with the keys that are
 * known; malformed JSON names the line and column. And the double format both files are written
 * with (the shortest text that reads back equal).
 *
 * Also the words of word-valued fields, and the precisions every description names.
 *
 * Not here: what the fields mean (plan/plan_file.c, cluster/cluster.c).
 */
#include "base/json_fields.h"

#include <stdarg.h>

#include <limits.h>
#include <stdlib.h>
#include <string.h>

loom_status loom_fail_field(const char *source, const char *path, const char *fmt, ...) {
    char detail[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(detail, sizeof detail, fmt, args); /* NOLINT(clang-analyzer-valist.Uninitialized) */
    va_end(args);
    return loom_fail(LOOM_ERR_INPUT, "%s: %s: %s", source, path, detail);
}

/* ---- words -------------------------------------------------------------------------------- */

int loom_word_index(const loom_words *words, const char *value) {
    for (int i = 0; value && i < words->count; i++)
        if (strcmp(words->words[i], value) == 0) return i;
    return -1;
}

const char *loom_word_name(const loom_words *words, int index) {
    return index >= 0 && index < words->count ? words->words[index] : "?";
}

int loom_word_ok(const loom_words *words, const char *value) {
    return loom_word_index(words, value) >= 0;
}

void loom_word_list(const loom_words *words, char *buf, size_t cap) {
    size_t used = (size_t)snprintf(buf, cap, "%s", words->count > 2 ? "one of " : "");
    for (int i = 0; i < words->count && used < cap; i++) {
        const char *sep = i == 0 ? "" : i == words->count - 1 ? " or " : ", ";
        used += (size_t)snprintf(buf + used, cap - used, "%s\"%s\"", sep, words->words[i]);
    }
}

loom_status loom_word_parse(const loom_words *words, const char *name, const char *source,
                            const char *field, int *index) {
    int found = loom_word_index(words, name);
    if (found >= 0) {
        *index = found;
        return LOOM_OK;
    }
    char list[256];
    loom_word_list(words, list, sizeof list);
    return loom_fail_field(source, field, "expected %s, got \"%s\"", list, name ? name : "");
}

/* ---- precisions --------------------------------------------------------------------------- */

static const char *const precision_names[LOOM_PRECISIONS] = {"fp32", "bf16", "fp16"};
static const loom_words precision_words = {precision_names, LOOM_PRECISIONS};

loom_status loom_precision_parse(const char *name, const char *source, const char *field,
                                 loom_precision *precision) {
    int index = 0;
    loom_status st = loom_word_parse(&precision_words, name, source, field, &index);
    if (st == LOOM_OK) *precision = (loom_precision)index;
    return st;
}

const char *loom_precision_name(loom_precision precision) {
    return loom_word_name(&precision_words, (int)precision);
}

/* ---- JSON values -------------------------------------------------------------------------- */

/* A JSON value as it appears in the file (compact, at most about 60 characters), for "got". */
static void describe(const json_t *value, char *buf, size_t cap) {
    char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
        snprintf(buf, cap, "a value");
        return;
    }
    if (strlen(text) > 60) {
        snprintf(buf, cap, "%.57s...", text);
    } else {
        snprintf(buf, cap, "%s", text);
    }
    free(text);
}

loom_status loom_json_fail_type(const char *file, const char *path, const char *expected,
                                const json_t *value) {
    char got[80];
    describe(value, got, sizeof got);
    return loom_fail_field(file, path, "expected %s, got %s", expected, got);
}

void loom_json_join_path(char *buf, size_t cap, const char *parent, const char *key) {
    if (parent[0]) {
        snprintf(buf, cap, "%s.%s", parent, key);
    } else {
        snprintf(buf, cap, "%s", key);
    }
}

loom_status loom_json_check_keys(const char *file, const json_t *object, const char *path,
                                 const char *const *keys, int n) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)object, key, value) {
        int known = 0;
        for (int i = 0; i < n && !known; i++) known = strcmp(keys[i], key) == 0;
        if (known) continue;
        char list[256] = "";
        size_t used = 0;
        for (int i = 0; i < n && used < sizeof list; i++)
            used +=
                (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", keys[i]);
        char field[256];
        loom_json_join_path(field, sizeof field, path, key);
        return loom_fail_field(file, field, "unknown key (expected one of: %s)", list);
    }
    return LOOM_OK;
}

loom_status loom_json_member(const char *file, const json_t *object, const char *parent,
                             const char *key, int required, const char *expected, json_t **out) {
    *out = json_object_get(object, key);
    if (*out || !required) return LOOM_OK;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    return loom_fail_field(file, path, "missing (expected %s)", expected);
}

loom_status loom_json_as_object(const char *file, const char *path, const json_t *value) {
    return json_is_object(value) ? LOOM_OK : loom_json_fail_type(file, path, "an object", value);
}

loom_status loom_json_as_int(const char *file, const char *path, const json_t *value, int *out) {
    if (!json_is_integer(value) || json_integer_value(value) < INT_MIN ||
        json_integer_value(value) > INT_MAX) {
        return loom_json_fail_type(file, path, "an integer", value);
    }
    *out = (int)json_integer_value(value);
    return LOOM_OK;
}

loom_status loom_json_read_int(const char *file, const json_t *object, const char *parent,
                               const char *key, int required, int *out) {
    json_t *value;
    loom_status st = loom_json_member(file, object, parent, key, required, "an integer", &value);
    if (st != LOOM_OK || !value) return st;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    return loom_json_as_int(file, path, value, out);
}

loom_status loom_json_read_number(const char *file, const json_t *object, const char *parent,
                                  const char *key, int required, double *out) {
    json_t *value;
    loom_status st = loom_json_member(file, object, parent, key, required, "a number", &value);
    if (st != LOOM_OK || !value) return st;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    if (!json_is_number(value)) return loom_json_fail_type(file, path, "a number", value);
    *out = json_number_value(value);
    return LOOM_OK;
}

loom_status loom_json_load(const char *path, json_t **root) {
    *root = NULL;
    char *text = NULL;
    size_t size = 0;
    loom_status st = loom_read_file(path, &text, &size);
    if (st != LOOM_OK) return st;
    json_error_t err;
    *root = json_loadb(text, size, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!*root) {
        return loom_fail(LOOM_ERR_INPUT, "%s:%d:%d: invalid JSON: %s", path, err.line, err.column,
                         err.text);
    }
    return LOOM_OK;
}

void loom_json_format_double(double value, char *buf, size_t cap) {
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(buf, cap, "%.*g", precision, value);
        if (strtod(buf, NULL) == value) return;
    }
}
