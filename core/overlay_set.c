/* TokenOverlaySet: the per-slot pointer and count tables on the device. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "overlay.h"
#include "overlay_set.h"

/* The six device tables, in the order of tovl_overlay_tables. */
enum { TABLE_COUNT = 6 };

static tovl_devptr *table_slot(tovl_overlay_tables *t, int i) {
    tovl_devptr *slots[TABLE_COUNT] = {&t->embed_slot_map_table, &t->embed_rows_table, &t->embed_n_table,
                                       &t->lmhead_rows_table,    &t->lmhead_ids_table, &t->n_override_table};
    return slots[i];
}

static void set_free(tovl_token_overlay_set *set) {
    for (int i = 0; i < TABLE_COUNT; i++) {
        tovl_free(set->backend, *table_slot(&set->tables, i));
    }
    if (set->overlays) {
        for (uint32_t s = 0; s < set->max_loras; s++) {
            tovl_embed_overlay_release(set->overlays[s]);
        }
    }
    free(set->overlays);
    free(set);
}

/* Common vocab and hidden of the present overlays; names both slots on a mismatch. */
static tovl_status check_slots(tovl_embed_overlay *const *overlays, uint32_t max_loras, tovl_backend *be) {
    int32_t first = -1;
    for (uint32_t s = 0; s < max_loras; s++) {
        const tovl_embed_overlay *ov = overlays[s];
        if (!ov) {
            continue;
        }
        if (ov->backend != be) {
            return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                              "from_slots: slot %u holds an overlay built on another backend", s);
        }
        if (first < 0) {
            first = (int32_t)s;
            continue;
        }
        const tovl_embed_overlay *ref = overlays[first];
        if (ov->vocab != ref->vocab) {
            return tovl_error(TOVL_ERR_VOCAB_MISMATCH, "from_slots: slot %u has vocab %u but slot %d has vocab %u",
                              s, ov->vocab, first, ref->vocab);
        }
        if (ov->hidden != ref->hidden) {
            return tovl_error(TOVL_ERR_SHAPE_MISMATCH,
                              "from_slots: slot %u has hidden size %u but slot %d has hidden size %u", s,
                              ov->hidden, first, ref->hidden);
        }
    }
    return TOVL_OK;
}

/* Host images of the tables, uploaded as one u64 and one u32 array each. */
typedef struct host_tables {
    uint64_t *slot_map, *embed_rows, *lm_rows, *lm_ids;
    uint32_t *embed_n, *n_override;
} host_tables;

static tovl_status upload_tables(tovl_token_overlay_set *set, const host_tables *h) {
    const void *src[TABLE_COUNT] = {h->slot_map, h->embed_rows, h->embed_n, h->lm_rows, h->lm_ids, h->n_override};
    const size_t elem[TABLE_COUNT] = {8, 8, 4, 8, 8, 4};
    for (int i = 0; i < TABLE_COUNT; i++) {
        size_t bytes = elem[i] * set->max_loras;
        tovl_devptr *dst = table_slot(&set->tables, i);
        tovl_status st = tovl_alloc(set->backend, bytes, dst);
        if (st == TOVL_OK) {
            st = tovl_upload(set->backend, *dst, src[i], bytes);
        }
        if (st != TOVL_OK) {
            return st;
        }
    }
    return TOVL_OK;
}

static void fill_host_tables(tovl_token_overlay_set *set, host_tables *h) {
    for (uint32_t s = 0; s < set->max_loras; s++) {
        const tovl_embed_overlay *ov = set->overlays[s];
        if (!ov) {
            continue;
        }
        set->any_active = true;
        set->vocab = ov->vocab;
        set->hidden = ov->hidden;
        h->slot_map[s] = ov->slot_map;
        h->embed_rows[s] = ov->embed_rows;
        h->embed_n[s] = ov->embed_count;
        if (ov->has_lmhead) {
            h->lm_rows[s] = ov->lmhead_rows;
            h->lm_ids[s] = ov->lmhead_ids;
            h->n_override[s] = ov->lmhead_count;
        } else if (set->tied) {
            h->lm_rows[s] = ov->embed_rows;
            h->lm_ids[s] = ov->embed_ids;
            h->n_override[s] = ov->embed_count;
        }
        if (h->embed_n[s] > set->max_embed_n) {
            set->max_embed_n = h->embed_n[s];
        }
        if (h->n_override[s] > set->max_n_override) {
            set->max_n_override = h->n_override[s];
        }
    }
}

tovl_status tovl_token_overlay_set_from_slots(tovl_backend *backend, tovl_embed_overlay *const *overlays,
                                              uint32_t max_loras, bool tied, tovl_token_overlay_set **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "from_slots: out is NULL");
    }
    *out = NULL;
    if (!backend || !overlays || max_loras == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "from_slots: backend or overlays NULL, or max_loras 0");
    }
    tovl_status st = check_slots(overlays, max_loras, backend);
    if (st != TOVL_OK) {
        return st;
    }
    tovl_token_overlay_set *set = calloc(1, sizeof *set);
    host_tables h = {0};
    if (set) {
        set->overlays = calloc(max_loras, sizeof *set->overlays);
    }
    h.slot_map = calloc(max_loras, 8);
    h.embed_rows = calloc(max_loras, 8);
    h.lm_rows = calloc(max_loras, 8);
    h.lm_ids = calloc(max_loras, 8);
    h.embed_n = calloc(max_loras, 4);
    h.n_override = calloc(max_loras, 4);
    if (!set || !set->overlays || !h.slot_map || !h.embed_rows || !h.lm_rows || !h.lm_ids || !h.embed_n ||
        !h.n_override) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "from_slots: out of host memory (max_loras %u)", max_loras);
    } else {
        set->backend = backend;
        set->max_loras = max_loras;
        set->tied = tied;
        for (uint32_t s = 0; s < max_loras; s++) {
            set->overlays[s] = overlays[s];
            tovl_embed_overlay_retain(overlays[s]);
        }
        fill_host_tables(set, &h);
        st = upload_tables(set, &h);
    }
    free(h.slot_map);
    free(h.embed_rows);
    free(h.lm_rows);
    free(h.lm_ids);
    free(h.embed_n);
    free(h.n_override);
    if (st != TOVL_OK) {
        if (set) {
            set_free(set);
        }
        return st;
    }
    tovl_clear_error();
    *out = set;
    return TOVL_OK;
}

void tovl_token_overlay_set_destroy(tovl_token_overlay_set *set) {
    if (set) {
        set_free(set);
    }
}

bool tovl_token_overlay_set_any_active(const tovl_token_overlay_set *set) {
    return set && set->any_active;
}

uint32_t tovl_token_overlay_set_vocab(const tovl_token_overlay_set *set) {
    return set ? set->vocab : 0;
}

uint32_t tovl_token_overlay_set_hidden(const tovl_token_overlay_set *set) {
    return set ? set->hidden : 0;
}

uint32_t tovl_token_overlay_set_max_n_override(const tovl_token_overlay_set *set) {
    return set ? set->max_n_override : 0;
}

uint32_t tovl_token_overlay_set_max_loras(const tovl_token_overlay_set *set) {
    return set ? set->max_loras : 0;
}

tovl_overlay_tables tovl_token_overlay_set_tables(const tovl_token_overlay_set *set) {
    tovl_overlay_tables t;
    memset(&t, 0, sizeof t);
    if (set) {
        t = set->tables;
    }
    return t;
}
