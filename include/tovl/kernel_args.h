/*
 * The argument struct of each kernel: one plain struct per kernel, the same
 * layout in every port. CUDA and HIP pass it by value as the kernel's only
 * parameter, Vulkan as push constants (shaders/args.glsl mirrors it and the
 * Vulkan backend static-asserts the offsets), the CPU backend by pointer.
 *
 * This header is plain C and C++ (CUDA and HIP kernels include it). Every
 * struct is at most 128 bytes, the push-constant size every Vulkan device
 * guarantees, and has no implicit padding.
 *
 * Grids are logical, chosen by the core (see each struct); a port maps them to
 * its own block size and launch shape.
 */
#ifndef TOVL_KERNEL_ARGS_H
#define TOVL_KERNEL_ARGS_H

#include <stdint.h>

/* rowdiff: logical grid (rows, 1, 1).
 * flags[r] = 1 when row r of a and b differ, else 0 (spec: rowdiff). */
typedef struct tovl_rowdiff_args {
    uint64_t a;     /* bf16 [rows, h] */
    uint64_t b;     /* bf16 [rows, h] */
    uint64_t flags; /* u32 [rows] */
    uint32_t rows;
    uint32_t h;
    float tol;      /* 0: bitwise; > 0: |f32(a)-f32(b)| > tol or NaN on one side */
    uint32_t pad0;
} tovl_rowdiff_args; /* 40 bytes */

/* embed_overlay: logical grid (T, 1, 1). */
typedef struct tovl_embed_overlay_args {
    uint64_t hidden;         /* bf16 [T, h], patched in place */
    uint64_t token_ids;      /* u32 [T] */
    uint64_t token_slots;    /* i32 [T], or 0: every row uses active_slot */
    uint64_t slot_map_table; /* u64 [max_loras] -> i32 [vocab] */
    uint64_t rows_table;     /* u64 [max_loras] -> bf16 [n, h] */
    uint64_t n_table;        /* u32 [max_loras] */
    uint32_t T;
    uint32_t h;
    uint32_t vocab;
    uint32_t max_loras;
    int32_t active_slot;
    uint32_t pad0;
} tovl_embed_overlay_args; /* 72 bytes */

/* lmhead_overlay_bf16 / lmhead_overlay_f32: logical grid (T, rows, 1), rows
 * the overlay rows the launch is shaped for: max_n, or fewer for a
 * fixed-shape set (its capacity is max_n). A port may shape its grid for
 * either; its kernels compute every k < min(n[s], max_n) whatever the grid. */
typedef struct tovl_lmhead_overlay_args {
    uint64_t logits;      /* bf16 or f32 [T, ld] */
    uint64_t hidden;      /* bf16 [T, h] */
    uint64_t row_slots;   /* i32 [T], or 0: every row uses active_slot */
    uint64_t rows_table;  /* u64 [max_loras] -> bf16 [n, h] */
    uint64_t ids_table;   /* u64 [max_loras] -> u32 [n] */
    uint64_t n_table;     /* u32 [max_loras] (n_override) */
    uint64_t ld;          /* logits row stride in elements, >= vocab */
    uint32_t T;
    uint32_t h;
    uint32_t vocab;
    uint32_t max_loras;
    int32_t active_slot;
    uint32_t max_n;       /* the set's max_n_override (a fixed-shape set's capacity) */
} tovl_lmhead_overlay_args; /* 80 bytes */

#if defined(__cplusplus)
static_assert(sizeof(tovl_rowdiff_args) == 40, "rowdiff args layout");
static_assert(sizeof(tovl_embed_overlay_args) == 72, "embed args layout");
static_assert(sizeof(tovl_lmhead_overlay_args) == 80, "lmhead args layout");
#else
_Static_assert(sizeof(tovl_rowdiff_args) == 40, "rowdiff args layout");
_Static_assert(sizeof(tovl_embed_overlay_args) == 72, "embed args layout");
_Static_assert(sizeof(tovl_lmhead_overlay_args) == 80, "lmhead args layout");
#endif

/* The fixed dot-product lane count of the spec. */
#define TOVL_DOT_LANES 256

#endif /* TOVL_KERNEL_ARGS_H */
