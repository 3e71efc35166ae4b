# cmake -DOBJDUMP=... -DOBJS="a.o|b.o|..." -P check_no_fma.cmake
# Fails when any object of the library holds a fused multiply-add instruction
# (vfmadd*, vfmsub*, vfnmadd*, vfnmsub*): the spec's dot rounds every product
# and every sum, which one FMA would not. The AVX-512 file is built with
# -mavx512f, which enables FMA, so only -ffp-contract=off keeps it out; this
# check sees what the compiler really emitted. It also requires vector
# multiplies to be there, so it cannot pass on empty objects.
cmake_minimum_required(VERSION 3.25)
string(REPLACE "|" ";" objs "${OBJS}")
set(fused "")
set(multiplies 0)
foreach(o ${objs})
  execute_process(COMMAND ${OBJDUMP} -d --no-show-raw-insn ${o} OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "objdump -d ${o} failed (${rc})")
  endif()
  string(REGEX MATCHALL "[ \t]v?fn?m(add|sub)[0-9a-z]*[ \t]" hits "${text}")
  if(hits)
    list(LENGTH hits n)
    list(APPEND fused "${o}: ${n}")
  endif()
  string(REGEX MATCHALL "[ \t]v?mulps[ \t]" muls "${text}")
  list(LENGTH muls n)
  math(EXPR multiplies "${multiplies} + ${n}")
endforeach()
if(fused)
  message(FATAL_ERROR "fused multiply-add instructions in: ${fused}")
endif()
if(multiplies LESS 10)
  message(FATAL_ERROR "only ${multiplies} packed multiplies in the library: the CPU fast paths are missing")
endif()
list(LENGTH objs n_objs)
message(STATUS "${n_objs} objects, ${multiplies} packed multiplies, no fused multiply-add")
