/* Launch geometry of the HIP backend (see hip_geometry.h and token_overlay_shape.h). */
#include "hip_geometry.h"

#include <stdbool.h>
#include <string.h>

#include "token_overlay_shape.h"
#include "tovl/backend.h"
#include "tovl/kernel_args.h"

_Static_assert(TOVL_HIP_LMHEAD_MAX_COLUMNS == TOVL_HIP_MAX_GRID_YZ, "the kernel's idea of the y cap");
_Static_assert(TOVL_HIP_MAX_GRID_X == 0xFFFFFFFFu / TOVL_HIP_BLOCK_THREADS, "grid limit for the block size");

const char *const tovl_hip_kernel_names[TOVL_HIP_KERNEL_COUNT] = {
    TOVL_KERNEL_ROWDIFF, TOVL_KERNEL_EMBED_OVERLAY, TOVL_KERNEL_LMHEAD_OVERLAY_BF16, TOVL_KERNEL_LMHEAD_OVERLAY_F32};

const size_t tovl_hip_kernel_args_size[TOVL_HIP_KERNEL_COUNT] = {
    sizeof(tovl_rowdiff_args), sizeof(tovl_embed_overlay_args), sizeof(tovl_lmhead_overlay_args),
    sizeof(tovl_lmhead_overlay_args)};

int tovl_hip_kernel_by_name(const char *name) {
    for (int k = 0; k < TOVL_HIP_KERNEL_COUNT; k++) {
        if (strcmp(name, tovl_hip_kernel_names[k]) == 0) {
            return k;
        }
    }
    return -1;
}

tovl_status tovl_hip_check_launch(const char *backend, tovl_kernel kernel, const void *args, size_t args_size,
                                  tovl_hip_kernel_id *out) {
    if (kernel == 0 || kernel > TOVL_HIP_KERNEL_COUNT) {
        return tovl_error(TOVL_ERR_LAUNCH, "%s: launch of unknown kernel handle %llu", backend,
                          (unsigned long long)kernel);
    }
    const tovl_hip_kernel_id k = (tovl_hip_kernel_id)(kernel - 1);
    if (!args || args_size != tovl_hip_kernel_args_size[k]) {
        return tovl_error(TOVL_ERR_LAUNCH, "%s: kernel %s expects %zu bytes of arguments, got %zu", backend,
                          tovl_hip_kernel_names[k], tovl_hip_kernel_args_size[k], args_size);
    }
    *out = k;
    return TOVL_OK;
}

static uint32_t ceil_div(uint32_t a, uint32_t b) {
    return (uint32_t)(((uint64_t)a + b - 1) / b);
}

tovl_status tovl_hip_blocks(tovl_hip_kernel_id kernel, const uint32_t logical[3], const void *args,
                            uint32_t blocks[3]) {
    return tovl_hip_blocks_small_to(kernel, logical, args, TOVL_HIP_LMHEAD_SMALL_MAX_T, blocks);
}

tovl_status tovl_hip_blocks_small_to(tovl_hip_kernel_id kernel, const uint32_t logical[3], const void *args,
                                     uint32_t small_max_t, uint32_t blocks[3]) {
    blocks[0] = logical[0];
    blocks[1] = logical[1];
    blocks[2] = logical[2];
    switch (kernel) {
    case TOVL_HIP_ROWDIFF:
        blocks[0] = ceil_div(logical[0], TOVL_HIP_ROWDIFF_ROWS_PER_BLOCK);
        break;
    case TOVL_HIP_LMHEAD_BF16:
    case TOVL_HIP_LMHEAD_F32: {
        /* The small-batch grid covers max_n, the others the rows the launch
         * is shaped for (kernel_args.h; their blocks loop over the columns
         * past it): the kernel tells the small grid by its height, taller
         * than the others' could be for max_n (token_overlay.hip,
         * lmhead_small_grid). */
        const bool small = logical[0] <= small_max_t;
        const uint32_t max_n = ((const tovl_lmhead_overlay_args *)args)->max_n;
        const uint32_t rows = logical[1] < max_n ? logical[1] : max_n;
        const uint32_t columns = small ? ceil_div(max_n, TOVL_HIP_LMHEAD_SMALL_ROWS)
                                       : ceil_div(rows, TOVL_HIP_LMHEAD_ROWS_PER_BLOCK);
        blocks[1] = columns < TOVL_HIP_MAX_GRID_YZ ? columns : TOVL_HIP_MAX_GRID_YZ;
        break;
    }
    default:
        break;
    }
    if (blocks[0] > TOVL_HIP_MAX_GRID_X || blocks[1] > TOVL_HIP_MAX_GRID_YZ || blocks[2] > TOVL_HIP_MAX_GRID_YZ) {
        return tovl_error(TOVL_ERR_LAUNCH, "hip: kernel %s: grid %u x %u x %u blocks exceeds HIP's (%u x %u x %u)",
                          tovl_hip_kernel_names[kernel], blocks[0], blocks[1], blocks[2], TOVL_HIP_MAX_GRID_X,
                          TOVL_HIP_MAX_GRID_YZ, TOVL_HIP_MAX_GRID_YZ);
    }
    return TOVL_OK;
}
