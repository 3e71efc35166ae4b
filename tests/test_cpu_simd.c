/* The CPU backend's fast paths against the spec's literal loop, bit for bit:
 * every vector width this machine has (and the 16-lane code built for the
 * baseline, so the AVX-512 order is checked on any machine), 1 and several
 * threads, random and adversarial data (NaN, Inf, -0, subnormals, odd h). */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_simd.h"
#include "testutil.h"

/* ------------------------------------------------------------------------ */
/* The spec's text (docs/SPEC.md), literally.                                */
/* ------------------------------------------------------------------------ */
static float spec_dot(const uint16_t *x, const uint16_t *w, uint32_t h) {
    float p[256];
    for (int l = 0; l < 256; l++) p[l] = +0.0f;
    for (uint32_t i = 0; i < h; i++) p[i % 256] = p[i % 256] + tovl_bf16_to_f32(x[i]) * tovl_bf16_to_f32(w[i]);
    for (int stride = 128; stride >= 1; stride /= 2)
        for (int l = 0; l < stride; l++) p[l] = p[l] + p[l + stride];
    return p[0];
}

static uint32_t f32_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) b = 0x7FC00000u; /* the spec's canonical NaN */
    return b;
}

static uint32_t raw_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

/* Every width to check: what this CPU runs, plus the portable 16-lane code. */
static size_t widths(const tovl_cpu_simd_ops **out) {
    size_t n = 0;
    for (int s = 0; s < TOVL_CPU_SIMD_COUNT; s++)
        if (tovl_cpu_simd_ops_of((tovl_cpu_simd)s)) out[n++] = tovl_cpu_simd_ops_of((tovl_cpu_simd)s);
    out[n++] = tovl_cpu_simd_ops_wide_portable();
    return n;
}

/* Adversarial bf16: NaN, +-Inf, +-0, subnormals, the largest and smallest
 * normals (products overflow to Inf or underflow to f32 subnormals), and
 * ordinary values of every magnitude, mixed at random. */
static uint16_t nasty_bf16(tu_rng *r) {
    static const uint16_t special[] = {0x7FC0, 0xFFC1, 0x7F81, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F,
                                       0x0040, 0x7F7F, 0xFF7F, 0x0080, 0x8080, 0x3F80, 0xBF80, 0x2000, 0x1F80};
    switch (tu_below(r, 4)) {
    case 0: return special[tu_below(r, sizeof special / sizeof special[0])];
    case 1: return (uint16_t)tu_next(r); /* any pattern at all */
    default: return tu_bf16(r);
    }
}

static const uint32_t odd_h[] = {1, 2, 3, 7, 8, 15, 16, 17, 100, 255, 256, 257, 511, 1000, 1024, 1031, 4096, 4097};

