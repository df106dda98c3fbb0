/*
 * plan_internal.h — what plan.c (the rules, building, rank layout), plan_file.c (JSON reading
 * and writing), compression_flags.c and cluster.c share: the field-error message, the lists of
 * allowed words, the methods' ranks, and the JSON field readers (json_fields.c).
 */
#ifndef LOOM_PLAN_INTERNAL_H
#define LOOM_PLAN_INTERNAL_H

#include "loom/compress.h"
#include "loom/plan.h"

#include <jansson.h>
#include <stddef.h>

/* The allowed values of the plan's word-valued fields. */
typedef struct {
    const char *const *words;
    int count;
} loom_plan_words;

extern const loom_plan_words loom_plan_schedules;       /* batch.schedule */
extern const loom_plan_words loom_plan_policies;        /* compression.pp.policy */
extern const loom_plan_words loom_plan_embedding_syncs; /* compression.embedding_sync */
/* (The compression methods are compress/methods.c's: loom_compress_method_parse.) */

/* Whether `value` is one of the words. */
int loom_plan_word_ok(const loom_plan_words *words, const char *value);
/* `"a" or "b"` / `one of "a", "b" or "c"`, for messages. */
void loom_plan_word_list(const loom_plan_words *words, char *buf, size_t cap);
/* Whether the method needs a rank > 0 (powersgd, lowrank). */
int loom_plan_method_has_rank(loom_compress_method method);
/* The rank a method gets when none is given: LOOM_PLAN_DEFAULT_DP_RANK or _PP_RANK for the
 * low-rank methods, else 0. */
int loom_plan_default_rank(loom_compress_method method);

/* Records "SOURCE: PATH: DETAIL" as a LOOM_ERR_INPUT error and returns LOOM_ERR_INPUT. */
loom_status loom_plan_fail_field(const char *source, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- JSON fields (json_fields.c): what plan_file.c and cluster.c read with ------------------
 * `parent` is the JSON path of `object` ("" for the top level); every failure is one
 * loom_plan_fail_field message naming `file` and the member's path. */

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
