/*
 * lmhead_overlay_{bf16,f32}_group: the lm_head hook for batches between the
 * row variants (lmhead_row.cuh, every block resident at once) and the big
 * ones the tiles are for (lmhead_overlay.cuh). Same contract and same bits:
 *     logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :])
 * for row t with slot s valid, k < n[s] (and < max_n), id = ids[s][k] < vocab.
 *
 * Work. Block (x, y) takes the y-th slot that has rows in the batch and its
 * overlay rows x * CELLS .. + CELLS (beyond the grid's x also x + gridDim.x,
 * ...). Every warp finds the slot's rows itself: it reads all T row slots
 * (T <= MAX_T, one per lane and chunk of 32), ORs the slots present into a
 * mask and keeps one ballot per chunk of the rows of its slot, so there is
 * no block barrier and no shared memory anywhere. Warp w computes overlay row
 * k = x * CELLS + w % CELLS against groups of G of the slot's rows, group
 * w / CELLS first, then every PHASES-th: each overlay vector it loads serves
 * G rows, and the CELLS warps that share a group load the same hidden
 * vectors (from L1 after the first).
 *
 * The dot order is the row variant's: thread p holds the spec's lanes 8p ..
 * 8p + 7 of each of its G cells, one 16-byte vector of each row per 256-
 * element round, ROUNDS_AHEAD rounds requested before the first is used;
 * products and sums __fmul_rn / __fadd_rn, never fused; elements past h
 * skipped; the tree is lmhead_row_tree's (shuffles, then thread 0's lanes).
 */
#ifndef TOVL_CUDA_KERNELS_LMHEAD_GROUP_CUH
#define TOVL_CUDA_KERNELS_LMHEAD_GROUP_CUH

#include "lmhead_row.cuh"

