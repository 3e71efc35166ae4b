/* The Vulkan backend's private state and the helpers its files share.
 * Vulkan is reached only through volk (loaded at run time); volk's symbols are
 * renamed to tovl_volk_* so a static libtovl links next to libvulkan. */
#ifndef TOVL_VK_INTERNAL_H
#define TOVL_VK_INTERNAL_H

#include "tovl_volk_rename.h"
#include "volk.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tovl/backend.h"

/* The kernels this backend ships, in the order of the embedded shader table;
 * a kernel handle is its index + 1. The floor probes are for `tovl bench`
 * only (vk_timing.c): an empty shader recorded five ways. */
enum {
    VK_KERNEL_ROWDIFF,
    VK_KERNEL_EMBED_OVERLAY,
    VK_KERNEL_LMHEAD_BF16,
    VK_KERNEL_LMHEAD_F32,
    VK_KERNEL_FLOOR_BARE,      /* bound once; dispatch + compute-write -> compute-read barrier */
    VK_KERNEL_FLOOR_BIND,      /* bind + push + dispatch + that barrier, each time */
    VK_KERNEL_FLOOR_CONTRACT,  /* recorded exactly as a hook launch (tovl_vk_record_launch) */
    VK_KERNEL_FLOOR_ALL_COMMANDS, /* a hook launch with ALL_COMMANDS barriers before and after */
    VK_KERNEL_FLOOR_UNSYNCED,  /* bound once; dispatches with no barrier */
    VK_KERNEL_COUNT
};
#define VK_KERNEL_FIRST_FLOOR VK_KERNEL_FLOOR_BARE

/* The pipelines: one per shader module (the lm_head kernels have two). */
enum {
    VK_PIPELINE_ROWDIFF,
    VK_PIPELINE_EMBED_OVERLAY,
    VK_PIPELINE_LMHEAD_BF16_TILE,
    VK_PIPELINE_LMHEAD_F32_TILE,
    VK_PIPELINE_LMHEAD_BF16_ROW,
    VK_PIPELINE_LMHEAD_F32_ROW,
    VK_PIPELINE_FLOOR,
    VK_PIPELINE_COUNT
};

/* Logical grid -> workgroups: see vk_kernels.c. */
#define VK_WORKGROUP_SIZE 256u
#define VK_LMHEAD_CELLS_PER_GROUP 8u /* TEAMS in shaders/lmhead_overlay_row.glsl */
#define VK_LMHEAD_TILE_BM 8u         /* BM, BN in shaders/lmhead_overlay_tile.glsl */
#define VK_LMHEAD_TILE_BN 8u

/* Which lm_head variant runs (TOVL_VULKAN_LMHEAD = row | tile; default: by T). */
typedef enum { VK_LMHEAD_AUTO, VK_LMHEAD_ROW, VK_LMHEAD_TILE } vk_lmhead_choice;

/* One device allocation: a buffer with a device address, freed by address. */
typedef struct vk_allocation {
    VkDeviceAddress address;
    VkDeviceSize size;
    VkBuffer buffer;
    VkDeviceMemory memory;
} vk_allocation;

/* Which 32-bit float controls the device supports, so the pipelines ask for them. */
typedef struct vk_float_controls {
    bool denorm_preserve;
    bool signed_zero_inf_nan_preserve;
    bool rounding_rte;
} vk_float_controls;

typedef struct vk_ctx {
    void *loader;           /* dlopen handle of libvulkan.so.1 (NULL when the caller gave the loader) */
    bool owns_instance;     /* false when wrapping the caller's objects */
    bool owns_device;
    VkInstance instance;
    VkPhysicalDevice physical;
    VkDevice device;
    uint32_t queue_family;
    VkQueue queue;
    struct VolkDeviceTable vk;

    /* Validation (own instance with TOVL_VULKAN_VALIDATION=1 only). */
    bool validation;
    VkDebugUtilsMessengerEXT messenger;
    PFN_vkDestroyDebugUtilsMessengerEXT destroy_messenger;
    atomic_uint validation_messages;

    /* Held by every vtable member that touches the own command buffer, the
     * staging buffer or the allocation list, so a loader thread and a
     * serving thread can share the backend (vk_backend.c). */
    pthread_mutex_t lock;

    /* Our own submissions (NULL stream): one command buffer and a fence. */
    VkCommandPool pool;
    VkCommandBuffer cmd;
    VkFence fence;

    /* Host-visible staging buffer for uploads and downloads. */
    VkBuffer staging;
    VkDeviceMemory staging_memory;
    void *staging_map;
    VkDeviceSize staging_size;

    VkPhysicalDeviceMemoryProperties memory_props;
    uint32_t device_memory_type;  /* device-local type for allocations */

    /* Pipelines, created at open so launches never allocate. */
    VkPipelineLayout layout;
    VkPipeline pipelines[VK_PIPELINE_COUNT];
    vk_lmhead_choice lmhead_choice;

    /* Device facts. */
    vk_float_controls float_controls;
    uint32_t max_groups[3];
    uint32_t timestamp_valid_bits;
    double timestamp_period_ns;

    /* Allocations sorted by address. */
    vk_allocation *allocs;
    size_t alloc_count, alloc_capacity;

    /* Text answers of property() and device(). */
    char device_text[384]; /* name (96) + type + api (24) + driver (100) + fixed text: fits without truncation */
    char driver_text[192];
    char subgroup_text[16];
    char denormals_text[96];
    char float_controls_text[128];
    char validation_text[24];
    char api_text[24];
} vk_ctx;

