// DispatchDecision: which operator and backend ran, and why, as data (not log text).
//
// A decision records the requested operator, the operator that ran (vanilla after a fallback),
// the backend, and every reason in order: operator fallbacks first (decode, non_causal,
// seq_multiple), then each rejected backend candidate (backend_unavailable, not_implemented,
// ...). Reason codes are stable strings, safe to match in tests and scripts.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// What the backend that ran reports about the run (filled by the forward, kept by the
// dispatcher): the kernel variant inside the backend and why that one. Backends extend this with
// what they measure (data movement, timings); nothing here influences the choice of backend.
struct RunInfo {
  std::string kernel;         // e.g. "avx512" (a cpu ISA tier), "flash_subgroup" (a gpu variant)
  std::string kernel_detail;  // why: what was detected, what capped it, what a better one lacked
  bool operator==(const RunInfo&) const = default;
};

// Which pass a decision is for: the forward call, or its backward (Attention::backward).
enum class Pass { forward, backward };
std::string_view pass_name(Pass p);  // "forward", "backward"

struct DispatchDecision {
  Pass pass = Pass::forward;
  std::string requested;          // the name asked for (alias resolved to the canonical name)
  std::string op;                 // the operator that ran
  Backend backend = Backend::native;
  std::vector<Reason> reasons;    // in the order they were found
  RunInfo run;                    // set after the call ran (empty for plan())

  bool has(ReasonCode c) const;
  bool fell_back() const { return op != requested; }
  // {"requested": "...", "operator": "...", "backend": "...", "reasons": [{"code","detail"}]}
  // plus "kernel" and "kernel_detail" when the backend reported them, and "pass": "backward"
  // for a backward decision.
  std::string to_json() const;
  // One line, oneDNN-verbose style ("dispatch_backward" instead of "dispatch" for a backward):
  // "attnops,dispatch,blocksparse->vanilla,cpu,decode:q_len=1;backend_unavailable:gpu: ..."
  std::string to_log_line() const;
};

}  // namespace attnops
