/*
 * checkpoint.c — GPT weights in Hugging Face's safetensors layout, and training checkpoints
 * (weights + AdamW moments + loop state) written so that a crash never loses a saved one.
 *
 * Hugging Face stores GPT-2's linear weights as Conv1D, (in, out); loom keeps nn.Linear's
 * (out, in) like llm.c, so those tensors are transposed on the way in and out. The tied LM
 * head is not stored; only the real vocabulary rows of wte are.
 *
 * Not here: the safetensors format itself (safetensors.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/io.h"

#include "loom/data.h"

#include "io/io_internal.h"

#include "base/json_fields.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* One stored tensor: its HF name, stored shape, and where it lives in a flat buffer. */
typedef struct {
    char name[64];
    int ndim;
    int64_t shape[2];
    size_t offset; /* floats into the flat layout */
    int transpose; /* stored (in, out), held (out, in) */
    int tensor;    /* LOOM_WTE ... */
    int layer;     /* -1 for global tensors */
    size_t within; /* floats into the (tensor, layer) slice: a part of a packed tensor (Llama's
                    * q/k/v of qkvw, gate/up of fcw) */
} hf_tensor;

/* Llama's tensors with Hugging Face's LlamaForCausalLM names (nn.Linear's (out, in), nothing
 * transposed; q_proj's rows are in the rotate-half order loom's rotary kernel uses, as Hugging
 * Face's are): qkvw stored as q_proj, k_proj, v_proj, fcw as gate_proj, up_proj. */
static int hf_tensors_llama(const loom_gpt_config *c, const loom_gpt_tensor_info *info,
                            hf_tensor *out) {
    int64_t C = c->channels;
    loom_gpt_widths w = loom_gpt_widths_of(c, 1);
    int n = 0;
    const struct {
        const char *name;
        int k, ndim;
        int64_t rows, cols, within;
    } block[] = {
        {"input_layernorm.weight", LOOM_LN1W, 1, C, 0, 0},
        {"self_attn.q_proj.weight", LOOM_QKVW, 2, w.q, C, 0},
        {"self_attn.k_proj.weight", LOOM_QKVW, 2, w.kv * w.hd, C, w.q * C},
        {"self_attn.v_proj.weight", LOOM_QKVW, 2, w.kv * w.hd, C, (w.q + w.kv * w.hd) * C},
        {"self_attn.o_proj.weight", LOOM_ATTPROJW, 2, C, C, 0},
        {"post_attention_layernorm.weight", LOOM_LN2W, 1, C, 0, 0},
        {"mlp.gate_proj.weight", LOOM_FCW, 2, w.ffn, C, 0},
        {"mlp.up_proj.weight", LOOM_FCW, 2, w.ffn, C, w.ffn * C},
        {"mlp.down_proj.weight", LOOM_FCPROJW, 2, C, w.ffn, 0},
    };
#define PUT(nm, k_, nd, s0, s1, layer_, in)                                                        \
    do {                                                                                           \
        hf_tensor *t = &out[n++];                                                                  \
        snprintf(t->name, sizeof t->name, "%s", nm);                                               \
        t->ndim = nd, t->shape[0] = s0, t->shape[1] = s1, t->transpose = 0;                        \
        t->tensor = k_, t->layer = layer_, t->within = (size_t)(in);                               \
        t->offset = info[k_].offset + (layer_ > 0 ? (size_t)layer_ * info[k_].layer_stride : 0) +  \
                    t->within;                                                                     \
    } while (0)
    PUT("model.embed_tokens.weight", LOOM_WTE, 2, c->vocab_size, C, -1, 0);
    for (int l = 0; l < c->num_layers; l++) {
        for (size_t i = 0; i < sizeof block / sizeof block[0]; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "model.layers.%d.%s", l, block[i].name);
            PUT(nm, block[i].k, block[i].ndim, block[i].rows, block[i].cols, l, block[i].within);
        }
    }
    PUT("model.norm.weight", LOOM_LNFW, 1, C, 0, -1, 0);
    if (c->untied_head) PUT("lm_head.weight", LOOM_LMHEAD, 2, c->vocab_size, C, -1, 0);
#undef PUT
    return n;
}

