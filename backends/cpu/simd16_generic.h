// simd16.h's body for the baseline tier: GCC/Clang vector extensions, which the compiler lowers
// to the target's default vectors (four SSE2 registers on x86-64). No FMA instruction exists at
// this level, so fma is a separate multiply and add (never std::fma: that is a libm call per
// lane). Included by simd16.h only.
#pragma once

// GCC notes that 64-byte vectors are passed differently with and without AVX-512 (-Wpsabi).
// These functions are inline and private to the tier's namespace: only code compiled with the
// same flags ever calls them, so the ABI difference cannot matter; tiers.cmake compiles the tier
// objects with -Wno-psabi (a pragma cannot silence a note).

namespace attnops::cpu::ATTNOPS_TIER_NS::simd {

namespace generic {
typedef float f32x16 __attribute__((vector_size(64)));
typedef std::int32_t i32x16 __attribute__((vector_size(64)));
inline i32x16 lane_bits() {
  return i32x16{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
}
// A comparison result (lanes -1 / 0) as lane bits.
inline Mask16 bits(i32x16 c) {
  const i32x16 b = c & lane_bits();
  int m = 0;
  for (int l = 0; l < 16; ++l) m |= b[l];
  return static_cast<Mask16>(m);
}
}  // namespace generic

struct V16 {
  generic::f32x16 v;
};

inline V16 zero() {
  return {generic::f32x16{}};
}
inline V16 set1(float x) {
  return {generic::f32x16{} + x};
}
inline V16 load(const float* p) {
  V16 r;
  std::memcpy(&r.v, p, sizeof r.v);
  return r;
}
inline void store(float* p, V16 a) {
  std::memcpy(p, &a.v, sizeof a.v);
}
inline V16 load_n(const float* p, int n) {
  V16 r = zero();
  std::memcpy(&r.v, p, static_cast<std::size_t>(n > 0 ? (n < 16 ? n : 16) : 0) * sizeof(float));
  return r;
}
inline void store_n(float* p, V16 a, int n) {
  std::memcpy(p, &a.v, static_cast<std::size_t>(n > 0 ? (n < 16 ? n : 16) : 0) * sizeof(float));
}
inline V16 fma(V16 a, V16 b, V16 c) {
  return {a.v * b.v + c.v};
}  // a*b+c, two roundings
inline V16 add(V16 a, V16 b) {
  return {a.v + b.v};
}
inline V16 sub(V16 a, V16 b) {
  return {a.v - b.v};
}
inline V16 mul(V16 a, V16 b) {
  return {a.v * b.v};
}
inline V16 div(V16 a, V16 b) {
  return {a.v / b.v};
}
inline V16 max(V16 a, V16 b) {
  return {a.v > b.v ? a.v : b.v};
}
inline V16 abs(V16 a) {
  return {a.v < 0 ? -a.v : a.v};
}
inline V16 select(Mask16 m, V16 a, V16 b) {
  const generic::i32x16 on = ((generic::i32x16{} + m) & generic::lane_bits()) != 0;
  return {on ? a.v : b.v};
}
inline Mask16 eq(V16 a, V16 b) {
  return generic::bits(a.v == b.v);
}
inline Mask16 lt(V16 a, V16 b) {
  return generic::bits(a.v < b.v);
}
// Lanes that are not 0 (NaN lanes included: != is unordered).
inline Mask16 nonzero(V16 a) {
  return generic::bits(a.v != 0.f);
}
// a*b+c in the lanes of m, c elsewhere (two roundings, as fma).
inline V16 fma_masked(Mask16 m, V16 a, V16 b, V16 c) {
  const generic::i32x16 on = ((generic::i32x16{} + m) & generic::lane_bits()) != 0;
  return {on ? a.v * b.v + c.v : c.v};
}
inline Mask16 eq_i32(const std::int32_t* seg, std::int32_t x) {
  generic::i32x16 s;
  std::memcpy(&s, seg, sizeof s);
  return generic::bits(s == x);
}
inline V16 gather(const float* base, std::int32_t stride, Mask16 m) {
  V16 r = zero();
  for (int l = 0; l < 16; ++l)
    if ((m >> l) & 1) r.v[l] = base[static_cast<std::int64_t>(l) * stride];
  return r;
}
// See simd16_avx512.h. Rounding to the nearest integer by adding and subtracting 1.5 * 2^23
// (exact for |x * log2 e| < 2^22); 2^n built in the exponent field. NaN lanes are computed on a
// finite stand-in (a NaN must not reach the float -> int conversion) and returned as they came.
inline V16 exp(V16 a) {
  using generic::f32x16;
  using generic::i32x16;
  const i32x16 keep = a.v >= -87.f;  // false for -inf, NaN
  const i32x16 nan = a.v != a.v;
  f32x16 x = a.v < -87.f ? f32x16{} - 87.f : a.v;
  x = x > 88.3f ? f32x16{} + 88.3f : x;
  x = keep ? x : f32x16{} - 87.f;  // NaN lanes: finite arithmetic, result masked below
  const f32x16 n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  x = x - n * 0.693359375f;
  x = x - n * -2.12194440e-4f;
  f32x16 p = f32x16{} + 1.9875691500e-4f;
  p = p * x + 1.3981999507e-3f;
  p = p * x + 8.3334519073e-3f;
  p = p * x + 4.1665795894e-2f;
  p = p * x + 1.6666665459e-1f;
  p = p * x + 5.0000001201e-1f;
  p = p * (x * x) + (x + 1.f);
  const i32x16 e = (__builtin_convertvector(n, i32x16) + 127) << 23;
  f32x16 two_n;
  std::memcpy(&two_n, &e, sizeof e);
  const f32x16 r = p * two_n;
  return {keep ? r : (nan ? a.v : f32x16{})};
}
inline float reduce_add(V16 a) {
  float s = 0.f;
  for (int l = 0; l < 16; ++l) s += a.v[l];
  return s;
}
inline float reduce_max(V16 a) {
  float s = a.v[0];
  for (int l = 1; l < 16; ++l) s = a.v[l] > s ? a.v[l] : s;
  return s;
}
// n (0..32) bf16 values as pairs: even[l] = p[2l], odd[l] = p[2l + 1] (see simd16_avx512.h).
inline void widen_pairs_n(const std::uint16_t* p, int n, V16& even, V16& odd) {
  even = zero(), odd = zero();
  for (int i = 0; i < (n < 32 ? n : 32); ++i) (i % 2 ? odd : even).v[i / 2] = bf16_bits_to_float(p[i]);
}
inline V16 widen_n(const std::uint16_t* p, bool bf16, int n) {
  V16 r = zero();
  const int m = n > 0 ? (n < 16 ? n : 16) : 0;
  if (bf16) {  // the top 16 bits of an f32: widen, shift, reinterpret
    typedef std::uint16_t u16x16 __attribute__((vector_size(32)));
    u16x16 h = {};
    std::memcpy(&h, p, static_cast<std::size_t>(m) * sizeof(std::uint16_t));
    const generic::i32x16 w = __builtin_convertvector(h, generic::i32x16) << 16;
    std::memcpy(&r.v, &w, sizeof w);
    return r;
  }
  for (int l = 0; l < m; ++l) r.v[l] = half_bits_to_float(p[l]);
  return r;
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::simd
