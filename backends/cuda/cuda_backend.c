/*
 * The CUDA backend: the driver loaded at run time (cuda_driver.c), one device
 * with its primary context (or the caller's context), the kernels from the
 * embedded fatbin (or a caller's image), launched on the caller's CUstream
 * with the argument struct by value. Launches never allocate or synchronize,
 * so the hooks can be captured in a CUDA graph.
 *
 * On sm_90 and newer this port's kernels are launched with programmatic
 * stream serialization (cuLaunchKernelEx): a launch may start while the
 * kernel before it finishes, and waits (griddepcontrol.wait) before it reads
 * anything that kernel may have written (kernels/common.cuh). On the H200
 * that took the embed hook from 2.2 to 1.75 us per launch at T = 512.
 * TOVL_CUDA_PDL=0 turns it off. Another port's module gets it only when it
 * says its kernels wait the same way (the global tovl_cuda_dependent_launch,
 * include/tovl/tovl_cuda.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_driver.h"
#include "cuda_geometry.h"
#include "launch_shape.h"
#include "tovl/backend.h"
#include "tovl/tovl_cuda.h"

#if TOVL_CUDA_HAVE_FATBIN
extern const unsigned char tovl_cuda_fatbin[];
extern const size_t tovl_cuda_fatbin_size;
#endif

typedef struct cuda_kernel {
    CUfunction fn[TOVL_CUDA_VARIANT_COUNT]; /* [PLAIN] NULL: the module lacks this kernel;
                                               the others: this port's launch variants */
    tovl_cuda_foreign_shapes shapes; /* another port's module: its launch convention */
} cuda_kernel;

/* TOVL_CUDA_GATED_PAIR (a measurement knob, docs/PERFORMANCE.md): the gated
 * pair of launch_shape.h as row4q_few then the tiles (1, the default), the
 * tiles then row4q_few ("after"), or the tiles alone, ungated (0). */
typedef enum gated_pair { PAIR_FEW_FIRST, PAIR_FEW_AFTER, PAIR_OFF } gated_pair;

typedef struct cuda_ctx {
    tovl_cuda_driver drv;
    CUdevice device;
    CUcontext context;
    bool owns_primary; /* retained the device's primary context */
    CUstream stream;   /* the backend's own stream: what NULL means */
    CUmodule module;
    bool native; /* the module is this port's: launch_shape.h applies */
    bool waits;  /* its kernels wait for the kernel before them (this port's, or tovl_cuda_dependent_launch) */
    bool pdl;    /* launch with programmatic stream serialization */
    gated_pair pair; /* how a fixed-shape set's gated pair is launched (TOVL_CUDA_GATED_PAIR) */
    int cc_major;
    cuda_kernel kernels[TOVL_CUDA_KERNEL_COUNT];
    tovl_cuda_device_shape shape;
    char device_text[256];
    char driver_text[16];
    char cc_text[16];
    char sm_text[16];
    char module_text[128];
    char pdl_text[96];
} cuda_ctx;

static const tovl_backend_iface cuda_iface;

/* ------------------------------------------------------------------------ */
/* Context handling: each entry makes the backend's context current when it  */
/* is not, and restores the caller's afterwards.                             */
/* ------------------------------------------------------------------------ */
static tovl_status ctx_enter(cuda_ctx *c, bool *pushed) {
    CUcontext current = NULL;
    *pushed = false;
    if (c->drv.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == c->context) {
        return TOVL_OK;
    }
    CUresult r = c->drv.cuCtxPushCurrent(c->context);
    if (r != CUDA_SUCCESS) {
        return tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuCtxPushCurrent");
    }
    *pushed = true;
    return TOVL_OK;
}

static void ctx_leave(cuda_ctx *c, bool pushed) {
    if (pushed) {
        CUcontext popped;
        c->drv.cuCtxPopCurrent(&popped);
    }
}

