/* The TokenOverlaySet object, shared by overlay_set.c and hooks.c. */
#ifndef TOVL_CORE_OVERLAY_SET_H
#define TOVL_CORE_OVERLAY_SET_H

#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"

/* The lm_head rows a fixed-shape set's launch is shaped for (at most its
 * capacity): a PEFT adapter's trainable or added tokens number tens. */
#define TOVL_SET_SHAPED_ROWS 64u

/* A replaced overlay of a fixed-shape set, held until the stream that loaded
 * its successor has passed `fence`. */
typedef struct tovl_retired_overlay {
    tovl_embed_overlay *overlay;
    tovl_fence fence;
} tovl_retired_overlay;

struct tovl_token_overlay_set {
    tovl_backend *backend;
    uint32_t max_loras;
    bool tied;
    tovl_embed_overlay **overlays; /* [max_loras], each retained */
    tovl_overlay_tables tables;
    uint32_t vocab, hidden;
    uint32_t max_embed_n;    /* 0: no slot has embed rows, the embed hook never launches */
    uint32_t max_n_override; /* the lm_head kernels' max_n */
    atomic_bool any_active; /* a fixed-shape set's loads change it under `lock` */
    /* The lm_head shard: logits columns [vocab_start, vocab_end) of the served
     * vocab, [0, vocab) for an unsharded set. The lm_head kernels see the
     * shard's width as their vocab and ids already shifted by -vocab_start. */
    uint32_t vocab_start, vocab_end;
    bool sharded;
    /* Sharded sets only: [2 * max_loras] owned device copies, slot s's shifted
     * ids at 2s and its rows at 2s + 1 (0 when the slot has no cell there). */
    tovl_devptr *shard_copies;
    /* Fixed-shape sets (tovl_token_overlay_set_create): the six tables are one
     * allocation that never moves; max_n is lmhead_capacity for the set's
     * whole life, whatever is loaded, and the lm_head launch is shaped for
     * at most TOVL_SET_SHAPED_ROWS of them (hooks.c). `lock` guards overlays[],
     * any_active and retired[] against a loader and a serving thread; the
     * hooks read only fields that never change. */
    bool fixed;
    uint32_t embed_capacity, lmhead_capacity;
    tovl_devptr table_block;
    /* Fixed-shape shard sets: slot s's shifted ids, lmhead_capacity u32 at
     * ids_block + 4 * lmhead_capacity * s, rewritten by each load; the rows
     * stay the overlay's own. `ids_scratch` is the host side of that write. */
    tovl_devptr ids_block;
    uint32_t *ids_scratch;
    pthread_mutex_t lock;
    tovl_retired_overlay *retired;
    uint32_t retired_count, retired_capacity;
};

/* Frees everything a set holds (shared by both kinds of set). */
void tovl_set_free(tovl_token_overlay_set *set);

/* A slot's lm_head cells (its own lm_head part; else, in a tied set, its embed
 * rows and ids; else none). */
void tovl_set_lmhead_source(const tovl_token_overlay_set *set, const tovl_embed_overlay *ov, tovl_devptr *ids,
                            tovl_devptr *rows, uint32_t *n);

#endif
