// lmhead_overlay_{bf16,f32}, tile variant (included by the two .comp files,
// which set TOVL_LOGITS_F32 or not): for row t of slot s and each
// k < n_override[s] with id = ids[s][k] < vocab,
//     logits[t * ld + id] = dot(hidden[t, :], rows[s][k, :])
// in the spec's fixed order. The design of the CUDA port's tiles
// (backends/cuda/kernels/lmhead_overlay.cuh), without subgroup operations.
//
// Work. A workgroup computes one tile: a group of BM rows of one slot s (in
// increasing t) times overlay rows [k0, k0 + BN) of s, so each overlay row is
// read once per BM rows of its slot rather than once per row. The tiles are
// numbered on the host without the row slots (vk_kernels.c): group x of column
// y, for x < ceil(T / BM) + min(max_loras, T) (room for every slot's last
// partial group) and y < the dispatch's columns (those of the rows the launch
// is shaped for, at most ceil(max_n / BN): args.tile_columns), y fastest in
// dispatch order, so the tiles of one group of rows are neighbours. A
// workgroup counts the rows of every slot (one pass over the row slots),
// takes the x-th of the groups of the slots that have overlay rows in column
// y, and collects its group's rows with a prefix sum; a workgroup past the
// batch's groups returns. It then computes column y of its slot's group, and
// y + tile_columns, ... while the slot has rows there (a fixed-shape set's
// capacity past the shaped rows): every (slot, group, column) once.
//
// The dot order. Invocation l is the spec's lane l of all BM x BN cells: a
// chunk is 256 elements of each of the tile's rows, staged as bf16 pairs in
// shared memory, and lane l adds element 256 c + l of chunk c, in increasing
// c, with a separate multiply and add (every float here is precise: SPIR-V
// NoContraction, no FMA). Elements past h are staged as +0 on both sides and
// add +0 * +0 = +0, which changes no lane (a lane starts at +0 and so is
// never -0). The tree (strides 128 .. 1) runs in shared memory, 16 cells a
// round: invocation (cell, j) folds lanes j + 16 u (strides 128 .. 16), then
// invocation 32 m + n folds lanes 0..15 of cell (m, n) (strides 8 .. 1) and
// stores it. No subgroup operation, so the bits do not depend on the
// subgroup size.
//
// Staging. Two chunk buffers in shared memory and two chunks in registers:
// while chunk c is computed, chunk c + 1 is stored to the other buffer and
// chunk c + 2 or c + 3 is loading, so a load has two chunks' compute to land.
// (Four chunks in registers took T = 512 to 42.4 us on the H200 and T = 64 to
// 12.0, where two took 32.2 and 14.0 with barriers that cost 2.8 us more a
// dispatch: docs/PERFORMANCE.md, Vulkan.)
// Each invocation loads one 16-byte vector of a hidden row and one of an
// overlay row per chunk (BM = BN = 8 rows of 32 vectors).
#extension GL_EXT_control_flow_attributes : require
#define TOVL_ARGS_LMHEAD_OVERLAY
#include "common.glsl"
#include "args.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

const uint LANES = 256u;                      // the spec's logical dot lanes = invocations
const uint BM = 8u;                           // hidden rows per tile (tokens of one slot)
const uint BN = 8u;                           // overlay rows per tile
const uint ROW_WORDS = LANES / 2u;            // bf16 pairs per row per chunk
const uint ROW_VECS = ROW_WORDS / 4u;         // 16-byte vectors per row per chunk (32)
const uint STAGE_WORDS = (BM + BN) * ROW_WORDS; // one chunk buffer: 8 KiB
const uint ROUND = 16u;                       // cells per tree round
const uint NO_ROW = 0xFFFFFFFFu;
const uint PER_MAX = 2u;                      // rows an invocation scans per pass of the row collection

// 16 KiB, the size every device has, shared by the phases: the pick and the
// row scan, then two chunk buffers, then the tree's rounds (16 x 256 floats).
shared uint pool[2u * STAGE_WORDS];

// Pool words of the pick and row-scan phases.
const uint COUNT = 0u;   // [256] rows per slot of the window
const uint SCAN_A = 256u; // [256] prefix-sum values
const uint SCAN_B = 512u; // [16] prefix-sum run totals
const uint PICK = 768u;  // found, slot, group; then two words, live[w % 2] (the pick)
const uint ROWS = 776u;  // [BM] the group's rows

