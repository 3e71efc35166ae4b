/*
 * Probe: the lm_head dot with lanes in slices.  (Thirteenth session, issue 6;
 * not part of the library; docs/PERFORMANCE.md, "Thirteenth session".)
 *
 * The kept tile kernels hold all 256 of the spec's lanes of every cell at
 * once (two lanes of 8 x 4 cells per thread), so the register file caps a
 * block's cells, and with them how often each row fetched from L2 is reused.
 * But the spec's tree pairs lane l with l + 128 first, then l + 64, l + 32,
 * so lanes can be worked a slice at a time, or each slice by its own warp:
 *
 * - laneslice (16 x 16 cells a block, 8 warps): slice b is lanes 32b .. + 31
 *   and 128 + 32b .. + 31, two per thread; each warp runs the four slices in
 *   turn (order 0, 2, 1, 3) over all of h for its 8 x 4 cells, pairs each
 *   slice's halves (stride 128, one shuffle), keeps 32 values per cell in
 *   shared memory for strides 64 and 32, and runs 16 .. 1 in the half-warp.
 *   A block holds four times the kept kernel's cells for the same registers.
 *   Operands straight from global memory, AHEAD rounds ahead in registers.
 * - laneslice_ring: the same, each warp's operands staged by cp.async into a
 *   ring of R steps of its own (no block barrier; __syncwarp only).
 * - laneslice_ws: the same cells, warp-specialized: producer warps turn the
 *   rows from bf16 into f32 in a ring shared by the 8 consumer warps
 *   (mbarriers, no block barrier), so a consumer's step is 12 8-byte shared
 *   loads and 64 FFMA. TOVL_PROBE_ALONE=1 adds the consumers' loop without
 *   producers (timing only: its results are not checked and print as
 *   MISMATCH).
 * - laneslice_wide (small batches): every slice at once. A block is 8 rows x
 *   4 overlay rows and 8 warps; warp b holds slice b of 32 lanes (16b .. + 15
 *   and 128 + 16b .. + 15, one per thread), so a cell's 4096 multiply-adds
 *   run on 8 warps instead of one or two; strides 64, 32, 16 pair the slices
 *   through shared memory.
 *
 * Timing only, with the arithmetic checked: rows are drawn with exponents
 * where every bf16 x bf16 product is a normal f32, so the fused variants
 * (one __fmaf_rn per multiply-add) give the spec's bits there, and every
 * cell of every variant is compared with the CPU reference's dot. The batch
 * is regular (T / 8 rows per slot, all 64 overlay rows), so there is no tile
 * pick, no tails, no range check and no scatter: a real kernel adds those.
 * Plain launches (no programmatic dependent launch), medians of 20 replays
 * of 100 launches in a CUDA graph.
 *
 *   nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
 *        -Xcompiler -ffp-contract=off -Ibackends/cpu -Iinclude -Icore -Ibench \
 *        bench/laneslice_probe.cu backends/cpu/dot.c core/bf16.c core/status.c \
 *        -o /tmp/laneslice_probe && /tmp/laneslice_probe [seed]
 *
 * Exit status 1 when a cell differs from the reference.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "cpu_kernels.h"
}
#include "cuda_check.h"
#include "graph_timing.h"
#include "tovl/tovl.h"

static const uint32_t H = 4096, SLOTS = 8, N = 64;
static const uint32_t ROUNDS = H / 256; /* 256-element rounds per row */
static const uint32_t SLICES = 4;

/* Where a warp's 8 x 4 cells lie: slot s, rows t0 .. t0 + 7 (this synthetic
 * batch gives slot s rows s * T / SLOTS .. + T / SLOTS), overlay rows k0 ..
 * k0 + 3; a block is WM x WN warps. */
struct WarpTile {
    uint32_t s, t0, k0;
};
template <int WM, int WN>
__device__ __forceinline__ WarpTile block_tile(uint32_t T) { /* the block's first row and overlay row */
    const uint32_t BMB = 8 * WM, BNB = 4 * WN;
    const uint32_t tiles_m = (T / SLOTS) / BMB, tiles_n = N / BNB, b = blockIdx.x;
    const uint32_t s = b / (tiles_m * tiles_n), tm = (b / tiles_n) % tiles_m, tn = b % tiles_n;
    return WarpTile{s, s * (T / SLOTS) + tm * BMB, tn * BNB};
}
template <int WM, int WN>
__device__ __forceinline__ WarpTile warp_tile(uint32_t T) {
    const WarpTile bt = block_tile<WM, WN>(T);
    const uint32_t warp = threadIdx.x / 32, wm = warp / WN, wn = warp % WN;
    return WarpTile{bt.s, bt.t0 + wm * 8, bt.k0 + wn * 4};
}

