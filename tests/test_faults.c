/* Fault injection: a wrapping backend (tests/testutil.c) fails the Nth device
 * allocation, upload, fill, kernel launch, synchronize or download, or the
 * Nth kernel lookup, for every N an operation makes, in build_overlay,
 * from_slots, the hooks, rowdiff and adapter import. Each failure must return
 * an error with a detail, hand out nothing, leak no device memory, and leave a
 * set built earlier producing the same bits as before. Host memory is checked
 * by the ASan/LSan and Valgrind runs of this same test (docs/SANITIZERS.md). */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { V = 300, HID = 40, MAXL = 4, T = 24, GUARD = 64 };
#define POISON 0x5EA1AB1Eu

static tu_wrap *w;
static tovl_backend *be;
static tovl_overlay_kernels k;
static tu_rng rng;

/* ------------------------------------------------------------------------ */
/* Injection points                                                          */
/* ------------------------------------------------------------------------ */
typedef enum { F_ALLOC, F_UPLOAD, F_FILL, F_LAUNCH, F_SYNC, F_DOWNLOAD, F_COUNT } fault;
static const char *const fault_name[F_COUNT] = {"alloc", "upload", "fill", "launch", "synchronize", "download"};

static long *counter(fault f) {
    switch (f) {
    case F_ALLOC: return &w->alloc_calls;
    case F_UPLOAD: return &w->uploads;
    case F_FILL: return &w->fills;
    case F_LAUNCH: return &w->launches;
    case F_SYNC: return &w->syncs;
    default: return &w->downloads;
    }
}
static long *fail_at(fault f) {
    switch (f) {
    case F_ALLOC: return &w->fail_alloc_at;
    case F_UPLOAD: return &w->fail_upload_at;
    case F_FILL: return &w->fail_fill_at;
    case F_LAUNCH: return &w->fail_launch_at;
    case F_SYNC: return &w->fail_sync_at;
    default: return &w->fail_download_at;
    }
}
static void reset_counters(void) {
    for (int f = 0; f < F_COUNT; f++) {
        *counter((fault)f) = 0;
        *fail_at((fault)f) = 0;
    }
    w->lookups = 0;
    w->fail_lookup_at = 0;
    w->writes = 0;
    w->fail_write_at = 0;
}

/* ------------------------------------------------------------------------ */
/* A set built before any fault, and its outputs                             */
/* ------------------------------------------------------------------------ */
static tovl_token_overlay_set *golden_set;
static uint32_t ids[T];
static int32_t slots[T];
static uint16_t hidden[T * HID];
static float logits_f32[T * V];
static uint16_t logits_bf16[T * V];
static uint8_t *golden[3]; /* embed hidden, bf16 logits, f32 logits */
static size_t golden_bytes[3] = {sizeof hidden, sizeof logits_bf16, sizeof logits_f32};

/* Pool rows for slot s: embed rows for ids, lm_head rows, host copies. */
static uint32_t pool_eids[MAXL][12], pool_lids[MAXL][9];
static uint16_t pool_erows[MAXL][12 * HID], pool_lrows[MAXL][9 * HID];

static tovl_status build_slot(int s, bool tied, tovl_embed_overlay **out) {
    /* slot 0: embed + own lm_head; 1: embed only (tied fallback); 2: lm_head only; 3: lm_head present, 0 rows */
    bool has_lm = s != 1;
    uint32_t ne = s == 2 ? 0 : 12, nl = s == 3 ? 0 : 9;
    tovl_overlay_desc d = {
        .adapter = "faults",
        .vocab = V,
        .hidden = HID,
        .embed = {"embed", pool_eids[s], pool_erows[s], ne, HID},
        .has_lmhead = has_lm,
        .lmhead = {"lm_head", pool_lids[s], pool_lrows[s], nl, HID},
        .tied = tied,
    };
    return tovl_build_overlay(be, &k, &d, out);
}

