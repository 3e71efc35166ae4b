/*
 * PROTOTYPE (ninth session, bench/prototype-ninth/build.sh): lm_head for small
 * batches without a shared-memory
 * ring. Block (x, y) = overlay rows [x * R, +R) of slot y, all of the slot's
 * rows (tokens) in groups of TM. Each thread loads its own operand words
 * (lanes 2q, 2q + 1 of every row it needs) straight into registers DEPTH
 * chunks ahead: no block barrier in the loop. The tree is the kept kernel's.
 * Needs h even and 4-byte aligned rows (the prototype checks nothing else).
 */
#pragma once
#include "kernels/lmhead_overlay.cuh"

#ifndef SR_TM
#define SR_TM 8
#endif
#ifndef SR_TN
#define SR_TN 2
#endif
#ifndef SR_DEPTH
#define SR_DEPTH 4
#endif

namespace tovl_cuda {

template <uint32_t TM_, uint32_t TN_, uint32_t DEPTH_>
struct SrConfig {
    static constexpr uint32_t TM = TM_, TN = TN_, DEPTH = DEPTH_;
    static constexpr uint32_t THREADS = 256, GROUP = 128, WARPS = 8;
    static constexpr uint32_t R = 2 * TN;
    static constexpr uint32_t WORDS = 128;
    static constexpr uint32_t CELLS = TM * TN;
    static constexpr uint32_t ROUND = 16;
    static_assert(CELLS % ROUND == 0, "whole tree rounds");
};
using SrC = SrConfig<SR_TM, SR_TN, SR_DEPTH>;

template <class C>
struct SrShared {
    float2 lanes[2][C::ROUND / 2][TOVL_DOT_LANES];
    uint32_t list[256];
    uint32_t warp_count[8];
    uint32_t ids[C::R];
};

template <class C>
__device__ __forceinline__ void sr_load(uint32_t (&xb)[C::TM], uint32_t (&wb)[C::TN], const uint32_t *const (&xr)[C::TM],
                                        const uint32_t *const (&wr)[C::TN], uint32_t off) {
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        xb[m] = xr[m] ? ldg(xr[m] + off) : 0u;
    }
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::TN; j++) {
        wb[j] = wr[j] ? ldg(wr[j] + off) : 0u;
    }
}

template <class C, bool F32_LOGITS>
__device__ void sr_tile(SrShared<C> &sh, const tovl_lmhead_overlay_args &a, const uint16_t *rows, uint32_t k0,
                        uint32_t n, uint32_t g0, uint32_t live) {
    const uint32_t tid = threadIdx.x, grp = tid / C::GROUP, q = tid % C::GROUP;
    const uint32_t h = a.h;
    const uint16_t *hidden = ptr<const uint16_t>(a.hidden);
    const uint32_t *xr[C::TM];
    const uint32_t *wr[C::TN];
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        xr[m] = m < live ? reinterpret_cast<const uint32_t *>(hidden + (size_t)sh.list[g0 + m] * h) + q : nullptr;
    }
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::TN; j++) {
        const uint32_t k = k0 + grp * C::TN + j;
        wr[j] = k < n ? reinterpret_cast<const uint32_t *>(rows + (size_t)k * h) + q : nullptr;
    }
    float acc[C::TM][C::TN][2];
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        TOVL_UNROLL
        for (uint32_t j = 0; j < C::TN; j++) {
            acc[m][j][0] = acc[m][j][1] = 0.0f;
        }
    }
    const uint32_t whole = h / TOVL_DOT_LANES;
    uint32_t xb[C::DEPTH][C::TM], wb[C::DEPTH][C::TN];
    TOVL_UNROLL
    for (uint32_t d = 0; d < C::DEPTH; d++) {
        if (d < whole) {
            sr_load<C>(xb[d], wb[d], xr, wr, d * C::WORDS);
        }
    }
    for (uint32_t c0 = 0; c0 < whole; c0 += C::DEPTH) {
        TOVL_UNROLL
        for (uint32_t d = 0; d < C::DEPTH; d++) {
            const uint32_t c = c0 + d;
            if (c < whole) {
                lmhead_lane<C, 0>(xb[d], wb[d], acc);
                lmhead_lane<C, 1>(xb[d], wb[d], acc);
                if (c + C::DEPTH < whole) {
                    sr_load<C>(xb[d], wb[d], xr, wr, (c + C::DEPTH) * C::WORDS);
                }
            }
        }
    }
    if (whole * TOVL_DOT_LANES < h && whole * C::WORDS + q < h / 2) {
        uint32_t xw[C::TM], ww[C::TN];
        sr_load<C>(xw, ww, xr, wr, whole * C::WORDS);
        lmhead_lane<C, 0>(xw, ww, acc);
        lmhead_lane<C, 1>(xw, ww, acc);
    }

    const uint32_t lane = lane_id(), warp = tid / WARP;
    __syncthreads(); /* the previous tile's tree is done with sh.lanes */
    TOVL_UNROLL
    for (uint32_t r0 = 0; r0 < C::CELLS; r0 += C::ROUND) {
        if (r0 > 0) {
            __syncthreads();
        }
        TOVL_UNROLL
        for (uint32_t i = 0; i < C::ROUND; i += 2) {
            const uint32_t c0 = r0 + i, c1 = c0 + 1;
            const float(&e)[2] = acc[c0 / C::TN][c0 % C::TN], (&o)[2] = acc[c1 / C::TN][c1 % C::TN];
            store16(&sh.lanes[grp][i / 2][2 * q],
                    uint4{__float_as_uint(e[0]), __float_as_uint(o[0]), __float_as_uint(e[1]), __float_as_uint(o[1])});
        }
        __syncthreads();
        float v[4];
        TOVL_UNROLL
        for (uint32_t half = 0; half < 2; half++) {
            const uint32_t pair = warp + half * C::WARPS, g = pair / (C::ROUND / 2), pi = pair % (C::ROUND / 2);
            float2 p[8];
            TOVL_UNROLL
            for (uint32_t u = 0; u < 8; u++) {
                p[u] = sh.lanes[g][pi][lane + WARP * u];
            }
            v[2 * half] = lmhead_tree_in_thread(p, 0);
            v[2 * half + 1] = lmhead_tree_in_thread(p, 1);
        }
        const uint32_t c = lmhead_tree_across_warp(v, lane);
        if (lane % 8 == 0) {
            const uint32_t pair = warp + (c / 2) * C::WARPS, g = pair / (C::ROUND / 2);
            const uint32_t cell = r0 + 2 * (pair % (C::ROUND / 2)) + c % 2;
            const uint32_t m = cell / C::TN, k = k0 + g * C::TN + cell % C::TN;
            if (m < live && k < n) {
                const uint32_t id = sh.ids[k - k0];
                if (id < a.vocab) {
                    const size_t at = (size_t)sh.list[g0 + m] * a.ld + id;
                    if (F32_LOGITS) {
                        ptr<uint32_t>(a.logits)[at] = f32_out_bits(v[0]);
                    } else {
                        ptr<uint16_t>(a.logits)[at] = f32_to_bf16(v[0]);
                    }
                }
            }
        }
    }
}

