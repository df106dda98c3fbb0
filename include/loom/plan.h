/*
 * loom/plan.h — the plan: the contract between the planner and the runtime (DESIGN.md, "The
 * plan"). A plan says which model is trained with which batch, how the ranks form the
 * (dp, tp, pp) mesh, which layers each pipeline stage runs, what is compressed, and what the
 * planner predicted. It is written by `loom plan` and read by `loom train --plan FILE`.
 *
 * The file is JSON:
 *
 *   {
 *     "model":   {"layers": 12, "heads": 12, "d_model": 768, "context": 1024, "vocab": 50257},
 *     "batch":   {"global": 64, "micro": 4, "schedule": "1f1b"},
 *     "mesh":    {"dp": 2, "tp": 2, "pp": 2, "zero": 1},
 *     "stages":  [{"layers": [0, 5], "embedding": true, "recompute": "none"},
 *                 {"layers": [5, 12], "head": true, "recompute": "needed"}],
 *     "compression": {
 *       "dp": {"method": "powersgd", "rank": 4, "error_feedback": true, "warmup_steps": 0,
 *              "stages": [0]},
 *       "pp": {"method": "lowrank", "rank": 8, "lazy_error": true, "policy": "all",
 *              "forward": "none"},
 *       "embedding_sync": "fused"},
 *     "predicted": {"step_s": 0.0, "tokens_per_s": 0.0, "peak_bytes_per_rank": [0]}
 *   }
 *
 * "vocab" is the real vocabulary; the padded one (a multiple of 128) is derived from it.
 * A top-level "precision" ("fp32", "bf16" or "fp16"; left out: "fp32", and written only when it
 * is not) says what the planner planned for; this build trains fp32 and refuses the others.
 * "mesh.zero" (an integer 0-3) is the ZeRO stage over the data-parallel ranks: 0 none, 1 AdamW's
 * state sharded, 2 the gradients too, 3 the parameters too (fully sharded). Left out, it is
 * loom_plan_default_zero's; a file of older builds saying "zero1": true/false at the top level
 * reads as 1/0. With zero 3, "mesh.zero3_prefetch" (1) is how many units' gathers run ahead of
 * the one computing, and "mesh.zero3_gather" ("micro_batch") whether a unit is gathered for every
 * micro-batch or once per step ("step"); both are written only with zero 3.
 * "mesh.sequence_parallel" (false; requires tp > 1) is Megatron's sequence parallelism. A
 * top-level "islands" (left out: none) makes the world K islands of the mesh (loom_plan_islands):
 *     "islands": {"count": 4, "inner_steps": 100, "outer_optimizer": "nesterov",
 *                 "outer_lr": 0.7, "outer_momentum": 0.9, "fragments": 1, "overlap_steps": 0,
 *                 "compression": "int8"}
 * where every key but "count" may be left out (the defaults shown, compression "none"), and
 * "compression_rank" (4) goes with "compression": "powersgd", "compression_fraction" (0.01, the
 * share of each matrix's entries sent) with "topk".
 * A top-level "overlap_grad_reduce" (true/false; left out: true, and written only when false)
 * says whether the data-parallel gradient buckets start during the last backward (loom's way)
 * or after it (Megatron-LM's local DDP of 2021, and Megatron-core's default).
 * "predicted.seq_len" is the sequence length the prediction was made for.
 * Layer ranges are half-open. "compression" and "predicted" may be left out, and so may
 * "batch.schedule" ("1f1b"), a stage's "embedding"/"head" (true on the first/last stage only)
 * and "recompute" ("none"; "needed": as needed; "always": before every backward,
 * LOOM_RECOMPUTE_*; older files' false and true read as "none" and "needed").
 *
 * Virtual stages: with schedule "interleaved" or "zb-v" each pipeline rank runs v model chunks,
 * so "stages" lists all pp * v virtual stages in model order; "batch.virtual_stages" says v
 * (left out: 1, or 2 for "zb-v") and a stage's "rank" the pipeline rank that runs it (left out:
 * the schedule's placement, loom_plan_place, which it must equal when given; the chunk on that
 * rank is derived, never written). Both keys are written only when v > 1, so a plan with one
 * chunk per rank reads and writes as before virtual stages existed:
 *
 *     "batch":   {"global": 64, "micro": 4, "schedule": "interleaved", "virtual_stages": 2},
 *     "mesh":    {"dp": 2, "tp": 2, "pp": 2},
 *     "stages":  [{"layers": [0, 4], "rank": 0, "embedding": true, "recompute": false},
 *                 {"layers": [4, 7], "rank": 1, "recompute": false},
 *                 {"layers": [7, 10], "rank": 0, "recompute": false},
 *                 {"layers": [10, 12], "rank": 1, "head": true, "recompute": false}],
 *
 * In "compression", "dp", "pp" and "embedding_sync" ("separate") may be left out (a left-out
 * compressor is method "none"), and so may every compressor key but "method": "rank" (4 for
 * powersgd, 8 for lowrank, 0 and refused otherwise), "fraction" (0.01; topk only),
 * "error_feedback" (true), "warmup_steps" (0), "lazy_error" (true), "policy" ("all"), "forward"
 * ("none") and "stages" / "links" (all of them). "compression.dp" takes method, rank, fraction,
 * error_feedback, warmup_steps and stages (pipeline ranks); "compression.pp" takes method, rank,
 * fraction, lazy_error, policy, forward and links (boundaries between virtual stages). Every
 * other key is required, and unknown keys (a dp-only key under pp too) are errors.
 *
 * Ranks are laid out in Megatron's order: TP fastest, then DP, PP slowest, so
 * world_rank = tp_rank + tp * (dp_rank + dp * pp_rank).
 *
 * Not here: choosing a plan by cost (the planner), or executing one (parallel/, train/).
 */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include "loom/base.h"
