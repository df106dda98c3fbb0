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

/* The cache folder: $LOOM_CACHE_DIR, $XDG_CACHE_HOME/loom or ~/.cache/loom (a path too long
 * is refused by name, never cut). */
static loom_status cache_dir(char *dir, size_t cap) {
    const char *env = getenv("LOOM_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (env && env[0]) return loom_path_join(dir, cap, NULL, env);
    if (xdg && xdg[0]) return loom_path_join(dir, cap, xdg, "loom");
    return loom_path_join(dir, cap, home && home[0] ? home : "/tmp", ".cache/loom");
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
    char dir[LOOM_PATH_MAX], name[96];
    snprintf(name, sizeof name, "cluster-%08x-%dranks-%dthreads.json",
             (unsigned)fmod(key, 4294967296.0), loom_comm_size(world), threads);
    st = cache_dir(dir, sizeof dir);
    if (st == LOOM_OK) st = loom_path_join(path, cap, dir, name);
    if (st != LOOM_OK) {
        char why[2048];
        snprintf(why, sizeof why, "%s", loom_last_error());
        st = loom_fail(st,
                       "--plan auto: the cached cluster description: %s (set LOOM_CACHE_DIR "
                       "to a shorter folder, or give --cluster FILE)",
                       why);
    }
    return st;
}

/* The description: --cluster's, the cache's, or measured now (and cached). Every rank gets the
 * same. */
static loom_status cluster_for(const cli_train_args *args, loom_comm *world, loom_cluster *cl) {
    memset(cl, 0, sizeof *cl);
    const loom_train_config *cfg = &args->run;
    if (args->cluster[0]) return loom_cluster_read(args->cluster, cl);
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
    double core_scale = 1.0;
    st = loom_profile_run(world, &opts, cl, &core_scale);
    if (st != LOOM_OK || !rank0) return st;
    char dir[LOOM_PATH_MAX];
    loom_status joined = loom_path_join(dir, sizeof dir, NULL, path); /* path fits: same size */
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    char note[512];
    loom_profile_source_note(cl, core_scale, note, sizeof note);
    if (joined != LOOM_OK || loom_mkdir_p(dir) != LOOM_OK ||
        loom_cluster_write(path, cl, note) != LOOM_OK) {
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

/* The planner's inputs: the model and the global batch (LOOM_PLAN_DEFAULT_MICRO_BATCH sequences
 * when none is given). The planner chooses the micro batch, so no micro batch is checked against
 * the global batch here. */
static loom_status auto_inputs(const cli_train_args *args, loom_gpt_config *model, int *global) {
    *global = args->layout.global_batch_size ? args->layout.global_batch_size
                                             : LOOM_PLAN_DEFAULT_MICRO_BATCH;
    if (*global < 0) {
        return loom_fail(LOOM_ERR_INPUT, "--global-batch-size: expected a positive integer, got %d",
                         *global);
    }
    return loom_train_model_config(&args->run, model);
}

/* One rank and no cluster description: nothing to split. The micro batch is the largest divisor
 * of the global batch up to the default one. */
static loom_status one_rank_plan(const loom_gpt_config *model, int global, loom_plan *plan) {
    loom_layout_flags flags;
    loom_layout_flags_defaults(&flags);
    flags.global_batch_size = global;
    flags.micro_batch_size = LOOM_PLAN_DEFAULT_MICRO_BATCH;
    while (global % flags.micro_batch_size != 0) flags.micro_batch_size--;
    return loom_plan_from_flags(plan, model, &flags, 1);
}

/* A --cluster file that cannot be read or is wrong: the message names the flag too. */
static loom_status name_cluster_flag(const char *path, loom_status st) {
    if (st == LOOM_OK || !path[0]) return st;
    char why[2048];
    snprintf(why, sizeof why, "%s", loom_last_error());
    if (!strncmp(why, path, strlen(path))) return loom_fail(st, "--cluster %s", why);
    return loom_fail(st, "--cluster %s: %s", path, why);
}

loom_status cli_plan_auto(const cli_train_args *args, loom_comm *world, loom_plan *plan) {
    const loom_train_config *cfg = &args->run;
    int ranks = world ? loom_comm_size(world) : 1;
    int rank0 = !world || loom_comm_rank(world) == 0;
    loom_plan_init(plan);
    loom_gpt_config model;
    int global;
    loom_status st = auto_inputs(args, &model, &global);
    if (st != LOOM_OK) return st;
    if (ranks == 1 && !args->cluster[0]) {
        if (rank0) {
            loom_info("--plan auto: one rank, nothing to split (give --cluster FILE to plan the "
                      "micro batch too)");
        }
        return one_rank_plan(&model, global, plan);
    }
    loom_cluster cluster;
    if (world) {
        st = cluster_for(args, world, &cluster);
    } else {
        st = loom_cluster_read(args->cluster, &cluster);
    }
    st = name_cluster_flag(args->cluster, st);
    loom_search_request req = {.devices = ranks,
                               .global_batch = global,
                               .seq_len = cfg->seq_len,
                               .precision = LOOM_PRECISION_FP32,
                               .keep = CANDIDATES};
    if (st == LOOM_OK) st = cli_allow_compression(args->allow_compression, &req.allow_compression);
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
        st = loom_plan_search(&model, &cluster, &req, best, &found, &tried, &fitting, &pruned);
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
        char path[LOOM_PATH_MAX + 16];
        if (loom_path_join(path, sizeof path, cfg->out, "plan.json") == LOOM_OK &&
            cli_prepare_out(path, "a plan file") == LOOM_OK &&
            loom_plan_write(path, plan) == LOOM_OK) {
            printf("--plan auto: chose #1, written to %s\n", path);
        } else {
            loom_warn("--plan auto: could not write %s (%s)", path, loom_last_error());
            loom_clear_error();
        }
        fflush(stdout);
    }
    for (int i = 0; i < found; i++) loom_plan_free(&best[i].plan);
    return st;
}
