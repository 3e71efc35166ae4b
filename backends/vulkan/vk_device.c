/* Instance creation (optionally with the Khronos validation layer), device
 * choice, the feature requirements and device creation. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

const char *tovl_vk_result_str(VkResult result) {
    switch (result) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_INCOMPLETE: return "VK_INCOMPLETE";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER (no Vulkan driver found)";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_INVALID_SHADER_NV: return "VK_ERROR_INVALID_SHADER_NV";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    case VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS: return "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS";
    default: return "VkResult (unnamed)";
    }
}

/* Everything tovl needs of a device; *missing_feature names the first lack. */
tovl_status tovl_vk_check_physical_device(VkPhysicalDevice physical, const char **missing_feature) {
    VkPhysicalDeviceProperties props;
    vkGetPhysicalDeviceProperties(physical, &props);
    if (props.apiVersion < VK_API_VERSION_1_2) {
        *missing_feature = "Vulkan 1.2 (the device offers an older version)";
        return TOVL_ERR_BACKEND_UNAVAILABLE;
    }
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    vkGetPhysicalDeviceFeatures2(physical, &f);
    const VkPhysicalDeviceLimits *lim = &props.limits;
    if (!f12.bufferDeviceAddress) {
        *missing_feature = "bufferDeviceAddress";
    } else if (!f11.storageBuffer16BitAccess) {
        *missing_feature = "storageBuffer16BitAccess";
    } else if (!f.features.shaderInt16) {
        *missing_feature = "shaderInt16";
    } else if (!f.features.shaderInt64) {
        *missing_feature = "shaderInt64";
    } else if (lim->maxComputeWorkGroupInvocations < VK_WORKGROUP_SIZE ||
               lim->maxComputeWorkGroupSize[0] < VK_WORKGROUP_SIZE) {
        *missing_feature = "256 invocations per workgroup";
    } else {
        uint32_t n = 0;
        vkGetPhysicalDeviceQueueFamilyProperties(physical, &n, NULL);
        VkQueueFamilyProperties fam[32];
        n = n > 32 ? 32 : n;
        vkGetPhysicalDeviceQueueFamilyProperties(physical, &n, fam);
        for (uint32_t i = 0; i < n; i++) {
            if (fam[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
                *missing_feature = NULL;
                return TOVL_OK;
            }
        }
        *missing_feature = "a compute queue";
    }
    return TOVL_ERR_BACKEND_UNAVAILABLE;
}

/* A compute family, preferring one whose queues write timestamps. */
static uint32_t pick_queue_family(VkPhysicalDevice physical) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &n, NULL);
    VkQueueFamilyProperties fam[32];
    n = n > 32 ? 32 : n;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &n, fam);
    uint32_t any = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        if (!(fam[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) {
            continue;
        }
        if (fam[i].timestampValidBits > 0) {
            return i;
        }
        if (any == UINT32_MAX) {
            any = i;
        }
    }
    return any;
}

static VKAPI_ATTR VkBool32 VKAPI_CALL on_validation_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                            VkDebugUtilsMessageTypeFlagsEXT types,
                                                            const VkDebugUtilsMessengerCallbackDataEXT *data,
                                                            void *user) {
    (void)types;
    vk_ctx *ctx = user;
    if (severity & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)) {
        atomic_fetch_add(&ctx->validation_messages, 1u);
        /* Validation was asked for explicitly; its findings go to stderr. */
        fprintf(stderr, "tovl vulkan validation: %s\n", data && data->pMessage ? data->pMessage : "(no text)");
    }
    return VK_FALSE;
}

static bool env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static bool layer_present(const char *layer) {
    uint32_t n = 0;
    if (vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0) {
        return false;
    }
    VkLayerProperties *props = calloc(n, sizeof *props);
    if (!props) {
        return false;
    }
    bool found = false;
    if (vkEnumerateInstanceLayerProperties(&n, props) == VK_SUCCESS) {
        for (uint32_t i = 0; i < n && !found; i++) {
            found = strcmp(props[i].layerName, layer) == 0;
        }
    }
    free(props);
    return found;
}

