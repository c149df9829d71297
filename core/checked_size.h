// Overflow-checked products for element counts and byte counts of shapes. Every size attnops
// derives from user-supplied dimensions goes through these, so a shape such as [2^62] or
// [2^32, 2^32, 2] is an error instead of a wrapped (and later overflowed) buffer size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace attnops {

// a * b for a, b >= 0, or nullopt when the product does not fit in int64.
inline std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of n non-negative dimensions, or nullopt on overflow.
inline std::optional<std::int64_t> checked_numel(const std::int64_t* dims, std::size_t n) {
  std::int64_t r = 1;
  for (std::size_t i = 0; i < n; ++i) {
    auto p = checked_mul(r, dims[i]);
    if (!p) return std::nullopt;
    r = *p;
  }
  return r;
}

}  // namespace attnops
