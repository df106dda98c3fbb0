/*
 * test_cluster.c — the cluster description (loom/cluster.h): the shipped files in clusters/ read
 * and check, every figure with a source; write -> read round trips equal (odd doubles, escaped
 * text, fits and compressors); every rule (and every shape error of the reader) broken once by
 * editing a valid description's JSON text, each expected to fail with LOOM_ERR_INPUT, a message
 * naming the file and the field's JSON path, and a zeroed result; the rules the file cannot
 * break (non-finite numbers) broken in memory; the training precision's default, round trip and
 * refusal; GEMM efficiency interpolation, GEMM seconds and
 * collective seconds and the ring's bytes per rank against hand-computed values; precision names.
 */
#include "check.h"
#include "loom/cluster.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#ifndef LOOM_CLUSTERS_DIR
#error "LOOM_CLUSTERS_DIR (the repository's clusters/ folder) must be defined by the build"
#endif

static const char *tmpdir;

static int is_zeroed(const loom_cluster *c) {
    static const loom_cluster zero;
    return memcmp(c, &zero, sizeof zero) == 0;
}

/* A valid description with every optional part; the tests below edit its text. */
static const char *valid_text =
    "{\"name\": \"test\", \"source\": \"a test\", \"nodes\": 2, \"max_nodes\": 4,\n"
    " \"node\": {\"devices\": 8,\n"
    "  \"device\": {\"name\": \"GPU\", \"memory_bytes\": 1000000,\n"
    "   \"peak_flops\": {\"fp32\": 1e12, \"bf16\": 4e12},\n"
    "   \"memory_bandwidth\": 1e11,\n"
    "   \"gemm_efficiency\": [{\"flops\": 1e6, \"efficiency\": 0.1}, {\"flops\": 1e8, "
    "\"efficiency\": 0.5}, {\"flops\": 1e10, \"efficiency\": 0.9}],\n"
    "   \"sources\": {\"peak_flops\": \"datasheet\"}},\n"
    "  \"links\": {\"intra_node\": {\"bandwidth\": 1e11, \"latency_s\": 2e-6, \"source\": "
    "\"spec\"},\n"
    "            \"inter_node\": {\"bandwidth\": 1e10, \"latency_s\": 1e-5}}},\n"
    " \"collectives\": [{\"op\": \"allreduce\", \"link\": \"inter_node\", \"ranks\": 8, "
    "\"alpha_s\": 1e-4, \"beta_s_per_byte\": 1e-10}],\n"
    " \"compressors\": {\"powersgd\": 2e9, \"int8\": 5e8}}\n";

static void read_valid(loom_cluster *c) {
    char path[1100];
    snprintf(path, sizeof path, "%s/valid.json", tmpdir);
    check_write_text(path, valid_text);
    loom_status st = loom_cluster_read(path, c);
    if (st != LOOM_OK) {
        fprintf(stderr, "the valid description does not read: %s\n", loom_last_error());
        exit(1);
    }
}

/* ---- the shipped descriptions --------------------------------------------------------------- */

/* Every figure of a shipped file names its source: the description's "source", the device's
 * "sources" for each of its figures, each link's "source". */
static void check_sources(const char *path) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL, "%s: %s", path, err.text);
    if (!root) return;
    const char *top = json_string_value(json_object_get(root, "source"));
    CHECK(top && strlen(top) > 20, "%s: a \"source\" describing the cluster", path);
    json_t *node = json_object_get(root, "node");
    json_t *sources = json_object_get(json_object_get(node, "device"), "sources");
    static const char *const figures[] = {"memory_bytes", "peak_flops", "training_precision",
                                          "memory_bandwidth", "gemm_efficiency"};
    for (int i = 0; i < 5; i++) {
        const char *text = json_string_value(json_object_get(sources, figures[i]));
        CHECK(text && strlen(text) > 20, "%s: node.device.sources.%s", path, figures[i]);
    }
    json_t *links = json_object_get(node, "links");
    static const char *const classes[] = {"intra_node", "inter_node"};
    for (int i = 0; i < 2; i++) {
        json_t *link = json_object_get(links, classes[i]);
        const char *text = json_string_value(json_object_get(link, "source"));
        CHECK(text && strlen(text) > 20, "%s: node.links.%s.source", path, classes[i]);
    }
    json_decref(root);
}

static void round_trip(const loom_cluster *c, const char *note, const char *what) {
    char path[1100];
    snprintf(path, sizeof path, "%s/round_trip.json", tmpdir);
    loom_status st = loom_cluster_write(path, c, note);
    CHECK(st == LOOM_OK, "%s: write: %s", what, loom_last_error());
    loom_cluster back;
    st = loom_cluster_read(path, &back);
    CHECK(st == LOOM_OK, "%s: read back: %s", what, loom_last_error());
    CHECK(memcmp(c, &back, sizeof back) == 0, "%s: reads back equal", what);
}

