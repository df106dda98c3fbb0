/*
 * loom/model.h — the GPT-2 model: configuration and presets, the parameter layout (one flat
 * buffer with a struct of pointers into it), initialisation, and the forward and backward
 * pass of one micro-batch.
 *
 * The flat buffer is layer-major: wte, wpe, then block 0's twelve tensors, block 1's, ...,
 * then lnfw, lnfb. A block's parameters (and gradients) are contiguous, so gradient buckets
 * become ready block by block during backward, and a pipeline stage's layers are one slice.
 * A pipeline stage's buffer keeps that order but holds only what the stage uses: wte on the
 * first stage (the lookup) and the last (the tied LM head), wpe on the first, lnfw and lnfb on
 * the last; a tensor it does not hold has numel 0 and takes no space. A rank that runs several
 * chunks of layers (virtual pipeline stages) holds all their blocks in ascending order, and wte
 * once when it has both the embedding and the head. The single-stage model holds everything
 * (llm.c's files and loom's checkpoints are in its order).
 *
 * The forward/backward pass is split into embedding, a range of blocks, and the head, so
 * that a pipeline stage can run only its part; backward also runs as B (input gradients) and W
 * (weight gradients) apart, for zero-bubble pipeline schedules.
 *
 * Not here: the optimizer step, data, files, or communication between processes.
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include "loom/base.h"
#include "loom/comm.h"
#include "loom/ops.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int max_seq_len;       /* maxT: positions the model can see (wpe rows) */
    int vocab_size;        /* V: real vocabulary */
    int padded_vocab_size; /* Vp: V rounded up to a multiple of 128 */
    int num_layers;        /* L */
    int num_heads;         /* NH */
    int channels;          /* C */
    /* The Llama family (arch LOOM_ARCH_LLAMA): RMSNorm, rotary positions, a SwiGLU MLP,
     * grouped-query attention, no biases, the LM head its own tensor unless tied. GPT-2 leaves
     * every field below 0 (loom_gpt_config_check_shape fills kv_heads and ffn_dim). */
    int arch;          /* LOOM_ARCH_GPT2 (0) or LOOM_ARCH_LLAMA */
    int kv_heads;      /* KV: key/value heads, dividing num_heads (0: num_heads) */
    int ffn_dim;       /* F: the MLP's hidden width (0: GPT-2's 4 C) */
    int untied_head;   /* the LM head is its own (Vp, C) tensor, not wte (Llama; SmolLM ties) */
    double rope_theta; /* rotary base (Llama; 0: 10000) */
    double norm_eps;   /* RMSNorm's epsilon (Llama; 0: 1e-5) */
    loom_rope_scaling rope_scaling; /* Llama 3.1's long-context scaling (factor 0: none) */
} loom_gpt_config;

enum { LOOM_ARCH_GPT2 = 0, LOOM_ARCH_LLAMA = 1 };
/* "gpt2" or "llama"; NULL for an unknown value. */
const char *loom_gpt_arch_name(int arch);
/* LOOM_ARCH_* of a name, -1 when unknown. */
int loom_gpt_arch_parse(const char *name);

/* One tensor-parallel rank's widths of a block (all of them at tp 1): the one place GPT-2's and
 * Llama's shapes are told apart for the GEMMs and the activations. */
typedef struct {
    int64_t hd;    /* a head's width, C / NH */
    int64_t heads; /* query heads, NH / tp */
    int64_t kv;    /* key/value heads, KV / tp */
    int64_t q;     /* the attention's width, heads x hd = C / tp */
    int64_t qkv;   /* the QKV GEMM's outputs, (heads + 2 kv) hd: rows [q | k | v] */
    int64_t ffn;   /* the MLP's hidden width after the activation, F / tp */
    int64_t fc;    /* the MLP-up GEMM's outputs: ffn (GPT-2), 2 ffn (Llama: [gate | up]) */
} loom_gpt_widths;
loom_gpt_widths loom_gpt_widths_of(const loom_gpt_config *config, int tp);

/* Names: "gpt2" (124M), "gpt2-medium", "gpt2-large", "gpt2-xl"; GPT-3's eight sizes "gpt3-125m",
 * "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b"
 * (context 2048; XL with 16 heads and 13B with d_model 5120, where the paper's d_model is not
 * heads x 128); "tiny" (tests), "small" (the quick-start model). Vocabulary 50257 (tiny/small:
 * 257 bytes). */
loom_status loom_gpt_preset(const char *name, loom_gpt_config *config);
/* The padded vocabulary: vocab rounded up to a multiple of 128 (0 when vocab is not positive or
 * the result does not fit in an int). The one place this rule lives. */
int loom_gpt_pad_vocab(int vocab_size);
/* The rules every model description obeys (a plan for a model this build cannot train
 * included): sizes positive, heads dividing d_model, the vocabulary paddable; padded_vocab_size
 * filled in when 0 (else at least the vocabulary). Messages read "SOURCE: PREFIXfield: ...";
 * prefix is "" for run configurations and "model." for plan files. */
loom_status loom_gpt_config_check_shape(loom_gpt_config *config, const char *source,
                                        const char *prefix);
/* The shape rules plus what this build can train (BLAS int sizes; token ids are int32, and
 * token shards hold uint16 or uint32 ids, so any paddable vocabulary is fine); `source`
 * names where the values came from, for the message. */
loom_status loom_gpt_config_check(loom_gpt_config *config, const char *source);
/* Tensor parallelism of degree tp fits the model when tp divides the heads and the padded
 * vocabulary (each rank takes heads/tp and Vp/tp rows): the one place the rule lives. Messages
 * read "SOURCE: FIELD: expected a divisor of PREFIXheads ..." (prefix "model." for plans). */
loom_status loom_gpt_check_tp(const loom_gpt_config *config, int tp, const char *source,
                              const char *field, const char *prefix);
/* Sequence parallelism over tp ranks fits a micro-batch of B x T when tp divides its B*T rows
 * (each rank holds an equal, contiguous share): the one place the rule lives. The message names
 * the values and the flags they come from, after "SOURCE: ". */
