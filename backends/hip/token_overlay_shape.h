/* The launch shape of the HIP kernels, shared by token_overlay.hip and the
 * host code that maps the core's logical grids onto it (plain C and C++). */
#ifndef TOVL_HIP_TOKEN_OVERLAY_SHAPE_H
#define TOVL_HIP_TOKEN_OVERLAY_SHAPE_H

/* Threads per block for every kernel: one per dot lane (TOVL_DOT_LANES). */
#define TOVL_HIP_BLOCK_THREADS 256
/* lmhead_overlay_*: overlay rows one block computes (it loads hidden[t] once
 * for all of them); grid.y = ceil(max_n / this). */
#define TOVL_HIP_LMHEAD_ROWS_PER_BLOCK 8

/* The lm_head kernels' grid.y in blocks for the logical grid.y (max_n). */
static inline unsigned int tovl_hip_lmhead_blocks_y(unsigned int max_n) {
    return max_n / TOVL_HIP_LMHEAD_ROWS_PER_BLOCK + (max_n % TOVL_HIP_LMHEAD_ROWS_PER_BLOCK != 0);
}

#endif
