/* Launch geometry of the CUDA backend (see cuda_geometry.h and launch_shape.h). */
#include "cuda_geometry.h"

#include <string.h>

#include "launch_shape.h"
#include "tovl/backend.h"

const char *const tovl_cuda_kernel_names[TOVL_CUDA_KERNEL_COUNT] = {
    TOVL_KERNEL_ROWDIFF, TOVL_KERNEL_EMBED_OVERLAY, TOVL_KERNEL_LMHEAD_OVERLAY_BF16, TOVL_KERNEL_LMHEAD_OVERLAY_F32};

const char *const tovl_cuda_function_names[TOVL_CUDA_KERNEL_COUNT][TOVL_CUDA_VARIANT_COUNT] = {
    {TOVL_KERNEL_ROWDIFF, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL},
    {TOVL_KERNEL_EMBED_OVERLAY, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL},
    {TOVL_KERNEL_LMHEAD_OVERLAY_BF16, "lmhead_overlay_bf16_small", "lmhead_overlay_bf16_row",
     "lmhead_overlay_bf16_row2", "lmhead_overlay_bf16_row4", "lmhead_overlay_bf16_row4q",
     "lmhead_overlay_bf16_row4q_few", "lmhead_overlay_bf16_small_many", "lmhead_overlay_bf16_many"},
    {TOVL_KERNEL_LMHEAD_OVERLAY_F32, "lmhead_overlay_f32_small", "lmhead_overlay_f32_row", "lmhead_overlay_f32_row2",
     "lmhead_overlay_f32_row4", "lmhead_overlay_f32_row4q", "lmhead_overlay_f32_row4q_few",
     "lmhead_overlay_f32_small_many", "lmhead_overlay_f32_many"}};

const char *const tovl_cuda_variant_names[TOVL_CUDA_VARIANT_COUNT] = {
    "large tiles", "small tiles", "row", "row2", "row4", "row4q", "row4q few", "small tiles many", "large tiles many"};

tovl_cuda_variant tovl_cuda_ungated_variant(tovl_cuda_variant variant) {
    return variant == TOVL_CUDA_VARIANT_PLAIN_MANY   ? TOVL_CUDA_VARIANT_PLAIN
           : variant == TOVL_CUDA_VARIANT_SMALL_MANY ? TOVL_CUDA_VARIANT_SMALL
                                                     : variant;
}

tovl_cuda_launch tovl_cuda_few_launch(const tovl_cuda_launch *pair) {
    tovl_cuda_launch few;
    memset(&few, 0, sizeof few);
    memcpy(few.grid, pair->few_grid, sizeof few.grid);
    few.block[0] = TOVL_CUDA_LMHEAD_ROW4_THREADS;
    few.block[1] = few.block[2] = 1;
    few.variant = TOVL_CUDA_VARIANT_ROW4Q_FEW;
    return few;
}

const size_t tovl_cuda_kernel_args_size[TOVL_CUDA_KERNEL_COUNT] = {
    sizeof(tovl_rowdiff_args), sizeof(tovl_embed_overlay_args), sizeof(tovl_lmhead_overlay_args),
    sizeof(tovl_lmhead_overlay_args)};

/* CUDA's grid limits. */
#define GRID_X_MAX 2147483647u
#define GRID_YZ_MAX 65535u
#define BLOCK_THREADS_MAX 1024u

int tovl_cuda_kernel_by_name(const char *name) {
    for (int k = 0; k < TOVL_CUDA_KERNEL_COUNT; k++) {
        if (strcmp(name, tovl_cuda_kernel_names[k]) == 0) {
            return k;
        }
    }
    return -1;
}

tovl_status tovl_cuda_check_launch(const char *backend, tovl_kernel kernel, const void *args, size_t args_size,
                                   tovl_cuda_kernel_id *out) {
    if (kernel == 0 || kernel > TOVL_CUDA_KERNEL_COUNT) {
        return tovl_error(TOVL_ERR_LAUNCH, "%s: launch of unknown kernel handle %llu", backend,
                          (unsigned long long)kernel);
    }
    const tovl_cuda_kernel_id k = (tovl_cuda_kernel_id)(kernel - 1);
    if (!args || args_size != tovl_cuda_kernel_args_size[k]) {
        return tovl_error(TOVL_ERR_LAUNCH, "%s: %s expects %zu bytes of arguments, got %zu", backend,
                          tovl_cuda_kernel_names[k], tovl_cuda_kernel_args_size[k], args_size);
    }
    *out = k;
    return TOVL_OK;
}

static uint32_t ceil_div(uint32_t a, uint32_t b) {
    return (uint32_t)(((uint64_t)a + b - 1) / b);
}

