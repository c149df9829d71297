// Vector primitives of VanillaAttn::forward_cpu (private to backends/cpu/vanilla_*.cpp).
//
// Everything here computes in fp32: f16 / bf16 inputs are widened to fp32 (exactly: both
// widenings are lossless), outputs are narrowed with the round-to-nearest-even conversions of
// dtype.h. Each primitive has an AVX-512 body (compiled when the build targets AVX-512 F/BW/VL,
// e.g. -march=native on Zen 4/5) and a portable body that gives the same results up to fp32
// summation order.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <Eigen/Core>

#include "attnops/dtype.h"

namespace attnops::cpu::vanilla {

using i64 = std::int64_t;

// Widens `rows` rows of `cols` elements (row r starts at src + r * src_stride elements, dtype
// `t`) into the contiguous fp32 matrix dst [rows, dst_stride], multiplying by `mul`.
inline void load_rows_f32(const void* src, DType t, i64 src_stride, i64 rows, i64 cols, float* dst,
                          i64 dst_stride, float mul = 1.f) {
  for (i64 r = 0; r < rows; ++r) {
    float* d = dst + r * dst_stride;
    if (t == DType::f32) {
      const float* s = static_cast<const float*>(src) + r * src_stride;
      if (mul == 1.f) {
        std::memcpy(d, s, static_cast<std::size_t>(cols) * sizeof(float));
      } else {
        for (i64 c = 0; c < cols; ++c) d[c] = s[c] * mul;
      }
      continue;
    }
    const std::uint16_t* s = static_cast<const std::uint16_t*>(src) + r * src_stride;
    i64 c = 0;
#if defined(__AVX512F__)
    const __m512 vm = _mm512_set1_ps(mul);
    for (; c + 16 <= cols; c += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + c));
      __m512 f;
      if (t == DType::f16) {
        f = _mm512_cvtph_ps(h);
      } else {  // bf16: the top 16 bits of an f32
        f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
      _mm512_storeu_ps(d + c, _mm512_mul_ps(f, vm));
    }
#endif
    if (t == DType::f16) {
      for (; c < cols; ++c) d[c] = half_bits_to_float(s[c]) * mul;
    } else {
      for (; c < cols; ++c) d[c] = bf16_bits_to_float(s[c]) * mul;
    }
  }
}

// Narrows one fp32 row of n values into `dst` (dtype t), round to nearest even.
inline void store_row(const float* src, i64 n, DType t, void* dst) {
  switch (t) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::f16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (i64 c = 0; c < n; ++c) d[c] = float_to_half_bits(src[c]);
      return;
    }
    case DType::bf16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (i64 c = 0; c < n; ++c) d[c] = float_to_bf16_bits(src[c]);
      return;
    }
    default:
      return;  // q/k/v/out dtypes are validated to be float dtypes
  }
}

// s[j] = exp(s[j] - m) for j < n, returning the sum; requires m finite and s[j] <= m, -inf
// (masked) or NaN. Arguments below -87 (s[j] == -inf included) give exactly 0: exp(-87) =
// 1.6e-38 is below fp32's smallest normal and invisible next to the row's maximum term
// exp(0) = 1. A NaN stays NaN (and so makes the sum NaN: the non-finite policy).
// The AVX-512 body is Cephes' expf (range reduction by ln 2, degree-6 polynomial, ~1 ulp);
// Eigen 3.4 would fall back to scalar libm expf for the masked select, which dominated the profile.
inline float exp_shift_sum(float* s, i64 n, float m) {
  i64 j = 0;
  float total = 0.f;
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(m), lo = _mm512_set1_ps(-87.f),
               log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __m512 c0 = _mm512_set1_ps(1.9875691500e-4f), c1 = _mm512_set1_ps(1.3981999507e-3f),
               c2 = _mm512_set1_ps(8.3334519073e-3f), c3 = _mm512_set1_ps(4.1665795894e-2f),
               c4 = _mm512_set1_ps(1.6666665459e-1f), c5 = _mm512_set1_ps(5.0000001201e-1f),
               one = _mm512_set1_ps(1.f);
  __m512 acc = _mm512_setzero_ps();
  for (; j < n; j += 16) {
    const __mmask16 ld =
        n - j >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - j)) - 1u);
    const __m512 x0 = _mm512_sub_ps(_mm512_maskz_loadu_ps(ld, s + j), vm);
    const __mmask16 ok = _mm512_mask_cmp_ps_mask(ld, x0, lo, _CMP_GT_OQ);  // false for -inf and NaN
    const __m512 x = _mm512_max_ps(x0, lo);                                // keep the math finite
    const __m512 k =
        _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, ln2_hi, x);
    r = _mm512_fnmadd_ps(k, ln2_lo, r);
    __m512 p = _mm512_fmadd_ps(c0, r, c1);
    p = _mm512_fmadd_ps(p, r, c2);
    p = _mm512_fmadd_ps(p, r, c3);
    p = _mm512_fmadd_ps(p, r, c4);
    p = _mm512_fmadd_ps(p, r, c5);
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, one));
    const __mmask16 nan = _mm512_mask_cmp_ps_mask(ld, x0, x0, _CMP_UNORD_Q);
    const __m512 e = _mm512_mask_mov_ps(_mm512_maskz_mov_ps(ok, _mm512_scalef_ps(p, k)), nan, x0);  // p * 2^k
    _mm512_mask_storeu_ps(s + j, ld, e);
    acc = _mm512_add_ps(acc, e);
  }
  total = _mm512_reduce_add_ps(acc);
