/* The Vulkan backend's own tests: device choice and properties, memory by
 * address, the launch checks, the denormal probe, timing entry points, and the
 * hooks recorded into a caller's own VkCommandBuffer on a wrapped device,
 * checked bit for bit against the CPU reference with sentinels around every
 * output. Runs on lavapipe in CI; skips only where no Vulkan device exists and
 * neither CI nor TOVL_REQUIRE_VULKAN=1 says one must. */
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_kernels.h"
#include "slots_check.h"
#include "testutil.h"
#include "tovl/tovl_vulkan.h"

static bool vulkan_required(void) {
    const char *ci = getenv("CI");
    const char *req = getenv("TOVL_REQUIRE_VULKAN");
    return (ci && strcmp(ci, "true") == 0) || (req && strcmp(req, "1") == 0);
}

static tovl_backend *open_vulkan(void) {
    tovl_backend *be = NULL;
    tovl_status st = tovl_backend_open("vulkan", &be);
    if (st != TOVL_OK) {
        if (vulkan_required()) {
            cr_assert_fail("a Vulkan device is required here (CI or TOVL_REQUIRE_VULKAN=1): %s", tovl_last_error());
        }
        cr_skip_test("no Vulkan device: %s", tovl_last_error());
    }
    cr_assert_not_null(be, "open succeeded without a backend");
    return be;
}

static bool is_lavapipe(tovl_backend *be) {
    const char *driver = tovl_backend_property(be, "driver");
    return driver && strstr(driver, "llvmpipe") != NULL;
}

/* ------------------------------------------------------------------------ */
Test(vulkan, open_reports_device_properties_and_kernels) {
    tovl_backend *be = open_vulkan();
    cr_expect_str_eq(tovl_backend_name(be), "vulkan");
    cr_expect_gt(strlen(tovl_backend_device(be)), 8u);
    const char *sg = tovl_backend_property(be, "subgroup_size");
    cr_assert_not_null(sg);
    cr_expect_gt(atoi(sg), 0, "subgroup_size '%s'", sg);
    const char *denorm = tovl_backend_property(be, "f32_denormals");
    cr_assert_not_null(denorm);
    cr_expect(strcmp(denorm, "preserved") == 0 || strncmp(denorm, "flushed", 7) == 0, "f32_denormals '%s'", denorm);
    cr_expect_not_null(tovl_backend_property(be, "driver"));
    cr_expect_not_null(tovl_backend_property(be, "float_controls"));
    cr_expect_null(tovl_backend_property(be, "no_such_key"));
    const char *names[] = {TOVL_KERNEL_ROWDIFF, TOVL_KERNEL_EMBED_OVERLAY, TOVL_KERNEL_LMHEAD_OVERLAY_BF16,
                           TOVL_KERNEL_LMHEAD_OVERLAY_F32};
    tovl_kernel seen[4];
    for (int i = 0; i < 4; i++) {
        seen[i] = tovl_try_kernel(be, names[i]);
        cr_expect_neq(seen[i], 0, "kernel %s missing", names[i]);
        for (int j = 0; j < i; j++) {
            cr_expect_neq(seen[i], seen[j], "kernels %s and %s share a handle", names[i], names[j]);
        }
    }
    cr_expect_eq(tovl_try_kernel(be, "lmhead_overlay_f16"), 0);
    cr_expect_eq(tovl_try_kernel(be, ""), 0);
    tovl_backend_close(be);
}

Test(vulkan, device_choice_by_env) {
    setenv("TOVL_VULKAN_DEVICE", "97", 1);
    tovl_backend *be = NULL;
    tovl_status st = tovl_backend_open("vulkan", &be);
    if (st == TOVL_ERR_BACKEND_UNAVAILABLE && strstr(tovl_last_error(), "TOVL_VULKAN_DEVICE") == NULL) {
        if (vulkan_required()) {
            cr_assert_fail("a Vulkan device is required here: %s", tovl_last_error());
        }
        cr_skip_test("no Vulkan device: %s", tovl_last_error());
    }
    cr_expect_eq(st, TOVL_ERR_BACKEND_UNAVAILABLE);
    cr_expect_null(be);
    cr_expect(strstr(tovl_last_error(), "TOVL_VULKAN_DEVICE=97") != NULL, "detail: %s", tovl_last_error());

    setenv("TOVL_VULKAN_DEVICE", "no-such-gpu-name", 1);
    cr_expect_eq(tovl_backend_open("vulkan", &be), TOVL_ERR_BACKEND_UNAVAILABLE);
    cr_expect(strstr(tovl_last_error(), "no-such-gpu-name") != NULL, "detail: %s", tovl_last_error());

    setenv("TOVL_VULKAN_DEVICE", "0", 1);
    cr_assert_eq(tovl_backend_open("vulkan", &be), TOVL_OK, "%s", tovl_last_error());
    char name[64];
    snprintf(name, sizeof name, "%.5s", tovl_backend_device(be)); /* a name prefix, another case */
    for (char *p = name; *p; p++) {
        *p = (char)((*p >= 'a' && *p <= 'z') ? *p - 32 : (*p >= 'A' && *p <= 'Z') ? *p + 32 : *p);
    }
    tovl_backend_close(be);
    setenv("TOVL_VULKAN_DEVICE", name, 1);
    cr_expect_eq(tovl_backend_open("vulkan", &be), TOVL_OK, "by name '%s': %s", name, tovl_last_error());
    tovl_backend_close(be);
}