/* The slice at position pos of the order 0, 2, 1, 3. */
__device__ __forceinline__ uint32_t slice_at(uint32_t pos) {
    return ((pos & 1) << 1) | (pos >> 1);
}

/* One round of the thread's two lanes: x words of the 8 rows, the 4 overlay
 * rows' elements unpacked. */
template <bool FUSED>
__device__ __forceinline__ void round_products(float (&acc)[32][2], const uint32_t (&xv)[8], const float (&wf)[4][2]) {
#pragma unroll
    for (int m = 0; m < 8; m++) {
        const float xf[2] = {__uint_as_float(xv[m] << 16), __uint_as_float(xv[m] & 0xffff0000u)};
#pragma unroll
        for (int n = 0; n < 4; n++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float &a = acc[m * 4 + n][e];
                a = FUSED ? __fmaf_rn(xf[e], wf[n][e], a) : __fadd_rn(a, __fmul_rn(xf[e], wf[n][e]));
            }
        }
    }
}
__device__ __forceinline__ void unpack4(const uint32_t (&w)[4], float (&wf)[4][2]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        wf[i][0] = __uint_as_float(w[i] << 16);
        wf[i][1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

/* The end of the slice at position pos. Stride 128 as a reduce-scatter
 * (lane l in half 0 + lane l + 128 in half 1; half 0 keeps cells 0..15,
 * half 1 16..31), then into the warp's stash (two areas of [32 values][32
 * threads]): slice 0 to area A, slice 2 onto it (stride 64: lanes 0..31 +
 * 64..95), slice 1 to area B, slice 3 onto B (32..63 + 96..127) and B onto A
 * (stride 32). A then holds lanes 0..31 of the stride-32 level. */
__device__ __forceinline__ void slice_end(float (&acc)[32][2], float *stash, uint32_t pos, uint32_t q) {
    const uint32_t half = q / 16;
    float *area_a = stash, *st = stash + (pos >= 2 ? 32 * 32 : 0);
#pragma unroll
    for (int c = 0; c < 16; c++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float send = half ? acc[c][e] : acc[16 + c][e];
            const float mine = half ? acc[16 + c][e] : acc[c][e];
            const float got = __shfl_xor_sync(0xffffffffu, send, 16);
            float r = half ? __fadd_rn(got, mine) : __fadd_rn(mine, got);
            const uint32_t at = (c * 2 + e) * 32 + q;
            if (pos == 1 || pos == 3) r = __fadd_rn(st[at], r); /* stride 64 */
            if (pos == 3) r = __fadd_rn(area_a[at], r);         /* stride 32 */
            (pos == 3 ? area_a : st)[at] = r;
        }
    }
}

/* Strides 16, 8, 4, 2 across the half-warp (lane 2qq + e), 1 in the thread;
 * half h's thread 0 stores cells 16h .. 16h + 15. */
__device__ __forceinline__ void finish_cells(const float *stash, float *out, uint32_t t0, uint32_t k0, uint32_t q) {
    const uint32_t half = q / 16, qq = q % 16;
#pragma unroll
    for (int c = 0; c < 16; c++) {
        float v[2] = {stash[(c * 2) * 32 + q], stash[(c * 2 + 1) * 32 + q]};
#pragma unroll
        for (uint32_t m = 8; m >= 1; m /= 2) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float o = __shfl_xor_sync(0xffffffffu, v[e], m);
                v[e] = (qq & m) ? __fadd_rn(o, v[e]) : __fadd_rn(v[e], o);
            }
        }
        if (qq == 0) {
            const uint32_t cell = 16 * half + c;
            out[(size_t)(t0 + cell / 4) * N + k0 + cell % 4] = __fadd_rn(v[0], v[1]);
        }
    }
}

