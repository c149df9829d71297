// The tiled kernel's bf16 path on AVX-512 BF16 (per-tier header, tiers avx512bf16 and amx).
//
// VDPBF16PS: acc[i] += a[2i] * b[2i] + a[2i+1] * b[2i+1] (bf16 pairs, fp32 accumulate; always
// DAZ/FTZ). Lanes stay over query rows (tiled_cpu.cpp), so the pairs run along the reduced axis:
//   q.k  Qp [Dp/2][bqp][2]    (Q^T[2p][l], Q^T[2p+1][l])   packed once per task, unscaled
//        K rows in place       broadcast the 32-bit pair (K[c][2p], K[c][2p+1])
//   p.v  Pp [pairs][bqp][2]   (P^T[2t][l], P^T[2t+1][l])   written by the softmax (store_pair)
//        Vp [pairs][Dv][2]    (V[2t][e], V[2t+1][e])       packed per tile (pack_v_pairs)
// Each instruction does 32 multiply-adds where the fp32 path's FMA does 16. Qp and Vp are also
// the B-operand layouts of AMX (tiled_amx.h uses Qp and Pp as they are). The instructions are
// simd16_bf16.h's (emulated in the tests' avx2 builds of these tiers).
#pragma once

#if ATTNOPS_TIER_LEVEL < 3
#error "tiled_bf16.h is for the avx512bf16 and amx tiers"
#endif

#include <array>
#include <cstdint>
#include <cstring>

#include "attnops/ext/problem.h"
#include "backends/cpu/micro_kernels.h"
#include "backends/cpu/simd16_bf16.h"
#include "backends/cpu/tiled_common.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::bf16 {

using simd::BF32;
using simd::V16;
using tiled::i64;

// Qp[(p * bqp + r) * 2 + i] = q[i0 + r][2p + i] for r < nr and 2p + i < D; 0 elsewhere
// (lanes [nr, lanes), d in [D, Dp)). q is bf16: its bits are copied, no rounding.
inline void pack_q_pairs(const AttentionProblem& p, i64 b, i64 h, i64 i0, i64 nr, i64 lanes, i64 bqp, i64 Dp,
                         std::uint16_t* qp) {
  for (i64 r = 0; r < lanes; ++r) {
    const auto* q = r < nr ? reinterpret_cast<const std::uint16_t*>(tiled::at(p.q, b, i0 + r, h)) : nullptr;
    for (i64 d = 0; d < Dp; ++d) qp[((d >> 1) * bqp + r) * 2 + (d & 1)] = q && d < p.D ? q[d] : 0;
  }
}

// Vp[(t * Dv + e) * 2 + i] = v[(2t + i) * ldv + e] for 2t + i < nc, 0 for the row past an odd nc.
inline void pack_v_pairs(const std::uint16_t* v, i64 ldv, i64 nc, i64 Dv, std::uint16_t* out) {
  for (i64 t = 0; 2 * t < nc; ++t) {
    const std::uint16_t* r0 = v + 2 * t * ldv;
    const std::uint16_t* r1 = 2 * t + 1 < nc ? r0 + ldv : nullptr;
    std::uint16_t* o = out + t * Dv * 2;
    for (i64 e = 0; e < Dv; e += 32)
      simd::interleave_rows(r0 + e, r1 ? r1 + e : nullptr, static_cast<int>(std::min<i64>(32, Dv - e)),
                            o + e * 2);
  }
}

// Pp row for one vector of 16 lanes: (p0[l], p1[l]) rounded to bf16 (RNE), interleaved.
inline void store_pair(std::uint16_t* dst, V16 p0, V16 p1) {
  simd::store_pairs(dst, p0, p1);
}

