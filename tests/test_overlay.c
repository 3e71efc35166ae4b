/* build_overlay: validation with errors that name the tensor and id, nothing
 * leaked on failure, kernel requirements, the slot_map on the device. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { V = 50, HID = 8 };

static tu_wrap *w;
static tovl_backend *be;
static uint16_t rows[10 * HID];

static void setup(void) {
    be = tu_wrap_cpu(&w);
    cr_assert_not_null(be);
    tu_rng r = tu_rng_for("overlay");
    tu_fill_bf16(&r, rows, 10 * HID);
}
static void teardown(void) {
    tovl_backend_close(be);
}
TestSuite(overlay, .init = setup, .fini = teardown);

Test(overlay, duplicate_id_is_named_and_nothing_leaks) {
    uint32_t ids[3] = {4, 9, 4};
    tovl_embed_overlay *ov = (void *)1;
    tovl_status st = tu_build(be, V, HID, ids, rows, 3, false, NULL, NULL, 0, false, &ov);
    cr_assert_eq(st, TOVL_ERR_DUPLICATE_ID, "%s", tovl_status_str(st));
    cr_assert_null(ov);
    cr_assert(strstr(tovl_last_error(), "embed.weight") && strstr(tovl_last_error(), "id 4"), "detail: %s",
              tovl_last_error());
    cr_assert(strstr(tovl_last_error(), "test-adapter"), "names the adapter: %s", tovl_last_error());
    cr_assert_eq(tu_live(w), 0);
}

Test(overlay, id_out_of_range_in_lm_head_is_named) {
    uint32_t eids[1] = {1}, lids[2] = {3, V};
    tovl_embed_overlay *ov = NULL;
    tovl_status st = tu_build(be, V, HID, eids, rows, 1, true, lids, rows, 2, false, &ov);
    cr_assert_eq(st, TOVL_ERR_ID_OUT_OF_RANGE);
    cr_assert(strstr(tovl_last_error(), "lm_head.weight") && strstr(tovl_last_error(), "id 50"), "%s",
              tovl_last_error());
    cr_assert_null(ov);
    cr_assert_eq(tu_live(w), 0);
}

Test(overlay, wrong_row_width_is_named) {
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    uint32_t ids[1] = {2};
    tovl_overlay_desc d = {.adapter = "a", .vocab = V, .hidden = HID, .embed = {"emb", ids, rows, 1, HID + 1}};
    tovl_embed_overlay *ov = NULL;
    cr_assert_eq(tovl_build_overlay(be, &k, &d, &ov), TOVL_ERR_SHAPE_MISMATCH);
    cr_assert(strstr(tovl_last_error(), "emb") && strstr(tovl_last_error(), "9"), "%s", tovl_last_error());
    cr_assert_eq(w->allocs, 0, "validation happens before any device allocation");
}

Test(overlay, invalid_arguments) {
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_overlay_desc d = {.vocab = 0, .hidden = HID};
    tovl_embed_overlay *ov = NULL;
    cr_assert_eq(tovl_build_overlay(be, &k, &d, &ov), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert_eq(tovl_build_overlay(be, &k, NULL, &ov), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert_eq(tovl_build_overlay(be, &k, &d, NULL), TOVL_ERR_INVALID_ARGUMENT);
    d.vocab = V;
    d.embed.count = 2; /* rows but no pointers */
    d.embed.width = HID;
    cr_assert_eq(tovl_build_overlay(be, &k, &d, &ov), TOVL_ERR_INVALID_ARGUMENT);
}

Test(overlay, slot_map_rows_and_ids_on_the_device) {
    uint32_t ids[4] = {49, 0, 17, 3};
    uint32_t lids[2] = {5, 6};
    tovl_embed_overlay *ov = NULL;
    cr_assert_eq(tu_build(be, V, HID, ids, rows, 4, true, lids, rows + 4 * HID, 2, false, &ov), TOVL_OK, "%s",
                 tovl_last_error());
    tovl_embed_overlay_view v = tovl_embed_overlay_get_view(ov);
    cr_assert_eq(v.embed_count, 4);
    cr_assert_eq(v.lmhead_count, 2);
    int32_t map[V];
    uint16_t got_rows[4 * HID];
    uint32_t got_ids[4];
    cr_assert_eq(tovl_download(be, map, v.slot_map, sizeof map), TOVL_OK);
    cr_assert_eq(tovl_download(be, got_rows, v.embed_rows, sizeof got_rows), TOVL_OK);
    cr_assert_eq(tovl_download(be, got_ids, v.embed_ids, sizeof got_ids), TOVL_OK);
    for (uint32_t i = 0; i < V; i++) {
        int32_t want = -1;
        for (int j = 0; j < 4; j++) {
            if (ids[j] == i) want = j;
        }
        cr_assert_eq(map[i], want, "slot_map[%u]", i);
    }
    cr_assert_arr_eq(got_rows, rows, sizeof got_rows);
    cr_assert_arr_eq(got_ids, ids, sizeof got_ids);
    tovl_embed_overlay_release(ov);
    cr_assert_eq(tu_live(w), 0, "release frees every device buffer");
}