Test(vulkan, lmhead_variant_by_env) {
    unsetenv("TOVL_VULKAN_LMHEAD");
    tovl_backend *be = open_vulkan();
    const char *v = tovl_backend_property(be, "lmhead_variant");
    cr_assert_not_null(v);
    cr_expect(strstr(v, "row below T = ") == v, "default lmhead_variant '%s'", v);
    const char *probes[] = {"dispatch_floor_bare", "dispatch_floor_bind", "dispatch_floor_contract",
                            "dispatch_floor_all_commands", "dispatch_floor_unsynced"};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        cr_expect_neq(tovl_try_kernel(be, probes[i]), 0, "floor probe %s missing", probes[i]);
    }
    tovl_backend_close(be);
    const char *forced[] = {"tile", "row"};
    for (int i = 0; i < 2; i++) {
        setenv("TOVL_VULKAN_LMHEAD", forced[i], 1);
        cr_assert_eq(tovl_backend_open("vulkan", &be), TOVL_OK, "%s", tovl_last_error());
        v = tovl_backend_property(be, "lmhead_variant");
        cr_expect(v && strncmp(v, forced[i], strlen(forced[i])) == 0, "lmhead_variant '%s' for %s", v, forced[i]);
        tovl_backend_close(be);
    }
    setenv("TOVL_VULKAN_LMHEAD", "tiles", 1);
    be = NULL;
    cr_expect_eq(tovl_backend_open("vulkan", &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_null(be);
    cr_expect(strstr(tovl_last_error(), "TOVL_VULKAN_LMHEAD='tiles'") != NULL, "detail: %s", tovl_last_error());
    unsetenv("TOVL_VULKAN_LMHEAD");
}

Test(vulkan, memory_by_address_roundtrips_fills_and_rejects_strangers) {
    tovl_backend *be = open_vulkan();
    tu_rng r = tu_rng_for("vulkan_memory");
    /* Larger than the 16 MiB staging buffer, so uploads and downloads go in chunks. */
    size_t big = (16u << 20) + 4u * (1 + tu_below(&r, 4000));
    size_t small = 4u * (1 + tu_below(&r, 300));
    tovl_devptr a = 0, b = 0, c = 0;
    cr_assert_eq(tovl_alloc(be, small, &a), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_alloc(be, big, &b), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_alloc(be, small, &c), TOVL_OK, "%s", tovl_last_error());
    cr_expect_eq(a % 16, 0, "addresses are 16-byte aligned");
    cr_expect_eq(b % 16, 0);
    uint32_t *host = malloc(big), *back = malloc(big);
    cr_assert(host && back);
    for (size_t i = 0; i < big / 4; i++) {
        host[i] = (uint32_t)tu_next(&r);
    }
    cr_assert_eq(tovl_upload(be, b, host, big), TOVL_OK, "%s", tovl_last_error());
    memset(back, 0, big);
    cr_assert_eq(tovl_download(be, back, b, big), TOVL_OK, "%s", tovl_last_error());
    cr_expect_eq(memcmp(host, back, big), 0, "big upload/download differs");

    /* An interior range: fill the middle, the rest stays. */
    size_t off = 4u * (1 + tu_below(&r, 1000)), len = 4u * (1 + tu_below(&r, 1000));
    uint32_t pattern = (uint32_t)tu_next(&r) | 1u;
    cr_assert_eq(tovl_fill_u32(be, b + off, pattern, len), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_download(be, back, b, off + len + 64), TOVL_OK);
    for (size_t i = 0; i < (off + len + 64) / 4; i++) {
        uint32_t want = (i >= off / 4 && i < (off + len) / 4) ? pattern : host[i];
        cr_assert_eq(back[i], want, "word %zu: 0x%08x, want 0x%08x", i, back[i], want);
    }
    /* An interior upload. */
    uint32_t word = (uint32_t)tu_next(&r);
    cr_assert_eq(tovl_upload(be, b + 12, &word, 4), TOVL_OK);
    uint32_t got = 0;
    cr_assert_eq(tovl_download(be, &got, b + 12, 4), TOVL_OK);
    cr_expect_eq(got, word);

    /* Ranges not inside one allocation are refused with the address named. */
    cr_expect_eq(tovl_upload(be, b + big - 4, host, 64), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(tovl_last_error(), "not inside one allocation") != NULL, "%s", tovl_last_error());
    tovl_free(be, c);
    cr_expect_eq(tovl_download(be, back, c, 4), TOVL_ERR_INVALID_ARGUMENT, "freed memory still answers");
    cr_expect_eq(tovl_fill_u32(be, b + 2, 0, 4), TOVL_ERR_INVALID_ARGUMENT, "unaligned fill accepted");
    tovl_free(be, 12345); /* a stranger: ignored */
    cr_assert_eq(tovl_upload(be, a, host, small), TOVL_OK, "a survives the others' frees");
    cr_assert_eq(tovl_download(be, back, a, small), TOVL_OK);
    cr_expect_eq(memcmp(host, back, small), 0);
    tovl_free(be, a);
    tovl_free(be, b);
    free(host);
    free(back);
    tovl_backend_close(be);
}

Test(vulkan, launch_checks_handle_and_argument_size) {
    tovl_backend *be = open_vulkan();
    const tovl_backend_iface *iface = tovl_backend_get_iface(be);
    void *ctx = tovl_backend_get_context(be);
    tovl_rowdiff_args args = {0};
    const uint32_t grid[3] = {0, 1, 1};
    cr_expect_eq(iface->launch(ctx, 0, grid, &args, sizeof args, NULL), TOVL_ERR_LAUNCH);
    cr_expect_eq(iface->launch(ctx, 77, grid, &args, sizeof args, NULL), TOVL_ERR_LAUNCH);
    tovl_kernel rd = tovl_try_kernel(be, TOVL_KERNEL_ROWDIFF);
    cr_expect_eq(iface->launch(ctx, rd, grid, &args, sizeof args - 8, NULL), TOVL_ERR_LAUNCH);
    cr_expect(strstr(tovl_last_error(), "rowdiff expects 40 bytes") != NULL, "%s", tovl_last_error());
    cr_expect_eq(iface->launch(ctx, rd, grid, &args, sizeof args, NULL), TOVL_OK, "an empty grid is a no-op");
    tovl_backend_close(be);
}

/* The probe's expected bits are what the CPU reference computes for the same
 * rows, and a flushing or fusing device would give other bits. */
Test(vulkan, denormal_probe_expectation_is_the_reference) {
    uint16_t x[257] = {0}, w[257] = {0};
    x[0] = 0x1A80;   /* 2^-74 */
    x[256] = 0x1A00; /* 2^-75 */
    w[0] = 0x1A00;
    w[256] = 0x1A00;
    cr_assert_eq(tovl_bf16_to_f32(0x1A80), 0x1p-74f);
    cr_assert_eq(tovl_bf16_to_f32(0x1A00), 0x1p-75f);
    cr_expect_eq(tovl_cpu_f32_out_bits(tovl_cpu_dot_bf16(x, w, 257)), 0x00000001u);
    tovl_backend *be = open_vulkan();
    if (is_lavapipe(be)) {
        /* Mesa's llvmpipe keeps subnormals; a wrong probe would say "flushed". */
        cr_expect_str_eq(tovl_backend_property(be, "f32_denormals"), "preserved");
    }
    tovl_backend_close(be);
}

Test(vulkan, timing_entry_points_answer) {
    tovl_backend *be = open_vulkan();
    tu_expect_timing_members(be, 1u << 20);
    tovl_backend_close(be);
}

/* ------------------------------------------------------------------------ */
/* A caller-owned device: the engine's instance, device, queue and command   */
/* buffer, with the validation layer when it is installed.                   */
/* ------------------------------------------------------------------------ */
typedef struct engine {
    void *lib;
    PFN_vkGetInstanceProcAddr gipa;
    PFN_vkGetDeviceProcAddr gdpa;
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice physical;
    VkDevice device;
    uint32_t family;
    VkQueue queue;
    VkCommandPool pool;
    VkCommandBuffer cmd;
    VkFence fence;
    bool validation;
    unsigned messages;
} engine;

#define IFN(e, name) ((PFN_##name)(e)->gipa((e)->instance, #name))
#define DFN(e, name) ((PFN_##name)(e)->gdpa((e)->device, #name))

static VKAPI_ATTR VkBool32 VKAPI_CALL engine_messenger(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                       VkDebugUtilsMessageTypeFlagsEXT types,
                                                       const VkDebugUtilsMessengerCallbackDataEXT *data, void *user) {
    (void)types;
    engine *e = user;
    if (severity & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)) {
        e->messages++;
        fprintf(stderr, "engine validation: %s\n", data->pMessage);
    }
    return VK_FALSE;
}

