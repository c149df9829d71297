// Accuracy of one call against the fp64 oracle (backends/native/reference.h).
#pragma once

#include "attnops/ext/operation.h"
#include "attnops/ext/problem.h"
#include "attnops/options.h"
#include "attnops/registry.h"
#include "attnops/tensor.h"

namespace attnops::cli {

// max |out - oracle| over every element of out [B, Tq, Hq, Dv]; +inf when out has a NaN or an
// infinity the oracle does not have. The problem is built with make_problem from the same
// inputs, options and metadata the call used, so it sees the same (rounded) inputs.
// The metadata of the operator that actually ran a call of `attn`: the fallback's (vanilla) when
// the decision says the call fell back, else the requested operator's.
const OperationMetadata& metadata_that_ran(const Attention& attn, const DispatchDecision& d);

double max_error_vs_oracle(const TensorView& q, const TensorView& k, const TensorView& v,
                           const AttentionOptions& options, const OperationMetadata& metadata,
                           const Tensor& out);

// Max |gradient - oracle| over dq, dk, dv (and dsinks, dbias when present) of a backward call
// with these inputs, residuals and options (backends/native/reference_backward.h); +inf for a
// NaN or infinity.
double max_gradient_error_vs_oracle(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const TensorView& lse, const TensorView& dout,
                                    const AttentionOptions& options, const OperationMetadata& metadata,
                                    const AttentionGradients& grads);

}  // namespace attnops::cli
