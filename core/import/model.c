/* Base model folders: config.json plus the embedding and lm_head matrices from
 * model.safetensors or a sharded checkpoint (model.safetensors.index.json),
 * found by the family's tensor names (or named by the caller).
 * The rows stay memory-mapped when they are aligned bf16; otherwise they are
 * converted once (F16/F32 -> bf16, nearest-even). */
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "../internal.h"
#include "import_internal.h"
#include "cpu/cpu_simd.h" /* the base product runs on the CPU backend's kernels */

#define CONFIG_MAX_BYTES ((size_t)16 << 20)
#define INDEX_MAX_BYTES ((size_t)256 << 20)

/* The checkpoint names of the input embedding and the output projection in
 * the families tovl knows (transformers' names; a tied lm_head is not saved).
 * Multimodal checkpoints nest the text model: transformers 5 writes
 * model.language_model.*, older versions language_model.model.*, and some
 * (a Qwen2-VL saved by transformers 5.24) the plain Llama names. */
typedef struct known_layout {
    const char *family, *embed, *lmhead;
    /* The lm_head's module path when transformers 5 loads it under another
     * name than the checkpoint's (GPT-NeoX: embed_out.weight into lm_head),
     * which is the path PEFT then writes; NULL: the tensor's own. */
    const char *lmhead_loaded;
} known_layout;

static const known_layout known_layouts[] = {
    {"llama-style (Llama, Mistral, Qwen, Gemma, Granite, Cohere, ...)", "model.embed_tokens.weight",
     "lm_head.weight", NULL},
    {"multimodal, transformers 5 (Qwen2-VL, Gemma 3, LLaVA, Mistral 3, ...)",
     "model.language_model.embed_tokens.weight", "lm_head.weight", NULL},
    {"multimodal, transformers 4 (LLaVA, Llama 4, Gemma 3, ...)", "language_model.model.embed_tokens.weight",
     "language_model.lm_head.weight", NULL},
    {"GPT-NeoX / Pythia", "gpt_neox.embed_in.weight", "embed_out.weight", "lm_head"},
    {"GPT-2 / GPT-J", "transformer.wte.weight", "lm_head.weight", NULL},
    {"BLOOM / Falcon", "transformer.word_embeddings.weight", "lm_head.weight", NULL},
    {"OPT", "model.decoder.embed_tokens.weight", "lm_head.weight", NULL},
    {"Mamba", "backbone.embeddings.weight", "lm_head.weight", NULL},
};
#define KNOWN_LAYOUTS (sizeof known_layouts / sizeof known_layouts[0])

struct tovl_model {
    tovl_model_info info;
    char *dir;
    tovl_safetensors *files[2]; /* the file(s) holding the two matrices */
    const uint16_t *embed;      /* [config_vocab, hidden] */
    const uint16_t *lmhead;     /* [config_vocab, hidden]; == embed when tied */
    uint16_t *embed_owned, *lmhead_owned;
    uint16_t *zero_row;         /* [hidden]: the padded vocab's rows */
    char *names[4];             /* embed/lm_head tensor and module names (info points here) */
    char *layout;
};

void tovl_model_close(tovl_model *m) {
    if (!m) {
        return;
    }
    for (int i = 0; i < 2; i++) {
        tovl_safetensors_close(m->files[i]);
    }
    for (int i = 0; i < 4; i++) {
        free(m->names[i]);
    }
    free(m->layout);
    free(m->embed_owned);
    free(m->lmhead_owned);
    free(m->zero_row);
    free(m->dir);
    free(m);
}

/* The model's config fields; 0 = config.json does not say (the embedding's
 * shape gives it); tie is -1 when config.json does not say. */
typedef struct model_config {
    uint32_t vocab, hidden;
    int tie;
} model_config;

/* A positive integer field of `obj` under any of `names` (transformers'
 * attribute aliases: GPT-2's n_embd is its hidden_size); 0 when absent. */