namespace tovl_cuda {

struct LmheadGroup {
    static constexpr uint32_t THREADS = TOVL_CUDA_LMHEAD_GROUP_THREADS;
    static constexpr uint32_t CELLS = TOVL_CUDA_LMHEAD_GROUP_CELLS;  /* overlay rows per block, a warp each */
    static constexpr uint32_t PHASES = THREADS / (WARP * CELLS);     /* groups of rows in flight per block */
    static constexpr uint32_t G = TOVL_CUDA_LMHEAD_GROUP_ROWS;       /* rows per group */
    static constexpr uint32_t LANES = 8;                             /* per thread: one 16-byte vector */
    static constexpr uint32_t AHEAD = TOVL_CUDA_LMHEAD_GROUP_ROUNDS_AHEAD;
    static constexpr uint32_t CHUNKS = TOVL_CUDA_LMHEAD_GROUP_MAX_T / WARP; /* row slots per lane */
    static_assert(THREADS % (WARP * CELLS) == 0, "whole groups of CELLS warps");
    static_assert(WARP * LANES == TOVL_DOT_LANES, "a warp holds the 256 lanes of a cell");
    static_assert(TOVL_CUDA_LMHEAD_GROUP_MAX_SLOTS <= WARP, "the slots present fit one 32-bit mask");
};

/* The row of the batch that is the idx-th (from 0) of the slot whose rows are
 * the set bits of masks (chunk c: rows 32 c ..); idx < their count. */
__device__ __forceinline__ uint32_t lmhead_group_nth_row(const uint32_t (&masks)[LmheadGroup::CHUNKS], uint32_t idx) {
    uint32_t row = 0;
    bool found = false;
    TOVL_UNROLL
    for (uint32_t c = 0; c < LmheadGroup::CHUNKS; c++) {
        const uint32_t count = (uint32_t)__popc(masks[c]);
        if (!found && idx < count) {
            uint32_t m = masks[c];
            for (uint32_t i = 0; i < idx; i++) {
                m &= m - 1u;
            }
            row = c * WARP + (uint32_t)(__ffs((int)m) - 1);
            found = true;
        } else if (!found) {
            idx -= count;
        }
    }
    return row;
}

/* The G cells of overlay row w against rows x[0 .. G-1]: this thread's lanes'
 * sums. Every lane of the warp calls it. */
__device__ __forceinline__ void lmhead_group_sums(float (&acc)[LmheadGroup::G][LmheadGroup::LANES],
                                                 const uint16_t *const (&x)[LmheadGroup::G], const uint16_t *w,
                                                 uint32_t h, bool vectors, uint32_t first) {
    constexpr uint32_t AHEAD = LmheadGroup::AHEAD, G = LmheadGroup::G, L = LmheadGroup::LANES;
    for (uint32_t base = 0; base < h; base += AHEAD * TOVL_DOT_LANES) {
        RowVector<L> xv[AHEAD][G], wv[AHEAD];
        TOVL_UNROLL
        for (uint32_t j = 0; j < AHEAD; j++) {
            const uint32_t e = base + j * TOVL_DOT_LANES + first;
            if (e < h) {
                wv[j] = row_load<L>(w, e, h, vectors);
                TOVL_UNROLL
                for (uint32_t g = 0; g < G; g++) {
                    xv[j][g] = row_load<L>(x[g], e, h, vectors);
                }
            } else {
                wv[j] = RowVector<L>{};
                TOVL_UNROLL
                for (uint32_t g = 0; g < G; g++) {
                    xv[j][g] = RowVector<L>{};
                }
            }
        }
        TOVL_UNROLL
        for (uint32_t j = 0; j < AHEAD; j++) {
            TOVL_UNROLL
            for (uint32_t g = 0; g < G; g++) {
                lmhead_row_round<L>(acc[g], xv[j][g], wv[j], base + j * TOVL_DOT_LANES + first, h);
            }
        }
    }
}

template <bool F32_LOGITS>
__device__ void lmhead_overlay_group(const tovl_lmhead_overlay_args &a) {
    using C = LmheadGroup;
    const uint32_t warp = threadIdx.x / WARP, lane = lane_id();
    const uint32_t cell = warp % C::CELLS, phase = warp / C::CELLS;
    /* The set's table cells, lane i slot i (max_loras <= 32: the host's
     * choice): requested before the wait, no kernel writes them. */
    uint32_t lane_n = 0;
    uint64_t lane_rows = 0, lane_ids = 0;
    if (lane < a.max_loras) {
        lane_n = ldg(ptr<const uint32_t>(a.n_table) + lane);
        lane_rows = ldg(ptr<const uint64_t>(a.rows_table) + lane);
        lane_ids = ldg(ptr<const uint64_t>(a.ids_table) + lane);
    }
    /* No early grid_dependents_launch, as in the row variants. */
    grid_dependency_wait();
    /* Every row's slot (T <= MAX_T: the host's choice), one per lane and chunk. */
    int32_t slot_of[C::CHUNKS];
    uint32_t present = 0;
    TOVL_UNROLL
    for (uint32_t c = 0; c < C::CHUNKS; c++) {
        const uint32_t t = c * WARP + lane;
        slot_of[c] = t < a.T ? row_slot(a.row_slots, a.active_slot, t) : -1;
    }
    TOVL_UNROLL
    for (uint32_t c = 0; c < C::CHUNKS; c++) {
        if (slot_valid(slot_of[c], a.max_loras)) {
            present |= 1u << slot_of[c];
        }
    }
    TOVL_UNROLL
    for (uint32_t d = WARP / 2; d >= 1; d /= 2) {
        present |= __shfl_xor_sync(FULL_MASK, present, d);
    }
    /* This block's slot: the y-th present one. */
    for (uint32_t i = 0; i < blockIdx.y && present; i++) {
        present &= present - 1u;
    }
    if (!present) {
        return; /* uniform: fewer slots have rows than the grid has room for */
    }
    const uint32_t s = (uint32_t)(__ffs((int)present) - 1);
    uint32_t masks[C::CHUNKS], rows_of_slot = 0;
    TOVL_UNROLL
    for (uint32_t c = 0; c < C::CHUNKS; c++) {
        masks[c] = __ballot_sync(FULL_MASK, slot_of[c] == (int32_t)s);
        rows_of_slot += (uint32_t)__popc(masks[c]);
    }
    const uint32_t n = min_of(__shfl_sync(FULL_MASK, lane_n, s), a.max_n);
    const uint16_t *rows = ptr<const uint16_t>(shfl_u64(lane_rows, s));
    const uint32_t *ids = ptr<const uint32_t>(shfl_u64(lane_ids, s));
    const uint32_t h = a.h;
    const uint16_t *hidden = ptr<const uint16_t>(a.hidden);
    const bool vectors = h % 8 == 0 && ((a.hidden | (uint64_t)(uintptr_t)rows) & 15u) == 0;
    const uint32_t first = C::LANES * lane; /* this thread's first lane */
    for (uint32_t k = blockIdx.x * C::CELLS + cell; k < n; k += gridDim.x * C::CELLS) {
        const uint32_t id = ldg(ids + k); /* in flight with the cells' loads */
        const uint16_t *w = rows + (size_t)k * h;
        for (uint32_t g0 = phase * C::G; g0 < rows_of_slot; g0 += C::PHASES * C::G) {
            /* The group's rows; past the slot's last, its first again
             * (computed, never stored). */
            uint32_t t[C::G];
            const uint16_t *x[C::G];
            TOVL_UNROLL
            for (uint32_t g = 0; g < C::G; g++) {
                t[g] = lmhead_group_nth_row(masks, g0 + g < rows_of_slot ? g0 + g : g0);
                x[g] = hidden + (size_t)t[g] * h;
            }
            float acc[C::G][C::LANES];
            TOVL_UNROLL
            for (uint32_t g = 0; g < C::G; g++) {
                TOVL_UNROLL
                for (uint32_t i = 0; i < C::LANES; i++) {
                    acc[g][i] = 0.0f;
                }
            }
            lmhead_group_sums(acc, x, w, h, vectors, first);
            TOVL_UNROLL
            for (uint32_t g = 0; g < C::G; g++) {
                const float v = lmhead_row_tree<C::LANES>(acc[g]);
                if (lane == 0 && g0 + g < rows_of_slot && id < a.vocab) {
                    const size_t cell_at = (size_t)t[g] * a.ld + id;
                    if (F32_LOGITS) {
                        ptr<uint32_t>(a.logits)[cell_at] = f32_out_bits(v);
                    } else {
                        ptr<uint16_t>(a.logits)[cell_at] = f32_to_bf16(v);
                    }
                }
            }
        }
    }
}

} // namespace tovl_cuda

#define TOVL_CUDA_LMHEAD_GROUP_ENTRY(name, f32)                                                              \
    TOVL_CUDA_KERNEL void __launch_bounds__(tovl_cuda::LmheadGroup::THREADS, TOVL_CUDA_LMHEAD_GROUP_BLOCKS_PER_SM) \
        name(tovl_lmhead_overlay_args args) {                                                              \
        tovl_cuda::lmhead_overlay_group<f32>(args);                                                         \
    }

TOVL_CUDA_LMHEAD_GROUP_ENTRY(lmhead_overlay_bf16_group, false)
TOVL_CUDA_LMHEAD_GROUP_ENTRY(lmhead_overlay_f32_group, true)

#endif /* TOVL_CUDA_KERNELS_LMHEAD_GROUP_CUH */
