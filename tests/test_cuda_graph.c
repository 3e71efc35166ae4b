/*
 * Both hooks on an engine's own CUstream and captured in a CUDA graph: the
 * capture succeeds (the hooks never allocate or synchronize), every replay
 * gives the same bits as the CPU reference and as a direct launch, and
 * replaying again over its own output changes nothing (the hooks are
 * idempotent). Skips with the backend's reason where there is no GPU.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "slots_check.h"
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

/* ------------------------------------------------------------------------ */
/* Fixed-shape sets: one graph captured with the hooks while every slot is   */
/* empty serves every adapter loaded after it                                */
/* ------------------------------------------------------------------------ */
typedef struct graph_replayer {
    const tovl_cuda_driver *cu;
    CUstream stream;
    CUgraph graph;
    CUgraphExec exec;
} graph_replayer;

static void graph_record(void *user, const slots_hooks *hooks) {
    graph_replayer *g = user;
    CU_OK(g->cu->cuStreamBeginCapture(g->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    slots_enqueue(hooks, g->stream);
    CU_OK(g->cu->cuStreamEndCapture(g->stream, &g->graph));
    CU_OK(g->cu->cuGraphInstantiateWithFlags(&g->exec, g->graph, 0));
}

static void graph_replay(void *user) {
    graph_replayer *g = user;
    CU_OK(g->cu->cuGraphLaunch(g->exec, g->stream));
    CU_OK(g->cu->cuStreamSynchronize(g->stream));
}

static tovl_backend *open_cuda_or_skip(void) {
    tovl_backend *be = NULL;
    if (tovl_backend_open("cuda", &be) != TOVL_OK) {
        cr_skip_test("cuda backend unavailable: %s", tovl_last_error());
    }
    return be;
}

static void slots_graph(bool tied, uint32_t capacity, const char *tag) {
    tovl_backend *be = open_cuda_or_skip();
    graph_replayer g = {.cu = tovl_cuda_backend_driver(be)};
    g.stream = cuda_engine_stream_open(be);
    slots_replayer rp = {.record = graph_record, .replay = graph_replay, .load_stream = g.stream, .user = &g};
    slots_check_rounds(be, &rp, &(slots_config){.rounds = 1000, .tied = tied, .capacity = capacity}, tag);
    g.cu->cuGraphExecDestroy(g.exec);
    g.cu->cuGraphDestroy(g.graph);
    cuda_engine_stream_close(be, g.stream);
    tovl_backend_close(be);
}

Test(cuda_graph, slots_in_place_under_one_captured_graph_tied, .timeout = 600) {
    slots_graph(true, 12, "cuda_graph_slots_tied");
}

Test(cuda_graph, slots_in_place_under_one_captured_graph_untied, .timeout = 600) {
    slots_graph(false, 12, "cuda_graph_slots_untied");
}

/* Fixed-shape shard sets: every rank of N = 1 .. 8 (and an unsharded set)
 * captured once into one graph while empty, 1000 rounds of the same loads on
 * every rank per vocabulary of test_tp, capacity 160. */
static const uint32_t shard_vocabs[] = {509, 777, 1000, 1021, 4096, 131};
static size_t shard_cases[2 * sizeof shard_vocabs / sizeof shard_vocabs[0]];

ParameterizedTestParameters(cuda_graph, shard_slots_under_one_captured_graph) {
    const size_t n = sizeof shard_cases / sizeof shard_cases[0];
    for (size_t i = 0; i < n; i++) {
        shard_cases[i] = i;
    }
    return cr_make_param_array(size_t, shard_cases, n);
}
ParameterizedTest(size_t *index, cuda_graph, shard_slots_under_one_captured_graph, .timeout = 900) {
    tovl_backend *be = open_cuda_or_skip();
    graph_replayer g = {.cu = tovl_cuda_backend_driver(be)};
    g.stream = cuda_engine_stream_open(be);
    slots_replayer rp = {.record = graph_record, .replay = graph_replay, .load_stream = g.stream, .user = &g};
    const slots_shard_config cfg = {.rounds = 1000, .tied = *index % 2, .vocab = shard_vocabs[*index / 2],
                                    .capacity = 160};
    slots_check_shards(be, &rp, &cfg, "cuda_graph_shards");
    g.cu->cuGraphExecDestroy(g.exec);
    g.cu->cuGraphDestroy(g.graph);
    cuda_engine_stream_close(be, g.stream);
    tovl_backend_close(be);
}

/* A capacity of 160, past the 64 rows the launch is shaped for, with two
 * adapters that fill it: the kernels loop over the columns past the grid. */
Test(cuda_graph, slots_past_the_shaped_rows_under_one_captured_graph, .timeout = 600) {
    slots_graph(false, 160, "cuda_graph_slots_capacity_160");
}

/* The stream orders a load: a replay enqueued before it (behind 2 ms of
 * other work) sees the old adapter, one enqueued after it the new, and the
 * host call returns while the stream is still busy. A load on a capturing
 * stream is refused. */
Test(cuda_graph, a_load_is_ordered_on_the_stream_and_never_waits, .timeout = 300) {
    tovl_backend *be = open_cuda_or_skip();
    const tovl_cuda_driver *cu = tovl_cuda_backend_driver(be);
    CUstream stream = cuda_engine_stream_open(be);
    tu_rng r = tu_rng_for("cuda_slots_order");
    enum { OV = 4096, OH = 512, ON = 32, OT = 64 };
    uint32_t ids[2][ON], batch_ids[OT];
    int32_t batch_slots[OT];
    uint16_t *rows = malloc(sizeof(uint16_t) * 2 * ON * OH), *hidden = malloc(sizeof(uint16_t) * OT * OH);
    cr_assert(rows && hidden);
    tovl_embed_overlay *ov[2];
    for (int a = 0; a < 2; a++) {
        tu_distinct_ids(&r, OV, ON, ids[a]);
        tu_fill_bf16(&r, rows + (size_t)a * ON * OH, (size_t)ON * OH);
        cr_assert_eq(tu_build(be, OV, OH, ids[a], rows + (size_t)a * ON * OH, ON, false, NULL, NULL, 0, true, &ov[a]),
                     TOVL_OK, "%s", tovl_last_error());
    }
    for (int t = 0; t < OT; t++) {
        batch_slots[t] = t % 7 == 6 ? -1 : 0;
        batch_ids[t] = ids[t % 2][tu_below(&r, ON)];
    }
    tu_fill_bf16(&r, hidden, (size_t)OT * OH);
    const size_t hidden_bytes = sizeof(uint16_t) * OT * OH, logits_bytes = sizeof(float) * OT * OV;
    tovl_devptr d_ids, d_slots, d_hidden, d_final, d_logits, saved_hidden, saved_logits, scratch;
    cr_assert_eq(tovl_alloc(be, sizeof batch_ids, &d_ids), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof batch_slots, &d_slots), TOVL_OK);
    tovl_devptr *const big[] = {&d_hidden, &d_final, &saved_hidden};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tovl_alloc(be, hidden_bytes, big[i]), TOVL_OK);
    }
    cr_assert_eq(tovl_alloc(be, logits_bytes, &d_logits), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, logits_bytes, &saved_logits), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, 4, &scratch), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_ids, batch_ids, sizeof batch_ids), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_slots, batch_slots, sizeof batch_slots), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_final, hidden, hidden_bytes), TOVL_OK);

    tovl_set_shape shape = {2, OV, OH, true, ON, ON};
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_create(be, &shape, &set), TOVL_OK, "%s", tovl_last_error());
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    slots_hooks hk = {.set = set, .kernels = &k};
    hk.embed = (tovl_embed_hook_args){d_hidden, d_ids, d_slots, -1, OT, OH};
    hk.lm_f32 = (tovl_lmhead_hook_args){d_logits, TOVL_LOGITS_F32, OV, d_final, d_slots, -1, OT, OH};
    hk.lm_bf16 = hk.lm_f32; /* the bf16 launch is not part of this graph */
    CUgraph graph;
    CUgraphExec exec;
    CU_OK(cu->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    cr_assert_eq(tovl_embed_hook(set, &k, &hk.embed, stream), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_lmhead_hook(set, &k, &hk.lm_f32, stream), TOVL_OK, "%s", tovl_last_error());
    tu_expect_error(tovl_token_overlay_set_load(set, 0, ov[0], stream), TOVL_ERR_INVALID_ARGUMENT,
                    TU_NAMES("capturing", "between replays"), "a load under capture");
    CU_OK(cu->cuStreamEndCapture(stream, &graph));
    CU_OK(cu->cuGraphInstantiateWithFlags(&exec, graph, 0));

    /* The references: each adapter alone, through a from_slots set, direct. */
    uint8_t *want = malloc(2 * (hidden_bytes + logits_bytes)), *got = malloc(2 * (hidden_bytes + logits_bytes));
    cr_assert(want && got);
    for (int a = 0; a < 2; a++) {
        tovl_token_overlay_set *one = NULL;
        tovl_embed_overlay *slots1[2] = {ov[a], NULL};
        cr_assert_eq(tovl_token_overlay_set_from_slots(be, slots1, 2, true, &one), TOVL_OK);
        cr_assert_eq(tovl_upload(be, d_hidden, hidden, hidden_bytes), TOVL_OK);
        cr_assert_eq(tovl_fill_u32(be, d_logits, 0x3E800000u, logits_bytes), TOVL_OK);
        cr_assert_eq(tovl_embed_hook(one, &k, &hk.embed, NULL), TOVL_OK);
        cr_assert_eq(tovl_lmhead_hook(one, &k, &hk.lm_f32, NULL), TOVL_OK);
        cr_assert_eq(tovl_synchronize(be, NULL), TOVL_OK);
        uint8_t *w = want + (size_t)a * (hidden_bytes + logits_bytes);
        cr_assert_eq(tovl_download(be, w, d_hidden, hidden_bytes), TOVL_OK);
        cr_assert_eq(tovl_download(be, w + hidden_bytes, d_logits, logits_bytes), TOVL_OK);
        tovl_token_overlay_set_destroy(one);
    }
    cr_assert_neq(memcmp(want, want + hidden_bytes + logits_bytes, hidden_bytes), 0, "A and B patch alike");

    CUmodule module = NULL;
    CUfunction slow = cuda_slow_copy_open(be, &module);
    cr_assert_eq(tovl_token_overlay_set_load(set, 0, ov[0], stream), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_upload(be, d_hidden, hidden, hidden_bytes), TOVL_OK);
    cr_assert_eq(tovl_fill_u32(be, d_logits, 0x3E800000u, logits_bytes), TOVL_OK);
    CU_OK(cu->cuStreamSynchronize(stream));
    CUevent busy;
    CU_OK(cu->cuEventCreate(&busy, 0));
    cuda_slow_copy(cu, slow, stream, scratch, scratch, 4, 2000000);
    CU_OK(cu->cuEventRecord(busy, stream));
    CU_OK(cu->cuGraphLaunch(exec, stream));
    CU_OK(cu->cuMemcpyDtoDAsync(saved_hidden, d_hidden, hidden_bytes, stream));
    CU_OK(cu->cuMemcpyDtoDAsync(saved_logits, d_logits, logits_bytes, stream));
    CU_OK(cu->cuMemcpyHtoDAsync(d_hidden, hidden, hidden_bytes, stream));
    CU_OK(cu->cuMemsetD32Async(d_logits, 0x3E800000u, logits_bytes / 4, stream));
    cr_assert_eq(tovl_token_overlay_set_load(set, 0, ov[1], stream), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(cu->cuEventQuery(busy), CUDA_ERROR_NOT_READY, "the load waited for the stream");
    uint32_t pending = 0;
    cr_assert_eq(tovl_token_overlay_set_collect(set, &pending), TOVL_OK);
    cr_assert_eq(pending, 1, "A was released while a replay before the swap had still to run");
    CU_OK(cu->cuGraphLaunch(exec, stream));
    CU_OK(cu->cuStreamSynchronize(stream));
    cr_assert_eq(tovl_token_overlay_set_collect(set, &pending), TOVL_OK);
    cr_assert_eq(pending, 0, "A is still held after the stream passed the swap");
    cr_assert_eq(tovl_download(be, got, saved_hidden, hidden_bytes), TOVL_OK);
    cr_assert_eq(tovl_download(be, got + hidden_bytes, saved_logits, logits_bytes), TOVL_OK);
    cr_assert_eq(tovl_download(be, got + hidden_bytes + logits_bytes, d_hidden, hidden_bytes), TOVL_OK);
    cr_assert_eq(tovl_download(be, got + 2 * hidden_bytes + logits_bytes, d_logits, logits_bytes), TOVL_OK);
    cr_assert_eq(memcmp(got, want, hidden_bytes + logits_bytes), 0, "the replay before the load did not see A");
    cr_assert_eq(memcmp(got + hidden_bytes + logits_bytes, want + hidden_bytes + logits_bytes,
                        hidden_bytes + logits_bytes),
                 0, "the replay after the load did not see B");
    fprintf(stderr, "cuda: a load behind 2 ms of stream work returned at once; replays before and after it saw A "
                    "and B\n");

    cu->cuEventDestroy(busy);
    cu->cuModuleUnload(module);
    cu->cuGraphExecDestroy(exec);
    cu->cuGraphDestroy(graph);
    tovl_token_overlay_set_destroy(set);
    tovl_embed_overlay_release(ov[0]);
    tovl_embed_overlay_release(ov[1]);
    const tovl_devptr all[] = {d_ids, d_slots, d_hidden, d_final, saved_hidden, d_logits, saved_logits, scratch};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        tovl_free(be, all[i]);
    }
    free(rows);
    free(hidden);
    free(want);
    free(got);
    cuda_engine_stream_close(be, stream);
    tovl_backend_close(be);
}