static void test_shipped(void) {
    struct {
        const char *file, *name;
        int devices, max_nodes;
        double fp32, bf16, fp16, intra, inter;
        loom_precision training; /* A100s train in bf16; V100s (no bf16) in fp16 */
    } shipped[] = {
        {"dgx-a100.json", "dgx-a100", 8, 384, 19.5e12, 312e12, 312e12, 2.325e11, 2.4e10,
         LOOM_PRECISION_BF16},
        {"p3-v100.json", "p3-v100", 8, 8, 15.7e12, 0, 125e12, 1.5e11, 3.90625e8,
         LOOM_PRECISION_FP16},
        {"dgx-h100.json", "dgx-h100", 8, 2048, 67e12, 989e12, 989e12, 3.7e11, 4.8e10,
         LOOM_PRECISION_BF16},
    };
    for (size_t i = 0; i < sizeof shipped / sizeof shipped[0]; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", LOOM_CLUSTERS_DIR, shipped[i].file);
        loom_cluster c;
        loom_status st = loom_cluster_read(path, &c);
        CHECK(st == LOOM_OK, "%s: %s", path, loom_last_error());
        if (st != LOOM_OK) continue;
        CHECK(strcmp(c.name, shipped[i].name) == 0, "%s: name %s", path, c.name);
        CHECK(c.nodes == 1 && c.max_nodes == shipped[i].max_nodes, "%s: nodes %d, max %d", path,
              c.nodes, c.max_nodes);
        CHECK(c.devices_per_node == shipped[i].devices, "%s: devices %d", path, c.devices_per_node);
        CHECK(c.peak_flops[LOOM_PRECISION_FP32] == shipped[i].fp32 &&
                  c.peak_flops[LOOM_PRECISION_BF16] == shipped[i].bf16 &&
                  c.peak_flops[LOOM_PRECISION_FP16] == shipped[i].fp16,
              "%s: peaks", path);
        CHECK(c.training_precision == shipped[i].training, "%s: training precision %s", path,
              loom_precision_name(c.training_precision));
        /* only the H100 description prices a fused attention kernel (FlashAttention) */
        CHECK(c.fused_attention == !strcmp(shipped[i].name, "dgx-h100"), "%s: attention %s", path,
              c.fused_attention ? "fused" : "materialized");
        CHECK(c.links[LOOM_LINK_INTRA_NODE].bandwidth == shipped[i].intra &&
                  c.links[LOOM_LINK_INTER_NODE].bandwidth == shipped[i].inter,
              "%s: link bandwidths", path);
        /* a big GEMM gets most of the peak, a small one little of it */
        CHECK(loom_cluster_gemm_efficiency(&c, 1e12) > 0.6, "%s: big GEMMs", path);
        CHECK(loom_cluster_gemm_efficiency(&c, 1e6) < 0.05, "%s: small GEMMs", path);
        check_sources(path);
        round_trip(&c, "a note", path);
    }
}

/* ---- write -> read ---------------------------------------------------------------------- */

static void test_round_trip(void) {
    loom_cluster c;
    read_valid(&c);
    round_trip(&c, NULL, "the valid description");
    /* doubles that need all 17 digits, tiny and huge ones, text that needs escaping */
    c.peak_flops[LOOM_PRECISION_FP16] = 1.0 / 3.0 * 1e13;
    c.memory_bandwidth = 1e11 / 3.0;
    c.links[LOOM_LINK_INTRA_NODE].latency_s = 0;
    c.links[LOOM_LINK_INTER_NODE].latency_s = 5e-324;
    c.gemm[0].flops = 1e-300;
    c.gemm[2].flops = 1e300;
    c.gemm[1].efficiency = 1;
    c.memory_bytes = INT64_C(9007199254740993); /* not a double */
    snprintf(c.name, sizeof c.name, "a \"quoted\"\tname \\ \xc3\xa9");
    snprintf(c.device_name, sizeof c.device_name, "%.*s", 63,
             "0123456789012345678901234567890123456789012345678901234567890123456789");
    c.collectives[1] =
        (loom_collective_fit){LOOM_COLLECTIVE_SENDRECV, LOOM_LINK_INTRA_NODE, 2, 0, 1e-9 / 7.0};
    c.collectives[2] = (loom_collective_fit){LOOM_COLLECTIVE_REDUCE_SCATTER, LOOM_LINK_INTER_NODE,
                                             64, 3e-5, 2.5e-11};
    c.num_collectives = 3;
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) c.compressor_bytes_per_s[m] = 1e9 + m;
    c.optimizer_params_per_s = 123456789.25;
    round_trip(&c, "line one\nline \"two\" \xe2\x82\xac", "odd values");
    c.optimizer_params_per_s = 0;
    /* no optional parts: nothing measured */
    c.num_collectives = 0;
    memset(c.collectives, 0, sizeof c.collectives);
    memset(c.compressor_bytes_per_s, 0, sizeof c.compressor_bytes_per_s);
    round_trip(&c, "", "no fits, no compressors");

    /* a description that breaks a rule is not written; nor is a note that is not UTF-8 */
    char path[1100];
    snprintf(path, sizeof path, "%s/never.json", tmpdir);
    c.nodes = 0;
    loom_status st = loom_cluster_write(path, &c, NULL);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "nodes"), "bad cluster: %s",
          loom_last_error());
    c.nodes = 1;
    st = loom_cluster_write(path, &c, "\xff\xfe");
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "UTF-8"), "bad note: %s",
          loom_last_error());
    FILE *f = fopen(path, "r");
    CHECK(f == NULL, "nothing written");
    if (f) fclose(f);
}

/* ---- the rules, one broken at a time -------------------------------------------------------- */

typedef struct {
    const char *find, *replace; /* one edit of the valid description */
    const char *path;           /* the JSON path the message must name */
    const char *detail;         /* and a piece of its expectation */
} broken_case;

#define GEMM_LIST                                                                                  \
    "[{\"flops\": 1e6, \"efficiency\": 0.1}, {\"flops\": 1e8, \"efficiency\": 0.5}, "              \
    "{\"flops\": 1e10, \"efficiency\": 0.9}]"

#define FIT                                                                                        \
    "{\"op\": \"allreduce\", \"link\": \"inter_node\", \"ranks\": 8, \"alpha_s\": 1e-4, "          \
    "\"beta_s_per_byte\": 1e-10}"

