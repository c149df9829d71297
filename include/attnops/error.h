// Typed errors. Every error attnops raises is an attnops::Error with a stable code; messages
// name the argument, what was found and what was expected, e.g.
//   "k: expected shape [B=2, Tk, Hkv, D=64], got [2, 128, 4, 80] (head_dim differs from q)".
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace attnops {

enum class ErrorCode {
  invalid_argument,     // a value out of range (scale not finite, window negative, ...)
  shape_mismatch,       // ranks or dimensions that disagree with each other or the layout
  unsupported_dtype,    // a dtype an argument cannot take
  unknown_operator,     // registry lookup of a name that is not registered
  config_error,         // YAML: malformed file, unknown key, wrong type or value
  io_error,             // files (.npy, YAML, pipeline cache) that cannot be read or written
  backend_unavailable,  // the backend is absent on this host (no TPU runtime, no Vulkan device)
  not_implemented,      // the operator has no forward for this backend
  unsupported_feature,  // the backend cannot run these inputs (too large, head_dim, ...)
  gpu_error,            // a runtime GPU failure (out of memory, device lost, timeout)
  out_of_memory,        // host memory for a tensor or a kernel's working set could not be allocated
  internal,             // a bug in attnops
};

std::string_view error_code_name(ErrorCode c);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message) : std::runtime_error(std::move(message)), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace attnops
