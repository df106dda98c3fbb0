/*
 * dataset.c — a dataset is the concatenation of the shards matched by one or more glob
 * patterns, sorted by path. Opened, each shard is validated (header and size), its tokens are
 * checked against the vocabulary by reading the file once through a small buffer, and the file
 * is then mapped read-only: a rank holds no copy of the tokens, and ranks on one machine share
 * the pages through the page cache. Described, a dataset only knows the shards' token counts,
 * which is all a loader needs to keep its position.
 *
 * Shards hold uint16 or uint32 tokens (llm.c's two formats); one dataset holds one width, the
 * first file's, and refuses a file of the other by name: the widths come from tokenizers of
 * different sizes, so a mix is two corpora under one glob, not one corpus.
 *
 * Why check at open rather than per window: bad input is refused where it enters, naming the
 * file, before any training step; the loader and the model then never check. Why read the check
 * through a buffer rather than through the mapping: the mapping's pages would then stay resident
 * in this process (RSS the size of the corpus) until touched again or reclaimed.
 *
 * Not here: sample order (loader.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "shard_stream.h"

#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
    char *path;
    size_t first; /* global position of this shard's first token */
    size_t count;
    void *map;                 /* the whole file, mapped read-only; NULL if described or empty */
    size_t map_bytes;          /* 1024 + token_width*count */
    const unsigned char *body; /* (count, token_width) little-endian tokens inside map */
} shard_view;

