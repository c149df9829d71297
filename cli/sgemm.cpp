#include "cli/sgemm.h"

#include <algorithm>
#include <chrono>
#include <vector>

// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics when Eigen's GEMM is
// instantiated with -march=native (a known false positive); this file only holds that GEMM.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>

#include "backends/common/threads.h"

namespace attnops::cli {

SgemmResult measure_sgemm(int n, int repeats, int threads) {
  // The attention rows' thread count (backends/common/threads.h), clamped the same way.
  Eigen::setNbThreads(worker_threads(threads));
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n);
  Eigen::MatrixXf c(n, n);
  c.noalias() = a * b;  // warm-up: page faults, thread pool start
  std::vector<double> ms;
  // As the attention rows: each sample repeats the product until it has lasted >= 20 ms.
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    int calls = 0;
    double total = 0;
    do {
      c.noalias() = a * b;
      ++calls;
      total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    } while (total < 20 && calls < 1000);
    ms.push_back(total / calls);
  }
  std::sort(ms.begin(), ms.end());
  SgemmResult r;
  r.n = n;
  r.median_ms = ms[ms.size() / 2];
  r.gflops = 2.0 * n * static_cast<double>(n) * n / (r.median_ms * 1e6);
  // Keep the product observable so the compiler cannot drop the multiplications.
  volatile float sink = c(0, 0);
  (void)sink;
  return r;
}

}  // namespace attnops::cli
