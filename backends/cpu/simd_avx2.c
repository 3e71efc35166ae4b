/* The spec's dot order 8 lanes per vector (AVX2; built with -mavx2 and without
 * -mfma, so no fused multiply-add can appear). Chosen only when the CPU has AVX2. */
#define SIMD_W 8
#define SIMD_OPS tovl_cpu_simd_avx2
#define SIMD_ID TOVL_CPU_SIMD_AVX2
#define SIMD_NAME "avx2"
#include <immintrin.h>
#define SIMD_LOAD_BF16(v, p)                                                                                   \
    ((v) = (simd_vf)_mm256_castsi256_ps(                                                                        \
         _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16)))
#define SIMD_ANY(m) (_mm256_movemask_ps((__m256)(m)) != 0)
#include "simd_dot.inc"
