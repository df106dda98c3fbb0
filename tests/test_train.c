/*
 * test_train.c — the training loop end to end on tiny models: over-fitting one batch,
 * gradient accumulation equals one large batch, resume is bit-exact, NaN/Inf steps are
 * skipped and counted (and stop the run when too many come in a row), the LR schedules,
 * and the Hugging Face safetensors and llm.c checkpoint layouts.
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "loom/io.h"
#include "loom/data.h"
#include "loom/io.h"
#include "loom/train.h"

#include <stdlib.h>
#include <string.h>

static const char *tmp;

static void write_tokens(const char *name, size_t count, int vocab, uint64_t seed) {
    uint16_t *tokens = malloc(count * sizeof *tokens);
    /* a learnable stream: mostly a repeating pattern with some noise */
    for (size_t i = 0; i < count; i++) {
        tokens[i] =
            (uint16_t)(loom_rng_uniform(seed, 0, i) < 0.8 ? (i * 7 % 23) % vocab
                                                          : loom_rng_u64(seed, 1, i) % vocab);
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    CHECK(loom_shard_write(path, tokens, count) == LOOM_OK, "write %s: %s", name,
          loom_last_error());
    free(tokens);
}

/* The layout of the runs below: one process, micro batch 2, global batch 4. */
static loom_layout_flags tiny_layout(void) {
    loom_layout_flags l;
    loom_layout_flags_defaults(&l);
    l.micro_batch_size = 2;
    l.global_batch_size = 4;
    return l;
}

static loom_train_config tiny_config(const char *out) {
    loom_train_config c;
    loom_train_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "tiny");
    snprintf(c.data, sizeof c.data, "%s/train.bin", tmp);
    snprintf(c.val_data, sizeof c.val_data, "%s/val.bin", tmp);
    snprintf(c.out, sizeof c.out, "%s/%s", tmp, out);
    c.steps = 6;
    c.seq_len = 16;
    c.lr = 3e-3;
    c.warmup_steps = 2;
    c.eval_every = 3;
    c.eval_batches = 2;
    c.log_every = 100;
    c.threads = 2;
    return c;
}

static float *load_params(const char *run, size_t *count) {
    loom_gpt *m;
    if (loom_model_load(run, loom_backend_cpu(), &m) != LOOM_OK) {
        CHECK(0, "load %s: %s", run, loom_last_error());
        return NULL;
    }
    float *p = malloc(m->num_params * sizeof(float));
    memcpy(p, m->params_memory, m->num_params * sizeof(float));
    *count = m->num_params;
    loom_gpt_free(m);
    return p;
}

static int files_equal(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    if (loom_read_file(a, &x, &nx) || loom_read_file(b, &y, &ny)) return 0;
    int eq = nx == ny && memcmp(x, y, nx) == 0;
    free(x), free(y);
    return eq;
}

static void test_overfit(void) {
    /* one window, seen twice per batch, every step */
    write_tokens("one.bin", 17, 257, 3);
    loom_train_config c = tiny_config("overfit");
    snprintf(c.data, sizeof c.data, "%s/one.bin", tmp);
    c.val_data[0] = '\0';
    c.steps = 300, c.lr = 1e-2, c.warmup_steps = 0;
    c.weight_decay = 0.0;
    snprintf(c.lr_schedule, sizeof c.lr_schedule, "constant");
    loom_layout_flags l = tiny_layout();
    l.global_batch_size = 2;
    loom_train_result r;
    CHECK(loom_train_run_ex(&c, &l, NULL, &r) == LOOM_OK, "overfit run: %s", loom_last_error());
    CHECK(r.final_loss < 0.1, "over-fitting one batch: final loss %.4f, expected < 0.1",
          r.final_loss);
}

