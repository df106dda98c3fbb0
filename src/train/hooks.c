/*
 * hooks.c — failures and numeric trouble on demand, for the tests, read from the environment
 * once at start-up (never in the step loop).
 */
#include "train/train_internal.h"

#include <stdio.h>
#include <stdlib.h>

loom_test_hooks loom_test_hooks_read(void) {
    loom_test_hooks h = {.fail_rank = -1, .fail_step = -1};
    const char *env = getenv("LOOM_DEBUG_NAN_STEPS");
    for (const char *p = env ? env : ""; *p && h.num_nan_steps < 16;) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p) break;
        h.nan_steps[h.num_nan_steps++] = v;
        p = *end ? end + 1 : end;
    }
    env = getenv("LOOM_DEBUG_FAIL");
    long long at;
    if (env && sscanf(env, "%d:%lld:%15s", &h.fail_rank, &at, h.fail_mode) == 3) h.fail_step = at;
    env = getenv("LOOM_DEBUG_DIVERGE");
    h.diverge = env && atoi(env) == 1;
    return h;
}