#endif
  for (; j < n; ++j) {
    const float x = s[j] - m;
    s[j] = x > -87.f ? std::exp(x) : (x != x ? x : 0.f);
    total += s[j];
  }
  return total;
}

// Asks for the cache lines of [p, p + bytes) ahead of use. The decode walk reads K and V as two
// sequential streams; the hardware prefetchers alone left it waiting on DRAM (profiled: over half
// the time stalled on loads), so it prefetches K a few rows ahead and a block's V rows while it
// is still scoring that block's keys.
inline void prefetch_bytes(const void* p, i64 bytes) {
#if defined(__GNUC__)
  const char* c = static_cast<const char*>(p);
  for (i64 o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
#else
  (void)p, (void)bytes;
#endif
}
inline constexpr i64 kPrefetchAheadBytes = 4096;  // K: about two rows ahead at Hkv * D * 4 = 2 KiB

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// 16 elements of a K or V row widened to fp32; lanes outside `m` read nothing and are 0.
template <class T>
inline __m512 load16(const T* p, __mmask16 m) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if constexpr (std::is_same_v<T, Eigen::half>) {
      return _mm512_cvtph_ps(h);
    } else {  // bf16: the top 16 bits of an f32
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}
// Lanes [0, left) of a 16-lane chunk (none when left <= 0, all when left >= 16).
inline __mmask16 lane_mask(i64 left) {
  if (left <= 0) return 0;
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// dot_key for RR (1..4) rows: each 16-element chunk of k is loaded and widened once and feeds the
// RR rows' accumulators (two per row, alternating chunks, to hide FMA latency).
template <class T, int RR>
inline void dot_tile(const float* Q, i64 ldq, const T* k, i64 D, float* s, i64 lds) {
  __m512 a[RR][2];
  for (int r = 0; r < RR; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
  i64 d = 0;
  for (; d + 32 <= D; d += 32) {
    const __m512 k0 = load16(k + d, 0xffff), k1 = load16(k + d + 16, 0xffff);
    for (int r = 0; r < RR; ++r) {
      a[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(Q + r * ldq + d), k0, a[r][0]);
      a[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(Q + r * ldq + d + 16), k1, a[r][1]);
    }
  }
  for (; d < D; d += 16) {
    const __mmask16 m = lane_mask(D - d);
    const __m512 k0 = load16(k + d, m);
    for (int r = 0; r < RR; ++r)
      a[r][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, Q + r * ldq + d), k0, a[r][0]);
  }
  for (int r = 0; r < RR; ++r) s[r * lds] = _mm512_reduce_add_ps(_mm512_add_ps(a[r][0], a[r][1]));
}
#endif

// s[r * lds] = dot(Q[r * ldq .. + D], k[0 .. D]) for r < R: one key (element type T: float,
// Eigen::half or Eigen::bfloat16, widened in registers) against the R fp32 query rows of its
// GQA group, so each key is read from memory once for all of them.
template <class T>
inline void dot_key(const float* Q, i64 ldq, i64 R, const T* k, i64 D, float* s, i64 lds) {
  prefetch_bytes(reinterpret_cast<const char*>(k) + kPrefetchAheadBytes, D * static_cast<i64>(sizeof(T)));
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  for (i64 r0 = 0; r0 < R; r0 += 4) {
    const float* q = Q + r0 * ldq;
    float* o = s + r0 * lds;
    switch (R - r0 >= 4 ? 4 : R - r0) {
      case 4:
        dot_tile<T, 4>(q, ldq, k, D, o, lds);
        break;
      case 3:
        dot_tile<T, 3>(q, ldq, k, D, o, lds);
        break;
      case 2:
        dot_tile<T, 2>(q, ldq, k, D, o, lds);
        break;
      default:
        dot_tile<T, 1>(q, ldq, k, D, o, lds);
        break;
    }
  }
#else
  for (i64 r = 0; r < R; ++r) {
    const float* q = Q + r * ldq;
    float a[4] = {0, 0, 0, 0};  // four partial sums: shorter dependency chains
    i64 d = 0;
    for (; d + 4 <= D; d += 4)
      for (int u = 0; u < 4; ++u) a[u] += q[d + u] * static_cast<float>(k[d + u]);
    float t = (a[0] + a[1]) + (a[2] + a[3]);
    for (; d < D; ++d) t += q[d] * static_cast<float>(k[d]);
    s[r * lds] = t;
  }
#endif
}

// pv_block's contract with zero weights skipped rather than multiplied: a value row of weight 0
// (masked, or underflowed) adds nothing even when it holds NaN or inf (0 x inf = NaN). The
// portable path, and the guarded path taken when v holds non-finite values.
template <class T>
inline void pv_block_skip_zeros(const float* P, i64 ldp, i64 R, const T* V, i64 ldv, i64 n, i64 Dv,
                                float* acc, i64 ldacc) {
  for (i64 r = 0; r < R; ++r) {
    float* a = acc + r * ldacc;
    for (i64 j = 0; j < n; ++j) {
      const float pj = P[r * ldp + j];
      if (pj == 0.f) continue;
      const T* v = V + j * ldv;
      for (i64 c = 0; c < Dv; ++c) a[c] += pj * static_cast<float>(v[c]);
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// pv_block for RR (1..4) rows: for each 64-column slice the RR x 4 accumulators stay in registers
// while the n value rows stream through, so each V element is loaded once per RR rows.
template <class T, int RR>
inline void pv_tile(const float* P, i64 ldp, const T* V, i64 ldv, i64 n, i64 Dv, float* acc, i64 ldacc) {
  for (i64 c = 0; c < Dv; c += 64) {
    __mmask16 m[4];
    for (int u = 0; u < 4; ++u) m[u] = lane_mask(Dv - c - 16 * u);
    __m512 a[RR][4];
    for (int r = 0; r < RR; ++r)
      for (int u = 0; u < 4; ++u) a[r][u] = _mm512_maskz_loadu_ps(m[u], acc + r * ldacc + c + 16 * u);
    for (i64 j = 0; j < n; ++j) {
      const T* v = V + j * ldv + c;
      __m512 vv[4];
      for (int u = 0; u < 4; ++u) vv[u] = load16(v + 16 * u, m[u]);
      for (int r = 0; r < RR; ++r) {
        const __m512 pj = _mm512_set1_ps(P[r * ldp + j]);
        for (int u = 0; u < 4; ++u) a[r][u] = _mm512_fmadd_ps(pj, vv[u], a[r][u]);
      }
    }
    for (int r = 0; r < RR; ++r)
      for (int u = 0; u < 4; ++u) _mm512_mask_storeu_ps(acc + r * ldacc + c + 16 * u, m[u], a[r][u]);
  }
}
#endif

// acc[r * ldacc + c] += sum_j P[r * ldp + j] * V[j * ldv + c] for r < R, j < n, c < Dv: a block
// of n value rows (element type T, rows ldv elements apart) folded into the R output rows of a
// GQA group. Masked entries of P are exactly 0 and add nothing.
template <class T>
inline void pv_block(const float* P, i64 ldp, i64 R, const T* V, i64 ldv, i64 n, i64 Dv, float* acc,
                     i64 ldacc) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  for (i64 r0 = 0; r0 < R; r0 += 4) {
    const float* p = P + r0 * ldp;
    float* a = acc + r0 * ldacc;
    switch (R - r0 >= 4 ? 4 : R - r0) {
      case 4:
        pv_tile<T, 4>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      case 3:
        pv_tile<T, 3>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      case 2:
        pv_tile<T, 2>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      default:
        pv_tile<T, 1>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
    }
  }
#else
  pv_block_skip_zeros(P, ldp, R, V, ldv, n, Dv, acc, ldacc);
#endif
}

}  // namespace attnops::cpu::vanilla
