/* The import building blocks on valid input: the safetensors writer and
 * reader round trip, dtype conversions to bf16 (nearest-even), base models
 * (single file, sharded, F32, padded vocab), the host base product against the
 * CPU lm_head kernel, and what an adapter resolves to in the cases the PEFT
 * fixtures do not reach (rows beyond the served vocab, warnings). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "tovl/tovl.h"

/* Scratch folders (tests/test_import_scratch.c). */
extern char import_root[64];
void import_scratch_setup(void);
void import_scratch_teardown(void);
const char *import_path(const char *rel);
#define P(rel) import_path(rel)

TestSuite(st, .init = import_scratch_setup, .fini = import_scratch_teardown);
TestSuite(model, .init = import_scratch_setup, .fini = import_scratch_teardown);
TestSuite(resolve, .init = import_scratch_setup, .fini = import_scratch_teardown);

static void write_text(const char *rel, const char *text) {
    FILE *f = fopen(P(rel), "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

/* ---- safetensors ------------------------------------------------------------ */

Test(st, round_trip_random_tensors) {
    tu_rng r = tu_rng_for("st.round_trip");
    const char *dtypes[] = {"BF16", "F16", "F32", "I32", "U8", "I64", "F64", "BOOL", "U16"};
    const uint32_t sizes[] = {2, 2, 4, 4, 1, 8, 8, 1, 2};
    enum { N = 9 };
    tovl_tensor t[N];
    uint64_t shapes[N][3];
    unsigned char *data[N];
    char names[N][32];
    for (int i = 0; i < N; i++) {
        uint32_t ndim = tu_below(&r, 4); /* rank 0 (a scalar) .. 3 */
        uint64_t count = 1;
        for (uint32_t d = 0; d < ndim; d++) {
            shapes[i][d] = tu_below(&r, 7); /* zero-size dims too */
            count *= shapes[i][d];
        }
        data[i] = malloc(count * sizes[i] + 1);
        cr_assert(data[i]);
        for (uint64_t b = 0; b < count * sizes[i]; b++) {
            data[i][b] = (unsigned char)tu_next(&r);
        }
        snprintf(names[i], sizeof names[i], "t%d.%s", i, dtypes[i]);
        t[i] = (tovl_tensor){.name = names[i], .dtype = dtypes[i], .ndim = ndim, .shape = shapes[i], .data = data[i]};
    }
    const char *meta[] = {"format", "pt", "note", "a \"quoted\" value"};
    cr_assert_eq(tovl_safetensors_write(P("rt.safetensors"), t, N, meta, 2), TOVL_OK, "%s", tovl_last_error());
    tovl_safetensors *f;
    cr_assert_eq(tovl_safetensors_open(P("rt.safetensors"), &f), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_safetensors_count(f), N);
    for (int i = 0; i < N; i++) {
        const tovl_tensor *g = tovl_safetensors_find(f, names[i]);
        cr_assert(g, "tensor %s not found", names[i]);
        cr_expect_str_eq(g->dtype, dtypes[i]);
        cr_expect_eq(g->elem_size, sizes[i]);
        cr_assert_eq(g->ndim, t[i].ndim);
        uint64_t count = 1;
        for (uint32_t d = 0; d < g->ndim; d++) {
            cr_expect_eq(g->shape[d], shapes[i][d]);
            count *= shapes[i][d];
        }
        cr_assert_eq(g->count, count);
        cr_expect(memcmp(g->data, data[i], count * sizes[i]) == 0, "tensor %s: data differs", names[i]);
        free(data[i]);
    }
    cr_expect_null(tovl_safetensors_find(f, "absent"));
    /* Tensors come in offset order and do not overlap. */
    for (size_t i = 1; i < tovl_safetensors_count(f); i++) {
        const tovl_tensor *a = tovl_safetensors_at(f, i - 1), *b = tovl_safetensors_at(f, i);
        cr_expect((const char *)a->data + a->count * a->elem_size <= (const char *)b->data);
    }
    cr_expect_null(tovl_safetensors_at(f, N));
    tovl_safetensors_close(f);
    /* The file is aligned: header padded to 8 bytes. */
    FILE *fp = fopen(P("rt.safetensors"), "rb");
    unsigned char len8[8];
    cr_assert_eq(fread(len8, 1, 8, fp), 8);
    fclose(fp);
    cr_expect_eq(len8[0] % 8, 0);
}

Test(st, reads_unaligned_and_padded_headers) {
    /* Odd offsets (data not aligned for its dtype) and a space-padded header. */
    const char *hdr = "{\"__metadata__\":{\"a\":\"b\"},\"x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
                      "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[3,11]}}   ";
    size_t hl = strlen(hdr);
    unsigned char buf[512];
    memset(buf, 0, sizeof buf);
    buf[0] = (unsigned char)hl;
    memcpy(buf + 8, hdr, hl);
    float w[2] = {1.5f, -2.25f};
    memcpy(buf + 8 + hl + 3, w, 8);
    tovl_safetensors *f;
    cr_assert_eq(tovl_safetensors_open_memory(buf, 8 + hl + 11, "mem", &f), TOVL_OK, "%s", tovl_last_error());
    const tovl_tensor *t = tovl_safetensors_find(f, "w");
    cr_assert(t);
    float got[2];
    memcpy(got, t->data, 8);
    cr_expect(got[0] == 1.5f && got[1] == -2.25f);
    tovl_safetensors_close(f);
}

Test(st, writer_refuses_bad_arguments) {
    uint64_t shape[1] = {2};
    uint16_t d[2] = {1, 2};
    tovl_tensor t[2] = {{.name = "a", .dtype = "BF16", .ndim = 1, .shape = shape, .data = d},
                        {.name = "a", .dtype = "BF16", .ndim = 1, .shape = shape, .data = d}};
    cr_expect_eq(tovl_safetensors_write(P("w.safetensors"), t, 2, NULL, 0), TOVL_ERR_INVALID_ARGUMENT);
    t[1].name = "b";
    t[1].dtype = "F7";
    cr_expect_eq(tovl_safetensors_write(P("w.safetensors"), t, 2, NULL, 0), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect(access(P("w.safetensors"), F_OK) != 0, "a refused write left a file");
    cr_expect_eq(tovl_safetensors_write(P("nodir/w.safetensors"), t, 1, NULL, 0), TOVL_ERR_IO);
    cr_expect(strstr(tovl_last_error(), "nodir/w.safetensors") != NULL, "%s", tovl_last_error());
}

/* ---- conversions and models ------------------------------------------------ */

/* bf16 of an f32, by the definition (independent of the library's bit trick). */
static uint16_t rne_reference(float f) {
    if (isnan(f)) {
        return 0x7FC0u;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lo = u & 0xFFFFu, hi = u >> 16;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) {
        hi++;
    }
    return (uint16_t)hi;
}

/* A model folder with matrices of `dtype` whose values are `vals` (f32). */
static void make_model(const char *dir, uint32_t vocab, uint32_t hidden, bool tied, const char *dtype,
                       const float *embed, const float *lm) {
    cr_assert_eq(mkdir(P(dir), 0755), 0);
    char rel[256], text[256];
    snprintf(rel, sizeof rel, "%s/config.json", dir);
    snprintf(text, sizeof text, "{\"vocab_size\": %u, \"hidden_size\": %u, \"tie_word_embeddings\": %s}", vocab,
             hidden, tied ? "true" : "false");
    write_text(rel, text);
    size_t n = (size_t)vocab * hidden;
    void *e = malloc(n * 4), *l = malloc(n * 4);
    cr_assert(e && l);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(dtype, "F32") == 0) {
            ((float *)e)[i] = embed[i];
            ((float *)l)[i] = lm[i];
        } else { /* BF16 */
            ((uint16_t *)e)[i] = tovl_f32_to_bf16(embed[i]);
            ((uint16_t *)l)[i] = tovl_f32_to_bf16(lm[i]);
        }
    }
    uint64_t shape[2] = {vocab, hidden};
    tovl_tensor t[2] = {{.name = "model.embed_tokens.weight", .dtype = dtype, .ndim = 2, .shape = shape, .data = e},
                        {.name = "lm_head.weight", .dtype = dtype, .ndim = 2, .shape = shape, .data = l}};
    snprintf(rel, sizeof rel, "%s/model.safetensors", dir);
    cr_assert_eq(tovl_safetensors_write(P(rel), t, tied ? 1 : 2, NULL, 0), TOVL_OK);
    free(e);
    free(l);
}

Test(model, f32_matrices_round_to_nearest_even) {
    tu_rng r = tu_rng_for("model.f32");
    enum { VV = 37, HH = 11 };
    float e[VV * HH], l[VV * HH];
    for (int i = 0; i < VV * HH; i++) {
        uint32_t u = (uint32_t)tu_next(&r);
        if (i % 5 == 0) {
            u = (u & 0xFFFF0000u) | 0x8000u; /* exact ties, both parities */
        }
        if (i % 7 == 0) {
            u = (u & 0x807F0000u) | 0x7F7FFFFFu; /* near the top: may round to Inf */
        }
        if (i % 11 == 0) {
            u = 0x7F800001u | (u & 0x003FFFFFu); /* NaN payloads */
        }
        if (i % 13 == 0) {
            u &= 0x807FFFFFu; /* subnormals */
        }
        memcpy(&e[i], &u, 4);
        l[i] = -e[i];
    }
    make_model("m", VV, HH, false, "F32", e, l);
    tovl_model *m;
    cr_assert_eq(tovl_model_open(P("m"), 0, &m), TOVL_OK, "%s", tovl_last_error());
    cr_expect_str_eq(tovl_model_get_info(m)->embed_dtype, "F32");
    for (uint32_t v = 0; v < VV; v++) {
        const uint16_t *er = tovl_model_embed_row(m, v), *lr = tovl_model_lmhead_row(m, v);
        for (uint32_t i = 0; i < HH; i++) {
            cr_assert_eq(er[i], rne_reference(e[v * HH + i]), "embed[%u][%u] of %a", v, i, (double)e[v * HH + i]);
            cr_assert_eq(lr[i], rne_reference(l[v * HH + i]), "lm_head[%u][%u]", v, i);
        }
    }
    cr_expect_null(tovl_model_embed_row(m, VV));
    tovl_model_close(m);
}

Test(model, f16_matrices_convert_exactly) {
    /* Every f16 value is exact in f32; bf16 then rounds it (nearest-even). */
    enum { VV = 64, HH = 1024 }; /* all 65536 f16 patterns */
    uint16_t *h = malloc(VV * HH * 2);
    cr_assert(h);
    for (uint32_t i = 0; i < VV * HH; i++) {
        h[i] = (uint16_t)i;
    }
    cr_assert_eq(mkdir(P("m"), 0755), 0);
    write_text("m/config.json", "{\"vocab_size\": 64, \"hidden_size\": 1024, \"tie_word_embeddings\": true}");
    uint64_t shape[2] = {VV, HH};
    tovl_tensor t = {.name = "model.embed_tokens.weight", .dtype = "F16", .ndim = 2, .shape = shape, .data = h};
    cr_assert_eq(tovl_safetensors_write(P("m/model.safetensors"), &t, 1, NULL, 0), TOVL_OK);
    tovl_model *m;
    cr_assert_eq(tovl_model_open(P("m"), 0, &m), TOVL_OK, "%s", tovl_last_error());
    cr_expect(tovl_model_get_info(m)->tied);
    for (uint32_t i = 0; i < VV * HH; i++) {
        /* The f16 value by its definition: sign, exponent, mantissa. */
        uint32_t e = (i >> 10) & 31u, man = i & 1023u;
        float mag = e == 31 ? (man ? NAN : INFINITY)
                    : e == 0 ? ldexpf((float)man, -24)
                             : ldexpf(1.0f + (float)man / 1024.0f, (int)e - 15);
        float want = (i & 0x8000u) ? -mag : mag;
        uint16_t got = tovl_model_embed_row(m, i / HH)[i % HH];
        cr_assert_eq(got, rne_reference(want), "f16 0x%04x: bf16 0x%04x, wanted 0x%04x", i, got,
                     rne_reference(want));
        cr_assert_eq(tovl_model_lmhead_row(m, i / HH)[i % HH], got, "tied lm_head row differs");
    }
    tovl_model_close(m);
    free(h);
}

Test(model, padded_vocab_adds_zero_rows) {
    enum { VV = 10, HH = 6 };
    float e[VV * HH], l[VV * HH];
    tu_rng r = tu_rng_for("model.padded");
    for (int i = 0; i < VV * HH; i++) {
        e[i] = tovl_bf16_to_f32(tu_bf16(&r));
        l[i] = tovl_bf16_to_f32(tu_bf16(&r));
    }
    make_model("m", VV, HH, false, "BF16", e, l);
    tovl_model *m;
    cr_assert_eq(tovl_model_open(P("m"), 16, &m), TOVL_OK, "%s", tovl_last_error());
    const tovl_model_info *mi = tovl_model_get_info(m);
    cr_expect_eq(mi->vocab, 16);
    cr_expect_eq(mi->config_vocab, VV);
    for (uint32_t v = 0; v < 16; v++) {
        for (uint32_t i = 0; i < HH; i++) {
            uint16_t want_e = v < VV ? tovl_f32_to_bf16(e[v * HH + i]) : 0;
            uint16_t want_l = v < VV ? tovl_f32_to_bf16(l[v * HH + i]) : 0;
            cr_assert_eq(tovl_model_embed_row(m, v)[i], want_e);
            cr_assert_eq(tovl_model_lmhead_row(m, v)[i], want_l);
        }
    }
    cr_expect_null(tovl_model_lmhead_row(m, 16));
    tovl_model_close(m);
    tovl_model *bad = (tovl_model *)(uintptr_t)1;
    cr_expect_eq(tovl_model_open(P("m"), VV - 1, &bad), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_null(bad);
}

/* The host base product is the spec's dot: it equals what the CPU lm_head
 * kernel writes for an overlay whose rows are the base rows. */
Test(model, base_product_is_the_spec_dot) {
    tu_rng r = tu_rng_for("model.product");
    enum { VV = 23, HH = 600, T = 5 }; /* h > 256: lanes take several elements */
    float *e = malloc(VV * HH * 4), *l = malloc(VV * HH * 4);
    cr_assert(e && l);
    for (int i = 0; i < VV * HH; i++) {
        e[i] = tovl_bf16_to_f32(tu_bf16(&r));
        l[i] = tovl_bf16_to_f32(tu_bf16(&r));
    }
    make_model("m", VV, HH, false, "BF16", e, l);
    tovl_model *m;
    cr_assert_eq(tovl_model_open(P("m"), 0, &m), TOVL_OK);
    uint16_t hidden[T * HH];
    tu_fill_bf16(&r, hidden, T * HH);
    float base[T * VV];
    cr_assert_eq(tovl_model_lmhead_product(m, hidden, T, base), TOVL_OK);

    tovl_backend *be;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    uint32_t ids[VV];
    uint16_t *rows = malloc(VV * HH * 2);
    cr_assert(rows);
    for (uint32_t v = 0; v < VV; v++) {
        ids[v] = v;
        memcpy(rows + v * HH, tovl_model_lmhead_row(m, v), HH * 2);
    }
    tovl_overlay_desc d = {.adapter = "all rows", .vocab = VV, .hidden = HH, .has_lmhead = true,
                           .lmhead = {.tensor = "lm", .ids = ids, .rows = rows, .count = VV, .width = HH}};
    tovl_embed_overlay *ov;
    cr_assert_eq(tovl_build_overlay(be, &k, &d, &ov), TOVL_OK, "%s", tovl_last_error());
    tovl_token_overlay_set *set;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, &ov, 1, false, &set), TOVL_OK);
    tovl_devptr dl, dh;
    cr_assert_eq(tovl_alloc(be, sizeof base, &dl), TOVL_OK);
    cr_assert_eq(tovl_fill_u32(be, dl, 0x7FA17FA1u, sizeof base), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof hidden, &dh), TOVL_OK);
    cr_assert_eq(tovl_upload(be, dh, hidden, sizeof hidden), TOVL_OK);
    tovl_lmhead_hook_args a = {.logits = dl, .logits_dtype = TOVL_LOGITS_F32, .ld = VV, .hidden = dh,
                               .active_slot = 0, .T = T, .hidden_size = HH};
    cr_assert_eq(tovl_lmhead_hook(set, &k, &a, NULL), TOVL_OK);
    float kern[T * VV];
    cr_assert_eq(tovl_download(be, kern, dl, sizeof kern), TOVL_OK);
    for (int i = 0; i < T * VV; i++) {
        uint32_t x, y;
        memcpy(&x, &base[i], 4);
        memcpy(&y, &kern[i], 4);
        cr_assert_eq(x, y, "cell %d: host %a, kernel %a", i, (double)base[i], (double)kern[i]);
        /* Against an f64 sum: bf16 x bf16 products are exact in f32, so the
         * only error is f32 accumulation, at most depth * 2^-24 * sum|a*b|
         * (depth = ceil(h/256) lane additions + 8 tree levels). The bound is
         * on sum|a*b|, not |sum|: terms of both signs cancel. */
        double ref = 0, mag = 0;
        for (int j = 0; j < HH; j++) {
            double p = (double)tovl_bf16_to_f32(hidden[(i / VV) * HH + j]) * (double)l[(i % VV) * HH + j];
            ref += p;
            mag += fabs(p);
        }
        double bound = ((HH + 255) / 256 + 8) * ldexp(1.0, -24) * mag;
        cr_assert(fabs(ref - base[i]) <= bound, "cell %d: %g vs f64 %g (bound %g)", i, (double)base[i], ref, bound);
    }
    tovl_free(be, dl);
    tovl_free(be, dh);
    tovl_token_overlay_set_destroy(set);
    tovl_embed_overlay_release(ov);
    tovl_backend_close(be);
    tovl_model_close(m);
    free(rows);
    free(e);
    free(l);
}

