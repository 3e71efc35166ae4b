/* Fixed-shape sets: one shape for the set's whole life, slots loaded and
 * unloaded in place by stream-ordered writes of their table entries. The
 * tables point into the overlays' own buffers (no row is copied), so a load
 * writes 40 bytes; the overlay it replaces stays retained until a fence
 * recorded after the write has passed. A shard set's load also writes the
 * slot's in-shard ids, shifted, into a buffer the set owns: 4 bytes a cell. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "overlay.h"
#include "overlay_set.h"

/* The tables' order inside the one allocation: the four u64 tables, then the
 * two u32 ones, each max_loras entries (every table stays 8-byte aligned). */
enum { FIELD_SLOT_MAP, FIELD_EMBED_ROWS, FIELD_LMHEAD_ROWS, FIELD_LMHEAD_IDS, FIELD_EMBED_N, FIELD_N_OVERRIDE,
       FIELD_COUNT };

/* A shard set's id for a cell of the span that lies outside the shard: every
 * port skips an id >= the kernels' vocab (the spec's `id < vocab`). */
#define OUTSIDE_SHARD UINT32_MAX

static uint64_t field_offset(uint32_t max_loras, int field) {
    return field < FIELD_EMBED_N ? (uint64_t)field * 8u * max_loras
                                 : 32u * (uint64_t)max_loras + (uint64_t)(field - FIELD_EMBED_N) * 4u * max_loras;
}

/* One slot's six entries, in the order of the fields, and for a shard set
 * the `ids_count` shifted ids staged in the set's ids_scratch. */
typedef struct slot_entries {
    uint64_t slot_map, embed_rows, lmhead_rows, lmhead_ids;
    uint32_t embed_n, n_override;
    uint32_t ids_count;
} slot_entries;

/* A shard set's cells of one slot: the span of the slot's lm_head source from
 * its first to its last id inside [vocab_start, vocab_end). Ids that increase,
 * as the importer makes them, give a span of exactly the in-shard cells; in any
 * other order the span's cells outside the shard get OUTSIDE_SHARD. The rows
 * are the overlay's own, from the span's first. */
static void shard_entries(tovl_token_overlay_set *set, const tovl_embed_overlay *ov, slot_entries *e, uint32_t s) {
    const uint32_t *host = ov->has_lmhead ? ov->host_lmhead_ids : ov->host_embed_ids;
    const uint32_t n = e->n_override;
    uint32_t first = n, last = 0;
    for (uint32_t j = 0; j < n; j++) {
        if (host[j] >= set->vocab_start && host[j] < set->vocab_end) {
            first = first == n ? j : first;
            last = j;
        }
    }
    if (first == n) {
        e->lmhead_rows = e->lmhead_ids = 0;
        e->n_override = 0;
        return;
    }
    const uint32_t m = last - first + 1;
    for (uint32_t k = 0; k < m; k++) {
        const uint32_t id = host[first + k];
        set->ids_scratch[k] = id >= set->vocab_start && id < set->vocab_end ? id - set->vocab_start : OUTSIDE_SHARD;
    }
    e->lmhead_rows += (uint64_t)first * set->hidden * sizeof(uint16_t);
    e->lmhead_ids = set->ids_block + 4ull * set->lmhead_capacity * s;
    e->n_override = m;
    e->ids_count = m;
}

static slot_entries entries_of(tovl_token_overlay_set *set, const tovl_embed_overlay *ov, uint32_t s) {
    slot_entries e;
    memset(&e, 0, sizeof e);
    if (ov) {
        e.slot_map = ov->slot_map;
        e.embed_rows = ov->embed_rows;
        e.embed_n = ov->embed_count;
        tovl_devptr ids, rows;
        tovl_set_lmhead_source(set, ov, &ids, &rows, &e.n_override);
        e.lmhead_rows = rows;
        e.lmhead_ids = ids;
        if (set->sharded) {
            shard_entries(set, ov, &e, s);
        }
    }
    return e;
}

/* Write slot s's entries (and a shard set's staged ids) on `stream`, as one
 * step of the stream. */
