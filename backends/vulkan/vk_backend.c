/* The Vulkan backend's vtable: open (own instance and device) or wrap (the
 * caller's), destroy, device description and properties. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tovl/tovl_vulkan.h"
#include "vk_internal.h"

void tovl_vk_ctx_destroy(vk_ctx *ctx) {
    if (!ctx) {
        return;
    }
    if (ctx->device) {
        /* Our own submissions always wait; this covers a failed one. */
        if (ctx->queue) {
            ctx->vk.vkQueueWaitIdle(ctx->queue);
        }
        tovl_vk_kernels_release(ctx);
        tovl_vk_memory_release(ctx);
        if (ctx->owns_device) {
            ctx->vk.vkDestroyDevice(ctx->device, NULL);
        }
    }
    if (ctx->instance && ctx->owns_instance) {
        if (ctx->messenger) {
            ctx->destroy_messenger(ctx->instance, ctx->messenger, NULL);
        }
        vkDestroyInstance(ctx->instance, NULL);
    }
    if (ctx->loader) {
        dlclose(ctx->loader);
    }
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

static void vk_destroy(void *ctx) {
    tovl_vk_ctx_destroy(ctx);
}

static const char *vk_device(void *vctx) {
    return ((vk_ctx *)vctx)->device_text;
}

static const char *vk_property(void *vctx, const char *key) {
    vk_ctx *ctx = vctx;
    if (strcmp(key, "subgroup_size") == 0) {
        return ctx->subgroup_text;
    }
    if (strcmp(key, "f32_denormals") == 0) {
        return ctx->denormals_text;
    }
    if (strcmp(key, "driver") == 0) {
        return ctx->driver_text;
    }
    if (strcmp(key, "float_controls") == 0) {
        return ctx->float_controls_text;
    }
    if (strcmp(key, "api_version") == 0) {
        return ctx->api_text;
    }
    if (strcmp(key, "lmhead_variant") == 0) {
        return tovl_vk_lmhead_choice_text(ctx);
    }
    if (strcmp(key, "validation") == 0) {
        return ctx->validation ? "on" : "off";
    }
    if (strcmp(key, "validation_messages") == 0) {
        /* Warnings and errors of the validation layer so far (0 when off). */
        snprintf(ctx->validation_text, sizeof ctx->validation_text, "%u",
                 atomic_load(&ctx->validation_messages));
        return ctx->validation_text;
    }
    return NULL;
}

static tovl_status vk_synchronize(void *vctx, void *stream) {
    (void)vctx;
    if (stream) {
        return tovl_error(TOVL_ERR_UNSUPPORTED,
                          "vulkan: a VkCommandBuffer is submitted by its owner; wait on your own fence");
    }
    return TOVL_OK; /* our own submissions have already been waited for */
}

/* The vtable members that use the own command buffer, the staging buffer or
 * the allocation list run under ctx->lock. */
#define VK_LOCKED(call)                                                                                          \
    do {                                                                                                         \
        vk_ctx *locked_ctx = vctx;                                                                               \
        pthread_mutex_lock(&locked_ctx->lock);                                                                   \
        tovl_status locked_st = (call);                                                                          \
        pthread_mutex_unlock(&locked_ctx->lock);                                                                 \
        return locked_st;                                                                                        \
    } while (0)

static tovl_status vk_alloc(void *vctx, size_t bytes, tovl_devptr *out) {
    VK_LOCKED(tovl_vk_alloc(vctx, bytes, out));
}

static void vk_free(void *vctx, tovl_devptr ptr) {
    vk_ctx *ctx = vctx;
    pthread_mutex_lock(&ctx->lock);
    tovl_vk_free(vctx, ptr);
    pthread_mutex_unlock(&ctx->lock);
}

static tovl_status vk_upload(void *vctx, tovl_devptr dst, const void *src, size_t bytes) {
    VK_LOCKED(tovl_vk_upload(vctx, dst, src, bytes));
}

static tovl_status vk_download(void *vctx, void *dst, tovl_devptr src, size_t bytes) {
    VK_LOCKED(tovl_vk_download(vctx, dst, src, bytes));
}

