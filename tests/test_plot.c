/*
 * test_plot.c — the loss plot: well-formed-looking SVG for ordinary series, a single point, a
 * constant series, non-finite values (never printed as "nan"/"inf"), and an escaped title.
 */
#include "train/plot.h"

#include "check.h"

#include <ctype.h>
#include <string.h>

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    size_t n = fread(buf, 1, (size_t)size, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int contains_nocase(const char *text, const char *needle) {
    size_t n = strlen(needle);
    for (const char *p = text; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && tolower((unsigned char)p[i]) == tolower((unsigned char)needle[i])) {
            i++;
        }
        if (i == n) return 1;
    }
    return 0;
}

static int count_of(const char *text, const char *needle) {
    int count = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) count++;
    return count;
}

/* Checks the shape every plot must have; returns the text (caller frees) or NULL. */
static char *check_svg(const char *path, const char *what) {
    char *svg = read_text(path);
    CHECK(svg != NULL, "%s: file written", what);
    if (!svg) return NULL;
    CHECK(strncmp(svg, "<?xml", 5) == 0 || strncmp(svg, "<svg", 4) == 0, "%s: starts like SVG",
          what);
    CHECK(strstr(svg, "<svg") && strstr(svg, "</svg>"), "%s: has <svg> ... </svg>", what);
    const char *close = strstr(svg, "</svg>");
    CHECK(close && strspn(close + 6, " \n") == strlen(close + 6), "%s: nothing after </svg>", what);
    CHECK(!contains_nocase(svg, "nan") && !contains_nocase(svg, "inf"), "%s: no nan/inf", what);
    CHECK(count_of(svg, "<text") == count_of(svg, "</text>"), "%s: text elements closed", what);
    CHECK(count_of(svg, "<g") == count_of(svg, "</g>"), "%s: groups closed", what);
    return svg;
}

/* Every y of the first polyline (after `from`) lies strictly inside the plot area. */
static int polyline_inside(const char *from, double *first_y, int *points) {
    const char *p = strstr(from, "<polyline");
    if (!p) return 0;
    p = strstr(p, "points=\"");
    if (!p) return 0;
    p += 8;
    *points = 0;
    while (*p && *p != '"') {
        double x, y;
        int used = 0;
        if (sscanf(p, "%lf,%lf %n", &x, &y, &used) != 2 || used == 0) return 0;
        if (x <= 0 || x >= 800 || y <= 40 || y >= 430) return 0;
        if (*points == 0) *first_y = y;
        (*points)++;
        p += used;
    }
    return *points > 0;
}

