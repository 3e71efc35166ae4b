/*
 * HIP backend extras. Needs no HIP header: the HIP runtime is loaded at run
 * time. Present when tovl was built with the HIP backend (tovl_backend_list
 * says "compiled"); "hip" in tovl_backend_open uses TOVL_HIP_DEVICE instead.
 *
 * Streams: the hooks take a hipStream_t as their `void *stream` (NULL = the
 * device's null stream). Device pointers are hipMalloc'd addresses.
 */
#ifndef TOVL_TOVL_HIP_H
#define TOVL_TOVL_HIP_H

#include "tovl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open the HIP backend on HIP device index `device` (the ordinal hipSetDevice
 * takes), e.g. the device an engine already uses. TOVL_ERR_INVALID_ARGUMENT for
 * a negative index; TOVL_ERR_BACKEND_UNAVAILABLE (with the reason) when the
 * runtime, the device, or a code object for its gfx target is missing. */
TOVL_API tovl_status tovl_hip_backend_open_device(int device, tovl_backend **out);

#ifdef __cplusplus
}
#endif
#endif /* TOVL_TOVL_HIP_H */
