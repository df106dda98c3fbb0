/*
 * cluster.c — the cluster description (loom/cluster.h): precisions, reading (through
 * json_fields.c, so that every message reads like the plan file's: file, JSON path, expectation,
 * value), the rules, writing, and the three figures the cost model asks of a description: the
 * share of peak a GEMM reaches, a GEMM's seconds and a collective's seconds.
 *
 * Reading checks the types and the shape of the document and turns its words (precisions,
 * collective ops, link classes, compressor methods) into indices; the value rules are
 * loom_cluster_check's, applied to the result, so that a description `loom profile` builds in
 * memory meets the same ones before it is written.
 *
 * Not here: the time of a stage, a pipeline or a plan (the cost model), measuring (profile).
 */
#include "loom/cluster.h"
#include "base/json_fields.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- words ---------------------------------------------------------------------------------- */

static const char *const op_names[LOOM_COLLECTIVE_OPS] = {"allreduce", "allgather",
                                                          "reduce_scatter", "sendrecv"};
static const char *const link_names[LOOM_LINK_CLASSES] = {"intra_node", "inter_node"};

static const loom_words op_words = {op_names, LOOM_COLLECTIVE_OPS};
static const loom_words link_words = {link_names, LOOM_LINK_CLASSES};

/* A compressor throughput is keyed by any method name, whatever place the method is used in. */
#define ANY_PLACE (LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD | LOOM_COMPRESS_FOR_PP_FORWARD)

/* ---- reading -------------------------------------------------------------------------------- */

/* A string of 1 to cap - 1 bytes into out[cap]. */
static loom_status read_text(const char *file, const json_t *object, const char *parent,
                             const char *key, char *out, size_t cap) {
    char expected[64];
    snprintf(expected, sizeof expected, "a string of 1 to %zu bytes", cap - 1);
    json_t *value;
    loom_status st = loom_json_member(file, object, parent, key, 1, expected, &value);
    if (st != LOOM_OK) return st;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    if (!json_is_string(value) || json_string_length(value) == 0 ||
        json_string_length(value) >= cap) {
        return loom_json_fail_type(file, path, expected, value);
    }
    snprintf(out, cap, "%s", json_string_value(value));
    return LOOM_OK;
}

/* "source" (a string) or "sources" (an object of strings): free text, read by people only. */
static loom_status read_source(const char *file, const json_t *object, const char *parent) {
    char path[256];
    json_t *value = json_object_get(object, "source");
    if (value && !json_is_string(value)) {
        loom_json_join_path(path, sizeof path, parent, "source");
        return loom_json_fail_type(file, path, "free text (a string)", value);
    }
    value = json_object_get(object, "sources");
    if (!value) return LOOM_OK;
    loom_json_join_path(path, sizeof path, parent, "sources");
    if (!json_is_object(value)) {
        return loom_json_fail_type(file, path, "an object of free-text strings", value);
    }
    const char *key;
    json_t *text;
    json_object_foreach(value, key, text) {
        if (json_is_string(text)) continue;
        char item[512];
        loom_json_join_path(item, sizeof item, path, key);
        return loom_json_fail_type(file, item, "free text (a string)", text);
    }
    return LOOM_OK;
}

/* A word from `words` (required) into *index. */
static loom_status read_word_index(const char *file, const json_t *object, const char *parent,
                                   const char *key, const loom_words *words, int *index) {
    char list[128];
    loom_word_list(words, list, sizeof list);
    json_t *value;
    loom_status st = loom_json_member(file, object, parent, key, 1, list, &value);
    if (st != LOOM_OK) return st;
    *index = loom_word_index(words, json_string_value(value));
    if (*index >= 0) return LOOM_OK;
    char path[256];
    loom_json_join_path(path, sizeof path, parent, key);
    return loom_json_fail_type(file, path, list, value);
}

static loom_status read_peaks(const char *file, const json_t *device, loom_cluster *c) {
    const char *path = "node.device.peak_flops";
    json_t *peaks;
    loom_status st = loom_json_member(file, device, "node.device", "peak_flops", 1,
                                      "an object of FLOP/s per precision", &peaks);
    if (st == LOOM_OK) st = loom_json_as_object(file, path, peaks);
    if (st != LOOM_OK) return st;
    const char *key;
    json_t *value;
    json_object_foreach(peaks, key, value) {
        char field[256];
        loom_json_join_path(field, sizeof field, path, key);
        loom_precision p = LOOM_PRECISION_FP32;
        st = loom_precision_parse(key, file, field, &p);
        if (st == LOOM_OK && !json_is_number(value)) {
            st = loom_json_fail_type(file, field, "a number (FLOP/s)", value);
        }
        if (st != LOOM_OK) return st;
        c->peak_flops[p] = json_number_value(value);
    }
    return LOOM_OK;
}

/* "training_precision" (optional: fp32 when left out) into c->training_precision. */
static loom_status read_training_precision(const char *file, const json_t *device,
                                           loom_cluster *c) {
    const char *path = "node.device.training_precision";
    c->training_precision = LOOM_PRECISION_FP32;
    json_t *value = json_object_get(device, "training_precision");
    if (!value) return LOOM_OK;
    if (!json_is_string(value)) {
        return loom_json_fail_type(file, path, "a precision: \"fp32\", \"bf16\" or \"fp16\"",
                                   value);
    }
    return loom_precision_parse(json_string_value(value), file, path, &c->training_precision);
}

