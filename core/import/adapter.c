/* Adapter folders: find the token-overlay tensors of a PEFT adapter
 * (adapter_config.json + adapter_model.safetensors) and of vLLM's extra
 * vocabulary (new_embeddings.safetensors), and check them against the config.
 * Which rows PEFT finally computes for a given model is resolve.c's job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"
#include "import_internal.h"

#define PEFT_PREFIX "base_model.model."
#define CONFIG_MAX_BYTES ((size_t)16 << 20)

struct tovl_adapter {
    tovl_adapter_info info;
    char *dir;
    char *config_path;
    char *format;
    imp_adapter_config config;
    tovl_safetensors *peft;  /* adapter_model.safetensors, or NULL */
    tovl_safetensors *vllm;  /* new_embeddings.safetensors, or NULL */
    imp_source *sources;     /* at most 2 modules x 4 kinds + a tied duplicate */
    tovl_adapter_source *pub_sources;
    size_t source_count;
    /* Per module and kind, an index into sources or -1. */
    int tt[2], mts[2], saved_base[2], vllm_rows[2];
    const char *lora[2];     /* per module, a LoRA tensor on it (not a token overlay), or NULL */
};

static const char *module_name(int m) {
    return m == TOVL_MODULE_EMBED ? "embed_tokens" : "lm_head";
}

static bool ends_with(const char *s, size_t len, const char *suffix, size_t *prefix_len) {
    size_t n = strlen(suffix);
    if (len < n || memcmp(s + len - n, suffix, n) != 0) {
        return false;
    }
    *prefix_len = len - n;
    return true;
}

/* A tensor we read rows from: 2-D, BF16/F16/F32, dims below 2^32. */
static tovl_status check_matrix(const char *file, const tovl_tensor *t) {
    if (!imp_dtype_is_float_row(t->dtype)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': dtype %s, expected F32, BF16 or F16", file, t->name,
                          t->dtype);
    }
    if (t->ndim != 2) {
        return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "%s: tensor '%s': rank %u, expected [rows, hidden]", file, t->name,
                          t->ndim);
    }
    if (t->shape[0] > UINT32_MAX - 1 || t->shape[1] > UINT32_MAX - 1 || t->shape[1] == 0) {
        return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "%s: tensor '%s': shape [%llu, %llu] is not a row matrix", file,
                          t->name, (unsigned long long)t->shape[0], (unsigned long long)t->shape[1]);
    }
    return TOVL_OK;
}

/* `mpath`/`mlen`: the module path the tensor sits on (NULL for vLLM rows). */
static tovl_status add_source(tovl_adapter *a, int *slot, tovl_adapter_source_kind kind, int module,
                              const tovl_safetensors *file, const tovl_tensor *t, const char *mpath, size_t mlen) {
    const char *path = tovl_safetensors_path(file);
    if (*slot >= 0) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensors '%s' and '%s' both hold the %s rows of %s", path,
                          a->sources[*slot].tensor->name, t->name,
                          kind == TOVL_SOURCE_TRAINABLE_TOKENS ? "trainable-token" : "full-matrix",
                          module_name(module));
    }
    tovl_status st = check_matrix(path, t);
    if (st != TOVL_OK) {
        return st;
    }
    imp_source *s = &a->sources[a->source_count];
    memset(s, 0, sizeof *s);
    s->pub.kind = kind;
    s->pub.module = (tovl_adapter_module)module;
    s->pub.file = path;
    s->pub.tensor = t->name;
    s->pub.dtype = t->dtype;
    s->pub.rows = (uint32_t)t->shape[0];
    s->pub.width = (uint32_t)t->shape[1];
    s->tensor = t;
    if (mpath) {
        s->module_path = malloc(mlen + 1);
        if (!s->module_path) {
            return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        }
        memcpy(s->module_path, mpath, mlen);
        s->module_path[mlen] = '\0';
        s->pub.module_path = s->module_path;
    }
    *slot = (int)a->source_count++;
    return TOVL_OK;
}

