/* The hooks' bench workload, shared by the standalone programs in bench/:
 * the sizes of tools/cmd_bench.c (h = 4096, vocab 152064, 8 slots x 64
 * overlay rows, row slots random in 0..7 with 1 in 16 at -1, half the token
 * ids overlaid), drawn from one generator, on the host and on the device.
 * Link core/bf16.c (tovl_f32_to_bf16). */
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "tovl/kernel_args.h"
extern "C" {
#include "tovl/tovl.h" /* tovl_f32_to_bf16 */
}

static const uint32_t H = 4096, VOCAB = 152064, SLOTS = 8, N = 64;

struct Workload {
    uint32_t T;
    std::vector<uint16_t> hidden;
    std::vector<int32_t> slots;
    std::vector<uint32_t> token_ids;
    std::vector<std::vector<uint16_t>> rows;     /* per slot [N][H] */
    std::vector<std::vector<uint32_t>> ids;      /* per slot [N] */
    std::vector<std::vector<int32_t>> slot_map; /* per slot [VOCAB] */
    uint64_t d_hidden, d_slots, d_token_ids, d_rows_table, d_ids_table, d_n_table, d_map_table;
    std::vector<void *> device; /* every allocation above, for workload_release */

    template <class T>
    uint64_t to_dev(const std::vector<T> &v) {
        void *p;
        CK(cudaMalloc(&p, v.size() * sizeof(T) + 16));
        CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
        device.push_back(p);
        return (uint64_t)(uintptr_t)p;
    }
};

/* The seed from argv[1] (else a fresh one), printed with the device. */
static uint64_t bench_start(int argc, char **argv, const char *program) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], nullptr, 0) : std::random_device{}();
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("device %s, %d SMs; %s seed %llu\n", p.name, p.multiProcessorCount, program, (unsigned long long)seed);
    return seed;
}

/* The batch sizes to run: TOVL_MB_T, comma-separated (512,64), else
 * `defaults`; exits with status 2 on a malformed list. */
static std::vector<uint32_t> bench_sizes(std::vector<uint32_t> defaults) {
    const char *list = getenv("TOVL_MB_T");
    if (!list) return defaults;
    std::vector<uint32_t> sizes;
    for (const char *p = list; *p;) {
        char *end;
        const unsigned long T = strtoul(p, &end, 10);
        if (end == p || T == 0 || T > 65536) {
            fprintf(stderr, "TOVL_MB_T: expected sizes like 512,64, got '%s'\n", list);
            exit(2);
        }
        sizes.push_back((uint32_t)T);
        p = *end == ',' ? end + 1 : end;
    }
    return sizes;
}

static uint16_t random_bf16(std::mt19937_64 &rng) {
    /* Mixed signs and exponents, mantissas full; no NaN/Inf (conformance covers those). */
    std::uniform_real_distribution<float> m(-1.0f, 1.0f);
    std::uniform_int_distribution<int> e(-6, 3);
    return tovl_f32_to_bf16(std::ldexp(m(rng), e(rng)));
}