/* The HF tensors of a configuration, in file order; returns the count (2 + 12 L + 2). */
static int hf_tensors(const loom_gpt_config *c, const loom_gpt_tensor_info *info, hf_tensor *out) {
    if (c->arch == LOOM_ARCH_LLAMA) return hf_tensors_llama(c, info, out);
    int64_t C = c->channels;
    int n = 0, layer_ = -1;
#define ADD(nm, k, nd, s0, s1, off, tr)                                                            \
    do {                                                                                           \
        hf_tensor *t = &out[n++];                                                                  \
        snprintf(t->name, sizeof t->name, "%s", nm);                                               \
        t->ndim = nd;                                                                              \
        t->shape[0] = s0;                                                                          \
        t->shape[1] = s1;                                                                          \
        t->offset = info[k].offset + (size_t)(off);                                                \
        t->transpose = tr;                                                                         \
        t->tensor = k;                                                                             \
        t->layer = info[k].per_layer ? layer_ : -1;                                                \
        t->within = 0;                                                                             \
    } while (0)
    ADD("wte.weight", LOOM_WTE, 2, c->vocab_size, C, 0, 0);
    ADD("wpe.weight", LOOM_WPE, 2, c->max_seq_len, C, 0, 0);
    for (int l = 0; l < c->num_layers; l++) {
        char nm[64];
        layer_ = l;
#define LAYER(suffix, k, nd, s0, s1, tr)                                                           \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);                                             \
        ADD(nm, k, nd, s0, s1, (size_t)l *info[k].layer_stride, tr);                               \
    } while (0)
        LAYER("ln_1.weight", LOOM_LN1W, 1, C, 0, 0);
        LAYER("ln_1.bias", LOOM_LN1B, 1, C, 0, 0);
        LAYER("attn.c_attn.weight", LOOM_QKVW, 2, C, 3 * C, 1);
        LAYER("attn.c_attn.bias", LOOM_QKVB, 1, 3 * C, 0, 0);
        LAYER("attn.c_proj.weight", LOOM_ATTPROJW, 2, C, C, 1);
        LAYER("attn.c_proj.bias", LOOM_ATTPROJB, 1, C, 0, 0);
        LAYER("ln_2.weight", LOOM_LN2W, 1, C, 0, 0);
        LAYER("ln_2.bias", LOOM_LN2B, 1, C, 0, 0);
        LAYER("mlp.c_fc.weight", LOOM_FCW, 2, C, 4 * C, 1);
        LAYER("mlp.c_fc.bias", LOOM_FCB, 1, 4 * C, 0, 0);
        LAYER("mlp.c_proj.weight", LOOM_FCPROJW, 2, 4 * C, C, 1);
        LAYER("mlp.c_proj.bias", LOOM_FCPROJB, 1, C, 0, 0);
#undef LAYER
    }
    ADD("ln_f.weight", LOOM_LNFW, 1, C, 0, 0, 0);
    ADD("ln_f.bias", LOOM_LNFB, 1, C, 0, 0, 0);
#undef ADD
    return n;
}

static hf_tensor *hf_tensor_list(const loom_gpt *model, int *count) {
    size_t cap = 4 + 12 * (size_t)model->config.num_layers;
    hf_tensor *list = loom_calloc(cap, sizeof *list, "tensor list");
    if (list) *count = hf_tensors(&model->config, model->info, list);
    return list;
}

int loom_checkpoint_slices(const loom_gpt_config *config, int *tensors, int *layers) {
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout(config, info);
    hf_tensor *list = loom_calloc(4 + 12 * (size_t)config->num_layers, sizeof *list, "tensor list");
    if (!list) return -1;
    int count = hf_tensors(config, info, list), slices = 0;
    for (int i = 0; i < count; i++) {
        if (list[i].within > 0) continue; /* a later part of the slice before it */
        tensors[slices] = list[i].tensor, layers[slices++] = list[i].layer;
    }
    free(list);
    return slices;
}

loom_status loom_hf_tensor_shapes(const loom_gpt_config *config, loom_hf_tensor_shape **out,
                                  int *count) {
    *out = NULL, *count = 0;
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS];
    loom_gpt_layout(config, info);
    size_t cap = 4 + 12 * (size_t)config->num_layers;
    hf_tensor *list = loom_calloc(cap, sizeof *list, "tensor list");
    loom_hf_tensor_shape *shapes = loom_calloc(cap, sizeof *shapes, "tensor shapes");
    if (!list || !shapes) {
        free(list), free(shapes);
        return LOOM_ERR_NOMEM;
    }
    int n = hf_tensors(config, info, list);
    for (int i = 0; i < n; i++) {
        memcpy(shapes[i].name, list[i].name, sizeof shapes[i].name);
        shapes[i].ndim = list[i].ndim;
        shapes[i].shape[0] = list[i].shape[0], shapes[i].shape[1] = list[i].shape[1];
    }
    free(list);
    *out = shapes, *count = n;
    return LOOM_OK;
}

static char *config_json(const loom_gpt_config *c) {
    json_t *obj = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i}", "layers", c->num_layers, "heads",
                            c->num_heads, "d_model", c->channels, "context", c->max_seq_len,
                            "vocab", c->vocab_size, "padded_vocab", c->padded_vocab_size);
    if (obj && c->arch == LOOM_ARCH_LLAMA) { /* GPT-2's files read as they always did */
        json_t *more =
            json_pack("{s:s, s:i, s:i, s:b, s:f, s:f}", "arch", "llama", "kv_heads", c->kv_heads,
                      "ffn_dim", c->ffn_dim, "tie_embeddings", !c->untied_head, "rope_theta",
                      c->rope_theta, "norm_eps", c->norm_eps);
        if (more && c->rope_scaling.factor > 0 &&
            json_object_set_new(more, "rope_scaling", loom_rope_scaling_json(&c->rope_scaling)))
            json_decref(more), more = NULL;
        if (!more || json_object_update(obj, more) != 0) json_decref(obj), obj = NULL;
        json_decref(more);
    }
    char *text = obj ? json_dumps(obj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(obj);
    return text;
}

/* Hugging Face's config.json for the model: GPT2LMHeadModel's fields (no dropout: loom trains
 * without) or LlamaForCausalLM's, so that `from_pretrained` on the folder builds the model whose
 * weights model.safetensors holds. NULL when out of memory. */