static const broken_case broken_cases[] = {
    /* the top level */
    {"\"nodes\": 2", "\"nodes\": 0", "nodes", "expected an integer >= 1, got 0"},
    {"\"nodes\": 2", "\"nodes\": 2.5", "nodes", "expected an integer, got 2.5"},
    {"\"max_nodes\": 4", "\"max_nodes\": 1", "max_nodes",
     "expected an integer >= nodes (2), got 1"},
    {"\"max_nodes\": 4", "\"max_nodes\": \"4\"", "max_nodes", "expected an integer, got \"4\""},
    {"\"name\": \"test\", ", "", "name", "missing (expected a string of 1 to 63 bytes)"},
    {"\"name\": \"test\"", "\"name\": \"\"", "name",
     "expected a string of 1 to 63 bytes, got \"\""},
    {"\"name\": \"test\"",
     "\"name\": \"0123456789012345678901234567890123456789012345678901234567890123\"", "name",
     "expected a string of 1 to 63 bytes"},
    {"\"source\": \"a test\"", "\"source\": 1", "source", "expected free text (a string), got 1"},
    {"\"nodes\": 2", "\"gpus\": 16, \"nodes\": 2", "gpus",
     "unknown key (expected one of: name, source, nodes, max_nodes, node, collectives, "
     "compressors, islands)"},
    {"\"nodes\": 2, \"max_nodes\": 4,\n \"node\": {\"devices\": 8,\n  \"device\"",
     "\"nodes\": 2, \"max_nodes\": 4,\n \"nodex\": {\"devices\": 8,\n  \"device\"", "nodex",
     "unknown key"},
    /* node and device */
    {"\"devices\": 8", "\"devices\": 0", "node.devices", "expected an integer >= 1, got 0"},
    {"\"devices\": 8", "\"devices\": 8, \"cpus\": 2", "node.cpus",
     "unknown key (expected one of: devices, device, links)"},
    {"\"name\": \"GPU\"", "\"name\": 7", "node.device.name",
     "expected a string of 1 to 63 bytes, got 7"},
    {"\"memory_bytes\": 1000000", "\"memory_bytes\": 0", "node.device.memory_bytes",
     "expected a byte count > 0, got 0"},
    {"\"memory_bytes\": 1000000", "\"memory_bytes\": 1.5e6", "node.device.memory_bytes",
     "expected an integer byte count"},
    {"\"memory_bytes\": 1000000", "\"memory_bytes\": 1000000, \"tdp_w\": 400", "node.device.tdp_w",
     "unknown key (expected one of: name, memory_bytes, peak_flops, training_precision, "
     "attention, memory_bandwidth, optimizer_params_per_s, gemm_efficiency, sources)"},
    {"\"memory_bytes\": 1000000", "\"memory_bytes\": 1000000, \"attention\": \"flash\"",
     "node.device.attention", "expected \"materialized\" or \"fused\""},
    {"\"memory_bytes\": 1000000", "\"memory_bytes\": 1000000, \"optimizer_params_per_s\": -5",
     "node.device.optimizer_params_per_s",
     "expected a finite number >= 0 (parameters/s; 0: not measured), got -5"},
    {"\"fp32\": 1e12", "\"fp32\": -1", "node.device.peak_flops.fp32",
     "expected a finite number >= 0 (FLOP/s; 0: the precision is not offered), got -1"},
    {"\"fp32\": 1e12", "\"fp32\": \"1e12\"", "node.device.peak_flops.fp32",
     "expected a number (FLOP/s), got \"1e12\""},
    {"\"bf16\": 4e12", "\"fp64\": 4e12", "node.device.peak_flops.fp64",
     "expected one of \"fp32\", \"bf16\" or \"fp16\", got \"fp64\""},
    {"{\"fp32\": 1e12, \"bf16\": 4e12}", "{\"fp32\": 0}", "node.device.peak_flops",
     "expected a peak > 0 for at least one of fp32, bf16 and fp16, got none"},
    {"{\"fp32\": 1e12, \"bf16\": 4e12}", "[1e12]", "node.device.peak_flops",
     "expected an object, got [1000000000000.0]"},
    /* the training precision: a word, and one the device offers a peak for */
    {"\"memory_bandwidth\": 1e11", "\"training_precision\": \"fp16\", \"memory_bandwidth\": 1e11",
     "node.device.training_precision",
     "expected a precision node.device.peak_flops offers (fp32, bf16), got \"fp16\" "
     "(peak_flops.fp16 is 0: not offered)"},
    {"\"memory_bandwidth\": 1e11", "\"training_precision\": \"fp8\", \"memory_bandwidth\": 1e11",
     "node.device.training_precision",
     "expected one of \"fp32\", \"bf16\" or \"fp16\", got \"fp8\""},
    {"\"memory_bandwidth\": 1e11", "\"training_precision\": 16, \"memory_bandwidth\": 1e11",
     "node.device.training_precision",
     "expected a precision: \"fp32\", \"bf16\" or \"fp16\", got 16"},
    /* left out: fp32, which this device does not offer */
    {"{\"fp32\": 1e12, \"bf16\": 4e12}", "{\"bf16\": 4e12}", "node.device.training_precision",
     "got \"fp32\" (peak_flops.fp32 is 0: not offered); fp32 is the default when the field is left "
     "out"},
    {"\"memory_bandwidth\": 1e11", "\"memory_bandwidth\": 0", "node.device.memory_bandwidth",
     "expected a finite number > 0 (bytes/s), got 0"},
    {"\"memory_bandwidth\": 1e11,", "", "node.device.memory_bandwidth",
     "missing (expected a number)"},
    /* the GEMM table */
    {GEMM_LIST, "[]", "node.device.gemm_efficiency",
     "expected a list of 1 to 64 {\"flops\", \"efficiency\"} points, got []"},
    {"\"efficiency\": 0.1", "\"efficiency\": 0", "node.device.gemm_efficiency[0].efficiency",
     "expected a share of peak in (0, 1], got 0"},
    {"\"efficiency\": 0.5", "\"efficiency\": 1.5", "node.device.gemm_efficiency[1].efficiency",
     "expected a share of peak in (0, 1], got 1.5"},
    {"\"flops\": 1e8", "\"flops\": 1e6", "node.device.gemm_efficiency[1].flops",
     "expected more than gemm_efficiency[0].flops 1e+06 (points in ascending FLOPs), got 1e+06"},
    {"\"flops\": 1e10", "\"flops\": 1e7", "node.device.gemm_efficiency[2].flops",
     "ascending FLOPs), got 1e+07"},
    {"\"flops\": 1e6", "\"flops\": 0", "node.device.gemm_efficiency[0].flops",
     "expected a finite number > 0 (2 m n k), got 0"},
    {"\"efficiency\": 0.1}", "\"efficiency\": 0.1, \"m\": 1}", "node.device.gemm_efficiency[0].m",
     "unknown key (expected one of: flops, efficiency)"},
    {", \"efficiency\": 0.9}", "}", "node.device.gemm_efficiency[2].efficiency",
     "missing (expected a number)"},
    {"{\"flops\": 1e6, \"efficiency\": 0.1}", "7", "node.device.gemm_efficiency[0]",
     "expected an object, got 7"},
    /* sources: free text */
    {"{\"peak_flops\": \"datasheet\"}", "{\"peak_flops\": 3}", "node.device.sources.peak_flops",
     "expected free text (a string), got 3"},
    {"{\"peak_flops\": \"datasheet\"}", "[\"datasheet\"]", "node.device.sources",
     "expected an object of free-text strings"},
    {"\"source\": \"spec\"", "\"source\": [\"spec\"]", "node.links.intra_node.source",
     "expected free text (a string)"},
    /* links */
    {"\"bandwidth\": 1e11", "\"bandwidth\": 0", "node.links.intra_node.bandwidth",
     "expected a finite number > 0 (bytes/s per device, one direction), got 0"},
    {"\"latency_s\": 1e-5", "\"latency_s\": -1e-6", "node.links.inter_node.latency_s",
     "expected a finite number >= 0 (seconds), got -1e-06"},
    {"\"latency_s\": 1e-5", "\"latency_s\": 1e-5, \"call_latency_s\": -2e-6",
     "node.links.inter_node.call_latency_s", "expected a finite number >= 0 (seconds), got -2e-06"},
    {"\"latency_s\": 1e-5", "\"latency_s\": 1e-5, \"call_latency_s\": \"8us\"",
     "node.links.inter_node.call_latency_s", "expected a number"},
    {",\n            \"inter_node\": {\"bandwidth\": 1e10, \"latency_s\": 1e-5}", "",
     "node.links.inter_node", "missing (expected an object with bandwidth and latency_s)"},
    {"\"intra_node\"", "\"pcie\"", "node.links.pcie",
     "unknown key (expected one of: intra_node, inter_node)"},
    {"\"latency_s\": 2e-6", "\"latency_s\": 2e-6, \"mtu\": 9000", "node.links.intra_node.mtu",
     "unknown key (expected one of: bandwidth, latency_s, call_latency_s, source)"},
    {"\"bandwidth\": 1e10", "\"bandwidth\": null", "node.links.inter_node.bandwidth",
     "expected a number, got null"},
    /* collectives */
    {"\"allreduce\"", "\"broadcast\"", "collectives[0].op",
     "expected one of \"allreduce\", \"allgather\", \"reduce_scatter\" or \"sendrecv\", got "
     "\"broadcast\""},
    {"\"link\": \"inter_node\"", "\"link\": \"nvlink\"", "collectives[0].link",
     "expected \"intra_node\" or \"inter_node\", got \"nvlink\""},
    {"\"ranks\": 8", "\"ranks\": 1", "collectives[0].ranks",
     "expected a group of at least 2 ranks, got 1"},
    {"\"alpha_s\": 1e-4", "\"alpha_s\": -1", "collectives[0].alpha_s",
     "expected a finite number >= 0 (seconds), got -1"},
    {"\"beta_s_per_byte\": 1e-10", "\"beta_s_per_byte\": 0", "collectives[0].beta_s_per_byte",
     "expected a finite number > 0 (seconds/byte), got 0"},
    {", \"beta_s_per_byte\": 1e-10", "", "collectives[0].beta_s_per_byte",
     "missing (expected a number)"},
    {FIT "]", FIT ", " FIT "]", "collectives[1]",
     "expected one fit per (op, link, ranks), got a second one for (allreduce, inter_node, 8) "
     "(the first is collectives[0])"},
    {"[" FIT "]", FIT, "collectives", "expected a list of at most 64 fits"},
    {"\"ranks\": 8", "\"ranks\": 8, \"bytes\": 1", "collectives[0].bytes",
     "unknown key (expected one of: op, link, ranks, alpha_s, beta_s_per_byte)"},
    /* compressors */
    {"\"int8\": 5e8", "\"zip\": 5e8", "compressors.zip",
     "expected one of none, powersgd, lowrank, topk, sign, int8, bf16, got \"zip\""},
    {"\"powersgd\": 2e9", "\"powersgd\": -1", "compressors.powersgd",
     "expected a finite number >= 0 (bytes/s; 0: not measured), got -1"},
    {"\"int8\": 5e8", "\"int8\": \"fast\"", "compressors.int8", "expected a number, got \"fast\""},
    {"{\"powersgd\": 2e9, \"int8\": 5e8}", "[2e9]", "compressors",
     "expected an object of bytes/s per method"},
    /* the plausible bounds of loom/cluster.h: typos that are finite and positive */
    {"\"bandwidth\": 1e11", "\"bandwidth\": 1e-300", "node.links.intra_node.bandwidth",
     "expected 1000 to 1e+15 bytes/s (the plausible range), got 1e-300"},
    {"\"bandwidth\": 1e10", "\"bandwidth\": 1e16", "node.links.inter_node.bandwidth",
     "expected 1000 to 1e+15 bytes/s (the plausible range), got 1e+16"},
    {"\"latency_s\": 1e-5", "\"latency_s\": 1e308", "node.links.inter_node.latency_s",
     "expected 0 to 10 seconds (the plausible range), got 1e+308"},
    {"\"memory_bandwidth\": 1e11", "\"memory_bandwidth\": 1e-300", "node.device.memory_bandwidth",
     "expected 1000 to 1e+15 bytes/s (the plausible range), got 1e-300"},
    {"\"memory_bytes\": 1000000", "\"memory_bytes\": 1000000, \"optimizer_params_per_s\": 1e300",
     "node.device.optimizer_params_per_s",
     "expected 0 or 1000 to 1e+15 parameters/s (the plausible range), got 1e+300"},
    {"\"bf16\": 4e12", "\"bf16\": 1e-3", "node.device.peak_flops.bf16",
     "expected 0 or 1e+06 to 1e+18 FLOP/s (the plausible range), got 0.001"},
    {"\"fp32\": 1e12", "\"fp32\": 1e300", "node.device.peak_flops.fp32",
     "expected 0 or 1e+06 to 1e+18 FLOP/s (the plausible range), got 1e+300"},
    {"\"powersgd\": 2e9", "\"powersgd\": 1e-300", "compressors.powersgd",
     "expected 0 or 1000 to 1e+15 bytes/s (the plausible range), got 1e-300"},
    {"\"alpha_s\": 1e-4", "\"alpha_s\": 1e308", "collectives[0].alpha_s",
     "expected 0 to 10 seconds (the plausible range), got 1e+308"},
    {"\"beta_s_per_byte\": 1e-10", "\"beta_s_per_byte\": 1e-300", "collectives[0].beta_s_per_byte",
     "expected 1e-15 to 0.001 seconds/byte (the plausible range), got 1e-300"},
    {"\"ranks\": 8", "\"ranks\": 2097152", "collectives[0].ranks",
     "expected a group of at most 1048576 ranks (the plausible range), got 2097152"},
    /* device counts past int: max_nodes x devices is counted in 64 bits and bounded */
    {"\"max_nodes\": 4", "\"max_nodes\": 1073741824", "max_nodes",
     "expected max_nodes x node.devices at most 1048576 devices, got 1073741824 x 8 = "
     "8589934592"},
    {"\"nodes\": 2, \"max_nodes\": 4,\n \"node\": {\"devices\": 8",
     "\"nodes\": 1073741824, \"max_nodes\": 1073741824,\n \"node\": {\"devices\": 1073741824",
     "max_nodes",
     "expected max_nodes x node.devices at most 1048576 devices, got 1073741824 x 1073741824 = "
     "1152921504606846976"},
    {"\"devices\": 8", "\"devices\": 2147483647", "max_nodes", "got 4 x 2147483647 = 8589934588"},
};