// Inclusive prefix sum of v over the workgroup in two levels: the sums of 16
// runs of 16 invocations, then each invocation adds the runs before its own
// and its run's values up to itself: three barriers where a Hillis-Steele
// scan takes ten. *total = the sum over all invocations. Called in uniform
// control flow.
const uint RUN = 16u; // invocations per run; LANES / RUN runs
uint inclusive_sum(uint v, out uint total) {
    uint tid = gl_LocalInvocationIndex;
    pool[SCAN_A + tid] = v;
    barrier();
    if (tid < LANES / RUN) {
        uint run_sum = 0u;
        [[unroll]] for (uint i = 0u; i < RUN; i++) {
            run_sum += pool[SCAN_A + RUN * tid + i];
        }
        pool[SCAN_B + tid] = run_sum;
    }
    barrier();
    uint run = tid / RUN;
    uint mine = 0u;
    total = 0u;
    [[unroll]] for (uint i = 0u; i < LANES / RUN; i++) {
        uint c = pool[SCAN_B + i];
        mine += i < run ? c : 0u;
        total += c;
    }
    [[unroll]] for (uint i = 0u; i < RUN; i++) {
        mine += i <= tid % RUN ? pool[SCAN_A + RUN * run + i] : 0u;
    }
    barrier(); // the caller reuses the pool
    return mine;
}

// Overlay rows of slot s the kernel computes: n[s], at most max_n.
uint rows_of(uint s) {
    return min(U32Buf(args.n_table).v[s], args.max_n);
}

// Two bf16 elements (first, first + 1) of a row as one packed word; elements
// at or past h read as +0.
uint load_pair(uint64_t row, uint first, uint h) {
    U16Buf r = U16Buf(row);
    uint lo = first < h ? uint(r.v[first]) : 0u;
    uint hi = first + 1u < h ? uint(r.v[first + 1u]) : 0u;
    return lo | (hi << 16);
}

// Elements e .. e + 7 of a row (0: no row); +0 past h.
uvec4 load_vector(uint64_t row, uint e, uint h, bool wide) {
    if (row == uint64_t(0) || e >= h) {
        return uvec4(0u);
    }
    if (wide) {
        return U16x8Buf(row).v[e / 8u]; // h % 8 == 0, so e + 8 <= h
    }
    return uvec4(load_pair(row, e, h), load_pair(row, e + 2u, h), load_pair(row, e + 4u, h),
                 load_pair(row, e + 6u, h));
}

void store_vectors(uint buf, uvec4 x, uvec4 w) {
    uint tid = gl_LocalInvocationIndex;
    uint at = buf * STAGE_WORDS + (tid / ROW_VECS) * ROW_WORDS + 4u * (tid % ROW_VECS);
    uint wat = at + BM * ROW_WORDS;
    pool[at] = x.x;
    pool[at + 1u] = x.y;
    pool[at + 2u] = x.z;
    pool[at + 3u] = x.w;
    pool[wat] = w.x;
    pool[wat + 1u] = w.y;
    pool[wat + 2u] = w.z;
    pool[wat + 3u] = w.w;
}

// Lane l's element of a staged row word: the low half for even l, the high for odd.
float lane_element(uint word, uint shift) {
    return uintBitsToFloat((word << shift) & 0xFFFF0000u);
}

// Where lane `lane` of round cell `cell` sits in the pool: odd cells swap
// their halves of 16 lanes, so the fold's reads hit distinct banks.
uint tree_slot(uint cell, uint lane) {
    return cell * LANES + (lane ^ ((cell & 1u) << 4));
}

void tile(uint my_t, uint s, uint n, uint64_t rows_base, uint k0);

