/* rowdiff: flags[r] = 1 when row r of a and b differ (bitwise for tol 0, else
 * |a - b| > tol or a NaN on one side only). */
#include <math.h>

#include "cpu_kernels.h"
#include "tovl/tovl.h"

uint32_t tovl_cpu_rows_differ(const uint16_t *a, const uint16_t *b, uint32_t h, float tol) {
    for (uint32_t i = 0; i < h; i++) {
        if (tol > 0.0f) {
            float fa = tovl_bf16_to_f32(a[i]);
            float fb = tovl_bf16_to_f32(b[i]);
            if (fabsf(fa - fb) > tol || isnan(fa) != isnan(fb)) {
                return 1;
            }
        } else if (a[i] != b[i]) {
            return 1;
        }
    }
    return 0;
}

void tovl_cpu_rowdiff(const tovl_rowdiff_args *args) {
    const uint16_t *a = TOVL_CPU_PTR(const uint16_t, args->a);
    const uint16_t *b = TOVL_CPU_PTR(const uint16_t, args->b);
    uint32_t *flags = TOVL_CPU_PTR(uint32_t, args->flags);
    for (uint32_t r = 0; r < args->rows; r++) {
        size_t off = (size_t)r * args->h;
        flags[r] = tovl_cpu_rows_differ(a + off, b + off, args->h, args->tol);
    }
}
