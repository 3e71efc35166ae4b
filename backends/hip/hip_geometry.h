/*
 * Launch geometry of the HIP backend: from the core's logical grid to the
 * blocks of token_overlay.hip (token_overlay_shape.h). Plain C with no
 * runtime dependency, so the kernel emulation (emu/) launches the kernels
 * exactly as the backend does.
 */
#ifndef TOVL_HIP_GEOMETRY_H
#define TOVL_HIP_GEOMETRY_H

#include <stddef.h>
#include <stdint.h>

#include "tovl/tovl.h"

/* The four kernels, in the order of the handles the backend gives out
 * (handle = index + 1). */
typedef enum tovl_hip_kernel_id {
    TOVL_HIP_ROWDIFF = 0,
    TOVL_HIP_EMBED_OVERLAY,
    TOVL_HIP_LMHEAD_BF16,
    TOVL_HIP_LMHEAD_F32,
    TOVL_HIP_KERNEL_COUNT
} tovl_hip_kernel_id;

extern const char *const tovl_hip_kernel_names[TOVL_HIP_KERNEL_COUNT];
extern const size_t tovl_hip_kernel_args_size[TOVL_HIP_KERNEL_COUNT];

/* The kernel of that name, or -1. */
int tovl_hip_kernel_by_name(const char *name);

/* The kernel a launch's handle names, after checking the handle and the
 * size of the argument struct; `backend` starts the message. */
tovl_status tovl_hip_check_launch(const char *backend, tovl_kernel kernel, const void *args, size_t args_size,
                                  tovl_hip_kernel_id *out);

/* HIP's grid limits on AMD: x * block below 2^32, y and z below 2^16. */
#define TOVL_HIP_MAX_GRID_X (0xFFFFFFFFu / 256u)
#define TOVL_HIP_MAX_GRID_YZ 65535u

/* Blocks of TOVL_HIP_BLOCK_THREADS threads for kernel `kernel` over the
 * logical grid: rowdiff ceil(rows / 8), embed T, lm_head (T, ceil(rows / 8)
 * capped at 65535, rows the logical grid's y, at most the arguments' max_n:
 * the blocks loop over the columns past it), or (T, max_n, capped) for T <=
 * TOVL_HIP_LMHEAD_SMALL_MAX_T: the kernel tells the small grid by its height
 * against max_n. A zero dimension means nothing to launch. TOVL_ERR_LAUNCH
 * past HIP's limits. */
tovl_status tovl_hip_blocks(tovl_hip_kernel_id kernel, const uint32_t logical[3], const void *args,
                            uint32_t blocks[3]);
/* The same, lm_head on the small-batch path's grid (T, max_n) while T <=
 * small_max_t (tovl_hip_blocks: TOVL_HIP_LMHEAD_SMALL_MAX_T; the kernel
 * emulation also 0, never, and UINT32_MAX, always). */
tovl_status tovl_hip_blocks_small_to(tovl_hip_kernel_id kernel, const uint32_t logical[3], const void *args,
                                     uint32_t small_max_t, uint32_t blocks[3]);

#endif /* TOVL_HIP_GEOMETRY_H */
