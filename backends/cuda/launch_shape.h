/*
 * How the CUDA port maps the core's logical grids onto blocks: the constants
 * shared by the kernels (token_overlay.cu) and the host code that launches
 * them (cuda_geometry.c). Plain C and C++.
 *
 *   rowdiff           a warp per row, ROWDIFF_THREADS / 32 rows per block
 *   embed_overlay     a block of EMBED_THREADS per token
 *   lmhead_overlay_*  persistent blocks (about one per SM slot) that group the
 *                     rows by slot and share the work out evenly: each block
 *                     computes tiles of BM rows x BN overlay rows of one slot,
 *                     so each hidden row is read once per BN overlay rows and
 *                     each overlay row once per BM hidden rows.
 */
#ifndef TOVL_CUDA_LAUNCH_SHAPE_H
#define TOVL_CUDA_LAUNCH_SHAPE_H

/* The value of the module global `tovl_cuda_port_abi` in this port's fatbin.
 * A module without it (another port's kernels loaded through
 * tovl_cuda_backend_open_image) is launched by the generic convention of
 * include/tovl/tovl_cuda.h instead. Bump it when a launch shape changes. */
#define TOVL_CUDA_PORT_ABI 1

#define TOVL_CUDA_ROWDIFF_THREADS 256
#define TOVL_CUDA_EMBED_THREADS 128

#define TOVL_CUDA_LMHEAD_THREADS 256
/* Rows (tokens) grouped by slot at a time; a larger T is done window by window. */
#define TOVL_CUDA_LMHEAD_WINDOW 1024
/* Slot bins of the grouping: slots below this are grouped exactly; beyond it
 * slots share bins (still correct, tiles are only cut smaller). */
#define TOVL_CUDA_LMHEAD_BINS 256

/* The "large" variant (lmhead_overlay_bf16, lmhead_overlay_f32): 8 warps, each
 * 4 rows x 4 overlay rows, as 2 x 4 warps: tiles of 8 x 16. */
#ifndef TOVL_CUDA_LMHEAD_LARGE_WM
#define TOVL_CUDA_LMHEAD_LARGE_WM 4
#endif
#ifndef TOVL_CUDA_LMHEAD_LARGE_WARPS_M
#define TOVL_CUDA_LMHEAD_LARGE_WARPS_M 2
#endif
#ifndef TOVL_CUDA_LMHEAD_LARGE_WARPS_N
#define TOVL_CUDA_LMHEAD_LARGE_WARPS_N 4
#endif
/* Steps (256 elements of each of the tile's rows) whose loads are in flight;
 * each costs JOBS * WM registers per thread. Measured on the H200 (docs/
 * PERFORMANCE.md, lm_head tuning log): 2 is 2% faster than 1 for the large
 * tiles; deeper, or deeper for the small tiles, is no faster. */
#ifndef TOVL_CUDA_LMHEAD_LARGE_PREFETCH
#define TOVL_CUDA_LMHEAD_LARGE_PREFETCH 2
#endif
#define TOVL_CUDA_LMHEAD_LARGE_BM (TOVL_CUDA_LMHEAD_LARGE_WM * TOVL_CUDA_LMHEAD_LARGE_WARPS_M)
#define TOVL_CUDA_LMHEAD_LARGE_BN (TOVL_CUDA_LMHEAD_LARGE_WM * TOVL_CUDA_LMHEAD_LARGE_WARPS_N)

/* The "small" variant (lmhead_overlay_bf16_small, lmhead_overlay_f32_small)
 * for small batches, where more and smaller tiles keep every SM busy: 8 warps
 * of 2 x 2, as 2 x 4 warps: tiles of 4 x 8. */
#ifndef TOVL_CUDA_LMHEAD_SMALL_WM
#define TOVL_CUDA_LMHEAD_SMALL_WM 2
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_WARPS_M
#define TOVL_CUDA_LMHEAD_SMALL_WARPS_M 2
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_WARPS_N
#define TOVL_CUDA_LMHEAD_SMALL_WARPS_N 4
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_PREFETCH
#define TOVL_CUDA_LMHEAD_SMALL_PREFETCH 1
#endif
#define TOVL_CUDA_LMHEAD_SMALL_BM (TOVL_CUDA_LMHEAD_SMALL_WM * TOVL_CUDA_LMHEAD_SMALL_WARPS_M)
#define TOVL_CUDA_LMHEAD_SMALL_BN (TOVL_CUDA_LMHEAD_SMALL_WM * TOVL_CUDA_LMHEAD_SMALL_WARPS_N)

#endif /* TOVL_CUDA_LAUNCH_SHAPE_H */