static bool instance_extension_present(const char *layer, const char *ext) {
    uint32_t n = 0;
    if (vkEnumerateInstanceExtensionProperties(layer, &n, NULL) != VK_SUCCESS || n == 0) {
        return false;
    }
    VkExtensionProperties *props = calloc(n, sizeof *props);
    if (!props) {
        return false;
    }
    bool found = false;
    if (vkEnumerateInstanceExtensionProperties(layer, &n, props) == VK_SUCCESS) {
        for (uint32_t i = 0; i < n && !found; i++) {
            found = strcmp(props[i].extensionName, ext) == 0;
        }
    }
    free(props);
    return found;
}

static tovl_status create_instance(vk_ctx *ctx) {
    uint32_t loader_version = volkGetInstanceVersion();
    if (loader_version < VK_API_VERSION_1_2) {
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: the Vulkan loader offers %u.%u, tovl needs 1.2",
                          VK_API_VERSION_MAJOR(loader_version), VK_API_VERSION_MINOR(loader_version));
    }
    static const char *const validation_layer = "VK_LAYER_KHRONOS_validation";
    const char *layers[1];
    const char *extensions[2];
    uint32_t n_layers = 0, n_ext = 0;
    VkDebugUtilsMessengerCreateInfoEXT messenger_info = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = on_validation_message,
        .pUserData = ctx,
    };
    /* Synchronization validation checks our barriers too. */
    static const VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    VkValidationFeaturesEXT features = {
        .sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
        .pNext = &messenger_info,
        .enabledValidationFeatureCount = 1,
        .pEnabledValidationFeatures = enables,
    };
    const void *chain = NULL;
    ctx->validation = env_flag("TOVL_VULKAN_VALIDATION");
    if (ctx->validation) {
        if (!layer_present(validation_layer)) {
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE,
                              "vulkan: TOVL_VULKAN_VALIDATION is set but %s is not installed", validation_layer);
        }
        if (!instance_extension_present(NULL, VK_EXT_DEBUG_UTILS_EXTENSION_NAME) &&
            !instance_extension_present(validation_layer, VK_EXT_DEBUG_UTILS_EXTENSION_NAME)) {
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE,
                              "vulkan: TOVL_VULKAN_VALIDATION is set but %s is missing",
                              VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
        }
        layers[n_layers++] = validation_layer;
        extensions[n_ext++] = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
        chain = &messenger_info;
        if (instance_extension_present(validation_layer, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME)) {
            extensions[n_ext++] = VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME;
            chain = &features;
        }
    }
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "tovl",
        .pEngineName = "tovl",
        .apiVersion = VK_API_VERSION_1_2,
    };
    VkInstanceCreateInfo info = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        .pNext = chain,
        .pApplicationInfo = &app,
        .enabledLayerCount = n_layers,
        .ppEnabledLayerNames = layers,
        .enabledExtensionCount = n_ext,
        .ppEnabledExtensionNames = extensions,
    };
    VkResult r = vkCreateInstance(&info, NULL, &ctx->instance);
    if (r != VK_SUCCESS) {
        ctx->instance = VK_NULL_HANDLE;
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: vkCreateInstance: %s", tovl_vk_result_str(r));
    }
    ctx->owns_instance = true;
    volkLoadInstanceOnly(ctx->instance);
    if (ctx->validation) {
        PFN_vkCreateDebugUtilsMessengerEXT create_messenger =
            (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(ctx->instance, "vkCreateDebugUtilsMessengerEXT");
        ctx->destroy_messenger = (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
            ctx->instance, "vkDestroyDebugUtilsMessengerEXT");
        if (!create_messenger || !ctx->destroy_messenger) {
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: vkCreateDebugUtilsMessengerEXT not found");
        }
        r = create_messenger(ctx->instance, &messenger_info, NULL, &ctx->messenger);
        if (r != VK_SUCCESS) {
            ctx->messenger = VK_NULL_HANDLE;
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: vkCreateDebugUtilsMessengerEXT: %s",
                              tovl_vk_result_str(r));
        }
    }
    return TOVL_OK;
}