static void build(Workload &w, uint32_t T, std::mt19937_64 &rng) {
    w.T = T;
    w.hidden.resize((size_t)T * H);
    for (auto &v : w.hidden) v = random_bf16(rng);
    /* TOVL_MB_SUBNORMALS=1: a subnormal every 1000 elements of the hidden
     * rows, so that every lm_head tile fails the fused loop's range check
     * and runs the spec's unfused order (lmhead_overlay.cuh, LmheadRange). */
    if (const char *sub = getenv("TOVL_MB_SUBNORMALS"); sub && strcmp(sub, "1") == 0) {
        for (size_t i = 0; i < w.hidden.size(); i += 1000) w.hidden[i] = 0x0001;
    }
    w.slots.resize(T);
    w.token_ids.resize(T);
    w.rows.assign(SLOTS, {});
    w.ids.assign(SLOTS, {});
    w.slot_map.assign(SLOTS, std::vector<int32_t>(VOCAB, -1));
    std::vector<uint64_t> rows_table(SLOTS), ids_table(SLOTS), map_table(SLOTS);
    std::vector<uint32_t> n_table(SLOTS, N);
    for (uint32_t s = 0; s < SLOTS; s++) {
        w.rows[s].resize((size_t)N * H);
        for (auto &v : w.rows[s]) v = random_bf16(rng);
        std::vector<uint32_t> all(VOCAB);
        for (uint32_t i = 0; i < VOCAB; i++) all[i] = i;
        for (uint32_t k = 0; k < N; k++) { /* distinct ids: partial shuffle */
            std::swap(all[k], all[k + rng() % (VOCAB - k)]);
            w.ids[s].push_back(all[k]);
            w.slot_map[s][all[k]] = (int32_t)k;
        }
        rows_table[s] = w.to_dev(w.rows[s]);
        ids_table[s] = w.to_dev(w.ids[s]);
        map_table[s] = w.to_dev(w.slot_map[s]);
    }
    for (uint32_t t = 0; t < T; t++) {
        w.slots[t] = rng() % 16 == 0 ? -1 : (int32_t)(rng() % SLOTS);
        const uint32_t s = w.slots[t] < 0 ? 0 : (uint32_t)w.slots[t];
        w.token_ids[t] = rng() % 2 ? w.ids[s][rng() % N] : (uint32_t)(rng() % VOCAB);
    }
    w.d_hidden = w.to_dev(w.hidden);
    w.d_slots = w.to_dev(w.slots);
    w.d_token_ids = w.to_dev(w.token_ids);
    w.d_rows_table = w.to_dev(rows_table);
    w.d_ids_table = w.to_dev(ids_table);
    w.d_n_table = w.to_dev(n_table);
    w.d_map_table = w.to_dev(map_table);
}

static void workload_release(Workload &w) {
    for (void *p : w.device) CK(cudaFree(p));
    w.device.clear();
}

/* The embed hook's arguments over the workload, patching `hidden` (a device
 * copy of w.hidden the caller owns). */
static tovl_embed_overlay_args embed_args(const Workload &w, uint64_t hidden) {
    tovl_embed_overlay_args a = {};
    a.hidden = hidden;
    a.token_ids = w.d_token_ids;
    a.token_slots = w.d_slots;
    a.slot_map_table = w.d_map_table;
    a.rows_table = w.d_rows_table;
    a.n_table = w.d_n_table;
    a.T = w.T;
    a.h = H;
    a.vocab = VOCAB;
    a.max_loras = SLOTS;
    a.active_slot = -1;
    return a;
}

/* The lm_head hook's arguments over the workload, writing `logits` (a device
 * buffer of T x VOCAB cells the caller owns). */
static tovl_lmhead_overlay_args lmhead_args(const Workload &w, uint64_t logits) {
    tovl_lmhead_overlay_args a = {};
    a.logits = logits;
    a.hidden = w.d_hidden;
    a.row_slots = w.d_slots;
    a.rows_table = w.d_rows_table;
    a.ids_table = w.d_ids_table;
    a.n_table = w.d_n_table;
    a.ld = VOCAB;
    a.T = w.T;
    a.h = H;
    a.vocab = VOCAB;
    a.max_loras = SLOTS;
    a.active_slot = -1;
    a.max_n = N;
    return a;
}

/* The hidden rows after the embed hook; *copied: how many it replaces. */
static std::vector<uint16_t> embed_expected(const Workload &w, uint32_t *copied) {
    std::vector<uint16_t> want = w.hidden;
    *copied = 0;
    for (uint32_t t = 0; t < w.T; t++) {
        const int32_t s = w.slots[t];
        if (s < 0) continue;
        const int32_t j = w.slot_map[s][w.token_ids[t]];
        if (j < 0) continue;
        ++*copied;
        memcpy(&want[(size_t)t * H], &w.rows[s][(size_t)j * H], H * 2);
    }
    return want;
}
