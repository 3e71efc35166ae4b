/* Float controls for the embedded SPIR-V. GLSL has no syntax for them, so the
 * capabilities and execution modes are added to the module here, for the
 * 32-bit float width and only those the device supports:
 *   DenormPreserve            subnormals survive (the spec asks for them),
 *   SignedZeroInfNanPreserve  no "x + 0.0 -> x" or NaN-free assumptions,
 *   RoundingModeRTE           every sum and product rounds to nearest-even.
 * SPIR-V 1.4+ (our modules are 1.5) has them in the core, no extension. */
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

enum {
    SPV_MAGIC = 0x07230203u,
    SPV_HEADER_WORDS = 5,
    SPV_OP_CAPABILITY = 17,
    SPV_OP_ENTRY_POINT = 15,
    SPV_CAP_DENORM_PRESERVE = 4464,
    SPV_CAP_SIGNED_ZERO_INF_NAN_PRESERVE = 4466,
    SPV_CAP_ROUNDING_MODE_RTE = 4467,
    SPV_OP_EXECUTION_MODE = 16,
    SPV_MODE_DENORM_PRESERVE = 4459,
    SPV_MODE_SIGNED_ZERO_INF_NAN_PRESERVE = 4461,
    SPV_MODE_ROUNDING_MODE_RTE = 4462,
};

tovl_status tovl_vk_spirv_with_float_controls(const unsigned char *spirv, size_t size, vk_float_controls fc,
                                         uint32_t **out_words, size_t *out_bytes) {
    *out_words = NULL;
    *out_bytes = 0;
    if (size % 4 != 0 || size < SPV_HEADER_WORDS * 4) {
        return tovl_error(TOVL_ERR_INTERNAL, "vulkan: embedded SPIR-V of %zu bytes is malformed", size);
    }
    size_t n = size / 4;
    uint32_t caps[3], modes[3];
    size_t n_caps = 0;
    if (fc.denorm_preserve) {
        caps[n_caps] = SPV_CAP_DENORM_PRESERVE;
        modes[n_caps++] = SPV_MODE_DENORM_PRESERVE;
    }
    if (fc.signed_zero_inf_nan_preserve) {
        caps[n_caps] = SPV_CAP_SIGNED_ZERO_INF_NAN_PRESERVE;
        modes[n_caps++] = SPV_MODE_SIGNED_ZERO_INF_NAN_PRESERVE;
    }
    if (fc.rounding_rte) {
        caps[n_caps] = SPV_CAP_ROUNDING_MODE_RTE;
        modes[n_caps++] = SPV_MODE_ROUNDING_MODE_RTE;
    }
    /* Each capability is 2 words, each execution mode 4 words. */
    uint32_t *out = malloc((n + 6 * n_caps) * sizeof *out);
    if (!out) {
        return tovl_error(TOVL_ERR_OUT_OF_MEMORY, "vulkan: out of host memory patching SPIR-V");
    }
    memcpy(out, spirv, SPV_HEADER_WORDS * 4);
    if (out[0] != SPV_MAGIC) {
        free(out);
        return tovl_error(TOVL_ERR_INTERNAL, "vulkan: embedded SPIR-V has a bad magic number");
    }
    size_t w = SPV_HEADER_WORDS;
    for (size_t i = 0; i < n_caps; i++) {
        out[w++] = (2u << 16) | SPV_OP_CAPABILITY;
        out[w++] = caps[i];
    }
    bool entry_seen = false;
    for (size_t i = SPV_HEADER_WORDS; i < n;) {
        uint32_t first;
        memcpy(&first, spirv + i * 4, 4);
        uint32_t count = first >> 16;
        uint32_t opcode = first & 0xFFFFu;
        if (count == 0 || i + count > n) {
            free(out);
            return tovl_error(TOVL_ERR_INTERNAL, "vulkan: embedded SPIR-V has a malformed instruction");
        }
        memcpy(&out[w], spirv + i * 4, (size_t)count * 4);
        w += count;
        if (opcode == SPV_OP_ENTRY_POINT) {
            if (entry_seen || count < 3) {
                free(out);
                return tovl_error(TOVL_ERR_INTERNAL, "vulkan: embedded SPIR-V must have one entry point");
            }
            entry_seen = true;
            uint32_t entry_id = out[w - count + 2];
            for (size_t m = 0; m < n_caps; m++) {
                out[w++] = (4u << 16) | SPV_OP_EXECUTION_MODE;
                out[w++] = entry_id;
                out[w++] = modes[m];
                out[w++] = 32; /* the float width the mode applies to */
            }
        }
        i += count;
    }
    if (!entry_seen) {
        free(out);
        return tovl_error(TOVL_ERR_INTERNAL, "vulkan: embedded SPIR-V has no entry point");
    }
    *out_words = out;
    *out_bytes = w * 4;
    return TOVL_OK;
}
