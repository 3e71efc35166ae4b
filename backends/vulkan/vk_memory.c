/* Device memory: one VkBuffer with a device address per allocation (the
 * address is the backend's device pointer), freed by address; uploads and
 * downloads through a host-visible staging buffer on the backend's queue. */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

#define VK_STAGING_BYTES (16u << 20)
#define VK_FENCE_TIMEOUT_NS (120ull * 1000 * 1000 * 1000)

static const VkBufferUsageFlags device_buffer_usage =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT |
    VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

static uint32_t find_memory_type(const vk_ctx *ctx, uint32_t allowed, VkMemoryPropertyFlags want,
                                 VkMemoryPropertyFlags prefer) {
    uint32_t fallback = UINT32_MAX;
    for (uint32_t i = 0; i < ctx->memory_props.memoryTypeCount; i++) {
        VkMemoryPropertyFlags flags = ctx->memory_props.memoryTypes[i].propertyFlags;
        if (!(allowed & (1u << i)) || (flags & want) != want) {
            continue;
        }
        if ((flags & prefer) == prefer) {
            return i;
        }
        if (fallback == UINT32_MAX) {
            fallback = i;
        }
    }
    return fallback;
}

tovl_status tovl_vk_create_buffer(vk_ctx *ctx, VkDeviceSize bytes, VkBufferUsageFlags usage, bool host_visible,
                             VkBuffer *buffer, VkDeviceMemory *memory) {
    *buffer = VK_NULL_HANDLE;
    *memory = VK_NULL_HANDLE;
    VkBufferCreateInfo info = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = bytes,
        .usage = usage,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = ctx->vk.vkCreateBuffer(ctx->device, &info, NULL, buffer);
    if (r != VK_SUCCESS) {
        *buffer = VK_NULL_HANDLE;
        return tovl_error(r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY
                              ? TOVL_ERR_OUT_OF_MEMORY
                              : TOVL_ERR_DEVICE,
                          "vulkan: vkCreateBuffer of %llu bytes: %s", (unsigned long long)bytes, tovl_vk_result_str(r));
    }
    VkMemoryRequirements req;
    ctx->vk.vkGetBufferMemoryRequirements(ctx->device, *buffer, &req);
    uint32_t type = host_visible
                        ? find_memory_type(ctx, req.memoryTypeBits,
                                           VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                           VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
                        : find_memory_type(ctx, req.memoryTypeBits, 0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    if (type == UINT32_MAX) {
        ctx->vk.vkDestroyBuffer(ctx->device, *buffer, NULL);
        *buffer = VK_NULL_HANDLE;
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: no %s memory type for a buffer",
                          host_visible ? "host-visible" : "device");
    }
    VkMemoryAllocateFlagsInfo flags = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
        .flags = (usage & VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT) ? VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT : 0,
    };
    VkMemoryAllocateInfo alloc = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .pNext = &flags,
        .allocationSize = req.size,
        .memoryTypeIndex = type,
    };
    r = ctx->vk.vkAllocateMemory(ctx->device, &alloc, NULL, memory);
    if (r == VK_SUCCESS) {
        r = ctx->vk.vkBindBufferMemory(ctx->device, *buffer, *memory, 0);
        if (r != VK_SUCCESS) {
            ctx->vk.vkFreeMemory(ctx->device, *memory, NULL);
        }
    }
    if (r != VK_SUCCESS) {
        ctx->vk.vkDestroyBuffer(ctx->device, *buffer, NULL);
        *buffer = VK_NULL_HANDLE;
        *memory = VK_NULL_HANDLE;
        return tovl_error(r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY
                              ? TOVL_ERR_OUT_OF_MEMORY
                              : TOVL_ERR_DEVICE,
                          "vulkan: allocating %llu bytes of %s memory: %s", (unsigned long long)bytes,
                          host_visible ? "staging" : "device", tovl_vk_result_str(r));
    }
    return TOVL_OK;
}

void tovl_vk_barrier(const vk_ctx *ctx, VkCommandBuffer cmd, VkPipelineStageFlags src_stage, VkAccessFlags src_access,
                     VkPipelineStageFlags dst_stage, VkAccessFlags dst_access) {
    VkMemoryBarrier barrier = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = src_access,
        .dstAccessMask = dst_access,
    };
    ctx->vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, &barrier, 0, NULL, 0, NULL);
}

