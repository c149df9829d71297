// The SGEMM yardstick of the bench binaries: Eigen's n x n x n product on all OpenMP threads, so
// that attention rows can be quoted as a ratio to a rate measured in the same run.
#pragma once

#include <omp.h>

// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 intrinsics as Eigen's
// GEMM inlines them (GCC bug 105593); the warning is about the compiler's header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <benchmark/benchmark.h>

#include <Eigen/Dense>

namespace attnops::bench {

// Counter GFLOPs: 2 * n^3 / time; n = state.range(0).
inline void BM_Sgemm(benchmark::State& state) {
  const Eigen::Index n = state.range(0);
  Eigen::setNbThreads(omp_get_max_threads());
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n);
  Eigen::MatrixXf c(n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace attnops::bench
