/*
 * PROTOTYPE (sixth session, 2026-11-30; not the port's kernel): lmhead_overlay
 * with fused products checked where used, four lanes per thread and the
 * tree in registers. Measured in docs/PERFORMANCE.md (sixth session) and
 * reverted after this commit; build with bench/prototype-v3/build.sh.
 *
 * Work and pick as the kept kernel (a tile is BM = 8 rows of one slot times
 * BN = 2 * TN * warps / 2 overlay rows). Warps come in pairs: both warps of
 * pair p hold the same 8 x TN cells; the even warp holds the spec's even
 * lanes, the odd warp the odd ones, four per thread (lane 8j + 2i + half:
 * the low or high element of word 4j + i of each 256-element round), so
 * strides 128 .. 2 of the tree stay inside a warp (shuffles, a
 * reduce-scatter over the cells) and only stride 1 crosses to the other
 * warp. Products are __fmaf_rn: exact, because every bf16 product of two
 * values whose exponent fields lie in [64, 190] is an exact f32; each warp
 * checks its share of the staged words (one hidden row, TN / 2 overlay rows
 * per round: the 16-bit halves' largest magnitude and smallest nonzero one,
 * three VIMNMX3 instructions per two words), and a tile with a word outside
 * runs again with __fmul_rn / __fadd_rn.
 *
 * Switches (launch_shape.h here): TOVL_V3_TN, TOVL_V3_ROUNDS (256-element
 * rounds per staged chunk), TOVL_V3_STAGES, TOVL_V3_LEAN (whole chunks
 * staged by one cp.async per present row, absent rows zeroed once),
 * TOVL_V3_MINB, TOVL_CUDA_LMHEAD_THREADS (128 or 256); TOVL_V5=1 reads
 * operands straight from global memory through L1 (no staging, no barrier
 * in the loop) with L1 prefetches TOVL_V5_AHEAD rounds ahead. V3_TIMING
 * records %globaltimer per phase (thread 0 of each block); V3_NOLOAD stages
 * only the first chunks (compute alone, wrong results), V3_NOCOMP computes
 * only the first chunk (staging alone, wrong results).
 */
#ifndef TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH
#define TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH

#include "kernels/common.cuh" /* the port's; launch_shape.h is this folder's */

#ifdef V3_TIMING
__device__ unsigned long long v3_times[4096][6];
__device__ __forceinline__ unsigned long long v3_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define V3_MARK(k) do { if (threadIdx.x == 0) v3_times[blockIdx.x + gridDim.x * blockIdx.y][k] = v3_now(); } while (0)
#else
#define V3_MARK(k) do { } while (0)
#endif
namespace tovl_cuda {

/* max / min of each 16-bit half of three words (unsigned / signed): one
 * VIMNMX3 on sm_90. */
__device__ __forceinline__ uint32_t max3_u16x2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return __vimax3_u16x2(a, b, c);
#else
    uint32_t r = 0;
    for (int s = 0; s < 32; s += 16) {
        uint32_t x = (a >> s) & 0xFFFFu, y = (b >> s) & 0xFFFFu, z = (c >> s) & 0xFFFFu;
        uint32_t m = x > y ? x : y;
        m = m > z ? m : z;
        r |= m << s;
    }
    return r;
#endif
}
__device__ __forceinline__ uint32_t min3_s16x2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return __vimin3_s16x2(a, b, c);
#else
    uint32_t r = 0;
    for (int s = 0; s < 32; s += 16) {
        int16_t x = (int16_t)(a >> s), y = (int16_t)(b >> s), z = (int16_t)(c >> s);
        int16_t m = x < y ? x : y;
        m = m < z ? m : z;
        r |= (uint32_t)(uint16_t)m << s;
    }
    return r;
#endif
}


