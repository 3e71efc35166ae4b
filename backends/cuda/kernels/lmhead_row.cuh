/*
 * lmhead_overlay_{bf16,f32}_row: the lm_head hook for small batches (decode
 * steps), where the tiles of lmhead_overlay.cuh (8 rows of one slot x 8
 * overlay rows) are mostly empty and every tile costs the same ~8 us on the
 * H200 however few rows it holds. Same contract and same bits:
 *     logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :])
 * for row t with slot s valid, k < n[s] (and < max_n), id = ids[s][k] < vocab.
 *
 * Work. Block (t, y) takes row t and overlay rows y * ROW_CELLS .. + ROW_CELLS
 * of its slot (beyond CUDA's y limit also y + gridDim.y, ...): no tile to
 * pick, no rows to collect. Warp w computes one cell, overlay row k = y *
 * ROW_CELLS + w. Each overlay row is read once per row t rather than once per
 * 8 rows, which is why this wins only while the batch is small (the host's
 * choice, cuda_geometry.c).
 *
 * The dot order. Thread p of a warp holds the spec's lanes 8p .. 8p + 7 of its
 * cell: for each 256-element round j it loads elements 256 j + 8p .. + 7 of
 * the hidden row and of the overlay row as one 16-byte vector each, so each
 * lane's sum runs over increasing i. Products and sums are __fmul_rn /
 * __fadd_rn, never fused. Elements past h are skipped, not multiplied by zero.
 * The tree: strides 128 .. 8 pair thread p with p + 16, 8, 4, 2, 1 (shuffles,
 * the lower lane's value first), strides 4, 2, 1 then run in thread 0's eight
 * lanes. All of a thread's vectors are requested before the first is used,
 * ROUNDS_AHEAD rounds at a time, so a cell costs about one memory round trip
 * per ROUNDS_AHEAD * 256 elements.
 */
#ifndef TOVL_CUDA_KERNELS_LMHEAD_ROW_CUH
#define TOVL_CUDA_KERNELS_LMHEAD_ROW_CUH

#include "common.cuh"

namespace tovl_cuda {

struct LmheadRow {
    static constexpr uint32_t THREADS = TOVL_CUDA_LMHEAD_ROW_THREADS;
    static constexpr uint32_t CELLS = THREADS / WARP; /* overlay rows per block: a warp each */
    static constexpr uint32_t LANES_PER_THREAD = 8;   /* one 16-byte vector of bf16 */
    static constexpr uint32_t ROUNDS_AHEAD = TOVL_CUDA_LMHEAD_ROW_ROUNDS_AHEAD;
    static_assert(CELLS == TOVL_CUDA_LMHEAD_ROW_CELLS, "a warp per overlay row");
    static_assert(WARP * LANES_PER_THREAD == TOVL_DOT_LANES, "a warp holds the 256 lanes of one cell");
};

/* Lanes 8p + i of one round: the products of the elements of the two vectors
 * (the first `valid` of them exist), added to the lanes' sums. */
template <bool PARTIAL>
__device__ __forceinline__ void lmhead_row_round(float (&acc)[LmheadRow::LANES_PER_THREAD], uint4 xv, uint4 wv,
                                                 uint32_t valid) {
    const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w}, ww[4] = {wv.x, wv.y, wv.z, wv.w};
    TOVL_UNROLL
    for (uint32_t i = 0; i < LmheadRow::LANES_PER_THREAD; i++) {
        if (!PARTIAL || i < valid) {
            const float x = i % 2 ? pair_hi(xw[i / 2]) : pair_lo(xw[i / 2]);
            const float w = i % 2 ? pair_hi(ww[i / 2]) : pair_lo(ww[i / 2]);
            acc[i] = __fadd_rn(acc[i], __fmul_rn(x, w));
        }
    }
}

/* The spec's tree over the warp's 256 lanes; the result in lane 0. */
__device__ __forceinline__ float lmhead_row_tree(float (&acc)[LmheadRow::LANES_PER_THREAD]) {
    /* Strides 128, 64, 32, 16, 8: thread p (lanes 8p ..) takes thread p + d's
     * lanes (8 (p + d) ..), d = 16 .. 1; only threads p < d keep the sum. */
    TOVL_UNROLL
    for (uint32_t d = WARP / 2; d >= 1; d /= 2) {
        TOVL_UNROLL
        for (uint32_t i = 0; i < LmheadRow::LANES_PER_THREAD; i++) {
            acc[i] = __fadd_rn(acc[i], __shfl_down_sync(FULL_MASK, acc[i], d));
        }
    }
    /* Strides 4, 2, 1 among thread 0's own lanes. */
    TOVL_UNROLL
    for (uint32_t stride = LmheadRow::LANES_PER_THREAD / 2; stride >= 1; stride /= 2) {
        TOVL_UNROLL
        for (uint32_t i = 0; i < stride; i++) {
            acc[i] = __fadd_rn(acc[i], acc[i + stride]);
        }
    }
    return acc[0];
}

/* One cell: row x of the hidden states times overlay row w; the result in
 * lane 0. Every lane of the warp calls it. */
