/*
 * lmhead_overlay_{bf16,f32}: for row t with slot s valid and k < n[s] (and
 * < max_n), with id = ids[s][k] < vocab:
 *     logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :])
 * in the spec's fixed order, stored as f32 (canonical NaN) or bf16 (RNE).
 *
 * Work. Block (x, y) computes one tile: a group of BM rows of one slot s (in
 * increasing t) times overlay rows [y * BN, +BN) of s. Every block counts the
 * rows of each slot and takes the x-th of the groups of the slots that have
 * overlay rows in column y, so at most one block per slot finds nothing to
 * do; then it collects its group's rows with a ballot scan. Beyond CUDA's y
 * limit a block also does columns y + gridDim.y, ...
 *
 * The dot order. Write lane l = r + 32 j (r = 0..31, j = 0..7). Warp lane r
 * owns the spec's lanes r + 32 j; the 8 warps split the j among WJ lane
 * groups (group g takes j = g, g + WJ, ...: J = 8 / WJ each) and the tile's
 * cells among 8 / WJ cell groups (a TM x TN sub-tile each). A thread runs
 * one lane at a time through its 16 (h / 256) steps, so a cell costs it one
 * accumulator plus the pending sums of the tree: it takes its J lanes in the
 * order of the spec's tree (bit-reversed: j = 0, 4, 2, 6, 1, 5, 3, 7 for
 * J = 8) and adds each finished lane into the pending sums at once, as the
 * tree's strides 128, 64, 32 pair them (at most log2(J) + 1 sums live). The
 * lane groups' sums meet in shared memory (the same strides, across warps),
 * and strides 16 .. 1 pair warp lanes by shuffles. Products and sums are
 * __fmul_rn / __fadd_rn: never fused, rounded to nearest even. Elements past
 * h are skipped, not multiplied by zero (0 * Inf is NaN).
 *
 * Staging. A phase is IB steps of one lane of every thread: for each of the
 * BM + BN rows, the 32 WJ lanes' elements at those steps, converted to f32
 * once and stored so that each thread reads its own 4 steps of a row with one
 * 16-byte shared load: [row][group][step / 4][r][step % 4]. Two phase buffers
 * in dynamic shared memory, one barrier per phase; the next phase's global
 * loads are in registers while the current one is computed.
 */
#ifndef TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH
#define TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH

#include "common.cuh"