template <int TM_, int TN_, int ROUNDS_, int STAGES_, int MIN_BLOCKS_>
struct LmheadConfig {
    static constexpr uint32_t MIN_BLOCKS = MIN_BLOCKS_;
    static constexpr uint32_t TM = TM_, TN = TN_, ROUNDS = ROUNDS_, STAGES = STAGES_;
    static constexpr uint32_t THREADS = TOVL_CUDA_LMHEAD_THREADS, WARPS = THREADS / WARP, PAIRS = WARPS / 2;
    static constexpr uint32_t BM = TM, BN = PAIRS * TN;
    static constexpr uint32_t CHUNK = TOVL_DOT_LANES * ROUNDS; /* elements per row per chunk */
    static constexpr uint32_t WORDS = CHUNK / 2;
    static constexpr uint32_t ROW_VECS = WORDS / 4;
    static constexpr uint32_t X_VECS = BM * ROW_VECS, W_VECS = BN * ROW_VECS;
    static constexpr uint32_t X_JOBS = X_VECS / THREADS, JOBS = (X_VECS + W_VECS) / THREADS;
    static constexpr uint32_t CELLS = TM * TN; /* per warp */
    static constexpr uint32_t X_CHECK = TM / (2 * PAIRS), W_CHECK = TN / 2; /* rows each warp checks */
    static_assert(CELLS <= WARP && WARP % CELLS == 0, "the tree leaves one cell per lane group");
    static_assert(X_CHECK * 2 * PAIRS == TM && W_CHECK * 2 == TN, "check split");
    static_assert(X_VECS % THREADS == 0 && W_VECS % THREADS == 0, "staging jobs divide evenly");
    static_assert(STAGES >= 2, "one chunk computed while the next lands");
    static_assert(BM == TOVL_CUDA_LMHEAD_BM, "one row-group height");
};

using LmheadLarge = LmheadConfig<8, TOVL_V3_TN, TOVL_V3_ROUNDS, TOVL_V3_STAGES, TOVL_V3_MINB>;
using LmheadSmall = LmheadLarge;

template <class C>
union alignas(16) LmheadShared {
    struct {
        uint32_t x[C::STAGES][C::BM][C::WORDS];
        uint32_t w[C::STAGES][C::BN][C::WORDS];
    } stage;
    struct {
        uint32_t count[WARP];
        uint32_t pick[4];
        uint64_t rows, ids;
        uint32_t n;
    } pick;
    struct {
        uint32_t warp_count[C::WARPS];
        uint32_t rows[C::BM];
    } scan;
};

/* Memory a tile keeps outside the union. */
template <class C>
struct LmheadTileMem {
    uint32_t ids[C::BN];
    uint32_t rows[C::BM];
    float even[C::PAIRS][WARP]; /* the even lanes' sums, for the last stride */
};

__device__ __forceinline__ uint32_t lmhead_rows_of(const tovl_lmhead_overlay_args &a, uint32_t s) {
    return min_of(ldg(ptr<const uint32_t>(a.n_table) + s), a.max_n);
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

/* The 8 elements from e of a row (0 past h), as a 16-byte vector. */
__device__ __forceinline__ uint4 lmhead_load8(const uint16_t *row, uint32_t e, uint32_t h, bool vectors) {
    if (vectors && e + 8 <= h) {
        return load16(row + e);
    }
    uint32_t word[4] = {0, 0, 0, 0};
    TOVL_UNROLL
    for (uint32_t i = 0; i < 8; i++) {
        if (e + i < h) {
            word[i / 2] |= (uint32_t)ldg(row + e + i) << (16 * (i % 2));
        }
    }
    return uint4{word[0], word[1], word[2], word[3]};
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
        const uint32_t e = c * C::CHUNK + 2 * col;
        uint32_t *dst = j < C::X_JOBS ? &sh.stage.x[buf][v / C::ROW_VECS][col]
                                      : &sh.stage.w[buf][(v - C::X_VECS) / C::ROW_VECS][col];
        if (src[j] && vectors && e + 8 <= h) {
            copy16_async(dst, src[j] + e);
        } else {
            store16(dst, src[j] ? lmhead_load8(src[j], e, h, vectors) : uint4{0, 0, 0, 0});
        }
    }
}

/* Lane 2q + HALF of every cell: the product of the element HALF of each
 * hidden-row word and each overlay-row word, added to that lane's sum. Each
 * round of products is formed before it is added, so that ptxas has them in

/* Range check of staged words (bf16 pairs): per 16-bit half, the largest
 * (0x8000 | magnitude) and the smallest (0x8000 | magnitude) - 1 as signed
 * (zeros give +32767 there and so never count as small). */
