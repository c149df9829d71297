// Fast tiled attention on the CPU (vectorised micro-kernels + OpenMP over (batch, q head,
// q block)); the forward_cpu of BlockSparseAttn and FlashAttn2. The kernel is compiled once per
// ISA tier (backends/cpu/README.md); this entry point validates the call, picks the tier
// (isa.h: detected, capped by ATTNOPS_CPU_ISA) and reports it in buffers.run.
#pragma once

#include "attnops/ext/problem.h"
#include "backends/common/block_map.h"
#include "backends/cpu/isa.h"

namespace attnops::cpu {

void tiled_attention(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers);
// With a given tier instead of the chosen one (tests: a tier of this build, or an emulated
// build's table). Error backend_unavailable when the CPU does not run `tier` or this build lacks it.
void tiled_attention(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers,
                     ForcedTier tier);

}  // namespace attnops::cpu
