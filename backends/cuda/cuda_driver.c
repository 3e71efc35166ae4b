/* Loading the CUDA driver at run time (dlopen, cuGetProcAddress, cuInit), and
 * the one way this project launches a kernel through it. */
#include "cuda_driver.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tovl/backend.h"

/* cuGetProcAddress_v2 (CUDA 12.0+): the symbol status says why a lookup failed. */
typedef CUresult (*get_proc_address_fn)(const char *symbol, void **fn, int version, uint64_t flags,
                                        int *symbol_status);

static const char *const symbol_status_text[] = {"found", "not found", "not in this driver version"};

tovl_status tovl_cuda_driver_load(tovl_cuda_driver *drv) {
    memset(drv, 0, sizeof *drv);
    const char *path = getenv("TOVL_CUDA_DRIVER");
    if (!path || !*path) {
        path = "libcuda.so.1";
    }
    dlerror();
    /* NODELETE: libcuda keeps threads and atexit handlers; it must stay mapped
     * after our dlclose even when we were its only user. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!lib) {
        const char *why = dlerror();
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "%s not found: %s", path, why ? why : "dlopen failed");
    }
    get_proc_address_fn get_proc = NULL;
    *(void **)&get_proc = dlsym(lib, "cuGetProcAddress_v2");
    if (!get_proc) {
        dlclose(lib);
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE,
                          "%s has no cuGetProcAddress_v2: the NVIDIA driver is older than CUDA 12.0", path);
    }
#define TOVL_CUDA_LOOKUP(name, ret, params)                                                                     \
    {                                                                                                           \
        int status = 1;                                                                                         \
        CUresult r = get_proc(#name, (void **)&drv->name, TOVL_CUDA_ABI_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, \
                              &status);                                                                         \
        if (r != CUDA_SUCCESS || !drv->name) {                                                                  \
            memset(drv, 0, sizeof *drv);                                                                        \
            dlclose(lib);                                                                                       \
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "%s: entry point %s %s (error %d)", path, #name,    \
                              symbol_status_text[status >= 0 && status <= 2 ? status : 1], r);                  \
        }                                                                                                       \
    }
    TOVL_CUDA_ENTRY_POINTS(TOVL_CUDA_LOOKUP)
#undef TOVL_CUDA_LOOKUP
    drv->library = lib;

    CUresult r = drv->cuInit(0);
    if (r != CUDA_SUCCESS) {
        tovl_status st = tovl_cuda_fail(drv, TOVL_ERR_BACKEND_UNAVAILABLE, r,
                                        r == CUDA_ERROR_NO_DEVICE ? "no CUDA device: cuInit" : "cuInit");
        tovl_cuda_driver_unload(drv);
        return st;
    }
    r = drv->cuDriverGetVersion(&drv->version);
    if (r != CUDA_SUCCESS) {
        tovl_status st = tovl_cuda_fail(drv, TOVL_ERR_BACKEND_UNAVAILABLE, r, "cuDriverGetVersion");
        tovl_cuda_driver_unload(drv);
        return st;
    }
    return TOVL_OK;
}

void tovl_cuda_driver_unload(tovl_cuda_driver *drv) {
    if (drv->library) {
        dlclose(drv->library);
    }
    memset(drv, 0, sizeof *drv);
}

CUresult tovl_cuda_launch_kernel(const tovl_cuda_driver *drv, CUfunction fn, const uint32_t grid[3],
                                 const uint32_t block[3], CUstream stream, void **params, bool pdl) {
    if (!pdl) {
        return drv->cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, stream, params,
                                   NULL);
    }
    CUlaunchAttribute attribute = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
    attribute.value.programmatic_stream_serialization_allowed = 1;
    const CUlaunchConfig config = {grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, stream, &attribute, 1};
    return drv->cuLaunchKernelEx(&config, fn, params, NULL);
}

tovl_status tovl_cuda_fail(const tovl_cuda_driver *drv, tovl_status status, CUresult result, const char *what, ...) {
    char where[192];
    va_list ap;
    va_start(ap, what);
    vsnprintf(where, sizeof where, what, ap);
    va_end(ap);
    const char *name = NULL, *text = NULL;
    if (drv->cuGetErrorName && drv->cuGetErrorName(result, &name) != CUDA_SUCCESS) {
        name = NULL;
    }
    if (drv->cuGetErrorString && drv->cuGetErrorString(result, &text) != CUDA_SUCCESS) {
        text = NULL;
    }
    if (name) {
        return tovl_error(status, "%s: %s (%s)", where, name, text ? text : "no description");
    }
    return tovl_error(status, "%s: CUDA error %d", where, result);
}
