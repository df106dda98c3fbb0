/*
 * test_base.c — the error slot: a message that wraps the previous one (loom_fail with
 * loom_last_error() as an argument, the pattern of every "while resuming: ..." message) reads
 * the old text whole, not the half-overwritten buffer; long messages are cut, not overrun.
 */
#include "check.h"
#include "loom/base.h"

#include <string.h>

int main(void) {
    loom_fail(LOOM_ERR_INPUT, "state.safetensors: metadata 'step': expected an integer");
    loom_status st = loom_fail(LOOM_ERR_INPUT, "resume runs/x: %s (and more)", loom_last_error());
    CHECK(st == LOOM_ERR_INPUT, "status passed through");
    CHECK(strcmp(loom_last_error(), "resume runs/x: state.safetensors: metadata 'step': expected "
                                    "an integer (and more)") == 0,
          "wrapped message: '%s'", loom_last_error());
    /* wrapping twice over a message near the slot's size stays terminated and in bounds */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    loom_fail(LOOM_ERR_IO, "%s", big);
    loom_fail(LOOM_ERR_IO, "outer: %s", loom_last_error());
    size_t n = strlen(loom_last_error());
    CHECK(n > 1000 && n < sizeof big, "cut to the slot: %zu characters", n);
    CHECK(strncmp(loom_last_error(), "outer: xxx", 10) == 0, "prefix kept: %.20s",
          loom_last_error());
    return check_finish();
}
