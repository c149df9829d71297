// OperationImpl: the interface every attention operator implements (as EasyDeL's OperationImpl).
//
// An operator has a canonical name and aliases, holds its OperationMetadata, and provides one
// forward per backend. forward_native is the portable reference; forward_cpu (OpenMP + SIMD,
// one ISA tier chosen at run time), forward_gpu (Vulkan) and forward_tpu are optional: the
// defaults throw Error(not_implemented) and, for tpu, Error(backend_unavailable). The dispatcher
// never calls a forward whose check_backend() rejected the call, so those throws are a safety
// net, not control flow.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnops/decision.h"
#include "attnops/metadata.h"
#include "attnops/options.h"
#include "attnops/problem.h"

namespace attnops {

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

 private:
  OperationMetadata metadata_;
};

}  // namespace attnops
