/* The two forward hooks: argument checks on the host, then one launch each.
 * They never allocate, copy to the host or synchronize, and read only the
 * fields of a set that never change after it is built (a fixed-shape set's
 * loads write its device tables, not these). */
#include "internal.h"
#include "overlay_set.h"

/* Rows all use one slot that is "no adapter": nothing to do. */
static bool single_slot_inactive(tovl_devptr slots, int32_t active_slot, uint32_t max_loras) {
    return !slots && (active_slot < 0 || (uint32_t)active_slot >= max_loras);
}

/* Whether the set may hold rows for a hook whose grid bound is `bound`. A
 * fixed-shape set answers from its shape alone, so a captured hook launches
 * while every slot is empty and serves what is loaded later. */
static bool holds_rows(const tovl_token_overlay_set *set, uint32_t bound) {
    return bound > 0 && (set->fixed || set->any_active);
}

tovl_status tovl_embed_hook(const tovl_token_overlay_set *set, const tovl_overlay_kernels *kernels,
                            const tovl_embed_hook_args *a, void *stream) {
    if (!set || !kernels || !a) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_embed_hook: set, kernels or args is NULL");
    }
    if (!kernels->embed_overlay || !holds_rows(set, set->max_embed_n) || a->T == 0 ||
        single_slot_inactive(a->slots, a->active_slot, set->max_loras)) {
        return TOVL_OK;
    }
    if (!a->hidden || !a->token_ids) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_embed_hook: hidden or token_ids is 0");
    }
    if (a->hidden_size != set->hidden) {
        return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "tovl_embed_hook: hidden_size %u, the overlays have %u",
                          a->hidden_size, set->hidden);
    }
    tovl_embed_overlay_args k = {
        .hidden = a->hidden,
        .token_ids = a->token_ids,
        .token_slots = a->slots,
        .slot_map_table = set->tables.embed_slot_map_table,
        .rows_table = set->tables.embed_rows_table,
        .n_table = set->tables.embed_n_table,
        .T = a->T,
        .h = set->hidden,
        .vocab = set->vocab,
        .max_loras = set->max_loras,
        .active_slot = a->active_slot,
    };
    return tovl_core_launch(set->backend, kernels->embed_overlay, a->T, 1, &k, sizeof k, stream);
}

tovl_status tovl_lmhead_hook(const tovl_token_overlay_set *set, const tovl_overlay_kernels *kernels,
                             const tovl_lmhead_hook_args *a, void *stream) {
    if (!set || !kernels || !a) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_lmhead_hook: set, kernels or args is NULL");
    }
    tovl_kernel kernel;
    switch (a->logits_dtype) {
    case TOVL_LOGITS_BF16: kernel = kernels->lmhead_overlay_bf16; break;
    case TOVL_LOGITS_F32: kernel = kernels->lmhead_overlay_f32; break;
    default:
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_lmhead_hook: logits_dtype %d is not bf16 or f32",
                          (int)a->logits_dtype);
    }
    if (!kernel || !holds_rows(set, set->max_n_override) || a->T == 0 ||
        single_slot_inactive(a->slots, a->active_slot, set->max_loras)) {
        return TOVL_OK;
    }
    if (!a->logits || !a->hidden) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "tovl_lmhead_hook: logits or hidden is 0");
    }
    if (a->hidden_size != set->hidden) {
        return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "tovl_lmhead_hook: hidden_size %u, the overlays have %u",
                          a->hidden_size, set->hidden);
    }
    /* The logits row this set patches: the whole vocab, or the rank's shard. */
    const uint32_t width = set->vocab_end - set->vocab_start;
    if (a->ld < width) {
        if (set->sharded) {
            return tovl_error(TOVL_ERR_SHAPE_MISMATCH,
                              "tovl_lmhead_hook: ld %llu < the shard's width %u (vocab [%u, %u))",
                              (unsigned long long)a->ld, width, set->vocab_start, set->vocab_end);
        }
        return tovl_error(TOVL_ERR_SHAPE_MISMATCH, "tovl_lmhead_hook: ld %llu < vocab %u",
                          (unsigned long long)a->ld, set->vocab);
    }
    tovl_lmhead_overlay_args k = {
        .logits = a->logits,
        .hidden = a->hidden,
        .row_slots = a->slots,
        .rows_table = set->tables.lmhead_rows_table,
        .ids_table = set->tables.lmhead_ids_table,
        .n_table = set->tables.n_override_table,
        .ld = a->ld,
        .T = a->T,
        .h = set->hidden,
        .vocab = width, /* a shard's ids are shifted into [0, width) */
        .max_loras = set->max_loras,
        .active_slot = a->active_slot,
        .max_n = set->max_n_override,
    };
    /* The logical grid's y: the overlay rows the launch is shaped for. A
     * fixed-shape set's capacity bounds what a slot may hold, not what it
     * usually holds, so its launch is shaped for the rows of a typical
     * adapter and the kernels loop over the columns past them
     * (kernel_args.h); a grid shaped for the capacity cost 1.4-4.7 times
     * the from_slots set's launch (docs/PERFORMANCE.md, Fixed-shape sets). */
    return tovl_core_launch(set->backend, kernel, a->T, tovl_token_overlay_set_lmhead_grid_y(set), &k, sizeof k,
                            stream);
}
