/*
 * lmhead_overlay_{bf16,f32}: for row t with slot s valid and k < n[s] (and
 * < max_n), with id = ids[s][k] < vocab:
 *     logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :])
 * in the spec's fixed order, stored as f32 (canonical NaN) or bf16 (RNE).
 *
 * Work. Block (x, y) computes one tile: a group of BM rows of one slot s (in
 * increasing t) times overlay rows [y * BN, +BN) of s. Every block counts the
 * rows of each slot (a pass over the row slots) and takes the x-th of the
 * groups of the slots that have overlay rows in column y; then it collects its
 * group's rows with a ballot scan. The grid has room for more groups than a
 * batch has (it is sized before the row slots are known); the large variant's
 * blocks take their (x, y) from their place in launch order, y fastest
 * (lmhead_place), so that every tile that exists is launched before any idle
 * block. A block also does columns y + gridDim.y, ...: beyond CUDA's y
 * limit, and where the host halves the columns so that a block's pick and
 * row collection serve two tiles (cuda_geometry.c).
 *
 * The dot order. The 256 threads are two groups of 128, each computing BM x TN
 * cells (group G takes overlay rows G * TN .. + TN of the tile). Thread q of a
 * group holds the spec's lanes 2q and 2q + 1 of each of its cells. A chunk is
 * 256 elements staged as bf16 pairs in shared memory (word p = elements 2p,
 * 2p + 1); thread q reads word q, i.e. elements 2q and 2q + 1 of the chunk,
 * which are exactly its lanes' next elements, so each lane's sum runs in
 * increasing i. Products and sums are __fmul_rn / __fadd_rn, rounded to
 * nearest even, with one exception that gives the same bits: where a range
 * check over the tile's operands proves every product exact in f32, a tile's
 * whole chunks take one fma per product and sum (LmheadRange), and a tile
 * that fails the check is redone unfused. Elements past h are skipped, not
 * multiplied by zero (0 * Inf is NaN, and -0 + +0 is +0). The tree (strides 128 .. 1) is
 * done after the loop through shared memory, a round of cells at a time: each
 * warp finishes four cells exactly as the spec pairs the lanes (strides 128,
 * 64, 32 in each thread, 16 and 8 as a reduce-scatter over the four cells,
 * 4, 2, 1 by shuffles), and their ids are fetched while the first chunks load.
 *
 * Staging. Operands stay bf16 in shared memory (4 (TM + TN) bytes of shared
 * traffic per 2 TM TN multiply-adds: 0.75 byte per MAC for 8 x 4 cells) in a
 * ring of STAGES chunks filled by cp.async (sm_80 and newer): global to shared
 * without passing through registers, so STAGES - 1 chunks are in flight while
 * one is computed, one barrier per chunk, and the registers stay free for the
 * accumulators and for the products in flight (with the staged vectors in
 * registers, ptxas ran out and chained every product to its sum).
 * The fused loop stages by cp.async alone, an absent row as a copy of a row
 * of the tile; elsewhere rows that are absent, past h, or not 16-byte aligned
 * are staged by plain stores instead.
 */
#ifndef TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH
#define TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH

#include "common.cuh"

/* The device's SM count, written by the host when it loads this port's
 * module (cuda_backend.c); 0 until then, and in the emulator, which launches
 * without programmatic dependent launch. */
#if defined(TOVL_CUDA_EMU)
static uint32_t tovl_cuda_sm_count = 0; /* the emulated device's (emu_kernels.cpp) */
#else
extern "C" {
__constant__ uint32_t tovl_cuda_sm_count = 0;
}
#endif

