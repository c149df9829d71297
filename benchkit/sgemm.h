// The machine's practical peak as the benchmarks' yardstick: Eigen's SGEMM, measured in the same
// run as the attention rows (same threads, same clocks), in the best ISA copy this CPU runs
// (sgemm_isa.cpp: baseline, avx2 or avx512, whatever the build's flags), so that a portable
// build's yardstick is the machine's, not SSE2's.
#pragma once

#include <string>

namespace attnops::benchkit {

struct SgemmResult {
  int n = 0;
  double median_ms = 0;
  double gflops = 0;  // 2 n^3 / time
  std::string isa;    // which copy ran: "baseline", "avx2" or "avx512"
};

// Median over `repeats` of C = A * B with n x n float matrices (one warm-up run first).
// threads: 0 = OpenMP's default.
SgemmResult measure_sgemm(int n, int repeats, int threads);

// C = A * B (n x n, column-major) with the copy measure_sgemm uses; `isa` receives its name.
void sgemm_best(const float* a, const float* b, float* c, int n, int threads, std::string* isa = nullptr);

}  // namespace attnops::benchkit
