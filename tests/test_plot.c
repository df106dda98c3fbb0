/*
 * test_plot.c — the loss plot, read back as a document: libxml2 parses every file (it must be
 * well-formed XML with an SVG root), and XPath queries read the tree. The axes are read from the
 * file itself (tick labels paired with their grid lines give the value -> pixel map), so each
 * plotted point is checked against the data value it should show: all inside the plot frame, in
 * step order, as many as the finite values given; tick labels bracket the data; the legend names
 * both series in their colours; the title reads back unescaped. Cases: ordinary series with
 * validation points, a long series not starting at 0, non-finite values, one point, constant
 * series, huge values and steps, an empty plot, a title that needs escaping.
 */
#include "train/plot.h"

#include "check.h"

#include <errno.h>
#include <libxml/parser.h>
#include <libxml/xpath.h>
#include <libxml/xpathInternals.h>

enum { MAX_POINTS = 4096, MAX_TICKS = 128, MAX_NODES = 1024 };

typedef struct {
    double x[MAX_POINTS], y[MAX_POINTS];
    int count;
    char stroke[32];
} polyline;

typedef struct {
    double value[MAX_TICKS], pixel[MAX_TICKS]; /* by increasing value */
    int count;
} ticks;

typedef struct {
    xmlDocPtr doc;
    xmlXPathContextPtr xpath;        /* prefix "s" is the SVG namespace */
    double left, top, right, bottom; /* the frame: the rect with fill="none" */
    polyline lines[4];
    int n_lines;
    ticks x_ticks, y_ticks;
} plot;

/* ---- reading the document ---------------------------------------------------------------- */

/* A whole string that is one finite number. */
static int parse_number(const char *s, double *value) {
    if (!s) return 0;
    char *end;
    errno = 0;
    *value = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(*value)) return 0;
    while (*end == ' ' || *end == '\n' || *end == '\t') end++;
    return *end == '\0';
}

/* An attribute's value (NULL if absent), valid until the next call. */
static const char *attr(xmlNodePtr node, const char *name) {
    static xmlChar *value;
    xmlFree(value);
    value = xmlGetProp(node, (const xmlChar *)name);
    return (const char *)value;
}

static int attr_number(xmlNodePtr node, const char *name, double *value) {
    return parse_number(attr(node, name), value);
}

/* An element's text content, valid until the next call. */
static const char *text_of(xmlNodePtr node) {
    static xmlChar *text;
    xmlFree(text);
    text = xmlNodeGetContent(node);
    return text ? (const char *)text : "";
}

/* The nodes an XPath expression selects, in document order, into out[MAX_NODES]. */
static int select_nodes(const plot *pl, const char *expr, xmlNodePtr *out) {
    xmlXPathObjectPtr result = xmlXPathEvalExpression((const xmlChar *)expr, pl->xpath);
    int n = 0;
    if (result && result->nodesetval) {
        for (int i = 0; i < result->nodesetval->nodeNr && n < MAX_NODES; i++) {
            out[n++] = result->nodesetval->nodeTab[i];
        }
    }
    if (!result) CHECK(0, "XPath %s evaluates", expr);
    xmlXPathFreeObject(result);
    return n;
}

static int count_nodes(const plot *pl, const char *expr) {
    static xmlNodePtr nodes[MAX_NODES];
    return select_nodes(pl, expr, nodes);
}

