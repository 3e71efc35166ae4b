/*
 * The CUDA driver API as this backend uses it, declared here so the host code
 * builds without cuda.h: a handful of opaque handle types, the enum values we
 * pass, and one table of entry points filled at run time.
 *
 * The values and signatures are the driver's ABI (cuda.h of CUDA 12.x/13.x).
 * libcuda.so.1 is dlopen'ed and every entry point is looked up with
 * cuGetProcAddress_v2 for the CUDA 12.0 ABI, so the one binary runs with any
 * driver from 12.0 on and, where there is none, says why.
 */
#ifndef TOVL_CUDA_DRIVER_H
#define TOVL_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tovl/tovl.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
};

/* CUstreamCaptureStatus: CU_STREAM_CAPTURE_STATUS_NONE = 0. CUevent flags. */
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_EVENT_DISABLE_TIMING = 2 };

/* CUdevice_attribute values. */
enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
};

/* cuLaunchKernelEx's launch configuration (cuda.h's CUlaunchConfig,
 * CUlaunchAttribute, CUlaunchAttributeValue), with the one attribute this
 * backend sets. The layout is the driver's; the asserts pin it to cuda.h of
 * CUDA 12.x/13.x on LP64. */
enum { CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6 };
typedef union CUlaunchAttributeValue {
    char pad[64];
    void *align; /* the driver's union holds pointers */
    int programmatic_stream_serialization_allowed;
} CUlaunchAttributeValue;
typedef struct CUlaunchAttribute {
    int id; /* CU_LAUNCH_ATTRIBUTE_* */
    char pad[4];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig {
    unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
    CUstream stream;
    CUlaunchAttribute *attrs;
    unsigned int attr_count;
} CUlaunchConfig;
_Static_assert(sizeof(CUlaunchAttributeValue) == 64 && sizeof(CUlaunchAttribute) == 72 &&
                   offsetof(CUlaunchAttribute, value) == 8,
               "CUlaunchAttribute as in cuda.h");
_Static_assert(sizeof(CUlaunchConfig) == 56 && offsetof(CUlaunchConfig, stream) == 32 &&
                   offsetof(CUlaunchConfig, attrs) == 40 && offsetof(CUlaunchConfig, attr_count) == 48,
               "CUlaunchConfig as in cuda.h");

enum { CU_STREAM_NON_BLOCKING = 0x1 };
enum { CU_EVENT_DEFAULT = 0x0 };
/* CUstreamCaptureMode: only this thread's unsafe calls are checked. */
enum { CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1 };
enum { CU_GET_PROC_ADDRESS_DEFAULT = 0 };

/* The driver ABI version every entry point is requested for. */
#define TOVL_CUDA_ABI_VERSION 12000

/* X(name, return type, parameter list): every entry point the backend calls.
 * The names are the driver's base names; cuGetProcAddress maps each to the
 * variant of the ABI version above (cuMemAlloc -> cuMemAlloc_v2, ...). */
#define TOVL_CUDA_ENTRY_POINTS(X)                                                                        \
    X(cuGetErrorName, CUresult, (CUresult error, const char **str))                                      \
    X(cuGetErrorString, CUresult, (CUresult error, const char **str))                                    \
    X(cuInit, CUresult, (unsigned int flags))                                                            \
    X(cuDriverGetVersion, CUresult, (int *version))                                                      \
    X(cuDeviceGetCount, CUresult, (int *count))                                                          \
    X(cuDeviceGet, CUresult, (CUdevice * device, int ordinal))                                           \
    X(cuDeviceGetName, CUresult, (char *name, int len, CUdevice dev))                                    \
    X(cuDeviceGetAttribute, CUresult, (int *value, int attribute, CUdevice dev))                         \
    X(cuDeviceTotalMem, CUresult, (size_t * bytes, CUdevice dev))                                        \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext * ctx, CUdevice dev))                               \
    X(cuDevicePrimaryCtxRelease, CUresult, (CUdevice dev))                                               \
    X(cuCtxGetCurrent, CUresult, (CUcontext * ctx))                                                      \
    X(cuCtxPushCurrent, CUresult, (CUcontext ctx))                                                       \
    X(cuCtxPopCurrent, CUresult, (CUcontext * ctx))                                                      \
    X(cuCtxGetDevice, CUresult, (CUdevice * device))                                                     \
    X(cuModuleLoadData, CUresult, (CUmodule * module, const void *image))                                \
    X(cuModuleUnload, CUresult, (CUmodule module))                                                       \
    X(cuModuleGetFunction, CUresult, (CUfunction * fn, CUmodule module, const char *name))               \
    X(cuModuleGetGlobal, CUresult, (CUdeviceptr * ptr, size_t * bytes, CUmodule module, const char *name)) \
    X(cuMemAlloc, CUresult, (CUdeviceptr * ptr, size_t bytes))                                           \
    X(cuMemFree, CUresult, (CUdeviceptr ptr))                                                            \
    X(cuMemGetInfo, CUresult, (size_t * free, size_t *total))                                            \
    X(cuMemcpyHtoDAsync, CUresult, (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream))    \
    X(cuMemcpyDtoHAsync, CUresult, (void *dst, CUdeviceptr src, size_t bytes, CUstream stream))          \
    X(cuMemcpyDtoDAsync, CUresult, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))    \
    X(cuMemsetD32Async, CUresult, (CUdeviceptr dst, unsigned int value, size_t count, CUstream stream))  \
    X(cuStreamCreate, CUresult, (CUstream * stream, unsigned int flags))                                 \
    X(cuStreamDestroy, CUresult, (CUstream stream))                                                      \
    X(cuStreamSynchronize, CUresult, (CUstream stream))                                                  \
    X(cuStreamBeginCapture, CUresult, (CUstream stream, int mode))                                       \
    X(cuStreamEndCapture, CUresult, (CUstream stream, CUgraph * graph))                                  \
    X(cuGraphInstantiateWithFlags, CUresult, (CUgraphExec * exec, CUgraph graph, unsigned long long flags)) \
    X(cuGraphLaunch, CUresult, (CUgraphExec exec, CUstream stream))                                      \
    X(cuGraphExecDestroy, CUresult, (CUgraphExec exec))                                                  \
    X(cuGraphDestroy, CUresult, (CUgraph graph))                                                         \
    X(cuEventCreate, CUresult, (CUevent * event, unsigned int flags))                                    \
    X(cuEventRecord, CUresult, (CUevent event, CUstream stream))                                         \
    X(cuEventSynchronize, CUresult, (CUevent event))                                                     \
    X(cuEventElapsedTime, CUresult, (float *ms, CUevent start, CUevent end))                             \
    X(cuEventDestroy, CUresult, (CUevent event))                                                         \
    X(cuEventQuery, CUresult, (CUevent event))                                                           \
    X(cuStreamIsCapturing, CUresult, (CUstream stream, int *status))                                     \
    X(cuLaunchKernel, CUresult,                                                                          \
      (CUfunction fn, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
       unsigned int bz, unsigned int smem, CUstream stream, void **params, void **extra))                  \
    X(cuLaunchKernelEx, CUresult, (const CUlaunchConfig *config, CUfunction fn, void **params, void **extra))

