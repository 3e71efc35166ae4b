/*
 * tovl bench: the four kernels timed on a backend with its own device clock
 * (the optional time_kernel / copy_bandwidth members of the backend vtable;
 * the CPU backend's are the wall clock and a threaded memcpy),
 * on fresh random data (never zeros), after warm-up, as medians:
 *
 *   graph   the median per-launch time of `batch` back-to-back launches
 *           recorded once and replayed (a CUDA graph, one Vulkan command
 *           buffer): what an engine pays per hook;
 *   single  the median time of one launch between two timestamps on the device,
 *           which includes the timestamps' own overhead;
 *   GB/s    the bytes a kernel must move (read + written) per graph launch
 *           time, and that as a fraction of the device copy bandwidth measured
 *           in the same run (a device-to-device copy, read + written).
 *
 * Sizes (issue 6): rowdiff over a vocab 152064 x h 4096 bf16 pair (1% of the
 * rows differ, in one element, so the rest must be read whole); the embed and
 * lm_head hooks at T = 512 and T = 64 (--tokens: other batch sizes), h = 4096,
 * 8 slots x 64 overlay rows, vocab 152064, a mixed batch (each row's slot
 * random, 1 in 16 none; half the embed ids overlaid).
 *
 * --tp N (issue 24): also N vocab shard sets of the same pool (vLLM's split of
 * the padded vocab, tovl_vocab_shard_range). At each batch size the shards'
 * lm_head outputs, concatenated, are checked against the unsharded set's bit
 * for bit (bf16 and f32 logits), then each rank's lm_head kernel is timed on
 * its own logits shard [T, shard width], beside the unsharded one. The same
 * for N fixed-shape shard sets (tovl_token_overlay_set_create_shard, capacity
 * --rows, every slot loaded), beside today's shard sets.
 *
 * --capacity C[,C...] (issue 40): also fixed-shape sets of those lm_head and
 * embed capacities holding the same overlays (--rows a slot, default 64). At
 * each batch size their outputs are checked against the from_slots set's bit
 * for bit, then their hooks are timed beside it (the lm_head grid is the
 * capacity's, whatever is loaded); and one load into a slot, host time per
 * call and stream time per load of back-to-back loads (its device part is at
 * most that).
 *
 * The per-dispatch floor: an idle embed launch (T = 1, its slot -1, so the
 * kernel reads one word and returns) on every backend, and, where a backend
 * offers them (Vulkan), the dispatch_floor_* probes: an empty kernel recorded
 * `batch` times with the narrowest barrier between hooks (bare), with a
 * pipeline bind and push constants each time (bind), exactly as a hook launch
 * (contract), as one with ALL_COMMANDS in its barriers (all_commands), and
 * with no barrier at all (unsynced).
 *
 * --cuda-image FILE opens the CUDA backend on the kernels of FILE (a cubin,
 * fatbin or PTX, through tovl_cuda_backend_open_image) instead of its own,
 * so another port's kernel source compiled for NVIDIA, e.g. the HIP port's
 * (hip_on_cuda.h), is timed with the same workload and clock.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "conform.h"
#include "tovl/backend.h"

/* Tensors one --dump file may hold: the set's 2, then 4 per batch size. */
#define BENCH_DUMP_MAX 40

/* Batch sizes one run may time (--tokens). */
#define BENCH_MAX_SIZES 8
/* The most fixed-shape set capacities --capacity takes. */
#define BENCH_MAX_CAPS 4
/* The most ranks --tp takes. */
#define BENCH_MAX_TP 16
/* The largest T --tokens takes: logits of T x vocab f32 are 0.6 GB per 1024 rows. */
#define BENCH_MAX_T 65536u

/* The floor probes a backend may offer (see the top of this file). */
static const char *const floor_probes[] = {"dispatch_floor_bare", "dispatch_floor_bind", "dispatch_floor_contract",
                                           "dispatch_floor_all_commands", "dispatch_floor_unsynced"};
#define BENCH_FLOOR_ROWS (1 + sizeof floor_probes / sizeof floor_probes[0]) /* the idle embed, the probes */

typedef struct bench_options {
    const char *backend, *json, *dump, *cuda_image;
    uint64_t seed;
    uint32_t batch, repeats;
    uint32_t rowdiff_rows, h, vocab, slots, rows_per_slot;
    uint32_t tokens[BENCH_MAX_SIZES]; /* the hooks' batch sizes, in order */
    uint32_t n_tokens;
    uint32_t tp; /* > 1: also the lm_head as this many vocab shards */
    uint32_t caps[BENCH_MAX_CAPS]; /* --capacity: fixed-shape sets of these capacities */
    uint32_t n_caps;
    bool hooks_only; /* --hooks-only: no copy bandwidth, no rowdiff */
} bench_options;

typedef struct bench_row {
    char kernel[32], label[48];
    tovl_kernel_timing timing;
    double bytes; /* moved per launch, read + written */
    double macs;  /* multiply-adds per launch (lm_head), else 0 */
    uint32_t T;   /* the hooks' batch size, 0 for rowdiff */
    int32_t rank; /* a shard's rank under --tp, -1 for the unsharded set */
    uint32_t capacity; /* a fixed-shape set's capacity (--capacity), 0 for the from_slots set */
} bench_row;

/* --capacity: one load's cost, per capacity. */
typedef struct bench_load {
    uint32_t capacity;
    double host_us;   /* median wall time of one load call */
    double stream_us; /* wall time of back-to-back loads until the stream is idle, per load */
    uint32_t loads;
} bench_load;

typedef struct bench_run {
    const bench_options *opt;
    tovl_backend *be;
    const tovl_backend_iface *iface;
    void *ctx;
    tovl_overlay_kernels k;
    uint64_t rng;
    /* rowdiff, the floor, then per size the 3 hooks, 2 per shard of each kind */
    bench_row rows[1 + BENCH_FLOOR_ROWS + (3 + 4 * BENCH_MAX_TP + 3 * BENCH_MAX_CAPS) * BENCH_MAX_SIZES];
    uint32_t cap_checked; /* --capacity: batch sizes x capacities whose outputs matched from_slots */
    bench_load loads[BENCH_MAX_CAPS];
    size_t n_rows;
    double copy_gbps; /* 0: the backend cannot measure it */
    const char *pdl;  /* the backend's programmatic_dependent_launch property, or NULL */
    uint32_t tp_checked; /* --tp: batch sizes x dtypes whose shards matched the unsharded set */
    struct bench_tensor {
        char name[32];
        const char *dtype; /* safetensors: "BF16", "F32", "I32" */
        uint32_t ndim, shape[3];
        void *data; /* owned */
        size_t bytes;
    } dump[BENCH_DUMP_MAX]; /* --dump: the lm_head workload, written at the end */
    size_t n_dump;
} bench_run;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tovl bench [--backend NAME] [--seed N] [--json FILE] [--batch N] [--repeats N]\n"
            "                  [--tokens T[,T...]] [--tp N] [--dump FILE] [--quick] [--hooks-only]\n"
            "                  [--cuda-image FILE] [--capacity C[,C...]] [--rows R]\n\n"
            "Times rowdiff (152064 x 4096 bf16) and the embed and lm_head hooks (T = 512 and 64,\n"
            "h = 4096, 8 slots x 64 rows) on a backend (default: auto) with its own clock (the\n"
            "device's clock; the wall clock on cpu, whose samples hold at most 0.25 s of launches):\n"
            "the median per-launch time of --batch (100) launches recorded once and replayed,\n"
            "the median single launch, GB/s and the fraction of the device copy bandwidth,\n"
            "medians over --repeats (20). --tokens: the hooks' batch sizes instead (up to %d,\n"
            "each 1 .. %u). --tp N (2 .. %d): also N vocab shard sets (vLLM's split, pad 64), their\n"
            "lm_head outputs concatenated checked bit for bit against the unsharded set, then each\n"
            "rank's lm_head timed on its logits shard. --dump FILE: the lm_head workload as\n"
            "safetensors (the overlay rows and ids of each slot; per batch size the hidden rows, row\n"
            "slots and the cells tovl computed) for a peer to run the same work. --quick: small\n"
            "sizes, for a smoke run. --hooks-only: the floor and the hooks only (no copy bandwidth,\n"
            "no rowdiff). --cuda-image FILE: the CUDA backend on the kernels of FILE (cubin, fatbin\n"
            "or PTX) instead of its own, e.g. another port's source compiled for NVIDIA.\n"
            "--capacity C[,C...] (up to %d): also fixed-shape sets of those slot capacities holding the\n"
            "same overlays, checked bit for bit against the from_slots set and timed beside it, and\n"
            "the time of one load. --rows R: overlay rows a slot (64).\n",
            BENCH_MAX_SIZES, BENCH_MAX_T, BENCH_MAX_TP, BENCH_MAX_CAPS);
}

