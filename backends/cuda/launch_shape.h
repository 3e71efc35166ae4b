/*
 * How the CUDA port maps the core's logical grids onto blocks: the constants
 * shared by the kernels (token_overlay.cu) and the host code that launches
 * them (cuda_geometry.c). Plain C and C++.
 *
 *   rowdiff           a warp per row, ROWDIFF_THREADS / 32 rows per block
 *   embed_overlay     a block of EMBED_THREADS per token
 *   lmhead_overlay_*  six variants (cuda_geometry.c chooses):
 *                     row4, row4q, row2 and row (small batches; the host
 *                     takes row4 and row4q, the other two run when asked
 *                     for): a block per (row t, 1, 2 or 4 overlay rows of
 *                     its slot), grid (T, ceil(max_n / cells)); each
 *                     overlay row is read once per row.
 *                     small and large tiles: a block per (group of BM rows
 *                     of one slot, BN overlay rows): grid (ceil(T / BM) +
 *                     min(max_loras, T), ceil(max_n / BN) capped at 65535
 *                     (blocks then loop), 1); each block finds its slot and
 *                     group on the device (the large variant numbers the
 *                     blocks so that the groups that exist are launched
 *                     first: lmhead_place). Each hidden row is read once per
 *                     BN overlay rows, each overlay row once per BM hidden
 *                     rows.
 */
#ifndef TOVL_CUDA_LAUNCH_SHAPE_H
#define TOVL_CUDA_LAUNCH_SHAPE_H

/* The value of the module global `tovl_cuda_port_abi` in this port's fatbin.
 * A module without it (another port's kernels loaded through
 * tovl_cuda_backend_open_image) is launched by the generic convention of
 * include/tovl/tovl_cuda.h instead, never with programmatic dependent launch.
 * Bump it when a launch shape or convention changes (6: the kernels wait for
 * the kernel before them, so the host may launch them with PDL; 7: the host
 * writes the SM count into the module global `tovl_cuda_sm_count`; 8: the
 * lm_head row variant; 9: and row2; 10: row resident 6 to an SM; 11: and
 * row4; 12: row4 two overlay rows a block, and row4q; 13: the gated pair
 * row4q_few / *_many of a fixed-shape set's large batches). */
#define TOVL_CUDA_PORT_ABI 13

#define TOVL_CUDA_ROWDIFF_THREADS 256
#define TOVL_CUDA_EMBED_THREADS 256

#define TOVL_CUDA_LMHEAD_THREADS 256
/* Rows per tile (the grid's x unit), the same for both tile variants. */
#define TOVL_CUDA_LMHEAD_BM 8

/* The "large" variant (lmhead_overlay_bf16, lmhead_overlay_f32): tiles of
 * 8 rows x 8 overlay rows, each thread 8 x 4 cells (two lanes each), capped
 * at 128 registers so that two blocks (16 warps) share an SM. STAGES: chunks
 * of 256 elements in the shared-memory ring (STAGES - 1 in flight while one
 * is computed), 8 KB each. On the H200 this beat 8 x 16 tiles at one block
 * per SM (236 registers) by 5% at T = 512 (docs/PERFORMANCE.md, Lm_head tiles). */
#ifndef TOVL_CUDA_LMHEAD_LARGE_TN
#define TOVL_CUDA_LMHEAD_LARGE_TN 4
#endif
#ifndef TOVL_CUDA_LMHEAD_LARGE_STAGES
#define TOVL_CUDA_LMHEAD_LARGE_STAGES 3
#endif
#define TOVL_CUDA_LMHEAD_LARGE_BN (2 * TOVL_CUDA_LMHEAD_LARGE_TN)
/* Blocks per SM the compiler must leave registers for (__launch_bounds__):
 * 1 lets a thread use 255; 2 caps it at 128 (16 warps per SM). */
#ifndef TOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS
#define TOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS 2
#endif

/* Columns (groups of BN overlay rows) a large-tile block takes one after the
 * other where the batch has more than three tiles per SM (cuda_geometry.c):
 * its tile pick and row collection then serve them all, and the tiles run as
 * one round of two blocks per SM. On the H200 at T = 448-512 (seeds 777,
 * 4242, 31): 19.8-19.9 us against 21.3-21.6 with one column; 4 columns (one
 * block per SM) 23.3-37.2. */
#ifndef TOVL_CUDA_LMHEAD_LARGE_COLUMNS
#define TOVL_CUDA_LMHEAD_LARGE_COLUMNS 2
#endif

