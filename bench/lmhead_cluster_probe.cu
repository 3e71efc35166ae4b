/*
 * Probe: the lm_head hook with each tile's lanes spread over a cluster of 8
 * blocks.  (Thirteenth session, issue 6; not part of the library;
 * docs/PERFORMANCE.md, "Thirteenth session".)
 *
 * At T = 64 the small tiles run 80 tiles of 8 rows x 8 overlay rows on 80 of
 * the H200's 132 SMs, and each SM streams its tile's 16 rows (128 KB) from
 * L2: 7.9 us. Smaller tiles read more bytes per cell and do not spread better
 * (176 tiles of 8 x 4 for 132 SMs). What spreads the same tiles over every
 * SM is cutting them by lanes: the spec's tree pairs lanes 128, 64, 32 and 16
 * apart first, so block r of a cluster of 8 takes slice r (lanes 16 r .. + 15
 * and 128 + 16 r .. + 15) of all 64 cells, reads only its slice's 32-byte
 * runs of the 16 rows (16 KB), pairs its two halves (stride 128), and the
 * 8 blocks pair slices (strides 64, 32, 16) through distributed shared
 * memory; then strides 8 .. 1. 640 blocks of 16 KB instead of 80 of 128 KB.
 *
 * The tile pick and row scan are the port's own (lmhead_pick,
 * lmhead_find_rows), on the bench workload of lmhead_microbench (random
 * slots, 1 in 16 rows without one); every cell is checked against the CPU
 * reference's dot, with the logits poisoned before and checked for stray
 * writes after. The spec's unfused products and sums. Assumes h % 256 == 0
 * and 16-byte aligned rows (the workload's); a kernel would add the tails.
 * Plain launches with the cluster attribute (no programmatic dependent
 * launch): compare with lmhead_microbench under TOVL_CUDA_PDL=0.
 *
 *   nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
 *        -Xcompiler -ffp-contract=off -Ibackends/cuda -Ibackends/cpu -Iinclude -Icore -Ibench \
 *        bench/lmhead_cluster_probe.cu backends/cpu/dot.c core/bf16.c core/status.c \
 *        -o /tmp/lmhead_cluster_probe && /tmp/lmhead_cluster_probe [seed]
 *
 * TOVL_MB_T=16,64 chooses the batch sizes; TOVL_PROBE_STOP=1 or 2 times the
 * kernel cut short after the pick or after the products (results not
 * checked). Exit status 1 on a wrong cell.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/lmhead_overlay.cuh"
extern "C" {
#include "cpu_kernels.h"
}

#include "bench_workload.h"
#include "cuda_check.h"
#include "graph_timing.h"
#include "lmhead_check.h"

namespace cg = cooperative_groups;

namespace probe {
using namespace tovl_cuda;

/* The pick's tile: 8 rows x 8 overlay rows, 256 threads. */
using C = LmheadConfig<8, 4, 2, 1, true>;
constexpr uint32_t RANKS = 8;             /* blocks per cluster: one slice each */
constexpr uint32_t SLICE = 16;            /* lanes per slice in each half */
constexpr uint32_t ROWS = C::BM + C::BN;  /* staged rows: hidden, then overlay */
constexpr uint32_t MAX_ROUNDS = 16;       /* h <= 4096 */
constexpr uint32_t RUN = 2 * SLICE;       /* a row's staged elements per round */

struct Stage {
    uint16_t e[ROWS][MAX_ROUNDS][RUN]; /* [row][round][half * 16 + u] */
    float part[C::BM * C::BN][SLICE];  /* [cell][u]: lane 16 r + u after stride 128 */
};
static_assert(sizeof(Stage) <= sizeof(LmheadShared<C>), "the staging reuses the pick's shared memory");

/* Timing only (TOVL_PROBE_STOP, wrong results): 1 returns after the pick
 * and the row scan, 2 after the products (no cluster pairing, no stores). */
__device__ uint32_t probe_stop = 0;

