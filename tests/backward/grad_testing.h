// Test support for the backward pass: the residuals of a case, and the comparison of gradients
// with the fp64 oracle under per-dtype tolerances.
//
// Tolerance: max |got - want| <= tol * max(1, max |want|), per gradient (as ../shared/golden_grad):
//   f32  4e-5   fp32 accumulation over up to Tq (dk, dv) or Tk (dq) terms, each a product of a
//               probability recomputed from an f32 lse; the worst seen over the parity grid is 4e-6
//   f16  4e-3   out, dout and the gradients are rounded to binary16 (half-ulp 4.9e-4 at 1.0) and
//               rowsum(dout * out) inherits out's rounding; worst seen 7e-4
//   bf16 2.5e-2 the same with bfloat16 (half-ulp 3.9e-3 at 1.0); worst seen 5e-3
// The oracle reads the same rounded q, k, v, dout, so input rounding is not error.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference_backward.h"
#include "tests/support/testing.h"

namespace attnops::testing {

double gradient_tolerance(DType t);

// A case's forward residuals (the fp64 oracle's out and lse, rounded as a kernel would store
// them) and a random upstream gradient, kept alive with the backward problem built from them.
struct BackwardCase {
  AttentionBuffers forward;
  Tensor dout;
  BackwardProblem bp;
};
BackwardCase make_backward_case(const Case& c, std::int64_t bq, std::int64_t bk, std::uint64_t seed);

// Compares every gradient of `got` (dq, dk, dv, and dsinks / dbias when present) with `want`.
::testing::AssertionResult gradients_match(const BackwardProblem& bp, const native::ReferenceGradients& want,
                                           const GradientBuffers& got,
                                           std::optional<double> tol = std::nullopt);

// Same for an AttentionGradients returned by the API.
::testing::AssertionResult gradients_match(const BackwardProblem& bp, const native::ReferenceGradients& want,
                                           const AttentionGradients& got,
                                           std::optional<double> tol = std::nullopt);

}  // namespace attnops::testing
