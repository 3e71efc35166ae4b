# cmake -DBUNDLE=... -DBUNDLER=... -DOBJDUMP=... -DTARGETS=gfxA,gfxB -DWORK=dir
#       [-DEXPECT=fused] -P check_code_objects.cmake
#
# Unbundles each target's code object and disassembles the four kernels. The
# spec's dot order rounds every product and every sum, so rowdiff and
# embed_overlay may hold no fused f32 multiply-add at all (v_fma*, v_fmac*,
# v_mac*, v_mad*_f32, their VOPD and packed forms, v_dot*). The lm_head
# kernels fuse in one place, the tiles' range-proven loop (token_overlay.hip,
# TileRange), as correctly rounded f32 fmas: v_fma_f32, v_fmac_f32,
# v_pk_fma_f32, v_dual_fmac_f32 and no other fused form. Everything else in
# them stays unfused (the tiles' fallback and partial chunk, the row and
# small-batch paths), so each must show f32 multiplies and adds, more
# multiplies than fused instructions: contraction of the unfused paths would
# turn most multiplies into fmas, and an empty or wrong disassembly cannot
# pass. EXPECT=fused checks a bundle built with contraction on: in every
# target the check must see it (some kernel breaks those rules).
cmake_minimum_required(VERSION 3.25) # quoted if() arguments are strings, not variables
foreach(var BUNDLE BUNDLER OBJDUMP TARGETS WORK)
  if(NOT ${var})
    message(FATAL_ERROR "check_code_objects: ${var} not given")
  endif()
endforeach()
# The tools are found at configure time; a build carried to a machine without
# them (the GPU machine) skips (tests/hip.cmake: SKIP_REGULAR_EXPRESSION).
foreach(tool ${BUNDLER} ${OBJDUMP})
  if(NOT EXISTS ${tool})
    message("tovl-skip: ${tool} is not on this machine")
    return()
  endif()
endforeach()
set(fused_re "v_(pk_|dual_)?(fma|fmac|mac|mad|fmaak|fmamk|madak|madmk)[a-z0-9_]*_f(16|32|64)|v_(fma|mad)_mix|v_dot[0-9]")
set(proven_re "^v_(pk_|dual_)?fmac?_f32$") # the forms of __fmaf_rn (one rounding)
set(kernels rowdiff embed_overlay lmhead_overlay_bf16 lmhead_overlay_f32)
string(REPLACE "," ";" targets "${TARGETS}")
file(MAKE_DIRECTORY ${WORK})
set(failures "")
foreach(t ${targets})
  set(object ${WORK}/${t}.co)
  execute_process(
    COMMAND ${BUNDLER} --unbundle --type=o --input=${BUNDLE} --targets=hipv4-amdgcn-amd-amdhsa--${t} --output=${object}
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${t}: clang-offload-bundler could not unbundle it: ${err}")
  endif()
  execute_process(COMMAND ${OBJDUMP} -d --mcpu=${t} ${object}
    RESULT_VARIABLE rc OUTPUT_VARIABLE asm ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${t}: llvm-objdump failed: ${err}")
  endif()
  set(broken "") # what this target's code breaks
  foreach(k ${kernels})
    string(FIND "${asm}" "<${k}>:\n" start)
    if(start EQUAL -1)
      list(APPEND failures "${t}: no code for ${k} in the disassembly")
      continue()
    endif()
    string(SUBSTRING "${asm}" ${start} -1 body)
    string(FIND "${body}" "\n\n" end)
    if(NOT end EQUAL -1)
      string(SUBSTRING "${body}" 0 ${end} body)
    endif()
    string(REGEX MATCHALL "${fused_re}" fused "${body}")
    list(LENGTH fused n_fused)
    string(REGEX MATCHALL "v_(pk_|dual_)?mul_f32" muls "${body}")
    string(REGEX MATCHALL "v_(pk_|dual_)?add_f32" adds "${body}")
    list(LENGTH muls n_mul)
    list(LENGTH adds n_add)
    set(forms "${fused}")
    if(forms)
      list(REMOVE_DUPLICATES forms)
    endif()
    if(NOT k MATCHES "^lmhead")
      if(n_fused GREATER 0)
        list(APPEND broken "${k}: ${n_fused} fused instructions (${forms}) where none may be")
      endif()
    else()
      foreach(f ${forms})
        if(NOT f MATCHES "${proven_re}")
          list(APPEND broken "${k}: ${f}, not a form of the tiles' proven fma")
        endif()
      endforeach()
      if(n_mul EQUAL 0 OR n_add EQUAL 0)
        list(APPEND broken "${k}: no v_mul_f32/v_add_f32 at all: the unfused paths are missing or the disassembly is not what was expected")
      elseif(NOT n_mul GREATER n_fused)
        list(APPEND broken "${k}: ${n_fused} fused instructions against ${n_mul} f32 multiplies: the unfused paths were contracted")
      endif()
    endif()
    message(STATUS "${t} ${k}: ${n_mul} f32 multiplies, ${n_add} f32 adds, ${n_fused} fused (${forms})")
  endforeach()
  if(EXPECT STREQUAL "fused")
    if(broken)
      string(REPLACE ";" "; " text "${broken}")
      message(STATUS "${t}: contraction on is seen: ${text}")
    else()
      list(APPEND failures "${t}: contraction on, yet every kernel passes: the check is blind")
    endif()
  else()
    foreach(b ${broken})
      list(APPEND failures "${t} ${b}")
    endforeach()
  endif()
endforeach()
if(failures)
  string(REPLACE ";" "\n  " text "${failures}")
  message(FATAL_ERROR "check_code_objects:\n  ${text}")
endif()
