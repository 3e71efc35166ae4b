/* tovl run --base MODEL_DIR --adapter DIR [--adapter DIR ...] --batch FILE --out FILE
 *          [--backend NAME] [--logits f32|bf16] [--vocab N] [--tp N] [--digest]
 *
 * Applies adapters to a batch the way an engine does: adapters go into slots
 * 0, 1, ... in order; the base embedding gather runs on the host, then the
 * embed hook on the backend; with `hidden` in the batch, the base lm_head
 * product runs on the host in f32 (the spec's dot order), then the lm_head
 * hook on the backend. With --tp N the lm_head hook runs as N tensor-parallel
 * ranks would: vLLM's split of the padded vocab (tovl_vocab_shard_range), one
 * shard set per rank patching that rank's logits shard, the shards
 * concatenated; the output is identical to --tp 1.
 *
 * Batch (safetensors): ids i32 [T]; optional slots i32 [T] (default 0, < 0 =
 * base model); optional hidden bf16 [T, hidden]. Other tensors are ignored,
 * so a fixture's expected.safetensors works as a batch.
 * Output (safetensors): embed bf16 [T, hidden]; logits [T, vocab] (f32 or
 * bf16) when hidden was given. --digest prints the SHA-256 of each output
 * tensor's bytes, so a campaign compares a real batch across machines by
 * digest (docs/CONFORMANCE.md). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "conform.h"
#include "tovl/backend.h" /* tovl_error: host-side failures report like library ones */
#include "tovl/tovl.h"

#define MAX_ADAPTERS 64

static void usage(FILE *f) {
    fprintf(f, "usage: tovl run --base MODEL_DIR --adapter DIR [--adapter DIR ...] --batch FILE --out FILE\n"
               "                [--backend NAME] [--logits f32|bf16] [--vocab N] [--tp N] [--digest]\n"
               "                [--embed-tensor NAME] [--lmhead-tensor NAME]\n"
               "  adapters go into slots 0, 1, ... in order (at most %d)\n"
               "  batch: ids i32 [T]; optional slots i32 [T] (default 0, -1 = base model); optional hidden bf16 [T,h]\n"
               "  out:   embed bf16 [T,h]; logits [T,vocab] when hidden is given (default bf16)\n"
               "  --backend NAME  cpu (default), vulkan, cuda, hip or auto\n"
               "  --vocab N       the engine's padded vocab (default: config.json vocab_size)\n"
               "  --tp N          the logits through N vocab shards (vLLM's split, pad 64), concatenated\n"
               "  --digest        print the SHA-256 of each output tensor's bytes (as written)\n"
               "  --embed-tensor NAME, --lmhead-tensor NAME\n"
               "                  the base's input embedding and lm_head tensors, where the family's names do not\n"
               "                  find them (an lm_head equal to the embedding: tied)\n",
               MAX_ADAPTERS);
}

typedef struct run_opts {
    const char *base, *batch, *out, *backend;
    const char *adapters[MAX_ADAPTERS];
    uint32_t n_adapters;
    tovl_logits_dtype logits;
    uint32_t padded_vocab;
    uint32_t tp; /* tensor-parallel ranks of the lm_head, >= 1 */
    bool digest;
    tovl_model_names names;
} run_opts;