Test(cpu_simd, dot_tiles_match_the_spec_at_every_width) {
    tu_rng r = tu_rng_for("cpu_simd.dot_tiles");
    const tovl_cpu_simd_ops *ops[TOVL_CPU_SIMD_COUNT + 1];
    const size_t n_ops = widths(ops);
    cr_assert_geq(n_ops, 3, "scalar, sse2 and the portable 16 lanes are always there");
    enum { HMAX = 4097 };
    uint16_t *buf = malloc((TOVL_CPU_TILE_X + TOVL_CPU_TILE_W) * (size_t)HMAX * 2);
    cr_assert_not_null(buf);
    size_t checked = 0, nan = 0, inf = 0, subnormal = 0;
    for (size_t hi = 0; hi < sizeof odd_h / sizeof odd_h[0]; hi++) {
        const uint32_t h = odd_h[hi];
        for (int trial = 0; trial < 6; trial++) {
            const bool nasty = trial >= 3;
            for (size_t i = 0; i < (TOVL_CPU_TILE_X + TOVL_CPU_TILE_W) * (size_t)h; i++)
                buf[i] = nasty ? nasty_bf16(&r) : tu_bf16(&r);
            if (nasty && trial == 5) /* one clean row pair whose products are all subnormal */
                for (uint32_t i = 0; i < h; i++) buf[i] = 0x0800, buf[TOVL_CPU_TILE_X * h + i] = 0x3000;
            if (nasty && trial == 4) /* one row pair whose products all overflow: that cell is +Inf */
                for (uint32_t i = 0; i < h; i++) buf[h + i] = 0x7F7F, buf[(TOVL_CPU_TILE_X + 1) * (size_t)h + i] = 0x7F7F;
            const uint16_t *x[TOVL_CPU_TILE_X], *w[TOVL_CPU_TILE_W];
            for (int a = 0; a < TOVL_CPU_TILE_X; a++) x[a] = buf + (size_t)a * h;
            for (int b = 0; b < TOVL_CPU_TILE_W; b++) w[b] = buf + (size_t)(TOVL_CPU_TILE_X + b) * h;
            float want[TOVL_CPU_TILE_X * TOVL_CPU_TILE_W];
            for (int a = 0; a < TOVL_CPU_TILE_X; a++)
                for (int b = 0; b < TOVL_CPU_TILE_W; b++) {
                    want[a * TOVL_CPU_TILE_W + b] = spec_dot(x[a], w[b], h);
                    const uint32_t bits = raw_bits(want[a * TOVL_CPU_TILE_W + b]) & 0x7FFFFFFFu;
                    nan += bits > 0x7F800000u;
                    inf += bits == 0x7F800000u;
                    subnormal += bits && bits < 0x00800000u;
                }
            for (size_t o = 0; o < n_ops; o++)
                for (uint32_t nx = 1; nx <= TOVL_CPU_TILE_X; nx++)
                    for (uint32_t nw = 1; nw <= TOVL_CPU_TILE_W; nw++) {
                        float got[TOVL_CPU_TILE_X * TOVL_CPU_TILE_W];
                        for (int i = 0; i < TOVL_CPU_TILE_X * TOVL_CPU_TILE_W; i++) got[i] = -1234.5f;
                        ops[o]->dot_tile(x, nx, w, nw, h, got);
                        for (uint32_t a = 0; a < TOVL_CPU_TILE_X; a++)
                            for (uint32_t b = 0; b < TOVL_CPU_TILE_W; b++) {
                                const float g = got[a * TOVL_CPU_TILE_W + b];
                                if (a >= nx || b >= nw) {
                                    cr_assert_eq(g, -1234.5f, "%s wrote outside its %ux%u tile", ops[o]->name, nx, nw);
                                    continue;
                                }
                                const float e = want[a * TOVL_CPU_TILE_W + b];
                                /* NaN payloads are canonicalized on output; everything else bit for bit */
                                cr_assert_eq(f32_bits(g), f32_bits(e), "%s h %u trial %d tile %ux%u [%u][%u]: 0x%08x, spec 0x%08x",
                                             ops[o]->name, h, trial, nx, nw, a, b, raw_bits(g), raw_bits(e));
                                checked++;
                            }
                    }
        }
    }
    cr_assert_gt(nan, 20, "the data must reach NaN (%zu)", nan);
    cr_assert_gt(inf, 5, "the data must reach Inf (%zu)", inf);
    cr_assert_gt(subnormal, 5, "the data must reach subnormal results (%zu)", subnormal);
    cr_assert_gt(checked, 1000);
    free(buf);
}

