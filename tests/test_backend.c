/* Opening backends by name, the registry's reasons, status strings, the vtable
 * checks, and mutation tests: the conformance suite must catch a port that
 * sums in another order, writes one cell too many, or ignores a skip rule. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conform.h"
#include "cpu/cpu_kernels.h"
#include "testutil.h"

Test(backend, open_by_name) {
    tovl_backend *be = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    cr_assert_str_eq(tovl_backend_name(be), "cpu");
    cr_assert_str_eq(tovl_last_error(), "", "success clears the detail");
    tovl_backend_close(be);
    cr_assert_eq(tovl_backend_open("auto", &be), TOVL_OK, "auto always finds at least the CPU");
    tovl_backend_close(be);
    cr_assert_eq(tovl_backend_open("metal", &be), TOVL_ERR_UNKNOWN_BACKEND);
    cr_assert_null(be);
    cr_assert(strstr(tovl_last_error(), "metal"), "%s", tovl_last_error());
    cr_assert_eq(tovl_backend_open(NULL, &be), TOVL_ERR_INVALID_ARGUMENT);
}

Test(backend, list_gives_a_reason_for_each_absent_backend) {
    tovl_backend_info infos[8];
    size_t n = tovl_backend_list(infos, 8);
    cr_assert_eq(n, 4);
    const char *names[4] = {"cuda", "hip", "vulkan", "cpu"};
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(infos[i].name, names[i]);
        if (infos[i].available) {
            cr_assert_neq(infos[i].device[0], 0, "%s has a device description", infos[i].name);
        } else {
            cr_assert_neq(infos[i].reason[0], 0, "%s says why it is unavailable", infos[i].name);
            tovl_backend *be = (void *)1;
            cr_assert_eq(tovl_backend_open(infos[i].name, &be), TOVL_ERR_BACKEND_UNAVAILABLE);
            cr_assert_null(be);
        }
    }
    cr_assert(infos[3].available, "the CPU reference is always there");
    cr_assert_eq(tovl_backend_list(NULL, 0), 4, "capacity 0 counts");
}

Test(backend, status_strings_are_distinct_and_named) {
    const tovl_status all[] = {TOVL_OK, TOVL_ERR_INVALID_ARGUMENT, TOVL_ERR_DUPLICATE_ID, TOVL_ERR_ID_OUT_OF_RANGE,
                               TOVL_ERR_SHAPE_MISMATCH, TOVL_ERR_VOCAB_MISMATCH, TOVL_ERR_CAPACITY, TOVL_ERR_BACKEND_UNAVAILABLE,
                               TOVL_ERR_KERNEL_MISSING, TOVL_ERR_UNSUPPORTED, TOVL_ERR_UNKNOWN_BACKEND,
                               TOVL_ERR_OUT_OF_MEMORY, TOVL_ERR_DEVICE, TOVL_ERR_LAUNCH, TOVL_ERR_IO,
                               TOVL_ERR_FORMAT, TOVL_ERR_INTERNAL};
    size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; i++) {
        cr_assert(strncmp(tovl_status_str(all[i]), "TOVL_", 5) == 0);
        for (size_t j = 0; j < i; j++) {
            cr_assert_str_neq(tovl_status_str(all[i]), tovl_status_str(all[j]));
        }
    }
    cr_assert(strstr(tovl_status_str((tovl_status)12345), "unknown"));
}

static void nop_destroy(void *ctx) {
    *(int *)ctx += 1;
}

Test(backend, create_rejects_an_incomplete_vtable_and_destroys_ctx) {
    int destroyed = 0;
    tovl_backend_iface iface = {.iface_version = 1, .name = "half", .destroy = nop_destroy};
    tovl_backend *be = (void *)1;
    cr_assert_eq(tovl_backend_create(&iface, &destroyed, &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert_null(be);
    cr_assert_eq(destroyed, 1, "ownership of ctx passes even on failure");
    cr_assert(strstr(tovl_last_error(), "half"));
}

Test(backend, memory_helpers_check_arguments) {
    tovl_backend *be = NULL;
    tovl_backend_open("cpu", &be);
    tovl_devptr p = 0;
    cr_assert_eq(tovl_alloc(be, 0, &p), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert_eq(tovl_alloc(be, 12, &p), TOVL_OK);
    cr_assert_eq(tovl_fill_u32(be, p, 7, 6), TOVL_ERR_INVALID_ARGUMENT, "not a multiple of 4");
    cr_assert_eq(tovl_fill_u32(be, p, 0x01020304u, 12), TOVL_OK);
    uint32_t got[3];
    cr_assert_eq(tovl_download(be, got, p, 12), TOVL_OK);
    cr_assert_eq(got[2], 0x01020304u);
    tovl_free(be, p);
    tovl_backend_close(be);
}

/* ---- mutation tests ---- */
static float sequential_dot(const uint16_t *x, const uint16_t *w, uint32_t h) {
    float sum = 0.0f; /* the wrong order: one running sum */
    for (uint32_t i = 0; i < h; i++) {
        sum = sum + tovl_bf16_to_f32(x[i]) * tovl_bf16_to_f32(w[i]);
    }
    return sum;
}