static tovl_status config_uint(const char *path, const char *where, const cJSON *obj, const char *const *names,
                               uint32_t *out) {
    for (size_t i = 0; names[i]; i++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, names[i]);
        uint64_t v;
        if (!item || cJSON_IsNull(item)) {
            continue;
        }
        if (!imp_json_uint(item, (uint64_t)INT32_MAX, &v) || v == 0) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: field '%s%s' is not a positive integer below 2^31", path, where,
                              names[i]);
        }
        *out = (uint32_t)v;
        return TOVL_OK;
    }
    return TOVL_OK;
}

static tovl_status config_tie(const char *path, const char *where, const cJSON *obj, int *tie) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, "tie_word_embeddings");
    *tie = -1;
    if (!item || cJSON_IsNull(item)) {
        return TOVL_OK;
    }
    if (!cJSON_IsBool(item)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: field '%stie_word_embeddings' is not true or false", path, where);
    }
    *tie = cJSON_IsTrue(item) ? 1 : 0;
    return TOVL_OK;
}

/* The text model's fields: a multimodal config nests them in text_config
 * (read first), a plain one has them at the top. Tying follows transformers
 * 5: the outer tie_word_embeddings, or true when either level says true (older
 * saves kept it in text_config only). */
static tovl_status parse_config(const char *path, const char *text, size_t len, model_config *c) {
    memset(c, 0, sizeof *c);
    c->tie = -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        return tovl_error(TOVL_ERR_FORMAT, "%s: not valid JSON (near byte %zu)", path, off);
    }
    tovl_status st = TOVL_OK;
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(root)) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: not a JSON object", path);
    } else if (inner && !cJSON_IsNull(inner) && !cJSON_IsObject(inner)) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: field 'text_config' is not an object", path);
    }
    if (!cJSON_IsObject(inner)) {
        inner = NULL;
    }
    static const char *const vocab_names[] = {"vocab_size", NULL};
    static const char *const hidden_names[] = {"hidden_size", "n_embd", "n_embed", "d_model", NULL};
    if (st == TOVL_OK && inner) {
        st = config_uint(path, "text_config.", inner, vocab_names, &c->vocab);
    }
    if (st == TOVL_OK && inner) {
        st = config_uint(path, "text_config.", inner, hidden_names, &c->hidden);
    }
    if (st == TOVL_OK && !c->vocab) {
        st = config_uint(path, "", root, vocab_names, &c->vocab);
    }
    if (st == TOVL_OK && !c->hidden) {
        st = config_uint(path, "", root, hidden_names, &c->hidden);
    }
    int outer = -1, nested = -1;
    if (st == TOVL_OK) {
        st = config_tie(path, "", root, &outer);
    }
    if (st == TOVL_OK && inner) {
        st = config_tie(path, "text_config.", inner, &nested);
    }
    c->tie = outer == 1 || nested == 1 ? 1 : outer == 0 || nested == 0 ? 0 : -1;
    cJSON_Delete(root);
    return st;
}

/* The tensor names of the checkpoint (a single file's or an index's
 * weight_map), with the file when it is one (shapes known). */
typedef struct name_list {
    const char **names;
    size_t count;
    const tovl_safetensors *file; /* NULL for an index */
    const char *where;            /* the file or index named in errors */
} name_list;

static bool has_name(const name_list *l, const char *name) {
    for (size_t i = 0; i < l->count; i++) {
        if (strcmp(l->names[i], name) == 0) {
            return true;
        }
    }
    return false;
}

/* Whether `name` is "<module path>.weight" whose last module is one of
 * `module` (TOVL_MODULE_EMBED or TOVL_MODULE_LMHEAD) by its name. */
static bool named_like(const char *name, int module) {
    size_t n = strlen(name), w = strlen(".weight");
    return n > w && strcmp(name + n - w, ".weight") == 0 && imp_module_of(name, n - w) == module;
}

/* A fallback candidate must also have the config's shape when it is known. */
static bool shaped_like(const name_list *l, const char *name, const model_config *c) {
    if (!l->file) {
        return true;
    }
    const tovl_tensor *t = tovl_safetensors_find(l->file, name);
    return t && t->ndim == 2 && (!c->vocab || t->shape[0] == c->vocab) && (!c->hidden || t->shape[1] == c->hidden);
}