/* vk_device.c: instance, device choice, requirements, device creation. */
tovl_status tovl_vk_open_own(vk_ctx *ctx);
tovl_status tovl_vk_check_physical_device(VkPhysicalDevice physical, const char **missing_feature);
void tovl_vk_describe_device(vk_ctx *ctx);
const char *tovl_vk_result_str(VkResult result);

/* vk_memory.c */
tovl_status tovl_vk_memory_init(vk_ctx *ctx);
void tovl_vk_memory_release(vk_ctx *ctx);
tovl_status tovl_vk_alloc(void *ctx, size_t bytes, tovl_devptr *out);
void tovl_vk_free(void *ctx, tovl_devptr ptr);
tovl_status tovl_vk_upload(void *ctx, tovl_devptr dst, const void *src, size_t bytes);
tovl_status tovl_vk_download(void *ctx, void *dst, tovl_devptr src, size_t bytes);
tovl_status tovl_vk_fill_u32(void *ctx, tovl_devptr dst, uint32_t pattern, size_t bytes);
/* Stream-ordered table writes (vkCmdUpdateBuffer between two barriers) into
 * the caller's command buffer, or submitted and waited for when NULL. */
tovl_status tovl_vk_write_async(void *ctx, const tovl_device_write *writes, uint32_t count, void *stream);
/* A fence in the caller's command buffer: a VkEvent set once every command
 * before it in submission order has completed; 0 for the NULL stream, whose
 * work has completed when its call returns. */
tovl_status tovl_vk_fence_record(void *ctx, void *stream, tovl_fence *out);
tovl_status tovl_vk_fence_query(void *ctx, tovl_fence fence, bool *passed);
void tovl_vk_fence_destroy(void *ctx, tovl_fence fence);
/* A raw device buffer with an address (not tracked; for timing scratch). */
tovl_status tovl_vk_create_buffer(vk_ctx *ctx, VkDeviceSize bytes, VkBufferUsageFlags usage, bool host_visible,
                             VkBuffer *buffer, VkDeviceMemory *memory);
/* Record one global memory barrier into `cmd`. */
void tovl_vk_barrier(const vk_ctx *ctx, VkCommandBuffer cmd, VkPipelineStageFlags src_stage, VkAccessFlags src_access,
                     VkPipelineStageFlags dst_stage, VkAccessFlags dst_access);
/* A primary command buffer from the backend's pool. */
tovl_status tovl_vk_new_command_buffer(vk_ctx *ctx, VkCommandBuffer *out);
/* Begin / submit-and-wait on the backend's own command buffer. */
tovl_status tovl_vk_begin_own(vk_ctx *ctx);
tovl_status tovl_vk_submit_own(vk_ctx *ctx, const char *what);

/* vk_kernels.c */
tovl_status tovl_vk_kernels_init(vk_ctx *ctx);
void tovl_vk_kernels_release(vk_ctx *ctx);
tovl_kernel tovl_vk_try_kernel(void *ctx, const char *name);
tovl_status tovl_vk_launch(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                      size_t args_size, void *stream);
/* Record one launch (barrier, bind, push, dispatch, barrier) into `cmd`. */
tovl_status tovl_vk_record_launch(vk_ctx *ctx, VkCommandBuffer cmd, tovl_kernel kernel, const uint32_t grid[3],
                             const void *args, size_t args_size);

/* The floor probes (VK_KERNEL_FLOOR_*, for tovl bench): `count` dispatches
 * of the empty shader, recorded the way the probe names. */
tovl_status tovl_vk_record_floor(vk_ctx *ctx, VkCommandBuffer cmd, tovl_kernel kernel, uint32_t count,
                                 const void *args, size_t args_size);
/* Which lm_head variant runs, in words (the lmhead_variant property). */
const char *tovl_vk_lmhead_choice_text(const vk_ctx *ctx);

/* Run a subnormal probe dot through lmhead_overlay_f32: true when the device
 * kept the subnormals (and did not fuse). */
tovl_status tovl_vk_probe_denormals(vk_ctx *ctx, bool *preserved);

/* vk_spirv.c: add float-control capabilities and execution modes to a module. */
tovl_status tovl_vk_spirv_with_float_controls(const unsigned char *spirv, size_t size, vk_float_controls fc,
                                         uint32_t **out_words, size_t *out_bytes);

/* vk_timing.c */
tovl_status tovl_vk_time_kernel(void *ctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                           size_t args_size, uint32_t batch, uint32_t repeats, tovl_kernel_timing *out);
tovl_status tovl_vk_copy_bandwidth(void *ctx, size_t bytes, uint32_t repeats, double *gbps);

/* vk_backend.c */
void tovl_vk_ctx_destroy(vk_ctx *ctx);

#endif