static CUstream stream_or_own(const cuda_ctx *c, void *stream) {
    return stream ? (CUstream)stream : c->stream;
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */
/* ------------------------------------------------------------------------ */
static tovl_status cuda_alloc(void *ctx, size_t bytes, tovl_devptr *out) {
    cuda_ctx *c = ctx;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    if (st != TOVL_OK) {
        return st;
    }
    CUdeviceptr p = 0;
    CUresult r = c->drv.cuMemAlloc(&p, bytes);
    ctx_leave(c, pushed);
    if (r != CUDA_SUCCESS) {
        return tovl_cuda_fail(&c->drv, r == CUDA_ERROR_OUT_OF_MEMORY ? TOVL_ERR_OUT_OF_MEMORY : TOVL_ERR_DEVICE,
                              r, "cuda: cuMemAlloc of %zu bytes", bytes);
    }
    *out = (tovl_devptr)p;
    return TOVL_OK;
}

static void cuda_free(void *ctx, tovl_devptr ptr) {
    cuda_ctx *c = ctx;
    bool pushed;
    if (ctx_enter(c, &pushed) == TOVL_OK) {
        c->drv.cuMemFree((CUdeviceptr)ptr);
        ctx_leave(c, pushed);
    }
}

/* Finish a copy or fill enqueued on the own stream: wait for it. */
static tovl_status own_stream_done(cuda_ctx *c, CUresult r, bool pushed, const char *what, size_t bytes) {
    if (r == CUDA_SUCCESS) {
        r = c->drv.cuStreamSynchronize(c->stream);
    }
    ctx_leave(c, pushed);
    return r == CUDA_SUCCESS ? TOVL_OK
                             : tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: %s of %zu bytes", what, bytes);
}

static tovl_status cuda_upload(void *ctx, tovl_devptr dst, const void *src, size_t bytes) {
    cuda_ctx *c = ctx;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    return st != TOVL_OK ? st
                         : own_stream_done(c, c->drv.cuMemcpyHtoDAsync((CUdeviceptr)dst, src, bytes, c->stream),
                                           pushed, "upload", bytes);
}

static tovl_status cuda_download(void *ctx, void *dst, tovl_devptr src, size_t bytes) {
    cuda_ctx *c = ctx;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    return st != TOVL_OK ? st
                         : own_stream_done(c, c->drv.cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, bytes, c->stream),
                                           pushed, "download", bytes);
}

static tovl_status cuda_fill_u32(void *ctx, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    cuda_ctx *c = ctx;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    return st != TOVL_OK ? st
                         : own_stream_done(c, c->drv.cuMemsetD32Async((CUdeviceptr)dst, pattern, bytes / 4, c->stream),
                                           pushed, "fill", bytes);
}

static tovl_status cuda_synchronize(void *ctx, void *stream) {
    cuda_ctx *c = ctx;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    if (st != TOVL_OK) {
        return st;
    }
    CUresult r = c->drv.cuStreamSynchronize(stream_or_own(c, stream));
    ctx_leave(c, pushed);
    return r == CUDA_SUCCESS ? TOVL_OK : tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuStreamSynchronize");
}

/* ------------------------------------------------------------------------ */
/* Stream-ordered writes and fences (fixed-shape sets' loads)                */
/* ------------------------------------------------------------------------ */
/* The copies are from pageable memory: the driver stages the bytes before
 * the call returns, so the caller's may go, and orders the copies on the
 * stream; a kernel of this port reads a table only after the copies before
 * it, since programmatic launch overlaps kernels with kernels, never with a
 * copy. A capturing stream would record the host addresses into its graph:
 * refused. */
static tovl_status cuda_write_async(void *ctx, const tovl_device_write *writes, uint32_t count, void *stream) {
    cuda_ctx *c = ctx;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    if (st != TOVL_OK) {
        return st;
    }
    CUstream s = stream_or_own(c, stream);
    int capture = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = c->drv.cuStreamIsCapturing(s, &capture);
    if (r == CUDA_SUCCESS && capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        ctx_leave(c, pushed);
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "cuda: the stream is capturing a graph; load and unload slots between replays, on the "
                          "stream the graph is launched on");
    }
    for (uint32_t i = 0; r == CUDA_SUCCESS && i < count; i++) {
        r = c->drv.cuMemcpyHtoDAsync((CUdeviceptr)writes[i].dst, writes[i].src, writes[i].bytes, s);
    }
    ctx_leave(c, pushed);
    return r == CUDA_SUCCESS ? TOVL_OK
                             : tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuMemcpyHtoDAsync of a table entry");
}

static tovl_status cuda_fence_record(void *ctx, void *stream, tovl_fence *out) {
    cuda_ctx *c = ctx;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    if (st != TOVL_OK) {
        return st;
    }
    CUevent ev = NULL;
    CUresult r = c->drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS) {
        r = c->drv.cuEventRecord(ev, stream_or_own(c, stream));
        if (r != CUDA_SUCCESS) {
            c->drv.cuEventDestroy(ev);
        }
    }
    ctx_leave(c, pushed);
    if (r != CUDA_SUCCESS) {
        return tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuEventRecord of a fence");
    }
    *out = (tovl_fence)(uintptr_t)ev;
    return TOVL_OK;
}

static tovl_status cuda_fence_query(void *ctx, tovl_fence fence, bool *passed) {
    cuda_ctx *c = ctx;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    if (st != TOVL_OK) {
        return st;
    }
    CUresult r = c->drv.cuEventQuery((CUevent)(uintptr_t)fence);
    ctx_leave(c, pushed);
    *passed = r == CUDA_SUCCESS;
    return r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY
               ? TOVL_OK
               : tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuEventQuery of a fence");
}

static void cuda_fence_destroy(void *ctx, tovl_fence fence) {
    cuda_ctx *c = ctx;
    bool pushed;
    if (ctx_enter(c, &pushed) == TOVL_OK) {
        c->drv.cuEventDestroy((CUevent)(uintptr_t)fence);
        ctx_leave(c, pushed);
    }
}

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */
/* ------------------------------------------------------------------------ */
static tovl_kernel cuda_try_kernel(void *ctx, const char *name) {
    cuda_ctx *c = ctx;
    int k = tovl_cuda_kernel_by_name(name);
    return k >= 0 && c->kernels[k].fn[TOVL_CUDA_VARIANT_PLAIN] ? (tovl_kernel)k + 1 : 0;
}