loom_status loom_gpt_check_sequence_rows(int B, int T, int tp, const char *source);
/* Llama 3.1's rope scaling is none (all zero) or factor >= 1, 0 < low < high frequency factors
 * and an original context >= 1; else LOOM_ERR_INPUT, "SOURCE: PREFIXrope_scaling: ...". */
loom_status loom_gpt_check_rope_scaling(const loom_rope_scaling *scaling, const char *source,
                                        const char *prefix);
/* "L layers, NH heads, d_model C, context T, vocab V", and for a Llama its own settings after
 * it (kv heads, ffn, head, rope theta and scaling, norm eps): what messages that compare two
 * models print. Truncated to cap. */
void loom_gpt_config_describe(const loom_gpt_config *config, char *buf, size_t cap);
/* Whether two configurations describe the same model (padding aside). */
int loom_gpt_config_same(const loom_gpt_config *a, const loom_gpt_config *b);
#define LOOM_GPT_DEFAULT_PRESET   "small"
#define LOOM_LLAMA_DEFAULT_PRESET "llama-tiny"
/* What a run or a plan may change of a preset (0 / NULL: the preset's). */
typedef struct {
    const char *preset; /* NULL or "": the architecture's default preset */
    const char *arch;   /* "gpt2" | "llama"; NULL or "": the preset's */
    int layers, heads, d_model, context, vocab;
    int kv_heads, ffn_dim;       /* Llama only */
    int tie_embeddings;          /* 0: the preset's; LOOM_TIE_ON, LOOM_TIE_OFF (Llama only) */
    double rope_theta, norm_eps; /* Llama only */
} loom_gpt_overrides;
enum { LOOM_TIE_ON = 1, LOOM_TIE_OFF = 2 };
/* "on"/"true" or "off"/"false" into LOOM_TIE_*; "" or NULL: 0 (the preset's). */
loom_status loom_gpt_tie_parse(const char *word, const char *source, int *out);
/* The preset with the overrides applied, checked (loom_gpt_config_check_shape, prefix ""): the
 * one resolution `loom train` and `loom plan` share. A Llama-only override on GPT-2, or an arch
 * that contradicts the preset, is refused by name. */
loom_status loom_gpt_config_resolve_with(const loom_gpt_overrides *o, const char *source,
                                         loom_gpt_config *config);
/* A preset (NULL or "": LOOM_GPT_DEFAULT_PRESET) with any non-zero override applied, checked
 * (loom_gpt_config_check_shape, prefix
 * ""); the one resolution `loom train` and `loom plan` share. */
loom_status loom_gpt_config_resolve(const char *preset, int layers, int heads, int d_model,
                                    int context, int vocab, const char *source,
                                    loom_gpt_config *config);

/* The parameter tensors, in llm.c's order (which is also their order within a block), and the
 * untied LM head last. A Llama block uses GPT-2's slots: ln1w and ln2w are its RMSNorms' weights,
 * qkvw holds [q | k | v] (GQA's k and v narrower), attprojw is o_proj, fcw holds [gate | up] and
 * fcprojw is down_proj; wpe and the biases have numel 0. */
enum {
    LOOM_WTE,
    LOOM_WPE,
    LOOM_LN1W,
    LOOM_LN1B,
    LOOM_QKVW,
    LOOM_QKVB,
    LOOM_ATTPROJW,
    LOOM_ATTPROJB,
    LOOM_LN2W,
    LOOM_LN2B,
    LOOM_FCW,
    LOOM_FCB,
    LOOM_FCPROJW,
    LOOM_FCPROJB,
    LOOM_LNFW,
    LOOM_LNFB,
    LOOM_LMHEAD, /* the untied LM head (Llama); numel 0 when wte is the head */
    LOOM_NUM_PARAM_TENSORS
};

/* Pointers to each tensor's layer-0 slice; layer l's slice of a per-layer tensor is at
 * + l * layer_stride (loom_gpt.layer_stride). Shapes below are logical, per layer after L.
 * NULL for a tensor this pipeline stage does not hold. */
typedef struct {
    float *wte;      /* (Vp, C) token embedding, tied LM head; padded rows zero */
    float *wpe;      /* (maxT, C) */
    float *ln1w;     /* (L, C) */
    float *ln1b;     /* (L, C) */
    float *qkvw;     /* (L, 3C, C) */
    float *qkvb;     /* (L, 3C) */
    float *attprojw; /* (L, C, C) */
    float *attprojb; /* (L, C) */
    float *ln2w;     /* (L, C) */
    float *ln2b;     /* (L, C) */
    float *fcw;      /* (L, 4C, C) */
    float *fcb;      /* (L, 4C) */
    float *fcprojw;  /* (L, C, 4C) */
    float *fcprojb;  /* (L, C) */
    float *lnfw;     /* (C) */
    float *lnfb;     /* (C) */
    float *lmhead;   /* (Vp, C) the untied LM head; NULL when tied */
} loom_gpt_tensors;

#define LOOM_MAX_MATRIX_PARTS 3

typedef struct {
    const char *name; /* llm.c-style short name, e.g. "qkvw" */
    int64_t numel;
    int ndim;
    int64_t shape[3];    /* logical shape, layers outermost (llm.c's) */
    size_t offset;       /* in floats from the start of the flat buffer (layer 0's slice) */
    size_t layer_stride; /* floats between consecutive layers' slices; 0 if not per layer */
    int64_t layer_numel; /* elements per layer (numel for a global tensor) */
    int decay;           /* weight decay applies (2-D weights) */
    int per_layer;       /* leading L dimension */
} loom_gpt_tensor_info;

/* Sizes and offsets of the 16 tensors for a configuration; returns the total count. */
size_t loom_gpt_layout(const loom_gpt_config *config,
                       loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]);
/* The same for one rank of tensor parallelism of degree tp (Megatron): qkvw/qkvb and
 * fcw/fcb split by output rows (this rank's heads; its quarter of the MLP), attprojw and
 * fcprojw by input columns, wte by vocabulary rows (Vp/tp); the rest replicated. */
