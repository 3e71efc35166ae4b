/* The HIP port's kernels for the host again, with the lm_head tiles at
 * every T (TOVL_HIP_LMHEAD_TILE_MIN_T 1; the backend launches them on the
 * other paths' grid, so not the small-batch path), so that the conformance
 * suite runs through the tiles as well as through the block-per-token path.
 * Test-only. */
#define TOVL_HIP_LMHEAD_TILE_MIN_T 1
#define TOVL_HIP_EMU_FINDER tovl_hip_emu_find_tiles_kernel
#include "hip_emu_kernels.cpp"
