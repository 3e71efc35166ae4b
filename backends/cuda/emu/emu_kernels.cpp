/* This port's kernels compiled for the host, exactly as nvcc sees them but
 * with emu/cuda_emu.h for CUDA's built-ins. Test-only C++. */
#define TOVL_CUDA_EMU 1
#include "../token_overlay.cu"

#include <string.h>

#include "emu_kernels.h"

namespace tovl_emu {

#define TOVL_EMU_THUNK(kernel, args_type) \
    {#kernel, [](const void *args) { kernel(*static_cast<const args_type *>(args)); }}

static const struct {
    const char *name;
    KernelThunk run;
} kernels[] = {
    TOVL_EMU_THUNK(rowdiff, tovl_rowdiff_args),
    TOVL_EMU_THUNK(embed_overlay, tovl_embed_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_bf16, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_bf16_small, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32_small, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_bf16_row, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32_row, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_bf16_row2, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32_row2, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_bf16_row4, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32_row4, tovl_lmhead_overlay_args),
};

KernelThunk find_kernel(const char *name) {
    for (const auto &k : kernels) {
        if (strcmp(k.name, name) == 0) {
            return k.run;
        }
    }
    return nullptr;
}

} // namespace tovl_emu
