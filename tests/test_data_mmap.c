/*
 * test_data_mmap.c — datasets that map their shards: token reads and the loader's windows
 * against the test's own reading of the files (plain fread, its own header parse, its own cut of
 * windows and its own shuffle from the documented algorithm), across file boundaries, empty and
 * tiny files; positions to (file, offset); described datasets (no tokens) keeping the loader's
 * positions; bad shards refused by name at open; and resident memory that does not grow with a
 * 200 MB corpus.
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/data.h"

#include "check.h"

#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

static const char *tmp;

static const char *tmp_path(const char *name) {
    static char paths[64][1024]; /* a ring: results stay valid for 64 calls */
    static int next;
    char *p = paths[next++ % 64];
    snprintf(p, sizeof paths[0], "%s/%s", tmp, name);
    return p;
}

static int error_mentions(const char *text) {
    return strstr(loom_last_error(), text) != NULL;
}

static void put_le_i32(unsigned char *p, int32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)((uint32_t)v >> (8 * i));
}

static int32_t le_i32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                     (uint32_t)p[3] << 24);
}

/* A token that depends on its global position, so a token read from the wrong place shows. */
static uint16_t token_at(uint64_t position, int vocab) {
    uint64_t z = position + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (uint16_t)((z ^ (z >> 31)) % (uint64_t)vocab);
}

/* Writes a shard with the test's own code: header (magic, version, header_count), then
 * `count` tokens token_at(first + i) as little-endian bytes, then `extra` zero bytes. */
static void write_shard_raw(const char *path, int32_t magic, int32_t version, int32_t header_count,
                            uint64_t first, size_t count, size_t extra, int vocab) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    unsigned char header[1024] = {0};
    put_le_i32(header, magic);
    put_le_i32(header + 4, version);
    put_le_i32(header + 8, header_count);
    int ok = fwrite(header, 1, sizeof header, f) == sizeof header;
    enum { CHUNK = 1 << 16 };
    static unsigned char bytes[2 * CHUNK];
    for (size_t done = 0; done < count && ok;) {
        size_t n = count - done < CHUNK ? count - done : CHUNK;
        for (size_t i = 0; i < n; i++) {
            uint16_t t = token_at(first + done + i, vocab);
            bytes[2 * i] = (unsigned char)(t & 0xff);
            bytes[2 * i + 1] = (unsigned char)(t >> 8);
        }
        ok = fwrite(bytes, 2, n, f) == n;
        done += n;
    }
    for (size_t i = 0; i < extra && ok; i++) ok = fputc(0, f) != EOF;
    if (fclose(f) != 0 || !ok) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

static void write_good_shard(const char *path, uint64_t first, size_t count, int vocab) {
    write_shard_raw(path, 20240520, 1, (int32_t)count, first, count, 0, vocab);
}

/* The reference: the files named, in the order given, read with fread and parsed here. */
static uint16_t *reference_tokens(const char *const *paths, int files, size_t *total) {
    size_t cap = 1024, n = 0;
    uint16_t *all = malloc(cap * sizeof *all);
    for (int f = 0; f < files; f++) {
        FILE *file = fopen(paths[f], "rb");
        unsigned char header[1024];
        if (!file || fread(header, 1, sizeof header, file) != sizeof header) {
            fprintf(stderr, "reference: cannot read %s\n", paths[f]);
            exit(1);
        }
        size_t count = (size_t)le_i32(header + 8);
        for (size_t i = 0; i < count; i++) {
            unsigned char b[2];
            if (fread(b, 1, 2, file) != 2) {
                fprintf(stderr, "reference: %s is short\n", paths[f]);
                exit(1);
            }
            if (n == cap) all = realloc(all, (cap *= 2) * sizeof *all);
            all[n++] = (uint16_t)(b[0] | b[1] << 8);
        }
        fclose(file);
    }
    *total = n;
    return all;
}

/* The shuffle as data.h documents it, written again here. */
static void reference_order(size_t *order, size_t n, uint64_t seed, uint64_t epoch) {
    for (size_t i = 0; i < n; i++) order[i] = i;
    loom_rng rng;
    loom_rng_seed(&rng, loom_rng_u64(seed, LOOM_LOADER_RNG_STREAM, epoch));
    for (size_t i = n; i > 1; i--) {
        uint64_t reject_below = (0 - (uint64_t)i) % i, r;
        do r = loom_rng_next(&rng);
        while (r < reject_below);
        size_t j = (size_t)(r % i), swap = order[i - 1];
        order[i - 1] = order[j];
        order[j] = swap;
    }
}

/* ---- a dataset of many small files ------------------------------------------------------- */

