// Push-constant blocks: the argument structs of include/tovl/kernel_args.h with
// explicit offsets. backends/vulkan/vk_kernels.c static-asserts the same
// offsets and sizes on the C side, so the two cannot drift apart silently.
#if defined(TOVL_ARGS_ROWDIFF)
layout(push_constant, std430) uniform RowdiffArgs {
    layout(offset = 0) uint64_t a;      // bf16 [rows, h]
    layout(offset = 8) uint64_t b;      // bf16 [rows, h]
    layout(offset = 16) uint64_t flags; // u32 [rows]
    layout(offset = 24) uint rows;
    layout(offset = 28) uint h;
    layout(offset = 32) float tol;
    layout(offset = 36) uint pad0;
} args; // 40 bytes
#elif defined(TOVL_ARGS_EMBED_OVERLAY)
layout(push_constant, std430) uniform EmbedOverlayArgs {
    layout(offset = 0) uint64_t hidden;         // bf16 [T, h]
    layout(offset = 8) uint64_t token_ids;      // u32 [T]
    layout(offset = 16) uint64_t token_slots;   // i32 [T] or 0
    layout(offset = 24) uint64_t slot_map_table; // u64 [max_loras]
    layout(offset = 32) uint64_t rows_table;    // u64 [max_loras]
    layout(offset = 40) uint64_t n_table;       // u32 [max_loras]
    layout(offset = 48) uint T;
    layout(offset = 52) uint h;
    layout(offset = 56) uint vocab;
    layout(offset = 60) uint max_loras;
    layout(offset = 64) int active_slot;
    layout(offset = 68) uint pad0;
} args; // 72 bytes
#elif defined(TOVL_ARGS_LMHEAD_OVERLAY)
layout(push_constant, std430) uniform LmheadOverlayArgs {
    layout(offset = 0) uint64_t logits;     // bf16 or f32 [T, ld]
    layout(offset = 8) uint64_t hidden;     // bf16 [T, h]
    layout(offset = 16) uint64_t row_slots; // i32 [T] or 0
    layout(offset = 24) uint64_t rows_table; // u64 [max_loras]
    layout(offset = 32) uint64_t ids_table; // u64 [max_loras]
    layout(offset = 40) uint64_t n_table;   // u32 [max_loras]
    layout(offset = 48) uint64_t ld;
    layout(offset = 56) uint T;
    layout(offset = 60) uint h;
    layout(offset = 64) uint vocab;
    layout(offset = 68) uint max_loras;
    layout(offset = 72) int active_slot;
    layout(offset = 76) uint max_n;
    // Not part of the argument struct: the columns of tiles the dispatch
    // holds (the tile shader; backends/vulkan/vk_kernels.c pushes it).
    layout(offset = 80) uint tile_columns;
} args; // 80 bytes, and that word
#else
#error "define one TOVL_ARGS_* before including args.glsl"
#endif
