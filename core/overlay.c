/* EmbedOverlay: validation, upload, reference counting; and tovl_rowdiff. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "overlay.h"

static const char *tensor_name(const tovl_overlay_rows *part, const char *fallback) {
    return part->tensor ? part->tensor : fallback;
}

/* Width, range and duplicate checks for one part; `seen` is a vocab-bit scratch. */
static tovl_status check_part(const tovl_overlay_desc *d, const tovl_overlay_rows *part,
                              const char *fallback, uint8_t *seen) {
    const char *adapter = d->adapter ? d->adapter : "(unnamed adapter)";
    const char *tensor = tensor_name(part, fallback);
    if (part->count == 0) {
        return TOVL_OK;
    }
    if (!part->ids || !part->rows) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: tensor %s: %u rows but ids or rows is NULL",
                          adapter, tensor, part->count);
    }
    if (part->width != d->hidden) {
        return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "%s: tensor %s: row width %u, hidden size is %u", adapter,
                          tensor, part->width, d->hidden);
    }
    memset(seen, 0, (d->vocab + 7u) / 8u);
    for (uint32_t j = 0; j < part->count; j++) {
        uint32_t id = part->ids[j];
        if (id >= d->vocab) {
            return tovl_error(TOVL_ERR_ID_OUT_OF_RANGE, "%s: tensor %s: id %u (entry %u) >= vocab %u", adapter,
                              tensor, id, j, d->vocab);
        }
        if (seen[id / 8u] & (1u << (id % 8u))) {
            return tovl_error(TOVL_ERR_DUPLICATE_ID, "%s: tensor %s: id %u appears twice (again at entry %u)",
                              adapter, tensor, id, j);
        }
        seen[id / 8u] |= (uint8_t)(1u << (id % 8u));
    }
    return TOVL_OK;
}

static tovl_status check_kernels(const tovl_overlay_desc *d, const tovl_overlay_kernels *k) {
    const char *adapter = d->adapter ? d->adapter : "(unnamed adapter)";
    if (d->embed.count > 0 && !k->embed_overlay) {
        return tovl_error(TOVL_ERR_KERNEL_MISSING, "%s: embed rows (%s) need kernel 'embed_overlay', missing",
                          adapter, tensor_name(&d->embed, "embed"));
    }
    bool lm_rows = d->has_lmhead ? d->lmhead.count > 0 : (d->tied && d->embed.count > 0);
    if (lm_rows && (!k->lmhead_overlay_bf16 || !k->lmhead_overlay_f32)) {
        return tovl_error(TOVL_ERR_KERNEL_MISSING, "%s: lm_head rows (%s) need kernel '%s', missing", adapter,
                          d->has_lmhead ? tensor_name(&d->lmhead, "lm_head") : "tied embed rows",
                          !k->lmhead_overlay_bf16 ? TOVL_KERNEL_LMHEAD_OVERLAY_BF16 : TOVL_KERNEL_LMHEAD_OVERLAY_F32);
    }
    return TOVL_OK;
}

static void overlay_free_device(tovl_embed_overlay *ov) {
    tovl_free(ov->backend, ov->embed_ids);
    tovl_free(ov->backend, ov->embed_rows);
    tovl_free(ov->backend, ov->slot_map);
    tovl_free(ov->backend, ov->lmhead_ids);
    tovl_free(ov->backend, ov->lmhead_rows);
    free(ov->host_embed_ids);
    free(ov->host_lmhead_ids);
}

/* A host copy of a part's ids; NULL (and TOVL_OK) for an empty part. */
static tovl_status keep_host_ids(const tovl_overlay_rows *part, uint32_t **out) {
    *out = NULL;
    if (part->count == 0) {
        return TOVL_OK;
    }
    *out = malloc((size_t)part->count * sizeof **out);
    if (!*out) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "tovl_build_overlay: out of host memory (%u ids)", part->count);
    }
    memcpy(*out, part->ids, (size_t)part->count * sizeof **out);
    return TOVL_OK;
}

/* Allocate and upload one array; leaves *dst 0 for count 0. */
static tovl_status upload_array(tovl_backend *be, const void *src, size_t bytes, tovl_devptr *dst) {
    *dst = 0;
    if (bytes == 0) {
        return TOVL_OK;
    }
    tovl_status st = tovl_alloc(be, bytes, dst);
    if (st == TOVL_OK) {
        st = tovl_upload(be, *dst, src, bytes);
    }
    return st;
}

static tovl_status upload_part(tovl_backend *be, const tovl_overlay_rows *part, uint32_t hidden,
                               tovl_devptr *ids, tovl_devptr *rows) {
    tovl_status st = upload_array(be, part->ids, (size_t)part->count * sizeof(uint32_t), ids);
    if (st == TOVL_OK) {
        st = upload_array(be, part->rows, (size_t)part->count * hidden * sizeof(uint16_t), rows);
    }
    return st;
}

static tovl_status upload_slot_map(tovl_backend *be, const tovl_overlay_desc *d, tovl_devptr *slot_map) {
    int32_t *map = malloc((size_t)d->vocab * sizeof *map);
    if (!map) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "slot_map: out of host memory (vocab %u)", d->vocab);
    }
    for (uint32_t i = 0; i < d->vocab; i++) {
        map[i] = -1;
    }
    for (uint32_t j = 0; j < d->embed.count; j++) {
        map[d->embed.ids[j]] = (int32_t)j;
    }
    tovl_status st = upload_array(be, map, (size_t)d->vocab * sizeof *map, slot_map);
    free(map);
    return st;
}