#include "loom/compress.h"
#include "loom/model.h"

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The plan's words, as the runtime sees them: enums. Names exist only at the file and flag
 * edges (loom_plan_read/write, loom_plan_from_request, messages). */

/* batch.schedule: the pipeline schedule. */
typedef enum {
    LOOM_SCHEDULE_GPIPE,
    LOOM_SCHEDULE_1F1B,
    LOOM_SCHEDULE_INTERLEAVED,
    LOOM_SCHEDULE_ZB_H1,
    LOOM_SCHEDULE_ZB_V,
} loom_schedule_kind;
#define LOOM_SCHEDULE_NUM_KINDS 5
/* "gpipe", "1f1b", "interleaved", "zb-h1" or "zb-v"; anything else is LOOM_ERR_INPUT listing
 * them, naming `source` and `field`. */
loom_status loom_schedule_kind_parse(const char *name, const char *source, const char *field,
                                     loom_schedule_kind *kind);
/* The name loom_schedule_kind_parse reads back ("?" for a value out of range). */
const char *loom_schedule_kind_name(loom_schedule_kind kind);

/* compression.pp.policy: which backward sends of a compressing link compress. */
typedef enum {
    LOOM_PP_POLICY_ALL,      /* every one */
    LOOM_PP_POLICY_EPILOGUE, /* 1F1B's cool-down sends */
    LOOM_PP_POLICY_SLACK,    /* those whose simulated slack is below the time compression saves */
} loom_pp_policy;
#define LOOM_PP_POLICY_COUNT 3
const char *loom_pp_policy_name(loom_pp_policy policy); /* "all", "epilogue", "slack" */

/* mesh.zero3_gather: when ZeRO-3 gathers a unit's parameters. "micro_batch": before its forward
 * and again before its backward, for every micro-batch (freed in between: parameter memory /dp,
 * about 1.5 m x ZeRO-1's traffic for m micro-batches); "step": once per step, kept until the
 * step's last backward (ZeRO-1's parameter memory, ZeRO-2's traffic plus one all-gather). */
typedef enum { LOOM_ZERO3_GATHER_MICRO_BATCH, LOOM_ZERO3_GATHER_STEP } loom_zero3_gather;
#define LOOM_ZERO3_GATHER_COUNT 2
const char *loom_zero3_gather_name(loom_zero3_gather gather); /* "micro_batch", "step" */
#define LOOM_ZERO3_MAX_PREFETCH 8