Test(cpu_simd, the_widths_differ_from_other_orders) {
    /* The data of the order test in test_dot.c: a sum that changes under any
     * other lane count; every width must still give the 256-lane bits. */
    tu_rng r = tu_rng_for("cpu_simd.order");
    enum { H = 4096 };
    static uint16_t x[H], w[H];
    const tovl_cpu_simd_ops *ops[TOVL_CPU_SIMD_COUNT + 1];
    const size_t n_ops = widths(ops);
    for (int trial = 0; trial < 20; trial++) {
        const uint32_t h = 257 + tu_below(&r, H - 257);
        for (uint32_t i = 0; i < h; i++) {
            x[i] = tovl_f32_to_bf16(ldexpf(1.0f + (float)tu_below(&r, 128) / 128.0f, (int)tu_below(&r, 25) - 12) *
                                    ((tu_next(&r) & 1) ? -1.0f : 1.0f));
            w[i] = tovl_f32_to_bf16(ldexpf(1.0f + (float)tu_below(&r, 128) / 128.0f, (int)tu_below(&r, 25) - 12));
        }
        const uint16_t *xs[TOVL_CPU_TILE_X] = {x, x}, *ws[TOVL_CPU_TILE_W] = {w, w};
        const float want = spec_dot(x, w, h);
        for (size_t o = 0; o < n_ops; o++) {
            float got[TOVL_CPU_TILE_X * TOVL_CPU_TILE_W];
            ops[o]->dot_tile(xs, 1, ws, 1, h, got);
            cr_assert_eq(raw_bits(got[0]), raw_bits(want), "%s h %u", ops[o]->name, h);
        }
    }
}

Test(cpu_simd, rowdiff_tolerance_matches_the_rule_at_every_width) {
    tu_rng r = tu_rng_for("cpu_simd.rowdiff");
    const tovl_cpu_simd_ops *ops[TOVL_CPU_SIMD_COUNT + 1];
    const size_t n_ops = widths(ops);
    uint16_t a[4097], b[4097];
    int differing = 0, same = 0;
    for (size_t hi = 0; hi < sizeof odd_h / sizeof odd_h[0]; hi++) {
        const uint32_t h = odd_h[hi];
        for (int trial = 0; trial < 40; trial++) {
            for (uint32_t i = 0; i < h; i++) a[i] = b[i] = tu_bf16(&r);
            const float tol = trial % 2 ? 0.1f : 1e-30f;
            const uint32_t at = tu_below(&r, h);
            switch (trial % 8) { /* one change somewhere, of one kind */
            case 0: b[at] = 0x7FC0; break;                       /* NaN on one side */
            case 1: a[at] = 0x7FC0, b[at] = 0xFFC1; break;      /* NaN on both: not a difference */
            case 2: b[at] = 0x7F80; break;                       /* Inf */
            case 3: a[at] = 0x7F80, b[at] = 0x7F80; break;      /* Inf on both: Inf - Inf is NaN, not > tol */
            case 4: b[at] = (uint16_t)(a[at] ^ 1); break;        /* one ulp */
            case 5: b[at] = (uint16_t)(a[at] ^ 0x8000); break;   /* the sign */
            case 6: a[at] = 0x0001, b[at] = 0x8001; break;       /* subnormals */
            default: break;                                      /* equal */
            }
            const uint32_t want = tovl_cpu_rows_differ(a, b, h, tol);
            differing += want != 0;
            same += want == 0;
            for (size_t o = 0; o < n_ops; o++)
                cr_assert_eq(ops[o]->rows_differ_tol(a, b, h, tol), want, "%s h %u trial %d tol %g", ops[o]->name, h,
                             trial, (double)tol);
        }
    }
    cr_assert_gt(differing, 100);
    cr_assert_gt(same, 100);
}

/* ------------------------------------------------------------------------ */
/* The kernels through the pool, against the spec's cell rule.               */
/* ------------------------------------------------------------------------ */
enum { SLOTS = 5, VOCAB = 3000, POISON16 = 0xA5C3, GUARD = 64 };

typedef struct lm_case {
    uint32_t T, h, n[SLOTS];
    uint16_t *hidden, *rows[SLOTS];
    uint32_t *ids[SLOTS];
    int32_t *slots;
    uint64_t rows_table[SLOTS], ids_table[SLOTS];
    uint32_t n_table[SLOTS];
} lm_case;

