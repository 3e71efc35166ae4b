/*
 * The kernel emulation as the tests see it (plain C): run this port's kernels
 * on the host, and a backend that does so through the CUDA backend's own
 * launch geometry. Test-only; not part of the library.
 */
#ifndef TOVL_CUDA_EMU_API_H
#define TOVL_CUDA_EMU_API_H

#include <stdint.h>

#include "../cuda_geometry.h"
#include "tovl/tovl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Run kernel `function` of token_overlay.cu ("rowdiff", "lmhead_overlay_f32_small",
 * ...) over grid x block with its argument struct. `seed` picks the order in
 * which threads resume after each barrier. TOVL_ERR_LAUNCH names the problem
 * (a barrier not every thread reaches, a misaligned vector access, ...). */
tovl_status tovl_cuda_emu_launch(const char *function, const uint32_t grid[3], const uint32_t block[3],
                                 const void *args, uint64_t seed);

/* The SM count the emulated kernels read, as the CUDA backend writes it into
 * its module (the gated pair of launch_shape.h); 0 until set. The emulated
 * backend sets its device's before each launch. */
void tovl_cuda_emu_set_sm_count(uint32_t sms);

/* A backend on host memory whose kernels are the emulated CUDA kernels,
 * launched with tovl_cuda_native_launch for a device of `shape`. */
tovl_status tovl_cuda_emu_backend_open(const tovl_cuda_device_shape *shape, uint64_t seed, tovl_backend **out);

/* The same, but every lm_head launch takes variant `lmhead` whatever the
 * batch (tovl_cuda_lmhead_shape), so that each variant can be run through the
 * whole conformance suite. */
tovl_status tovl_cuda_emu_backend_open_variant(const tovl_cuda_device_shape *shape, tovl_cuda_variant lmhead,
                                               uint64_t seed, tovl_backend **out);

#ifdef __cplusplus
}
#endif

#endif /* TOVL_CUDA_EMU_API_H */