template <class C, bool F32_LOGITS>
__device__ void lmhead_slotrows(const tovl_lmhead_overlay_args &a) {
    __shared__ SrShared<C> sh;
    const uint32_t tid = threadIdx.x, lane = lane_id(), warp = tid / WARP;
    const uint32_t s = blockIdx.y, k0 = blockIdx.x * C::R;
    if (s >= a.max_loras) {
        return;
    }
    /* First trip: the slot's cells and the first window's row slots together. */
    const bool first_mine = tid < a.T && row_slot(a.row_slots, a.active_slot, tid) == (int32_t)s;
    const uint32_t n = lmhead_rows_of(a, s);
    const uint64_t rows_cell = ldg(ptr<const uint64_t>(a.rows_table) + s);
    const uint64_t ids_cell = ldg(ptr<const uint64_t>(a.ids_table) + s);
    if (k0 >= n) {
        return;
    }
    if (tid < C::R) {
        sh.ids[tid] = k0 + tid < n ? ldg(ptr<const uint32_t>(ids_cell) + k0 + tid) : UINT32_MAX;
    }
    const uint16_t *rows = ptr<const uint16_t>(rows_cell);
    for (uint32_t base = 0; base < a.T; base += C::THREADS) {
        const uint32_t t = base + tid;
        const bool mine = base == 0 ? first_mine
                                    : t < a.T && row_slot(a.row_slots, a.active_slot, t) == (int32_t)s;
        const unsigned votes = __ballot_sync(FULL_MASK, mine);
        if (lane == 0) {
            sh.warp_count[warp] = (uint32_t)__popc(votes);
        }
        __syncthreads();
        uint32_t before = 0, total = 0;
        for (uint32_t w = 0; w < C::WARPS; w++) {
            const uint32_t cnt = sh.warp_count[w];
            before += w < warp ? cnt : 0u;
            total += cnt;
        }
        if (mine) {
            sh.list[before + (uint32_t)__popc(votes & lanes_below(lane))] = t;
        }
        __syncthreads();
        for (uint32_t g0 = 0; g0 < total; g0 += C::TM) {
            sr_tile<C, F32_LOGITS>(sh, a, rows, k0, n, g0, min_of(total - g0, C::TM));
        }
        __syncthreads();
    }
}

} // namespace tovl_cuda

extern "C" __global__ void __launch_bounds__(256, 1) lmhead_sr_bf16(tovl_lmhead_overlay_args args) {
    tovl_cuda::lmhead_slotrows<tovl_cuda::SrC, false>(args);
}
extern "C" __global__ void __launch_bounds__(256, 1) lmhead_sr_f32(tovl_lmhead_overlay_args args) {
    tovl_cuda::lmhead_slotrows<tovl_cuda::SrC, true>(args);
}
