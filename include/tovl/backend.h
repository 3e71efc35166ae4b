/*
 * The backend-implementer interface. Users never need this header; backend
 * ports (backends/<name>/) and test wrappers do.
 *
 * A backend is a small, versioned vtable of function pointers plus an opaque
 * context (as ggml-backend and SQLite's sqlite3_vfs do). The core never sees a
 * vendor type: device memory is a u64 device pointer, a stream is void *, a
 * kernel is a u64 handle (0 = missing).
 *
 * Versioning: `iface_version` says which members exist. Members of version 1
 * are required unless marked optional (NULL allowed). A later version appends
 * members; the core reads them only when iface_version is high enough, so an
 * older backend keeps working. Version 2 added the stream-ordered writes and
 * fences that fixed-shape sets load their slots with (all optional).
 */
#ifndef TOVL_BACKEND_H
#define TOVL_BACKEND_H

#include "tovl.h"
#include "kernel_args.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOVL_BACKEND_IFACE_VERSION 2

/* One host-to-device copy of a write_async batch. */
typedef struct tovl_device_write {
    tovl_devptr dst;
    const void *src;
    size_t bytes;
} tovl_device_write;

/* A marker of a stream's progress (fence_record); 0 is never a live fence. */
typedef uint64_t tovl_fence;

/* Device-side timings of one kernel, for the bench tool (never for tests). */
typedef struct tovl_kernel_timing {
    double batched_us; /* median per-launch time of `batch` back-to-back launches
                          recorded once and replayed (a CUDA/HIP graph, one Vulkan
                          command buffer): what an engine pays */
    double single_us;  /* median time of one launch between two timestamps on
                          the device (events/timestamp queries; includes their
                          overhead) */
    uint32_t repeats;  /* how many samples each median is over */
} tovl_kernel_timing;

typedef struct tovl_backend_iface {
    uint32_t iface_version; /* TOVL_BACKEND_IFACE_VERSION this backend was written for */
    const char *name;       /* "cpu", "cuda", "hip", "vulkan", or a wrapper's name */

    /* Release the context and everything it owns. */
    void (*destroy)(void *ctx);
    /* A short device description ("NVIDIA H200 (sm_90, driver 580.159)"). */
    const char *(*device)(void *ctx);
    /* Optional: backend facts by key (see tovl_backend_property), NULL if unknown. */
    const char *(*property)(void *ctx, const char *key);

    /* Device memory. alloc of 0 bytes is never requested by the core. */
    tovl_status (*alloc)(void *ctx, size_t bytes, tovl_devptr *out);
    void (*free)(void *ctx, tovl_devptr ptr);
    tovl_status (*upload)(void *ctx, tovl_devptr dst, const void *src, size_t bytes);
    tovl_status (*download)(void *ctx, void *dst, tovl_devptr src, size_t bytes);
    /* Fill `bytes` (a multiple of 4, dst 4-byte aligned) with a 32-bit pattern. */
    tovl_status (*fill_u32)(void *ctx, tovl_devptr dst, uint32_t pattern, size_t bytes);

    /* Kernel lookup by name; 0 when this backend has no such kernel. */
    tovl_kernel (*try_kernel)(void *ctx, const char *name);
    /* Enqueue `kernel` over the logical grid (see kernel_args.h) with the
     * kernel's argument struct. Never allocates or synchronizes. */
    tovl_status (*launch)(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                          size_t args_size, void *stream);
    /* Wait until all work on `stream` (NULL = own) is done. */
    tovl_status (*synchronize)(void *ctx, void *stream);

    /* Optional (NULL allowed): time `kernel` on the device with the backend's
     * own clock (see tovl_kernel_timing); `batch` launches per replay, medians
     * over `repeats` replays. The data the args point at must stay valid. */
    tovl_status (*time_kernel)(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                               size_t args_size, uint32_t batch, uint32_t repeats, tovl_kernel_timing *out);
    /* Optional: device-to-device copy bandwidth over `bytes` bytes, in GB/s
     * counting bytes read plus bytes written (median of `repeats`). */
    tovl_status (*copy_bandwidth)(void *ctx, size_t bytes, uint32_t repeats, double *gbps);

    /* Version 2, all optional. */
    /* Enqueue `count` host-to-device copies on `stream` (NULL = own) as one
     * step: every launch enqueued before it sees none of them, every launch
     * enqueued after sees all of them, and no launch sees a part. The host
     * bytes may be reused once it returns; it never waits for the device
     * (the CPU backend, whose launches run at the call, takes the lock its
     * launches hold). NULL: the core synchronizes the stream and uploads. */
    tovl_status (*write_async)(void *ctx, const tovl_device_write *writes, uint32_t count, void *stream);
    /* A fence after the work enqueued on `stream` so far. NULL: the backend's
     * work is finished when its call returns, so nothing needs a fence. */
    tovl_status (*fence_record)(void *ctx, void *stream, tovl_fence *out);
    /* Whether the device has passed `fence`; never waits. */
    tovl_status (*fence_query)(void *ctx, tovl_fence fence, bool *passed);
    void (*fence_destroy)(void *ctx, tovl_fence fence);
} tovl_backend_iface;

/* Wrap an interface and its context into a tovl_backend (takes ownership of
 * ctx: iface->destroy(ctx) runs at tovl_backend_close, and also here when this
 * fails). Used by backend openers and by wrapping backends in tests. */
TOVL_API tovl_status tovl_backend_create(const tovl_backend_iface *iface, void *ctx, tovl_backend **out);
TOVL_API const tovl_backend_iface *tovl_backend_get_iface(const tovl_backend *backend);
TOVL_API void *tovl_backend_get_context(const tovl_backend *backend);

/* Set the calling thread's error detail (printf format) and return `status`,
 * so a port can write `return tovl_error(TOVL_ERR_DEVICE, "cuMemAlloc: %s", s);` */
TOVL_API tovl_status tovl_error(tovl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The median of `n` >= 1 samples, sorting `values` in place: what the
 * benchmark members (time_kernel, copy_bandwidth) report, in every port. */
TOVL_API double tovl_median(double *values, uint32_t n);

/* A backend opener, one per backend compiled in, exported by each port as
 * `tovl_<name>_backend_factory`. When the backend cannot run on this machine,
 * open returns TOVL_ERR_BACKEND_UNAVAILABLE with a one-line reason as the error
 * detail ("libcuda.so.1 not found"), prints nothing and leaks nothing. */
typedef struct tovl_backend_factory {
    const char *name;
    tovl_status (*open)(tovl_backend **out);
} tovl_backend_factory;

#ifdef __cplusplus
}
#endif
#endif /* TOVL_BACKEND_H */