/* One launch of kernel k's function `dims->variant`, in the backend's context. */
static tovl_status launch_one(cuda_ctx *c, tovl_cuda_kernel_id k, const tovl_cuda_launch *dims, const void *args,
                              void *stream) {
    void *params[] = {(void *)args};
    CUfunction fn = c->kernels[k].fn[dims->variant];
    CUresult r =
        tovl_cuda_launch_kernel(&c->drv, fn, dims->grid, dims->block, stream_or_own(c, stream), params, c->pdl);
    if (r != CUDA_SUCCESS) {
        return tovl_cuda_fail(&c->drv, TOVL_ERR_LAUNCH, r, "cuda: %s(%s, grid %u x %u, block %u)",
                              c->pdl ? "cuLaunchKernelEx" : "cuLaunchKernel",
                              c->native ? tovl_cuda_function_names[k][dims->variant] : tovl_cuda_kernel_names[k],
                              dims->grid[0], dims->grid[1], dims->block[0] * dims->block[1]);
    }
    return TOVL_OK;
}

static tovl_status cuda_launch(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                               size_t args_size, void *stream) {
    cuda_ctx *c = ctx;
    tovl_cuda_kernel_id k;
    tovl_status st = tovl_cuda_check_launch("cuda", kernel, args, args_size, &k);
    if (st != TOVL_OK) {
        return st;
    }
    if (!c->kernels[k].fn[TOVL_CUDA_VARIANT_PLAIN]) {
        return tovl_error(TOVL_ERR_LAUNCH, "cuda: module %s has no %s", c->module_text, tovl_cuda_kernel_names[k]);
    }
    tovl_cuda_launch dims;
    if (c->native) {
        st = tovl_cuda_native_launch(k, grid, args, &c->shape, &dims);
    } else {
        /* Another port's lm_head grid is shaped for the rows the core
         * shapes it for (kernel_args.h: max_n, or fewer for a fixed-shape
         * set), its small shape for max_n (the HIP port's kernel tells the
         * small grid by its height against max_n; include/tovl/tovl_cuda.h). */
        const bool lmhead = k == TOVL_CUDA_LMHEAD_BF16 || k == TOVL_CUDA_LMHEAD_F32;
        const uint32_t max_n = lmhead ? ((const tovl_lmhead_overlay_args *)args)->max_n : 0;
        const uint32_t rows = grid[1] < max_n ? grid[1] : max_n;
        const uint32_t logical[3] = {
            grid[0], !lmhead ? grid[1] : tovl_cuda_foreign_small(&c->kernels[k].shapes, grid[0]) ? max_n : rows,
            grid[2]};
        st = tovl_cuda_foreign_launch(&c->kernels[k].shapes, logical, &dims);
    }
    if (st != TOVL_OK || !dims.grid[0] || !dims.grid[1] || !dims.grid[2]) {
        return st;
    }
    /* The gated pair (launch_shape.h): row4q_few, then the tiles. */
    tovl_cuda_launch few;
    const tovl_cuda_launch *first = &dims, *second = NULL;
    if (dims.few_grid[0] && c->pair == PAIR_OFF) {
        dims.variant = tovl_cuda_ungated_variant(dims.variant);
    } else if (dims.few_grid[0]) {
        few = tovl_cuda_few_launch(&dims);
        first = c->pair == PAIR_FEW_FIRST ? &few : &dims;
        second = c->pair == PAIR_FEW_FIRST ? &dims : &few;
    }
    bool pushed;
    st = ctx_enter(c, &pushed);
    if (st != TOVL_OK) {
        return st;
    }
    st = launch_one(c, k, first, args, stream);
    if (st == TOVL_OK && second) {
        st = launch_one(c, k, second, args, stream);
    }
    ctx_leave(c, pushed);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Timing (for tovl bench): device events on the own stream, medians.        */
/* ------------------------------------------------------------------------ */
/* Record `start`, run `work` (a launch, a graph replay, a copy), record `stop`
 * and return the elapsed milliseconds. */
typedef CUresult (*timed_work)(cuda_ctx *c, void *arg);

static tovl_status time_once(cuda_ctx *c, CUevent start, CUevent stop, timed_work work, void *arg, double *ms) {
    CUresult r = c->drv.cuEventRecord(start, c->stream);
    if (r == CUDA_SUCCESS) r = work(c, arg);
    if (r == CUDA_SUCCESS) r = c->drv.cuEventRecord(stop, c->stream);
    if (r == CUDA_SUCCESS) r = c->drv.cuEventSynchronize(stop);
    float elapsed = 0.0f;
    if (r == CUDA_SUCCESS) r = c->drv.cuEventElapsedTime(&elapsed, start, stop);
    if (r != CUDA_SUCCESS) {
        return tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: timing with events");
    }
    *ms = elapsed;
    return TOVL_OK;
}

typedef struct launch_work {
    tovl_kernel kernel;
    const uint32_t *grid;
    const void *args;
    size_t args_size;
    tovl_status status;
} launch_work;

static CUresult run_launch(cuda_ctx *c, void *arg) {
    launch_work *w = arg;
    w->status = cuda_launch(c, w->kernel, w->grid, w->args, w->args_size, NULL);
    return w->status == TOVL_OK ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult run_graph(cuda_ctx *c, void *arg) {
    return c->drv.cuGraphLaunch((CUgraphExec)arg, c->stream);
}

/* `batch` launches captured on the own stream into one instantiated graph. */
static tovl_status capture_batch(cuda_ctx *c, launch_work *w, uint32_t batch, CUgraph *graph, CUgraphExec *exec) {
    CUresult r = c->drv.cuStreamBeginCapture(c->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (r != CUDA_SUCCESS) {
        return tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuStreamBeginCapture");
    }
    tovl_status st = TOVL_OK;
    for (uint32_t i = 0; i < batch && st == TOVL_OK; i++) {
        st = cuda_launch(c, w->kernel, w->grid, w->args, w->args_size, NULL);
    }
    r = c->drv.cuStreamEndCapture(c->stream, graph); /* always ends the capture */
    if (st != TOVL_OK) {
        return st;
    }
    if (r == CUDA_SUCCESS) {
        r = c->drv.cuGraphInstantiateWithFlags(exec, *graph, 0);
    }
    return r == CUDA_SUCCESS ? TOVL_OK
                             : tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: capturing %u launches", batch);
}

static tovl_status cuda_time_kernel(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                                    size_t args_size, uint32_t batch, uint32_t repeats, tovl_kernel_timing *out) {
    cuda_ctx *c = ctx;
    if (!out || batch == 0 || repeats == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cuda: time_kernel needs batch >= 1, repeats >= 1 and out");
    }
    memset(out, 0, sizeof *out);
    double *single = malloc(2 * (size_t)repeats * sizeof *single);
    if (!single) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    }
    double *batched = single + repeats;
    CUevent start = NULL, stop = NULL;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    bool pushed;
    tovl_status st = ctx_enter(c, &pushed);
    if (st != TOVL_OK) {
        free(single);
        return st;
    }
    CUresult r = c->drv.cuEventCreate(&start, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = c->drv.cuEventCreate(&stop, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) {
        st = tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuEventCreate");
    }
    launch_work w = {kernel, grid, args, args_size, TOVL_OK};
    for (int i = 0; i < 3 && st == TOVL_OK; i++) { /* warm-up: caches, clocks, lazy loading */
        st = cuda_launch(c, kernel, grid, args, args_size, NULL);
    }
    if (st == TOVL_OK) st = cuda_synchronize(c, NULL);
    for (uint32_t i = 0; i < repeats && st == TOVL_OK; i++) {
        st = time_once(c, start, stop, run_launch, &w, &single[i]);
        if (w.status != TOVL_OK) st = w.status;
    }
    if (st == TOVL_OK) st = capture_batch(c, &w, batch, &graph, &exec);
    if (st == TOVL_OK) { /* one replay to warm up */
        r = c->drv.cuGraphLaunch(exec, c->stream);
        if (r == CUDA_SUCCESS) r = c->drv.cuStreamSynchronize(c->stream);
        if (r != CUDA_SUCCESS) st = tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuGraphLaunch");
    }
    for (uint32_t i = 0; i < repeats && st == TOVL_OK; i++) {
        st = time_once(c, start, stop, run_graph, exec, &batched[i]);
        batched[i] /= batch;
    }
    if (st == TOVL_OK) {
        out->single_us = 1000.0 * tovl_median(single, repeats);
        out->batched_us = 1000.0 * tovl_median(batched, repeats);
        out->repeats = repeats;
    }
    if (exec) c->drv.cuGraphExecDestroy(exec);
    if (graph) c->drv.cuGraphDestroy(graph);
    if (start) c->drv.cuEventDestroy(start);
    if (stop) c->drv.cuEventDestroy(stop);
    ctx_leave(c, pushed);
    free(single);
    return st;
}

typedef struct copy_work {
    CUdeviceptr dst, src;
    size_t bytes;
} copy_work;

static CUresult run_copy(cuda_ctx *c, void *arg) {
    copy_work *w = arg;
    return c->drv.cuMemcpyDtoDAsync(w->dst, w->src, w->bytes, c->stream);
}

static tovl_status cuda_copy_bandwidth(void *ctx, size_t bytes, uint32_t repeats, double *gbps) {
    cuda_ctx *c = ctx;
    if (!gbps || bytes < 4 || repeats == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cuda: copy_bandwidth needs >= 4 bytes, repeats >= 1 and gbps");
    }
    double *ms = malloc(repeats * sizeof *ms);
    if (!ms) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    }
    copy_work w = {0, 0, bytes & ~(size_t)3};
    tovl_devptr src = 0, dst = 0;
    CUevent start = NULL, stop = NULL;
    tovl_status st = cuda_alloc(c, w.bytes, &src);
    if (st == TOVL_OK) st = cuda_alloc(c, w.bytes, &dst);
    if (st == TOVL_OK) st = cuda_fill_u32(c, src, 0x3F80BF80u, w.bytes); /* not zeros */
    bool pushed = false;
    if (st == TOVL_OK) st = ctx_enter(c, &pushed);
    if (st == TOVL_OK) {
        w.src = (CUdeviceptr)src;
        w.dst = (CUdeviceptr)dst;
        CUresult r = c->drv.cuEventCreate(&start, CU_EVENT_DEFAULT);
        if (r == CUDA_SUCCESS) r = c->drv.cuEventCreate(&stop, CU_EVENT_DEFAULT);
        for (int i = 0; i < 2 && r == CUDA_SUCCESS; i++) { /* warm-up */
            r = run_copy(c, &w);
        }
        if (r != CUDA_SUCCESS) st = tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: device copy");
        for (uint32_t i = 0; i < repeats && st == TOVL_OK; i++) {
            st = time_once(c, start, stop, run_copy, &w, &ms[i]);
        }
        if (st == TOVL_OK) {
            *gbps = 2.0 * (double)w.bytes / (tovl_median(ms, repeats) * 1e-3) / 1e9; /* read + written */
        }
        if (start) c->drv.cuEventDestroy(start);
        if (stop) c->drv.cuEventDestroy(stop);
        ctx_leave(c, pushed);
    }
    if (src) cuda_free(c, src);
    if (dst) cuda_free(c, dst);
    free(ms);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Description                                                               */
/* ------------------------------------------------------------------------ */
static const char *cuda_device(void *ctx) {
    return ((cuda_ctx *)ctx)->device_text;
}

static const char *cuda_property(void *ctx, const char *key) {
    cuda_ctx *c = ctx;
    if (strcmp(key, "subgroup_size") == 0) {
        return "32";
    }
    if (strcmp(key, "f32_denormals") == 0) {
        return "preserved"; /* the kernels are built with -ftz=false */
    }
    if (strcmp(key, "driver") == 0) {
        return c->driver_text;
    }
    if (strcmp(key, "compute_capability") == 0) {
        return c->cc_text;
    }
    if (strcmp(key, "sm_count") == 0) {
        return c->sm_text;
    }
    if (strcmp(key, "module") == 0) {
        return c->module_text;
    }
    if (strcmp(key, "programmatic_dependent_launch") == 0) {
        return c->pdl_text;
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Opening and closing                                                       */
/* ------------------------------------------------------------------------ */
static void cuda_destroy(void *ctx) {
    cuda_ctx *c = ctx;
    if (!c) {
        return;
    }
    if (c->drv.library && c->context) {
        bool pushed;
        if (ctx_enter(c, &pushed) == TOVL_OK) {
            if (c->module) c->drv.cuModuleUnload(c->module);
            if (c->stream) c->drv.cuStreamDestroy(c->stream);
            ctx_leave(c, pushed);
        }
        if (c->owns_primary) {
            c->drv.cuDevicePrimaryCtxRelease(c->device);
        }
    }
    tovl_cuda_driver_unload(&c->drv);
    free(c);
}

/* The device TOVL_CUDA_DEVICE names (an index; default 0). */
static tovl_status pick_device(cuda_ctx *c) {
    int count = 0;
    CUresult r = c->drv.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) {
        return tovl_cuda_fail(&c->drv, TOVL_ERR_BACKEND_UNAVAILABLE, r, "no CUDA device: cuDeviceGetCount");
    }
    if (count == 0) {
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "no CUDA device: the driver sees none");
    }
    long index = 0;
    const char *env = getenv("TOVL_CUDA_DEVICE");
    if (env && *env) {
        char *end = NULL;
        errno = 0;
        index = strtol(env, &end, 10);
        if (errno || *end || index < 0) {
            return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "TOVL_CUDA_DEVICE='%s' is not a device index", env);
        }
    }
    if (index >= count) {
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "TOVL_CUDA_DEVICE=%ld but the driver sees %d CUDA device%s",
                          index, count, count == 1 ? "" : "s");
    }
    r = c->drv.cuDeviceGet(&c->device, (int)index);
    return r == CUDA_SUCCESS ? TOVL_OK : tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuDeviceGet(%ld)", index);
}

static tovl_status describe_device(cuda_ctx *c) {
    char name[128] = "";
    int major = 0, minor = 0, sms = 0;
    size_t mem = 0;
    CUresult r = c->drv.cuDeviceGetName(name, (int)sizeof name, c->device);
    if (r == CUDA_SUCCESS)
        r = c->drv.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->device);
    if (r == CUDA_SUCCESS)
        r = c->drv.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->device);
    if (r == CUDA_SUCCESS) r = c->drv.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->device);
    if (r == CUDA_SUCCESS) r = c->drv.cuDeviceTotalMem(&mem, c->device);
    if (r != CUDA_SUCCESS) {
        return tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: reading the device's attributes");
    }
    c->shape.sm_count = sms > 0 ? (uint32_t)sms : 1;
    c->cc_major = major;
    snprintf(c->driver_text, sizeof c->driver_text, "%d.%d", c->drv.version / 1000, c->drv.version % 1000 / 10);
    snprintf(c->cc_text, sizeof c->cc_text, "%d.%d", major, minor);
    snprintf(c->sm_text, sizeof c->sm_text, "%d", sms);
    snprintf(c->device_text, sizeof c->device_text, "%.127s (sm_%d%d, %d SMs, %.1f GiB, driver %s)", name, major,
             minor, sms, (double)mem / (1024.0 * 1024.0 * 1024.0), c->driver_text);
    return TOVL_OK;
}

