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
 *   __float_as_uint, __uint_as_float            the same
 * A HIP-only name used in the port fails to compile here: map it below.
 */
#ifndef TOVL_HIP_ON_CUDA_H
#define TOVL_HIP_ON_CUDA_H

#if !defined(__CUDACC__)
#error "hip_on_cuda.h is for nvcc only"
#endif

#define TOVL_HIP_ON_CUDA 1

#include <stdint.h>
#include <stddef.h>

/* HIP's one-argument __launch_bounds__ (max threads per block) means the
 * same on CUDA; the port never passes HIP's second argument (min waves per
 * EU), whose CUDA meaning (min blocks per SM) differs. */

#endif