/* ------------------------------------------------------------------------ */
/* Random data: bf16 of magnitude 2^-8 .. 2^8, random sign, never zero.      */
/* ------------------------------------------------------------------------ */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t random_below(uint64_t *state, uint32_t n) {
    return (uint32_t)(next_random(state) % n);
}

/* Four bf16 from one draw: sign, exponent 119..134, 7 mantissa bits. */
static void fill_bf16(uint64_t *state, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i += 4) {
        uint64_t bits = next_random(state);
        for (size_t j = 0; j < 4 && i + j < n; j++, bits >>= 16) {
            dst[i + j] = (uint16_t)((bits & 0x8000u) | ((119u + ((bits >> 7) & 15u)) << 7) | (bits & 0x7Fu));
        }
    }
}

static void distinct_ids(uint64_t *state, uint32_t vocab, uint32_t n, uint32_t *ids) {
    for (uint32_t j = 0; j < n; j++) {
        bool dup;
        do {
            ids[j] = random_below(state, vocab);
            dup = false;
            for (uint32_t i = 0; i < j && !dup; i++) {
                dup = ids[i] == ids[j];
            }
        } while (dup);
    }
}

/* ------------------------------------------------------------------------ */
static tovl_status upload_new(tovl_backend *be, const void *src, size_t bytes, tovl_devptr *dst) {
    tovl_status st = tovl_alloc(be, bytes, dst);
    return st == TOVL_OK ? tovl_upload(be, *dst, src, bytes) : st;
}

/* Fresh random bf16 on the device; *kept (if given) takes the host copy. */
static tovl_status upload_random_bf16(bench_run *run, size_t count, tovl_devptr *dst, uint16_t **kept) {
    uint16_t *host = malloc(count * sizeof *host);
    if (!host) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: out of host memory (%zu bf16)", count);
    }
    fill_bf16(&run->rng, host, count);
    tovl_status st = upload_new(run->be, host, count * sizeof *host, dst);
    if (kept && st == TOVL_OK) {
        *kept = host;
    } else {
        free(host);
    }
    return st;
}

static tovl_status time_one(bench_run *run, const char *kernel_name, tovl_kernel kernel, const char *label,
                            const uint32_t grid[3], const void *args, size_t args_size, double bytes, double macs,
                            uint32_t T, int32_t rank) {
    if (!kernel) {
        return tovl_error(TOVL_ERR_KERNEL_MISSING, "bench: the backend has no %s kernel", kernel_name);
    }
    if (run->n_rows == sizeof run->rows / sizeof run->rows[0]) {
        return tovl_error(TOVL_ERR_INTERNAL, "bench: too many rows");
    }
    bench_row *row = &run->rows[run->n_rows];
    memset(row, 0, sizeof *row);
    snprintf(row->kernel, sizeof row->kernel, "%s", kernel_name);
    snprintf(row->label, sizeof row->label, "%s", label);
    row->bytes = bytes;
    row->macs = macs;
    row->T = T;
    row->rank = rank;
    fprintf(stderr, "bench: %s %s ...\n", kernel_name, label);
    tovl_status st = run->iface->time_kernel(run->ctx, kernel, grid, args, args_size, run->opt->batch,
                                             run->opt->repeats, &row->timing);
    if (st == TOVL_OK) {
        run->n_rows++;
    }
    return st;
}

/* Device copy bandwidth over `bytes`, and rowdiff over rows x h. */
static tovl_status bench_rowdiff(bench_run *run) {
    const bench_options *o = run->opt;
    const size_t elems = (size_t)o->rowdiff_rows * o->h, bytes = elems * 2;
    if (run->iface->copy_bandwidth) {
        fprintf(stderr, "bench: copy bandwidth over %zu MB ...\n", bytes >> 20);
        tovl_status st = run->iface->copy_bandwidth(run->ctx, bytes, o->repeats, &run->copy_gbps);
        if (st != TOVL_OK) {
            return st;
        }
    }
    uint16_t *a = malloc(bytes), *b = malloc(bytes);
    tovl_devptr da = 0, db = 0, flags = 0;
    tovl_status st = a && b ? TOVL_OK : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    if (st == TOVL_OK) {
        fill_bf16(&run->rng, a, elems);
        memcpy(b, a, bytes);
        for (uint32_t i = 0; i < o->rowdiff_rows / 100 + 1; i++) { /* 1% of the rows differ in one element */
            size_t at = (size_t)random_below(&run->rng, o->rowdiff_rows) * o->h + random_below(&run->rng, o->h);
            b[at] ^= 1;
        }
        st = upload_new(run->be, a, bytes, &da);
    }
    if (st == TOVL_OK) st = upload_new(run->be, b, bytes, &db);
    free(a);
    free(b);
    if (st == TOVL_OK) st = tovl_alloc(run->be, (size_t)o->rowdiff_rows * 4, &flags);
    if (st == TOVL_OK) {
        tovl_rowdiff_args args = {.a = da, .b = db, .flags = flags, .rows = o->rowdiff_rows, .h = o->h, .tol = 0.0f};
        char label[48];
        snprintf(label, sizeof label, "%ux%u bf16", o->rowdiff_rows, o->h);
        st = time_one(run, TOVL_KERNEL_ROWDIFF, run->k.rowdiff, label, (uint32_t[3]){o->rowdiff_rows, 1, 1}, &args,
                      sizeof args, 2.0 * (double)bytes + 4.0 * o->rowdiff_rows, 0.0, 0, -1);
    }
    tovl_free(run->be, da);
    tovl_free(run->be, db);
    tovl_free(run->be, flags);
    return st;
}

/* The overlay set: slots x rows_per_slot embed rows and own lm_head rows;
 * `slots` [o->slots] receives the overlays (the caller releases them). */
static tovl_status build_set(bench_run *run, uint32_t *embed_ids, tovl_embed_overlay **slots,
                             tovl_token_overlay_set **set) {
    const bench_options *o = run->opt;
    const size_t rows = o->rows_per_slot, row_elems = rows * o->h;
    uint32_t *lm_ids = malloc(rows * sizeof *lm_ids);
    uint16_t *data = malloc(2 * row_elems * sizeof *data);
    tovl_status st = lm_ids && data ? TOVL_OK : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: host memory");
    for (uint32_t s = 0; s < o->slots && st == TOVL_OK; s++) {
        uint32_t *ids = embed_ids + s * rows;
        distinct_ids(&run->rng, o->vocab, (uint32_t)rows, ids);
        distinct_ids(&run->rng, o->vocab, (uint32_t)rows, lm_ids);
        fill_bf16(&run->rng, data, 2 * row_elems);
        tovl_overlay_desc d = {
            .adapter = "bench",
            .vocab = o->vocab,
            .hidden = o->h,
            .embed = {"embed", ids, data, (uint32_t)rows, o->h},
            .has_lmhead = true,
            .lmhead = {"lm_head", lm_ids, data + row_elems, (uint32_t)rows, o->h},
        };
        st = tovl_build_overlay(run->be, &run->k, &d, &slots[s]);
    }
    if (st == TOVL_OK) st = tovl_token_overlay_set_from_slots(run->be, slots, o->slots, false, set);
    free(lm_ids);
    free(data);
    return st;
}

/* --tp: the base value of every logits cell in the check, non-zero and the
 * same in every column, so a shard's cells start as the unsharded buffer's:
 * f32 1.00390625, or bf16 1.0 twice per word. */
static uint32_t check_base(bool f32) {
    return f32 ? 0x3F808000u : 0x3F803F80u;
}

