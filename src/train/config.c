/*
 * config.c — the run configuration: defaults, checks, the model it describes, and the
 * learning-rate schedule.
 */
#include "loom/train.h"

#include <math.h>
#include <string.h>

void loom_train_config_defaults(loom_train_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->model, sizeof c->model, "small");
    snprintf(c->data, sizeof c->data, "data/train_*.bin");
    c->steps = 200;
    c->micro_batch_size = 8;
    c->seq_len = 128;
    c->global_batch_size = 8;
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
    c->eval_batches = 16;
    c->data_parallel = c->tensor_parallel = c->pipeline_parallel = 1;
    c->bucket_mb = 25.0;
    c->zero1 = 0;
    c->comm_timeout = 60.0;
    snprintf(c->schedule, sizeof c->schedule, "1f1b");
}

loom_status loom_train_model_config(const loom_train_config *c, loom_gpt_config *m) {
    loom_status st = loom_gpt_preset(c->model, m);
    if (st != LOOM_OK) return st;
    if (c->layers) m->num_layers = c->layers;
    if (c->heads) m->num_heads = c->heads;
    if (c->d_model) m->channels = c->d_model;
    if (c->context) m->max_seq_len = c->context;
    if (c->vocab) m->vocab_size = c->vocab;
    m->padded_vocab_size = 0;
    return loom_gpt_config_check(m, "model configuration");
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
    REQUIRE(c->micro_batch_size > 0, "micro_batch_size", "expected a positive integer, got %d",
            c->micro_batch_size);
    REQUIRE(c->seq_len > 0, "seq_len", "expected a positive integer, got %d", c->seq_len);
    REQUIRE(c->global_batch_size > 0, "global_batch_size", "expected a positive integer, got %d",
            c->global_batch_size);
    REQUIRE(c->global_batch_size % c->micro_batch_size == 0, "global_batch_size",
            "expected a multiple of micro_batch_size %d, got %d", c->micro_batch_size,
            c->global_batch_size);
    REQUIRE(c->lr >= 0 && isfinite(c->lr), "lr", "expected a non-negative number, got %g", c->lr);
    REQUIRE(c->min_lr_ratio >= 0 && c->min_lr_ratio <= 1, "min_lr_ratio",
            "expected a number in [0, 1], got %g", c->min_lr_ratio);
    REQUIRE(!strcmp(c->lr_schedule, "constant") || !strcmp(c->lr_schedule, "cosine"), "lr_schedule",
            "expected \"constant\" or \"cosine\", got \"%s\"", c->lr_schedule);
    REQUIRE(c->warmup_steps >= 0, "warmup_steps", "expected >= 0, got %lld",
            (long long)c->warmup_steps);
    REQUIRE(c->weight_decay >= 0, "weight_decay", "expected >= 0, got %g", c->weight_decay);
    REQUIRE(c->beta1 >= 0 && c->beta1 < 1, "beta1", "expected a number in [0, 1), got %g",
            c->beta1);
    REQUIRE(c->beta2 >= 0 && c->beta2 < 1, "beta2", "expected a number in [0, 1), got %g",
            c->beta2);
    REQUIRE(c->eps > 0, "eps", "expected a positive number, got %g", c->eps);
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
    REQUIRE(c->data_parallel > 0, "data_parallel", "expected a positive integer, got %d",
            c->data_parallel);
    REQUIRE(c->tensor_parallel > 0, "tensor_parallel", "expected a positive integer, got %d",
            c->tensor_parallel);
    REQUIRE(c->pipeline_parallel > 0, "pipeline_parallel", "expected a positive integer, got %d",
            c->pipeline_parallel);
    REQUIRE(c->global_batch_size % (c->micro_batch_size * c->data_parallel) == 0,
            "global_batch_size",
            "expected a multiple of micro_batch_size x data_parallel = %d x %d, got %d",
            c->micro_batch_size, c->data_parallel, c->global_batch_size);
    REQUIRE(!strcmp(c->schedule, "1f1b") || !strcmp(c->schedule, "gpipe"), "schedule",
            "expected \"1f1b\" or \"gpipe\", got \"%s\"", c->schedule);
    REQUIRE(c->bucket_mb > 0, "bucket_mb", "expected a positive number of MB, got %g",
            c->bucket_mb);
    REQUIRE(c->comm_timeout >= 0, "comm_timeout", "expected seconds >= 0 (0 disables), got %g",
            c->comm_timeout);
    REQUIRE(c->out[0] != '\0', "out", "expected an output folder");
#undef REQUIRE
    return LOOM_OK;
}

double loom_lr_at(const loom_train_config *c, int64_t step) {
    if (c->warmup_steps > 0 && step < c->warmup_steps) {
        return c->lr * (double)(step + 1) / (double)c->warmup_steps;
    }
    if (strcmp(c->lr_schedule, "cosine") != 0) return c->lr;
    int64_t decay_steps = c->steps - c->warmup_steps;
    if (decay_steps <= 1) return c->lr;
    double progress = (double)(step - c->warmup_steps) / (double)(decay_steps - 1);
    if (progress > 1.0) progress = 1.0;
    double min_lr = c->lr * c->min_lr_ratio;
    return min_lr + 0.5 * (c->lr - min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
}
