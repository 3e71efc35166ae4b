/* Backend registry, opening by name, and the thin wrappers over the vtable. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "internal.h"
#include "tovl_config.h"

extern const tovl_backend_factory tovl_cpu_backend_factory;
#if TOVL_HAVE_CUDA
extern const tovl_backend_factory tovl_cuda_backend_factory;
#endif
#if TOVL_HAVE_HIP
extern const tovl_backend_factory tovl_hip_backend_factory;
#endif
#if TOVL_HAVE_VULKAN
extern const tovl_backend_factory tovl_vulkan_backend_factory;
#endif

/* Every backend tovl knows, in "auto" preference order. A backend not compiled
 * in keeps the configure step's reason. */
typedef struct registry_entry {
    const char *name;
    const tovl_backend_factory *factory; /* NULL: not compiled in */
    const char *not_built_reason;
} registry_entry;

static const registry_entry registry[] = {
#if TOVL_HAVE_CUDA
    {"cuda", &tovl_cuda_backend_factory, ""},
#else
    {"cuda", NULL, TOVL_CUDA_REASON},
#endif
#if TOVL_HAVE_HIP
    {"hip", &tovl_hip_backend_factory, ""},
#else
    {"hip", NULL, TOVL_HIP_REASON},
#endif
#if TOVL_HAVE_VULKAN
    {"vulkan", &tovl_vulkan_backend_factory, ""},
#else
    {"vulkan", NULL, TOVL_VULKAN_REASON},
#endif
    {"cpu", &tovl_cpu_backend_factory, ""},
};
#define REGISTRY_SIZE (sizeof registry / sizeof registry[0])

static tovl_status open_entry(const registry_entry *e, tovl_backend **out) {
    if (!e->factory) {
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "%s backend not built: %s", e->name,
                          e->not_built_reason);
    }
    return e->factory->open(out);
}

tovl_status tovl_backend_open(const char *name, tovl_backend **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_backend_open: out is NULL");
    }
    *out = NULL;
    if (!name) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_backend_open: name is NULL");
    }
    if (strcmp(name, "auto") == 0) {
        for (size_t i = 0; i < REGISTRY_SIZE; i++) {
            if (open_entry(&registry[i], out) == TOVL_OK) {
                tovl_clear_error();
                return TOVL_OK;
            }
        }
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "no backend could be opened");
    }
    for (size_t i = 0; i < REGISTRY_SIZE; i++) {
        if (strcmp(name, registry[i].name) == 0) {
            tovl_status st = open_entry(&registry[i], out);
            if (st == TOVL_OK) {
                tovl_clear_error();
            }
            return st;
        }
    }
    return tovl_error(TOVL_ERR_UNKNOWN_BACKEND,
                      "unknown backend '%s' (known: cuda, hip, vulkan, cpu, auto)", name);
}

size_t tovl_backend_list(tovl_backend_info *out, size_t capacity) {
    for (size_t i = 0; i < REGISTRY_SIZE && i < capacity; i++) {
        tovl_backend_info *info = &out[i];
        memset(info, 0, sizeof *info);
        info->name = registry[i].name;
        info->compiled = registry[i].factory != NULL;
        tovl_backend *be = NULL;
        if (open_entry(&registry[i], &be) == TOVL_OK) {
            info->available = true;
            snprintf(info->device, sizeof info->device, "%s", tovl_backend_device(be));
            tovl_backend_close(be);
        } else {
            snprintf(info->reason, sizeof info->reason, "%s", tovl_last_error());
        }
    }
    tovl_clear_error();
    return REGISTRY_SIZE;
}

static int compare_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tovl_median(double *values, uint32_t n) {
    qsort(values, n, sizeof *values, compare_double);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

tovl_status tovl_backend_create(const tovl_backend_iface *iface, void *ctx, tovl_backend **out) {
    if (!out || !iface) {
        if (iface && iface->destroy) {
            iface->destroy(ctx);
        }
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_backend_create: iface or out is NULL");
    }
    *out = NULL;
    if (iface->iface_version < 1 || !iface->name || !iface->destroy || !iface->device || !iface->alloc ||
        !iface->free || !iface->upload || !iface->download || !iface->fill_u32 || !iface->try_kernel ||
        !iface->launch || !iface->synchronize) {
        if (iface->destroy) {
            iface->destroy(ctx);
        }
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "tovl_backend_create: backend '%s' lacks a required vtable member",
                          iface->name ? iface->name : "?");
    }
    if (iface->iface_version >= 2 && iface->fence_record && (!iface->fence_query || !iface->fence_destroy)) {
        iface->destroy(ctx);
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "tovl_backend_create: backend '%s' has fence_record without fence_query and fence_destroy",
                          iface->name);
    }
    tovl_backend *be = calloc(1, sizeof *be);
    if (!be) {
        iface->destroy(ctx);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "tovl_backend_create: out of host memory");
    }
    be->iface = iface;
    be->ctx = ctx;
    *out = be;
    return TOVL_OK;
}

void tovl_backend_close(tovl_backend *backend) {
    if (!backend) {
        return;
    }
    backend->iface->destroy(backend->ctx);
    free(backend);
}

const tovl_backend_iface *tovl_backend_get_iface(const tovl_backend *backend) {
    return backend ? backend->iface : NULL;
}

