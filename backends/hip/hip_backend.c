/*
 * The HIP backend: AMD GPUs through the HIP runtime, loaded at run time
 * (hip_api.c). The kernels are token_overlay.hip, compiled for every gfx
 * target of the build into one code-object bundle embedded in the library and
 * loaded with hipModuleLoadData; the runtime picks the device's code object.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hip_api.h"
#include "hip_bundle.h"
#include "token_overlay_shape.h"
#include "tovl/backend.h"
#include "tovl/tovl_hip.h"

/* The kernels by handle - 1. lmhead kernels cover LMHEAD_ROWS rows per block. */
static const struct {
    const char *name;
    size_t args_size;
    bool lmhead;
} hip_kernels[] = {
    {TOVL_KERNEL_ROWDIFF, sizeof(tovl_rowdiff_args), false},
    {TOVL_KERNEL_EMBED_OVERLAY, sizeof(tovl_embed_overlay_args), false},
    {TOVL_KERNEL_LMHEAD_OVERLAY_BF16, sizeof(tovl_lmhead_overlay_args), true},
    {TOVL_KERNEL_LMHEAD_OVERLAY_F32, sizeof(tovl_lmhead_overlay_args), true},
};
#define HIP_KERNEL_COUNT (sizeof hip_kernels / sizeof hip_kernels[0])

/* HIP's grid limits on AMD: y and z below 2^16; x * block below 2^32. */
#define HIP_MAX_GRID_X (0xFFFFFFFFu / TOVL_HIP_BLOCK_THREADS)
#define HIP_MAX_GRID_YZ 65535u

typedef struct hip_ctx {
    const tovl_hip_api *api;
    int device;
    hipModule_t module;
    hipFunction_t functions[HIP_KERNEL_COUNT];
    bool looked_up[HIP_KERNEL_COUNT];
    char description[256];
    char subgroup_size[8]; /* "" when the runtime did not say */
    char driver[64];
} hip_ctx;

/* Operations that name no stream act on the current device of this thread. */
static tovl_status bind_device(hip_ctx *c, const char *what) {
    hipError_t e = c->api->hipSetDevice(c->device);
    if (e != TOVL_HIP_SUCCESS) {
        char t[96];
        return tovl_error(TOVL_ERR_DEVICE, "hip: %s: hipSetDevice(%d): %s", what, c->device,
                          tovl_hip_error_text(c->api, e, t, sizeof t));
    }
    return TOVL_OK;
}

static tovl_status device_error(hip_ctx *c, const char *call, hipError_t e) {
    char t[96];
    tovl_status st = e == TOVL_HIP_ERROR_OUT_OF_MEMORY ? TOVL_ERR_OUT_OF_MEMORY : TOVL_ERR_DEVICE;
    return tovl_error(st, "hip: %s: %s", call, tovl_hip_error_text(c->api, e, t, sizeof t));
}

static void hip_destroy(void *ctx) {
    hip_ctx *c = ctx;
    if (c->module && bind_device(c, "unload") == TOVL_OK) {
        c->api->hipModuleUnload(c->module);
    }
    free(c);
}

static const char *hip_device(void *ctx) {
    return ((hip_ctx *)ctx)->description;
}

static const char *hip_property(void *ctx, const char *key) {
    hip_ctx *c = ctx;
    if (strcmp(key, "f32_denormals") == 0) {
        return "preserved"; /* built without flushing; the bundle test checks the kernel descriptors */
    }
    if (strcmp(key, "subgroup_size") == 0) {
        return c->subgroup_size[0] ? c->subgroup_size : NULL;
    }
    if (strcmp(key, "driver") == 0) {
        return c->driver;
    }
    if (strcmp(key, "targets") == 0) {
        return tovl_hip_bundle_targets;
    }
    return NULL;
}

static tovl_status hip_alloc(void *ctx, size_t bytes, tovl_devptr *out) {
    hip_ctx *c = ctx;
    tovl_status st = bind_device(c, "alloc");
    if (st != TOVL_OK) {
        return st;
    }
    void *p = NULL;
    hipError_t e = c->api->hipMalloc(&p, bytes);
    if (e != TOVL_HIP_SUCCESS) {
        char call[48];
        snprintf(call, sizeof call, "hipMalloc(%zu bytes)", bytes);
        return device_error(c, call, e);
    }
    *out = (tovl_devptr)(uintptr_t)p;
    return TOVL_OK;
}

static void hip_free(void *ctx, tovl_devptr ptr) {
    hip_ctx *c = ctx;
    if (bind_device(c, "free") == TOVL_OK) {
        c->api->hipFree((void *)(uintptr_t)ptr);
    }
}

/* The copies and the fill run on the null stream, which waits for the work
 * of the device's other (blocking) streams, and return once done. */