/* 0: parsed; 1: --help shown; 2: bad usage (message printed). */
static int parse_args(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->logits = TOVL_LOGITS_BF16;
    o->tp = 1;
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"base", required_argument, NULL, 'b'},
                                         {"adapter", required_argument, NULL, 'a'},
                                         {"batch", required_argument, NULL, 'B'},
                                         {"out", required_argument, NULL, 'o'},
                                         {"backend", required_argument, NULL, 'k'},
                                         {"logits", required_argument, NULL, 'l'},
                                         {"vocab", required_argument, NULL, 'v'},
                                         {"tp", required_argument, NULL, 't'},
                                         {"digest", no_argument, NULL, 'd'},
                                         {"embed-tensor", required_argument, NULL, 'E'},
                                         {"lmhead-tensor", required_argument, NULL, 'L'},
                                         {NULL, 0, NULL, 0}};
    tovl_cli_getopt_start();
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        const char *v = optarg;
        if (c == 'h') {
            usage(stdout);
            return 1;
        } else if (c == 'b') {
            o->base = v;
        } else if (c == 'B') {
            o->batch = v;
        } else if (c == 'o') {
            o->out = v;
        } else if (c == 'k') {
            o->backend = v;
        } else if (c == 'd') {
            o->digest = true;
        } else if (c == 'E') {
            o->names.embed_tensor = v;
        } else if (c == 'L') {
            o->names.lmhead_tensor = v;
        } else if (c == 'a') {
            if (o->n_adapters == MAX_ADAPTERS) {
                fprintf(stderr, "tovl run: more than %d adapters\n", MAX_ADAPTERS);
                return 2;
            }
            o->adapters[o->n_adapters++] = v;
        } else if (c == 'l') {
            if (strcmp(v, "f32") == 0) {
                o->logits = TOVL_LOGITS_F32;
            } else if (strcmp(v, "bf16") == 0) {
                o->logits = TOVL_LOGITS_BF16;
            } else {
                fprintf(stderr, "tovl run: --logits '%s': expected f32 or bf16\n", v);
                return 2;
            }
        } else if (c == 'v' || c == 't') {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(v, &end, 10);
            const bool tp = c == 't';
            if (errno || end == v || *end || v[0] == '-' || n > UINT32_MAX || (tp && (n == 0 || n > TOVL_CLI_TP_MAX))) {
                fprintf(stderr, tp ? "tovl run: --tp '%s' is not a rank count in 1 .. %d\n"
                                   : "tovl run: --vocab '%s' is not a non-negative integer\n",
                        v, TOVL_CLI_TP_MAX);
                return 2;
            }
            *(tp ? &o->tp : &o->padded_vocab) = (uint32_t)n;
        } else {
            return tovl_cli_bad_option("tovl run", c, argv, opts, usage);
        }
    }
    if (tovl_cli_no_operands("tovl run", argc, argv, usage)) {
        return 2;
    }
    if (!o->base || !o->batch || !o->out) {
        fprintf(stderr, "tovl run: --base, --batch and --out are required\n");
        usage(stderr);
        return 2;
    }
    return 0;
}

/* The batch's tensors, validated against the model and the slot count. */
typedef struct batch {
    tovl_safetensors *file;
    uint32_t T;
    uint32_t *ids;        /* [T], each < vocab */
    int32_t *slots;       /* [T] */
    const tovl_tensor *hidden; /* bf16 [T, h] or NULL */
    uint16_t *hidden_rows;     /* an aligned copy */
} batch;

static void batch_free(batch *b) {
    free(b->ids);
    free(b->slots);
    free(b->hidden_rows);
    tovl_safetensors_close(b->file);
    memset(b, 0, sizeof *b);
}