namespace tovl_cuda {

__device__ __forceinline__ uint32_t lmhead_sm_count() {
    return tovl_cuda_sm_count;
}
/* Tile counts saturate here (lmhead_pick): only their comparison with the SM
 * count matters. */
constexpr uint32_t LMHEAD_TILES_CAP = 1u << 26;

template <int TM_, int TN_, int STAGES_, int MIN_BLOCKS_, bool TILES_FIRST_>
struct LmheadConfig {
    static constexpr uint32_t MIN_BLOCKS = MIN_BLOCKS_; /* __launch_bounds__: blocks resident per SM */
    static constexpr bool TILES_FIRST = TILES_FIRST_;   /* block order: lmhead_place */
    /* Whether a block lets the next kernel launch early only once the grid's
     * tiles outnumber the SMs (lmhead_overlay): where blocks share SMs. */
    static constexpr bool TRIGGER_WHEN_FULL = MIN_BLOCKS_ > 1;
    /* The chunk loop fuses each product into its sum where the range check
     * proves that exact (LmheadRange). */
    static constexpr bool FUSE = TOVL_CUDA_LMHEAD_FUSE != 0;
    static constexpr uint32_t TM = TM_, TN = TN_, STAGES = STAGES_;
    static constexpr uint32_t THREADS = TOVL_CUDA_LMHEAD_THREADS, GROUP = THREADS / 2;
    static constexpr uint32_t WARPS = THREADS / WARP;
    static constexpr uint32_t BM = TM, BN = 2 * TN;
    static constexpr uint32_t CHUNK = TOVL_DOT_LANES;     /* elements per row per chunk */
    static constexpr uint32_t WORDS = CHUNK / 2;          /* bf16 pairs per row per chunk */
    static constexpr uint32_t ROW_VECS = WORDS / 4;       /* 16-byte vectors per row per chunk */
    static constexpr uint32_t X_VECS = BM * ROW_VECS, W_VECS = BN * ROW_VECS;
    /* Vectors each thread stages per chunk: the first X_JOBS of hidden rows.
     * With BN * ROW_VECS not a multiple of THREADS (TN = 2) the last job
     * exists only in the first threads (lmhead_stage skips it elsewhere). */
    static constexpr uint32_t X_JOBS = X_VECS / THREADS, JOBS = (X_VECS + W_VECS + THREADS - 1) / THREADS;
    static constexpr bool RAGGED_JOBS = (X_VECS + W_VECS) % THREADS != 0;
    static constexpr uint32_t CELLS = TM * TN;                    /* per group */
    static constexpr uint32_t ROUND = 16;                         /* cells per group per full tree round */
    static constexpr uint32_t LAST_ROUND = CELLS % ROUND;         /* a partial round after the full ones */
    static_assert(THREADS == 256 && GROUP == 128 && WORDS == GROUP, "thread q of a group holds lanes 2q, 2q + 1");
    static_assert(X_VECS % THREADS == 0, "hidden-row staging jobs divide evenly");
    static_assert(2 * ROUND == 4 * WARPS, "a full tree round is four cells per warp");
    static_assert(CELLS >= ROUND && LAST_ROUND % 2 == 0, "cells pair up in every round");
    static_assert(STAGES >= 2, "one chunk computed while the next lands");
    static_assert(BM == TOVL_CUDA_LMHEAD_BM, "one row-group height for every variant (the grid's x)");
};

using LmheadLarge = LmheadConfig<TOVL_CUDA_LMHEAD_BM, TOVL_CUDA_LMHEAD_LARGE_TN, TOVL_CUDA_LMHEAD_LARGE_STAGES,
                                 TOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS, true>;
using LmheadSmall = LmheadConfig<TOVL_CUDA_LMHEAD_BM, TOVL_CUDA_LMHEAD_SMALL_TN, TOVL_CUDA_LMHEAD_SMALL_STAGES,
                                 TOVL_CUDA_LMHEAD_SMALL_MIN_BLOCKS, false>;
static_assert(LmheadLarge::BN == TOVL_CUDA_LMHEAD_LARGE_BN && LmheadSmall::BN == TOVL_CUDA_LMHEAD_SMALL_BN, "shape");

/* One block's shared memory, reused by its three phases. 16-byte aligned:
 * the staging area takes 16-byte stores (a union of u32 arrays alone is only
 * 4-byte aligned, and the emulator places it among other statics). */
template <class C>
union alignas(16) LmheadShared {
    struct {
        uint32_t x[C::STAGES][C::BM][C::WORDS]; /* [ring slot][tile row][pair word] */
        uint32_t w[C::STAGES][C::BN][C::WORDS];
    } stage;
    struct {
        uint32_t count[WARP]; /* rows per slot of the window */
        uint32_t pick[4];     /* found, slot, group; the window's groups */
        uint64_t rows, ids;   /* the picked slot's table cells */
        uint32_t n;
        uint32_t fills;       /* the grid's tiles so far outnumber the SMs */
        uint32_t live;        /* some slot of the window has rows in the block's column */
    } pick;
    struct {
        uint32_t warp_count[C::WARPS];
        uint32_t rows[C::BM];
    } scan;
    struct {
        float2 lanes[2][C::ROUND / 2][TOVL_DOT_LANES]; /* [group][pair of cells of the round][lane] */
        uint32_t rows[C::BM];
    } tree;
};

/* Overlay rows of slot s the kernel computes: n[s], at most max_n. */
__device__ __forceinline__ uint32_t lmhead_rows_of(const tovl_lmhead_overlay_args &a, uint32_t s) {
    return min_of(ldg(ptr<const uint32_t>(a.n_table) + s), a.max_n);
}

/* The gated pair (launch_shape.h, TOVL_CUDA_LMHEAD_FEW_ROWS): F at this
 * batch, the most rows a slot may hold for row4q_few to compute. */
__device__ __forceinline__ uint32_t lmhead_few_rows(uint32_t T) {
    return TOVL_CUDA_LMHEAD_FEW_ROWS(T, lmhead_sm_count());
}

/* L: the most rows any slot holds (lmhead_rows_of), in every lane; `first`
 * is this lane's slot's count (slot lane) where the caller has it already.
 * Every lane of the warp calls it. */
__device__ __forceinline__ uint32_t lmhead_live_rows(const tovl_lmhead_overlay_args &a, uint32_t first) {
    uint32_t live = first;
    for (uint32_t s = lane_id() + WARP; s < a.max_loras; s += WARP) {
        live = max_of(live, lmhead_rows_of(a, s));
    }
    TOVL_UNROLL
    for (uint32_t d = WARP / 2; d >= 1; d /= 2) {
        live = max_of(live, __shfl_xor_sync(FULL_MASK, live, d));
    }
    return live;
}
__device__ __forceinline__ uint32_t lmhead_live_rows(const tovl_lmhead_overlay_args &a) {
    return lmhead_live_rows(a, lane_id() < a.max_loras ? lmhead_rows_of(a, lane_id()) : 0u);
}

/* The table cells of the slot a block works on: overlay rows, their ids,
 * and how many the kernel computes (lmhead_rows_of). */
struct LmheadSlot {
    const uint16_t *rows;
    const uint32_t *ids;
    uint32_t n;
};

/* Rows g * BM .. + BM of slot s, in increasing t, into sh.scan.rows; returns
 * how many there are (0..BM). Stops scanning once the group is complete. */
template <class C>
__device__ uint32_t lmhead_find_rows(LmheadShared<C> &sh, const tovl_lmhead_overlay_args &a, uint32_t s,
                                     uint32_t g) {
    const uint32_t tid = threadIdx.x, lane = lane_id(), warp = tid / WARP;
    const uint64_t first = (uint64_t)g * C::BM;
    uint64_t found = 0; /* rows of slot s before this pass; the same in every thread */
    for (uint64_t base = 0; base < a.T && found < first + C::BM; base += C::THREADS) {
        const uint64_t t = base + tid;
        const bool mine = t < a.T && row_slot(a.row_slots, a.active_slot, (uint32_t)t) == (int32_t)s;
        const unsigned votes = __ballot_sync(FULL_MASK, mine);
        if (lane == 0) {
            sh.scan.warp_count[warp] = (uint32_t)__popc(votes);
        }
        __syncthreads();
        uint32_t before = 0, total = 0;
        for (uint32_t w = 0; w < C::WARPS; w++) {
            const uint32_t c = sh.scan.warp_count[w];
            before += w < warp ? c : 0u;
            total += c;
        }
        const uint64_t rank = found + before + (uint32_t)__popc(votes & lanes_below(lane));
        if (mine && rank >= first && rank < first + C::BM) {
            sh.scan.rows[rank - first] = (uint32_t)t;
        }
        found += total;
        __syncthreads(); /* warp_count is rewritten by the next pass */
    }
    return found > first ? (uint32_t)min_of<uint64_t>(found - first, C::BM) : 0u;
}

/* Starts staging chunk c into ring slot buf: this thread's vectors, by
 * cp.async where the row is 16-byte aligned (vectors) and the vector lies
 * within h, else by a plain store (zero for an absent row or past h). */
template <class C>
__device__ __forceinline__ void lmhead_stage(LmheadShared<C> &sh, const uint16_t *const (&src)[C::JOBS], uint32_t c,
                                             uint32_t buf, uint32_t h, bool vectors) {
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::JOBS; j++) {
        const uint32_t v = threadIdx.x + j * C::THREADS, col = 4 * (v % C::ROW_VECS);
        if (C::RAGGED_JOBS && v >= C::X_VECS + C::W_VECS) {
            continue; /* past the tile's last overlay row */
        }
        const uint32_t e = c * C::CHUNK + 2 * col;
        uint32_t *dst = j < C::X_JOBS ? &sh.stage.x[buf][v / C::ROW_VECS][col]
                                      : &sh.stage.w[buf][(v - C::X_VECS) / C::ROW_VECS][col];
        if (src[j] && vectors && e + 8 <= h) {
            copy16_async(dst, src[j] + e);
        } else {
            store16(dst, src[j] ? load8_bf16(src[j], e, h, vectors) : uint4{0, 0, 0, 0});
        }
    }
}

