/*
 * config.c — the model's configuration: GPT-2's, GPT-3's and the Llama family's presets, the
 * overrides a run or a plan applies to them, and the rules every configuration obeys (shapes,
 * tensor and sequence parallelism's divisibility, what this build can train).
 *
 * Not here: the parameter layout (layout.c), the model itself (gpt.c) or its costs (cost.c).
 */
#include "model/model_internal.h"

#include <limits.h>
#include <math.h>
#include <string.h>

typedef struct {
    const char *name;
    loom_gpt_config config;
} gpt_preset;

/* GPT-3's eight sizes (Brown et al. 2020, Table 2.1: layers, d_model, heads; context 2048, GPT-2's
 * vocabulary). Two rows of that table do not have d_model = heads x d_head: XL (24 heads of 128
 * for d_model 2048) takes 16 heads of 128, and 13B (d_model 5140 for 40 heads of 128) takes
 * d_model 5120, as Megatron-style codebases do. */
#define GPT(maxT, V, L, NH, C)                                                                     \
    { .max_seq_len = maxT, .vocab_size = V, .num_layers = L, .num_heads = NH, .channels = C }
#define LLAMA(maxT, V, L, NH, C, KV, F, untied, theta)                                             \
    {                                                                                              \
        .max_seq_len = maxT, .vocab_size = V, .num_layers = L, .num_heads = NH, .channels = C,     \
        .arch = LOOM_ARCH_LLAMA, .kv_heads = KV, .ffn_dim = F, .untied_head = untied,              \
        .rope_theta = theta, .norm_eps = 1e-5                                                      \
    }
static const gpt_preset presets[] = {
    {"gpt2", GPT(1024, 50257, 12, 12, 768)},
    {"gpt2-medium", GPT(1024, 50257, 24, 16, 1024)},
    {"gpt2-large", GPT(1024, 50257, 36, 20, 1280)},
    {"gpt2-xl", GPT(1024, 50257, 48, 25, 1600)},
    {"gpt3-125m", GPT(2048, 50257, 12, 12, 768)},
    {"gpt3-350m", GPT(2048, 50257, 24, 16, 1024)},
    {"gpt3-760m", GPT(2048, 50257, 24, 16, 1536)},
    {"gpt3-1.3b", GPT(2048, 50257, 24, 16, 2048)},
    {"gpt3-2.7b", GPT(2048, 50257, 32, 32, 2560)},
    {"gpt3-6.7b", GPT(2048, 50257, 32, 32, 4096)},
    {"gpt3-13b", GPT(2048, 50257, 40, 40, 5120)},
    {"gpt3-175b", GPT(2048, 50257, 96, 96, 12288)},
    {"small", GPT(256, 257, 4, 4, 128)},
    {"tiny", GPT(16, 257, 2, 2, 16)},
    /* the Llama family: tests' size, SmolLM-135M (HuggingFaceTB/SmolLM-135M's config.json: 30
     * layers, hidden 576, 9 heads, 3 kv heads, intermediate 1536, vocab 49152, tied, rope theta
     * 10000, context 2048) and Llama 3's three sizes (Meta's config.json of Meta-Llama-3-8B and
     * -70B: rope theta 500000, vocab 128256, 8 kv heads, context 8192; of Llama-3.1-405B, the only
     * 405B: the same with context 131072 and Llama 3.1's rope scaling, factor 8 from 8192, low
     * and high frequency factors 1 and 4; it trained at 8192, as plans give with --context) */
    {"llama-tiny", LLAMA(64, 257, 2, 4, 32, 2, 80, 1, 10000.0)},
    {"smollm-135m", LLAMA(2048, 49152, 30, 9, 576, 3, 1536, 0, 10000.0)},
    {"llama3-8b", LLAMA(8192, 128256, 32, 32, 4096, 8, 14336, 1, 500000.0)},
    {"llama3-70b", LLAMA(8192, 128256, 80, 64, 8192, 8, 28672, 1, 500000.0)},
    {"llama3-405b",
     {.max_seq_len = 131072,
      .vocab_size = 128256,
      .num_layers = 126,
      .num_heads = 128,
      .channels = 16384,
      .arch = LOOM_ARCH_LLAMA,
      .kv_heads = 8,
      .ffn_dim = 53248,
      .untied_head = 1,
      .rope_theta = 500000.0,
      .norm_eps = 1e-5,
      .rope_scaling = {8.0, 1.0, 4.0, 8192.0}}},
};

