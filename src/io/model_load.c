/*
 * model_load.c — a whole model from any file users have: an llm.c fp32 .bin, a .safetensors
 * (loom's or Hugging Face's GPT-2), a Hugging Face model folder (config.json + model.safetensors,
 * its tokenizer files beside them), or a loom checkpoint (a run folder, its checkpoints/ folder
 * or one step folder). Also just the configuration such a file describes, without reading any
 * weights, so that a run can be planned for it.
 *
 * A rank that holds part of the model reads any of these files slice by slice
 * (loom_model_load_take), keeping its part.
 */
#define _DEFAULT_SOURCE /* realpath */
#include "loom/io.h"

#include "io/io_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int is_readable(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* The safetensors file behind PATH: PATH itself, a checkpoint's model.safetensors, or a Hugging
 * Face folder's model.safetensors.index.json (its weights in shards). */
static loom_status weights_file(const char *path, char *file, size_t cap) {
    if (has_suffix(path, ".safetensors") || has_suffix(path, ".index.json"))
        return loom_path_join(file, cap, NULL, path);
    char single[4200], index[4200];
    loom_status st = loom_path_join(single, sizeof single, path, "model.safetensors");
    if (st == LOOM_OK)
        st = loom_path_join(index, sizeof index, path, "model.safetensors.index.json");
    if (st != LOOM_OK) return st;
    if (!is_readable(single) && is_readable(index)) return loom_path_join(file, cap, NULL, index);
    char dir[4096];
    st = loom_checkpoint_resolve(path, dir, sizeof dir);
    if (st == LOOM_OK) st = loom_path_join(file, cap, dir, "model.safetensors");
    return st;
}

/* *found: PATH is a Hugging Face model folder (config.json beside model.safetensors, or beside
 * model.safetensors.index.json and its shards). */
static loom_status find_hf_folder(const char *path, char *config_json, size_t cap, int *found) {
    char weights[4200], index[4200];
    *found = 0;
    loom_status st = loom_path_join(config_json, cap, path, "config.json");
    if (st == LOOM_OK) st = loom_path_join(weights, sizeof weights, path, "model.safetensors");
    if (st == LOOM_OK)
        st = loom_path_join(index, sizeof index, path, "model.safetensors.index.json");
    if (st != LOOM_OK) return st;
    *found = is_readable(config_json) && (is_readable(weights) || is_readable(index));
    return LOOM_OK;
}

static loom_status hf_int(const json_t *root, const char *key, const char *alt, int *out,
                          const char *path) {
    const json_t *v = json_object_get(root, key);
    if (!v && alt) v = json_object_get(root, alt);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT32_MAX) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %s: expected a positive integer", path, key);
    }
    *out = (int)json_integer_value(v);
    return LOOM_OK;
}

static loom_status hf_number(const json_t *root, const char *key, double fallback, double *out,
                             const char *path) {
    const json_t *v = json_object_get(root, key);
    *out = fallback;
    if (!v || json_is_null(v)) return LOOM_OK;
    if (!json_is_number(v) || !(json_number_value(v) > 0)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %s: expected a positive number", path, key);
    }
    *out = json_number_value(v);
    return LOOM_OK;
}

/* A key whose presence (as true, or as anything but null) means a model loom cannot run. */
static loom_status hf_refuse(const json_t *root, const char *key, const char *why,
                             const char *path) {
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || json_is_false(v)) return LOOM_OK;
    return loom_fail(LOOM_ERR_INPUT, "%s: %s: %s", path, key, why);
}

json_t *loom_rope_scaling_json(const loom_rope_scaling *s) {
    if (!(s->factor > 0)) return json_null();
    return json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3", "factor", s->factor,
                     "low_freq_factor", s->low_freq_factor, "high_freq_factor", s->high_freq_factor,
                     "original_max_position_embeddings", (json_int_t)s->original_context);
}

loom_status loom_rope_scaling_read(const json_t *value, const char *path, loom_rope_scaling *s) {
    memset(s, 0, sizeof *s);
    if (!value || json_is_null(value)) return LOOM_OK;
    if (!json_is_object(value)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: rope_scaling: expected an object or null", path);
    }
    const json_t *type = json_object_get(value, "rope_type");
    if (!type) type = json_object_get(value, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "llama3") != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: rope_scaling: type \"%.40s\" is not supported (none, or Llama "
                         "3.1's \"llama3\")",
                         path, json_is_string(type) ? json_string_value(type) : "?");
    }
    static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                       "original_max_position_embeddings"};
    double *fields[] = {&s->factor, &s->low_freq_factor, &s->high_freq_factor,
                        &s->original_context};
    for (int i = 0; i < 4; i++) {
        const json_t *v = json_object_get(value, keys[i]);
        if (!json_is_number(v)) {
            return loom_fail(LOOM_ERR_INPUT, "%s: rope_scaling: %s: expected a number", path,
                             keys[i]);
        }
        *fields[i] = json_number_value(v);
    }
    return loom_gpt_check_rope_scaling(s, path, "");
}