/* Prints the one-line error itself; returns false on bad input. */
static bool load_batch(const char *path, const tovl_model_info *mi, uint32_t n_adapters, batch *b) {
    if (tovl_safetensors_open(path, &b->file) != TOVL_OK) {
        fprintf(stderr, "tovl run: %s\n", tovl_last_error());
        return false;
    }
    const tovl_tensor *ids = tovl_safetensors_find(b->file, "ids");
    const tovl_tensor *slots = tovl_safetensors_find(b->file, "slots");
    b->hidden = tovl_safetensors_find(b->file, "hidden");
    if (!ids) {
        fprintf(stderr, "tovl run: %s: tensor 'ids' is missing (i32 [T])\n", path);
        return false;
    }
    if (strcmp(ids->dtype, "I32") != 0 || ids->ndim != 1 || ids->shape[0] == 0 || ids->shape[0] > INT32_MAX) {
        fprintf(stderr, "tovl run: %s: tensor 'ids': dtype %s rank %u, expected i32 [T] with T >= 1\n", path,
                ids->dtype, ids->ndim);
        return false;
    }
    b->T = (uint32_t)ids->shape[0];
    b->ids = malloc((size_t)b->T * sizeof *b->ids);
    b->slots = malloc((size_t)b->T * sizeof *b->slots);
    if (!b->ids || !b->slots) {
        fprintf(stderr, "tovl run: out of memory for %u rows\n", b->T);
        return false;
    }
    for (uint32_t t = 0; t < b->T; t++) {
        int32_t id;
        memcpy(&id, (const char *)ids->data + (size_t)t * 4u, 4);
        if (id < 0 || (uint32_t)id >= mi->vocab) {
            fprintf(stderr, "tovl run: %s: tensor 'ids': ids[%u] = %d is outside the vocab 0..%u\n", path, t, id,
                    mi->vocab - 1);
            return false;
        }
        b->ids[t] = (uint32_t)id;
        b->slots[t] = 0;
    }
    if (slots) {
        if (strcmp(slots->dtype, "I32") != 0 || slots->ndim != 1 || slots->shape[0] != b->T) {
            fprintf(stderr, "tovl run: %s: tensor 'slots': dtype %s rank %u, expected i32 [%u] like 'ids'\n", path,
                    slots->dtype, slots->ndim, b->T);
            return false;
        }
        for (uint32_t t = 0; t < b->T; t++) {
            memcpy(&b->slots[t], (const char *)slots->data + (size_t)t * 4u, 4);
            if (b->slots[t] >= 0 && (uint32_t)b->slots[t] >= n_adapters) {
                fprintf(stderr, "tovl run: %s: tensor 'slots': slots[%u] = %d, but only %u adapter%s given\n", path, t,
                        b->slots[t], n_adapters, n_adapters == 1 ? " was" : "s were");
                return false;
            }
        }
    } else if (n_adapters == 0) {
        for (uint32_t t = 0; t < b->T; t++) {
            b->slots[t] = -1; /* no adapter: the base model */
        }
    }
    if (b->hidden) {
        const tovl_tensor *h = b->hidden;
        if (strcmp(h->dtype, "BF16") != 0 || h->ndim != 2) {
            fprintf(stderr, "tovl run: %s: tensor 'hidden': dtype %s rank %u, expected bf16 [T, hidden]\n", path,
                    h->dtype, h->ndim);
            return false;
        }
        if (h->shape[1] != mi->hidden) {
            fprintf(stderr, "tovl run: %s: tensor 'hidden': width %llu, but the base model's hidden_size is %u\n",
                    path, (unsigned long long)h->shape[1], mi->hidden);
            return false;
        }
        if (h->shape[0] != b->T) {
            fprintf(stderr, "tovl run: %s: tensor 'hidden': %llu rows, but 'ids' has %u\n", path,
                    (unsigned long long)h->shape[0], b->T);
            return false;
        }
        b->hidden_rows = malloc((size_t)b->T * mi->hidden * sizeof *b->hidden_rows);
        if (!b->hidden_rows) {
            fprintf(stderr, "tovl run: out of memory for the hidden states\n");
            return false;
        }
        memcpy(b->hidden_rows, h->data, (size_t)b->T * mi->hidden * sizeof *b->hidden_rows);
    }
    return true;
}

/* Progress on stderr, once the run has taken more than a second. */
static double seconds_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

static void progress(const struct timespec *t0, bool always, const char *fmt, ...) {
    const double s = seconds_since(t0);
    if (always || s > 1.0) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "tovl run: %.1f s: ", s);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
}

/* Device buffers of one run; all freed by run_free. */
typedef struct run_state {
    tovl_backend *be;
    tovl_overlay_kernels k;
    tovl_model *model;
    tovl_adapter *adapters[MAX_ADAPTERS];
    tovl_embed_overlay *overlays[MAX_ADAPTERS];
    tovl_token_overlay_set *set;
    tovl_devptr d_embed, d_ids, d_slots, d_hidden;
    uint16_t *embed;
    void *logits;
    float *base_logits;
    struct timespec start;
} run_state;

static void run_free(run_state *r, uint32_t n) {
    if (r->be) {
        tovl_devptr bufs[] = {r->d_embed, r->d_ids, r->d_slots, r->d_hidden};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
            if (bufs[i]) {
                tovl_free(r->be, bufs[i]);
            }
        }
    }
    tovl_token_overlay_set_destroy(r->set);
    for (uint32_t i = 0; i < n; i++) {
        tovl_embed_overlay_release(r->overlays[i]);
        tovl_adapter_close(r->adapters[i]);
    }
    tovl_backend_close(r->be);
    tovl_model_close(r->model);
    free(r->embed);
    free(r->logits);
    free(r->base_logits);
}