/* Copy a small module global of exactly `size` bytes from the device into
 * `host` (a launch shape, the port marker) or, with to_device, from `host`
 * into it. found: NULL when the module must have the global; otherwise set to
 * whether it has it (a missing one is then not an error, and nothing is
 * copied). */
static tovl_status copy_global(cuda_ctx *c, const char *name, void *host, size_t size, bool to_device, bool *found) {
    CUdeviceptr p = 0;
    size_t bytes = 0;
    CUresult r = c->drv.cuModuleGetGlobal(&p, &bytes, c->module, name);
    if (found) {
        *found = r != CUDA_ERROR_NOT_FOUND;
        if (!*found) {
            return TOVL_OK;
        }
    }
    if (r == CUDA_SUCCESS && bytes != size) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cuda: module global %s has %zu bytes, expected %zu", name,
                          bytes, size);
    }
    if (r == CUDA_SUCCESS) {
        r = to_device ? c->drv.cuMemcpyHtoDAsync(p, host, size, c->stream)
                      : c->drv.cuMemcpyDtoHAsync(host, p, size, c->stream);
    }
    if (r == CUDA_SUCCESS) r = c->drv.cuStreamSynchronize(c->stream);
    return r == CUDA_SUCCESS ? TOVL_OK
                             : tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: %s module global %s",
                                              to_device ? "writing" : "reading", name);
}

