// The CPU backward's bf16 products on AMX tiles (per-tier header, amx tier; also built against
// the emulated tiles of amx_tiles.h for the tests). The backward's two kernels keep their
// layouts (tiled_backward.cpp) and their elementwise work; the seven products of a tile become
// tile blocks (tiled_amx.h: C (M x N fp32) += A (M x 32k bf16 rows) . B (pairs along k)):
//   dq task, lanes over q rows:  S^T  = K  . Q^T     A: K rows (per call)   B: Q pairs (per task)
//                                dP^T = V  . dO^T    A: V rows (per call)   B: dO pairs (per task)
//                                dQ^T += K^T . dS^T  A: K^T (per call)      B: dS^T pairs (per tile)
//   dk/dv unit, lanes over keys: S    = Q  . K^T     A: Q rows (per tile)   B: K pairs (per unit)
//                                dP   = dO . V^T     A: dO rows (per tile)  B: V pairs (per unit)
//                                dV^T += dO^T . P    A: dO^T (per tile)     B: P pairs (per tile)
//                                dK^T += Q^T . dS    A: Q^T (per tile)      B: dS pairs (per tile)
// Everything is packed zero-padded to whole tiles (rows to 16, reduced dims to 32), so no tile
// configuration changes. S and dP come out unscaled (q is bf16: its bits, no pre-scaled copy);
// the elementwise code applies the scale. P and dS are rounded to bf16 for the products that
// take them (as the forward rounds P); Delta, lz and every accumulator stay fp32. Calls with
// rows of q, k or dout holding NaN / inf take the fp32 products (the guarded ones).
#pragma once

#if ATTNOPS_TIER_LEVEL < 4
#error "tiled_backward_amx.h is for the amx tier"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/aligned.h"
#include "backends/cpu/pool_for.h"
#include "backends/cpu/simd16_bf16.h"
#include "backends/cpu/tiled_amx.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::bwd_amx {

using i64 = std::int64_t;
using simd::V16;

inline i64 up(i64 x, i64 m) {
  return (x + m - 1) / m * m;
}

// Element (b, i, h, 0) of a bf16 BTHD view.
inline const std::uint16_t* row_of(const TensorView& t, i64 b, i64 i, i64 h) {
  return static_cast<const std::uint16_t*>(t.data()) + b * t.stride(0) + i * t.stride(1) + h * t.stride(2);
}

// The call's K rows [k_rows][Dp], V rows [k_rows][Dvp] and K^T [D16][ldkt] of every (batch, kv
// head), bf16, zero past the data (k_rows = Tk rounded to 32, plus 32; ldkt the same).
struct Packed {
  AlignedArray<std::uint16_t> kr, vr, kt;
  i64 k_rows = 0, ldkt = 0, Dp = 0, Dvp = 0, D16 = 0;
  const std::uint16_t* k_rows_of(i64 head) const { return kr.get() + head * k_rows * Dp; }
  const std::uint16_t* v_rows_of(i64 head) const { return vr.get() + head * k_rows * Dvp; }
  const std::uint16_t* kt_of(i64 head) const { return kt.get() + head * D16 * ldkt; }
};

inline Packed pack_call(const AttentionProblem& p, int threads) {
  Packed pk;
  pk.Dp = up(p.D, 32), pk.Dvp = up(p.Dv, 32), pk.D16 = up(p.D, 16);
  pk.k_rows = pk.ldkt = up(p.Tk, 32) + 32;
  const i64 heads = p.B * p.Hkv;
  pk.kr = aligned_array<std::uint16_t>(heads * pk.k_rows * pk.Dp);
  pk.vr = aligned_array<std::uint16_t>(heads * pk.k_rows * pk.Dvp);
  pk.kt = aligned_array<std::uint16_t>(heads * pk.D16 * pk.ldkt);
  const i64 blocks = pk.k_rows / 32;  // work items: 32 keys of one head
  auto item = [&](int, i64 it) {
    const i64 head = it / blocks, b = head / p.Hkv, kh = head % p.Hkv, j0 = it % blocks * 32;
    std::uint16_t* kr = pk.kr.get() + head * pk.k_rows * pk.Dp;
    std::uint16_t* vr = pk.vr.get() + head * pk.k_rows * pk.Dvp;
    std::uint16_t* kt = pk.kt.get() + head * pk.D16 * pk.ldkt;
    for (i64 j = j0; j < j0 + 32; ++j) {
      const bool real = j < p.Tk;
      std::uint16_t* k = kr + j * pk.Dp;
      std::uint16_t* v = vr + j * pk.Dvp;
      std::fill(k, k + pk.Dp, std::uint16_t{0});
      std::fill(v, v + pk.Dvp, std::uint16_t{0});
      if (real) {
        std::memcpy(k, row_of(p.k, b, j, kh), static_cast<std::size_t>(p.D) * 2);
        std::memcpy(v, row_of(p.v, b, j, kh), static_cast<std::size_t>(p.Dv) * 2);
      }
      for (i64 d = 0; d < pk.D16; ++d) kt[d * pk.ldkt + j] = real && d < p.D ? k[d] : std::uint16_t{0};
    }
  };
  pool_for(threads, heads * blocks, item);
  return pk;
}