struct LmheadCheck {
    uint32_t big = 0, small = 0x7FFF7FFFu;
    __device__ __forceinline__ void add(uint4 v) {
        const uint32_t a0 = v.x | 0x80008000u, a1 = v.y | 0x80008000u, a2 = v.z | 0x80008000u, a3 = v.w | 0x80008000u;
        big = max3_u16x2(big, a0, a1);
        big = max3_u16x2(big, a2, a3);
        small = min3_s16x2(small, a0 - 0x00010001u, a1 - 0x00010001u);
        small = min3_s16x2(small, a2 - 0x00010001u, a3 - 0x00010001u);
    }
    /* Every nonzero magnitude had an exponent field in [64, 190]: then any
     * product of two such bf16 values is an exact f32 (exponent sum in
     * [128, 380] within [119, 380]), and fma == fadd(fmul). */
    __device__ __forceinline__ bool fails() const {
        const uint32_t bhi = big >> 16, blo = big & 0xFFFFu;
        const int32_t shi = (int16_t)(small >> 16), slo = (int16_t)(small & 0xFFFFu);
        const uint32_t b = bhi > blo ? bhi : blo;
        const int32_t s = shi < slo ? shi : slo;
        return b > (0x8000u | (190u << 7) | 0x7Fu) || s < (int32_t)(64u << 7) - 32769;
    }
};

/* One 256-element round of a chunk. Warp half `half` of pair p holds the
 * spec's lanes 8j + 2i + half (i = 0..3) of 8 x 4 cells: word 4j + i of the
 * round, its low (half 0) or high (half 1) element. */
template <class C, bool FUSED, bool PARTIAL>
__device__ __forceinline__ void lmhead_round(const LmheadShared<C> &sh, float (&acc)[C::TM][C::TN][4], uint32_t buf,
                                             uint32_t r, uint32_t p, uint32_t half, uint32_t j, uint32_t valid,
                                             LmheadCheck &chk) {
    const uint32_t word0 = r * (TOVL_DOT_LANES / 2) + 4 * j;
    const uint32_t sel = half ? 0x3244u : 0x1044u; /* byte_perm: the element as the high half of an f32 */
    float wf[C::TN][4];
    TOVL_UNROLL
    for (uint32_t n = 0; n < C::TN; n++) {
        const uint4 v = *reinterpret_cast<const uint4 *>(&sh.stage.w[buf][p * C::TN + n][word0]);
        wf[n][0] = __uint_as_float(__byte_perm(v.x, 0, sel));
        wf[n][1] = __uint_as_float(__byte_perm(v.y, 0, sel));
        wf[n][2] = __uint_as_float(__byte_perm(v.z, 0, sel));
        wf[n][3] = __uint_as_float(__byte_perm(v.w, 0, sel));
    }
    if (FUSED) {
        TOVL_UNROLL
        for (uint32_t q = 0; q < C::X_CHECK; q++) {
            chk.add(*reinterpret_cast<const uint4 *>(&sh.stage.x[buf][(2 * p + half) * C::X_CHECK + q][word0]));
        }
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::W_CHECK; n++) {
            chk.add(*reinterpret_cast<const uint4 *>(&sh.stage.w[buf][p * C::TN + half * C::W_CHECK + n][word0]));
        }
    }
    bool ok[4];
    TOVL_UNROLL
    for (uint32_t i = 0; i < 4; i++) {
        ok[i] = !PARTIAL || r * TOVL_DOT_LANES + 8 * j + 2 * i + half < valid;
    }
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        const uint4 v = *reinterpret_cast<const uint4 *>(&sh.stage.x[buf][m][word0]);
        float xf[4];
        xf[0] = __uint_as_float(__byte_perm(v.x, 0, sel));
        xf[1] = __uint_as_float(__byte_perm(v.y, 0, sel));
        xf[2] = __uint_as_float(__byte_perm(v.z, 0, sel));
        xf[3] = __uint_as_float(__byte_perm(v.w, 0, sel));
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::TN; n++) {
            TOVL_UNROLL
            for (uint32_t i = 0; i < 4; i++) {
                if (ok[i]) {
                    acc[m][n][i] = FUSED ? __fmaf_rn(xf[i], wf[n][i], acc[m][n][i])
                                         : __fadd_rn(acc[m][n][i], __fmul_rn(xf[i], wf[n][i]));
                }
            }
        }
    }
}

/* Stages and computes every chunk of the tile into acc (zeroed here).
 * FUSED: returns whether this thread saw a word outside the checked range. */