/* Run both hooks on the golden set over guarded buffers; return the payloads. */
static void run_golden(uint8_t *out[3]) {
    long saved[F_COUNT];
    for (int f = 0; f < F_COUNT; f++) {
        saved[f] = *fail_at((fault)f);
        *fail_at((fault)f) = 0; /* the check itself must not be injected */
    }
    tovl_devptr d_ids, d_slots, d_hidden, d_lm_hidden, d_out[3];
    cr_assert_eq(tovl_alloc(be, sizeof ids, &d_ids), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof slots, &d_slots), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof hidden, &d_lm_hidden), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_ids, ids, sizeof ids), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_slots, slots, sizeof slots), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_lm_hidden, hidden, sizeof hidden), TOVL_OK);
    const void *init[3] = {hidden, logits_bf16, logits_f32};
    for (int i = 0; i < 3; i++) {
        size_t total = 2 * GUARD + golden_bytes[i];
        cr_assert_eq(tovl_alloc(be, total, &d_out[i]), TOVL_OK);
        cr_assert_eq(tovl_fill_u32(be, d_out[i], POISON, total), TOVL_OK);
        cr_assert_eq(tovl_upload(be, d_out[i] + GUARD, init[i], golden_bytes[i]), TOVL_OK);
    }
    d_hidden = d_out[0] + GUARD;
    tovl_embed_hook_args e = {d_hidden, d_ids, d_slots, -1, T, HID};
    cr_assert_eq(tovl_embed_hook(golden_set, &k, &e, NULL), TOVL_OK, "%s", tovl_last_error());
    for (int f32 = 0; f32 < 2; f32++) {
        tovl_lmhead_hook_args l = {d_out[1 + f32] + GUARD, f32 ? TOVL_LOGITS_F32 : TOVL_LOGITS_BF16, V, d_lm_hidden,
                                   d_slots, -1, T, HID};
        cr_assert_eq(tovl_lmhead_hook(golden_set, &k, &l, NULL), TOVL_OK, "%s", tovl_last_error());
    }
    cr_assert_eq(tovl_synchronize(be, NULL), TOVL_OK);
    const uint32_t poison = POISON;
    for (int i = 0; i < 3; i++) {
        size_t total = 2 * GUARD + golden_bytes[i];
        uint8_t *all = malloc(total);
        cr_assert_not_null(all);
        cr_assert_eq(tovl_download(be, all, d_out[i], total), TOVL_OK);
        for (size_t b = 0; b < total; b++) {
            if (b >= GUARD && b < GUARD + golden_bytes[i]) continue;
            cr_assert_eq(all[b], ((const uint8_t *)&poison)[b % 4], "output %d: guard byte %zu written", i, b);
        }
        out[i] = malloc(golden_bytes[i]);
        cr_assert_not_null(out[i]);
        memcpy(out[i], all + GUARD, golden_bytes[i]);
        free(all);
        tovl_free(be, d_out[i]);
    }
    tovl_free(be, d_ids);
    tovl_free(be, d_slots);
    tovl_free(be, d_lm_hidden);
    for (int f = 0; f < F_COUNT; f++) {
        *fail_at((fault)f) = saved[f];
    }
}

/* The golden set still gives exactly the bits it gave before any fault. */
static void expect_golden_unchanged(const char *after) {
    uint8_t *now[3];
    run_golden(now);
    for (int i = 0; i < 3; i++) {
        cr_assert(memcmp(now[i], golden[i], golden_bytes[i]) == 0,
                  "after %s the earlier set's %s output changed (seed %" PRIu64 ")", after,
                  i == 0 ? "embed" : i == 1 ? "bf16 lm_head" : "f32 lm_head", tu_seed());
        free(now[i]);
    }
}

static void setup(void) {
    be = tu_wrap_cpu(&w);
    cr_assert_not_null(be);
    k = tovl_overlay_kernels_resolve(be);
    rng = tu_rng_for("faults");
    for (int s = 0; s < MAXL; s++) {
        tu_distinct_ids(&rng, V, 12, pool_eids[s]);
        tu_distinct_ids(&rng, V, 9, pool_lids[s]);
        tu_fill_bf16(&rng, pool_erows[s], 12 * HID);
        tu_fill_bf16(&rng, pool_lrows[s], 9 * HID);
    }
    for (int t = 0; t < T; t++) {
        slots[t] = t == 0 ? 0 : (int32_t)tu_below(&rng, MAXL + 1) - (t % 5 == 0);
        int32_t s = slots[t] >= 0 && slots[t] < MAXL ? slots[t] : 0;
        ids[t] = tu_below(&rng, 4) ? pool_eids[s][tu_below(&rng, 12)] : tu_below(&rng, V + 10);
    }
    tu_fill_bf16(&rng, hidden, T * HID);
    tu_fill_bf16(&rng, logits_bf16, T * V);
    for (int i = 0; i < T * V; i++) logits_f32[i] = tovl_bf16_to_f32(tu_bf16(&rng));
    tovl_embed_overlay *ov[MAXL] = {0};
    for (int s = 0; s < MAXL; s++) {
        cr_assert_eq(build_slot(s, true, &ov[s]), TOVL_OK, "%s", tovl_last_error());
    }
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, ov, MAXL, true, &golden_set), TOVL_OK);
    for (int s = 0; s < MAXL; s++) tovl_embed_overlay_release(ov[s]);
    run_golden(golden);
    cr_assert(memcmp(golden[0], hidden, sizeof hidden) != 0, "the golden embed output patches something");
    cr_assert(memcmp(golden[1], logits_bf16, sizeof logits_bf16) != 0, "the golden lm_head output patches something");
    reset_counters();
}

static void teardown(void) {
    tovl_token_overlay_set_destroy(golden_set);
    for (int i = 0; i < 3; i++) free(golden[i]);
    cr_expect_eq(tu_live(w), 0, "device allocations left at the end");
    tovl_backend_close(be);
}
TestSuite(faults, .init = setup, .fini = teardown);