static void test_accumulation(void) {
    /* global batch 4 as 1x4, 2x2 and 4x1 micro-batches: the same training */
    loom_train_result r[3];
    float *params[3];
    size_t n = 0;
    int micro[3] = {4, 2, 1};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "accum%d", micro[i]);
        loom_train_config c = tiny_config(name);
        loom_layout_flags l = tiny_layout();
        l.micro_batch_size = micro[i];
        c.steps = 4;
        CHECK(loom_train_run_ex(&c, &l, NULL, &r[i]) == LOOM_OK, "accumulation run: %s",
              loom_last_error());
        params[i] = load_params(c.out, &n);
    }
    for (int i = 1; i < 3; i++) {
        CHECK_CLOSE(r[i].final_loss, r[0].final_loss, 1e-5, 0.0, "loss with accumulation");
        CHECK_CLOSE(r[i].final_val_loss, r[0].final_val_loss, 1e-5, 0.0, "val loss, accumulation");
        double maxdiff = 0.0;
        for (size_t k = 0; params[0] && params[i] && k < n; k++) {
            double d = fabs(params[i][k] - params[0][k]);
            maxdiff = d > maxdiff ? d : maxdiff;
        }
        CHECK(maxdiff < 1e-5, "params with %d micro-batches differ by %g", micro[i], maxdiff);
    }
    for (int i = 0; i < 3; i++) free(params[i]);
}

static void test_resume(void) {
    loom_train_config a = tiny_config("straight");
    a.save_every = 3;
    loom_layout_flags l = tiny_layout();
    CHECK(loom_train_run_ex(&a, &l, NULL, NULL) == LOOM_OK, "straight run: %s", loom_last_error());

    /* continue from the step-3 checkpoint, in a fresh folder, as a new process would */
    loom_train_config b = tiny_config("resumed");
    snprintf(b.resume, sizeof b.resume, "%.900s/checkpoints/step_00000003", a.out);
    CHECK(loom_train_run_ex(&b, &l, NULL, NULL) == LOOM_OK, "resumed run: %s", loom_last_error());

    char fa[1400], fb[1400];
    const char *files[] = {"model.safetensors", "state.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(fa, sizeof fa, "%s/checkpoints/step_00000006/%s", a.out, files[i]);
        snprintf(fb, sizeof fb, "%s/checkpoints/step_00000006/%s", b.out, files[i]);
        CHECK(files_equal(fa, fb), "resumed %s is bit-identical to the uninterrupted one",
              files[i]);
    }
    /* and the per-step losses after the resume point are identical */
    snprintf(fa, sizeof fa, "%s/metrics.jsonl", a.out);
    snprintf(fb, sizeof fb, "%s/metrics.jsonl", b.out);
    char *ta, *tb;
    size_t na, nb;
    if (loom_read_file(fa, &ta, &na) == LOOM_OK && loom_read_file(fb, &tb, &nb) == LOOM_OK) {
        for (int step = 4; step <= 6; step++) {
            char key[64];
            snprintf(key, sizeof key, "{\"step\": %d, \"loss\": ", step);
            const char *pa = strstr(ta, key), *pb = strstr(tb, key);
            CHECK(pa && pb && strtod(pa + strlen(key), NULL) == strtod(pb + strlen(key), NULL),
                  "step %d loss identical after resume", step);
        }
        free(ta), free(tb);
    }
}

static void test_nan_skip(void) {
    loom_train_config c = tiny_config("nan");
    c.val_data[0] = '\0';
    setenv("LOOM_DEBUG_NAN_STEPS", "2", 1);
    loom_layout_flags l = tiny_layout();
    loom_train_result r;
    CHECK(loom_train_run_ex(&c, &l, NULL, &r) == LOOM_OK, "one bad step is skipped: %s",
          loom_last_error());
    CHECK(r.skipped_steps == 1 && r.steps_done == 6, "skipped %lld of %lld",
          (long long)r.skipped_steps, (long long)r.steps_done);
    CHECK(isfinite(r.final_loss), "training went on after the skipped step");

    c = tiny_config("nan_stop");
    c.val_data[0] = '\0';
    c.max_bad_steps = 3;
    setenv("LOOM_DEBUG_NAN_STEPS", "2,3,4", 1);
    loom_status st = loom_train_run_ex(&c, &l, NULL, &r);
    CHECK(st == LOOM_ERR_NUMERIC && strstr(loom_last_error(), "in a row"),
          "three bad steps in a row stop the run: %d %s", st, loom_last_error());
    CHECK(r.steps_done == 4, "stopped at step 4, got %lld", (long long)r.steps_done);
    unsetenv("LOOM_DEBUG_NAN_STEPS");
}