/* --tp: the lm_head hook of `set` over a fresh [T, width] logits buffer of
 * base cells, downloaded into `out`. */
static tovl_status hook_logits(bench_run *run, const tovl_token_overlay_set *set, uint32_t T, uint32_t width,
                               bool f32, tovl_devptr hidden, tovl_devptr slots, void *out) {
    const size_t bytes = (size_t)T * width * (f32 ? 4 : 2), words = (bytes + 3) / 4 * 4;
    tovl_devptr logits = 0;
    tovl_status st = tovl_alloc(run->be, words, &logits);
    if (st == TOVL_OK) st = tovl_fill_u32(run->be, logits, check_base(f32), words);
    if (st == TOVL_OK) {
        tovl_lmhead_hook_args a = {.logits = logits, .logits_dtype = f32 ? TOVL_LOGITS_F32 : TOVL_LOGITS_BF16,
                                   .ld = width, .hidden = hidden, .slots = slots, .active_slot = -1, .T = T,
                                   .hidden_size = run->opt->h};
        st = tovl_lmhead_hook(set, &run->k, &a, NULL);
    }
    if (st == TOVL_OK) st = tovl_synchronize(run->be, NULL);
    if (st == TOVL_OK) st = tovl_download(run->be, out, logits, bytes);
    tovl_free(run->be, logits);
    return st;
}

/* --tp: the shards' lm_head outputs, concatenated, equal the unsharded set's
 * bit for bit (columns past the vocab, engine padding, stay the base). */
static tovl_status check_shards(bench_run *run, const tovl_token_overlay_set *set,
                                tovl_token_overlay_set *const *shards, uint32_t T, bool f32, tovl_devptr hidden,
                                tovl_devptr slots) {
    const bench_options *o = run->opt;
    const size_t elem = f32 ? 4 : 2;
    uint32_t start, padded;
    tovl_status st = tovl_vocab_shard_range(o->vocab, 1, 0, 0, &start, &padded);
    unsigned char *want = malloc((size_t)T * o->vocab * elem), *got = malloc((size_t)T * padded * elem);
    if (st == TOVL_OK && (!want || !got)) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: out of host memory for the --tp check at T = %u", T);
    }
    if (st == TOVL_OK) st = hook_logits(run, set, T, o->vocab, f32, hidden, slots, want);
    for (uint32_t r = 0; st == TOVL_OK && r < o->tp; r++) {
        uint32_t end;
        st = tovl_vocab_shard_range(o->vocab, o->tp, r, 0, &start, &end);
        const uint32_t width = end - start, kept = (end < o->vocab ? end : o->vocab) - start;
        if (st != TOVL_OK || !shards[r]) {
            continue;
        }
        st = hook_logits(run, shards[r], T, width, f32, hidden, slots, got);
        for (uint32_t t = 0; st == TOVL_OK && t < T; t++) {
            const unsigned char *a = want + ((size_t)t * o->vocab + start) * elem, *b = got + (size_t)t * width * elem;
            const uint32_t base = check_base(f32);
            for (uint32_t j = 0; st == TOVL_OK && j < width; j++) {
                const void *expect = j < kept ? (const void *)(a + (size_t)j * elem) : &base; /* padding: base */
                if (memcmp(b + (size_t)j * elem, expect, elem) != 0) {
                    st = tovl_error(TOVL_ERR_INTERNAL,
                                    "bench --tp %u: %s logits at T = %u: rank %u [%u, %u), row %u column %u differs "
                                    "from the unsharded set",
                                    o->tp, f32 ? "f32" : "bf16", T, r, start, end, t, start + j);
                }
            }
        }
    }
    free(want);
    free(got);
    if (st == TOVL_OK) {
        run->tp_checked++;
        fprintf(stderr, "bench: --tp %u at T = %u, %s logits: the %s shards concatenated equal the unsharded set\n",
                o->tp, T, f32 ? "f32" : "bf16",
                shards[0] && tovl_token_overlay_set_is_fixed(shards[0]) ? "fixed-shape" : "from_slots");
    }
    return st;
}

/* --tp: check the shards of each kind (from_slots_shard, then the fixed-shape
 * shard sets) at this batch size, then time each rank's lm_head kernels on
 * its own logits shard; a fixed-shape shard's rows carry its capacity. */
static tovl_status bench_shards_at(bench_run *run, const tovl_token_overlay_set *set,
                                   tovl_token_overlay_set *const *shards, tovl_token_overlay_set *const *fixed_shards,
                                   uint32_t T, uint32_t live, tovl_devptr hidden, tovl_devptr slots) {
    const bench_options *o = run->opt;
    tovl_status st = TOVL_OK;
    for (int kind = 0; kind < 2 && st == TOVL_OK; kind++) {
        tovl_token_overlay_set *const *of = kind ? fixed_shards : shards;
        for (int f32 = 0; f32 < 2 && st == TOVL_OK; f32++) {
            st = check_shards(run, set, of, T, f32, hidden, slots);
        }
        for (uint32_t r = 0; r < o->tp && st == TOVL_OK; r++) {
            const uint32_t max_n = tovl_token_overlay_set_max_n_override(of[r]);
            if (!of[r] || max_n == 0) {
                continue; /* no cell in this shard: the hook does not launch */
            }
            uint32_t start, end;
            tovl_token_overlay_set_shard_range(of[r], &start, &end);
            const uint32_t width = end - start, grid_y = tovl_token_overlay_set_lmhead_grid_y(of[r]);
            tovl_devptr logits = 0;
            st = tovl_alloc(run->be, (size_t)T * width * 4, &logits);
            if (st == TOVL_OK) st = tovl_fill_u32(run->be, logits, 0x3F80BF80u, (size_t)T * width * 4);
            const tovl_overlay_tables tab = tovl_token_overlay_set_tables(of[r]);
            const double lm_cells = (double)live * max_n,
                         lm_in = 2.0 * (T + (double)o->slots * max_n) * (double)o->h;
            char label[48];
            snprintf(label, sizeof label, "T=%u tp %u rank %u%s", T, o->tp, r, kind ? " fixed" : "");
            for (int f32 = 0; f32 < 2 && st == TOVL_OK; f32++) {
                tovl_lmhead_overlay_args l = {logits, hidden, slots, tab.lmhead_rows_table, tab.lmhead_ids_table,
                                              tab.n_override_table, width, T, o->h, width, o->slots, -1, max_n};
                st = time_one(run, f32 ? TOVL_KERNEL_LMHEAD_OVERLAY_F32 : TOVL_KERNEL_LMHEAD_OVERLAY_BF16,
                              f32 ? run->k.lmhead_overlay_f32 : run->k.lmhead_overlay_bf16, label,
                              (uint32_t[3]){T, grid_y, 1}, &l, sizeof l, lm_in + lm_cells * (f32 ? 4 : 2),
                              lm_cells * (double)o->h, T, (int32_t)r);
                if (st == TOVL_OK && kind) {
                    run->rows[run->n_rows - 1].capacity = max_n;
                }
            }
            tovl_free(run->be, logits);
        }
    }
    return st;
}

/* ------------------------------------------------------------------------ */
/* --dump: the lm_head workload as safetensors                              */
/* ------------------------------------------------------------------------ */
/* Takes `data` (malloc'ed, `bytes` long) into the dump as tensor `name`; frees
 * it when the dump is full or not asked for. */
static tovl_status dump_add(bench_run *run, const char *name, const char *dtype, uint32_t ndim,
                            const uint32_t shape[3], void *data, size_t bytes) {
    if (!run->opt->dump) {
        free(data);
        return TOVL_OK;
    }
    if (!data || run->n_dump == BENCH_DUMP_MAX) {
        free(data);
        return tovl_error(data ? TOVL_ERR_INTERNAL : TOVL_ERR_OUT_OF_MEMORY, "bench: --dump: cannot hold tensor %s",
                          name);
    }
    struct bench_tensor *t = &run->dump[run->n_dump++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, ndim * sizeof *shape);
    t->data = data;
    t->bytes = bytes;
    return TOVL_OK;
}

static void *copy_of(const void *src, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p) {
        memcpy(p, src, bytes);
    }
    return p;
}