/* "attention" (optional: "materialized" when left out) into c->fused_attention. */
static loom_status read_attention(const char *file, const json_t *device, loom_cluster *c) {
    static const char *const words[] = {"materialized", "fused"};
    const loom_words list = {words, 2};
    const char *path = "node.device.attention";
    json_t *value = json_object_get(device, "attention");
    c->fused_attention = 0;
    if (!value) return LOOM_OK;
    int index = json_is_string(value) ? loom_word_index(&list, json_string_value(value)) : -1;
    if (index < 0) return loom_json_fail_type(file, path, "\"materialized\" or \"fused\"", value);
    c->fused_attention = index;
    return LOOM_OK;
}

static loom_status read_gemm_table(const char *file, const json_t *device, loom_cluster *c) {
    static const char *const keys[] = {"flops", "efficiency"};
    const char *path = "node.device.gemm_efficiency";
    char expected[96];
    snprintf(expected, sizeof expected, "a list of 1 to %d {\"flops\", \"efficiency\"} points",
             LOOM_CLUSTER_MAX_GEMM_POINTS);
    json_t *table;
    loom_status st =
        loom_json_member(file, device, "node.device", "gemm_efficiency", 1, expected, &table);
    if (st != LOOM_OK) return st;
    size_t n = json_array_size(table);
    if (!json_is_array(table) || n == 0 || n > LOOM_CLUSTER_MAX_GEMM_POINTS) {
        return loom_json_fail_type(file, path, expected, table);
    }
    c->gemm_points = (int)n;
    for (size_t i = 0; i < n && st == LOOM_OK; i++) {
        char item[64];
        snprintf(item, sizeof item, "%s[%zu]", path, i);
        json_t *point = json_array_get(table, i);
        st = loom_json_as_object(file, item, point);
        if (st == LOOM_OK) st = loom_json_check_keys(file, point, item, keys, 2);
        if (st == LOOM_OK) {
            st = loom_json_read_number(file, point, item, "flops", 1, &c->gemm[i].flops);
        }
        if (st == LOOM_OK) {
            st = loom_json_read_number(file, point, item, "efficiency", 1, &c->gemm[i].efficiency);
        }
    }
    return st;
}

static loom_status read_device(const char *file, const json_t *node, loom_cluster *c) {
    static const char *const keys[] = {"name",
                                       "memory_bytes",
                                       "peak_flops",
                                       "training_precision",
                                       "attention",
                                       "memory_bandwidth",
                                       "optimizer_params_per_s",
                                       "gemm_efficiency",
                                       "sources"};
    const char *path = "node.device";
    json_t *device;
    loom_status st = loom_json_member(file, node, "node", "device", 1, "an object", &device);
    if (st == LOOM_OK) st = loom_json_as_object(file, path, device);
    if (st == LOOM_OK) st = loom_json_check_keys(file, device, path, keys, 9);
    if (st == LOOM_OK)
        st = read_text(file, device, path, "name", c->device_name, sizeof c->device_name);
    json_t *memory = NULL;
    if (st == LOOM_OK) {
        st = loom_json_member(file, device, path, "memory_bytes", 1, "an integer byte count",
                              &memory);
    }
    if (st == LOOM_OK && !json_is_integer(memory)) {
        st = loom_json_fail_type(file, "node.device.memory_bytes", "an integer byte count", memory);
    }
    if (st == LOOM_OK) c->memory_bytes = (int64_t)json_integer_value(memory);
    if (st == LOOM_OK) st = read_peaks(file, device, c);
    if (st == LOOM_OK) st = read_training_precision(file, device, c);
    if (st == LOOM_OK) st = read_attention(file, device, c);
    if (st == LOOM_OK) {
        st = loom_json_read_number(file, device, path, "memory_bandwidth", 1, &c->memory_bandwidth);
    }
    if (st == LOOM_OK) {
        st = loom_json_read_number(file, device, path, "optimizer_params_per_s", 0,
                                   &c->optimizer_params_per_s);
    }
    if (st == LOOM_OK) st = read_gemm_table(file, device, c);
    if (st == LOOM_OK) st = read_source(file, device, path);
    return st;
}

static loom_status read_links(const char *file, const json_t *node, loom_cluster *c) {
    static const char *const keys[] = {"bandwidth", "latency_s", "call_latency_s", "source"};
    json_t *links;
    loom_status st = loom_json_member(file, node, "node", "links", 1,
                                      "an object with intra_node and inter_node", &links);
    if (st == LOOM_OK) st = loom_json_as_object(file, "node.links", links);
    if (st == LOOM_OK) st = loom_json_check_keys(file, links, "node.links", link_names, 2);
    for (int l = 0; l < LOOM_LINK_CLASSES && st == LOOM_OK; l++) {
        char path[64];
        snprintf(path, sizeof path, "node.links.%s", link_names[l]);
        json_t *link;
        st = loom_json_member(file, links, "node.links", link_names[l], 1,
                              "an object with bandwidth and latency_s", &link);
        if (st == LOOM_OK) st = loom_json_as_object(file, path, link);
        if (st == LOOM_OK) st = loom_json_check_keys(file, link, path, keys, 4);
        if (st == LOOM_OK) {
            st = loom_json_read_number(file, link, path, "bandwidth", 1, &c->links[l].bandwidth);
        }
        if (st == LOOM_OK) {
            st = loom_json_read_number(file, link, path, "latency_s", 1, &c->links[l].latency_s);
        }
        if (st == LOOM_OK) {
            st = loom_json_read_number(file, link, path, "call_latency_s", 0,
                                       &c->links[l].call_latency_s);
        }
        if (st == LOOM_OK) st = read_source(file, link, path);
    }
    return st;
}

