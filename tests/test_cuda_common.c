/* A batch through both hooks, compared with the CPU reference (see
 * test_cuda_common.h). */
#include "test_cuda_common.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define GUARD 256u
#define POISON 0xA5C3A5C3u

static tovl_status guarded_alloc(tovl_backend *be, size_t payload, guarded_buf *g) {
    g->payload = payload;
    g->total = GUARD + ((payload + 3u) & ~(size_t)3u) + GUARD;
    tovl_status st = tovl_alloc(be, g->total, &g->base);
    g->data = st == TOVL_OK ? g->base + GUARD : 0;
    return st;
}

static tovl_status guarded_reset(tovl_backend *be, const guarded_buf *g, const void *init) {
    tovl_status st = tovl_fill_u32(be, g->base, POISON, g->total);
    return st == TOVL_OK ? tovl_upload(be, g->data, init, g->payload) : st;
}

static tovl_status upload_new(tovl_backend *be, const void *src, size_t bytes, tovl_devptr *dst) {
    tovl_status st = tovl_alloc(be, bytes, dst);
    return st == TOVL_OK ? tovl_upload(be, *dst, src, bytes) : st;
}

static uint32_t used_slot(const cuda_scenario *sc, uint32_t i) {
    return sc->first_slot + i * sc->slot_stride;
}

/* Overlays in the used slots, gathered into a set; each used slot's embed
 * ids go to embed_ids[i * rows ...], so the batch can use them. */
static tovl_status build_set(cuda_hook_case *hc, const cuda_scenario *sc, tu_rng *r, uint32_t *embed_ids) {
    tovl_embed_overlay **slots = calloc(sc->max_loras, sizeof *slots);
    uint32_t *lm_ids = malloc((size_t)sc->rows * sizeof *lm_ids);
    uint16_t *rows = malloc(2 * (size_t)sc->rows * sc->h * sizeof *rows);
    tovl_status st = slots && lm_ids && rows ? TOVL_OK : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "test: host memory");
    for (uint32_t i = 0; i < sc->slots_used && st == TOVL_OK; i++) {
        uint32_t *ids = embed_ids + (size_t)i * sc->rows;
        tu_distinct_ids(r, sc->vocab, sc->rows, ids);
        tu_distinct_ids(r, sc->vocab, sc->rows, lm_ids);
        tu_fill_bf16(r, rows, 2 * (size_t)sc->rows * sc->h);
        tovl_overlay_desc d = {
            .adapter = sc->name,
            .vocab = sc->vocab,
            .hidden = sc->h,
            .embed = {"embed", ids, rows, sc->rows, sc->h},
            .has_lmhead = true,
            .lmhead = {"lm_head", lm_ids, rows + (size_t)sc->rows * sc->h, sc->rows, sc->h},
        };
        st = tovl_build_overlay(hc->be, &hc->kernels, &d, &slots[used_slot(sc, i)]);
    }
    if (st == TOVL_OK) {
        st = tovl_token_overlay_set_from_slots(hc->be, slots, sc->max_loras, false, &hc->set);
    }
    for (uint32_t s = 0; slots && s < sc->max_loras; s++) {
        tovl_embed_overlay_release(slots[s]);
    }
    free(slots);
    free(lm_ids);
    free(rows);
    return st;
}