namespace tovl_cuda {

template <uint32_t BM_, uint32_t BN_, uint32_t WJ_, uint32_t IB_, uint32_t WCM_, uint32_t MIN_BLOCKS_>
struct LmheadConfig {
    static constexpr uint32_t MIN_BLOCKS = MIN_BLOCKS_; /* __launch_bounds__: resident blocks per SM */
    static constexpr uint32_t THREADS = TOVL_CUDA_LMHEAD_THREADS, WARPS = THREADS / WARP;
    static constexpr uint32_t BM = BM_, BN = BN_; /* tile: hidden rows x overlay rows */
    static constexpr uint32_t WJ = WJ_;           /* lane groups */
    static constexpr uint32_t J = 8 / WJ;         /* lanes per thread (j values) */
    static constexpr uint32_t LEVELS = J == 8 ? 3 : J == 4 ? 2 : J == 2 ? 1 : 0;
    static constexpr uint32_t WC = WARPS / WJ;    /* cell groups */
    static constexpr uint32_t WCM = WCM_, WCN = WC / WCM;
    static constexpr uint32_t TM = BM / WCM, TN = BN / WCN; /* a thread's cells */
    static constexpr uint32_t IB = IB_;           /* steps per phase */
    static constexpr uint32_t V = 4;              /* steps per shared load */
    static constexpr uint32_t ROWS = BM + BN;
    static constexpr uint32_t ROW_FLOATS = WJ * IB * WARP; /* one row of one phase */
    static constexpr uint32_t PHASE_FLOATS = ROWS * ROW_FLOATS;
    /* Staging jobs: (row, group, step quad, 4 lanes r): 4 loads of 8 bytes. */
    static constexpr uint32_t JOBS_TOTAL = ROWS * WJ * (IB / V) * (WARP / 4);
    static constexpr uint32_t JOBS = (JOBS_TOTAL + THREADS - 1) / THREADS; /* the last may be partial */
    static constexpr uint32_t CELLS = TM * TN;
    static_assert(THREADS == 256 && WJ * WC == WARPS && WCM * WCN == WC, "warp roles");
    static_assert(J * WJ == 8 && (1u << LEVELS) == J, "lane groups");
    static_assert(BM % WCM == 0 && BN % WCN == 0, "cell groups tile the block");
    static_assert(IB % V == 0, "whole shared loads per phase");
    static_assert(WJ == 1 || BM * BN * WJ * WARP <= 2 * PHASE_FLOATS, "the lane groups' sums fit the arena");
};

using LmheadLarge = LmheadConfig<TOVL_CUDA_LMHEAD_LARGE_BM, TOVL_CUDA_LMHEAD_LARGE_BN, TOVL_CUDA_LMHEAD_LARGE_WJ,
                                 TOVL_CUDA_LMHEAD_LARGE_IB, TOVL_CUDA_LMHEAD_LARGE_WCM,
                                 TOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS>;
using LmheadSmall = LmheadConfig<TOVL_CUDA_LMHEAD_SMALL_BM, TOVL_CUDA_LMHEAD_SMALL_BN, TOVL_CUDA_LMHEAD_SMALL_WJ,
                                 TOVL_CUDA_LMHEAD_SMALL_IB, TOVL_CUDA_LMHEAD_SMALL_WCM,
                                 TOVL_CUDA_LMHEAD_SMALL_MIN_BLOCKS>;
static_assert(2 * 4 * LmheadLarge::PHASE_FLOATS == TOVL_CUDA_LMHEAD_LARGE_SHARED, "large: shared bytes");
static_assert(2 * 4 * LmheadSmall::PHASE_FLOATS == TOVL_CUDA_LMHEAD_SMALL_SHARED, "small: shared bytes");

/* The static shared memory of a block (the phases are in dynamic memory). */
template <class C>
struct alignas(16) LmheadShared {
    uint32_t count[WARP];      /* rows per slot of the window */
    uint32_t pick[4];          /* found, slot, group; the window's groups */
    uint32_t warp_count[C::WARPS];
    uint32_t rows[C::BM];      /* the tile's hidden rows (t), UINT32_MAX: none */
};

/* The dynamic shared memory: two phase buffers, later the lane groups' sums. */
__device__ __forceinline__ float *lmhead_arena() {
#if defined(TOVL_CUDA_EMU)
    return tovl_emu::dynamic_shared<float>();
#else
    extern __shared__ uint4 tovl_lmhead_dynamic[];
    return reinterpret_cast<float *>(tovl_lmhead_dynamic);
#endif
}

/* Overlay rows of slot s the kernel computes: n[s], at most max_n. */
__device__ __forceinline__ uint32_t lmhead_rows_of(const tovl_lmhead_overlay_args &a, uint32_t s) {
    return min_of(ldg(ptr<const uint32_t>(a.n_table) + s), a.max_n);
}

/* Rows g * BM .. + BM of slot s, in increasing t, into sh.rows (UINT32_MAX
 * past the last). Stops scanning once the group is complete. */
template <class C>
__device__ void lmhead_find_rows(LmheadShared<C> &sh, const tovl_lmhead_overlay_args &a, uint32_t s, uint32_t g) {
    const uint32_t tid = threadIdx.x, lane = lane_id(), warp = tid / WARP;
    const uint64_t first = (uint64_t)g * C::BM;
    if (tid < C::BM) {
        sh.rows[tid] = UINT32_MAX;
    }
    uint64_t found = 0; /* rows of slot s before this pass; the same in every thread */
    for (uint64_t base = 0; base < a.T && found < first + C::BM; base += C::THREADS) {
        const uint64_t t = base + tid;
        const bool mine = t < a.T && row_slot(a.row_slots, a.active_slot, (uint32_t)t) == (int32_t)s;
        const unsigned votes = __ballot_sync(FULL_MASK, mine);
        if (lane == 0) {
            sh.warp_count[warp] = (uint32_t)__popc(votes);
        }
        __syncthreads(); /* also orders the UINT32_MAX fill before the writes below */
        uint32_t before = 0, total = 0;
        for (uint32_t w = 0; w < C::WARPS; w++) {
            const uint32_t c = sh.warp_count[w];
            before += w < warp ? c : 0u;
            total += c;
        }
        const uint64_t rank = found + before + (uint32_t)__popc(votes & lanes_below(lane));
        if (mine && rank >= first && rank < first + C::BM) {
            sh.rows[rank - first] = (uint32_t)t;
        }
        found += total;
        __syncthreads(); /* warp_count is rewritten by the next pass */
    }
}

/* Which (slot, row group) block x of column y does: the x-th, counting the
 * groups of BM rows of every slot with overlay rows in that column, slot by
 * slot. Slots are counted a window of 32 at a time (a warp scans them). */
template <class C>
__device__ bool lmhead_pick(LmheadShared<C> &sh, const tovl_lmhead_overlay_args &a, uint32_t &slot,
                            uint32_t &group) {
    const uint32_t tid = threadIdx.x, lane = lane_id(), x = blockIdx.x, k0 = blockIdx.y * C::BN;
    uint32_t before = 0; /* groups of the windows before; the same in every thread */
    for (uint32_t base = 0; base < a.max_loras; base += WARP) {
        __syncthreads(); /* the previous window's counts and pick are read */
        if (tid < WARP) {
            sh.count[tid] = 0;
        }
        if (tid == 0) {
            sh.pick[0] = 0;
        }
        __syncthreads();
        for (uint32_t t = tid; t < a.T; t += C::THREADS) {
            const int32_t s = row_slot(a.row_slots, a.active_slot, t);
            if (s >= 0 && (uint32_t)s - base < WARP && (uint32_t)s < a.max_loras) {
                atomicAdd(&sh.count[(uint32_t)s - base], 1u);
            }
        }
        __syncthreads();
        if (tid < WARP) {
            const uint32_t s = base + lane;
            const bool live = s < a.max_loras && lmhead_rows_of(a, s) > k0;
            const uint32_t groups = live ? (sh.count[lane] + C::BM - 1) / C::BM : 0u;
            uint32_t end = groups; /* inclusive scan over the window's slots */
            TOVL_UNROLL
            for (uint32_t d = 1; d < WARP; d *= 2) {
                const uint32_t v = __shfl_up_sync(FULL_MASK, end, d);
                end += lane >= d ? v : 0u;
            }
            const uint32_t start = before + end - groups;
            if (groups > 0 && x >= start && x < before + end) {
                sh.pick[0] = 1;
                sh.pick[1] = s;
                sh.pick[2] = x - start;
            }
            if (lane == WARP - 1) {
                sh.pick[3] = end;
            }
        }
        __syncthreads();
        if (sh.pick[0]) {
            slot = sh.pick[1];
            group = sh.pick[2];
            return true;
        }
        before += sh.pick[3];
    }
    return false;
}

/* j of the mi-th lane a thread of lane group g runs: the tree's order. */
template <class C>
__device__ __forceinline__ uint32_t lmhead_lane_class(uint32_t mi, uint32_t g) {
    uint32_t m = 0;
    TOVL_UNROLL
    for (int b = 0; b < (int)C::LEVELS; b++) { /* int: LEVELS may be 0 */
        m |= ((mi >> b) & 1u) << (C::LEVELS - 1 - b);
    }
    return g + C::WJ * m;
}

/* The global loads of one phase for this thread's staging jobs, as raw bf16
 * quads (0 past h or for an absent row). Phase p = (lane mi, step block ib). */
template <class C>
struct LmheadStage {
    uint2 v[C::JOBS][C::V];
};

template <class C>
__device__ __forceinline__ void lmhead_load(LmheadStage<C> &st, const uint16_t *const (&row_ptr)[C::JOBS],
                                            uint32_t p, uint32_t nib, uint32_t h, bool vectors) {
    const uint32_t mi = p / nib, ib = p % nib;
    TOVL_UNROLL
    for (uint32_t q = 0; q < C::JOBS; q++) {
        const uint32_t job = threadIdx.x + q * C::THREADS;
        const uint32_t rq = job % (WARP / 4), quad = (job / (WARP / 4)) % (C::IB / C::V);
        const uint32_t g = (job / (WARP / 4 * (C::IB / C::V))) % C::WJ;
        const uint32_t lane0 = 32 * lmhead_lane_class<C>(mi, g) + 4 * rq;
        const uint16_t *row = row_ptr[q];
        TOVL_UNROLL
        for (uint32_t v = 0; v < C::V; v++) {
            const uint32_t e = lane0 + 256 * (ib * C::IB + quad * C::V + v);
            uint2 x = uint2{0, 0};
            if (row) {
                if (vectors && e + 4 <= h) {
                    x = ldg(reinterpret_cast<const uint2 *>(row + e));
                } else {
                    uint32_t w[2] = {0, 0};
                    TOVL_UNROLL
                    for (uint32_t i = 0; i < 4; i++) {
                        if (e + i < h) {
                            w[i / 2] |= (uint32_t)ldg(row + e + i) << (16 * (i % 2));
                        }
                    }
                    x = uint2{w[0], w[1]};
                }
            }
            st.v[q][v] = x;
        }
    }
}

/* Converted to f32 and stored transposed: lane r's V steps side by side. */
template <class C>
__device__ __forceinline__ void lmhead_store(float *buf, const LmheadStage<C> &st) {
    TOVL_UNROLL
    for (uint32_t q = 0; q < C::JOBS; q++) {
        const uint32_t job = threadIdx.x + q * C::THREADS;
        const uint32_t rq = job % (WARP / 4), quad = (job / (WARP / 4)) % (C::IB / C::V);
        const uint32_t g = (job / (WARP / 4 * (C::IB / C::V))) % C::WJ;
        const uint32_t row = job / (WARP / 4 * (C::IB / C::V) * C::WJ);
        if (C::JOBS_TOTAL % C::THREADS != 0 && job >= C::JOBS_TOTAL) {
            continue;
        }
        float *dst = buf + row * C::ROW_FLOATS + (g * (C::IB / C::V) + quad) * (WARP * C::V) + 4 * rq * C::V;
        TOVL_UNROLL
        for (uint32_t rr = 0; rr < 4; rr++) {
            float f[C::V];
            TOVL_UNROLL
            for (uint32_t v = 0; v < C::V; v++) {
                const uint32_t word = rr < 2 ? st.v[q][v].x : st.v[q][v].y;
                f[v] = rr % 2 ? pair_hi(word) : pair_lo(word);
            }
            store16(dst + rr * C::V, uint4{__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                                           __float_as_uint(f[3])});
        }
    }
}

/* One phase's steps of the current lane into cur. PARTIAL: some steps reach
 * past h; `lane` is the spec lane, step0 the phase's first step. */
template <class C, bool PARTIAL>
__device__ __forceinline__ void lmhead_accumulate(const float *buf, float (&cur)[C::TM][C::TN], uint32_t g,
                                                  uint32_t cm, uint32_t cn, uint32_t r, uint32_t lane,
                                                  uint32_t step0, uint32_t h) {
    TOVL_UNROLL
    for (uint32_t quad = 0; quad < C::IB / C::V; quad++) {
        const uint32_t at = (g * (C::IB / C::V) + quad) * (WARP * C::V) + r * C::V;
        float4 x[C::TM], w[C::TN];
        TOVL_UNROLL
        for (uint32_t m = 0; m < C::TM; m++) {
            x[m] = *reinterpret_cast<const float4 *>(buf + (cm * C::TM + m) * C::ROW_FLOATS + at);
        }
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::TN; n++) {
            w[n] = *reinterpret_cast<const float4 *>(buf + (C::BM + cn * C::TN + n) * C::ROW_FLOATS + at);
        }
        TOVL_UNROLL
        for (uint32_t v = 0; v < C::V; v++) {
            if (!PARTIAL || lane + 256 * (step0 + quad * C::V + v) < h) {
                TOVL_UNROLL
                for (uint32_t m = 0; m < C::TM; m++) {
                    const float xv = v == 0 ? x[m].x : v == 1 ? x[m].y : v == 2 ? x[m].z : x[m].w;
                    TOVL_UNROLL
                    for (uint32_t n = 0; n < C::TN; n++) {
                        const float wv = v == 0 ? w[n].x : v == 1 ? w[n].y : v == 2 ? w[n].z : w[n].w;
                        cur[m][n] = __fadd_rn(cur[m][n], __fmul_rn(xv, wv));
                    }
                }
            }
        }
    }
}

