/*
 * log.c — the logger: one of the two pieces of global mutable state loom allows.
 * INFO goes to stdout, WARN and ERROR to stderr; every line carries the prefix
 * (a rank tag in parallel runs).
 */
#include "loom/base.h"

#include <stdio.h>
#include <string.h>

static loom_log_level log_level = LOOM_LOG_INFO;
static char log_prefix[64];

void loom_log_set_level(loom_log_level level) {
    log_level = level;
}

void loom_log_set_prefix(const char *prefix) {
    snprintf(log_prefix, sizeof log_prefix, "%s", prefix ? prefix : "");
}

void loom_log(loom_log_level level, const char *fmt, ...) {
    if (level < log_level) return;
    FILE *out = level >= LOOM_LOG_WARN ? stderr : stdout;
    const char *tag = level == LOOM_LOG_WARN    ? "warning: "
                      : level == LOOM_LOG_ERROR ? "error: "
                                                : "";
    char line[4096];
    va_list args;
    va_start(args, fmt);
    vsnprintf(line, sizeof line, fmt, args); /* NOLINT(clang-analyzer-valist.Uninitialized) */
    va_end(args);
    fprintf(out, "%s%s%s\n", log_prefix, tag, line);
    fflush(out);
}