/* What the bounds allow: a precision not offered (peak 0), and every figure at its bound. */
static void test_plausible_edges(void) {
    static const struct {
        const char *find, *replace;
    } edits[] = {
        {"\"bf16\": 4e12", "\"bf16\": 0"},
        {"\"bandwidth\": 1e11", "\"bandwidth\": 1e3"},
        {"\"bandwidth\": 1e10", "\"bandwidth\": 1e15"},
        {"\"latency_s\": 1e-5", "\"latency_s\": 10"},
        {"\"fp32\": 1e12", "\"fp32\": 1e18"},
        {"\"max_nodes\": 4", "\"max_nodes\": 131072"}, /* x 8 devices = 2^20 */
    };
    char path[1100];
    snprintf(path, sizeof path, "%s/edge.json", tmpdir);
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char text[4096];
        CHECK(check_edit_text(valid_text, edits[i].find, edits[i].replace, text, sizeof text),
              "edge %zu: the edit applies", i);
        check_write_text(path, text);
        loom_cluster c;
        CHECK(loom_cluster_read(path, &c) == LOOM_OK, "edge %zu (%s): %s", i, edits[i].replace,
              loom_last_error());
    }
}

static void test_rules(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/broken.json", tmpdir);
    for (size_t i = 0; i < sizeof broken_cases / sizeof broken_cases[0]; i++) {
        const broken_case *b = &broken_cases[i];
        char text[4096];
        if (!check_edit_text(valid_text, b->find, b->replace, text, sizeof text)) {
            CHECK(0, "case %zu (%s): the edit does not apply", i, b->path);
            continue;
        }
        check_write_text(path, text);
        loom_cluster c;
        memset(&c, 0x5a, sizeof c);
        loom_status st = loom_cluster_read(path, &c);
        char expected[1300];
        snprintf(expected, sizeof expected, "%s: %s: ", path, b->path);
        const char *msg = loom_last_error();
        CHECK(st == LOOM_ERR_INPUT && strstr(msg, expected) && strstr(msg, b->detail),
              "case %zu: expected \"%s...%s\", got \"%s\"", i, expected, b->detail, msg);
        CHECK(is_zeroed(&c), "case %zu: a failed read leaves a zeroed description", i);
    }

    /* more points than the table holds, and exactly as many */
    loom_cluster c;
    loom_status st;
    char text[8192];
    for (int count = LOOM_CLUSTER_MAX_GEMM_POINTS + 1; count >= LOOM_CLUSTER_MAX_GEMM_POINTS;
         count--) {
        char points[6000] = "[";
        size_t used = 1;
        for (int i = 0; i < count; i++) {
            used +=
                (size_t)snprintf(points + used, sizeof points - used,
                                 "%s{\"flops\": %d, \"efficiency\": 0.5}", i ? ", " : "", i + 1);
        }
        snprintf(points + used, sizeof points - used, "]");
        CHECK(check_edit_text(valid_text, GEMM_LIST, points, text, sizeof text),
              "%d points: the edit", count);
        check_write_text(path, text);
        st = loom_cluster_read(path, &c);
        if (count > LOOM_CLUSTER_MAX_GEMM_POINTS) {
            CHECK(st == LOOM_ERR_INPUT &&
                      strstr(loom_last_error(), "node.device.gemm_efficiency: expected a list "
                                                "of 1 to 64"),
                  "65 points: %s", loom_last_error());
        } else {
            CHECK(st == LOOM_OK && c.gemm_points == count, "64 points: %s", loom_last_error());
        }
    }

    /* edits that keep the description valid */
    static const struct {
        const char *find, *replace;
    } fine[] = {
        {"\"source\": \"a test\", ", ""},
        {",\n   \"sources\": {\"peak_flops\": \"datasheet\"}", ""},
        {"\"peak_flops\": \"datasheet\"", "\"anything\": \"at all\""},
        {", \"source\": \"spec\"", ""},
        {",\n \"collectives\": [" FIT "]", ""},
        {",\n \"compressors\": {\"powersgd\": 2e9, \"int8\": 5e8}", ""},
        {"\"int8\": 5e8", "\"none\": 0"},
        {"\"bf16\": 4e12", "\"fp16\": 0"},
        {"\"max_nodes\": 4", "\"max_nodes\": 2"},
        {"\"efficiency\": 0.9", "\"efficiency\": 1"},
        {"\"latency_s\": 2e-6", "\"latency_s\": 0"},
        {"[{\"flops\": 1e6, \"efficiency\": 0.1}, {\"flops\": 1e8, \"efficiency\": 0.5}, ", "["},
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        CHECK(check_edit_text(valid_text, fine[i].find, fine[i].replace, text, sizeof text),
              "fine case %zu: the edit does not apply", i);
        check_write_text(path, text);
        st = loom_cluster_read(path, &c);
        CHECK(st == LOOM_OK, "fine case %zu: %s", i, loom_last_error());
    }
}

