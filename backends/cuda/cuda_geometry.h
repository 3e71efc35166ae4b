/*
 * Launch geometry of the CUDA backend: from the core's logical grid and a
 * kernel's arguments to grid and block dimensions. Plain C with no driver
 * dependency, so the kernel emulation test (emu/) launches the kernels exactly
 * as the backend does.
 */
#ifndef TOVL_CUDA_GEOMETRY_H
#define TOVL_CUDA_GEOMETRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tovl/kernel_args.h"
#include "tovl/tovl.h"

/* The four kernels, in the order of the handles the backend gives out
 * (handle = index + 1). */
typedef enum tovl_cuda_kernel_id {
    TOVL_CUDA_ROWDIFF = 0,
    TOVL_CUDA_EMBED_OVERLAY,
    TOVL_CUDA_LMHEAD_BF16,
    TOVL_CUDA_LMHEAD_F32,
    TOVL_CUDA_KERNEL_COUNT
} tovl_cuda_kernel_id;

extern const char *const tovl_cuda_kernel_names[TOVL_CUDA_KERNEL_COUNT];

/* This port's launch-shape variants of a kernel (launch_shape.h). Every
 * kernel has the plain one, under its spec name; lm_head also has five more. */
typedef enum tovl_cuda_variant {
    TOVL_CUDA_VARIANT_PLAIN = 0, /* lm_head: large tiles, two blocks per SM */
    TOVL_CUDA_VARIANT_SMALL,     /* lm_head: small tiles, a block per SM */
    TOVL_CUDA_VARIANT_ROW,       /* lm_head: a block per row and 4 overlay rows, a warp each */
    TOVL_CUDA_VARIANT_ROW2,      /* lm_head: a block per row and 2 overlay rows, two warps each */
    TOVL_CUDA_VARIANT_ROW4,      /* lm_head: a block of four warps per row and 2 overlay rows */
    TOVL_CUDA_VARIANT_ROW4Q,     /* lm_head: a block of four warps per row and 4 overlay rows */
    /* The gated pair of a fixed-shape set's large batches (launch_shape.h,
     * TOVL_CUDA_LMHEAD_FEW_ROWS): row4q that computes only when every slot
     * holds few rows, and the tiles that compute only when one holds more. */
    TOVL_CUDA_VARIANT_ROW4Q_FEW,
    TOVL_CUDA_VARIANT_SMALL_MANY,
    TOVL_CUDA_VARIANT_PLAIN_MANY,
    TOVL_CUDA_VARIANT_COUNT
} tovl_cuda_variant;

/* The function of kernel k's variant v in this port's module; NULL where the
 * kernel has no such variant. [k][TOVL_CUDA_VARIANT_PLAIN] is the spec name. */
extern const char *const tovl_cuda_function_names[TOVL_CUDA_KERNEL_COUNT][TOVL_CUDA_VARIANT_COUNT];
/* The variants in words, for messages: "large tiles", "small tiles", "row", "row2", "row4",
 * "row4q", "row4q few", "small tiles many", "large tiles many". */
extern const char *const tovl_cuda_variant_names[TOVL_CUDA_VARIANT_COUNT];
extern const size_t tovl_cuda_kernel_args_size[TOVL_CUDA_KERNEL_COUNT];

/* The kernel of that name, or -1. */
int tovl_cuda_kernel_by_name(const char *name);

/* The kernel a launch's handle names (handle = id + 1), after checking the
 * handle and the size of the argument struct; `backend` starts the message. */
tovl_status tovl_cuda_check_launch(const char *backend, tovl_kernel kernel, const void *args, size_t args_size,
                                   tovl_cuda_kernel_id *out);

/* What the native lm_head launch needs to know about the device. */
typedef struct tovl_cuda_device_shape {
    uint32_t sm_count;
} tovl_cuda_device_shape;

typedef struct tovl_cuda_launch {
    uint32_t grid[3];
    uint32_t block[3];
    tovl_cuda_variant variant; /* which of this port's functions to launch */
    /* Where `variant` is a *_MANY one: the grid of the ROW4Q_FEW launch that
     * goes first on the same stream (blocks of TOVL_CUDA_LMHEAD_ROW4_THREADS);
     * all zero otherwise. */
    uint32_t few_grid[3];
} tovl_cuda_launch;

/* The variant a *_MANY variant gates (the same tiles, computing whatever the
 * slots hold); any other variant itself. */
tovl_cuda_variant tovl_cuda_ungated_variant(tovl_cuda_variant variant);

/* The ROW4Q_FEW launch that goes before `pair` (a launch whose few_grid is
 * set): its grid, block and variant. */
tovl_cuda_launch tovl_cuda_few_launch(const tovl_cuda_launch *pair);

/* This port's kernels. A grid with a zero dimension means nothing to launch. */
tovl_status tovl_cuda_native_launch(tovl_cuda_kernel_id kernel, const uint32_t logical[3], const void *args,
                                    const tovl_cuda_device_shape *device, tovl_cuda_launch *out);

/* The shape of lm_head's variant `variant` for these arguments, the choice
 * being the caller's (tovl_cuda_native_launch makes it for the backend). */
tovl_status tovl_cuda_lmhead_shape(tovl_cuda_variant variant, const tovl_lmhead_overlay_args *a,
                                   tovl_cuda_launch *out);

/* Another port's kernels (include/tovl/tovl_cuda.h): blocks of block_x x
 * block_y threads, each covering items_x x items_y points of the logical grid. */
typedef struct tovl_cuda_foreign_shape {
    uint32_t block_x, block_y, items_x, items_y;
} tovl_cuda_foreign_shape;

#define TOVL_CUDA_FOREIGN_DEFAULT_SHAPE ((tovl_cuda_foreign_shape){256, 1, 1, 1})

/* A kernel's convention: `shape`, or `small` for logical grids of at most
 * small_max_x points in x (K_launch_small; small_max_x 0: never). */
typedef struct tovl_cuda_foreign_shapes {
    tovl_cuda_foreign_shape shape, small;
    uint32_t small_max_x;
} tovl_cuda_foreign_shapes;

/* Whether a logical grid of x points in x takes the small shape. */
bool tovl_cuda_foreign_small(const tovl_cuda_foreign_shapes *shapes, uint32_t x);

/* Checks a shape read from a module; names the global (`global`) when it is unusable. */
tovl_status tovl_cuda_foreign_shape_check(const char *global, const tovl_cuda_foreign_shape *shape);
tovl_status tovl_cuda_foreign_launch(const tovl_cuda_foreign_shapes *shapes, const uint32_t logical[3],
                                     tovl_cuda_launch *out);

#endif /* TOVL_CUDA_GEOMETRY_H */