static loom_status read_node(const char *file, const json_t *root, loom_cluster *c) {
    static const char *const keys[] = {"devices", "device", "links"};
    json_t *node;
    loom_status st = loom_json_member(file, root, "", "node", 1, "an object", &node);
    if (st == LOOM_OK) st = loom_json_as_object(file, "node", node);
    if (st == LOOM_OK) st = loom_json_check_keys(file, node, "node", keys, 3);
    if (st == LOOM_OK)
        st = loom_json_read_int(file, node, "node", "devices", 1, &c->devices_per_node);
    if (st == LOOM_OK) st = read_device(file, node, c);
    if (st == LOOM_OK) st = read_links(file, node, c);
    return st;
}

static loom_status read_collectives(const char *file, const json_t *root, loom_cluster *c) {
    static const char *const keys[] = {"op", "link", "ranks", "alpha_s", "beta_s_per_byte"};
    json_t *fits = json_object_get(root, "collectives");
    if (!fits) return LOOM_OK;
    char expected[64];
    snprintf(expected, sizeof expected, "a list of at most %d fits", LOOM_CLUSTER_MAX_COLLECTIVES);
    size_t n = json_array_size(fits);
    if (!json_is_array(fits) || n > LOOM_CLUSTER_MAX_COLLECTIVES) {
        return loom_json_fail_type(file, "collectives", expected, fits);
    }
    c->num_collectives = (int)n;
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < n && st == LOOM_OK; i++) {
        char path[64];
        snprintf(path, sizeof path, "collectives[%zu]", i);
        json_t *fit = json_array_get(fits, i);
        loom_collective_fit *f = &c->collectives[i];
        int op = 0;
        st = loom_json_as_object(file, path, fit);
        if (st == LOOM_OK) st = loom_json_check_keys(file, fit, path, keys, 5);
        if (st == LOOM_OK) st = read_word_index(file, fit, path, "op", &op_words, &op);
        f->op = (loom_collective_op)op;
        if (st == LOOM_OK) st = read_word_index(file, fit, path, "link", &link_words, &f->link);
        if (st == LOOM_OK) st = loom_json_read_int(file, fit, path, "ranks", 1, &f->ranks);
        if (st == LOOM_OK) st = loom_json_read_number(file, fit, path, "alpha_s", 1, &f->alpha_s);
        if (st == LOOM_OK) {
            st = loom_json_read_number(file, fit, path, "beta_s_per_byte", 1, &f->beta_s_per_byte);
        }
    }
    return st;
}

static loom_status read_compressors(const char *file, const json_t *root, loom_cluster *c) {
    json_t *compressors = json_object_get(root, "compressors");
    if (!compressors) return LOOM_OK;
    if (!json_is_object(compressors)) {
        return loom_json_fail_type(file, "compressors", "an object of bytes/s per method",
                                   compressors);
    }
    const char *key;
    json_t *value;
    json_object_foreach(compressors, key, value) {
        char path[256];
        loom_json_join_path(path, sizeof path, "compressors", key);
        loom_compress_method m = LOOM_COMPRESS_NONE;
        loom_status st = loom_compress_method_parse(key, ANY_PLACE, file, path, &m);
        if (st != LOOM_OK) return st;
        if (!json_is_number(value)) return loom_json_fail_type(file, path, "a number", value);
        c->compressor_bytes_per_s[m] = json_number_value(value);
    }
    return LOOM_OK;
}

/* A link object at `path`: bandwidth, latency_s, call_latency_s (optional), source. */
static loom_status read_link(const char *file, const json_t *parent, const char *parent_path,
                             const char *key, loom_link *l) {
    static const char *const keys[] = {"bandwidth", "latency_s", "call_latency_s", "source"};
    char path[64];
    loom_json_join_path(path, sizeof path, parent_path, key);
    json_t *link;
    loom_status st = loom_json_member(file, parent, parent_path, key, 1,
                                      "an object with bandwidth and latency_s", &link);
    if (st == LOOM_OK) st = loom_json_as_object(file, path, link);
    if (st == LOOM_OK) st = loom_json_check_keys(file, link, path, keys, 4);
    if (st == LOOM_OK) st = loom_json_read_number(file, link, path, "bandwidth", 1, &l->bandwidth);
    if (st == LOOM_OK) st = loom_json_read_number(file, link, path, "latency_s", 1, &l->latency_s);
    if (st == LOOM_OK) {
        st = loom_json_read_number(file, link, path, "call_latency_s", 0, &l->call_latency_s);
    }
    if (st == LOOM_OK) st = read_source(file, link, path);
    return st;
}