__device__ __forceinline__ float lmhead_row_dot(const uint16_t *x, const uint16_t *w, uint32_t h, bool vectors) {
    constexpr uint32_t AHEAD = LmheadRow::ROUNDS_AHEAD;
    const uint32_t first = LmheadRow::LANES_PER_THREAD * lane_id(); /* this thread's lanes */
    float acc[LmheadRow::LANES_PER_THREAD];
    TOVL_UNROLL
    for (uint32_t i = 0; i < LmheadRow::LANES_PER_THREAD; i++) {
        acc[i] = 0.0f;
    }
    for (uint32_t base = 0; base < h; base += AHEAD * TOVL_DOT_LANES) {
        uint4 xv[AHEAD], wv[AHEAD];
        TOVL_UNROLL
        for (uint32_t j = 0; j < AHEAD; j++) {
            const uint32_t e = base + j * TOVL_DOT_LANES + first;
            xv[j] = wv[j] = uint4{0, 0, 0, 0};
            if (e < h) {
                xv[j] = load8_bf16(x, e, h, vectors);
                wv[j] = load8_bf16(w, e, h, vectors);
            }
        }
        TOVL_UNROLL
        for (uint32_t j = 0; j < AHEAD; j++) {
            const uint32_t e = base + j * TOVL_DOT_LANES + first;
            if (e + LmheadRow::LANES_PER_THREAD <= h) {
                lmhead_row_round<false>(acc, xv[j], wv[j], LmheadRow::LANES_PER_THREAD);
            } else if (e < h) {
                lmhead_row_round<true>(acc, xv[j], wv[j], h - e);
            }
        }
    }
    return lmhead_row_tree(acc);
}

template <bool F32_LOGITS>
__device__ void lmhead_overlay_row(const tovl_lmhead_overlay_args &a) {
    const uint32_t t = blockIdx.x, warp = threadIdx.x / WARP, lane = lane_id();
    /* The set's table cells of the first 32 slots, lane i slot i: requested
     * before the wait (no kernel writes them), picked by shuffle after it. */
    uint32_t lane_n = 0;
    uint64_t lane_rows = 0, lane_ids = 0;
    if (lane < a.max_loras) {
        lane_n = ldg(ptr<const uint32_t>(a.n_table) + lane);
        lane_rows = ldg(ptr<const uint64_t>(a.rows_table) + lane);
        lane_ids = ldg(ptr<const uint64_t>(a.ids_table) + lane);
    }
    /* No early grid_dependents_launch: letting the next launch's blocks in
     * beside these cost 1 us at T = 8 on the H200 (3.63 -> 4.70 us); the
     * grid lets go as its blocks exit. */
    /* The row slots and hidden rows may come from the kernel before (common.cuh). */
    grid_dependency_wait();
    const int32_t s = row_slot(a.row_slots, a.active_slot, t);
    if (!slot_valid(s, a.max_loras)) {
        return; /* uniform: the block's row has no overlay */
    }
    uint32_t n_cell;
    uint64_t rows_cell, ids_cell;
    if ((uint32_t)s < WARP) {
        n_cell = __shfl_sync(FULL_MASK, lane_n, (uint32_t)s);
        rows_cell = shfl_u64(lane_rows, (uint32_t)s);
        ids_cell = shfl_u64(lane_ids, (uint32_t)s);
    } else {
        n_cell = ldg(ptr<const uint32_t>(a.n_table) + s);
        rows_cell = ldg(ptr<const uint64_t>(a.rows_table) + s);
        ids_cell = ldg(ptr<const uint64_t>(a.ids_table) + s);
    }
    const uint32_t n = min_of(n_cell, a.max_n);
    const uint16_t *rows = ptr<const uint16_t>(rows_cell);
    const uint32_t *ids = ptr<const uint32_t>(ids_cell);
    const uint32_t h = a.h;
    const uint16_t *x = ptr<const uint16_t>(a.hidden) + (size_t)t * h;
    const bool vectors = h % 8 == 0 && ((a.hidden | (uint64_t)(uintptr_t)rows) & 15u) == 0;
    /* Beyond CUDA's y limit a block also does y + gridDim.y, ... */
    for (uint32_t k = blockIdx.y * LmheadRow::CELLS + warp; k < n; k += gridDim.y * LmheadRow::CELLS) {
        const uint32_t id = ldg(ids + k); /* in flight with the cell's loads */
        const float v = lmhead_row_dot(x, rows + (size_t)k * h, h, vectors);
        if (lane == 0 && id < a.vocab) {
            const size_t cell_at = (size_t)t * a.ld + id;
            if (F32_LOGITS) {
                ptr<uint32_t>(a.logits)[cell_at] = f32_out_bits(v);
            } else {
                ptr<uint16_t>(a.logits)[cell_at] = f32_to_bf16(v);
            }
        }
    }
}

} // namespace tovl_cuda

#define TOVL_CUDA_LMHEAD_ROW_ENTRY(name, f32)                                                      \
    TOVL_CUDA_KERNEL void __launch_bounds__(tovl_cuda::LmheadRow::THREADS, TOVL_CUDA_LMHEAD_ROW_BLOCKS_PER_SM)      \
        name(tovl_lmhead_overlay_args args) {                                                      \
        tovl_cuda::lmhead_overlay_row<f32>(args);                                                  \
    }

TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_bf16_row, false)
TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_f32_row, true)

#endif /* TOVL_CUDA_KERNELS_LMHEAD_ROW_CUH */
