/* Resolve an adapter against a base model: the overlay rows PEFT computes.
 *
 * Per module (embed_tokens, lm_head) PEFT's effective matrix is
 *   (a modules_to_save copy | a saved base layer | the served base)
 *   with trainable-token rows put in at their ids,
 * and the overlay is the rows where it differs from the served base (full
 * matrices are compared on the backend with rowdiff, tol 0) plus the
 * trainable ids. On a tied model the lm_head either follows the embedding
 * (the overlay has no lm_head part: the set uses the embed rows) or has its
 * own part; which one is decided case by case exactly as PEFT 0.21 does (see
 * docs/ADAPTERS.md, checked with real PEFT by tests/fixtures/make_fixtures.py). */
#include <stdlib.h>
#include <string.h>

#include "../internal.h"
#include "import_internal.h"

struct tovl_adapter_rows {
    tovl_adapter_rows_info info;
    uint32_t *embed_ids, *lmhead_ids;
    uint16_t *embed_rows, *lmhead_rows;
    char *embed_sources, *lmhead_sources, *lmhead_rule;
    char **warnings;
    size_t warning_count;
};

/* One overlay part being assembled: at most one row per id. */
typedef struct part {
    uint32_t vocab, hidden;
    int32_t *where; /* [vocab]: index into rows, or -1 */
    uint16_t *rows;
    uint32_t count, cap;
    imp_str sources;
    const char *first_tensor;
} part;

/* Everything one resolve call holds; freed on every path by ctx_free. */
typedef struct ctx {
    tovl_backend *be;
    const tovl_overlay_kernels *k;
    const tovl_model *model;
    const tovl_model_info *mi;
    imp_adapter_view v;
    part embed, lm;
    tovl_devptr served;     /* the served base rows on the device, per module */
    tovl_devptr served_lm;
    char **warnings;
    size_t warning_count;
} ctx;

static tovl_status part_init(part *p, uint32_t vocab, uint32_t hidden) {
    memset(p, 0, sizeof *p);
    p->vocab = vocab;
    p->hidden = hidden;
    p->where = malloc((size_t)vocab * sizeof *p->where);
    if (!p->where) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory (vocab %u)", vocab);
    }
    for (uint32_t i = 0; i < vocab; i++) {
        p->where[i] = -1;
    }
    return TOVL_OK;
}

static void part_free(part *p) {
    free(p->where);
    free(p->rows);
    imp_str_free(&p->sources);
    memset(p, 0, sizeof *p);
}

/* Put `row` at `id` (replacing an earlier row for the same id). */
static tovl_status part_set(part *p, uint32_t id, const uint16_t *row) {
    int32_t at = p->where[id];
    if (at < 0) {
        if (p->count == p->cap) {
            uint32_t cap = p->cap ? p->cap * 2 : 16;
            uint16_t *grown = realloc(p->rows, (size_t)cap * p->hidden * sizeof *grown);
            if (!grown) {
                return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory (%u rows)", cap);
            }
            p->rows = grown;
            p->cap = cap;
        }
        at = (int32_t)p->count++;
        p->where[id] = at;
    }
    memcpy(p->rows + (size_t)at * p->hidden, row, (size_t)p->hidden * sizeof *row);
    return TOVL_OK;
}

static void part_note_source(part *p, const imp_source *s, const char *what) {
    imp_str_append(&p->sources, "%s%s (%s)", p->sources.len ? " + " : "", s->pub.tensor, what);
    if (!p->first_tensor) {
        p->first_tensor = s->pub.tensor;
    }
}

