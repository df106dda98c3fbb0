/*
 * options.c — flag and JSON config parsing for the CLI, driven by tables of cli_opt, so each
 * option is declared once and gets its flag, its JSON key, its help line and its row in the
 * resolved-configuration table from that declaration.
 */
#define _POSIX_C_SOURCE 200809L /* stat */
#include "cli/cli.h"
#include "loom/comm.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int launched_by_mpi(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

loom_status cli_start_mpi(int *argc, char ***argv, loom_comm **world) {
    *world = NULL;
    if (!launched_by_mpi()) return LOOM_OK;
    loom_status st = loom_comm_init(argc, argv, world);
    if (st != LOOM_OK) return st;
    if (loom_comm_size(*world) > 1) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "[rank %d] ", loom_comm_rank(*world));
        loom_log_set_prefix(prefix);
        if (loom_comm_rank(*world) != 0) loom_log_set_level(LOOM_LOG_WARN);
    }
    return LOOM_OK;
}

int cli_finish(loom_comm *world, int code) {
    if (world) loom_comm_finalize(world);
    return code;
}

loom_status cli_prepare_out(const char *out, const char *what) {
    if (!out[0]) return loom_fail(LOOM_ERR_INPUT, "--out: expected %s to write", what);
    struct stat st_out;
    if (stat(out, &st_out) == 0 && S_ISDIR(st_out.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT, "--out: %s is a directory; expected a file path", out);
    }
    const char *slash = strrchr(out, '/');
    if (!slash || slash == out) return LOOM_OK;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - out), out);
    if (stat(dir, &st_out) == 0 && !S_ISDIR(st_out.st_mode)) {
        return loom_fail(LOOM_ERR_INPUT, "--out: %s is not a directory", dir);
    }
    return loom_mkdir_p(dir);
}

int cli_fail(loom_status status) {
    const char *msg = loom_last_error();
    loom_error("%s", msg[0] ? msg : loom_strerror(status));
    return loom_exit_code(status);
}

static void json_key_of(const char *flag, char *key, size_t cap) {
    snprintf(key, cap, "%s", flag + 2);
    for (char *p = key; *p; p++)
        if (*p == '-') *p = '_';
}

loom_status cli_set_value(void *target, const cli_opt *opt, const char *text, const char *source) {
    char *field = (char *)target + opt->offset;
    char *end = NULL;
    errno = 0;
    switch (opt->type) {
    case OPT_INT: {
        long v = strtol(text, &end, 10);
        if (errno || end == text || *end || v < INT32_MIN || v > INT32_MAX) break;
        *(int *)field = (int)v;
        return LOOM_OK;
    }
    case OPT_I64: {
        long long v = strtoll(text, &end, 10);
        if (errno || end == text || *end) break;
        *(int64_t *)field = v;
        return LOOM_OK;
    }
    case OPT_U64: {
        unsigned long long v = strtoull(text, &end, 10);
        if (errno || end == text || *end || text[0] == '-') break;
        *(uint64_t *)field = v;
        return LOOM_OK;
    }
    case OPT_DOUBLE: {
        double v = strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v)) break;
        *(double *)field = v;
        return LOOM_OK;
    }
    case OPT_STRING:
        if (!text[0] && !opt->may_be_empty) {
            return loom_fail(LOOM_ERR_INPUT,
                             "%s: expected a value, got \"\" (leave the option out for its "
                             "default)",
                             source);
        }
        if (strlen(text) >= opt->size) {
            return loom_fail(LOOM_ERR_INPUT, "%s: expected at most %zu characters, got %zu", source,
                             opt->size - 1, strlen(text));
        }
        snprintf(field, opt->size, "%s", text);
        return LOOM_OK;
    case OPT_FLAG:
        /* a boolean spelled out: --no-save=false, "no_save": 0 */
        if (!strcmp(text, "true") || !strcmp(text, "1")) {
            *(int *)field = 1;
            return LOOM_OK;
        }
        if (!strcmp(text, "false") || !strcmp(text, "0")) {
            *(int *)field = 0;
            return LOOM_OK;
        }
        return loom_fail(LOOM_ERR_INPUT, "%s: expected true, false, 1 or 0, got '%s'", source,
                         text);
    case OPT_RECOMPUTE: {
        int index = loom_recompute_parse(text);
        if (!strcmp(text, "true") || !strcmp(text, "1")) index = LOOM_RECOMPUTE_AS_NEEDED;
        if (!strcmp(text, "false") || !strcmp(text, "0")) index = LOOM_RECOMPUTE_NONE;
        if (index < 0) break;
        *(int *)field = index;
        return LOOM_OK;
    }
    case OPT_GROUP:
        break;
    }
    static const char *kinds[] = {"an integer",
                                  "an integer",
                                  "a non-negative integer",
                                  "a number",
                                  "a string",
                                  "true or false",
                                  "no value (a heading)",
                                  "none, needed, always or selective"};
    return loom_fail(LOOM_ERR_INPUT, "%s: expected %s, got '%s'", source, kinds[opt->type], text);
}