void main() {
    uint tid = gl_LocalInvocationIndex;
    uint T = args.T;
    uint columns = min((args.max_n + BN - 1u) / BN, args.tile_columns); // the dispatch's
    uint order = linear_group_xy();
    uint group_slots = (T + BM - 1u) / BM + min(args.max_loras, T);
    if (columns == 0u || uint64_t(order) >= uint64_t(group_slots) * uint64_t(columns)) {
        return; // uniform: past the grid's tiles
    }
    uint x = order / columns;
    uint k0 = (order % columns) * BN;

    // The pick: slot by slot, a window of 256 slots at a time, count each
    // slot's rows and take the x-th group of the slots with rows past k0.
    // A window none of whose slots has rows past k0 is passed over before
    // the pass over the row slots: the workgroups past every slot's rows (a
    // fixed-shape set's grid covers its capacity) leave after reading the
    // row counts. live[w % 2] says window w has such a slot; window w clears
    // window w + 1's.
    uint before = 0u;
    bool found = false;
    uint s = 0u, g = 0u;
    const uint LIVE = PICK + 3u;
    if (tid == 0u) {
        pool[LIVE] = 0u;
    }
    barrier();
    for (uint base = 0u, w = 0u; base < args.max_loras; base += LANES, w ^= 1u) {
        bool has_rows = base + tid < args.max_loras && rows_of(base + tid) > k0;
        pool[COUNT + tid] = 0u;
        if (tid == 0u) {
            pool[PICK] = 0u;
            pool[LIVE + (w ^ 1u)] = 0u;
        }
        if (has_rows) {
            pool[LIVE + w] = 1u;
        }
        barrier();
        if (pool[LIVE + w] == 0u) {
            barrier(); // uniform; every invocation has read live[w] before the next window clears it
            continue;
        }
        uint window_end = min(base + LANES, args.max_loras);
        for (uint t = tid; t < T; t += LANES) {
            int rs = row_slot(args.row_slots, args.active_slot, t);
            if (rs >= int(base) && uint(rs) < window_end) {
                atomicAdd(pool[COUNT + uint(rs) - base], 1u);
            }
        }
        barrier();
        uint slot = base + tid;
        uint groups = has_rows ? (pool[COUNT + tid] + BM - 1u) / BM : 0u;
        uint total;
        uint end = before + inclusive_sum(groups, total);
        if (groups > 0u && x >= end - groups && x < end) {
            pool[PICK] = 1u;
            pool[PICK + 1u] = slot;
            pool[PICK + 2u] = x - (end - groups);
        }
        barrier();
        found = pool[PICK] != 0u;
        s = pool[PICK + 1u];
        g = pool[PICK + 2u];
        barrier(); // the next window rewrites the pool
        if (found) {
            break; // uniform: every invocation read the same pick
        }
        before += total;
    }
    if (!found) {
        return; // uniform: more workgroups than groups
    }

    // Rows g * BM .. + BM of slot s, in increasing t, into pool[ROWS].
    uint first = g * BM;
    if (tid < BM) {
        pool[ROWS + tid] = NO_ROW;
    }
    barrier();
    // Invocation tid scans `per` consecutive rows of each pass (up to
    // PER_MAX), so a pass of LANES * per rows takes one prefix sum.
    uint per = min((T + LANES - 1u) / LANES, PER_MAX);
    uint seen = 0u; // rows of slot s before this pass; the same in every invocation
    for (uint base = 0u; base < T && seen < first + BM; base += LANES * per) {
        uint t0 = base + tid * per;
        uint matches = 0u; // bit i: row t0 + i is slot s's
        for (uint i = 0u; i < per; i++) {
            uint t = t0 + i;
            if (t < T && row_slot(args.row_slots, args.active_slot, t) == int(s)) {
                matches |= 1u << i;
            }
        }
        uint total;
        uint rank = seen + inclusive_sum(uint(bitCount(matches)), total) - uint(bitCount(matches));
        for (; matches != 0u; matches &= matches - 1u) {
            if (rank >= first && rank < first + BM) {
                pool[ROWS + rank - first] = t0 + uint(findLSB(matches));
            }
            rank++;
        }
        seen += total;
    }
    barrier();
    // Invocation tid stages vector tid % 32 of hidden row tid / 32 of the tile
    // and of overlay row k0 + tid / 32; invocation 32 m + n stores cell (m, n).
    uint my_t = pool[ROWS + tid / ROW_VECS];
    barrier(); // the staging overwrites the pool

    uint n = rows_of(s);
    uint64_t rows_base = U64Buf(args.rows_table).v[s];
    // Column y of the slot's group, then y + columns, ... (uniform: n and k0
    // are the same in every invocation; each column ends on a barrier).
    for (; k0 < n; k0 += columns * BN) {
        tile(my_t, s, n, rows_base, k0);
    }
}

