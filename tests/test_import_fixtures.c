/* Real PEFT adapters through the import code, the hooks and the tovl binary.
 *
 * Every case of ../shared/fixtures/peft (PEFT's own outputs, made on an H200),
 * of tests/fixtures/peft_extra (made by tests/fixtures/make_fixtures.py with
 * real PEFT: every tied/untied format case) and of tests/fixtures/peft_tokens
 * (made by tests/fixtures/make_token_fixtures.py: PEFT's standalone Trainable
 * Tokens method, and trainable ids on added tokens served from the padded
 * tail of the vocabulary) and of tests/fixtures/peft_families (made by
 * make_family_fixtures.py: GPT-NeoX, GPT-2, OPT, Falcon, BLOOM, Mamba,
 * Granite, Cohere, Gemma 3, Qwen2-VL, LLaVA checkpoints as transformers
 * writes them) runs on the CPU backend and, when present, on
 * Vulkan, CUDA and HIP:
 *   - embed equals PEFT's bit for bit;
 *   - patched logits cells are within one bf16 unit of PEFT's logits_bf16;
 *   - every other cell is exactly tovl's own base product, and also close to
 *     PEFT's, so a wrong tied-model rule (a missing or extra patch) fails.
 * A mixed batch of several adapters in different slots, with slot -1 rows,
 * must match each adapter run alone, through the library and the binary. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cJSON.h>

#include "testutil.h"
#include "tovl/tovl.h"

#ifndef TOVL_SHARED_FIXTURES
#error "tests/import.cmake defines TOVL_SHARED_FIXTURES"
#endif

#define PATH_MAX_LEN 1024
#define MAX_CASES 128
#define GUARD 16            /* poisoned elements before and after every output */
#define POISON32 0x7FA17FA1u
#define POISON16 0x7FA1u

typedef struct fx_case {
    char label[320];
    char base[PATH_MAX_LEN];
    char adapter[PATH_MAX_LEN];
    char expected[PATH_MAX_LEN];
    uint32_t padded;
} fx_case;

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int cmp_case(const void *a, const void *b) {
    return strcmp(((const fx_case *)a)->label, ((const fx_case *)b)->label);
}

/* Where the shared fixtures are: TOVL_PEFT_FIXTURES, else ../shared beside the source. */
static const char *shared_dir(void) {
    const char *env = getenv("TOVL_PEFT_FIXTURES");
    return env && *env ? env : TOVL_SHARED_FIXTURES;
}

/* The shared fixtures: every folder with base/, adapter/ and expected.safetensors. */
static size_t shared_cases(fx_case *out) {
    DIR *d = opendir(shared_dir());
    if (!d) {
        return 0;
    }
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_CASES) {
        fx_case *c = &out[n];
        if (e->d_name[0] == '.') {
            continue;
        }
        snprintf(c->label, sizeof c->label, "shared/%s", e->d_name);
        snprintf(c->base, sizeof c->base, "%s/%s/base", shared_dir(), e->d_name);
        snprintf(c->adapter, sizeof c->adapter, "%s/%s/adapter", shared_dir(), e->d_name);
        snprintf(c->expected, sizeof c->expected, "%s/%s/expected.safetensors", shared_dir(), e->d_name);
        c->padded = 0;
        if (is_dir(c->base) && is_dir(c->adapter) && access(c->expected, R_OK) == 0) {
            n++;
        }
    }
    closedir(d);
    qsort(out, n, sizeof *out, cmp_case);
    return n;
}

/* The cases a committed fixture folder lists in its cases.tsv, appended at
 * out[n]; labels are "<prefix>/<label>". Returns the new count. */
static size_t tsv_cases(const char *root, const char *prefix, fx_case *out, size_t n) {
    char path[PATH_MAX_LEN];
    snprintf(path, sizeof path, "%s/cases.tsv", root);
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s: %s", path, strerror(errno));
    char line[1024];
    size_t first = n;
    while (fgets(line, sizeof line, f) && n < MAX_CASES) {
        char label[128], dir[256], base[256];
        unsigned padded;
        if (line[0] == '#' || sscanf(line, "%127s %255s %255s %u", label, dir, base, &padded) != 4) {
            continue;
        }
        fx_case *c = &out[n++];
        snprintf(c->label, sizeof c->label, "%s/%s", prefix, label);
        snprintf(c->base, sizeof c->base, "%s/%s", root, base);
        snprintf(c->adapter, sizeof c->adapter, "%s/%s/adapter", root, dir);
        snprintf(c->expected, sizeof c->expected, "%s/%s/expected.safetensors", root, dir);
        c->padded = padded;
    }
    fclose(f);
    cr_assert_geq(n - first, 10, "%s lists only %zu cases", path, n - first);
    return n;
}

/* The committed fixtures: tests/fixtures/peft_extra, peft_tokens and
 * peft_families (the other families' checkpoints and module paths). */
static size_t extra_cases(fx_case *out) {
    size_t n = tsv_cases(TOVL_EXTRA_FIXTURES, "extra", out, 0);
    n = tsv_cases(TOVL_TOKEN_FIXTURES, "tokens", out, n);
    return tsv_cases(TOVL_FAMILY_FIXTURES, "families", out, n);
}

/* ---- one case's data and checks ------------------------------------------ */

typedef struct expected {
    tovl_safetensors *file;
    uint32_t T, h, vocab;
    uint32_t *ids;
    const uint16_t *embed, *hidden, *logits; /* aligned copies */
    uint16_t *copies;
} expected;

static const uint16_t *copy_bf16(expected *e, const tovl_tensor *t, size_t at) {
    memcpy(e->copies + at, t->data, (size_t)t->count * 2u);
    return e->copies + at;
}

