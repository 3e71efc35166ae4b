/*
 * The slice of the HIP runtime API the backend calls, declared here so the
 * host code builds without HIP headers. The runtime (libamdhip64.so) is loaded
 * with dlopen at run time. Types, values and signatures are those of
 * hip/hip_runtime_api.h; ROCm 5 and 6 agree on every one used here.
 */
#ifndef TOVL_HIP_API_H
#define TOVL_HIP_API_H

#include <stddef.h>

#include "tovl/tovl.h"

typedef int hipError_t; /* an enum of int size in HIP */
typedef int hipDevice_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipStream_t *hipStream_t;
typedef void *hipDeviceptr_t;
typedef struct ihipEvent_t *hipEvent_t;
typedef struct ihipGraph *hipGraph_t;
typedef struct hipGraphExec *hipGraphExec_t;
typedef struct hipGraphNode *hipGraphNode_t;

#define TOVL_HIP_SUCCESS 0
#define TOVL_HIP_ERROR_OUT_OF_MEMORY 2          /* hipErrorOutOfMemory */
#define TOVL_HIP_ATTRIBUTE_WARP_SIZE 87         /* hipDeviceAttributeWarpSize */
#define TOVL_HIP_STREAM_NON_BLOCKING 1u         /* hipStreamNonBlocking */
#define TOVL_HIP_CAPTURE_MODE_THREAD_LOCAL 1    /* hipStreamCaptureModeThreadLocal */
#define TOVL_HIP_ERROR_NOT_READY 600            /* hipErrorNotReady */
#define TOVL_HIP_CAPTURE_STATUS_NONE 0          /* hipStreamCaptureStatusNone */

/* X(name, parameter list): every runtime function the backend resolves. */
#define TOVL_HIP_FUNCTIONS(X)                                                                          \
    X(hipInit, (unsigned int flags))                                                                   \
    X(hipGetDeviceCount, (int *count))                                                                 \
    X(hipSetDevice, (int device))                                                                      \
    X(hipDeviceGet, (hipDevice_t * device, int ordinal))                                               \
    X(hipDeviceGetName, (char *name, int len, hipDevice_t device))                                     \
    X(hipDeviceGetAttribute, (int *value, int attribute, int device))                                  \
    X(hipRuntimeGetVersion, (int *version))                                                            \
    X(hipMalloc, (void **ptr, size_t bytes))                                                           \
    X(hipFree, (void *ptr))                                                                            \
    X(hipMemcpyHtoD, (hipDeviceptr_t dst, void *src, size_t bytes))                                    \
    X(hipMemcpyDtoH, (void *dst, hipDeviceptr_t src, size_t bytes))                                    \
    X(hipMemsetD32, (hipDeviceptr_t dst, int value, size_t count))                                     \
    X(hipStreamSynchronize, (hipStream_t stream))                                                      \
    X(hipModuleLoadData, (hipModule_t * module, const void *image))                                    \
    X(hipModuleUnload, (hipModule_t module))                                                           \
    X(hipModuleGetFunction, (hipFunction_t * function, hipModule_t module, const char *name))          \
    X(hipModuleLaunchKernel, (hipFunction_t f, unsigned int grid_x, unsigned int grid_y,               \
                              unsigned int grid_z, unsigned int block_x, unsigned int block_y,         \
                              unsigned int block_z, unsigned int shared_bytes, hipStream_t stream,     \
                              void **kernel_params, void **extra))                                    \
    X(hipMemcpyDtoDAsync, (hipDeviceptr_t dst, hipDeviceptr_t src, size_t bytes, hipStream_t stream))   \
    X(hipStreamCreateWithFlags, (hipStream_t * stream, unsigned int flags))                            \
    X(hipStreamDestroy, (hipStream_t stream))                                                          \
    X(hipEventCreate, (hipEvent_t * event))                                                            \
    X(hipEventDestroy, (hipEvent_t event))                                                             \
    X(hipEventRecord, (hipEvent_t event, hipStream_t stream))                                          \
    X(hipEventQuery, (hipEvent_t event))                                                               \
    X(hipMemcpyHtoDAsync, (hipDeviceptr_t dst, void *src, size_t bytes, hipStream_t stream))           \
    X(hipStreamIsCapturing, (hipStream_t stream, int *status))                                         \
    X(hipEventSynchronize, (hipEvent_t event))                                                         \
    X(hipEventElapsedTime, (float *ms, hipEvent_t start, hipEvent_t stop))                             \
    X(hipStreamBeginCapture, (hipStream_t stream, int mode))                                           \
    X(hipStreamEndCapture, (hipStream_t stream, hipGraph_t * graph))                                   \
    X(hipGraphInstantiate, (hipGraphExec_t * exec, hipGraph_t graph, hipGraphNode_t * error_node,      \
                            char *log, size_t log_size))                                               \
    X(hipGraphLaunch, (hipGraphExec_t exec, hipStream_t stream))                                       \
    X(hipGraphExecDestroy, (hipGraphExec_t exec))                                                      \
    X(hipGraphDestroy, (hipGraph_t graph))

typedef struct tovl_hip_api {
    const char *library; /* the soname that opened */
#define TOVL_HIP_MEMBER(name, params) hipError_t (*name) params;
    TOVL_HIP_FUNCTIONS(TOVL_HIP_MEMBER)
#undef TOVL_HIP_MEMBER
    const char *(*hipGetErrorName)(hipError_t error);
} tovl_hip_api;

/* Load the HIP runtime (tried once per process) and count its devices. On
 * success *api is the process-wide table and *device_count > 0; the runtime
 * then stays loaded for the life of the process (ROCm's own teardown at
 * dlclose is known to crash). On failure (no library, a missing symbol, no
 * device) the library is unloaded and TOVL_ERR_BACKEND_UNAVAILABLE carries a
 * one-line reason, the same on every later call; nothing is printed.
 * Thread-safe. */
tovl_status tovl_hip_api_load(const tovl_hip_api **api, int *device_count);

/* "hipErrorNoDevice (100)" into buf; returns buf. */
const char *tovl_hip_error_text(const tovl_hip_api *api, hipError_t error, char *buf, size_t size);

#endif