Test(model, sharded_equals_single_file) {
    tu_rng r = tu_rng_for("model.sharded");
    enum { VV = 19, HH = 9 };
    float e[VV * HH], l[VV * HH];
    for (int i = 0; i < VV * HH; i++) {
        e[i] = tovl_bf16_to_f32(tu_bf16(&r));
        l[i] = tovl_bf16_to_f32(tu_bf16(&r));
    }
    make_model("one", VV, HH, false, "BF16", e, l);
    cr_assert_eq(mkdir(P("sh"), 0755), 0);
    write_text("sh/config.json", "{\"vocab_size\": 19, \"hidden_size\": 9, \"tie_word_embeddings\": false}");
    tovl_model *one;
    cr_assert_eq(tovl_model_open(P("one"), 0, &one), TOVL_OK);
    uint16_t eb[VV * HH], lb[VV * HH];
    for (uint32_t v = 0; v < VV; v++) {
        memcpy(eb + v * HH, tovl_model_embed_row(one, v), HH * 2);
        memcpy(lb + v * HH, tovl_model_lmhead_row(one, v), HH * 2);
    }
    uint64_t shape[2] = {VV, HH}, s1[1] = {3};
    uint16_t other[3] = {1, 2, 3};
    tovl_tensor a[2] = {{.name = "model.norm.weight", .dtype = "BF16", .ndim = 1, .shape = s1, .data = other},
                        {.name = "lm_head.weight", .dtype = "BF16", .ndim = 2, .shape = shape, .data = lb}};
    tovl_tensor b = {.name = "model.embed_tokens.weight", .dtype = "BF16", .ndim = 2, .shape = shape, .data = eb};
    cr_assert_eq(tovl_safetensors_write(P("sh/model-00001-of-00002.safetensors"), a, 2, NULL, 0), TOVL_OK);
    cr_assert_eq(tovl_safetensors_write(P("sh/model-00002-of-00002.safetensors"), &b, 1, NULL, 0), TOVL_OK);
    write_text("sh/model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {"
               "\"lm_head.weight\": \"model-00001-of-00002.safetensors\","
               "\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
               "\"model.embed_tokens.weight\": \"model-00002-of-00002.safetensors\"}}");
    tovl_model *sh;
    cr_assert_eq(tovl_model_open(P("sh"), 0, &sh), TOVL_OK, "%s", tovl_last_error());
    cr_expect(strstr(tovl_model_get_info(sh)->embed_file, "model-00002-of-00002") != NULL);
    cr_expect(strstr(tovl_model_get_info(sh)->lmhead_file, "model-00001-of-00002") != NULL);
    for (uint32_t v = 0; v < VV; v++) {
        cr_assert(memcmp(tovl_model_embed_row(sh, v), eb + v * HH, HH * 2) == 0);
        cr_assert(memcmp(tovl_model_lmhead_row(sh, v), lb + v * HH, HH * 2) == 0);
    }
    tovl_model_close(sh);
    tovl_model_close(one);
}