/* Lane 2q + HALF of every cell: the product of the element HALF of each
 * hidden-row word and each overlay-row word, added to that lane's sum. Each
 * round of products is formed before it is added, so that ptxas has them in
 * flight together rather than chaining each product to its sum. FUSED: one
 * correctly rounded fma per product and sum instead, which gives the spec's
 * bits wherever every product is exact in f32 (LmheadRange establishes that
 * for the tile before its cells are kept). */
template <class C, uint32_t HALF, bool FUSED>
__device__ __forceinline__ void lmhead_lane(const uint32_t (&xp)[C::TM], const uint32_t (&wp)[C::TN],
                                            float (&acc)[C::TM][C::TN][2]) {
    float w[C::TN];
    TOVL_UNROLL
    for (uint32_t n = 0; n < C::TN; n++) {
        w[n] = HALF ? pair_hi(wp[n]) : pair_lo(wp[n]);
    }
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        const float x = HALF ? pair_hi(xp[m]) : pair_lo(xp[m]);
        if constexpr (FUSED) {
            TOVL_UNROLL
            for (uint32_t n = 0; n < C::TN; n++) {
                acc[m][n][HALF] = __fmaf_rn(x, w[n], acc[m][n][HALF]);
            }
        } else {
            float prod[C::TN];
            TOVL_UNROLL
            for (uint32_t n = 0; n < C::TN; n++) {
                prod[n] = __fmul_rn(x, w[n]);
            }
            TOVL_UNROLL
            for (uint32_t n = 0; n < C::TN; n++) {
                acc[m][n][HALF] = __fadd_rn(acc[m][n][HALF], prod[n]);
            }
        }
    }
}

/* The range check of the fused loop. Over the words a thread reads it keeps
 * the largest bf16 magnitude and the smallest nonzero one of the hidden rows
 * and of the overlay rows (per 16-bit half: __vimax3_u16x2, and the
 * magnitude minus one through __viaddmin_u16x2, so that zero wraps to the top
 * and drops out). Where both sides' nonzero elements are normal with biased
 * exponents summing to at least 128 (products >= 2^-126) and the largest to
 * at most 380 (products < 2^128), every product of this thread's lanes is
 * exact in f32 (two 8-bit significands): fma(x, w, p) then rounds p + x w once,
 * as the spec's sum of the rounded product does, and so does a zero product.
 * A subnormal, Inf or NaN fails, and the tile is redone unfused. */
struct LmheadRange {
    uint32_t x_max = 0, x_min1 = ~0u, w_max = 0, w_min1 = ~0u;
    __device__ __forceinline__ static void add(uint32_t &max, uint32_t &min1, uint32_t a, uint32_t b) {
        a &= 0x7FFF7FFFu;
        b &= 0x7FFF7FFFu;
        max = __vimax3_u16x2(max, a, b);
        min1 = __viaddmin_u16x2(a, 0xFFFFFFFFu, min1);
        min1 = __viaddmin_u16x2(b, 0xFFFFFFFFu, min1);
    }
    __device__ __forceinline__ void add_x(uint32_t a, uint32_t b) {
        add(x_max, x_min1, a, b);
    }
    __device__ __forceinline__ void add_w(uint32_t a, uint32_t b) {
        add(w_max, w_min1, a, b);
    }
    /* The other thread's hidden-row bounds joined to these. */
    __device__ __forceinline__ void join_x(uint32_t max, uint32_t min1) {
        x_max = __vimax3_u16x2(x_max, max, 0u);
        x_min1 = __viaddmin_u16x2(x_min1, 0u, min1);
    }
    __device__ __forceinline__ bool ok() const {
        const uint32_t x_lo = min_of(x_min1 & 0xFFFFu, x_min1 >> 16) + 1u;
        const uint32_t w_lo = min_of(w_min1 & 0xFFFFu, w_min1 >> 16) + 1u;
        if (x_lo > 0xFFFFu || w_lo > 0xFFFFu) {
            return true; /* one side is all zeros: so is every product */
        }
        const uint32_t x_hi = max_of(x_max & 0xFFFFu, x_max >> 16), w_hi = max_of(w_max & 0xFFFFu, w_max >> 16);
        const uint32_t ex_lo = x_lo >> 7, ew_lo = w_lo >> 7, ex_hi = x_hi >> 7, ew_hi = w_hi >> 7;
        return ex_lo >= 1u && ew_lo >= 1u && ex_hi <= 254u && ew_hi <= 254u && ex_lo + ew_lo >= 128u &&
               ex_hi + ew_hi <= 380u;
    }
};

