/* The HIP kernels' code-object bundle embedded in the library (one code object
 * per gfx target, built from token_overlay.hip), and what it was built for.
 * Generated at build time (backends/hip/CMakeLists.txt). */
#ifndef TOVL_HIP_BUNDLE_H
#define TOVL_HIP_BUNDLE_H

#include <stddef.h>

extern const unsigned char tovl_hip_bundle[];
extern const size_t tovl_hip_bundle_size;

/* The gfx targets in the bundle, space-separated ("gfx908 gfx90a ..."). */
extern const char tovl_hip_bundle_targets[];

#endif
