/*
 * test_plot.c — the loss plot, read back as a document: a small XML parser here checks that
 * every file is well-formed (valid UTF-8, one root, matched and properly nested tags, unique
 * attributes, only the predefined entities), then the checks read the tree. The axes are read
 * from the file itself (tick labels paired with their grid lines give the value -> pixel map),
 * so each plotted point is checked against the data value it should show: all inside the plot
 * frame, in step order, as many as the finite values given; tick labels bracket the data; the
 * legend names both series in their colours; the title reads back unescaped. Cases: ordinary
 * series with validation points, a long series not starting at 0, non-finite values, one point,
 * constant series, huge values and steps, an empty plot, a title that needs escaping.
 */
#include "train/plot.h"

#include "check.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

/* ---- a small XML parser ------------------------------------------------------------------
 * Enough of XML 1.0 for a generated SVG: declaration, comments, processing instructions,
 * elements, attributes, character data, the five predefined entities and character references.
 * DOCTYPE and CDATA are refused (the plot has no reason to write them). */

typedef struct xml_node {
    char *name;
    char **attr_names, **attr_values; /* (n_attrs,) values entity-decoded */
    int n_attrs;
    struct xml_node **children; /* (n_children,) elements only, in document order */
    int n_children;
    struct xml_node *parent;
    char *text; /* the character data directly inside, decoded and concatenated */
    size_t text_len;
} xml_node;

typedef struct {
    const char *start, *p, *end;
    char error[200];
} xml_parser;

static int xml_fail(xml_parser *x, const char *what) {
    if (!x->error[0]) snprintf(x->error, sizeof x->error, "%s at byte %td", what, x->p - x->start);
    return 0;
}

static void *xalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

static void append(char **buf, size_t *len, const char *bytes, size_t n) {
    *buf = realloc(*buf, *len + n + 1);
    if (!*buf) abort();
    memcpy(*buf + *len, bytes, n);
    *len += n;
    (*buf)[*len] = '\0';
}

/* Valid UTF-8 (no overlong forms, surrogates or values above U+10FFFF) and only the control
 * characters XML allows (tab, newline, carriage return). */
static int utf8_xml_chars(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        if (c < 0x80) {
            if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return 0;
            i++;
            continue;
        }
        int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : -1;
        if (extra < 0 || c > 0xf4 || i + (size_t)extra >= n) return 0; /* bytes i..i+extra */
        unsigned cp = c & (0x3f >> extra);
        for (int k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        unsigned min = extra == 1 ? 0x80 : extra == 2 ? 0x800 : 0x10000;
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += (size_t)extra + 1;
    }
    return 1;
}

static int starts(const xml_parser *x, const char *s) {
    size_t n = strlen(s);
    return (size_t)(x->end - x->p) >= n && memcmp(x->p, s, n) == 0;
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void skip_space(xml_parser *x) {
    while (x->p < x->end && is_space(*x->p)) x->p++;
}

static int name_start(unsigned char c) {
    return isalpha(c) || c == '_' || c == ':' || c >= 0x80;
}

static int name_char(unsigned char c) {
    return name_start(c) || isdigit(c) || c == '-' || c == '.';
}

static char *parse_name(xml_parser *x) {
    const char *start = x->p;
    if (x->p >= x->end || !name_start((unsigned char)*x->p)) {
        xml_fail(x, "expected a name");
        return NULL;
    }
    while (x->p < x->end && name_char((unsigned char)*x->p)) x->p++;
    char *name = xalloc((size_t)(x->p - start) + 1);
    memcpy(name, start, (size_t)(x->p - start));
    return name;
}

/* Appends the UTF-8 encoding of code point cp. */
static void append_code_point(char **buf, size_t *len, unsigned cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | cp >> 12), b[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f)), n = 3;
    } else {
        b[0] = (char)(0xf0 | cp >> 18), b[1] = (char)(0x80 | (cp >> 12 & 0x3f));
        b[2] = (char)(0x80 | (cp >> 6 & 0x3f)), b[3] = (char)(0x80 | (cp & 0x3f)), n = 4;
    }
    append(buf, len, b, n);
}