const char *loom_gpt_arch_name(int arch) {
    return arch == LOOM_ARCH_GPT2 ? "gpt2" : arch == LOOM_ARCH_LLAMA ? "llama" : NULL;
}

int loom_gpt_arch_parse(const char *name) {
    if (name && strcmp(name, "gpt2") == 0) return LOOM_ARCH_GPT2;
    if (name && strcmp(name, "llama") == 0) return LOOM_ARCH_LLAMA;
    return -1;
}

/* A configuration's key/value heads and MLP width, defaults filled (a config not yet checked may
 * hold 0 for them). */
static int64_t kv_heads_of(const loom_gpt_config *c) {
    return c->kv_heads > 0 ? c->kv_heads : c->num_heads;
}
static int64_t ffn_of(const loom_gpt_config *c) {
    return c->ffn_dim > 0 ? c->ffn_dim : 4 * (int64_t)c->channels;
}

loom_gpt_widths loom_gpt_widths_of(const loom_gpt_config *c, int tp) {
    loom_gpt_widths w;
    w.hd = c->num_heads > 0 ? c->channels / c->num_heads : 0;
    w.heads = c->num_heads / tp;
    w.kv = kv_heads_of(c) / tp;
    w.q = w.heads * w.hd;
    w.qkv = (w.heads + 2 * w.kv) * w.hd;
    w.ffn = ffn_of(c) / tp;
    w.fc = c->arch == LOOM_ARCH_LLAMA ? 2 * w.ffn : w.ffn;
    return w;
}

int loom_gpt_pad_vocab(int vocab_size) {
    if (vocab_size <= 0) return 0;
    int64_t padded = ((int64_t)vocab_size + 127) / 128 * 128;
    return padded > INT_MAX ? 0 : (int)padded;
}

loom_status loom_gpt_preset(const char *name, loom_gpt_config *config) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *config = presets[i].config;
            config->padded_vocab_size = loom_gpt_pad_vocab(config->vocab_size);
            return LOOM_OK;
        }
    }
    char names[256] = "";
    size_t used = 0, count = sizeof presets / sizeof presets[0];
    for (size_t i = 0; i < count && used < sizeof names; i++) {
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                 i == 0           ? ""
                                 : i + 1 == count ? " or "
                                                  : ", ",
                                 presets[i].name);
    }
    return loom_fail(LOOM_ERR_INPUT, "model: unknown preset '%s'; expected one of %s", name, names);
}

loom_status loom_gpt_config_resolve(const char *preset, int layers, int heads, int d_model,
                                    int context, int vocab, const char *source,
                                    loom_gpt_config *m) {
    loom_gpt_overrides o = {.preset = preset,
                            .layers = layers,
                            .heads = heads,
                            .d_model = d_model,
                            .context = context,
                            .vocab = vocab};
    return loom_gpt_config_resolve_with(&o, source, m);
}

loom_status loom_gpt_tie_parse(const char *word, const char *source, int *out) {
    *out = 0;
    if (!word || !word[0]) return LOOM_OK;
    if (!strcmp(word, "on") || !strcmp(word, "true")) *out = LOOM_TIE_ON;
    if (!strcmp(word, "off") || !strcmp(word, "false")) *out = LOOM_TIE_OFF;
    if (*out) return LOOM_OK;
    return loom_fail(LOOM_ERR_INPUT, "%s: tie_embeddings: expected on or off, got '%s'", source,
                     word);
}