static void expected_open(const fx_case *c, expected *e) {
    memset(e, 0, sizeof *e);
    cr_assert_eq(tovl_safetensors_open(c->expected, &e->file), TOVL_OK, "%s: %s", c->label, tovl_last_error());
    const tovl_tensor *ids = tovl_safetensors_find(e->file, "ids");
    const tovl_tensor *embed = tovl_safetensors_find(e->file, "embed");
    const tovl_tensor *hidden = tovl_safetensors_find(e->file, "hidden");
    const tovl_tensor *logits = tovl_safetensors_find(e->file, "logits_bf16");
    cr_assert(ids && embed && hidden && logits, "%s: expected.safetensors lacks a tensor", c->label);
    cr_assert(strcmp(ids->dtype, "I32") == 0 && strcmp(logits->dtype, "BF16") == 0);
    e->T = (uint32_t)ids->shape[0];
    e->h = (uint32_t)embed->shape[1];
    e->vocab = (uint32_t)logits->shape[1];
    e->ids = malloc(e->T * sizeof *e->ids);
    e->copies = malloc(((size_t)embed->count + hidden->count + logits->count) * 2u);
    cr_assert(e->ids && e->copies);
    for (uint32_t t = 0; t < e->T; t++) {
        int32_t v;
        memcpy(&v, (const char *)ids->data + 4 * t, 4);
        e->ids[t] = (uint32_t)v;
    }
    e->embed = copy_bf16(e, embed, 0);
    e->hidden = copy_bf16(e, hidden, embed->count);
    e->logits = copy_bf16(e, logits, embed->count + hidden->count);
}

static void expected_close(expected *e) {
    free(e->ids);
    free(e->copies);
    tovl_safetensors_close(e->file);
}

