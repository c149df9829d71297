#include "verify/shrink.h"

#include <array>
#include <chrono>

namespace attnops::verify {

ShrinkResult shrink_dense(const DenseSpec& spec, const std::function<bool(const DenseSpec&)>& fails,
                          const ShrinkBudget& budget) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  ShrinkResult r{spec, 0, false};
  const auto out_of_budget = [&] {
    return r.tries >= budget.max_tries ||
           std::chrono::duration<double>(clock::now() - start).count() >= budget.max_seconds;
  };
  // Sizes in the order tried: the sequences first (they dominate the cost), then batch and heads.
  const auto sizes = [](const DenseSpec& s) {
    return std::array<std::int64_t, 7>{s.Tk, s.Tq, s.B, s.Hq, s.Hkv, s.D, s.Dv};
  };
  const auto resized = [](const DenseSpec& s, const std::array<std::int64_t, 7>& v) {
    return with_shape(s, v[2], v[1], v[0], v[3], v[4], v[5], v[6]);
  };
  for (bool progress = true; progress && !out_of_budget();) {
    progress = false;
    for (std::size_t d = 0; d < 7 && !out_of_budget(); ++d) {
      // Halve, then step down by one, while it keeps failing.
      for (int step = 0; step < 2 && !out_of_budget(); ++step) {
        std::array<std::int64_t, 7> v = sizes(r.spec);
        const std::int64_t now = v[d];
        const std::int64_t next = step == 0 ? now / 2 : now - 1;
        if (next < 1 || next == now) continue;
        v[d] = next;
        const DenseSpec candidate = resized(r.spec, v);
        if (sizes(candidate) == sizes(r.spec)) continue;
        ++r.tries;
        if (fails(candidate)) {
          r.spec = candidate;
          r.smaller = progress = true;
          --step;  // the same step again from the new size
        }
      }
    }
  }
  return r;
}

}  // namespace attnops::verify