template <class C, bool FUSED>
__device__ __forceinline__ bool lmhead_run(LmheadShared<C> &sh, float (&acc)[C::TM][C::TN][4],
                                           const uint16_t *const (&src)[C::JOBS], uint32_t h, bool vectors) {
    const uint32_t tid = threadIdx.x, warp = tid / WARP, p = warp / 2, half = warp % 2, j = lane_id();
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::TN; n++) {
            TOVL_UNROLL
            for (uint32_t i = 0; i < 4; i++) {
                acc[m][n][i] = 0.0f;
            }
        }
    }
    LmheadCheck chk;
    constexpr uint32_t STAGES = C::STAGES;
    const uint32_t chunks = (h + C::CHUNK - 1) / C::CHUNK;
    __syncthreads(); /* the shared memory is free */
    TOVL_UNROLL
    for (uint32_t c = 0; c + 1 < STAGES; c++) {
        if (c < chunks) {
            lmhead_stage<C>(sh, src, c, c, h, vectors);
        }
        copy_async_commit();
    }
    const uint32_t whole = h / C::CHUNK;
#if TOVL_V3_LEAN
    /* Whole chunks of 16-byte aligned rows: each thread's copies go to the
     * same place of every ring slot, so absent rows are zeroed there once
     * and their copies skipped. */
    uint32_t dst_at[C::JOBS];
    const uint16_t *from[C::JOBS];
    TOVL_UNROLL
    for (uint32_t jb = 0; jb < C::JOBS; jb++) {
        const uint32_t v = tid + jb * C::THREADS, col = 4 * (v % C::ROW_VECS);
        const uint32_t *dst = jb < C::X_JOBS ? &sh.stage.x[0][v / C::ROW_VECS][col]
                                             : &sh.stage.w[0][(v - C::X_VECS) / C::ROW_VECS][col];
        dst_at[jb] = (uint32_t)((const char *)dst - (const char *)&sh);
        from[jb] = src[jb] ? src[jb] + 2 * col : nullptr;
    }
    constexpr uint32_t X_SLOT = sizeof(sh.stage.x[0]), W_SLOT = sizeof(sh.stage.w[0]);
    const auto stage_whole = [&](uint32_t c, uint32_t buf) {
        TOVL_UNROLL
        for (uint32_t jb = 0; jb < C::JOBS; jb++) {
            if (from[jb]) {
                copy16_async((char *)&sh + dst_at[jb] + buf * (jb < C::X_JOBS ? X_SLOT : W_SLOT),
                             from[jb] + c * C::CHUNK);
            }
        }
    };
#endif
    const auto advance = [&](uint32_t c) {
        copy_async_wait<STAGES - 2>();
        __syncthreads();
        const uint32_t next = c + STAGES - 1;
#ifdef V3_NOLOAD
        if (next < STAGES - 1) {
#else
        if (next < chunks) {
#endif
#if TOVL_V3_LEAN
            if (vectors && next < whole) {
                stage_whole(next, next % STAGES);
            } else
#endif
            lmhead_stage<C>(sh, src, next, next % STAGES, h, vectors);
        }
        copy_async_commit();
    };
#if TOVL_V3_LEAN
    if (vectors) {
        TOVL_UNROLL
        for (uint32_t jb = 0; jb < C::JOBS; jb++) {
            if (!from[jb]) {
                for (uint32_t b = 0; b < STAGES; b++) {
                    store16((char *)&sh + dst_at[jb] + b * (jb < C::X_JOBS ? X_SLOT : W_SLOT), uint4{0, 0, 0, 0});
                }
            }
        }
    }
#endif
    for (uint32_t c = 0; c < whole; c++) {
        advance(c);
        TOVL_UNROLL
        for (uint32_t r = 0; r < C::ROUNDS; r++) {
#ifdef V3_NOCOMP
            if (c == 0)
#endif
            lmhead_round<C, FUSED, false>(sh, acc, c % STAGES, r, p, half, j, C::CHUNK, chk);
        }
    }
    if (whole < chunks) {
        advance(whole);
        const uint32_t valid = h - whole * C::CHUNK;
        for (uint32_t r = 0; r * TOVL_DOT_LANES < valid; r++) {
            lmhead_round<C, FUSED, true>(sh, acc, whole % STAGES, r, p, half, j, valid, chk);
        }
    }
    copy_async_wait<0>();
    return FUSED && chk.fails();
}

