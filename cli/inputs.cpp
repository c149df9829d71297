#include "cli/inputs.h"

namespace attnops::cli {

Tensor random_tensor(DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t seed) {
  Tensor t(dtype, shape);
  // splitmix64: tiny, fast and good enough for test data; no <random> distribution differences
  // between standard libraries, so a seed means the same tensor everywhere.
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  const std::size_t n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    t.set(i, 2.f * u - 1.f);
  }
  return t;
}

Qkv random_qkv(std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
               std::int64_t D, DType dtype, std::uint64_t seed) {
  return {random_tensor(dtype, {B, Tq, Hq, D}, seed), random_tensor(dtype, {B, Tk, Hkv, D}, seed + 1),
          random_tensor(dtype, {B, Tk, Hkv, D}, seed + 2)};
}

}  // namespace attnops::cli
