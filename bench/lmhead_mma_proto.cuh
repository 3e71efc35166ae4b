/*
 * PROTOTYPE (seventh session, issue 6): lmhead_overlay with the products
 * formed by the tensor cores (bench/mma_probe.cu showed them exact when every
 * operand is zero or has an exponent field in [64, 190]) and the spec's sums
 * as FADDs. Built into bench/lmhead_microbench.cu with -DTOVL_MB_MMA_PROTO;
 * not part of the library.
 *
 * Tile: 16 rows (tokens) of one slot x 8 overlay rows, all 256 lanes, one
 * block of 8 warps per SM. Warp w owns lane groups c = w + 8i (i < 4), lanes
 * 8c .. 8c + 7: per 256-element window and group, D = X[16 x 8] * diag(w_r)
 * gives thread (g, q) the products of tokens g, g + 8 at lanes 8c + 2q, +1
 * for row r, added to its lane sums in increasing element order.
 * Tree: strides 128 and 64 pair groups i, i + 2 and i, i + 1 in the thread;
 * the 64 lanes left per cell go through shared memory, and one warp per cell
 * runs strides 32 (in the thread) and 16 .. 1 (shuffles), lower lane first.
 * Exactness: every staged word is checked (largest and smallest nonzero
 * magnitude); a tile with a word outside the range is recomputed the spec's
 * unfused way from global memory. h % 512 != 0 or unaligned rows: the
 * unfused way for every tile.
 */
#pragma once
#include "kernels/lmhead_overlay.cuh"

namespace tovl_mma {
using namespace tovl_cuda;

/* What lmhead_pick and lmhead_find_rows need of a config (LmheadShared too). */
#ifndef TOVL_MMA_WARPS
#define TOVL_MMA_WARPS 16
#endif
constexpr uint32_t BM = 16, BN = 8, WARPS = TOVL_MMA_WARPS, THREADS = 32 * WARPS;
constexpr uint32_t GPW = 32 / WARPS;       /* lane groups per warp: c = w + WARPS * i */
constexpr uint32_t LEFT = 8 * WARPS;       /* lanes per cell after the in-thread strides */
static_assert(GPW >= 2 && GPW % 2 == 0, "A is loaded two groups at a time");
struct PickCfg {
    static constexpr uint32_t BM = 16, BN = 8, THREADS = tovl_mma::THREADS, WARPS = tovl_mma::WARPS, STAGES = 1,
                              WORDS = 4, ROUND = 2;
};

constexpr uint32_t CHUNK = 512, PITCH = CHUNK + 8; /* elements; +16 B per row keeps ldmatrix off one bank */
#ifndef TOVL_MMA_STAGES
#define TOVL_MMA_STAGES 3
#endif
constexpr uint32_t STAGES = TOVL_MMA_STAGES;
constexpr uint32_t ROW_VECS = CHUNK / 8, VECS = (BM + BN) * ROW_VECS, JOBS = VECS / THREADS;
constexpr uint32_t TREE_PITCH = LEFT + 8; /* floats per cell */
#ifndef TOVL_MMA_TREE_UNROLL
#define TOVL_MMA_TREE_UNROLL 1
#endif
constexpr int TREE_UNROLL = TOVL_MMA_TREE_UNROLL;
static_assert(VECS % THREADS == 0, "staging divides evenly");

struct Stage {
    uint16_t x[BM][PITCH];
    uint16_t w[BN][PITCH];
};
constexpr size_t DYN_SMEM = STAGES * sizeof(Stage);
static_assert(BM * BN * TREE_PITCH * 4 <= DYN_SMEM, "the tree fits in the staging memory");

__device__ __forceinline__ void mma_16x8x8(float d[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "f"(0.0f));
}
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t r[2], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"((uint32_t)__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((uint32_t)__cvta_generic_to_shared(p)));
}

