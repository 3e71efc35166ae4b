/*
 * lmhead_overlay_{bf16,f32}: for row t with slot s valid and k < n[s] (and
 * < max_n), with id = ids[s][k] < vocab:
 *     logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :])
 * in the spec's fixed order, stored as f32 (canonical NaN) or bf16 (RNE).
 *
 * Work. The cells of one slot form a small matrix product, hidden rows of that
 * slot times its overlay rows. Each block first groups the rows of a window of
 * T by slot (a stable counting sort in shared memory, the same in every block),
 * counts the units of work (a unit = one row x one tile-column of BN overlay
 * rows) and takes an even share of them, so the grid can be one block per SM
 * slot whatever the mix of slots. Its share is cut into tiles of up to BM rows
 * x BN overlay rows of one slot: every staged hidden row serves BN dots and
 * every staged overlay row BM dots.
 *
 * The dot order. Lane l of the spec sums elements i = l, l + 256, ... in that
 * order. In a warp, thread q holds lanes q + 32u (u = 0..7) of each of its
 * WM x WN cells; each step stages 256 elements (one per lane) of the tile's
 * rows as f32 in shared memory, and every thread adds one product per lane and
 * cell, so each lane's sum runs in increasing i. The tree then needs no shared
 * memory: strides 128, 64, 32 pair lanes of the same thread (u with u + 4, 2,
 * 1), strides 16..1 pair thread q with q + stride (shuffle down). Products and
 * sums are __fmul_rn / __fadd_rn: never fused, rounded to nearest even.
 * Elements past h are skipped, not multiplied by zero (0 * Inf is NaN, and
 * +0 would turn a -0 sum positive).
 */
#ifndef TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH
#define TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH

#include "common.cuh"