static void append_known(imp_str *s, bool lm) {
    bool first = true;
    for (size_t i = 0; i < KNOWN_LAYOUTS; i++) {
        const char *n = lm ? known_layouts[i].lmhead : known_layouts[i].embed;
        bool dup = false;
        for (size_t j = 0; j < i && lm; j++) {
            dup = dup || strcmp(known_layouts[j].lmhead, n) == 0;
        }
        if (!dup) {
            imp_str_append(s, "%s'%s'", first ? "" : ", ", n);
            first = false;
        }
    }
}

static tovl_status name_error(tovl_status code, imp_str *s) {
    tovl_status st = s->failed ? tovl_error(TOVL_ERR_OUT_OF_MEMORY, "model: out of memory")
                               : tovl_error(code, "%s", s->buf);
    imp_str_free(s);
    return st;
}

/* The input embedding: a known layout's name, else the one tensor named like
 * an embedding (with the config's shape). Never a guess between two. */
static tovl_status find_embed(const name_list *l, const model_config *c, const char **name, const char **layout) {
    size_t hits = 0;
    imp_str s = {0};
    for (size_t i = 0; i < KNOWN_LAYOUTS; i++) {
        if (has_name(l, known_layouts[i].embed)) {
            imp_str_append(&s, "%s'%s' (%s)", hits ? " and " : "", known_layouts[i].embed, known_layouts[i].family);
            *name = known_layouts[i].embed;
            *layout = known_layouts[i].family;
            hits++;
        }
    }
    if (hits == 1) {
        imp_str_free(&s);
        return TOVL_OK;
    }
    if (hits > 1) {
        imp_str t = {0};
        imp_str_append(&t, "%s: two candidate input embeddings, %s; name the one to use (--embed-tensor)", l->where,
                       s.buf ? s.buf : "");
        imp_str_free(&s);
        return name_error(TOVL_ERR_FORMAT, &t);
    }
    for (size_t i = 0; i < l->count; i++) {
        if (named_like(l->names[i], TOVL_MODULE_EMBED) && shaped_like(l, l->names[i], c)) {
            imp_str_append(&s, "%s'%s'", hits ? " and " : "", l->names[i]);
            *name = l->names[i];
            hits++;
        }
    }
    if (hits == 1) {
        imp_str_free(&s);
        *layout = "not a known layout: the one tensor named like an input embedding";
        return TOVL_OK;
    }
    imp_str t = {0};
    if (hits > 1) {
        imp_str_append(&t, "%s: no known layout, and two candidate input embeddings, %s; name the one to use "
                       "(--embed-tensor)", l->where, s.buf ? s.buf : "");
    } else {
        imp_str_append(&t, "%s: no input embedding found: none of ", l->where);
        append_known(&t, false);
        imp_str_append(&t, " is there, and no [vocab, hidden] tensor is named like an embedding (*.embed_tokens, "
                       "*.embed_in, *.wte, *.word_embeddings, *.embeddings, *.tok_embeddings .weight); name it "
                       "(--embed-tensor)");
    }
    imp_str_free(&s);
    return name_error(TOVL_ERR_FORMAT, &t);
}

/* The output projection: the one tensor named like one (*.lm_head.weight,
 * *.embed_out.weight), or none (tied). */
static tovl_status find_lmhead(const name_list *l, const char **name) {
    size_t hits = 0;
    imp_str s = {0};
    *name = NULL;
    for (size_t i = 0; i < l->count; i++) {
        if (named_like(l->names[i], TOVL_MODULE_LMHEAD)) {
            imp_str_append(&s, "%s'%s'", hits ? " and " : "", l->names[i]);
            *name = l->names[i];
            hits++;
        }
    }
    if (hits <= 1) {
        imp_str_free(&s);
        return TOVL_OK;
    }
    imp_str t = {0};
    imp_str_append(&t, "%s: two candidate lm_head tensors, %s; name the one to use (--lmhead-tensor)", l->where,
                   s.buf ? s.buf : "");
    imp_str_free(&s);
    *name = NULL;
    return name_error(TOVL_ERR_FORMAT, &t);
}

