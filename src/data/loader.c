/*
 * loader.c — deterministic sample order over a dataset. Windows of seq_len+1 tokens start at
 * multiples of seq_len. In shuffle mode an epoch's order is a Fisher–Yates permutation of the
 * identity driven by a generator seeded from (seed, epoch) alone, so the position (epoch,
 * index) is the loader's whole state: resuming from a checkpoint rebuilds the permutation and
 * continues exactly where the interrupted run would have.
 *
 * The loader works in global token positions (window w starts at w*seq_len) and leaves it to the
 * dataset to find the file, so a window may straddle two shards. Only the token count decides
 * the windows, which is why a loader over a described dataset keeps the same positions.
 *
 * Not here: splitting batches across ranks (the caller reads or skips windows) or any check of
 * token values (the dataset did that when it was opened).
 */
#include "loom/data.h"

#include <stdlib.h>
#include <string.h>

struct loom_loader {
    const loom_dataset *ds; /* borrowed */
    uint32_t *window;       /* (seq_len + 1,) the window being copied out */
    size_t num_windows;
    int seq_len; /* T */
    int shuffle;
    uint64_t seed;
    loom_loader_pos pos;
    size_t *order; /* (num_windows,) the current epoch's window order; NULL in sequential mode */
};

/* Uniform in [0, bound) without modulo bias: draws below 2^64 mod bound are rejected. */
static uint64_t rng_below(loom_rng *rng, uint64_t bound) {
    uint64_t reject_below = (0 - bound) % bound;
    for (;;) {
        uint64_t r = loom_rng_next(rng);
        if (r >= reject_below) return r % bound;
    }
}

static void build_epoch_order(loom_loader *ld) {
    size_t n = ld->num_windows;
    for (size_t i = 0; i < n; i++) ld->order[i] = i;
    loom_rng rng;
    loom_rng_seed(&rng, loom_rng_u64(ld->seed, LOOM_LOADER_RNG_STREAM, ld->pos.epoch));
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng_below(&rng, i);
        size_t tmp = ld->order[i - 1];
        ld->order[i - 1] = ld->order[j];
        ld->order[j] = tmp;
    }
}

loom_status loom_loader_create(loom_loader **out, const loom_dataset *ds, int seq_len, int shuffle,
                               uint64_t seed) {
    *out = NULL;
    if (seq_len < 1) {
        return loom_fail(LOOM_ERR_INPUT, "%s: sequence length: expected >= 1, got %d",
                         loom_dataset_pattern(ds), seq_len);
    }
    size_t tokens = loom_dataset_num_tokens(ds);
    size_t windows = tokens > 0 ? (tokens - 1) / (size_t)seq_len : 0;
    if (windows < 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %zu tokens is too few for one sample of sequence length %d "
                         "(needs %lld tokens)",
                         loom_dataset_pattern(ds), tokens, seq_len, (long long)seq_len + 1);
    }
    loom_loader *ld = loom_calloc(1, sizeof *ld, "loader");
    if (!ld) return LOOM_ERR_NOMEM;
    ld->ds = ds;
    ld->num_windows = windows;
    ld->seq_len = seq_len;
    ld->shuffle = shuffle != 0;
    ld->seed = seed;
    ld->window = loom_malloc(((size_t)seq_len + 1) * sizeof *ld->window, "loader window");
    if (ld->window && ld->shuffle) {
        ld->order = loom_malloc(windows * sizeof *ld->order, "loader window order");
    }
    if (!ld->window || (ld->shuffle && !ld->order)) {
        loom_loader_free(ld);
        return LOOM_ERR_NOMEM;
    }
    if (ld->shuffle) build_epoch_order(ld);
    *out = ld;
    return LOOM_OK;
}

void loom_loader_free(loom_loader *ld) {
    if (!ld) return;
    free(ld->order);
    free(ld->window);
    free(ld);
}

size_t loom_loader_num_windows(const loom_loader *ld) {
    return ld->num_windows;
}

loom_status loom_loader_next(loom_loader *ld, int batch, int32_t *inputs, int32_t *targets) {
    size_t T = (size_t)ld->seq_len;
    for (int b = 0; b < batch; b++) {
        size_t window = ld->shuffle ? ld->order[ld->pos.index] : (size_t)ld->pos.index;
        /* In range by construction (window*T + T + 1 <= num_windows*T + 1 <= num_tokens), so
         * this fails only on a described dataset, and then at the first window. */
        loom_status status = loom_dataset_read(ld->ds, window * T, T + 1, ld->window);
        if (status != LOOM_OK) return status;
        /* The dataset checked every token against the vocabulary, an int: each fits int32. */
        const uint32_t *src = ld->window;
        int32_t *in = inputs + (size_t)b * T, *tgt = targets + (size_t)b * T;
        for (size_t t = 0; t < T; t++) {
            in[t] = (int32_t)src[t];
            tgt[t] = (int32_t)src[t + 1];
        }
        loom_loader_skip(ld, 1);
    }
    return LOOM_OK;
}

void loom_loader_skip(loom_loader *ld, uint64_t count) {
    uint64_t n = ld->num_windows;
    uint64_t steps = ld->pos.index + count % n; /* < 2n, no overflow */
    uint64_t epochs = count / n + steps / n;
    ld->pos.index = steps % n;
    if (epochs > 0) {
        ld->pos.epoch += epochs;
        if (ld->shuffle) build_epoch_order(ld);
    }
}

loom_loader_pos loom_loader_get_pos(const loom_loader *ld) {
    return ld->pos;
}

loom_status loom_loader_set_pos(loom_loader *ld, loom_loader_pos pos) {
    if (pos.index >= ld->num_windows) {
        return loom_fail(LOOM_ERR_INPUT,
                         "loader position: index expected < %zu windows, got %llu (was the "
                         "checkpoint made with other data or another sequence length?)",
                         ld->num_windows, (unsigned long long)pos.index);
    }
    int new_epoch = pos.epoch != ld->pos.epoch;
    ld->pos = pos;
    if (ld->shuffle && new_epoch) build_epoch_order(ld);
    return LOOM_OK;
}