/* Sizes chosen so that windows cross boundaries, skip over empty and one-token files, and
 * span three files at once. Written out of name order; the dataset sorts them. */
enum { NUM_SMALL = 8, VOCAB = 50257 };
static const size_t small_counts[NUM_SMALL] = {37, 0, 1, 5, 64, 0, 3, 150};
static const char *small_names[NUM_SMALL] = {"m_00.bin", "m_01.bin", "m_02.bin", "m_03.bin",
                                             "m_04.bin", "m_05.bin", "m_06.bin", "m_07.bin"};

static char small_pattern[1200];
static const char *small_paths[NUM_SMALL];

static void write_small_dataset(void) {
    uint64_t first = 0;
    for (int i = NUM_SMALL - 1; i >= 0; i--) first += small_counts[i];
    for (int i = NUM_SMALL - 1; i >= 0; i--) { /* reverse order of creation */
        first -= small_counts[i];
        small_paths[i] = tmp_path(small_names[i]);
        write_good_shard(small_paths[i], first, small_counts[i], VOCAB);
    }
    snprintf(small_pattern, sizeof small_pattern, "%s/m_*.bin", tmp);
}

static void test_read_and_locate(void) {
    size_t total;
    uint16_t *ref = reference_tokens(small_paths, NUM_SMALL, &total);
    loom_dataset *ds = NULL;
    CHECK(loom_dataset_open(&ds, small_pattern, VOCAB) == LOOM_OK, "open: %s", loom_last_error());
    if (!ds) return;
    CHECK(loom_dataset_num_tokens(ds) == total && total == 260, "%zu tokens",
          loom_dataset_num_tokens(ds));
    CHECK(loom_dataset_has_tokens(ds) == 1, "an opened dataset has tokens");
    CHECK(loom_dataset_num_files(ds) == NUM_SMALL, "%d files", loom_dataset_num_files(ds));

    /* every (position, count) pair: all reads, all boundaries */
    uint32_t out[261];
    int all_same = 1, all_ok = 1;
    for (size_t p = 0; p <= total; p++) {
        for (size_t n = 0; n <= total - p; n++) {
            out[n] = 0xbeef; /* the first entry past the copy must stay untouched */
            all_ok &= loom_dataset_read(ds, p, n, out) == LOOM_OK;
            for (size_t i = 0; i < n; i++) all_same &= out[i] == ref[p + i];
            all_same &= out[n] == 0xbeef;
        }
    }
    CHECK(all_ok, "every in-range read succeeds");
    CHECK(all_same, "every read [p, p+n) equals the fread reference and writes n tokens");
    CHECK(loom_dataset_read(ds, total - 2, 3, out) == LOOM_ERR_INPUT && error_mentions("m_*.bin"),
          "a read past the end is refused: %s", loom_last_error());
    CHECK(loom_dataset_read(ds, total + 1, 0, out) == LOOM_ERR_INPUT, "a start past the end too");
    CHECK(loom_dataset_read(ds, 5, SIZE_MAX, out) == LOOM_ERR_INPUT, "a huge count too");

    /* positions to (file, offset), against the counts */
    int located = 1;
    size_t start = 0;
    for (int f = 0; f < NUM_SMALL; f++) {
        located &= loom_dataset_file_start(ds, f) == start;
        located &= strcmp(loom_dataset_file(ds, f), small_paths[f]) == 0;
        for (size_t k = 0; k < small_counts[f]; k++) {
            size_t offset = 99;
            located &= loom_dataset_locate(ds, start + k, &offset) == f && offset == k;
        }
        start += small_counts[f];
    }
    CHECK(located, "every position maps to its file and offset, empty files skipped");
    CHECK(loom_dataset_file_start(ds, NUM_SMALL) == total, "file_start(num_files) = num_tokens");
    CHECK(loom_dataset_file_start(ds, NUM_SMALL + 1) == SIZE_MAX &&
              loom_dataset_file_start(ds, -1) == SIZE_MAX,
          "file_start outside [0, num_files] is SIZE_MAX");
    CHECK(loom_dataset_locate(ds, total, NULL) == -1, "locate(num_tokens) = -1");
    CHECK(loom_dataset_locate(ds, 37, NULL) == 2, "position 37 skips the empty m_01");
    loom_dataset_free(ds);
    free(ref);
}

/* Reads `count` windows through the loader and compares each with the reference's window at
 * the position the reference order gives; returns 1 when all equal. */
