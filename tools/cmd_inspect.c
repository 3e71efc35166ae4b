/* tovl inspect ADAPTER_DIR [--base MODEL_DIR] [--vocab N] [--backend NAME] [--tp N] [--json]
 *
 * Describes an adapter folder: the format found, the tensors the overlay rows
 * come from, and, with --base, the overlaid ids of the embedding and of the
 * lm_head as PEFT computes them for that model (full matrices are compared
 * with the base on the backend, cpu by default), the tied-model rule applied
 * and the sizes; with --tp N, how many lm_head cells each of N tensor-parallel
 * ranks' shard sets holds (vLLM's split of the padded vocab). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "cli.h"
#include "tovl/backend.h" /* tovl_error: host-side failures report like library ones */
#include "tovl/tovl.h"

static void usage(FILE *f) {
    fprintf(f, "usage: tovl inspect ADAPTER_DIR [--base MODEL_DIR] [--vocab N] [--backend NAME] [--tp N] [--json]\n"
               "                    [--embed-tensor NAME] [--lmhead-tensor NAME]\n"
               "  --base MODEL_DIR  resolve against this base model: overlaid ids, tied handling, sizes\n"
               "  --vocab N         the engine's padded vocab (default: config.json vocab_size)\n"
               "  --embed-tensor NAME, --lmhead-tensor NAME\n"
               "                    the base's input embedding and lm_head tensors, where the family's names do\n"
               "                    not find them (an lm_head equal to the embedding: tied)\n"
               "  --backend NAME    where full matrices are compared with the base (default cpu)\n"
               "  --tp N            lm_head cells per shard of N tensor-parallel ranks (needs --base)\n"
               "  --json            machine-readable output\n");
}

static const char *kind_name(tovl_adapter_source_kind k) {
    switch (k) {
    case TOVL_SOURCE_TRAINABLE_TOKENS: return "trainable_tokens";
    case TOVL_SOURCE_MODULES_TO_SAVE: return "modules_to_save";
    case TOVL_SOURCE_SAVED_BASE: return "saved_base_layer";
    case TOVL_SOURCE_VLLM_EXTRA_VOCAB: return "vllm_extra_vocab";
    }
    return "?";
}

static const char *module_name(tovl_adapter_module m) {
    return m == TOVL_MODULE_EMBED ? "embed_tokens" : "lm_head";
}