/* loom_train trains the plan's model: a config asking for another is refused by name. */
static void test_model_mismatch(void) {
    loom_train_config c = tiny_config("mismatch");
    loom_layout_flags l = tiny_layout();
    loom_plan plan;
    CHECK(loom_train_plan(&c, &l, 1, &plan) == LOOM_OK, "tiny plan: %s", loom_last_error());
    snprintf(c.model, sizeof c.model, "small");
    loom_status st = loom_train(&c, &plan, NULL, NULL);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "config: model:") &&
              strstr(loom_last_error(), "differs from the plan's"),
          "a config for another model than the plan's is refused: %d %s", st, loom_last_error());
    loom_plan_free(&plan);
}

static void test_lr_schedule(void) {
    loom_train_config c;
    loom_train_config_defaults(&c);
    c.lr = 1.0, c.steps = 110, c.warmup_steps = 10, c.min_lr_ratio = 0.1;
    CHECK_CLOSE(loom_lr_at(&c, 0), 0.1, 1e-12, 0, "warm-up starts at lr/warmup");
    CHECK_CLOSE(loom_lr_at(&c, 9), 1.0, 1e-12, 0, "warm-up ends at lr");
    CHECK_CLOSE(loom_lr_at(&c, 10), 1.0, 1e-12, 0, "cosine starts at lr");
    CHECK_CLOSE(loom_lr_at(&c, 109), 0.1, 1e-12, 0, "cosine ends at min lr");
    double mid = 0.1 + 0.45 * (1 + cos(3.14159265358979323846 * 50.0 / 99.0));
    CHECK_CLOSE(loom_lr_at(&c, 60), mid, 1e-12, 0, "cosine midway");
    snprintf(c.lr_schedule, sizeof c.lr_schedule, "constant");
    CHECK_CLOSE(loom_lr_at(&c, 60), 1.0, 1e-12, 0, "constant");
}

