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

#include "attnops/backward.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/aligned.h"
#include "backends/cpu/pool_for.h"
#include "backends/cpu/simd16_bf16.h"
#include "backends/cpu/tiled_amx.h"
#include "backends/cpu/transpose_tile.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::bwd_amx {

using i64 = std::int64_t;
using simd::V16;

inline i64 up(i64 x, i64 m) {
  return (x + m - 1) / m * m;
}

using amx::pack_transposed;
using amx::row_of;
using amx::words;

// out[((d / 2) * ld + r) * 2 + d % 2] = t(b, i0 + r, h, d) for r < nr, d < Dt; 0 for r in
// [nr, lanes) and d in [Dt, Dp): rows of t as pairs along d over `lanes` lanes (a B operand), a
// 32-bit transpose of the rows seen as words (element by element for odd dims or strides).
inline void pack_pairs(const TensorView& t, i64 b, i64 h, i64 i0, i64 nr, i64 lanes, i64 ld, i64 Dt, i64 Dp,
                       std::uint16_t* out) {
  const std::uint16_t* first = nr > 0 ? row_of(t, b, i0, h) : nullptr;
  if (first && Dt % 2 == 0 && t.stride(1) % 2 == 0 && reinterpret_cast<std::uintptr_t>(first) % 4 == 0) {
    std::memset(out, 0, static_cast<std::size_t>(Dp / 2 * ld) * 4);
    transpose::transpose_words(reinterpret_cast<const std::uint32_t*>(first), t.stride(1) / 2, nr, Dt / 2,
                               words(out), ld);
    return;
  }
  for (i64 r = 0; r < lanes; ++r) {
    const std::uint16_t* x = r < nr ? row_of(t, b, i0 + r, h) : nullptr;
    for (i64 d = 0; d < Dp; ++d)
      out[((d >> 1) * ld + r) * 2 + (d & 1)] = x && d < Dt ? x[d] : std::uint16_t{0};
  }
}

// What the backward packs once per call, bf16, zero past the data, for every (batch, kv head):
// K rows [k_rows][Dp], V rows [k_rows][Dvp], K^T [D16][k_rows] (k_rows = Tk rounded to 32, plus
// 32); for every (batch, q head): Q rows [q_rows][Dp], dO rows [q_rows][Dvp], Q^T [D16][q_rows],
// dO^T [Dv16][q_rows] (q_rows likewise from Tq). A tile reads whole 16-row tiles and 32-column
// steps from any row or column offset without leaving its head's zero-padded block.
struct Packed {
  AlignedArray<std::uint16_t> kr, vr, kt, qr, orw, qt, ot;
  i64 k_rows = 0, q_rows = 0, Dp = 0, Dvp = 0, D16 = 0, Dv16 = 0;
  const std::uint16_t* k_rows_of(i64 head) const { return kr.get() + head * k_rows * Dp; }
  const std::uint16_t* v_rows_of(i64 head) const { return vr.get() + head * k_rows * Dvp; }
  const std::uint16_t* kt_of(i64 head) const { return kt.get() + head * D16 * k_rows; }
  const std::uint16_t* q_rows_of(i64 head) const { return qr.get() + head * q_rows * Dp; }
  const std::uint16_t* o_rows_of(i64 head) const { return orw.get() + head * q_rows * Dvp; }
  const std::uint16_t* qt_of(i64 head) const { return qt.get() + head * D16 * q_rows; }
  const std::uint16_t* ot_of(i64 head) const { return ot.get() + head * Dv16 * q_rows; }
};

