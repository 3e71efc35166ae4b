/*
 * What the CUDA kernels share: the spec's bf16 rules, pointer and slot helpers,
 * 16-byte loads. Built by nvcc for the fatbin, and by the host C++ compiler
 * with TOVL_CUDA_EMU defined, where emu/cuda_emu.h supplies CUDA's built-ins
 * so the test suite can run these very kernels on a machine without a GPU.
 */
#ifndef TOVL_CUDA_KERNELS_COMMON_CUH
#define TOVL_CUDA_KERNELS_COMMON_CUH

#if defined(TOVL_CUDA_EMU)
#include "../emu/cuda_emu.h"
#define TOVL_CUDA_KERNEL static
#define TOVL_UNROLL
#define TOVL_NO_UNROLL
#else
#define TOVL_CUDA_KERNEL extern "C" __global__
#define TOVL_UNROLL _Pragma("unroll")
#define TOVL_NO_UNROLL _Pragma("unroll 1")
#endif

#include <stdint.h>

#include "launch_shape.h"
#include "tovl/kernel_args.h"

namespace tovl_cuda {

constexpr unsigned FULL_MASK = 0xFFFFFFFFu;
constexpr unsigned WARP = 32;

template <typename T>
__device__ __forceinline__ T *ptr(uint64_t devptr) {
    return reinterpret_cast<T *>(devptr);
}

/* bf16 -> f32 is exact. */
__device__ __forceinline__ float bf16_to_f32(uint32_t bits) {
    return __uint_as_float(bits << 16);
}

/* The two bf16 of a little-endian pair word: element 2p (low) and 2p+1 (high). */
__device__ __forceinline__ float pair_lo(uint32_t pair) {
    return __uint_as_float(pair << 16);
}
__device__ __forceinline__ float pair_hi(uint32_t pair) {
    return __uint_as_float(pair & 0xFFFF0000u);
}

/* f32 -> bf16, nearest even, every NaN 0x7FC0 (core/bf16.c). */
__device__ __forceinline__ uint16_t f32_to_bf16(float value) {
    const uint32_t bits = __float_as_uint(value);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return 0x7FC0u;
    }
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* The bits an f32 logit is stored as: the canonical NaN for every NaN. */
__device__ __forceinline__ uint32_t f32_out_bits(float value) {
    const uint32_t bits = __float_as_uint(value);
    return (bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : bits;
}

/* A load of data no kernel writes while it runs (the read-only data path). */
template <typename T>
__device__ __forceinline__ T ldg(const T *p) {
#if defined(TOVL_CUDA_EMU)
    tovl_emu::check_aligned(p, alignof(T));
    return *p;
#else
    return __ldg(p);
#endif
}

/* The slot of row t: the per-row array when present, else the single slot. */
__device__ __forceinline__ int32_t row_slot(uint64_t slots, int32_t active_slot, uint32_t t) {
    return slots ? ldg(ptr<const int32_t>(slots) + t) : active_slot;
}

__device__ __forceinline__ bool slot_valid(int32_t slot, uint32_t max_loras) {
    return slot >= 0 && (uint32_t)slot < max_loras;
}

__device__ __forceinline__ uint32_t lane_id() {
    return threadIdx.x & (WARP - 1);
}

/* Lanes of this warp below `lane` (PTX %lanemask_lt). */
__device__ __forceinline__ unsigned lanes_below(uint32_t lane) {
    return (1u << lane) - 1u;
}

/* Lane `from`'s 64-bit value, to every lane of the warp (all lanes call it). */
__device__ __forceinline__ uint64_t shfl_u64(uint64_t value, uint32_t from) {
    const uint32_t lo = __shfl_sync(FULL_MASK, (uint32_t)value, from);
    const uint32_t hi = __shfl_sync(FULL_MASK, (uint32_t)(value >> 32), from);
    return (uint64_t)hi << 32 | lo;
}

/* Elements before the first 16-byte boundary of a bf16 row at `p`. */
__device__ __forceinline__ uint32_t bf16_to_16b_boundary(const void *p) {
    return (uint32_t)((16u - ((uintptr_t)p & 15u)) & 15u) / 2u;
}

/* A 16-byte read-only load; p must be 16-byte aligned. */
__device__ __forceinline__ uint4 load16(const void *p) {
    return ldg(reinterpret_cast<const uint4 *>(p));
}

/* The N elements from e of a bf16 row one by one, as N / 2 pair words (0
 * past h): the path of the vector loads below where a vector does not fit. */
template <uint32_t N>
__device__ __forceinline__ void load_bf16_elements(const uint16_t *row, uint32_t e, uint32_t h,
                                                   uint32_t (&word)[N / 2]) {
    TOVL_UNROLL
    for (uint32_t i = 0; i < N / 2; i++) {
        word[i] = 0;
    }
    TOVL_UNROLL
    for (uint32_t i = 0; i < N; i++) {
        if (e + i < h) {
            word[i / 2] |= (uint32_t)ldg(row + e + i) << (16 * (i % 2));
        }
    }
}

/* The 8 elements from e of a bf16 row (0 past h), as a 16-byte vector: one
 * load when `vectors` (the row 16-byte aligned, h a multiple of 8) and the 8
 * lie within h, else element by element. */
__device__ __forceinline__ uint4 load8_bf16(const uint16_t *row, uint32_t e, uint32_t h, bool vectors) {
    if (vectors && e + 8 <= h) {
        return load16(row + e);
    }
    uint32_t word[4];
    load_bf16_elements<8>(row, e, h, word);
    return uint4{word[0], word[1], word[2], word[3]};
}

/* A 16-byte store; p must be 16-byte aligned. */
__device__ __forceinline__ void store16(void *p, uint4 v) {
#if defined(TOVL_CUDA_EMU)
    tovl_emu::check_aligned(p, 16);
#endif
    *reinterpret_cast<uint4 *>(p) = v;
}

/* A 16-byte store to global memory; p must be 16-byte aligned. One st.v4:
 * for the plain `*(uint4 *)p = v` of store16, nvcc emitted four 4-byte
 * stores where p came from a bf16 row pointer (embed_overlay's copy: this
 * alone took T = 512 from 2.58 to 2.38 us on the H200; docs/PERFORMANCE.md,
 * Embed hook). */
__device__ __forceinline__ void store16_global(void *p, uint4 v) {
#if defined(TOVL_CUDA_EMU)
    store16(p, v);
#else
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
#endif
}

/* A 16-byte copy from global to shared memory that completes asynchronously
 * (cp.async, sm_80 and newer: it does not pass through registers); it is
 * visible to this thread after copy_async_wait, to the block after a barrier
 * that follows it. Both addresses 16-byte aligned. Older GPUs copy at once;
 * the emulator keeps the copy in flight until a wait (emu/cuda_emu.h). */
__device__ __forceinline__ void copy16_async(void *shared_dst, const void *global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(shared_dst)),
                 "l"(global_src)
                 : "memory");
#elif defined(TOVL_CUDA_EMU)
    tovl_emu::copy_async16(shared_dst, global_src);
#else
    store16(shared_dst, load16(global_src));
#endif
}

