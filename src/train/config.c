/*
 * config.c — the run configuration: defaults, checks, the model it describes, and the
 * learning-rate schedule.
 */
#include "loom/io.h"
#include "loom/parallel.h"
#include "loom/train.h"
#include "base/json_fields.h"

#include <math.h>
#include <string.h>

/* --lr-schedule's words, in the order of the LR_* values. */
enum { LR_CONSTANT, LR_COSINE };
static const char *const lr_schedule_words[] = {"constant", "cosine"};
static const loom_words lr_schedules = {lr_schedule_words, 2};

void loom_train_config_defaults(loom_train_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->data, sizeof c->data, "data/train_*.bin");
    c->steps = 200;
    c->seq_len = 128;
    c->lr = 1e-3;
    c->min_lr_ratio = 0.1;
    snprintf(c->lr_schedule, sizeof c->lr_schedule, "cosine");
    c->warmup_steps = 20;
    c->weight_decay = 0.1;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->grad_clip = 1.0;
    c->max_bad_steps = 5;
    c->seed = 1337;
    c->threads = 0;
    snprintf(c->out, sizeof c->out, "runs/latest");
    c->save_every = 0;
    c->eval_every = 50;
    c->log_every = 10;
    snprintf(c->progress, sizeof c->progress, "auto");
    c->eval_batches = 16;
    c->bucket_mb = 0; /* loom_grad_bucket_default_mb of the run's dp */
    c->comm_timeout = 60.0;
}

int loom_train_config_sets_model(const loom_train_config *c) {
    return c->model[0] || c->layers || c->heads || c->d_model || c->context || c->vocab ||
           c->arch[0] || c->kv_heads || c->ffn_dim || c->tie_embeddings[0] || c->rope_theta ||
           c->norm_eps;
}

loom_status loom_train_model_config(const loom_train_config *c, loom_gpt_config *m) {
    if (c->resume[0] && c->init_from[0]) {
        return loom_fail(
            LOOM_ERR_INPUT,
            "--resume and --init-from: expected one of them (--resume continues a "
            "run with its optimizer state; --init-from starts a new one from weights)");
    }
    loom_gpt_config given;
    loom_gpt_overrides o = {.preset = c->model,
                            .arch = c->arch,
                            .layers = c->layers,
                            .heads = c->heads,
                            .d_model = c->d_model,
                            .context = c->context,
                            .vocab = c->vocab,
                            .kv_heads = c->kv_heads,
                            .ffn_dim = c->ffn_dim,
                            .rope_theta = c->rope_theta,
                            .norm_eps = c->norm_eps};
    loom_status st =
        loom_gpt_tie_parse(c->tie_embeddings, "model configuration", &o.tie_embeddings);
    if (st == LOOM_OK) st = loom_gpt_config_resolve_with(&o, "model configuration", &given);
    if (st != LOOM_OK) return st;
    const char *file = c->resume[0] ? c->resume : c->init_from;
    const char *flag = c->resume[0] ? "--resume" : "--init-from";
    if (!file[0]) {
        *m = given;
        return loom_gpt_config_check(m, "model configuration");
    }
    if ((st = loom_model_config_of(file, m)) != LOOM_OK) return st;
    if (loom_train_config_sets_model(c) && !loom_gpt_config_same(m, &given)) {
        char a[256], b[256];
        loom_gpt_config_describe(m, a, sizeof a), loom_gpt_config_describe(&given, b, sizeof b);
        return loom_fail(LOOM_ERR_INPUT,
                         "%s %s: the file's model (%s) differs from the configured one (%s); drop "
                         "the model settings to train the file's model",
                         flag, file, a, b);
    }
    return LOOM_OK;
}

loom_status loom_train_plan(const loom_train_config *c, const loom_layout_flags *layout,
                            int world_size, loom_plan *plan) {
    loom_plan_init(plan);
    loom_layout_flags defaults;
    if (!layout) {
        loom_layout_flags_defaults(&defaults);
        layout = &defaults;
    }
    loom_gpt_config model;
    loom_status st = loom_train_model_config(c, &model);
    if (st != LOOM_OK) return st;
    return loom_plan_from_flags(plan, &model, layout, world_size > 1 ? world_size : 1);
}