// Overlay rows [k0, k0 + BN) of slot s (n rows, at rows_base) times the
// tile's hidden rows (this invocation's staged one: my_t).
void tile(uint my_t, uint s, uint n, uint64_t rows_base, uint k0) {
    uint tid = gl_LocalInvocationIndex;
    uint h = args.h;
    uint kw = k0 + tid / ROW_VECS;
    uint64_t x_row = my_t != NO_ROW ? element_address(args.hidden, uint64_t(my_t) * uint64_t(h), 2u) : uint64_t(0);
    uint64_t w_row = kw < n ? element_address(rows_base, uint64_t(kw) * uint64_t(h), 2u) : uint64_t(0);
    uint kn = k0 + tid % ROW_VECS; // the storing invocations' overlay row (tid % 32 < BN)
    uint id = NO_ROW;
    if (tid % ROW_VECS < BN && kn < n) {
        id = U32Buf(U64Buf(args.ids_table).v[s]).v[kn];
    }
    // Every row start is 16-byte aligned when h is a multiple of 8 and both bases are.
    bool wide = (h & 7u) == 0u && is_aligned16(args.hidden) && is_aligned16(rows_base);
    uint e = 8u * (tid % ROW_VECS); // this invocation's staged elements within a chunk
    uint chunks = (h + LANES - 1u) / LANES;
    uint shift = (tid & 1u) == 0u ? 16u : 0u;
    uint word = tid / 2u;

    precise float acc[BM][BN];
    [[unroll]] for (uint m = 0u; m < BM; m++) {
        [[unroll]] for (uint c = 0u; c < BN; c++) {
            acc[m][c] = 0.0;
        }
    }

    // Chunk 0 in buffer 0, chunk 1 in registers a, chunk 2 in registers b.
    uvec4 ax = load_vector(x_row, e, h, wide);
    uvec4 aw = load_vector(w_row, e, h, wide);
    store_vectors(0u, ax, aw);
    ax = load_vector(x_row, LANES + e, h, wide);
    aw = load_vector(w_row, LANES + e, h, wide);
    uvec4 bx = load_vector(x_row, 2u * LANES + e, h, wide);
    uvec4 bw = load_vector(w_row, 2u * LANES + e, h, wide);
    barrier();
    for (uint c = 0u; c < chunks; c += 2u) {
        // Chunk c, in buffer 0.
        [[unroll]] for (uint m = 0u; m < BM; m++) {
            precise float xv = lane_element(pool[m * ROW_WORDS + word], shift);
            [[unroll]] for (uint q = 0u; q < BN; q++) {
                precise float wv = lane_element(pool[(BM + q) * ROW_WORDS + word], shift);
                precise float product = xv * wv;
                acc[m][q] = acc[m][q] + product;
            }
        }
        store_vectors(1u, ax, aw); // chunk c + 1: buffer 1 was last read before the previous barrier
        ax = load_vector(x_row, (c + 3u) * LANES + e, h, wide);
        aw = load_vector(w_row, (c + 3u) * LANES + e, h, wide);
        barrier();
        if (c + 1u >= chunks) {
            break; // uniform
        }
        // Chunk c + 1, in buffer 1.
        [[unroll]] for (uint m = 0u; m < BM; m++) {
            precise float xv = lane_element(pool[STAGE_WORDS + m * ROW_WORDS + word], shift);
            [[unroll]] for (uint q = 0u; q < BN; q++) {
                precise float wv = lane_element(pool[STAGE_WORDS + (BM + q) * ROW_WORDS + word], shift);
                precise float product = xv * wv;
                acc[m][q] = acc[m][q] + product;
            }
        }
        store_vectors(0u, bx, bw); // chunk c + 2
        bx = load_vector(x_row, (c + 4u) * LANES + e, h, wide);
        bw = load_vector(w_row, (c + 4u) * LANES + e, h, wide);
        barrier();
    }

    // The tree of the spec, 16 cells a round: rows 2r and 2r + 1 of the tile.
    uint fold_cell = tid / 16u, fold_lane = tid % 16u;
    [[unroll]] for (uint r = 0u; r < BM / 2u; r++) {
        [[unroll]] for (uint i = 0u; i < ROUND; i++) {
            pool[tree_slot(i, tid)] = floatBitsToUint(acc[2u * r + i / BN][i % BN]);
        }
        barrier();
        // Strides 128, 64, 32, 16 over lanes fold_lane + 16 u of cell fold_cell.
        precise float v[16];
        [[unroll]] for (uint u = 0u; u < 16u; u++) {
            v[u] = uintBitsToFloat(pool[tree_slot(fold_cell, fold_lane + 16u * u)]);
        }
        [[unroll]] for (uint stride = 8u; stride >= 1u; stride /= 2u) {
            [[unroll]] for (uint u = 0u; u < stride; u++) {
                v[u] = v[u] + v[u + stride];
            }
        }
        pool[tree_slot(fold_cell, fold_lane)] = floatBitsToUint(v[0]); // a lane only this invocation read
        barrier();
        // Strides 8 .. 1 over lanes 0..15 of cell (m, q), by invocation 32 m + q.
        uint m = tid / ROW_VECS, q = tid % ROW_VECS;
        if (m / 2u == r && q < BN) {
            uint cell = (m % 2u) * BN + q;
            precise float p[16];
            [[unroll]] for (uint j = 0u; j < 16u; j++) {
                p[j] = uintBitsToFloat(pool[tree_slot(cell, j)]);
            }
            [[unroll]] for (uint stride = 8u; stride >= 1u; stride /= 2u) {
                [[unroll]] for (uint j = 0u; j < stride; j++) {
                    p[j] = p[j] + p[j + stride];
                }
            }
            if (my_t != NO_ROW && id < args.vocab) { // id < vocab also means kn < n
                uint64_t index = uint64_t(my_t) * args.ld + uint64_t(id);
#if defined(TOVL_LOGITS_F32)
                U32Buf(element_address(args.logits, index, 4u)).v[0] = f32_out_bits(p[0]);
#else
                U16Buf(element_address(args.logits, index, 2u)).v[0] = uint16_t(f32_to_bf16(p[0]));
#endif
            }
        }
        barrier(); // the next round rewrites the pool
    }
}
