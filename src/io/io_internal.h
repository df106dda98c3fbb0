/*
 * io_internal.h — what the io module's files share (private to src/io).
 */
#ifndef LOOM_IO_INTERNAL_H
#define LOOM_IO_INTERNAL_H

#include "loom/model.h"

#include <jansson.h>

/* Llama 3.1's rope scaling as Hugging Face's config.json writes it (and loom.config keeps it):
 * {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
 * "original_max_position_embeddings"}; JSON null for none. NULL when out of memory. */
json_t *loom_rope_scaling_json(const loom_rope_scaling *scaling);
/* Its reader: absent or null is none; another rope_type (or the older "type") is refused by
 * name, as is a missing or bad number. Messages read "PATH: rope_scaling: ...". */
loom_status loom_rope_scaling_read(const json_t *value, const char *path,
                                   loom_rope_scaling *scaling);

#endif
