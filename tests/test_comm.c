/*
 * test_comm.c — the comm module on 1, 2 or 4 ranks (run under mpirun; also alone): allreduce
 * sum and max (f32, f64) against closed forms, allgather (also in place) against hand-computed
 * blocks, broadcast, a send/recv ring, non-blocking allreduces overlapping each other, the ring
 * reduce-scatter (equal, uneven and empty blocks; many buckets in flight, started in different
 * orders on different ranks, polled, reused) against the plain sum of every rank's inputs
 * gathered, split groups, the chunked paths (the chunk lowered to 7 elements), the byte
 * counters, and misuse caught before anything is sent.
 *
 * Every rank checks its own results; rank 0 prints the totals of all ranks, and every rank
 * exits non-zero when it saw a failure (so mpirun does too).
 */
#define _POSIX_C_SOURCE 200809L
#include "check.h"
#include "comm/comm_internal.h"
#include "loom/comm.h"

#include <stdlib.h>
#include <string.h>

static int rank, size;

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        loom_status check_st_ = (expr);                                                            \
        CHECK(check_st_ == LOOM_OK, "rank %d: %s", rank, loom_last_error());                       \
    } while (0)

/* Values chosen so that sums are exact in f32: small integers times small integers. */
static float value_f32(int r, int64_t i) {
    return (float)((r + 1) * (i % 7 + 1));
}

static void test_basics(loom_comm *world) {
    CHECK(loom_comm_world_rank() == rank, "world rank %d vs %d", loom_comm_world_rank(), rank);
    CHECK(strcmp(loom_comm_name(world), "world") == 0, "name %s", loom_comm_name(world));
    CHECK(loom_comm_world_rank_of(world, rank) == rank, "world_rank_of");
    CHECK(loom_comm_world_rank_of(world, size) == -1, "world_rank_of out of range");
    CHECK_OK(loom_comm_barrier(world));
}

/* Every rank of a test job runs on this machine, so every rank finds the same host name; a
 * short buffer gets its beginning. */
static void test_host_name(loom_comm *world) {
    char name[256], first[256], short_name[4];
    CHECK_OK(loom_comm_host_name(name, sizeof name));
    CHECK(name[0] != '\0', "rank %d: empty host name", rank);
    memcpy(first, name, sizeof first);
    CHECK_OK(loom_comm_broadcast(world, first, sizeof first, 0));
    CHECK(strcmp(name, first) == 0, "rank %d: host %s, rank 0's %s", rank, name, first);
    CHECK_OK(loom_comm_host_name(short_name, sizeof short_name));
    CHECK(strncmp(short_name, name, 3) == 0 &&
              strlen(short_name) == (strlen(name) < 3 ? strlen(name) : 3),
          "rank %d: truncated '%s' of '%s'", rank, short_name, name);
    CHECK(loom_comm_host_name(name, 0) == LOOM_ERR_RUNTIME, "rank %d: no buffer accepted", rank);
}

/* Every rank of a test job runs on this machine: the ranks sharing it are the whole
 * communicator, for the world and for a group split from it; no communicator, one. */
static void test_local_size(loom_comm *world) {
    int local = 0;
    CHECK_OK(loom_comm_local_size(world, &local));
    CHECK(local == size, "rank %d: %d ranks on this machine, expected the world's %d", rank, local,
          size);
    loom_comm *half = NULL;
    CHECK_OK(loom_comm_split(world, rank % 2, rank, "half", &half));
    if (half) {
        CHECK_OK(loom_comm_local_size(half, &local));
        CHECK(local == loom_comm_size(half), "rank %d: %d ranks of 'half' here, expected %d", rank,
              local, loom_comm_size(half));
        loom_comm_free(half);
    }
    CHECK(loom_comm_local_size(NULL, &local) == LOOM_OK && local == 1, "no communicator: %d",
          local);
}

