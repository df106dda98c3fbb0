/*
 * profile_cmd.c — `loom profile`: under mpirun, on the ranks that will train, measures the
 * cluster description (loom/profile.h: every rank at once, so shared cores and
 * oversubscription are in the figures), writes it atomically from rank 0 (--out, default
 * cluster.json) and prints a summary: hosts, ranks per host, sgemm peak, memory and its
 * bandwidth, the links, the collective fits, the GEMM table, the compressors, and how long the
 * profile took. Progress lines show each phase as it runs.
 *
 * Not here: the measurements (plan/profile.c), the file's layout and checks (plan/cluster.c).
 */
#include "cli/cli.h"
#include "loom/comm.h"
#include "loom/cluster.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char out[1024];
    int threads, quick, pretend_hosts;
} profile_args;

#define POPT(...) CLI_OPT(profile_args, __VA_ARGS__)

static const cli_opt profile_opts[] = {
    CLI_GROUP("run"),
    POPT("--threads", OPT_INT, threads,
         "OpenMP and OpenBLAS threads per rank, the ones training will use (default: as the "
         "environment gives, like loom train)"),
    POPT("--quick", OPT_FLAG, quick,
         "fewer and smaller repetitions: seconds instead of a minute (tests, a first look)"),
    POPT("--pretend-hosts", OPT_INT, pretend_hosts,
         "testing: take the ranks as N hosts (contiguous blocks of ranks), to exercise the "
         "measurements between hosts on one machine (default: by host name)"),
    CLI_GROUP("output"),
    POPT("--out", OPT_STRING, out, "cluster description to write (default cluster.json)"),
};
#define NPROFILE ((int)(sizeof profile_opts / sizeof profile_opts[0]))

static const char *profile_usage =
    "usage: mpirun -np N loom profile [--out cluster.json] [--threads N] [--quick]\n"
    "       (run it on the ranks that will train: it measures the device, memory, links and\n"
    "       collectives with every rank running, and finds which ranks share a host)";

static const char *link_names[LOOM_LINK_CLASSES] = {"intra_node", "inter_node"};

static void print_links(const loom_cluster *c) {
    for (int l = 0; l < LOOM_LINK_CLASSES; l++) {
        int copied = (l == LOOM_LINK_INTER_NODE && c->nodes == 1) ||
                     (l == LOOM_LINK_INTRA_NODE && c->nodes > 1 && c->devices_per_node == 1);
        printf("  %-10s %-18s latency %7.1f us, bandwidth %7.2f GB/s (one way)%s\n",
               l == 0 ? "links" : "", link_names[l], c->links[l].latency_s * 1e6,
               c->links[l].bandwidth / 1e9, copied ? ", copied: not measured" : "");
    }
    static const char *ops[LOOM_COLLECTIVE_OPS] = {"allreduce", "allgather", "reduce_scatter",
                                                   "sendrecv"};
    for (int i = 0; i < c->num_collectives; i++) {
        const loom_collective_fit *f = &c->collectives[i];
        printf("  %-10s %-14s %-10s %2d ranks: alpha %7.1f us, 1/beta %6.2f GB/s\n",
               i == 0 ? "fits" : "", ops[f->op], link_names[f->link], f->ranks, f->alpha_s * 1e6,
               1e-9 / f->beta_s_per_byte);
    }
}