/* "<path>.weight" -> "<path>" (malloc'd); other names stay whole. */
static char *module_of_tensor(const char *tensor) {
    size_t n = strlen(tensor), w = strlen(".weight");
    char *s = imp_strdup(tensor);
    if (s && n > w && strcmp(s + n - w, ".weight") == 0) {
        s[n - w] = '\0';
    }
    return s;
}

/* The two tensor names, the two module paths and the layout label. */
typedef struct chosen {
    const char *embed, *lmhead; /* lmhead NULL: none in the checkpoint (tied) */
    const char *layout;
    bool tied_by_caller; /* the caller named the embedding as the lm_head */
} chosen;

static tovl_status choose_tensors(const name_list *l, const model_config *c, const char *config_path,
                                  const tovl_model_names *given, chosen *out) {
    memset(out, 0, sizeof *out);
    const char *embed_given = given ? given->embed_tensor : NULL, *lm_given = given ? given->lmhead_tensor : NULL;
    tovl_status st = TOVL_OK;
    if (embed_given) {
        if (!has_name(l, embed_given)) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s' (given as the input embedding) is not there",
                              l->where, embed_given);
        }
        out->embed = embed_given;
        out->layout = "tensors named by the caller";
    } else {
        st = find_embed(l, c, &out->embed, &out->layout);
    }
    if (st != TOVL_OK) {
        return st;
    }
    if (lm_given) {
        if (!has_name(l, lm_given)) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s' (given as the lm_head) is not there", l->where,
                              lm_given);
        }
        if (strcmp(lm_given, out->embed) != 0 && c->tie == 1) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s' is given as the lm_head, but %s says "
                              "tie_word_embeddings true (the lm_head is the embedding)", l->where, lm_given,
                              config_path);
        }
        out->tied_by_caller = strcmp(lm_given, out->embed) == 0;
        out->lmhead = out->tied_by_caller ? NULL : lm_given;
        out->layout = "tensors named by the caller";
        return TOVL_OK;
    }
    st = find_lmhead(l, &out->lmhead);
    if (st == TOVL_OK && !out->lmhead && c->tie == 0) {
        imp_str t = {0};
        imp_str_append(&t, "%s: the lm_head tensor is missing (none of ", l->where);
        append_known(&t, true);
        imp_str_append(&t, " nor another *.lm_head.weight or *.embed_out.weight is there), and %s says "
                       "tie_word_embeddings false; name it (--lmhead-tensor)", config_path);
        return name_error(TOVL_ERR_FORMAT, &t);
    }
    return st;
}

/* Check a base matrix and make its rows available as bf16. */
static tovl_status load_matrix(const tovl_safetensors *file, const tovl_tensor *t, const model_config *c,
                               const char *config_path, const uint16_t **rows, uint16_t **owned) {
    const char *path = tovl_safetensors_path(file);
    if (!imp_dtype_is_float_row(t->dtype)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': dtype %s, expected BF16 (or F16/F32)", path, t->name,
                          t->dtype);
    }
    if (t->ndim != 2 || t->shape[0] != c->vocab || t->shape[1] != c->hidden) {
        imp_str shape = {0};
        for (uint32_t d = 0; d < t->ndim; d++) {
            imp_str_append(&shape, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
        }
        tovl_status st = tovl_error(TOVL_ERR_SHAPE_MISMATCH,
                                    "%s: tensor '%s': shape [%s], but %s says vocab_size %u and hidden_size %u", path,
                                    t->name, shape.buf ? shape.buf : "", config_path, c->vocab, c->hidden);
        imp_str_free(&shape);
        return st;
    }
    if (strcmp(t->dtype, "BF16") == 0 && ((uintptr_t)t->data % sizeof(uint16_t)) == 0) {
        *rows = t->data; /* the mapped file itself */
        return TOVL_OK;
    }
    size_t n = (size_t)c->vocab * c->hidden;
    *owned = malloc(n * sizeof(uint16_t));
    if (!*owned) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: tensor '%s': out of memory converting to bf16", path, t->name);
    }
    imp_tensor_rows_to_bf16(t, 0, c->vocab, c->hidden, *owned);
    *rows = *owned;
    return TOVL_OK;
}

/* A field config.json lacks is the embedding's: transformers sizes the
 * embedding [vocab_size, hidden_size], so its shape is what the class default
 * was. */
