/*
 * The four token-overlay kernels for AMD GPUs (HIP): the semantics of
 * docs/SPEC.md, bit for bit the same as the CPU reference (backends/cpu/).
 *
 * Written for AMD, correct for wave64 (CDNA) and wave32 (RDNA) alike: every
 * block has 256 threads and thread l is the spec's dot lane l, so a lane sums
 * its elements i = l, l + 256, ... in increasing order, and the 128..1 tree
 * runs in LDS with a barrier per level. Nothing uses cross-lane shuffles or
 * warpSize, so the wavefront size cannot change the result.
 *
 * Arithmetic: each product and each sum is its own f32 operation, rounded to
 * nearest even. HIP's __fmul_rn / __fadd_rn are plain * and +, so the build
 * passes -ffp-contract=off (and a test checks the code objects for fused
 * instructions); denormals are kept (-fno-gpu-flush-denormals-to-zero).
 *
 * Arguments: one struct per kernel, passed by value (include/tovl/kernel_args.h).
 * Launch shapes (hip_backend.c maps the core's logical grids onto them):
 *   rowdiff              blocks (rows, 1, 1)              one row per block
 *   embed_overlay        blocks (T, 1, 1)                 one token per block
 *   lmhead_overlay_*     blocks (T, ceil(max_n / 8), 1)   8 overlay rows per block
 *
 * The same file also compiles with nvcc through hip_on_cuda.h (a test runs
 * this port on an NVIDIA GPU); that path skips the HIP runtime header.
 */
#ifndef TOVL_HIP_ON_CUDA
#include <hip/hip_runtime.h>
#endif

#include "tovl/kernel_args.h"
#include "token_overlay_shape.h"

#define BLOCK TOVL_HIP_BLOCK_THREADS
#define LMHEAD_ROWS TOVL_HIP_LMHEAD_ROWS_PER_BLOCK

static_assert(BLOCK == TOVL_DOT_LANES, "one dot lane per thread");

/* bf16 -> f32 is exact. */
__device__ static inline float bf16_to_f32(uint16_t bits) {
    return __uint_as_float((uint32_t)bits << 16);
}

