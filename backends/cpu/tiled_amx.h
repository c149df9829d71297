// The tiled kernel's bf16 path on AMX tiles (per-tier header, amx tier; also compiled against
// the emulated tiles of amx_tiles.h for the tests).
//
// TDPBF16PS C, A, B: C[m][n] += sum_k A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1], with A an M x 32
// bf16 row-major tile and B 16 pair-rows x (16 x 2) bf16. In the transposed formulation of
// tiled_cpu.cpp (16-lane vectors over query rows):
//   q.k  S^T [16 keys][16 lanes] += Kp [16 keys][32 d] . Qp [16 d-pairs][16 lanes][2]
//   p.v  O^T [16 e][16 lanes]    += Vt [16 e][32 keys] . Pp [16 key-pairs][16 lanes][2]
// Qp and Pp are the bf16-dot path's layouts (tiled_bf16.h), read as B tiles with a row stride of
// bqp lanes x 4 bytes. K and V^T are re-laid out once per call (pack_kv): K rows with d padded
// to 32, V^T with keys padded, both zero-filled past the data, so that every tile is a full
// 16 x 64-byte tile at any kv-tile offset (no per-shape tile configuration; bq, bk, D and Dv
// need no particular multiple). Blocking 2 x 2: tiles 0-3 accumulate C, 4-5 hold A, 6-7 hold B.
#pragma once

#if ATTNOPS_TIER_LEVEL < 4
#error "tiled_amx.h is for the amx tier"
#endif

#include <algorithm>
#include <cstring>

#include "attnops/ext/problem.h"
#include "backends/cpu/amx_tiles.h"
#include "backends/cpu/pool_for.h"
#include "backends/cpu/simd16_bf16.h"
#include "backends/cpu/tiled_common.h"
#include "backends/cpu/transpose_tile.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::amx {

using tiled::i64;
using tiled::round_up;

// Element (b, i, h, 0) of a bf16 BTHD view.
inline const std::uint16_t* row_of(const TensorView& t, i64 b, i64 i, i64 h) {
  return static_cast<const std::uint16_t*>(t.data()) + b * t.stride(0) + i * t.stride(1) + h * t.stride(2);
}

// 32-bit words from the pairs of 16-bit elements (the AMX B and transposed-A layouts are 32-bit
// transposes of bf16 pairs, transpose_tile.h's transpose_words).
inline std::uint32_t* words(std::uint16_t* p) {
  return reinterpret_cast<std::uint32_t*>(p);
}

// out[d * ld + r] = t(b, i0 + r, h, d) for r < n, d < Dt (16-bit; ld even; out zeroed by the
// caller): rows r, r + 1 interleaved into 32-bit words, then a 32-bit transpose, 32 x 32 at a time.
inline void pack_transposed(const TensorView& t, i64 b, i64 h, i64 i0, i64 n, i64 Dt, std::uint16_t* out,
                            i64 ld) {
  alignas(64) std::uint16_t w[16 * 64];  // 16 word rows (32 source rows) x 32 words (32 columns)
  for (i64 r0 = 0; r0 < n; r0 += 32) {
    const i64 rows = std::min<i64>(32, n - r0), wrows = (rows + 1) / 2;
    for (i64 d0 = 0; d0 < Dt; d0 += 32) {
      const int cols = static_cast<int>(std::min<i64>(32, Dt - d0));
      for (i64 k = 0; k < wrows; ++k) {
        const std::uint16_t* a = row_of(t, b, i0 + r0 + 2 * k, h) + d0;
        const std::uint16_t* c = 2 * k + 1 < rows ? row_of(t, b, i0 + r0 + 2 * k + 1, h) + d0 : nullptr;
        simd::interleave_rows(a, c, cols, w + k * 64);
      }
      transpose::transpose_words(words(w), 32, wrows, cols, words(out + d0 * ld + r0), ld / 2);
    }
  }
}