static void test_allreduce(loom_comm *world, int64_t count) {
    float *a = malloc((size_t)count * sizeof *a);
    double *d = malloc((size_t)count * sizeof *d);
    float *m = malloc((size_t)count * sizeof *m);
    for (int64_t i = 0; i < count; i++) {
        a[i] = value_f32(rank, i);
        d[i] = 0.1 * (rank + 1) + (double)i;
        m[i] = (float)(rank * (i % 3) - i);
    }
    CHECK_OK(loom_comm_allreduce_f32(world, a, count, LOOM_REDUCE_SUM));
    CHECK_OK(loom_comm_allreduce_f64(world, d, count, LOOM_REDUCE_SUM));
    CHECK_OK(loom_comm_allreduce_f32(world, m, count, LOOM_REDUCE_MAX));
    int bad_sum = 0, bad_f64 = 0, bad_max = 0;
    double ranks_sum = size * (size + 1) / 2.0; /* sum over r of (r + 1) */
    for (int64_t i = 0; i < count; i++) {
        bad_sum += a[i] != (float)(ranks_sum * (double)(i % 7 + 1));
        bad_f64 += fabs(d[i] - (0.1 * ranks_sum + (double)size * (double)i)) > 1e-9 * (1 + i);
        bad_max += m[i] != (float)((size - 1) * (i % 3) - i);
    }
    CHECK(bad_sum == 0, "rank %d: allreduce f32 sum (count %lld): %d wrong", rank, (long long)count,
          bad_sum);
    CHECK(bad_f64 == 0, "rank %d: allreduce f64 sum (count %lld): %d wrong", rank, (long long)count,
          bad_f64);
    CHECK(bad_max == 0, "rank %d: allreduce f32 max (count %lld): %d wrong", rank, (long long)count,
          bad_max);

    /* f64 max with negative values: the largest rank wins */
    double x[3] = {-1.0 - rank, 2.5 * rank, -1e300};
    CHECK_OK(loom_comm_allreduce_f64(world, x, 3, LOOM_REDUCE_MAX));
    CHECK(x[0] == -1.0 && x[1] == 2.5 * (size - 1) && x[2] == -1e300, "rank %d: f64 max", rank);
    free(a);
    free(d);
    free(m);
}

/* ---- the ring reduce-scatter ------------------------------------------------------------ */

/* Integers, different on every rank and position, small enough that every sum of them is exact
 * in f32 in any order: the ring's sums must equal the reference exactly. `round` varies them
 * between runs of one ring. */
static float ring_value(int r, int64_t i, int round) {
    return (float)((r * 37 + i * 11 + round * 5) % 101 - 50);
}

/* The reference: sum[i] = the sum over ranks of their buffers' element i, computed here from
 * every rank's buffer gathered (by MPI's allgather, not by the ring). */
static float *reference_sums(loom_comm *world, const float *mine, int64_t n) {
    float *all = malloc((size_t)(size * n + 1) * sizeof *all);
    float *sum = calloc((size_t)n + 1, sizeof *sum);
    CHECK_OK(loom_comm_allgather_f32(world, mine, all, n));
    for (int r = 0; r < size; r++) {
        for (int64_t i = 0; i < n; i++) sum[i] += all[r * n + i];
    }
    free(all);
    return sum;
}

/* One ring over a buffer of `first` untouched elements, then blocks of block_sizes[r % k]
 * elements, then 3 untouched: after the run this rank's block holds the reference sum and
 * nothing outside the blocks has changed. Run twice on one ring (made once, as training
 * does), tested while "computing" the first time and only waited the second. */
