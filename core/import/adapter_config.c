/* adapter_config.json: the fields that decide token overlays.
 *   trainable_token_indices: null | [ids] (the input embedding) | {"module": [ids], ...}
 *   modules_to_save:         null | ["embed_tokens", "lm_head", ...]
 *   ensure_weight_tying:     bool (absent = false)
 * and, for PEFT's standalone Trainable Tokens method (peft_type TRAINABLE_TOKENS):
 *   token_indices:           [ids], the same ids for every target module
 *   target_modules:          null (the input embedding) | "module.name" | ["module", ...]
 * Everything else (LoRA ranks, LoRA's target modules) is not ours and is ignored. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "../internal.h"
#include "import_internal.h"

/* Config files above this are not adapter configs. */
#define CONFIG_MAX_BYTES ((size_t)16 << 20)

/* The module names the families give their input embedding and their output
 * projection (transformers' names; docs/ADAPTERS.md has the table). */
static const char *const embed_module_names[] = {"embed_tokens", "embed_in", "wte", "word_embeddings", "embeddings",
                                                 "tok_embeddings"};
static const char *const lmhead_module_names[] = {"lm_head", "embed_out"};

static bool in_names(const char *s, size_t n, const char *const *names, size_t count) {
    for (size_t i = 0; i < count; i++) {
        if (strlen(names[i]) == n && memcmp(s, names[i], n) == 0) {
            return true;
        }
    }
    return false;
}

int imp_module_of(const char *name, size_t len) {
    size_t start = len;
    while (start > 0 && name[start - 1] != '.') {
        start--;
    }
    const char *last = name + start;
    size_t n = len - start;
    if (in_names(last, n, embed_module_names, sizeof embed_module_names / sizeof embed_module_names[0])) {
        return TOVL_MODULE_EMBED;
    }
    if (in_names(last, n, lmhead_module_names, sizeof lmhead_module_names / sizeof lmhead_module_names[0])) {
        return TOVL_MODULE_LMHEAD;
    }
    return -1;
}

/* Skip the wrappers of one component: "model" and "language_model". */
static bool is_wrapper(const char *c, size_t n) {
    return (n == 5 && memcmp(c, "model", 5) == 0) || (n == 14 && memcmp(c, "language_model", 14) == 0);
}

bool imp_module_paths_match(const char *a, const char *b) {
    for (;;) {
        size_t na = strcspn(a, "."), nb = strcspn(b, ".");
        if (is_wrapper(a, na) && a[na]) {
            a += na + 1;
            continue;
        }
        if (is_wrapper(b, nb) && b[nb]) {
            b += nb + 1;
            continue;
        }
        if (na != nb || memcmp(a, b, na) != 0) {
            return false;
        }
        if (!a[na] || !b[nb]) {
            return !a[na] && !b[nb];
        }
        a += na + 1;
        b += nb + 1;
    }
}

