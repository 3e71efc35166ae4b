/* The CPU reference kernels: plain C, exactly as docs/SPEC.md says. They are
 * the oracle every GPU port is checked against. Built without FMA contraction
 * (-ffp-contract=off) and without fast-math. */
#ifndef TOVL_CPU_KERNELS_H
#define TOVL_CPU_KERNELS_H

#include "tovl/kernel_args.h"

#include <stdbool.h>

/* The spec's fixed-order dot product of two bf16 rows of length h. */
float tovl_cpu_dot_bf16(const uint16_t *x, const uint16_t *w, uint32_t h);

/* f32 result -> the bits the lm_head kernels store (canonical NaN). */
uint32_t tovl_cpu_f32_out_bits(float value);

/* rowdiff's rule for one row pair (bitwise for tol 0). */
uint32_t tovl_cpu_rows_differ(const uint16_t *a, const uint16_t *b, uint32_t h, float tol);

/* Each kernel runs its whole logical grid, one cell at a time: the reference.
 * The backend launches the fast paths of cpu_simd.h, which give the same bits. */
void tovl_cpu_rowdiff(const tovl_rowdiff_args *args);
void tovl_cpu_embed_overlay(const tovl_embed_overlay_args *args);
void tovl_cpu_lmhead_overlay(const tovl_lmhead_overlay_args *args, bool f32_logits);

/* Device pointer (a host address on this backend) -> C pointer. */
#define TOVL_CPU_PTR(type, devptr) ((type *)(uintptr_t)(devptr))

/* The slot of row t: per-row array when present, else the single active slot. */
static inline int32_t tovl_cpu_row_slot(uint64_t slots, int32_t active_slot, uint32_t t) {
    return slots ? TOVL_CPU_PTR(const int32_t, slots)[t] : active_slot;
}

#endif
