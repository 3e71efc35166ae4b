/* The HIP port's kernels compiled for the host, exactly as hipcc sees them
 * but with emu/hip_emu.h for HIP's built-ins, run by the CUDA port's kernel
 * emulation at the launch's warp width. Test-only C++.
 * hip_emu_kernels_tiles.cpp includes this file again with
 * TOVL_HIP_LMHEAD_TILE_MIN_T 1 (lm_head tiles at every T) and
 * TOVL_HIP_EMU_FINDER naming its kernel table's lookup. */
#define TOVL_HIP_EMU 1
#include "hip_emu.h"

#include "../token_overlay.hip"

#include <string.h>

#include "../../cuda/emu/emu_kernels.h"
#include "hip_emu_api.h"

namespace {

#define TOVL_HIP_EMU_THUNK(kernel, args_type) \
    {#kernel, [](const void *args) { kernel(*static_cast<const args_type *>(args)); }}

const struct {
    const char *name;
    tovl_emu::KernelThunk run;
} hip_kernels[] = {
    TOVL_HIP_EMU_THUNK(rowdiff, tovl_rowdiff_args),
    TOVL_HIP_EMU_THUNK(embed_overlay, tovl_embed_overlay_args),
    TOVL_HIP_EMU_THUNK(lmhead_overlay_bf16, tovl_lmhead_overlay_args),
    TOVL_HIP_EMU_THUNK(lmhead_overlay_f32, tovl_lmhead_overlay_args),
};

} // namespace

#ifndef TOVL_HIP_EMU_FINDER
#define TOVL_HIP_EMU_FINDER tovl_hip_emu_find_kernel
#define TOVL_HIP_EMU_DEFAULT_TABLE 1
#endif

tovl_emu::KernelThunk TOVL_HIP_EMU_FINDER(const char *name);
tovl_emu::KernelThunk TOVL_HIP_EMU_FINDER(const char *name) {
    for (const auto &k : hip_kernels) {
        if (strcmp(k.name, name) == 0) {
            return k.run;
        }
    }
    return nullptr;
}

#ifdef TOVL_HIP_EMU_DEFAULT_TABLE
tovl_emu::KernelThunk tovl_hip_emu_find_tiles_kernel(const char *name); /* hip_emu_kernels_tiles.cpp */

extern "C" tovl_status tovl_hip_emu_launch(const char *function, const uint32_t grid[3], const uint32_t block[3],
                                           const void *args, uint64_t seed, unsigned warp, bool lmhead_tiles) {
    const tovl_emu::KernelThunk kernel =
        lmhead_tiles ? tovl_hip_emu_find_tiles_kernel(function) : tovl_hip_emu_find_kernel(function);
    return tovl_emu::run_kernel("hip", function, kernel, grid, block, args, seed, warp);
}
#endif
