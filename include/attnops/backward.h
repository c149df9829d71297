// The backward pass: gradients of one attention call with respect to q, k, v, the sinks and the
// bias, given the upstream gradient dout of its output.
//
//   AttentionOutput fwd = attn(q, k, v, {.causal = true, .return_lse = true});
//   AttentionGradients g = attn.backward(q, k, v, fwd, dout, {.causal = true});
//   g.dq; g.dk; g.dv; g.decision;   // which operator and backend ran the backward, and why
//
// Layouts (BTHD, as the forward): dout [B, Tq, Hq, Dv] -> dq [B, Tq, Hq, D], dk [B, Tk, Hkv, D],
// dv [B, Tk, Hkv, Dv] in the runtime dtype (GQA: dk and dv summed over the q heads of a group);
// dsinks [Hq] f32 when sinks were given; dbias f32 in the bias's own shape [B|1, Hq|1, Tq, Tk]
// (summed over the dimensions it was broadcast along) when a bias was given. Segment ids, masks
// and the scale get no gradient. A fully masked row contributes nothing (zero gradients, no NaN).
//
// The backward takes the forward's out and lse (the FlashAttention-2 residuals): the cpu kernel
// recomputes the probabilities from the lse tile by tile, and uses out for the per-row term
// rowsum(dout * out). They must come from a forward of the same inputs and options; the native
// backward (the fp64 oracle) recomputes both itself and only checks their shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnops/decision.h"
#include "attnops/metadata.h"
#include "attnops/options.h"
#include "attnops/problem.h"
#include "attnops/tensor.h"

namespace attnops {

struct AttentionGradients {
  Tensor dq;                     // [B, Tq, Hq, D], runtime dtype
  Tensor dk;                     // [B, Tk, Hkv, D], runtime dtype
  Tensor dv;                     // [B, Tk, Hkv, Dv], runtime dtype
  std::optional<Tensor> dsinks;  // [Hq] f32, when sinks (softmax_aux) were given
  std::optional<Tensor> dbias;   // [B|1, Hq|1, Tq, Tk] f32 (the bias's shape), when a bias was given
  DispatchDecision decision;     // decision.pass == Pass::backward
};

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
