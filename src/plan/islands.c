/*
 * islands.c — the plan's islands section (loom_plan_islands): its defaults, its rules, and the
 * flags that ask for it. The file's reading and writing are plan_file.c's, the world-size and
 * batch rules that involve the island count plan.c's check_mesh.
 */
#include "plan/plan_internal.h"

#include <string.h>

static const char *const outer_optimizer_words[] = {"nesterov", "sgd"};
const loom_words loom_plan_outer_optimizers = {outer_optimizer_words, LOOM_OUTER_COUNT};

const char *loom_outer_optimizer_name(loom_outer_optimizer optimizer) {
    return loom_word_name(&loom_plan_outer_optimizers, (int)optimizer);
}

void loom_plan_islands_init(loom_plan_islands *islands) {
    memset(islands, 0, sizeof *islands);
    islands->inner_steps = LOOM_PLAN_DEFAULT_INNER_STEPS;
    islands->optimizer = LOOM_OUTER_NESTEROV;
    islands->lr = LOOM_PLAN_DEFAULT_OUTER_LR;
    islands->momentum = LOOM_PLAN_DEFAULT_OUTER_MOMENTUM;
    islands->fragments = 1;
    islands->compression = LOOM_COMPRESS_NONE;
}

int loom_plan_islands_by_matrix(const loom_plan_islands *islands) {
    return islands->compression == LOOM_COMPRESS_POWERSGD ||
           islands->compression == LOOM_COMPRESS_TOPK;
}

int loom_plan_num_islands(const loom_plan *plan) {
    return plan->islands.count > 0 ? plan->islands.count : 1;
}

int64_t loom_plan_job_ranks(const loom_plan *plan) {
    return (int64_t)loom_plan_num_islands(plan) * plan->dp * plan->tp * plan->pp;
}

loom_status loom_plan_check_islands(const loom_plan *p, const char *source) {
    const loom_plan_islands *is = &p->islands;
    if (is->count < 0) {
        return loom_fail_field(source, "islands.count",
                               "expected a positive number of islands, got %d", is->count);
    }
    if (is->count == 0) return LOOM_OK;
    if (is->inner_steps < 1) {
        return loom_fail_field(source, "islands.inner_steps",
                               "expected at least 1 inner step a round, got %d", is->inner_steps);
    }
    loom_status st = LOOM_OK;
    if ((int)is->optimizer < 0 || is->optimizer >= LOOM_OUTER_COUNT) {
        char list[64];
        loom_word_list(&loom_plan_outer_optimizers, list, sizeof list);
        return loom_fail_field(source, "islands.outer_optimizer", "expected %s, got %d", list,
                               (int)is->optimizer);
    }
    if (!(is->lr > 0) || !(is->lr < 1e6)) {
        return loom_fail_field(source, "islands.outer_lr",
                               "expected a positive learning rate, got %g", is->lr);
    }
    if (!(is->momentum >= 0) || !(is->momentum < 1)) {
        return loom_fail_field(source, "islands.outer_momentum",
                               "expected a value in [0, 1), got %g", is->momentum);
    }
    int layers = p->model.num_layers;
    if (is->fragments < 1 || is->fragments > layers || is->fragments > is->inner_steps) {
        return loom_fail_field(source, "islands.fragments",
                               "expected 1 to %d fragments (at most model.layers %d, each a "
                               "group of whole layers, and at most islands.inner_steps %d, each "
                               "syncing at its own step of the round), got %d",
                               layers < is->inner_steps ? layers : is->inner_steps, layers,
                               is->inner_steps, is->fragments);
    }
    if (is->overlap_steps < 0 || is->overlap_steps >= is->inner_steps) {
        return loom_fail_field(source, "islands.overlap_steps",
                               "expected 0 to %d inner steps a sync runs behind (fewer than "
                               "islands.inner_steps %d: a fragment's sync lands before its next "
                               "one is sent), got %d",
                               is->inner_steps - 1, is->inner_steps, is->overlap_steps);
    }
    loom_compress_method c = is->compression;
    if (c != LOOM_COMPRESS_NONE && c != LOOM_COMPRESS_INT8 && c != LOOM_COMPRESS_BF16 &&
        c != LOOM_COMPRESS_POWERSGD && c != LOOM_COMPRESS_TOPK) {
        return loom_fail_field(source, "islands.compression",
                               "\"%s\" outer gradients are not built yet; expected none, int8, "
                               "bf16, powersgd or topk",
                               loom_compress_method_name(c));
    }
    int powersgd = c == LOOM_COMPRESS_POWERSGD, topk = c == LOOM_COMPRESS_TOPK;
    if (powersgd != (is->compression_rank > 0)) {
        return loom_fail_field(source, "islands.compression_rank",
                               "expected a positive rank with powersgd outer gradients and none "
                               "otherwise, got %d with \"%s\"",
                               is->compression_rank, loom_compress_method_name(c));
    }
    if (topk ? !(is->compression_fraction > 0 && is->compression_fraction <= 1)
             : is->compression_fraction != 0) {
        return loom_fail_field(source, "islands.compression_fraction",
                               "expected the share of entries kept, in (0, 1], with topk outer "
                               "gradients and none otherwise, got %g with \"%s\"",
                               is->compression_fraction, loom_compress_method_name(c));
    }
    return st;
}

