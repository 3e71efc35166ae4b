/*
 * The HIP port's kernels (token_overlay.hip) run by the host kernel
 * emulation of backends/cuda/emu at a warp width of 32 or 64, as the tests
 * see it (plain C). Test-only; not part of the library.
 */
#ifndef TOVL_HIP_EMU_API_H
#define TOVL_HIP_EMU_API_H

#include <stdbool.h>
#include <stdint.h>

#include "tovl/tovl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Run kernel `function` of token_overlay.hip over grid x block with its
 * argument struct, in warps of `warp` lanes (32: RDNA's wave32, 64: CDNA's
 * wave64). `seed` picks the order in which threads resume after each
 * barrier. lmhead_tiles: the kernels built to take the lm_head tiles at
 * every T (TOVL_HIP_LMHEAD_TILE_MIN_T 1). TOVL_ERR_LAUNCH names the problem. */
tovl_status tovl_hip_emu_launch(const char *function, const uint32_t grid[3], const uint32_t block[3],
                                const void *args, uint64_t seed, unsigned warp, bool lmhead_tiles);

/* Which lm_head path the emulated backend's launches take: the HIP
 * backend's choice, the tiles at every T (the kernels built with
 * TOVL_HIP_LMHEAD_TILE_MIN_T 1, on the other paths' grid), or the
 * small-batch path at every T (its grid at every T). */
typedef enum tovl_hip_emu_lmhead {
    TOVL_HIP_EMU_LMHEAD_AS_CHOSEN,
    TOVL_HIP_EMU_LMHEAD_TILES,
    TOVL_HIP_EMU_LMHEAD_SMALL
} tovl_hip_emu_lmhead;

/* A backend on host memory whose kernels are the emulated HIP kernels,
 * launched with the HIP backend's geometry (hip_geometry.c) in warps of
 * `warp` lanes, lm_head as `lmhead` says. */
tovl_status tovl_hip_emu_backend_open(unsigned warp, tovl_hip_emu_lmhead lmhead, uint64_t seed, tovl_backend **out);

#ifdef __cplusplus
}
#endif

#endif /* TOVL_HIP_EMU_API_H */
