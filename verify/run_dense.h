// One dense case on every target of vanilla, blocksparse and flash_attn2, through the public
// API: the forward (out, lse, weights) and the backward (dq, dk, dv, dsinks, dbias) against the
// fp64 oracle, the decision (the forced backend and tier ran), call-to-call determinism where the
// README promises it (cpu and native; the gpu backward), and bitwise equality across thread
// counts where it promises that (the tiled forward, every cpu backward).
#pragma once

#include <vector>

#include "verify/dense_problem.h"
#include "verify/outcome.h"

namespace attnops::verify {

// `repeat`: whether each target's call is repeated for determinism (the fuzz loop draws it per
// case; replay and the shrinker repeat always).
std::vector<Finding> run_dense(const RunSettings& rs, const DenseSpec& spec,
                               const std::vector<Target>& targets, bool repeat, Tally& tally);

}  // namespace attnops::verify
