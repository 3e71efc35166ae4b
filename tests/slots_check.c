/* The in-place slots check (slots_check.h). */
#include "slots_check.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum {
    V = 300,        /* vocab */
    H = 40,         /* hidden */
    T = 24,         /* rows of the batch */
    L = 4,          /* slots */
    LD = V + 5,     /* logits row stride: 5 cells past the vocab that no hook may touch */
    POOL = 12,      /* adapters to choose from */
    GUARD = 64,     /* poisoned bytes on each side of every output */
};

typedef struct adapter {
    uint32_t ne, nl;
    bool has_lm;
    uint32_t *eids, *lids;
    uint16_t *erows, *lrows;
    tovl_embed_overlay *on_target, *on_cpu;
} adapter;

/* One backend's copy of the batch: inputs, and outputs with guards. */
typedef struct batch_bufs {
    tovl_backend *be;
    tovl_devptr ids, slots, final_hidden;
    tovl_devptr hidden, bf16, f32; /* the payloads; GUARD bytes before and after each */
} batch_bufs;

typedef struct batch_host {
    uint32_t ids[T];
    int32_t slots[T];
    uint16_t hidden[T * H], final_hidden[T * H];
    uint16_t bf16[T * LD];
    uint32_t f32[T * LD];
    uint8_t guard[GUARD];
} batch_host;

static const size_t hidden_bytes = sizeof(uint16_t) * T * H, bf16_bytes = sizeof(uint16_t) * T * LD,
                    f32_bytes = sizeof(uint32_t) * T * LD;

static tovl_devptr guarded(tovl_backend *be, const batch_host *h, size_t bytes) {
    tovl_devptr p = 0;
    cr_assert_eq(tovl_alloc(be, bytes + 2 * GUARD, &p), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_upload(be, p, h->guard, GUARD), TOVL_OK);
    cr_assert_eq(tovl_upload(be, p + GUARD + bytes, h->guard, GUARD), TOVL_OK);
    return p + GUARD;
}

static tovl_devptr uploaded(tovl_backend *be, const void *src, size_t bytes) {
    tovl_devptr p = 0;
    cr_assert_eq(tovl_alloc(be, bytes, &p), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_upload(be, p, src, bytes), TOVL_OK, "%s", tovl_last_error());
    return p;
}

static void bufs_open(tovl_backend *be, const batch_host *h, batch_bufs *b) {
    b->be = be;
    b->ids = uploaded(be, h->ids, sizeof h->ids);
    b->slots = uploaded(be, h->slots, sizeof h->slots);
    b->final_hidden = uploaded(be, h->final_hidden, sizeof h->final_hidden);
    b->hidden = guarded(be, h, hidden_bytes);
    b->bf16 = guarded(be, h, bf16_bytes);
    b->f32 = guarded(be, h, f32_bytes);
}

static void bufs_reset(const batch_bufs *b, const batch_host *h) {
    cr_assert_eq(tovl_upload(b->be, b->hidden, h->hidden, hidden_bytes), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_upload(b->be, b->bf16, h->bf16, bf16_bytes), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_upload(b->be, b->f32, h->f32, f32_bytes), TOVL_OK, "%s", tovl_last_error());
}

/* The three outputs, one after the other, after checking their guards. */
static void bufs_read(const batch_bufs *b, const batch_host *h, uint8_t *out, const char *tag, uint32_t round) {
    const tovl_devptr at[3] = {b->hidden, b->bf16, b->f32};
    const size_t bytes[3] = {hidden_bytes, bf16_bytes, f32_bytes};
    uint8_t g[GUARD];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tovl_download(b->be, g, at[i] - GUARD, GUARD), TOVL_OK);
        cr_assert_eq(memcmp(g, h->guard, GUARD), 0, "%s round %u: guard before output %d written", tag, round, i);
        cr_assert_eq(tovl_download(b->be, g, at[i] + bytes[i], GUARD), TOVL_OK);
        cr_assert_eq(memcmp(g, h->guard, GUARD), 0, "%s round %u: guard after output %d written", tag, round, i);
        cr_assert_eq(tovl_download(b->be, out, at[i], bytes[i]), TOVL_OK, "%s", tovl_last_error());
        out += bytes[i];
    }
}