void imp_tt_tensor_name(const imp_adapter_config *c, const imp_tt_entry *e, char *buf, size_t size) {
    const char *suffix = c->standalone ? "trainable_tokens_delta" : "token_adapter.trainable_tokens_delta";
    const char *key = e->key, *dot = strrchr(key, '.');
    const char *last = dot ? dot + 1 : key;
    /* Llama's paths follow from the module name; other families' from the
     * model, which the adapter does not know. */
    if (strcmp(last, "embed_tokens") == 0 && !dot) {
        snprintf(buf, size, PEFT_PREFIX "model.embed_tokens.%s", suffix);
    } else if (strcmp(last, "lm_head") == 0 && !dot) {
        snprintf(buf, size, PEFT_PREFIX "lm_head.%s", suffix);
    } else {
        snprintf(buf, size, PEFT_PREFIX "%s%s.%s", dot ? "" : "<path>.", key, suffix);
    }
}

/* Whether `name` is a trainable-tokens tensor of the config's kind; `p` is
 * then where its module path ends. */
static bool tt_tensor_module(const imp_adapter_config *c, const char *name, size_t len, size_t *p) {
    if (c->standalone) {
        return ends_with(name, len, ".trainable_tokens_delta", p) && strstr(name, ".token_adapter.") == NULL;
    }
    return ends_with(name, len, ".token_adapter.trainable_tokens_delta", p);
}

/* Sort one PEFT tensor into its role; tensors that are not token overlays
 * (LoRA matrices and the like) are only counted. */
static tovl_status classify_peft(tovl_adapter *a, const tovl_tensor *t) {
    const char *path = tovl_safetensors_path(a->peft);
    const char *name = t->name;
    size_t plen = strlen(PEFT_PREFIX);
    if (strncmp(name, PEFT_PREFIX, plen) == 0) {
        name += plen;
    }
    size_t len = strlen(name), p;
    if (tt_tensor_module(&a->config, name, len, &p)) {
        size_t q;
        if (a->config.standalone && ends_with(name, p, ".base_layer", &q) &&
            imp_module_of(name, q) == TOVL_MODULE_LMHEAD) {
            /* PEFT 0.21 saves this when target_modules lists both modules of
             * a tied model: it wraps its tied lm_head adapter around a first
             * one, and its forward then raises ValueError. */
            return tovl_error(TOVL_ERR_UNSUPPORTED,
                              "%s: tensor '%s': PEFT saves it when target_modules lists both embed_tokens and lm_head "
                              "of a tied model, and then cannot run the adapter (TrainableTokensLayer wraps a "
                              "TrainableTokensLayer); target embed_tokens only: PEFT ties the lm_head to it", path,
                              t->name);
        }
        int m = imp_module_of(name, p);
        if (m < 0) {
            return tovl_error(TOVL_ERR_UNSUPPORTED,
                              "%s: tensor '%s': trainable tokens on a module that is not an input embedding or an "
                              "lm_head", path, t->name);
        }
        return add_source(a, &a->tt[m], TOVL_SOURCE_TRAINABLE_TOKENS, m, a->peft, t, name, p);
    }
    if (ends_with(name, len, ".token_adapter.base_layer.weight", &p) || ends_with(name, len, ".base_layer.weight", &p)) {
        int m = imp_module_of(name, p);
        if (m >= 0) {
            return add_source(a, &a->saved_base[m], TOVL_SOURCE_SAVED_BASE, m, a->peft, t, name, p);
        }
    } else if (ends_with(name, len, ".weight", &p)) {
        int m = imp_module_of(name, p);
        if (m >= 0) {
            /* A module PEFT copied (modules_to_save) or a saved base weight
             * (resized vocabulary, save_embedding_layers): they differ on
             * tied models, so the config decides. */
            bool copied = m == TOVL_MODULE_EMBED ? a->config.mts_embed : a->config.mts_lmhead;
            if (copied) {
                return add_source(a, &a->mts[m], TOVL_SOURCE_MODULES_TO_SAVE, m, a->peft, t, name, p);
            }
            return add_source(a, &a->saved_base[m], TOVL_SOURCE_SAVED_BASE, m, a->peft, t, name, p);
        }
    }
    if (strstr(t->name, "trainable_tokens") != NULL) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': a trainable-tokens tensor tovl does not know", path,
                          t->name);
    }
    const char *lora = strstr(name, ".lora_");
    int m = lora ? imp_module_of(name, (size_t)(lora - name)) : -1;
    if (m >= 0 && !a->lora[m]) {
        a->lora[m] = t->name;
    }
    a->info.other_tensors++;
    return TOVL_OK;
}