int main(void) {
    const char *tmp = check_tmpdir();
    char path[1200];

    /* An ordinary run with validation points. */
    int64_t steps[10], val_steps[3] = {0, 5, 9};
    double loss[10], val_loss[3] = {5.6, 4.1, 3.5};
    for (int i = 0; i < 10; i++) {
        steps[i] = i;
        loss[i] = 5.5 - 0.25 * i;
    }
    snprintf(path, sizeof path, "%s/loss.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "gpt tiny: loss", steps, loss, 10, val_steps, val_loss, 3) ==
              LOOM_OK,
          "plot: %s", loom_last_error());
    char *svg = check_svg(path, "ordinary");
    if (svg) {
        CHECK(count_of(svg, "<polyline") == 2, "train and val lines");
        CHECK(count_of(svg, "<circle") >= 3, "val markers");
        CHECK(strstr(svg, ">train<") && strstr(svg, ">val<"), "legend");
        CHECK(strstr(svg, "gpt tiny: loss"), "title");
        CHECK(strstr(svg, ">step<") && strstr(svg, ">loss<"), "axis labels");
        double y0;
        int points = 0;
        CHECK(polyline_inside(svg, &y0, &points) && points == 10, "10 train points inside");
        free(svg);
    }

    /* NaN and Inf in both series: skipped, never printed. */
    double bad[10];
    memcpy(bad, loss, sizeof bad);
    bad[2] = NAN;
    bad[5] = INFINITY;
    bad[7] = -INFINITY;
    double bad_val[3] = {NAN, 4.0, INFINITY};
    snprintf(path, sizeof path, "%s/nan.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "bad values", steps, bad, 10, val_steps, bad_val, 3) == LOOM_OK,
          "plot with NaN");
    svg = check_svg(path, "nan");
    if (svg) {
        double y0;
        int points = 0;
        CHECK(polyline_inside(svg, &y0, &points) && points == 7, "7 finite train points (%d)",
              points);
        /* Inf must not stretch the axis: the first finite point (5.5, the maximum) sits near
         * the top of the plot, not squashed onto the bottom edge. */
        CHECK(y0 < 150, "axis fitted to the finite values (first y = %g)", y0);
        free(svg);
    }

    /* One point. */
    snprintf(path, sizeof path, "%s/one.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "one", steps, loss, 1, NULL, NULL, 0) == LOOM_OK, "n=1");
    svg = check_svg(path, "one point");
    if (svg) {
        CHECK(strstr(svg, "<circle") != NULL, "a single point is drawn as a marker");
        free(svg);
    }

    /* Constant loss: a flat line inside the plot, not a zero-height range. */
    double flat[10];
    for (int i = 0; i < 10; i++) flat[i] = 2.0;
    snprintf(path, sizeof path, "%s/flat.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "flat", steps, flat, 10, NULL, NULL, 0) == LOOM_OK, "flat");
    svg = check_svg(path, "constant");
    if (svg) {
        double y0;
        int points = 0;
        CHECK(polyline_inside(svg, &y0, &points) && points == 10, "flat line inside the plot");
        CHECK(y0 > 60 && y0 < 410, "flat line away from the edges (y=%g)", y0);
        free(svg);
    }

    /* Constant zero loss: the range cannot be relative to the value. */
    double zeros[10] = {0};
    snprintf(path, sizeof path, "%s/zero.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "zero", steps, zeros, 10, NULL, NULL, 0) == LOOM_OK, "zeros");
    svg = check_svg(path, "constant zero");
    if (svg) {
        double y0;
        int points = 0;
        CHECK(polyline_inside(svg, &y0, &points) && y0 > 60 && y0 < 410,
              "zero line inside the plot (y=%g)", y0);
        CHECK(strstr(svg, ">0<") != NULL, "a 0 tick label");
        free(svg);
    }

    /* Nothing finite at all, huge values, and an empty plot. */
    double nans[3] = {NAN, NAN, INFINITY};
    snprintf(path, sizeof path, "%s/allnan.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "all bad", steps, nans, 3, NULL, NULL, 0) == LOOM_OK, "all NaN");
    svg = check_svg(path, "all NaN");
    free(svg);
    double huge[3] = {1e300, -1e300, 1e-300};
    snprintf(path, sizeof path, "%s/huge.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "huge", steps, huge, 3, NULL, NULL, 0) == LOOM_OK, "huge");
    svg = check_svg(path, "huge values");
    free(svg);
    int64_t big_steps[1] = {INT64_MAX};
    snprintf(path, sizeof path, "%s/bigstep.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "big step", big_steps, loss, 1, NULL, NULL, 0) == LOOM_OK,
          "huge step");
    svg = check_svg(path, "huge step");
    free(svg);
    snprintf(path, sizeof path, "%s/empty.svg", tmp);
    CHECK(loom_plot_loss_svg(path, NULL, NULL, NULL, 0, NULL, NULL, 0) == LOOM_OK, "empty plot");
    svg = check_svg(path, "empty");
    free(svg);

    /* The title is escaped. */
    snprintf(path, sizeof path, "%s/title.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "a<b & \"c\"", steps, loss, 10, NULL, NULL, 0) == LOOM_OK,
          "title plot");
    svg = check_svg(path, "title");
    if (svg) {
        CHECK(strstr(svg, "a&lt;b &amp; &quot;c&quot;") != NULL, "title escaped");
        free(svg);
    }

    snprintf(path, sizeof path, "%s/no_such_dir/x.svg", tmp);
    CHECK(loom_plot_loss_svg(path, "x", steps, loss, 10, NULL, NULL, 0) == LOOM_ERR_IO,
          "unwritable path fails");
    return check_finish();
}
