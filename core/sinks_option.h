// The sinks of a call: options name them `sinks` or, as EasyDeL does, `softmax_aux`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "attnops/error.h"
#include "attnops/tensor.h"

namespace attnops {

// The one that is set; Error(invalid_argument) naming both when both are.
inline const std::optional<TensorView>& sinks_option(const std::optional<TensorView>& sinks,
                                                     const std::optional<TensorView>& softmax_aux) {
  if (sinks && softmax_aux)
    throw Error(ErrorCode::invalid_argument,
                "sinks: given twice, as sinks and as softmax_aux (EasyDeL's name for them); set one");
  return sinks ? sinks : softmax_aux;
}

// Sinks must be one float logit per q head; `host_only` where the kernels read them on the host
// (paged calls). Typed errors naming the argument.
inline void check_sinks(const TensorView& s, std::int64_t Hq, bool host_only) {
  if (host_only && s.on_device())
    throw Error(ErrorCode::invalid_argument,
                "sinks (softmax_aux): a device tensor; sinks are a host tensor [Hq]");
  if (!is_float(s.dtype()))
    throw Error(ErrorCode::unsupported_dtype,
                "sinks (softmax_aux): expected a float dtype, got " + std::string(dtype_name(s.dtype())));
  if (s.rank() != 1 || s.dim(0) != Hq)
    throw Error(ErrorCode::shape_mismatch, "sinks (softmax_aux): expected shape [Hq=" + std::to_string(Hq) +
                                               "] (one sink logit per q head), got " +
                                               shape_string(s.shape()));
}

}  // namespace attnops
