// lmhead_overlay_{bf16,f32}, row variant (included by the two *_row.comp files, which set
// TOVL_LOGITS_F32 or not): for row t of slot s and each k < n_override[s] with
// id = ids[s][k] < vocab, logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :]).
//
// Dispatch: X = chunks of TEAMS cells of k, Y (and Z past 65535) = t. Where X
// covers fewer chunks than the slot has (a fixed-shape set's launch is shaped
// for fewer rows than its capacity), workgroup x also does chunks x + X, ...
// A workgroup stages hidden[t] in shared memory once per XBLOCK elements and
// reuses it for its TEAMS weight rows. Team g (32 invocations) computes cell
// k = chunk * TEAMS + g; invocation q of a team owns the spec's logical lanes
// 8q .. 8q+7 and adds elements i = 256 j + 8q + e (e = 0..7) in increasing j,
// fed by 16-byte loads. The 256-lane tree then runs in the shared memory the
// hidden words were staged in (8 KiB in all: a second 8 KiB for the lanes took
// T = 64 from 8.4 to 10.9 us on the H200, fewer workgroups to an SM), with
// three workgroup barriers: invocation j of a team folds strides 128, 64, 32
// of lanes j + 32 u in registers, then the team's first invocation folds
// strides 16 .. 1 (a barrier per stride took 13.7 us: docs/PERFORMANCE.md). No
// subgroup operation, so the bits do not depend on the subgroup size.
#extension GL_EXT_control_flow_attributes : require
#define TOVL_ARGS_LMHEAD_OVERLAY
#include "common.glsl"
#include "args.glsl"

const uint LANES = 256u;       // the spec's logical dot lanes
const uint TEAM = 32u;         // invocations per cell, 8 lanes each
const uint TEAMS = 8u;         // cells per workgroup (VK_LMHEAD_CELLS_PER_GROUP)
const uint INVOCATIONS = TEAMS * TEAM;
layout(local_size_x = INVOCATIONS, local_size_y = 1, local_size_z = 1) in;
const uint XBLOCK = 2u * TEAMS * LANES; // hidden elements staged at a time: as many bytes as the tree's lanes

// 8 KiB: the staged hidden words, then the tree's lanes (cell g's lane l at
// word g * LANES + l), which fill it exactly.
shared uvec4 pool[XBLOCK / 8u];

// The 8 bf16 of a 16-byte word as f32, elements 0..3 and 4..7.
vec4 low_four(uvec4 w) {
    return uintBitsToFloat(uvec4(w.x << 16, w.x & 0xFFFF0000u, w.y << 16, w.y & 0xFFFF0000u));
}
vec4 high_four(uvec4 w) {
    return uintBitsToFloat(uvec4(w.z << 16, w.z & 0xFFFF0000u, w.w << 16, w.w & 0xFFFF0000u));
}

// Two bf16 elements (first, first + 1) of a row as one packed word; elements
// at or past h read as +0. Padding adds +0 * +0 = +0 to a lane, which changes
// nothing: a lane starts at +0 and so is never -0.
uint load_pair(uint64_t row, uint first, uint h) {
    U16Buf r = U16Buf(row);
    uint lo = first < h ? uint(r.v[first]) : 0u;
    uint hi = first + 1u < h ? uint(r.v[first + 1u]) : 0u;
    return lo | (hi << 16);
}

uvec4 load_eight_scalar(uint64_t row, uint first, uint h) {
    return uvec4(load_pair(row, first, h), load_pair(row, first + 2u, h), load_pair(row, first + 4u, h),
                 load_pair(row, first + 6u, h));
}

// Lanes 8q .. 8q+7 += x * w for one 16-byte group; each product and each sum
// rounds on its own (the accumulators are precise: no FMA).
#define ACCUMULATE(xw, ww)                                   \
    acc_low = acc_low + low_four(xw) * low_four(ww);         \
    acc_high = acc_high + high_four(xw) * high_four(ww)