static void lm_case_make(tu_rng *r, lm_case *c, uint32_t T, uint32_t h, bool nasty) {
    memset(c, 0, sizeof *c);
    c->T = T;
    c->h = h;
    c->hidden = malloc((size_t)T * h * 2);
    c->slots = malloc(T * sizeof *c->slots);
    for (size_t i = 0; i < (size_t)T * h; i++) c->hidden[i] = nasty && tu_below(r, 64) == 0 ? nasty_bf16(r) : tu_bf16(r);
    for (uint32_t t = 0; t < T; t++) c->slots[t] = (int32_t)tu_below(r, SLOTS + 2) - 1; /* -1 and SLOTS: no slot */
    c->slots[0] = 0; /* never a case that patches nothing */
    for (int s = 0; s < SLOTS; s++) {
        c->n[s] = s == 1 ? 0 : s == 0 ? 8 + tu_below(r, 33) : 1 + tu_below(r, 40); /* slot 1: no lm_head rows */
        c->rows[s] = malloc((size_t)(c->n[s] + 1) * h * 2);
        c->ids[s] = malloc((c->n[s] + 1) * sizeof *c->ids[s]);
        for (size_t i = 0; i < (size_t)c->n[s] * h; i++)
            c->rows[s][i] = nasty && tu_below(r, 64) == 0 ? nasty_bf16(r) : tu_bf16(r);
        tu_distinct_ids(r, VOCAB + 20, c->n[s], c->ids[s]); /* some ids >= vocab: skipped */
        c->rows_table[s] = (uint64_t)(uintptr_t)c->rows[s];
        c->ids_table[s] = (uint64_t)(uintptr_t)c->ids[s];
        c->n_table[s] = c->n[s];
    }
}

static void lm_case_free(lm_case *c) {
    free(c->hidden);
    free(c->slots);
    for (int s = 0; s < SLOTS; s++) free(c->rows[s]), free(c->ids[s]);
}

static tovl_lmhead_overlay_args lm_args(lm_case *c, void *logits, uint32_t ld, int32_t active, uint32_t max_n) {
    return (tovl_lmhead_overlay_args){(uint64_t)(uintptr_t)logits, (uint64_t)(uintptr_t)c->hidden,
                                      active >= -1 ? 0 : (uint64_t)(uintptr_t)c->slots,
                                      (uint64_t)(uintptr_t)c->rows_table, (uint64_t)(uintptr_t)c->ids_table,
                                      (uint64_t)(uintptr_t)c->n_table, ld, c->T, c->h, VOCAB, SLOTS,
                                      active >= -1 ? active : -1, max_n};
}

/* The spec's lm_head rule, cell by cell, into a poisoned copy. */
static void lm_expect(const lm_case *c, const tovl_lmhead_overlay_args *a, bool f32, uint8_t *logits) {
    for (uint32_t t = 0; t < a->T; t++) {
        const int32_t s = a->row_slots ? c->slots[t] : a->active_slot;
        if (s < 0 || s >= SLOTS) continue;
        for (uint32_t k = 0; k < c->n[s] && k < a->max_n; k++) {
            const uint32_t id = c->ids[s][k];
            if (id >= VOCAB) continue;
            const float d = spec_dot(c->hidden + (size_t)t * c->h, c->rows[s] + (size_t)k * c->h, c->h);
            const size_t cell = (size_t)t * a->ld + id;
            if (f32) {
                const uint32_t bits = f32_bits(d);
                memcpy(logits + 4 * cell, &bits, 4);
            } else {
                const uint16_t v = tovl_f32_to_bf16(d);
                memcpy(logits + 2 * cell, &v, 2);
            }
        }
    }
}

