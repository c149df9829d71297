// DispatchDecision: which operator and backend ran, and why, as data (not log text).
//
// A decision records the requested operator, the operator that ran (vanilla after a fallback),
// the backend, and every reason in order: operator fallbacks first (decode, non_causal,
// seq_multiple), then each rejected backend candidate (backend_unavailable, not_implemented,
// ...). Reason codes are stable strings, safe to match in tests and scripts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnops/dtype.h"

namespace attnops {

enum class Backend { native, cpu, gpu, tpu };
std::string_view backend_name(Backend b);  // "native", "cpu", "gpu", "tpu"
std::optional<Backend> parse_backend(std::string_view s);

enum class ReasonCode {
  // operator-level fallbacks (the operator hands the call to vanilla)
  decode,        // q_len == 1
  non_causal,    // causal == false
  seq_multiple,  // q_len % 128 != 0
  // backend candidates rejected
  backend_unavailable,  // absent on this host (no Vulkan device, no TPU runtime, ...)
  not_implemented,      // the operator has no forward for this backend
  unsupported_feature,  // the backend cannot run these inputs
  unsupported_dtype,    // the backend cannot run this dtype
  disabled_by_config,   // the config turned this backend off
  gpu_error,            // the GPU failed at run time; the next backend ran instead
  cpu_faster,           // auto: the cost estimate says the cpu finishes first (see CostEstimate)
  selftest_failed,      // gpu: no kernel variant passed its self-check on this device (vulkan README)
  // informational
  forced_native,  // ATTNOPS_FORCE_NATIVE=1
};
std::string_view reason_code_name(ReasonCode c);
std::optional<ReasonCode> parse_reason_code(std::string_view s);

struct Reason {
  ReasonCode code;
  std::string detail;  // human text, e.g. "q_len=1" or "gpu: no Vulkan device qualifies"
  bool operator==(const Reason&) const = default;
};

// Device-side timings of one run (filled when profiling was asked for: the `profile` option or
// ATTNOPS_PROFILE=1). Device times come from GPU timestamps when `device_timestamps`.
struct PassTiming {
  std::string name;  // the kernel pass, e.g. "flash", "convert"
  double ms = 0;
  bool operator==(const PassTiming&) const = default;
};
struct RunTimings {
  double host_pack_ms = 0;  // host: packing inputs into mapped device / staging memory
  double upload_ms = 0;     // device: host -> device copies (0 when the mapping was written directly)
  double kernel_ms = 0;     // device: all kernel passes
  std::vector<PassTiming> passes;
  double download_ms = 0;     // device: device -> host copies
  double host_unpack_ms = 0;  // host: reading results back (and rounding to the output dtype)
  double wall_ms = 0;         // host: the whole submission, recording to read-back
  bool device_timestamps = false;
  bool operator==(const RunTimings&) const = default;
};

// What the backend that ran reports about the run (filled by the forward, kept by the
// dispatcher): the kernel variant inside the backend and why that one, where the inputs lived,
// the bytes moved each way, and timings when profiling. Nothing here influences the choice of
// backend.
struct RunInfo {
  std::string kernel;         // e.g. "avx512" (a cpu ISA tier), "flash_subgroup" (a gpu variant)
  std::string kernel_detail;  // why: what was detected, what capped it, what a better one lacked
  std::string inputs;         // where q, k, v lived: "host", "device" or "mixed" (empty: not reported)
  std::string output;         // where the output was left: "host" or "device"
  std::uint64_t bytes_to_device = 0;  // uploaded for this call (device-resident inputs move nothing)
  std::uint64_t bytes_to_host = 0;    // read back for this call
  // Host copies the call made of its inputs to normalise them (a view whose innermost stride is
  // not 1, a dtype conversion to the runtime dtype, segment ids to i32, bias / sinks to contiguous
  // f32): 0 when every input was used in place. Set by the dispatcher, for plan() too.
  std::uint64_t bytes_copied = 0;
  std::optional<RunTimings> timings;  // when profiling
  // Paged calls (paged.h): each sequence's result is bitwise the same alone or inside any batch,
  // at any thread count (a fixed split of its keys, merged in a fixed order; kernel_detail says how).
  bool batch_invariant = false;
  // Paged calls: keys read once for several sequences of the batch (their shared prefix pages;
  // PagedAttentionOptions::share_prefixes), 0 when nothing was shared.
  std::int64_t shared_keys = 0;
  bool operator==(const RunInfo&) const = default;
};

// Which pass a decision is for: the forward call, or its backward (Attention::backward).
enum class Pass { forward, backward };
std::string_view pass_name(Pass p);  // "forward", "backward"

// The cost rule of auto (cost.h): the estimates that sent a call to the cpu (or kept it on the
// gpu), in microseconds.
struct CostEstimate {
  double gpu_us = 0, cpu_us = 0;
  double upload_us = 0, kernel_us = 0, download_us = 0, call_us = 0;  // the parts of gpu_us
  std::string rates_source;                                           // "config", "cache FILE", "measured"
  bool operator==(const CostEstimate&) const = default;
};

// The per-call settings (AttentionOptions / PagedAttentionOptions) a call set, as they took
// effect: the scale, the runtime dtype, the thread count after clamping to the hardware, the
// backend preference. Unset = the call left it to the operator's metadata.
struct CallSettings {
  std::optional<double> softmax_scale;
  std::optional<DType> runtime_dtype;
  std::optional<int> num_threads;
  std::optional<std::vector<Backend>> backends;
  bool any() const { return softmax_scale || runtime_dtype || num_threads || backends; }
  bool operator==(const CallSettings&) const = default;
};

struct DispatchDecision {
  Pass pass = Pass::forward;
  std::string requested;  // the name asked for (alias resolved to the canonical name)
  std::string op;         // the operator that ran
  Backend backend = Backend::native;
  std::vector<Reason> reasons;       // in the order they were found
  RunInfo run;                       // set after the call ran (empty for plan())
  std::optional<CostEstimate> cost;  // set when auto's cost rule compared gpu and cpu
  CallSettings settings;             // the per-call settings that overrode the metadata

  bool has(ReasonCode c) const;
  bool fell_back() const { return op != requested; }
  // {"requested": "...", "operator": "...", "backend": "...", "reasons": [{"code","detail"}]}
  // plus "kernel" and "kernel_detail" when the backend reported them, "inputs", "output",
  // "bytes_to_device", "bytes_to_host" when reported, "bytes_copied" when not 0,
  // "batch_invariant": true for paged calls that guarantee it, "timings" when profiled, "cost"
  // when the cost rule ran, "settings" ({"softmax_scale", "runtime_dtype", "num_threads",
  // "backends"}, those the call set) when any, and "pass": "backward" for a backward decision.
  std::string to_json() const;
  // One line, oneDNN-verbose style ("dispatch_backward" instead of "dispatch" for a backward):
  // "attnops,dispatch,blocksparse->vanilla,cpu,decode:q_len=1;backend_unavailable:gpu: ..."
  std::string to_log_line() const;
};

}  // namespace attnops
