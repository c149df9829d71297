// VanillaAttn (name "vanilla"): scores materialised, softmax, weighted sum. Always available,
// the fallback of every operator, the right choice for decode (q_len == 1), and the only one that
// returns attention weights. forward_native is the fp64 oracle.
#pragma once

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/operation.h"
#include "attnops/ext/problem.h"

namespace attnops {

class VanillaAttn : public OperationImpl {
 public:
  using OperationImpl::OperationImpl;
  static OperationMetadata default_metadata();  // no fallbacks

  std::string name() const override { return "vanilla"; }
  bool implements(Backend b) const override { return b != Backend::tpu; }
  bool returns_weights() const override { return true; }
  std::optional<Reason> check_inputs(Backend b, const AttentionProblem& p) const override;

  AttentionOutput forward_native(const AttentionProblem& p) override;
  AttentionOutput forward_cpu(const AttentionProblem& p) override;
  AttentionOutput forward_gpu(const AttentionProblem& p) override;

  // Backward: native (the fp64 oracle), cpu and gpu (tiled FlashAttention-2), see backward_glue.h.
  bool implements_backward(Backend b) const override { return b != Backend::tpu; }
  std::optional<Reason> check_backward_inputs(Backend b, const BackwardProblem& p) const override;
  AttentionGradients backward_native(const BackwardProblem& p) override;
  AttentionGradients backward_cpu(const BackwardProblem& p) override;
  AttentionGradients backward_gpu(const BackwardProblem& p) override;
};

}  // namespace attnops
