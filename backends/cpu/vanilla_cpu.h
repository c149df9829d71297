// VanillaAttn::forward_cpu: scores materialised per (batch, kv head, q chunk) with micro-kernel
// GEMMs, softmax, weighted sum; OpenMP over tasks; GQA without copying K/V. q_len <= 4 (decode)
// takes a streaming path that reads K/V once per kv head for all its q heads, split along kv
// across threads with a final merge when B x Hkv is small. Both are compiled once per ISA tier
// (backends/cpu/README.md); these entry points pick the path and the tier and report them in
// buffers.run.
#pragma once

#include "attnops/problem.h"
#include "backends/cpu/isa.h"

namespace attnops::cpu {

void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers);
// With a given tier instead of the chosen one (tests). Error backend_unavailable when the CPU
// does not run `tier` or this build lacks it.
void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers, Isa tier);

}  // namespace attnops::cpu