/* compression.embedding_sync: how the tied embedding's two gradients meet. */
typedef enum { LOOM_EMBEDDING_SYNC_SEPARATE, LOOM_EMBEDDING_SYNC_FUSED } loom_embedding_sync;
#define LOOM_EMBEDDING_SYNC_COUNT 2
const char *loom_embedding_sync_name(loom_embedding_sync sync); /* "separate", "fused" */

/* The plan file's "recompute" word of a stage and its names: "none", "needed", "always",
 * "selective". */
const char *loom_recompute_name(int recompute);
/* LOOM_RECOMPUTE_* of a word ("none", "needed", "always", "selective"); -1 for anything else. */
int loom_recompute_parse(const char *word);

/* One (virtual) pipeline stage: the transformer blocks [first_layer, end_layer), plus the token
 * and position embedding on the first stage and the final LayerNorm, LM head and loss on the
 * last one. With v virtual stages per rank the plan lists all p v of them in model order, and
 * each says which pipeline rank runs it and as which of that rank's chunks (the schedule's
 * placement, loom_plan_place). */
/* A stage's recomputation (the plan file's "recompute": "none", "needed", "always", "selective"):
 *   LOOM_RECOMPUTE_NONE       every micro-batch in flight keeps its activation set
 *   LOOM_RECOMPUTE_AS_NEEDED  one activation set; a backward reruns its micro-batch's forward
 *                             unless that forward was the rank's last compute (the set is there)
 *   LOOM_RECOMPUTE_ALWAYS     one activation set; every backward reruns the forward first, as
 *                             Megatron-LM's full activation recomputation does (slower, the
 *                             same numbers; for comparing with runs that recompute so)
 *   LOOM_RECOMPUTE_SELECTIVE  every micro-batch in flight keeps its activation set but the
 *                             attention's softmax (the B x heads x T x T tensor), which backward
 *                             recomputes from the kept QKV (Korthikanti et al. 2022) */
enum {
    LOOM_RECOMPUTE_NONE = 0,
    LOOM_RECOMPUTE_AS_NEEDED = 1,
    LOOM_RECOMPUTE_ALWAYS = 2,
    LOOM_RECOMPUTE_SELECTIVE = 3
};
#define LOOM_RECOMPUTE_COUNT 4
/* Whether a stage reruns whole forwards (needed, always): one activation set per stage. */
static inline int loom_recompute_full(int recompute) {
    return recompute == LOOM_RECOMPUTE_AS_NEEDED || recompute == LOOM_RECOMPUTE_ALWAYS;
}

typedef struct {
    int first_layer, end_layer;
    int embedding, head; /* booleans */
    int recompute;       /* LOOM_RECOMPUTE_* */
    int rank, chunk;     /* pipeline rank in [0, pp), chunk in [0, virtual_stages) */
} loom_plan_stage;

/* One compressor (loom/compress.h has the methods). For data-parallel gradients: method "none",
 * "powersgd", "topk", "sign", "int8" or "bf16"; for the activation gradients between pipeline
 * stages: "none", "lowrank", "topk", "int8" or "bf16".
 *   rank            powersgd, lowrank (file default 4 for dp, 8 for pp; unused and 0 otherwise)
 *   fraction        topk: share of entries kept, in (0, 1] (default 0.01)
 *   error_feedback  dp, lossy methods: keep the residual (default true; sign requires it)
 *   warmup_steps    dp: the first steps are sent uncompressed (default 0)
 *   lazy_error      pp: Optimus-CC's lazy error propagation (default true)
 *   policy          pp: which backward sends compress: "all" (default), "epilogue" (1F1B's
 *                   cool-down sends) or "slack" (those whose simulated slack is below the time
 *                   compression saves)
 *   forward         pp: the forward activations' method: "none" (default), "bf16" or "int8"
 *   stages          dp: the pipeline ranks whose gradients compress ("stages" in the file; all
 *                   of a rank's chunks alike); pp: the links between virtual stages (link s
 *                   joins virtual stage s and s + 1; "links" in the file) whose backward sends
 *                   compress; num_stages == 0 (stages NULL) means all of them. */
