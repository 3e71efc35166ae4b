#version 460
#extension GL_GOOGLE_include_directive : require
// dispatch_floor: an empty shader of the hooks' workgroup size, for the
// per-dispatch floor that `tovl bench --backend vulkan` prints beside the
// hooks (backends/vulkan/vk_timing.c). Never part of a hook. Its one store is
// never made (the bench pushes address 0), but keeps a driver from treating
// the dispatch as one without effects.
#include "common.glsl"

layout(push_constant, std430) uniform FloorArgs {
    layout(offset = 0) uint64_t marks; // u32 [workgroups], or 0
} args;

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

void main() {
    if (args.marks != uint64_t(0) && gl_LocalInvocationIndex == 0u) {
        U32Buf(args.marks).v[gl_WorkGroupID.x] = 1u;
    }
}