static uint32_t min_u32(uint32_t a, uint32_t b) {
    return a < b ? a : b;
}

static void set_dims(tovl_cuda_launch *out, uint32_t gx, uint32_t bx) {
    out->grid[0] = gx;
    out->grid[1] = out->grid[2] = 1;
    out->block[0] = bx;
    out->block[1] = out->block[2] = 1;
}

/* Overlay rows a block of `variant` takes in one column of the grid's y. */
static uint32_t variant_columns(tovl_cuda_variant variant) {
    variant = tovl_cuda_ungated_variant(variant);
    return variant == TOVL_CUDA_VARIANT_ROW4                                                   ? TOVL_CUDA_LMHEAD_ROW4_ROWS
           : variant == TOVL_CUDA_VARIANT_ROW4Q || variant == TOVL_CUDA_VARIANT_ROW4Q_FEW ? TOVL_CUDA_LMHEAD_ROW4Q_ROWS
           : variant == TOVL_CUDA_VARIANT_ROW2  ? TOVL_CUDA_LMHEAD_ROW2_CELLS
           : variant == TOVL_CUDA_VARIANT_ROW   ? TOVL_CUDA_LMHEAD_ROW_CELLS
           : variant == TOVL_CUDA_VARIANT_SMALL ? TOVL_CUDA_LMHEAD_SMALL_BN
                                                : TOVL_CUDA_LMHEAD_LARGE_BN;
}

/* The row variants: a block per (row, 1, 2 or 4 overlay rows). The tiles: a
 * block per (group of BM rows of one slot, BN overlay rows). */
tovl_status tovl_cuda_lmhead_shape(tovl_cuda_variant variant, const tovl_lmhead_overlay_args *a,
                                   tovl_cuda_launch *out) {
    memset(out, 0, sizeof *out);
    out->variant = variant;
    if (a->T == 0 || a->max_n == 0 || a->max_loras == 0) {
        set_dims(out, 0, TOVL_CUDA_LMHEAD_THREADS);
        return TOVL_OK;
    }
    const bool row4 = variant == TOVL_CUDA_VARIANT_ROW4 || variant == TOVL_CUDA_VARIANT_ROW4Q ||
                      variant == TOVL_CUDA_VARIANT_ROW4Q_FEW;
    const bool row = row4 || variant == TOVL_CUDA_VARIANT_ROW || variant == TOVL_CUDA_VARIANT_ROW2;
    if (row) {
        if (a->T > GRID_X_MAX) {
            return tovl_error(TOVL_ERR_UNSUPPORTED, "cuda: lm_head row variant over %u rows (at most %u)", a->T,
                              GRID_X_MAX);
        }
        set_dims(out, a->T, row4 ? TOVL_CUDA_LMHEAD_ROW4_THREADS : TOVL_CUDA_LMHEAD_ROW_THREADS);
    } else {
        /* The slots' groups of BM rows number at most ceil(T / BM) plus one
         * per slot that has rows; a block finds its group on the device. */
        set_dims(out, ceil_div(a->T, TOVL_CUDA_LMHEAD_BM) + min_u32(a->max_loras, a->T), TOVL_CUDA_LMHEAD_THREADS);
    }
    /* Beyond CUDA's y limit the blocks loop over columns. */
    out->grid[1] = min_u32(ceil_div(a->max_n, variant_columns(variant)), GRID_YZ_MAX);
    return TOVL_OK;
}

/* A row variant's launch for `a` (shaped rows), its grid's y widened toward
 * max_n within the block budget (lmhead_launch). */
static tovl_status row_launch(tovl_cuda_variant variant, const tovl_lmhead_overlay_args *a, uint32_t max_n,
                              uint64_t sms, tovl_cuda_launch *out) {
    tovl_status st = tovl_cuda_lmhead_shape(variant, a, out);
    if (st != TOVL_OK || max_n <= a->max_n || out->grid[0] == 0) {
        return st;
    }
    const uint64_t budget = sms * TOVL_CUDA_LMHEAD_SHAPED_BLOCKS_PER_SM / out->grid[0];
    const uint32_t all = min_u32(ceil_div(max_n, variant_columns(variant)), GRID_YZ_MAX);
    if (budget > out->grid[1]) {
        out->grid[1] = budget < all ? (uint32_t)budget : all;
    }
    return TOVL_OK;
}

/* A fixed-shape set (`full` has more rows than the launch is shaped for,
 * `shaped`) whose tiles `out` would be row4q for a slot of few rows: the
 * gated pair (launch_shape.h, TOVL_CUDA_LMHEAD_FEW_ROWS). row4q_few's grid is
 * that of ROW4Q_ROWS rows, widened toward the F rows within the block budget
 * (row_launch); its blocks loop over the columns past it. A from_slots set
 * (its launch shaped for its own rows) keeps its one launch: its variant
 * already follows what it holds. On the H200 at T = 512 with 4 rows a slot,
 * capacity 256: the tiles alone 11.8 us, row4q (the from_slots set's) 3.5
 * (docs/PERFORMANCE.md, Fixed-shape sets). */