static void test_ring_blocks(loom_comm *world, int64_t first, const int64_t *block_sizes, int k,
                             const char *what) {
    int64_t bounds[65];
    bounds[0] = first;
    for (int r = 0; r < size; r++) bounds[r + 1] = bounds[r] + block_sizes[r % k];
    int64_t n = bounds[size] + 3;
    float *buf = malloc((size_t)n * sizeof *buf);
    loom_comm_ring *ring = NULL;
    CHECK_OK(loom_comm_ring_create(world, bounds, 3, &ring));
    for (int round = 0; round < 2 && ring; round++) {
        for (int64_t i = 0; i < n; i++) buf[i] = ring_value(rank, i, round);
        float *sum = reference_sums(world, buf, n);
        CHECK_OK(loom_comm_ring_start(ring, buf));
        int done = 0, polls = 0;
        for (; round == 0 && !done && polls < 100000; polls++) {
            CHECK_OK(loom_comm_ring_test(ring, &done));
        }
        CHECK_OK(loom_comm_ring_wait(ring));
        int bad_block = 0, bad_outside = 0;
        for (int64_t i = bounds[rank]; i < bounds[rank + 1]; i++) bad_block += buf[i] != sum[i];
        for (int64_t i = 0; i < n; i++) {
            int outside = i < bounds[0] || i >= bounds[size];
            bad_outside += outside && buf[i] != ring_value(rank, i, round);
        }
        CHECK(bad_block == 0, "rank %d: ring %s, run %d: %d of %lld sums wrong", rank, what, round,
              bad_block, (long long)(bounds[rank + 1] - bounds[rank]));
        CHECK(bad_outside == 0, "rank %d: ring %s, run %d: %d elements outside the blocks changed",
              rank, what, round, bad_outside);
        free(sum);
    }
    loom_comm_ring_free(ring);
    free(buf);
}

static void test_ring_reduce_scatter(loom_comm *world) {
    const int64_t equal[] = {257}, uneven[] = {5, 0, 13, 1}, one[] = {1}, empty[] = {0};
    test_ring_blocks(world, 0, equal, 1, "equal blocks");
    test_ring_blocks(world, 7, uneven, 4, "uneven blocks");
    test_ring_blocks(world, 0, one, 1, "one element each");
    test_ring_blocks(world, 2, empty, 1, "empty blocks");
    /* every element in the last rank's block: a ZeRO-1 bucket inside one rank's range */
    int64_t last[64] = {0};
    last[size - 1] = 300;
    test_ring_blocks(world, 0, last, size, "one rank's block");
}

/* ZeRO-1's way: a buffer of n elements, the ranks' ranges of shard = ceil(n / size) elements,
 * cut into buckets of uneven sizes, one ring per bucket (tag = its index) whose blocks are the
 * ranges cut to the bucket. Every ring is started before any ends, odd ranks starting them in
 * the opposite order; they are polled round-robin while "computing", then waited in order
 * (a wait moves only its own ring, so waits come in one order on every rank). Two rounds on
 * the same rings. This rank's range must hold the reference sums. */
static void test_ring_buckets(loom_comm *world, int64_t n) {
    enum { MAX_BUCKETS = 64 };
    int64_t shard = (n + size - 1) / size, cuts[MAX_BUCKETS + 1];
    int buckets = 0;
    cuts[0] = 0;
    while (cuts[buckets] < n && buckets < MAX_BUCKETS - 1) {
        int64_t width = 1 + (buckets * 13) % 29; /* 1 .. 29 */
        cuts[buckets + 1] = cuts[buckets] + width < n ? cuts[buckets] + width : n;
        buckets++;
    }
    cuts[buckets] = n;
    loom_comm_ring *rings[MAX_BUCKETS] = {0};
    int made = 1;
    for (int b = 0; b < buckets; b++) {
        int64_t bounds[65];
        for (int r = 0; r <= size; r++) {
            int64_t at = r * shard;
            bounds[r] = at < cuts[b] ? cuts[b] : at > cuts[b + 1] ? cuts[b + 1] : at;
        }
        loom_status st = loom_comm_ring_create(world, bounds, b, &rings[b]);
        CHECK_OK(st);
        made &= st == LOOM_OK;
    }
    float *buf = malloc((size_t)n * sizeof *buf);
    for (int round = 0; round < 2 && made; round++) {
        for (int64_t i = 0; i < n; i++) buf[i] = ring_value(rank, i, round + 2);
        float *sum = reference_sums(world, buf, n);
        for (int k = 0; k < buckets; k++) {
            int b = rank % 2 ? buckets - 1 - k : k;
            CHECK_OK(loom_comm_ring_start(rings[b], buf));
        }
        double busy = 0;
        for (int poll = 0; poll < 20; poll++) {
            for (int j = 0; j < 1000; j++) busy += j * 1e-9;
            for (int b = 0; b < buckets; b++) {
                int done = 0;
                CHECK_OK(loom_comm_ring_test(rings[(b + poll) % buckets], &done));
            }
        }
        for (int b = 0; b < buckets; b++) CHECK_OK(loom_comm_ring_wait(rings[b]));
        int64_t lo = rank * shard < n ? rank * shard : n, hi = lo + shard < n ? lo + shard : n;
        int bad = 0;
        for (int64_t i = lo; i < hi; i++) bad += buf[i] != sum[i];
        CHECK(bad == 0 && busy >= 0, "rank %d: %d buckets in flight, round %d: %d of %lld wrong",
              rank, buckets, round, bad, (long long)(hi - lo));
        free(sum);
    }
    for (int b = 0; b < buckets; b++) loom_comm_ring_free(rings[b]);
    free(buf);
}

