/*
 * test_plan.c — the plan file and its rules: write -> read round trips, the Megatron rank
 * layout against an independent enumeration (and REFERENCE.md's 16-rank example), the even
 * stage split, and every rule of loom_plan_check (and every shape error of the reader) broken
 * once by editing a valid plan's JSON text, each expected to fail with LOOM_ERR_INPUT and a
 * message naming the file and the field's JSON path. Compression: every field of both
 * compressors written and read back, the file's defaults, each compression rule broken on a
 * plan in memory, loom_plan_from_request's deep copy, and the flags' translation.
 */
#include "check.h"
#include "loom/plan.h"

#include <ctype.h>
#include <stdint.h>
#include <string.h>

static const char *tmpdir;

/* ---- helpers ------------------------------------------------------------------------------ */

static int compressors_equal(const loom_plan_compressor *a, const loom_plan_compressor *b) {
    if ((a->method != b->method) || a->rank != b->rank || a->fraction != b->fraction ||
        !a->error_feedback != !b->error_feedback || a->warmup_steps != b->warmup_steps ||
        !a->lazy_error != !b->lazy_error || (a->policy != b->policy) ||
        (a->forward != b->forward) || a->num_stages != b->num_stages) {
        return 0;
    }
    for (int i = 0; i < a->num_stages; i++)
        if (a->stages[i] != b->stages[i]) return 0;
    return 1;
}

static int plans_equal(const loom_plan *a, const loom_plan *b) {
    const loom_gpt_config *ma = &a->model, *mb = &b->model;
    if (ma->num_layers != mb->num_layers || ma->num_heads != mb->num_heads ||
        ma->channels != mb->channels || ma->max_seq_len != mb->max_seq_len ||
        ma->vocab_size != mb->vocab_size || ma->padded_vocab_size != mb->padded_vocab_size) {
        return 0;
    }
    if (!loom_gpt_config_same(ma, mb)) return 0; /* the Llama fields, rope scaling included */
    if (a->global_batch != b->global_batch || a->micro_batch != b->micro_batch ||
        (a->schedule != b->schedule) || a->virtual_stages != b->virtual_stages || a->dp != b->dp ||
        a->tp != b->tp || a->pp != b->pp || a->num_stages != b->num_stages ||
        a->overlap_grad_reduce != b->overlap_grad_reduce) {
        return 0;
    }
    for (int i = 0; i < a->num_stages; i++) {
        const loom_plan_stage *sa = &a->stages[i], *sb = &b->stages[i];
        if (sa->first_layer != sb->first_layer || sa->end_layer != sb->end_layer ||
            !sa->embedding != !sb->embedding || !sa->head != !sb->head ||
            sa->recompute != sb->recompute || sa->rank != sb->rank || sa->chunk != sb->chunk) {
            return 0;
        }
    }
    if (!compressors_equal(&a->dp_compression, &b->dp_compression) ||
        !compressors_equal(&a->pp_compression, &b->pp_compression) ||
        (a->embedding_sync != b->embedding_sync)) {
        return 0;
    }
    const loom_plan_islands *ia = &a->islands, *ib = &b->islands;
    if (ia->count != ib->count || ia->inner_steps != ib->inner_steps ||
        ia->optimizer != ib->optimizer || ia->lr != ib->lr || ia->momentum != ib->momentum ||
        ia->fragments != ib->fragments || ia->overlap_steps != ib->overlap_steps ||
        ia->compression != ib->compression || ia->compression_rank != ib->compression_rank) {
        return 0;
    }
    if (a->predicted_step_s != b->predicted_step_s ||
        a->predicted_tokens_per_s != b->predicted_tokens_per_s ||
        a->num_predicted_peak != b->num_predicted_peak) {
        return 0;
    }
    for (int i = 0; i < a->num_predicted_peak; i++)
        if (a->predicted_peak_bytes[i] != b->predicted_peak_bytes[i]) return 0;
    return 1;
}

static int is_empty_plan(const loom_plan *p) {
    return p->stages == NULL && p->num_stages == 0 && p->dp_compression.stages == NULL &&
           p->pp_compression.stages == NULL && p->predicted_peak_bytes == NULL &&
           p->model.num_layers == 0;
}

static loom_gpt_config gpt2_config(void) {
    loom_gpt_config m;
    loom_status st = loom_gpt_preset("gpt2", &m);
    if (st != LOOM_OK) {
        fprintf(stderr, "no gpt2 preset: %s\n", loom_last_error());
        exit(1);
    }
    return m;
}

/* ---- round trips ---------------------------------------------------------------------------- */

/* A Llama model with Llama 3.1's rope scaling reads back the same (loom_gpt_config_same); a
 * scaling of another type, or with a missing number, is refused naming model.rope_scaling. */
static void test_llama_round_trip(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/llama.json", tmpdir);
    loom_gpt_config model;
    loom_gpt_overrides o = {.preset = "llama-tiny"};
    loom_status st = loom_gpt_config_resolve_with(&o, "test", &model);
    CHECK(st == LOOM_OK, "llama-tiny: %s", loom_last_error());
    model.rope_scaling = (loom_rope_scaling){8.0, 1.0, 4.0, 8192.0};
    model.rope_theta = 500000.0;
    loom_plan plan, back;
    st = loom_plan_uniform(&plan, &model, 1, 1, 1, 1, 2, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_OK, "llama plan: %s", loom_last_error());
    if (st != LOOM_OK) return;
    st = loom_plan_write(path, &plan);
    if (st == LOOM_OK) st = loom_plan_read(path, &back);
    CHECK(st == LOOM_OK, "llama plan round trip: %s", loom_last_error());
    if (st == LOOM_OK) {
        CHECK(plans_equal(&plan, &back) && back.model.rope_scaling.original_context == 8192.0,
              "the Llama plan read back differs (rope scaling %g from %g)",
              back.model.rope_scaling.factor, back.model.rope_scaling.original_context);
        loom_plan_free(&back);
    }
    char *text = NULL;
    size_t size = 0;
    if (loom_read_file(path, &text, &size) == LOOM_OK) {
        static const char *const edits[][3] = {
            {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", "got \"yarn\""},
            {"\"factor\": 8, ", "", "model.rope_scaling.factor"},
            {"\"factor\": 8", "\"factor\": 0.5", "expected factor >= 1"}};
        for (int i = 0; i < 3; i++) {
            char edited[8192];
            int ok = check_edit_text(text, edits[i][0], edits[i][1], edited, sizeof edited);
            CHECK(ok, "rope scaling edit %d applies", i);
            if (!ok) continue;
            check_write_text(path, edited);
            st = loom_plan_read(path, &back);
            CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "model.rope_scaling") &&
                      strstr(loom_last_error(), edits[i][2]),
                  "rope scaling edit %d refused by name: %s", i, loom_last_error());
            if (st == LOOM_OK) loom_plan_free(&back);
        }
        free(text);
    }
    loom_plan_free(&plan);
}

static void test_round_trip(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/round_trip.json", tmpdir);
    loom_gpt_config model = gpt2_config();

    /* a plan with every optional part filled in */
    loom_plan plan;
    loom_status st =
        loom_plan_uniform(&plan, &model, 2, 2, 2, 4, 64, LOOM_SCHEDULE_GPIPE, 0, "5,7");
    CHECK(st == LOOM_OK, "uniform: %s", loom_last_error());
    if (st != LOOM_OK) return;
    plan.stages[1].recompute = LOOM_RECOMPUTE_ALWAYS;
    plan.overlap_grad_reduce = 0;
    plan.dp_compression.method = LOOM_COMPRESS_POWERSGD;
    plan.dp_compression.rank = 3;
    plan.dp_compression.error_feedback = 0;
    plan.dp_compression.warmup_steps = 7;
    plan.dp_compression.stages = malloc(sizeof(int));
    plan.dp_compression.stages[0] = 0;
    plan.dp_compression.num_stages = 1;
    plan.pp_compression.method = LOOM_COMPRESS_LOWRANK;
    plan.pp_compression.rank = 12;
    plan.pp_compression.lazy_error = 0;
    plan.pp_compression.policy = LOOM_PP_POLICY_SLACK;
    plan.pp_compression.forward = LOOM_COMPRESS_INT8;
    plan.pp_compression.stages = malloc(sizeof(int));
    plan.pp_compression.stages[0] = 0;
    plan.pp_compression.num_stages = 1;
    plan.embedding_sync = LOOM_EMBEDDING_SYNC_FUSED;
    plan.predicted_step_s = 0.1234567890123;
    plan.predicted_tokens_per_s = 1.0 / 3.0 * 1e6;
    plan.num_predicted_peak = 8;
    plan.predicted_peak_bytes = malloc(8 * sizeof(int64_t));
    for (int i = 0; i < 8; i++) plan.predicted_peak_bytes[i] = (int64_t)80e9 + 12345 * i;

    st = loom_plan_write(path, &plan);
    CHECK(st == LOOM_OK, "write: %s", loom_last_error());
    loom_plan back;
    st = loom_plan_read(path, &back);
    CHECK(st == LOOM_OK, "read back: %s", loom_last_error());
    if (st == LOOM_OK) {
        CHECK(plans_equal(&plan, &back), "the plan read back differs from the one written");
        CHECK(back.model.padded_vocab_size == 50304, "padded vocab %d",
              back.model.padded_vocab_size);
        CHECK(loom_plan_compresses_stage(&back.dp_compression, 0) &&
                  !loom_plan_compresses_stage(&back.dp_compression, 1),
              "dp compression on stage 0 only");
        CHECK(loom_plan_compresses_stage(&back.pp_compression, 0),
              "pp compression on link 0 (the one listed)");
        CHECK(loom_plan_num_micro_batches(&back) == 8, "64 / (4*2) = 8 micro-batches, got %d",
              loom_plan_num_micro_batches(&back));
    }
    loom_plan copy;
    st = loom_plan_copy(&copy, &plan);
    CHECK(st == LOOM_OK && plans_equal(&copy, &plan), "copy equals the original");
    CHECK(copy.stages != plan.stages && copy.predicted_peak_bytes != plan.predicted_peak_bytes &&
              copy.dp_compression.stages != plan.dp_compression.stages &&
              copy.pp_compression.stages != plan.pp_compression.stages,
          "copy is deep");
    loom_plan_free(&copy);

    /* the file looks like DESIGN.md's example: a stage per line, keys in the fixed order */
    char *text = NULL;
    size_t size = 0;
    if (loom_read_file(path, &text, &size) == LOOM_OK) {
        CHECK(strstr(text, "{\"layers\": [0, 5], \"embedding\": true, \"recompute\": \"none\"},") !=
                  NULL,
              "stage 0 line in:\n%s", text);
        CHECK(strstr(text, "{\"layers\": [5, 12], \"head\": true, \"recompute\": \"always\"}") !=
                  NULL,
              "stage 1 line in:\n%s", text);
        const char *order[] = {"\"model\"",  "\"batch\"",       "\"mesh\"",
                               "\"stages\"", "\"compression\"", "\"predicted\""};
        const char *prev = text;
        for (int i = 0; i < 6; i++) {
            const char *at = strstr(text, order[i]);
            CHECK(at && at >= prev, "key %s in order", order[i]);
            if (at) prev = at;
        }
        CHECK(strstr(text, "\"step_s\": 0.1234567890123,") != NULL, "shortest double in:\n%s",
              text);
        CHECK(strstr(text, "\"dp\": {\"method\": \"powersgd\", \"rank\": 3, \"error_feedback\": "
                           "false, \"warmup_steps\": 7, \"stages\": [0]}") != NULL,
              "dp compressor line in:\n%s", text);
        CHECK(strstr(text,
                     "\"pp\": {\"method\": \"lowrank\", \"rank\": 12, \"lazy_error\": "
                     "false, \"policy\": \"slack\", \"forward\": \"int8\", \"links\": [0]}") !=
                  NULL,
              "pp compressor line in:\n%s", text);
        free(text);
    }
    loom_plan_free(&back);
    loom_plan_free(&plan);
    CHECK(is_empty_plan(&plan), "free leaves an empty plan");

    /* a plan without compression or predictions round-trips too, and pp = 1 puts the embedding
     * and the head on the one stage */
    st = loom_plan_uniform(&plan, &model, 4, 1, 1, 2, 32, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_OK, "uniform pp=1: %s", loom_last_error());
    if (st != LOOM_OK) return;
    CHECK(plan.schedule == LOOM_SCHEDULE_1F1B && plan.dp_compression.method == LOOM_COMPRESS_NONE &&
              plan.embedding_sync == LOOM_EMBEDDING_SYNC_SEPARATE,
          "defaults");
    if (loom_plan_write(path, &plan) == LOOM_OK && loom_read_file(path, &text, &size) == LOOM_OK) {
        CHECK(strstr(text, "\"dp\": {\"method\": \"none\"},") &&
                  strstr(text, "\"pp\": {\"method\": \"none\"},"),
              "no compression: the method alone in:\n%s", text);
        free(text);
    }
    CHECK(plan.stages[0].embedding && plan.stages[0].head, "pp=1: one stage with both ends");
    st = loom_plan_write(path, &plan);
    CHECK(st == LOOM_OK, "write pp=1: %s", loom_last_error());
    st = loom_plan_read(path, &back);
    CHECK(st == LOOM_OK && plans_equal(&plan, &back), "pp=1 round trip: %s", loom_last_error());
    loom_plan_free(&back);

    /* an invalid plan is not written */
    char bad_path[1200];
    snprintf(bad_path, sizeof bad_path, "%s/not_written.json", tmpdir);
    plan.tp = 5;
    st = loom_plan_write(bad_path, &plan);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "mesh.tp"), "write refuses tp=5: %s",
          loom_last_error());
    FILE *f = fopen(bad_path, "r");
    CHECK(f == NULL, "nothing written for an invalid plan");
    if (f) fclose(f);
    loom_plan_free(&plan);
}

/* ---- rank layout ------------------------------------------------------------------------- */

/* Megatron's order written as nested loops: PP outermost, then DP, TP innermost. */
static void brute_force_coords(int dp, int tp, int pp, loom_plan_coords *coords) {
    int rank = 0;
    for (int p = 0; p < pp; p++)
        for (int d = 0; d < dp; d++)
            for (int t = 0; t < tp; t++) coords[rank++] = (loom_plan_coords){d, t, p};
}

