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

void tovl_set_free(tovl_token_overlay_set *set) {
    if (set->fixed) {
        tovl_free(set->backend, set->table_block);
        tovl_free(set->backend, set->ids_block);
        free(set->ids_scratch);
        for (uint32_t i = 0; i < set->retired_count; i++) {
            tovl_core_fence_destroy(set->backend, set->retired[i].fence);
            tovl_embed_overlay_release(set->retired[i].overlay);
        }
        free(set->retired);
        pthread_mutex_destroy(&set->lock);
    } else {
        for (int i = 0; i < TABLE_COUNT; i++) {
            tovl_free(set->backend, *table_slot(&set->tables, i));
        }
    }
    if (set->overlays) {
        for (uint32_t s = 0; s < set->max_loras; s++) {
            tovl_embed_overlay_release(set->overlays[s]);
        }
    }
    if (set->shard_copies) {
        for (uint32_t i = 0; i < 2 * set->max_loras; i++) {
            tovl_free(set->backend, set->shard_copies[i]);
        }
    }
    free(set->shard_copies);
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

void tovl_set_lmhead_source(const tovl_token_overlay_set *set, const tovl_embed_overlay *ov, tovl_devptr *ids,
                            tovl_devptr *rows, uint32_t *n) {
    *ids = *rows = 0;
    *n = 0;
    if (ov->has_lmhead) {
        *ids = ov->lmhead_ids, *rows = ov->lmhead_rows, *n = ov->lmhead_count;
    } else if (set->tied) {
        *ids = ov->embed_ids, *rows = ov->embed_rows, *n = ov->embed_count;
    }
}

static tovl_status upload_copy(tovl_backend *be, const void *src, size_t bytes, tovl_devptr *dst) {
    tovl_status st = tovl_alloc(be, bytes, dst);
    return st == TOVL_OK ? tovl_upload(be, *dst, src, bytes) : st;
}

/* Slot s's cells inside the shard, copied into memory the set owns: the ids
 * shifted by -vocab_start (so the unchanged lm_head kernels write column
 * id - vocab_start of the rank's logits shard) and their rows, in the order
 * of the source. Rows are fetched a run of consecutive in-shard entries at a
 * time (one run per slot when the ids increase, as the importer makes them). */
static tovl_status copy_shard_cells(tovl_token_overlay_set *set, uint32_t s, tovl_devptr ids, tovl_devptr rows,
                                    uint32_t n, uint32_t *n_shard) {
    *n_shard = 0;
    if (n == 0) {
        return TOVL_OK;
    }
    const size_t row_bytes = (size_t)set->hidden * sizeof(uint16_t);
    uint32_t *all = malloc((size_t)n * sizeof *all);
    if (!all) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "from_slots_shard: out of host memory (slot %u, %u ids)", s, n);
    }
    tovl_status st = tovl_download(set->backend, all, ids, (size_t)n * sizeof *all);
    uint32_t m = 0;
    for (uint32_t j = 0; st == TOVL_OK && j < n; j++) {
        m += all[j] >= set->vocab_start && all[j] < set->vocab_end;
    }
    uint32_t *shifted = NULL;
    uint16_t *picked = NULL;
    if (st == TOVL_OK && m > 0) {
        shifted = malloc((size_t)m * sizeof *shifted);
        picked = malloc((size_t)m * row_bytes);
        if (!shifted || !picked) {
            st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "from_slots_shard: out of host memory (slot %u, %u rows)", s, m);
        }
    }
    for (uint32_t j = 0, k = 0; st == TOVL_OK && m > 0 && j < n;) {
        uint32_t run = 0;
        while (j + run < n && all[j + run] >= set->vocab_start && all[j + run] < set->vocab_end) {
            shifted[k + run] = all[j + run] - set->vocab_start;
            run++;
        }
        if (run > 0) {
            st = tovl_download(set->backend, (char *)picked + (size_t)k * row_bytes, rows + (size_t)j * row_bytes,
                               (size_t)run * row_bytes);
        }
        k += run;
        j += run + 1;
    }
    if (st == TOVL_OK && m > 0) {
        st = upload_copy(set->backend, shifted, (size_t)m * sizeof *shifted, &set->shard_copies[2 * s]);
    }
    if (st == TOVL_OK && m > 0) {
        st = upload_copy(set->backend, picked, (size_t)m * row_bytes, &set->shard_copies[2 * s + 1]);
    }
    if (st == TOVL_OK) {
        *n_shard = m;
    }
    free(all);
    free(shifted);
    free(picked);
    return st;
}