loom_status loom_gpt_config_resolve_with(const loom_gpt_overrides *o, const char *source,
                                         loom_gpt_config *m) {
    int arch = -1;
    if (o->arch && o->arch[0] && (arch = loom_gpt_arch_parse(o->arch)) < 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: arch: expected gpt2 or llama, got '%s'", source,
                         o->arch);
    }
    const char *preset = o->preset && o->preset[0] ? o->preset
                         : arch == LOOM_ARCH_LLAMA ? LOOM_LLAMA_DEFAULT_PRESET
                                                   : LOOM_GPT_DEFAULT_PRESET;
    loom_status st = loom_gpt_preset(preset, m);
    if (st != LOOM_OK) return st;
    if (arch >= 0 && arch != m->arch) {
        return loom_fail(LOOM_ERR_INPUT, "%s: arch: the preset '%s' is %s, got --arch %s", source,
                         preset, loom_gpt_arch_name(m->arch), o->arch);
    }
    if (m->arch != LOOM_ARCH_LLAMA) {
        const char *llama_only = o->kv_heads         ? "kv_heads"
                                 : o->ffn_dim        ? "ffn_dim"
                                 : o->tie_embeddings ? "tie_embeddings"
                                 : o->rope_theta     ? "rope_theta"
                                 : o->norm_eps       ? "norm_eps"
                                                     : NULL;
        if (llama_only) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: %s: a Llama setting, but the model '%s' is GPT-2 (use --arch "
                             "llama or a Llama preset)",
                             source, llama_only, preset);
        }
    }
    if (o->layers) m->num_layers = o->layers;
    if (o->heads) m->num_heads = o->heads;
    if (o->d_model) m->channels = o->d_model;
    if (o->context) m->max_seq_len = o->context;
    if (o->vocab) m->vocab_size = o->vocab;
    if (o->kv_heads) m->kv_heads = o->kv_heads;
    if (o->ffn_dim) m->ffn_dim = o->ffn_dim;
    if (o->tie_embeddings) m->untied_head = o->tie_embeddings == LOOM_TIE_OFF;
    if (o->rope_theta) m->rope_theta = o->rope_theta;
    if (o->norm_eps) m->norm_eps = o->norm_eps;
    /* heads changed without kv heads: the preset's grouping would rarely divide; keep MHA's */
    if (o->heads && !o->kv_heads && m->arch == LOOM_ARCH_LLAMA && m->num_heads % m->kv_heads)
        m->kv_heads = m->num_heads;
    if (m->arch == LOOM_ARCH_GPT2) m->kv_heads = m->ffn_dim = 0; /* follow heads and d_model */
    m->padded_vocab_size = 0;
    return loom_gpt_config_check_shape(m, source, "");
}

loom_status loom_gpt_check_tp(const loom_gpt_config *c, int tp, const char *source,
                              const char *field, const char *prefix) {
    if (tp < 1 || c->num_heads % tp != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %s: expected a divisor of %sheads %d (each rank takes heads/tp), "
                         "got %d",
                         source, field, prefix, c->num_heads, tp);
    }
    if (c->arch == LOOM_ARCH_LLAMA && kv_heads_of(c) % tp != 0) {
        /* (Megatron replicates k and v heads over the ranks that share one when tp > kv heads;
         * their gradients then need a sum over those ranks: not built) */
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %s: expected a divisor of %skv_heads %lld (each rank takes kv "
                         "heads/tp; replicating shared k/v heads is not built), got %d",
                         source, field, prefix, (long long)kv_heads_of(c), tp);
    }
    if (c->padded_vocab_size % tp != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %s: expected a divisor of the padded vocabulary %d (%svocab %d "
                         "rounded up to a multiple of 128), got %d",
                         source, field, c->padded_vocab_size, prefix, c->vocab_size, tp);
    }
    /* tp divides heads and heads divide d_model, so tp also divides d_model and 4*d_model (the
     * MLP's hidden width): no separate rule is needed for them; Llama's own width needs one */
    if (ffn_of(c) % tp != 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %s: expected a divisor of %sffn_dim %lld, got %d",
                         source, field, prefix, (long long)ffn_of(c), tp);
    }
    return LOOM_OK;
}

