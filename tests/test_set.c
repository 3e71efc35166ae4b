/* TokenOverlaySet: the device tables cell by cell for a pool mixing every kind
 * of slot, tied and untied; vocab / hidden mismatches; lifetime. */
#include <criterion/criterion.h>
#include <string.h>

#include "testutil.h"

enum { V = 64, HID = 16, MAXL = 7 };

static tu_wrap *w;
static tovl_backend *be;
static uint16_t rows[8 * HID];
static uint32_t e_ids[3] = {5, 9, 63}, l_ids[2] = {1, 2};

static void setup(void) {
    be = tu_wrap_cpu(&w);
    tu_rng r = tu_rng_for("set");
    tu_fill_bf16(&r, rows, 8 * HID);
}
static void teardown(void) {
    tovl_backend_close(be);
}
TestSuite(set, .init = setup, .fini = teardown);

/* slot 0 empty, 1 embed-only, 2 lm_head-only, 3 both, 4 explicit-empty
 * lm_head, 5 empty, 6 embed-only */
static void build_pool(tovl_embed_overlay *ov[MAXL], bool tied) {
    memset(ov, 0, sizeof(tovl_embed_overlay *) * MAXL);
    cr_assert_eq(tu_build(be, V, HID, e_ids, rows, 3, false, NULL, NULL, 0, tied, &ov[1]), TOVL_OK);
    cr_assert_eq(tu_build(be, V, HID, NULL, NULL, 0, true, l_ids, rows + 3 * HID, 2, tied, &ov[2]), TOVL_OK);
    cr_assert_eq(tu_build(be, V, HID, e_ids, rows, 3, true, l_ids, rows + 3 * HID, 2, tied, &ov[3]), TOVL_OK);
    cr_assert_eq(tu_build(be, V, HID, e_ids, rows, 2, true, NULL, NULL, 0, tied, &ov[4]), TOVL_OK);
    cr_assert_eq(tu_build(be, V, HID, e_ids + 1, rows + HID, 1, false, NULL, NULL, 0, tied, &ov[6]), TOVL_OK);
}

static void check_tables(bool tied) {
    tovl_embed_overlay *ov[MAXL];
    build_pool(ov, tied);
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, ov, MAXL, tied, &set), TOVL_OK, "%s", tovl_last_error());
    tovl_overlay_tables t = tovl_token_overlay_set_tables(set);
    uint64_t maps[MAXL], erows[MAXL], lrows[MAXL], lids[MAXL];
    uint32_t en[MAXL], nov[MAXL];
    tovl_download(be, maps, t.embed_slot_map_table, sizeof maps);
    tovl_download(be, erows, t.embed_rows_table, sizeof erows);
    tovl_download(be, en, t.embed_n_table, sizeof en);
    tovl_download(be, lrows, t.lmhead_rows_table, sizeof lrows);
    tovl_download(be, lids, t.lmhead_ids_table, sizeof lids);
    tovl_download(be, nov, t.n_override_table, sizeof nov);
    for (int s = 0; s < MAXL; s++) {
        tovl_embed_overlay_view v = tovl_embed_overlay_get_view(ov[s]);
        cr_assert_eq(maps[s], v.slot_map, "slot %d slot_map", s);
        cr_assert_eq(erows[s], v.embed_rows, "slot %d embed rows", s);
        cr_assert_eq(en[s], v.embed_count, "slot %d embed n", s);
        tovl_devptr want_rows = 0, want_ids = 0;
        uint32_t want_n = 0;
        if (ov[s] && v.has_lmhead) {
            want_rows = v.lmhead_rows, want_ids = v.lmhead_ids, want_n = v.lmhead_count;
        } else if (ov[s] && tied) {
            want_rows = v.embed_rows, want_ids = v.embed_ids, want_n = v.embed_count;
        }
        cr_assert_eq(lrows[s], want_rows, "slot %d lm_head rows", s);
        cr_assert_eq(lids[s], want_ids, "slot %d lm_head ids", s);
        cr_assert_eq(nov[s], want_n, "slot %d n_override", s);
    }
    /* Spot-check the kinds explicitly, not only through the rule above. */
    cr_assert_eq(maps[0], 0);
    cr_assert_eq(nov[0], 0);
    cr_assert_eq(maps[2], 0, "lm_head-only slot has no slot_map");
    cr_assert_eq(nov[2], 2);
    cr_assert_eq(nov[4], 0, "explicit empty lm_head stays empty even when tied");
    cr_assert_eq(nov[1], tied ? 3u : 0u, "embed-only slot: tied falls back to embed rows");
    cr_assert_eq(tovl_token_overlay_set_max_n_override(set), tied ? 3u : 2u);
    cr_assert_eq(tovl_token_overlay_set_vocab(set), V);
    cr_assert_eq(tovl_token_overlay_set_hidden(set), HID);
    cr_assert_eq(tovl_token_overlay_set_max_loras(set), MAXL);
    cr_assert(tovl_token_overlay_set_any_active(set));
    for (int s = 0; s < MAXL; s++) {
        tovl_embed_overlay_release(ov[s]);
    }
    long live = tu_live(w);
    cr_assert_gt(live, 6, "the set keeps the overlays alive");
    tovl_token_overlay_set_destroy(set);
    cr_assert_eq(tu_live(w), 0, "destroying the set frees tables and overlays");
}

