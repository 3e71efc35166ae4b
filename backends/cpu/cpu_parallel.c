/* The CPU kernels' fast paths: the same cells as the reference kernels, in
 * tiles of the chosen vector width, split across the pool's threads through
 * an atomic counter over work units. Every cell is computed by exactly one
 * unit, so the result does not depend on the thread count. Nothing here
 * allocates. */
#include <stdatomic.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_simd.h"

/* Below this many multiply-adds a call runs on the caller alone: waking a
 * worker costs more than the work. */
#define SMALL_WORK (1u << 18)

/* ------------------------------------------------------------------------ */
/* lm_head overlay: units of (slot, up to GROUP tokens of that slot, up to
 * ROW_BLOCK of its rows). A group shares each weight row among its tokens.  */
/* ------------------------------------------------------------------------ */
#define GROUP 8u
#define ROW_BLOCK 16u

typedef struct lmhead_job {
    const tovl_cpu_exec *ex;
    const tovl_lmhead_overlay_args *a;
    bool f32;
    atomic_uint next; /* the next unclaimed unit */
} lmhead_job;

/* Where one thread is in the deterministic enumeration of units. */
typedef struct lmhead_cursor {
    uint32_t slot, scan;   /* the slot being grouped, the next token to look at */
    uint32_t tokens[GROUP], n_tokens;
    uint32_t n_rows;       /* the slot's rows: min(n_override, max_n) */
    uint32_t block, blocks;
    uint32_t index;        /* the unit the cursor is on; UINT32_MAX before the first */
} lmhead_cursor;

static uint32_t slot_rows(const tovl_lmhead_overlay_args *a, uint32_t s) {
    const uint32_t n = TOVL_CPU_PTR(const uint32_t, a->n_table)[s];
    return n < a->max_n ? n : a->max_n;
}

/* The next group of the cursor's slot, else of the following slots. */
static bool next_group(const tovl_lmhead_overlay_args *a, lmhead_cursor *c) {
    while (c->slot < a->max_loras) {
        c->n_rows = slot_rows(a, c->slot);
        c->n_tokens = 0;
        while (c->n_rows && c->scan < a->T && c->n_tokens < GROUP) {
            const int32_t s = tovl_cpu_row_slot(a->row_slots, a->active_slot, c->scan);
            if (s >= 0 && (uint32_t)s == c->slot) {
                c->tokens[c->n_tokens++] = c->scan;
            }
            c->scan++;
        }
        if (c->n_tokens) {
            c->block = 0;
            c->blocks = (c->n_rows + ROW_BLOCK - 1) / ROW_BLOCK;
            return true;
        }
        c->slot++;
        c->scan = 0;
    }
    return false;
}

static bool next_unit(const tovl_lmhead_overlay_args *a, lmhead_cursor *c) {
    if (c->index != UINT32_MAX && ++c->block < c->blocks) {
        c->index++;
        return true;
    }
    if (!next_group(a, c)) {
        return false;
    }
    c->index++; /* UINT32_MAX + 1 = 0 for the first unit */
    return true;
}

static void store_cell(const tovl_lmhead_overlay_args *a, bool f32, uint32_t t, uint32_t id, float dot) {
    const size_t cell = (size_t)t * a->ld + id;
    if (f32) {
        const uint32_t bits = tovl_cpu_f32_out_bits(dot);
        memcpy(TOVL_CPU_PTR(uint32_t, a->logits) + cell, &bits, sizeof bits);
    } else {
        TOVL_CPU_PTR(uint16_t, a->logits)[cell] = tovl_f32_to_bf16(dot);
    }
}