static tovl_status fill_host_tables(tovl_token_overlay_set *set, host_tables *h) {
    for (uint32_t s = 0; s < set->max_loras; s++) {
        const tovl_embed_overlay *ov = set->overlays[s];
        if (!ov) {
            continue;
        }
        h->slot_map[s] = ov->slot_map;
        h->embed_rows[s] = ov->embed_rows;
        h->embed_n[s] = ov->embed_count;
        tovl_devptr ids, rows;
        uint32_t n;
        tovl_set_lmhead_source(set, ov, &ids, &rows, &n);
        if (set->sharded) {
            tovl_status st = copy_shard_cells(set, s, ids, rows, n, &n);
            if (st != TOVL_OK) {
                return st;
            }
            ids = set->shard_copies[2 * s];
            rows = set->shard_copies[2 * s + 1];
        }
        h->lm_rows[s] = rows;
        h->lm_ids[s] = ids;
        h->n_override[s] = n;
        if (h->embed_n[s] > set->max_embed_n) {
            set->max_embed_n = h->embed_n[s];
        }
        if (h->n_override[s] > set->max_n_override) {
            set->max_n_override = h->n_override[s];
        }
    }
    return TOVL_OK;
}

/* The common vocab and hidden of the present overlays (0 when none). */
static void pool_shape(tovl_embed_overlay *const *overlays, uint32_t max_loras, uint32_t *vocab, uint32_t *hidden) {
    *vocab = *hidden = 0;
    for (uint32_t s = 0; s < max_loras; s++) {
        if (overlays[s]) {
            *vocab = overlays[s]->vocab;
            *hidden = overlays[s]->hidden;
            return;
        }
    }
}

/* Both builders: `sharded` false covers [0, vocab) with the overlays' own rows. */
static tovl_status set_build(const char *fn, tovl_backend *backend, tovl_embed_overlay *const *overlays,
                             uint32_t max_loras, bool tied, bool sharded, uint32_t vocab_start, uint32_t vocab_end,
                             tovl_token_overlay_set **out) {
    tovl_token_overlay_set *set = calloc(1, sizeof *set);
    host_tables h = {0};
    if (set) {
        set->overlays = calloc(max_loras, sizeof *set->overlays);
        set->shard_copies = sharded ? calloc(2 * (size_t)max_loras, sizeof *set->shard_copies) : NULL;
    }
    h.slot_map = calloc(max_loras, 8);
    h.embed_rows = calloc(max_loras, 8);
    h.lm_rows = calloc(max_loras, 8);
    h.lm_ids = calloc(max_loras, 8);
    h.embed_n = calloc(max_loras, 4);
    h.n_override = calloc(max_loras, 4);
    tovl_status st;
    if (!set || !set->overlays || (sharded && !set->shard_copies) || !h.slot_map || !h.embed_rows || !h.lm_rows ||
        !h.lm_ids || !h.embed_n || !h.n_override) {
        st = tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of host memory (max_loras %u)", fn, max_loras);
    } else {
        set->backend = backend;
        set->max_loras = max_loras;
        set->tied = tied;
        set->sharded = sharded;
        for (uint32_t s = 0; s < max_loras; s++) {
            set->overlays[s] = overlays[s];
            tovl_embed_overlay_retain(overlays[s]);
            set->any_active = set->any_active || overlays[s];
        }
        pool_shape(overlays, max_loras, &set->vocab, &set->hidden);
        set->vocab_start = sharded ? vocab_start : 0;
        set->vocab_end = sharded ? vocab_end : set->vocab;
        st = fill_host_tables(set, &h);
        if (st == TOVL_OK) {
            st = upload_tables(set, &h);
        }
    }
    free(h.slot_map);
    free(h.embed_rows);
    free(h.lm_rows);
    free(h.lm_ids);
    free(h.embed_n);
    free(h.n_override);
    if (st != TOVL_OK) {
        if (set) {
            tovl_set_free(set);
        }
        return st;
    }
    tovl_clear_error();
    *out = set;
    return TOVL_OK;
}