Test(set, tables_cell_by_cell_untied) {
    check_tables(false);
}

Test(set, tables_cell_by_cell_tied) {
    check_tables(true);
}

Test(set, empty_pool_is_inactive) {
    tovl_embed_overlay *ov[3] = {NULL, NULL, NULL};
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, ov, 3, true, &set), TOVL_OK);
    cr_assert_not(tovl_token_overlay_set_any_active(set));
    cr_assert_eq(tovl_token_overlay_set_vocab(set), 0);
    cr_assert_eq(tovl_token_overlay_set_max_n_override(set), 0);
    tovl_token_overlay_set_destroy(set);
    cr_assert_eq(tu_live(w), 0);
}

Test(set, vocab_mismatch_names_both_slots) {
    tovl_embed_overlay *ov[4] = {NULL};
    cr_assert_eq(tu_build(be, V, HID, e_ids, rows, 1, false, NULL, NULL, 0, false, &ov[1]), TOVL_OK);
    cr_assert_eq(tu_build(be, V + 1, HID, e_ids, rows, 1, false, NULL, NULL, 0, false, &ov[3]), TOVL_OK);
    long live = tu_live(w);
    tovl_token_overlay_set *set = (void *)1;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, ov, 4, false, &set), TOVL_ERR_VOCAB_MISMATCH);
    cr_assert_null(set);
    cr_assert(strstr(tovl_last_error(), "slot 3") && strstr(tovl_last_error(), "slot 1"), "%s", tovl_last_error());
    cr_assert_eq(tu_live(w), live, "nothing allocated by the failed call");
    tovl_embed_overlay_release(ov[1]);
    tovl_embed_overlay_release(ov[3]);
}

Test(set, hidden_mismatch_is_refused) {
    tovl_embed_overlay *ov[2] = {NULL};
    uint16_t wide[2 * HID];
    memset(wide, 0x3F, sizeof wide);
    cr_assert_eq(tu_build(be, V, HID, e_ids, rows, 1, false, NULL, NULL, 0, false, &ov[0]), TOVL_OK);
    cr_assert_eq(tu_build(be, V, 2 * HID, e_ids, wide, 1, false, NULL, NULL, 0, false, &ov[1]), TOVL_OK);
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, ov, 2, false, &set), TOVL_ERR_SHAPE_MISMATCH);
    tovl_embed_overlay_release(ov[0]);
    tovl_embed_overlay_release(ov[1]);
    cr_assert_eq(tu_live(w), 0);
}

Test(set, failed_table_upload_leaks_nothing_and_keeps_overlays) {
    tovl_embed_overlay *ov[MAXL];
    build_pool(ov, true);
    long live = tu_live(w);
    for (long n = 1; n <= 6; n++) {
        w->alloc_calls = 0;
        w->fail_alloc_at = n;
        tovl_token_overlay_set *set = NULL;
        cr_assert_neq(tovl_token_overlay_set_from_slots(be, ov, MAXL, true, &set), TOVL_OK, "alloc #%ld", n);
        cr_assert_null(set);
        cr_assert_eq(tu_live(w), live, "alloc failure #%ld leaked", n);
    }
    w->fail_alloc_at = 0;
    for (int s = 0; s < MAXL; s++) {
        tovl_embed_overlay_release(ov[s]);
    }
    cr_assert_eq(tu_live(w), 0, "the overlays' references were balanced on every failure");
}