char *loom_hf_config_json(const loom_gpt_config *c) {
    json_t *obj;
    if (c->arch == LOOM_ARCH_LLAMA) {
        obj = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:o, s:i, s:b, "
                        "s:s, s:b, s:f, s:b, s:f, s:s, s:i}",
                        "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size",
                        c->channels, "intermediate_size", c->ffn_dim, "num_attention_heads",
                        c->num_heads, "num_hidden_layers", c->num_layers, "num_key_value_heads",
                        c->kv_heads, "head_dim", c->channels / c->num_heads,
                        "max_position_embeddings", c->max_seq_len, "rms_norm_eps", c->norm_eps,
                        "rope_theta", c->rope_theta, "rope_scaling",
                        loom_rope_scaling_json(&c->rope_scaling), "vocab_size", c->vocab_size,
                        "tie_word_embeddings", !c->untied_head, "hidden_act", "silu",
                        "attention_bias", 0, "attention_dropout", 0.0, "mlp_bias", 0,
                        "initializer_range", 0.02, "torch_dtype", "float32", "pretraining_tp", 1);
    } else {
        obj = json_pack(
            "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:f, s:f, s:f, s:f, "
            "s:b, s:s}",
            "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "n_embd", c->channels,
            "n_head", c->num_heads, "n_layer", c->num_layers, "n_positions", c->max_seq_len,
            "n_ctx", c->max_seq_len, "vocab_size", c->vocab_size, "layer_norm_epsilon", 1e-5,
            "activation_function", "gelu_new", "attn_pdrop", 0.0, "embd_pdrop", 0.0, "resid_pdrop",
            0.0, "initializer_range", 0.02, "tie_word_embeddings", 1, "torch_dtype", "float32");
    }
    char *text = obj ? json_dumps(obj, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(obj);
    return text;
}

/* config.json beside the weights: the folder is a Hugging Face model folder. */
static loom_status write_hf_config(const char *dir, const loom_gpt_config *c) {
    char path[4200];
    loom_status st = loom_path_join(path, sizeof path, dir, "config.json");
    if (st != LOOM_OK) return st;
    char *text = loom_hf_config_json(c);
    if (!text) return loom_fail(LOOM_ERR_NOMEM, "%s: cannot encode the model config", path);
    st = loom_write_file_atomic(path, text, strlen(text));
    free(text);
    return st;
}

/* The run's tokenizer files beside the weights, under the names a Hugging Face folder gives
 * them, so that the folder carries its tokenizer. A tokenizer that cannot be read any more (moved
 * since the run began) is warned about, not fatal: the weights and the state matter more. */
static loom_status write_tokenizer_files(const char *dir, const char *source) {
    if (!source[0]) return LOOM_OK;
    loom_tokenizer_file files[LOOM_TOKENIZER_MAX_FILES];
    int count = 0;
    if (loom_tokenizer_files(source, files, &count) != LOOM_OK) {
        loom_warn("%s: not copied into %s: %s", source, dir, loom_last_error());
        loom_clear_error();
        return LOOM_OK;
    }
    for (int i = 0; i < count; i++) {
        char path[4200], *data = NULL;
        size_t size = 0;
        loom_status st = loom_path_join(path, sizeof path, dir, files[i].name);
        if (st != LOOM_OK) return st;
        if (loom_read_file(files[i].path, &data, &size) != LOOM_OK) {
            loom_warn("%s: not copied into %s: %s", files[i].path, dir, loom_last_error());
            loom_clear_error();
            continue;
        }
        st = loom_write_file_atomic(path, data, size);
        free(data);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

/* Adapts loom_ckpt_fill (buffer, tensor, layer) to the writer's per-index callback. */
typedef struct {
    const hf_tensor *list;
    int count;
    int first_buffer;
    loom_ckpt_fill fill;
    void *ctx;
    const float *slice; /* the last slice filled */
} fill_adapter;

static const float *adapter_fill(void *ctx, int index) {
    fill_adapter *a = ctx;
    const hf_tensor *t = &a->list[index % a->count];
    /* the parts of one slice follow each other: the slice is filled once, at its first part */
    if (t->within == 0) {
        a->slice = a->fill(a->ctx, a->first_buffer + index / a->count, t->tensor, t->layer);
    }
    return a->slice ? a->slice + t->within : NULL;
}

/* Writes `prefix + name` tensors for each flat buffer given (params, or m and v); with `fill`,
 * the data comes slice by slice from it instead (buffers numbered from first_buffer). */
static loom_status write_tensors(const char *path, const loom_gpt *model, const float *const *bufs,
                                 const char *const *prefixes, int nbufs, const char *const *meta,
                                 int meta_count, loom_ckpt_fill fill, void *fill_ctx,
                                 int first_buffer) {
    int count = 0;
    hf_tensor *list = hf_tensor_list(model, &count);
    if (!list) return LOOM_ERR_NOMEM;
    int total = count * nbufs;
    loom_st_tensor *tensors = loom_calloc((size_t)total, sizeof *tensors, "tensor table");
    char(*names)[96] = loom_calloc((size_t)total, sizeof *names, "tensor names");
    if (!tensors || !names) {
        free(list), free(tensors), free(names);
        return LOOM_ERR_NOMEM;
    }
    for (int b = 0; b < nbufs; b++) {
        for (int i = 0; i < count; i++) {
            loom_st_tensor *t = &tensors[b * count + i];
            snprintf(names[b * count + i], sizeof names[0], "%s%s", prefixes[b], list[i].name);
            t->name = names[b * count + i];
            t->ndim = list[i].ndim;
            t->shape[0] = list[i].shape[0];
            t->shape[1] = list[i].shape[1];
            t->data = bufs ? bufs[b] + list[i].offset : NULL;
            t->transpose = list[i].transpose;
        }
    }
    fill_adapter adapter = {list, count, first_buffer, fill, fill_ctx, NULL};
    loom_status st = loom_safetensors_write_fill(path, tensors, total, meta, meta_count,
                                                 fill ? adapter_fill : NULL, &adapter);
    free(list), free(tensors), free(names);
    return st;
}

loom_status loom_gpt_save_safetensors(const char *path, const loom_gpt *model) {
    char *cfg = config_json(&model->config);
    if (!cfg) return loom_fail(LOOM_ERR_NOMEM, "%s: cannot encode the model config", path);
    const char *meta[] = {"format", "pt", "loom.config", cfg};
    const float *bufs[] = {model->params_memory};
    const char *prefixes[] = {""};
    loom_status st = write_tensors(path, model, bufs, prefixes, 1, meta, 2, NULL, NULL, 0);
    free(cfg);
    return st;
}

static loom_status read_int(json_t *obj, const char *key, int *out, const char *path) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: metadata loom.config: %s: expected a positive integer", path, key);
    }
    *out = (int)json_integer_value(v);
    return LOOM_OK;
}