/* One chunk: each of this thread's lanes adds its element's product.
 * PARTIAL: only the first `valid` elements of the chunk exist (never fused).
 * FUSED: fma, and the overlay-row words this thread reads go into `range`,
 * with its hidden-row words of rows XLO .. XHI - 1. */
template <class C, bool PARTIAL, bool FUSED = false, uint32_t XLO = 0, uint32_t XHI = C::TM>
__device__ __forceinline__ void lmhead_accumulate(const LmheadShared<C> &sh, float (&acc)[C::TM][C::TN][2],
                                                  uint32_t buf, uint32_t group, uint32_t q, uint32_t valid,
                                                  LmheadRange *range = nullptr) {
    const uint32_t e = 2 * q;
    uint32_t xp[C::TM], wp[C::TN];
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        xp[m] = sh.stage.x[buf][m][q];
    }
    TOVL_UNROLL
    for (uint32_t n = 0; n < C::TN; n++) {
        wp[n] = sh.stage.w[buf][group * C::TN + n][q];
    }
    if constexpr (FUSED && !PARTIAL) {
        static_assert(C::TM % 2 == 0 && C::TN % 2 == 0, "the range check takes words in pairs");
        if constexpr (XHI > XLO) {
            TOVL_UNROLL
            for (uint32_t m = XLO; m < XHI; m += 2) {
                range->add_x(xp[m], xp[m + 1]);
            }
        }
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::TN; n += 2) {
            range->add_w(wp[n], wp[n + 1]);
        }
        lmhead_lane<C, 0, true>(xp, wp, acc);
        lmhead_lane<C, 1, true>(xp, wp, acc);
    } else {
        if (!PARTIAL || e < valid) {
            lmhead_lane<C, 0, false>(xp, wp, acc);
        }
        if (!PARTIAL || e + 1 < valid) {
            lmhead_lane<C, 1, false>(xp, wp, acc);
        }
    }
}

/* The spec's tree over a cell's 256 lane sums, in two steps. Lane j of the
 * warp holds lanes j + 32u (u = 0..7) of the cell (member `which` of the
 * pairs p[u]); strides 128, 64, 32 pair u with u + 4, 2, 1 in the thread.
 * What is left is lane j's sum of the 32 lanes that strides 16 .. 1 reduce. */
__device__ __forceinline__ float lmhead_tree_in_thread(const float2 (&p)[8], uint32_t which) {
    float r[8];
    TOVL_UNROLL
    for (uint32_t u = 0; u < 8; u++) {
        r[u] = which ? p[u].y : p[u].x;
    }
    TOVL_UNROLL
    for (uint32_t stride = 4; stride >= 1; stride /= 2) {
        TOVL_UNROLL
        for (uint32_t u = 0; u < stride; u++) {
            r[u] = __fadd_rn(r[u], r[u + stride]);
        }
    }
    return r[0];
}

/* Strides 16 .. 1 of four cells at once: v[c] is lane j's value of cell c.
 * Stride 16 leaves cells 0, 1 to lanes 0..15 and cells 2, 3 to lanes 16..31
 * (each adds the value it gets to its own, lower lane first, as the spec
 * writes p[l] + p[l + 16]); stride 8 leaves one cell to each 8 lanes; strides
 * 4, 2, 1 then run within the 8. The result of cell (lane / 8) is in v[0] on
 * lanes 0, 8, 16, 24; returns that cell number. */
__device__ __forceinline__ uint32_t lmhead_tree_across_warp(float (&v)[4], uint32_t lane) {
    const bool upper16 = (lane & 16u) != 0, upper8 = (lane & 8u) != 0;
    TOVL_UNROLL
    for (uint32_t i = 0; i < 2; i++) {
        const float mine = upper16 ? v[2 + i] : v[i];
        const float theirs = __shfl_xor_sync(FULL_MASK, upper16 ? v[i] : v[2 + i], 16);
        v[i] = upper16 ? __fadd_rn(theirs, mine) : __fadd_rn(mine, theirs);
    }
    {
        const float mine = upper8 ? v[1] : v[0];
        const float theirs = __shfl_xor_sync(FULL_MASK, upper8 ? v[0] : v[1], 8);
        v[0] = upper8 ? __fadd_rn(theirs, mine) : __fadd_rn(mine, theirs);
    }
    TOVL_UNROLL
    for (uint32_t stride = 4; stride >= 1; stride /= 2) {
        v[0] = __fadd_rn(v[0], __shfl_down_sync(FULL_MASK, v[0], stride));
    }
    return lane / 8;
}

/* One round of the tree: cells r0 .. r0 + R of each group. Every thread
 * writes its two lanes of those cells, then R / 2 warps finish four cells
 * each (R = ROUND: every warp; the last round of a tile whose cells are not a
 * multiple of ROUND has fewer) and store them. */
