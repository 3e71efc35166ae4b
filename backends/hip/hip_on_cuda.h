/*
 * Compiles the HIP port (token_overlay.hip) with nvcc, so its source can run on
 * an NVIDIA GPU in a test: force-included (nvcc -x cu -include hip_on_cuda.h),
 * it stands in for <hip/hip_runtime.h>, which token_overlay.hip then skips.
 * Debian's HIP 5.2 NVIDIA headers do not compile against CUDA 13, and the GPU
 * machine has none.
 *
 * The device API the port may use, and what it is on CUDA:
 *   threadIdx, blockIdx, blockDim, __shared__, __global__, __device__,
 *   __launch_bounds__(n)                       the same built-ins
 *   __syncthreads, __syncthreads_or             the same functions
 *   __fmul_rn, __fadd_rn, __fsub_rn             the same, never fused (and
 *                                              nvcc runs with --fmad=false)
 *   __fmaf_rn                                   the same: one rounding (the
 *                                              lm_head tiles' proven path)
 *   atomicAdd, atomicMax, atomicMin (unsigned)  the same functions
 *   __float_as_uint, __uint_as_float            the same
 *   warpSize                                    the same built-in (32)
 *   uint4                                       the same vector type
 *   __ballot(p)                                 __ballot_sync over the warp,
 *                                              widened to HIP's 64 bits
 *   __shfl_down(v, delta, width)                __shfl_down_sync over the warp
 *   __shfl(v, src_lane, width)                  __shfl_sync over the warp
 * A HIP-only name used in the port fails to compile here: map it below.
 * Under TOVL_HIP_ON_CUDA the port also calls sm_90's __vimax3_u16x2 and
 * __viaddmin_u16x2 where AMD has packed 16-bit operations (its range check).
 *
 * And the port's two hooks for programmatic dependent launch, empty on AMD:
 *   TOVL_HIP_GRID_DEPENDENCY_WAIT()     griddepcontrol.wait (sm_90 and newer)
 *   TOVL_HIP_GRID_DEPENDENTS_LAUNCH()   griddepcontrol.launch_dependents
 * with the module global tovl_cuda_dependent_launch that tells the CUDA
 * backend these kernels wait for the kernel before them (include/tovl/tovl_cuda.h).
 */
#ifndef TOVL_HIP_ON_CUDA_H
#define TOVL_HIP_ON_CUDA_H

#if !defined(__CUDACC__)
#error "hip_on_cuda.h is for nvcc only"
#endif

#define TOVL_HIP_ON_CUDA 1

#include <stddef.h>
#include <stdint.h>

#include "token_overlay_shape.h"

/* CUDA has deprecated warp-synchronous functions of these names (invalid on
 * sm_70 and newer): the port's calls are renamed to the _sync forms. */
__device__ __forceinline__ unsigned long long tovl_hip_ballot(int predicate) {
    return __ballot_sync(0xFFFFFFFFu, predicate);
}
template <typename T>
__device__ __forceinline__ T tovl_hip_shfl_down(T value, unsigned delta, int width = warpSize) {
    return __shfl_down_sync(0xFFFFFFFFu, value, delta, width);
}
template <typename T>
__device__ __forceinline__ T tovl_hip_shfl(T value, int src_lane, int width = warpSize) {
    return __shfl_sync(0xFFFFFFFFu, value, src_lane, width);
}
#define __ballot tovl_hip_ballot
#define __shfl_down tovl_hip_shfl_down
#define __shfl tovl_hip_shfl

/* Programmatic dependent launch, as the CUDA port's kernels/common.cuh: the
 * wait returns once the grids before this one have completed and their
 * memory is visible; launch_dependents lets the next grid start launching.
 * Both are no-ops under a plain launch. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TOVL_HIP_GRID_DEPENDENCY_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")
#define TOVL_HIP_GRID_DEPENDENTS_LAUNCH() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#endif
extern "C" __device__ const unsigned int tovl_cuda_dependent_launch = 1;

/* HIP's one-argument __launch_bounds__ (max threads per block) means the
 * same on CUDA; the port never passes HIP's second argument (min waves per
 * EU), whose CUDA meaning (min blocks per SM) differs. */

/* How tovl_cuda_backend_open_image launches this port (the convention of
 * include/tovl/tovl_cuda.h): {block_x, block_y, logical points x, y per
 * block}, and for lm_head's small-batch grid {up to this logical x (T),
 * block_x, block_y, points x, y per block}. As hip_geometry.c does: 256
 * threads; rowdiff 8 rows per block, embed one token per block, lm_head one
 * token and 8 overlay rows (logical y) per block, or for T <=
 * TOVL_HIP_LMHEAD_SMALL_MAX_T one token and TOVL_HIP_LMHEAD_SMALL_ROWS. */
extern "C" __device__ const unsigned int rowdiff_launch[4] = {TOVL_HIP_BLOCK_THREADS, 1,
                                                              TOVL_HIP_ROWDIFF_ROWS_PER_BLOCK, 1};
extern "C" __device__ const unsigned int embed_overlay_launch[4] = {TOVL_HIP_BLOCK_THREADS, 1, 1, 1};
extern "C" __device__ const unsigned int lmhead_overlay_bf16_launch[4] = {TOVL_HIP_BLOCK_THREADS, 1, 1,
                                                                          TOVL_HIP_LMHEAD_ROWS_PER_BLOCK};
extern "C" __device__ const unsigned int lmhead_overlay_f32_launch[4] = {TOVL_HIP_BLOCK_THREADS, 1, 1,
                                                                         TOVL_HIP_LMHEAD_ROWS_PER_BLOCK};
extern "C" __device__ const unsigned int lmhead_overlay_bf16_launch_small[5] = {
    TOVL_HIP_LMHEAD_SMALL_MAX_T, TOVL_HIP_BLOCK_THREADS, 1, 1, TOVL_HIP_LMHEAD_SMALL_ROWS};
extern "C" __device__ const unsigned int lmhead_overlay_f32_launch_small[5] = {
    TOVL_HIP_LMHEAD_SMALL_MAX_T, TOVL_HIP_BLOCK_THREADS, 1, 1, TOVL_HIP_LMHEAD_SMALL_ROWS};

#endif