static void check_lmhead(const tovl_cpu_exec *ex, lm_case *c, int32_t active, uint32_t max_n, const char *what) {
    const uint32_t ld = VOCAB + 3;
    for (int f32 = 0; f32 < 2; f32++) {
        const size_t bytes = (size_t)c->T * ld * (f32 ? 4 : 2);
        uint16_t *got = malloc(bytes + 2 * GUARD), *want = malloc(bytes + 2 * GUARD);
        for (size_t i = 0; i < (bytes + 2 * GUARD) / 2; i++) got[i] = want[i] = POISON16;
        tovl_lmhead_overlay_args a = lm_args(c, (uint8_t *)got + GUARD, ld, active, max_n);
        tovl_cpu_lmhead_overlay_fast(ex, &a, f32);
        lm_expect(c, &a, f32, (uint8_t *)want + GUARD);
        size_t touched = 0;
        for (size_t i = 0; i < (bytes + 2 * GUARD) / 2; i++) {
            cr_assert_eq(got[i], want[i], "%s %s T %u h %u threads %u: u16 %zd of the logits: 0x%04x, spec 0x%04x",
                         ex->ops->name, f32 ? "f32" : "bf16", c->T, c->h, tovl_cpu_pool_threads(ex->pool),
                         (ptrdiff_t)i - GUARD / 2, got[i], want[i]);
            touched += want[i] != POISON16;
        }
        cr_assert_gt(touched, 0, "%s: the case patches nothing", what);
        free(got);
        free(want);
    }
}

Test(cpu_simd, lmhead_overlay_matches_the_spec_at_every_width_and_thread_count) {
    tu_rng r = tu_rng_for("cpu_simd.lmhead");
    const tovl_cpu_simd_ops *ops[TOVL_CPU_SIMD_COUNT + 1];
    const size_t n_ops = widths(ops);
    const unsigned thread_counts[] = {1, 2, 3};
    static const uint32_t Ts[] = {1, 3, 17, 64};
    static const uint32_t hs[] = {1, 7, 100, 257, 4097};
    for (size_t ti = 0; ti < 3; ti++) {
        tovl_cpu_pool *pool;
        cr_assert_eq(tovl_cpu_pool_create(thread_counts[ti], &pool), TOVL_OK);
        for (size_t hi = 0; hi < sizeof hs / sizeof hs[0]; hi++) {
            for (size_t Ti = 0; Ti < sizeof Ts / sizeof Ts[0]; Ti++) {
                if (hs[hi] == 4097 && Ts[Ti] > 17) continue; /* the literal loop is slow */
                lm_case c;
                lm_case_make(&r, &c, Ts[Ti], hs[hi], Ti % 2 == 1);
                for (size_t o = 0; o < n_ops; o++) {
                    const tovl_cpu_exec ex = {ops[o], pool};
                    check_lmhead(&ex, &c, -2, 64, "row slots");
                    if (Ti == 3) {
                        check_lmhead(&ex, &c, 2, 64, "active slot 2");
                        check_lmhead(&ex, &c, -2, 5, "max_n 5 cuts rows");
                    }
                }
                lm_case_free(&c);
            }
        }
        tovl_cpu_pool_destroy(pool);
    }
}

static const uint16_t *row_of(const void *ctx, uint32_t v) {
    const uint16_t *const *rows = ctx;
    return rows[v];
}