/* bf16 patterns on one ordered integer line; the distance is in bf16 units. */
static int32_t bf16_key(uint16_t b) {
    return (b & 0x8000u) ? -(int32_t)(b & 0x7FFFu) : (int32_t)b;
}
static uint32_t bf16_units(uint16_t a, uint16_t b) {
    int32_t d = bf16_key(a) - bf16_key(b);
    return (uint32_t)(d < 0 ? -d : d);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The lm_head ids a slot patches: its own part, or under `tied` its embed ids. */
static const tovl_overlay_rows *lm_part(const tovl_overlay_desc *d) {
    if (d->has_lmhead) {
        return &d->lmhead;
    }
    return d->tied ? &d->embed : NULL;
}

static bool has_id(const tovl_overlay_rows *p, uint32_t id) {
    for (uint32_t j = 0; p && j < p->count; j++) {
        if (p->ids[j] == id) {
            return true;
        }
    }
    return false;
}

typedef struct counts {
    size_t embed_rows_patched, logits_cells_patched, logits_cells_changed;
    uint32_t max_patched_units; /* the farthest patched cell from PEFT's, in bf16 units */
} counts;

/* embed: bit-exact against PEFT; rows whose id the overlay has count as patched. */
static void check_embed(const char *what, const expected *e, const uint16_t *got, const tovl_overlay_desc *d,
                        counts *n) {
    for (uint32_t t = 0; t < e->T; t++) {
        const uint16_t *g = got + (size_t)t * e->h, *x = e->embed + (size_t)t * e->h;
        if (memcmp(g, x, (size_t)e->h * 2u) != 0) {
            uint32_t i = 0;
            while (g[i] == x[i]) {
                i++;
            }
            cr_expect_fail("%s: embed row %u (id %u) element %u: 0x%04x, PEFT 0x%04x", what, t, e->ids[t], i, g[i], x[i]);
            return;
        }
        n->embed_rows_patched += has_id(&d->embed, e->ids[t]);
    }
}

/* logits [T, ld] of `dtype` against PEFT and the base product `base`. */
static void check_logits(const char *what, const expected *e, const void *got, uint64_t ld, tovl_logits_dtype dtype,
                         const float *base, const tovl_overlay_desc *d, counts *n) {
    const tovl_overlay_rows *lm = lm_part(d);
    uint8_t *patched = calloc(e->vocab, 1);
    cr_assert(patched);
    for (uint32_t j = 0; lm && j < lm->count; j++) {
        patched[lm->ids[j]] = 1;
    }
    size_t bad = 0;
    for (uint32_t t = 0; t < e->T && bad == 0; t++) {
        for (uint32_t v = 0; v < e->vocab && bad == 0; v++) {
            size_t at = (size_t)t * ld + v;
            float b = base[(size_t)t * e->vocab + v];
            uint16_t peft = e->logits[(size_t)t * e->vocab + v];
            uint16_t mine16;
            bool same_as_base;
            if (dtype == TOVL_LOGITS_BF16) {
                mine16 = ((const uint16_t *)got)[at];
                same_as_base = mine16 == tovl_f32_to_bf16(b);
            } else {
                float f = ((const float *)got)[at];
                mine16 = tovl_f32_to_bf16(f);
                same_as_base = f32_bits(f) == f32_bits(b);
            }
            if (patched[v]) {
                n->logits_cells_patched++;
                n->logits_cells_changed += !same_as_base;
                if (bf16_units(mine16, peft) > n->max_patched_units) {
                    n->max_patched_units = bf16_units(mine16, peft);
                }
                if (bf16_units(mine16, peft) > 1) {
                    cr_expect_fail("%s: patched logits[%u][%u]: %g, PEFT %g (%u bf16 units apart)", what, t, v,
                            (double)tovl_bf16_to_f32(mine16), (double)tovl_bf16_to_f32(peft),
                            bf16_units(mine16, peft));
                    bad++;
                }
            } else if (!same_as_base) {
                cr_expect_fail("%s: logits[%u][%u] is not patched but %g differs from the base product %g", what, t, v,
                        (double)tovl_bf16_to_f32(mine16), (double)b);
                bad++;
            } else {
                /* Cancellation makes tiny cells differ by more than a unit
                 * between summation orders; anything real is far above 1e-4. */
                float diff = fabsf(tovl_bf16_to_f32(mine16) - tovl_bf16_to_f32(peft));
                if (bf16_units(mine16, peft) > 1 && diff > 1e-4f) {
                    cr_expect_fail("%s: logits[%u][%u] = base %g but PEFT computes %g: a patch is missing", what, t, v,
                            (double)tovl_bf16_to_f32(mine16), (double)tovl_bf16_to_f32(peft));
                    bad++;
                }
            }
        }
    }
    free(patched);
}

/* ---- through the library on a backend ------------------------------------ */

static void expect_guards(const char *what, const uint16_t *buf, size_t n_total, size_t body_lo, size_t body_hi) {
    for (size_t i = 0; i < n_total; i++) {
        if ((i < body_lo || i >= body_hi) && buf[i] != POISON16) {
            cr_expect_fail("%s: guard element %zu overwritten (0x%04x)", what, i, buf[i]);
            return;
        }
    }
}

/* The hooks of `set` over the batch of `e`: embed then logits (both dtypes). */
static void run_lib_case(tovl_backend *be, const tovl_overlay_kernels *k, const fx_case *c, const char *bname) {
    tovl_model *model;
    tovl_adapter *adapter;
    tovl_adapter_rows *rows;
    cr_assert_eq(tovl_model_open(c->base, c->padded, &model), TOVL_OK, "%s: %s", c->label, tovl_last_error());
    cr_assert_eq(tovl_adapter_open(c->adapter, &adapter), TOVL_OK, "%s: %s", c->label, tovl_last_error());
    cr_assert_eq(tovl_adapter_resolve(be, k, adapter, model, &rows), TOVL_OK, "%s: %s", c->label, tovl_last_error());
    const tovl_overlay_desc *d = &tovl_adapter_rows_get_info(rows)->desc;
    tovl_embed_overlay *ov;
    cr_assert_eq(tovl_build_overlay(be, k, d, &ov), TOVL_OK, "%s: %s", c->label, tovl_last_error());
    tovl_token_overlay_set *set;
    const tovl_model_info *mi = tovl_model_get_info(model);
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, &ov, 1, mi->tied, &set), TOVL_OK, "%s", tovl_last_error());
    tovl_embed_overlay_release(ov);

    expected e;
    expected_open(c, &e);
    cr_assert_eq(e.h, mi->hidden, "%s: hidden %u vs model %u", c->label, e.h, mi->hidden);
    cr_assert_eq(e.vocab, mi->vocab, "%s: logits width %u vs model vocab %u", c->label, e.vocab, mi->vocab);
    char what[512];
    counts n = {0};

    /* Embedding: base gather, then the hook (per-row slots, all 0). */
    size_t body = (size_t)e.T * e.h, total = body + 2 * GUARD;
    uint16_t *host = malloc(total * 2u);
    int32_t *slots = calloc(e.T, sizeof *slots);
    cr_assert(host && slots);
    tovl_devptr d_embed, d_ids, d_slots, d_hidden, d_logits;
    cr_assert_eq(tovl_alloc(be, total * 2u, &d_embed), TOVL_OK);
    cr_assert_eq(tovl_fill_u32(be, d_embed, POISON32, total * 2u), TOVL_OK);
    for (uint32_t t = 0; t < e.T; t++) {
        memcpy(host + (size_t)t * e.h, tovl_model_embed_row(model, e.ids[t]), e.h * 2u);
    }
    cr_assert_eq(tovl_upload(be, d_embed + GUARD * 2u, host, body * 2u), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, e.T * 4u, &d_ids), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_ids, e.ids, e.T * 4u), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, e.T * 4u, &d_slots), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_slots, slots, e.T * 4u), TOVL_OK);
    tovl_embed_hook_args ea = {.hidden = d_embed + GUARD * 2u, .token_ids = d_ids, .slots = d_slots,
                               .active_slot = -1, .T = e.T, .hidden_size = e.h};
    cr_assert_eq(tovl_embed_hook(set, k, &ea, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_synchronize(be, NULL), TOVL_OK);
    cr_assert_eq(tovl_download(be, host, d_embed, total * 2u), TOVL_OK);
    snprintf(what, sizeof what, "%.320s on %.32s", c->label, bname);
    expect_guards(what, host, total, GUARD, GUARD + body);
    check_embed(what, &e, host + GUARD, d, &n);

    /* Logits: base product, then the hook; ld > vocab to catch stride bugs;
     * one active slot instead of a slot array. */
    float *base = malloc((size_t)e.T * e.vocab * sizeof *base);
    cr_assert(base);
    cr_assert_eq(tovl_model_lmhead_product(model, e.hidden, e.T, base), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, e.T * e.h * 2u, &d_hidden), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_hidden, e.hidden, e.T * e.h * 2u), TOVL_OK);
    const uint64_t ld = e.vocab + 3u;
    for (int pass = 0; pass < 2; pass++) {
        tovl_logits_dtype dt = pass == 0 ? TOVL_LOGITS_BF16 : TOVL_LOGITS_F32;
        size_t elem = dt == TOVL_LOGITS_F32 ? 4u : 2u;
        size_t lbody = (size_t)e.T * ld, ltotal = lbody + 2u * GUARD * 2u / elem;
        size_t lead = GUARD * 2u / elem; /* elements of guard before the body */
        void *lhost = malloc(ltotal * elem);
        cr_assert(lhost);
        memset(lhost, 0, ltotal * elem);
        uint32_t *w32 = lhost;
        for (size_t i = 0; i < ltotal * elem / 4u; i++) {
            w32[i] = POISON32;
        }
        for (uint32_t t = 0; t < e.T; t++) {
            for (uint32_t v = 0; v < e.vocab; v++) {
                float b = base[(size_t)t * e.vocab + v];
                size_t at = lead + (size_t)t * ld + v;
                if (dt == TOVL_LOGITS_F32) {
                    ((float *)lhost)[at] = b;
                } else {
                    ((uint16_t *)lhost)[at] = tovl_f32_to_bf16(b);
                }
            }
        }
        cr_assert_eq(tovl_alloc(be, ltotal * elem, &d_logits), TOVL_OK);
        cr_assert_eq(tovl_upload(be, d_logits, lhost, ltotal * elem), TOVL_OK);
        tovl_lmhead_hook_args la = {.logits = d_logits + lead * elem, .logits_dtype = dt, .ld = ld,
                                    .hidden = d_hidden, .slots = 0, .active_slot = 0, .T = e.T, .hidden_size = e.h};
        cr_assert_eq(tovl_lmhead_hook(set, k, &la, NULL), TOVL_OK, "%s", tovl_last_error());
        cr_assert_eq(tovl_synchronize(be, NULL), TOVL_OK);
        cr_assert_eq(tovl_download(be, lhost, d_logits, ltotal * elem), TOVL_OK);
        snprintf(what, sizeof what, "%.320s on %.32s, %s logits", c->label, bname, pass == 0 ? "bf16" : "f32");
        /* Guards and the ld padding columns keep their poison. */
        for (size_t i = 0; i < ltotal * elem / 4u; i++) {
            size_t byte = i * 4u;
            bool in_body = byte >= lead * elem && byte < (lead + lbody) * elem;
            if (!in_body && w32[i] != POISON32) {
                cr_expect_fail("%s: guard word %zu overwritten", what, i);
                break;
            }
        }
        for (uint32_t t = 0; t < e.T; t++) {
            for (uint64_t v = e.vocab; v < ld; v++) {
                size_t at = lead + (size_t)t * ld + v;
                bool poisoned = dt == TOVL_LOGITS_F32 ? ((uint32_t *)lhost)[at] == POISON32
                                                      : ((uint16_t *)lhost)[at] == POISON16;
                cr_expect(poisoned, "%s: padding column %llu of row %u written", what, (unsigned long long)v, t);
            }
        }
        check_logits(what, &e, (const char *)lhost + lead * elem, ld, dt, base, d, &n);
        tovl_free(be, d_logits);
        free(lhost);
    }
    /* Not vacuous: the case exercises the overlay. */
    cr_expect_gt(n.embed_rows_patched + n.logits_cells_changed, 0, "%s: nothing was patched", what);
    /* The family fixtures' hidden size (24) keeps every f32 dot exact enough
     * that PEFT's bf16 cell and tovl's agree to the bit. */
    if (strncmp(c->label, "families/", 9) == 0) {
        cr_expect_eq(n.max_patched_units, 0, "%s: a patched cell is %u bf16 units from PEFT's", what,
                     n.max_patched_units);
    }
    if (lm_part(d) && lm_part(d)->count) {
        cr_expect_gt(n.logits_cells_changed, 0, "%s: lm_head rows exist but no logits cell changed", what);
    }
    tovl_free(be, d_embed);
    tovl_free(be, d_ids);
    tovl_free(be, d_slots);
    tovl_free(be, d_hidden);
    free(base);
    free(host);
    free(slots);
    expected_close(&e);
    tovl_token_overlay_set_destroy(set);
    tovl_adapter_rows_free(rows);
    tovl_adapter_close(adapter);
    tovl_model_close(model);
}