static void test_rank_layout_shape(int dp, int tp, int pp) {
    loom_plan plan;
    loom_plan_init(&plan);
    plan.dp = dp, plan.tp = tp, plan.pp = pp;
    int world = dp * tp * pp;
    loom_plan_coords *expected = malloc((size_t)world * sizeof *expected);
    brute_force_coords(dp, tp, pp, expected);
    int mismatches = 0;
    for (int r = 0; r < world; r++) {
        loom_plan_coords c = loom_plan_rank_coords(&plan, r);
        if (c.dp_rank != expected[r].dp_rank || c.tp_rank != expected[r].tp_rank ||
            c.pp_rank != expected[r].pp_rank || loom_plan_world_rank(&plan, c) != r) {
            mismatches++;
        }
    }
    CHECK(mismatches == 0, "dp %d tp %d pp %d: %d ranks disagree with the enumeration", dp, tp, pp,
          mismatches);
    free(expected);
}

/* The ranks sharing every coordinate but one, as sorted lists: group g of `kind` has members
 * groups[g * size + i]. kind 0 = TP groups, 1 = DP groups, 2 = PP groups. */
static void groups_of(const loom_plan *plan, int kind, int *groups, int *num_groups, int *size) {
    int world = plan->dp * plan->tp * plan->pp;
    *size = kind == 0 ? plan->tp : kind == 1 ? plan->dp : plan->pp;
    *num_groups = world / *size;
    int *filled = calloc((size_t)*num_groups, sizeof *filled);
    int *keys = malloc((size_t)*num_groups * sizeof *keys);
    int used = 0;
    for (int r = 0; r < world; r++) { /* ranks ascending, so each group comes out sorted */
        loom_plan_coords c = loom_plan_rank_coords(plan, r);
        int key = kind == 0   ? c.pp_rank * plan->dp + c.dp_rank
                  : kind == 1 ? c.pp_rank * plan->tp + c.tp_rank
                              : c.dp_rank * plan->tp + c.tp_rank;
        int g = 0;
        while (g < used && keys[g] != key) g++;
        if (g == used) keys[used++] = key;
        groups[g * *size + filled[g]++] = r;
    }
    free(filled);
    free(keys);
}

static void test_rank_layout(void) {
    /* REFERENCE.md: 16 ranks, TP=2, PP=4 (so DP=2): TP groups [0,1],[2,3],...; DP groups
     * [0,2],[1,3],...; PP groups [0,4,8,12],... */
    test_rank_layout_shape(2, 2, 4);
    loom_plan plan;
    loom_plan_init(&plan);
    plan.dp = 2, plan.tp = 2, plan.pp = 4;
    int groups[16], n, size;
    groups_of(&plan, 0, groups, &n, &size);
    int tp_expected[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    CHECK(n == 8 && size == 2 && !memcmp(groups, tp_expected, sizeof groups),
          "TP groups [0,1],[2,3],...: got [%d,%d],[%d,%d],...", groups[0], groups[1], groups[2],
          groups[3]);
    groups_of(&plan, 1, groups, &n, &size);
    int dp_expected[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    CHECK(n == 8 && size == 2 && !memcmp(groups, dp_expected, sizeof groups),
          "DP groups [0,2],[1,3],...: got [%d,%d],[%d,%d],...", groups[0], groups[1], groups[2],
          groups[3]);
    groups_of(&plan, 2, groups, &n, &size);
    int pp_expected[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    CHECK(n == 4 && size == 4 && !memcmp(groups, pp_expected, sizeof groups),
          "PP groups [0,4,8,12],...: got [%d,%d,%d,%d],...", groups[0], groups[1], groups[2],
          groups[3]);
    loom_plan_coords c = loom_plan_rank_coords(&plan, 13);
    CHECK(c.pp_rank == 3 && c.dp_rank == 0 && c.tp_rank == 1, "rank 13 -> (pp 3, dp 0, tp 1)");

    const int shapes[][3] = {{1, 1, 1}, {8, 1, 1}, {1, 8, 1}, {1, 1, 8},
                             {3, 2, 2}, {2, 3, 5}, {5, 4, 3}, {1, 2, 7}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_rank_layout_shape(shapes[i][0], shapes[i][1], shapes[i][2]);
}

/* ---- stage split -------------------------------------------------------------------------- */

static void check_split(const loom_plan *plan, int layers, int pp) {
    int *seen = calloc((size_t)layers, sizeof *seen);
    int min = layers, max = 0, ordered = 1, in_range = 1;
    for (int s = 0; s < plan->num_stages; s++) {
        const loom_plan_stage *st = &plan->stages[s];
        int n = st->end_layer - st->first_layer;
        if (n < min) min = n;
        if (n > max) max = n;
        if (s > 0 && n > plan->stages[s - 1].end_layer - plan->stages[s - 1].first_layer) {
            ordered = 0;
        }
        for (int l = st->first_layer; l < st->end_layer; l++) {
            if (l < 0 || l >= layers) {
                in_range = 0;
            } else {
                seen[l]++;
            }
        }
    }
    int once = in_range;
    for (int l = 0; l < layers; l++) once &= seen[l] == 1;
    CHECK(plan->num_stages == pp, "%d layers over %d stages: %d stages", layers, pp,
          plan->num_stages);
    CHECK(once, "%d layers over %d stages: every layer exactly once", layers, pp);
    CHECK(max - min <= 1, "%d layers over %d stages: sizes %d..%d", layers, pp, min, max);
    CHECK(ordered, "%d layers over %d stages: the earlier stages get the extra layers", layers, pp);
    free(seen);
}

static void test_stage_split(void) {
    loom_gpt_config model = gpt2_config(); /* 12 layers, 12 heads */
    loom_plan plan;
    loom_status st = loom_plan_uniform(&plan, &model, 1, 1, 5, 1, 5, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_OK, "12 layers over 5 stages: %s", loom_last_error());
    if (st == LOOM_OK) {
        check_split(&plan, 12, 5);
        const int sizes[5] = {3, 3, 2, 2, 2};
        int same = 1;
        for (int s = 0; s < 5; s++)
            same &= plan.stages[s].end_layer - plan.stages[s].first_layer == sizes[s];
        CHECK(same, "12 over 5 = 3,3,2,2,2");
        CHECK(plan.stages[0].embedding && !plan.stages[0].head && plan.stages[4].head &&
                  !plan.stages[4].embedding && !plan.stages[2].embedding && !plan.stages[2].head,
              "embedding on the first stage, head on the last");
    }
    loom_plan_free(&plan);

    int all_ok = 1;
    for (int layers = 1; layers <= 24; layers++) {
        model.num_layers = layers;
        for (int pp = 1; pp <= layers; pp++) {
            st = loom_plan_uniform(&plan, &model, 1, 1, pp, 1, 1, LOOM_SCHEDULE_1F1B, 0, NULL);
            if (st != LOOM_OK) {
                all_ok = 0;
                continue;
            }
            check_split(&plan, layers, pp);
            loom_plan_free(&plan);
        }
    }
    CHECK(all_ok, "every split of 1..24 layers builds");

    /* an explicit list */
    model.num_layers = 8;
    st = loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 1, LOOM_SCHEDULE_1F1B, 0, "3,5");
    CHECK(st == LOOM_OK && plan.stages[0].end_layer == 3 && plan.stages[1].first_layer == 3 &&
              plan.stages[1].end_layer == 8,
          "--stage-layers 3,5: %s", loom_last_error());
    loom_plan_free(&plan);
    const struct {
        const char *list;
        const char *message;
    } bad_lists[] = {
        {"3,4", "summing to model.layers 8"},
        {"3,5,0", "expected 2 comma-separated"},
        {"8", "got 1 in"},
        {"3,x", "expected 2 comma-separated"},
        {"0,8", "positive"},
        {"3,,5", "expected 2"},
        {"3,5,", "expected 2"},
    };
    for (size_t i = 0; i < sizeof bad_lists / sizeof bad_lists[0]; i++) {
        st = loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 1, LOOM_SCHEDULE_1F1B, 0,
                               bad_lists[i].list);
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "stage_layers") &&
                  strstr(loom_last_error(), bad_lists[i].message),
              "stage list \"%s\": %s", bad_lists[i].list, loom_last_error());
        CHECK(is_empty_plan(&plan), "a failed build leaves an empty plan");
    }

    /* a bad mesh is named by its plan path */
    model.num_layers = 12;
    st = loom_plan_uniform(&plan, &model, 1, 5, 1, 1, 1, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "mesh.tp"), "tp=5: %s",
          loom_last_error());
    st = loom_plan_uniform(&plan, &model, 1, 1, 13, 1, 1, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "mesh.pp"), "pp=13 > 12 layers: %s",
          loom_last_error());
    st = loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 1, (loom_schedule_kind)99, 0, NULL);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "batch.schedule") &&
              strstr(loom_last_error(), "got the value 99"),
          "schedule out of range: %s", loom_last_error());
    CHECK(is_empty_plan(&plan), "a failed build leaves an empty plan");
}

/* ---- the rules, one broken at a time -------------------------------------------------------- */

static const char *valid_plan =
    "{\n"
    "  \"model\":   {\"layers\": 12, \"heads\": 12, \"d_model\": 768, \"context\": 1024, "
    "\"vocab\": 50257},\n"
    "  \"batch\":   {\"global\": 64, \"micro\": 4, \"schedule\": \"1f1b\"},\n"
    "  \"mesh\":    {\"dp\": 2, \"tp\": 2, \"pp\": 2},\n"
    "  \"stages\":  [{\"layers\": [0, 5], \"embedding\": true, \"recompute\": false},\n"
    "              {\"layers\": [5, 12], \"head\": true, \"recompute\": true}],\n"
    "  \"compression\": {\"dp\": {\"method\": \"powersgd\", \"rank\": 4, \"stages\": [0]},\n"
    "                  \"pp\": {\"method\": \"lowrank\", \"rank\": 8, \"lazy_error\": true},\n"
    "                  \"embedding_sync\": \"fused\"},\n"
    "  \"predicted\": {\"step_s\": 0.0, \"tokens_per_s\": 0.0, \"peak_bytes_per_rank\": [0]}\n"
    "}\n";

typedef struct {
    const char *find, *replace;   /* one edit of the valid plan */
    const char *find2, *replace2; /* and an optional second one */
    const char *path;             /* the JSON path the message must name */
    const char *detail;           /* and a piece of its expectation */
} broken_case;

