/* The TokenOverlaySet object, shared by overlay_set.c and hooks.c. */
#ifndef TOVL_CORE_OVERLAY_SET_H
#define TOVL_CORE_OVERLAY_SET_H

#include "internal.h"

struct tovl_token_overlay_set {
    tovl_backend *backend;
    uint32_t max_loras;
    bool tied;
    tovl_embed_overlay **overlays; /* [max_loras], each retained */
    tovl_overlay_tables tables;
    uint32_t vocab, hidden;
    uint32_t max_embed_n;    /* 0: no slot has embed rows, the embed hook never launches */
    uint32_t max_n_override; /* the lm_head grid.y */
    bool any_active;
    /* The lm_head shard: logits columns [vocab_start, vocab_end) of the served
     * vocab, [0, vocab) for an unsharded set. The lm_head kernels see the
     * shard's width as their vocab and ids already shifted by -vocab_start. */
    uint32_t vocab_start, vocab_end;
    bool sharded;
    /* Sharded sets only: [2 * max_loras] owned device copies, slot s's shifted
     * ids at 2s and its rows at 2s + 1 (0 when the slot has no cell there). */
    tovl_devptr *shard_copies;
};

#endif