/* This port's lm_head kernels let the next kernel launch early only when
 * their tiles outnumber the SMs (lmhead_overlay.cuh): tell them how many. */
static tovl_status write_sm_count(cuda_ctx *c) {
    uint32_t sms = c->shape.sm_count;
    return copy_global(c, "tovl_cuda_sm_count", &sms, sizeof sms, true, NULL);
}

static tovl_status get_function(cuda_ctx *c, const char *name, CUfunction *fn) {
    *fn = NULL;
    CUresult r = c->drv.cuModuleGetFunction(fn, c->module, name);
    if (r == CUDA_ERROR_NOT_FOUND) {
        *fn = NULL;
        return TOVL_OK;
    }
    return r == CUDA_SUCCESS ? TOVL_OK
                             : tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuModuleGetFunction(%s)", name);
}

/* Look the kernels up; tell this port's module from another's. */
static tovl_status resolve_kernels(cuda_ctx *c) {
    uint32_t abi = 0;
    bool found = false;
    tovl_status st = copy_global(c, "tovl_cuda_port_abi", &abi, sizeof abi, false, &found);
    if (st != TOVL_OK) {
        return st;
    }
    if (found && abi != TOVL_CUDA_PORT_ABI) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "cuda: module %s was built for launch ABI %u, this library launches ABI %u (rebuild it)",
                          c->module_text, abi, TOVL_CUDA_PORT_ABI);
    }
    c->native = found;
    c->waits = found;
    if (c->native) {
        st = write_sm_count(c);
    } else {
        uint32_t waits = 0;
        st = copy_global(c, "tovl_cuda_dependent_launch", &waits, sizeof waits, false, &found);
        c->waits = found && waits == 1;
    }
    if (st != TOVL_OK) {
        return st;
    }
    for (int k = 0; k < TOVL_CUDA_KERNEL_COUNT; k++) {
        cuda_kernel *kernel = &c->kernels[k];
        const char *name = tovl_cuda_kernel_names[k];
        st = get_function(c, name, &kernel->fn[TOVL_CUDA_VARIANT_PLAIN]);
        for (int v = TOVL_CUDA_VARIANT_PLAIN + 1; v < TOVL_CUDA_VARIANT_COUNT; v++) {
            const char *variant = tovl_cuda_function_names[k][v];
            if (st == TOVL_OK && kernel->fn[TOVL_CUDA_VARIANT_PLAIN] && c->native && variant) {
                st = get_function(c, variant, &kernel->fn[v]);
                if (st == TOVL_OK && !kernel->fn[v]) {
                    st = tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cuda: module %s has %s but not %s", c->module_text,
                                    name, variant);
                }
            }
        }
        if (st == TOVL_OK && kernel->fn[TOVL_CUDA_VARIANT_PLAIN] && !c->native) {
            char global[64], small_global[64];
            uint32_t shape[4], small[5];
            snprintf(global, sizeof global, "%s_launch", name);
            snprintf(small_global, sizeof small_global, "%s_launch_small", name);
            st = copy_global(c, global, shape, sizeof shape, false, &found);
            kernel->shapes.shape = found ? (tovl_cuda_foreign_shape){shape[0], shape[1], shape[2], shape[3]}
                                         : TOVL_CUDA_FOREIGN_DEFAULT_SHAPE;
            if (st == TOVL_OK) st = tovl_cuda_foreign_shape_check(global, &kernel->shapes.shape);
            if (st == TOVL_OK) st = copy_global(c, small_global, small, sizeof small, false, &found);
            if (st == TOVL_OK && found) {
                kernel->shapes.small = (tovl_cuda_foreign_shape){small[1], small[2], small[3], small[4]};
                kernel->shapes.small_max_x = small[0];
                st = tovl_cuda_foreign_shape_check(small_global, &kernel->shapes.small);
            }
        }
        if (st != TOVL_OK) {
            return st;
        }
    }
    return TOVL_OK;
}