static const broken_case broken_cases[] = {
    /* model */
    {"\"layers\": 12,", "\"layers\": 0,", 0, 0, "model.layers", "positive integer, got 0"},
    {"\"heads\": 12", "\"heads\": -1", 0, 0, "model.heads", "positive integer, got -1"},
    {"\"d_model\": 768", "\"d_model\": 0", 0, 0, "model.d_model", "positive"},
    {"\"context\": 1024", "\"context\": 0", 0, 0, "model.context", "positive"},
    {"\"vocab\": 50257", "\"vocab\": 0", 0, 0, "model.vocab", "positive"},
    {"\"vocab\": 50257", "\"vocab\": 2147483647", 0, 0, "model.vocab", "at most"},
    {"\"heads\": 12", "\"heads\": 10", 0, 0, "model.heads", "divisor of model.d_model 768"},
    /* batch */
    {"\"micro\": 4", "\"micro\": 0", 0, 0, "batch.micro", "positive"},
    {"\"global\": 64", "\"global\": -64", 0, 0, "batch.global", "positive"},
    {"\"1f1b\"", "\"zero-bubble\"", 0, 0, "batch.schedule",
     "expected one of \"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\" or \"zb-v\", got "
     "\"zero-bubble\""},
    /* virtual stages: v by schedule, a stage's rank by the placement, recompute by schedule */
    {"\"1f1b\"", "\"1f1b\", \"virtual_stages\": 2", 0, 0, "batch.virtual_stages",
     "expected 1 for schedule \"1f1b\" (one model chunk per pipeline rank), got 2"},
    {"\"1f1b\"", "\"gpipe\", \"virtual_stages\": 0", 0, 0, "batch.virtual_stages",
     "expected 1 for schedule \"gpipe\""},
    {"\"1f1b\"", "\"interleaved\"", 0, 0, "batch.virtual_stages",
     "expected at least 2 for schedule \"interleaved\" (model chunks per pipeline rank; one chunk "
     "is 1f1b), got 1"},
    {"\"1f1b\"", "\"zb-v\", \"virtual_stages\": 3", 0, 0, "batch.virtual_stages",
     "expected 2 for schedule \"zb-v\" (its V runs two model chunks on every rank), got 3"},
    {"\"1f1b\"", "\"zb-v\", \"virtual_stages\": 1", 0, 0, "batch.virtual_stages",
     "expected 2 for schedule \"zb-v\""},
    {"\"1f1b\"", "\"zb-h1\", \"virtual_stages\": 2", 0, 0, "batch.virtual_stages",
     "expected 1 for schedule \"zb-h1\""},
    {"\"1f1b\"", "\"zb-v\"", 0, 0, "stages",
     "expected mesh.pp x batch.virtual_stages = 2 x 2 = 4 "
     "virtual stages, got 2"},
    {"[0, 5]", "[0, 5], \"rank\": 1", 0, 0, "stages[0].rank",
     "expected 0 (1f1b places stage 0 of 2 on rank 0), got 1"},
    {"[0, 5]", "[0, 5], \"rank\": \"0\"", 0, 0, "stages[0].rank", "expected an integer"},
    {"\"1f1b\"", "\"1f1b\", \"virtual_stages\": 1.5", 0, 0, "batch.virtual_stages",
     "expected an integer"},
    {"[0, 5]", "[0, 5], \"chunk\": 0", 0, 0, "stages[0].chunk",
     "unknown key (expected one of: layers, rank, embedding, head, recompute)"},
    {"\"global\": 64", "\"global\": 60", 0, 0, "batch.global",
     "multiple of batch.micro * mesh.dp = 4*2 = 8, got 60"},
    /* mesh */
    {"\"dp\": 2", "\"dp\": 0", 0, 0, "mesh.dp", "positive"},
    {"\"tp\": 2", "\"tp\": 0", 0, 0, "mesh.tp", "positive"},
    {"\"pp\": 2", "\"pp\": -2", 0, 0, "mesh.pp", "positive"},
    {"\"dp\": 2", "\"dp\": 1073741824", 0, 0, "mesh", "at most"},
    {"\"tp\": 2", "\"tp\": 5", 0, 0, "mesh.tp", "divisor of model.heads 12"},
    {"\"tp\": 2", "\"tp\": 3", "\"vocab\": 50257", "\"vocab\": 128", "mesh.tp",
     "divisor of the padded vocabulary 128"},
    {"\"pp\": 2", "\"pp\": 13", 0, 0, "mesh.pp", "at most model.layers 12"},
    /* stages */
    {"\"pp\": 2", "\"pp\": 3", 0, 0, "stages", "expected mesh.pp = 3 stages, got 2"},
    {"[5, 12]", "[7, 5]", 0, 0, "stages[1].layers",
     "expected [start, end) with start < end, got [7, 5]"},
    {"[0, 5]", "[1, 5]", 0, 0, "stages[0].layers", "start at layer 0"},
    {"[5, 12]", "[6, 12]", 0, 0, "stages[1].layers", "where stages[0] ends (layer 5)"},
    {"[5, 12]", "[5, 11]", 0, 0, "stages[1].layers", "end at model.layers 12"},
    {"\"embedding\": true", "\"embedding\": false", 0, 0, "stages[0].embedding", "expected true"},
    {"\"head\": true", "\"embedding\": true, \"head\": true", 0, 0, "stages[1].embedding",
     "expected false"},
    {"\"head\": true", "\"head\": false", 0, 0, "stages[1].head", "expected true"},
    {"\"embedding\": true,", "\"embedding\": true, \"head\": true,", 0, 0, "stages[0].head",
     "expected false"},
    /* compression: methods by place, rank, fraction, warm-up, sign, policy, indices */
    {"\"powersgd\"", "\"sparse\"", 0, 0, "compression.dp.method",
     "expected one of none, powersgd, topk, sign, int8, bf16, got \"sparse\""},
    {"\"powersgd\"", "\"lowrank\"", 0, 0, "compression.dp.method",
     "expected one of none, powersgd, topk, sign, int8, bf16, got \"lowrank\""},
    {"\"lowrank\"", "\"powersgd\"", 0, 0, "compression.pp.method",
     "expected one of none, lowrank, topk, int8, bf16, got \"powersgd\""},
    {"\"lazy_error\": true", "\"forward\": \"topk\"", 0, 0, "compression.pp.forward",
     "expected one of none, int8, bf16, got \"topk\""},
    {"\"rank\": 4", "\"rank\": 0", 0, 0, "compression.dp.rank", "positive rank"},
    {"\"rank\": 8", "\"rank\": -1", 0, 0, "compression.pp.rank",
     "positive rank for method \"lowrank\", got -1"},
    {"\"powersgd\"", "\"int8\"", 0, 0, "compression.dp.rank", "no rank"},
    {"\"powersgd\", \"rank\": 4", "\"topk\", \"fraction\": 0", 0, 0, "compression.dp.fraction",
     "in (0, 1], got 0"},
    {"\"powersgd\", \"rank\": 4", "\"topk\", \"fraction\": 1.5", 0, 0, "compression.dp.fraction",
     "in (0, 1], got 1.5"},
    {"\"rank\": 4", "\"rank\": 4, \"fraction\": 0.5", 0, 0, "compression.dp.fraction",
     "no fraction for method \"powersgd\" (only topk keeps one), got 0.5"},
    {"\"rank\": 8", "\"rank\": 8, \"fraction\": 0.5", 0, 0, "compression.pp.fraction",
     "no fraction for method \"lowrank\""},
    {"\"rank\": 4", "\"rank\": 4, \"warmup_steps\": -1", 0, 0, "compression.dp.warmup_steps",
     ">= 0, got -1"},
    {"\"powersgd\", \"rank\": 4", "\"sign\", \"error_feedback\": false", 0, 0,
     "compression.dp.error_feedback",
     "sign compression needs error feedback (it does not converge without it)"},
    {"\"lazy_error\": true", "\"policy\": \"lazy\"", 0, 0, "compression.pp.policy",
     "expected one of \"all\", \"epilogue\" or \"slack\", got \"lazy\""},
    {"\"lazy_error\": true", "\"links\": [1]", 0, 0, "compression.pp.links[0]",
     "link index in [0, 1)"},
    {"\"lazy_error\": true", "\"links\": [0, 0]", 0, 0, "compression.pp.links[1]",
     "distinct link indices, got 0 again"},
    {"\"lazy_error\": true", "\"links\": []", 0, 0, "compression.pp.links",
     "non-empty list of link indices"},
    {"\"lazy_error\": true", "\"links\": [\"0\"]", 0, 0, "compression.pp.links[0]", "integer"},
    {"\"stages\": [0]", "\"stages\": [2]", 0, 0, "compression.dp.stages[0]",
     "stage index in [0, 2)"},
    {"\"stages\": [0]", "\"stages\": [-1]", 0, 0, "compression.dp.stages[0]", "stage index"},
    {"\"stages\": [0]", "\"stages\": [1, 1]", 0, 0, "compression.dp.stages[1]", "distinct"},
    {"\"fused\"", "\"both\"", 0, 0, "compression.embedding_sync", "\"separate\" or \"fused\""},
    /* predictions */
    {"\"step_s\": 0.0", "\"step_s\": -1.5", 0, 0, "predicted.step_s", ">= 0"},
    {"\"tokens_per_s\": 0.0", "\"tokens_per_s\": -1", 0, 0, "predicted.tokens_per_s", ">= 0"},
    {"\"peak_bytes_per_rank\": [0]", "\"peak_bytes_per_rank\": [1, -3]", 0, 0,
     "predicted.peak_bytes_per_rank[1]", ">= 0"},
    /* shape and types (the reader) */
    {"\"predicted\"", "\"extra\": 1, \"predicted\"", 0, 0, "extra", "unknown key"},
    {"\"vocab\": 50257}", "\"vocab\": 50257, \"padded_vocab\": 50304}", 0, 0, "model.padded_vocab",
     "unknown key"},
    {"\"recompute\": false}", "\"recompute\": false, \"gpu\": 0}", 0, 0, "stages[0].gpu",
     "unknown key"},
    {"\"lazy_error\"", "\"lazy\"", 0, 0, "compression.pp.lazy", "unknown key"},
    /* a key of the other place is unknown here */
    {"\"lazy_error\": true", "\"error_feedback\": true", 0, 0, "compression.pp.error_feedback",
     "unknown key (expected one of: method, rank, fraction, lazy_error, policy, forward, links)"},
    {"\"lazy_error\": true", "\"warmup_steps\": 1", 0, 0, "compression.pp.warmup_steps",
     "unknown key"},
    {"\"lazy_error\": true", "\"stages\": [0]", 0, 0, "compression.pp.stages", "unknown key"},
    {"\"stages\": [0]", "\"links\": [0]", 0, 0, "compression.dp.links",
     "unknown key (expected one of: method, rank, fraction, error_feedback, warmup_steps, "
     "stages)"},
    {"\"rank\": 4", "\"rank\": 4, \"lazy_error\": true", 0, 0, "compression.dp.lazy_error",
     "unknown key"},
    {"\"rank\": 4", "\"rank\": 4, \"policy\": \"all\"", 0, 0, "compression.dp.policy",
     "unknown key"},
    {"\"rank\": 4", "\"rank\": 4, \"forward\": \"none\"", 0, 0, "compression.dp.forward",
     "unknown key"},
    {"\"method\": \"lowrank\", ", "", 0, 0, "compression.pp.method", "missing"},
    {"\"method\": \"powersgd\"", "\"method\": 1", 0, 0, "compression.dp.method", "a method name"},
    {"\"lazy_error\": true", "\"forward\": 8", 0, 0, "compression.pp.forward", "a method name"},
    {"\"rank\": 4", "\"rank\": 4, \"fraction\": \"small\"", 0, 0, "compression.dp.fraction",
     "a number"},
    {"\"rank\": 4", "\"rank\": 4, \"error_feedback\": 1", 0, 0, "compression.dp.error_feedback",
     "true or false"},
    {"\"rank\": 4", "\"rank\": 4, \"warmup_steps\": 1.5", 0, 0, "compression.dp.warmup_steps",
     "an integer"},
    {"\"lazy_error\": true", "\"lazy_error\": \"yes\"", 0, 0, "compression.pp.lazy_error",
     "true or false"},
    {"\"lazy_error\": true", "\"policy\": 3", 0, 0, "compression.pp.policy", "got 3"},
    {"\"micro\": 4, ", "", 0, 0, "batch.micro", "missing"},
    {"  \"mesh\":    {\"dp\": 2, \"tp\": 2, \"pp\": 2},\n", "", 0, 0, "mesh", "missing"},
    {"\"layers\": 12", "\"layers\": \"12\"", 0, 0, "model.layers",
     "expected an integer, got \"12\""},
    {"\"global\": 64", "\"global\": 64.5", 0, 0, "batch.global", "expected an integer"},
    {"\"dp\": 2", "\"dp\": 4294967298", 0, 0, "mesh.dp", "expected an integer"},
    {"\"recompute\": true", "\"recompute\": 1", 0, 0, "stages[1].recompute",
     "\"none\", \"needed\", \"always\" or \"selective\""},
    {"\"recompute\": true", "\"recompute\": \"sometimes\"", 0, 0, "stages[1].recompute",
     "\"none\", \"needed\", \"always\" or \"selective\""},
    {"[0, 5]", "[0, 5, 7]", 0, 0, "stages[0].layers", "two integers, got [0,5,7]"},
    {"[0, 5]", "[0, 5.5]", 0, 0, "stages[0].layers", "two integers"},
    {"\"stages\": [0]", "\"stages\": []", 0, 0, "compression.dp.stages", "non-empty"},
    {"\"stages\": [0]", "\"stages\": [\"0\"]", 0, 0, "compression.dp.stages[0]", "integer"},
    {"\"model\":   {", "\"model\": [{", "50257},", "50257}],", "model", "an object"},
    {"{\"layers\": [0, 5]", "7, {\"layers\": [0, 5]", 0, 0, "stages[0]", "an object, got 7"},
    {"\"schedule\": \"1f1b\"", "\"schedule\": null", 0, 0, "batch.schedule", "got null"},
    {"\"step_s\": 0.0", "\"step_s\": \"fast\"", 0, 0, "predicted.step_s", "a number"},
    {"\"peak_bytes_per_rank\": [0]", "\"peak_bytes_per_rank\": 0", 0, 0,
     "predicted.peak_bytes_per_rank", "a list"},
    {"\"embedding_sync\": \"fused\"", "\"embedding_sync\": \"fusedfusedfusedfused\"", 0, 0,
     "compression.embedding_sync", "got \"fusedfusedfusedfused\""},
};

static void check_broken_cases(const char *valid, const broken_case *cases, size_t n,
                               const char *name);

static void test_rules(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/valid.json", tmpdir);
    check_write_text(path, valid_plan);
    loom_plan plan;
    loom_status st = loom_plan_read(path, &plan);
    CHECK(st == LOOM_OK, "the valid plan reads: %s", loom_last_error());
    if (st == LOOM_OK) {
        CHECK(plan.stages[0].embedding && !plan.stages[0].head && !plan.stages[1].embedding &&
                  plan.stages[1].head && plan.stages[1].recompute && !plan.stages[0].recompute,
              "absent embedding/head keys mean first/last stage");
        CHECK(plan.dp_compression.num_stages == 1 && plan.pp_compression.num_stages == 0 &&
                  plan.pp_compression.lazy_error &&
                  plan.embedding_sync == LOOM_EMBEDDING_SYNC_FUSED,
              "compression fields");
        /* dp*tp*pp against the ranks launched */
        st = loom_plan_check(&plan, path, 8);
        CHECK(st == LOOM_OK, "8 ranks fit: %s", loom_last_error());
        st = loom_plan_check(&plan, path, 4);
        const char *msg = loom_last_error();
        CHECK(st == LOOM_ERR_INPUT && strstr(msg, path) && strstr(msg, ": mesh: ") &&
                  strstr(msg, "4 ranks launched") && strstr(msg, "2*2*2 = 8"),
              "4 ranks for an 8-rank plan: %s", msg);
    }
    loom_plan_free(&plan);

    check_broken_cases(valid_plan, broken_cases, sizeof broken_cases / sizeof broken_cases[0],
                       "broken");
}

/* Each case edits `valid` and must be refused naming the file, the path and the detail. */
static void check_broken_cases(const char *valid, const broken_case *cases, size_t n,
                               const char *name) {
    char path[1200];
    loom_plan plan;
    for (size_t i = 0; i < n; i++) {
        const broken_case *c = &cases[i];
        char once[4096], text[4096];
        int ok = check_edit_text(valid, c->find, c->replace, once, sizeof once);
        if (ok && c->find2) {
            ok = check_edit_text(once, c->find2, c->replace2, text, sizeof text);
        } else {
            snprintf(text, sizeof text, "%s", once);
        }
        CHECK(ok, "%s case %zu: the edit applies (%s)", name, i, c->find);
        if (!ok) continue;
        snprintf(path, sizeof path, "%s/%s_%02zu.json", tmpdir, name, i);
        check_write_text(path, text);
        loom_status st = loom_plan_read(path, &plan);
        const char *msg = loom_last_error();
        char field[256];
        snprintf(field, sizeof field, ": %s: ", c->path);
        CHECK(st == LOOM_ERR_INPUT, "%s case %zu (%s): status %d", name, i, c->path, (int)st);
        CHECK(strncmp(msg, path, strlen(path)) == 0, "%s case %zu: message names the file: %s",
              name, i, msg);
        CHECK(strstr(msg, field) != NULL, "%s case %zu: message names '%s': %s", name, i, c->path,
              msg);
        CHECK(strstr(msg, c->detail) != NULL, "%s case %zu: message says '%s': %s", name, i,
              c->detail, msg);
        CHECK(is_empty_plan(&plan), "%s case %zu: a failed read leaves an empty plan", name, i);
        loom_plan_free(&plan);
    }
}

/* ---- compression ---------------------------------------------------------------------------- */

#define SET_WORD(field, word) snprintf((field), sizeof(field), "%s", (word))

/* A plan field's enum value for its file word (compress/'s method names, the plan's policies,
 * embedding syncs and schedules); a word none of them knows gives 99, out of every range. */
static int word_value(const char *word) {
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++)
        if (!strcmp(word, loom_compress_method_name((loom_compress_method)m))) return m;
    for (int i = 0; i < LOOM_PP_POLICY_COUNT; i++)
        if (!strcmp(word, loom_pp_policy_name((loom_pp_policy)i))) return i;
    for (int i = 0; i < LOOM_EMBEDDING_SYNC_COUNT; i++)
        if (!strcmp(word, loom_embedding_sync_name((loom_embedding_sync)i))) return i;
    return 99;
}
#define SET_ENUM(field, word) ((field) = word_value(word))

/* A schedule by its name (NULL: 1f1b). */
static loom_schedule_kind kind_of(const char *name) {
    loom_schedule_kind kind = LOOM_SCHEDULE_1F1B;
    if (name) loom_schedule_kind_parse(name, "test", "schedule", &kind);
    return kind;
}

