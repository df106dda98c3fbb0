/*
 * loom/io.h — model files users already have: safetensors (Hugging Face) and llm.c's fp32
 * model checkpoint (magic 20240326, version 3).
 *
 * safetensors: an opened file is validated in full before anything else happens (header
 * length, JSON, dtypes, shapes, offsets covering the buffer exactly); tensors are then read one
 * at a time from the open file, so a model is never held twice in memory. Writing produces F32
 * files only, streamed and atomic (temporary file + rename).
 *
 * llm.c: the header is checked against the file size before any parameter is read; the
 * parameters are one flat float array in llm.c's order (see loom_llmc_tensor_sizes).
 *
 * GPT weights as Hugging Face safetensors, training checkpoints (whole or streamed slice by
 * slice, for models no process holds whole), and loading a model from any of these files.
 *
 * Not here: dtype conversion beyond BF16 widened on read (F32 otherwise);
 * bf16 llm.c checkpoints (version 5); memory mapping. A loom_safetensors handle is not
 * thread-safe: one reader at a time.
 */
#ifndef LOOM_IO_H
#define LOOM_IO_H

#include "loom/base.h"
#include "loom/model.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ------------------------------------------------------------------------------ */

typedef enum {
    LOOM_DTYPE_BOOL,
    LOOM_DTYPE_U8,
    LOOM_DTYPE_I8,
    LOOM_DTYPE_I16,
    LOOM_DTYPE_U16,
    LOOM_DTYPE_F16,
    LOOM_DTYPE_BF16,
    LOOM_DTYPE_I32,
    LOOM_DTYPE_U32,
    LOOM_DTYPE_F32,
    LOOM_DTYPE_F64,
    LOOM_DTYPE_I64,
    LOOM_DTYPE_U64
} loom_dtype;

/* The safetensors spelling ("F32", "BF16", ...); "?" for a value outside the enum. */
const char *loom_dtype_name(loom_dtype dtype);
/* Bytes per element; 0 for a value outside the enum. */
size_t loom_dtype_size(loom_dtype dtype);

/* ---- safetensors: reading ---------------------------------------------------------------- */

#define LOOM_ST_MAX_DIMS 8
/* The reader refuses header lengths above this (as the reference implementation does). */
#define LOOM_ST_MAX_HEADER 100000000ULL

typedef struct {
    char *name;
    loom_dtype dtype;
    int ndim;
    int64_t shape[LOOM_ST_MAX_DIMS];
    uint64_t begin, end; /* byte offsets in the data buffer, end exclusive */
} loom_st_entry;

/* An open, fully validated file. Entries are numbered in the order of their data in the
 * buffer (which is the writer's order for files loom wrote). */
typedef struct loom_safetensors loom_safetensors;

/* Opens and validates `path`; every problem is LOOM_ERR_INPUT with a message naming the path,
 * the field or tensor, and what was expected. *st is NULL on failure. */
loom_status loom_safetensors_open(loom_safetensors **st, const char *path);
void loom_safetensors_close(loom_safetensors *st);
int loom_safetensors_count(const loom_safetensors *st);
/* NULL when index is out of range. */
const loom_st_entry *loom_safetensors_entry(const loom_safetensors *st, int index);
/* NULL when absent (binary search over the names). */
const loom_st_entry *loom_safetensors_find(const loom_safetensors *st, const char *name);
/* A value of "__metadata__"; NULL if absent. */
const char *loom_safetensors_metadata(const loom_safetensors *st, const char *key);

/* Reads tensor `name` into dst as float32. The stored tensor must exist, be F32 or BF16 (widened:
 * exact), and have exactly the shape given (ndim, shape). If transpose is non-zero the tensor must
 * be 2-D and dst receives it transposed: stored (shape[0], shape[1]) row-major -> dst (shape[1],
 * shape[0]) row-major. Transposition goes through a bounded scratch buffer (about 1 MiB or one
 * stored row). */
loom_status loom_safetensors_read_f32(loom_safetensors *st, const char *name, int ndim,
                                      const int64_t *shape, int transpose, float *dst);