/* At '&': decodes one reference into buf. */
static int parse_reference(xml_parser *x, char **buf, size_t *len) {
    static const char *names[5] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
    static const char chars[5] = {'&', '<', '>', '"', '\''};
    for (int i = 0; i < 5; i++) {
        if (starts(x, names[i])) {
            append(buf, len, &chars[i], 1);
            x->p += strlen(names[i]);
            return 1;
        }
    }
    if (!starts(x, "&#")) return xml_fail(x, "an undefined entity (only the five predefined)");
    x->p += 2;
    int hex = x->p < x->end && *x->p == 'x';
    if (hex) x->p++;
    unsigned long cp = 0;
    int digits = 0;
    while (x->p < x->end &&
           (hex ? isxdigit((unsigned char)*x->p) : isdigit((unsigned char)*x->p))) {
        char c = (char)tolower((unsigned char)*x->p++);
        cp = cp * (hex ? 16 : 10) +
             (unsigned long)(isdigit((unsigned char)c) ? c - '0' : c - 'a' + 10);
        if (cp > 0x10ffff) return xml_fail(x, "a character reference beyond U+10FFFF");
        digits++;
    }
    if (!digits || x->p >= x->end || *x->p != ';') return xml_fail(x, "a malformed reference");
    x->p++;
    if ((cp < 0x20 && cp != 9 && cp != 10 && cp != 13) || (cp >= 0xd800 && cp <= 0xdfff))
        return xml_fail(x, "a reference to a character XML forbids");
    append_code_point(buf, len, (unsigned)cp);
    return 1;
}

/* Skips a comment or processing instruction at x->p if there is one; 1 if skipped. */
static int skip_misc(xml_parser *x) {
    if (starts(x, "<!--")) {
        const char *close = strstr(x->p + 4, "--");
        if (!close || close + 2 >= x->end || close[2] != '>') return xml_fail(x, "'--' in comment");
        x->p = close + 3;
        return 1;
    }
    if (starts(x, "<?")) {
        x->p += 2;
        char *target = parse_name(x);
        if (!target) return 0;
        int reserved = strlen(target) == 3 && tolower((unsigned char)target[0]) == 'x' &&
                       tolower((unsigned char)target[1]) == 'm' &&
                       tolower((unsigned char)target[2]) == 'l';
        free(target);
        if (reserved) return xml_fail(x, "an XML declaration that is not at the very start");
        const char *close = strstr(x->p, "?>");
        if (!close) return xml_fail(x, "an unclosed processing instruction");
        x->p = close + 2;
        return 1;
    }
    return 0;
}

static void xml_free(xml_node *node) {
    if (!node) return;
    for (int i = 0; i < node->n_attrs; i++) free(node->attr_names[i]), free(node->attr_values[i]);
    for (int i = 0; i < node->n_children; i++) xml_free(node->children[i]);
    free(node->attr_names), free(node->attr_values), free(node->children);
    free(node->name), free(node->text), free(node);
}

