/*
 * methods.c — the list of compression methods: their names, where each may be used, and which
 * are lossy. The plan checker and the CLI ask here instead of holding lists of their own.
 *
 * Not here: the compressors themselves (compress.c, powersgd.c).
 */
#include "loom/compress.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int places; /* LOOM_COMPRESS_FOR_* bits */
} methods[LOOM_COMPRESS_COUNT] = {
    [LOOM_COMPRESS_NONE] = {"none", LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD |
                                        LOOM_COMPRESS_FOR_PP_FORWARD},
    [LOOM_COMPRESS_POWERSGD] = {"powersgd", LOOM_COMPRESS_FOR_DP},
    [LOOM_COMPRESS_LOWRANK] = {"lowrank", LOOM_COMPRESS_FOR_PP_GRAD},
    [LOOM_COMPRESS_TOPK] = {"topk", LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD},
    [LOOM_COMPRESS_SIGN] = {"sign", LOOM_COMPRESS_FOR_DP},
    [LOOM_COMPRESS_INT8] = {"int8", LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD |
                                        LOOM_COMPRESS_FOR_PP_FORWARD},
    [LOOM_COMPRESS_BF16] = {"bf16", LOOM_COMPRESS_FOR_DP | LOOM_COMPRESS_FOR_PP_GRAD |
                                        LOOM_COMPRESS_FOR_PP_FORWARD},
};

const char *loom_compress_method_name(loom_compress_method method) {
    if ((int)method < 0 || method >= LOOM_COMPRESS_COUNT) return "?";
    return methods[method].name;
}

loom_status loom_compress_method_parse(const char *name, int place, const char *source,
                                       const char *field, loom_compress_method *method) {
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) {
        if ((methods[m].places & place) && strcmp(name, methods[m].name) == 0) {
            *method = (loom_compress_method)m;
            return LOOM_OK;
        }
    }
    char allowed[128] = "";
    size_t used = 0;
    for (int m = 0; m < LOOM_COMPRESS_COUNT; m++) {
        if (!(methods[m].places & place) || used >= sizeof allowed) continue;
        used += (size_t)snprintf(allowed + used, sizeof allowed - used, "%s%s", used ? ", " : "",
                                 methods[m].name);
    }
    return loom_fail(LOOM_ERR_INPUT, "%s: %s: expected one of %s, got \"%s\"", source, field,
                     allowed, name);
}

int loom_compress_is_lossy(loom_compress_method method) {
    return method != LOOM_COMPRESS_NONE;
}