/* Is `image` a cubin (ELF), a fatbin, or NUL-terminated PTX text? */
static tovl_status check_image(const void *image, size_t size, const char *label) {
    static const unsigned char elf[4] = {0x7F, 'E', 'L', 'F'}, fatbin[4] = {0x50, 0xED, 0x55, 0xBA};
    if (!image || size == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cuda: module image %s is empty", label);
    }
    if (size >= 4 && (memcmp(image, elf, 4) == 0 || memcmp(image, fatbin, 4) == 0)) {
        return TOVL_OK;
    }
    if (!memchr(image, 0, size)) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "cuda: module image %s is no cubin or fatbin, and as PTX it is not NUL-terminated within "
                          "its %zu bytes",
                          label, size);
    }
    return TOVL_OK;
}

static tovl_status gated_pair_wanted(gated_pair *pair) {
    const char *env = getenv("TOVL_CUDA_GATED_PAIR");
    *pair = !env || !*env || strcmp(env, "1") == 0 ? PAIR_FEW_FIRST
            : strcmp(env, "after") == 0          ? PAIR_FEW_AFTER
            : strcmp(env, "0") == 0              ? PAIR_OFF
                                                 : (gated_pair)-1;
    return *pair == (gated_pair)-1
               ? tovl_error(TOVL_ERR_INVALID_ARGUMENT, "TOVL_CUDA_GATED_PAIR='%s' is not 0, 1 or after", env)
               : TOVL_OK;
}

