// The running result of a rank's query rows while key blocks arrive, merged by log-sum-exp in
// fp32 (the form of FlashAttention's online softmax and of ring-flash-attention's
// update_out_and_lse):
//   lse = lse_a + log1p(exp(lse_b - lse_a))           (for lse_a >= lse_b; symmetric)
//   out = sigmoid(lse_a - lse_b) * out_a + sigmoid(lse_b - lse_a) * out_b   (a weight 0 adds nothing)
// A block whose row saw nothing (lse -inf) changes nothing; a row that saw nothing anywhere ends
// with out 0 and lse -inf; a NaN propagates to its row. Sinks are folded in once, at the end.
#pragma once

#include <cstdint>

#include "attnops/tensor.h"

namespace attnops::dist::detail {

class RowState {
 public:
  RowState(std::int64_t B, std::int64_t rows, std::int64_t Hq, std::int64_t Dv);
  // Merges a local call's result for rows [r0, r0 + out.dim(1)): out [B, n, Hq, Dv] (any float
  // dtype), lse [B, Hq, n] f32.
  void merge(std::int64_t r0, const Tensor& out, const Tensor& lse, int threads);
  // Sinks (f32 [Hq], or null): out *= 1 / (1 + exp(sink_h - lse)); lse stays the keys' own.
  void fold_sinks(const float* sinks);
  // out [B, rows, Hq, Dv] in `dtype`, lse [B, Hq, rows] f32.
  Tensor out(DType dtype) const;
  const Tensor& lse() const { return lse_; }

 private:
  std::int64_t B_, rows_, Hq_, Dv_;
  Tensor out_;  // f32 [B, rows, Hq, Dv]
  Tensor lse_;  // f32 [B, Hq, rows]
};

// The lse the backward's probabilities are relative to: logaddexp(lse, sink_h) with sinks (the
// sink is part of the softmax's denominator), lse itself without. f32 [B, Hq, rows].
Tensor lse_with_sinks(const TensorView& lse, const float* sinks);

}  // namespace attnops::dist::detail
