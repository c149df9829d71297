// The cost rule of `auto` for host tensors: the gpu is taken only when it is expected to beat
// the cpu. For a call of F flops that moves U bytes to the device and D bytes back:
//
//   gpu_us = call_us + U / upload_GB/s + F / gpu_GFLOP/s + D / download_GB/s
//   cpu_us = F / cpu_GFLOP/s
//
// and the gpu runs iff gpu_us < cpu_us; otherwise the decision records reason `cpu_faster` with
// both estimates (DispatchDecision::cost). Rates come from the config (gpu.cost_rates), else
// from a cache file beside the pipeline cache (<pipeline_cache>.rates), else they are measured
// once per process (a small calibration call on each backend) and written to that file when a
// pipeline cache is configured. The rule applies only when the gpu is a candidate of the auto
// order, not when the config or --backend names it, and never to device-resident inputs.
#pragma once

#include <string>

#include "attnops/decision.h"

namespace attnops {

struct CostRates {
  double cpu_gflops = 0;     // attention GFLOP/s of the cpu backend
  double gpu_gflops = 0;     // attention GFLOP/s of the gpu kernels (device time)
  double upload_gbps = 0;    // host -> device GB/s (staging copy or mapped writes, packing included)
  double download_gbps = 0;  // device -> host GB/s
  double call_us = 0;        // fixed cost of one gpu call: recording, submission, fence wait
  bool valid() const { return cpu_gflops > 0 && gpu_gflops > 0 && upload_gbps > 0 && download_gbps > 0; }
  bool operator==(const CostRates&) const = default;
};

// The estimate of the rule above (rates_source is left empty).
CostEstimate estimate_cost(const CostRates& rates, double flops, double bytes_up, double bytes_down);

// "cpu_gflops=50 gpu_gflops=2 upload_gbps=8 download_gbps=8 call_us=60" (the cache file format,
// one line) and back; parse returns invalid rates (valid() false) for malformed text.
std::string format_rates(const CostRates& rates);
CostRates parse_rates(const std::string& text);

}  // namespace attnops