static void test_malformed(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/malformed.json", tmpdir);
    static const struct {
        const char *text, *detail;
    } cases[] = {
        {"{\"name\": \"x\",\n \"nodes\": 1,,}", ":2:13: invalid JSON"},
        {"{\"nodes\": 1, \"nodes\": 1}", ":1:"},
        {"", ":1:0: invalid JSON"},
        {"[1, 2]", "(top level): expected a JSON object, got [1,2]"},
        {"{\"nodes\": 1e999}", "invalid JSON"},
        {"{\"name\": \"a\\u0000b\"}", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_write_text(path, cases[i].text);
        loom_cluster c;
        loom_status st = loom_cluster_read(path, &c);
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), path) &&
                  strstr(loom_last_error(), cases[i].detail),
              "malformed %zu: %s", i, loom_last_error());
        CHECK(is_zeroed(&c), "malformed %zu: zeroed", i);
    }
    loom_cluster c;
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/no_such_file.json", tmpdir);
    CHECK(loom_cluster_read(missing, &c) == LOOM_ERR_INPUT && strstr(loom_last_error(), missing),
          "missing file: %s", loom_last_error());
}

/* What a file cannot say (non-finite numbers, words out of range) but a description built in
 * memory can. */
static void test_rules_in_memory(void) {
    loom_cluster valid;
    read_valid(&valid);
    CHECK(loom_cluster_check(&valid, "mem") == LOOM_OK, "valid: %s", loom_last_error());
    static const struct {
        int which;
        const char *message;
    } cases[] = {
        {0, "mem: node.device.peak_flops.bf16: expected a finite number >= 0 (FLOP/s; 0: the "
            "precision is not offered), got nan"},
        {1, "mem: node.device.memory_bandwidth: expected a finite number > 0 (bytes/s), got inf"},
        {2, "mem: node.device.gemm_efficiency[1].efficiency: expected a share of peak in (0, 1], "
            "got nan"},
        {3, "mem: node.device.gemm_efficiency[2].flops: expected a finite number > 0 (2 m n k), "
            "got inf"},
        {4, "mem: node.links.inter_node.latency_s: expected a finite number >= 0 (seconds), got "
            "inf"},
        {5, "mem: collectives[0].op: expected one of \"allreduce\", \"allgather\", "
            "\"reduce_scatter\" or \"sendrecv\", got 7"},
        {6, "mem: collectives[0].link: expected \"intra_node\" or \"inter_node\", got 2"},
        {7, "mem: collectives: expected 0 to 64 fits, got 65"},
        {8, "mem: node.device.gemm_efficiency: expected 1 to 64 points, got 0"},
        {9, "mem: compressors.topk: expected a finite number >= 0 (bytes/s; 0: not measured), "
            "got -inf"},
        {10, "mem: name: expected a name of 1 to 63 bytes, got a longer one"},
        {11, "mem: node.device.name: expected UTF-8 text"},
        {12, "mem: name: expected a name of 1 to 63 bytes, got \"\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        loom_cluster c = valid;
        switch (cases[i].which) {
        case 0:
            c.peak_flops[LOOM_PRECISION_BF16] = NAN;
            break;
        case 1:
            c.memory_bandwidth = INFINITY;
            break;
        case 2:
            c.gemm[1].efficiency = NAN;
            break;
        case 3:
            c.gemm[2].flops = INFINITY;
            break;
        case 4:
            c.links[LOOM_LINK_INTER_NODE].latency_s = INFINITY;
            break;
        case 5:
            c.collectives[0].op = (loom_collective_op)7;
            break;
        case 6:
            c.collectives[0].link = LOOM_LINK_CLASSES;
            break;
        case 7:
            c.num_collectives = LOOM_CLUSTER_MAX_COLLECTIVES + 1;
            break;
        case 8:
            c.gemm_points = 0;
            break;
        case 9:
            c.compressor_bytes_per_s[LOOM_COMPRESS_TOPK] = -INFINITY;
            break;
        case 10:
            memset(c.name, 'a', sizeof c.name);
            break;
        case 11:
            snprintf(c.device_name, sizeof c.device_name, "GPU \xc3");
            break;
        case 12:
            c.name[0] = '\0';
            break;
        }
        loom_status st = loom_cluster_check(&c, "mem");
        CHECK(st == LOOM_ERR_INPUT && strcmp(loom_last_error(), cases[i].message) == 0,
              "in memory %zu: expected \"%s\", got \"%s\"", i, cases[i].message, loom_last_error());
    }
}

/* ---- the figures ---------------------------------------------------------------------------- */

static void test_gemm(void) {
    loom_cluster c;
    read_valid(&c); /* points (1e6, 0.1), (1e8, 0.5), (1e10, 0.9); fp32 1e12, bf16 4e12 */
    static const struct {
        double flops, efficiency;
    } cases[] = {
        {1e6, 0.1},
        {1e8, 0.5},
        {1e10, 0.9}, /* at the points */
        {1e7, 0.3},
        {1e9, 0.7},                 /* halfway in log(flops) */
        {1e6 * sqrt(10), 0.2},      /* a quarter of the first interval */
        {1e10 / pow(10, 0.5), 0.8}, /* three quarters of the second */
        {1, 0.1},
        {0, 0.1},
        {-5, 0.1}, /* below the table: flat */
        {1e12, 0.9},
        {1e300, 0.9}, /* above it */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_CLOSE(loom_cluster_gemm_efficiency(&c, cases[i].flops), cases[i].efficiency, 1e-12,
                    1e-15, "efficiency");
    }
    CHECK(loom_cluster_gemm_efficiency(&c, NAN) == 0.1, "NaN FLOPs: the first point");

    /* 100 x 100 x 500: 1e7 FLOPs at 0.3 of 1e12 */
    CHECK_CLOSE(loom_cluster_gemm_s(&c, LOOM_PRECISION_FP32, 100, 100, 500), 1e7 / (1e12 * 0.3),
                1e-12, 0, "fp32 GEMM seconds");
    /* the same in bf16: 4x the peak */
    CHECK_CLOSE(loom_cluster_gemm_s(&c, LOOM_PRECISION_BF16, 100, 100, 500), 1e7 / (4e12 * 0.3),
                1e-12, 0, "bf16 GEMM seconds");
    /* 10^4 cubed: 2e12 FLOPs, past the table: 0.9 */
    CHECK_CLOSE(loom_cluster_gemm_s(&c, LOOM_PRECISION_FP32, 1e4, 1e4, 1e4), 2e12 / (1e12 * 0.9),
                1e-12, 0, "big GEMM seconds");
    /* 1000 x 1000 x 50: 1e8 FLOPs, a point */
    CHECK_CLOSE(loom_cluster_gemm_s(&c, LOOM_PRECISION_FP32, 1000, 1000, 50), 1e8 / (1e12 * 0.5),
                1e-12, 0, "GEMM at a point");
    CHECK(loom_cluster_gemm_s(&c, LOOM_PRECISION_FP16, 100, 100, 500) == 0,
          "no fp16 peak: 0 seconds");
    CHECK(loom_cluster_gemm_s(&c, LOOM_PRECISION_FP32, 0, 100, 500) == 0, "an empty GEMM: 0");

    /* a one-point table is flat */
    c.gemm_points = 1;
    CHECK(loom_cluster_gemm_efficiency(&c, 1) == 0.1 &&
              loom_cluster_gemm_efficiency(&c, 1e20) == 0.1,
          "one point: flat");
}

static void test_collectives(void) {
    loom_cluster c;
    read_valid(&c); /* intra 1e11 B/s, 2 us; inter 1e10 B/s, 10 us; fit: allreduce inter 8 */
    const int intra = LOOM_LINK_INTRA_NODE, inter = LOOM_LINK_INTER_NODE;
    /* the ring: allreduce 2(n-1)/n of the bytes per device and 2(n-1) latencies (reduce-scatter,
     * then all-gather); the others (n-1)/n and n-1 */
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, intra, 8, 1e9),
                2.0 * 7 / 8 * 1e9 / 1e11 + 14 * 2e-6, 1e-12, 0, "allreduce, 8 intra");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, intra, 8, 1e9), 0.017528,
                1e-12, 0, "allreduce, 8 intra (by hand)");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLGATHER, inter, 4, 4e8), 0.03003,
                1e-12, 0, "all-gather, 4 inter: 3/4 x 4e8 / 1e10 + 3 x 1e-5");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_REDUCE_SCATTER, inter, 4, 4e8),
                0.03003, 1e-12, 0, "reduce-scatter, 4 inter");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_SENDRECV, inter, 2, 1e6), 1.1e-4,
                1e-12, 0, "send-receive: 1e6 / 1e10 + 1e-5");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, intra, 2, 1e6),
                1e6 / 1e11 + 2 * 2e-6, 1e-12, 0, "allreduce, 2 intra: (n-1)/n x 2 = 1");
    /* the fit, where (op, link, ranks) matches exactly */
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, inter, 8, 1e9), 0.1001,
                1e-12, 0, "the fit: 1e-4 + 1e-10 x 1e9");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, inter, 16, 1e9),
                2.0 * 15 / 16 * 1e9 / 1e10 + 30 * 1e-5, 1e-12, 0, "other ranks: the ring");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, intra, 8, 1e9), 0.017528,
                1e-12, 0, "other link: the ring");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLGATHER, inter, 8, 1e9),
                7.0 / 8 * 1e9 / 1e10 + 7 * 1e-5, 1e-12, 0, "other op: the ring");
    /* one rank or none: nothing to do */
    CHECK(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, inter, 1, 1e9) == 0, "1 rank");
    CHECK(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_SENDRECV, intra, 0, 1e9) == 0, "0 ranks");
    /* a link's per-call cost: once per ring collective whatever its steps, never for a send,
     * never on top of a fit (whose alpha holds it) */
    c.links[LOOM_LINK_INTRA_NODE].call_latency_s = 8e-6;
    c.links[LOOM_LINK_INTER_NODE].call_latency_s = 3e-5;
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, intra, 8, 1e9),
                0.017528 + 8e-6, 1e-12, 0, "allreduce, 8 intra, one call's cost");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_REDUCE_SCATTER, inter, 4, 4e8),
                0.03003 + 3e-5, 1e-12, 0, "reduce-scatter, 4 inter, one call's cost");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLGATHER, intra, 2, 0), 2e-6 + 8e-6,
                1e-12, 0, "an empty all-gather: one step and the call");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_SENDRECV, inter, 2, 1e6), 1.1e-4,
                1e-12, 0, "a send pays no call cost");
    CHECK_CLOSE(loom_cluster_collective_s(&c, LOOM_COLLECTIVE_ALLREDUCE, inter, 8, 1e9), 0.1001,
                1e-12, 0, "the fit holds its own alpha");
}

