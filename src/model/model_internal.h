/*
 * model_internal.h — what gpt.c (the allocation) and cost.c (the cost facts) share: the list of
 * activation buffers, so that the memory the model allocates and the memory it reports are one
 * rule.
 */
#ifndef LOOM_MODEL_INTERNAL_H
#define LOOM_MODEL_INTERNAL_H

#include "loom/model.h"

/* encoded, the 15 per-block buffers (ln1 ... residual3), the 7 head buffers (lnf ... row_stats),
 * the 5 a split backward keeps for W (dfcproj ... dencoded) */
#define LOOM_GPT_NUM_ACTS 28

/* What one activation slot holds. */
typedef struct {
    int64_t tp;        /* tensor-parallel degree: buffers have this rank's widths */
    int64_t layers;    /* blocks */
    int has_embedding; /* the embedding's W buffer (dencoded), when split */
    int has_head;      /* the head's buffers */
    int split;         /* B keeps what W needs */
    int64_t B, T;
    int selective;         /* the attention's softmax is not kept per layer (recomputed) */
    int sequence_parallel; /* the regions outside the GEMMs hold this rank's 1/tp of the rows */
} loom_gpt_slot_shape;

/* Floats of each activation buffer of one slot, before rounding, in loom_gpt_acts order (the
 * per-block buffers for all `layers` blocks together); 0 for a buffer the slot does not hold. */
void loom_gpt_act_floats(const loom_gpt_config *config, const loom_gpt_slot_shape *slot,
                         int64_t out[LOOM_GPT_NUM_ACTS]);

/* Backward's scratch for micro-batches of N rows (loom_gpt_grad_acts' seven buffers, in order:
 * dresidual, dbtc, dbtc2, dqkv, dfch, dfch2, dnorm), in floats. */
#define LOOM_GPT_GRAD_SCRATCH 7
void loom_gpt_grad_scratch_floats(const loom_gpt_config *config, int64_t N, int sequence_parallel,
                                  int64_t out[LOOM_GPT_GRAD_SCRATCH]);

/* Each buffer starts 64-byte aligned: its floats rounded up to a multiple of 16. */
static inline int64_t loom_gpt_act_round(int64_t floats) {
    return (floats + 15) / 16 * 16;
}

#endif