/* Parse a u32 option value. */
static bool parse_u32(const char *s, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-') {
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

static void print_ids(const uint32_t *ids, uint32_t n) {
    const uint32_t shown = 32;
    for (uint32_t i = 0; i < n && i < shown; i++) {
        printf("%s%u", i ? " " : "", ids[i]);
    }
    if (n > shown) {
        printf(" ... (%u more)", n - shown);
    }
    printf("\n");
}

/* One tensor-parallel rank's lm_head shard. */
typedef struct tp_shard {
    uint32_t start, end; /* of the padded vocab */
    uint32_t cells;      /* lm_head cells its shard set holds */
    bool padding_only;   /* starts past the vocab: no cell, no set */
} tp_shard;

/* Each rank's shard set of the adapter's overlay in slot 0 (vLLM's split,
 * pad 64): its grid.y is the cells it holds. */
static tovl_status count_shard_cells(tovl_backend *be, const tovl_adapter_rows_info *ri, uint32_t tp,
                                     tp_shard *shards) {
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_embed_overlay *ov = NULL;
    tovl_status st = tovl_build_overlay(be, &k, &ri->desc, &ov);
    for (uint32_t rank = 0; st == TOVL_OK && rank < tp; rank++) {
        tp_shard *sh = &shards[rank];
        st = tovl_vocab_shard_range(ri->desc.vocab, tp, rank, 0, &sh->start, &sh->end);
        sh->padding_only = sh->start >= ri->desc.vocab;
        if (st != TOVL_OK || sh->padding_only) {
            continue;
        }
        tovl_token_overlay_set *set = NULL;
        st = tovl_token_overlay_set_from_slots_shard(be, &ov, 1, ri->desc.tied, sh->start, sh->end, &set);
        sh->cells = tovl_token_overlay_set_max_n_override(set);
        tovl_token_overlay_set_destroy(set);
    }
    tovl_embed_overlay_release(ov);
    return st;
}

static void print_shards(const tp_shard *shards, uint32_t tp, uint32_t hidden) {
    printf("tp %u:%*svLLM's split of the padded vocab %u (pad %d), lm_head cells per shard:\n", tp,
           tp < 10 ? 5 : tp < 100 ? 4 : 3, "", shards[tp - 1].end, TOVL_VOCAB_PAD_DEFAULT);
    for (uint32_t r = 0; r < tp; r++) {
        const tp_shard *sh = &shards[r];
        printf("          rank %u [%u, %u): ", r, sh->start, sh->end);
        if (sh->padding_only) {
            printf("padding only, no cells\n");
        } else {
            printf("%u cells, %zu bytes of bf16 rows\n", sh->cells, (size_t)sh->cells * hidden * 2u);
        }
    }
}

static void print_text(const tovl_adapter_info *a, const tovl_model_info *mi, const tovl_adapter_rows_info *r,
                       const char *backend) {
    printf("adapter:  %s\nformat:   %s\n", a->dir, a->format);
    if (a->ensure_weight_tying) {
        printf("ensure_weight_tying: true\n");
    }
    printf("tensors:\n");
    for (size_t i = 0; i < a->source_count; i++) {
        const tovl_adapter_source *s = &a->sources[i];
        printf("  %-12s %-17s %s  %s [%u, %u]  in %s\n", module_name(s->module), kind_name(s->kind), s->tensor,
               s->dtype, s->rows, s->width, s->file);
        if (s->ids) {
            printf("  %-12s %-17s ids from %s: ", "", "", s->config_field);
            print_ids(s->ids, s->rows);
        }
    }
    printf("  (%zu other tensors: LoRA matrices and the like, not token overlays)\n", a->other_tensors);
    if (!mi) {
        printf("(give --base MODEL_DIR for the overlaid ids, tied handling and sizes)\n");
        return;
    }
    printf("base:     %s: vocab %u (vocab_size %u), hidden %u, %s%s\n", mi->dir, mi->vocab, mi->config_vocab,
           mi->hidden, mi->tied ? "tied" : "untied", mi->tied_inferred ? " (inferred: no tie_word_embeddings)" : "");
    printf("          %s: embedding %s (module %s), lm_head %s (module %s)\n", mi->layout, mi->embed_tensor,
           mi->embed_module, mi->lmhead_tensor ? mi->lmhead_tensor : "tied", mi->lmhead_module);
    const tovl_overlay_desc *d = &r->desc;
    size_t row_bytes = (size_t)d->hidden * 2u;
    printf("embed:    %u rows, %zu bytes of bf16 rows", d->embed.count, (size_t)d->embed.count * row_bytes);
    if (d->embed.count) {
        printf(", from %s\n          ids: ", r->embed_sources);
        print_ids(d->embed.ids, d->embed.count);
    } else {
        printf("\n");
    }
    printf("lm_head:  %s\n", r->lmhead_rule);
    if (d->has_lmhead) {
        printf("          %u rows, %zu bytes of bf16 rows", d->lmhead.count, (size_t)d->lmhead.count * row_bytes);
        if (d->lmhead.count) {
            printf(", from %s\n          ids: ", r->lmhead_sources);
            print_ids(d->lmhead.ids, d->lmhead.count);
        } else {
            printf(" (the lm_head is left alone)\n");
        }
    } else if (d->tied && d->embed.count) {
        printf("          the %u embed rows patch the lm_head too\n", d->embed.count);
    }
    for (size_t i = 0; i < r->warning_count; i++) {
        printf("warning:  %s\n", r->warnings[i]);
    }
    printf("(full matrices compared with the base on backend %s)\n", backend);
}

static cJSON *ids_json(const uint32_t *ids, uint32_t n) {
    cJSON *arr = cJSON_CreateArray();
    for (uint32_t i = 0; arr && i < n; i++) {
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    }
    return arr;
}

static int print_json(const tovl_adapter_info *a, const tovl_model_info *mi, const tovl_adapter_rows_info *r,
                      const tp_shard *shards, uint32_t tp) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "adapter", a->dir);
    cJSON_AddStringToObject(root, "format", a->format);
    cJSON_AddBoolToObject(root, "ensure_weight_tying", a->ensure_weight_tying);
    cJSON *srcs = cJSON_AddArrayToObject(root, "sources");
    for (size_t i = 0; srcs && i < a->source_count; i++) {
        const tovl_adapter_source *s = &a->sources[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "module", module_name(s->module));
        cJSON_AddStringToObject(o, "kind", kind_name(s->kind));
        cJSON_AddStringToObject(o, "file", s->file);
        cJSON_AddStringToObject(o, "tensor", s->tensor);
        cJSON_AddStringToObject(o, "dtype", s->dtype);
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(s->rows));
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(s->width));
        if (s->ids) {
            cJSON_AddStringToObject(o, "config_field", s->config_field);
            cJSON_AddItemToObject(o, "ids", ids_json(s->ids, s->rows));
        }
        cJSON_AddItemToArray(srcs, o);
    }
    cJSON_AddNumberToObject(root, "other_tensors", (double)a->other_tensors);
    if (mi) {
        cJSON *b = cJSON_AddObjectToObject(root, "base");
        cJSON_AddStringToObject(b, "dir", mi->dir);
        cJSON_AddNumberToObject(b, "vocab", mi->vocab);
        cJSON_AddNumberToObject(b, "vocab_size", mi->config_vocab);
        cJSON_AddNumberToObject(b, "hidden", mi->hidden);
        cJSON_AddBoolToObject(b, "tied", mi->tied);
        cJSON_AddBoolToObject(b, "tied_inferred", mi->tied_inferred);
        cJSON_AddStringToObject(b, "layout", mi->layout);
        cJSON_AddStringToObject(b, "embed_tensor", mi->embed_tensor);
        cJSON_AddStringToObject(b, "embed_module", mi->embed_module);
        if (mi->lmhead_tensor) {
            cJSON_AddStringToObject(b, "lmhead_tensor", mi->lmhead_tensor);
        } else {
            cJSON_AddNullToObject(b, "lmhead_tensor");
        }
        cJSON_AddStringToObject(b, "lmhead_module", mi->lmhead_module);
        const tovl_overlay_desc *d = &r->desc;
        cJSON *e = cJSON_AddObjectToObject(root, "embed");
        cJSON_AddNumberToObject(e, "count", d->embed.count);
        cJSON_AddNumberToObject(e, "bytes", (double)d->embed.count * d->hidden * 2.0);
        cJSON_AddItemToObject(e, "ids", ids_json(d->embed.ids, d->embed.count));
        cJSON_AddStringToObject(e, "sources", r->embed_sources);
        cJSON *l = cJSON_AddObjectToObject(root, "lm_head");
        cJSON_AddStringToObject(l, "rule", r->lmhead_rule);
        cJSON_AddBoolToObject(l, "own_part", d->has_lmhead);
        cJSON_AddBoolToObject(l, "follows_embed", !d->has_lmhead && d->tied);
        const uint32_t *lids = d->has_lmhead ? d->lmhead.ids : (d->tied ? d->embed.ids : NULL);
        uint32_t ln = d->has_lmhead ? d->lmhead.count : (d->tied ? d->embed.count : 0);
        cJSON_AddNumberToObject(l, "count", ln);
        cJSON_AddNumberToObject(l, "bytes", d->has_lmhead ? (double)d->lmhead.count * d->hidden * 2.0 : 0.0);
        cJSON_AddItemToObject(l, "ids", ids_json(lids, ln));
        cJSON_AddStringToObject(l, "sources", d->has_lmhead ? r->lmhead_sources : (d->tied ? r->embed_sources : ""));
        if (tp > 0) {
            cJSON *t = cJSON_AddObjectToObject(root, "tp");
            cJSON_AddNumberToObject(t, "world_size", tp);
            cJSON_AddNumberToObject(t, "padded_vocab", shards[tp - 1].end);
            cJSON_AddNumberToObject(t, "pad_multiple", TOVL_VOCAB_PAD_DEFAULT);
            cJSON *arr = cJSON_AddArrayToObject(t, "shards");
            for (uint32_t i = 0; arr && i < tp; i++) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddNumberToObject(o, "rank", i);
                cJSON_AddNumberToObject(o, "start", shards[i].start);
                cJSON_AddNumberToObject(o, "end", shards[i].end);
                cJSON_AddBoolToObject(o, "padding_only", shards[i].padding_only);
                cJSON_AddNumberToObject(o, "lmhead_cells", shards[i].cells);
                cJSON_AddNumberToObject(o, "bytes", (double)shards[i].cells * d->hidden * 2.0);
                cJSON_AddItemToArray(arr, o);
            }
        }
        cJSON *w = cJSON_AddArrayToObject(root, "warnings");
        for (size_t i = 0; w && i < r->warning_count; i++) {
            cJSON_AddItemToArray(w, cJSON_CreateString(r->warnings[i]));
        }
    }
    char *text = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "tovl inspect: out of memory writing JSON\n");
        return 2;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

