/* Status names and the per-thread error detail. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

#define TOVL_ERROR_DETAIL_MAX 1024

static _Thread_local char last_error[TOVL_ERROR_DETAIL_MAX];

#define TOVL_STR_(x) #x
#define TOVL_STR(x) TOVL_STR_(x)
const char *tovl_version(void) {
    return TOVL_STR(TOVL_VERSION_MAJOR) "." TOVL_STR(TOVL_VERSION_MINOR) "." TOVL_STR(TOVL_VERSION_PATCH);
}

const char *tovl_status_str(tovl_status status) {
    switch (status) {
    case TOVL_OK: return "TOVL_OK: success";
    case TOVL_ERR_INVALID_ARGUMENT: return "TOVL_ERR_INVALID_ARGUMENT: invalid argument";
    case TOVL_ERR_DUPLICATE_ID: return "TOVL_ERR_DUPLICATE_ID: duplicate token id";
    case TOVL_ERR_ID_OUT_OF_RANGE: return "TOVL_ERR_ID_OUT_OF_RANGE: token id out of range";
    case TOVL_ERR_SHAPE_MISMATCH: return "TOVL_ERR_SHAPE_MISMATCH: shape mismatch";
    case TOVL_ERR_VOCAB_MISMATCH: return "TOVL_ERR_VOCAB_MISMATCH: vocab size mismatch";
    case TOVL_ERR_CAPACITY: return "TOVL_ERR_CAPACITY: over a fixed-shape set's slot capacity";
    case TOVL_ERR_BACKEND_UNAVAILABLE: return "TOVL_ERR_BACKEND_UNAVAILABLE: backend unavailable";
    case TOVL_ERR_KERNEL_MISSING: return "TOVL_ERR_KERNEL_MISSING: kernel missing";
    case TOVL_ERR_UNSUPPORTED: return "TOVL_ERR_UNSUPPORTED: not supported by this backend";
    case TOVL_ERR_UNKNOWN_BACKEND: return "TOVL_ERR_UNKNOWN_BACKEND: unknown backend name";
    case TOVL_ERR_OUT_OF_MEMORY: return "TOVL_ERR_OUT_OF_MEMORY: out of memory";
    case TOVL_ERR_DEVICE: return "TOVL_ERR_DEVICE: device or driver error";
    case TOVL_ERR_LAUNCH: return "TOVL_ERR_LAUNCH: kernel launch failed";
    case TOVL_ERR_IO: return "TOVL_ERR_IO: file I/O error";
    case TOVL_ERR_FORMAT: return "TOVL_ERR_FORMAT: malformed file";
    case TOVL_ERR_INTERNAL: return "TOVL_ERR_INTERNAL: internal error";
    }
    return "TOVL_ERR_?: unknown status code";
}

const char *tovl_last_error(void) {
    return last_error;
}

void tovl_clear_error(void) {
    last_error[0] = '\0';
}

tovl_status tovl_error(tovl_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}
