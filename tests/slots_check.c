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
    uint32_t vocab;
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
    for (; hk; hk = hk->next) {
        cr_assert_eq(tovl_embed_hook(hk->set, hk->kernels, &hk->embed, stream), TOVL_OK, "%s", tovl_last_error());
        cr_assert_eq(tovl_lmhead_hook(hk->set, hk->kernels, &hk->lm_bf16, stream), TOVL_OK, "%s",
                     tovl_last_error());
        cr_assert_eq(tovl_lmhead_hook(hk->set, hk->kernels, &hk->lm_f32, stream), TOVL_OK, "%s", tovl_last_error());
    }
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

/* `rounds`, or fewer where the environment caps them: `first` (when set
 * and not empty), else TOVL_SLOTS_ROUNDS. */
static uint32_t capped_rounds(uint32_t rounds, const char *first) {
    const char *cap = first ? getenv(first) : NULL;
    if (!cap || !*cap) {
        cap = getenv("TOVL_SLOTS_ROUNDS");
    }
    const unsigned long most = cap && *cap ? strtoul(cap, NULL, 10) : 0;
    return most > 0 && most < rounds ? (uint32_t)most : rounds;
}

/* Adapter i's kind: 0 embed rows only, 1 lm_head rows only, 2 both, 3 embed
 * rows and an explicitly empty lm_head part. Counts 1 .. most (the capacity,
 * or the config's few_rows); adapter 0 and 1 hold exactly the capacity. */
static void adapter_make(adapter *a, int i, uint32_t cap, uint32_t most, uint32_t vocab, tu_rng *r) {
    const int kind = i % 4;
    a->vocab = vocab;
    const uint32_t n1 = i < 2 ? cap : 1 + tu_below(r, most), n2 = i < 2 ? cap : 1 + tu_below(r, most);
    a->ne = kind == 1 ? 0 : n1;
    a->has_lm = kind != 0;
    a->nl = kind == 1 || kind == 2 ? n2 : 0;
    a->eids = calloc(cap, sizeof *a->eids);
    a->lids = calloc(cap, sizeof *a->lids);
    a->erows = calloc((size_t)cap * H, sizeof *a->erows);
    a->lrows = calloc((size_t)cap * H, sizeof *a->lrows);
    cr_assert(a->eids && a->lids && a->erows && a->lrows);
    tu_distinct_ids(r, vocab, a->ne, a->eids);
    tu_distinct_ids(r, vocab, a->nl, a->lids);
    tu_fill_bf16(r, a->erows, (size_t)a->ne * H);
    tu_fill_bf16(r, a->lrows, (size_t)a->nl * H);
}

