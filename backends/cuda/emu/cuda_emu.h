/*
 * CUDA's built-ins on the host, for running this port's kernels (the very
 * token_overlay.cu source, compiled as C++ with TOVL_CUDA_EMU) on a machine
 * without a GPU: the kernel emulation test checks their logic and dot order
 * bit for bit against the CPU reference, under the conformance suite.
 *
 * Every CUDA thread of a block is a fiber (a stack of its own, switched by a
 * few instructions on x86-64, by ucontext elsewhere or under
 * AddressSanitizer); fibers switch only at barriers and
 * warp collectives, and after each barrier the waiting fibers resume in a
 * random order, so code that needs a barrier it lacks shows up as a
 * mismatch. cp.async stays in flight until the issuing thread's wait (its
 * destination reads as poison until then), so a missing or short wait shows
 * up too. A collective or __syncthreads that not every thread (or lane)
 * reaches, a mask other than all lanes, or a misaligned vector access stops the
 * launch with an error. Floating point is the host's: IEEE single, round to
 * nearest even, subnormals kept (built with -ffp-contract=off).
 *
 * Test-only code: C++ because the kernels are CUDA C++; it is not part of the
 * library.
 */
#ifndef TOVL_CUDA_EMU_H
#define TOVL_CUDA_EMU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
/* One block runs at a time on one host thread: a function-static variable is
 * exactly one block's shared memory. */
#define __shared__ static thread_local

struct emu_dim3 {
    unsigned x, y, z;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float2 make_float2(float x, float y) {
    return float2{x, y};
}
inline float4 make_float4(float x, float y, float z, float w) {
    return float4{x, y, z, w};
}

namespace tovl_emu {

const emu_dim3 &thread_idx();
const emu_dim3 &block_idx();
const emu_dim3 &block_dim();
const emu_dim3 &grid_dim();
/* Lanes per warp of the running launch: 32, or 64 for AMD's wave64. */
unsigned warp_size();

/* Warp collectives. A mask must name every lane of the warp (0xFFFFFFFF in
 * a warp of 32, all 64 bits in one of 64): a 32-bit CUDA mask in a 64-wide
 * warp stops the launch. Shuffles act on segments of `width` lanes (a power
 * of two; 0 or more than the warp: the whole warp), as CUDA's and HIP's do. */
void syncthreads();
void syncwarp(uint64_t mask);
uint64_t ballot(uint64_t mask, bool predicate);
uint64_t match_any(uint64_t mask, uint32_t value);
uint32_t shfl_idx(uint64_t mask, uint32_t bits, unsigned src_lane, unsigned width);
uint32_t shfl_down(uint64_t mask, uint32_t bits, unsigned delta, unsigned width);
uint32_t shfl_up(uint64_t mask, uint32_t bits, unsigned delta, unsigned width);
uint32_t shfl_xor(uint64_t mask, uint32_t bits, unsigned lane_mask, unsigned width);
void check_aligned(const void *p, size_t alignment);

/* cp.async (sm_80 and newer), asynchronous as on the GPU: a copy's
 * destination holds ASYNC_POISON bytes from its issue until a
 * copy_async_wait of its thread lands the group it was committed in;
 * __syncthreads lands nothing. Both addresses must be 16-byte aligned. */
constexpr unsigned char ASYNC_POISON = 0xA5;
void copy_async16(void *shared_dst, const void *global_src);
void copy_async_commit();
/* Lands this thread's committed groups but the newest `pending`. */
void copy_async_wait(unsigned pending);

template <typename T>
inline uint32_t bits_of(T v) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    uint32_t b;
    memcpy(&b, &v, 4);
    return b;
}
template <typename T>
inline T from_bits(uint32_t b) {
    T v;
    memcpy(&v, &b, 4);
    return v;
}

} // namespace tovl_emu

#define threadIdx (::tovl_emu::thread_idx())
#define blockIdx (::tovl_emu::block_idx())
#define blockDim (::tovl_emu::block_dim())
#define gridDim (::tovl_emu::grid_dim())
#define warpSize (::tovl_emu::warp_size())

inline void __syncthreads() {
    tovl_emu::syncthreads();
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
    tovl_emu::syncwarp(mask);
}
/* CUDA's: 32-bit masks and results (its warps are 32 wide). */
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return (unsigned)tovl_emu::ballot(mask, predicate != 0);
}
inline int __any_sync(unsigned mask, int predicate) {
    return tovl_emu::ballot(mask, predicate != 0) != 0;
}
inline unsigned __match_any_sync(unsigned mask, unsigned value) {
    return (unsigned)tovl_emu::match_any(mask, value);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32) {
    return tovl_emu::from_bits<T>(
        tovl_emu::shfl_idx(mask, tovl_emu::bits_of(value), (unsigned)src_lane, (unsigned)width));
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
    return tovl_emu::from_bits<T>(tovl_emu::shfl_down(mask, tovl_emu::bits_of(value), delta, (unsigned)width));
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
    return tovl_emu::from_bits<T>(tovl_emu::shfl_up(mask, tovl_emu::bits_of(value), delta, (unsigned)width));
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T value, unsigned lane_mask, int width = 32) {
    return tovl_emu::from_bits<T>(tovl_emu::shfl_xor(mask, tovl_emu::bits_of(value), lane_mask, (unsigned)width));
}
/* Fibers switch only at barriers and collectives: a plain read-modify-write
 * is atomic (the HIP tiles join their range check's bounds by max and min). */
inline unsigned atomicAdd(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicMax(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old > v ? old : v;
    return old;
}
inline unsigned atomicMin(unsigned *p, unsigned v) {
    const unsigned old = *p;
    *p = old < v ? old : v;
    return old;
}
inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
inline int __ffs(int x) {
    return __builtin_ffs(x);
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
/* Each a single IEEE single operation (no contraction: -ffp-contract=off). */
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __fsub_rn(float a, float b) {
    return a - b;
}
/* sm_90's DPX operations on the two unsigned 16-bit halves of a word:
 * max(a, b, c) and min(a + b, c), each half on its own (the add wraps). */
inline unsigned __vimax3_u16x2(unsigned a, unsigned b, unsigned c) {
    unsigned r = 0;
    for (unsigned sh = 0; sh < 32; sh += 16) {
        unsigned x = (a >> sh) & 0xFFFFu, y = (b >> sh) & 0xFFFFu, z = (c >> sh) & 0xFFFFu;
        unsigned m = x > y ? x : y;
        r |= (m > z ? m : z) << sh;
    }
    return r;
}
inline unsigned __viaddmin_u16x2(unsigned a, unsigned b, unsigned c) {
    unsigned r = 0;
    for (unsigned sh = 0; sh < 32; sh += 16) {
        unsigned s = (((a >> sh) & 0xFFFFu) + ((b >> sh) & 0xFFFFu)) & 0xFFFFu, z = (c >> sh) & 0xFFFFu;
        r |= (s < z ? s : z) << sh;
    }
    return r;
}
/* One rounding of a * b + c (C's fmaf is correctly rounded). */
inline float __fmaf_rn(float a, float b, float c) {
    return __builtin_fmaf(a, b, c);
}

#endif /* TOVL_CUDA_EMU_H */
