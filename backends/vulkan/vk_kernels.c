/* The embedded shader table, pipelines (all created at open, so a launch never
 * allocates), and launches: push constants = the C argument struct, recorded
 * into the caller's VkCommandBuffer or into our own and submitted. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

/* The push-constant blocks of shaders/args.glsl use these exact offsets. */
#define ARG_AT(type, member, offset) \
    _Static_assert(offsetof(type, member) == (offset), #type "." #member " must be at byte " #offset)
ARG_AT(tovl_rowdiff_args, a, 0);
ARG_AT(tovl_rowdiff_args, b, 8);
ARG_AT(tovl_rowdiff_args, flags, 16);
ARG_AT(tovl_rowdiff_args, rows, 24);
ARG_AT(tovl_rowdiff_args, h, 28);
ARG_AT(tovl_rowdiff_args, tol, 32);
ARG_AT(tovl_rowdiff_args, pad0, 36);
_Static_assert(sizeof(tovl_rowdiff_args) == 40, "RowdiffArgs is 40 bytes");
ARG_AT(tovl_embed_overlay_args, hidden, 0);
ARG_AT(tovl_embed_overlay_args, token_ids, 8);
ARG_AT(tovl_embed_overlay_args, token_slots, 16);
ARG_AT(tovl_embed_overlay_args, slot_map_table, 24);
ARG_AT(tovl_embed_overlay_args, rows_table, 32);
ARG_AT(tovl_embed_overlay_args, n_table, 40);
ARG_AT(tovl_embed_overlay_args, T, 48);
ARG_AT(tovl_embed_overlay_args, h, 52);
ARG_AT(tovl_embed_overlay_args, vocab, 56);
ARG_AT(tovl_embed_overlay_args, max_loras, 60);
ARG_AT(tovl_embed_overlay_args, active_slot, 64);
ARG_AT(tovl_embed_overlay_args, pad0, 68);
_Static_assert(sizeof(tovl_embed_overlay_args) == 72, "EmbedOverlayArgs is 72 bytes");
ARG_AT(tovl_lmhead_overlay_args, logits, 0);
ARG_AT(tovl_lmhead_overlay_args, hidden, 8);
ARG_AT(tovl_lmhead_overlay_args, row_slots, 16);
ARG_AT(tovl_lmhead_overlay_args, rows_table, 24);
ARG_AT(tovl_lmhead_overlay_args, ids_table, 32);
ARG_AT(tovl_lmhead_overlay_args, n_table, 40);
ARG_AT(tovl_lmhead_overlay_args, ld, 48);
ARG_AT(tovl_lmhead_overlay_args, T, 56);
ARG_AT(tovl_lmhead_overlay_args, h, 60);
ARG_AT(tovl_lmhead_overlay_args, vocab, 64);
ARG_AT(tovl_lmhead_overlay_args, max_loras, 68);
ARG_AT(tovl_lmhead_overlay_args, active_slot, 72);
ARG_AT(tovl_lmhead_overlay_args, max_n, 76);
_Static_assert(sizeof(tovl_lmhead_overlay_args) == 80, "LmheadOverlayArgs is 80 bytes");

/* The lm_head shaders' one word past the argument struct: the columns of
 * tiles the dispatch holds (workgroups; shaders/args.glsl), this port's
 * counterpart of CUDA's gridDim.y. */
#define VK_LMHEAD_TILE_COLUMNS_OFFSET 80u
_Static_assert(VK_LMHEAD_TILE_COLUMNS_OFFSET == sizeof(tovl_lmhead_overlay_args), "the word after the arguments");

/* The largest push-constant block (the lm_head arguments and that word); the
 * pipeline layout's push-constant range. */
#define VK_PUSH_CONSTANT_BYTES 84u
_Static_assert(VK_PUSH_CONSTANT_BYTES <= 128, "push constants must fit the 128 bytes every device has");

/* SPIR-V embedded at build time (backends/vulkan/CMakeLists.txt). */
#define VK_SPIRV(name)                                  \
    extern const unsigned char tovl_vk_spirv_##name[]; \
    extern const size_t tovl_vk_spirv_##name##_size
VK_SPIRV(rowdiff);
VK_SPIRV(embed_overlay);
VK_SPIRV(lmhead_overlay_bf16);
VK_SPIRV(lmhead_overlay_f32);
VK_SPIRV(lmhead_overlay_bf16_row);
VK_SPIRV(lmhead_overlay_f32_row);
VK_SPIRV(dispatch_floor);

typedef struct vk_shader {
    const char *name;
    const unsigned char *spirv; /* NULL: not in this build */
    const size_t *spirv_size;
} vk_shader;

#define VK_SHADER(name) {#name, tovl_vk_spirv_##name, &tovl_vk_spirv_##name##_size}
static const vk_shader shaders[VK_PIPELINE_COUNT] = {
    [VK_PIPELINE_ROWDIFF] = VK_SHADER(rowdiff),
    [VK_PIPELINE_EMBED_OVERLAY] = VK_SHADER(embed_overlay),
    [VK_PIPELINE_LMHEAD_BF16_TILE] = VK_SHADER(lmhead_overlay_bf16),
    [VK_PIPELINE_LMHEAD_F32_TILE] = VK_SHADER(lmhead_overlay_f32),
    [VK_PIPELINE_LMHEAD_BF16_ROW] = VK_SHADER(lmhead_overlay_bf16_row),
    [VK_PIPELINE_LMHEAD_F32_ROW] = VK_SHADER(lmhead_overlay_f32_row),
    [VK_PIPELINE_FLOOR] = VK_SHADER(dispatch_floor),
};

/* The kernels by name: their argument size (0: any, up to the push-constant
 * range) and pipeline (the lm_head kernels: the tile variant; the row variant
 * is the next pipeline). */
typedef struct vk_kernel_entry {
    const char *name;
    size_t args_size;
    int pipeline;
} vk_kernel_entry;

static const vk_kernel_entry kernels[VK_KERNEL_COUNT] = {
    [VK_KERNEL_ROWDIFF] = {TOVL_KERNEL_ROWDIFF, sizeof(tovl_rowdiff_args), VK_PIPELINE_ROWDIFF},
    [VK_KERNEL_EMBED_OVERLAY] = {TOVL_KERNEL_EMBED_OVERLAY, sizeof(tovl_embed_overlay_args), VK_PIPELINE_EMBED_OVERLAY},
    [VK_KERNEL_LMHEAD_BF16] = {TOVL_KERNEL_LMHEAD_OVERLAY_BF16, sizeof(tovl_lmhead_overlay_args),
                               VK_PIPELINE_LMHEAD_BF16_TILE},
    [VK_KERNEL_LMHEAD_F32] = {TOVL_KERNEL_LMHEAD_OVERLAY_F32, sizeof(tovl_lmhead_overlay_args),
                              VK_PIPELINE_LMHEAD_F32_TILE},
    [VK_KERNEL_FLOOR_BARE] = {"dispatch_floor_bare", 0, VK_PIPELINE_FLOOR},
    [VK_KERNEL_FLOOR_BIND] = {"dispatch_floor_bind", 0, VK_PIPELINE_FLOOR},
    [VK_KERNEL_FLOOR_CONTRACT] = {"dispatch_floor_contract", 0, VK_PIPELINE_FLOOR},
    [VK_KERNEL_FLOOR_ALL_COMMANDS] = {"dispatch_floor_all_commands", 0, VK_PIPELINE_FLOOR},
    [VK_KERNEL_FLOOR_UNSYNCED] = {"dispatch_floor_unsynced", 0, VK_PIPELINE_FLOOR},
};
_Static_assert(VK_PIPELINE_LMHEAD_BF16_ROW - VK_PIPELINE_LMHEAD_BF16_TILE == 2 &&
                   VK_PIPELINE_LMHEAD_F32_ROW - VK_PIPELINE_LMHEAD_F32_TILE == 2,
               "each lm_head row variant sits two pipelines after its tile variant");

static tovl_status create_pipeline(vk_ctx *ctx, const vk_shader *shader, VkPipeline *out) {
    uint32_t *words = NULL;
    size_t bytes = 0;
    tovl_status st = tovl_vk_spirv_with_float_controls(shader->spirv, *shader->spirv_size, ctx->float_controls, &words,
                                                  &bytes);
    if (st != TOVL_OK) {
        return st;
    }
    VkShaderModuleCreateInfo module_info = {
        .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
        .codeSize = bytes,
        .pCode = words,
    };
    VkShaderModule module;
    VkResult r = ctx->vk.vkCreateShaderModule(ctx->device, &module_info, NULL, &module);
    free(words);
    if (r != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkCreateShaderModule(%s): %s", shader->name, tovl_vk_result_str(r));
    }
    VkComputePipelineCreateInfo info = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage =
            {
                .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                .module = module,
                .pName = "main",
            },
        .layout = ctx->layout,
    };
    r = ctx->vk.vkCreateComputePipelines(ctx->device, VK_NULL_HANDLE, 1, &info, NULL, out);
    ctx->vk.vkDestroyShaderModule(ctx->device, module, NULL);
    if (r != VK_SUCCESS) {
        *out = VK_NULL_HANDLE;
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkCreateComputePipelines(%s): %s", shader->name,
                          tovl_vk_result_str(r));
    }
    return TOVL_OK;
}