/* The slices in turn (positions 0..3, slices 0, 2, 1, 3): the lane sums
 * zeroed, round(step) for each of the slice's rounds, then slice_end. */
template <class Round>
__device__ __forceinline__ void slices_in_turn(float (&acc)[32][2], float *stash, uint32_t q, Round round) {
#pragma unroll 1
    for (uint32_t pos = 0; pos < SLICES; pos++) {
#pragma unroll
        for (int c = 0; c < 32; c++) acc[c][0] = acc[c][1] = 0.0f;
#pragma unroll 2
        for (uint32_t j = 0; j < ROUNDS; j++) round(pos * ROUNDS + j);
        slice_end(acc, stash, pos, q);
    }
}

/* Slices in turn, operands AHEAD rounds ahead in registers. */
template <int WM, int WN, bool FUSED, int AHEAD, int MINB>
__global__ void __launch_bounds__(WM * WN * 32, MINB)
    laneslice(const uint16_t *__restrict__ hidden, const uint16_t *__restrict__ rows, float *__restrict__ out,
              uint32_t T) {
    extern __shared__ float stash[]; /* per warp: [2][32 values][32 threads] */
    const WarpTile wt = warp_tile<WM, WN>(T);
    const uint32_t q = threadIdx.x % 32, half = q / 16, qq = q % 16;
    float *my_stash = stash + threadIdx.x / 32 * 2 * 32 * 32;
    /* Row starts as 32-bit word offsets from two bases: fewer registers than
     * twelve pointers. */
    const uint32_t *xbase = (const uint32_t *)hidden, *wbase = (const uint32_t *)(rows + (size_t)wt.s * N * H);
    uint32_t xo[8], wo[4];
    for (int i = 0; i < 8; i++) xo[i] = (wt.t0 + i) * (H / 2);
    for (int i = 0; i < 4; i++) wo[i] = (wt.k0 + i) * (H / 2);
    const auto fetch = [&](uint32_t step, uint32_t (&xv)[8], uint32_t (&wv)[4]) {
        const uint32_t lane = 128 * half + 32 * slice_at(step / ROUNDS) + 2 * qq; /* the first of two */
        const uint32_t wd = (256 * (step % ROUNDS) + lane) / 2;
        for (int i = 0; i < 8; i++) xv[i] = __ldg(xbase + xo[i] + wd);
        for (int i = 0; i < 4; i++) wv[i] = __ldg(wbase + wo[i] + wd);
    };
    uint32_t xb[AHEAD][8], wb[AHEAD][4];
    for (int d = 0; d < AHEAD; d++) fetch(d, xb[d], wb[d]);
    const uint32_t STEPS = SLICES * ROUNDS;
    float acc[32][2];
#pragma unroll 1
    for (uint32_t pos = 0; pos < SLICES; pos++) {
#pragma unroll
        for (int c = 0; c < 32; c++) acc[c][0] = acc[c][1] = 0.0f;
#pragma unroll 1
        for (uint32_t j0 = 0; j0 < ROUNDS; j0 += AHEAD) {
#pragma unroll
            for (int d = 0; d < AHEAD; d++) {
                const uint32_t step = pos * ROUNDS + j0 + d;
                uint32_t xv[8];
                float wf[4][2];
#pragma unroll
                for (int i = 0; i < 8; i++) xv[i] = xb[d][i];
                unpack4(wb[d], wf);
                if (step + AHEAD < STEPS) fetch(step + AHEAD, xb[d], wb[d]);
                round_products<FUSED>(acc, xv, wf);
            }
        }
        slice_end(acc, my_stash, pos, q);
    }
    finish_cells(my_stash, out, wt.t0, wt.k0, q);
}

/* The same, each warp's operands staged by cp.async into a ring of R steps
 * of its own in shared memory: loads R - 1 steps ahead without holding
 * registers, and only __syncwarp (no block barrier). A step is 12 rows x 32
 * words (two 64-byte runs per row); thread q copies 3 of its warp's 96
 * 16-byte pieces. */
__device__ __forceinline__ void cp16(void *dst, const void *src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N_>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N_) : "memory");
}

