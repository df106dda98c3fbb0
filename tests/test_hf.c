/*
 * test_hf.c — checkpoint folders as Hugging Face model folders, for every Llama preset loom
 * ships: the config.json a checkpoint gets equals the published configuration's fields (typed in
 * below from each model's config.json on the Hugging Face hub), and the checkpoint's tensor
 * names and shapes are those a LlamaForCausalLM of that configuration has, computed here from the
 * published numbers (nn.Linear weights are (out, in); q_proj heads x head_dim rows, k_proj and
 * v_proj kv heads x head_dim, gate/up intermediate rows, down_proj intermediate columns; the
 * embedding and an untied lm_head (vocab, hidden)). No model is allocated: the 405B's names come
 * from its configuration alone.
 */
#include "check.h"
#include "loom/io.h"
#include "loom/model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *preset, *source;
    int hidden, intermediate, heads, layers, kv_heads, context, vocab, tied;
    double rope_theta, rms_norm_eps;
    double scaling[4]; /* factor, low, high, original; factor 0: "rope_scaling": null */
} published;

/* the published config.json fields of each model a preset is named after: hidden, intermediate,
 * heads, layers, kv heads, max_position_embeddings, vocab, tied, rope_theta, rms_norm_eps, and
 * rope_scaling's factor, low and high frequency factors and original context (factor 0: null) */
#define MODEL(preset, source, H, F, NH, L, KV, ctx, V, tied, theta, eps, f, lo, hi, orig)          \
    {                                                                                              \
        preset, source, H, F, NH, L, KV, ctx, V, tied, theta, eps, {                               \
            f, lo, hi, orig                                                                        \
        }                                                                                          \
    }
static const published models[] = {
    MODEL("smollm-135m", "HuggingFaceTB/SmolLM-135M", 576, 1536, 9, 30, 3, 2048, 49152, 1, 10000.0,
          1e-5, 0, 0, 0, 0),
    MODEL("llama3-8b", "meta-llama/Meta-Llama-3-8B", 4096, 14336, 32, 32, 8, 8192, 128256, 0,
          500000.0, 1e-5, 0, 0, 0, 0),
    MODEL("llama3-70b", "meta-llama/Meta-Llama-3-70B", 8192, 28672, 64, 80, 8, 8192, 128256, 0,
          500000.0, 1e-5, 0, 0, 0, 0),
    MODEL("llama3-405b", "meta-llama/Llama-3.1-405B", 16384, 53248, 128, 126, 8, 131072, 128256, 0,
          500000.0, 1e-5, 8.0, 1.0, 4.0, 8192.0),
};
#undef MODEL

static void check_int(const json_t *root, const char *key, int want, const char *who) {
    const json_t *v = json_object_get(root, key);
    CHECK(json_is_integer(v) && json_integer_value(v) == want, "%s: %s: expected %d", who, key,
          want);
}

static void check_number(const json_t *root, const char *key, double want, const char *who) {
    const json_t *v = json_object_get(root, key);
    CHECK(json_is_number(v) && json_number_value(v) == want, "%s: %s: expected %g, got %g", who,
          key, want, json_is_number(v) ? json_number_value(v) : -1.0);
}

static void check_config(const published *p, const loom_gpt_config *c) {
    char *text = loom_hf_config_json(c);
    json_error_t err;
    json_t *root = text ? json_loads(text, 0, &err) : NULL;
    CHECK(json_is_object(root), "%s: config.json is not a JSON object", p->preset);
    free(text);
    if (!root) return;
    const char *type = json_string_value(json_object_get(root, "model_type"));
    const json_t *arch = json_array_get(json_object_get(root, "architectures"), 0);
    CHECK(type && !strcmp(type, "llama"), "%s: model_type", p->preset);
    CHECK(json_is_string(arch) && !strcmp(json_string_value(arch), "LlamaForCausalLM"),
          "%s: architectures", p->preset);
    check_int(root, "hidden_size", p->hidden, p->preset);
    check_int(root, "intermediate_size", p->intermediate, p->preset);
    check_int(root, "num_attention_heads", p->heads, p->preset);
    check_int(root, "num_hidden_layers", p->layers, p->preset);
    check_int(root, "num_key_value_heads", p->kv_heads, p->preset);
    check_int(root, "max_position_embeddings", p->context, p->preset);
    check_int(root, "vocab_size", p->vocab, p->preset);
    check_number(root, "rope_theta", p->rope_theta, p->preset);
    check_number(root, "rms_norm_eps", p->rms_norm_eps, p->preset);
    CHECK(json_is_boolean(json_object_get(root, "tie_word_embeddings")) &&
              json_is_true(json_object_get(root, "tie_word_embeddings")) == p->tied,
          "%s: tie_word_embeddings", p->preset);
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    CHECK(act && !strcmp(act, "silu"), "%s: hidden_act", p->preset);
    const json_t *scaling = json_object_get(root, "rope_scaling");
    if (p->scaling[0] == 0) {
        CHECK(json_is_null(scaling), "%s: rope_scaling: expected null", p->preset);
    } else {
        const char *rt = json_string_value(json_object_get(scaling, "rope_type"));
        CHECK(rt && !strcmp(rt, "llama3"), "%s: rope_scaling.rope_type", p->preset);
        check_number(scaling, "factor", p->scaling[0], p->preset);
        check_number(scaling, "low_freq_factor", p->scaling[1], p->preset);
        check_number(scaling, "high_freq_factor", p->scaling[2], p->preset);
        check_int(scaling, "original_max_position_embeddings", (int)p->scaling[3], p->preset);
    }
    json_decref(root);
}