Test(cpu_simd, matmul_matches_the_spec_at_every_width_and_thread_count) {
    tu_rng r = tu_rng_for("cpu_simd.matmul");
    const tovl_cpu_simd_ops *ops[TOVL_CPU_SIMD_COUNT + 1];
    const size_t n_ops = widths(ops);
    static const uint32_t hs[] = {1, 7, 257, 1031, 4097};
    for (size_t hi = 0; hi < sizeof hs / sizeof hs[0]; hi++) {
        const uint32_t h = hs[hi], T = 1 + tu_below(&r, 40), n_rows = 1 + tu_below(&r, 300);
        uint16_t *x = malloc((size_t)T * h * 2), *w = malloc((size_t)n_rows * h * 2), zero[4097] = {0};
        const uint16_t **rows = malloc(n_rows * sizeof *rows);
        for (size_t i = 0; i < (size_t)T * h; i++) x[i] = hi % 2 ? nasty_bf16(&r) : tu_bf16(&r);
        for (size_t i = 0; i < (size_t)n_rows * h; i++) w[i] = tu_below(&r, 32) == 0 ? nasty_bf16(&r) : tu_bf16(&r);
        for (uint32_t v = 0; v < n_rows; v++) rows[v] = v % 7 == 6 ? zero : w + (size_t)v * h; /* padded-vocab rows */
        float *want = malloc(((size_t)T * n_rows + 2) * 4), *got = malloc(((size_t)T * n_rows + 2) * 4);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t v = 0; v < n_rows; v++) {
                const uint32_t bits = f32_bits(spec_dot(x + (size_t)t * h, rows[v], h));
                memcpy(&want[(size_t)t * n_rows + v], &bits, 4);
            }
        for (unsigned threads = 1; threads <= 3; threads += 2) {
            tovl_cpu_pool *pool;
            cr_assert_eq(tovl_cpu_pool_create(threads, &pool), TOVL_OK);
            for (size_t o = 0; o < n_ops; o++) {
                const tovl_cpu_exec ex = {ops[o], pool};
                memset(got, 0xA5, ((size_t)T * n_rows + 2) * 4);
                tovl_cpu_matmul_bf16(&ex, x, T, h, row_of, rows, n_rows, got);
                cr_assert_arr_eq(got, want, (size_t)T * n_rows * 4, "%s threads %u: T %u h %u rows %u", ops[o]->name,
                                 threads, T, h, n_rows);
                uint32_t guard[2];
                memcpy(guard, got + (size_t)T * n_rows, 8);
                cr_assert(guard[0] == 0xA5A5A5A5u && guard[1] == 0xA5A5A5A5u, "written past the logits");
            }
            tovl_cpu_pool_destroy(pool);
        }
        free(x), free(w), free(rows), free(want), free(got);
    }
}

Test(cpu_simd, rowdiff_fast_matches_the_reference_with_threads) {
    tu_rng r = tu_rng_for("cpu_simd.rowdiff_fast");
    enum { ROWS = 3001, H = 257 };
    uint16_t *a = malloc((size_t)ROWS * H * 2), *b = malloc((size_t)ROWS * H * 2);
    uint32_t *want = malloc((ROWS + 1) * 4), *got = malloc((ROWS + 1) * 4);
    tu_fill_bf16(&r, a, (size_t)ROWS * H);
    memcpy(b, a, (size_t)ROWS * H * 2);
    for (int i = 0; i < 400; i++) {
        const size_t at = (size_t)tu_below(&r, ROWS) * H + tu_below(&r, H);
        b[at] = i % 3 ? (uint16_t)(b[at] ^ (1u << tu_below(&r, 16))) : 0x7FC0;
    }
    const tovl_cpu_simd_ops *ops[TOVL_CPU_SIMD_COUNT + 1];
    const size_t n_ops = widths(ops);
    for (unsigned threads = 1; threads <= 3; threads++) {
        tovl_cpu_pool *pool;
        cr_assert_eq(tovl_cpu_pool_create(threads, &pool), TOVL_OK);
        for (size_t o = 0; o < n_ops; o++) {
            for (int k = 0; k < 2; k++) {
                tovl_rowdiff_args args = {(uint64_t)(uintptr_t)a, (uint64_t)(uintptr_t)b, (uint64_t)(uintptr_t)want,
                                          ROWS, H, k ? 0.05f : 0.0f, 0};
                tovl_cpu_rowdiff(&args);
                memset(got, 0xEE, (ROWS + 1) * 4);
                args.flags = (uint64_t)(uintptr_t)got;
                const tovl_cpu_exec ex = {ops[o], pool};
                tovl_cpu_rowdiff_fast(&ex, &args);
                cr_assert_arr_eq(got, want, ROWS * 4, "%s threads %u tol %g", ops[o]->name, threads, (double)args.tol);
                cr_assert_eq(got[ROWS], 0xEEEEEEEEu, "sentinel after the flags");
            }
        }
        tovl_cpu_pool_destroy(pool);
    }
    free(a), free(b), free(want), free(got);
}

