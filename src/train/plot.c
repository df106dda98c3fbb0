/*
 * plot.c — hand-written SVG for the loss curve: a fixed 800x480 canvas, "nice" 1-2-5 ticks,
 * grid, train polyline, validation polyline with markers, legend and title. Every number
 * printed is finite by construction (non-finite inputs are dropped, extreme ones clamped), so
 * the file never contains "nan" or "inf".
 *
 * Not here: data handling beyond skipping bad points (no smoothing, no decimation).
 */
#include "plot.h"

#include <math.h>
#include <stdlib.h>

enum {
    CANVAS_W = 800,
    CANVAS_H = 480,
    PLOT_LEFT = 76,
    PLOT_RIGHT = 776,
    PLOT_TOP = 48,
    PLOT_BOTTOM = 420,
    MARKER_LIMIT = 400
};
static const double VALUE_LIMIT = 1e150; /* keeps every range and coordinate finite */

typedef struct {
    double lo, hi, step; /* axis range [lo, hi] with ticks every step */
} axis;

typedef struct {
    double xmin, xmax, ymin, ymax;
    size_t finite_points;
} extent;

static int usable(double v) {
    return isfinite(v);
}

static double clamp_value(double v) {
    return v > VALUE_LIMIT ? VALUE_LIMIT : v < -VALUE_LIMIT ? -VALUE_LIMIT : v;
}

static void extent_add(extent *e, const int64_t *steps, const double *values, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!usable(values[i])) continue;
        double x = clamp_value((double)steps[i]), y = clamp_value(values[i]);
        if (e->finite_points == 0) {
            e->xmin = e->xmax = x;
            e->ymin = e->ymax = y;
        }
        e->xmin = fmin(e->xmin, x);
        e->xmax = fmax(e->xmax, x);
        e->ymin = fmin(e->ymin, y);
        e->ymax = fmax(e->ymax, y);
        e->finite_points++;
    }
}

/* 1, 2 or 5 times a power of ten, giving about `target` intervals over [lo, hi]. */
static axis nice_axis(double lo, double hi, int target, int integer_ticks) {
    double raw = (hi - lo) / target;
    if (!(raw > 0) || !isfinite(raw)) raw = 1;
    double magnitude = pow(10.0, floor(log10(raw)));
    double norm = raw / magnitude;
    double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
    if (integer_ticks && step < 1) step = 1;
    axis a = {floor(lo / step) * step, ceil(hi / step) * step, step};
    if (a.hi <= a.lo) a.hi = a.lo + step;
    return a;
}

/* Widens a degenerate range so a single point or a constant series still has a scale. */
static void widen(double *lo, double *hi, double pad_if_zero) {
    if (*hi > *lo) {
        double pad = 0.05 * (*hi - *lo);
        *lo -= pad;
        *hi += pad;
        return;
    }
    double pad = fabs(*lo) * 0.1;
    if (pad == 0) pad = pad_if_zero;
    *lo -= pad;
    *hi += pad;
}

static double map_x(const axis *a, double x) {
    return PLOT_LEFT + (x - a->lo) / (a->hi - a->lo) * (PLOT_RIGHT - PLOT_LEFT);
}

static double map_y(const axis *a, double y) {
    return PLOT_BOTTOM - (y - a->lo) / (a->hi - a->lo) * (PLOT_BOTTOM - PLOT_TOP);
}

static void write_escaped(FILE *out, const char *text) {
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        switch (*p) {
        case '&':
            fputs("&amp;", out);
            break;
        case '<':
            fputs("&lt;", out);
            break;
        case '>':
            fputs("&gt;", out);
            break;
        case '"':
            fputs("&quot;", out);
            break;
        default:
            fputc(*p < 0x20 ? ' ' : *p, out); /* control bytes are not XML */
        }
    }
}

static void write_tick_label(FILE *out, double value, double step) {
    if (fabs(value) < step * 1e-9) value = 0; /* no "-0" */
    fprintf(out, "%.6g", value);
}

static void write_axes(FILE *out, const axis *xa, const axis *ya) {
    fprintf(out, "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
    for (int i = 0; i <= 100; i++) {
        double v = xa->lo + i * xa->step;
        if (v > xa->hi + xa->step * 1e-9) break;
        double x = map_x(xa, v);
        fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>\n", x, PLOT_TOP, x,
                PLOT_BOTTOM);
    }
    for (int i = 0; i <= 100; i++) {
        double v = ya->lo + i * ya->step;
        if (v > ya->hi + ya->step * 1e-9) break;
        double y = map_y(ya, v);
        fprintf(out, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\"/>\n", PLOT_LEFT, y,
                PLOT_RIGHT, y);
    }
    fprintf(out, "</g>\n");
    fprintf(out,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n",
            PLOT_LEFT, PLOT_TOP, PLOT_RIGHT - PLOT_LEFT, PLOT_BOTTOM - PLOT_TOP);
    fprintf(out, "<g font-family=\"sans-serif\" font-size=\"12\" fill=\"#000\">\n");
    for (int i = 0; i <= 100; i++) {
        double v = xa->lo + i * xa->step;
        if (v > xa->hi + xa->step * 1e-9) break;
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">", map_x(xa, v),
                PLOT_BOTTOM + 18);
        write_tick_label(out, v, xa->step);
        fprintf(out, "</text>\n");
    }
    for (int i = 0; i <= 100; i++) {
        double v = ya->lo + i * ya->step;
        if (v > ya->hi + ya->step * 1e-9) break;
        fprintf(out, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\">", PLOT_LEFT - 6,
                map_y(ya, v) + 4);
        write_tick_label(out, v, ya->step);
        fprintf(out, "</text>\n");
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n",
            (PLOT_LEFT + PLOT_RIGHT) / 2, CANVAS_H - 16);
    fprintf(out,
            "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\">"
            "loss</text>\n",
            (PLOT_TOP + PLOT_BOTTOM) / 2, (PLOT_TOP + PLOT_BOTTOM) / 2);
    fprintf(out, "</g>\n");
}