/* The set's lm_head rows and ids as the kernels read them (from the device
 * tables): "rows" [slots, max_n, h] bf16 (zeros past a slot's n), "ids"
 * [slots, max_n] i32 (-1 past n). */
static tovl_status dump_set(bench_run *run, const tovl_token_overlay_set *set) {
    const bench_options *o = run->opt;
    const tovl_overlay_tables tab = tovl_token_overlay_set_tables(set);
    const uint32_t max_n = tovl_token_overlay_set_max_n_override(set);
    const size_t row_bytes = (size_t)o->h * 2;
    uint64_t *rows_at = malloc(o->slots * sizeof *rows_at), *ids_at = malloc(o->slots * sizeof *ids_at);
    uint32_t *n = malloc(o->slots * sizeof *n);
    uint16_t *rows = calloc((size_t)o->slots * max_n, row_bytes);
    int32_t *ids = malloc((size_t)o->slots * max_n * sizeof *ids);
    tovl_status st = rows_at && ids_at && n && rows && ids ? TOVL_OK
                                                           : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: --dump: host memory");
    if (st == TOVL_OK) st = tovl_download(run->be, rows_at, tab.lmhead_rows_table, o->slots * sizeof *rows_at);
    if (st == TOVL_OK) st = tovl_download(run->be, ids_at, tab.lmhead_ids_table, o->slots * sizeof *ids_at);
    if (st == TOVL_OK) st = tovl_download(run->be, n, tab.n_override_table, o->slots * sizeof *n);
    for (uint32_t s = 0; s < o->slots && st == TOVL_OK; s++) {
        const uint32_t ns = n[s] < max_n ? n[s] : max_n;
        for (uint32_t k = 0; k < max_n; k++) {
            ids[(size_t)s * max_n + k] = -1;
        }
        if (ns) {
            st = tovl_download(run->be, rows + (size_t)s * max_n * o->h, rows_at[s], ns * row_bytes);
            if (st == TOVL_OK) st = tovl_download(run->be, ids + (size_t)s * max_n, ids_at[s], ns * sizeof *ids);
        }
    }
    free(rows_at);
    free(ids_at);
    free(n);
    if (st != TOVL_OK) {
        free(rows);
        free(ids);
        return st;
    }
    st = dump_add(run, "rows", "BF16", 3, (uint32_t[3]){o->slots, max_n, o->h}, rows, (size_t)o->slots * max_n * row_bytes);
    return st == TOVL_OK ? dump_add(run, "ids", "I32", 2, (uint32_t[3]){o->slots, max_n}, ids,
                                    (size_t)o->slots * max_n * sizeof *ids)
                         : (free(ids), st);
}

/* The cells an lm_head launch wrote into `logits` (T x ld cells of 2 or 4
 * bytes): "T<T>.cells_<dtype>" [T, max_n], NaN where row t has no slot or
 * slot s no k-th row. */
static tovl_status dump_cells(bench_run *run, tovl_devptr logits, uint32_t T, const int32_t *slots,
                              const tovl_token_overlay_set *set, bool f32) {
    if (!run->opt->dump) {
        return TOVL_OK;
    }
    const bench_options *o = run->opt;
    const uint32_t max_n = tovl_token_overlay_set_max_n_override(set);
    const tovl_overlay_tables tab = tovl_token_overlay_set_tables(set);
    const size_t esz = f32 ? 4 : 2, bytes = (size_t)T * o->vocab * esz;
    uint8_t *all = malloc(bytes), *cells = malloc((size_t)T * max_n * esz);
    uint64_t *ids_at = malloc(o->slots * sizeof *ids_at);
    uint32_t *n = malloc(o->slots * sizeof *n), *ids = malloc((size_t)o->slots * max_n * sizeof *ids);
    tovl_status st = all && cells && ids_at && n && ids ? TOVL_OK
                                                        : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: --dump: host memory");
    if (st == TOVL_OK) st = tovl_download(run->be, all, logits, bytes);
    if (st == TOVL_OK) st = tovl_download(run->be, ids_at, tab.lmhead_ids_table, o->slots * sizeof *ids_at);
    if (st == TOVL_OK) st = tovl_download(run->be, n, tab.n_override_table, o->slots * sizeof *n);
    for (uint32_t s = 0; s < o->slots && st == TOVL_OK; s++) {
        if (n[s] > max_n) n[s] = max_n;
        if (n[s]) st = tovl_download(run->be, ids + (size_t)s * max_n, ids_at[s], n[s] * sizeof *ids);
    }
    for (uint32_t t = 0; t < T && st == TOVL_OK; t++) {
        for (uint32_t k = 0; k < max_n; k++) {
            uint8_t *cell = cells + ((size_t)t * max_n + k) * esz;
            const int32_t s = slots[t];
            if (s >= 0 && k < n[s] && ids[(size_t)s * max_n + k] < o->vocab) {
                memcpy(cell, all + ((size_t)t * o->vocab + ids[(size_t)s * max_n + k]) * esz, esz);
            } else {
                memcpy(cell, f32 ? (const void *)&(uint32_t){0x7FC00000u} : (const void *)&(uint16_t){0x7FC0u}, esz);
            }
        }
    }
    free(all);
    free(ids_at);
    free(n);
    free(ids);
    if (st != TOVL_OK) {
        free(cells);
        return st;
    }
    char name[32];
    snprintf(name, sizeof name, "T%u.cells_%s", T, f32 ? "f32" : "bf16");
    return dump_add(run, name, f32 ? "F32" : "BF16", 2, (uint32_t[3]){T, max_n}, cells, (size_t)T * max_n * esz);
}

/* Writes the dump: an 8-byte little-endian header length, the JSON header,
 * the tensors' bytes in order. */
static int write_dump(bench_run *run, const char *path) {
    cJSON *header = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(header, "__metadata__");
    char text[32];
    snprintf(text, sizeof text, "%" PRIu64, run->opt->seed);
    cJSON_AddStringToObject(meta, "seed", text);
    snprintf(text, sizeof text, "%u", run->opt->vocab);
    cJSON_AddStringToObject(meta, "vocab", text);
    size_t at = 0;
    for (size_t i = 0; i < run->n_dump; i++) {
        const struct bench_tensor *t = &run->dump[i];
        cJSON *x = cJSON_AddObjectToObject(header, t->name);
        cJSON_AddStringToObject(x, "dtype", t->dtype);
        cJSON *shape = cJSON_AddArrayToObject(x, "shape");
        for (uint32_t d = 0; d < t->ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber(t->shape[d]));
        }
        cJSON *offsets = cJSON_AddArrayToObject(x, "data_offsets");
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)(at + t->bytes)));
        at += t->bytes;
    }
    char *json = cJSON_PrintUnformatted(header);
    cJSON_Delete(header);
    FILE *f = json ? fopen(path, "wb") : NULL;
    bool ok = f != NULL;
    if (ok) {
        const uint64_t len = strlen(json);
        uint8_t le[8];
        for (int b = 0; b < 8; b++) {
            le[b] = (uint8_t)(len >> (8 * b));
        }
        ok = fwrite(le, 1, 8, f) == 8 && fwrite(json, 1, len, f) == len;
        for (size_t i = 0; ok && i < run->n_dump; i++) {
            ok = fwrite(run->dump[i].data, 1, run->dump[i].bytes, f) == run->dump[i].bytes;
        }
    }
    ok = f && fclose(f) == 0 && ok;
    free(json);
    if (!ok) {
        fprintf(stderr, "tovl bench: cannot write --dump file '%s'\n", path);
        return 2;
    }
    return 0;
}

/* --capacity: `fixed`'s three outputs (embed rows, bf16 and f32 logits) over
 * the batch equal the from_slots set's, bit for bit. */
