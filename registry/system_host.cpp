// The real host: cpuid for the CPU, the Vulkan backend for GPUs, and no TPU runtime.
#include <omp.h>

#include "attnops/host.h"
#include "backends/vulkan/vulkan_backend.h"
#include "registry/cost_rates.h"

namespace attnops {

namespace {

class SystemHost final : public Host {
 public:
  CpuInfo cpu() const override {
    CpuInfo c;
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.avx512f = __builtin_cpu_supports("avx512f");
    c.avx512bf16 = __builtin_cpu_supports("avx512bf16");
    c.f16c = c.avx2;  // every x86 CPU with AVX2 has F16C; __builtin_cpu_supports has no "f16c" in gcc 12
    for (auto [on, n] : {std::pair{c.avx512f, "avx512f"}, std::pair{c.avx512bf16, "avx512bf16"},
                         std::pair{c.avx2, "avx2"}, std::pair{c.fma, "fma"}, std::pair{c.f16c, "f16c"}})
      if (on) {
        if (!c.isa_summary.empty()) c.isa_summary += ' ';
        c.isa_summary += n;
      }
    c.threads = omp_get_max_threads();
    return c;
  }

  std::vector<GpuDeviceInfo> gpu_devices(const GpuSettings& settings) const override {
    return vulkan::list_devices(settings);
  }

  Availability availability(Backend backend, const GpuSettings& settings) const override {
    switch (backend) {
      case Backend::native: return {true, "portable C++"};
      case Backend::cpu: return {true, "Eigen + OpenMP"};
      case Backend::gpu: return vulkan::availability(settings);
      case Backend::tpu: return {false, "no TPU runtime exists on this host (attnops has no PJRT/libtpu backend)"};
    }
    return {false, "unknown backend"};
  }

  std::optional<std::pair<CostRates, std::string>> cost_rates(const GpuSettings& settings) const override {
    return system_cost_rates(settings);
  }
};

}  // namespace

std::optional<std::pair<CostRates, std::string>> Host::cost_rates(const GpuSettings&) const { return std::nullopt; }

std::shared_ptr<const Host> system_host() {
  static const std::shared_ptr<const Host> h = std::make_shared<SystemHost>();
  return h;
}

}  // namespace attnops
