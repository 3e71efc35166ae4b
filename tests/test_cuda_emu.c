/*
 * The CUDA port's kernels (backends/cuda/token_overlay.cu) run on the host by
 * the emulation in backends/cuda/emu, launched with the CUDA backend's own
 * geometry, and checked bit for bit against the CPU reference: the whole
 * conformance suite through each lm_head variant and as the backend chooses
 * them on several device shapes, plus
 * batches that only a GPU-sized launch reaches (T = 512 over 8 slots, 2600
 * rows, 700 slots). Needs no GPU: this is how
 * the kernels' logic and dot order are verified where CI has no NVIDIA GPU.
 * Threads resume in a random order after each barrier (seeded), so a missing
 * barrier shows up as a mismatch; a cp.async lands only at its thread's
 * wait, so a missing or short wait does too.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "conform.h"
#include "cuda/emu/cuda_emu_api.h"
#include "slots_check.h"
#include "test_cuda_common.h"
#include "testutil.h"

/* The emulated backend on a device of `shape`, its lm_head launches as the
 * backend chooses them (lmhead < 0) or always as that variant. */
static tovl_backend *open_emu(const tovl_cuda_device_shape *shape, int lmhead, const char *salt) {
    tu_rng r = tu_rng_for(salt);
    tovl_backend *be = NULL;
    const tovl_status st = lmhead < 0 ? tovl_cuda_emu_backend_open(shape, tu_next(&r), &be)
                                      : tovl_cuda_emu_backend_open_variant(shape, (tovl_cuda_variant)lmhead,
                                                                           tu_next(&r), &be);
    cr_assert_eq(st, TOVL_OK, "%s", tovl_last_error());
    return be;
}

static void conform_on(const tovl_cuda_device_shape *shape, int lmhead, const char *salt) {
    tovl_backend *ref = NULL, *emu = open_emu(shape, lmhead, salt);
    cr_assert_eq(tovl_backend_open("cpu", &ref), TOVL_OK);
    tu_rng r = tu_rng_for(salt);
    uint64_t seed = tu_next(&r);
    fprintf(stderr, "conform on %s, seed %" PRIu64 "\n", tovl_backend_device(emu), seed);
    tovl_conform_report rep = {0};
    size_t failed = tovl_conform_backend(ref, emu, seed, stderr, &rep);
    cr_expect_eq(failed, 0, "%zu conformance cases failed on %s (seed %" PRIu64 ")", failed,
                 tovl_backend_device(emu), seed);
    cr_expect_eq(rep.count, tovl_conform_case_count());
    cr_expect_eq(rep.skipped, 0, "denormals are kept: no case may skip");
    cr_expect_eq(rep.passed, rep.count);
    tovl_conform_report_free(&rep);
    tovl_backend_close(emu);
    tovl_backend_close(ref);
}

/* The shipped golden file's digests (a CPU reference wrote them), on a device
 * of the H200's shape, the lm_head variants as the backend chooses them. */
Test(cuda_emu, digests_match_the_shipped_golden_file, .timeout = 900) {
    tu_expect_golden_digests(open_emu(&(tovl_cuda_device_shape){132}, -1, "cuda_emu_golden"), NULL);
}

/* Every lm_head variant through the whole suite, whatever the batch would
 * choose (the backend picks row4 and row4q for small batches, then the small
 * tiles where they give each block an SM, the large tiles beyond:
 * cuda_geometry.c). */
Test(cuda_emu, conformance_large_tiles, .timeout = 900) {
    conform_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_PLAIN, "cuda_emu_large");
}

Test(cuda_emu, conformance_small_tiles, .timeout = 900) {
    conform_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_SMALL, "cuda_emu_small");
}

Test(cuda_emu, conformance_row, .timeout = 900) {
    conform_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_ROW, "cuda_emu_row");
}

Test(cuda_emu, conformance_row2, .timeout = 900) {
    conform_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_ROW2, "cuda_emu_row2");
}

Test(cuda_emu, conformance_row4, .timeout = 900) {
    conform_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_ROW4, "cuda_emu_row4");
}

Test(cuda_emu, conformance_row4q, .timeout = 900) {
    conform_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_ROW4Q, "cuda_emu_row4q");
}

/* The backend's own choice on an H200's 132 SMs (the suite's small batches
 * take row4 or row4q) and on 1, 5 and 7 SMs (most take the tiles). */
Test(cuda_emu, conformance_as_chosen, .timeout = 900) {
    conform_on(&(tovl_cuda_device_shape){132}, -1, "cuda_emu_h200");
    conform_on(&(tovl_cuda_device_shape){1}, -1, "cuda_emu_1");
    conform_on(&(tovl_cuda_device_shape){5}, -1, "cuda_emu_5");
    conform_on(&(tovl_cuda_device_shape){7}, -1, "cuda_emu_7");
}

