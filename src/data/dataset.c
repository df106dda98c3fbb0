/*
 * dataset.c — a dataset is the concatenation of the shards matched by one or more glob
 * patterns, sorted by path. The shards are probed first (header and size), so the tokens are
 * read straight into one allocation of exactly the right size; every token is checked against
 * the vocabulary once, here, so the loader and the model never need to.
 *
 * Not here: sample order (loader.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "shard_stream.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>

struct loom_dataset {
    char *pattern;
    char **files; /* (num_files,) sorted, distinct */
    int num_files;
    uint16_t *tokens; /* (num_tokens,) all shards back to back */
    size_t num_tokens;
};

typedef struct {
    char **items;
    size_t count, cap;
} path_list;

static loom_status path_list_add(path_list *list, const char *path) {
    if (list->count == list->cap) {
        size_t cap = list->cap ? 2 * list->cap : 16;
        char **items = realloc(list->items, cap * sizeof *items);
        if (!items) return loom_fail(LOOM_ERR_NOMEM, "out of memory listing shards");
        list->items = items;
        list->cap = cap;
    }
    list->items[list->count] = strdup(path);
    if (!list->items[list->count]) return loom_fail(LOOM_ERR_NOMEM, "out of memory listing shards");
    list->count++;
    return LOOM_OK;
}

static void path_list_free(path_list *list) {
    for (size_t i = 0; i < list->count; i++) free(list->items[i]);
    free(list->items);
}

static int compare_paths(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static loom_status glob_one(const char *pattern, path_list *list) {
    glob_t matches;
    int rc = glob(pattern, 0, NULL, &matches);
    loom_status status = LOOM_OK;
    if (rc == GLOB_NOMATCH) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: no file matches this data pattern", pattern);
    } else if (rc == GLOB_NOSPACE) {
        status = loom_fail(LOOM_ERR_NOMEM, "%s: out of memory expanding pattern", pattern);
    } else if (rc != 0) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: cannot read a directory of this pattern", pattern);
    } else {
        for (size_t i = 0; i < matches.gl_pathc && status == LOOM_OK; i++) {
            status = path_list_add(list, matches.gl_pathv[i]);
        }
    }
    if (rc == 0) globfree(&matches);
    return status;
}

/* Splits the comma-separated pattern list (items trimmed of blanks) and globs each item. */
static loom_status expand_patterns(const char *patterns, path_list *list) {
    char *copy = strdup(patterns);
    if (!copy) return loom_fail(LOOM_ERR_NOMEM, "out of memory reading data pattern");
    loom_status status = LOOM_OK;
    char *item = copy;
    while (status == LOOM_OK) {
        char *comma = strchr(item, ',');
        if (comma) *comma = '\0';
        while (*item == ' ' || *item == '\t') item++;
        size_t len = strlen(item);
        while (len > 0 && (item[len - 1] == ' ' || item[len - 1] == '\t')) item[--len] = '\0';
        if (len == 0) {
            status = loom_fail(LOOM_ERR_INPUT,
                               "data pattern \"%s\": expected comma-separated glob patterns, "
                               "found an empty one",
                               patterns);
        } else {
            status = glob_one(item, list);
        }
        if (!comma) break;
        item = comma + 1;
    }
    free(copy);
    if (status != LOOM_OK) return status;
    qsort(list->items, list->count, sizeof *list->items, compare_paths);
    size_t kept = 0;
    for (size_t i = 0; i < list->count; i++) {
        if (kept > 0 && strcmp(list->items[kept - 1], list->items[i]) == 0) {
            free(list->items[i]);
        } else {
            list->items[kept++] = list->items[i];
        }
    }
    list->count = kept;
    return LOOM_OK;
}