/* ------------------------------------------------------------------------ */
/* The driver                                                                */
/* ------------------------------------------------------------------------ */
/* An operation under test: does its work, and on success releases what it
 * made (so only failures can leak). Returns the status of the operation. */
typedef tovl_status (*operation)(void *arg);

/* For every injection point: count the operation's calls in a clean run, then
 * fail call N for every N of them; each must fail cleanly; N = count + 1 must
 * succeed. Returns the number of injected failures driven. */
static long drive(const char *op_name, operation op, void *arg) {
    long driven = 0;
    for (int f = 0; f < F_COUNT; f++) {
        reset_counters();
        long live = tu_live(w);
        tovl_status st = op(arg);
        cr_assert_eq(st, TOVL_OK, "%s without faults: %s", op_name, tovl_last_error());
        cr_assert_eq(tu_live(w), live, "%s without faults leaked", op_name);
        long calls = *counter((fault)f);
        for (long n = 1; n <= calls + 1; n++) {
            reset_counters();
            *fail_at((fault)f) = n;
            st = op(arg);
            long made = *counter((fault)f);
            *fail_at((fault)f) = 0;
            if (n <= calls) {
                cr_assert_neq(st, TOVL_OK, "%s: failing %s #%ld of %ld was not reported", op_name, fault_name[f], n,
                              calls);
                cr_assert(strstr(tovl_last_error(), "injected") != NULL,
                          "%s: failing %s #%ld: the detail is not the injected failure's: '%s'", op_name,
                          fault_name[f], n, tovl_last_error());
                cr_assert_eq(made, n, "%s: went on with %ld %s calls after #%ld failed", op_name, made,
                             fault_name[f], n);
                driven++;
            } else {
                cr_assert_eq(st, TOVL_OK, "%s: with %ld %s calls, failing #%ld must not matter: %s", op_name, calls,
                             fault_name[f], n, tovl_last_error());
            }
            cr_assert_eq(tu_live(w), live, "%s: failing %s #%ld leaked %ld device allocations", op_name,
                         fault_name[f], n, tu_live(w) - live);
            char after[96];
            snprintf(after, sizeof after, "%s with %s #%ld failing", op_name, fault_name[f], n);
            expect_golden_unchanged(after);
        }
    }
    fprintf(stderr, "faults: %s: %ld injected failures, each clean\n", op_name, driven);
    return driven;
}

/* ------------------------------------------------------------------------ */
/* build_overlay                                                             */
/* ------------------------------------------------------------------------ */
typedef struct build_arg {
    int slot;
    bool tied;
} build_arg;

static tovl_status op_build(void *arg) {
    const build_arg *a = arg;
    tovl_embed_overlay *ov = (tovl_embed_overlay *)&ov; /* not NULL: a failure must clear it */
    tovl_status st = build_slot(a->slot, a->tied, &ov);
    if (st == TOVL_OK) {
        tovl_embed_overlay_release(ov);
    } else {
        cr_assert_null(ov, "build_overlay failed but handed out an overlay");
    }
    return st;
}

Test(faults, build_overlay_every_allocation_and_upload) {
    long total = 0;
    for (int s = 0; s < MAXL; s++) {
        build_arg a = {s, s % 2 == 0};
        char name[48];
        snprintf(name, sizeof name, "build_overlay (slot kind %d)", s);
        total += drive(name, op_build, &a);
    }
    /* slot kind 0 alone: 5 allocations (ids, rows, slot_map, lm ids, lm rows) and 5 uploads */
    cr_assert_geq(total, 10, "too few injection points: the driver is not reaching build_overlay");
}

