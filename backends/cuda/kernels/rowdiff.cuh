/*
 * rowdiff: flags[r] = 1 when row r of the bf16 matrices a and b differ, else 0
 * (spec: bitwise for tol 0; for tol > 0, |f32(a) - f32(b)| > tol or a NaN on
 * one side only).
 *
 * A warp per row. The row is read with 16-byte loads from the first element
 * where both rows reach a 16-byte boundary, with scalar loads before it and
 * for the tail (rows of h = 100 or 4099 start at any even address); rows whose
 * offsets differ modulo 16 have no common boundary and are read scalar. Each
 * lane keeps UNROLL pairs of loads in flight; once a row is known to differ the
 * warp stops reading it.
 */
#ifndef TOVL_CUDA_KERNELS_ROWDIFF_CUH
#define TOVL_CUDA_KERNELS_ROWDIFF_CUH

#include "common.cuh"

namespace tovl_cuda {

/* Do two bf16 bit patterns differ under the tolerance rule? */
__device__ __forceinline__ bool bf16_differs(uint32_t a, uint32_t b, float tol) {
    if (!(tol > 0.0f)) {
        return a != b;
    }
    const float fa = bf16_to_f32(a), fb = bf16_to_f32(b);
    /* |fa - fb| by clearing the sign bit; a NaN difference compares false. */
    const float gap = __uint_as_float(__float_as_uint(__fsub_rn(fa, fb)) & 0x7FFFFFFFu);
    return gap > tol || ((fa != fa) != (fb != fb));
}

/* The same over two 16-byte vectors of 8 bf16. */
__device__ __forceinline__ bool bf16x8_differs(uint4 a, uint4 b, float tol) {
    if (!(tol > 0.0f)) {
        return ((a.x ^ b.x) | (a.y ^ b.y) | (a.z ^ b.z) | (a.w ^ b.w)) != 0;
    }
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
    bool differ = false;
    TOVL_UNROLL
    for (int i = 0; i < 4; i++) {
        differ |= bf16_differs(wa[i] & 0xFFFFu, wb[i] & 0xFFFFu, tol);
        differ |= bf16_differs(wa[i] >> 16, wb[i] >> 16, tol);
    }
    return differ;
}

} // namespace tovl_cuda

TOVL_CUDA_KERNEL void __launch_bounds__(TOVL_CUDA_ROWDIFF_THREADS) rowdiff(tovl_rowdiff_args args) {
    using namespace tovl_cuda;
    constexpr uint32_t UNROLL = 4;
    grid_dependency_wait(); /* a and b may come from the kernel before (common.cuh) */
    const uint32_t lane = lane_id();
    const uint32_t row = blockIdx.x * (TOVL_CUDA_ROWDIFF_THREADS / WARP) + threadIdx.x / WARP;
    if (row >= args.rows) {
        return; /* the whole warp */
    }
    const uint32_t h = args.h;
    const float tol = args.tol;
    const uint16_t *a = ptr<const uint16_t>(args.a) + (size_t)row * h;
    const uint16_t *b = ptr<const uint16_t>(args.b) + (size_t)row * h;

    uint32_t head = bf16_to_16b_boundary(a);
    if (head != bf16_to_16b_boundary(b) || head > h) {
        head = h;
    }
    bool differ = false;
    for (uint32_t i = lane; i < head; i += WARP) {
        differ |= bf16_differs(ldg(a + i), ldg(b + i), tol);
    }
    const uint32_t vectors = (h - head) / 8;
    const uint16_t *va = a + head, *vb = b + head;
    for (uint32_t v0 = 0; v0 < vectors; v0 += WARP * UNROLL) {
        uint4 xa[UNROLL] = {}, xb[UNROLL] = {};
        TOVL_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            const uint32_t v = v0 + u * WARP + lane;
            if (v < vectors) {
                xa[u] = load16(va + (size_t)v * 8);
                xb[u] = load16(vb + (size_t)v * 8);
            }
        }
        TOVL_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            if (v0 + u * WARP + lane < vectors) {
                differ |= bf16x8_differs(xa[u], xb[u], tol);
            }
        }
        if (__any_sync(FULL_MASK, differ)) {
            break; /* known to differ: the rest of the row need not be read */
        }
    }
    for (uint32_t i = head + vectors * 8 + lane; i < h; i += WARP) {
        differ |= bf16_differs(ldg(a + i), ldg(b + i), tol);
    }
    differ = __any_sync(FULL_MASK, differ);
    if (lane == 0) {
        ptr<uint32_t>(args.flags)[row] = differ ? 1u : 0u;
    }
}

#endif /* TOVL_CUDA_KERNELS_ROWDIFF_CUH */