#define LOOM_PLAN_DEFAULT_DP_RANK       4    /* powersgd */
#define LOOM_PLAN_DEFAULT_PP_RANK       8    /* lowrank */
#define LOOM_PLAN_DEFAULT_TOPK_FRACTION 0.01 /* topk, dp and pp */
typedef struct {
    loom_compress_method method;
    int rank;
    double fraction;
    int error_feedback;
    int warmup_steps;
    int lazy_error;
    loom_pp_policy policy;
    loom_compress_method forward;
    int *stages;    /* (num_stages) distinct ranks in [0, pp) (links: [0, pp * v - 1)) */
    int num_stages; /* 0 = all */
} loom_plan_compressor;

/* Islands (DiLoCo-style training over slow links; docs/islands.md): the world is `count`
 * islands of dp x tp x pp ranks each (island outermost: world rank = island x island size + the
 * rank the mesh formula gives inside the island). Each island trains its own copy of the model
 * on its own share of the data for `inner_steps` steps (H); then every rank's outer gradient
 * (its parameters at the round's start minus now) is averaged over the islands, and the outer
 * optimiser updates the round-start parameters, which every island continues from. With
 * `fragments` F > 1 the parameters are split into F groups of layers, fragment f syncing after
 * the inner steps t with t = floor(f H / F) mod H (Streaming DiLoCo's staggering). */
typedef enum { LOOM_OUTER_NESTEROV, LOOM_OUTER_SGD, LOOM_OUTER_COUNT } loom_outer_optimizer;
#define LOOM_PLAN_DEFAULT_INNER_STEPS    100
#define LOOM_PLAN_DEFAULT_OUTER_LR       0.7
#define LOOM_PLAN_DEFAULT_OUTER_MOMENTUM 0.9
typedef struct {
    int count;                        /* K islands; 0: none (one mesh, the plan's default) */
    int inner_steps;                  /* H >= 1 */
    loom_outer_optimizer optimizer;   /* nesterov (default) or sgd (momentum, no look-ahead) */
    double lr, momentum;              /* the outer optimiser's (0.7, 0.9: DiLoCo's) */
    int fragments;                    /* F in [1, min(layers, H)] (1) */
    int overlap_steps;                /* inner steps a sync runs behind (0: blocking) */
    loom_compress_method compression; /* outer gradients on the wire: none, bf16, int8, or
                                         powersgd / topk (dp 1, one fragment, no overlap) */
    int compression_rank;             /* powersgd's (LOOM_PLAN_DEFAULT_DP_RANK); 0 otherwise */
    double compression_fraction;      /* topk's (LOOM_PLAN_DEFAULT_TOPK_FRACTION); 0 otherwise */
} loom_plan_islands;
const char *loom_outer_optimizer_name(loom_outer_optimizer optimizer);
/* The defaults above, count 0. */
void loom_plan_islands_init(loom_plan_islands *islands);
/* Whether the outer gradients are compressed matrix by matrix (powersgd, topk: the data-parallel
 * compressors over the islands, dp 1, one fragment, blocking), not quantised through the
 * reduction (int8, bf16). */
int loom_plan_islands_by_matrix(const loom_plan_islands *islands);

typedef struct {
    loom_gpt_config model; /* padded_vocab_size filled in (vocab rounded up to 128) */
    int global_batch;      /* sequences per optimizer step, over all DP replicas (and all
                              islands: each island's batch is global / islands.count) */
    int micro_batch;       /* sequences per forward/backward of one stage */
    loom_schedule_kind schedule;
    int virtual_stages; /* v: model chunks per pipeline rank (1; interleaved >= 2; zb-v 2) */
    int dp, tp, pp;
    loom_plan_stage *stages;             /* (num_stages) virtual stages in model order */
    int num_stages;                      /* == pp * virtual_stages */
    loom_plan_compressor dp_compression; /* data-parallel gradients */
    loom_plan_compressor pp_compression; /* activations and their gradients between stages */
    loom_embedding_sync embedding_sync;  /* the tied embedding's gradient */
    loom_precision precision; /* fp32 (what loom trains), bf16 or fp16 (planned for GPU clusters;
                                 the runtime refuses them by name) */
    int zero;                 /* ZeRO stage over dp: 0 none, 1 AdamW's state sharded, 2 and the
                                 gradients, 3 and the parameters */
    int zero3_prefetch;       /* zero 3: units gathered ahead of the one computing (1; 0 none) */
    loom_zero3_gather zero3_gather; /* zero 3: per micro-batch (default) or once per step */
    int sequence_parallel;          /* Megatron's sequence parallelism over the tp group */
    int overlap_grad_reduce;        /* 1 (default): DP buckets start during backward; 0: after it */
    loom_plan_islands islands;      /* count 0: no islands */
    int predicted_seq_len;          /* the sequence length the prediction was made for (0: none) */
    double predicted_step_s, predicted_tokens_per_s; /* 0 = no prediction */
    int64_t *predicted_peak_bytes;                   /* (num_predicted_peak) per rank */
    int num_predicted_peak;
} loom_plan;