static void test_allgather(loom_comm *world, int64_t count) {
    float *send = malloc((size_t)count * sizeof *send);
    float *recv = malloc((size_t)(size * count) * sizeof *recv);
    for (int64_t i = 0; i < count; i++) send[i] = (float)(rank * 100 + i);
    for (int64_t j = 0; j < size * count; j++) recv[j] = -1;
    CHECK_OK(loom_comm_allgather_f32(world, send, recv, count));
    int bad = 0;
    for (int r = 0; r < size; r++) {
        for (int64_t i = 0; i < count; i++) bad += recv[r * count + i] != (float)(r * 100 + i);
    }
    CHECK(bad == 0, "rank %d: allgather (count %lld): %d wrong", rank, (long long)count, bad);

    /* in place: this rank's block of recv is the send buffer */
    for (int64_t j = 0; j < size * count; j++) recv[j] = -1;
    for (int64_t i = 0; i < count; i++) recv[rank * count + i] = (float)(rank * 100 + i) + 0.5f;
    CHECK_OK(loom_comm_allgather_f32(world, recv + rank * count, recv, count));
    bad = 0;
    for (int r = 0; r < size; r++) {
        for (int64_t i = 0; i < count; i++) {
            bad += recv[r * count + i] != (float)(r * 100 + i) + 0.5f;
        }
    }
    CHECK(bad == 0, "rank %d: allgather in place (count %lld): %d wrong", rank, (long long)count,
          bad);
    free(send);
    free(recv);
}

static void test_broadcast(loom_comm *world, int64_t bytes) {
    unsigned char *buf = malloc((size_t)bytes);
    for (int root = 0; root<size; root += size> 1 ? size - 1 : 1) {
        for (int64_t i = 0; i < bytes; i++) {
            buf[i] = (unsigned char)(rank == root ? (i * 7 + root) & 0xff : 0xee);
        }
        CHECK_OK(loom_comm_broadcast(world, buf, bytes, root));
        int bad = 0;
        for (int64_t i = 0; i < bytes; i++) bad += buf[i] != (unsigned char)((i * 7 + root) & 0xff);
        CHECK(bad == 0, "rank %d: broadcast from %d (%lld bytes): %d wrong", rank, root,
              (long long)bytes, bad);
    }
    free(buf);
}