static tovl_status check_fixed(bench_run *run, const tovl_token_overlay_set *set, const tovl_token_overlay_set *fixed,
                               uint32_t T, const tovl_devptr in[4]) {
    const bench_options *o = run->opt;
    const size_t embed_bytes = (size_t)T * o->h * 2, logits_bytes = (size_t)T * o->vocab * 4;
    uint8_t *got = malloc(embed_bytes + logits_bytes), *want = malloc(embed_bytes + logits_bytes);
    tovl_devptr rows = 0;
    tovl_status st = got && want ? tovl_alloc(run->be, embed_bytes, &rows)
                                 : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: host memory");
    for (int f32 = 0; f32 < 2 && st == TOVL_OK; f32++) {
        for (int which = 0; which < 2 && st == TOVL_OK; which++) {
            const tovl_token_overlay_set *s = which ? fixed : set;
            uint8_t *out = which ? got : want;
            st = tovl_download(run->be, out, in[2], embed_bytes); /* the gathered rows, as the hook finds them */
            if (st == TOVL_OK) st = tovl_upload(run->be, rows, out, embed_bytes);
            tovl_embed_hook_args e = {rows, in[0], in[1], -1, T, o->h};
            if (st == TOVL_OK) st = tovl_embed_hook(s, &run->k, &e, NULL);
            if (st == TOVL_OK) st = tovl_synchronize(run->be, NULL);
            if (st == TOVL_OK) st = tovl_download(run->be, out, rows, embed_bytes);
            if (st == TOVL_OK) st = hook_logits(run, s, T, o->vocab, f32, in[3], in[1], out + embed_bytes);
        }
        const size_t bytes = embed_bytes + (size_t)T * o->vocab * (f32 ? 4 : 2);
        if (st == TOVL_OK && memcmp(got, want, bytes) != 0) {
            size_t i = 0;
            while (got[i] == want[i]) {
                i++;
            }
            st = tovl_error(TOVL_ERR_INTERNAL,
                            "bench: T = %u: the fixed-shape set of capacity %u differs from the from_slots set at "
                            "%s byte %zu (%s logits)",
                            T, tovl_token_overlay_set_max_n_override(fixed), i < embed_bytes ? "embed" : "logits",
                            i < embed_bytes ? i : i - embed_bytes, f32 ? "f32" : "bf16");
        }
    }
    if (st == TOVL_OK) {
        run->cap_checked++;
    }
    tovl_free(run->be, rows);
    free(got);
    free(want);
    return st;
}

/* --capacity: the fixed-shape set's hooks over the batch, after the check. */
static tovl_status bench_fixed_at(bench_run *run, const tovl_token_overlay_set *set,
                                  const tovl_token_overlay_set *fixed, uint32_t T, uint32_t hits, uint32_t live,
                                  const tovl_devptr in[4], tovl_devptr logits) {
    const bench_options *o = run->opt;
    tovl_status st = check_fixed(run, set, fixed, T, in);
    const uint32_t cap = tovl_token_overlay_set_max_n_override(fixed);
    const tovl_overlay_tables tab = tovl_token_overlay_set_tables(fixed);
    char label[48];
    snprintf(label, sizeof label, "T=%u %ux%u cap %u", T, o->slots, o->rows_per_slot, cap);
    if (st == TOVL_OK) {
        tovl_embed_overlay_args e = {in[2], in[0], in[1], tab.embed_slot_map_table, tab.embed_rows_table,
                                     tab.embed_n_table, T, o->h, o->vocab, o->slots, -1, 0};
        st = time_one(run, TOVL_KERNEL_EMBED_OVERLAY, run->k.embed_overlay, label, (uint32_t[3]){T, 1, 1}, &e,
                      sizeof e, 4.0 * hits * (double)o->h, 0.0, T, -1);
        run->rows[run->n_rows - 1].capacity = cap;
    }
    /* The bytes and products are the rows a slot holds, as for the from_slots set. */
    const double n = o->rows_per_slot, lm_cells = (double)live * n,
                 lm_in = 2.0 * (T + (double)o->slots * n) * (double)o->h;
    for (int f32 = 0; f32 < 2 && st == TOVL_OK; f32++) {
        tovl_lmhead_overlay_args l = {logits, in[3], in[1], tab.lmhead_rows_table, tab.lmhead_ids_table,
                                      tab.n_override_table, o->vocab, T, o->h, o->vocab, o->slots, -1, cap};
        st = time_one(run, f32 ? TOVL_KERNEL_LMHEAD_OVERLAY_F32 : TOVL_KERNEL_LMHEAD_OVERLAY_BF16,
                      f32 ? run->k.lmhead_overlay_f32 : run->k.lmhead_overlay_bf16, label,
                      (uint32_t[3]){T, tovl_token_overlay_set_lmhead_grid_y(fixed), 1},
                      &l, sizeof l, lm_in + lm_cells * (f32 ? 4 : 2), lm_cells * (double)o->h, T, -1);
        if (st == TOVL_OK) {
            run->rows[run->n_rows - 1].capacity = cap;
        }
    }
    return st;
}

static double wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* --capacity: one load, slot 0 alternating between two overlays on the
 * backend's own stream: the median host time of a call, and back-to-back
 * loads' wall time until the stream is idle, per load. */
static tovl_status time_loads(bench_run *run, tovl_token_overlay_set *fixed, tovl_embed_overlay *const *overlays,
                              bench_load *out) {
    enum { LOADS = 200 };
    double host[LOADS];
    tovl_status st = tovl_synchronize(run->be, NULL);
    const double start = wall_us();
    for (uint32_t i = 0; i < LOADS && st == TOVL_OK; i++) {
        const double t0 = wall_us();
        st = tovl_token_overlay_set_load(fixed, 0, overlays[i % 2 ? 0 : 1], NULL);
        host[i] = wall_us() - t0;
    }
    if (st == TOVL_OK) st = tovl_synchronize(run->be, NULL);
    const double total = wall_us() - start;
    if (st == TOVL_OK) st = tovl_token_overlay_set_load(fixed, 0, overlays[0], NULL); /* as it was */
    if (st == TOVL_OK) st = tovl_token_overlay_set_collect(fixed, NULL);
    if (st == TOVL_OK) {
        *out = (bench_load){tovl_token_overlay_set_max_n_override(fixed), tovl_median(host, LOADS), total / LOADS,
                            LOADS};
    }
    return st;
}

