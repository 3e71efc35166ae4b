/*
 * The four token-overlay kernels for AMD GPUs (HIP): the semantics of
 * docs/SPEC.md, bit for bit the same as the CPU reference (backends/cpu/).
 *
 * Written for AMD, the same bits at either wavefront width. CDNA (gfx908,
 * gfx90a, gfx940) runs 64-wide wavefronts, RDNA (gfx1030, gfx1100) 32-wide:
 * the work is split into row groups of 32 threads (token_overlay_shape.h), a
 * whole wavefront on RDNA and half of one on CDNA, and every cross-lane step
 * stays inside its group: ballots are read at warpSize and cut to the
 * group's 32 bits, shuffles run with width 32, block-wide counts and prefix
 * sums go through LDS. No dot-product lane or pairing of the spec's tree
 * depends on the width. Shared memory (LDS) use is at most 20 KiB a block
 * (lm_head), below the 64 KiB a workgroup may have; nothing relies on
 * asynchronous copies (AMD has no cp.async): loads are software-pipelined
 * through registers.
 *
 * Arithmetic: each product and each sum is its own f32 operation, rounded to
 * nearest even. HIP's __fmul_rn / __fadd_rn are plain * and +, so the build
 * passes -ffp-contract=off (and a test checks the code objects for fused
 * instructions); denormals are kept (-fno-gpu-flush-denormals-to-zero). One
 * exception gives the same bits: the lm_head tiles take one __fmaf_rn per
 * product and sum where a range check proves every product of the tile
 * exact in f32 (TileRange), and redo a tile that fails it unfused.
 *
 * Arguments: one struct per kernel, passed by value (include/tovl/kernel_args.h).
 * Launch shapes: token_overlay_shape.h (hip_geometry.c maps the core's
 * logical grids onto them).
 *
 * The same file compiles with nvcc through hip_on_cuda.h (a test runs this
 * port on an NVIDIA GPU) and as host C++ through emu/hip_emu.h (the kernel
 * emulation runs it at warp widths 32 and 64 in CI); both skip the HIP
 * runtime header.
 */
#if !defined(TOVL_HIP_ON_CUDA) && !defined(TOVL_HIP_EMU)
#include <hip/hip_runtime.h>
#endif

#include <stdint.h>

#include "tovl/kernel_args.h"
#include "token_overlay_shape.h"

#if defined(TOVL_HIP_EMU)
#define TOVL_HIP_KERNEL static
#define TOVL_HIP_UNROLL
#else
#define TOVL_HIP_KERNEL extern "C" __global__
#define TOVL_HIP_UNROLL _Pragma("unroll")
#endif

/* Programmatic dependent launch's wait and trigger points (hip_on_cuda.h
 * defines them on NVIDIA). AMD has no such launch: the runtime starts a
 * stream's kernel after the one before it ends, so both are empty. */
#ifndef TOVL_HIP_GRID_DEPENDENCY_WAIT
#define TOVL_HIP_GRID_DEPENDENCY_WAIT()
#endif
#ifndef TOVL_HIP_GRID_DEPENDENTS_LAUNCH
#define TOVL_HIP_GRID_DEPENDENTS_LAUNCH()
#endif

#define BLOCK TOVL_HIP_BLOCK_THREADS
#define GROUP TOVL_HIP_GROUP_THREADS
#define LMHEAD_ROWS TOVL_HIP_LMHEAD_ROWS_PER_BLOCK

static_assert(BLOCK % 64 == 0, "whole wavefronts of 64 and of 32");
static_assert(TOVL_DOT_LANES == GROUP * 8, "a row group's thread holds 8 dot lanes: one 16-byte vector");

namespace tovl_hip {

/* bf16 -> f32 is exact. */
__device__ static inline float bf16_to_f32(uint32_t bits) {
    return __uint_as_float(bits << 16);
}

/* Element i (0..7) of a 16-byte vector of 8 bf16 (little-endian pairs). */
__device__ static inline float bf16_of(const uint4 &v, uint32_t i) {
    const uint32_t word = i / 2 == 0 ? v.x : i / 2 == 1 ? v.y : i / 2 == 2 ? v.z : v.w;
    return __uint_as_float(i % 2 ? word & 0xFFFF0000u : word << 16);
}

/* f32 -> bf16, nearest even; every NaN becomes 0x7FC0 (core/bf16.c). */
__device__ static inline uint16_t f32_to_bf16(float value) {
    uint32_t bits = __float_as_uint(value);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return 0x7FC0u;
    }
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* The bits an f32 logit is stored as: the canonical NaN for every NaN. */
__device__ static inline uint32_t f32_out_bits(float value) {
    uint32_t bits = __float_as_uint(value);
    return (bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : bits;
}

template <typename T>
__device__ static inline T *ptr(uint64_t devptr) {
    return reinterpret_cast<T *>(devptr);
}

/* The slot of row t: the per-row array when present, else the single slot. */
__device__ static inline int32_t row_slot(uint64_t slots, int32_t active_slot, uint32_t t) {
    return slots ? ptr<const int32_t>(slots)[t] : active_slot;
}

/* Elements before the first 16-byte boundary of a bf16 row at `p`. */
__device__ static inline uint32_t bf16_to_16b_boundary(const void *p) {
    return (uint32_t)((16u - ((uintptr_t)p & 15u)) & 15u) / 2u;
}

/* A 16-byte load or store; p 16-byte aligned. */
__device__ static inline uint4 load16(const void *p) {
#if defined(TOVL_HIP_EMU)
    tovl_emu::check_aligned(p, 16);
#endif
    return *reinterpret_cast<const uint4 *>(p);
}
__device__ static inline void store16(void *p, uint4 v) {
#if defined(TOVL_HIP_EMU)
    tovl_emu::check_aligned(p, 16);
#endif
    *reinterpret_cast<uint4 *>(p) = v;
}

/* The 8 elements from e of a bf16 row (0 past h) as a 16-byte vector: one
 * load when `vectors` (the row 16-byte aligned, h a multiple of 8) and the 8
 * lie within h, else element by element. */
__device__ static inline uint4 load8_bf16(const uint16_t *row, uint32_t e, uint32_t h, bool vectors) {
    if (vectors && e + 8 <= h) {
        return load16(row + e);
    }
    uint32_t word[4] = {0, 0, 0, 0};
    for (uint32_t i = 0; i < 8; i++) {
        if (e + i < h) {
            word[i / 2] |= (uint32_t)row[e + i] << (16 * (i % 2));
        }
    }
    uint4 v;
    v.x = word[0], v.y = word[1], v.z = word[2], v.w = word[3];
    return v;
}

/* Whether `predicate` holds in any thread of this thread's row group. Every
 * thread of the wavefront calls it: the ballot spans the wavefront
 * (warpSize lanes, a 64-bit mask on AMD), of which the group's 32 bits are
 * kept. */
__device__ static inline bool group_any(bool predicate) {
    const unsigned long long votes = __ballot(predicate);
    const uint32_t first = (threadIdx.x % warpSize) & ~(uint32_t)(GROUP - 1); /* the group's first lane */
    return ((votes >> first) & 0xFFFFFFFFull) != 0;
}

/* ------------------------------------------------------------------------ */
/* rowdiff: flags[r] = 1 when row r of a and b differ.                        */
/* ------------------------------------------------------------------------ */

/* Do two bf16 bit patterns differ under the tolerance rule? */
__device__ static inline bool bf16_differs(uint32_t a, uint32_t b, float tol) {
    if (!(tol > 0.0f)) {
        return a != b;
    }
    const float fa = bf16_to_f32(a), fb = bf16_to_f32(b);
    /* |fa - fb| by clearing the sign bit: no math library call. A NaN
     * difference (Inf - Inf, NaN - NaN) compares false, as on the CPU. */
    const float gap = __uint_as_float(__float_as_uint(__fsub_rn(fa, fb)) & 0x7FFFFFFFu);
    return gap > tol || ((fa != fa) != (fb != fb));
}

/* The same over two 16-byte vectors of 8 bf16. */
__device__ static inline bool bf16x8_differs(const uint4 &a, const uint4 &b, float tol) {
    if (!(tol > 0.0f)) {
        return ((a.x ^ b.x) | (a.y ^ b.y) | (a.z ^ b.z) | (a.w ^ b.w)) != 0;
    }
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
    bool differ = false;
    TOVL_HIP_UNROLL
    for (int i = 0; i < 4; i++) {
        differ |= bf16_differs(wa[i] & 0xFFFFu, wb[i] & 0xFFFFu, tol);
        differ |= bf16_differs(wa[i] >> 16, wb[i] >> 16, tol);
    }
    return differ;
}

/* Row `row` compared by the 32 threads of a row group (lane 0..31): 16-byte
 * loads from the first element where both rows reach a 16-byte boundary,
 * scalar loads before it and for the tail; rows whose offsets differ modulo
 * 16 share no boundary and are read scalar. UNROLL pairs of loads in flight. */
__device__ static inline bool rowdiff_row(const tovl_rowdiff_args &args, uint32_t row, uint32_t lane) {
    constexpr uint32_t UNROLL = 4;
    const uint32_t h = args.h;
    const float tol = args.tol;
    const uint16_t *a = ptr<const uint16_t>(args.a) + (size_t)row * h;
    const uint16_t *b = ptr<const uint16_t>(args.b) + (size_t)row * h;
    uint32_t head = bf16_to_16b_boundary(a);
    if (head != bf16_to_16b_boundary(b) || head > h) {
        head = h;
    }
    bool differ = false;
    for (uint32_t i = lane; i < head; i += GROUP) {
        differ |= bf16_differs(a[i], b[i], tol);
    }
    const uint32_t vectors = (h - head) / 8;
    const uint16_t *va = a + head, *vb = b + head;
    for (uint32_t v0 = 0; v0 < vectors; v0 += GROUP * UNROLL) {
        uint4 xa[UNROLL], xb[UNROLL];
        TOVL_HIP_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            const uint32_t v = v0 + u * GROUP + lane;
            if (v < vectors) {
                xa[u] = load16(va + (size_t)v * 8);
                xb[u] = load16(vb + (size_t)v * 8);
            }
        }
        TOVL_HIP_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            if (v0 + u * GROUP + lane < vectors) {
                differ |= bf16x8_differs(xa[u], xb[u], tol);
            }
        }
    }
    for (uint32_t i = head + vectors * 8 + lane; i < h; i += GROUP) {
        differ |= bf16_differs(a[i], b[i], tol);
    }
    return differ;
}

} // namespace tovl_hip

