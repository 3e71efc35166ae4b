/*
 * The CUDA port of the four token-overlay kernels (docs/SPEC.md), compiled by
 * nvcc into one fatbin that the backend embeds and loads with
 * cuModuleLoadData. Each kernel is extern "C", takes its argument struct of
 * include/tovl/kernel_args.h by value, and lives in its own file under
 * kernels/; launch shapes are in launch_shape.h.
 *
 * Built with --fmad=false -ftz=false -prec-div=true -prec-sqrt=true: no
 * product is fused into an add and subnormals are kept, as the spec's dot
 * order needs (the dot itself also spells out __fmul_rn / __fadd_rn).
 */
#include "kernels/common.cuh"
#include "kernels/embed_overlay.cuh"
#include "kernels/lmhead_overlay.cuh"
#include "kernels/lmhead_row.cuh"
#include "kernels/rowdiff.cuh"

/* Marks a module as this port's, so the host launches it with this port's
 * shapes (see launch_shape.h). */
#if !defined(TOVL_CUDA_EMU)
extern "C" __device__ unsigned int tovl_cuda_port_abi = TOVL_CUDA_PORT_ABI;
#endif
