/* Which vector width the CPU kernels run at: the widest this CPU has, or the
 * one TOVL_CPU_SIMD names; and the scalar "width", the reference loop. */
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "cpu_simd.h"
#include "tovl/backend.h"

extern const tovl_cpu_simd_ops tovl_cpu_simd_sse2, tovl_cpu_simd_wide_portable;
#ifdef TOVL_CPU_X86
extern const tovl_cpu_simd_ops tovl_cpu_simd_avx2, tovl_cpu_simd_avx512;
#endif

static void scalar_dot_tile(const uint16_t *const x[TOVL_CPU_TILE_X], uint32_t nx,
                            const uint16_t *const w[TOVL_CPU_TILE_W], uint32_t nw, uint32_t h, float *out) {
    for (uint32_t a = 0; a < nx; a++) {
        for (uint32_t b = 0; b < nw; b++) {
            out[a * TOVL_CPU_TILE_W + b] = tovl_cpu_dot_bf16(x[a], w[b], h);
        }
    }
}

static const tovl_cpu_simd_ops scalar_ops = {TOVL_CPU_SIMD_SCALAR, "scalar", 1, scalar_dot_tile,
                                             tovl_cpu_rows_differ};

const tovl_cpu_simd_ops *tovl_cpu_simd_ops_of(tovl_cpu_simd simd) {
    switch (simd) {
    case TOVL_CPU_SIMD_SCALAR: return &scalar_ops;
    case TOVL_CPU_SIMD_SSE2: return &tovl_cpu_simd_sse2;
#ifdef TOVL_CPU_X86
    case TOVL_CPU_SIMD_AVX2: return __builtin_cpu_supports("avx2") ? &tovl_cpu_simd_avx2 : NULL;
    case TOVL_CPU_SIMD_AVX512: return __builtin_cpu_supports("avx512f") ? &tovl_cpu_simd_avx512 : NULL;
#endif
    default: return NULL;
    }
}

const tovl_cpu_simd_ops *tovl_cpu_simd_ops_wide_portable(void) {
    return &tovl_cpu_simd_wide_portable;
}

static const char *const simd_names[TOVL_CPU_SIMD_COUNT] = {"scalar", "sse2", "avx2", "avx512"};

tovl_status tovl_cpu_simd_from_env(const tovl_cpu_simd_ops **out) {
    const char *want = getenv("TOVL_CPU_SIMD");
    if (want && *want) {
        for (int s = 0; s < TOVL_CPU_SIMD_COUNT; s++) {
            if (strcmp(want, simd_names[s]) == 0) {
                *out = tovl_cpu_simd_ops_of((tovl_cpu_simd)s);
                return *out ? TOVL_OK
                            : tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                                         "TOVL_CPU_SIMD=%s: this CPU or this build has no %s", want, want);
            }
        }
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "TOVL_CPU_SIMD=%s: expected scalar, sse2, avx2 or avx512",
                          want);
    }
    for (int s = TOVL_CPU_SIMD_COUNT - 1; s >= 0; s--) {
        if ((*out = tovl_cpu_simd_ops_of((tovl_cpu_simd)s)) != NULL) {
            return TOVL_OK;
        }
    }
    return tovl_error(TOVL_ERR_INTERNAL, "cpu: no dot kernel"); /* unreachable: scalar is always there */
}
