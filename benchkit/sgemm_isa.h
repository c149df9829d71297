// The per-ISA copies of the SGEMM yardstick (sgemm_isa.cpp): C = A * B for n x n
// column-major float matrices, on `threads` OpenMP threads (0 = Eigen's default).
#pragma once

namespace attnops::benchkit {

#define ATTNOPS_DECLARE_SGEMM(ns)                                           \
  namespace ns {                                                            \
  void sgemm(const float* a, const float* b, float* c, int n, int threads); \
  }
ATTNOPS_DECLARE_SGEMM(sgemm_baseline)
ATTNOPS_DECLARE_SGEMM(sgemm_avx2)
ATTNOPS_DECLARE_SGEMM(sgemm_avx512)
#undef ATTNOPS_DECLARE_SGEMM

}  // namespace attnops::benchkit
