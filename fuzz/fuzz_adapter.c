/* libFuzzer target: adapter folders and base models from memory.
 *
 * Input: mode byte, u32 little-endian length L, L bytes of JSON (an
 * adapter_config.json, or a model's config.json), then the bytes of one
 * safetensors file (adapter_model.safetensors, new_embeddings.safetensors or
 * model.safetensors). Mode bits:
 *   0: the model is tied          1: the served vocab is padded to 136
 *   2: the file is vLLM's new_embeddings.safetensors
 *   3: no adapter_config.json     4: base model mode (config.json + weights)
 * Adapters are resolved and built against a fixed model of vocab 131 and
 * hidden 24 (the size of tests/fixtures/peft_extra, where the seeds come
 * from) on the CPU backend, so the whole import path runs: config parsing,
 * tensor roles, tied rules, rowdiff of full matrices, overlay validation. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import_internal.h"
#include "tovl/tovl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { VOCAB = 131, HIDDEN = 24, PADDED = 136 };

static tovl_backend *cpu;
static tovl_overlay_kernels kernels;
static tovl_model *models[4]; /* [tied + 2 * padded] */
static unsigned char *model_bytes[2];

/* A deterministic model: config text + safetensors bytes built in memory. */
static tovl_model *make_model(bool tied, uint32_t padded) {
    static uint16_t rows[2][VOCAB * HIDDEN];
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int m = 0; m < 2; m++) {
        for (int i = 0; i < VOCAB * HIDDEN; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            rows[m][i] = tovl_f32_to_bf16((float)((int)(state >> 40) % 2001 - 1000) / 25000.0f);
        }
    }
    /* The header, then the data. */
    char header[512];
    size_t bytes = (size_t)VOCAB * HIDDEN * 2;
    int hl = tied ? snprintf(header, sizeof header,
                             "{\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]}}",
                             VOCAB, HIDDEN, bytes)
                  : snprintf(header, sizeof header,
                             "{\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]},"
                             "\"lm_head.weight\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}}",
                             VOCAB, HIDDEN, bytes, VOCAB, HIDDEN, bytes, 2 * bytes);
    size_t total = 8 + (size_t)hl + (tied ? 1 : 2) * bytes;
    unsigned char *buf = malloc(total);
    if (!buf) {
        abort();
    }
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    }
    memcpy(buf + 8, header, (size_t)hl);
    memcpy(buf + 8 + hl, rows[0], bytes);
    if (!tied) {
        memcpy(buf + 8 + hl + bytes, rows[1], bytes);
    }
    model_bytes[tied] = buf;
    char config[256];
    int cl = snprintf(config, sizeof config, "{\"vocab_size\": %d, \"hidden_size\": %d, \"tie_word_embeddings\": %s}",
                      VOCAB, HIDDEN, tied ? "true" : "false");
    tovl_safetensors *st;
    tovl_model *model;
    if (tovl_safetensors_open_memory(buf, total, "model.safetensors", &st) != TOVL_OK ||
        imp_model_from_parts("model", "config.json", config, (size_t)cl, st, padded, &model) != TOVL_OK) {
        fprintf(stderr, "fuzz_adapter: cannot build the fixed model: %s\n", tovl_last_error());
        abort();
    }
    return model;
}

static void init(void) {
    if (cpu) {
        return;
    }
    if (tovl_backend_open("cpu", &cpu) != TOVL_OK) {
        abort();
    }
    kernels = tovl_overlay_kernels_resolve(cpu);
    for (int i = 0; i < 4; i++) {
        models[i] = make_model(i & 1, (i & 2) ? PADDED : 0);
    }
}

static void fuzz_model(const char *config, size_t config_len, tovl_safetensors *weights, uint32_t padded) {
    tovl_model *m = NULL;
    if (imp_model_from_parts("fuzz-model", "config.json", config, config_len, weights, padded, &m) != TOVL_OK) {
        if (m) {
            abort();
        }
        return;
    }
    const tovl_model_info *mi = tovl_model_get_info(m);
    /* One row of the base product, when small enough to be quick. */
    if ((uint64_t)mi->vocab * mi->hidden <= (1u << 18)) {
        uint16_t *hidden = calloc(mi->hidden, sizeof *hidden);
        float *logits = malloc((size_t)mi->vocab * sizeof *logits);
        if (hidden && logits && tovl_model_lmhead_product(m, hidden, 1, logits) != TOVL_OK) {
            abort();
        }
        free(hidden);
        free(logits);
    }
    tovl_model_close(m);
}

static void fuzz_adapter(unsigned mode, const char *config, size_t config_len, tovl_safetensors *file) {
    /* The config parser on its own first. */
    if (config) {
        imp_adapter_config cfg;
        if (imp_adapter_config_parse(config, config_len, "adapter_config.json", &cfg) == TOVL_OK) {
            imp_adapter_config_free(&cfg);
        }
    }
    tovl_safetensors *peft = (mode & 4) ? NULL : file, *vllm = (mode & 4) ? file : NULL;
    tovl_adapter *a = NULL;
    if (imp_adapter_from_parts("fuzz-adapter", "adapter_config.json", config, config_len, peft, vllm, &a) != TOVL_OK) {
        if (a) {
            abort();
        }
        return;
    }
    tovl_model *model = models[(mode & 1) + ((mode & 2) ? 2 : 0)];
    tovl_embed_overlay *ov = NULL;
    if (tovl_adapter_build_overlay(cpu, &kernels, a, model, &ov) == TOVL_OK) {
        tovl_embed_overlay_view v = tovl_embed_overlay_get_view(ov);
        if (v.vocab != tovl_model_get_info(model)->vocab) {
            abort();
        }
        tovl_embed_overlay_release(ov);
    } else if (ov) {
        abort();
    }
    tovl_adapter_close(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init();
    if (size < 5) {
        return 0;
    }
    unsigned mode = data[0];
    uint32_t len = (uint32_t)data[1] | (uint32_t)data[2] << 8 | (uint32_t)data[3] << 16 | (uint32_t)data[4] << 24;
    data += 5;
    size -= 5;
    if (len > size) {
        len = (uint32_t)size;
    }
    /* The JSON text in its own allocation, so ASan sees reads past its end. */
    char *config = malloc(len ? len : 1);
    if (!config) {
        return 0;
    }
    memcpy(config, data, len);
    tovl_safetensors *file = NULL;
    if (tovl_safetensors_open_memory(data + len, size - len, "tensors.safetensors", &file) != TOVL_OK) {
        file = NULL;
    }
    if (mode & 16) {
        fuzz_model(config, len, file, (mode & 2) ? PADDED : 0);
    } else {
        fuzz_adapter(mode, (mode & 8) ? NULL : config, len, file);
    }
    free(config);
    return 0;
}
