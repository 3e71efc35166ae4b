/* The spec's bf16 conversions. */
#include <string.h>

#include "internal.h"

uint16_t tovl_f32_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return 0x7FC0u; /* canonical quiet NaN, as PyTorch converts */
    }
    /* Round to nearest, ties to even; overflow carries into Inf correctly. */
    uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)((bits + rounding) >> 16);
}

float tovl_bf16_to_f32(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}
