// The GEMM yardsticks of the bench binaries, on all OpenMP threads: Eigen's n x n x n SGEMM in the
// best ISA copy this CPU runs (benchkit/sgemm.h: a portable build measures the machine's SGEMM, not
// SSE2's), and oneDNN's f32 and bf16 matmuls where libdnnl is installed (benchkit/onednn_gemm.h: the
// best GEMM of the machine, AMX tiles for bf16 on Xeons with them), so that attention rows can be
// quoted as a ratio to a rate measured in the same run. Binaries that include this link
// attnops_sgemm (bench/CMakeLists.txt).
#pragma once

#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "benchkit/onednn_gemm.h"
#include "benchkit/sgemm.h"

namespace attnops::bench {

using attnops::DType;

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
    benchkit::sgemm_best(a.data(), b.data(), c.data(), n, omp_get_max_threads(), &isa);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel("eigen " + isa);
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// oneDNN's matmul, n = state.range(0), dtype f32 (range(1) == 0) or bf16: counter GFLOPs; the
// label names the implementation oneDNN chose, or why it is skipped (no libdnnl, reference
// kernel only, a result that does not match double dot products).
inline void BM_OnednnMatmul(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const DType dt = state.range(1) ? DType::bf16 : DType::f32;
  benchkit::OnednnMatmul mm(n, dt, omp_get_max_threads());
  if (!mm.error().empty()) {
    state.SkipWithError(mm.error().c_str());
    return;
  }
  mm.run();
  const double err = mm.check();
  if (!(err <= (dt == DType::bf16 ? 1e-2 : 1e-4))) {
    state.SkipWithError("oneDNN's result does not match double dot products");
    return;
  }
  for (auto _ : state) mm.run();
  state.SetLabel("onednn " + mm.impl());
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate);
}

// Registers the ceilings at n (the bench binaries' first rows).
inline void register_gemm_ceilings(int n) {
  const std::string s = std::to_string(n);
  benchmark::RegisterBenchmark(("Sgemm/" + s).c_str(), BM_Sgemm)
      ->Arg(n)
      ->Unit(benchmark::kMillisecond)
      ->MeasureProcessCPUTime()
      ->UseRealTime();
  for (int bf16 : {0, 1})
    benchmark::RegisterBenchmark(("OnednnMatmul/" + std::string(bf16 ? "bf16/" : "f32/") + s).c_str(),
                                 BM_OnednnMatmul)
        ->Args({n, bf16})
        ->Unit(benchmark::kMillisecond)
        ->MeasureProcessCPUTime()
        ->UseRealTime();
}

}  // namespace attnops::bench
