/*
 * cluster_standin.c — temporary: replaced by cluster.c when merged (delete this file then; the
 * two define the same functions).
 *
 * Stand-ins for the three functions of loom/cluster.h that `loom profile` calls, so that the
 * profiler builds and its tests run before the real cluster.c is merged: loom_precision_name,
 * a loom_cluster_check of the main rules, and a loom_cluster_write of the header's JSON layout.
 */
#include "loom/cluster.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *loom_precision_name(loom_precision precision) {
    static const char *const names[LOOM_PRECISIONS] = {"fp32", "bf16", "fp16"};
    return (int)precision >= 0 && precision < LOOM_PRECISIONS ? names[precision] : "?";
}

loom_status loom_cluster_check(const loom_cluster *c, const char *source) {
    const char *s = source ? source : "cluster";
    if (c->nodes < 1 || c->max_nodes < c->nodes || c->devices_per_node < 1) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: expected nodes >= 1, max_nodes >= nodes, devices "
                         ">= 1",
                         s);
    }
    if (c->memory_bytes <= 0 || !(c->memory_bandwidth > 0) ||
        !(c->peak_flops[LOOM_PRECISION_FP32] > 0)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: node.device: expected memory, bandwidth and peak > 0",
                         s);
    }
    if (c->gemm_points < 1 || c->gemm_points > LOOM_CLUSTER_MAX_GEMM_POINTS) {
        return loom_fail(LOOM_ERR_INPUT, "%s: node.device.gemm_efficiency: expected 1 to %d points",
                         s, LOOM_CLUSTER_MAX_GEMM_POINTS);
    }
    for (int i = 0; i < c->gemm_points; i++) {
        const loom_gemm_point *p = &c->gemm[i];
        if (!(p->flops > 0) || !(p->efficiency > 0 && p->efficiency <= 1) ||
            (i > 0 && !(p->flops > c->gemm[i - 1].flops))) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: node.device.gemm_efficiency[%d]: expected ascending flops > 0 "
                             "and efficiency in (0, 1]",
                             s, i);
        }
    }
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) {
        if (!(c->links[l].bandwidth > 0) || !(c->links[l].latency_s >= 0)) {
            return loom_fail(LOOM_ERR_INPUT, "%s: node.links: expected bandwidth > 0, latency >= 0",
                             s);
        }
    }
    for (int i = 0; i < c->num_collectives; i++) {
        const loom_collective_fit *f = &c->collectives[i];
        if (f->ranks < 2 || !(f->alpha_s >= 0) || !(f->beta_s_per_byte >= 0)) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: collectives[%d]: expected ranks >= 2, alpha and "
                             "beta >= 0",
                             s, i);
        }
    }
    return LOOM_OK;
}

loom_status loom_cluster_write(const char *path, const loom_cluster *c, const char *source_note) {
    loom_status st = loom_cluster_check(c, path);
    if (st != LOOM_OK) return st;
    const char *note = source_note ? source_note : "measured by loom profile";
    static const char *const ops[LOOM_COLLECTIVE_OPS] = {"allreduce", "allgather", "reduce_scatter",
                                                         "sendrecv"};
    static const char *const links[LOOM_LINK_CLASSES] = {"intra_node", "inter_node"};
    json_t *peak = json_object(), *gemm = json_array(), *link_obj = json_object();
    for (int p = 0; p < LOOM_PRECISIONS; p++) {
        json_object_set_new(peak, loom_precision_name(p), json_real(c->peak_flops[p]));
    }
    for (int i = 0; i < c->gemm_points; i++) {
        json_array_append_new(gemm, json_pack("{s:f,s:f}", "flops", c->gemm[i].flops, "efficiency",
                                              c->gemm[i].efficiency));
    }
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) {
        json_object_set_new(link_obj, links[l],
                            json_pack("{s:f,s:f,s:s}", "bandwidth", c->links[l].bandwidth,
                                      "latency_s", c->links[l].latency_s, "source", note));
    }
    json_t *device = json_pack("{s:s,s:I,s:o,s:f,s:o,s:{s:s,s:s}}", "name", c->device_name,
                               "memory_bytes", (json_int_t)c->memory_bytes, "peak_flops", peak,
                               "memory_bandwidth", c->memory_bandwidth, "gemm_efficiency", gemm,
                               "sources", "peak_flops", note, "gemm_efficiency", note);
    json_t *collectives = json_array(), *compressors = json_object();
    for (int i = 0; i < c->num_collectives; i++) {
        const loom_collective_fit *f = &c->collectives[i];
        json_array_append_new(collectives,
                              json_pack("{s:s,s:s,s:i,s:f,s:f}", "op", ops[f->op], "link",
                                        links[f->link], "ranks", f->ranks, "alpha_s", f->alpha_s,
                                        "beta_s_per_byte", f->beta_s_per_byte));
    }
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) {
        if (c->compressor_bytes_per_s[m] > 0) {
            json_object_set_new(compressors, loom_compress_method_name(m),
                                json_real(c->compressor_bytes_per_s[m]));
        }
    }
    json_t *root = json_pack("{s:s,s:s,s:i,s:i,s:{s:i,s:o,s:o},s:o,s:o}", "name", c->name, "source",
                             note, "nodes", c->nodes, "max_nodes", c->max_nodes, "node", "devices",
                             c->devices_per_node, "device", device, "links", link_obj,
                             "collectives", collectives, "compressors", compressors);
    char *text =
        root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))
             : NULL;
    json_decref(root);
    if (!text) return loom_fail(LOOM_ERR_NOMEM, "%s: cannot format the cluster", path);
    st = loom_write_file_atomic(path, text, strlen(text));
    free(text);
    return st;
}