template <class C, bool F32_LOGITS, uint32_t R>
__device__ __forceinline__ void lmhead_tree_round(LmheadShared<C> &sh, const float (&acc)[C::TM][C::TN][2],
                                                  const uint32_t (&tile_ids)[C::BN],
                                                  const tovl_lmhead_overlay_args &a, uint32_t r0, uint32_t k0,
                                                  uint32_t k_end) {
    static_assert(R % 2 == 0 && R <= C::ROUND, "a round is pairs of cells, at most a full round");
    constexpr uint32_t PAIRS = R / 2, USED_WARPS = R / 2; /* pairs per group; warps that finish cells */
    const uint32_t tid = threadIdx.x, group = tid / C::GROUP, q = tid % C::GROUP;
    const uint32_t lane = lane_id(), warp = tid / WARP;
    /* Cells 2p and 2p + 1 of the round share an entry per lane, so this
     * thread's lanes 2q, 2q + 1 of both are one 16-byte store. */
    TOVL_UNROLL
    for (uint32_t i = 0; i < R; i += 2) {
        const uint32_t c0 = r0 + i, c1 = c0 + 1;
        const float(&e)[2] = acc[c0 / C::TN][c0 % C::TN], (&o)[2] = acc[c1 / C::TN][c1 % C::TN];
        store16(&sh.tree.lanes[group][i / 2][2 * q],
                uint4{__float_as_uint(e[0]), __float_as_uint(o[0]), __float_as_uint(e[1]), __float_as_uint(o[1])});
    }
    __syncthreads();
    if (warp >= USED_WARPS) {
        return; /* uniform per warp: a partial round needs fewer warps */
    }
    /* Warp w takes the pairs w and w + USED_WARPS: cells 0..3 below. */
    float v[4];
    TOVL_UNROLL
    for (uint32_t half = 0; half < 2; half++) {
        const uint32_t pair = warp + half * USED_WARPS, g = pair / PAIRS, pi = pair % PAIRS;
        float2 p[8];
        TOVL_UNROLL
        for (uint32_t u = 0; u < 8; u++) {
            p[u] = sh.tree.lanes[g][pi][lane + WARP * u];
        }
        v[2 * half] = lmhead_tree_in_thread(p, 0);
        v[2 * half + 1] = lmhead_tree_in_thread(p, 1);
    }
    const uint32_t c = lmhead_tree_across_warp(v, lane); /* on lanes 0, 8, 16, 24: cell c */
    if (lane % 8 == 0) {
        const uint32_t pair = warp + (c / 2) * USED_WARPS, g = pair / PAIRS;
        const uint32_t cell = r0 + 2 * (pair % PAIRS) + c % 2;
        const uint32_t m = cell / C::TN, k = k0 + g * C::TN + cell % C::TN, t = sh.tree.rows[m];
        if (t != UINT32_MAX && k < k_end) {
            const uint32_t id = tile_ids[k - k0];
            if (id < a.vocab) {
                store_logit<F32_LOGITS>(a, t, id, v[0]);
            }
        }
    }
}

/* How a loop stages: by cp.async alone (every row present or stood in for,
 * h a multiple of the chunk), or by lmhead_stage. */
template <bool FAST>
struct LmheadStaging {
    static constexpr bool value = FAST;
};

/* Where job j of this thread stages in ring slot 0 (slot b: + b * slot_words(j)). */
template <class C>
__device__ __forceinline__ uint32_t *lmhead_stage_dst(LmheadShared<C> &sh, uint32_t j) {
    const uint32_t v = threadIdx.x + j * C::THREADS, col = 4 * (v % C::ROW_VECS);
    return j < C::X_JOBS ? &sh.stage.x[0][v / C::ROW_VECS][col] : &sh.stage.w[0][(v - C::X_VECS) / C::ROW_VECS][col];
}
template <class C>
__device__ __forceinline__ constexpr uint32_t lmhead_slot_words(uint32_t j) {
    return j < C::X_JOBS ? C::BM * C::WORDS : C::BN * C::WORDS;
}

/* A number known at compile time (a ring slot, a row bound). */
template <uint32_t B>
struct LmheadIndex {
    static constexpr uint32_t value = B;
};
/* Chunks c0 + B .. c0 + STAGES - 1 (those below n) of a loop unrolled by the
 * ring's length, so that every chunk's ring slots are constants: shared
 * addresses become immediates, about 12 instructions a chunk fewer than a
 * slot computed as c % STAGES. False once n is reached. */
template <uint32_t B, uint32_t STAGES, class Step>
__device__ __forceinline__ bool lmhead_ring_steps(uint32_t c0, uint32_t n, Step &step) {
    if constexpr (B == STAGES) {
        return true;
    } else {
        if (c0 + B >= n) {
            return false;
        }
        step(LmheadIndex<B>{}, c0 + B);
        return lmhead_ring_steps<B + 1, STAGES>(c0, n, step);
    }
}

/* One tile: the rows x_src points at (null: no row) x overlay rows
 * [k0, k_end) of slot s. Every thread calls it. `inexact`: a word of shared
 * memory for the range check's vote, x_halves its exchange of hidden-row
 * bounds; `range`: this thread's bounds, the hidden rows' kept from the
 * block's first tile (x_fresh) for its later ones; x_any: a row of the
 * tile's group. */
