#include "cli/verify.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnops/ext/attention.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"

namespace attnops::cli {

const OperationMetadata& metadata_that_ran(const Attention& attn, const DispatchDecision& d) {
  return d.fell_back() ? fallback_of(attn).metadata() : attn.metadata();
}

double max_error_vs_oracle(const TensorView& q, const TensorView& k, const TensorView& v,
                           const AttentionOptions& options, const OperationMetadata& metadata,
                           const Tensor& out) {
  const AttentionProblem p = make_problem(q, k, v, options, metadata);
  const native::ReferenceResult ref = native::reference_attention_f64(p, false);
  if (static_cast<std::size_t>(out.numel()) != ref.out.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double got = out.at(i);
    const double err = std::abs(got - ref.out[i]);
    if (!std::isfinite(err)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, err);
  }
  return worst;
}

double max_gradient_error_vs_oracle(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse, const TensorView& dout,
                                    const AttentionOptions& options, const OperationMetadata& metadata,
                                    const AttentionGradients& grads) {
  const BackwardProblem bp = make_backward_problem(q, k, v, out, lse, dout, options, metadata);
  const native::ReferenceGradients ref = native::reference_backward_f64(bp);
  double worst = 0;
  const auto compare = [&](const Tensor* got, const std::vector<double>& want) {
    if (want.empty()) return;
    if (!got || static_cast<std::size_t>(got->numel()) != want.size()) {
      worst = std::numeric_limits<double>::infinity();
      return;
    }
    for (std::size_t i = 0; i < want.size(); ++i) {
      const double err = std::abs(static_cast<double>(got->at(i)) - want[i]);
      worst = std::isfinite(err) ? std::max(worst, err) : std::numeric_limits<double>::infinity();
    }
  };
  compare(&grads.dq, ref.dq);
  compare(&grads.dk, ref.dk);
  compare(&grads.dv, ref.dv);
  compare(grads.dsinks ? &*grads.dsinks : nullptr, ref.dsinks);
  compare(grads.dbias ? &*grads.dbias : nullptr, ref.dbias);
  return worst;
}

}  // namespace attnops::cli
