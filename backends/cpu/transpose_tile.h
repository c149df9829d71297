// Per-tier header: fp32 tile transposition for the tiled forward (tiled_cpu.cpp): its Q^T block
// (every tier) and, on AVX2, its V^T tiles (tiled_common.h, transposes_v).
//   transpose_rows(src, lds, rows, cols, dst, ldd): dst[c * ldd + r] = src[r * lds + c]
//   transpose_words: the same for 32-bit words
// in 8 x 8 blocks of AVX2 shuffles on every tier that has AVX2 (the AVX-512 tiers too), scalar
// on the baseline and at the edges. A copy: no rounding, every tier gives the same bits.
#pragma once

#if !defined(ATTNOPS_TIER_NS)
#error "backends/cpu/transpose_tile.h is only for per-tier kernel sources (see backends/cpu/README.md)"
#endif

#include <cstdint>

#include "backends/cpu/simd16.h"  // ATTNOPS_SIMD_LEVEL

#if ATTNOPS_SIMD_LEVEL >= 1
#include <immintrin.h>
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS::transpose {

#if ATTNOPS_SIMD_LEVEL >= 1
// dst[c * ldd + r] = src[r * lds + c] for r, c < 8.
inline void block8x8(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved: a0 b0 a1 b1 | a4 b4 a5 b5, ...
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // quads: a0 b0 c0 d0 | a4 b4 c4 d4, ...
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {  // the 128-bit halves of rows a-d and e-h joined
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

inline void transpose_rows(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                           float* dst, std::int64_t ldd) {
  std::int64_t r8 = 0;
#if ATTNOPS_SIMD_LEVEL >= 1
  r8 = rows / 8 * 8;
  const std::int64_t c8 = cols / 8 * 8;
  for (std::int64_t r = 0; r < r8; r += 8) {
    for (std::int64_t c = 0; c < c8; c += 8) block8x8(src + r * lds + c, lds, dst + c * ldd + r, ldd);
    for (std::int64_t c = c8; c < cols; ++c)
      for (std::int64_t i = r; i < r + 8; ++i) dst[c * ldd + i] = src[i * lds + c];
  }
#endif
  for (std::int64_t r = r8; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// The same for 32-bit words (pairs of bf16): the AMX operands' packing (tiled_backward_amx.h).
// The 8 x 8 blocks move bits only (unpack / shuffle / permute), so any pattern survives.
inline void transpose_words(const std::uint32_t* src, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                            std::uint32_t* dst, std::int64_t ldd) {
  std::int64_t r8 = 0;
#if ATTNOPS_SIMD_LEVEL >= 1
  r8 = rows / 8 * 8;
  const std::int64_t c8 = cols / 8 * 8;
  for (std::int64_t r = 0; r < r8; r += 8) {
    for (std::int64_t c = 0; c < c8; c += 8)
      block8x8(reinterpret_cast<const float*>(src + r * lds + c), lds,
               reinterpret_cast<float*>(dst + c * ldd + r), ldd);
    for (std::int64_t c = c8; c < cols; ++c)
      for (std::int64_t i = r; i < r + 8; ++i) dst[c * ldd + i] = src[i * lds + c];
  }
#endif
  for (std::int64_t r = r8; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::transpose
