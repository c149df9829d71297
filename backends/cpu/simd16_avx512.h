// simd16.h's body for the AVX-512 tiers: one __m512 per V16. Included by simd16.h only.
#pragma once

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512DQ__) || !defined(__AVX512VL__)
#error \
    "the AVX-512 tiers are compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl (backends/cpu/tiers.cmake)"
#endif

#include <immintrin.h>
// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 intrinsics (they start
// from _mm512_undefined_*; GCC bug 105593). The warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS::simd {

struct V16 {
  __m512 v;
};
// Lanes [0, n) (n in 0..16).
inline __mmask16 first_lanes(int n) {
  return static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1u);
}
inline V16 zero() {
  return {_mm512_setzero_ps()};
}
inline V16 set1(float x) {
  return {_mm512_set1_ps(x)};
}
inline V16 load(const float* p) {
  return {_mm512_loadu_ps(p)};
}
inline void store(float* p, V16 a) {
  _mm512_storeu_ps(p, a.v);
}
inline V16 load_n(const float* p, int n) {
  return {_mm512_maskz_loadu_ps(first_lanes(n), p)};
}
inline void store_n(float* p, V16 a, int n) {
  _mm512_mask_storeu_ps(p, first_lanes(n), a.v);
}
inline V16 fma(V16 a, V16 b, V16 c) {
  return {_mm512_fmadd_ps(a.v, b.v, c.v)};
}  // a*b+c
inline V16 add(V16 a, V16 b) {
  return {_mm512_add_ps(a.v, b.v)};
}
inline V16 mul(V16 a, V16 b) {
  return {_mm512_mul_ps(a.v, b.v)};
}
inline V16 max(V16 a, V16 b) {
  return {_mm512_max_ps(a.v, b.v)};
}
// Lanes whose bit is set take `a`, the others `b`.
inline V16 select(Mask16 m, V16 a, V16 b) {
  return {_mm512_mask_mov_ps(b.v, m, a.v)};
}
inline V16 sub(V16 a, V16 b) {
  return {_mm512_sub_ps(a.v, b.v)};
}
inline V16 div(V16 a, V16 b) {
  return {_mm512_div_ps(a.v, b.v)};
}
inline V16 abs(V16 a) {
  return {_mm512_abs_ps(a.v)};
}
inline Mask16 eq(V16 a, V16 b) {
  return _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ);
}
inline Mask16 lt(V16 a, V16 b) {
  return _mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ);
}
inline Mask16 nonzero(V16 a) {
  return _mm512_cmp_ps_mask(a.v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
}
inline V16 fma_masked(Mask16 m, V16 a, V16 b, V16 c) {
  return {_mm512_mask3_fmadd_ps(a.v, b.v, c.v, m)};
}
// Lanes l with seg[l] == x (seg has 16 valid entries).
inline Mask16 eq_i32(const std::int32_t* seg, std::int32_t x) {
  return _mm512_cmpeq_epi32_mask(_mm512_loadu_si512(seg), _mm512_set1_epi32(x));
}
// v[l] = base[l * stride] for the lanes of `m`, 0 elsewhere (strided loads of a bias column).
inline V16 gather(const float* base, std::int32_t stride, Mask16 m) {
  const __m512i idx = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(stride));
  return {_mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, base, 4)};
}

// exp(x) with ~1 ulp error (Cephes expf's polynomial) for -87 <= x <= 88.3; below -87 (and -inf)
// exactly 0. The result is never subnormal: x >= -87 keeps 2^n * p >= 2^-126. NaN stays NaN: the
// clamps take x as their second operand (max/min return the second operand when either is NaN)
// and `keep` is true for unordered lanes, so the NaN flows through the polynomial.
inline V16 exp(V16 a) {
  const __mmask16 keep = _mm512_cmp_ps_mask(a.v, _mm512_set1_ps(-87.f), _CMP_NLT_UQ);  // false for -inf
  __m512 x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-87.f), a.v));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 x2 = _mm512_mul_ps(x, x);
  p = _mm512_fmadd_ps(p, x2, _mm512_add_ps(x, _mm512_set1_ps(1.f)));
  return {_mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n))};
}

inline float reduce_add(V16 a) {
  return _mm512_reduce_add_ps(a.v);
}
inline float reduce_max(V16 a) {
  return _mm512_reduce_max_ps(a.v);
}

// n (0..32) bf16 values widened to fp32 (exact) as pairs: even[l] = p[2l], odd[l] = p[2l + 1];
// elements >= n are 0. One load, a shift and a mask: no per-element conversion.
inline void widen_pairs_n(const std::uint16_t* p, int n, V16& even, V16& odd) {
  const __mmask32 m = n >= 32 ? ~__mmask32{0} : (__mmask32{1} << (n > 0 ? n : 0)) - 1;
  const __m512i x = _mm512_maskz_loadu_epi16(m, p);
  even = {_mm512_castsi512_ps(_mm512_slli_epi32(x, 16))};
  odd = {_mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}

// n (0..16) f16 or bf16 values widened to fp32 (exact); lanes >= n are 0.
inline V16 widen_n(const std::uint16_t* p, bool bf16, int n) {
  const __m256i h = _mm256_maskz_loadu_epi16(first_lanes(n), p);
  if (bf16) return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
  return {_mm512_cvtph_ps(h)};
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::simd