static bool engine_has_layer(engine *e) {
    PFN_vkEnumerateInstanceLayerProperties enum_layers =
        (PFN_vkEnumerateInstanceLayerProperties)e->gipa(NULL, "vkEnumerateInstanceLayerProperties");
    uint32_t n = 0;
    enum_layers(&n, NULL);
    VkLayerProperties props[64];
    n = n > 64 ? 64 : n;
    enum_layers(&n, props);
    for (uint32_t i = 0; i < n; i++) {
        if (strcmp(props[i].layerName, "VK_LAYER_KHRONOS_validation") == 0) {
            return true;
        }
    }
    return false;
}

/* Creates the engine's objects; false (with the reason) when no device. */
static bool engine_open(engine *e, char *why, size_t why_size) {
    memset(e, 0, sizeof *e);
    e->lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!e->lib) {
        snprintf(why, why_size, "libvulkan.so.1: %s", dlerror());
        return false;
    }
    void *sym = dlsym(e->lib, "vkGetInstanceProcAddr");
    memcpy(&e->gipa, &sym, sizeof e->gipa);
    e->validation = engine_has_layer(e);
    const char *layers[] = {"VK_LAYER_KHRONOS_validation"};
    const char *exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
    VkDebugUtilsMessengerCreateInfoEXT mi = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = engine_messenger,
        .pUserData = e,
    };
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ii = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        .pNext = e->validation ? &mi : NULL,
        .pApplicationInfo = &app,
        .enabledLayerCount = e->validation ? 1 : 0,
        .ppEnabledLayerNames = layers,
        .enabledExtensionCount = e->validation ? 1 : 0,
        .ppEnabledExtensionNames = exts,
    };
    PFN_vkCreateInstance create_instance = (PFN_vkCreateInstance)e->gipa(NULL, "vkCreateInstance");
    if (create_instance(&ii, NULL, &e->instance) != VK_SUCCESS) {
        snprintf(why, why_size, "vkCreateInstance failed");
        e->instance = VK_NULL_HANDLE;
        return false;
    }
    if (e->validation) {
        IFN(e, vkCreateDebugUtilsMessengerEXT)(e->instance, &mi, NULL, &e->messenger);
    }
    e->gdpa = IFN(e, vkGetDeviceProcAddr);
    uint32_t n = 1;
    VkResult r = IFN(e, vkEnumeratePhysicalDevices)(e->instance, &n, &e->physical);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || n == 0) {
        snprintf(why, why_size, "no Vulkan device");
        return false;
    }
    uint32_t nf = 0;
    VkQueueFamilyProperties fam[16];
    IFN(e, vkGetPhysicalDeviceQueueFamilyProperties)(e->physical, &nf, NULL);
    nf = nf > 16 ? 16 : nf;
    IFN(e, vkGetPhysicalDeviceQueueFamilyProperties)(e->physical, &nf, fam);
    e->family = UINT32_MAX;
    for (uint32_t i = 0; i < nf && e->family == UINT32_MAX; i++) {
        if (fam[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            e->family = i;
        }
    }
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = e->family,
                                  .queueCount = 1,
                                  .pQueuePriorities = &prio};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .bufferDeviceAddress = VK_TRUE};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12,
                                            .storageBuffer16BitAccess = VK_TRUE};
    VkPhysicalDeviceFeatures2 f = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                   .pNext = &f11,
                                   .features = {.shaderInt16 = VK_TRUE, .shaderInt64 = VK_TRUE}};
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                             .pNext = &f,
                             .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi};
    if (e->family == UINT32_MAX || IFN(e, vkCreateDevice)(e->physical, &di, NULL, &e->device) != VK_SUCCESS) {
        snprintf(why, why_size, "vkCreateDevice failed");
        e->device = VK_NULL_HANDLE;
        return false;
    }
    DFN(e, vkGetDeviceQueue)(e->device, e->family, 0, &e->queue);
    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, .queueFamilyIndex = e->family};
    DFN(e, vkCreateCommandPool)(e->device, &pi, NULL, &e->pool);
    VkCommandBufferAllocateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = e->pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    DFN(e, vkAllocateCommandBuffers)(e->device, &ci, &e->cmd);
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    DFN(e, vkCreateFence)(e->device, &fi, NULL, &e->fence);
    return true;
}

static void engine_close(engine *e) {
    if (e->device) {
        DFN(e, vkDestroyFence)(e->device, e->fence, NULL);
        DFN(e, vkDestroyCommandPool)(e->device, e->pool, NULL);
        DFN(e, vkDestroyDevice)(e->device, NULL);
    }
    if (e->instance) {
        if (e->messenger) {
            IFN(e, vkDestroyDebugUtilsMessengerEXT)(e->instance, e->messenger, NULL);
        }
        IFN(e, vkDestroyInstance)(e->instance, NULL);
    }
    if (e->lib) {
        dlclose(e->lib);
    }
}

static tovl_backend *wrap_engine(engine *e) {
    char why[256] = "";
    if (!engine_open(e, why, sizeof why)) {
        engine_close(e);
        if (vulkan_required()) {
            cr_assert_fail("a Vulkan device is required here: %s", why);
        }
        cr_skip_test("no Vulkan device: %s", why);
    }
    tovl_vulkan_device_desc d = {
        .instance = e->instance,
        .physical_device = e->physical,
        .device = e->device,
        .queue_family = e->family,
        .queue_index = 0,
        .get_instance_proc_addr = (tovl_vk_get_instance_proc_addr)e->gipa,
    };
    tovl_backend *be = NULL;
    cr_assert_eq(tovl_vulkan_backend_wrap(&d, &be), TOVL_OK, "%s", tovl_last_error());
    return be;
}

/* One mixed batch through both hooks on `be`; stream as given. */
enum { V = 700, H = 264, T = 41, SLOTS = 3, GUARD = 64 };