static tovl_status warn(ctx *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static tovl_status warn(ctx *c, const char *fmt, ...) {
    imp_str s = {0};
    va_list ap;
    va_start(ap, fmt);
    imp_str_vappend(&s, fmt, ap);
    va_end(ap);
    char **grown = s.failed ? NULL : realloc(c->warnings, (c->warning_count + 1) * sizeof *grown);
    if (!grown) {
        imp_str_free(&s);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
    }
    c->warnings = grown;
    c->warnings[c->warning_count++] = s.buf;
    return TOVL_OK;
}

static void ctx_free(ctx *c) {
    part_free(&c->embed);
    part_free(&c->lm);
    tovl_free(c->be, c->served);
    if (c->served_lm != c->served) {
        tovl_free(c->be, c->served_lm);
    }
    for (size_t i = 0; i < c->warning_count; i++) {
        free(c->warnings[i]);
    }
    free(c->warnings);
}

/* Row `r` of a source matrix as bf16 (into scratch unless it can be read in place). */
static const uint16_t *source_row(const imp_source *s, uint64_t r, uint16_t *scratch) {
    const tovl_tensor *t = s->tensor;
    if (strcmp(t->dtype, "BF16") == 0 && ((uintptr_t)t->data % 2u) == 0) {
        return (const uint16_t *)t->data + r * s->pub.width;
    }
    imp_tensor_rows_to_bf16(t, r, 1, s->pub.width, scratch);
    return scratch;
}

/* The served base rows [0, vocab) of a module on the device (uploaded once). */
static tovl_status served_on_device(ctx *c, int module, tovl_devptr *out) {
    bool lm = module == TOVL_MODULE_LMHEAD && !c->mi->tied;
    tovl_devptr *slot = lm ? &c->served_lm : &c->served;
    if (!*slot) {
        uint32_t V = c->mi->vocab, Vc = c->mi->config_vocab, h = c->mi->hidden;
        size_t row_bytes = (size_t)h * sizeof(uint16_t);
        tovl_status st = tovl_alloc(c->be, (size_t)V * row_bytes, slot);
        const uint16_t *first = lm ? tovl_model_lmhead_row(c->model, 0) : tovl_model_embed_row(c->model, 0);
        if (st == TOVL_OK) {
            st = tovl_upload(c->be, *slot, first, (size_t)Vc * row_bytes);
        }
        if (st == TOVL_OK && V > Vc) {
            uint16_t *zeros = calloc((size_t)(V - Vc), row_bytes);
            st = zeros ? tovl_upload(c->be, *slot + (tovl_devptr)((size_t)Vc * row_bytes), zeros,
                                     (size_t)(V - Vc) * row_bytes)
                       : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
            free(zeros);
        }
        if (st != TOVL_OK) {
            tovl_free(c->be, *slot);
            *slot = 0;
            return st;
        }
        if (!lm && c->mi->tied) {
            c->served_lm = c->served;
        }
    }
    *out = *slot;
    return TOVL_OK;
}

/* A full matrix may not have fewer rows than the base vocabulary. */
static tovl_status check_full_rows(ctx *c, const imp_source *s) {
    if (s->pub.rows < c->mi->config_vocab) {
        return tovl_error(TOVL_ERR_VOCAB_MISMATCH,
                          "%s: tensor '%s': %u rows, but the base model's vocab_size is %u: the adapter was built "
                          "for a different vocabulary", s->pub.file, s->pub.tensor, s->pub.rows, c->mi->config_vocab);
    }
    return TOVL_OK;
}

/* Rows of the full matrix `s` that differ from the served base of `module`
 * (rowdiff on the backend, tol 0) go into `p`. */
static tovl_status add_full(ctx *c, part *p, const imp_source *s, int module, const char *what) {
    tovl_status st = check_full_rows(c, s);
    if (st != TOVL_OK) {
        return st;
    }
    uint32_t V = c->mi->vocab, h = c->mi->hidden;
    uint32_t n = s->pub.rows < V ? s->pub.rows : V;
    if (s->pub.rows > V) {
        st = warn(c, "%s: rows %u..%u lie beyond the served vocab %u and are dropped", s->pub.tensor, V,
                  s->pub.rows - 1, V);
        if (st != TOVL_OK) {
            return st;
        }
    }
    part_note_source(p, s, what);
    tovl_devptr base, mine = 0;
    st = served_on_device(c, module, &base);
    size_t bytes = (size_t)n * h * sizeof(uint16_t);
    uint16_t *host = NULL;
    uint32_t *changed = malloc((size_t)n * sizeof *changed);
    uint16_t *scratch = malloc((size_t)h * sizeof *scratch);
    if (st == TOVL_OK && (!changed || !scratch)) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
    }
    if (st == TOVL_OK) {
        st = tovl_alloc(c->be, bytes, &mine);
    }
    if (st == TOVL_OK) {
        const void *src = s->tensor->data;
        if (strcmp(s->tensor->dtype, "BF16") != 0 || ((uintptr_t)src % 2u) != 0) {
            host = malloc(bytes);
            if (!host) {
                st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory converting '%s'",
                                s->pub.tensor);
            } else {
                imp_tensor_rows_to_bf16(s->tensor, 0, n, h, host);
                src = host;
            }
        }
        if (st == TOVL_OK) {
            st = tovl_upload(c->be, mine, src, bytes);
        }
    }
    uint32_t n_changed = 0;
    if (st == TOVL_OK) {
        st = tovl_rowdiff(c->be, c->k, mine, base, n, h, 0.0f, changed, &n_changed);
        if (st == TOVL_ERR_KERNEL_MISSING) {
            st = tovl_error(TOVL_ERR_KERNEL_MISSING, "%s: tensor '%s' is a full matrix and needs kernel 'rowdiff', "
                            "missing on backend %s", s->pub.file, s->pub.tensor, tovl_backend_name(c->be));
        }
    }
    for (uint32_t i = 0; st == TOVL_OK && i < n_changed; i++) {
        st = part_set(p, changed[i], source_row(s, changed[i], scratch));
    }
    tovl_free(c->be, mine);
    free(host);
    free(changed);
    free(scratch);
    return st;
}

