/* Vocab-parallel shard sets (tovl_token_overlay_set_from_slots_shard) on every
 * backend present, and on the CUDA kernels' host emulation when it is built:
 * for N = 1 .. 8 ranks over vocab sizes that do not divide evenly (odd, prime,
 * padded, smaller than N x 64), tied and untied pools, bf16 and f32 logits,
 * each rank's lm_head hook on its own logits shard (inside poisoned guards),
 * the shards concatenated equal the unsharded set's logits bit for bit. The
 * lm_head ids include every shard edge of every N; the batch has slots out of
 * range. Also: the shard sets' embed hook equals the full set's, the cells per
 * shard add up to the full set's, and the errors name their arguments.
 * TOVL_TEST_BACKENDS (comma list; "cuda-emu" names the emulation) limits the
 * backends, e.g. to "cpu" under Valgrind. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#ifdef TOVL_TP_WITH_EMU
#include "cuda/emu/cuda_emu_api.h"
#endif

enum { MAX_BACKENDS = 8, GUARD = 64, HID = 40, T = 11, MAXL = 6, MAX_N = 8 };
#define POISON 0xD15EA5EDu

/* ------------------------------------------------------------------------ */
/* Backends: each of tovl_backend_list, then the CUDA emulation if built.    */
/* ------------------------------------------------------------------------ */
static size_t backend_index[MAX_BACKENDS + 1];

static struct criterion_test_params backend_params(void) {
    size_t n = tovl_backend_list(NULL, 0); /* count only: open nothing before the fork */
    if (n > MAX_BACKENDS) {
        n = MAX_BACKENDS;
    }
#ifdef TOVL_TP_WITH_EMU
    n++;
#endif
    for (size_t i = 0; i < n; i++) {
        backend_index[i] = i;
    }
    return cr_make_param_array(size_t, backend_index, n);
}

typedef struct bk {
    tovl_backend *be;
    tu_wrap *w; /* NULL for the emulation */
    char name[32];
} bk;

static bk open_backend(size_t index) {
    tovl_backend_info info[MAX_BACKENDS];
    size_t n = tovl_backend_list(info, MAX_BACKENDS);
    bk b = {0};
    if (index >= n) {
#ifdef TOVL_TP_WITH_EMU
        tu_rng r = tu_rng_for("tp-emu");
        snprintf(b.name, sizeof b.name, "cuda-emu");
        if (!tu_backend_allowed(b.name)) {
            cr_skip_test("cuda-emu left out by TOVL_TEST_BACKENDS=%s", getenv("TOVL_TEST_BACKENDS"));
        }
        cr_assert_eq(tovl_cuda_emu_backend_open(&(tovl_cuda_device_shape){132}, tu_next(&r), &b.be), TOVL_OK, "%s",
                     tovl_last_error());
        fprintf(stderr, "tp: on %s (%s)\n", b.name, tovl_backend_device(b.be));
        return b;
#else
        cr_assert_fail("backend index %zu of %zu", index, n);
#endif
    }
    snprintf(b.name, sizeof b.name, "%s", info[index].name);
    b.be = tu_open_listed(&info[index], "tp", &b.w);
    return b;
}

static void close_backend(bk *b) {
    if (b->w) {
        cr_expect_eq(tu_live(b->w), 0, "%s: %ld device allocations still live", b->name, tu_live(b->w));
    }
    tovl_backend_close(b->be);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    cr_assert_not_null(p, "out of host memory");
    return p;
}

/* ------------------------------------------------------------------------ */
/* The pool and the batch                                                    */
/* ------------------------------------------------------------------------ */
static bool contains(const uint32_t *ids, uint32_t n, uint32_t id) {
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] == id) {
            return true;
        }
    }
    return false;
}

/* Every shard edge of every N (start - 1, start, end - 1, end) inside the
 * vocab, then random ids, distinct, in a shuffled order (the set must not
 * rely on increasing ids). */