/* islands (optional): nodes, link. */
static loom_status read_islands(const char *file, const json_t *root, loom_cluster *c) {
    static const char *const keys[] = {"nodes", "link"};
    json_t *islands = json_object_get(root, "islands");
    if (!islands) return LOOM_OK;
    loom_status st = loom_json_as_object(file, "islands", islands);
    if (st == LOOM_OK) st = loom_json_check_keys(file, islands, "islands", keys, 2);
    if (st == LOOM_OK)
        st = loom_json_read_int(file, islands, "islands", "nodes", 1, &c->island_nodes);
    if (st == LOOM_OK && c->island_nodes < 1) {
        return loom_fail_field(file, "islands.nodes", "expected at least 1 node an island, got %d",
                               c->island_nodes);
    }
    if (st == LOOM_OK) st = read_link(file, islands, "islands", "link", &c->island_link);
    return st;
}

static loom_status read_document(const char *file, const json_t *root, loom_cluster *c) {
    static const char *const keys[] = {"name", "source",      "nodes",       "max_nodes",
                                       "node", "collectives", "compressors", "islands"};
    if (!json_is_object(root)) {
        return loom_json_fail_type(file, "(top level)", "a JSON object", root);
    }
    loom_status st = loom_json_check_keys(file, root, "", keys, 8);
    if (st == LOOM_OK) st = read_text(file, root, "", "name", c->name, sizeof c->name);
    if (st == LOOM_OK) st = read_source(file, root, "");
    if (st == LOOM_OK) st = loom_json_read_int(file, root, "", "nodes", 1, &c->nodes);
    if (st == LOOM_OK) st = loom_json_read_int(file, root, "", "max_nodes", 1, &c->max_nodes);
    if (st == LOOM_OK) st = read_node(file, root, c);
    if (st == LOOM_OK) st = read_collectives(file, root, c);
    if (st == LOOM_OK) st = read_compressors(file, root, c);
    if (st == LOOM_OK) st = read_islands(file, root, c);
    return st;
}

loom_status loom_cluster_read(const char *path, loom_cluster *cluster) {
    memset(cluster, 0, sizeof *cluster);
    json_t *root;
    loom_status st = loom_json_load(path, &root);
    if (st != LOOM_OK) return st;
    st = read_document(path, root, cluster);
    json_decref(root);
    if (st == LOOM_OK) st = loom_cluster_check(cluster, path);
    if (st != LOOM_OK) memset(cluster, 0, sizeof *cluster);
    return st;
}

/* ---- the rules ------------------------------------------------------------------------------ */

/* `value` must be finite and > 0 (or >= 0 when zero_ok); `what` follows the bound. */
static loom_status check_number(const char *source, const char *path, double value, int zero_ok,
                                const char *what) {
    if (isfinite(value) && (value > 0 || (zero_ok && value == 0))) return LOOM_OK;
    char got[32];
    loom_json_format_double(value, got, sizeof got);
    return loom_fail_field(source, path, "expected a finite number %s%s, got %s",
                           zero_ok ? ">= 0" : "> 0", what, got);
}

/* `value` (finite, and > 0 or an allowed 0: check_number's) within [lo, hi] or 0 where 0 means
 * "not offered" or "not measured" (zero_ok): loom/cluster.h's plausible bounds, so that a typo
 * such as a bandwidth of 1e-300 or a latency of 1e308 is refused by name, not planned with. */
static loom_status check_plausible(const char *source, const char *path, double value, int zero_ok,
                                   double lo, double hi, const char *unit) {
    if ((zero_ok && value == 0) || (value >= lo && value <= hi)) return LOOM_OK;
    char got[32];
    loom_json_format_double(value, got, sizeof got);
    return loom_fail_field(source, path, "expected %s%g to %g %s (the plausible range), got %s",
                           zero_ok ? "0 or " : "", lo, hi, unit, got);
}

/* check_number, then check_plausible within [lo, hi] (where a 0 that zero_ok allows below lo
 * means "not offered" or "not measured"). */
static loom_status check_bounded(const char *source, const char *path, double value, int zero_ok,
                                 const char *what, double lo, double hi, const char *unit) {
    loom_status st = check_number(source, path, value, zero_ok, what);
    if (st == LOOM_OK) st = check_plausible(source, path, value, zero_ok && lo > 0, lo, hi, unit);
    return st;
}

/* A NUL-terminated name of 1 to cap - 1 bytes of UTF-8 (so that it is written as it reads). */
static loom_status check_name(const char *source, const char *path, const char *name, size_t cap) {
    const char *end = memchr(name, '\0', cap);
    size_t len = end ? (size_t)(end - name) : cap;
    if (len == 0 || len == cap) {
        return loom_fail_field(source, path, "expected a name of 1 to %zu bytes, got %s", cap - 1,
                               len == 0 ? "\"\"" : "a longer one");
    }
    json_t *probe = json_string(name);
    if (!probe) return loom_fail_field(source, path, "expected UTF-8 text");
    json_decref(probe);
    return LOOM_OK;
}

/* The training precision must be one the device offers a peak for (fp32, the default when the
 * file leaves it out, included). */