size_t loom_gpt_layout_tp(const loom_gpt_config *config, int tp,
                          loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]);
/* ... for the pipeline stage holding blocks [first_layer, end_layer): wte only when it is the
 * first or the last stage, wpe only on the first, lnfw and lnfb only on the last (numel 0,
 * shape[0] 0 and no space otherwise). [0, num_layers) is loom_gpt_layout_tp. */
size_t loom_gpt_layout_shard(const loom_gpt_config *config, int tp, int first_layer, int end_layer,
                             loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]);

/* One range of blocks that a pipeline rank runs as one virtual pipeline stage (Megatron's model
 * chunk). With p ranks and v chunks each, rank i runs chunks i, i + p, ... (interleaved 1F1B);
 * zero-bubble's V shape gives rank 0 the first and the last. */
typedef struct {
    int first_layer, end_layer; /* [first, end) of the model's blocks; may be empty */
    int has_embedding;          /* the model's first virtual stage: tokens in (first_layer 0) */
    int has_head;               /* its last: final LayerNorm, LM head, loss (end_layer L) */
} loom_gpt_chunk;
#define LOOM_GPT_MAX_CHUNKS 32
/* ... for a rank running `num_chunks` chunks (ascending, not overlapping): their blocks in
 * ascending order, wte when a chunk has the embedding or the head (held once when both: the tied
 * embedding then gets both gradients locally), wpe with the embedding, lnfw and lnfb with the
 * head. One chunk [first, end) flagged by position is loom_gpt_layout_shard. */
size_t loom_gpt_layout_chunks(const loom_gpt_config *config, int tp, const loom_gpt_chunk *chunks,
                              int num_chunks, loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]);
/* Whether tensor k is split across tensor-parallel ranks. */
int loom_gpt_tensor_is_sharded(int k);
/* How many matrices one layer's slice of tensor k (on a rank of tensor parallelism tp) is to a
 * gradient compressor, and each one's rows (row blocks of the tensor, in order): 3 for qkvw (the
 * Q, K and V maps, packed [q | k | v] on every tensor-parallel rank; Llama's k and v narrower
 * under GQA), 2 for Llama's fcw (gate and up), 1 (all rows) for everything else. The packed
 * gradient is nearly rank 1 early in training, so a low-rank compressor of it serves mostly one
 * of the maps and leaves the others to the residual. The one place the rule lives: the runtime's
 * buckets and the cost model both ask it. */
int loom_gpt_matrix_parts(const loom_gpt_config *config, int tp, int k,
                          int64_t rows[LOOM_MAX_MATRIX_PARTS]);
/* Flat-buffer offset of element `index` of a tensor in its logical (llm.c) order. */
size_t loom_gpt_element_offset(const loom_gpt_tensor_info *info, int64_t index);

/* A contiguous run of one tensor's elements in the flat buffer (one layer's slice, or a whole
 * global tensor), for per-tensor treatment such as weight decay. */
typedef struct {
    size_t offset;
    int64_t numel;
    int tensor; /* LOOM_WTE ... */
    int layer;  /* the rank's local layer (loom_gpt_global_layer maps it); -1 for global tensors */
    int decay;
} loom_gpt_segment;

typedef struct {
    float *encoded;   /* (B, T, C) */
    float *ln1;       /* (L, B, T, C) */
    float *ln1_mean;  /* (L, B, T) */
    float *ln1_rstd;  /* (L, B, T) */
    float *qkv;       /* (L, B, T, 3C) */
    float *atty;      /* (L, B, T, C) */
    float *att;       /* (L, B, NH, T, T) softmax probabilities */
    float *attproj;   /* (L, B, T, C) */
    float *residual2; /* (L, B, T, C) */
    float *ln2;       /* (L, B, T, C) */
    float *ln2_mean;  /* (L, B, T) */
    float *ln2_rstd;  /* (L, B, T) */
    float *fch;       /* (L, B, T, 4C) */
    float *fch_gelu;  /* (L, B, T, 4C) */
    float *fcproj;    /* (L, B, T, C) */
    float *residual3; /* (L, B, T, C) */
    /* the head stage's; size 0 and NULL on the other stages */
    float *lnf;       /* (B, T, C) */
    float *lnf_mean;  /* (B, T) */
    float *lnf_rstd;  /* (B, T) */
    float *probs;     /* (B, T, Vp) logits, then probabilities, then their gradient */
    float *losses;    /* (B, T) */
    float *row_max;   /* (B, T) vocabulary-parallel softmax: max over every rank's logits */
    float *row_stats; /* (2, B, T) ... sum of exp, and the target's logit */
    /* kept by a split backward's B for its W (loom_gpt_backward_input): the output gradients of
     * each block's four GEMMs and of the embedding; size 0 and NULL unless the slots were
     * reserved split (the head keeps nothing extra: B leaves dlogits in probs) */
    float *dfcproj;  /* (L, B, T, C) gradient of fcproj's output, = d(residual3) */
    float *dfch;     /* (L, B, T, 4C) ... of fc's output, after GELU's backward */
    float *dattproj; /* (L, B, T, C) ... of attproj's output, = d(residual2) */
    float *dqkv;     /* (L, B, T, 3C) ... of qkv's output */
    float *dencoded; /* (B, T, C) ... of the embedding's output, on the embedding stage */
} loom_gpt_acts;

/* Scratch for backward: one layer's worth, reused by every layer. */
typedef struct {
    float *dresidual; /* (B, T, C) gradient of the residual stream */
    float *dbtc;      /* (B, T, C) */
    float *dbtc2;     /* (B, T, C) */
    float *dqkv;      /* (B, T, 3C) */
    float *dfch;      /* (B, T, 4C) */
    float *dfch2;     /* (B, T, 4C) */
    float *dnorm;     /* (4, C) sequence parallelism: one micro-batch's LayerNorm weight and bias
                       * gradients of this rank's rows, summed over TP before they are added;
                       * NULL without */
} loom_gpt_grad_acts;