int tovl_cmd_inspect(int argc, char **argv) {
    const char *adapter_dir = NULL, *base_dir = NULL, *backend_name = "cpu";
    uint32_t padded = 0, tp = 0;
    bool json = false;
    tovl_model_names names = {0};
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"base", required_argument, NULL, 'b'},
                                         {"vocab", required_argument, NULL, 'v'},
                                         {"backend", required_argument, NULL, 'B'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"tp", required_argument, NULL, 't'},
                                         {"embed-tensor", required_argument, NULL, 'E'},
                                         {"lmhead-tensor", required_argument, NULL, 'L'},
                                         {NULL, 0, NULL, 0}};
    tovl_cli_getopt_start();
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case 'j':
            json = true;
            break;
        case 'b':
            base_dir = optarg;
            break;
        case 'E':
            names.embed_tensor = optarg;
            break;
        case 'L':
            names.lmhead_tensor = optarg;
            break;
        case 'B':
            backend_name = optarg;
            break;
        case 'v':
            if (!parse_u32(optarg, &padded)) {
                fprintf(stderr, "tovl inspect: --vocab '%s' is not a non-negative integer\n", optarg);
                return 2;
            }
            break;
        case 't':
            if (!parse_u32(optarg, &tp) || tp == 0 || tp > TOVL_CLI_TP_MAX) {
                fprintf(stderr, "tovl inspect: --tp '%s' is not a rank count in 1 .. %d\n", optarg, TOVL_CLI_TP_MAX);
                return 2;
            }
            break;
        default:
            return tovl_cli_bad_option("tovl inspect", c, argv, opts, usage);
        }
    }
    if (optind < argc) {
        adapter_dir = argv[optind++]; /* the one operand */
    }
    if (!adapter_dir) {
        usage(stderr);
        return 2;
    }
    if (tovl_cli_no_operands("tovl inspect", argc, argv, usage)) {
        return 2;
    }
    if ((names.embed_tensor || names.lmhead_tensor) && !base_dir) {
        fprintf(stderr, "tovl inspect: --embed-tensor and --lmhead-tensor need --base MODEL_DIR\n");
        return 2;
    }
    if (tp > 0 && !base_dir) {
        fprintf(stderr, "tovl inspect: --tp needs --base MODEL_DIR (the shards cut the model's vocab)\n");
        return 2;
    }
    tovl_adapter *adapter = NULL;
    tovl_model *model = NULL;
    tp_shard *shards = NULL;
    tovl_backend *be = NULL;
    tovl_adapter_rows *rows = NULL;
    tovl_status st = tovl_adapter_open(adapter_dir, &adapter);
    if (st == TOVL_OK && base_dir) {
        st = tovl_model_open_named(base_dir, padded, &names, &model);
    }
    if (st == TOVL_OK && model) {
        st = tovl_backend_open(backend_name, &be);
    }
    if (st == TOVL_OK && model) {
        tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
        st = tovl_adapter_resolve(be, &k, adapter, model, &rows);
    }
    if (st == TOVL_OK && tp > 0) {
        shards = calloc(tp, sizeof *shards);
        st = shards ? count_shard_cells(be, tovl_adapter_rows_get_info(rows), tp, shards)
                    : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "out of host memory for %u shards", tp);
    }
    int rc;
    if (st != TOVL_OK) {
        fprintf(stderr, "tovl inspect: %s\n", tovl_last_error());
        rc = 2;
    } else {
        const tovl_adapter_info *ai = tovl_adapter_get_info(adapter);
        const tovl_model_info *mi = model ? tovl_model_get_info(model) : NULL;
        const tovl_adapter_rows_info *ri = rows ? tovl_adapter_rows_get_info(rows) : NULL;
        if (json) {
            rc = print_json(ai, mi, ri, shards, tp);
        } else {
            print_text(ai, mi, ri, backend_name);
            if (tp > 0) {
                print_shards(shards, tp, mi->hidden);
            }
            rc = 0;
        }
    }
    free(shards);
    tovl_adapter_rows_free(rows);
    tovl_backend_close(be);
    tovl_model_close(model);
    tovl_adapter_close(adapter);
    return rc;
}
