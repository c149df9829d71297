// Per-tier header: what the CPU backward's two kernels share (tiled_backward.cpp: the dq task,
// the row statistics and the entry point; tiled_backward_dkv.cpp: the dk/dv unit). See
// tiled_backward.cpp for the algorithm and the layouts. Everything lives in the tier's namespace
// (README.md, rules for per-tier sources).
#pragma once

#if !defined(ATTNOPS_TIER_NS)
#error "backends/cpu/tiled_backward_parts.h is only for per-tier kernel sources (see backends/cpu/README.md)"
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attnops/backward.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/aligned.h"
#include "backends/cpu/micro_kernels.h"
#include "backends/cpu/simd16.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::bwd {

using simd::Mask16;
using simd::V16;
using i64 = std::int64_t;

using micro::acc_panel;
using micro::kMaxNC;
using micro::kMaxR;
constexpr float kInf = std::numeric_limits<float>::infinity();

inline i64 round_up(i64 x, i64 m) {
  return (x + m - 1) / m * m;
}

// ---- scratch and small helpers ---------------------------------------------------------------

template <class T>
using Buf = AlignedArray<T>;

// c[r][16n + l] = sum_k a[r * lda + k] * bt[k * ldb + 16n + l] (the forward's gemm_micro).
inline void dot_tile(int R, int NC, const float* bt, i64 ldb, const float* a, i64 lda, i64 n, float* c,
                     i64 ldc) {
  micro::kGemm<false>[R - 1][NC - 1](a, lda, bt, ldb, n, c, ldc);
}

// The smallest and largest of the n >= 1 segment ids at `ids`.
inline void id_range(const std::int32_t* ids, i64 n, std::int32_t& lo, std::int32_t& hi) {
  lo = hi = ids[0];
  for (i64 i = 1; i < n; ++i) lo = std::min(lo, ids[i]), hi = std::max(hi, ids[i]);
}

// Per-thread scratch for both kinds of task; sizes from the block and head dims only.
struct Scratch {
  // The visible lanes of each (key or row, vector) of the current chunk, for the guarded
  // products: [max(bq, bk)][kMaxNC].
  Buf<Mask16> vism;
  // dq task, lanes over query rows (bqp): Q^T (scaled), dO^T, dQ^T, S^T / dS^T, dP^T, K / V tile
  // widened from f16/bf16, the block's lz / Delta / segment ids.
  Buf<float> qt, ot, dqt, st, dpt, kpack, vpack, lz, di;
  Buf<std::int32_t> segq;
  // dk/dv unit, lanes over keys (bkp): K^T (scaled), V^T, dK^T, dV^T, S / P, dP / dS, Q / dO rows
  // widened from f16/bf16, the block's segment ids.
  Buf<float> kt, vt, dkt, dvt, s, dp, qpack, opack;
  Buf<std::int32_t> segk;
  Buf<float> row, row2;  // one row of max(D, Dv) floats each
  // The AMX products' operands (tiled_backward_amx.h; empty on the fp32 products): dq task: Q and
  // dO pairs, dS^T pairs; dk/dv unit: K and V pairs, P and dS pairs. dQ^T, dK^T, dV^T then have
  // their dims rounded to 16 rows.
  Buf<std::uint16_t> a_qp, a_op, a_dsp, a_kp, a_vp, a_pp, a_dsr;
  Scratch(i64 bq, i64 bk, i64 bqp, i64 bkp, i64 D, i64 Dv, bool convert, bool amx = false)
      : vism(aligned_array<Mask16>(std::max(bq, bk) * kMaxNC)),
        qt(aligned_array<float>(D * bqp)),
        ot(aligned_array<float>(Dv * bqp)),
        dqt(aligned_array<float>(round_up(D, 16) * bqp)),
        st(aligned_array<float>(round_up(bk, 16) * bqp)),
        dpt(aligned_array<float>(round_up(bk, 16) * bqp)),
        kpack(aligned_array<float>(convert ? bk * D : 0)),
        vpack(aligned_array<float>(convert ? bk * Dv : 0)),
        lz(aligned_array<float>(bqp)),
        di(aligned_array<float>(bqp)),
        segq(aligned_array<std::int32_t>(bqp)),
        kt(aligned_array<float>(D * bkp)),
        vt(aligned_array<float>(Dv * bkp)),
        dkt(aligned_array<float>(round_up(D, 16) * bkp)),
        dvt(aligned_array<float>(round_up(Dv, 16) * bkp)),
        s(aligned_array<float>(round_up(bq, 16) * bkp)),
        dp(aligned_array<float>(round_up(bq, 16) * bkp)),
        qpack(aligned_array<float>(convert ? bq * D : 0)),
        opack(aligned_array<float>(convert ? bq * Dv : 0)),
        segk(aligned_array<std::int32_t>(bkp)),
        row(aligned_array<float>(std::max(D, Dv))),
        row2(aligned_array<float>(std::max(D, Dv))) {
    if (!amx) return;
    const i64 Dp = round_up(D, 32), Dvp = round_up(Dv, 32), bq32 = round_up(bq, 32), bk32 = round_up(bk, 32);
    a_qp = aligned_array<std::uint16_t>(Dp * bqp);
    a_op = aligned_array<std::uint16_t>(Dvp * bqp);
    a_dsp = aligned_array<std::uint16_t>((bk32 + 32) * bqp);
    a_kp = aligned_array<std::uint16_t>(Dp * bkp);
    a_vp = aligned_array<std::uint16_t>(Dvp * bkp);
    a_pp = aligned_array<std::uint16_t>((bq32 + 32) * bkp);
    a_dsr = aligned_array<std::uint16_t>((bq32 + 32) * bkp);
  }
};