static tovl_backend *open_or_skip(const char *name) {
    tovl_backend *be = NULL;
    tovl_status st = tovl_backend_open(name, &be);
    if (st != TOVL_OK) {
        cr_skip_test("%s backend unavailable: %s", name, tovl_last_error());
    }
    return be;
}

static void run_all(const char *bname, bool shared) {
    fx_case cases[MAX_CASES];
    size_t n = shared ? shared_cases(cases) : extra_cases(cases);
    if (shared && n == 0) {
        cr_skip_test("no PEFT fixtures at %s (a copy of shared/ beside the repo, or TOVL_PEFT_FIXTURES)",
                     shared_dir());
    }
    tovl_backend *be = open_or_skip(bname);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    for (size_t i = 0; i < n; i++) {
        run_lib_case(be, &k, &cases[i], bname);
    }
    fprintf(stderr, "test_import_fixtures: %zu %s cases on %s\n", n, shared ? "shared" : "extra", bname);
    tovl_backend_close(be);
}

Test(fixtures_cpu, shared_peft_cases) { run_all("cpu", true); }
Test(fixtures_cpu, extra_peft_cases) { run_all("cpu", false); }
Test(fixtures_vulkan, shared_peft_cases) { run_all("vulkan", true); }
Test(fixtures_vulkan, extra_peft_cases) { run_all("vulkan", false); }
Test(fixtures_cuda, shared_peft_cases) { run_all("cuda", true); }
Test(fixtures_cuda, extra_peft_cases) { run_all("cuda", false); }
Test(fixtures_hip, shared_peft_cases) { run_all("hip", true); }
Test(fixtures_hip, extra_peft_cases) { run_all("hip", false); }

/* ---- through the tovl binary ---------------------------------------------- */

/* Scratch folders (tests/test_import_scratch.c). */
extern char import_root[64];
void import_scratch_setup(void);
void import_scratch_teardown(void);

