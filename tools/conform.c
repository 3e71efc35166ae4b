/*
 * The conformance suite. Every case builds the same random overlays on the
 * backend under test (dut) and on the CPU reference (ref), runs a kernel or a
 * hook on both, downloads the whole output buffer including the guard bytes
 * around it, and compares bit for bit. Guards are poisoned before the run and
 * must come back untouched; a case that patches nothing on the reference, when
 * it should, fails too (so nothing passes vacuously).
 */
#include "conform.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nettle/sha2.h>

#include "tovl/backend.h"

#define GUARD_BYTES 256u
#define POISON 0xA5C3A5C3u

/* ------------------------------------------------------------------------ */
/* Random data                                                               */
/* ------------------------------------------------------------------------ */
typedef struct rng {
    uint64_t state;
} rng;

static uint64_t rng_next(rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t rng_below(rng *r, uint32_t n) {
    return n ? (uint32_t)(rng_next(r) % n) : 0;
}

/* A bf16 value of varied magnitude and sign (never all zeros): exponents
 * spread over 2^-12 .. 2^12 so that summation order changes the rounding. */
static uint16_t rng_bf16(rng *r) {
    float mant = 1.0f + (float)rng_below(r, 1u << 20) / (float)(1u << 20);
    int e = (int)rng_below(r, 25) - 12;
    float v = ldexpf(mant, e);
    if (rng_next(r) & 1) {
        v = -v;
    }
    return tovl_f32_to_bf16(v);
}

void tovl_sha256_hex(const void *data, size_t size, char out[TOVL_SHA256_HEX]) {
    struct sha256_ctx ctx;
    uint8_t digest[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    sha256_update(&ctx, size, data);
    sha256_digest(&ctx, sizeof digest, digest);
    for (size_t i = 0; i < sizeof digest; i++) {
        snprintf(out + 2 * i, 3, "%02x", digest[i]);
    }
}

uint64_t tovl_conform_fresh_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rng r = {(uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32)};
    return rng_next(&r);
}

/* ------------------------------------------------------------------------ */
/* Case parameters                                                           */
/* ------------------------------------------------------------------------ */
typedef enum slot_kind {
    SLOT_EMPTY,
    SLOT_EMBED_ONLY,     /* embed rows, no lm_head part (tied: lm_head falls back to them) */
    SLOT_LMHEAD_ONLY,    /* no embed rows, own lm_head rows */
    SLOT_BOTH,           /* embed rows and own lm_head rows */
    SLOT_LMHEAD_NONE,    /* embed rows, lm_head present with 0 rows: lm_head left alone */
    SLOT_KIND_COUNT
} slot_kind;

/* Dots built so that fusing a product into its sum changes the result. */
typedef enum probe_kind {
    PROBE_NONE,
    PROBE_ZEROS,  /* even rows: a subnormal tie among zeros (fma_probe_rows) */
    PROBE_TINY_W, /* every row: a tie from tiny overlay elements, the hidden side in range (tie_probe_rows) */
    PROBE_TINY_X, /* the same with the tiny elements on the hidden side */
    PROBE_BAND,   /* every product at the edge of exactness in f32 (band_probe_rows) */
    PROBE_BAND_HALVES, /* the band's factors in half the rows of each side (band_halves_rows) */
} probe_kind;

typedef struct case_def {
    const char *name;
    uint32_t T, h, vocab, extra_ld, max_loras;
    uint32_t rows_per_slot; /* upper bound of rows per part */
    bool tied;
    bool specials;          /* NaN / Inf / -0 / subnormal values in rows and hidden */
    bool active_slot;       /* no slot array: every row uses one slot */
    bool misaligned;        /* hidden and logits start 2 / 4 bytes past an aligned address */
    bool subnormal_dots;    /* dot products whose results are f32 subnormals */
    bool hostile_slots;     /* most rows carry slots < 0 or >= max_loras */
    probe_kind fma_probe;   /* dots whose result a fused multiply-add would change (probe_kind) */
} case_def;

static const case_def hook_cases[] = {
    {"mixed_untied", 48, 256, 1000, 0, 4, 24, false, false, false, false, false, false, PROBE_NONE},
    {"mixed_tied", 48, 256, 1000, 0, 4, 24, true, false, false, false, false, false, PROBE_NONE},
    {"odd_sizes_h100", 37, 100, 3001, 0, 5, 17, true, false, false, false, false, false, PROBE_NONE},
    {"odd_sizes_h257", 29, 257, 997, 3, 3, 13, false, false, false, false, false, false, PROBE_NONE},
    {"h1000_ld_gt_vocab", 21, 1000, 509, 77, 3, 9, false, false, false, false, false, false, PROBE_NONE},
    {"h4096", 9, 4096, 777, 0, 2, 33, true, false, false, false, false, false, PROBE_NONE},
    {"h4104", 5, 4104, 300, 0, 2, 9, false, false, false, false, false, false, PROBE_NONE},
    {"h5003", 4, 5003, 300, 0, 2, 9, false, false, false, false, false, false, PROBE_NONE},
    {"h1", 16, 1, 64, 1, 2, 8, false, false, false, false, false, false, PROBE_NONE},
    {"specials_nan_inf_negzero", 40, 300, 800, 5, 4, 20, true, true, false, false, false, false, PROBE_NONE},
    {"active_slot", 33, 128, 400, 0, 3, 40, false, false, true, false, false, false, PROBE_NONE},
    {"misaligned_buffers", 19, 130, 301, 1, 3, 11, true, false, false, true, false, false, PROBE_NONE},
    {"max_loras_1", 25, 64, 256, 0, 1, 30, true, false, false, false, false, false, PROBE_NONE},
    {"many_slots_64", 70, 72, 2048, 0, 64, 6, false, false, false, false, false, false, PROBE_NONE},
    {"many_slots_300", 96, 64, 4096, 0, 300, 3, false, false, false, false, false, false, PROBE_NONE},
    {"many_rows_one_slot", 6, 96, 5000, 0, 1, 1500, false, false, false, false, false, false, PROBE_NONE},
    {"long_batch_600", 600, 24, 2000, 0, 4, 9, true, false, false, false, false, false, PROBE_NONE},
    {"subnormal_results", 12, 64, 200, 0, 2, 10, false, false, false, false, true, false, PROBE_NONE},
    {"slots_out_of_range", 64, 40, 300, 0, 3, 12, true, false, false, false, false, true, PROBE_NONE},
    {"fma_subnormal_tie", 16, 257, 100, 0, 2, 8, false, false, false, false, true, false, PROBE_ZEROS},
    {"fma_tie_tiny_rows", 24, 512, 300, 0, 2, 12, false, false, false, false, true, false, PROBE_TINY_W},
    {"fma_tie_tiny_hidden", 24, 512, 300, 0, 2, 12, false, false, false, false, true, false, PROBE_TINY_X},
    {"fma_band_edge", 24, 512, 300, 0, 2, 12, false, false, false, false, true, false, PROBE_BAND},
    {"fma_band_halves", 24, 512, 300, 0, 1, 16, false, false, true, false, true, false, PROBE_BAND_HALVES},
};
#define HOOK_CASE_COUNT (sizeof hook_cases / sizeof hook_cases[0])

typedef struct rowdiff_case {
    const char *name;
    uint32_t rows, h;
    float tol;
} rowdiff_case;

static const rowdiff_case rowdiff_cases[] = {
    {"bitwise", 301, 256, 0.0f},
    {"bitwise_h100", 97, 100, 0.0f},
    {"bitwise_h4099", 33, 4099, 0.0f},
    {"tolerance_0.1", 257, 264, 0.1f},
    {"tolerance_1e-3_h7", 64, 7, 1e-3f},
};
#define ROWDIFF_CASE_COUNT (sizeof rowdiff_cases / sizeof rowdiff_cases[0])

static const char *const hook_kernels[] = {TOVL_KERNEL_EMBED_OVERLAY, TOVL_KERNEL_LMHEAD_OVERLAY_BF16,
                                           TOVL_KERNEL_LMHEAD_OVERLAY_F32};

size_t tovl_conform_case_count(void) {
    return HOOK_CASE_COUNT * 3 + ROWDIFF_CASE_COUNT;
}

const char *tovl_conform_case_kernel(size_t i) {
    if (i < HOOK_CASE_COUNT * 3) {
        return hook_kernels[i % 3];
    }
    return i - HOOK_CASE_COUNT * 3 < ROWDIFF_CASE_COUNT ? TOVL_KERNEL_ROWDIFF : NULL;
}

const char *tovl_conform_case_name(size_t i) {
    if (i < HOOK_CASE_COUNT * 3) {
        return hook_cases[i / 3].name;
    }
    i -= HOOK_CASE_COUNT * 3;
    return i < ROWDIFF_CASE_COUNT ? rowdiff_cases[i].name : NULL;
}

/* ------------------------------------------------------------------------ */
/* Report                                                                    */
/* ------------------------------------------------------------------------ */
static tovl_conform_result *report_add(tovl_conform_report *rep, const char *backend, const char *kernel,
                                       const char *case_name) {
    if (rep->count == rep->capacity) {
        size_t cap = rep->capacity ? rep->capacity * 2 : 64;
        tovl_conform_result *grown = realloc(rep->results, cap * sizeof *grown);
        if (!grown) {
            return NULL;
        }
        rep->results = grown;
        rep->capacity = cap;
    }
    tovl_conform_result *r = &rep->results[rep->count++];
    memset(r, 0, sizeof *r);
    snprintf(r->backend, sizeof r->backend, "%s", backend);
    snprintf(r->kernel, sizeof r->kernel, "%s", kernel);
    snprintf(r->case_name, sizeof r->case_name, "%s", case_name);
    return r;
}

static void result_fail(tovl_conform_result *r, const char *fmt, ...) {
    if (!r->passed && r->detail[0]) {
        return; /* keep the first failure */
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
    r->passed = false;
}

void tovl_conform_report_free(tovl_conform_report *report) {
    free(report->results);
    memset(report, 0, sizeof *report);
}

/* ------------------------------------------------------------------------ */
/* Guarded device buffers                                                    */
/* ------------------------------------------------------------------------ */
typedef struct guarded {
    tovl_devptr base;   /* the allocation */
    tovl_devptr data;   /* base + GUARD_BYTES + offset */
    size_t payload;     /* bytes of data */
    size_t offset;      /* misalignment */
    size_t total;       /* allocation size */
} guarded;

static tovl_status guarded_make(tovl_backend *be, const void *init, size_t payload, size_t offset, guarded *g) {
    memset(g, 0, sizeof *g);
    g->payload = payload;
    g->offset = offset;
    g->total = GUARD_BYTES + ((offset + payload + 3u) & ~(size_t)3u) + GUARD_BYTES;
    tovl_status st = tovl_alloc(be, g->total, &g->base);
    if (st != TOVL_OK) {
        return st;
    }
    g->data = g->base + GUARD_BYTES + offset;
    st = tovl_fill_u32(be, g->base, POISON, g->total);
    if (st == TOVL_OK && init && payload) {
        st = tovl_upload(be, g->data, init, payload);
    }
    return st;
}

/* Download the whole allocation; the caller frees *out. */
static tovl_status guarded_read(tovl_backend *be, const guarded *g, uint8_t **out) {
    *out = malloc(g->total);
    if (!*out) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "conform: out of host memory");
    }
    return tovl_download(be, *out, g->base, g->total);
}

