/* The whole conformance suite on one backend (TOVL_CONFORM_BACKEND, set by
 * CMake) against the CPU reference. Skips, with the backend's own reason,
 * when the backend is not available on this machine. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>

#include "conform.h"
#include "testutil.h"

Test(conform, bit_exact_against_the_cpu_reference, .timeout = 900) {
    tovl_backend *dut = NULL, *ref = NULL;
    if (tovl_backend_open(TOVL_CONFORM_BACKEND, &dut) != TOVL_OK) {
        cr_skip_test("%s backend unavailable: %s", TOVL_CONFORM_BACKEND, tovl_last_error());
    }
    cr_assert_eq(tovl_backend_open("cpu", &ref), TOVL_OK);
    uint64_t seed = tu_seed();
    fprintf(stderr, "conform %s on %s, seed %" PRIu64 "\n", TOVL_CONFORM_BACKEND, tovl_backend_device(dut), seed);
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