// out[((d / 2) * ld + r) * 2 + d % 2] = t(b, i0 + r, h, d) for r < nr, d < Dt; 0 for r in
// [nr, lanes) and d in [Dt, Dp): rows of t as pairs along d over `lanes` lanes (a B operand).
inline void pack_pairs(const TensorView& t, i64 b, i64 h, i64 i0, i64 nr, i64 lanes, i64 ld, i64 Dt, i64 Dp,
                       std::uint16_t* out) {
  for (i64 r = 0; r < lanes; ++r) {
    const std::uint16_t* x = r < nr ? row_of(t, b, i0 + r, h) : nullptr;
    for (i64 d = 0; d < Dp; ++d)
      out[((d >> 1) * ld + r) * 2 + (d & 1)] = x && d < Dt ? x[d] : std::uint16_t{0};
  }
}
// out[r * Dp + d] = t(b, i0 + r, h, d) for r < nr, d < Dt; 0 for r in [nr, rows), d in [Dt, Dp).
inline void pack_rows(const TensorView& t, i64 b, i64 h, i64 i0, i64 nr, i64 rows, i64 Dt, i64 Dp,
                      std::uint16_t* out) {
  for (i64 r = 0; r < rows; ++r) {
    std::uint16_t* o = out + r * Dp;
    std::fill(o, o + Dp, std::uint16_t{0});
    if (r < nr) std::memcpy(o, row_of(t, b, i0 + r, h), static_cast<std::size_t>(Dt) * 2);
  }
}
// The transpose: out[d * ld + r] for d < D16, r < ld (0 past nr rows and Dt columns).
inline void pack_cols(const TensorView& t, i64 b, i64 h, i64 i0, i64 nr, i64 ld, i64 Dt, i64 D16,
                      std::uint16_t* out) {
  for (i64 d = 0; d < D16; ++d) std::fill(out + d * ld, out + (d + 1) * ld, std::uint16_t{0});
  for (i64 r = 0; r < nr; ++r) {
    const std::uint16_t* x = row_of(t, b, i0 + r, h);
    for (i64 d = 0; d < Dt; ++d) out[d * ld + r] = x[d];
  }
}

// Rows [c_a, c_b) (pairs: c_a, c_b even) of src [rows][ld] fp32, lane vectors [n0, n0 + NC), as
// bf16 pairs (rows c, c + 1) into dst [(c_b - c_a) / 2][ld][2]; rows outside [c_lo, c_hi) are 0.
inline void store_row_pairs(const float* src, i64 ld, i64 n0, int NC, i64 c_a, i64 c_b, i64 c_lo, i64 c_hi,
                            std::uint16_t* dst) {
  for (i64 c = c_a; c < c_b; c += 2)
    for (i64 n = n0; n < n0 + NC; ++n) {
      const i64 l0 = n * 16;
      const V16 p0 = c >= c_lo && c < c_hi ? simd::load(src + c * ld + l0) : simd::zero();
      const V16 p1 = c + 1 >= c_lo && c + 1 < c_hi ? simd::load(src + (c + 1) * ld + l0) : simd::zero();
      simd::store_pairs(dst + ((c - c_a) / 2 * ld + l0) * 2, p0, p1);
    }
}

// C [rows c_lo.. (16-row tiles)][lanes of n0..] = A rows . B pairs, the forward's S^T product
// (tiled_amx.h amx::qk) with A rows `a` (lda apart, Dp wide) and B pairs `bp` over ld lanes.
inline void rows_times_pairs(const std::uint16_t* a, i64 lda, const std::uint16_t* bp, i64 ld, i64 Dp, i64 n0,
                             int NC, i64 c_lo, i64 c_hi, float* c) {
  tiled::TileOperands t;
  t.kp = a;
  t.ldkp = lda;
  amx::qk(t, bp, ld, Dp, n0, NC, c_lo, c_hi, c);
}
// C [rows][lanes of n0..] += A [rows][ld_a columns from c_a] . B pairs (rows c_a..c_b), the
// forward's O^T update without its rescale (tiled_amx.h amx::pv); C has `rows` (16-multiple) rows.
inline void cols_times_pairs(const std::uint16_t* a, i64 lda, const std::uint16_t* bp, i64 ld, i64 rows,
                             i64 n0, int NC, i64 c_a, i64 c_b, float* c) {
  tiled::TileOperands t;
  t.vt = a;
  t.ldvt = lda;
  amx::pv(t, bp, ld, rows, n0, NC, c_a, c_b, nullptr, c);
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::bwd_amx