/* One level of the tree below: lanes l and l + 8M (threads j, j ^ M) of the
 * first K cells of v; the lower half of those cells stays with the thread
 * whose bit M is clear, the upper half with its partner (reduce-scatter). */
template <uint32_t M, uint32_t K>
__device__ __forceinline__ void lmhead_tree_level(float (&v)[WARP][4], uint32_t j) {
    const bool upper = (j & M) != 0;
    TOVL_UNROLL
    for (uint32_t c = 0; c < K / 2; c++) {
        TOVL_UNROLL
        for (uint32_t i = 0; i < 4; i++) {
            const float keep = upper ? v[c + K / 2][i] : v[c][i], send = upper ? v[c][i] : v[c + K / 2][i];
            const float got = __shfl_xor_sync(FULL_MASK, send, M);
            v[c][i] = upper ? __fadd_rn(got, keep) : __fadd_rn(keep, got);
        }
    }
}

/* The spec's tree over this warp's lanes of its cells, leaving cell
 * j / (32 / CELLS)'s sum of the warp's 128 lanes in lane j (the lowest lane
 * of its group). Strides 128 .. 8 (lanes l, l + 8M: threads j, j ^ M) as a
 * reduce-scatter over the cells, then 4 and 2. */
template <class C>
__device__ __forceinline__ float lmhead_tree(float (&acc)[C::TM][C::TN][4], uint32_t j) {
    float v[WARP][4];
    TOVL_UNROLL
    for (uint32_t c = 0; c < C::CELLS; c++) {
        TOVL_UNROLL
        for (uint32_t i = 0; i < 4; i++) {
            v[c][i] = acc[c / C::TN][c % C::TN][i];
        }
    }
    if (C::CELLS == 32) {
        lmhead_tree_level<16, 32>(v, j);
        lmhead_tree_level<8, 16>(v, j);
        lmhead_tree_level<4, 8>(v, j);
        lmhead_tree_level<2, 4>(v, j);
        lmhead_tree_level<1, 2>(v, j);
        return __fadd_rn(__fadd_rn(v[0][0], v[0][2]), __fadd_rn(v[0][1], v[0][3]));
    }
    static_assert(C::CELLS == 32 || C::CELLS == 16, "16 or 32 cells per warp");
    lmhead_tree_level<16, 16>(v, j);
    lmhead_tree_level<8, 8>(v, j);
    lmhead_tree_level<4, 4>(v, j);
    lmhead_tree_level<2, 2>(v, j);
    /* Threads j, j ^ 1 share one cell: stride 8 (lanes i, i + 4 of the
     * quad's lanes) leaves i = 0, 1 to the lower, 2, 3 to the upper. */
    const bool upper = (j & 1u) != 0;
    float q[2];
    TOVL_UNROLL
    for (uint32_t i = 0; i < 2; i++) {
        const float keep = upper ? v[0][i + 2] : v[0][i], send = upper ? v[0][i] : v[0][i + 2];
        const float got = __shfl_xor_sync(FULL_MASK, send, 1);
        q[i] = upper ? __fadd_rn(got, keep) : __fadd_rn(keep, got);
    }
    /* Stride 4 pairs the lower's q[0] (lane 0) with the upper's q[0] (lane 2),
     * the lower's q[1] with the upper's q[1]: the lower takes the first sum,
     * the upper the second; stride 2 then adds them in the lower thread. */
    const float got = __shfl_xor_sync(FULL_MASK, upper ? q[0] : q[1], 1);
    const float s = upper ? __fadd_rn(q[1], got) : __fadd_rn(q[0], got);
    const float other = __shfl_xor_sync(FULL_MASK, s, 1);
    return upper ? 0.0f : __fadd_rn(s, other);
}


#if TOVL_V5
__device__ __forceinline__ void prefetch_l1(const void *p) {
#if defined(__CUDA_ARCH__)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#endif
}

/* One 256-element round read straight from global memory (through L1):
 * the same lanes and order as lmhead_round. e: element of word 4j. */