// 16 bits of a bitset (row or transposed column) starting at bit l0, a multiple of 16.
inline Mask16 bits16(const std::uint64_t* words, i64 l0) {
  return static_cast<Mask16>(words[l0 >> 6] >> (l0 & 63));
}
// The low n bits set (n <= 16).
inline Mask16 low_bits(i64 n) {
  return static_cast<Mask16>(n >= 16 ? 0xffffu : (1u << n) - 1u);
}

// Element pointer of a BTHD view.
inline const char* at(const TensorView& t, i64 b, i64 i, i64 h) {
  return static_cast<const char*>(t.data()) +
         (b * t.stride(0) + i * t.stride(1) + h * t.stride(2)) * static_cast<i64>(dtype_size(t.dtype()));
}

// Writes n floats times `mul` at element offset `off` of a contiguous f32/f16/bf16 tensor.
inline void store_row(Tensor& t, i64 off, const float* src, i64 n, float mul) {
  switch (t.dtype()) {
    case DType::f32: {
      float* o = t.data_as<float>() + off;
      for (i64 e = 0; e < n; ++e) o[e] = src[e] * mul;
      break;
    }
    case DType::f16: {
      std::uint16_t* o = t.data_as<std::uint16_t>() + off;
      for (i64 e = 0; e < n; ++e) o[e] = float_to_half_bits(src[e] * mul);
      break;
    }
    default: {
      std::uint16_t* o = t.data_as<std::uint16_t>() + off;
      for (i64 e = 0; e < n; ++e) o[e] = float_to_bf16_bits(src[e] * mul);
      break;
    }
  }
}

// One non-empty tile of column kb of the block map: its q block and how to mask it.
struct ColBlock {
  std::int32_t qb = 0;
  std::int32_t partial = -1;  // as BlockMap::Block
};

// ---- the kernels -----------------------------------------------------------------------------

struct Backward {
  const BackwardProblem& bp;
  const AttentionProblem& p;
  const BlockMap& map;
  GradientBuffers& g;
  const float* lz;  // [B, Hq, Tq]: log of the softmax denominator (sink included); +inf if empty
  const float* di;  // [B, Hq, Tq]: Delta = rowsum(dout * out)
  // Rows holding a NaN or inf, [B, T, H] (q and dout: [B, Tq, Hq]; k: [B, Tk, Hkv]); null when
  // none does (the unguarded products run).
  const std::uint8_t *qbad, *obad, *kbad;
  const i64* col_start;  // column (head copy hh, kv block kb): col[col_start[hh*nk+kb] .. +1)
  const ColBlock* col;
  i64 bq, bk, bqp, bkp;
  float scale, capf;
  bool cap, convert, seg;
  // The AMX products (tiled_backward_amx.h): bf16 on the amx tier with no NaN / inf row; the
  // call's packed K rows, V rows and K^T (null otherwise).
  const void* amx = nullptr;

  void dq_task(Scratch& s, i64 b, i64 h, i64 qb) const;
  void dkv_unit(Scratch& s, i64 b, i64 kvh, i64 kb) const;
};

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::bwd