// K of every (batch, kv head) as rows [k_rows = Tk + 16][Dp] and V^T as [Dv16][ldvt = Tk32 + 32]
// bf16, zero past the data: the last tile of a row reads up to 15 keys / 31 key columns past Tk.
inline tiled::PackedKv pack_kv(const AttentionProblem& p, int threads) {
  tiled::PackedKv pk;
  const i64 Dp = round_up(p.D, 32), heads = p.B * p.Hkv;
  pk.k_rows = p.Tk + 16;
  pk.ldvt = round_up(p.Tk, 32) + 32;
  pk.dv16 = round_up(p.Dv, 16);
  pk.k = tiled::aligned_array<std::uint16_t>(heads * pk.k_rows * Dp);
  pk.vt = tiled::aligned_array<std::uint16_t>(heads * pk.dv16 * pk.ldvt);
  const i64 kblocks = (pk.k_rows + 63) / 64;  // work items: 64 keys of one head
  // On the work pool (work_pool.h), as the kernel that reads it: each item writes its own rows.
  auto pack_item = [&](int /*slot*/, i64 item) {
    const i64 head = item / kblocks, b = head / p.Hkv, kh = head % p.Hkv;
    const i64 j_begin = item % kblocks * 64, j_end = std::min(j_begin + 64, pk.k_rows);
    std::uint16_t* kd = pk.k.get() + head * pk.k_rows * Dp;
    for (i64 j = j_begin; j < j_end; ++j) {
      std::uint16_t* row = kd + j * Dp;
      i64 filled = 0;
      if (j < p.Tk) {
        std::memcpy(row, tiled::at(p.k, b, j, kh), static_cast<std::size_t>(p.D) * 2);
        filled = p.D;
      }
      std::fill(row + filled, row + Dp, std::uint16_t{0});
    }
    // V^T columns [j_begin, j_end) of this head (the zero columns past k_rows come below): 32-bit
    // transposes of pairs of V rows (pack_transposed).
    std::uint16_t* vd = pk.vt.get() + head * pk.dv16 * pk.ldvt;
    for (i64 e = 0; e < pk.dv16; ++e)
      std::fill(vd + e * pk.ldvt + j_begin, vd + e * pk.ldvt + j_end, std::uint16_t{0});
    if (j_begin < p.Tk)
      pack_transposed(p.v, b, kh, j_begin, std::min(j_end, p.Tk) - j_begin, p.Dv, vd + j_begin, pk.ldvt);
    if (j_end == pk.k_rows)
      for (i64 e = 0; e < pk.dv16; ++e)
        std::fill(vd + e * pk.ldvt + pk.k_rows, vd + (e + 1) * pk.ldvt, std::uint16_t{0});
  };
  pool_for(threads, heads * kblocks, pack_item);
  return pk;
}

// C (KB x LB tiles of 16 x 16 fp32) over `chunks` steps of 32 along the reduced axis:
//   A tile i: a + i * 16 * lda_el + step * 32            (rows lda_el bf16 apart)
//   B tile j: b + step * 16 * ldb_el + j * 32            (pair rows ldb_el bf16 apart)
//   C tile (i, j): c + i * 16 * ldc_el + j * 16          (rows ldc_el floats apart)
// kLoadC: C starts from memory (accumulate), else from 0.
template <int KB, int LB, bool kLoadC>
void tile_block(const std::uint16_t* a, i64 lda_el, const std::uint16_t* b, i64 ldb_el, i64 chunks, float* c,
                i64 ldc_el) {
  const i64 lda = lda_el * 2, ldb = ldb_el * 2, ldc = ldc_el * 4;  // strides in bytes
  float* c1 = c + 16;
  float* c2 = c + 16 * ldc_el;
  float* c3 = c2 + 16;
  if constexpr (kLoadC) {
    ATTNOPS_AMX_LOADD(0, c, ldc);
    if constexpr (LB == 2) ATTNOPS_AMX_LOADD(1, c1, ldc);
    if constexpr (KB == 2) ATTNOPS_AMX_LOADD(2, c2, ldc);
    if constexpr (KB == 2 && LB == 2) ATTNOPS_AMX_LOADD(3, c3, ldc);
  } else {
    ATTNOPS_AMX_ZERO(0);
    if constexpr (LB == 2) ATTNOPS_AMX_ZERO(1);
    if constexpr (KB == 2) ATTNOPS_AMX_ZERO(2);
    if constexpr (KB == 2 && LB == 2) ATTNOPS_AMX_ZERO(3);
  }
  for (i64 s = 0; s < chunks; ++s) {
    const std::uint16_t* as = a + s * 32;
    const std::uint16_t* bs = b + s * 16 * ldb_el;
    ATTNOPS_AMX_LOADD(4, as, lda);
    if constexpr (KB == 2) ATTNOPS_AMX_LOADD(5, as + 16 * lda_el, lda);
    ATTNOPS_AMX_LOADD(6, bs, ldb);
    if constexpr (LB == 2) ATTNOPS_AMX_LOADD(7, bs + 32, ldb);
    ATTNOPS_AMX_DPBF16PS(0, 4, 6);
    if constexpr (LB == 2) ATTNOPS_AMX_DPBF16PS(1, 4, 7);
    if constexpr (KB == 2) ATTNOPS_AMX_DPBF16PS(2, 5, 6);
    if constexpr (KB == 2 && LB == 2) ATTNOPS_AMX_DPBF16PS(3, 5, 7);
  }
  ATTNOPS_AMX_STORED(0, c, ldc);
  if constexpr (LB == 2) ATTNOPS_AMX_STORED(1, c1, ldc);
  if constexpr (KB == 2) ATTNOPS_AMX_STORED(2, c2, ldc);
  if constexpr (KB == 2 && LB == 2) ATTNOPS_AMX_STORED(3, c3, ldc);
}

