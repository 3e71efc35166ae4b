/*
 * The CUDA backend. Without a GPU: the no-driver path (unavailable, one-line
 * reason, nothing printed), argument checks, and the launch geometry. With
 * one (else skipped with the backend's reason): the device and its
 * properties, every kernel against the CPU reference on batches the
 * conformance suite does not reach, a caller's context, a module loaded from
 * a file, bad launches, and the timing members the bench uses.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_geometry.h"
#include "test_cuda_common.h"
#include "testutil.h"
#include "tovl/tovl_cuda.h"

static void redirect_output(void) {
    cr_redirect_stdout();
    cr_redirect_stderr();
}

static tovl_backend *open_cuda_or_skip(void) {
    tovl_backend *be = NULL;
    if (tovl_backend_open("cuda", &be) != TOVL_OK) {
        cr_skip_test("cuda backend unavailable: %s", tovl_last_error());
    }
    return be;
}

/* ------------------------------------------------------------------------ */
/* No driver                                                                 */
/* ------------------------------------------------------------------------ */
Test(cuda, no_driver_means_unavailable_with_a_reason_and_no_output, .init = redirect_output) {
    setenv("TOVL_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    tovl_backend *be = (tovl_backend *)&be; /* must come back NULL */
    tovl_status st = tovl_backend_open("cuda", &be);
    cr_assert_eq(st, TOVL_ERR_BACKEND_UNAVAILABLE, "got %s", tovl_status_str(st));
    cr_assert_null(be);
    char why[256];
    snprintf(why, sizeof why, "%s", tovl_last_error());
    cr_assert_gt(strlen(why), 10, "reason: '%s'", why);
    cr_assert_null(strchr(why, '\n'), "one line: '%s'", why);
    /* A build without nvcc says so; any other must have tried that library. */
    if (!strstr(why, "not built") && !strstr(why, "without its kernels")) {
        cr_assert_not_null(strstr(why, "/nonexistent/libcuda.so.1 not found"), "reason: '%s'", why);
    }
    /* Every other way in is unavailable too, and leaves *out NULL. */
    static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n";
    be = (tovl_backend *)&be;
    cr_expect_eq(tovl_cuda_backend_open_image(ptx, sizeof ptx, "ptx", &be), TOVL_ERR_BACKEND_UNAVAILABLE);
    cr_expect_null(be);
    int fake_context;
    cr_expect_eq(tovl_cuda_backend_wrap(&fake_context, &be), TOVL_ERR_BACKEND_UNAVAILABLE);
    fflush(stdout);
    fflush(stderr);
    cr_assert_stdout_eq_str("", "the backend printed to stdout");
    cr_assert_stderr_eq_str("", "the backend printed to stderr");
}

/* Whatever this machine has, opening the real driver either works or says why. */
Test(cuda, open_succeeds_or_is_unavailable, .init = redirect_output) {
    tovl_backend *be = NULL;
    tovl_status st = tovl_backend_open("cuda", &be);
    if (st == TOVL_OK) {
        cr_expect_not_null(strstr(tovl_backend_device(be), "sm_"), "device: %s", tovl_backend_device(be));
        tovl_backend_close(be);
    } else {
        cr_expect_eq(st, TOVL_ERR_BACKEND_UNAVAILABLE, "got %s: %s", tovl_status_str(st), tovl_last_error());
        cr_expect_null(be);
        cr_expect_gt(strlen(tovl_last_error()), 10);
    }
    fflush(stdout);
    fflush(stderr);
    cr_assert_stdout_eq_str("");
    cr_assert_stderr_eq_str("");
}

/* Read before the driver is loaded, so this runs on any machine. */
Test(cuda, a_bad_TOVL_CUDA_PDL_is_refused_naming_its_value) {
    setenv("TOVL_CUDA_PDL", "yes", 1);
    tovl_backend *be = (tovl_backend *)&be; /* must come back NULL */
    tovl_status st = tovl_backend_open("cuda", &be);
    if (st == TOVL_ERR_BACKEND_UNAVAILABLE && strstr(tovl_last_error(), "without its kernels")) {
        cr_skip_test("%s", tovl_last_error());
    }
    cr_expect_eq(st, TOVL_ERR_INVALID_ARGUMENT, "got %s: %s", tovl_status_str(st), tovl_last_error());
    cr_expect_not_null(strstr(tovl_last_error(), "TOVL_CUDA_PDL='yes'"), "%s", tovl_last_error());
    cr_expect_null(be);
}

Test(cuda, bad_images_and_contexts_are_refused_before_the_driver) {
    tovl_backend *be = NULL;
    cr_expect_eq(tovl_cuda_backend_open_image(NULL, 10, "none", &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_eq(tovl_cuda_backend_open_image("x", 0, "empty", &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(tovl_last_error(), "empty"), "names the image: %s", tovl_last_error());
    static const char text[4] = {'.', 'v', 'e', 'r'}; /* no NUL: not PTX */
    cr_expect_eq(tovl_cuda_backend_open_image(text, sizeof text, "unterminated", &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(tovl_last_error(), "unterminated"), "%s", tovl_last_error());
    cr_expect_null(be);
    cr_expect_eq(tovl_cuda_backend_open_image("x", 2, "x", NULL), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_eq(tovl_cuda_backend_wrap(NULL, &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_null(be);
}

/* ------------------------------------------------------------------------ */
/* Launch geometry                                                           */
/* ------------------------------------------------------------------------ */
static const tovl_cuda_device_shape h200 = {132};

Test(cuda_geometry, rowdiff_and_embed) {
    tovl_cuda_launch l;
    tovl_rowdiff_args ra = {.rows = 152064, .h = 4096};
    cr_assert_eq(tovl_cuda_native_launch(TOVL_CUDA_ROWDIFF, (uint32_t[3]){152064, 1, 1}, &ra, &h200, &l), TOVL_OK);
    cr_expect_eq(l.grid[0], 152064 / 8);
    cr_expect_eq(l.block[0], 256);
    cr_assert_eq(tovl_cuda_native_launch(TOVL_CUDA_ROWDIFF, (uint32_t[3]){97, 1, 1}, &ra, &h200, &l), TOVL_OK);
    cr_expect_eq(l.grid[0], 13, "97 rows, 8 per block");
    tovl_embed_overlay_args ea = {.T = 512, .h = 4096};
    cr_assert_eq(tovl_cuda_native_launch(TOVL_CUDA_EMBED_OVERLAY, (uint32_t[3]){512, 1, 1}, &ea, &h200, &l), TOVL_OK);
    cr_expect_eq(l.grid[0], 512);
    cr_expect_eq(l.block[0] * l.block[1] * l.block[2], 256);
}

/* The tiles: a block per (8 rows of a slot, BN overlay rows), x = ceil(T / 8)
 * + min(max_loras, T), BN = 8 for both tile variants (they differ in occupancy
 * and ring depth). The row variants: a block per (row, 4, 2 or 1 overlay
 * rows; row4 and row4q four warps for 2 and 4). */
static void expect_grid_of(const char *what, const tovl_cuda_launch *l, tovl_cuda_variant variant, uint32_t x,
                           uint32_t y, uint32_t z) {
    cr_expect(l->variant == variant, "%s: variant %s, expected %s", what, tovl_cuda_variant_names[l->variant],
              tovl_cuda_variant_names[variant]);
    cr_expect(l->grid[0] == x && l->grid[1] == y && l->grid[2] == z, "%s: grid %u x %u x %u, expected %u x %u x %u",
              what, l->grid[0], l->grid[1], l->grid[2], x, y, z);
    const bool row = variant == TOVL_CUDA_VARIANT_ROW || variant == TOVL_CUDA_VARIANT_ROW2 ||
                     variant == TOVL_CUDA_VARIANT_ROW4 || variant == TOVL_CUDA_VARIANT_ROW4Q ||
                     variant == TOVL_CUDA_VARIANT_ROW4Q_FEW;
    cr_expect_eq(l->block[0] * l->block[1] * l->block[2], row ? 128 : 256, "%s: block size", what);
}
#define expect_grid(l, variant, x, y, z) expect_grid_of(#variant, l, variant, x, y, z)

static tovl_cuda_launch lmhead_launch_at(tovl_lmhead_overlay_args *a, uint32_t T, uint32_t max_n) {
    tovl_cuda_launch l;
    a->T = T;
    a->max_n = max_n;
    cr_assert_eq(tovl_cuda_native_launch(TOVL_CUDA_LMHEAD_BF16, (uint32_t[3]){T, max_n, 1}, a, &h200, &l), TOVL_OK,
                 "%s", tovl_last_error());
    return l;
}

/* The backend's choice for the bench shape (8 slots, h = 4096) on an H200's
 * 132 SMs, and the grid it gives. */
static const struct {
    uint32_t T, max_n;
    tovl_cuda_variant variant;
    uint32_t grid[3];
    const char *why;
} lmhead_choices[] = {
    /* Large tiles: more than 3 a SM (x + max_loras / 2 groups of 8 columns
     * against 396) and each block takes two columns. */
    {512, 64, TOVL_CUDA_VARIANT_PLAIN, {72, 4, 1}, "large tiles, two columns a block"},
    {384, 64, TOVL_CUDA_VARIANT_PLAIN, {56, 4, 1}, "52 x 8 tiles: more than 396, two columns a block"},
    {352, 64, TOVL_CUDA_VARIANT_PLAIN, {52, 8, 1}, "48 x 8 tiles: at most 396, a column a block"},
    {133, 64, TOVL_CUDA_VARIANT_PLAIN, {25, 8, 1}, "past row4q: 25 x 8 small tiles would not each get an SM"},
    {800, 8, TOVL_CUDA_VARIANT_SMALL, {108, 1, 1}, "108 small tiles, one per SM"},
    {992, 8, TOVL_CUDA_VARIANT_SMALL, {132, 1, 1}, "the small tiles' last size over 8 overlay rows"},
    {400, 16, TOVL_CUDA_VARIANT_SMALL, {58, 2, 1}, "58 x 2 small tiles, one per SM"},
    {464, 16, TOVL_CUDA_VARIANT_SMALL, {66, 2, 1}, "the small tiles' last size over 16 overlay rows"},
    {529, 16, TOVL_CUDA_VARIANT_PLAIN, {75, 2, 1}, "past row4q over 16 overlay rows"},
    /* row4 (2 overlay rows a block) up to 6 cells (T x max_n) per SM (792);
     * row4q (4) up to 48 (6336), or 64 (8448) where the small tiles would
     * not each get an SM; row and row2 are never taken. */
    {1, 64, TOVL_CUDA_VARIANT_ROW4, {1, 32, 1}, "a decode step"},
    {12, 64, TOVL_CUDA_VARIANT_ROW4, {12, 32, 1}, "row4's last size"},
    {13, 64, TOVL_CUDA_VARIANT_ROW4Q, {13, 16, 1}, "past row4: row4q"},
    {64, 64, TOVL_CUDA_VARIANT_ROW4Q, {64, 16, 1}, "row4q"},
    {99, 64, TOVL_CUDA_VARIANT_ROW4Q, {99, 16, 1}, "48 cells per SM"},
    {132, 64, TOVL_CUDA_VARIANT_ROW4Q, {132, 16, 1}, "row4q's last size, 24 x 8 small tiles would not fit"},
    {300, 16, TOVL_CUDA_VARIANT_ROW4Q, {300, 4, 1}, "row4q over 16 overlay rows"},
    {465, 16, TOVL_CUDA_VARIANT_ROW4Q, {465, 4, 1}, "row4q where 67 x 2 small tiles would not each get an SM"},
    {993, 8, TOVL_CUDA_VARIANT_ROW4Q, {993, 2, 1}, "row4q where 133 small tiles would not each get an SM"},
    {3, 3, TOVL_CUDA_VARIANT_ROW4, {3, 2, 1}, "3 overlay rows: 2 columns of row4"},
    {100000, 64, TOVL_CUDA_VARIANT_PLAIN, {12508, 4, 1}, "past CUDA's x limit for the row variants"},
};

/* A fixed-shape set of capacity 256 whose launch is shaped for 64 rows
 * (kernel_args.h): the variant of 64 rows; the row variants' y widened up to
 * 4 blocks an SM (528) or the whole capacity, the tiles' y that of 64 rows. */
Test(cuda_geometry, lmhead_shaped_rows_of_a_fixed_set) {
    tovl_lmhead_overlay_args a = {.h = 4096, .max_loras = 8, .max_n = 256};
    const struct {
        uint32_t T;
        tovl_cuda_variant variant;
        uint32_t x, y;
    } want[] = {
        {1, TOVL_CUDA_VARIANT_ROW4, 1, 128},    /* 128 blocks: the whole capacity */
        {8, TOVL_CUDA_VARIANT_ROW4, 8, 66},     /* 528 / 8 */
        {64, TOVL_CUDA_VARIANT_ROW4Q, 64, 16},  /* 528 / 64 < the 16 of 64 rows */
        {512, TOVL_CUDA_VARIANT_PLAIN_MANY, 72, 4}, /* as for 64 rows, gated: row4q_few (512 x 1) first */
        {1024, TOVL_CUDA_VARIANT_PLAIN_MANY, 136, 4}, /* F = 6336 / 1024 = 6: 4 rows */
        {1600, TOVL_CUDA_VARIANT_PLAIN, 208, 4},      /* F = 3: no slot of few rows takes row4q */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        a.T = want[i].T;
        tovl_cuda_launch l;
        cr_assert_eq(tovl_cuda_native_launch(TOVL_CUDA_LMHEAD_BF16, (uint32_t[3]){a.T, 64, 1}, &a, &h200, &l), TOVL_OK,
                     "%s", tovl_last_error());
        char what[32];
        snprintf(what, sizeof what, "T = %u, capacity 256", a.T);
        expect_grid_of(what, &l, want[i].variant, want[i].x, want[i].y, 1);
        const bool paired = want[i].variant == TOVL_CUDA_VARIANT_PLAIN_MANY;
        cr_expect(paired ? l.few_grid[0] == a.T && l.few_grid[1] == 1 && l.few_grid[2] == 1 : l.few_grid[0] == 0,
                  "%s: row4q_few %u x %u x %u", what, l.few_grid[0], l.few_grid[1], l.few_grid[2]);
    }
    /* The same batch from a from_slots set of 4 rows a slot (its launch
     * shaped for what it holds): row4q alone, no pair. */
    tovl_lmhead_overlay_args b = {.T = 512, .h = 4096, .max_loras = 8, .max_n = 4};
    tovl_cuda_launch l;
    cr_assert_eq(tovl_cuda_native_launch(TOVL_CUDA_LMHEAD_BF16, (uint32_t[3]){512, 4, 1}, &b, &h200, &l), TOVL_OK);
    expect_grid(&l, TOVL_CUDA_VARIANT_ROW4Q, 512, 1, 1);
    cr_expect_eq(l.few_grid[0], 0);
}

Test(cuda_geometry, lmhead_variant_and_blocks) {
    tovl_lmhead_overlay_args a = {.h = 4096, .max_loras = 8};
    tovl_cuda_launch l;
    for (size_t i = 0; i < sizeof lmhead_choices / sizeof lmhead_choices[0]; i++) {
        l = lmhead_launch_at(&a, lmhead_choices[i].T, lmhead_choices[i].max_n);
        expect_grid_of(lmhead_choices[i].why, &l, lmhead_choices[i].variant, lmhead_choices[i].grid[0],
                       lmhead_choices[i].grid[1], lmhead_choices[i].grid[2]);
    }
    l = lmhead_launch_at(&a, 0, 64);
    cr_expect_eq(l.grid[0], 0, "nothing to launch");
    a.max_loras = 0;
    l = lmhead_launch_at(&a, 8, 64);
    cr_expect(l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0, "no slots: nothing to launch");
    /* Beyond CUDA's y limit the blocks loop over columns (two a block at
     * least: 5 groups x 65535 columns are far more than 396 tiles). */
    a.max_loras = 100000;
    l = lmhead_launch_at(&a, 8, 0xFFFFFFF0u);
    expect_grid(&l, TOVL_CUDA_VARIANT_PLAIN, 9, 32768, 1);
    /* Each variant's shape on request (the microbenchmark's TOVL_MB_FORCE). */
    a.T = 64;
    a.max_n = 64;
    a.max_loras = 8;
    cr_assert_eq(tovl_cuda_lmhead_shape(TOVL_CUDA_VARIANT_ROW, &a, &l), TOVL_OK);
    expect_grid(&l, TOVL_CUDA_VARIANT_ROW, 64, 16, 1);
    cr_assert_eq(tovl_cuda_lmhead_shape(TOVL_CUDA_VARIANT_ROW2, &a, &l), TOVL_OK);
    expect_grid(&l, TOVL_CUDA_VARIANT_ROW2, 64, 32, 1);
    cr_assert_eq(tovl_cuda_lmhead_shape(TOVL_CUDA_VARIANT_ROW4, &a, &l), TOVL_OK);
    expect_grid(&l, TOVL_CUDA_VARIANT_ROW4, 64, 32, 1);
    cr_assert_eq(tovl_cuda_lmhead_shape(TOVL_CUDA_VARIANT_ROW4Q, &a, &l), TOVL_OK);
    expect_grid(&l, TOVL_CUDA_VARIANT_ROW4Q, 64, 16, 1);
    cr_assert_eq(tovl_cuda_lmhead_shape(TOVL_CUDA_VARIANT_PLAIN, &a, &l), TOVL_OK);
    expect_grid(&l, TOVL_CUDA_VARIANT_PLAIN, 16, 8, 1);
}

Test(cuda_geometry, another_ports_convention) {
    tovl_cuda_launch l;
    const tovl_cuda_foreign_shapes plain = {TOVL_CUDA_FOREIGN_DEFAULT_SHAPE, TOVL_CUDA_FOREIGN_DEFAULT_SHAPE, 0};
    cr_assert_eq(tovl_cuda_foreign_launch(&plain, (uint32_t[3]){37, 17, 1}, &l), TOVL_OK);
    cr_expect_eq(l.grid[0], 37);
    cr_expect_eq(l.grid[1], 17);
    cr_expect_eq(l.block[0], 256);
    const tovl_cuda_foreign_shape eight_rows = {256, 1, 1, 8};
    const tovl_cuda_foreign_shapes eight = {eight_rows, eight_rows, 0};
    cr_assert_eq(tovl_cuda_foreign_shape_check("lmhead_overlay_f32_launch", &eight_rows), TOVL_OK);
    cr_assert_eq(tovl_cuda_foreign_launch(&eight, (uint32_t[3]){37, 17, 1}, &l), TOVL_OK);
    cr_expect_eq(l.grid[0], 37);
    cr_expect_eq(l.grid[1], 3, "ceil(17 / 8)");
    const tovl_cuda_foreign_shape too_big = {512, 4, 1, 1}, empty = {0, 1, 1, 1}, no_items = {64, 1, 0, 1};
    cr_expect_eq(tovl_cuda_foreign_shape_check("rowdiff_launch", &too_big), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(tovl_last_error(), "rowdiff_launch"), "%s", tovl_last_error());
    cr_expect_eq(tovl_cuda_foreign_shape_check("rowdiff_launch", &empty), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_eq(tovl_cuda_foreign_shape_check("rowdiff_launch", &no_items), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_eq(tovl_cuda_foreign_launch(&plain, (uint32_t[3]){5, 70000, 1}, &l), TOVL_ERR_UNSUPPORTED,
                 "grid.y beyond 65535");
}

/* K_launch_small: the small shape for logical grids up to its max_x points
 * in x, the other beyond (the HIP port's lm_head small-batch grid). */
Test(cuda_geometry, another_ports_small_batch_shape) {
    tovl_cuda_launch l;
    const tovl_cuda_foreign_shapes hip = {{256, 1, 1, 8}, {128, 2, 1, 1}, 2};
    cr_assert_eq(tovl_cuda_foreign_launch(&hip, (uint32_t[3]){1, 64, 1}, &l), TOVL_OK);
    cr_expect(l.grid[0] == 1 && l.grid[1] == 64 && l.block[0] == 128 && l.block[1] == 2, "T = 1: small, %u x %u",
              l.grid[0], l.grid[1]);
    cr_assert_eq(tovl_cuda_foreign_launch(&hip, (uint32_t[3]){2, 17, 1}, &l), TOVL_OK);
    cr_expect(l.grid[0] == 2 && l.grid[1] == 17 && l.block[0] == 128, "T = 2 = max_x: small");
    cr_assert_eq(tovl_cuda_foreign_launch(&hip, (uint32_t[3]){3, 17, 1}, &l), TOVL_OK);
    cr_expect(l.grid[0] == 3 && l.grid[1] == 3 && l.block[0] == 256 && l.block[1] == 1, "T = 3: the other shape");
    cr_assert_eq(tovl_cuda_foreign_launch(&hip, (uint32_t[3]){0, 17, 1}, &l), TOVL_OK);
    cr_expect_eq(l.grid[0], 0, "nothing to launch");
    const tovl_cuda_foreign_shapes none = {{256, 1, 1, 8}, {0, 0, 0, 0}, 0};
    cr_assert_eq(tovl_cuda_foreign_launch(&none, (uint32_t[3]){1, 17, 1}, &l), TOVL_OK);
    cr_expect(l.grid[1] == 3 && l.block[0] == 256, "max_x 0: never the small shape");
    const tovl_cuda_foreign_shape no_threads = {0, 1, 1, 1};
    cr_expect_eq(tovl_cuda_foreign_shape_check("lmhead_overlay_bf16_launch_small", &no_threads),
                 TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_not_null(strstr(tovl_last_error(), "lmhead_overlay_bf16_launch_small"), "%s", tovl_last_error());
}

/* ------------------------------------------------------------------------ */
/* On a GPU                                                                  */
/* ------------------------------------------------------------------------ */
Test(cuda, device_and_properties) {
    tovl_backend *be = open_cuda_or_skip();
    fprintf(stderr, "cuda device: %s\n", tovl_backend_device(be));
    cr_expect_not_null(strstr(tovl_backend_device(be), "sm_"));
    cr_expect_str_eq(tovl_backend_property(be, "subgroup_size"), "32");
    cr_expect_str_eq(tovl_backend_property(be, "f32_denormals"), "preserved");
    cr_expect_not_null(tovl_backend_property(be, "driver"));
    cr_expect_not_null(strstr(tovl_backend_property(be, "module"), "embedded fatbin"));
    cr_expect_null(tovl_backend_property(be, "no such key"));
    /* Programmatic dependent launch: on from sm_90 (kernels/common.cuh). */
    const char *cc = tovl_backend_property(be, "compute_capability");
    const char *pdl = tovl_backend_property(be, "programmatic_dependent_launch");
    cr_assert_not_null(cc);
    cr_assert_not_null(pdl);
    fprintf(stderr, "cuda compute capability %s, programmatic dependent launch %s\n", cc, pdl);
    const char *driver = tovl_backend_property(be, "driver"); /* "13.0" */
    const bool driver_has_it = atoi(driver) > 12 || (atoi(driver) == 12 && atoi(strchr(driver, '.') + 1) >= 3);
    const char *want = atoi(cc) < 9      ? "off (needs sm_90 or newer)"
                       : !driver_has_it ? "off (needs a CUDA 12.3 or newer driver)"
                                        : "on";
    cr_expect_str_eq(pdl, want);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    cr_expect(k.rowdiff && k.embed_overlay && k.lmhead_overlay_bf16 && k.lmhead_overlay_f32, "all four kernels");
    cr_expect_eq(tovl_try_kernel(be, "lmhead_overlay_f32_small"), 0, "variants are not kernels of the spec");
    cr_expect_eq(tovl_try_kernel(be, "no_such_kernel"), 0);
    tovl_backend_close(be);
}

static const cuda_scenario gpu_scenarios[] = {
    {"bench_t512", 512, 4096, 32000, 8, 8, 0, 1, 64, false, false},
    {"bench_t64", 64, 4096, 32000, 8, 8, 0, 1, 64, false, false},
    {"decode_t1", 1, 4096, 32000, 8, 8, 0, 1, 64, false, false},
    {"decode_t8", 8, 4096, 32000, 8, 8, 0, 1, 64, false, false},
    {"decode_t32", 32, 4096, 32000, 8, 8, 0, 1, 64, false, false},
    {"row4_slots_past_32", 24, 130, 2000, 700, 3, 3, 256, 19, false, false},
    {"row4q_slots_past_32", 60, 130, 2000, 700, 3, 3, 256, 19, false, false},
    {"row_slots_past_32", 90, 130, 2000, 700, 3, 3, 256, 19, false, false},
    {"h100_misaligned_rows", 333, 100, 3001, 5, 4, 0, 1, 37, false, false},
    {"long_batch", 2600, 72, 3000, 6, 5, 1, 1, 21, false, false},
    {"many_slot_windows", 450, 130, 2000, 700, 3, 3, 256, 19, false, false},
    {"active_slot", 700, 264, 4000, 4, 1, 2, 1, 40, true, false},
    {"many_rows", 40, 512, 50000, 2, 2, 0, 1, 3000, false, false},
};

Test(cuda, hooks_match_the_cpu_on_gpu_sized_batches, .timeout = 900) {
    tovl_backend *be = open_cuda_or_skip();
    tu_rng r = tu_rng_for("cuda_gpu_scenarios");
    for (size_t i = 0; i < sizeof gpu_scenarios / sizeof gpu_scenarios[0]; i++) {
        cuda_run_against_cpu(be, &gpu_scenarios[i], tu_next(&r));
    }
    tovl_backend_close(be);
}

/* Each lm_head variant the host takes on an H200-sized GPU: row4 (T = 8),
 * row4q (T = 32, 64), the small tiles (T = 400 over 16 overlay rows) and the
 * large tiles (T = 512). */
Test(cuda, each_hook_waits_for_the_kernel_before_it, .timeout = 600) {
    tovl_backend *be = open_cuda_or_skip();
    cuda_expect_hooks_wait(be);
    tovl_backend_close(be);
}

/* Plain launches (TOVL_CUDA_PDL=0) give the same bits, lm_head reading the
 * rows the embed hook has just written. */
Test(cuda, programmatic_dependent_launch_can_be_turned_off, .timeout = 600) {
    setenv("TOVL_CUDA_PDL", "0", 1);
    tovl_backend *be = open_cuda_or_skip();
    cr_expect_str_eq(tovl_backend_property(be, "programmatic_dependent_launch"), "off (TOVL_CUDA_PDL=0)");
    tu_rng r = tu_rng_for("cuda_pdl_off");
    cuda_run_against_cpu(be, &(cuda_scenario){"chained_t64", 64, 4096, 32000, 8, 8, 0, 1, 64, false, true},
                         tu_next(&r));
    tovl_backend_close(be);
}

/* rowdiff over a large pair with few differing rows, both rules, odd h. */
static void rowdiff_case(tovl_backend *cpu, tovl_backend *gpu, tu_rng *r, uint32_t rows, uint32_t h, float tol) {
    size_t n = (size_t)rows * h;
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    uint32_t *want = malloc(rows * 4), *got = malloc(rows * 4);
    cr_assert(a && b && want && got);
    tu_fill_bf16(r, a, n);
    memcpy(b, a, n * 2);
    uint32_t changed = 0;
    for (uint32_t i = 0; i < rows / 50 + 1; i++) {
        uint32_t row = tu_below(r, rows), col = tu_below(r, h);
        b[(size_t)row * h + col] ^= (uint16_t)(tu_below(r, 2) ? 0x0001 : 0x4000); /* an ulp, or far */
        changed++;
    }
    tovl_overlay_kernels kc = tovl_overlay_kernels_resolve(cpu), kg = tovl_overlay_kernels_resolve(gpu);
    tovl_devptr da, db;
    cr_assert_eq(tovl_alloc(cpu, n * 2, &da), TOVL_OK);
    cr_assert_eq(tovl_alloc(cpu, n * 2, &db), TOVL_OK);
    tovl_upload(cpu, da, a, n * 2);
    tovl_upload(cpu, db, b, n * 2);
    uint32_t n_want = 0, n_got = 0;
    cr_assert_eq(tovl_rowdiff(cpu, &kc, da, db, rows, h, tol, want, &n_want), TOVL_OK);
    tovl_free(cpu, da);
    tovl_free(cpu, db);
    cr_assert_eq(tovl_alloc(gpu, n * 2, &da), TOVL_OK);
    cr_assert_eq(tovl_alloc(gpu, n * 2, &db), TOVL_OK);
    tovl_upload(gpu, da, a, n * 2);
    tovl_upload(gpu, db, b, n * 2);
    cr_assert_eq(tovl_rowdiff(gpu, &kg, da, db, rows, h, tol, got, &n_got), TOVL_OK, "%s", tovl_last_error());
    tovl_free(gpu, da);
    tovl_free(gpu, db);
    cr_expect_gt(n_want, 0, "rows %u h %u: the reference found no difference", rows, h);
    cr_expect_eq(n_got, n_want, "rows %u h %u tol %g: %u changed rows, the reference %u", rows, h, tol, n_got, n_want);
    cr_expect_arr_eq(got, want, (n_got < n_want ? n_got : n_want) * 4);
    free(a);
    free(b);
    free(want);
    free(got);
}

Test(cuda, rowdiff_matches_the_cpu_on_large_matrices, .timeout = 900) {
    tovl_backend *gpu = open_cuda_or_skip(), *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    tu_rng r = tu_rng_for("cuda_rowdiff_large");
    rowdiff_case(cpu, gpu, &r, 20000, 4096, 0.0f);
    rowdiff_case(cpu, gpu, &r, 20000, 4096, 0.1f);
    rowdiff_case(cpu, gpu, &r, 5003, 4099, 0.0f);
    rowdiff_case(cpu, gpu, &r, 7001, 100, 0.0f);
    tovl_backend_close(cpu);
    tovl_backend_close(gpu);
}

Test(cuda, a_callers_context_can_be_wrapped) {
    tovl_backend *be = open_cuda_or_skip(), *wrapped = NULL;
    cr_assert_eq(tovl_cuda_backend_wrap(tovl_cuda_backend_cu_context(be), &wrapped), TOVL_OK, "%s", tovl_last_error());
    cr_expect_str_eq(tovl_backend_device(wrapped), tovl_backend_device(be));
    tu_rng r = tu_rng_for("cuda_wrap");
    cuda_run_against_cpu(wrapped, &gpu_scenarios[0], tu_next(&r));
    tovl_backend_close(wrapped);
    /* The wrapped context was not released: the first backend still works. */
    cuda_run_against_cpu(be, &gpu_scenarios[1], tu_next(&r));
    tovl_backend_close(be);
}

#if defined(TOVL_TEST_CUDA_FATBIN)
/* The fatbin the library embeds, loaded again from its file. */
Test(cuda, open_image_loads_a_module_from_a_file) {
    tovl_backend *be = open_cuda_or_skip();
    tovl_backend_close(be);
    FILE *f = fopen(TOVL_TEST_CUDA_FATBIN, "rb");
    cr_assert_not_null(f, "%s", TOVL_TEST_CUDA_FATBIN);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *image = malloc((size_t)size);
    cr_assert_eq(fread(image, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    cr_assert_eq(tovl_cuda_backend_open_image(image, (size_t)size, "fatbin from file", &be), TOVL_OK, "%s",
                 tovl_last_error());
    free(image); /* the module does not keep the image */
    cr_expect_str_eq(tovl_backend_property(be, "module"), "fatbin from file");
    tu_rng r = tu_rng_for("cuda_open_image");
    cuda_run_against_cpu(be, &gpu_scenarios[3], tu_next(&r));
    tovl_backend_close(be);
}
#endif

Test(cuda, bad_launches_fail_with_a_reason) {
    tovl_backend *be = open_cuda_or_skip();
    const tovl_backend_iface *iface = tovl_backend_get_iface(be);
    void *ctx = tovl_backend_get_context(be);
    tovl_rowdiff_args args = {0};
    const uint32_t grid[3] = {1, 1, 1};
    cr_expect_eq(iface->launch(ctx, 0, grid, &args, sizeof args, NULL), TOVL_ERR_LAUNCH);
    cr_expect_eq(iface->launch(ctx, 99, grid, &args, sizeof args, NULL), TOVL_ERR_LAUNCH);
    tovl_kernel k = tovl_try_kernel(be, TOVL_KERNEL_ROWDIFF);
    cr_expect_eq(iface->launch(ctx, k, grid, &args, sizeof args - 8, NULL), TOVL_ERR_LAUNCH);
    cr_expect_not_null(strstr(tovl_last_error(), "rowdiff"), "%s", tovl_last_error());
    tovl_backend_close(be);
}

/* The optional members tovl bench uses: numbers come back (no speed is
 * asserted: benchmarks measure speed, tests do not). */
Test(cuda, timing_members_return_measurements) {
    tovl_backend *be = open_cuda_or_skip();
    const tovl_backend_iface *iface = tovl_backend_get_iface(be);
    void *ctx = tovl_backend_get_context(be);
    cr_assert_not_null(iface->time_kernel);
    cr_assert_not_null(iface->copy_bandwidth);
    cuda_hook_case hc;
    tu_rng r = tu_rng_for("cuda_timing");
    cr_assert_eq(cuda_case_setup(be, &gpu_scenarios[1], tu_next(&r), &hc), TOVL_OK, "%s", tovl_last_error());
    tovl_embed_overlay_args a = {0};
    tovl_overlay_tables t = tovl_token_overlay_set_tables(hc.set);
    a = (tovl_embed_overlay_args){hc.embed.hidden, hc.embed.token_ids, hc.embed.slots, t.embed_slot_map_table,
                                  t.embed_rows_table, t.embed_n_table, hc.embed.T, hc.embed.hidden_size,
                                  tovl_token_overlay_set_vocab(hc.set), tovl_token_overlay_set_max_loras(hc.set),
                                  -1, 0};
    tovl_kernel_timing timing;
    cr_assert_eq(iface->time_kernel(ctx, hc.kernels.embed_overlay, (uint32_t[3]){a.T, 1, 1}, &a, sizeof a, 10, 5,
                                    &timing),
                 TOVL_OK, "%s", tovl_last_error());
    cr_expect_gt(timing.batched_us, 0.0);
    cr_expect_gt(timing.single_us, 0.0);
    cr_expect_eq(timing.repeats, 5);
    double gbps = 0.0;
    cr_assert_eq(iface->copy_bandwidth(ctx, 64u << 20, 3, &gbps), TOVL_OK, "%s", tovl_last_error());
    cr_expect_gt(gbps, 1.0);
    fprintf(stderr, "embed T=64: %.2f us per launch in a graph, %.2f us single; copy %.0f GB/s\n",
            timing.batched_us, timing.single_us, gbps);
    cuda_case_free(&hc);
    tovl_backend_close(be);
}
