/*
 * model_internal.h — what gpt.c (the allocation) and cost.c (the cost facts) share: the list of
 * activation buffers, so that the memory the model allocates and the memory it reports are one
 * rule.
 */
#ifndef LOOM_MODEL_INTERNAL_H
#define LOOM_MODEL_INTERNAL_H

#include "loom/model.h"

/* encoded, the 15 per-block buffers (ln1 ... residual3), the 7 head buffers (lnf ... row_stats) */
#define LOOM_GPT_NUM_ACTS 23

/* Floats of each activation buffer of one slot, before rounding, in loom_gpt_acts order: for a
 * stage of `layers` blocks (all of one kind together) on one TP rank of degree tp, with the
 * head's buffers only on the head stage. */
void loom_gpt_act_floats(const loom_gpt_config *config, int64_t tp, int64_t layers, int has_head,
                         int64_t B, int64_t T, int64_t out[LOOM_GPT_NUM_ACTS]);

/* Each buffer starts 64-byte aligned: its floats rounded up to a multiple of 16. */
static inline int64_t loom_gpt_act_round(int64_t floats) {
    return (floats + 15) / 16 * 16;
}

#endif