// Cells k0 .. k0 + TEAMS - 1 (those below n) of row t, slot s.
void row_cells(uint t, int s, uint n, uint k0) {
    uint h = args.h;
    uint tid = gl_LocalInvocationIndex;
    uint team = tid / TEAM;
    uint q = tid % TEAM;
    uint k = k0 + team;
    uint64_t rows_base = U64Buf(args.rows_table).v[s];
    bool cell_live = k < n;
    uint id = 0u;
    if (cell_live) {
        id = U32Buf(U64Buf(args.ids_table).v[s]).v[k];
        cell_live = id < args.vocab;
    }
    uint64_t x_row = element_address(args.hidden, uint64_t(t) * uint64_t(h), 2u);
    uint64_t w_row = element_address(rows_base, uint64_t(k) * uint64_t(h), 2u);
    // Every row start is 16-byte aligned when h is a multiple of 8 and both bases are.
    bool wide = (h & 7u) == 0u && is_aligned16(args.hidden) && is_aligned16(rows_base);

    precise vec4 acc_low = vec4(0.0);  // lanes 8q .. 8q+3
    precise vec4 acc_high = vec4(0.0); // lanes 8q+4 .. 8q+7
    for (uint x0 = 0u; x0 < h; x0 += XBLOCK) {
        uint xn = min(XBLOCK, h - x0);
        uint words = (xn + 7u) / 8u;
        barrier(); // the previous block's readers are done
        if (wide) {
            U16x8Buf x8 = U16x8Buf(x_row);
            for (uint m = tid; m < words; m += INVOCATIONS) {
                pool[m] = x8.v[x0 / 8u + m];
            }
        } else {
            for (uint m = tid; m < words * 4u; m += INVOCATIONS) {
                pool[m / 4u][m % 4u] = load_pair(x_row, x0 + 2u * m, h);
            }
        }
        barrier();
        if (cell_live) {
            uint g = 8u * q; // this invocation's lanes, then every LANES elements
            if (wide) {
                // Four 16-byte weight loads in flight, then their sums in increasing i.
                U16x8Buf w8 = U16x8Buf(w_row);
                for (; g + 3u * LANES < xn; g += 4u * LANES) {
                    uvec4 w0 = w8.v[(x0 + g) / 8u];
                    uvec4 w1 = w8.v[(x0 + g + LANES) / 8u];
                    uvec4 w2 = w8.v[(x0 + g + 2u * LANES) / 8u];
                    uvec4 w3 = w8.v[(x0 + g + 3u * LANES) / 8u];
                    ACCUMULATE(pool[g / 8u], w0);
                    ACCUMULATE(pool[(g + LANES) / 8u], w1);
                    ACCUMULATE(pool[(g + 2u * LANES) / 8u], w2);
                    ACCUMULATE(pool[(g + 3u * LANES) / 8u], w3);
                }
            }
            for (; g < xn; g += LANES) {
                uvec4 ww = wide ? U16x8Buf(w_row).v[(x0 + g) / 8u] : load_eight_scalar(w_row, x0 + g, h);
                ACCUMULATE(pool[g / 8u], ww);
            }
        }
    }

    // The tree of the spec: for stride 128 .. 1, lane l += lane l + stride.
    const uint CELL_VECS = LANES / 4u; // a cell's lanes in pool vectors
    barrier();                         // every team is done with the hidden words
    pool[team * CELL_VECS + 2u * q] = floatBitsToUint(acc_low);
    pool[team * CELL_VECS + 2u * q + 1u] = floatBitsToUint(acc_high);
    barrier();
    // Strides 128, 64, 32: invocation q holds lanes q + 32 u (u = 0..7), so
    // each pairs u with u + 4, 2, 1 and leaves lane q, written back to the
    // word only it read.
    precise float r[8];
    [[unroll]] for (uint u = 0u; u < 8u; u++) {
        uint word = team * LANES + q + TEAM * u;
        r[u] = uintBitsToFloat(pool[word / 4u][word % 4u]);
    }
    [[unroll]] for (uint stride = 4u; stride >= 1u; stride /= 2u) {
        [[unroll]] for (uint u = 0u; u < stride; u++) {
            r[u] = r[u] + r[u + stride];
        }
    }
    uint own = team * LANES + q;
    pool[own / 4u][own % 4u] = floatBitsToUint(r[0]);
    barrier();
    // Strides 16 .. 1 over lanes 0..31, by the team's first invocation.
    if (cell_live && q == 0u) {
        precise float p[32];
        [[unroll]] for (uint v = 0u; v < 8u; v++) {
            vec4 four = uintBitsToFloat(pool[team * CELL_VECS + v]);
            [[unroll]] for (uint e = 0u; e < 4u; e++) {
                p[4u * v + e] = four[e];
            }
        }
        [[unroll]] for (uint stride = 16u; stride >= 1u; stride /= 2u) {
            [[unroll]] for (uint j = 0u; j < stride; j++) {
                p[j] = p[j] + p[j + stride];
            }
        }
        float dot = p[0];
        uint64_t index = uint64_t(t) * args.ld + uint64_t(id);
#if defined(TOVL_LOGITS_F32)
        U32Buf(element_address(args.logits, index, 4u)).v[0] = f32_out_bits(dot);
#else
        U16Buf(element_address(args.logits, index, 2u)).v[0] = uint16_t(f32_to_bf16(dot));
#endif
    }
}

void main() {
    uint t = linear_group_yz();
    if (t >= args.T) {
        return; // every early return here is uniform across the workgroup
    }
    int s = row_slot(args.row_slots, args.active_slot, t);
    if (!slot_valid(s, args.max_loras)) {
        return;
    }
    uint n = min(U32Buf(args.n_table).v[s], args.max_n);
    // Uniform: n and k0 are the workgroup's; row_cells starts with a barrier
    // before it rewrites the pool the previous chunk's tree read.
    for (uint k0 = gl_WorkGroupID.x * TEAMS; k0 < n; k0 += gl_NumWorkGroups.x * TEAMS) {
        row_cells(t, s, n, k0);
    }
}