/* Every rank sends to the next and receives from the previous, non-blocking and blocking. */
static void test_ring(loom_comm *world, int64_t count) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int32_t *out = malloc((size_t)count * sizeof *out);
    int32_t *in = malloc((size_t)count * sizeof *in);
    for (int64_t i = 0; i < count; i++) out[i] = (int32_t)(rank * 1000000 + i);
    loom_comm_request *send_req = NULL, *recv_req = NULL;
    int64_t bytes = count * (int64_t)sizeof *out;
    CHECK_OK(loom_comm_irecv(world, in, bytes, prev, 5, &recv_req));
    CHECK_OK(loom_comm_isend(world, out, bytes, next, 5, &send_req));
    CHECK_OK(loom_comm_wait(send_req));
    CHECK_OK(loom_comm_wait(recv_req));
    int bad = 0;
    for (int64_t i = 0; i < count; i++) bad += in[i] != (int32_t)(prev * 1000000 + i);
    CHECK(bad == 0, "rank %d: isend/irecv ring (%lld ints): %d wrong", rank, (long long)count, bad);

    /* blocking: even ranks send first, odd ranks receive first (with 1 rank: to itself,
     * which needs the non-blocking receive posted first) */
    memset(in, 0, (size_t)bytes);
    if (size == 1) {
        CHECK_OK(loom_comm_irecv(world, in, bytes, 0, 6, &recv_req));
        CHECK_OK(loom_comm_send(world, out, bytes, 0, 6));
        CHECK_OK(loom_comm_wait(recv_req));
    } else if (rank % 2 == 0) {
        CHECK_OK(loom_comm_send(world, out, bytes, next, 6));
        CHECK_OK(loom_comm_recv(world, in, bytes, prev, 6));
    } else {
        CHECK_OK(loom_comm_recv(world, in, bytes, prev, 6));
        CHECK_OK(loom_comm_send(world, out, bytes, next, 6));
    }
    bad = 0;
    for (int64_t i = 0; i < count; i++) bad += in[i] != (int32_t)(prev * 1000000 + i);
    CHECK(bad == 0, "rank %d: send/recv ring (%lld ints): %d wrong", rank, (long long)count, bad);
    free(out);
    free(in);
}

/* Two allreduces in flight at once, driven by tests while "computing". */
static void test_iallreduce(loom_comm *world, int64_t count) {
    float *a = malloc((size_t)count * sizeof *a);
    float *b = malloc((size_t)count * sizeof *b);
    for (int64_t i = 0; i < count; i++) {
        a[i] = value_f32(rank, i);
        b[i] = (float)(rank - i);
    }
    loom_comm_request *ra = NULL, *rb = NULL;
    CHECK_OK(loom_comm_iallreduce_f32(world, a, count, &ra));
    CHECK_OK(loom_comm_iallreduce_f32(world, b, count, &rb));
    double busy = 0;
    int done_a = 0, test_failed = 0;
    for (int k = 0; k < 1000 && !done_a && !test_failed; k++) {
        for (int j = 0; j < 1000; j++) busy += j * 1e-9;
        test_failed = loom_comm_test(ra, &done_a) != LOOM_OK;
    }
    if (!done_a && !test_failed) test_failed = loom_comm_wait(ra) != LOOM_OK;
    CHECK(!test_failed, "rank %d: test/wait: %s", rank, loom_last_error());
    CHECK_OK(loom_comm_wait(rb));
    int bad = 0;
    double ranks_sum = size * (size + 1) / 2.0, rank_sum = size * (size - 1) / 2.0;
    for (int64_t i = 0; i < count; i++) {
        bad += a[i] != (float)(ranks_sum * (double)(i % 7 + 1));
        bad += b[i] != (float)(rank_sum - (double)size * (double)i);
    }
    CHECK(bad == 0 && busy >= 0, "rank %d: iallreduce overlap (count %lld): %d wrong", rank,
          (long long)count, bad);
    free(a);
    free(b);
}