static tovl_status fill_config_from(const tovl_safetensors *file, const tovl_tensor *embed, const char *config_path,
                                    model_config *c) {
    if ((c->vocab && c->hidden) || embed->ndim != 2) {
        return TOVL_OK; /* load_matrix reports a wrong rank */
    }
    if (embed->shape[0] == 0 || embed->shape[0] > INT32_MAX || embed->shape[1] == 0 || embed->shape[1] > INT32_MAX) {
        return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "%s: tensor '%s': shape [%llu, %llu] is not an embedding (and %s "
                          "gives no %s)", tovl_safetensors_path(file), embed->name,
                          (unsigned long long)embed->shape[0], (unsigned long long)embed->shape[1], config_path,
                          c->vocab ? "hidden_size" : "vocab_size");
    }
    if (!c->vocab) {
        c->vocab = (uint32_t)embed->shape[0];
    }
    if (!c->hidden) {
        c->hidden = (uint32_t)embed->shape[1];
    }
    return TOVL_OK;
}

/* Fill the model from its config and the located matrices (lm may be NULL). */
static tovl_status finish_model(tovl_model *m, const char *config_path, model_config *c, uint32_t padded_vocab,
                                const chosen *ch, const tovl_model_names *given, const tovl_safetensors *embed_file,
                                const tovl_tensor *embed, const tovl_safetensors *lm_file, const tovl_tensor *lm) {
    tovl_status st = fill_config_from(embed_file, embed, config_path, c);
    if (st != TOVL_OK) {
        return st;
    }
    bool tied = ch->tied_by_caller || (c->tie >= 0 ? c->tie == 1 : lm == NULL);
    if (!tied && !lm) {
        return tovl_error(TOVL_ERR_INTERNAL, "%s: untied but no lm_head tensor chosen", config_path);
    }
    if (padded_vocab != 0 && padded_vocab < c->vocab) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: padded vocab %u is below vocab_size %u", config_path,
                          padded_vocab, c->vocab);
    }
    st = load_matrix(embed_file, embed, c, config_path, &m->embed, &m->embed_owned);
    if (st == TOVL_OK && !tied) {
        st = load_matrix(lm_file, lm, c, config_path, &m->lmhead, &m->lmhead_owned);
    }
    if (st != TOVL_OK) {
        return st;
    }
    if (tied) {
        m->lmhead = m->embed;
    }
    /* Module paths as a PEFT adapter names them: the caller's, else the
     * tensors' (a tied lm_head: its family's name). */
    const char *lm_tensor = lm ? lm->name : "lm_head.weight", *lm_loaded = NULL;
    for (size_t i = 0; i < KNOWN_LAYOUTS; i++) {
        if (strcmp(known_layouts[i].embed, embed->name) == 0) {
            lm_tensor = lm ? lm_tensor : known_layouts[i].lmhead;
            lm_loaded = known_layouts[i].lmhead_loaded;
        }
    }
    m->names[0] = imp_strdup(embed->name);
    m->names[1] = tied ? NULL : imp_strdup(lm->name);
    m->names[2] = given && given->embed_module ? imp_strdup(given->embed_module) : module_of_tensor(embed->name);
    m->names[3] = given && given->lmhead_module ? imp_strdup(given->lmhead_module)
                  : lm_loaded                       ? imp_strdup(lm_loaded)
                                                    : module_of_tensor(lm_tensor);
    m->layout = imp_strdup(ch->layout);
    m->zero_row = calloc(c->hidden, sizeof(uint16_t));
    if (!m->zero_row || !m->names[0] || (!tied && !m->names[1]) || !m->names[2] || !m->names[3] || !m->layout) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", config_path);
    }
    m->info.dir = m->dir;
    m->info.vocab = padded_vocab ? padded_vocab : c->vocab;
    m->info.config_vocab = c->vocab;
    m->info.hidden = c->hidden;
    m->info.tied = tied;
    m->info.tied_inferred = c->tie < 0;
    m->info.embed_file = tovl_safetensors_path(embed_file);
    m->info.embed_dtype = embed->dtype;
    m->info.lmhead_file = tied ? NULL : tovl_safetensors_path(lm_file);
    m->info.lmhead_dtype = tied ? NULL : lm->dtype;
    m->info.embed_tensor = m->names[0];
    m->info.lmhead_tensor = m->names[1];
    m->info.embed_module = m->names[2];
    m->info.lmhead_module = m->names[3];
    m->info.layout = m->layout;
    return TOVL_OK;
}

