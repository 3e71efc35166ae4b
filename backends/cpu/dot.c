/* The fixed dot-product order that makes every backend give the same bits:
 * 256 logical lanes, lane i % 256 accumulates element i in increasing i, then a
 * pairwise tree 128, 64, ..., 1. Each product and each sum rounds to f32
 * (the file is compiled with -ffp-contract=off, so nothing fuses into an FMA). */
#include <string.h>

#include "cpu_kernels.h"
#include "tovl/tovl.h"

float tovl_cpu_dot_bf16(const uint16_t *x, const uint16_t *w, uint32_t h) {
    float p[TOVL_DOT_LANES];
    for (int l = 0; l < TOVL_DOT_LANES; l++) {
        p[l] = 0.0f;
    }
    for (uint32_t i = 0; i < h; i++) {
        float prod = tovl_bf16_to_f32(x[i]) * tovl_bf16_to_f32(w[i]);
        p[i % TOVL_DOT_LANES] = p[i % TOVL_DOT_LANES] + prod;
    }
    for (int stride = TOVL_DOT_LANES / 2; stride >= 1; stride /= 2) {
        for (int l = 0; l < stride; l++) {
            p[l] = p[l] + p[l + stride];
        }
    }
    return p[0];
}

uint32_t tovl_cpu_f32_out_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        bits = 0x7FC00000u;
    }
    return bits;
}
