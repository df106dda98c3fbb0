/*
 * hooks.c — failures and numeric trouble on demand, for the tests, read from the environment
 * once at start-up (never in the step loop):
 *   LOOM_DEBUG_NAN_STEPS="3,4,5"       poison these (1-based) steps' gradients with NaN;
 *   LOOM_DEBUG_FAIL="RANK:STEP:MODE"   world rank RANK exits (MODE exit) or hangs (hang) at the
 *                                      start of STEP;
 *   LOOM_DEBUG_DIVERGE=1               replica 1 changes a parameter before the replica check;
 *   LOOM_DEBUG_ISLANDS_SAME_DATA=1     every island reads the first island's data.
 * They exist only in a build with LOOM_TEST_HOOKS (CMake option, on by default because the
 * test suite needs them); a build without them ignores the variables and says so. Either way
 * a set variable is never acted on or dropped silently: one warning names it.
 */
#define _POSIX_C_SOURCE 200809L /* pause */
#include "train/train_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const hook_variables[] = {"LOOM_DEBUG_NAN_STEPS", "LOOM_DEBUG_FAIL",
                                             "LOOM_DEBUG_DIVERGE", "LOOM_DEBUG_ISLANDS_SAME_DATA"};

loom_test_hooks loom_test_hooks_read(void) {
    loom_test_hooks h = {.fail_rank = -1, .fail_step = -1};
    for (size_t i = 0; i < sizeof hook_variables / sizeof hook_variables[0]; i++) {
        const char *value = getenv(hook_variables[i]);
        if (!value) continue;
#ifdef LOOM_TEST_HOOKS
        loom_warn("%s=%s: a test hook is set (injected failures or NaNs)", hook_variables[i],
                  value);
#else
        loom_warn("%s is ignored: this build has no test hooks (cmake -DLOOM_TEST_HOOKS=ON)",
                  hook_variables[i]);
#endif
    }
#ifdef LOOM_TEST_HOOKS
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
    env = getenv("LOOM_DEBUG_ISLANDS_SAME_DATA");
    h.islands_same_data = env && atoi(env) == 1;
#endif
    return h;
}

void loom_test_hooks_fail(const loom_test_hooks *h, loom_comm *world, int64_t step) {
    if (!world || h->fail_step != step || h->fail_rank != loom_comm_rank(world)) return;
    if (!strcmp(h->fail_mode, "exit")) _exit(3);
    if (!strcmp(h->fail_mode, "hang")) {
        for (;;) pause();
    }
}

int loom_test_hooks_nan(const loom_test_hooks *h, int64_t step) {
    for (int i = 0; i < h->num_nan_steps; i++)
        if (h->nan_steps[i] == step) return 1;
    return 0;
}