/* Run a shell command line; returns the exit status. */
static int run_cmd(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void read_small(const char *path, char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(buf, 1, cap - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
}

/* `tovl run` on a case; the output must pass the same checks. */
static void run_cli_case(const fx_case *c, const char *bname) {
    char cmd[PATH_MAX_LEN * 6], out[PATH_MAX_LEN], err[PATH_MAX_LEN], msg[4096];
    snprintf(out, sizeof out, "%s/out.safetensors", import_root);
    snprintf(err, sizeof err, "%s/err.txt", import_root);
    snprintf(cmd, sizeof cmd, "'%s' run --backend %s --base '%s' --adapter '%s' --batch '%s' --out '%s' --vocab %u "
             ">/dev/null 2>'%s'", TOVL_CLI, bname, c->base, c->adapter, c->expected, out, c->padded, err);
    int rc = run_cmd(cmd);
    read_small(err, msg, sizeof msg);
    cr_assert_eq(rc, 0, "%s: tovl run exited %d: %s", c->label, rc, msg);

    /* The library's view of the case: patched ids and the base product. */
    tovl_backend *cpu;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(cpu);
    tovl_model *model;
    tovl_adapter *adapter;
    tovl_adapter_rows *rows;
    cr_assert_eq(tovl_model_open(c->base, c->padded, &model), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_open(c->adapter, &adapter), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_resolve(cpu, &k, adapter, model, &rows), TOVL_OK, "%s", tovl_last_error());
    expected e;
    expected_open(c, &e);
    float *base = malloc((size_t)e.T * e.vocab * sizeof *base);
    cr_assert(base);
    cr_assert_eq(tovl_model_lmhead_product(model, e.hidden, e.T, base), TOVL_OK);

    tovl_safetensors *o;
    cr_assert_eq(tovl_safetensors_open(out, &o), TOVL_OK, "%s: %s", c->label, tovl_last_error());
    const tovl_tensor *embed = tovl_safetensors_find(o, "embed"), *logits = tovl_safetensors_find(o, "logits");
    cr_assert(embed && logits, "%s: output lacks embed or logits", c->label);
    cr_assert(strcmp(logits->dtype, "BF16") == 0 && logits->shape[0] == e.T && logits->shape[1] == e.vocab);
    uint16_t *eg = malloc((size_t)embed->count * 2u), *lg = malloc((size_t)logits->count * 2u);
    cr_assert(eg && lg);
    memcpy(eg, embed->data, (size_t)embed->count * 2u);
    memcpy(lg, logits->data, (size_t)logits->count * 2u);
    char what[512];
    snprintf(what, sizeof what, "%.320s through 'tovl run --backend %.32s'", c->label, bname);
    counts n = {0};
    const tovl_overlay_desc *d = &tovl_adapter_rows_get_info(rows)->desc;
    check_embed(what, &e, eg, d, &n);
    check_logits(what, &e, lg, e.vocab, TOVL_LOGITS_BF16, base, d, &n);
    cr_expect_gt(n.embed_rows_patched + n.logits_cells_changed, 0, "%s: nothing was patched", what);
    free(eg);
    free(lg);
    free(base);
    tovl_safetensors_close(o);
    expected_close(&e);
    tovl_adapter_rows_free(rows);
    tovl_adapter_close(adapter);
    tovl_model_close(model);
    tovl_backend_close(cpu);
}

static void skip_without_cli(void) {
    if (access(TOVL_CLI, X_OK) != 0) {
        cr_skip_test("the tovl binary is not built (TOVL_BUILD_TOOLS off): %s", TOVL_CLI);
    }
}

static void cli_all(const char *bname) {
    skip_without_cli();
    fx_case cases[MAX_CASES], extra[MAX_CASES];
    size_t n = shared_cases(cases);
    size_t ne = extra_cases(extra);
    /* A few extra cases as well, so the binary is exercised where the shared
     * fixtures are absent: a tied rule, a resized adapter, vLLM; and every
     * standalone Trainable Tokens and added-token case. */
    const char *pick[] = {"extra/mts_embed_tied", "extra/tt_resized_tied", "extra/vllm_untied",
                          "extra/mts_both_untied@sharded"};
    for (size_t i = 0; i < ne; i++) {
        bool picked = strncmp(extra[i].label, "tokens/", 7) == 0;
        for (size_t p = 0; p < sizeof pick / sizeof pick[0]; p++) {
            picked = picked || strcmp(extra[i].label, pick[p]) == 0;
        }
        if (picked && n < MAX_CASES) {
            cases[n++] = extra[i];
        }
    }
    cr_assert_geq(n, 4);
    import_scratch_setup();
    for (size_t i = 0; i < n; i++) {
        run_cli_case(&cases[i], bname);
    }
    import_scratch_teardown();
}

Test(cli, run_cpu) { cli_all("cpu"); }

Test(cli, run_vulkan) {
    tovl_backend *be = open_or_skip("vulkan");
    tovl_backend_close(be);
    cli_all("vulkan");
}

Test(cli, run_cuda) {
    tovl_backend *be = open_or_skip("cuda");
    tovl_backend_close(be);
    cli_all("cuda");
}

/* inspect --json reports the ids the library resolves, and the tied rule. */
Test(cli, inspect_json) {
    skip_without_cli();
    fx_case extra[MAX_CASES];
    size_t ne = extra_cases(extra);
    import_scratch_setup();
    size_t checked = 0;
    for (size_t i = 0; i < ne; i++) {
        const fx_case *c = &extra[i];
        char cmd[PATH_MAX_LEN * 4], out[PATH_MAX_LEN], text[1 << 16];
        snprintf(out, sizeof out, "%s/inspect.json", import_root);
        snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --base '%s' --vocab %u --json >'%s' 2>&1", TOVL_CLI, c->adapter,
                 c->base, c->padded, out);
        cr_assert_eq(run_cmd(cmd), 0, "%s: tovl inspect failed", c->label);
        read_small(out, text, sizeof text);
        cJSON *root = cJSON_Parse(text);
        cr_assert(root, "%s: inspect --json is not JSON: %.200s", c->label, text);
        const cJSON *embed = cJSON_GetObjectItem(root, "embed"), *lm = cJSON_GetObjectItem(root, "lm_head");
        cr_assert(embed && lm && cJSON_GetObjectItem(root, "format"), "%s: fields missing", c->label);

        tovl_backend *cpu;
        cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
        tovl_overlay_kernels k = tovl_overlay_kernels_resolve(cpu);
        tovl_model *model;
        tovl_adapter *adapter;
        tovl_adapter_rows *rows;
        cr_assert_eq(tovl_model_open(c->base, c->padded, &model), TOVL_OK);
        cr_assert_eq(tovl_adapter_open(c->adapter, &adapter), TOVL_OK);
        cr_assert_eq(tovl_adapter_resolve(cpu, &k, adapter, model, &rows), TOVL_OK);
        const tovl_overlay_desc *d = &tovl_adapter_rows_get_info(rows)->desc;
        const cJSON *eids = cJSON_GetObjectItem(embed, "ids");
        cr_assert_eq((uint32_t)cJSON_GetArraySize(eids), d->embed.count, "%s: embed ids", c->label);
        uint32_t j = 0;
        for (const cJSON *it = eids->child; it; it = it->next, j++) {
            cr_expect_eq((uint32_t)it->valuedouble, d->embed.ids[j], "%s: embed id %u", c->label, j);
        }
        const tovl_overlay_rows *lmp = lm_part(d);
        cr_expect_eq((uint32_t)cJSON_GetArraySize(cJSON_GetObjectItem(lm, "ids")), lmp ? lmp->count : 0,
                     "%s: lm_head ids", c->label);
        cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(lm, "follows_embed")) == (!d->has_lmhead && d->tied),
                  "%s: follows_embed", c->label);
        cJSON_Delete(root);
        tovl_adapter_rows_free(rows);
        tovl_adapter_close(adapter);
        tovl_model_close(model);
        tovl_backend_close(cpu);
        checked++;
    }
    import_scratch_teardown();
    cr_expect_gt(checked, 10);
}

/* ---- mixed batches -------------------------------------------------------- */

#define MIX_T 72
#define MAX_MIX 6

typedef struct mix {
    fx_case cases[MAX_MIX];
    uint32_t n;
    tovl_model *model;
    tovl_adapter *adapters[MAX_MIX];
    tovl_embed_overlay *overlays[MAX_MIX];
    tovl_adapter_rows *rows[MAX_MIX];
    uint32_t T, h, vocab;
    uint32_t ids[MIX_T];
    int32_t slots[MIX_T];
    uint16_t *hidden;
} mix;