/* The spec's strides 16 .. 1 over the warp's 32 lanes for 32 cells at once:
 * at stride s a thread keeps half its cells and trades the other half with
 * lane r ^ s, adding lower lane + upper lane as the spec pairs them. Thread r
 * ends with cell r's dot. */
__device__ __forceinline__ float lmhead_warp_tree32(float (&v)[32], uint32_t r) {
    TOVL_UNROLL
    for (uint32_t s = 16, n = 32; s >= 1; s /= 2, n /= 2) {
        const bool upper = (r & s) != 0;
        TOVL_UNROLL
        for (uint32_t k = 0; k < n / 2; k++) {
            const float send = upper ? v[k] : v[n / 2 + k];
            const float keep = upper ? v[n / 2 + k] : v[k];
            const float got = __shfl_xor_sync(FULL_MASK, send, s);
            v[k] = upper ? __fadd_rn(got, keep) : __fadd_rn(keep, got);
        }
    }
    return v[0];
}

/* Strides 16 .. 1 for one cell; the dot is on lane 0. */
__device__ __forceinline__ float lmhead_warp_tree(float sum) {
    TOVL_UNROLL
    for (uint32_t stride = WARP / 2; stride >= 1; stride /= 2) {
        sum = __fadd_rn(sum, __shfl_down_sync(FULL_MASK, sum, stride));
    }
    return sum;
}

