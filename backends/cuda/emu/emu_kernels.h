/* The emulated kernels by name (emu_kernels.cpp compiles token_overlay.cu for
 * the host). Test-only C++. */
#ifndef TOVL_CUDA_EMU_KERNELS_H
#define TOVL_CUDA_EMU_KERNELS_H

namespace tovl_emu {

/* Runs one thread of a kernel with its argument struct. */
typedef void (*KernelThunk)(const void *args);

/* NULL when token_overlay.cu has no kernel of that name. */
KernelThunk find_kernel(const char *name);

} // namespace tovl_emu

#endif