/* The training precision: fp32 when the file leaves it out (the valid description does), the
 * word when it names one, written always and read back equal; one without a peak is not
 * written. */
static void test_training_precision(void) {
    loom_cluster c;
    read_valid(&c);
    CHECK(c.training_precision == LOOM_PRECISION_FP32, "left out: fp32, got %s",
          loom_precision_name(c.training_precision));
    char path[1100], text[4096];
    snprintf(path, sizeof path, "%s/bf16.json", tmpdir);
    CHECK(check_edit_text(valid_text, "\"memory_bandwidth\": 1e11",
                          "\"training_precision\": \"bf16\", \"memory_bandwidth\": 1e11", text,
                          sizeof text),
          "training precision: the edit applies");
    check_write_text(path, text);
    CHECK(loom_cluster_read(path, &c) == LOOM_OK && c.training_precision == LOOM_PRECISION_BF16,
          "named bf16: %s", loom_last_error());
    round_trip(&c, NULL, "training precision bf16");
    read_valid(&c);
    round_trip(&c, NULL, "training precision left out (fp32)");
    /* written always: the file names it */
    snprintf(path, sizeof path, "%s/written.json", tmpdir);
    CHECK(loom_cluster_write(path, &c, NULL) == LOOM_OK, "write: %s", loom_last_error());
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    const char *word = json_string_value(json_object_get(
        json_object_get(json_object_get(root, "node"), "device"), "training_precision"));
    CHECK(word && strcmp(word, "fp32") == 0, "written: training_precision %s",
          word ? word : "(none)");
    json_decref(root);
    /* in memory: a precision without a peak is refused by name, nothing written */
    c.training_precision = LOOM_PRECISION_FP16;
    snprintf(path, sizeof path, "%s/fp16_never.json", tmpdir);
    loom_status st = loom_cluster_write(path, &c, NULL);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "node.device.training_precision: "
                                                            "expected a precision"),
          "fp16 without a peak: %s", loom_last_error());
    FILE *f = fopen(path, "r");
    CHECK(f == NULL, "fp16 without a peak: nothing written");
    if (f) fclose(f);
    c.training_precision = (loom_precision)LOOM_PRECISIONS;
    CHECK(loom_cluster_check(&c, "mem") == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "mem: node.device.training_precision: expected"),
          "out of range: %s", loom_last_error());
}