namespace tovl_cuda {

template <int WM_, int WARPS_M_, int WARPS_N_, int PREFETCH_>
struct LmheadConfig {
    /* Square warp tiles: a staged group of WM rows serves either operand. */
    static constexpr uint32_t WM = WM_, WN = WM_;
    static constexpr uint32_t WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
    static constexpr uint32_t WARPS = WARPS_M * WARPS_N;
    static constexpr uint32_t BM = WM * WARPS_M, BN = WN * WARPS_N;
    static constexpr uint32_t THREADS = WARP * WARPS;
    static constexpr uint32_t PREFETCH = PREFETCH_; /* steps whose loads are in flight */
    static constexpr uint32_t LANES_PER_THREAD = TOVL_DOT_LANES / WARP;
    static constexpr uint32_t CHUNK = TOVL_DOT_LANES; /* elements staged per step: one per lane */
    static constexpr uint32_t PAIRS = CHUNK / 2;
    static constexpr uint32_t X_GROUPS = BM / WM, W_GROUPS = BN / WN;
    /* Pairs of bf16 each thread stages per step, per row of its group. */
    static constexpr uint32_t JOBS = (X_GROUPS + W_GROUPS) * PAIRS / THREADS;
    static constexpr uint32_t WINDOW = TOVL_CUDA_LMHEAD_WINDOW;
    static constexpr uint32_t BINS = TOVL_CUDA_LMHEAD_BINS;
    static_assert((X_GROUPS + W_GROUPS) * PAIRS % THREADS == 0, "staging jobs divide evenly");
    static_assert(BINS == THREADS, "one bin per thread in the grouping");
    static_assert(WM == 2 || WM == 4, "vector loads of 2 or 4 floats");
};

using LmheadLarge =
    LmheadConfig<TOVL_CUDA_LMHEAD_LARGE_WM, TOVL_CUDA_LMHEAD_LARGE_WARPS_M, TOVL_CUDA_LMHEAD_LARGE_WARPS_N,
                 TOVL_CUDA_LMHEAD_LARGE_PREFETCH>;
using LmheadSmall =
    LmheadConfig<TOVL_CUDA_LMHEAD_SMALL_WM, TOVL_CUDA_LMHEAD_SMALL_WARPS_M, TOVL_CUDA_LMHEAD_SMALL_WARPS_N,
                 TOVL_CUDA_LMHEAD_SMALL_PREFETCH>;
static_assert(LmheadLarge::BM == TOVL_CUDA_LMHEAD_LARGE_BM && LmheadLarge::BN == TOVL_CUDA_LMHEAD_LARGE_BN, "shape");
static_assert(LmheadSmall::BM == TOVL_CUDA_LMHEAD_SMALL_BM && LmheadSmall::BN == TOVL_CUDA_LMHEAD_SMALL_BN, "shape");

template <class C>
struct LmheadShared {
    /* The step's staged elements, f32: [row group][element][row in group], so
     * a thread reads its WM rows of one element with one vector load. */
    float x[C::X_GROUPS][C::CHUNK][C::WM];
    float w[C::W_GROUPS][C::CHUNK][C::WN];
    /* The window's rows grouped by slot. */
    int32_t slot[C::WINDOW];                  /* the row's slot, -1: nothing to do */
    uint16_t rank[C::WINDOW];                 /* rank among its warp's rows of its bin */
    uint16_t order[C::WINDOW];                /* rows sorted by bin, stable */
    uint16_t warp_bin[C::WARPS][C::BINS];     /* rows per warp and bin, then their offset */
    uint32_t bin_count[C::BINS], bin_start[C::BINS];
    uint32_t bin_units[C::BINS], bin_unit_start[C::BINS];
    uint32_t warp_total[C::WARPS][2];
};

template <uint32_t N>
struct FloatVec;
template <>
struct FloatVec<2> {
    using type = float2;
    static __device__ __forceinline__ void split(type v, float (&out)[2]) {
        out[0] = v.x;
        out[1] = v.y;
    }
    static __device__ __forceinline__ type make(const float (&in)[2]) {
        return make_float2(in[0], in[1]);
    }
};
template <>
struct FloatVec<4> {
    using type = float4;
    static __device__ __forceinline__ void split(type v, float (&out)[4]) {
        out[0] = v.x;
        out[1] = v.y;
        out[2] = v.z;
        out[3] = v.w;
    }
    static __device__ __forceinline__ type make(const float (&in)[4]) {
        return make_float4(in[0], in[1], in[2], in[3]);
    }
};

/* Overlay rows of slot s the kernel computes: n[s], at most max_n. */
__device__ __forceinline__ uint32_t lmhead_rows_of(const tovl_lmhead_overlay_args &a, int32_t s) {
    return min_of(ldg(ptr<const uint32_t>(a.n_table) + s), a.max_n);
}

/* Exclusive block-wide scan of two values per thread; returns both totals. */
template <class C>
__device__ void block_scan2(LmheadShared<C> &sh, uint32_t &v0, uint32_t &v1, uint32_t &total0, uint32_t &total1) {
    const uint32_t lane = lane_id(), warp = threadIdx.x / WARP;
    uint32_t i0 = v0, i1 = v1;
    TOVL_UNROLL
    for (uint32_t d = 1; d < WARP; d *= 2) {
        const uint32_t u0 = __shfl_up_sync(FULL_MASK, i0, d), u1 = __shfl_up_sync(FULL_MASK, i1, d);
        if (lane >= d) {
            i0 += u0;
            i1 += u1;
        }
    }
    if (lane == WARP - 1) {
        sh.warp_total[warp][0] = i0;
        sh.warp_total[warp][1] = i1;
    }
    __syncthreads();
    uint32_t before0 = 0, before1 = 0;
    total0 = total1 = 0;
    for (uint32_t w = 0; w < C::WARPS; w++) {
        if (w < warp) {
            before0 += sh.warp_total[w][0];
            before1 += sh.warp_total[w][1];
        }
        total0 += sh.warp_total[w][0];
        total1 += sh.warp_total[w][1];
    }
    v0 = before0 + i0 - v0;
    v1 = before1 + i1 - v1;
}

/* Group rows [t0, t0 + count) by slot into sh (every block does the same, so
 * all agree on the order) and return the number of units of work. Rows whose
 * slot is invalid or has no overlay rows are left out. */
template <class C>
__device__ uint32_t lmhead_group_window(LmheadShared<C> &sh, const tovl_lmhead_overlay_args &a, uint32_t t0,
                                        uint32_t count) {
    const uint32_t tid = threadIdx.x, lane = lane_id(), warp = tid / WARP;
    uint16_t *warp_bin = &sh.warp_bin[0][0];
    for (uint32_t i = tid; i < C::WARPS * C::BINS; i += C::THREADS) {
        warp_bin[i] = 0;
    }
    __syncthreads();

    /* Each warp ranks a contiguous range of rows within their bins, in row order. */
    const uint32_t per_warp = (count + C::WARPS * WARP - 1) / (C::WARPS * WARP) * WARP;
    const uint32_t begin = warp * per_warp, end = min_of(begin + per_warp, count);
    for (uint32_t base = begin; base < end; base += WARP) {
        const uint32_t pos = base + lane;
        uint32_t bin = C::BINS; /* no work */
        if (pos < end) {
            const int32_t s = row_slot(a.row_slots, a.active_slot, t0 + pos);
            const bool live = slot_valid(s, a.max_loras) && lmhead_rows_of(a, s) > 0;
            sh.slot[pos] = live ? s : -1;
            bin = live ? (uint32_t)s % C::BINS : C::BINS;
        }
        const unsigned peers = __match_any_sync(FULL_MASK, bin);
        uint32_t before = 0;
        if (bin < C::BINS) {
            before = sh.warp_bin[warp][bin];
            sh.rank[pos] = (uint16_t)(before + __popc(peers & lanes_below(lane)));
        }
        __syncwarp();
        if (bin < C::BINS && lane == (uint32_t)__ffs(peers) - 1) {
            sh.warp_bin[warp][bin] = (uint16_t)(before + __popc(peers));
        }
        __syncwarp();
    }
    __syncthreads();

    /* Per bin (one per thread): each warp's offset in it, its rows, its units. */
    const uint32_t bin = tid;
    uint32_t rows = 0;
    for (uint32_t w = 0; w < C::WARPS; w++) {
        const uint32_t c = sh.warp_bin[w][bin];
        sh.warp_bin[w][bin] = (uint16_t)rows;
        rows += c;
    }
    uint32_t columns = 0;
    if (rows > 0) {
        /* Exact bins hold one slot; shared bins take the widest slot's columns
         * (tiles beyond a slot's own rows then do nothing). */
        const uint32_t n = a.max_loras <= C::BINS ? lmhead_rows_of(a, (int32_t)bin) : a.max_n;
        columns = (n + C::BN - 1) / C::BN;
    }
    uint32_t start = rows, unit_start = rows * columns, total_rows, total_units;
    sh.bin_count[bin] = rows;
    sh.bin_units[bin] = rows * columns;
    block_scan2(sh, start, unit_start, total_rows, total_units);
    sh.bin_start[bin] = start;
    sh.bin_unit_start[bin] = unit_start;
    __syncthreads();

    for (uint32_t pos = tid; pos < count; pos += C::THREADS) {
        const int32_t s = sh.slot[pos];
        if (s >= 0) {
            const uint32_t b = (uint32_t)s % C::BINS;
            sh.order[sh.bin_start[b] + sh.warp_bin[pos / per_warp][b] + sh.rank[pos]] = (uint16_t)pos;
        }
    }
    __syncthreads();
    return total_units;
}

/* Load this thread's pairs of step `chunk` into registers (0 past a row's end
 * or for an absent row). */
template <class C>
__device__ __forceinline__ void lmhead_load(uint32_t (&staged)[C::JOBS][C::WM],
                                            const uint16_t *const (&src)[C::JOBS][C::WM], uint32_t chunk, uint32_t h,
                                            bool pairs_aligned) {
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::JOBS; j++) {
        const uint32_t e0 = chunk * C::CHUNK + 2 * ((threadIdx.x + j * C::THREADS) % C::PAIRS);
        TOVL_UNROLL
        for (uint32_t e = 0; e < C::WM; e++) {
            const uint16_t *row = src[j][e];
            uint32_t pair = 0;
            if (row && e0 < h) {
                if (pairs_aligned) {
                    pair = ldg(reinterpret_cast<const uint32_t *>(row + e0));
                } else {
                    pair = (uint32_t)ldg(row + e0) | (e0 + 1 < h ? (uint32_t)ldg(row + e0 + 1) << 16 : 0u);
                }
            }
            staged[j][e] = pair;
        }
    }
}