/* A malloc'd list of n indices. */
static int *index_list(int n, const int *values) {
    int *list = malloc((size_t)n * sizeof *list);
    if (!list) exit(1);
    memcpy(list, values, (size_t)n * sizeof *list);
    return list;
}

/* Every method of both places with every field away from its default, written and read back. */
static void test_compression_round_trip(void) {
    const struct {
        const char *dp, *pp;
        int dp_rank, pp_rank;
        double dp_fraction, pp_fraction;
        int error_feedback, warmup_steps, lazy_error;
        const char *policy, *forward;
        int num_stages, num_links;
    } cases[] = {
        {"topk", "topk", 0, 0, 1.0 / 3.0, 0.25, 1, 0, 1, "epilogue", "bf16", 2, 3},
        {"sign", "int8", 0, 0, 0.01, 0.01, 1, 100, 0, "slack", "none", 4, 0},
        {"int8", "bf16", 0, 0, 0.01, 0.01, 0, 1, 1, "all", "int8", 0, 1},
        {"bf16", "none", 0, 0, 0.01, 0.01, 1, 0, 0, "slack", "int8", 1, 2},
        {"none", "lowrank", 0, 64, 0.01, 0.01, 0, 2, 1, "epilogue", "none", 3, 0},
        {"powersgd", "topk", 1, 0, 0.01, 1.0, 1, 0, 1, "all", "bf16", 0, 0},
    };
    const int stage_order[] = {3, 1, 0, 2}, link_order[] = {2, 0, 1};
    char path[1200];
    snprintf(path, sizeof path, "%s/compression_round_trip.json", tmpdir);
    loom_gpt_config model = gpt2_config();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        loom_plan plan, back;
        loom_status st =
            loom_plan_uniform(&plan, &model, 2, 1, 4, 4, 64, LOOM_SCHEDULE_1F1B, 0, NULL);
        CHECK(st == LOOM_OK, "uniform: %s", loom_last_error());
        if (st != LOOM_OK) return;
        loom_plan_compressor *dp = &plan.dp_compression, *pp = &plan.pp_compression;
        SET_ENUM(dp->method, cases[i].dp);
        SET_ENUM(pp->method, cases[i].pp);
        dp->rank = cases[i].dp_rank, pp->rank = cases[i].pp_rank;
        dp->fraction = cases[i].dp_fraction, pp->fraction = cases[i].pp_fraction;
        dp->error_feedback = cases[i].error_feedback, dp->warmup_steps = cases[i].warmup_steps;
        pp->lazy_error = cases[i].lazy_error;
        SET_ENUM(pp->policy, cases[i].policy);
        SET_ENUM(pp->forward, cases[i].forward);
        if (cases[i].num_stages) dp->stages = index_list(cases[i].num_stages, stage_order);
        if (cases[i].num_links) pp->stages = index_list(cases[i].num_links, link_order);
        dp->num_stages = cases[i].num_stages, pp->num_stages = cases[i].num_links;
        st = loom_plan_write(path, &plan);
        CHECK(st == LOOM_OK, "case %zu (dp %s, pp %s): write: %s", i, cases[i].dp, cases[i].pp,
              loom_last_error());
        st = loom_plan_read(path, &back);
        CHECK(st == LOOM_OK && plans_equal(&plan, &back),
              "case %zu (dp %s, pp %s): read back equal: %s", i, cases[i].dp, cases[i].pp,
              st == LOOM_OK ? "differs" : loom_last_error());
        if (st == LOOM_OK) loom_plan_free(&back);
        loom_plan_free(&plan);
    }
}

/* What a file leaves out: the rank by method, and every other field's default. */
static void test_compression_defaults(void) {
    const struct {
        const char *dp, *pp;
        int dp_rank, pp_rank;
    } cases[] = {{"powersgd", "lowrank", 4, 8}, {"topk", "int8", 0, 0}, {"sign", "bf16", 0, 0}};
    char path[1200], text[2048];
    snprintf(path, sizeof path, "%s/compression_defaults.json", tmpdir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text,
                 "{\"model\": {\"layers\": 2, \"heads\": 2, \"d_model\": 16, \"context\": 16, "
                 "\"vocab\": 257}, \"batch\": {\"global\": 4, \"micro\": 2}, "
                 "\"mesh\": {\"dp\": 2, \"tp\": 1, \"pp\": 2}, "
                 "\"stages\": [{\"layers\": [0, 1]}, {\"layers\": [1, 2]}], "
                 "\"compression\": {\"dp\": {\"method\": \"%s\"}, \"pp\": {\"method\": \"%s\"}}}",
                 cases[i].dp, cases[i].pp);
        check_write_text(path, text);
        loom_plan plan;
        loom_status st = loom_plan_read(path, &plan);
        CHECK(st == LOOM_OK, "dp %s, pp %s: %s", cases[i].dp, cases[i].pp, loom_last_error());
        if (st != LOOM_OK) continue;
        const loom_plan_compressor *dp = &plan.dp_compression, *pp = &plan.pp_compression;
        CHECK(dp->rank == cases[i].dp_rank && pp->rank == cases[i].pp_rank,
              "dp %s rank %d (expected %d), pp %s rank %d (expected %d)", cases[i].dp, dp->rank,
              cases[i].dp_rank, cases[i].pp, pp->rank, cases[i].pp_rank);
        CHECK(dp->fraction == 0.01 && pp->fraction == 0.01 && dp->error_feedback &&
                  dp->warmup_steps == 0 && pp->lazy_error && pp->policy == LOOM_PP_POLICY_ALL &&
                  pp->forward == LOOM_COMPRESS_NONE && dp->num_stages == 0 && pp->num_stages == 0 &&
                  plan.embedding_sync == LOOM_EMBEDDING_SYNC_SEPARATE,
              "dp %s, pp %s: the other fields' defaults", cases[i].dp, cases[i].pp);
        CHECK(loom_plan_compresses_stage(dp, 0) && loom_plan_compresses_stage(dp, 1) &&
                  loom_plan_compresses_stage(pp, 0),
              "no list: every stage and link");
        loom_plan_free(&plan);
    }
}

/* loom_plan_check of `plan` fails naming "mem: PATH: " and saying `detail`. */
static void expect_refused(const loom_plan *plan, const char *what, const char *path,
                           const char *detail) {
    loom_status st = loom_plan_check(plan, "mem", 0);
    const char *msg = loom_last_error();
    char field[128];
    snprintf(field, sizeof field, "mem: %s: ", path);
    CHECK(st == LOOM_ERR_INPUT && strncmp(msg, field, strlen(field)) == 0 && strstr(msg, detail),
          "%s: expected '%s...%s', got %s", what, field, detail, st == LOOM_OK ? "ok" : msg);
}

/* The rules a file cannot reach (one stage; fields that have no key in their place). Each case
 * changes a copy of a valid plan that shares its arrays (never freed). */
static void test_compression_rules(void) {
    loom_gpt_config model = gpt2_config();
    loom_plan one, two, p;
    loom_status st = loom_plan_uniform(&one, &model, 2, 1, 1, 4, 64, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_OK, "pp 1: %s", loom_last_error());
    if (st != LOOM_OK) return;
    st = loom_plan_uniform(&two, &model, 2, 1, 2, 4, 64, LOOM_SCHEDULE_1F1B, 0, NULL);
    CHECK(st == LOOM_OK, "pp 2: %s", loom_last_error());
    if (st != LOOM_OK) return;
    int link0[] = {0}, stage1[] = {1};

    p = one;
    SET_ENUM(p.pp_compression.method, "lowrank");
    p.pp_compression.rank = 8;
    expect_refused(&p, "pp method with one stage", "compression.pp.method",
                   "expected \"none\" with one pipeline stage, got \"lowrank\"");
    p = one;
    SET_ENUM(p.pp_compression.forward, "bf16");
    expect_refused(&p, "forward method with one stage", "compression.pp.forward",
                   "expected \"none\" with one pipeline stage, got \"bf16\"");
    p = one;
    SET_ENUM(p.embedding_sync, "fused");
    expect_refused(&p, "fused with one stage", "compression.embedding_sync",
                   "\"fused\" needs pipeline parallelism (pp > 1)");
    p = one;
    p.pp_compression.stages = link0, p.pp_compression.num_stages = 1;
    expect_refused(&p, "a link with one stage", "compression.pp.links[0]", "in [0, 0)");
    p = one;
    SET_ENUM(p.dp_compression.method, "int8");
    p.dp_compression.stages = stage1, p.dp_compression.num_stages = 1;
    expect_refused(&p, "dp stage 1 of 1", "compression.dp.stages[0]",
                   "stage index in [0, 1) (mesh.pp = 1), got 1");
    p = one;
    SET_ENUM(p.dp_compression.method, "int8");
    p.dp_compression.stages = stage1, p.dp_compression.num_stages = -1;
    expect_refused(&p, "a negative count", "compression.dp.stages", "got -1 of them");
    p = one;
    p.dp_compression.method = (loom_compress_method)99;
    expect_refused(&p, "a method out of range", "compression.dp.method",
                   "expected a compression method, got the value 99");
    p = one;
    SET_ENUM(p.dp_compression.method, "topk");
    p.dp_compression.fraction = NAN;
    expect_refused(&p, "fraction NaN", "compression.dp.fraction", "in (0, 1]");

    /* the fields of the other place keep their defaults */
    p = two;
    p.dp_compression.lazy_error = 0;
    expect_refused(&p, "dp.lazy_error", "compression.dp.lazy_error", "expected true");
    p = two;
    SET_ENUM(p.dp_compression.policy, "slack");
    expect_refused(&p, "dp.policy", "compression.dp.policy", "got \"slack\"");
    p = two;
    SET_ENUM(p.dp_compression.forward, "bf16");
    expect_refused(&p, "dp.forward", "compression.dp.forward", "got \"bf16\"");
    p = two;
    p.pp_compression.error_feedback = 0;
    expect_refused(&p, "pp.error_feedback", "compression.pp.error_feedback", "got false");
    p = two;
    p.pp_compression.warmup_steps = 3;
    expect_refused(&p, "pp.warmup_steps", "compression.pp.warmup_steps", "got 3");
    p = two;
    SET_ENUM(p.pp_compression.policy, "often");
    expect_refused(&p, "pp.policy", "compression.pp.policy", "got the value 99");

    /* and what two stages allow */
    p = two;
    SET_ENUM(p.embedding_sync, "fused");
    SET_ENUM(p.pp_compression.method, "lowrank");
    p.pp_compression.rank = 8;
    SET_ENUM(p.pp_compression.forward, "int8");
    p.pp_compression.stages = link0, p.pp_compression.num_stages = 1;
    SET_ENUM(p.dp_compression.method, "sign");
    p.dp_compression.stages = stage1, p.dp_compression.num_stages = 1;
    st = loom_plan_check(&p, "mem", 0);
    CHECK(st == LOOM_OK, "fused, lowrank on link 0, int8 forward, sign on stage 1: %s",
          loom_last_error());
    loom_plan_free(&one);
    loom_plan_free(&two);
}

/* loom_plan_from_request copies the request's compressors (deep) and embedding sync, then checks
 * them with the rest. */
static void test_request_compression(void) {
    loom_gpt_config model = gpt2_config();
    loom_plan_compressor dp, pp;
    loom_plan_compressor_init(&dp);
    loom_plan_compressor_init(&pp);
    SET_ENUM(dp.method, "powersgd");
    dp.rank = 2, dp.warmup_steps = 5;
    dp.stages = index_list(1, (const int[]){1}), dp.num_stages = 1;
    SET_ENUM(pp.method, "topk");
    pp.fraction = 0.125, pp.lazy_error = 0;
    SET_ENUM(pp.policy, "epilogue");
    SET_ENUM(pp.forward, "bf16");
    pp.stages = index_list(1, (const int[]){0}), pp.num_stages = 1;
    loom_plan_request request = {.dp = 2,
                                 .pp = 2,
                                 .micro_batch = 4,
                                 .global_batch = 64,
                                 .dp_compression = &dp,
                                 .pp_compression = &pp,
                                 .embedding_sync = "fused"};
    loom_plan plan;
    loom_status st = loom_plan_from_request(&plan, &model, &request, 4);
    CHECK(st == LOOM_OK, "request with compression: %s", loom_last_error());
    if (st == LOOM_OK) {
        CHECK(compressors_equal(&plan.dp_compression, &dp) &&
                  compressors_equal(&plan.pp_compression, &pp) &&
                  plan.embedding_sync == LOOM_EMBEDDING_SYNC_FUSED,
              "the plan holds the request's compression");
        CHECK(plan.dp_compression.stages != dp.stages && plan.pp_compression.stages != pp.stages,
              "the lists are copied, not shared");
        loom_plan copy;
        st = loom_plan_copy(&copy, &plan);
        CHECK(st == LOOM_OK && plans_equal(&copy, &plan) &&
                  copy.dp_compression.stages != plan.dp_compression.stages,
              "copy of a compressed plan is deep");
        if (st == LOOM_OK) loom_plan_free(&copy);
    }
    loom_plan_free(&plan);

    /* a rule broken by the compressor is the plan's message; the plan is left empty */
    pp.fraction = 2;
    st = loom_plan_from_request(&plan, &model, &request, 4);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "plan: compression.pp.fraction: "),
          "fraction 2: %s", loom_last_error());
    CHECK(is_empty_plan(&plan), "a refused request leaves an empty plan");
    pp.fraction = 0.125;
    request.embedding_sync = "both";
    st = loom_plan_from_request(&plan, &model, &request, 4);
    CHECK(st == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "--embedding-sync: compression.embedding_sync: expected "
                                        "\"separate\" or \"fused\", got \"both\""),
          "embedding sync both: %s", loom_last_error());
    request.embedding_sync = "fused";
    request.pp = 1, request.dp_compression = NULL, request.pp_compression = NULL;
    st = loom_plan_from_request(&plan, &model, &request, 2);
    CHECK(st == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "compression.embedding_sync: \"fused\""),
          "fused with pp 1 from a request: %s", loom_last_error());
    request.embedding_sync = NULL;
    st = loom_plan_from_request(&plan, &model, &request, 2);
    CHECK(st == LOOM_OK && plan.dp_compression.method == LOOM_COMPRESS_NONE &&
              plan.pp_compression.method == LOOM_COMPRESS_NONE &&
              plan.embedding_sync == LOOM_EMBEDDING_SYNC_SEPARATE,
          "no compression requested: none: %s", loom_last_error());
    loom_plan_free(&plan);
    loom_plan_compressor_free(&dp);
    loom_plan_compressor_free(&pp);
}

/* The flags' translation: methods by place, defaults by method, strict index lists, flags the
 * method does not use refused by name, and the way back for the configuration table. */
