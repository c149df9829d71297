// The table of kernels that one ISA tier provides, and the lookup by tier.
//
// Every per-tier kernel source (backends/cpu/tiers.cmake, ATTNOPS_CPU_TIER_SOURCES) is compiled
// once per tier inside namespace attnops::cpu::tier_<name>; tier_table.cpp, compiled per tier as
// well, collects that tier's entry points into its TierKernels. The dispatch code (baseline)
// picks a table with tier_kernels(Isa) and calls through it. Adding a kernel: see README.md.
#pragma once

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/isa.h"

namespace attnops {
struct BlockMap;
struct BackwardProblem;
struct GradientBuffers;
struct PagedProblem;
struct PagedBuffers;
}  // namespace attnops

namespace attnops::cpu {

struct VanillaPlan;

// Entry points of one tier. Each returns a short static text naming the code path it took
// (e.g. "f32 FMA micro-kernels", "bf16 VDPBF16PS"), which the dispatch adds to RunInfo.
// Inputs are validated before the call (cpu_dispatch.cpp): the kernels do not throw
// attnops::Error, only std::bad_alloc.
struct TierKernels {
  Isa isa;
  // A build of the tier's kernels with the instructions beyond AVX2 emulated (ATTNOPS_ISA_EMULATE:
  // the tests' builds, tests/tiers), never one of the library's own tables.
  bool emulated;
  // Flash / blocksparse (tiled_cpu.cpp): every tile of `map` of every (batch, q head, q block).
  const char* (*tiled)(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers);
  // Vanilla, materialised scores (vanilla_cpu.cpp; tasks and scratch as `plan` says) and decode
  // streaming (vanilla_decode.cpp).
  const char* (*vanilla_general)(const AttentionProblem& p, AttentionBuffers& buffers, int threads,
                                 const VanillaPlan& plan);
  const char* (*vanilla_decode)(const AttentionProblem& p, AttentionBuffers& buffers, int threads,
                                std::int64_t splits);
  // The backward of every operator (tiled_backward.cpp): dq, dk, dv (dsinks, dbias) over `map`.
  const char* (*backward)(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads);
  // The stream and shared items of a paged call (paged_stream.cpp), driven by paged_cpu.cpp's
  // parallel loop: begin allocates a job (an opaque handle) and the scratch of `threads` threads,
  // for `items` (indices into the plan's work list: its shared and stream items) or, with guard,
  // for the stream sequences `items` re-run split by split with weight-0 keys skipped (the
  // non-finite re-run); tasks(job) is how many tasks it made, item(job, thread, k) runs task k on
  // that thread's scratch; after every task, merge(job, thread, m) for m < merges(job); end frees
  // the job.
  void* (*paged_stream_begin)(const PagedProblem& p, PagedBuffers& buffers, int threads,
                              const std::int32_t* items, std::int64_t n_items, bool guard);
  std::int64_t (*paged_stream_tasks)(const void* job);
  void (*paged_stream_item)(void* job, int thread, std::int64_t k);
  std::int64_t (*paged_stream_merges)(const void* job);
  void (*paged_stream_merge)(void* job, int thread, std::int64_t m);
  void (*paged_stream_end)(void* job);
};

// Each tier's table, defined by tier_table.cpp compiled for that tier.
#define ATTNOPS_CPU_DECLARE_TIER(ns) \
  namespace ns {                     \
  const TierKernels& tier_kernels(); \
  }
ATTNOPS_CPU_DECLARE_TIER(tier_baseline)
ATTNOPS_CPU_DECLARE_TIER(tier_avx2)
ATTNOPS_CPU_DECLARE_TIER(tier_avx512)
ATTNOPS_CPU_DECLARE_TIER(tier_avx512bf16)
ATTNOPS_CPU_DECLARE_TIER(tier_amx)
#undef ATTNOPS_CPU_DECLARE_TIER

// The table of a compiled tier (isa_compiled(isa)); the caller must also have checked that the
// CPU runs it (choose_isa): calling a tier above the detected one faults.
const TierKernels& tier_kernels(Isa isa);

inline ForcedTier::ForcedTier(const TierKernels& kernels) : isa(kernels.isa), table(&kernels) {}

}  // namespace attnops::cpu