/* The Llama fields of loom.config (absent: GPT-2). */
static loom_status read_llama(json_t *obj, loom_gpt_config *c, const char *path) {
    json_t *arch = json_object_get(obj, "arch");
    if (!arch) return LOOM_OK;
    if (!json_is_string(arch) || strcmp(json_string_value(arch), "llama") != 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: metadata loom.config: arch: expected \"llama\"",
                         path);
    }
    c->arch = LOOM_ARCH_LLAMA;
    loom_status st = read_int(obj, "kv_heads", &c->kv_heads, path);
    if (st == LOOM_OK) st = read_int(obj, "ffn_dim", &c->ffn_dim, path);
    json_t *tie = json_object_get(obj, "tie_embeddings");
    json_t *theta = json_object_get(obj, "rope_theta"), *eps = json_object_get(obj, "norm_eps");
    if (st == LOOM_OK &&
        (!json_is_boolean(tie) || !json_is_number(theta) || !json_is_number(eps))) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: metadata loom.config: expected tie_embeddings (true or false), "
                         "rope_theta and norm_eps (numbers) beside arch llama",
                         path);
    }
    if (st == LOOM_OK) {
        c->untied_head = !json_is_true(tie);
        c->rope_theta = json_number_value(theta), c->norm_eps = json_number_value(eps);
        st = loom_rope_scaling_read(json_object_get(obj, "rope_scaling"), path, &c->rope_scaling);
    }
    return st;
}

loom_status loom_gpt_config_from_safetensors(const char *path, loom_gpt_config *c) {
    loom_safetensors *st;
    loom_status status = loom_safetensors_open(&st, path);
    if (status != LOOM_OK) return status;
    memset(c, 0, sizeof *c);
    const char *meta = loom_safetensors_metadata(st, "loom.config");
    if (meta) {
        json_error_t err;
        json_t *obj = json_loads(meta, 0, &err);
        if (!json_is_object(obj)) {
            json_decref(obj);
            loom_safetensors_close(st);
            return loom_fail(LOOM_ERR_INPUT, "%s: metadata loom.config: not a JSON object (%s)",
                             path, err.text);
        }
        status = read_int(obj, "layers", &c->num_layers, path);
        if (!status) status = read_int(obj, "heads", &c->num_heads, path);
        if (!status) status = read_int(obj, "d_model", &c->channels, path);
        if (!status) status = read_int(obj, "context", &c->max_seq_len, path);
        if (!status) status = read_int(obj, "vocab", &c->vocab_size, path);
        if (!status) status = read_llama(obj, c, path);
        json_decref(obj);
    } else {
        /* A Hugging Face file: sizes from the shapes. */
        const char *prefix = loom_safetensors_find(st, "wte.weight") ? "" : "transformer.";
        char name[96];
        snprintf(name, sizeof name, "%swte.weight", prefix);
        const loom_st_entry *wte = loom_safetensors_find(st, name);
        snprintf(name, sizeof name, "%swpe.weight", prefix);
        const loom_st_entry *wpe = loom_safetensors_find(st, name);
        if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2) {
            loom_safetensors_close(st);
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: expected 2-D tensors wte.weight and wpe.weight (GPT-2 names)",
                             path);
        }
        c->vocab_size = (int)wte->shape[0];
        c->channels = (int)wte->shape[1];
        c->max_seq_len = (int)wpe->shape[0];
        c->num_heads = c->channels % 64 == 0 ? c->channels / 64 : 1;
        /* the shapes cannot say how many heads there are: say what is assumed */
        loom_warn("%s: no loom.config metadata; assuming %d attention heads (d_model %d / 64, as "
                  "in every GPT-2 size)",
                  path, c->num_heads, c->channels);
        for (int l = 0;; l++) {
            snprintf(name, sizeof name, "%sh.%d.ln_1.weight", prefix, l);
            if (!loom_safetensors_find(st, name)) break;
            c->num_layers = l + 1;
        }
    }
    loom_safetensors_close(st);
    if (status != LOOM_OK) return status;
    return loom_gpt_config_check(c, path);
}

/* The files one model's weights lie in: one safetensors file, or the shards a Hugging Face
 * index (model.safetensors.index.json, its "weight_map" from tensor name to file) names. */
typedef struct {
    loom_safetensors **files;
    int count;
} st_set;

/* The entry `name` in the set and the file holding it; NULL when no file has it. */
static const loom_st_entry *set_find(const st_set *set, const char *name, loom_safetensors **in) {
    for (int i = 0; i < set->count; i++) {
        const loom_st_entry *e = loom_safetensors_find(set->files[i], name);
        if (e) {
            if (in) *in = set->files[i];
            return e;
        }
    }
    return NULL;
}

