/* lmhead_overlay_{bf16,f32}: for each logits row t of slot s and each k <
 * n_override[s], logits[t * ld + ids[k]] = dot(hidden[t], rows[k]), stored as
 * f32 or bf16 (nearest-even). No other logits cell is written. */
#include <string.h>

#include "cpu_kernels.h"
#include "tovl/tovl.h"

void tovl_cpu_lmhead_overlay(const tovl_lmhead_overlay_args *args, bool f32_logits) {
    const uint16_t *hidden = TOVL_CPU_PTR(const uint16_t, args->hidden);
    const uint64_t *rows_table = TOVL_CPU_PTR(const uint64_t, args->rows_table);
    const uint64_t *ids_table = TOVL_CPU_PTR(const uint64_t, args->ids_table);
    const uint32_t *n_table = TOVL_CPU_PTR(const uint32_t, args->n_table);
    for (uint32_t t = 0; t < args->T; t++) {
        int32_t s = tovl_cpu_row_slot(args->row_slots, args->active_slot, t);
        if (s < 0 || (uint32_t)s >= args->max_loras) {
            continue;
        }
        uint32_t n = n_table[s] < args->max_n ? n_table[s] : args->max_n;
        const uint32_t *ids = TOVL_CPU_PTR(const uint32_t, ids_table[s]);
        const uint16_t *rows = TOVL_CPU_PTR(const uint16_t, rows_table[s]);
        const uint16_t *x = hidden + (size_t)t * args->h;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t id = ids[k];
            if (id >= args->vocab) {
                continue;
            }
            float dot = tovl_cpu_dot_bf16(x, rows + (size_t)k * args->h, args->h);
            size_t cell = (size_t)t * args->ld + id;
            if (f32_logits) {
                uint32_t bits = tovl_cpu_f32_out_bits(dot);
                memcpy(TOVL_CPU_PTR(uint32_t, args->logits) + cell, &bits, sizeof bits);
            } else {
                TOVL_CPU_PTR(uint16_t, args->logits)[cell] = tovl_f32_to_bf16(dot);
            }
        }
    }
}
