# The benchmarks' SGEMM yardstick (cli/sgemm.h), used by `attnops bench` and bench/: Eigen's GEMM
# compiled once per ISA (cli/sgemm_isa.cpp, each copy in its own renamed Eigen namespace) so that
# a portable build measures the machine's SGEMM; cli/sgemm.cpp picks the copy at run time.
# Included by cli/ and bench/ (whichever comes first defines the target).
if(NOT TARGET attnops_sgemm)
  add_library(attnops_sgemm STATIC ${PROJECT_SOURCE_DIR}/cli/sgemm.cpp)
  target_include_directories(attnops_sgemm PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(attnops_sgemm PUBLIC attnops PRIVATE attnops_warnings OpenMP::OpenMP_CXX)
  set(_sgemm_isas baseline)
  if(ATTNOPS_CPU_X86)
    set(_sgemm_isas baseline avx2 avx512)
    target_compile_definitions(attnops_sgemm PRIVATE ATTNOPS_SGEMM_X86)
  endif()
  foreach(isa ${_sgemm_isas})
    add_library(attnops_sgemm_${isa} OBJECT ${PROJECT_SOURCE_DIR}/cli/sgemm_isa.cpp)
    set_target_properties(attnops_sgemm_${isa} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_compile_options(attnops_sgemm_${isa} PRIVATE ${ATTNOPS_CPU_TIER_FLAGS_${isa}})
    target_compile_definitions(attnops_sgemm_${isa} PRIVATE ATTNOPS_EIGEN_NS=Eigen_sgemm_${isa}
                               ATTNOPS_SGEMM_NS=sgemm_${isa})
    target_include_directories(attnops_sgemm_${isa} PRIVATE ${PROJECT_SOURCE_DIR})
    target_link_libraries(attnops_sgemm_${isa} PRIVATE Eigen3::Eigen OpenMP::OpenMP_CXX attnops_warnings)
    target_sources(attnops_sgemm PRIVATE $<TARGET_OBJECTS:attnops_sgemm_${isa}>)
  endforeach()
  set(ATTNOPS_SGEMM_ISAS ${_sgemm_isas} CACHE INTERNAL "ISA copies of the SGEMM yardstick")
endif()