/* The spec's dot of one cell, unfused, from global memory: a warp, lane j
 * holding lanes j + 32u; then strides 128 .. 1. */
__device__ float dot_unfused(const uint16_t *x, const uint16_t *w, uint32_t h) {
    const uint32_t j = lane_id();
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t base = 0; base < h; base += 256) {
        TOVL_UNROLL
        for (uint32_t u = 0; u < 8; u++) {
            const uint32_t e = base + j + 32 * u;
            if (e < h) {
                p[u] = __fadd_rn(p[u], __fmul_rn(bf16_to_f32(ldg(x + e)), bf16_to_f32(ldg(w + e))));
            }
        }
    }
    TOVL_UNROLL
    for (uint32_t stride = 4; stride >= 1; stride /= 2) {
        TOVL_UNROLL
        for (uint32_t u = 0; u < stride; u++) p[u] = __fadd_rn(p[u], p[u + stride]);
    }
    float v = p[0];
    TOVL_UNROLL
    for (uint32_t stride = 16; stride >= 1; stride /= 2) v = __fadd_rn(v, __shfl_down_sync(FULL_MASK, v, stride));
    return v;
}

template <bool F32_LOGITS>
__device__ __forceinline__ void store_cell(const tovl_lmhead_overlay_args &a, uint32_t t, uint32_t id, float v) {
    const size_t at = (size_t)t * a.ld + id;
    if (F32_LOGITS) {
        ptr<uint32_t>(a.logits)[at] = f32_out_bits(v);
    } else {
        ptr<uint16_t>(a.logits)[at] = f32_to_bf16(v);
    }
}

/* Cells of the tile the unfused way: warp w takes cells w, w + 8, ... */
template <bool F32_LOGITS>
__device__ void tile_unfused(const tovl_lmhead_overlay_args &a, const uint32_t *rows, const uint32_t *ids,
                             const uint16_t *w_rows, uint32_t k0, uint32_t k_end) {
    const uint32_t warp = threadIdx.x / WARP;
    for (uint32_t cell = warp; cell < BM * BN; cell += WARPS) {
        const uint32_t m = cell / BN, r = cell % BN, t = rows[m], k = k0 + r;
        if (t == UINT32_MAX || k >= k_end || ids[r] >= a.vocab) continue; /* uniform in the warp */
        const float v = dot_unfused(ptr<const uint16_t>(a.hidden) + (size_t)t * a.h, w_rows + (size_t)k * a.h, a.h);
        if (lane_id() == 0) store_cell<F32_LOGITS>(a, t, ids[r], v);
    }
}

/* Largest magnitude and smallest nonzero magnitude minus one, per 16-bit half. */
__device__ __forceinline__ void range_note(uint32_t &mx, uint32_t &mn, uint32_t u0, uint32_t u1) {
    const uint32_t m0 = u0 & 0x7fff7fffu, m1 = u1 & 0x7fff7fffu;
    mx = __vimax3_u16x2(mx, m0, m1);
    mn = __viaddmin_u16x2(m0, 0xffffffffu, mn); /* a zero half becomes 0xffff: ignored */
    mn = __viaddmin_u16x2(m1, 0xffffffffu, mn);
}

#ifdef TOVL_MMA_PHASES /* %globaltimer at: start, rows found, loop done, tree done (thread 0, first tile) */
__device__ unsigned long long mma_phase[1024][4];
__device__ __forceinline__ void phase(int i) {
    if (threadIdx.x == 0 && blockIdx.y * gridDim.x + blockIdx.x < 1024) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        mma_phase[blockIdx.y * gridDim.x + blockIdx.x][i] = t;
    }
}
#else
__device__ __forceinline__ void phase(int) {}
#endif

