// Shared pieces of the tiled CPU kernel (per-tier header; see tiled_cpu.cpp): the call's
// geometry, per-thread scratch, and each path's view of one kv tile's K and V.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attnops/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/aligned.h"
#include "backends/cpu/simd16.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::tiled {

using i64 = std::int64_t;
using cpu::ATTNOPS_TIER_NS::aligned_array;
using cpu::ATTNOPS_TIER_NS::AlignedArray;

// How q.k and p.v are computed (see tiled_cpu.cpp).
enum class Path { f32, bf16_dot, amx };

inline constexpr i64 round_up(i64 x, i64 m) {
  return (x + m - 1) / m * m;
}
// P^T's key ranges start and end at multiples of this: pairs of keys (bf16 paths), 32-key AMX
// tile rows.
inline constexpr i64 key_align(Path p) {
  return p == Path::f32 ? 1 : p == Path::bf16_dot ? 2 : 32;
}
// Head dim as the path stores Q^T: pairs along d (bf16 dot), 32-element tile rows (AMX).
inline constexpr i64 padded_d(Path p, i64 D) {
  return p == Path::f32 ? D : p == Path::bf16_dot ? round_up(D, 2) : round_up(D, 32);
}

// Element pointer of a BTHD view.
inline const char* at(const TensorView& t, i64 b, i64 i, i64 h) {
  return static_cast<const char*>(t.data()) +
         (b * t.stride(0) + i * t.stride(1) + h * t.stride(2)) * static_cast<i64>(dtype_size(t.dtype()));
}

// K and V of the whole call re-laid out for AMX once (tiled_amx.h); empty on other paths.
struct PackedKv {
  AlignedArray<std::uint16_t> k;   // [B][Hkv][k_rows][Dp]  K rows, d zero-padded to Dp
  AlignedArray<std::uint16_t> vt;  // [B][Hkv][Dv16][ldvt]  V^T, keys zero-padded to ldvt
  i64 k_rows = 0, ldvt = 0, dv16 = 0;
};

struct Ctx {
  const AttentionProblem& p;
  const BlockMap& map;
  AttentionBuffers& buffers;
  i64 bq, bk, bqp;  // block sizes; bqp = bq rounded up to 16 (lanes of a q block)
  i64 Dp;           // padded_d(path, D)
  i64 ot_rows;      // rows of O^T: Dv, or Dv rounded to 16 (AMX C tiles)
  PackedKv packed;
};

// Per-thread scratch, sized for one path; allocated once per call.
struct Scratch {
  AlignedArray<float> qt, st, ot, kpack_f, vpack_f, row, m, l, alpha;
  AlignedArray<std::uint16_t> qp, pp, vpack_h;
  AlignedArray<std::int32_t> segq;
  Scratch(const Ctx& x, Path path) {
    const AttentionProblem& p = x.p;
    const bool convert = path == Path::f32 && p.dtype != DType::f32;
    const i64 bk_rows = round_up(x.bk, 16) + 16;  // S^T rows: AMX writes whole 16-key tiles
    qt = aligned_array<float>(path == Path::f32 ? p.D * x.bqp : 0);
    qp = aligned_array<std::uint16_t>(path == Path::f32 ? 0 : x.Dp * x.bqp);
    st = aligned_array<float>(bk_rows * x.bqp);
    pp = aligned_array<std::uint16_t>(path == Path::f32 ? 0 : (round_up(x.bk, 32) + 32) * x.bqp);
    ot = aligned_array<float>(x.ot_rows * x.bqp);
    kpack_f = aligned_array<float>(convert ? x.bk * p.D : 0);
    vpack_f = aligned_array<float>(convert ? x.bk * p.Dv : 0);
    vpack_h = aligned_array<std::uint16_t>(path == Path::bf16_dot ? round_up(x.bk, 2) * p.Dv : 0);
    row = aligned_array<float>(std::max(p.D, p.Dv));
    m = aligned_array<float>(x.bqp);
    l = aligned_array<float>(x.bqp);
    alpha = aligned_array<float>(x.bqp);
    segq = aligned_array<std::int32_t>(x.bqp);
  }
};

// One kv tile's K and V in the layout of the path that reads them.
struct TileOperands {
  i64 j0 = 0, nc = 0;
  // f32: K [nc][D] and V [nc][Dv] rows (in place with the view's row stride, or widened copies)
  const float *kf = nullptr, *vf = nullptr;
  i64 ldk = 0, ldv = 0;
  // bf16 dot: K rows in place (bf16, row stride ldk); V pairs [ceil(nc/2)][Dv][2]
  const std::uint16_t *kh = nullptr, *vh = nullptr;
  // amx: packed K rows from key j0 (row stride ldkp) and V^T from key j0 (row stride ldvt)
  const std::uint16_t *kp = nullptr, *vt = nullptr;
  i64 ldkp = 0, ldvt = 0;
};

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::tiled
