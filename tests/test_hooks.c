/* The hooks: exactly one launch when there is work, none otherwise (zero
 * handle, inactive set, T = 0, no active slot), no allocation or
 * synchronization ever, and argument errors named. */
#include <criterion/criterion.h>
#include <string.h>

#include "testutil.h"

enum { V = 32, HID = 8, T = 4 };

static tu_wrap *w;
static tovl_backend *be;
static tovl_token_overlay_set *set, *empty_set;
static tovl_overlay_kernels k;
static tovl_devptr hidden, ids, slots, logits;

static void setup(void) {
    be = tu_wrap_cpu(&w);
    tu_rng r = tu_rng_for("hooks");
    uint16_t rows[2 * HID];
    tu_fill_bf16(&r, rows, 2 * HID);
    uint32_t e_ids[2] = {3, 4};
    tovl_embed_overlay *ov[2] = {NULL, NULL};
    cr_assert_eq(tu_build(be, V, HID, e_ids, rows, 2, false, NULL, NULL, 0, true, &ov[1]), TOVL_OK);
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, ov, 2, true, &set), TOVL_OK);
    tovl_embed_overlay_release(ov[1]);
    ov[1] = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, ov, 2, true, &empty_set), TOVL_OK);
    k = tovl_overlay_kernels_resolve(be);
    tovl_alloc(be, T * HID * 2, &hidden);
    tovl_alloc(be, T * 4, &ids);
    tovl_alloc(be, T * 4, &slots);
    tovl_alloc(be, T * V * 4, &logits);
    uint16_t h[T * HID];
    tu_fill_bf16(&r, h, T * HID);
    uint32_t tid[T] = {3, 4, 5, 3};
    int32_t ts[T] = {1, 1, 0, -1};
    tovl_upload(be, hidden, h, sizeof h);
    tovl_upload(be, ids, tid, sizeof tid);
    tovl_upload(be, slots, ts, sizeof ts);
    tovl_fill_u32(be, logits, 0x3F800000u, T * V * 4);
}
static void teardown(void) {
    tovl_free(be, hidden);
    tovl_free(be, ids);
    tovl_free(be, slots);
    tovl_free(be, logits);
    tovl_token_overlay_set_destroy(set);
    tovl_token_overlay_set_destroy(empty_set);
    cr_assert_eq(tu_live(w), 0);
    tovl_backend_close(be);
}
TestSuite(hooks, .init = setup, .fini = teardown);

static tovl_embed_hook_args embed_args(void) {
    return (tovl_embed_hook_args){hidden, ids, slots, -1, T, HID};
}
static tovl_lmhead_hook_args lm_args(tovl_logits_dtype dt) {
    return (tovl_lmhead_hook_args){logits, dt, V, hidden, slots, -1, T, HID};
}

/* Runs `call`, asserting its status and how many launches it made, and that it
 * neither allocated nor synchronized. */
#define EXPECT_LAUNCHES(call, status, n)                                                                 \
    do {                                                                                                 \
        long l0 = w->launches, a0 = w->alloc_calls, s0 = w->syncs, d0 = w->downloads, u0 = w->uploads;    \
        tovl_status st_ = (call);                                                                        \
        cr_assert_eq(st_, (status), "%s: %s", #call, tovl_last_error());                                 \
        cr_assert_eq(w->launches - l0, (n), "%s: launches", #call);                                      \
        cr_assert_eq(w->alloc_calls - a0 + w->syncs - s0 + w->downloads - d0 + w->uploads - u0, 0,       \
                     "%s allocated, copied or synchronized", #call);                                     \
    } while (0)

Test(hooks, launch_once_when_there_is_work) {
    tovl_embed_hook_args e = embed_args();
    tovl_lmhead_hook_args lb = lm_args(TOVL_LOGITS_BF16), lf = lm_args(TOVL_LOGITS_F32);
    EXPECT_LAUNCHES(tovl_embed_hook(set, &k, &e, NULL), TOVL_OK, 1);
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &k, &lb, NULL), TOVL_OK, 1);
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &k, &lf, NULL), TOVL_OK, 1);
    e.slots = 0;
    e.active_slot = 1;
    EXPECT_LAUNCHES(tovl_embed_hook(set, &k, &e, NULL), TOVL_OK, 1);
}