/* Trainable-token rows of `s` at the config's ids. `base_rows` is the row
 * count of the saved base layer they sit on (0: none).
 * Without a saved base layer an id may lie in the padded tail [vocab_size,
 * served vocab): a token added to the vocabulary (resize_token_embeddings)
 * whose row only the adapter holds; PEFT saves no resized base weight when it
 * cannot tell that the vocabulary grew. An id at or above the served vocab
 * has no row to go to and is an error. A saved base layer states the
 * adapter's vocabulary itself: ids beyond it are errors, and ids beyond the
 * served vocab are dropped like the layer's own rows there. */
static tovl_status add_tokens(ctx *c, part *p, const imp_source *s, uint32_t base_rows) {
    uint32_t V = c->mi->vocab, Vc = c->mi->config_vocab;
    uint16_t *scratch = malloc((size_t)c->mi->hidden * sizeof *scratch);
    if (!scratch) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
    }
    part_note_source(p, s, "trainable tokens");
    tovl_status st = TOVL_OK;
    for (uint32_t j = 0; st == TOVL_OK && j < s->pub.rows; j++) {
        uint32_t id = s->pub.ids[j];
        if (!base_rows && id >= V) {
            st = tovl_error(TOVL_ERR_ID_OUT_OF_RANGE,
                            "%s: tensor '%s' (field '%s'): id %u >= the served vocab %u (the base model's vocab_size "
                            "is %u; an added token needs a padded vocabulary of at least %llu)", s->pub.file,
                            s->pub.tensor, s->pub.config_field, id, V, Vc, (unsigned long long)id + 1);
        } else if (base_rows && id >= base_rows) {
            st = tovl_error(TOVL_ERR_ID_OUT_OF_RANGE,
                            "%s: tensor '%s' (field '%s'): id %u >= the rows of its saved base layer %u", s->pub.file,
                            s->pub.tensor, s->pub.config_field, id, base_rows);
        } else if (id >= V) {
            st = warn(c, "%s: trainable id %u lies beyond the served vocab %u and is dropped", s->pub.tensor, id,
                      V);
        } else {
            st = part_set(p, id, source_row(s, j, scratch));
        }
    }
    free(scratch);
    return st;
}