static void set_close(st_set *set) {
    for (int i = 0; i < set->count; i++) loom_safetensors_close(set->files[i]);
    free(set->files);
    set->files = NULL, set->count = 0;
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Opens PATH (a .safetensors file) or every shard its Hugging Face index names (each once, beside
 * the index). */
static loom_status set_open(const char *path, st_set *set) {
    memset(set, 0, sizeof *set);
    if (!has_suffix(path, ".index.json")) {
        set->files = loom_calloc(1, sizeof *set->files, "weight files");
        if (!set->files) return LOOM_ERR_NOMEM;
        loom_status st = loom_safetensors_open(&set->files[0], path);
        set->count = st == LOOM_OK;
        if (st != LOOM_OK) set_close(set);
        return st;
    }
    json_t *root;
    loom_status st = loom_json_load(path, &root);
    if (st != LOOM_OK) return st;
    json_t *map = json_object_get(root, "weight_map");
    size_t n = json_is_object(map) ? json_object_size(map) : 0;
    if (n == 0) {
        json_decref(root);
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: weight_map: expected an object from tensor names to shard files",
                         path);
    }
    set->files = loom_calloc(n, sizeof *set->files, "weight files");
    const char **names = loom_calloc(n, sizeof *names, "weight files");
    if (!set->files || !names) st = LOOM_ERR_NOMEM;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    const char *key;
    json_t *value;
    json_object_foreach(map, key, value) {
        if (st != LOOM_OK) break;
        const char *file = json_string_value(value);
        if (!file || !file[0] || strchr(file, '/')) {
            st = loom_fail(LOOM_ERR_INPUT,
                           "%s: weight_map.%s: expected a file name beside the index", path, key);
            break;
        }
        int seen = 0;
        for (int i = 0; i < set->count && !seen; i++) seen = strcmp(names[i], file) == 0;
        if (seen) continue;
        char shard[4200];
        st = loom_path_join(shard, sizeof shard, slash ? dir : NULL, file);
        if (st == LOOM_OK) st = loom_safetensors_open(&set->files[set->count], shard);
        if (st == LOOM_OK) names[set->count++] = file;
    }
    free(names);
    json_decref(root);
    if (st != LOOM_OK) set_close(set);
    return st;
}

/* Reads `prefix + name` tensors of a model layout into a flat buffer. */
static loom_status read_tensors_take(loom_safetensors *st, const char *path, const loom_gpt *model,
                                     const char *prefix, float *buf, loom_ckpt_take take, void *ctx,
                                     int buffer);
static loom_status read_set_take(const st_set *set, const char *path, const loom_gpt *model,
                                 const char *prefix, float *buf, loom_ckpt_take take, void *ctx,
                                 int buffer);

/* A file holding tensors its config does not describe (a config that says 1 layer over a file
 * of 2 layers' tensors) is refused, not read with the rest ignored. Tensors outside `prefix`
 * (another buffer of the same file) are not this call's. */
static loom_status extra_tensor(const st_set *set, const char *path, const loom_gpt *model,
                                const char *prefix, const char *hf_prefix, const hf_tensor *list,
                                int count) {
    size_t plen = strlen(prefix), hlen = strlen(hf_prefix);
    for (int f = 0; f < set->count; f++) {
        loom_safetensors *st = set->files[f];
        for (int e = 0; e < loom_safetensors_count(st); e++) {
            const char *name = loom_safetensors_entry(st, e)->name;
            if (strncmp(name, prefix, plen) != 0) continue;
            if (!plen && (!strncmp(name, "exp_avg.", 8) || !strncmp(name, "exp_avg_sq.", 11)))
                continue;
            const char *bare = name + plen;
            if (hlen && !strncmp(bare, hf_prefix, hlen)) bare += hlen;
            int known = 0;
            for (int i = 0; i < count && !known; i++) known = strcmp(bare, list[i].name) == 0;
            /* Hugging Face files also hold the attention masks as buffers: not parameters */
            /* (and rotary frequency buffers of older exports) */
            if (!known && strstr(bare, ".attn.bias") == NULL &&
                strstr(bare, ".attn.masked_bias") == NULL && strcmp(bare, "lm_head.weight") != 0 &&
                strstr(bare, "rotary_emb.inv_freq") == NULL) {
                const loom_gpt_config *c = &model->config;
                return loom_fail(
                    LOOM_ERR_INPUT,
                    "%s: tensor '%s' is not part of the model its config describes (%d "
                    "layers, d_model %d); the file holds more than its config says",
                    path, name, c->num_layers, c->channels);
            }
        }
    }
    return LOOM_OK;
}

static loom_status read_tensors_take(loom_safetensors *st, const char *path, const loom_gpt *model,
                                     const char *prefix, float *buf, loom_ckpt_take take, void *ctx,
                                     int buffer) {
    loom_safetensors *one[1] = {st};
    st_set set = {one, 1};
    return read_set_take(&set, path, model, prefix, buf, take, ctx, buffer);
}

/* Reads `prefix + name` tensors into buf (the model's flat layout) or, with `take`, one slice
 * at a time into a scratch buffer handed to take(ctx, buffer, tensor, layer, slice). */
