#include "cli/read_bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "attnops/error.h"

namespace attnops::cli {

namespace {

// Four independent accumulators of 4 lanes (GCC vector extensions: SSE2 in a portable build,
// which reads from L1 several times faster than DRAM delivers) and a software prefetch 4 KiB
// ahead, as the decode kernels do: the loop is bound by memory, not by its instructions.
using F4 = float __attribute__((vector_size(16)));

float stream_sum(const float* x, std::int64_t n) {
  F4 a0{}, a1{}, a2{}, a3{};
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __builtin_prefetch(x + i + 1024, 0, 0);
    F4 v0, v1, v2, v3;
    __builtin_memcpy(&v0, x + i, 16);
    __builtin_memcpy(&v1, x + i + 4, 16);
    __builtin_memcpy(&v2, x + i + 8, 16);
    __builtin_memcpy(&v3, x + i + 12, 16);
    a0 += v0, a1 += v1, a2 += v2, a3 += v3;
  }
  const F4 s = (a0 + a1) + (a2 + a3);
  float r = s[0] + s[1] + s[2] + s[3];
  for (; i < n; ++i) r += x[i];
  return r;
}

}  // namespace

ReadBandwidth measure_read_bandwidth(int threads, int repeats, int mib) {
  const std::int64_t n = std::int64_t{std::max(mib, 1)} << 18;  // 2^18 floats per MiB
  std::unique_ptr<float[]> a(new (std::nothrow) float[static_cast<std::size_t>(n)]);
  if (!a)
    throw Error(ErrorCode::out_of_memory,
                "read-bandwidth loop: cannot allocate " + std::to_string(mib) + " MiB");
  const int nt = threads > 0 ? threads : omp_get_max_threads();
  const auto share = [n](int t, int count) { return std::pair{n * t / count, n * (t + 1) / count}; };
#pragma omp parallel num_threads(nt)
  {
    const auto [b, e] = share(omp_get_thread_num(), omp_get_num_threads());
    for (std::int64_t i = b; i < e; ++i)
      a[static_cast<std::size_t>(i)] = static_cast<float>(i & 1023) * 1e-3f;
  }
  std::vector<double> gbps, per_cpu;
  volatile float sink = 0;
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  for (int r = 0; r <= std::max(1, repeats); ++r) {
    const double c0 = cpu_now();
    const auto t0 = std::chrono::steady_clock::now();
    float s = 0;
#pragma omp parallel num_threads(nt) reduction(+ : s)
    {
      const auto [b, e] = share(omp_get_thread_num(), omp_get_num_threads());
      s += stream_sum(a.get() + b, e - b);
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + s;
    const double cpu = cpu_now() - c0;
    if (r > 0) {  // pass 0 warms up
      gbps.push_back(static_cast<double>(n) * sizeof(float) * 1e-9 / sec);
      per_cpu.push_back(static_cast<double>(n) * sizeof(float) * 1e-9 / cpu);
    }
  }
  std::sort(gbps.begin(), gbps.end());
  std::sort(per_cpu.begin(), per_cpu.end());
  return {gbps[gbps.size() / 2], per_cpu[per_cpu.size() / 2],
          static_cast<double>(n) * sizeof(float) / (1024.0 * 1024.0), nt};
}

}  // namespace attnops::cli