/* vLLM extra vocabulary: row k is token vocab_size + k. */
static tovl_status add_extra_vocab(ctx *c, part *p, const imp_source *s) {
    uint32_t V = c->mi->vocab, Vc = c->mi->config_vocab;
    if ((uint64_t)Vc + s->pub.rows > V) {
        return tovl_error(TOVL_ERR_ID_OUT_OF_RANGE,
                          "%s: tensor '%s': %u added tokens need ids %u..%llu, beyond the served vocab %u (pad the "
                          "vocabulary to at least %llu)", s->pub.file, s->pub.tensor, s->pub.rows, Vc,
                          (unsigned long long)Vc + s->pub.rows - 1, V, (unsigned long long)Vc + s->pub.rows);
    }
    uint16_t *scratch = malloc((size_t)c->mi->hidden * sizeof *scratch);
    if (!scratch) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
    }
    part_note_source(p, s, "vllm extra vocabulary");
    tovl_status st = TOVL_OK;
    for (uint32_t k = 0; st == TOVL_OK && k < s->pub.rows; k++) {
        uint32_t id = Vc + k;
        if (p->where[id] >= 0) {
            st = tovl_error(TOVL_ERR_DUPLICATE_ID, "%s: tensor '%s': id %u (row %u) is also set by %s", s->pub.file,
                            s->pub.tensor, id, k, p->first_tensor);
        } else {
            st = part_set(p, id, source_row(s, k, scratch));
        }
    }
    free(scratch);
    return st;
}

/* Two tensors that PEFT loads into one tied parameter must agree. */
static tovl_status check_same(const imp_source *a, const imp_source *b, const char *why) {
    bool same = a->pub.rows == b->pub.rows && a->pub.width == b->pub.width;
    uint16_t *ra = malloc((size_t)a->pub.width * sizeof *ra), *rb = malloc((size_t)a->pub.width * sizeof *rb);
    if (!ra || !rb) {
        free(ra);
        free(rb);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
    }
    for (uint32_t r = 0; same && r < a->pub.rows; r++) {
        same = memcmp(source_row(a, r, ra), source_row(b, r, rb), (size_t)a->pub.width * sizeof *ra) == 0;
    }
    free(ra);
    free(rb);
    if (!same) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensors '%s' and '%s' differ, but %s", a->pub.file, a->pub.tensor,
                          b->pub.tensor, why);
    }
    return TOVL_OK;
}

static bool same_ids(const imp_tt_entry *a, const imp_tt_entry *b) {
    return a && b && a->count == b->count && memcmp(a->ids, b->ids, (size_t)a->count * sizeof *a->ids) == 0;
}

