/* tovl-overlay-bench: the figures issue 5 asks of the Vulkan port, taken with
 * the backend's own device clock (the time_kernel / copy_bandwidth vtable
 * members: Vulkan timestamp queries, CUDA/HIP events), so the same binary
 * gives the CUDA port's figures in the same run for comparison:
 *   - device copy bandwidth, and rowdiff over a 152064 x 4096 bf16 pair as a
 *     fraction of it (bytes moved per second, read + written);
 *   - the two hooks' kernels at T = 512 and T = 64 (h = 4096, 8 slots x 64
 *     rows, vocab 152064): median per-launch time of 100 launches recorded
 *     once (one command buffer / graph), and of one launch alone.
 * Usage: tovl-overlay-bench [--backend NAME] [--quick] [--repeats N]
 * --quick shrinks the shapes for a smoke run on lavapipe. Timing is for this
 * tool only, never a test. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tovl/backend.h"

#define CHECK(call)                                                                                   \
    do {                                                                                              \
        tovl_status st_ = (call);                                                                     \
        if (st_ != TOVL_OK) {                                                                         \
            fprintf(stderr, "bench: %s failed: %s (%s)\n", #call, tovl_status_str(st_), tovl_last_error()); \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint16_t rng_bf16(void) {
    /* magnitudes 2^-4 .. 2^3, random sign: realistic activations/weights */
    uint32_t exp = 123 + (uint32_t)(rng_next() % 8);
    return (uint16_t)(((rng_next() & 1) << 15) | (exp << 7) | (rng_next() & 0x7F));
}

static void print_timing(const char *what, const tovl_kernel_timing *t, const char *extra) {
    printf("%-34s batched %9.2f us/launch   single %9.2f us   (medians of %u)%s\n", what, t->batched_us, t->single_us,
           t->repeats, extra);
}

