/* Vector helpers in plain GNU C vectors, for any target: the compiler lowers
 * them to whatever registers it has. Included by a simd_*.c file after it
 * defines SIMD_W. */
#include <stdint.h>
#include <string.h>

typedef uint16_t simd_vh __attribute__((vector_size(SIMD_W * 2)));
typedef uint32_t simd_vu __attribute__((vector_size(SIMD_W * 4)));
#define SIMD_LOAD_BF16(v, p)                                                                                   \
    do {                                                                                                        \
        simd_vh h_;                                                                                             \
        memcpy(&h_, (p), sizeof h_);                                                                            \
        (v) = (simd_vf)(__builtin_convertvector(h_, simd_vu) << 16);                                            \
    } while (0)
static inline int simd_any(const int32_t *lanes) {
    int32_t any = 0;
    for (int l = 0; l < SIMD_W; l++) {
        any |= lanes[l];
    }
    return any != 0;
}
#define SIMD_ANY(m) simd_any((const int32_t *)&(m))
