/*
 * plan_internal.h — what plan.c (the rules, building, rank layout), plan_file.c (JSON reading
 * and writing) and compression_flags.c share: the field-error message, the lists of allowed
 * words, and the methods' ranks.
 */
#ifndef LOOM_PLAN_INTERNAL_H
#define LOOM_PLAN_INTERNAL_H

#include "loom/compress.h"
#include "loom/plan.h"

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

#endif
