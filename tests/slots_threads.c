/* A loader thread beside a serving thread (slots_check.h). Plain C with no
 * Criterion call, so that the ThreadSanitizer run (tests/stress_slots.c,
 * scripts/sanitize.sh), whose runtime Criterion's runner cannot share, runs
 * the same check as the Criterion tests. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slots_check.h"
#include "testutil.h"

enum { V = 300, H = 40, TT = 16, TCAP = 6 };

typedef struct threaded {
    tovl_token_overlay_set *set;
    tovl_embed_overlay *ov[2];
    atomic_bool stop;
    atomic_uint loads;
} threaded;

static void *loader(void *arg) {
    threaded *t = arg;
    tu_rng r = tu_rng_for("slots_loader");
    while (!atomic_load(&t->stop)) {
        const uint32_t pick = tu_below(&r, 3);
        tovl_status st = pick == 2 ? tovl_token_overlay_set_unload(t->set, 0, NULL)
                                   : tovl_token_overlay_set_load(t->set, 0, t->ov[pick], NULL);
        if (st != TOVL_OK) {
            return (void *)"a load failed";
        }
        atomic_fetch_add(&t->loads, 1);
    }
    return NULL;
}

/* Stops the check with a message in `why` (a static buffer) when `cond` fails. */
#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            snprintf(why, sizeof why, __VA_ARGS__);                                                            \
            goto done;                                                                                         \
        }                                                                                                      \
    } while (0)
#define CHECK_OK(call) CHECK((call) == TOVL_OK, "%s: %s: %s", tag, #call, tovl_last_error())

