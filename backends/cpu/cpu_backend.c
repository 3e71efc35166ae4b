/* The CPU reference backend: host memory as "device" memory (a device pointer
 * is a host address), the reference kernels run synchronously at launch. It is
 * the oracle for every GPU port and the default where no GPU exists. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "tovl/backend.h"

typedef enum cpu_kernel_id {
    CPU_ROWDIFF = 1,
    CPU_EMBED_OVERLAY,
    CPU_LMHEAD_BF16,
    CPU_LMHEAD_F32,
} cpu_kernel_id;

static const struct {
    const char *name;
    cpu_kernel_id id;
    size_t args_size;
} cpu_kernels[] = {
    {TOVL_KERNEL_ROWDIFF, CPU_ROWDIFF, sizeof(tovl_rowdiff_args)},
    {TOVL_KERNEL_EMBED_OVERLAY, CPU_EMBED_OVERLAY, sizeof(tovl_embed_overlay_args)},
    {TOVL_KERNEL_LMHEAD_OVERLAY_BF16, CPU_LMHEAD_BF16, sizeof(tovl_lmhead_overlay_args)},
    {TOVL_KERNEL_LMHEAD_OVERLAY_F32, CPU_LMHEAD_F32, sizeof(tovl_lmhead_overlay_args)},
};
#define CPU_KERNEL_COUNT (sizeof cpu_kernels / sizeof cpu_kernels[0])

static void cpu_destroy(void *ctx) {
    (void)ctx;
}

static const char *cpu_device(void *ctx) {
    (void)ctx;
    return "host CPU (reference kernels, plain C)";
}

static const char *cpu_property(void *ctx, const char *key) {
    (void)ctx;
    if (strcmp(key, "f32_denormals") == 0) {
        return "preserved";
    }
    if (strcmp(key, "subgroup_size") == 0) {
        return "1";
    }
    return NULL;
}

static tovl_status cpu_alloc(void *ctx, size_t bytes, tovl_devptr *out) {
    (void)ctx;
    /* 64-byte alignment like a GPU allocator, so alignment bugs show up alike. */
    size_t rounded = (bytes + 63u) & ~(size_t)63u;
    void *p = aligned_alloc(64, rounded);
    if (!p) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cpu: out of host memory allocating %zu bytes", bytes);
    }
    *out = (tovl_devptr)(uintptr_t)p;
    return TOVL_OK;
}

static void cpu_free(void *ctx, tovl_devptr ptr) {
    (void)ctx;
    free((void *)(uintptr_t)ptr);
}

static tovl_status cpu_upload(void *ctx, tovl_devptr dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return TOVL_OK;
}

static tovl_status cpu_download(void *ctx, void *dst, tovl_devptr src, size_t bytes) {
    (void)ctx;
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return TOVL_OK;
}

static tovl_status cpu_fill_u32(void *ctx, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    (void)ctx;
    uint32_t *p = (uint32_t *)(uintptr_t)dst;
    for (size_t i = 0; i < bytes / 4; i++) {
        p[i] = pattern;
    }
    return TOVL_OK;
}

static tovl_kernel cpu_try_kernel(void *ctx, const char *name) {
    (void)ctx;
    for (size_t i = 0; i < CPU_KERNEL_COUNT; i++) {
        if (strcmp(name, cpu_kernels[i].name) == 0) {
            return (tovl_kernel)cpu_kernels[i].id;
        }
    }
    return 0;
}

static tovl_status cpu_launch(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                              size_t args_size, void *stream) {
    (void)ctx;
    (void)stream;
    (void)grid; /* the reference kernels walk the whole logical grid from args */
    if (kernel == 0 || kernel > CPU_KERNEL_COUNT) {
        return tovl_error(TOVL_ERR_LAUNCH, "cpu: launch of unknown kernel handle %llu", (unsigned long long)kernel);
    }
    if (!args || args_size != cpu_kernels[kernel - 1].args_size) {
        return tovl_error(TOVL_ERR_LAUNCH, "cpu: kernel %s expects %zu bytes of arguments, got %zu",
                          cpu_kernels[kernel - 1].name, cpu_kernels[kernel - 1].args_size, args_size);
    }
    switch ((cpu_kernel_id)kernel) {
    case CPU_ROWDIFF: tovl_cpu_rowdiff(args); break;
    case CPU_EMBED_OVERLAY: tovl_cpu_embed_overlay(args); break;
    case CPU_LMHEAD_BF16: tovl_cpu_lmhead_overlay(args, false); break;
    case CPU_LMHEAD_F32: tovl_cpu_lmhead_overlay(args, true); break;
    }
    return TOVL_OK;
}

static tovl_status cpu_synchronize(void *ctx, void *stream) {
    (void)ctx;
    (void)stream;
    return TOVL_OK;
}

static const tovl_backend_iface cpu_iface = {
    .iface_version = TOVL_BACKEND_IFACE_VERSION,
    .name = "cpu",
    .destroy = cpu_destroy,
    .device = cpu_device,
    .property = cpu_property,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .fill_u32 = cpu_fill_u32,
    .try_kernel = cpu_try_kernel,
    .launch = cpu_launch,
    .synchronize = cpu_synchronize,
};

static tovl_status cpu_open(tovl_backend **out) {
    return tovl_backend_create(&cpu_iface, NULL, out);
}

const tovl_backend_factory tovl_cpu_backend_factory = {"cpu", cpu_open};