static float fused_dot(const uint16_t *x, const uint16_t *w, uint32_t h) {
    float p[TOVL_DOT_LANES] = {0}; /* the right order, but contracted into FMAs */
    for (uint32_t i = 0; i < h; i++) {
        p[i % TOVL_DOT_LANES] = fmaf(tovl_bf16_to_f32(x[i]), tovl_bf16_to_f32(w[i]), p[i % TOVL_DOT_LANES]);
    }
    for (int stride = TOVL_DOT_LANES / 2; stride >= 1; stride /= 2) {
        for (int l = 0; l < stride; l++) {
            p[l] = p[l] + p[l + stride];
        }
    }
    return p[0];
}

static float (*mutant_dot)(const uint16_t *, const uint16_t *, uint32_t);

static tovl_status mutant_lmhead_dot(tu_wrap *w, tovl_kernel k, const uint32_t grid[3], const void *args,
                                     size_t size, void *stream) {
    (void)w, (void)grid, (void)stream, (void)size;
    if (k != 3 && k != 4) { /* not an lm_head kernel: run it as is */
        return tovl_backend_get_iface(w->inner)->launch(tovl_backend_get_context(w->inner), k, grid, args, size,
                                                          stream);
    }
    const tovl_lmhead_overlay_args *a = args;
    const int32_t *slots = (const int32_t *)(uintptr_t)a->row_slots;
    for (uint32_t t = 0; t < a->T; t++) {
        int32_t s = slots ? slots[t] : a->active_slot;
        if (s < 0 || (uint32_t)s >= a->max_loras) continue;
        uint32_t n = ((const uint32_t *)(uintptr_t)a->n_table)[s];
        const uint32_t *ids = (const uint32_t *)(uintptr_t)((const uint64_t *)(uintptr_t)a->ids_table)[s];
        const uint16_t *rows = (const uint16_t *)(uintptr_t)((const uint64_t *)(uintptr_t)a->rows_table)[s];
        const uint16_t *x = (const uint16_t *)(uintptr_t)a->hidden + (size_t)t * a->h;
        for (uint32_t j = 0; j < n; j++) {
            if (ids[j] >= a->vocab) continue;
            float sum = mutant_dot(x, rows + (size_t)j * a->h, a->h);
            size_t cell = (size_t)t * a->ld + ids[j];
            if (k == 4) ((uint32_t *)(uintptr_t)a->logits)[cell] = tovl_cpu_f32_out_bits(sum);
            else ((uint16_t *)(uintptr_t)a->logits)[cell] = tovl_f32_to_bf16(sum);
        }
    }
    return TOVL_OK;
}

static tovl_status mutant_writes_past_the_row(tu_wrap *w, tovl_kernel k, const uint32_t grid[3], const void *args,
                                              size_t size, void *stream) {
    tovl_status st =
        tovl_backend_get_iface(w->inner)->launch(tovl_backend_get_context(w->inner), k, grid, args, size, stream);
    if (k == 2) { /* embed: scribble one element past the last row */
        const tovl_embed_overlay_args *a = args;
        ((uint16_t *)(uintptr_t)a->hidden)[(size_t)a->T * a->h] = 0x1234;
    }
    return st;
}

static tovl_status mutant_ignores_max_loras(tu_wrap *w, tovl_kernel k, const uint32_t grid[3], const void *args,
                                            size_t size, void *stream) {
    if (k == 2) { /* embed: treat slot == max_loras as slot max_loras - 1 */
        tovl_embed_overlay_args a = *(const tovl_embed_overlay_args *)args;
        int32_t *slots = (int32_t *)(uintptr_t)a.token_slots;
        for (uint32_t t = 0; slots && t < a.T; t++) {
            if (slots[t] == (int32_t)a.max_loras) slots[t] = (int32_t)a.max_loras - 1;
        }
        return tovl_backend_get_iface(w->inner)->launch(tovl_backend_get_context(w->inner), k, grid, &a, size, stream);
    }
    return tovl_backend_get_iface(w->inner)->launch(tovl_backend_get_context(w->inner), k, grid, args, size, stream);
}

static size_t failures_with(tovl_status (*mutant)(tu_wrap *, tovl_kernel, const uint32_t *, const void *, size_t,
                                                  void *),
                            const char *kernel) {
    tu_wrap *w;
    tovl_backend *dut = tu_wrap_cpu(&w);
    tovl_backend *ref = NULL;
    tovl_backend_open("cpu", &ref);
    w->launch_override = mutant;
    tovl_conform_report rep = {0};
    tovl_conform_backend(ref, dut, tu_seed(), NULL, &rep);
    size_t failed = 0;
    for (size_t i = 0; i < rep.count; i++) {
        if (!rep.results[i].passed && !rep.results[i].skipped && strstr(rep.results[i].kernel, kernel)) failed++;
    }
    tovl_conform_report_free(&rep);
    tovl_backend_close(dut);
    tovl_backend_close(ref);
    return failed;
}