static tovl_status write_entries(tovl_token_overlay_set *set, uint32_t s, const slot_entries *e, void *stream,
                                 bool *settled) {
    const uint32_t L = set->max_loras;
    const void *src[FIELD_COUNT] = {&e->slot_map, &e->embed_rows, &e->lmhead_rows, &e->lmhead_ids, &e->embed_n,
                                    &e->n_override};
    tovl_device_write w[FIELD_COUNT + 1];
    for (int f = 0; f < FIELD_COUNT; f++) {
        const size_t elem = f < FIELD_EMBED_N ? 8u : 4u;
        w[f] = (tovl_device_write){set->table_block + field_offset(L, f) + elem * s, src[f], elem};
    }
    uint32_t count = FIELD_COUNT;
    if (e->ids_count > 0) {
        w[count++] = (tovl_device_write){e->lmhead_ids, set->ids_scratch, (size_t)e->ids_count * 4u};
    }
    return tovl_core_write(set->backend, w, count, stream, settled);
}

/* Both creators; a shard set covers [vocab_start, vocab_end), checked by the caller. */
static tovl_status fixed_create(const char *fn, tovl_backend *backend, const tovl_set_shape *shape, bool sharded,
                                uint32_t vocab_start, uint32_t vocab_end, tovl_token_overlay_set **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    }
    *out = NULL;
    if (!backend || !shape) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: backend or shape is NULL", fn);
    }
    const char *zero = shape->max_loras == 0 ? "max_loras"
                       : shape->vocab == 0   ? "vocab"
                       : shape->hidden == 0  ? "hidden"
                                             : NULL;
    if (zero) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: shape.%s is 0", fn, zero);
    }
    if (shape->max_loras > UINT32_MAX / 40u) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: shape.max_loras %u is over %u", fn, shape->max_loras,
                          UINT32_MAX / 40u);
    }
    tovl_token_overlay_set *set = calloc(1, sizeof *set);
    if (set) {
        set->overlays = calloc(shape->max_loras, sizeof *set->overlays);
    }
    if (!set || !set->overlays) {
        free(set);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of host memory (max_loras %u)", fn, shape->max_loras);
    }
    if (pthread_mutex_init(&set->lock, NULL) != 0) {
        free(set->overlays);
        free(set);
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: pthread_mutex_init failed", fn);
    }
    set->fixed = true;
    set->backend = backend;
    set->max_loras = shape->max_loras;
    set->tied = shape->tied;
    set->vocab = shape->vocab;
    set->hidden = shape->hidden;
    set->sharded = sharded;
    set->vocab_start = sharded ? vocab_start : 0;
    set->vocab_end = sharded ? vocab_end : shape->vocab;
    set->embed_capacity = shape->embed_capacity;
    set->lmhead_capacity = shape->lmhead_capacity;
    set->max_embed_n = shape->embed_capacity;
    set->max_n_override = shape->lmhead_capacity;

    const size_t bytes = 40u * (size_t)shape->max_loras;
    uint8_t *zeros = calloc(1, bytes);
    tovl_status st = zeros ? tovl_alloc(backend, bytes, &set->table_block)
                           : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    if (st == TOVL_OK) {
        st = tovl_upload(backend, set->table_block, zeros, bytes);
    }
    free(zeros);
    if (st == TOVL_OK && sharded && shape->lmhead_capacity > 0) {
        const size_t id_bytes = 4u * (size_t)shape->lmhead_capacity;
        set->ids_scratch = malloc(id_bytes);
        st = set->ids_scratch ? tovl_alloc(backend, id_bytes * shape->max_loras, &set->ids_block)
                              : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "%s: out of host memory (lmhead_capacity %u)", fn,
                                           shape->lmhead_capacity);
    }
    if (st != TOVL_OK) {
        tovl_set_free(set);
        return st;
    }
    const uint32_t L = shape->max_loras;
    set->tables = (tovl_overlay_tables){
        .embed_slot_map_table = set->table_block + field_offset(L, FIELD_SLOT_MAP),
        .embed_rows_table = set->table_block + field_offset(L, FIELD_EMBED_ROWS),
        .embed_n_table = set->table_block + field_offset(L, FIELD_EMBED_N),
        .lmhead_rows_table = set->table_block + field_offset(L, FIELD_LMHEAD_ROWS),
        .lmhead_ids_table = set->table_block + field_offset(L, FIELD_LMHEAD_IDS),
        .n_override_table = set->table_block + field_offset(L, FIELD_N_OVERRIDE),
    };
    tovl_clear_error();
    *out = set;
    return TOVL_OK;
}

