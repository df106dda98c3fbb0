/*
 * generate.c — using a trained model: text generation (temperature, top-k) and the mean
 * loss over a token file.
 *
 * Generation recomputes the whole window for every new token (no KV cache): simple, and
 * fast enough for the small models loom trains on a CPU. Text goes through a loom_tokenizer
 * (bytes, or GPT-2's BPE).
 */
#include "loom/data.h"
#include "loom/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int sample_token(const float *logits, int V, const loom_sample_opts *opts, loom_rng *rng,
                        float *work) {
    if (opts->temperature <= 0.0) {
        int best = 0;
        for (int j = 1; j < V; j++) best = logits[j] > logits[best] ? j : best;
        return best;
    }
    /* top-k: find the k-th largest logit by partial selection on a copy */
    float cutoff = -INFINITY;
    if (opts->top_k > 0 && opts->top_k < V) {
        memcpy(work, logits, (size_t)V * sizeof(float));
        for (int i = 0; i < opts->top_k; i++) {
            int best = i;
            for (int j = i + 1; j < V; j++) best = work[j] > work[best] ? j : best;
            float tmp = work[i];
            work[i] = work[best];
            work[best] = tmp;
        }
        cutoff = work[opts->top_k - 1];
    }
    float maxv = -INFINITY;
    for (int j = 0; j < V; j++) maxv = logits[j] > maxv ? logits[j] : maxv;
    double sum = 0.0;
    for (int j = 0; j < V; j++) {
        double p = logits[j] >= cutoff ? exp((logits[j] - maxv) / opts->temperature) : 0.0;
        work[j] = (float)p;
        sum += p;
    }
    double r = loom_rng_next_uniform(rng) * sum, acc = 0.0;
    for (int j = 0; j < V; j++) {
        acc += work[j];
        if (r < acc) return j;
    }
    return V - 1;
}

/* A token as the bytes it decodes to; an id the tokenizer has no token for (a model's vocabulary
 * can be larger than its tokenizer's) as <id>. */
static void write_token(FILE *out, const loom_tokenizer *tok, int token) {
    const char *bytes;
    size_t n = loom_tokenizer_token_bytes(tok, token, &bytes);
    if (n > 0) {
        fwrite(bytes, 1, n, out);
    } else {
        fprintf(out, "<%d>", token);
    }
}

/* The prompt's tokens into tokens (room for plen + 1): after the document-start token when the
 * tokenizer has its own (Llama 3's <|begin_of_text|>, as its training documents start); an empty
 * prompt is that token, or the EOT token. */
static loom_status encode_prompt(const loom_tokenizer *tok, const char *prompt, size_t plen,
                                 int vocab, int32_t *tokens, size_t *n) {
    *n = 0;
    int start = loom_tokenizer_document_start(tok), eot = loom_tokenizer_eot(tok);
    if (plen == 0 || (start != eot && start >= 0 && start < vocab))
        tokens[(*n)++] = start >= 0 && start < vocab ? start : 0;
    if (plen == 0) return LOOM_OK;
    uint32_t *encoded = loom_calloc(plen, sizeof *encoded, "prompt");
    if (!encoded) return LOOM_ERR_NOMEM;
    loom_token_encoder *enc = NULL;
    size_t count = 0;
    loom_status st = loom_token_encoder_create(&enc, tok);
    if (st == LOOM_OK) st = loom_token_encoder_run_wide(enc, prompt, plen, 1, encoded, &count);
    for (size_t i = 0; st == LOOM_OK && i < count; i++) {
        if (encoded[i] >= (uint32_t)vocab) {
            st = loom_fail(LOOM_ERR_INPUT, "prompt: token %u is outside the model's vocab %d",
                           (unsigned)encoded[i], vocab);
        }
        tokens[(*n)++] = (int32_t)encoded[i];
    }
    loom_token_encoder_free(enc);
    free(encoded);
    return st;
}

