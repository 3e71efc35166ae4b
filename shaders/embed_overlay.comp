#version 460
#extension GL_GOOGLE_include_directive : require
// embed_overlay: for each token t whose slot holds an overlay row for its id,
// hidden[t, :] = that row (a bit-exact bf16 copy). Other rows stay untouched.
// One workgroup per token; 16-byte copies when the rows allow.
#define TOVL_ARGS_EMBED_OVERLAY
#include "common.glsl"
#include "args.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

void main() {
    uint t = linear_group_xy();
    if (t >= args.T) {
        return;
    }
    // The loads go out in three rounds of independent reads (the row's id
    // and slot; the slot's table cells; the slot map's cell) rather than
    // one after another: each round is a trip to memory before the copy.
    uint id = U32In(args.token_ids).v[t];
    int s = row_slot(args.token_slots, args.active_slot, t);
    if (!slot_valid(s, args.max_loras)) {
        return;
    }
    uint64_t slot_map = U64In(args.slot_map_table).v[s];
    uint n = U32In(args.n_table).v[s];
    uint64_t rows = U64In(args.rows_table).v[s];
    if (slot_map == uint64_t(0) || id >= args.vocab) {
        return;
    }
    int j = I32In(slot_map).v[id];
    if (j < 0 || uint(j) >= n) {
        return;
    }
    uint h = args.h;
    uint64_t src = element_address(rows, uint64_t(j) * uint64_t(h), 2u);
    uint64_t dst = element_address(args.hidden, uint64_t(t) * uint64_t(h), 2u);
    uint tid = gl_LocalInvocationIndex;
    if ((h & 7u) == 0u && is_aligned16(src) && is_aligned16(dst)) {
        U16x8In from = U16x8In(src);
        U16x8Buf to = U16x8Buf(dst);
        uint n8 = h / 8u;
        // Two 16-byte loads in flight before their stores (the views may
        // alias as far as the compiler knows, so it would not reorder them).
        for (uint m = tid; m < n8; m += 512u) {
            bool second = m + 256u < n8;
            uvec4 v0 = from.v[m];
            uvec4 v1 = second ? from.v[m + 256u] : uvec4(0u);
            to.v[m] = v0;
            if (second) {
                to.v[m + 256u] = v1;
            }
        }
    } else {
        U16In from = U16In(src);
        U16Buf to = U16Buf(dst);
        for (uint i = tid; i < h; i += 256u) {
            to.v[i] = from.v[i];
        }
    }
}