/* The first guard byte that is not the poison pattern, or -1. */
static long guard_damage(const guarded *g, const uint8_t *bytes) {
    const uint8_t *pat = (const uint8_t *)&(uint32_t){POISON};
    size_t lo = GUARD_BYTES + g->offset, hi = GUARD_BYTES + g->offset + g->payload;
    for (size_t i = 0; i < g->total; i++) {
        if (i >= lo && i < hi) {
            continue;
        }
        if (bytes[i] != pat[i % 4]) {
            return (long)i;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Hook cases                                                                */
/* ------------------------------------------------------------------------ */
typedef struct slot_data {
    slot_kind kind;
    uint32_t n_embed, n_lm;
    uint32_t *embed_ids, *lm_ids;
    uint16_t *embed_rows, *lm_rows;
} slot_data;

typedef struct hook_inputs {
    const case_def *c;
    uint32_t ld;
    slot_data *slots;      /* [max_loras] */
    uint32_t *token_ids;   /* [T] */
    int32_t *token_slots;  /* [T] */
    int32_t active;        /* active slot for the active_slot case */
    uint16_t *hidden;      /* [T, h] */
    uint16_t *logits_bf16; /* [T, ld] */
    float *logits_f32;     /* [T, ld] */
} hook_inputs;

static void distinct_ids(rng *r, uint32_t vocab, uint32_t n, uint32_t *ids) {
    /* Partial Fisher-Yates over a virtual permutation, kept simple: rejection. */
    for (uint32_t j = 0; j < n; j++) {
        for (;;) {
            uint32_t id = rng_below(r, vocab);
            bool dup = false;
            for (uint32_t k = 0; k < j && !dup; k++) {
                dup = ids[k] == id;
            }
            if (!dup) {
                ids[j] = id;
                break;
            }
        }
    }
}

static uint16_t special_bf16(rng *r) {
    static const uint16_t specials[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x8012, 0x7F7F};
    return specials[rng_below(r, sizeof specials / sizeof specials[0])];
}

static void fill_rows(rng *r, const case_def *c, uint16_t *rows, size_t count) {
    for (size_t i = 0; i < count; i++) {
        rows[i] = rng_bf16(r);
        if (c->specials && rng_below(r, 50) == 0) {
            rows[i] = special_bf16(r);
        }
        if (c->subnormal_dots) {
            /* tiny values: products and sums land in the f32 subnormal range */
            float v = ldexpf(1.0f + (float)rng_below(r, 128) / 128.0f, -66 - (int)rng_below(r, 4));
            rows[i] = tovl_f32_to_bf16((rng_next(r) & 1) ? v : -v);
        }
    }
}

/* Lane 0 of a probe dot holds x[0]*w[0] = 2^-149, then adds x[256]*w[256] =
 * 2^-150, a tie: unfused it rounds to 0 first (sum 2^-149), fused the sum
 * 1.5 * 2^-149 rounds to 2^-148. Odd rows stay random. */
static void fma_probe_rows(uint16_t *rows, size_t count, uint32_t h, bool hidden_side) {
    for (size_t row = 0; row < count; row += 2) {
        uint16_t *p = rows + row * h;
        for (uint32_t i = 0; i < h; i++) {
            p[i] = 0;
        }
        p[0] = tovl_f32_to_bf16(ldexpf(1.0f, hidden_side ? -74 : -75));
        p[256] = tovl_f32_to_bf16(ldexpf(1.0f, -75));
    }
}

/* Subnormal ties like fma_probe_rows', but among ordinary values and in
 * whole 256-element runs (h a multiple of 512): a port that fuses a product
 * into its sum wherever it believes the product exact (say, after a range
 * check on its inputs) must still get these right. Lane 0 of every dot is
 * x[0] w[0] = 2^-149, then x[256] w[256] = 2^-150, a tie that the spec's
 * rounded product makes 0 (sum 2^-149) and an FMA rounds up to 2^-148; every
 * other lane adds 1 * 1 and then 1 * -1, exactly 0, so the tie is the f32
 * result. The tiny factors are on the overlay side (PROBE_TINY_W: hidden
 * factors 2^-60) or the hidden side (PROBE_TINY_X: overlay factors 2^-31). */
static void tie_probe_rows(uint16_t *rows, size_t count, uint32_t h, bool hidden_side, probe_kind kind) {
    const bool tiny_here = hidden_side == (kind == PROBE_TINY_X);
    const int first = tiny_here ? (hidden_side ? -118 : -89) : (hidden_side ? -60 : -31);
    const int second = tiny_here ? first - 1 : first;
    for (size_t row = 0; row < count; row++) {
        uint16_t *p = rows + row * h;
        for (uint32_t i = 0; i < h; i++) {
            p[i] = tovl_f32_to_bf16(!hidden_side && (i / 256) % 2 ? -1.0f : 1.0f);
        }
        p[0] = tovl_f32_to_bf16(ldexpf(1.0f, first));
        p[256] = tovl_f32_to_bf16(ldexpf(1.0f, second));
    }
}

/* Row `row` of a band probe: elements +-(1 + a / 128) 2^exponent, a and the
 * signs varying by element. */
static void band_row(uint16_t *rows, size_t row, uint32_t h, int exponent) {
    for (uint32_t i = 0; i < h; i++) {
        const uint32_t mix = (uint32_t)(row * 40503u + i) * 2654435761u;
        const float v = ldexpf(1.0f + (float)((mix >> 24) & 127u) / 128.0f, exponent);
        rows[row * h + i] = tovl_f32_to_bf16((mix >> 31) ? -v : v);
    }
}

/* Every element where bf16 x bf16 products stop being exact in f32: hidden
 * elements +-(1 + a / 128) 2^-60 (biased exponent 67), overlay elements
 * +-(1 + b / 128) 2^-76 (51), so each product is (128 + a)(128 + b) 2^-150,
 * which f32 (its least subnormal 2^-149) cannot hold when a and b are odd.
 * A port that fuses products into sums after a range check (the CUDA tiles)
 * must send these to its unfused path: a check that admits exponent sums of
 * 118 gets them wrong, one that admits 119 (products multiples of 2^-149,
 * exact) would still be right. a, b and the signs vary by element. */
static void band_probe_rows(uint16_t *rows, size_t count, uint32_t h, bool hidden_side) {
    for (size_t row = 0; row < count; row++) {
        band_row(rows, row, h, hidden_side ? -60 : -76);
    }
}

/* The band's factors in half of each side's rows, 1's scale in the others:
 * hidden rows t with t % 8 >= 4 and overlay rows k with k % 8 < 4. Only a
 * product of two band factors is inexact, so only cells of a hidden row of
 * the second half and an overlay row of the first carry the band. A port
 * whose range check covers each side's rows in parts (the CUDA tiles: a group
 * of 8 hidden rows, the first and last 4 checked by different threads, and
 * overlay rows in columns of 8, the hidden rows' bounds carried from a
 * block's first column to its second) sees every part in range on its own,
 * and must join the parts before it fuses. Every row is the active slot's
 * (active_slot), so the rows of a tile are 8 consecutive t. */
static void band_halves_rows(uint16_t *rows, size_t count, uint32_t h, bool hidden_side) {
    for (size_t row = 0; row < count; row++) {
        const bool band = hidden_side ? row % 8 >= 4 : row % 8 < 4;
        band_row(rows, row, h, band ? (hidden_side ? -60 : -76) : 0);
    }
}

/* Whether the case's rows can hold its probe: the zeros and tie probes write
 * element 256, and the tie probes pair whole 256-element runs (the band fills
 * rows of any length). A case table entry that breaks this fails its case
 * instead of writing past its rows. */
static bool probe_fits(const case_def *c) {
    switch (c->fma_probe) {
    case PROBE_NONE:
        return true;
    case PROBE_ZEROS:
        return c->h > 256;
    case PROBE_BAND:
    case PROBE_BAND_HALVES:
        return true;
    default:
        return c->h >= 512 && c->h % 512 == 0;
    }
}

/* The case's probe, if any, written into rows of the hidden or the overlay side. */
static void probe_rows(uint16_t *rows, size_t count, uint32_t h, bool hidden_side, probe_kind kind) {
    if (kind == PROBE_ZEROS) {
        fma_probe_rows(rows, count, h, hidden_side);
    } else if (kind == PROBE_BAND) {
        band_probe_rows(rows, count, h, hidden_side);
    } else if (kind == PROBE_BAND_HALVES) {
        band_halves_rows(rows, count, h, hidden_side);
    } else if (kind != PROBE_NONE) {
        tie_probe_rows(rows, count, h, hidden_side, kind);
    }
}

static void hook_inputs_free(hook_inputs *in) {
    if (in->slots) {
        for (uint32_t s = 0; s < in->c->max_loras; s++) {
            free(in->slots[s].embed_ids);
            free(in->slots[s].lm_ids);
            free(in->slots[s].embed_rows);
            free(in->slots[s].lm_rows);
        }
    }
    free(in->slots);
    free(in->token_ids);
    free(in->token_slots);
    free(in->hidden);
    free(in->logits_bf16);
    free(in->logits_f32);
}

static bool hook_inputs_make(const case_def *c, uint64_t seed, hook_inputs *in) {
    rng r = {seed};
    memset(in, 0, sizeof *in);
    in->c = c;
    in->ld = c->vocab + c->extra_ld;
    in->slots = calloc(c->max_loras, sizeof *in->slots);
    in->token_ids = calloc(c->T, sizeof *in->token_ids);
    in->token_slots = calloc(c->T, sizeof *in->token_slots);
    in->hidden = calloc((size_t)c->T * c->h, sizeof *in->hidden);
    in->logits_bf16 = calloc((size_t)c->T * in->ld, sizeof *in->logits_bf16);
    in->logits_f32 = calloc((size_t)c->T * in->ld, sizeof *in->logits_f32);
    if (!in->slots || !in->token_ids || !in->token_slots || !in->hidden || !in->logits_bf16 || !in->logits_f32) {
        return false;
    }
    for (uint32_t s = 0; s < c->max_loras; s++) {
        slot_data *sd = &in->slots[s];
        /* Every kind appears when there are enough slots; slot 0 always patches. */
        sd->kind = s == 0 ? SLOT_BOTH : (slot_kind)((s + rng_below(&r, 2)) % SLOT_KIND_COUNT);
        if (c->max_loras == 1) {
            sd->kind = c->tied ? SLOT_EMBED_ONLY : SLOT_BOTH;
        }
        if (c->hostile_slots) {
            sd->kind = SLOT_BOTH;
        }
        bool has_embed = sd->kind == SLOT_EMBED_ONLY || sd->kind == SLOT_BOTH || sd->kind == SLOT_LMHEAD_NONE;
        bool has_lm = sd->kind == SLOT_LMHEAD_ONLY || sd->kind == SLOT_BOTH;
        sd->n_embed = has_embed ? 1 + rng_below(&r, c->rows_per_slot) : 0;
        sd->n_lm = has_lm ? 1 + rng_below(&r, c->rows_per_slot) : 0;
        if (sd->n_embed > c->vocab) sd->n_embed = c->vocab;
        if (sd->n_lm > c->vocab) sd->n_lm = c->vocab;
        if (c->fma_probe == PROBE_BAND_HALVES && has_lm) {
            sd->n_lm = c->rows_per_slot; /* two whole columns of 8 overlay rows */
        }
        if (c->rows_per_slot >= 1000 && has_embed) {
            sd->n_embed = c->rows_per_slot; /* thousands of rows in one slot */
            sd->n_lm = has_lm ? c->rows_per_slot : 0;
        }
        sd->embed_ids = calloc(sd->n_embed + 1, sizeof *sd->embed_ids);
        sd->lm_ids = calloc(sd->n_lm + 1, sizeof *sd->lm_ids);
        sd->embed_rows = calloc((size_t)sd->n_embed * c->h + 1, sizeof *sd->embed_rows);
        sd->lm_rows = calloc((size_t)sd->n_lm * c->h + 1, sizeof *sd->lm_rows);
        if (!sd->embed_ids || !sd->lm_ids || !sd->embed_rows || !sd->lm_rows) {
            return false;
        }
        distinct_ids(&r, c->vocab, sd->n_embed, sd->embed_ids);
        distinct_ids(&r, c->vocab, sd->n_lm, sd->lm_ids);
        fill_rows(&r, c, sd->embed_rows, (size_t)sd->n_embed * c->h);
        fill_rows(&r, c, sd->lm_rows, (size_t)sd->n_lm * c->h);
        probe_rows(sd->embed_rows, sd->n_embed, c->h, false, c->fma_probe);
        probe_rows(sd->lm_rows, sd->n_lm, c->h, false, c->fma_probe);
    }
    in->active = c->active_slot ? 0 : -1;
    for (uint32_t t = 0; t < c->T; t++) {
        /* Slots: mostly valid, some -1 and some >= max_loras. */
        uint32_t pick = rng_below(&r, 10);
        if (c->hostile_slots) {
            pick = pick < 8 ? pick % 2 : 2; /* 80% out of range */
        }
        int32_t s = pick == 0 ? -1 - (int32_t)rng_below(&r, 3)
                  : pick == 1 ? (int32_t)(c->max_loras + ((rng_next(&r) & 1) ? 0 : rng_below(&r, 1000)))
                              : (int32_t)rng_below(&r, c->max_loras);
        if (t == 0) {
            s = 0; /* row 0 always patches (slot 0 has both parts): no case is vacuous */
        }
        in->token_slots[t] = s;
        int32_t eff = c->active_slot ? in->active : s;
        /* Ids: mostly overlaid ids of the row's slot, some random, some >= vocab. */
        uint32_t id = rng_below(&r, c->vocab);
        uint32_t how = rng_below(&r, 10);
        if (how == 0 && t > 0) {
            id = c->vocab + rng_below(&r, 1000);
        } else if (how == 1 && t > 0) {
            id = 0xFFFFFFFFu - rng_below(&r, 4); /* a negative i32 read as u32 */
        } else if (how < 8 || t == 0) {
            /* An id the row's slot overlays; for an out-of-range slot, an id a
             * neighbouring valid slot overlays, so a port that clamps or wraps
             * slots instead of skipping them would patch it. */
            uint32_t src = eff >= 0 && (uint32_t)eff < c->max_loras ? (uint32_t)eff
                         : eff < 0 ? 0 : c->max_loras - 1;
            if (in->slots[src].n_embed) {
                id = in->slots[src].embed_ids[rng_below(&r, in->slots[src].n_embed)];
            }
        }
        in->token_ids[t] = id;
    }
    fill_rows(&r, c, in->hidden, (size_t)c->T * c->h);
    probe_rows(in->hidden, c->T, c->h, true, c->fma_probe);
    for (size_t i = 0; i < (size_t)c->T * in->ld; i++) {
        in->logits_bf16[i] = rng_bf16(&r);
        in->logits_f32[i] = tovl_bf16_to_f32(rng_bf16(&r)) * 1.25f;
    }
    return true;
}

/* Build overlays and the set on one backend. */
static tovl_status build_set(tovl_backend *be, const tovl_overlay_kernels *k, const hook_inputs *in,
                             tovl_token_overlay_set **set) {
    const case_def *c = in->c;
    tovl_embed_overlay **ovs = calloc(c->max_loras, sizeof *ovs);
    if (!ovs) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "conform: out of host memory");
    }
    tovl_status st = TOVL_OK;
    for (uint32_t s = 0; s < c->max_loras && st == TOVL_OK; s++) {
        const slot_data *sd = &in->slots[s];
        if (sd->kind == SLOT_EMPTY) {
            continue;
        }
        tovl_overlay_desc d = {
            .adapter = "conform",
            .vocab = c->vocab,
            .hidden = c->h,
            .embed = {"embed", sd->embed_ids, sd->embed_rows, sd->n_embed, c->h},
            .has_lmhead = sd->kind == SLOT_LMHEAD_ONLY || sd->kind == SLOT_BOTH || sd->kind == SLOT_LMHEAD_NONE,
            .lmhead = {"lm_head", sd->lm_ids, sd->lm_rows, sd->n_lm, c->h},
            .tied = c->tied,
        };
        st = tovl_build_overlay(be, k, &d, &ovs[s]);
    }
    if (st == TOVL_OK) {
        st = tovl_token_overlay_set_from_slots(be, ovs, c->max_loras, c->tied, set);
    }
    for (uint32_t s = 0; s < c->max_loras; s++) {
        tovl_embed_overlay_release(ovs[s]);
    }
    free(ovs);
    return st;
}

typedef struct hook_run {
    guarded out;
    uint8_t *bytes; /* the downloaded allocation */
} hook_run;

/* Run one hook kernel of a case on `be`; fills run->bytes. */
static tovl_status run_hook(tovl_backend *be, const hook_inputs *in, const char *kernel, hook_run *run) {
    const case_def *c = in->c;
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_token_overlay_set *set = NULL;
    guarded ids = {0}, slots = {0}, hidden = {0};
    memset(run, 0, sizeof *run);
    tovl_status st = build_set(be, &k, in, &set);
    size_t off_bf16 = c->misaligned ? 2 : 0, off_f32 = c->misaligned ? 4 : 0;
    if (st == TOVL_OK) st = guarded_make(be, in->token_ids, (size_t)c->T * 4, 0, &ids);
    if (st == TOVL_OK) st = guarded_make(be, in->token_slots, (size_t)c->T * 4, 0, &slots);
    bool embed = strcmp(kernel, TOVL_KERNEL_EMBED_OVERLAY) == 0;
    bool f32 = strcmp(kernel, TOVL_KERNEL_LMHEAD_OVERLAY_F32) == 0;
    if (st == TOVL_OK && embed) {
        st = guarded_make(be, in->hidden, (size_t)c->T * c->h * 2, off_bf16, &run->out);
        tovl_embed_hook_args a = {run->out.data, ids.data, c->active_slot ? 0 : slots.data, in->active, c->T, c->h};
        if (st == TOVL_OK) st = tovl_embed_hook(set, &k, &a, NULL);
    } else if (st == TOVL_OK) {
        st = guarded_make(be, in->hidden, (size_t)c->T * c->h * 2, off_bf16, &hidden);
        size_t cells = (size_t)c->T * in->ld;
        if (st == TOVL_OK) {
            st = f32 ? guarded_make(be, in->logits_f32, cells * 4, off_f32, &run->out)
                     : guarded_make(be, in->logits_bf16, cells * 2, off_bf16, &run->out);
        }
        tovl_lmhead_hook_args a = {run->out.data, f32 ? TOVL_LOGITS_F32 : TOVL_LOGITS_BF16, in->ld, hidden.data,
                                   c->active_slot ? 0 : slots.data, in->active, c->T, c->h};
        if (st == TOVL_OK) st = tovl_lmhead_hook(set, &k, &a, NULL);
    }
    if (st == TOVL_OK) st = tovl_synchronize(be, NULL);
    if (st == TOVL_OK) st = guarded_read(be, &run->out, &run->bytes);
    tovl_free(be, ids.base);
    tovl_free(be, slots.base);
    tovl_free(be, hidden.base);
    tovl_free(be, run->out.base);
    tovl_token_overlay_set_destroy(set);
    return st;
}

/* The first element of the payload where `got` differs from `want`, written
 * as "row R col C: expected X, got Y" into msg; false when none does. */
static bool first_difference(const hook_run *want, const hook_run *got, size_t elem, uint32_t row_elems, char *msg,
                             size_t msg_size) {
    size_t base = GUARD_BYTES + want->out.offset;
    size_t n = want->out.payload / elem;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *a = want->bytes + base + i * elem, *b = got->bytes + base + i * elem;
        if (memcmp(a, b, elem) != 0) {
            uint32_t va = 0, vb = 0;
            memcpy(&va, a, elem);
            memcpy(&vb, b, elem);
            snprintf(msg, msg_size, "row %zu col %zu: expected 0x%0*x, got 0x%0*x", i / row_elems, i % row_elems,
                     (int)elem * 2, va, (int)elem * 2, vb);
            return true;
        }
    }
    return false;
}

