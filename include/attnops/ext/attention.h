// For operator authors and tests: the operators an Attention handle holds.
#pragma once

#include "attnops/ext/operation.h"
#include "attnops/registry.h"

namespace attnops {

struct AttentionAccess {
  static OperationImpl& op(const Attention& a) { return *a.op_; }
  static OperationImpl& fallback(const Attention& a) { return *a.vanilla_; }
};

// The requested operator and the vanilla operator its fallbacks hand calls to.
inline const OperationImpl& operation_of(const Attention& a) {
  return AttentionAccess::op(a);
}
inline const OperationImpl& fallback_of(const Attention& a) {
  return AttentionAccess::fallback(a);
}

}  // namespace attnops
