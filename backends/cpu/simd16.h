// A 16-lane fp32 vector for the CPU kernels, one body per ISA tier:
//   AVX-512 tiers (avx512, avx512bf16, amx)  one __m512            simd16_avx512.h
//   avx2                                     two __m256            simd16_avx2.h
//   baseline                                 GCC vector extension  simd16_generic.h (SSE2 on x86-64)
// The kernels are written once against these functions; every body computes the same algorithm
// (results differ only by fp32 rounding: the baseline has no FMA). Lane masks are 16-bit integers
// (bit l = lane l), as AVX-512's __mmask16.
//
// Only per-tier sources include this (they are compiled once per tier with ATTNOPS_TIER_NS and
// ATTNOPS_TIER_LEVEL defined, see backends/cpu/README.md): everything here lives in the tier's
// namespace, so the copies of different tiers never meet at link time (no ODR mix-up).
//
// Every body provides, in namespace simd:
//   V16 zero(), set1(x), load(p), store(p, a), load_n(p, n), store_n(p, a, n)   (n in 0..16; lanes
//       >= n read as 0, not written)
//   fma(a, b, c) = a*b+c, add, sub, mul, div, max, abs
//   Mask16 eq(a, b), lt(a, b), eq_i32(seg, x), nonzero(a) (NaN lanes count as nonzero);
//       V16 select(m, a, b) (a where the bit is set); fma_masked(m, a, b, c) (a*b+c where the bit
//       is set, c elsewhere: weight-0 lanes skipped, not multiplied, for the non-finite policy)
//   gather(base, stride, m): base[l * stride] for the lanes of m, 0 elsewhere
//   exp(a): ~1 ulp for -87 <= a <= 88.3; exactly 0 below -87 (-inf included), so the softmax
//       never makes subnormals (tiers would disagree on them: MXCSR vs DAZ/FTZ instructions);
//       NaN stays NaN (the non-finite policy, backends/common/softmax_policy.h)
//   reduce_add(a), reduce_max(a)
//   widen_n(p, bf16, n): n (0..16) f16 or bf16 values widened to fp32 (exact), 0 beyond
//   widen_pairs_n(p, n, even, odd): n (0..32) bf16 values widened as pairs, even[l] = p[2l],
//       odd[l] = p[2l + 1], 0 beyond (a shift and a mask per 32 values)
#pragma once

#if !defined(ATTNOPS_TIER_NS) || !defined(ATTNOPS_TIER_LEVEL)
#error "backends/cpu/simd16.h is only for per-tier kernel sources (see backends/cpu/README.md)"
#endif

// The vector body, 0 generic / 1 avx2 / 2 avx512: the tier's own unless the build names another.
// An emulated build (ATTNOPS_ISA_EMULATE, tests/tiers) compiles a tier's kernels with the avx2
// flags: its level (and so its paths, blockings and packings) stays the tier's, the vectors are
// AVX2's and the instructions beyond AVX2 are emulated (simd16_bf16.h, amx_tiles.h).
#if !defined(ATTNOPS_SIMD_LEVEL)
#if defined(ATTNOPS_ISA_EMULATE)
#error "an emulated tier build names its vector body (ATTNOPS_SIMD_LEVEL)"
#endif
#define ATTNOPS_SIMD_LEVEL (ATTNOPS_TIER_LEVEL >= 2 ? 2 : ATTNOPS_TIER_LEVEL)
#endif
#if ATTNOPS_SIMD_LEVEL > ATTNOPS_TIER_LEVEL
#error "ATTNOPS_SIMD_LEVEL above the tier's level"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attnops/dtype.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::simd {
using Mask16 = std::uint16_t;
}  // namespace attnops::cpu::ATTNOPS_TIER_NS::simd

#if ATTNOPS_SIMD_LEVEL >= 2
#include "backends/cpu/simd16_avx512.h"
#elif ATTNOPS_SIMD_LEVEL == 1
#include "backends/cpu/simd16_avx2.h"
#else
#include "backends/cpu/simd16_generic.h"
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS::simd {

// tanh via exp: tanh(t) = sign(t) * (1 - 2 / (exp(2|t|) + 1)); absolute error ~1e-7, which is
// what a soft cap (cap * tanh(s / cap)) needs: logits matter to the softmax in absolute terms.
// (exp's flush below -87 never matters: its argument here is >= 0.)
inline V16 tanh(V16 t) {
  const V16 e = exp(mul(set1(2.f), abs(t)));
  const V16 y = sub(set1(1.f), div(set1(2.f), add(e, set1(1.f))));
  return select(lt(t, zero()), sub(zero(), y), y);
}

// Converts n elements of a float-typed row (f32, f16 or bf16) to fp32, times `mul_by`.
// Widening f16/bf16 -> f32 is exact, so every tier gives the same bits.
inline void convert_row(const void* src, DType t, std::int64_t n, float* dst, float mul_by = 1.f) {
  if (t == DType::f32) {
    const float* s = static_cast<const float*>(src);
    if (mul_by == 1.f) {
      std::memcpy(dst, s, static_cast<std::size_t>(n) * sizeof(float));
    } else {
      for (std::int64_t i = 0; i < n; ++i) dst[i] = s[i] * mul_by;
    }
    return;
  }
  const std::uint16_t* s = static_cast<const std::uint16_t*>(src);
  const bool bf16 = t == DType::bf16;
  const V16 m = set1(mul_by);
  for (std::int64_t i = 0; i < n; i += 16) {
    const int w = n - i >= 16 ? 16 : static_cast<int>(n - i);
    store_n(dst + i, mul(widen_n(s + i, bf16, w), m), w);
  }
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::simd