// Rows [j0, j0 + 32) of one head of a and c (row blocks of `rows` rows) into a_rows / c_rows
// (widths Da, Dc padded to Dap, Dcp) and a's transpose into a_t [D16][ld] (ld = rows).
inline void pack_block(const TensorView& a, const TensorView& c, i64 b, i64 h, i64 j0, i64 n, i64 rows,
                       std::uint16_t* a_rows, i64 Dap, std::uint16_t* c_rows, i64 Dcp, std::uint16_t* a_t,
                       i64 D16, std::uint16_t* c_t, i64 Dc16) {
  const i64 Da = a.dim(3), Dc = c.dim(3);
  for (i64 j = j0; j < j0 + 32; ++j) {
    std::uint16_t* ar = a_rows + j * Dap;
    std::uint16_t* cr = c_rows + j * Dcp;
    std::fill(ar, ar + Dap, std::uint16_t{0});
    std::fill(cr, cr + Dcp, std::uint16_t{0});
    if (j < n) {
      std::memcpy(ar, row_of(a, b, j, h), static_cast<std::size_t>(Da) * 2);
      std::memcpy(cr, row_of(c, b, j, h), static_cast<std::size_t>(Dc) * 2);
    }
  }
  for (i64 d = 0; d < D16; ++d) std::fill(a_t + d * rows + j0, a_t + d * rows + j0 + 32, std::uint16_t{0});
  if (c_t)
    for (i64 d = 0; d < Dc16; ++d) std::fill(c_t + d * rows + j0, c_t + d * rows + j0 + 32, std::uint16_t{0});
  if (j0 < n) {
    pack_transposed(a, b, h, j0, std::min<i64>(32, n - j0), Da, a_t + j0, rows);
    if (c_t) pack_transposed(c, b, h, j0, std::min<i64>(32, n - j0), Dc, c_t + j0, rows);
  }
}

inline Packed pack_call(const BackwardProblem& bp, int threads) {
  const AttentionProblem& p = bp.fwd;
  Packed pk;
  pk.Dp = up(p.D, 32), pk.Dvp = up(p.Dv, 32), pk.D16 = up(p.D, 16), pk.Dv16 = up(p.Dv, 16);
  pk.k_rows = up(p.Tk, 32) + 32;
  pk.q_rows = up(p.Tq, 32) + 32;
  const i64 kheads = p.B * p.Hkv, qheads = p.B * p.Hq;
  pk.kr = aligned_array<std::uint16_t>(kheads * pk.k_rows * pk.Dp);
  pk.vr = aligned_array<std::uint16_t>(kheads * pk.k_rows * pk.Dvp);
  pk.kt = aligned_array<std::uint16_t>(kheads * pk.D16 * pk.k_rows);
  pk.qr = aligned_array<std::uint16_t>(qheads * pk.q_rows * pk.Dp);
  pk.orw = aligned_array<std::uint16_t>(qheads * pk.q_rows * pk.Dvp);
  pk.qt = aligned_array<std::uint16_t>(qheads * pk.D16 * pk.q_rows);
  pk.ot = aligned_array<std::uint16_t>(qheads * pk.Dv16 * pk.q_rows);
  const i64 kblocks = pk.k_rows / 32, qblocks = pk.q_rows / 32;  // work items: 32 rows of one head
  auto item = [&](int, i64 it) {
    if (it < kheads * kblocks) {
      const i64 head = it / kblocks, b = head / p.Hkv, kh = head % p.Hkv;
      pack_block(p.k, p.v, b, kh, it % kblocks * 32, p.Tk, pk.k_rows, pk.kr.get() + head * pk.k_rows * pk.Dp,
                 pk.Dp, pk.vr.get() + head * pk.k_rows * pk.Dvp, pk.Dvp,
                 pk.kt.get() + head * pk.D16 * pk.k_rows, pk.D16, nullptr, 0);
      return;
    }
    it -= kheads * kblocks;
    const i64 head = it / qblocks, b = head / p.Hq, h = head % p.Hq;
    pack_block(p.q, bp.dout, b, h, it % qblocks * 32, p.Tq, pk.q_rows, pk.qr.get() + head * pk.q_rows * pk.Dp,
               pk.Dp, pk.orw.get() + head * pk.q_rows * pk.Dvp, pk.Dvp,
               pk.qt.get() + head * pk.D16 * pk.q_rows, pk.D16, pk.ot.get() + head * pk.Dv16 * pk.q_rows,
               pk.Dv16);
  };
  pool_for(threads, kheads * kblocks + qheads * qblocks, item);
  return pk;
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
