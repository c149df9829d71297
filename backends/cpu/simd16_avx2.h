// simd16.h's body for the avx2 tier (AVX2 + FMA + F16C): a V16 is two __m256 (lanes 0-7, 8-15).
// Included by simd16.h only.
#pragma once

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the avx2 tier is compiled with -mavx2 -mfma -mf16c (backends/cpu/tiers.cmake)"
#endif

#include <immintrin.h>

namespace attnops::cpu::ATTNOPS_TIER_NS::simd {

struct V16 {
  __m256 lo, hi;
};

namespace avx2 {
// All-ones in the lanes whose bit of m (bits 0-7: lo, 8-15: hi) is set.
inline __m256 lanes_lo(Mask16 m) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(m), bits), bits));
}
inline __m256 lanes_hi(Mask16 m) {
  return lanes_lo(static_cast<Mask16>(m >> 8));
}
inline Mask16 bits(__m256 lo, __m256 hi) {
  return static_cast<Mask16>(_mm256_movemask_ps(lo) | (_mm256_movemask_ps(hi) << 8));
}
// Lanes [0, n) of the 8-lane half starting at lane `first`, as a maskload/maskstore mask.
inline __m256i first_lanes(int n, int first) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n - first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// exp of 8 lanes; see simd16_avx512.h (NaN propagates the same way; a NaN lane's 2^n is garbage,
// but NaN times it is NaN).
inline __m256 exp8(__m256 a) {
  const __m256 keep = _mm256_cmp_ps(a, _mm256_set1_ps(-87.f), _CMP_NLT_UQ);  // false for -inf
  __m256 x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.f), a));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  // 2^n for n in [-126, 127]: the exponent field built directly (normal numbers only).
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}
inline __m256 widen8(const std::uint16_t* p, bool bf16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}
}  // namespace avx2

inline V16 zero() {
  return {_mm256_setzero_ps(), _mm256_setzero_ps()};
}
inline V16 set1(float x) {
  return {_mm256_set1_ps(x), _mm256_set1_ps(x)};
}
inline V16 load(const float* p) {
  return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
inline void store(float* p, V16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
// Whole halves load and store plainly: on AMD Zen a masked store costs about 8 plain ones and a
// masked load 3 (and neither forwards from a recent store), and most calls are whole vectors.
inline V16 load_n(const float* p, int n) {
  if (n >= 16) return load(p);
  if (n >= 8) return {_mm256_loadu_ps(p), _mm256_maskload_ps(p + 8, avx2::first_lanes(n, 8))};
  return {_mm256_maskload_ps(p, avx2::first_lanes(n, 0)), _mm256_setzero_ps()};
}
inline void store_n(float* p, V16 a, int n) {
  if (n >= 16) return store(p, a);
  if (n >= 8) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_maskstore_ps(p + 8, avx2::first_lanes(n, 8), a.hi);
  } else {
    _mm256_maskstore_ps(p, avx2::first_lanes(n, 0), a.lo);
  }
}
inline V16 fma(V16 a, V16 b, V16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}  // a*b+c
inline V16 add(V16 a, V16 b) {
  return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}
inline V16 sub(V16 a, V16 b) {
  return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)};
}
inline V16 mul(V16 a, V16 b) {
  return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
}
inline V16 div(V16 a, V16 b) {
  return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)};
}
inline V16 max(V16 a, V16 b) {
  return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
}
inline V16 abs(V16 a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
// Lanes whose bit is set take `a`, the others `b`.
inline V16 select(Mask16 m, V16 a, V16 b) {
  return {_mm256_blendv_ps(b.lo, a.lo, avx2::lanes_lo(m)), _mm256_blendv_ps(b.hi, a.hi, avx2::lanes_hi(m))};
}
inline Mask16 eq(V16 a, V16 b) {
  return avx2::bits(_mm256_cmp_ps(a.lo, b.lo, _CMP_EQ_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_EQ_OQ));
}
inline Mask16 lt(V16 a, V16 b) {
  return avx2::bits(_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ), _mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ));
}
// Lanes that are not 0 (NaN lanes included).
inline Mask16 nonzero(V16 a) {
  const __m256 z = _mm256_setzero_ps();
  return avx2::bits(_mm256_cmp_ps(a.lo, z, _CMP_NEQ_UQ), _mm256_cmp_ps(a.hi, z, _CMP_NEQ_UQ));
}
// a*b+c in the lanes of m, c elsewhere.
inline V16 fma_masked(Mask16 m, V16 a, V16 b, V16 c) {
  return {_mm256_blendv_ps(c.lo, _mm256_fmadd_ps(a.lo, b.lo, c.lo), avx2::lanes_lo(m)),
          _mm256_blendv_ps(c.hi, _mm256_fmadd_ps(a.hi, b.hi, c.hi), avx2::lanes_hi(m))};
}
inline Mask16 eq_i32(const std::int32_t* seg, std::int32_t x) {
  const __m256i v = _mm256_set1_epi32(x);
  const __m256i lo = _mm256_cmpeq_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg)), v);
  const __m256i hi = _mm256_cmpeq_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(seg + 8)), v);
  return avx2::bits(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi));
}
inline V16 gather(const float* base, std::int32_t stride, Mask16 m) {
  const __m256i idx =
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
  const __m256 z = _mm256_setzero_ps();
  return {
      _mm256_mask_i32gather_ps(z, base, idx, avx2::lanes_lo(m), 4),
      _mm256_mask_i32gather_ps(z, base + static_cast<std::int64_t>(8) * stride, idx, avx2::lanes_hi(m), 4)};
}
inline V16 exp(V16 a) {
  return {avx2::exp8(a.lo), avx2::exp8(a.hi)};
}
inline float reduce_add(V16 a) {
  const __m256 s = _mm256_add_ps(a.lo, a.hi);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
inline float reduce_max(V16 a) {
  const __m256 s = _mm256_max_ps(a.lo, a.hi);
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
// n (0..32) bf16 values as pairs: even[l] = p[2l], odd[l] = p[2l + 1] (see simd16_avx512.h).
inline void widen_pairs_n(const std::uint16_t* p, int n, V16& even, V16& odd) {
  __m256i a, b;
  if (n >= 32) {
    a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
  } else {
    std::uint16_t tmp[32] = {};  // a short row: never read past its end
    std::memcpy(tmp, p, static_cast<std::size_t>(n > 0 ? n : 0) * sizeof(std::uint16_t));
    a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tmp));
    b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tmp + 16));
  }
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  even = {_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(b, 16))};
  odd = {_mm256_castsi256_ps(_mm256_and_si256(a, hi)), _mm256_castsi256_ps(_mm256_and_si256(b, hi))};
}
inline V16 widen_n(const std::uint16_t* p, bool bf16, int n) {
  if (n >= 16) return {avx2::widen8(p, bf16), avx2::widen8(p + 8, bf16)};
  std::uint16_t tmp[16] = {};  // a short row: never read past its end
  std::memcpy(tmp, p, static_cast<std::size_t>(n > 0 ? n : 0) * sizeof(std::uint16_t));
  return {avx2::widen8(tmp, bf16), avx2::widen8(tmp + 8, bf16)};
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::simd
