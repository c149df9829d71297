// Vector primitives of VanillaAttn::forward_cpu (per-tier header, private to
// backends/cpu/vanilla_*.cpp), written once on simd16.h's V16.
//
// Everything here computes in fp32: f16 / bf16 inputs are widened to fp32 (exactly: both
// widenings are lossless), outputs are narrowed with the round-to-nearest-even conversions of
// dtype.h. Row tails (lengths that are not multiples of 16) use V16's partial loads and stores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnops/dtype.h"
#include "backends/cpu/simd16.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::vanilla {

using i64 = std::int64_t;
using simd::V16;

// Lanes of a 16-lane step with `left` (>= 1) elements left, and their mask.
inline int lanes_left(i64 left) {
  return left >= 16 ? 16 : static_cast<int>(left);
}
inline simd::Mask16 first_lanes(int w) {
  return static_cast<simd::Mask16>(w >= 16 ? 0xffffu : (1u << w) - 1u);
}

// 16 (or w) elements of a K or V row of dtype DT, widened to fp32; lanes >= w are 0.
template <DType DT>
inline V16 load_elems(const void* row, i64 at, int w) {
  if constexpr (DT == DType::f32) {
    const float* f = static_cast<const float*>(row) + at;
    return w == 16 ? simd::load(f) : simd::load_n(f, w);
  } else {
    return simd::widen_n(static_cast<const std::uint16_t*>(row) + at, DT == DType::bf16, w);
  }
}

