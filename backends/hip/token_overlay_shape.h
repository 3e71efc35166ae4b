/* The launch shape of the HIP kernels, shared by token_overlay.hip and the
 * host code that maps the core's logical grids onto it (hip_geometry.c,
 * hip_on_cuda.h). Plain C and C++.
 *
 * Every block has 256 threads, made of row groups of 32 threads: a group is
 * a whole warp on NVIDIA and RDNA (wave32) and half a wavefront on CDNA
 * (wave64), so no shape here depends on the warp width.
 *   rowdiff           a row group per row, 8 rows per block: grid ceil(rows / 8)
 *   embed_overlay     a block per token: grid T
 *   lmhead_overlay_*  a block per (token t, 8 overlay rows of its slot), a row
 *                     group per overlay row: grid (T, ceil(rows / 8)), rows
 *                     those the launch is shaped for (max_n, or fewer for a
 *                     fixed-shape set: kernel_args.h), y capped at 65535
 *                     (the blocks loop over the columns past the grid);
 *                     for T <= TOVL_HIP_LMHEAD_SMALL_MAX_T a block per
 *                     (token t, overlay row): grid (T, max_n), y capped
 */
#ifndef TOVL_HIP_TOKEN_OVERLAY_SHAPE_H
#define TOVL_HIP_TOKEN_OVERLAY_SHAPE_H

/* Threads per block for every kernel. */
#define TOVL_HIP_BLOCK_THREADS 256
/* Threads of a row group (rowdiff's row, an lm_head overlay row). */
#define TOVL_HIP_GROUP_THREADS 32
/* rowdiff: rows per block. */
#define TOVL_HIP_ROWDIFF_ROWS_PER_BLOCK (TOVL_HIP_BLOCK_THREADS / TOVL_HIP_GROUP_THREADS)
/* lmhead_overlay_*: overlay rows one block computes for its token, a row
 * group each; grid.y = ceil(rows / this). */
#define TOVL_HIP_LMHEAD_ROWS_PER_BLOCK (TOVL_HIP_BLOCK_THREADS / TOVL_HIP_GROUP_THREADS)

/* lmhead_overlay_*: the other paths' grid's y is capped here, and so is
 * the small-batch path's (HIP's limit); the blocks loop over further
 * columns. */
#define TOVL_HIP_LMHEAD_MAX_COLUMNS 65535u

/* lmhead_overlay_*: from this many rows T on, block x of the grid
 * (T, ceil(max_n / 8)) takes the x-th group of up to 8 rows of one slot
 * (tiles: each overlay row read once per group rather than once per row);
 * below it, block x is token x. A choice on the device from the arguments
 * alone, so the grid is the same either way. On the H200 (HIP source,
 * docs/HIP.md, 8 slots x 64 rows) the rows took 8.15 / 14.9 us at T = 64 /
 * 128 against 15.2 / 16.1 for the tiles, the tiles 24.7 at T = 256. */
#ifndef TOVL_HIP_LMHEAD_TILE_MIN_T /* the kernel emulation also builds the kernels with 1: tiles always */
#define TOVL_HIP_LMHEAD_TILE_MIN_T 256
#endif

/* lmhead_overlay_*: the small-batch path, a block per (token t,
 * TOVL_HIP_LMHEAD_SMALL_ROWS overlay rows), on its own grid (T,
 * ceil(max_n / SMALL_ROWS)), which the host gives while T is at most
 * TOVL_HIP_LMHEAD_SMALL_MAX_T (hip_geometry.c; hip_on_cuda.h's
 * lmhead_overlay_*_launch_small); the kernel tells the grids apart by their
 * height. On the H200 (HIP source, 8 slots x 64 rows, docs/HIP.md) it took
 * 2.42 / 2.58 / 3.03 us at T = 1 / 2 / 4 against 2.75 / 2.92 / 3.09 for a
 * block per token, and 4.95 at T = 8 against 2.97. */
#ifndef TOVL_HIP_LMHEAD_SMALL_ROWS
#define TOVL_HIP_LMHEAD_SMALL_ROWS 1
#endif
#ifndef TOVL_HIP_LMHEAD_SMALL_MAX_T
#define TOVL_HIP_LMHEAD_SMALL_MAX_T 4
#endif

#endif
