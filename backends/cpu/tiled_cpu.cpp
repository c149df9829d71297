// Per-tier source (compiled once per ISA tier, see README.md): fast tiled attention on the CPU,
// FlashAttention-2's algorithm (see tiled_native.cpp for the plain statement) with the data laid
// out so that every inner loop is a vector loop.
//
// Transposed formulation. The 16 lanes of a vector run over query rows, not over keys:
//   Q^T  [D][bqp]    the q block, transposed and pre-scaled, once per task (bqp = bq rounded to 16)
//   S^T  [bk][bqp]   scores of one kv tile: S^T[c] = sum_d K[c][d] * Q^T[d]   (K[c][d] broadcast)
//   O^T  [Dv][bqp]   the output accumulator: O^T[e] = alpha * O^T[e] + sum_c V[c][e] * P^T[c]
// so K and V are read in their natural row layout (broadcast one element, multiply a row of
// Q^T or P^T): no per-tile transpose, and head dims that are not multiples of 16 (72, 80, 96,
// 112, ...) cost exactly their flops, because D and Dv are loop trip counts, never lane counts.
// The online softmax is vertical too: a row's running max, sum and rescale factor are one lane
// of a vector, so there is no horizontal reduction anywhere (results are bitwise independent
// of the thread count: each query row is computed by one thread in a fixed order).
//
// Three paths share the tiling, the masks and the online softmax (Path below):
//   f32       every tier; f16 / bf16 K/V tiles widened to fp32 once per tile (micro_kernels.h)
//   bf16_dot  avx512bf16 and up, bf16 inputs: q.k and p.v on VDPBF16PS with pairs along d and
//             along keys (tiled_bf16.h); P is rounded to bf16 for p.v, m, l and O stay fp32
//   amx       amx tier, bf16 inputs: the same pair layouts as AMX tiles (tiled_amx.h)
//
// Parallelism: the work pool (work_pool.h) over tasks (batch, q head, q block), grouped by kv
// head so that the threads share the K/V they read, heaviest first within a group, handed out
// dynamically, which balances causal and windowed work. Scratch is allocated once per thread
// per call and is O(block sizes x head dims): no S x S buffer.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/common/softmax_policy.h"
#include "backends/common/threads.h"
#include "backends/cpu/micro_kernels.h"
#include "backends/cpu/pool_for.h"
#include "backends/cpu/simd16.h"
#include "backends/cpu/tier_entry.h"
#include "backends/cpu/tiled_common.h"
#include "backends/cpu/transpose_tile.h"
#include "backends/cpu/vanilla_simd.h"  // prefetch_bytes
#if ATTNOPS_TIER_LEVEL >= 3
#include "backends/cpu/tiled_bf16.h"
#endif
#if ATTNOPS_TIER_LEVEL >= 4
#include "backends/cpu/tiled_amx.h"
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS {
namespace {

using simd::Mask16;
using simd::V16;
using tiled::at;
using tiled::i64;
using tiled::Path;
using tiled::round_up;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 16 bits of a transposed partial bitset column starting at lane l0 (a multiple of 16).
inline Mask16 bits16(const std::uint64_t* col, i64 l0) {
  return static_cast<Mask16>(col[l0 >> 6] >> (l0 & 63));
}

// Rows of K / V asked for ahead of their conversion (tile_operands): about 16 rows' worth of
// conversion work covers a DRAM access.
constexpr i64 kPrefetchRows = 16;

// One kv tile's K and V in the layout of path P.
template <Path P>
tiled::TileOperands tile_operands(const tiled::Ctx& x, tiled::Scratch& s, i64 b, i64 kh, i64 j0, i64 nc) {
  const AttentionProblem& p = x.p;
  tiled::TileOperands t;
  t.j0 = j0;
  t.nc = nc;
  if constexpr (P == Path::f32) {
    if (p.dtype == DType::f32 && tiled::kCopyK && p.k.stride(1) * 4 >= tiled::kVTransposeMinStrideBytes) {
      for (i64 c = 0; c < nc; ++c)
        std::memcpy(s.kpack_f.get() + c * p.D, at(p.k, b, j0 + c, kh), static_cast<std::size_t>(p.D) * 4);
      t.kf = s.kpack_f.get();
      t.ldk = p.D;
      t.vf = reinterpret_cast<const float*>(at(p.v, b, j0, kh));
      t.ldv = p.v.stride(1);
    } else if (p.dtype == DType::f32) {
      t.kf = reinterpret_cast<const float*>(at(p.k, b, j0, kh));
      t.vf = reinterpret_cast<const float*>(at(p.v, b, j0, kh));
      t.ldk = p.k.stride(1);
      t.ldv = p.v.stride(1);
    } else {
      // The rows kPrefetchRows ahead are asked for while these are widened (past the tile's end:
      // the next tile's first rows, the next one of a dense map). A task reads its head's whole K
      // and V, 2 MiB at Tk 4096 D128 f16, rows 8 KiB apart (H16): without the prefetches the
      // conversion waited on memory row by row (perf: a quarter of the f16 prefill's time).
      const i64 es = static_cast<i64>(dtype_size(p.dtype));
      for (i64 c = 0; c < nc; ++c) {
        if (j0 + c + kPrefetchRows < p.Tk) {
          vanilla::prefetch_bytes(at(p.k, b, j0 + c + kPrefetchRows, kh), p.D * es);
          vanilla::prefetch_bytes(at(p.v, b, j0 + c + kPrefetchRows, kh), p.Dv * es);
        }
        simd::convert_row(at(p.k, b, j0 + c, kh), p.dtype, p.D, s.kpack_f.get() + c * p.D);
        simd::convert_row(at(p.v, b, j0 + c, kh), p.dtype, p.Dv, s.vpack_f.get() + c * p.Dv);
      }
      t.kf = s.kpack_f.get();
      t.vf = s.vpack_f.get();
      t.ldk = p.D;
      t.ldv = p.Dv;
    }
    if (tiled::transposes_v(p)) {
      transpose::transpose_rows(t.vf, t.ldv, nc, p.Dv, s.vt_f.get(), x.bk);
      t.vt_f = s.vt_f.get();
      t.ldvt_f = x.bk;
    }
  } else if constexpr (P == Path::bf16_dot) {
    t.kh = reinterpret_cast<const std::uint16_t*>(at(p.k, b, j0, kh));
    t.ldk = p.k.stride(1);
#if ATTNOPS_TIER_LEVEL >= 3
    bf16::pack_v_pairs(reinterpret_cast<const std::uint16_t*>(at(p.v, b, j0, kh)), p.v.stride(1), nc, p.Dv,
                       s.vpack_h.get());
#endif
    t.vh = s.vpack_h.get();
  } else {
    const tiled::PackedKv& pk = x.packed;
    const i64 head = b * p.Hkv + kh;
    t.kp = pk.k.get() + (head * pk.k_rows + j0) * x.Dp;
    t.ldkp = x.Dp;
    t.vt = pk.vt.get() + head * pk.dv16 * pk.ldvt + j0;
    t.ldvt = pk.ldvt;
  }
  return t;
}

// ---- one task: (batch b, q head h, q block qb) ------------------------------------------------

template <Path P>
void run_task(const tiled::Ctx& x, tiled::Scratch& s, i64 b, i64 h, i64 qb) {
  const AttentionProblem& p = x.p;
  const BlockMap& map = x.map;
  const i64 D = p.D, Dv = p.Dv, Tq = p.Tq, Tk = p.Tk, bk = x.bk, bqp = x.bqp;
  const i64 kh = h / p.group();  // GQA: kv head read in place, never copied
  const i64 i0 = qb * x.bq, nr = std::min(x.bq, Tq - i0);
  const i64 nvec = (nr + 15) / 16, lanes = nvec * 16;
  float *st = s.st.get(), *ot = s.ot.get(), *m = s.m.get(), *l = s.l.get(), *alpha = s.alpha.get();
  constexpr i64 kAlign = tiled::key_align(P);  // key ranges of P^T pairs start and end at multiples of this

  // Q^T [D][bqp] pre-scaled (f32 path) or Q^T pairs [Dp/2][bqp][2] bf16, unscaled (bf16 paths:
  // the scale is applied to the fp32 scores). Padding lanes are 0: finite scores, never used.
  if constexpr (P == Path::f32) {
    float* qt = s.qt.get();
    const float scale = static_cast<float>(p.scale);
    // kQRows rows at a time, converted and scaled into s.row, then transposed in 8 x 8 blocks
    // (element by element, the stores would land 4 * bqp bytes apart). Padding lanes (>= nr) are 0.
    float* rows = s.row.get();
    for (i64 r0 = 0; r0 < lanes; r0 += tiled::kQRows) {
      const i64 n = std::min(tiled::kQRows, lanes - r0);
      for (i64 r = 0; r < n; ++r) {
        if (r0 + r < nr)
          simd::convert_row(at(p.q, b, i0 + r0 + r, h), p.dtype, D, rows + r * D, scale);
        else
          std::fill(rows + r * D, rows + (r + 1) * D, 0.f);
      }
      transpose::transpose_rows(rows, D, n, D, qt + r0, bqp);
    }
  } else {
#if ATTNOPS_TIER_LEVEL >= 3
    bf16::pack_q_pairs(p, b, h, i0, nr, lanes, bqp, x.Dp, s.qp.get());
#endif
  }
  for (i64 e = 0; e < x.ot_rows; ++e) std::fill(ot + e * bqp, ot + e * bqp + lanes, 0.f);
  std::fill(m, m + lanes, kNegInf);
  std::fill(l, l + lanes, 0.f);

  // Segment ids of the block's rows, and their range (a kv tile whose ids lie outside it is
  // invisible to every row and skipped).
  const bool seg = p.has_segments();
  std::int32_t qseg_lo = 0, qseg_hi = 0;
  const std::int32_t* segkv = seg ? p.seg_kv + b * Tk : nullptr;
  if (seg) {
    const std::int32_t* sq = p.seg_q + b * Tq + i0;
    for (i64 r = 0; r < lanes; ++r) s.segq[static_cast<std::size_t>(r)] = sq[std::min(r, nr - 1)];
    qseg_lo = qseg_hi = sq[0];
    for (i64 r = 1; r < nr; ++r) qseg_lo = std::min(qseg_lo, sq[r]), qseg_hi = std::max(qseg_hi, sq[r]);
  }
  const bool cap = p.soft_cap.has_value();
  const float capf = cap ? static_cast<float>(*p.soft_cap) : 1.f;
  const V16 capv = simd::set1(capf), inv_capv = simd::set1(1.f / capf);
  const float scale = static_cast<float>(p.scale);
  const V16 score_scale = simd::set1(P == Path::f32 ? 1.f : scale);
  // The bf16 paths apply the scale inside the exponent's argument (exp(scale * s - m) =
  // 2^(s * scale * log2 e - m * log2 e), one FMA), so a tile with nothing to rewrite (no cap,
  // bias, mask or segments) keeps its raw scores in S^T: softmax pass 1 only finds their max
  // (max(s) * scale = max(s * scale) for scale > 0; otherwise the scores are scaled as stored).
  [[maybe_unused]] const bool raw_ok = P != Path::f32 && scale > 0.f;
  [[maybe_unused]] constexpr float kLog2e = 1.44269504088896341f;

  const std::span<const BlockMap::Block> blocks = map.row(h, qb);
  for (std::size_t bi = 0; bi < blocks.size();) {
    const BlockMap::Block& blk = blocks[bi];
    // Blocks of this step: consecutive full ones on the AMX path, up to x.span keys
    // (tiled_common.h, span_keys); one elsewhere.
    i64 nb = 1;
    if (P == Path::amx && blk.is_full() && !seg)
      while (bi + static_cast<std::size_t>(nb) < blocks.size() && (nb + 1) * bk <= x.span) {
        const BlockMap::Block& next = blocks[bi + static_cast<std::size_t>(nb)];
        if (!next.is_full() || next.kv != blk.kv + nb) break;
        ++nb;
      }
    bi += static_cast<std::size_t>(nb);
    const i64 j0 = static_cast<i64>(blk.kv) * bk, nc = std::min(nb * bk, Tk - j0);
    if (seg) {
      std::int32_t lo = segkv[j0], hi = segkv[j0];
      for (i64 c = 1; c < nc; ++c) lo = std::min(lo, segkv[j0 + c]), hi = std::max(hi, segkv[j0 + c]);
      if (hi < qseg_lo || lo > qseg_hi) continue;
    }
    // The tile's K and V operands in the path's layout.
    // The next step's K and V rows are asked for into L2 while this one is computed: a task reads
    // its kv head's whole K and V (1 MiB at Tk 2048 D128 f32), rows 8 KiB apart (H16) that the
    // hardware prefetchers do not follow, so without this every tile's first touch of a row
    // waited on L3 or DRAM. The AMX path reads K/V packed once per call, contiguously.
    if (P != Path::amx && bi < blocks.size()) {
      const i64 jn = static_cast<i64>(blocks[bi].kv) * bk, nn = std::min(bk, Tk - jn);
      const i64 es = static_cast<i64>(dtype_size(p.dtype));
      for (i64 c = 0; c < nn; ++c) {
        vanilla::prefetch_bytes_l2(at(p.k, b, jn + c, kh), p.D * es);
        vanilla::prefetch_bytes_l2(at(p.v, b, jn + c, kh), p.Dv * es);
      }
    }
    const tiled::TileOperands t = tile_operands<P>(x, s, b, kh, j0, nc);

    // One chunk of up to 64 query rows (kMaxNC vectors) at a time: S^T = K Q^T, online softmax,
    // O^T update. In a partial tile only the key range [c_lo, c_hi) that some row of the chunk
    // sees is visited (a causal diagonal tile costs about 3/4 of a full one), and micro-tiles
    // in it whose bits are all 0 are not computed (the mask overwrites them with -inf unread).
    const bool partial = !blk.is_full();
    // Softmax pass 1 must store its result (the bf16 paths scale the scores there unless raw_ok).
    const bool rewrite = cap || p.bias || partial || seg || (P != Path::f32 && !raw_ok);
    [[maybe_unused]] const bool raw = P != Path::f32 && !rewrite;  // S^T holds unscaled scores
    for (i64 n0 = 0; n0 < nvec; n0 += micro::kMaxNC) {
      const int NC = static_cast<int>(std::min<i64>(micro::kMaxNC, nvec - n0));
      i64 c_lo = 0, c_hi = nc;
      if (partial) {
        // n0 is a multiple of 4, so the chunk's 16 * NC rows are the low bits of word n0 / 4.
        const std::uint64_t rows = NC == 4 ? ~std::uint64_t{0} : (std::uint64_t{1} << (16 * NC)) - 1;
        c_lo = nc, c_hi = 0;
        for (i64 c = 0; c < nc; ++c)
          if (map.partial_col(blk.partial, c)[n0 >> 2] & rows) {
            c_lo = std::min(c_lo, c);
            c_hi = c + 1;
          }
        if (c_lo >= c_hi) continue;  // nothing visible to this chunk: m, l, O^T unchanged
      }

      // S^T rows [c_lo, c_hi) of the chunk's lanes (the AMX path also writes rows around them,
      // up to 16-row boundaries; they are never read).
      if constexpr (P == Path::amx) {
#if ATTNOPS_TIER_LEVEL >= 4
        amx::qk(t, s.qp.get(), bqp, x.Dp, n0, NC, c_lo, c_hi, st);
#endif
      } else {
        for (i64 c0 = c_lo; c0 < c_hi; c0 += micro::kMaxR) {
          const int R = static_cast<int>(std::min<i64>(micro::kMaxR, c_hi - c0));
          if (partial) {
            std::uint64_t any = 0;
            for (int r = 0; r < R; ++r)
              for (int n = 0; n < NC; ++n) any |= bits16(map.partial_col(blk.partial, c0 + r), (n0 + n) * 16);
            if (!any) continue;
          }
          if constexpr (P == Path::f32) {
            micro::kGemm<false>[R - 1][NC - 1](t.kf + c0 * t.ldk, t.ldk, s.qt.get() + n0 * 16, bqp, D,
                                               st + c0 * bqp + n0 * 16, bqp);
          } else {
#if ATTNOPS_TIER_LEVEL >= 3
            bf16::kQk[R - 1][NC - 1](t.kh + c0 * t.ldk, t.ldk, s.qp.get() + n0 * 32, bqp, D,
                                     st + c0 * bqp + n0 * 16, bqp);
#endif
          }
        }
      }

      // Scores -> probabilities, one vector of 16 query rows at a time, online.
      [[maybe_unused]] const i64 c_a = c_lo / kAlign * kAlign,
                                 c_b = std::min(round_up(c_hi, kAlign), round_up(nc, kAlign));
      // Whether some lane's max changed: O^T needs alpha (else every alpha is exactly 1).
      [[maybe_unused]] bool rescale = false;
      for (i64 n = n0; n < n0 + NC; ++n) {
        const i64 l0 = n * 16;
        const Mask16 valid = static_cast<Mask16>(nr - l0 >= 16 ? 0xffffu : (1u << (nr - l0)) - 1u);
        const float* bias_base = p.bias ? p.bias_row(b, h, i0 + l0) + j0 : nullptr;
        V16 mx = simd::set1(kNegInf);
        for (i64 c = c_lo; c < c_hi; ++c) {
          float* sc = st + c * bqp + l0;
          V16 xs = simd::load(sc);
          if (rewrite) {
            if constexpr (P != Path::f32) xs = simd::mul(xs, score_scale);
            if (cap) xs = simd::mul(capv, simd::tanh(simd::mul(xs, inv_capv)));
            if (bias_base)
              xs = simd::add(xs, simd::gather(bias_base + c, static_cast<std::int32_t>(Tk), valid));
            Mask16 vis = 0xffff;
            if (partial) vis &= bits16(map.partial_col(blk.partial, c), l0);
            if (seg) vis &= simd::eq_i32(s.segq.get() + l0, segkv[j0 + c]);
            xs = simd::select(vis, xs, simd::set1(kNegInf));
            simd::store(sc, xs);
          }
          mx = simd::max(mx, xs);
        }
        const V16 m_old = simd::load(m + l0);
        const V16 m_new = simd::max(m_old, raw ? simd::mul(mx, score_scale) : mx);
        // Rows with nothing visible yet keep max -inf; subtract 0 instead so no -inf - -inf.
        const V16 shift = simd::select(simd::eq(m_new, simd::set1(kNegInf)), simd::zero(), m_new);
        const V16 a = simd::exp(simd::sub(m_old, shift));
        V16 sum = simd::zero();
        if constexpr (P == Path::f32) {
          for (i64 c = c_lo; c < c_hi; ++c) {
            float* sc = st + c * bqp + l0;
            const V16 pr = simd::exp(simd::sub(simd::load(sc), shift));
            simd::store(sc, pr);
            sum = simd::add(sum, pr);
          }
        } else {
#if ATTNOPS_TIER_LEVEL >= 3
          // P^T as bf16 pairs (keys 2t, 2t+1) over [c_a, c_b), 0 outside [c_lo, c_hi); the sum
          // adds the unrounded fp32 values. p = 2^(s * k - shift * log2 e), k = scale * log2 e for
          // raw scores, log2 e for scaled ones (simd16_bf16.h, exp2_p).
          std::uint16_t* pp = s.pp.get();
          const V16 k = simd::set1(raw ? scale * kLog2e : kLog2e),
                    off = simd::mul(shift, simd::set1(-kLog2e));
          for (i64 c = c_a; c < c_b; c += 2) {
            V16 p0 = simd::zero(), p1 = simd::zero();
            if (c >= c_lo && c < c_hi) p0 = simd::exp2_p(simd::fma(simd::load(st + c * bqp + l0), k, off));
            if (c + 1 >= c_lo && c + 1 < c_hi)
              p1 = simd::exp2_p(simd::fma(simd::load(st + (c + 1) * bqp + l0), k, off));
            sum = simd::add(sum, simd::add(p0, p1));
            bf16::store_pair(pp + ((c - c_a) / 2 * bqp + l0) * 2, p0, p1);
          }
#endif
        }
        simd::store(m + l0, m_new);
        simd::store(l + l0, simd::add(simd::mul(simd::load(l + l0), a), sum));
        simd::store(alpha + l0, a);
        rescale = rescale || simd::eq(a, simd::set1(1.f)) != 0xffff;
      }

      // O^T = alpha * O^T + V^T P^T over the chunk's keys.
      // p.guard_nonfinite_v: weight-0 lanes are skipped, so a masked key's NaN / inf value
      // cannot reach them through 0 x inf (the bf16 paths are not taken then, tiled_forward).
      if constexpr (P == Path::f32) {
        // From V rows (a[k * ldv + e]) or, on AVX2, V^T rows (a[e * ldvt_f + k]).
        const bool vt = tiled::kVTransposed && t.vt_f;
        const bool guard = p.guard_nonfinite_v;
        const auto& pv = vt ? (guard ? micro::kScaledAccRowsSkipZeros : micro::kScaledAccRows)
                            : (guard ? micro::kScaledAccSkipZeros : micro::kScaledAcc);
        const float* va = vt ? t.vt_f + c_lo : t.vf + c_lo * t.ldv;
        const i64 lda = vt ? t.ldvt_f : t.ldv, e_step = vt ? t.ldvt_f : 1;
        for (i64 e0 = 0; e0 < Dv; e0 += micro::kMaxR) {
          const int R = static_cast<int>(std::min<i64>(micro::kMaxR, Dv - e0));
          pv[R - 1][NC - 1](va + e0 * e_step, lda, st + c_lo * bqp + n0 * 16, bqp, c_hi - c_lo,
                            alpha + n0 * 16, ot + e0 * bqp + n0 * 16, bqp);
        }
      } else if constexpr (P == Path::bf16_dot) {
#if ATTNOPS_TIER_LEVEL >= 3
        for (i64 e0 = 0; e0 < Dv; e0 += micro::kMaxR) {
          const int R = static_cast<int>(std::min<i64>(micro::kMaxR, Dv - e0));
          bf16::kPv[R - 1][NC - 1](t.vh + (c_a / 2 * Dv + e0) * 2, Dv, s.pp.get() + n0 * 32, bqp,
                                   (c_b - c_a) / 2, alpha + n0 * 16, ot + e0 * bqp + n0 * 16, bqp);
        }
#endif
      } else {
#if ATTNOPS_TIER_LEVEL >= 4
        amx::pv(t, s.pp.get(), bqp, x.ot_rows, n0, NC, c_a, c_b, rescale ? alpha : nullptr, ot);
#endif
      }
    }
  }

  // Finalise: out = O / l (with the sink's mass in the denominator; the sink adds no value and,
  // as the oracle defines lse, is not part of lse). A row with nothing visible: 0 and -inf.
  float* lse = x.buffers.lse ? x.buffers.lse->data_as<float>() + (b * p.Hq + h) * Tq + i0 : nullptr;
  for (i64 r = 0; r < nr; ++r) {
    const float mr = m[r], lr = l[r];
    const float factor = policy::row_factor(mr, lr, p.sinks ? p.sinks + h : nullptr);
    const i64 obase = ((b * Tq + i0 + r) * p.Hq + h) * Dv;
    switch (p.dtype) {
      case DType::f32: {
        float* o = x.buffers.out.data_as<float>() + obase;
        for (i64 e = 0; e < Dv; ++e) o[e] = policy::scaled_out(ot[e * bqp + r], factor);
        break;
      }
      case DType::f16: {
        std::uint16_t* o = x.buffers.out.data_as<std::uint16_t>() + obase;
        for (i64 e = 0; e < Dv; ++e) o[e] = float_to_half_bits(policy::scaled_out(ot[e * bqp + r], factor));
        break;
      }
      default: {
        std::uint16_t* o = x.buffers.out.data_as<std::uint16_t>() + obase;
        for (i64 e = 0; e < Dv; ++e) o[e] = float_to_bf16_bits(policy::scaled_out(ot[e * bqp + r], factor));
        break;
      }
    }
    if (lse) lse[r] = policy::row_lse(mr, lr);
  }
}

// Tasks, grouped by kv head (see run_all), heaviest (most kv blocks) first within a group.
struct Task {
  std::int32_t b, h, qb, cost;
};

template <Path P>
void run_all(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers) {
  tiled::Ctx x{p,
               map,
               buffers,
               map.bq,
               map.bk,
               round_up(map.bq, 16),
               tiled::padded_d(P, p.D),
               P == Path::amx ? round_up(p.Dv, 16) : p.Dv,
               tiled::span_keys(P, map.bk),
               {}};
  std::vector<Task> tasks;
  tasks.reserve(static_cast<std::size_t>(p.B * p.Hq * map.nq));
  for (i64 b = 0; b < p.B; ++b)
    for (i64 h = 0; h < p.Hq; ++h)
      for (i64 qb = 0; qb < map.nq; ++qb)
        tasks.push_back({static_cast<std::int32_t>(b), static_cast<std::int32_t>(h),
                         static_cast<std::int32_t>(qb), static_cast<std::int32_t>(map.row(h, qb).size())});
  // The tasks of one kv head (its q heads' q blocks) run one after another, heaviest first: the
  // threads then read the same K and V at about the same time, from L2 / L3 (ordered by cost
  // alone, every next task read another head's K/V: at H16 T4096 D128 f32, 64 MiB of K/V went
  // through memory once per q block). The lightest tasks of the last head end the list.
  const i64 G = p.group();
  std::stable_sort(tasks.begin(), tasks.end(), [G](const Task& a, const Task& c) {
    if (a.b != c.b) return a.b < c.b;
    if (a.h / G != c.h / G) return a.h / G < c.h / G;
    return a.cost > c.cost;
  });

  int nt = worker_threads(p.num_threads);
  nt = static_cast<int>(std::clamp<i64>(static_cast<i64>(tasks.size()), 1, nt));
#if ATTNOPS_TIER_LEVEL >= 4
  if constexpr (P == Path::amx) x.packed = amx::pack_kv(p, nt);  // K and V^T tiles, once per call
#endif
  // Scratch for every thread, allocated before the tasks run (an allocation failure throws
  // here, not inside a pool task, which must not throw).
  std::vector<tiled::Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(nt));
  for (int t = 0; t < nt; ++t) scratch.emplace_back(x, P);

  // Tasks handed out one at a time, largest first, to whichever threads run (work_pool.h): each
  // computes its query block alone, so the result does not depend on which thread took it.
  auto task_body = [&](int slot, i64 i) {
    const Task& task = tasks[static_cast<std::size_t>(i)];
#if ATTNOPS_TIER_LEVEL >= 4
    if constexpr (P == Path::amx) amx::configure_tiles();  // tile state is per thread
#endif
    run_task<P>(x, scratch[static_cast<std::size_t>(slot)], task.b, task.h, task.qb);
#if ATTNOPS_TIER_LEVEL >= 4
    if constexpr (P == Path::amx) amx::release_tiles();
#endif
  };
  pool_for(nt, static_cast<i64>(tasks.size()), task_body);
}

}  // namespace

const char* tiled_forward(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers) {
  // The bf16 paths round P to bf16 pairs: they cannot skip weight-0 keys for the non-finite
  // policy's guarded re-run (operators/forward_glue.h), which takes the f32 path instead.
  [[maybe_unused]] const bool bf16_paths = p.dtype == DType::bf16 && !p.guard_nonfinite_v;
#if ATTNOPS_TIER_LEVEL >= 4
  if (bf16_paths) {
    run_all<Path::amx>(p, map, buffers);
    return "bf16 q.k and p.v on AMX tiles (TDPBF16PS), P rounded to bf16";
  }
#endif
#if ATTNOPS_TIER_LEVEL >= 3
  if (bf16_paths) {
    run_all<Path::bf16_dot>(p, map, buffers);
    return "bf16 q.k and p.v on VDPBF16PS, P rounded to bf16";
  }
#endif
  run_all<Path::f32>(p, map, buffers);
  if (p.dtype == DType::f32) return "f32 micro-kernels";
  return "f32 micro-kernels, f16/bf16 tiles widened to f32";
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
