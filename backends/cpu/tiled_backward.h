// FlashAttention-2 backward on the CPU (vectorised micro-kernels + OpenMP): the backward_cpu of
// every operator (vanilla included: the gradient is a property of the function, not of the
// forward's algorithm). `map` is the block map of the call's static mask (empty tiles skipped,
// full tiles evaluate no mask); results are bitwise identical for any thread count. The kernel is
// compiled once per ISA tier like the forward (backends/cpu/README.md); this entry point
// validates the call, picks the tier (isa.h: detected, capped by ATTNOPS_CPU_ISA) and reports it
// in grads.run.
#pragma once

#include "attnops/backward.h"
#include "attnops/ext/backward_problem.h"
#include "backends/common/block_map.h"
#include "backends/cpu/isa.h"

namespace attnops::cpu {

void tiled_backward(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads);
// With a given tier instead of the chosen one (tests: a tier of this build, or an emulated
// build's table). Error backend_unavailable when the CPU does not run `tier` or this build lacks it.
void tiled_backward(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads, ForcedTier tier);

}  // namespace attnops::cpu