static void test_split(loom_comm *world) {
    /* colour = parity, key = -rank: each group is ordered by descending world rank */
    int color = rank % 2;
    loom_comm *group = NULL;
    CHECK_OK(loom_comm_split(world, color, -rank, color ? "odd" : "even", &group));
    if (!group) {
        CHECK(0, "rank %d: split gave no group", rank);
        return;
    }
    int members = 0, above = 0;
    double expect_sum = 0;
    for (int r = 0; r < size; r++) {
        if (r % 2 != color) continue;
        members++;
        above += r > rank;
        expect_sum += r;
    }
    CHECK(loom_comm_size(group) == members, "rank %d: group size %d, expected %d", rank,
          loom_comm_size(group), members);
    CHECK(loom_comm_rank(group) == above, "rank %d: group rank %d, expected %d", rank,
          loom_comm_rank(group), above);
    CHECK(strcmp(loom_comm_name(group), color ? "odd" : "even") == 0, "rank %d: name %s", rank,
          loom_comm_name(group));
    CHECK(loom_comm_world_rank_of(group, loom_comm_rank(group)) == rank,
          "rank %d: world rank of own group rank", rank);
    double sum = rank;
    CHECK_OK(loom_comm_allreduce_f64(group, &sum, 1, LOOM_REDUCE_SUM));
    CHECK(sum == expect_sum, "rank %d: group sum %g, expected %g", rank, sum, expect_sum);

    /* colour < 0: in no group (here: every rank but 0) */
    loom_comm *alone = NULL;
    CHECK_OK(loom_comm_split(world, rank == 0 ? 0 : -1, 0, "alone", &alone));
    CHECK(rank == 0 ? alone != NULL && loom_comm_size(alone) == 1 : alone == NULL,
          "rank %d: split with colour < 0", rank);
    loom_comm_free(alone);
    loom_comm_free(group);
}

static void test_chunked(loom_comm *world) {
    /* Every transfer above 7 elements now takes several MPI calls; counts are chosen not to
     * divide evenly, and large enough that reduce-scatter and allgather take the per-root
     * fallback (size * count > 7). */
    int64_t previous = loom_comm_set_max_chunk(7);
    CHECK(previous > 7, "default max chunk %lld", (long long)previous);
    test_allreduce(world, 100);
    test_ring_reduce_scatter(world);
    test_ring_buckets(world, 200);
    test_allgather(world, 9);
    test_broadcast(world, 50);
    test_ring(world, 23);
    test_iallreduce(world, 30);
    loom_comm_set_max_chunk(previous);
}