loom_status loom_sample_text(loom_gpt *model, const loom_tokenizer *tok, const char *prompt,
                             const loom_sample_opts *opts, FILE *out) {
    const loom_gpt_config *c = &model->config;
    if (opts->tokens < 0) return loom_fail(LOOM_ERR_INPUT, "--tokens: expected >= 0");
    if (opts->temperature < 0 || !isfinite(opts->temperature)) {
        return loom_fail(LOOM_ERR_INPUT, "--temperature: expected a number >= 0, got %g",
                         opts->temperature);
    }
    if (opts->top_k < 0) return loom_fail(LOOM_ERR_INPUT, "--top-k: expected >= 0");
    loom_tokenizer *bytes = NULL;
    if (!tok) {
        loom_status st = loom_tokenizer_open(&bytes, "bytes");
        if (st != LOOM_OK) return st;
        tok = bytes;
    }
    size_t plen = strlen(prompt);
    size_t total = plen + (size_t)opts->tokens + 1;
    int32_t *tokens = loom_calloc(total, sizeof(int32_t), "tokens");
    float *work = loom_calloc((size_t)c->vocab_size, sizeof(float), "sampling buffer");
    loom_status st = tokens && work ? LOOM_OK : LOOM_ERR_NOMEM;
    if (st == LOOM_OK) st = loom_gpt_reserve(model, 1, c->max_seq_len);
    size_t n = 0;
    if (st == LOOM_OK) st = encode_prompt(tok, prompt, plen, c->vocab_size, tokens, &n);
    if (st == LOOM_OK) fwrite(prompt, 1, plen, out);
    loom_rng rng;
    loom_rng_seed(&rng, opts->seed);
    for (int i = 0; st == LOOM_OK && i < opts->tokens; i++) {
        int T = n < (size_t)c->max_seq_len ? (int)n : c->max_seq_len;
        loom_gpt_forward(model, tokens + n - (size_t)T, NULL, 1, T);
        const float *logits = model->acts.probs + (size_t)(T - 1) * (size_t)c->padded_vocab_size;
        int next = sample_token(logits, c->vocab_size, opts, &rng, work);
        tokens[n++] = next;
        write_token(out, tok, next);
        fflush(out);
    }
    if (st == LOOM_OK) fputc('\n', out);
    free(tokens), free(work);
    loom_tokenizer_free(bytes);
    return st;
}

loom_status loom_eval_loss(loom_gpt *model, const char *data, int seq_len, int batch,
                           int64_t max_windows, double *mean_loss, int64_t *tokens) {
    if (seq_len <= 0 || seq_len > model->config.max_seq_len) {
        return loom_fail(LOOM_ERR_INPUT, "--seq-len: expected 1..%d (the model's context), got %d",
                         model->config.max_seq_len, seq_len);
    }
    if (batch <= 0) return loom_fail(LOOM_ERR_INPUT, "--batch: expected a positive integer");
    loom_dataset *ds = NULL;
    loom_loader *ld = NULL;
    loom_status st = loom_dataset_open(&ds, data, model->config.vocab_size);
    if (st == LOOM_OK) st = loom_loader_create(&ld, ds, seq_len, 0, 0);
    if (st == LOOM_OK && seq_len >= 1 && seq_len <= model->config.max_seq_len && batch >= 1) {
        loom_gpt_stage_spec spec = {1, 0, model->config.num_layers, 1, 1, batch, seq_len, 1, 0,
                                    0, 0};
        loom_gpt_stage_cost cost;
        st = loom_gpt_cost_stage(&model->config, &spec, &cost);
        char what[128];
        snprintf(what, sizeof what, "--batch %d x --seq-len %d", batch, seq_len);
        if (st == LOOM_OK) {
            st = loom_memory_check(cost.act_slot_bytes + cost.grad_scratch_bytes, 1, what,
                                   "lower --batch");
        }
    }
    if (st == LOOM_OK) st = loom_gpt_reserve(model, batch, seq_len);
    int32_t *inputs = NULL, *targets = NULL;
    if (st == LOOM_OK) {
        inputs = loom_calloc((size_t)batch * seq_len, sizeof(int32_t), "inputs");
        targets = loom_calloc((size_t)batch * seq_len, sizeof(int32_t), "targets");
        if (!inputs || !targets) st = LOOM_ERR_NOMEM;
    }
    if (st == LOOM_OK) {
        int64_t windows = (int64_t)loom_loader_num_windows(ld);
        if (max_windows > 0 && max_windows < windows) windows = max_windows;
        double sum = 0.0;
        for (int64_t done = 0; done < windows && st == LOOM_OK;) {
            int b = windows - done < batch ? (int)(windows - done) : batch;
            if ((st = loom_loader_next(ld, b, inputs, targets)) != LOOM_OK) break;
            sum += (double)loom_gpt_forward(model, inputs, targets, b, seq_len) * b;
            done += b;
        }
        *mean_loss = sum / (double)windows;
        *tokens = windows * seq_len;
    }
    free(inputs), free(targets);
    loom_loader_free(ld);
    loom_dataset_free(ds);
    return st;
}