struct loom_dataset {
    char *pattern;
    shard_view *shards; /* (num_files,) sorted by path, distinct */
    int num_files;
    size_t num_tokens;
    int token_width; /* bytes per token of every shard: 2 or 4 */
    int has_tokens;  /* 1 when opened (mapped), 0 when only described */
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

enum { CHECK_CHUNK_TOKENS = 1 << 15 };

/* Token i of a little-endian body of width-byte tokens. */
static inline uint32_t token_at(const unsigned char *body, size_t i, int width) {
    const unsigned char *b = body + (size_t)width * i;
    uint32_t token = (uint32_t)b[0] | (uint32_t)b[1] << 8;
    if (width == 4) token |= (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return token;
}

/* Streams the tokens of an open shard (positioned at its first token) and checks each against
 * the vocabulary. */
static loom_status check_vocab(FILE *file, const char *path, size_t count, int width,
                               int vocab_size) {
    if (width == 2 && vocab_size >= 65536) return LOOM_OK; /* every uint16 fits */
    unsigned char *chunk = loom_malloc((size_t)width * CHECK_CHUNK_TOKENS, "shard check buffer");
    if (!chunk) return LOOM_ERR_NOMEM;
    loom_status status = LOOM_OK;
    for (size_t done = 0; done < count && status == LOOM_OK;) {
        size_t n = count - done < CHECK_CHUNK_TOKENS ? count - done : CHECK_CHUNK_TOKENS;
        if (fread(chunk, (size_t)width, n, file) != n) {
            status =
                loom_fail(LOOM_ERR_INPUT, "%s: short read at token %zu of %zu", path, done, count);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            uint32_t token = token_at(chunk, i, width);
            if (token >= (uint32_t)vocab_size) {
                status = loom_fail(LOOM_ERR_INPUT,
                                   "%s: token at position %zu is %u: expected < vocab size %d",
                                   path, done + i, (unsigned)token, vocab_size);
                break;
            }
        }
        done += n;
    }
    free(chunk);
    return status;
}

/* Shard i's width against the dataset's, which the first shard set. */
static loom_status check_width(loom_dataset *ds, int i, int width) {
    if (i == 0) {
        ds->token_width = width;
        return LOOM_OK;
    }
    if (width == ds->token_width) return LOOM_OK;
    return loom_fail(LOOM_ERR_INPUT,
                     "%s: uint%d tokens, but the dataset's first file %s has uint%d tokens: the "
                     "shards of one dataset must share one token width (prepare each corpus "
                     "with one tokenizer)",
                     ds->shards[i].path, 8 * width, ds->shards[0].path, 8 * ds->token_width);
}

/* Validates shard i, checks its width and tokens, and maps it, all through one open file: what
 * is mapped is the file that was checked. */
static loom_status map_shard(loom_dataset *ds, int i, int vocab_size) {
    shard_view *shard = &ds->shards[i];
    FILE *file;
    size_t count;
    int width;
    loom_status status = loom_shard_open(shard->path, &file, &count, &width);
    if (status != LOOM_OK) return status;
    status = check_width(ds, i, width);
    if (status == LOOM_OK) status = check_vocab(file, shard->path, count, width, vocab_size);
    if (status == LOOM_OK && count > 0) {
        size_t bytes = LOOM_SHARD_HEADER_BYTES + (size_t)width * count;
        void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fileno(file), 0);
        if (map == MAP_FAILED) {
            status = loom_fail(LOOM_ERR_IO, "%s: cannot map the shard (%zu bytes): %s", shard->path,
                               bytes, strerror(errno));
        } else {
            shard->map = map;
            shard->map_bytes = bytes;
            shard->body = (const unsigned char *)map + LOOM_SHARD_HEADER_BYTES;
        }
    }
    fclose(file);
    if (status == LOOM_OK) shard->count = count;
    return status;
}

/* Validates shard i's header, size and width without reading a token. */
static loom_status describe_shard(loom_dataset *ds, int i) {
    int width;
    loom_status status = loom_shard_probe(ds->shards[i].path, &ds->shards[i].count, &width);
    return status == LOOM_OK ? check_width(ds, i, width) : status;
}

/* Opens (map = 1) or probes (map = 0) every shard, then lays them end to end. */
static loom_status load_shards(loom_dataset *ds, int map, int vocab_size) {
    loom_status status = LOOM_OK;
    for (int i = 0; i < ds->num_files && status == LOOM_OK; i++) {
        status = map ? map_shard(ds, i, vocab_size) : describe_shard(ds, i);
    }
    size_t total = 0;
    for (int i = 0; i < ds->num_files && status == LOOM_OK; i++) {
        if (ds->shards[i].count > SIZE_MAX / 4 - total) {
            status = loom_fail(LOOM_ERR_INPUT, "%s: dataset too large", ds->pattern);
        }
        ds->shards[i].first = total;
        total += ds->shards[i].count;
    }
    if (status == LOOM_OK) ds->num_tokens = total;
    return status;
}

static loom_status dataset_create(loom_dataset **out, const char *pattern, int map,
                                  int vocab_size) {
    *out = NULL;
    if (!pattern || !*pattern) {
        return loom_fail(LOOM_ERR_INPUT, "data pattern: expected a glob pattern, got nothing");
    }
    if (map && vocab_size < 1) {
        return loom_fail(LOOM_ERR_INPUT, "%s: vocab size: expected a positive number, got %d",
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
    if (status == LOOM_OK) {
        ds->shards = loom_calloc(list.count, sizeof *ds->shards, "dataset shards");
        if (!ds->shards) status = LOOM_ERR_NOMEM;
    }
    if (status != LOOM_OK) {
        path_list_free(&list);
        loom_dataset_free(ds);
        return status;
    }
    for (size_t i = 0; i < list.count; i++) ds->shards[i].path = list.items[i]; /* taken */
    free(list.items);
    ds->num_files = (int)list.count;
    ds->has_tokens = map;
    status = load_shards(ds, map, vocab_size);
    if (status != LOOM_OK) {
        loom_dataset_free(ds);
        return status;
    }
    *out = ds;
    return LOOM_OK;
}

loom_status loom_dataset_open(loom_dataset **out, const char *pattern, int vocab_size) {
    return dataset_create(out, pattern, 1, vocab_size);
}

loom_status loom_dataset_describe(loom_dataset **out, const char *pattern) {
    return dataset_create(out, pattern, 0, 0);
}

void loom_dataset_free(loom_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->num_files; i++) {
        if (ds->shards[i].map) munmap(ds->shards[i].map, ds->shards[i].map_bytes);
        free(ds->shards[i].path);
    }
    free(ds->shards);
    free(ds->pattern);
    free(ds);
}

size_t loom_dataset_num_tokens(const loom_dataset *ds) {
    return ds->num_tokens;
}

int loom_dataset_token_width(const loom_dataset *ds) {
    return ds->token_width;
}

int loom_dataset_has_tokens(const loom_dataset *ds) {
    return ds->has_tokens;
}

const char *loom_dataset_pattern(const loom_dataset *ds) {
    return ds->pattern;
}

int loom_dataset_num_files(const loom_dataset *ds) {
    return ds->num_files;
}

const char *loom_dataset_file(const loom_dataset *ds, int index) {
    return index >= 0 && index < ds->num_files ? ds->shards[index].path : NULL;
}

size_t loom_dataset_file_start(const loom_dataset *ds, int index) {
    if (index < 0 || index > ds->num_files) return SIZE_MAX;
    return index == ds->num_files ? ds->num_tokens : ds->shards[index].first;
}

/* The shard holding position (< num_tokens): the last one starting at or before it, which
 * steps over empty shards (they start where their successor does). */
static int find_shard(const loom_dataset *ds, size_t position) {
    int low = 0, high = ds->num_files - 1;
    while (low < high) {
        int mid = low + (high - low + 1) / 2;
        if (ds->shards[mid].first <= position)
            low = mid;
        else
            high = mid - 1;
    }
    return low;
}

int loom_dataset_locate(const loom_dataset *ds, size_t position, size_t *offset) {
    if (position >= ds->num_tokens) return -1;
    int file = find_shard(ds, position);
    if (offset) *offset = position - ds->shards[file].first;
    return file;
}

loom_status loom_dataset_read(const loom_dataset *ds, size_t position, size_t count,
                              uint32_t *out) {
    if (!ds->has_tokens) {
        return loom_fail(LOOM_ERR_INPUT,
                         "%s: dataset was described, not opened: its tokens cannot be read",
                         ds->pattern);
    }
    if (position > ds->num_tokens || count > ds->num_tokens - position) {
        return loom_fail(LOOM_ERR_INPUT, "%s: tokens [%zu, %zu + %zu) are outside the %zu tokens",
                         ds->pattern, position, position, count, ds->num_tokens);
    }
    if (count == 0) return LOOM_OK;
    int width = ds->token_width;
    int copy = width == 4 && loom_host_is_little_endian(); /* the bytes are the uint32s */
    size_t offset = 0;
    for (int file = loom_dataset_locate(ds, position, &offset); count > 0; file++, offset = 0) {
        const shard_view *shard = &ds->shards[file];
        size_t n = shard->count - offset < count ? shard->count - offset : count;
        if (n == 0) continue; /* an empty shard */
        const unsigned char *src = shard->body + (size_t)width * offset;
        if (copy) {
            memcpy(out, src, 4 * n);
        } else {
            for (size_t i = 0; i < n; i++) out[i] = token_at(src, i, width);
        }
        out += n;
        count -= n;
    }
    return LOOM_OK;
}