static bool payload_unchanged(const hook_run *run, const void *init) {
    return memcmp(run->bytes + GUARD_BYTES + run->out.offset, init, run->out.payload) == 0;
}

static void payload_sha256(const guarded *g, const uint8_t *bytes, char out[TOVL_SHA256_HEX]) {
    tovl_sha256_hex(bytes + GUARD_BYTES + g->offset, g->payload, out);
}

/* The golden file's digest of (kernel, case), or NULL. */
static const tovl_conform_digest *golden_find(const tovl_conform_golden *g, const char *kernel,
                                              const char *case_name) {
    for (size_t i = 0; g && i < g->count; i++) {
        if (!strcmp(g->digests[i].kernel, kernel) && !strcmp(g->digests[i].case_name, case_name)) {
            return &g->digests[i];
        }
    }
    return NULL;
}

/* A digest that differs from the golden file's: named, and, where a
 * reference ran the case here (want), its first cell that differs. */
static void fail_golden(tovl_conform_result *r, const char *golden_sha, const char *want_sha, const char *cell) {
    char where[200] = "";
    if (cell && strcmp(want_sha, golden_sha) == 0) {
        snprintf(where, sizeof where, "; first differing cell against this machine's CPU reference: %s", cell);
    } else if (cell) {
        snprintf(where, sizeof where, "; this machine's CPU reference differs from the golden file too");
    }
    result_fail(r, "%s: sha256 %.16s... differs from the golden file's %.16s...%s", r->buffer, r->sha256, golden_sha,
                where);
}

