/* The HIP port's kernels executed for real, on NVIDIA: token_overlay.hip,
 * compiled by nvcc through backends/hip/hip_on_cuda.h into a cubin (embedded
 * here as tovl_hip_on_cuda_image), loaded through the CUDA backend's host
 * code and run through the whole conformance suite against the CPU reference.
 * Skips with the CUDA backend's reason where there is no NVIDIA GPU.
 * TOVL_HIP_ON_CUDA_CUBIN=FILE runs a cubin of that file instead (another
 * build of the same source, e.g. with -D launch-shape overrides). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "conform.h"
#include "test_cuda_common.h"
#include "testutil.h"
#include "tovl/tovl_cuda.h"

extern const unsigned char tovl_hip_on_cuda_image[];
extern const size_t tovl_hip_on_cuda_image_size;

static const char *const kernel_names[] = {TOVL_KERNEL_ROWDIFF, TOVL_KERNEL_EMBED_OVERLAY,
                                           TOVL_KERNEL_LMHEAD_OVERLAY_BF16, TOVL_KERNEL_LMHEAD_OVERLAY_F32};

/* The bytes of `path` (malloc'd; NULL when it cannot be read) and their count. */
static void *read_whole_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    void *bytes = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (bytes = malloc((size_t)n)) != NULL &&
        fread(bytes, 1, (size_t)n, f) != (size_t)n) {
        free(bytes);
        bytes = NULL;
    }
    fclose(f);
    *size = (size_t)(n > 0 ? n : 0);
    return bytes;
}

/* The HIP port's cubin (TOVL_HIP_ON_CUDA_CUBIN's file, else the embedded
 * one) on the CUDA backend; skips where CUDA is unavailable. */
static tovl_backend *open_hip_port(void) {
    tovl_backend *dut = NULL;
    const char *file = getenv("TOVL_HIP_ON_CUDA_CUBIN");
    size_t size = tovl_hip_on_cuda_image_size;
    void *image = file && *file ? read_whole_file(file, &size) : NULL;
    cr_assert(!(file && *file) || image, "cannot read TOVL_HIP_ON_CUDA_CUBIN '%s'", file);
    tovl_status st = tovl_cuda_backend_open_image(image ? image : tovl_hip_on_cuda_image, size,
                                                  image ? file : "hip-on-cuda", &dut);
    free(image);
    if (st == TOVL_ERR_BACKEND_UNAVAILABLE) {
        cr_skip_test("CUDA unavailable, the HIP port cannot run on NVIDIA here: %s", tovl_last_error());
    }
    cr_assert_eq(st, TOVL_OK, "loading the HIP port's cubin: %s", tovl_last_error());
    return dut;
}

Test(hip_on_cuda, the_hip_port_is_bit_exact_against_the_cpu_reference, .timeout = 900) {
    tovl_backend *dut = open_hip_port(), *ref = NULL;
    for (size_t i = 0; i < sizeof kernel_names / sizeof kernel_names[0]; i++) {
        cr_assert_neq(tovl_try_kernel(dut, kernel_names[i]), 0, "the HIP port's image lacks %s", kernel_names[i]);
    }
    cr_assert_eq(tovl_backend_open("cpu", &ref), TOVL_OK);
    uint64_t seed = tu_seed();
    fprintf(stderr, "hip-on-cuda: the HIP port on %s, seed %" PRIu64 "\n", tovl_backend_device(dut), seed);
    tovl_conform_report rep = {0};
    size_t failed = tovl_conform_backend(ref, dut, seed, stderr, &rep);
    cr_expect_eq(failed, 0, "%zu conformance cases of the HIP port failed on NVIDIA (seed %" PRIu64 ")", failed, seed);
    cr_expect_eq(rep.count, tovl_conform_case_count());
    /* The port keeps denormals (nvcc -ftz=false), so no case may skip. */
    cr_expect_eq(rep.skipped, 0, "%zu cases skipped", rep.skipped);
    cr_expect_eq(rep.passed, rep.count);
    tovl_conform_report_free(&rep);
    tovl_backend_close(ref);
    /* Then against the shipped golden file's digests (a CPU reference wrote
     * them, maybe elsewhere): the same bits as every other port. One test
     * rather than two: Criterion's runner leaks 48 bytes when this file's
     * tests skip two at a time beside the PDL one (the ASan run's LSan). */
    tu_expect_golden_digests(dut, "hip-on-cuda");
}

/* Launched with programmatic dependent launch (the image defines
 * tovl_cuda_dependent_launch), each hook waits for the kernel before it. */
Test(hip_on_cuda, each_hook_waits_for_the_kernel_before_it, .timeout = 600) {
    tovl_backend *dut = open_hip_port();
    cuda_expect_hooks_wait(dut);
    tovl_backend_close(dut);
}
