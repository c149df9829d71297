// Per-tier source (compiled once per ISA tier, see README.md; chosen at run time by
// cpu_dispatch.cpp, which validates the call): FlashAttention-2 backward on the CPU, deterministic: Splash
// attention's split into a dq kernel and a dk/dv kernel, each owning what it writes, so no reduction depends
// on the schedule.
//
// Per query row i (after the forward, whose out and lse are the residuals):
//   Delta_i = rowsum(dout_i * out_i)          lz_i = lse_i, or logaddexp(lse_i, sink_h) with sinks
//   P_ij  = exp(s_ij - lz_i)                   (recomputed per tile from the scores s = q.k * scale,
//                                               soft cap, bias; 0 where masked)
//   dP_ij = dout_i . v_j                       dS_ij = P_ij (dP_ij - Delta_i) [* (1 - tanh^2) with a cap]
//   dq_i = scale sum_j dS_ij k_j    dk_j = scale sum_i dS_ij q_i    dv_j = sum_i P_ij dout_i
//   dbias_ij = P_ij (dP_ij - Delta_i)          dsinks_h = -sum_i exp(sink_h - lz_i) Delta_i
// A fully masked row has lse = -inf, hence lz = +inf, P = 0 and Delta = 0: zero gradients.
// Non-finite values (README, Gradients): a masked pair (mask bit 0, other segment, or a logit of
// -inf) contributes nothing: dS and P are selected to 0 there, and rows of q, k, dout holding a
// NaN or inf update only the lanes of their visible pairs (backward_guard.h).
//
// Two kinds of task, run in one loop on the work pool (heaviest first, one at a time):
//  - dq task (b, q head h, q block qb): the forward's layout, lanes over query rows. Q^T, dO^T
//    [D|Dv][bqp]; per kv block of the map's row: S^T = K Q^T and dP^T = V dO^T [bk][bqp], then
//    dS^T, then dQ^T [D][bqp] += K^T-broadcast x dS^T. Each dq row is written by one task.
//  - dk/dv unit (b, kv head, kv block kb): lanes over keys. K^T (pre-scaled), V^T [D|Dv][bkp];
//    for each q head of the GQA group and each q block with a non-empty tile in column kb (in
//    increasing order): S = Q K^T and dP = dO V^T [bq][bkp], P and dS, then dV^T += dO-broadcast x
//    P and dK^T += Q-broadcast x dS. dk, dv rows are written by one unit; the GQA sum is a loop.
//    dbias rows are accumulated here (lanes over keys = contiguous bias columns); when the bias
//    is broadcast over batch or heads, the units sharing its rows form one task, run in order.
// Both layouts make every inner loop a vector loop with D, Dv, bq and bk as trip counts (any head
// dim, no horizontal sums). Partial tiles visit only the rows / keys some bit of the chunk sees
// and skip micro-tiles whose bits are all 0; full tiles evaluate no mask. The dq/dk-dv split
// recomputes S and dP in both kernels (7 products per tile instead of 5): the price of results
// that are identical for any thread count without atomics or O(T^2) partial sums.
//
// Memory beyond inputs and gradients: Delta and lz [B, Hq, Tq] f32, the column index of the map,
// and per-thread scratch of O((bq + bk) x (D + Dv) + bq x bk) floats: nothing of O(T^2).
// The products run on micro_kernels.h, the forward's micro-kernels (S^T = K Q^T is its gemm_micro,
// the gradient updates its accumulating scaled_acc).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnops/backward.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/common/threads.h"
#include "backends/cpu/aligned.h"
#include "backends/cpu/backward_guard.h"
#include "backends/cpu/micro_kernels.h"
#include "backends/cpu/pool_for.h"
#include "backends/cpu/simd16.h"
#include "backends/cpu/tier_entry.h"
#include "backends/cpu/tiled_backward_parts.h"
#if ATTNOPS_TIER_LEVEL >= 4
#include "backends/cpu/tiled_backward_amx.h"
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS {
namespace bwd {

void Backward::dq_task(Scratch& s, i64 b, i64 h, i64 qb) const {
  const i64 D = p.D, Dv = p.Dv, Tq = p.Tq, Tk = p.Tk;
  const i64 kh = h / p.group();
  const i64 i0 = qb * bq, nr = std::min(bq, Tq - i0), nvec = (nr + 15) / 16, lanes = nvec * 16;
  float *qt = s.qt.get(), *ot = s.ot.get(), *dqt = s.dqt.get(), *st = s.st.get(), *dpt = s.dpt.get();
  float *lzq = s.lz.get(), *diq = s.di.get();

  // Q^T (scaled) and dO^T [D|Dv][bqp]; padding lanes: zeros, lz = +inf (P = 0), Delta = 0. The
  // AMX products take Q and dO as bf16 pairs instead (unscaled), and dQ^T has D rounded to 16.
#if ATTNOPS_TIER_LEVEL >= 4
  const auto* pk = static_cast<const bwd_amx::Packed*>(amx);
  const i64 Dp = round_up(D, 32), Dvp = round_up(Dv, 32), dq_rows = pk ? round_up(D, 16) : D;
  if (pk) {
    bwd_amx::pack_pairs(p.q, b, h, i0, nr, lanes, bqp, D, Dp, s.a_qp.get());
    bwd_amx::pack_pairs(bp.dout, b, h, i0, nr, lanes, bqp, Dv, Dvp, s.a_op.get());
  }
#else
  constexpr const void* pk = nullptr;
  const i64 dq_rows = D;
#endif
  const V16 scale_s = simd::set1(pk ? scale : 1.f);  // S from the tiles is unscaled
  const i64 stat = (b * p.Hq + h) * Tq + i0;
  for (i64 r = 0; r < lanes; ++r) {
    const bool real = r < nr;
    lzq[r] = real ? lz[stat + r] : kInf;
    diq[r] = real ? di[stat + r] : 0.f;
    if (pk) continue;
    if (real) simd::convert_row(at(p.q, b, i0 + r, h), p.dtype, D, s.row.get(), scale);
    for (i64 d = 0; d < D; ++d) qt[d * bqp + r] = real ? s.row[static_cast<std::size_t>(d)] : 0.f;
    if (real) simd::convert_row(at(bp.dout, b, i0 + r, h), p.dtype, Dv, s.row.get());
    for (i64 e = 0; e < Dv; ++e) ot[e * bqp + r] = real ? s.row[static_cast<std::size_t>(e)] : 0.f;
  }
  for (i64 d = 0; d < dq_rows; ++d) std::fill(dqt + d * bqp, dqt + d * bqp + lanes, 0.f);

  std::int32_t qseg_lo = 0, qseg_hi = 0;
  const std::int32_t* segkv = seg ? p.seg_kv + b * Tk : nullptr;
  if (seg) {
    const std::int32_t* sq = p.seg_q + b * Tq + i0;
    for (i64 r = 0; r < lanes; ++r) s.segq[static_cast<std::size_t>(r)] = sq[std::min(r, nr - 1)];
    id_range(sq, nr, qseg_lo, qseg_hi);
  }
  const V16 capv = simd::set1(capf), inv_capv = simd::set1(1.f / capf), one = simd::set1(1.f);
  const V16 ninf = simd::set1(-kInf);
  Mask16* vism = s.vism.get();

  for (const BlockMap::Block& blk : map.row(h, qb)) {
    const i64 j0 = static_cast<i64>(blk.kv) * bk, nc = std::min(bk, Tk - j0);
    if (seg) {
      std::int32_t lo, hi;
      id_range(segkv + j0, nc, lo, hi);
      if (hi < qseg_lo || lo > qseg_hi) continue;
    }
    const float *kt = nullptr, *vt = nullptr;
    i64 ldk = 0, ldv = 0;
    if (pk) {
      // the packed K / V rows and K^T (tiled_backward_amx.h)
    } else if (!convert) {
      kt = reinterpret_cast<const float*>(at(p.k, b, j0, kh));
      vt = reinterpret_cast<const float*>(at(p.v, b, j0, kh));
      ldk = p.k.stride(1), ldv = p.v.stride(1);
    } else {
      for (i64 c = 0; c < nc; ++c) {
        simd::convert_row(at(p.k, b, j0 + c, kh), p.dtype, D, s.kpack.get() + c * D);
        simd::convert_row(at(p.v, b, j0 + c, kh), p.dtype, Dv, s.vpack.get() + c * Dv);
      }
      kt = s.kpack.get(), vt = s.vpack.get(), ldk = D, ldv = Dv;
    }

    // Chunks of up to 64 query rows; in a partial tile only the keys [c_lo, c_hi) some row of
    // the chunk sees, and micro-tiles with some visible bit (the rest is masked to 0 unread).
    const bool partial = !blk.is_full();
    for (i64 n0 = 0; n0 < nvec; n0 += kMaxNC) {
      const int NC = static_cast<int>(std::min<i64>(kMaxNC, nvec - n0));
      i64 c_lo = 0, c_hi = nc;
      if (partial) {
        const std::uint64_t rows = NC == 4 ? ~std::uint64_t{0} : (std::uint64_t{1} << (16 * NC)) - 1;
        c_lo = nc, c_hi = 0;
        for (i64 c = 0; c < nc; ++c)
          if (map.partial_col(blk.partial, c)[n0 >> 2] & rows) c_lo = std::min(c_lo, c), c_hi = c + 1;
        if (c_lo >= c_hi) continue;
      }
#if ATTNOPS_TIER_LEVEL >= 4
      if (pk) {  // S^T = K Q^T, dP^T = V dO^T on tiles (whole 16-key tiles around [c_lo, c_hi))
        const i64 head = b * p.Hkv + kh;
        bwd_amx::rows_times_pairs(pk->k_rows_of(head) + j0 * Dp, Dp, s.a_qp.get(), bqp, Dp, n0, NC, c_lo,
                                  c_hi, st);
        bwd_amx::rows_times_pairs(pk->v_rows_of(head) + j0 * Dvp, Dvp, s.a_op.get(), bqp, Dvp, n0, NC, c_lo,
                                  c_hi, dpt);
      }
#endif
      for (i64 c0 = c_lo; !pk && c0 < c_hi; c0 += kMaxR) {
        const int R = static_cast<int>(std::min<i64>(kMaxR, c_hi - c0));
        if (partial) {
          std::uint64_t any = 0;
          for (int r = 0; r < R; ++r)
            for (int v = 0; v < NC; ++v) any |= bits16(map.partial_col(blk.partial, c0 + r), (n0 + v) * 16);
          if (!any) continue;
        }
        dot_tile(R, NC, qt + n0 * 16, bqp, kt + c0 * ldk, ldk, D, st + c0 * bqp + n0 * 16, bqp);
        dot_tile(R, NC, ot + n0 * 16, bqp, vt + c0 * ldv, ldv, Dv, dpt + c0 * bqp + n0 * 16, bqp);
      }

      // dS^T = P^T * (dP^T - Delta) [* (1 - tanh^2)], 0 where masked; overwrites S^T.
      for (i64 n = n0; n < n0 + NC; ++n) {
        const i64 l0 = n * 16;
        const Mask16 valid = low_bits(nr - l0);
        const float* bias_base = p.bias ? p.bias_row(b, h, i0 + l0) + j0 : nullptr;
        const V16 lzv = simd::load(lzq + l0), dv = simd::load(diq + l0);
        // Rows with lz = +inf (fully masked, or a +inf sink's) contribute nothing, even where
        // their dout is NaN or inf (P = 0 x NaN would be NaN).
        const Mask16 live = valid & static_cast<Mask16>(~simd::eq(lzv, simd::set1(kInf)));
        for (i64 c = c_lo; c < c_hi; ++c) {
          float* sc = st + c * bqp + l0;
          V16 x = simd::mul(simd::load(sc), scale_s), t = simd::zero();
          if (cap) {
            t = simd::tanh(simd::mul(x, inv_capv));
            x = simd::mul(capv, t);
          }
          if (bias_base) x = simd::add(x, simd::gather(bias_base + c, static_cast<std::int32_t>(Tk), valid));
          Mask16 vis = live & static_cast<Mask16>(~simd::eq(x, ninf));  // a -inf logit masks
          if (partial) vis &= bits16(map.partial_col(blk.partial, c), l0);
          if (seg) vis &= simd::eq_i32(s.segq.get() + l0, segkv[j0 + c]);
          if (kbad) vism[c * kMaxNC + (n - n0)] = vis;
          const V16 pr = simd::exp(simd::sub(x, lzv));
          V16 ds = simd::mul(pr, simd::sub(simd::load(dpt + c * bqp + l0), dv));
          if (cap) ds = simd::mul(ds, simd::sub(one, simd::mul(t, t)));
          simd::store(sc, simd::select(vis, ds, simd::zero()));
        }
      }

      // dQ^T[d] += sum_c K[c][d] * dS^T[c] over the chunk's keys (a key holding NaN / inf only
      // in the lanes of the rows that see it).
#if ATTNOPS_TIER_LEVEL >= 4
      if (pk) {  // dS^T as bf16 pairs of keys over [c_a, c_b), 32-key tile rows of K^T
        const i64 c_a = c_lo / 32 * 32, c_b = std::min(round_up(c_hi, 32), round_up(nc, 32));
        bwd_amx::store_row_pairs(st, bqp, n0, NC, c_a, c_b, c_lo, c_hi, s.a_dsp.get());
        bwd_amx::cols_times_pairs(pk->kt_of(b * p.Hkv + kh) + j0, pk->k_rows, s.a_dsp.get(), bqp, dq_rows, n0,
                                  NC, c_a, c_b, dqt);
        continue;
      }
#endif
      if (kbad)
        guard::acc_panel_guarded(kt + c_lo * ldk, ldk, st + c_lo * bqp + n0 * 16, bqp, c_hi - c_lo,
                                 dqt + n0 * 16, bqp, D, NC, kbad + ((b * Tk + j0 + c_lo) * p.Hkv + kh), p.Hkv,
                                 vism + c_lo * kMaxNC);
      else
        acc_panel(kt + c_lo * ldk, ldk, st + c_lo * bqp + n0 * 16, bqp, c_hi - c_lo, dqt + n0 * 16, bqp, D,
                  NC);
    }
  }

  for (i64 r = 0; r < nr; ++r) {
    for (i64 d = 0; d < D; ++d) s.row[static_cast<std::size_t>(d)] = dqt[d * bqp + r];
    store_row(g.dq, ((b * Tq + i0 + r) * p.Hq + h) * D, s.row.get(), D, scale);
  }
}

}  // namespace bwd

namespace {

using namespace bwd;

// Delta and lz per row (parallel over (b, h): each row by one thread), then dsinks (per head, in
// row order, in double).
void row_statistics(const BackwardProblem& bp, std::vector<Scratch>& scratch, int nt, float* lz, float* di,
                    GradientBuffers& g) {
  const AttentionProblem& p = bp.fwd;
  const i64 Tq = p.Tq, Hq = p.Hq, Dv = p.Dv, n = p.B * Hq;
  auto rows_of = [&](int slot, i64 bh) {
    Scratch& s = scratch[static_cast<std::size_t>(slot)];
    const i64 b = bh / Hq, h = bh % Hq;
    for (i64 i = 0; i < Tq; ++i) {
      const i64 r = bh * Tq + i;
      const float lse = bp.lse[r];
      // A fully masked row, and a row whose +inf sink takes all the mass (its output is 0 whatever
      // q, k and v are): P = 0 everywhere, zero gradients, nothing to dsinks.
      if (lse == -kInf || (p.sinks && p.sinks[h] == kInf)) {
        lz[r] = kInf, di[r] = 0.f;
        continue;
      }
      simd::convert_row(at(bp.dout, b, i, h), p.dtype, Dv, s.row.get());
      simd::convert_row(at(bp.out, b, i, h), p.dtype, Dv, s.row2.get());
      float acc = 0.f;
      for (i64 e = 0; e < Dv; ++e)
        acc += s.row[static_cast<std::size_t>(e)] * s.row2[static_cast<std::size_t>(e)];
      di[r] = acc;
      if (p.sinks) {
        const float a = p.sinks[h], m = std::max(lse, a);
        lz[r] = m + std::log(std::exp(lse - m) + std::exp(a - m));
      } else {
        lz[r] = lse;
      }
    }
  };
  pool_for(nt, n, rows_of);
  if (!g.dsinks) return;
  float* ds = g.dsinks->data_as<float>();
  for (i64 h = 0; h < Hq; ++h) {
    double acc = 0;
    for (i64 b = 0; b < p.B; ++b)
      for (i64 i = 0; i < Tq; ++i) {
        const i64 r = (b * Hq + h) * Tq + i;
        if (lz[r] != kInf) acc += std::exp(static_cast<double>(p.sinks[h]) - lz[r]) * di[r];
      }
    ds[h] = static_cast<float>(-acc);
  }
}

}  // namespace

const char* tiled_backward(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads) {
  const AttentionProblem& p = bp.fwd;
  static constexpr const char* kDetail = "f32 micro-kernels (dq pass + dk/dv pass)";
  [[maybe_unused]] static constexpr const char* kAmxDetail =
      "bf16 products on AMX tiles (TDPBF16PS; dq pass + dk/dv pass), P and dS rounded to bf16";
  if (p.B == 0 || p.Tq == 0 || p.Tk == 0)
    return kDetail;  // nothing visible: the zero-filled buffers are the answer
  const i64 bq = map.bq, bk = map.bk, bqp = round_up(bq, 16), bkp = round_up(bk, 16);

  // Column index of the map: for each (head copy, kv block), its non-empty tiles by q block.
  // (Aligned arrays, not std::vector<i64>: link-once instances of std templates over plain types
  // would be shared with other objects, aligned.h.)
  const i64 ncols = map.heads * map.nk;
  const Buf<i64> col_start = aligned_array<i64>(ncols + 1);
  std::fill(col_start.get(), col_start.get() + ncols + 1, i64{0});
  std::vector<ColBlock> col(static_cast<std::size_t>(map.num_blocks()));
  for (i64 hh = 0; hh < map.heads; ++hh)
    for (i64 qb = 0; qb < map.nq; ++qb)
      for (const BlockMap::Block& blk : map.row(hh, qb)) ++col_start[hh * map.nk + blk.kv + 1];
  for (i64 i = 1; i <= ncols; ++i) col_start[i] += col_start[i - 1];
  {
    const Buf<i64> fill = aligned_array<i64>(ncols);
    std::copy(col_start.get(), col_start.get() + ncols, fill.get());
    for (i64 hh = 0; hh < map.heads; ++hh)
      for (i64 qb = 0; qb < map.nq; ++qb)
        for (const BlockMap::Block& blk : map.row(hh, qb))
          col[static_cast<std::size_t>(fill[hh * map.nk + blk.kv]++)] = {static_cast<std::int32_t>(qb),
                                                                         blk.partial};
  }
  const auto column_size = [&](i64 h, i64 kb) {
    const i64 cr = map.head_copy(h) * map.nk + kb;
    return col_start[cr + 1] - col_start[cr];
  };

  // Tasks: dq tasks (kind 0) and dk/dv tasks (kind 1, b / kvh = -1: every batch / kv head, in
  // order, because they accumulate into the same rows of a broadcast dbias). Cost in tile
  // products; tasks with nothing visible are dropped (their gradients stay zero).
  struct Task {
    std::int32_t kind, b, h, blk;
    i64 cost;
  };
  std::vector<Task> tasks;
  for (i64 qb = 0; qb < map.nq; ++qb)
    for (i64 b = 0; b < p.B; ++b)
      for (i64 h = 0; h < p.Hq; ++h)
        if (const auto n = static_cast<i64>(map.row(h, qb).size()); n > 0)
          tasks.push_back({0, static_cast<std::int32_t>(b), static_cast<std::int32_t>(h),
                           static_cast<std::int32_t>(qb), 3 * n});
  const bool all_b = p.bias && bp.bias_B == 1 && p.B > 1, all_h = p.bias && bp.bias_H == 1 && p.Hkv > 1;
  for (i64 kb = 0; kb < map.nk; ++kb)
    for (i64 b = 0; b < (all_b ? 1 : p.B); ++b)
      for (i64 kvh = 0; kvh < (all_h ? 1 : p.Hkv); ++kvh) {
        i64 n = 0;
        for (i64 h = 0; h < p.Hq; ++h)
          if (all_h || h / p.group() == kvh) n += column_size(h, kb);
        if (n > 0)
          tasks.push_back({1, all_b ? -1 : static_cast<std::int32_t>(b),
                           all_h ? -1 : static_cast<std::int32_t>(kvh), static_cast<std::int32_t>(kb),
                           4 * n * (all_b ? p.B : 1)});
      }
  // dk/dv tasks, then dq tasks, each kind grouped by kv head, heaviest first within a head: the
  // threads read the same Q / dout (dk/dv) or K / V (dq) at about the same time, from L2 / L3, as
  // in the forward (2-core Zen 5, f32 B1 H16 T2048 D128: -5% causal, -10% non-causal against cost
  // order alone). dk/dv tasks spanning every batch or kv head (a broadcast dbias) come first.
  const auto group_of = [&](const Task& t) -> i64 {
    if (t.b < 0 || t.h < 0) return -1;
    return static_cast<i64>(t.b) * p.Hkv + (t.kind == 0 ? t.h / p.group() : t.h);
  };
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& x, const Task& y) {
    if (x.kind != y.kind) return x.kind > y.kind;
    const i64 gx = group_of(x), gy = group_of(y);
    return gx != gy ? gx < gy : x.cost > y.cost;
  });

  int nt = worker_threads(p.num_threads);
  nt = static_cast<int>(std::clamp<i64>(std::max<i64>(static_cast<i64>(tasks.size()), p.B * p.Hq), 1, nt));
  std::vector<Scratch> scratch;  // allocated before the parallel regions: a failure throws here
  scratch.reserve(static_cast<std::size_t>(nt));
  for (int t = 0; t < nt; ++t) scratch.emplace_back(bq, bk, bqp, bkp, p.D, p.Dv, p.dtype != DType::f32);

  const i64 nrows = p.B * p.Hq * p.Tq;
  const Buf<float> lz = aligned_array<float>(nrows), di = aligned_array<float>(nrows);
  row_statistics(bp, scratch, nt, lz.get(), di.get(), grads);

  // Rows of q, dout and k holding NaN / inf (the guarded products; none for finite inputs).
  const Buf<std::uint8_t> qbad = aligned_array<std::uint8_t>(p.B * p.Tq * p.Hq),
                          obad = aligned_array<std::uint8_t>(p.B * p.Tq * p.Hq),
                          kbad = aligned_array<std::uint8_t>(p.B * p.Tk * p.Hkv);
  const auto row_buffer = [&](int thread) { return scratch[static_cast<std::size_t>(thread)].row.get(); };
  const bool any_q = guard::flag_nonfinite_rows(p.q, p.dtype, p.D, nt, row_buffer, qbad.get());
  const bool any_o = guard::flag_nonfinite_rows(bp.dout, p.dtype, p.Dv, nt, row_buffer, obad.get());
  const bool any_k = guard::flag_nonfinite_rows(p.k, p.dtype, p.D, nt, row_buffer, kbad.get());

  // bf16 on the amx tier: the products on tiles (tiled_backward_amx.h), unless some row holds
  // NaN / inf (those take the guarded fp32 products).
  [[maybe_unused]] const bool tiles =
      ATTNOPS_TIER_LEVEL >= 4 && p.dtype == DType::bf16 && !any_q && !any_o && !any_k;
