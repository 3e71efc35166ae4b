/* The spec's bf16 conversions: nearest-even, Inf, overflow, canonical NaN. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "testutil.h"

static float f32_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* An independent rounding: pick the nearer of the two bf16 neighbours in
 * double arithmetic, the even one on a tie. */
static uint16_t slow_round(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    uint16_t lo = (uint16_t)(bits >> 16);
    uint16_t hi = (uint16_t)(lo + 1);
    double dx = x, dlo = tovl_bf16_to_f32(lo);
    double dhi = (hi & 0x7F80) == 0x7F80 && (hi & 0x7F) == 0 ? copysign(INFINITY, x) : tovl_bf16_to_f32(hi);
    if ((hi & 0x7FFF) == 0x7F80) {
        /* the upper neighbour is Inf: it stands for 2^128 in round-to-nearest */
        dhi = copysign(ldexp(1.0, 128), x);
    }
    double elo = fabs(dx - dlo), ehi = fabs(dhi - dx);
    if (elo < ehi) return lo;
    if (ehi < elo) return hi;
    return (lo & 1) ? hi : lo;
}

Test(bf16, ties_round_to_even) {
    cr_assert_eq(tovl_f32_to_bf16(f32_of(0x3F808000u)), 0x3F80, "1.00390625 tie rounds down to even");
    cr_assert_eq(tovl_f32_to_bf16(f32_of(0x3F818000u)), 0x3F82, "tie rounds up to even");
    cr_assert_eq(tovl_f32_to_bf16(f32_of(0x3F808001u)), 0x3F81, "just above a tie rounds up");
    cr_assert_eq(tovl_f32_to_bf16(f32_of(0xBF818000u)), 0xBF82, "negative tie");
}

Test(bf16, infinities_overflow_and_zero) {
    cr_assert_eq(tovl_f32_to_bf16(INFINITY), 0x7F80);
    cr_assert_eq(tovl_f32_to_bf16(-INFINITY), 0xFF80);
    cr_assert_eq(tovl_f32_to_bf16(f32_of(0x7F7FFFFFu)), 0x7F80, "FLT_MAX rounds to Inf");
    cr_assert_eq(tovl_f32_to_bf16(f32_of(0x7F7F7FFFu)), 0x7F7F, "just below the overflow tie");
    cr_assert_eq(tovl_f32_to_bf16(-0.0f), 0x8000);
    cr_assert_eq(tovl_f32_to_bf16(0.0f), 0x0000);
    cr_assert_eq(tovl_f32_to_bf16(f32_of(0x00018000u)), 0x0002, "subnormal tie to even");
}

Test(bf16, every_nan_becomes_canonical) {
    const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7FBFFFFFu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        cr_assert_eq(tovl_f32_to_bf16(f32_of(nans[i])), 0x7FC0, "NaN 0x%08x", nans[i]);
    }
}

Test(bf16, every_pattern_round_trips) {
    for (uint32_t b = 0; b < 0x10000u; b++) {
        uint16_t back = tovl_f32_to_bf16(tovl_bf16_to_f32((uint16_t)b));
        bool nan = (b & 0x7FFF) > 0x7F80;
        cr_assert_eq(back, nan ? 0x7FC0 : b, "pattern 0x%04x came back as 0x%04x", b, back);
    }
}

Test(bf16, random_values_match_an_independent_rounding) {
    tu_rng r = tu_rng_for("bf16.random");
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)tu_next(&r);
        if ((bits & 0x7F800000u) == 0x7F800000u) {
            continue; /* Inf/NaN covered above */
        }
        if (i % 3 == 0) {
            bits = (bits & 0xFFFF0000u) | 0x8000u; /* force exact ties */
        }
        float x = f32_of(bits);
        cr_assert_eq(tovl_f32_to_bf16(x), slow_round(x), "0x%08x", bits);
    }
}
