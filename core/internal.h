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

/* Stream-ordered table writes (tovl_backend_iface.write_async). A version-1
 * backend, or one without write_async, waits for the stream and uploads.
 * *settled: every launch enqueued on the stream before the write has
 * finished, so what the old contents pointed at may be freed now. */
tovl_status tovl_core_write(tovl_backend *backend, const tovl_device_write *writes, uint32_t count, void *stream,
                            bool *settled);
/* A fence after the work on `stream` so far: 0 when the backend has no fences
 * (its work is done at the call; a version-1 backend: the stream is
 * synchronized here). */
tovl_status tovl_core_fence_record(tovl_backend *backend, void *stream, tovl_fence *out);
/* Fence 0 has always passed. */
tovl_status tovl_core_fence_query(tovl_backend *backend, tovl_fence fence, bool *passed);
void tovl_core_fence_destroy(tovl_backend *backend, tovl_fence fence);

/* Clear the calling thread's error detail. */
void tovl_clear_error(void);

#endif
