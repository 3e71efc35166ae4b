/*
 * Standalone microbenchmark of the CUDA port's embed_overlay and
 * lmhead_overlay_{bf16,f32} kernels on the bench workload of
 * tools/cmd_bench.c (h = 4096, vocab 152064, 8 slots x 64 overlay rows, row
 * slots random in 0..7 with 1 in 16 at -1, half the token ids overlaid).
 *
 * Needs only nvcc (no tovl build): it compiles the kernels of
 * backends/cuda/kernels/, the backend's launch geometry and the CPU
 * reference's dot itself, so -D overrides of launch_shape.h's tunables give
 * variants:
 *
 *   nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
 *        -Xcompiler -ffp-contract=off -Ibackends/cuda -Ibackends/cpu -Iinclude -Icore \
 *        bench/lmhead_microbench.cu backends/cuda/cuda_geometry.c backends/cpu/dot.c \
 *        core/bf16.c core/status.c -o /tmp/mb && /tmp/mb [seed]
 *
 * Every case is first checked bit for bit against the CPU reference's dot
 * (backends/cpu/dot.c: the C files must be built with -ffp-contract=off) on
 * every cell of the output, with poisoned outputs and sentinels on both sides; then 100
 * launches are captured in a CUDA graph and the median of 20 replays, per
 * launch, is printed. Exit status 1 on any mismatch. TOVL_MB_T=512,64 (the
 * default) chooses the batch sizes. Kernels are launched as the backend
 * launches them (programmatic dependent launch; TOVL_CUDA_PDL=0: plain).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

/* The kernels themselves (token_overlay.cu adds only the module ABI marker),
 * and the backend's launch geometry (a C header). */
#include "kernels/embed_overlay.cuh"
#include "kernels/lmhead_overlay.cuh"
#include "kernels/lmhead_row.cuh"
extern "C" {
#include "cpu_kernels.h" /* the reference: the spec's dot and the f32 logit bits */
#include "cuda_geometry.h"
}

#include "bench_workload.h"
#include "cuda_check.h"
#include "graph_timing.h"
#include "lmhead_check.h"

static const size_t GUARD = 4096; /* sentinel bytes each side of an output */
static const uint8_t POISON = 0xA5, SENTINEL = 0x5C;

/* Device buffer with sentinels around it. */
struct Guarded {
    uint8_t *base = nullptr;
    size_t bytes = 0;
    void alloc(size_t n) {
        bytes = n;
        CK(cudaMalloc(&base, n + 2 * GUARD));
    }
    uint64_t dev() const { return (uint64_t)(uintptr_t)(base + GUARD); }
    void poison() {
        CK(cudaMemset(base, SENTINEL, GUARD));
        CK(cudaMemset(base + GUARD, POISON, bytes));
        CK(cudaMemset(base + GUARD + bytes, SENTINEL, GUARD));
    }
    void upload(const void *src) {
        poison();
        CK(cudaMemcpy(base + GUARD, src, bytes, cudaMemcpyHostToDevice));
    }
    bool fetch(std::vector<uint8_t> &out) {
        std::vector<uint8_t> all(bytes + 2 * GUARD);
        CK(cudaMemcpy(all.data(), base, all.size(), cudaMemcpyDeviceToHost));
        bool ok = true;
        for (size_t i = 0; i < GUARD; i++)
            ok &= all[i] == SENTINEL && all[GUARD + bytes + i] == SENTINEL;
        out.assign(all.begin() + GUARD, all.begin() + GUARD + bytes);
        return ok;
    }
};

static int sm_count() {
    int dev, n;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
}

/* The backend's own launch geometry (backends/cuda/cuda_geometry.c, built
 * into this program) for one kernel; exits on an error. */
static tovl_cuda_launch native_launch(tovl_cuda_kernel_id kernel, uint32_t x, uint32_t y, const void *args,
                                      const tovl_cuda_device_shape &device) {
    const uint32_t logical[3] = {x, y, 1};
    tovl_cuda_launch shape;
    if (tovl_cuda_native_launch(kernel, logical, args, &device, &shape) != TOVL_OK) {
        fprintf(stderr, "launch geometry: %s\n", tovl_last_error());
        exit(2);
    }
    return shape;
}

static dim3 dim3_of(const uint32_t (&v)[3]) {
    return dim3(v[0], v[1], v[2]);
}

/* The lm_head kernel and shape the backend would launch. TOVL_MB_FORCE=large|small|row|row2|row4|row4q
 * launches that variant instead, to compare them. */
