// Tiled online-softmax attention in portable scalar C++ (no intrinsics, no threads): the
// algorithm of the fast CPU kernel, readable, the second oracle. Used by BlockSparseAttn and
// FlashAttn2 forward_native. Skips empty blocks of the map, evaluates no mask on full blocks.
#pragma once

#include "attnops/ext/problem.h"
#include "backends/common/block_map.h"

namespace attnops::native {

void tiled_attention(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers);

}  // namespace attnops::native
