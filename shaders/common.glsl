// Shared by every tovl compute shader: device-address buffer views, the bf16
// rules of the spec, and the logical-grid mapping.
//
// Float exactness: accumulators are `precise` (SPIR-V NoContraction, so no FMA
// fusion); the backend adds the DenormPreserve, SignedZeroInfNanPreserve and
// RoundingModeRTE execution modes for 32-bit floats at pipeline creation when
// the device supports them. NaN tests and conversions work on bits, so they do
// not depend on the driver's NaN assumptions.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

// Views of device memory by VkDeviceAddress (the backend's device pointers).
layout(buffer_reference, std430, buffer_reference_align = 2) buffer U16Buf { uint16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer U16x8Buf { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer U32Buf { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer I32Buf { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer U64Buf { uint64_t v[]; };
// The same views for memory a kernel only reads (tables, ids, slots, source
// rows): readonly lets the driver take its read-only load path.
layout(buffer_reference, std430, buffer_reference_align = 2) readonly buffer U16In { uint16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer U16x8In { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer U32In { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer I32In { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer U64In { uint64_t v[]; };

// Byte address of element `index` of `elem_size`-byte elements: 64-bit, so
// matrices over 4 GiB (T * ld logits) index correctly.
uint64_t element_address(uint64_t base, uint64_t index, uint elem_size) {
    return base + index * uint64_t(elem_size);
}

bool is_aligned16(uint64_t address) {
    return (address & uint64_t(15)) == uint64_t(0);
}

// bf16 -> f32 is exact: the bits move to the top half.
float bf16_to_f32(uint bits16) {
    return uintBitsToFloat(bits16 << 16);
}

bool bf16_is_nan(uint bits16) {
    return (bits16 & 0x7FFFu) > 0x7F80u;
}

// The f32 bits a kernel stores: every NaN becomes the canonical 0x7FC00000.
uint f32_out_bits(float value) {
    uint bits = floatBitsToUint(value);
    return (bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC00000u : bits;
}

// f32 -> bf16, round to nearest, ties to even; NaN -> 0x7FC0; overflow carries to Inf.
uint f32_to_bf16(float value) {
    uint bits = floatBitsToUint(value);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return 0x7FC0u;
    }
    return (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
}

// One logical grid index spread over X and Y of the dispatch, because a single
// dispatch dimension is only guaranteed 65535 workgroups. gl_NumWorkGroups is
// read only past the first row of workgroups: on NVIDIA's driver it is a trip
// to memory that the shader's first load waits for (an idle embed dispatch on
// the H200: 2.22 -> 2.02 us without it; docs/VULKAN.md, Embed lookups).
uint linear_group_xy() {
    if (gl_WorkGroupID.y == 0u) {
        return gl_WorkGroupID.x;
    }
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

// The same over Y and Z.
uint linear_group_yz() {
    if (gl_WorkGroupID.z == 0u) {
        return gl_WorkGroupID.y;
    }
    return gl_WorkGroupID.z * gl_NumWorkGroups.y + gl_WorkGroupID.y;
}

// The slot of row t: the per-row array when present, else the one active slot.
int row_slot(uint64_t slots, int active_slot, uint t) {
    return slots != uint64_t(0) ? I32In(slots).v[t] : active_slot;
}

bool slot_valid(int slot, uint max_loras) {
    return slot >= 0 && uint(slot) < max_loras;
}