static void test_compression_flags(void) {
    loom_plan_compression_flags f;
    loom_plan_compressor dp, pp;
    loom_plan_compression_flags_defaults(&f);
    loom_status st = loom_plan_compression_from_flags(&f, &dp, &pp);
    CHECK(st == LOOM_OK && dp.method == LOOM_COMPRESS_NONE && pp.method == LOOM_COMPRESS_NONE &&
              dp.rank == 0 && pp.rank == 0 && dp.num_stages == 0,
          "defaults: no compression: %s", loom_last_error());
    loom_plan_compressor_free(&dp);
    loom_plan_compressor_free(&pp);

    SET_WORD(f.dp_compression, "powersgd");
    SET_WORD(f.dp_compression_stages, "2,0");
    SET_WORD(f.pp_compression, "lowrank");
    SET_WORD(f.pp_compression_links, "1");
    SET_WORD(f.pp_compression_policy, "slack");
    SET_WORD(f.pp_forward_compression, "int8");
    f.dp_compression_warmup_steps = 9, f.no_lazy_error = 1;
    st = loom_plan_compression_from_flags(&f, &dp, &pp);
    CHECK(st == LOOM_OK, "powersgd + lowrank: %s", loom_last_error());
    if (st == LOOM_OK) {
        CHECK(dp.rank == 4 && pp.rank == 8, "default ranks 4 and 8, got %d and %d", dp.rank,
              pp.rank);
        CHECK(dp.num_stages == 2 && dp.stages[0] == 2 && dp.stages[1] == 0 && pp.num_stages == 1 &&
                  pp.stages[0] == 1,
              "index lists");
        CHECK(dp.warmup_steps == 9 && dp.error_feedback && !pp.lazy_error &&
                  pp.policy == LOOM_PP_POLICY_SLACK && pp.forward == LOOM_COMPRESS_INT8,
              "the other fields");
        /* the plan of these flags gives the flags back */
        loom_gpt_config model = gpt2_config();
        loom_plan_request request = {.pp = 3, .dp_compression = &dp, .pp_compression = &pp};
        loom_plan plan;
        st = loom_plan_from_request(&plan, &model, &request, 0);
        CHECK(st == LOOM_OK, "plan of the flags: %s", loom_last_error());
        if (st == LOOM_OK) {
            loom_plan_compression_flags g;
            loom_plan_compression_flags_of(&plan, &g);
            CHECK(!strcmp(g.dp_compression, "powersgd") && g.dp_compression_rank == 4 &&
                      !strcmp(g.dp_compression_stages, "2,0") &&
                      g.dp_compression_warmup_steps == 9 && !g.no_error_feedback &&
                      !strcmp(g.pp_compression, "lowrank") && g.pp_compression_rank == 8 &&
                      !strcmp(g.pp_compression_links, "1") &&
                      !strcmp(g.pp_compression_policy, "slack") &&
                      !strcmp(g.pp_forward_compression, "int8") && g.no_lazy_error &&
                      g.dp_topk_fraction == 0.01 && !strcmp(g.embedding_sync, "separate"),
                  "flags of the plan");
        }
        loom_plan_free(&plan);
    }
    loom_plan_compressor_free(&dp);
    loom_plan_compressor_free(&pp);

    const char *bad_lists[] = {",",  "0,", ",1", "0,,1", "a",   "-1",
                               " 1", "1 ", "+1", "1;2",  "0x1", "99999999999"};
    for (size_t i = 0; i < sizeof bad_lists / sizeof bad_lists[0]; i++) {
        loom_plan_compression_flags g = f;
        SET_WORD(g.dp_compression_stages, bad_lists[i]);
        st = loom_plan_compression_from_flags(&g, &dp, &pp);
        CHECK(st == LOOM_ERR_INPUT &&
                  strstr(loom_last_error(), "--dp-compression-stages: expected comma-separated "
                                            "stage indices"),
              "stages \"%s\": %s", bad_lists[i], loom_last_error());
        CHECK(dp.stages == NULL && pp.stages == NULL && dp.method == LOOM_COMPRESS_NONE,
              "a refused list leaves the defaults");
        g = f;
        SET_WORD(g.pp_compression_links, bad_lists[i]);
        st = loom_plan_compression_from_flags(&g, &dp, &pp);
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "--pp-compression-links: "),
              "links \"%s\": %s", bad_lists[i], loom_last_error());
    }

    const struct {
        const char *dp, *pp;
        int dp_rank, pp_rank, no_error_feedback, no_lazy_error, warmup;
        double dp_fraction, pp_fraction;
        const char *stages, *links, *policy, *forward, *message;
    } refused[] = {
        {"lowrank", "none", 4, 8, 0, 0, 0, 0.01, 0.01, "", "", "all", "none",
         "--dp-compression: compression.dp.method: expected one of none, powersgd, topk, sign, "
         "int8, bf16, got \"lowrank\""},
        {"none", "powersgd", 4, 8, 0, 0, 0, 0.01, 0.01, "", "", "all", "none",
         "--pp-compression: compression.pp.method: expected one of none, lowrank, topk, int8, "
         "bf16, got \"powersgd\""},
        {"none", "none", 4, 8, 0, 0, 0, 0.01, 0.01, "", "", "all", "topk",
         "--pp-forward-compression: compression.pp.forward: expected one of none, int8, bf16"},
        {"none", "lowrank", 4, 8, 0, 0, 0, 0.01, 0.01, "", "", "often", "none",
         "--pp-compression-policy: compression.pp.policy: expected one of \"all\", \"epilogue\" or "
         "\"slack\", got "
         "\"often\""},
        {"topk", "none", 8, 8, 0, 0, 0, 0.01, 0.01, "", "", "all", "none",
         "--dp-compression-rank 8: not used with --dp-compression topk (only powersgd has a "
         "rank)"},
        {"powersgd", "none", 4, 8, 0, 0, 0, 0.5, 0.01, "", "", "all", "none",
         "--dp-topk-fraction 0.5: not used with --dp-compression powersgd"},
        {"none", "none", 4, 8, 1, 0, 0, 0.01, 0.01, "", "", "all", "none",
         "--no-error-feedback: not used with --dp-compression none (nothing is compressed)"},
        {"none", "none", 4, 8, 0, 0, 3, 0.01, 0.01, "", "", "all", "none",
         "--dp-compression-warmup-steps 3: not used with --dp-compression none"},
        {"none", "none", 4, 8, 0, 0, 0, 0.01, 0.01, "0", "", "all", "none",
         "--dp-compression-stages 0: not used with --dp-compression none"},
        {"none", "int8", 4, 2, 0, 0, 0, 0.01, 0.01, "", "", "all", "none",
         "--pp-compression-rank 2: not used with --pp-compression int8 (only lowrank has a rank)"},
        {"none", "lowrank", 4, 8, 0, 0, 0, 0.01, 0.2, "", "", "all", "none",
         "--pp-topk-fraction 0.2: not used with --pp-compression lowrank"},
        {"none", "none", 4, 8, 0, 0, 0, 0.01, 0.01, "", "0", "all", "bf16",
         "--pp-compression-links 0: not used with --pp-compression none"},
        {"none", "none", 4, 8, 0, 0, 0, 0.01, 0.01, "", "", "epilogue", "none",
         "--pp-compression-policy epilogue: not used with --pp-compression none"},
        {"none", "none", 4, 8, 0, 1, 0, 0.01, 0.01, "", "", "all", "none",
         "--no-lazy-error: not used with --pp-compression none"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        loom_plan_compression_flags g;
        loom_plan_compression_flags_defaults(&g);
        SET_WORD(g.dp_compression, refused[i].dp);
        SET_WORD(g.pp_compression, refused[i].pp);
        g.dp_compression_rank = refused[i].dp_rank, g.pp_compression_rank = refused[i].pp_rank;
        g.no_error_feedback = refused[i].no_error_feedback;
        g.no_lazy_error = refused[i].no_lazy_error;
        g.dp_compression_warmup_steps = refused[i].warmup;
        g.dp_topk_fraction = refused[i].dp_fraction, g.pp_topk_fraction = refused[i].pp_fraction;
        SET_WORD(g.dp_compression_stages, refused[i].stages);
        SET_WORD(g.pp_compression_links, refused[i].links);
        SET_WORD(g.pp_compression_policy, refused[i].policy);
        SET_WORD(g.pp_forward_compression, refused[i].forward);
        st = loom_plan_compression_from_flags(&g, &dp, &pp);
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), refused[i].message),
              "refused case %zu: expected '%s', got %s", i, refused[i].message,
              st == LOOM_OK ? "ok" : loom_last_error());
        loom_plan_compressor_free(&dp);
        loom_plan_compressor_free(&pp);
    }
    /* a method's own flags are fine with it; the forward method needs no backward one */
    loom_plan_compression_flags_defaults(&f);
    SET_WORD(f.dp_compression, "topk");
    SET_WORD(f.pp_compression, "topk");
    SET_WORD(f.pp_forward_compression, "bf16");
    f.dp_topk_fraction = 0.5, f.pp_topk_fraction = 0.25, f.no_error_feedback = 1;
    st = loom_plan_compression_from_flags(&f, &dp, &pp);
    CHECK(st == LOOM_OK && dp.fraction == 0.5 && pp.fraction == 0.25 && dp.rank == 0 &&
              !dp.error_feedback,
          "topk with its fraction: %s", loom_last_error());
    loom_plan_compressor_free(&dp);
    loom_plan_compressor_free(&pp);
    SET_WORD(f.pp_compression, "none");
    f.pp_topk_fraction = 0.01;
    st = loom_plan_compression_from_flags(&f, &dp, &pp);
    CHECK(st == LOOM_OK && pp.forward == LOOM_COMPRESS_BF16, "forward alone: %s",
          loom_last_error());
    loom_plan_compressor_free(&dp);
    loom_plan_compressor_free(&pp);
}

/* "FILE:LINE:COLUMN: invalid JSON" */
static int names_position(const char *msg, const char *path) {
    size_t n = strlen(path);
    if (strncmp(msg, path, n) != 0 || msg[n] != ':') return 0;
    const char *p = msg + n + 1;
    if (!isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) p++;
    if (*p++ != ':' || !isdigit((unsigned char)*p)) return 0;
    while (isdigit((unsigned char)*p)) p++;
    return strncmp(p, ": invalid JSON", 14) == 0;
}

static void test_malformed(void) {
    char path[1200], text[4096];
    loom_plan plan;
    const struct {
        const char *find, *replace;
    } edits[] = {
        {"\"vocab\": 50257}", "\"vocab\": 50257"},           /* a missing brace */
        {"[0, 5]", "[0, 5,]"},                               /* a trailing comma */
        {"\"heads\": 12,", "\"heads\": 12, \"heads\": 12,"}, /* a duplicate key */
        {"{\n", "{\n  // comment\n"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        if (!check_edit_text(valid_plan, edits[i].find, edits[i].replace, text, sizeof text))
            continue;
        snprintf(path, sizeof path, "%s/malformed_%zu.json", tmpdir, i);
        check_write_text(path, text);
        loom_status st = loom_plan_read(path, &plan);
        CHECK(st == LOOM_ERR_INPUT && names_position(loom_last_error(), path), "malformed %zu: %s",
              i, loom_last_error());
        CHECK(is_empty_plan(&plan), "malformed %zu leaves an empty plan", i);
    }
    snprintf(path, sizeof path, "%s/empty.json", tmpdir);
    check_write_text(path, "");
    loom_status st = loom_plan_read(path, &plan);
    CHECK(st == LOOM_ERR_INPUT && names_position(loom_last_error(), path), "empty file: %s",
          loom_last_error());
    snprintf(path, sizeof path, "%s/array.json", tmpdir);
    check_write_text(path, "[1, 2]\n");
    st = loom_plan_read(path, &plan);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), path) &&
              strstr(loom_last_error(), "expected a JSON object"),
          "top-level array: %s", loom_last_error());
    snprintf(path, sizeof path, "%s/no_such_plan.json", tmpdir);
    st = loom_plan_read(path, &plan);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), path), "missing file: %s",
          loom_last_error());
    st = loom_plan_read(tmpdir, &plan);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), tmpdir), "a folder: %s",
          loom_last_error());

    /* the minimal plan: only the required keys */
    snprintf(path, sizeof path, "%s/minimal.json", tmpdir);
    check_write_text(path,
                     "{\"model\": {\"layers\": 2, \"heads\": 2, \"d_model\": 16, \"context\": 16, "
                     "\"vocab\": 257}, \"batch\": {\"global\": 4, \"micro\": 2}, "
                     "\"mesh\": {\"dp\": 1, \"tp\": 2, \"pp\": 2}, "
                     "\"stages\": [{\"layers\": [0, 1]}, {\"layers\": [1, 2]}]}");
    st = loom_plan_read(path, &plan);
    CHECK(st == LOOM_OK, "minimal plan: %s", loom_last_error());
    if (st == LOOM_OK) {
        CHECK(plan.schedule == LOOM_SCHEDULE_1F1B &&
                  plan.dp_compression.method == LOOM_COMPRESS_NONE &&
                  plan.pp_compression.method == LOOM_COMPRESS_NONE &&
                  plan.embedding_sync == LOOM_EMBEDDING_SYNC_SEPARATE &&
                  plan.num_predicted_peak == 0 && plan.model.padded_vocab_size == 384,
              "minimal plan defaults");
        CHECK(plan.stages[0].embedding && plan.stages[1].head && !plan.stages[0].head &&
                  !plan.stages[1].embedding,
              "minimal plan stage ends");
        CHECK(!loom_plan_compresses_stage(&plan.dp_compression, 0), "none compresses nothing");
    }
    loom_plan_free(&plan);
}

/* ---- virtual stages ------------------------------------------------------------------------- */

/* The placement written out independently of loom_plan_place: Megatron's round robin, or zb-v's
 * V (down the ranks as chunk 0, back up as chunk 1). */
static void expected_place(const char *schedule, int pp, int stage, int *rank, int *chunk) {
    if (!strcmp(schedule, "zb-v")) {
        *chunk = stage < pp ? 0 : 1;
        *rank = stage < pp ? stage : 2 * pp - 1 - stage;
    } else {
        *rank = stage % pp, *chunk = stage / pp;
    }
}

/* Every stage where the schedule puts it; embedding on stage 0 and head on the last only. */
static int placed_as_expected(const loom_plan *plan) {
    int last = plan->num_stages - 1;
    for (int i = 0; i < plan->num_stages; i++) {
        const loom_plan_stage *s = &plan->stages[i];
        int rank, chunk;
        expected_place(loom_schedule_kind_name(plan->schedule), plan->pp, i, &rank, &chunk);
        if (s->rank != rank || s->chunk != chunk || !s->embedding != (i != 0) ||
            !s->head != (i != last)) {
            return 0;
        }
    }
    return 1;
}

