// YAML configuration (yaml-cpp). Schema (every key optional; see README "Configuration"):
//
//   attn_mechanism: blocksparse        # the operator model code should use (EasyDeL style)
//   backend: auto                      # or one of native|cpu|gpu|tpu, or a list [gpu, cpu]
//   disabled_backends: [gpu]           # never tried (reason disabled_by_config)
//   runtime_dtype: f32                 # f32|f16|bf16; default: q's dtype
//   softmax_scale: 0.125               # default 1/sqrt(head_dim)
//   blocksize_q: 128
//   blocksize_k: 128
//   num_threads: 0                     # 0 = OpenMP default
//   gpu: {device: "", allow_software: false, pipeline_cache: ""}
//   # optional, see cost.h: gpu: {cost_rates: {cpu_gflops: 50, gpu_gflops: 500, upload_gbps: 10,
//   #                                          download_gbps: 10, call_us: 30}}
//   operators:
//     blocksparse:                     # canonical name or alias
//       backend: [cpu, native]
//       disabled_backends: []
//       blocksize_q: 256
//       blocksize_k: 256
//       fallbacks: {decode: true, non_causal: true, seq_multiple: false}
//
// Errors (Error::code() == config_error) name the file, the key, the line and the column, and
// suggest the nearest known key for a misspelt one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnops/decision.h"
#include "attnops/dtype.h"
#include "attnops/metadata.h"

namespace attnops {

struct FallbackOverrides {
  std::optional<bool> decode, non_causal, seq_multiple;
};

struct OperatorConfig {
  std::optional<std::vector<Backend>> backends;  // "auto" gives an empty list
  std::optional<std::vector<Backend>> disabled_backends;
  std::optional<std::int64_t> blocksize_q, blocksize_k;
  FallbackOverrides fallbacks;
  int line = 0, column = 0;  // where the operator's key stands, for later errors (1-based)
};

struct Config {
  std::string source = "<defaults>";  // the file name (or "<string>")
  std::optional<std::string> attn_mechanism;
  std::optional<std::vector<Backend>> backends;
  std::optional<std::vector<Backend>> disabled_backends;
  std::optional<DType> runtime_dtype;
  std::optional<double> softmax_scale;
  std::optional<std::int64_t> blocksize_q, blocksize_k;
  std::optional<int> num_threads;
  std::optional<std::string> gpu_device;
  std::optional<bool> gpu_allow_software;
  std::optional<std::string> gpu_pipeline_cache;
  std::optional<CostRates> gpu_cost_rates;  // gpu.cost_rates: {cpu_gflops, gpu_gflops, upload_gbps, ...}
  std::map<std::string, OperatorConfig> operators;  // key as written (may be an alias)

  // The metadata for one operator: `defaults` (the operator's own), then the top-level keys,
  // then the operator's section (looked up by its canonical name and by each alias).
  OperationMetadata metadata_for(const std::string& canonical, const std::vector<std::string>& aliases,
                                 const OperationMetadata& defaults) const;
};

// The largest YAML file attnops reads (256 KiB; configs are a few hundred bytes): a larger file,
// or an endless stream such as /dev/zero, is an Error(config_error) after a bounded read.
inline constexpr std::int64_t kMaxConfigBytes = std::int64_t{256} << 10;

// The text of a YAML file (`what`: "config file", "bench file"), at most kMaxConfigBytes;
// Error(io_error) when it cannot be read, Error(config_error) when it is larger.
std::string read_yaml_file(const std::string& path, const std::string& what);

Config load_config(const std::string& path);                                     // throws Error
Config parse_config(std::string_view yaml_text, const std::string& source = "<string>");

}  // namespace attnops