static uint32_t edge_ids(tu_rng *r, uint32_t vocab, uint32_t extra, uint32_t *ids, uint32_t cap) {
    uint32_t n = 0;
    for (uint32_t N = 1; N <= MAX_N; N++) {
        for (uint32_t rank = 0; rank < N; rank++) {
            uint32_t lo, hi;
            cr_assert_eq(tovl_vocab_shard_range(vocab, N, rank, 0, &lo, &hi), TOVL_OK, "%s", tovl_last_error());
            const int64_t cand[4] = {(int64_t)lo - 1, lo, (int64_t)hi - 1, hi};
            for (int c = 0; c < 4; c++) {
                if (cand[c] >= 0 && cand[c] < vocab && n < cap && !contains(ids, n, (uint32_t)cand[c])) {
                    ids[n++] = (uint32_t)cand[c];
                }
            }
        }
    }
    for (uint32_t k = 0; k < extra && n < cap && n < vocab; k++) {
        uint32_t id;
        do {
            id = tu_below(r, vocab);
        } while (contains(ids, n, id));
        ids[n++] = id;
    }
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = tu_below(r, i), t = ids[i - 1];
        ids[i - 1] = ids[j], ids[j] = t;
    }
    return n;
}

typedef struct pool {
    uint32_t vocab;
    bool tied;
    tovl_embed_overlay *ov[MAXL];
    uint32_t *eids, *lids; /* kept for the batch's token ids */
    uint32_t ne;
} pool;

/* slot 0 empty; 1 both parts (lm_head ids on every edge); 2 embed only (tied:
 * lm_head cells from the embed rows, edges too); 3 lm_head only, random; 4
 * explicit empty lm_head; 5 both, random. */
static pool pool_make(bk *b, tu_rng *r, uint32_t vocab, bool tied) {
    pool p = {.vocab = vocab, .tied = tied};
    const uint32_t cap = 4 * MAX_N * MAX_N + 64;
    uint32_t *ids = xcalloc(cap, sizeof *ids);
    uint16_t *rows = xcalloc((size_t)cap * HID, sizeof *rows);
    tu_fill_bf16(r, rows, (size_t)cap * HID);
    rows[3] = 0x8000; /* a -0.0 element: copies must keep it */
    p.lids = xcalloc(cap, sizeof *p.lids);
    p.eids = xcalloc(cap, sizeof *p.eids);
    uint32_t nl = edge_ids(r, vocab, 20, p.lids, cap);
    p.ne = edge_ids(r, vocab, 12, p.eids, cap);
    uint32_t n3 = edge_ids(r, vocab, 0, ids, cap);
    n3 = n3 > 5 ? 5 : n3; /* a few shuffled edge ids */
    cr_assert_eq(tu_build(b->be, vocab, HID, p.eids, rows, p.ne, true, p.lids, rows + HID, nl, tied, &p.ov[1]),
                 TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tu_build(b->be, vocab, HID, p.eids, rows + 2 * HID, p.ne, false, NULL, NULL, 0, tied, &p.ov[2]),
                 TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tu_build(b->be, vocab, HID, NULL, NULL, 0, true, ids, rows + 3 * HID, n3, tied, &p.ov[3]), TOVL_OK,
                 "%s", tovl_last_error());
    cr_assert_eq(tu_build(b->be, vocab, HID, p.eids, rows + 4 * HID, 3, true, NULL, NULL, 0, tied, &p.ov[4]),
                 TOVL_OK, "%s", tovl_last_error());
    uint32_t n5 = 1 + tu_below(r, vocab < 30 ? vocab : 30);
    tu_distinct_ids(r, vocab, n5, ids);
    cr_assert_eq(tu_build(b->be, vocab, HID, ids, rows + 5 * HID, n5, true, ids, rows + 6 * HID, n5, tied, &p.ov[5]),
                 TOVL_OK, "%s", tovl_last_error());
    free(ids);
    free(rows);
    return p;
}

static void pool_free(pool *p) {
    for (int s = 0; s < MAXL; s++) {
        tovl_embed_overlay_release(p->ov[s]);
    }
    free(p->eids);
    free(p->lids);
}

