/* Device timings for `tovl bench` (never for tests), with timestamp queries:
 * batched = `batch` launches recorded in one command buffer between two
 * timestamps, per launch; single = one launch between two timestamps; both
 * medians over `repeats` submissions after one warm-up. */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

typedef enum { RECORD_KERNEL, RECORD_COPY } record_kind;

typedef struct timed_work {
    record_kind kind;
    /* RECORD_KERNEL */
    tovl_kernel kernel;
    const uint32_t *grid;
    const void *args;
    size_t args_size;
    uint32_t count;
    /* RECORD_COPY */
    VkBuffer src, dst;
    VkDeviceSize bytes;
} timed_work;

/* Record: reset queries, timestamp, the work, timestamp. */
static tovl_status record(vk_ctx *ctx, VkCommandBuffer cmd, VkQueryPool pool, const timed_work *w) {
    VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    VkResult r = ctx->vk.vkBeginCommandBuffer(cmd, &begin);
    if (r != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: timing: vkBeginCommandBuffer: %s", tovl_vk_result_str(r));
    }
    ctx->vk.vkCmdResetQueryPool(cmd, pool, 0, 2);
    /* The previous submission of this same buffer wrote what this one touches. */
    tovl_vk_barrier(ctx, cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT,
                    VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
    ctx->vk.vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 0);
    tovl_status st = TOVL_OK;
    if (w->kind == RECORD_KERNEL && w->kernel > VK_KERNEL_FIRST_FLOOR && w->kernel <= VK_KERNEL_COUNT) {
        st = tovl_vk_record_floor(ctx, cmd, w->kernel, w->count, w->args, w->args_size);
    } else if (w->kind == RECORD_KERNEL) {
        for (uint32_t i = 0; i < w->count && st == TOVL_OK; i++) {
            st = tovl_vk_record_launch(ctx, cmd, w->kernel, w->grid, w->args, w->args_size);
        }
    } else {
        VkBufferCopy region = {.size = w->bytes};
        ctx->vk.vkCmdCopyBuffer(cmd, w->src, w->dst, 1, &region);
    }
    ctx->vk.vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, pool, 1);
    r = ctx->vk.vkEndCommandBuffer(cmd);
    if (st == TOVL_OK && r != VK_SUCCESS) {
        st = tovl_error(TOVL_ERR_DEVICE, "vulkan: timing: vkEndCommandBuffer: %s", tovl_vk_result_str(r));
    }
    return st;
}

/* Submit the recorded buffer `repeats` times (after one warm-up) and return
 * each run's device nanoseconds in ns[]. */
static tovl_status run_timed(vk_ctx *ctx, const timed_work *w, uint32_t repeats, double *ns) {
    if (ctx->timestamp_valid_bits == 0) {
        return tovl_error(TOVL_ERR_UNSUPPORTED, "vulkan: the queue writes no timestamps");
    }
    VkQueryPoolCreateInfo qinfo = {
        .sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
        .queryType = VK_QUERY_TYPE_TIMESTAMP,
        .queryCount = 2,
    };
    VkQueryPool pool;
    VkResult r = ctx->vk.vkCreateQueryPool(ctx->device, &qinfo, NULL, &pool);
    if (r != VK_SUCCESS) {
        return tovl_error(TOVL_ERR_DEVICE, "vulkan: vkCreateQueryPool: %s", tovl_vk_result_str(r));
    }
    VkCommandBuffer cmd;
    tovl_status st = tovl_vk_new_command_buffer(ctx, &cmd);
    if (st != TOVL_OK) {
        ctx->vk.vkDestroyQueryPool(ctx->device, pool, NULL);
        return st;
    }
    st = record(ctx, cmd, pool, w);
    uint64_t mask = ctx->timestamp_valid_bits >= 64 ? UINT64_MAX : ((1ull << ctx->timestamp_valid_bits) - 1);
    for (uint32_t i = 0; st == TOVL_OK && i <= repeats; i++) {
        VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cmd};
        r = ctx->vk.vkQueueSubmit(ctx->queue, 1, &submit, ctx->fence);
        if (r != VK_SUCCESS) {
            st = tovl_error(TOVL_ERR_DEVICE, "vulkan: timing: vkQueueSubmit: %s", tovl_vk_result_str(r));
            break;
        }
        r = ctx->vk.vkWaitForFences(ctx->device, 1, &ctx->fence, VK_TRUE, UINT64_MAX);
        ctx->vk.vkResetFences(ctx->device, 1, &ctx->fence);
        if (r != VK_SUCCESS) {
            st = tovl_error(TOVL_ERR_DEVICE, "vulkan: timing: vkWaitForFences: %s", tovl_vk_result_str(r));
            break;
        }
        uint64_t stamps[2];
        r = ctx->vk.vkGetQueryPoolResults(ctx->device, pool, 0, 2, sizeof stamps, stamps, sizeof stamps[0],
                                          VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
        if (r != VK_SUCCESS) {
            st = tovl_error(TOVL_ERR_DEVICE, "vulkan: vkGetQueryPoolResults: %s", tovl_vk_result_str(r));
            break;
        }
        if (i > 0) { /* run 0 warms up */
            uint64_t ticks = ((stamps[1] & mask) - (stamps[0] & mask)) & mask;
            ns[i - 1] = (double)ticks * ctx->timestamp_period_ns;
        }
    }
    ctx->vk.vkFreeCommandBuffers(ctx->device, ctx->pool, 1, &cmd);
    ctx->vk.vkDestroyQueryPool(ctx->device, pool, NULL);
    return st;
}

