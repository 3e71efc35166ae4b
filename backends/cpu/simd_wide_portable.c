/* The 16-lane code (the AVX-512 file's arithmetic) in plain GNU C vectors for
 * the build's baseline target, so the tests check the 16-lane order on any
 * machine. Never chosen to run. */
#include <stdint.h>
#include <string.h>
#define SIMD_W 16
#define SIMD_OPS tovl_cpu_simd_wide_portable
#define SIMD_ID TOVL_CPU_SIMD_AVX512
#define SIMD_NAME "avx512-portable"

#include "simd_portable.h"
#include "simd_dot.inc"