template <int WM, int WN, bool FUSED, int R, int MINB>
__global__ void __launch_bounds__(WM * WN * 32, MINB)
    laneslice_ring(const uint16_t *__restrict__ hidden, const uint16_t *__restrict__ rows, float *__restrict__ out,
                   uint32_t T) {
    extern __shared__ uint32_t smem[]; /* per warp: stash [2][32][32] floats, then ring [R][12][32] words */
    const WarpTile wt = warp_tile<WM, WN>(T);
    const uint32_t q = threadIdx.x % 32;
    const uint32_t *xbase = (const uint32_t *)hidden, *wbase = (const uint32_t *)(rows + (size_t)wt.s * N * H);
    float *my_stash = (float *)smem + threadIdx.x / 32 * (2 * 32 * 32 + R * 12 * 32);
    uint32_t *ring = (uint32_t *)(my_stash + 2 * 32 * 32);

    /* This thread's three pieces: piece p = q + 32 i: row p / 8 (0..7 hidden,
     * 8..11 overlay), half (p / 4) % 2, part p % 4. */
    const uint32_t *src[3];
    uint32_t dst[3];
    for (int i = 0; i < 3; i++) {
        const uint32_t p = q + 32 * i, row = p / 8, hf = (p / 4) % 2, part = p % 4;
        const uint32_t off = 64 * hf + 4 * part;
        src[i] = row < 8 ? xbase + (wt.t0 + row) * (H / 2) + off : wbase + (wt.k0 + row - 8) * (H / 2) + off;
        dst[i] = row * 32 + 16 * hf + 4 * part;
    }
    const uint32_t STEPS = SLICES * ROUNDS;
    const auto issue = [&](uint32_t step) {
        if (step < STEPS) {
            const uint32_t adv = 128 * (step % ROUNDS) + 16 * slice_at(step / ROUNDS);
            uint32_t *slot = ring + (step % R) * 12 * 32;
            for (int i = 0; i < 3; i++) cp16(slot + dst[i], src[i] + adv);
        }
        cp_commit(); /* empty groups at the end keep the count uniform */
    };
    for (int d = 0; d < R - 1; d++) issue(d);

    float acc[32][2];
    slices_in_turn(acc, my_stash, q, [&](uint32_t step) {
        __syncwarp(); /* every thread is done with the slot about to be refilled */
        issue(step + R - 1);
        cp_wait<R - 1>();
        __syncwarp(); /* every thread's pieces of this step have landed */
        const uint32_t *slot = ring + (step % R) * 12 * 32;
        uint32_t xv[8], wv[4];
        float wf[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) wv[i] = slot[(8 + i) * 32 + q];
        unpack4(wv, wf);
#pragma unroll
        for (int m = 0; m < 8; m++) xv[m] = slot[m * 32 + q];
        round_products<FUSED>(acc, xv, wf);
    });
    finish_cells(my_stash, out, wt.t0, wt.k0, q);
}


/* Small batches: every slice at once. A block is 8 rows x 4 overlay rows of
 * one slot and 8 warps; warp b holds slice b of 32 lanes (16b .. 16b + 15 and
 * 128 + 16b .. + 15, one per thread) of all 32 cells, reads its lanes'
 * elements straight from global memory (AHEAD rounds ahead), and after the
 * 16 rounds pairs its two halves (stride 128); strides 64, 32, 16 then pair
 * the slices through shared memory, 8 .. 1 the rest. A cell's 4096
 * multiply-adds are spread over 8 warps instead of one or two. */
