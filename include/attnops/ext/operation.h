// OperationImpl: the interface every attention operator implements (as EasyDeL's OperationImpl).
//
// An operator has a canonical name and aliases, holds its OperationMetadata, and provides one
// forward per backend. forward_native is the portable reference; forward_cpu (OpenMP + SIMD,
// one ISA tier chosen at run time), forward_gpu (Vulkan) and forward_tpu are optional: the
// defaults throw Error(not_implemented) and, for tpu, Error(backend_unavailable). The dispatcher
// never calls a forward whose check_backend() rejected the call, so those throws are a safety
// net, not control flow.
//
// The backward pass mirrors this: implements_backward / check_backward_inputs gate the
// candidates, backward_native is the fp64 oracle, backward_cpu / backward_gpu / backward_tpu are
// optional (defaults: not_implemented, and backend_unavailable for tpu). An operator without
// backward_* overrides is forward-only: the dispatcher rejects every backend for its backward.
//
// Paged calls (a ragged batch over a paged KV cache, paged.h) have their own family the same
// way: implements_paged / check_paged_inputs gate the candidates, paged_native / paged_cpu /
// paged_gpu / paged_tpu run them (defaults: not_implemented, backend_unavailable for tpu). Only
// operators that serve paged batches (ragged_paged) override them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnops/backward.h"
#include "attnops/decision.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "attnops/metadata.h"
#include "attnops/options.h"

namespace attnops {

struct PagedProblem;

class OperationImpl {
 public:
  explicit OperationImpl(OperationMetadata metadata) : metadata_(std::move(metadata)) {}
  virtual ~OperationImpl() = default;
  OperationImpl(const OperationImpl&) = delete;
  OperationImpl& operator=(const OperationImpl&) = delete;

  virtual std::string name() const = 0;
  virtual std::vector<std::string> aliases() const { return {}; }
  const OperationMetadata& metadata() const { return metadata_; }

  // Whether this operator has a real forward for `backend` (not whether the host has it).
  virtual bool implements(Backend backend) const = 0;
  // Whether this operator can return attention weights (return_weights: vanilla only).
  virtual bool returns_weights() const { return false; }
  // Can this operator's `backend` forward run this problem? nullopt = yes; otherwise the reason
  // (unsupported_feature, unsupported_dtype, ...). Called only for implemented backends.
  virtual std::optional<Reason> check_inputs(Backend backend, const AttentionProblem& p) const;

  virtual AttentionOutput forward_native(const AttentionProblem& p) = 0;
  virtual AttentionOutput forward_cpu(const AttentionProblem& p);
  virtual AttentionOutput forward_gpu(const AttentionProblem& p);
  virtual AttentionOutput forward_tpu(const AttentionProblem& p);
  AttentionOutput forward(Backend backend, const AttentionProblem& p);

  // Backward: gradients of the forward this operator ran (see backward.h).
  virtual bool implements_backward(Backend) const { return false; }
  virtual std::optional<Reason> check_backward_inputs(Backend backend, const BackwardProblem& p) const;
  virtual AttentionGradients backward_native(const BackwardProblem& p);
  virtual AttentionGradients backward_cpu(const BackwardProblem& p);
  virtual AttentionGradients backward_gpu(const BackwardProblem& p);
  virtual AttentionGradients backward_tpu(const BackwardProblem& p);
  AttentionGradients backward(Backend backend, const BackwardProblem& p);

  // Paged: one call over a ragged batch and a paged KV cache (paged.h, paged_problem.h).
  virtual bool implements_paged(Backend) const { return false; }
  virtual std::optional<Reason> check_paged_inputs(Backend backend, const PagedProblem& p) const;
  virtual AttentionOutput paged_native(const PagedProblem& p);
  virtual AttentionOutput paged_cpu(const PagedProblem& p);
  virtual AttentionOutput paged_gpu(const PagedProblem& p);
  virtual AttentionOutput paged_tpu(const PagedProblem& p);
  AttentionOutput paged(Backend backend, const PagedProblem& p);

 private:
  OperationMetadata metadata_;
};

}  // namespace attnops