static int loader_matches_reference(loom_loader *ld, const uint16_t *ref, size_t num_windows, int T,
                                    int shuffle, uint64_t seed, size_t count, int batch) {
    size_t *order = malloc(num_windows * sizeof *order);
    int32_t *inputs = malloc((size_t)batch * T * sizeof *inputs);
    int32_t *targets = malloc((size_t)batch * T * sizeof *targets);
    int same = 1;
    uint64_t epoch = UINT64_MAX;
    for (size_t done = 0; done < count;) {
        int b = count - done < (size_t)batch ? (int)(count - done) : batch;
        same &= loom_loader_next(ld, b, inputs, targets) == LOOM_OK;
        for (int i = 0; i < b; i++) {
            size_t step = done + (size_t)i;
            if (step / num_windows != epoch) {
                epoch = step / num_windows;
                if (shuffle) reference_order(order, num_windows, seed, epoch);
            }
            size_t index = step % num_windows;
            size_t window = shuffle ? order[index] : index;
            const uint16_t *src = ref + window * (size_t)T;
            for (int t = 0; t < T; t++) {
                same &= inputs[(size_t)i * T + t] == src[t];
                same &= targets[(size_t)i * T + t] == src[t + 1];
            }
        }
        done += (size_t)b;
    }
    free(order);
    free(inputs);
    free(targets);
    return same;
}

static void test_loader_across_files(void) {
    size_t total;
    uint16_t *ref = reference_tokens(small_paths, NUM_SMALL, &total);
    loom_dataset *ds = NULL;
    CHECK(loom_dataset_open(&ds, small_pattern, VOCAB) == LOOM_OK, "open: %s", loom_last_error());
    if (!ds) return;
    /* T = 40 puts a window over m_00 | m_02 | m_03 (37 + 1 + 5 tokens), T = 259 makes one. */
    const int seq_lens[5] = {1, 3, 7, 40, 259};
    for (int s = 0; s < 5; s++) {
        int T = seq_lens[s];
        size_t windows = (total - 1) / (size_t)T;
        for (int shuffle = 0; shuffle <= 1; shuffle++) {
            loom_loader *ld = NULL;
            CHECK(loom_loader_create(&ld, ds, T, shuffle, 1234) == LOOM_OK, "create T=%d", T);
            if (!ld) continue;
            CHECK(loom_loader_num_windows(ld) == windows, "T=%d: %zu windows", T,
                  loom_loader_num_windows(ld));
            size_t count = 2 * windows + windows / 2 + 1; /* into a third epoch */
            CHECK(loader_matches_reference(ld, ref, windows, T, shuffle, 1234, count, 3),
                  "T=%d shuffle=%d: %zu windows equal the reference windows", T, shuffle, count);
            loom_loader_free(ld);
        }
    }
    loom_dataset_free(ds);
    free(ref);
}

/* ---- described datasets ------------------------------------------------------------------ */

static void test_describe(void) {
    loom_dataset *opened = NULL, *described = NULL;
    CHECK(loom_dataset_open(&opened, small_pattern, VOCAB) == LOOM_OK, "open");
    CHECK(loom_dataset_describe(&described, small_pattern) == LOOM_OK, "describe: %s",
          loom_last_error());
    if (!opened || !described) return;
    CHECK(loom_dataset_has_tokens(described) == 0, "a described dataset has no tokens");
    CHECK(loom_dataset_num_tokens(described) == loom_dataset_num_tokens(opened) &&
              loom_dataset_num_files(described) == loom_dataset_num_files(opened),
          "same token and file counts");
    int same_bounds = 1;
    for (int f = 0; f <= NUM_SMALL; f++) {
        same_bounds &= loom_dataset_file_start(described, f) == loom_dataset_file_start(opened, f);
    }
    CHECK(same_bounds, "same file boundaries");
    uint32_t out[4];
    CHECK(loom_dataset_read(described, 0, 4, out) == LOOM_ERR_INPUT && error_mentions("described"),
          "reading a described dataset is refused: %s", loom_last_error());

    /* A middle stage skips where the first stage reads: the same positions, step by step. */
    enum { T = 7, B = 3 };
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        loom_loader *reader = NULL, *skipper = NULL;
        loom_loader_create(&reader, opened, T, shuffle, 99);
        CHECK(loom_loader_create(&skipper, described, T, shuffle, 99) == LOOM_OK,
              "loader over a described dataset: %s", loom_last_error());
        if (!reader || !skipper) return;
        CHECK(loom_loader_num_windows(skipper) == loom_loader_num_windows(reader), "same windows");
        int32_t in[B * T], tg[B * T];
        loom_loader_pos before = loom_loader_get_pos(skipper);
        CHECK(loom_loader_next(skipper, B, in, tg) == LOOM_ERR_INPUT && error_mentions("m_*.bin"),
              "next on a described dataset is refused, naming it: %s", loom_last_error());
        loom_loader_pos after = loom_loader_get_pos(skipper);
        CHECK(after.epoch == before.epoch && after.index == before.index,
              "a refused next leaves the position");
        int same_pos = 1;
        for (int step = 0; step < 40; step++) {
            loom_loader_next(reader, B, in, tg);
            loom_loader_skip(skipper, B);
            loom_loader_pos r = loom_loader_get_pos(reader), s = loom_loader_get_pos(skipper);
            same_pos &= r.epoch == s.epoch && r.index == s.index;
        }
        CHECK(same_pos && loom_loader_get_pos(reader).epoch >= 3,
              "shuffle=%d: skipping keeps the reader's position over epochs", shuffle);
        loom_loader_free(reader);
        loom_loader_free(skipper);
    }
    loom_dataset_free(opened);
    loom_dataset_free(described);

    /* Describing reads no token: an out-of-vocabulary token is not its business. */
    write_good_shard(tmp_path("v_0.bin"), 0, 100, 65536);
    loom_dataset *d = NULL;
    CHECK(loom_dataset_describe(&d, tmp_path("v_0.bin")) == LOOM_OK &&
              loom_dataset_num_tokens(d) == 100,
          "describe ignores token values");
    loom_dataset_free(d);
    remove(tmp_path("v_0.bin"));
}