/* params_memory and grads_memory hold this many zero floats past num_params, so that a flat
 * buffer can be split into equal shards for up to this many data-parallel ranks. */
#define LOOM_GPT_PAD_FLOATS 4096

typedef struct {
    loom_gpt_config config;
    const loom_backend *backend;
    loom_gpt_tensor_info info[LOOM_NUM_PARAM_TENSORS]; /* this rank's (local) tensors */
    size_t num_params;                                 /* local */
    /* tensor parallelism: sizes below are this rank's (C/tp channels of attention output,
     * NH/tp heads, 4C/tp MLP units, Vp/tp vocabulary rows) */
    int tp_size, tp_rank;
    loom_comm *tp_comm; /* borrowed; NULL when tp_size == 1 */
    int vocab_start;    /* first vocabulary row this rank holds */
    int vocab_local;    /* real (unpadded) rows among this rank's Vp/tp */
    /* Megatron's sequence parallelism (tp > 1): the residual stream, the LayerNorms, the
     * residual adds, the position embedding and the row-parallel biases hold and compute this
     * rank's contiguous 1/tp of the B*T rows (rows are (b, t) pairs); the column-parallel GEMMs'
     * inputs are all-gathered, the row-parallel GEMMs' outputs reduce-scattered. A stage's input
     * and output, and their gradients, are this rank's rows (loom_gpt_rows). */
    int sequence_parallel;
    /* pipeline parallelism: this rank runs one or more chunks (virtual stages) of the model's
     * blocks; all their blocks, in ascending order, are its local layers 0 .. num_local_layers-1.
     * The embedding chunk turns tokens into the residual stream, the head chunk ends it with the
     * final LayerNorm and the loss. wte exists on a rank with either (the head's is the tied LM
     * head), wpe with the embedding, lnf with the head. With one chunk (a pipeline stage) the
     * blocks are the model's [first_layer, first_layer + num_local_layers). */
    int num_chunks;                             /* >= 1 */
    loom_gpt_chunk chunks[LOOM_GPT_MAX_CHUNKS]; /* ascending, not overlapping */
    int max_chunk_layers;                       /* the largest chunk's: a slot's blocks */
    int first_layer;                            /* chunks[0].first_layer */
    int num_local_layers;                       /* all chunks' blocks */
    int has_embedding, has_head;                /* some chunk has */
    int slots, slot;      /* activation sets reserved (micro-batches in flight), the current */
    int split_backward;   /* the sets also keep what a split backward's W needs */
    int selective;        /* selective recomputation: a set holds one layer's attention softmax
                           * (acts.att) as scratch; backward recomputes each layer's from its
                           * kept qkv right before attention's backward */
    size_t slot_floats;   /* floats per activation set */
    int32_t *inputs_all;  /* (slots, B, T) */
    int32_t *targets_all; /* (slots, B, T) */
    size_t layer_stride;  /* floats per transformer block */
    loom_gpt_segment *segments; /* in flat-buffer order, covering it exactly (none for a
                                 * tensor of numel 0) */
    int num_segments;

    float *params_memory; /* the flat offsets [params_begin, params_end): (num_params) but under
                           * ZeRO-3, where it is this rank's shard */
    size_t params_begin, params_end;
    loom_gpt_tensors params;
    float *grads_memory; /* (num_params) */
    loom_gpt_tensors grads;
    /* Units: the pieces ZeRO-2/3 synchronise and gather one at a time, in flat-buffer order:
     * unit 0 the part before the first block (wte and wpe where this rank holds them; maybe
     * empty), units 1 .. num_local_layers the blocks, the last one the final LayerNorm (maybe
     * empty). The passes reach every tensor through unit_params and unit_grads: each unit's
     * first float, in params_memory and grads_memory unless data parallelism points it at a
     * buffer of its own (a gathered block, a gradient bucket). */
    int num_units;                     /* num_local_layers + 2 */
    size_t *unit_begin;                /* (num_units + 1) flat offsets; [u, u + 1) is unit u */
    float **unit_params, **unit_grads; /* (num_units) */

    int B, T; /* activation buffers are sized for these (or fewer) */
    float *acts_memory;
    loom_gpt_acts acts;
    float *grad_acts_memory;
    loom_gpt_grad_acts grad_acts;
    int32_t *inputs;  /* (B, T) of the last forward */
    int32_t *targets; /* (B, T) of the last forward */
    int cur_B, cur_T; /* shape of the last forward */
    float mean_loss;  /* of the last forward with targets */

    /* Called during backward whenever more gradients are final: every gradient at flat offset
     * >= ready_offset will not change again in this backward (0 at the end). Data parallelism
     * uses it to start bucket allreduces while backward goes on. NULL: not called. */
    void (*grads_ready)(void *ctx, size_t ready_offset);
    void *grads_ready_ctx;
    /* Called around a block unit's use (ZeRO-2/3 hand in and collect buffers here;
     * loom_gpt_set_unit_events): LOOM_GPT_UNIT_GRADS before the pass writes unit u's gradients
     * (a fused backward's block, a split backward's B, which writes the LayerNorm gradients, and
     * its W), LOOM_GPT_UNIT_GRADS_DONE after the last write of that backward (the fused block,
     * or W); LOOM_GPT_UNIT_PARAMS_FORWARD / _BACKWARD before a forward or a backward (fused or
     * B; W reads no parameters) reads the block's parameters, LOOM_GPT_UNIT_PARAMS_DONE after.
     * The embeddings' and the final LayerNorm's units (held whole for a step) get only
     * LOOM_GPT_UNIT_PARAMS_FORWARD, before a forward first reads them (the embedding lookup when
     * no embed_lookup hook does it, the final LayerNorm, the LM head), and unit 0
     * LOOM_GPT_UNIT_GRADS_DONE after the LM head's weight gradient. LOOM_GPT_UNIT_PROGRESS
     * (unit -1) between a block's GEMMs: a point where the hook may move its transfers on (MPI
     * moves them only inside its calls). NULL: not called. */
    void (*unit_event)(void *ctx, int unit, int event);
    void *unit_event_ctx;
    /* Without tensor parallelism, when set, the embedding's forward: out (B*T, C) = wte's rows of
     * inputs + wpe's rows of the positions, looked up by the hook instead of from unit 0's
     * parameters (ZeRO-3 looks them up where they are sharded; loom_gpt_set_embed_lookup).
     * NULL: from unit 0's parameters. */
    void (*embed_lookup)(void *ctx, float *out, const int32_t *inputs, int B, int T);
    /* Likewise the embedding's backward: the gradients of wte's and wpe's rows from dout
     * (B*T, C), added by the hook instead of into unit 0's gradients (ZeRO-2/3 add them into
     * the owners' shards). NULL: into unit 0's gradients. */
    void (*embed_lookup_backward)(void *ctx, const float *dout, const int32_t *inputs, int B,
                                  int T);
    void *embed_lookup_ctx;
} loom_gpt;
enum {
    LOOM_GPT_UNIT_GRADS,
    LOOM_GPT_UNIT_GRADS_DONE,
    LOOM_GPT_UNIT_PARAMS_FORWARD,  /* before a forward reads block unit u's parameters */
    LOOM_GPT_UNIT_PARAMS_BACKWARD, /* before a backward (fused or B) reads them */
    LOOM_GPT_UNIT_PARAMS_DONE,     /* after that pass is done with them */
    LOOM_GPT_UNIT_PROGRESS         /* between a block's GEMMs (unit -1): communication may move */
};
/* Installs (NULL: removes) the unit event hook. */
void loom_gpt_set_unit_events(loom_gpt *model, void (*unit_event)(void *ctx, int unit, int event),
                              void *ctx);
