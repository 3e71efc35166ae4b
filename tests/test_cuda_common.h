/*
 * A batch through both hooks, for the CUDA tests (test_cuda.c, test_cuda_graph.c,
 * test_cuda_emu.c): overlays in some slots of a set, a mixed batch of rows
 * (valid slots, -1, out-of-range slots; overlaid ids, other ids, ids >= vocab),
 * random non-zero data, and outputs with poisoned guards around them. The same
 * scenario and seed give the same inputs on every backend, so a run on the
 * backend under test is compared byte for byte with one on the CPU reference.
 */
#ifndef TOVL_TEST_CUDA_COMMON_H
#define TOVL_TEST_CUDA_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_backend.h"
#include "tovl/backend.h"

/* A CUDA driver call that must succeed (a Criterion assertion). */
#define CU_OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)

typedef struct cuda_scenario {
    const char *name;
    uint32_t T, h, vocab, max_loras;
    uint32_t slots_used;  /* slots holding an overlay: first_slot + i * slot_stride */
    uint32_t first_slot, slot_stride;
    uint32_t rows;        /* embed and lm_head rows of each used slot */
    bool active_slot;     /* no slot array: every row uses the first used slot */
    bool chained;         /* lm_head reads the hidden rows the embed hook has just written */
} cuda_scenario;

/* One output buffer with GUARD bytes of poison on each side. */
typedef struct guarded_buf {
    tovl_devptr base, data;
    size_t payload, total;
} guarded_buf;

typedef struct cuda_hook_case {
    tovl_backend *be;
    tovl_overlay_kernels kernels;
    tovl_token_overlay_set *set;
    tovl_devptr token_ids, slots, final_hidden;
    guarded_buf hidden, logits_bf16, logits_f32; /* the hooks' outputs */
    void *hidden_init, *bf16_init, *f32_init;    /* their contents before the hooks */
    tovl_embed_hook_args embed;
    tovl_lmhead_hook_args lm_bf16, lm_f32;
} cuda_hook_case;

/* The outputs as downloaded, whole allocations including the guards. */
typedef struct cuda_hook_result {
    uint8_t *hidden, *logits_bf16, *logits_f32;
} cuda_hook_result;

/* Build the set and the batch on `be`; the outputs hold their initial data. */
tovl_status cuda_case_setup(tovl_backend *be, const cuda_scenario *sc, uint64_t seed, cuda_hook_case *hc);
/* Put the initial data (and poison) back into the outputs. */
tovl_status cuda_case_reset(cuda_hook_case *hc);
/* The embed hook and both lm_head hooks, enqueued on `stream`. */
tovl_status cuda_case_enqueue(cuda_hook_case *hc, void *stream);
tovl_status cuda_case_read(cuda_hook_case *hc, cuda_hook_result *out);
void cuda_case_free(cuda_hook_case *hc);
void cuda_result_free(cuda_hook_result *r);

/* Criterion expectations: `dut` equals `ref` byte for byte, guards intact,
 * and the reference really patched something in each output. */
void cuda_expect_same(const cuda_hook_case *ref_case, const cuda_hook_result *ref, const cuda_hook_result *dut,
                      const char *what);

/* An engine's own stream on a CUDA backend: the backend's context is made
 * current (pushed) and a non-blocking CUstream created in it;
 * cuda_engine_stream_close destroys the stream and pops the context. */
CUstream cuda_engine_stream_open(tovl_backend *be);
void cuda_engine_stream_close(tovl_backend *be, CUstream stream);

/* Setup, enqueue on NULL, synchronize, read, on both backends; compare. */
void cuda_run_against_cpu(tovl_backend *dut, const cuda_scenario *sc, uint64_t seed);

/* Each hook on `be` (launching with programmatic dependent launch) at T = 8,
 * 32, 64 and 512, after a kernel that lets it launch at once and writes the
 * hook's input 20 us later: the hook must wait for it (bit-exact against the
 * CPU reference). Skips the test, closing `be`, when it launches without
 * programmatic dependent launch. */
void cuda_expect_hooks_wait(tovl_backend *be);

/* A kernel that spins for spin_ns on the device, then copies `bytes` (a
 * multiple of 4) from src to dst, launched with PDL as the backend's are:
 * work that keeps a stream busy. Needs sm_90 (its PTX target). */
CUfunction cuda_slow_copy_open(tovl_backend *be, CUmodule *module);
void cuda_slow_copy(const tovl_cuda_driver *cu, CUfunction fn, CUstream stream, tovl_devptr dst, tovl_devptr src,
                    size_t bytes, uint64_t spin_ns);

#endif