tovl_status tovl_vk_new_command_buffer(vk_ctx *ctx, VkCommandBuffer *out) {
    VkCommandBufferAllocateInfo info = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
        .commandPool = ctx->pool,
        .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
        .commandBufferCount = 1,
    };
    VkResult r = ctx->vk.vkAllocateCommandBuffers(ctx->device, &info, out);
    if (r != VK_SUCCESS) {
        *out = VK_NULL_HANDLE;
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkAllocateCommandBuffers: %s", tovl_vk_result_str(r));
    }
    return TOVL_OK;
}

tovl_status tovl_vk_memory_init(vk_ctx *ctx) {
    vkGetPhysicalDeviceMemoryProperties(ctx->physical, &ctx->memory_props);
    VkCommandPoolCreateInfo pool = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
        .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
        .queueFamilyIndex = ctx->queue_family,
    };
    VkResult r = ctx->vk.vkCreateCommandPool(ctx->device, &pool, NULL, &ctx->pool);
    if (r != VK_SUCCESS) {
        ctx->pool = VK_NULL_HANDLE;
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkCreateCommandPool: %s", tovl_vk_result_str(r));
    }
    tovl_status cb = tovl_vk_new_command_buffer(ctx, &ctx->cmd);
    if (cb != TOVL_OK) {
        return cb;
    }
    VkFenceCreateInfo fence = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    r = ctx->vk.vkCreateFence(ctx->device, &fence, NULL, &ctx->fence);
    if (r != VK_SUCCESS) {
        ctx->fence = VK_NULL_HANDLE;
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkCreateFence: %s", tovl_vk_result_str(r));
    }
    tovl_status st = tovl_vk_create_buffer(ctx, VK_STAGING_BYTES,
                                      VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, true,
                                      &ctx->staging, &ctx->staging_memory);
    if (st != TOVL_OK) {
        return st;
    }
    r = ctx->vk.vkMapMemory(ctx->device, ctx->staging_memory, 0, VK_WHOLE_SIZE, 0, &ctx->staging_map);
    if (r != VK_SUCCESS) {
        ctx->staging_map = NULL;
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkMapMemory of the staging buffer: %s", tovl_vk_result_str(r));
    }
    ctx->staging_size = VK_STAGING_BYTES;
    return TOVL_OK;
}

void tovl_vk_memory_release(vk_ctx *ctx) {
    if (!ctx->device) {
        return;
    }
    for (size_t i = 0; i < ctx->alloc_count; i++) {
        ctx->vk.vkDestroyBuffer(ctx->device, ctx->allocs[i].buffer, NULL);
        ctx->vk.vkFreeMemory(ctx->device, ctx->allocs[i].memory, NULL);
    }
    free(ctx->allocs);
    ctx->allocs = NULL;
    ctx->alloc_count = ctx->alloc_capacity = 0;
    if (ctx->staging_map) {
        ctx->vk.vkUnmapMemory(ctx->device, ctx->staging_memory);
    }
    if (ctx->staging) {
        ctx->vk.vkDestroyBuffer(ctx->device, ctx->staging, NULL);
    }
    if (ctx->staging_memory) {
        ctx->vk.vkFreeMemory(ctx->device, ctx->staging_memory, NULL);
    }
    if (ctx->fence) {
        ctx->vk.vkDestroyFence(ctx->device, ctx->fence, NULL);
    }
    if (ctx->pool) {
        ctx->vk.vkDestroyCommandPool(ctx->device, ctx->pool, NULL); /* frees ctx->cmd */
    }
}

tovl_status tovl_vk_begin_own(vk_ctx *ctx) {
    VkCommandBufferBeginInfo begin = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
        .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT,
    };
    VkResult r = ctx->vk.vkBeginCommandBuffer(ctx->cmd, &begin);
    if (r != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkBeginCommandBuffer: %s", tovl_vk_result_str(r));
    }
    return TOVL_OK;
}