typedef struct batch {
    tovl_token_overlay_set *set;
    tovl_embed_overlay *ov[SLOTS];
    tovl_overlay_kernels k;
    tovl_devptr hidden, hidden_out, logits, ids, slots; /* hidden/logits have GUARD words around */
} batch;

typedef struct batch_data {
    uint32_t eids[SLOTS][40], lids[SLOTS][40];
    uint16_t erows[SLOTS][40 * H], lrows[SLOTS][40 * H];
    uint32_t ne[SLOTS], nl[SLOTS];
    uint16_t hidden[T * H];
    uint16_t lm_hidden[T * H];
    uint32_t ids[T];
    int32_t slots[T];
    uint32_t guard[GUARD];
    float logits[T * V];
} batch_data;

static void batch_data_make(batch_data *d, tu_rng *r) {
    for (int s = 0; s < SLOTS; s++) {
        d->ne[s] = 5 + tu_below(r, 35);
        d->nl[s] = 5 + tu_below(r, 35);
        tu_distinct_ids(r, V, d->ne[s], d->eids[s]);
        tu_distinct_ids(r, V, d->nl[s], d->lids[s]);
        tu_fill_bf16(r, d->erows[s], (size_t)d->ne[s] * H);
        tu_fill_bf16(r, d->lrows[s], (size_t)d->nl[s] * H);
    }
    tu_fill_bf16(r, d->hidden, T * H);
    tu_fill_bf16(r, d->lm_hidden, T * H);
    for (int t = 0; t < T; t++) {
        int s = (int)tu_below(r, SLOTS + 2) - 1; /* -1 .. SLOTS: some rows have no adapter */
        d->slots[t] = s;
        /* Most tokens hit an overlay row of their slot. */
        d->ids[t] = (s >= 0 && s < SLOTS && tu_below(r, 4) != 0) ? d->eids[s][tu_below(r, d->ne[s])] : tu_below(r, V);
    }
    for (int i = 0; i < GUARD; i++) {
        d->guard[i] = (uint32_t)tu_next(r);
    }
    for (int i = 0; i < T * V; i++) {
        d->logits[i] = (float)(int32_t)tu_next(r) * 1e-9f;
    }
}

static tovl_devptr alloc_guarded(tovl_backend *be, const batch_data *d, const void *body, size_t bytes) {
    tovl_devptr p = 0;
    cr_assert_eq(tovl_alloc(be, bytes + 2 * sizeof d->guard, &p), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_upload(be, p, d->guard, sizeof d->guard), TOVL_OK);
    cr_assert_eq(tovl_upload(be, p + sizeof d->guard, body, bytes), TOVL_OK);
    cr_assert_eq(tovl_upload(be, p + sizeof d->guard + bytes, d->guard, sizeof d->guard), TOVL_OK);
    return p + sizeof d->guard;
}

static void batch_prepare(tovl_backend *be, const batch_data *d, batch *b) {
    memset(b, 0, sizeof *b);
    b->k = tovl_overlay_kernels_resolve(be);
    for (int s = 0; s < SLOTS; s++) {
        cr_assert_eq(tu_build(be, V, H, d->eids[s], d->erows[s], d->ne[s], s != 1, d->lids[s], d->lrows[s], d->nl[s],
                              true, &b->ov[s]),
                     TOVL_OK, "%s", tovl_last_error());
    }
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, b->ov, SLOTS, true, &b->set), TOVL_OK, "%s",
                 tovl_last_error());
    b->hidden = alloc_guarded(be, d, d->hidden, sizeof d->hidden);
    b->hidden_out = alloc_guarded(be, d, d->lm_hidden, sizeof d->lm_hidden);
    b->logits = alloc_guarded(be, d, d->logits, sizeof d->logits);
    cr_assert_eq(tovl_alloc(be, sizeof d->ids, &b->ids), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof d->slots, &b->slots), TOVL_OK);
    cr_assert_eq(tovl_upload(be, b->ids, d->ids, sizeof d->ids), TOVL_OK);
    cr_assert_eq(tovl_upload(be, b->slots, d->slots, sizeof d->slots), TOVL_OK);
}

static void batch_record(const batch *b, void *stream) {
    tovl_embed_hook_args ea = {.hidden = b->hidden, .token_ids = b->ids, .slots = b->slots, .T = T, .hidden_size = H};
    cr_assert_eq(tovl_embed_hook(b->set, &b->k, &ea, stream), TOVL_OK, "%s", tovl_last_error());
    tovl_lmhead_hook_args la = {.logits = b->logits,
                                .logits_dtype = TOVL_LOGITS_F32,
                                .ld = V,
                                .hidden = b->hidden_out,
                                .slots = b->slots,
                                .T = T,
                                .hidden_size = H};
    cr_assert_eq(tovl_lmhead_hook(b->set, &b->k, &la, stream), TOVL_OK, "%s", tovl_last_error());
}

/* Downloads hidden and logits, checking the guards on both sides. */
static void batch_fetch(tovl_backend *be, const batch_data *d, const batch *b, uint16_t *hidden, float *logits) {
    uint32_t g[GUARD];
    const tovl_devptr bodies[2] = {b->hidden, b->logits};
    const size_t sizes[2] = {sizeof d->hidden, sizeof d->logits};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(tovl_download(be, g, bodies[i] - sizeof g, sizeof g), TOVL_OK);
        cr_expect_eq(memcmp(g, d->guard, sizeof g), 0, "guard before output %d overwritten", i);
        cr_assert_eq(tovl_download(be, g, bodies[i] + sizes[i], sizeof g), TOVL_OK);
        cr_expect_eq(memcmp(g, d->guard, sizeof g), 0, "guard after output %d overwritten", i);
    }
    cr_assert_eq(tovl_download(be, hidden, b->hidden, sizeof d->hidden), TOVL_OK);
    cr_assert_eq(tovl_download(be, logits, b->logits, sizeof d->logits), TOVL_OK);
}

static void batch_release(tovl_backend *be, batch *b) {
    tovl_token_overlay_set_destroy(b->set);
    for (int s = 0; s < SLOTS; s++) {
        tovl_embed_overlay_release(b->ov[s]);
    }
    const size_t guard = GUARD * sizeof(uint32_t);
    tovl_free(be, b->hidden - guard);
    tovl_free(be, b->hidden_out - guard);
    tovl_free(be, b->logits - guard);
    tovl_free(be, b->ids);
    tovl_free(be, b->slots);
}