tovl_status tovl_vk_kernels_init(vk_ctx *ctx) {
    VkPushConstantRange range = {
        .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT,
        .offset = 0,
        .size = VK_PUSH_CONSTANT_BYTES,
    };
    VkPipelineLayoutCreateInfo layout = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
        .pushConstantRangeCount = 1,
        .pPushConstantRanges = &range,
    };
    VkResult r = ctx->vk.vkCreatePipelineLayout(ctx->device, &layout, NULL, &ctx->layout);
    if (r != VK_SUCCESS) {
        ctx->layout = VK_NULL_HANDLE;
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkCreatePipelineLayout: %s", tovl_vk_result_str(r));
    }
    for (int k = 0; k < VK_PIPELINE_COUNT; k++) {
        if (!shaders[k].spirv) {
            continue;
        }
        tovl_status st = create_pipeline(ctx, &shaders[k], &ctx->pipelines[k]);
        if (st != TOVL_OK) {
            return st;
        }
    }
    return TOVL_OK;
}

void tovl_vk_kernels_release(vk_ctx *ctx) {
    if (!ctx->device) {
        return;
    }
    for (int k = 0; k < VK_PIPELINE_COUNT; k++) {
        if (ctx->pipelines[k]) {
            ctx->vk.vkDestroyPipeline(ctx->device, ctx->pipelines[k], NULL);
        }
    }
    if (ctx->layout) {
        ctx->vk.vkDestroyPipelineLayout(ctx->device, ctx->layout, NULL);
    }
}

