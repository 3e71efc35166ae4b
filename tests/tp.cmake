# Vocab-parallel shard sets (issue 24), included by tests/CMakeLists.txt after
# cuda.cmake: on every backend present, and on the CUDA kernels' host
# emulation when tests/cuda.cmake built it.
tovl_add_test(test_tp test_tp.c)
if(TARGET tovl_cuda_emu)
  target_compile_definitions(test_tp PRIVATE TOVL_TP_WITH_EMU=1)
  target_link_libraries(test_tp PRIVATE tovl_cuda_emu)
endif()