/* A row group per row, ROWDIFF_ROWS_PER_BLOCK rows per block. A group past
 * the last row still takes part in the ballot (its wavefront's other group
 * may have a row). */
TOVL_HIP_KERNEL void __launch_bounds__(BLOCK) rowdiff(tovl_rowdiff_args args) {
    using namespace tovl_hip;
    const uint32_t lane = threadIdx.x % GROUP;
    const uint32_t row = blockIdx.x * TOVL_HIP_ROWDIFF_ROWS_PER_BLOCK + threadIdx.x / GROUP;
    const bool mine = row < args.rows;
    TOVL_HIP_GRID_DEPENDENCY_WAIT(); /* both tables may come from the kernel before */
    const bool differ = group_any(mine && rowdiff_row(args, row, lane));
    if (mine && lane == 0) {
        ptr<uint32_t>(args.flags)[row] = differ ? 1u : 0u;
    }
}

/* ------------------------------------------------------------------------ */
/* embed_overlay: copy the slot's row over token t's gathered row.            */
/* ------------------------------------------------------------------------ */

namespace tovl_hip {

/* Slot s's cells of the set's tables (the set's own: no kernel writes them). */
struct EmbedSlotCells {
    uint64_t slot_map, rows;
    uint32_t n;
};

__device__ static inline EmbedSlotCells embed_slot_cells(const tovl_embed_overlay_args &args, uint32_t s) {
    return EmbedSlotCells{ptr<const uint64_t>(args.slot_map_table)[s], ptr<const uint64_t>(args.rows_table)[s],
                          ptr<const uint32_t>(args.n_table)[s]};
}

/* Thread `from` of this thread's row group: its value, to every thread of
 * the group (every thread of the wavefront calls it; width-32 shuffles of
 * 32-bit words). */
__device__ static inline uint64_t group_u64(uint64_t v, uint32_t from) {
    const uint32_t lo = __shfl((uint32_t)v, (int)from, GROUP), hi = __shfl((uint32_t)(v >> 32), (int)from, GROUP);
    return (uint64_t)hi << 32 | lo;
}

/* Thread `from`'s cells, to every thread of its row group. */
__device__ static inline EmbedSlotCells group_cells(const EmbedSlotCells &c, uint32_t from) {
    return EmbedSlotCells{group_u64(c.slot_map, from), group_u64(c.rows, from), __shfl(c.n, (int)from, GROUP)};
}

/* `vectors` 16-byte vectors from src to dst (both 16-byte aligned), UNROLL
 * per thread in flight, an iteration's loads before its stores. */
__device__ static inline void embed_copy_vectors(const uint16_t *src, uint16_t *dst, uint32_t vectors) {
    constexpr uint32_t UNROLL = 2; /* 256 threads x 2: an h = 4096 row in one pass */
    for (uint32_t v0 = threadIdx.x; v0 < vectors; v0 += BLOCK * UNROLL) {
        uint4 chunk[UNROLL];
        TOVL_HIP_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            if (v0 + u * BLOCK < vectors) {
                chunk[u] = load16(src + (size_t)(v0 + u * BLOCK) * 8);
            }
        }
        TOVL_HIP_UNROLL
        for (uint32_t u = 0; u < UNROLL; u++) {
            if (v0 + u * BLOCK < vectors) {
                store16(dst + (size_t)(v0 + u * BLOCK) * 8, chunk[u]);
            }
        }
    }
}

/* A row whose rows are not both 16-byte aligned, or h not a multiple of 8:
 * scalar up to the first 16-byte boundary both rows share (throughout when
 * they share none), vectors from there, a scalar tail. */
__device__ static void embed_copy_unaligned(const uint16_t *src, uint16_t *dst, uint32_t h) {
    uint32_t head = bf16_to_16b_boundary(dst);
    if (head != bf16_to_16b_boundary(src) || head > h) {
        head = h;
    }
    for (uint32_t i = threadIdx.x; i < head; i += BLOCK) {
        dst[i] = src[i];
    }
    const uint32_t vectors = (h - head) / 8;
    embed_copy_vectors(src + head, dst + head, vectors);
    for (uint32_t i = head + vectors * 8 + threadIdx.x; i < h; i += BLOCK) {
        dst[i] = src[i];
    }
}

} // namespace tovl_hip

/* A block per token. The lookup is a chain of three round trips: (the
 * token's slot and id, and the slots' table cells) -> slot_map[s][id] -> the
 * row. With at most 32 slots, thread k of every row group fetches slot k's
 * cells in the first trip and the group takes its slot's by width-32
 * shuffles (no LDS, no barrier); a larger set reads slot s's cells after
 * the first trip. The copy: 16-byte vectors, two per thread in flight; rows
 * not both 16-byte aligned or h not a multiple of 8 take the scalar head and
 * tail. A bit copy: NaN payloads stay as they are. The CUDA port's embed
 * kernel has the same chain (docs/PERFORMANCE.md, Embed hook). */
