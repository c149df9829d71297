// What "right" means for the fuzzer: results against the fp64 oracle at the documented per-dtype
// tolerances (tests/support/testing.h for out / lse, tests/backward/grad_testing.h for the
// gradients), non-finite values exactly where the oracle has them (README, Non-finite values), and
// bitwise equality where the README promises it.
//
// The tolerances of the tests hold for inputs in [-1, 1]; the fuzzer draws larger values too, so
// they are scaled by the problem, with L a bound on |logit| (Cauchy-Schwarz over q and k rows, the
// soft cap, the bias): out and lse get the f32 tolerance times L / 16 added (every path computes
// the logits in fp32, whose rounding error grows with their size, and a softmax weight inherits
// it), out is scaled by max(1, max |v|) (a convex combination of v rows), and the gradients'
// tolerance by (1 + L / 16) sqrt(max(1, Dv / 128)) (the residuals' rounding reaches dS through
// D = dout . out, a sum of Dv products, and is scaled by q or k). For inputs in [-1, 1] and
// D <= 256, L / 16 stays below 0.4.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/ext/problem.h"
#include "attnops/tensor.h"

namespace attnops::verify {

struct Tolerance {
  double out = 0, lse = 0, grad = 0;
};
// The tests' tolerances: f32 out 2e-5 lse 1e-4 grad 4e-5; f16 2e-3, 1e-3, 4e-3; bf16 1.6e-2, 1e-3, 2.5e-2.
Tolerance base_tolerance(DType t);

// The tolerance for one problem (see above); `vmax` = max |v| over finite elements. `out_dtype`:
// the dtype whose tolerance applies when it is not p.dtype (an 8-bit cache's oracle problem is
// f32, its call runs in q's dtype).
Tolerance problem_tolerance(const AttentionProblem& p, std::optional<DType> out_dtype = std::nullopt);

// What a kernel adds when it rounds K and V to `dtype` before attending (an 8-bit cache's values
// code x scale, rounded to q's 16-bit dtype for the tiled kernel): with u the dtype's unit
// roundoff, each logit moves by at most d = u L (L before the soft cap; at most 2 cap), so each
// weight by a factor within e^(2 d), and each value by u |v|: out by (e^(2 d) - 1 + u) max(1,
// max |v|), lse by d. Zero for f32.
Tolerance rounded_kv_tolerance(const AttentionProblem& p, DType dtype);

struct Mismatch {
  std::string what;  // "out", "lse", "dq", ..., or "decision", "error", "determinism", ...
  double err = 0;    // the largest error (inf for a wrong class: NaN / inf where the oracle has none)
  double tol = 0;
  std::string where;         // e.g. "out[b=0, i=129, h=3, d=7] = 0.41 (oracle -0.02)"
  std::string line() const;  // "out: max err 0.43 > tol 2e-05 at out[...]"
};

// got (any float dtype, `shape`) against want (fp64, the same flat order): NaN exactly where want
// is NaN, +-inf exactly where want holds the same infinity, finite values within `tol` absolute.
// `relative_to_max`: the tolerance is tol * max(1, max |want|) (the gradients' rule).
std::optional<Mismatch> compare_values(const std::string& name, const Tensor& got,
                                       const std::vector<double>& want,
                                       const std::vector<std::int64_t>& shape, double tol,
                                       bool relative_to_max = false);

// Bitwise equality of two results of the same call (determinism, thread counts, batch invariance).
std::optional<Mismatch> compare_bitwise(const std::string& name, const Tensor& a, const Tensor& b);
// The same over rows [row0, row0 + rows) of dimension 0 of `whole` against all of `part`.
std::optional<Mismatch> compare_bitwise_rows(const std::string& name, const Tensor& whole, std::int64_t row0,
                                             const Tensor& part);

// "[b=0, i=129, h=3, d=7]" for a flat index into `shape`, with these dimension names.
std::string index_text(std::int64_t flat, const std::vector<std::int64_t>& shape, const char* names = "bihd");

}  // namespace attnops::verify
