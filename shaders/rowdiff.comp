#version 460
#extension GL_GOOGLE_include_directive : require
// rowdiff: flags[r] = 1 when row r of the bf16 matrices a and b differ, else 0.
// tol = 0 (or any non-positive tol): any bit differs. tol > 0: some pair has
// |f32(a) - f32(b)| > tol, or a NaN on one side only.
// One workgroup of 256 invocations per row; 16-byte loads when the rows allow.
#define TOVL_ARGS_ROWDIFF
#include "common.glsl"
#include "args.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

shared uint row_differs;

// tol > 0 decided on bits: +0, negatives and NaN all mean "bitwise".
bool tolerance_mode(float tol) {
    uint bits = floatBitsToUint(tol);
    return bits != 0u && bits <= 0x7F800000u;
}

bool pair_differs(uint a16, uint b16, bool use_tol, float tol) {
    if (a16 == b16) {
        return false; // equal bits never differ (this also covers Inf vs the same Inf)
    }
    if (!use_tol) {
        return true;
    }
    bool a_nan = bf16_is_nan(a16);
    bool b_nan = bf16_is_nan(b16);
    if (a_nan || b_nan) {
        return a_nan != b_nan;
    }
    precise float diff = abs(bf16_to_f32(a16) - bf16_to_f32(b16));
    return diff > tol;
}

bool words_differ(uvec4 a, uvec4 b, bool use_tol, float tol) {
    if (!use_tol) {
        return any(notEqual(a, b));
    }
    bool d = false;
    for (int c = 0; c < 4; c++) {
        d = d || pair_differs(a[c] & 0xFFFFu, b[c] & 0xFFFFu, true, tol) ||
            pair_differs(a[c] >> 16, b[c] >> 16, true, tol);
    }
    return d;
}

void main() {
    uint row = linear_group_xy();
    if (row >= args.rows) {
        return; // uniform across the workgroup
    }
    uint tid = gl_LocalInvocationIndex;
    if (tid == 0u) {
        row_differs = 0u;
    }
    barrier();

    bool use_tol = tolerance_mode(args.tol);
    uint h = args.h;
    uint64_t row_a = element_address(args.a, uint64_t(row) * uint64_t(h), 2u);
    uint64_t row_b = element_address(args.b, uint64_t(row) * uint64_t(h), 2u);
    bool differs = false;
    if ((h & 7u) == 0u && is_aligned16(row_a) && is_aligned16(row_b)) {
        U16x8Buf a8 = U16x8Buf(row_a);
        U16x8Buf b8 = U16x8Buf(row_b);
        uint n8 = h / 8u;
        // Two 16-byte loads of each matrix in flight per step.
        for (uint m = tid; m < n8; m += 512u) {
            uvec4 va0 = a8.v[m];
            uvec4 vb0 = b8.v[m];
            bool second = m + 256u < n8;
            uvec4 va1 = second ? a8.v[m + 256u] : uvec4(0u);
            uvec4 vb1 = second ? b8.v[m + 256u] : uvec4(0u);
            differs = differs || words_differ(va0, vb0, use_tol, args.tol) ||
                      words_differ(va1, vb1, use_tol, args.tol);
        }
    } else {
        U16Buf a1 = U16Buf(row_a);
        U16Buf b1 = U16Buf(row_b);
        for (uint i = tid; i < h; i += 256u) {
            differs = differs || pair_differs(uint(a1.v[i]), uint(b1.v[i]), use_tol, args.tol);
        }
    }
    if (differs) {
        atomicOr(row_differs, 1u);
    }
    barrier();
    if (tid == 0u) {
        U32Buf(args.flags).v[row] = row_differs;
    }
}