/* Every tensor's row width must be the model's hidden size. */
static tovl_status check_widths(ctx *c) {
    const imp_source *all[] = {c->v.tt[0], c->v.tt[1], c->v.mts[0], c->v.mts[1],
                               c->v.saved_base[0], c->v.saved_base[1], c->v.vllm[0], c->v.vllm[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (all[i] && all[i]->pub.width != c->mi->hidden) {
            return tovl_error(TOVL_ERR_SHAPE_MISMATCH,
                              "%s: tensor '%s': rows of width %u, but the base model's hidden_size is %u",
                              all[i]->pub.file, all[i]->pub.tensor, all[i]->pub.width, c->mi->hidden);
        }
    }
    return TOVL_OK;
}

static tovl_status missing_lm_tokens(const ctx *c) {
    char want[512];
    imp_tt_tensor_name(c->v.config, c->v.tt_entry[TOVL_MODULE_LMHEAD], want, sizeof want);
    return tovl_error(TOVL_ERR_FORMAT, "%s/adapter_config.json: field '%s' lists %u lm_head ids but tensor '%s' is "
                      "missing", c->v.dir, c->v.tt_entry[TOVL_MODULE_LMHEAD]->field,
                      c->v.tt_entry[TOVL_MODULE_LMHEAD]->count, want);
}

/* Every PEFT tensor must sit on the base's own embedding or lm_head module:
 * an adapter trained on another family names other modules. */
static tovl_status check_module_paths(ctx *c) {
    const imp_source *all[] = {c->v.tt[0], c->v.tt[1], c->v.mts[0], c->v.mts[1], c->v.saved_base[0],
                               c->v.saved_base[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const imp_source *s = all[i];
        if (!s || !s->pub.module_path) {
            continue;
        }
        bool embed = s->pub.module == TOVL_MODULE_EMBED;
        const char *want = embed ? c->mi->embed_module : c->mi->lmhead_module;
        const char *tensor = embed ? c->mi->embed_tensor : c->mi->lmhead_tensor;
        /* The checkpoint's own name counts too: transformers may load a module
         * under another path than it saves it. */
        char *saved = NULL;
        if (tensor) {
            size_t n = strlen(tensor);
            saved = imp_strdup(tensor);
            if (!saved) {
                return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
            }
            if (n > 7 && strcmp(saved + n - 7, ".weight") == 0) {
                saved[n - 7] = '\0';
            }
        }
        bool ok = imp_module_paths_match(s->pub.module_path, want) ||
                  (saved && imp_module_paths_match(s->pub.module_path, saved));
        free(saved);
        if (!ok) {
            return tovl_error(TOVL_ERR_VOCAB_MISMATCH,
                              "%s: tensor '%s' sits on module '%s', but the base model's %s is '%s' (%s, %s): the "
                              "adapter was made for another model family", s->pub.file, s->pub.tensor,
                              s->pub.module_path, embed ? "input embedding" : "lm_head", want, c->mi->dir,
                              c->mi->layout);
        }
    }
    return TOVL_OK;
}

/* Tied model: the rules PEFT 0.21 follows (each checked against real PEFT). */
static tovl_status resolve_tied(ctx *c, bool *has_lm, const char **rule) {
    const imp_adapter_view *v = &c->v;
    const imp_source *shared = v->saved_base[TOVL_MODULE_EMBED] ? v->saved_base[TOVL_MODULE_EMBED]
                                                                : v->saved_base[TOVL_MODULE_LMHEAD];
    tovl_status st = TOVL_OK;
    if (v->saved_base[0] && v->saved_base[1]) {
        /* Both load into the one tied parameter. */
        st = check_same(v->saved_base[0], v->saved_base[1], "the model ties lm_head to embed_tokens");
    }
    uint32_t shared_rows = shared ? shared->pub.rows : 0;
    /* The embedding: its modules_to_save copy, or the (shared) base param. */
    if (st == TOVL_OK && v->mts[TOVL_MODULE_EMBED]) {
        st = add_full(c, &c->embed, v->mts[TOVL_MODULE_EMBED], TOVL_MODULE_EMBED, "modules_to_save");
    } else if (st == TOVL_OK && shared) {
        st = add_full(c, &c->embed, shared, TOVL_MODULE_EMBED, "saved base layer");
    }
    if (st == TOVL_OK && v->tt[TOVL_MODULE_EMBED]) {
        st = add_tokens(c, &c->embed, v->tt[TOVL_MODULE_EMBED], shared_rows);
    }
    if (st != TOVL_OK) {
        return st;
    }
    const imp_tt_entry *e_ids = v->tt_entry[TOVL_MODULE_EMBED], *l_ids = v->tt_entry[TOVL_MODULE_LMHEAD];
    if (v->config->standalone && e_ids && l_ids) {
        return tovl_error(TOVL_ERR_UNSUPPORTED,
                          "%s/adapter_config.json: field 'target_modules' lists both embed_tokens and lm_head of a "
                          "tied model: PEFT wraps its tied lm_head adapter around a second one and cannot run the "
                          "adapter (TrainableTokensLayer wraps a TrainableTokensLayer); target embed_tokens only: "
                          "PEFT ties the lm_head to it", v->dir);
    }
    if (v->config->ensure_weight_tying && e_ids && l_ids && !same_ids(e_ids, l_ids)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s/adapter_config.json: field 'trainable_token_indices': ensure_weight_tying"
                          " with different ids for embed_tokens and lm_head of a tied model (PEFT refuses this)",
                          v->dir);
    }
    if (v->config->ensure_weight_tying && v->mts[TOVL_MODULE_EMBED]) {
        /* PEFT ties the lm_head to the embedding's copy (and saves it twice). */
        if (v->mts[TOVL_MODULE_LMHEAD]) {
            st = check_same(v->mts[TOVL_MODULE_EMBED], v->mts[TOVL_MODULE_LMHEAD],
                            "ensure_weight_tying ties them in PEFT");
        }
        *rule = "tied model: lm_head follows the embed_tokens copy (modules_to_save with ensure_weight_tying)";
        return st;
    }
    if (v->mts[TOVL_MODULE_LMHEAD]) {
        *has_lm = true;
        *rule = "tied model: lm_head is its own modules_to_save copy";
        return add_full(c, &c->lm, v->mts[TOVL_MODULE_LMHEAD], TOVL_MODULE_LMHEAD, "modules_to_save");
    }
    if (e_ids && !v->mts[TOVL_MODULE_EMBED] && (!l_ids || same_ids(e_ids, l_ids))) {
        /* PEFT wraps the lm_head with the embedding's token adapter; a saved
         * lm_head delta is that adapter's copy and loads into the same rows. */
        if (v->tt[TOVL_MODULE_LMHEAD]) {
            st = check_same(v->tt[TOVL_MODULE_EMBED], v->tt[TOVL_MODULE_LMHEAD],
                            "PEFT ties the lm_head's trainable tokens to the embedding's");
        }
        *rule = "tied model: lm_head shares the embedding's trainable tokens (PEFT ties them)";
        return st;
    }
    /* The lm_head is the base parameter (maybe a loaded saved base) with its
     * own trainable tokens, if any. */
    if (shared) {
        st = add_full(c, &c->lm, shared, TOVL_MODULE_LMHEAD, "saved base layer");
    }
    if (st == TOVL_OK && l_ids) {
        if (!v->tt[TOVL_MODULE_LMHEAD] || !v->tt[TOVL_MODULE_LMHEAD]->pub.config_field ||
            strcmp(v->tt[TOVL_MODULE_LMHEAD]->pub.config_field, l_ids->field) != 0) {
            return missing_lm_tokens(c);
        }
        st = add_tokens(c, &c->lm, v->tt[TOVL_MODULE_LMHEAD], shared_rows);
    }
    if (st != TOVL_OK) {
        return st;
    }
    if (v->mts[TOVL_MODULE_EMBED] || l_ids || shared) {
        *has_lm = true;
        *rule = l_ids && !e_ids ? "tied model: lm_head has its own trainable tokens (none on embed_tokens)"
                : l_ids ? "tied model: lm_head has its own trainable tokens (ids differ from embed_tokens')"
                : v->mts[TOVL_MODULE_EMBED]
                    ? "tied model: lm_head left alone: modules_to_save copies embed_tokens only and "
                      "ensure_weight_tying is off, so PEFT keeps the base lm_head"
                    : "tied model: lm_head is the loaded saved base layer";
    } else {
        *rule = "tied model: lm_head follows the embedding rows";
    }
    return TOVL_OK;
}

static tovl_status resolve_untied(ctx *c, bool *has_lm, const char **rule) {
    const imp_adapter_view *v = &c->v;
    tovl_status st = TOVL_OK;
    for (int m = 0; st == TOVL_OK && m < 2; m++) {
        part *p = m == TOVL_MODULE_EMBED ? &c->embed : &c->lm;
        const imp_source *saved = v->saved_base[m];
        if (v->mts[m]) {
            st = add_full(c, p, v->mts[m], m, "modules_to_save");
        } else if (saved) {
            st = add_full(c, p, saved, m, "saved base layer");
        }
        if (st != TOVL_OK) {
            break;
        }
        const imp_source *tt = v->tt[m];
        if (m == TOVL_MODULE_LMHEAD) {
            if (tt && !v->tt_entry[m]) {
                return tovl_error(TOVL_ERR_FORMAT,
                                  "%s: tensor '%s': lm_head trainable tokens saved as the tied copy of the embedding's,"
                                  " but the base model is untied (tie_word_embeddings false)", tt->pub.file,
                                  tt->pub.tensor);
            }
            if (v->tt_entry[m] && !tt) {
                return missing_lm_tokens(c);
            }
        }
        if (tt) {
            st = add_tokens(c, p, tt, saved ? saved->pub.rows : 0);
        }
        if (m == TOVL_MODULE_LMHEAD) {
            *has_lm = v->mts[m] || saved || tt;
        }
    }
    *rule = *has_lm ? "untied model: lm_head rows from the adapter's lm_head tensors"
                    : "untied model: the adapter leaves lm_head alone";
    return st;
}

/* Gather a part into id-ordered arrays. */
static tovl_status part_export(const part *p, uint32_t **ids, uint16_t **rows) {
    *ids = malloc((p->count ? p->count : 1) * sizeof **ids);
    *rows = malloc((p->count ? (size_t)p->count : 1) * p->hidden * sizeof **rows);
    if (!*ids || !*rows) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
    }
    uint32_t n = 0;
    for (uint32_t id = 0; id < p->vocab; id++) {
        if (p->where[id] >= 0) {
            (*ids)[n] = id;
            memcpy(*rows + (size_t)n * p->hidden, p->rows + (size_t)p->where[id] * p->hidden,
                   (size_t)p->hidden * sizeof **rows);
            n++;
        }
    }
    return TOVL_OK;
}

