# tovl_embed_binary(OUT_C SYMBOL INPUT): generate a C file defining
#   const unsigned char SYMBOL[] (aligned to 16) and const size_t SYMBOL_size
# from a binary INPUT (a CUDA fatbin, a HIP code-object bundle, SPIR-V).
# The generator is a small host program of our own (cmake/bin2c.c).
if(NOT TARGET tovl_bin2c)
  add_executable(tovl_bin2c ${CMAKE_CURRENT_LIST_DIR}/bin2c.c)
endif()

function(tovl_embed_binary OUT_C SYMBOL INPUT)
  add_custom_command(
    OUTPUT ${OUT_C}
    COMMAND tovl_bin2c ${INPUT} ${OUT_C} ${SYMBOL}
    DEPENDS tovl_bin2c ${INPUT}
    COMMENT "Embedding ${INPUT} as ${SYMBOL}"
    VERBATIM)
endfunction()