int main(int argc, char **argv) {
    const char *name = "vulkan";
    bool quick = false;
    uint32_t repeats = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            name = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
        } else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
            repeats = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: %s [--backend NAME] [--quick] [--repeats N]\n", argv[0]);
            return 2;
        }
    }
    tovl_backend *be = NULL;
    if (tovl_backend_open(name, &be) != TOVL_OK) {
        fprintf(stderr, "bench: %s backend unavailable: %s\n", name, tovl_last_error());
        return 2;
    }
    const tovl_backend_iface *iface = tovl_backend_get_iface(be);
    void *ctx = tovl_backend_get_context(be);
    if (!iface->time_kernel || !iface->copy_bandwidth) {
        fprintf(stderr, "bench: the %s backend has no device timing (time_kernel/copy_bandwidth)\n", name);
        tovl_backend_close(be);
        return 2;
    }
    printf("bench %s on %s\n", name, tovl_backend_device(be));
    const uint32_t vocab = quick ? 8192 : 152064, h = quick ? 1024 : 4096;
    const uint32_t batch = quick ? 10 : 100;

    /* 1. Copy bandwidth and rowdiff over a [vocab, h] bf16 pair. */
    const size_t mat_bytes = (size_t)vocab * h * 2;
    double copy_gbps = 0;
    CHECK(iface->copy_bandwidth(ctx, mat_bytes, repeats, &copy_gbps));
    printf("%-34s %9.1f GB/s (read + written, %zu bytes)\n", "copy_bandwidth", copy_gbps, mat_bytes);
    tovl_devptr a = 0, b = 0, flags = 0;
    CHECK(tovl_alloc(be, mat_bytes, &a));
    CHECK(tovl_alloc(be, mat_bytes, &b));
    CHECK(tovl_alloc(be, (size_t)vocab * 4, &flags));
    /* Equal rows: every element is read and compared (no early exit). */
    CHECK(tovl_fill_u32(be, a, 0x3F8040A0u, mat_bytes));
    CHECK(tovl_fill_u32(be, b, 0x3F8040A0u, mat_bytes));
    tovl_rowdiff_args rd = {.a = a, .b = b, .flags = flags, .rows = vocab, .h = h, .tol = 0.0f};
    uint32_t grid[3] = {vocab, 1, 1};
    tovl_kernel_timing t;
    for (int mode = 0; mode < 2; mode++) {
        rd.tol = mode ? 0.1f : 0.0f;
        CHECK(iface->time_kernel(ctx, tovl_try_kernel(be, TOVL_KERNEL_ROWDIFF), grid, &rd, sizeof rd,
                                 quick ? 3 : 10, repeats, &t));
        double gbps = 2.0 * (double)mat_bytes / (t.batched_us * 1e-6) / 1e9;
        char extra[96], what[64];
        snprintf(extra, sizeof extra, "  %.1f GB/s = %.1f%% of copy", gbps, 100.0 * gbps / copy_gbps);
        snprintf(what, sizeof what, "rowdiff %ux%u tol=%s", vocab, h, mode ? "0.1" : "0");
        print_timing(what, &t, extra);
    }
    tovl_free(be, a);
    tovl_free(be, b);
    tovl_free(be, flags);

    /* 2. The hooks' kernels: 8 slots x 64 rows (embed and own lm_head rows). */
    enum { SLOTS = 8, ROWS = 64 };
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_embed_overlay *ov[SLOTS];
    uint32_t *ids = malloc(ROWS * sizeof *ids);
    uint16_t *rows = malloc((size_t)ROWS * h * 2);
    uint32_t embed_ids[SLOTS][ROWS];
    for (int s = 0; s < SLOTS; s++) {
        for (int j = 0; j < ROWS; j++) {
            ids[j] = (uint32_t)(s * ROWS + j) * 37u % vocab; /* distinct */
            embed_ids[s][j] = ids[j];
        }
        for (size_t i = 0; i < (size_t)ROWS * h; i++) {
            rows[i] = rng_bf16();
        }
        tovl_overlay_desc d = {
            .adapter = "bench",
            .vocab = vocab,
            .hidden = h,
            .embed = {"embed", ids, rows, ROWS, h},
            .has_lmhead = true,
            .lmhead = {"lm_head", ids, rows, ROWS, h},
        };
        CHECK(tovl_build_overlay(be, &k, &d, &ov[s]));
    }
    tovl_token_overlay_set *set = NULL;
    CHECK(tovl_token_overlay_set_from_slots(be, ov, SLOTS, false, &set));
    tovl_overlay_tables tables = tovl_token_overlay_set_tables(set);
    const uint32_t Ts[2] = {512, 64};
    for (int ti = 0; ti < 2; ti++) {
        uint32_t T = Ts[ti];
        uint16_t *hidden = malloc((size_t)T * h * 2);
        uint32_t *tok = malloc(T * 4);
        int32_t *slot = malloc(T * 4);
        for (size_t i = 0; i < (size_t)T * h; i++) {
            hidden[i] = rng_bf16();
        }
        for (uint32_t t0 = 0; t0 < T; t0++) {
            slot[t0] = (int32_t)(rng_next() % SLOTS);
            tok[t0] = embed_ids[slot[t0]][rng_next() % ROWS]; /* every token patched: the worst case */
        }
        tovl_devptr d_hidden, d_tok, d_slot, d_logits;
        CHECK(tovl_alloc(be, (size_t)T * h * 2, &d_hidden));
        CHECK(tovl_alloc(be, T * 4, &d_tok));
        CHECK(tovl_alloc(be, T * 4, &d_slot));
        CHECK(tovl_alloc(be, (size_t)T * vocab * 4, &d_logits));
        CHECK(tovl_upload(be, d_hidden, hidden, (size_t)T * h * 2));
        CHECK(tovl_upload(be, d_tok, tok, T * 4));
        CHECK(tovl_upload(be, d_slot, slot, T * 4));
        CHECK(tovl_fill_u32(be, d_logits, 0, (size_t)T * vocab * 4));
        tovl_embed_overlay_args ea = {
            .hidden = d_hidden, .token_ids = d_tok, .token_slots = d_slot,
            .slot_map_table = tables.embed_slot_map_table, .rows_table = tables.embed_rows_table,
            .n_table = tables.embed_n_table, .T = T, .h = h, .vocab = vocab, .max_loras = SLOTS,
        };
        uint32_t eg[3] = {T, 1, 1};
        char what[64];
        CHECK(iface->time_kernel(ctx, k.embed_overlay, eg, &ea, sizeof ea, batch, repeats, &t));
        snprintf(what, sizeof what, "embed_overlay T=%u h=%u", T, h);
        print_timing(what, &t, "");
        uint32_t max_n = tovl_token_overlay_set_max_n_override(set);
        tovl_lmhead_overlay_args la = {
            .logits = d_logits, .hidden = d_hidden, .row_slots = d_slot,
            .rows_table = tables.lmhead_rows_table, .ids_table = tables.lmhead_ids_table,
            .n_table = tables.n_override_table, .ld = vocab, .T = T, .h = h, .vocab = vocab,
            .max_loras = SLOTS, .max_n = max_n,
        };
        uint32_t lg[3] = {T, max_n, 1};
        CHECK(iface->time_kernel(ctx, k.lmhead_overlay_bf16, lg, &la, sizeof la, batch, repeats, &t));
        snprintf(what, sizeof what, "lmhead_overlay_bf16 T=%u n=%u", T, max_n);
        print_timing(what, &t, "");
        CHECK(iface->time_kernel(ctx, k.lmhead_overlay_f32, lg, &la, sizeof la, batch, repeats, &t));
        snprintf(what, sizeof what, "lmhead_overlay_f32 T=%u n=%u", T, max_n);
        print_timing(what, &t, "");
        tovl_free(be, d_hidden);
        tovl_free(be, d_tok);
        tovl_free(be, d_slot);
        tovl_free(be, d_logits);
        free(hidden);
        free(tok);
        free(slot);
    }
    tovl_token_overlay_set_destroy(set);
    for (int s = 0; s < SLOTS; s++) {
        tovl_embed_overlay_release(ov[s]);
    }
    free(ids);
    free(rows);
    tovl_backend_close(be);
    return 0;
}
