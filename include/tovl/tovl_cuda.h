/*
 * The CUDA backend's own entry points (optional header). The backend is also
 * reachable through tovl_backend_open("cuda") (device: TOVL_CUDA_DEVICE, an
 * index, default 0; its primary context). The driver is loaded at run time
 * from libcuda.so.1, or from the library TOVL_CUDA_DRIVER names (e.g. a
 * forward-compatibility libcuda); without one the backend is unavailable and
 * tovl_last_error() says why.
 *
 * No CUDA header is needed: contexts are passed as void *. Streams given to
 * the hooks are CUstreams of the backend's context; NULL is the backend's own
 * (non-blocking) stream. tovl_download and tovl_synchronize(NULL) order after
 * the backend's own stream only: synchronize an engine stream first.
 */
#ifndef TOVL_TOVL_CUDA_H
#define TOVL_TOVL_CUDA_H

#include <stddef.h>

#include "tovl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA backend on the caller's existing CUcontext (not retained: it must
 * outlive the backend), so the hooks can run on the engine's streams. */
TOVL_API tovl_status tovl_cuda_backend_wrap(void *cu_context, tovl_backend **out);

/* A CUDA backend (device and context as tovl_backend_open("cuda")) that loads
 * `image` (a cubin, fatbin or NUL-terminated PTX of `size` bytes, used only
 * during the call) instead of the embedded fatbin: a verification entry, e.g.
 * to run another port's kernel source compiled for this GPU through the
 * conformance suite. `label` (may be NULL) names the image in messages and in
 * tovl_backend_property(be, "module").
 *
 * Kernels are looked up by their spec names; a missing one is handle 0. A
 * module built from this port's source (it defines `tovl_cuda_port_abi`) is
 * launched with this port's shapes. Any other module is launched one block of
 * 256 x 1 threads per point of the core's logical grid (rowdiff (rows,1,1),
 * embed_overlay (T,1,1), lmhead_overlay_* (T,rows,1) with rows the overlay
 * rows the launch is shaped for: max_n, or fewer for a fixed-shape set, whose
 * kernels loop over the rows past their grid (kernel_args.h); the argument
 * struct by value), unless it defines, next to a kernel K, a global
 *     extern "C" __device__ const unsigned int K_launch[4] =
 *         {block_x, block_y, items_x, items_y};
 * then its blocks have block_x x block_y threads and each covers items_x x
 * items_y points of the logical grid: grid = (ceil(gx / items_x),
 * ceil(gy / items_y), 1); and when it also defines
 *     extern "C" __device__ const unsigned int K_launch_small[5] =
 *         {max_x, block_x, block_y, items_x, items_y};
 * a logical grid of 1 to max_x points in x (lm_head: T) takes that shape
 * instead, over (T,max_n,1) (the HIP port's small-batch grid: its kernel
 * tells the two apart by the grid's height against max_n). This port's
 * modules are launched with
 * programmatic dependent launch (sm_90 and newer): their kernels wait for the
 * kernel before them. Another module is too when it defines
 *     extern "C" __device__ const unsigned int tovl_cuda_dependent_launch = 1;
 * promising that each of its kernels executes griddepcontrol.wait before it
 * reads or writes anything but the overlay set's own tables (the HIP port
 * through backends/hip/hip_on_cuda.h does); otherwise it is launched plainly.
 * TOVL_CUDA_PDL=0 launches every module plainly. */
TOVL_API tovl_status tovl_cuda_backend_open_image(const void *image, size_t size, const char *label,
                                                  tovl_backend **out);

#ifdef __cplusplus
}
#endif
#endif /* TOVL_TOVL_CUDA_H */
