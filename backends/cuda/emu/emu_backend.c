/* A backend whose kernels are this port's CUDA kernels run by the host
 * emulation (cuda_emu.cpp), launched with the CUDA backend's own geometry.
 * Memory is the CPU backend's (host memory), which it wraps. Test-only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_emu_api.h"
#include "tovl/backend.h"

typedef struct emu_ctx {
    tovl_backend *host; /* the CPU backend: allocation and copies */
    tovl_cuda_device_shape shape;
    bool force_lmhead;            /* every lm_head launch takes lmhead_variant */
    tovl_cuda_variant lmhead_variant;
    uint64_t seed;
    uint64_t launches;
    char device[96];
} emu_ctx;

static void emu_destroy(void *ctx) {
    emu_ctx *c = ctx;
    tovl_backend_close(c->host);
    free(c);
}

static const char *emu_device(void *ctx) {
    return ((emu_ctx *)ctx)->device;
}

static const char *emu_property(void *ctx, const char *key) {
    (void)ctx;
    if (strcmp(key, "subgroup_size") == 0) {
        return "32";
    }
    if (strcmp(key, "f32_denormals") == 0) {
        return "preserved";
    }
    return NULL;
}

static tovl_status emu_alloc(void *ctx, size_t bytes, tovl_devptr *out) {
    return tovl_alloc(((emu_ctx *)ctx)->host, bytes, out);
}

static void emu_free(void *ctx, tovl_devptr ptr) {
    tovl_free(((emu_ctx *)ctx)->host, ptr);
}

static tovl_status emu_upload(void *ctx, tovl_devptr dst, const void *src, size_t bytes) {
    return tovl_upload(((emu_ctx *)ctx)->host, dst, src, bytes);
}

/* Launches run at the call, so a write in call order is a write in stream
 * order; no fence is needed (fence_record NULL). */
static tovl_status emu_write_async(void *ctx, const tovl_device_write *writes, uint32_t count, void *stream) {
    (void)stream;
    tovl_status st = TOVL_OK;
    for (uint32_t i = 0; st == TOVL_OK && i < count; i++) {
        st = emu_upload(ctx, writes[i].dst, writes[i].src, writes[i].bytes);
    }
    return st;
}

static tovl_status emu_download(void *ctx, void *dst, tovl_devptr src, size_t bytes) {
    return tovl_download(((emu_ctx *)ctx)->host, dst, src, bytes);
}

static tovl_status emu_fill_u32(void *ctx, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    return tovl_fill_u32(((emu_ctx *)ctx)->host, dst, pattern, bytes);
}

static tovl_kernel emu_try_kernel(void *ctx, const char *name) {
    (void)ctx;
    int k = tovl_cuda_kernel_by_name(name);
    return k < 0 ? 0 : (tovl_kernel)k + 1;
}

static tovl_status emu_launch(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                              size_t args_size, void *stream) {
    emu_ctx *c = ctx;
    (void)stream;
    tovl_cuda_kernel_id k;
    tovl_status st = tovl_cuda_check_launch("cuda-emu", kernel, args, args_size, &k);
    if (st != TOVL_OK) {
        return st;
    }
    tovl_cuda_launch dims;
    const bool lmhead = k == TOVL_CUDA_LMHEAD_BF16 || k == TOVL_CUDA_LMHEAD_F32;
    st = c->force_lmhead && lmhead ? tovl_cuda_lmhead_shape(c->lmhead_variant, args, &dims)
                                   : tovl_cuda_native_launch(k, grid, args, &c->shape, &dims);
    if (st != TOVL_OK || !dims.grid[0] || !dims.grid[1] || !dims.grid[2]) {
        return st;
    }
    tovl_cuda_emu_set_sm_count(c->shape.sm_count ? c->shape.sm_count : 1);
    if (dims.few_grid[0]) { /* the gated pair: row4q_few first, as the backend launches it */
        const tovl_cuda_launch few = tovl_cuda_few_launch(&dims);
        st = tovl_cuda_emu_launch(tovl_cuda_function_names[k][few.variant], few.grid, few.block, args,
                                  c->seed + c->launches++);
        if (st != TOVL_OK) {
            return st;
        }
    }
    const char *function = tovl_cuda_function_names[k][dims.variant];
    return tovl_cuda_emu_launch(function, dims.grid, dims.block, args, c->seed + c->launches++);
}

static tovl_status emu_synchronize(void *ctx, void *stream) {
    (void)ctx;
    (void)stream;
    return TOVL_OK;
}

static const tovl_backend_iface emu_iface = {
    .iface_version = TOVL_BACKEND_IFACE_VERSION,
    .name = "cuda-emu",
    .destroy = emu_destroy,
    .device = emu_device,
    .property = emu_property,
    .alloc = emu_alloc,
    .free = emu_free,
    .upload = emu_upload,
    .download = emu_download,
    .fill_u32 = emu_fill_u32,
    .try_kernel = emu_try_kernel,
    .launch = emu_launch,
    .synchronize = emu_synchronize,
    .write_async = emu_write_async,
};

static tovl_status emu_open(const tovl_cuda_device_shape *shape, bool force_lmhead, tovl_cuda_variant lmhead,
                            uint64_t seed, tovl_backend **out) {
    *out = NULL;
    emu_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cuda-emu: out of host memory");
    }
    tovl_status st = tovl_backend_open("cpu", &c->host);
    if (st != TOVL_OK) {
        free(c);
        return st;
    }
    c->shape = *shape;
    c->force_lmhead = force_lmhead;
    c->lmhead_variant = lmhead;
    c->seed = seed;
    snprintf(c->device, sizeof c->device, "CUDA kernels emulated on the host (%u SMs%s%s)", shape->sm_count,
             force_lmhead ? ", lm_head always " : "", force_lmhead ? tovl_cuda_variant_names[lmhead] : "");
    return tovl_backend_create(&emu_iface, c, out);
}

tovl_status tovl_cuda_emu_backend_open(const tovl_cuda_device_shape *shape, uint64_t seed, tovl_backend **out) {
    return emu_open(shape, false, TOVL_CUDA_VARIANT_PLAIN, seed, out);
}

tovl_status tovl_cuda_emu_backend_open_variant(const tovl_cuda_device_shape *shape, tovl_cuda_variant lmhead,
                                               uint64_t seed, tovl_backend **out) {
    if ((int)lmhead < 0 || lmhead >= TOVL_CUDA_VARIANT_COUNT) {
        *out = NULL;
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cuda-emu: no lm_head variant %d", (int)lmhead);
    }
    return emu_open(shape, true, lmhead, seed, out);
}