/* Both tile variants: 1 fuses each product into its sum (one fma) in tiles
 * whose operands pass a range check that makes every product exact, which
 * gives the spec's bits (lmhead_overlay.cuh, LmheadRange); a tile that fails
 * is redone unfused. On the H200, one column a block: 21.5-21.7 us at T = 512
 * against 23.9-24.1 unfused; every tile redone (a subnormal in the hidden
 * rows) 36.6-37.2. 0: the spec's unfused order everywhere. */
#ifndef TOVL_CUDA_LMHEAD_FUSE
#define TOVL_CUDA_LMHEAD_FUSE 1
#endif

/* The "small" variant (lmhead_overlay_bf16_small, lmhead_overlay_f32_small)
 * for batches whose grid gives every block an SM of its own (cuda_geometry.c):
 * the same 8 x 8 tiles, registers not capped and a ring of 4 chunks.
 * Measured on the H200 (docs/PERFORMANCE.md, Lm_head tiles): 8 x 8 beats
 * 8 x 4 at T = 64 (8.4 against 9.4 us, at one or two blocks per SM: more
 * blocks, less reuse), and 3, 4 or 6 chunks, or a 128-register cap, time
 * within 2% of each other; 8 to 16 chunks (in dynamic shared memory) are
 * slower. */
#ifndef TOVL_CUDA_LMHEAD_SMALL_TN
#define TOVL_CUDA_LMHEAD_SMALL_TN 4
#endif
#ifndef TOVL_CUDA_LMHEAD_SMALL_STAGES
#define TOVL_CUDA_LMHEAD_SMALL_STAGES 4
#endif
#define TOVL_CUDA_LMHEAD_SMALL_BN (2 * TOVL_CUDA_LMHEAD_SMALL_TN)
#ifndef TOVL_CUDA_LMHEAD_SMALL_MIN_BLOCKS
#define TOVL_CUDA_LMHEAD_SMALL_MIN_BLOCKS 1
#endif

/* The "row" variants for small batches (lmhead_row.cuh): a block of
 * ROW_THREADS per (row t, CELLS overlay rows of its slot), grid (T,
 * ceil(max_n / CELLS) capped at 65535). _row: a warp per cell (4 cells);
 * _row2: two warps per cell (2 cells), each thread half the lanes. row4
 * (below) fits wherever they do and is faster there, so the host takes
 * neither (tovl_cuda_lmhead_shape still gives their shapes, for the
 * microbenchmark and the tests). BLOCKS_PER_SM to an SM, which is also each
 * one's register cap (65536 / (128 x BLOCKS_PER_SM) per thread: _row 85,
 * _row2 128). ROUNDS_AHEAD:
 * 256-element rounds of both rows a thread requests before it uses the
 * first. On the H200 (seed 777, rows of 4096; docs/PERFORMANCE.md, Row
 * kernels): _row2, all 16 rounds of h = 4096 ahead, 2.66 us at
 * T = 1, 3.03 at T = 8; _row at 4 blocks per SM and 8 ahead 3.10 at T = 8
 * and 5.16 at T = 32; at 6 per SM and 4 ahead (80 registers) 5.19 at
 * T = 32 and 6.77 at T = 48 (at 8 per SM: 7.09 at T = 48, 8.84 at 64,
 * against 7.9 for the small tiles; 16 ahead took 220 registers). */
#define TOVL_CUDA_LMHEAD_ROW_THREADS 128
#ifndef TOVL_CUDA_LMHEAD_ROW_BLOCKS_PER_SM
#define TOVL_CUDA_LMHEAD_ROW_BLOCKS_PER_SM 6
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW2_BLOCKS_PER_SM
#define TOVL_CUDA_LMHEAD_ROW2_BLOCKS_PER_SM 4
#endif
#define TOVL_CUDA_LMHEAD_ROW_CELLS (TOVL_CUDA_LMHEAD_ROW_THREADS / 32)
#define TOVL_CUDA_LMHEAD_ROW2_CELLS (TOVL_CUDA_LMHEAD_ROW_THREADS / 64)
#ifndef TOVL_CUDA_LMHEAD_ROW_ROUNDS_AHEAD
#define TOVL_CUDA_LMHEAD_ROW_ROUNDS_AHEAD 4
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW2_ROUNDS_AHEAD
#define TOVL_CUDA_LMHEAD_ROW2_ROUNDS_AHEAD 16
#endif