static tovl_status vk_fill_u32(void *vctx, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    VK_LOCKED(tovl_vk_fill_u32(vctx, dst, pattern, bytes));
}

static tovl_status vk_launch(void *vctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                             size_t args_size, void *stream) {
    VK_LOCKED(tovl_vk_launch(vctx, kernel, grid, args, args_size, stream));
}

static tovl_status vk_write_async(void *vctx, const tovl_device_write *writes, uint32_t count, void *stream) {
    VK_LOCKED(tovl_vk_write_async(vctx, writes, count, stream));
}

static tovl_status vk_time_kernel(void *vctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                                  size_t args_size, uint32_t batch, uint32_t repeats, tovl_kernel_timing *out) {
    VK_LOCKED(tovl_vk_time_kernel(vctx, kernel, grid, args, args_size, batch, repeats, out));
}

static tovl_status vk_copy_bandwidth(void *vctx, size_t bytes, uint32_t repeats, double *gbps) {
    VK_LOCKED(tovl_vk_copy_bandwidth(vctx, bytes, repeats, gbps));
}

static const tovl_backend_iface vk_iface = {
    .iface_version = TOVL_BACKEND_IFACE_VERSION,
    .name = "vulkan",
    .destroy = vk_destroy,
    .device = vk_device,
    .property = vk_property,
    .alloc = vk_alloc,
    .free = vk_free,
    .upload = vk_upload,
    .download = vk_download,
    .fill_u32 = vk_fill_u32,
    .try_kernel = tovl_vk_try_kernel,
    .launch = vk_launch,
    .synchronize = vk_synchronize,
    .time_kernel = vk_time_kernel,
    .copy_bandwidth = vk_copy_bandwidth,
    .write_async = vk_write_async,
    .fence_record = tovl_vk_fence_record,
    .fence_query = tovl_vk_fence_query,
    .fence_destroy = tovl_vk_fence_destroy,
};

/* Load the Vulkan loader (or use the caller's entry point) into volk. */
static tovl_status load_loader(vk_ctx *ctx, tovl_vk_get_instance_proc_addr given) {
    PFN_vkGetInstanceProcAddr gipa;
    if (given) {
        gipa = (PFN_vkGetInstanceProcAddr)given;
    } else {
        ctx->loader = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!ctx->loader) {
            const char *why = dlerror();
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: libvulkan.so.1 not found: %s",
                              why ? why : "dlopen failed");
        }
        /* POSIX guarantees dlsym's object pointer converts to a function pointer. */
        void *sym = dlsym(ctx->loader, "vkGetInstanceProcAddr");
        if (!sym) {
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: libvulkan.so.1 has no vkGetInstanceProcAddr");
        }
        memcpy(&gipa, &sym, sizeof gipa);
    }
    volkInitializeCustom(gipa);
    return TOVL_OK;
}

/* Everything after the device exists: queue, pools, staging, pipelines. */
/* Takes ownership of ctx: on failure it is destroyed here. */
static tovl_status finish_open(vk_ctx *ctx, uint32_t queue_index, tovl_backend **out) {
    ctx->vk.vkGetDeviceQueue(ctx->device, ctx->queue_family, queue_index, &ctx->queue);
    if (!ctx->queue) {
        tovl_vk_ctx_destroy(ctx);
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: no queue %u in family %u", queue_index,
                          ctx->queue_family);
    }
    tovl_vk_describe_device(ctx);
    /* TOVL_VULKAN_LMHEAD: which lm_head variant runs (for measurements). */
    const char *lmhead = getenv("TOVL_VULKAN_LMHEAD");
    tovl_status st = TOVL_OK;
    if (!lmhead || !*lmhead) {
        ctx->lmhead_choice = VK_LMHEAD_AUTO;
    } else if (strcmp(lmhead, "row") == 0) {
        ctx->lmhead_choice = VK_LMHEAD_ROW;
    } else if (strcmp(lmhead, "tile") == 0) {
        ctx->lmhead_choice = VK_LMHEAD_TILE;
    } else {
        st = tovl_error(TOVL_ERR_INVALID_ARGUMENT, "vulkan: TOVL_VULKAN_LMHEAD='%.32s': expected row, tile or unset",
                        lmhead);
    }
    if (st == TOVL_OK) {
        st = tovl_vk_memory_init(ctx);
    }
    if (st == TOVL_OK) {
        st = tovl_vk_kernels_init(ctx);
    }
    if (st == TOVL_OK && !ctx->float_controls.denorm_preserve && ctx->pipelines[VK_PIPELINE_LMHEAD_F32_ROW]) {
        bool preserved = false;
        st = tovl_vk_probe_denormals(ctx, &preserved);
        snprintf(ctx->denormals_text, sizeof ctx->denormals_text, "%s",
                 preserved ? "preserved" : "flushed (measured; device lacks DenormPreserve for f32)");
        if (preserved) {
            snprintf(ctx->float_controls_text, sizeof ctx->float_controls_text,
                     "DenormPreserve=unsupported (driver default measured: preserved) SignedZeroInfNanPreserve=%s RTE=%s",
                     ctx->float_controls.signed_zero_inf_nan_preserve ? "on" : "unsupported",
                     ctx->float_controls.rounding_rte ? "on" : "unsupported");
        }
    }
    if (st != TOVL_OK) {
        tovl_vk_ctx_destroy(ctx);
        return st;
    }
    return tovl_backend_create(&vk_iface, ctx, out); /* destroys ctx itself on failure */
}