Test(hooks, no_launch_with_a_zero_handle) {
    tovl_overlay_kernels none = TOVL_OVERLAY_KERNELS_NONE;
    tovl_embed_hook_args e = embed_args();
    tovl_lmhead_hook_args lb = lm_args(TOVL_LOGITS_BF16), lf = lm_args(TOVL_LOGITS_F32);
    EXPECT_LAUNCHES(tovl_embed_hook(set, &none, &e, NULL), TOVL_OK, 0);
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &none, &lb, NULL), TOVL_OK, 0);
    tovl_overlay_kernels only_bf16 = k;
    only_bf16.lmhead_overlay_f32 = 0;
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &only_bf16, &lf, NULL), TOVL_OK, 0);
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &only_bf16, &lb, NULL), TOVL_OK, 1);
}

Test(hooks, no_launch_without_work) {
    tovl_embed_hook_args e = embed_args();
    tovl_lmhead_hook_args l = lm_args(TOVL_LOGITS_F32);
    EXPECT_LAUNCHES(tovl_embed_hook(empty_set, &k, &e, NULL), TOVL_OK, 0);
    EXPECT_LAUNCHES(tovl_lmhead_hook(empty_set, &k, &l, NULL), TOVL_OK, 0);
    e.T = 0;
    l.T = 0;
    EXPECT_LAUNCHES(tovl_embed_hook(set, &k, &e, NULL), TOVL_OK, 0);
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &k, &l, NULL), TOVL_OK, 0);
    e = embed_args();
    l = lm_args(TOVL_LOGITS_F32);
    e.slots = l.slots = 0;
    e.active_slot = l.active_slot = -1;
    EXPECT_LAUNCHES(tovl_embed_hook(set, &k, &e, NULL), TOVL_OK, 0);
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &k, &l, NULL), TOVL_OK, 0);
    e.active_slot = l.active_slot = 2; /* >= max_loras: no adapter */
    EXPECT_LAUNCHES(tovl_embed_hook(set, &k, &e, NULL), TOVL_OK, 0);
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &k, &l, NULL), TOVL_OK, 0);
}

Test(hooks, argument_errors_are_named) {
    tovl_embed_hook_args e = embed_args();
    tovl_lmhead_hook_args l = lm_args(TOVL_LOGITS_F32);
    e.hidden_size = HID + 1;
    EXPECT_LAUNCHES(tovl_embed_hook(set, &k, &e, NULL), TOVL_ERR_SHAPE_MISMATCH, 0);
    cr_assert(strstr(tovl_last_error(), "hidden_size 9"), "%s", tovl_last_error());
    l.ld = V - 1;
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &k, &l, NULL), TOVL_ERR_SHAPE_MISMATCH, 0);
    cr_assert(strstr(tovl_last_error(), "ld 31"), "%s", tovl_last_error());
    l = lm_args((tovl_logits_dtype)7);
    EXPECT_LAUNCHES(tovl_lmhead_hook(set, &k, &l, NULL), TOVL_ERR_INVALID_ARGUMENT, 0);
    e = embed_args();
    e.token_ids = 0;
    EXPECT_LAUNCHES(tovl_embed_hook(set, &k, &e, NULL), TOVL_ERR_INVALID_ARGUMENT, 0);
    EXPECT_LAUNCHES(tovl_embed_hook(NULL, &k, &e, NULL), TOVL_ERR_INVALID_ARGUMENT, 0);
}

Test(hooks, results_follow_the_slots) {
    tovl_embed_hook_args e = embed_args();
    uint16_t before[T * HID], after[T * HID], rows[2 * HID];
    tovl_download(be, before, hidden, sizeof before);
    cr_assert_eq(tovl_embed_hook(set, &k, &e, NULL), TOVL_OK);
    tovl_download(be, after, hidden, sizeof after);
    tovl_overlay_tables t = tovl_token_overlay_set_tables(set);
    uint64_t rows_ptr[2];
    tovl_download(be, rows_ptr, t.embed_rows_table, sizeof rows_ptr);
    tovl_download(be, rows, rows_ptr[1], sizeof rows);
    /* tokens: (3, slot 1) -> row 0; (4, slot 1) -> row 1; (5, slot 0 empty); (3, slot -1) */
    cr_assert_arr_eq(after, rows, HID * 2);
    cr_assert_arr_eq(after + HID, rows + HID, HID * 2);
    cr_assert_arr_eq(after + 2 * HID, before + 2 * HID, 2 * HID * 2);
}
