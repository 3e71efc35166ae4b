#version 460
// dispatch_floor: an empty shader of the hooks' workgroup size, for the
// per-dispatch floor that `tovl bench --backend vulkan` prints beside the
// hooks (backends/vulkan/vk_timing.c). Never part of a hook.
layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

void main() {
}