/* One scenario against the CPU, lm_head launched as open_emu says. */
static void batch_on(const tovl_cuda_device_shape *shape, int lmhead, const cuda_scenario *sc) {
    tovl_backend *emu = open_emu(shape, lmhead, sc->name);
    tu_rng r = tu_rng_for(sc->name);
    cuda_run_against_cpu(emu, sc, tu_next(&r));
    tovl_backend_close(emu);
}

static void batch_against_cpu(const tovl_cuda_device_shape *shape, const cuda_scenario *sc) {
    batch_on(shape, -1, sc);
}

/* The emulation's cp.async is asynchronous, as on a GPU: the destination does
 * not hold the data before the issuing thread's wait, whatever barriers come
 * between (emu_kernels.cpp's probe), so a kernel that reads its staged rows
 * before waiting for them fails the conformance runs above. */
Test(cuda_emu, cp_async_lands_at_the_issuing_threads_wait) {
    _Alignas(16) unsigned char src[16], out[32];
    tu_rng r = tu_rng_for("cuda_emu_cp_async");
    for (int i = 0; i < 16; i++) {
        src[i] = (unsigned char)(0x10 + (tu_next(&r) % 0x80)); /* never the poison byte 0xA5 */
    }
    memset(out, 0, sizeof out);
    const struct {
        uint64_t src, out;
    } args = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)out};
    cr_assert_eq(tovl_cuda_emu_launch("emu_probe_cp_async", (uint32_t[3]){1, 1, 1}, (uint32_t[3]){32, 1, 1}, &args,
                                      tu_next(&r)),
                 TOVL_OK, "%s", tovl_last_error());
    for (int i = 0; i < 16; i++) {
        cr_expect_eq(out[i], 0xA5, "byte %d before the wait: 0x%02x, expected the poison 0xa5", i, out[i]);
        cr_expect_eq(out[16 + i], src[i], "byte %d after the wait: 0x%02x, expected 0x%02x", i, out[16 + i], src[i]);
    }
}

/* The benchmark's shape: T = 512, h = 4096, 8 slots x 64 rows, on 132 SMs:
 * the large tiles, a 72 x 4 grid (two columns a block). */
Test(cuda_emu, bench_shape_t512, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"bench_t512", 512, 4096, 5000, 8, 8, 0, 1, 64, false, false});
}

/* T = 64 of the benchmark: row4q, a 64 x 16 grid. */
Test(cuda_emu, bench_shape_t64, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"bench_t64", 64, 4096, 5000, 8, 8, 0, 1, 64, false, false});
}

/* Decode steps of the benchmark's shape: row4 (T = 8: 8 x 32 blocks of four
 * warps per two overlay rows) and row4q (T = 40: 40 x 16 blocks, four overlay
 * rows each); row4q over 16 overlay rows (T = 300: 300 x 4) and the small
 * tiles there (T = 400: 58 x 2 tiles). */
Test(cuda_emu, bench_shape_t8_t40_t300_t400, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"bench_t8", 8, 4096, 5000, 8, 8, 0, 1, 64, false, false});
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"bench_t40", 40, 4096, 5000, 8, 8, 0, 1, 64, false, false});
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"bench_t300_r16", 300, 4096, 5000, 8, 8, 0, 1, 16, false, false});
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"bench_t400_r16", 400, 4096, 5000, 8, 8, 0, 1, 16, false, false});
}

/* The row variants with slots past the first 32 (whose table cells they load
 * after the row's slot rather than picking them from the early loads), odd
 * h: T = 24 takes row4 (24 x 10 blocks), T = 60 row4q (60 x 5, the last
 * block of each row with three overlay rows of four); row (90 x 5) when
 * asked for. */
Test(cuda_emu, row_variants_slots_past_32, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"row4_many_slots", 24, 130, 2000, 700, 3, 3, 256, 19, false, false});
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"row4q_many_slots", 60, 130, 2000, 700, 3, 3, 256, 19, false, false});
    batch_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_ROW,
             &(cuda_scenario){"row_many_slots", 90, 130, 2000, 700, 3, 3, 256, 19, false, false});
}

/* Rows longer than row4's staging chunk (4096 elements): h = 8200 is two
 * whole chunks and 8 elements, h = 5001 the same without 16-byte copies
 * (T = 6 x 19 rows: row4; row4q when asked for, its last block of each row
 * with three overlay rows of four). */
Test(cuda_emu, row4_rows_past_one_chunk, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"row4_h8200", 6, 8200, 3000, 8, 3, 0, 2, 19, false, false});
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"row4_h5001", 6, 5001, 3000, 8, 3, 0, 2, 19, false, false});
    batch_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_ROW4Q,
             &(cuda_scenario){"row4q_h8200", 6, 8200, 3000, 8, 3, 0, 2, 19, false, false});
    batch_on(&(tovl_cuda_device_shape){132}, TOVL_CUDA_VARIANT_ROW4Q,
             &(cuda_scenario){"row4q_h5001", 6, 5001, 3000, 8, 3, 0, 2, 19, false, false});
}