tovl_status tovl_vk_submit_own(vk_ctx *ctx, const char *what) {
    VkResult r = ctx->vk.vkEndCommandBuffer(ctx->cmd);
    if (r != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: %s: vkEndCommandBuffer: %s", what, tovl_vk_result_str(r));
    }
    VkSubmitInfo submit = {
        .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
        .commandBufferCount = 1,
        .pCommandBuffers = &ctx->cmd,
    };
    r = ctx->vk.vkQueueSubmit(ctx->queue, 1, &submit, ctx->fence);
    if (r != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: %s: vkQueueSubmit: %s", what, tovl_vk_result_str(r));
    }
    r = ctx->vk.vkWaitForFences(ctx->device, 1, &ctx->fence, VK_TRUE, VK_FENCE_TIMEOUT_NS);
    VkResult reset = ctx->vk.vkResetFences(ctx->device, 1, &ctx->fence);
    if (r != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: %s: vkWaitForFences: %s", what, tovl_vk_result_str(r));
    }
    if (reset != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: %s: vkResetFences: %s", what, tovl_vk_result_str(reset));
    }
    return TOVL_OK;
}

/* Index of the first allocation whose address is > ptr. */
static size_t upper_bound(const vk_ctx *ctx, VkDeviceAddress ptr) {
    size_t lo = 0, hi = ctx->alloc_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ctx->allocs[mid].address <= ptr) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* The allocation holding [ptr, ptr + bytes), or NULL. */
static const vk_allocation *find_range(const vk_ctx *ctx, VkDeviceAddress ptr, size_t bytes) {
    size_t i = upper_bound(ctx, ptr);
    if (i == 0) {
        return NULL;
    }
    const vk_allocation *a = &ctx->allocs[i - 1];
    if (ptr - a->address > a->size || bytes > a->size - (ptr - a->address)) {
        return NULL;
    }
    return a;
}

tovl_status tovl_vk_alloc(void *vctx, size_t bytes, tovl_devptr *out) {
    vk_ctx *ctx = vctx;
    if (ctx->alloc_count == ctx->alloc_capacity) {
        size_t cap = ctx->alloc_capacity ? ctx->alloc_capacity * 2 : 64;
        vk_allocation *grown = realloc(ctx->allocs, cap * sizeof *grown);
        if (!grown) {
            return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "vulkan: out of host memory tracking allocations");
        }
        ctx->allocs = grown;
        ctx->alloc_capacity = cap;
    }
    /* Rounded to 16 bytes so fill_u32 and 16-byte loads stay inside the buffer. */
    VkDeviceSize size = ((VkDeviceSize)bytes + 15u) & ~(VkDeviceSize)15u;
    vk_allocation a = {.size = size};
    tovl_status st = tovl_vk_create_buffer(ctx, size, device_buffer_usage, false, &a.buffer, &a.memory);
    if (st != TOVL_OK) {
        return st;
    }
    VkBufferDeviceAddressInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, .buffer = a.buffer};
    a.address = ctx->vk.vkGetBufferDeviceAddress(ctx->device, &info);
    if (a.address == 0) {
        ctx->vk.vkDestroyBuffer(ctx->device, a.buffer, NULL);
        ctx->vk.vkFreeMemory(ctx->device, a.memory, NULL);
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkGetBufferDeviceAddress returned 0");
    }
    size_t at = upper_bound(ctx, a.address);
    memmove(&ctx->allocs[at + 1], &ctx->allocs[at], (ctx->alloc_count - at) * sizeof a);
    ctx->allocs[at] = a;
    ctx->alloc_count++;
    *out = a.address;
    return TOVL_OK;
}

void tovl_vk_free(void *vctx, tovl_devptr ptr) {
    vk_ctx *ctx = vctx;
    size_t i = upper_bound(ctx, ptr);
    if (i == 0 || ctx->allocs[i - 1].address != ptr) {
        return; /* not an allocation of this backend: nothing to free */
    }
    vk_allocation a = ctx->allocs[i - 1];
    memmove(&ctx->allocs[i - 1], &ctx->allocs[i], (ctx->alloc_count - i) * sizeof a);
    ctx->alloc_count--;
    ctx->vk.vkDestroyBuffer(ctx->device, a.buffer, NULL);
    ctx->vk.vkFreeMemory(ctx->device, a.memory, NULL);
}