tovl_status cuda_case_setup(tovl_backend *be, const cuda_scenario *sc, uint64_t seed, cuda_hook_case *hc) {
    memset(hc, 0, sizeof *hc);
    hc->be = be;
    hc->kernels = tovl_overlay_kernels_resolve(be);
    tu_rng r = {seed};
    uint32_t *slot_ids = malloc((size_t)sc->slots_used * sc->rows * sizeof *slot_ids);
    tovl_status st =
        slot_ids ? build_set(hc, sc, &r, slot_ids) : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "test: host memory");

    const size_t T = sc->T, h = sc->h, ld = sc->vocab + 3u;
    uint32_t *token_ids = malloc(T * sizeof *token_ids);
    int32_t *slots = malloc(T * sizeof *slots);
    uint16_t *final_hidden = malloc(T * h * sizeof *final_hidden);
    hc->hidden_init = malloc(T * h * 2);
    hc->bf16_init = malloc(T * ld * 2);
    hc->f32_init = malloc(T * ld * 4);
    if (st == TOVL_OK && !(token_ids && slots && final_hidden && hc->hidden_init && hc->bf16_init && hc->f32_init)) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "test: host memory");
    }
    if (st == TOVL_OK) {
        for (size_t t = 0; t < T; t++) {
            uint32_t pick = tu_below(&r, 10), used = tu_below(&r, sc->slots_used);
            slots[t] = pick == 0 ? -1 : pick == 1 ? (int32_t)(sc->max_loras + tu_below(&r, 5))
                                                  : (int32_t)used_slot(sc, used);
            if (t == 0) {
                slots[t] = (int32_t)used_slot(sc, used); /* at least one row patches */
            }
            uint32_t slot_index = sc->active_slot ? 0 : used;
            uint32_t how = tu_below(&r, 10);
            token_ids[t] = how < 7 || t == 0 ? slot_ids[(size_t)slot_index * sc->rows + tu_below(&r, sc->rows)]
                           : how == 7         ? sc->vocab + tu_below(&r, 100)
                                              : tu_below(&r, sc->vocab);
        }
        tu_fill_bf16(&r, final_hidden, T * h);
        tu_fill_bf16(&r, hc->hidden_init, T * h);
        tu_fill_bf16(&r, hc->bf16_init, T * ld);
        float *f = hc->f32_init;
        for (size_t i = 0; i < T * ld; i++) {
            f[i] = tovl_bf16_to_f32(tu_bf16(&r)) * 1.25f;
        }
    }
    if (st == TOVL_OK) st = upload_new(be, token_ids, T * 4, &hc->token_ids);
    if (st == TOVL_OK && !sc->active_slot) st = upload_new(be, slots, T * 4, &hc->slots);
    if (st == TOVL_OK) st = upload_new(be, final_hidden, T * h * 2, &hc->final_hidden);
    if (st == TOVL_OK) st = guarded_alloc(be, T * h * 2, &hc->hidden);
    if (st == TOVL_OK) st = guarded_alloc(be, T * ld * 2, &hc->logits_bf16);
    if (st == TOVL_OK) st = guarded_alloc(be, T * ld * 4, &hc->logits_f32);
    if (st == TOVL_OK) st = cuda_case_reset(hc);
    const int32_t active = sc->active_slot ? (int32_t)used_slot(sc, 0) : -1;
    hc->embed = (tovl_embed_hook_args){hc->hidden.data, hc->token_ids, hc->slots, active, sc->T, sc->h};
    hc->lm_bf16 = (tovl_lmhead_hook_args){hc->logits_bf16.data, TOVL_LOGITS_BF16, ld, hc->final_hidden,
                                          hc->slots, active, sc->T, sc->h};
    if (sc->chained) {
        hc->lm_bf16.hidden = hc->hidden.data;
    }
    hc->lm_f32 = hc->lm_bf16;
    hc->lm_f32.logits = hc->logits_f32.data;
    hc->lm_f32.logits_dtype = TOVL_LOGITS_F32;
    free(slot_ids);
    free(token_ids);
    free(slots);
    free(final_hidden);
    return st;
}

tovl_status cuda_case_reset(cuda_hook_case *hc) {
    tovl_status st = guarded_reset(hc->be, &hc->hidden, hc->hidden_init);
    if (st == TOVL_OK) st = guarded_reset(hc->be, &hc->logits_bf16, hc->bf16_init);
    if (st == TOVL_OK) st = guarded_reset(hc->be, &hc->logits_f32, hc->f32_init);
    return st;
}

tovl_status cuda_case_enqueue(cuda_hook_case *hc, void *stream) {
    tovl_status st = tovl_embed_hook(hc->set, &hc->kernels, &hc->embed, stream);
    if (st == TOVL_OK) st = tovl_lmhead_hook(hc->set, &hc->kernels, &hc->lm_bf16, stream);
    if (st == TOVL_OK) st = tovl_lmhead_hook(hc->set, &hc->kernels, &hc->lm_f32, stream);
    return st;
}

static tovl_status read_whole(tovl_backend *be, const guarded_buf *g, uint8_t **out) {
    *out = malloc(g->total);
    return *out ? tovl_download(be, *out, g->base, g->total) : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "test: host memory");
}

tovl_status cuda_case_read(cuda_hook_case *hc, cuda_hook_result *out) {
    memset(out, 0, sizeof *out);
    tovl_status st = read_whole(hc->be, &hc->hidden, &out->hidden);
    if (st == TOVL_OK) st = read_whole(hc->be, &hc->logits_bf16, &out->logits_bf16);
    if (st == TOVL_OK) st = read_whole(hc->be, &hc->logits_f32, &out->logits_f32);
    return st;
}

