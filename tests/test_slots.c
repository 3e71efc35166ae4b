/* Fixed-shape sets on the CPU backend: the rounds of random loads and
 * unloads against from_slots sets (slots_check.c); the hooks' launches the
 * same whatever is loaded, also with every slot empty; every refused load
 * named and harmless; the version-1 path; a loader thread beside a serving
 * thread (also run under ThreadSanitizer, scripts/sanitize.sh). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "slots_check.h"
#include "testutil.h"

static void cpu_rounds(bool tied, const char *tag) {
    tovl_backend *be = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    slots_eager e = {.be = be};
    slots_replayer rp = slots_eager_replayer(&e);
    slots_check_rounds(be, &rp, &(slots_config){.rounds = 1000, .tied = tied, .capacity = 12}, tag);
    tovl_backend_close(be);
}

Test(slots, rounds_untied_against_from_slots, .timeout = 300) {
    cpu_rounds(false, "slots_cpu_untied");
}

Test(slots, rounds_tied_against_from_slots, .timeout = 300) {
    cpu_rounds(true, "slots_cpu_tied");
}

/* The core's version-1 path (synchronize, then upload) serves the same bits. */
Test(slots, rounds_through_a_version_1_backend, .timeout = 300) {
    tu_wrap *w = NULL;
    tovl_backend *be = tu_wrap_cpu(&w);
    cr_assert_not_null(be);
    w->iface.iface_version = 1;
    slots_eager e = {.be = be};
    slots_replayer rp = slots_eager_replayer(&e);
    slots_check_rounds(be, &rp, &(slots_config){.rounds = 300, .tied = true, .capacity = 5}, "slots_cpu_v1");
    cr_expect_eq(w->writes, 0, "a version-1 backend's write_async was called");
    cr_expect_gt(w->syncs, 0, "the version-1 path waits for the stream");
    tovl_backend_close(be);
}

/* Fixed-shape shard sets: every rank of N = 1 .. 8 over the vocabularies of
 * test_tp, the same rounds applied to every rank, concatenated equal to the
 * unsharded reference after every round. */
static const uint32_t shard_vocabs[] = {509, 777, 1000, 1021, 4096, 131};
static size_t shard_cases[2 * sizeof shard_vocabs / sizeof shard_vocabs[0]];

ParameterizedTestParameters(slots, shard_rounds_against_the_unsharded_reference) {
    const size_t n = sizeof shard_cases / sizeof shard_cases[0];
    for (size_t i = 0; i < n; i++) {
        shard_cases[i] = i;
    }
    return cr_make_param_array(size_t, shard_cases, n);
}
ParameterizedTest(size_t *index, slots, shard_rounds_against_the_unsharded_reference, .timeout = 600) {
    tovl_backend *be = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    slots_eager e = {.be = be};
    slots_replayer rp = slots_eager_replayer(&e);
    const slots_shard_config cfg = {.rounds = 1000, .tied = *index % 2, .vocab = shard_vocabs[*index / 2],
                                    .capacity = 160};
    slots_check_shards(be, &rp, &cfg, "slots_cpu_shards");
    tovl_backend_close(be);
}

/* ------------------------------------------------------------------------ */
/* Launches: one kernel, grid and argument struct for a T, whatever is held  */
/* ------------------------------------------------------------------------ */
enum { V = 97, H = 24, MAXL = 3, CAP = 6 };

typedef struct launch_log {
    int count;
    uint32_t grid[8][3];
    uint8_t args[8][128];
    size_t size[8];
} launch_log;
static launch_log log_;

static tovl_status logging_launch(tu_wrap *w, tovl_kernel k, const uint32_t grid[3], const void *args, size_t size,
                                  void *stream) {
    if (log_.count < 8) {
        memcpy(log_.grid[log_.count], grid, sizeof log_.grid[0]);
        memcpy(log_.args[log_.count], args, size);
        log_.size[log_.count] = size;
        log_.count++;
    }
    return tovl_backend_get_iface(w->inner)->launch(tovl_backend_get_context(w->inner), k, grid, args, size, stream);
}

