/* The whole conformance suite on one backend (TOVL_CONFORM_BACKEND, set by
 * CMake) against the CPU reference (its scalar loop on one thread), and
 * against the golden file shipped in the repo (the digests a CPU wrote). Skips, with the backend's own reason,
 * when the backend is not available on this machine. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"
#include "testutil.h"

/* The reference: the CPU backend at the spec's literal loop on one thread
 * (TOVL_CPU_SIMD=scalar, TOVL_CPU_THREADS=1), so the CPU backend's own fast
 * paths are checked against it too. The caller's values come back after. */
static tovl_backend *open_reference(void) {
    const char *names[2] = {"TOVL_CPU_SIMD", "TOVL_CPU_THREADS"}, *values[2] = {"scalar", "1"};
    char *saved[2];
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        saved[i] = v ? strdup(v) : NULL;
        setenv(names[i], values[i], 1);
    }
    tovl_backend *ref = NULL;
    const tovl_status st = tovl_backend_open("cpu", &ref);
    for (int i = 0; i < 2; i++) {
        if (saved[i]) {
            setenv(names[i], saved[i], 1);
        } else {
            unsetenv(names[i]);
        }
        free(saved[i]);
    }
    cr_assert_eq(st, TOVL_OK, "%s", tovl_last_error());
    cr_assert_str_eq(tovl_backend_device(ref), "host CPU (scalar, 1 thread)");
    return ref;
}

Test(conform, bit_exact_against_the_cpu_reference, .timeout = 900) {
    tovl_backend *dut = NULL, *ref = NULL;
    if (tovl_backend_open(TOVL_CONFORM_BACKEND, &dut) != TOVL_OK) {
        cr_skip_test("%s backend unavailable: %s", TOVL_CONFORM_BACKEND, tovl_last_error());
    }
    ref = open_reference();
    uint64_t seed = tu_seed();
    fprintf(stderr, "conform %s on %s against %s, seed %" PRIu64 "\n", TOVL_CONFORM_BACKEND,
            tovl_backend_device(dut), tovl_backend_device(ref), seed);
    tovl_conform_report rep = {0};
    size_t failed = tovl_conform_backend(ref, dut, seed, stderr, &rep);
    cr_expect_eq(failed, 0, "%zu conformance cases failed on %s (seed %" PRIu64 ")", failed, TOVL_CONFORM_BACKEND,
                 seed);
    cr_expect_eq(rep.count, tovl_conform_case_count());
    cr_expect_gt(rep.passed, rep.count / 2, "most cases must really run, not skip");
    tovl_conform_report_free(&rep);
    tovl_backend_close(dut);
    tovl_backend_close(ref);
}

/* The digests a CPU reference wrote into tests/golden/ (maybe on another
 * machine), without the reference's outputs: every case's SHA-256 equal. */
Test(conform, digests_match_the_shipped_golden_file, .timeout = 900) {
    tovl_backend *dut = NULL;
    if (tovl_backend_open(TOVL_CONFORM_BACKEND, &dut) != TOVL_OK) {
        cr_skip_test("%s backend unavailable: %s", TOVL_CONFORM_BACKEND, tovl_last_error());
    }
    tovl_conform_report rep = {0};
    const size_t failed = tu_conform_against_golden(NULL, dut, NULL, &rep);
    cr_expect_eq(failed, 0, "%zu cases on %s differ from %s", failed, TOVL_CONFORM_BACKEND, TU_CONFORM_GOLDEN);
    cr_expect_eq(rep.count, tovl_conform_case_count());
    cr_expect_gt(rep.passed, rep.count / 2, "most cases must really run, not skip");
    for (size_t i = 0; i < rep.count; i++) {
        cr_expect(rep.results[i].skipped || strlen(rep.results[i].sha256) == 64, "%s %s: no digest",
                  rep.results[i].kernel, rep.results[i].case_name);
    }
    tovl_conform_report_free(&rep);
    tovl_backend_close(dut);
}
