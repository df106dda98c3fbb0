/*
 * plan_internal.h — what plan.c (the rules, building, rank layout), plan_file.c (JSON reading
 * and writing) and compression_flags.c share: the plan's lists of allowed words and the
 * methods' ranks. The field readers they use are base/json_fields.h's.
 */
#ifndef LOOM_PLAN_INTERNAL_H
#define LOOM_PLAN_INTERNAL_H

#include "loom/compress.h"
#include "loom/plan.h"
#include "base/json_fields.h"

#include <jansson.h>
#include <stddef.h>

/* The allowed values of the plan's word-valued fields. */
extern const loom_words loom_plan_schedules;        /* batch.schedule */
extern const loom_words loom_plan_policies;         /* compression.pp.policy */
extern const loom_words loom_plan_embedding_syncs;  /* compression.embedding_sync */
extern const loom_words loom_plan_recomputes;       /* stages[i].recompute */
extern const loom_words loom_plan_zero3_gathers;    /* mesh.zero3_gather */
extern const loom_words loom_plan_outer_optimizers; /* islands.outer_optimizer */
/* (The compression methods are compress/methods.c's: loom_compress_method_parse.) */

/* Whether the method needs a rank > 0 (powersgd, lowrank). */
int loom_plan_method_has_rank(loom_compress_method method);
/* The rank a method gets when none is given: LOOM_PLAN_DEFAULT_DP_RANK or _PP_RANK for the
 * low-rank methods, else 0. */
int loom_plan_default_rank(loom_compress_method method);

/* islands.c: the islands section's rules (count 0 passes). */
loom_status loom_plan_check_islands(const loom_plan *plan, const char *source);

#endif