static void hooks_once(tovl_token_overlay_set *set, const tovl_overlay_kernels *k, tovl_devptr hidden,
                       tovl_devptr ids, tovl_devptr slots, tovl_devptr logits, uint32_t T) {
    tovl_embed_hook_args e = {hidden, ids, slots, -1, T, H};
    cr_assert_eq(tovl_embed_hook(set, k, &e, NULL), TOVL_OK, "%s", tovl_last_error());
    tovl_lmhead_hook_args l = {logits, TOVL_LOGITS_F32, V, hidden, slots, -1, T, H};
    cr_assert_eq(tovl_lmhead_hook(set, k, &l, NULL), TOVL_OK, "%s", tovl_last_error());
}

/* The CPU backend, each launch recorded in log_. */
static tovl_backend *logged_cpu(tu_wrap **w) {
    tovl_backend *cpu = tu_wrap_cpu(w);
    cr_assert_not_null(cpu);
    (*w)->launch_override = logging_launch;
    return cpu;
}

Test(slots, launches_do_not_depend_on_what_is_loaded) {
    tu_wrap *w = NULL;
    tovl_backend *be = logged_cpu(&w);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tu_rng r = tu_rng_for("slots_launches");
    const uint32_t T = 9;
    uint32_t eids[CAP], lids[CAP], ids[9];
    int32_t slots[9];
    uint16_t rows[CAP * H], hidden[9 * H];
    tu_distinct_ids(&r, V, CAP, eids);
    tu_distinct_ids(&r, V, CAP, lids);
    tu_fill_bf16(&r, rows, CAP * H);
    tu_fill_bf16(&r, hidden, 9 * H);
    for (uint32_t t = 0; t < T; t++) {
        slots[t] = (int32_t)tu_below(&r, MAXL + 1) - 1;
        ids[t] = eids[tu_below(&r, CAP)];
    }
    tovl_devptr d_hidden, d_ids, d_slots, d_logits;
    cr_assert_eq(tovl_alloc(be, sizeof hidden, &d_hidden), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof ids, &d_ids), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof slots, &d_slots), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof(float) * T * V, &d_logits), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_hidden, hidden, sizeof hidden), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_ids, ids, sizeof ids), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_slots, slots, sizeof slots), TOVL_OK);
    cr_assert_eq(tovl_fill_u32(be, d_logits, 0x3F800000u, sizeof(float) * T * V), TOVL_OK);

    tovl_set_shape shape = {MAXL, V, H, false, CAP, CAP};
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_create(be, &shape, &set), TOVL_OK, "%s", tovl_last_error());
    cr_assert(tovl_token_overlay_set_is_fixed(set));
    cr_assert_not(tovl_token_overlay_set_any_active(set));
    cr_assert_eq(tovl_token_overlay_set_max_n_override(set), CAP);

    log_.count = 0;
    hooks_once(set, &k, d_hidden, d_ids, d_slots, d_logits, T);
    cr_assert_eq(log_.count, 2, "an empty fixed-shape set launches both hooks (%d launches)", log_.count);
    launch_log empty = log_;

    tovl_embed_overlay *a = NULL, *b = NULL;
    cr_assert_eq(tu_build(be, V, H, eids, rows, 2, true, lids, rows, 1, false, &a), TOVL_OK);
    cr_assert_eq(tu_build(be, V, H, eids, rows, CAP, true, lids, rows, CAP, false, &b), TOVL_OK);
    const struct {
        uint32_t slot;
        tovl_embed_overlay *ov;
    } steps[] = {{0, a}, {2, b}, {0, b}, {1, a}, {2, NULL}, {0, NULL}, {1, NULL}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        if (steps[i].ov) {
            cr_assert_eq(tovl_token_overlay_set_load(set, steps[i].slot, steps[i].ov, NULL), TOVL_OK, "%s",
                         tovl_last_error());
        } else {
            cr_assert_eq(tovl_token_overlay_set_unload(set, steps[i].slot, NULL), TOVL_OK, "%s", tovl_last_error());
        }
        cr_assert_eq(tovl_token_overlay_set_slot(set, steps[i].slot), steps[i].ov);
        log_.count = 0;
        hooks_once(set, &k, d_hidden, d_ids, d_slots, d_logits, T);
        cr_assert_eq(log_.count, empty.count, "step %zu: %d launches, %d with every slot empty", i, log_.count,
                     empty.count);
        for (int l = 0; l < empty.count; l++) {
            cr_assert_eq(memcmp(log_.grid[l], empty.grid[l], sizeof empty.grid[l]), 0, "step %zu: launch %d's grid",
                         i, l);
            cr_assert_eq(log_.size[l], empty.size[l]);
            cr_assert_eq(memcmp(log_.args[l], empty.args[l], empty.size[l]), 0, "step %zu: launch %d's arguments",
                         i, l);
        }
    }
    cr_assert_not(tovl_token_overlay_set_any_active(set));
    tovl_embed_overlay_release(a);
    tovl_embed_overlay_release(b);
    tovl_token_overlay_set_destroy(set);
    const tovl_devptr bufs[] = {d_hidden, d_ids, d_slots, d_logits};
    for (int i = 0; i < 4; i++) {
        tovl_free(be, bufs[i]);
    }
    cr_expect_eq(tu_live(w), 0, "device allocations left");
    tovl_backend_close(be);
}

