/*
 * lmhead_overlay_{bf16,f32}_wide: the lm_head hook for batches between the
 * row kernels (lmhead_row.cuh) and the large tiles (lmhead_overlay.cuh).
 * Same contract and same bits:
 *     logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :])
 * for row t with slot s valid, k < n[s] (and < max_n), id = ids[s][k] < vocab.
 *
 * Work. A block computes one tile of BM = 8 rows of one slot x BN = 4 overlay
 * rows, found on the device as the tile kernels find theirs (lmhead_pick,
 * lmhead_find_rows). What differs is who holds which lanes: the tile kernels
 * give each thread two lanes of many cells, so a cell's 4096 multiply-adds
 * (h = 4096) run on one or two warps; here warp w holds "slice" w of the
 * spec's 256 lanes for all 32 cells of the tile, one lane per thread, so a
 * cell's lanes run on all 8 warps at once. On the H200 that made the loop of
 * a batch of 64 rows 5.4-6.0 us against 8.5 for the small tiles (plain
 * launches; docs/PERFORMANCE.md, thirteenth session).
 *
 * The dot order. Slice w is lanes 16 w .. 16 w + 15 and 128 + 16 w .. + 15:
 * thread q of warp w holds lane 128 (q / 16) + 16 w + q % 16, and for each
 * 256-element round j it loads that lane's element of each of the tile's
 * rows and overlay rows (2-byte loads, ROUNDS_AHEAD rounds ahead), so each
 * lane's sum runs in increasing i; elements past h are skipped, not
 * multiplied by zero. Products and sums are __fmul_rn / __fadd_rn, never
 * fused. The tree: stride 128 pairs the warp's half-warps (thread q with
 * q + 16, by a shuffle; each half keeps 16 of the 32 cells), which leaves
 * lanes 16 w .. 16 w + 15 of every cell in shared memory; strides 64, 32, 16
 * pair slices w with w + 4, 2, 1 there, and 8 threads per cell run strides
 * 8 .. 1 (8 in the thread, 4, 2, 1 by shuffles).
 */
#ifndef TOVL_CUDA_KERNELS_LMHEAD_WIDE_CUH
#define TOVL_CUDA_KERNELS_LMHEAD_WIDE_CUH

#include "common.cuh"
#include "lmhead_overlay.cuh"

