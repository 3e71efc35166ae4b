/* Every skip rule of the CPU reference kernels, driven through their argument
 * structs directly (so rules the core never exercises, like stale slot_map
 * entries or ids >= vocab inside a table, are covered too). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "testutil.h"

#define P(x) ((uint64_t)(uintptr_t)(x))
enum { H = 12, VOCAB = 20, T = 8, MAXL = 2 };
#define POISON_BF16 0xA5A5u

/* Slot 0: ids {3, 7} rows A; slot 1: no slot_map (0 in the table). */
typedef struct embed_fixture {
    uint16_t hidden[T * H], before[T * H];
    uint16_t rows0[2 * H];
    int32_t map0[VOCAB];
    uint64_t maps[MAXL], rows[MAXL];
    uint32_t n[MAXL];
    uint32_t ids[T];
    int32_t slots[T];
    tovl_embed_overlay_args a;
} embed_fixture;

static void embed_setup(embed_fixture *f, tu_rng *r) {
    tu_fill_bf16(r, f->hidden, T * H);
    memcpy(f->before, f->hidden, sizeof f->hidden);
    tu_fill_bf16(r, f->rows0, 2 * H);
    for (int i = 0; i < VOCAB; i++) f->map0[i] = -1;
    f->map0[3] = 0;
    f->map0[7] = 1;
    f->map0[9] = 5; /* stale entry: j >= n must be skipped */
    f->maps[0] = P(f->map0);
    f->maps[1] = 0;
    f->rows[0] = P(f->rows0);
    f->rows[1] = 0;
    f->n[0] = 2;
    f->n[1] = 0;
    f->a = (tovl_embed_overlay_args){.hidden = P(f->hidden), .token_ids = P(f->ids), .token_slots = P(f->slots),
                                     .slot_map_table = P(f->maps), .rows_table = P(f->rows), .n_table = P(f->n),
                                     .T = T, .h = H, .vocab = VOCAB, .max_loras = MAXL, .active_slot = -1};
}

Test(kernels, embed_overlay_applies_and_skips_by_rule) {
    tu_rng r = tu_rng_for("kernels.embed");
    embed_fixture f;
    embed_setup(&f, &r);
    /* t: 0 patched (id 3), 1 patched (id 7), 2 id not overlaid, 3 slot -1,
     * 4 slot >= max_loras, 5 slot without slot_map, 6 id >= vocab, 7 stale entry */
    const uint32_t ids[T] = {3, 7, 4, 3, 3, 3, VOCAB + 3, 9};
    const int32_t slots[T] = {0, 0, 0, -1, MAXL, 1, 0, 0};
    memcpy(f.ids, ids, sizeof ids);
    memcpy(f.slots, slots, sizeof slots);
    tovl_cpu_embed_overlay(&f.a);
    cr_assert_arr_eq(f.hidden, f.rows0, H * 2, "token 0 gets row 0");
    cr_assert_arr_eq(f.hidden + H, f.rows0 + H, H * 2, "token 1 gets row 1");
    for (int t = 2; t < T; t++) {
        cr_assert_arr_eq(f.hidden + t * H, f.before + t * H, H * 2, "token %d must stay untouched", t);
    }
}

Test(kernels, embed_overlay_active_slot_mode) {
    tu_rng r = tu_rng_for("kernels.embed_active");
    embed_fixture f;
    embed_setup(&f, &r);
    for (int t = 0; t < T; t++) {
        f.ids[t] = t % 2 ? 7 : 3;
        f.slots[t] = -5; /* ignored: no slot array */
    }
    f.a.token_slots = 0;
    f.a.active_slot = 0;
    tovl_cpu_embed_overlay(&f.a);
    for (int t = 0; t < T; t++) {
        cr_assert_arr_eq(f.hidden + t * H, f.rows0 + (t % 2) * H, H * 2, "token %d", t);
    }
}