template <class C, bool F32_LOGITS>
__device__ void lmhead_tile(LmheadShared<C> &sh, uint32_t (&tile_ids)[C::BN], uint32_t &inexact,
                            uint2 (&x_halves)[C::THREADS], LmheadRange &range, bool x_fresh,
                            const tovl_lmhead_overlay_args &a, const LmheadSlot &slot,
                            const uint16_t *const (&x_src)[C::X_JOBS], const uint16_t *x_any, uint32_t k0,
                            uint32_t k_end) {
    const uint32_t h = a.h, tid = threadIdx.x;
    const uint16_t *w_rows = slot.rows;
    const bool vectors = h % 8 == 0 && ((a.hidden | (uint64_t)(uintptr_t)w_rows) & 15u) == 0;
    /* src: each job's row, null where absent. The fused loop stages every
     * job by cp.async alone: an absent row as a copy of one of the tile's own
     * rows (no cell of it is stored, and the range check sees the same
     * values twice). */
    const uint16_t *src[C::JOBS], *src_any[C::JOBS];
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::JOBS; j++) {
        const uint32_t v = tid + j * C::THREADS;
        if (j < C::X_JOBS) {
            src[j] = x_src[j];
            src_any[j] = src[j] ? src[j] : x_any;
        } else {
            const uint32_t k = k0 + (v - C::X_VECS) / C::ROW_VECS;
            src[j] = k < k_end ? w_rows + (size_t)k * h : nullptr;
            src_any[j] = src[j] ? src[j] : w_rows + (size_t)k0 * h;
        }
    }
    const uint32_t group = tid / C::GROUP, q = tid % C::GROUP;
    float acc[C::TM][C::TN][2];
    const auto clear = [&]() {
        TOVL_UNROLL
        for (uint32_t m = 0; m < C::TM; m++) {
            TOVL_UNROLL
            for (uint32_t n = 0; n < C::TN; n++) {
                acc[m][n][0] = acc[m][n][1] = 0.0f;
            }
        }
    };

    /* The ring: chunk c lands in slot c % STAGES. Every thread commits one
     * cp.async group per chunk (empty past the end), so "all but the newest
     * STAGES - 2 groups are complete" means chunk c is. The loops stage only
     * whole chunks; a partial one (h % CHUNK != 0) is staged after them. */
    constexpr uint32_t STAGES = C::STAGES;
    const uint32_t chunks = (h + C::CHUNK - 1) / C::CHUNK, whole = h / C::CHUNK;
    /* Chunk c of every job into ring slot buf: FAST, by cp.async alone. */
    const auto stage = [&](auto fast, uint32_t c, uint32_t buf) {
        if constexpr (decltype(fast)::value) {
            TOVL_UNROLL
            for (uint32_t j = 0; j < C::JOBS; j++) {
                const uint32_t v = tid + j * C::THREADS;
                if (C::RAGGED_JOBS && v >= C::X_VECS + C::W_VECS) {
                    continue;
                }
                copy16_async(lmhead_stage_dst<C>(sh, j) + buf * lmhead_slot_words<C>(j),
                             src_any[j] + c * C::CHUNK + 8 * (v % C::ROW_VECS));
            }
        } else {
            lmhead_stage<C>(sh, src, c, buf, h, vectors);
        }
    };
    const auto prologue = [&](auto fast) {
        TOVL_UNROLL
        for (uint32_t c = 0; c + 1 < STAGES; c++) {
            if (c < whole) {
                stage(fast, c, c);
            }
            copy_async_commit();
        }
    };
    /* Chunk c: wait for it, free the slot of chunk c - 1 for chunk c + STAGES - 1. */
    const auto advance = [&](auto fast, uint32_t c, uint32_t next_buf) {
        copy_async_wait<STAGES - 2>(); /* this thread's part of chunk c is in place */
        __syncthreads();               /* everyone's is, and nobody reads chunk c - 1 */
        const uint32_t next = c + STAGES - 1;
        if (next < whole) {
            stage(fast, next, next_buf); /* the slot of chunk c - 1 */
        }
        copy_async_commit();
    };
    /* The whole chunks: body(buf) computes the chunk in ring slot buf. */
    const auto chunk_loop = [&](auto fast, auto &&body) {
        const auto step = [&](auto b, uint32_t c) {
            constexpr uint32_t B = decltype(b)::value;
            advance(fast, c, (B + STAGES - 1) % STAGES);
            body(B);
        };
        for (uint32_t c0 = 0; c0 < whole; c0 += STAGES) {
            if (!lmhead_ring_steps<0, STAGES>(c0, whole, step)) {
                break;
            }
        }
    };
    using Fast = LmheadStaging<true>;
    using Plain = LmheadStaging<false>;
    /* The whole chunks in the spec's order, once prologue(Plain{}) has run. */
    const auto whole_chunks_unfused = [&]() {
        chunk_loop(Plain{}, [&](uint32_t buf) { lmhead_accumulate<C, false>(sh, acc, buf, group, q, C::CHUNK); });
    };
    clear();
    if (tid == 0) {
        inexact = 0;
    }
    __syncthreads(); /* the shared memory is free (previous tile, row scan) */
    /* Fused while every word passes the range check; if one in the tile does
     * not, the tile starts over in the spec's unfused order. */
    const bool fused = C::FUSE && vectors;
    if (fused) {
        prologue(Fast{});
    } else {
        prologue(Plain{});
    }
    /* The tile's ids, for the stores after the loop: fetched while the first
     * chunks are in flight rather than after the tree. */
    if (tid < C::BN) {
        tile_ids[tid] = k0 + tid < k_end ? ldg(slot.ids + k0 + tid) : UINT32_MAX;
    }
    if (fused) {
        /* The range check's hidden-row bounds: group 0 takes rows 0 .. TM/2
         * - 1 of the words its threads read, group 1 the rest, and each
         * thread then joins its partner's (the same words of the other rows);
         * a block's later columns keep them (the same rows). */
        range.w_max = 0;
        range.w_min1 = ~0u;
        if (x_fresh) {
            range.x_max = 0;
            range.x_min1 = ~0u;
        }
        const auto fused_chunks = [&](auto x_lo, auto x_hi) {
            constexpr uint32_t LO = decltype(x_lo)::value, HI = decltype(x_hi)::value;
            chunk_loop(Fast{}, [&](uint32_t buf) {
                lmhead_accumulate<C, false, true, LO, HI>(sh, acc, buf, group, q, C::CHUNK, &range);
            });
        };
        if (!x_fresh) {
            fused_chunks(LmheadIndex<0>{}, LmheadIndex<0>{});
        } else if (group == 0) { /* uniform per warp */
            fused_chunks(LmheadIndex<0>{}, LmheadIndex<C::TM / 2>{});
        } else {
            fused_chunks(LmheadIndex<C::TM / 2>{}, LmheadIndex<C::TM>{});
        }
        if (x_fresh) {
            x_halves[tid] = uint2{range.x_max, range.x_min1};
            __syncthreads();
            const uint2 other = x_halves[tid ^ C::GROUP];
            range.join_x(other.x, other.y);
        }
        if (!range.ok()) {
            inexact = 1;
        }
        __syncthreads();
        if (inexact) { /* uniform */
            copy_async_wait<0>();
            __syncthreads(); /* the ring is free */
            clear();
            prologue(Plain{});
            whole_chunks_unfused();
        }
    } else {
        whole_chunks_unfused();
    }
    if (whole < chunks) {
        /* Its slot was last read for chunk whole - STAGES, before the last
         * loop barrier. */
        lmhead_stage<C>(sh, src, whole, whole % STAGES, h, vectors);
        copy_async_commit();
        copy_async_wait<0>();
        __syncthreads();
        lmhead_accumulate<C, true>(sh, acc, whole % STAGES, group, q, h - whole * C::CHUNK);
    }
    copy_async_wait<0>(); /* nothing is in flight (only empty groups are left) */
    __syncthreads();      /* the tree reuses the staging memory */

    /* The tree, ROUND cells of each group at a time: every thread writes its
     * two lanes of those cells, then each warp finishes four cells. */
    /* The threads that stage a row's first vector tell its t (no register
     * holds the row numbers through the loop). */
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::X_JOBS; j++) {
        const uint32_t v = tid + j * C::THREADS;
        if (v % C::ROW_VECS == 0) {
            const uint16_t *hidden = ptr<const uint16_t>(a.hidden);
            sh.tree.rows[v / C::ROW_VECS] = src[j] ? (uint32_t)((size_t)(src[j] - hidden) / h) : UINT32_MAX;
        }
    }
    TOVL_UNROLL
    for (uint32_t r0 = 0; r0 + C::ROUND <= C::CELLS; r0 += C::ROUND) {
        if (r0 > 0) {
            __syncthreads(); /* the previous round's lanes are read */
        }
        lmhead_tree_round<C, F32_LOGITS, C::ROUND>(sh, acc, tile_ids, a, r0, k0, k_end);
    }
    if constexpr (C::LAST_ROUND > 0) {
        __syncthreads();
        lmhead_tree_round<C, F32_LOGITS, C::LAST_ROUND>(sh, acc, tile_ids, a, C::CELLS - C::LAST_ROUND, k0, k_end);
    }
}

