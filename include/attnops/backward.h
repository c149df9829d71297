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

#include "attnops/decision.h"
#include "attnops/metadata.h"
#include "attnops/options.h"
#include "attnops/tensor.h"

namespace attnops {

struct AttentionGradients {
  Tensor dq;                     // [B, Tq, Hq, D], runtime dtype
  Tensor dk;                     // [B, Tk, Hkv, D], runtime dtype
  Tensor dv;                     // [B, Tk, Hkv, Dv], runtime dtype
  std::optional<Tensor> dsinks;  // [Hq] f32, when sinks were given
  std::optional<Tensor> dbias;   // [B|1, Hq|1, Tq, Tk] f32 (the bias's shape), when a bias was given
  DispatchDecision decision;     // decision.pass == Pass::backward
};

}  // namespace attnops