Test(vulkan, hooks_record_into_the_callers_command_buffer_bit_exact) {
    engine e;
    tovl_backend *be = wrap_engine(&e);
    tu_rng r = tu_rng_for("vulkan_wrap_hooks");
    batch_data *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    batch_data_make(d, &r);

    /* The reference: the CPU backend, same data. */
    tovl_backend *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    batch ref;
    batch_prepare(cpu, d, &ref);
    batch_record(&ref, NULL);
    static uint16_t want_hidden[T * H], got_hidden[T * H];
    static float want_logits[T * V], got_logits[T * V];
    batch_fetch(cpu, d, &ref, want_hidden, want_logits);
    cr_assert_neq(memcmp(want_hidden, d->hidden, sizeof d->hidden), 0, "the reference patched no embedding row");
    cr_assert_neq(memcmp(want_logits, d->logits, sizeof d->logits), 0, "the reference patched no logit");

    batch b;
    batch_prepare(be, d, &b);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    cr_assert_eq(DFN(&e, vkBeginCommandBuffer)(e.cmd, &bi), VK_SUCCESS);
    batch_record(&b, e.cmd);
    cr_assert_eq(DFN(&e, vkEndCommandBuffer)(e.cmd), VK_SUCCESS);
    /* Recorded, not run: the hooks never submit or wait. */
    batch_fetch(be, d, &b, got_hidden, got_logits);
    cr_expect_eq(memcmp(got_hidden, d->hidden, sizeof got_hidden), 0, "a hook ran before the engine submitted");
    cr_expect_eq(tovl_synchronize(be, e.cmd), TOVL_ERR_UNSUPPORTED);
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &e.cmd};
    cr_assert_eq(DFN(&e, vkQueueSubmit)(e.queue, 1, &si, e.fence), VK_SUCCESS);
    cr_assert_eq(DFN(&e, vkWaitForFences)(e.device, 1, &e.fence, VK_TRUE, UINT64_MAX), VK_SUCCESS);
    batch_fetch(be, d, &b, got_hidden, got_logits);
    for (int i = 0; i < T * H; i++) {
        cr_assert_eq(got_hidden[i], want_hidden[i], "hidden[%d][%d]: 0x%04x, reference 0x%04x", i / H, i % H,
                     got_hidden[i], want_hidden[i]);
    }
    for (int i = 0; i < T * V; i++) {
        uint32_t gb, wb;
        memcpy(&gb, &got_logits[i], 4);
        memcpy(&wb, &want_logits[i], 4);
        cr_assert_eq(gb, wb, "logits[%d][%d]: 0x%08x, reference 0x%08x", i / V, i % V, gb, wb);
    }
    batch_release(cpu, &ref);
    batch_release(be, &b);
    tovl_backend_close(cpu);
    tovl_backend_close(be); /* the engine's device must survive this */
    cr_expect_eq(DFN(&e, vkDeviceWaitIdle)(e.device), VK_SUCCESS, "the wrapped device is still the engine's");
    if (e.validation) {
        cr_expect_eq(e.messages, 0, "%u validation messages", e.messages);
        /* The counter counts: a deliberate misuse (a zero-sized buffer) is reported. */
        VkBufferCreateInfo bad = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                  .size = 0,
                                  .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT};
        VkBuffer buf = VK_NULL_HANDLE;
        unsigned before = e.messages;
        if (DFN(&e, vkCreateBuffer)(e.device, &bad, NULL, &buf) == VK_SUCCESS && buf) {
            DFN(&e, vkDestroyBuffer)(e.device, buf, NULL);
        }
        cr_expect_gt(e.messages, before, "the validation messenger missed a deliberate error");
    } else if (getenv("CI") && strcmp(getenv("CI"), "true") == 0) {
        cr_expect_fail("CI must run this with VK_LAYER_KHRONOS_validation installed");
    }
    engine_close(&e);
    free(d);
}

/* One hook's run on a backend: embed (hidden patched in place), then lm_head
 * into f32 logits, over WIDE_T rows of one slot (some at -1). */
enum { WIDE_T = 65535 + 129, WIDE_H = 8, WIDE_V = 32, WIDE_NE = 6, WIDE_NL = 3 };
typedef struct wide_data {
    uint32_t eids[WIDE_NE], lids[WIDE_NL];
    uint16_t erows[WIDE_NE * WIDE_H], lrows[WIDE_NL * WIDE_H];
    uint16_t hidden[WIDE_T * WIDE_H];
    uint32_t ids[WIDE_T];
    int32_t slots[WIDE_T];
    float logits[WIDE_T * WIDE_V];
} wide_data;

static void wide_run(tovl_backend *be, const wide_data *d, uint16_t *hidden, float *logits, uint32_t *changed,
                     uint32_t *n_changed) {
    tovl_overlay_kernels k = tovl_overlay_kernels_resolve(be);
    tovl_embed_overlay *ov = NULL;
    cr_assert_eq(tu_build(be, WIDE_V, WIDE_H, d->eids, d->erows, WIDE_NE, true, d->lids, d->lrows, WIDE_NL, false, &ov),
                 TOVL_OK, "%s", tovl_last_error());
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_from_slots(be, &ov, 1, false, &set), TOVL_OK, "%s", tovl_last_error());
    tovl_devptr h = 0, orig = 0, ids = 0, slots = 0, lg = 0;
    cr_assert_eq(tovl_alloc(be, sizeof d->hidden, &h), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof d->hidden, &orig), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof d->ids, &ids), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof d->slots, &slots), TOVL_OK);
    cr_assert_eq(tovl_alloc(be, sizeof d->logits, &lg), TOVL_OK);
    cr_assert_eq(tovl_upload(be, h, d->hidden, sizeof d->hidden), TOVL_OK);
    cr_assert_eq(tovl_upload(be, orig, d->hidden, sizeof d->hidden), TOVL_OK);
    cr_assert_eq(tovl_upload(be, ids, d->ids, sizeof d->ids), TOVL_OK);
    cr_assert_eq(tovl_upload(be, slots, d->slots, sizeof d->slots), TOVL_OK);
    cr_assert_eq(tovl_upload(be, lg, d->logits, sizeof d->logits), TOVL_OK);
    tovl_embed_hook_args ea = {.hidden = h, .token_ids = ids, .slots = slots, .T = WIDE_T, .hidden_size = WIDE_H};
    cr_assert_eq(tovl_embed_hook(set, &k, &ea, NULL), TOVL_OK, "%s", tovl_last_error());
    tovl_lmhead_hook_args la = {.logits = lg, .logits_dtype = TOVL_LOGITS_F32, .ld = WIDE_V, .hidden = h,
                                .slots = slots, .T = WIDE_T, .hidden_size = WIDE_H};
    cr_assert_eq(tovl_lmhead_hook(set, &k, &la, NULL), TOVL_OK, "%s", tovl_last_error());
    /* rowdiff over as many rows: the patched rows against the originals. */
    cr_assert_eq(tovl_rowdiff(be, &k, h, orig, WIDE_T, WIDE_H, 0.0f, changed, n_changed), TOVL_OK, "%s",
                 tovl_last_error());
    cr_assert_eq(tovl_synchronize(be, NULL), TOVL_OK);
    cr_assert_eq(tovl_download(be, hidden, h, sizeof d->hidden), TOVL_OK);
    cr_assert_eq(tovl_download(be, logits, lg, sizeof d->logits), TOVL_OK);
    tovl_free(be, h);
    tovl_free(be, orig);
    tovl_free(be, ids);
    tovl_free(be, slots);
    tovl_free(be, lg);
    tovl_token_overlay_set_destroy(set);
    tovl_embed_overlay_release(ov);
}