static void conform_hook_case(const tovl_conform_options *opt, const case_def *c, const char *kernel,
                              uint64_t seed, tovl_conform_result *r) {
    tovl_backend *ref = opt->ref, *dut = opt->dut;
    const bool embed = strcmp(kernel, TOVL_KERNEL_EMBED_OVERLAY) == 0;
    const bool f32 = strcmp(kernel, TOVL_KERNEL_LMHEAD_OVERLAY_F32) == 0;
    const size_t elem = embed ? 2 : f32 ? 4 : 2;
    const tovl_conform_digest *gold = golden_find(opt->golden, kernel, c->name);
    hook_inputs in;
    r->passed = true;
    snprintf(r->buffer, sizeof r->buffer, "%s", embed ? "hidden" : "logits");
    if (!probe_fits(c)) {
        result_fail(r, "case table: h = %u cannot hold this case's fused-multiply-add probe", c->h);
        return;
    }
    if (opt->golden && !gold) {
        result_fail(r, "the golden file has no digest of this case");
        return;
    }
    if (!hook_inputs_make(c, seed, &in)) {
        result_fail(r, "out of host memory");
        hook_inputs_free(&in);
        return;
    }
    if (!tovl_try_kernel(dut, kernel)) {
        result_fail(r, "kernel '%s' missing on this backend", kernel);
        hook_inputs_free(&in);
        return;
    }
    const char *denorm = tovl_backend_property(dut, "f32_denormals");
    if (c->subnormal_dots && denorm && strcmp(denorm, "preserved") != 0) {
        r->skipped = true;
        snprintf(r->detail, sizeof r->detail, "device f32 denormals: %s (spec allows a difference)", denorm);
        hook_inputs_free(&in);
        return;
    }
    const void *init = embed ? (const void *)in.hidden : f32 ? (const void *)in.logits_f32 : (const void *)in.logits_bf16;
    const uint32_t row_elems = embed ? c->h : in.ld;
    hook_run got, want;
    tovl_status sg = run_hook(dut, &in, kernel, &got), sw = TOVL_OK;
    /* The reference runs for the comparison, or to place a golden mismatch. */
    bool with_ref = false;
    if (sg != TOVL_OK) {
        result_fail(r, "%s: %s", tovl_status_str(sg), tovl_last_error());
    } else {
        payload_sha256(&got.out, got.bytes, r->sha256);
        long dmg = guard_damage(&got.out, got.bytes);
        if (dmg >= 0) {
            result_fail(r, "wrote outside its output: guard byte %ld of %zu changed", dmg, got.out.total);
        }
        with_ref = ref && (!gold || strcmp(r->sha256, gold->sha256) != 0);
        if (!ref || gold) {
            /* no reference to compare with here: the output itself must show the case ran */
            if (payload_unchanged(&got, init)) {
                result_fail(r, "%s: nothing patched: the case is vacuous", r->buffer);
            }
        }
    }
    if (with_ref) {
        sw = run_hook(ref, &in, kernel, &want);
    }
    char cell[160] = "";
    if (with_ref && sw != TOVL_OK) {
        if (gold) {
            fail_golden(r, gold->sha256, "", NULL);
        } else {
            result_fail(r, "reference failed: %s", tovl_last_error());
        }
    } else if (with_ref) {
        const bool differs = first_difference(&want, &got, elem, row_elems, cell, sizeof cell);
        if (gold) {
            char want_sha[TOVL_SHA256_HEX];
            payload_sha256(&want.out, want.bytes, want_sha);
            fail_golden(r, gold->sha256, want_sha, cell);
        } else {
            if (guard_damage(&want.out, want.bytes) >= 0) {
                result_fail(r, "reference wrote outside its output");
            }
            if (payload_unchanged(&want, init)) {
                result_fail(r, "the reference patched nothing: the case is vacuous");
            }
            if (differs) {
                result_fail(r, "%s", cell);
            }
        }
    } else if (gold && sg == TOVL_OK && strcmp(r->sha256, gold->sha256) != 0) {
        fail_golden(r, gold->sha256, "", NULL);
    }
    if (sg == TOVL_OK) {
        free(got.bytes);
    }
    if (with_ref && sw == TOVL_OK) {
        free(want.bytes);
    }
    hook_inputs_free(&in);
}

