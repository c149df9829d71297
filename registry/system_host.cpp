// The real host: cpuid for the CPU, the Vulkan backend for GPUs, and no TPU runtime.
#include <omp.h>

#include "attnops/host.h"
#include "backends/cpu/isa.h"
#include "backends/vulkan/vulkan_backend.h"
#include "registry/cost_rates.h"

namespace attnops {

namespace {

class SystemHost final : public Host {
 public:
  CpuInfo cpu() const override {
    const cpu::IsaDetection& d = cpu::detect_isa();
    CpuInfo c;
    c.avx2 = d.cpu.avx2;
    c.fma = d.cpu.fma;
    c.f16c = d.cpu.f16c;
    c.avx512f = d.cpu.avx512f;
    c.avx512bf16 = d.cpu.avx512bf16;
    c.amx_tile = d.cpu.amx_tile;
    c.amx_bf16 = d.cpu.amx_bf16;
    c.isa_summary = d.cpu.summary();
    const cpu::IsaChoice choice = cpu::choose_isa();  // reads ATTNOPS_CPU_ISA now
    c.cpu_tier = std::string(cpu::isa_name(choice.tier));
    c.cpu_tier_detected = std::string(cpu::isa_name(choice.detected));
    c.cpu_tier_detail = choice.detail;
    c.threads = omp_get_max_threads();
    return c;
  }

  std::vector<GpuDeviceInfo> gpu_devices(const GpuSettings& settings) const override {
    return vulkan::list_devices(settings);
  }

  Availability availability(Backend backend, const GpuSettings& settings) const override {
    switch (backend) {
      case Backend::native:
        return {true, "portable C++"};
      case Backend::cpu:  // the cached choice: no environment lookup or ISA detection per call
        return {true, "SIMD kernels, ISA tier " + std::string(cpu::isa_name(cpu::current_isa_choice().tier))};
      case Backend::gpu:
        return vulkan::availability(settings);
      case Backend::tpu:
        return {false, "no TPU runtime exists on this host (attnops has no PJRT/libtpu backend)"};
    }
    return {false, "unknown backend"};
  }

  bool is_available(Backend backend, const GpuSettings& settings) const override {
    switch (backend) {
      case Backend::native:
      case Backend::cpu:
        return true;
      case Backend::gpu:
        return vulkan::available(settings);
      case Backend::tpu:
        return false;
    }
    return false;
  }

  std::optional<std::pair<CostRates, std::string>> cost_rates(const GpuSettings& settings) const override {
    return system_cost_rates(settings);
  }
};

}  // namespace

std::optional<std::pair<CostRates, std::string>> Host::cost_rates(const GpuSettings&) const {
  return std::nullopt;
}

std::shared_ptr<const Host> system_host() {
  static const std::shared_ptr<const Host> h = std::make_shared<SystemHost>();
  return h;
}

}  // namespace attnops