static tovl_status vk_open(tovl_backend **out) {
    *out = NULL;
    vk_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx || pthread_mutex_init(&ctx->lock, NULL) != 0) {
        free(ctx);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    }
    atomic_init(&ctx->validation_messages, 0u);
    tovl_status st = load_loader(ctx, NULL);
    if (st == TOVL_OK) {
        st = tovl_vk_open_own(ctx);
    }
    if (st != TOVL_OK) {
        tovl_vk_ctx_destroy(ctx);
        return st;
    }
    return finish_open(ctx, 0, out);
}

tovl_status tovl_vulkan_backend_wrap(const tovl_vulkan_device_desc *desc, tovl_backend **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_vulkan_backend_wrap: out is NULL");
    }
    *out = NULL;
    if (!desc || !desc->instance || !desc->physical_device || !desc->device) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "tovl_vulkan_backend_wrap: desc, instance, physical_device or device is NULL");
    }
    vk_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx || pthread_mutex_init(&ctx->lock, NULL) != 0) {
        free(ctx);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "vulkan: out of host memory");
    }
    atomic_init(&ctx->validation_messages, 0u);
    tovl_status st = load_loader(ctx, desc->get_instance_proc_addr);
    if (st != TOVL_OK) {
        tovl_vk_ctx_destroy(ctx);
        return st;
    }
    ctx->instance = (VkInstance)desc->instance;
    ctx->physical = (VkPhysicalDevice)desc->physical_device;
    volkLoadInstanceOnly(ctx->instance);
    const char *missing = NULL;
    if (tovl_vk_check_physical_device(ctx->physical, &missing) != TOVL_OK) {
        tovl_vk_ctx_destroy(ctx);
        return tovl_error(TOVL_ERR_UNSUPPORTED, "tovl_vulkan_backend_wrap: the physical device lacks %s", missing);
    }
    uint32_t nfam = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(ctx->physical, &nfam, NULL);
    VkQueueFamilyProperties fam[32];
    nfam = nfam > 32 ? 32 : nfam;
    vkGetPhysicalDeviceQueueFamilyProperties(ctx->physical, &nfam, fam);
    if (desc->queue_family >= nfam || !(fam[desc->queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT) ||
        desc->queue_index >= fam[desc->queue_family].queueCount) {
        tovl_vk_ctx_destroy(ctx);
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "tovl_vulkan_backend_wrap: queue family %u / index %u is not a compute queue of the device",
                          desc->queue_family, desc->queue_index);
    }
    ctx->queue_family = desc->queue_family;
    ctx->device = (VkDevice)desc->device;
    volkLoadDeviceTable(&ctx->vk, ctx->device);
    st = finish_open(ctx, desc->queue_index, out);
    return st;
}

const tovl_backend_factory tovl_vulkan_backend_factory = {"vulkan", vk_open};