Test(kernels, lmhead_writes_only_its_cells) {
    tu_rng r = tu_rng_for("kernels.lmhead");
    enum { LD = VOCAB + 5 };
    uint16_t hidden[T * H], rows0[3 * H];
    tu_fill_bf16(&r, hidden, T * H);
    tu_fill_bf16(&r, rows0, 3 * H);
    uint32_t ids0[3] = {2, VOCAB + 1 /* >= vocab: skipped */, 19};
    uint64_t rows_t[MAXL] = {P(rows0), 0}, ids_t[MAXL] = {P(ids0), 0};
    uint32_t n_t[MAXL] = {3, 0};
    int32_t slots[T] = {0, -1, MAXL, 1, 0, 0, 7, 0};
    float logits[T * LD], before[T * LD];
    for (int i = 0; i < T * LD; i++) logits[i] = before[i] = (float)i + 0.5f;
    tovl_lmhead_overlay_args a = {.logits = P(logits), .hidden = P(hidden), .row_slots = P(slots),
                                  .rows_table = P(rows_t), .ids_table = P(ids_t), .n_table = P(n_t), .ld = LD,
                                  .T = T, .h = H, .vocab = VOCAB, .max_loras = MAXL, .active_slot = 0, .max_n = 3};
    tovl_cpu_lmhead_overlay(&a, true);
    for (int t = 0; t < T; t++) {
        for (int c = 0; c < LD; c++) {
            bool patched = slots[t] == 0 && (c == 2 || c == 19);
            float want = patched ? tovl_cpu_dot_bf16(hidden + t * H, rows0 + (c == 2 ? 0 : 2) * H, H) : before[t * LD + c];
            cr_assert_eq(logits[t * LD + c], want, "row %d col %d", t, c);
        }
    }
}

Test(kernels, lmhead_bf16_rounds_and_canonicalizes_nan) {
    /* row 0: [1, 1] . [1, 2^-8] = 1 + 2^-8, a bf16 tie: rounds to even 1.0.
     * row 1: [Inf, -Inf] . [1, 2^-8] = Inf + -Inf = NaN: canonical 0x7FC0. */
    uint16_t hidden[2 * 2] = {0x3F80, 0x3F80, 0x7F80, 0xFF80};
    uint16_t rows0[2] = {0x3F80, 0x3B80};
    float tie = 1.0f + 1.0f / 256.0f;
    uint32_t ids0[1] = {1};
    uint64_t rows_t[1] = {P(rows0)}, ids_t[1] = {P(ids0)};
    uint32_t n_t[1] = {1};
    uint16_t logits[2 * 4] = {0x1111, 0x2222, 0x3333, 0x4444, 0x5555, 0x6666, 0x7777, 0x0888};
    int32_t slots[2] = {0, 0};
    tovl_lmhead_overlay_args a = {.logits = P(logits), .hidden = P(hidden), .row_slots = P(slots),
                                  .rows_table = P(rows_t), .ids_table = P(ids_t), .n_table = P(n_t), .ld = 4,
                                  .T = 2, .h = 2, .vocab = 3, .max_loras = 1, .active_slot = 0, .max_n = 1};
    tovl_cpu_lmhead_overlay(&a, false);
    cr_assert_eq(tovl_cpu_dot_bf16(hidden, rows0, 2), tie);
    cr_assert_eq(logits[1], 0x3F80, "1 + 2^-8 is a bf16 tie: rounds to even 1.0, got 0x%04x", logits[1]);
    cr_assert_eq(logits[5], 0x7FC0, "Inf - Inf is the canonical NaN, got 0x%04x", logits[5]);
    const uint16_t untouched[6] = {0x1111, 0x3333, 0x4444, 0x5555, 0x7777, 0x0888};
    const int cells[6] = {0, 2, 3, 4, 6, 7};
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(logits[cells[i]], untouched[i], "cell %d", cells[i]);
    }
}

