// Generated inputs for demo and bench: deterministic uniform values in [-1, 1).
#pragma once

#include <cstdint>
#include <vector>

#include "attnops/tensor.h"

namespace attnops::cli {

// Uniform in [-1, 1), rounded to `dtype` (a float dtype); the same seed gives the same tensor.
Tensor random_tensor(DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t seed);

// q [B, Tq, Hq, D], k and v [B, Tk, Hkv, D] from seeds seed, seed + 1, seed + 2.
struct Qkv {
  Tensor q, k, v;
};
Qkv random_qkv(std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
               std::int64_t D, DType dtype, std::uint64_t seed);

}  // namespace attnops::cli