/* Tie each trainable-token tensor to its config entry and check its rows. */
static tovl_status check_peft_against_config(tovl_adapter *a) {
    const imp_adapter_config *c = &a->config;
    const char *cfg = a->config_path;
    for (size_t i = 0; i < c->tt_count; i++) {
        const imp_tt_entry *e = &c->tt[i];
        int slot = a->tt[e->module];
        if (slot < 0) {
            /* A tied model may share the embedding's delta with the lm_head
             * (PEFT saves one tensor); resolve decides once the model is known. */
            if (e->module == TOVL_MODULE_LMHEAD) {
                continue;
            }
            char want[512];
            imp_tt_tensor_name(c, e, want, sizeof want);
            return tovl_error(TOVL_ERR_FORMAT, "%s: field '%s' lists %u ids but tensor '%s' is missing from %s",
                              cfg, e->field, e->count, want,
                              a->peft ? tovl_safetensors_path(a->peft) : "the adapter (no adapter_model.safetensors)");
        }
        imp_source *s = &a->sources[slot];
        s->pub.ids = e->ids;
        s->pub.config_field = e->field;
        if (s->pub.rows != e->count) {
            return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "%s: tensor '%s': %u rows but %s field '%s' lists %u ids",
                              s->pub.file, s->pub.tensor, s->pub.rows, cfg, e->field, e->count);
        }
    }
    for (int m = 0; m < 2; m++) {
        int slot = a->tt[m];
        if (slot >= 0 && !a->sources[slot].pub.config_field) {
            /* An lm_head delta with only embedding ids is a tied copy: LoRA
             * saves one next to a resized embedding, the TRAINABLE_TOKENS
             * method one for every tied model. Anything else has no ids. */
            bool tied_copy = m == TOVL_MODULE_LMHEAD && a->tt[TOVL_MODULE_EMBED] >= 0;
            if (!tied_copy) {
                return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s': %s has no %s for %s",
                                  a->sources[slot].pub.file, a->sources[slot].pub.tensor,
                                  a->config.present ? cfg : "the adapter",
                                  c->standalone ? "target_modules entry" : "trainable_token_indices", module_name(m));
            }
            const imp_source *embed = &a->sources[a->tt[TOVL_MODULE_EMBED]];
            a->sources[slot].pub.ids = embed->pub.ids;
            a->sources[slot].pub.config_field = embed->pub.config_field;
            if (a->sources[slot].pub.rows != embed->pub.rows) {
                return tovl_error(TOVL_ERR_SHAPE_MISMATCH,
                                  "%s: tensor '%s': %u rows, but it can only be the tied copy of '%s' (%u rows)",
                                  a->sources[slot].pub.file, a->sources[slot].pub.tensor, a->sources[slot].pub.rows,
                                  embed->pub.tensor, embed->pub.rows);
            }
        }
    }
    const bool listed[2] = {c->mts_embed, c->mts_lmhead};
    for (int m = 0; m < 2; m++) {
        if (listed[m] && a->mts[m] < 0) {
            /* ensure_weight_tying on a tied model lists embed_tokens for both;
             * PEFT still saves both matrices, so a missing one is an error. */
            return tovl_error(TOVL_ERR_FORMAT, "%s: field 'modules_to_save' lists %s but no '%s<path>.%s.weight' "
                              "tensor is in %s", cfg, module_name(m), PEFT_PREFIX, module_name(m),
                              a->peft ? tovl_safetensors_path(a->peft) : "the adapter (no adapter_model.safetensors)");
        }
    }
    return TOVL_OK;
}