/* Row slots: every slot, and "no adapter" as -1, max_loras, far out of range. */
static void make_slots(tu_rng *r, int32_t *slots) {
    static const int32_t out_of_range[] = {-1, MAXL, MAXL + 3, INT32_MIN, INT32_MAX};
    for (uint32_t t = 0; t < T; t++) {
        slots[t] = t < MAXL ? (int32_t)t : (int32_t)tu_below(r, MAXL);
        if (t >= MAXL && tu_below(r, 3) == 0) {
            slots[t] = out_of_range[tu_below(r, sizeof out_of_range / sizeof out_of_range[0])];
        }
    }
}

static tovl_devptr upload(bk *b, const void *src, size_t bytes) {
    tovl_devptr d = 0;
    cr_assert_eq(tovl_alloc(b->be, bytes, &d), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_upload(b->be, d, src, bytes), TOVL_OK, "%s", tovl_last_error());
    return d;
}

/* The lm_head hook over `width` columns of `base` (rows of stride base_ld,
 * from column `col`) in a device buffer of row stride ld = width + pad with
 * poisoned guards; returns the patched [T, width] cells and checks the guards
 * and the pad columns. */
static void *hook_on(bk *b, const tovl_token_overlay_set *set, const void *base, size_t elem, uint32_t base_ld,
                     uint32_t col, uint32_t width, uint32_t pad, tovl_logits_dtype dtype, tovl_devptr hidden,
                     tovl_devptr slots, const char *what) {
    const uint32_t ld = width + pad;
    const size_t body = (size_t)T * ld * elem, bytes = body + 2 * GUARD * 4;
    unsigned char *host = xcalloc(bytes, 1);
    for (size_t i = 0; i < bytes / 4; i++) {
        memcpy(host + 4 * i, &(uint32_t){POISON}, 4);
    }
    for (uint32_t t = 0; t < T; t++) {
        memcpy(host + GUARD * 4 + ((size_t)t * ld) * elem, (const char *)base + ((size_t)t * base_ld + col) * elem,
               (size_t)width * elem);
    }
    unsigned char *before = xcalloc(bytes, 1);
    memcpy(before, host, bytes);
    tovl_devptr d = upload(b, host, bytes);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(b->be);
    tovl_lmhead_hook_args a = {.logits = d + GUARD * 4, .logits_dtype = dtype, .ld = ld, .hidden = hidden,
                               .slots = slots, .active_slot = -1, .T = T, .hidden_size = HID};
    cr_assert_eq(tovl_lmhead_hook(set, &k, &a, NULL), TOVL_OK, "%s: %s", what, tovl_last_error());
    cr_assert_eq(tovl_synchronize(b->be, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_download(b->be, host, d, bytes), TOVL_OK, "%s", tovl_last_error());
    tovl_free(b->be, d);
    cr_assert(memcmp(host, before, GUARD * 4) == 0, "%s: the guard before the logits was written", what);
    cr_assert(memcmp(host + GUARD * 4 + body, before + GUARD * 4 + body, GUARD * 4) == 0,
              "%s: the guard after the logits was written", what);
    unsigned char *out = xcalloc((size_t)T * width, elem);
    for (uint32_t t = 0; t < T; t++) {
        const size_t row = GUARD * 4 + (size_t)t * ld * elem;
        cr_assert(memcmp(host + row + (size_t)width * elem, before + row + (size_t)width * elem, (size_t)pad * elem) ==
                      0,
                  "%s: row %u: a column past the shard's width was written", what, t);
        memcpy(out + (size_t)t * width * elem, host + row, (size_t)width * elem);
    }
    free(before);
    free(host);
    return out;
}

static uint32_t total_cells(const tovl_token_overlay_set *set, bk *b, uint32_t *per_slot) {
    tovl_overlay_tables tab = tovl_token_overlay_set_tables(set);
    cr_assert_eq(tovl_download(b->be, per_slot, tab.n_override_table, MAXL * sizeof *per_slot), TOVL_OK);
    uint32_t sum = 0;
    for (int s = 0; s < MAXL; s++) {
        sum += per_slot[s];
    }
    return sum;
}

/* One vocab, tied or not: every N and rank, both logits dtypes. */
static void check_vocab(bk *b, uint32_t vocab, bool tied) {
    char salt[64];
    snprintf(salt, sizeof salt, "tp-%s-%u-%d", b->name, vocab, tied);
    tu_rng r = tu_rng_for(salt);
    pool p = pool_make(b, &r, vocab, tied);
    tovl_token_overlay_set *full = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(b->be, p.ov, MAXL, tied, &full), TOVL_OK, "%s", tovl_last_error());
    uint32_t full_n[MAXL];
    const uint32_t full_cells = total_cells(full, b, full_n);

    /* The batch: final hidden rows, slots, and token ids half of them overlaid. */
    uint16_t *hid = xcalloc((size_t)T * HID, sizeof *hid);
    tu_fill_bf16(&r, hid, (size_t)T * HID);
    int32_t slots[T];
    uint32_t tok[T];
    make_slots(&r, slots);
    for (uint32_t t = 0; t < T; t++) {
        tok[t] = tu_below(&r, 2) ? p.eids[tu_below(&r, p.ne)] : tu_below(&r, vocab);
    }
    tok[1] = p.eids[tu_below(&r, p.ne)]; /* row 1 uses slot 1: at least one row is overlaid */
    tovl_devptr d_hidden = upload(b, hid, sizeof(uint16_t) * T * HID), d_slots = upload(b, slots, sizeof slots);
    tovl_devptr d_tok = upload(b, tok, sizeof tok);

    /* The unsharded reference over the padded vocab of the largest pad used here. */
    uint32_t lo, padded;
    cr_assert_eq(tovl_vocab_shard_range(vocab, 1, 0, 0, &lo, &padded), TOVL_OK);
    for (int f32 = 0; f32 < 2; f32++) {
        const size_t elem = f32 ? 4 : 2;
        const tovl_logits_dtype dtype = f32 ? TOVL_LOGITS_F32 : TOVL_LOGITS_BF16;
        uint16_t *base = xcalloc((size_t)T * padded, elem);
        tu_fill_bf16(&r, base, (size_t)T * padded * elem / 2); /* never zero; as f32: random non-zero bits */
        char what[96];
        snprintf(what, sizeof what, "%s vocab %u %s %s unsharded", b->name, vocab, tied ? "tied" : "untied",
                 f32 ? "f32" : "bf16");
        unsigned char *want = hook_on(b, full, base, elem, padded, 0, padded, 3, dtype, d_hidden, d_slots, what);
        cr_assert(memcmp(want, base, (size_t)T * padded * elem) != 0, "%s: the hook wrote no cell", what);
        for (uint32_t N = 1; N <= MAX_N; N++) {
            unsigned char *got = xcalloc((size_t)T * padded, elem);
            uint32_t cells = 0;
            for (uint32_t rank = 0; rank < N; rank++) {
                uint32_t start, end;
                cr_assert_eq(tovl_vocab_shard_range(vocab, N, rank, 0, &start, &end), TOVL_OK);
                const uint32_t width = end - start;
                tovl_token_overlay_set *shard = NULL;
                tovl_status st = tovl_token_overlay_set_from_slots_shard(b->be, p.ov, MAXL, tied, start, end, &shard);
                if (start >= vocab) { /* padding only (or empty): no set, the base stays */
                    cr_assert_neq(st, TOVL_OK, "shard [%u, %u) past vocab %u was accepted", start, end, vocab);
                    cr_assert_null(shard);
                    for (uint32_t t = 0; t < T; t++) {
                        memcpy(got + ((size_t)t * padded + start) * elem, (char *)base + ((size_t)t * padded + start) * elem,
                               (size_t)width * elem);
                    }
                    continue;
                }
                cr_assert_eq(st, TOVL_OK, "N %u rank %u [%u, %u): %s", N, rank, start, end, tovl_last_error());
                uint32_t s0, s1, per[MAXL];
                tovl_token_overlay_set_shard_range(shard, &s0, &s1);
                cr_assert(s0 == start && s1 == end, "shard_range [%u, %u), built for [%u, %u)", s0, s1, start, end);
                cr_assert_eq(tovl_token_overlay_set_vocab(shard), vocab);
                cells += total_cells(shard, b, per);
                for (int s = 0; s < MAXL; s++) {
                    cr_assert_leq(per[s], full_n[s], "N %u rank %u slot %d: %u cells, the full set has %u", N, rank,
                                  s, per[s], full_n[s]);
                }
                snprintf(what, sizeof what, "%s vocab %u %s %s N %u rank %u [%u, %u)", b->name, vocab,
                         tied ? "tied" : "untied", f32 ? "f32" : "bf16", N, rank, start, end);
                unsigned char *part = hook_on(b, shard, base, elem, padded, start, width, rank % 3, dtype, d_hidden,
                                              d_slots, what);
                for (uint32_t t = 0; t < T; t++) {
                    memcpy(got + ((size_t)t * padded + start) * elem, part + (size_t)t * width * elem,
                           (size_t)width * elem);
                }
                free(part);
                tovl_token_overlay_set_destroy(shard);
            }
            cr_assert_eq(cells, full_cells, "vocab %u N %u: the shards hold %u cells, the full set %u", vocab, N,
                         cells, full_cells);
            for (size_t i = 0; i < (size_t)T * padded; i++) {
                if (memcmp(got + i * elem, want + i * elem, elem) != 0) {
                    cr_assert_fail("%s vocab %u %s %s N %u: row %zu column %zu differs from the unsharded set",
                                   b->name, vocab, tied ? "tied" : "untied", f32 ? "f32" : "bf16", N, i / padded,
                                   i % padded);
                }
            }
            free(got);
        }
        free(want);
        free(base);
    }

    /* The embed hook of a shard set is the full set's. */
    uint32_t start, end;
    cr_assert_eq(tovl_vocab_shard_range(vocab, 3, 1, 0, &start, &end), TOVL_OK);
    tovl_token_overlay_set *shard = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots_shard(b->be, p.ov, MAXL, tied, start, end, &shard), TOVL_OK, "%s",
                 tovl_last_error());
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(b->be);
    uint16_t *out[2];
    for (int i = 0; i < 2; i++) {
        tovl_devptr d = upload(b, hid, sizeof(uint16_t) * T * HID);
        tovl_embed_hook_args a = {.hidden = d, .token_ids = d_tok, .slots = d_slots, .active_slot = -1, .T = T,
                                  .hidden_size = HID};
        cr_assert_eq(tovl_embed_hook(i ? shard : full, &k, &a, NULL), TOVL_OK, "%s", tovl_last_error());
        out[i] = xcalloc((size_t)T * HID, sizeof(uint16_t));
        cr_assert_eq(tovl_download(b->be, out[i], d, sizeof(uint16_t) * T * HID), TOVL_OK);
        tovl_free(b->be, d);
    }
    cr_assert(memcmp(out[0], hid, sizeof(uint16_t) * T * HID) != 0, "the embed hook wrote no row");
    cr_assert(memcmp(out[0], out[1], sizeof(uint16_t) * T * HID) == 0, "vocab %u: the shard's embed hook differs",
              vocab);
    free(out[0]);
    free(out[1]);
    tovl_token_overlay_set_destroy(shard);

    tovl_free(b->be, d_hidden);
    tovl_free(b->be, d_slots);
    tovl_free(b->be, d_tok);
    free(hid);
    tovl_token_overlay_set_destroy(full);
    pool_free(&p);
}