#if ATTNOPS_TIER_LEVEL >= 4
  bwd_amx::Packed packed;
  if (tiles) {
    packed = bwd_amx::pack_call(bp, nt);
    scratch.clear();
    for (int t = 0; t < nt; ++t) scratch.emplace_back(bq, bk, bqp, bkp, p.D, p.Dv, false, true);
  }
#endif

  const bool cap = p.soft_cap.has_value();
  const Backward k{bp,
                   p,
                   map,
                   grads,
                   lz.get(),
                   di.get(),
                   any_q ? qbad.get() : nullptr,
                   any_o ? obad.get() : nullptr,
                   any_k ? kbad.get() : nullptr,
                   col_start.get(),
                   col.data(),
                   bq,
                   bk,
                   bqp,
                   bkp,
                   static_cast<float>(p.scale),
                   cap ? static_cast<float>(*p.soft_cap) : 1.f,
                   cap,
                   p.dtype != DType::f32,
                   p.has_segments()};
#if ATTNOPS_TIER_LEVEL >= 4
  Backward kt = k;
  if (tiles) kt.amx = &packed;
  const Backward& kx = kt;
#else
  const Backward& kx = k;
#endif
  const auto ntasks = static_cast<i64>(tasks.size());
  auto run_task = [&](int slot, i64 t) {
    Scratch& s = scratch[static_cast<std::size_t>(slot)];
    const Task& task = tasks[static_cast<std::size_t>(t)];
#if ATTNOPS_TIER_LEVEL >= 4
    if (tiles) amx::configure_tiles();  // tile state is per thread
#endif
    if (task.kind == 0) {
      kx.dq_task(s, task.b, task.h, task.blk);
    } else {
      const i64 b0 = task.b < 0 ? 0 : task.b, b1 = task.b < 0 ? p.B : task.b + 1;
      const i64 h0 = task.h < 0 ? 0 : task.h, h1 = task.h < 0 ? p.Hkv : task.h + 1;
      for (i64 b = b0; b < b1; ++b)
        for (i64 kvh = h0; kvh < h1; ++kvh) kx.dkv_unit(s, b, kvh, task.blk);
    }
#if ATTNOPS_TIER_LEVEL >= 4
    if (tiles) amx::release_tiles();
#endif
  };
  pool_for(nt, ntasks, run_task);
  return tiles ? kAmxDetail : kDetail;
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