/* ------------------------------------------------------------------------ */
/* rowdiff cases: launched directly so the flags buffer can carry guards.    */
/* ------------------------------------------------------------------------ */
static void make_rowdiff_pair(const rowdiff_case *c, uint64_t seed, uint16_t *a, uint16_t *b) {
    rng r = {seed};
    size_t n = (size_t)c->rows * c->h;
    for (size_t i = 0; i < n; i++) {
        a[i] = rng_bf16(&r);
        b[i] = a[i];
    }
    for (uint32_t row = 0; row < c->rows; row++) {
        uint16_t *ra = a + (size_t)row * c->h, *rb = b + (size_t)row * c->h;
        uint32_t col = rng_below(&r, c->h);
        switch (rng_below(&r, 10)) {
        case 0: rb[col] ^= 1; break;                        /* one ulp */
        case 1: ra[col] = 0x0000; rb[col] = 0x8000; break;   /* +0 vs -0 */
        case 2: rb[col] = 0x7FC0; break;                    /* NaN on one side */
        case 3: ra[col] = 0x7FC0; rb[col] = 0xFFC1; break;   /* NaN on both, other bits */
        case 4: ra[col] = 0x7F80; rb[col] = 0x7F80; break;   /* same Inf */
        case 5: rb[col] = tovl_f32_to_bf16(tovl_bf16_to_f32(ra[col]) + 0.5f); break; /* above 0.1 */
        case 6: ra[col] = 0x3F80; rb[col] = 0x3F81; break;   /* 1.0 vs 1.0078: below 0.1, above 1e-3 */
        case 7: ra[col] = 0x7F80; rb[col] = 0x4000; break;   /* Inf vs finite */
        default: break;                                      /* equal rows */
        }
    }
}