/* The ring's traffic per rank, by hand: an allreduce of 12 bytes over 3 ranks sends 2 x 2/3 x 12
 * = 16 per rank, an all-gather or a reduce-scatter 8; a send-receive the whole buffer; one rank
 * sends nothing. */
static void test_ring_bytes(void) {
    CHECK(loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLREDUCE, 3, 12) == 16, "allreduce, 3");
    CHECK(loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLGATHER, 3, 12) == 8, "all-gather, 3");
    CHECK(loom_cluster_ring_bytes(LOOM_COLLECTIVE_REDUCE_SCATTER, 3, 12) == 8, "reduce-scatter, 3");
    CHECK(loom_cluster_ring_bytes(LOOM_COLLECTIVE_SENDRECV, 2, 12) == 12, "send-receive");
    CHECK(loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLREDUCE, 2, 12) == 12, "allreduce, 2");
    CHECK(loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLREDUCE, 8, 1e9) == 1.75e9, "allreduce, 8");
    CHECK(loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLREDUCE, 1, 12) == 0 &&
              loom_cluster_ring_bytes(LOOM_COLLECTIVE_SENDRECV, 0, 12) == 0,
          "one rank or none");
    /* a whole buffer a non-power-of-two ring divides gives whole bytes (3 x 7 x 2 / 3) */
    CHECK(loom_cluster_ring_bytes(LOOM_COLLECTIVE_ALLGATHER, 3, 3.0 * 7e12) == 2 * 7e12,
          "all-gather of a large divisible buffer: exact");
}