static loom_status check_training_precision(const loom_cluster *c, const char *source) {
    const char *path = "node.device.training_precision";
    loom_precision p = c->training_precision;
    if ((int)p < 0 || p >= LOOM_PRECISIONS) {
        return loom_fail_field(source, path, "expected \"fp32\", \"bf16\" or \"fp16\", got %d",
                               (int)p);
    }
    if (c->peak_flops[p] > 0) return LOOM_OK;
    char offered[64] = "";
    size_t used = 0;
    for (int q = 0; q < LOOM_PRECISIONS; q++) {
        if (!(c->peak_flops[q] > 0)) continue;
        used += (size_t)snprintf(offered + used, sizeof offered - used, "%s%s", used ? ", " : "",
                                 loom_precision_name((loom_precision)q));
    }
    return loom_fail_field(source, path,
                           "expected a precision node.device.peak_flops offers (%s), got \"%s\" "
                           "(peak_flops.%s is 0: not offered)%s",
                           offered, loom_precision_name(p), loom_precision_name(p),
                           p == LOOM_PRECISION_FP32 ? "; fp32 is the default when the field is "
                                                      "left out: name the precision the cluster "
                                                      "trains in"
                                                    : "");
}

static loom_status check_device(const loom_cluster *c, const char *source) {
    loom_status st = check_name(source, "node.device.name", c->device_name, sizeof c->device_name);
    if (st == LOOM_OK && c->memory_bytes <= 0) {
        st = loom_fail_field(source, "node.device.memory_bytes",
                             "expected a byte count > 0, got %" PRId64, c->memory_bytes);
    }
    int offered = 0;
    for (int p = 0; p < LOOM_PRECISIONS && st == LOOM_OK; p++) {
        char path[64];
        snprintf(path, sizeof path, "node.device.peak_flops.%s",
                 loom_precision_name((loom_precision)p));
        st = check_bounded(source, path, c->peak_flops[p], 1,
                           " (FLOP/s; 0: the precision is not offered)", LOOM_CLUSTER_MIN_FLOPS,
                           LOOM_CLUSTER_MAX_FLOPS, "FLOP/s");
        offered |= c->peak_flops[p] > 0;
    }
    if (st == LOOM_OK && !offered) {
        st = loom_fail_field(source, "node.device.peak_flops",
                             "expected a peak > 0 for at least one of fp32, bf16 and fp16, "
                             "got none");
    }
    if (st == LOOM_OK) st = check_training_precision(c, source);
    if (st == LOOM_OK) {
        st = check_bounded(source, "node.device.memory_bandwidth", c->memory_bandwidth, 0,
                           " (bytes/s)", LOOM_CLUSTER_MIN_RATE, LOOM_CLUSTER_MAX_RATE, "bytes/s");
    }
    if (st == LOOM_OK) {
        st = check_bounded(source, "node.device.optimizer_params_per_s", c->optimizer_params_per_s,
                           1, " (parameters/s; 0: not measured)", LOOM_CLUSTER_MIN_RATE,
                           LOOM_CLUSTER_MAX_RATE, "parameters/s");
    }
    return st;
}

static loom_status check_gemm_table(const loom_cluster *c, const char *source) {
    if (c->gemm_points < 1 || c->gemm_points > LOOM_CLUSTER_MAX_GEMM_POINTS) {
        return loom_fail_field(source, "node.device.gemm_efficiency",
                               "expected 1 to %d points, got %d", LOOM_CLUSTER_MAX_GEMM_POINTS,
                               c->gemm_points);
    }
    loom_status st = LOOM_OK;
    for (int i = 0; i < c->gemm_points && st == LOOM_OK; i++) {
        const loom_gemm_point *g = &c->gemm[i];
        char path[80];
        snprintf(path, sizeof path, "node.device.gemm_efficiency[%d].flops", i);
        st = check_number(source, path, g->flops, 0, " (2 m n k)");
        if (st == LOOM_OK && i > 0 && !(g->flops > g[-1].flops)) {
            char got[32], before[32];
            loom_json_format_double(g->flops, got, sizeof got);
            loom_json_format_double(g[-1].flops, before, sizeof before);
            st = loom_fail_field(source, path,
                                 "expected more than gemm_efficiency[%d].flops %s (points "
                                 "in ascending FLOPs), got %s",
                                 i - 1, before, got);
        }
        snprintf(path, sizeof path, "node.device.gemm_efficiency[%d].efficiency", i);
        if (st == LOOM_OK &&
            !(isfinite(g->efficiency) && g->efficiency > 0 && g->efficiency <= 1)) {
            char got[32];
            loom_json_format_double(g->efficiency, got, sizeof got);
            st = loom_fail_field(source, path, "expected a share of peak in (0, 1], got %s", got);
        }
    }
    return st;
}

static loom_status check_link(const loom_link *l, const char *path_of, const char *source) {
    char path[96];
    snprintf(path, sizeof path, "%s.bandwidth", path_of);
    loom_status st =
        check_bounded(source, path, l->bandwidth, 0, " (bytes/s per device, one direction)",
                      LOOM_CLUSTER_MIN_RATE, LOOM_CLUSTER_MAX_RATE, "bytes/s");
    snprintf(path, sizeof path, "%s.latency_s", path_of);
    if (st == LOOM_OK) {
        st = check_bounded(source, path, l->latency_s, 1, " (seconds)", 0,
                           LOOM_CLUSTER_MAX_LATENCY_S, "seconds");
    }
    snprintf(path, sizeof path, "%s.call_latency_s", path_of);
    if (st == LOOM_OK) {
        st = check_bounded(source, path, l->call_latency_s, 1, " (seconds)", 0,
                           LOOM_CLUSTER_MAX_LATENCY_S, "seconds");
    }
    return st;
}

