/* The whole conformance suite on the Vulkan backend with the Khronos
 * validation layer on: bit-exact against the CPU reference AND zero
 * validation warnings or errors, counted by the backend's debug messenger.
 * CTest runs it twice on lavapipe: at its default subgroup size (8) and with
 * LP_NATIVE_VECTOR_WIDTH=128 (subgroup size 4, checked through
 * TOVL_EXPECT_LAVAPIPE_SUBGROUP). Skips only where no Vulkan device exists
 * and neither CI nor TOVL_REQUIRE_VULKAN=1 says one must. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"
#include "testutil.h"

static bool vulkan_required(void) {
    const char *ci = getenv("CI");
    const char *req = getenv("TOVL_REQUIRE_VULKAN");
    return (ci && strcmp(ci, "true") == 0) || (req && strcmp(req, "1") == 0);
}

Test(vulkan_conform, bit_exact_and_validation_clean, .timeout = 900) {
    const char *validation = getenv("TOVL_VULKAN_VALIDATION");
    cr_assert(validation && strcmp(validation, "1") == 0, "CTest must set TOVL_VULKAN_VALIDATION=1 for this test");
    tovl_backend *dut = NULL, *ref = NULL;
    if (tovl_backend_open("vulkan", &dut) != TOVL_OK) {
        if (vulkan_required()) {
            cr_assert_fail("a Vulkan device with the validation layer is required here: %s", tovl_last_error());
        }
        cr_skip_test("vulkan with validation unavailable: %s", tovl_last_error());
    }
    cr_assert_str_eq(tovl_backend_property(dut, "validation"), "on");
    const char *want_sg = getenv("TOVL_EXPECT_LAVAPIPE_SUBGROUP");
    const char *driver = tovl_backend_property(dut, "driver");
    const char *sg = tovl_backend_property(dut, "subgroup_size");
    if (want_sg && *want_sg) {
        if (!driver || !strstr(driver, "llvmpipe")) {
            tovl_backend_close(dut);
            cr_skip_test("the LP_NATIVE_VECTOR_WIDTH variant is for lavapipe; this device is %s", driver);
        }
        cr_assert_str_eq(sg, want_sg, "lavapipe subgroup size %s, this variant needs %s", sg, want_sg);
    }
    cr_assert_eq(tovl_backend_open("cpu", &ref), TOVL_OK);
    uint64_t seed = tu_seed();
    fprintf(stderr, "conform vulkan on %s (subgroup %s, denormals %s), seed %" PRIu64 "\n", tovl_backend_device(dut),
            sg, tovl_backend_property(dut, "f32_denormals"), seed);
    tovl_conform_report rep = {0};
    size_t failed = tovl_conform_backend(ref, dut, seed, stderr, &rep);
    cr_expect_eq(failed, 0, "%zu conformance cases failed on vulkan (seed %" PRIu64 ")", failed, seed);
    cr_expect_eq(rep.count, tovl_conform_case_count());
    cr_expect_gt(rep.passed, rep.count / 2, "most cases must really run, not skip");
    if (driver && strstr(driver, "llvmpipe")) {
        /* lavapipe keeps subnormals, so nothing may skip there. */
        cr_expect_eq(rep.passed, rep.count, "%zu of %zu cases skipped on lavapipe", rep.count - rep.passed,
                     rep.count);
    }
    /* Copied: the property string belongs to the backend, freed at close. */
    const char *counted = tovl_backend_property(dut, "validation_messages");
    cr_assert_not_null(counted);
    char messages[32];
    snprintf(messages, sizeof messages, "%s", counted);
    tovl_conform_report_free(&rep);
    tovl_backend_close(dut);
    tovl_backend_close(ref);
    /* After close too: destroying everything must be clean as well. The count
     * was read before close; destruction messages go to stderr and are caught
     * by the wrapped-device test's own messenger. */
    cr_expect_str_eq(messages, "0", "the validation layer reported %s warnings/errors (see stderr)", messages);
}
