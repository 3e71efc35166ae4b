/*
 * Prototype, kept in history only (see docs/PERFORMANCE.md, fifth session):
 * the lm_head overlay with transposed bf16 staging, 16 x 16 tiles at one block
 * per SM, four 64-lane passes, exact products fused behind an exponent check
 * made while staging, and a per-lane fix-up that recomputes the spec's way only
 * the (cell, lane) sums an element the check rejects touches. Bit-exact on the
 * H200 (microbenchmark, also with injected zeros, tiny, huge values); 23 us per
 * tile, no faster per SM than the kernel kept. Run: TOVL_MB_TX=1 lmhead_microbench.
 */
#ifndef LMHEAD_TX_CUH
#define LMHEAD_TX_CUH

#include "kernels/common.cuh"

#if defined(TX_TIMING)
__device__ unsigned long long tx_timing[3 * 4096];
#endif
namespace tovl_cuda {

struct Tx {
    static constexpr uint32_t THREADS = 256, WARPS = 8, BM = 16, BN = 16;
    static constexpr uint32_t CHUNK = 256;         /* spec lanes */
    static constexpr uint32_t STEP = 512;          /* elements of a row per step: two chunks */
    static constexpr uint32_t PASSES = 4;          /* 64 lanes each */
    static constexpr uint32_t ENTRY_WORDS = 16;    /* one lane of one chunk: 32 rows of bf16 */
    static constexpr uint32_t BUF_WORDS = 2 * 64 * ENTRY_WORDS; /* a step: 2 chunks x 64 lanes, 8 KB */
};

struct TxStage {
    uint32_t buf[2][Tx::BUF_WORDS];
    uint32_t bad_count[Tx::PASSES];
    uint32_t bad[Tx::PASSES][16]; /* tile row | pass lane << 8 */
};
union alignas(16) TxShared {
    TxStage stage;
    float tree[Tx::BM * Tx::BN][16];
    struct {
        uint32_t count[WARP];
        uint32_t pick[4];
        uint64_t rows, ids;
        uint32_t n;
    } pick;
    struct {
        uint32_t warp_count[Tx::WARPS];
        uint32_t rows[Tx::BM];
    } scan;
};

struct TxSlot {
    const uint16_t *rows;
    const uint32_t *ids;
    uint32_t n;
};

__device__ __forceinline__ uint32_t tx_rows_of(const tovl_lmhead_overlay_args &a, uint32_t s) {
    return min_of(ldg(ptr<const uint32_t>(a.n_table) + s), a.max_n);
}

/* Columns of BN overlay rows the grid covers (the rest are looped over). */
__device__ __forceinline__ uint32_t tx_columns(const tovl_lmhead_overlay_args &a) {
    return min_of((a.max_n + Tx::BN - 1) / Tx::BN, 65535u);
}

__device__ uint32_t tx_find_rows(TxShared &sh, const tovl_lmhead_overlay_args &a, uint32_t s, uint32_t g) {
    const uint32_t tid = threadIdx.x, lane = lane_id(), warp = tid / WARP;
    const uint64_t first = (uint64_t)g * Tx::BM;
    uint64_t found = 0;
    for (uint64_t base = 0; base < a.T && found < first + Tx::BM; base += Tx::THREADS) {
        const uint64_t t = base + tid;
        const bool mine = t < a.T && row_slot(a.row_slots, a.active_slot, (uint32_t)t) == (int32_t)s;
        const unsigned votes = __ballot_sync(FULL_MASK, mine);
        if (lane == 0) {
            sh.scan.warp_count[warp] = (uint32_t)__popc(votes);
        }
        __syncthreads();
        uint32_t before = 0, total = 0;
        for (uint32_t w = 0; w < Tx::WARPS; w++) {
            const uint32_t c = sh.scan.warp_count[w];
            before += w < warp ? c : 0u;
            total += c;
        }
        const uint64_t rank = found + before + (uint32_t)__popc(votes & lanes_below(lane));
        if (mine && rank >= first && rank < first + Tx::BM) {
            sh.scan.rows[rank - first] = (uint32_t)t;
        }
        found += total;
        __syncthreads();
    }
    return found > first ? (uint32_t)min_of<uint64_t>(found - first, Tx::BM) : 0u;
}

__device__ bool tx_pick(TxShared &sh, const tovl_lmhead_overlay_args &a, uint32_t &slot, uint32_t &group,
                        TxSlot &cells) {
    const uint32_t tid = threadIdx.x, lane = lane_id(), x = blockIdx.x / tx_columns(a), k0 = (blockIdx.x % tx_columns(a)) * Tx::BN;
    uint32_t before = 0;
    for (uint32_t base = 0; base < a.max_loras; base += WARP) {
        uint32_t n = 0;
        uint64_t rows = 0, ids = 0;
        if (tid < WARP && base + lane < a.max_loras) {
            n = tx_rows_of(a, base + lane);
            rows = ldg(ptr<const uint64_t>(a.rows_table) + base + lane);
            ids = ldg(ptr<const uint64_t>(a.ids_table) + base + lane);
        }
        __syncthreads();
        if (tid < WARP) {
            sh.pick.count[tid] = 0;
        }
        if (tid == 0) {
            sh.pick.pick[0] = 0;
        }
        __syncthreads();
        for (uint32_t t = tid; t < a.T; t += Tx::THREADS) {
            const int32_t s = row_slot(a.row_slots, a.active_slot, t);
            if (s >= 0 && (uint32_t)s - base < WARP && (uint32_t)s < a.max_loras) {
                atomicAdd(&sh.pick.count[(uint32_t)s - base], 1u);
            }
        }
        __syncthreads();
        if (tid < WARP) {
            const uint32_t s = base + lane;
            const bool live = s < a.max_loras && n > k0;
            const uint32_t groups = live ? (sh.pick.count[lane] + Tx::BM - 1) / Tx::BM : 0u;
            uint32_t end = groups;
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
            cells = TxSlot{ptr<const uint16_t>(sh.pick.rows), ptr<const uint32_t>(sh.pick.ids), sh.pick.n};
            return true;
        }
        before += sh.pick.pick[3];
    }
    return false;
}


/* 8 elements of a row from e, element by element, bf16 1.0 past h (rows
 * not 16-byte aligned, or the step that reaches past h). */
__device__ __forceinline__ uint4 tx_load8_slow(const uint16_t *row, uint32_t e, uint32_t h) {
    uint32_t word[4];
    TOVL_UNROLL
    for (uint32_t i = 0; i < 4; i++) {
        const uint32_t lo = e + 2 * i < h ? (uint32_t)ldg(row + e + 2 * i) : 0x3F80u;
        const uint32_t hi = e + 2 * i + 1 < h ? (uint32_t)ldg(row + e + 2 * i + 1) : 0x3F80u;
        word[i] = lo | hi << 16;
    }
    return uint4{word[0], word[1], word[2], word[3]};
}

template <bool VEC>
__device__ __forceinline__ uint4 tx_load8(const uint16_t *row, uint32_t e, uint32_t h) {
    if (VEC && e + 8 <= h) {
        return load16(row + e);
    }
    return tx_load8_slow(row, e, h);
}

/* d = w ^ (w << 1) has bit 14 (30) set when exponent bits 7 and 6 of the
 * low (high) bf16 differ, bit 13 (29) set when bits 6 and 5 differ. */
__device__ __forceinline__ uint32_t tx_expo_bits(uint32_t w) {
    return w ^ (w << 1);
}

/* One element's verdict: hidden exponent in [64, 192), overlay in [96, 160),
 * or +-0. Then every product is 0 or a normal f32 in [2^-94, 2^98), exact. */
__device__ __forceinline__ bool tx_element_ok(uint32_t bits16, bool overlay) {
    const uint32_t e = (bits16 >> 7) & 0xFFu;
    if ((bits16 & 0x7FFFu) == 0) {
        return true;
    }
    return overlay ? (e >= 96 && e < 160) : (e >= 64 && e < 192);
}

struct TxStager {
    const uint16_t *row_a, *row_b;
    uint32_t row;                 /* tile row of row_a (0..15 hidden, 16..31 overlay) */
    uint32_t lane0;               /* pass lane of element 0 of the vector */
    uint32_t elem0;               /* element offset within a step, before the pass's 16 p */
    uint32_t base_even, base_odd; /* word addresses within a buffer for even / odd i */
    uint32_t sel_even, sel_odd;
    bool overlay;
};

/* Rare path: record the elements of a staged pair of vectors that fail the
 * check (not zeros) for the pass's fix-up. */
__device__ void tx_record_bad(TxStage &sg, const TxStager &st, const uint4 &a, const uint4 &b, uint32_t pass) {
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
    for (uint32_t i = 0; i < 8; i++) {
        TOVL_UNROLL
        for (uint32_t which = 0; which < 2; which++) {
            const uint32_t word = which ? wb[i / 2] : wa[i / 2];
            const uint32_t bits = i % 2 ? word >> 16 : word & 0xFFFFu;
            if (!tx_element_ok(bits, st.overlay)) {
                const uint32_t at = atomicAdd(&sg.bad_count[pass], 1u);
                if (at < 16) {
                    sg.bad[pass][at] = (st.row + which) | (st.lane0 + i) << 8;
                }
            }
        }
    }
}

/* Stage a step's pair of vectors, transposed: word (lane, row pair) =
 * (row 2rp, row 2rp + 1) at that lane; checks them on the way. */
__device__ __forceinline__ void tx_store(TxStage &sg, uint32_t which_buf, const TxStager &st, const uint4 &a,
                                         const uint4 &b, uint32_t pass) {
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
    uint32_t all = ~0u, any = 0u;
    TOVL_UNROLL
    for (uint32_t i = 0; i < 4; i++) {
        const uint32_t da = tx_expo_bits(wa[i]), db = tx_expo_bits(wb[i]);
        all &= da & db;
        any |= da | db;
    }
    const bool ok = (all & 0x40004000u) == 0x40004000u && (!st.overlay || (any & 0x20002000u) == 0u);
    if (!ok) {
        tx_record_bad(sg, st, a, b, pass);
    }
    uint32_t *buf = sg.buf[which_buf];
    TOVL_UNROLL
    for (uint32_t i = 0; i < 8; i++) {
        const uint32_t word = __byte_perm(wa[i / 2], wb[i / 2], i % 2 ? st.sel_odd : st.sel_even);
        buf[(i % 2 ? st.base_odd : st.base_even) + 16 * i] = word;
    }
}

/* One chunk of a step for this thread's lane: 8 x 8 cells, exact products fused. */
__device__ __forceinline__ void tx_compute(const uint32_t *buf, uint32_t x_at, uint32_t w_at, float (&acc)[64]) {
    const uint4 xv = *reinterpret_cast<const uint4 *>(buf + x_at);
    const uint4 wv = *reinterpret_cast<const uint4 *>(buf + w_at);
    const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w}, ww[4] = {wv.x, wv.y, wv.z, wv.w};
    float w[8];
    TOVL_UNROLL
    for (uint32_t n = 0; n < 8; n++) {
        w[n] = n % 2 ? pair_hi(ww[n / 2]) : pair_lo(ww[n / 2]);
    }
    TOVL_UNROLL
    for (uint32_t m = 0; m < 8; m++) {
        const float x = m % 2 ? pair_hi(xw[m / 2]) : pair_lo(xw[m / 2]);
        TOVL_UNROLL
        for (uint32_t n = 0; n < 8; n++) {
            acc[m * 8 + n] = __fmaf_rn(x, w[n], acc[m * 8 + n]);
        }
    }
}