static const cli_opt *find_opt(const cli_opt *opts, int nopts, const char *flag) {
    for (int i = 0; i < nopts; i++)
        if (opts[i].type != OPT_GROUP && strcmp(opts[i].flag, flag) == 0) return &opts[i];
    return NULL;
}

int cli_find_flag(int argc, char **argv, const char *flag) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], flag) == 0) return i;
    return -1;
}

loom_status cli_parse_flags(void *target, const cli_opt *opts, int nopts, int argc, char **argv,
                            int start, unsigned char *seen) {
    for (int i = start; i < argc; i++) {
        const char *arg = argv[i];
        char name[128];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0) {
            return loom_fail(LOOM_ERR_INPUT, "unexpected argument '%s' (options start with --)",
                             arg);
        }
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        const cli_opt *opt = find_opt(opts, nopts, name);
        if (!opt) return loom_fail(LOOM_ERR_INPUT, "unknown option '%s' (see --help)", name);
        if (seen) seen[opt - opts] = 1;
        if (opt->offset == CLI_OPT_SKIP) {
            if (!eq) i++;
            continue;
        }
        if (opt->type == OPT_FLAG && !value) {
            *(int *)((char *)target + opt->offset) = 1; /* --flag alone: true */
            continue;
        }
        if (opt->type == OPT_RECOMPUTE && !value) { /* --recompute [WORD] */
            int word = i + 1 < argc ? loom_recompute_parse(argv[i + 1]) : -1;
            *(int *)((char *)target + opt->offset) = word >= 0 ? word : LOOM_RECOMPUTE_AS_NEEDED;
            if (word >= 0) i++;
            continue;
        }
        if (!value) {
            if (i + 1 >= argc) {
                return loom_fail(LOOM_ERR_INPUT, "%s: expected a value after it", name);
            }
            value = argv[++i];
        }
        loom_status st = cli_set_value(target, opt, value, opt->flag);
        if (st != LOOM_OK) return st;
    }
    return LOOM_OK;
}

loom_status cli_parse_json(void *target, const cli_opt *opts, int nopts, const char *path,
                           unsigned char *seen) {
    /* jansson reports a missing file as an "invalid JSON" error at line -1: say what it is */
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        return loom_fail(LOOM_ERR_INPUT, "%s: cannot open the config file: %s", path,
                         strerror(errno));
    }
    errno = 0;
    if (getc(probe) == EOF && ferror(probe)) { /* a folder opens, then fails to read */
        int read_errno = errno;
        fclose(probe);
        return loom_fail(LOOM_ERR_INPUT, "%s: cannot read the config file: %s", path,
                         read_errno ? strerror(read_errno) : "read error");
    }
    fclose(probe);
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        return loom_fail(LOOM_ERR_INPUT, "%s:%d:%d: invalid JSON: %s", path, err.line, err.column,
                         err.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return loom_fail(LOOM_ERR_INPUT, "%s: expected a JSON object of settings", path);
    }
    const char *key;
    json_t *value;
    loom_status st = LOOM_OK;
    json_object_foreach(root, key, value) {
        const cli_opt *opt = NULL;
        char k[128];
        for (int i = 0; i < nopts && !opt; i++) {
            if (opts[i].type == OPT_GROUP) continue;
            json_key_of(opts[i].flag, k, sizeof k);
            if (strcmp(k, key) == 0 && opts[i].offset != CLI_OPT_SKIP) opt = &opts[i];
        }
        if (!opt) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: unknown key \"%s\"", path, key);
            break;
        }
        if (seen) seen[opt - opts] = 1;
        char text[2048];
        char source[1200];
        snprintf(source, sizeof source, "%s: key \"%s\"", path, key);
        if (json_is_string(value)) {
            snprintf(text, sizeof text, "%s", json_string_value(value));
        } else if (json_is_integer(value)) {
            snprintf(text, sizeof text, "%" JSON_INTEGER_FORMAT, json_integer_value(value));
        } else if (json_is_real(value)) {
            snprintf(text, sizeof text, "%.17g", json_real_value(value));
        } else if (json_is_boolean(value) &&
                   (opt->type == OPT_FLAG || opt->type == OPT_RECOMPUTE)) {
            *(int *)((char *)target + opt->offset) = json_is_true(value);
            continue;
        } else if (json_is_boolean(value)) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: expected %s, got a boolean", source,
                           opt->type == OPT_STRING ? "a string" : "a number");
            break;
        } else {
            st = loom_fail(LOOM_ERR_INPUT, "%s: expected a string or a number", source);
            break;
        }
        if (opt->type == OPT_STRING && !json_is_string(value)) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: expected a string", source);
            break;
        }
        if (opt->type != OPT_STRING && opt->type != OPT_FLAG && opt->type != OPT_RECOMPUTE &&
            json_is_string(value)) {
            st = loom_fail(LOOM_ERR_INPUT, "%s: expected a number, got a string", source);
            break;
        }
        st = cli_set_value(target, opt, text, source);
        if (st != LOOM_OK) break;
    }
    json_decref(root);
    return st;
}

