/*
 * Where the embed hook's time goes on a GPU (docs/PERFORMANCE.md, eighth
 * session): the CUDA port's embed_overlay on the bench workload (h = 4096,
 * vocab 152064, 8 slots x 64 rows, row slots random in 0..7 with 1 in 16 at
 * -1, half the token ids overlaid), next to three kernels that bound it:
 *
 *   empty            the same grid doing nothing: the launch in a graph;
 *   lookup chain     the port's lookups (slot and id with the table cells,
 *                    then slot_map[s][id]) and no copy;
 *   h = 4096 only    the port's kernel with h fixed at compile time: no
 *                    alignment test, no loop, no head or tail (an upper bound
 *                    for this design, not a kernel the library could ship).
 *
 * The port's kernel is launched as the backend launches it (with programmatic
 * dependent launch on sm_90 and newer; TOVL_CUDA_PDL=0 for plain launches),
 * the three bounds plainly. The kernels that copy are checked bit for bit
 * against the expected hidden rows first; the times are per-launch medians of 20 replays of 100 launches
 * in one CUDA graph. Exit status 1 on a mismatch.
 *
 *   nvcc -O3 -arch=sm_90 -Ibackends/cuda -Iinclude bench/embed_floor.cu \
 *        core/bf16.c -o /tmp/embed_floor && /tmp/embed_floor [seed]
 */
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/embed_overlay.cuh"

#include "bench_workload.h"
#include "cuda_check.h"
#include "graph_timing.h"

static const uint32_t THREADS = TOVL_CUDA_EMBED_THREADS;

using namespace tovl_cuda;

__global__ void embed_empty(tovl_embed_overlay_args) {}

/* The port's lookups for token blockIdx.x (sets of up to 32 slots): its
 * slot and id with every slot's table cells, then slot_map[s][id]. False
 * when the token keeps its row. */
__device__ __forceinline__ bool embed_lookup(const tovl_embed_overlay_args &args, EmbedSlotCells &cells,
                                             int32_t &j) {
    const uint32_t t = blockIdx.x, lane = lane_id();
    EmbedSlotCells lane_cells = {0, 0, 0};
    if (lane < args.max_loras) {
        lane_cells = embed_slot_cells(args, lane);
    }
    const int32_t s = row_slot(args.token_slots, args.active_slot, t);
    const uint32_t id = ldg(ptr<const uint32_t>(args.token_ids) + t);
    const bool valid = slot_valid(s, args.max_loras);
    cells = shfl_cells(lane_cells, valid ? (uint32_t)s % WARP : 0u);
    if (!valid || id >= args.vocab || cells.slot_map == 0) {
        return false;
    }
    j = ldg(ptr<const int32_t>(cells.slot_map) + id);
    return true;
}

/* The lookups, then nothing: `sink` is written only for an impossible row,
 * so that the compiler keeps them. */
__global__ void __launch_bounds__(THREADS) embed_lookups_only(tovl_embed_overlay_args args, int32_t *sink) {
    EmbedSlotCells cells;
    int32_t j;
    if (embed_lookup(args, cells, j) && j == INT32_MIN && threadIdx.x == 0) {
        sink[blockIdx.x] = j;
    }
}

/* The port's kernel for h = 4096 and 16-byte aligned rows only. */
__global__ void __launch_bounds__(THREADS) embed_h4096(tovl_embed_overlay_args args) {
    constexpr uint32_t UNROLL = H / 8 / THREADS;
    EmbedSlotCells cells;
    int32_t j;
    if (!embed_lookup(args, cells, j) || j < 0 || (uint32_t)j >= cells.n) {
        return;
    }
    const uint4 *src = reinterpret_cast<const uint4 *>(ptr<const uint16_t>(cells.rows) + (size_t)j * H) + threadIdx.x;
    uint4 *dst = reinterpret_cast<uint4 *>(ptr<uint16_t>(args.hidden) + (size_t)blockIdx.x * H) + threadIdx.x;
    uint4 v[UNROLL];
#pragma unroll
    for (uint32_t u = 0; u < UNROLL; u++) {
        v[u] = load16(src + u * THREADS);
    }
#pragma unroll
    for (uint32_t u = 0; u < UNROLL; u++) {
        store16_global(dst + u * THREADS, v[u]);
    }
}

int main(int argc, char **argv) {
    std::mt19937_64 rng(bench_start(argc, argv, "embed_floor"));
    int failures = 0;
    for (uint32_t T : {512u, 64u}) {
        Workload w;
        build(w, T, rng);
        uint32_t copied;
        const std::vector<uint16_t> want = embed_expected(w, &copied);
        uint16_t *d_hidden; /* patched by the kernels: refilled from w.hidden before each is checked */
        int32_t *sink;
        CK(cudaMalloc(&d_hidden, w.hidden.size() * 2));
        CK(cudaMalloc(&sink, T * sizeof(int32_t)));
        const tovl_embed_overlay_args a = embed_args(w, (uint64_t)(uintptr_t)d_hidden);
        /* Runs `launch` once on fresh rows and compares them, then times it. */
        const auto run = [&](const char *name, bool copies, auto launch) {
            CK(cudaMemcpy(d_hidden, w.hidden.data(), w.hidden.size() * 2, cudaMemcpyHostToDevice));
            launch(cudaStream_t(0));
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            const char *verdict = "";
            if (copies) {
                std::vector<uint16_t> out(w.hidden.size());
                CK(cudaMemcpy(out.data(), d_hidden, out.size() * 2, cudaMemcpyDeviceToHost));
                const bool ok = memcmp(out.data(), want.data(), out.size() * 2) == 0;
                failures += !ok;
                verdict = ok ? "bit-exact" : "MISMATCH";
            }
            printf("T=%-4u %3u rows  %-34s %6.2f us  %s\n", T, copied, name, graph_us(launch), verdict);
        };
        run("embed_overlay (the port's kernel)", true,
            [&](cudaStream_t st) { backend_launch(embed_overlay, dim3(T), dim3(THREADS), st, a); });
        run("empty kernel, same grid", false, [&](cudaStream_t st) { embed_empty<<<T, THREADS, 0, st>>>(a); });
        run("lookup chain only, no copy", false,
            [&](cudaStream_t st) { embed_lookups_only<<<T, THREADS, 0, st>>>(a, sink); });
        run("h = 4096 only (upper bound)", true, [&](cudaStream_t st) { embed_h4096<<<T, THREADS, 0, st>>>(a); });
        CK(cudaFree(d_hidden));
        CK(cudaFree(sink));
        workload_release(w);
    }
    printf("%s\n", failures ? "FAIL" : "all bit-exact");
    return failures ? 1 : 0;
}