/* The spec's sum for one lane of one cell, unfused, from global memory. */
__device__ float tx_lane_dot(const uint16_t *x, const uint16_t *w, uint32_t l, uint32_t h) {
    float acc = 0.0f;
    for (uint32_t i = l; i < h; i += Tx::CHUNK) {
        acc = __fadd_rn(acc, __fmul_rn(bf16_to_f32(ldg(x + i)), bf16_to_f32(ldg(w + i))));
    }
    return acc;
}

template <bool F32_LOGITS, bool VEC>
__device__ void tx_tile(TxShared &sh, const tovl_lmhead_overlay_args &a, const TxSlot &slot,
                        const uint32_t (&tile_rows)[Tx::BM], uint32_t k0, uint32_t k_end,
                        uint32_t (&tile_ids)[Tx::BN]) {
    const uint32_t tid = threadIdx.x, h = a.h;
    const uint16_t *hidden = ptr<const uint16_t>(a.hidden);
    /* Absent rows are staged as copies of present ones (row 0, overlay row
     * k0): no special case in the loop; their cells are never stored. */
    const auto x_row = [&](uint32_t m) {
        const uint32_t t = tile_rows[m] != UINT32_MAX ? tile_rows[m] : tile_rows[0];
        return hidden + (size_t)t * h;
    };
    const auto w_row = [&](uint32_t n) {
        return slot.rows + (size_t)(k0 + n < k_end ? k0 + n : k0) * h;
    };
    TxStager st;
    {
        const uint32_t jj = tid >> 7, rp = (tid >> 3) & 15, ks = (tid >> 1) & 3, hs = tid & 1;
        st.overlay = rp >= 8;
        st.row = 2 * rp;
        st.row_a = st.overlay ? w_row(2 * rp - 16) : x_row(2 * rp);
        st.row_b = st.overlay ? w_row(2 * rp - 15) : x_row(2 * rp + 1);
        st.lane0 = 16 * ks + 8 * hs;
        st.elem0 = Tx::CHUNK * jj + 64 * ks + 8 * hs;
        const uint32_t base = jj * 1024 + (16 * ks + 8 * hs) * 16 + (((rp >> 2) ^ ks) * 4) + (rp & 3);
        st.base_even = base + 16 * hs;
        st.base_odd = base - 16 * hs;
        st.sel_even = hs ? 0x7632u : 0x5410u;
        st.sel_odd = hs ? 0x5410u : 0x7632u;
    }
    const uint32_t warp = tid / WARP, lane = lane_id();
    const uint32_t delta = lane & 1, k = (lane >> 1) & 3, cb = lane >> 3, mb = cb & 1, nb = cb >> 1;
    const uint32_t r = 2 * warp + delta, lambda = 16 * k + r;
    const uint32_t x_at = lambda * 16 + ((mb ^ k) * 4), w_at = lambda * 16 + (((2 + nb) ^ k) * 4);

    const uint32_t steps = (h + Tx::STEP - 1) / Tx::STEP, whole = h / Tx::STEP, total = Tx::PASSES * steps;
    /* Loads run ahead through the passes in the order 0, 2, 1, 3 (the tree's
     * stride 32 pairs passes 0 and 2, 1 and 3). */
    uint32_t load_pass = 0, load_step = 0;
    const auto load_next = [&](uint4 &va, uint4 &vb) {
        const uint32_t p = (load_pass & 1) * 2 + (load_pass >> 1);
        const uint32_t e = load_step * Tx::STEP + 16 * p + st.elem0;
        va = tx_load8<VEC>(st.row_a, e, h);
        vb = tx_load8<VEC>(st.row_b, e, h);
        if (++load_step == steps) {
            load_step = 0;
            load_pass++;
        }
    };
    uint4 a0, b0, a1, b1, a2, b2; /* steps g + 1 (next to be staged) and g + 2 (in flight) */
    __syncthreads(); /* shared memory free */
    if (tid < Tx::PASSES) {
        sh.stage.bad_count[tid] = 0;
    }
    load_next(a0, b0);
    if (1 < total) {
        load_next(a1, b1);
    }
    if (tid < Tx::BN) {
        tile_ids[tid] = k0 + tid < k_end ? ldg(slot.ids + k0 + tid) : UINT32_MAX;
    }
    __syncthreads(); /* bad_count is zero */
    tx_store(sh.stage, 0, st, a0, b0, 0);
    if (2 < total) {
        load_next(a2, b2);
    }
    __syncthreads();

    float acc[64];
    float held_a[16], held_b[16];
    const uint32_t h1 = (k >> 1) & 1, h2 = k & 1;
    uint32_t g = 0; /* steps computed */
    /* After computing step g: stage g + 1, start loading g + 3. */
    const auto advance = [&]() {
        if (g + 1 < total) {
            tx_store(sh.stage, (g + 1) & 1, st, a1, b1, (g + 1) / steps);
            a1 = a2;
            b1 = b2;
            if (g + 3 < total) {
                load_next(a2, b2);
            }
        }
        g++;
        __syncthreads();
    };
    for (uint32_t pi = 0; pi < Tx::PASSES; pi++) {
        const uint32_t p = (pi & 1) * 2 + (pi >> 1);
        TOVL_UNROLL
        for (uint32_t i = 0; i < 64; i++) {
            acc[i] = 0.0f;
        }
        for (uint32_t s = 0; s < whole; s++) {
            const uint32_t *buf = sh.stage.buf[g & 1];
            tx_compute(buf, x_at, w_at, acc);
            tx_compute(buf + 1024, x_at, w_at, acc);
            advance();
        }
        const uint32_t l = 64 * k + 16 * p + r; /* this thread's spec lane */
        if (whole < steps) { /* the step past the whole ones: lanes past h skip */
            const uint32_t *buf = sh.stage.buf[g & 1];
            const uint32_t e = whole * Tx::STEP + l;
            if (e < h) {
                tx_compute(buf, x_at, w_at, acc);
            }
            if (e + Tx::CHUNK < h) {
                tx_compute(buf + 1024, x_at, w_at, acc);
            }
            advance();
        }
        /* Fix-up: lanes with an element the check rejected are recomputed the
         * spec's way for the cells that element touches (all of them when too
         * many were found). The last advance() made the pass's list visible. */
        const uint32_t bad = sh.stage.bad_count[pi];
        if (bad != 0) {
            for (uint32_t c = 0; c < 64; c++) {
                const uint32_t m = mb * 8 + c / 8, n = nb * 8 + c % 8;
                bool redo = bad > 16;
                for (uint32_t j = 0; j < min_of(bad, 16u); j++) {
                    const uint32_t entry = sh.stage.bad[pi][j], row = entry & 0xFFu;
                    redo |= (entry >> 8) == lambda && (row == m || row == 16 + n);
                }
                if (redo) {
                    const float v = tx_lane_dot(x_row(m), w_row(n), l, h);
                    TOVL_UNROLL
                    for (uint32_t i = 0; i < 64; i++) {
                        if (i == c) {
                            acc[i] = v;
                        }
                    }
                }
            }
        }
        /* End of a pass: strides 128 and 64 (lanes k, k ^ 2 then k ^ 1: shuffles
         * xor 4 and xor 2), keeping 16 cells per thread. */
        float r1[32];
        TOVL_UNROLL
        for (uint32_t i = 0; i < 32; i++) {
            const float send = h1 ? acc[i] : acc[32 + i], mine = h1 ? acc[32 + i] : acc[i];
            r1[i] = __fadd_rn(mine, __shfl_xor_sync(FULL_MASK, send, 4));
        }
        TOVL_UNROLL
        for (uint32_t i = 0; i < 16; i++) {
            const float send = h2 ? r1[i] : r1[16 + i], mine = h2 ? r1[16 + i] : r1[i];
            const float v = __fadd_rn(mine, __shfl_xor_sync(FULL_MASK, send, 2));
            if (pi == 0) {
                held_a[i] = v;
            } else if (pi == 1) {
                held_a[i] = __fadd_rn(held_a[i], v); /* stride 32: lanes r, r + 32 */
            } else if (pi == 2) {
                held_b[i] = v;
            } else {
                held_b[i] = __fadd_rn(held_b[i], v); /* lanes 16 + r, 48 + r */
            }
        }
    }
    /* Stride 16, then the rest through shared memory: cell c's 16 lanes r. */
    TOVL_UNROLL
    for (uint32_t i = 0; i < 16; i++) {
        const uint32_t m = mb * 8 + 4 * h1 + 2 * h2 + i / 8, n = nb * 8 + i % 8;
        sh.tree[m * Tx::BN + n][r] = __fadd_rn(held_a[i], held_b[i]);
    }
    __syncthreads();
    {
        float v[16];
        TOVL_UNROLL
        for (uint32_t i = 0; i < 16; i++) {
            v[i] = sh.tree[tid][i];
        }
        TOVL_UNROLL
        for (uint32_t level = 0; level < 4; level++) {
            const uint32_t stride = 8u >> level;
            TOVL_UNROLL
            for (uint32_t i = 0; i < 8; i++) {
                if (i < stride) {
                    v[i] = __fadd_rn(v[i], v[i + stride]);
                }
            }
        }
        const uint32_t m = tid / Tx::BN, n = tid % Tx::BN, t = tile_rows[m], kk = k0 + n;
        if (t != UINT32_MAX && kk < k_end) {
            const uint32_t id = tile_ids[n];
            if (id < a.vocab) {
                const size_t cell_at = (size_t)t * a.ld + id;
                if (F32_LOGITS) {
                    ptr<uint32_t>(a.logits)[cell_at] = f32_out_bits(v[0]);
                } else {
                    ptr<uint16_t>(a.logits)[cell_at] = f32_to_bf16(v[0]);
                }
            }
        }
    }
}