/* More workgroups than one dispatch dimension holds on lavapipe (65535): the
 * embed and rowdiff shaders' index spreads over X and Y, the lm_head rows'
 * over Y and Z (common.glsl), and every row past the first 65535 must land
 * where the CPU puts it. Devices with a larger limit run one row of groups. */
Test(vulkan, hooks_past_one_dimension_of_workgroups, .timeout = 300) {
    setenv("TOVL_VULKAN_LMHEAD", "row", 1); /* the tiles would each scan all 65664 rows */
    tovl_backend *be = open_vulkan();
    unsetenv("TOVL_VULKAN_LMHEAD");
    tu_rng r = tu_rng_for("vulkan_wide_grid");
    wide_data *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    for (uint32_t i = 0; i < WIDE_NE; i++) {
        d->eids[i] = 5 * i + 1;
    }
    for (uint32_t i = 0; i < WIDE_NL; i++) {
        d->lids[i] = 7 * i + 3;
    }
    tu_fill_bf16(&r, d->erows, WIDE_NE * WIDE_H);
    tu_fill_bf16(&r, d->lrows, WIDE_NL * WIDE_H);
    tu_fill_bf16(&r, d->hidden, (size_t)WIDE_T * WIDE_H);
    for (uint32_t t = 0; t < WIDE_T; t++) {
        d->slots[t] = tu_below(&r, 8) == 0 ? -1 : 0;
        d->ids[t] = tu_below(&r, 2) ? d->eids[tu_below(&r, WIDE_NE)] : tu_below(&r, WIDE_V);
    }
    d->slots[WIDE_T - 1] = 0; /* the last row, in the second row of groups, patches */
    d->ids[WIDE_T - 1] = d->eids[0];
    for (size_t i = 0; i < (size_t)WIDE_T * WIDE_V; i++) {
        d->logits[i] = (float)(int32_t)tu_next(&r) * 1e-9f;
    }
    static uint16_t want_h[WIDE_T * WIDE_H], got_h[WIDE_T * WIDE_H];
    static float want_l[WIDE_T * WIDE_V], got_l[WIDE_T * WIDE_V];
    static uint32_t want_c[WIDE_T], got_c[WIDE_T];
    memset(got_h, 0xA5, sizeof got_h);
    memset(got_l, 0xA5, sizeof got_l);
    uint32_t want_n = 0, got_n = 0;
    tovl_backend *cpu = NULL;
    cr_assert_eq(tovl_backend_open("cpu", &cpu), TOVL_OK);
    wide_run(cpu, d, want_h, want_l, want_c, &want_n);
    wide_run(be, d, got_h, got_l, got_c, &got_n);
    cr_assert_neq(memcmp(&want_h[(WIDE_T - 1) * WIDE_H], &d->hidden[(WIDE_T - 1) * WIDE_H], WIDE_H * 2), 0,
                  "the reference left the last row alone");
    cr_assert_gt(want_n, WIDE_T / 4, "the reference patched only %u rows", want_n);
    for (size_t i = 0; i < (size_t)WIDE_T * WIDE_H; i++) {
        cr_assert_eq(got_h[i], want_h[i], "hidden[%zu][%zu]: 0x%04x, reference 0x%04x", i / WIDE_H, i % WIDE_H,
                     got_h[i], want_h[i]);
    }
    cr_assert_eq(memcmp(got_l, want_l, sizeof got_l), 0, "logits differ from the reference");
    cr_assert_eq(got_n, want_n, "rowdiff: %u rows, reference %u", got_n, want_n);
    cr_assert_eq(memcmp(got_c, want_c, want_n * sizeof *got_c), 0, "rowdiff's rows differ from the reference");
    tovl_backend_close(cpu);
    tovl_backend_close(be);
    free(d);
}