static void mix_open(tovl_backend *be, const tovl_overlay_kernels *k, mix *m, const char *const *labels, tu_rng *r) {
    fx_case extra[MAX_CASES], shared[MAX_CASES];
    size_t ne = extra_cases(extra), ns = shared_cases(shared);
    m->n = 0;
    for (const char *const *l = labels; *l; l++) {
        const fx_case *found = NULL;
        for (size_t i = 0; i < ne; i++) {
            found = strcmp(extra[i].label, *l) == 0 ? &extra[i] : found;
        }
        for (size_t i = 0; i < ns; i++) {
            found = strcmp(shared[i].label, *l) == 0 ? &shared[i] : found;
        }
        if (found) {
            m->cases[m->n++] = *found;
        }
    }
    if (m->n < 2) {
        cr_skip_test("mixed batch: fewer than two of its fixtures are present");
    }
    cr_assert_eq(tovl_model_open(m->cases[0].base, m->cases[0].padded, &m->model), TOVL_OK, "%s", tovl_last_error());
    const tovl_model_info *mi = tovl_model_get_info(m->model);
    for (uint32_t s = 1; s < m->n; s++) {
        /* One base model for all (the fixture folders keep identical copies),
         * served with the first case's padded vocab. */
        tovl_model *other;
        cr_assert_eq(tovl_model_open(m->cases[s].base, m->cases[0].padded, &other), TOVL_OK);
        const tovl_model_info *oi = tovl_model_get_info(other);
        bool same = oi->vocab == mi->vocab && oi->hidden == mi->hidden && oi->tied == mi->tied;
        for (uint32_t v = 0; same && v < mi->vocab; v++) {
            same = memcmp(tovl_model_embed_row(other, v), tovl_model_embed_row(m->model, v), mi->hidden * 2u) == 0 &&
                   memcmp(tovl_model_lmhead_row(other, v), tovl_model_lmhead_row(m->model, v), mi->hidden * 2u) == 0;
        }
        tovl_model_close(other);
        cr_assert(same, "mixed batch: %s and %s have different base models", m->cases[s].label, m->cases[0].label);
    }
    m->h = mi->hidden;
    m->vocab = mi->vocab;
    m->T = MIX_T;
    for (uint32_t s = 0; s < m->n; s++) {
        cr_assert_eq(tovl_adapter_open(m->cases[s].adapter, &m->adapters[s]), TOVL_OK, "%s", tovl_last_error());
        cr_assert_eq(tovl_adapter_resolve(be, k, m->adapters[s], m->model, &m->rows[s]), TOVL_OK, "%s",
                     tovl_last_error());
        cr_assert_eq(tovl_adapter_build_overlay(be, k, m->adapters[s], m->model, &m->overlays[s]), TOVL_OK, "%s",
                     tovl_last_error());
    }
    /* Ids: half the adapters' overlaid ids, half random; every slot and -1 used. */
    for (uint32_t t = 0; t < m->T; t++) {
        m->slots[t] = t < m->n ? (int32_t)t : (t == m->n ? -1 : (int32_t)tu_below(r, m->n + 1) - 1);
        const tovl_overlay_desc *d = &tovl_adapter_rows_get_info(m->rows[tu_below(r, m->n)])->desc;
        const tovl_overlay_rows *p = (tu_below(r, 2) && lm_part(d)) ? lm_part(d) : &d->embed;
        m->ids[t] = (t % 2 == 0 && p->count) ? p->ids[tu_below(r, p->count)] : tu_below(r, m->vocab);
    }
    m->hidden = malloc((size_t)m->T * m->h * 2u);
    cr_assert(m->hidden);
    tu_fill_bf16(r, m->hidden, (size_t)m->T * m->h);
}

static void mix_close(mix *m) {
    for (uint32_t s = 0; s < m->n; s++) {
        tovl_embed_overlay_release(m->overlays[s]);
        tovl_adapter_rows_free(m->rows[s]);
        tovl_adapter_close(m->adapters[s]);
    }
    tovl_model_close(m->model);
    free(m->hidden);
}