tovl_kernel tovl_vk_try_kernel(void *vctx, const char *name) {
    vk_ctx *ctx = vctx;
    for (int k = 0; k < VK_KERNEL_COUNT; k++) {
        if (strcmp(name, kernels[k].name) == 0) {
            return ctx->pipelines[kernels[k].pipeline] ? (tovl_kernel)(k + 1) : 0;
        }
    }
    return 0;
}

/* The lm_head tiles take over from the rows at this batch size (AUTO). On
 * the H200 with 8 slots x 64 rows the rows took 8.4, 10.2, 14.1, 15.6 us at
 * T = 64, 96, 128, 160 and the tiles 11.1, 11.1, 15.1, 15.2
 * (docs/PERFORMANCE.md, Vulkan). */
#define VK_LMHEAD_TILE_MIN_T 144
/* The row shader's X for a launch shaped for fewer rows than max_n (a
 * fixed-shape set's) widens up to this many workgroups in all, so at T <= 8
 * a capacity of 256 is covered whole. */
#define VK_LMHEAD_SHAPED_GROUPS 256u
#define TOVL_STR_(x) #x
#define TOVL_STR(x) TOVL_STR_(x)

static bool lmhead_tiles(const vk_ctx *ctx, const tovl_lmhead_overlay_args *a) {
    switch (ctx->lmhead_choice) {
    case VK_LMHEAD_ROW: return false;
    case VK_LMHEAD_TILE: return true;
    default: return a->T >= (uint32_t)VK_LMHEAD_TILE_MIN_T;
    }
}

static uint32_t ceil_div(uint64_t a, uint64_t b) {
    return (uint32_t)((a + b - 1) / b);
}

/* One logical index of `count` workgroups spread over X and Y. */
static tovl_status spread_xy(const vk_ctx *ctx, const char *name, uint64_t count, uint32_t groups[3]) {
    groups[0] = (uint32_t)(count < ctx->max_groups[0] ? count : ctx->max_groups[0]);
    groups[1] = groups[0] ? ceil_div(count, groups[0]) : 0;
    groups[2] = 1;
    if (count > UINT32_MAX || groups[1] > ctx->max_groups[1]) {
        return tovl_error(TOVL_ERR_LAUNCH, "vulkan: %s needs %llu workgroups, more than the device's counts allow",
                          name, (unsigned long long)count);
    }
    return TOVL_OK;
}

