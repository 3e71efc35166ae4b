# Vocab-parallel shard sets (issue 24), included by tests/CMakeLists.txt after
# cuda.cmake:
#   test_tp            the library on every backend present, and on the CUDA
#                      kernels' host emulation when tests/cuda.cmake built it;
#   test_tp_cli_BACKEND  `tovl run --tp N` writes the same file as --tp 1
#                      (fixtures tied and untied, padded and not, bf16 and f32
#                      logits, N = 2 .. 8 and 16), and `tovl inspect --tp N`
#                      lists shards whose cells add up to the lm_head's;
#   test_tp_bench_BACKEND `tovl bench --tp 3` checks its shards (cpu, lavapipe).
# The last two run this file as a script: cmake -DTOVL=... -DFIXTURES=...
# -DWORK=... -DBACKEND=... [-DMODE=bench] [-DPRELOAD=...] -P tp.cmake

if(CMAKE_SCRIPT_MODE_FILE)
  # PRELOAD (sanitizer builds): the environment entry the tovl processes
  # alone run with (tests/hardening.cmake's driver-module shim), not cmake.
  set(tovl ${TOVL})
  if(PRELOAD)
    set(tovl ${CMAKE_COMMAND} -E env "${PRELOAD}" ${TOVL})
  endif()
  if(MODE STREQUAL "bench")
    execute_process(COMMAND ${tovl} bench --backend ${BACKEND} --tp 3 --quick --tokens 8 --batch 1 --repeats 2
                    RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
    message("${stdout}${stderr}")
    if(NOT rc EQUAL 0 OR NOT stdout MATCHES "equal the unsharded set \\(4 checks; from_slots and fixed-shape")
      message(FATAL_ERROR "tovl bench --tp 3 --backend ${BACKEND}: exit ${rc}, or the shards' check is missing")
    endif()
    return()
  endif()
  # case dir, base dir, padded vocab (0: config vocab_size)
  set(cases "mts_both_untied bases/untied 0" "tt_dict_both_tied_diff bases/tied 0"
            "vllm_untied bases/untied 136" "tt_resized_tied bases/tied 136" "mts_lm_tied bases/tied 0")
  file(MAKE_DIRECTORY ${WORK})
  set(compared 0)
  foreach(c ${cases})
    separate_arguments(c)
    list(GET c 0 case)
    list(GET c 1 base)
    list(GET c 2 vocab)
    foreach(logits bf16 f32)
      foreach(tp 1 2 3 4 5 6 7 8 16)
        set(out ${WORK}/${case}-${logits}-tp${tp}.safetensors)
        execute_process(
          COMMAND ${tovl} run --backend ${BACKEND} --base ${FIXTURES}/${base} --adapter ${FIXTURES}/${case}/adapter
                  --batch ${FIXTURES}/${case}/expected.safetensors --out ${out} --vocab ${vocab} --logits ${logits}
                  --tp ${tp}
          RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
        if(NOT rc EQUAL 0)
          message(FATAL_ERROR "${case} ${logits} --tp ${tp}: tovl run exited ${rc}: ${stderr}")
        endif()
        if(tp GREATER 1)
          execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/${case}-${logits}-tp1.safetensors ${out}
                          RESULT_VARIABLE same)
          if(NOT same EQUAL 0)
            message(FATAL_ERROR "${case} ${logits}: the output of --tp ${tp} differs from --tp 1 (${out})")
          endif()
          math(EXPR compared "${compared} + 1")
        endif()
      endforeach()
    endforeach()
  endforeach()
  # inspect --tp N: the shards' cells add up to the adapter's lm_head cells,
  # each shard inside the padded vocab, in order.
  foreach(c ${cases})
    separate_arguments(c)
    list(GET c 0 case)
    list(GET c 1 base)
    list(GET c 2 vocab)
    foreach(tp 1 2 3 4 8)
      execute_process(
        COMMAND ${tovl} inspect ${FIXTURES}/${case}/adapter --base ${FIXTURES}/${base} --vocab ${vocab}
                --backend ${BACKEND} --tp ${tp} --json
        RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE stderr)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "${case}: tovl inspect --tp ${tp} exited ${rc}: ${stderr}")
      endif()
      string(JSON want GET "${json}" lm_head count)
      string(JSON n LENGTH "${json}" tp shards)
      if(NOT n EQUAL tp)
        message(FATAL_ERROR "${case}: inspect --tp ${tp} lists ${n} shards")
      endif()
      set(sum 0)
      set(next 0)
      math(EXPR last "${tp} - 1")
      foreach(r RANGE ${last})
        string(JSON cells GET "${json}" tp shards ${r} lmhead_cells)
        string(JSON start GET "${json}" tp shards ${r} start)
        string(JSON end GET "${json}" tp shards ${r} end)
        if(NOT start EQUAL next OR end LESS start)
          message(FATAL_ERROR "${case}: inspect --tp ${tp}: rank ${r} is [${start}, ${end}) after ${next}")
        endif()
        set(next ${end})
        math(EXPR sum "${sum} + ${cells}")
      endforeach()
      if(NOT sum EQUAL want)
        message(FATAL_ERROR "${case}: inspect --tp ${tp}: the shards hold ${sum} cells, the lm_head ${want}")
      endif()
    endforeach()
  endforeach()
  message(STATUS "tovl run --backend ${BACKEND}: ${compared} outputs of --tp N identical to --tp 1")
  return()
endif()

tovl_add_test(test_tp test_tp.c)
if(TARGET tovl_cuda_emu)
  target_compile_definitions(test_tp PRIVATE TOVL_TP_WITH_EMU=1)
  target_link_libraries(test_tp PRIVATE tovl_cuda_emu)
endif()

if(TARGET tovl_cli)
  set(tp_cli_backends cpu)
  if(TOVL_HAVE_VULKAN)
    list(APPEND tp_cli_backends vulkan)
  endif()
  set(tp_preload "")
  if(TOVL_SANITIZER_PRELOAD) # set by hardening.cmake in sanitizer builds
    set(tp_preload "-DPRELOAD=${TOVL_SANITIZER_PRELOAD}")
  endif()
  foreach(b ${tp_cli_backends})
    add_test(NAME test_tp_cli_${b}
      COMMAND ${CMAKE_COMMAND} -DTOVL=$<TARGET_FILE:tovl_cli> -DFIXTURES=${CMAKE_CURRENT_SOURCE_DIR}/fixtures/peft_extra
              -DWORK=${CMAKE_CURRENT_BINARY_DIR}/tp_cli_${b} -DBACKEND=${b} ${tp_preload} -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(test_tp_cli_${b} PROPERTIES TIMEOUT 600)
  endforeach()
  # `tovl bench --tp` (scripts/gpu/tp.sh's timing run) at one small batch:
  # its bit-for-bit check of the shards must pass.
  foreach(b ${tp_cli_backends})
    add_test(NAME test_tp_bench_${b}
      COMMAND ${CMAKE_COMMAND} -DTOVL=$<TARGET_FILE:tovl_cli> -DMODE=bench -DBACKEND=${b} ${tp_preload}
              -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(test_tp_bench_${b} PROPERTIES TIMEOUT 600)
  endforeach()
endif()