/* Both hooks' kernels over one batch of T rows. */
static tovl_status bench_hooks_at(bench_run *run, tovl_token_overlay_set *set, tovl_token_overlay_set *const *shards,
                                  tovl_token_overlay_set *const *fixed_shards, tovl_token_overlay_set *const *fixed,
                                  const uint32_t *embed_ids, uint32_t T) {
    const bench_options *o = run->opt;
    const size_t h = o->h, ld = o->vocab;
    uint32_t *ids = malloc(T * sizeof *ids);
    int32_t *slots = malloc(T * sizeof *slots);
    tovl_devptr d_ids = 0, d_slots = 0, hidden = 0, final_hidden = 0, logits = 0;
    tovl_status st = ids && slots ? TOVL_OK : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: host memory");
    uint32_t hits = 0, live = 0;
    for (uint32_t t = 0; t < T && st == TOVL_OK; t++) {
        uint32_t s = random_below(&run->rng, o->slots);
        slots[t] = random_below(&run->rng, 16) == 0 ? -1 : (int32_t)s;
        bool hit = slots[t] >= 0 && random_below(&run->rng, 2) == 0;
        ids[t] = hit ? embed_ids[s * o->rows_per_slot + random_below(&run->rng, o->rows_per_slot)]
                     : random_below(&run->rng, o->vocab);
        hits += hit;
        live += slots[t] >= 0;
    }
    if (st == TOVL_OK) st = upload_new(run->be, ids, T * sizeof *ids, &d_ids);
    if (st == TOVL_OK) st = upload_new(run->be, slots, T * sizeof *slots, &d_slots);
    uint16_t *final_host = NULL;
    if (st == TOVL_OK) st = upload_random_bf16(run, T * h, &hidden, NULL);
    if (st == TOVL_OK) st = upload_random_bf16(run, T * h, &final_hidden, run->opt->dump ? &final_host : NULL);
    if (st == TOVL_OK) st = tovl_alloc(run->be, T * ld * 4, &logits); /* f32 and bf16 logits share it */
    if (st == TOVL_OK) st = tovl_fill_u32(run->be, logits, 0x3F80BF80u, T * ld * 4); /* never zeros */
    const tovl_overlay_tables tab = tovl_token_overlay_set_tables(set);
    char label[48];
    snprintf(label, sizeof label, "T=%u h=%u %ux%u", T, o->h, o->slots, o->rows_per_slot);
    if (st == TOVL_OK) {
        tovl_embed_overlay_args e = {hidden, d_ids, d_slots, tab.embed_slot_map_table, tab.embed_rows_table,
                                     tab.embed_n_table, T, o->h, o->vocab, o->slots, -1, 0};
        st = time_one(run, TOVL_KERNEL_EMBED_OVERLAY, run->k.embed_overlay, label, (uint32_t[3]){T, 1, 1}, &e,
                      sizeof e, 4.0 * hits * (double)h, 0.0, T, -1);
    }
    const uint32_t max_n = tovl_token_overlay_set_max_n_override(set);
    const double lm_cells = (double)live * max_n, lm_in = 2.0 * (T + (double)o->slots * max_n) * (double)h;
    for (int f32 = 0; f32 < 2 && st == TOVL_OK; f32++) {
        tovl_lmhead_overlay_args l = {logits, final_hidden, d_slots, tab.lmhead_rows_table, tab.lmhead_ids_table,
                                      tab.n_override_table, ld, T, o->h, o->vocab, o->slots, -1, max_n};
        st = time_one(run, f32 ? TOVL_KERNEL_LMHEAD_OVERLAY_F32 : TOVL_KERNEL_LMHEAD_OVERLAY_BF16,
                      f32 ? run->k.lmhead_overlay_f32 : run->k.lmhead_overlay_bf16, label, (uint32_t[3]){T, max_n, 1},
                      &l, sizeof l, lm_in + lm_cells * (f32 ? 4 : 2), lm_cells * (double)h, T, -1);
        if (st == TOVL_OK) st = dump_cells(run, logits, T, slots, set, f32);
    }
    if (st == TOVL_OK && o->tp > 1) {
        st = bench_shards_at(run, set, shards, fixed_shards, T, live, final_hidden, d_slots);
    }
    for (uint32_t c = 0; c < o->n_caps && st == TOVL_OK; c++) {
        st = bench_fixed_at(run, set, fixed[c], T, hits, live, (tovl_devptr[4]){d_ids, d_slots, hidden, final_hidden},
                            logits);
    }
    if (st == TOVL_OK && run->opt->dump) {
        char name[32];
        snprintf(name, sizeof name, "T%u.hidden", T);
        st = dump_add(run, name, "BF16", 2, (uint32_t[3]){T, o->h}, final_host, T * h * sizeof *final_host);
        final_host = NULL;
        snprintf(name, sizeof name, "T%u.row_slots", T);
        if (st == TOVL_OK) st = dump_add(run, name, "I32", 1, (uint32_t[3]){T}, copy_of(slots, T * sizeof *slots),
                                         T * sizeof *slots);
    }
    free(final_host);
    tovl_free(run->be, d_ids);
    tovl_free(run->be, d_slots);
    tovl_free(run->be, hidden);
    tovl_free(run->be, final_hidden);
    tovl_free(run->be, logits);
    free(ids);
    free(slots);
    return st;
}

/* The per-dispatch floor: the idle embed launch, then the backend's probes. */
static tovl_status bench_floor(bench_run *run, tovl_token_overlay_set *set) {
    const bench_options *o = run->opt;
    const int32_t no_slot = -1;
    const uint32_t id = 0;
    tovl_devptr d_slot = 0, d_id = 0, hidden = 0;
    tovl_status st = upload_new(run->be, &no_slot, sizeof no_slot, &d_slot);
    if (st == TOVL_OK) st = upload_new(run->be, &id, sizeof id, &d_id);
    if (st == TOVL_OK) st = upload_random_bf16(run, o->h, &hidden, NULL);
    const tovl_overlay_tables tab = tovl_token_overlay_set_tables(set);
    if (st == TOVL_OK) {
        tovl_embed_overlay_args e = {hidden, d_id, d_slot, tab.embed_slot_map_table, tab.embed_rows_table,
                                     tab.embed_n_table, 1, o->h, o->vocab, o->slots, -1, 0};
        st = time_one(run, TOVL_KERNEL_EMBED_OVERLAY, run->k.embed_overlay, "idle T=1 slot -1",
                      (uint32_t[3]){1, 1, 1}, &e, sizeof e, 0.0, 0.0, 1, -1);
    }
    const tovl_lmhead_overlay_args pushed = {0}; /* the probes push the largest argument struct */
    for (size_t i = 0; i < sizeof floor_probes / sizeof floor_probes[0] && st == TOVL_OK; i++) {
        const tovl_kernel probe = tovl_try_kernel(run->be, floor_probes[i]);
        if (probe) {
            st = time_one(run, floor_probes[i], probe, "empty shader", (uint32_t[3]){1, 1, 1}, &pushed,
                          sizeof pushed, 0.0, 0.0, 0, -1);
        }
    }
    tovl_free(run->be, d_slot);
    tovl_free(run->be, d_id);
    tovl_free(run->be, hidden);
    return st;
}

static tovl_status bench_hooks(bench_run *run) {
    const bench_options *o = run->opt;
    uint32_t *embed_ids = malloc((size_t)o->slots * o->rows_per_slot * sizeof *embed_ids);
    tovl_embed_overlay **slots = calloc(o->slots, sizeof *slots);
    tovl_token_overlay_set *set = NULL, *shards[BENCH_MAX_TP] = {NULL}, *fixed_shards[BENCH_MAX_TP] = {NULL};
    tovl_status st = embed_ids && slots ? TOVL_OK : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "bench: out of host memory");
    if (st == TOVL_OK) st = build_set(run, embed_ids, slots, &set);
    for (uint32_t r = 0; st == TOVL_OK && o->tp > 1 && r < o->tp; r++) {
        uint32_t start, end;
        st = tovl_vocab_shard_range(o->vocab, o->tp, r, 0, &start, &end);
        if (st == TOVL_OK && start < o->vocab) { /* else padding only: no cell, no set */
            st = tovl_token_overlay_set_from_slots_shard(run->be, slots, o->slots, false, start, end, &shards[r]);
        }
        /* The fixed-shape shard set holding the same pool, capacity --rows. */
        const tovl_set_shape shape = {o->slots, o->vocab, o->h, false, o->rows_per_slot, o->rows_per_slot};
        if (st == TOVL_OK && start < o->vocab) {
            st = tovl_token_overlay_set_create_shard(run->be, &shape, start, end, &fixed_shards[r]);
        }
        for (uint32_t s = 0; st == TOVL_OK && fixed_shards[r] && s < o->slots; s++) {
            st = tovl_token_overlay_set_load(fixed_shards[r], s, slots[s], NULL);
        }
    }
    tovl_token_overlay_set *fixed[BENCH_MAX_CAPS] = {NULL};
    for (uint32_t c = 0; st == TOVL_OK && c < o->n_caps; c++) {
        const tovl_set_shape shape = {o->slots, o->vocab, o->h, false, o->caps[c], o->caps[c]};
        st = tovl_token_overlay_set_create(run->be, &shape, &fixed[c]);
        for (uint32_t s = 0; st == TOVL_OK && s < o->slots; s++) {
            st = tovl_token_overlay_set_load(fixed[c], s, slots[s], NULL);
        }
    }
    if (st == TOVL_OK) st = bench_floor(run, set);
    if (st == TOVL_OK) st = dump_set(run, set);
    for (uint32_t i = 0; i < o->n_tokens && st == TOVL_OK; i++) {
        st = bench_hooks_at(run, set, shards, fixed_shards, fixed, embed_ids, o->tokens[i]);
    }
    for (uint32_t c = 0; st == TOVL_OK && c < o->n_caps && o->slots > 1; c++) {
        st = time_loads(run, fixed[c], slots, &run->loads[c]);
    }
    for (uint32_t c = 0; c < BENCH_MAX_CAPS; c++) {
        tovl_token_overlay_set_destroy(fixed[c]);
    }
    for (uint32_t r = 0; r < BENCH_MAX_TP; r++) {
        tovl_token_overlay_set_destroy(shards[r]);
        tovl_token_overlay_set_destroy(fixed_shards[r]);
    }
    tovl_token_overlay_set_destroy(set);
    for (uint32_t s = 0; slots && s < o->slots; s++) {
        tovl_embed_overlay_release(slots[s]);
    }
    free(slots);
    free(embed_ids);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */
