// bf16 pair arithmetic for the avx512bf16 and amx tiers (per-tier header), real or emulated.
//
// A BF32 holds 32 bf16 values as 16 pairs, pair l in 32-bit lane l: (x[2l], x[2l + 1]). On it:
//   bf32_load(p)                 the 32 values p[0..32)
//   bf32_load_n(p, n)            the n (0..32) values p[0..n), 0 beyond (nothing past them is read)
//   bf32_pair(p)                 the pair (p[0], p[1]) in every lane
//   bf32_half_pair(p)            the pair (p[0], 0) in every lane (a row's last, odd element)
//   dot_pairs(acc, a, b)         VDPBF16PS: acc[l] += a[2l+1] b[2l+1], then += a[2l] b[2l]
//                                (fp32 fused multiply-adds, bf16 inputs and fp32 accumulator
//                                denormals as 0, denormal results flushed to 0, RNE; MXCSR unused)
//   store_pairs(dst, p0, p1)     dst[2l] = bf16(p0[l]), dst[2l+1] = bf16(p1[l]): VCVTNE2PS2BF16
//                                (RNE, denormals to signed 0, NaN kept quiet) and an interleave
//   interleave_rows(r0, r1, w, out)   out[2e] = r0[e], out[2e+1] = r1 ? r1[e] : 0 for e < w <= 32
//   exp2_p(t)                    2^t for the softmax's P, t <= 0 (up to rounding): relative error
//                                < 3e-6 (P is rounded to bf16, 2^-9, for p.v; l adds the fp32
//                                values), exactly 0 below -125 (-inf included: never subnormal),
//                                NaN stays NaN; the same operations (RNE rounding, a degree-4
//                                polynomial, scaling by 2^n) and bits in both bodies
//
// Real (the tiers' own flags, -mavx512bf16): one instruction or two each. Emulated
// (ATTNOPS_ISA_EMULATE: the tier's kernels built with the avx2 flags, tests/tiers): plain C++
// following the instruction definitions (Intel SDM; felixcloutier.com/x86/vdpbf16ps,
// /vcvtne2ps2bf16), so the kernels' packing layouts, strides and loops run on any AVX2 CPU.
#pragma once

#if ATTNOPS_TIER_LEVEL < 3
#error "simd16_bf16.h is for the avx512bf16 and amx tiers"
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/simd16.h"

#if !defined(ATTNOPS_ISA_EMULATE)
#if !defined(__AVX512BF16__) || ATTNOPS_SIMD_LEVEL < 2
#error "the avx512bf16 and amx tiers are compiled with -mavx512bf16 (backends/cpu/tiers.cmake)"
#endif
#include <immintrin.h>
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS::simd {

// exp2_p's polynomial: 2^f on [-0.5, 0.5] (least-squares minimax, 1 at 0 exactly).
inline constexpr float kExp2C1 = 0.6931241750717163f, kExp2C2 = 0.24024099111557007f,
                       kExp2C3 = 0.055906426161527634f, kExp2C4 = 0.009582852944731712f;

#if !defined(ATTNOPS_ISA_EMULATE)

struct BF32 {
  __m512i v;
};
inline BF32 bf32_load(const std::uint16_t* p) {
  return {_mm512_loadu_si512(p)};
}
inline BF32 bf32_load_n(const std::uint16_t* p, int n) {
  const __mmask32 m = n >= 32 ? ~__mmask32{0} : (__mmask32{1} << (n > 0 ? n : 0)) - 1;
  return {_mm512_maskz_loadu_epi16(m, p)};
}
inline BF32 bf32_pair(const std::uint16_t* p) {
  std::uint32_t u;
  std::memcpy(&u, p, sizeof u);
  return {_mm512_set1_epi32(static_cast<int>(u))};
}
inline BF32 bf32_half_pair(const std::uint16_t* p) {
  return {_mm512_set1_epi32(static_cast<int>(std::uint32_t{p[0]}))};
}
inline V16 dot_pairs(V16 acc, BF32 a, BF32 b) {
  return {_mm512_dpbf16_ps(acc.v, (__m512bh)a.v, (__m512bh)b.v)};
}
inline void store_pairs(std::uint16_t* dst, V16 p0, V16 p1) {
  alignas(64) static constexpr std::uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                                21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                                11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i x = (__m512i)_mm512_cvtne2ps_pbh(p1.v, p0.v);  // elements 0-15: p0, 16-31: p1
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), x));
}
inline void interleave_rows(const std::uint16_t* r0, const std::uint16_t* r1, int w, std::uint16_t* out) {
  // permutex2var indices: output element 2j from a[j], 2j + 1 from b[j] (b's index + 32).
  alignas(64) static constexpr std::uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                        37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                        11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                        53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                        27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __mmask32 in = w >= 32 ? ~__mmask32{0} : (__mmask32{1} << w) - 1;
  const __m512i a = _mm512_maskz_loadu_epi16(in, r0);
  const __m512i c = r1 ? _mm512_maskz_loadu_epi16(in, r1) : _mm512_setzero_si512();
  const int wlo = w < 16 ? w : 16, whi = w - wlo;  // columns in each half of the output
  const __mmask32 mlo = wlo >= 16 ? ~__mmask32{0} : (__mmask32{1} << (2 * wlo)) - 1;
  const __mmask32 mhi = whi >= 16 ? ~__mmask32{0} : (__mmask32{1} << (2 * whi)) - 1;
  _mm512_mask_storeu_epi16(out, mlo, _mm512_permutex2var_epi16(a, _mm512_load_si512(kLo), c));
  if (whi > 0)
    _mm512_mask_storeu_epi16(out + 32, mhi, _mm512_permutex2var_epi16(a, _mm512_load_si512(kHi), c));
}

