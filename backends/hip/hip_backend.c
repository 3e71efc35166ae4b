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
#include "hip_geometry.h"
#include "token_overlay_shape.h"
#include "tovl/backend.h"
#include "tovl/tovl_hip.h"

typedef struct hip_ctx {
    const tovl_hip_api *api;
    int device;
    hipModule_t module;
    hipFunction_t functions[TOVL_HIP_KERNEL_COUNT];
    bool looked_up[TOVL_HIP_KERNEL_COUNT];
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
    const int i = tovl_hip_kernel_by_name(name);
    if (i < 0) {
        return 0;
    }
    if (!c->looked_up[i] && bind_device(c, "try_kernel") == TOVL_OK) {
        if (c->api->hipModuleGetFunction(&c->functions[i], c->module, name) != TOVL_HIP_SUCCESS) {
            c->functions[i] = NULL;
        }
        c->looked_up[i] = true;
    }
    return c->functions[i] ? (tovl_kernel)(i + 1) : 0;
}

static tovl_status hip_launch(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                              size_t args_size, void *stream) {
    hip_ctx *c = ctx;
    tovl_hip_kernel_id k;
    tovl_status st = tovl_hip_check_launch("hip", kernel, args, args_size, &k);
    if (st != TOVL_OK) {
        return st;
    }
    if (!c->functions[k]) {
        return tovl_error(TOVL_ERR_LAUNCH, "hip: launch of kernel %s, which the module lacks", tovl_hip_kernel_names[k]);
    }
    uint32_t blocks[3];
    st = tovl_hip_blocks(k, grid, args, blocks);
    if (st != TOVL_OK) {
        return st;
    }
    if (blocks[0] == 0 || blocks[1] == 0 || blocks[2] == 0) {
        return TOVL_OK; /* an empty grid: nothing to do */
    }
    st = bind_device(c, "launch");
    if (st != TOVL_OK) {
        return st;
    }
    void *params[] = {(void *)(uintptr_t)args}; /* the one by-value struct; copied at launch */
    hipError_t e = c->api->hipModuleLaunchKernel(c->functions[k], blocks[0], blocks[1], blocks[2],
                                                 TOVL_HIP_BLOCK_THREADS, 1, 1, 0, (hipStream_t)stream, params, NULL);
    if (e != TOVL_HIP_SUCCESS) {
        char t[96];
        return tovl_error(TOVL_ERR_LAUNCH, "hip: hipModuleLaunchKernel(%s, %u x %u x %u blocks): %s",
                          tovl_hip_kernel_names[k], blocks[0], blocks[1], blocks[2],
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

/* ------------------------------------------------------------------------ */
/* Stream-ordered writes and fences (fixed-shape sets' loads)                */
/* ------------------------------------------------------------------------ */
/* As the CUDA port: copies from pageable memory, staged before the call
 * returns and ordered on the stream; refused on a capturing stream, whose
 * graph would keep the host addresses. */
static tovl_status hip_write_async(void *ctx, const tovl_device_write *writes, uint32_t count, void *stream) {
    hip_ctx *c = ctx;
    tovl_status st = bind_device(c, "write_async");
    if (st != TOVL_OK) {
        return st;
    }
    int capture = TOVL_HIP_CAPTURE_STATUS_NONE;
    hipError_t e = c->api->hipStreamIsCapturing((hipStream_t)stream, &capture);
    if (e == TOVL_HIP_SUCCESS && capture != TOVL_HIP_CAPTURE_STATUS_NONE) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "hip: the stream is capturing a graph; load and unload slots between replays, on the "
                          "stream the graph is launched on");
    }
    for (uint32_t i = 0; i < count; i++) {
        e = c->api->hipMemcpyHtoDAsync((hipDeviceptr_t)(uintptr_t)writes[i].dst, (void *)(uintptr_t)writes[i].src,
                                       writes[i].bytes, (hipStream_t)stream);
        if (e != TOVL_HIP_SUCCESS) {
            return device_error(c, "hipMemcpyHtoDAsync of a table entry", e);
        }
    }
    return TOVL_OK;
}

static tovl_status hip_fence_record(void *ctx, void *stream, tovl_fence *out) {
    hip_ctx *c = ctx;
    tovl_status st = bind_device(c, "fence");
    if (st != TOVL_OK) {
        return st;
    }
    hipEvent_t ev = NULL;
    hipError_t e = c->api->hipEventCreate(&ev);
    if (e == TOVL_HIP_SUCCESS) {
        e = c->api->hipEventRecord(ev, (hipStream_t)stream);
        if (e != TOVL_HIP_SUCCESS) {
            c->api->hipEventDestroy(ev);
        }
    }
    if (e != TOVL_HIP_SUCCESS) {
        return device_error(c, "hipEventRecord of a fence", e);
    }
    *out = (tovl_fence)(uintptr_t)ev;
    return TOVL_OK;
}

static tovl_status hip_fence_query(void *ctx, tovl_fence fence, bool *passed) {
    hip_ctx *c = ctx;
    hipError_t e = c->api->hipEventQuery((hipEvent_t)(uintptr_t)fence);
    *passed = e == TOVL_HIP_SUCCESS;
    return e == TOVL_HIP_SUCCESS || e == TOVL_HIP_ERROR_NOT_READY ? TOVL_OK
                                                                  : device_error(c, "hipEventQuery of a fence", e);
}

static void hip_fence_destroy(void *ctx, tovl_fence fence) {
    hip_ctx *c = ctx;
    c->api->hipEventDestroy((hipEvent_t)(uintptr_t)fence);
}

/* ------------------------------------------------------------------------ */
/* Timing with the device's clock (tovl bench): HIP events and graphs.        */
/* ------------------------------------------------------------------------ */
/* A stream of its own and two events: what one timing call works with. */
typedef struct hip_timer {
    hipStream_t stream;
    hipEvent_t start, stop;
} hip_timer;

static void timer_close(hip_ctx *c, hip_timer *t) {
    if (t->start) c->api->hipEventDestroy(t->start);
    if (t->stop) c->api->hipEventDestroy(t->stop);
    if (t->stream) c->api->hipStreamDestroy(t->stream);
    memset(t, 0, sizeof *t);
}

static tovl_status timer_open(hip_ctx *c, hip_timer *t) {
    memset(t, 0, sizeof *t);
    tovl_status st = bind_device(c, "timing");
    if (st != TOVL_OK) {
        return st;
    }
    hipError_t e = c->api->hipStreamCreateWithFlags(&t->stream, TOVL_HIP_STREAM_NON_BLOCKING);
    const char *call = "hipStreamCreateWithFlags";
    if (e == TOVL_HIP_SUCCESS) {
        call = "hipEventCreate";
        e = c->api->hipEventCreate(&t->start);
        if (e == TOVL_HIP_SUCCESS) e = c->api->hipEventCreate(&t->stop);
    }
    if (e != TOVL_HIP_SUCCESS) {
        timer_close(c, t);
        return device_error(c, call, e);
    }
    return TOVL_OK;
}

/* Record start, run `work` (launches, a graph replay, a copy) on the timer's
 * stream, record stop; the elapsed milliseconds. */
typedef tovl_status (*timed_work)(hip_ctx *c, hipStream_t stream, void *arg);

static tovl_status time_once(hip_ctx *c, const hip_timer *t, timed_work work, void *arg, double *ms) {
    hipError_t e = c->api->hipEventRecord(t->start, t->stream);
    if (e != TOVL_HIP_SUCCESS) {
        return device_error(c, "hipEventRecord", e);
    }
    tovl_status st = work(c, t->stream, arg);
    if (st != TOVL_OK) {
        return st;
    }
    float elapsed = 0.0f;
    e = c->api->hipEventRecord(t->stop, t->stream);
    if (e == TOVL_HIP_SUCCESS) e = c->api->hipEventSynchronize(t->stop);
    if (e == TOVL_HIP_SUCCESS) e = c->api->hipEventElapsedTime(&elapsed, t->start, t->stop);
    if (e != TOVL_HIP_SUCCESS) {
        return device_error(c, "timing with events (hipEventRecord, hipEventSynchronize, hipEventElapsedTime)", e);
    }
    *ms = elapsed;
    return TOVL_OK;
}

typedef struct launch_work {
    tovl_kernel kernel;
    const uint32_t *grid;
    const void *args;
    size_t args_size;
} launch_work;

static tovl_status run_launch(hip_ctx *c, hipStream_t stream, void *arg) {
    const launch_work *w = arg;
    return hip_launch(c, w->kernel, w->grid, w->args, w->args_size, stream);
}

static tovl_status run_graph(hip_ctx *c, hipStream_t stream, void *arg) {
    hipError_t e = c->api->hipGraphLaunch((hipGraphExec_t)arg, stream);
    return e == TOVL_HIP_SUCCESS ? TOVL_OK : device_error(c, "hipGraphLaunch", e);
}

/* `batch` launches captured on the timer's stream into one instantiated graph. */
static tovl_status capture_batch(hip_ctx *c, const hip_timer *t, const launch_work *w, uint32_t batch,
                                 hipGraph_t *graph, hipGraphExec_t *exec) {
    hipError_t e = c->api->hipStreamBeginCapture(t->stream, TOVL_HIP_CAPTURE_MODE_THREAD_LOCAL);
    if (e != TOVL_HIP_SUCCESS) {
        return device_error(c, "hipStreamBeginCapture", e);
    }
    tovl_status st = TOVL_OK;
    for (uint32_t i = 0; i < batch && st == TOVL_OK; i++) {
        st = hip_launch(c, w->kernel, w->grid, w->args, w->args_size, t->stream);
    }
    e = c->api->hipStreamEndCapture(t->stream, graph); /* always ends the capture */
    if (st != TOVL_OK) {
        return st;
    }
    if (e != TOVL_HIP_SUCCESS) {
        return device_error(c, "hipStreamEndCapture", e);
    }
    e = c->api->hipGraphInstantiate(exec, *graph, NULL, NULL, 0);
    return e == TOVL_HIP_SUCCESS ? TOVL_OK : device_error(c, "hipGraphInstantiate", e);
}

/* single_us: the median of `repeats` single launches; batched_us: of
 * `repeats` replays of a graph of `batch` launches, per launch. */
static tovl_status hip_time_kernel(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                                   size_t args_size, uint32_t batch, uint32_t repeats, tovl_kernel_timing *out) {
    hip_ctx *c = ctx;
    if (!out || batch == 0 || repeats == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "hip: time_kernel needs batch >= 1, repeats >= 1 and out");
    }
    memset(out, 0, sizeof *out);
    double *single = malloc(2 * (size_t)repeats * sizeof *single);
    if (!single) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "hip: out of host memory");
    }
    double *batched = single + repeats;
    hip_timer t;
    hipGraph_t graph = NULL;
    hipGraphExec_t exec = NULL;
    launch_work w = {kernel, grid, args, args_size};
    tovl_status st = timer_open(c, &t);
    for (int i = 0; i < 3 && st == TOVL_OK; i++) { /* warm-up: caches, clocks, lazy loading */
        st = run_launch(c, t.stream, &w);
    }
    if (st == TOVL_OK) st = hip_synchronize(c, t.stream);
    for (uint32_t i = 0; i < repeats && st == TOVL_OK; i++) {
        st = time_once(c, &t, run_launch, &w, &single[i]);
    }
    if (st == TOVL_OK) st = capture_batch(c, &t, &w, batch, &graph, &exec);
    if (st == TOVL_OK) st = run_graph(c, t.stream, exec); /* one replay to warm up */
    if (st == TOVL_OK) st = hip_synchronize(c, t.stream);
    for (uint32_t i = 0; i < repeats && st == TOVL_OK; i++) {
        st = time_once(c, &t, run_graph, exec, &batched[i]);
        batched[i] /= batch;
    }
    if (st == TOVL_OK) {
        out->single_us = 1000.0 * tovl_median(single, repeats);
        out->batched_us = 1000.0 * tovl_median(batched, repeats);
        out->repeats = repeats;
    }
    if (t.stream) {
        c->api->hipStreamSynchronize(t.stream); /* nothing of ours is left running */
    }
    if (exec) c->api->hipGraphExecDestroy(exec);
    if (graph) c->api->hipGraphDestroy(graph);
    timer_close(c, &t);
    free(single);
    return st;
}