Test(model, tie_inferred_when_config_is_silent) {
    enum { VV = 5, HH = 4 };
    float e[VV * HH] = {1}, l[VV * HH] = {2};
    make_model("u", VV, HH, false, "BF16", e, l);
    write_text("u/config.json", "{\"vocab_size\": 5, \"hidden_size\": 4}");
    make_model("t", VV, HH, true, "BF16", e, l);
    write_text("t/config.json", "{\"vocab_size\": 5, \"hidden_size\": 4}");
    tovl_model *u, *t;
    cr_assert_eq(tovl_model_open(P("u"), 0, &u), TOVL_OK);
    cr_assert_eq(tovl_model_open(P("t"), 0, &t), TOVL_OK);
    cr_expect(!tovl_model_get_info(u)->tied && tovl_model_get_info(u)->tied_inferred);
    cr_expect(tovl_model_get_info(t)->tied && tovl_model_get_info(t)->tied_inferred);
    tovl_model_close(u);
    tovl_model_close(t);
}

/* ---- resolution details ------------------------------------------------------ */

/* The committed resized-vocabulary adapter on its base without padding: the
 * rows and trainable ids beyond the served vocab are dropped with warnings,
 * the rest stays exactly as with padding. */
Test(resolve, rows_beyond_served_vocab_are_dropped_with_a_warning) {
    tovl_backend *be;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_model *served, *padded;
    tovl_adapter *a;
    cr_assert_eq(tovl_model_open(TOVL_EXTRA_FIXTURES "/bases/untied", 0, &served), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_model_open(TOVL_EXTRA_FIXTURES "/bases/untied", 136, &padded), TOVL_OK);
    cr_assert_eq(tovl_adapter_open(TOVL_EXTRA_FIXTURES "/tt_resized_untied/adapter", &a), TOVL_OK, "%s",
                 tovl_last_error());
    tovl_adapter_rows *rs, *rp;
    cr_assert_eq(tovl_adapter_resolve(be, &k, a, served, &rs), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_resolve(be, &k, a, padded, &rp), TOVL_OK, "%s", tovl_last_error());
    const tovl_adapter_rows_info *is = tovl_adapter_rows_get_info(rs), *ip = tovl_adapter_rows_get_info(rp);
    cr_expect_eq(ip->warning_count, 0, "padded: %zu warnings", ip->warning_count);
    cr_expect_geq(is->warning_count, 2, "unpadded: rows 131..135 and trainable ids beyond 131 dropped");
    bool saw_rows = false, saw_id = false;
    for (size_t i = 0; i < is->warning_count; i++) {
        saw_rows = saw_rows || strstr(is->warnings[i], "rows 131..135") != NULL;
        saw_id = saw_id || strstr(is->warnings[i], "trainable id 132") != NULL;
    }
    cr_expect(saw_rows && saw_id, "warnings name the rows and the id: %s", is->warnings[0]);
    /* Unpadded = padded restricted to ids < 131, embed and lm_head alike. */
    const tovl_overlay_rows *parts_s[2] = {&is->desc.embed, &is->desc.lmhead};
    const tovl_overlay_rows *parts_p[2] = {&ip->desc.embed, &ip->desc.lmhead};
    for (int p = 0; p < 2; p++) {
        uint32_t j = 0;
        for (uint32_t i = 0; i < parts_p[p]->count; i++) {
            if (parts_p[p]->ids[i] >= 131) {
                continue;
            }
            cr_assert_lt(j, parts_s[p]->count);
            cr_expect_eq(parts_s[p]->ids[j], parts_p[p]->ids[i]);
            cr_expect(memcmp(parts_s[p]->rows + (size_t)j * 24, parts_p[p]->rows + (size_t)i * 24, 48) == 0);
            j++;
        }
        cr_expect_eq(j, parts_s[p]->count);
        cr_expect_gt(parts_p[p]->count, j, "padding adds the resized rows");
    }
    tovl_adapter_rows_free(rs);
    tovl_adapter_rows_free(rp);
    tovl_adapter_close(a);
    tovl_model_close(served);
    tovl_model_close(padded);
    tovl_backend_close(be);
}

