/*
 * lmhead_overlay_{bf16,f32}_row, _row2, _row4 and _row4q: the lm_head hook for small batches
 * (decode steps), where the tiles of lmhead_overlay.cuh (8 rows of one slot x
 * 8 overlay rows) are mostly empty and every tile costs the same ~8 us on the
 * H200 however few rows it holds. Same contract and same bits:
 *     logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :])
 * for row t with slot s valid, k < n[s] (and < max_n), id = ids[s][k] < vocab.
 *
 * Work. Block (t, y) takes row t and overlay rows y * CELLS .. + CELLS of its
 * slot (beyond CUDA's y limit also y + gridDim.y, ...): no tile to pick, no
 * rows to collect. W warps compute one cell (W = 1: _row, 4 cells a block;
 * W = 2: _row2, 2 cells a block, each thread half the lanes, so a cell's
 * loads are in flight in half the round trips). Each overlay row is read
 * once per row t rather than once per 8, which is why these win only while
 * the batch is small (the host's choice, cuda_geometry.c). _row4 and
 * _row4q, at the end of this file, give 2 and 4 cells of one row a block of
 * four warps.
 *
 * The dot order. Thread p of warp u (0 <= u < W) of a cell holds the spec's
 * lanes 256 u / W + L p .. + L - 1, L = 8 / W: for each 256-element round j
 * it loads those lanes' elements of the hidden row and of the overlay row as
 * one vector each (16 or 8 bytes), so each lane's sum runs over increasing
 * i. Products and sums are __fmul_rn / __fadd_rn, never fused. Elements past
 * h are skipped, not multiplied by zero. The tree: with W = 2, stride 128
 * pairs the two warps through shared memory (the lower warp's value first);
 * then shuffles pair thread p with p + 16, 8, 4, 2, 1 (strides 16 L .. L),
 * and the strides below L run in thread 0's own lanes. A thread requests
 * ROUNDS_AHEAD rounds of both rows before it uses the first.
 */
#ifndef TOVL_CUDA_KERNELS_LMHEAD_ROW_CUH
#define TOVL_CUDA_KERNELS_LMHEAD_ROW_CUH

#include "common.cuh"
#include "lmhead_overlay.cuh" /* lmhead_live_rows, lmhead_few_rows */