/* A long batch: 2600 rows, about 65 row groups per slot, so collecting a
 * group's rows takes up to 11 passes of 256 rows. */
Test(cuda_emu, long_batch_many_row_passes, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){4},
                      &(cuda_scenario){"long_batch", 2600, 72, 3000, 6, 5, 1, 1, 21, false, false});
}

/* max_loras 700: the tile pick walks 22 windows of 32 slots, and the slots
 * with rows (3, 259, 515) sit in windows 0, 8 and 16. */
Test(cuda_emu, slots_in_many_pick_windows, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){2},
                      &(cuda_scenario){"many_slot_windows", 300, 130, 2000, 700, 3, 3, 256, 19, false, false});
}

/* One active slot for every row (decode): one group of all rows. */
Test(cuda_emu, active_slot_large_batch, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){3},
                      &(cuda_scenario){"active", 300, 264, 4000, 4, 1, 2, 1, 40, true, false});
}

/* lm_head reading the rows the embed hook has just written (on a GPU of
 * sm_90 and newer the two launches overlap: test_cuda checks it there). */
Test(cuda_emu, lmhead_reads_the_embed_hooks_output, .timeout = 900) {
    batch_against_cpu(&(tovl_cuda_device_shape){132},
                      &(cuda_scenario){"chained", 64, 1024, 5000, 8, 8, 0, 1, 64, false, true});
}

/* Fixed-shape sets: rounds of random loads and unloads, each followed by the
 * hooks, against from_slots sets on the CPU reference: 1000 on one SM (the
 * tiles), 250 more with the row variant the small batches take. Then a
 * capacity of 160 rows, past the 64 the launch is shaped for (hooks.c), with
 * two adapters that fill it: on 132 SMs row4q's widened grid loops over the
 * columns past it; on one SM the tiles loop over theirs, and their blocks
 * past every slot's rows leave before the pick. */
static void slots_few_on(uint32_t sms, int lmhead, bool tied, uint32_t rounds, uint32_t capacity, uint32_t few_rows,
                         const char *salt) {
    const tovl_cuda_device_shape shape = {.sm_count = sms};
    tovl_backend *be = open_emu(&shape, lmhead, salt);
    slots_eager e = {.be = be};
    slots_replayer rp = slots_eager_replayer(&e);
    slots_check_rounds(
        be, &rp, &(slots_config){.rounds = rounds, .tied = tied, .capacity = capacity, .few_rows = few_rows}, salt);
    tovl_backend_close(be);
}

static void slots_on(uint32_t sms, int lmhead, bool tied, uint32_t rounds, uint32_t capacity, const char *salt) {
    slots_few_on(sms, lmhead, tied, rounds, capacity, 0, salt);
}

Test(cuda_emu, slots_in_place_as_chosen, .timeout = 900) {
    slots_on(1, -1, true, 1000, 12, "cuda_emu_slots_tied");
}

Test(cuda_emu, slots_in_place_row4q, .timeout = 900) {
    slots_on(1, TOVL_CUDA_VARIANT_ROW4Q, false, 250, 12, "cuda_emu_slots_row4q");
}

Test(cuda_emu, slots_past_the_shaped_rows_rows, .timeout = 900) {
    slots_on(132, -1, false, 40, 160, "cuda_emu_slots_shaped_rows");
}

Test(cuda_emu, slots_past_the_shaped_rows_tiles, .timeout = 900) {
    slots_on(1, -1, true, 40, 160, "cuda_emu_slots_shaped_tiles");
}

/* The gated pair (backends/cuda/launch_shape.h): on 8 SMs the slots check's
 * T = 24 shaped for 64 rows takes the large tiles, and F = 48 x 8 / 24 = 16,
 * so a capacity of 160 launches row4q_few (24 x 1 blocks, looping over the
 * columns) before the tiles' _many. Most adapters hold at most 16 rows, two
 * hold 160: from round to round the live rows choose one or the other, and
 * every replay must equal the CPU reference. */
Test(cuda_emu, slots_gated_pair, .timeout = 900) {
    tovl_lmhead_overlay_args a = {.T = 24, .h = 64, .max_loras = 4, .max_n = 160};
    tovl_cuda_launch l;
    cr_assert_eq(tovl_cuda_native_launch(TOVL_CUDA_LMHEAD_BF16, (uint32_t[3]){24, 64, 1}, &a,
                                         &(tovl_cuda_device_shape){.sm_count = 8}, &l),
                 TOVL_OK, "%s", tovl_last_error());
    cr_assert(l.variant == TOVL_CUDA_VARIANT_PLAIN_MANY && l.few_grid[0] == 24 && l.few_grid[1] == 1,
              "the pair: %s, row4q_few %u x %u", tovl_cuda_variant_names[l.variant], l.few_grid[0], l.few_grid[1]);
    slots_few_on(8, -1, false, 60, 160, 16, "cuda_emu_slots_gated_untied");
    slots_few_on(8, -1, true, 60, 160, 16, "cuda_emu_slots_gated_tied");
}