template <class C, bool FUSED, bool GENERIC>
__device__ __forceinline__ void lmhead_round_direct(float (&acc)[C::TM][C::TN][4], const uint16_t *const (&xr)[C::TM],
                                                    const uint16_t *const (&wr)[C::TN], const uint16_t *xc,
                                                    const uint16_t *wc0, const uint16_t *wc1, uint32_t e, uint32_t h,
                                                    bool vectors, uint32_t half, LmheadCheck &chk) {
    const auto load = [&](const uint16_t *row) { return GENERIC ? lmhead_load8(row, e, h, vectors) : load16(row + e); };
    const uint32_t sel = half ? 0x3244u : 0x1044u;
    float wf[C::TN][4];
    TOVL_UNROLL
    for (uint32_t n = 0; n < C::TN; n++) {
        const uint4 v = load(wr[n]);
        wf[n][0] = __uint_as_float(__byte_perm(v.x, 0, sel));
        wf[n][1] = __uint_as_float(__byte_perm(v.y, 0, sel));
        wf[n][2] = __uint_as_float(__byte_perm(v.z, 0, sel));
        wf[n][3] = __uint_as_float(__byte_perm(v.w, 0, sel));
    }
    if (FUSED) {
        chk.add(load(xc));
        chk.add(load(wc0));
        chk.add(load(wc1));
    }
    bool ok[4];
    TOVL_UNROLL
    for (uint32_t i = 0; i < 4; i++) {
        ok[i] = !GENERIC || e + 2 * i + half < h;
    }
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        const uint4 v = load(xr[m]);
        float xf[4];
        xf[0] = __uint_as_float(__byte_perm(v.x, 0, sel));
        xf[1] = __uint_as_float(__byte_perm(v.y, 0, sel));
        xf[2] = __uint_as_float(__byte_perm(v.z, 0, sel));
        xf[3] = __uint_as_float(__byte_perm(v.w, 0, sel));
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::TN; n++) {
            TOVL_UNROLL
            for (uint32_t i = 0; i < 4; i++) {
                if (ok[i]) {
                    acc[m][n][i] = FUSED ? __fmaf_rn(xf[i], wf[n][i], acc[m][n][i])
                                         : __fadd_rn(acc[m][n][i], __fmul_rn(xf[i], wf[n][i]));
                }
            }
        }
    }
}

template <class C, bool FUSED>
__device__ __forceinline__ bool lmhead_run_direct(float (&acc)[C::TM][C::TN][4], const uint16_t *const (&xr)[C::TM],
                                                  const uint16_t *const (&wr)[C::TN], const uint16_t *xc,
                                                  const uint16_t *wc0, const uint16_t *wc1, const uint16_t *pf,
                                                  uint32_t h, bool vectors, uint32_t half, uint32_t j) {
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::TN; n++) {
            TOVL_UNROLL
            for (uint32_t i = 0; i < 4; i++) {
                acc[m][n][i] = 0.0f;
            }
        }
    }
    LmheadCheck chk;
    const uint32_t whole = h / TOVL_DOT_LANES, rounds = (h + TOVL_DOT_LANES - 1) / TOVL_DOT_LANES;
#if TOVL_V5_AHEAD > 0
    if (pf) {
        for (uint32_t r = 0; r < TOVL_V5_AHEAD && r < rounds; r++) {
            prefetch_l1(pf + r * TOVL_DOT_LANES);
        }
    }
#endif
    uint32_t r = 0;
    if (vectors) {
        for (; r + C::ROUNDS <= whole; r += C::ROUNDS) {
            TOVL_UNROLL
            for (uint32_t u = 0; u < C::ROUNDS; u++) {
#if TOVL_V5_AHEAD > 0
                if (pf && r + u + TOVL_V5_AHEAD < rounds) {
                    prefetch_l1(pf + (r + u + TOVL_V5_AHEAD) * TOVL_DOT_LANES);
                }
#endif
                lmhead_round_direct<C, FUSED, false>(acc, xr, wr, xc, wc0, wc1, (r + u) * TOVL_DOT_LANES + 8 * j, h,
                                                     vectors, half, chk);
            }
        }
    }
    for (; r < rounds; r++) {
        lmhead_round_direct<C, FUSED, true>(acc, xr, wr, xc, wc0, wc1, r * TOVL_DOT_LANES + 8 * j, h, vectors, half,
                                            chk);
    }
    return FUSED && chk.fails();
}
#endif

