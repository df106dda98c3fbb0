/*
 * checkpoint.h — GPT weights as Hugging Face safetensors, and training checkpoints.
 * (Declarations move into loom/io.h once that header settles; kept here meanwhile.)
 */
#ifndef LOOM_IO_CHECKPOINT_H
#define LOOM_IO_CHECKPOINT_H

#include "loom/io.h"
#include "loom/model.h"

/* What a training checkpoint carries beside the weights and AdamW moments. */
typedef struct {
    int64_t step;        /* optimizer steps completed */
    uint64_t data_epoch; /* train loader position */
    uint64_t data_index;
    uint64_t rng_state;    /* the run's sequential RNG */
    int64_t bad_steps;     /* consecutive skipped steps so far */
    int64_t skipped_total; /* all skipped steps so far */
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
/* The same, for a model no process holds whole: `layout` describes the unsharded model
 * (loom_gpt_describe), and fill(ctx, buffer, tensor, layer) returns one slice at a time —
 * buffer 0 the parameters, 1 exp_avg, 2 exp_avg_sq; tensor LOOM_WTE...; layer -1 for the
 * global tensors — in the unsharded layout of that slice (info[tensor].layer_numel floats),
 * valid until the next call; NULL after loom_fail. Slices are asked for in file order:
 * every tensor of buffer 0, then of 1, then of 2. */
typedef const float *(*loom_ckpt_fill)(void *ctx, int buffer, int tensor, int layer);
loom_status loom_checkpoint_save_fill(const char *out_dir, const loom_gpt *layout,
                                      loom_ckpt_fill fill, void *ctx, const loom_ckpt_state *state);

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

/* Finds the checkpoint folder for PATH: a step folder, a checkpoints/ folder or a run folder
 * (through its "latest" pointer). */
loom_status loom_checkpoint_resolve(const char *path, char *dir, size_t cap);
/* Loads weights, moments and state from a step folder into an existing model. */
loom_status loom_checkpoint_load(const char *dir, loom_gpt *model, float *m, float *v,
                                 loom_ckpt_state *state);

#endif
