/* Core-internal declarations shared by the files of core/. Never installed. */
#ifndef TOVL_CORE_INTERNAL_H
#define TOVL_CORE_INTERNAL_H

#include "tovl/backend.h"

struct tovl_backend {
    const tovl_backend_iface *iface;
    void *ctx;
};

/* Launch through the vtable (checks the handle and the iface). */
tovl_status tovl_core_launch(tovl_backend *backend, tovl_kernel kernel, uint32_t gx, uint32_t gy,
                             const void *args, size_t args_size, void *stream);

/* Clear the calling thread's error detail. */
void tovl_clear_error(void);

#endif