/* Hugging Face's LlamaForCausalLM config.json (its defaults where a key is absent: kv heads =
 * heads, rms_norm_eps 1e-6, rope_theta 10000, untied, context 2048). Refused by name: another
 * activation, biases, a sliding window, rope scaling but Llama 3.1's, a head_dim other than
 * hidden / heads. */
static loom_status hf_llama_config(const char *path, const json_t *root, loom_gpt_config *c) {
    c->arch = LOOM_ARCH_LLAMA;
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    loom_status st = LOOM_OK;
    if (act && strcmp(act, "silu") != 0) {
        st = loom_fail(LOOM_ERR_INPUT, "%s: hidden_act: expected \"silu\" (SwiGLU), got \"%.40s\"",
                       path, act);
    }
    if (st == LOOM_OK)
        st = hf_refuse(root, "attention_bias", "biases where Llama has none: not supported", path);
    if (st == LOOM_OK)
        st = hf_refuse(root, "mlp_bias", "biases where Llama has none: not supported", path);
    if (st == LOOM_OK)
        st = hf_refuse(root, "sliding_window", "sliding-window attention is not supported", path);
    if (st == LOOM_OK)
        st = loom_rope_scaling_read(json_object_get(root, "rope_scaling"), path, &c->rope_scaling);
    if (st == LOOM_OK) st = hf_int(root, "num_hidden_layers", NULL, &c->num_layers, path);
    if (st == LOOM_OK) st = hf_int(root, "num_attention_heads", NULL, &c->num_heads, path);
    if (st == LOOM_OK) st = hf_int(root, "hidden_size", NULL, &c->channels, path);
    if (st == LOOM_OK) st = hf_int(root, "intermediate_size", NULL, &c->ffn_dim, path);
    if (st == LOOM_OK) st = hf_int(root, "vocab_size", NULL, &c->vocab_size, path);
    c->kv_heads = c->num_heads, c->max_seq_len = 2048;
    if (st == LOOM_OK && json_object_get(root, "num_key_value_heads"))
        st = hf_int(root, "num_key_value_heads", NULL, &c->kv_heads, path);
    if (st == LOOM_OK && json_object_get(root, "max_position_embeddings"))
        st = hf_int(root, "max_position_embeddings", NULL, &c->max_seq_len, path);
    int head_dim = 0;
    if (st == LOOM_OK && json_object_get(root, "head_dim") &&
        !json_is_null(json_object_get(root, "head_dim"))) {
        st = hf_int(root, "head_dim", NULL, &head_dim, path);
        if (st == LOOM_OK && (int64_t)head_dim * c->num_heads != c->channels) {
            st = loom_fail(LOOM_ERR_INPUT,
                           "%s: head_dim: expected hidden_size / num_attention_heads = %d, got %d",
                           path, c->channels / c->num_heads, head_dim);
        }
    }
    if (st == LOOM_OK) st = hf_number(root, "rms_norm_eps", 1e-6, &c->norm_eps, path);
    if (st == LOOM_OK) st = hf_number(root, "rope_theta", 10000.0, &c->rope_theta, path);
    const json_t *tie = json_object_get(root, "tie_word_embeddings");
    c->untied_head = !json_is_true(tie);
    return st;
}

/* Hugging Face's GPT-2 config.json: n_layer, n_head, n_embd, n_positions (or n_ctx), vocab_size;
 * model_type and activation_function, when given, must be GPT-2's. A "llama" model_type is
 * LlamaForCausalLM's (hf_llama_config). */