/* Embed and f32 logits of the batch with `set`; slots NULL = active_slot 0. */
static void mix_forward(tovl_backend *be, const tovl_overlay_kernels *k, const mix *m,
                        const tovl_token_overlay_set *set, const int32_t *slots, uint16_t *embed, float *logits) {
    for (uint32_t t = 0; t < m->T; t++) {
        memcpy(embed + (size_t)t * m->h, tovl_model_embed_row(m->model, m->ids[t]), m->h * 2u);
    }
    cr_assert_eq(tovl_model_lmhead_product(m->model, m->hidden, m->T, logits), TOVL_OK);
    size_t eb = (size_t)m->T * m->h * 2u, lb = (size_t)m->T * m->vocab * 4u;
    tovl_devptr de, di, ds = 0, dh, dl;
    cr_assert_eq(tovl_alloc(be, eb, &de), TOVL_OK);
    cr_assert_eq(tovl_upload(be, de, embed, eb), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, m->T * 4u, &di), TOVL_OK);
    cr_assert_eq(tovl_upload(be, di, m->ids, m->T * 4u), TOVL_OK);
    if (slots) {
        cr_assert_eq(tovl_alloc(be, m->T * 4u, &ds), TOVL_OK);
        cr_assert_eq(tovl_upload(be, ds, slots, m->T * 4u), TOVL_OK);
    }
    cr_assert_eq(tovl_alloc(be, eb, &dh), TOVL_OK);
    cr_assert_eq(tovl_upload(be, dh, m->hidden, eb), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, lb, &dl), TOVL_OK);
    cr_assert_eq(tovl_upload(be, dl, logits, lb), TOVL_OK);
    tovl_embed_hook_args ea = {.hidden = de, .token_ids = di, .slots = ds, .active_slot = 0, .T = m->T,
                               .hidden_size = m->h};
    tovl_lmhead_hook_args la = {.logits = dl, .logits_dtype = TOVL_LOGITS_F32, .ld = m->vocab, .hidden = dh,
                                .slots = ds, .active_slot = 0, .T = m->T, .hidden_size = m->h};
    cr_assert_eq(tovl_embed_hook(set, k, &ea, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_lmhead_hook(set, k, &la, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_synchronize(be, NULL), TOVL_OK);
    cr_assert_eq(tovl_download(be, embed, de, eb), TOVL_OK);
    cr_assert_eq(tovl_download(be, logits, dl, lb), TOVL_OK);
    tovl_free(be, de);
    tovl_free(be, di);
    if (ds) {
        tovl_free(be, ds);
    }
    tovl_free(be, dh);
    tovl_free(be, dl);
}

/* Row t of the mixed result equals row t of its adapter alone (or the base). */
static void mix_compare(const mix *m, const char *what, const uint16_t *me, const float *ml,
                        uint16_t *const *alone_e, float *const *alone_l, const uint16_t *base_e,
                        const float *base_l, size_t *differs_from_base) {
    for (uint32_t t = 0; t < m->T; t++) {
        int32_t s = m->slots[t];
        const uint16_t *re = s < 0 ? base_e : alone_e[s];
        const float *rl = s < 0 ? base_l : alone_l[s];
        cr_assert(memcmp(me + (size_t)t * m->h, re + (size_t)t * m->h, m->h * 2u) == 0,
                  "%s: embed row %u (slot %d, id %u) differs from that adapter alone", what, t, s, m->ids[t]);
        for (uint32_t v = 0; v < m->vocab; v++) {
            size_t at = (size_t)t * m->vocab + v;
            cr_assert_eq(f32_bits(ml[at]), f32_bits(rl[at]),
                         "%s: logits[%u][%u] (slot %d) %g, that adapter alone %g", what, t, v, s, (double)ml[at],
                         (double)rl[at]);
            *differs_from_base += f32_bits(ml[at]) != f32_bits(base_l[at]);
        }
        *differs_from_base += memcmp(me + (size_t)t * m->h, base_e + (size_t)t * m->h, m->h * 2u) != 0;
    }
}

static void mixed_batch(const char *bname, const char *const *labels) {
    tovl_backend *be = open_or_skip(bname);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tu_rng r = tu_rng_for(labels[0]);
    mix m;
    mix_open(be, &k, &m, labels, &r);
    bool tied = tovl_model_get_info(m.model)->tied;
    size_t eb = (size_t)m.T * m.h, lb = (size_t)m.T * m.vocab;
    uint16_t *me = malloc(eb * 2u), *be_base = malloc(eb * 2u), *alone_e[MAX_MIX];
    float *ml = malloc(lb * 4u), *bl = malloc(lb * 4u), *alone_l[MAX_MIX];
    cr_assert(me && be_base && ml && bl);

    tovl_token_overlay_set *all;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, m.overlays, m.n, tied, &all), TOVL_OK, "%s", tovl_last_error());
    mix_forward(be, &k, &m, all, m.slots, me, ml);
    /* The base: every row "no adapter". */
    int32_t none[MIX_T];
    for (uint32_t t = 0; t < m.T; t++) {
        none[t] = -1;
    }
    mix_forward(be, &k, &m, all, none, be_base, bl);
    for (uint32_t s = 0; s < m.n; s++) {
        tovl_token_overlay_set *one;
        cr_assert_eq(tovl_token_overlay_set_from_slots(be, &m.overlays[s], 1, tied, &one), TOVL_OK);
        alone_e[s] = malloc(eb * 2u);
        alone_l[s] = malloc(lb * 4u);
        cr_assert(alone_e[s] && alone_l[s]);
        mix_forward(be, &k, &m, one, NULL, alone_e[s], alone_l[s]);
        tovl_token_overlay_set_destroy(one);
    }
    size_t differs = 0;
    char what[512];
    snprintf(what, sizeof what, "mixed batch of %u adapters on %s", m.n, bname);
    mix_compare(&m, what, me, ml, alone_e, alone_l, be_base, bl, &differs);
    cr_expect_gt(differs, 0, "%s: no row differs from the base model", what);

    /* The same batch through the binary, all adapters in slots 0.. */
    if (strcmp(bname, "cpu") == 0 && access(TOVL_CLI, X_OK) == 0) {
        import_scratch_setup();
        char batch[PATH_MAX_LEN], out[PATH_MAX_LEN], err[PATH_MAX_LEN], cmd[PATH_MAX_LEN * 12], msg[2048];
        snprintf(batch, sizeof batch, "%s/batch.safetensors", import_root);
        snprintf(out, sizeof out, "%s/out.safetensors", import_root);
        snprintf(err, sizeof err, "%s/err.txt", import_root);
        int32_t ids32[MIX_T];
        for (uint32_t t = 0; t < m.T; t++) {
            ids32[t] = (int32_t)m.ids[t];
        }
        uint64_t sh1[1] = {m.T}, sh2[2] = {m.T, m.h};
        tovl_tensor tin[3] = {{.name = "ids", .dtype = "I32", .ndim = 1, .shape = sh1, .data = ids32},
                              {.name = "slots", .dtype = "I32", .ndim = 1, .shape = sh1, .data = m.slots},
                              {.name = "hidden", .dtype = "BF16", .ndim = 2, .shape = sh2, .data = m.hidden}};
        cr_assert_eq(tovl_safetensors_write(batch, tin, 3, NULL, 0), TOVL_OK, "%s", tovl_last_error());
        int len = snprintf(cmd, sizeof cmd, "'%s' run --logits f32 --base '%s' --vocab %u", TOVL_CLI,
                           m.cases[0].base, m.cases[0].padded);
        for (uint32_t s = 0; s < m.n; s++) {
            len += snprintf(cmd + len, sizeof cmd - (size_t)len, " --adapter '%s'", m.cases[s].adapter);
        }
        snprintf(cmd + len, sizeof cmd - (size_t)len, " --batch '%s' --out '%s' >/dev/null 2>'%s'", batch, out, err);
        int rc = run_cmd(cmd);
        read_small(err, msg, sizeof msg);
        cr_assert_eq(rc, 0, "tovl run (mixed) exited %d: %s", rc, msg);
        tovl_safetensors *o;
        cr_assert_eq(tovl_safetensors_open(out, &o), TOVL_OK, "%s", tovl_last_error());
        const tovl_tensor *oe = tovl_safetensors_find(o, "embed"), *ol = tovl_safetensors_find(o, "logits");
        cr_assert(oe && ol && strcmp(ol->dtype, "F32") == 0 && ol->count == lb && oe->count == eb);
        memcpy(me, oe->data, eb * 2u);
        memcpy(ml, ol->data, lb * 4u);
        tovl_safetensors_close(o);
        snprintf(what, sizeof what, "mixed batch of %u adapters through 'tovl run'", m.n);
        differs = 0;
        mix_compare(&m, what, me, ml, alone_e, alone_l, be_base, bl, &differs);
        cr_expect_gt(differs, 0);
        import_scratch_teardown();
    }
    for (uint32_t s = 0; s < m.n; s++) {
        free(alone_e[s]);
        free(alone_l[s]);
    }
    tovl_token_overlay_set_destroy(all);
    free(me);
    free(be_base);
    free(ml);
    free(bl);
    mix_close(&m);
    tovl_backend_close(be);
}