/* The checks both builders share. */
static tovl_status check_build_args(const char *fn, tovl_backend *backend, tovl_embed_overlay *const *overlays,
                                    uint32_t max_loras, tovl_token_overlay_set **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    }
    *out = NULL;
    if (!backend || !overlays || max_loras == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: backend or overlays NULL, or max_loras 0", fn);
    }
    return check_slots(overlays, max_loras, backend);
}

tovl_status tovl_token_overlay_set_from_slots(tovl_backend *backend, tovl_embed_overlay *const *overlays,
                                              uint32_t max_loras, bool tied, tovl_token_overlay_set **out) {
    tovl_status st = check_build_args("from_slots", backend, overlays, max_loras, out);
    return st == TOVL_OK ? set_build("from_slots", backend, overlays, max_loras, tied, false, 0, 0, out) : st;
}

tovl_status tovl_token_overlay_set_from_slots_shard(tovl_backend *backend, tovl_embed_overlay *const *overlays,
                                                    uint32_t max_loras, bool tied, uint32_t vocab_start,
                                                    uint32_t vocab_end, tovl_token_overlay_set **out) {
    const char *fn = "from_slots_shard";
    tovl_status st = check_build_args(fn, backend, overlays, max_loras, out);
    if (st != TOVL_OK) {
        return st;
    }
    if (vocab_start >= vocab_end) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "%s: vocab_start %u >= vocab_end %u: the shard [vocab_start, vocab_end) is empty", fn,
                          vocab_start, vocab_end);
    }
    uint32_t vocab, hidden;
    pool_shape(overlays, max_loras, &vocab, &hidden);
    if (vocab > 0 && vocab_start >= vocab) {
        return tovl_error(TOVL_ERR_ID_OUT_OF_RANGE,
                          "%s: vocab_start %u >= vocab %u of the overlays: the shard [%u, %u) lies past the served "
                          "vocab and holds no cell",
                          fn, vocab_start, vocab, vocab_start, vocab_end);
    }
    return set_build(fn, backend, overlays, max_loras, tied, true, vocab_start, vocab_end, out);
}

void tovl_token_overlay_set_shard_range(const tovl_token_overlay_set *set, uint32_t *vocab_start,
                                        uint32_t *vocab_end) {
    if (vocab_start) {
        *vocab_start = set ? set->vocab_start : 0;
    }
    if (vocab_end) {
        *vocab_end = set ? set->vocab_end : 0;
    }
}

tovl_status tovl_vocab_shard_range(uint32_t vocab, uint32_t world_size, uint32_t rank, uint32_t pad_multiple,
                                   uint32_t *start, uint32_t *end) {
    if (start) {
        *start = 0;
    }
    if (end) {
        *end = 0;
    }
    if (!start || !end) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_vocab_shard_range: start or end is NULL");
    }
    if (vocab == 0 || world_size == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_vocab_shard_range: vocab %u and world_size %u must be > 0",
                          vocab, world_size);
    }
    if (rank >= world_size) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_vocab_shard_range: rank %u >= world_size %u", rank,
                          world_size);
    }
    const uint64_t pad = pad_multiple ? pad_multiple : TOVL_VOCAB_PAD_DEFAULT;
    const uint64_t padded = ((uint64_t)vocab + pad - 1) / pad * pad;
    if (padded > UINT32_MAX) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "tovl_vocab_shard_range: vocab %u padded to a multiple of %llu exceeds 2^32 - 1", vocab,
                          (unsigned long long)pad);
    }
    const uint64_t width = (padded + world_size - 1) / world_size;
    const uint64_t lo = (uint64_t)rank * width, hi = lo + width;
    *start = (uint32_t)(lo < padded ? lo : padded);
    *end = (uint32_t)(hi < padded ? hi : padded);
    tovl_clear_error();
    return TOVL_OK;
}

void tovl_token_overlay_set_destroy(tovl_token_overlay_set *set) {
    if (set) {
        tovl_set_free(set);
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

uint32_t tovl_token_overlay_set_lmhead_grid_y(const tovl_token_overlay_set *set) {
    if (!set) {
        return 0;
    }
    return set->fixed && set->max_n_override > TOVL_SET_SHAPED_ROWS ? TOVL_SET_SHAPED_ROWS : set->max_n_override;
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