static tovl_status run_rowdiff(tovl_backend *be, const rowdiff_case *c, const uint16_t *a, const uint16_t *b,
                               guarded *flags, uint8_t **bytes) {
    guarded ga = {0}, gb = {0};
    size_t n = (size_t)c->rows * c->h * 2;
    tovl_kernel k = tovl_try_kernel(be, TOVL_KERNEL_ROWDIFF);
    tovl_status st = guarded_make(be, a, n, 0, &ga);
    if (st == TOVL_OK) st = guarded_make(be, b, n, 0, &gb);
    if (st == TOVL_OK) st = guarded_make(be, NULL, (size_t)c->rows * 4, 0, flags);
    if (st == TOVL_OK) {
        tovl_rowdiff_args args = {.a = ga.data, .b = gb.data, .flags = flags->data, .rows = c->rows, .h = c->h,
                                  .tol = c->tol};
        const uint32_t grid[3] = {c->rows, 1, 1};
        st = tovl_backend_get_iface(be)->launch(tovl_backend_get_context(be), k, grid, &args, sizeof args, NULL);
    }
    if (st == TOVL_OK) st = tovl_synchronize(be, NULL);
    if (st == TOVL_OK) st = guarded_read(be, flags, bytes);
    tovl_free(be, ga.base);
    tovl_free(be, gb.base);
    tovl_free(be, flags->base);
    return st;
}

