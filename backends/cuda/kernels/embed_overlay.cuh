/*
 * embed_overlay: for each token t whose slot s is valid, has a slot map, and
 * maps the token's id (< vocab) to a row j < n[s]: hidden[t, :] = rows[s][j, :],
 * a bit copy. Every other row is left untouched.
 *
 * A block per token; the block fetches the slots' table cells alongside the
 * token's slot and id (one global round trip less). The copy uses 16-byte
 * loads and stores from the first element where source and destination both
 * reach a 16-byte boundary (scalar before it and for the tail; scalar
 * throughout when their offsets differ modulo 16, e.g. hidden rows of
 * h = 100), all loads of an iteration issued before its stores.
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

} // namespace tovl_cuda

TOVL_CUDA_KERNEL void __launch_bounds__(TOVL_CUDA_EMBED_THREADS) embed_overlay(tovl_embed_overlay_args args) {
    using namespace tovl_cuda;
    constexpr uint32_t THREADS = TOVL_CUDA_EMBED_THREADS, UNROLL = 4;
    const uint32_t t = blockIdx.x;
    if (t >= args.T) {
        return;
    }
    /* The lookup is a chain of global round trips. The slots' table cells
     * (at most THREADS slots) are fetched by the block at the same time as
     * the token's slot and id, so the chain is: (slot, id, tables) ->
     * slot_map[id] -> the row. On the H200 this took T = 64 from 1.98 to
     * 1.90 us and left T = 512 (2.72 us), where the copy dominates, as it was. */
    __shared__ EmbedSlotCells cells_of[THREADS];
    const bool prefetched = args.max_loras <= THREADS;
    if (prefetched && threadIdx.x < args.max_loras) {
        cells_of[threadIdx.x] = embed_slot_cells(args, threadIdx.x);
    }
    const int32_t s = row_slot(args.token_slots, args.active_slot, t);
    const uint32_t id = ldg(ptr<const uint32_t>(args.token_ids) + t);
    __syncthreads(); /* the table cells are in */
    if (!slot_valid(s, args.max_loras) || id >= args.vocab) {
        return;
    }
    const EmbedSlotCells cells = prefetched ? cells_of[s] : embed_slot_cells(args, (uint32_t)s);
    if (cells.slot_map == 0) {
        return;
    }
    const int32_t j = ldg(ptr<const int32_t>(cells.slot_map) + id);
    if (j < 0 || (uint32_t)j >= cells.n) {
        return;
    }
    const uint32_t h = args.h;
    const uint16_t *src = ptr<const uint16_t>(cells.rows) + (size_t)j * h;
    uint16_t *dst = ptr<uint16_t>(args.hidden) + (size_t)t * h;

    uint32_t head = bf16_to_16b_boundary(dst);
    if (head != bf16_to_16b_boundary(src) || head > h) {
        head = h;
    }
    for (uint32_t i = threadIdx.x; i < head; i += THREADS) {
        dst[i] = ldg(src + i);
    }
    const uint32_t vectors = (h - head) / 8;
    const uint16_t *vsrc = src + head;
    uint16_t *vdst = dst + head;
    for (uint32_t v0 = 0; v0 < vectors; v0 += THREADS * UNROLL) {
        uint4 chunk[UNROLL] = {};
        TOVL_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            const uint32_t v = v0 + u * THREADS + threadIdx.x;
            if (v < vectors) {
                chunk[u] = load16(vsrc + (size_t)v * 8);
            }
        }
        TOVL_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            const uint32_t v = v0 + u * THREADS + threadIdx.x;
            if (v < vectors) {
                store16(vdst + (size_t)v * 8, chunk[u]);
            }
        }
    }
    for (uint32_t i = head + vectors * 8 + threadIdx.x; i < h; i += THREADS) {
        dst[i] = ldg(src + i);
    }
}

#endif /* TOVL_CUDA_KERNELS_EMBED_OVERLAY_CUH */