template <bool F32_LOGITS>
__device__ __forceinline__ void lmhead_write(const tovl_lmhead_overlay_args &a, uint32_t t, uint32_t id, float dot) {
    if (t != UINT32_MAX && id < a.vocab) {
        const size_t cell_at = (size_t)t * a.ld + id;
        if (F32_LOGITS) {
            ptr<uint32_t>(a.logits)[cell_at] = f32_out_bits(dot);
        } else {
            ptr<uint16_t>(a.logits)[cell_at] = f32_to_bf16(dot);
        }
    }
}

/* One tile: the rows in sh.rows x overlay rows [k0, k_end) of slot s. Every
 * thread calls it. */
template <class C, bool F32_LOGITS>
__device__ void lmhead_tile(LmheadShared<C> &sh, const tovl_lmhead_overlay_args &a, uint32_t s, uint32_t k0,
                            uint32_t k_end) {
    const uint32_t h = a.h, tid = threadIdx.x, r = lane_id(), warp = tid / WARP;
    const uint32_t g = warp % C::WJ, cell_group = warp / C::WJ, cm = cell_group % C::WCM, cn = cell_group / C::WCM;
    const uint16_t *w_rows = ptr<const uint16_t>(ldg(ptr<const uint64_t>(a.rows_table) + s));
    const uint16_t *hidden = ptr<const uint16_t>(a.hidden);
    const bool vectors = h % 4 == 0 && ((a.hidden | (uint64_t)(uintptr_t)w_rows) & 7u) == 0;
    const uint16_t *row_ptr[C::JOBS];
    TOVL_UNROLL
    for (uint32_t q = 0; q < C::JOBS; q++) {
        const uint32_t row = (tid + q * C::THREADS) / (WARP / 4 * (C::IB / C::V) * C::WJ);
        if (row >= C::ROWS) {
            row_ptr[q] = nullptr; /* no such job */
        } else if (row < C::BM) {
            const uint32_t t = sh.rows[row];
            row_ptr[q] = t != UINT32_MAX ? hidden + (size_t)t * h : nullptr;
        } else {
            const uint32_t k = k0 + row - C::BM;
            row_ptr[q] = k < k_end ? w_rows + (size_t)k * h : nullptr;
        }
    }
    float *arena = lmhead_arena();
    const uint32_t steps = (h + TOVL_DOT_LANES - 1) / TOVL_DOT_LANES, nib = (steps + C::IB - 1) / C::IB;
    const uint32_t phases = C::J * nib;

    LmheadStage<C> st;
    lmhead_load<C>(st, row_ptr, 0, nib, h, vectors);
    __syncthreads(); /* the arena is free (previous tile) */
    lmhead_store<C>(arena, st);
    if (phases > 1) {
        lmhead_load<C>(st, row_ptr, 1, nib, h, vectors);
    }
    __syncthreads();

    float pend[C::LEVELS > 0 ? C::LEVELS : 1][C::TM][C::TN];
    float cur[C::TM][C::TN];
    uint32_t p = 0;
    TOVL_UNROLL
    for (uint32_t mi = 0; mi < C::J; mi++) {
        const uint32_t lane = r + 32 * lmhead_lane_class<C>(mi, g);
        TOVL_UNROLL
        for (uint32_t m = 0; m < C::TM; m++) {
            TOVL_UNROLL
            for (uint32_t n = 0; n < C::TN; n++) {
                cur[m][n] = 0.0f;
            }
        }
        for (uint32_t ib = 0; ib < nib; ib++, p++) {
            const float *buf = arena + (p % 2) * C::PHASE_FLOATS;
            if (256 * (ib * C::IB + C::IB) <= h) {
                lmhead_accumulate<C, false>(buf, cur, g, cm, cn, r, lane, ib * C::IB, h);
            } else {
                lmhead_accumulate<C, true>(buf, cur, g, cm, cn, r, lane, ib * C::IB, h);
            }
            if (p + 1 < phases) {
                lmhead_store<C>(arena + ((p + 1) % 2) * C::PHASE_FLOATS, st);
                if (p + 2 < phases) {
                    lmhead_load<C>(st, row_ptr, p + 2, nib, h, vectors);
                }
            }
            __syncthreads(); /* phase p + 1 is staged; nobody reads phase p */
        }
        /* Fold the finished lane into the pending sums (a binary counter over
         * mi: the tree's strides 128, 64, 32 in order, lower lanes left). */
        bool placed = false;
        TOVL_UNROLL
        for (int level = 0; level < (int)C::LEVELS; level++) { /* int: LEVELS may be 0 */
            if (!placed) {
                if ((mi >> level) & 1u) {
                    TOVL_UNROLL
                    for (uint32_t m = 0; m < C::TM; m++) {
                        TOVL_UNROLL
                        for (uint32_t n = 0; n < C::TN; n++) {
                            cur[m][n] = __fadd_rn(pend[level][m][n], cur[m][n]);
                        }
                    }
                } else {
                    TOVL_UNROLL
                    for (uint32_t m = 0; m < C::TM; m++) {
                        TOVL_UNROLL
                        for (uint32_t n = 0; n < C::TN; n++) {
                            pend[level][m][n] = cur[m][n];
                        }
                    }
                    placed = true;
                }
            }
        }
    }
    /* cur: this lane group's sum over its J lanes, for lane r + 32 g. */
    const uint32_t *ids = ptr<const uint32_t>(ldg(ptr<const uint64_t>(a.ids_table) + s));
    if (C::WJ == 1 && C::CELLS == 32) {
        float v[32];
        TOVL_UNROLL
        for (uint32_t c = 0; c < 32; c++) {
            v[c] = cur[c / C::TN][c % C::TN];
        }
        const float dot = lmhead_warp_tree32(v, r);
        const uint32_t m = r / C::TN, k = k0 + cn * C::TN + r % C::TN;
        if (k < k_end) {
            lmhead_write<F32_LOGITS>(a, sh.rows[cm * C::TM + m], ldg(ids + k), dot);
        }
    } else if (C::WJ == 1) {
        TOVL_UNROLL
        for (uint32_t c = 0; c < C::CELLS; c++) {
            const float dot = lmhead_warp_tree(cur[c / C::TN][c % C::TN]);
            const uint32_t m = c / C::TN, k = k0 + cn * C::TN + c % C::TN;
            if (r == 0 && k < k_end) {
                lmhead_write<F32_LOGITS>(a, sh.rows[cm * C::TM + m], ldg(ids + k), dot);
            }
        }
    } else {
        /* The lane groups meet: sums[cell][g][r] over the tile's cells. */
        float *sums = arena;
        TOVL_UNROLL
        for (uint32_t m = 0; m < C::TM; m++) {
            TOVL_UNROLL
            for (uint32_t n = 0; n < C::TN; n++) {
                const uint32_t cell = (cm * C::TM + m) * C::BN + cn * C::TN + n;
                sums[(cell * C::WJ + g) * WARP + r] = cur[m][n];
            }
        }
        __syncthreads();
        for (uint32_t cell = warp; cell < C::BM * C::BN; cell += C::WARPS) {
            float q[C::WJ];
            TOVL_UNROLL
            for (uint32_t gg = 0; gg < C::WJ; gg++) {
                q[gg] = sums[(cell * C::WJ + gg) * WARP + r];
            }
            TOVL_UNROLL
            for (uint32_t stride = C::WJ / 2; stride >= 1; stride /= 2) {
                TOVL_UNROLL
                for (uint32_t gg = 0; gg < stride; gg++) {
                    q[gg] = __fadd_rn(q[gg], q[gg + stride]);
                }
            }
            const float dot = lmhead_warp_tree(q[0]);
            const uint32_t k = k0 + cell % C::BN;
            if (r == 0 && k < k_end) {
                lmhead_write<F32_LOGITS>(a, sh.rows[cell / C::BN], ldg(ids + k), dot);
            }
        }
    }
}