/* ---- safetensors: writing ---------------------------------------------------------------- */

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[LOOM_ST_MAX_DIMS]; /* the shape as stored in the file */
    const float *data;
    int transpose; /* 2-D only: data in memory is (shape[1], shape[0]); written transposed */
} loom_st_tensor;

/* Writes an F32 safetensors file atomically (loom_atomic_open/commit). metadata: `meta_count`
 * key/value pairs as meta[2*i], meta[2*i+1] (may be 0/NULL). Tensors are laid out in the order
 * given; header padded with spaces to a multiple of 8 bytes. Stream the data (no full copy of
 * the model in memory; transposition in bounded chunks). Bad arguments (duplicate or reserved
 * names, bad shapes, invalid UTF-8) are LOOM_ERR_INPUT; write failures LOOM_ERR_IO. */
/* The same, with each tensor's data supplied just before it is written: fill(ctx, i) returns
 * tensor i's data (in memory layout, as `data` would be; valid until the next call), or NULL
 * after recording an error. The table's data pointers are then ignored, so a writer never needs
 * more than one tensor in memory. */
typedef const float *(*loom_st_fill)(void *ctx, int index);
loom_status loom_safetensors_write_fill(const char *path, const loom_st_tensor *tensors, int count,
                                        const char *const *meta, int meta_count, loom_st_fill fill,
                                        void *ctx);
loom_status loom_safetensors_write(const char *path, const loom_st_tensor *tensors, int count,
                                   const char *const *meta, int meta_count);

/* ---- llm.c model checkpoint -------------------------------------------------------------- */

/* int32[256] header, magic 20240326, version 3 = fp32 (see REFERENCE.md). */
#define LOOM_LLMC_MAGIC        20240326
#define LOOM_LLMC_VERSION_FP32 3
#define LOOM_LLMC_HEADER_BYTES 1024
#define LOOM_LLMC_NUM_TENSORS  16

typedef struct {
    int max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size;
} loom_llmc_header;

/* Total parameters in llm.c's order, padded vocab; 0 when a size is not positive or the count
 * overflows size_t. */
size_t loom_llmc_param_count(const loom_llmc_header *h);
/* Element counts of llm.c's 16 tensors in file order: wte (Vp,C), wpe (maxT,C), ln1w (L,C),
 * ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C), attprojb (L,C), ln2w (L,C),
 * ln2b (L,C), fcw (L,4C,C), fcb (L,4C), fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C).
 * Returns 0 (sizes zeroed) under the same conditions as loom_llmc_param_count, else 1. */
int loom_llmc_tensor_sizes(const loom_llmc_header *h, size_t sizes[LOOM_LLMC_NUM_TENSORS]);
/* "wte", "wpe", "ln1w", ... ; NULL outside 0..15. */
const char *loom_llmc_tensor_name(int index);

/* Reads and validates the header, including that the file is exactly 1024 + 4*count bytes. */
loom_status loom_llmc_read_header(const char *path, loom_llmc_header *h);
/* Reads all parameters (count floats, must equal loom_llmc_param_count) into dst. The file's
 * header must equal *h. */
loom_status loom_llmc_read_params(const char *path, const loom_llmc_header *h, float *dst,
                                  size_t count);
/* Reads the parameters one slice at a time, in file order: fn(ctx, tensor, layer, slice) gets
 * each tensor (0..15, llm.c's order, which is LOOM_WTE...'s) whole for wte, wpe, lnfw, lnfb
 * (layer -1) and one layer at a time for the others; slice is valid until the next call. The
 * file's header must equal *h. Never holds more than one slice. */
typedef loom_status (*loom_llmc_slice_fn)(void *ctx, int tensor, int layer, const float *slice);
loom_status loom_llmc_read_slices(const char *path, const loom_llmc_header *h,
                                  loom_llmc_slice_fn fn, void *ctx);
/* Writes a version-3 checkpoint atomically; count must equal loom_llmc_param_count(h). */
loom_status loom_llmc_write(const char *path, const loom_llmc_header *h, const float *params,
                            size_t count);

/* ---- GPT weights and training checkpoints ------------------------------------------------ */

/* What a training checkpoint carries beside the weights and AdamW moments. */
typedef struct {
    int64_t step;        /* optimizer steps completed */
    uint64_t data_epoch; /* train loader position */
    uint64_t data_index;
    uint64_t rng_state;    /* the run's sequential RNG */
    int64_t bad_steps;     /* consecutive skipped steps so far */
    int64_t skipped_total; /* all skipped steps so far */
    /* the compressor state saved beside the checkpoint (metadata "loom.compress"): which
     * per-rank files there are and the layout and compression they belong to; "" when none */
    char compress[512];
    /* the tokenizer the model was trained with, written to model.safetensors' metadata as
     * "loom.tokenizer" ("bytes" or "gpt2") and "loom.tokenizer_source" (the files it was read
     * from, an absolute path); "" when unknown (neither key is written) */
    char tokenizer[16];
    char tokenizer_source[1024];
    /* an islands checkpoint (metadata "loom.islands": the islands and the layout it belongs
     * to; "" for any other): its state file holds the outer momentum, tensors
     * "outer_momentum.NAME", where AdamW's moments would be (each island's own checkpoint lies
     * in the folder's island_K/); a fill for it is asked for buffers 0 and 1 only */
    char islands[256];
} loom_ckpt_state;

/* Weights as safetensors with Hugging Face GPT-2 names and Conv1D (in, out) orientation; the
 * unpadded vocabulary; the model configuration in the metadata (key "loom.config"). */
loom_status loom_gpt_save_safetensors(const char *path, const loom_gpt *model);
/* Model configuration of a safetensors file: from loom's metadata when present, otherwise
 * from the tensor shapes (heads = width / 64, as in every GPT-2 size). */
loom_status loom_gpt_config_from_safetensors(const char *path, loom_gpt_config *config);
/* Loads weights into a model of matching configuration (names with a "transformer." prefix
 * accepted); a missing tensor or a wrong shape or dtype is LOOM_ERR_INPUT naming it. */
loom_status loom_gpt_load_safetensors(const char *path, loom_gpt *model);

/* Writes OUT/checkpoints/step_NNNNNNNN/{model,state}.safetensors, then points
 * OUT/checkpoints/latest at it; the pointer moves only after both files are on disk. */
loom_status loom_checkpoint_save(const char *out_dir, const loom_gpt *model, const float *m,
                                 const float *v, const loom_ckpt_state *state);
/* The same with the parameters from `params` (in the model's flat layout) rather than the
 * model's own buffer: a caller that keeps them elsewhere (ZeRO-3's gathered shards). */
loom_status loom_checkpoint_save_params(const char *out_dir, const loom_gpt *model,
                                        const float *params, const float *m, const float *v,
                                        const loom_ckpt_state *state);
/* The same, for a model no process holds whole: `layout` describes the unsharded model
 * (loom_gpt_describe), and fill(ctx, buffer, tensor, layer) returns one slice at a time —
 * buffer 0 the parameters, 1 exp_avg, 2 exp_avg_sq; tensor LOOM_WTE...; layer -1 for the
 * global tensors — in the unsharded layout of that slice (info[tensor].layer_numel floats),
 * valid until the next call; NULL after loom_fail. Slices are asked for in file order:
 * every tensor of buffer 0, then of 1, then of 2. */
typedef const float *(*loom_ckpt_fill)(void *ctx, int buffer, int tensor, int layer);
loom_status loom_checkpoint_save_fill(const char *out_dir, const loom_gpt *layout,
                                      loom_ckpt_fill fill, void *ctx, const loom_ckpt_state *state);

/* Writes {model,state}.safetensors into the folder `dir` (created), from bufs (params, m, v in
 * the model's flat layout) or, when bufs is NULL, slice by slice from fill, as
 * loom_checkpoint_save_fill; no pointer moves. */
loom_status loom_checkpoint_write(const char *dir, const loom_gpt *model, const float *const *bufs,
                                  loom_ckpt_fill fill, void *ctx, const loom_ckpt_state *state);
