/*
 * PROTOTYPE measurement (sixth session): how fast blocks of 256 threads, one
 * per SM, stream 8 KB rows from an L2-resident 8 MB pool into the SM, by the
 * ways an lm_head kernel can stage them: plain 16-byte loads into registers
 * (no barrier), cp.async into a shared-memory ring with a barrier per row,
 * one bulk copy (cp.async.bulk + mbarrier) per row, and 16-byte loads held in
 * registers D rows ahead then stored to shared memory (a barrier per row).
 * Times by events around one launch (median of 15), so the empty launch
 * (printed) is included. nvcc -O3 -arch=sm_90a l2_stream.cu -o l2_stream
 */
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
constexpr int ROWB = 8192;
__device__ uint32_t sink;
// method 0: LDG.128 to registers, xor-reduce
template <int UNROLL>
__global__ void k_ldg(const uint4 *pool, int rows, int pool_rows, int seedmul) {
    uint32_t acc = 0;
    for (int r = 0; r < rows; r++) {
        const int row = (blockIdx.x * seedmul + r * 7919) % pool_rows;
        const uint4 *p = pool + (size_t)row * (ROWB / 16);
#pragma unroll
        for (int u = 0; u < ROWB / 16 / 256; u++) { uint4 v = __ldg(p + threadIdx.x + 256 * u); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    }
    if (acc == 0x12345678u) sink = acc;
}
// method 1: cp.async.cg 16 B into a ring of S slots of one row each, wait S-1 behind
template <int S>
__global__ void k_cpasync(const uint4 *pool, int rows, int pool_rows, int seedmul) {
    __shared__ uint4 ring[S][ROWB / 16];
    uint32_t acc = 0;
    for (int r = 0; r < rows + S - 1; r++) {
        if (r < rows) {
            const int row = (blockIdx.x * seedmul + r * 7919) % pool_rows;
            const uint4 *p = pool + (size_t)row * (ROWB / 16);
            for (int u = threadIdx.x; u < ROWB / 16; u += 256) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(&ring[r % S][u])), "l"(p + u) : "memory");
            }
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        if (r >= S - 1) {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1) : "memory");
            __syncthreads();
            acc ^= ring[(r - S + 1) % S][threadIdx.x].x;
            __syncthreads();
        }
    }
    if (acc == 0x12345678u) sink = acc;
}
// method 2: one bulk copy per row (8 KB) into a ring, mbarrier completion
template <int S>
__global__ void k_bulk(const uint4 *pool, int rows, int pool_rows, int seedmul) {
    __shared__ alignas(128) uint4 ring[S][ROWB / 16];
    __shared__ alignas(8) uint64_t bar[S];
    if (threadIdx.x == 0) for (int s = 0; s < S; s++) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"((uint32_t)__cvta_generic_to_shared(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    uint32_t acc = 0, phase[S] = {};
    auto issue = [&](int r) {
        const int row = (blockIdx.x * seedmul + r * 7919) % pool_rows;
        const uint4 *p = pool + (size_t)row * (ROWB / 16);
        uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar[r % S]);
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(b), "r"(ROWB) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"((uint32_t)__cvta_generic_to_shared(&ring[r % S][0])), "l"(p), "r"(ROWB), "r"(b) : "memory");
    };
    if (threadIdx.x == 0) for (int r = 0; r < S - 1 && r < rows; r++) issue(r);
    for (int r = 0; r < rows; r++) {
        if (threadIdx.x == 0 && r + S - 1 < rows) issue(r + S - 1);
        uint32_t b = (uint32_t)__cvta_generic_to_shared(&bar[r % S]);
        uint32_t done = 0;
        while (!done) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(b), "r"(phase[r % S]) : "memory");
        phase[r % S] ^= 1;
        acc ^= ring[r % S][threadIdx.x].x;
        __syncthreads();
    }
    if (acc == 0x12345678u) sink = acc;
}

