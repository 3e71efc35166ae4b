/*
 * The HIP port's kernels (backends/hip/token_overlay.hip) run on the host by
 * the kernel emulation (backends/cuda/emu, with backends/hip/emu/hip_emu.h
 * for HIP's built-ins), launched with the HIP backend's own geometry, at the
 * two wavefront widths of AMD GPUs: 64 (CDNA: gfx908, gfx90a, gfx940) and 32
 * (RDNA: gfx1030, gfx1100). Each is checked bit for bit against the CPU
 * reference through the whole conformance suite and on batches of the
 * benchmark's shape. No AMD GPU exists to run the code objects; this runs the
 * port's source, its ballots and shuffles at either width, and its dot order.
 * Threads resume in a random order after each barrier (seeded), so a missing
 * barrier shows up as a mismatch.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "conform.h"
#include "hip/emu/hip_emu_api.h"
#include "hip/hip_geometry.h"
#include "hip/token_overlay_shape.h"
#include "slots_check.h"
#include "test_cuda_common.h"
#include "testutil.h"

static tovl_backend *open_emu(unsigned warp, tovl_hip_emu_lmhead lmhead, const char *salt) {
    tu_rng r = tu_rng_for(salt);
    tovl_backend *be = NULL;
    cr_assert_eq(tovl_hip_emu_backend_open(warp, lmhead, tu_next(&r), &be), TOVL_OK, "%s", tovl_last_error());
    return be;
}

/* The suite as the backend runs it (the small-batch path up to
 * TOVL_HIP_LMHEAD_SMALL_MAX_T rows, a block per token below
 * TOVL_HIP_LMHEAD_TILE_MIN_T rows, tiles from there), or with lm_head's
 * tiles, or its small-batch path, at every T. */
static void conform_at(unsigned warp, tovl_hip_emu_lmhead lmhead, const char *salt) {
    tovl_backend *ref = NULL, *emu = open_emu(warp, lmhead, salt);
    cr_assert_eq(tovl_backend_open("cpu", &ref), TOVL_OK);
    cr_assert_str_eq(tovl_backend_property(emu, "subgroup_size"), warp == 64 ? "64" : "32");
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

/* The shipped golden file's digests (a CPU reference wrote them), at wave 64
 * with lm_head as the backend chooses. */
Test(hip_emu, digests_match_the_shipped_golden_file, .timeout = 900) {
    tu_expect_golden_digests(open_emu(64, TOVL_HIP_EMU_LMHEAD_AS_CHOSEN, "hip_emu_golden"), NULL);
}

Test(hip_emu, conformance_wave64, .timeout = 900) {
    conform_at(64, TOVL_HIP_EMU_LMHEAD_AS_CHOSEN, "hip_emu_wave64");
}

Test(hip_emu, conformance_wave32, .timeout = 900) {
    conform_at(32, TOVL_HIP_EMU_LMHEAD_AS_CHOSEN, "hip_emu_wave32");
}

Test(hip_emu, conformance_wave64_lmhead_tiles, .timeout = 900) {
    conform_at(64, TOVL_HIP_EMU_LMHEAD_TILES, "hip_emu_wave64_tiles");
}

Test(hip_emu, conformance_wave64_lmhead_small, .timeout = 900) {
    conform_at(64, TOVL_HIP_EMU_LMHEAD_SMALL, "hip_emu_wave64_small");
}

Test(hip_emu, conformance_wave32_lmhead_tiles, .timeout = 900) {
    conform_at(32, TOVL_HIP_EMU_LMHEAD_TILES, "hip_emu_wave32_tiles");
}

Test(hip_emu, conformance_wave32_lmhead_small, .timeout = 900) {
    conform_at(32, TOVL_HIP_EMU_LMHEAD_SMALL, "hip_emu_wave32_small");
}

/* Batches the conformance cases do not reach, at both widths: the
 * benchmark's shape (h = 4096, 8 slots x 64 rows) at T = 1 (the small-batch
 * path), 8 and 64 (a block per token and 8 overlay rows) and 512 (tiles of one slot's rows), slots past the first 32
 * with odd h on either side of TOVL_HIP_LMHEAD_TILE_MIN_T, slots in two
 * windows of the tiles' slot count (300 slots), and one active slot. */
static void batches_at(unsigned warp) {
    static const cuda_scenario scenarios[] = {
        {"hip_bench_t1", 1, 4096, 5000, 8, 8, 0, 1, 64, false, false},
        {"hip_bench_t8", 8, 4096, 5000, 8, 8, 0, 1, 64, false, false},
        {"hip_bench_t64", 64, 4096, 5000, 8, 8, 0, 1, 64, false, false},
        {"hip_bench_t512", 512, 4096, 5000, 8, 8, 0, 1, 64, false, false},
        {"hip_slots_past_32", 40, 4099, 3001, 48, 12, 1, 4, 19, false, true},
        {"hip_slots_past_32_tiles", 300, 4099, 3001, 48, 12, 1, 4, 19, false, true},
        {"hip_two_slot_windows", 600, 260, 4000, 300, 280, 3, 1, 3, false, false},
        {"hip_active_slot", 300, 1000, 2000, 4, 1, 2, 1, 9, true, false},
    };
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        tovl_backend *emu = open_emu(warp, TOVL_HIP_EMU_LMHEAD_AS_CHOSEN, scenarios[i].name);
        tu_rng r = tu_rng_for(scenarios[i].name);
        cuda_run_against_cpu(emu, &scenarios[i], tu_next(&r));
        tovl_backend_close(emu);
    }
}