loom_status loom_gpt_check_sequence_rows(int B, int T, int tp, const char *source) {
    if (tp < 1 || (int64_t)B * T % tp == 0) return LOOM_OK;
    return loom_fail(LOOM_ERR_INPUT,
                     "%s: sequence parallelism: the rows of a micro-batch, %d x %d = %lld "
                     "(--micro-batch-size x --seq-len), must divide by the tensor-parallel "
                     "degree %d (--tensor-parallel)",
                     source, B, T, (long long)B * T, tp);
}

int loom_gpt_config_same(const loom_gpt_config *a, const loom_gpt_config *b) {
    return a->num_layers == b->num_layers && a->num_heads == b->num_heads &&
           a->channels == b->channels && a->max_seq_len == b->max_seq_len &&
           a->vocab_size == b->vocab_size && a->arch == b->arch &&
           kv_heads_of(a) == kv_heads_of(b) && ffn_of(a) == ffn_of(b) &&
           a->untied_head == b->untied_head && a->rope_theta == b->rope_theta &&
           a->norm_eps == b->norm_eps &&
           !memcmp(&a->rope_scaling, &b->rope_scaling, sizeof a->rope_scaling);
}

/* The architecture's own rules, its defaults filled in. */
static loom_status check_arch(loom_gpt_config *c, const char *source, const char *prefix) {
    if (c->arch == LOOM_ARCH_GPT2) {
        const char *llama_only = c->kv_heads && c->kv_heads != c->num_heads    ? "kv_heads"
                                 : c->ffn_dim && c->ffn_dim != 4 * c->channels ? "ffn_dim"
                                 : c->untied_head                              ? "tie_embeddings"
                                 : c->rope_theta                               ? "rope_theta"
                                 : c->norm_eps                                 ? "norm_eps"
                                 : c->rope_scaling.factor                      ? "rope_scaling"
                                                                               : NULL;
        if (llama_only) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: %s%s: a Llama setting, but %sarch is gpt2 (GPT-2 has "
                             "kv_heads = heads, ffn_dim = 4 d_model, a tied head, learned "
                             "positions and LayerNorm)",
                             source, prefix, llama_only, prefix);
        }
        c->kv_heads = c->num_heads, c->ffn_dim = 4 * c->channels;
        return LOOM_OK;
    }
    if (c->arch != LOOM_ARCH_LLAMA) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %sarch: expected gpt2 or llama, got %d", source,
                         prefix, c->arch);
    }
    if (c->kv_heads == 0) c->kv_heads = c->num_heads;
    if (c->kv_heads < 0 || c->num_heads % c->kv_heads != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %skv_heads: expected a divisor of %sheads %d (each group of query "
                         "heads shares one key/value head), got %d",
                         source, prefix, prefix, c->num_heads, c->kv_heads);
    }
    if ((c->channels / c->num_heads) % 2 != 0) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %sheads: rotary positions need an even head width, got d_model %d / "
                         "heads %d = %d",
                         source, prefix, c->channels, c->num_heads, c->channels / c->num_heads);
    }
    if (c->ffn_dim <= 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %sffn_dim: expected a positive integer, got %d",
                         source, prefix, c->ffn_dim);
    }
    if (c->untied_head != 0 && c->untied_head != 1) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %stie_embeddings: expected true or false", source,
                         prefix);
    }
    if (c->rope_theta == 0) c->rope_theta = 10000.0;
    if (c->norm_eps == 0) c->norm_eps = 1e-5;
    if (!(c->rope_theta > 1.0) || !(c->norm_eps > 0.0 && c->norm_eps < 1.0)) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %s: expected rope_theta > 1 and 0 < norm_eps < 1, got %g and %g",
                         source, prefix[0] ? prefix : "model", c->rope_theta, c->norm_eps);
    }
    return loom_gpt_check_rope_scaling(&c->rope_scaling, source, prefix);
}

void loom_gpt_config_describe(const loom_gpt_config *c, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%d layers, %d heads, d_model %d, context %d, vocab %d",
                     c->num_layers, c->num_heads, c->channels, c->max_seq_len, c->vocab_size);
    if (c->arch != LOOM_ARCH_LLAMA || n < 0 || (size_t)n >= cap) return;
    char scaling[64] = "";
    if (c->rope_scaling.factor > 0) {
        snprintf(scaling, sizeof scaling, " scaled x%g from %g", c->rope_scaling.factor,
                 c->rope_scaling.original_context);
    }
    snprintf(buf + n, cap - (size_t)n,
             ", llama: %d kv heads, ffn %d, %s head, rope theta %g%s, norm eps %g", c->kv_heads,
             c->ffn_dim, c->untied_head ? "untied" : "tied", c->rope_theta, scaling, c->norm_eps);
}

