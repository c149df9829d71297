// bf16 K/V for the decode path (per-tier header, vanilla_decode.cpp): the dot and P.V primitives
// of vanilla_simd.h with K and V widened as pairs.
//
// A bf16 is the top half of an fp32, so 32 bf16 values loaded as 16 32-bit lanes widen to two
// fp32 vectors with one shift (the even elements) and one mask (the odd ones): no per-element
// conversion, half the instructions of widening 16 at a time (simd::widen_pairs_n). The other
// operand then has to be in the same order: the query rows and the output accumulators of a
// bf16 call are kept in "pair-split" order, per chunk of 32 elements (or the w < 32 left at the
// end of a row) its ceil(w/2) even elements, then its floor(w/2) odd ones. Queries are split once
// per call (split_row), accumulators are split throughout and put back in order when the row is
// stored (unsplit_row). Products and sums are those of the fp32 path in another order of terms.
//
// From the avx512bf16 tier up, q.k runs on VDPBF16PS instead (dot_key_bf16): bf16 queries (their
// bits, unscaled) times bf16 keys, 32 products per instruction summed in fp32, the scale applied
// to the sum; no widening at all. P.V keeps fp32 weights (the pair-split FMAs above): rounding P
// to bf16 would cost the decode's accuracy for no bandwidth.
#pragma once