/* Installs (NULL: removes) the embedding lookup hooks, forward and backward (used without
 * tensor parallelism only). */
void loom_gpt_set_embed_lookup(
    loom_gpt *model, void (*lookup)(void *ctx, float *out, const int32_t *inputs, int B, int T),
    void (*lookup_backward)(void *ctx, const float *dout, const int32_t *inputs, int B, int T),
    void *ctx);
/* Frees the flat gradient buffer (grads_memory NULL, grads' pointers NULL): for a caller that
 * points every unit's gradients at buffers of its own (ZeRO-2/3) before the next backward. */
void loom_gpt_drop_grads(loom_gpt *model);

/* Points every unit back at params_memory and grads_memory (where creation puts them). */
void loom_gpt_units_reset(loom_gpt *model);
/* The unit holding local layer `layer`'s block (1 + layer); 0 and num_units - 1 are the
 * embeddings' and the final LayerNorm's. */
static inline int loom_gpt_block_unit(int layer) {
    return 1 + layer;
}

/* Allocates parameters and gradients (zeroed) for `config` (checked). */
loom_status loom_gpt_create(loom_gpt **model, const loom_gpt_config *config,
                            const loom_backend *backend);
/* One tensor-parallel rank's shard of the model; tp must divide heads and the padded
 * vocabulary, and tp_comm (size tp) carries the forward and backward allreduces. */
loom_status loom_gpt_create_tp(loom_gpt **model, const loom_gpt_config *config,
                               const loom_backend *backend, int tp_size, int tp_rank,
                               loom_comm *tp_comm);
/* Which part of the model a process holds. */
typedef struct {
    int first_layer, end_layer; /* [first, end): the one chunk when num_chunks is 0 */
    int tp_size, tp_rank;
    loom_comm *tp_comm;    /* NULL when tp_size == 1 */
    int sequence_parallel; /* over the tp ranks (tp > 1); see loom_gpt.sequence_parallel */
    /* 0: one chunk, the pipeline stage [first_layer, end_layer) (non-empty) with the embedding
     * when it starts at layer 0 and the head when it ends at the last; else chunks[0 ..
     * num_chunks) and first_layer, end_layer unused. Chunks are ascending and do not overlap;
     * at most one has the embedding (starting at 0), at most one the head (ending at L). */
    int num_chunks;
    loom_gpt_chunk chunks[LOOM_GPT_MAX_CHUNKS];
    /* ZeRO: `windowed` keeps only the parameters at flat offsets [params_begin, params_end)
     * (params_memory then holds that window, and the units' parameters are the caller's to
     * point at: ZeRO-3); no_grads allocates no flat gradient buffer (ZeRO-2/3: the caller points
     * the units' gradients at buffers of its own). */
    int windowed;
    size_t params_begin, params_end;
    int no_grads;
} loom_gpt_shard;
loom_status loom_gpt_create_shard(loom_gpt **model, const loom_gpt_config *config,
                                  const loom_backend *backend, const loom_gpt_shard *shard);
/* Fills a loom_gpt's layout fields (config, shard, info, num_params) without allocating:
 * enough to map another rank's shard (loom_gpt_global_index). */
loom_status loom_gpt_describe(loom_gpt *model, const loom_gpt_config *config,
                              const loom_gpt_shard *shard);

/* Rows of the residual stream this rank holds for a micro-batch of B x T: B*T, or B*T/tp under
 * sequence parallelism (then B*T must divide by tp: loom_gpt_reserve_slots refuses it else).
 * A stage's input, output and their gradients are (rows, C). */
int64_t loom_gpt_rows(const loom_gpt *model, int B, int T);

/* Pipeline stages. Activations for `slots` micro-batches in flight at once; loom_gpt_use_slot
 * picks the set the next forward/backward works on. Keeps an earlier reservation that is large
 * enough (a split one included). */
loom_status loom_gpt_reserve_slots(loom_gpt *model, int B, int T, int slots);
void loom_gpt_use_slot(loom_gpt *model, int slot);
/* Bytes of the activation sets and backward scratch reserved now. */
size_t loom_gpt_activation_bytes(const loom_gpt *model);
/* This stage's forward: from tokens on the embedding stage, else from input (B,T,C); the
 * head stage returns the mean loss (targets required there), others 0. */
