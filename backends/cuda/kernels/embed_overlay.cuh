/*
 * embed_overlay: for each token t whose slot s is valid, has a slot map, and
 * maps the token's id (< vocab) to a row j < n[s]: hidden[t, :] = rows[s][j, :],
 * a bit copy. Every other row is left untouched.
 *
 * A block of 256 threads per token. The lookup is a chain of three global
 * round trips: (the token's slot and id, and the slots' table cells) ->
 * slot_map[s][id] -> the row. When the set has at most 32 slots, lane k of
 * every warp fetches slot k's table cells in the first trip and each warp
 * takes its slot's cells by shuffles: no shared memory and no block barrier,
 * so every warp runs its own chain. A larger set reads slot s's cells after
 * the first trip, one trip more. The copy uses 16-byte loads and stores when
 * both rows are 16-byte aligned and h is a multiple of 8 (out of line
 * otherwise: scalar up to the first 16-byte boundary both rows share, or
 * throughout when they share none, e.g. hidden rows of h = 100).
 *
 * On the H200 (docs/PERFORMANCE.md, Embed hook) this takes 2.2 us at
 * T = 512 with plain launches, of which about 0.8 is the launch and 0.6 the
 * two lookups; the same kernel with h fixed at compile time takes 2.1. With
 * programmatic dependent launch (common.cuh) it takes 1.75.
 */
#ifndef TOVL_CUDA_KERNELS_EMBED_OVERLAY_CUH
#define TOVL_CUDA_KERNELS_EMBED_OVERLAY_CUH

#include "common.cuh"

namespace tovl_cuda {

/* Slot s's cells of the set's tables. */
struct EmbedSlotCells {
    uint64_t slot_map, rows;
    uint32_t n;
};

__device__ __forceinline__ EmbedSlotCells embed_slot_cells(const tovl_embed_overlay_args &a, uint32_t s) {
    return EmbedSlotCells{ldg(ptr<const uint64_t>(a.slot_map_table) + s), ldg(ptr<const uint64_t>(a.rows_table) + s),
                          ldg(ptr<const uint32_t>(a.n_table) + s)};
}

/* Lane `from`'s cells, to every lane of the warp (all lanes must call it). */
__device__ __forceinline__ EmbedSlotCells shfl_cells(const EmbedSlotCells &c, uint32_t from) {
    return EmbedSlotCells{shfl_u64(c.slot_map, from), shfl_u64(c.rows, from), __shfl_sync(FULL_MASK, c.n, from)};
}

/* vectors 16-byte vectors from src to dst (both 16-byte aligned), UNROLL per
 * thread and iteration, all loads of an iteration before its stores. The
 * loop is not unrolled: unrolled, nvcc interleaved the next iteration's
 * loads with this one's stores, which the loads then waited behind. */
template <uint32_t THREADS, uint32_t UNROLL>
__device__ __forceinline__ void embed_copy_vectors(const uint16_t *src, uint16_t *dst, uint32_t vectors) {
    const uint4 *src_v = reinterpret_cast<const uint4 *>(src) + threadIdx.x;
    uint4 *dst_v = reinterpret_cast<uint4 *>(dst) + threadIdx.x;
    TOVL_NO_UNROLL
    for (uint32_t v0 = threadIdx.x; v0 < vectors; v0 += THREADS * UNROLL) {
        uint4 chunk[UNROLL] = {};
        TOVL_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            if (v0 + u * THREADS < vectors) {
                chunk[u] = load16(src_v + u * THREADS);
            }
        }
        TOVL_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            if (v0 + u * THREADS < vectors) {
                store16_global(dst_v + u * THREADS, chunk[u]);
            }
        }
        src_v += THREADS * UNROLL;
        dst_v += THREADS * UNROLL;
    }
}

/* A row copy whose rows are not both 16-byte aligned, or whose h is not a
 * multiple of 8: scalar up to the first 16-byte boundary both rows share
 * (throughout when they share none, e.g. hidden rows of h = 100), vectors
 * from there, a scalar tail. Out of line, so that it does not shape the
 * common case's code (inlined, the common case took 0.1 us more at T = 512). */