#define TOVL_CUDA_DECLARE_MEMBER(name, ret, params) ret(*name) params;

/* The loaded driver: the library handle and one pointer per entry point. */
typedef struct tovl_cuda_driver {
    void *library; /* dlopen handle of libcuda.so.1 (RTLD_NODELETE) */
    int version;   /* cuDriverGetVersion: 13000 = CUDA 13.0 */
    TOVL_CUDA_ENTRY_POINTS(TOVL_CUDA_DECLARE_MEMBER)
} tovl_cuda_driver;

/* dlopen libcuda.so.1 (or the library the environment variable
 * TOVL_CUDA_DRIVER names, e.g. a forward-compatibility libcuda), look up every
 * entry point, cuInit(0). On failure:
 * TOVL_ERR_BACKEND_UNAVAILABLE with a one-line reason, *drv zeroed, nothing
 * held, nothing printed. */
tovl_status tovl_cuda_driver_load(tovl_cuda_driver *drv);
void tovl_cuda_driver_unload(tovl_cuda_driver *drv);

/* fn over grid x block threads on `stream`, its arguments at `params`: by
 * cuLaunchKernelEx with programmatic stream serialization when `pdl`, else
 * by cuLaunchKernel. */
CUresult tovl_cuda_launch_kernel(const tovl_cuda_driver *drv, CUfunction fn, const uint32_t grid[3],
                                 const uint32_t block[3], CUstream stream, void **params, bool pdl);

/* Set the error detail "<what>: CUDA_ERROR_X (the driver's text)" and return
 * `status`. `what` is a printf format. */
tovl_status tovl_cuda_fail(const tovl_cuda_driver *drv, tovl_status status, CUresult result, const char *what, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#endif /* TOVL_CUDA_DRIVER_H */