/* The file's text, or NULL. */
static char *file_text(const char *path) {
    char *text = NULL;
    size_t size = 0;
    return loom_read_file(path, &text, &size) == LOOM_OK ? text : NULL;
}

static void test_virtual_round_trip(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/virtual.json", tmpdir);
    loom_gpt_config model = gpt2_config(); /* 12 layers */

    /* interleaved, p = 2, v = 2, uneven: ranks 0 1 0 1, chunks 0 0 1 1 */
    loom_plan plan, back, copy;
    loom_status st =
        loom_plan_uniform(&plan, &model, 2, 1, 2, 4, 64, LOOM_SCHEDULE_INTERLEAVED, 2, "4,3,3,2");
    CHECK(st == LOOM_OK, "interleaved 4,3,3,2: %s", loom_last_error());
    if (st != LOOM_OK) return;
    const int ranks[] = {0, 1, 0, 1}, chunks[] = {0, 0, 1, 1}, ends[] = {4, 7, 10, 12};
    int as_asked = plan.num_stages == 4 && plan.virtual_stages == 2;
    for (int i = 0; as_asked && i < 4; i++) {
        as_asked &= plan.stages[i].rank == ranks[i] && plan.stages[i].chunk == chunks[i] &&
                    plan.stages[i].end_layer == ends[i];
    }
    CHECK(as_asked && placed_as_expected(&plan), "interleaved: 4 virtual stages, ranks 0,1,0,1");
    plan.stages[1].recompute = plan.stages[3].recompute = LOOM_RECOMPUTE_AS_NEEDED;
    SET_ENUM(plan.pp_compression.method, "int8");
    plan.pp_compression.stages = index_list(2, (const int[]){2, 0});
    plan.pp_compression.num_stages = 2;
    st = loom_plan_write(path, &plan);
    CHECK(st == LOOM_OK, "write interleaved: %s", loom_last_error());
    st = loom_plan_read(path, &back);
    CHECK(st == LOOM_OK && plans_equal(&plan, &back), "interleaved round trip: %s",
          st == LOOM_OK ? "differs" : loom_last_error());
    if (st == LOOM_OK) loom_plan_free(&back);
    st = loom_plan_copy(&copy, &plan);
    CHECK(st == LOOM_OK && plans_equal(&copy, &plan) && copy.virtual_stages == 2 &&
              copy.stages[2].chunk == 1,
          "copy keeps the virtual stages");
    if (st == LOOM_OK) loom_plan_free(&copy);
    char *text = file_text(path);
    CHECK(text && strstr(text, "\"batch\": {\"global\": 64, \"micro\": 4, \"schedule\": "
                               "\"interleaved\", \"virtual_stages\": 2},\n"),
          "batch line with virtual_stages in:\n%s", text ? text : "(none)");
    CHECK(text && strstr(text, "    {\"layers\": [0, 4], \"rank\": 0, \"embedding\": true, "
                               "\"recompute\": \"none\"},\n"
                               "    {\"layers\": [4, 7], \"rank\": 1, \"recompute\": \"needed\"},\n"
                               "    {\"layers\": [7, 10], \"rank\": 0, \"recompute\": \"none\"},\n"
                               "    {\"layers\": [10, 12], \"rank\": 1, \"head\": true, "
                               "\"recompute\": \"needed\"}\n"),
          "stage lines with ranks in:\n%s", text ? text : "(none)");
    CHECK(text && !strstr(text, "chunk"), "the chunk is derived, not written");
    free(text);
    loom_plan_free(&plan);

    /* zb-v: v = 2 implied, the V puts stages 0..3 on ranks 0,1,1,0 */
    st = loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 4, LOOM_SCHEDULE_ZB_V, 0, NULL);
    CHECK(st == LOOM_OK, "zb-v: %s", loom_last_error());
    if (st != LOOM_OK) return;
    const int v_ranks[] = {0, 1, 1, 0};
    int v_shape = plan.virtual_stages == 2 && plan.num_stages == 4;
    for (int i = 0; v_shape && i < 4; i++) v_shape &= plan.stages[i].rank == v_ranks[i];
    CHECK(v_shape && placed_as_expected(&plan), "zb-v: ranks 0,1,1,0 with chunks 0,0,1,1");
    CHECK(plan.stages[0].end_layer == 3 && plan.stages[3].first_layer == 9,
          "zb-v: 12 layers as 3 per virtual stage");
    st = loom_plan_write(path, &plan);
    CHECK(st == LOOM_OK, "write zb-v: %s", loom_last_error());
    st = loom_plan_read(path, &back);
    CHECK(st == LOOM_OK && plans_equal(&plan, &back), "zb-v round trip: %s",
          st == LOOM_OK ? "differs" : loom_last_error());
    if (st == LOOM_OK) loom_plan_free(&back);
    text = file_text(path);
    CHECK(text && strstr(text, "\"schedule\": \"zb-v\", \"virtual_stages\": 2}") &&
              strstr(text, "{\"layers\": [6, 9], \"rank\": 1, \"recompute\": \"none\"}"),
          "zb-v file in:\n%s", text ? text : "(none)");
    free(text);
    loom_plan_free(&plan);

    /* a zb-v file may leave out both keys: v = 2 and the V's ranks */
    check_write_text(path,
                     "{\"model\": {\"layers\": 4, \"heads\": 2, \"d_model\": 16, \"context\": 16, "
                     "\"vocab\": 257}, \"batch\": {\"global\": 4, \"micro\": 2, \"schedule\": "
                     "\"zb-v\"}, \"mesh\": {\"dp\": 1, \"tp\": 1, \"pp\": 2}, "
                     "\"stages\": [{\"layers\": [0, 1]}, {\"layers\": [1, 2]}, "
                     "{\"layers\": [2, 3]}, {\"layers\": [3, 4]}]}");
    st = loom_plan_read(path, &plan);
    CHECK(st == LOOM_OK && plan.virtual_stages == 2 && placed_as_expected(&plan) &&
              plan.stages[2].rank == 1 && plan.stages[3].rank == 0,
          "zb-v without virtual_stages and ranks: %s", loom_last_error());
    loom_plan_free(&plan);
}

/* A plan with one chunk per rank is written exactly as before virtual stages. */
static void test_v1_file_unchanged(void) {
    static const char *const expected =
        "{\n"
        "  \"model\": {\"layers\": 12, \"heads\": 12, \"d_model\": 768, \"context\": 1024, "
        "\"vocab\": 50257},\n"
        "  \"batch\": {\"global\": 64, \"micro\": 4, \"schedule\": \"gpipe\"},\n"
        "  \"mesh\": {\"dp\": 2, \"tp\": 2, \"pp\": 2, \"zero\": 0},\n"
        "  \"stages\": [\n"
        "    {\"layers\": [0, 5], \"embedding\": true, \"recompute\": \"none\"},\n"
        "    {\"layers\": [5, 12], \"head\": true, \"recompute\": \"needed\"}\n"
        "  ],\n"
        "  \"compression\": {\n"
        "    \"dp\": {\"method\": \"none\"},\n"
        "    \"pp\": {\"method\": \"none\"},\n"
        "    \"embedding_sync\": \"separate\"\n"
        "  }\n"
        "}\n";
    char path[1200];
    snprintf(path, sizeof path, "%s/v1.json", tmpdir);
    loom_gpt_config model = gpt2_config();
    loom_plan plan;
    loom_status st =
        loom_plan_uniform(&plan, &model, 2, 2, 2, 4, 64, LOOM_SCHEDULE_GPIPE, 0, "5,7");
    CHECK(st == LOOM_OK, "gpipe 5,7: %s", loom_last_error());
    if (st != LOOM_OK) return;
    CHECK(plan.virtual_stages == 1 && plan.stages[1].rank == 1 && plan.stages[1].chunk == 0,
          "v = 1: stage i on rank i");
    plan.stages[1].recompute = LOOM_RECOMPUTE_AS_NEEDED;
    st = loom_plan_write(path, &plan);
    char *text = st == LOOM_OK ? file_text(path) : NULL;
    CHECK(text && !strcmp(text, expected), "v = 1 file byte for byte:\n%s\nexpected:\n%s",
          text ? text : loom_last_error(), expected);
    free(text);
    loom_plan_free(&plan);
}

static void test_virtual_split(void) {
    loom_gpt_config model = gpt2_config();
    model.num_layers = 6;
    loom_plan plan;
    /* 6 layers over p = 2, v = 2: the earlier virtual stages take the extra layer */
    loom_status st =
        loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 2, LOOM_SCHEDULE_INTERLEAVED, 2, NULL);
    CHECK(st == LOOM_OK, "6 layers, p 2, v 2: %s", loom_last_error());
    if (st == LOOM_OK) {
        const int sizes[] = {2, 2, 1, 1};
        int same = plan.num_stages == 4;
        for (int i = 0; same && i < 4; i++)
            same &= plan.stages[i].end_layer - plan.stages[i].first_layer == sizes[i];
        CHECK(same && placed_as_expected(&plan), "6 over 2 x 2 = 2,2,1,1 on ranks 0,1,0,1");
        loom_plan_free(&plan);
    }
    st = loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 2, LOOM_SCHEDULE_INTERLEAVED, 2, "1,2,2,1");
    CHECK(st == LOOM_OK && plan.stages[0].end_layer == 1 && plan.stages[1].end_layer == 3 &&
              plan.stages[2].end_layer == 5 && plan.stages[3].end_layer == 6 &&
              placed_as_expected(&plan),
          "--stage-layers 1,2,2,1 over 4 virtual stages: %s", loom_last_error());
    loom_plan_free(&plan);
    st = loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 2, LOOM_SCHEDULE_INTERLEAVED, 2, "3,3");
    CHECK(st == LOOM_ERR_INPUT &&
              strstr(loom_last_error(),
                     "plan: stage_layers: expected 4 comma-separated positive layer counts, one "
                     "per virtual stage (mesh.pp x batch.virtual_stages = 2 x 2), got 2 in "
                     "\"3,3\""),
          "two counts for four virtual stages: %s", loom_last_error());
    CHECK(is_empty_plan(&plan), "a failed build leaves an empty plan");

    /* the schedule's v when none is asked for */
    const struct {
        const char *schedule;
        int virtual_stages;
    } defaults[] = {{"interleaved", LOOM_PLAN_DEFAULT_VIRTUAL_STAGES},
                    {"zb-v", 2},
                    {"zb-h1", 1},
                    {"gpipe", 1},
                    {NULL, 1}};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) {
        st =
            loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 2, kind_of(defaults[i].schedule), 0, NULL);
        CHECK(st == LOOM_OK && plan.virtual_stages == defaults[i].virtual_stages &&
                  plan.num_stages == 2 * defaults[i].virtual_stages && placed_as_expected(&plan),
              "%s: v %d by default: %s", defaults[i].schedule ? defaults[i].schedule : "default",
              defaults[i].virtual_stages, loom_last_error());
        loom_plan_free(&plan);
    }

    /* every even split of 1..16 layers over p x v virtual stages, in both placements */
    int all_ok = 1;
    for (int layers = 1; layers <= 16; layers++) {
        model.num_layers = layers;
        for (int pp = 1; pp <= layers; pp++) {
            for (int v = 2; v <= 3 && pp * v <= layers; v++) {
                const char *schedule = v == 2 && pp % 2 ? "zb-v" : "interleaved";
                st = loom_plan_uniform(&plan, &model, 1, 1, pp, 1, pp, kind_of(schedule), v, NULL);
                if (st != LOOM_OK) {
                    all_ok = 0;
                    continue;
                }
                check_split(&plan, layers, pp * v);
                all_ok &= placed_as_expected(&plan);
                loom_plan_free(&plan);
            }
        }
    }
    CHECK(all_ok, "every split of 1..16 layers over p x v virtual stages builds, placed");

    /* the rules, through the constructor's plan paths */
    model.num_layers = 12;
    const struct {
        const char *schedule;
        int pp, virtual_stages, global;
        const char *message;
    } refused[] = {
        {"1f1b", 2, 2, 2, "plan: batch.virtual_stages: expected 1 for schedule \"1f1b\""},
        {"interleaved", 2, 1, 2, "plan: batch.virtual_stages: expected at least 2"},
        {"zb-v", 2, 3, 2, "plan: batch.virtual_stages: expected 2 for schedule \"zb-v\""},
        {"interleaved", 2, 7, 2,
         "plan: mesh.pp: expected at most model.layers 12 virtual stages (one layer each at "
         "least), got mesh.pp x batch.virtual_stages = 2 x 7 = 14"},
        {"zb-v", 7, 0, 7, "plan: mesh.pp: expected at most model.layers 12 virtual stages"},
        {"interleaved", 2, 2, 3,
         "plan: batch.global: expected a multiple of batch.micro * mesh.dp * mesh.pp = 1*1*2 = 2 "
         "with schedule \"interleaved\" (its micro-batches per step must be a multiple of "
         "mesh.pp, Megatron's rule), got 3 (3 micro-batches)"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        st = loom_plan_uniform(&plan, &model, 1, 1, refused[i].pp, 1, refused[i].global,
                               kind_of(refused[i].schedule), refused[i].virtual_stages, NULL);
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), refused[i].message),
              "refused %zu: expected '%s', got %s", i, refused[i].message,
              st == LOOM_OK ? "ok" : loom_last_error());
        CHECK(is_empty_plan(&plan), "refused %zu leaves an empty plan", i);
        loom_plan_free(&plan);
    }
}

/* An interleaved plan (p = 2, v = 2, uneven) to break one rule at a time. */
static const char *valid_interleaved =
    "{\n"
    "  \"model\":   {\"layers\": 12, \"heads\": 12, \"d_model\": 768, \"context\": 1024, "
    "\"vocab\": 50257},\n"
    "  \"batch\":   {\"global\": 64, \"micro\": 4, \"schedule\": \"interleaved\", "
    "\"virtual_stages\": 2},\n"
    "  \"mesh\":    {\"dp\": 2, \"tp\": 2, \"pp\": 2},\n"
    "  \"stages\":  [{\"layers\": [0, 4], \"rank\": 0, \"embedding\": true, \"recompute\": "
    "false},\n"
    "              {\"layers\": [4, 7], \"rank\": 1, \"recompute\": true},\n"
    "              {\"layers\": [7, 10], \"rank\": 0, \"recompute\": false},\n"
    "              {\"layers\": [10, 12], \"rank\": 1, \"head\": true, \"recompute\": "
    "\"needed\"}],\n"
    "  \"compression\": {\"dp\": {\"method\": \"powersgd\", \"rank\": 4, \"stages\": [1]},\n"
    "                  \"pp\": {\"method\": \"lowrank\", \"rank\": 8, \"links\": [2, 0]},\n"
    "                  \"embedding_sync\": \"fused\"}\n"
    "}\n";