#include "backends/cpu/vanilla_simd.h"
#if ATTNOPS_TIER_LEVEL >= 3
#include "backends/cpu/simd16_bf16.h"
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS::vanilla::pairs {

// Rows per register tile: two accumulators (even, odd) per row; AVX2's 16 ymm hold 2 rows.
#if ATTNOPS_SIMD_LEVEL >= 2
inline constexpr int kRows = 4;
#else
inline constexpr int kRows = 2;
#endif

// Elements of the chunk starting at c of a row of n, and how many are even / odd.
struct Chunk {
  int w, e, o;
};
inline Chunk chunk_at(i64 c, i64 n) {
  const int w = n - c >= 32 ? 32 : static_cast<int>(n - c);
  return {w, (w + 1) / 2, w / 2};
}

// dst = src (n values) in pair-split order.
inline void split_row(const float* src, i64 n, float* dst) {
  for (i64 c = 0; c < n; c += 32) {
    const Chunk k = chunk_at(c, n);
    for (int i = 0; i < k.w; ++i) dst[c + (i % 2 ? k.e + i / 2 : i / 2)] = src[c + i];
  }
}
// The inverse: dst (natural order) from src in pair-split order.
inline void unsplit_row(const float* src, i64 n, float* dst) {
  for (i64 c = 0; c < n; c += 32) {
    const Chunk k = chunk_at(c, n);
    for (int i = 0; i < k.w; ++i) dst[c + i] = src[c + (i % 2 ? k.e + i / 2 : i / 2)];
  }
}

// s[r * lds] = dot(Q row r, k) for RR rows of split fp32 queries and one bf16 key row.
template <int RR, i64 kD = 0>
inline void dot_tile(const float* Q, i64 ldq, const std::uint16_t* k, i64 D_, float* s, i64 lds) {
  const i64 D = kD ? kD : D_;
  V16 a[RR], b[RR];
  for (int r = 0; r < RR; ++r) a[r] = b[r] = simd::zero();
  i64 c = 0;
  for (; c + 32 <= D; c += 32) {
    V16 ke, ko;
    simd::widen_pairs_n(k + c, 32, ke, ko);
    for (int r = 0; r < RR; ++r) {
      a[r] = simd::fma(simd::load(Q + r * ldq + c), ke, a[r]);
      b[r] = simd::fma(simd::load(Q + r * ldq + c + 16), ko, b[r]);
    }
  }
  if (c < D) {
    const Chunk ch = chunk_at(c, D);
    V16 ke, ko;
    simd::widen_pairs_n(k + c, ch.w, ke, ko);
    for (int r = 0; r < RR; ++r) {
      a[r] = simd::fma(simd::load_n(Q + r * ldq + c, ch.e), ke, a[r]);
      b[r] = simd::fma(simd::load_n(Q + r * ldq + c + ch.e, ch.o), ko, b[r]);
    }
  }
  for (int r = 0; r < RR; ++r) s[r * lds] = simd::reduce_add(simd::add(a[r], b[r]));
}

// vanilla::dot_key for a bf16 key and R split query rows.
template <i64 kD = 0>
inline void dot_key(const float* Q, i64 ldq, i64 R, const void* kv, i64 D, float* s, i64 lds) {
  const auto* k = static_cast<const std::uint16_t*>(kv);
  prefetch_bytes(static_cast<const char*>(kv) + kPrefetchAheadBytes, (kD ? kD : D) * 2);
  for (i64 r0 = 0; r0 < R; r0 += kRows) {
    const float* q = Q + r0 * ldq;
    float* o = s + r0 * lds;
    switch (R - r0 >= kRows ? kRows : R - r0) {
      case 4:
        if constexpr (kRows >= 4) dot_tile<4, kD>(q, ldq, k, D, o, lds);
        break;
      case 3:
        if constexpr (kRows >= 3) dot_tile<3, kD>(q, ldq, k, D, o, lds);
        break;
      case 2:
        dot_tile<2, kD>(q, ldq, k, D, o, lds);
        break;
      default:
        dot_tile<1, kD>(q, ldq, k, D, o, lds);
        break;
    }
  }
}

#if ATTNOPS_TIER_LEVEL >= 3
// s[r * lds] = scale * dot(Q row r, k) on VDPBF16PS: Q holds RR bf16 query rows (ldq apart, zero
// past D up to a multiple of 32), k one bf16 key row (nothing past D is read). Two accumulators
// per row alternate chunks (the instruction's latency).
template <int RR, i64 kD = 0>
inline void dot_tile_bf16(const std::uint16_t* Q, i64 ldq, const std::uint16_t* k, i64 D_, float scale,
                          float* s, i64 lds) {
  const i64 D = kD ? kD : D_;
  V16 a[RR], b[RR];
  for (int r = 0; r < RR; ++r) a[r] = b[r] = simd::zero();
  i64 c = 0;
  for (; c + 64 <= D; c += 64) {
    const simd::BF32 k0 = simd::bf32_load(k + c), k1 = simd::bf32_load(k + c + 32);
    for (int r = 0; r < RR; ++r) {
      a[r] = simd::dot_pairs(a[r], simd::bf32_load(Q + r * ldq + c), k0);
      b[r] = simd::dot_pairs(b[r], simd::bf32_load(Q + r * ldq + c + 32), k1);
    }
  }
  for (; c < D; c += 32) {
    const simd::BF32 kc =
        D - c >= 32 ? simd::bf32_load(k + c) : simd::bf32_load_n(k + c, static_cast<int>(D - c));
    for (int r = 0; r < RR; ++r) a[r] = simd::dot_pairs(a[r], simd::bf32_load(Q + r * ldq + c), kc);
  }
  for (int r = 0; r < RR; ++r) s[r * lds] = simd::reduce_add(simd::add(a[r], b[r])) * scale;
}

// dot_key with bf16 queries on VDPBF16PS (dot_tile_bf16).
template <i64 kD = 0>
inline void dot_key_bf16(const std::uint16_t* Q, i64 ldq, i64 R, const void* kv, i64 D, float scale, float* s,
                         i64 lds) {
  const auto* k = static_cast<const std::uint16_t*>(kv);
  prefetch_bytes(static_cast<const char*>(kv) + kPrefetchAheadBytes, (kD ? kD : D) * 2);
  for (i64 r0 = 0; r0 < R; r0 += kRows) {
    const std::uint16_t* q = Q + r0 * ldq;
    float* o = s + r0 * lds;
    switch (R - r0 >= kRows ? kRows : R - r0) {
      case 4:
        if constexpr (kRows >= 4) dot_tile_bf16<4, kD>(q, ldq, k, D, scale, o, lds);
        break;
      case 3:
        if constexpr (kRows >= 3) dot_tile_bf16<3, kD>(q, ldq, k, D, scale, o, lds);
        break;
      case 2:
        dot_tile_bf16<2, kD>(q, ldq, k, D, scale, o, lds);
        break;
      default:
        dot_tile_bf16<1, kD>(q, ldq, k, D, scale, o, lds);
        break;
    }
  }
}
#endif

// vanilla::pv_tile for bf16 value rows and split accumulators: per chunk of 32 columns the RR
// rows' even and odd accumulators stay in registers while the n value rows stream through.
template <int RR, bool kSkipZeros>
inline void pv_tile(const float* P, i64 ldp, const std::uint16_t* V, i64 ldv, i64 n, i64 Dv, float* acc,
                    i64 ldacc) {
  for (i64 c = 0; c < Dv; c += 32) {
    const Chunk ch = chunk_at(c, Dv);
    V16 ae[RR], ao[RR];
    for (int r = 0; r < RR; ++r) {
      ae[r] = simd::load_n(acc + r * ldacc + c, ch.e);
      ao[r] = simd::load_n(acc + r * ldacc + c + ch.e, ch.o);
    }
    for (i64 j = 0; j < n; ++j) {
      V16 ve, vo;
      simd::widen_pairs_n(V + j * ldv + c, ch.w, ve, vo);
      for (int r = 0; r < RR; ++r) {
        const float pr = P[r * ldp + j];
        if (kSkipZeros && pr == 0.f) continue;
        const V16 pj = simd::set1(pr);
        ae[r] = simd::fma(pj, ve, ae[r]);
        ao[r] = simd::fma(pj, vo, ao[r]);
      }
    }
    for (int r = 0; r < RR; ++r) {
      simd::store_n(acc + r * ldacc + c, ae[r], ch.e);
      simd::store_n(acc + r * ldacc + c + ch.e, ao[r], ch.o);
    }
  }
}

// vanilla::pv_block for bf16 value rows (ldv elements apart) into split accumulators.
template <bool kSkipZeros = false>
inline void pv_block(const float* P, i64 ldp, i64 R, const void* Vv, i64 ldv, i64 n, i64 Dv, float* acc,
                     i64 ldacc) {
  const auto* V = static_cast<const std::uint16_t*>(Vv);
  for (i64 r0 = 0; r0 < R; r0 += kRows) {
    const float* p = P + r0 * ldp;
    float* a = acc + r0 * ldacc;
    switch (R - r0 >= kRows ? kRows : R - r0) {
      case 4:
        if constexpr (kRows >= 4) pv_tile<4, kSkipZeros>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      case 3:
        if constexpr (kRows >= 3) pv_tile<3, kSkipZeros>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      case 2:
        pv_tile<2, kSkipZeros>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
      default:
        pv_tile<1, kSkipZeros>(p, ldp, V, ldv, n, Dv, a, ldacc);
        break;
    }
  }
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::vanilla::pairs