/* 509 and 1021 prime, 777 odd, 1000 even (padded to 1024), 4096 a multiple
 * of 64 and of every N's padding, 131 prime and below 8 x 64 (shards of
 * padding only). */
static const uint32_t vocabs[] = {509, 777, 1000, 1021, 4096, 131};

ParameterizedTestParameters(tp, shards_concatenate_to_the_unsharded_logits) {
    return backend_params();
}
ParameterizedTest(size_t *index, tp, shards_concatenate_to_the_unsharded_logits, .timeout = 900) {
    bk b = open_backend(*index);
    fprintf(stderr, "tp: seed %" PRIu64 " (TOVL_TEST_SEED replays it)\n", tu_seed());
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        check_vocab(&b, vocabs[v], false);
        check_vocab(&b, vocabs[v], true);
    }
    close_backend(&b);
}

/* ------------------------------------------------------------------------ */
/* vLLM's split, and the errors                                              */
/* ------------------------------------------------------------------------ */
Test(tp, vocab_shard_range_is_vllms_split) {
    uint32_t s, e;
    /* vLLM: Qwen2's 151936 over 4 ranks, pad 64: 37984 each. */
    cr_assert_eq(tovl_vocab_shard_range(151936, 4, 3, 64, &s, &e), TOVL_OK);
    cr_assert(s == 3 * 37984 && e == 151936, "[%u, %u)", s, e);
    /* 32001 pads to 32064; over 2 ranks 16032 each; pad 0 means 64. */
    cr_assert_eq(tovl_vocab_shard_range(32001, 2, 1, 0, &s, &e), TOVL_OK);
    cr_assert(s == 16032 && e == 32064, "[%u, %u)", s, e);
    /* 1000 pads to 1024; 3 ranks do not divide it: 342, 342, 340. */
    cr_assert_eq(tovl_vocab_shard_range(1000, 3, 2, 0, &s, &e), TOVL_OK);
    cr_assert(s == 684 && e == 1024, "[%u, %u)", s, e);
    /* Pad 1: 9 over 4 ranks of width 3: the last rank's range is empty. */
    cr_assert_eq(tovl_vocab_shard_range(9, 4, 3, 1, &s, &e), TOVL_OK);
    cr_assert(s == 9 && e == 9, "[%u, %u)", s, e);
    /* Every split covers [0, padded) in order, whatever N. */
    tu_rng r = tu_rng_for("tp-split");
    for (int i = 0; i < 200; i++) {
        uint32_t vocab = 1 + tu_below(&r, 300000), n = 1 + tu_below(&r, 16), pad = tu_below(&r, 3) * 64, next = 0;
        uint32_t padded = (vocab + (pad ? pad : 64) - 1) / (pad ? pad : 64) * (pad ? pad : 64);
        for (uint32_t rank = 0; rank < n; rank++) {
            cr_assert_eq(tovl_vocab_shard_range(vocab, n, rank, pad, &s, &e), TOVL_OK);
            cr_assert(s == next && e >= s && e <= padded, "vocab %u N %u rank %u: [%u, %u) after %u", vocab, n, rank,
                      s, e, next);
            next = e;
        }
        cr_assert_eq(next, padded, "vocab %u N %u pad %u: covers %u of %u", vocab, n, pad, next, padded);
    }
}