/* ------------------------------------------------------------------------ */
/* Refusals: each names the value and the limit, and changes nothing         */
/* ------------------------------------------------------------------------ */
static tovl_backend *be;
static tu_wrap *wrap;
static tovl_token_overlay_set *set;
static tovl_embed_overlay *held;
static uint32_t e_ids[CAP + 1];
static uint16_t e_rows[(CAP + 1) * H];

static void refusal_setup(void) {
    be = tu_wrap_cpu(&wrap);
    cr_assert_not_null(be);
    tu_rng r = tu_rng_for("slots_refusals");
    tu_distinct_ids(&r, V, CAP + 1, e_ids);
    tu_fill_bf16(&r, e_rows, (CAP + 1) * H);
    tovl_set_shape shape = {MAXL, V, H, true, CAP, CAP - 2};
    cr_assert_eq(tovl_token_overlay_set_create(be, &shape, &set), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tu_build(be, V, H, e_ids, e_rows, 3, false, NULL, NULL, 0, true, &held), TOVL_OK);
    cr_assert_eq(tovl_token_overlay_set_load(set, 1, held, NULL), TOVL_OK, "%s", tovl_last_error());
}

static void refusal_teardown(void) {
    tovl_token_overlay_set_destroy(set);
    tovl_embed_overlay_release(held);
    cr_expect_eq(tu_live(wrap), 0, "device allocations left");
    tovl_backend_close(be);
}

/* The six table entries of a slot, as the device holds them. */
static void slot_entries(uint32_t s, uint64_t out[6]) {
    tovl_overlay_tables t = tovl_token_overlay_set_tables(set);
    const tovl_devptr u64[4] = {t.embed_slot_map_table, t.embed_rows_table, t.lmhead_rows_table, t.lmhead_ids_table};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(tovl_download(be, &out[i], u64[i] + 8u * s, 8), TOVL_OK);
    }
    uint32_t n[2];
    cr_assert_eq(tovl_download(be, &n[0], t.embed_n_table + 4u * s, 4), TOVL_OK);
    cr_assert_eq(tovl_download(be, &n[1], t.n_override_table + 4u * s, 4), TOVL_OK);
    out[4] = n[0];
    out[5] = n[1];
}