typedef struct copy_work {
    tovl_devptr dst, src;
    size_t bytes;
} copy_work;

static tovl_status run_copy(hip_ctx *c, hipStream_t stream, void *arg) {
    const copy_work *w = arg;
    hipError_t e = c->api->hipMemcpyDtoDAsync((hipDeviceptr_t)(uintptr_t)w->dst, (hipDeviceptr_t)(uintptr_t)w->src,
                                              w->bytes, stream);
    return e == TOVL_HIP_SUCCESS ? TOVL_OK : device_error(c, "hipMemcpyDtoDAsync", e);
}

/* Bytes read plus bytes written per second of a device-to-device copy. */
static tovl_status hip_copy_bandwidth(void *ctx, size_t bytes, uint32_t repeats, double *gbps) {
    hip_ctx *c = ctx;
    if (!gbps || bytes < 4 || repeats == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "hip: copy_bandwidth needs >= 4 bytes, repeats >= 1 and gbps");
    }
    double *ms = malloc(repeats * sizeof *ms);
    if (!ms) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "hip: out of host memory");
    }
    copy_work w = {0, 0, bytes & ~(size_t)3};
    hip_timer t = {0};
    tovl_status st = hip_alloc(c, w.bytes, &w.src);
    if (st == TOVL_OK) st = hip_alloc(c, w.bytes, &w.dst);
    if (st == TOVL_OK) st = hip_fill_u32(c, w.src, 0x3F80BF80u, w.bytes); /* not zeros */
    if (st == TOVL_OK) st = timer_open(c, &t);
    for (int i = 0; i < 2 && st == TOVL_OK; i++) { /* warm-up */
        st = run_copy(c, t.stream, &w);
    }
    for (uint32_t i = 0; i < repeats && st == TOVL_OK; i++) {
        st = time_once(c, &t, run_copy, &w, &ms[i]);
    }
    if (st == TOVL_OK) {
        *gbps = 2.0 * (double)w.bytes / (tovl_median(ms, repeats) * 1e-3) / 1e9;
    }
    if (t.stream) {
        c->api->hipStreamSynchronize(t.stream);
    }
    timer_close(c, &t);
    if (w.src) hip_free(c, w.src);
    if (w.dst) hip_free(c, w.dst);
    free(ms);
    return st;
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
    .time_kernel = hip_time_kernel,
    .copy_bandwidth = hip_copy_bandwidth,
    .write_async = hip_write_async,
    .fence_record = hip_fence_record,
    .fence_query = hip_fence_query,
    .fence_destroy = hip_fence_destroy,
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