Test(tp, vocab_shard_range_errors_name_the_argument) {
    uint32_t s = 7, e = 7;
    cr_assert_eq(tovl_vocab_shard_range(100, 4, 4, 64, &s, &e), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(tovl_last_error(), "rank 4 >= world_size 4"), "%s", tovl_last_error());
    cr_assert(s == 0 && e == 0);
    cr_assert_eq(tovl_vocab_shard_range(100, 0, 0, 64, &s, &e), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(tovl_last_error(), "world_size 0"), "%s", tovl_last_error());
    cr_assert_eq(tovl_vocab_shard_range(0, 2, 0, 64, &s, &e), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(tovl_last_error(), "vocab 0"), "%s", tovl_last_error());
    cr_assert_eq(tovl_vocab_shard_range(UINT32_MAX, 2, 0, 64, &s, &e), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(tovl_last_error(), "2^32"), "%s", tovl_last_error());
    cr_assert_eq(tovl_vocab_shard_range(100, 2, 0, 64, NULL, &e), TOVL_ERR_INVALID_ARGUMENT);
}

static tovl_backend *err_be;
static tu_wrap *err_w;
static tovl_embed_overlay *err_ov[2];
static void err_setup(void) {
    err_be = tu_wrap_cpu(&err_w);
    uint16_t rows[3 * HID];
    tu_rng r = tu_rng_for("tp-errors");
    tu_fill_bf16(&r, rows, 3 * HID);
    const uint32_t ids[3] = {0, 50, 99};
    cr_assert_eq(tu_build(err_be, 100, HID, ids, rows, 3, true, ids, rows, 3, false, &err_ov[0]), TOVL_OK);
}
static void err_teardown(void) {
    tovl_embed_overlay_release(err_ov[0]);
    cr_expect_eq(tu_live(err_w), 0, "%ld device allocations still live", tu_live(err_w));
    tovl_backend_close(err_be);
}
TestSuite(tp_errors, .init = err_setup, .fini = err_teardown);

