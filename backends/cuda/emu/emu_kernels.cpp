/* This port's kernels compiled for the host, exactly as nvcc sees them but
 * with emu/cuda_emu.h for CUDA's built-ins. Test-only C++. */
#define TOVL_CUDA_EMU 1
#include "../token_overlay.cu"

#include <string.h>

#include "emu_kernels.h"

/* A probe of the emulation itself (not a port's kernel): thread 0 issues a
 * cp.async of 16 bytes from `src` into shared memory and commits it; after a
 * barrier thread 1 reads the destination (out[0..15]); thread 0 waits for
 * its group; after a second barrier thread 1 reads it again (out[16..31]).
 * On a GPU the first read may see anything; the emulation gives poison. */
struct emu_probe_cp_async_args {
    uint64_t src, out;
};
static void emu_probe_cp_async(emu_probe_cp_async_args a) {
    __shared__ uint4 slot;
    const unsigned tid = threadIdx.x;
    if (tid == 0) {
        tovl_cuda::copy16_async(&slot, reinterpret_cast<const void *>(a.src));
        tovl_cuda::copy_async_commit();
    }
    __syncthreads();
    if (tid == 1) {
        memcpy(reinterpret_cast<unsigned char *>(a.out), &slot, 16);
    }
    __syncthreads();
    if (tid == 0) {
        tovl_cuda::copy_async_wait<0>();
    }
    __syncthreads();
    if (tid == 1) {
        memcpy(reinterpret_cast<unsigned char *>(a.out) + 16, &slot, 16);
    }
}

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
    TOVL_EMU_THUNK(lmhead_overlay_bf16_row4q, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32_row4q, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_bf16_row4q_few, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32_row4q_few, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_bf16_many, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32_many, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_bf16_small_many, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(lmhead_overlay_f32_small_many, tovl_lmhead_overlay_args),
    TOVL_EMU_THUNK(emu_probe_cp_async, emu_probe_cp_async_args),
};

void set_sm_count(uint32_t sms) {
    tovl_cuda_sm_count = sms;
}

KernelThunk find_kernel(const char *name) {
    for (const auto &k : kernels) {
        if (strcmp(k.name, name) == 0) {
            return k.run;
        }
    }
    return nullptr;
}

} // namespace tovl_emu
