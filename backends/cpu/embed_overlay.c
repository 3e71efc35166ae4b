/* embed_overlay: copy an adapter's embedding row over the gathered row of each
 * token whose slot holds an overlay for that token id; all other rows stay. */
#include <string.h>

#include "cpu_kernels.h"

void tovl_cpu_embed_overlay(const tovl_embed_overlay_args *args) {
    uint16_t *hidden = TOVL_CPU_PTR(uint16_t, args->hidden);
    const uint32_t *ids = TOVL_CPU_PTR(const uint32_t, args->token_ids);
    const uint64_t *slot_maps = TOVL_CPU_PTR(const uint64_t, args->slot_map_table);
    const uint64_t *rows_table = TOVL_CPU_PTR(const uint64_t, args->rows_table);
    const uint32_t *n_table = TOVL_CPU_PTR(const uint32_t, args->n_table);
    for (uint32_t t = 0; t < args->T; t++) {
        int32_t s = tovl_cpu_row_slot(args->token_slots, args->active_slot, t);
        if (s < 0 || (uint32_t)s >= args->max_loras || slot_maps[s] == 0) {
            continue;
        }
        uint32_t id = ids[t];
        if (id >= args->vocab) {
            continue;
        }
        int32_t j = TOVL_CPU_PTR(const int32_t, slot_maps[s])[id];
        if (j < 0 || (uint32_t)j >= n_table[s]) {
            continue;
        }
        const uint16_t *row = TOVL_CPU_PTR(const uint16_t, rows_table[s]) + (size_t)j * args->h;
        memcpy(hidden + (size_t)t * args->h, row, (size_t)args->h * sizeof *row);
    }
}