template <class C, bool F32_LOGITS>
__device__ void lmhead_tile(LmheadShared<C> &sh, LmheadTileMem<C> &tm, const tovl_lmhead_overlay_args &a,
                            const LmheadSlot &slot, const uint16_t *const (&x_src)[C::X_JOBS], uint32_t k0,
                            uint32_t k_end) {
    const uint32_t h = a.h, tid = threadIdx.x;
    const uint16_t *w_rows = slot.rows;
    const bool vectors = h % 8 == 0 && ((a.hidden | (uint64_t)(uintptr_t)w_rows) & 15u) == 0;
    const uint16_t *src[C::JOBS];
    TOVL_UNROLL
    for (uint32_t jb = 0; jb < C::JOBS; jb++) {
        const uint32_t v = tid + jb * C::THREADS;
        if (jb < C::X_JOBS) {
            src[jb] = x_src[jb];
        } else {
            const uint32_t k = k0 + (v - C::X_VECS) / C::ROW_VECS;
            src[jb] = k < k_end ? w_rows + (size_t)k * h : nullptr;
        }
    }
    if (tid < C::BN) {
        tm.ids[tid] = k0 + tid < k_end ? ldg(slot.ids + k0 + tid) : UINT32_MAX;
    }
    float acc[C::TM][C::TN][4];
    const uint32_t warp = tid / WARP, p = warp / 2, half = warp % 2, j = lane_id();
#if TOVL_V5
    (void)src;
    __syncthreads(); /* tm.ids / tm.rows are written */
    const uint16_t *hidden = ptr<const uint16_t>(a.hidden);
    const uint16_t *xr[C::TM], *wr[C::TN];
    TOVL_UNROLL
    for (uint32_t m = 0; m < C::TM; m++) {
        const uint32_t t = tm.rows[m] != UINT32_MAX ? tm.rows[m] : tm.rows[0];
        xr[m] = hidden + (size_t)t * h;
    }
    TOVL_UNROLL
    for (uint32_t n = 0; n < C::TN; n++) {
        const uint32_t k = k0 + p * C::TN + n;
        wr[n] = w_rows + (size_t)(k < k_end ? k : k0) * h;
    }
    const uint16_t *xc = hidden + (size_t)(tm.rows[2 * p + half] != UINT32_MAX ? tm.rows[2 * p + half] : tm.rows[0]) * h;
    const uint16_t *wc0 = half ? wr[2] : wr[0], *wc1 = half ? wr[3] : wr[1];
    /* Prefetch: thread L < 24 * 4 brings line L % 4 of the tile's row L / 4 into L1, AHEAD rounds early. */
    const uint16_t *pf = nullptr;
    if (tid < (C::BM + C::BN) * 4) {
        const uint32_t row = tid / 4, part = tid % 4;
        if (row < C::BM) {
            const uint32_t t = tm.rows[row];
            pf = t != UINT32_MAX ? hidden + (size_t)t * h + part * 64 : nullptr;
        } else {
            const uint32_t k = k0 + row - C::BM;
            pf = k < k_end ? w_rows + (size_t)k * h + part * 64 : nullptr;
        }
        if (!vectors) {
            pf = nullptr;
        }
    }
    const bool bad = lmhead_run_direct<C, true>(acc, xr, wr, xc, wc0, wc1, pf, h, vectors, half, j);
    V3_MARK(3);
    if (__syncthreads_or(bad)) {
        lmhead_run_direct<C, false>(acc, xr, wr, xc, wc0, wc1, pf, h, vectors, half, j);
    }
#else
    const bool bad = lmhead_run<C, true>(sh, acc, src, h, vectors);
    V3_MARK(3);
    if (__syncthreads_or(bad)) {
        lmhead_run<C, false>(sh, acc, src, h, vectors);
    }
#endif
    const float sum = lmhead_tree<C>(acc, j);
    V3_MARK(4);
    constexpr uint32_t GROUP = WARP / C::CELLS; /* lanes per cell after the tree */
    const uint32_t cell = j / GROUP;
    if (half == 0 && j % GROUP == 0) {
        tm.even[p][cell] = sum;
    }
    __syncthreads();
    if (half == 1 && j % GROUP == 0) {
        const float v = __fadd_rn(tm.even[p][cell], sum);
        const uint32_t m = cell / C::TN, k = k0 + p * C::TN + cell % C::TN, t = tm.rows[m];
        if (t != UINT32_MAX && k < k_end) {
            const uint32_t id = tm.ids[k - k0];
            if (id < a.vocab) {
                const size_t cell_at = (size_t)t * a.ld + id;
                if (F32_LOGITS) {
                    ptr<uint32_t>(a.logits)[cell_at] = f32_out_bits(v);
                } else {
                    ptr<uint16_t>(a.logits)[cell_at] = f32_to_bf16(v);
                }
            }
        }
    }
    __syncthreads(); /* tm is rewritten by the next tile */
}