tovl_status tovl_token_overlay_set_create(tovl_backend *backend, const tovl_set_shape *shape,
                                          tovl_token_overlay_set **out) {
    return fixed_create("tovl_token_overlay_set_create", backend, shape, false, 0, 0, out);
}

tovl_status tovl_token_overlay_set_create_shard(tovl_backend *backend, const tovl_set_shape *shape,
                                                uint32_t vocab_start, uint32_t vocab_end,
                                                tovl_token_overlay_set **out) {
    const char *fn = "tovl_token_overlay_set_create_shard";
    if (out) {
        *out = NULL;
    }
    if (vocab_start >= vocab_end) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "%s: vocab_start %u >= vocab_end %u: the shard [vocab_start, vocab_end) is empty", fn,
                          vocab_start, vocab_end);
    }
    if (shape && shape->vocab > 0 && vocab_start >= shape->vocab) {
        return tovl_error(TOVL_ERR_ID_OUT_OF_RANGE,
                          "%s: vocab_start %u >= shape.vocab %u: the shard [%u, %u) lies past the served vocab and "
                          "holds no cell",
                          fn, vocab_start, shape->vocab, vocab_start, vocab_end);
    }
    return fixed_create(fn, backend, shape, true, vocab_start, vocab_end, out);
}

/* Why `ov` cannot go into this set's slot, as an error; TOVL_OK when it fits. */
static tovl_status check_fit(const tovl_token_overlay_set *set, uint32_t slot, const tovl_embed_overlay *ov) {
    const char *fn = "tovl_token_overlay_set_load";
    if (ov->backend != set->backend) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: %s was built on backend %s, the set is on %s", fn,
                          ov->adapter, tovl_backend_name(ov->backend), tovl_backend_name(set->backend));
    }
    if (ov->vocab != set->vocab) {
        return tovl_error(TOVL_ERR_VOCAB_MISMATCH, "%s: %s has vocab %u, the set serves vocab %u", fn, ov->adapter,
                          ov->vocab, set->vocab);
    }
    if (ov->hidden != set->hidden) {
        return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "%s: %s has hidden size %u, the set has %u", fn, ov->adapter,
                          ov->hidden, set->hidden);
    }
    if (ov->tied != set->tied) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: %s was built for a%s model, the set is %s", fn,
                          ov->adapter, ov->tied ? " tied" : "n untied", set->tied ? "tied" : "untied");
    }
    if (ov->embed_count > set->embed_capacity) {
        return tovl_error(TOVL_ERR_CAPACITY,
                          "%s: %s has %u embedding rows, slot %u holds at most %u (the set's embed_capacity; "
                          "create a set with a larger one for this adapter)",
                          fn, ov->adapter, ov->embed_count, slot, set->embed_capacity);
    }
    tovl_devptr ids, rows;
    uint32_t n;
    tovl_set_lmhead_source(set, ov, &ids, &rows, &n);
    if (n > set->lmhead_capacity) {
        return tovl_error(TOVL_ERR_CAPACITY,
                          "%s: %s has %u lm_head cells%s, slot %u holds at most %u (the set's lmhead_capacity; "
                          "create a set with a larger one for this adapter)",
                          fn, ov->adapter, n, ov->has_lmhead ? "" : " (its tied embedding rows)", slot,
                          set->lmhead_capacity);
    }
    return TOVL_OK;
}

/* Release the retired overlays whose fence has passed; keeps the others in order. */
static tovl_status collect_locked(tovl_token_overlay_set *set) {
    tovl_status st = TOVL_OK;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < set->retired_count; i++) {
        tovl_retired_overlay r = set->retired[i];
        bool passed = false;
        if (st == TOVL_OK) {
            st = tovl_core_fence_query(set->backend, r.fence, &passed);
        }
        if (passed) {
            tovl_core_fence_destroy(set->backend, r.fence);
            tovl_embed_overlay_release(r.overlay);
        } else {
            set->retired[kept++] = r;
        }
    }
    set->retired_count = kept;
    return st;
}

static tovl_status reserve_retired(tovl_token_overlay_set *set) {
    if (set->retired_count < set->retired_capacity) {
        return TOVL_OK;
    }
    uint32_t cap = set->retired_capacity ? 2 * set->retired_capacity : 8;
    tovl_retired_overlay *grown = realloc(set->retired, (size_t)cap * sizeof *grown);
    if (!grown) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "tovl_token_overlay_set_load: out of host memory (%u retired)",
                          cap);
    }
    set->retired = grown;
    set->retired_capacity = cap;
    return TOVL_OK;
}