static loom_status check_islands(const loom_cluster *c, const char *source) {
    if (c->island_nodes == 0) return LOOM_OK;
    if (c->island_nodes < 0 || c->island_nodes > c->max_nodes) {
        return loom_fail_field(source, "islands.nodes",
                               "expected 1 to max_nodes %d nodes an island, got %d", c->max_nodes,
                               c->island_nodes);
    }
    return check_link(&c->island_link, "islands.link", source);
}

static loom_status check_links(const loom_cluster *c, const char *source) {
    loom_status st = check_islands(c, source);
    for (int l = 0; l < LOOM_LINK_CLASSES && st == LOOM_OK; l++) {
        char path[64];
        snprintf(path, sizeof path, "node.links.%s.bandwidth", link_names[l]);
        st = check_bounded(source, path, c->links[l].bandwidth, 0,
                           " (bytes/s per device, one direction)", LOOM_CLUSTER_MIN_RATE,
                           LOOM_CLUSTER_MAX_RATE, "bytes/s");
        snprintf(path, sizeof path, "node.links.%s.latency_s", link_names[l]);
        if (st == LOOM_OK) {
            st = check_bounded(source, path, c->links[l].latency_s, 1, " (seconds)", 0,
                               LOOM_CLUSTER_MAX_LATENCY_S, "seconds");
        }
        snprintf(path, sizeof path, "node.links.%s.call_latency_s", link_names[l]);
        if (st == LOOM_OK) {
            st = check_bounded(source, path, c->links[l].call_latency_s, 1, " (seconds)", 0,
                               LOOM_CLUSTER_MAX_LATENCY_S, "seconds");
        }
    }
    return st;
}

static loom_status check_collective(const loom_cluster *c, int i, const char *source) {
    const loom_collective_fit *f = &c->collectives[i];
    char path[64], list[128];
    if ((int)f->op < 0 || f->op >= LOOM_COLLECTIVE_OPS) {
        snprintf(path, sizeof path, "collectives[%d].op", i);
        loom_word_list(&op_words, list, sizeof list);
        return loom_fail_field(source, path, "expected %s, got %d", list, (int)f->op);
    }
    if (f->link < 0 || f->link >= LOOM_LINK_CLASSES) {
        snprintf(path, sizeof path, "collectives[%d].link", i);
        loom_word_list(&link_words, list, sizeof list);
        return loom_fail_field(source, path, "expected %s, got %d", list, f->link);
    }
    if (f->ranks < 2 || f->ranks > LOOM_CLUSTER_MAX_DEVICES) {
        snprintf(path, sizeof path, "collectives[%d].ranks", i);
        return f->ranks < 2
                   ? loom_fail_field(source, path, "expected a group of at least 2 ranks, got %d",
                                     f->ranks)
                   : loom_fail_field(source, path,
                                     "expected a group of at most %d ranks (the "
                                     "plausible range), got %d",
                                     LOOM_CLUSTER_MAX_DEVICES, f->ranks);
    }
    snprintf(path, sizeof path, "collectives[%d].alpha_s", i);
    loom_status st = check_bounded(source, path, f->alpha_s, 1, " (seconds)", 0,
                                   LOOM_CLUSTER_MAX_LATENCY_S, "seconds");
    snprintf(path, sizeof path, "collectives[%d].beta_s_per_byte", i);
    if (st == LOOM_OK) {
        st = check_bounded(source, path, f->beta_s_per_byte, 0, " (seconds/byte)",
                           1 / LOOM_CLUSTER_MAX_RATE, 1 / LOOM_CLUSTER_MIN_RATE, "seconds/byte");
    }
    for (int j = 0; j < i && st == LOOM_OK; j++) {
        const loom_collective_fit *g = &c->collectives[j];
        if (g->op != f->op || g->link != f->link || g->ranks != f->ranks) continue;
        snprintf(path, sizeof path, "collectives[%d]", i);
        st = loom_fail_field(source, path,
                             "expected one fit per (op, link, ranks), got a second one for "
                             "(%s, %s, %d) (the first is collectives[%d])",
                             op_names[f->op], link_names[f->link], f->ranks, j);
    }
    return st;
}

loom_status loom_cluster_check(const loom_cluster *c, const char *source) {
    loom_status st = check_name(source, "name", c->name, sizeof c->name);
    if (st == LOOM_OK && c->nodes < 1) {
        st = loom_fail_field(source, "nodes", "expected an integer >= 1, got %d", c->nodes);
    }
    if (st == LOOM_OK && c->max_nodes < c->nodes) {
        st = loom_fail_field(source, "max_nodes", "expected an integer >= nodes (%d), got %d",
                             c->nodes, c->max_nodes);
    }
    if (st == LOOM_OK && c->devices_per_node < 1) {
        st = loom_fail_field(source, "node.devices", "expected an integer >= 1, got %d",
                             c->devices_per_node);
    }
    int64_t devices = (int64_t)c->max_nodes * c->devices_per_node;
    if (st == LOOM_OK && devices > LOOM_CLUSTER_MAX_DEVICES) {
        st = loom_fail_field(source, "max_nodes",
                             "expected max_nodes x node.devices at most %d devices, got %d x %d "
                             "= %" PRId64,
                             LOOM_CLUSTER_MAX_DEVICES, c->max_nodes, c->devices_per_node, devices);
    }
    if (st == LOOM_OK) st = check_device(c, source);
    if (st == LOOM_OK) st = check_gemm_table(c, source);
    if (st == LOOM_OK) st = check_links(c, source);
    if (st == LOOM_OK &&
        (c->num_collectives < 0 || c->num_collectives > LOOM_CLUSTER_MAX_COLLECTIVES)) {
        st = loom_fail_field(source, "collectives", "expected 0 to %d fits, got %d",
                             LOOM_CLUSTER_MAX_COLLECTIVES, c->num_collectives);
    }
    for (int i = 0; i < c->num_collectives && st == LOOM_OK; i++) {
        st = check_collective(c, i, source);
    }
    for (int m = 0; m < LOOM_COMPRESS_COUNT && st == LOOM_OK; m++) {
        char path[64];
        snprintf(path, sizeof path, "compressors.%s",
                 loom_compress_method_name((loom_compress_method)m));
        st = check_bounded(source, path, c->compressor_bytes_per_s[m], 1,
                           " (bytes/s; 0: not measured)", LOOM_CLUSTER_MIN_RATE,
                           LOOM_CLUSTER_MAX_RATE, "bytes/s");
    }
    return st;
}

