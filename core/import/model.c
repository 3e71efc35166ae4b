/* Base model folders: config.json plus the embedding and lm_head matrices from
 * model.safetensors or a sharded checkpoint (model.safetensors.index.json).
 * The rows stay memory-mapped when they are aligned bf16; otherwise they are
 * converted once (F16/F32 -> bf16, nearest-even). */
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "../internal.h"
#include "import_internal.h"
#include "cpu/cpu_simd.h" /* the base product runs on the CPU backend's kernels */

#define EMBED_TENSOR "model.embed_tokens.weight"
#define LMHEAD_TENSOR "lm_head.weight"
#define CONFIG_MAX_BYTES ((size_t)16 << 20)
#define INDEX_MAX_BYTES ((size_t)256 << 20)

struct tovl_model {
    tovl_model_info info;
    char *dir;
    tovl_safetensors *files[2]; /* the file(s) holding the two matrices */
    const uint16_t *embed;      /* [config_vocab, hidden] */
    const uint16_t *lmhead;     /* [config_vocab, hidden]; == embed when tied */
    uint16_t *embed_owned, *lmhead_owned;
    uint16_t *zero_row;         /* [hidden]: the padded vocab's rows */
};

void tovl_model_close(tovl_model *m) {
    if (!m) {
        return;
    }
    for (int i = 0; i < 2; i++) {
        tovl_safetensors_close(m->files[i]);
    }
    free(m->embed_owned);
    free(m->lmhead_owned);
    free(m->zero_row);
    free(m->dir);
    free(m);
}

/* The model's config fields; tie is -1 when config.json does not say. */
typedef struct model_config {
    uint32_t vocab, hidden;
    int tie;
} model_config;

static tovl_status parse_config(const char *path, const char *text, size_t len, model_config *c) {
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        return tovl_error(TOVL_ERR_FORMAT, "%s: not valid JSON (near byte %zu)", path, off);
    }
    tovl_status st = TOVL_OK;
    if (!cJSON_IsObject(root)) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const char *names[2] = {"vocab_size", "hidden_size"};
    uint32_t *dst[2] = {&c->vocab, &c->hidden};
    for (int i = 0; st == TOVL_OK && i < 2; i++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, names[i]);
        uint64_t v;
        if (!item) {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: field '%s' is missing", path, names[i]);
        } else if (!imp_json_uint(item, (uint64_t)INT32_MAX, &v) || v == 0) {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: field '%s' is not a positive integer below 2^31", path, names[i]);
        } else {
            *dst[i] = (uint32_t)v;
        }
    }
    if (st == TOVL_OK) {
        const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
        if (!tie || cJSON_IsNull(tie)) {
            c->tie = -1;
        } else if (!cJSON_IsBool(tie)) {
            st = tovl_error(TOVL_ERR_FORMAT, "%s: field 'tie_word_embeddings' is not true or false", path);
        } else {
            c->tie = cJSON_IsTrue(tie) ? 1 : 0;
        }
    }
    cJSON_Delete(root);
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

/* Fill the model from its config and the located matrices (lm may be NULL). */
static tovl_status finish_model(tovl_model *m, const char *config_path, const model_config *c, uint32_t padded_vocab,
                                const tovl_safetensors *embed_file, const tovl_tensor *embed,
                                const tovl_safetensors *lm_file, const tovl_tensor *lm) {
    if (!embed) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s' is missing", tovl_safetensors_path(embed_file),
                          EMBED_TENSOR);
    }
    bool tied = c->tie >= 0 ? c->tie == 1 : lm == NULL;
    if (!tied && !lm) {
        return tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s' is missing, and %s says tie_word_embeddings false",
                          tovl_safetensors_path(embed_file), LMHEAD_TENSOR, config_path);
    }
    if (padded_vocab != 0 && padded_vocab < c->vocab) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: padded vocab %u is below vocab_size %u", config_path,
                          padded_vocab, c->vocab);
    }
    tovl_status st = load_matrix(embed_file, embed, c, config_path, &m->embed, &m->embed_owned);
    if (st == TOVL_OK && !tied) {
        st = load_matrix(lm_file, lm, c, config_path, &m->lmhead, &m->lmhead_owned);
    }
    if (st != TOVL_OK) {
        return st;
    }
    if (tied) {
        m->lmhead = m->embed;
    }
    m->zero_row = calloc(c->hidden, sizeof(uint16_t));
    if (!m->zero_row) {
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
    if (!weights) {
        st = tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: no weights file", dir);
    }
    if (st == TOVL_OK) {
        st = parse_config(config_path, config_text, config_len, &c);
    }
    if (st == TOVL_OK) {
        st = finish_model(m, config_path, &c, padded_vocab, weights, tovl_safetensors_find(weights, EMBED_TENSOR),
                          weights, tovl_safetensors_find(weights, LMHEAD_TENSOR));
    }
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

/* Open the shard(s) holding the embedding and lm_head. */
static tovl_status open_sharded(tovl_model *m, const char *index_path, const tovl_tensor **embed,
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
    const char *names[2] = {EMBED_TENSOR, LMHEAD_TENSOR};
    const tovl_tensor **found[2] = {embed, lm};
    int *which[2] = {embed_file, lm_file};
    if (!cJSON_IsObject(map)) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: field 'weight_map' is missing or not an object", index_path);
    }
    for (int i = 0; st == TOVL_OK && i < 2; i++) {
        const char *shard;
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
    if (st == TOVL_OK && !*embed) {
        st = tovl_error(TOVL_ERR_FORMAT, "%s: tensor '%s' is not in weight_map", index_path, EMBED_TENSOR);
    }
    cJSON_Delete(root);
    return st;
}

tovl_status tovl_model_open(const char *dir, uint32_t padded_vocab, tovl_model **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_model_open: out is NULL");
    }
    *out = NULL;
    if (!dir) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_model_open: dir is NULL");
    }
    tovl_model *m;
    tovl_status st = new_model(dir, &m);
    if (st != TOVL_OK) {
        return st;
    }
    char *config_path = imp_path_join(dir, "config.json");
    char *single = imp_path_join(dir, "model.safetensors");
    char *index = imp_path_join(dir, "model.safetensors.index.json");
    char *text = NULL;
    size_t len = 0;
    model_config c;
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
                embed = tovl_safetensors_find(m->files[0], EMBED_TENSOR);
                lm = tovl_safetensors_find(m->files[0], LMHEAD_TENSOR);
            }
        } else if (imp_file_exists(index)) {
            st = open_sharded(m, index, &embed, &lm, &embed_file, &lm_file);
        } else {
            st = tovl_error(TOVL_ERR_IO, "%s: no model.safetensors and no model.safetensors.index.json", dir);
        }
    }
    if (st == TOVL_OK) {
        st = finish_model(m, config_path, &c, padded_vocab, m->files[embed_file], embed, m->files[lm_file], lm);
    }
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
