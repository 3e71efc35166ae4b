/*
 * Both hooks on an engine's own CUstream and captured in a CUDA graph: the
 * capture succeeds (the hooks never allocate or synchronize), every replay
 * gives the same bits as the CPU reference and as a direct launch, and
 * replaying again over its own output changes nothing (the hooks are
 * idempotent). Skips with the backend's reason where there is no GPU.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "test_cuda_common.h"
#include "testutil.h"


static void same_bytes(const uint8_t *a, const uint8_t *b, size_t n, const char *what) {
    cr_expect_eq(memcmp(a, b, n), 0, "%s differs", what);
}

static void expect_identical(const cuda_hook_case *hc, const cuda_hook_result *a, const cuda_hook_result *b,
                             const char *what) {
    char name[160];
    snprintf(name, sizeof name, "%s: hidden", what);
    same_bytes(a->hidden, b->hidden, hc->hidden.total, name);
    snprintf(name, sizeof name, "%s: bf16 logits", what);
    same_bytes(a->logits_bf16, b->logits_bf16, hc->logits_bf16.total, name);
    snprintf(name, sizeof name, "%s: f32 logits", what);
    same_bytes(a->logits_f32, b->logits_f32, hc->logits_f32.total, name);
}

static void graph_case(const cuda_scenario *sc) {
    tovl_backend *be = NULL, *cpu = NULL;
    if (tovl_backend_open("cuda", &be) != TOVL_OK) {
        cr_skip_test("cuda backend unavailable: %s", tovl_last_error());
    }
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    const tovl_cuda_driver *cu = tovl_cuda_backend_driver(be);
    cr_assert_not_null(cu);
    tu_rng r = tu_rng_for(sc->name);
    const uint64_t seed = tu_next(&r);
    char what[128];
    snprintf(what, sizeof what, "%s (seed %" PRIu64 ")", sc->name, seed);

    /* The reference. */
    cuda_hook_case ref_case, hc;
    cuda_hook_result ref, direct, replay, again;
    cr_assert_eq(cuda_case_setup(cpu, sc, seed, &ref_case), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(cuda_case_enqueue(&ref_case, NULL), TOVL_OK);
    cr_assert_eq(cuda_case_read(&ref_case, &ref), TOVL_OK);

    /* An engine's stream in the backend's context. */
    CUstream stream = cuda_engine_stream_open(be);
    cr_assert_eq(cuda_case_setup(be, sc, seed, &hc), TOVL_OK, "%s", tovl_last_error());

    /* Direct launches on that stream. */
    cr_assert_eq(cuda_case_enqueue(&hc, stream), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_synchronize(be, stream), TOVL_OK);
    cr_assert_eq(cuda_case_read(&hc, &direct), TOVL_OK);
    cuda_expect_same(&ref_case, &ref, &direct, what);

    /* Captured once, replayed. */
    cr_assert_eq(cuda_case_reset(&hc), TOVL_OK);
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CU_OK(cu->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    tovl_status st = cuda_case_enqueue(&hc, stream);
    CU_OK(cu->cuStreamEndCapture(stream, &graph));
    cr_assert_eq(st, TOVL_OK, "the hooks under capture: %s", tovl_last_error());
    CU_OK(cu->cuGraphInstantiateWithFlags(&exec, graph, 0));
    CU_OK(cu->cuGraphLaunch(exec, stream));
    CU_OK(cu->cuStreamSynchronize(stream));
    cr_assert_eq(cuda_case_read(&hc, &replay), TOVL_OK);
    cuda_expect_same(&ref_case, &ref, &replay, what);
    expect_identical(&hc, &direct, &replay, "graph replay vs direct launch");

    /* Ten more replays over the patched buffers, then one from scratch. */
    for (int i = 0; i < 10; i++) {
        CU_OK(cu->cuGraphLaunch(exec, stream));
    }
    CU_OK(cu->cuStreamSynchronize(stream));
    cr_assert_eq(cuda_case_read(&hc, &again), TOVL_OK);
    expect_identical(&hc, &replay, &again, "eleven replays vs one");
    cuda_result_free(&again);
    cr_assert_eq(cuda_case_reset(&hc), TOVL_OK);
    CU_OK(cu->cuGraphLaunch(exec, stream));
    CU_OK(cu->cuStreamSynchronize(stream));
    cr_assert_eq(cuda_case_read(&hc, &again), TOVL_OK);
    expect_identical(&hc, &replay, &again, "a replay after a reset");

    cu->cuGraphExecDestroy(exec);
    cu->cuGraphDestroy(graph);
    cuda_result_free(&ref);
    cuda_result_free(&direct);
    cuda_result_free(&replay);
    cuda_result_free(&again);
    cuda_case_free(&hc);
    cuda_case_free(&ref_case);
    cuda_engine_stream_close(be, stream);
    tovl_backend_close(be);
    tovl_backend_close(cpu);
}

/* The benchmark's batch: the large lm_head tiles. */
Test(cuda_graph, hooks_replay_bit_identically_t512, .timeout = 600) {
    graph_case(&(cuda_scenario){"graph_t512", 512, 4096, 32000, 8, 8, 0, 1, 64, false, false});
}

/* A small batch: row4q (on an H200). */
Test(cuda_graph, hooks_replay_bit_identically_t64, .timeout = 600) {
    graph_case(&(cuda_scenario){"graph_t64", 64, 4096, 32000, 8, 8, 0, 1, 64, false, false});
}

/* 16 overlay rows a slot: the small tiles (on an H200). */
Test(cuda_graph, hooks_replay_bit_identically_small_tiles, .timeout = 600) {
    graph_case(&(cuda_scenario){"graph_small", 400, 4096, 32000, 8, 8, 0, 1, 16, false, false});
}

/* Decode with one active slot and no slot array: row4. */
Test(cuda_graph, hooks_replay_bit_identically_active_slot, .timeout = 600) {
    graph_case(&(cuda_scenario){"graph_active", 16, 2048, 32000, 4, 1, 1, 1, 16, true, false});
}

/* lm_head reads the rows the embed hook writes just before it: in the graph
 * the two launches are joined by a programmatic edge on sm_90 and newer. */
Test(cuda_graph, chained_hooks_replay_bit_identically, .timeout = 600) {
    graph_case(&(cuda_scenario){"graph_chained", 256, 4096, 32000, 8, 8, 0, 1, 64, false, true});
}
