/*
 * json_fields.h — what every reader of loom's JSON inputs (the plan file, the cluster
 * description) shares, below both so that neither imports the other: the field-error message
 * ("FILE: JSON.PATH: expected ..., got VALUE"), lists of allowed words, and the JSON field
 * readers (json_fields.c). Private to loom's modules; a library caller never sees jansson.
 */
#ifndef LOOM_BASE_JSON_FIELDS_H
#define LOOM_BASE_JSON_FIELDS_H

#include "loom/base.h"

#include <jansson.h>
#include <stddef.h>

/* Records "SOURCE: PATH: DETAIL" as a LOOM_ERR_INPUT error and returns LOOM_ERR_INPUT. */
loom_status loom_fail_field(const char *source, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The allowed values of a word-valued field, in the order of the enum they name. */
typedef struct {
    const char *const *words;
    int count;
} loom_words;

/* The index of `value` among the words, -1 when it is none of them (or NULL). */
int loom_word_index(const loom_words *words, const char *value);
/* The word of `index`, "?" out of range (an enum's name). */
const char *loom_word_name(const loom_words *words, int index);
/* Whether `value` is one of the words. */
int loom_word_ok(const loom_words *words, const char *value);
/* `"a" or "b"` / `one of "a", "b" or "c"`, for messages. */
void loom_word_list(const loom_words *words, char *buf, size_t cap);
/* The index of `name` among the words into *index; anything else is "SOURCE: FIELD: expected
 * one of ..., got "NAME"" (LOOM_ERR_INPUT). */
loom_status loom_word_parse(const loom_words *words, const char *name, const char *source,
                            const char *field, int *index);

/* ---- JSON fields ------------------------------------------------------------------------------
 * `parent` is the JSON path of `object` ("" for the top level); every failure is one
 * loom_fail_field message naming `file` and the member's path. */

/* "FILE: PATH: expected EXPECTED, got VALUE" (VALUE as it appears in the file). */
loom_status loom_json_fail_type(const char *file, const char *path, const char *expected,
                                const json_t *value);
/* "parent.key" (or "key" at the top level) into buf[cap]. */
void loom_json_join_path(char *buf, size_t cap, const char *parent, const char *key);
/* Every key of `object` (at `path`) must be one of `keys` (n of them). */
loom_status loom_json_check_keys(const char *file, const json_t *object, const char *path,
                                 const char *const *keys, int n);
/* object[key] into *out, NULL when absent; a missing required key is "missing (expected
 * EXPECTED)". */
loom_status loom_json_member(const char *file, const json_t *object, const char *parent,
                             const char *key, int required, const char *expected, json_t **out);
loom_status loom_json_as_object(const char *file, const char *path, const json_t *value);
loom_status loom_json_as_int(const char *file, const char *path, const json_t *value, int *out);
/* An integer (a number) member; *out keeps its value when the key is absent and not required. */
loom_status loom_json_read_int(const char *file, const json_t *object, const char *parent,
                               const char *key, int required, int *out);
loom_status loom_json_read_number(const char *file, const json_t *object, const char *parent,
                                  const char *key, int required, double *out);
/* Reads and parses a whole file (duplicate keys refused); malformed JSON is "FILE:LINE:COLUMN:
 * invalid JSON: DETAIL". The caller json_decref()s *root. */
loom_status loom_json_load(const char *path, json_t **root);
/* The shortest %g form that reads back as the same double (finite values only). */
void loom_json_format_double(double value, char *buf, size_t cap);

#endif