static void expect_refused(tovl_status st, tovl_status want, const char *const *names, const char *what) {
    uint64_t before[6], after[6];
    tu_expect_error(st, want, names, what);
    (void)before;
    slot_entries(1, after);
    tovl_embed_overlay_view v = tovl_embed_overlay_get_view(held);
    cr_assert_eq(after[0], v.slot_map, "%s: slot 1's table entries changed", what);
    cr_assert_eq(after[1], v.embed_rows, "%s: slot 1's table entries changed", what);
    cr_assert_eq(after[4], 3, "%s: slot 1's embed count changed", what);
    cr_assert_eq(after[5], 3, "%s: slot 1's lm_head count changed", what);
    cr_assert_eq(tovl_token_overlay_set_slot(set, 1), held, "%s: slot 1 lost its adapter", what);
}

TestSuite(refusals, .init = refusal_setup, .fini = refusal_teardown);

Test(refusals, create_names_the_bad_field) {
    tovl_token_overlay_set *s = (tovl_token_overlay_set *)&s;
    tovl_set_shape shape = {MAXL, V, H, false, 1, 1};
    tu_expect_error(tovl_token_overlay_set_create(be, NULL, &s), TOVL_ERR_INVALID_ARGUMENT, TU_NAMES("shape"),
                    "NULL shape");
    cr_assert_null(s);
    tu_expect_error(tovl_token_overlay_set_create(be, &shape, NULL), TOVL_ERR_INVALID_ARGUMENT, TU_NAMES("out"),
                    "NULL out");
    const char *fields[] = {"max_loras", "vocab", "hidden"};
    for (int i = 0; i < 3; i++) {
        tovl_set_shape bad = shape;
        *(i == 0 ? &bad.max_loras : i == 1 ? &bad.vocab : &bad.hidden) = 0;
        tu_expect_error(tovl_token_overlay_set_create(be, &bad, &s), TOVL_ERR_INVALID_ARGUMENT,
                        TU_NAMES(fields[i]), fields[i]);
        cr_assert_null(s);
    }
}

