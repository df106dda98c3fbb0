/*
 * plan_auto.c — `loom train --plan auto`: the planner picks the layout for the ranks the job
 * has. The cluster description is --cluster's, or `loom profile`'s measurement of these very
 * ranks, cached (keyed by the ranks' hosts, their count and the threads per rank) so that the
 * next run on the same ranks starts at once. Every rank searches (the search is deterministic,
 * and the ranks check that they agree); rank 0 prints the candidates and writes OUT/plan.json
 * with the prediction, which the run reports beside what it measures.
 *
 * Not here: the search and the cost model (plan/), the measurements (plan/profile.c).
 */
#include "cli/cli.h"
#include "loom/comm.h"
#include "loom/planner.h"
#include "loom/ops.h"
#include "loom/cluster.h"
#include "loom/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CANDIDATES 5

static uint32_t fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The cache folder: $LOOM_CACHE_DIR, $XDG_CACHE_HOME/loom or ~/.cache/loom. */
static void cache_dir(char *dir, size_t cap) {
    const char *env = getenv("LOOM_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (env && env[0]) {
        snprintf(dir, cap, "%s", env);
    } else if (xdg && xdg[0]) {
        snprintf(dir, cap, "%s/loom", xdg);
    } else {
        snprintf(dir, cap, "%s/.cache/loom", home && home[0] ? home : "/tmp");
    }
}

/* The cached description's path for these ranks: a hash of every rank's host name and rank,
 * the rank count and the threads per rank. Collective. */
static loom_status cache_path(loom_comm *world, int threads, char *path, size_t cap) {
    char host[256], item[300];
    loom_status st = loom_comm_host_name(host, sizeof host);
    if (st != LOOM_OK) return st;
    snprintf(item, sizeof item, "%s#%d", host, loom_comm_rank(world));
    double key = (double)fnv1a(item); /* a sum of < 2^21 such values is exact in a double */
    st = loom_comm_allreduce_f64(world, &key, 1, LOOM_REDUCE_SUM);
    if (st != LOOM_OK) return st;
    char dir[LOOM_PATH_MAX - 64];
    cache_dir(dir, sizeof dir);
    snprintf(path, cap, "%s/cluster-%08x-%dranks-%dthreads.json", dir,
             (unsigned)fmod(key, 4294967296.0), loom_comm_size(world), threads);
    return LOOM_OK;
}

/* The description: --cluster's, the cache's, or measured now (and cached). Every rank gets the
 * same. */