template <bool F32_LOGITS>
__global__ void __launch_bounds__(256, 4) lmhead_cluster(tovl_lmhead_overlay_args a) {
    __shared__ LmheadShared<C> sh;
    __shared__ uint32_t rows_t[C::BM];
    cg::cluster_group cluster = cg::this_cluster();
    const uint32_t r = cluster.block_rank(), tid = threadIdx.x, warp = tid / WARP, q = lane_id();
    const uint32_t columns = (a.max_n + C::BN - 1) / C::BN, tile = blockIdx.x / RANKS;
    const LmheadPlace place{tile / columns, tile % columns};
    uint32_t s, g;
    LmheadSlot cells;
    bool fills = false;
    if (!lmhead_pick<C>(sh, a, place, s, g, cells, fills)) {
        return; /* the same in every block of the cluster */
    }
    const uint32_t n_slot = cells.n, k0 = place.y * C::BN, k_end = min_of(k0 + C::BN, n_slot);
    __syncthreads();
    const uint32_t len = lmhead_find_rows<C>(sh, a, s, g);
    const uint32_t h = a.h, rounds = h / TOVL_DOT_LANES;
    const uint16_t *hidden = ptr<const uint16_t>(a.hidden);
    const uint32_t stop = probe_stop;
    if (stop == 1) {
        return;
    }
    if (tid < C::BM) {
        rows_t[tid] = tid < len ? sh.scan.rows[tid] : UINT32_MAX;
    }
    __syncthreads(); /* scan.rows is read: the staging may overwrite it */
    Stage &st = *reinterpret_cast<Stage *>(&sh);
    /* 16 rows x rounds x 2 halves x 2 pieces of 16 bytes; piece p: row p / 64,
     * round (p / 4) % 16, half (p / 2) % 2, piece p % 2. */
    for (uint32_t p = tid; p < ROWS * MAX_ROUNDS * 4; p += C::THREADS) {
        const uint32_t row = p / 64, j = (p / 4) % MAX_ROUNDS, hf = (p / 2) % 2, part = p % 2;
        if (j >= rounds) continue;
        const uint32_t t = row < C::BM && rows_t[row] != UINT32_MAX ? rows_t[row] : rows_t[0];
        const uint16_t *base = row < C::BM ? hidden + (size_t)t * h
                                           : cells.rows + (size_t)(k0 + (row - C::BM) < k_end ? k0 + row - C::BM : k0) * h;
        const uint32_t e = j * TOVL_DOT_LANES + hf * (TOVL_DOT_LANES / 2) + SLICE * r + 8 * part;
        copy16_async(&st.e[row][j][hf * SLICE + 8 * part], base + e);
    }
    copy_async_commit();
    copy_async_wait<0>();
    __syncthreads();
    /* Warp m: hidden row m against the 8 overlay rows; thread q: lane
     * 128 (q / 16) + 16 r + q % 16, position q of each round's run. */
    float acc[C::BN];
    TOVL_UNROLL
    for (uint32_t n = 0; n < C::BN; n++) acc[n] = 0.0f;
    for (uint32_t j = 0; j < rounds; j++) {
        const float x = bf16_to_f32(st.e[warp][j][q]);
        float prod[C::BN];
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::BN; n++) prod[n] = __fmul_rn(x, bf16_to_f32(st.e[C::BM + n][j][q]));
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::BN; n++) acc[n] = __fadd_rn(acc[n], prod[n]);
    }
    if (stop == 2) {
        float all = 0.0f; /* keep every product */
        TOVL_UNROLL
        for (uint32_t n = 0; n < C::BN; n++) all = __fadd_rn(all, acc[n]);
        if (all == 12345.0f) st.part[0][0] = all;
        return;
    }
    /* Stride 128 as a reduce-scatter: half 0 keeps overlay rows 0..3, half 1 4..7. */
    const uint32_t half = q / SLICE, qq = q % SLICE;
    TOVL_UNROLL
    for (uint32_t i = 0; i < C::BN / 2; i++) {
        const uint32_t lo = i, hi = i + C::BN / 2;
        const float send = half ? acc[lo] : acc[hi], mine = half ? acc[hi] : acc[lo];
        const float theirs = __shfl_xor_sync(FULL_MASK, send, SLICE);
        st.part[warp * C::BN + half * (C::BN / 2) + i][qq] = half ? __fadd_rn(theirs, mine) : __fadd_rn(mine, theirs);
    }
    cluster.sync(); /* every block's part is written and visible to the cluster */
    /* Block r finishes cells 8 r .. 8 r + 7: 16 threads a cell, u = lane
     * position; strides 64, 32, 16 pair ranks r' with r' + 4, 2, 1. */
    if (tid < 128) {
        const uint32_t cell = RANKS * r + tid / SLICE, u = tid % SLICE;
        float v[RANKS];
        TOVL_UNROLL
        for (uint32_t rr = 0; rr < RANKS; rr++) {
            const Stage *other = cluster.map_shared_rank(&st, rr);
            v[rr] = other->part[cell][u];
        }
        TOVL_UNROLL
        for (uint32_t stride = RANKS / 2; stride >= 1; stride /= 2) {
            TOVL_UNROLL
            for (uint32_t i = 0; i < stride; i++) v[i] = __fadd_rn(v[i], v[i + stride]);
        }
        float x = v[0];
        TOVL_UNROLL
        for (uint32_t stride = 8; stride >= 1; stride /= 2) x = __fadd_rn(x, __shfl_down_sync(FULL_MASK, x, stride));
        if (u == 0) {
            const uint32_t m = cell / C::BN, k = k0 + cell % C::BN, t = rows_t[m];
            if (t != UINT32_MAX && k < k_end) {
                const uint32_t id = ldg(cells.ids + k);
                if (id < a.vocab) store_logit<F32_LOGITS>(a, t, id, x);
            }
        }
    }
    cluster.sync(); /* no block leaves while another reads its part */
}
} // namespace probe