// st[r][l] = sum_d k[r][d] * q[l][d] for r < R keys (rows ldk apart), l < 16 * NC lanes; qp is
// Qp at the chunk's first lane.
template <int R, int NC>
void qk_dot(const std::uint16_t* k, i64 ldk, const std::uint16_t* qp, i64 bqp, i64 D, float* st, i64 lds) {
  V16 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) acc[r][n] = simd::zero();
  const i64 pairs = D / 2;
  for (i64 p = 0; p < pairs; ++p) {
    BF32 q[NC];
    for (int n = 0; n < NC; ++n) q[n] = simd::bf32_load(qp + (p * bqp + 16 * n) * 2);
    for (int r = 0; r < R; ++r) {
      const BF32 kb = simd::bf32_pair(k + r * ldk + 2 * p);
      for (int n = 0; n < NC; ++n) acc[r][n] = simd::dot_pairs(acc[r][n], kb, q[n]);
    }
  }
  if (D & 1) {  // the last pair holds one element (Qp's second half is 0 there)
    BF32 q[NC];
    for (int n = 0; n < NC; ++n) q[n] = simd::bf32_load(qp + (pairs * bqp + 16 * n) * 2);
    for (int r = 0; r < R; ++r) {
      const BF32 kb = simd::bf32_half_pair(k + r * ldk + D - 1);
      for (int n = 0; n < NC; ++n) acc[r][n] = simd::dot_pairs(acc[r][n], kb, q[n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) simd::store(st + r * lds + 16 * n, acc[r][n]);
}

// ot[e][l] = alpha[l] * ot[e][l] + sum_t (V[2t][e] P[2t][l] + V[2t+1][e] P[2t+1][l]) for e < R
// value columns, l < 16 * NC lanes, t < npairs; vp is Vp at (first pair, first column), pp is Pp
// at (first pair, the chunk's first lane).
template <int R, int NC>
void pv_dot(const std::uint16_t* vp, i64 Dv, const std::uint16_t* pp, i64 bqp, i64 npairs, const float* alpha,
            float* ot, i64 ldo) {
  V16 acc[R][NC];
  for (int n = 0; n < NC; ++n) {
    const V16 a = simd::load(alpha + 16 * n);
    for (int r = 0; r < R; ++r) acc[r][n] = simd::mul(simd::load(ot + r * ldo + 16 * n), a);
  }
  for (i64 t = 0; t < npairs; ++t) {
    BF32 pr[NC];
    for (int n = 0; n < NC; ++n) pr[n] = simd::bf32_load(pp + (t * bqp + 16 * n) * 2);
    const std::uint16_t* vt = vp + t * Dv * 2;
    for (int r = 0; r < R; ++r) {
      const BF32 vb = simd::bf32_pair(vt + 2 * r);
      for (int n = 0; n < NC; ++n) acc[r][n] = simd::dot_pairs(acc[r][n], vb, pr[n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) simd::store(ot + r * ldo + 16 * n, acc[r][n]);
}

using QkFn = void (*)(const std::uint16_t*, i64, const std::uint16_t*, i64, i64, float*, i64);
using PvFn = void (*)(const std::uint16_t*, i64, const std::uint16_t*, i64, i64, const float*, float*, i64);
template <int R>
constexpr std::array<QkFn, micro::kMaxNC> qk_row() {
  return {qk_dot<R, 1>, qk_dot<R, 2>, qk_dot<R, 3>, qk_dot<R, 4>};
}
template <int R>
constexpr std::array<PvFn, micro::kMaxNC> pv_row() {
  return {pv_dot<R, 1>, pv_dot<R, 2>, pv_dot<R, 3>, pv_dot<R, 4>};
}
// Indexed [R - 1][NC - 1], as micro_kernels.h.
inline constexpr std::array<std::array<QkFn, micro::kMaxNC>, micro::kMaxR> kQk = {
    qk_row<1>(), qk_row<2>(), qk_row<3>(), qk_row<4>(), qk_row<5>(), qk_row<6>()};
inline constexpr std::array<std::array<PvFn, micro::kMaxNC>, micro::kMaxR> kPv = {
    pv_row<1>(), pv_row<2>(), pv_row<3>(), pv_row<4>(), pv_row<5>(), pv_row<6>()};

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::bf16