/* ------------------------------------------------------------------------ */
static double gbps_of(const bench_row *r) {
    return r->timing.batched_us > 0 ? r->bytes / (r->timing.batched_us * 1e-6) / 1e9 : 0.0;
}

/* --tp: per batch size and lm_head kernel, the unsharded graph time beside
 * the slowest and the mean shard of each kind (the ranks run at once on their
 * own GPUs, so the slowest is what a step waits for), and the fixed-shape
 * shards' slowest over today's. */
static void shard_times(const bench_run *run, const bench_row *u, bool fixed, double *slowest, double *mean,
                        uint32_t *n) {
    double sum = 0;
    *slowest = *mean = 0;
    *n = 0;
    for (size_t j = 0; j < run->n_rows; j++) {
        const bench_row *r = &run->rows[j];
        if (r->rank >= 0 && (r->capacity > 0) == fixed && r->T == u->T && strcmp(r->kernel, u->kernel) == 0) {
            *slowest = r->timing.batched_us > *slowest ? r->timing.batched_us : *slowest;
            sum += r->timing.batched_us;
            (*n)++;
        }
    }
    *mean = *n ? sum / *n : 0;
}

static void print_tp_summary(const bench_run *run) {
    if (run->opt->tp < 2) {
        return;
    }
    printf("\n--tp %u: the shards' outputs concatenated equal the unsharded set (%u checks; from_slots and "
           "fixed-shape shard sets)\n",
           run->opt->tp, run->tp_checked);
    for (size_t i = 0; i < run->n_rows; i++) {
        const bench_row *u = &run->rows[i];
        if (u->rank >= 0 || u->capacity > 0 || strncmp(u->kernel, "lmhead", 6) != 0) {
            continue;
        }
        double slowest, mean, fslowest, fmean;
        uint32_t n, fn;
        shard_times(run, u, false, &slowest, &mean, &n);
        shard_times(run, u, true, &fslowest, &fmean, &fn);
        if (n > 0) {
            printf("%-20s T=%-6u unsharded %9.2f us; %u shards: slowest %9.2f us (%.2f of unsharded), mean %9.2f us\n",
                   u->kernel, u->T, u->timing.batched_us, n, slowest, slowest / u->timing.batched_us, mean);
        }
        if (fn > 0 && n > 0) {
            printf("%-20s T=%-6u fixed-shape shards: slowest %9.2f us (%.3fx the from_slots shards'), mean %9.2f us\n",
                   u->kernel, u->T, fslowest, fslowest / slowest, fmean);
        }
    }
}

/* --capacity: each fixed-shape set's graph time over the from_slots set's, per
 * batch size and hook, and the cost of one load. */
static void print_fixed_summary(const bench_run *run) {
    if (run->opt->n_caps == 0) {
        return;
    }
    printf("\n--capacity: fixed-shape sets holding %u x %u rows, outputs identical to the from_slots set's (%u "
           "checks)\n",
           run->opt->slots, run->opt->rows_per_slot, run->cap_checked);
    printf("%-22s %6s %12s %8s %12s %8s\n", "kernel", "T", "from_slots", "cap", "fixed us", "ratio");
    for (size_t i = 0; i < run->n_rows; i++) {
        const bench_row *f = &run->rows[i];
        if (f->capacity == 0 || f->rank >= 0) {
            continue;
        }
        for (size_t j = 0; j < run->n_rows; j++) {
            const bench_row *u = &run->rows[j];
            if (u->capacity == 0 && u->rank < 0 && u->T == f->T && strcmp(u->kernel, f->kernel) == 0 &&
                strstr(u->label, "idle") == NULL) {
                printf("%-22s %6u %12.2f %8u %12.2f %7.3fx\n", f->kernel, f->T, u->timing.batched_us, f->capacity,
                       f->timing.batched_us, f->timing.batched_us / u->timing.batched_us);
                break;
            }
        }
    }
    for (uint32_t c = 0; c < run->opt->n_caps; c++) {
        const bench_load *l = &run->loads[c];
        if (l->loads) {
            printf("load into a slot (cap %u): host %.2f us a call (median of %u), stream %.2f us a load back to "
                   "back (an upper bound of its device part)\n",
                   l->capacity, l->host_us, l->loads, l->stream_us);
        }
    }
}

static void print_table(const bench_run *run) {
    printf("\n%-20s %-24s %12s %10s %10s %8s %10s\n", "kernel", "case", "graph us", "single us", "GB/s", "of copy",
           "GMAC/s");
    for (size_t i = 0; i < run->n_rows; i++) {
        const bench_row *r = &run->rows[i];
        char fraction[16] = "n/a", macs[16] = "";
        if (run->copy_gbps > 0) {
            snprintf(fraction, sizeof fraction, "%.1f%%", 100.0 * gbps_of(r) / run->copy_gbps);
        }
        if (r->macs > 0) {
            snprintf(macs, sizeof macs, "%.1f", r->macs / (r->timing.batched_us * 1e-6) / 1e9);
        }
        printf("%-20s %-24s %12.2f %10.2f %10.1f %8s %10s\n", r->kernel, r->label, r->timing.batched_us,
               r->timing.single_us, gbps_of(r), fraction, macs);
    }
    print_tp_summary(run);
    print_fixed_summary(run);
    if (run->copy_gbps > 0) {
        printf("\ndevice copy bandwidth: %.1f GB/s (read + written)\n", run->copy_gbps);
    } else {
        printf("\ndevice copy bandwidth: not measured (--hooks-only, or the backend has no copy_bandwidth)\n");
    }
}

