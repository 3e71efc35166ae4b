/* Hostile batches on every backend present (tovl_backend_list): token ids >=
 * vocab, slots out of range, NaN and Inf rows, T = 0, max_loras 1 and 256, one
 * slot holding thousands of rows. Each output is checked cell by cell against
 * an oracle written here from the spec (not the CPU backend's code), inside
 * poisoned guards on both sides; inputs must come back unchanged too.
 *
 * One parameterized test per scenario, one parameter per backend tovl knows:
 * an absent backend skips with its reason. TOVL_TEST_BACKENDS (comma list)
 * limits the backends, e.g. to "cpu" under Valgrind. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { GUARD = 256, MAX_BACKENDS = 8 };
#define POISON 0xD15EA5EDu

/* ------------------------------------------------------------------------ */
/* Backends                                                                  */
/* ------------------------------------------------------------------------ */
static size_t backend_index[MAX_BACKENDS];

/* Count only: capacity 0 opens nothing, so no GPU runtime is initialised in
 * Criterion's parent process before it forks. */
static struct criterion_test_params backend_params(void) {
    size_t n = tovl_backend_list(NULL, 0);
    if (n > MAX_BACKENDS) {
        n = MAX_BACKENDS;
    }
    for (size_t i = 0; i < n; i++) {
        backend_index[i] = i;
    }
    return cr_make_param_array(size_t, backend_index, n);
}

typedef struct bk {
    tovl_backend *be;
    tu_wrap *w; /* counts launches, allocations and copies */
    char name[32];
} bk;

/* Open backend number `index` of tovl_backend_list wrapped, or skip with why. */
static bk open_backend(size_t index) {
    tovl_backend_info info[MAX_BACKENDS];
    size_t n = tovl_backend_list(info, MAX_BACKENDS);
    cr_assert_lt(index, n);
    bk b = {0};
    snprintf(b.name, sizeof b.name, "%s", info[index].name);
    b.be = tu_open_listed(&info[index], "hostile", &b.w);
    return b;
}

static void close_backend(bk *b) {
    cr_expect_eq(tu_live(b->w), 0, "%s: %ld device allocations still live", b->name, tu_live(b->w));
    tovl_backend_close(b->be);
}

/* ------------------------------------------------------------------------ */
/* The batch and the pool, on the host                                       */
/* ------------------------------------------------------------------------ */
typedef enum { IDS_NORMAL, IDS_HOSTILE } id_mode;
typedef enum { SLOTS_NORMAL, SLOTS_HOSTILE } slot_mode;

typedef struct config {
    uint32_t T, h, vocab, extra_ld, max_loras;
    bool tied;
    uint32_t max_rows;   /* rows per part: 1 .. max_rows */
    uint32_t big_rows;   /* > 0: slot 0 holds exactly this many rows in each part */
    bool specials;       /* NaN (several payloads), +-Inf, -0, huge values */
    id_mode ids;
    slot_mode slots;
} config;

typedef struct slot_data {
    bool present, has_lm;
    uint32_t ne, nl;
    uint32_t *eids, *lids;
    uint16_t *erows, *lrows;
} slot_data;

typedef struct world {
    config c;
    uint32_t ld;
    slot_data *slot;     /* [max_loras] */
    uint32_t *ids;       /* [T] */
    int32_t *slots;      /* [T] */
    uint16_t *hidden;    /* [T, h] */
    uint16_t *lg_bf16;   /* [T, ld] base logits */
    float *lg_f32;       /* [T, ld] */
} world;

/* Beyond vocab: vocab itself, vocab + 1 (added below), huge, and negative i32s read as u32. */
static const uint32_t hostile_ids[] = {0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu, 0xFFFFFFFEu};
static const int32_t hostile_slots[] = {-1, -2, INT32_MIN, 0, 0, INT32_MAX};

static uint16_t special_bf16(tu_rng *r) {
    /* quiet and signalling NaNs with payloads, infinities, -0, the largest finite */
    static const uint16_t v[] = {0x7FC0, 0xFFC1, 0x7F81, 0xFFFF, 0x7F80, 0xFF80, 0x8000, 0x7F7F, 0xFF7F};
    return v[tu_below(r, sizeof v / sizeof v[0])];
}