void imp_adapter_config_free(imp_adapter_config *cfg) {
    for (size_t i = 0; i < cfg->tt_count; i++) {
        free(cfg->tt[i].key);
        free(cfg->tt[i].field);
        free(cfg->tt[i].ids);
    }
    free(cfg->tt);
    memset(cfg, 0, sizeof *cfg);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* One id list: non-negative integers below 2^32, no duplicates. */
static tovl_status parse_ids(const char *path, const char *field, const cJSON *list, imp_tt_entry *e) {
    if (!cJSON_IsArray(list)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: field '%s': not a list of token ids", path, field);
    }
    int n = cJSON_GetArraySize(list);
    e->ids = malloc((size_t)(n ? n : 1) * sizeof *e->ids);
    uint32_t *sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
    if (!e->ids || !sorted) {
        free(sorted);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    uint32_t k = 0;
    for (const cJSON *it = list->child; it; it = it->next, k++) {
        uint64_t id;
        if (!imp_json_uint(it, UINT32_MAX - 1, &id)) {
            free(sorted);
            return tovl_error(TOVL_ERR_FORMAT, "%s: field '%s': entry %u is not a token id (a non-negative integer)",
                              path, field, k);
        }
        e->ids[k] = (uint32_t)id;
        sorted[k] = (uint32_t)id;
    }
    e->count = k;
    qsort(sorted, k, sizeof *sorted, cmp_u32);
    for (uint32_t i = 1; i < k; i++) {
        if (sorted[i] == sorted[i - 1]) {
            uint32_t dup = sorted[i];
            free(sorted);
            return tovl_error(TOVL_ERR_DUPLICATE_ID, "%s: field '%s': token id %u appears twice", path, field, dup);
        }
    }
    free(sorted);
    return TOVL_OK;
}

static tovl_status add_entry(const char *path, imp_adapter_config *cfg, const char *key, const char *field,
                             const cJSON *list) {
    imp_tt_entry *e = &cfg->tt[cfg->tt_count];
    memset(e, 0, sizeof *e);
    e->key = imp_strdup(key);
    e->field = imp_strdup(field);
    cfg->tt_count++;
    if (!e->key || !e->field) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    e->module = imp_module_of(key, strlen(key));
    return parse_ids(path, field, list, e);
}

static tovl_status parse_tt(const char *path, const cJSON *tti, imp_adapter_config *cfg) {
    if (!tti || cJSON_IsNull(tti)) {
        return TOVL_OK;
    }
    if (cJSON_IsArray(tti)) {
        cfg->tt = calloc(1, sizeof *cfg->tt);
        if (!cfg->tt) {
            return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        }
        /* A list means PEFT's input embedding. */
        return add_entry(path, cfg, "embed_tokens", "trainable_token_indices", tti);
    }
    if (!cJSON_IsObject(tti)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: field 'trainable_token_indices': neither a list nor a dict", path);
    }
    cfg->tt_is_dict = true;
    size_t n = 0;
    for (const cJSON *it = tti->child; it; it = it->next) {
        n++;
    }
    cfg->tt = calloc(n ? n : 1, sizeof *cfg->tt);
    if (!cfg->tt) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    bool seen[2] = {false, false};
    for (const cJSON *it = tti->child; it; it = it->next) {
        imp_str field = {0};
        imp_str_append(&field, "trainable_token_indices.%s", it->string);
        if (field.failed) {
            return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        }
        tovl_status st = add_entry(path, cfg, it->string, field.buf, it);
        int module = cfg->tt[cfg->tt_count - 1].module;
        /* Checked as an index here so the compiler sees seen[] stay in bounds. */
        bool known = module == TOVL_MODULE_EMBED || module == TOVL_MODULE_LMHEAD;
        if (st == TOVL_OK && !known) {
            st = tovl_error(TOVL_ERR_UNSUPPORTED,
                            "%s: field '%s': module '%s' is not an input embedding or an lm_head (embed_tokens, "
                            "embed_in, wte, word_embeddings, embeddings, lm_head, embed_out); tovl overlays only those",
                            path, field.buf, it->string);
        } else if (st == TOVL_OK && seen[module == TOVL_MODULE_LMHEAD]) {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: field '%s': a second key for the %s module", path, field.buf,
                            module == TOVL_MODULE_EMBED ? "embed_tokens" : "lm_head");
        }
        imp_str_free(&field);
        if (st != TOVL_OK) {
            return st;
        }
        seen[module == TOVL_MODULE_LMHEAD] = true;
    }
    return TOVL_OK;
}

/* A module name as PEFT matches it: letters, digits, '_' and '.'. A string
 * with any other character is a regular expression, which tovl does not
 * evaluate (it cannot tell which modules it matched). */
static bool is_plain_module_name(const char *s) {
    if (!*s) {
        return false;
    }
    for (; *s; s++) {
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '.') {
            return false;
        }
    }
    return true;
}

/* One target module of a TRAINABLE_TOKENS config, with the ids of token_indices. */
static tovl_status add_target(const char *path, const char *name, const cJSON *ids, imp_adapter_config *cfg) {
    if (!is_plain_module_name(name)) {
        return tovl_error(TOVL_ERR_UNSUPPORTED,
                          "%s: field 'target_modules': '%s' is a regular expression; tovl reads module names "
                          "(embed_tokens, lm_head)", path, name);
    }
    int module = imp_module_of(name, strlen(name));
    if (module != TOVL_MODULE_EMBED && module != TOVL_MODULE_LMHEAD) {
        return tovl_error(TOVL_ERR_UNSUPPORTED,
                          "%s: field 'target_modules': module '%s' is not an input embedding or an lm_head "
                          "(embed_tokens, embed_in, wte, word_embeddings, embeddings, lm_head, embed_out); tovl "
                          "overlays only those", path, name);
    }
    for (size_t i = 0; i < cfg->tt_count; i++) {
        if (cfg->tt[i].module == module) {
            return TOVL_OK; /* two names of one module: PEFT wraps it once */
        }
    }
    return add_entry(path, cfg, name, "token_indices", ids);
}

/* peft_type TRAINABLE_TOKENS: token_indices for each module of target_modules. */
static tovl_status parse_standalone(const char *path, const cJSON *root, imp_adapter_config *cfg) {
    cfg->standalone = true;
    const char *lora_fields[] = {"trainable_token_indices", "modules_to_save"};
    for (size_t f = 0; f < sizeof lora_fields / sizeof lora_fields[0]; f++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, lora_fields[f]);
        if (item && !cJSON_IsNull(item)) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: field '%s' is not a field of peft_type TRAINABLE_TOKENS (PEFT "
                              "ignores it there; PEFT never writes it)", path, lora_fields[f]);
        }
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "token_indices");
    if (!ids) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: field 'token_indices' is missing (peft_type TRAINABLE_TOKENS)", path);
    }
    cfg->tt = calloc(2, sizeof *cfg->tt);
    if (!cfg->tt) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    const cJSON *targets = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    if (!targets || cJSON_IsNull(targets)) {
        return add_target(path, "embed_tokens", ids, cfg); /* PEFT targets the input embedding */
    }
    if (cJSON_IsString(targets)) {
        return add_target(path, targets->valuestring, ids, cfg);
    }
    if (!cJSON_IsArray(targets) || cJSON_GetArraySize(targets) == 0) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: field 'target_modules': not a module name or a non-empty list of them",
                          path);
    }
    int k = 0;
    for (const cJSON *it = targets->child; it; it = it->next, k++) {
        if (!cJSON_IsString(it)) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: field 'target_modules': entry %d is not a string", path, k);
        }
        tovl_status st = add_target(path, it->valuestring, ids, cfg);
        if (st != TOVL_OK) {
            return st;
        }
    }
    return TOVL_OK;
}