/* ---- writing -------------------------------------------------------------------------------- */

/* `text` as a JSON string literal (quoted, escaped); NULL when it is not UTF-8 (or no memory). */
static char *json_text(const char *text) {
    json_t *string = json_string(text);
    char *literal = string ? json_dumps(string, JSON_ENCODE_ANY) : NULL;
    json_decref(string);
    return literal;
}

static void write_number(FILE *out, const char *before, double value, const char *after) {
    char text[32];
    loom_json_format_double(value, text, sizeof text);
    fprintf(out, "%s%s%s", before, text, after);
}

static void write_document(FILE *out, const loom_cluster *c, const char *name,
                           const char *device_name, const char *note) {
    fprintf(out, "{\n  \"name\": %s,\n  \"source\": %s,\n", name, note);
    fprintf(out, "  \"nodes\": %d, \"max_nodes\": %d,\n", c->nodes, c->max_nodes);
    fprintf(out, "  \"node\": {\n    \"devices\": %d,\n    \"device\": {\n", c->devices_per_node);
    fprintf(out, "      \"name\": %s,\n", device_name);
    fprintf(out, "      \"memory_bytes\": %" PRId64 ",\n", c->memory_bytes);
    fprintf(out, "      \"peak_flops\": {");
    for (int p = 0; p < LOOM_PRECISIONS; p++) {
        fprintf(out, "%s\"%s\": ", p ? ", " : "", loom_precision_name((loom_precision)p));
        write_number(out, "", c->peak_flops[p], "");
    }
    fprintf(out, "},\n");
    fprintf(out, "      \"training_precision\": \"%s\",\n",
            loom_precision_name(c->training_precision));
    if (c->fused_attention) fprintf(out, "      \"attention\": \"fused\",\n");
    write_number(out, "      \"memory_bandwidth\": ", c->memory_bandwidth, ",\n");
    if (c->optimizer_params_per_s > 0) {
        write_number(out, "      \"optimizer_params_per_s\": ", c->optimizer_params_per_s, ",\n");
    }
    fprintf(out, "      \"gemm_efficiency\": [\n");
    for (int i = 0; i < c->gemm_points; i++) {
        write_number(out, "        {\"flops\": ", c->gemm[i].flops, ", ");
        write_number(out, "\"efficiency\": ", c->gemm[i].efficiency,
                     i + 1 < c->gemm_points ? "},\n" : "}\n");
    }
    fprintf(out, "      ],\n");
    fprintf(out,
            "      \"sources\": {\"memory_bytes\": %s, \"peak_flops\": %s, "
            "\"memory_bandwidth\": %s, \"gemm_efficiency\": %s}\n",
            note, note, note, note);
    fprintf(out, "    },\n    \"links\": {\n");
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) {
        fprintf(out, "      \"%s\": {", link_names[l]);
        write_number(out, "\"bandwidth\": ", c->links[l].bandwidth, ", ");
        write_number(out, "\"latency_s\": ", c->links[l].latency_s, ", ");
        if (c->links[l].call_latency_s > 0) {
            write_number(out, "\"call_latency_s\": ", c->links[l].call_latency_s, ", ");
        }
        fprintf(out, "\"source\": %s}%s\n", note, l + 1 < LOOM_LINK_CLASSES ? "," : "");
    }
    fprintf(out, "    }\n  }");
    if (c->num_collectives > 0) {
        fprintf(out, ",\n  \"collectives\": [\n");
        for (int i = 0; i < c->num_collectives; i++) {
            const loom_collective_fit *f = &c->collectives[i];
            fprintf(out, "    {\"op\": \"%s\", \"link\": \"%s\", \"ranks\": %d, ", op_names[f->op],
                    link_names[f->link], f->ranks);
            write_number(out, "\"alpha_s\": ", f->alpha_s, ", ");
            write_number(out, "\"beta_s_per_byte\": ", f->beta_s_per_byte,
                         i + 1 < c->num_collectives ? "},\n" : "}\n");
        }
        fprintf(out, "  ]");
    }
    int measured = 0;
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) {
        if (c->compressor_bytes_per_s[m] == 0) continue; /* not measured: left out */
        fprintf(out, "%s\"%s\": ", measured++ ? ", " : ",\n  \"compressors\": {",
                loom_compress_method_name((loom_compress_method)m));
        write_number(out, "", c->compressor_bytes_per_s[m], "");
    }
    fprintf(out, "%s", measured ? "}" : "");
    if (c->island_nodes > 0) {
        const loom_link *l = &c->island_link;
        fprintf(out, ",\n  \"islands\": {\"nodes\": %d, \"link\": {", c->island_nodes);
        write_number(out, "\"bandwidth\": ", l->bandwidth, ", ");
        write_number(out, "\"latency_s\": ", l->latency_s, ", ");
        if (l->call_latency_s > 0)
            write_number(out, "\"call_latency_s\": ", l->call_latency_s, ", ");
        fprintf(out, "\"source\": %s}}", note);
    }
    fprintf(out, "\n}\n");
}

