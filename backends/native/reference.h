// The fp64 oracle: plain loops, every semantic of the README, no tiling, no threads.
// VanillaAttn::forward_native runs it; every test of every kernel compares against it.
#pragma once

#include <cstdint>
#include <vector>

#include "attnops/ext/problem.h"

namespace attnops::native {

// lse semantics (matches PyTorch's golden set): lse = log(sum over VISIBLE keys of exp(s_j)),
// i.e. the sink logit (softmax_aux) takes probability mass from the output normaliser
//   out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink - m))
// but is NOT included in lse. A row with no visible key: out = 0, lse = -inf (sink or not).
//
// Results in fp64, before any rounding to the storage dtype.
struct ReferenceResult {
  std::vector<double> out;      // [B, Tq, Hq, Dv]
  std::vector<double> lse;      // [B, Hq, Tq]; -inf for a fully masked row
  std::vector<double> weights;  // [B, Hq, Tq, Tk] when want_weights (else empty)
};

// Shared by the forward and backward oracles. to_f64: a BTHD view as a contiguous fp64 array
// [B, T, H, D]. visible: whether query row i of q head h in batch b sees key j, evaluated from the
// options as given (causal, window, chunk, user mask, segments), not from the combined Mask.
std::vector<double> to_f64(const TensorView& t);
bool visible(const AttentionProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j);

ReferenceResult reference_attention_f64(const AttentionProblem& p, bool want_weights);

// Same, rounded into the buffers (out in p.dtype, lse and weights f32).
void reference_attention(const AttentionProblem& p, AttentionBuffers& buffers);

}  // namespace attnops::native