/* ------------------------------------------------------------------------ */
/* Kernel lookup: a kernel that resolves to 0                                */
/* ------------------------------------------------------------------------ */
Test(faults, build_overlay_with_each_kernel_lookup_failing) {
    static const char *const names[4] = {TOVL_KERNEL_ROWDIFF, TOVL_KERNEL_EMBED_OVERLAY,
                                         TOVL_KERNEL_LMHEAD_OVERLAY_BF16, TOVL_KERNEL_LMHEAD_OVERLAY_F32};
    reset_counters();
    (void)tovl_overlay_kernels_resolve(be);
    cr_assert_eq(w->lookups, 4, "resolve looks up the four kernels");
    for (long n = 1; n <= 4; n++) {
        reset_counters();
        w->fail_lookup_at = n;
        tovl_overlay_kernels partial = tovl_overlay_kernels_resolve(be);
        w->fail_lookup_at = 0;
        const tovl_kernel got[4] = {partial.rowdiff, partial.embed_overlay, partial.lmhead_overlay_bf16,
                                    partial.lmhead_overlay_f32};
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(got[i] == 0, i == n - 1, "lookup #%ld failing should zero exactly '%s'", n, names[n - 1]);
        }
        /* Untied: kinds 0 and 1 need embed_overlay, kinds 0 and 2 both lm_head
         * kernels (kind 3's lm_head part has 0 rows); none needs rowdiff. */
        for (int s = 0; s < MAXL; s++) {
            long live = tu_live(w);
            bool needs = (n == 2 && s != 2) || ((n == 3 || n == 4) && (s == 0 || s == 2));
            tovl_embed_overlay *ov = NULL;
            bool has_lm = s != 1;
            uint32_t ne = s == 2 ? 0 : 12, nl = s == 3 ? 0 : 9;
            tovl_overlay_desc d = {.adapter = "faults", .vocab = V, .hidden = HID,
                                   .embed = {"embed", pool_eids[s], pool_erows[s], ne, HID}, .has_lmhead = has_lm,
                                   .lmhead = {"lm_head", pool_lids[s], pool_lrows[s], nl, HID}, .tied = false};
            tovl_status st = tovl_build_overlay(be, &partial, &d, &ov);
            if (needs) {
                cr_assert_eq(st, TOVL_ERR_KERNEL_MISSING, "slot kind %d without %s: %s", s, names[n - 1],
                             tovl_status_str(st));
                cr_assert(strstr(tovl_last_error(), names[n - 1]), "the error names the kernel: %s",
                          tovl_last_error());
                cr_assert_null(ov);
            } else {
                cr_assert_eq(st, TOVL_OK, "slot kind %d does not need %s: %s", s, names[n - 1], tovl_last_error());
                tovl_embed_overlay_release(ov);
            }
            cr_assert_eq(tu_live(w), live);
        }
        /* The hooks with the partial kernels: a missing kernel means no launch, success. */
        long launches = w->launches;
        uint8_t *now[3];
        tovl_overlay_kernels saved = k;
        k = partial;
        run_golden(now);
        k = saved;
        for (int i = 0; i < 3; i++) {
            bool missing = (i == 0 && n == 2) || (i == 1 && n == 3) || (i == 2 && n == 4);
            const void *init = i == 0 ? (const void *)hidden : i == 1 ? (const void *)logits_bf16 : (const void *)logits_f32;
            cr_assert(memcmp(now[i], missing ? init : golden[i], golden_bytes[i]) == 0,
                      "lookup #%ld failing: output %d should be %s", n, i, missing ? "untouched" : "the golden one");
            free(now[i]);
        }
        cr_assert_eq(w->launches - launches, n == 1 ? 3 : 2, "a hook with a zero kernel must not launch");
        expect_golden_unchanged("a failed kernel lookup");
    }
}

/* ------------------------------------------------------------------------ */
/* from_slots                                                                */
/* ------------------------------------------------------------------------ */
typedef struct slots_arg {
    tovl_embed_overlay *ov[256];
    uint32_t max_loras;
} slots_arg;

static tovl_status op_from_slots(void *arg) {
    slots_arg *a = arg;
    tovl_token_overlay_set *set = (tovl_token_overlay_set *)&set;
    tovl_status st = tovl_token_overlay_set_from_slots(be, a->ov, a->max_loras, true, &set);
    if (st == TOVL_OK) {
        tovl_token_overlay_set_destroy(set);
    } else {
        cr_assert_null(set, "from_slots failed but handed out a set");
    }
    return st;
}

Test(faults, from_slots_every_allocation_and_upload) {
    long live0 = tu_live(w);
    const uint32_t sizes[] = {1, MAXL, 256};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        slots_arg a = {.max_loras = sizes[i]};
        /* slot kinds 0, (1 empty), 2, 3 and then every 37th slot */
        for (uint32_t s = 0; s < a.max_loras; s++) {
            if (s != 1 && (s < MAXL || s % 37 == 0)) {
                cr_assert_eq(build_slot((int)(s % MAXL == 1 ? 0 : s % MAXL), true, &a.ov[s]), TOVL_OK);
            }
        }
        long live = tu_live(w);
        char name[48];
        snprintf(name, sizeof name, "from_slots (max_loras %u)", a.max_loras);
        long driven = drive(name, op_from_slots, &a);
        cr_assert_geq(driven, 12, "six tables, each one allocation and one upload");
        cr_assert_eq(tu_live(w), live, "the overlays' device memory is intact after every failure");
        /* The overlays' references were balanced on every failure: releasing
         * ours frees every buffer they own. */
        for (uint32_t s = 0; s < a.max_loras; s++) tovl_embed_overlay_release(a.ov[s]);
        cr_assert_eq(tu_live(w), live0, "an overlay outlived its last reference");
    }
}

/* ------------------------------------------------------------------------ */
/* Fixed-shape sets: create, and every way a load can fail                   */
/* ------------------------------------------------------------------------ */
static tovl_status op_create(void *arg) {
    const uint32_t *max_loras = arg;
    tovl_token_overlay_set *set = (tovl_token_overlay_set *)&set;
    const tovl_set_shape shape = {*max_loras, V, HID, true, 12, 12};
    tovl_status st = tovl_token_overlay_set_create(be, &shape, &set);
    if (st == TOVL_OK) {
        tovl_token_overlay_set_destroy(set);
    } else {
        cr_assert_null(set, "create failed but handed out a set");
    }
    return st;
}