/* An empty plan with the defaults: schedule "1f1b" with one virtual stage per rank, compression
 * "none" (loom_plan_compressor_init),
 * embedding_sync "separate", every size 0 (so it does not pass loom_plan_check until filled in). */
void loom_plan_init(loom_plan *plan);
/* Method "none" with the defaults of every other field (rank 0, fraction 0.01, error feedback
 * and lazy error on, policy "all", forward "none", all stages). */
void loom_plan_compressor_init(loom_plan_compressor *compressor);
/* Frees the stage list and leaves the defaults (as loom_plan_compressor_init). */
void loom_plan_compressor_free(loom_plan_compressor *compressor);
/* Frees the arrays and leaves an empty plan (as loom_plan_init). */
void loom_plan_free(loom_plan *plan);
/* Deep copy into dst (which is overwritten, not freed: init or free it first). */
loom_status loom_plan_copy(loom_plan *dst, const loom_plan *src);

/* Reads and fully checks a plan file (loom_plan_check with world_size 0). Every problem is
 * LOOM_ERR_INPUT with one message naming the file, the JSON path of the field and the
 * expectation, e.g. "plan.json: stages[1].layers: expected [start, end) with start < end,
 * got [7, 5]"; malformed JSON names the line and column. On failure the plan is left empty. */
loom_status loom_plan_read(const char *path, loom_plan *plan);
/* Checks the plan (LOOM_ERR_INPUT naming `path`), then writes it atomically, pretty-printed,
 * keys in the order of the example above. Doubles are written so that they read back equal. */
loom_status loom_plan_write(const char *path, const loom_plan *plan);

/* The rules, in this order: model sizes positive and heads dividing d_model; batch sizes
 * positive; schedule "gpipe", "1f1b", "interleaved", "zb-h1" or "zb-v"; virtual_stages 1 for
 * gpipe, 1f1b and zb-h1, 2 for zb-v, at least 2 for interleaved; mesh sizes positive;
 * dp*tp*pp == world_size when world_size > 0; tp dividing the heads and the padded vocabulary
 * (so also d_model and 4*d_model); pp * virtual_stages at most the layers; global batch a
 * multiple of micro*dp; with interleaved, the micro-batches per step
 * (loom_plan_num_micro_batches) a multiple of pp (Megatron's rule); num_stages == pp *
 * virtual_stages; stage ranges non-empty, contiguous, in order, from 0 to layers; embedding true
 * exactly on stage 0 and head exactly on the last virtual stage; each stage's rank and chunk
 * those of loom_plan_place; then each compressor (dp, pp): its method one that
 * loom_compress_method_parse allows there (pp.forward: a forward method), "none" for pp.method
 * and pp.forward with one virtual stage in all, rank > 0 for powersgd/lowrank and 0 for the
 * rest, fraction in (0, 1] for topk and the default for the rest, warmup_steps >= 0, sign only
 * with error feedback, policy "all", "epilogue" or "slack", dp stage indices (pipeline ranks)
 * distinct and in [0, pp), pp link indices distinct and in [0, pp * virtual_stages - 1), and
 * the fields of the other place at their defaults (they have no key in the file);
 * embedding_sync "separate" or "fused", and "fused" only with pp > 1; predictions finite and
 * >= 0. The first broken rule is reported as "SOURCE: JSON.PATH: expected ..., got ..."
 * (LOOM_ERR_INPUT). */
loom_status loom_plan_check(const loom_plan *plan, const char *source, int world_size);

