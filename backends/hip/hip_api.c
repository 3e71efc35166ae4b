/* Loading the HIP runtime at run time: dlopen, resolve, count devices. */
#include "hip_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "tovl/backend.h"

/* The unversioned name first (what a ROCm install or -dev package links),
 * then ROCm 6's and ROCm 5's sonames. */
static const char *const hip_library_names[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"};
#define HIP_LIBRARY_COUNT (sizeof hip_library_names / sizeof hip_library_names[0])

/* The runtime is tried once per process: after a device was found it stays
 * loaded; otherwise it is unloaded and its verdict kept, since ROCm's library
 * initializers leak at every reload (valgrind: ~400 bytes per dlopen after the
 * first) and the answer does not change. */
static pthread_mutex_t hip_lock = PTHREAD_MUTEX_INITIALIZER;
static tovl_hip_api hip_loaded; /* filled once a device was found, then kept */
static bool hip_ready;
static char hip_verdict[256]; /* why the runtime is unusable, once tried */

const char *tovl_hip_error_text(const tovl_hip_api *api, hipError_t error, char *buf, size_t size) {
    const char *name = api && api->hipGetErrorName ? api->hipGetErrorName(error) : NULL;
    snprintf(buf, size, "%s (%d)", name ? name : "hipError", (int)error);
    return buf;
}

/* dlsym into a function pointer without a data/function pointer cast. */
static bool resolve(void *lib, const char *name, void *slot, size_t slot_size) {
    void *sym = dlsym(lib, name);
    if (!sym) {
        return false;
    }
    memcpy(slot, &sym, slot_size);
    return true;
}

/* Fills *api and checks for a device; on failure unloads and sets the reason. */
static tovl_status load_locked(tovl_hip_api *api) {
    memset(api, 0, sizeof *api);
    void *lib = NULL;
    char dl_reason[192] = "";
    for (size_t i = 0; i < HIP_LIBRARY_COUNT && !lib; i++) {
        lib = dlopen(hip_library_names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            api->library = hip_library_names[i];
        } else {
            const char *why = dlerror(); /* read on every failure, so none is left pending */
            if (i == 0) {
                snprintf(dl_reason, sizeof dl_reason, "%s", why ? why : "not found");
            }
        }
    }
    if (!lib) {
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "HIP runtime not found (libamdhip64.so, .so.6, .so.5): %s",
                          dl_reason);
    }
    const char *missing = NULL;
#define TOVL_HIP_RESOLVE(name, params)                                                                 \
    if (!missing && !resolve(lib, #name, &api->name, sizeof api->name)) {                              \
        missing = #name;                                                                               \
    }
    TOVL_HIP_FUNCTIONS(TOVL_HIP_RESOLVE)
    TOVL_HIP_RESOLVE(hipGetErrorName, ())
#undef TOVL_HIP_RESOLVE
    if (missing) {
        const char *library = api->library;
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "%s lacks %s: not a usable HIP runtime", library, missing);
    }
    /* hipGetDeviceCount's answer is the one that says whether there is a
     * device; hipInit's error is added when it says something else. */
    hipError_t init_error = api->hipInit(0);
    int count = 0;
    hipError_t count_error = api->hipGetDeviceCount(&count);
    if (count_error != TOVL_HIP_SUCCESS || count <= 0) {
        char count_text[96], init_text[96] = "";
        tovl_hip_error_text(api, count_error, count_text, sizeof count_text);
        if (init_error != TOVL_HIP_SUCCESS && init_error != count_error) {
            char text[80];
            snprintf(init_text, sizeof init_text, "; hipInit: %s",
                     tovl_hip_error_text(api, init_error, text, sizeof text));
        }
        const char *library = api->library;
        /* Format before dlclose: the error names live in the library. */
        tovl_status st =
            tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "no HIP device (hipGetDeviceCount: %s, %d devices%s; runtime %s)",
                       count_text, count, init_text, library);
        dlclose(lib);
        memset(api, 0, sizeof *api);
        return st;
    }
    return TOVL_OK;
}

tovl_status tovl_hip_api_load(const tovl_hip_api **api, int *device_count) {
    *api = NULL;
    *device_count = 0;
    pthread_mutex_lock(&hip_lock);
    tovl_status st = TOVL_OK;
    if (!hip_ready && hip_verdict[0]) {
        st = tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "%s", hip_verdict);
    } else if (!hip_ready) {
        st = load_locked(&hip_loaded);
        hip_ready = st == TOVL_OK;
        if (!hip_ready) {
            snprintf(hip_verdict, sizeof hip_verdict, "%s", tovl_last_error());
        }
    }
    if (st == TOVL_OK) {
        hipError_t e = hip_loaded.hipGetDeviceCount(device_count);
        if (e != TOVL_HIP_SUCCESS || *device_count <= 0) {
            char text[96];
            st = tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "no HIP device (hipGetDeviceCount: %s, %d devices)",
                            tovl_hip_error_text(&hip_loaded, e, text, sizeof text), *device_count);
            *device_count = 0;
        } else {
            *api = &hip_loaded;
        }
    }
    pthread_mutex_unlock(&hip_lock);
    return st;
}