/* ------------------------------------------------------------------------ */
/* The environment and the pool.                                             */
/* ------------------------------------------------------------------------ */
Test(cpu_simd, the_environment_picks_width_and_threads_or_is_refused_by_name) {
    tovl_backend *be;
    setenv("TOVL_CPU_SIMD", "scalar", 1);
    setenv("TOVL_CPU_THREADS", "3", 1);
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK, "%s", tovl_last_error());
    cr_assert_str_eq(tovl_backend_device(be), "host CPU (scalar, 3 threads)");
    tovl_backend_close(be);
    setenv("TOVL_CPU_SIMD", "sse2", 1);
    setenv("TOVL_CPU_THREADS", "1", 1);
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK, "%s", tovl_last_error());
    cr_assert_str_eq(tovl_backend_device(be), "host CPU (sse2, 1 thread)");
    tovl_backend_close(be);
    setenv("TOVL_CPU_SIMD", "avx1024", 1);
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(tovl_last_error(), "TOVL_CPU_SIMD=avx1024"), "%s", tovl_last_error());
    if (!tovl_cpu_simd_ops_of(TOVL_CPU_SIMD_AVX512)) {
        setenv("TOVL_CPU_SIMD", "avx512", 1);
        cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(tovl_last_error(), "no avx512"), "%s", tovl_last_error());
    }
    unsetenv("TOVL_CPU_SIMD");
    const char *bad[] = {"0", "-2", "two", "1025", "3x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("TOVL_CPU_THREADS", bad[i], 1);
        cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_ERR_INVALID_ARGUMENT, "TOVL_CPU_THREADS=%s", bad[i]);
        cr_assert(strstr(tovl_last_error(), "TOVL_CPU_THREADS"), "%s", tovl_last_error());
    }
    unsetenv("TOVL_CPU_THREADS");
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    cr_assert(strstr(tovl_backend_device(be), "host CPU ("), "%s", tovl_backend_device(be));
    tovl_backend_close(be);
}

/* Two threads launching on one backend at once: one gets the pool, the other
 * runs alone; both get the spec's bits. */
typedef struct racer {
    tovl_backend *be;
    lm_case *c;
    uint32_t *logits;
    int rounds;
} racer;

static void *race(void *arg) {
    racer *x = arg;
    tovl_kernel k = tovl_try_kernel(x->be, TOVL_KERNEL_LMHEAD_OVERLAY_F32);
    for (int i = 0; i < x->rounds; i++) {
        tovl_lmhead_overlay_args a = lm_args(x->c, x->logits, VOCAB, -2, 64);
        const tovl_backend_iface *iface = tovl_backend_get_iface(x->be);
        if (iface->launch(tovl_backend_get_context(x->be), k, (uint32_t[3]){x->c->T, 64, 1}, &a, sizeof a, NULL) !=
            TOVL_OK)
            return (void *)1;
    }
    return NULL;
}