Test(vulkan, wrap_refuses_bad_descriptions_and_leaves_the_device) {
    engine e;
    tovl_backend *be = wrap_engine(&e);
    tovl_backend_close(be);
    tovl_vulkan_device_desc d = {
        .instance = e.instance,
        .physical_device = e.physical,
        .device = e.device,
        .queue_family = 999,
        .get_instance_proc_addr = (tovl_vk_get_instance_proc_addr)e.gipa,
    };
    be = (tovl_backend *)&d; /* must be reset to NULL */
    cr_expect_eq(tovl_vulkan_backend_wrap(&d, &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_null(be);
    cr_expect(strstr(tovl_last_error(), "queue family 999") != NULL, "%s", tovl_last_error());
    d.queue_family = e.family;
    d.device = NULL;
    cr_expect_eq(tovl_vulkan_backend_wrap(&d, &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_eq(tovl_vulkan_backend_wrap(NULL, &be), TOVL_ERR_INVALID_ARGUMENT);
    cr_expect_eq(DFN(&e, vkDeviceWaitIdle)(e.device), VK_SUCCESS);
    if (e.validation) {
        cr_expect_eq(e.messages, 0, "%u validation messages", e.messages);
    }
    engine_close(&e);
}

/* ---- tovl bench on this device (the CLI binary) ----------------------------- */

/* Runs `tovl ARGS`; its exit status, with its stderr in err. */
static int bench_cli(const char *args, char *err, size_t cap) {
    return tu_run_cli(TOVL_CLI, NULL, args, err, cap);
}

static size_t count_of(const char *text, const char *needle) {
    size_t n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) {
        n++;
    }
    return n;
}

/* --tokens: every batch size it names gets its three hook rows (and nothing
 * else), each with a positive time; --quick's own sizes are not added. */
Test(vulkan, bench_cli_times_the_batch_sizes_it_is_given, .timeout = 300) {
    tovl_backend_close(open_vulkan()); /* skips, or fails in CI, without a device */
    char json_path[] = "/tmp/tovl_bench_json_XXXXXX";
    const int fd = mkstemp(json_path);
    cr_assert_geq(fd, 0, "mkstemp");
    close(fd);
    char args[256], err[4096];
    snprintf(args, sizeof args, "bench --backend vulkan --quick --tokens 12,5 --seed %llu --json '%s'",
             (unsigned long long)tu_seed(), json_path);
    const int rc = bench_cli(args, err, sizeof err);
    cr_assert_eq(rc, 0, "tovl %s: exit %d: %s", args, rc, err);
    FILE *f = fopen(json_path, "r");
    cr_assert_not_null(f, "no --json file");
    static char text[1 << 16];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(json_path);
    cr_expect_eq(count_of(text, "\"graph_us\""), 13,
                 "rowdiff, the idle embed, five floor probes and three hooks at each of two sizes:\n%s", text);
    cr_expect_eq(count_of(text, "\"idle T=1 slot -1\""), 1, "%s", text);
    cr_expect_eq(count_of(text, "\"dispatch_floor_"), 5, "%s", text);
    cr_expect_eq(count_of(text, "\"T=12 h="), 3, "%s", text);
    cr_expect_eq(count_of(text, "\"T=5 h="), 3, "%s", text);
    cr_expect_eq(count_of(text, "\"T=64 h="), 0, "--quick's sizes are replaced by --tokens: %s", text);
    for (const char *p = strstr(text, "\"graph_us\""); p; p = strstr(p + 1, "\"graph_us\"")) {
        const double us = strtod(p + strlen("\"graph_us\":"), NULL);
        cr_expect_gt(us, 0.0, "a row without a time: %.80s", p);
    }
}

Test(vulkan, bench_cli_names_a_bad_batch_size) {
    char err[4096];
    cr_expect_eq(bench_cli("bench --tokens 64,0", err, sizeof err), 2);
    cr_expect(strstr(err, "'0' is not a batch size") != NULL, "stderr: %s", err);
    cr_expect_eq(bench_cli("bench --tokens 64,,8", err, sizeof err), 2);
    cr_expect(strstr(err, "'' is not a batch size") != NULL, "stderr: %s", err);
    cr_expect_eq(bench_cli("bench --tokens 1,2,3,4,5,6,7,8,9", err, sizeof err), 2);
    cr_expect(strstr(err, "more than 8 sizes") != NULL, "stderr: %s", err);
    cr_expect_eq(bench_cli("bench --tokens 65537", err, sizeof err), 2);
    cr_expect(strstr(err, "'65537' is not a batch size in 1 .. 65536") != NULL, "stderr: %s", err);
}

/* ------------------------------------------------------------------------ */
/* Fixed-shape sets: one command buffer recorded with the hooks, submitted   */
/* again after every load                                                    */
/* ------------------------------------------------------------------------ */
typedef struct recorded {
    engine *e;
} recorded;

static void recorded_record(void *user, const slots_hooks *hooks) {
    engine *e = ((recorded *)user)->e;
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    cr_assert_eq(DFN(e, vkBeginCommandBuffer)(e->cmd, &bi), VK_SUCCESS);
    slots_enqueue(hooks, e->cmd);
    cr_assert_eq(DFN(e, vkEndCommandBuffer)(e->cmd), VK_SUCCESS);
}

static void recorded_replay(void *user) {
    engine *e = ((recorded *)user)->e;
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &e->cmd};
    cr_assert_eq(DFN(e, vkQueueSubmit)(e->queue, 1, &si, e->fence), VK_SUCCESS);
    cr_assert_eq(DFN(e, vkWaitForFences)(e->device, 1, &e->fence, VK_TRUE, UINT64_MAX), VK_SUCCESS);
    cr_assert_eq(DFN(e, vkResetFences)(e->device, 1, &e->fence), VK_SUCCESS);
}

static void slots_recorded(bool tied, uint32_t rounds, uint32_t capacity, const char *tag) {
    engine e;
    tovl_backend *be = wrap_engine(&e);
    recorded rec = {&e};
    /* Loads on the backend's own submissions, on the queue the engine submits to. */
    slots_replayer rp = {.record = recorded_record, .replay = recorded_replay, .load_stream = NULL, .user = &rec};
    slots_check_rounds(be, &rp, &(slots_config){.rounds = rounds, .tied = tied, .capacity = capacity}, tag);
    tovl_backend_close(be);
    if (e.validation) {
        cr_expect_eq(e.messages, 0, "%s: %u validation messages", tag, e.messages);
    }
    engine_close(&e);
}

Test(vulkan, slots_in_place_under_one_recorded_command_buffer_tied, .timeout = 600) {
    slots_recorded(true, 1000, 12, "vulkan_slots_tied");
}

Test(vulkan, slots_in_place_under_one_recorded_command_buffer_untied, .timeout = 600) {
    slots_recorded(false, 1000, 12, "vulkan_slots_untied");
}

/* A capacity of 160 rows, two adapters filling it. On the rows the launch is
 * shaped for 64 and widened to 10 workgroups of 8 cells at T = 24, so each
 * loops over the chunks past them; on the tiles the workgroups past every
 * slot's rows leave before the pass over the row slots. */
Test(vulkan, slots_capacity_160_rows, .timeout = 600) {
    setenv("TOVL_VULKAN_LMHEAD", "row", 1);
    slots_recorded(false, 100, 160, "vulkan_slots_rows_160");
    unsetenv("TOVL_VULKAN_LMHEAD");
}

Test(vulkan, slots_capacity_160_tiles, .timeout = 600) {
    setenv("TOVL_VULKAN_LMHEAD", "tile", 1);
    slots_recorded(false, 100, 160, "vulkan_slots_tiles_160");
    unsetenv("TOVL_VULKAN_LMHEAD");
}

/* write_async of more than vkCmdUpdateBuffer's 65536 bytes (a shard set's
 * ids at a large capacity): several updates, all of them landing, nothing past. */
Test(vulkan, a_write_async_past_65536_bytes_lands_whole) {
    tovl_backend *be = open_vulkan();
    enum { WORDS = 3 * 16384 + 77, PAD = 16 };
    tu_rng r = tu_rng_for("vulkan_write_async_long");
    uint32_t *src = malloc(sizeof(uint32_t) * WORDS), *back = malloc(sizeof(uint32_t) * (WORDS + PAD));
    uint32_t pad[PAD];
    cr_assert(src && back);
    for (uint32_t i = 0; i < WORDS; i++) {
        src[i] = (uint32_t)tu_next(&r);
    }
    for (uint32_t i = 0; i < PAD; i++) {
        pad[i] = 0xC0FFEE00u + i;
    }
    tovl_devptr d = 0;
    cr_assert_eq(tovl_alloc(be, sizeof(uint32_t) * (WORDS + PAD), &d), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_upload(be, d + sizeof(uint32_t) * WORDS, pad, sizeof pad), TOVL_OK);
    const tovl_device_write w = {d, src, sizeof(uint32_t) * WORDS};
    const tovl_backend_iface *iface = tovl_backend_get_iface(be);
    cr_assert_not_null(iface->write_async);
    cr_assert_eq(iface->write_async(tovl_backend_get_context(be), &w, 1, NULL), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_synchronize(be, NULL), TOVL_OK);
    cr_assert_eq(tovl_download(be, back, d, sizeof(uint32_t) * (WORDS + PAD)), TOVL_OK);
    cr_assert_eq(memcmp(back, src, sizeof(uint32_t) * WORDS), 0, "a part of the long write is missing");
    cr_assert_eq(memcmp(back + WORDS, pad, sizeof pad), 0, "the long write ran past its end");
    tovl_free(be, d);
    free(src);
    free(back);
    tovl_backend_close(be);
}

/* Fixed-shape shard sets: every rank of N = 1 .. 8 recorded once into one
 * command buffer (with an unsharded fixed-shape set), submitted again after
 * the same loads on every rank; the vocabularies of test_tp, 84 rounds each
 * (1008 in all: a round runs 111 hooks, some 10 ms each on lavapipe; the CPU
 * backend and the CUDA graphs take 1000 a vocabulary), capacity 64 (every
 * shard edge of every N fits). Its own CTest tests (tests/vulkan.cmake). */
static const uint32_t shard_vocabs[] = {509, 777, 1000, 1021, 4096, 131};
static size_t shard_cases[2 * sizeof shard_vocabs / sizeof shard_vocabs[0]];

ParameterizedTestParameters(vulkan_shards, rounds_under_one_recorded_command_buffer) {
    const size_t n = sizeof shard_cases / sizeof shard_cases[0];
    for (size_t i = 0; i < n; i++) {
        shard_cases[i] = i;
    }
    return cr_make_param_array(size_t, shard_cases, n);
}
ParameterizedTest(size_t *index, vulkan_shards, rounds_under_one_recorded_command_buffer, .timeout = 900) {
    engine e;
    tovl_backend *be = wrap_engine(&e);
    recorded rec = {&e};
    slots_replayer rp = {.record = recorded_record, .replay = recorded_replay, .load_stream = NULL, .user = &rec};
    const slots_shard_config cfg = {.rounds = 84, .tied = *index % 2, .vocab = shard_vocabs[*index / 2],
                                    .capacity = 64};
    slots_check_shards(be, &rp, &cfg, "vulkan_shards");
    tovl_backend_close(be);
    if (e.validation) {
        cr_expect_eq(e.messages, 0, "vulkan_shards: %u validation messages", e.messages);
    }
    engine_close(&e);
}

/* A load recorded into the engine's own command buffer: the replaced overlay
 * is held until that command buffer has run (its fence is a VkEvent). */
Test(vulkan, a_load_in_a_command_buffer_releases_the_old_overlay_after_it_ran) {
    engine e;
    tovl_backend *be = wrap_engine(&e);
    tu_rng r = tu_rng_for("vulkan_slots_fence");
    enum { FV = 64, FH = 16, FN = 4 };
    uint32_t ids[FN];
    uint16_t rows[2][FN * FH];
    tu_distinct_ids(&r, FV, FN, ids);
    tu_fill_bf16(&r, rows[0], FN * FH);
    tu_fill_bf16(&r, rows[1], FN * FH);
    tovl_embed_overlay *a = NULL, *b = NULL;
    cr_assert_eq(tu_build(be, FV, FH, ids, rows[0], FN, false, NULL, NULL, 0, false, &a), TOVL_OK);
    cr_assert_eq(tu_build(be, FV, FH, ids, rows[1], FN, false, NULL, NULL, 0, false, &b), TOVL_OK);
    tovl_set_shape shape = {2, FV, FH, false, FN, FN};
    tovl_token_overlay_set *set = NULL;
    cr_assert_eq(tovl_token_overlay_set_create(be, &shape, &set), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(tovl_token_overlay_set_load(set, 1, a, NULL), TOVL_OK, "%s", tovl_last_error());
    tovl_embed_overlay_release(a);

    VkCommandBuffer cmd = VK_NULL_HANDLE;
    VkCommandBufferAllocateInfo ci = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = e.pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    cr_assert_eq(DFN(&e, vkAllocateCommandBuffers)(e.device, &ci, &cmd), VK_SUCCESS);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    cr_assert_eq(DFN(&e, vkBeginCommandBuffer)(cmd, &bi), VK_SUCCESS);
    cr_assert_eq(tovl_token_overlay_set_load(set, 1, b, cmd), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(DFN(&e, vkEndCommandBuffer)(cmd), VK_SUCCESS);
    cr_assert_eq(tovl_token_overlay_set_slot(set, 1), b);
    uint32_t pending = 0;
    cr_assert_eq(tovl_token_overlay_set_collect(set, &pending), TOVL_OK);
    cr_assert_eq(pending, 1, "the replaced overlay went before the command buffer ran");
    /* Not run yet: the device tables still point at A. */
    tovl_overlay_tables t = tovl_token_overlay_set_tables(set);
    uint64_t rows_ptr = 0;
    cr_assert_eq(tovl_download(be, &rows_ptr, t.embed_rows_table + 8, 8), TOVL_OK);
    cr_assert_neq(rows_ptr, tovl_embed_overlay_get_view(b).embed_rows, "a recorded load ran before its submit");
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cmd};
    cr_assert_eq(DFN(&e, vkQueueSubmit)(e.queue, 1, &si, e.fence), VK_SUCCESS);
    cr_assert_eq(DFN(&e, vkWaitForFences)(e.device, 1, &e.fence, VK_TRUE, UINT64_MAX), VK_SUCCESS);
    cr_assert_eq(tovl_download(be, &rows_ptr, t.embed_rows_table + 8, 8), TOVL_OK);
    cr_assert_eq(rows_ptr, tovl_embed_overlay_get_view(b).embed_rows, "the submitted load did not land");
    cr_assert_eq(tovl_token_overlay_set_collect(set, &pending), TOVL_OK, "%s", tovl_last_error());
    cr_assert_eq(pending, 0, "the replaced overlay is still held after its command buffer ran");
    tovl_embed_overlay_release(b);
    tovl_token_overlay_set_destroy(set);
    DFN(&e, vkFreeCommandBuffers)(e.device, e.pool, 1, &cmd);
    tovl_backend_close(be);
    if (e.validation) {
        cr_expect_eq(e.messages, 0, "%u validation messages", e.messages);
    }
    engine_close(&e);
}

Test(vulkan, slots_loader_thread_beside_a_serving_thread, .timeout = 600) {
    tovl_backend *be = open_vulkan();
    const char *why = slots_threaded_run(be, "slots_threads_vulkan", 300);
    cr_assert_null(why, "%s", why);
    tovl_backend_close(be);
}
