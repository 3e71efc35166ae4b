/* The HIP backend on a machine without an AMD GPU: unavailable with the
 * runtime's own answer as the reason, silent, and nothing left behind. Where a
 * HIP device is present these tests skip (the conformance suite then runs the
 * kernels: test_conform_hip). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tovl/tovl.h"
#include "tovl/tovl_hip.h"

/* Open "hip" with stderr redirected to a file; returns what was written there. */
static tovl_status open_capturing_stderr(tovl_backend **be, char *captured, size_t cap) {
    fflush(stderr);
    FILE *tmp = tmpfile();
    cr_assert_not_null(tmp);
    int saved = dup(2);
    cr_assert_geq(saved, 0);
    cr_assert_geq(dup2(fileno(tmp), 2), 0);
    tovl_status st = tovl_backend_open("hip", be);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(captured, 1, cap - 1, tmp);
    captured[n] = '\0';
    fclose(tmp);
    return st;
}

static void skip_if_present(tovl_status st, tovl_backend *be) {
    if (st == TOVL_OK) {
        char device[256];
        snprintf(device, sizeof device, "%s", tovl_backend_device(be));
        tovl_backend_close(be);
        cr_skip_test("a HIP device is present (%s): the unavailable path cannot be exercised here", device);
    }
}

/* Whether this machine has a HIP runtime library at all (then the backend must
 * get as far as asking it for devices). */
static bool hip_runtime_installed(void) {
    static const char *const names[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"};
    for (size_t i = 0; i < 3; i++) {
        void *lib = dlopen(names[i], RTLD_LAZY | RTLD_LOCAL);
        if (lib) {
            dlclose(lib);
            return true;
        }
    }
    return false;
}

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int open_descriptors(void) {
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int n = 0;
    while (readdir(d)) {
        n++;
    }
    closedir(d);
    return n;
}

Test(hip, unavailable_with_the_runtime_reason_and_silent) {
    tovl_backend *be = (tovl_backend *)&be; /* poisoned: open must set NULL */
    char captured[4096];
    tovl_status st = open_capturing_stderr(&be, captured, sizeof captured);
    skip_if_present(st, be);
    cr_assert_eq(st, TOVL_ERR_BACKEND_UNAVAILABLE, "status %d: %s", (int)st, tovl_last_error());
    cr_assert_null(be);
    cr_assert_str_empty(captured, "opening hip wrote to stderr: %s", captured);
    const char *reason = tovl_last_error();
    cr_log_info("hip: %s", reason);
    cr_assert_null(strchr(reason, '\n'), "the reason is one line: %s", reason);
    if (hip_runtime_installed()) {
        /* The runtime loaded and was asked: its own error code is the reason. */
        cr_assert(starts_with(reason, "no HIP device (hipGetDeviceCount: hipError"), "reason: %s", reason);
        cr_assert_not_null(strstr(reason, "runtime libamdhip64.so"), "names the library: %s", reason);
    } else {
        cr_assert(starts_with(reason, "HIP runtime not found (libamdhip64.so"), "reason: %s", reason);
    }
}

Test(hip, failed_opens_leave_no_library_or_descriptor_behind) {
    tovl_backend *be = NULL;
    int fds_before = open_descriptors();
    for (int i = 0; i < 20; i++) {
        tovl_status st = tovl_backend_open("hip", &be);
        skip_if_present(st, be);
        cr_assert_eq(st, TOVL_ERR_BACKEND_UNAVAILABLE);
    }
    cr_assert_eq(open_descriptors(), fds_before, "20 failed opens changed the open descriptors");
    /* RTLD_NOLOAD finds the runtime only if the backend left it loaded. */
    void *still = dlopen("libamdhip64.so", RTLD_LAZY | RTLD_NOLOAD);
    if (still) {
        dlclose(still);
    }
    cr_assert_null(still, "libamdhip64.so stayed loaded after the backend found no device");
}

Test(hip, backend_list_reports_the_same_reason) {
    tovl_backend *be = NULL;
    tovl_status st = tovl_backend_open("hip", &be);
    skip_if_present(st, be);
    char reason[512];
    snprintf(reason, sizeof reason, "%s", tovl_last_error());
    size_t n = tovl_backend_list(NULL, 0);
    tovl_backend_info *infos = calloc(n, sizeof *infos);
    cr_assert_not_null(infos);
    cr_assert_eq(tovl_backend_list(infos, n), n);
    const tovl_backend_info *hip = NULL;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(infos[i].name, "hip") == 0) {
            hip = &infos[i];
        }
    }
    cr_assert_not_null(hip, "tovl_backend_list has no hip entry");
    cr_assert(hip->compiled, "this test is built only with the HIP backend");
    cr_assert_not(hip->available);
    cr_assert_str_eq(hip->reason, reason);
    free(infos);
}

Test(hip, open_device_checks_its_index_then_answers_like_open) {
    tovl_backend *be = (tovl_backend *)&be;
    cr_assert_eq(tovl_hip_backend_open_device(-1, &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert_null(be);
    cr_assert_not_null(strstr(tovl_last_error(), "device -1"), "%s", tovl_last_error());

    tovl_status st = tovl_backend_open("hip", &be);
    skip_if_present(st, be);
    char reason[512];
    snprintf(reason, sizeof reason, "%s", tovl_last_error());
    cr_assert_eq(tovl_hip_backend_open_device(0, &be), st);
    cr_assert_null(be);
    cr_assert_str_eq(tovl_last_error(), reason);
}

Test(hip, a_bad_TOVL_HIP_DEVICE_is_named) {
    cr_assert_eq(setenv("TOVL_HIP_DEVICE", "first", 1), 0);
    tovl_backend *be = (tovl_backend *)&be;
    cr_assert_eq(tovl_backend_open("hip", &be), TOVL_ERR_BACKEND_UNAVAILABLE);
    cr_assert_null(be);
    cr_assert_str_eq(tovl_last_error(), "TOVL_HIP_DEVICE='first' is not a device index");
    cr_assert_eq(setenv("TOVL_HIP_DEVICE", "-2", 1), 0);
    cr_assert_eq(tovl_backend_open("hip", &be), TOVL_ERR_BACKEND_UNAVAILABLE);
    cr_assert_str_eq(tovl_last_error(), "TOVL_HIP_DEVICE='-2' is not a device index");
}