loom_status loom_train_config_check(const loom_train_config *c) {
#define REQUIRE(cond, field, ...)                                                                  \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            char detail_[256];                                                                     \
            snprintf(detail_, sizeof detail_, __VA_ARGS__);                                        \
            return loom_fail(LOOM_ERR_INPUT, "config: %s: %s", field, detail_);                    \
        }                                                                                          \
    } while (0)
    REQUIRE(c->steps > 0, "steps", "expected a positive integer, got %lld", (long long)c->steps);
    REQUIRE(c->seq_len > 0, "seq_len", "expected a positive integer, got %d", c->seq_len);
    /* an lr above 10 diverges at once in every model this trains: a typo, not a setting */
    REQUIRE(c->lr >= 0 && c->lr <= 10, "lr", "expected a number in [0, 10], got %g", c->lr);
    REQUIRE(c->min_lr_ratio >= 0 && c->min_lr_ratio <= 1, "min_lr_ratio",
            "expected a number in [0, 1], got %g", c->min_lr_ratio);
    REQUIRE(loom_word_ok(&lr_schedules, c->lr_schedule), "lr_schedule",
            "expected \"constant\" or \"cosine\", got \"%s\"", c->lr_schedule);
    REQUIRE(c->warmup_steps >= 0, "warmup_steps", "expected >= 0, got %lld",
            (long long)c->warmup_steps);
    REQUIRE(c->weight_decay >= 0 && c->weight_decay <= 10, "weight_decay",
            "expected a number in [0, 10], got %g", c->weight_decay);
    REQUIRE(c->beta1 >= 0 && c->beta1 < 1, "beta1", "expected a number in [0, 1), got %g",
            c->beta1);
    REQUIRE(c->beta2 >= 0 && c->beta2 < 1, "beta2", "expected a number in [0, 1), got %g",
            c->beta2);
    REQUIRE(c->eps > 0 && c->eps <= 1, "eps", "expected a number in (0, 1], got %g", c->eps);
    REQUIRE(c->grad_clip >= 0, "grad_clip", "expected >= 0 (0 disables), got %g", c->grad_clip);
    REQUIRE(c->max_bad_steps > 0, "max_bad_steps", "expected a positive integer, got %d",
            c->max_bad_steps);
    REQUIRE(c->threads >= 0, "threads", "expected >= 0 (0 = all cores), got %d", c->threads);
    REQUIRE(c->save_every >= 0, "save_every", "expected >= 0 (0 = at the end only), got %lld",
            (long long)c->save_every);
    REQUIRE(c->eval_every >= 0, "eval_every", "expected >= 0 (0 disables), got %lld",
            (long long)c->eval_every);
    REQUIRE(c->log_every > 0, "log_every", "expected a positive integer, got %lld",
            (long long)c->log_every);
    REQUIRE(c->eval_batches > 0, "eval_batches", "expected a positive integer, got %d",
            c->eval_batches);
    REQUIRE(c->data[0] != '\0', "data", "expected a token shard path or glob");
    REQUIRE(c->bucket_mb >= 0, "bucket_mb",
            "expected a positive number of MB (or 0: the default for the run's dp), got %g",
            c->bucket_mb);
    /* Below a second a healthy job is ended: the liveness pings start at a quarter of the
     * timeout and are at least 0.05 s apart, and any computation between two messages (tens of
     * ms for the tiny model, more on a loaded machine) counts as silence. */
    REQUIRE(c->comm_timeout == 0 || c->comm_timeout >= 1, "comm_timeout",
            "expected 0 (disabled) or at least 1 second, got %g", c->comm_timeout);
    REQUIRE(c->out[0] != '\0', "out", "expected an output folder");
    REQUIRE(c->keep_last >= 0, "keep_last", "expected >= 0 (0 keeps all), got %d", c->keep_last);
    REQUIRE(c->exit_after_minutes >= 0, "exit_after_minutes",
            "expected minutes >= 0 (0 = no limit), got %g", c->exit_after_minutes);
    REQUIRE(!strcmp(c->progress, "auto") || !strcmp(c->progress, "on") ||
                !strcmp(c->progress, "off"),
            "progress", "expected \"auto\", \"on\" or \"off\", got \"%s\"", c->progress);
#undef REQUIRE
    return LOOM_OK;
}

double loom_lr_at(const loom_train_config *c, int64_t step) {
    if (c->warmup_steps > 0 && step < c->warmup_steps) {
        return c->lr * (double)(step + 1) / (double)c->warmup_steps;
    }
    if (loom_word_index(&lr_schedules, c->lr_schedule) != LR_COSINE) return c->lr;
    int64_t decay_steps = c->steps - c->warmup_steps;
    if (decay_steps <= 1) return c->lr;
    double progress = (double)(step - c->warmup_steps) / (double)(decay_steps - 1);
    if (progress > 1.0) progress = 1.0;
    double min_lr = c->lr * c->min_lr_ratio;
    return min_lr + 0.5 * (c->lr - min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
}

/* A library caller's shortcut: the plan of the layout flags, then loom_train. */
loom_status loom_train_run_ex(const loom_train_config *cfg, const loom_layout_flags *layout,
                              loom_comm *world, loom_train_result *result) {
    loom_plan plan;
    loom_status st = loom_train_plan(cfg, layout, world ? loom_comm_size(world) : 1, &plan);
    if (st == LOOM_OK) st = loom_train(cfg, &plan, world, result);
    loom_plan_free(&plan);
    return st;
}

loom_status loom_train_run(const loom_train_config *cfg, const loom_layout_flags *layout) {
    return loom_train_run_ex(cfg, layout, NULL, NULL);
}