static void test_precisions(void) {
    static const char *const names[] = {"fp32", "bf16", "fp16"};
    for (int p = 0; p < LOOM_PRECISIONS; p++) {
        loom_precision got = (loom_precision)-1;
        CHECK(loom_precision_parse(names[p], "flags", "--precision", &got) == LOOM_OK &&
                  (int)got == p,
              "parse %s", names[p]);
        CHECK(strcmp(loom_precision_name((loom_precision)p), names[p]) == 0, "name %d", p);
    }
    CHECK(strcmp(loom_precision_name((loom_precision)LOOM_PRECISIONS), "?") == 0, "out of range");
    static const struct {
        const char *name, *got;
    } bad[] = {{"FP32", "\"FP32\""},
               {"fp64", "\"fp64\""},
               {"", "\"\""},
               {"fp32 ", "\"fp32 \""},
               {NULL, "\"\""}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_precision got = LOOM_PRECISION_BF16;
        loom_status st = loom_precision_parse(bad[i].name, "flags", "--precision", &got);
        char expected[128];
        snprintf(expected, sizeof expected,
                 "flags: --precision: expected one of \"fp32\", \"bf16\" or \"fp16\", got %s",
                 bad[i].got);
        CHECK(st == LOOM_ERR_INPUT && strcmp(loom_last_error(), expected) == 0,
              "bad precision %zu: %s", i, loom_last_error());
        CHECK(got == LOOM_PRECISION_BF16, "bad precision %zu: output untouched", i);
    }
}

/* The island level: read (nodes, link) and written back equal; left out, none; its rules named
 * by path. */
static void test_islands(void) {
    char path[1100], text[4096];
    snprintf(path, sizeof path, "%s/islands.json", tmpdir);
    const char *level = " \"compressors\": {\"powersgd\": 2e9, \"int8\": 5e8},\n"
                        " \"islands\": {\"nodes\": 2, \"link\": {\"bandwidth\": 1.25e7, "
                        "\"latency_s\": 0.05, \"call_latency_s\": 0.001, \"source\": \"WAN\"}}}\n";
    CHECK(check_edit_text(valid_text, " \"compressors\": {\"powersgd\": 2e9, \"int8\": 5e8}}\n",
                          level, text, sizeof text),
          "islands: the edit applies");
    check_write_text(path, text);
    loom_cluster c;
    loom_status st = loom_cluster_read(path, &c);
    CHECK(st == LOOM_OK && c.island_nodes == 2 && c.island_link.bandwidth == 1.25e7 &&
              c.island_link.latency_s == 0.05 && c.island_link.call_latency_s == 0.001,
          "islands read: %s", st == LOOM_OK ? "wrong values" : loom_last_error());
    if (st == LOOM_OK) round_trip(&c, NULL, "islands");
    read_valid(&c);
    CHECK(c.island_nodes == 0, "islands left out: none");
    const struct {
        const char *find, *replace, *message;
    } bad[] = {
        {"\"nodes\": 2, \"link\"", "\"nodes\": 0, \"link\"",
         "islands.nodes: expected at least 1 node an island, got 0"},
        {"\"nodes\": 2, \"link\"", "\"nodes\": 9, \"link\"",
         "islands.nodes: expected 1 to max_nodes 4 nodes an island, got 9"},
        {"\"bandwidth\": 1.25e7", "\"bandwidth\": 0",
         "islands.link.bandwidth: expected a finite number > 0"},
        {"\"latency_s\": 0.05", "\"latency_s\": -1", "islands.link.latency_s"},
        {"\"nodes\": 2, \"link\"", "\"hosts\": 2, \"link\"", "islands.hosts"},
        {", \"link\": {\"bandwidth\": 1.25e7, \"latency_s\": 0.05, \"call_latency_s\": 0.001, "
         "\"source\": \"WAN\"}",
         "", "islands.link: missing"},
    };
    char edited[4096];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (!check_edit_text(text, bad[i].find, bad[i].replace, edited, sizeof edited)) continue;
        snprintf(path, sizeof path, "%s/islands_bad_%zu.json", tmpdir, i);
        check_write_text(path, edited);
        st = loom_cluster_read(path, &c);
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), bad[i].message),
              "islands case %zu: expected '%s', got %s", i, bad[i].message,
              st == LOOM_OK ? "ok" : loom_last_error());
    }
}

int main(void) {
    tmpdir = check_tmpdir();
    test_islands();
    test_shipped();
    test_round_trip();
    test_rules();
    test_plausible_edges();
    test_malformed();
    test_rules_in_memory();
    test_gemm();
    test_collectives();
    test_training_precision();
    test_ring_bytes();
    test_precisions();
    return check_finish();
}