static const broken_case broken_interleaved[] = {
    {"\"rank\": 1, \"head\"", "\"rank\": 0, \"head\"", 0, 0, "stages[3].rank",
     "expected 1 (interleaved places virtual stage 3 of 4 on rank 1), got 0"},
    {"\"rank\": 0, \"recompute\"", "\"rank\": -1, \"recompute\"", 0, 0, "stages[2].rank",
     "expected 0 (interleaved places virtual stage 2 of 4 on rank 0), got -1"},
    {"\"global\": 64", "\"global\": 72", 0, 0, "batch.global",
     "expected a multiple of batch.micro * mesh.dp * mesh.pp = 4*2*2 = 16 with schedule "
     "\"interleaved\" (its micro-batches per step must be a multiple of mesh.pp, Megatron's "
     "rule), got 72 (9 micro-batches)"},
    {"\"virtual_stages\": 2", "\"virtual_stages\": 3", 0, 0, "stages",
     "expected mesh.pp x batch.virtual_stages = 2 x 3 = 6 virtual stages, got 4"},
    {"\"virtual_stages\": 2", "\"virtual_stages\": 1", 0, 0, "batch.virtual_stages",
     "expected at least 2 for schedule \"interleaved\""},
    {", \"virtual_stages\": 2", "", 0, 0, "batch.virtual_stages",
     "expected at least 2 for schedule \"interleaved\" (model chunks per pipeline rank; one chunk "
     "is 1f1b), got 1"},
    {"\"virtual_stages\": 2", "\"virtual_stages\": 7", 0, 0, "mesh.pp",
     "expected at most model.layers 12 virtual stages (one layer each at least), got mesh.pp x "
     "batch.virtual_stages = 2 x 7 = 14"},
    {"\"links\": [2, 0]", "\"links\": [3, 0]", 0, 0, "compression.pp.links[0]",
     "expected a link index in [0, 3) (link s joins virtual stages s and s + 1 of mesh.pp x "
     "batch.virtual_stages = 4), got 3"},
    {"\"stages\": [1]", "\"stages\": [2]", 0, 0, "compression.dp.stages[0]",
     "expected a stage index in [0, 2) (mesh.pp = 2), got 2"},
    {"\"rank\": 1, \"recompute\": true", "\"rank\": 1, \"head\": true, \"recompute\": true", 0, 0,
     "stages[1].head", "expected false (only the last stage runs the head)"},
    {"[4, 7]", "[4, 6]", 0, 0, "stages[2].layers", "expected to start where stages[1] ends"},
    {"\"interleaved\"", "\"zb-v\"", "\"recompute\": true", "\"recompute\": false", "stages[2].rank",
     "expected 1 (zb-v places virtual stage 2 of 4 on rank 1), got 0"},
    {"\"rank\": 0, \"embedding\"", "\"rank\": 0, \"chunk\": 0, \"embedding\"", 0, 0,
     "stages[0].chunk", "unknown key"},
};

static void test_virtual_rules(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/valid_interleaved.json", tmpdir);
    check_write_text(path, valid_interleaved);
    loom_plan plan;
    loom_status st = loom_plan_read(path, &plan);
    CHECK(st == LOOM_OK, "the valid interleaved plan reads: %s", loom_last_error());
    if (st == LOOM_OK) {
        CHECK(plan.virtual_stages == 2 && plan.num_stages == 4 && placed_as_expected(&plan) &&
                  plan.stages[1].recompute && plan.pp_compression.num_stages == 2,
              "interleaved plan fields");
        /* links are virtual-stage boundaries, dp's stages pipeline ranks */
        CHECK(loom_plan_compresses_stage(&plan.pp_compression, 2) &&
                  !loom_plan_compresses_stage(&plan.pp_compression, 1) &&
                  loom_plan_compresses_stage(&plan.dp_compression, 1) &&
                  !loom_plan_compresses_stage(&plan.dp_compression, 0),
              "links 2 and 0, dp on rank 1");
        st = loom_plan_check(&plan, path, 8);
        CHECK(st == LOOM_OK, "8 ranks, not 16, run 4 virtual stages on pp 2: %s",
              loom_last_error());

        /* what a file cannot say: the chunk, recompute under zb-h1 */
        loom_plan p = plan;
        loom_plan_stage stages[4];
        memcpy(stages, plan.stages, sizeof stages);
        p.stages = stages;
        stages[1].chunk = 1;
        expect_refused(&p, "chunk 1 for virtual stage 1", "stages[1].chunk",
                       "expected 0 (interleaved runs virtual stage 1 of 4 as chunk 0 of rank 1), "
                       "got 1");
        loom_plan_free(&plan);
    }
    check_broken_cases(valid_interleaved, broken_interleaved,
                       sizeof broken_interleaved / sizeof broken_interleaved[0], "interleaved");

    loom_gpt_config model = gpt2_config();
    loom_plan one;
    /* one pipeline rank with two chunks has a link between them, so V, not pp, decides */
    st = loom_plan_uniform(&one, &model, 1, 1, 1, 1, 1, LOOM_SCHEDULE_INTERLEAVED, 2, NULL);
    CHECK(st == LOOM_OK, "interleaved on one rank: %s", loom_last_error());
    if (st == LOOM_OK) {
        loom_plan p = one;
        SET_ENUM(p.pp_compression.method, "int8");
        st = loom_plan_check(&p, "mem", 0);
        CHECK(st == LOOM_OK, "int8 on the link between two chunks of one rank: %s",
              loom_last_error());
        SET_ENUM(p.embedding_sync, "fused");
        expect_refused(&p, "fused with pp 1", "compression.embedding_sync",
                       "\"fused\" needs pipeline parallelism (pp > 1)");
        loom_plan_free(&one);
    }
}

/* loom_plan_from_request names the flags. */
static void test_virtual_request(void) {
    loom_gpt_config model = gpt2_config(); /* 12 layers */
    const struct {
        loom_plan_request request;
        const char *message;
    } refused[] = {
        {{.pp = 2, .schedule = "1f1b", .virtual_stages = 2},
         "--virtual-stages: expected 1 with --schedule 1f1b (one model chunk per pipeline rank; "
         "--schedule interleaved takes more), got 2"},
        {{.pp = 2, .virtual_stages = 3},
         "--virtual-stages: expected 1 with --schedule 1f1b, the default (one model chunk"},
        {{.pp = 2, .schedule = "zb-h1", .virtual_stages = 2},
         "--virtual-stages: expected 1 with --schedule zb-h1"},
        {{.pp = 2, .schedule = "zb-v", .virtual_stages = 3},
         "--virtual-stages: expected 2 with --schedule zb-v (its V runs two model chunks on every "
         "rank), got 3"},
        {{.pp = 2, .schedule = "interleaved", .virtual_stages = 1},
         "--virtual-stages: expected at least 2 with --schedule interleaved (model chunks per "
         "pipeline rank; one chunk is --schedule 1f1b), got 1"},
        {{.pp = 2, .schedule = "interleaved", .virtual_stages = 7},
         "--virtual-stages: expected at most 6 with --pipeline-parallel 2 (a layer per virtual "
         "stage at least, of model.layers 12), got 7"},
        {{.pp = 2, .schedule = "interleaved", .virtual_stages = -1},
         "--virtual-stages: expected a positive integer, got -1"},
        {{.pp = 2, .schedule = "zero-bubble"},
         "--schedule: batch.schedule: expected one of \"gpipe\", \"1f1b\", \"interleaved\", "
         "\"zb-h1\" or \"zb-v\", got \"zero-bubble\""},
        {{.pp = 2, .schedule = "interleaved", .micro_batches = 3},
         "--micro-batches: expected a multiple of --pipeline-parallel 2 with --schedule "
         "interleaved (Megatron's rule), got 3"},
        {{.pp = 2, .schedule = "interleaved", .micro_batch = 8, .global_batch = 24},
         "--global-batch-size: expected a multiple of micro batch 8 x data parallel 1 x "
         "--pipeline-parallel 2 = 16 with --schedule interleaved"},
        {{.pp = 7, .schedule = "zb-v"},
         "plan: mesh.pp: expected at most model.layers 12 virtual stages"},
    };
    loom_plan plan;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        loom_status st = loom_plan_from_request(&plan, &model, &refused[i].request, 0);
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), refused[i].message),
              "request %zu: expected '%s', got %s", i, refused[i].message,
              st == LOOM_OK ? "ok" : loom_last_error());
        CHECK(is_empty_plan(&plan), "request %zu leaves an empty plan", i);
        loom_plan_free(&plan);
    }

    loom_plan_request request = {
        .pp = 2, .schedule = "interleaved", .virtual_stages = 3, .recompute = 1};
    loom_status st = loom_plan_from_request(&plan, &model, &request, 4);
    CHECK(st == LOOM_OK && plan.virtual_stages == 3 && plan.num_stages == 6 && plan.dp == 2 &&
              loom_plan_num_micro_batches(&plan) == 2 && placed_as_expected(&plan) &&
              plan.stages[5].recompute,
          "interleaved v 3 on 4 ranks with recompute: %s", loom_last_error());
    loom_plan_free(&plan);
    request = (loom_plan_request){.pp = 2, .schedule = "zb-v", .virtual_stages = 2};
    st = loom_plan_from_request(&plan, &model, &request, 0);
    CHECK(st == LOOM_OK && plan.num_stages == 4 && plan.stages[3].rank == 0 &&
              placed_as_expected(&plan),
          "zb-v with its own v given: %s", loom_last_error());
    loom_plan_free(&plan);
    request = (loom_plan_request){.pp = 2, .schedule = "interleaved"};
    st = loom_plan_from_request(&plan, &model, &request, 0);
    CHECK(st == LOOM_OK && plan.virtual_stages == LOOM_PLAN_DEFAULT_VIRTUAL_STAGES &&
              loom_plan_num_micro_batches(&plan) == 2,
          "interleaved: the default v and pp micro-batches: %s", loom_last_error());
    loom_plan_free(&plan);
}

/* Islands from the flags: the island count takes its share of the ranks and of the global
 * batch, and the outer flags are refused without --islands (the rules' own statements). */
static void test_islands_flags(void) {
    loom_gpt_config model = gpt2_config();
    loom_layout_flags f;
    loom_layout_flags_defaults(&f);
    f.islands = 2, f.micro_batch_size = 2, f.global_batch_size = 8, f.inner_steps = 10;
    loom_plan plan;
    loom_status st = loom_plan_from_flags(&plan, &model, &f, 4);
    CHECK(st == LOOM_OK && plan.dp == 2 && plan.islands.count == 2 &&
              plan.islands.inner_steps == 10 && loom_plan_num_micro_batches(&plan) == 1 &&
              loom_plan_job_ranks(&plan) == 4 && plan.islands.optimizer == LOOM_OUTER_NESTEROV &&
              plan.islands.lr == LOOM_PLAN_DEFAULT_OUTER_LR &&
              plan.islands.momentum == LOOM_PLAN_DEFAULT_OUTER_MOMENTUM,
          "2 islands on 4 ranks: dp %d, %d micro-batches: %s", plan.dp,
          loom_plan_num_micro_batches(&plan), st == LOOM_OK ? "" : loom_last_error());
    if (st == LOOM_OK) {
        /* the same plan on the 2 ranks of one island's mesh is refused, naming the count */
        st = loom_plan_check(&plan, "p", 2);
        CHECK(st == LOOM_ERR_INPUT &&
                  strstr(loom_last_error(), "p: islands.count: expected islands x dp*tp*pp to "
                                            "equal the 2 ranks launched, got 2 x 2*1*1 = 4"),
              "islands on too few ranks: %s", st == LOOM_OK ? "accepted" : loom_last_error());
        loom_plan_free(&plan);
    }
    f.islands = 3;
    st = loom_plan_from_flags(&plan, &model, &f, 4);
    CHECK(st == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "--tensor-parallel 1 x --pipeline-parallel 1 x "
                                        "--islands = 3: expected a divisor of the 4 ranks"),
          "3 islands on 4 ranks: %s", st == LOOM_OK ? "accepted" : loom_last_error());
    if (st == LOOM_OK) loom_plan_free(&plan);
    f.islands = 0;
    st = loom_plan_from_flags(&plan, &model, &f, 4);
    CHECK(st == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "--inner-steps: expected only with --islands K"),
          "--inner-steps without islands: %s", st == LOOM_OK ? "accepted" : loom_last_error());
    if (st == LOOM_OK) loom_plan_free(&plan);
    loom_layout_flags_defaults(&f);
    f.islands = 2;
    snprintf(f.outer_compression, sizeof f.outer_compression, "sign");
    st = loom_plan_from_flags(&plan, &model, &f, 2);
    CHECK(st == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "islands.compression: \"sign\" outer gradients are not "
                                        "built yet"),
          "--outer-compression sign: %s", st == LOOM_OK ? "accepted" : loom_last_error());
    if (st == LOOM_OK) loom_plan_free(&plan);
    /* a value given is checked as the plan file's is, never taken for "not given" (0 inner
     * steps once became the default 100, a negative momentum 0.9) */
    static const struct {
        int inner_steps, fragments, rank;
        double lr, momentum;
        const char *method, *expect;
    } bad[] = {
        {0, 1, 4, 0.7, 0.9, "",
         "islands.inner_steps: expected at least 1 inner step a round, "
         "got 0"},
        {10, 0, 4, 0.7, 0.9, "", "islands.fragments: expected 1 to 10 fragments"},
        {10, 1, 4, 0.0, 0.9, "", "islands.outer_lr: expected a positive learning rate, got 0"},
        {10, 1, 4, 0.7, -0.5, "", "islands.outer_momentum: expected a value in [0, 1), got -0.5"},
        {10, 1, 0, 0.7, 0.9, "powersgd", "islands.compression_rank: expected a positive rank"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        loom_layout_flags_defaults(&f);
        f.islands = 2, f.inner_steps = bad[i].inner_steps, f.outer_fragments = bad[i].fragments;
        f.outer_compression_rank = bad[i].rank, f.outer_lr = bad[i].lr;
        f.outer_momentum = bad[i].momentum;
        snprintf(f.outer_compression, sizeof f.outer_compression, "%s", bad[i].method);
        st = loom_plan_from_flags(&plan, &model, &f, 2);
        CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), bad[i].expect),
              "flags case %zu: %s", i, st == LOOM_OK ? "accepted" : loom_last_error());
        if (st == LOOM_OK) loom_plan_free(&plan);
    }
    /* without islands the outer settings at their defaults are accepted (the defaults and the
     * comparison agree), and one off its default is refused by name */
    loom_layout_flags_defaults(&f);
    f.outer_momentum = LOOM_PLAN_DEFAULT_OUTER_MOMENTUM;
    st = loom_plan_from_flags(&plan, &model, &f, 2);
    CHECK(st == LOOM_OK, "the defaults without islands: %s",
          st == LOOM_OK ? "" : loom_last_error());
    if (st == LOOM_OK) loom_plan_free(&plan);
    f.outer_momentum = 0;
    st = loom_plan_from_flags(&plan, &model, &f, 2);
    CHECK(st == LOOM_ERR_INPUT &&
              strstr(loom_last_error(), "--outer-momentum: expected only with --islands K"),
          "--outer-momentum 0 without islands: %s", st == LOOM_OK ? "accepted" : loom_last_error());
    if (st == LOOM_OK) loom_plan_free(&plan);
}