template <bool FUSED, int AHEAD, int MINB>
__global__ void __launch_bounds__(256, MINB)
    laneslice_wide(const uint16_t *__restrict__ hidden, const uint16_t *__restrict__ rows, float *__restrict__ out,
                   uint32_t T) {
    __shared__ float part[8][32][16]; /* [slice][cell][u]: lane 16 slice + u after stride 128 */
    const uint32_t tiles_m = (T / SLOTS) / 8, tiles_n = N / 4;
    const uint32_t b = blockIdx.x;
    const uint32_t s = b / (tiles_m * tiles_n), tm = (b / tiles_n) % tiles_m, tn = b % tiles_n;
    const uint32_t warp = threadIdx.x / 32, q = threadIdx.x % 32, half = q / 16, qq = q % 16;
    const uint32_t t0 = s * (T / SLOTS) + tm * 8, k0 = tn * 4;
    const uint16_t *xbase = hidden, *wbase = rows + (size_t)s * N * H;
    const uint32_t lane = 128 * half + 16 * warp + qq;
    uint32_t xo[8], wo[4];
    for (int i = 0; i < 8; i++) xo[i] = (t0 + i) * H + lane;
    for (int i = 0; i < 4; i++) wo[i] = (k0 + i) * H + lane;
    uint16_t xb[AHEAD][8], wb[AHEAD][4];
    auto fetch = [&](uint32_t j, uint16_t (&xv)[8], uint16_t (&wv)[4]) {
        for (int i = 0; i < 8; i++) xv[i] = __ldg(xbase + xo[i] + 256 * j);
        for (int i = 0; i < 4; i++) wv[i] = __ldg(wbase + wo[i] + 256 * j);
    };
#pragma unroll
    for (int d = 0; d < AHEAD; d++) fetch(d, xb[d], wb[d]);
    float acc[32];
#pragma unroll
    for (int c = 0; c < 32; c++) acc[c] = 0.0f;
#pragma unroll 1
    for (uint32_t j0 = 0; j0 < ROUNDS; j0 += AHEAD) {
#pragma unroll
        for (int d = 0; d < AHEAD; d++) {
            float xf[8], wf[4];
#pragma unroll
            for (int i = 0; i < 8; i++) xf[i] = __uint_as_float((uint32_t)xb[d][i] << 16);
#pragma unroll
            for (int i = 0; i < 4; i++) wf[i] = __uint_as_float((uint32_t)wb[d][i] << 16);
            if (j0 + d + AHEAD < ROUNDS) fetch(j0 + d + AHEAD, xb[d], wb[d]);
#pragma unroll
            for (int m = 0; m < 8; m++)
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    float &a = acc[m * 4 + n];
                    a = FUSED ? __fmaf_rn(xf[m], wf[n], a) : __fadd_rn(a, __fmul_rn(xf[m], wf[n]));
                }
        }
    }
    /* stride 128 as a reduce-scatter: half 0 keeps cells 0..15, half 1 16..31 */
#pragma unroll
    for (int c = 0; c < 16; c++) {
        const float send = half ? acc[c] : acc[16 + c];
        const float mine = half ? acc[16 + c] : acc[c];
        const float got = __shfl_xor_sync(0xffffffffu, send, 16);
        part[warp][16 * half + c][qq] = half ? __fadd_rn(got, mine) : __fadd_rn(mine, got);
    }
    __syncthreads();
    /* 8 threads per cell, lane positions p and p + 8 of the stride-16 level */
    const uint32_t cell = threadIdx.x / 8, p = threadIdx.x % 8;
    float v[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const uint32_t u = p + 8 * e;
        float s64[4], s32[2];
#pragma unroll
        for (int i = 0; i < 4; i++) s64[i] = __fadd_rn(part[i][cell][u], part[i + 4][cell][u]);
#pragma unroll
        for (int i = 0; i < 2; i++) s32[i] = __fadd_rn(s64[i], s64[i + 2]);
        v[e] = __fadd_rn(s32[0], s32[1]);
    }
    float r = __fadd_rn(v[0], v[1]); /* stride 8 */
#pragma unroll
    for (uint32_t m = 4; m >= 1; m /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, r, m);
        r = (p & m) ? __fadd_rn(o, r) : __fadd_rn(r, o);
    }
    if (p == 0) out[(size_t)(t0 + cell / 4) * N + k0 + cell % 4] = r;
}


/* Warp-specialized: P producer warps turn the block's rows from bf16 into
 * f32 in a ring of R steps shared by the 8 consumer warps, which then load
 * each operand pair with one 8-byte shared load and no unpacking. Producer
 * warp p fills steps p, p + P, ... (a step: the 32 rows' 64 elements of one
 * slice-round, 8 KB of f32), one step's 16-byte loads ahead in registers;
 * the hand-over is by mbarriers (full: the producer warp's 32 threads have
 * stored; empty: the 8 consumer warps have read), so no block barrier runs
 * after the start. */
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}