/* The flags a rowdiff run wrote (after the guard). */
static const uint32_t *rowdiff_flags(const uint8_t *bytes) {
    return (const uint32_t *)(bytes + GUARD_BYTES);
}

static void conform_rowdiff_case(const tovl_conform_options *opt, const rowdiff_case *c, uint64_t seed,
                                 tovl_conform_result *r) {
    tovl_backend *ref = opt->ref, *dut = opt->dut;
    const tovl_conform_digest *gold = golden_find(opt->golden, TOVL_KERNEL_ROWDIFF, c->name);
    r->passed = true;
    snprintf(r->buffer, sizeof r->buffer, "flags");
    if (opt->golden && !gold) {
        result_fail(r, "the golden file has no digest of this case");
        return;
    }
    if (!tovl_try_kernel(dut, TOVL_KERNEL_ROWDIFF)) {
        result_fail(r, "kernel 'rowdiff' missing on this backend");
        return;
    }
    size_t n = (size_t)c->rows * c->h;
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    if (!a || !b) {
        result_fail(r, "out of host memory");
        free(a);
        free(b);
        return;
    }
    make_rowdiff_pair(c, seed, a, b);
    guarded fgot, fwant;
    uint8_t *got = NULL, *want = NULL;
    tovl_status sg = run_rowdiff(dut, c, a, b, &fgot, &got), sw = TOVL_OK;
    bool with_ref = false;
    if (sg != TOVL_OK) {
        result_fail(r, "%s: %s", tovl_status_str(sg), tovl_last_error());
    } else {
        payload_sha256(&fgot, got, r->sha256);
        long dmg = guard_damage(&fgot, got);
        if (dmg >= 0) {
            result_fail(r, "wrote outside flags: guard byte %ld changed", dmg);
        }
        with_ref = ref && (!gold || strcmp(r->sha256, gold->sha256) != 0);
        sw = with_ref ? run_rowdiff(ref, c, a, b, &fwant, &want) : TOVL_OK;
    }
    if (with_ref && sw != TOVL_OK) {
        if (gold) {
            fail_golden(r, gold->sha256, "", NULL);
        } else {
            result_fail(r, "reference failed: %s", tovl_last_error());
        }
    } else if (sg == TOVL_OK) {
        /* The flags that decide whether the case is vacuous: the reference's
         * where it ran for the comparison, else the backend's own. */
        const uint32_t *rg = rowdiff_flags(got), *truth = with_ref && !gold ? rowdiff_flags(want) : rg;
        uint32_t differing = 0;
        for (uint32_t i = 0; i < c->rows; i++) {
            differing += truth[i] == 1;
        }
        char cell[96] = "";
        for (uint32_t i = 0; with_ref && i < c->rows; i++) {
            const uint32_t *rw = rowdiff_flags(want);
            if (rw[i] != rg[i]) {
                snprintf(cell, sizeof cell, "row %u: expected flag %u, got 0x%08x", i, rw[i], rg[i]);
                break;
            }
        }
        if (gold && strcmp(r->sha256, gold->sha256) != 0) {
            char want_sha[TOVL_SHA256_HEX] = "";
            if (with_ref) {
                payload_sha256(&fwant, want, want_sha);
            }
            fail_golden(r, gold->sha256, want_sha, with_ref ? cell : NULL);
        } else if (cell[0]) {
            result_fail(r, "%s", cell);
        }
        if (differing == 0 || differing == c->rows) {
            result_fail(r, "the %s flagged %u of %u rows: the case is vacuous", truth == rg ? "backend" : "reference",
                        differing, c->rows);
        }
    }
    free(got);
    free(want);
    free(a);
    free(b);
}

