/* Declarations shared by the files of core/import/ (and the fuzzers). Never
 * installed. The import code is plain C11: no vendor header, only cJSON. */
#ifndef TOVL_CORE_IMPORT_INTERNAL_H
#define TOVL_CORE_IMPORT_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tovl/backend.h"

/* ---- small utilities (import_util.c) ---------------------------------- */

/* A growable string; every append keeps it NUL-terminated. On allocation
 * failure `failed` is set and later appends do nothing. */
typedef struct imp_str {
    char *buf;
    size_t len, cap;
    bool failed;
} imp_str;
void imp_str_append(imp_str *s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void imp_str_vappend(imp_str *s, const char *fmt, va_list ap);
void imp_str_free(imp_str *s);

/* malloc'd "dir/name". */
char *imp_path_join(const char *dir, const char *name);
char *imp_strdup(const char *s);
bool imp_file_exists(const char *path);
/* Read a whole (small) file into a NUL-terminated buffer; TOVL_ERR_IO naming
 * the path when it cannot be read, TOVL_ERR_FORMAT when larger than max_bytes. */
tovl_status imp_read_text(const char *path, size_t max_bytes, char **out, size_t *len);

/* bf16 conversions of whole tensors: BF16 copies, F16 and F32 round to
 * nearest even (NaN becomes 0x7FC0). Reads unaligned data safely. */
bool imp_dtype_is_float_row(const char *dtype);
void imp_tensor_rows_to_bf16(const tovl_tensor *t, uint64_t first_row, uint64_t rows, uint64_t width,
                             uint16_t *dst);
float imp_f16_to_f32(uint16_t bits);

/* A JSON number that is an integer in [0, max]. */
struct cJSON;
bool imp_json_uint(const struct cJSON *item, uint64_t max, uint64_t *out);

/* ---- safetensors (safetensors.c) ---------------------------------------- */

/* Bytes per element of a safetensors dtype name; 0 when unknown. */
uint32_t imp_dtype_size(const char *dtype);

/* ---- adapter_config.json (adapter_config.c) ----------------------------- */

/* One module's trainable token ids. */
typedef struct imp_tt_entry {
    char *key;       /* the config's key ("embed_tokens", "lm_head", ...) */
    char *field;     /* "trainable_token_indices" or "trainable_token_indices.<key>" */
    int module;      /* tovl_adapter_module, or -1 for a module that is not a token overlay */
    uint32_t *ids;
    uint32_t count;
} imp_tt_entry;

typedef struct imp_adapter_config {
    bool present;            /* adapter_config.json exists */
    bool tt_is_dict;
    /* peft_type TRAINABLE_TOKENS (PEFT's standalone Trainable Tokens method):
     * `tt` then holds one entry per module of target_modules, each with the
     * ids of token_indices, and the tensors lack the "token_adapter." part. */
    bool standalone;
    imp_tt_entry *tt;        /* trainable_token_indices, one entry per module */
    size_t tt_count;
    bool mts_embed, mts_lmhead;   /* modules_to_save names embed_tokens / lm_head */
    size_t mts_other;             /* other modules_to_save entries (not token overlays) */
    bool ensure_weight_tying;
} imp_adapter_config;

/* Which module a PEFT module name or path denotes, by its last dotted
 * component (embed_tokens, embed_in, wte, ... or lm_head, embed_out); -1 for
 * anything else. */
int imp_module_of(const char *name, size_t len);
/* Whether two module paths name the same module of the text model: equal once
 * the multimodal wrappers "model." and "language_model." are skipped (the
 * transformers versions nest the same text model differently). */
bool imp_module_paths_match(const char *a, const char *b);

/* Parse and validate adapter_config.json text; `path` names it in errors. */
tovl_status imp_adapter_config_parse(const char *text, size_t len, const char *path, imp_adapter_config *out);
void imp_adapter_config_free(imp_adapter_config *cfg);

/* ---- adapters (adapter.c) ------------------------------------------------ */

/* Build an adapter from already-open parts (the folder opener and the fuzzer
 * use this). Takes ownership of `peft` and `vllm` (either may be NULL) even on
 * failure. `config_text` may be NULL (no adapter_config.json). */
tovl_status imp_adapter_from_parts(const char *dir, const char *config_path, const char *config_text,
                                   size_t config_len, tovl_safetensors *peft, tovl_safetensors *vllm,
                                   tovl_adapter **out);

/* The name of the trainable-tokens tensor PEFT saves for config entry `e`,
 * for error messages: LoRA's trainable tokens sit in a "token_adapter", the
 * standalone method's on the module itself. */
void imp_tt_tensor_name(const imp_adapter_config *c, const imp_tt_entry *e, char *buf, size_t size);

/* Internal view of one source: the public description and its tensor. */
typedef struct imp_source {
    tovl_adapter_source pub;
    const tovl_tensor *tensor;
    char *module_path; /* owned; pub.module_path points here */
} imp_source;

/* The adapter's parsed state, read by resolve.c. */
typedef struct imp_adapter_view {
    const imp_adapter_config *config;
    const char *dir;
    /* Per module: trainable-token delta (and its config entry), the
     * modules_to_save copy, a saved base layer, vLLM extra rows. NULL = none. */
    const imp_source *tt[2];
    const imp_tt_entry *tt_entry[2];
    const imp_source *mts[2];
    const imp_source *saved_base[2];
    const imp_source *vllm[2];
    /* A LoRA tensor on the module (lora_A, lora_embedding_A, ...), or NULL:
     * a dense low-rank update of every row, which the engine's LoRA applies. */
    const char *lora[2];
} imp_adapter_view;
imp_adapter_view imp_adapter_get_view(const tovl_adapter *adapter);

/* ---- models (model.c) ---------------------------------------------------- */

/* Build a model from already-parsed parts (the fuzzer uses this with a
 * config text and one safetensors file). Takes ownership of `weights`. */
tovl_status imp_model_from_parts(const char *dir, const char *config_path, const char *config_text,
                                 size_t config_len, tovl_safetensors *weights, uint32_t padded_vocab,
                                 tovl_model **out);

#endif
