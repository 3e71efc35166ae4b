/* A backend whose kernels are the HIP port's, run by the host emulation at a
 * warp width of 32 or 64 and launched with the HIP backend's own geometry.
 * Memory and copies are the CPU backend's (host memory): the context is a
 * CPU backend's, whose members this one reuses. Test-only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../hip_geometry.h"
#include "../token_overlay_shape.h"
#include "hip_emu_api.h"
#include "tovl/backend.h"

typedef struct hip_emu_ctx {
    tovl_backend *host; /* the CPU backend: allocation and copies */
    unsigned warp;
    tovl_hip_emu_lmhead lmhead;
    uint64_t seed, launches;
    char device[96], subgroup[8];
} hip_emu_ctx;

static void hip_emu_destroy(void *ctx) {
    hip_emu_ctx *c = ctx;
    tovl_backend_close(c->host);
    free(c);
}

static const char *hip_emu_device(void *ctx) {
    return ((hip_emu_ctx *)ctx)->device;
}

static const char *hip_emu_property(void *ctx, const char *key) {
    hip_emu_ctx *c = ctx;
    if (strcmp(key, "subgroup_size") == 0) {
        return c->subgroup;
    }
    if (strcmp(key, "f32_denormals") == 0) {
        return "preserved";
    }
    return NULL;
}

static tovl_status hip_emu_alloc(void *ctx, size_t bytes, tovl_devptr *out) {
    return tovl_alloc(((hip_emu_ctx *)ctx)->host, bytes, out);
}

static void hip_emu_free(void *ctx, tovl_devptr ptr) {
    tovl_free(((hip_emu_ctx *)ctx)->host, ptr);
}

static tovl_status hip_emu_upload(void *ctx, tovl_devptr dst, const void *src, size_t bytes) {
    return tovl_upload(((hip_emu_ctx *)ctx)->host, dst, src, bytes);
}

/* Launches run at the call, so a write in call order is a write in stream
 * order; no fence is needed (fence_record NULL). */
static tovl_status hip_emu_write_async(void *ctx, const tovl_device_write *writes, uint32_t count, void *stream) {
    (void)stream;
    tovl_status st = TOVL_OK;
    for (uint32_t i = 0; st == TOVL_OK && i < count; i++) {
        st = hip_emu_upload(ctx, writes[i].dst, writes[i].src, writes[i].bytes);
    }
    return st;
}

static tovl_status hip_emu_download(void *ctx, void *dst, tovl_devptr src, size_t bytes) {
    return tovl_download(((hip_emu_ctx *)ctx)->host, dst, src, bytes);
}

static tovl_status hip_emu_fill_u32(void *ctx, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    return tovl_fill_u32(((hip_emu_ctx *)ctx)->host, dst, pattern, bytes);
}

static tovl_kernel hip_emu_try_kernel(void *ctx, const char *name) {
    (void)ctx;
    int k = tovl_hip_kernel_by_name(name);
    return k < 0 ? 0 : (tovl_kernel)k + 1;
}

static tovl_status hip_emu_launch(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                                  size_t args_size, void *stream) {
    hip_emu_ctx *c = ctx;
    (void)stream;
    tovl_hip_kernel_id k;
    tovl_status st = tovl_hip_check_launch("hip-emu", kernel, args, args_size, &k);
    uint32_t blocks[3];
    const uint32_t small_max_t = c->lmhead == TOVL_HIP_EMU_LMHEAD_AS_CHOSEN ? TOVL_HIP_LMHEAD_SMALL_MAX_T
                                 : c->lmhead == TOVL_HIP_EMU_LMHEAD_SMALL   ? UINT32_MAX
                                                                            : 0;
    if (st == TOVL_OK) st = tovl_hip_blocks_small_to(k, grid, args, small_max_t, blocks);
    if (st != TOVL_OK || !blocks[0] || !blocks[1] || !blocks[2]) {
        return st;
    }
    const uint32_t block[3] = {TOVL_HIP_BLOCK_THREADS, 1, 1};
    return tovl_hip_emu_launch(tovl_hip_kernel_names[k], blocks, block, args, c->seed + c->launches++, c->warp,
                               c->lmhead == TOVL_HIP_EMU_LMHEAD_TILES);
}

static tovl_status hip_emu_synchronize(void *ctx, void *stream) {
    (void)ctx;
    (void)stream;
    return TOVL_OK;
}

static const tovl_backend_iface hip_emu_iface = {
    .iface_version = TOVL_BACKEND_IFACE_VERSION,
    .name = "hip-emu",
    .destroy = hip_emu_destroy,
    .device = hip_emu_device,
    .property = hip_emu_property,
    .alloc = hip_emu_alloc,
    .free = hip_emu_free,
    .upload = hip_emu_upload,
    .download = hip_emu_download,
    .fill_u32 = hip_emu_fill_u32,
    .try_kernel = hip_emu_try_kernel,
    .launch = hip_emu_launch,
    .synchronize = hip_emu_synchronize,
    .write_async = hip_emu_write_async,
};

tovl_status tovl_hip_emu_backend_open(unsigned warp, tovl_hip_emu_lmhead lmhead, uint64_t seed, tovl_backend **out) {
    *out = NULL;
    if (warp != 32 && warp != 64) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "hip-emu: warp width %u (32 or 64)", warp);
    }
    hip_emu_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "hip-emu: out of host memory");
    }
    tovl_status st = tovl_backend_open("cpu", &c->host);
    if (st != TOVL_OK) {
        free(c);
        return st;
    }
    c->warp = warp;
    c->lmhead = lmhead;
    c->seed = seed;
    snprintf(c->subgroup, sizeof c->subgroup, "%u", warp);
    snprintf(c->device, sizeof c->device, "HIP kernels emulated on the host (wave%u%s)", warp,
             lmhead == TOVL_HIP_EMU_LMHEAD_TILES   ? ", lm_head tiles at every T"
             : lmhead == TOVL_HIP_EMU_LMHEAD_SMALL ? ", lm_head small-batch path at every T"
                                                   : "");
    return tovl_backend_create(&hip_emu_iface, c, out);
}