tovl_status tovl_vk_time_kernel(void *vctx, tovl_kernel kernel, const uint32_t grid[3], const void *args,
                           size_t args_size, uint32_t batch, uint32_t repeats, tovl_kernel_timing *out) {
    vk_ctx *ctx = vctx;
    if (!out || batch == 0 || repeats == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "vulkan: time_kernel: out NULL, or batch/repeats 0");
    }
    double *ns = calloc(repeats, sizeof *ns);
    if (!ns) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "vulkan: time_kernel: out of host memory");
    }
    timed_work w = {.kind = RECORD_KERNEL, .kernel = kernel, .grid = grid, .args = args, .args_size = args_size,
                    .count = batch};
    tovl_status st = run_timed(ctx, &w, repeats, ns);
    if (st == TOVL_OK) {
        out->batched_us = tovl_median(ns, repeats) / 1000.0 / batch;
        w.count = 1;
        st = run_timed(ctx, &w, repeats, ns);
    }
    if (st == TOVL_OK) {
        out->single_us = tovl_median(ns, repeats) / 1000.0;
        out->repeats = repeats;
    }
    free(ns);
    return st;
}

tovl_status tovl_vk_copy_bandwidth(void *vctx, size_t bytes, uint32_t repeats, double *gbps) {
    vk_ctx *ctx = vctx;
    if (!gbps || bytes == 0 || repeats == 0) {
        return tovl_error(TOVL_ERR_INVALID_ARGUMENT, "vulkan: copy_bandwidth: gbps NULL, or bytes/repeats 0");
    }
    const VkBufferUsageFlags usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    VkBuffer src = VK_NULL_HANDLE, dst = VK_NULL_HANDLE;
    VkDeviceMemory src_mem = VK_NULL_HANDLE, dst_mem = VK_NULL_HANDLE;
    double *ns = calloc(repeats, sizeof *ns);
    tovl_status st = ns ? TOVL_OK : tovl_error(TOVL_ERR_OUT_OF_MEMORY, "vulkan: copy_bandwidth: out of host memory");
    if (st == TOVL_OK) {
        st = tovl_vk_create_buffer(ctx, bytes, usage, false, &src, &src_mem);
    }
    if (st == TOVL_OK) {
        st = tovl_vk_create_buffer(ctx, bytes, usage, false, &dst, &dst_mem);
    }
    if (st == TOVL_OK) {
        timed_work w = {.kind = RECORD_COPY, .src = src, .dst = dst, .bytes = bytes};
        st = run_timed(ctx, &w, repeats, ns);
    }
    if (st == TOVL_OK) {
        double seconds = tovl_median(ns, repeats) * 1e-9;
        *gbps = seconds > 0 ? 2.0 * (double)bytes / seconds / 1e9 : 0.0;
    }
    if (dst) {
        ctx->vk.vkDestroyBuffer(ctx->device, dst, NULL);
        ctx->vk.vkFreeMemory(ctx->device, dst_mem, NULL);
    }
    if (src) {
        ctx->vk.vkDestroyBuffer(ctx->device, src, NULL);
        ctx->vk.vkFreeMemory(ctx->device, src_mem, NULL);
    }
    free(ns);
    return st;
}