/* Builds a checked plan (messages name the source "plan") with compression "none" and no
 * predictions. virtual_stages 0 means the schedule's (1, zb-v 2,
 * interleaved LOOM_PLAN_DEFAULT_VIRTUAL_STAGES). The layers are split over the pp *
 * virtual_stages virtual stages in model order, placed on ranks by loom_plan_place. Stages are
 * contiguous and as even as possible; when the layers do not divide evenly, the EARLIER stages
 * get the extra layer, because the last stage also runs the LM head and the loss (for GPT-2 124M
 * the head's matmul costs about as much as five blocks), while the first stage's embedding
 * lookup is cheap. stage_layers, a comma-separated list of layer counts (e.g. "3,5"), overrides
 * the split: pp * virtual_stages positive counts summing to the layers, in model order. The
 * model's padded_vocab_size is recomputed from vocab_size. On failure the plan is left empty. */
loom_status loom_plan_uniform(loom_plan *plan, const loom_gpt_config *model, int dp, int tp, int pp,
                              int micro_batch, int global_batch, loom_schedule_kind schedule,
                              int virtual_stages, const char *stage_layers);

/* What layout flags ask for (`loom train`'s and `loom plan`'s, with one set of defaults): 0 or
 * NULL means "the default". The batch rule lives here and nowhere else:
 *   global batch = micro batch x micro-batches x dp.
 *   dp             0: the ranks left over, world_size / (tp x pp) (1 when world_size is 0)
 *   tp, pp         0: 1
 *   micro_batches  per replica and step; 0: global / (micro x dp), or pp when global is 0 too
 *                  (a pipeline of pp stages wants at least pp micro-batches in flight)
 *   global_batch   0: micro x micro_batches x dp; when both are given they must agree
 *   schedule       NULL or "": "1f1b"
 *   virtual_stages model chunks per pipeline rank; 0: the schedule's (loom_plan_uniform); any
 *                  other value than the schedule's with a schedule that fixes it is refused
 *   stage_layers   NULL or "": as even as possible (loom_plan_uniform); else one count per
 *                  virtual stage
 *   recompute      LOOM_RECOMPUTE_*: every stage recomputes its activations in backward (not
 *                  with zb-h1, zb-v); 0 none
 *   zero_given     0: the ZeRO stage is loom_plan_default_zero's; 1: it is `zero` (0-3)
 *   zero3_prefetch -1: the default (1); zero3_gather LOOM_ZERO3_GATHER_*
 *   sequence_parallel  Megatron's sequence parallelism (tp > 1)
 *   no_overlap_grad_reduce  1: the DP buckets start after the backward (plan key
 *                  overlap_grad_reduce false) */
#define LOOM_PLAN_DEFAULT_MICRO_BATCH 8
typedef struct {
    int dp, tp, pp;
    int micro_batch; /* sequences per forward/backward; 0: LOOM_PLAN_DEFAULT_MICRO_BATCH */
    int global_batch, micro_batches;
    const char *schedule, *stage_layers;
    int virtual_stages;
    int recompute;
    int zero_given, zero;
    int zero3_prefetch;
    loom_zero3_gather zero3_gather;
    int sequence_parallel;
    int no_overlap_grad_reduce;
    /* compression (deep-copied into the plan and checked there); NULL: "none" */
    const loom_plan_compressor *dp_compression, *pp_compression;
    const char *embedding_sync;       /* NULL or "": "separate" */
    const loom_plan_islands *islands; /* NULL: none; else copied (count 0: none) */
} loom_plan_request;

/* Resolves the request's defaults for world_size ranks (0: no world, as `loom plan` without
 * --ranks) and builds the checked plan (loom_plan_uniform, then the compression). Messages name
 * the flags (--data-parallel, --micro-batches, --global-batch-size, --schedule,
 * --virtual-stages, --recompute, --embedding-sync, ...) or, for rules of the plan, the plan path
 * ("plan: compression.dp.fraction: ..."). On failure the plan is left empty. */
loom_status loom_plan_from_request(loom_plan *plan, const loom_gpt_config *model,
                                   const loom_plan_request *request, int world_size);

/* The compression flags of `loom train` and `loom plan`, one field per flag (the config file's
 * key is the field's name); loom_plan_compression_flags_defaults fills in the defaults. */