static void print_summary(const char *path, const loom_cluster *c, double seconds) {
    printf("\n%s: %d host%s x %d rank%s (%s), measured in %.1f s\n", path, c->nodes,
           c->nodes == 1 ? "" : "s", c->devices_per_node, c->devices_per_node == 1 ? "" : "s",
           c->device_name, seconds);
    printf("  %-10s %-18s %8.1f GFLOP/s per rank (the fastest GEMM, all ranks at once)\n", "device",
           "peak fp32", c->peak_flops[LOOM_PRECISION_FP32] / 1e9);
    for (int p = LOOM_PRECISION_FP32 + 1; p < LOOM_PRECISIONS; p++) {
        printf("  %-10s peak %-13s %s\n", "", loom_precision_name((loom_precision)p),
               "not offered (loom trains fp32)");
    }
    printf("  %-10s %-18s %8.2f GiB per rank\n", "", "memory",
           (double)c->memory_bytes / 1073741824.0);
    printf("  %-10s %-18s %8.2f GB/s per rank (STREAM triad)\n", "", "memory bandwidth",
           c->memory_bandwidth / 1e9);
    print_links(c);
    printf("  %-10s %12s %10s %10s\n", "GEMM", "FLOPs", "GFLOP/s", "efficiency");
    for (int i = 0; i < c->gemm_points; i++) {
        const loom_gemm_point *g = &c->gemm[i];
        printf("  %-10s %12.3g %10.1f %10.3f\n", "", g->flops,
               g->efficiency * c->peak_flops[LOOM_PRECISION_FP32] / 1e9, g->efficiency);
    }
    printf("  %-10s", "compressors");
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) {
        if (c->compressor_bytes_per_s[m] > 0) {
            printf(" %s %.2f GB/s", loom_compress_method_name((loom_compress_method)m),
                   c->compressor_bytes_per_s[m] / 1e9);
        }
    }
    printf("\n");
}

/* Rank 0 decides (the output path, writing the file); the others take its exit code, and only
 * rank 0 prints the message. */
static loom_status share_status(loom_comm *world, loom_status status) {
    double code = (double)status;
    loom_status st = loom_comm_broadcast(world, &code, sizeof code, 0);
    if (st != LOOM_OK) return st;
    if (loom_comm_rank(world) != 0 && code != LOOM_OK) loom_clear_error();
    return (loom_status)code;
}

static int fail_quietly(loom_comm *world, loom_status status) {
    if (loom_comm_rank(world) == 0) return cli_finish(world, cli_fail(status));
    return cli_finish(world, loom_exit_code(status));
}

int cmd_profile(int argc, char **argv) {
    if (cli_find_flag(argc, argv, "--help") >= 0 || cli_find_flag(argc, argv, "-h") >= 0) {
        cli_print_help(profile_usage, profile_opts, NPROFILE, NULL);
        return 0;
    }
    loom_comm *world = NULL;
    loom_status st = cli_start_mpi(&argc, &argv, &world);
    if (st != LOOM_OK) return cli_fail(st);
    /* a bad flag is the same on every rank: each says so and exits cleanly */
    profile_args args = {.out = "cluster.json"};
    st = cli_parse_flags(&args, profile_opts, NPROFILE, argc, argv, 2, NULL);
    if (st != LOOM_OK) return cli_finish(world, cli_fail(st));
    if (!world || loom_comm_size(world) < 2) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "loom profile measures the links between ranks: run it under mpirun on "
                       "the ranks that will train (at least 2), e.g. mpirun -np 2 loom profile "
                       "--out cluster.json");
        return cli_finish(world, cli_fail(st));
    }
    int rank0 = loom_comm_rank(world) == 0;
    st = share_status(world, rank0 ? cli_prepare_out(args.out, "a cluster description") : LOOM_OK);
    if (st != LOOM_OK) return fail_quietly(world, st);

    loom_profile_opts opts = {.threads = args.threads,
                              .quick = args.quick,
                              .verbose = 1,
                              .pretend_hosts = args.pretend_hosts};
    loom_cluster cluster;
    double started = loom_now();
    double core_scale = 1.0;
    st = loom_profile_run(world, &opts, &cluster, &core_scale);
    if (st != LOOM_OK) return cli_finish(world, cli_fail(st));
    double seconds = loom_now() - started;
    loom_status written = LOOM_OK;
    if (rank0) {
        char note[512];
        loom_profile_source_note(&cluster, core_scale, note, sizeof note);
        written = loom_cluster_write(args.out, &cluster, note);
        if (written == LOOM_OK) print_summary(args.out, &cluster, seconds);
    }
    st = share_status(world, written);
    if (st != LOOM_OK) return fail_quietly(world, st);
    if (rank0) printf("wrote %s\n", args.out);
    return cli_finish(world, 0);
}