static void bufs_close(const batch_bufs *b) {
    const tovl_devptr plain[3] = {b->ids, b->slots, b->final_hidden};
    const tovl_devptr guarded_ones[3] = {b->hidden, b->bf16, b->f32};
    for (int i = 0; i < 3; i++) {
        tovl_free(b->be, plain[i]);
        tovl_free(b->be, guarded_ones[i] - GUARD);
    }
}

static slots_hooks hooks_for(const tovl_token_overlay_set *set, const tovl_overlay_kernels *k, const batch_bufs *b) {
    slots_hooks hk = {.set = set, .kernels = k};
    hk.embed = (tovl_embed_hook_args){
        .hidden = b->hidden, .token_ids = b->ids, .slots = b->slots, .active_slot = -1, .T = T, .hidden_size = H};
    hk.lm_bf16 = (tovl_lmhead_hook_args){.logits = b->bf16,
                                         .logits_dtype = TOVL_LOGITS_BF16,
                                         .ld = LD,
                                         .hidden = b->final_hidden,
                                         .slots = b->slots,
                                         .active_slot = -1,
                                         .T = T,
                                         .hidden_size = H};
    hk.lm_f32 = hk.lm_bf16;
    hk.lm_f32.logits = b->f32;
    hk.lm_f32.logits_dtype = TOVL_LOGITS_F32;
    return hk;
}

void slots_enqueue(const slots_hooks *hk, void *stream) {
    cr_assert_eq(tovl_embed_hook(hk->set, hk->kernels, &hk->embed, stream), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_lmhead_hook(hk->set, hk->kernels, &hk->lm_bf16, stream), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_lmhead_hook(hk->set, hk->kernels, &hk->lm_f32, stream), TOVL_OK, "%s", tovl_last_error());
}

static void eager_record(void *user, const slots_hooks *hk) {
    ((slots_eager *)user)->hooks = hk;
}

static void eager_replay(void *user) {
    slots_eager *e = user;
    slots_enqueue(e->hooks, e->stream);
    cr_assert_eq(tovl_synchronize(e->be, e->stream), TOVL_OK, "%s", tovl_last_error());
}

slots_replayer slots_eager_replayer(slots_eager *state) {
    return (slots_replayer){.record = eager_record, .replay = eager_replay, .load_stream = state->stream,
                            .user = state};
}

/* Adapter i's kind: 0 embed rows only, 1 lm_head rows only, 2 both, 3 embed
 * rows and an explicitly empty lm_head part. Counts 1 .. capacity; adapter 0
 * and 1 hold exactly the capacity. */
static void adapter_make(adapter *a, int i, uint32_t cap, tu_rng *r) {
    const int kind = i % 4;
    const uint32_t n1 = i < 2 ? cap : 1 + tu_below(r, cap), n2 = i < 2 ? cap : 1 + tu_below(r, cap);
    a->ne = kind == 1 ? 0 : n1;
    a->has_lm = kind != 0;
    a->nl = kind == 1 || kind == 2 ? n2 : 0;
    a->eids = calloc(cap, sizeof *a->eids);
    a->lids = calloc(cap, sizeof *a->lids);
    a->erows = calloc((size_t)cap * H, sizeof *a->erows);
    a->lrows = calloc((size_t)cap * H, sizeof *a->lrows);
    cr_assert(a->eids && a->lids && a->erows && a->lrows);
    tu_distinct_ids(r, V, a->ne, a->eids);
    tu_distinct_ids(r, V, a->nl, a->lids);
    tu_fill_bf16(r, a->erows, (size_t)a->ne * H);
    tu_fill_bf16(r, a->lrows, (size_t)a->nl * H);
}

