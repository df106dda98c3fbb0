/*
 * optimizer.c — AdamW over the range of the flat parameter buffer this rank updates (the whole
 * model, or its ZeRO-1 shard), segment by segment so that weight decay applies to 2-D weights
 * only; global-norm clipping arrives as a gradient scale.
 */
#include "train/train_internal.h"

void loom_adamw_free(loom_adamw *opt) {
    loom_free_aligned(opt->m);
    loom_free_aligned(opt->v);
    opt->m = opt->v = NULL;
}

loom_status loom_adamw_create(loom_adamw *opt, loom_zero_shard range) {
    opt->range = range;
    opt->m = loom_alloc_aligned(range.shard * sizeof(float), "AdamW first moment");
    opt->v = loom_alloc_aligned(range.shard * sizeof(float), "AdamW second moment");
    if (!opt->m || !opt->v) {
        loom_adamw_free(opt);
        return LOOM_ERR_NOMEM;
    }
    return LOOM_OK;
}

void loom_adamw_step(loom_adamw *opt, loom_gpt *model, const float *grads,
                     const loom_train_config *cfg, double lr, int64_t update, float grad_scale) {
    size_t lo = opt->range.begin, hi = opt->range.end;
    for (int i = 0; i < model->num_segments; i++) {
        const loom_gpt_segment *seg = &model->segments[i];
        size_t a = seg->offset > lo ? seg->offset : lo;
        size_t b = seg->offset + (size_t)seg->numel < hi ? seg->offset + (size_t)seg->numel : hi;
        if (a >= b) continue;
        model->backend->adamw_update(
            model->params_memory + (a - model->params_begin), grads + (a - lo), opt->m + (a - lo),
            opt->v + (a - lo), (int64_t)(b - a), (float)lr, (float)cfg->beta1, (float)cfg->beta2,
            (float)cfg->eps, seg->decay ? (float)cfg->weight_decay : 0.0f, update, grad_scale);
    }
}