static tovl_status upload_new(tovl_backend *be, const void *src, size_t bytes, tovl_devptr *dst) {
    tovl_status st = tovl_alloc(be, bytes, dst);
    if (st == TOVL_OK) {
        st = tovl_upload(be, *dst, src, bytes);
    }
    return st;
}

/* The embedding: base gather on the host, then the embed hook. */
static tovl_status run_embed(run_state *r, const batch *b) {
    const tovl_model_info *mi = tovl_model_get_info(r->model);
    size_t row = (size_t)mi->hidden * sizeof(uint16_t);
    r->embed = malloc((size_t)b->T * row);
    if (!r->embed) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "out of host memory for the embeddings");
    }
    for (uint32_t t = 0; t < b->T; t++) {
        memcpy(r->embed + (size_t)t * mi->hidden, tovl_model_embed_row(r->model, b->ids[t]), row);
    }
    if (!r->set) {
        return TOVL_OK;
    }
    tovl_status st = upload_new(r->be, r->embed, (size_t)b->T * row, &r->d_embed);
    if (st == TOVL_OK) {
        st = upload_new(r->be, b->ids, (size_t)b->T * sizeof *b->ids, &r->d_ids);
    }
    if (st == TOVL_OK) {
        st = upload_new(r->be, b->slots, (size_t)b->T * sizeof *b->slots, &r->d_slots);
    }
    if (st == TOVL_OK) {
        tovl_embed_hook_args args = {.hidden = r->d_embed, .token_ids = r->d_ids, .slots = r->d_slots,
                                     .active_slot = -1, .T = b->T, .hidden_size = mi->hidden};
        st = tovl_embed_hook(r->set, &r->k, &args, NULL);
    }
    if (st == TOVL_OK) {
        st = tovl_synchronize(r->be, NULL);
    }
    if (st == TOVL_OK) {
        st = tovl_download(r->be, r->embed, r->d_embed, (size_t)b->T * row);
    }
    return st;
}

/* The lm_head hook of `set` on logits columns [start, end) of the served vocab,
 * as one rank's logits shard [T, end - start] (columns past the vocab are
 * engine padding: zero, and dropped again); the patched columns go back into
 * r->logits. The unsharded set is the shard [0, vocab). */
static tovl_status hook_columns(run_state *r, const batch *b, tovl_logits_dtype dtype,
                                const tovl_token_overlay_set *set, uint32_t start, uint32_t end) {
    const uint32_t vocab = tovl_model_get_info(r->model)->vocab, width = end - start;
    const uint32_t kept = (end < vocab ? end : vocab) - start;
    const size_t elem = dtype == TOVL_LOGITS_F32 ? 4u : 2u, bytes = (size_t)b->T * width * elem;
    unsigned char *shard = calloc(bytes, 1), *all = r->logits;
    if (!shard) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "out of host memory for [%u, %u] logits", b->T, width);
    }
    for (uint32_t t = 0; t < b->T; t++) {
        memcpy(shard + (size_t)t * width * elem, all + ((size_t)t * vocab + start) * elem, (size_t)kept * elem);
    }
    tovl_devptr d_logits = 0;
    tovl_status st = upload_new(r->be, shard, bytes, &d_logits);
    if (st == TOVL_OK) {
        tovl_lmhead_hook_args args = {.logits = d_logits, .logits_dtype = dtype, .ld = width,
                                      .hidden = r->d_hidden, .slots = r->d_slots, .active_slot = -1,
                                      .T = b->T, .hidden_size = tovl_model_get_info(r->model)->hidden};
        st = tovl_lmhead_hook(set, &r->k, &args, NULL);
    }
    if (st == TOVL_OK) {
        st = tovl_synchronize(r->be, NULL);
    }
    if (st == TOVL_OK) {
        st = tovl_download(r->be, shard, d_logits, bytes);
    }
    for (uint32_t t = 0; st == TOVL_OK && t < b->T; t++) {
        memcpy(all + ((size_t)t * vocab + start) * elem, shard + (size_t)t * width * elem, (size_t)kept * elem);
    }
    if (d_logits) {
        tovl_free(r->be, d_logits);
    }
    free(shard);
    return st;
}

/* The lm_head hook as `tp` ranks: vLLM's split of the padded vocab, one shard
 * set per rank. A rank whose shard starts past the vocab holds padding only:
 * it has no cell and no set. */
