/* The EmbedOverlay object, shared by overlay.c and overlay_set.c. */
#ifndef TOVL_CORE_OVERLAY_H
#define TOVL_CORE_OVERLAY_H

#include <stdatomic.h>

#include "internal.h"

struct tovl_embed_overlay {
    tovl_backend *backend;
    atomic_uint refs; /* a loader thread may release while another builds */
    char adapter[96]; /* desc.adapter, for the messages of a refused load */
    bool tied;        /* desc.tied: the rule its rows were checked for */
    uint32_t vocab, hidden;
    uint32_t embed_count;
    tovl_devptr embed_ids, embed_rows, slot_map;
    bool has_lmhead;
    uint32_t lmhead_count;
    tovl_devptr lmhead_ids, lmhead_rows;
    /* Host copies of the two parts' ids, in the parts' order: a fixed-shape
     * shard set's load finds the slot's in-shard cells from them without
     * reading the device (4 bytes a row, beside the row's 2 * hidden). */
    uint32_t *host_embed_ids, *host_lmhead_ids;
};

#endif
