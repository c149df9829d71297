// Deterministic benchmark inputs, shared by the bench binaries.
#pragma once

#include <cstdint>
#include <vector>

#include "attnops/tensor.h"

namespace attnops::bench {

// A tensor of `dt` filled with values in [-1, 1) from a seeded LCG: fast and repeatable.
inline Tensor filled(DType dt, std::vector<std::int64_t> shape, unsigned seed) {
  Tensor t(dt, std::move(shape));
  std::uint32_t x = seed * 2654435761u + 1u;
  const std::int64_t n = t.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    t.set(static_cast<std::size_t>(i), static_cast<float>(x >> 8) / 8388608.f - 1.f);
  }
  return t;
}

}  // namespace attnops::bench