/* Convert the registers to f32 and store them in the staging area. */
template <class C>
__device__ __forceinline__ void lmhead_store(LmheadShared<C> &sh, const uint32_t (&staged)[C::JOBS][C::WM]) {
    using Vec = FloatVec<C::WM>;
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::JOBS; j++) {
        const uint32_t job = threadIdx.x + j * C::THREADS;
        const uint32_t group = job / C::PAIRS, e0 = 2 * (job % C::PAIRS);
        float lo[C::WM], hi[C::WM];
        TOVL_UNROLL
        for (uint32_t e = 0; e < C::WM; e++) {
            lo[e] = pair_lo(staged[j][e]);
            hi[e] = pair_hi(staged[j][e]);
        }
        float *dst = group < C::X_GROUPS ? &sh.x[group][e0][0] : &sh.w[group - C::X_GROUPS][e0][0];
        *reinterpret_cast<typename Vec::type *>(dst) = Vec::make(lo);
        *reinterpret_cast<typename Vec::type *>(dst + C::WM) = Vec::make(hi);
    }
}

/* One step: each lane of each cell adds its element's product. PARTIAL: the
 * step holds only `valid` elements (the end of the row). */
template <class C, bool PARTIAL>
__device__ __forceinline__ void lmhead_accumulate(const LmheadShared<C> &sh,
                                                  float (&acc)[C::WM][C::WN][C::LANES_PER_THREAD], uint32_t wm,
                                                  uint32_t wn, uint32_t lane, uint32_t valid) {
    using Vec = FloatVec<C::WM>;
    TOVL_UNROLL
    for (uint32_t u = 0; u < C::LANES_PER_THREAD; u++) {
        const uint32_t i = u * WARP + lane;
        if (PARTIAL && i >= valid) {
            continue;
        }
        float xv[C::WM], wv[C::WN];
        Vec::split(*reinterpret_cast<const typename Vec::type *>(&sh.x[wm][i][0]), xv);
        Vec::split(*reinterpret_cast<const typename Vec::type *>(&sh.w[wn][i][0]), wv);
        TOVL_UNROLL
        for (uint32_t m = 0; m < C::WM; m++) {
            TOVL_UNROLL
            for (uint32_t n = 0; n < C::WN; n++) {
                acc[m][n][u] = __fadd_rn(acc[m][n][u], __fmul_rn(xv[m], wv[n]));
            }
        }
    }
}