/* ---- bad input, refused at open ---------------------------------------------------------- */

/* Puts a bad shard named `name` among good ones (b_0, bad, b_9) and expects both open and,
 * unless only the tokens are wrong, describe to refuse it by name. */
static void expect_refused(const char *name, int tokens_only, const char *needle) {
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/b_*", tmp);
    loom_dataset *ds = (loom_dataset *)1;
    loom_clear_error();
    CHECK(loom_dataset_open(&ds, pattern, VOCAB) == LOOM_ERR_INPUT && ds == NULL,
          "%s: open refuses", name);
    CHECK(error_mentions(tmp_path(name)) && error_mentions(needle), "%s: names file and '%s': %s",
          name, needle, loom_last_error());
    ds = NULL;
    loom_status st = loom_dataset_describe(&ds, pattern);
    if (tokens_only) {
        CHECK(st == LOOM_OK, "%s: describe does not read tokens", name);
        loom_dataset_free(ds);
    } else {
        CHECK(st == LOOM_ERR_INPUT && ds == NULL && error_mentions(tmp_path(name)),
              "%s: describe refuses too, naming it: %s", name, loom_last_error());
    }
    remove(tmp_path(name));
}

static void test_bad_input(void) {
    write_good_shard(tmp_path("b_0.bin"), 0, 50, VOCAB);
    write_good_shard(tmp_path("b_9.bin"), 50, 50, VOCAB);
    const char *bad = tmp_path("b_5.bin");
    write_shard_raw(bad, 20240326, 1, 10, 0, 10, 0, VOCAB);
    expect_refused("b_5.bin", 0, "magic");
    write_shard_raw(bad, 20240520, 2, 10, 0, 10, 0, VOCAB);
    expect_refused("b_5.bin", 0, "version");
    write_shard_raw(bad, 20240520, 1, 11, 0, 10, 0, VOCAB);
    expect_refused("b_5.bin", 0, "truncated");
    write_shard_raw(bad, 20240520, 1, 10, 0, 10, 1, VOCAB);
    expect_refused("b_5.bin", 0, "trailing");
    write_shard_raw(bad, 20240520, 1, -3, 0, 0, 0, VOCAB);
    expect_refused("b_5.bin", 0, "-3");
    write_shard_raw(bad, 20240520, 1, INT32_MAX, 0, 2, 0, VOCAB);
    expect_refused("b_5.bin", 0, "4294968318");
    FILE *f = fopen(bad, "wb");
    fputs("not a shard", f);
    fclose(f);
    expect_refused("b_5.bin", 0, "shorter");
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", tmp_path("b_6"));
    if (system(cmd) != 0) exit(1);
    expect_refused("b_6", 0, "regular"); /* and removed there (remove() takes empty folders) */

    /* A token >= vocab: at offset 33 of the bad file, named with its position in that file. */
    uint16_t tokens[40];
    for (int i = 0; i < 40; i++) tokens[i] = (uint16_t)i;
    tokens[33] = VOCAB;
    loom_shard_write(bad, tokens, 40);
    expect_refused("b_5.bin", 1, "position 33 is 50257");
    tokens[33] = VOCAB - 1; /* the largest allowed */
    tokens[39] = 65535;     /* at the very end */
    loom_shard_write(bad, tokens, 40);
    expect_refused("b_5.bin", 1, "position 39 is 65535");
    /* The check spans chunks: a bad token far into a 100,000-token file. */
    uint16_t *many = calloc(100000, sizeof *many);
    many[99998] = 60000;
    loom_shard_write(bad, many, 100000);
    free(many);
    expect_refused("b_5.bin", 1, "position 99998 is 60000");

    loom_dataset *ds = NULL;
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/b_*", tmp);
    CHECK(loom_dataset_open(&ds, pattern, VOCAB) == LOOM_OK, "the good files alone open: %s",
          loom_last_error());
    loom_dataset_free(ds);
    CHECK(loom_dataset_describe(&ds, "") == LOOM_ERR_INPUT, "describe: empty pattern refused");
    CHECK(loom_dataset_describe(&ds, tmp_path("none_*.bin")) == LOOM_ERR_INPUT &&
              error_mentions("none_*.bin"),
          "describe: unmatched pattern named");
    remove(tmp_path("b_0.bin"));
    remove(tmp_path("b_9.bin"));
}