/* Transfer writes visible to everything that follows on the device. */
static void transfer_to_all_barrier_in(vk_ctx *ctx, VkCommandBuffer cmd) {
    tovl_vk_barrier(ctx, cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                    VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
}

/* Earlier device work (kernels, copies) done, and its writes visible, before
 * a transfer: the execution dependency also keeps a transfer from writing
 * what an earlier kernel still reads. */
static void all_to_transfer_barrier_in(vk_ctx *ctx, VkCommandBuffer cmd) {
    tovl_vk_barrier(ctx, cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT,
                    VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
}

static void transfer_to_all_barrier(vk_ctx *ctx) {
    transfer_to_all_barrier_in(ctx, ctx->cmd);
}

static void all_to_transfer_barrier(vk_ctx *ctx) {
    all_to_transfer_barrier_in(ctx, ctx->cmd);
}

static tovl_status unknown_range(const char *op, tovl_devptr ptr, size_t bytes) {
    return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                      "vulkan: %s: [0x%llx, +%zu bytes) is not inside one allocation of this backend", op,
                      (unsigned long long)ptr, bytes);
}

tovl_status tovl_vk_upload(void *vctx, tovl_devptr dst, const void *src, size_t bytes) {
    vk_ctx *ctx = vctx;
    const vk_allocation *a = find_range(ctx, dst, bytes);
    if (!a) {
        return unknown_range("upload", dst, bytes);
    }
    const unsigned char *from = src;
    for (size_t done = 0; done < bytes;) {
        size_t chunk = bytes - done < ctx->staging_size ? bytes - done : (size_t)ctx->staging_size;
        memcpy(ctx->staging_map, from + done, chunk);
        tovl_status st = tovl_vk_begin_own(ctx);
        if (st != TOVL_OK) {
            return st;
        }
        all_to_transfer_barrier(ctx);
        VkBufferCopy region = {.srcOffset = 0, .dstOffset = dst - a->address + done, .size = chunk};
        ctx->vk.vkCmdCopyBuffer(ctx->cmd, ctx->staging, a->buffer, 1, &region);
        transfer_to_all_barrier(ctx);
        st = tovl_vk_submit_own(ctx, "upload");
        if (st != TOVL_OK) {
            return st;
        }
        done += chunk;
    }
    return TOVL_OK;
}

tovl_status tovl_vk_download(void *vctx, void *dst, tovl_devptr src, size_t bytes) {
    vk_ctx *ctx = vctx;
    const vk_allocation *a = find_range(ctx, src, bytes);
    if (!a) {
        return unknown_range("download", src, bytes);
    }
    unsigned char *to = dst;
    for (size_t done = 0; done < bytes;) {
        size_t chunk = bytes - done < ctx->staging_size ? bytes - done : (size_t)ctx->staging_size;
        tovl_status st = tovl_vk_begin_own(ctx);
        if (st != TOVL_OK) {
            return st;
        }
        all_to_transfer_barrier(ctx);
        VkBufferCopy region = {.srcOffset = src - a->address + done, .dstOffset = 0, .size = chunk};
        ctx->vk.vkCmdCopyBuffer(ctx->cmd, a->buffer, ctx->staging, 1, &region);
        tovl_vk_barrier(ctx, ctx->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                        VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
        st = tovl_vk_submit_own(ctx, "download");
        if (st != TOVL_OK) {
            return st;
        }
        memcpy(to + done, ctx->staging_map, chunk);
        done += chunk;
    }
    return TOVL_OK;
}

tovl_status tovl_vk_fill_u32(void *vctx, tovl_devptr dst, uint32_t pattern, size_t bytes) {
    vk_ctx *ctx = vctx;
    const vk_allocation *a = find_range(ctx, dst, bytes);
    if (!a) {
        return unknown_range("fill_u32", dst, bytes);
    }
    if ((dst - a->address) % 4 != 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "vulkan: fill_u32: 0x%llx is not 4-byte aligned",
                          (unsigned long long)dst);
    }
    tovl_status st = tovl_vk_begin_own(ctx);
    if (st != TOVL_OK) {
        return st;
    }
    all_to_transfer_barrier(ctx);
    ctx->vk.vkCmdFillBuffer(ctx->cmd, a->buffer, dst - a->address, bytes, pattern);
    transfer_to_all_barrier(ctx);
    return tovl_vk_submit_own(ctx, "fill_u32");
}

/* vkCmdUpdateBuffer takes a multiple of 4 bytes at a 4-byte offset: table
 * entries are 4 or 8 bytes, a shard set's ids 4 a cell. */
tovl_status tovl_vk_write_async(void *vctx, const tovl_device_write *writes, uint32_t count, void *stream) {
    vk_ctx *ctx = vctx;
    const vk_allocation *at[8];
    if (count > sizeof at / sizeof at[0]) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "vulkan: write_async of %u writes (at most %zu)", count,
                          sizeof at / sizeof at[0]);
    }
    for (uint32_t i = 0; i < count; i++) {
        at[i] = find_range(ctx, writes[i].dst, writes[i].bytes);
        if (!at[i]) {
            return unknown_range("write_async", writes[i].dst, writes[i].bytes);
        }
        if (writes[i].bytes % 4 || (writes[i].dst - at[i]->address) % 4) {
            return tovl_error(TOVL_ERR_INVALID_ARGUMENT,
                              "vulkan: write_async of %zu bytes at 0x%llx: vkCmdUpdateBuffer needs a multiple of "
                              "4 at a 4-byte offset",
                              writes[i].bytes, (unsigned long long)writes[i].dst);
        }
    }
    VkCommandBuffer cmd = stream ? (VkCommandBuffer)stream : ctx->cmd;
    if (!stream) {
        tovl_status st = tovl_vk_begin_own(ctx);
        if (st != TOVL_OK) {
            return st;
        }
    }
    all_to_transfer_barrier_in(ctx, cmd);
    /* vkCmdUpdateBuffer takes at most 65536 bytes: a longer write (a shard
     * set's ids) is several, in the same command buffer, so still one step. */
    for (uint32_t i = 0; i < count; i++) {
        for (size_t done = 0; done < writes[i].bytes; done += 65536) {
            const size_t part = writes[i].bytes - done < 65536 ? writes[i].bytes - done : 65536;
            ctx->vk.vkCmdUpdateBuffer(cmd, at[i]->buffer, writes[i].dst - at[i]->address + done, part,
                                      (const uint8_t *)writes[i].src + done);
        }
    }
    transfer_to_all_barrier_in(ctx, cmd);
    return stream ? TOVL_OK : tovl_vk_submit_own(ctx, "write_async");
}