/* What the adapter folders describe before any model is known. */
Test(resolve, adapter_sources_by_format) {
    struct {
        const char *root, *dir, *format;
        size_t sources;
    } cases[] = {
        {TOVL_EXTRA_FIXTURES, "/tt_dict_both_untied/adapter", "peft trainable_token_indices", 2},
        {TOVL_EXTRA_FIXTURES, "/mts_both_tied/adapter", "peft modules_to_save", 2},
        {TOVL_EXTRA_FIXTURES, "/tt_resized_tied/adapter", "peft trainable_token_indices + peft saved embedding layers",
         4},
        {TOVL_EXTRA_FIXTURES, "/vllm_untied/adapter", "vllm new_embeddings", 2},
        {TOVL_TOKEN_FIXTURES, "/method_tied/adapter", "peft TRAINABLE_TOKENS", 2},
        {TOVL_TOKEN_FIXTURES, "/method_lm_untied/adapter", "peft TRAINABLE_TOKENS", 1},
        {TOVL_TOKEN_FIXTURES, "/method_resized_tied/adapter", "peft TRAINABLE_TOKENS + peft saved embedding layers",
         4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s%s", cases[i].root, cases[i].dir);
        tovl_adapter *a;
        cr_assert_eq(tovl_adapter_open(dir, &a), TOVL_OK, "%s: %s", dir, tovl_last_error());
        const tovl_adapter_info *info = tovl_adapter_get_info(a);
        cr_expect_str_eq(info->format, cases[i].format, "%s", dir);
        cr_expect_eq(info->source_count, cases[i].sources, "%s", dir);
        for (size_t s = 0; s < info->source_count; s++) {
            const tovl_adapter_source *src = &info->sources[s];
            cr_expect(src->rows > 0 && src->width == 24 && strstr(src->file, ".safetensors"));
            if (src->kind == TOVL_SOURCE_TRAINABLE_TOKENS) {
                cr_expect(src->ids && src->config_field, "%s: %s has no ids", dir, src->tensor);
            }
        }
        tovl_adapter_close(a);
    }
}

/* LoRA on embed_tokens or lm_head updates every row (B.A): not a token
 * overlay. The overlay holds the trainable rows only, and a warning names the
 * LoRA tensor of each module. */
Test(resolve, lora_on_embedding_modules_is_left_to_the_engine_with_a_warning) {
    enum { VV = 7, HH = 4 };
    float e[VV * HH], l[VV * HH], d[2 * HH], lora[2 * VV];
    for (int i = 0; i < VV * HH; i++) {
        e[i] = (float)(i % 5) / 8.0f;
        l[i] = (float)(i % 3) / 4.0f;
    }
    for (int i = 0; i < 2 * HH; i++) {
        d[i] = 1.0f + (float)i;
    }
    for (int i = 0; i < 2 * VV; i++) {
        lora[i] = 0.5f;
    }
    make_model("m", VV, HH, false, "BF16", e, l);
    cr_assert_eq(mkdir(P("a"), 0755), 0);
    write_text("a/adapter_config.json", "{\"peft_type\": \"LORA\", \"trainable_token_indices\": [1, 6], "
               "\"target_modules\": [\"embed_tokens\", \"lm_head\"]}");
    uint64_t sd[2] = {2, HH}, sa[2] = {2, VV}, sb[2] = {2, HH};
    tovl_tensor t[3] = {
        {.name = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta", .dtype = "F32",
         .ndim = 2, .shape = sd, .data = d},
        {.name = "base_model.model.model.embed_tokens.lora_embedding_A", .dtype = "F32", .ndim = 2, .shape = sa,
         .data = lora},
        {.name = "base_model.model.lm_head.lora_A.weight", .dtype = "F32", .ndim = 2, .shape = sb, .data = lora}};
    cr_assert_eq(tovl_safetensors_write(P("a/adapter_model.safetensors"), t, 3, NULL, 0), TOVL_OK);
    tovl_backend *be;
    cr_assert_eq(tovl_backend_open("cpu", &be), TOVL_OK);
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_model *m;
    tovl_adapter *a;
    tovl_adapter_rows *rows;
    cr_assert_eq(tovl_model_open(P("m"), 0, &m), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_adapter_open(P("a"), &a), TOVL_OK, "%s", tovl_last_error());
    cr_expect_eq(tovl_adapter_get_info(a)->other_tensors, 2);
    cr_assert_eq(tovl_adapter_resolve(be, &k, a, m, &rows), TOVL_OK, "%s", tovl_last_error());
    const tovl_adapter_rows_info *ri = tovl_adapter_rows_get_info(rows);
    cr_expect_eq(ri->desc.embed.count, 2);
    cr_expect(!ri->desc.has_lmhead, "the LoRA on lm_head gives the overlay no lm_head part");
    cr_expect_eq(ri->desc.embed.rows[0], tovl_f32_to_bf16(1.0f), "the trainable row, without the LoRA update");
    cr_assert_eq(ri->warning_count, 2);
    cr_expect(strstr(ri->warnings[0], "embed_tokens.lora_embedding_A") && strstr(ri->warnings[0], "not a token"),
              "%s", ri->warnings[0]);
    cr_expect(strstr(ri->warnings[1], "lm_head.lora_A.weight") && strstr(ri->warnings[1], "lm_head"), "%s",
              ri->warnings[1]);
    tovl_adapter_rows_free(rows);
    tovl_adapter_close(a);
    tovl_model_close(m);
    tovl_backend_close(be);
}