static int parse_attributes(xml_parser *x, xml_node *node) {
    for (;;) {
        const char *before = x->p;
        skip_space(x);
        if (x->p >= x->end) return xml_fail(x, "end of file inside a tag");
        if (*x->p == '>' || starts(x, "/>")) return 1;
        if (x->p == before) return xml_fail(x, "no space before an attribute");
        char *name = parse_name(x);
        if (!name) return 0;
        for (int i = 0; i < node->n_attrs; i++) {
            if (strcmp(node->attr_names[i], name) == 0) {
                free(name);
                return xml_fail(x, "a repeated attribute");
            }
        }
        skip_space(x);
        if (x->p >= x->end || *x->p != '=') {
            free(name);
            return xml_fail(x, "expected '=' after an attribute name");
        }
        x->p++;
        skip_space(x);
        char quote = x->p < x->end ? *x->p : 0;
        if (quote != '"' && quote != '\'') {
            free(name);
            return xml_fail(x, "an unquoted attribute value");
        }
        x->p++;
        char *value = xalloc(1);
        size_t len = 0;
        while (x->p < x->end && *x->p != quote) {
            if (*x->p == '<') {
                free(name), free(value);
                return xml_fail(x, "'<' in an attribute value");
            }
            if (*x->p == '&') {
                if (!parse_reference(x, &value, &len)) {
                    free(name), free(value);
                    return 0;
                }
            } else {
                append(&value, &len, x->p++, 1);
            }
        }
        if (x->p >= x->end) {
            free(name), free(value);
            return xml_fail(x, "an unterminated attribute value");
        }
        x->p++;
        node->attr_names = realloc(node->attr_names, (node->n_attrs + 1) * sizeof(char *));
        node->attr_values = realloc(node->attr_values, (node->n_attrs + 1) * sizeof(char *));
        node->attr_names[node->n_attrs] = name;
        node->attr_values[node->n_attrs++] = value;
    }
}

/* At '<' of a start tag: parses the element and everything inside it. */
static xml_node *parse_element(xml_parser *x, xml_node *parent, int depth) {
    if (depth > 64) {
        xml_fail(x, "elements nested too deeply");
        return NULL;
    }
    x->p++;
    xml_node *node = xalloc(sizeof *node);
    node->parent = parent;
    node->text = xalloc(1);
    node->name = parse_name(x);
    if (!node->name || !parse_attributes(x, node)) goto fail;
    if (starts(x, "/>")) {
        x->p += 2;
        return node;
    }
    x->p++; /* '>' */
    for (;;) {
        if (x->p >= x->end) {
            xml_fail(x, "end of file inside an element");
            goto fail;
        }
        if (starts(x, "</")) {
            x->p += 2;
            char *name = parse_name(x);
            int same = name && strcmp(name, node->name) == 0;
            free(name);
            if (!same) {
                xml_fail(x, "an end tag that does not match its start tag");
                goto fail;
            }
            skip_space(x);
            if (x->p >= x->end || *x->p != '>') {
                xml_fail(x, "a malformed end tag");
                goto fail;
            }
            x->p++;
            return node;
        }
        if (starts(x, "<!--") || starts(x, "<?")) {
            if (!skip_misc(x)) goto fail;
        } else if (starts(x, "<!")) {
            xml_fail(x, "CDATA or a declaration inside an element");
            goto fail;
        } else if (*x->p == '<') {
            xml_node *child = parse_element(x, node, depth + 1);
            if (!child) goto fail;
            node->children = realloc(node->children, (node->n_children + 1) * sizeof child);
            node->children[node->n_children++] = child;
        } else if (*x->p == '&') {
            if (!parse_reference(x, &node->text, &node->text_len)) goto fail;
        } else if (starts(x, "]]>")) {
            xml_fail(x, "']]>' in character data");
            goto fail;
        } else {
            append(&node->text, &node->text_len, x->p++, 1);
        }
    }
fail:
    xml_free(node);
    return NULL;
}

/* Parses a whole document; NULL with x->error set when it is not well-formed. */
static xml_node *xml_parse(xml_parser *x, const char *text, size_t n) {
    x->start = x->p = text;
    x->end = text + n;
    x->error[0] = '\0';
    if (!utf8_xml_chars((const unsigned char *)text, n)) {
        snprintf(x->error, sizeof x->error, "not UTF-8, or a control character XML forbids");
        return NULL;
    }
    if (starts(x, "<?xml") && x->p + 5 < x->end && is_space(x->p[5])) {
        const char *close = strstr(x->p, "?>");
        if (!close) return xml_fail(x, "an unclosed XML declaration"), NULL;
        x->p = close + 2;
    }
    for (;;) {
        skip_space(x);
        if (!skip_misc(x)) break;
    }
    if (x->error[0]) return NULL;
    if (x->p >= x->end || *x->p != '<' || starts(x, "<!")) {
        xml_fail(x, "expected the root element");
        return NULL;
    }
    xml_node *root = parse_element(x, NULL, 0);
    if (!root) return NULL;
    for (;;) {
        skip_space(x);
        if (!skip_misc(x)) break;
    }
    if (x->error[0] || x->p != x->end) {
        xml_fail(x, "content after the root element");
        xml_free(root);
        return NULL;
    }
    return root;
}