static tovl_status hip_upload(void *ctx, tovl_devptr dst, const void *src, size_t bytes) {
    hip_ctx *c = ctx;
    tovl_status st = bind_device(c, "upload");
    if (st != TOVL_OK) {
        return st;
    }
    hipError_t e = c->api->hipMemcpyHtoD((hipDeviceptr_t)(uintptr_t)dst, (void *)(uintptr_t)src, bytes);
    return e == TOVL_HIP_SUCCESS ? TOVL_OK : device_error(c, "hipMemcpyHtoD", e);
}

static tovl_status hip_download(void *ctx, void *dst, tovl_devptr src, size_t bytes) {
    hip_ctx *c = ctx;
    tovl_status st = bind_device(c, "download");
    if (st != TOVL_OK) {
        return st;
    }
    hipError_t e = c->api->hipMemcpyDtoH(dst, (hipDeviceptr_t)(uintptr_t)src, bytes);
    return e == TOVL_HIP_SUCCESS ? TOVL_OK : device_error(c, "hipMemcpyDtoH", e);
}

static tovl_status hip_fill_u32(void *ctx, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    hip_ctx *c = ctx;
    tovl_status st = bind_device(c, "fill");
    if (st != TOVL_OK) {
        return st;
    }
    int value;
    memcpy(&value, &pattern, sizeof value); /* the bits, whatever the sign */
    hipError_t e = c->api->hipMemsetD32((hipDeviceptr_t)(uintptr_t)dst, value, bytes / 4);
    if (e != TOVL_HIP_SUCCESS) {
        return device_error(c, "hipMemsetD32", e);
    }
    e = c->api->hipStreamSynchronize(NULL);
    return e == TOVL_HIP_SUCCESS ? TOVL_OK : device_error(c, "hipStreamSynchronize after hipMemsetD32", e);
}

/* try_kernel is hipModuleGetFunction, asked once per name. */
static tovl_kernel hip_try_kernel(void *ctx, const char *name) {
    hip_ctx *c = ctx;
    for (size_t i = 0; i < HIP_KERNEL_COUNT; i++) {
        if (strcmp(name, hip_kernels[i].name) != 0) {
            continue;
        }
        if (!c->looked_up[i] && bind_device(c, "try_kernel") == TOVL_OK) {
            if (c->api->hipModuleGetFunction(&c->functions[i], c->module, name) != TOVL_HIP_SUCCESS) {
                c->functions[i] = NULL;
            }
            c->looked_up[i] = true;
        }
        return c->functions[i] ? (tovl_kernel)(i + 1) : 0;
    }
    return 0;
}

static tovl_status hip_launch(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                              size_t args_size, void *stream) {
    hip_ctx *c = ctx;
    if (kernel == 0 || kernel > HIP_KERNEL_COUNT || !c->functions[kernel - 1]) {
        return tovl_error(TOVL_ERR_LAUNCH, "hip: launch of unknown kernel handle %llu", (unsigned long long)kernel);
    }
    const size_t k = kernel - 1;
    if (!args || args_size != hip_kernels[k].args_size) {
        return tovl_error(TOVL_ERR_LAUNCH, "hip: kernel %s expects %zu bytes of arguments, got %zu",
                          hip_kernels[k].name, hip_kernels[k].args_size, args_size);
    }
    /* Logical grid -> blocks: one block per row (token), and for the lm_head
     * kernels LMHEAD_ROWS overlay rows per block along y. */
    const uint32_t blocks_x = grid[0];
    const uint32_t blocks_y = hip_kernels[k].lmhead ? tovl_hip_lmhead_blocks_y(grid[1]) : grid[1];
    const uint32_t blocks_z = grid[2];
    if (blocks_x == 0 || blocks_y == 0 || blocks_z == 0) {
        return TOVL_OK; /* an empty grid: nothing to do */
    }
    if (blocks_x > HIP_MAX_GRID_X || blocks_y > HIP_MAX_GRID_YZ || blocks_z > HIP_MAX_GRID_YZ) {
        return tovl_error(TOVL_ERR_LAUNCH, "hip: kernel %s: grid %u x %u x %u blocks exceeds HIP's (%u x %u x %u)",
                          hip_kernels[k].name, blocks_x, blocks_y, blocks_z, HIP_MAX_GRID_X, HIP_MAX_GRID_YZ,
                          HIP_MAX_GRID_YZ);
    }
    tovl_status st = bind_device(c, "launch");
    if (st != TOVL_OK) {
        return st;
    }
    void *params[] = {(void *)(uintptr_t)args}; /* the one by-value struct; copied at launch */
    hipError_t e = c->api->hipModuleLaunchKernel(c->functions[k], blocks_x, blocks_y, blocks_z, TOVL_HIP_BLOCK_THREADS,
                                                 1, 1, 0, (hipStream_t)stream, params, NULL);
    if (e != TOVL_HIP_SUCCESS) {
        char t[96];
        return tovl_error(TOVL_ERR_LAUNCH, "hip: hipModuleLaunchKernel(%s, %u x %u x %u blocks): %s",
                          hip_kernels[k].name, blocks_x, blocks_y, blocks_z,
                          tovl_hip_error_text(c->api, e, t, sizeof t));
    }
    return TOVL_OK;
}

