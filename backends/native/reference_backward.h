// The fp64 oracle of the backward pass: plain loops over (batch, q head, query row), every
// semantic of the README, no tiling, no threads. Every operator's backward_native runs it, and
// every backward kernel is tested against it (the oracle itself against finite differences).
#pragma once

#include <vector>

#include "attnops/backward.h"
#include "attnops/ext/backward_problem.h"

namespace attnops::native {

// Gradients in fp64, before any rounding to the storage dtype, in the layouts of
// GradientBuffers (dsinks / dbias empty when the call has no sinks / bias).
struct ReferenceGradients {
  std::vector<double> dq, dk, dv, dsinks, dbias;
};

// Recomputes the forward in fp64 row by row (bp.out and bp.lse are not read: the oracle does
// not trust the residuals it is meant to check), then, for query row i with probabilities p_j
// (the sink in the denominator), output o_i and upstream gradient g_i = dout_i:
//   D_i  = g_i . o_i                         dp_ij = g_i . v_j
//   ds_ij = p_ij (dp_ij - D_i)               dbias_ij += ds_ij (summed over broadcast dims)
//   dx_ij = ds_ij (1 - tanh^2(x_ij / cap))   (x_ij = scale q_i . k_j; the factor is 1 without a cap)
//   dq_i += scale dx_ij k_j    dk_j += scale dx_ij q_i    dv_j += p_ij g_i   (GQA: summed per group)
//   dsinks_h += -p_sink,i D_i
// A fully masked row contributes nothing.
ReferenceGradients reference_backward_f64(const BackwardProblem& bp);

// Same, rounded into the buffers (dq, dk, dv in the storage dtype; dsinks, dbias f32).
void reference_backward(const BackwardProblem& bp, GradientBuffers& grads);

}  // namespace attnops::native
