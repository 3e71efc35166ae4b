/*
 * HIP's device built-ins on the host, over the CUDA port's kernel emulation
 * (backends/cuda/emu/cuda_emu.h): lets the kernel emulation run the HIP
 * port's token_overlay.hip, compiled as host C++ with TOVL_HIP_EMU, at a warp
 * width of 32 (RDNA's wave32) or 64 (CDNA's wave64). The width is the
 * launch's (tovl_hip_emu_launch); warpSize, __ballot and the shuffles follow
 * it. The CUDA emulation's __fmaf_rn and its 16-bit-half max / add-min stand
 * in for the lm_head tiles' fused path and range check (AMD's packed 16-bit
 * operations compute the same halves). Test-only C++.
 */
#ifndef TOVL_HIP_EMU_H
#define TOVL_HIP_EMU_H

#include "../../cuda/emu/cuda_emu.h"

namespace tovl_emu {
/* HIP's masks name the whole wavefront. */
inline uint64_t hip_all_lanes() {
    return warp_size() == 64 ? ~(uint64_t)0 : 0xFFFFFFFFu;
}
} // namespace tovl_emu

/* HIP: a 64-bit mask of the wavefront's lanes (bit l: lane l). */
inline unsigned long long __ballot(int predicate) {
    return tovl_emu::ballot(tovl_emu::hip_all_lanes(), predicate != 0);
}
template <typename T>
inline T __shfl_down(T value, unsigned delta, int width = (int)warpSize) {
    return tovl_emu::from_bits<T>(
        tovl_emu::shfl_down(tovl_emu::hip_all_lanes(), tovl_emu::bits_of(value), delta, (unsigned)width));
}

template <typename T>
inline T __shfl(T value, int src_lane, int width = (int)warpSize) {
    return tovl_emu::from_bits<T>(
        tovl_emu::shfl_idx(tovl_emu::hip_all_lanes(), tovl_emu::bits_of(value), (unsigned)src_lane, (unsigned)width));
}

#endif /* TOVL_HIP_EMU_H */