static loom_status hf_config(const char *path, loom_gpt_config *c) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!json_is_object(root)) {
        json_decref(root);
        return loom_fail(LOOM_ERR_INPUT, "%s:%d:%d: expected a JSON object: %s", path, err.line,
                         err.column, err.text);
    }
    memset(c, 0, sizeof *c);
    const char *type = json_string_value(json_object_get(root, "model_type"));
    const char *act = json_string_value(json_object_get(root, "activation_function"));
    loom_status st = LOOM_OK;
    if (type && strcmp(type, "llama") == 0) {
        st = hf_llama_config(path, root, c);
        json_decref(root);
        return st == LOOM_OK ? loom_gpt_config_check(c, path) : st;
    }
    if (json_object_get(root, "model_type") && (!type || strcmp(type, "gpt2") != 0)) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "%s: model_type: expected \"gpt2\" or \"llama\", got %s%.40s%s", path,
                       type ? "\"" : "", type ? type : "another value", type ? "\"" : "");
    } else if (act && strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "%s: activation_function: expected \"gelu_new\" (GPT-2's), got \"%.40s\"",
                       path, act);
    }
    if (st == LOOM_OK) st = hf_int(root, "n_layer", NULL, &c->num_layers, path);
    if (st == LOOM_OK) st = hf_int(root, "n_head", NULL, &c->num_heads, path);
    if (st == LOOM_OK) st = hf_int(root, "n_embd", NULL, &c->channels, path);
    if (st == LOOM_OK) st = hf_int(root, "n_positions", "n_ctx", &c->max_seq_len, path);
    if (st == LOOM_OK) st = hf_int(root, "vocab_size", NULL, &c->vocab_size, path);
    json_decref(root);
    return st == LOOM_OK ? loom_gpt_config_check(c, path) : st;
}

loom_status loom_model_config_of(const char *path, loom_gpt_config *config) {
    char config_json[4200];
    int hf_folder;
    loom_status st = find_hf_folder(path, config_json, sizeof config_json, &hf_folder);
    if (st != LOOM_OK) return st;
    if (hf_folder) return hf_config(config_json, config);
    if (has_suffix(path, ".bin")) {
        loom_llmc_header h;
        st = loom_llmc_read_header(path, &h);
        if (st != LOOM_OK) return st;
        *config = (loom_gpt_config){.max_seq_len = h.max_seq_len,
                                    .vocab_size = h.vocab_size,
                                    .padded_vocab_size = h.padded_vocab_size,
                                    .num_layers = h.num_layers,
                                    .num_heads = h.num_heads,
                                    .channels = h.channels};
        return loom_gpt_config_check(config, path);
    }
    char file[4200];
    st = weights_file(path, file, sizeof file);
    if (st == LOOM_OK) st = loom_gpt_config_from_safetensors(file, config);
    return st;
}

/* llm.c keeps each tensor whole (tensor-major); loom's buffer is layer-major. */
static loom_status load_llmc(const char *path, loom_gpt *model) {
    loom_llmc_header h;
    loom_status st = loom_llmc_read_header(path, &h);
    if (st != LOOM_OK) return st;
    if (model->num_params != loom_llmc_param_count(&h)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: header sizes do not give loom's layout", path);
    }
    float *flat = loom_alloc_aligned(model->num_params * sizeof(float), "llm.c import");
    st = flat ? loom_llmc_read_params(path, &h, flat, model->num_params) : LOOM_ERR_NOMEM;
    if (st == LOOM_OK) {
        size_t at = 0;
        for (int k = 0; k < LOOM_NUM_PARAM_TENSORS; k++) {
            const loom_gpt_tensor_info *ti = &model->info[k];
            for (int64_t i = 0; i < ti->numel; i++) {
                model->params_memory[loom_gpt_element_offset(ti, i)] = flat[at++];
            }
        }
    }
    loom_free_aligned(flat);
    return st;
}

/* A file whose config describes more than this machine holds is refused before allocating. */
static loom_status check_fits(const char *path, const loom_gpt_config *config) {
    loom_gpt_stage_spec spec = {1, 0, config->num_layers, 1, 1, 1, 1, 1, 0, 0, 0};
    loom_gpt_stage_cost cost;
    loom_status st = loom_gpt_cost_stage(config, &spec, &cost);
    if (st != LOOM_OK) return st;
    char what[4400];
    snprintf(what, sizeof what, "%s: its model (%d layers, d_model %d, context %d, vocab %d)", path,
             config->num_layers, config->channels, config->max_seq_len, config->vocab_size);
    return loom_memory_check(cost.param_bytes + cost.grad_bytes, 1, what,
                             "is the file's configuration right?");
}

typedef struct {
    loom_ckpt_take take;
    void *ctx;
} llmc_take;