template <int WM, int WN, bool FUSED, int R, int P, bool ALONE = false>
__global__ void __launch_bounds__((WM * WN + P) * 32, 1)
    laneslice_ws(const uint16_t *__restrict__ hidden, const uint16_t *__restrict__ rows, float *__restrict__ out,
                 uint32_t T) {
    constexpr uint32_t CW = WM * WN, BMB = 8 * WM, BNB = 4 * WN, ROWS_B = BMB + BNB, STEP_F = ROWS_B * 64;
    constexpr uint32_t VECS = ROWS_B * 8; /* 16-byte vectors of bf16 per step */
    static_assert(VECS % 32 == 0, "a producer warp's vectors divide evenly");
    constexpr uint32_t PER = VECS / 32;   /* per producer thread per step */
    extern __shared__ float smem_f[];     /* stash [CW][2][32][32], ring [R][ROWS_B][64], full[R], empty[R] */
    float *ring = smem_f + CW * 2 * 32 * 32;
    uint64_t *full = reinterpret_cast<uint64_t *>(ring + R * STEP_F), *empty = full + R;
    const uint32_t warp = threadIdx.x / 32, q = threadIdx.x % 32;
    const WarpTile bt = block_tile<WM, WN>(T);
    const uint32_t s = bt.s, t0 = bt.t0, k0 = bt.k0;
    if (threadIdx.x == 0) {
        for (uint32_t k = 0; k < R; k++) {
            mbar_init(&full[k], 32);
            mbar_init(&empty[k], CW);
        }
    }
    __syncthreads();
    const uint32_t STEPS = SLICES * ROUNDS;
    if (warp >= CW) {
        if (ALONE) return; /* timing only: the consumers' loop without producers */
        const uint32_t p = warp - CW;
        uint4 v[2][PER];
        const auto fetch = [&](uint32_t step, uint4 (&dst)[PER]) {
            const uint32_t j = step % ROUNDS, slice = slice_at(step / ROUNDS);
#pragma unroll
            for (uint32_t i = 0; i < PER; i++) {
                const uint32_t vec = q + 32 * i, row = vec / 8, hf = (vec / 4) % 2, part = vec % 4;
                const uint16_t *src = row < BMB ? hidden + (size_t)(t0 + row) * H
                                                : rows + ((size_t)s * N + k0 + row - BMB) * H;
                dst[i] = __ldg(reinterpret_cast<const uint4 *>(src + 256 * j + 128 * hf + 32 * slice + 8 * part));
            }
        };
        const auto store = [&](uint32_t step, const uint4 (&src)[PER]) {
            const uint32_t slot = step % R, n = step / R;
            if (n > 0) mbar_wait(&empty[slot], (n - 1) & 1);
            float *dst = ring + slot * STEP_F;
#pragma unroll
            for (uint32_t i = 0; i < PER; i++) {
                const uint32_t vec = q + 32 * i, row = vec / 8, hf = (vec / 4) % 2, part = vec % 4;
                const uint4 w = src[i];
                float4 *d = reinterpret_cast<float4 *>(dst + row * 64 + hf * 32 + part * 8);
                d[0] = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                                   __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
                d[1] = make_float4(__uint_as_float(w.z << 16), __uint_as_float(w.z & 0xffff0000u),
                                   __uint_as_float(w.w << 16), __uint_as_float(w.w & 0xffff0000u));
            }
            mbar_arrive(&full[slot]);
        };
        /* Two register sets, used in turn: the next assigned step's loads are
         * in flight while this one is stored. */
        if (p < STEPS) fetch(p, v[0]);
        for (uint32_t step = p; step < STEPS; step += 2 * P) {
            if (step + P < STEPS) fetch(step + P, v[1]);
            store(step, v[0]);
            if (step + P >= STEPS) break;
            if (step + 2 * P < STEPS) fetch(step + 2 * P, v[0]);
            store(step + P, v[1]);
        }
        return; /* no block barrier follows */
    }
    const uint32_t wm = warp / WN, wn = warp % WN, half = q / 16, qq = q % 16;
    float *my_stash = smem_f + warp * 2 * 32 * 32;
    float acc[32][2];
    slices_in_turn(acc, my_stash, q, [&](uint32_t step) {
        const uint32_t slot = step % R;
        if (!ALONE) mbar_wait(&full[slot], (step / R) & 1);
        const float *src = ring + slot * STEP_F + half * 32 + 2 * qq;
        float2 xf[8], wf[4];
#pragma unroll
        for (int m = 0; m < 8; m++) xf[m] = *reinterpret_cast<const float2 *>(src + (wm * 8 + m) * 64);
#pragma unroll
        for (int n = 0; n < 4; n++) wf[n] = *reinterpret_cast<const float2 *>(src + (BMB + wn * 4 + n) * 64);
#pragma unroll
        for (int m = 0; m < 8; m++)
#pragma unroll
            for (int n = 0; n < 4; n++) {
                float(&a)[2] = acc[m * 4 + n];
                if (FUSED) {
                    a[0] = __fmaf_rn(xf[m].x, wf[n].x, a[0]);
                    a[1] = __fmaf_rn(xf[m].y, wf[n].y, a[1]);
                } else {
                    a[0] = __fadd_rn(a[0], __fmul_rn(xf[m].x, wf[n].x));
                    a[1] = __fadd_rn(a[1], __fmul_rn(xf[m].y, wf[n].y));
                }
            }
        __syncwarp();
        if (q == 0 && !ALONE) mbar_arrive(&empty[slot]);
    });
    finish_cells(my_stash, out, t0 + wm * 8, k0 + wn * 4, q);
}

