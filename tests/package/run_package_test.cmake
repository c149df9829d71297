# The package test (cmake -P): install the build tree into a temporary prefix, then configure,
# build and run tests/package against it with find_package, and the same consumer with
# pkg-config. Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR, GENERATOR, CXX; SANITIZE (the build's
# ATTNOPS_SANITIZE) and WITH_VULKAN.
#
# Under ASan the consumer gets tests/sanitizers/keep_vulkan_loaded.cpp, as every in-tree program
# does: the Vulkan loader unloads the drivers it opened when the instance is destroyed, before
# LeakSanitizer runs at exit, so a driver's own leak (seen on a Zen 1 machine: 128 bytes from
# realloc) shows as "<unknown module>", which no suppression can name. Kept mapped, its frames
# have names and tests/sanitizers/lsan.supp covers it.
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_package_test.cmake: -D${v}=... is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: ${what} failed (${rc})\n${out}\n${err}")
  endif()
  message(STATUS "package test: ${what}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

set(extra_sources "")
if("${SANITIZE}" MATCHES "address" AND WITH_VULKAN)
  set(extra_sources ${SOURCE_DIR}/tests/sanitizers/keep_vulkan_loaded.cpp)
endif()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
run_step("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run_step("configure consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package -B ${WORK_DIR}/build -G ${GENERATOR}
         -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix}
         "-DATTNOPS_CONSUMER_EXTRA_SOURCES=${extra_sources}")
run_step("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run_step("run consumer" ${WORK_DIR}/build/consumer)
if(NOT last_output MATCHES "consumer: flash_attn2 ran as flash_attn2")
  message(FATAL_ERROR "package test: unexpected consumer output: ${last_output}")
endif()
message(STATUS "${last_output}")

# The installed program runs from the prefix.
if(EXISTS ${prefix}/bin/attnops)
  run_step("installed attnops info" ${prefix}/bin/attnops info)
endif()

# pkg-config, when present: the same consumer compiled by hand.
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  file(GLOB_RECURSE pc_files ${prefix}/*/attnops.pc)
  list(GET pc_files 0 pc_file)
  get_filename_component(pc_dir ${pc_file} DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} ${pc_dir})
  run_step("pkg-config" ${PKG_CONFIG} --cflags --libs --static attnops)
  string(STRIP "${last_output}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(check "")
  if(extra_sources)
    set(check -DATTNOPS_CONSUMER_CHECK_DRIVER_MAPPED)
  endif()
  run_step("build with pkg-config" ${CXX} -O1 ${check} ${SOURCE_DIR}/tests/package/main.cpp
           ${SOURCE_DIR}/tests/package/ext_user.cpp ${extra_sources}
           -o ${WORK_DIR}/consumer_pc ${flags})
  run_step("run pkg-config consumer" ${WORK_DIR}/consumer_pc)
endif()