static tovl_status classify_vllm(tovl_adapter *a) {
    const char *path = tovl_safetensors_path(a->vllm);
    const char *names[2] = {"input_embeddings", "output_embeddings"};
    bool any = false;
    for (int m = 0; m < 2; m++) {
        const tovl_tensor *t = tovl_safetensors_find(a->vllm, names[m]);
        if (t) {
            tovl_status st = add_source(a, &a->vllm_rows[m], TOVL_SOURCE_VLLM_EXTRA_VOCAB, m, a->vllm, t, NULL, 0);
            if (st != TOVL_OK) {
                return st;
            }
            any = true;
        }
    }
    if (!any) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: neither 'input_embeddings' nor 'output_embeddings' is in the file",
                          path);
    }
    return TOVL_OK;
}

static tovl_status build_format(tovl_adapter *a) {
    imp_str f = {0};
    bool kinds[4] = {false, false, false, false};
    for (size_t i = 0; i < a->source_count; i++) {
        kinds[a->sources[i].pub.kind] = true;
    }
    const char *labels[4] = {a->config.standalone ? "peft TRAINABLE_TOKENS" : "peft trainable_token_indices",
                             "peft modules_to_save", "peft saved embedding layers", "vllm new_embeddings"};
    for (int k = 0; k < 4; k++) {
        if (kinds[k]) {
            imp_str_append(&f, "%s%s", f.len ? " + " : "", labels[k]);
        }
    }
    if (!f.len) {
        imp_str_append(&f, "none");
    }
    if (f.failed) {
        imp_str_free(&f);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", a->dir);
    }
    a->format = f.buf;
    return TOVL_OK;
}

void tovl_adapter_close(tovl_adapter *a) {
    if (!a) {
        return;
    }
    tovl_safetensors_close(a->peft);
    tovl_safetensors_close(a->vllm);
    imp_adapter_config_free(&a->config);
    for (size_t i = 0; a->sources && i < a->source_count; i++) {
        free(a->sources[i].module_path);
    }
    free(a->sources);
    free(a->pub_sources);
    free(a->format);
    free(a->config_path);
    free(a->dir);
    free(a);
}

tovl_status imp_adapter_from_parts(const char *dir, const char *config_path, const char *config_text,
                                   size_t config_len, tovl_safetensors *peft, tovl_safetensors *vllm,
                                   tovl_adapter **out) {
    *out = NULL;
    tovl_adapter *a = calloc(1, sizeof *a);
    if (!a) {
        tovl_safetensors_close(peft);
        tovl_safetensors_close(vllm);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    }
    a->peft = peft;
    a->vllm = vllm;
    for (int m = 0; m < 2; m++) {
        a->tt[m] = a->mts[m] = a->saved_base[m] = a->vllm_rows[m] = -1;
    }
    a->dir = imp_strdup(dir);
    a->config_path = imp_strdup(config_path ? config_path : "adapter_config.json");
    a->sources = calloc(10, sizeof *a->sources);
    if (!a->dir || !a->config_path || !a->sources) {
        tovl_adapter_close(a);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    }
    tovl_status st = TOVL_OK;
    if (!config_text && !vllm) {
        st = tovl_error(TOVL_ERR_IO, "%s: no adapter_config.json and no new_embeddings.safetensors: not an adapter "
                        "folder", dir);
    }
    if (st == TOVL_OK && config_text) {
        st = imp_adapter_config_parse(config_text, config_len, a->config_path, &a->config);
    }
    if (st == TOVL_OK && !peft && (a->config.tt_count || a->config.mts_embed || a->config.mts_lmhead)) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: lists %s but the folder has no adapter_model.safetensors",
                        a->config_path, a->config.standalone ? "token_indices"
                                                             : "trainable_token_indices or modules_to_save");
    }
    for (size_t i = 0; st == TOVL_OK && peft && i < tovl_safetensors_count(peft); i++) {
        st = classify_peft(a, tovl_safetensors_at(peft, i));
    }
    if (st == TOVL_OK) {
        st = check_peft_against_config(a);
    }
    if (st == TOVL_OK && vllm) {
        st = classify_vllm(a);
    }
    if (st == TOVL_OK) {
        st = build_format(a);
    }
    if (st == TOVL_OK) {
        a->pub_sources = calloc(a->source_count ? a->source_count : 1, sizeof *a->pub_sources);
        if (!a->pub_sources) {
            st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
        }
    }
    if (st != TOVL_OK) {
        tovl_adapter_close(a);
        return st;
    }
    for (size_t i = 0; i < a->source_count; i++) {
        a->pub_sources[i] = a->sources[i].pub;
    }
    a->info.dir = a->dir;
    a->info.format = a->format;
    a->info.ensure_weight_tying = a->config.ensure_weight_tying;
    a->info.source_count = a->source_count;
    a->info.sources = a->pub_sources;
    *out = a;
    return TOVL_OK;
}

