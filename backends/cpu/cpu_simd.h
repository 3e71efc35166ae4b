/* The CPU backend's fast paths: the spec's dot order at several vector widths,
 * chosen at run time, and the thread pool that splits cells across cores.
 *
 * Every width computes exactly the spec's order (docs/SPEC.md, "The dot
 * product is the same bits on every backend"): the 256 logical lanes are
 * independent sums, each kept in one element of a vector of W floats, so one
 * vector multiply followed by one vector add (never fused: these files are
 * compiled with -ffp-contract=off, the SSE2 and AVX2 files without -mfma)
 * updates W lanes exactly as the scalar loop does element by element. The tree
 * is the spec's, element by element. The tests check every width against the
 * literal scalar loop, bit for bit. */
#ifndef TOVL_CPU_SIMD_H
#define TOVL_CPU_SIMD_H

#include <stdbool.h>
#include <stdint.h>

#include "tovl/tovl.h"

/* A dot tile: up to TOVL_CPU_TILE_X hidden rows times up to TOVL_CPU_TILE_W
 * weight rows, all of length h (bf16). out[a * TOVL_CPU_TILE_W + b] =
 * dot(x[a], w[b]) in the spec's order. */
#define TOVL_CPU_TILE_X 2
#define TOVL_CPU_TILE_W 2
typedef void (*tovl_cpu_dot_tile_fn)(const uint16_t *const x[TOVL_CPU_TILE_X], uint32_t nx,
                                     const uint16_t *const w[TOVL_CPU_TILE_W], uint32_t nw, uint32_t h, float *out);
/* rowdiff with tol > 0 over one row pair: 1 when some element pair has
 * |f32(a) - f32(b)| > tol or a NaN on one side only. */
typedef uint32_t (*tovl_cpu_rows_differ_fn)(const uint16_t *a, const uint16_t *b, uint32_t h, float tol);

typedef enum tovl_cpu_simd {
    TOVL_CPU_SIMD_SCALAR = 0, /* the spec's literal loop, one cell at a time */
    TOVL_CPU_SIMD_SSE2,       /* 4 lanes per vector (x86-64 baseline; a 128-bit vector elsewhere) */
    TOVL_CPU_SIMD_AVX2,       /* 8 lanes per vector */
    TOVL_CPU_SIMD_AVX512,     /* 16 lanes per vector */
    TOVL_CPU_SIMD_COUNT
} tovl_cpu_simd;

typedef struct tovl_cpu_simd_ops {
    tovl_cpu_simd simd;
    const char *name;      /* "scalar", "sse2", "avx2", "avx512" */
    uint32_t lanes;        /* floats per vector */
    tovl_cpu_dot_tile_fn dot_tile;
    tovl_cpu_rows_differ_fn rows_differ_tol;
} tovl_cpu_simd_ops;

/* The ops of one width; NULL when this build or this CPU lacks it. */
const tovl_cpu_simd_ops *tovl_cpu_simd_ops_of(tovl_cpu_simd simd);
/* The 16-lane code compiled for the build's baseline (no AVX-512 needed), so
 * the tests can check the 16-lane order on any machine. Never chosen to run. */
const tovl_cpu_simd_ops *tovl_cpu_simd_ops_wide_portable(void);
/* TOVL_CPU_SIMD (scalar, sse2, avx2, avx512) when set, else the widest this
 * CPU has. A width the CPU lacks, or an unknown name: TOVL_ERR_INVALID_ARGUMENT
 * naming the variable. */
tovl_status tovl_cpu_simd_from_env(const tovl_cpu_simd_ops **out);

/* ------------------------------------------------------------------------ */
/* The thread pool: created once (per backend), every hook runs synchronously
 * on the caller and the pool's workers, without allocating. */
typedef struct tovl_cpu_pool tovl_cpu_pool;
/* fn(ctx, worker) runs on the caller (worker 0) and on each worker that wakes
 * while the caller is still busy; the work inside must be shared through an
 * atomic counter, so that any number of participants finishes it. */
typedef void (*tovl_cpu_pool_fn)(void *ctx, unsigned worker);

/* TOVL_CPU_THREADS when set (1 .. 1024), else the online cores. A bad value:
 * TOVL_ERR_INVALID_ARGUMENT naming the variable. */
tovl_status tovl_cpu_threads_from_env(unsigned *out);
/* `threads` in all, the caller included (1: no workers). */
tovl_status tovl_cpu_pool_create(unsigned threads, tovl_cpu_pool **out);
void tovl_cpu_pool_destroy(tovl_cpu_pool *pool);
unsigned tovl_cpu_pool_threads(const tovl_cpu_pool *pool);
/* Run fn on up to `want` threads (the caller and want - 1 workers) and return
 * when the caller and every worker that joined are done. When another thread is using the pool, fn runs on the
 * caller alone (the work is the same, only slower). A NULL pool: the caller. */
void tovl_cpu_pool_run(tovl_cpu_pool *pool, unsigned want, tovl_cpu_pool_fn fn, void *ctx);

/* What a CPU kernel runs with: one width and one pool. */
typedef struct tovl_cpu_exec {
    const tovl_cpu_simd_ops *ops;
    tovl_cpu_pool *pool;
} tovl_cpu_exec;

/* The fast kernels (same bits as the reference ones in cpu_kernels.h). */
#include "tovl/kernel_args.h"
void tovl_cpu_rowdiff_fast(const tovl_cpu_exec *ex, const tovl_rowdiff_args *args);
void tovl_cpu_lmhead_overlay_fast(const tovl_cpu_exec *ex, const tovl_lmhead_overlay_args *args, bool f32_logits);
/* out[t * n_rows + v] = dot(x[t], row(v)) for t < T, v < n_rows, in f32 with
 * NaN canonical (the base lm_head product): each weight row is read once per
 * group of up to 32 tokens. row(ctx, v) returns row v (bf16 [h]). */
void tovl_cpu_matmul_bf16(const tovl_cpu_exec *ex, const uint16_t *x, uint32_t T, uint32_t h,
                          const uint16_t *(*row)(const void *ctx, uint32_t v), const void *row_ctx, uint32_t n_rows,
                          float *out);
/* The same with a width (TOVL_CPU_SIMD) and a pool (TOVL_CPU_THREADS) of its
 * own for this one call: the base lm_head product of the import layer. */
tovl_status tovl_cpu_matmul_bf16_once(const uint16_t *x, uint32_t T, uint32_t h,
                                      const uint16_t *(*row)(const void *ctx, uint32_t v), const void *row_ctx,
                                      uint32_t n_rows, float *out);

#endif