static void test_stats(loom_comm *world) {
    loom_comm_reset_stats(world);
    loom_comm_stats s = loom_comm_get_stats(world);
    CHECK(s.bytes == 0 && s.calls == 0 && s.seconds == 0, "rank %d: reset stats", rank);
    const int64_t n = size;
    float buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = 1;
    CHECK_OK(loom_comm_allreduce_f32(world, buf, 1000, LOOM_REDUCE_SUM));
    s = loom_comm_get_stats(world);
    CHECK(s.bytes == 4000 * 2 * (n - 1) / n && s.calls == 1 && s.seconds >= 0,
          "rank %d: allreduce stats bytes %lld calls %lld", rank, (long long)s.bytes,
          (long long)s.calls);

    loom_comm_reset_stats(world);
    double d[10] = {0};
    CHECK_OK(loom_comm_allreduce_f64(world, d, 10, LOOM_REDUCE_MAX));
    float *full = calloc((size_t)(n * 10), sizeof *full);
    float part[10] = {0};
    int64_t tens[65];
    for (int r = 0; r <= size; r++) tens[r] = 10 * r;
    loom_comm_ring *ring = NULL;
    CHECK_OK(loom_comm_ring_create(world, tens, 0, &ring));
    if (ring) {
        CHECK_OK(loom_comm_ring_start(ring, full));
        CHECK_OK(loom_comm_ring_wait(ring));
    }
    CHECK_OK(loom_comm_allgather_f32(world, part, full, 10));
    s = loom_comm_get_stats(world);
    int64_t expect = 80 * 2 * (n - 1) / n + 2 * (n - 1) * 40;
    CHECK(s.bytes == expect && s.calls == 3, "rank %d: collective stats %lld, expected %lld", rank,
          (long long)s.bytes, (long long)expect);
    loom_comm_ring_free(ring);

    /* uneven blocks: the ring sends every block but this rank's */
    int64_t uneven[65] = {0};
    for (int r = 0; r < size; r++) uneven[r + 1] = uneven[r] + r + 1;
    CHECK_OK(loom_comm_ring_create(world, uneven, 0, &ring));
    loom_comm_reset_stats(world);
    if (ring) {
        CHECK_OK(loom_comm_ring_start(ring, full));
        CHECK_OK(loom_comm_ring_wait(ring));
    }
    s = loom_comm_get_stats(world);
    expect = size > 1 ? 4 * (uneven[size] - (rank + 1)) : 0;
    CHECK(s.bytes == expect && s.calls == 1, "rank %d: ring stats %lld (calls %lld), expected %lld",
          rank, (long long)s.bytes, (long long)s.calls, (long long)expect);
    loom_comm_ring_free(ring);

    loom_comm_reset_stats(world);
    char bytes[100] = {0};
    CHECK_OK(loom_comm_broadcast(world, bytes, 100, 0));
    s = loom_comm_get_stats(world);
    expect = rank == 0 && size > 1 ? 100 : 0;
    CHECK(s.bytes == expect && s.calls == 1, "rank %d: broadcast stats %lld, expected %lld", rank,
          (long long)s.bytes, (long long)expect);

    loom_comm_reset_stats(world);
    loom_comm_request *r = NULL, *q = NULL;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    char in[64];
    CHECK_OK(loom_comm_irecv(world, in, 64, prev, 9, &q));
    CHECK_OK(loom_comm_isend(world, bytes, 64, next, 9, &r));
    CHECK_OK(loom_comm_wait(r));
    CHECK_OK(loom_comm_wait(q));
    CHECK_OK(loom_comm_iallreduce_f32(world, buf, 1000, &r));
    CHECK_OK(loom_comm_wait(r));
    CHECK_OK(loom_comm_barrier(world));
    s = loom_comm_get_stats(world);
    expect = 64 + 4000 * 2 * (n - 1) / n;
    CHECK(s.bytes == expect && s.calls == 4, "rank %d: p2p stats %lld (calls %lld)", rank,
          (long long)s.bytes, (long long)s.calls);

    /* the ring volume of an odd byte count rounds down, without overflow for huge buffers */
    loom_comm_reset_stats(world);
    CHECK_OK(loom_comm_allreduce_f32(world, buf, 3, LOOM_REDUCE_SUM));
    s = loom_comm_get_stats(world);
    CHECK(s.bytes == 12 * 2 * (n - 1) / n, "rank %d: allreduce of 12 bytes counted %lld", rank,
          (long long)s.bytes);
    free(full);
}