Test(hip_emu, batches_wave64, .timeout = 900) {
    batches_at(64);
}

Test(hip_emu, batches_wave32, .timeout = 900) {
    batches_at(32);
}

/* A 32-bit CUDA mask in a 64-wide warp is refused, and so is a width other
 * than 32 or 64: the emulation cannot silently run a kernel at a width it
 * does not model. */
Test(hip_emu, refuses_other_widths) {
    tovl_backend *be = NULL;
    cr_assert_eq(tovl_hip_emu_backend_open(16, TOVL_HIP_EMU_LMHEAD_AS_CHOSEN, 1, &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert_null(be);
    cr_assert(strstr(tovl_last_error(), "16") != NULL, "%s", tovl_last_error());
    const uint32_t grid[3] = {1, 1, 1}, block[3] = {256, 1, 1};
    tovl_rowdiff_args a = {0};
    cr_assert_eq(tovl_hip_emu_launch("rowdiff", grid, block, &a, 1, 48, false), TOVL_ERR_LAUNCH);
    cr_assert_eq(tovl_hip_emu_launch("no_such_kernel", grid, block, &a, 1, 64, false), TOVL_ERR_LAUNCH);
    cr_assert(strstr(tovl_last_error(), "no_such_kernel") != NULL, "%s", tovl_last_error());
}

/* Fixed-shape sets: rounds of random loads and unloads, each followed by the
 * hooks, against from_slots sets on the CPU reference: 1000 at wave 64, 250
 * more at wave 32. */
static void slots_on(unsigned warp, tovl_hip_emu_lmhead lmhead, bool tied, uint32_t rounds, uint32_t capacity,
                     const char *salt) {
    tovl_backend *be = open_emu(warp, lmhead, salt);
    slots_eager e = {.be = be};
    slots_replayer rp = slots_eager_replayer(&e);
    slots_check_rounds(be, &rp, &(slots_config){.rounds = rounds, .tied = tied, .capacity = capacity}, salt);
    tovl_backend_close(be);
}

Test(hip_emu, slots_in_place_wave64, .timeout = 900) {
    slots_on(64, TOVL_HIP_EMU_LMHEAD_AS_CHOSEN, true, 1000, 12, "hip_emu_slots_wave64");
}

Test(hip_emu, slots_in_place_wave32, .timeout = 900) {
    slots_on(32, TOVL_HIP_EMU_LMHEAD_AS_CHOSEN, false, 250, 12, "hip_emu_slots_wave32");
}

/* A capacity of 160 rows, two adapters filling it, past the 64 rows the
 * launch is shaped for: the tiles' and the rows' grids cover 64 (8 columns)
 * and their blocks loop over the columns past it; the tiles' blocks past
 * every slot's rows leave before the pass over the row slots. The small-batch
 * grid covers the 160. */
Test(hip_emu, slots_capacity_160_tiles, .timeout = 900) {
    slots_on(64, TOVL_HIP_EMU_LMHEAD_TILES, false, 30, 160, "hip_emu_slots_tiles_160");
}

Test(hip_emu, slots_capacity_160_rows, .timeout = 900) {
    slots_on(32, TOVL_HIP_EMU_LMHEAD_AS_CHOSEN, true, 16, 160, "hip_emu_slots_rows_160");
}

Test(hip_emu, slots_capacity_160_small, .timeout = 900) {
    slots_on(64, TOVL_HIP_EMU_LMHEAD_SMALL, false, 12, 160, "hip_emu_slots_small_160");
}

/* The grids a fixed-shape set's launch gets (capacity 256, shaped for 64
 * rows) beside a from_slots set's of 64 rows: the same but for the
 * small-batch grid, which covers max_n so the kernel can tell it by its
 * height (token_overlay.hip, lmhead_small_grid). */
Test(hip_emu, geometry_of_a_fixed_shape_set) {
    tovl_lmhead_overlay_args fixed = {.h = 4096, .max_loras = 8, .max_n = 256}, from = fixed;
    from.max_n = 64;
    const uint32_t Ts[] = {1, 4, 5, 64, 512};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        uint32_t bf[3], bs[3];
        fixed.T = from.T = Ts[i];
        cr_assert_eq(tovl_hip_blocks(TOVL_HIP_LMHEAD_BF16, (uint32_t[3]){Ts[i], 64, 1}, &fixed, bf), TOVL_OK);
        cr_assert_eq(tovl_hip_blocks(TOVL_HIP_LMHEAD_BF16, (uint32_t[3]){Ts[i], 64, 1}, &from, bs), TOVL_OK);
        const bool small = Ts[i] <= TOVL_HIP_LMHEAD_SMALL_MAX_T;
        cr_expect(bf[0] == Ts[i] && bf[1] == (small ? 256u / TOVL_HIP_LMHEAD_SMALL_ROWS : 8u) && bf[2] == 1,
                  "T = %u, capacity 256: %u x %u x %u", Ts[i], bf[0], bf[1], bf[2]);
        cr_expect(bs[0] == Ts[i] && bs[1] == (small ? 64u / TOVL_HIP_LMHEAD_SMALL_ROWS : 8u) && bs[2] == 1,
                  "T = %u, 64 rows: %u x %u x %u", Ts[i], bs[0], bs[1], bs[2]);
    }
}
