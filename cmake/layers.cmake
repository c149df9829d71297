# The library's layers as targets of their own: core -> backends -> operators -> registry, and
# config (read by the registry) on core. Each layer is an OBJECT library (attnops_<layer>) whose
# objects are gathered into the one installed library, attnops; consumers see no difference.
#
# A wrong dependency must fail the build, not wait for review: with ATTNOPS_CHECK_LAYERS each
# layer is also linked as a shared library (attnops_<layer>_check) with -Wl,--no-undefined against
# the check libraries of the layers below it only, so a call into a layer above (core calling the
# registry, a backend calling an operator) is an undefined symbol there. Sanitizer and fuzz builds
# skip it: their runtimes are not linked into shared libraries, and the default build checks the
# same code.
set(_attnops_check_default ON)
if(ATTNOPS_SANITIZE OR ATTNOPS_FUZZ OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
  set(_attnops_check_default OFF)
endif()
option(ATTNOPS_CHECK_LAYERS "Link each layer alone against the layers below it (fails on a wrong dependency)"
       ${_attnops_check_default})

# attnops_add_layer(name [BELOW lower ...]): the OBJECT library attnops_<name>, compiled as the
# library's own code, its objects part of attnops. BELOW: the layers it may call (all of them,
# not only the next one: the check libraries are linked without transitive dependencies).
function(attnops_add_layer name)
  cmake_parse_arguments(L "" "" "BELOW" ${ARGN})
  set(t attnops_${name})
  add_library(${t} OBJECT)
  set_target_properties(${t} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_compile_features(${t} PRIVATE cxx_std_20)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR})
  target_link_libraries(${t} PRIVATE attnops_warnings OpenMP::OpenMP_CXX yaml-cpp)
  if(ATTNOPS_NATIVE_ARCH)
    target_compile_options(${t} PRIVATE -march=native)
  endif()
  target_sources(attnops PRIVATE $<TARGET_OBJECTS:${t}>)
  set_property(GLOBAL APPEND PROPERTY ATTNOPS_LAYERS ${name})
  set_property(GLOBAL PROPERTY ATTNOPS_LAYER_BELOW_${name} ${L_BELOW})
endfunction()

# Objects built by another OBJECT library that belong to `layer` (the CPU tiers' kernels).
function(attnops_layer_objects layer objects_target)
  target_sources(attnops PRIVATE $<TARGET_OBJECTS:${objects_target}>)
  set_property(GLOBAL APPEND PROPERTY ATTNOPS_LAYER_EXTRA_${layer} ${objects_target})
endfunction()

# External libraries a layer's objects call (for its check library).
function(attnops_layer_link layer)
  set_property(GLOBAL APPEND PROPERTY ATTNOPS_LAYER_LINK_${layer} ${ARGN})
endfunction()

# Called once every layer has its sources: the check libraries (see the top of this file).
function(attnops_check_layers)
  if(NOT ATTNOPS_CHECK_LAYERS)
    return()
  endif()
  get_property(layers GLOBAL PROPERTY ATTNOPS_LAYERS)
  foreach(name IN LISTS layers)
    get_property(below GLOBAL PROPERTY ATTNOPS_LAYER_BELOW_${name})
    get_property(extra GLOBAL PROPERTY ATTNOPS_LAYER_EXTRA_${name})
    get_property(links GLOBAL PROPERTY ATTNOPS_LAYER_LINK_${name})
    set(t attnops_${name}_check)
    add_library(${t} SHARED $<TARGET_OBJECTS:attnops_${name}>)
    foreach(x IN LISTS extra)
      target_sources(${t} PRIVATE $<TARGET_OBJECTS:${x}>)
    endforeach()
    set_target_properties(${t} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/layer_check)
    set(lower)
    foreach(b IN LISTS below)
      list(APPEND lower attnops_${b}_check)
    endforeach()
    target_link_libraries(${t} PRIVATE ${lower} OpenMP::OpenMP_CXX ${links})
    target_link_options(${t} PRIVATE -Wl,--no-undefined)
  endforeach()
endfunction()