static void lmhead_unit(const lmhead_job *job, const lmhead_cursor *c) {
    const tovl_lmhead_overlay_args *a = job->a;
    const uint16_t *hidden = TOVL_CPU_PTR(const uint16_t, a->hidden);
    const uint32_t *ids = TOVL_CPU_PTR(const uint32_t, TOVL_CPU_PTR(const uint64_t, a->ids_table)[c->slot]);
    const uint16_t *rows = TOVL_CPU_PTR(const uint16_t, TOVL_CPU_PTR(const uint64_t, a->rows_table)[c->slot]);
    const uint32_t k_end = (c->block + 1) * ROW_BLOCK < c->n_rows ? (c->block + 1) * ROW_BLOCK : c->n_rows;
    uint32_t k = c->block * ROW_BLOCK;
    while (k < k_end) {
        const uint16_t *w[TOVL_CPU_TILE_W];
        uint32_t tile_ids[TOVL_CPU_TILE_W], nw = 0;
        for (; k < k_end && nw < TOVL_CPU_TILE_W; k++) {
            if (ids[k] < a->vocab) { /* other ids are skipped, as the reference does */
                tile_ids[nw] = ids[k];
                w[nw++] = rows + (size_t)k * a->h;
            }
        }
        for (uint32_t i = 0; nw && i < c->n_tokens; i += TOVL_CPU_TILE_X) {
            const uint32_t nx = c->n_tokens - i < TOVL_CPU_TILE_X ? c->n_tokens - i : TOVL_CPU_TILE_X;
            const uint16_t *x[TOVL_CPU_TILE_X];
            for (uint32_t j = 0; j < TOVL_CPU_TILE_X; j++) {
                x[j] = hidden + (size_t)c->tokens[i + (j < nx ? j : 0)] * a->h;
            }
            float out[TOVL_CPU_TILE_X * TOVL_CPU_TILE_W];
            job->ex->ops->dot_tile(x, nx, w, nw, a->h, out);
            for (uint32_t j = 0; j < nx; j++) {
                for (uint32_t b = 0; b < nw; b++) {
                    store_cell(a, job->f32, c->tokens[i + j], tile_ids[b], out[j * TOVL_CPU_TILE_W + b]);
                }
            }
        }
    }
}

static void lmhead_worker(void *ctx, unsigned worker) {
    (void)worker;
    lmhead_job *job = ctx;
    lmhead_cursor c = {.index = UINT32_MAX};
    for (;;) {
        const uint32_t want = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        while (c.index == UINT32_MAX || c.index < want) {
            if (!next_unit(job->a, &c)) {
                return;
            }
        }
        lmhead_unit(job, &c);
    }
}

void tovl_cpu_lmhead_overlay_fast(const tovl_cpu_exec *ex, const tovl_lmhead_overlay_args *a, bool f32_logits) {
    /* Ids are distinct within a slot (the overlay build checks it), so the
     * units' cells never overlap. */
    uint64_t work = 0;
    for (uint32_t t = 0; t < a->T && work < SMALL_WORK; t++) {
        const int32_t s = tovl_cpu_row_slot(a->row_slots, a->active_slot, t);
        if (s >= 0 && (uint32_t)s < a->max_loras) {
            work += (uint64_t)slot_rows(a, (uint32_t)s) * a->h;
        }
    }
    if (work == 0) {
        return;
    }
    lmhead_job job = {.ex = ex, .a = a, .f32 = f32_logits};
    atomic_init(&job.next, 0);
    tovl_cpu_pool_run(ex->pool, work < SMALL_WORK ? 1u : tovl_cpu_pool_threads(ex->pool), lmhead_worker, &job);
}

/* ------------------------------------------------------------------------ */
/* rowdiff: units of RD_BLOCK rows.                                          */
/* ------------------------------------------------------------------------ */
#define RD_BLOCK 64u

typedef struct rowdiff_job {
    const tovl_cpu_exec *ex;
    const tovl_rowdiff_args *a;
    atomic_uint next;
} rowdiff_job;

static void rowdiff_worker(void *ctx, unsigned worker) {
    (void)worker;
    rowdiff_job *job = ctx;
    const tovl_rowdiff_args *a = job->a;
    const uint16_t *x = TOVL_CPU_PTR(const uint16_t, a->a), *y = TOVL_CPU_PTR(const uint16_t, a->b);
    uint32_t *flags = TOVL_CPU_PTR(uint32_t, a->flags);
    for (;;) {
        const uint32_t r0 = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed) * RD_BLOCK;
        if (r0 >= a->rows) {
            return;
        }
        const uint32_t r1 = a->rows - r0 < RD_BLOCK ? a->rows : r0 + RD_BLOCK;
        for (uint32_t r = r0; r < r1; r++) {
            const size_t off = (size_t)r * a->h;
            /* tol 0: bits differ exactly when bytes do */
            flags[r] = a->tol > 0.0f ? job->ex->ops->rows_differ_tol(x + off, y + off, a->h, a->tol)
                                     : memcmp(x + off, y + off, (size_t)a->h * sizeof *x) != 0;
        }
    }
}

void tovl_cpu_rowdiff_fast(const tovl_cpu_exec *ex, const tovl_rowdiff_args *a) {
    rowdiff_job job = {.ex = ex, .a = a};
    atomic_init(&job.next, 0);
    const uint64_t work = (uint64_t)a->rows * a->h;
    tovl_cpu_pool_run(ex->pool, work < SMALL_WORK ? 1u : tovl_cpu_pool_threads(ex->pool), rowdiff_worker, &job);
}