/* ------------------------------------------------------------------------ */
static void log_result(FILE *log, const tovl_conform_result *res) {
    if (log) {
        fprintf(log, "conform %-7s %-20s %-26s %-6s %-64s %s%s%s\n", res->backend, res->kernel, res->case_name,
                res->buffer, res->sha256[0] ? res->sha256 : "-", res->skipped ? "SKIP" : res->passed ? "ok" : "FAIL",
                res->detail[0] ? ": " : "", res->detail);
    }
}

static void count_result(tovl_conform_report *report, const tovl_conform_result *res) {
    if (res->skipped) report->skipped++;
    else if (res->passed) report->passed++;
    else report->failed++;
}

size_t tovl_conform_run(const tovl_conform_options *opt, tovl_conform_report *report) {
    size_t failed_before = report->failed;
    const char *name = opt->label ? opt->label : tovl_backend_name(opt->dut);
    rng r = {opt->golden ? opt->golden->seed : opt->seed};
    for (size_t i = 0; i < HOOK_CASE_COUNT; i++) {
        uint64_t case_seed = rng_next(&r);
        for (size_t k = 0; k < 3; k++) {
            tovl_conform_result *res = report_add(report, name, hook_kernels[k], hook_cases[i].name);
            if (!res) {
                return report->failed - failed_before + 1;
            }
            conform_hook_case(opt, &hook_cases[i], hook_kernels[k], case_seed, res);
            count_result(report, res);
            log_result(opt->log, res);
        }
    }
    for (size_t i = 0; i < ROWDIFF_CASE_COUNT; i++) {
        tovl_conform_result *res = report_add(report, name, TOVL_KERNEL_ROWDIFF, rowdiff_cases[i].name);
        if (!res) {
            return report->failed - failed_before + 1;
        }
        conform_rowdiff_case(opt, &rowdiff_cases[i], rng_next(&r), res);
        count_result(report, res);
        log_result(opt->log, res);
    }
    return report->failed - failed_before;
}

size_t tovl_conform_backend(tovl_backend *ref, tovl_backend *dut, uint64_t seed, FILE *log,
                            tovl_conform_report *report) {
    const tovl_conform_options opt = {.ref = ref, .dut = dut, .seed = seed, .log = log};
    return tovl_conform_run(&opt, report);
}