static loom_status take_llmc_slice(void *ctx, int tensor, int layer, const float *slice) {
    llmc_take *c = ctx;
    return c->take(c->ctx, 0, tensor, layer, slice);
}

loom_status loom_model_load_take(const char *path, const loom_gpt *layout, loom_ckpt_take take,
                                 void *ctx) {
    loom_status st;
    if (has_suffix(path, ".bin")) {
        loom_llmc_header h;
        st = loom_llmc_read_header(path, &h);
        if (st == LOOM_OK && (h.padded_vocab_size != layout->config.padded_vocab_size ||
                              loom_llmc_param_count(&h) != layout->num_params)) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: header sizes do not give the model's layout", path);
        }
        llmc_take c = {take, ctx};
        if (st == LOOM_OK) st = loom_llmc_read_slices(path, &h, take_llmc_slice, &c);
        return st;
    }
    char file[4200];
    st = weights_file(path, file, sizeof file);
    if (st == LOOM_OK) st = loom_gpt_load_safetensors_take(file, layout, take, ctx);
    return st;
}

/* *found: DIR holds one of GPT-2's tokenizer files. */
static loom_status find_tokenizer_files(const char *dir, int *found) {
    static const char *const names[] = {"vocab.json", "tokenizer.json", "encoder.json",
                                        "gpt2_tokenizer.bin"};
    *found = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !*found; i++) {
        char file[4400];
        loom_status st = loom_path_join(file, sizeof file, dir, names[i]);
        if (st != LOOM_OK) return st;
        FILE *f = fopen(file, "rb");
        if (f) fclose(f);
        *found = f != NULL;
    }
    return LOOM_OK;
}

loom_status loom_model_tokenizer_of(const char *path, char *name, size_t name_cap, char *source,
                                    size_t source_cap) {
    name[0] = source[0] = '\0';
    if (has_suffix(path, ".bin")) return LOOM_OK;
    char file[4200];
    loom_status st = weights_file(path, file, sizeof file);
    loom_safetensors *sf = NULL;
    /* (a sharded Hugging Face folder records nothing: its tokenizer files, if any, say) */
    if (st == LOOM_OK && !has_suffix(file, ".index.json")) st = loom_safetensors_open(&sf, file);
    if (st != LOOM_OK) return st;
    const char *recorded = sf ? loom_safetensors_metadata(sf, "loom.tokenizer") : NULL;
    const char *from = sf ? loom_safetensors_metadata(sf, "loom.tokenizer_source") : NULL;
    if (recorded && strcmp(recorded, "bytes") != 0 && strcmp(recorded, "gpt2") != 0) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "%s: metadata loom.tokenizer: expected \"bytes\" or \"gpt2\", got \"%.40s\"",
                       file, recorded);
    } else if (recorded) {
        snprintf(name, name_cap, "%s", recorded); /* "bytes" or "gpt2" */
        st = loom_path_join(source, source_cap, NULL, from ? from : "");
    }
    /* no record, or a recorded tokenizer that moved away: the copy in the folder (checkpoints
     * carry their tokenizer's files), as a Hugging Face folder's tokenizer */
    struct stat info;
    int moved = recorded && source[0] && stat(source, &info) != 0;
    if (st == LOOM_OK && (!recorded || moved)) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s", file); /* as large as file */
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        int found;
        st = find_tokenizer_files(slash ? dir : ".", &found);
        if (st == LOOM_OK && found) {
            char *absolute = realpath(slash ? dir : ".", NULL);
            snprintf(name, name_cap, "gpt2");
            st = loom_path_join(source, source_cap, NULL, absolute ? absolute : dir);
            free(absolute);
        }
    }
    loom_safetensors_close(sf);
    return st;
}

loom_status loom_model_load(const char *path, const loom_backend *backend, loom_gpt **model) {
    *model = NULL;
    loom_gpt_config config;
    loom_status st = loom_model_config_of(path, &config);
    char file[4200];
    if (st == LOOM_OK && !has_suffix(path, ".bin")) st = weights_file(path, file, sizeof file);
    if (st == LOOM_OK) st = check_fits(has_suffix(path, ".bin") ? path : file, &config);
    if (st == LOOM_OK) st = loom_gpt_create(model, &config, backend);
    if (st != LOOM_OK) return st;
    if (has_suffix(path, ".bin")) {
        st = load_llmc(path, *model);
    } else {
        st = loom_gpt_load_safetensors(file, *model);
    }
    if (st != LOOM_OK) {
        loom_gpt_free(*model);
        *model = NULL;
    }
    return st;
}