/* The spec's tree over one cell's 256 lane sums; the result is on lane 0. */
__device__ __forceinline__ float lmhead_tree(const float (&lanes)[8]) {
    float p[8];
    TOVL_UNROLL
    for (int u = 0; u < 8; u++) {
        p[u] = lanes[u];
    }
    TOVL_UNROLL
    for (int stride = 4; stride >= 1; stride /= 2) { /* lane strides 128, 64, 32 */
        TOVL_UNROLL
        for (int u = 0; u < stride; u++) {
            p[u] = __fadd_rn(p[u], p[u + stride]);
        }
    }
    float sum = p[0];
    TOVL_UNROLL
    for (uint32_t stride = WARP / 2; stride >= 1; stride /= 2) { /* lane strides 16..1 */
        sum = __fadd_rn(sum, __shfl_down_sync(FULL_MASK, sum, stride));
    }
    return sum;
}

/* One tile: rows order[0..len) of the window (all of slot s) x overlay rows
 * [column * BN, +BN) of s. Every thread of the block calls it. */
template <class C, bool F32_LOGITS>
__device__ void lmhead_tile(LmheadShared<C> &sh, const tovl_lmhead_overlay_args &a, uint32_t t0,
                            const uint16_t *order, uint32_t len, int32_t s, uint32_t column) {
    const uint32_t h = a.h;
    const uint32_t k0 = column * C::BN;
    const uint32_t k_end = min_of(k0 + C::BN, lmhead_rows_of(a, s));
    if (k0 >= k_end) {
        return; /* a shared bin's column beyond this slot's rows */
    }
    const uint16_t *hidden = ptr<const uint16_t>(a.hidden);
    const uint16_t *w_rows = ptr<const uint16_t>(ldg(ptr<const uint64_t>(a.rows_table) + s));
    const bool pairs_aligned = h % 2 == 0 && ((a.hidden | (uint64_t)(uintptr_t)w_rows) & 3u) == 0;

    /* The rows this thread stages: group = job / PAIRS, WM rows per group. */
    const uint16_t *src[C::JOBS][C::WM];
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::JOBS; j++) {
        const uint32_t group = (threadIdx.x + j * C::THREADS) / C::PAIRS;
        TOVL_UNROLL
        for (uint32_t e = 0; e < C::WM; e++) {
            const uint32_t r = group * C::WM + e;
            if (r < C::BM) {
                src[j][e] = r < len ? hidden + (size_t)(t0 + order[r]) * h : nullptr;
            } else {
                const uint32_t k = k0 + (r - C::BM);
                src[j][e] = k < k_end ? w_rows + (size_t)k * h : nullptr;
            }
        }
    }

    const uint32_t lane = lane_id(), warp = threadIdx.x / WARP;
    const uint32_t wm = warp / C::WARPS_N, wn = warp % C::WARPS_N;
    /* Warps whose cells all lie outside the tile only help with staging. */
    const bool busy = wm * C::WM < len && k0 + wn * C::WN < k_end;
    float acc[C::WM][C::WN][C::LANES_PER_THREAD];
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::WM; m++) {
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::WN; n++) {
            TOVL_UNROLL
            for (uint32_t u = 0; u < C::LANES_PER_THREAD; u++) {
                acc[m][n][u] = 0.0f;
            }
        }
    }

    /* A ring of PREFETCH steps' loads in registers: step c + PREFETCH is in
     * flight while step c is stored and computed, so a step's global latency
     * is spread over PREFETCH steps of math (one step of math is far shorter
     * than a load's round trip). The ring index is a compile-time constant. */
    constexpr uint32_t DEPTH = C::PREFETCH;
    uint32_t staged[DEPTH][C::JOBS][C::WM];
    const uint32_t chunks = (h + C::CHUNK - 1) / C::CHUNK;
    TOVL_UNROLL
    for (uint32_t d = 0; d < DEPTH; d++) {
        if (d < chunks) {
            lmhead_load<C>(staged[d], src, d, h, pairs_aligned);
        }
    }
    for (uint32_t c0 = 0; c0 < chunks; c0 += DEPTH) {
        TOVL_UNROLL
        for (uint32_t d = 0; d < DEPTH; d++) {
            const uint32_t c = c0 + d;
            if (c < chunks) { /* uniform across the block */
                __syncthreads(); /* nobody reads the staging area any more */
                lmhead_store<C>(sh, staged[d]);
                __syncthreads();
                if (c + DEPTH < chunks) {
                    lmhead_load<C>(staged[d], src, c + DEPTH, h, pairs_aligned);
                }
                if (busy) {
                    const uint32_t valid = h - c * C::CHUNK;
                    if (valid >= C::CHUNK) {
                        lmhead_accumulate<C, false>(sh, acc, wm, wn, lane, valid);
                    } else {
                        lmhead_accumulate<C, true>(sh, acc, wm, wn, lane, valid);
                    }
                }
            }
        }
    }
    if (!busy) {
        return;
    }

    float dot[C::WM][C::WN];
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::WM; m++) {
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::WN; n++) {
            dot[m][n] = lmhead_tree(acc[m][n]);
        }
    }
    if (lane != 0) {
        return;
    }
    const uint32_t *ids = ptr<const uint32_t>(ldg(ptr<const uint64_t>(a.ids_table) + s));
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::WM; m++) {
        const uint32_t r = wm * C::WM + m;
        if (r >= len) {
            continue;
        }
        const size_t row_cells = (size_t)(t0 + order[r]) * a.ld;
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::WN; n++) {
            const uint32_t k = k0 + wn * C::WN + n;
            if (k >= k_end) {
                continue;
            }
            const uint32_t id = ldg(ids + k);
            if (id >= a.vocab) {
                continue;
            }
            if (F32_LOGITS) {
                ptr<uint32_t>(a.logits)[row_cells + id] = f32_out_bits(dot[m][n]);
            } else {
                ptr<uint16_t>(a.logits)[row_cells + id] = f32_to_bf16(dot[m][n]);
            }
        }
    }
}