template <bool F32_LOGITS>
__device__ void tile_mma(Stage *stage, float *tree, const tovl_lmhead_overlay_args &a, const uint32_t *rows,
                         const uint32_t *ids, const uint16_t *w_rows, uint32_t k0, uint32_t k_end) {
    const uint32_t h = a.h, tid = threadIdx.x, lane = lane_id(), warp = tid / WARP, g = lane / 4, q = lane % 4;
    const uint16_t *src[JOBS];
    TOVL_UNROLL
    for (uint32_t j = 0; j < JOBS; j++) {
        const uint32_t row = (tid + j * THREADS) / ROW_VECS;
        if (row < BM) {
            src[j] = rows[row] != UINT32_MAX ? ptr<const uint16_t>(a.hidden) + (size_t)rows[row] * h : nullptr;
        } else {
            const uint32_t k = k0 + row - BM;
            src[j] = k < k_end ? w_rows + (size_t)k * h : nullptr;
        }
    }
    const auto stage_chunk = [&](uint32_t c, uint32_t buf) {
        TOVL_UNROLL
        for (uint32_t j = 0; j < JOBS; j++) {
            const uint32_t v = tid + j * THREADS, row = v / ROW_VECS, col = 8 * (v % ROW_VECS);
            uint16_t *dst = row < BM ? &stage[buf].x[row][col] : &stage[buf].w[row - BM][col];
            if (src[j]) {
                copy16_async(dst, src[j] + (size_t)c * CHUNK + col);
            } else {
                store16(dst, uint4{0, 0, 0, 0});
            }
        }
    };
    const uint32_t chunks = h / CHUNK;
    __syncthreads(); /* the staging memory is free */
    TOVL_UNROLL
    for (uint32_t c = 0; c + 1 < STAGES; c++) {
        if (c < chunks) stage_chunk(c, c);
        copy_async_commit();
    }
    /* B's diagonal: thread (g, q) holds B[2q][g], B[2q+1][g]; only k == n is
     * nonzero, so threads with q == g / 2 keep half g % 2, the others zero. */
#ifdef TOVL_MMA_B_BROADCAST
    const uint32_t bmask = (g / 2 == q) ? ((g & 1) ? 0xffff0000u : 0x0000ffffu) : 0u;
#else
    /* B from one transposed load per group: thread (g, m) holds rows 2m, 2m + 1 at
     * element e0 + g; the diagonal thread takes them by shuffles within its quad and
     * moves each row's value to half g % 2 (the others take zeros). */
    const bool diag = g / 2 == q;
    const uint32_t sel_even = !diag ? 0x4444u : (g & 1) ? 0x1044u : 0x4410u;
    const uint32_t sel_odd = !diag ? 0x4444u : (g & 1) ? 0x3244u : 0x4432u;
#endif
    float acc[GPW][BN][4] = {};
    uint32_t mx = 0, mn = 0xffffffffu;
    /* ldmatrix addresses: A, lane L: token L % 16 of group pair member L / 16;
     * B (transposed, all 8 addresses of a matrix on one row): row L / 8. */
    const uint32_t a_tok = lane % 16, a_grp = lane / 16;
#ifdef TOVL_MMA_B_BROADCAST
    const uint32_t b_row = lane / 8;
#endif
    for (uint32_t c = 0; c < chunks; c++) {
        copy_async_wait<STAGES - 2>();
        __syncthreads();
#ifdef TOVL_MMA_NO_LOADS /* timing only: the first chunks stay staged, later ones reuse them */
        if (c + STAGES - 1 < chunks && c + STAGES - 1 < STAGES) stage_chunk(c + STAGES - 1, (c + STAGES - 1) % STAGES);
#else
        if (c + STAGES - 1 < chunks) stage_chunk(c + STAGES - 1, (c + STAGES - 1) % STAGES);
#endif
        copy_async_commit();
        const Stage &st = stage[c % STAGES];
#ifndef TOVL_MMA_NO_CHECK
        TOVL_UNROLL
        for (uint32_t j = 0; j < JOBS; j++) {
            const uint32_t v = tid + j * THREADS, row = v / ROW_VECS, col = 8 * (v % ROW_VECS);
            const uint4 u = *reinterpret_cast<const uint4 *>(row < BM ? &st.x[row][col] : &st.w[row - BM][col]);
            range_note(mx, mn, u.x, u.y);
            range_note(mx, mn, u.z, u.w);
        }
#endif
#ifdef TOVL_MMA_NO_COMPUTE /* timing only: stage and check, no products */
        if (c < 1)
#endif
        TOVL_UNROLL
        for (uint32_t win = 0; win < CHUNK / 256; win++) {
#ifndef TOVL_MMA_B_BROADCAST
            uint32_t wt[GPW]; /* group i: rows 2q, 2q + 1 at element e0(i) + g */
            if (GPW == 4) {
                ldsm_x4_trans(wt, &st.w[lane % 8][256 * win + 8 * (warp + WARPS * (lane / 8))]);
            } else {
                ldsm_x2_trans(wt, &st.w[lane % 8][256 * win + 8 * (warp + WARPS * ((lane / 8) % 2))]);
            }
#endif
            TOVL_UNROLL
            for (uint32_t ip = 0; ip < GPW; ip += 2) {
                uint32_t xa[4]; /* groups ip, ip + 1: tokens 0-7, 8-15 each */
                ldsm_x4(xa, &st.x[a_tok][256 * win + 8 * (warp + WARPS * (ip + a_grp))]);
                TOVL_UNROLL
                for (uint32_t ii = 0; ii < 2; ii++) {
                    const uint32_t i = ip + ii, e0 = 256 * win + 8 * (warp + WARPS * i);
                    uint32_t wb[8];
#ifdef TOVL_MMA_B_BROADCAST
                    ldsm_x4_trans(wb, &st.w[b_row][e0]);
                    ldsm_x4_trans(wb + 4, &st.w[4 + b_row][e0]);
                    TOVL_UNROLL
                    for (uint32_t r = 0; r < BN; r++) wb[r] &= bmask;
#else
                    (void)e0;
                    TOVL_UNROLL
                    for (uint32_t m = 0; m < 4; m++) {
                        const uint32_t pair = __shfl_sync(FULL_MASK, wt[i], 4 * g + m);
                        wb[2 * m] = __byte_perm(pair, 0u, sel_even);
                        wb[2 * m + 1] = __byte_perm(pair, 0u, sel_odd);
                    }
#endif
                    TOVL_UNROLL
                    for (uint32_t r = 0; r < BN; r++) {
                        float d[4];
                        mma_16x8x8(d, xa[2 * ii], xa[2 * ii + 1], wb[r]);
                        TOVL_UNROLL
                        for (uint32_t e = 0; e < 4; e++) acc[i][r][e] = __fadd_rn(acc[i][r][e], d[e]);
                    }
                }
            }
        }
    }
    copy_async_wait<0>();
    /* In range: every nonzero magnitude in [0x2000, 0x5f7f] (exponent field
     * 64 .. 190), i.e. mx <= 0x5f7f and mn >= 0x1fff per half. */
    const bool bad = __vcmpgtu2(mx, 0x5f7f5f7fu) != 0 || __vcmpltu2(mn, 0x1fff1fffu) != 0;
    phase(2);
    if (__syncthreads_or(bad)) {
        tile_unfused<F32_LOGITS>(a, rows, ids, w_rows, k0, k_end);
        return;
    }
    /* The strides that pair groups i of this thread; lanes 8w + 2q, +1 of cells (g, r), (g + 8, r) to shared memory. */
    TOVL_UNROLL
    for (uint32_t r = 0; r < BN; r++) {
        float v[4];
        TOVL_UNROLL
        for (uint32_t e = 0; e < 4; e++) {
            float p[GPW];
            TOVL_UNROLL
            for (uint32_t i = 0; i < GPW; i++) p[i] = acc[i][r][e];
            TOVL_UNROLL
            for (uint32_t st = GPW / 2; st >= 1; st /= 2)
                TOVL_UNROLL
            for (uint32_t i = 0; i < st; i++) p[i] = __fadd_rn(p[i], p[i + st]);
            v[e] = p[0];
        }
        *reinterpret_cast<float2 *>(&tree[(g * BN + r) * TREE_PITCH + 8 * warp + 2 * q]) = make_float2(v[0], v[1]);
        *reinterpret_cast<float2 *>(&tree[((g + 8) * BN + r) * TREE_PITCH + 8 * warp + 2 * q]) = make_float2(v[2], v[3]);
    }
    __syncthreads();
    /* Warp w finishes its cells: the strides down to 32 in the thread, 16 .. 1 by shuffles. */
    constexpr uint32_t CPW = BM * BN / WARPS;
#pragma unroll(TREE_UNROLL)
    for (uint32_t cell = CPW * warp; cell < CPW * warp + CPW; cell++) {
        float p[LEFT / 32];
        TOVL_UNROLL
        for (uint32_t u = 0; u < LEFT / 32; u++) p[u] = tree[cell * TREE_PITCH + lane + 32 * u];
        TOVL_UNROLL
        for (uint32_t st = LEFT / 64; st >= 1; st /= 2)
            TOVL_UNROLL
        for (uint32_t u = 0; u < st; u++) p[u] = __fadd_rn(p[u], p[u + st]);
        float v = p[0];
        TOVL_UNROLL
        for (uint32_t stride = 16; stride >= 1; stride /= 2) v = __fadd_rn(v, __shfl_down_sync(FULL_MASK, v, stride));
        const uint32_t m = cell / BN, r = cell % BN, t = rows[m], k = k0 + r;
        if (lane == 0 && t != UINT32_MAX && k < k_end && ids[r] < a.vocab) store_cell<F32_LOGITS>(a, t, ids[r], v);
    }
    __syncthreads();
    phase(3);
}