static uint16_t draw_bf16(std::mt19937_64 &rng) {
    /* exponent field 110..140, random sign and mantissa: every product normal */
    const uint32_t e = 110 + (uint32_t)(rng() % 31);
    return (uint16_t)(((rng() & 1) << 15) | (e << 7) | (rng() & 0x7f));
}

template <class K>
static bool run_kernel(const char *name, K k, int WM, int WN, size_t smem, const uint16_t *dh, const uint16_t *dr,
                       const std::vector<uint16_t> &hh, const std::vector<uint16_t> &hr, uint32_t T, int warps = 0) {
    if (!warps) warps = WM * WN;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, k));
    float *dout;
    CK(cudaMalloc(&dout, (size_t)T * N * 4));
    CK(cudaMemset(dout, 0xA5, (size_t)T * N * 4));
    const uint32_t blocks = SLOTS * ((T / SLOTS) / (8 * WM)) * (N / (4 * WN));
    k<<<blocks, warps * 32, smem>>>(dh, dr, dout, T);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> out((size_t)T * N);
    CK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (uint32_t t = 0; t < T; t++) {
        const uint32_t s = t / (T / SLOTS);
        for (uint32_t n = 0; n < N; n++) {
            const float want = tovl_cpu_dot_bf16(&hh[(size_t)t * H], &hr[((size_t)s * N + n) * H], H);
            uint32_t a, b;
            memcpy(&a, &want, 4);
            memcpy(&b, &out[(size_t)t * N + n], 4);
            bad += a != b;
        }
    }
    const double us = graph_us([&](cudaStream_t st) { k<<<blocks, warps * 32, smem, st>>>(dh, dr, dout, T); });
    const double mac = (double)T * N * H;
    printf("%-34s T=%-4u blocks %4u  %3d regs %4d B local  %8.2f us  %6.2f TMAC/s  %s\n", name, T, blocks,
           fa.numRegs, (int)fa.localSizeBytes, us, mac / us * 1e-6, bad ? "MISMATCH" : "bit-exact");
    if (bad) printf("  %zu cells differ\n", bad);
    CK(cudaFree(dout));
    return bad == 0;
}

template <int WM, int WN, bool FUSED, int AHEAD, int MINB>
static bool run(const char *name, const uint16_t *dh, const uint16_t *dr, const std::vector<uint16_t> &hh,
                const std::vector<uint16_t> &hr, uint32_t T) {
    return run_kernel(name, laneslice<WM, WN, FUSED, AHEAD, MINB>, WM, WN, (size_t)WM * WN * 2 * 32 * 32 * 4, dh, dr,
                      hh, hr, T);
}

template <int WM, int WN, bool FUSED, int R, int MINB>
static bool run_ring(const char *name, const uint16_t *dh, const uint16_t *dr, const std::vector<uint16_t> &hh,
                     const std::vector<uint16_t> &hr, uint32_t T) {
    return run_kernel(name, laneslice_ring<WM, WN, FUSED, R, MINB>, WM, WN,
                      (size_t)WM * WN * (2 * 32 * 32 + R * 12 * 32) * 4, dh, dr, hh, hr, T);
}