static void fill(tu_rng *r, const config *c, uint16_t *dst, size_t n) {
    tu_fill_bf16(r, dst, n);
    for (size_t i = 0; c->specials && i < n; i++) {
        if (tu_below(r, 16) == 0) {
            dst[i] = special_bf16(r);
        }
    }
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    cr_assert_not_null(p, "out of host memory");
    return p;
}

static world world_make(const config *c, const char *salt) {
    tu_rng r = tu_rng_for(salt);
    world w = {.c = *c, .ld = c->vocab + c->extra_ld};
    w.slot = xcalloc(c->max_loras, sizeof *w.slot);
    for (uint32_t s = 0; s < c->max_loras; s++) {
        slot_data *sd = &w.slot[s];
        /* Slot 0 always present with both parts; others: a third empty, and a
         * mix of embed-only, lm_head-only and both. */
        sd->present = s == 0 || tu_below(&r, 3) != 0;
        if (!sd->present) {
            continue;
        }
        uint32_t kind = s == 0 ? 2 : tu_below(&r, 3); /* 0 embed only, 1 lm_head only, 2 both */
        sd->has_lm = kind != 0;
        sd->ne = kind != 1 ? 1 + tu_below(&r, c->max_rows) : 0;
        sd->nl = kind != 0 ? 1 + tu_below(&r, c->max_rows) : 0;
        if (s == 0 && c->big_rows) {
            sd->ne = sd->nl = c->big_rows;
        }
        if (sd->ne > c->vocab) sd->ne = c->vocab;
        if (sd->nl > c->vocab) sd->nl = c->vocab;
        sd->eids = xcalloc(sd->ne, sizeof *sd->eids);
        sd->lids = xcalloc(sd->nl, sizeof *sd->lids);
        sd->erows = xcalloc((size_t)sd->ne * c->h, sizeof *sd->erows);
        sd->lrows = xcalloc((size_t)sd->nl * c->h, sizeof *sd->lrows);
        if (sd->ne == c->vocab || sd->ne > 1000) {
            /* many rows: a shuffled prefix of a permutation, not rejection sampling */
            uint32_t *perm = xcalloc(c->vocab, sizeof *perm);
            for (uint32_t i = 0; i < c->vocab; i++) perm[i] = i;
            for (uint32_t i = c->vocab - 1; i > 0; i--) {
                uint32_t j = tu_below(&r, i + 1), t = perm[i];
                perm[i] = perm[j], perm[j] = t;
            }
            memcpy(sd->eids, perm, sd->ne * sizeof *perm);
            memcpy(sd->lids, perm + (c->vocab - sd->nl), sd->nl * sizeof *perm);
            free(perm);
        } else {
            tu_distinct_ids(&r, c->vocab, sd->ne, sd->eids);
            tu_distinct_ids(&r, c->vocab, sd->nl, sd->lids);
        }
        fill(&r, c, sd->erows, (size_t)sd->ne * c->h);
        fill(&r, c, sd->lrows, (size_t)sd->nl * c->h);
    }
    w.ids = xcalloc(c->T, sizeof *w.ids);
    w.slots = xcalloc(c->T, sizeof *w.slots);
    for (uint32_t t = 0; t < c->T; t++) {
        int32_t s;
        uint32_t pick = tu_below(&r, 10);
        if (c->slots == SLOTS_HOSTILE && pick < 5) {
            uint32_t k = tu_below(&r, sizeof hostile_slots / sizeof hostile_slots[0] + 2);
            s = k == 6 ? (int32_t)c->max_loras : k == 7 ? (int32_t)c->max_loras + 1 : hostile_slots[k];
        } else if (pick == 0) {
            s = tu_below(&r, 2) ? -1 : (int32_t)(c->max_loras + tu_below(&r, 5));
        } else {
            s = (int32_t)tu_below(&r, c->max_loras);
        }
        if (t == 0) {
            s = 0; /* row 0 always patches: no scenario is vacuous */
        }
        w.slots[t] = s;
        /* An id the slot overlays, or (for a slot out of range) one that slot 0
         * or the last slot overlays, so clamping or wrapping a slot shows. */
        const slot_data *src = &w.slot[s >= 0 && (uint32_t)s < c->max_loras ? (uint32_t)s
                                       : s < 0 ? 0 : c->max_loras - 1];
        uint32_t id = tu_below(&r, c->vocab);
        if (src->ne && (t == 0 || tu_below(&r, 4) != 0)) {
            id = src->eids[tu_below(&r, src->ne)];
        }
        if (t > 0 && c->ids == IDS_HOSTILE && tu_below(&r, 2)) {
            uint32_t k = tu_below(&r, sizeof hostile_ids / sizeof hostile_ids[0] + 2);
            id = k < 2 ? c->vocab + k : hostile_ids[k - 2];
        } else if (t > 0 && tu_below(&r, 10) == 0) {
            id = c->vocab + tu_below(&r, 100);
        }
        w.ids[t] = id;
    }
    w.hidden = xcalloc((size_t)c->T * c->h, sizeof *w.hidden);
    fill(&r, c, w.hidden, (size_t)c->T * c->h);
    w.lg_bf16 = xcalloc((size_t)c->T * w.ld, sizeof *w.lg_bf16);
    w.lg_f32 = xcalloc((size_t)c->T * w.ld, sizeof *w.lg_f32);
    tu_fill_bf16(&r, w.lg_bf16, (size_t)c->T * w.ld);
    for (size_t i = 0; i < (size_t)c->T * w.ld; i++) {
        w.lg_f32[i] = tovl_bf16_to_f32(tu_bf16(&r)) * 0.75f;
    }
    return w;
}