static bool name_contains(const char *name, const char *needle) {
    size_t n = strlen(name), m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++) {
        size_t j = 0;
        while (j < m && tolower((unsigned char)name[i + j]) == tolower((unsigned char)needle[j])) {
            j++;
        }
        if (j == m) {
            return true;
        }
    }
    return false;
}

static bool all_digits(const char *s) {
    if (!*s) {
        return false;
    }
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s)) {
            return false;
        }
    }
    return true;
}

/* TOVL_VULKAN_DEVICE by index or name substring; else the first usable
 * discrete GPU; else the first usable device of any type. */
static tovl_status choose_device(vk_ctx *ctx) {
    uint32_t n = 0;
    VkResult r = vkEnumeratePhysicalDevices(ctx->instance, &n, NULL);
    if (r != VK_SUCCESS || n == 0) {
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: no Vulkan device (%s)",
                          r != VK_SUCCESS ? tovl_vk_result_str(r) : "the loader found none");
    }
    VkPhysicalDevice devices[16];
    n = n > 16 ? 16 : n;
    r = vkEnumeratePhysicalDevices(ctx->instance, &n, devices);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: vkEnumeratePhysicalDevices: %s", tovl_vk_result_str(r));
    }
    VkPhysicalDeviceProperties props[16];
    for (uint32_t i = 0; i < n; i++) {
        vkGetPhysicalDeviceProperties(devices[i], &props[i]);
    }
    const char *want = getenv("TOVL_VULKAN_DEVICE");
    const char *missing = NULL;
    if (want && *want) {
        uint32_t pick = UINT32_MAX;
        if (all_digits(want)) {
            unsigned long idx = strtoul(want, NULL, 10);
            if (idx >= n) {
                return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE,
                                  "vulkan: TOVL_VULKAN_DEVICE=%s but there are %u Vulkan devices (0: %s)", want, n,
                                  props[0].deviceName);
            }
            pick = (uint32_t)idx;
        } else {
            for (uint32_t i = 0; i < n && pick == UINT32_MAX; i++) {
                if (name_contains(props[i].deviceName, want)) {
                    pick = i;
                }
            }
            if (pick == UINT32_MAX) {
                return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE,
                                  "vulkan: TOVL_VULKAN_DEVICE=%s matches none of the %u devices (0: %s)", want, n,
                                  props[0].deviceName);
            }
        }
        if (tovl_vk_check_physical_device(devices[pick], &missing) != TOVL_OK) {
            return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: device %u (%s) lacks %s", pick,
                              props[pick].deviceName, missing);
        }
        ctx->physical = devices[pick];
        return TOVL_OK;
    }
    const char *first_missing = NULL;
    uint32_t first_missing_dev = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < n; i++) {
            if (pass == 0 && props[i].deviceType != VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU) {
                continue;
            }
            if (tovl_vk_check_physical_device(devices[i], &missing) == TOVL_OK) {
                ctx->physical = devices[i];
                return TOVL_OK;
            }
            if (!first_missing) {
                first_missing = missing;
                first_missing_dev = i;
            }
        }
    }
    return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: no usable device: %s lacks %s",
                      props[first_missing_dev].deviceName, first_missing);
}

static tovl_status create_device(vk_ctx *ctx) {
    ctx->queue_family = pick_queue_family(ctx->physical);
    float priority = 1.0f;
    VkDeviceQueueCreateInfo queue = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = ctx->queue_family,
        .queueCount = 1,
        .pQueuePriorities = &priority,
    };
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
        .bufferDeviceAddress = VK_TRUE,
    };
    VkPhysicalDeviceVulkan11Features f11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
        .pNext = &f12,
        .storageBuffer16BitAccess = VK_TRUE,
    };
    VkPhysicalDeviceFeatures2 f = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
        .pNext = &f11,
        .features = {.shaderInt16 = VK_TRUE, .shaderInt64 = VK_TRUE},
    };
    VkDeviceCreateInfo info = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .pNext = &f,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &queue,
    };
    VkResult r = vkCreateDevice(ctx->physical, &info, NULL, &ctx->device);
    if (r != VK_SUCCESS) {
        ctx->device = VK_NULL_HANDLE;
        return tovl_error(TOVL_ERR_BACKEND_UNAVAILABLE, "vulkan: vkCreateDevice: %s", tovl_vk_result_str(r));
    }
    ctx->owns_device = true;
    volkLoadDeviceTable(&ctx->vk, ctx->device);
    return TOVL_OK;
}