/* The keys settled for the memory and islands issues: mesh.zero (an integer; older files'
 * top-level zero1 read as 0/1; left out, loom_plan_default_zero's rule, written back), the
 * recompute words (older booleans read as none/needed), predicted.seq_len, and the reserved
 * keys refused by name. Each expectation is the rule's own statement, not an earlier output. */
static void test_settled_keys(void) {
    char path[1200], text[4096];
    const struct {
        const char *find, *replace; /* an edit of valid_plan ("" find: none) */
        int zero;                   /* the zero read, or -1: refused */
        const char *message;        /* the refusal's piece */
    } cases[] = {
        /* dp 2 with PowerSGD: compression all-reduces, so the default is no ZeRO */
        {"", "", 0, NULL},
        {"\"pp\": 2}", "\"pp\": 2, \"zero\": 1}", 1, NULL},
        {"\"pp\": 2}", "\"pp\": 2, \"zero\": 0}", 0, NULL},
        {"\"mesh\":", "\"zero1\": true, \"mesh\":", 1, NULL},
        {"\"mesh\":", "\"zero1\": false, \"mesh\":", 0, NULL},
        /* ZeRO-2/3 reduce-scatter shards, quantised as int8 or bf16: the plan's PowerSGD
         * cannot run with them */
        {"\"pp\": 2}", "\"pp\": 2, \"zero\": 2}", -1,
         "compression.dp.method: powersgd with mesh.zero 2: not run (PowerSGD allreduces"},
        {"\"pp\": 2}", "\"pp\": 2, \"zero\": 3}", -1,
         "compression.dp.method: powersgd with mesh.zero 3: not run ("},
        {"\"pp\": 2}", "\"pp\": 2, \"zero3_prefetch\": 9}", -1,
         "mesh.zero3_prefetch: expected 0 to 8 units gathered ahead, got 9"},
        {"\"pp\": 2}", "\"pp\": 2, \"zero3_gather\": \"always\"}", -1,
         "mesh.zero3_gather: expected \"micro_batch\" or \"step\""},
        {"\"pp\": 2}", "\"pp\": 2, \"zero3_gather\": \"step\"}", 0, NULL},
        {"\"pp\": 2}", "\"pp\": 2, \"zero\": 4}", -1,
         "mesh.zero: expected a ZeRO stage 0, 1, 2 or 3, got 4"},
        {"\"pp\": 2}", "\"pp\": 2, \"zero\": true}", -1, "mesh.zero"},
        {"\"pp\": 2}", "\"pp\": 2, \"zero\": 1}, \"zero1\": true, \"x\": {", -1,
         "zero1: expected either mesh.zero or (in older files) zero1, got both"},
        {"\"mesh\":", "\"zero1\": 1, \"mesh\":", -1, "zero1: expected true or false"},
        {"\"pp\": 2}", "\"pp\": 2, \"sequence_parallel\": false}", 0, NULL},
        {"\"pp\": 2}", "\"pp\": 2, \"sequence_parallel\": true}", 0, NULL},
        {"\"tp\": 2, \"pp\": 2}", "\"tp\": 1, \"pp\": 2, \"sequence_parallel\": true}", -1,
         "mesh.sequence_parallel: expected false with mesh.tp 1"},
        /* islands: the world in K meshes; every key but count has a default */
        {"\"mesh\":", "\"islands\": {\"count\": 2}, \"mesh\":", 0, NULL},
        {"\"mesh\":",
         "\"islands\": {\"count\": 2, \"inner_steps\": 50, \"outer_optimizer\": \"sgd\", "
         "\"outer_lr\": 1, \"outer_momentum\": 0, \"fragments\": 4, \"compression\": \"int8\"}, "
         "\"mesh\":",
         0, NULL},
        {"\"mesh\":", "\"islands\": {\"count\": 0}, \"mesh\":", -1,
         "islands.count: expected a positive number of islands, got 0"},
        {"\"mesh\":", "\"islands\": {\"inner_steps\": 5}, \"mesh\":", -1, "islands.count"},
        {"\"mesh\":", "\"islands\": {\"count\": 2, \"inner_steps\": 0}, \"mesh\":", -1,
         "islands.inner_steps: expected at least 1 inner step a round, got 0"},
        {"\"mesh\":", "\"islands\": {\"count\": 2, \"fragments\": 13}, \"mesh\":", -1,
         "islands.fragments: expected 1 to 12 fragments (at most model.layers 12"},
        {"\"mesh\":",
         "\"islands\": {\"count\": 2, \"inner_steps\": 4, \"fragments\": 5}, \"mesh\":", -1,
         "islands.fragments: expected 1 to 4 fragments"},
        {"\"mesh\":",
         "\"islands\": {\"count\": 2, \"inner_steps\": 4, \"overlap_steps\": 3}, \"mesh\":", 0,
         NULL},
        {"\"mesh\":",
         "\"islands\": {\"count\": 2, \"inner_steps\": 4, \"overlap_steps\": 4}, \"mesh\":", -1,
         "islands.overlap_steps: expected 0 to 3 inner steps a sync runs behind"},
        /* PowerSGD and top-k with the valid plan's dp 2: each replica compresses a share of
         * the matrices */
        {"\"mesh\":", "\"islands\": {\"count\": 2, \"compression\": \"powersgd\"}, \"mesh\":", 0,
         NULL},
        {"\"mesh\":",
         "\"islands\": {\"count\": 2, \"inner_steps\": 4, \"fragments\": 2, \"overlap_steps\": 1, "
         "\"compression\": \"topk\"}, \"mesh\":",
         0, NULL},
        {"\"mesh\":", "\"islands\": {\"count\": 2, \"compression\": \"sign\"}, \"mesh\":", -1,
         "islands.compression: \"sign\" outer gradients are not built yet"},
        {"\"mesh\":",
         "\"islands\": {\"count\": 2, \"compression\": \"topk\", \"compression_fraction\": 1.5}, "
         "\"mesh\":",
         -1, "islands.compression_fraction: expected the share of entries kept, in (0, 1]"},
        {"\"mesh\":",
         "\"islands\": {\"count\": 2, \"compression\": \"int8\", \"compression_fraction\": 0.1}, "
         "\"mesh\":",
         -1, "islands.compression_fraction: expected the share of entries kept"},
        {"\"mesh\":",
         "\"islands\": {\"count\": 2, \"compression\": \"int8\", \"compression_rank\": 4}, "
         "\"mesh\":",
         -1, "islands.compression_rank: expected a positive rank with powersgd outer gradients"},
        {"\"mesh\":", "\"islands\": {\"count\": 2, \"outer_optimizer\": \"adam\"}, \"mesh\":", -1,
         "islands.outer_optimizer: expected"},
        {"\"mesh\":", "\"islands\": {\"count\": 2, \"outer_momentum\": 1}, \"mesh\":", -1,
         "islands.outer_momentum: expected a value in [0, 1), got 1"},
        {"\"mesh\":", "\"islands\": {\"count\": 2, \"h\": 1}, \"mesh\":", -1, "islands"},
        /* each of 3 islands trains 64 / 3 sequences: not whole micro-batches */
        {"\"mesh\":", "\"islands\": {\"count\": 3}, \"mesh\":", -1,
         "batch.global: expected a multiple of batch.micro * mesh.dp * islands.count = 4*2*3 = 24"},
        {"\"recompute\": true}", "\"recompute\": \"needed\"}", 0, NULL},
        {"\"recompute\": false}", "\"recompute\": \"always\"}", 0, NULL},
        {"\"recompute\": true}", "\"recompute\": \"selective\"}", 0, NULL},
        {"\"recompute\": true}", "\"recompute\": \"sometimes\"}", -1,
         "stages[1].recompute: expected \"none\", \"needed\", \"always\" or \"selective\""},
        {"\"step_s\": 0.0", "\"seq_len\": 512, \"step_s\": 0.0", 0, NULL},
        {"\"step_s\": 0.0", "\"seq_len\": -1, \"step_s\": 0.0", -1, "predicted.seq_len"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *find = cases[i].find[0] ? cases[i].find : "{";
        const char *replace = cases[i].find[0] ? cases[i].replace : "{";
        if (!check_edit_text(valid_plan, find, replace, text, sizeof text)) continue;
        /* the case with both keys needs its stray object closed */
        if (strstr(text, "\"x\": {")) {
            char *x = strstr(text, ", \"x\": {");
            memmove(x, x + 8, strlen(x + 8) + 1);
        }
        snprintf(path, sizeof path, "%s/settled_%02zu.json", tmpdir, i);
        check_write_text(path, text);
        loom_plan plan;
        loom_status st = loom_plan_read(path, &plan);
        if (cases[i].zero < 0) {
            CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), cases[i].message),
                  "settled case %zu: expected '%s', got %s", i, cases[i].message,
                  st == LOOM_OK ? "ok" : loom_last_error());
            continue;
        }
        CHECK(st == LOOM_OK && plan.zero == cases[i].zero,
              "settled case %zu: zero %d, expected %d: %s", i, st == LOOM_OK ? plan.zero : -1,
              cases[i].zero, st == LOOM_OK ? "" : loom_last_error());
        if (st != LOOM_OK) continue;
        /* written back, every key is said, and it reads back equal */
        snprintf(path, sizeof path, "%s/settled_%02zu_back.json", tmpdir, i);
        loom_plan back;
        st = loom_plan_write(path, &plan);
        if (st == LOOM_OK) st = loom_plan_read(path, &back);
        CHECK(st == LOOM_OK && plans_equal(&plan, &back) && back.zero == plan.zero &&
                  back.predicted_seq_len == plan.predicted_seq_len,
              "settled case %zu round trip: %s", i, st == LOOM_OK ? "differs" : loom_last_error());
        char *written = file_text(path);
        char zero_key[32];
        snprintf(zero_key, sizeof zero_key, "\"zero\": %d", plan.zero);
        CHECK(written && strstr(written, zero_key) && !strstr(written, "zero1") &&
                  !strstr(written, "\"recompute\": true") &&
                  !strstr(written, "\"recompute\": false"),
              "settled case %zu: written with mesh.zero and recompute words:\n%s", i,
              written ? written : "(none)");
        free(written);
        if (st == LOOM_OK) loom_plan_free(&back);
        loom_plan_free(&plan);
    }
    /* the default without compression: ZeRO-1 with dp > 1, none with one replica */
    loom_gpt_config model = gpt2_config();
    loom_plan_request request = {.dp = 2, .pp = 2, .micro_batch = 4, .global_batch = 64};
    loom_plan plan;
    loom_status st = loom_plan_from_request(&plan, &model, &request, 0);
    CHECK(st == LOOM_OK && plan.zero == 1 && plan.overlap_grad_reduce, "request dp 2: zero %d: %s",
          plan.zero, loom_last_error());
    if (st == LOOM_OK) loom_plan_free(&plan);
    request.dp = 1, request.global_batch = 32;
    st = loom_plan_from_request(&plan, &model, &request, 0);
    CHECK(st == LOOM_OK && plan.zero == 0, "request dp 1: zero %d", plan.zero);
    if (st == LOOM_OK) loom_plan_free(&plan);
    request.dp = 2, request.global_batch = 64, request.zero_given = 1, request.zero = 0;
    request.no_overlap_grad_reduce = 1;
    st = loom_plan_from_request(&plan, &model, &request, 0);
    CHECK(st == LOOM_OK && plan.zero == 0 && !plan.overlap_grad_reduce,
          "request zero 0, no overlap: zero %d overlap %d", plan.zero, plan.overlap_grad_reduce);
    if (st == LOOM_OK) loom_plan_free(&plan);
    request.zero = 5;
    st = loom_plan_from_request(&plan, &model, &request, 0);
    CHECK(st == LOOM_ERR_INPUT && strstr(loom_last_error(), "--zero: expected a ZeRO stage"),
          "request zero 5: %s", st == LOOM_OK ? "ok" : loom_last_error());
    /* an interleaved rank's chunks must agree on recomputation: refused by the plan's check, so
     * `loom plan --check` and `loom train --plan` say the same */
    st = loom_plan_uniform(&plan, &model, 1, 1, 2, 1, 4, LOOM_SCHEDULE_INTERLEAVED, 2, NULL);
    CHECK(st == LOOM_OK, "interleaved: %s", loom_last_error());
    if (st == LOOM_OK) {
        plan.stages[1].recompute = LOOM_RECOMPUTE_ALWAYS;
        st = loom_plan_check(&plan, "mem", 0);
        CHECK(st == LOOM_ERR_INPUT &&
                  strstr(loom_last_error(),
                         "mem: stages[3].recompute: expected \"always\", as stages[1] (pipeline "
                         "rank 1 runs both"),
              "chunks that disagree: %s", st == LOOM_OK ? "ok" : loom_last_error());
        plan.stages[3].recompute = LOOM_RECOMPUTE_ALWAYS;
        CHECK(loom_plan_check(&plan, "mem", 0) == LOOM_OK, "chunks that agree: %s",
              loom_last_error());
        loom_plan_free(&plan);
    }
}

int main(void) {
    tmpdir = check_tmpdir();
    test_round_trip();
    test_llama_round_trip();
    test_rank_layout();
    test_stage_split();
    test_rules();
    test_malformed();
    test_compression_round_trip();
    test_compression_defaults();
    test_compression_rules();
    test_request_compression();
    test_compression_flags();
    test_virtual_round_trip();
    test_v1_file_unchanged();
    test_virtual_split();
    test_virtual_rules();
    test_virtual_request();
    test_settled_keys();
    test_islands_flags();
    return check_finish();
}
