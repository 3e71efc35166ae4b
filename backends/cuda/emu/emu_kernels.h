/* The emulated kernels by name (emu_kernels.cpp compiles token_overlay.cu for
 * the host). Test-only C++. */
#ifndef TOVL_CUDA_EMU_KERNELS_H
#define TOVL_CUDA_EMU_KERNELS_H

#include <stdint.h>

#include "tovl/tovl.h"

namespace tovl_emu {

/* Runs one thread of a kernel with its argument struct. */
typedef void (*KernelThunk)(const void *args);

/* The SM count the kernels read (tovl_cuda_sm_count), as the backend writes
 * it into the module on a GPU. */
void set_sm_count(uint32_t sms);

/* NULL when token_overlay.cu has no kernel of that name. */
KernelThunk find_kernel(const char *name);

/* Runs `kernel` (named `function` in messages, NULL: no such kernel) of
 * `port` ("cuda", "hip") over grid x block with warps of `warp` lanes (32
 * or 64). */
tovl_status run_kernel(const char *port, const char *function, KernelThunk kernel, const uint32_t grid[3],
                       const uint32_t block[3], const void *args, uint64_t seed, unsigned warp);

} // namespace tovl_emu

#endif