tovl_status tovl_adapter_open(const char *dir, tovl_adapter **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_adapter_open: out is NULL");
    }
    *out = NULL;
    if (!dir) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_adapter_open: dir is NULL");
    }
    char *config_path = imp_path_join(dir, "adapter_config.json");
    char *peft_path = imp_path_join(dir, "adapter_model.safetensors");
    char *bin_path = imp_path_join(dir, "adapter_model.bin");
    char *vllm_path = imp_path_join(dir, "new_embeddings.safetensors");
    char *text = NULL;
    size_t len = 0;
    tovl_safetensors *peft = NULL, *vllm = NULL;
    tovl_status st = TOVL_OK;
    if (!config_path || !peft_path || !bin_path || !vllm_path) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    }
    bool has_config = st == TOVL_OK && imp_file_exists(config_path);
    bool has_vllm = st == TOVL_OK && imp_file_exists(vllm_path);
    if (st == TOVL_OK && !has_config && !has_vllm) {
        st = tovl_error(TOVL_ERR_IO, "%s: no adapter_config.json and no new_embeddings.safetensors: not an adapter "
                        "folder", dir);
    }
    if (st == TOVL_OK && has_config) {
        st = imp_read_text(config_path, CONFIG_MAX_BYTES, &text, &len);
    }
    if (st == TOVL_OK && has_config) {
        if (imp_file_exists(peft_path)) {
            st = tovl_safetensors_open(peft_path, &peft);
        } else if (imp_file_exists(bin_path)) {
            st = tovl_error(TOVL_ERR_UNSUPPORTED, "%s: pickled weights are not read; save the adapter with "
                            "safe_serialization (adapter_model.safetensors)", bin_path);
        }
    }
    if (st == TOVL_OK && has_vllm) {
        st = tovl_safetensors_open(vllm_path, &vllm);
    }
    if (st == TOVL_OK) {
        st = imp_adapter_from_parts(dir, config_path, text, len, peft, vllm, out);
        peft = vllm = NULL; /* owned by the adapter now, even on failure */
    }
    tovl_safetensors_close(peft);
    tovl_safetensors_close(vllm);
    free(text);
    free(config_path);
    free(peft_path);
    free(bin_path);
    free(vllm_path);
    if (st == TOVL_OK) {
        tovl_clear_error();
    }
    return st;
}

const tovl_adapter_info *tovl_adapter_get_info(const tovl_adapter *adapter) {
    return adapter ? &adapter->info : NULL;
}

imp_adapter_view imp_adapter_get_view(const tovl_adapter *a) {
    imp_adapter_view v;
    memset(&v, 0, sizeof v);
    v.config = &a->config;
    v.dir = a->dir;
    for (int m = 0; m < 2; m++) {
        v.tt[m] = a->tt[m] >= 0 ? &a->sources[a->tt[m]] : NULL;
        v.mts[m] = a->mts[m] >= 0 ? &a->sources[a->mts[m]] : NULL;
        v.saved_base[m] = a->saved_base[m] >= 0 ? &a->sources[a->saved_base[m]] : NULL;
        v.vllm[m] = a->vllm_rows[m] >= 0 ? &a->sources[a->vllm_rows[m]] : NULL;
        v.lora[m] = a->lora[m];
    }
    for (size_t i = 0; i < a->config.tt_count; i++) {
        v.tt_entry[a->config.tt[i].module] = &a->config.tt[i];
    }
    return v;
}
