/*
 * How the CUDA port maps the core's logical grids onto blocks: the constants
 * shared by the kernels (token_overlay.cu) and the host code that launches
 * them (cuda_geometry.c). Plain C and C++.
 *
 *   rowdiff           a warp per row, ROWDIFF_THREADS / 32 rows per block
 *   embed_overlay     a block of EMBED_THREADS per token
 *   lmhead_overlay_*  a block per (group of BM rows of one slot, BN overlay
 *                     rows): grid (ceil(T / BM) + min(max_loras, T),
 *                     ceil(max_n / BN) capped at 65535 (blocks then loop), 1),
 *                     with the variant's dynamic shared memory; each block
 *                     finds its slot and group on the device. Each hidden row
 *                     is read once per BN overlay rows, each overlay row once
 *                     per BM hidden rows.
 */
#ifndef TOVL_CUDA_LAUNCH_SHAPE_H
#define TOVL_CUDA_LAUNCH_SHAPE_H

/* The value of the module global `tovl_cuda_port_abi` in this port's fatbin.
 * A module without it (another port's kernels loaded through
 * tovl_cuda_backend_open_image) is launched by the generic convention of
 * include/tovl/tovl_cuda.h instead. Bump it when a launch shape changes. */
#define TOVL_CUDA_PORT_ABI 3

#define TOVL_CUDA_ROWDIFF_THREADS 256
#define TOVL_CUDA_EMBED_THREADS 128

#define TOVL_CUDA_LMHEAD_THREADS 256

/* lm_head tiles: BM hidden rows x BN overlay rows per block; WJ lane groups
 * (the warps that split each cell's 8 lane classes), WCM cell groups along
 * the hidden rows, IB steps per staged phase (kernels/lmhead_overlay.cuh).
 * The "large" variant (lmhead_overlay_bf16, lmhead_overlay_f32): 16 x 16,
 * every warp all 8 lane classes of a 4 x 8 sub-tile. */
#ifndef TOVL_CUDA_LMHEAD_LARGE_BM
#define TOVL_CUDA_LMHEAD_LARGE_BM 16
#endif
#ifndef TOVL_CUDA_LMHEAD_LARGE_BN
#define TOVL_CUDA_LMHEAD_LARGE_BN 16
#endif
#ifndef TOVL_CUDA_LMHEAD_LARGE_WJ
#define TOVL_CUDA_LMHEAD_LARGE_WJ 1
#endif
#ifndef TOVL_CUDA_LMHEAD_LARGE_WCM
#define TOVL_CUDA_LMHEAD_LARGE_WCM 4
#endif
#ifndef TOVL_CUDA_LMHEAD_LARGE_IB
#define TOVL_CUDA_LMHEAD_LARGE_IB 8
#endif
#ifndef TOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS
#define TOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS 1
#endif

/* The "small" variant (lmhead_overlay_bf16_small, lmhead_overlay_f32_small)
 * for small batches: 8 x 4 tiles, so that more blocks share the work; four
 * lane groups of two 4 x 4 cell groups.
 * Both variants stay within 64 KB of shared memory, the most sm_75 grants. */
#ifndef TOVL_CUDA_LMHEAD_SMALL_BM
#define TOVL_CUDA_LMHEAD_SMALL_BM 8
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_BN
#define TOVL_CUDA_LMHEAD_SMALL_BN 4
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_WJ
#define TOVL_CUDA_LMHEAD_SMALL_WJ 4
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_WCM
#define TOVL_CUDA_LMHEAD_SMALL_WCM 2
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_IB
#define TOVL_CUDA_LMHEAD_SMALL_IB 4
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_MIN_BLOCKS
#define TOVL_CUDA_LMHEAD_SMALL_MIN_BLOCKS 2
#endif

/* Dynamic shared memory of a variant: two phase buffers of (BM + BN) rows x
 * WJ x IB x 32 floats. */
#define TOVL_CUDA_LMHEAD_SHARED_BYTES(bm, bn, wj, ib) (2u * 4u * ((bm) + (bn)) * (wj) * (ib) * 32u)
#define TOVL_CUDA_LMHEAD_LARGE_SHARED                                                                     \
    TOVL_CUDA_LMHEAD_SHARED_BYTES(TOVL_CUDA_LMHEAD_LARGE_BM, TOVL_CUDA_LMHEAD_LARGE_BN, TOVL_CUDA_LMHEAD_LARGE_WJ, \
                                  TOVL_CUDA_LMHEAD_LARGE_IB)
#define TOVL_CUDA_LMHEAD_SMALL_SHARED                                                                     \
    TOVL_CUDA_LMHEAD_SHARED_BYTES(TOVL_CUDA_LMHEAD_SMALL_BM, TOVL_CUDA_LMHEAD_SMALL_BN, TOVL_CUDA_LMHEAD_SMALL_WJ, \
                                  TOVL_CUDA_LMHEAD_SMALL_IB)

#endif /* TOVL_CUDA_LAUNCH_SHAPE_H */