static tovl_status gate_for_few_rows(const tovl_lmhead_overlay_args *full, const tovl_lmhead_overlay_args *shaped,
                                     uint64_t sms, tovl_cuda_launch *out) {
    if (full->max_n <= shaped->max_n || shaped->T > GRID_X_MAX || out->grid[0] == 0) {
        return TOVL_OK;
    }
    const uint32_t few = TOVL_CUDA_LMHEAD_FEW_ROWS(shaped->T, sms);
    if (few < TOVL_CUDA_LMHEAD_ROW4Q_ROWS || few >= shaped->max_n) {
        return TOVL_OK;
    }
    tovl_lmhead_overlay_args few_args = *shaped;
    few_args.max_n = TOVL_CUDA_LMHEAD_ROW4Q_ROWS;
    tovl_cuda_launch first;
    const tovl_status st = row_launch(TOVL_CUDA_VARIANT_ROW4Q_FEW, &few_args, few, sms, &first);
    if (st != TOVL_OK) {
        return st;
    }
    memcpy(out->few_grid, first.grid, sizeof out->few_grid);
    out->variant = out->variant == TOVL_CUDA_VARIANT_SMALL ? TOVL_CUDA_VARIANT_SMALL_MANY : TOVL_CUDA_VARIANT_PLAIN_MANY;
    return TOVL_OK;
}

/* The shapes (launch_shape.h), the first that fits, by the cells T x max_n
 * per SM (on the H200 with 8 slots x 64 rows, docs/PERFORMANCE.md):
 * - row4 (2 overlay rows a block) up to 6 cells per SM: 1.6-2.4 us at
 *   T = 1-12, where row4q's blocks do twice the arithmetic each.
 * - row4q (4 overlay rows a block) up to 48 cells per SM (T <= 99 with 64
 *   rows on 132 SMs: 2.6 us at T = 16, 5.9 at 64, 8.0 at 96), below a round
 *   of tiles; up to 64 where the tiles' grid has more blocks than SMs (9.9-
 *   10.3 us at T = 128 against the large tiles' 11.8; 12.1 at T = 160
 *   against 11.9). Both read each overlay row once per row rather than once
 *   per 8 rows, which is why the tiles take the larger batches.
 * - small tiles, one block per SM, when every block of their grid gets an SM
 *   of its own. (Small whenever ceil(T / BM) full groups give fewer large
 *   tiles than SMs would leave T = 128 with about 170 small tiles for 132 SMs
 *   on the H200, two rounds: 15.6 us against 12.4; docs/PERFORMANCE.md,
 *   Designs measured and not kept.)
 * - large tiles, two blocks per SM: everything else.
 * row and row2 fit wherever row4 does and were slower there, so the host
 * does not take them.
 * The cells are T x `rows`, the rows the launch is shaped for (kernel_args.h).
 * Where those are fewer than max_n (a fixed-shape set's capacity), the row
 * variants' blocks loop over the columns past the grid; a grid of at most
 * TOVL_CUDA_LMHEAD_SHAPED_BLOCKS_PER_SM blocks an SM still covers more of
 * them (at T = 1 all 256 of a capacity), so a slot that holds more than
 * `rows` costs fewer rounds, while one that holds them costs only blocks
 * that find their columns empty. */
