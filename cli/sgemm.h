// The machine's practical peak as the benchmarks' yardstick: Eigen's SGEMM, measured in the same
// run as the attention rows (same threads, same clocks).
#pragma once

namespace attnops::cli {

struct SgemmResult {
  int n = 0;
  double median_ms = 0;
  double gflops = 0;  // 2 n^3 / time
};

// Median over `repeats` of C = A * B with n x n float matrices (one warm-up run first).
// threads: 0 = OpenMP's default.
SgemmResult measure_sgemm(int n, int repeats, int threads);

}  // namespace attnops::cli