static long resident_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) {
            rss = 0;
        }
        fclose(f);
    }
    return rss * 4;
}

/* An engine's paging: 10,000 swaps, each a freshly built overlay loaded into
 * a random slot of 8 while a captured graph replays every 16 swaps. Device
 * memory returns to its level after the first round of the slots, and host
 * memory does not grow. */
Test(cuda_graph, ten_thousand_swaps_leave_memory_where_it_was, .timeout = 600) {
    tovl_backend *be = open_cuda_or_skip();
    const tovl_cuda_driver *cu = tovl_cuda_backend_driver(be);
    CUstream stream = cuda_engine_stream_open(be);
    tu_rng r = tu_rng_for("cuda_slots_swaps");
    enum { SV = 152064, SH = 4096, SN = 64, SL = 8, ST = 64, SWAPS = 10000 };
    uint32_t ids[SN];
    uint16_t *rows = malloc(sizeof(uint16_t) * SN * SH);
    cr_assert_not_null(rows);
    tu_fill_bf16(&r, rows, (size_t)SN * SH);
    tovl_set_shape shape = {SL, SV, SH, false, SN, SN};
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_create(be, &shape, &set), TOVL_OK, "%s", tovl_last_error());
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_devptr d_ids, d_slots, d_hidden, d_logits;
    uint32_t batch_ids[ST];
    int32_t batch_slots[ST];
    for (int t = 0; t < ST; t++) {
        batch_ids[t] = tu_below(&r, SV);
        batch_slots[t] = (int32_t)(t % SL);
    }
    cr_assert_eq(tovl_alloc(be, sizeof batch_ids, &d_ids), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof batch_slots, &d_slots), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof(uint16_t) * ST * SH, &d_hidden), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof(uint16_t) * ST * SV, &d_logits), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_ids, batch_ids, sizeof batch_ids), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_slots, batch_slots, sizeof batch_slots), TOVL_OK);
    cr_assert_eq(tovl_upload(be, d_hidden, rows, sizeof(uint16_t) * ST * SH), TOVL_OK);
    CUgraph graph;
    CUgraphExec exec;
    tovl_embed_hook_args e = {d_hidden, d_ids, d_slots, -1, ST, SH};
    tovl_lmhead_hook_args l = {d_logits, TOVL_LOGITS_BF16, SV, d_hidden, d_slots, -1, ST, SH};
    CU_OK(cu->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    cr_assert_eq(tovl_embed_hook(set, &k, &e, stream), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_lmhead_hook(set, &k, &l, stream), TOVL_OK, "%s", tovl_last_error());
    CU_OK(cu->cuStreamEndCapture(stream, &graph));
    CU_OK(cu->cuGraphInstantiateWithFlags(&exec, graph, 0));

    size_t free_after_first = 0, free_now = 0, total = 0;
    long rss_after_first = 0;
    for (uint32_t i = 0; i < SWAPS; i++) {
        const uint32_t n = 1 + tu_below(&r, SN);
        tu_distinct_ids(&r, SV, n, ids);
        tovl_embed_overlay *ov = NULL;
        cr_assert_eq(tu_build(be, SV, SH, ids, rows, n, true, ids, rows, n, false, &ov), TOVL_OK, "swap %u: %s", i,
                     tovl_last_error());
        cr_assert_eq(tovl_token_overlay_set_load(set, i % SL, ov, stream), TOVL_OK, "swap %u: %s", i,
                     tovl_last_error());
        tovl_embed_overlay_release(ov);
        if (i % 16 == 15) {
            CU_OK(cu->cuGraphLaunch(exec, stream));
        }
        if (i == 2 * SL - 1 || i == SWAPS - 1) {
            CU_OK(cu->cuStreamSynchronize(stream));
            cr_assert_eq(tovl_token_overlay_set_collect(set, NULL), TOVL_OK);
            CU_OK(cu->cuMemGetInfo(i == SWAPS - 1 ? &free_now : &free_after_first, &total));
            if (i < SWAPS - 1) {
                rss_after_first = resident_kib();
            }
        }
    }
    const long rss_end = resident_kib();
    fprintf(stderr,
            "cuda: %u swaps: device free %zu bytes after the first rounds, %zu at the end (of %zu); host resident "
            "%ld KiB, then %ld KiB\n",
            (unsigned)SWAPS, free_after_first, free_now, total, rss_after_first, rss_end);
    cr_expect_geq(free_now + (2u << 20), free_after_first, "device memory fell by %zu bytes over the swaps",
                  free_after_first - free_now);
    cr_expect_leq(rss_end, rss_after_first + 4096, "host memory grew from %ld to %ld KiB", rss_after_first, rss_end);
    cu->cuGraphExecDestroy(exec);
    cu->cuGraphDestroy(graph);
    tovl_token_overlay_set_destroy(set);
    const tovl_devptr all[] = {d_ids, d_slots, d_hidden, d_logits};
    for (int i = 0; i < 4; i++) {
        tovl_free(be, all[i]);
    }
    free(rows);
    cuda_engine_stream_close(be, stream);
    tovl_backend_close(be);
}
