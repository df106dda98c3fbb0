/*
 * comm_internal.h — hooks into the comm module for its own tests. Nothing here is part of the
 * public API, and nothing here needs <mpi.h>.
 */
#ifndef LOOM_COMM_INTERNAL_H
#define LOOM_COMM_INTERNAL_H

#include <stdint.h>

/* Largest number of elements one MPI call may carry (default: no limit beyond the 16 MiB per
 * call that comm.c sets for speed, which also keeps counts far below INT_MAX). Larger
 * transfers are split into chunks of at most this many elements. Tests lower it (to 7, say)
 * to exercise the chunked paths on small buffers — chunking is what makes counts above
 * INT_MAX work, and testing it at that size would take tens of gigabytes. Every rank must use
 * the same value. Returns the previous value; values below 1 are taken as 1. */
int64_t loom_comm_set_max_chunk(int64_t elements);

#endif
