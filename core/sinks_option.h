// The sinks of a call: options name them `sinks` or, as EasyDeL does, `softmax_aux`.
#pragma once

#include <optional>

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

}  // namespace attnops
