/* The fixed dot order: 256 lanes, increasing i per lane, tree 128..1, no FMA.
 * These cases have bits that change under any other summation order, so a
 * port that sums otherwise cannot pass the conformance suite by luck. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "testutil.h"

/* The spec's order written another way (recursive tree over lanes). */
static float tree(const float *p, int lo, int n) {
    if (n == 1) return p[lo];
    /* level by level, as the spec: p[l] += p[l + stride] with stride = n/2 */
    float tmp[256];
    for (int l = 0; l < n; l++) tmp[l] = p[lo + l];
    for (int stride = n / 2; stride >= 1; stride /= 2)
        for (int l = 0; l < stride; l++) {
            volatile float s = tmp[l] + tmp[l + stride];
            tmp[l] = s;
        }
    return tmp[0];
}

static float lanes_dot(const uint16_t *x, const uint16_t *w, uint32_t h, int lanes) {
    float p[256] = {0};
    for (uint32_t i = 0; i < h; i++) {
        volatile float prod = tovl_bf16_to_f32(x[i]) * tovl_bf16_to_f32(w[i]);
        volatile float s = p[i % (uint32_t)lanes] + prod;
        p[i % (uint32_t)lanes] = s;
    }
    return tree(p, 0, lanes);
}

static float sequential_dot(const uint16_t *x, const uint16_t *w, uint32_t h) {
    float s = 0.0f;
    for (uint32_t i = 0; i < h; i++) {
        volatile float prod = tovl_bf16_to_f32(x[i]) * tovl_bf16_to_f32(w[i]);
        s = s + prod;
    }
    return s;
}

static uint32_t bits_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

Test(dot, matches_the_spec_and_no_other_order) {
    tu_rng r = tu_rng_for("dot.order");
    enum { H = 4096 };
    static uint16_t x[H], w[H];
    int differs_seq = 0, differs_128 = 0, differs_32 = 0;
    for (int trial = 0; trial < 50; trial++) {
        uint32_t h = 257 + tu_below(&r, H - 257);
        for (uint32_t i = 0; i < h; i++) {
            /* magnitudes over 2^-12..2^12 and both signs: rounding depends on order */
            float mx = ldexpf(1.0f + (float)tu_below(&r, 128) / 128.0f, (int)tu_below(&r, 25) - 12);
            float mw = ldexpf(1.0f + (float)tu_below(&r, 128) / 128.0f, (int)tu_below(&r, 25) - 12);
            x[i] = tovl_f32_to_bf16((tu_next(&r) & 1) ? -mx : mx);
            w[i] = tovl_f32_to_bf16(mw);
        }
        float got = tovl_cpu_dot_bf16(x, w, h);
        cr_assert_eq(bits_of(got), bits_of(lanes_dot(x, w, h, 256)), "h %u: not the 256-lane order", h);
        differs_seq += bits_of(got) != bits_of(sequential_dot(x, w, h));
        differs_128 += bits_of(got) != bits_of(lanes_dot(x, w, h, 128));
        differs_32 += bits_of(got) != bits_of(lanes_dot(x, w, h, 32));
    }
    /* The data must be order-sensitive, or the check above proves nothing. */
    cr_assert_gt(differs_seq, 15, "only %d of 50 dots differ from a sequential sum", differs_seq);
    cr_assert_gt(differs_128, 15, "only %d of 50 dots differ from 128 lanes", differs_128);
    cr_assert_gt(differs_32, 15, "only %d of 50 dots differ from 32 lanes", differs_32);
}

Test(dot, a_fixed_case_whose_bits_change_under_other_orders) {
    /* lane 0 gets 2^24 then +1 eight times (lost one by one when summed
     * sequentially with it, kept when summed in lanes first). */
    enum { H = 512 };
    uint16_t x[H], w[H];
    for (int i = 0; i < H; i++) {
        x[i] = 0x3F80; /* 1.0 */
        w[i] = 0x3F80;
    }
    w[0] = tovl_f32_to_bf16(16777216.0f); /* 2^24 */
    float spec = tovl_cpu_dot_bf16(x, w, H);
    float seq = sequential_dot(x, w, H);
    cr_assert_eq(bits_of(spec), bits_of(lanes_dot(x, w, H, 256)));
    cr_assert_neq(bits_of(spec), bits_of(seq), "sequential summation must differ here");
    cr_assert_eq(spec, 16777216.0f + 510.0f, "expected 2^24 + 510, got %f", (double)spec);
}

Test(dot, products_are_not_fused) {
    /* A bf16 x bf16 product is exact in f32 except below the normal range, so
     * only a subnormal tie can tell a fused multiply-add from mul-then-add:
     * lane 0 holds 2^-149, then adds 2^-74-ish * 2^-75 = 2^-150 (a tie).
     * Unfused: 2^-150 rounds to 0 (even), sum 2^-149. Fused: 1.5 * 2^-149
     * rounds to 2^-148. */
    enum { H = 257 };
    uint16_t xs[H], ws[H];
    for (int i = 0; i < H; i++) {
        xs[i] = 0;
        ws[i] = 0;
    }
    xs[0] = tovl_f32_to_bf16(ldexpf(1.0f, -74));
    ws[0] = tovl_f32_to_bf16(ldexpf(1.0f, -75));
    xs[256] = tovl_f32_to_bf16(ldexpf(1.0f, -75));
    ws[256] = tovl_f32_to_bf16(ldexpf(1.0f, -75));
    float p0 = tovl_bf16_to_f32(xs[0]) * tovl_bf16_to_f32(ws[0]);
    float fused = fmaf(tovl_bf16_to_f32(xs[256]), tovl_bf16_to_f32(ws[256]), p0);
    float got = tovl_cpu_dot_bf16(xs, ws, H);
    cr_assert_eq(got, ldexpf(1.0f, -149), "got %a", (double)got);
    cr_assert_eq(fused, ldexpf(1.0f, -148), "the data must separate fused from unfused (fused %a)", (double)fused);
}

Test(dot, short_rows_and_special_values) {
    uint16_t one = 0x3F80, inf = 0x7F80, ninf = 0xFF80, nan = 0x7FC1;
    cr_assert_eq(tovl_cpu_dot_bf16(&one, &one, 1), 1.0f);
    cr_assert_eq(bits_of(tovl_cpu_dot_bf16(&one, &one, 0)), 0u, "h 0 gives +0");
    uint16_t x[3] = {inf, ninf, one}, w[3] = {one, one, one};
    cr_assert(isnan(tovl_cpu_dot_bf16(x, w, 3)), "Inf + -Inf is NaN");
    cr_assert_eq(tovl_cpu_f32_out_bits(tovl_cpu_dot_bf16(&nan, &one, 1)), 0x7FC00000u, "canonical NaN out");
    uint16_t nz = 0x8000;
    cr_assert_eq(bits_of(tovl_cpu_dot_bf16(&nz, &one, 1)), 0u, "+0 + -0 = +0");
}

Test(dot, subnormal_results_are_preserved) {
    uint16_t x = tovl_f32_to_bf16(ldexpf(1.0f, -70)), w = tovl_f32_to_bf16(ldexpf(1.0f, -70));
    float got = tovl_cpu_dot_bf16(&x, &w, 1);
    cr_assert_eq(got, ldexpf(1.0f, -140), "2^-140 must not flush to zero");
    cr_assert(fpclassify(got) == FP_SUBNORMAL);
}