/* "x,y x,y ..." into line; 0 if malformed or not finite. */
static int parse_points(const char *points, polyline *line) {
    line->count = 0;
    const char *p = points;
    for (;;) {
        while (*p == ' ') p++;
        if (!*p) return line->count > 0;
        char *end;
        double x = strtod(p, &end);
        if (end == p || *end != ',') return 0;
        p = end + 1;
        double y = strtod(p, &end);
        if (end == p || (*end && *end != ' ') || !isfinite(x) || !isfinite(y)) return 0;
        if (line->count == MAX_POINTS) return 0;
        line->x[line->count] = x, line->y[line->count++] = y;
        p = end;
    }
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Pairs tick labels (value, label position) with grid lines (pixel) in order. An x label is
 * centred on its line; a y label sits just below its line's y (the text baseline). */
static void read_ticks(plot *pl, int vertical, ticks *out, const char *what) {
    static xmlNodePtr nodes[MAX_NODES];
    double values[MAX_TICKS], label_pos[MAX_TICKS], grid[MAX_TICKS];
    int n_labels = 0, n_grid = 0;
    int n = select_nodes(pl, "//s:text", nodes);
    for (int i = 0; i < n && n_labels < MAX_TICKS; i++) {
        double x, y, value;
        if (!attr_number(nodes[i], "x", &x) || !attr_number(nodes[i], "y", &y)) continue;
        if (!parse_number(text_of(nodes[i]), &value)) continue; /* titles, axis names, legend */
        int is_x_label = y > pl->bottom && x >= pl->left - 0.01 && x <= pl->right + 0.01;
        int is_y_label = x < pl->left && y >= pl->top - 1 && y <= pl->bottom + 12;
        if (vertical ? !is_x_label : !is_y_label) continue;
        values[n_labels] = value;
        label_pos[n_labels++] = vertical ? x : y;
    }
    n = select_nodes(pl, "//s:line", nodes);
    for (int i = 0; i < n && n_grid < MAX_TICKS; i++) {
        double x1, y1, x2, y2;
        if (!attr_number(nodes[i], "x1", &x1) || !attr_number(nodes[i], "y1", &y1) ||
            !attr_number(nodes[i], "x2", &x2) || !attr_number(nodes[i], "y2", &y2))
            continue;
        int spans_v = x1 == x2 && y1 == pl->top && y2 == pl->bottom;
        int spans_h = y1 == y2 && x1 == pl->left && x2 == pl->right;
        if (vertical ? spans_v : spans_h) grid[n_grid++] = vertical ? x1 : y1;
    }
    CHECK(n_labels >= 2 && n_labels == n_grid, "%s: %d tick labels, %d grid lines", what, n_labels,
          n_grid);
    if (n_labels < 2 || n_labels != n_grid) return;
    /* label i belongs to grid line i once both are sorted along the axis */
    int order[MAX_TICKS];
    for (int i = 0; i < n_labels; i++) order[i] = i;
    for (int i = 1; i < n_labels; i++) { /* insertion sort of labels by position */
        for (int j = i; j > 0 && label_pos[order[j]] < label_pos[order[j - 1]]; j--) {
            int swap = order[j];
            order[j] = order[j - 1], order[j - 1] = swap;
        }
    }
    qsort(grid, (size_t)n_grid, sizeof *grid, compare_doubles);
    int beside = 1, monotone = 1;
    for (int i = 0; i < n_labels; i++) {
        double offset = label_pos[order[i]] - grid[i];
        beside &= vertical ? fabs(offset) < 0.01 : offset >= 0 && offset < 10;
        /* values grow to the right and upwards (decreasing y) */
        int k = vertical ? i : n_labels - 1 - i;
        out->value[k] = values[order[i]];
        out->pixel[k] = grid[i];
    }
    out->count = n_labels;
    for (int i = 1; i < n_labels; i++) monotone &= out->value[i] > out->value[i - 1];
    CHECK(beside, "%s: each tick label beside its grid line", what);
    CHECK(monotone, "%s: tick values increase along the axis", what);
    /* evenly spaced ticks on a linear axis: every tick on the line through the first and last */
    double slope =
        (out->pixel[n_labels - 1] - out->pixel[0]) / (out->value[n_labels - 1] - out->value[0]);
    int linear = 1;
    for (int i = 0; i < n_labels; i++) {
        double expect = out->pixel[0] + slope * (out->value[i] - out->value[0]);
        linear &= fabs(out->pixel[i] - expect) < 0.02;
    }
    CHECK(linear, "%s: ticks lie on one linear scale", what);
}

/* Pixel of a data value on an axis, from its first and last ticks. */
static double to_pixel(const ticks *t, double value) {
    double v0 = t->value[0], v1 = t->value[t->count - 1];
    return t->pixel[0] + (value - v0) / (v1 - v0) * (t->pixel[t->count - 1] - t->pixel[0]);
}

static void plot_free(plot *pl) {
    xmlXPathFreeContext(pl->xpath);
    xmlFreeDoc(pl->doc);
    free(pl);
}

/* The document at path, or NULL (with libxml2's message in why[cap]) if it is not well-formed
 * XML. Nothing is fetched from the network and nothing is repaired. */
static xmlDocPtr parse_document(const char *path, char *why, size_t cap) {
    xmlResetLastError();
    xmlDocPtr doc =
        xmlReadFile(path, NULL, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    const xmlError *error = xmlGetLastError();
    snprintf(why, cap, "%s", error && error->message ? error->message : "");
    return doc;
}

/* Parses the file and reads what every plot must have: an <svg> root, the frame, the axes. */
static plot *read_plot(const char *path, const char *what) {
    static xmlNodePtr nodes[MAX_NODES];
    char why[300];
    xmlDocPtr doc = parse_document(path, why, sizeof why);
    CHECK(doc != NULL, "%s: well-formed XML: %s", what, why);
    if (!doc) return NULL;
    plot *pl = calloc(1, sizeof *pl);
    if (!pl) abort();
    pl->doc = doc;
    pl->xpath = xmlXPathNewContext(doc);
    if (!pl->xpath) abort();
    xmlXPathRegisterNs(pl->xpath, (const xmlChar *)"s",
                       (const xmlChar *)"http://www.w3.org/2000/svg");
    CHECK(count_nodes(pl, "/s:svg") == 1, "%s: the root is an SVG element", what);
    /* every attribute and every piece of text, lower-cased: no nan, no inf */
    CHECK(count_nodes(pl, "//@*[contains(translate(., 'NAIF', 'naif'), 'nan') or "
                          "contains(translate(., 'NAIF', 'naif'), 'inf')] | "
                          "//text()[contains(translate(., 'NAIF', 'naif'), 'nan') or "
                          "contains(translate(., 'NAIF', 'naif'), 'inf')]") == 0,
          "%s: no nan/inf", what);
    int n = select_nodes(pl, "//@x | //@y | //@x1 | //@y1 | //@x2 | //@y2 | //@cx | //@cy | //@r",
                         nodes);
    int finite = 1;
    for (int i = 0; i < n; i++) {
        double v;
        finite &= parse_number(text_of(nodes[i]), &v);
    }
    CHECK(n > 0 && finite, "%s: every coordinate is a finite number (%d)", what, n);
    double width, height;
    CHECK(select_nodes(pl, "/s:svg", nodes) == 1 && attr_number(nodes[0], "width", &width) &&
              attr_number(nodes[0], "height", &height),
          "%s: canvas size", what);

    int frames = select_nodes(pl, "//s:rect[@fill='none']", nodes);
    double x = 0, y = 0, w = 0, h = 0;
    CHECK(frames == 1 && attr_number(nodes[0], "x", &x) && attr_number(nodes[0], "y", &y) &&
              attr_number(nodes[0], "width", &w) && attr_number(nodes[0], "height", &h),
          "%s: one plot frame (%d)", what, frames);
    pl->left = x, pl->top = y, pl->right = x + w, pl->bottom = y + h;
    CHECK(pl->left >= 0 && pl->top >= 0 && pl->right <= width && pl->bottom <= height &&
              pl->right > pl->left && pl->bottom > pl->top,
          "%s: the frame inside the canvas", what);

    n = select_nodes(pl, "//s:polyline", nodes);
    for (int i = 0; i < n && pl->n_lines < 4; i++) {
        polyline *line = &pl->lines[pl->n_lines++];
        const char *stroke = attr(nodes[i], "stroke");
        snprintf(line->stroke, sizeof line->stroke, "%s", stroke ? stroke : "");
        const char *points = attr(nodes[i], "points");
        CHECK(points && parse_points(points, line), "%s: polyline %d points parse", what, i);
    }
    read_ticks(pl, 1, &pl->x_ticks, what);
    read_ticks(pl, 0, &pl->y_ticks, what);
    return pl;
}

/* ---- checks on a plot -------------------------------------------------------------------- */

static int inside_frame(const plot *pl, double x, double y) {
    const double slack = 0.006; /* coordinates are printed with two decimals */
    return x >= pl->left - slack && x <= pl->right + slack && y >= pl->top - slack &&
           y <= pl->bottom + slack;
}

/* A polyline shows a series: one point per finite value, in step order, each inside the frame
 * and where the axes put that (step, value). */
static void check_series(const plot *pl, const polyline *line, const int64_t *steps,
                         const double *values, int n, const char *what) {
    int count = 0;
    for (int i = 0; i < n; i++) count += isfinite(values[i]) != 0;
    CHECK(line->count == count, "%s: %d points plotted for %d finite values", what, line->count,
          count);
    if (line->count != count || pl->x_ticks.count < 2 || pl->y_ticks.count < 2) return;
    int inside = 1, ordered = 1, placed = 1;
    for (int i = 0, k = 0; i < n; i++) {
        if (!isfinite(values[i])) continue;
        inside &= inside_frame(pl, line->x[k], line->y[k]);
        if (k > 0) ordered &= line->x[k] > line->x[k - 1];
        double px = to_pixel(&pl->x_ticks, (double)steps[i]),
               py = to_pixel(&pl->y_ticks, values[i]);
        if (placed && (fabs(line->x[k] - px) > 0.011 || fabs(line->y[k] - py) > 0.011)) {
            fprintf(stderr, "%s: point %d (%g, %g) drawn at (%.2f, %.2f), axes say (%.3f, %.3f)\n",
                    what, k, (double)steps[i], values[i], line->x[k], line->y[k], px, py);
            placed = 0;
        }
        k++;
    }
    CHECK(inside, "%s: every point inside the plot frame", what);
    CHECK(ordered, "%s: points in step order, left to right", what);
    CHECK(placed, "%s: every point where the axes put its (step, loss)", what);
}

/* The tick labels cover every finite value of the given series on both axes. */
static void check_ticks_bracket(const plot *pl, const int64_t *steps, const double *values, int n,
                                const int64_t *val_steps, const double *val_values, int n_val,
                                const char *what) {
    const ticks *xt = &pl->x_ticks, *yt = &pl->y_ticks;
    if (xt->count < 2 || yt->count < 2) return;
    int covered = 1;
    for (int s = 0; s < 2; s++) {
        const int64_t *st = s ? val_steps : steps;
        const double *v = s ? val_values : values;
        for (int i = 0; i < (s ? n_val : n); i++) {
            if (!isfinite(v[i])) continue;
            covered &= xt->value[0] <= (double)st[i] && (double)st[i] <= xt->value[xt->count - 1];
            covered &= yt->value[0] <= v[i] && v[i] <= yt->value[yt->count - 1];
        }
    }
    CHECK(covered, "%s: tick labels [%g, %g] x [%g, %g] bracket the data", what, xt->value[0],
          xt->value[xt->count - 1], yt->value[0], yt->value[yt->count - 1]);
}

/* The legend: a text naming the series (a plain word), right after a line in the series'
 * colour. */
static int legend_names(const plot *pl, const char *name, const char *stroke) {
    static xmlNodePtr nodes[MAX_NODES];
    char expr[200];
    snprintf(expr, sizeof expr, "//s:text[. = '%s']/preceding-sibling::*[1][self::s:line]", name);
    int n = select_nodes(pl, expr, nodes), found = 0;
    for (int i = 0; i < n; i++) {
        const char *colour = attr(nodes[i], "stroke");
        found |= colour && strcmp(colour, stroke) == 0;
    }
    return found;
}

/* The circles drawn, in document order, into xs/ys. */
static int circles(const plot *pl, double *xs, double *ys, int cap) {
    static xmlNodePtr nodes[MAX_NODES];
    int n = select_nodes(pl, "//s:circle", nodes), count = 0;
    for (int i = 0; i < n && count < cap; i++) {
        if (attr_number(nodes[i], "cx", &xs[count]) && attr_number(nodes[i], "cy", &ys[count]))
            count++;
    }
    return count;
}

/* Some <text> element reads exactly `content` (compared in C: XPath literals cannot hold both
 * quote characters). */
static int has_text(const plot *pl, const char *content) {
    static xmlNodePtr nodes[MAX_NODES];
    int n = select_nodes(pl, "//s:text", nodes), found = 0;
    for (int i = 0; i < n; i++) found |= strcmp(text_of(nodes[i]), content) == 0;
    return found;
}

/* ---- the plots --------------------------------------------------------------------------- */

static const char *tmp;

static const char *path_of(const char *name) {
    static char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    return path;
}

/* The reader refuses what is not well-formed (the checks below would otherwise read a
 * repaired tree). */
static void test_reader(void) {
    static const char *bad[] = {"<svg xmlns=\"http://www.w3.org/2000/svg\"><g></svg>",
                                "<svg x=\"1\" x=\"2\"/>", "<svg>&nbsp;</svg>", "<a/><b/>"};
    int refused = 1;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char why[300];
        check_write_text(path_of("bad.svg"), bad[i]);
        xmlDocPtr doc = parse_document(path_of("bad.svg"), why, sizeof why);
        if (doc) fprintf(stderr, "malformed document %zu accepted: %s\n", i, bad[i]);
        refused &= doc == NULL;
        xmlFreeDoc(doc);
    }
    CHECK(refused, "malformed documents are refused");
}

static void test_ordinary(void) {
    int64_t steps[10], val_steps[3] = {0, 5, 9};
    double loss[10], val_loss[3] = {5.6, 4.1, 3.5};
    for (int i = 0; i < 10; i++) {
        steps[i] = i;
        loss[i] = 5.5 - 0.25 * i;
    }
    CHECK(loom_plot_loss_svg(path_of("loss.svg"), "gpt tiny: loss", steps, loss, 10, val_steps,
                             val_loss, 3) == LOOM_OK,
          "plot: %s", loom_last_error());
    plot *pl = read_plot(path_of("loss.svg"), "ordinary");
    if (!pl) return;
    CHECK(pl->n_lines == 2, "train and val lines (%d)", pl->n_lines);
    if (pl->n_lines == 2) {
        check_series(pl, &pl->lines[0], steps, loss, 10, "ordinary train");
        check_series(pl, &pl->lines[1], val_steps, val_loss, 3, "ordinary val");
        CHECK(strcmp(pl->lines[0].stroke, pl->lines[1].stroke) != 0, "the two series differ");
        CHECK(legend_names(pl, "train", pl->lines[0].stroke) &&
                  legend_names(pl, "val", pl->lines[1].stroke),
              "the legend names train and val, each in its line's colour");
        double cx[8], cy[8];
        int n = circles(pl, cx, cy, 8);
        int on_line = n == 3;
        for (int i = 0; i < n && on_line; i++) {
            on_line &=
                fabs(cx[i] - pl->lines[1].x[i]) < 0.005 && fabs(cy[i] - pl->lines[1].y[i]) < 0.005;
        }
        CHECK(on_line, "one marker on each of the 3 val points (%d circles)", n);
    }
    check_ticks_bracket(pl, steps, loss, 10, val_steps, val_loss, 3, "ordinary");
    CHECK(has_text(pl, "gpt tiny: loss"), "title");
    CHECK(has_text(pl, "step") && has_text(pl, "loss"), "axis names");
    plot_free(pl);
}

/* 600 steps from 1000 by 10, a noisy falling loss, validation every 50 steps. */
static void test_long_series(void) {
    enum { N = 600, NV = 12 };
    static int64_t steps[N], val_steps[NV];
    static double loss[N], val_loss[NV];
    for (int i = 0; i < N; i++) {
        steps[i] = 1000 + 10 * i;
        loss[i] = 2.0 + 9.0 * exp(-i / 150.0) + 0.2 * loom_rng_uniform(3, 0, (uint64_t)i);
    }
    for (int i = 0; i < NV; i++) {
        val_steps[i] = 1000 + 500 * i;
        val_loss[i] = 2.3 + 8.5 * exp(-50.0 * i / 150.0);
    }
    CHECK(loom_plot_loss_svg(path_of("long.svg"), "long", steps, loss, N, val_steps, val_loss,
                             NV) == LOOM_OK,
          "long plot");
    plot *pl = read_plot(path_of("long.svg"), "long");
    if (!pl) return;
    CHECK(pl->n_lines == 2, "train and val lines");
    if (pl->n_lines == 2) {
        check_series(pl, &pl->lines[0], steps, loss, N, "long train");
        check_series(pl, &pl->lines[1], val_steps, val_loss, NV, "long val");
        CHECK(legend_names(pl, "train", pl->lines[0].stroke) &&
                  legend_names(pl, "val", pl->lines[1].stroke),
              "long: legend");
    }
    check_ticks_bracket(pl, steps, loss, N, val_steps, val_loss, NV, "long");
    CHECK(pl->x_ticks.value[0] > 0, "the step axis starts near the first step, not at 0 (%g)",
          pl->x_ticks.value[0]);
    plot_free(pl);
}

static void test_non_finite(void) {
    int64_t steps[10], val_steps[3] = {0, 5, 9};
    double bad[10], bad_val[3] = {NAN, 4.0, INFINITY};
    for (int i = 0; i < 10; i++) steps[i] = i, bad[i] = 5.5 - 0.25 * i;
    bad[2] = NAN, bad[5] = INFINITY, bad[7] = -INFINITY;
    CHECK(loom_plot_loss_svg(path_of("nan.svg"), "bad values", steps, bad, 10, val_steps, bad_val,
                             3) == LOOM_OK,
          "plot with NaN");
    plot *pl = read_plot(path_of("nan.svg"), "nan");
    if (!pl) return;
    CHECK(pl->n_lines == 1, "train line only: one finite val value is a marker (%d)", pl->n_lines);
    if (pl->n_lines >= 1) check_series(pl, &pl->lines[0], steps, bad, 10, "nan train");
    check_ticks_bracket(pl, steps, bad, 10, val_steps, bad_val, 3, "nan");
    /* Inf must not stretch the axis: the top tick is near the largest finite value. */
    CHECK(pl->y_ticks.count >= 2 && pl->y_ticks.value[pl->y_ticks.count - 1] < 10,
          "axis fitted to the finite values");
    double cx[4], cy[4];
    CHECK(circles(pl, cx, cy, 4) == 1 && fabs(cx[0] - to_pixel(&pl->x_ticks, 5)) < 0.011 &&
              fabs(cy[0] - to_pixel(&pl->y_ticks, 4.0)) < 0.011,
          "the one finite val point is a marker at (5, 4)");
    plot_free(pl);
}

static void test_one_point(void) {
    int64_t steps[1] = {7};
    double loss[1] = {3.25};
    CHECK(loom_plot_loss_svg(path_of("one.svg"), "one", steps, loss, 1, NULL, NULL, 0) == LOOM_OK,
          "n=1");
    plot *pl = read_plot(path_of("one.svg"), "one point");
    if (!pl) return;
    double cx[2], cy[2];
    CHECK(pl->n_lines == 0 && circles(pl, cx, cy, 2) == 1, "a single point is drawn as a marker");
    CHECK(inside_frame(pl, cx[0], cy[0]) && fabs(cx[0] - to_pixel(&pl->x_ticks, 7)) < 0.011 &&
              fabs(cy[0] - to_pixel(&pl->y_ticks, 3.25)) < 0.011,
          "the marker is at (7, 3.25), inside the frame");
    check_ticks_bracket(pl, steps, loss, 1, NULL, NULL, 0, "one point");
    xmlNodePtr group[2];
    const char *colour =
        select_nodes(pl, "//s:circle/..", group) == 1 ? attr(group[0], "fill") : NULL;
    char fill[32] = "";
    if (colour) snprintf(fill, sizeof fill, "%s", colour); /* attr's next call frees colour */
    CHECK(fill[0] && legend_names(pl, "train", fill), "the legend names train in its colour");
    CHECK(!has_text(pl, "val"), "no val in the legend without val points");
    plot_free(pl);
}

static void test_constant(double value, const char *name) {
    int64_t steps[10];
    double flat[10];
    for (int i = 0; i < 10; i++) steps[i] = i, flat[i] = value;
    CHECK(loom_plot_loss_svg(path_of(name), "flat", steps, flat, 10, NULL, NULL, 0) == LOOM_OK,
          "%s", name);
    plot *pl = read_plot(path_of(name), name);
    if (!pl) return;
    CHECK(pl->n_lines == 1, "%s: one line", name);
    if (pl->n_lines == 1) {
        check_series(pl, &pl->lines[0], steps, flat, 10, name);
        double y = pl->lines[0].y[0];
        CHECK(y > pl->top + 10 && y < pl->bottom - 10, "%s: line away from the edges (y=%g)", name,
              y);
    }
    check_ticks_bracket(pl, steps, flat, 10, NULL, NULL, 0, name);
    CHECK(pl->y_ticks.count >= 2 && pl->y_ticks.value[0] < value &&
              pl->y_ticks.value[pl->y_ticks.count - 1] > value,
          "%s: a nonzero range around %g", name, value);
    plot_free(pl);
}

static void test_degenerate(void) {
    int64_t steps[3] = {0, 1, 2};
    double nans[3] = {NAN, NAN, INFINITY};
    CHECK(loom_plot_loss_svg(path_of("allnan.svg"), "all bad", steps, nans, 3, NULL, NULL, 0) ==
              LOOM_OK,
          "all NaN");
    plot *pl = read_plot(path_of("allnan.svg"), "all NaN");
    if (pl) {
        CHECK(pl->n_lines == 0 && count_nodes(pl, "//s:circle") == 0, "all NaN: nothing plotted");
        CHECK(has_text(pl, "no finite loss values"), "all NaN: says so");
        plot_free(pl);
    }

    /* beyond the clamp (1e150): drawn at the clamp, still finite and inside */
    double huge[3] = {1e300, -1e300, 1e-300};
    CHECK(loom_plot_loss_svg(path_of("huge.svg"), "huge", steps, huge, 3, NULL, NULL, 0) == LOOM_OK,
          "huge");
    pl = read_plot(path_of("huge.svg"), "huge values");
    if (pl) {
        double clamped[3] = {1e150, -1e150, 1e-300};
        CHECK(pl->n_lines == 1, "huge: one line");
        if (pl->n_lines == 1) check_series(pl, &pl->lines[0], steps, clamped, 3, "huge");
        plot_free(pl);
    }

    int64_t big_steps[2] = {INT64_MAX - 1, INT64_MAX};
    double loss[2] = {3.0, 2.0};
    CHECK(loom_plot_loss_svg(path_of("bigstep.svg"), "big step", big_steps, loss, 1, NULL, NULL,
                             0) == LOOM_OK,
          "huge step");
    pl = read_plot(path_of("bigstep.svg"), "huge step");
    if (pl) {
        double cx[2], cy[2];
        CHECK(circles(pl, cx, cy, 2) == 1 && inside_frame(pl, cx[0], cy[0]),
              "huge step: one marker inside the frame");
        plot_free(pl);
    }

    CHECK(loom_plot_loss_svg(path_of("empty.svg"), NULL, NULL, NULL, 0, NULL, NULL, 0) == LOOM_OK,
          "empty plot");
    pl = read_plot(path_of("empty.svg"), "empty");
    if (pl) {
        CHECK(pl->n_lines == 0 && has_text(pl, "training loss"), "empty: default title, no line");
        plot_free(pl);
    }
}

static void test_title_and_errors(void) {
    int64_t steps[10];
    double loss[10];
    for (int i = 0; i < 10; i++) steps[i] = i, loss[i] = 5.5 - 0.25 * i;
    const char *title = "a<b & \"c\" > 'd' \xce\xbb"; /* and a UTF-8 lambda */
    CHECK(loom_plot_loss_svg(path_of("title.svg"), title, steps, loss, 10, NULL, NULL, 0) ==
              LOOM_OK,
          "title plot");
    plot *pl = read_plot(path_of("title.svg"), "title");
    if (pl) {
        CHECK(has_text(pl, title), "the title reads back exactly");
        plot_free(pl);
    }
    CHECK(loom_plot_loss_svg(path_of("no_such_dir/x.svg"), "x", steps, loss, 10, NULL, NULL, 0) ==
              LOOM_ERR_IO,
          "unwritable path fails");
    CHECK(loom_plot_loss_svg(path_of("null.svg"), "x", NULL, loss, 10, NULL, NULL, 0) ==
              LOOM_ERR_INPUT,
          "points without an array are refused");
}

int main(void) {
    LIBXML_TEST_VERSION
    tmp = check_tmpdir();
    test_reader();
    test_ordinary();
    test_long_series();
    test_non_finite();
    test_one_point();
    test_constant(2.0, "flat.svg");
    test_constant(0.0, "zero.svg");
    test_degenerate();
    test_title_and_errors();
    attr(NULL, NULL); /* frees the last value */
    text_of(NULL);
    xmlCleanupParser();
    return check_finish();
}