/* A slot's six table entries as the device holds them (never injected). */
static void fixed_entries(const tovl_token_overlay_set *set, uint32_t s, uint64_t out[6]) {
    const long saved_download = w->fail_download_at;
    w->fail_download_at = 0;
    const tovl_overlay_tables t = tovl_token_overlay_set_tables(set);
    const tovl_devptr at[6] = {t.embed_slot_map_table + 8u * s, t.embed_rows_table + 8u * s,
                               t.lmhead_rows_table + 8u * s,    t.lmhead_ids_table + 8u * s,
                               t.embed_n_table + 4u * s,        t.n_override_table + 4u * s};
    for (int i = 0; i < 6; i++) {
        out[i] = 0;
        cr_assert_eq(tovl_download(be, &out[i], at[i], i < 4 ? 8 : 4), TOVL_OK);
    }
    w->fail_download_at = saved_download;
}

/* Load B over A (or unload A) with one failure injected: an error with the
 * injected detail, slot 0 still A on the host and on the device, nothing leaked. */
static void expect_failed_swap(tovl_token_overlay_set *set, tovl_embed_overlay *a, tovl_embed_overlay *b,
                               const char *what) {
    uint64_t before[6], after[6];
    fixed_entries(set, 0, before);
    const long live = tu_live(w);
    tovl_status st = b ? tovl_token_overlay_set_load(set, 0, b, NULL) : tovl_token_overlay_set_unload(set, 0, NULL);
    w->fail_write_at = w->fail_upload_at = w->fail_sync_at = 0;
    cr_assert_neq(st, TOVL_OK, "%s was not reported", what);
    cr_assert(strstr(tovl_last_error(), "injected"), "%s: the detail is not the injected failure's: %s", what,
              tovl_last_error());
    cr_assert_eq(tovl_token_overlay_set_slot(set, 0), a, "%s: slot 0 lost its adapter", what);
    fixed_entries(set, 0, after);
    cr_assert_eq(memcmp(before, after, sizeof before), 0, "%s: slot 0's table entries changed", what);
    cr_assert_eq(tu_live(w), live, "%s: device allocations changed", what);
}

Test(faults, fixed_set_create_every_allocation_and_upload) {
    const uint32_t sizes[] = {1, MAXL, 256};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint32_t max_loras = sizes[i];
        char name[48];
        snprintf(name, sizeof name, "create (max_loras %u)", max_loras);
        cr_assert_geq(drive(name, op_create, &max_loras), 2, "one allocation and one upload");
    }
}

/* The shard sets': also the ids buffer's allocation. */
static tovl_status op_create_shard(void *arg) {
    const uint32_t *max_loras = arg;
    tovl_token_overlay_set *set = (tovl_token_overlay_set *)&set;
    const tovl_set_shape shape = {*max_loras, V, HID, true, 12, 12};
    tovl_status st = tovl_token_overlay_set_create_shard(be, &shape, V / 3, V, &set);
    if (st == TOVL_OK) {
        tovl_token_overlay_set_destroy(set);
    } else {
        cr_assert_null(set, "create_shard failed but handed out a set");
    }
    return st;
}

Test(faults, fixed_shard_set_create_every_allocation_and_upload) {
    const uint32_t sizes[] = {1, MAXL, 256};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint32_t max_loras = sizes[i];
        char name[48];
        snprintf(name, sizeof name, "create_shard (max_loras %u)", max_loras);
        cr_assert_geq(drive(name, op_create_shard, &max_loras), 3, "two allocations and one upload");
    }
}

/* A shard set's load writes a seventh piece, the slot's shifted ids: a
 * failure of any of the seven leaves the slot as it was. */
Test(faults, fixed_shard_set_loads_fail_cleanly_on_both_paths) {
    tovl_embed_overlay *a = NULL, *b = NULL;
    cr_assert_eq(build_slot(0, true, &a), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(build_slot(2, true, &b), TOVL_OK, "%s", tovl_last_error());
    const tovl_set_shape shape = {MAXL, V, HID, true, 12, 12};
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_create_shard(be, &shape, 0, V / 2, &set), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_token_overlay_set_load(set, 0, a, NULL), TOVL_OK, "%s", tovl_last_error());
    reset_counters();
    w->fail_write_at = 1;
    expect_failed_swap(set, a, b, "a shard set's load with write_async failing");
    w->iface.iface_version = 1;
    long pieces = 0;
    reset_counters();
    cr_assert_eq(tovl_token_overlay_set_load(set, 1, b, NULL), TOVL_OK, "%s", tovl_last_error());
    pieces = w->uploads;
    cr_assert(pieces == 6 || pieces == 7, "a version-1 shard load wrote %ld pieces", pieces);
    for (long n = 1; n <= pieces; n++) {
        reset_counters();
        w->fail_upload_at = n;
        char what[64];
        snprintf(what, sizeof what, "a version-1 shard load with upload %ld of %ld failing", n, pieces);
        expect_failed_swap(set, a, b, what);
    }
    w->iface.iface_version = TOVL_BACKEND_IFACE_VERSION;
    tovl_token_overlay_set_destroy(set);
    tovl_embed_overlay_release(a);
    tovl_embed_overlay_release(b);
    expect_golden_unchanged("fixed-shape shard set loads");
}

