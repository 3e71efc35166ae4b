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
};

#endif