static loom_status read_set_take(const st_set *set, const char *path, const loom_gpt *model,
                                 const char *prefix, float *buf, loom_ckpt_take take, void *ctx,
                                 int buffer) {
    int count = 0;
    hf_tensor *list = hf_tensor_list(model, &count);
    if (!list) return LOOM_ERR_NOMEM;
    float *slice = NULL;
    if (take) {
        int64_t largest = 0;
        for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
            if (model->info[k].layer_numel > largest) largest = model->info[k].layer_numel;
        }
        slice = loom_alloc_aligned((size_t)largest * sizeof(float), "checkpoint slice");
        if (!slice) {
            free(list);
            return LOOM_ERR_NOMEM;
        }
    }
    const char *hf_prefix = "";
    char probe[96];
    snprintf(probe, sizeof probe, "%swte.weight", prefix);
    if (!set_find(set, probe, NULL)) {
        snprintf(probe, sizeof probe, "%stransformer.wte.weight", prefix);
        if (set_find(set, probe, NULL)) hf_prefix = "transformer.";
    }
    loom_status status = LOOM_OK;
    for (int i = 0; i < count && status == LOOM_OK; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s%s%s", prefix, hf_prefix, list[i].name);
        loom_safetensors *st = NULL;
        if (!set_find(set, name, &st)) {
            status = loom_fail(LOOM_ERR_INPUT, "%s: tensor '%s' is missing", path, name);
            break;
        }
        if (!take) {
            status = loom_safetensors_read_f32(st, name, list[i].ndim, list[i].shape,
                                               list[i].transpose, buf + list[i].offset);
            continue;
        }
        /* padded vocabulary rows are not stored: zero, as in a fresh model */
        if (list[i].within == 0)
            memset(slice, 0, (size_t)model->info[list[i].tensor].layer_numel * sizeof(float));
        status = loom_safetensors_read_f32(st, name, list[i].ndim, list[i].shape, list[i].transpose,
                                           slice + list[i].within);
        /* a packed slice (Llama's q/k/v, gate/up) goes once its last part is in */
        int last_part = i + 1 == count || list[i + 1].within == 0;
        if (status == LOOM_OK && last_part)
            status = take(ctx, buffer, list[i].tensor, list[i].layer, slice);
    }
    if (status == LOOM_OK) status = extra_tensor(set, path, model, prefix, hf_prefix, list, count);
    free(list);
    loom_free_aligned(slice);
    if (status == LOOM_OK && !take) {
        /* padded vocabulary rows are not stored: keep them zero */
        const loom_gpt_config *c = &model->config;
        size_t real = (size_t)c->vocab_size * (size_t)c->channels;
        size_t padded = (size_t)c->padded_vocab_size * (size_t)c->channels;
        memset(buf + model->info[LOOM_WTE].offset + real, 0, (padded - real) * sizeof(float));
        if (model->info[LOOM_LMHEAD].numel > 0)
            memset(buf + model->info[LOOM_LMHEAD].offset + real, 0,
                   (padded - real) * sizeof(float));
    }
    return status;
}

loom_status loom_gpt_load_safetensors(const char *path, loom_gpt *model) {
    st_set set;
    loom_status status = set_open(path, &set);
    if (status != LOOM_OK) return status;
    status = read_set_take(&set, path, model, "", model->params_memory, NULL, NULL, 0);
    set_close(&set);
    return status;
}

#define STATE_FIELDS 6
#define STATE_FORMAT "loom.train_state.v1"
static const char *state_keys[STATE_FIELDS] = {"step",      "data_epoch", "data_index",
                                               "rng_state", "bad_steps",  "skipped_total"};
/* the counters kept as int64_t in loom_ckpt_state */
static const int state_signed[STATE_FIELDS] = {1, 0, 0, 0, 1, 1};

/* The state file's buffers: AdamW's two moments, or an islands checkpoint's outer momentum;
 * returns their count. */
static int state_prefixes(const char *islands, const char *prefixes[2]) {
    prefixes[0] = islands[0] ? "outer_momentum." : "exp_avg.";
    prefixes[1] = "exp_avg_sq.";
    return islands[0] ? 1 : 2;
}

loom_status loom_checkpoint_write(const char *dir, const loom_gpt *model, const float *const *bufs,
                                  loom_ckpt_fill fill, void *ctx, const loom_ckpt_state *state) {
    char path[4200];
    loom_status status = loom_mkdir_p(dir);
    if (status != LOOM_OK) return status;

    char *cfg = config_json(&model->config);
    if (!cfg) return loom_fail(LOOM_ERR_NOMEM, "%s: cannot encode the model config", dir);
    const char *model_meta[] = {"format",
                                "pt",
                                "loom.config",
                                cfg,
                                "loom.tokenizer",
                                state->tokenizer,
                                "loom.tokenizer_source",
                                state->tokenizer_source};
    int model_meta_count = state->tokenizer[0] ? 4 : 2;
    const char *model_prefix[] = {""};
    status = loom_path_join(path, sizeof path, dir, "model.safetensors");
    if (status == LOOM_OK) {
        status = write_tensors(path, model, bufs, model_prefix, 1, model_meta, model_meta_count,
                               fill, ctx, 0);
    }
    free(cfg);
    if (status == LOOM_OK) status = write_hf_config(dir, &model->config);
    if (status == LOOM_OK) status = write_tokenizer_files(dir, state->tokenizer_source);
    if (status != LOOM_OK) return status;

    char values[STATE_FIELDS][32];
    uint64_t raw[STATE_FIELDS] = {(uint64_t)state->step,      state->data_epoch,
                                  state->data_index,          state->rng_state,
                                  (uint64_t)state->bad_steps, (uint64_t)state->skipped_total};
    const char *meta[2 * STATE_FIELDS + 4];
    for (int i = 0; i < STATE_FIELDS; i++) {
        snprintf(values[i], sizeof values[i], "%" PRIu64, raw[i]);
        meta[2 * i] = state_keys[i];
        meta[2 * i + 1] = values[i];
    }
    meta[2 * STATE_FIELDS] = "format";
    meta[2 * STATE_FIELDS + 1] = STATE_FORMAT;
    int meta_count = STATE_FIELDS + 1;
    if (state->compress[0]) {
        meta[2 * meta_count] = "loom.compress";
        meta[2 * meta_count++ + 1] = state->compress;
    }
    if (state->islands[0]) {
        meta[2 * meta_count] = "loom.islands";
        meta[2 * meta_count++ + 1] = state->islands;
    }
    const char *prefixes[2];
    int nbufs = state_prefixes(state->islands, prefixes);
    status = loom_path_join(path, sizeof path, dir, "state.safetensors");
    if (status != LOOM_OK) return status;
    return write_tensors(path, model, bufs ? bufs + 1 : NULL, prefixes, nbufs, meta, meta_count,
                         fill, ctx, 1);
}