/* Logical grid -> pipeline and workgroup counts (see the shaders' main()). */
static tovl_status workgroups(const vk_ctx *ctx, int k, const uint32_t grid[3], const void *args, int *pipeline,
                              uint32_t groups[3], uint32_t *tile_columns) {
    const char *name = kernels[k].name;
    *pipeline = kernels[k].pipeline;
    *tile_columns = 0;
    if (k >= VK_KERNEL_FIRST_FLOOR) {
        groups[0] = groups[1] = groups[2] = 1;
        return TOVL_OK;
    }
    if (k != VK_KERNEL_LMHEAD_BF16 && k != VK_KERNEL_LMHEAD_F32) {
        return spread_xy(ctx, name, grid[0], groups); /* X and Y = the one logical index */
    }
    const tovl_lmhead_overlay_args *a = args;
    if (lmhead_tiles(ctx, a)) {
        /* The tiles: (groups of rows, columns of overlay rows), one index.
         * The columns cover the rows the launch is shaped for (grid[1],
         * kernel_args.h); a workgroup also does the columns past them, y +
         * tile_columns, ... So a fixed-shape set's tiles cost what 64 rows'
         * cost whatever its capacity, and a slot of more rows takes rounds. */
        const uint64_t row_groups = (uint64_t)ceil_div(a->T, VK_LMHEAD_TILE_BM) + (a->max_loras < a->T ? a->max_loras : a->T);
        *tile_columns = ceil_div(grid[1] < a->max_n ? grid[1] : a->max_n, VK_LMHEAD_TILE_BN);
        return spread_xy(ctx, name, row_groups * *tile_columns, groups);
    }
    /* The rows: X = chunks of cells of k, Y and Z = t. X covers the rows the
     * launch is shaped for (grid[1], kernel_args.h), widened toward max_n
     * up to VK_LMHEAD_SHAPED_GROUPS workgroups in all; the shader's
     * workgroups loop over the chunks past X, as the tiles' loop over the
     * columns past theirs. */
    *pipeline += VK_PIPELINE_LMHEAD_BF16_ROW - VK_PIPELINE_LMHEAD_BF16_TILE;
    const uint32_t rows = grid[0];
    const uint32_t all = ceil_div(a->max_n, VK_LMHEAD_CELLS_PER_GROUP);
    const uint32_t shaped = ceil_div(grid[1] < a->max_n ? grid[1] : a->max_n, VK_LMHEAD_CELLS_PER_GROUP);
    const uint32_t budget = rows ? VK_LMHEAD_SHAPED_GROUPS / rows : 0;
    groups[0] = budget > shaped ? (budget < all ? budget : all) : shaped;
    groups[1] = rows < ctx->max_groups[1] ? rows : ctx->max_groups[1];
    groups[2] = groups[1] ? ceil_div(rows, groups[1]) : 0;
    if (groups[0] > ctx->max_groups[0] || groups[2] > ctx->max_groups[2]) {
        return tovl_error(TOVL_ERR_LAUNCH, "vulkan: %s grid (%u, %u) exceeds the device's workgroup counts", name,
                          grid[0], a->max_n);
    }
    return TOVL_OK;
}

/* The hooks' barriers cover the compute-shader and transfer stages, where an
 * engine's producers and consumers of hidden states and logits run. With
 * ALL_COMMANDS on either side an empty dispatch took 4.47 us on the H200's
 * driver, 1.70 us with these, 1.69 us with one compute -> compute barrier
 * (docs/PERFORMANCE.md, Vulkan: the per-dispatch floor). */
#define VK_HOOK_STAGES (VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT)
#define VK_HOOK_ACCESS                                                                                         \
    (VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT | \
     VK_ACCESS_TRANSFER_WRITE_BIT)

/* What compute shaders and transfers wrote before (the engine's gather or
 * lm_head, a copy) is visible to the kernel. */