template <bool F32_LOGITS>
__global__ void __launch_bounds__(THREADS, 1) lmhead_mma(tovl_lmhead_overlay_args a) {
    __shared__ LmheadShared<PickCfg> sh;
    __shared__ uint32_t rows[BM], ids[BN];
    extern __shared__ __align__(16) unsigned char dyn[];
    Stage *stage = reinterpret_cast<Stage *>(dyn);
    uint32_t s, g;
    LmheadSlot cells;
    phase(0);
    if (!lmhead_pick<PickCfg>(sh, a, s, g, cells)) return;
    __syncthreads();
    const uint32_t len = lmhead_find_rows<PickCfg>(sh, a, s, g);
    if (threadIdx.x < BM) rows[threadIdx.x] = threadIdx.x < len ? sh.scan.rows[threadIdx.x] : UINT32_MAX;
#ifdef TOVL_MMA_FORCE_UNFUSED /* checks the unfused path on the bench workload */
    const bool fast = false;
#else
    const bool fast = a.h % CHUNK == 0 && ((a.hidden | (uint64_t)(uintptr_t)cells.rows) & 15u) == 0;
#endif
    for (uint32_t k0 = blockIdx.y * BN; k0 < cells.n; k0 += gridDim.y * BN) {
        const uint32_t k_end = min_of(k0 + BN, cells.n);
        __syncthreads(); /* rows written; the previous tile's ids read */
        if (threadIdx.x < BN) ids[threadIdx.x] = k0 + threadIdx.x < k_end ? ldg(cells.ids + k0 + threadIdx.x) : UINT32_MAX;
        __syncthreads();
        phase(1);
        if (fast) {
            tile_mma<F32_LOGITS>(stage, reinterpret_cast<float *>(dyn), a, rows, ids, cells.rows, k0, k_end);
        } else {
            tile_unfused<F32_LOGITS>(a, rows, ids, cells.rows, k0, k_end);
        }
    }
}

} // namespace tovl_mma