static tovl_status parse_mts(const char *path, const cJSON *mts, imp_adapter_config *cfg) {
    if (!mts || cJSON_IsNull(mts)) {
        return TOVL_OK;
    }
    if (!cJSON_IsArray(mts)) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: field 'modules_to_save': not a list of module names", path);
    }
    int k = 0;
    for (const cJSON *it = mts->child; it; it = it->next, k++) {
        if (!cJSON_IsString(it)) {
            return tovl_error(TOVL_ERR_FORMAT, "%s: field 'modules_to_save': entry %d is not a string", path, k);
        }
        switch (imp_module_of(it->valuestring, strlen(it->valuestring))) {
        case TOVL_MODULE_EMBED: cfg->mts_embed = true; break;
        case TOVL_MODULE_LMHEAD: cfg->mts_lmhead = true; break;
        default: cfg->mts_other++; break;
        }
    }
    return TOVL_OK;
}

tovl_status imp_adapter_config_parse(const char *text, size_t len, const char *path, imp_adapter_config *out) {
    memset(out, 0, sizeof *out);
    out->present = true;
    if (len > CONFIG_MAX_BYTES) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: %zu bytes, too large for an adapter config", path, len);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        return tovl_error(TOVL_ERR_FORMAT, "%s: not valid JSON (near byte %zu)", path, off);
    }
    tovl_status st = TOVL_OK;
    for (const char *p = end; p && p < text + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: bytes after the JSON object (at byte %zu)", path,
                            (size_t)(p - text));
            break;
        }
    }
    if (st == TOVL_OK && !cJSON_IsObject(root)) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: not a JSON object", path);
    }
    if (st == TOVL_OK) {
        /* A duplicated key would make cJSON silently pick the first. */
        const char *fields[] = {"trainable_token_indices", "modules_to_save", "ensure_weight_tying", "peft_type",
                                "token_indices", "target_modules"};
        for (size_t f = 0; st == TOVL_OK && f < sizeof fields / sizeof fields[0]; f++) {
            int seen = 0;
            for (const cJSON *it = root->child; it; it = it->next) {
                seen += strcmp(it->string, fields[f]) == 0;
            }
            if (seen > 1) {
                st = tovl_error(TOVL_ERR_FORMAT, "%s: field '%s' appears %d times", path, fields[f], seen);
            }
        }
    }
    bool standalone = false;
    if (st == TOVL_OK) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
        if (type && !cJSON_IsNull(type) && !cJSON_IsString(type)) {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: field 'peft_type': not a string", path);
        }
        standalone = cJSON_IsString(type) && strcmp(type->valuestring, "TRAINABLE_TOKENS") == 0;
    }
    if (st == TOVL_OK && standalone) {
        /* TrainableTokensConfig has no ensure_weight_tying: on a tied model
         * PEFT always ties the lm_head to the embedding's token adapter. */
        st = parse_standalone(path, root, out);
    }
    if (st == TOVL_OK && !standalone) {
        st = parse_tt(path, cJSON_GetObjectItemCaseSensitive(root, "trainable_token_indices"), out);
    }
    if (st == TOVL_OK && !standalone) {
        st = parse_mts(path, cJSON_GetObjectItemCaseSensitive(root, "modules_to_save"), out);
    }
    if (st == TOVL_OK && !standalone) {
        const cJSON *ewt = cJSON_GetObjectItemCaseSensitive(root, "ensure_weight_tying");
        if (ewt && !cJSON_IsNull(ewt) && !cJSON_IsBool(ewt)) {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: field 'ensure_weight_tying': not true or false", path);
        }
        out->ensure_weight_tying = cJSON_IsTrue(ewt);
    }
    if (st == TOVL_OK) {
        /* PEFT refuses a module that is both fully saved and token-trained. */
        for (size_t i = 0; i < out->tt_count; i++) {
            int m = out->tt[i].module;
            if ((m == TOVL_MODULE_EMBED && out->mts_embed) || (m == TOVL_MODULE_LMHEAD && out->mts_lmhead)) {
                st = tovl_error(TOVL_ERR_FORMAT, "%s: field '%s': module '%s' is also in modules_to_save (PEFT "
                                "refuses both)", path, out->tt[i].field, out->tt[i].key);
                break;
            }
        }
    }
    cJSON_Delete(root);
    if (st != TOVL_OK) {
        imp_adapter_config_free(out);
        out->present = true;
    }
    return st;
}
