#include "benchkit/read_bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "attnops/error.h"
#include "backends/common/threads.h"

namespace attnops::benchkit {

namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// One thread's share, with vectors V of W floats (the widest register of the ISA the caller is
// compiled for). Four independent accumulators hide the add latency, so the loop is bound by the
// loads alone. No software prefetch: a sequential read is what the hardware prefetchers are for.
typedef float V4 __attribute__((vector_size(16)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V16 __attribute__((vector_size(64)));

template <class V>
__attribute__((always_inline)) inline double read_lanes(const float* x, std::int64_t n) {
  constexpr int W = sizeof(V) / sizeof(float);
  V a0{}, a1{}, a2{}, a3{};
  std::int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    V v0, v1, v2, v3;
    __builtin_memcpy(&v0, x + i, sizeof(V));
    __builtin_memcpy(&v1, x + i + W, sizeof(V));
    __builtin_memcpy(&v2, x + i + 2 * W, sizeof(V));
    __builtin_memcpy(&v3, x + i + 3 * W, sizeof(V));
    a0 += v0, a1 += v1, a2 += v2, a3 += v3;
  }
  const V s = (a0 + a1) + (a2 + a3);
  double r = 0;
  for (int l = 0; l < W; ++l) r += static_cast<double>(s[l]);
  for (; i < n; ++i) r += static_cast<double>(x[i]);
  return r;
}

// One copy per ISA (a portable build must not assume AVX2), picked at run time as the kernels' tiers are.
double read_share_default(const float* x, std::int64_t n) {
  return read_lanes<V4>(x, n);
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) double read_share_avx2(const float* x, std::int64_t n) {
  return read_lanes<V8>(x, n);
}
__attribute__((target("avx512f"))) double read_share_avx512(const float* x, std::int64_t n) {
  return read_lanes<V16>(x, n);
}
#endif

using ReadShare = double (*)(const float*, std::int64_t);
ReadShare read_share(std::string* isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    if (isa) *isa = "avx512f";
    return &read_share_avx512;
  }
  if (__builtin_cpu_supports("avx2")) {
    if (isa) *isa = "avx2";
    return &read_share_avx2;
  }
#endif
  if (isa) *isa = "default";
  return &read_share_default;
}

// Thread t's contiguous share of n elements out of `count`, in whole 64-element blocks but the last.
std::pair<std::int64_t, std::int64_t> share(std::int64_t n, int t, int count) {
  const std::int64_t blocks = (n + 63) / 64;
  const std::int64_t b = blocks * t / count * 64, e = blocks * (t + 1) / count * 64;
  return {std::min(b, n), std::min(e, n)};
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// "32768K", "1M", "512" (sysfs cache sizes) in bytes; 0 when unreadable.
std::uint64_t parse_size(const std::string& s) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const char unit = used < s.size() ? s[used] : ' ';
  return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : unit == 'G' ? v << 30 : v;
}

}  // namespace

double read_pass(const float* x, std::int64_t n, int threads) {
  const int nt = worker_threads(threads);
  const ReadShare read = read_share(nullptr);
  double s = 0;
#pragma omp parallel num_threads(nt) reduction(+ : s)
  {
    const auto [b, e] = share(n, omp_get_thread_num(), omp_get_num_threads());
    s += read(x + b, e - b);
  }
  return s;
}

std::uint64_t read_buffer_bytes(std::uint64_t llc_bytes, std::uint64_t available_bytes, int requested_mib) {
  std::uint64_t bytes = requested_mib > 0 ? static_cast<std::uint64_t>(requested_mib) * kMiB
                                          : std::max<std::uint64_t>(256 * kMiB, 4 * llc_bytes);
  if (available_bytes > 0) bytes = std::min(bytes, available_bytes / 2);
  return std::max(bytes / kMiB, std::uint64_t{1}) * kMiB;
}

std::uint64_t last_level_cache_bytes(const std::string& sysfs_cpu) {
  int best_level = 0;
  std::uint64_t total = 0;
  std::set<std::string> seen;  // one entry per cache instance of the best level: its shared_cpu_list
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(sysfs_cpu, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 4 || name.compare(0, 3, "cpu") != 0 ||
        name.find_first_not_of("0123456789", 3) != std::string::npos)
      continue;
    for (int index = 0; index < 16; ++index) {
      const std::string c = entry.path().string() + "/cache/index" + std::to_string(index);
      const std::string level = read_line(c + "/level");
      if (level.empty()) break;
      if (read_line(c + "/type") == "Instruction") continue;
      const int l = std::atoi(level.c_str());
      if (l < best_level) continue;
      if (l > best_level) best_level = l, total = 0, seen.clear();
      if (seen.insert(read_line(c + "/shared_cpu_list")).second) total += parse_size(read_line(c + "/size"));
    }
  }
  return total;
}

std::uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream fields(line.substr(13));
      unsigned long long kib = 0;
      if (fields >> kib) return static_cast<std::uint64_t>(kib) << 10;
    }
  return 0;
}

ReadBandwidth measure_read_bandwidth(int threads, int passes, int mib) {
  const std::uint64_t bytes = read_buffer_bytes(last_level_cache_bytes(), available_memory_bytes(), mib);
  const auto n = static_cast<std::int64_t>(bytes / sizeof(float));
  std::unique_ptr<float[]> a(new (std::nothrow) float[static_cast<std::size_t>(n)]);
  if (!a)
    throw Error(ErrorCode::out_of_memory,
                "read-bandwidth loop: cannot allocate " + std::to_string(bytes / kMiB) + " MiB");
  const int nt = worker_threads(threads);  // the rows' thread count, clamped as theirs
  // Each thread writes (first touch: its pages on its node) the share it will read.
#pragma omp parallel num_threads(nt)
  {
    const auto [b, e] = share(n, omp_get_thread_num(), omp_get_num_threads());
    for (std::int64_t i = b; i < e; ++i)
      a[static_cast<std::size_t>(i)] = static_cast<float>(i & 1023) * 1e-3f;
  }
  ReadBandwidth r;
  r.mib = static_cast<double>(bytes) / static_cast<double>(kMiB);
  r.threads = nt;
  read_share(&r.isa);
  volatile double sink = 0;
  for (int p = 0; p <= std::max(1, passes); ++p) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    const double s = read_pass(a.get(), n, nt);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_seconds() - c0;
    sink = sink + s;
    if (p == 0) continue;  // the warm-up: threads started, TLB and prefetchers settled
    const double gb = static_cast<double>(n) * sizeof(float) * 1e-9;
    r.gbps = std::max(r.gbps, gb / sec);
    r.gbps_per_cpu_second = std::max(r.gbps_per_cpu_second, gb / cpu);
  }
  return r;
}

}  // namespace attnops::benchkit
