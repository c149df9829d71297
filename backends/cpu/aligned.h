// 64-byte aligned arrays for the per-tier kernels' scratch (per-tier header). The kernels keep
// std::vector<float> and other std templates over plain types out of tier objects: those
// instances are link-once symbols shared by every object that uses them, so a copy compiled
// for AVX-512 could be the one a baseline caller gets (tests/tiers checks the tier objects).
#pragma once

#if !defined(ATTNOPS_TIER_NS)
#error "backends/cpu/aligned.h is only for per-tier kernel sources (see backends/cpu/README.md)"
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace attnops::cpu::ATTNOPS_TIER_NS {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using AlignedArray = std::unique_ptr<T[], FreeDeleter>;

// n elements (n >= 0), 64-byte aligned, uninitialised; throws std::bad_alloc.
template <class T>
AlignedArray<T> aligned_array(std::int64_t n) {
  const std::int64_t bytes =
      (std::max<std::int64_t>(n, 1) * static_cast<std::int64_t>(sizeof(T)) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, static_cast<std::size_t>(bytes));
  if (!p) throw std::bad_alloc();
  return AlignedArray<T>(static_cast<T*>(p));
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