static tovl_status hook_tensor_parallel(run_state *r, const batch *b, tovl_logits_dtype dtype, uint32_t tp) {
    const tovl_model_info *mi = tovl_model_get_info(r->model);
    tovl_status st = TOVL_OK;
    for (uint32_t rank = 0; st == TOVL_OK && rank < tp; rank++) {
        uint32_t start, end;
        st = tovl_vocab_shard_range(mi->vocab, tp, rank, 0, &start, &end);
        if (st != TOVL_OK || start >= mi->vocab) {
            continue;
        }
        tovl_token_overlay_set *shard = NULL;
        st = tovl_token_overlay_set_from_slots_shard(r->be, r->overlays, tovl_token_overlay_set_max_loras(r->set),
                                                     mi->tied, start, end, &shard);
        if (st == TOVL_OK) {
            st = hook_columns(r, b, dtype, shard, start, end);
        }
        tovl_token_overlay_set_destroy(shard);
    }
    return st;
}

/* The logits: base product on the host (f32), then the lm_head hook (as `tp`
 * tensor-parallel ranks when tp > 1). */
static tovl_status run_logits(run_state *r, const batch *b, tovl_logits_dtype dtype, uint32_t tp) {
    const tovl_model_info *mi = tovl_model_get_info(r->model);
    size_t cells = (size_t)b->T * mi->vocab;
    size_t elem = dtype == TOVL_LOGITS_F32 ? 4u : 2u;
    r->base_logits = malloc(cells * sizeof *r->base_logits);
    r->logits = malloc(cells * elem);
    if (!r->base_logits || !r->logits) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "out of host memory for [%u, %u] logits", b->T, mi->vocab);
    }
    /* In groups of 32 rows (the product reads each lm_head row once per
     * group), so a long product shows its progress. */
    const uint32_t group = 32;
    const double macs = (double)b->T * mi->vocab * mi->hidden;
    progress(&r->start, macs >= 0x1p33, "base lm_head product: [%u, %u] logits, hidden %u, on the host ...", b->T,
             mi->vocab, mi->hidden);
    tovl_status st = TOVL_OK;
    for (uint32_t t = 0; t < b->T && st == TOVL_OK; t += group) {
        const uint32_t n = b->T - t < group ? b->T - t : group;
        st = tovl_model_lmhead_product(r->model, b->hidden_rows + (size_t)t * mi->hidden, n,
                                       r->base_logits + (size_t)t * mi->vocab);
        progress(&r->start, false, "base lm_head product: %u of %u rows", t + n, b->T);
    }
    if (st != TOVL_OK) {
        return st;
    }
    if (dtype == TOVL_LOGITS_F32) {
        memcpy(r->logits, r->base_logits, cells * sizeof(float));
    } else {
        uint16_t *out = r->logits;
        for (size_t i = 0; i < cells; i++) {
            out[i] = tovl_f32_to_bf16(r->base_logits[i]);
        }
    }
    if (!r->set) {
        return TOVL_OK;
    }
    size_t hidden_bytes = (size_t)b->T * mi->hidden * sizeof(uint16_t);
    st = upload_new(r->be, b->hidden_rows, hidden_bytes, &r->d_hidden);
    if (st == TOVL_OK && !r->d_slots) {
        st = upload_new(r->be, b->slots, (size_t)b->T * sizeof *b->slots, &r->d_slots);
    }
    if (st == TOVL_OK) {
        st = tp > 1 ? hook_tensor_parallel(r, b, dtype, tp) : hook_columns(r, b, dtype, r->set, 0, mi->vocab);
    }
    return st;
}

static tovl_status write_output(const run_opts *o, run_state *r, const batch *b) {
    const tovl_model_info *mi = tovl_model_get_info(r->model);
    uint64_t embed_shape[2] = {b->T, mi->hidden};
    uint64_t logits_shape[2] = {b->T, mi->vocab};
    tovl_tensor out[2] = {
        {.name = "embed", .dtype = "BF16", .ndim = 2, .shape = embed_shape, .data = r->embed},
        {.name = "logits", .dtype = o->logits == TOVL_LOGITS_F32 ? "F32" : "BF16", .ndim = 2, .shape = logits_shape,
         .data = r->logits},
    };
    const char *meta[] = {"producer", "tovl run", "backend", tovl_backend_name(r->be)};
    return tovl_safetensors_write(o->out, out, b->hidden ? 2 : 1, meta, 2);
}

