/*
 * tovl on an engine's own Vulkan device (optional header).
 *
 * tovl_backend_open("vulkan") creates its own instance and device. An engine
 * that records its forward pass into its own command buffers instead wraps its
 * existing objects, so the hooks record into those command buffers:
 *
 *   tovl_vulkan_device_desc d = {instance, physical_device, device, family, 0, NULL};
 *   tovl_backend *be;  tovl_vulkan_backend_wrap(&d, &be);
 *   ... tovl_embed_hook(set, &k, &args, (void *)command_buffer);
 *
 * The handles are passed as void * / uint64 so this header needs no Vulkan
 * headers. The stream argument of the hooks is a VkCommandBuffer in the
 * recording state (NULL: tovl records into its own command buffer, submits on
 * the wrapped queue and waits). Each hook records a global memory barrier
 * before its dispatch (compute-shader and transfer writes before -> the
 * kernel) and one after it (the kernel's writes -> later compute shaders and
 * transfers), binds its own compute pipeline and sets push constants: rebind
 * your own compute pipeline and push constants after a hook. A later read by
 * another stage (host, graphics) needs your own barrier.
 *
 * Requirements on the wrapped device: Vulkan >= 1.2, created with the
 * features bufferDeviceAddress, storageBuffer16BitAccess, shaderInt16 and
 * shaderInt64 enabled; a queue family with compute. Device pointers of tovl
 * (tovl_devptr) are VkDeviceAddress values. tovl allocates its own buffers on
 * the device; the engine's buffers it reads or patches (hidden states, logits,
 * token ids, slots) are passed by their VkDeviceAddress and need
 * VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT. tovl uses the queue
 * (family, index) for its own synchronous work (uploads, NULL-stream
 * launches): do not use that queue from another thread at the same time.
 * The wrapped objects stay the caller's: tovl_backend_close never destroys
 * them, and they must outlive the backend.
 */
#ifndef TOVL_TOVL_VULKAN_H
#define TOVL_TOVL_VULKAN_H

#include "tovl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PFN_vkGetInstanceProcAddr without the Vulkan types: pass
 * (tovl_vk_get_instance_proc_addr)vkGetInstanceProcAddr. */
typedef void (*tovl_vk_void_function)(void);
typedef tovl_vk_void_function (*tovl_vk_get_instance_proc_addr)(void *instance, const char *name);

typedef struct tovl_vulkan_device_desc {
    void *instance;        /* VkInstance */
    void *physical_device; /* VkPhysicalDevice */
    void *device;          /* VkDevice */
    uint32_t queue_family; /* a family with VK_QUEUE_COMPUTE_BIT */
    uint32_t queue_index;  /* the queue of that family tovl submits its own work to */
    /* The engine's vkGetInstanceProcAddr, or NULL: tovl loads libvulkan.so.1. */
    tovl_vk_get_instance_proc_addr get_instance_proc_addr;
} tovl_vulkan_device_desc;

/* Wrap the caller's Vulkan objects into a "vulkan" backend. Checks the
 * physical device's version and features (the error names a missing one);
 * creates tovl's pipelines, command pool and staging buffer on the device.
 * On failure *out is NULL, nothing is left behind, and tovl_last_error() says
 * why. */
TOVL_API tovl_status tovl_vulkan_backend_wrap(const tovl_vulkan_device_desc *desc, tovl_backend **out);

#ifdef __cplusplus
}
#endif
#endif /* TOVL_TOVL_VULKAN_H */