// method 3: LDG.128 into registers D rows ahead, then STS into a 2-slot ring, one barrier per row
template <int D>
__global__ void k_regstage(const uint4 *pool, int rows, int pool_rows, int seedmul) {
    __shared__ uint4 ring[2][ROWB / 16];
    uint32_t acc = 0;
    uint4 buf[D][2];
    auto load = [&](int r, uint4 (&b)[2]) {
        const int row = (blockIdx.x * seedmul + r * 7919) % pool_rows;
        const uint4 *p = pool + (size_t)row * (ROWB / 16);
        b[0] = __ldg(p + threadIdx.x); b[1] = __ldg(p + threadIdx.x + 256);
    };
#pragma unroll
    for (int d = 0; d < D; d++) if (d < rows) load(d, buf[d]);
    for (int r = 0; r < rows; r += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            if (r + d < rows) {
                ring[(r + d) & 1][threadIdx.x] = buf[d][0];
                ring[(r + d) & 1][threadIdx.x + 256] = buf[d][1];
                if (r + d + D < rows) load(r + d + D, buf[d]);
                __syncthreads();
                acc ^= ring[(r + d) & 1][(threadIdx.x * 7) & 511].x;
            }
        }
    }
    if (acc == 0x12345678u) sink = acc;
}
template <class F> float time_us(F f) {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    f(); cudaDeviceSynchronize();
    std::vector<float> v;
    for (int i = 0; i < 15; i++) { cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); v.push_back(ms * 1000); }
    std::sort(v.begin(), v.end()); return v[v.size() / 2];
}
int main() {
    const int pool_rows = 1024; // 8 MB: L2-resident
    uint4 *pool; CK(cudaMalloc(&pool, (size_t)pool_rows * ROWB)); CK(cudaMemset(pool, 1, (size_t)pool_rows * ROWB));
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (int rows : {48, 480}) for (int blocks : {sms, 64}) {
        double bytes = (double)blocks * rows * ROWB;
        float t;
        t = time_us([&] { k_ldg<2><<<blocks, 256>>>(pool, rows, pool_rows, 37); });
        printf("rows %3d per block, blocks %3d\n", rows, blocks);
        printf("blocks %3d ldg.128 regs       %7.2f us  %6.2f TB/s\n", blocks, t, bytes / t / 1e6);
        t = time_us([&] { k_cpasync<2><<<blocks, 256>>>(pool, rows, pool_rows, 37); });
        printf("blocks %3d cp.async ring 2  %7.2f us  %6.2f TB/s\n", blocks, t, bytes / t / 1e6);
        t = time_us([&] { k_cpasync<4><<<blocks, 256>>>(pool, rows, pool_rows, 37); });
        printf("blocks %3d cp.async ring 4  %7.2f us  %6.2f TB/s\n", blocks, t, bytes / t / 1e6);
        t = time_us([&] { k_bulk<4><<<blocks, 256>>>(pool, rows, pool_rows, 37); });
        printf("blocks %3d bulk 8KB ring 4  %7.2f us  %6.2f TB/s\n", blocks, t, bytes / t / 1e6);
        t = time_us([&] { k_regstage<1><<<blocks, 256>>>(pool, rows, pool_rows, 37); });
        printf("blocks %3d regstage D1      %7.2f us  %6.2f TB/s\n", blocks, t, bytes / t / 1e6);
        t = time_us([&] { k_regstage<2><<<blocks, 256>>>(pool, rows, pool_rows, 37); });
        printf("blocks %3d regstage D2      %7.2f us  %6.2f TB/s\n", blocks, t, bytes / t / 1e6);
        t = time_us([&] { k_regstage<4><<<blocks, 256>>>(pool, rows, pool_rows, 37); });
        printf("blocks %3d regstage D4      %7.2f us  %6.2f TB/s\n", blocks, t, bytes / t / 1e6);
        t = time_us([&] { k_ldg<2><<<blocks, 256>>>(pool, 0, pool_rows, 37); });
        printf("blocks %3d empty            %7.2f us\n", blocks, t);
    }
    CK(cudaGetLastError());
    return 0;
}