/* A block's (x, y). In blockIdx order the idle blocks (x past the batch's
 * groups) are interleaved with the tiles, and once the blocks outnumber the
 * SMs tiles share SMs while idle blocks hold others: the large variant's
 * blocks take (x, y) from their place in launch order (blockIdx.x fastest)
 * with y fastest instead, so that the groups that exist (small x) come first.
 * On the H200 that took T = 96 from 12.4 to 8.5 us with the large tiles, and
 * T = 512 from 24.7 to 24.6. The small variant keeps blockIdx order: it runs
 * only grids with a block per SM (cuda_geometry.c), where tiles-first order
 * cost 0.15 us at T = 32 and 64 (docs/PERFORMANCE.md, Lm_head tiles). */
struct LmheadPlace {
    uint32_t x, y;
};
template <class C>
__device__ __forceinline__ LmheadPlace lmhead_place() {
    if (!C::TILES_FIRST) {
        return LmheadPlace{blockIdx.x, blockIdx.y};
    }
    const uint32_t columns = gridDim.y;
    if ((uint64_t)gridDim.x * columns <= UINT32_MAX) { /* 32-bit division: the 64-bit one is a slow subroutine */
        const uint32_t order = blockIdx.x + gridDim.x * blockIdx.y;
        return LmheadPlace{order / columns, order % columns};
    }
    const uint64_t order = blockIdx.x + (uint64_t)gridDim.x * blockIdx.y;
    return LmheadPlace{(uint32_t)(order / columns), (uint32_t)(order % columns)};
}

/* Which (slot, row group) block x of column y does: the x-th, counting the
 * groups of BM rows of every slot with overlay rows in that column, slot by
 * slot. Slots are counted a window of 32 at a time (a warp scans them). A
 * window none of whose slots has rows in the column is passed over before
 * its pass over the row slots: the blocks past every slot's rows (a
 * fixed-shape set's grid covers its capacity, or more rows than the slots
 * hold) leave after reading the row counts.
 * On the side (TRIGGER_WHEN_FULL), warp 1 counts the grid's tiles (every
 * column) in the windows scanned, and `fills` says whether they outnumber the
 * SMs (lmhead_overlay); windows not reached or passed over are not counted,
 * which can only make `fills` false. Warp 1 reads the SM count while warp 0 scans: at the
 * trigger it cost up to 0.4 us on the H200, a constant-cache miss in the
 * block's way. */
template <class C>
__device__ bool lmhead_pick(LmheadShared<C> &sh, const tovl_lmhead_overlay_args &a, LmheadPlace place,
                            uint32_t &slot, uint32_t &group, LmheadSlot &cells, bool &fills) {
    const uint32_t tid = threadIdx.x, lane = lane_id(), warp = tid / WARP, x = place.x, k0 = place.y * C::BN;
    uint32_t before = 0; /* groups of the windows before; the same in every thread */
    uint32_t tiles = 0;  /* warp 1: tiles of the windows before (saturating) */
    for (uint32_t base = 0; base < a.max_loras; base += WARP) {
        /* The window's table cells, loaded alongside the row slots below
         * (one global round trip instead of three in a row). */
        uint32_t n = 0;
        uint64_t rows = 0, ids = 0;
        if ((warp == 0 || (C::TRIGGER_WHEN_FULL && warp == 1)) && base + lane < a.max_loras) {
            n = lmhead_rows_of(a, base + lane);
        }
        if (warp == 0 && base + lane < a.max_loras) {
            rows = ldg(ptr<const uint64_t>(a.rows_table) + base + lane);
            ids = ldg(ptr<const uint64_t>(a.ids_table) + base + lane);
        }
        if (base == 0) {
            /* The set's table cells are in flight; what follows reads the row
             * slots, which the kernel before may write (common.cuh). */
            grid_dependency_wait();
        }
        __syncthreads(); /* the previous window's counts and pick are read */
        if (tid < WARP) {
            sh.pick.count[tid] = 0;
        }
        if (warp == 0) {
            const uint32_t live = __ballot_sync(FULL_MASK, base + lane < a.max_loras && n > k0) != 0u;
            if (lane == 0) {
                sh.pick.pick[0] = 0;
                sh.pick.live = live;
            }
        }
        __syncthreads();
        if (!sh.pick.live) {
            continue; /* uniform: no group of this window is in the column */
        }
        for (uint32_t t = tid; t < a.T; t += C::THREADS) {
            const int32_t s = row_slot(a.row_slots, a.active_slot, t);
            if (s >= 0 && (uint32_t)s - base < WARP && (uint32_t)s < a.max_loras) {
                atomicAdd(&sh.pick.count[(uint32_t)s - base], 1u);
            }
        }
        __syncthreads();
        if (warp == 0) {
            const uint32_t s = base + lane;
            const bool live = s < a.max_loras && n > k0;
            const uint32_t groups = live ? (sh.pick.count[lane] + C::BM - 1) / C::BM : 0u;
            uint32_t end = groups; /* inclusive scan over the window's slots */
            TOVL_UNROLL
            for (uint32_t d = 1; d < WARP; d *= 2) {
                const uint32_t v = __shfl_up_sync(FULL_MASK, end, d);
                end += lane >= d ? v : 0u;
            }
            const uint32_t start = before + end - groups;
            if (groups > 0 && x >= start && x < before + end) {
                sh.pick.pick[0] = 1;
                sh.pick.pick[1] = s;
                sh.pick.pick[2] = x - start;
                sh.pick.rows = rows;
                sh.pick.ids = ids;
                sh.pick.n = n;
            }
            if (lane == WARP - 1) {
                sh.pick.pick[3] = end;
            }
        } else if (C::TRIGGER_WHEN_FULL && warp == 1) {
            /* Each slot's groups times its columns, capped far above any SM
             * count so that a window's 32 add up in 32 bits. */
            const uint32_t groups = (sh.pick.count[lane] + C::BM - 1) / C::BM;
            uint32_t window = (uint32_t)min_of<uint64_t>((uint64_t)groups * ((n + C::BN - 1) / C::BN),
                                                         LMHEAD_TILES_CAP);
            TOVL_UNROLL
            for (uint32_t d = WARP / 2; d >= 1; d /= 2) {
                window += __shfl_xor_sync(FULL_MASK, window, d);
            }
            tiles = min_of(tiles + window, LMHEAD_TILES_CAP);
            if (lane == 0) {
                sh.pick.fills = tiles > lmhead_sm_count();
            }
        }
        __syncthreads();
        if (sh.pick.pick[0]) {
            fills = C::TRIGGER_WHEN_FULL && sh.pick.fills != 0;
            slot = sh.pick.pick[1];
            group = sh.pick.pick[2];
            cells = LmheadSlot{ptr<const uint16_t>(sh.pick.rows), ptr<const uint32_t>(sh.pick.ids), sh.pick.n};
            return true;
        }
        before += sh.pick.pick[3];
    }
    return false;
}