Test(tp_errors, empty_and_inverted_ranges_name_both_ends) {
    tovl_token_overlay_set *set = (tovl_token_overlay_set *)1;
    cr_assert_eq(tovl_token_overlay_set_from_slots_shard(err_be, err_ov, 2, false, 40, 40, &set),
                 TOVL_ERR_INVALID_ARGUMENT);
    cr_assert_null(set);
    cr_assert(strstr(tovl_last_error(), "vocab_start 40 >= vocab_end 40"), "%s", tovl_last_error());
    cr_assert_eq(tovl_token_overlay_set_from_slots_shard(err_be, err_ov, 2, false, 60, 20, &set),
                 TOVL_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(tovl_last_error(), "vocab_start 60 >= vocab_end 20"), "%s", tovl_last_error());
    cr_assert_eq(tu_live(err_w), 5, "only the overlay's arrays are live"); /* embed ids, rows, map; lm ids, rows */
}

Test(tp_errors, a_range_past_the_served_vocab_names_it) {
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots_shard(err_be, err_ov, 2, false, 100, 128, &set),
                 TOVL_ERR_ID_OUT_OF_RANGE);
    cr_assert_null(set);
    cr_assert(strstr(tovl_last_error(), "vocab_start 100 >= vocab 100"), "%s", tovl_last_error());
    cr_assert(strstr(tovl_last_error(), "[100, 128)"), "%s", tovl_last_error());
    /* Padding past the vocab is fine when the shard starts inside it. */
    cr_assert_eq(tovl_token_overlay_set_from_slots_shard(err_be, err_ov, 2, false, 99, 128, &set), TOVL_OK, "%s",
                 tovl_last_error());
    cr_assert_eq(tovl_token_overlay_set_max_n_override(set), 1u, "only id 99 lies in [99, 128)");
    tovl_token_overlay_set_destroy(set);
    /* An empty pool has no served vocab: any non-empty range. */
    tovl_embed_overlay *none[2] = {NULL, NULL};
    cr_assert_eq(tovl_token_overlay_set_from_slots_shard(err_be, none, 2, false, 500, 600, &set), TOVL_OK);
    cr_assert_not(tovl_token_overlay_set_any_active(set));
    tovl_token_overlay_set_destroy(set);
}

/* Fixed-shape shard sets: the ranges of from_slots_shard against shape.vocab;
 * a load over the capacity refused on every rank alike (the capacity counts
 * the overlay's whole lm_head), whether or not its shard holds a cell. */
Test(tp_errors, fixed_shard_sets_name_their_ranges_and_refuse_alike) {
    const tovl_set_shape shape = {2, 100, HID, false, 4, 1};
    tovl_token_overlay_set *set = (tovl_token_overlay_set *)1;
    cr_assert_eq(tovl_token_overlay_set_create_shard(err_be, &shape, 40, 40, &set), TOVL_ERR_INVALID_ARGUMENT);
    cr_assert_null(set);
    cr_assert(strstr(tovl_last_error(), "vocab_start 40 >= vocab_end 40"), "%s", tovl_last_error());
    cr_assert_eq(tovl_token_overlay_set_create_shard(err_be, &shape, 100, 128, &set), TOVL_ERR_ID_OUT_OF_RANGE);
    cr_assert(strstr(tovl_last_error(), "vocab_start 100 >= shape.vocab 100"), "%s", tovl_last_error());
    cr_assert_eq(tovl_token_overlay_set_create_shard(err_be, NULL, 0, 10, &set), TOVL_ERR_INVALID_ARGUMENT);
    const tovl_set_shape empty_shape = {2, 100, HID, false, 0, 0};
    cr_assert_eq(tovl_token_overlay_set_create_shard(err_be, &empty_shape, 0, 10, &set), TOVL_OK, "%s",
                 tovl_last_error()); /* no lm_head capacity: no ids buffer */
    tovl_token_overlay_set_destroy(set);
    /* err_ov[0]'s lm_head holds 3 cells (ids 0, 50, 99), over the capacity of 1: refused on a
     * rank whose shard holds one of them and on one that holds none. */
    const uint32_t ranges[2][2] = {{0, 50}, {1, 50}};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(tovl_token_overlay_set_create_shard(err_be, &shape, ranges[i][0], ranges[i][1], &set), TOVL_OK,
                     "%s", tovl_last_error());
        cr_assert_eq(tovl_token_overlay_set_load(set, 1, err_ov[0], NULL), TOVL_ERR_CAPACITY, "[%u, %u)",
                     ranges[i][0], ranges[i][1]);
        cr_assert(strstr(tovl_last_error(), "lmhead_capacity"), "%s", tovl_last_error());
        cr_assert_null(tovl_token_overlay_set_slot(set, 1));
        tovl_token_overlay_set_destroy(set);
    }
}