static int write_json(const bench_run *run, const char *path) {
    const bench_options *o = run->opt;
    cJSON *root = cJSON_CreateObject();
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, o->seed);
    cJSON_AddStringToObject(root, "backend", tovl_backend_name(run->be));
    cJSON_AddStringToObject(root, "device", tovl_backend_device(run->be));
    cJSON_AddStringToObject(root, "seed", seed);
    if (run->pdl) {
        cJSON_AddStringToObject(root, "programmatic_dependent_launch", run->pdl);
    }
    cJSON_AddNumberToObject(root, "batch", o->batch);
    cJSON_AddNumberToObject(root, "repeats", o->repeats);
    cJSON_AddNumberToObject(root, "copy_gbps", run->copy_gbps);
    if (o->tp > 1) {
        cJSON_AddNumberToObject(root, "tp", o->tp);
        cJSON_AddNumberToObject(root, "tp_checks_identical", run->tp_checked);
    }
    if (o->n_caps > 0) {
        cJSON_AddNumberToObject(root, "fixed_checks_identical", run->cap_checked);
        cJSON *loads = cJSON_AddArrayToObject(root, "loads");
        for (uint32_t c = 0; c < o->n_caps; c++) {
            cJSON *l = cJSON_CreateObject();
            cJSON_AddNumberToObject(l, "capacity", run->loads[c].capacity);
            cJSON_AddNumberToObject(l, "host_us", run->loads[c].host_us);
            cJSON_AddNumberToObject(l, "stream_us", run->loads[c].stream_us);
            cJSON_AddItemToArray(loads, l);
        }
    }
    cJSON *results = cJSON_AddArrayToObject(root, "results");
    for (size_t i = 0; i < run->n_rows; i++) {
        const bench_row *r = &run->rows[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "kernel", r->kernel);
        cJSON_AddStringToObject(x, "case", r->label);
        cJSON_AddNumberToObject(x, "graph_us", r->timing.batched_us);
        cJSON_AddNumberToObject(x, "single_us", r->timing.single_us);
        cJSON_AddNumberToObject(x, "bytes", r->bytes);
        cJSON_AddNumberToObject(x, "gbps", gbps_of(r));
        cJSON_AddNumberToObject(x, "copy_fraction", run->copy_gbps > 0 ? gbps_of(r) / run->copy_gbps : 0.0);
        cJSON_AddNumberToObject(x, "macs", r->macs);
        if ((o->tp > 1 || o->n_caps > 0) && r->T > 0) {
            cJSON_AddNumberToObject(x, "T", r->T);
            cJSON_AddNumberToObject(x, "rank", r->rank);         /* -1: the unsharded set */
            cJSON_AddNumberToObject(x, "capacity", r->capacity); /* 0: the from_slots set */
        }
        cJSON_AddItemToArray(results, x);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    bool ok = f && fprintf(f, "%s\n", text) > 0;
    ok = f && fclose(f) == 0 && ok;
    free(text);
    if (!ok) {
        fprintf(stderr, "tovl bench: cannot write --json file '%s'\n", path);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
static bool parse_u32(const char *text, uint32_t *out) {
    char *end;
    unsigned long long v = strtoull(text, &end, 0);
    if (*text == '\0' || *end || v == 0 || v > UINT32_MAX) {
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

/* A comma-separated list of whole numbers in 1 .. limit, at most max_count
 * of them (--tokens, --capacity); false, with the message printed, else. */
static bool parse_list(const char *option, const char *what, const char *plural, const char *text, uint32_t limit,
                       uint32_t max_count, uint32_t *out, uint32_t *n) {
    *n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        const unsigned long long v = strtoull(p, &end, 10);
        if (end == p || *p == '-' || *p == '+' || v == 0 || v > limit || (*end && *end != ',')) {
            fprintf(stderr, "tovl bench: %s '%s': '%.*s' is not a %s in 1 .. %u\n", option, text,
                    (int)strcspn(p, ","), p, what, limit);
            return false;
        }
        if (*n == max_count) {
            fprintf(stderr, "tovl bench: %s '%s': more than %u %s\n", option, text, max_count, plural);
            return false;
        }
        out[(*n)++] = (uint32_t)v;
        if (!*end) {
            return true;
        }
        p = end + 1;
    }
}

static int parse_options(int argc, char **argv, bench_options *o) {
    *o = (bench_options){.backend = "auto", .seed = tovl_conform_fresh_seed(), .batch = 100, .repeats = 20,
                         .rowdiff_rows = 152064, .h = 4096, .vocab = 152064, .slots = 8, .rows_per_slot = 64,
                         .tokens = {512, 64}, .n_tokens = 2, .tp = 1};
    bool quick = false, tokens_given = false; /* --quick keeps the sizes --tokens gives */
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"quick", no_argument, NULL, 'q'},
                                         {"hooks-only", no_argument, NULL, 'H'},
                                         {"tokens", required_argument, NULL, 't'},
                                         {"backend", required_argument, NULL, 'k'},
                                         {"json", required_argument, NULL, 'j'},
                                         {"dump", required_argument, NULL, 'd'},
                                         {"seed", required_argument, NULL, 's'},
                                         {"batch", required_argument, NULL, 'b'},
                                         {"repeats", required_argument, NULL, 'r'},
                                         {"tp", required_argument, NULL, 'p'},
                                         {"cuda-image", required_argument, NULL, 'i'},
                                         {"capacity", required_argument, NULL, 'c'},
                                         {"rows", required_argument, NULL, 'w'},
                                         {NULL, 0, NULL, 0}};
    tovl_cli_getopt_start();
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        const char *value = optarg;
        if (c == 'h') {
            usage(stdout);
            return 0;
        } else if (c == 'H') {
            o->hooks_only = true;
        } else if (c == 'q') {
            quick = true; /* its batch sizes unless --tokens gives them */
            o->batch = 4;
            o->repeats = 3;
            o->rowdiff_rows = 2048;
        } else if (c == 't') {
            if (!parse_list("--tokens", "batch size", "sizes", value, BENCH_MAX_T, BENCH_MAX_SIZES, o->tokens, &o->n_tokens)) {
                return 2;
            }
            tokens_given = true;
        } else if (c == 'c') {
            if (!parse_list("--capacity", "capacity", "capacities", value, 65535, BENCH_MAX_CAPS, o->caps, &o->n_caps)) {
                return 2;
            }
        } else if (c == 'w') {
            if (!parse_u32(value, &o->rows_per_slot) || o->rows_per_slot > 4096) {
                fprintf(stderr, "tovl bench: --rows '%s' is not a row count in 1 .. 4096\n", value);
                return 2;
            }
        } else if (c == 'k') {
            o->backend = value;
        } else if (c == 'j') {
            o->json = value;
        } else if (c == 'd') {
            o->dump = value;
        } else if (c == 'i') {
            o->cuda_image = value;
        } else if (c == 's') {
            char *end;
            o->seed = strtoull(value, &end, 0);
            if (*end || !*value) {
                fprintf(stderr, "tovl bench: --seed '%s' is not a number\n", value);
                return 2;
            }
        } else if (c == 'p') {
            if (!parse_u32(value, &o->tp) || o->tp < 2 || o->tp > BENCH_MAX_TP) {
                fprintf(stderr, "tovl bench: --tp '%s' is not a rank count in 2 .. %d\n", value, BENCH_MAX_TP);
                return 2;
            }
        } else if (c == 'b' || c == 'r') {
            if (!parse_u32(value, c == 'b' ? &o->batch : &o->repeats)) {
                fprintf(stderr, "tovl bench: %s '%s' is not a count >= 1\n", c == 'b' ? "--batch" : "--repeats",
                        value);
                return 2;
            }
        } else {
            return tovl_cli_bad_option("tovl bench", c, argv, opts, usage);
        }
    }
    if (tovl_cli_no_operands("tovl bench", argc, argv, usage)) {
        return 2;
    }
    for (uint32_t i = 0; i < o->n_caps; i++) {
        if (o->caps[i] < o->rows_per_slot) {
            fprintf(stderr, "tovl bench: --capacity %u is below the %u rows a slot holds (--rows)\n", o->caps[i],
                    o->rows_per_slot);
            return 2;
        }
    }
    if (quick && !tokens_given) {
        o->tokens[0] = 64;
        o->tokens[1] = 8;
        o->n_tokens = 2;
    }
    return -1; /* go on */
}

int tovl_cmd_bench(int argc, char **argv) {
    bench_options o;
    int rc = parse_options(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    bench_run run = {.opt = &o, .rng = o.seed};
    if (o.cuda_image) {
        if (strcmp(o.backend, "auto") != 0 && strcmp(o.backend, "cuda") != 0) {
            fprintf(stderr, "tovl bench: --cuda-image runs on the cuda backend, not '%s'\n", o.backend);
            return 2;
        }
        if (tovl_cli_open_cuda_image("tovl bench", o.cuda_image, &run.be) != 0) {
            return 2;
        }
    } else if (tovl_backend_open(o.backend, &run.be) != TOVL_OK) {
        fprintf(stderr, "tovl bench: cannot open backend '%s': %s\n", o.backend, tovl_last_error());
        return 2;
    }
    run.iface = tovl_backend_get_iface(run.be);
    run.ctx = tovl_backend_get_context(run.be);
    if (!run.iface->time_kernel) {
        fprintf(stderr,
                "tovl bench: backend '%s' has no timer (time_kernel): benchmarks need cpu, cuda, hip or "
                "vulkan\n",
                tovl_backend_name(run.be));
        tovl_backend_close(run.be);
        return 2;
    }
    run.k = tovl_overlay_kernels_resolve(run.be);
    printf("tovl bench: %s on %s, seed %" PRIu64 ", %u launches per recording, medians of %u\n",
           tovl_backend_name(run.be), tovl_backend_device(run.be), o.seed, o.batch, o.repeats);
    run.pdl = tovl_backend_property(run.be, "programmatic_dependent_launch");
    if (run.pdl) {
        printf("programmatic dependent launch: %s\n", run.pdl);
    }
    fflush(stdout);
    tovl_status st = o.hooks_only ? TOVL_OK : bench_rowdiff(&run);
    if (st == TOVL_OK) st = bench_hooks(&run);
    if (run.n_rows) {
        print_table(&run);
    }
    rc = 0;
    if (st != TOVL_OK) {
        fprintf(stderr, "tovl bench: %s: %s\n", tovl_status_str(st), tovl_last_error());
        rc = 1;
    }
    if (o.json && write_json(&run, o.json) != 0) {
        rc = 2;
    }
    if (o.dump && st == TOVL_OK && write_dump(&run, o.dump) != 0) {
        rc = 2;
    }
    for (size_t i = 0; i < run.n_dump; i++) {
        free(run.dump[i].data);
    }
    tovl_backend_close(run.be);
    return rc;
}