/* ---- resident memory --------------------------------------------------------------------- */

/* VmRSS of this process in bytes (0 if /proc is not there). */
static size_t resident_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %zu kB", &kb) == 1) break;
    }
    fclose(f);
    return kb * 1024;
}

static void test_resident_memory(void) {
    /* 100,000,000 tokens (200 MB) in four unequal files, written in streaming fashion. */
    enum { FILES = 4, T = 1024 };
    const size_t counts[FILES] = {30000000, 25000001, 19999999, 25000000};
    const char *paths[FILES] = {tmp_path("big_0.bin"), tmp_path("big_1.bin"), tmp_path("big_2.bin"),
                                tmp_path("big_3.bin")};
    size_t first = 0, file_bytes = 0;
    for (int i = 0; i < FILES; i++) {
        write_good_shard(paths[i], first, counts[i], VOCAB);
        first += counts[i];
        file_bytes += 1024 + 2 * counts[i];
    }
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/big_*.bin", tmp);

    size_t before = resident_bytes();
    double t0 = loom_now();
    loom_dataset *ds = NULL;
    CHECK(loom_dataset_open(&ds, pattern, VOCAB) == LOOM_OK, "open 200 MB: %s", loom_last_error());
    double open_s = loom_now() - t0;
    size_t after_open = resident_bytes();
    if (!ds) return;
    CHECK(loom_dataset_num_tokens(ds) == first, "%zu tokens", loom_dataset_num_tokens(ds));

    /* A few windows, two of them across file boundaries, through a sequential loader. */
    loom_loader *ld = NULL;
    loom_loader_create(&ld, ds, T, 0, 0);
    const uint64_t windows[4] = {0, 30000000 / T, 55000001 / T, (first - 1) / T - 1};
    int32_t in[T], tg[T];
    int same = ld != NULL;
    for (int w = 0; w < 4 && ld; w++) {
        loom_loader_set_pos(ld, (loom_loader_pos){0, windows[w]});
        loom_loader_next(ld, 1, in, tg);
        for (int t = 0; t < T; t++) {
            same &= in[t] == token_at(windows[w] * T + (uint64_t)t, VOCAB);
            same &= tg[t] == token_at(windows[w] * T + (uint64_t)t + 1, VOCAB);
        }
    }
    CHECK(same, "windows at 0, across two boundaries and at the end hold the written tokens");
    size_t after_reads = resident_bytes();
    loom_loader_free(ld);
    loom_dataset_free(ds);

    double mb = 1e-6;
    printf("resident memory: %.1f MB before open, +%.1f MB after opening %.0f MB of shards "
           "(%.2f s, tokens checked), +%.1f MB after reading 4 windows\n",
           before * mb, ((double)after_open - (double)before) * mb, file_bytes * mb, open_s,
           ((double)after_reads - (double)before) * mb);
    CHECK(before > 0, "VmRSS readable");
    CHECK(after_open < before + file_bytes / 20, "opening grows RSS by %.1f MB, not ~%.0f MB",
          ((double)after_open - (double)before) * mb, file_bytes * mb);
    CHECK(after_reads < before + file_bytes / 20, "reading windows touches only their pages");
    for (int i = 0; i < FILES; i++) remove(paths[i]);
}

int main(void) {
    tmp = check_tmpdir();
    write_small_dataset();
    test_read_and_locate();
    test_loader_across_files();
    test_describe();
    test_bad_input();
    test_resident_memory();
    return check_finish();
}
