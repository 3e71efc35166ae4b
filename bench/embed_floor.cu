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
 * The kernels that copy are checked bit for bit against the expected hidden
 * rows first; the times are per-launch medians of 20 replays of 100 launches
 * in one CUDA graph. Exit status 1 on a mismatch.
 *
 *   nvcc -O3 -arch=sm_90 -Ibackends/cuda -Iinclude bench/embed_floor.cu \
 *        core/bf16.c -o /tmp/embed_floor && /tmp/embed_floor [seed]
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/embed_overlay.cuh"
extern "C" {
#include "tovl/tovl.h" /* tovl_f32_to_bf16 */
}

#include "cuda_check.h"
#include "graph_timing.h"

static const uint32_t H = 4096, VOCAB = 152064, SLOTS = 8, N = 64;
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

static uint16_t random_bf16(std::mt19937_64 &rng) {
    std::uniform_real_distribution<float> m(-1.0f, 1.0f);
    std::uniform_int_distribution<int> e(-6, 3);
    return tovl_f32_to_bf16(std::ldexp(m(rng), e(rng)));
}

template <class T>
static T *to_dev(const std::vector<T> &v) {
    T *p;
    CK(cudaMalloc(&p, v.size() * sizeof(T)));
    CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : std::random_device{}();
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("device %s, %d SMs; embed_floor seed %llu\n", p.name, p.multiProcessorCount, (unsigned long long)seed);
    std::mt19937_64 rng(seed);
    int failures = 0;
    std::vector<void *> allocations;
    for (uint32_t T : {512u, 64u}) {
        std::vector<uint16_t> hidden((size_t)T * H);
        for (auto &v : hidden) v = random_bf16(rng);
        std::vector<std::vector<uint16_t>> rows(SLOTS);
        std::vector<std::vector<int32_t>> slot_map(SLOTS, std::vector<int32_t>(VOCAB, -1));
        std::vector<std::vector<uint32_t>> ids(SLOTS);
        std::vector<uint64_t> rows_table(SLOTS), map_table(SLOTS);
        for (uint32_t s = 0; s < SLOTS; s++) {
            rows[s].resize((size_t)N * H);
            for (auto &v : rows[s]) v = random_bf16(rng);
            std::vector<uint32_t> all(VOCAB);
            for (uint32_t i = 0; i < VOCAB; i++) all[i] = i;
            for (uint32_t k = 0; k < N; k++) { /* distinct ids: partial shuffle */
                std::swap(all[k], all[k + rng() % (VOCAB - k)]);
                ids[s].push_back(all[k]);
                slot_map[s][all[k]] = (int32_t)k;
            }
            rows_table[s] = (uint64_t)(uintptr_t)to_dev(rows[s]);
            map_table[s] = (uint64_t)(uintptr_t)to_dev(slot_map[s]);
            allocations.push_back((void *)(uintptr_t)rows_table[s]);
            allocations.push_back((void *)(uintptr_t)map_table[s]);
        }
        std::vector<int32_t> slots(T);
        std::vector<uint32_t> token_ids(T);
        for (uint32_t t = 0; t < T; t++) {
            slots[t] = rng() % 16 == 0 ? -1 : (int32_t)(rng() % SLOTS);
            const uint32_t s = slots[t] < 0 ? 0 : (uint32_t)slots[t];
            token_ids[t] = rng() % 2 ? ids[s][rng() % N] : (uint32_t)(rng() % VOCAB);
        }
        std::vector<uint16_t> want = hidden;
        uint32_t copied = 0;
        for (uint32_t t = 0; t < T; t++) {
            if (slots[t] < 0) continue;
            const int32_t j = slot_map[slots[t]][token_ids[t]];
            if (j < 0) continue;
            copied++;
            memcpy(&want[(size_t)t * H], &rows[slots[t]][(size_t)j * H], H * 2);
        }
        uint16_t *d_hidden = to_dev(hidden);
        int32_t *sink;
        CK(cudaMalloc(&sink, T * sizeof(int32_t)));
        tovl_embed_overlay_args a = {};
        a.hidden = (uint64_t)(uintptr_t)d_hidden;
        a.token_ids = (uint64_t)(uintptr_t)to_dev(token_ids);
        a.token_slots = (uint64_t)(uintptr_t)to_dev(slots);
        a.slot_map_table = (uint64_t)(uintptr_t)to_dev(map_table);
        a.rows_table = (uint64_t)(uintptr_t)to_dev(rows_table);
        a.n_table = (uint64_t)(uintptr_t)to_dev(std::vector<uint32_t>(SLOTS, N));
        a.T = T;
        a.h = H;
        a.vocab = VOCAB;
        a.max_loras = SLOTS;
        a.active_slot = -1;
        for (uint64_t d : {a.hidden, a.token_ids, a.token_slots, a.slot_map_table, a.rows_table, a.n_table})
            allocations.push_back((void *)(uintptr_t)d);
        allocations.push_back(sink);
        /* Runs `launch` once on fresh rows and compares them, then times it. */
        const auto run = [&](const char *name, bool copies, auto launch) {
            CK(cudaMemcpy(d_hidden, hidden.data(), hidden.size() * 2, cudaMemcpyHostToDevice));
            launch(cudaStream_t(0));
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            const char *verdict = "";
            if (copies) {
                std::vector<uint16_t> out(hidden.size());
                CK(cudaMemcpy(out.data(), d_hidden, out.size() * 2, cudaMemcpyDeviceToHost));
                const bool ok = memcmp(out.data(), want.data(), out.size() * 2) == 0;
                failures += !ok;
                verdict = ok ? "bit-exact" : "MISMATCH";
            }
            printf("T=%-4u %3u rows  %-34s %6.2f us  %s\n", T, copied, name, graph_us(launch), verdict);
        };
        run("embed_overlay (the port's kernel)", true,
            [&](cudaStream_t st) { embed_overlay<<<T, THREADS, 0, st>>>(a); });
        run("empty kernel, same grid", false, [&](cudaStream_t st) { embed_empty<<<T, THREADS, 0, st>>>(a); });
        run("lookup chain only, no copy", false,
            [&](cudaStream_t st) { embed_lookups_only<<<T, THREADS, 0, st>>>(a, sink); });
        run("h = 4096 only (upper bound)", true, [&](cudaStream_t st) { embed_h4096<<<T, THREADS, 0, st>>>(a); });
    }
    for (void *d : allocations) CK(cudaFree(d));
    printf("%s\n", failures ? "FAIL" : "all bit-exact");
    return failures ? 1 : 0;
}
