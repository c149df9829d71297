#include "registry/cost_rates.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "attnops/error.h"
#include "attnops/ext/problem.h"
#include "attnops/host.h"
#include "backends/vulkan/vulkan_backend.h"
#include "core/cache_file.h"
#include "operators/flash_attn2.h"

namespace attnops {

namespace {

constexpr std::size_t kMaxRatesFileBytes = 4096;  // one line of five numbers

// GFLOP/s of the cpu backend's flash kernel on the gpu's calibration problem (B1 H4 T256 D64
// f32, not causal), best of three after a warm-up. The kernel runs through the operator's
// backend interface, as a dispatched call does (no fallback or gate: the call is the cpu's).
double measure_cpu_gflops() {
  const std::int64_t B = 1, T = 256, H = 4, D = 64;
  Tensor q(DType::f32, {B, T, H, D}), k(DType::f32, {B, T, H, D}), v(DType::f32, {B, T, H, D});
  for (Tensor* t : {&q, &k, &v})
    for (std::int64_t i = 0; i < t->numel(); ++i)
      t->data_as<float>()[i] = static_cast<float>((i * 37) % 17) / 17.f;
  AttentionOptions o;
  o.causal = false;
  FlashAttn2 flash(FlashAttn2::default_metadata());
  const AttentionProblem p = make_problem(q, k, v, o, flash.metadata());
  double best_ms = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)flash.forward(Backend::cpu, p);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
  }
  return attention_flops(p, static_cast<double>(T * T)) / (std::max(best_ms, 1e-6) * 1e6);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

std::optional<std::pair<CostRates, std::string>> system_cost_rates(const GpuSettings& settings) {
  using Key = std::tuple<std::string, bool, std::string, std::string, std::string>;
  static std::mutex* mu = new std::mutex;  // never destroyed (see gpu.h)
  static auto* cache = new std::map<Key, std::optional<std::pair<CostRates, std::string>>>;
  const Key key{settings.device, settings.allow_software, settings.pipeline_cache, env("ATTNOPS_VK_DEVICE"),
                env("ATTNOPS_VK_ALLOW_SOFTWARE")};
  std::lock_guard<std::mutex> lock(*mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  std::optional<std::pair<CostRates, std::string>> result;
  if (vulkan::availability(settings).available) {
    const std::string file = settings.pipeline_cache.empty() ? "" : settings.pipeline_cache + ".rates";
    if (!file.empty()) {
      // One line of a few dozen bytes, read with a bound: a path to /dev/zero, a FIFO or a huge
      // file is ignored with a warning and the rates are measured again.
      const CacheFileRead in = read_cache_file(file, kMaxRatesFileBytes);
      if (in.status == CacheFileRead::Status::ok) {
        const CostRates r = parse_rates(in.bytes.substr(0, in.bytes.find('\n')));
        if (r.valid())
          result = std::pair{r, "cache " + file};
        else
          warn_cache_file_once("cost-rate cache", file, "not a line of rates",
                               "ignored (rates are measured again)");
      } else if (in.status != CacheFileRead::Status::missing) {
        warn_cache_file_once("cost-rate cache", file, in.why, "ignored (rates are measured again)");
      }
    }
    if (!result) {
      if (const auto gpu = vulkan::measure_rates(settings)) {
        CostRates r;
        r.gpu_gflops = gpu->gflops;
        r.upload_gbps = gpu->upload_gbps;
        r.download_gbps = gpu->download_gbps;
        r.call_us = gpu->call_us;
        r.cpu_gflops = measure_cpu_gflops();
        if (r.valid()) {
          result = std::pair{r, std::string("measured")};
          std::string why;
          if (!file.empty() && cache_file_writable(file, &why)) {
            std::ofstream out(file, std::ios::trunc);
            out << format_rates(r) << "\n";
          } else if (!file.empty()) {
            warn_cache_file_once("cost-rate cache", file, why, "not written");
          }
        }
      }
    }
  }
  (*cache)[key] = result;
  return result;
}

}  // namespace attnops