tovl_status tovl_vk_open_own(vk_ctx *ctx) {
    tovl_status st = create_instance(ctx);
    if (st == TOVL_OK) {
        st = choose_device(ctx);
    }
    if (st == TOVL_OK) {
        st = create_device(ctx);
    }
    return st;
}

static const char *device_type_name(VkPhysicalDeviceType type) {
    switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
    }
}

/* Device facts for device(), property() and the kernels. */
void tovl_vk_describe_device(vk_ctx *ctx) {
    VkPhysicalDeviceVulkan12Properties p12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES};
    VkPhysicalDeviceVulkan11Properties p11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES,
                                              .pNext = &p12};
    VkPhysicalDeviceProperties2 p = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &p11};
    vkGetPhysicalDeviceProperties2(ctx->physical, &p);
    const VkPhysicalDeviceProperties *props = &p.properties;

    ctx->float_controls.denorm_preserve = p12.shaderDenormPreserveFloat32;
    ctx->float_controls.signed_zero_inf_nan_preserve = p12.shaderSignedZeroInfNanPreserveFloat32;
    ctx->float_controls.rounding_rte = p12.shaderRoundingModeRTEFloat32;
    for (int i = 0; i < 3; i++) {
        ctx->max_groups[i] = props->limits.maxComputeWorkGroupCount[i];
    }
    ctx->timestamp_period_ns = props->limits.timestampPeriod;

    uint32_t nfam = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(ctx->physical, &nfam, NULL);
    VkQueueFamilyProperties fam[32];
    nfam = nfam > 32 ? 32 : nfam;
    vkGetPhysicalDeviceQueueFamilyProperties(ctx->physical, &nfam, fam);
    ctx->timestamp_valid_bits = ctx->queue_family < nfam ? fam[ctx->queue_family].timestampValidBits : 0;

    snprintf(ctx->driver_text, sizeof ctx->driver_text, "%.64s %.120s", p12.driverName, p12.driverInfo);
    snprintf(ctx->subgroup_text, sizeof ctx->subgroup_text, "%u", p11.subgroupSize);
    snprintf(ctx->api_text, sizeof ctx->api_text, "%u.%u.%u", VK_API_VERSION_MAJOR(props->apiVersion),
             VK_API_VERSION_MINOR(props->apiVersion), VK_API_VERSION_PATCH(props->apiVersion));
    /* DenormPreserve is requested whenever the device offers it; otherwise
     * finish_open measures the driver's default (tovl_vk_probe_denormals). */
    snprintf(ctx->denormals_text, sizeof ctx->denormals_text, "%s",
             p12.shaderDenormPreserveFloat32 ? "preserved" : "unknown (device lacks DenormPreserve for f32)");
    snprintf(ctx->float_controls_text, sizeof ctx->float_controls_text, "DenormPreserve=%s SignedZeroInfNanPreserve=%s RTE=%s",
             ctx->float_controls.denorm_preserve ? "on" : "unsupported",
             ctx->float_controls.signed_zero_inf_nan_preserve ? "on" : "unsupported",
             ctx->float_controls.rounding_rte ? "on" : "unsupported");
    snprintf(ctx->device_text, sizeof ctx->device_text, "%.96s (%s, Vulkan %s, %.100s, subgroup %u)", props->deviceName,
             device_type_name(props->deviceType), ctx->api_text, ctx->driver_text, p11.subgroupSize);
}
