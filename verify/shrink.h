// The smallest failing case: a failing dense case made smaller (Tk, Tq, B, Hq, Hkv, D, Dv, each
// halved, then lowered by one) as long as it still fails, within a budget of tries and seconds.
// The result is the same spec with other sizes, so it replays with
// `attnops verify --replay SEED:CASE --shape B,Tq,Tk,Hq,Hkv,D,Dv ...`.
#pragma once

#include <functional>
#include <optional>

#include "verify/dense_problem.h"

namespace attnops::verify {

struct ShrinkBudget {
  int max_tries = 48;
  double max_seconds = 30;
};

struct ShrinkResult {
  DenseSpec spec;  // the smallest failing spec found (the input when nothing smaller fails)
  int tries = 0;
  bool smaller = false;
};

// `fails(spec)`: whether the spec still shows the failure.
ShrinkResult shrink_dense(const DenseSpec& spec, const std::function<bool(const DenseSpec&)>& fails,
                          const ShrinkBudget& budget = {});

}  // namespace attnops::verify