float loom_gpt_forward_stage(loom_gpt *model, const int32_t *inputs, const float *input,
                             const int32_t *targets, int B, int T);
/* The residual stream after this stage's last block (B,T,C), for the next stage. */
const float *loom_gpt_stage_output(loom_gpt *model);
/* This stage's backward: the head stage starts from the loss (output_grad NULL), others from
 * the gradient of their output (B,T,C). */
void loom_gpt_backward_stage(loom_gpt *model, float dloss, const float *output_grad);
/* The gradient of this stage's input (B,T,C), for the previous stage: valid after the stage's
 * backward (or B), until the next backward or B on any slot. */
const float *loom_gpt_stage_input_grad(const loom_gpt *model);

/* Split backward (zero-bubble pipelines, Qi et al. 2024): B, the input gradients that the
 * previous stage waits for, and W, the weight gradients that can wait, each run on its own for
 * the micro-batch in the current slot. B then W of a slot gives the same bits as
 * loom_gpt_backward_stage. Slots must be reserved split: each slot then also keeps, from B until
 * its W, the output gradients of every block's GEMMs (loom_gpt_acts.dfcproj ... dencoded). */
loom_status loom_gpt_reserve_slots_split(loom_gpt *model, int B, int T, int slots, int split);
/* What a reservation asks for, all of it: the micro-batch, the sets in flight, whether B and W run
 * apart, and selective recomputation (Korthikanti et al. 2022): keep every activation but the
 * attention's softmax probabilities (B, NH/tp, T, T) per layer, which backward (fused, or B)
 * recomputes from the kept qkv with the forward's kernel, so the gradients are the same bits. An
 * earlier reservation that keeps at least as much (a non-selective one for a selective caller
 * included) is kept. */
typedef struct {
    int B, T;
    int slots;
    int split;
    int selective;
} loom_gpt_slots_spec;
loom_status loom_gpt_reserve_slots_spec(loom_gpt *model, const loom_gpt_slots_spec *spec);
/* B for the current slot's micro-batch: the head's softmax and the LM head's input gradient,
 * every block's input-gradient GEMMs, attention and GELU backward, all LayerNorm backward (their
 * weight and bias gradients too: they come out of the same kernel), and the tensor-parallel
 * allreduces; leaves loom_gpt_stage_input_grad. Arguments as loom_gpt_backward_stage. */
void loom_gpt_backward_input(loom_gpt *model, float dloss, const float *output_grad);
/* W for the current slot's micro-batch, whose B must have run (B of other slots may have run
 * since): the blocks' GEMM weight and bias gradients, the LM head's and the embedding's. The
 * grads_ready hook fires from here, at the offsets and in the order of the fused backward; it
 * speaks for this micro-batch's backward only. */
void loom_gpt_backward_weight(loom_gpt *model);

/* Logical (llm.c-order, unsharded) index of local element `index` of tensor k. */
int64_t loom_gpt_global_index(const loom_gpt *model, int k, int64_t index);
/* The model's layer that is this rank's local layer `local` (0 <= local < num_local_layers). */
int loom_gpt_global_layer(const loom_gpt *model, int local);
/* This rank's local layer for the model's layer `layer`; -1 when the rank does not hold it. */
int loom_gpt_local_layer(const loom_gpt *model, int layer);

/* ==== Chunks (virtual pipeline stages) =======================================================
 * A rank with several chunks runs each on its own: a chunk's forward, backward (fused, or B and
 * W apart) for one micro-batch. An activation slot holds one chunk's activations for one
 * micro-batch (sized for the rank's largest chunk; the head's buffers when the rank has the head
 * chunk), so the caller gives each (chunk, micro-batch) in flight its own slot with
 * loom_gpt_use_slot, and runs every function below on the slot of its forward. A micro-batch's
 * chunks run backward in reverse virtual-stage order (the pipeline's dependencies see to it).
 * The stage functions above are these for chunk 0. */

/* Chunk `chunk`'s forward: from tokens when it has the embedding, else from input (B,T,C);
 * returns the mean loss when it has the head (targets required there), else 0. */
float loom_gpt_forward_chunk(loom_gpt *model, int chunk, const int32_t *inputs, const float *input,
                             const int32_t *targets, int B, int T);
/* The residual stream after the chunk's last block (its input when it has none) (B,T,C). */
const float *loom_gpt_chunk_output(loom_gpt *model, int chunk);
/* The chunk's backward, fused: from the loss (head chunk, output_grad NULL) or the gradient of
 * its output (B,T,C). grads_ready fires after each of its blocks, and with 0 at the end of
 * chunk 0 (the rank's lowest: after it, nothing of the micro-batch's backward is left here). */
void loom_gpt_backward_chunk(loom_gpt *model, int chunk, float dloss, const float *output_grad);
/* The chunk's B and W (loom_gpt_backward_input, loom_gpt_backward_weight): the same contract per
 * chunk; W of a (chunk, micro-batch) must follow its B, on the same slot. */
void loom_gpt_backward_chunk_input(loom_gpt *model, int chunk, float dloss,
                                   const float *output_grad);
void loom_gpt_backward_chunk_weight(loom_gpt *model, int chunk);
/* What the chunk's B leaves in the current slot for its W (the GEMMs' output gradients, the
 * embedding's, the head's logit gradient), for a caller that must reuse the slot in between
 * (recomputation under a zero-bubble schedule: save after B; at W, rerun the forward, load, W).
 * The size is for micro-batches of B x T; save and load move the current shape's. Slots must be
 * reserved split. */
size_t loom_gpt_weight_state_floats(loom_gpt *model, int chunk, int B, int T);
void loom_gpt_weight_state_save(loom_gpt *model, int chunk, float *dst);
void loom_gpt_weight_state_load(loom_gpt *model, int chunk, const float *src);
/* The gradient of the chunk's input (B,T,C) after its backward or B, for the previous virtual
 * stage; valid until the next backward or B on this model (loom_gpt_stage_input_grad). */