static loom_status cluster_for(const loom_train_config *cfg, loom_comm *world, loom_cluster *cl) {
    memset(cl, 0, sizeof *cl);
    if (cfg->cluster[0]) return loom_cluster_read(cfg->cluster, cl);
    int rank0 = loom_comm_rank(world) == 0;
    int threads = cfg->threads > 0 ? cfg->threads : loom_ops_get_threads();
    char path[LOOM_PATH_MAX];
    loom_status st = cache_path(world, threads, path, sizeof path);
    if (st != LOOM_OK) return st;
    double have = 0;
    struct stat sb;
    if (rank0 && stat(path, &sb) == 0) {
        if (loom_cluster_read(path, cl) == LOOM_OK) {
            have = 1;
        } else {
            loom_warn("--plan auto: the cached cluster description %s is unreadable (%s); "
                      "measuring again",
                      path, loom_last_error());
            loom_clear_error();
        }
    }
    st = loom_comm_broadcast(world, &have, sizeof have, 0);
    if (st != LOOM_OK) return st;
    if (have) {
        if (rank0)
            loom_info("--plan auto: cluster description %s (cached; delete it to measure again)",
                      path);
        return loom_comm_broadcast(world, cl, sizeof *cl, 0);
    }
    if (rank0) {
        loom_info("--plan auto: measuring these %d ranks with loom profile (once: cached in %s)",
                  loom_comm_size(world), path);
    }
    const char *quick = getenv("LOOM_PROFILE_QUICK"); /* tests */
    loom_profile_opts opts = {.threads = cfg->threads,
                              .quick = quick && quick[0] && strcmp(quick, "0") != 0,
                              .verbose = 1};
    st = loom_profile_run(world, &opts, cl);
    if (st != LOOM_OK || !rank0) return st;
    char dir[LOOM_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    char note[512];
    loom_profile_source_note(cl, note, sizeof note);
    if (loom_mkdir_p(dir) != LOOM_OK || loom_cluster_write(path, cl, note) != LOOM_OK) {
        loom_warn("--plan auto: could not cache the cluster description in %s (%s); the next "
                  "run measures again",
                  path, loom_last_error());
        loom_clear_error();
    }
    return LOOM_OK;
}

/* The ranks agree on the plan (rank 0's mesh, micro batch, schedule and predicted step). */
static loom_status check_agreement(loom_comm *world, const loom_plan_candidate *best) {
    const loom_plan *p = &best->plan;
    double mine[6] = {p->dp, p->tp, p->pp, p->micro_batch, p->num_stages, best->prediction.step_s};
    double lead[6];
    memcpy(lead, mine, sizeof lead);
    loom_status st = loom_comm_broadcast(world, lead, sizeof lead, 0);
    if (st == LOOM_OK && memcmp(lead, mine, sizeof lead) != 0) {
        st = loom_fail(LOOM_ERR_RUNTIME,
                       "--plan auto: rank %d planned dp %g tp %g pp %g micro %g (%.6g s), rank 0 "
                       "dp %g tp %g pp %g micro %g (%.6g s): the ranks must run the same binary",
                       loom_comm_rank(world), mine[0], mine[1], mine[2], mine[3], mine[5], lead[0],
                       lead[1], lead[2], lead[3], lead[5]);
    }
    return st;
}

loom_status cli_plan_auto(const loom_train_config *cfg, loom_comm *world, loom_plan *plan) {
    int ranks = world ? loom_comm_size(world) : 1;
    int rank0 = !world || loom_comm_rank(world) == 0;
    loom_plan single;
    loom_status st = loom_train_plan(cfg, 1, &single); /* the model and the global batch */
    if (st != LOOM_OK) return st;
    if (ranks == 1 && !cfg->cluster[0]) {
        if (rank0) {
            loom_info("--plan auto: one rank, nothing to split (give --cluster FILE to plan the "
                      "micro batch too)");
        }
        *plan = single;
        return LOOM_OK;
    }
    loom_cluster cluster;
    if (world) {
        st = cluster_for(cfg, world, &cluster);
    } else {
        st = loom_cluster_read(cfg->cluster, &cluster);
    }
    loom_search_request req = {.devices = ranks,
                               .global_batch = single.global_batch,
                               .seq_len = cfg->seq_len,
                               .precision = LOOM_PRECISION_FP32,
                               .keep = CANDIDATES};
    if (st == LOOM_OK) st = cli_allow_compression(cfg->allow_compression, &req.allow_compression);
    int64_t devices = (int64_t)cluster.max_nodes * cluster.devices_per_node;
    if (st == LOOM_OK && devices < ranks) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "--plan auto: the cluster description \"%s\" has %lld devices, the job %d "
                       "ranks",
                       cluster.name, (long long)devices, ranks);
    }
    loom_plan_candidate best[CANDIDATES];
    int found = 0, tried = 0, fitting = 0, pruned = 0;
    double t0 = loom_now();
    if (st == LOOM_OK)
        st = loom_plan_search(&single.model, &cluster, &req, best, &found, &tried, &fitting,
                              &pruned);
    double took = loom_now() - t0;
    if (st == LOOM_OK && world) st = check_agreement(world, &best[0]);
    if (st == LOOM_OK) {
        st = cli_plan_fill_predicted(&best[0].plan, &best[0].prediction, cfg->seq_len);
    }
    if (st == LOOM_OK) st = loom_plan_copy(plan, &best[0].plan);
    if (st == LOOM_OK && rank0) {
        printf("--plan auto: searched %d layouts of %d ranks on %s in %.2f s; %d simulated, %d of "
               "them fit %.2f GiB per rank\n",
               tried + pruned, ranks, cluster.name, took, tried, fitting,
               (double)cluster.memory_bytes / 1073741824.0);
        cli_print_candidates(best, found);
        char path[LOOM_PATH_MAX];
        snprintf(path, sizeof path, "%.*s/plan.json", LOOM_PATH_MAX - 16, cfg->out);
        if (cli_prepare_out(path, "a plan file") == LOOM_OK &&
            loom_plan_write(path, plan) == LOOM_OK) {
            printf("--plan auto: chose #1, written to %s\n", path);
        } else {
            loom_warn("--plan auto: could not write %s (%s)", path, loom_last_error());
            loom_clear_error();
        }
        fflush(stdout);
    }
    for (int i = 0; i < found; i++) loom_plan_free(&best[i].plan);
    loom_plan_free(&single);
    return st;
}