static void write_series(FILE *out, const axis *xa, const axis *ya, const int64_t *steps,
                         const double *values, size_t n, const char *color, const char *dash,
                         int markers) {
    size_t finite = 0;
    for (size_t i = 0; i < n; i++) finite += usable(values[i]);
    if (finite == 0) return;
    if (finite > 1) {
        fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"",
                color, dash);
        for (size_t i = 0; i < n; i++) {
            if (!usable(values[i])) continue;
            fprintf(out, "%.2f,%.2f ", map_x(xa, clamp_value((double)steps[i])),
                    map_y(ya, clamp_value(values[i])));
        }
        fprintf(out, "\"/>\n");
    }
    if (markers || finite == 1) {
        fprintf(out, "<g fill=\"%s\">\n", color);
        for (size_t i = 0; i < n; i++) {
            if (!usable(values[i])) continue;
            fprintf(out, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\"/>\n",
                    map_x(xa, clamp_value((double)steps[i])), map_y(ya, clamp_value(values[i])));
        }
        fprintf(out, "</g>\n");
    }
}

static void write_legend(FILE *out, int with_val) {
    int rows = with_val ? 2 : 1, w = 92, x = PLOT_RIGHT - w - 10, y = PLOT_TOP + 10;
    fprintf(out,
            "<g font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#999\"/>\n",
            x, y, w, 8 + 18 * rows);
    const char *names[2] = {"train", "val"};
    const char *colors[2] = {"#1f77b4", "#ff7f0e"};
    for (int r = 0; r < rows; r++) {
        int cy = y + 16 + 18 * r;
        fprintf(out,
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>\n"
                "<text x=\"%d\" y=\"%d\">%s</text>\n",
                x + 8, cy - 4, x + 36, cy - 4, colors[r], x + 44, cy, names[r]);
    }
    fprintf(out, "</g>\n");
}

loom_status loom_plot_loss_svg(const char *path, const char *title, const int64_t *steps,
                               const double *loss, size_t n, const int64_t *val_steps,
                               const double *val_loss, size_t n_val) {
    if ((n > 0 && (!steps || !loss)) || (n_val > 0 && (!val_steps || !val_loss))) {
        return loom_fail(LOOM_ERR_INPUT, "%s: loss plot: a series has points but no array", path);
    }
    extent e = {0};
    extent_add(&e, steps, loss, n);
    extent_add(&e, val_steps, val_loss, n_val);
    if (e.finite_points == 0) {
        e.xmin = 0;
        e.xmax = 1;
        e.ymin = 0;
        e.ymax = 1;
    }
    if (e.xmax <= e.xmin) { /* one step: centre it; the pad must survive rounding */
        double pad = fmax(1.0, fabs(e.xmin) * 0.1);
        e.xmin -= pad;
        e.xmax += pad;
    }
    widen(&e.ymin, &e.ymax, 1.0);
    axis xa = nice_axis(e.xmin, e.xmax, 8, 1);
    axis ya = nice_axis(e.ymin, e.ymax, 6, 0);

    loom_atomic_file *file;
    loom_status status = loom_atomic_open(&file, path);
    if (status != LOOM_OK) return status;
    FILE *out = loom_atomic_stream(file);
    fprintf(out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
            CANVAS_W, CANVAS_H, CANVAS_W, CANVAS_H);
    fprintf(out,
            "<text x=\"%d\" y=\"28\" font-family=\"sans-serif\" font-size=\"16\" "
            "text-anchor=\"middle\">",
            CANVAS_W / 2);
    write_escaped(out, title ? title : "training loss");
    fprintf(out, "</text>\n");
    write_axes(out, &xa, &ya);
    write_series(out, &xa, &ya, steps, loss, n, "#1f77b4", "", 0);
    write_series(out, &xa, &ya, val_steps, val_loss, n_val, "#ff7f0e", " stroke-dasharray=\"6 3\"",
                 n_val <= MARKER_LIMIT);
    if (e.finite_points == 0) {
        fprintf(out,
                "<text x=\"%d\" y=\"%d\" font-family=\"sans-serif\" font-size=\"14\" "
                "text-anchor=\"middle\" fill=\"#888\">no finite loss values</text>\n",
                (PLOT_LEFT + PLOT_RIGHT) / 2, (PLOT_TOP + PLOT_BOTTOM) / 2);
    }
    write_legend(out, n_val > 0);
    fprintf(out, "</svg>\n");
    return loom_atomic_commit(file);
}