Test(faults, fixed_set_loads_fail_cleanly_on_both_paths) {
    tovl_embed_overlay *a = NULL, *b = NULL;
    cr_assert_eq(build_slot(0, true, &a), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(build_slot(2, true, &b), TOVL_OK, "%s", tovl_last_error());
    const tovl_set_shape shape = {MAXL, V, HID, true, 12, 12};
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_create(be, &shape, &set), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_token_overlay_set_load(set, 0, a, NULL), TOVL_OK, "%s", tovl_last_error());
    /* Version 2: the whole stream-ordered write fails. */
    reset_counters();
    w->fail_write_at = 1;
    expect_failed_swap(set, a, b, "a load with write_async failing");
    reset_counters();
    w->fail_write_at = 1;
    expect_failed_swap(set, a, NULL, "an unload with write_async failing");
    /* Version 1: the stream's synchronize, then each of the six uploads, the
     * entries already written put back. */
    w->iface.iface_version = 1;
    for (long n = 0; n <= 6; n++) {
        reset_counters();
        char what[64];
        if (n == 0) {
            w->fail_sync_at = 1;
            snprintf(what, sizeof what, "a version-1 load with synchronize failing");
        } else {
            w->fail_upload_at = n;
            snprintf(what, sizeof what, "a version-1 load with upload %ld of 6 failing", n);
        }
        expect_failed_swap(set, a, b, what);
    }
    reset_counters();
    cr_assert_eq(tovl_token_overlay_set_load(set, 0, b, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(w->uploads, 6, "a version-1 load writes six entries");
    w->iface.iface_version = TOVL_BACKEND_IFACE_VERSION;
    tovl_token_overlay_set_destroy(set);
    tovl_embed_overlay_release(a);
    tovl_embed_overlay_release(b);
    expect_golden_unchanged("fixed-shape set loads");
}

/* ------------------------------------------------------------------------ */
/* The hooks: a failed launch is reported; the set is unharmed               */
/* ------------------------------------------------------------------------ */
static tovl_status op_hooks(void *arg) {
    (void)arg;
    tovl_devptr d_hidden = 0, d_ids = 0, d_logits = 0;
    tovl_status st = tovl_alloc(be, sizeof hidden, &d_hidden);
    if (st == TOVL_OK) st = tovl_alloc(be, sizeof ids, &d_ids);
    if (st == TOVL_OK) st = tovl_alloc(be, sizeof logits_f32, &d_logits);
    if (st == TOVL_OK) st = tovl_upload(be, d_hidden, hidden, sizeof hidden);
    if (st == TOVL_OK) st = tovl_upload(be, d_ids, ids, sizeof ids);
    long allocs = w->alloc_calls, syncs = w->syncs;
    tovl_embed_hook_args e = {d_hidden, d_ids, 0, 0, T, HID};
    tovl_lmhead_hook_args l = {d_logits, TOVL_LOGITS_F32, V, d_hidden, 0, 3, T, HID};
    if (st == TOVL_OK) st = tovl_embed_hook(golden_set, &k, &e, NULL);
    if (st == TOVL_OK) st = tovl_lmhead_hook(golden_set, &k, &l, NULL);
    cr_assert_eq(w->alloc_calls + w->syncs, allocs + syncs, "a hook allocated or synchronized");
    if (st == TOVL_OK) st = tovl_synchronize(be, NULL);
    tovl_free(be, d_hidden);
    tovl_free(be, d_ids);
    tovl_free(be, d_logits);
    return st;
}

Test(faults, hooks_report_a_failed_launch) {
    cr_assert_geq(drive("hooks", op_hooks, NULL), 2);
}

/* ------------------------------------------------------------------------ */
/* rowdiff (the import's comparison of full matrices)                        */
/* ------------------------------------------------------------------------ */
typedef struct rowdiff_arg {
    tovl_devptr a, b;
    uint32_t rows;
    uint32_t want_changed;
} rowdiff_arg;

static tovl_status op_rowdiff(void *arg) {
    rowdiff_arg *r = arg;
    uint32_t changed[64], n = 12345;
    tovl_status st = tovl_rowdiff(be, &k, r->a, r->b, r->rows, HID, 0.0f, changed, &n);
    if (st == TOVL_OK) {
        cr_assert_eq(n, r->want_changed);
    }
    return st;
}

Test(faults, rowdiff_every_device_call) {
    enum { ROWS = 64 };
    uint16_t a[ROWS * HID], b[ROWS * HID];
    tu_fill_bf16(&rng, a, ROWS * HID);
    memcpy(b, a, sizeof a);
    b[5 * HID + 3] ^= 1;
    b[40 * HID] ^= 0x8000;
    rowdiff_arg r = {.rows = ROWS, .want_changed = 2};
    cr_assert_eq(tovl_alloc(be, sizeof a, &r.a), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof b, &r.b), TOVL_OK);
    cr_assert_eq(tovl_upload(be, r.a, a, sizeof a), TOVL_OK);
    cr_assert_eq(tovl_upload(be, r.b, b, sizeof b), TOVL_OK);
    /* alloc, launch, synchronize and download each fail once */
    cr_assert_geq(drive("rowdiff", op_rowdiff, &r), 4);
    tovl_free(be, r.a);
    tovl_free(be, r.b);
}

/* ------------------------------------------------------------------------ */
/* Adapter import                                                            */
/* ------------------------------------------------------------------------ */
#if TOVL_TEST_HAVE_IMPORT
#include <sys/stat.h>
#include <unistd.h>

enum { IV = 96, IH = 24 };

typedef struct import_fixture {
    char root[64];
    char model_dir[96], mts_dir[96], tt_dir[96];
    tovl_model *model;
    tovl_adapter *mts, *tt; /* modules_to_save (full matrices), trainable tokens */
} import_fixture;

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static void write_tensor(const char *path, const char *name, const char *dtype, uint64_t rows, uint64_t cols,
                         const void *data) {
    uint64_t shape[2] = {rows, cols};
    tovl_tensor t = {.name = name, .dtype = dtype, .ndim = 2, .shape = shape, .data = data};
    cr_assert_eq(tovl_safetensors_write(path, &t, 1, NULL, 0), TOVL_OK, "%s: %s", path, tovl_last_error());
}

static void write_two(const char *path, const char *n1, const void *d1, const char *n2, const void *d2, uint64_t rows,
                      uint64_t cols) {
    uint64_t shape[2] = {rows, cols};
    tovl_tensor t[2] = {{.name = n1, .dtype = "BF16", .ndim = 2, .shape = shape, .data = d1},
                        {.name = n2, .dtype = "BF16", .ndim = 2, .shape = shape, .data = d2}};
    cr_assert_eq(tovl_safetensors_write(path, t, 2, NULL, 0), TOVL_OK, "%s: %s", path, tovl_last_error());
}

/* An untied base model, an adapter that saved both full matrices with a few
 * rows changed (modules_to_save: rowdiff on the device), and one with
 * trainable-token rows for the input embedding. */
static void import_fixture_make(import_fixture *fx) {
    memset(fx, 0, sizeof *fx);
    const char *tmp = getenv("TMPDIR");
    snprintf(fx->root, sizeof fx->root, "%s/tovl-faults-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(fx->root), "mkdtemp %s", fx->root);
    snprintf(fx->model_dir, sizeof fx->model_dir, "%s/model", fx->root);
    snprintf(fx->mts_dir, sizeof fx->mts_dir, "%s/mts", fx->root);
    snprintf(fx->tt_dir, sizeof fx->tt_dir, "%s/tt", fx->root);
    cr_assert_eq(mkdir(fx->model_dir, 0700), 0);
    cr_assert_eq(mkdir(fx->mts_dir, 0700), 0);
    cr_assert_eq(mkdir(fx->tt_dir, 0700), 0);
    char path[160];
    static uint16_t embed[IV * IH], lm[IV * IH], embed2[IV * IH], lm2[IV * IH];
    static float delta[3 * IH];
    tu_fill_bf16(&rng, embed, IV * IH);
    tu_fill_bf16(&rng, lm, IV * IH);
    memcpy(embed2, embed, sizeof embed);
    memcpy(lm2, lm, sizeof lm);
    for (int i = 0; i < 5; i++) embed2[(size_t)(7 + 13 * i) * IH + (size_t)i] ^= 0x0101;
    for (int i = 0; i < 4; i++) lm2[(size_t)(3 + 19 * i) * IH + (size_t)(2 * i)] ^= 0x0040;
    for (int i = 0; i < 3 * IH; i++) delta[i] = tovl_bf16_to_f32(tu_bf16(&rng));

    snprintf(path, sizeof path, "%s/config.json", fx->model_dir);
    char cfg[160];
    snprintf(cfg, sizeof cfg, "{\"vocab_size\": %d, \"hidden_size\": %d, \"tie_word_embeddings\": false}\n", IV, IH);
    write_text(path, cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", fx->model_dir);
    write_two(path, "model.embed_tokens.weight", embed, "lm_head.weight", lm, IV, IH);

    snprintf(path, sizeof path, "%s/adapter_config.json", fx->mts_dir);
    write_text(path, "{\"peft_type\": \"LORA\", \"modules_to_save\": [\"embed_tokens\", \"lm_head\"]}\n");
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", fx->mts_dir);
    write_two(path, "base_model.model.model.embed_tokens.weight", embed2, "base_model.model.lm_head.weight", lm2, IV,
              IH);

    snprintf(path, sizeof path, "%s/adapter_config.json", fx->tt_dir);
    write_text(path, "{\"peft_type\": \"LORA\", \"trainable_token_indices\": [4, 50, 95]}\n");
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", fx->tt_dir);
    write_tensor(path, "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", "F32", 3, IH,
                 delta);

    cr_assert_eq(tovl_model_open(fx->model_dir, 0, &fx->model), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_open(fx->mts_dir, &fx->mts), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_open(fx->tt_dir, &fx->tt), TOVL_OK, "%s", tovl_last_error());
}

static void remove_dir_files(const char *dir) {
    const char *names[] = {"config.json", "model.safetensors", "adapter_config.json", "adapter_model.safetensors"};
    char path[192];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void import_fixture_free(import_fixture *fx) {
    tovl_adapter_close(fx->mts);
    tovl_adapter_close(fx->tt);
    tovl_model_close(fx->model);
    remove_dir_files(fx->model_dir);
    remove_dir_files(fx->mts_dir);
    remove_dir_files(fx->tt_dir);
    rmdir(fx->root);
}

typedef struct import_arg {
    const import_fixture *fx;
    const tovl_adapter *adapter;
    bool resolve_only;
    uint32_t want_embed, want_lm; /* rows a clean run yields */
} import_arg;

static tovl_status op_import(void *arg) {
    const import_arg *a = arg;
    if (a->resolve_only) {
        tovl_adapter_rows *rows = (tovl_adapter_rows *)&rows;
        tovl_status st = tovl_adapter_resolve(be, &k, a->adapter, a->fx->model, &rows);
        if (st == TOVL_OK) {
            const tovl_adapter_rows_info *info = tovl_adapter_rows_get_info(rows);
            cr_assert_eq(info->desc.embed.count, a->want_embed, "embed rows");
            cr_assert_eq(info->desc.has_lmhead ? info->desc.lmhead.count : 0, a->want_lm, "lm_head rows");
            tovl_adapter_rows_free(rows);
        } else {
            cr_assert_null(rows, "resolve failed but handed out rows");
        }
        return st;
    }
    tovl_embed_overlay *ov = (tovl_embed_overlay *)&ov;
    tovl_status st = tovl_adapter_build_overlay(be, &k, a->adapter, a->fx->model, &ov);
    if (st == TOVL_OK) {
        tovl_embed_overlay_view v = tovl_embed_overlay_get_view(ov);
        cr_assert_eq(v.embed_count, a->want_embed, "embed rows");
        cr_assert_eq(v.lmhead_count, a->want_lm, "lm_head rows");
        tovl_embed_overlay_release(ov);
    } else {
        cr_assert_null(ov, "import failed but handed out an overlay");
    }
    return st;
}

Test(faults, adapter_import_every_device_call) {
    import_fixture fx;
    import_fixture_make(&fx);
    import_arg mts = {&fx, fx.mts, false, 5, 4}, tt = {&fx, fx.tt, false, 3, 0};
    long driven = 0;
    driven += drive("import modules_to_save: resolve", op_import, &(import_arg){&fx, fx.mts, true, 5, 4});
    driven += drive("import modules_to_save: build_overlay", op_import, &mts);
    driven += drive("import trainable tokens: build_overlay", op_import, &tt);
    /* rowdiff of two full matrices: allocations, uploads, a launch, a sync and a download each */
    cr_assert_geq(driven, 10, "the import made too few device calls to be driven: %ld", driven);
    import_fixture_free(&fx);
}

Test(faults, adapter_import_with_each_kernel_lookup_failing) {
    import_fixture fx;
    import_fixture_make(&fx);
    static const char *const names[4] = {TOVL_KERNEL_ROWDIFF, TOVL_KERNEL_EMBED_OVERLAY,
                                         TOVL_KERNEL_LMHEAD_OVERLAY_BF16, TOVL_KERNEL_LMHEAD_OVERLAY_F32};
    for (long n = 1; n <= 4; n++) {
        reset_counters();
        w->fail_lookup_at = n;
        tovl_overlay_kernels partial = tovl_overlay_kernels_resolve(be);
        w->fail_lookup_at = 0;
        long live = tu_live(w);
        tovl_embed_overlay *ov = NULL;
        /* Full matrices need rowdiff; embed and lm_head rows need their kernels: all four. */
        tovl_status st = tovl_adapter_build_overlay(be, &partial, fx.mts, fx.model, &ov);
        cr_assert_eq(st, TOVL_ERR_KERNEL_MISSING, "import without %s: %s (%s)", names[n - 1], tovl_status_str(st),
                     tovl_last_error());
        cr_assert(strstr(tovl_last_error(), names[n - 1]), "the error names %s: %s", names[n - 1], tovl_last_error());
        cr_assert_null(ov);
        cr_assert_eq(tu_live(w), live, "import without %s leaked", names[n - 1]);
        expect_golden_unchanged("an import with a kernel missing");
    }
    import_fixture_free(&fx);
}
#else
Test(faults, adapter_import_every_device_call) {
    cr_skip_test("adapter import (core/import) is not in this build: see tests/hardening.cmake");
}
#endif