static void format_value(const void *target, const cli_opt *opt, char *buf, size_t cap) {
    const char *field = (const char *)target + opt->offset;
    switch (opt->type) {
    case OPT_INT:
        snprintf(buf, cap, "%d", *(const int *)field);
        break;
    case OPT_FLAG:
        snprintf(buf, cap, "%s", *(const int *)field ? "true" : "false");
        break;
    case OPT_RECOMPUTE:
        snprintf(buf, cap, "%s", loom_recompute_name(*(const int *)field));
        break;
    case OPT_I64:
        snprintf(buf, cap, "%" PRId64, *(const int64_t *)field);
        break;
    case OPT_U64:
        snprintf(buf, cap, "%" PRIu64, *(const uint64_t *)field);
        break;
    case OPT_DOUBLE:
        snprintf(buf, cap, "%g", *(const double *)field);
        break;
    case OPT_STRING:
        snprintf(buf, cap, "%s", field[0] ? field : "-");
        break;
    case OPT_GROUP:
        buf[0] = '\0';
        break;
    }
}

void cli_print_table(const void *target, const cli_opt *opts, int nopts) {
    loom_info("%-28s %s", "setting", "value");
    loom_info("%-28s %s", "----------------------------", "--------------------");
    for (int i = 0; i < nopts; i++) {
        if (opts[i].offset == CLI_OPT_SKIP || opts[i].type == OPT_GROUP) continue;
        char value[1200];
        format_value(target, &opts[i], value, sizeof value);
        loom_info("%-28s %s", opts[i].flag + 2, value);
    }
}

/* A default worth showing: not 0, "" or false (those the help text says in words). */
static int shows_default(const void *defaults, const cli_opt *opt, char *value, size_t cap) {
    if (!defaults || opt->offset == CLI_OPT_SKIP || opt->type == OPT_FLAG ||
        opt->type == OPT_RECOMPUTE || strstr(opt->help, "default"))
        return 0;
    format_value(defaults, opt, value, cap);
    return strcmp(value, "0") != 0 && strcmp(value, "-") != 0;
}

void cli_print_help(const char *usage, const cli_opt *opts, int nopts, const void *defaults) {
    static const char *const placeholders[] = {"N", "N", "N", "X", "VALUE", "", "", "[WORD]"};
    printf("%s\n", usage);
    if (nopts > 0 && opts[0].type != OPT_GROUP) printf("\noptions:\n");
    for (int i = 0; i < nopts; i++) {
        const cli_opt *opt = &opts[i];
        if (opt->type == OPT_GROUP) {
            printf("\n%s:\n", opt->flag);
            continue;
        }
        char spelled[64], value[1200];
        snprintf(spelled, sizeof spelled, "%s%s%s", opt->flag, opt->type == OPT_FLAG ? "" : " ",
                 placeholders[opt->type]);
        if (shows_default(defaults, opt, value, sizeof value)) {
            printf("  %-33s %s (default %s)\n", spelled, opt->help, value);
        } else {
            printf("  %-33s %s\n", spelled, opt->help);
        }
    }
}