/* Misuse fails on every rank alike, before anything is sent, and leaves the comm usable. */
static void test_misuse(loom_comm *world) {
    float x[4] = {0};
    loom_comm_request *r = NULL;
    CHECK(loom_comm_allreduce_f32(world, x, -1, LOOM_REDUCE_SUM) == LOOM_ERR_RUNTIME &&
              strstr(loom_last_error(), "negative count"),
          "negative count: %s", loom_last_error());
    CHECK(loom_comm_allreduce_f32(world, NULL, 4, LOOM_REDUCE_SUM) == LOOM_ERR_RUNTIME,
          "no buffer");
    CHECK(loom_comm_broadcast(world, x, 4, size) == LOOM_ERR_RUNTIME &&
              strstr(loom_last_error(), "root") && strstr(loom_last_error(), "'world'"),
          "bad root: %s", loom_last_error());
    CHECK(loom_comm_isend(world, x, 4, -1, 0, &r) == LOOM_ERR_RUNTIME && r == NULL, "bad peer");
    CHECK(loom_comm_irecv(world, x, 4, 0, LOOM_COMM_MAX_TAG + 1, &r) == LOOM_ERR_RUNTIME &&
              strstr(loom_last_error(), "tag"),
          "bad tag: %s", loom_last_error());
    CHECK(loom_comm_wait(NULL) == LOOM_ERR_RUNTIME, "wait on NULL");
    int64_t bounds[65];
    for (int b = 0; b <= size; b++) bounds[b] = 2 * b;
    loom_comm_ring *ring = NULL;
    CHECK(loom_comm_ring_create(world, bounds, LOOM_COMM_MAX_TAG + 1, &ring) == LOOM_ERR_RUNTIME &&
              ring == NULL && strstr(loom_last_error(), "tag"),
          "ring tag: %s", loom_last_error());
    bounds[size] = bounds[size - 1] - 1;
    CHECK(loom_comm_ring_create(world, bounds, 0, &ring) == LOOM_ERR_RUNTIME && ring == NULL &&
              strstr(loom_last_error(), "bounds"),
          "ring bounds: %s", loom_last_error());
    bounds[size] = 2 * size;
    CHECK_OK(loom_comm_ring_create(world, bounds, 0, &ring));
    float full[130] = {0};
    if (ring) {
        CHECK(loom_comm_ring_start(ring, NULL) == LOOM_ERR_RUNTIME, "ring without a buffer");
        CHECK_OK(loom_comm_ring_start(ring, full));
        if (size > 1) {
            CHECK(loom_comm_ring_start(ring, full) == LOOM_ERR_RUNTIME &&
                      strstr(loom_last_error(), "running"),
                  "ring started twice: %s", loom_last_error());
        }
        CHECK_OK(loom_comm_ring_wait(ring));
        CHECK_OK(loom_comm_ring_wait(ring)); /* not running: nothing to do */
    }
    loom_comm_ring_free(ring);
    /* still usable */
    x[0] = 1;
    CHECK_OK(loom_comm_allreduce_f32(world, x, 1, LOOM_REDUCE_SUM));
    CHECK(x[0] == (float)size, "rank %d: allreduce after misuse %g", rank, x[0]);
}

static void test_timeout_setting(void) {
    CHECK(loom_comm_get_timeout() == 60.0, "default timeout %g", loom_comm_get_timeout());
    loom_comm_set_timeout(30);
    CHECK(loom_comm_get_timeout() == 30.0, "timeout %g", loom_comm_get_timeout());
    loom_comm_set_timeout(-1);
    CHECK(loom_comm_get_timeout() == 0.0, "disabled timeout %g", loom_comm_get_timeout());
    loom_comm_set_timeout(60);
    loom_comm_progress("test_comm: checks");
    loom_comm_progress(NULL);
}

int main(int argc, char **argv) {
    loom_comm *world = NULL;
    if (loom_comm_init(&argc, &argv, &world) != LOOM_OK) {
        fprintf(stderr, "init: %s\n", loom_last_error());
        return 1;
    }
    rank = loom_comm_rank(world);
    size = loom_comm_size(world);
    test_timeout_setting();
    test_basics(world);
    test_host_name(world);
    test_local_size(world);
    test_allreduce(world, 1000);
    test_allreduce(world, 1);
    test_allreduce(world, 0);
    test_ring_reduce_scatter(world);
    test_ring_buckets(world, 1000);
    test_allgather(world, 129);
    test_broadcast(world, 1000);
    test_ring(world, 1000);
    test_iallreduce(world, 100000);
    test_split(world);
    test_chunked(world);
    test_stats(world);
    test_misuse(world);

    /* Totals over every rank, printed once. */
    double counts[2] = {check_passed, check_failed};
    int local_failed = check_failed;
    if (loom_comm_allreduce_f64(world, counts, 2, LOOM_REDUCE_SUM) != LOOM_OK) {
        fprintf(stderr, "rank %d: summing the results: %s\n", rank, loom_last_error());
        local_failed = 1;
    }
    loom_comm_finalize(world);
    if (rank == 0) {
        check_passed = (int)counts[0];
        check_failed = (int)counts[1];
        if (check_finish() != 0) return 1;
    }
    return local_failed ? 1 : 0;
}