/* ------------------------------------------------------------------------ */
/* The base lm_head product: units of MM_BLOCK weight rows; within a unit, 4
 * rows at a time against every token of a group of up to MM_GROUP (their
 * hidden rows, 8 KB each at h 4096, stay in L2), so each weight row comes
 * from memory once per group.                                               */
/* ------------------------------------------------------------------------ */
#define MM_BLOCK 64u
#define MM_GROUP 32u

typedef struct matmul_job {
    const tovl_cpu_exec *ex;
    const uint16_t *x;
    uint32_t T, h, n_rows;
    const uint16_t *(*row)(const void *ctx, uint32_t v);
    const void *row_ctx;
    float *out;
    atomic_uint next;
} matmul_job;

static void matmul_worker(void *ctx, unsigned worker) {
    (void)worker;
    matmul_job *job = ctx;
    const uint32_t blocks = (job->n_rows + MM_BLOCK - 1) / MM_BLOCK;
    const uint32_t groups = (job->T + MM_GROUP - 1) / MM_GROUP;
    for (;;) {
        const uint32_t unit = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (unit >= blocks * groups) {
            return;
        }
        const uint32_t g0 = (unit / blocks) * MM_GROUP, v0 = (unit % blocks) * MM_BLOCK;
        const uint32_t g1 = job->T - g0 < MM_GROUP ? job->T : g0 + MM_GROUP;
        const uint32_t v1 = job->n_rows - v0 < MM_BLOCK ? job->n_rows : v0 + MM_BLOCK;
        for (uint32_t v = v0; v < v1; v += TOVL_CPU_TILE_W) {
            const uint32_t nw = v1 - v < TOVL_CPU_TILE_W ? v1 - v : TOVL_CPU_TILE_W;
            const uint16_t *w[TOVL_CPU_TILE_W];
            for (uint32_t b = 0; b < nw; b++) {
                w[b] = job->row(job->row_ctx, v + b);
            }
            for (uint32_t t = g0; t < g1; t += TOVL_CPU_TILE_X) {
                const uint32_t nx = g1 - t < TOVL_CPU_TILE_X ? g1 - t : TOVL_CPU_TILE_X;
                const uint16_t *x[TOVL_CPU_TILE_X];
                for (uint32_t j = 0; j < TOVL_CPU_TILE_X; j++) {
                    x[j] = job->x + (size_t)(t + (j < nx ? j : 0)) * job->h;
                }
                float out[TOVL_CPU_TILE_X * TOVL_CPU_TILE_W];
                job->ex->ops->dot_tile(x, nx, w, nw, job->h, out);
                for (uint32_t j = 0; j < nx; j++) {
                    for (uint32_t b = 0; b < nw; b++) {
                        const uint32_t bits = tovl_cpu_f32_out_bits(out[j * TOVL_CPU_TILE_W + b]);
                        memcpy(job->out + (size_t)(t + j) * job->n_rows + v + b, &bits, sizeof bits);
                    }
                }
            }
        }
    }
}

void tovl_cpu_matmul_bf16(const tovl_cpu_exec *ex, const uint16_t *x, uint32_t T, uint32_t h,
                          const uint16_t *(*row)(const void *ctx, uint32_t v), const void *row_ctx, uint32_t n_rows,
                          float *out) {
    matmul_job job = {.ex = ex, .x = x, .T = T, .h = h, .n_rows = n_rows, .row = row, .row_ctx = row_ctx, .out = out};
    atomic_init(&job.next, 0);
    const uint64_t work = (uint64_t)T * n_rows * h;
    tovl_cpu_pool_run(ex->pool, work < SMALL_WORK ? 1u : tovl_cpu_pool_threads(ex->pool), matmul_worker, &job);
}

tovl_status tovl_cpu_matmul_bf16_once(const uint16_t *x, uint32_t T, uint32_t h,
                                      const uint16_t *(*row)(const void *ctx, uint32_t v), const void *row_ctx,
                                      uint32_t n_rows, float *out) {
    tovl_cpu_exec ex = {0};
    unsigned threads;
    tovl_status st = tovl_cpu_simd_from_env(&ex.ops);
    if (st == TOVL_OK) st = tovl_cpu_threads_from_env(&threads);
    if (st == TOVL_OK && (uint64_t)T * n_rows * h >= SMALL_WORK) st = tovl_cpu_pool_create(threads, &ex.pool);
    if (st == TOVL_OK) tovl_cpu_matmul_bf16(&ex, x, T, h, row, row_ctx, n_rows, out);
    tovl_cpu_pool_destroy(ex.pool);
    return st;
}
