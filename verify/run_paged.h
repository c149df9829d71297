// One paged case on every ragged_paged target, through the public API (plan_paged,
// Attention::paged): out and lse against the fp64 oracle per sequence (each sequence's keys
// gathered from the pages, the dense oracle), padding rows 0 / -inf, the decision, call-to-call
// determinism, and batch invariance as the README promises it: a sequence's rows bitwise the same
// alone as inside the batch, at every thread count (native and cpu; on the gpu, per device).
#pragma once

#include <vector>

#include "verify/outcome.h"
#include "verify/paged_problem.h"

namespace attnops::verify {

std::vector<Finding> run_paged(const RunSettings& rs, const PagedSpec& spec,
                               const std::vector<Target>& targets, bool repeat, Tally& tally);

}  // namespace attnops::verify
