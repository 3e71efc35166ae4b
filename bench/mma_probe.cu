/*
 * Probe: can the tensor cores form the spec's products, leaving one FADD per
 * multiply-add?  (Seventh session, issue 6; not part of the library.)
 *
 * The spec's dot rounds each product to f32 and then each sum.  A bf16 x bf16
 * product has at most 16 significant bits, so it is an exact f32 whenever its
 * exponent stays in f32's normal range.  mma.m16n8k8 (bf16 in, f32 out)
 * with a B operand that is diagonal (B[k][n] = w[k0 + n] when k == n, else
 * 0) returns D[t][n] = x[t][k0 + n] * w[k0 + n]: 128 products per warp
 * instruction, each the only nonzero term of its sum.  If the tensor core
 * returns those exactly, the FP32 pipe is left with one FADD per
 * multiply-add (the kept kernel spends 4.2 instructions, the fused v3
 * prototype 3.1).
 *
 * Part 1 (exactness): millions of random tiles, D compared bit for bit with
 * the host's f32 product; classes: exponents in [64, 190] or zero (the range
 * the sixth session's check admits), any finite bf16 (informational), and
 * D = C + product (is the tensor core's own add the spec's RNE add?).
 * Part 2 (rate): the inner loop of a kernel built that way, operands in
 * shared memory, every lane sum checked against the spec's per-lane order on
 * the host, then timed with clock64 over many passes: multiply-adds per clock
 * per SM, against the same loop with the operands held in registers.
 *
 *   nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true \
 *        -Xcompiler -ffp-contract=off -Iinclude bench/mma_probe.cu core/bf16.c \
 *        -o /tmp/mma_probe && /tmp/mma_probe [seed]
 *
 * Exit status 1 when a check that must hold fails (part 1's in-range class,
 * part 2's lane sums); the other classes only print their counts.
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "tovl/tovl.h" /* tovl_bf16_to_f32, tovl_f32_to_bf16 */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* D = A * B + C, A 16 x 8 row-major bf16 (2 registers), B 8 x 8 column-major
 * bf16 (1 register), C and D 16 x 8 f32 (4 registers each).  Fragments, with
 * g = lane / 4 and q = lane % 4: a0 = A[g][2q, 2q+1], a1 = A[g+8][2q, 2q+1];
 * b = B[2q, 2q+1][g]; c/d[0,1] = [g][2q, 2q+1], c/d[2,3] = [g+8][2q, 2q+1]. */
__device__ __forceinline__ void mma_16x8x8(float d[4], uint32_t a0, uint32_t a1, uint32_t b,
                                           float c0, float c1, float c2, float c3) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%8,%9,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
}

/* ---- Part 1: exactness -------------------------------------------------- */

/* One warp per tile: x[16][8], w[8], c[16][8]; writes D (C = 0) and D (C = c). */
__global__ void products_kernel(const uint16_t *x, const uint16_t *w, const float *c, float *d0,
                                float *dc, int tiles) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int tile = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (tile >= tiles) return;
    const uint16_t *xt = x + (size_t)tile * 128;
    const uint16_t *wt = w + (size_t)tile * 8;
    const float *ct = c + (size_t)tile * 128;
    const uint32_t a0 = xt[g * 8 + 2 * q] | (uint32_t)xt[g * 8 + 2 * q + 1] << 16;
    const uint32_t a1 = xt[(g + 8) * 8 + 2 * q] | (uint32_t)xt[(g + 8) * 8 + 2 * q + 1] << 16;
    /* Diagonal B: this thread holds B[2q][g] (low half) and B[2q+1][g] (high). */
    const uint32_t b = (g >> 1) == q ? (uint32_t)wt[g] << (16 * (g & 1)) : 0u;
    float d[4];
    mma_16x8x8(d, a0, a1, b, 0.f, 0.f, 0.f, 0.f);
    const int o0 = g * 8 + 2 * q, o1 = (g + 8) * 8 + 2 * q;
    float *dt = d0 + (size_t)tile * 128;
    dt[o0] = d[0];
    dt[o0 + 1] = d[1];
    dt[o1] = d[2];
    dt[o1 + 1] = d[3];
    mma_16x8x8(d, a0, a1, b, ct[o0], ct[o0 + 1], ct[o1], ct[o1 + 1]);
    dt = dc + (size_t)tile * 128;
    dt[o0] = d[0];
    dt[o0 + 1] = d[1];
    dt[o1] = d[2];
    dt[o1 + 1] = d[3];
}