typedef struct {
    char dp_compression[16];         /* --dp-compression: none powersgd topk sign int8 bf16 */
    int dp_compression_rank;         /* --dp-compression-rank: powersgd only (4) */
    double dp_topk_fraction;         /* --dp-topk-fraction: topk only (0.01) */
    int dp_compression_warmup_steps; /* --dp-compression-warmup-steps (0) */
    char dp_compression_stages[256]; /* --dp-compression-stages "0,1" ("": every stage) */
    int no_error_feedback;           /* --no-error-feedback */
    char pp_compression[16];         /* --pp-compression: none lowrank topk int8 bf16 */
    int pp_compression_rank;         /* --pp-compression-rank: lowrank only (8) */
    double pp_topk_fraction;         /* --pp-topk-fraction: topk only (0.01) */
    char pp_compression_links[256];  /* --pp-compression-links "0,2" ("": every link) */
    char pp_compression_policy[16];  /* --pp-compression-policy: all epilogue slack (all) */
    char pp_forward_compression[16]; /* --pp-forward-compression: none bf16 int8 (none) */
    int no_lazy_error;               /* --no-lazy-error */
    char embedding_sync[16];         /* --embedding-sync: separate fused (separate) */
} loom_plan_compression_flags;

void loom_plan_compression_flags_defaults(loom_plan_compression_flags *flags);
/* The two compressors the flags ask for (free them with loom_plan_compressor_free; on failure
 * they are left at the defaults). Refused here, naming the flag: a method not allowed in its
 * place ("--dp-compression: compression.dp.method: expected one of ..."), an index list that is
 * not comma-separated non-negative integers, and a flag the method does not use set to another
 * value than its default (a rank without powersgd/lowrank, a fraction without topk, any dp flag
 * with --dp-compression none, any pp flag but --pp-forward-compression with --pp-compression
 * none). The rules that need the mesh are loom_plan_check's. */
loom_status loom_plan_compression_from_flags(const loom_plan_compression_flags *flags,
                                             loom_plan_compressor *dp, loom_plan_compressor *pp);

/* The layout flags of `loom train` and `loom plan` (and the keys of a --config file: the field
 * names), one field per flag; 0 / "" asks for the default, as in loom_plan_request, but for the
 * fields loom_layout_flags_defaults sets (set one up with it, never by zeroing). */
typedef struct {
    int data_parallel, tensor_parallel, pipeline_parallel;
    int micro_batch_size, global_batch_size, micro_batches;
    char schedule[16];
    int virtual_stages;
    char stage_layers[256];
    int recompute;        /* --recompute [WORD]: LOOM_RECOMPUTE_* (alone: AS_NEEDED) */
    int recompute_always; /* LOOM_RECOMPUTE_ALWAYS (the older spelling of --recompute always) */
    int sequence_parallel;
    int zero3_prefetch;    /* -1: not given (1) */
    char zero3_gather[16]; /* "" : micro_batch */
    loom_plan_compression_flags compression;
    int no_overlap_grad_reduce;
    int zero;            /* the ZeRO stage; -1: not given (loom_plan_default_zero) */
    int zero1, no_zero1; /* older spellings of zero 1 and zero 0 */
    /* islands: --islands K (0: none), --inner-steps, --outer-optimizer, --outer-lr,
     * --outer-momentum, --outer-fragments, --outer-overlap-steps, --outer-compression; the
     * outer flags but --islands are refused without islands when set to other than the default */
    int islands, inner_steps;
    char outer_optimizer[16];
    double outer_lr, outer_momentum;
    int outer_fragments, outer_overlap_steps;
    char outer_compression[16];
    int outer_compression_rank; /* --outer-compression-rank: powersgd's (default 4) */
    double outer_topk_fraction; /* --outer-topk-fraction: topk's (default 0.01) */
} loom_layout_flags;
/* The islands section the layout flags ask for (count 0 without --islands, whose outer flags are
 * then refused by name). */
loom_status loom_plan_islands_from_flags(const loom_layout_flags *flags, loom_plan_islands *out);