static void barrier_before(const vk_ctx *ctx, VkCommandBuffer cmd) {
    tovl_vk_barrier(ctx, cmd, VK_HOOK_STAGES, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
}

/* The kernel's writes are visible to the compute shaders and transfers the
 * caller records next. */
static void barrier_after(const vk_ctx *ctx, VkCommandBuffer cmd) {
    tovl_vk_barrier(ctx, cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_HOOK_STAGES,
                    VK_HOOK_ACCESS);
}

tovl_status tovl_vk_record_launch(vk_ctx *ctx, VkCommandBuffer cmd, tovl_kernel kernel, const uint32_t grid[3],
                                  const void *args, size_t args_size) {
    if (kernel == 0 || kernel > VK_KERNEL_COUNT || !ctx->pipelines[kernels[kernel - 1].pipeline]) {
        return tovl_error(TOVL_ERR_LAUNCH, "vulkan: launch of unknown kernel handle %llu", (unsigned long long)kernel);
    }
    int k = (int)kernel - 1;
    const size_t want = kernels[k].args_size;
    if (!args || (want ? args_size != want : args_size > VK_PUSH_CONSTANT_BYTES)) {
        return tovl_error(TOVL_ERR_LAUNCH, "vulkan: kernel %s expects %zu bytes of arguments, got %zu",
                          kernels[k].name, want ? want : (size_t)VK_PUSH_CONSTANT_BYTES, args_size);
    }
    uint32_t groups[3], tile_columns;
    int pipeline;
    tovl_status st = workgroups(ctx, k, grid, args, &pipeline, groups, &tile_columns);
    if (st != TOVL_OK) {
        return st;
    }
    barrier_before(ctx, cmd);
    ctx->vk.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, ctx->pipelines[pipeline]);
    if (k == VK_KERNEL_LMHEAD_BF16 || k == VK_KERNEL_LMHEAD_F32) {
        unsigned char block[VK_PUSH_CONSTANT_BYTES];
        memcpy(block, args, args_size);
        memcpy(block + VK_LMHEAD_TILE_COLUMNS_OFFSET, &tile_columns, sizeof tile_columns);
        ctx->vk.vkCmdPushConstants(cmd, ctx->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof block, block);
    } else if (args_size) {
        ctx->vk.vkCmdPushConstants(cmd, ctx->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)args_size, args);
    }
    if (groups[0] && groups[1] && groups[2]) {
        ctx->vk.vkCmdDispatch(cmd, groups[0], groups[1], groups[2]);
    }
    barrier_after(ctx, cmd);
    return TOVL_OK;
}

