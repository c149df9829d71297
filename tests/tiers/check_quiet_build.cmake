# cmake -DCXX=c++ -DFLAGS="a|b|..." -DSOURCE=x.cpp -DOUT=x.o -P check_quiet_build.cmake
#
# Compiles one per-tier source with the flags the build gives tier objects and fails if the compiler
# prints anything: without the quiet flags a fresh build prints dozens of GCC -Wpsabi notes ("the
# ABI for passing parameters with 64-byte alignment has changed") from simd16_generic.h, which a
# newcomer reads as problems (tiers.cmake: ATTNOPS_CPU_TIER_QUIET_FLAGS).
string(REPLACE "|" ";" flags "${FLAGS}")
execute_process(COMMAND ${CXX} ${flags} -c ${SOURCE} -o ${OUT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} failed (${rc}):\n${out}\n${err}")
endif()
if(NOT "${out}${err}" STREQUAL "")
  message(FATAL_ERROR "compiling ${SOURCE} printed diagnostics:\n${out}${err}")
endif()
message(STATUS "${SOURCE}: compiled without a diagnostic")