Test(cpu_simd, concurrent_launches_on_one_backend_agree) {
    tu_rng r = tu_rng_for("cpu_simd.race");
    setenv("TOVL_CPU_THREADS", "2", 1);
    tovl_backend *be;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    unsetenv("TOVL_CPU_THREADS");
    lm_case c;
    lm_case_make(&r, &c, 48, 512, false);
    uint32_t *want = calloc((size_t)c.T * VOCAB, 4);
    tovl_lmhead_overlay_args a = lm_args(&c, want, VOCAB, -2, 64);
    lm_expect(&c, &a, true, (uint8_t *)want);
    racer x[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        x[i] = (racer){be, &c, calloc((size_t)c.T * VOCAB, 4), 30};
        cr_assert_eq(pthread_create(&th[i], NULL, race, &x[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        cr_assert_null(rc, "a launch failed");
        cr_assert_arr_eq(x[i].logits, want, (size_t)c.T * VOCAB * 4, "racer %d", i);
        free(x[i].logits);
    }
    free(want);
    lm_case_free(&c);
    tovl_backend_close(be);
}

/* ------------------------------------------------------------------------ */
/* The bench members: wall-clock medians and a memcpy bandwidth.             */
/* ------------------------------------------------------------------------ */
Test(cpu_simd, time_kernel_and_copy_bandwidth_give_numbers_and_refuse_bad_input) {
    tovl_backend *be;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    tu_expect_timing_members(be, (8u << 20) + 12345);
    /* And bad input refused: an argument block of the wrong size, no launches, no repeats. */
    const tovl_backend_iface *iface = tovl_backend_get_iface(be);
    void *ctx = tovl_backend_get_context(be);
    const uint32_t rows = 64, h = 256;
    tovl_devptr buf = 0;
    cr_assert_eq(tovl_alloc(be, 2u * rows * h * 2 + rows * 4, &buf), TOVL_OK);
    tovl_rowdiff_args a = {.a = buf, .b = buf + rows * h * 2, .flags = buf + 2u * rows * h * 2, .rows = rows, .h = h};
    const uint32_t grid[3] = {rows, 1, 1};
    tovl_kernel_timing t = {0};
    double gbps = 0;
    cr_expect_eq(iface->time_kernel(ctx, tovl_try_kernel(be, TOVL_KERNEL_ROWDIFF), grid, &a, sizeof a - 8, 5, 3, &t),
                 TOVL_ERR_LAUNCH);
    cr_expect_eq(iface->time_kernel(ctx, tovl_try_kernel(be, TOVL_KERNEL_ROWDIFF), grid, &a, sizeof a, 0, 3, &t),
                 TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_eq(iface->copy_bandwidth(ctx, 1024, 0, &gbps), TOVL_ERR_INVALID_ARGUMENT);
    tovl_free(be, buf);
    tovl_backend_close(be);
}

Test(cpu_simd, bench_cli_runs_on_the_cpu_backend, .timeout = 300) {
    char json_path[] = "/tmp/tovl_cpu_bench_XXXXXX";
    const int fd = mkstemp(json_path);
    cr_assert_geq(fd, 0, "mkstemp");
    close(fd);
    char args[256], err[4096];
    snprintf(args, sizeof args,
             "bench --backend cpu --quick --tokens 9,2 --batch 3 --repeats 3 --seed %llu --json '%s'",
             (unsigned long long)tu_seed(), json_path);
    const int rc = tu_run_cli(TOVL_CLI, NULL, args, err, sizeof err);
    cr_assert_eq(rc, 0, "tovl %s: exit %d: %s", args, rc, err);
    FILE *f = fopen(json_path, "r");
    cr_assert_not_null(f, "no --json file");
    static char text[1 << 16];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(json_path);
    size_t rows = 0;
    for (const char *p = strstr(text, "\"graph_us\""); p; p = strstr(p + 1, "\"graph_us\"")) {
        cr_expect_gt(strtod(p + strlen("\"graph_us\":"), NULL), 0.0, "a row without a time: %.80s", p);
        rows++;
    }
    cr_expect_eq(rows, 8, "rowdiff, the idle embed launch and three hooks at each of two sizes:\n%s", text);
    cr_expect(strstr(text, "\"backend\":\t\"cpu\"") != NULL, "%s", text);
    const char *copy = strstr(text, "\"copy_gbps\":");
    cr_assert_not_null(copy);
    cr_expect_gt(strtod(copy + strlen("\"copy_gbps\":"), NULL), 0.0, "no copy bandwidth: %s", text);
}
