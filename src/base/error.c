/*
 * error.c — status codes, the per-thread error message slot, and loom_fatal for the failures
 * that cannot be handed back.
 */
#include "loom/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char error_message[2048];

const char *loom_strerror(loom_status status) {
    switch (status) {
    case LOOM_OK:
        return "ok";
    case LOOM_ERR_INPUT:
        return "bad input";
    case LOOM_ERR_IO:
        return "i/o error";
    case LOOM_ERR_NOMEM:
        return "out of memory";
    case LOOM_ERR_NUMERIC:
        return "numerical failure";
    case LOOM_ERR_RUNTIME:
        return "runtime error";
    }
    return "unknown status";
}

loom_status loom_fail(loom_status status, const char *fmt, ...) {
    /* formatted aside first: an argument may be loom_last_error() itself (a message that wraps
     * another), which vsnprintf must not read while it writes the same buffer */
    char formatted[sizeof error_message];
    va_list args;
    va_start(args, fmt);
    vsnprintf(formatted, sizeof formatted, fmt, args);
    va_end(args);
    memcpy(error_message, formatted, sizeof formatted);
    return status;
}

const char *loom_last_error(void) {
    return error_message;
}

void loom_clear_error(void) {
    error_message[0] = '\0';
}

int loom_exit_code(loom_status status) {
    if (status == LOOM_OK) return 0;
    return status == LOOM_ERR_INPUT ? 2 : 1;
}

void loom_fatal(const char *fmt, ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    fprintf(stderr, "internal error: %s\n", message);
    fflush(stderr);
    abort();
}