/* The names and shapes a LlamaForCausalLM of the published configuration holds, in loom's file
 * order, against loom's list. */
static void check_tensors(const published *p, const loom_gpt_config *c) {
    loom_hf_tensor_shape *got = NULL;
    int n = 0;
    loom_status st = loom_hf_tensor_shapes(c, &got, &n);
    CHECK(st == LOOM_OK, "%s: tensor shapes: %s", p->preset, loom_last_error());
    if (st != LOOM_OK) return;
    int64_t hd = p->hidden / p->heads, H = p->hidden, F = p->intermediate, V = p->vocab;
    int want_n = 1 + 9 * p->layers + 1 + (p->tied ? 0 : 1), bad = 0, i = 0;
    CHECK(n == want_n, "%s: %d tensors, expected %d", p->preset, n, want_n);
    char name[64];
#define EXPECT(nm, nd, s0, s1)                                                                     \
    do {                                                                                           \
        if (i < n && !bad &&                                                                       \
            (strcmp(got[i].name, nm) || got[i].ndim != nd || got[i].shape[0] != (s0) ||            \
             (nd == 2 && got[i].shape[1] != (s1)))) {                                              \
            CHECK(0, "%s: tensor %d is %s (%lld, %lld), expected %s (%lld, %lld)", p->preset, i,   \
                  got[i].name, (long long)got[i].shape[0], (long long)got[i].shape[1], nm,         \
                  (long long)(s0), (long long)(s1));                                               \
            bad = 1;                                                                               \
        }                                                                                          \
        i++;                                                                                       \
    } while (0)
    EXPECT("model.embed_tokens.weight", 2, V, H);
    for (int l = 0; l < p->layers; l++) {
        static const char *const parts[] = {
            "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};
        int64_t shapes[9][3] = {{1, H, 0},
                                {2, p->heads * hd, H},
                                {2, p->kv_heads * hd, H},
                                {2, p->kv_heads * hd, H},
                                {2, H, H},
                                {1, H, 0},
                                {2, F, H},
                                {2, F, H},
                                {2, H, F}};
        /* loom's order within a layer may differ from this list: find each by name */
        for (int k = 0; k < 9 && !bad; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, parts[k]);
            int at = -1;
            for (int j = i; j < i + 9 && j < n; j++)
                if (!strcmp(got[j].name, name)) at = j;
            if (at < 0 || got[at].ndim != shapes[k][0] || got[at].shape[0] != shapes[k][1] ||
                (shapes[k][0] == 2 && got[at].shape[1] != shapes[k][2])) {
                CHECK(0, "%s: %s missing or misshaped", p->preset, name);
                bad = 1;
            }
        }
        i += 9;
    }
    EXPECT("model.norm.weight", 1, H, 0);
    if (!p->tied) EXPECT("lm_head.weight", 2, V, H);
#undef EXPECT
    free(got);
}

int main(void) {
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        loom_gpt_config c;
        loom_status st = loom_gpt_preset(models[m].preset, &c);
        if (st == LOOM_OK) st = loom_gpt_config_check_shape(&c, "test", "");
        CHECK(st == LOOM_OK, "%s: %s", models[m].preset, loom_last_error());
        if (st != LOOM_OK) continue;
        check_config(&models[m], &c);
        check_tensors(&models[m], &c);
    }
    return check_finish();
}
