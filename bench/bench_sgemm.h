// The SGEMM yardstick of the bench binaries: Eigen's n x n x n product on all OpenMP threads, in
// the best ISA copy this CPU runs (cli/sgemm.h: a portable build measures the machine's SGEMM,
// not SSE2's), so that attention rows can be quoted as a ratio to a rate measured in the same run.
// Binaries that include this link attnops_sgemm (bench/CMakeLists.txt).
#pragma once

#include <omp.h>

#include <benchmark/benchmark.h>

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "cli/sgemm.h"

namespace attnops::bench {

// Counter GFLOPs: 2 * n^3 / time; n = state.range(0). The label names the ISA copy that ran.
inline void BM_Sgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(elems), b(elems), c(elems);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (std::size_t i = 0; i < elems; ++i) a[i] = u(rng), b[i] = u(rng);
  std::string isa;
  for (auto _ : state) {
    cli::sgemm_best(a.data(), b.data(), c.data(), n, omp_get_max_threads(), &isa);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel("eigen " + isa);
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace attnops::bench