void tovl_adapter_rows_free(tovl_adapter_rows *r) {
    if (!r) {
        return;
    }
    free(r->embed_ids);
    free(r->embed_rows);
    free(r->lmhead_ids);
    free(r->lmhead_rows);
    free(r->embed_sources);
    free(r->lmhead_sources);
    free(r->lmhead_rule);
    for (size_t i = 0; i < r->warning_count; i++) {
        free(r->warnings[i]);
    }
    free(r->warnings);
    free(r);
}

const tovl_adapter_rows_info *tovl_adapter_rows_get_info(const tovl_adapter_rows *rows) {
    return rows ? &rows->info : NULL;
}

static tovl_status take_result(ctx *c, bool has_lm, const char *rule, tovl_adapter_rows **out) {
    tovl_adapter_rows *r = calloc(1, sizeof *r);
    if (!r) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
    }
    tovl_status st = part_export(&c->embed, &r->embed_ids, &r->embed_rows);
    if (st == TOVL_OK) {
        st = part_export(&c->lm, &r->lmhead_ids, &r->lmhead_rows);
    }
    r->embed_sources = imp_strdup(c->embed.sources.buf ? c->embed.sources.buf : "");
    r->lmhead_sources = imp_strdup(c->lm.sources.buf ? c->lm.sources.buf : "");
    r->lmhead_rule = imp_strdup(rule);
    if (st == TOVL_OK && (!r->embed_sources || !r->lmhead_sources || !r->lmhead_rule || c->embed.sources.failed ||
                          c->lm.sources.failed)) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "resolve: out of host memory");
    }
    if (st != TOVL_OK) {
        tovl_adapter_rows_free(r);
        return st;
    }
    r->warnings = c->warnings;
    r->warning_count = c->warning_count;
    c->warnings = NULL;
    c->warning_count = 0;
    tovl_overlay_desc *d = &r->info.desc;
    d->adapter = c->v.dir;
    d->vocab = c->mi->vocab;
    d->hidden = c->mi->hidden;
    d->tied = c->mi->tied;
    d->embed.tensor = c->embed.first_tensor ? c->embed.first_tensor : "embed rows";
    d->embed.ids = r->embed_ids;
    d->embed.rows = r->embed_rows;
    d->embed.count = c->embed.count;
    d->embed.width = c->mi->hidden;
    d->has_lmhead = has_lm;
    d->lmhead.tensor = c->lm.first_tensor ? c->lm.first_tensor : "lm_head rows";
    d->lmhead.ids = r->lmhead_ids;
    d->lmhead.rows = r->lmhead_rows;
    d->lmhead.count = has_lm ? c->lm.count : 0;
    d->lmhead.width = c->mi->hidden;
    r->info.embed_sources = r->embed_sources;
    r->info.lmhead_sources = r->lmhead_sources;
    r->info.lmhead_rule = r->lmhead_rule;
    r->info.warning_count = r->warning_count;
    r->info.warnings = (const char *const *)r->warnings;
    *out = r;
    return TOVL_OK;
}