static tovl_embed_overlay *adapter_build(tovl_backend *be, const adapter *a, bool tied) {
    tovl_embed_overlay *ov = NULL;
    cr_assert_eq(tu_build(be, V, H, a->eids, a->erows, a->ne, a->has_lm, a->lids, a->lrows, a->nl, tied, &ov),
                 TOVL_OK, "%s", tovl_last_error());
    return ov;
}

static void adapter_free(adapter *a) {
    tovl_embed_overlay_release(a->on_target);
    tovl_embed_overlay_release(a->on_cpu);
    free(a->eids);
    free(a->lids);
    free(a->erows);
    free(a->lrows);
}

static void host_make(batch_host *h, const adapter *pool, tu_rng *r) {
    for (int t = 0; t < T; t++) {
        h->slots[t] = (int32_t)tu_below(r, L + 2) - 1; /* -1 .. L: some rows have no adapter */
        const adapter *a = &pool[tu_below(r, POOL)];
        const uint32_t pick = tu_below(r, 8);
        h->ids[t] = pick == 0 ? V + tu_below(r, 3) : pick < 6 && a->ne ? a->eids[tu_below(r, a->ne)] : tu_below(r, V);
    }
    tu_fill_bf16(r, h->hidden, T * H);
    tu_fill_bf16(r, h->final_hidden, T * H);
    tu_fill_bf16(r, h->bf16, T * LD);
    for (int i = 0; i < T * LD; i++) {
        h->f32[i] = (uint32_t)tu_next(r);
    }
    for (int i = 0; i < GUARD; i++) {
        h->guard[i] = (uint8_t)(0xA5 ^ tu_below(r, 256));
    }
}

/* The CPU reference for the slots as they are: a from_slots set. */
static void reference(tovl_backend *cpu, const tovl_overlay_kernels *k, const batch_bufs *b, const batch_host *h,
                      const adapter *pool, const int current[L], bool tied, uint8_t *out) {
    tovl_embed_overlay *ov[L];
    for (int s = 0; s < L; s++) {
        ov[s] = current[s] >= 0 ? pool[current[s]].on_cpu : NULL;
    }
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(cpu, ov, L, tied, &set), TOVL_OK, "%s", tovl_last_error());
    bufs_reset(b, h);
    slots_hooks hk = hooks_for(set, k, b);
    slots_enqueue(&hk, NULL);
    bufs_read(b, h, out, "reference", 0);
    tovl_token_overlay_set_destroy(set);
}

static void expect_same(const uint8_t *got, const uint8_t *want, const char *tag, uint32_t round,
                        const int current[L]) {
    if (memcmp(got, want, hidden_bytes + bf16_bytes + f32_bytes) == 0) {
        return;
    }
    size_t i = 0;
    while (got[i] == want[i]) {
        i++;
    }
    const char *what = i < hidden_bytes ? "hidden" : i < hidden_bytes + bf16_bytes ? "bf16 logits" : "f32 logits";
    cr_assert_fail("%s round %u (slots %d %d %d %d): %s differs at byte %zu: 0x%02x, reference 0x%02x", tag, round,
                   current[0], current[1], current[2], current[3], what, i, got[i], want[i]);
}

