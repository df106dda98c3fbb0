/*
 * json_fields.c — reading the fields of loom's JSON inputs (the plan file, the cluster
 * description) with one message per problem, "FILE: JSON.PATH: expected ..., got VALUE", where
 * VALUE is the value as it appears in the file; unknown keys are named with the keys that are
 * known; malformed JSON names the line and column. And the double format both files are written
 * with (the shortest text that reads back equal).
 *
 * Not here: what the fields mean (plan_file.c, cluster.c).
 */
#include "plan/plan_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

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
    return loom_plan_fail_field(file, path, "expected %s, got %s", expected, got);
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
        return loom_plan_fail_field(file, field, "unknown key (expected one of: %s)", list);
    }
    return LOOM_OK;
}

loom_status loom_json_member(const char *file, const json_t *object, const char *parent,
                             const char *key, int required, const char *expected, json_t **out) {
    *out = json_object_get(object, key);
    if (*out || !required) return LOOM_OK;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    return loom_plan_fail_field(file, path, "missing (expected %s)", expected);
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