/* --digest: the SHA-256 of the bytes of each tensor written (little-endian,
 * row-major, as in the safetensors file). */
static void print_digests(const run_opts *o, const run_state *r, const batch *b) {
    const tovl_model_info *mi = tovl_model_get_info(r->model);
    char hex[TOVL_SHA256_HEX];
    tovl_sha256_hex(r->embed, (size_t)b->T * mi->hidden * sizeof(uint16_t), hex);
    printf("sha256 embed  %s\n", hex);
    if (b->hidden) {
        tovl_sha256_hex(r->logits, (size_t)b->T * mi->vocab * (o->logits == TOVL_LOGITS_F32 ? 4u : 2u), hex);
        printf("sha256 logits %s\n", hex);
    }
}

int tovl_cmd_run(int argc, char **argv) {
    run_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) {
        return prc == 1 ? 0 : 2;
    }
    run_state r;
    memset(&r, 0, sizeof r);
    clock_gettime(CLOCK_MONOTONIC, &r.start);
    batch b;
    memset(&b, 0, sizeof b);
    int rc = 2;
    tovl_status st = tovl_model_open_named(o.base, o.padded_vocab, &o.names, &r.model);
    if (st == TOVL_OK) {
        st = tovl_backend_open(o.backend, &r.be);
    }
    if (st == TOVL_OK) {
        r.k = tovl_overlay_kernels_resolve(r.be);
    }
    for (uint32_t i = 0; st == TOVL_OK && i < o.n_adapters; i++) {
        st = tovl_adapter_open(o.adapters[i], &r.adapters[i]);
        tovl_adapter_rows *rows = NULL;
        if (st == TOVL_OK) {
            st = tovl_adapter_resolve(r.be, &r.k, r.adapters[i], r.model, &rows);
        }
        if (st == TOVL_OK) {
            const tovl_adapter_rows_info *ri = tovl_adapter_rows_get_info(rows);
            for (size_t w = 0; w < ri->warning_count; w++) {
                fprintf(stderr, "tovl run: warning: %s: %s\n", o.adapters[i], ri->warnings[w]);
            }
            st = tovl_build_overlay(r.be, &r.k, &ri->desc, &r.overlays[i]);
        }
        tovl_adapter_rows_free(rows);
    }
    if (st == TOVL_OK && o.n_adapters > 0) {
        st = tovl_token_overlay_set_from_slots(r.be, r.overlays, o.n_adapters, tovl_model_get_info(r.model)->tied,
                                               &r.set);
    }
    if (st == TOVL_OK) {
        progress(&r.start, false, "model and %u adapter%s open", o.n_adapters, o.n_adapters == 1 ? "" : "s");
    }
    if (st != TOVL_OK) {
        fprintf(stderr, "tovl run: %s\n", tovl_last_error());
    } else if (load_batch(o.batch, tovl_model_get_info(r.model), o.n_adapters, &b)) {
        st = run_embed(&r, &b);
        if (st == TOVL_OK && b.hidden) {
            st = run_logits(&r, &b, o.logits, o.tp);
        }
        if (st == TOVL_OK) {
            st = write_output(&o, &r, &b);
        }
        if (st != TOVL_OK) {
            fprintf(stderr, "tovl run: %s\n", tovl_last_error());
        } else {
            const tovl_model_info *mi = tovl_model_get_info(r.model);
            printf("tovl run: backend %s, %u adapter%s, T %u: embed [%u, %u]", tovl_backend_name(r.be), o.n_adapters,
                   o.n_adapters == 1 ? "" : "s", b.T, b.T, mi->hidden);
            if (b.hidden) {
                printf(", logits [%u, %u] %s", b.T, mi->vocab, o.logits == TOVL_LOGITS_F32 ? "f32" : "bf16");
                if (o.tp > 1) {
                    printf(" through %u vocab shards", o.tp);
                }
            }
            printf(" -> %s\n", o.out);
            if (o.digest) {
                print_digests(&o, &r, &b);
            }
            rc = 0;
        }
    }
    batch_free(&b);
    run_free(&r, o.n_adapters);
    return rc;
}