static loom_status check_vocab(const char *path, const uint16_t *tokens, size_t count,
                               int vocab_size) {
    for (size_t i = 0; i < count; i++) {
        if (tokens[i] >= vocab_size) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: token at position %zu is %u: expected < vocab size %d", path, i,
                             (unsigned)tokens[i], vocab_size);
        }
    }
    return LOOM_OK;
}

/* Probes every shard, allocates once, reads and checks each shard in place. */
static loom_status load_tokens(loom_dataset *ds, int vocab_size) {
    size_t *counts = loom_calloc((size_t)ds->num_files, sizeof *counts, "shard counts");
    if (!counts) return LOOM_ERR_NOMEM;
    loom_status status = LOOM_OK;
    size_t total = 0;
    for (int i = 0; i < ds->num_files && status == LOOM_OK; i++) {
        status = loom_shard_probe(ds->files[i], &counts[i]);
        if (status == LOOM_OK && counts[i] > SIZE_MAX / 2 - total) {
            status = loom_fail(LOOM_ERR_INPUT, "%s: dataset too large", ds->pattern);
        }
        total += counts[i];
    }
    if (status == LOOM_OK) {
        ds->tokens = loom_malloc(total * sizeof *ds->tokens, "dataset tokens");
        if (!ds->tokens) status = LOOM_ERR_NOMEM;
    }
    size_t offset = 0;
    for (int i = 0; i < ds->num_files && status == LOOM_OK; i++) {
        status = loom_shard_read_into(ds->files[i], ds->tokens + offset, counts[i]);
        if (status == LOOM_OK) {
            status = check_vocab(ds->files[i], ds->tokens + offset, counts[i], vocab_size);
        }
        offset += counts[i];
    }
    free(counts);
    if (status == LOOM_OK) ds->num_tokens = total;
    return status;
}

loom_status loom_dataset_open(loom_dataset **out, const char *pattern, int vocab_size) {
    *out = NULL;
    if (!pattern || !*pattern) {
        return loom_fail(LOOM_ERR_INPUT, "data pattern: expected a glob pattern, got nothing");
    }
    if (vocab_size < 1 || vocab_size > 65536) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: vocab size: expected 1..65536 for uint16 tokens, "
                         "got %d",
                         pattern, vocab_size);
    }
    loom_dataset *ds = loom_calloc(1, sizeof *ds, "dataset");
    if (!ds) return LOOM_ERR_NOMEM;
    ds->pattern = strdup(pattern);
    if (!ds->pattern) {
        free(ds);
        return loom_fail(LOOM_ERR_NOMEM, "out of memory opening %s", pattern);
    }
    path_list list = {0};
    loom_status status = expand_patterns(pattern, &list);
    if (status == LOOM_OK && list.count > (size_t)INT32_MAX) {
        status = loom_fail(LOOM_ERR_INPUT, "%s: too many shards (%zu)", pattern, list.count);
    }
    if (status != LOOM_OK) {
        path_list_free(&list);
        loom_dataset_free(ds);
        return status;
    }
    ds->files = list.items; /* the dataset takes the list */
    ds->num_files = (int)list.count;
    status = load_tokens(ds, vocab_size);
    if (status != LOOM_OK) {
        loom_dataset_free(ds);
        return status;
    }
    *out = ds;
    return LOOM_OK;
}

void loom_dataset_free(loom_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->num_files; i++) free(ds->files[i]);
    free(ds->files);
    free(ds->tokens);
    free(ds->pattern);
    free(ds);
}

size_t loom_dataset_num_tokens(const loom_dataset *ds) {
    return ds->num_tokens;
}

const uint16_t *loom_dataset_tokens(const loom_dataset *ds) {
    return ds->tokens;
}

const char *loom_dataset_pattern(const loom_dataset *ds) {
    return ds->pattern;
}

int loom_dataset_num_files(const loom_dataset *ds) {
    return ds->num_files;
}

const char *loom_dataset_file(const loom_dataset *ds, int index) {
    return index >= 0 && index < ds->num_files ? ds->files[index] : NULL;
}