static void world_free(world *w) {
    for (uint32_t s = 0; s < w->c.max_loras; s++) {
        free(w->slot[s].eids);
        free(w->slot[s].lids);
        free(w->slot[s].erows);
        free(w->slot[s].lrows);
    }
    free(w->slot);
    free(w->ids);
    free(w->slots);
    free(w->hidden);
    free(w->lg_bf16);
    free(w->lg_f32);
}

/* ------------------------------------------------------------------------ */
/* The oracle, from the spec's text                                          */
/* ------------------------------------------------------------------------ */
static float f32_of(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* 256 lanes, lane i % 256 in increasing i, then the tree 128 .. 1. This file
 * is built with -ffp-contract=off: no product is fused into a sum. */
static float spec_dot(const uint16_t *x, const uint16_t *w, uint32_t h) {
    float p[256];
    for (int l = 0; l < 256; l++) p[l] = 0.0f;
    for (uint32_t i = 0; i < h; i++) {
        float prod = f32_of(x[i]) * f32_of(w[i]);
        p[i % 256] = p[i % 256] + prod;
    }
    for (int stride = 128; stride >= 1; stride /= 2) {
        for (int l = 0; l < stride; l++) p[l] = p[l] + p[l + stride];
    }
    return p[0];
}

static uint32_t f32_bits_canonical(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return isnan(v) ? 0x7FC00000u : bits;
}

static bool slot_valid(const world *w, int32_t s) {
    return s >= 0 && (uint32_t)s < w->c.max_loras && w->slot[s].present;
}

/* Row t's slot: the per-row array, or `active` for every row when active mode. */
static int32_t row_slot(const world *w, bool active_mode, int32_t active, uint32_t t) {
    return active_mode ? active : w->slots[t];
}

static void expect_embed(const world *w, bool active_mode, int32_t active, uint16_t *out) {
    memcpy(out, w->hidden, (size_t)w->c.T * w->c.h * sizeof *out);
    for (uint32_t t = 0; t < w->c.T; t++) {
        int32_t s = row_slot(w, active_mode, active, t);
        if (!slot_valid(w, s)) continue;
        const slot_data *sd = &w->slot[s];
        for (uint32_t j = 0; j < sd->ne; j++) {
            if (sd->eids[j] == w->ids[t]) {
                memcpy(out + (size_t)t * w->c.h, sd->erows + (size_t)j * w->c.h, w->c.h * sizeof *out);
            }
        }
    }
}

/* `out` holds T * ld cells of 2 (bf16) or 4 (f32) bytes. */
static void expect_lmhead(const world *w, bool f32, bool active_mode, int32_t active, void *out) {
    size_t cells = (size_t)w->c.T * w->ld;
    memcpy(out, f32 ? (const void *)w->lg_f32 : (const void *)w->lg_bf16, cells * (f32 ? 4 : 2));
    for (uint32_t t = 0; t < w->c.T; t++) {
        int32_t s = row_slot(w, active_mode, active, t);
        if (!slot_valid(w, s)) continue;
        const slot_data *sd = &w->slot[s];
        const uint32_t *ids = sd->has_lm ? sd->lids : w->c.tied ? sd->eids : NULL;
        const uint16_t *rows = sd->has_lm ? sd->lrows : sd->erows;
        uint32_t n = sd->has_lm ? sd->nl : w->c.tied ? sd->ne : 0;
        for (uint32_t k = 0; k < n; k++) {
            float d = spec_dot(w->hidden + (size_t)t * w->c.h, rows + (size_t)k * w->c.h, w->c.h);
            size_t cell = (size_t)t * w->ld + ids[k];
            if (f32) {
                uint32_t bits = f32_bits_canonical(d);
                memcpy((uint8_t *)out + cell * 4, &bits, 4);
            } else {
                ((uint16_t *)out)[cell] = tovl_f32_to_bf16(d);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Guarded device buffers                                                    */
/* ------------------------------------------------------------------------ */
typedef struct guarded {
    tovl_devptr base, data;
    size_t payload, total;
} guarded;

static guarded guarded_make(const bk *b, const void *init, size_t payload) {
    guarded g = {.payload = payload, .total = GUARD + ((payload + 3u) & ~(size_t)3u) + GUARD};
    cr_assert_eq(tovl_alloc(b->be, g.total, &g.base), TOVL_OK, "%s: alloc: %s", b->name, tovl_last_error());
    g.data = g.base + GUARD;
    cr_assert_eq(tovl_fill_u32(b->be, g.base, POISON, g.total), TOVL_OK, "%s: %s", b->name, tovl_last_error());
    if (payload) {
        cr_assert_eq(tovl_upload(b->be, g.data, init, payload), TOVL_OK, "%s: %s", b->name, tovl_last_error());
    }
    return g;
}

/* Download; assert every guard byte is intact; return the payload (caller frees). */
static uint8_t *guarded_check(const bk *b, guarded *g, const char *what) {
    uint8_t *all = xcalloc(g->total, 1);
    cr_assert_eq(tovl_download(b->be, all, g->base, g->total), TOVL_OK, "%s: %s", b->name, tovl_last_error());
    const uint32_t poison = POISON;
    const uint8_t *pat = (const uint8_t *)&poison;
    for (size_t i = 0; i < g->total; i++) {
        if (i >= GUARD && i < GUARD + g->payload) continue;
        cr_assert_eq(all[i], pat[i % 4], "%s: %s: guard byte %zu of %zu (%s the data) was written", b->name, what,
                     i, g->total, i < GUARD ? "before" : "after");
    }
    uint8_t *payload = xcalloc(g->payload, 1);
    memcpy(payload, all + GUARD, g->payload);
    free(all);
    tovl_free(b->be, g->base);
    g->base = 0;
    return payload;
}

static void guarded_expect_unchanged(const bk *b, guarded *g, const void *init, const char *what) {
    uint8_t *got = guarded_check(b, g, what);
    cr_assert(memcmp(got, init, g->payload) == 0, "%s: input %s was modified", b->name, what);
    free(got);
}

/* First differing element of two arrays, with row and column. */
static void expect_same(const bk *b, const char *what, const void *want, const void *got, size_t n, size_t elem,
                        size_t row_len) {
    for (size_t i = 0; i < n; i++) {
        const uint8_t *a = (const uint8_t *)want + i * elem, *g = (const uint8_t *)got + i * elem;
        if (memcmp(a, g, elem) != 0) {
            uint32_t va = 0, vg = 0;
            memcpy(&va, a, elem);
            memcpy(&vg, g, elem);
            cr_assert_fail("%s: %s: row %zu col %zu: expected 0x%0*x, got 0x%0*x (seed %" PRIu64 ")", b->name, what,
                           i / row_len, i % row_len, (int)elem * 2, va, (int)elem * 2, vg, tu_seed());
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Running a scenario                                                        */
/* ------------------------------------------------------------------------ */
static tovl_token_overlay_set *build_set(const bk *b, const world *w, const tovl_overlay_kernels *k) {
    tovl_embed_overlay **ovs = xcalloc(w->c.max_loras, sizeof *ovs);
    for (uint32_t s = 0; s < w->c.max_loras; s++) {
        const slot_data *sd = &w->slot[s];
        if (!sd->present) continue;
        tovl_overlay_desc d = {
            .adapter = "hostile",
            .vocab = w->c.vocab,
            .hidden = w->c.h,
            .embed = {"embed", sd->eids, sd->erows, sd->ne, w->c.h},
            .has_lmhead = sd->has_lm,
            .lmhead = {"lm_head", sd->lids, sd->lrows, sd->nl, w->c.h},
            .tied = w->c.tied,
        };
        cr_assert_eq(tovl_build_overlay(b->be, k, &d, &ovs[s]), TOVL_OK, "%s: slot %u: %s", b->name, s,
                     tovl_last_error());
    }
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(b->be, ovs, w->c.max_loras, w->c.tied, &set), TOVL_OK, "%s: %s",
                 b->name, tovl_last_error());
    for (uint32_t s = 0; s < w->c.max_loras; s++) {
        tovl_embed_overlay_release(ovs[s]);
    }
    free(ovs);
    return set;
}

/* Both hooks, all three kernels, on per-row slots or one active slot; every
 * output cell and guard checked. Returns how many cells the oracle changed. */
static size_t run_hooks(const bk *b, const world *w, const tovl_token_overlay_set *set,
                        const tovl_overlay_kernels *k, bool active_mode, int32_t active) {
    const config *c = &w->c;
    size_t changed = 0;
    char what[96];
    snprintf(what, sizeof what, "%s", active_mode ? "active-slot batch" : "per-row slots");

    /* embed_overlay */
    {
        guarded g_ids = guarded_make(b, w->ids, (size_t)c->T * 4);
        guarded g_slots = guarded_make(b, w->slots, (size_t)c->T * 4);
        guarded g_hidden = guarded_make(b, w->hidden, (size_t)c->T * c->h * 2);
        tovl_embed_hook_args a = {g_hidden.data, g_ids.data, active_mode ? 0 : g_slots.data, active, c->T, c->h};
        cr_assert_eq(tovl_embed_hook(set, k, &a, NULL), TOVL_OK, "%s: embed hook: %s", b->name, tovl_last_error());
        cr_assert_eq(tovl_synchronize(b->be, NULL), TOVL_OK, "%s: %s", b->name, tovl_last_error());
        uint16_t *want = xcalloc((size_t)c->T * c->h, 2);
        expect_embed(w, active_mode, active, want);
        uint8_t *got = guarded_check(b, &g_hidden, "embed hidden");
        snprintf(what, sizeof what, "embed_overlay (%s)", active_mode ? "active slot" : "per-row slots");
        expect_same(b, what, want, got, (size_t)c->T * c->h, 2, c->h);
        changed += memcmp(want, w->hidden, (size_t)c->T * c->h * 2) != 0;
        guarded_expect_unchanged(b, &g_ids, w->ids, "token ids");
        guarded_expect_unchanged(b, &g_slots, w->slots, "token slots");
        free(want);
        free(got);
    }
    /* lmhead_overlay_bf16 and _f32 */
    for (int f32 = 0; f32 < 2; f32++) {
        size_t cells = (size_t)c->T * w->ld, elem = f32 ? 4 : 2;
        guarded g_slots = guarded_make(b, w->slots, (size_t)c->T * 4);
        guarded g_hidden = guarded_make(b, w->hidden, (size_t)c->T * c->h * 2);
        guarded g_logits = guarded_make(b, f32 ? (const void *)w->lg_f32 : (const void *)w->lg_bf16, cells * elem);
        tovl_lmhead_hook_args a = {g_logits.data, f32 ? TOVL_LOGITS_F32 : TOVL_LOGITS_BF16, w->ld, g_hidden.data,
                                   active_mode ? 0 : g_slots.data, active, c->T, c->h};
        cr_assert_eq(tovl_lmhead_hook(set, k, &a, NULL), TOVL_OK, "%s: lm_head hook: %s", b->name,
                     tovl_last_error());
        cr_assert_eq(tovl_synchronize(b->be, NULL), TOVL_OK, "%s: %s", b->name, tovl_last_error());
        void *want = xcalloc(cells, elem);
        expect_lmhead(w, f32, active_mode, active, want);
        uint8_t *got = guarded_check(b, &g_logits, "logits");
        snprintf(what, sizeof what, "lmhead_overlay_%s (%s)", f32 ? "f32" : "bf16",
                 active_mode ? "active slot" : "per-row slots");
        expect_same(b, what, want, got, cells, elem, w->ld);
        changed += memcmp(want, f32 ? (const void *)w->lg_f32 : (const void *)w->lg_bf16, cells * elem) != 0;
        guarded_expect_unchanged(b, &g_hidden, w->hidden, "hidden (lm_head input)");
        guarded_expect_unchanged(b, &g_slots, w->slots, "row slots");
        free(want);
        free(got);
    }
    return changed;
}

static void run_scenario(size_t index, const config *c, const char *salt) {
    bk b = open_backend(index);
    world w = world_make(c, salt);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(b.be);
    tovl_token_overlay_set *set = build_set(&b, &w, &k);
    size_t changed = run_hooks(&b, &w, set, &k, false, -1);
    cr_assert_eq(changed, 3, "%s: every kernel must patch something in this scenario (not vacuous)", b.name);
    /* One active slot for the whole batch: slot 0 patches; out-of-range and
     * negative slots patch nothing and launch nothing. */
    cr_assert_eq(run_hooks(&b, &w, set, &k, true, 0), 3, "%s: active slot 0 must patch", b.name);
    const int32_t inactive[] = {-1, INT32_MIN, (int32_t)c->max_loras, (int32_t)c->max_loras + 1, INT32_MAX};
    for (size_t i = 0; i < sizeof inactive / sizeof inactive[0]; i++) {
        long launches = b.w->launches;
        cr_assert_eq(run_hooks(&b, &w, set, &k, true, inactive[i]), 0);
        cr_assert_eq(b.w->launches, launches, "%s: active slot %d launched a kernel", b.name, inactive[i]);
    }
    tovl_token_overlay_set_destroy(set);
    world_free(&w);
    close_backend(&b);
}

/* ------------------------------------------------------------------------ */
/* Scenarios                                                                 */
/* ------------------------------------------------------------------------ */
ParameterizedTestParameters(hostile, ids_beyond_vocab) { return backend_params(); }
ParameterizedTest(size_t *index, hostile, ids_beyond_vocab, .timeout = 600) {
    config c = {.T = 96, .h = 72, .vocab = 500, .extra_ld = 40, .max_loras = 4, .tied = true, .max_rows = 30,
                .ids = IDS_HOSTILE};
    run_scenario(*index, &c, "hostile.ids");
}

ParameterizedTestParameters(hostile, slots_out_of_range) { return backend_params(); }
ParameterizedTest(size_t *index, hostile, slots_out_of_range, .timeout = 600) {
    config c = {.T = 128, .h = 40, .vocab = 300, .extra_ld = 0, .max_loras = 3, .tied = false, .max_rows = 40,
                .slots = SLOTS_HOSTILE};
    run_scenario(*index, &c, "hostile.slots");
}

ParameterizedTestParameters(hostile, nan_inf_rows) { return backend_params(); }
ParameterizedTest(size_t *index, hostile, nan_inf_rows, .timeout = 600) {
    config c = {.T = 64, .h = 300, .vocab = 400, .extra_ld = 3, .max_loras = 4, .tied = true, .max_rows = 24,
                .specials = true, .ids = IDS_HOSTILE, .slots = SLOTS_HOSTILE};
    run_scenario(*index, &c, "hostile.specials");
}

ParameterizedTestParameters(hostile, max_loras_1) { return backend_params(); }
ParameterizedTest(size_t *index, hostile, max_loras_1, .timeout = 600) {
    config c = {.T = 40, .h = 64, .vocab = 256, .extra_ld = 1, .max_loras = 1, .tied = true, .max_rows = 32,
                .slots = SLOTS_HOSTILE};
    run_scenario(*index, &c, "hostile.maxl1");
}

ParameterizedTestParameters(hostile, max_loras_256) { return backend_params(); }
ParameterizedTest(size_t *index, hostile, max_loras_256, .timeout = 600) {
    config c = {.T = 700, .h = 48, .vocab = 1024, .extra_ld = 0, .max_loras = 256, .tied = true, .max_rows = 6,
                .ids = IDS_HOSTILE, .slots = SLOTS_HOSTILE};
    run_scenario(*index, &c, "hostile.maxl256");
}

ParameterizedTestParameters(hostile, thousands_of_rows_in_one_slot) { return backend_params(); }
ParameterizedTest(size_t *index, hostile, thousands_of_rows_in_one_slot, .timeout = 600) {
    config c = {.T = 24, .h = 64, .vocab = 6000, .extra_ld = 5, .max_loras = 2, .tied = false, .max_rows = 4,
                .big_rows = 3500};
    run_scenario(*index, &c, "hostile.bigslot");
}

/* T = 0: both hooks, per-row slots or an active slot, with real buffers and
 * with null pointers: success, no launch, nothing written. */
ParameterizedTestParameters(hostile, empty_batch) { return backend_params(); }
ParameterizedTest(size_t *index, hostile, empty_batch, .timeout = 600) {
    bk b = open_backend(*index);
    config c = {.T = 8, .h = 32, .vocab = 100, .max_loras = 2, .tied = true, .max_rows = 8};
    world w = world_make(&c, "hostile.t0");
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(b.be);
    tovl_token_overlay_set *set = build_set(&b, &w, &k);
    guarded g_ids = guarded_make(&b, w.ids, (size_t)c.T * 4);
    guarded g_slots = guarded_make(&b, w.slots, (size_t)c.T * 4);
    guarded g_hidden = guarded_make(&b, w.hidden, (size_t)c.T * c.h * 2);
    guarded g_logits = guarded_make(&b, w.lg_f32, (size_t)c.T * w.ld * 4);
    long launches = b.w->launches;
    for (int nulls = 0; nulls < 2; nulls++) {
        for (int active_mode = 0; active_mode < 2; active_mode++) {
            tovl_devptr slots = active_mode ? 0 : nulls ? 0 : g_slots.data;
            tovl_embed_hook_args e = {nulls ? 0 : g_hidden.data, nulls ? 0 : g_ids.data, slots, 0, 0, c.h};
            cr_assert_eq(tovl_embed_hook(set, &k, &e, NULL), TOVL_OK, "%s: T=0 embed: %s", b.name,
                         tovl_last_error());
            for (int f32 = 0; f32 < 2; f32++) {
                tovl_lmhead_hook_args l = {nulls ? 0 : g_logits.data, f32 ? TOVL_LOGITS_F32 : TOVL_LOGITS_BF16, w.ld,
                                           nulls ? 0 : g_hidden.data, slots, 0, 0, c.h};
                cr_assert_eq(tovl_lmhead_hook(set, &k, &l, NULL), TOVL_OK, "%s: T=0 lm_head: %s", b.name,
                             tovl_last_error());
            }
        }
    }
    cr_assert_eq(tovl_synchronize(b.be, NULL), TOVL_OK);
    cr_assert_eq(b.w->launches, launches, "%s: T = 0 launched a kernel", b.name);
    guarded_expect_unchanged(&b, &g_ids, w.ids, "token ids");
    guarded_expect_unchanged(&b, &g_slots, w.slots, "token slots");
    guarded_expect_unchanged(&b, &g_hidden, w.hidden, "hidden");
    guarded_expect_unchanged(&b, &g_logits, w.lg_f32, "logits");
    /* The same set still patches a real batch afterwards. */
    cr_assert_eq(run_hooks(&b, &w, set, &k, false, -1), 3);
    tovl_token_overlay_set_destroy(set);
    world_free(&w);
    close_backend(&b);
}
