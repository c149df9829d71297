// The shared forward glue of the two tiled operators (BlockSparseAttn, FlashAttn2): both run the
// tiled online-softmax kernels over a block map built from the call's static mask, so empty
// blocks are skipped and full blocks evaluate no mask. They differ in their defaults (fallbacks,
// block sizes) and in what model code expects of them, as in EasyDeL.
#pragma once

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/operation.h"
#include "attnops/ext/problem.h"
#include "backends/vulkan/vulkan_backend.h"

namespace attnops {

class TiledOperator : public OperationImpl {
 public:
  using OperationImpl::OperationImpl;
  bool implements(Backend b) const override { return b != Backend::tpu; }
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

 protected:
  virtual vulkan::Kernel gpu_kernel() const = 0;
};

}  // namespace attnops
