/*
 * check.h — the tiny test harness every test program uses: CHECK macros that count, and
 * check_finish() which prints "N passed, N failed" and returns the exit status.
 */
#ifndef LOOM_TESTS_CHECK_H
#define LOOM_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, rtol, atol, what)                                                        \
    do {                                                                                           \
        double check_a_ = (double)(a), check_b_ = (double)(b);                                     \
        CHECK(fabs(check_a_ - check_b_) <= (atol) + (rtol)*fabs(check_b_), "%s: %.9g vs %.9g",     \
              (what), check_a_, check_b_);                                                         \
    } while (0)

static inline int check_finish(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed == 0 ? 0 : 1;
}

/* A scratch folder for the test, made fresh (from LOOM_TEST_TMP, else /tmp). */
static inline const char *check_tmpdir(void) {
    static char dir[1024];
    const char *env = getenv("LOOM_TEST_TMP");
    snprintf(dir, sizeof dir, "%s", env ? env : "/tmp/loom_test");
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot make %s\n", dir);
        exit(1);
    }
    return dir;
}

/* text with the first `find` replaced by `replace` (into out[cap]); 0 if `find` is missing. */
static inline int check_edit_text(const char *text, const char *find, const char *replace,
                                  char *out, size_t cap) {
    const char *at = strstr(text, find);
    if (!at) return 0;
    snprintf(out, cap, "%.*s%s%s", (int)(at - text), text, replace, at + strlen(find));
    return 1;
}

/* Writes text to path; a test that cannot write its scratch files stops. */
static inline void check_write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fprintf(f, "%s", text);
    fclose(f);
}

#endif