/* ---- reading the tree -------------------------------------------------------------------- */

static const char *attr(const xml_node *node, const char *name) {
    for (int i = 0; i < node->n_attrs; i++) {
        if (strcmp(node->attr_names[i], name) == 0) return node->attr_values[i];
    }
    return NULL;
}

/* A whole string that is one finite number. */
static int parse_number(const char *s, double *value) {
    if (!s) return 0;
    while (is_space(*s)) s++;
    char *end;
    errno = 0;
    *value = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(*value)) return 0;
    while (is_space(*end)) end++;
    return *end == '\0';
}

static int attr_number(const xml_node *node, const char *name, double *value) {
    return parse_number(attr(node, name), value);
}

typedef struct {
    xml_node **items;
    int count;
} node_list;

/* Every element named `name` under node (node included), in document order. */
static void collect(xml_node *node, const char *name, node_list *out) {
    if (strcmp(node->name, name) == 0) {
        out->items = realloc(out->items, (out->count + 1) * sizeof *out->items);
        out->items[out->count++] = node;
    }
    for (int i = 0; i < node->n_children; i++) collect(node->children[i], name, out);
}

static node_list all(xml_node *root, const char *name) {
    node_list list = {0};
    collect(root, name, &list);
    return list;
}

/* ---- the plot as read from the file ------------------------------------------------------ */

enum { MAX_POINTS = 4096, MAX_TICKS = 128 };

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
    xml_node *root;
    double left, top, right, bottom; /* the frame: the rect with fill="none" */
    polyline lines[4];
    int n_lines;
    ticks x_ticks, y_ticks;
    char *svg;
} plot;