static tovl_status new_model(const char *dir, tovl_model **out) {
    *out = calloc(1, sizeof **out);
    if (!*out || !((*out)->dir = imp_strdup(dir))) {
        free(*out);
        *out = NULL;
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    }
    return TOVL_OK;
}

static tovl_status check_given(const tovl_model_names *given) {
    const char *fields[4] = {given ? given->embed_tensor : NULL, given ? given->lmhead_tensor : NULL,
                             given ? given->embed_module : NULL, given ? given->lmhead_module : NULL};
    const char *labels[4] = {"embed_tensor", "lmhead_tensor", "embed_module", "lmhead_module"};
    for (int i = 0; i < 4; i++) {
        if (fields[i] && !fields[i][0]) {
            return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_model_open_named: %s is empty", labels[i]);
        }
    }
    return TOVL_OK;
}

/* The names of one open file. */
static tovl_status file_names(const tovl_safetensors *f, name_list *l) {
    l->count = tovl_safetensors_count(f);
    l->names = malloc((l->count ? l->count : 1) * sizeof *l->names);
    if (!l->names) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", tovl_safetensors_path(f));
    }
    for (size_t i = 0; i < l->count; i++) {
        l->names[i] = tovl_safetensors_at(f, i)->name;
    }
    l->file = f;
    l->where = tovl_safetensors_path(f);
    return TOVL_OK;
}

tovl_status imp_model_from_parts(const char *dir, const char *config_path, const char *config_text,
                                 size_t config_len, tovl_safetensors *weights, uint32_t padded_vocab,
                                 tovl_model **out) {
    *out = NULL;
    tovl_model *m;
    tovl_status st = new_model(dir, &m);
    if (st != TOVL_OK) {
        tovl_safetensors_close(weights);
        return st;
    }
    m->files[0] = weights;
    model_config c;
    name_list l = {0};
    chosen ch;
    if (!weights) {
        st = tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: no weights file", dir);
    }
    if (st == TOVL_OK) {
        st = parse_config(config_path, config_text, config_len, &c);
    }
    if (st == TOVL_OK) {
        st = file_names(weights, &l);
    }
    if (st == TOVL_OK) {
        st = choose_tensors(&l, &c, config_path, NULL, &ch);
    }
    if (st == TOVL_OK) {
        st = finish_model(m, config_path, &c, padded_vocab, &ch, NULL, weights,
                          tovl_safetensors_find(weights, ch.embed), weights,
                          ch.lmhead ? tovl_safetensors_find(weights, ch.lmhead) : NULL);
    }
    free(l.names);
    if (st != TOVL_OK) {
        tovl_model_close(m);
        return st;
    }
    *out = m;
    return TOVL_OK;
}

/* The shard holding `tensor` per the index's weight_map: NULL name when the
 * tensor is not listed. The name must be a plain file name in the folder. */
static tovl_status shard_of(const char *index_path, const cJSON *weight_map, const char *tensor, const char **file) {
    *file = NULL;
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(weight_map, tensor);
    if (!entry) {
        return TOVL_OK;
    }
    if (!cJSON_IsString(entry) || entry->valuestring[0] == '\0' || strchr(entry->valuestring, '/') ||
        strchr(entry->valuestring, '\\') || strcmp(entry->valuestring, ".") == 0 ||
        strcmp(entry->valuestring, "..") == 0) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name in the model folder",
                          index_path, tensor);
    }
    *file = entry->valuestring;
    return TOVL_OK;
}