tovl_status tovl_vk_fence_record(void *vctx, void *stream, tovl_fence *out) {
    vk_ctx *ctx = vctx;
    *out = 0;
    if (!stream) {
        return TOVL_OK;
    }
    VkEventCreateInfo info = {.sType = VK_STRUCTURE_TYPE_EVENT_CREATE_INFO};
    VkEvent event = VK_NULL_HANDLE;
    VkResult r = ctx->vk.vkCreateEvent(ctx->device, &info, NULL, &event);
    if (r != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkCreateEvent for a fence: %s", tovl_vk_result_str(r));
    }
    ctx->vk.vkCmdSetEvent((VkCommandBuffer)stream, event, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
    *out = (tovl_fence)(uintptr_t)event;
    return TOVL_OK;
}

tovl_status tovl_vk_fence_query(void *vctx, tovl_fence fence, bool *passed) {
    vk_ctx *ctx = vctx;
    VkResult r = ctx->vk.vkGetEventStatus(ctx->device, (VkEvent)(uintptr_t)fence);
    *passed = r == VK_EVENT_SET;
    if (r != VK_EVENT_SET && r != VK_EVENT_RESET) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkGetEventStatus of a fence: %s", tovl_vk_result_str(r));
    }
    return TOVL_OK;
}

void tovl_vk_fence_destroy(void *vctx, tovl_fence fence) {
    vk_ctx *ctx = vctx;
    ctx->vk.vkDestroyEvent(ctx->device, (VkEvent)(uintptr_t)fence, NULL);
}