Test(refusals, each_misfit_is_named_and_the_slot_keeps_its_adapter) {
    tovl_embed_overlay *ov = NULL;
    /* Too many embedding rows, and too many tied lm_head cells. */
    cr_assert_eq(tu_build(be, V, H, e_ids, e_rows, CAP + 1, false, NULL, NULL, 0, true, &ov), TOVL_OK);
    expect_refused(tovl_token_overlay_set_load(set, 1, ov, NULL), TOVL_ERR_CAPACITY,
                   TU_NAMES("test-adapter", "7 embedding rows", "at most 6", "embed_capacity"), "embed capacity");
    tovl_embed_overlay_release(ov);
    cr_assert_eq(tu_build(be, V, H, e_ids, e_rows, CAP - 1, false, NULL, NULL, 0, true, &ov), TOVL_OK);
    expect_refused(tovl_token_overlay_set_load(set, 1, ov, NULL), TOVL_ERR_CAPACITY,
                   TU_NAMES("5 lm_head cells", "tied embedding rows", "at most 4", "lmhead_capacity"),
                   "tied lm_head capacity");
    tovl_embed_overlay_release(ov);
    /* An own lm_head part over the capacity. */
    cr_assert_eq(tu_build(be, V, H, e_ids, e_rows, 1, true, e_ids, e_rows, CAP - 1, true, &ov), TOVL_OK);
    expect_refused(tovl_token_overlay_set_load(set, 1, ov, NULL), TOVL_ERR_CAPACITY,
                   TU_NAMES("5 lm_head cells", "at most 4"), "own lm_head capacity");
    tovl_embed_overlay_release(ov);
    /* Another vocab, another hidden size, the other tied rule. */
    cr_assert_eq(tu_build(be, V + 1, H, e_ids, e_rows, 1, false, NULL, NULL, 0, true, &ov), TOVL_OK);
    expect_refused(tovl_token_overlay_set_load(set, 1, ov, NULL), TOVL_ERR_VOCAB_MISMATCH, TU_NAMES("98", "97"),
                   "vocab");
    tovl_embed_overlay_release(ov);
    uint16_t wide[H + 8] = {0x3F80};
    cr_assert_eq(tu_build(be, V, H + 8, e_ids, wide, 1, false, NULL, NULL, 0, true, &ov), TOVL_OK);
    expect_refused(tovl_token_overlay_set_load(set, 1, ov, NULL), TOVL_ERR_SHAPE_MISMATCH, TU_NAMES("32", "24"),
                   "hidden");
    tovl_embed_overlay_release(ov);
    cr_assert_eq(tu_build(be, V, H, e_ids, e_rows, 1, false, NULL, NULL, 0, false, &ov), TOVL_OK);
    expect_refused(tovl_token_overlay_set_load(set, 1, ov, NULL), TOVL_ERR_INVALID_ARGUMENT,
                   TU_NAMES("untied model", "the set is tied"), "tied rule");
    /* A slot out of range, a NULL overlay, a NULL set. */
    expect_refused(tovl_token_overlay_set_load(set, MAXL, held, NULL), TOVL_ERR_INVALID_ARGUMENT,
                   TU_NAMES("slot 3", "max_loras 3"), "slot");
    expect_refused(tovl_token_overlay_set_unload(set, 7, NULL), TOVL_ERR_INVALID_ARGUMENT,
                   TU_NAMES("slot 7", "max_loras 3"), "unload slot");
    expect_refused(tovl_token_overlay_set_load(set, 1, NULL, NULL), TOVL_ERR_INVALID_ARGUMENT,
                   TU_NAMES("overlay is NULL", "unload"), "NULL overlay");
    tu_expect_error(tovl_token_overlay_set_load(NULL, 0, held, NULL), TOVL_ERR_INVALID_ARGUMENT,
                    TU_NAMES("set is NULL"), "NULL set");
    tovl_embed_overlay_release(ov);
    /* An overlay of another backend. */
    tovl_backend *other = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &other), TOVL_OK);
    cr_assert_eq(tu_build(other, V, H, e_ids, e_rows, 1, false, NULL, NULL, 0, true, &ov), TOVL_OK);
    expect_refused(tovl_token_overlay_set_load(set, 1, ov, NULL), TOVL_ERR_INVALID_ARGUMENT,
                   TU_NAMES("backend cpu", "the set is on wrap"), "backend");
    tovl_embed_overlay_release(ov);
    tovl_backend_close(other);
}

Test(refusals, from_slots_sets_keep_their_contents) {
    tovl_embed_overlay *slots[2] = {held, NULL};
    tovl_token_overlay_set *fixed_contents = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, slots, 2, true, &fixed_contents), TOVL_OK);
    cr_assert_not(tovl_token_overlay_set_is_fixed(fixed_contents));
    tu_expect_error(tovl_token_overlay_set_load(fixed_contents, 1, held, NULL), TOVL_ERR_INVALID_ARGUMENT,
                    TU_NAMES("from_slots", "tovl_token_overlay_set_create"), "from_slots set");
    cr_assert_null(tovl_token_overlay_set_slot(fixed_contents, 0));
    uint32_t pending = 9;
    cr_assert_eq(tovl_token_overlay_set_collect(fixed_contents, &pending), TOVL_OK);
    cr_assert_eq(pending, 0);
    tovl_token_overlay_set_destroy(fixed_contents);
}

/* The set retains what it holds: an overlay outlives its builder's reference
 * while loaded, and goes with the last unload. */
Test(refusals, the_set_keeps_loaded_overlays_alive) {
    tovl_embed_overlay *ov = NULL;
    cr_assert_eq(tu_build(be, V, H, e_ids, e_rows, 2, false, NULL, NULL, 0, true, &ov), TOVL_OK);
    long live = tu_live(wrap);
    cr_assert_eq(tovl_token_overlay_set_load(set, 0, ov, NULL), TOVL_OK);
    cr_assert_eq(tovl_token_overlay_set_load(set, 2, ov, NULL), TOVL_OK);
    tovl_embed_overlay_release(ov);
    cr_assert_eq(tu_live(wrap), live, "a loaded overlay was freed");
    cr_assert_eq(tovl_token_overlay_set_unload(set, 0, NULL), TOVL_OK);
    cr_assert_eq(tu_live(wrap), live, "an overlay still in slot 2 was freed");
    cr_assert_eq(tovl_token_overlay_set_unload(set, 2, NULL), TOVL_OK);
    cr_assert_lt(tu_live(wrap), live, "the last unload kept the overlay");
}