void slots_check_rounds(tovl_backend *be, const slots_replayer *rp, const slots_config *cfg_in, const char *tag) {
    /* TOVL_SLOTS_ROUNDS caps the rounds: the sanitizer runs, where an emulated
     * round costs ten times more, take fewer (CMakePresets.json, asan). */
    slots_config capped = *cfg_in;
    const char *cap = getenv("TOVL_SLOTS_ROUNDS");
    const unsigned long most = cap && *cap ? strtoul(cap, NULL, 10) : 0;
    if (most > 0 && most < capped.rounds) {
        capped.rounds = (uint32_t)most;
    }
    const slots_config *cfg = &capped;
    tu_rng r = tu_rng_for(tag);
    tovl_backend *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    adapter pool[POOL];
    memset(pool, 0, sizeof pool);
    for (int i = 0; i < POOL; i++) {
        adapter_make(&pool[i], i, cfg->capacity, &r);
        pool[i].on_target = adapter_build(be, &pool[i], cfg->tied);
        pool[i].on_cpu = adapter_build(cpu, &pool[i], cfg->tied);
    }
    batch_host *h = calloc(1, sizeof *h);
    const size_t out_bytes = hidden_bytes + bf16_bytes + f32_bytes;
    uint8_t *got = malloc(out_bytes), *want = malloc(out_bytes), *base = malloc(out_bytes);
    cr_assert(h && got && want && base);
    host_make(h, pool, &r);
    memcpy(base, h->hidden, hidden_bytes);
    memcpy(base + hidden_bytes, h->bf16, bf16_bytes);
    memcpy(base + hidden_bytes + bf16_bytes, h->f32, f32_bytes);

    const tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be), kcpu = tovl_overlay_kernels_resolve(cpu);
    const tovl_set_shape shape = {.max_loras = L, .vocab = V, .hidden = H, .tied = cfg->tied,
                                  .embed_capacity = cfg->capacity, .lmhead_capacity = cfg->capacity};
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_create(be, &shape, &set), TOVL_OK, "%s", tovl_last_error());
    batch_bufs tb, cb;
    bufs_open(be, h, &tb);
    bufs_open(cpu, h, &cb);
    const slots_hooks hk = hooks_for(set, &k, &tb);
    rp->record(rp->user, &hk); /* while every slot is empty */

    int current[L] = {-1, -1, -1, -1};
    uint32_t changed_rounds = 0;
    for (uint32_t round = 0; round < cfg->rounds; round++) {
        const uint32_t ops = tu_below(&r, 8) == 0 ? 2 : 1;
        for (uint32_t o = 0; o < ops; o++) {
            const uint32_t s = tu_below(&r, L), op = tu_below(&r, 4);
            if (op == 0) {
                cr_assert_eq(tovl_token_overlay_set_unload(set, s, rp->load_stream), TOVL_OK, "%s", tovl_last_error());
                current[s] = -1;
            } else {
                /* op 3: reload what another slot holds (one overlay in two slots), else a random adapter */
                const int other = current[tu_below(&r, L)];
                const int a = op == 3 && other >= 0 ? other : (int)tu_below(&r, POOL);
                cr_assert_eq(tovl_token_overlay_set_load(set, s, pool[a].on_target, rp->load_stream), TOVL_OK,
                             "%s round %u: %s", tag, round, tovl_last_error());
                current[s] = a;
            }
        }
        bufs_reset(&tb, h);
        rp->replay(rp->user);
        bufs_read(&tb, h, got, tag, round);
        reference(cpu, &kcpu, &cb, h, pool, current, cfg->tied, want);
        expect_same(got, want, tag, round, current);
        changed_rounds += memcmp(got, base, out_bytes) != 0;
        /* The replay has finished, so every replaced overlay can go. */
        uint32_t pending = 1;
        cr_assert_eq(tovl_token_overlay_set_collect(set, &pending), TOVL_OK, "%s", tovl_last_error());
        cr_assert_eq(pending, 0, "%s round %u: %u replaced overlays still held after the replay", tag, round, pending);
    }
    cr_expect_gt(changed_rounds, cfg->rounds / 2, "%s: only %u of %u replays patched anything", tag, changed_rounds,
                 cfg->rounds);
    fprintf(stderr, "%s: %u rounds, tied %d, capacity %u: every replay equal to the CPU reference\n", tag,
            cfg->rounds, cfg->tied, cfg->capacity);

    tovl_token_overlay_set_destroy(set);
    bufs_close(&tb);
    bufs_close(&cb);
    for (int i = 0; i < POOL; i++) {
        adapter_free(&pool[i]);
    }
    tovl_backend_close(cpu);
    free(h);
    free(got);
    free(want);
    free(base);
}