void cuda_case_free(cuda_hook_case *hc) {
    if (!hc->be) {
        return;
    }
    tovl_free(hc->be, hc->token_ids);
    tovl_free(hc->be, hc->slots);
    tovl_free(hc->be, hc->final_hidden);
    tovl_free(hc->be, hc->hidden.base);
    tovl_free(hc->be, hc->logits_bf16.base);
    tovl_free(hc->be, hc->logits_f32.base);
    tovl_token_overlay_set_destroy(hc->set);
    free(hc->hidden_init);
    free(hc->bf16_init);
    free(hc->f32_init);
    memset(hc, 0, sizeof *hc);
}

void cuda_result_free(cuda_hook_result *r) {
    free(r->hidden);
    free(r->logits_bf16);
    free(r->logits_f32);
    memset(r, 0, sizeof *r);
}

/* The first guard byte that is not poison, or -1. */
static long guard_damage(const guarded_buf *g, const uint8_t *bytes) {
    const uint32_t poison = POISON;
    for (size_t i = 0; i < g->total; i++) {
        if (i >= GUARD && i < GUARD + g->payload) {
            continue;
        }
        if (bytes[i] != ((const uint8_t *)&poison)[i % 4]) {
            return (long)i;
        }
    }
    return -1;
}

/* The first differing byte, or -1. */
static long first_difference(const uint8_t *a, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i]) {
            return (long)i;
        }
    }
    return -1;
}

static void expect_buffer(const guarded_buf *g, const void *init, const uint8_t *ref, const uint8_t *dut,
                          size_t elem, const char *buffer, const char *what) {
    cr_expect_eq(guard_damage(g, dut), -1, "%s: %s written outside its payload", what, buffer);
    cr_expect_neq(first_difference(ref + GUARD, init, g->payload), -1,
                  "%s: the reference left %s untouched: the case is vacuous", what, buffer);
    long at = first_difference(ref, dut, g->total);
    if (at >= 0) {
        size_t e = ((size_t)at - GUARD) / elem * elem + GUARD;
        uint32_t want = 0, got = 0;
        memcpy(&want, ref + e, elem);
        memcpy(&got, dut + e, elem);
        cr_expect_fail("%s: %s element %zu: expected 0x%0*x, got 0x%0*x", what, buffer, (e - GUARD) / elem,
                       (int)elem * 2, want, (int)elem * 2, got);
    }
}

void cuda_expect_same(const cuda_hook_case *ref_case, const cuda_hook_result *ref, const cuda_hook_result *dut,
                      const char *what) {
    expect_buffer(&ref_case->hidden, ref_case->hidden_init, ref->hidden, dut->hidden, 2, "hidden (embed hook)",
                  what);
    expect_buffer(&ref_case->logits_bf16, ref_case->bf16_init, ref->logits_bf16, dut->logits_bf16, 2,
                  "bf16 logits", what);
    expect_buffer(&ref_case->logits_f32, ref_case->f32_init, ref->logits_f32, dut->logits_f32, 4, "f32 logits",
                  what);
}