/* The last bin at or before unit u: the one holding it (empty bins start
 * where the next non-empty one does, so they are never "last"). */
template <class C>
__device__ __forceinline__ uint32_t lmhead_bin_of(const LmheadShared<C> &sh, uint32_t u) {
    uint32_t lo = 0, hi = C::BINS;
    while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (sh.bin_unit_start[mid] <= u) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

template <class C, bool F32_LOGITS>
__device__ void lmhead_overlay(const tovl_lmhead_overlay_args &a) {
    __shared__ LmheadShared<C> sh;
    for (uint32_t t0 = 0; t0 < a.T; t0 += C::WINDOW) {
        const uint32_t count = min_of(a.T - t0, C::WINDOW);
        __syncthreads(); /* the previous window's tiles are done with its grouping */
        const uint32_t units = lmhead_group_window<C>(sh, a, t0, count);
        /* This block's even share of the window's units. */
        uint32_t u = (uint32_t)((uint64_t)units * blockIdx.x / gridDim.x);
        const uint32_t u_end = (uint32_t)((uint64_t)units * (blockIdx.x + 1) / gridDim.x);
        uint32_t bin = u < u_end ? lmhead_bin_of(sh, u) : 0;
        while (u < u_end) {
            const uint32_t rows = sh.bin_count[bin];
            const uint32_t local = u - sh.bin_unit_start[bin];
            const uint32_t column = local / rows, first = local % rows;
            uint32_t len = min_of(min_of(C::BM, rows - first), u_end - u);
            const uint16_t *order = &sh.order[sh.bin_start[bin] + first];
            const int32_t s = sh.slot[order[0]];
            for (uint32_t i = 1; i < len; i++) {
                if (sh.slot[order[i]] != s) {
                    len = i; /* a shared bin: a tile holds one slot */
                    break;
                }
            }
            lmhead_tile<C, F32_LOGITS>(sh, a, t0, order, len, s, column);
            u += len;
            if (u == sh.bin_unit_start[bin] + sh.bin_units[bin]) {
                do {
                    bin++;
                } while (bin < C::BINS && sh.bin_units[bin] == 0);
            }
        }
    }
}

} // namespace tovl_cuda

#define TOVL_CUDA_LMHEAD_ENTRY(name, config, f32, min_blocks)                                          \
    TOVL_CUDA_KERNEL void __launch_bounds__(config::THREADS, min_blocks) name(tovl_lmhead_overlay_args args) { \
        tovl_cuda::lmhead_overlay<config, f32>(args);                                                  \
    }

TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_bf16, tovl_cuda::LmheadLarge, false, 1)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_f32, tovl_cuda::LmheadLarge, true, 1)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_bf16_small, tovl_cuda::LmheadSmall, false, 2)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_f32_small, tovl_cuda::LmheadSmall, true, 2)

#endif /* TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH */
