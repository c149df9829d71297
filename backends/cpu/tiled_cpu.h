// Fast tiled attention on the CPU (Eigen / hand-vectorised micro-kernels + OpenMP over
// (batch, q head, q block)); the forward_cpu of BlockSparseAttn and FlashAttn2.
#pragma once

#include "attnops/problem.h"
#include "backends/common/block_map.h"

namespace attnops::cpu {

void tiled_attention(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers);

}  // namespace attnops::cpu