/* Points OUT/checkpoints/latest at step_NNNNNNNN (atomically). */
loom_status loom_checkpoint_point_latest(const char *out_dir, int64_t step);

/* The slices of a checkpoint file in file order (what fill and take see): tensors[i] and
 * layers[i] for i < the returned count (4 + 12 L; arrays that long); -1 when out of memory. */
int loom_checkpoint_slices(const loom_gpt_config *config, int *tensors, int *layers);

/* Reads a checkpoint slice by slice (same numbering as loom_ckpt_fill) for a model no process
 * holds whole: take(ctx, buffer, tensor, layer, slice) receives each slice of the unsharded
 * `layout` and keeps what it needs. */
typedef loom_status (*loom_ckpt_take)(void *ctx, int buffer, int tensor, int layer,
                                      const float *slice);
loom_status loom_checkpoint_load_take(const char *dir, const loom_gpt *layout, loom_ckpt_take take,
                                      void *ctx, loom_ckpt_state *state);
/* The weights of one safetensors model file (loom's or Hugging Face's) slice by slice, as
 * take(ctx, 0, tensor, layer, slice) in the unsharded `layout`: for a rank that holds part of
 * the model and starts from a file (--init-from). */
loom_status loom_gpt_load_safetensors_take(const char *path, const loom_gpt *layout,
                                           loom_ckpt_take take, void *ctx);

/* Finds the checkpoint folder for PATH: a step folder, a checkpoints/ folder or a run folder
 * (through its "latest" pointer). */
loom_status loom_checkpoint_resolve(const char *path, char *dir, size_t cap);
/* Loads weights, moments and state from a step folder into an existing model. */
loom_status loom_checkpoint_load(const char *dir, loom_gpt *model, float *m, float *v,
                                 loom_ckpt_state *state);

/* ---- Hugging Face model folders ----------------------------------------------------------- */

/* The config.json a checkpoint folder holds beside its weights: GPT2LMHeadModel's or
 * LlamaForCausalLM's fields for the configuration. NULL when out of memory; free() it. */
char *loom_hf_config_json(const loom_gpt_config *config);
/* One tensor of a checkpoint's model.safetensors, as Hugging Face names and shapes it. */
typedef struct {
    char name[64];
    int ndim;
    int64_t shape[2];
} loom_hf_tensor_shape;
/* Every tensor a checkpoint of the configuration holds, in file order (*count; free() *out). */
loom_status loom_hf_tensor_shapes(const loom_gpt_config *config, loom_hf_tensor_shape **out,
                                  int *count);

/* ---- loading a model from any file users have -------------------------------------------- */

/* The model configuration stored in PATH: a run folder, its checkpoints/ folder, one step
 * folder, a .safetensors file (loom or Hugging Face GPT-2), a Hugging Face GPT-2 folder
 * (config.json's n_layer, n_head, n_embd, n_positions, vocab_size; model.safetensors), or an
 * llm.c .bin. */
loom_status loom_model_config_of(const char *path, loom_gpt_config *config);
/* The weights of any of those, slice by slice, as take(ctx, 0, tensor, layer, slice) in the
 * unsharded `layout` (whose configuration the file must describe): for a rank that holds part
 * of the model and starts from a file; never more than one slice in memory. */
loom_status loom_model_load_take(const char *path, const loom_gpt *layout, loom_ckpt_take take,
                                 void *ctx);
/* The tokenizer PATH records (see loom_ckpt_state): name "bytes" or "gpt2" and its source; for
 * a Hugging Face model folder (or a .safetensors beside vocab.json / tokenizer.json) without
 * that metadata, "gpt2" and the folder. name "" when nothing says (llm.c .bin, older files). */
loom_status loom_model_tokenizer_of(const char *path, char *name, size_t name_cap, char *source,
                                    size_t source_cap);
/* Loads a model from any of those (the whole model, in one process). */
loom_status loom_model_load(const char *path, const loom_backend *backend, loom_gpt **model);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_IO_H */