/* Open the shard(s) holding the chosen embedding and lm_head. */
static tovl_status open_shards(tovl_model *m, const char *index_path, const cJSON *map, const chosen *ch,
                               const tovl_tensor **embed, const tovl_tensor **lm, int *embed_file, int *lm_file) {
    const char *names[2] = {ch->embed, ch->lmhead};
    const tovl_tensor **found[2] = {embed, lm};
    int *which[2] = {embed_file, lm_file};
    tovl_status st = TOVL_OK;
    for (int i = 0; st == TOVL_OK && i < 2; i++) {
        const char *shard;
        if (!names[i]) {
            continue;
        }
        st = shard_of(index_path, map, names[i], &shard);
        if (st != TOVL_OK || !shard) {
            continue;
        }
        int slot = 0;
        while (slot < 2 && m->files[slot]) {
            const char *p = tovl_safetensors_path(m->files[slot]);
            size_t pl = strlen(p), sl = strlen(shard);
            if (pl > sl && p[pl - sl - 1] == '/' && strcmp(p + pl - sl, shard) == 0) {
                break; /* already open */
            }
            slot++;
        }
        if (!m->files[slot]) {
            char *path = imp_path_join(m->dir, shard);
            if (!path) {
                st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
                break;
            }
            st = tovl_safetensors_open(path, &m->files[slot]);
            free(path);
            if (st != TOVL_OK) {
                break;
            }
        }
        *found[i] = tovl_safetensors_find(m->files[slot], names[i]);
        *which[i] = slot;
        if (!*found[i]) {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s' is not in %s, where weight_map says it is", index_path,
                            names[i], tovl_safetensors_path(m->files[slot]));
        }
    }
    return st;
}

/* A sharded checkpoint: the names of its weight_map, then the shards. */
static tovl_status open_index(tovl_model *m, const char *index_path, const model_config *c, const char *config_path,
                              const tovl_model_names *given, chosen *ch, const tovl_tensor **embed,
                              const tovl_tensor **lm, int *embed_file, int *lm_file) {
    char *text = NULL;
    size_t len = 0;
    tovl_status st = imp_read_text(index_path, INDEX_MAX_BYTES, &text, &len);
    if (st != TOVL_OK) {
        return st;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: not valid JSON", index_path);
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    name_list l = {.where = index_path};
    if (!cJSON_IsObject(map)) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: field 'weight_map' is missing or not an object", index_path);
    }
    if (st == TOVL_OK) {
        for (const cJSON *it = map->child; it; it = it->next) {
            l.count++;
        }
        l.names = malloc((l.count ? l.count : 1) * sizeof *l.names);
        if (!l.names) {
            st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", index_path);
        }
    }
    if (st == TOVL_OK) {
        size_t i = 0;
        for (const cJSON *it = map->child; it; it = it->next) {
            l.names[i++] = it->string;
        }
        st = choose_tensors(&l, c, config_path, given, ch);
    }
    if (st == TOVL_OK) {
        st = open_shards(m, index_path, map, ch, embed, lm, embed_file, lm_file);
    }
    /* The chosen names point into the index; keep copies past its end. */
    if (st == TOVL_OK) {
        ch->embed = (*embed)->name;
        ch->lmhead = ch->lmhead ? (*lm)->name : NULL;
    }
    free(l.names);
    cJSON_Delete(root);
    return st;
}