template <uint32_t THREADS, uint32_t UNROLL>
__device__ __noinline__ void embed_copy_unaligned(const uint16_t *src, uint16_t *dst, uint32_t h) {
    uint32_t head = bf16_to_16b_boundary(dst);
    if (head != bf16_to_16b_boundary(src) || head > h) {
        head = h;
    }
    for (uint32_t i = threadIdx.x; i < head; i += THREADS) {
        dst[i] = ldg(src + i);
    }
    const uint32_t vectors = (h - head) / 8;
    embed_copy_vectors<THREADS, UNROLL>(src + head, dst + head, vectors);
    for (uint32_t i = head + vectors * 8 + threadIdx.x; i < h; i += THREADS) {
        dst[i] = ldg(src + i);
    }
}

/* The kernel's body for blocks of THREADS threads, UNROLL 16-byte vectors per
 * thread and iteration (templated so the microbenchmark can time other shapes). */
template <uint32_t THREADS, uint32_t UNROLL>
__device__ __forceinline__ void embed_overlay_block(const tovl_embed_overlay_args &args) {
    static_assert(THREADS % WARP == 0, "whole warps: every lane takes part in the shuffles");
    const uint32_t t = blockIdx.x;
    if (t >= args.T) {
        return; /* the whole block */
    }
    const bool by_shuffle = args.max_loras <= WARP;
    const uint32_t lane = lane_id();
    EmbedSlotCells lane_cells = {0, 0, 0};
    if (by_shuffle && lane < args.max_loras) {
        lane_cells = embed_slot_cells(args, lane);
    }
    /* What does not depend on the row is worked out while the lookups are in
     * flight: everything after the last one is on the kernel's critical path
     * (about 0.1 us at T = 512 on the H200). */
    const uint32_t h = args.h;
    uint16_t *dst = ptr<uint16_t>(args.hidden) + (size_t)t * h;
    const bool dst_whole_vectors = (((uintptr_t)dst & 15u) | (h & 7u)) == 0;
    /* The token's slot and id, and its hidden row, may come from the kernel
     * before (the set's tables above may not: common.cuh). */
    grid_dependency_wait();
    const int32_t s = row_slot(args.token_slots, args.active_slot, t);
    const uint32_t id = ldg(ptr<const uint32_t>(args.token_ids) + t);
    const bool valid = slot_valid(s, args.max_loras);
    /* Before any lane can leave: the shuffles need the whole warp. */
    EmbedSlotCells cells = shfl_cells(lane_cells, valid ? (uint32_t)s % WARP : 0u);
    if (!valid || id >= args.vocab) {
        return;
    }
    if (!by_shuffle) {
        cells = embed_slot_cells(args, (uint32_t)s);
    }
    if (cells.slot_map == 0) {
        return;
    }
    const int32_t j = ldg(ptr<const int32_t>(cells.slot_map) + id);
    /* The lookups are done: the next kernel may start launching while the
     * row is copied (on the H200, 2.2 -> 1.75 us per launch at T = 512). */
    grid_dependents_launch();
    if (j < 0 || (uint32_t)j >= cells.n) {
        return;
    }
    const uint16_t *src = ptr<const uint16_t>(cells.rows) + (size_t)j * h;
    if (dst_whole_vectors && ((uintptr_t)src & 15u) == 0) {
        /* The common case, whole 16-byte vectors: no scalar head or tail
         * loops (even empty, they cost about 0.1 us at T = 512). */
        embed_copy_vectors<THREADS, UNROLL>(src, dst, h / 8);
        return;
    }
    embed_copy_unaligned<THREADS, UNROLL>(src, dst, h);
}

} // namespace tovl_cuda

TOVL_CUDA_KERNEL void __launch_bounds__(TOVL_CUDA_EMBED_THREADS) embed_overlay(tovl_embed_overlay_args args) {
    /* 256 threads x 2 vectors: an h = 4096 row in one iteration. */
    tovl_cuda::embed_overlay_block<TOVL_CUDA_EMBED_THREADS, 4096 / 8 / TOVL_CUDA_EMBED_THREADS>(args);
}

#endif /* TOVL_CUDA_KERNELS_EMBED_OVERLAY_CUH */
