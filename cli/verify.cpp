#include "cli/verify.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/native/reference.h"

namespace attnops::cli {

const OperationMetadata& metadata_that_ran(const Attention& attn, const DispatchDecision& d) {
  return d.fell_back() ? attn.fallback().metadata() : attn.op().metadata();
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

}  // namespace attnops::cli
