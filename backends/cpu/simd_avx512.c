/* The spec's dot order 16 lanes per vector (AVX-512F; built with -mavx512f,
 * which also enables FMA instructions: -ffp-contract=off keeps every multiply
 * and add apart). Chosen only when the CPU has AVX-512F. */
#define SIMD_W 16
#define SIMD_OPS tovl_cpu_simd_avx512
#define SIMD_ID TOVL_CPU_SIMD_AVX512
#define SIMD_NAME "avx512"
#include <immintrin.h>
#define SIMD_LOAD_BF16(v, p)                                                                                      \
    ((v) = (simd_vf)_mm512_castsi512_ps(                                                                           \
         _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16)))
#define SIMD_ANY(m) (_mm512_test_epi32_mask((__m512i)(m), (__m512i)(m)) != 0)
#include "simd_dot.inc"
