/* The CPU backend: host memory as "device" memory (a device pointer is a host
 * address), kernels run synchronously at launch, on the caller and a thread
 * pool made at open, at the widest vector width the CPU has. Its one stream
 * is a lock: a launch and a stream-ordered write (a fixed-shape set's load)
 * each hold it, so a loader thread and a serving thread never see a part of
 * the other's work. It computes the
 * reference kernels' bits (cpu_kernels.h; the tests check it) and is the
 * oracle for every GPU port and the default where no GPU exists.
 *
 * TOVL_CPU_THREADS limits the threads (default: the online cores);
 * TOVL_CPU_SIMD=scalar|sse2|avx2|avx512 forces a vector width. */
#include <float.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_kernels.h"
#include "cpu_simd.h"
#include "tovl/backend.h"

typedef struct cpu_ctx {
    tovl_cpu_exec ex;
    pthread_mutex_t stream; /* held by each launch and each write_async */
    char device[96];
} cpu_ctx;

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
    cpu_ctx *c = ctx;
    if (c) {
        tovl_cpu_pool_destroy(c->ex.pool);
        pthread_mutex_destroy(&c->stream);
        free(c);
    }
}

static const char *cpu_device(void *ctx) {
    return ((const cpu_ctx *)ctx)->device;
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
    cpu_ctx *c = ctx;
    const tovl_cpu_exec *ex = &c->ex;
    (void)stream;
    (void)grid; /* the reference kernels walk the whole logical grid from args */
    if (kernel == 0 || kernel > CPU_KERNEL_COUNT) {
        return tovl_error(TOVL_ERR_LAUNCH, "cpu: launch of unknown kernel handle %llu", (unsigned long long)kernel);
    }
    if (!args || args_size != cpu_kernels[kernel - 1].args_size) {
        return tovl_error(TOVL_ERR_LAUNCH, "cpu: kernel %s expects %zu bytes of arguments, got %zu",
                          cpu_kernels[kernel - 1].name, cpu_kernels[kernel - 1].args_size, args_size);
    }
    pthread_mutex_lock(&c->stream);
    switch ((cpu_kernel_id)kernel) {
    case CPU_ROWDIFF: tovl_cpu_rowdiff_fast(ex, args); break;
    case CPU_EMBED_OVERLAY: tovl_cpu_embed_overlay(args); break;
    case CPU_LMHEAD_BF16: tovl_cpu_lmhead_overlay_fast(ex, args, false); break;
    case CPU_LMHEAD_F32: tovl_cpu_lmhead_overlay_fast(ex, args, true); break;
    }
    pthread_mutex_unlock(&c->stream);
    return TOVL_OK;
}

static tovl_status cpu_write_async(void *ctx, const tovl_device_write *writes, uint32_t count, void *stream) {
    cpu_ctx *c = ctx;
    (void)stream;
    pthread_mutex_lock(&c->stream);
    for (uint32_t i = 0; i < count; i++) {
        memcpy((void *)(uintptr_t)writes[i].dst, writes[i].src, writes[i].bytes);
    }
    pthread_mutex_unlock(&c->stream);
    return TOVL_OK;
}

static tovl_status cpu_synchronize(void *ctx, void *stream) {
    (void)ctx;
    (void)stream;
    return TOVL_OK;
}

/* ------------------------------------------------------------------------ */
/* Timing with the wall clock (CLOCK_MONOTONIC), for tovl bench.             */
/* ------------------------------------------------------------------------ */
static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* One sample of `batch` launches takes at most this long: a kernel of 0.2 s
 * (rowdiff over 152064 x 4096) is then timed one launch per sample. */
#define CPU_SAMPLE_US 250000.0

