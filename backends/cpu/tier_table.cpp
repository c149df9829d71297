// Per-tier source: this tier's TierKernels table (its entry points, see tier_kernels.h).
// A constant-initialised local: no static initialiser runs in a tier object at load time
// (it would run on every CPU, before any dispatch).
#include "backends/cpu/tier_entry.h"
#include "backends/cpu/tier_kernels.h"

namespace attnops::cpu::ATTNOPS_TIER_NS {

const TierKernels& tier_kernels() {
#if defined(ATTNOPS_ISA_EMULATE)
  constexpr bool kEmulated = true;
#else
  constexpr bool kEmulated = false;
#endif
  static constexpr TierKernels kTable{static_cast<Isa>(ATTNOPS_TIER_LEVEL),
                                      kEmulated,
                                      &tiled_forward,
                                      &vanilla_general_forward,
                                      &vanilla_decode_forward,
                                      &tiled_backward,
                                      &paged_stream_begin,
                                      &paged_stream_tasks,
                                      &paged_stream_item,
                                      &paged_stream_merges,
                                      &paged_stream_merge,
                                      &paged_stream_end};
  return kTable;
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
