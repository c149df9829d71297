// VanillaAttn::forward_cpu: scores materialised per (batch, head) with Eigen GEMMs, softmax,
// weighted sum; OpenMP over (batch, head); GQA without copying K/V. q_len == 1 (decode) takes a
// streaming path that reads K/V once per kv head for all its q heads, split along kv across
// threads with a final merge when B x Hkv is small.
#pragma once

#include "attnops/problem.h"

namespace attnops::cpu {

void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers);

}  // namespace attnops::cpu