/* The "row4" and "row4q" variants (lmhead_row.cuh) for decode batches: a
 * block of ROW4_THREADS (four warps) per (row t, ROWS overlay rows of its
 * slot: 2 for row4, 4 for row4q), grid (T, ceil(max_n / ROWS) capped at
 * 65535), the hidden row and the overlay rows staged into shared memory
 * STAGE_ROUNDS 256-element rounds at a time (26 KB a block with 16 for
 * row4, 44 KB for row4q), each thread two lanes of every cell, so each
 * hidden-row word it unpacks serves ROWS cells. BLOCKS_PER_SM resident to
 * an SM (also the register cap). The host takes row4 while T x max_n is at
 * most ROW4_CELLS_PER_SM cells per SM, row4q while it is at most
 * ROW4Q_CELLS_PER_SM, or ROW4Q_CELLS_PER_SM_MAX where the tiles would need
 * more blocks than SMs. On the H200 (seeds 777 and 4242, 8 slots x 64
 * rows; docs/PERFORMANCE.md) one overlay row a block took 1.60-1.64 /
 * 2.28-2.31 / 2.78-2.89 / 2.95-3.12 / 4.50-4.73 / 7.53-7.73 us at T = 1 /
 * 8 / 12 / 16 / 32 / 64; two 1.60-1.62 / 2.01-2.09 / 2.36-2.38 / 2.62-2.75
 * / 3.71-3.72 / 6.28-6.37; four 1.84 / 2.05-2.09 / 2.52-2.54 / 2.57-2.63 /
 * 3.60-3.62 / 5.93-5.97, 9.92-10.29 at 128 (large tiles 11.82-11.86) and
 * 12.12-12.13 at 160 (11.86). Two overlay rows a block with four warps
 * each (eight warps, one cell a thread): no faster than one. */
#define TOVL_CUDA_LMHEAD_ROW4_THREADS 128
#ifndef TOVL_CUDA_LMHEAD_ROW4_ROWS
#define TOVL_CUDA_LMHEAD_ROW4_ROWS 2
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW4_BLOCKS_PER_SM
#define TOVL_CUDA_LMHEAD_ROW4_BLOCKS_PER_SM 8
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW4Q_ROWS
#define TOVL_CUDA_LMHEAD_ROW4Q_ROWS 4
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW4Q_BLOCKS_PER_SM
#define TOVL_CUDA_LMHEAD_ROW4Q_BLOCKS_PER_SM 4
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW4_CELLS_PER_SM
#define TOVL_CUDA_LMHEAD_ROW4_CELLS_PER_SM 6
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW4Q_CELLS_PER_SM
#define TOVL_CUDA_LMHEAD_ROW4Q_CELLS_PER_SM 48
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW4Q_CELLS_PER_SM_MAX
#define TOVL_CUDA_LMHEAD_ROW4Q_CELLS_PER_SM_MAX 64
#endif
#ifndef TOVL_CUDA_LMHEAD_ROW4_STAGE_ROUNDS
#define TOVL_CUDA_LMHEAD_ROW4_STAGE_ROUNDS 16
#endif
/* The row variants' grid for a fixed-shape set widens past its shaped rows
 * up to this many blocks an SM (cuda_geometry.c, lmhead_launch). */
#ifndef TOVL_CUDA_LMHEAD_SHAPED_BLOCKS_PER_SM
#define TOVL_CUDA_LMHEAD_SHAPED_BLOCKS_PER_SM 4
#endif

/* A fixed-shape set's lm_head where the launch shaped for its rows takes the
 * tiles, but a slot of few rows would take row4q (cuda_geometry.c): the host
 * launches a gated pair, row4q_few and then the tiles' *_many, and the live
 * rows choose on the device. L = the most rows any slot holds (n[s], at most
 * max_n), read from the set's count table; F = TOVL_CUDA_LMHEAD_FEW_ROWS(T,
 * SM count), the most rows a slot may hold for which the host would take
 * row4q at T rows (48 cells an SM), in whole blocks of ROW4Q_ROWS. row4q_few
 * computes only when L <= F and the *_many tiles only when L > F, so exactly
 * one of the two writes the logits, with the bits either gives (the spec's
 * order). Both read the SM count the host writes into the module
 * (tovl_cuda_sm_count), so they agree on F. */
#define TOVL_CUDA_LMHEAD_FEW_ROWS(T, sms)                                                                    \
    ((T) == 0u ? 0u                                                                                           \
               : (uint32_t)((uint64_t)(sms) * TOVL_CUDA_LMHEAD_ROW4Q_CELLS_PER_SM / (T) /                      \
                            TOVL_CUDA_LMHEAD_ROW4Q_ROWS * TOVL_CUDA_LMHEAD_ROW4Q_ROWS))

#endif /* TOVL_CUDA_LAUNCH_SHAPE_H */