const float *loom_gpt_chunk_input_grad(const loom_gpt *model);
/* ==== end of chunks ========================================================================== */
void loom_gpt_free(loom_gpt *model);

/* GPT-2 initialisation from a seed: N(0, 0.02), output projections N(0, 0.02/sqrt(2L)),
 * LayerNorm weights 1, biases 0, padded vocabulary rows 0. Element (tensor k, index i) is
 * drawn from the counter-based RNG at (seed, k, i), so shards can be made independently: it
 * fills the rank's window of params_memory (ZeRO-3: its shard). */
void loom_gpt_init_weights(loom_gpt *model, uint64_t seed);

/* Sizes the activation buffers for micro-batch B and sequence T (T <= max_seq_len). */
loom_status loom_gpt_reserve(loom_gpt *model, int B, int T);

/* Forward pass of the whole model for inputs (B,T). With targets, returns the mean loss over
 * the tokens whose target is >= 0 (and keeps the probabilities for backward); without
 * targets (NULL), leaves the logits in acts.probs and returns 0. */
float loom_gpt_forward(loom_gpt *model, const int32_t *inputs, const int32_t *targets, int B,
                       int T);

/* Backward pass of the last forward (which must have had targets), ACCUMULATING into the
 * gradients; dloss is the weight of each token's loss in the objective (1/(tokens in the
 * global batch) for a mean). */
void loom_gpt_backward(loom_gpt *model, float dloss);

void loom_gpt_zero_grad(loom_gpt *model);

/* Sets (or, with NULL, clears) the hook backward calls whenever more gradients are final (see
 * loom_gpt.grads_ready). */
void loom_gpt_set_grads_ready(loom_gpt *model, void (*grads_ready)(void *ctx, size_t ready_offset),
                              void *ctx);

/* Model FLOPs per token for training at sequence length T: 6N + 6LCT, N the parameter count
 * without the padded vocabulary rows (the standard MFU numerator); with an untied LM head (whose
 * GEMM N counts) without the input embedding too, a lookup (PaLM's count). */
int64_t loom_gpt_num_real_params(const loom_gpt_config *config);
double loom_gpt_flops_per_token(const loom_gpt_config *config, int T);

/* ==== Cost facts (src/model/cost.c) =========================================================
 * What one tensor-parallel rank of a part of the model costs for one micro-batch of B sequences
 * of T tokens: FLOPs, bytes held, activation bytes kept for backward, and the tensor-parallel
 * allreduces. The planner reads these instead of restating the model's formulas; nothing here
 * allocates a model or communicates.
 *
 * FLOPs count GEMMs only, 2*m*n*k each; attention's QK^T and AV over the full T x T, as
 * Megatron counts them (the causal kernels skip about half). Left out, being O(B*T*C) against
 * the GEMMs' O(B*T*C^2): LayerNorm, GELU, the softmaxes (attention and cross-entropy), bias
 * and residual adds, the embedding lookup, and the AdamW update. Backward is the input-gradient
 * GEMMs (dX = dY W, and attention's dQ, dK, dA, dV: zero-bubble's B part) plus the
 * weight-gradient GEMMs (dW = dY^T X: the W part); each is as large as its forward GEMM, so
 * backward is exactly twice forward.
 * Tensor-parallel traffic is counted as allreduce calls and their payload (the bytes of the
 * buffer being summed; a ring sends 2(tp-1)/tp of it from each rank); none when tp == 1.
 * Bytes are fp32 (4 per element) unless a field says int32. */

/* One part of the model on one TP rank, per micro-batch. */
typedef struct {
    int64_t flops_fwd;         /* FLOPs: forward GEMMs */
    int64_t flops_bwd_input;   /* FLOPs: backward's input-gradient GEMMs */
    int64_t flops_bwd_weight;  /* FLOPs: backward's weight-gradient GEMMs */
    int64_t param_bytes;       /* bytes: this rank's shard of the parameters the part uses */
    int64_t act_bytes;         /* bytes: activations kept for backward, the part's share of a
                                * slot (loom_gpt_reserve_slots) before per-buffer rounding */
    int64_t act_bytes_split;   /* bytes: what a split backward's B keeps for W on top of
                                * act_bytes (loom_gpt_reserve_slots_split), per micro-batch */
    int64_t tp_allreduces_fwd; /* count: allreduces in the TP group during forward */
    int64_t tp_bytes_fwd;      /* bytes: their payload, summed */
    int64_t tp_allreduces_bwd; /* count: ... during backward */
    int64_t tp_bytes_bwd;      /* bytes: their payload, summed */
} loom_gpt_part_cost;

/* One transformer block: params 12C^2/tp + 7C/tp + 6C (the split weights and biases, the
 * replicated LayerNorms and row-parallel biases); activations (B,T) x (6C + 12C/tp + 4) +
 * (B, NH/tp, T, T), and (B,T) x (2C + 7C/tp) more for a split backward; allreduces of (B,T,C)
 * after attention-out and MLP-down in forward, and of the (B,T,C) input gradients of QKV and
 * MLP-up in backward. The config is checked; tp must divide the heads and the padded
 * vocabulary, 1 <= T <= max_seq_len, B >= 1. */
loom_status loom_gpt_cost_block(const loom_gpt_config *config, int tp, int B, int T,
                                loom_gpt_part_cost *cost);
/* The embedding: wte rows Vp/tp and wpe; the stage input (B,T,C) `encoded` (and its gradient
 * for a split backward); no GEMM; forward allreduces the (B,T,C) embedding output, backward
 * nothing. */
loom_status loom_gpt_cost_embedding(const loom_gpt_config *config, int tp, int B, int T,
                                    loom_gpt_part_cost *cost);
/* The head: final LayerNorm, tied LM head (wte's Vp/tp rows; the same tensor the embedding
 * counts) and the loss; the GEMM (B*T, C) x (C, Vp/tp); activations lnf (B,T,C), probs
 * (B,T,Vp/tp) and (B,T) x 6 statistics (nothing more for a split backward); forward allreduces
 * row max (B,T) and [sum exp, target logit] (2,B,T), backward the (B,T,C) gradient of lnf. */