template <class C>
__device__ bool lmhead_pick(LmheadShared<C> &sh, const tovl_lmhead_overlay_args &a, uint32_t &slot,
                            uint32_t &group, LmheadSlot &cells) {
    const uint32_t tid = threadIdx.x, lane = lane_id(), x = blockIdx.x, k0 = blockIdx.y * C::BN;
    uint32_t before = 0; /* groups of the windows before; the same in every thread */
    for (uint32_t base = 0; base < a.max_loras; base += WARP) {
        /* The window's table cells, loaded alongside the row slots below
         * (one global round trip instead of three in a row). */
        uint32_t n = 0;
        uint64_t rows = 0, ids = 0;
        if (tid < WARP && base + lane < a.max_loras) {
            n = lmhead_rows_of(a, base + lane);
            rows = ldg(ptr<const uint64_t>(a.rows_table) + base + lane);
            ids = ldg(ptr<const uint64_t>(a.ids_table) + base + lane);
        }
        __syncthreads(); /* the previous window's counts and pick are read */
        if (tid < WARP) {
            sh.pick.count[tid] = 0;
        }
        if (tid == 0) {
            sh.pick.pick[0] = 0;
        }
        __syncthreads();
        for (uint32_t t = tid; t < a.T; t += C::THREADS) {
            const int32_t s = row_slot(a.row_slots, a.active_slot, t);
            if (s >= 0 && (uint32_t)s - base < WARP && (uint32_t)s < a.max_loras) {
                atomicAdd(&sh.pick.count[(uint32_t)s - base], 1u);
            }
        }
        __syncthreads();
        if (tid < WARP) {
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
        }
        __syncthreads();
        if (sh.pick.pick[0]) {
            slot = sh.pick.pick[1];
            group = sh.pick.pick[2];
            cells = LmheadSlot{ptr<const uint16_t>(sh.pick.rows), ptr<const uint32_t>(sh.pick.ids), sh.pick.n};
            return true;
        }
        before += sh.pick.pick[3];
    }
    return false;
}

template <class C, bool F32_LOGITS>
__device__ void lmhead_overlay(const tovl_lmhead_overlay_args &a) {
    extern __shared__ uint4 lmhead_dynamic_shared[];
    LmheadShared<C> &sh = *reinterpret_cast<LmheadShared<C> *>(lmhead_dynamic_shared);
    __shared__ LmheadTileMem<C> tm;
    const uint32_t tid = threadIdx.x;
    uint32_t s, g;
    LmheadSlot cells;
    V3_MARK(0);
    if (!lmhead_pick<C>(sh, a, s, g, cells)) {
        return; /* uniform: more blocks than groups */
    }
    const uint32_t n = cells.n;
    __syncthreads(); /* the pick is read */
    V3_MARK(1);
    const uint32_t len = lmhead_find_rows<C>(sh, a, s, g);
    V3_MARK(2);
    /* The tile's rows, kept in registers: the shared memory is reused. */
    const uint16_t *x_src[C::X_JOBS];
    TOVL_UNROLL
    for (uint32_t j = 0; j < C::X_JOBS; j++) {
        const uint32_t r = (tid + j * C::THREADS) / C::ROW_VECS;
        x_src[j] = r < len ? ptr<const uint16_t>(a.hidden) + (size_t)sh.scan.rows[r] * a.h : nullptr;
    }
    if (tid < C::BM) {
        tm.rows[tid] = tid < len ? sh.scan.rows[tid] : UINT32_MAX;
    }
    /* Columns beyond CUDA's y limit: block y also does y + gridDim.y, ... */
    for (uint32_t k0 = blockIdx.y * C::BN; k0 < n; k0 += gridDim.y * C::BN) {
        lmhead_tile<C, F32_LOGITS>(sh, tm, a, cells, x_src, k0, min_of(k0 + C::BN, n));
    }
    V3_MARK(5);
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

static const size_t lmhead_dynamic_bytes = TOVL_V5 ? 1024 : sizeof(tovl_cuda::LmheadShared<tovl_cuda::LmheadLarge>);
#endif /* TOVL_CUDA_KERNELS_LMHEAD_OVERLAY_CUH */

