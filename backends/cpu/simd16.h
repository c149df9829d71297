// A 16-lane fp32 vector for the tiled CPU kernel: one AVX-512 register where the compiler
// targets AVX-512 (__AVX512F__), otherwise a plain array the compiler may auto-vectorise. The
// kernel is written once against these helpers; both paths compute the same algorithm.
// Lane masks are 16-bit integers (bit l = lane l), as AVX-512's __mmask16.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 intrinsics (they start
// from _mm512_undefined_*; GCC bug 105593). The warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif

#include "attnops/dtype.h"

namespace attnops::cpu::simd {

using Mask16 = std::uint16_t;

#if defined(__AVX512F__)

struct V16 {
  __m512 v;
};
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
// Lanes that are not 0 (NaN lanes included).
inline Mask16 nonzero(V16 a) {
  return _mm512_cmp_ps_mask(a.v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
}
// a*b+c in the lanes of m, c elsewhere.
inline V16 fma_masked(Mask16 m, V16 a, V16 b, V16 c) {
  return {_mm512_mask3_fmadd_ps(a.v, b.v, c.v, m)};
}
inline Mask16 lt(V16 a, V16 b) {
  return _mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ);
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

// exp(x) for x in fp32 with ~1 ulp error (Cephes expf's polynomial), x <= 88.3; x <= -120
// (and -inf) give exactly 0, so masked scores contribute nothing; NaN stays NaN (the clamps
// take x as their second operand, which max/min return when either is NaN). 2^n is applied with
// scalef, which handles the subnormal range without a separate path.
inline V16 exp(V16 a) {
  __m512 x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-120.f), a.v));
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
  return {_mm512_scalef_ps(p, n)};
}

#else  // portable path

struct V16 {
  float v[16];
};
inline V16 zero() {
  return V16{};
}
inline V16 set1(float x) {
  V16 r;
  for (float& e : r.v) e = x;
  return r;
}
inline V16 load(const float* p) {
  V16 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline void store(float* p, V16 a) {
  std::memcpy(p, a.v, sizeof a.v);
}
#define ATTNOPS_V16_MAP(expr)                 \
  V16 r;                                      \
  for (int l = 0; l < 16; ++l) r.v[l] = expr; \
  return r
inline V16 fma(V16 a, V16 b, V16 c) {
  ATTNOPS_V16_MAP(std::fma(a.v[l], b.v[l], c.v[l]));
}
inline V16 add(V16 a, V16 b) {
  ATTNOPS_V16_MAP(a.v[l] + b.v[l]);
}
inline V16 mul(V16 a, V16 b) {
  ATTNOPS_V16_MAP(a.v[l] * b.v[l]);
}
inline V16 max(V16 a, V16 b) {
  ATTNOPS_V16_MAP(a.v[l] > b.v[l] ? a.v[l] : b.v[l]);
}
inline V16 sub(V16 a, V16 b) {
  ATTNOPS_V16_MAP(a.v[l] - b.v[l]);
}
inline V16 div(V16 a, V16 b) {
  ATTNOPS_V16_MAP(a.v[l] / b.v[l]);
}
inline V16 abs(V16 a) {
  ATTNOPS_V16_MAP(std::fabs(a.v[l]));
}
inline V16 select(Mask16 m, V16 a, V16 b) {
  ATTNOPS_V16_MAP(((m >> l) & 1) ? a.v[l] : b.v[l]);
}
inline V16 exp(V16 a) {
  ATTNOPS_V16_MAP(a.v[l] < -120.f ? 0.f : std::exp(a.v[l]));
}
inline V16 gather(const float* base, std::int32_t stride, Mask16 m) {
  ATTNOPS_V16_MAP(((m >> l) & 1) ? base[static_cast<std::int64_t>(l) * stride] : 0.f);
}
#undef ATTNOPS_V16_MAP
inline Mask16 eq(V16 a, V16 b) {
  Mask16 m = 0;
  for (int l = 0; l < 16; ++l) m = static_cast<Mask16>(m | ((a.v[l] == b.v[l]) << l));
  return m;
}
inline Mask16 lt(V16 a, V16 b) {
  Mask16 m = 0;
  for (int l = 0; l < 16; ++l) m = static_cast<Mask16>(m | ((a.v[l] < b.v[l]) << l));
  return m;
}
inline Mask16 eq_i32(const std::int32_t* seg, std::int32_t x) {
  Mask16 m = 0;
  for (int l = 0; l < 16; ++l) m = static_cast<Mask16>(m | ((seg[l] == x) << l));
  return m;
}
inline Mask16 nonzero(V16 a) {
  Mask16 m = 0;
  for (int l = 0; l < 16; ++l) m = static_cast<Mask16>(m | ((a.v[l] != 0.f) << l));
  return m;
}
inline V16 fma_masked(Mask16 m, V16 a, V16 b, V16 c) {
  V16 r;
  for (int l = 0; l < 16; ++l) r.v[l] = ((m >> l) & 1) ? std::fma(a.v[l], b.v[l], c.v[l]) : c.v[l];
  return r;
}

#endif

// tanh via exp: tanh(t) = sign(t) * (1 - 2 / (exp(2|t|) + 1)); absolute error ~1e-7, which is
// what a soft cap (cap * tanh(s / cap)) needs: logits matter to the softmax in absolute terms.
inline V16 tanh(V16 t) {
  const V16 e = exp(mul(set1(2.f), abs(t)));
  const V16 y = sub(set1(1.f), div(set1(2.f), add(e, set1(1.f))));
  return select(lt(t, zero()), sub(zero(), y), y);
}

// Converts n elements of a float-typed row (f32, f16 or bf16) to fp32, times `mul`.
// Widening f16/bf16 -> f32 is exact, so the vector and scalar paths agree bit for bit.
inline void convert_row(const void* src, DType t, std::int64_t n, float* dst, float mul_by = 1.f) {
  std::int64_t i = 0;
  if (t == DType::f32) {
    const float* s = static_cast<const float*>(src);
    if (mul_by == 1.f) {
      std::memcpy(dst, s, static_cast<std::size_t>(n) * sizeof(float));
    } else {
      for (; i < n; ++i) dst[i] = s[i] * mul_by;
    }
    return;
  }
  const std::uint16_t* s = static_cast<const std::uint16_t*>(src);
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 m = _mm512_set1_ps(mul_by);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m512 f = t == DType::f16 ? _mm512_cvtph_ps(h)
                                     : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(f, m));
  }
#endif
  for (; i < n; ++i)
    dst[i] = (t == DType::f16 ? half_bits_to_float(s[i]) : bf16_bits_to_float(s[i])) * mul_by;
}

}  // namespace attnops::cpu::simd