tovl_status tovl_adapter_resolve(tovl_backend *backend, const tovl_overlay_kernels *kernels,
                                 const tovl_adapter *adapter, const tovl_model *model, tovl_adapter_rows **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_adapter_resolve: out is NULL");
    }
    *out = NULL;
    if (!backend || !kernels || !adapter || !model) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_adapter_resolve: NULL argument");
    }
    ctx c;
    memset(&c, 0, sizeof c);
    c.be = backend;
    c.k = kernels;
    c.model = model;
    c.mi = tovl_model_get_info(model);
    c.v = imp_adapter_get_view(adapter);
    tovl_status st = part_init(&c.embed, c.mi->vocab, c.mi->hidden);
    if (st == TOVL_OK) {
        st = part_init(&c.lm, c.mi->vocab, c.mi->hidden);
    }
    if (st == TOVL_OK) {
        st = check_module_paths(&c);
    }
    if (st == TOVL_OK) {
        st = check_widths(&c);
    }
    bool has_lm = false;
    const char *rule = "";
    if (st == TOVL_OK) {
        st = c.mi->tied ? resolve_tied(&c, &has_lm, &rule) : resolve_untied(&c, &has_lm, &rule);
    }
    /* vLLM's extra vocabulary goes on top, as vLLM applies it: input rows
     * patch only the embedding, output rows only the lm_head (without them
     * vLLM's extra logits come from zero rows: the lm_head is left alone). A
     * tied lm_head that followed the embedding's PEFT rows keeps them. */
    if (st == TOVL_OK && (c.v.vllm[TOVL_MODULE_EMBED] || c.v.vllm[TOVL_MODULE_LMHEAD]) && !has_lm) {
        for (uint32_t id = 0; st == TOVL_OK && c.mi->tied && id < c.mi->vocab; id++) {
            if (c.embed.where[id] >= 0) {
                st = part_set(&c.lm, id, c.embed.rows + (size_t)c.embed.where[id] * c.mi->hidden);
            }
        }
        if (c.mi->tied && c.embed.count > 0) {
            imp_str_append(&c.lm.sources, "%s (tied)", c.embed.sources.buf ? c.embed.sources.buf : "");
            c.lm.first_tensor = c.embed.first_tensor;
            rule = "tied model: lm_head follows the embedding's PEFT rows; vLLM input_embeddings patch only the "
                   "embedding, output_embeddings only the lm_head";
        } else {
            rule = "vLLM: input_embeddings patch only the embedding, output_embeddings only the lm_head";
        }
        has_lm = true;
    }
    if (st == TOVL_OK && c.v.vllm[TOVL_MODULE_EMBED]) {
        st = add_extra_vocab(&c, &c.embed, c.v.vllm[TOVL_MODULE_EMBED]);
    }
    if (st == TOVL_OK && c.v.vllm[TOVL_MODULE_LMHEAD]) {
        st = add_extra_vocab(&c, &c.lm, c.v.vllm[TOVL_MODULE_LMHEAD]);
    }
    for (int m = 0; st == TOVL_OK && m < 2; m++) {
        if (c.v.lora[m]) {
            /* PEFT adds B.A to every row of the module: not a few rows, so not
             * a token overlay; the overlay covers only the other tensors. */
            st = warn(&c, "%s: LoRA on %s is not a token overlay (it updates every row); the engine's LoRA applies "
                      "it, tovl does not", c.v.lora[m], m == TOVL_MODULE_EMBED ? "embed_tokens" : "lm_head");
        }
    }
    if (st == TOVL_OK) {
        st = take_result(&c, has_lm, rule, out);
    }
    ctx_free(&c);
    if (st == TOVL_OK) {
        tovl_clear_error();
    }
    return st;
}

tovl_status tovl_adapter_build_overlay(tovl_backend *backend, const tovl_overlay_kernels *kernels,
                                       const tovl_adapter *adapter, const tovl_model *model,
                                       tovl_embed_overlay **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_adapter_build_overlay: out is NULL");
    }
    *out = NULL;
    tovl_adapter_rows *rows;
    tovl_status st = tovl_adapter_resolve(backend, kernels, adapter, model, &rows);
    if (st != TOVL_OK) {
        return st;
    }
    st = tovl_build_overlay(backend, kernels, &tovl_adapter_rows_get_info(rows)->desc, out);
    tovl_adapter_rows_free(rows);
    return st;
}