static tovl_embed_overlay *adapter_build(tovl_backend *be, const adapter *a, bool tied) {
    tovl_embed_overlay *ov = NULL;
    cr_assert_eq(tu_build(be, a->vocab, H, a->eids, a->erows, a->ne, a->has_lm, a->lids, a->lrows, a->nl, tied, &ov),
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

/* One round's changes, the same on each of `sets`: one or two loads, unloads
 * or reloads of a slot; `current` follows what each slot holds. */
static void random_ops(tu_rng *r, tovl_token_overlay_set *const *sets, uint32_t nsets, const adapter *pool,
                       int current[L], void *stream, const char *tag, uint32_t round) {
    const uint32_t ops = tu_below(r, 8) == 0 ? 2 : 1;
    for (uint32_t o = 0; o < ops; o++) {
        const uint32_t s = tu_below(r, L), op = tu_below(r, 4);
        /* op 3: reload what another slot holds (one overlay in two slots), else a random adapter */
        const int other = current[tu_below(r, L)];
        const int a = op == 0 ? -1 : op == 3 && other >= 0 ? other : (int)tu_below(r, POOL);
        for (uint32_t i = 0; i < nsets; i++) {
            if (!sets[i]) {
                continue;
            }
            const tovl_status st = a < 0 ? tovl_token_overlay_set_unload(sets[i], s, stream)
                                         : tovl_token_overlay_set_load(sets[i], s, pool[a].on_target, stream);
            cr_assert_eq(st, TOVL_OK, "%s round %u: %s", tag, round, tovl_last_error());
        }
        current[s] = a;
    }
}

void slots_check_rounds(tovl_backend *be, const slots_replayer *rp, const slots_config *cfg_in, const char *tag) {
    /* The sanitizer runs, where an emulated round costs ten times more, take
     * fewer (CMakePresets.json, asan). */
    slots_config capped = *cfg_in;
    capped.rounds = capped_rounds(capped.rounds, NULL);
    const slots_config *cfg = &capped;
    tu_rng r = tu_rng_for(tag);
    tovl_backend *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    adapter pool[POOL];
    memset(pool, 0, sizeof pool);
    for (int i = 0; i < POOL; i++) {
        adapter_make(&pool[i], i, cfg->capacity, cfg->few_rows ? cfg->few_rows : cfg->capacity, V, &r);
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
    uint32_t changed_rounds = 0, few_rounds = 0;
    for (uint32_t round = 0; round < cfg->rounds; round++) {
        random_ops(&r, &set, 1, pool, current, rp->load_stream, tag, round);
        bool few = true; /* no slot holds adapter 0 or 1, the only ones past few_rows */
        for (int s = 0; s < L; s++) {
            few = few && current[s] != 0 && current[s] != 1;
        }
        few_rounds += few;
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
    if (cfg->few_rows) {
        cr_expect(few_rounds > 0 && few_rounds < cfg->rounds, "%s: %u of %u rounds with at most %u rows a slot", tag,
                  few_rounds, cfg->rounds, cfg->few_rows);
        fprintf(stderr, "%s: %u of %u rounds with at most %u rows a slot, the others with %u\n", tag, few_rounds,
                cfg->rounds, cfg->few_rows, cfg->capacity);
    }
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


/* ------------------------------------------------------------------------ */
/* Vocab shards                                                              */
/* ------------------------------------------------------------------------ */
enum { SHARD_T = 12, MAX_WORLD = 8, MAX_SHARD_SETS = 1 + MAX_WORLD * (MAX_WORLD + 1) / 2, ALIGN = 64 };

static bool holds(const uint32_t *ids, uint32_t n, uint32_t id) {
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] == id) {
            return true;
        }
    }
    return false;
}

/* `n` distinct ids below `vocab`: with `edges`, every shard edge of every
 * world size first (start - 1, start, end - 1, end of each rank), then random
 * ones; increasing when `sorted` (the importer's order), else shuffled. */
static void shard_ids(tu_rng *r, uint32_t vocab, uint32_t n, bool edges, bool sorted, uint32_t *ids) {
    uint32_t k = 0;
    for (uint32_t N = 1; edges && N <= MAX_WORLD; N++) {
        for (uint32_t rank = 0; rank < N; rank++) {
            uint32_t lo, hi;
            cr_assert_eq(tovl_vocab_shard_range(vocab, N, rank, 0, &lo, &hi), TOVL_OK, "%s", tovl_last_error());
            const int64_t cand[4] = {(int64_t)lo - 1, lo, (int64_t)hi - 1, hi};
            for (int c = 0; c < 4; c++) {
                if (cand[c] >= 0 && cand[c] < vocab && k < n && !holds(ids, k, (uint32_t)cand[c])) {
                    ids[k++] = (uint32_t)cand[c];
                }
            }
        }
    }
    while (k < n) {
        const uint32_t id = tu_below(r, vocab);
        if (!holds(ids, k, id)) {
            ids[k++] = id;
        }
    }
    for (uint32_t i = n; i > 1; i--) {
        const uint32_t j = tu_below(r, i), t = ids[i - 1];
        ids[i - 1] = ids[j], ids[j] = t;
    }
    for (uint32_t i = 1; sorted && i < n; i++) { /* insertion sort: n <= a few hundred */
        const uint32_t v = ids[i];
        uint32_t j = i;
        for (; j > 0 && ids[j - 1] > v; j--) {
            ids[j] = ids[j - 1];
        }
        ids[j] = v;
    }
}

/* Adapter i of the shard check: the kinds of adapter_make; ids on every
 * shard edge in increasing order (i % 3 == 0), on every edge shuffled (1), or
 * random and shuffled (2); adapters 0 and 1 hold the capacity (or the vocab). */
static void shard_adapter_make(adapter *a, int i, uint32_t cap, uint32_t vocab, tu_rng *r) {
    const int kind = i % 4;
    const uint32_t most = cap < vocab ? cap : vocab;
    a->vocab = vocab;
    const uint32_t n1 = i < 2 ? most : 1 + tu_below(r, most), n2 = i < 2 ? most : 1 + tu_below(r, most);
    a->ne = kind == 1 ? 0 : n1;
    a->has_lm = kind != 0;
    a->nl = kind == 1 || kind == 2 ? n2 : 0;
    a->eids = calloc(most, sizeof *a->eids);
    a->lids = calloc(most, sizeof *a->lids);
    a->erows = calloc((size_t)most * H, sizeof *a->erows);
    a->lrows = calloc((size_t)most * H, sizeof *a->lrows);
    cr_assert(a->eids && a->lids && a->erows && a->lrows);
    shard_ids(r, vocab, a->ne, i % 3 != 2, i % 3 == 0, a->eids);
    shard_ids(r, vocab, a->nl, i % 3 != 2, i % 3 == 0, a->lids);
    tu_fill_bf16(r, a->erows, (size_t)a->ne * H);
    tu_fill_bf16(r, a->lrows, (size_t)a->nl * H);
}

/* One set of the shard check: its columns [start, start + width) of the
 * padded vocab, logits of row stride ld = width + pad; its three outputs'
 * offsets in the arena. */
typedef struct shard_view {
    tovl_token_overlay_set *set;
    uint32_t world, rank, start, width, ld;
    size_t hidden_at, bf16_at, f32_at;
} shard_view;

static size_t arena_take(size_t *at, size_t bytes) {
    const size_t here = *at + GUARD;
    *at = (here + bytes + GUARD + ALIGN - 1) / ALIGN * ALIGN;
    return here;
}

/* The arena's image before a replay: guards everywhere, each view's outputs
 * from the unsharded base (hidden rows, logits columns of its shard). */
static void arena_image(uint8_t *img, size_t bytes, const shard_view *v, uint32_t nv, const uint8_t *guard,
                        const uint16_t *hidden, const uint16_t *bf16, const uint32_t *f32, uint32_t padded) {
    for (size_t i = 0; i < bytes; i++) {
        img[i] = guard[i % GUARD];
    }
    for (uint32_t k = 0; k < nv; k++) {
        memcpy(img + v[k].hidden_at, hidden, sizeof(uint16_t) * SHARD_T * H);
        for (uint32_t t = 0; t < SHARD_T; t++) {
            memcpy(img + v[k].bf16_at + sizeof(uint16_t) * t * v[k].ld, bf16 + (size_t)t * padded + v[k].start,
                   sizeof(uint16_t) * v[k].width);
            memcpy(img + v[k].f32_at + sizeof(uint32_t) * t * v[k].ld, f32 + (size_t)t * padded + v[k].start,
                   sizeof(uint32_t) * v[k].width);
        }
    }
}

/* Where byte `i` of the arena lies, for a failure message. */
static void arena_where(size_t i, const shard_view *v, uint32_t nv, char *out, size_t size) {
    for (uint32_t k = 0; k < nv; k++) {
        const size_t parts[3] = {v[k].hidden_at, v[k].bf16_at, v[k].f32_at};
        const size_t lens[3] = {sizeof(uint16_t) * SHARD_T * H, sizeof(uint16_t) * SHARD_T * v[k].ld,
                                sizeof(uint32_t) * SHARD_T * v[k].ld};
        static const char *names[3] = {"embed output", "bf16 logits", "f32 logits"};
        for (int p = 0; p < 3; p++) {
            if (i >= parts[p] - GUARD && i < parts[p] + lens[p] + GUARD) {
                const long off = (long)i - (long)parts[p];
                const size_t elem = p == 2 ? 4 : 2, row = p == 0 ? H : v[k].ld;
                if (off < 0 || (size_t)off >= lens[p]) {
                    snprintf(out, size, "N %u rank %u [%u, %u): the guard %s its %s", v[k].world, v[k].rank,
                             v[k].start, v[k].start + v[k].width, off < 0 ? "before" : "after", names[p]);
                } else {
                    const size_t cell = (size_t)off / elem;
                    snprintf(out, size, "N %u rank %u [%u, %u): %s row %zu column %zu%s", v[k].world, v[k].rank,
                             v[k].start, v[k].start + v[k].width, names[p], cell / row, cell % row,
                             p > 0 && cell % row >= v[k].width ? " (a pad column past the shard)" : "");
                }
                return;
            }
        }
    }
    snprintf(out, size, "between the outputs");
}

/* The CPU reference of one round over the padded vocab: a from_slots set. */
static void shard_reference(tovl_backend *cpu, const tovl_overlay_kernels *k, const adapter *pool,
                            const int current[L], bool tied, tovl_devptr d_hidden, tovl_devptr d_bf16,
                            tovl_devptr d_f32, tovl_devptr d_ids, tovl_devptr d_slots, tovl_devptr d_final,
                            uint32_t padded, const uint16_t *hidden, const uint16_t *bf16, const uint32_t *f32,
                            uint16_t *out_hidden, uint16_t *out_bf16, uint32_t *out_f32) {
    tovl_embed_overlay *ov[L];
    for (int s = 0; s < L; s++) {
        ov[s] = current[s] >= 0 ? pool[current[s]].on_cpu : NULL;
    }
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(cpu, ov, L, tied, &set), TOVL_OK, "%s", tovl_last_error());
    const size_t hb = sizeof(uint16_t) * SHARD_T * H, lb = (size_t)SHARD_T * padded;
    cr_assert_eq(tovl_upload(cpu, d_hidden, hidden, hb), TOVL_OK);
    cr_assert_eq(tovl_upload(cpu, d_bf16, bf16, lb * 2), TOVL_OK);
    cr_assert_eq(tovl_upload(cpu, d_f32, f32, lb * 4), TOVL_OK);
    slots_hooks hk = {.set = set, .kernels = k};
    hk.embed = (tovl_embed_hook_args){.hidden = d_hidden, .token_ids = d_ids, .slots = d_slots, .active_slot = -1,
                                      .T = SHARD_T, .hidden_size = H};
    hk.lm_bf16 = (tovl_lmhead_hook_args){.logits = d_bf16, .logits_dtype = TOVL_LOGITS_BF16, .ld = padded,
                                         .hidden = d_final, .slots = d_slots, .active_slot = -1, .T = SHARD_T,
                                         .hidden_size = H};
    hk.lm_f32 = hk.lm_bf16;
    hk.lm_f32.logits = d_f32;
    hk.lm_f32.logits_dtype = TOVL_LOGITS_F32;
    slots_enqueue(&hk, NULL);
    cr_assert_eq(tovl_download(cpu, out_hidden, d_hidden, hb), TOVL_OK);
    cr_assert_eq(tovl_download(cpu, out_bf16, d_bf16, lb * 2), TOVL_OK);
    cr_assert_eq(tovl_download(cpu, out_f32, d_f32, lb * 4), TOVL_OK);
    tovl_token_overlay_set_destroy(set);
}

void slots_check_shards(tovl_backend *be, const slots_replayer *rp, const slots_shard_config *cfg_in,
                        const char *tag) {
    slots_shard_config cfg = *cfg_in;
    /* Under ASan a round over 37 sets on lavapipe takes most of a second (the
     * asan preset takes 10). */
    cfg.rounds = capped_rounds(cfg.rounds, "TOVL_SHARD_ROUNDS");
    char salt[96];
    snprintf(salt, sizeof salt, "%s-%u-%d", tag, cfg.vocab, cfg.tied);
    tu_rng r = tu_rng_for(salt);
    tovl_backend *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    const uint32_t V0 = cfg.vocab;
    uint32_t zero, padded;
    cr_assert_eq(tovl_vocab_shard_range(V0, 1, 0, 0, &zero, &padded), TOVL_OK, "%s", tovl_last_error());

    adapter pool[POOL];
    memset(pool, 0, sizeof pool);
    for (int i = 0; i < POOL; i++) {
        shard_adapter_make(&pool[i], i, cfg.capacity, V0, &r);
        pool[i].on_target = adapter_build(be, &pool[i], cfg.tied);
        pool[i].on_cpu = adapter_build(cpu, &pool[i], cfg.tied);
    }

    /* The batch: token ids half from the adapters (and some past the vocab),
     * slots -1 .. L, random hidden rows and logits, never zero. */
    uint32_t ids[SHARD_T];
    int32_t slots[SHARD_T];
    uint16_t final_hidden[SHARD_T * H], hidden[SHARD_T * H];
    for (int t = 0; t < SHARD_T; t++) {
        slots[t] = t < L ? t : (int32_t)tu_below(&r, L + 2) - 1;
        const adapter *a = &pool[tu_below(&r, POOL)];
        const uint32_t pick = tu_below(&r, 8);
        ids[t] = pick == 0 ? V0 + tu_below(&r, 3) : pick < 6 && a->ne ? a->eids[tu_below(&r, a->ne)] : tu_below(&r, V0);
    }
    tu_fill_bf16(&r, final_hidden, SHARD_T * H);
    tu_fill_bf16(&r, hidden, SHARD_T * H);
    const size_t cells = (size_t)SHARD_T * padded;
    uint16_t *bf16 = calloc(cells, 2), *ref_bf16 = calloc(cells, 2), ref_hidden[SHARD_T * H];
    uint32_t *f32 = calloc(cells, 4), *ref_f32 = calloc(cells, 4);
    cr_assert(bf16 && ref_bf16 && f32 && ref_f32);
    tu_fill_bf16(&r, bf16, cells);
    for (size_t i = 0; i < cells; i++) {
        f32[i] = (uint32_t)tu_next(&r) | 1u;
    }
    uint8_t guard[GUARD];
    for (int i = 0; i < GUARD; i++) {
        guard[i] = (uint8_t)(0xA5 ^ tu_below(&r, 256));
    }

    /* The sets: one unsharded fixed-shape set, then every rank of every N
     * whose shard holds a cell of the vocab; their outputs in one arena. */
    const tovl_set_shape shape = {.max_loras = L, .vocab = V0, .hidden = H, .tied = cfg.tied,
                                  .embed_capacity = cfg.capacity, .lmhead_capacity = cfg.capacity};
    shard_view views[MAX_SHARD_SETS];
    tovl_token_overlay_set *sets[MAX_SHARD_SETS];
    uint32_t nv = 0;
    size_t arena_bytes = 0;
    for (uint32_t N = 0; N <= MAX_WORLD; N++) {
        for (uint32_t rank = 0; rank < (N ? N : 1); rank++) {
            shard_view *v = &views[nv];
            memset(v, 0, sizeof *v);
            v->world = N, v->rank = rank;
            uint32_t start = 0, end = padded;
            tovl_status st;
            if (N == 0) {
                st = tovl_token_overlay_set_create(be, &shape, &v->set);
            } else {
                cr_assert_eq(tovl_vocab_shard_range(V0, N, rank, 0, &start, &end), TOVL_OK);
                st = tovl_token_overlay_set_create_shard(be, &shape, start, end, &v->set);
                if (start >= V0) { /* padding only: no set, as in an engine */
                    cr_assert_eq(st, TOVL_ERR_ID_OUT_OF_RANGE, "%s: N %u rank %u [%u, %u) past vocab %u accepted",
                                 tag, N, rank, start, end, V0);
                    cr_assert_null(v->set);
                    continue;
                }
                uint32_t s0, s1;
                tovl_token_overlay_set_shard_range(v->set, &s0, &s1);
                cr_assert(s0 == start && s1 == end, "%s: shard_range [%u, %u), created for [%u, %u)", tag, s0, s1,
                          start, end);
            }
            cr_assert_eq(st, TOVL_OK, "%s: N %u rank %u: %s", tag, N, rank, tovl_last_error());
            v->start = start;
            v->width = end - start;
            v->ld = v->width + (N == 0 ? 3 : rank % 3);
            v->hidden_at = arena_take(&arena_bytes, sizeof(uint16_t) * SHARD_T * H);
            v->bf16_at = arena_take(&arena_bytes, sizeof(uint16_t) * SHARD_T * v->ld);
            v->f32_at = arena_take(&arena_bytes, sizeof(uint32_t) * SHARD_T * v->ld);
            sets[nv++] = v->set;
        }
    }
    arena_bytes += GUARD;
    uint8_t *image = malloc(arena_bytes), *want = malloc(arena_bytes), *got = malloc(arena_bytes);
    cr_assert(image && want && got);
    arena_image(image, arena_bytes, views, nv, guard, hidden, bf16, f32, padded);

    tovl_devptr arena = 0;
    cr_assert_eq(tovl_alloc(be, arena_bytes, &arena), TOVL_OK, "%s", tovl_last_error());
    const tovl_devptr d_ids = uploaded(be, ids, sizeof ids), d_slots = uploaded(be, slots, sizeof slots),
                      d_final = uploaded(be, final_hidden, sizeof final_hidden);
    const tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be), kcpu = tovl_overlay_kernels_resolve(cpu);
    slots_hooks hooks[MAX_SHARD_SETS];
    for (uint32_t i = 0; i < nv; i++) {
        const shard_view *v = &views[i];
        hooks[i] = (slots_hooks){.set = v->set, .kernels = &k, .next = i + 1 < nv ? &hooks[i + 1] : NULL};
        hooks[i].embed = (tovl_embed_hook_args){.hidden = arena + v->hidden_at, .token_ids = d_ids, .slots = d_slots,
                                                .active_slot = -1, .T = SHARD_T, .hidden_size = H};
        hooks[i].lm_bf16 = (tovl_lmhead_hook_args){.logits = arena + v->bf16_at, .logits_dtype = TOVL_LOGITS_BF16,
                                                   .ld = v->ld, .hidden = d_final, .slots = d_slots,
                                                   .active_slot = -1, .T = SHARD_T, .hidden_size = H};
        hooks[i].lm_f32 = hooks[i].lm_bf16;
        hooks[i].lm_f32.logits = arena + v->f32_at;
        hooks[i].lm_f32.logits_dtype = TOVL_LOGITS_F32;
    }
    cr_assert_eq(tovl_upload(be, arena, image, arena_bytes), TOVL_OK, "%s", tovl_last_error());
    rp->record(rp->user, &hooks[0]); /* while every slot of every set is empty */

    tovl_devptr c_hidden = 0, c_bf16 = 0, c_f32 = 0;
    cr_assert_eq(tovl_alloc(cpu, sizeof hidden, &c_hidden), TOVL_OK);
    cr_assert_eq(tovl_alloc(cpu, cells * 2, &c_bf16), TOVL_OK);
    cr_assert_eq(tovl_alloc(cpu, cells * 4, &c_f32), TOVL_OK);
    const tovl_devptr c_ids = uploaded(cpu, ids, sizeof ids), c_slots = uploaded(cpu, slots, sizeof slots),
                      c_final = uploaded(cpu, final_hidden, sizeof final_hidden);

    int current[L] = {-1, -1, -1, -1};
    uint32_t changed_rounds = 0;
    char where[160];
    for (uint32_t round = 0; round < cfg.rounds; round++) {
        random_ops(&r, sets, nv, pool, current, rp->load_stream, tag, round);
        cr_assert_eq(tovl_upload(be, arena, image, arena_bytes), TOVL_OK, "%s", tovl_last_error());
        rp->replay(rp->user);
        cr_assert_eq(tovl_download(be, got, arena, arena_bytes), TOVL_OK, "%s", tovl_last_error());
        shard_reference(cpu, &kcpu, pool, current, cfg.tied, c_hidden, c_bf16, c_f32, c_ids, c_slots, c_final, padded,
                        hidden, bf16, f32, ref_hidden, ref_bf16, ref_f32);
        arena_image(want, arena_bytes, views, nv, guard, ref_hidden, ref_bf16, ref_f32, padded);
        if (memcmp(got, want, arena_bytes) != 0) {
            size_t i = 0;
            while (got[i] == want[i]) {
                i++;
            }
            arena_where(i, views, nv, where, sizeof where);
            cr_assert_fail("%s vocab %u %s round %u (slots %d %d %d %d): %s differs from the unsharded reference "
                           "(byte 0x%02x, want 0x%02x)",
                           tag, V0, cfg.tied ? "tied" : "untied", round, current[0], current[1], current[2],
                           current[3], where, got[i], want[i]);
        }
        changed_rounds += memcmp(got, image, arena_bytes) != 0;
        for (uint32_t i = 0; i < nv; i++) {
            uint32_t pending = 1;
            cr_assert_eq(tovl_token_overlay_set_collect(sets[i], &pending), TOVL_OK, "%s", tovl_last_error());
            cr_assert_eq(pending, 0, "%s round %u: N %u rank %u still holds %u replaced overlays after the replay",
                         tag, round, views[i].world, views[i].rank, pending);
        }
    }
    /* (A check of a few rounds, as TOVL_SLOTS_ROUNDS may make it, can draw mostly unloads.) */
    cr_expect(cfg.rounds < 50 || changed_rounds > cfg.rounds / 2, "%s: only %u of %u replays patched anything", tag,
              changed_rounds, cfg.rounds);
    fprintf(stderr,
            "%s: vocab %u (padded %u), %s, capacity %u: %u rounds over %u sets (1 unsharded, %u ranks of N = 1 .. "
            "%d): every replay's shards equal to the unsharded CPU reference\n",
            tag, V0, padded, cfg.tied ? "tied" : "untied", cfg.capacity, cfg.rounds, nv, nv - 1, MAX_WORLD);

    for (uint32_t i = 0; i < nv; i++) {
        tovl_token_overlay_set_destroy(sets[i]);
    }
    const tovl_devptr target_bufs[4] = {arena, d_ids, d_slots, d_final};
    for (int i = 0; i < 4; i++) {
        tovl_free(be, target_bufs[i]);
    }
    const tovl_devptr cpu_bufs[6] = {c_hidden, c_bf16, c_f32, c_ids, c_slots, c_final};
    for (int i = 0; i < 6; i++) {
        tovl_free(cpu, cpu_bufs[i]);
    }
    for (int i = 0; i < POOL; i++) {
        adapter_free(&pool[i]);
    }
    tovl_backend_close(cpu);
    free(image);
    free(want);
    free(got);
    free(bf16);
    free(ref_bf16);
    free(f32);
    free(ref_f32);
}