/* f32 -> bf16, nearest even; every NaN becomes 0x7FC0 (core/bf16.c). */
__device__ static inline uint16_t f32_to_bf16(float value) {
    uint32_t bits = __float_as_uint(value);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return 0x7FC0u;
    }
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* The bits an f32 logit is stored as: the canonical NaN for every NaN. */
__device__ static inline uint32_t f32_out_bits(float value) {
    uint32_t bits = __float_as_uint(value);
    return (bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : bits;
}

template <typename T>
__device__ static inline T *ptr(uint64_t devptr) {
    return reinterpret_cast<T *>(devptr);
}

/* The slot of row t: the per-row array when present, else the single slot. */
__device__ static inline int32_t row_slot(uint64_t slots, int32_t active_slot, uint32_t t) {
    return slots ? ptr<const int32_t>(slots)[t] : active_slot;
}

/* ------------------------------------------------------------------------ */
/* rowdiff: flags[r] = 1 when row r of a and b differ.                        */
/* ------------------------------------------------------------------------ */
extern "C" __global__ void __launch_bounds__(BLOCK) rowdiff(tovl_rowdiff_args args) {
    const uint32_t r = blockIdx.x;
    if (r >= args.rows) {
        return; /* whole block: no barrier is left waiting */
    }
    const uint16_t *a = ptr<const uint16_t>(args.a) + (size_t)r * args.h;
    const uint16_t *b = ptr<const uint16_t>(args.b) + (size_t)r * args.h;
    int differ = 0;
    if (args.tol > 0.0f) {
        for (uint32_t i = threadIdx.x; i < args.h; i += BLOCK) {
            const float fa = bf16_to_f32(a[i]);
            const float fb = bf16_to_f32(b[i]);
            /* |fa - fb| by clearing the sign bit: no math library call. A NaN
             * difference (Inf - Inf, NaN - NaN) compares false, as on the CPU. */
            const float gap = __uint_as_float(__float_as_uint(__fsub_rn(fa, fb)) & 0x7FFFFFFFu);
            differ |= (gap > args.tol) | ((fa != fa) != (fb != fb));
        }
    } else {
        for (uint32_t i = threadIdx.x; i < args.h; i += BLOCK) {
            differ |= a[i] != b[i];
        }
    }
    differ = __syncthreads_or(differ);
    if (threadIdx.x == 0) {
        ptr<uint32_t>(args.flags)[r] = differ ? 1u : 0u;
    }
}

/* ------------------------------------------------------------------------ */
/* embed_overlay: copy the slot's row over token t's gathered row.            */
/* ------------------------------------------------------------------------ */
extern "C" __global__ void __launch_bounds__(BLOCK) embed_overlay(tovl_embed_overlay_args args) {
    const uint32_t t = blockIdx.x;
    if (t >= args.T) {
        return;
    }
    const int32_t s = row_slot(args.token_slots, args.active_slot, t);
    if (s < 0 || (uint32_t)s >= args.max_loras) {
        return;
    }
    const uint64_t slot_map = ptr<const uint64_t>(args.slot_map_table)[s];
    const uint32_t id = ptr<const uint32_t>(args.token_ids)[t];
    if (slot_map == 0 || id >= args.vocab) {
        return;
    }
    const int32_t j = ptr<const int32_t>(slot_map)[id];
    if (j < 0 || (uint32_t)j >= ptr<const uint32_t>(args.n_table)[s]) {
        return;
    }
    const uint16_t *src = ptr<const uint16_t>(ptr<const uint64_t>(args.rows_table)[s]) + (size_t)j * args.h;
    uint16_t *dst = ptr<uint16_t>(args.hidden) + (size_t)t * args.h;
    for (uint32_t i = threadIdx.x; i < args.h; i += BLOCK) {
        dst[i] = src[i]; /* a bit copy: NaN payloads stay as they are */
    }
}

/* ------------------------------------------------------------------------ */
/* lmhead_overlay_{bf16,f32}: logits[t, ids[k]] = dot(hidden[t], rows[k]).    */
/* ------------------------------------------------------------------------ */
/* One block computes LMHEAD_ROWS dots of the same hidden row t, so each
 * element of hidden[t] is loaded once and used for all of them. */
template <bool F32_LOGITS>
__device__ static void lmhead_overlay(const tovl_lmhead_overlay_args &args) {
    __shared__ float partial[LMHEAD_ROWS][BLOCK];
    const uint32_t t = blockIdx.x;
    const uint32_t k0 = blockIdx.y * LMHEAD_ROWS;
    const uint32_t lane = threadIdx.x;
    if (t >= args.T) {
        return;
    }
    const int32_t s = row_slot(args.row_slots, args.active_slot, t);
    if (s < 0 || (uint32_t)s >= args.max_loras) {
        return;
    }
    const uint32_t n_slot = ptr<const uint32_t>(args.n_table)[s];
    const uint32_t n = n_slot < args.max_n ? n_slot : args.max_n;
    if (k0 >= n) {
        return;
    }
    const uint32_t rows_here = n - k0 < LMHEAD_ROWS ? n - k0 : LMHEAD_ROWS;
    const uint16_t *x = ptr<const uint16_t>(args.hidden) + (size_t)t * args.h;
    const uint16_t *w = ptr<const uint16_t>(ptr<const uint64_t>(args.rows_table)[s]) + (size_t)k0 * args.h;

    /* Lane sums: p[lane] = p[lane] + x[i] * w[i] for i = lane, lane + 256, ... */
    float p[LMHEAD_ROWS];
#pragma unroll
    for (uint32_t k = 0; k < LMHEAD_ROWS; k++) {
        p[k] = 0.0f;
    }
    for (uint32_t i = lane; i < args.h; i += BLOCK) {
        const float xi = bf16_to_f32(x[i]);
#pragma unroll
        for (uint32_t k = 0; k < LMHEAD_ROWS; k++) {
            if (k < rows_here) {
                p[k] = __fadd_rn(p[k], __fmul_rn(xi, bf16_to_f32(w[(size_t)k * args.h + i])));
            }
        }
    }

    /* The tree: p[l] = p[l] + p[l + stride] for stride 128, 64, ..., 1. */
#pragma unroll
    for (uint32_t k = 0; k < LMHEAD_ROWS; k++) {
        partial[k][lane] = p[k];
    }
    __syncthreads();
    for (uint32_t stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (lane < stride) {
#pragma unroll
            for (uint32_t k = 0; k < LMHEAD_ROWS; k++) {
                partial[k][lane] = __fadd_rn(partial[k][lane], partial[k][lane + stride]);
            }
        }
        __syncthreads();
    }

    if (lane < rows_here) {
        const uint32_t id = ptr<const uint32_t>(ptr<const uint64_t>(args.ids_table)[s])[k0 + lane];
        if (id < args.vocab) {
            const size_t cell = (size_t)t * args.ld + id;
            if (F32_LOGITS) {
                ptr<uint32_t>(args.logits)[cell] = f32_out_bits(partial[lane][0]);
            } else {
                ptr<uint16_t>(args.logits)[cell] = f32_to_bf16(partial[lane][0]);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) lmhead_overlay_bf16(tovl_lmhead_overlay_args args) {
    lmhead_overlay<false>(args);
}

extern "C" __global__ void __launch_bounds__(BLOCK) lmhead_overlay_f32(tovl_lmhead_overlay_args args) {
    lmhead_overlay<true>(args);
}