loom_status loom_cluster_write(const char *path, const loom_cluster *cluster,
                               const char *source_note) {
    loom_status st = loom_cluster_check(cluster, path);
    if (st != LOOM_OK) return st;
    char *name = json_text(cluster->name);
    char *device_name = json_text(cluster->device_name);
    char *note = json_text(source_note ? source_note : "measured by loom profile");
    if (!name || !device_name || !note) {
        st = loom_fail(LOOM_ERR_INPUT, "%s: the source note: expected UTF-8 text", path);
    }
    loom_atomic_file *file = NULL;
    if (st == LOOM_OK) st = loom_atomic_open(&file, path);
    if (st == LOOM_OK && !file) st = LOOM_ERR_IO;
    if (st == LOOM_OK) {
        write_document(loom_atomic_stream(file), cluster, name, device_name, note);
        st = loom_atomic_commit(file);
    }
    free(name);
    free(device_name);
    free(note);
    return st;
}

/* ---- figures for the cost model ------------------------------------------------------------- */

double loom_cluster_gemm_efficiency(const loom_cluster *cluster, double flops) {
    const loom_gemm_point *g = cluster->gemm;
    int n = cluster->gemm_points;
    if (n < 1 || n > LOOM_CLUSTER_MAX_GEMM_POINTS) {
        loom_fatal("loom_cluster_gemm_efficiency: %d GEMM points (an unchecked description)", n);
    }
    if (!(flops > g[0].flops)) return g[0].efficiency; /* below the table (or NaN): flat */
    if (flops >= g[n - 1].flops) return g[n - 1].efficiency;
    int i = 0;
    while (flops >= g[i + 1].flops) i++; /* g[i].flops <= flops < g[i + 1].flops */
    double t = (log(flops) - log(g[i].flops)) / (log(g[i + 1].flops) - log(g[i].flops));
    return g[i].efficiency + t * (g[i + 1].efficiency - g[i].efficiency);
}

double loom_cluster_gemm_s(const loom_cluster *cluster, loom_precision precision, double m,
                           double n, double k) {
    if ((int)precision < 0 || precision >= LOOM_PRECISIONS) {
        loom_fatal("loom_cluster_gemm_s: precision %d out of range", (int)precision);
    }
    double peak = cluster->peak_flops[precision];
    double flops = 2 * m * n * k;
    if (!(peak > 0) || !(flops > 0)) return 0;
    return flops / (peak * loom_cluster_gemm_efficiency(cluster, flops));
}

double loom_cluster_collective_s(const loom_cluster *cluster, loom_collective_op op, int link,
                                 int ranks, double bytes) {
    if ((int)op < 0 || op >= LOOM_COLLECTIVE_OPS || link < 0 || link >= LOOM_LINK_CLASSES) {
        loom_fatal("loom_cluster_collective_s: op %d, link %d out of range", (int)op, link);
    }
    if (ranks <= 1) return 0;
    for (int i = 0; i < cluster->num_collectives; i++) {
        const loom_collective_fit *f = &cluster->collectives[i];
        if (f->op == op && f->link == link && f->ranks == ranks) {
            return f->alpha_s + f->beta_s_per_byte * bytes;
        }
    }
    /* the ring from the link figures, n - 1 latencies per ring pass and the link's fixed cost
     * once per call (loom/cluster.h's model). The share of the buffer first, then times the
     * buffer: the order every prediction has been rounded in */
    const loom_link *l = &cluster->links[link];
    double n = ranks;
    double steps = op == LOOM_COLLECTIVE_ALLREDUCE  ? 2 * (n - 1)
                   : op == LOOM_COLLECTIVE_SENDRECV ? 1
                                                    : n - 1;
    double share = loom_cluster_ring_bytes(op, ranks, 1.0);
    double call = op == LOOM_COLLECTIVE_SENDRECV ? 0 : l->call_latency_s;
    return share * bytes / l->bandwidth + steps * l->latency_s + call;
}

double loom_cluster_ring_bytes(loom_collective_op op, int ranks, double bytes) {
    if (ranks <= 1) return 0;
    double n = ranks;
    switch (op) {
    case LOOM_COLLECTIVE_ALLREDUCE:
        return bytes * (2 * (n - 1)) / n;
    case LOOM_COLLECTIVE_ALLGATHER:
    case LOOM_COLLECTIVE_REDUCE_SCATTER:
        return bytes * (n - 1) / n;
    case LOOM_COLLECTIVE_SENDRECV:
        break;
    }
    return bytes;
}