loom_status loom_gpt_cost_head(const loom_gpt_config *config, int tp, int B, int T,
                               loom_gpt_part_cost *cost);

/* A pipeline stage on one TP rank, as the planner would lay it out. */
typedef struct {
    int tp;                     /* tensor-parallel degree */
    int first_layer, end_layer; /* the stage's blocks [first_layer, end_layer), non-empty */
    int has_embedding;          /* must be first_layer == 0 (the model decides it so) */
    int has_head;               /* must be end_layer == num_layers */
    int B, T;                   /* micro-batch: sequences, tokens per sequence */
    int in_flight;              /* micro-batches whose activations are live at once (>= 1;
                                 * 1F1B: stages after this one, plus one) */
    int recompute;              /* keep only each micro-batch's input, rerun forward before
                                 * its backward */
    int selective;              /* keep everything but the attention's softmax (B, NH/tp, T, T),
                                 * recomputed in backward (LOOM_RECOMPUTE_SELECTIVE) */
    int sequence_parallel;      /* Megatron's sequence parallelism over the tp ranks */
} loom_gpt_stage_spec;

typedef struct {
    /* compute, per micro-batch */
    int64_t flops_fwd;        /* FLOPs: blocks + head (the embedding has no GEMM) */
    int64_t flops_bwd_input;  /* FLOPs: input-gradient GEMMs */
    int64_t flops_bwd_weight; /* FLOPs: weight-gradient GEMMs */
    int64_t flops_bwd;        /* FLOPs: input + weight = 2 * flops_fwd */
    int64_t flops_recompute;  /* FLOPs: the forward rerun before backward (= flops_fwd with
                               * recompute, else 0; the schedule decides whether a micro-batch
                               * needs it: 1F1B's last stage runs backward right after forward) */
    /* memory on this rank */
    int64_t param_bytes;          /* bytes: the shard's flat buffer, num_params fp32: its blocks,
                                   * wte on the first and last stage, wpe on the first, lnfw and
                                   * lnfb on the last (loom_gpt_layout_shard) */
    int64_t grad_bytes;           /* bytes: gradients, as many as parameters */
    int64_t optimizer_bytes;      /* bytes: AdamW m and v (2, num_params) fp32, before ZeRO-1
                                   * divides them by the data-parallel degree */
    int64_t act_slot_bytes;       /* bytes: one activation set as loom_gpt_reserve_slots allocates
                                   * it: slot_floats fp32 (every stage's slot has the embedding
                                   * output, its input; only the head stage's has the head's
                                   * buffers) + inputs and targets (2, B, T) int32 */
    int64_t act_slot_token_bytes; /* bytes: the (2, B, T) int32 part of act_slot_bytes */
    int64_t act_slot_split_bytes; /* bytes: what a slot grows by when B and W run apart
                                   * (loom_gpt_reserve_slots_split): what W needs, kept from B */
    int64_t act_bytes_keep;       /* bytes: in_flight slots (no recomputation) */
    int64_t act_bytes_recompute;  /* bytes: one slot + in_flight stage inputs
                                   * (in_flight, rows, C) fp32 (rows: B*T, or B*T/tp under
                                   * sequence parallelism) */
    int64_t act_bytes;            /* bytes: the one of the two that spec.recompute picks */
    int64_t grad_scratch_bytes;   /* bytes: backward scratch, one per stage: (14, B, T, C)
                                   * fp32 (full C even under TP: gpt.c allocates it so), + (4, C)
                                   * under sequence parallelism */
    int64_t total_bytes;          /* bytes: param + grad + optimizer + act + grad_scratch (not the
                                   * trainer's pipeline buffers, DP buckets or LOOM_GPT_PAD_FLOATS) */
    /* tensor-parallel allreduces, per micro-batch */
    int64_t tp_allreduces_fwd, tp_bytes_fwd;             /* count; payload bytes */
    int64_t tp_allreduces_bwd, tp_bytes_bwd;             /* count; payload bytes */
    int64_t tp_allreduces_recompute, tp_bytes_recompute; /* the rerun forward's; 0 without */
    /* sequence parallelism (spec.sequence_parallel) replaces most allreduces above by
     * all-gathers and reduce-scatters over the tp group: count, and bytes of the whole (gathered
     * or reduced, B x T rows) buffer of each; an all-gather or a reduce-scatter of n bytes moves
     * half what an allreduce of n bytes does */
    int64_t tp_shards_fwd, tp_shard_bytes_fwd;
    int64_t tp_shards_bwd, tp_shard_bytes_bwd;
    int64_t tp_shards_recompute, tp_shard_bytes_recompute;
    int64_t flops_selective; /* FLOPs: the attention core (QK^T, softmax, x V) rerun in backward
                              * by selective recomputation (spec.selective), else 0 */
    /* the attention core's share, for a planner pricing a fused kernel (FlashAttention) that
     * keeps no softmax and recomputes QK^T in its backward */
    int64_t flops_attention; /* FLOPs: every block's forward QK^T and AV, per micro-batch */
    int64_t softmax_bytes;   /* bytes: the (B, NH/tp, T, T) softmaxes a forward writes (every
                              * block's, whether the slot keeps them or not) */
    /* pipeline point-to-point, per micro-batch (under sequence parallelism each TP rank sends
     * its own B*T/tp rows) */
    int64_t pp_act_bytes;  /* bytes: output (B,T,C) fp32 sent to the next stage; 0 on the last */
    int64_t pp_grad_bytes; /* bytes: input gradient (B,T,C) fp32 sent back; 0 on the first */
} loom_gpt_stage_cost;

/* Totals for a stage; checks the spec (names the field it refuses) and that no total
 * overflows int64. */
loom_status loom_gpt_cost_stage(const loom_gpt_config *config, const loom_gpt_stage_spec *spec,
                                loom_gpt_stage_cost *cost);
/* ==== end of cost facts ====================================================================== */

#ifdef __cplusplus
}
#endif
#endif /* LOOM_MODEL_H */