namespace tovl_cuda {

template <uint32_t W_, uint32_t CELLS_, uint32_t AHEAD_, uint32_t BLOCKS_PER_SM_>
struct LmheadRowConfig {
    static constexpr uint32_t W = W_;                   /* warps per cell */
    static constexpr uint32_t THREADS = TOVL_CUDA_LMHEAD_ROW_THREADS;
    static constexpr uint32_t CELLS = THREADS / (WARP * W); /* overlay rows per block */
    static constexpr uint32_t LANES = TOVL_DOT_LANES / (WARP * W); /* per thread: one vector of bf16 */
    static constexpr uint32_t ROUNDS_AHEAD = AHEAD_;
    static constexpr uint32_t BLOCKS_PER_SM = BLOCKS_PER_SM_; /* resident at once: the register cap */
    static_assert(CELLS == CELLS_, "the block's cells as launch_shape.h says");
    static_assert(W == 1 || W == 2, "one warp per cell, or two through shared memory");
    static_assert(LANES == 8 || LANES == 4, "16- or 8-byte vectors");
};
using LmheadRow = LmheadRowConfig<1, TOVL_CUDA_LMHEAD_ROW_CELLS, TOVL_CUDA_LMHEAD_ROW_ROUNDS_AHEAD,
                                  TOVL_CUDA_LMHEAD_ROW_BLOCKS_PER_SM>;
using LmheadRow2 = LmheadRowConfig<2, TOVL_CUDA_LMHEAD_ROW2_CELLS, TOVL_CUDA_LMHEAD_ROW2_ROUNDS_AHEAD,
                                   TOVL_CUDA_LMHEAD_ROW2_BLOCKS_PER_SM>;

/* L bf16 elements from e of a row as 32-bit pair words (0 past h; those are
 * never used): one 16- or 8-byte load where the row allows it. */
template <uint32_t L>
struct RowVector {
    uint32_t word[L / 2];
};
template <uint32_t L>
__device__ __forceinline__ RowVector<L> row_load(const uint16_t *row, uint32_t e, uint32_t h, bool vectors) {
    RowVector<L> v;
    if constexpr (L == 8) {
        const uint4 q = load8_bf16(row, e, h, vectors);
        v.word[0] = q.x, v.word[1] = q.y, v.word[2] = q.z, v.word[3] = q.w;
    } else {
        if (vectors && e + 4 <= h) {
            const uint2 d = ldg(reinterpret_cast<const uint2 *>(row + e));
            v.word[0] = d.x, v.word[1] = d.y;
        } else {
            load_bf16_elements<4>(row, e, h, v.word);
        }
    }
    return v;
}

/* This thread's lanes of one round, its first element at e: the products
 * of the two vectors' elements that lie within h, added to the lanes' sums.
 * One path with a check per element rather than a whole-round and a partial
 * path: with the two, ptxas issued the loads later (119 registers against
 * 127) and _row2 took 3.36 us at T = 1 on the H200 instead of 2.68. */
template <uint32_t L>
__device__ __forceinline__ void lmhead_row_round(float (&acc)[L], const RowVector<L> &xv, const RowVector<L> &wv,
                                                 uint32_t e, uint32_t h) {
    TOVL_UNROLL
    for (uint32_t i = 0; i < L; i++) {
        if (e + i < h) {
            const float x = i % 2 ? pair_hi(xv.word[i / 2]) : pair_lo(xv.word[i / 2]);
            const float w = i % 2 ? pair_hi(wv.word[i / 2]) : pair_lo(wv.word[i / 2]);
            acc[i] = __fadd_rn(acc[i], __fmul_rn(x, w));
        }
    }
}

/* This thread's lanes' sums over row x times overlay row w (first: its first
 * lane). Every lane of the warp calls it. */
template <class C>
__device__ __forceinline__ void lmhead_row_sums(float (&acc)[C::LANES], const uint16_t *x, const uint16_t *w,
                                                uint32_t h, bool vectors, uint32_t first) {
    constexpr uint32_t AHEAD = C::ROUNDS_AHEAD, L = C::LANES;
    for (uint32_t base = 0; base < h; base += AHEAD * TOVL_DOT_LANES) {
        RowVector<L> xv[AHEAD], wv[AHEAD];
        TOVL_UNROLL
        for (uint32_t j = 0; j < AHEAD; j++) {
            const uint32_t e = base + j * TOVL_DOT_LANES + first;
            if (e < h) {
                xv[j] = row_load<L>(x, e, h, vectors);
                wv[j] = row_load<L>(w, e, h, vectors);
            } else {
                xv[j] = wv[j] = RowVector<L>{};
            }
        }
        TOVL_UNROLL
        for (uint32_t j = 0; j < AHEAD; j++) {
            lmhead_row_round<L>(acc, xv[j], wv[j], base + j * TOVL_DOT_LANES + first, h);
        }
    }
}

/* The warp's part of the tree: its lanes (thread p: the L from L p) reduced
 * by shuffles (strides 16 L .. L, the lower lane's value first), then in
 * thread 0 (strides L / 2 .. 1); the result in lane 0. */
template <uint32_t L>
__device__ __forceinline__ float lmhead_row_tree(float (&acc)[L]) {
    TOVL_UNROLL
    for (uint32_t d = WARP / 2; d >= 1; d /= 2) {
        TOVL_UNROLL
        for (uint32_t i = 0; i < L; i++) {
            acc[i] = __fadd_rn(acc[i], __shfl_down_sync(FULL_MASK, acc[i], d));
        }
    }
    TOVL_UNROLL
    for (uint32_t stride = L / 2; stride >= 1; stride /= 2) {
        TOVL_UNROLL
        for (uint32_t i = 0; i < stride; i++) {
            acc[i] = __fadd_rn(acc[i], acc[i + stride]);
        }
    }
    return acc[0];
}

/* Row t's slot and that slot's table cells (n capped at max_n, rows, ids),
 * for a whole block; false (for every thread) when the row has none. The
 * set's cells of the first 32 slots are requested before the wait (no
 * kernel writes them), lane i slot i, and picked by shuffle after it; the
 * row slots may come from the kernel before (common.cuh). Every thread
 * calls it. */
struct RowSlotCells {
    uint32_t n;
    const uint16_t *rows;
    const uint32_t *ids;
    uint32_t live; /* with LIVE: lmhead_live_rows, from the same loads */
};
template <bool LIVE = false>
__device__ __forceinline__ bool row_slot_cells(const tovl_lmhead_overlay_args &a, uint32_t t, RowSlotCells &out,
                                               uint32_t few = 0) {
    const uint32_t lane = lane_id();
    uint32_t lane_n = 0;
    uint64_t lane_rows = 0, lane_ids = 0;
    if (lane < a.max_loras) {
        lane_n = ldg(ptr<const uint32_t>(a.n_table) + lane);
        lane_rows = ldg(ptr<const uint64_t>(a.rows_table) + lane);
        lane_ids = ldg(ptr<const uint64_t>(a.ids_table) + lane);
    }
    if constexpr (LIVE) {
        /* The gated pair: a block that will not compute lets the tiles
         * after it start launching now (launch_shape.h). */
        out.live = lmhead_live_rows(a, min_of(lane_n, a.max_n));
        if (out.live > few) {
            grid_dependents_launch();
        }
    }
    grid_dependency_wait();
    const int32_t s = row_slot(a.row_slots, a.active_slot, t);
    if (!slot_valid(s, a.max_loras)) {
        return false;
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
    out.n = min_of(n_cell, a.max_n);
    out.rows = ptr<const uint16_t>(rows_cell);
    out.ids = ptr<const uint32_t>(ids_cell);
    return true;
}

template <class C, bool F32_LOGITS>
__device__ void lmhead_overlay_row(const tovl_lmhead_overlay_args &a) {
    /* W = 2: the upper warp's lane sums, for stride 128 (a dummy otherwise). */
    __shared__ float upper[C::W == 2 ? C::CELLS : 1][C::W == 2 ? TOVL_DOT_LANES / 2 : 1];
    const uint32_t t = blockIdx.x, warp = threadIdx.x / WARP, lane = lane_id();
    const uint32_t cell = warp / C::W, half = warp % C::W;
    /* No early grid_dependents_launch: letting the next launch's blocks in
     * beside these cost 1 us at T = 8 on the H200 (3.63 -> 4.70 us); the
     * grid lets go as its blocks exit. */
    RowSlotCells cells;
    if (!row_slot_cells(a, t, cells)) {
        return; /* uniform: the block's row has no overlay */
    }
    const uint32_t n = cells.n;
    const uint16_t *rows = cells.rows;
    const uint32_t *ids = cells.ids;
    const uint32_t h = a.h;
    const uint16_t *x = ptr<const uint16_t>(a.hidden) + (size_t)t * h;
    const bool vectors = h % 8 == 0 && ((a.hidden | (uint64_t)(uintptr_t)rows) & 15u) == 0;
    const uint32_t first = half * (TOVL_DOT_LANES / C::W) + C::LANES * lane; /* this thread's first lane */
    /* Block-uniform: with W = 2 every warp reaches each barrier below. */
    for (uint32_t k0 = blockIdx.y * C::CELLS; k0 < n; k0 += gridDim.y * C::CELLS) {
        const uint32_t k = k0 + cell;
        float acc[C::LANES];
        TOVL_UNROLL
        for (uint32_t i = 0; i < C::LANES; i++) {
            acc[i] = 0.0f;
        }
        uint32_t id = UINT32_MAX;
        if (k < n) {
            id = ldg(ids + k); /* in flight with the cell's loads */
            lmhead_row_sums<C>(acc, x, rows + (size_t)k * h, h, vectors, first);
        }
        if constexpr (C::W == 2) {
            /* Stride 128: lane l (lower warp) + lane l + 128 (upper warp). */
            if (half == 1) {
                TOVL_UNROLL
                for (uint32_t i = 0; i < C::LANES; i++) {
                    upper[cell][C::LANES * lane + i] = acc[i];
                }
            }
            __syncthreads();
            if (half == 0) {
                TOVL_UNROLL
                for (uint32_t i = 0; i < C::LANES; i++) {
                    acc[i] = __fadd_rn(acc[i], upper[cell][C::LANES * lane + i]);
                }
            }
        }
        if (half == 0 && k < n) {
            const float v = lmhead_row_tree<C::LANES>(acc);
            if (lane == 0 && id < a.vocab) {
                store_logit<F32_LOGITS>(a, t, id, v);
            }
        }
        if constexpr (C::W == 2) {
            __syncthreads(); /* `upper` is read before the next cells write it */
        }
    }
}


/* _row4 and _row4q (decode batches): a block of four warps per row t and
 * ROWS of its overlay rows k0 .. k0 + ROWS - 1 (2 for _row4, 4 for _row4q),
 * in the spec's order. The block copies the hidden row and the overlay rows
 * into shared memory by cp.async, 16-byte copies that hold no registers
 * while they are in flight, a chunk of STAGE_ROUNDS 256-element rounds at a
 * time (h = 4096 in one), as JOBS groups of copies, each computed once it
 * has landed while the later ones are in flight; thread q takes the lanes 2q
 * and 2q + 1 of every round of every cell from there: one pair word of the
 * hidden row, unpacked once for the ROWS cells, and one of each overlay row,
 * so each lane's sum runs over increasing i, with no check against h in a
 * chunk that lies inside the row. Sharing the hidden row's words over the
 * cells is what pays: on the H200 (seeds 777 and 4242; docs/PERFORMANCE.md)
 * one cell a block took 2.28-2.31 / 2.95-3.12 / 4.50-4.73 / 7.53-7.73 us at
 * T = 8 / 16 / 32 / 64, two 2.01-2.09 / 2.62-2.75 / 3.71-3.72 / 6.28-6.37,
 * four 2.05-2.09 / 2.57-2.63 / 3.60-3.62 / 5.93-5.97; two cells a block of
 * eight warps, each thread one cell's lanes, no faster than one. An overlay
 * row past n is neither staged nor stored (its sums are garbage).
 * The trees: each cell's 256 sums through shared memory, then warp u runs
 * the trees of cells u, u + 4, ...: strides 128, 64, 32 in registers (thread
 * p holds lanes p + 32 i) and 16 .. 1 by shuffles.
 * Blocks past CUDA's y limit take k0 + ROWS gridDim.y, ... too; the hidden
 * row is staged once for them when it fits a chunk.
 * With four warps per cell that load their own lanes as 4-byte words
 * instead of staging, 2.93 / 3.57 / 5.58 us at T = 1 / 8 / 16; with 16-byte
 * loads into registers and the lane sums relayed warp to warp in round
 * order, 2.39 / 3.03 / 4.11 (docs/PERFORMANCE.md). */
template <uint32_t ROWS_, uint32_t BLOCKS_PER_SM_>
struct LmheadRow4Config {
    static constexpr uint32_t THREADS = TOVL_CUDA_LMHEAD_ROW4_THREADS;
    static constexpr uint32_t ROWS = ROWS_; /* overlay rows (cells) a block */
    static constexpr uint32_t CHUNK = TOVL_CUDA_LMHEAD_ROW4_STAGE_ROUNDS * TOVL_DOT_LANES; /* elements of a row */
    static constexpr uint32_t BLOCKS_PER_SM = BLOCKS_PER_SM_;
    static_assert(ROWS >= 1, "one overlay row at least");
    static_assert(THREADS * 2 == TOVL_DOT_LANES, "two of the spec's lanes a thread");
    static_assert(CHUNK / 8 % THREADS == 0, "every thread stages the same number of vectors");
    /* A job: one 16-byte vector of each row per thread, JOB_ROUNDS rounds of the chunk. */
    static constexpr uint32_t JOBS = CHUNK / 8 / THREADS, JOB_ROUNDS = CHUNK / TOVL_DOT_LANES / JOBS;
    static_assert(JOBS >= 1 && JOBS <= 8, "copy_async_wait_n counts up to 7 groups in flight");
};
using LmheadRow4 = LmheadRow4Config<TOVL_CUDA_LMHEAD_ROW4_ROWS, TOVL_CUDA_LMHEAD_ROW4_BLOCKS_PER_SM>;
using LmheadRow4Q = LmheadRow4Config<TOVL_CUDA_LMHEAD_ROW4Q_ROWS, TOVL_CUDA_LMHEAD_ROW4Q_BLOCKS_PER_SM>;

/* FEW: row4q_few of the gated pair, which computes only when no slot holds
 * more than F rows (launch_shape.h); otherwise the *_many tiles after it do. */
template <class C, bool F32_LOGITS, bool FEW = false>
__device__ void lmhead_overlay_row4(const tovl_lmhead_overlay_args &a) {
    constexpr uint32_t CHUNK = C::CHUNK, THREADS = C::THREADS, R = C::ROWS;
    struct alignas(16) Stage {
        uint16_t x[CHUNK], w[R][CHUNK];
        float sums[R][TOVL_DOT_LANES];
    };
    __shared__ Stage stage;
    const uint32_t t = blockIdx.x, q = threadIdx.x, warp = q / WARP, lane = lane_id();
    const uint32_t few = FEW ? lmhead_few_rows(a.T) : 0u; /* read ahead of the table cells */
    RowSlotCells cells;
    const bool has_rows = row_slot_cells<FEW>(a, t, cells, few);
    if (FEW && cells.live > few) {
        return; /* uniform: a slot holds more; the tiles compute */
    }
    if (!has_rows) {
        return; /* uniform: the block's row has no overlay */
    }
    const uint32_t n = cells.n;
    const uint32_t h = a.h;
    const uint16_t *rows = cells.rows;
    const uint32_t *ids = cells.ids;
    const uint16_t *x = ptr<const uint16_t>(a.hidden) + (size_t)t * h;
    const bool vectors = h % 8 == 0 && ((a.hidden | (uint64_t)(uintptr_t)rows) & 15u) == 0;
    const bool x_kept = h <= CHUNK; /* staged once for all the block's cells */
    /* Block-uniform: every thread reaches each barrier below. */
    for (uint32_t k0 = blockIdx.y * R; k0 < n; k0 += gridDim.y * R) {
        /* Cell c: overlay row k0 + c, when it exists (a row past n is not
         * staged; its sums are never stored). */
        const uint16_t *w[R];
        TOVL_UNROLL
        for (uint32_t c = 0; c < R; c++) {
            w[c] = rows + (size_t)(k0 + c) * h;
        }
        /* Warp u runs the trees of cells u, u + 4, ...; its lane 0 fetches their ids. */
        constexpr uint32_t WARPS = THREADS / WARP, TREES = (R + WARPS - 1) / WARPS;
        uint32_t id[TREES];
        TOVL_UNROLL
        for (uint32_t m = 0; m < TREES; m++) {
            const uint32_t c = warp + WARPS * m;
            id[m] = UINT32_MAX;
            if (lane == 0 && c < R && k0 + c < n) {
                id[m] = ldg(ids + k0 + c); /* in flight with the staging */
            }
        }
        float acc0[R], acc1[R];
        TOVL_UNROLL
        for (uint32_t c = 0; c < R; c++) {
            acc0[c] = acc1[c] = 0.0f;
        }
        for (uint32_t base = 0; base < h; base += CHUNK) {
            const bool stage_x = !x_kept || k0 == blockIdx.y * R;
            const bool whole = base + CHUNK <= h; /* no element of the chunk lies past h */
            /* Rounds [r0, r1) of the staged chunk into this thread's two lane sums of each cell. */
            const auto rounds = [&](uint32_t r0, uint32_t r1) {
                if (whole) {
                    TOVL_UNROLL
                    for (uint32_t r = r0; r < r1; r++) {
                        const uint32_t i = r * TOVL_DOT_LANES + 2 * q;
                        const uint32_t xp = *reinterpret_cast<const uint32_t *>(stage.x + i);
                        const float x0 = pair_lo(xp), x1 = pair_hi(xp);
                        TOVL_UNROLL
                        for (uint32_t c = 0; c < R; c++) {
                            const uint32_t wp = *reinterpret_cast<const uint32_t *>(stage.w[c] + i);
                            acc0[c] = __fadd_rn(acc0[c], __fmul_rn(x0, pair_lo(wp)));
                            acc1[c] = __fadd_rn(acc1[c], __fmul_rn(x1, pair_hi(wp)));
                        }
                    }
                    return;
                }
                TOVL_UNROLL
                for (uint32_t r = r0; r < r1; r++) {
                    const uint32_t i = r * TOVL_DOT_LANES + 2 * q, e = base + i;
                    const uint32_t xp = *reinterpret_cast<const uint32_t *>(stage.x + i);
                    const float x0 = pair_lo(xp), x1 = pair_hi(xp);
                    TOVL_UNROLL
                    for (uint32_t c = 0; c < R; c++) {
                        const uint32_t wp = *reinterpret_cast<const uint32_t *>(stage.w[c] + i);
                        if (e < h) {
                            acc0[c] = __fadd_rn(acc0[c], __fmul_rn(x0, pair_lo(wp)));
                        }
                        if (e + 1 < h) {
                            acc1[c] = __fadd_rn(acc1[c], __fmul_rn(x1, pair_hi(wp)));
                        }
                    }
                }
            };
            if (vectors) {
                /* Job j: this thread's 16-byte vector of each row in rounds
                 * j JOB_ROUNDS .. (j + 1) JOB_ROUNDS - 1, a cp.async group of
                 * its own. */
                TOVL_UNROLL
                for (uint32_t j = 0; j < C::JOBS; j++) {
                    const uint32_t i = 8 * (j * THREADS + q), e = base + i;
                    if (e < h) {
                        if (stage_x) {
                            copy16_async(stage.x + i, x + e);
                        }
                        TOVL_UNROLL
                        for (uint32_t c = 0; c < R; c++) {
                            if (c == 0 || k0 + c < n) {
                                copy16_async(stage.w[c] + i, w[c] + e);
                            }
                        }
                    }
                    copy_async_commit();
                }
                /* Each job's rounds once every thread's copies of it have landed. */
                TOVL_UNROLL
                for (uint32_t j = 0; j < C::JOBS; j++) {
                    copy_async_wait_n(C::JOBS - 1 - j);
                    __syncthreads();
                    rounds(j * C::JOB_ROUNDS, (j + 1) * C::JOB_ROUNDS);
                }
            } else {
                for (uint32_t i = q; i < CHUNK; i += THREADS) {
                    if (base + i < h) {
                        if (stage_x) {
                            stage.x[i] = ldg(x + base + i);
                        }
                        TOVL_UNROLL
                        for (uint32_t c = 0; c < R; c++) {
                            if (c == 0 || k0 + c < n) {
                                stage.w[c][i] = ldg(w[c] + base + i);
                            }
                        }
                    }
                }
                __syncthreads();
                rounds(0, CHUNK / TOVL_DOT_LANES);
            }
            __syncthreads(); /* the next chunk or cell stages over these */
        }
        TOVL_UNROLL
        for (uint32_t c = 0; c < R; c++) {
            stage.sums[c][2 * q] = acc0[c];
            stage.sums[c][2 * q + 1] = acc1[c];
        }
        __syncthreads();
        /* The next launch may start while the trees run (it waits for
         * this grid before it reads the logits): on the H200 (seed 777) 1.69
         * -> 1.59 us at T = 1, 2.64 -> 2.55 at 8, 3.51 -> 3.43 at 16. Once the
         * rows have landed instead: 1.77 / 2.86 / 3.50 (docs/PERFORMANCE.md). */
        grid_dependents_launch();
        TOVL_UNROLL
        for (uint32_t m = 0; m < TREES; m++) {
            const uint32_t c = warp + WARPS * m;
            if (c >= R || k0 + c >= n) {
                break; /* uniform over the warp */
            }
            float v[TOVL_DOT_LANES / WARP];
            TOVL_UNROLL
            for (uint32_t i = 0; i < TOVL_DOT_LANES / WARP; i++) {
                v[i] = stage.sums[c][lane + WARP * i];
            }
            TOVL_UNROLL
            for (uint32_t stride = TOVL_DOT_LANES / WARP / 2; stride >= 1; stride /= 2) {
                TOVL_UNROLL
                for (uint32_t i = 0; i < stride; i++) {
                    v[i] = __fadd_rn(v[i], v[i + stride]);
                }
            }
            TOVL_UNROLL
            for (uint32_t d = WARP / 2; d >= 1; d /= 2) {
                v[0] = __fadd_rn(v[0], __shfl_down_sync(FULL_MASK, v[0], d));
            }
            if (lane == 0 && id[m] < a.vocab) {
                store_logit<F32_LOGITS>(a, t, id[m], v[0]);
            }
        }
        /* `sums` is written again only after the next cell's first barrier,
         * which the tree warps reach once they have read it. */
    }
}

} // namespace tovl_cuda

/* An extern "C" kernel `name` running `kernel<config, f32>`, with launch
 * bounds of config's threads and blocks per SM. */
#define TOVL_CUDA_LMHEAD_ROW_ENTRY(name, kernel, config, f32)                                              \
    TOVL_CUDA_KERNEL void __launch_bounds__(config::THREADS, config::BLOCKS_PER_SM)                           \
        name(tovl_lmhead_overlay_args args) {                                                              \
        tovl_cuda::kernel<config, f32>(args);                                                              \
    }

TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_bf16_row, lmhead_overlay_row, tovl_cuda::LmheadRow, false)
TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_f32_row, lmhead_overlay_row, tovl_cuda::LmheadRow, true)
TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_bf16_row2, lmhead_overlay_row, tovl_cuda::LmheadRow2, false)
TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_f32_row2, lmhead_overlay_row, tovl_cuda::LmheadRow2, true)
TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_bf16_row4, lmhead_overlay_row4, tovl_cuda::LmheadRow4, false)
TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_f32_row4, lmhead_overlay_row4, tovl_cuda::LmheadRow4, true)
TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_bf16_row4q, lmhead_overlay_row4, tovl_cuda::LmheadRow4Q, false)
TOVL_CUDA_LMHEAD_ROW_ENTRY(lmhead_overlay_f32_row4q, lmhead_overlay_row4, tovl_cuda::LmheadRow4Q, true)

/* row4q_few (the gated pair, launch_shape.h). */
#define TOVL_CUDA_LMHEAD_ROW_FEW_ENTRY(name, config, f32)                                                 \
    TOVL_CUDA_KERNEL void __launch_bounds__(config::THREADS, config::BLOCKS_PER_SM)                           \
        name(tovl_lmhead_overlay_args args) {                                                              \
        tovl_cuda::lmhead_overlay_row4<config, f32, true>(args);                                           \
    }

TOVL_CUDA_LMHEAD_ROW_FEW_ENTRY(lmhead_overlay_bf16_row4q_few, tovl_cuda::LmheadRow4Q, false)
TOVL_CUDA_LMHEAD_ROW_FEW_ENTRY(lmhead_overlay_f32_row4q_few, tovl_cuda::LmheadRow4Q, true)

#endif /* TOVL_CUDA_KERNELS_LMHEAD_ROW_CUH */