/* MANY: the tiles of the gated pair, which compute only when some slot
 * holds more than F rows (launch_shape.h); otherwise row4q_few, launched
 * before them, does. */
template <class C, bool F32_LOGITS, bool MANY = false>
__device__ void lmhead_overlay(const tovl_lmhead_overlay_args &a) {
    if constexpr (MANY) {
        if (lmhead_live_rows(a) <= lmhead_few_rows(a.T)) {
            grid_dependents_launch(); /* nothing to compute: the next launch may start */
            grid_dependency_wait();   /* the stream's order: this grid ends after the one before */
            return;                   /* uniform */
        }
    }
    __shared__ LmheadShared<C> sh;
    __shared__ uint32_t tile_ids[C::BN]; /* outside sh: written before the loop, read after it */
    __shared__ uint32_t inexact;         /* the range check's vote (lmhead_tile) */
    __shared__ uint2 x_halves[C::THREADS]; /* its hidden-row bounds, exchanged between the groups */
    const uint32_t tid = threadIdx.x;
    uint32_t s, g;
    LmheadSlot cells;
    const LmheadPlace place = lmhead_place<C>();
    /* lmhead_pick waits for the kernel before (grid_dependency_wait), once
     * the first slot table cells are requested. */
    bool fills = false;
    if (!lmhead_pick<C>(sh, a, place, s, g, cells, fills)) {
        return; /* uniform: more blocks than groups */
    }
    const uint32_t n = cells.n;
    __syncthreads(); /* the pick is read */
    const uint32_t len = lmhead_find_rows<C>(sh, a, s, g);
    /* The block knows its rows: the next kernel may start launching (it
     * waits for this grid to complete before it reads the logits). On the
     * H200 this and the wait took 0.3-0.5 us off a launch, as early as at
     * entry or as late as after the chunk loop (docs/PERFORMANCE.md,
     * Programmatic dependent launch). But the next kernel's blocks are then
     * placed beside this one's: when this grid leaves SMs free (no more
     * tiles than SMs), two of its large tiles would land on one free SM and
     * the next launch of this kernel took 11-12 us instead of 8.3 at
     * T = 80-112 on the H200. So the large tiles let go
     * early only when they fill the device; the small ones (a block per SM,
     * nothing fits beside them) always do. */
    if (!C::TRIGGER_WHEN_FULL || fills) {
        grid_dependents_launch();
    }
    /* The tile's rows, kept in registers: the shared memory is reused. */
    const uint16_t *x_src[C::X_JOBS];
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::X_JOBS; j++) {
        const uint32_t r = (tid + j * C::THREADS) / C::ROW_VECS;
        x_src[j] = r < len ? ptr<const uint16_t>(a.hidden) + (size_t)sh.scan.rows[r] * a.h : nullptr;
    }
    const uint16_t *x_any = ptr<const uint16_t>(a.hidden) + (size_t)sh.scan.rows[0] * a.h; /* len >= 1 */
    /* Columns beyond CUDA's y limit: block y also does y + gridDim.y, ... */
    LmheadRange range; /* the hidden rows' bounds serve every column of the block */
    for (uint32_t k0 = place.y * C::BN; k0 < n; k0 += gridDim.y * C::BN) {
        lmhead_tile<C, F32_LOGITS>(sh, tile_ids, inexact, x_halves, range, k0 == place.y * C::BN, a, cells, x_src,
                                   x_any, k0, min_of(k0 + C::BN, n));
    }
}

} // namespace tovl_cuda

#define TOVL_CUDA_LMHEAD_ENTRY(name, config, f32, many)                                            \
    TOVL_CUDA_KERNEL void __launch_bounds__(config::THREADS, config::MIN_BLOCKS)                    \
        name(tovl_lmhead_overlay_args args) {                                                      \
        tovl_cuda::lmhead_overlay<config, f32, many>(args);                                        \
    }

TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_bf16, tovl_cuda::LmheadLarge, false, false)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_f32, tovl_cuda::LmheadLarge, true, false)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_bf16_small, tovl_cuda::LmheadSmall, false, false)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_f32_small, tovl_cuda::LmheadSmall, true, false)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_bf16_many, tovl_cuda::LmheadLarge, false, true)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_f32_many, tovl_cuda::LmheadLarge, true, true)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_bf16_small_many, tovl_cuda::LmheadSmall, false, true)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_f32_small_many, tovl_cuda::LmheadSmall, true, true)

#endif /* TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH */
