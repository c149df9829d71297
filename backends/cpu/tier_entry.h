// Declarations of the entry points each per-tier kernel source defines in its tier's namespace
// (the TierKernels fields of tier_kernels.h); included by the per-tier sources only.
#pragma once

#if !defined(ATTNOPS_TIER_NS) || !defined(ATTNOPS_TIER_LEVEL)
#error "backends/cpu/tier_entry.h is only for per-tier kernel sources (see backends/cpu/README.md)"
#endif

#include <cstdint>

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"

namespace attnops {
struct BlockMap;
}
namespace attnops::cpu {
struct VanillaPlan;
}
namespace attnops {
struct BackwardProblem;
struct GradientBuffers;
struct PagedProblem;
struct PagedBuffers;
}  // namespace attnops

namespace attnops::cpu::ATTNOPS_TIER_NS {

const char* tiled_forward(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers);
const char* vanilla_general_forward(const AttentionProblem& p, AttentionBuffers& buffers, int threads,
                                    const VanillaPlan& plan);
const char* vanilla_decode_forward(const AttentionProblem& p, AttentionBuffers& buffers, int threads,
                                   std::int64_t splits);
const char* tiled_backward(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads);
void* paged_stream_begin(const PagedProblem& p, PagedBuffers& buffers, int threads, const std::int32_t* items,
                         std::int64_t n_items, bool guard);
std::int64_t paged_stream_tasks(const void* job);
void paged_stream_item(void* job, int thread, std::int64_t k);
std::int64_t paged_stream_merges(const void* job);
void paged_stream_merge(void* job, int thread, std::int64_t m);
void paged_stream_end(void* job);

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
