// For operator and backend authors: the validated form of one backward call and its gradient
// storage (the public side is backward.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnops/backward.h"
#include "attnops/ext/problem.h"
#include "attnops/metadata.h"
#include "attnops/options.h"
#include "attnops/tensor.h"

namespace attnops {

// One backward call, validated and normalised: the forward's problem plus the residuals and the
// upstream gradient. out and dout are in fwd.dtype with stride(3) == 1 (copied when not); lse is
// contiguous f32 [B, Hq, Tq].
struct BackwardProblem {
  AttentionProblem fwd;
  TensorView out;              // [B, Tq, Hq, Dv]
  const float* lse = nullptr;  // [B, Hq, Tq]; -inf marks a fully masked row
  TensorView dout;             // [B, Tq, Hq, Dv]
  // dbias shape [bias_B, bias_H, Tq, Tk] (1 where the bias was broadcast); 0 without a bias.
  std::int64_t bias_B = 0, bias_H = 0;
  std::vector<Tensor> owned;  // converted copies that out / lse / dout may point into
};

// Validates the call as make_problem does (return_lse / return_weights of `options` are ignored)
// and the residuals: out and dout [B, Tq, Hq, Dv] of a float dtype, lse [B, Hq, Tq] of a float
// dtype. Throws Error(shape_mismatch / unsupported_dtype / invalid_argument) naming the argument.
BackwardProblem make_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse, const TensorView& dout,
                                      const AttentionOptions& options, const OperationMetadata& metadata);

// Gradient storage of one call, zero-filled (a kernel may skip what stays zero: empty blocks,
// fully masked rows). run: what the kernel reports, as AttentionBuffers::run.
struct GradientBuffers {
  Tensor dq, dk, dv;
  std::optional<Tensor> dsinks, dbias;
  RunInfo run;
};
GradientBuffers allocate_gradient_buffers(const BackwardProblem& bp);

// The backward's FLOP count by the usual convention: 2.5 times the forward's
// (attention_flops): five products (q.k recomputed, dout.v, p^T dout, ds^T q, ds k) for the
// forward's two.
double backward_flops(const AttentionProblem& p, double visible_pairs_per_head);

}  // namespace attnops