/* ------------------------------------------------------------------------ */
/* A loader thread beside a serving thread                                   */
/* ------------------------------------------------------------------------ */
Test(threads, a_loader_beside_a_serving_thread_never_shows_a_mix, .timeout = 300) {
    tovl_backend *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    const char *why = slots_threaded_run(cpu, "slots_threads_cpu", 2000);
    cr_assert_null(why, "%s", why);
    tovl_backend_close(cpu);
}

/* A capacity past 64 rows: the lm_head launch is shaped for 64 (the logical
 * grid's y), its arguments' max_n stays the capacity; a capacity below 64 is
 * its own grid.y. */
Test(slots, a_large_capacity_launches_a_grid_shaped_for_64_rows) {
    tu_wrap *w = NULL;
    tovl_backend *cpu = logged_cpu(&w);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(cpu);
    const uint32_t T = 3;
    tovl_devptr d_hidden, d_ids, d_slots, d_logits;
    cr_assert_eq(tovl_alloc(cpu, sizeof(uint16_t) * T * H, &d_hidden), TOVL_OK);
    cr_assert_eq(tovl_alloc(cpu, sizeof(uint32_t) * T, &d_ids), TOVL_OK);
    cr_assert_eq(tovl_alloc(cpu, sizeof(int32_t) * T, &d_slots), TOVL_OK);
    cr_assert_eq(tovl_alloc(cpu, sizeof(float) * T * V, &d_logits), TOVL_OK);
    cr_assert_eq(tovl_fill_u32(cpu, d_slots, 0xFFFFFFFFu, sizeof(int32_t) * T), TOVL_OK); /* every row: no slot */
    const uint32_t capacities[2] = {300, CAP}, grid_y[2] = {64, CAP};
    for (int i = 0; i < 2; i++) {
        tovl_set_shape shape = {MAXL, V, H, false, capacities[i], capacities[i]};
        tovl_token_overlay_set *fixed = NULL;
        cr_assert_eq(tovl_token_overlay_set_create(cpu, &shape, &fixed), TOVL_OK, "%s", tovl_last_error());
        cr_expect_eq(tovl_token_overlay_set_max_n_override(fixed), capacities[i]);
        cr_expect_eq(tovl_token_overlay_set_lmhead_grid_y(fixed), grid_y[i]);
        log_.count = 0;
        tovl_lmhead_hook_args l = {d_logits, TOVL_LOGITS_F32, V, d_hidden, d_slots, -1, T, H};
        cr_assert_eq(tovl_lmhead_hook(fixed, &k, &l, NULL), TOVL_OK, "%s", tovl_last_error());
        cr_assert_eq(log_.count, 1);
        tovl_lmhead_overlay_args sent;
        memcpy(&sent, log_.args[0], sizeof sent);
        cr_expect(log_.grid[0][0] == T && log_.grid[0][1] == grid_y[i],
                  "capacity %u: logical grid %u x %u, expected %u x %u", capacities[i], log_.grid[0][0],
                  log_.grid[0][1], T, grid_y[i]);
        cr_expect_eq(sent.max_n, capacities[i], "the kernels' max_n is the capacity");
        tovl_token_overlay_set_destroy(fixed);
    }
    cr_expect_eq(tovl_token_overlay_set_lmhead_grid_y(NULL), 0);
    const tovl_devptr bufs[] = {d_hidden, d_ids, d_slots, d_logits};
    for (int i = 0; i < 4; i++) {
        tovl_free(cpu, bufs[i]);
    }
    cr_expect_eq(tu_live(w), 0, "device allocations left");
    tovl_backend_close(cpu);
}