inline V16 exp2_p(V16 t) {
  const __mmask16 keep = _mm512_cmp_ps_mask(t.v, _mm512_set1_ps(-125.f), _CMP_NLT_UQ);  // false for -inf
  const __m512 x = _mm512_max_ps(_mm512_set1_ps(-125.f), t.v);  // NaN: the second operand, kept
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kExp2C4), f, _mm512_set1_ps(kExp2C3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return {_mm512_maskz_scalef_ps(keep, p, n)};
}

#else  // emulated

struct BF32 {
  std::uint32_t u[16];  // lane l: element 2l in the low half, 2l + 1 in the high half
};
namespace emu {
inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
// fp32 with a zero exponent field (0 or denormal) as a zero of the same sign: DAZ on inputs,
// FTZ on results.
inline float flush(float x) {
  const std::uint32_t u = float_to_bits(x);
  return (u & 0x7f800000u) == 0 ? bits_to_float(u & 0x80000000u) : x;
}
// convert_fp32_to_bfloat16 of the SDM (VCVTNE2PS2BF16).
inline std::uint16_t to_bf16(float f) {
  const std::uint32_t x = float_to_bits(f);
  if ((x & 0x7f800000u) == 0) return static_cast<std::uint16_t>((x >> 16) & 0x8000u);  // 0, denormal
  if ((x & 0x7f800000u) == 0x7f800000u) {
    if ((x & 0x007fffffu) == 0) return static_cast<std::uint16_t>(x >> 16);  // infinity
    return static_cast<std::uint16_t>((x >> 16) | 0x40u);                    // NaN, made quiet
  }
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
}  // namespace emu

inline BF32 bf32_load(const std::uint16_t* p) {
  BF32 r;
  std::memcpy(r.u, p, sizeof r.u);
  return r;
}
inline BF32 bf32_load_n(const std::uint16_t* p, int n) {
  std::uint16_t x[32] = {};
  std::memcpy(x, p, static_cast<std::size_t>(n < 0 ? 0 : n > 32 ? 32 : n) * sizeof(std::uint16_t));
  return bf32_load(x);
}
inline BF32 bf32_pair(const std::uint16_t* p) {
  std::uint32_t u;
  std::memcpy(&u, p, sizeof u);
  BF32 r;
  for (std::uint32_t& x : r.u) x = u;
  return r;
}
inline BF32 bf32_half_pair(const std::uint16_t* p) {
  BF32 r;
  for (std::uint32_t& x : r.u) x = p[0];
  return r;
}
inline V16 dot_pairs(V16 acc, BF32 a, BF32 b) {
  alignas(64) float c[16];
  store(c, acc);
  for (int l = 0; l < 16; ++l) {
    const float a_even = emu::flush(emu::bits_to_float(a.u[l] << 16));
    const float a_odd = emu::flush(emu::bits_to_float(a.u[l] & 0xffff0000u));
    const float b_even = emu::flush(emu::bits_to_float(b.u[l] << 16));
    const float b_odd = emu::flush(emu::bits_to_float(b.u[l] & 0xffff0000u));
    float x = emu::flush(c[l]);
    x = emu::flush(std::fma(a_odd, b_odd, x));
    c[l] = emu::flush(std::fma(a_even, b_even, x));
  }
  return load(c);
}
inline void store_pairs(std::uint16_t* dst, V16 p0, V16 p1) {
  alignas(64) float a[16], b[16];
  store(a, p0);
  store(b, p1);
  for (int l = 0; l < 16; ++l) {
    dst[2 * l] = emu::to_bf16(a[l]);
    dst[2 * l + 1] = emu::to_bf16(b[l]);
  }
}
inline void interleave_rows(const std::uint16_t* r0, const std::uint16_t* r1, int w, std::uint16_t* out) {
  for (int e = 0; e < w; ++e) {
    out[2 * e] = r0[e];
    out[2 * e + 1] = r1 ? r1[e] : std::uint16_t{0};
  }
}

inline V16 exp2_p(V16 t) {
  alignas(64) float x[16];
  store(x, t);
  for (float& v : x) {
    if (std::isnan(v)) continue;
    if (!(v >= -125.f)) {
      v = 0.f;
      continue;
    }
    const float n = std::nearbyint(v);  // the default rounding mode: to nearest even
    const float f = v - n;
    float p = std::fma(kExp2C4, f, kExp2C3);
    p = std::fma(p, f, kExp2C2);
    p = std::fma(p, f, kExp2C1);
    p = std::fma(p, f, 1.f);
    v = std::ldexp(p, static_cast<int>(n));
  }
  return load(x);
}

#endif

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::simd