/* "x,y x,y ..." into line; 0 if malformed or not finite. */
static int parse_points(const char *points, polyline *line) {
    line->count = 0;
    const char *p = points;
    for (;;) {
        while (is_space(*p)) p++;
        if (!*p) return line->count > 0;
        char *end;
        double x = strtod(p, &end);
        if (end == p || *end != ',') return 0;
        p = end + 1;
        double y = strtod(p, &end);
        if (end == p || (*end && !is_space(*end)) || !isfinite(x) || !isfinite(y)) return 0;
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
static int read_ticks(plot *pl, const node_list *texts, const node_list *lines, int vertical,
                      ticks *out, const char *what) {
    double values[MAX_TICKS], label_pos[MAX_TICKS], grid[MAX_TICKS];
    int n_labels = 0, n_grid = 0;
    for (int i = 0; i < texts->count; i++) {
        xml_node *t = texts->items[i];
        double x, y, value;
        if (!attr_number(t, "x", &x) || !attr_number(t, "y", &y)) continue;
        if (!parse_number(t->text, &value)) continue; /* titles, axis names, legend */
        int is_x_label = y > pl->bottom && x >= pl->left - 0.01 && x <= pl->right + 0.01;
        int is_y_label = x < pl->left && y >= pl->top - 1 && y <= pl->bottom + 12;
        if (vertical ? !is_x_label : !is_y_label) continue;
        if (n_labels == MAX_TICKS) return 0;
        values[n_labels] = value;
        label_pos[n_labels++] = vertical ? x : y;
    }
    for (int i = 0; i < lines->count; i++) {
        double x1, y1, x2, y2;
        xml_node *l = lines->items[i];
        if (!attr_number(l, "x1", &x1) || !attr_number(l, "y1", &y1) ||
            !attr_number(l, "x2", &x2) || !attr_number(l, "y2", &y2))
            continue;
        int spans_v = x1 == x2 && y1 == pl->top && y2 == pl->bottom;
        int spans_h = y1 == y2 && x1 == pl->left && x2 == pl->right;
        if (vertical ? !spans_v : !spans_h) continue;
        if (n_grid == MAX_TICKS) return 0;
        grid[n_grid++] = vertical ? x1 : y1;
    }
    CHECK(n_labels >= 2 && n_labels == n_grid, "%s: %d tick labels, %d grid lines", what, n_labels,
          n_grid);
    if (n_labels < 2 || n_labels != n_grid) return 0;
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
    return beside && monotone && linear;
}

/* Pixel of a data value on an axis, from its first and last ticks. */
static double to_pixel(const ticks *t, double value) {
    double v0 = t->value[0], v1 = t->value[t->count - 1];
    return t->pixel[0] + (value - v0) / (v1 - v0) * (t->pixel[t->count - 1] - t->pixel[0]);
}

static void plot_free(plot *pl) {
    xml_free(pl->root);
    free(pl->svg);
    free(pl);
}

static char *read_text(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    *n = fread(buf, 1, (size_t)size, f);
    buf[*n] = '\0';
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

/* Every number-valued attribute of every element parses as a finite number. */
static int numbers_finite(const xml_node *node) {
    static const char *numeric[] = {"x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r"};
    for (size_t i = 0; i < sizeof numeric / sizeof *numeric; i++) {
        double v;
        const char *s = attr(node, numeric[i]);
        if (s && !parse_number(s, &v)) return 0;
    }
    for (int i = 0; i < node->n_children; i++) {
        if (!numbers_finite(node->children[i])) return 0;
    }
    return 1;
}

/* Parses the file and reads what every plot must have: an <svg> root, the frame, the axes. */
static plot *read_plot(const char *path, const char *what) {
    plot *pl = xalloc(sizeof *pl);
    size_t n = 0;
    pl->svg = read_text(path, &n);
    CHECK(pl->svg != NULL, "%s: file written", what);
    if (!pl->svg) return free(pl), NULL;
    xml_parser parser;
    pl->root = xml_parse(&parser, pl->svg, n);
    CHECK(pl->root != NULL, "%s: well-formed XML: %s", what, parser.error);
    if (!pl->root) return plot_free(pl), NULL;
    CHECK(strcmp(pl->root->name, "svg") == 0 && attr(pl->root, "xmlns") &&
              strcmp(attr(pl->root, "xmlns"), "http://www.w3.org/2000/svg") == 0,
          "%s: the root is an SVG element", what);
    CHECK(!contains_nocase(pl->svg, "nan") && !contains_nocase(pl->svg, "inf"), "%s: no nan/inf",
          what);
    CHECK(numbers_finite(pl->root), "%s: every coordinate is a finite number", what);
    double width, height;
    CHECK(attr_number(pl->root, "width", &width) && attr_number(pl->root, "height", &height),
          "%s: canvas size", what);

    node_list rects = all(pl->root, "rect");
    int frames = 0;
    for (int i = 0; i < rects.count; i++) {
        const char *fill = attr(rects.items[i], "fill");
        double x, y, w, h;
        if (!fill || strcmp(fill, "none") != 0) continue;
        if (attr_number(rects.items[i], "x", &x) && attr_number(rects.items[i], "y", &y) &&
            attr_number(rects.items[i], "width", &w) && attr_number(rects.items[i], "height", &h)) {
            pl->left = x, pl->top = y, pl->right = x + w, pl->bottom = y + h;
            frames++;
        }
    }
    free(rects.items);
    CHECK(frames == 1 && pl->left >= 0 && pl->top >= 0 && pl->right <= width &&
              pl->bottom <= height && pl->right > pl->left && pl->bottom > pl->top,
          "%s: one plot frame inside the canvas", what);

    node_list polylines = all(pl->root, "polyline");
    for (int i = 0; i < polylines.count && pl->n_lines < 4; i++) {
        polyline *line = &pl->lines[pl->n_lines++];
        const char *stroke = attr(polylines.items[i], "stroke");
        snprintf(line->stroke, sizeof line->stroke, "%s", stroke ? stroke : "");
        const char *points = attr(polylines.items[i], "points");
        CHECK(points && parse_points(points, line), "%s: polyline %d points parse", what, i);
    }
    free(polylines.items);

    node_list texts = all(pl->root, "text"), lines = all(pl->root, "line");
    read_ticks(pl, &texts, &lines, 1, &pl->x_ticks, what);
    read_ticks(pl, &texts, &lines, 0, &pl->y_ticks, what);
    free(texts.items);
    free(lines.items);
    return pl;
}

static int inside_frame(const plot *pl, double x, double y) {
    const double slack = 0.006; /* coordinates are printed with two decimals */
    return x >= pl->left - slack && x <= pl->right + slack && y >= pl->top - slack &&
           y <= pl->bottom + slack;
}

/* The finite (step, value) pairs of a series, in input order. */
static int finite_points(const int64_t *steps, const double *values, int n, double *xs,
                         double *ys) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(values[i])) continue;
        xs[count] = (double)steps[i];
        ys[count++] = values[i];
    }
    return count;
}

