/* The spec's dot order 4 lanes per vector: SSE2 (the x86-64 baseline), or the
 * compiler's 128-bit vectors elsewhere. */
#define SIMD_W 4
#define SIMD_OPS tovl_cpu_simd_sse2
#define SIMD_ID TOVL_CPU_SIMD_SSE2
#define SIMD_NAME "sse2"
#if defined(__SSE2__)
#include <emmintrin.h>
/* unpacklo(0, v) puts each of the 4 low bf16 in the high half of its lane. */
#define SIMD_LOAD_BF16(v, p)                                                                            \
    ((v) = (simd_vf)_mm_castsi128_ps(                                                                    \
         _mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)(const void *)(p)))))
#define SIMD_ANY(m) (_mm_movemask_ps((__m128)(m)) != 0)
#else
#include "simd_portable.h"
#endif
#include "simd_dot.inc"