/* TOVL_CUDA_PDL: 0 turns programmatic dependent launch off; 1 or unset
 * leaves it on where the device and the module have it. */
static tovl_status pdl_wanted(bool *wanted) {
    const char *env = getenv("TOVL_CUDA_PDL");
    *wanted = !env || !*env || strcmp(env, "1") == 0;
    if (*wanted || strcmp(env, "0") == 0) {
        return TOVL_OK;
    }
    return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "TOVL_CUDA_PDL='%s' is not 0 or 1", env);
}

/* Whether launches get programmatic stream serialization, and why not. The
 * driver must be CUDA 12.3 or newer: that is where stream capture learned to
 * keep the programmatic edge in a graph (the only driver this has run on is
 * 13.0). */
static void choose_pdl(cuda_ctx *c, bool wanted) {
    const bool driver_has_it = c->drv.version >= 12030;
    c->pdl = wanted && c->waits && c->cc_major >= 9 && driver_has_it;
    const char *text = c->pdl           ? "on"
                       : !wanted        ? "off (TOVL_CUDA_PDL=0)"
                       : !c->waits      ? "off (another port's module, without tovl_cuda_dependent_launch)"
                       : c->cc_major < 9 ? "off (needs sm_90 or newer)"
                                        : "off (needs a CUDA 12.3 or newer driver)";
    snprintf(c->pdl_text, sizeof c->pdl_text, "%s", text);
}

/* Open on `wrap_context` (NULL: the TOVL_CUDA_DEVICE device's primary
 * context) with the module `image` (NULL: the embedded fatbin). */