/* Closes this thread's current group of copy16_async calls. */
__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(TOVL_CUDA_EMU)
    tovl_emu::copy_async_commit();
#endif
}

/* Waits until at most PENDING of this thread's newest groups are unfinished. */
template <int PENDING>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#elif defined(TOVL_CUDA_EMU)
    tovl_emu::copy_async_wait(PENDING);
#endif
}

/* copy_async_wait<pending> for a count known only once a loop is unrolled
 * (0..7). */
__device__ __forceinline__ void copy_async_wait_n(uint32_t pending) {
    switch (pending) {
    case 0: copy_async_wait<0>(); break;
    case 1: copy_async_wait<1>(); break;
    case 2: copy_async_wait<2>(); break;
    case 3: copy_async_wait<3>(); break;
    case 4: copy_async_wait<4>(); break;
    case 5: copy_async_wait<5>(); break;
    case 6: copy_async_wait<6>(); break;
    default: copy_async_wait<7>(); break;
    }
}

/* Programmatic dependent launch (sm_90 and newer). The host launches this
 * port's kernels with programmatic stream serialization (cuda_backend.c), so
 * a kernel may start while the kernel before it in the stream is still
 * finishing. Each kernel therefore reads nothing that an earlier kernel may
 * write (hidden rows, row slots, token ids, logits) before
 * grid_dependency_wait(), which returns once every prerequisite grid has
 * completed and its memory is visible; only the overlay set's own tables,
 * which no kernel writes, may be read before it. grid_dependents_launch()
 * lets the next kernel start launching its blocks (it still waits for this
 * grid's completion before it reads what this grid wrote); a block that
 * never calls it lets go when it exits. Both are no-ops on older GPUs, under
 * a plain launch, and in the emulator. */
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* Logit cell (t, id) of an lm_head launch: v as bf16, or as f32 bits with
 * every NaN canonical. The caller has checked id < vocab. */
template <bool F32_LOGITS>
__device__ __forceinline__ void store_logit(const tovl_lmhead_overlay_args &a, uint32_t t, uint32_t id, float v) {
    const size_t cell_at = (size_t)t * a.ld + id;
    if (F32_LOGITS) {
        ptr<uint32_t>(a.logits)[cell_at] = f32_out_bits(v);
    } else {
        ptr<uint16_t>(a.logits)[cell_at] = f32_to_bf16(v);
    }
}

template <typename T>
__device__ __forceinline__ T min_of(T a, T b) {
    return a < b ? a : b;
}
template <typename T>
__device__ __forceinline__ T max_of(T a, T b) {
    return a < b ? b : a;
}

} // namespace tovl_cuda

#endif /* TOVL_CUDA_KERNELS_COMMON_CUH */