typedef void (*LmKernel)(tovl_lmhead_overlay_args);
struct LmLaunch {
    LmKernel fn;
    dim3 grid, block;
    const char *variant;
    int regs, spill; /* per thread: registers, local-memory bytes */
};
static LmLaunch lm_launch(const tovl_lmhead_overlay_args &a, bool f32) {
    tovl_cuda_launch shape =
        native_launch(f32 ? TOVL_CUDA_LMHEAD_F32 : TOVL_CUDA_LMHEAD_BF16, a.T, a.max_n, &a, {(uint32_t)sm_count()});
    static const char *const names[TOVL_CUDA_VARIANT_COUNT] = {"large", "small", "row", "row2", "row4", "row4q"};
    if (const char *force = getenv("TOVL_MB_FORCE")) {
        tovl_cuda_variant v = TOVL_CUDA_VARIANT_PLAIN; /* any other name: the large tiles */
        for (int i = 0; i < TOVL_CUDA_VARIANT_COUNT; i++) {
            if (strcmp(force, names[i]) == 0) {
                v = (tovl_cuda_variant)i;
            }
        }
        if (tovl_cuda_lmhead_shape(v, &a, &shape) != TOVL_OK) {
            fprintf(stderr, "launch geometry: %s\n", tovl_last_error());
            exit(2);
        }
    }
    static const LmKernel kernels[TOVL_CUDA_VARIANT_COUNT][2] = {
        {lmhead_overlay_bf16, lmhead_overlay_f32},
        {lmhead_overlay_bf16_small, lmhead_overlay_f32_small},
        {lmhead_overlay_bf16_row, lmhead_overlay_f32_row},
        {lmhead_overlay_bf16_row2, lmhead_overlay_f32_row2},
        {lmhead_overlay_bf16_row4, lmhead_overlay_f32_row4},
        {lmhead_overlay_bf16_row4q, lmhead_overlay_f32_row4q}};
    LmLaunch l;
    l.fn = kernels[shape.variant][f32];
    l.variant = names[shape.variant];
    l.grid = dim3_of(shape.grid);
    l.block = dim3_of(shape.block);
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, l.fn));
    l.regs = fa.numRegs;
    l.spill = (int)fa.localSizeBytes;
    return l;
}

static int failures = 0;

static void bench_lmhead(Workload &w, bool f32) {
    const size_t esz = f32 ? 4 : 2, bytes = (size_t)w.T * VOCAB * esz;
    Guarded logits;
    logits.alloc(bytes);
    logits.poison();
    const tovl_lmhead_overlay_args a = lmhead_args(w, logits.dev());
    const LmLaunch l = lm_launch(a, f32);
    backend_launch(l.fn, l.grid, l.block, 0, a);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> out;
    bool ok = logits.fetch(out);
    const LmheadCheck check = lmhead_check(w, out, f32, POISON);
    const bool pass = ok && check.bad == 0 && check.stray == 0;
    failures += !pass;
    const double us = graph_us([&](cudaStream_t st) { backend_launch(l.fn, l.grid, l.block, st, a); });
    /* Row groups the batch has (BM rows of one slot each): with the tiles'
     * columns, how many tiles there are, hence how many rounds they take. */
    uint32_t groups = 0;
    for (uint32_t s = 0; s < SLOTS; s++) {
        const uint32_t n = (uint32_t)std::count(w.slots.begin(), w.slots.end(), (int32_t)s);
        groups += (n + TOVL_CUDA_LMHEAD_BM - 1) / TOVL_CUDA_LMHEAD_BM;
    }
    printf("lmhead_overlay_%-4s T=%-4u %5zu cells %4u groups  %s  grid %ux%ux%u  %3d regs %3d B local  graph %8.2f us  %s\n",
           f32 ? "f32" : "bf16", w.T, check.cells, groups, l.variant, l.grid.x, l.grid.y, l.grid.z, l.regs, l.spill,
           us, pass ? "bit-exact" : "MISMATCH");
    if (!pass)
        printf("  mismatched cells %zu, stray bytes %zu, sentinels %s\n", check.bad, check.stray, ok ? "intact" : "HIT");
    CK(cudaFree(logits.base));
}

static void bench_embed(Workload &w) {
    Guarded hidden;
    hidden.alloc(w.hidden.size() * 2);
    hidden.upload(w.hidden.data());
    const tovl_embed_overlay_args a = embed_args(w, hidden.dev());
    const tovl_cuda_launch shape = native_launch(TOVL_CUDA_EMBED_OVERLAY, w.T, 1, &a, {(uint32_t)sm_count()});
    const dim3 grid = dim3_of(shape.grid), block = dim3_of(shape.block);
    const uint32_t blocks = grid.x * grid.y * grid.z;
    backend_launch(embed_overlay, grid, block, 0, a);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> out;
    bool ok = hidden.fetch(out);
    uint32_t hit;
    const std::vector<uint16_t> want = embed_expected(w, &hit);
    const bool pass = ok && memcmp(out.data(), want.data(), out.size()) == 0;
    failures += !pass;
    const double us = graph_us([&](cudaStream_t st) { backend_launch(embed_overlay, grid, block, st, a); });
    printf("embed_overlay       T=%-4u %5u rows   blocks %4u  graph %8.2f us  %s\n", w.T, hit, blocks, us,
           pass ? "bit-exact" : "MISMATCH");
    CK(cudaFree(hidden.base));
}

int main(int argc, char **argv) {
    std::mt19937_64 rng(bench_start(argc, argv, "lmhead_microbench"));
    /* TOVL_MB_T: other batch sizes, comma-separated (default 512,64). */
    const std::vector<uint32_t> sizes = bench_sizes({512u, 64u});
    /* As the backend does when it loads the module: the lm_head kernels let
     * the next launch start early only when their tiles outnumber the SMs. */
    const uint32_t sms = (uint32_t)sm_count();
    CK(cudaMemcpyToSymbol(tovl_cuda_sm_count, &sms, sizeof sms));
    for (uint32_t T : sizes) {
        Workload w;
        build(w, T, rng);
        bench_embed(w);
        bench_lmhead(w, false);
        bench_lmhead(w, true);
        workload_release(w);
    }
    printf("%s\n", failures ? "FAIL" : "all bit-exact");
    return failures ? 1 : 0;
}