Test(overlay, every_failed_allocation_or_upload_leaks_nothing) {
    uint32_t ids[3] = {1, 2, 3}, lids[2] = {7, 8};
    for (long n = 1; n <= 8; n++) {
        for (int kind = 0; kind < 2; kind++) {
            w->alloc_calls = w->uploads = 0;
            w->fail_alloc_at = kind == 0 ? n : 0;
            w->fail_upload_at = kind == 1 ? n : 0;
            tovl_embed_overlay *ov = NULL;
            tovl_status st = tu_build(be, V, HID, ids, rows, 3, true, lids, rows, 2, false, &ov);
            if (st == TOVL_OK) {
                tovl_embed_overlay_release(ov); /* fewer operations than n */
            } else {
                cr_assert_null(ov);
                cr_assert_neq(tovl_last_error()[0], 0);
            }
            cr_assert_eq(tu_live(w), 0, "failure %s #%ld leaked", kind ? "upload" : "alloc", n);
        }
    }
    w->fail_alloc_at = w->fail_upload_at = 0;
}

/* Which kernels a given overlay needs; build must refuse and name the missing one. */
Test(overlay, refuses_when_a_needed_kernel_is_missing) {
    uint32_t ids[2] = {1, 2};
    tovl_overlay_kernels all = tovl_overlay_kernels_resolve(be);
    struct {
        const char *hide;
        bool has_lm;
        uint32_t nl;
        bool tied;
        bool refused;
    } cases[] = {
        {TOVL_KERNEL_EMBED_OVERLAY, false, 0, false, true},      /* embed rows need embed_overlay */
        {TOVL_KERNEL_LMHEAD_OVERLAY_BF16, false, 0, false, false}, /* untied embed only: no lm_head */
        {TOVL_KERNEL_LMHEAD_OVERLAY_BF16, false, 0, true, true},   /* tied: embed rows patch lm_head */
        {TOVL_KERNEL_LMHEAD_OVERLAY_F32, false, 0, true, true},
        {TOVL_KERNEL_LMHEAD_OVERLAY_F32, true, 0, true, false},    /* explicit empty lm_head under tied */
        {TOVL_KERNEL_LMHEAD_OVERLAY_F32, true, 2, false, true},    /* own lm_head rows */
        {TOVL_KERNEL_ROWDIFF, true, 2, true, false},               /* rowdiff only for full matrices */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tovl_overlay_kernels k = all;
        if (!strcmp(cases[i].hide, TOVL_KERNEL_EMBED_OVERLAY)) k.embed_overlay = 0;
        if (!strcmp(cases[i].hide, TOVL_KERNEL_LMHEAD_OVERLAY_BF16)) k.lmhead_overlay_bf16 = 0;
        if (!strcmp(cases[i].hide, TOVL_KERNEL_LMHEAD_OVERLAY_F32)) k.lmhead_overlay_f32 = 0;
        if (!strcmp(cases[i].hide, TOVL_KERNEL_ROWDIFF)) k.rowdiff = 0;
        tovl_overlay_desc d = {.adapter = "a", .vocab = V, .hidden = HID, .embed = {"emb", ids, rows, 2, HID},
                               .has_lmhead = cases[i].has_lm, .lmhead = {"lm", ids, rows, cases[i].nl, HID},
                               .tied = cases[i].tied};
        tovl_embed_overlay *ov = NULL;
        tovl_status st = tovl_build_overlay(be, &k, &d, &ov);
        if (cases[i].refused) {
            cr_assert_eq(st, TOVL_ERR_KERNEL_MISSING, "case %zu", i);
            cr_assert(strstr(tovl_last_error(), cases[i].hide), "case %zu names %s: %s", i, cases[i].hide,
                      tovl_last_error());
        } else {
            cr_assert_eq(st, TOVL_OK, "case %zu: %s", i, tovl_last_error());
        }
        tovl_embed_overlay_release(ov);
    }
    cr_assert_eq(tu_live(w), 0);
}

Test(overlay, rowdiff_returns_changed_rows_and_needs_its_kernel) {
    tu_rng r = tu_rng_for("overlay.rowdiff");
    enum { ROWS = 40 };
    uint16_t a[ROWS * HID], b[ROWS * HID];
    tu_fill_bf16(&r, a, ROWS * HID);
    memcpy(b, a, sizeof b);
    uint32_t want[ROWS], nwant = 0;
    for (uint32_t row = 0; row < ROWS; row++) {
        if (tu_below(&r, 3) == 0) {
            b[row * HID + tu_below(&r, HID)] ^= 0x0001;
            want[nwant++] = row;
        }
    }
    tovl_devptr da, db;
    cr_assert_eq(tovl_alloc(be, sizeof a, &da), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof b, &db), TOVL_OK);
    tovl_upload(be, da, a, sizeof a);
    tovl_upload(be, db, b, sizeof b);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    uint32_t changed[ROWS], n = 999;
    cr_assert_eq(tovl_rowdiff(be, &k, da, db, ROWS, HID, 0.0f, changed, &n), TOVL_OK);
    cr_assert_eq(n, nwant);
    cr_assert_arr_eq(changed, want, n * sizeof *want);
    k.rowdiff = 0;
    cr_assert_eq(tovl_rowdiff(be, &k, da, db, ROWS, HID, 0.0f, changed, &n), TOVL_ERR_KERNEL_MISSING);
    cr_assert(strstr(tovl_last_error(), "rowdiff"));
    cr_assert_eq(tovl_rowdiff(be, &k, da, db, ROWS, HID, -1.0f, changed, &n), TOVL_ERR_INVALID_ARGUMENT);
    tovl_free(be, da);
    tovl_free(be, db);
    cr_assert_eq(tu_live(w), 0);
}