Test(tp_errors, ld_below_the_shard_width_names_the_shard) {
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots_shard(err_be, err_ov, 2, false, 32, 64, &set), TOVL_OK);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(err_be);
    tovl_devptr logits = 0, hidden = 0;
    cr_assert_eq(tovl_alloc(err_be, 64 * 4, &logits), TOVL_OK);
    cr_assert_eq(tovl_alloc(err_be, HID * 2, &hidden), TOVL_OK);
    tovl_lmhead_hook_args a = {.logits = logits, .logits_dtype = TOVL_LOGITS_F32, .ld = 31, .hidden = hidden,
                               .active_slot = 0, .T = 1, .hidden_size = HID};
    long launches = err_w->launches;
    cr_assert_eq(tovl_lmhead_hook(set, &k, &a, NULL), TOVL_ERR_SHAPE_MISMATCH);
    cr_assert(strstr(tovl_last_error(), "ld 31 < the shard's width 32 (vocab [32, 64))"), "%s", tovl_last_error());
    cr_assert_eq(err_w->launches, launches, "no launch on a refused call");
    a.ld = 32; /* the shard's width: accepted (the unsharded set would want 100) */
    cr_assert_eq(tovl_lmhead_hook(set, &k, &a, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(err_w->launches, launches + 1);
    tovl_free(err_be, logits);
    tovl_free(err_be, hidden);
    tovl_token_overlay_set_destroy(set);
}

Test(tp_errors, the_unsharded_set_covers_the_whole_vocab) {
    tovl_token_overlay_set *set = NULL;
    uint32_t s = 9, e = 9;
    cr_assert_eq(tovl_token_overlay_set_from_slots(err_be, err_ov, 2, false, &set), TOVL_OK);
    tovl_token_overlay_set_shard_range(set, &s, &e);
    cr_assert(s == 0 && e == 100, "[%u, %u)", s, e);
    tovl_token_overlay_set_destroy(set);
    tovl_token_overlay_set_shard_range(NULL, &s, &e);
    cr_assert(s == 0 && e == 0);
    tovl_token_overlay_set_shard_range(NULL, NULL, NULL);
}

Test(tp_errors, every_failed_step_leaks_nothing) {
    const long base_live = tu_live(err_w);
    /* a slot with cells in the shard: 2 copies, then the 6 tables */
    for (long at = 1; at <= 8; at++) {
        err_w->fail_alloc_at = err_w->alloc_calls + at;
        tovl_token_overlay_set *set = (tovl_token_overlay_set *)1;
        tovl_status st = tovl_token_overlay_set_from_slots_shard(err_be, err_ov, 2, false, 40, 100, &set);
        cr_assert_eq(st, TOVL_ERR_OUT_OF_MEMORY, "alloc %ld: %s", at, tovl_status_str(st));
        cr_assert_null(set);
        cr_assert_eq(tu_live(err_w), base_live, "alloc %ld failed: %ld allocations leaked", at,
                     tu_live(err_w) - base_live);
    }
    err_w->fail_alloc_at = 0;
    for (long at = 1; at <= 2; at++) { /* the ids, then the rows of the slot */
        err_w->fail_download_at = err_w->downloads + at;
        tovl_token_overlay_set *set = NULL;
        cr_assert_neq(tovl_token_overlay_set_from_slots_shard(err_be, err_ov, 2, false, 40, 100, &set), TOVL_OK);
        cr_assert_null(set);
        cr_assert_eq(tu_live(err_w), base_live);
    }
    err_w->fail_download_at = 0;
}