loom_status loom_plan_islands_from_flags(const loom_layout_flags *f, loom_plan_islands *out) {
    loom_plan_islands_init(out);
    if (f->islands < 0) {
        return loom_fail(LOOM_ERR_INPUT, "--islands: expected a positive number, got %d",
                         f->islands);
    }
    if (f->islands == 0) {
        loom_layout_flags d;
        loom_layout_flags_defaults(&d);
        const char *given =
            f->inner_steps != d.inner_steps                         ? "--inner-steps"
            : f->outer_optimizer[0]                                 ? "--outer-optimizer"
            : f->outer_lr != d.outer_lr                             ? "--outer-lr"
            : f->outer_momentum != d.outer_momentum                 ? "--outer-momentum"
            : f->outer_fragments != d.outer_fragments               ? "--outer-fragments"
            : f->outer_overlap_steps                                ? "--outer-overlap-steps"
            : f->outer_compression[0]                               ? "--outer-compression"
            : f->outer_compression_rank != d.outer_compression_rank ? "--outer-compression-rank"
            : f->outer_topk_fraction != d.outer_topk_fraction       ? "--outer-topk-fraction"
                                                                    : NULL;
        if (given) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: expected only with --islands K (it sets how islands sync)",
                             given);
        }
        return LOOM_OK;
    }
    out->count = f->islands;
    out->inner_steps = f->inner_steps; /* checked with the plan (loom_plan_check_islands) */
    out->lr = f->outer_lr;
    out->momentum = f->outer_momentum;
    out->fragments = f->outer_fragments;
    out->overlap_steps = f->outer_overlap_steps;
    loom_status st = LOOM_OK;
    if (f->outer_optimizer[0]) {
        int index = 0;
        st = loom_word_parse(&loom_plan_outer_optimizers, f->outer_optimizer, "--outer-optimizer",
                             "islands.outer_optimizer", &index);
        out->optimizer = (loom_outer_optimizer)index;
    }
    if (st == LOOM_OK && f->outer_compression[0]) {
        st = loom_compress_method_parse(f->outer_compression, LOOM_COMPRESS_FOR_DP,
                                        "--outer-compression", "islands.compression",
                                        &out->compression);
    }
    if (out->compression == LOOM_COMPRESS_POWERSGD) {
        out->compression_rank = f->outer_compression_rank;
    } else if (st == LOOM_OK && f->outer_compression_rank != LOOM_PLAN_DEFAULT_DP_RANK) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--outer-compression-rank: expected only with --outer-compression "
                         "powersgd");
    }
    if (out->compression == LOOM_COMPRESS_TOPK) {
        out->compression_fraction = f->outer_topk_fraction;
    } else if (st == LOOM_OK && f->outer_topk_fraction != LOOM_PLAN_DEFAULT_TOPK_FRACTION) {
        return loom_fail(LOOM_ERR_INPUT,
                         "--outer-topk-fraction: expected only with --outer-compression topk");
    }
    return st;
}
