/*
 * sys.c — time, memory and file helpers: checked allocation, whole-file reads, atomic
 * writes (temporary file, fsync, rename, directory fsync), mkdir -p and a checked path join.
 */
#define _POSIX_C_SOURCE 200809L
#include "loom/base.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double loom_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void *loom_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) loom_fail(LOOM_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *loom_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        loom_fail(LOOM_ERR_NOMEM, "out of memory allocating %zu x %zu bytes for %s", count, size,
                  what);
    }
    return p;
}

void *loom_alloc_aligned(size_t bytes, const char *what) {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void *p = NULL;
    if (posix_memalign(&p, 64, rounded) != 0) {
        loom_fail(LOOM_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
        return NULL;
    }
    memset(p, 0, rounded);
    return p;
}

void loom_free_aligned(void *ptr) {
    free(ptr);
}

loom_status loom_read_file(const char *path, char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return loom_fail(LOOM_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return loom_fail(LOOM_ERR_INPUT, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = loom_malloc(n + 1, path);
    if (!buf) {
        fclose(f);
        return LOOM_ERR_NOMEM;
    }
    if (n && fread(buf, 1, n, f) != n) {
        free(buf);
        fclose(f);
        return loom_fail(LOOM_ERR_INPUT, "%s: read failed", path);
    }
    fclose(f);
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return LOOM_OK;
}

struct loom_atomic_file {
    FILE *stream;
    char *path;
    char *tmp_path;
};

loom_status loom_atomic_open(loom_atomic_file **file, const char *path) {
    *file = NULL;
    loom_atomic_file *af = loom_calloc(1, sizeof *af, "atomic file");
    if (!af) return LOOM_ERR_NOMEM;
    size_t len = strlen(path) + 32;
    af->path = strdup(path);
    af->tmp_path = malloc(len);
    if (!af->path || !af->tmp_path) {
        free(af->path);
        free(af->tmp_path);
        free(af);
        return loom_fail(LOOM_ERR_NOMEM, "out of memory opening %s", path);
    }
    snprintf(af->tmp_path, len, "%s.tmp.%ld", path, (long)getpid());
    af->stream = fopen(af->tmp_path, "wb");
    if (!af->stream) {
        loom_status st =
            loom_fail(LOOM_ERR_IO, "%s: cannot create: %s", af->tmp_path, strerror(errno));
        free(af->path);
        free(af->tmp_path);
        free(af);
        return st;
    }
    *file = af;
    return LOOM_OK;
}

FILE *loom_atomic_stream(loom_atomic_file *file) {
    return file->stream;
}

static void atomic_free(loom_atomic_file *file) {
    free(file->path);
    free(file->tmp_path);
    free(file);
}

static void fsync_parent_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

loom_status loom_atomic_commit(loom_atomic_file *file) {
    if (!file) return loom_fail(LOOM_ERR_IO, "atomic commit of a file that was not opened");
    loom_status st = LOOM_OK;
    if (fflush(file->stream) != 0 || fsync(fileno(file->stream)) != 0 || ferror(file->stream)) {
        st = loom_fail(LOOM_ERR_IO, "%s: write failed: %s", file->tmp_path, strerror(errno));
    }
    if (fclose(file->stream) != 0 && st == LOOM_OK) {
        st = loom_fail(LOOM_ERR_IO, "%s: close failed: %s", file->tmp_path, strerror(errno));
    }
    if (st == LOOM_OK && rename(file->tmp_path, file->path) != 0) {
        st = loom_fail(LOOM_ERR_IO, "%s: rename to %s failed: %s", file->tmp_path, file->path,
                       strerror(errno));
    }
    if (st == LOOM_OK) {
        fsync_parent_dir(file->path);
    } else {
        unlink(file->tmp_path);
    }
    atomic_free(file);
    return st;
}

void loom_atomic_abort(loom_atomic_file *file) {
    if (!file) return;
    fclose(file->stream);
    unlink(file->tmp_path);
    atomic_free(file);
}

loom_status loom_write_file_atomic(const char *path, const void *data, size_t size) {
    loom_atomic_file *af;
    loom_status st = loom_atomic_open(&af, path);
    if (st != LOOM_OK || !af) return st != LOOM_OK ? st : LOOM_ERR_IO;
    if (size && fwrite(data, 1, size, af->stream) != size) {
        loom_atomic_abort(af);
        return loom_fail(LOOM_ERR_IO, "%s: write failed", path);
    }
    return loom_atomic_commit(af);
}

loom_status loom_path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = dir ? snprintf(buf, cap, "%s/%s", dir, name) : snprintf(buf, cap, "%s", name);
    if (n >= 0 && (size_t)n < cap) return LOOM_OK;
    if (cap > 0) buf[0] = '\0';
    return loom_fail(LOOM_ERR_INPUT, "path too long: %s%s%s (%zu bytes, at most %zu)",
                     dir ? dir : "", dir ? "/" : "", name,
                     (dir ? strlen(dir) + 1 : 0) + strlen(name), cap > 0 ? cap - 1 : 0);
}

loom_status loom_mkdir_p(const char *path) {
    char buf[4096];
    loom_status joined = loom_path_join(buf, sizeof buf, NULL, path);
    if (joined != LOOM_OK) return joined;
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                /* a path through a file is the user's mistake, not the disk's */
                return loom_fail(errno == ENOTDIR ? LOOM_ERR_INPUT : LOOM_ERR_IO,
                                 "%s: cannot create directory: %s", buf, strerror(errno));
            }
            *p = saved;
            if (saved == '\0') break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT, "%s: exists and is not a directory", path);
    }
    return LOOM_OK;
}

int64_t loom_memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    }
    if (f) fclose(f);
    if (kb > 0) return (int64_t)kb * 1024;
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (int64_t)pages * size : 0;
}

loom_status loom_memory_check(int64_t bytes, int sharers, const char *what, const char *hint) {
    int64_t available = loom_memory_available();
    if (sharers < 1) sharers = 1;
    if (available <= 0 || bytes <= available / sharers) return LOOM_OK;
    char each[64] = "";
    if (sharers > 1) snprintf(each, sizeof each, " for each of %d ranks", sharers);
    return loom_fail(LOOM_ERR_INPUT,
                     "%s needs %.2f GiB of memory, and this machine has %.2f GiB available%s; %s",
                     what, (double)bytes / 1073741824.0, (double)available / sharers / 1073741824.0,
                     each, hint);
}