static tovl_status hip_synchronize(void *ctx, void *stream) {
    hip_ctx *c = ctx;
    tovl_status st = bind_device(c, "synchronize");
    if (st != TOVL_OK) {
        return st;
    }
    hipError_t e = c->api->hipStreamSynchronize((hipStream_t)stream);
    return e == TOVL_HIP_SUCCESS ? TOVL_OK : device_error(c, "hipStreamSynchronize", e);
}

static const tovl_backend_iface hip_iface = {
    .iface_version = TOVL_BACKEND_IFACE_VERSION,
    .name = "hip",
    .destroy = hip_destroy,
    .device = hip_device,
    .property = hip_property,
    .alloc = hip_alloc,
    .free = hip_free,
    .upload = hip_upload,
    .download = hip_download,
    .fill_u32 = hip_fill_u32,
    .try_kernel = hip_try_kernel,
    .launch = hip_launch,
    .synchronize = hip_synchronize,
};

/* Name, wavefront size and runtime version for device() and property(). */
static void describe(hip_ctx *c) {
    char name[128] = "AMD GPU";
    hipDevice_t dev;
    if (c->api->hipDeviceGet(&dev, c->device) == TOVL_HIP_SUCCESS &&
        c->api->hipDeviceGetName(name, (int)sizeof name, dev) == TOVL_HIP_SUCCESS) {
        name[sizeof name - 1] = '\0';
    }
    int warp = 0;
    if (c->api->hipDeviceGetAttribute(&warp, TOVL_HIP_ATTRIBUTE_WARP_SIZE, c->device) == TOVL_HIP_SUCCESS &&
        (warp == 32 || warp == 64)) {
        snprintf(c->subgroup_size, sizeof c->subgroup_size, "%d", warp);
    }
    int version = 0;
    c->api->hipRuntimeGetVersion(&version);
    /* HIP_VERSION = major * 10^7 + minor * 10^5 + patch */
    snprintf(c->driver, sizeof c->driver, "HIP runtime %d.%d.%d (%s)", version / 10000000, version / 100000 % 100,
             version % 100000, c->api->library);
    snprintf(c->description, sizeof c->description, "%s (HIP device %d%s%s, %s)", name, c->device,
             c->subgroup_size[0] ? ", wave" : "", c->subgroup_size, c->driver);
}

tovl_status tovl_hip_backend_open_device(int device, tovl_backend **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_hip_backend_open_device: out is NULL");
    }
    *out = NULL;
    if (device < 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_hip_backend_open_device: device %d is negative", device);
    }
    const tovl_hip_api *api;
    int count;
    tovl_status st = tovl_hip_api_load(&api, &count);
    if (st != TOVL_OK) {
        return st;
    }
    if (device >= count) {
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "HIP device %d requested, %d present", device, count);
    }
    hip_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "hip: out of host memory");
    }
    c->api = api;
    c->device = device;
    char t[96];
    hipError_t e = api->hipSetDevice(device);
    if (e != TOVL_HIP_SUCCESS) {
        free(c);
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "HIP device %d unusable: hipSetDevice: %s", device,
                          tovl_hip_error_text(api, e, t, sizeof t));
    }
    describe(c);
    e = api->hipModuleLoadData(&c->module, tovl_hip_bundle);
    if (e != TOVL_HIP_SUCCESS) {
        st = tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE,
                        "%s: no usable code object for it in the bundle (built for %s): hipModuleLoadData: %s",
                        c->description, tovl_hip_bundle_targets, tovl_hip_error_text(c->api, e, t, sizeof t));
        c->module = NULL;
        free(c);
        return st;
    }
    return tovl_backend_create(&hip_iface, c, out);
}

/* TOVL_HIP_DEVICE: a device index, 0 when unset. */
static tovl_status hip_open(tovl_backend **out) {
    *out = NULL;
    const char *env = getenv("TOVL_HIP_DEVICE");
    long device = 0;
    if (env && *env) {
        char *end;
        errno = 0;
        device = strtol(env, &end, 10);
        if (errno || *end || device < 0 || device > 4096) {
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "TOVL_HIP_DEVICE='%s' is not a device index", env);
        }
    }
    return tovl_hip_backend_open_device((int)device, out);
}

const tovl_backend_factory tovl_hip_backend_factory = {"hip", hip_open};