/* A bf16 with a zero 1 time in 16, else the exponent field in [lo, hi]. */
static uint16_t draw_bf16(std::mt19937_64 &rng, int lo, int hi) {
    const uint64_t r = rng();
    if (r % 16 == 0) return (uint16_t)((r >> 8) & 1) << 15; /* +0 or -0 */
    const uint32_t e = (uint32_t)(lo + (int)((r >> 16) % (uint64_t)(hi - lo + 1)));
    return (uint16_t)(((r >> 8) & 1) << 15 | e << 7 | ((r >> 32) & 0x7f));
}

struct Part1Counts {
    long cells = 0, prod_bad = 0, add_rne_bad = 0, add_rz_bad = 0, sub_prod = 0, sub_bad = 0;
};

static float round_toward_zero_add(float a, float b) {
    const double s = (double)a + (double)b; /* exact: both f32, sum fits 53 bits unless far apart */
    float f = (float)s;                     /* RNE */
    if (std::isfinite(f) && std::fabs((double)f) > std::fabs(s)) f = std::nextafter(f, 0.0f);
    return f;
}

static int part1(std::mt19937_64 &rng, const char *label, int lo, int hi, int tiles) {
    std::vector<uint16_t> x((size_t)tiles * 128), w((size_t)tiles * 8);
    std::vector<float> c((size_t)tiles * 128), d0(c.size()), dc(c.size());
    for (auto &v : x) v = draw_bf16(rng, lo, hi);
    for (auto &v : w) v = draw_bf16(rng, lo, hi);
    for (size_t i = 0; i < c.size(); i++) {
        /* C near the product's magnitude, so that the add really rounds. */
        const float p = tovl_bf16_to_f32(x[i]) * tovl_bf16_to_f32(w[(i / 128) * 8 + i % 8]);
        const int shift = (int)(rng() % 41) - 20;
        float cv = std::ldexp(p == 0.f ? 1.0f : p, shift) * (1.0f + (float)(rng() % 1000000) * 1e-6f);
        if (rng() & 1) cv = -cv;
        c[i] = std::isfinite(cv) ? cv : 1.0f;
    }
    uint16_t *dx, *dw;
    float *dcin, *dd0, *ddc;
    CK(cudaMalloc(&dx, x.size() * 2));
    CK(cudaMalloc(&dw, w.size() * 2));
    CK(cudaMalloc(&dcin, c.size() * 4));
    CK(cudaMalloc(&dd0, c.size() * 4));
    CK(cudaMalloc(&ddc, c.size() * 4));
    CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcin, c.data(), c.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dd0, 0xA5, c.size() * 4)); /* poison */
    CK(cudaMemset(ddc, 0xA5, c.size() * 4));
    products_kernel<<<(tiles + 7) / 8, 256>>>(dx, dw, dcin, dd0, ddc, tiles);
    CK(cudaGetLastError());
    CK(cudaMemcpy(d0.data(), dd0, c.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dc.data(), ddc, c.size() * 4, cudaMemcpyDeviceToHost));
    Part1Counts k;
    for (size_t i = 0; i < c.size(); i++) {
        const float p = tovl_bf16_to_f32(x[i]) * tovl_bf16_to_f32(w[(i / 128) * 8 + i % 8]);
        const bool sub = p != 0.f && std::fabs(p) < 0x1p-126f;
        k.cells++;
        k.sub_prod += sub;
        /* +0 + p: the spec's first add; a zero product's sign cannot matter. */
        const bool bad = bits(d0[i]) != bits(p) && !(p == 0.f && d0[i] == 0.f);
        k.prod_bad += bad;
        k.sub_bad += bad && sub;
        k.add_rne_bad += bits(dc[i]) != bits(c[i] + p);
        k.add_rz_bad += bits(dc[i]) != bits(round_toward_zero_add(c[i], p));
    }
    printf("part1 %-34s cells %ld: product != f32 product: %ld (subnormal products %ld, of them wrong %ld); "
           "C + product != RNE add: %ld, != RZ add: %ld\n",
           label, k.cells, k.prod_bad, k.sub_prod, k.sub_bad, k.add_rne_bad, k.add_rz_bad);
    CK(cudaFree(dx));
    CK(cudaFree(dw));
    CK(cudaFree(dcin));
    CK(cudaFree(dd0));
    CK(cudaFree(ddc));
    return k.prod_bad;
}

