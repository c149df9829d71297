// One ISA's copy of the benchmarks' SGEMM yardstick: Eigen's C = A * B, compiled once per ISA
// (benchkit/CMakeLists.txt: baseline, avx2, avx512 flags) so that a portable build measures the
// machine's real SGEMM, not Eigen's SSE2 code.
//
// Several copies of Eigen's templates in one program would be link-once symbols merged across
// ISAs (the linker keeps one: possibly AVX-512 code for an SSE2 caller). So this file renames
// Eigen's namespace per copy (`Eigen` -> ATTNOPS_EIGEN_NS, e.g. Eigen_sgemm_avx512) before
// including it: every symbol it instantiates lands in that namespace (checked with nm by the
// test benchkit_sgemm_symbols). It is a preprocessor device, not an Eigen feature; no Eigen type may
// cross this file's interface, which is plain pointers.
#if !defined(ATTNOPS_EIGEN_NS) || !defined(ATTNOPS_SGEMM_NS)
#error "benchkit/sgemm_isa.cpp is compiled per ISA by benchkit/CMakeLists.txt"
#endif
#define Eigen ATTNOPS_EIGEN_NS

// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics when Eigen's GEMM is
// instantiated with AVX-512 (a known false positive, GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "benchkit/sgemm_isa.h"

#include <Eigen/Core>

namespace attnops::benchkit::ATTNOPS_SGEMM_NS {

void sgemm(const float* a, const float* b, float* c, int n, int threads) {
  if (threads > 0) Eigen::setNbThreads(threads);
  using Map = Eigen::Map<Eigen::MatrixXf>;
  using ConstMap = Eigen::Map<const Eigen::MatrixXf>;
  Map(c, n, n).noalias() = ConstMap(a, n, n) * ConstMap(b, n, n);
}

}  // namespace attnops::benchkit::ATTNOPS_SGEMM_NS