// Widens `rows` rows of `cols` elements (row r starts at src + r * src_stride elements, dtype
// `t`) into the contiguous fp32 matrix dst [rows, dst_stride], multiplying by `mul`.
inline void load_rows_f32(const void* src, DType t, i64 src_stride, i64 rows, i64 cols, float* dst,
                          i64 dst_stride, float mul = 1.f) {
  const i64 es = static_cast<i64>(dtype_size(t));
  for (i64 r = 0; r < rows; ++r)
    simd::convert_row(static_cast<const char*>(src) + r * src_stride * es, t, cols, dst + r * dst_stride,
                      mul);
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
// (masked) or NaN. Arguments below -87 (s[j] == -inf included) give exactly 0 (simd::exp):
// exp(-87) = 1.6e-38 is below fp32's smallest normal and invisible next to the row's maximum term
// exp(0) = 1. A NaN stays NaN, and so makes the sum NaN (the non-finite policy).
inline float exp_shift_sum(float* s, i64 n, float m) {
  const V16 mv = simd::set1(m);
  V16 acc = simd::zero();
  for (i64 j = 0; j < n; j += 16) {
    const int w = lanes_left(n - j);
    const V16 e =
        simd::select(first_lanes(w), simd::exp(simd::sub(simd::load_n(s + j, w), mv)), simd::zero());
    simd::store_n(s + j, e, w);
    acc = simd::add(acc, e);
  }
  return simd::reduce_add(acc);
}

// Asks for the cache lines of [p, p + bytes) ahead of use. The decode walk reads K and V as two
// sequential streams; the hardware prefetchers alone left it waiting on DRAM (profiled: over half
// the time stalled on loads), so it prefetches K a few rows ahead and a block's V rows while it
// is still scoring that block's keys.
inline void prefetch_bytes(const void* p, i64 bytes) {
  const char* c = static_cast<const char*>(p);
  for (i64 o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}
// The same into L2 only (the tiled forward's next kv tile: more than L1 holds).
inline void prefetch_bytes_l2(const void* p, i64 bytes) {
  const char* c = static_cast<const char*>(p);
  for (i64 o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 2);
}
inline constexpr i64 kPrefetchAheadBytes = 4096;  // K: about two rows ahead at Hkv * D * 4 = 2 KiB

// Register blocking of the decode primitives per tier (a V16 is 1 zmm, 2 ymm or 4 xmm; 32, 16
// and 16 registers): rows per tile, accumulators per row in dot_tile (alternating 16-element
// chunks to hide FMA latency), and V16 column slices per row in pv_tile. Beyond these the
// accumulators would spill to the stack.
#if ATTNOPS_SIMD_LEVEL >= 2
inline constexpr int kDecodeRows = 4, kDotAcc = 2, kPvVecs = 4;
#elif ATTNOPS_SIMD_LEVEL == 1
inline constexpr int kDecodeRows = 4, kDotAcc = 1, kPvVecs = 1;
#else
inline constexpr int kDecodeRows = 2, kDotAcc = 1, kPvVecs = 1;
#endif

template <DType DT>
inline constexpr i64 kElemBytes = DT == DType::f32 ? 4 : 2;

// dot_key for RR (1..kDecodeRows) rows: each 16-element chunk of k is loaded and widened once
// and feeds the RR rows' accumulators.
template <DType DT, int RR, i64 kD = 0>
inline void dot_tile(const float* Q, i64 ldq, const void* k, i64 D_, float* s, i64 lds) {
  const i64 D = kD ? kD : D_;  // a compile-time head dim unrolls the loops below
  V16 a[RR][kDotAcc];
  for (int r = 0; r < RR; ++r)
    for (int u = 0; u < kDotAcc; ++u) a[r][u] = simd::zero();
  i64 d = 0;
  for (; d + 16 * kDotAcc <= D; d += 16 * kDotAcc) {
    for (int u = 0; u < kDotAcc; ++u) {
      const V16 kv = load_elems<DT>(k, d + 16 * u, 16);
      for (int r = 0; r < RR; ++r) a[r][u] = simd::fma(simd::load(Q + r * ldq + d + 16 * u), kv, a[r][u]);
    }
  }
  for (; d < D; d += 16) {
    const int w = lanes_left(D - d);
    const V16 k0 = load_elems<DT>(k, d, w);
    for (int r = 0; r < RR; ++r) a[r][0] = simd::fma(simd::load_n(Q + r * ldq + d, w), k0, a[r][0]);
  }
  for (int r = 0; r < RR; ++r) {
    V16 t = a[r][0];
    for (int u = 1; u < kDotAcc; ++u) t = simd::add(t, a[r][u]);
    s[r * lds] = simd::reduce_add(t);
  }
}

// s[r * lds] = dot(Q[r * ldq .. + D], k[0 .. D]) for r < R: one key (dtype DT, widened in
// registers) against the R fp32 query rows of its GQA group, so each key is read from memory
// once for all of them.
template <DType DT, i64 kD = 0>
inline void dot_key(const float* Q, i64 ldq, i64 R, const void* k, i64 D_, float* s, i64 lds) {
  const i64 D = kD ? kD : D_;
  prefetch_bytes(static_cast<const char*>(k) + kPrefetchAheadBytes, D * kElemBytes<DT>);
  if (kD && R == 1) return dot_tile<DT, 1, kD>(Q, ldq, k, D, s, lds);
  for (i64 r0 = 0; r0 < R; r0 += kDecodeRows) {
    const float* q = Q + r0 * ldq;
    float* o = s + r0 * lds;
    switch (R - r0 >= kDecodeRows ? kDecodeRows : R - r0) {
      case 4:
        if constexpr (kDecodeRows >= 4) dot_tile<DT, 4, kD>(q, ldq, k, D, o, lds);
        break;
      case 3:
        if constexpr (kDecodeRows >= 3) dot_tile<DT, 3, kD>(q, ldq, k, D, o, lds);
        break;
      case 2:
        dot_tile<DT, 2, kD>(q, ldq, k, D, o, lds);
        break;
      default:
        dot_tile<DT, 1, kD>(q, ldq, k, D, o, lds);
        break;
    }
  }
}

// pv_block for RR (1..kDecodeRows) rows: for each slice of 16 * kPvVecs columns the accumulators
// stay in registers while the n value rows stream through, so each V element is loaded once per
// RR rows. kSkipZeros: a weight of 0 is skipped, not multiplied (see pv_block).
template <DType DT, int RR, bool kSkipZeros>
inline void pv_tile(const float* P, i64 ldp, const void* V, i64 ldv, i64 n, i64 Dv, float* acc, i64 ldacc) {
  for (i64 c = 0; c < Dv; c += 16 * kPvVecs) {
    int w[kPvVecs];
    for (int u = 0; u < kPvVecs; ++u) {
      const i64 left = Dv - c - 16 * u;
      w[u] = left <= 0 ? 0 : lanes_left(left);
    }
    V16 a[RR][kPvVecs];
    for (int r = 0; r < RR; ++r)
      for (int u = 0; u < kPvVecs; ++u) a[r][u] = simd::load_n(acc + r * ldacc + c + 16 * u, w[u]);
    for (i64 j = 0; j < n; ++j) {
      const char* v = static_cast<const char*>(V) + j * ldv * kElemBytes<DT>;
      V16 vv[kPvVecs];
      for (int u = 0; u < kPvVecs; ++u) vv[u] = w[u] ? load_elems<DT>(v, c + 16 * u, w[u]) : simd::zero();
      for (int r = 0; r < RR; ++r) {
        const float pr = P[r * ldp + j];
        if (kSkipZeros && pr == 0.f) continue;
        const V16 pj = simd::set1(pr);
        for (int u = 0; u < kPvVecs; ++u) a[r][u] = simd::fma(pj, vv[u], a[r][u]);
      }
    }
    for (int r = 0; r < RR; ++r)
      for (int u = 0; u < kPvVecs; ++u) simd::store_n(acc + r * ldacc + c + 16 * u, a[r][u], w[u]);
  }
}

// acc[r * ldacc + c] += sum_j P[r * ldp + j] * V[j * ldv + c] for r < R, j < n, c < Dv: a block
// of n value rows (dtype DT, rows ldv elements apart) folded into the R output rows of a GQA
// group. Masked entries of P are exactly 0 and add nothing, unless their value row holds NaN or
// inf (0 x inf = NaN): kSkipZeros (p.guard_nonfinite_v, operators/forward_glue.h) skips weights
// of 0 instead of multiplying them.
template <DType DT, bool kSkipZeros = false>
inline void pv_block(const float* P, i64 ldp, i64 R, const void* V, i64 ldv, i64 n, i64 Dv, float* acc,
                     i64 ldacc) {
  for (i64 r0 = 0; r0 < R; r0 += kDecodeRows) {
    const float* p = P + r0 * ldp;
    float* a = acc + r0 * ldacc;
    switch (R - r0 >= kDecodeRows ? kDecodeRows : R - r0) {
      case 4:
        if constexpr (kDecodeRows >= 4) pv_tile<DT, 4, kSkipZeros>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      case 3:
        if constexpr (kDecodeRows >= 3) pv_tile<DT, 3, kSkipZeros>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      case 2:
        pv_tile<DT, 2, kSkipZeros>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      default:
        pv_tile<DT, 1, kSkipZeros>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
    }
  }
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::vanilla
