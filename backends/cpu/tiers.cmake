# The CPU kernels, compiled once per ISA tier (see backends/cpu/README.md).
#
# Every file of ATTNOPS_CPU_TIER_SOURCES is compiled into one OBJECT library per tier, with that
# tier's target flags and ATTNOPS_TIER_NS=tier_<name> / ATTNOPS_TIER_LEVEL=<0..4>; the sources put
# everything they define inside namespace attnops::cpu::ATTNOPS_TIER_NS, so the tiers' copies
# (inline functions and templates included) never merge at link time. Everything else in the
# library is baseline code and picks a tier at run time (isa.cpp, cpu_dispatch.cpp).
# (OBJECT libraries per tier, not set_source_files_properties: source properties hold one set of
# flags per source and directory.)

set(ATTNOPS_CPU_TIER_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/tiled_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vanilla_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vanilla_decode.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tiled_backward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/paged_stream.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tier_table.cpp
  CACHE INTERNAL "sources compiled once per CPU tier")

# Tiers, lowest first, and their flags (each includes the one below). The AVX-512 tiers and avx2
# split no unaligned 256-bit accesses (GCC's generic tuning would, for old CPUs).
set(ATTNOPS_CPU_TIERS baseline avx2 avx512 avx512bf16 amx CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_LEVEL_baseline 0 CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_LEVEL_avx2 1 CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_LEVEL_avx512 2 CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_LEVEL_avx512bf16 3 CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_LEVEL_amx 4 CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_FLAGS_baseline "" CACHE INTERNAL "")
# GCC splits unaligned 256-bit loads/stores for old CPUs unless told not to; clang (the fuzz
# build) neither does nor knows the flags.
set(_attnops_avx2_extra "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(_attnops_avx2_extra -mno-avx256-split-unaligned-load -mno-avx256-split-unaligned-store)
endif()
set(ATTNOPS_CPU_TIER_FLAGS_avx2 -mavx2 -mfma -mf16c ${_attnops_avx2_extra} CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_FLAGS_avx512 ${ATTNOPS_CPU_TIER_FLAGS_avx2} -mavx512f -mavx512bw -mavx512dq -mavx512vl
    CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_FLAGS_avx512bf16 ${ATTNOPS_CPU_TIER_FLAGS_avx512} -mavx512bf16 CACHE INTERNAL "")
set(ATTNOPS_CPU_TIER_FLAGS_amx ${ATTNOPS_CPU_TIER_FLAGS_avx512bf16} -mamx-tile -mamx-bf16 CACHE INTERNAL "")

# attnops_add_cpu_tier(TARGET tier [NAMESPACE ns] [FLAGS ...] [DEFINES ...] [SOURCES ...]): an
# OBJECT library of ATTNOPS_CPU_TIER_SOURCES (or SOURCES) for `tier` (its level; its flags and
# namespace unless given). Tests use it to build the amx tier's code a second time against
# emulated tiles, and per-tier probes of the vector primitives.
function(attnops_add_cpu_tier target tier)
  cmake_parse_arguments(T "" "NAMESPACE" "FLAGS;DEFINES;SOURCES" ${ARGN})
  if(NOT T_SOURCES)
    set(T_SOURCES ${ATTNOPS_CPU_TIER_SOURCES})
  endif()
  if(NOT T_NAMESPACE)
    set(T_NAMESPACE tier_${tier})
  endif()
  if(NOT DEFINED T_FLAGS)
    set(T_FLAGS ${ATTNOPS_CPU_TIER_FLAGS_${tier}})
  endif()
  add_library(${target} OBJECT ${T_SOURCES})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_compile_features(${target} PRIVATE cxx_std_20)
  target_compile_options(${target} PRIVATE ${T_FLAGS})
  target_compile_definitions(${target} PRIVATE ATTNOPS_TIER_NS=${T_NAMESPACE}
                             ATTNOPS_TIER_LEVEL=${ATTNOPS_CPU_TIER_LEVEL_${tier}} ${T_DEFINES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${target} PRIVATE attnops_warnings OpenMP::OpenMP_CXX)
endfunction()

# x86-64 builds all five tiers; other targets only the baseline.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(ATTNOPS_CPU_BUILD_TIERS ${ATTNOPS_CPU_TIERS} CACHE INTERNAL "CPU tiers in this build")
  target_compile_definitions(attnops PRIVATE ATTNOPS_CPU_X86_TIERS)
else()
  set(ATTNOPS_CPU_BUILD_TIERS baseline CACHE INTERNAL "CPU tiers in this build")
endif()
# Lowest tier first on the link line, after the baseline code: should a link-once symbol still
# be shared by several objects, the copy kept is the first one seen, the most portable
# (tests/tiers/check_tier_symbols.cmake checks that no such symbol exists).
foreach(tier ${ATTNOPS_CPU_BUILD_TIERS})
  attnops_add_cpu_tier(attnops_cpu_${tier} ${tier})
  target_sources(attnops PRIVATE $<TARGET_OBJECTS:attnops_cpu_${tier}>)
endforeach()