TOVL_HIP_KERNEL void __launch_bounds__(BLOCK) embed_overlay(tovl_embed_overlay_args args) {
    using namespace tovl_hip;
    const uint32_t t = blockIdx.x;
    if (t >= args.T) {
        return; /* the whole block */
    }
    const uint32_t lane = threadIdx.x % GROUP;
    const bool by_shuffle = args.max_loras <= GROUP;
    EmbedSlotCells lane_cells = {0, 0, 0};
    if (by_shuffle && lane < args.max_loras) {
        lane_cells = embed_slot_cells(args, lane);
    }
    const uint32_t h = args.h;
    uint16_t *dst = ptr<uint16_t>(args.hidden) + (size_t)t * h;
    /* The token's slot and id, and its hidden row, may come from the kernel
     * before; the set's table cells above may not. */
    TOVL_HIP_GRID_DEPENDENCY_WAIT();
    const int32_t s = row_slot(args.token_slots, args.active_slot, t);
    const uint32_t id = ptr<const uint32_t>(args.token_ids)[t];
    const bool valid = s >= 0 && (uint32_t)s < args.max_loras;
    /* Before any thread leaves: the shuffles need the whole wavefront. */
    EmbedSlotCells cells = group_cells(lane_cells, valid ? (uint32_t)s % GROUP : 0u);
    if (!valid || id >= args.vocab) {
        return;
    }
    if (!by_shuffle) {
        cells = embed_slot_cells(args, (uint32_t)s);
    }
    if (cells.slot_map == 0) {
        return;
    }
    const int32_t j = ptr<const int32_t>(cells.slot_map)[id];
    TOVL_HIP_GRID_DEPENDENTS_LAUNCH(); /* the lookups are done: the next kernel may start launching */
    if (j < 0 || (uint32_t)j >= cells.n) {
        return;
    }
    const uint16_t *src = ptr<const uint16_t>(cells.rows) + (size_t)j * h;
    if (((((uintptr_t)src | (uintptr_t)dst) & 15u) | (h & 7u)) == 0) {
        embed_copy_vectors(src, dst, h / 8); /* the common case: no scalar head or tail loops */
    } else {
        embed_copy_unaligned(src, dst, h);
    }
}

/* ------------------------------------------------------------------------ */
/* lmhead_overlay_{bf16,f32}: logits[t, ids[k]] = dot(hidden[t], rows[k]).    */
/* ------------------------------------------------------------------------ */
/*
 * Block (t, y) computes overlay rows k0 = 8 y .. k0 + 7 of token t's slot,
 * a row group per overlay row (beyond the y limit also k0 + 8 gridDim.y, ...).
 * The hidden row is staged once per block into LDS, X_CHUNK elements at a
 * time with 16-byte loads, and read from there by all 8 groups: each element
 * of hidden[t] comes from global memory once for the block's 8 dots. Each
 * overlay row is read once, with 16-byte loads, ROW_ROUNDS_AHEAD rounds in
 * flight before the first is used; the first of a chunk are requested before
 * the hidden row is staged, so the two rows' loads overlap (no asynchronous
 * copies on AMD: software pipelining through registers).
 *
 * The dot order. Thread p (0..31) of a group holds the spec's lanes
 * 8p .. 8p + 7: in each 256-element round r it takes elements
 * 256 r + 8 p + i (one 16-byte vector of each row), so each lane's sum runs
 * over increasing element index. Elements past h are skipped, not multiplied
 * by zero. The tree: strides 128 .. 8 pair thread p with p + 16 .. p + 1
 * (shuffles of width 32, the lower lane's value first), strides 4, 2, 1 run in
 * thread 0's own lanes. The group is 32 threads whatever the wavefront width,
 * so the pairing is the spec's at wave32 and wave64 alike.
 */
