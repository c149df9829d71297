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
  ${CMAKE_CURRENT_LIST_DIR}/tiled_backward_dkv.cpp
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

# GCC notes (-Wpsabi, "the ABI for passing parameters with 64-byte alignment has changed") each
# function of the baseline tier that passes its 64-byte vectors (simd16_generic.h) by value:
# dozens in a fresh build. Those functions are inline and private to the tier's namespace, so
# only code compiled with the same flags calls them and the ABI difference cannot matter. The
# note is not a warning, so `#pragma GCC diagnostic` cannot silence it; the flag does
# (tests/tiers: cpu_tier_build_is_quiet).
set(ATTNOPS_CPU_TIER_QUIET_FLAGS "" CACHE INTERNAL "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(ATTNOPS_CPU_TIER_QUIET_FLAGS -Wno-psabi CACHE INTERNAL "")
endif()

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
  target_compile_options(${target} PRIVATE ${T_FLAGS} ${ATTNOPS_CPU_TIER_QUIET_FLAGS})
  target_compile_definitions(${target} PRIVATE ATTNOPS_TIER_NS=${T_NAMESPACE}
                             ATTNOPS_TIER_LEVEL=${ATTNOPS_CPU_TIER_LEVEL_${tier}} ${T_DEFINES})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${target} PRIVATE attnops_warnings OpenMP::OpenMP_CXX)
endfunction()

# x86-64 builds all five tiers; other targets only the baseline. ATTNOPS_CPU_TIER_SET=host builds
# the baseline up to the best tier the configuring machine runs (its /proc/cpuinfo flags): the
# sanitizer stage's build, which runs its tests on that machine only (on an AVX2-only CPU: 2 tier
# objects of each kernel source instead of 5). At run time the best compiled tier at or below
# what the CPU runs is chosen (isa.cpp), so such a binary still runs anywhere.
set(ATTNOPS_CPU_TIER_SET "all" CACHE STRING "CPU ISA tiers to build: all, or host (up to this machine's best)")
set_property(CACHE ATTNOPS_CPU_TIER_SET PROPERTY STRINGS all host)
if(NOT ATTNOPS_CPU_TIER_SET MATCHES "^(all|host)$")
  message(FATAL_ERROR "ATTNOPS_CPU_TIER_SET: expected all or host, got '${ATTNOPS_CPU_TIER_SET}'")
endif()
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(ATTNOPS_CPU_X86 ON CACHE INTERNAL "x86-64 build: the ISA tiers above baseline exist")
  target_compile_definitions(attnops_backends PRIVATE ATTNOPS_CPU_X86_TIERS)
  set(_attnops_tiers ${ATTNOPS_CPU_TIERS})
  # ATTNOPS_CPU_HOST_FLAGS stands in for /proc/cpuinfo's flags (to build another machine's set).
  set(ATTNOPS_CPU_HOST_FLAGS "" CACHE STRING "CPU flags for ATTNOPS_CPU_TIER_SET=host (default: /proc/cpuinfo)")
  mark_as_advanced(ATTNOPS_CPU_HOST_FLAGS)
  set(_attnops_flags "${ATTNOPS_CPU_HOST_FLAGS}")
  if(NOT _attnops_flags AND EXISTS /proc/cpuinfo)
    file(STRINGS /proc/cpuinfo _attnops_flags REGEX "^flags" LIMIT_COUNT 1)
  endif()
  if(ATTNOPS_CPU_TIER_SET STREQUAL "host" AND _attnops_flags)
    set(_attnops_tiers baseline)
    foreach(step "avx2:avx avx2 fma f16c" "avx512:avx512f avx512bw avx512dq avx512vl" "avx512bf16:avx512_bf16"
            "amx:amx_tile amx_bf16")
      string(REPLACE ":" ";" step "${step}")
      list(GET step 0 tier)
      list(GET step 1 needs)
      string(REPLACE " " ";" needs "${needs}")
      set(ok ON)
      foreach(flag ${needs})
        if(NOT " ${_attnops_flags} " MATCHES " ${flag} ")
          set(ok OFF)
        endif()
      endforeach()
      if(NOT ok)
        break()
      endif()
      list(APPEND _attnops_tiers ${tier})
    endforeach()
    message(STATUS "attnops: CPU tiers for this machine only: ${_attnops_tiers}")
  endif()
  set(ATTNOPS_CPU_BUILD_TIERS ${_attnops_tiers} CACHE INTERNAL "CPU tiers in this build")
else()
  set(ATTNOPS_CPU_X86 OFF CACHE INTERNAL "")
  set(ATTNOPS_CPU_BUILD_TIERS baseline CACHE INTERNAL "CPU tiers in this build")
endif()
# The tiers in this build as a bit mask (bit i: the tier of level i), for isa.cpp, cpu_dispatch.cpp
# and the tests that reach every tier's objects.
set(_attnops_mask 0)
foreach(tier ${ATTNOPS_CPU_BUILD_TIERS})
  math(EXPR _attnops_mask "${_attnops_mask} | (1 << ${ATTNOPS_CPU_TIER_LEVEL_${tier}})")
endforeach()
set(ATTNOPS_CPU_BUILT_TIERS_MASK ${_attnops_mask} CACHE INTERNAL "bit i: the tier of level i is built")
target_compile_definitions(attnops_backends PRIVATE ATTNOPS_CPU_BUILT_TIERS=${ATTNOPS_CPU_BUILT_TIERS_MASK})
# Lowest tier first on the link line, after the baseline code: should a link-once symbol still
# be shared by several objects, the copy kept is the first one seen, the most portable
# (tests/tiers/check_tier_symbols.cmake checks that no such symbol exists).
foreach(tier ${ATTNOPS_CPU_BUILD_TIERS})
  attnops_add_cpu_tier(attnops_cpu_${tier} ${tier})
  attnops_layer_objects(backends attnops_cpu_${tier})
endforeach()
