#include "attnops/error.h"

namespace attnops {

std::string_view error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::shape_mismatch: return "shape_mismatch";
    case ErrorCode::unsupported_dtype: return "unsupported_dtype";
    case ErrorCode::unknown_operator: return "unknown_operator";
    case ErrorCode::config_error: return "config_error";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::backend_unavailable: return "backend_unavailable";
    case ErrorCode::not_implemented: return "not_implemented";
    case ErrorCode::unsupported_feature: return "unsupported_feature";
    case ErrorCode::gpu_error: return "gpu_error";
    case ErrorCode::out_of_memory:
      return "out_of_memory";
    case ErrorCode::internal: return "internal";
  }
  return "?";
}

}  // namespace attnops