static tovl_status cpu_time_kernel(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                                   size_t args_size, uint32_t batch, uint32_t repeats, tovl_kernel_timing *out) {
    if (batch == 0 || repeats == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cpu: time_kernel needs batch and repeats >= 1");
    }
    double *samples = malloc(2 * (size_t)repeats * sizeof *samples);
    if (!samples) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cpu: out of host memory for %u timing samples", repeats);
    }
    tovl_status st = TOVL_OK;
    double t0 = now_us();
    for (int i = 0; i < 2 && st == TOVL_OK; i++) { /* warm-up: caches, pages, the pool's threads */
        st = cpu_launch(ctx, kernel, grid, args, args_size, NULL);
    }
    const double one = (now_us() - t0) / 2.0;
    if (one * batch > CPU_SAMPLE_US) {
        batch = one >= CPU_SAMPLE_US ? 1u : (uint32_t)(CPU_SAMPLE_US / one);
    }
    for (uint32_t r = 0; r < repeats && st == TOVL_OK; r++) {
        t0 = now_us();
        st = cpu_launch(ctx, kernel, grid, args, args_size, NULL);
        samples[r] = now_us() - t0;
        t0 = now_us();
        for (uint32_t b = 0; b < batch && st == TOVL_OK; b++) {
            st = cpu_launch(ctx, kernel, grid, args, args_size, NULL);
        }
        samples[repeats + r] = (now_us() - t0) / batch;
    }
    if (st == TOVL_OK) {
        out->single_us = tovl_median(samples, repeats);
        out->batched_us = tovl_median(samples + repeats, repeats);
        out->repeats = repeats;
    }
    free(samples);
    return st;
}

#define COPY_PART (8u << 20)

typedef struct copy_job {
    char *dst;
    const char *src;
    size_t bytes;
    atomic_size_t next;
} copy_job;

static void copy_parts(void *ctx, unsigned worker) {
    (void)worker;
    copy_job *j = ctx;
    for (;;) {
        const size_t lo = atomic_fetch_add_explicit(&j->next, COPY_PART, memory_order_relaxed);
        if (lo >= j->bytes) {
            return;
        }
        memcpy(j->dst + lo, j->src + lo, j->bytes - lo < COPY_PART ? j->bytes - lo : COPY_PART);
    }
}

static void copy_all(tovl_cpu_pool *pool, copy_job *j) {
    atomic_store(&j->next, 0);
    tovl_cpu_pool_run(pool, tovl_cpu_pool_threads(pool), copy_parts, j);
}

/* memcpy on every thread, 8 MB parts, counting read + written. */
static tovl_status cpu_copy_bandwidth(void *ctx, size_t bytes, uint32_t repeats, double *gbps) {
    tovl_cpu_pool *pool = ((cpu_ctx *)ctx)->ex.pool;
    copy_job j = {.bytes = bytes};
    char *dst = malloc(bytes), *src = malloc(bytes);
    double *samples = malloc((size_t)(repeats ? repeats : 1) * sizeof *samples);
    tovl_status st = TOVL_OK;
    if (!dst || !src || !samples || bytes == 0 || repeats == 0) {
        st = bytes && repeats ? tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cpu: out of host memory for 2 x %zu bytes", bytes)
                              : tovl_error(TOVL_ERR_INVALID_ARGUMENT, "cpu: copy_bandwidth needs bytes and repeats");
    } else {
        memset(src, 0x5A, bytes);
        memset(dst, 0xA5, bytes); /* every page touched before the clock runs */
        j.dst = dst;
        j.src = src;
        copy_all(pool, &j);
        for (uint32_t r = 0; r < repeats; r++) {
            const double t0 = now_us();
            copy_all(pool, &j);
            samples[r] = now_us() - t0;
        }
        *gbps = 2.0 * (double)bytes / (tovl_median(samples, repeats) * 1e-6) / 1e9;
    }
    free(dst);
    free(src);
    free(samples);
    return st;
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
    .time_kernel = cpu_time_kernel,
    .copy_bandwidth = cpu_copy_bandwidth,
    .write_async = cpu_write_async,
};

static tovl_status cpu_open(tovl_backend **out) {
    *out = NULL;
    const tovl_cpu_simd_ops *ops;
    unsigned threads;
    tovl_status st = tovl_cpu_simd_from_env(&ops);
    if (st == TOVL_OK) {
        st = tovl_cpu_threads_from_env(&threads);
    }
    if (st != TOVL_OK) {
        return st;
    }
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cpu: out of host memory");
    }
    if (pthread_mutex_init(&c->stream, NULL) != 0) {
        free(c);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "cpu: pthread_mutex_init failed");
    }
    c->ex.ops = ops;
    snprintf(c->device, sizeof c->device, "host CPU (%s, %u thread%s)", ops->name, threads, threads == 1 ? "" : "s");
    st = tovl_cpu_pool_create(threads, &c->ex.pool);
    if (st != TOVL_OK) {
        pthread_mutex_destroy(&c->stream);
        free(c);
        return st;
    }
    return tovl_backend_create(&cpu_iface, c, out);
}

const tovl_backend_factory tovl_cpu_backend_factory = {"cpu", cpu_open};