loom_status loom_gpt_check_rope_scaling(const loom_rope_scaling *s, const char *source,
                                        const char *prefix) {
    if (s->factor == 0 && s->low_freq_factor == 0 && s->high_freq_factor == 0 &&
        s->original_context == 0)
        return LOOM_OK;
    if (s->factor >= 1 && s->low_freq_factor > 0 && s->high_freq_factor > s->low_freq_factor &&
        s->original_context >= 1 && s->original_context <= INT32_MAX &&
        s->original_context == floor(s->original_context) && isfinite(s->factor) &&
        isfinite(s->high_freq_factor) && isfinite(s->original_context))
        return LOOM_OK;
    return loom_fail(LOOM_ERR_INPUT,
                     "%s: %srope_scaling: expected factor >= 1, 0 < low_freq_factor < "
                     "high_freq_factor and an integer original_max_position_embeddings >= 1 "
                     "(Llama 3.1's "
                     "\"llama3\" scaling), got %g, %g, %g and %g",
                     source, prefix, s->factor, s->low_freq_factor, s->high_freq_factor,
                     s->original_context);
}

loom_status loom_gpt_config_check_shape(loom_gpt_config *c, const char *source,
                                        const char *prefix) {
    struct {
        const char *field;
        int value;
    } positive[] = {{"layers", c->num_layers},
                    {"heads", c->num_heads},
                    {"d_model", c->channels},
                    {"context", c->max_seq_len},
                    {"vocab", c->vocab_size}};
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++) {
        if (positive[i].value <= 0) {
            return loom_fail(LOOM_ERR_INPUT, "%s: %s%s: expected a positive integer, got %d",
                             source, prefix, positive[i].field, positive[i].value);
        }
    }
    if (c->channels % c->num_heads != 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %sheads: expected a divisor of %sd_model %d, got %d",
                         source, prefix, prefix, c->channels, c->num_heads);
    }
    loom_status st = check_arch(c, source, prefix);
    if (st != LOOM_OK) return st;
    int padded = loom_gpt_pad_vocab(c->vocab_size);
    if (padded == 0) {
        return loom_fail(LOOM_ERR_INPUT, "%s: %svocab: expected at most %d, got %d", source, prefix,
                         INT_MAX / 128 * 128, c->vocab_size);
    }
    if (c->padded_vocab_size == 0) c->padded_vocab_size = padded;
    if (c->padded_vocab_size < c->vocab_size) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: %svocab: expected a padded vocabulary of at least %d, got %d", source,
                         prefix, c->vocab_size, c->padded_vocab_size);
    }
    return LOOM_OK;
}

loom_status loom_gpt_config_check(loom_gpt_config *c, const char *source) {
    loom_status st = loom_gpt_config_check_shape(c, source, "");
    if (st != LOOM_OK) return st;
    /* the segment list counts 5 + 12 L entries in an int */
    if (c->num_layers > (INT_MAX - 5) / 12) {
        return loom_fail(LOOM_ERR_INPUT, "%s: layers: expected at most %d in this build, got %d",
                         source, (INT_MAX - 5) / 12, c->num_layers);
    }
    /* Keep every buffer's element count well inside int for the BLAS interface. */
    int64_t widest = (int64_t)c->padded_vocab_size * c->channels;
    loom_gpt_widths w = loom_gpt_widths_of(c, 1);
    int64_t wide = w.fc > w.qkv ? w.fc : w.qkv;
    if (widest > INT32_MAX / 2 || (int64_t)c->channels * wide > INT32_MAX / 2) {
        return loom_fail(LOOM_ERR_INPUT, "%s: model too wide for this build", source);
    }
    return LOOM_OK;
}