Test(backend, conformance_catches_a_sequential_dot) {
    mutant_dot = sequential_dot;
    cr_assert_gt(failures_with(mutant_lmhead_dot, "lmhead"), 10);
}

Test(backend, conformance_catches_fma_contraction) {
    mutant_dot = fused_dot;
    cr_assert_gt(failures_with(mutant_lmhead_dot, "lmhead"), 0);
}

Test(backend, the_lmhead_mutant_harness_itself_conforms) {
    mutant_dot = tovl_cpu_dot_bf16; /* same harness, the spec's dot: must pass */
    cr_assert_eq(failures_with(mutant_lmhead_dot, "lmhead"), 0);
}

Test(backend, conformance_catches_a_write_past_the_output) {
    cr_assert_gt(failures_with(mutant_writes_past_the_row, "embed"), 10);
}

Test(backend, conformance_catches_an_unchecked_slot_bound) {
    cr_assert_gt(failures_with(mutant_ignores_max_loras, "embed"), 0);
}

Test(backend, conformance_passes_the_reference_against_itself) {
    tu_wrap *w;
    tovl_backend *dut = tu_wrap_cpu(&w);
    tovl_backend *ref = NULL;
    tovl_backend_open("cpu", &ref);
    tovl_conform_report rep = {0};
    cr_assert_eq(tovl_conform_backend(ref, dut, tu_seed(), NULL, &rep), 0);
    cr_assert_eq(rep.count, tovl_conform_case_count());
    cr_assert_eq(rep.passed, rep.count);
    cr_assert_gt(w->launches, 40, "the cases really launched kernels");
    tovl_conform_report_free(&rep);
    tovl_backend_close(dut);
    tovl_backend_close(ref);
}

/* Against the shipped golden file, a mutant's differing digests name their
 * buffer and, the reference here agreeing with the file, the first differing
 * cell; without a reference, the digests alone. */
Test(backend, golden_mismatch_names_the_buffer_and_its_first_cell) {
    mutant_dot = sequential_dot;
    for (int with_ref = 0; with_ref < 2; with_ref++) {
        tu_wrap *w;
        tovl_backend *dut = tu_wrap_cpu(&w), *ref = NULL;
        w->launch_override = mutant_lmhead_dot;
        if (with_ref) {
            cr_assert_eq(tovl_backend_open("cpu", &ref), TOVL_OK);
        }
        tovl_conform_report rep = {0};
        const size_t failed = tu_conform_against_golden(ref, dut, "mutant", &rep);
        cr_expect_gt(failed, 10, "a sequential dot must change many digests");
        for (size_t i = 0; i < rep.count; i++) {
            const tovl_conform_result *r = &rep.results[i];
            if (r->passed) {
                continue;
            }
            cr_expect(strstr(r->kernel, "lmhead") != NULL, "%s %s failed: %s", r->kernel, r->case_name, r->detail);
            cr_expect(strncmp(r->detail, "logits: sha256 ", 15) == 0, "%s %s: %s", r->kernel, r->case_name,
                      r->detail);
            const char *cell = strstr(r->detail, "first differing cell against this machine's CPU reference: row ");
            cr_expect(with_ref ? cell != NULL : cell == NULL, "%s %s: %s", r->kernel, r->case_name, r->detail);
        }
        tovl_conform_report_free(&rep);
        tovl_backend_close(dut);
        tovl_backend_close(ref);
    }
}

/* A golden file written from one backend's digests alone (no reference)
 * reads back and passes on another (the CPU backend opened afresh). */
Test(backend, golden_written_on_one_backend_passes_on_another) {
    tu_wrap *w;
    tovl_backend *writer = tu_wrap_cpu(&w), *reader = NULL;
    const uint64_t seed = tu_seed();
    tovl_conform_report written = {0}, read = {0};
    const tovl_conform_options alone = {.dut = writer, .seed = seed, .label = "cpu"};
    cr_assert_eq(tovl_conform_run(&alone, &written), 0);
    char path[] = "/tmp/tovl_golden_XXXXXX", err[512];
    const int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(tovl_conform_golden_write(path, seed, "cpu", &written, err, sizeof err), 0, "%s", err);
    tovl_conform_golden golden;
    cr_assert_eq(tovl_conform_golden_read(path, &golden, err, sizeof err), 0, "%s", err);
    cr_expect_eq(golden.seed, seed);
    cr_expect_str_eq(golden.backend, "cpu");
    cr_assert_eq(tovl_backend_open("cpu", &reader), TOVL_OK);
    const tovl_conform_options against = {.dut = reader, .golden = &golden};
    cr_expect_eq(tovl_conform_run(&against, &read), 0);
    cr_expect_eq(read.passed, tovl_conform_case_count());
    tovl_conform_golden_free(&golden);
    tovl_conform_report_free(&written);
    tovl_conform_report_free(&read);
    tovl_backend_close(writer);
    tovl_backend_close(reader);
    unlink(path);
}