template <bool F32_LOGITS>
__device__ void tx_lmhead(const tovl_lmhead_overlay_args &a) {
    __shared__ TxShared sh;
    __shared__ uint32_t tile_ids[Tx::BN];
    __shared__ uint32_t tile_rows[Tx::BM];
    const uint32_t tid = threadIdx.x;
#if defined(TX_TIMING)
    uint64_t t_start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_start));
#endif
    uint32_t s, g;
    TxSlot cells;
    if (!tx_pick(sh, a, s, g, cells)) {
        return;
    }
    __syncthreads();
    const uint32_t len = tx_find_rows(sh, a, s, g);
    if (tid < Tx::BM) {
        tile_rows[tid] = tid < len ? sh.scan.rows[tid] : UINT32_MAX;
    }
    const bool vectors = a.h % 8 == 0 && ((a.hidden | (uint64_t)(uintptr_t)cells.rows) & 15u) == 0;
    const uint32_t n = cells.n, columns = tx_columns(a);
    for (uint32_t k0 = (blockIdx.x % columns) * Tx::BN; k0 < n; k0 += columns * Tx::BN) {
        const uint32_t k_end = min_of(k0 + Tx::BN, n);
        if (vectors) {
            tx_tile<F32_LOGITS, true>(sh, a, cells, tile_rows, k0, k_end, tile_ids);
        } else {
            tx_tile<F32_LOGITS, false>(sh, a, cells, tile_rows, k0, k_end, tile_ids);
        }
    }
#if defined(TX_TIMING)
    if (tid == 0) {
        uint64_t t_end;
        uint32_t smid;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_end));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        tx_timing[3 * blockIdx.x] = t_start;
        tx_timing[3 * blockIdx.x + 1] = t_end;
        tx_timing[3 * blockIdx.x + 2] = smid;
    }
#endif
}

} // namespace tovl_cuda

TOVL_CUDA_KERNEL void __launch_bounds__(256, 1) lmhead_tx_bf16(tovl_lmhead_overlay_args args) {
    tovl_cuda::tx_lmhead<false>(args);
}
TOVL_CUDA_KERNEL void __launch_bounds__(256, 1) lmhead_tx_f32(tovl_lmhead_overlay_args args) {
    tovl_cuda::tx_lmhead<true>(args);
}

#endif