void *tovl_backend_get_context(const tovl_backend *backend) {
    return backend ? backend->ctx : NULL;
}

const char *tovl_backend_name(const tovl_backend *backend) {
    return backend ? backend->iface->name : "(null)";
}

const char *tovl_backend_device(const tovl_backend *backend) {
    return backend ? backend->iface->device(backend->ctx) : "(null)";
}

const char *tovl_backend_property(const tovl_backend *backend, const char *key) {
    if (!backend || !key || !backend->iface->property) {
        return NULL;
    }
    return backend->iface->property(backend->ctx, key);
}

tovl_status tovl_alloc(tovl_backend *backend, size_t bytes, tovl_devptr *out) {
    if (!backend || !out || bytes == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_alloc: backend/out NULL or 0 bytes");
    }
    *out = 0;
    return backend->iface->alloc(backend->ctx, bytes, out);
}

void tovl_free(tovl_backend *backend, tovl_devptr ptr) {
    if (backend && ptr) {
        backend->iface->free(backend->ctx, ptr);
    }
}

tovl_status tovl_upload(tovl_backend *backend, tovl_devptr dst, const void *src, size_t bytes) {
    if (!backend || (bytes && (!dst || !src))) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_upload: NULL backend, dst or src");
    }
    return bytes ? backend->iface->upload(backend->ctx, dst, src, bytes) : TOVL_OK;
}

tovl_status tovl_download(tovl_backend *backend, void *dst, tovl_devptr src, size_t bytes) {
    if (!backend || (bytes && (!dst || !src))) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_download: NULL backend, dst or src");
    }
    return bytes ? backend->iface->download(backend->ctx, dst, src, bytes) : TOVL_OK;
}

tovl_status tovl_fill_u32(tovl_backend *backend, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    if (!backend || (bytes && !dst) || bytes % 4 != 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "tovl_fill_u32: NULL backend or dst, or %zu bytes is not a multiple of 4", bytes);
    }
    return bytes ? backend->iface->fill_u32(backend->ctx, dst, pattern, bytes) : TOVL_OK;
}

tovl_status tovl_synchronize(tovl_backend *backend, void *stream) {
    if (!backend) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_synchronize: backend is NULL");
    }
    return backend->iface->synchronize(backend->ctx, stream);
}

tovl_kernel tovl_try_kernel(tovl_backend *backend, const char *name) {
    if (!backend || !name) {
        return 0;
    }
    return backend->iface->try_kernel(backend->ctx, name);
}

tovl_overlay_kernels tovl_overlay_kernels_resolve(tovl_backend *backend) {
    tovl_overlay_kernels k = TOVL_OVERLAY_KERNELS_NONE;
    k.rowdiff = tovl_try_kernel(backend, TOVL_KERNEL_ROWDIFF);
    k.embed_overlay = tovl_try_kernel(backend, TOVL_KERNEL_EMBED_OVERLAY);
    k.lmhead_overlay_bf16 = tovl_try_kernel(backend, TOVL_KERNEL_LMHEAD_OVERLAY_BF16);
    k.lmhead_overlay_f32 = tovl_try_kernel(backend, TOVL_KERNEL_LMHEAD_OVERLAY_F32);
    return k;
}

tovl_status tovl_core_launch(tovl_backend *backend, tovl_kernel kernel, uint32_t gx, uint32_t gy,
                             const void *args, size_t args_size, void *stream) {
    const uint32_t grid[3] = {gx, gy, 1};
    return backend->iface->launch(backend->ctx, kernel, grid, args, args_size, stream);
}

static bool has_v2(const tovl_backend *backend) {
    return backend->iface->iface_version >= 2;
}

tovl_status tovl_core_write(tovl_backend *backend, const tovl_device_write *writes, uint32_t count, void *stream,
                            bool *settled) {
    const tovl_backend_iface *f = backend->iface;
    if (has_v2(backend) && f->write_async) {
        tovl_status st = f->write_async(backend->ctx, writes, count, stream);
        *settled = st == TOVL_OK && !f->fence_record;
        return st;
    }
    /* A version-1 backend: wait for the stream, then write synchronously. */
    *settled = false;
    tovl_status st = f->synchronize(backend->ctx, stream);
    for (uint32_t i = 0; st == TOVL_OK && i < count; i++) {
        st = f->upload(backend->ctx, writes[i].dst, writes[i].src, writes[i].bytes);
    }
    *settled = st == TOVL_OK;
    return st;
}

tovl_status tovl_core_fence_record(tovl_backend *backend, void *stream, tovl_fence *out) {
    *out = 0;
    const tovl_backend_iface *f = backend->iface;
    if (has_v2(backend) && f->fence_record) {
        return f->fence_record(backend->ctx, stream, out);
    }
    return f->synchronize(backend->ctx, stream);
}

tovl_status tovl_core_fence_query(tovl_backend *backend, tovl_fence fence, bool *passed) {
    *passed = true;
    return fence ? backend->iface->fence_query(backend->ctx, fence, passed) : TOVL_OK;
}

void tovl_core_fence_destroy(tovl_backend *backend, tovl_fence fence) {
    if (fence) {
        backend->iface->fence_destroy(backend->ctx, fence);
    }
}