/* ---- Part 2: the inner loop's rate ---------------------------------------- */

/* A block of 8 warps holds 32 tokens x 4 rows x all 256 lanes: warp w owns
 * the lane groups c = w + 8i (i < 4), lanes 8c .. 8c+7.  Per window j and
 * group: one ldmatrix.x4 (x: tokens 0-31, elements 256j + 8c .. +7), one
 * 8-byte shared load of w^T (4 rows at element 256j + 8c + g), 4 PRMT to
 * place each row's value on B's diagonal, 8 MMA, 32 FADD. */
constexpr int P2_TOK = 32, P2_ROWS = 4, P2_WARPS = 8;
constexpr int P2_WINDOWS = 2;                 /* staged: 512 elements per row */
constexpr int P2_K = 256 * P2_WINDOWS;
constexpr int P2_XPITCH = P2_K + 8;           /* elements; +16 B keeps ldmatrix rows off one bank */

struct Part2Smem {
    uint16_t x[P2_TOK][P2_XPITCH];
    uint16_t wt[P2_K][P2_ROWS];               /* transposed: 4 rows of one element in 8 bytes */
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *row_addr) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(row_addr);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* REG_OPERANDS: load the fragments once and loop on them (the ceiling of the
 * MMA + FADD mix alone). */
template <bool REG_OPERANDS, int GROUPS, bool HMMA_ONLY>
__global__ void __launch_bounds__(256, 4 / GROUPS)
    lanes_kernel(const uint16_t *x, const uint16_t *w, float *lane_sums, long long *cycles,
                 int passes) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Part2Smem &sm = *reinterpret_cast<Part2Smem *>(smem_raw);
    for (int i = threadIdx.x; i < P2_TOK * P2_K; i += blockDim.x)
        sm.x[i / P2_K][i % P2_K] = x[i];
    for (int i = threadIdx.x; i < P2_ROWS * P2_K; i += blockDim.x)
        sm.wt[i % P2_K][i / P2_K] = w[i];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    /* PRMT selectors (byte 4..7 = the zero operand): row 2m of a loaded word
     * is its bytes 0-1, row 2m+1 bytes 2-3; a diagonal thread puts it in half
     * g & 1, the others take zeros. */
    const bool diag = (g >> 1) == q;
    const uint32_t sel_even = !diag ? 0x4444u : (g & 1) ? 0x1044u : 0x4410u;
    const uint32_t sel_odd = !diag ? 0x4444u : (g & 1) ? 0x3244u : 0x4432u;
    /* ldmatrix.x4: lanes 0-7 address tokens 0-7, 8-15 tokens 8-15, ... */
    const uint16_t *xrow = &sm.x[lane][0];

    float acc[GROUPS][2][P2_ROWS][4] = {};

    uint32_t ra[GROUPS][4], rb[GROUPS][P2_ROWS];
    if (REG_OPERANDS) {
#pragma unroll
        for (int i = 0; i < GROUPS; i++) {
            const int k0 = 8 * (warp + 8 * i);
            ldmatrix_x4(ra[i], xrow + k0);
            const uint2 wv = *reinterpret_cast<const uint2 *>(&sm.wt[k0 + g][0]);
            rb[i][0] = __byte_perm(wv.x, 0u, sel_even);
            rb[i][1] = __byte_perm(wv.x, 0u, sel_odd);
            rb[i][2] = __byte_perm(wv.y, 0u, sel_even);
            rb[i][3] = __byte_perm(wv.y, 0u, sel_odd);
        }
    }
    __syncwarp();
    const long long t0 = clock64();
    for (int pass = 0; pass < passes; pass++) {
#pragma unroll 1
        for (int j = 0; j < P2_WINDOWS; j++) {
#pragma unroll
            for (int i = 0; i < GROUPS; i++) {
                const int k0 = 256 * j + 8 * (warp + 8 * i);
                uint32_t a[4], b[P2_ROWS];
                if (REG_OPERANDS) {
#pragma unroll
                    for (int e = 0; e < 4; e++) a[e] = ra[i][e];
#pragma unroll
                    for (int r = 0; r < P2_ROWS; r++) b[r] = rb[i][r];
                } else {
                    ldmatrix_x4(a, xrow + k0);
                    const uint2 wv = *reinterpret_cast<const uint2 *>(&sm.wt[k0 + g][0]);
                    b[0] = __byte_perm(wv.x, 0u, sel_even);
                    b[1] = __byte_perm(wv.x, 0u, sel_odd);
                    b[2] = __byte_perm(wv.y, 0u, sel_even);
                    b[3] = __byte_perm(wv.y, 0u, sel_odd);
                }
#pragma unroll
                for (int ta = 0; ta < 2; ta++)
#pragma unroll
                    for (int r = 0; r < P2_ROWS; r++) {
                        float d[4];
                        /* a[2ta] = tokens 16ta + g, a[2ta+1] = tokens 16ta + 8 + g */
                        if (HMMA_ONLY) { /* the tensor pipe's own rate: accumulate in the MMA */
                            float *c = acc[i][ta][r];
                            mma_16x8x8(c, a[2 * ta], a[2 * ta + 1], b[r], c[0], c[1], c[2], c[3]);
                        } else {
                            mma_16x8x8(d, a[2 * ta], a[2 * ta + 1], b[r], 0.f, 0.f, 0.f, 0.f);
#pragma unroll
                            for (int e = 0; e < 4; e++) acc[i][ta][r][e] = __fadd_rn(acc[i][ta][r][e], d[e]);
                        }
                    }
            }
        }
    }
    const long long t1 = clock64();
    if (lane == 0) cycles[blockIdx.x * P2_WARPS + warp] = t1 - t0;
    /* lane_sums[block][token][row][lane]: lane 8c + 2q + (e & 1), token 16ta + g + 8 (e >> 1). */
    float *out = lane_sums + (size_t)blockIdx.x * P2_TOK * P2_ROWS * 256;
