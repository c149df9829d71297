// Host capabilities, behind an interface so that tests can inject a mock host (GoogleMock) and
// prove routing without a GPU. The system host asks cpuid and the Vulkan loader.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnops/decision.h"
#include "attnops/metadata.h"

namespace attnops {

struct CpuInfo {
  bool avx2 = false, fma = false, f16c = false, avx512f = false, avx512bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
  int threads = 1;          // OpenMP's default thread count
  std::string isa_summary;  // e.g. "avx2 fma f16c avx512f avx512bw avx512dq avx512vl avx512bf16"
  // The ISA tier the cpu backend's kernels run (baseline|avx2|avx512|avx512bf16|amx): the highest
  // this CPU, its OS and the build support (cpu_tier_detected), lowered by ATTNOPS_CPU_ISA.
  std::string cpu_tier, cpu_tier_detected;
  std::string cpu_tier_detail;  // what was detected, why the next tier was refused, the cap
};

// One Vulkan physical device as the loader reports it, with the limits attnops relies on.
struct GpuDeviceInfo {
  int index = 0;
  std::string name;
  std::string type;  // "discrete", "integrated", "virtual", "cpu" (software), "other"
  std::string api_version;
  bool software = false;   // VK_PHYSICAL_DEVICE_TYPE_CPU (lavapipe, llvmpipe)
  bool qualifies = false;  // usable by attnops under the current settings
  std::string why_not;     // when !qualifies
  std::uint32_t max_shared_memory = 0;
  std::uint32_t max_workgroup_invocations = 0;
  std::uint32_t subgroup_size = 0;
  std::uint64_t max_storage_buffer_range = 0;
  bool shader_f16 = false;
  // Vulkan kernel variants: whether this build holds each and whether the device could run it
  // ("flash_coopmat_nv: built; this device: no (...)"), and, for the selected device, the
  // self-check results known to this process or cached beside gpu.pipeline_cache
  // ("pass flash_subgroup f32 D64 Dv64 ...: <detail>"; backends/vulkan/README.md "Self-check").
  std::vector<std::string> kernel_variants;
  std::vector<std::string> selfchecks;
};

struct Availability {
  bool available = false;
  std::string detail;  // why not, or which device
};

class Host {
 public:
  virtual ~Host() = default;
  virtual CpuInfo cpu() const = 0;
  virtual std::vector<GpuDeviceInfo> gpu_devices(const GpuSettings& settings) const = 0;
  // Whether `backend` can run on this host at all (not whether it supports given inputs).
  virtual Availability availability(Backend backend, const GpuSettings& settings) const = 0;
  // availability(backend, settings).available, without the detail: the dispatcher asks it on
  // every call and builds the detail only for a backend that is not available (the real host
  // answers native and cpu without making a string).
  virtual bool is_available(Backend backend, const GpuSettings& settings) const {
    return availability(backend, settings).available;
  }
  // Rates for auto's cost rule (cost.h) on the gpu `settings` select, and where they came from
  // ("cache FILE", "measured"); nullopt = no rule (the gpu is tried first, as without rates).
  virtual std::optional<std::pair<CostRates, std::string>> cost_rates(const GpuSettings& settings) const;
};

// The real host (cpuid + Vulkan loader), shared process-wide; probes are cached.
std::shared_ptr<const Host> system_host();

// The most worker threads one call uses: this machine's hardware threads (at least 1). A larger
// num_threads (metadata, YAML, --threads) and a larger OpenMP default are clamped to it.
int max_worker_threads();

}  // namespace attnops
