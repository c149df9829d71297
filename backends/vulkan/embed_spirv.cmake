# Turns a SPIR-V binary into a C++ source holding it as a uint32 array (run with cmake -P).
#   cmake -DINPUT=x.spv -DOUTPUT=x_spv.cpp -DSYMBOL=kSpirvX -P embed_spirv.cmake
# SPIR-V is a stream of little-endian 32-bit words, so bytes b0 b1 b2 b3 become 0xb3b2b1b0.
foreach(var INPUT OUTPUT SYMBOL)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed_spirv.cmake: -D${var}=... is required")
  endif()
endforeach()
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" nchars)
math(EXPR rem "${nchars} % 8")
if(nchars EQUAL 0 OR NOT rem EQUAL 0)
  message(FATAL_ERROR "embed_spirv.cmake: ${INPUT} is not a whole number of 32-bit words (${nchars} hex digits)")
endif()
math(EXPR nwords "${nchars} / 8")
string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1u," words "${hex}")
# Eight words a line keeps the generated file readable (CMake regexes have no {n}).
set(w "0x........u,")
string(REGEX REPLACE "(${w}${w}${w}${w}${w}${w}${w}${w})" "\\1\n  " words "${words}")
get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${name} by embed_spirv.cmake; do not edit.\n"
  "#include <cstddef>\n#include <cstdint>\n\n"
  "namespace attnops::vulkan::spirv {\n"
  "extern const std::uint32_t ${SYMBOL}[];\n"
  "extern const std::size_t ${SYMBOL}_words;\n"
  "const std::uint32_t ${SYMBOL}[] = {\n  ${words}\n};\n"
  "const std::size_t ${SYMBOL}_words = ${nwords};\n"
  "}  // namespace attnops::vulkan::spirv\n")
# Only touch the output when it changed, so that a reformatting-only shader edit that yields the
# same SPIR-V does not recompile anything downstream.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