template <class K>
static void launch(K kernel, uint32_t blocks, cudaStream_t stream, const tovl_lmhead_overlay_args &a) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(256);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = probe::RANKS;
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    CK(cudaLaunchKernelEx(&config, kernel, a));
}

static int failures = 0;

static void run(Workload &w, bool f32) {
    const size_t esz = f32 ? 4 : 2, bytes = (size_t)w.T * VOCAB * esz;
    const uint8_t POISON = 0xA5;
    uint8_t *logits;
    CK(cudaMalloc(&logits, bytes));
    CK(cudaMemset(logits, POISON, bytes));
    const tovl_lmhead_overlay_args a = lmhead_args(w, (uint64_t)(uintptr_t)logits);
    /* The tile kernels' grid (cuda_geometry.c), one cluster of RANKS blocks per tile. */
    using C = probe::C;
    const uint32_t columns = (N + C::BN - 1) / C::BN, groups = (w.T + C::BM - 1) / C::BM + std::min<uint32_t>(SLOTS, w.T);
    const uint32_t blocks = groups * columns * probe::RANKS;
    auto kernel = f32 ? probe::lmhead_cluster<true> : probe::lmhead_cluster<false>;
    launch(kernel, blocks, 0, a);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> out(bytes);
    CK(cudaMemcpy(out.data(), logits, bytes, cudaMemcpyDeviceToHost));
    LmheadCheck check = lmhead_check(w, out, f32, POISON);
    if (getenv("TOVL_PROBE_STOP")) check.bad = check.stray = 0;
    const bool pass = check.bad == 0 && check.stray == 0;
    failures += !pass;
    const double us = graph_us([&](cudaStream_t st) { launch(kernel, blocks, st, a); });
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, kernel));
    printf("cluster lmhead_overlay_%-4s T=%-4u %5zu cells  blocks %5u  %3d regs %3d B local  graph %8.2f us  %s\n",
           f32 ? "f32" : "bf16", w.T, check.cells, blocks, fa.numRegs, (int)fa.localSizeBytes, us,
           pass ? "bit-exact" : "MISMATCH");
    if (!pass) printf("  mismatched cells %zu, stray bytes %zu\n", check.bad, check.stray);
    CK(cudaFree(logits));
}

int main(int argc, char **argv) {
    std::mt19937_64 rng(bench_start(argc, argv, "lmhead_cluster_probe"));
    const std::vector<uint32_t> sizes = bench_sizes({16u, 32u, 48u, 64u, 96u, 128u});
    if (const char *stop = getenv("TOVL_PROBE_STOP")) {
        const uint32_t v = (uint32_t)atoi(stop);
        CK(cudaMemcpyToSymbol(probe::probe_stop, &v, sizeof v));
        printf("TOVL_PROBE_STOP=%u: timing only, results are not checked\n", v);
    }
    for (uint32_t T : sizes) {
        Workload w;
        build(w, T, rng);
        run(w, false);
        run(w, true);
        workload_release(w);
    }
    printf("%s\n", failures ? "FAIL" : "all bit-exact");
    return failures ? 1 : 0;
}