loom_status loom_checkpoint_point_latest(const char *out_dir, int64_t step) {
    char path[4200], pointer[64];
    int len = snprintf(pointer, sizeof pointer, "step_%08" PRId64 "\n", step);
    loom_status status = loom_path_join(path, sizeof path, out_dir, "checkpoints/latest");
    if (status != LOOM_OK) return status;
    return loom_write_file_atomic(path, pointer, (size_t)len);
}

/* Model file, state file, then the pointer: the shared body of both save functions. */
static loom_status checkpoint_save(const char *out_dir, const loom_gpt *model,
                                   const float *const *bufs, loom_ckpt_fill fill, void *ctx,
                                   const loom_ckpt_state *state) {
    char dir[4096], step_name[64];
    snprintf(step_name, sizeof step_name, "checkpoints/step_%08" PRId64, state->step);
    loom_status status = loom_path_join(dir, sizeof dir, out_dir, step_name);
    if (status == LOOM_OK) status = loom_checkpoint_write(dir, model, bufs, fill, ctx, state);
    /* only now does "latest" move: a crash before this leaves the previous checkpoint current */
    if (status == LOOM_OK) status = loom_checkpoint_point_latest(out_dir, state->step);
    return status;
}

loom_status loom_checkpoint_save(const char *out_dir, const loom_gpt *model, const float *m,
                                 const float *v, const loom_ckpt_state *state) {
    return loom_checkpoint_save_params(out_dir, model, model->params_memory, m, v, state);
}

loom_status loom_checkpoint_save_params(const char *out_dir, const loom_gpt *model,
                                        const float *params, const float *m, const float *v,
                                        const loom_ckpt_state *state) {
    const float *bufs[3] = {params, m, v};
    return checkpoint_save(out_dir, model, bufs, NULL, NULL, state);
}

loom_status loom_checkpoint_save_fill(const char *out_dir, const loom_gpt *layout,
                                      loom_ckpt_fill fill, void *ctx,
                                      const loom_ckpt_state *state) {
    return checkpoint_save(out_dir, layout, NULL, fill, ctx, state);
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static loom_status follow_latest(const char *checkpoints, char *dir, size_t cap) {
    char path[4200];
    loom_status st = loom_path_join(path, sizeof path, checkpoints, "latest");
    if (st != LOOM_OK) return st;
    char *text;
    size_t size;
    if (loom_read_file(path, &text, &size) != LOOM_OK) {
        return loom_fail(LOOM_ERR_INPUT, "%s: no checkpoint pointer 'latest' (nothing saved yet?)",
                         checkpoints);
    }
    while (size > 0 && (text[size - 1] == '\n' || text[size - 1] == ' ')) text[--size] = '\0';
    if (size == 0 || strchr(text, '/')) {
        free(text);
        return loom_fail(LOOM_ERR_INPUT, "%s: expected a step folder name like step_00000100",
                         path);
    }
    st = loom_path_join(dir, cap, checkpoints, text);
    free(text);
    return st;
}

loom_status loom_checkpoint_resolve(const char *path, char *dir, size_t cap) {
    char probe[4200];
    loom_status st = loom_path_join(probe, sizeof probe, path, "model.safetensors");
    if (st != LOOM_OK) return st;
    if (is_file(probe)) return loom_path_join(dir, cap, NULL, path);
    st = loom_path_join(probe, sizeof probe, path, "latest");
    if (st != LOOM_OK) return st;
    if (is_file(probe)) return follow_latest(path, dir, cap);
    st = loom_path_join(probe, sizeof probe, path, "checkpoints");
    if (st != LOOM_OK) return st;
    if (is_dir(probe)) return follow_latest(probe, dir, cap);
    if (is_file(path)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: expected an llm.c .bin, a .safetensors file, or a run/checkpoint "
                         "folder",
                         path);
    }
    if (!is_dir(path)) return loom_fail(LOOM_ERR_INPUT, "%s: no such checkpoint or folder", path);
    return loom_fail(LOOM_ERR_INPUT,
                     "%s: expected a run folder, its checkpoints/ folder, or a step folder with "
                     "model.safetensors",
                     path);
}

static loom_status parse_u64(const char *text, uint64_t *out) {
    if (!text || !*text) return LOOM_ERR_INPUT;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || text[0] == '-') return LOOM_ERR_INPUT;
    *out = v;
    return LOOM_OK;
}

