# Install + export: headers, the library, the `attnops` program, a CMake package
# (find_package(attnops CONFIG) -> attnops::attnops) and a pkg-config file (attnops.pc).
include(CMakePackageConfigHelpers)

set(ATTNOPS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/attnops CACHE STRING "Where attnopsConfig.cmake is installed")

# attnops_warnings is a PRIVATE dependency of attnops; a static library still names it (as
# $<LINK_ONLY:...>) in its exported link interface, so it is exported too (it carries only
# compile options, which LINK_ONLY keeps away from consumers).
# INCLUDES DESTINATION gives the installed target its include directory (the top-level
# $<INSTALL_INTERFACE:...> is evaluated before GNUInstallDirs is included).
install(TARGETS attnops attnops_warnings EXPORT attnopsTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/attnops DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET attnops_cli)
  install(TARGETS attnops_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT attnopsTargets NAMESPACE attnops:: DESTINATION ${ATTNOPS_CMAKE_DIR})

# What a consumer must find for the link interface: a static library drags its private
# dependencies along (OpenMP, yaml-cpp, Vulkan when the backend is built); a
# shared one does not.
get_target_property(_attnops_type attnops TYPE)
get_target_property(_attnops_links attnops LINK_LIBRARIES)
set(ATTNOPS_STATIC_DEPS OFF)
if(_attnops_type STREQUAL "STATIC_LIBRARY")
  set(ATTNOPS_STATIC_DEPS ON)
endif()
set(ATTNOPS_NEEDS_VULKAN OFF)
if("Vulkan::Vulkan" IN_LIST _attnops_links)
  set(ATTNOPS_NEEDS_VULKAN ON)
endif()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/attnopsConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/attnopsConfig.cmake
  INSTALL_DESTINATION ${ATTNOPS_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/attnopsConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/attnopsConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/attnopsConfigVersion.cmake
  DESTINATION ${ATTNOPS_CMAKE_DIR})

# pkg-config: the prefix is found relative to the .pc file (${pcfiledir}), so the file stays
# right when `cmake --install --prefix` puts the tree somewhere else.
file(RELATIVE_PATH ATTNOPS_PC_TO_PREFIX /__prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /__prefix)
string(REGEX REPLACE "/$" "" ATTNOPS_PC_TO_PREFIX "${ATTNOPS_PC_TO_PREFIX}")
set(ATTNOPS_PC_REQUIRES_PRIVATE "yaml-cpp")
if(ATTNOPS_NEEDS_VULKAN)
  string(APPEND ATTNOPS_PC_REQUIRES_PRIVATE " vulkan")
endif()
# A sanitized build (cmake/sanitizers.cmake) needs its sanitizer runtime in the consumer too.
string(JOIN " " ATTNOPS_PC_LIBS_PRIVATE ${OpenMP_CXX_FLAGS} ${ATTNOPS_SANITIZE_LINK})
configure_file(${CMAKE_CURRENT_LIST_DIR}/attnops.pc.in ${CMAKE_CURRENT_BINARY_DIR}/attnops.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/attnops.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