tovl_status tovl_build_overlay(tovl_backend *backend, const tovl_overlay_kernels *kernels,
                               const tovl_overlay_desc *desc, tovl_embed_overlay **out) {
    if (!out) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_build_overlay: out is NULL");
    }
    *out = NULL;
    if (!backend || !kernels || !desc) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_build_overlay: backend, kernels or desc is NULL");
    }
    if (desc->vocab == 0 || desc->hidden == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "%s: vocab (%u) and hidden (%u) must be > 0",
                          desc->adapter ? desc->adapter : "(unnamed adapter)", desc->vocab, desc->hidden);
    }
    uint8_t *seen = malloc((desc->vocab + 7u) / 8u);
    if (!seen) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "tovl_build_overlay: out of host memory");
    }
    tovl_status st = check_part(desc, &desc->embed, "embed", seen);
    if (st == TOVL_OK && desc->has_lmhead) {
        st = check_part(desc, &desc->lmhead, "lm_head", seen);
    }
    free(seen);
    if (st == TOVL_OK) {
        st = check_kernels(desc, kernels);
    }
    if (st != TOVL_OK) {
        return st;
    }

    tovl_embed_overlay *ov = calloc(1, sizeof *ov);
    if (!ov) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "tovl_build_overlay: out of host memory");
    }
    ov->backend = backend;
    atomic_init(&ov->refs, 1);
    snprintf(ov->adapter, sizeof ov->adapter, "%s", desc->adapter ? desc->adapter : "(unnamed adapter)");
    ov->tied = desc->tied;
    ov->vocab = desc->vocab;
    ov->hidden = desc->hidden;
    ov->embed_count = desc->embed.count;
    ov->has_lmhead = desc->has_lmhead;
    ov->lmhead_count = desc->has_lmhead ? desc->lmhead.count : 0;

    st = keep_host_ids(&desc->embed, &ov->host_embed_ids);
    if (st == TOVL_OK && desc->has_lmhead) {
        st = keep_host_ids(&desc->lmhead, &ov->host_lmhead_ids);
    }
    if (st == TOVL_OK) {
        st = upload_part(backend, &desc->embed, desc->hidden, &ov->embed_ids, &ov->embed_rows);
    }
    if (st == TOVL_OK && desc->embed.count > 0) {
        st = upload_slot_map(backend, desc, &ov->slot_map);
    }
    if (st == TOVL_OK && desc->has_lmhead) {
        st = upload_part(backend, &desc->lmhead, desc->hidden, &ov->lmhead_ids, &ov->lmhead_rows);
    }
    if (st != TOVL_OK) {
        overlay_free_device(ov);
        free(ov);
        return st;
    }
    tovl_clear_error();
    *out = ov;
    return TOVL_OK;
}

void tovl_embed_overlay_retain(tovl_embed_overlay *overlay) {
    if (overlay) {
        atomic_fetch_add(&overlay->refs, 1);
    }
}

void tovl_embed_overlay_release(tovl_embed_overlay *overlay) {
    if (overlay && atomic_fetch_sub(&overlay->refs, 1) == 1) {
        overlay_free_device(overlay);
        free(overlay);
    }
}

tovl_embed_overlay_view tovl_embed_overlay_get_view(const tovl_embed_overlay *ov) {
    tovl_embed_overlay_view v;
    memset(&v, 0, sizeof v);
    if (ov) {
        v.vocab = ov->vocab;
        v.hidden = ov->hidden;
        v.embed_count = ov->embed_count;
        v.embed_ids = ov->embed_ids;
        v.embed_rows = ov->embed_rows;
        v.slot_map = ov->slot_map;
        v.has_lmhead = ov->has_lmhead;
        v.lmhead_count = ov->lmhead_count;
        v.lmhead_ids = ov->lmhead_ids;
        v.lmhead_rows = ov->lmhead_rows;
    }
    return v;
}

tovl_status tovl_rowdiff(tovl_backend *backend, const tovl_overlay_kernels *kernels, tovl_devptr a,
                         tovl_devptr b, uint32_t rows, uint32_t hidden, float tol, uint32_t *changed,
                         uint32_t *n_changed) {
    if (!backend || !kernels || !n_changed || (rows && (!a || !b || !changed)) || hidden == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_rowdiff: NULL argument or hidden 0");
    }
    if (!(tol >= 0.0f)) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_rowdiff: tol %g must be >= 0", (double)tol);
    }
    *n_changed = 0;
    if (!kernels->rowdiff) {
        return tovl_error(TOVL_ERR_KERNEL_MISSING, "tovl_rowdiff: kernel 'rowdiff' missing on backend %s",
                          tovl_backend_name(backend));
    }
    if (rows == 0) {
        return TOVL_OK;
    }
    uint32_t *flags = malloc((size_t)rows * sizeof *flags);
    if (!flags) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "tovl_rowdiff: out of host memory (%u rows)", rows);
    }
    tovl_devptr dflags = 0;
    tovl_status st = tovl_alloc(backend, (size_t)rows * sizeof *flags, &dflags);
    if (st == TOVL_OK) {
        tovl_rowdiff_args args = {.a = a, .b = b, .flags = dflags, .rows = rows, .h = hidden, .tol = tol};
        st = tovl_core_launch(backend, kernels->rowdiff, rows, 1, &args, sizeof args, NULL);
    }
    if (st == TOVL_OK) {
        st = tovl_synchronize(backend, NULL);
    }
    if (st == TOVL_OK) {
        st = tovl_download(backend, flags, dflags, (size_t)rows * sizeof *flags);
    }
    if (st == TOVL_OK) {
        uint32_t n = 0;
        for (uint32_t r = 0; r < rows; r++) {
            if (flags[r]) {
                changed[n++] = r;
            }
        }
        *n_changed = n;
    }
    tovl_free(backend, dflags);
    free(flags);
    return st;
}