static tovl_status lmhead_launch(const tovl_lmhead_overlay_args *full, uint32_t rows,
                                 const tovl_cuda_device_shape *device, tovl_cuda_launch *out) {
    tovl_lmhead_overlay_args shaped = *full;
    shaped.max_n = rows < full->max_n ? rows : full->max_n;
    const tovl_lmhead_overlay_args *a = &shaped;
    const uint64_t sms = device->sm_count ? device->sm_count : 1;
    const uint64_t cells = (uint64_t)a->T * a->max_n;
    tovl_status st;
    if (a->T <= GRID_X_MAX && cells <= sms * TOVL_CUDA_LMHEAD_ROW4_CELLS_PER_SM) {
        return row_launch(TOVL_CUDA_VARIANT_ROW4, a, full->max_n, sms, out);
    }
    st = tovl_cuda_lmhead_shape(TOVL_CUDA_VARIANT_SMALL, a, out);
    if (st != TOVL_OK) {
        return st;
    }
    const bool tiles_fit = (uint64_t)out->grid[0] * out->grid[1] <= sms;
    if (a->T <= GRID_X_MAX && (cells <= sms * TOVL_CUDA_LMHEAD_ROW4Q_CELLS_PER_SM ||
                               (!tiles_fit && cells <= sms * TOVL_CUDA_LMHEAD_ROW4Q_CELLS_PER_SM_MAX))) {
        return row_launch(TOVL_CUDA_VARIANT_ROW4Q, a, full->max_n, sms, out);
    }
    if (tiles_fit) {
        return gate_for_few_rows(full, a, sms, out);
    }
    st = tovl_cuda_lmhead_shape(TOVL_CUDA_VARIANT_PLAIN, a, out);
    /* Where the batch's groups (ceil(T / BM) full ones, and a partial one
     * for about half the slots: its rows are not known here) give more than
     * three large tiles per SM, each block takes
     * TOVL_CUDA_LMHEAD_LARGE_COLUMNS columns one after the other (the
     * kernel's column loop): its tile pick and row collection then serve
     * them all, and the tiles run as one round of two blocks per SM rather
     * than two (docs/PERFORMANCE.md, Lm_head tiles). */
    const uint64_t groups = ceil_div(a->T, TOVL_CUDA_LMHEAD_BM) + min_u32(a->max_loras, a->T) / 2;
    if (st == TOVL_OK && TOVL_CUDA_LMHEAD_LARGE_COLUMNS > 1 && groups * out->grid[1] > 3 * sms) {
        out->grid[1] = ceil_div(out->grid[1], TOVL_CUDA_LMHEAD_LARGE_COLUMNS);
    }
    return st == TOVL_OK ? gate_for_few_rows(full, a, sms, out) : st;
}

tovl_status tovl_cuda_native_launch(tovl_cuda_kernel_id kernel, const uint32_t logical[3], const void *args,
                                    const tovl_cuda_device_shape *device, tovl_cuda_launch *out) {
    memset(out, 0, sizeof *out);
    switch (kernel) {
    case TOVL_CUDA_ROWDIFF:
        set_dims(out, ceil_div(logical[0], TOVL_CUDA_ROWDIFF_THREADS / 32), TOVL_CUDA_ROWDIFF_THREADS);
        return TOVL_OK;
    case TOVL_CUDA_EMBED_OVERLAY:
        if (logical[0] > GRID_X_MAX) {
            return tovl_error(TOVL_ERR_UNSUPPORTED, "cuda: embed_overlay over %u rows (at most %u)", logical[0],
                              GRID_X_MAX);
        }
        set_dims(out, logical[0], TOVL_CUDA_EMBED_THREADS);
        return TOVL_OK;
    case TOVL_CUDA_LMHEAD_BF16:
    case TOVL_CUDA_LMHEAD_F32:
        return lmhead_launch(args, logical[1], device, out);
    default:
        return tovl_error(TOVL_ERR_INTERNAL, "cuda: no launch shape for kernel %d", (int)kernel);
    }
}

tovl_status tovl_cuda_foreign_shape_check(const char *global, const tovl_cuda_foreign_shape *s) {
    if (s->block_x == 0 || s->block_y == 0 || (uint64_t)s->block_x * s->block_y > BLOCK_THREADS_MAX ||
        s->items_x == 0 || s->items_y == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "cuda: %s = {%u, %u, %u, %u}: blocks must have 1..%u threads and items be >= 1",
                          global, s->block_x, s->block_y, s->items_x, s->items_y, BLOCK_THREADS_MAX);
    }
    return TOVL_OK;
}

bool tovl_cuda_foreign_small(const tovl_cuda_foreign_shapes *shapes, uint32_t x) {
    return shapes->small_max_x > 0 && x <= shapes->small_max_x;
}

tovl_status tovl_cuda_foreign_launch(const tovl_cuda_foreign_shapes *shapes, const uint32_t logical[3],
                                     tovl_cuda_launch *out) {
    memset(out, 0, sizeof *out);
    const bool small = tovl_cuda_foreign_small(shapes, logical[0]);
    const tovl_cuda_foreign_shape *shape = small ? &shapes->small : &shapes->shape;
    const uint32_t gx = ceil_div(logical[0], shape->items_x), gy = ceil_div(logical[1], shape->items_y);
    if (gx > GRID_X_MAX || gy > GRID_YZ_MAX || logical[2] > GRID_YZ_MAX) {
        return tovl_error(TOVL_ERR_UNSUPPORTED, "cuda: grid %u x %u x %u exceeds the device's limits", gx, gy,
                          logical[2]);
    }
    out->grid[0] = gx;
    out->grid[1] = gy;
    out->grid[2] = logical[2];
    out->block[0] = shape->block_x;
    out->block[1] = shape->block_y;
    out->block[2] = 1;
    return TOVL_OK;
}