static const char *const tied_mix[] = {"extra/tt_dict_both_tied_diff", "extra/mts_embed_tied", "extra/tt_f16_delta_tied",
                                       "extra/mts_lm_tied", "extra/tt_dict_lm_tied", NULL};
static const char *const untied_mix[] = {"extra/tt_dict_both_untied", "extra/mts_both_untied",
                                         "extra/tt_dict_lm_untied", "extra/mts_embed_untied", NULL};
static const char *const shared_mix[] = {"shared/tt_untied_embed", "shared/mts_untied", NULL};
/* Standalone Trainable Tokens beside LoRA's; added tokens in the padded tail
 * (the first case's padded vocab serves them all). */
static const char *const method_tied_mix[] = {"tokens/method_tied", "tokens/method_lm_tied", "extra/mts_embed_tied",
                                              "extra/tt_dict_lm_tied", NULL};
static const char *const added_untied_mix[] = {"tokens/added_lora_dict_untied", "tokens/method_both_untied",
                                               "tokens/method_lm_untied", "extra/mts_both_untied", NULL};
static const char *const added_tied_mix[] = {"tokens/added_method_tied", "tokens/added_lora_list_tied",
                                             "tokens/method_lm_tied", NULL};

Test(mixed, tied_cpu) { mixed_batch("cpu", tied_mix); }
Test(mixed, untied_cpu) { mixed_batch("cpu", untied_mix); }
Test(mixed, tied_vulkan) { mixed_batch("vulkan", tied_mix); }
Test(mixed, untied_vulkan) { mixed_batch("vulkan", untied_mix); }
Test(mixed, shared_cpu) { mixed_batch("cpu", shared_mix); }
Test(mixed, method_tied_cpu) { mixed_batch("cpu", method_tied_mix); }
Test(mixed, added_untied_cpu) { mixed_batch("cpu", added_untied_mix); }
Test(mixed, added_tied_cpu) { mixed_batch("cpu", added_tied_mix); }
Test(mixed, added_untied_vulkan) { mixed_batch("vulkan", added_untied_mix); }
Test(mixed, added_tied_vulkan) { mixed_batch("vulkan", added_tied_mix); }
Test(mixed, tied_cuda) { mixed_batch("cuda", tied_mix); }
Test(mixed, added_tied_cuda) { mixed_batch("cuda", added_tied_mix); }
Test(mixed, shared_cuda) { mixed_batch("cuda", shared_mix); }

/* ---- adapters PEFT saves that tovl refuses -------------------------------- */

/* PEFT 0.21 saves a standalone adapter targeting both modules of a tied model,
 * then cannot run it (make_token_fixtures.py checks that its forward raises). */
Test(refused, method_both_tied) {
    const char *dir = TOVL_TOKEN_FIXTURES "/refused/method_both_tied/adapter";
    tovl_adapter *a = (tovl_adapter *)(uintptr_t)1;
    tu_expect_error(tovl_adapter_open(dir, &a), TOVL_ERR_UNSUPPORTED,
                  TU_NAMES("adapter_model.safetensors", "lm_head.base_layer.trainable_tokens_delta", "tied model"),
                  "method_both_tied");
    cr_expect_null(a);
    char args[PATH_MAX_LEN * 2];
    snprintf(args, sizeof args, "inspect '%s' --base '%s/bases/tied'", dir, TOVL_TOKEN_FIXTURES);
    tu_expect_cli_fails(TOVL_CLI, NULL, args, TU_NAMES("lm_head.base_layer.trainable_tokens_delta", "tied model"));
}

/* Added tokens need a served vocab that holds them: below it, the ids are
 * refused naming the tensor, the id, vocab_size and the served vocab. */
Test(refused, added_ids_beyond_the_served_vocab) {
    fx_case all[MAX_CASES];
    size_t n = extra_cases(all);
    const fx_case *c = NULL;
    for (size_t i = 0; i < n; i++) {
        c = strcmp(all[i].label, "tokens/added_lora_dict_untied") == 0 ? &all[i] : c;
    }
    cr_assert(c, "tokens/added_lora_dict_untied is not listed");
    tovl_backend *cpu;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(cpu);
    tovl_adapter *a;
    cr_assert_eq(tovl_adapter_open(c->adapter, &a), TOVL_OK, "%s", tovl_last_error());
    const uint32_t vocabs[2] = {0, 135};
    const char *served[2] = {"served vocab 131", "served vocab 135"};
    const char *id[2] = {"id 131", "id 135"};
    for (int i = 0; i < 2; i++) {
        tovl_model *m;
        cr_assert_eq(tovl_model_open(c->base, vocabs[i], &m), TOVL_OK, "%s", tovl_last_error());
        tovl_adapter_rows *rows = (tovl_adapter_rows *)(uintptr_t)1;
        tu_expect_error(tovl_adapter_resolve(cpu, &k, a, m, &rows), TOVL_ERR_ID_OUT_OF_RANGE,
                      TU_NAMES("model.embed_tokens.token_adapter.trainable_tokens_delta", id[i], served[i],
                            "vocab_size is 131"), served[i]);
        cr_expect_null(rows);
        tovl_model_close(m);
    }
    tovl_adapter_close(a);
    tovl_backend_close(cpu);
    import_scratch_setup();
    char args[PATH_MAX_LEN * 4];
    snprintf(args, sizeof args, "run --base '%s' --adapter '%s' --batch '%s' --out o.safetensors --vocab 135",
             c->base, c->adapter, c->expected);
    tu_expect_cli_fails(TOVL_CLI, import_root, args,
                        TU_NAMES("trainable_tokens_delta", "id 135", "served vocab 135", "vocab_size is 131"));
    import_scratch_teardown();
}