tovl_status tovl_vk_record_floor(vk_ctx *ctx, VkCommandBuffer cmd, tovl_kernel kernel, uint32_t count,
                                 const void *args, size_t args_size) {
    const int k = (int)kernel - 1;
    if (k == VK_KERNEL_FLOOR_CONTRACT) {
        tovl_status st = TOVL_OK;
        for (uint32_t i = 0; i < count && st == TOVL_OK; i++) {
            st = tovl_vk_record_launch(ctx, cmd, kernel, (const uint32_t[3]){1, 1, 1}, args, args_size);
        }
        return st;
    }
    if (args_size > VK_PUSH_CONSTANT_BYTES || !ctx->pipelines[VK_PIPELINE_FLOOR]) {
        return tovl_error(TOVL_ERR_LAUNCH, "vulkan: floor probe %d: no pipeline or %zu bytes of arguments", k,
                          args_size);
    }
    const bool every_time = k == VK_KERNEL_FLOOR_BIND || k == VK_KERNEL_FLOOR_ALL_COMMANDS;
    for (uint32_t i = 0; i < count; i++) {
        if (k == VK_KERNEL_FLOOR_ALL_COMMANDS) {
            /* The hooks' two barriers with ALL_COMMANDS for "before" and "after". */
            tovl_vk_barrier(ctx, cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT,
                            VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
        }
        if (i == 0 || every_time) {
            ctx->vk.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, ctx->pipelines[VK_PIPELINE_FLOOR]);
            if (args_size) {
                ctx->vk.vkCmdPushConstants(cmd, ctx->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, (uint32_t)args_size,
                                           args);
            }
        }
        ctx->vk.vkCmdDispatch(cmd, 1, 1, 1);
        if (k == VK_KERNEL_FLOOR_ALL_COMMANDS) {
            tovl_vk_barrier(ctx, cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                            VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
        } else if (k != VK_KERNEL_FLOOR_UNSYNCED) {
            /* The narrowest barrier between two hooks: shader writes -> shader reads. */
            tovl_vk_barrier(ctx, cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                            VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT);
        }
    }
    return TOVL_OK;
}

const char *tovl_vk_lmhead_choice_text(const vk_ctx *ctx) {
    switch (ctx->lmhead_choice) {
    case VK_LMHEAD_ROW: return "row (TOVL_VULKAN_LMHEAD)";
    case VK_LMHEAD_TILE: return "tile (TOVL_VULKAN_LMHEAD)";
    default: return "row below T = " TOVL_STR(VK_LMHEAD_TILE_MIN_T) ", tile from it";
    }
}

tovl_status tovl_vk_launch(void *vctx, tovl_kernel kernel, const uint32_t grid[3], const void *args, size_t args_size,
                      void *stream) {
    vk_ctx *ctx = vctx;
    if (stream) {
        /* The caller's command buffer, in the recording state: record only. */
        return tovl_vk_record_launch(ctx, (VkCommandBuffer)stream, kernel, grid, args, args_size);
    }
    tovl_status st = tovl_vk_begin_own(ctx);
    if (st != TOVL_OK) {
        return st;
    }
    st = tovl_vk_record_launch(ctx, ctx->cmd, kernel, grid, args, args_size);
    if (st != TOVL_OK) {
        ctx->vk.vkEndCommandBuffer(ctx->cmd);
        return st;
    }
    return tovl_vk_submit_own(ctx, "launch");
}

/* Without the DenormPreserve mode the driver's default applies, which Vulkan
 * leaves open: measure it with the lm_head kernel itself. The probe dot is
 * lane 0 = 2^-149 (a subnormal product), then + 2^-150 (a product that is a
 * rounding tie): unfused and subnormal-preserving it is exactly 2^-149 (bits
 * 0x00000001); flushing gives 0, a fused multiply-add 2^-148. */
tovl_status tovl_vk_probe_denormals(vk_ctx *ctx, bool *preserved) {
    enum { H = 257, HIDDEN = 0, WEIGHTS = 528, IDS = 1056, ROWS_TABLE = 1072, IDS_TABLE = 1080, N_TABLE = 1088,
           LOGITS = 1104, BYTES = 1120 };
    unsigned char image[BYTES];
    memset(image, 0, sizeof image);
    const uint16_t x0 = 0x1A80;     /* 2^-74 in bf16 */
    const uint16_t w_tiny = 0x1A00; /* 2^-75 */
    memcpy(image + HIDDEN, &x0, 2);
    memcpy(image + HIDDEN + 2 * 256, &w_tiny, 2);
    memcpy(image + WEIGHTS, &w_tiny, 2);
    memcpy(image + WEIGHTS + 2 * 256, &w_tiny, 2);
    const uint32_t one = 1, poison = 0xDEADBEEFu;
    memcpy(image + N_TABLE, &one, 4);
    memcpy(image + LOGITS, &poison, 4);
    tovl_devptr base = 0;
    tovl_status st = tovl_vk_alloc(ctx, BYTES, &base);
    if (st != TOVL_OK) {
        return st;
    }
    const uint64_t rows = base + WEIGHTS, ids = base + IDS;
    memcpy(image + ROWS_TABLE, &rows, 8);
    memcpy(image + IDS_TABLE, &ids, 8);
    tovl_lmhead_overlay_args args = {
        .logits = base + LOGITS,
        .hidden = base + HIDDEN,
        .rows_table = base + ROWS_TABLE,
        .ids_table = base + IDS_TABLE,
        .n_table = base + N_TABLE,
        .ld = 1,
        .T = 1,
        .h = H,
        .vocab = 1,
        .max_loras = 1,
        .active_slot = 0,
        .max_n = 1,
    };
    const uint32_t grid[3] = {1, 1, 1};
    uint32_t result = 0;
    st = tovl_vk_upload(ctx, base, image, BYTES);
    if (st == TOVL_OK) {
        st = tovl_vk_launch(ctx, VK_KERNEL_LMHEAD_F32 + 1, grid, &args, sizeof args, NULL); /* T = 1: the row variant */
    }
    if (st == TOVL_OK) {
        st = tovl_vk_download(ctx, &result, base + LOGITS, 4);
    }
    tovl_vk_free(ctx, base);
    *preserved = result == 0x00000001u;
    return st;
}
