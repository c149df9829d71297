// Shared pieces of the tiled CPU kernel (per-tier header; see tiled_cpu.cpp): the call's
// geometry, per-thread scratch, and each path's view of one kv tile's K and V.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attnops/ext/problem.h"
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

// Keys of one softmax step on the AMX path: consecutive full kv blocks of a q block's row are
// taken together up to this many keys (PyTorch's CPU flash attention uses 512 as well), so that
// O^T goes through the C tiles (a load and a store) and its rescale once per 512 keys instead of
// once per block; its S^T and P^T then live in L2. Other paths step one block at a time.
inline constexpr i64 kAmxSpanKeys = 512;
inline constexpr i64 span_keys(Path p, i64 bk) {
  return p == Path::amx && bk < kAmxSpanKeys ? kAmxSpanKeys / bk * bk : bk;
}

struct Ctx {
  const AttentionProblem& p;
  const BlockMap& map;
  AttentionBuffers& buffers;
  i64 bq, bk, bqp;  // block sizes; bqp = bq rounded up to 16 (lanes of a q block)
  i64 Dp;           // padded_d(path, D)
  i64 ot_rows;      // rows of O^T: Dv, or Dv rounded to 16 (AMX C tiles)
  i64 span;         // most keys of one softmax step: span_keys(path, bk)
  PackedKv packed;
};

// AVX2: the f32 path's O^T update reads V^T tiles [Dv][bk], transposed once per kv tile and
// task, instead of V's rows, where those rows are 4 KiB or more apart in place (H16 D128 f32:
// 8 KiB). With V rows, each key step of the 6 x 16 micro-tile broadcasts its 6 values from a new
// row: a new cache line per 12 ymm FMAs, and rows a multiple of 4 KiB apart share L1 sets. On one
// Zen 5 core, a standalone loop over one tile at the forward's strides: the update from rows 8 KiB
// apart 76 GFLOP/s, from contiguous rows 92, from V^T rows 110 (the Q K^T product 108). In the
// forward (2 threads, B1 H16 T2048 D128 f32 non-causal): +15% at 8 KiB; at 2 KiB (Hkv 4) and for
// f16 / bf16 (widened into contiguous rows) the same within noise, or a few % slower (the transpose's
// cost): not transposed there. AVX-512's 6 x 64 tile does twice the FMAs per row and ran at 200
// either way: no transpose there. Tried: one transpose per call into a V-sized buffer (tiles
// kept in this layout) instead of one per task: T2048 up to +10%, T4096 down 5%, in noisy runs;
// not kept (it also costs V's size in memory).
inline constexpr bool kVTransposed = ATTNOPS_TIER_LEVEL == 1;
inline constexpr i64 kVTransposeMinStrideBytes = 4096;
inline bool transposes_v(const AttentionProblem& p) {
  return kVTransposed && p.dtype == DType::f32 && p.v.stride(1) * 4 >= kVTransposeMinStrideBytes;
}

// AVX2: the f32 Q K^T product reads K tiles copied into contiguous rows (kpack_f) where K's rows
// lie 4 KiB or more apart in place. From rows 8 KiB apart (H16 D128) the 6-row micro-tile read 6
// streams that share L1 sets and that no prefetcher followed: perf, 1 thread, Zen 3, B1 H16 T2048
// D128 f32: the product took 1.5x the O^T update's time (same FLOPs), with the copy 1.0x (the
// copy 6.7% of the time, the kernel +5% by CPU time on a loaded machine).
inline constexpr bool kCopyK = ATTNOPS_TIER_LEVEL == 1;

// Q rows converted per step of the Q^T block's transposition (tiled_cpu.cpp).
inline constexpr i64 kQRows = 16;

// Per-thread scratch, sized for one path; allocated once per call.
struct Scratch {
  AlignedArray<float> qt, st, ot, kpack_f, vpack_f, vt_f, row, m, l, alpha;
  AlignedArray<std::uint16_t> qp, pp, vpack_h;
  AlignedArray<std::int32_t> segq;
  Scratch(const Ctx& x, Path path) {
    const AttentionProblem& p = x.p;
    const bool convert = path == Path::f32 && p.dtype != DType::f32;
    const i64 st_rows = round_up(x.span, 16) + 16;  // S^T rows: AMX writes whole 16-key tiles
    qt = aligned_array<float>(path == Path::f32 ? p.D * x.bqp : 0);
    qp = aligned_array<std::uint16_t>(path == Path::f32 ? 0 : x.Dp * x.bqp);
    st = aligned_array<float>(st_rows * x.bqp);
    pp = aligned_array<std::uint16_t>(path == Path::f32 ? 0 : (round_up(x.span, 32) + 32) * x.bqp);
    ot = aligned_array<float>(x.ot_rows * x.bqp);
    kpack_f = aligned_array<float>(convert || (path == Path::f32 && kCopyK) ? x.bk * p.D : 0);
    vpack_f = aligned_array<float>(convert ? x.bk * p.Dv : 0);
    vt_f = aligned_array<float>(path == Path::f32 && transposes_v(p) ? p.Dv * x.bk : 0);
    vpack_h = aligned_array<std::uint16_t>(path == Path::bf16_dot ? round_up(x.bk, 2) * p.Dv : 0);
    row = aligned_array<float>(kQRows * std::max(p.D, p.Dv));
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
  // f32 where transposes_v: V^T [Dv][nc] (row stride ldvt_f), the tile's V transposed
  const float* vt_f = nullptr;
  i64 ldvt_f = 0;
  // bf16 dot: K rows in place (bf16, row stride ldk); V pairs [ceil(nc/2)][Dv][2]
  const std::uint16_t *kh = nullptr, *vh = nullptr;
  // amx: packed K rows from key j0 (row stride ldkp) and V^T from key j0 (row stride ldvt)
  const std::uint16_t *kp = nullptr, *vt = nullptr;
  i64 ldkp = 0, ldvt = 0;
};

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::tiled
