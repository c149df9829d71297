// The paged forward of the cpu backend (ragged_paged's paged_cpu): a plan's stream items on the
// per-tier stream kernel (paged_stream.cpp: K/V pages read in place, once per step for every q
// head of a kv head, split along the keys, merged in split order), then its tile items one
// sequence at a time on the tiled kernel (tiled_cpu.cpp) over the sequence's keys gathered into
// contiguous tensors (a copy of O(kv_len) against O(q_len x kv_len) work). Baseline code: it
// validates, picks the ISA tier and reports it, as cpu_dispatch.cpp does for the dense kernels.
//
// Non-finite values follow the README's policy per sequence: a sequence whose output holds NaN /
// inf while the values it reads do too is re-run with weight-0 keys skipped
// (PagedProblem::guard_nonfinite_v); other sequences never pay for it or see it.
#pragma once

#include "attnops/ext/paged_problem.h"
#include "backends/cpu/isa.h"

namespace attnops::cpu {

void paged_attention(const PagedProblem& p, PagedBuffers& buffers);
// With a given tier instead of the chosen one (tests: a tier of this build, or an emulated
// build's table). Error backend_unavailable when the CPU does not run `tier` or this build lacks it.
void paged_attention(const PagedProblem& p, PagedBuffers& buffers, ForcedTier tier);

}  // namespace attnops::cpu