static void test_hf_layout(void) {
    loom_gpt_config cfg;
    loom_gpt_preset("tiny", &cfg);
    loom_gpt *m;
    loom_gpt_create(&m, &cfg, loom_backend_cpu());
    cfg = m->config;
    loom_gpt_init_weights(m, 5);
    for (size_t i = 0; i < m->num_params; i++) m->params_memory[i] += 1e-3f * (float)(i % 97);
    /* padded vocabulary rows are not stored, and stay zero */
    memset(m->params.wte + (size_t)cfg.vocab_size * cfg.channels, 0,
           (size_t)(cfg.padded_vocab_size - cfg.vocab_size) * cfg.channels * sizeof(float));
    char path[1200];
    snprintf(path, sizeof path, "%s/hf.safetensors", tmp);
    CHECK(loom_gpt_save_safetensors(path, m) == LOOM_OK, "save: %s", loom_last_error());

    /* read the file with the generic reader and check HF's names, shapes and orientation */
    loom_safetensors *st;
    CHECK(loom_safetensors_open(&st, path) == LOOM_OK, "open: %s", loom_last_error());
    int C = cfg.channels, V = cfg.vocab_size;
    const loom_st_entry *e = loom_safetensors_find(st, "wte.weight");
    CHECK(e && e->ndim == 2 && e->shape[0] == V && e->shape[1] == C, "wte.weight is (V, C)");
    e = loom_safetensors_find(st, "h.1.attn.c_attn.weight");
    CHECK(e && e->shape[0] == C && e->shape[1] == 3 * C, "c_attn.weight is (C, 3C)");
    CHECK(loom_safetensors_find(st, "lm_head.weight") == NULL, "tied head not stored");
    CHECK(loom_safetensors_count(st) == 2 + 12 * cfg.num_layers + 2, "tensor count");
    float *w = malloc((size_t)C * 3 * C * sizeof(float));
    int64_t shape[2] = {C, 3 * C};
    CHECK(loom_safetensors_read_f32(st, "h.1.attn.c_attn.weight", 2, shape, 0, w) == LOOM_OK,
          "read c_attn");
    /* stored[i][j] (in i, out j) == loom's qkvw[layer 1][j][i] */
    const float *q1 = m->params.qkvw + m->layer_stride; /* layer 1 */
    int ok = 1;
    for (int i = 0; i < C; i++)
        for (int j = 0; j < 3 * C; j++) ok &= w[(size_t)i * 3 * C + j] == q1[(size_t)j * C + i];
    CHECK(ok, "c_attn.weight is stored as Conv1D (in, out)");
    free(w);
    loom_safetensors_close(st);

    /* and it loads back into identical parameters */
    loom_gpt *back;
    CHECK(loom_model_load(path, loom_backend_cpu(), &back) == LOOM_OK, "load: %s",
          loom_last_error());
    CHECK(back && memcmp(back->params_memory, m->params_memory, m->num_params * 4) == 0,
          "safetensors round trip is exact");
    loom_gpt_free(back);

    /* llm.c checkpoint: same tensor order as loom's flat buffer */
    loom_llmc_header h = {cfg.max_seq_len, V, cfg.num_layers,
                          cfg.num_heads,   C, cfg.padded_vocab_size};
    snprintf(path, sizeof path, "%s/model.bin", tmp);
    /* llm.c's file keeps each tensor whole, in order: build that by hand */
    float *llmc = malloc(m->num_params * sizeof(float));
    size_t at = 0;
    for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++)
        for (int64_t i = 0; i < m->info[k].numel; i++)
            llmc[at++] = m->params_memory[loom_gpt_element_offset(&m->info[k], i)];
    CHECK(loom_llmc_write(path, &h, llmc, m->num_params) == LOOM_OK, "llm.c write");
    CHECK(loom_model_load(path, loom_backend_cpu(), &back) == LOOM_OK, "llm.c load: %s",
          loom_last_error());
    size_t qkvw_at = (size_t)cfg.padded_vocab_size * C + (size_t)cfg.max_seq_len * C +
                     (size_t)2 * cfg.num_layers * C;
    CHECK(back && back->params.qkvw[5] == llmc[qkvw_at + 5], "llm.c qkvw lands in qkvw");
    /* layer 1's first fcw element: after wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
     * ln2w, ln2b, then layer 0's fcw */
    size_t L = (size_t)cfg.num_layers, Cs = (size_t)C;
    size_t fcw1 = (size_t)cfg.padded_vocab_size * Cs + (size_t)cfg.max_seq_len * Cs + 2 * L * Cs +
                  L * 3 * Cs * Cs + L * 3 * Cs + L * Cs * Cs + L * Cs + 2 * L * Cs + 4 * Cs * Cs;
    CHECK(back && back->params.fcw[back->layer_stride] == llmc[fcw1], "llm.c fcw layer 1");
    free(llmc);
    CHECK(back && memcmp(back->params_memory, m->params_memory, m->num_params * 4) == 0,
          "llm.c import is exact");
    loom_gpt_free(back);
    loom_gpt_free(m);
}

int main(void) {
    tmp = check_tmpdir();
    loom_log_set_level(LOOM_LOG_WARN);
    write_tokens("train.bin", 4000, 257, 1);
    write_tokens("val.bin", 600, 257, 2);
    test_lr_schedule();
    test_model_mismatch();
    test_hf_layout();
    test_overfit();
    test_accumulation();
    test_resume();
    test_nan_skip();
    return check_finish();
}