tovl_status tovl_model_open_named(const char *dir, uint32_t padded_vocab, const tovl_model_names *given,
                                  tovl_model **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_model_open: out is NULL");
    }
    *out = NULL;
    if (!dir) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_model_open: dir is NULL");
    }
    tovl_status st = check_given(given);
    if (st != TOVL_OK) {
        return st;
    }
    tovl_model *m;
    st = new_model(dir, &m);
    if (st != TOVL_OK) {
        return st;
    }
    char *config_path = imp_path_join(dir, "config.json");
    char *single = imp_path_join(dir, "model.safetensors");
    char *index = imp_path_join(dir, "model.safetensors.index.json");
    char *text = NULL;
    size_t len = 0;
    model_config c;
    chosen ch;
    name_list l = {0};
    if (!config_path || !single || !index) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    }
    if (st == TOVL_OK && !imp_file_exists(config_path)) {
        st = tovl_error(TOVL_ERR_IO, "%s: missing: a base model folder needs config.json", config_path);
    }
    if (st == TOVL_OK) {
        st = imp_read_text(config_path, CONFIG_MAX_BYTES, &text, &len);
    }
    if (st == TOVL_OK) {
        st = parse_config(config_path, text, len, &c);
    }
    const tovl_tensor *embed = NULL, *lm = NULL;
    int embed_file = 0, lm_file = 0;
    if (st == TOVL_OK) {
        if (imp_file_exists(single)) {
            st = tovl_safetensors_open(single, &m->files[0]);
            if (st == TOVL_OK) {
                st = file_names(m->files[0], &l);
            }
            if (st == TOVL_OK) {
                st = choose_tensors(&l, &c, config_path, given, &ch);
            }
            if (st == TOVL_OK) {
                embed = tovl_safetensors_find(m->files[0], ch.embed);
                lm = ch.lmhead ? tovl_safetensors_find(m->files[0], ch.lmhead) : NULL;
            }
        } else if (imp_file_exists(index)) {
            st = open_index(m, index, &c, config_path, given, &ch, &embed, &lm, &embed_file, &lm_file);
        } else {
            st = tovl_error(TOVL_ERR_IO, "%s: no model.safetensors and no model.safetensors.index.json", dir);
        }
    }
    if (st == TOVL_OK) {
        st = finish_model(m, config_path, &c, padded_vocab, &ch, given, m->files[embed_file], embed,
                          m->files[lm_file], lm);
    }
    free(l.names);
    free(text);
    free(config_path);
    free(single);
    free(index);
    if (st != TOVL_OK) {
        tovl_model_close(m);
        return st;
    }
    tovl_clear_error();
    *out = m;
    return TOVL_OK;
}

tovl_status tovl_model_open(const char *dir, uint32_t padded_vocab, tovl_model **out) {
    return tovl_model_open_named(dir, padded_vocab, NULL, out);
}

tovl_status tovl_model_set_modules(tovl_model *m, const char *embed_module, const char *lmhead_module) {
    if (!m || (embed_module && !embed_module[0]) || (lmhead_module && !lmhead_module[0])) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_model_set_modules: NULL model or an empty module path");
    }
    const char *given[2] = {embed_module, lmhead_module};
    char *copies[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        if (given[i] && !(copies[i] = imp_strdup(given[i]))) {
            free(copies[0]);
            return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "tovl_model_set_modules: out of memory");
        }
    }
    for (int i = 0; i < 2; i++) {
        if (copies[i]) {
            free(m->names[2 + i]);
            m->names[2 + i] = copies[i];
        }
    }
    m->info.embed_module = m->names[2];
    m->info.lmhead_module = m->names[3];
    tovl_clear_error();
    return TOVL_OK;
}

const tovl_model_info *tovl_model_get_info(const tovl_model *model) {
    return model ? &model->info : NULL;
}

const uint16_t *tovl_model_embed_row(const tovl_model *m, uint32_t id) {
    if (!m || id >= m->info.vocab) {
        return NULL;
    }
    return id < m->info.config_vocab ? m->embed + (size_t)id * m->info.hidden : m->zero_row;
}

const uint16_t *tovl_model_lmhead_row(const tovl_model *m, uint32_t id) {
    if (!m || id >= m->info.vocab) {
        return NULL;
    }
    return id < m->info.config_vocab ? m->lmhead + (size_t)id * m->info.hidden : m->zero_row;
}

static const uint16_t *lmhead_row_of(const void *model, uint32_t v) {
    return tovl_model_lmhead_row(model, v);
}

tovl_status tovl_model_lmhead_product(const tovl_model *m, const uint16_t *hidden, uint32_t T, float *logits) {
    if (!m || (T && (!hidden || !logits))) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_model_lmhead_product: NULL argument");
    }
    /* The CPU backend's tiled product (the spec's dot order at the CPU's
     * vector width, on its threads; TOVL_CPU_THREADS, TOVL_CPU_SIMD apply). */
    tovl_status st = tovl_cpu_matmul_bf16_once(hidden, T, m->info.hidden, lmhead_row_of, m, m->info.vocab, logits);
    if (st != TOVL_OK) {
        return st;
    }
    tovl_clear_error();
    return TOVL_OK;
}