namespace tovl_cuda {

/* The tile pick and the row scan are the tile kernels' (LmheadConfig: BM x
 * 2 TN cells, 256 threads); the staging ring and its tree are not used. */
using LmheadWide = LmheadConfig<TOVL_CUDA_LMHEAD_BM, TOVL_CUDA_LMHEAD_WIDE_BN / 2, 2,
                                TOVL_CUDA_LMHEAD_WIDE_BLOCKS_PER_SM, true>;
constexpr uint32_t WIDE_AHEAD = TOVL_CUDA_LMHEAD_WIDE_ROUNDS_AHEAD;
constexpr uint32_t WIDE_CELLS = LmheadWide::BM * LmheadWide::BN;
constexpr uint32_t WIDE_SLICE = TOVL_DOT_LANES / 2 / LmheadWide::WARPS; /* lanes per slice in each half: 16 */
static_assert(LmheadWide::WARPS == 8 && WIDE_SLICE == 16 && WIDE_CELLS == 32,
              "a warp per slice of 2 x 16 lanes; a half-warp keeps 16 of the 32 cells after stride 128");
static_assert(TOVL_CUDA_LMHEAD_WIDE_BN == LmheadWide::BN, "shape");

/* One tile: rows x[0..BM) (the absent ones repeat a present one; their
 * cells are not stored) times overlay rows [k0, k_end) of the slot. */
template <bool F32_LOGITS>
__device__ void lmhead_wide_tile(LmheadShared<LmheadWide> &sh, uint32_t (&tile_ids)[LmheadWide::BN],
                                 const tovl_lmhead_overlay_args &a, const LmheadSlot &slot,
                                 const uint16_t *const (&x)[LmheadWide::BM], uint32_t k0, uint32_t k_end) {
    constexpr uint32_t BM = LmheadWide::BM, BN = LmheadWide::BN, A = WIDE_AHEAD;
    const uint32_t h = a.h, tid = threadIdx.x, warp = tid / WARP, q = lane_id();
    const uint32_t half = q / WIDE_SLICE, qq = q % WIDE_SLICE;
    const uint32_t lane = TOVL_DOT_LANES / 2 * half + WIDE_SLICE * warp + qq; /* the spec lane this thread holds */
    const uint16_t *w[BN];
    TOVL_UNROLL
    for (uint32_t n = 0; n < BN; n++) {
        w[n] = slot.rows + (size_t)(k0 + n < k_end ? k0 + n : k0) * h;
    }
    if (tid < BN) {
        tile_ids[tid] = k0 + tid < k_end ? ldg(slot.ids + k0 + tid) : UINT32_MAX; /* in flight with the rows */
    }
    float acc[BM][BN];
    TOVL_UNROLL
    for (uint32_t m = 0; m < BM; m++) {
        TOVL_UNROLL
        for (uint32_t n = 0; n < BN; n++) {
            acc[m][n] = 0.0f;
        }
    }
    /* Round j's elements of this thread's lane, A rounds ahead: the 2-byte
     * words sit in 32-bit registers (0 past h; never used). */
    uint32_t xb[A][BM], wb[A][BN];
    const uint32_t rounds = (h + TOVL_DOT_LANES - 1) / TOVL_DOT_LANES;
    const auto fetch = [&](uint32_t j, uint32_t (&xv)[BM], uint32_t (&wv)[BN]) {
        const uint32_t e = lane + j * TOVL_DOT_LANES;
        const bool in = j < rounds && e < h;
        TOVL_UNROLL
        for (uint32_t m = 0; m < BM; m++) {
            xv[m] = in ? ldg(x[m] + e) : 0u;
        }
        TOVL_UNROLL
        for (uint32_t n = 0; n < BN; n++) {
            wv[n] = in ? ldg(w[n] + e) : 0u;
        }
    };
    TOVL_UNROLL
    for (uint32_t d = 0; d < A; d++) {
        fetch(d, xb[d], wb[d]);
    }
    for (uint32_t j0 = 0; j0 < rounds; j0 += A) {
        TOVL_UNROLL
        for (uint32_t d = 0; d < A; d++) {
            const uint32_t j = j0 + d;
            float xf[BM], wf[BN];
            TOVL_UNROLL
            for (uint32_t m = 0; m < BM; m++) {
                xf[m] = bf16_to_f32(xb[d][m]);
            }
            TOVL_UNROLL
            for (uint32_t n = 0; n < BN; n++) {
                wf[n] = bf16_to_f32(wb[d][n]);
            }
            fetch(j + A, xb[d], wb[d]);
            if (j < rounds && lane + j * TOVL_DOT_LANES < h) {
                TOVL_UNROLL
                for (uint32_t m = 0; m < BM; m++) {
                    float prod[BN];
                    TOVL_UNROLL
                    for (uint32_t n = 0; n < BN; n++) {
                        prod[n] = __fmul_rn(xf[m], wf[n]);
                    }
                    TOVL_UNROLL
                    for (uint32_t n = 0; n < BN; n++) {
                        acc[m][n] = __fadd_rn(acc[m][n], prod[n]);
                    }
                }
            }
        }
    }
    /* Stride 128 as a reduce-scatter over the two half-warps (lane l + lane
     * l + 128, the lower lane's value first): half 0 keeps cells 0..15, half
     * 1 cells 16..31 (cell c = m * BN + n). */
    TOVL_UNROLL
    for (uint32_t c = 0; c < WIDE_CELLS / 2; c++) {
        const uint32_t lo = c, hi = c + WIDE_CELLS / 2;
        const float send = half ? acc[lo / BN][lo % BN] : acc[hi / BN][hi % BN];
        const float mine = half ? acc[hi / BN][hi % BN] : acc[lo / BN][lo % BN];
        const float theirs = __shfl_xor_sync(FULL_MASK, send, WIDE_SLICE);
        sh.slices.v[warp][half * (WIDE_CELLS / 2) + c][qq] =
            half ? __fadd_rn(theirs, mine) : __fadd_rn(mine, theirs);
    }
    __syncthreads();
    /* Strides 64, 32, 16 pair slices (lanes 16 w + u with 16 (w + 4) + u,
     * then w + 2, then w + 1), 8 threads per cell: thread p takes u = p and
     * p + 8, whose stride-8 sum it forms itself; strides 4, 2, 1 by shuffles
     * within the 8. */
    const uint32_t cell = tid / 8, p = tid % 8;
    float v[2];
    TOVL_UNROLL
    for (uint32_t i = 0; i < 2; i++) {
        const uint32_t u = p + 8 * i;
        float s[8];
        TOVL_UNROLL
        for (uint32_t sl = 0; sl < 8; sl++) {
            s[sl] = sh.slices.v[sl][cell][u];
        }
        TOVL_UNROLL
        for (uint32_t stride = 4; stride >= 1; stride /= 2) {
            TOVL_UNROLL
            for (uint32_t sl = 0; sl < stride; sl++) {
                s[sl] = __fadd_rn(s[sl], s[sl + stride]);
            }
        }
        v[i] = s[0];
    }
    float r = __fadd_rn(v[0], v[1]); /* stride 8: lane u + lane u + 8 */
    TOVL_UNROLL
    for (uint32_t stride = 4; stride >= 1; stride /= 2) {
        r = __fadd_rn(r, __shfl_down_sync(FULL_MASK, r, stride));
    }
    if (p == 0) {
        const uint32_t m = cell / BN, k = k0 + cell % BN, t = sh.slices.rows[m];
        if (t != UINT32_MAX && k < k_end) {
            const uint32_t id = tile_ids[k - k0];
            if (id < a.vocab) {
                store_logit<F32_LOGITS>(a, t, id, r);
            }
        }
    }
    __syncthreads(); /* slices.v and tile_ids are read before the next tile writes them */
}

template <bool F32_LOGITS>
__device__ void lmhead_overlay_wide(const tovl_lmhead_overlay_args &a) {
    using C = LmheadWide;
    __shared__ LmheadShared<C> sh;
    __shared__ uint32_t tile_ids[C::BN];
    const uint32_t tid = threadIdx.x;
    uint32_t s, g;
    LmheadSlot cells;
    const LmheadPlace place = lmhead_place<C>();
    bool fills = false; /* lmhead_pick waits for the kernel before */
    if (!lmhead_pick<C>(sh, a, place, s, g, cells, fills)) {
        return; /* uniform: more blocks than groups */
    }
    const uint32_t n = cells.n;
    __syncthreads(); /* the pick is read */
    const uint32_t len = lmhead_find_rows<C>(sh, a, s, g); /* at least 1: the pick found the group */
    /* As the large tiles: let the next launch in early only when this grid's
     * tiles fill the device (lmhead_overlay.cuh says why). */
    if (!C::TRIGGER_WHEN_FULL || fills) {
        grid_dependents_launch();
    }
    const uint16_t *x[C::BM];
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::BM; m++) {
        x[m] = ptr<const uint16_t>(a.hidden) + (size_t)sh.scan.rows[m < len ? m : 0] * a.h;
    }
    const uint32_t t_of = tid < C::BM && tid < len ? sh.scan.rows[tid] : UINT32_MAX;
    __syncthreads(); /* scan.rows is read: slices, over the same memory, may be written */
    if (tid < C::BM) {
        sh.slices.rows[tid] = t_of;
    }
    /* Columns beyond CUDA's y limit: block y also does y + gridDim.y, ... */
    for (uint32_t k0 = place.y * C::BN; k0 < n; k0 += gridDim.y * C::BN) {
        lmhead_wide_tile<F32_LOGITS>(sh, tile_ids, a, cells, x, k0, min_of(k0 + C::BN, n));
    }
}

} // namespace tovl_cuda

#define TOVL_CUDA_LMHEAD_WIDE_ENTRY(name, f32)                                                                    \
    TOVL_CUDA_KERNEL void __launch_bounds__(tovl_cuda::LmheadWide::THREADS, tovl_cuda::LmheadWide::MIN_BLOCKS) \
        name(tovl_lmhead_overlay_args args) {                                                                   \
        tovl_cuda::lmhead_overlay_wide<f32>(args);                                                              \
    }

TOVL_CUDA_LMHEAD_WIDE_ENTRY(lmhead_overlay_bf16_wide, false)
TOVL_CUDA_LMHEAD_WIDE_ENTRY(lmhead_overlay_f32_wide, true)

#endif /* TOVL_CUDA_KERNELS_LMHEAD_WIDE_CUH */