static loom_status checkpoint_load(const char *dir, loom_gpt *model, float *m, float *v,
                                   loom_ckpt_take take, void *ctx, loom_ckpt_state *state) {
    char path[4200];
    loom_status status = loom_path_join(path, sizeof path, dir, "model.safetensors");
    if (status != LOOM_OK) return status;
    loom_safetensors *st;
    status = loom_safetensors_open(&st, path);
    if (status != LOOM_OK) return status;
    status = read_tensors_take(st, path, model, "", model->params_memory, take, ctx, 0);
    loom_safetensors_close(st);
    if (status != LOOM_OK) return status;

    status = loom_path_join(path, sizeof path, dir, "state.safetensors");
    if (status != LOOM_OK) return status;
    status = loom_safetensors_open(&st, path);
    if (status != LOOM_OK) return status;
    uint64_t raw[STATE_FIELDS];
    const char *format = loom_safetensors_metadata(st, "format");
    if (!format || strcmp(format, STATE_FORMAT) != 0) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: metadata 'format': expected \"%s\", got %s%s%s",
                           path, STATE_FORMAT, format ? "\"" : "", format ? format : "none",
                           format ? "\"" : "");
    }
    for (int i = 0; i < STATE_FIELDS && status == LOOM_OK; i++) {
        if (parse_u64(loom_safetensors_metadata(st, state_keys[i]), &raw[i]) != LOOM_OK) {
            status = loom_fail(LOOM_ERR_INPUT, "%s: metadata '%s': expected a non-negative integer",
                               path, state_keys[i]);
        } else if (state_signed[i] && raw[i] > (uint64_t)INT64_MAX) {
            status = loom_fail(LOOM_ERR_INPUT,
                               "%s: metadata '%s': expected at most %" PRId64 ", got %" PRIu64,
                               path, state_keys[i], INT64_MAX, raw[i]);
        }
    }
    if (status == LOOM_OK && (raw[4] > raw[0] || raw[5] > raw[0] || raw[4] > raw[5])) {
        status = loom_fail(LOOM_ERR_INPUT,
                           "%s: metadata: expected bad_steps <= skipped_total <= step, got "
                           "bad_steps %" PRIu64 ", skipped_total %" PRIu64 ", step %" PRIu64,
                           path, raw[4], raw[5], raw[0]);
    }
    /* the folder's name says which step it holds: the two must agree */
    const char *folder = strrchr(dir, '/');
    folder = folder ? folder + 1 : dir;
    uint64_t named;
    if (status == LOOM_OK && strncmp(folder, "step_", 5) == 0 &&
        parse_u64(folder + 5, &named) == LOOM_OK && named != raw[0]) {
        status = loom_fail(LOOM_ERR_INPUT,
                           "%s: metadata 'step': expected %" PRIu64 " (the folder's name), got "
                           "%" PRIu64,
                           path, named, raw[0]);
    }
    const char *compress = loom_safetensors_metadata(st, "loom.compress");
    if (status == LOOM_OK && compress && strlen(compress) >= sizeof state->compress) {
        status = loom_fail(LOOM_ERR_INPUT,
                           "%s: metadata 'loom.compress': expected at most %zu "
                           "characters, got %zu",
                           path, sizeof state->compress - 1, strlen(compress));
    }
    if (status == LOOM_OK) {
        snprintf(state->compress, sizeof state->compress, "%s", compress ? compress : "");
    }
    const char *islands = loom_safetensors_metadata(st, "loom.islands");
    if (status == LOOM_OK && islands && strlen(islands) >= sizeof state->islands) {
        status = loom_fail(LOOM_ERR_INPUT,
                           "%s: metadata 'loom.islands': expected at most %zu characters, got %zu",
                           path, sizeof state->islands - 1, strlen(islands));
    }
    if (status == LOOM_OK) {
        snprintf(state->islands, sizeof state->islands, "%s", islands ? islands : "");
    }
    const char *prefixes[2];
    int nbufs = state_prefixes(state->islands, prefixes);
    if (status == LOOM_OK)
        status = read_tensors_take(st, path, model, prefixes[0], m, take, ctx, 1);
    if (status == LOOM_OK && nbufs == 2) {
        status = read_tensors_take(st, path, model, prefixes[1], v, take, ctx, 2);
    }
    loom_safetensors_close(st);
    if (status != LOOM_OK) return status;
    state->step = (int64_t)raw[0];
    state->data_epoch = raw[1];
    state->data_index = raw[2];
    state->rng_state = raw[3];
    state->bad_steps = (int64_t)raw[4];
    state->skipped_total = (int64_t)raw[5];
    return LOOM_OK;
}

loom_status loom_checkpoint_load(const char *dir, loom_gpt *model, float *m, float *v,
                                 loom_ckpt_state *state) {
    return checkpoint_load(dir, model, m, v, NULL, NULL, state);
}

loom_status loom_gpt_load_safetensors_take(const char *path, const loom_gpt *layout,
                                           loom_ckpt_take take, void *ctx) {
    st_set set;
    loom_status status = set_open(path, &set);
    if (status != LOOM_OK) return status;
    status = read_set_take(&set, path, layout, "", NULL, take, ctx, 0);
    set_close(&set);
    return status;
}

loom_status loom_checkpoint_load_take(const char *dir, const loom_gpt *layout, loom_ckpt_take take,
                                      void *ctx, loom_ckpt_state *state) {
    return checkpoint_load(dir, (loom_gpt *)layout, NULL, NULL, take, ctx, state);
}
