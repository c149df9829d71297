// OperationMetadata: how an operator is configured (from code or from YAML, see config.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/cost.h"
#include "attnops/decision.h"
#include "attnops/dtype.h"

namespace attnops {

// Operator-level fallbacks to vanilla; each can be switched off (then the operator's own kernel
// must handle the case). Defaults: blocksparse all three on; flash_attn2 decode only.
struct FallbackPolicy {
  bool decode = false;        // q_len == 1
  bool non_causal = false;    // causal == false
  bool seq_multiple = false;  // q_len % seq_multiple_of != 0
  std::int64_t seq_multiple_of = 128;
  bool operator==(const FallbackPolicy&) const = default;
};

// GPU (Vulkan) device selection; see backends/vulkan.
struct GpuSettings {
  std::string device;           // index or name substring; empty = best (discrete > integrated > virtual)
  bool allow_software = false;  // allow lavapipe/llvmpipe (VK_PHYSICAL_DEVICE_TYPE_CPU)
  std::string pipeline_cache;   // file to persist the Vulkan pipeline cache in; empty = none
  std::optional<CostRates> cost_rates;  // auto's cost rule (cost.h); nullopt = cached or measured
  bool operator==(const GpuSettings&) const = default;
};

struct OperationMetadata {
  std::optional<DType> runtime_dtype;     // storage dtype kernels run in; nullopt = q's dtype
  DType runtime_softmax_dtype = DType::f32;  // only f32: softmax statistics are always fp32
  std::optional<double> softmax_scale;    // nullopt = 1 / sqrt(D)
  std::optional<std::int64_t> blocksize_q;  // nullopt = the operator's measured default
  std::optional<std::int64_t> blocksize_k;
  // Backend preference, tried in order; backends not listed follow in the auto order
  // (gpu, cpu, native). Empty = auto.
  std::vector<Backend> backends;
  std::vector<Backend> disabled_backends;  // never tried (reason disabled_by_config)
  FallbackPolicy fallbacks;               // set from the operator's defaults, then config
  GpuSettings gpu;
  int num_threads = 0;                    // 0 = OpenMP's default
  bool operator==(const OperationMetadata&) const = default;
};

}  // namespace attnops
