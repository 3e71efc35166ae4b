/*
 * Reaching into an open CUDA backend, for this backend's tests and tools
 * (graph capture needs the driver and the backend's stream). Not installed.
 */
#ifndef TOVL_CUDA_BACKEND_H
#define TOVL_CUDA_BACKEND_H

#include "cuda_driver.h"
#include "tovl/backend.h"

/* The loaded driver of a CUDA backend; NULL when `backend` is not one. */
const tovl_cuda_driver *tovl_cuda_backend_driver(const tovl_backend *backend);
/* Its CUcontext and its own stream (what a NULL stream means). */
CUcontext tovl_cuda_backend_cu_context(const tovl_backend *backend);
CUstream tovl_cuda_backend_stream(const tovl_backend *backend);

#endif /* TOVL_CUDA_BACKEND_H */