Test(kernels, lmhead_n_override_limits_rows) {
    tu_rng r = tu_rng_for("kernels.lmhead_n");
    uint16_t hidden[H], rows0[4 * H];
    tu_fill_bf16(&r, hidden, H);
    tu_fill_bf16(&r, rows0, 4 * H);
    uint32_t ids0[4] = {1, 2, 3, 4};
    uint64_t rows_t[1] = {P(rows0)}, ids_t[1] = {P(ids0)};
    uint32_t n_t[1] = {2}; /* only the first two rows count */
    float logits[8] = {-1, -2, -3, -4, -5, -6, -7, -8};
    tovl_lmhead_overlay_args a = {.logits = P(logits), .hidden = P(hidden), .row_slots = 0, .rows_table = P(rows_t),
                                  .ids_table = P(ids_t), .n_table = P(n_t), .ld = 8, .T = 1, .h = H, .vocab = 8,
                                  .max_loras = 1, .active_slot = 0, .max_n = 4};
    tovl_cpu_lmhead_overlay(&a, true);
    cr_assert_eq(logits[1], tovl_cpu_dot_bf16(hidden, rows0, H));
    cr_assert_eq(logits[2], tovl_cpu_dot_bf16(hidden, rows0 + H, H));
    cr_assert_eq(logits[3], -4.0f, "row k=2 is beyond n_override");
    cr_assert_eq(logits[4], -5.0f, "row k=3 is beyond n_override");
}

Test(kernels, rowdiff_bitwise_and_tolerance_rules) {
    enum { ROWS = 9, W = 3 };
    /* Each row differs in one way; expected flags for tol 0 and tol 0.1. */
    const uint16_t a[ROWS][W] = {
        {0x3F80, 0x4000, 0x4040}, /* 0 equal */
        {0x0000, 0x4000, 0x4040}, /* 1 +0 vs -0 */
        {0x3F80, 0x4000, 0x4040}, /* 2 NaN on one side */
        {0x7FC0, 0x4000, 0x4040}, /* 3 NaN both (other payload) */
        {0x3F80, 0x4000, 0x4040}, /* 4 1.0 vs 1.0078125: below 0.1 */
        {0x3F80, 0x4000, 0x4040}, /* 5 1.0 vs 1.5: above 0.1 */
        {0x7F80, 0x4000, 0x4040}, /* 6 Inf vs Inf */
        {0x7F80, 0x4000, 0x4040}, /* 7 Inf vs 2 */
        {0x3F80, 0x4000, 0x4040}, /* 8 1.0 vs 1.1 exactly tol: |d| > tol is false when |d| == tol */
    };
    uint16_t b[ROWS][W];
    memcpy(b, a, sizeof b);
    b[1][0] = 0x8000;
    b[2][1] = 0x7FC0;
    b[3][0] = 0xFFC1;
    b[4][0] = 0x3F81;
    b[5][0] = 0x3FC0;
    b[7][0] = 0x4000;
    b[8][0] = 0x3F8D; /* 1.1015625; tol below is set to exactly the difference */
    const uint32_t want0[ROWS] = {0, 1, 1, 1, 1, 1, 0, 1, 1};
    const uint32_t want_tol[ROWS] = {0, 0, 1, 0, 0, 1, 0, 1, 0};
    uint32_t flags[ROWS + 1];
    tovl_rowdiff_args args = {.a = P(a), .b = P(b), .flags = P(flags), .rows = ROWS, .h = W, .tol = 0.0f};
    flags[ROWS] = 0xDEADBEEF;
    tovl_cpu_rowdiff(&args);
    for (int i = 0; i < ROWS; i++) cr_assert_eq(flags[i], want0[i], "tol 0 row %d", i);
    args.tol = tovl_bf16_to_f32(0x3F8D) - 1.0f; /* 0.1015625 */
    tovl_cpu_rowdiff(&args);
    for (int i = 0; i < ROWS; i++) cr_assert_eq(flags[i], want_tol[i], "tol row %d", i);
    cr_assert_eq(flags[ROWS], 0xDEADBEEF, "sentinel after flags");
}