static tovl_status cuda_create(CUcontext wrap_context, const void *image, size_t image_size, const char *label,
                               tovl_backend **out) {
    *out = NULL;
    bool pdl;
    gated_pair pair;
    tovl_status st = pdl_wanted(&pdl);
    if (st == TOVL_OK) {
        st = gated_pair_wanted(&pair);
    }
    if (st != TOVL_OK) {
        return st;
    }
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    }
    c->pair = pair;
    st = tovl_cuda_driver_load(&c->drv);
    if (st != TOVL_OK) {
        free(c);
        return st;
    }
    CUresult r;
    if (wrap_context) {
        c->context = wrap_context;
        r = c->drv.cuCtxPushCurrent(wrap_context);
        if (r == CUDA_SUCCESS) {
            r = c->drv.cuCtxGetDevice(&c->device);
            CUcontext popped;
            c->drv.cuCtxPopCurrent(&popped);
        }
        if (r != CUDA_SUCCESS) {
            st = tovl_cuda_fail(&c->drv, TOVL_ERR_INVALID_ARGUMENT, r, "cuda: the CUcontext to wrap");
        }
    } else {
        st = pick_device(c);
        if (st == TOVL_OK) {
            r = c->drv.cuDevicePrimaryCtxRetain(&c->context, c->device);
            if (r == CUDA_SUCCESS) {
                c->owns_primary = true;
            } else {
                c->context = NULL;
                st = tovl_cuda_fail(&c->drv, TOVL_ERR_BACKEND_UNAVAILABLE, r, "cuda: cuDevicePrimaryCtxRetain");
            }
        }
    }
    if (st == TOVL_OK) st = describe_device(c);
    bool pushed = false;
    if (st == TOVL_OK) st = ctx_enter(c, &pushed);
    if (st == TOVL_OK) {
        snprintf(c->module_text, sizeof c->module_text, "%s", label);
        r = c->drv.cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING);
        if (r != CUDA_SUCCESS) {
            c->stream = NULL;
            st = tovl_cuda_fail(&c->drv, TOVL_ERR_DEVICE, r, "cuda: cuStreamCreate");
        }
        if (st == TOVL_OK) {
            r = c->drv.cuModuleLoadData(&c->module, image);
            if (r != CUDA_SUCCESS) {
                c->module = NULL;
                /* The embedded fatbin not loading means this GPU or driver is
                 * not served by this build; a caller's image is the caller's. */
                st = tovl_cuda_fail(&c->drv, image_size ? TOVL_ERR_INVALID_ARGUMENT : TOVL_ERR_BACKEND_UNAVAILABLE, r,
                                    "cuda: cuModuleLoadData(%s) on %s", label, c->device_text);
            }
        }
        if (st == TOVL_OK) st = resolve_kernels(c);
        if (st == TOVL_OK) choose_pdl(c, pdl);
        ctx_leave(c, pushed);
    }
    if (st != TOVL_OK) {
        cuda_destroy(c);
        return st;
    }
    return tovl_backend_create(&cuda_iface, c, out);
}

/* On `context` (NULL: the TOVL_CUDA_DEVICE device's primary context) with the
 * embedded fatbin, when this build has one. */
static tovl_status open_embedded(CUcontext context, tovl_backend **out) {
#if TOVL_CUDA_HAVE_FATBIN
    return cuda_create(context, tovl_cuda_fatbin, 0, "embedded fatbin (" TOVL_CUDA_FATBIN_TARGETS ")", out);
#else
    (void)context;
    *out = NULL;
    return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "cuda backend built without its kernels: %s",
                      TOVL_CUDA_NO_FATBIN_REASON);
#endif
}

static tovl_status cuda_open(tovl_backend **out) {
    return open_embedded(NULL, out);
}

const tovl_backend_factory tovl_cuda_backend_factory = {"cuda", cuda_open};

tovl_status tovl_cuda_backend_wrap(void *cu_context, tovl_backend **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_cuda_backend_wrap: out is NULL");
    }
    *out = NULL;
    if (!cu_context) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_cuda_backend_wrap: cu_context is NULL");
    }
    return open_embedded(cu_context, out);
}

tovl_status tovl_cuda_backend_open_image(const void *image, size_t size, const char *label, tovl_backend **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_cuda_backend_open_image: out is NULL");
    }
    *out = NULL;
    label = label ? label : "caller's image";
    tovl_status st = check_image(image, size, label);
    return st == TOVL_OK ? cuda_create(NULL, image, size, label, out) : st;
}

/* ------------------------------------------------------------------------ */
static const tovl_backend_iface cuda_iface = {
    .iface_version = TOVL_BACKEND_IFACE_VERSION,
    .name = "cuda",
    .destroy = cuda_destroy,
    .device = cuda_device,
    .property = cuda_property,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .fill_u32 = cuda_fill_u32,
    .try_kernel = cuda_try_kernel,
    .launch = cuda_launch,
    .synchronize = cuda_synchronize,
    .time_kernel = cuda_time_kernel,
    .copy_bandwidth = cuda_copy_bandwidth,
    .write_async = cuda_write_async,
    .fence_record = cuda_fence_record,
    .fence_query = cuda_fence_query,
    .fence_destroy = cuda_fence_destroy,
};

static const cuda_ctx *ctx_of(const tovl_backend *backend) {
    return tovl_backend_get_iface(backend) == &cuda_iface ? tovl_backend_get_context(backend) : NULL;
}

const tovl_cuda_driver *tovl_cuda_backend_driver(const tovl_backend *backend) {
    const cuda_ctx *c = ctx_of(backend);
    return c ? &c->drv : NULL;
}

CUcontext tovl_cuda_backend_cu_context(const tovl_backend *backend) {
    const cuda_ctx *c = ctx_of(backend);
    return c ? c->context : NULL;
}

CUstream tovl_cuda_backend_stream(const tovl_backend *backend) {
    const cuda_ctx *c = ctx_of(backend);
    return c ? c->stream : NULL;
}