namespace tovl_hip {

constexpr uint32_t X_CHUNK = 4096; /* hidden-row elements staged at a time: 8 KiB of LDS */
/* Overlay-row vectors a thread has in flight: the whole 16-round chunk (64
 * registers), as the CUDA port's row2 kernel has; 8 took 3.14 us at T = 1
 * against 2.93 on the H200 (docs/HIP.md). */
#ifndef TOVL_HIP_LMHEAD_ROW_ROUNDS_AHEAD
#define TOVL_HIP_LMHEAD_ROW_ROUNDS_AHEAD 16
#endif
constexpr uint32_t ROW_ROUNDS_AHEAD = TOVL_HIP_LMHEAD_ROW_ROUNDS_AHEAD;
constexpr uint32_t LANES = TOVL_DOT_LANES / GROUP; /* dot lanes per thread: 8 */
static_assert(X_CHUNK % TOVL_DOT_LANES == 0 && X_CHUNK % (8 * BLOCK) == 0, "whole rounds, whole vector jobs");
static_assert((X_CHUNK / TOVL_DOT_LANES) % ROW_ROUNDS_AHEAD == 0, "whole batches of rounds per chunk");

/* One round of a thread's 8 lanes: acc[i] += x[e + i] * w[e + i] for the
 * elements below h (the product and the sum each rounded: never fused).
 * WHOLE: all 8 lie below h. */
template <bool WHOLE>
__device__ static inline void dot_round(float (&acc)[LANES], const uint4 &xv, const uint4 &wv, uint32_t e,
                                        uint32_t h) {
    TOVL_HIP_UNROLL
    for (uint32_t i = 0; i < LANES; i++) {
        if (WHOLE || e + i < h) {
            acc[i] = __fadd_rn(acc[i], __fmul_rn(bf16_of(xv, i), bf16_of(wv, i)));
        }
    }
}

/* This thread's vectors of rounds r0 .. r0 + N - 1 of overlay row w, from
 * element c0. WHOLE (the rows 16-byte aligned, the rounds within h): plain
 * 16-byte loads, unconditional, so that all are in flight before the first
 * is used (a load under a condition is waited for where the paths join);
 * else rounds past `rounds` or h are not loaded. */
template <bool WHOLE, uint32_t N>
__device__ static inline void load_rounds(uint4 (&wv)[N], const uint16_t *w, uint32_t c0, uint32_t r0,
                                          uint32_t rounds, uint32_t first, uint32_t h, bool vectors) {
    TOVL_HIP_UNROLL
    for (uint32_t j = 0; j < N; j++) {
        const uint32_t e = c0 + (r0 + j) * TOVL_DOT_LANES + first;
        if (WHOLE) {
            wv[j] = load16(w + e);
        } else if (r0 + j < rounds && e < h) {
            wv[j] = load8_bf16(w, e, h, vectors);
        }
    }
}

/* Rounds of a chunk from element c0: 256-element rounds, the last partial. */
__device__ static inline uint32_t chunk_rounds(uint32_t c0, uint32_t chunk, uint32_t h) {
    return (h - c0 < chunk ? h - c0 + TOVL_DOT_LANES - 1 : chunk) / TOVL_DOT_LANES;
}

/* Strides 128 .. 1 over this thread's 8 lane sums and its group's; the
 * result in the group's thread 0. Every thread of the wavefront calls it. */
__device__ static inline float lmhead_tree(float (&acc)[LANES]) {
    TOVL_HIP_UNROLL
    for (uint32_t d = GROUP / 2; d >= 1; d /= 2) {
        TOVL_HIP_UNROLL
        for (uint32_t i = 0; i < LANES; i++) {
            acc[i] = __fadd_rn(acc[i], __shfl_down(acc[i], d, GROUP));
        }
    }
    TOVL_HIP_UNROLL
    for (uint32_t stride = LANES / 2; stride >= 1; stride /= 2) {
        TOVL_HIP_UNROLL
        for (uint32_t i = 0; i < stride; i++) {
            acc[i] = __fadd_rn(acc[i], acc[i + stride]);
        }
    }
    return acc[0];
}

/* The logit cell (t, id) as bf16, or as f32 bits with every NaN canonical. */
template <bool F32_LOGITS>
__device__ static inline void store_logit(const tovl_lmhead_overlay_args &args, uint32_t t, uint32_t id, float v) {
    const size_t at = (size_t)t * args.ld + id;
    if (F32_LOGITS) {
        ptr<uint32_t>(args.logits)[at] = f32_out_bits(v);
    } else {
        ptr<uint16_t>(args.logits)[at] = f32_to_bf16(v);
    }
}

/* Slot s's cells of the set's lm_head tables (the set's own). */
struct LmheadSlotCells {
    uint64_t rows, ids;
    uint32_t n;
};

__device__ static inline LmheadSlotCells lmhead_slot_cells(const tovl_lmhead_overlay_args &args, uint32_t s) {
    return LmheadSlotCells{ptr<const uint64_t>(args.rows_table)[s], ptr<const uint64_t>(args.ids_table)[s],
                           ptr<const uint32_t>(args.n_table)[s]};
}

/* Thread `from`'s cells, to every thread of its row group. */
__device__ static inline LmheadSlotCells group_lmhead_cells(const LmheadSlotCells &c, uint32_t from) {
    return LmheadSlotCells{group_u64(c.rows, from), group_u64(c.ids, from), __shfl(c.n, (int)from, GROUP)};
}

/* Row t's slot's table cells, in every thread; false (in every thread) when
 * t has no valid slot. Waits for the kernel before (the row slots may come
 * from it). With at most 32 slots, thread k of each row group fetches slot
 * k's cells before the wait (the set's own: no kernel writes them) and the
 * group takes its slot's by shuffles: one round trip fewer. Every thread of
 * the wavefront calls it. */
__device__ static inline bool lmhead_token_cells(const tovl_lmhead_overlay_args &args, uint32_t t,
                                                 LmheadSlotCells &cells) {
    const uint32_t group_lane = threadIdx.x % GROUP;
    const bool by_shuffle = args.max_loras <= GROUP;
    LmheadSlotCells lane_cells = {0, 0, 0};
    if (by_shuffle && group_lane < args.max_loras) {
        lane_cells = lmhead_slot_cells(args, group_lane);
    }
    TOVL_HIP_GRID_DEPENDENCY_WAIT(); /* the row slots and hidden rows may come from the kernel before */
    const int32_t s = row_slot(args.row_slots, args.active_slot, t);
    const bool valid = s >= 0 && (uint32_t)s < args.max_loras;
    cells = group_lmhead_cells(lane_cells, valid ? (uint32_t)s % GROUP : 0u);
    if (valid && !by_shuffle) {
        cells = lmhead_slot_cells(args, (uint32_t)s);
    }
    return valid;
}

/* Elements c0 .. c0 + X_CHUNK of a row path's dot: the first overlay-row
 * vectors requested, the hidden row staged in LDS, then the rounds. WHOLE:
 * the rows 16-byte aligned and the chunk within h. Every thread calls it. */
template <bool WHOLE>
__device__ static inline void rows_chunk(float (&acc)[LANES], uint4 (&xs)[X_CHUNK / 8], const uint16_t *x,
                                         const uint16_t *w, bool live, uint32_t c0, uint32_t h, uint32_t first,
                                         bool vectors) {
    constexpr uint32_t CHUNK_ROUNDS = X_CHUNK / TOVL_DOT_LANES;
    const uint32_t rounds = WHOLE ? CHUNK_ROUNDS : chunk_rounds(c0, X_CHUNK, h);
    uint4 wv[ROW_ROUNDS_AHEAD];
    load_rounds<WHOLE>(wv, w, c0, 0, rounds, first, h, vectors); /* in flight while the hidden row is staged */
    __syncthreads(); /* the previous chunk is read */
    for (uint32_t v = threadIdx.x; v < X_CHUNK / 8; v += BLOCK) {
        xs[v] = WHOLE ? load16(x + c0 + 8 * v) : load8_bf16(x, c0 + 8 * v, h, vectors);
    }
    __syncthreads();
    if (!live) {
        return;
    }
    for (uint32_t r0 = 0; r0 < rounds; r0 += ROW_ROUNDS_AHEAD) {
        if (r0 > 0) {
            load_rounds<WHOLE>(wv, w, c0, r0, rounds, first, h, vectors);
        }
        TOVL_HIP_UNROLL
        for (uint32_t j = 0; j < ROW_ROUNDS_AHEAD; j++) {
            const uint32_t at = (r0 + j) * TOVL_DOT_LANES + first; /* within the chunk */
            if (WHOLE || (r0 + j < rounds && c0 + at < h)) {
                dot_round<WHOLE>(acc, xs[at / 8], wv[j], c0 + at, h);
            }
        }
    }
}

/* Small batches: block (t, y) is token t. */
template <bool F32_LOGITS>
__device__ static void lmhead_rows(const tovl_lmhead_overlay_args &args, uint4 (&xs)[X_CHUNK / 8]) {
    /* xs: the staged part of hidden[t] (LDS) */
    const uint32_t t = blockIdx.x;
    if (t >= args.T) {
        return; /* the whole block */
    }
    LmheadSlotCells cells;
    if (!lmhead_token_cells(args, t, cells)) {
        return; /* uniform */
    }
    const uint32_t n = cells.n < args.max_n ? cells.n : args.max_n;
    const uint32_t h = args.h;
    const uint16_t *x = ptr<const uint16_t>(args.hidden) + (size_t)t * h;
    const uint16_t *rows = ptr<const uint16_t>(cells.rows);
    const uint32_t *ids = ptr<const uint32_t>(cells.ids);
    const bool vectors = h % 8 == 0 && ((args.hidden | (uint64_t)(uintptr_t)rows) & 15u) == 0;
    const uint32_t lane = threadIdx.x % GROUP, cell = threadIdx.x / GROUP;
    const uint32_t first = LANES * lane; /* this thread's first element of a round */

    /* Block-uniform: every thread reaches each barrier below. */
    for (uint32_t k0 = blockIdx.y * LMHEAD_ROWS; k0 < n; k0 += gridDim.y * LMHEAD_ROWS) {
        const uint32_t k = k0 + cell;
        const bool live = k < n;
        const uint16_t *w = rows + (size_t)(live ? k : 0) * h;
        const uint32_t id = live ? ids[k] : UINT32_MAX;
        float acc[LANES];
        TOVL_HIP_UNROLL
        for (uint32_t i = 0; i < LANES; i++) {
            acc[i] = 0.0f;
        }
        for (uint32_t c0 = 0; c0 < h; c0 += X_CHUNK) {
            if (vectors && c0 + X_CHUNK <= h) { /* block-uniform */
                rows_chunk<true>(acc, xs, x, w, live, c0, h, first, vectors);
            } else {
                rows_chunk<false>(acc, xs, x, w, live, c0, h, first, vectors);
            }
        }
        const float v = lmhead_tree(acc);
        if (live && lane == 0 && id < args.vocab) {
            store_logit<F32_LOGITS>(args, t, id, v);
        }
    }
}

/* ---- Larger batches: tiles of up to TILE_ROWS rows of one slot. ---- */
/*
 * A block's tile is TILE_ROWS rows x LMHEAD_ROWS overlay rows. A thread holds
 * the spec's lanes 8p .. 8p + 7 (p: its place in its row group) of TILE_TM x
 * TILE_TN cells: row group g takes overlay rows TILE_TN (g % TILE_OV_GROUPS)
 * .. + TILE_TN and tile rows TILE_TM (g / TILE_OV_GROUPS) .. + TILE_TM, so
 * each element it unpacks from bf16 serves TILE_TN (hidden) or TILE_TM
 * (overlay) products: unpacking bf16 is an instruction per element. Compiled
 * for sm_90, a whole chunk's loop is 208 instructions for a thread's 64
 * multiply-adds with 4 x 2 cells, against 330 with 8 x 1 cells and a branch
 * per row; on the H200 (HIP source, docs/HIP.md) 34.8 us at T = 512 against
 * 41.5 for those and 37.3 for 8 x 1 cells without the branch; 2 x 4 cells
 * (174 registers, one block per SM there) took 42.3.
 */
constexpr uint32_t TILE_ROWS = 8; /* rows of one slot a block takes */
#ifndef TOVL_HIP_LMHEAD_TILE_TN
#define TOVL_HIP_LMHEAD_TILE_TN 2
#endif
constexpr uint32_t TILE_TN = TOVL_HIP_LMHEAD_TILE_TN;                    /* overlay rows of a thread's cells */
constexpr uint32_t TILE_OV_GROUPS = LMHEAD_ROWS / TILE_TN;               /* row groups along the overlay rows */
constexpr uint32_t TILE_TM = TILE_ROWS * TILE_OV_GROUPS / (BLOCK / GROUP); /* tile rows of a thread's cells */
static_assert(TILE_TM * TILE_TN * (BLOCK / GROUP) == TILE_ROWS * LMHEAD_ROWS, "every cell in one row group");
/* A 64-wide wavefront holds row groups 2w and 2w + 1: they share their tile
 * rows, so whether a row exists (the tree's shuffles) is uniform in it. */
static_assert(TILE_OV_GROUPS % 2 == 0, "the two row groups of a wave64 share their tile rows");
/* Elements of each row staged at a time, into one of two LDS buffers: the
 * next chunk's loads are in registers while this one is computed. One
 * 256-element round: on the H200 (HIP source, docs/HIP.md) 512 took 48.9 us
 * at T = 512 against 34.8 (170 registers, one block per SM there). */
#ifndef TOVL_HIP_LMHEAD_TILE_X_CHUNK
#define TOVL_HIP_LMHEAD_TILE_X_CHUNK 256
#endif
constexpr uint32_t TILE_X_CHUNK = TOVL_HIP_LMHEAD_TILE_X_CHUNK;
constexpr uint32_t TILE_CHUNK_ROUNDS = TILE_X_CHUNK / TOVL_DOT_LANES;
constexpr uint32_t TILE_VECTORS = TILE_X_CHUNK / 8;               /* 16-byte vectors of a row's chunk */
constexpr uint32_t TILE_STAGED_ROWS = TILE_ROWS + LMHEAD_ROWS;     /* the group's rows, then the overlay rows */
constexpr uint32_t TILE_STAGE_JOBS = TILE_STAGED_ROWS * TILE_VECTORS / BLOCK; /* vectors per thread and chunk */
constexpr uint32_t TILE_HIDDEN_JOBS = TILE_ROWS * TILE_VECTORS / BLOCK;        /* of them, of hidden rows */
static_assert(TILE_X_CHUNK % TOVL_DOT_LANES == 0 && (TILE_ROWS * TILE_VECTORS) % BLOCK == 0, "whole jobs");

/* A tile block's LDS: two chunks of its rows (16 KiB with 256-element
 * chunks), and the range check's join (tile_range_ok). */
struct TileLds {
    uint4 staged[2][TILE_STAGED_ROWS][TILE_VECTORS];
    uint32_t rows_of[TILE_ROWS];
    uint32_t bounds[4];
};

/* Whether the tiles fuse products into sums where the range check allows. */
#ifndef TOVL_HIP_LMHEAD_FUSE
#define TOVL_HIP_LMHEAD_FUSE 1
#endif

/* max(a, b, c) and min(a + b, c) on the two unsigned 16-bit halves of a
 * word, each half on its own (the add wraps): sm_90's DPX operations on
 * NVIDIA (the kernel emulation models them), packed 16-bit max, min and add
 * on AMD (v_pk_max_u16, v_pk_min_u16, v_pk_sub_u16). */
#if defined(TOVL_HIP_ON_CUDA) || defined(TOVL_HIP_EMU)
__device__ static inline uint32_t u16x2_max3(uint32_t a, uint32_t b, uint32_t c) {
    return __vimax3_u16x2(a, b, c);
}
__device__ static inline uint32_t u16x2_addmin(uint32_t a, uint32_t b, uint32_t c) {
    return __viaddmin_u16x2(a, b, c);
}
#else
typedef unsigned short tovl_u16x2 __attribute__((ext_vector_type(2)));
__device__ static inline tovl_u16x2 as_u16x2(uint32_t v) {
    return __builtin_bit_cast(tovl_u16x2, v);
}
__device__ static inline uint32_t u16x2_max3(uint32_t a, uint32_t b, uint32_t c) {
    return __builtin_bit_cast(
        uint32_t, __builtin_elementwise_max(__builtin_elementwise_max(as_u16x2(a), as_u16x2(b)), as_u16x2(c)));
}
__device__ static inline uint32_t u16x2_addmin(uint32_t a, uint32_t b, uint32_t c) {
    return __builtin_bit_cast(uint32_t, __builtin_elementwise_min(as_u16x2(a) + as_u16x2(b), as_u16x2(c)));
}
#endif

/* The range check of the fused chunks, the CUDA tiles' (lmhead_overlay.cuh,
 * LmheadRange) with the same band. Over the vectors a thread stages it keeps
 * the largest bf16 magnitude and the smallest nonzero one of the hidden rows
 * and of the overlay rows (per 16-bit half; the magnitude minus one through
 * u16x2_addmin, so that zero wraps to the top and drops out). Each element
 * of a chunk is staged by one thread, through its registers, so the block's
 * threads together see every operand once; tile_range_ok joins them. */
struct TileRange {
    uint32_t x_max, x_min1, w_max, w_min1;
    __device__ void clear() {
        x_max = w_max = 0;
        x_min1 = w_min1 = ~0u;
    }
    __device__ static inline void add(uint32_t &max, uint32_t &min1, const uint4 &v) {
        const uint32_t a = v.x & 0x7FFF7FFFu, b = v.y & 0x7FFF7FFFu, c = v.z & 0x7FFF7FFFu, d = v.w & 0x7FFF7FFFu;
        max = u16x2_max3(u16x2_max3(max, a, b), c, d);
        min1 = u16x2_addmin(a, 0xFFFFFFFFu, min1);
        min1 = u16x2_addmin(b, 0xFFFFFFFFu, min1);
        min1 = u16x2_addmin(c, 0xFFFFFFFFu, min1);
        min1 = u16x2_addmin(d, 0xFFFFFFFFu, min1);
    }
};

/* The join's words as the block's first tile finds them: no magnitude yet. */
__device__ static inline void tile_range_reset(uint32_t (&bounds)[4]) {
    bounds[0] = bounds[2] = 0;
    bounds[1] = bounds[3] = 0xFFFFu;
}

/* Every thread's bounds joined in LDS: whether every product of the tile is
 * exact in f32, the same answer in every thread. Where both sides' nonzero
 * elements are normal with biased exponents summing to at least 128
 * (products >= 2^-126) and the largest to at most 380 (products < 2^128),
 * every bf16 x bf16 product is exact (two 8-bit significands): fma(x, w, p)
 * then rounds p + x w once, as the spec's sum of the rounded product does,
 * and so does a zero product. A subnormal, Inf or NaN fails. The join takes
 * the tile's extremes rather than each thread's own operands: any product of
 * the tile lies within them. Every thread calls it; `bounds` as
 * tile_range_reset leaves them, and so again on return. */
__device__ static inline bool tile_range_ok(const TileRange &r, uint32_t (&bounds)[4]) {
    const auto larger = [](uint32_t v) { return (v & 0xFFFFu) > (v >> 16) ? v & 0xFFFFu : v >> 16; };
    const auto smaller = [](uint32_t v) { return (v & 0xFFFFu) < (v >> 16) ? v & 0xFFFFu : v >> 16; };
    atomicMax(&bounds[0], larger(r.x_max));
    atomicMin(&bounds[1], smaller(r.x_min1));
    atomicMax(&bounds[2], larger(r.w_max));
    atomicMin(&bounds[3], smaller(r.w_min1));
    __syncthreads();
    const uint32_t x_hi = bounds[0], x_lo = bounds[1] + 1u, w_hi = bounds[2], w_lo = bounds[3] + 1u;
    __syncthreads(); /* every thread has read them */
    if (threadIdx.x == 0) {
        tile_range_reset(bounds);
    }
    if (x_lo > 0xFFFFu || w_lo > 0xFFFFu) {
        return true; /* one side is all zeros: so is every product */
    }
    const uint32_t ex_lo = x_lo >> 7, ew_lo = w_lo >> 7, ex_hi = x_hi >> 7, ew_hi = w_hi >> 7;
    return ex_lo >= 1u && ew_lo >= 1u && ex_hi <= 254u && ew_hi <= 254u && ex_lo + ew_lo >= 128u &&
           ex_hi + ew_hi <= 380u;
}

/* Inclusive prefix sum of v over the block's threads (in thread order) and
 * the block's total; every thread calls it. Through LDS with a barrier per
 * step, so it does not depend on the wavefront width. */
__device__ static inline uint32_t block_scan(uint32_t v, uint32_t (&scratch)[BLOCK], uint32_t &total) {
    const uint32_t tid = threadIdx.x;
    __syncthreads(); /* scratch is free */
    scratch[tid] = v;
    __syncthreads();
    for (uint32_t d = 1; d < BLOCK; d *= 2) {
        const uint32_t add = tid >= d ? scratch[tid - d] : 0u;
        __syncthreads();
        scratch[tid] += add;
        __syncthreads();
    }
    total = scratch[BLOCK - 1];
    return scratch[tid];
}

/* Which (slot, group of TILE_ROWS rows) block x does for the overlay rows
 * from k0: the x-th, counting the groups of every slot with overlay rows
 * past k0, slot by slot, BLOCK slots at a time. False: x is past them. */
__device__ static bool lmhead_pick(const tovl_lmhead_overlay_args &args, uint32_t x, uint32_t k0, uint32_t &slot,
                                   uint32_t &group) {
    /* live[w % 2]: some slot of window w has rows in the column. Window w
     * clears window w + 1's, which nothing reads until two barriers later. */
    __shared__ uint32_t count[BLOCK], scratch[BLOCK], pick[3], live[2];
    const uint32_t tid = threadIdx.x;
    uint32_t before = 0; /* groups of the windows before; the same in every thread */
    if (tid == 0) {
        live[0] = 0;
    }
    for (uint32_t base = 0, w = 0; base < args.max_loras; base += BLOCK, w ^= 1u) {
        const uint32_t s = base + tid;
        uint32_t n = 0;
        if (s < args.max_loras) {
            const uint32_t n_slot = ptr<const uint32_t>(args.n_table)[s];
            n = n_slot < args.max_n ? n_slot : args.max_n;
        }
        __syncthreads(); /* the previous window's counts and pick are read */
        count[tid] = 0;
        if (tid == 0) {
            pick[0] = 0;
            live[w ^ 1u] = 0;
        }
        if (n > k0) {
            live[w] = 1;
        }
        __syncthreads();
        if (!live[w]) {
            /* Uniform: no slot of the window has rows in the column (the
             * blocks past every slot's rows leave here, before the pass over
             * the row slots). */
            continue;
        }
        for (uint32_t t = tid; t < args.T; t += BLOCK) {
            const int32_t rs = row_slot(args.row_slots, args.active_slot, t);
            if (rs >= 0 && (uint32_t)rs < args.max_loras && (uint32_t)rs - base < BLOCK) {
                atomicAdd(&count[(uint32_t)rs - base], 1u);
            }
        }
        __syncthreads();
        const uint32_t groups = n > k0 ? (count[tid] + TILE_ROWS - 1) / TILE_ROWS : 0u;
        uint32_t total;
        const uint32_t end = before + block_scan(groups, scratch, total);
        if (groups > 0 && x >= end - groups && x < end) {
            pick[0] = 1;
            pick[1] = s;
            pick[2] = x - (end - groups);
        }
        __syncthreads();
        if (pick[0]) {
            slot = pick[1];
            group = pick[2];
            return true;
        }
        before += total;
    }
    return false;
}

/* Rows g * TILE_ROWS .. + TILE_ROWS of slot s, in increasing t, into rows;
 * returns how many there are. */
__device__ static uint32_t lmhead_group_rows(const tovl_lmhead_overlay_args &args, uint32_t s, uint32_t g,
                                             uint32_t (&rows)[TILE_ROWS]) {
    __shared__ uint32_t scratch[BLOCK];
    const uint32_t tid = threadIdx.x, first = g * TILE_ROWS;
    uint32_t found = 0; /* rows of slot s before this pass; the same in every thread */
    for (uint32_t base = 0; base < args.T && found < first + TILE_ROWS; base += BLOCK) {
        const uint32_t t = base + tid;
        const bool mine = t < args.T && row_slot(args.row_slots, args.active_slot, t) == (int32_t)s;
        uint32_t total;
        const uint32_t rank = found + block_scan(mine ? 1u : 0u, scratch, total) - 1u;
        if (mine && rank >= first && rank < first + TILE_ROWS) {
            rows[rank - first] = t;
        }
        found += total;
    }
    __syncthreads(); /* rows are written */
    return found > first ? (found - first < TILE_ROWS ? found - first : TILE_ROWS) : 0u;
}

/* The rows a tile stages: its jobs' row indices (the first TILE_HIDDEN_JOBS
 * into the hidden rows, the others into the slot's overlay rows), kept as
 * 32-bit indices beside two base pointers the block shares (64-bit
 * pointers per job spilled on gfx1100). */
struct TileSources {
    const uint16_t *hidden, *rows;
    uint32_t row[TILE_STAGE_JOBS];
};

/* Chunk c0 of a tile into registers: this thread's TILE_STAGE_JOBS vectors
 * of the staged rows. WHOLE (rows 16-byte aligned, the chunk within h):
 * unconditional 16-byte loads, all in flight at once; else element by
 * element past h (0 there). */
template <bool WHOLE>
__device__ static inline void tile_load_chunk(const TileSources &src, uint32_t c0, uint32_t h, bool vectors,
                                              uint4 (&staged)[TILE_STAGE_JOBS]) {
    TOVL_HIP_UNROLL
    for (uint32_t u = 0; u < TILE_STAGE_JOBS; u++) {
        const uint16_t *row = (u < TILE_HIDDEN_JOBS ? src.hidden : src.rows) + (size_t)src.row[u] * h;
        const uint32_t e = c0 + 8 * ((threadIdx.x + u * BLOCK) % TILE_VECTORS);
        staged[u] = WHOLE ? load16(row + e) : load8_bf16(row, e, h, vectors);
    }
}

/* A tile's dots over chunks c_begin .. c_end (c_end - c_begin a multiple of
 * TILE_X_CHUNK, or the last chunk): chunk c + 1's vectors are loaded into
 * registers while chunk c is computed from LDS buffer c % 2, one barrier a
 * chunk (no asynchronous copies on AMD: software pipelining). Every cell is
 * computed, those of absent rows too (their rows are stand-ins, their sums
 * never stored): no branch in the loop. FUSED (whole chunks only): one
 * __fmaf_rn per product and sum, and the vectors this thread stages go into
 * `range`; the cells are kept only where tile_range_ok then holds. Every
 * thread calls it. */
template <bool WHOLE, bool FUSED>
__device__ static inline void tile_chunks(float (&acc)[TILE_TM][TILE_TN][LANES], TileLds &lds,
                                          const TileSources &src, uint32_t tile_row,
                                          uint32_t overlay_row, uint32_t c_begin, uint32_t c_end, uint32_t h,
                                          bool vectors, TileRange &range) {
    static_assert(WHOLE || !FUSED, "the range check covers whole chunks");
    const uint32_t first = LANES * (threadIdx.x % GROUP);
    uint4 staged[TILE_STAGE_JOBS];
    tile_load_chunk<WHOLE>(src, c_begin, h, vectors, staged);
    __syncthreads(); /* the chunks before are read */
    uint32_t buf = 0;
    for (uint32_t c0 = c_begin; c0 < c_end; c0 += TILE_X_CHUNK, buf ^= 1u) {
        TOVL_HIP_UNROLL
        for (uint32_t u = 0; u < TILE_STAGE_JOBS; u++) {
            const uint32_t v = threadIdx.x + u * BLOCK;
            lds.staged[buf][v / TILE_VECTORS][v % TILE_VECTORS] = staged[u];
            if (FUSED) {
                if (u < TILE_HIDDEN_JOBS) {
                    TileRange::add(range.x_max, range.x_min1, staged[u]);
                } else {
                    TileRange::add(range.w_max, range.w_min1, staged[u]);
                }
            }
        }
        __syncthreads(); /* buffer buf is staged; the other was read a chunk ago */
        if (c0 + TILE_X_CHUNK < c_end) {
            tile_load_chunk<WHOLE>(src, c0 + TILE_X_CHUNK, h, vectors, staged);
        }
        TOVL_HIP_UNROLL
        for (uint32_t j = 0; j < TILE_CHUNK_ROUNDS; j++) {
            const uint32_t at = j * TOVL_DOT_LANES + first, e = c0 + at;
            if (!WHOLE && e >= h) {
                continue;
            }
            float w[TILE_TN][LANES];
            TOVL_HIP_UNROLL
            for (uint32_t n = 0; n < TILE_TN; n++) {
                const uint4 wv = lds.staged[buf][TILE_ROWS + overlay_row + n][at / 8];
                TOVL_HIP_UNROLL
                for (uint32_t i = 0; i < LANES; i++) {
                    w[n][i] = bf16_of(wv, i);
                }
            }
            TOVL_HIP_UNROLL
            for (uint32_t m = 0; m < TILE_TM; m++) {
                const uint4 xv = lds.staged[buf][tile_row + m][at / 8];
                TOVL_HIP_UNROLL
                for (uint32_t i = 0; i < LANES; i++) {
                    if (WHOLE || e + i < h) {
                        const float x = bf16_of(xv, i);
                        TOVL_HIP_UNROLL
                        for (uint32_t n = 0; n < TILE_TN; n++) {
                            acc[m][n][i] = FUSED ? __fmaf_rn(x, w[n][i], acc[m][n][i])
                                                 : __fadd_rn(acc[m][n][i], __fmul_rn(x, w[n][i]));
                        }
                    }
                }
            }
        }
    }
}

/* Block (x, y): the x-th group of up to TILE_ROWS rows of one slot (in
 * increasing t; lmhead_pick) times overlay rows 8 y .. 8 y + 7 of that
 * slot. The group's hidden rows and the overlay rows are staged in LDS,
 * TILE_X_CHUNK elements of each at a time, so each overlay row is read once
 * for up to TILE_ROWS rows and each hidden row once for 8 overlay rows.
 * Each dot takes the order of lmhead_rows (thread p: lanes 8p .. 8p + 7;
 * the same tree), its whole chunks fused where the range check proves that
 * exact (TileRange) and redone unfused where it does not. Absent rows (past the group's or the slot's) are staged
 * as copies of the last present one and their cells not stored. The grid
 * has a block per row (x < T), more than the groups can number: a block
 * past ceil(T / TILE_ROWS) + min(max_loras, T), a bound on them, leaves at
 * once. */
template <bool F32_LOGITS>
__device__ static void lmhead_tiles(const tovl_lmhead_overlay_args &args, TileLds &lds) {
    const uint32_t x = blockIdx.x;
    const uint32_t bound = (args.T + TILE_ROWS - 1) / TILE_ROWS + (args.max_loras < args.T ? args.max_loras : args.T);
    if (x >= bound) {
        return; /* the whole block: no group can be this one */
    }
    TOVL_HIP_GRID_DEPENDENCY_WAIT();
    const uint32_t h = args.h;
    const uint32_t lane = threadIdx.x % GROUP, group = threadIdx.x / GROUP;
    const uint32_t tile_row = TILE_TM * (group / TILE_OV_GROUPS), overlay_row = TILE_TN * (group % TILE_OV_GROUPS);
    uint32_t s, g;
    if (!lmhead_pick(args, x, blockIdx.y * LMHEAD_ROWS, s, g)) {
        return; /* uniform: x is past the batch's groups */
    }
    const uint32_t len = lmhead_group_rows(args, s, g, lds.rows_of);
    const uint32_t n_slot = ptr<const uint32_t>(args.n_table)[s];
    const uint32_t n = n_slot < args.max_n ? n_slot : args.max_n;
    const uint16_t *rows = ptr<const uint16_t>(ptr<const uint64_t>(args.rows_table)[s]);
    const uint32_t *ids = ptr<const uint32_t>(ptr<const uint64_t>(args.ids_table)[s]);
    const uint16_t *hidden = ptr<const uint16_t>(args.hidden);
    const bool vectors = h % 8 == 0 && ((args.hidden | (uint64_t)(uintptr_t)rows) & 15u) == 0;
    if (threadIdx.x == 0) {
        tile_range_reset(lds.bounds); /* before the first tile's first barrier (tile_chunks) */
    }
    for (uint32_t k0 = blockIdx.y * LMHEAD_ROWS; k0 < n; k0 += gridDim.y * LMHEAD_ROWS) {
        TileSources src;
        src.hidden = hidden;
        src.rows = rows;
        TOVL_HIP_UNROLL
        for (uint32_t u = 0; u < TILE_STAGE_JOBS; u++) {
            const uint32_t r = (threadIdx.x + u * BLOCK) / TILE_VECTORS, k = k0 + r - TILE_ROWS;
            src.row[u] = u < TILE_HIDDEN_JOBS ? lds.rows_of[r < len ? r : len - 1] : k < n ? k : n - 1;
        }
        uint32_t id[TILE_TN];
        TOVL_HIP_UNROLL
        for (uint32_t j = 0; j < TILE_TN; j++) {
            const uint32_t k = k0 + overlay_row + j;
            id[j] = k < n ? ids[k] : UINT32_MAX;
        }
        float acc[TILE_TM][TILE_TN][LANES];
        const auto clear = [&]() {
            TOVL_HIP_UNROLL
            for (uint32_t m = 0; m < TILE_TM; m++) {
                TOVL_HIP_UNROLL
                for (uint32_t j = 0; j < TILE_TN; j++) {
                    TOVL_HIP_UNROLL
                    for (uint32_t i = 0; i < LANES; i++) {
                        acc[m][j][i] = 0.0f;
                    }
                }
            }
        };
        clear();
        /* Whole chunks by the fast path, fused while the range check holds
         * (a tile that fails it starts over in the spec's unfused order); a
         * partial last one (or rows not 16-byte aligned) by the general one. */
        const uint32_t whole_end = vectors ? h / TILE_X_CHUNK * TILE_X_CHUNK : 0;
        TileRange range;
        range.clear();
        if (whole_end > 0 && TOVL_HIP_LMHEAD_FUSE) {
            tile_chunks<true, true>(acc, lds, src, tile_row, overlay_row, 0, whole_end, h, vectors, range);
            if (!tile_range_ok(range, lds.bounds)) { /* uniform */
                clear();
                tile_chunks<true, false>(acc, lds, src, tile_row, overlay_row, 0, whole_end, h, vectors, range);
            }
        } else if (whole_end > 0) {
            tile_chunks<true, false>(acc, lds, src, tile_row, overlay_row, 0, whole_end, h, vectors, range);
        }
        if (whole_end < h) {
            tile_chunks<false, false>(acc, lds, src, tile_row, overlay_row, whole_end, h, h, vectors, range);
        }
        TOVL_HIP_UNROLL
        for (uint32_t m = 0; m < TILE_TM; m++) {
            if (tile_row + m < len) { /* uniform in the wavefront: the shuffles see all of it */
                TOVL_HIP_UNROLL
                for (uint32_t j = 0; j < TILE_TN; j++) {
                    const float v = lmhead_tree(acc[m][j]);
                    if (lane == 0 && id[j] < args.vocab) {
                        store_logit<F32_LOGITS>(args, lds.rows_of[tile_row + m], id[j], v);
                    }
                }
            }
        }
    }
}

/* ---- Decode batches: a block per (token, SMALL_ROWS overlay rows). ---- */
/*
 * On the small-batch grid (lmhead_small_grid), block (t, y) computes
 * overlay rows k0 = SMALL_ROWS y .. k0 + SMALL_ROWS - 1 of token t's slot
 * with BLOCK / SMALL_ROWS threads per overlay row, so a few tokens still
 * spread over many blocks. Each chunk of SMALL_CHUNK elements of the hidden
 * row and of the block's overlay rows is loaded with 16-byte loads (all of a
 * thread's in flight at once: unconditional on whole aligned chunks) and
 * staged in LDS; thread q of an overlay row then holds the spec's lanes
 * SMALL_LANES q .. SMALL_LANES q + SMALL_LANES - 1, each summing over
 * increasing element index (elements past h skipped). The lane sums go
 * through LDS to one row group per overlay row, thread p taking lanes
 * 8p .. 8p + 7, and lmhead_tree runs the spec's tree as the other paths do.
 */
#ifndef TOVL_HIP_LMHEAD_SMALL_CHUNK
#define TOVL_HIP_LMHEAD_SMALL_CHUNK (4096 / TOVL_HIP_LMHEAD_SMALL_ROWS)
#endif
constexpr uint32_t SMALL_ROWS = TOVL_HIP_LMHEAD_SMALL_ROWS;
constexpr uint32_t SMALL_CHUNK = TOVL_HIP_LMHEAD_SMALL_CHUNK;
constexpr uint32_t SMALL_THREADS = BLOCK / SMALL_ROWS;                 /* threads per overlay row */
constexpr uint32_t SMALL_LANES = TOVL_DOT_LANES / SMALL_THREADS;       /* dot lanes per thread */
constexpr uint32_t SMALL_ROW_VECTORS = SMALL_CHUNK / 8;                /* 16-byte vectors of a row's chunk */
constexpr uint32_t SMALL_JOBS = (1 + SMALL_ROWS) * SMALL_ROW_VECTORS / BLOCK; /* a thread's loads a chunk */
static_assert(SMALL_LANES * SMALL_THREADS == TOVL_DOT_LANES && SMALL_ROWS * GROUP <= BLOCK, "lanes and tree groups");
static_assert(SMALL_CHUNK % TOVL_DOT_LANES == 0 && SMALL_JOBS * BLOCK == (1 + SMALL_ROWS) * SMALL_ROW_VECTORS,
              "whole rounds, whole vector jobs");

template <bool F32_LOGITS>
__device__ static void lmhead_small(const tovl_lmhead_overlay_args &args,
                                    uint4 (&staged)[(1 + SMALL_ROWS) * SMALL_ROW_VECTORS],
                                    float (&lane_sums)[SMALL_ROWS][TOVL_DOT_LANES]) {
    /* staged (LDS), row 0: hidden[t]'s chunk; row 1 + c: overlay row k0 + c's. */
    const uint32_t t = blockIdx.x;
    if (t >= args.T) {
        return; /* the whole block */
    }
    LmheadSlotCells cells;
    if (!lmhead_token_cells(args, t, cells)) {
        return; /* uniform */
    }
    const uint32_t n = cells.n < args.max_n ? cells.n : args.max_n;
    const uint32_t h = args.h;
    const uint16_t *x = ptr<const uint16_t>(args.hidden) + (size_t)t * h;
    const uint16_t *rows = ptr<const uint16_t>(cells.rows);
    const uint32_t *ids = ptr<const uint32_t>(cells.ids);
    const bool vectors = h % 8 == 0 && ((args.hidden | (uint64_t)(uintptr_t)rows) & 15u) == 0;
    const uint32_t cell = threadIdx.x / SMALL_THREADS;
    const uint32_t first = SMALL_LANES * (threadIdx.x % SMALL_THREADS); /* this thread's first lane */
    const uint32_t tree_cell = threadIdx.x / GROUP, tree_lane = threadIdx.x % GROUP;
    const uint16_t *staged16 = reinterpret_cast<const uint16_t *>(staged);

    /* Block-uniform: every thread reaches each barrier below. */
    for (uint32_t k0 = blockIdx.y * SMALL_ROWS; k0 < n; k0 += gridDim.y * SMALL_ROWS) {
        const bool live = k0 + cell < n;
        const uint32_t k = k0 + tree_cell; /* the cell whose tree this thread's group runs */
        const uint32_t id = tree_cell < SMALL_ROWS && tree_lane == 0 && k < n ? ids[k] : UINT32_MAX; /* early */
        float acc[SMALL_LANES];
        TOVL_HIP_UNROLL
        for (uint32_t i = 0; i < SMALL_LANES; i++) {
            acc[i] = 0.0f;
        }
        for (uint32_t c0 = 0; c0 < h; c0 += SMALL_CHUNK) {
            const bool whole = vectors && c0 + SMALL_CHUNK <= h && k0 + SMALL_ROWS <= n; /* block-uniform */
            uint4 v[SMALL_JOBS];
            TOVL_HIP_UNROLL
            for (uint32_t j = 0; j < SMALL_JOBS; j++) {
                const uint32_t job = threadIdx.x + j * BLOCK, r = job / SMALL_ROW_VECTORS;
                const uint32_t e = c0 + 8 * (job % SMALL_ROW_VECTORS);
                const uint16_t *src = r == 0 ? x : rows + (size_t)(k0 + r - 1) * h;
                if (whole) {
                    v[j] = load16(src + e);
                } else if (r == 0 || k0 + r - 1 < n) {
                    v[j] = load8_bf16(src, e, h, vectors);
                } else {
                    v[j] = uint4{0, 0, 0, 0};
                }
            }
            __syncthreads(); /* the previous chunk is read */
            TOVL_HIP_UNROLL
            for (uint32_t j = 0; j < SMALL_JOBS; j++) {
                staged[threadIdx.x + j * BLOCK] = v[j];
            }
            __syncthreads();
            if (live) {
                const uint32_t rounds = whole ? SMALL_CHUNK / TOVL_DOT_LANES : chunk_rounds(c0, SMALL_CHUNK, h);
                const uint16_t *w = staged16 + (size_t)(1 + cell) * SMALL_CHUNK;
                for (uint32_t r = 0; r < rounds; r++) {
                    TOVL_HIP_UNROLL
                    for (uint32_t i = 0; i < SMALL_LANES; i++) {
                        const uint32_t at = r * TOVL_DOT_LANES + first + i; /* within the chunk */
                        if (whole || c0 + at < h) {
                            acc[i] = __fadd_rn(acc[i], __fmul_rn(bf16_to_f32(staged16[at]), bf16_to_f32(w[at])));
                        }
                    }
                }
            }
        }
        TOVL_HIP_UNROLL
        for (uint32_t i = 0; i < SMALL_LANES; i++) {
            lane_sums[cell][first + i] = acc[i];
        }
        __syncthreads(); /* the next chunk's first barrier orders these reads before the next writes */
        float lanes[LANES];
        TOVL_HIP_UNROLL
        for (uint32_t i = 0; i < LANES; i++) {
            lanes[i] = tree_cell < SMALL_ROWS ? lane_sums[tree_cell][LANES * tree_lane + i] : 0.0f;
        }
        const float value = lmhead_tree(lanes);
        if (id < args.vocab) { /* UINT32_MAX but in the storing thread of a live cell */
            store_logit<F32_LOGITS>(args, t, id, value);
        }
    }
}

/* The LDS of an lm_head block: one path runs in a block, so the three share
 * it (the sum of the three would leave CDNA one workgroup per CU). */
union LmheadLds {
    uint4 rows_xs[X_CHUNK / 8];
    TileLds tiles;
    struct {
        uint4 staged[(1 + SMALL_ROWS) * SMALL_ROW_VECTORS];
        float lane_sums[SMALL_ROWS][TOVL_DOT_LANES];
    } small;
};

/* Whether the host launched the small-batch path's grid (y = max_n /
 * SMALL_ROWS, token_overlay_shape.h) rather than the other paths' (y = the
 * shaped rows / 8, at most max_n / 8), told apart by its height. Where the
 * two could be the same height (max_n <= SMALL_ROWS, or both at the y limit)
 * the other paths take it, which cover every column of either. */
__device__ static inline bool lmhead_small_grid(const tovl_lmhead_overlay_args &args) {
    const uint32_t columns = (uint32_t)(((uint64_t)args.max_n + LMHEAD_ROWS - 1) / LMHEAD_ROWS);
    return gridDim.y > (columns < TOVL_HIP_LMHEAD_MAX_COLUMNS ? columns : TOVL_HIP_LMHEAD_MAX_COLUMNS);
}

/* The small-batch path on its grid (the host gives it for T <=
 * TOVL_HIP_LMHEAD_SMALL_MAX_T), else tiles from TOVL_HIP_LMHEAD_TILE_MIN_T
 * rows on, a block per token between. */
template <bool F32_LOGITS>
__device__ static void lmhead_overlay(const tovl_lmhead_overlay_args &args) {
    /* Each path waits before it reads anything but the set's tables (hidden
     * rows, row slots, logits may come from the kernel before). No early
     * trigger: the next launch goes as the blocks exit. */
    __shared__ LmheadLds lds;
    if (lmhead_small_grid(args)) {
        lmhead_small<F32_LOGITS>(args, lds.small.staged, lds.small.lane_sums);
    } else if (args.T >= TOVL_HIP_LMHEAD_TILE_MIN_T) {
        lmhead_tiles<F32_LOGITS>(args, lds.tiles);
    } else {
        lmhead_rows<F32_LOGITS>(args, lds.rows_xs);
    }
}

} // namespace tovl_hip

/* On AMD, at least two waves per SIMD for lm_head: gfx908's code object
 * otherwise took 143 VGPRs, one wave (127 with it, no VGPR spilled). nvcc and
 * the kernel emulation have no such attribute. */
#if !defined(TOVL_HIP_ON_CUDA) && !defined(TOVL_HIP_EMU)
#define TOVL_HIP_LMHEAD_OCCUPANCY __attribute__((amdgpu_waves_per_eu(2)))
#else
#define TOVL_HIP_LMHEAD_OCCUPANCY
#endif

TOVL_HIP_KERNEL void __launch_bounds__(BLOCK) TOVL_HIP_LMHEAD_OCCUPANCY
lmhead_overlay_bf16(tovl_lmhead_overlay_args args) {
    tovl_hip::lmhead_overlay<false>(args);
}

TOVL_HIP_KERNEL void __launch_bounds__(BLOCK) TOVL_HIP_LMHEAD_OCCUPANCY
lmhead_overlay_f32(tovl_lmhead_overlay_args args) {
    tovl_hip::lmhead_overlay<true>(args);
}
