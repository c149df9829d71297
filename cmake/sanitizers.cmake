# Sanitizer and fuzzer builds (CI stages `asan`, `tsan`, `fuzz` in .ci/run; scripts/dev.sh).
#
#   -DATTNOPS_SANITIZE=address,undefined   ASan + UBSan on every target of the project
#   -DATTNOPS_SANITIZE=thread              TSan (not combinable with address)
#   -DATTNOPS_FUZZ=ON                      libFuzzer targets in fuzz/ (clang only); every target is
#                                          compiled with coverage (-fsanitize=fuzzer-no-link)
#
# The flags go on every target of this project (add_compile_options/add_link_options: the tests'
# own code must be checked too, see the range-for over a temporary that ASan found in test code).
# A sanitized static libattnops.a needs the sanitizer runtime in whatever links it, so the flags
# are also part of the installed target's link interface and of attnops.pc (ATTNOPS_SANITIZE_LINK).
# Run-time options (halt_on_error, the LSan suppressions for lavapipe and the validation layer)
# come from the environment: scripts/dev.sh sets them, see tests/sanitizers/README.md.
set(ATTNOPS_SANITIZE "" CACHE STRING "Sanitizers for every target (-fsanitize=...): address,undefined | thread | empty")
option(ATTNOPS_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang and libFuzzer)" OFF)

set(ATTNOPS_SANITIZE_LINK "")
if(ATTNOPS_SANITIZE)
  string(REPLACE "," ";" _attnops_san_list "${ATTNOPS_SANITIZE}")
  foreach(s IN LISTS _attnops_san_list)
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "ATTNOPS_SANITIZE: unknown sanitizer '${s}' (expected address, undefined, thread, leak)")
    endif()
  endforeach()
  if("thread" IN_LIST _attnops_san_list AND ("address" IN_LIST _attnops_san_list OR "leak" IN_LIST _attnops_san_list))
    message(FATAL_ERROR "ATTNOPS_SANITIZE: thread cannot be combined with address or leak")
  endif()
  # -g1: file:line in reports at little build cost; frame pointers: fast, complete stacks.
  add_compile_options(-fsanitize=${ATTNOPS_SANITIZE} -fno-omit-frame-pointer -g1)
  if("undefined" IN_LIST _attnops_san_list)
    # Every UB report is fatal (as UBSAN_OPTIONS=halt_on_error=1, also without the environment).
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
  set(ATTNOPS_SANITIZE_LINK -fsanitize=${ATTNOPS_SANITIZE})
  add_link_options(${ATTNOPS_SANITIZE_LINK})
  message(STATUS "attnops: sanitizers ${ATTNOPS_SANITIZE}")
endif()

# Host code that is not a kernel (the CLI, the tests) is compiled at -O1 in a sanitized build:
# with ASan+UBSan its CLI11 / GoogleMock templates took half of that build's ~1000 s on 2 cores
# at -O3, and its speed does not matter. The library and its kernels keep the build type's flags
# (the tests run them at full speed). The last -O on the command line wins.
function(attnops_sanitized_host_code target)
  if(ATTNOPS_SANITIZE)
    target_compile_options(${target} PRIVATE -O1)
  endif()
endfunction()

if(ATTNOPS_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ATTNOPS_FUZZ needs clang (libFuzzer), e.g. -DCMAKE_CXX_COMPILER=clang++-14")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
