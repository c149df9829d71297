#include "attnops/ext/operation.h"

#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"

namespace attnops {

std::optional<Reason> OperationImpl::check_inputs(Backend, const AttentionProblem&) const {
  return std::nullopt;
}

AttentionOutput OperationImpl::forward_cpu(const AttentionProblem&) {
  throw Error(ErrorCode::not_implemented, name() + ": forward_cpu is not implemented");
}

AttentionOutput OperationImpl::forward_gpu(const AttentionProblem&) {
  throw Error(ErrorCode::not_implemented, name() + ": forward_gpu is not implemented");
}

AttentionOutput OperationImpl::forward_tpu(const AttentionProblem&) {
  throw Error(
      ErrorCode::backend_unavailable,
      name() + ": forward_tpu: no TPU runtime exists in this build (attnops has no PJRT/libtpu backend)");
}

AttentionOutput OperationImpl::forward(Backend backend, const AttentionProblem& p) {
  switch (backend) {
    case Backend::native:
      return forward_native(p);
    case Backend::cpu:
      return forward_cpu(p);
    case Backend::gpu:
      return forward_gpu(p);
    case Backend::tpu:
      return forward_tpu(p);
  }
  throw Error(ErrorCode::internal, "unknown backend");
}

std::optional<Reason> OperationImpl::check_backward_inputs(Backend, const BackwardProblem&) const {
  return std::nullopt;
}

AttentionGradients OperationImpl::backward_native(const BackwardProblem&) {
  throw Error(ErrorCode::not_implemented, name() + ": backward_native is not implemented");
}

AttentionGradients OperationImpl::backward_cpu(const BackwardProblem&) {
  throw Error(ErrorCode::not_implemented, name() + ": backward_cpu is not implemented");
}

AttentionGradients OperationImpl::backward_gpu(const BackwardProblem&) {
  throw Error(ErrorCode::not_implemented, name() + ": backward_gpu is not implemented");
}

AttentionGradients OperationImpl::backward_tpu(const BackwardProblem&) {
  throw Error(
      ErrorCode::backend_unavailable,
      name() + ": backward_tpu: no TPU runtime exists in this build (attnops has no PJRT/libtpu backend)");
}

AttentionGradients OperationImpl::backward(Backend backend, const BackwardProblem& p) {
  switch (backend) {
    case Backend::native:
      return backward_native(p);
    case Backend::cpu:
      return backward_cpu(p);
    case Backend::gpu:
      return backward_gpu(p);
    case Backend::tpu:
      return backward_tpu(p);
  }
  throw Error(ErrorCode::internal, "unknown backend");
}

std::optional<Reason> OperationImpl::check_paged_inputs(Backend, const PagedProblem&) const {
  return std::nullopt;
}

AttentionOutput OperationImpl::paged_native(const PagedProblem&) {
  throw Error(ErrorCode::not_implemented, name() + ": paged_native is not implemented");
}

AttentionOutput OperationImpl::paged_cpu(const PagedProblem&) {
  throw Error(ErrorCode::not_implemented, name() + ": paged_cpu is not implemented");
}

AttentionOutput OperationImpl::paged_gpu(const PagedProblem&) {
  throw Error(ErrorCode::not_implemented, name() + ": paged_gpu is not implemented");
}

AttentionOutput OperationImpl::paged_tpu(const PagedProblem&) {
  throw Error(
      ErrorCode::backend_unavailable,
      name() + ": paged_tpu: no TPU runtime exists in this build (attnops has no PJRT/libtpu backend)");
}

AttentionOutput OperationImpl::paged(Backend backend, const PagedProblem& p) {
  switch (backend) {
    case Backend::native:
      return paged_native(p);
    case Backend::cpu:
      return paged_cpu(p);
    case Backend::gpu:
      return paged_gpu(p);
    case Backend::tpu:
      return paged_tpu(p);
  }
  throw Error(ErrorCode::internal, "unknown backend");
}

}  // namespace attnops