void cuda_run_against_cpu(tovl_backend *dut, const cuda_scenario *sc, uint64_t seed) {
    tovl_backend *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    cuda_hook_case ref, run;
    cuda_hook_result want, got;
    cr_assert_eq(cuda_case_setup(cpu, sc, seed, &ref), TOVL_OK, "%s on cpu: %s", sc->name, tovl_last_error());
    cr_assert_eq(cuda_case_enqueue(&ref, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(cuda_case_read(&ref, &want), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(cuda_case_setup(dut, sc, seed, &run), TOVL_OK, "%s on %s: %s", sc->name, tovl_backend_name(dut),
                 tovl_last_error());
    cr_assert_eq(cuda_case_enqueue(&run, NULL), TOVL_OK, "%s: %s", sc->name, tovl_last_error());
    cr_assert_eq(tovl_synchronize(dut, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(cuda_case_read(&run, &got), TOVL_OK, "%s", tovl_last_error());
    char what[128];
    snprintf(what, sizeof what, "%s on %s (seed %" PRIu64 ")", sc->name, tovl_backend_name(dut), seed);
    cuda_expect_same(&ref, &want, &got, what);
    cuda_result_free(&want);
    cuda_result_free(&got);
    cuda_case_free(&ref);
    cuda_case_free(&run);
    tovl_backend_close(cpu);
}

CUstream cuda_engine_stream_open(tovl_backend *be) {
    const tovl_cuda_driver *cu = tovl_cuda_backend_driver(be);
    cr_assert_not_null(cu, "not a CUDA backend");
    CU_OK(cu->cuCtxPushCurrent(tovl_cuda_backend_cu_context(be)));
    CUstream stream = NULL;
    CU_OK(cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    return stream;
}

void cuda_engine_stream_close(tovl_backend *be, CUstream stream) {
    const tovl_cuda_driver *cu = tovl_cuda_backend_driver(be);
    cu->cuStreamDestroy(stream);
    CUcontext popped;
    cu->cuCtxPopCurrent(&popped);
}

/* Programmatic dependent launch: a hook's kernel may start before the kernel
 * before it on the stream has finished, and must wait (griddepcontrol.wait)
 * before it reads what that kernel writes. The kernel before each hook here
 * lets its dependents launch at once, then spins for 20 us, and only then
 * writes the hook's input (token ids for the embed hook, hidden rows for each
 * lm_head hook) over poison: a hook that read before waiting would read the
 * poison. (lm_head reading the embed hook's output, as in
 * test_cuda_graph, does not show a missing wait: lm_head's own prologue
 * outlasts the embed kernel's copies.) */
static const char slow_copy_ptx[] =
    ".version 7.8\n"
    ".target sm_90\n"
    ".address_size 64\n"
    ".visible .entry slow_copy(.param .u64 dst, .param .u64 src, .param .u32 words, .param .u64 spin_ns)\n"
    "{\n"
    "    .reg .pred %p<3>;\n"
    "    .reg .b32 %r<7>;\n"
    "    .reg .b64 %rd<10>;\n"
    "    griddepcontrol.launch_dependents;\n"
    "    ld.param.u64 %rd1, [dst];\n"
    "    ld.param.u64 %rd2, [src];\n"
    "    ld.param.u32 %r1, [words];\n"
    "    ld.param.u64 %rd3, [spin_ns];\n"
    "    mov.u64 %rd4, %globaltimer;\n"
    "    add.u64 %rd5, %rd4, %rd3;\n"
    "SPIN:\n"
    "    mov.u64 %rd6, %globaltimer;\n"
    "    setp.lt.u64 %p1, %rd6, %rd5;\n"
    "    @%p1 bra SPIN;\n"
    "    griddepcontrol.wait;\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.u32 %r5, %r2, %r3, %r4;\n"
    "    setp.ge.u32 %p2, %r5, %r1;\n"
    "    @%p2 bra DONE;\n"
    "    mul.wide.u32 %rd7, %r5, 4;\n"
    "    add.u64 %rd8, %rd2, %rd7;\n"
    "    add.u64 %rd9, %rd1, %rd7;\n"
    "    ld.global.u32 %r6, [%rd8];\n"
    "    st.global.u32 [%rd9], %r6;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

static void launch_slow_copy(const tovl_cuda_driver *cu, CUfunction fn, CUstream stream, tovl_devptr dst,
                             tovl_devptr src, size_t bytes) {
    cuda_slow_copy(cu, fn, stream, dst, src, bytes, 20000);
}

CUfunction cuda_slow_copy_open(tovl_backend *be, CUmodule *module) {
    const tovl_cuda_driver *cu = tovl_cuda_backend_driver(be);
    CUfunction fn = NULL;
    CU_OK(cu->cuModuleLoadData(module, slow_copy_ptx));
    CU_OK(cu->cuModuleGetFunction(&fn, *module, "slow_copy"));
    return fn;
}

void cuda_slow_copy(const tovl_cuda_driver *cu, CUfunction fn, CUstream stream, tovl_devptr dst, tovl_devptr src,
                    size_t bytes, uint64_t spin) {
    unsigned long long d = dst, s = src, spin_ns = spin;
    unsigned int words = (unsigned int)(bytes / 4);
    void *params[] = {&d, &s, &words, &spin_ns};
    const uint32_t grid[3] = {(words + 255) / 256, 1, 1}, block[3] = {256, 1, 1};
    CU_OK(tovl_cuda_launch_kernel(cu, fn, grid, block, stream, params, true));
}

/* The hooks at batch size T over `rows` overlay rows a slot, each after a
 * slow_copy that writes its input. */
static void expect_hooks_wait_at(tovl_backend *be, tovl_backend *cpu, CUfunction slow_copy, CUstream stream, uint32_t T,
                                 uint32_t rows) {
    char name[32];
    snprintf(name, sizeof name, "pdl_wait_t%u_r%u", T, rows);
    const cuda_scenario sc = {name, T, 4096, 32000, 8, 8, 0, 1, rows, false, false};
    tu_rng r = tu_rng_for(sc.name);
    const uint64_t seed = tu_next(&r);
    cuda_hook_case ref, hc;
    cuda_hook_result want, got;
    cr_assert_eq(cuda_case_setup(cpu, &sc, seed, &ref), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(cuda_case_enqueue(&ref, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(cuda_case_read(&ref, &want), TOVL_OK, "%s", tovl_last_error());

    const tovl_cuda_driver *cu = tovl_cuda_backend_driver(be);
    cr_assert_eq(cuda_case_setup(be, &sc, seed, &hc), TOVL_OK, "%s", tovl_last_error());
    /* The true inputs aside; poison where the hooks will read them. */
    const size_t ids_bytes = (size_t)sc.T * 4, hidden_bytes = (size_t)sc.T * sc.h * 2;
    tovl_devptr true_ids = 0, true_hidden = 0, hidden_f32 = 0;
    cr_assert_eq(tovl_alloc(be, ids_bytes, &true_ids), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, hidden_bytes, &true_hidden), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, hidden_bytes, &hidden_f32), TOVL_OK);
    CU_OK(cu->cuMemcpyDtoDAsync(true_ids, hc.token_ids, ids_bytes, stream));
    CU_OK(cu->cuMemcpyDtoDAsync(true_hidden, hc.final_hidden, hidden_bytes, stream));
    CU_OK(cu->cuMemsetD32Async(hc.token_ids, UINT32_MAX, ids_bytes / 4, stream)); /* ids >= vocab: no row */
    CU_OK(cu->cuMemsetD32Async(hc.final_hidden, 0x3F803F80u, hidden_bytes / 4, stream)); /* every element 1.0 */
    CU_OK(cu->cuMemsetD32Async(hidden_f32, 0x3F803F80u, hidden_bytes / 4, stream));
    CU_OK(cu->cuStreamSynchronize(stream));
    hc.lm_f32.hidden = hidden_f32; /* its own input, so that a kernel writes it just before it too */

    launch_slow_copy(cu, slow_copy, stream, hc.token_ids, true_ids, ids_bytes);
    cr_assert_eq(tovl_embed_hook(hc.set, &hc.kernels, &hc.embed, stream), TOVL_OK, "%s", tovl_last_error());
    launch_slow_copy(cu, slow_copy, stream, hc.final_hidden, true_hidden, hidden_bytes);
    cr_assert_eq(tovl_lmhead_hook(hc.set, &hc.kernels, &hc.lm_bf16, stream), TOVL_OK, "%s", tovl_last_error());
    launch_slow_copy(cu, slow_copy, stream, hidden_f32, true_hidden, hidden_bytes);
    cr_assert_eq(tovl_lmhead_hook(hc.set, &hc.kernels, &hc.lm_f32, stream), TOVL_OK, "%s", tovl_last_error());
    CU_OK(cu->cuStreamSynchronize(stream));
    cr_assert_eq(cuda_case_read(&hc, &got), TOVL_OK, "%s", tovl_last_error());
    char what[96];
    snprintf(what, sizeof what, "%s (seed %" PRIu64 ")", sc.name, seed);
    cuda_expect_same(&ref, &want, &got, what);

    cuda_result_free(&want);
    cuda_result_free(&got);
    tovl_free(be, true_ids);
    tovl_free(be, true_hidden);
    tovl_free(be, hidden_f32);
    cuda_case_free(&hc);
    cuda_case_free(&ref);
}

void cuda_expect_hooks_wait(tovl_backend *be) {
    const char *pdl = tovl_backend_property(be, "programmatic_dependent_launch");
    if (strcmp(pdl, "on") != 0) {
        tovl_backend_close(be);
        cr_skip_test("programmatic dependent launch is %s", pdl);
    }
    tovl_backend *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    const tovl_cuda_driver *cu = tovl_cuda_backend_driver(be);
    CUstream stream = cuda_engine_stream_open(be);
    CUmodule module = NULL;
    CUfunction slow_copy = NULL;
    CU_OK(cu->cuModuleLoadData(&module, slow_copy_ptx));
    CU_OK(cu->cuModuleGetFunction(&slow_copy, module, "slow_copy"));
    /* On an H200: row4 (T = 8), row4q (T = 32, 64), the small tiles (T = 400
     * over 16 rows), the large tiles (T = 512). */
    const uint32_t sizes[][2] = {{8, 64}, {32, 64}, {64, 64}, {400, 16}, {512, 64}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        expect_hooks_wait_at(be, cpu, slow_copy, stream, sizes[i][0], sizes[i][1]);
    }
    cu->cuModuleUnload(module);
    cuda_engine_stream_close(be, stream);
    tovl_backend_close(cpu);
}