template <class C, bool F32_LOGITS>
__device__ void lmhead_overlay(const tovl_lmhead_overlay_args &a) {
    __shared__ LmheadShared<C> sh;
    uint32_t s, g;
    if (!lmhead_pick<C>(sh, a, s, g)) {
        return; /* uniform: more blocks than groups */
    }
    const uint32_t n = lmhead_rows_of(a, s);
    __syncthreads(); /* the pick is read */
    lmhead_find_rows<C>(sh, a, s, g);
    /* Columns beyond CUDA's y limit: block y also does y + gridDim.y, ... */
    for (uint32_t k0 = blockIdx.y * C::BN; k0 < n; k0 += gridDim.y * C::BN) {
        lmhead_tile<C, F32_LOGITS>(sh, a, s, k0, min_of(k0 + C::BN, n));
    }
}

} // namespace tovl_cuda

#define TOVL_CUDA_LMHEAD_ENTRY(name, config, f32)                                                  \
    TOVL_CUDA_KERNEL void __launch_bounds__(config::THREADS, config::MIN_BLOCKS)                    \
        name(tovl_lmhead_overlay_args args) {                                                      \
        tovl_cuda::lmhead_overlay<config, f32>(args);                                              \
    }

TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_bf16, tovl_cuda::LmheadLarge, false)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_f32, tovl_cuda::LmheadLarge, true)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_bf16_small, tovl_cuda::LmheadSmall, false)
TOVL_CUDA_LMHEAD_ENTRY(lmhead_overlay_f32_small, tovl_cuda::LmheadSmall, true)

#endif /* TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH */
