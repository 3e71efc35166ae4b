/* graph_us(launch): the median per-launch microseconds of 20 replays of a CUDA
 * graph that holds 100 calls of launch(stream), the way tovl bench times a
 * hook (what an engine pays per launch). backend_launch: a launch the way the
 * CUDA backend makes it. Shared by the standalone programs in bench/. */
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_check.h"

/* fn<<<grid, block, 0, stream>>>(args) as backends/cuda/cuda_backend.c
 * launches this port's kernels on sm_90 and newer: with programmatic stream
 * serialization (programmatic dependent launch), so that a launch may start
 * while the one before it finishes. TOVL_CUDA_PDL=0 makes plain launches, as
 * it does in the backend. */
template <class Args>
static void backend_launch(void (*fn)(Args), dim3 grid, dim3 block, cudaStream_t stream, Args args) {
    const char *pdl = getenv("TOVL_CUDA_PDL");
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = pdl && strcmp(pdl, "0") == 0 ? 0 : 1;
    CK(cudaLaunchKernelEx(&config, fn, args));
}

template <class F>
static double graph_us(F launch) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 100; i++) launch(st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st)); /* warm up */
    CK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> us;
    for (int r = 0; r < 20; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us.push_back(ms * 1000.0 / 100.0);
    }
    std::sort(us.begin(), us.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(st));
    return us[us.size() / 2];
}