#pragma unroll
    for (int i = 0; i < GROUPS; i++)
#pragma unroll
        for (int ta = 0; ta < 2; ta++)
#pragma unroll
            for (int r = 0; r < P2_ROWS; r++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = warp + 8 * i, t = 16 * ta + g + 8 * (e >> 1), l = 8 * c + 2 * q + (e & 1);
                    out[((size_t)t * P2_ROWS + r) * 256 + l] = acc[i][ta][r][e];
                }
}

static float draw_value(std::mt19937_64 &rng) { /* in the range the check admits, no zeros */
    for (;;) {
        const uint16_t b = draw_bf16(rng, 118, 130);
        if ((b & 0x7fff) != 0) return tovl_bf16_to_f32(b);
    }
}

template <bool REG, int GROUPS, bool HMMA_ONLY>
static int part2(std::mt19937_64 &rng, int sms, int passes, const char *label) {
    const int blocks = sms * (4 / GROUPS);
    std::vector<uint16_t> x(P2_TOK * P2_K), w(P2_ROWS * P2_K);
    for (auto &v : x) v = tovl_f32_to_bf16(draw_value(rng));
    for (auto &v : w) v = tovl_f32_to_bf16(draw_value(rng));
    uint16_t *dx, *dw;
    float *dsum;
    long long *dcyc;
    const size_t nsum = (size_t)blocks * P2_TOK * P2_ROWS * 256;
    CK(cudaMalloc(&dx, x.size() * 2));
    CK(cudaMalloc(&dw, w.size() * 2));
    CK(cudaMalloc(&dsum, nsum * 4));
    CK(cudaMalloc(&dcyc, (size_t)blocks * P2_WARPS * 8));
    CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dsum, 0xA5, nsum * 4));
    const size_t smem = sizeof(Part2Smem);
    CK(cudaFuncSetAttribute(lanes_kernel<REG, GROUPS, HMMA_ONLY>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int bad = 0;
    /* Check: one pass, so each lane sums the 4 staged windows in order. */
    lanes_kernel<REG, GROUPS, HMMA_ONLY><<<blocks, 256, smem>>>(dx, dw, dsum, dcyc, 1);
    CK(cudaGetLastError());
    std::vector<float> got(nsum);
    CK(cudaMemcpy(got.data(), dsum, nsum * 4, cudaMemcpyDeviceToHost));
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < P2_TOK; t++)
            for (int r = 0; r < P2_ROWS; r++)
                for (int l = 0; l < 256; l++) {
                    if ((l / 8) % 8 + 8 * (GROUPS - 1) < l / 8 || HMMA_ONLY) continue; /* lanes no warp owns */
                    float want = 0.f;
                    for (int j = 0; j < P2_WINDOWS; j++) {
                        const int k = (REG ? 0 : 256 * j) + l; /* REG: the first window's operands every time */
                        const float p = tovl_bf16_to_f32(x[t * P2_K + k]) * tovl_bf16_to_f32(w[r * P2_K + k]);
                        want = want + p;
                    }
                    const float g = got[(((size_t)b * P2_TOK + t) * P2_ROWS + r) * 256 + l];
                    if (bits(g) != bits(want) && bad++ < 5)
                        printf("  mismatch block %d token %d row %d lane %d: %08x want %08x\n", b, t, r, l,
                               bits(g), bits(want));
                }
    /* Rate: many passes; clock64 per warp, median over warps. */
    lanes_kernel<REG, GROUPS, HMMA_ONLY><<<blocks, 256, smem>>>(dx, dw, dsum, dcyc, passes);
    CK(cudaGetLastError());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0));
    lanes_kernel<REG, GROUPS, HMMA_ONLY><<<blocks, 256, smem>>>(dx, dw, dsum, dcyc, passes);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<long long> cyc((size_t)blocks * P2_WARPS);
    CK(cudaMemcpy(cyc.data(), dcyc, cyc.size() * 8, cudaMemcpyDeviceToHost));
    std::sort(cyc.begin(), cyc.end());
    const double med = (double)cyc[cyc.size() / 2];
    const double macs_per_block = (double)P2_TOK * P2_ROWS * P2_K * passes * GROUPS / 4;
    printf("part2 %-40s blocks %d passes %d: lane sums %s (%d wrong); %.1f MAC/clk/SM "
           "(median warp %.0f cycles, %d blocks per SM); whole launch %.3f ms = %.2f TMAC/s\n",
           label, blocks, passes, HMMA_ONLY ? "not checked" : bad ? "WRONG" : "bit-exact", bad,
           macs_per_block / med * (4 / GROUPS), med, 4 / GROUPS, ms,
           macs_per_block * blocks / (ms * 1e-3) / 1e12);
    CK(cudaFree(dx));
    CK(cudaFree(dw));
    CK(cudaFree(dsum));
    CK(cudaFree(dcyc));
    return bad;
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 10) : std::random_device{}();
    printf("mma_probe seed %llu\n", (unsigned long long)seed);
    std::mt19937_64 rng(seed);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    int fail = 0;
    fail += part1(rng, "exponents [64,190] or zero", 64, 190, 1 << 16) != 0;
    part1(rng, "any finite bf16 (informational)", 0, 254, 1 << 16);
    part1(rng, "exponents [1,63] (informational)", 1, 63, 1 << 14);
    const int sms = prop.multiProcessorCount;
    fail += part2<false, 4, false>(rng, sms, 2000, "operands from shared, 8 warps/SM") != 0;
    fail += part2<true, 4, false>(rng, sms, 2000, "operands in registers, 8 warps/SM") != 0;
    fail += part2<false, 2, false>(rng, sms, 2000, "operands from shared, 16 warps/SM") != 0;
    fail += part2<true, 2, false>(rng, sms, 2000, "operands in registers, 16 warps/SM") != 0;
    fail += part2<true, 1, false>(rng, sms, 2000, "operands in registers, 32 warps/SM") != 0;
    part2<true, 4, true>(rng, sms, 2000, "HMMA alone, registers, 8 warps/SM");
    part2<true, 1, true>(rng, sms, 2000, "HMMA alone, registers, 32 warps/SM");
    printf("%s\n", fail ? "FAILED" : "ok");
    return fail ? 1 : 0;
}