/* Every flag at its default (zero -1: not given). */
void loom_layout_flags_defaults(loom_layout_flags *flags);
/* The ZeRO stage the flags ask for: --zero, or its aliases --zero1 (1) and --no-zero1 (0); -1
 * when none is given. Flags that contradict each other are LOOM_ERR_INPUT naming both; a stage
 * outside 0-3 names --zero. */
loom_status loom_layout_flags_zero(const loom_layout_flags *flags, int *zero);
/* The plan the layout flags ask for, for the model on world_size ranks: the request they make
 * (the one place flags become a loom_plan_request) through loom_plan_from_request, compression
 * included. The flags' errors come first, then the request's. On failure the plan is left empty. */
loom_status loom_plan_from_flags(loom_plan *plan, const loom_gpt_config *model,
                                 const loom_layout_flags *flags, int world_size);
/* The flags that ask for the plan's compression (for showing a resolved configuration). */
void loom_plan_compression_flags_of(const loom_plan *plan, loom_plan_compression_flags *flags);

/* Where the schedule puts virtual stage `stage` of pp * v: the pipeline rank and the chunk on it.
 * "interleaved" (and every schedule with v = 1): rank stage mod pp, chunk stage / pp (Megatron);
 * "zb-v" (v = 2): stages 0 .. pp-1 on ranks 0 .. pp-1 as chunk 0, stages pp .. 2pp-1 back down
 * on ranks pp-1 .. 0 as chunk 1. The one place the rule lives (the pipeline schedules use it). */
void loom_plan_place(loom_schedule_kind schedule, int pp, int virtual_stages, int stage, int *rank,
                     int *chunk);
/* The virtual stages a schedule runs per pipeline rank when it decides ("zb-v": 2; "gpipe",
 * "1f1b", "zb-h1": 1); 0 for "interleaved", whose v is chosen (LOOM_PLAN_DEFAULT_VIRTUAL_STAGES
 * when not given); -1 for an unknown schedule. */
int loom_plan_schedule_chunks(loom_schedule_kind schedule);
#define LOOM_PLAN_DEFAULT_VIRTUAL_STAGES 2

/* Megatron rank order: TP fastest, then DP, PP slowest. */
typedef struct {
    int dp_rank, tp_rank, pp_rank;
} loom_plan_coords;
/* world_rank in [0, dp*tp*pp): a rank of one island (the island's own ranks, counted from 0). */
loom_plan_coords loom_plan_rank_coords(const loom_plan *plan, int world_rank);
int loom_plan_world_rank(const loom_plan *plan, loom_plan_coords coords);

/* The ZeRO stage a plan gets when nothing says one: 1 (AdamW's state sharded: measured at least
 * as fast as plain DP in every layout, bench/parallel.sh) with dp > 1 and no data-parallel
 * compression, else 0 (a compressed gradient sync all-reduces, and ZeRO-1's parameter all-gather
 * cannot be compressed and is as large as the gradient). The one place the rule lives. */
int loom_plan_default_zero(const loom_plan *plan);

/* Micro-batches each pipeline runs per optimizer step: global / (micro * dp * islands). */
int loom_plan_num_micro_batches(const loom_plan *plan);
/* Islands the plan trains (1 without islands) and ranks the job needs: islands x dp x tp x pp. */
int loom_plan_num_islands(const loom_plan *plan);
int64_t loom_plan_job_ranks(const loom_plan *plan);
/* Whether `compressor` is on (method other than "none") for `stage`: for dp_compression a
 * pipeline rank (every chunk it runs), for pp_compression a link between virtual stages (link s
 * joins virtual stages s and s + 1, whichever ranks run them). */
int loom_plan_compresses_stage(const loom_plan_compressor *compressor, int stage);
/* Whether the plan compresses data-parallel gradients or pipeline gradients (either method other
 * than "none"): what keeps compressor state and reports compression metrics. */
int loom_plan_compresses(const loom_plan *plan);

/* A short human summary: model, batch (with the virtual stages per rank when more than one),
 * mesh, stages with their layer ranges (and, with virtual stages, the rank and chunk that run
 * each), compression, and the rank layout table "rank -> (pp, dp, tp)" (the first 64 ranks,
 * then a count). */
void loom_plan_print(const loom_plan *plan, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_PLAN_H */