/* Hold the slot's previous overlay until the stream has passed the swap. */
static void retire(tovl_token_overlay_set *set, tovl_embed_overlay *old, bool settled, void *stream) {
    if (!old) {
        return;
    }
    tovl_fence fence = 0;
    if (!settled && tovl_core_fence_record(set->backend, stream, &fence) != TOVL_OK) {
        /* No fence: wait for the stream rather than free what it may read. */
        fence = 0;
        (void)tovl_synchronize(set->backend, stream);
    }
    if (fence == 0) {
        tovl_embed_overlay_release(old);
        return;
    }
    set->retired[set->retired_count++] = (tovl_retired_overlay){old, fence};
}

static tovl_status swap_slot(tovl_token_overlay_set *set, const char *fn, uint32_t slot, tovl_embed_overlay *ov,
                             void *stream) {
    if (!set) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: set is NULL", fn);
    }
    if (!set->fixed) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "%s: the set was built by from_slots and keeps its contents; "
                          "tovl_token_overlay_set_create makes a set whose slots load in place",
                          fn);
    }
    if (slot >= set->max_loras) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: slot %u >= max_loras %u", fn, slot, set->max_loras);
    }
    if (ov) {
        tovl_status st = check_fit(set, slot, ov);
        if (st != TOVL_OK) {
            return st;
        }
    }
    pthread_mutex_lock(&set->lock);
    tovl_status st = collect_locked(set);
    if (st == TOVL_OK) {
        st = reserve_retired(set);
    }
    tovl_embed_overlay *old = set->overlays[slot];
    bool settled = false;
    if (st == TOVL_OK && old != ov) {
        const slot_entries e = entries_of(set, ov, slot);
        st = write_entries(set, slot, &e, stream, &settled);
        if (st != TOVL_OK) {
            /* Put the old entries back, so no later launch sees a part of the
             * refused write; keep this error's detail. */
            const slot_entries back = entries_of(set, old, slot);
            bool ignored;
            char detail[512];
            snprintf(detail, sizeof detail, "%s", tovl_last_error());
            (void)write_entries(set, slot, &back, stream, &ignored);
            tovl_error(st, "%s", detail);
        }
    }
    if (st == TOVL_OK && old != ov) {
        tovl_embed_overlay_retain(ov);
        set->overlays[slot] = ov;
        retire(set, old, settled, stream);
        bool any = false;
        for (uint32_t s = 0; s < set->max_loras; s++) {
            any = any || set->overlays[s];
        }
        set->any_active = any;
    }
    pthread_mutex_unlock(&set->lock);
    if (st == TOVL_OK) {
        tovl_clear_error();
    }
    return st;
}

tovl_status tovl_token_overlay_set_load(tovl_token_overlay_set *set, uint32_t slot, tovl_embed_overlay *overlay,
                                        void *stream) {
    if (!overlay) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                          "tovl_token_overlay_set_load: overlay is NULL (tovl_token_overlay_set_unload empties a "
                          "slot)");
    }
    return swap_slot(set, "tovl_token_overlay_set_load", slot, overlay, stream);
}

tovl_status tovl_token_overlay_set_unload(tovl_token_overlay_set *set, uint32_t slot, void *stream) {
    return swap_slot(set, "tovl_token_overlay_set_unload", slot, NULL, stream);
}

tovl_status tovl_token_overlay_set_collect(tovl_token_overlay_set *set, uint32_t *pending) {
    if (pending) {
        *pending = 0;
    }
    if (!set) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_token_overlay_set_collect: set is NULL");
    }
    if (!set->fixed) {
        return TOVL_OK;
    }
    pthread_mutex_lock(&set->lock);
    tovl_status st = collect_locked(set);
    if (pending) {
        *pending = set->retired_count;
    }
    pthread_mutex_unlock(&set->lock);
    return st;
}

bool tovl_token_overlay_set_is_fixed(const tovl_token_overlay_set *set) {
    return set && set->fixed;
}

tovl_embed_overlay *tovl_token_overlay_set_slot(tovl_token_overlay_set *set, uint32_t slot) {
    if (!set || !set->fixed || slot >= set->max_loras) {
        return NULL;
    }
    pthread_mutex_lock(&set->lock);
    tovl_embed_overlay *ov = set->overlays[slot];
    pthread_mutex_unlock(&set->lock);
    return ov;
}