const char *slots_threaded_run(tovl_backend *be, const char *tag, uint32_t replays) {
    static char why[512];
    why[0] = '\0';
    const tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tu_rng r = tu_rng_for(tag);
    uint32_t ids[2][TCAP], ids_t[TT];
    uint16_t rows[2][TCAP * H], hidden[TT * H];
    int32_t slots[TT];
    threaded t = {0};
    atomic_init(&t.stop, false);
    atomic_init(&t.loads, 0u);
    bool started = false;
    pthread_t th;
    uint32_t seen[3] = {0, 0, 0};
    tovl_devptr d_hidden = 0, d_final = 0, d_ids = 0, d_slots = 0, d_logits = 0;
    const size_t logits_bytes = sizeof(float) * TT * V;
    uint16_t *want_hidden = malloc(3 * sizeof hidden), *got_hidden = malloc(sizeof hidden);
    uint8_t *want_logits = malloc(3 * logits_bytes), *got_logits = malloc(logits_bytes);
    CHECK(want_hidden && got_hidden && want_logits && got_logits, "%s: out of host memory", tag);
    const tovl_set_shape shape = {1, V, H, true, TCAP, TCAP};
    CHECK_OK(tovl_token_overlay_set_create(be, &shape, &t.set));
    for (int a = 0; a < 2; a++) {
        tu_distinct_ids(&r, V, TCAP, ids[a]);
        tu_fill_bf16(&r, rows[a], TCAP * H);
        CHECK_OK(tu_build(be, V, H, ids[a], rows[a], TCAP, false, NULL, NULL, 0, true, &t.ov[a]));
    }
    for (int i = 0; i < TT; i++) {
        slots[i] = i % 5 == 4 ? -1 : 0;
        ids_t[i] = ids[i % 2][tu_below(&r, TCAP)];
    }
    tu_fill_bf16(&r, hidden, TT * H);
    CHECK_OK(tovl_alloc(be, sizeof hidden, &d_hidden));
    CHECK_OK(tovl_alloc(be, sizeof hidden, &d_final));
    CHECK_OK(tovl_alloc(be, sizeof ids_t, &d_ids));
    CHECK_OK(tovl_alloc(be, sizeof slots, &d_slots));
    CHECK_OK(tovl_alloc(be, logits_bytes, &d_logits));
    CHECK_OK(tovl_upload(be, d_final, hidden, sizeof hidden));
    CHECK_OK(tovl_upload(be, d_ids, ids_t, sizeof ids_t));
    CHECK_OK(tovl_upload(be, d_slots, slots, sizeof slots));
    const tovl_embed_hook_args e = {d_hidden, d_ids, d_slots, -1, TT, H};
    const tovl_lmhead_hook_args l = {d_logits, TOVL_LOGITS_F32, V, d_final, d_slots, -1, TT, H};

    /* What each hook gives with slot 0 empty, holding A, holding B. */
    for (int state = 0; state < 3; state++) {
        if (state == 0) {
            CHECK_OK(tovl_token_overlay_set_unload(t.set, 0, NULL));
        } else {
            CHECK_OK(tovl_token_overlay_set_load(t.set, 0, t.ov[state - 1], NULL));
        }
        CHECK_OK(tovl_upload(be, d_hidden, hidden, sizeof hidden));
        CHECK_OK(tovl_fill_u32(be, d_logits, 0x40490FDBu, logits_bytes));
        CHECK_OK(tovl_embed_hook(t.set, &k, &e, NULL));
        CHECK_OK(tovl_lmhead_hook(t.set, &k, &l, NULL));
        CHECK_OK(tovl_download(be, want_hidden + (size_t)state * TT * H, d_hidden, sizeof hidden));
        CHECK_OK(tovl_download(be, want_logits + (size_t)state * logits_bytes, d_logits, logits_bytes));
    }
    CHECK(memcmp(want_hidden, want_hidden + TT * H, sizeof hidden) != 0, "%s: A patches no embedding row", tag);
    CHECK(memcmp(want_hidden + TT * H, want_hidden + 2 * TT * H, sizeof hidden) != 0, "%s: A and B alike", tag);
    CHECK(memcmp(want_logits, want_logits + logits_bytes, logits_bytes) != 0, "%s: A patches no logit", tag);

    CHECK(pthread_create(&th, NULL, loader, &t) == 0, "%s: pthread_create failed", tag);
    started = true;
    for (uint32_t i = 0; i < replays; i++) {
        CHECK_OK(tovl_upload(be, d_hidden, hidden, sizeof hidden));
        CHECK_OK(tovl_fill_u32(be, d_logits, 0x40490FDBu, logits_bytes));
        CHECK_OK(tovl_embed_hook(t.set, &k, &e, NULL));
        CHECK_OK(tovl_lmhead_hook(t.set, &k, &l, NULL));
        CHECK_OK(tovl_download(be, got_hidden, d_hidden, sizeof hidden));
        CHECK_OK(tovl_download(be, got_logits, d_logits, logits_bytes));
        /* Each launch sees one whole state; the loader may swap between the two. */
        int h_state = -1, l_state = -1;
        for (int s = 0; s < 3; s++) {
            if (h_state < 0 && memcmp(got_hidden, want_hidden + (size_t)s * TT * H, sizeof hidden) == 0) {
                h_state = s;
            }
            if (l_state < 0 && memcmp(got_logits, want_logits + (size_t)s * logits_bytes, logits_bytes) == 0) {
                l_state = s;
            }
        }
        CHECK(h_state >= 0, "%s replay %u: the embed output is none of empty, A and B: a mix", tag, i);
        CHECK(l_state >= 0, "%s replay %u: the lm_head output is none of empty, A and B: a mix", tag, i);
        seen[h_state]++;
    }
    atomic_store(&t.stop, true);
    void *loader_why = NULL;
    pthread_join(th, &loader_why);
    started = false;
    CHECK(loader_why == NULL, "%s: the loader thread: %s", tag, (const char *)loader_why);
    CHECK(atomic_load(&t.loads) > 0, "%s: the loader never ran", tag);
    fprintf(stderr, "%s: %u replays beside %u loads: %u empty, %u A, %u B, never a mix\n", tag, replays,
            atomic_load(&t.loads), seen[0], seen[1], seen[2]);
done:
    if (started) {
        atomic_store(&t.stop, true);
        pthread_join(th, NULL);
    }
    tovl_token_overlay_set_destroy(t.set);
    tovl_embed_overlay_release(t.ov[0]);
    tovl_embed_overlay_release(t.ov[1]);
    const tovl_devptr bufs[] = {d_hidden, d_final, d_ids, d_slots, d_logits};
    for (int i = 0; i < 5; i++) {
        tovl_free(be, bufs[i]);
    }
    free(want_hidden);
    free(got_hidden);
    free(want_logits);
    free(got_logits);
    return why[0] ? why : NULL;
}
