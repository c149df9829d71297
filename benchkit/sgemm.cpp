#include "benchkit/sgemm.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "attnops/attnops.h"
#include "backends/common/threads.h"
#include "benchkit/sgemm_isa.h"

namespace attnops::benchkit {

namespace {

using SgemmFn = void (*)(const float*, const float*, float*, int, int);

// The copy for the highest ISA this CPU runs (ATTNOPS_CPU_ISA caps the kernels, not the
// yardstick: a capped kernel is compared with the machine's SGEMM).
SgemmFn best_copy(std::string* isa) {
  const std::string best = registry().host().cpu().cpu_tier_detected;
#if defined(ATTNOPS_SGEMM_X86)
  if (best != "baseline" && best != "avx2") {
    if (isa) *isa = "avx512";
    return &sgemm_avx512::sgemm;
  }
  if (best == "avx2") {
    if (isa) *isa = "avx2";
    return &sgemm_avx2::sgemm;
  }
#endif
  if (isa) *isa = "baseline";
  return &sgemm_baseline::sgemm;
}

}  // namespace

void sgemm_best(const float* a, const float* b, float* c, int n, int threads, std::string* isa) {
  best_copy(isa)(a, b, c, n, threads);
}

SgemmResult measure_sgemm(int n, int repeats, int threads) {
  // The attention rows' thread count (backends/common/threads.h), clamped the same way.
  threads = worker_threads(threads);
  const auto elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(elems), b(elems), c(elems);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (std::size_t i = 0; i < elems; ++i) a[i] = u(rng), b[i] = u(rng);
  SgemmResult r;
  r.n = n;
  const SgemmFn sgemm = best_copy(&r.isa);
  sgemm(a.data(), b.data(), c.data(), n, threads);  // warm-up: page faults, thread pool start
  std::vector<double> ms;
  // As the attention rows: each sample repeats the product until it has lasted >= 20 ms.
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    int calls = 0;
    double total = 0;
    do {
      sgemm(a.data(), b.data(), c.data(), n, threads);
      ++calls;
      total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    } while (total < 20 && calls < 1000);
    ms.push_back(total / calls);
  }
  std::sort(ms.begin(), ms.end());
  r.median_ms = ms[ms.size() / 2];
  r.gflops = 2.0 * n * static_cast<double>(n) * n / (r.median_ms * 1e6);
  // Keep the product observable so the compiler cannot drop the multiplications.
  volatile float sink = c[0];
  (void)sink;
  return r;
}

}  // namespace attnops::benchkit
