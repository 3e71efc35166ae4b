#version 460
#extension GL_GOOGLE_include_directive : require
// embed_overlay: for each token t whose slot holds an overlay row for its id,
// hidden[t, :] = that row (a bit-exact bf16 copy). Other rows stay untouched.
// One workgroup per token; 16-byte copies when the rows allow.
//
// The lookup is a chain of dependent trips to memory: the token's id and slot
// -> the slot's table cells -> slot_map[id] -> the row. How the slot's table
// cells are found (TOVL_EMBED_CELLS, one pipeline each):
//   0  chain:   read after the slot is known (one trip more);
//   1  shuffle: invocation k of each subgroup reads slot k's cells with the id
//               and slot, and each subgroup takes its slot's by a subgroup
//               shuffle (when max_loras <= the subgroup size; else as chain);
//   2  shared:  invocation k of the workgroup reads slot k's cells with the id
//               and slot, the one of the token's slot leaves them in shared
//               memory for a workgroup barrier (when max_loras <= 256; else
//               as chain).
// TOVL_EMBED_LOOKUP_ONLY: the shuffle variant's lookups without the copy
// (a probe for `tovl bench`, never a hook: it writes nothing).
// TOVL_EMBED_TOKENS (shuffle only): tokens per workgroup, a team of
// 256 / TOVL_EMBED_TOKENS invocations each.
#ifndef TOVL_EMBED_CELLS
#define TOVL_EMBED_CELLS 0
#endif
#ifndef TOVL_EMBED_TOKENS
#define TOVL_EMBED_TOKENS 1
#endif
#if TOVL_EMBED_TOKENS != 1 && TOVL_EMBED_CELLS != 1
#error several tokens per workgroup only with the shuffle variant
#endif
#define TOVL_ARGS_EMBED_OVERLAY
#include "common.glsl"
#include "args.glsl"
#if TOVL_EMBED_CELLS == 1
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

// Slot s's cells of the set's tables (64-bit addresses as two words, so a
// subgroup shuffle needs no 64-bit subgroup types).
struct SlotCells {
    uvec2 slot_map;
    uvec2 rows;
    uint n;
};

SlotCells slot_cells(uint s) {
    SlotCells c;
    c.slot_map = unpackUint2x32(U64In(args.slot_map_table).v[s]);
    c.rows = unpackUint2x32(U64In(args.rows_table).v[s]);
    c.n = U32In(args.n_table).v[s];
    return c;
}

#if TOVL_EMBED_CELLS == 2
shared uvec2 shared_slot_map;
shared uvec2 shared_rows;
shared uint shared_n;
#endif

const uint TEAM = 256u / TOVL_EMBED_TOKENS;

void main() {
    uint t = linear_group_xy() * TOVL_EMBED_TOKENS + gl_LocalInvocationIndex / TEAM;
    uint tid = gl_LocalInvocationIndex % TEAM;
    bool live = t < args.T;
    if (TOVL_EMBED_TOKENS == 1 && !live) {
        return; // the whole workgroup
    }
#if TOVL_EMBED_CELLS == 1
    const bool early = args.max_loras <= gl_SubgroupSize;
    SlotCells mine = SlotCells(uvec2(0u), uvec2(0u), 0u);
    if (early && gl_SubgroupInvocationID < args.max_loras) {
        mine = slot_cells(gl_SubgroupInvocationID);
    }
#elif TOVL_EMBED_CELLS == 2
    const bool early = args.max_loras <= gl_WorkGroupSize.x;
    SlotCells mine = SlotCells(uvec2(0u), uvec2(0u), 0u);
    if (early && tid < args.max_loras) {
        mine = slot_cells(tid);
    }
#else
    const bool early = false;
#endif
    // (With several tokens a workgroup, past T an invocation still takes part
    // in the shuffles.)
    uint id = live ? U32In(args.token_ids).v[t] : 0u;
    int s = live ? row_slot(args.token_slots, args.active_slot, t) : -1;
    bool valid = slot_valid(s, args.max_loras);
    SlotCells cells = SlotCells(uvec2(0u), uvec2(0u), 0u);
#if TOVL_EMBED_CELLS == 1
    // Every invocation is still here: the shuffles see full subgroups.
    uint lane_of_slot = valid && early ? uint(s) : 0u;
    cells.slot_map = subgroupShuffle(mine.slot_map, lane_of_slot);
    cells.rows = subgroupShuffle(mine.rows, lane_of_slot);
    cells.n = subgroupShuffle(mine.n, lane_of_slot);
#elif TOVL_EMBED_CELLS == 2
    if (early && valid && tid == uint(s)) {
        shared_slot_map = mine.slot_map;
        shared_rows = mine.rows;
        shared_n = mine.n;
    }
    barrier(); // s is uniform: every invocation reaches it
    cells.slot_map = shared_slot_map;
    cells.rows = shared_rows;
    cells.n = shared_n;
#endif
    if (!valid || id >= args.vocab) {
        return;
    }
    if (!early) {
        cells = slot_cells(uint(s));
    }
    uint64_t slot_map = packUint2x32(cells.slot_map);
    if (slot_map == uint64_t(0)) {
        return;
    }
    int j = I32In(slot_map).v[id];
#ifdef TOVL_EMBED_LOOKUP_ONLY
    if (j == -2 && tid == 0u) { // never: slot maps hold -1 or a row
        U16Buf(args.hidden).v[t] = uint16_t(0);
    }
    return;
#endif
    if (j < 0 || uint(j) >= cells.n) {
        return;
    }
    uint h = args.h;
    uint64_t src = element_address(packUint2x32(cells.rows), uint64_t(j) * uint64_t(h), 2u);
    uint64_t dst = element_address(args.hidden, uint64_t(t) * uint64_t(h), 2u);
    if ((h & 7u) == 0u && is_aligned16(src) && is_aligned16(dst)) {
        U16x8In from = U16x8In(src);
        U16x8Buf to = U16x8Buf(dst);
        uint n8 = h / 8u;
        // Two 16-byte loads in flight before their stores (the views may
        // alias as far as the compiler knows, so it would not reorder them).
        for (uint m = tid; m < n8; m += 2u * TEAM) {
            bool second = m + TEAM < n8;
            uvec4 v0 = from.v[m];
            uvec4 v1 = second ? from.v[m + TEAM] : uvec4(0u);
            to.v[m] = v0;
            if (second) {
                to.v[m + TEAM] = v1;
            }
        }
    } else {
        U16In from = U16In(src);
        U16Buf to = U16Buf(dst);
        for (uint i = tid; i < h; i += TEAM) {
            to.v[i] = from.v[i];
        }
    }
}
