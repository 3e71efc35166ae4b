/* lmhead_check(w, out, f32, poison): every logits cell of the workload's
 * lm_head hook (`out`, the T x VOCAB cells fetched back) against the CPU
 * reference's dot, and every other cell against the poison byte it was
 * filled with. Shared by the standalone programs in bench/ that run the
 * lm_head kernels; the includer provides cpu_kernels.h (the reference). */
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "bench_workload.h"

struct LmheadCheck {
    size_t cells; /* cells the hook must write */
    size_t bad;   /* of those, not the reference's bits */
    size_t stray; /* bytes of the other cells that are not the poison */
};

static LmheadCheck lmhead_check(const Workload &w, const std::vector<uint8_t> &out, bool f32, uint8_t poison) {
    const size_t esz = f32 ? 4 : 2;
    LmheadCheck r = {0, 0, 0};
    std::vector<uint8_t> expect((size_t)w.T * VOCAB, 0);
    for (uint32_t t = 0; t < w.T; t++) {
        const int32_t s = w.slots[t];
        if (s < 0) continue;
        for (uint32_t k = 0; k < N; k++) {
            const size_t c = (size_t)t * VOCAB + w.ids[s][k];
            const float d = tovl_cpu_dot_bf16(&w.hidden[(size_t)t * H], &w.rows[s][(size_t)k * H], H);
            expect[c] = 1;
            r.cells++;
            if (f32) {
                uint32_t want = tovl_cpu_f32_out_bits(d), got;
                memcpy(&got, &out[c * 4], 4);
                r.bad += got != want;
            } else {
                uint16_t want = tovl_f32_to_bf16(d), got;
                memcpy(&got, &out[c * 2], 2);
                r.bad += got != want;
            }
        }
    }
    for (size_t c = 0; c < expect.size(); c++) {
        if (expect[c]) continue;
        for (size_t b = 0; b < esz; b++) r.stray += out[c * esz + b] != poison;
    }
    return r;
}
