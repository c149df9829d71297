// FlashAttention-2 backward on the CPU (hand-vectorised micro-kernels + OpenMP): the
// backward_cpu of every operator (vanilla included: the gradient is a property of the function,
// not of the forward's algorithm). `map` is the block map of the call's static mask (empty tiles
// skipped, full tiles evaluate no mask); results are bitwise identical for any thread count.
#pragma once

#include "attnops/backward.h"
#include "backends/common/block_map.h"

namespace attnops::cpu {

void tiled_backward(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads);

}  // namespace attnops::cpu
