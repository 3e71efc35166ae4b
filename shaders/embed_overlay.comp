#version 460
#extension GL_GOOGLE_include_directive : require
// embed_overlay: for each token t whose slot holds an overlay row for its id,
// hidden[t, :] = that row (a bit-exact bf16 copy). Other rows stay untouched.
// One workgroup per token; 16-byte copies when the rows allow.
//
// The lookup is a chain of dependent trips to memory: (the token's id and
// slot, and every slot's table cells: invocation k reads slot k's) -> the
// slot map's cell -> the row. The invocation of the token's slot passes its
// cells on through shared memory and one workgroup barrier, so the cells cost
// no trip of their own. On the H200 that took the hook from 3.14 to 2.91 us
// at T = 1 and from 3.89 to 3.68 at T = 512, against 2.93 and 3.73 for the
// same with a subgroup shuffle (docs/VULKAN.md, Embed lookups). A set of more
// than 256 slots reads the cells after the slot is known, one trip more.
#define TOVL_ARGS_EMBED_OVERLAY
#include "common.glsl"
#include "args.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

// The token's slot's cells of the set's tables.
shared uint64_t slot_map_cell;
shared uint64_t rows_cell;
shared uint n_cell;

void main() {
    uint t = linear_group_xy();
    if (t >= args.T) {
        return; // the whole workgroup
    }
    uint tid = gl_LocalInvocationIndex;
    // Every slot's cells go out with the id and slot (one round of
    // independent reads), when there is an invocation for each slot.
    bool cells_early = args.max_loras <= gl_WorkGroupSize.x;
    uint64_t my_slot_map = uint64_t(0), my_rows = uint64_t(0);
    uint my_n = 0u;
    if (cells_early && tid < args.max_loras) {
        my_slot_map = U64In(args.slot_map_table).v[tid];
        my_rows = U64In(args.rows_table).v[tid];
        my_n = U32In(args.n_table).v[tid];
    }
    uint id = U32In(args.token_ids).v[t];
    int s = row_slot(args.token_slots, args.active_slot, t);
    // The id and slot are the workgroup's own, so every return below and the
    // barrier are uniform over the workgroup.
    if (!slot_valid(s, args.max_loras) || id >= args.vocab) {
        return;
    }
    uint64_t slot_map, rows;
    uint n;
    if (cells_early) {
        if (tid == uint(s)) {
            slot_map_cell = my_slot_map;
            rows_cell = my_rows;
            n_cell = my_n;
        }
        barrier();
        slot_map = slot_map_cell;
        rows = rows_cell;
        n = n_cell;
    } else {
        slot_map = U64In(args.slot_map_table).v[s];
        rows = U64In(args.rows_table).v[s];
        n = U32In(args.n_table).v[s];
    }
    if (slot_map == uint64_t(0)) {
        return;
    }
    int j = I32In(slot_map).v[id];
    if (j < 0 || uint(j) >= n) {
        return;
    }
    uint h = args.h;
    uint64_t src = element_address(rows, uint64_t(j) * uint64_t(h), 2u);
    uint64_t dst = element_address(args.hidden, uint64_t(t) * uint64_t(h), 2u);
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