// One block of rows_left (>= 1) A rows and lanes_left (>= 1) lane vectors, at most 2 x 2 tiles.
template <bool kLoadC>
void tile_block_any(i64 rows_left, i64 lanes_left, const std::uint16_t* a, i64 lda_el, const std::uint16_t* b,
                    i64 ldb_el, i64 chunks, float* c, i64 ldc_el) {
  const bool two_rows = rows_left > 16, two_lanes = lanes_left > 1;
  if (two_rows && two_lanes) {
    tile_block<2, 2, kLoadC>(a, lda_el, b, ldb_el, chunks, c, ldc_el);
  } else if (two_rows) {
    tile_block<2, 1, kLoadC>(a, lda_el, b, ldb_el, chunks, c, ldc_el);
  } else if (two_lanes) {
    tile_block<1, 2, kLoadC>(a, lda_el, b, ldb_el, chunks, c, ldc_el);
  } else {
    tile_block<1, 1, kLoadC>(a, lda_el, b, ldb_el, chunks, c, ldc_el);
  }
}

// S^T rows [c_lo, c_hi) (widened to 16-row tiles) x the chunk's NC lane vectors from n0:
// st[c][l] = sum_d K[j0 + c][d] Q[l][d]. qp is Qp (all lanes), Dp its padded head dim.
inline void qk(const tiled::TileOperands& t, const std::uint16_t* qp, i64 bqp, i64 Dp, i64 n0, int NC,
               i64 c_lo, i64 c_hi, float* st) {
  const i64 c_end = round_up(c_hi, 16);
  for (i64 c0 = c_lo / 16 * 16; c0 < c_end; c0 += 32)
    for (int n = 0; n < NC; n += 2) {
      const i64 l0 = (n0 + n) * 16;
      tile_block_any<false>(c_end - c0, NC - n, t.kp + c0 * t.ldkp, t.ldkp, qp + l0 * 2, bqp * 2, Dp / 32,
                            st + c0 * bqp + l0, bqp);
    }
}

// O^T = alpha * O^T + V^T P^T for the chunk's NC lane vectors from n0, keys [c_a, c_b) (multiples
// of 32 from the tile start; pp holds their pairs from c_a). ot has ot_rows (Dv rounded to 16) rows.
// alpha == nullptr: every factor is exactly 1 (no row's max changed), no rescale pass.
inline void pv(const tiled::TileOperands& t, const std::uint16_t* pp, i64 bqp, i64 ot_rows, i64 n0, int NC,
               i64 c_a, i64 c_b, const float* alpha, float* ot) {
  if (alpha)
    for (i64 e = 0; e < ot_rows; ++e)
      for (int n = 0; n < NC; ++n) {
        float* o = ot + e * bqp + (n0 + n) * 16;
        simd::store(o, simd::mul(simd::load(o), simd::load(alpha + (n0 + n) * 16)));
      }
  for (i64 e0 = 0; e0 < ot_rows; e0 += 32)
    for (int n = 0; n < NC; n += 2) {
      const i64 l0 = (n0 + n) * 16;
      tile_block_any<true>(ot_rows - e0, NC - n, t.vt + e0 * t.ldvt + c_a, t.ldvt, pp + l0 * 2, bqp * 2,
                           (c_b - c_a) / 32, ot + e0 * bqp + l0, bqp);
    }
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::amx