/* A polyline shows a series: one point per finite value, in step order, each inside the frame
 * and where the axes put that (step, value). */
static void check_series(const plot *pl, const polyline *line, const int64_t *steps,
                         const double *values, int n, const char *what) {
    static double xs[MAX_POINTS], ys[MAX_POINTS];
    int count = finite_points(steps, values, n, xs, ys);
    CHECK(line->count == count, "%s: %d points plotted for %d finite values", what, line->count,
          count);
    if (line->count != count || pl->x_ticks.count < 2 || pl->y_ticks.count < 2) return;
    int inside = 1, ordered = 1, placed = 1;
    for (int i = 0; i < count; i++) {
        inside &= inside_frame(pl, line->x[i], line->y[i]);
        if (i > 0) ordered &= line->x[i] > line->x[i - 1];
        double px = to_pixel(&pl->x_ticks, xs[i]), py = to_pixel(&pl->y_ticks, ys[i]);
        if (fabs(line->x[i] - px) > 0.011 || fabs(line->y[i] - py) > 0.011) {
            if (placed) {
                fprintf(stderr,
                        "%s: point %d (%g, %g) drawn at (%.2f, %.2f), axes say (%.3f, %.3f)\n",
                        what, i, xs[i], ys[i], line->x[i], line->y[i], px, py);
            }
            placed = 0;
        }
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

/* The legend: a text naming the series, right after a line in the series' colour. */
static int legend_names(const plot *pl, const char *name, const char *stroke) {
    node_list texts = all(pl->root, "text");
    int found = 0;
    for (int i = 0; i < texts.count && !found; i++) {
        xml_node *t = texts.items[i], *parent = t->parent;
        if (strcmp(t->text, name) != 0 || !parent) continue;
        for (int k = 1; k < parent->n_children; k++) {
            xml_node *swatch = parent->children[k - 1];
            if (parent->children[k] == t && strcmp(swatch->name, "line") == 0 &&
                attr(swatch, "stroke") && strcmp(attr(swatch, "stroke"), stroke) == 0) {
                found = 1;
            }
        }
    }
    free(texts.items);
    return found;
}

static int count_elements(const plot *pl, const char *name) {
    node_list list = all(pl->root, name);
    free(list.items);
    return list.count;
}

/* The circles drawn, in document order, into xs/ys. */
static int circles(const plot *pl, double *xs, double *ys) {
    node_list list = all(pl->root, "circle");
    int n = 0;
    for (int i = 0; i < list.count && n < MAX_POINTS; i++) {
        if (attr_number(list.items[i], "cx", &xs[n]) && attr_number(list.items[i], "cy", &ys[n]))
            n++;
    }
    free(list.items);
    return n;
}

static int has_text(const plot *pl, const char *content) {
    node_list texts = all(pl->root, "text");
    int found = 0;
    for (int i = 0; i < texts.count; i++) found |= strcmp(texts.items[i]->text, content) == 0;
    free(texts.items);
    return found;
}

/* ---- the parser itself ------------------------------------------------------------------- */

static void test_parser(void) {
    static const char *good[] = {
        "<a/>",
        "<?xml version=\"1.0\"?>\n<a x='1' y=\"&lt;&amp;&#65;&#x42;\">t&gt;<b/><!-- c --></a>\n",
        "<a><b><c>text</c></b><?pi data?></a>",
        "<a>caf\xc3\xa9</a>",
    };
    static const char *bad[] = {
        "",
        "<a>",
        "<a></b>",
        "<a><b></a></b>",
        "<a x=\"1\" x=\"2\"/>",
        "<a x=1/>",
        "<a x=\"<\"/>",
        "<a>&nbsp;</a>",
        "<a>&amp</a>",
        "<a/><b/>",
        "<a/>trailing",
        "text<a/>",
        "<a>caf\xe9</a>",
        "<a>\x01</a>",
        "<a>&#1;</a>",
        "<a x=\"1\"y=\"2\"/>",
        "<a><!-- a -- b --></a>",
        " <?xml version=\"1.0\"?><a/>",
        "<a>]]></a>",
        "<1a/>",
    };
    int good_ok = 1, bad_refused = 1;
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        xml_parser x;
        xml_node *root = xml_parse(&x, good[i], strlen(good[i]));
        if (!root) fprintf(stderr, "good document %zu refused: %s\n", i, x.error);
        good_ok &= root != NULL;
        if (i == 1 && root) {
            good_ok &= strcmp(attr(root, "y"), "<&AB") == 0 && strcmp(root->text, "t>") == 0 &&
                       root->n_children == 1;
        }
        xml_free(root);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        xml_parser x;
        xml_node *root = xml_parse(&x, bad[i], strlen(bad[i]));
        if (root) fprintf(stderr, "malformed document %zu accepted: %s\n", i, bad[i]);
        bad_refused &= root == NULL;
        xml_free(root);
    }
    CHECK(good_ok, "the checker accepts well-formed documents and decodes them");
    CHECK(bad_refused, "the checker refuses malformed ones");
}

/* ---- the plots --------------------------------------------------------------------------- */

static const char *tmp;

static const char *path_of(const char *name) {
    static char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    return path;
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
        int n = circles(pl, cx, cy);
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
    CHECK(circles(pl, cx, cy) == 1 && fabs(cx[0] - to_pixel(&pl->x_ticks, 5)) < 0.011 &&
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
    CHECK(pl->n_lines == 0 && circles(pl, cx, cy) == 1, "a single point is drawn as a marker");
    CHECK(inside_frame(pl, cx[0], cy[0]) && fabs(cx[0] - to_pixel(&pl->x_ticks, 7)) < 0.011 &&
              fabs(cy[0] - to_pixel(&pl->y_ticks, 3.25)) < 0.011,
          "the marker is at (7, 3.25), inside the frame");
    check_ticks_bracket(pl, steps, loss, 1, NULL, NULL, 0, "one point");
    node_list marks = all(pl->root, "circle");
    const char *colour = marks.count == 1 ? attr(marks.items[0]->parent, "fill") : NULL;
    CHECK(colour && legend_names(pl, "train", colour), "the legend names train in its colour");
    free(marks.items);
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
        CHECK(pl->n_lines == 0 && count_elements(pl, "circle") == 0, "all NaN: nothing plotted");
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
        CHECK(circles(pl, cx, cy) == 1 && inside_frame(pl, cx[0], cy[0]),
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
    tmp = check_tmpdir();
    test_parser();
    test_ordinary();
    test_long_series();
    test_non_finite();
    test_one_point();
    test_constant(2.0, "flat.svg");
    test_constant(0.0, "zero.svg");
    test_degenerate();
    test_title_and_errors();
    return check_finish();
}