template <bool FUSED, int AHEAD, int MINB>
static bool run_wide(const char *name, const uint16_t *dh, const uint16_t *dr, const std::vector<uint16_t> &hh,
                     const std::vector<uint16_t> &hr, uint32_t T) {
    /* 8 warps of one 8 x 4 tile: the grid of an 8 x 4-cell tiling, WM = 1 */
    return run_kernel(name, laneslice_wide<FUSED, AHEAD, MINB>, 1, 1, 0, dh, dr, hh, hr, T, 8);
}

template <int WM, int WN, bool FUSED, int R, int P, bool ALONE = false>
static bool run_ws(const char *name, const uint16_t *dh, const uint16_t *dr, const std::vector<uint16_t> &hh,
                   const std::vector<uint16_t> &hr, uint32_t T) {
    const size_t rows_b = 8 * WM + 4 * WN;
    const size_t smem = (size_t)WM * WN * 2 * 32 * 32 * 4 + (size_t)R * rows_b * 64 * 4 + 2 * R * 8;
    return run_kernel(name, laneslice_ws<WM, WN, FUSED, R, P, ALONE>, WM, WN, smem, dh, dr, hh, hr, T, WM * WN + P) ||
           ALONE; /* timing only: not checked */
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : std::random_device{}();
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("laneslice_probe: %s, %d SMs, seed %llu\n", p.name, p.multiProcessorCount, (unsigned long long)seed);
    std::mt19937_64 rng(seed);
    bool ok = true;
    for (uint32_t T : {512u, 256u, 128u, 64u}) {
        std::vector<uint16_t> hh((size_t)T * H), hr((size_t)SLOTS * N * H);
        for (auto &v : hh) v = draw_bf16(rng);
        for (auto &v : hr) v = draw_bf16(rng);
        uint16_t *dh, *dr;
        CK(cudaMalloc(&dh, hh.size() * 2));
        CK(cudaMalloc(&dr, hr.size() * 2));
        CK(cudaMemcpy(dh, hh.data(), hh.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dr, hr.data(), hr.size() * 2, cudaMemcpyHostToDevice));
        ok &= run_wide<true, 4, 1>("wide: 8x4, 8 slices, fused, 4 ahead", dh, dr, hh, hr, T);
        ok &= run_wide<true, 16, 1>("wide: 8x4, 8 slices, fused, 16 ahead", dh, dr, hh, hr, T);
        ok &= run_wide<false, 8, 1>("wide: 8x4, 8 slices, unfused, 8 ahead", dh, dr, hh, hr, T);
        if (T >= 128) {
            ok &= run<2, 4, true, 4, 1>("regs: 16x16, 1/SM, fused, 4 ahead", dh, dr, hh, hr, T);
            ok &= run_ring<2, 4, true, 8, 1>("ring: 16x16, 1/SM, fused, R 8", dh, dr, hh, hr, T);
            ok &= run_ring<2, 4, false, 8, 1>("ring: 16x16, 1/SM, unfused, R 8", dh, dr, hh, hr, T);
            ok &= run_ring<2, 2, true, 4, 4>("ring: 16x8, 4/SM, fused, R 4", dh, dr, hh, hr, T);
            ok &= run_ws<2, 4, true, 8, 4>("ws: 16x16, f32 ring R 8, 4 producers, fused", dh, dr, hh, hr, T);
            ok &= run_ws<2, 4, false, 8, 4>("ws: 16x16, f32 ring R 8, 4 producers, unfused", dh, dr, hh, hr, T);
            ok &= run_ws<2, 4, true, 12, 8>("ws: 16x16, f32 ring R 12, 8 producers, fused", dh, dr, hh, hr, T);
            if (getenv("TOVL_PROBE_ALONE")) {
                run_ws<2, 4, true, 8, 4, true>("ws, consumers alone (timing only)", dh, dr, hh, hr, T);
                run_ws<2, 4, false, 8, 4, true>("ws, consumers alone, unfused", dh, dr, hh, hr, T);
            }
        }
        if (T >= 64) ok &= run_ring<1, 2, true, 8, 4>("ring: 8x8, 4/SM, fused, R 8", dh, dr, hh, hr, T);
        CK(cudaFree(dh));
        CK(cudaFree(dr));
    }
    printf("%s\n", ok ? "all bit-exact" : "FAIL");
    return ok ? 0 : 1;
}
