// Per-tier source (compiled once per ISA tier, like tiled_backward.cpp, whose header comment
// describes the algorithm): the CPU backward's dk/dv unit (b, kv head, kv block kb), lanes over
// keys. K^T (pre-scaled) and V^T [D|Dv][bkp]; for each q head of the GQA group and each q block
// with a non-empty tile in column kb, in increasing order: S = Q K^T and dP = dO V^T [bq][bkp],
// P and dS, then dV^T += dO-broadcast x P and dK^T += Q-broadcast x dS (and the dbias rows). The
// unit writes its dk, dv rows alone, so no reduction depends on the schedule.
#include <algorithm>
#include <cmath>
#include <limits>

#include "attnops/backward.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/backward_guard.h"
#include "backends/cpu/micro_kernels.h"
#include "backends/cpu/simd16.h"
#include "backends/cpu/tiled_backward_parts.h"
#if ATTNOPS_TIER_LEVEL >= 4
#include "backends/cpu/tiled_backward_amx.h"
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS::bwd {

void Backward::dkv_unit(Scratch& s, i64 b, i64 kvh, i64 kb) const {
  const i64 D = p.D, Dv = p.Dv, Tq = p.Tq, Tk = p.Tk, G = p.group();
  const i64 j0 = kb * bk, nc = std::min(bk, Tk - j0), kvec = (nc + 15) / 16, klanes = kvec * 16;
  const Mask16 last = low_bits(nc - 16 * (kvec - 1));  // valid keys of the last vector
  float *kt = s.kt.get(), *vt = s.vt.get(), *dkt = s.dkt.get(), *dvt = s.dvt.get(), *sp = s.s.get(),
        *dp = s.dp.get();

  // K^T (scaled) and V^T [D|Dv][bkp]; padding keys are zeros (and masked below). The AMX
  // products take K and V as bf16 pairs over the key lanes (unscaled) instead; dK^T and dV^T then
  // have their dims rounded to 16.
#if ATTNOPS_TIER_LEVEL >= 4
  const auto* pk = static_cast<const bwd_amx::Packed*>(amx);
  const bool tiles = pk != nullptr;
  const i64 Dp = round_up(D, 32), Dvp = round_up(Dv, 32);
  const i64 dk_rows = tiles ? round_up(D, 16) : D, dv_rows = tiles ? round_up(Dv, 16) : Dv;
  if (tiles) {
    bwd_amx::pack_pairs(p.k, b, kvh, j0, nc, klanes, bkp, D, Dp, s.a_kp.get());
    bwd_amx::pack_pairs(p.v, b, kvh, j0, nc, klanes, bkp, Dv, Dvp, s.a_vp.get());
  }
#else
  constexpr bool tiles = false;
  const i64 dk_rows = D, dv_rows = Dv;
#endif
  const V16 scale_s = simd::set1(tiles ? scale : 1.f);  // S from the tiles is unscaled
  for (i64 c = 0; !tiles && c < klanes; ++c) {
    const bool real = c < nc;
    if (real) simd::convert_row(at(p.k, b, j0 + c, kvh), p.dtype, D, s.row.get(), scale);
    for (i64 d = 0; d < D; ++d) kt[d * bkp + c] = real ? s.row[static_cast<std::size_t>(d)] : 0.f;
    if (real) simd::convert_row(at(p.v, b, j0 + c, kvh), p.dtype, Dv, s.row.get());
    for (i64 e = 0; e < Dv; ++e) vt[e * bkp + c] = real ? s.row[static_cast<std::size_t>(e)] : 0.f;
  }
  for (i64 d = 0; d < dk_rows; ++d) std::fill(dkt + d * bkp, dkt + d * bkp + klanes, 0.f);
  for (i64 e = 0; e < dv_rows; ++e) std::fill(dvt + e * bkp, dvt + e * bkp + klanes, 0.f);

  std::int32_t kseg_lo = 0, kseg_hi = 0;
  if (seg) {
    const std::int32_t* sk = p.seg_kv + b * Tk + j0;
    for (i64 c = 0; c < klanes; ++c) s.segk[static_cast<std::size_t>(c)] = sk[std::min(c, nc - 1)];
    id_range(sk, nc, kseg_lo, kseg_hi);
  }
  const V16 capv = simd::set1(capf), inv_capv = simd::set1(1.f / capf), one = simd::set1(1.f);
  const V16 ninf = simd::set1(-kInf);
  float* dbias = g.dbias ? g.dbias->data_as<float>() : nullptr;
  Mask16* vism = s.vism.get();

  for (i64 gi = 0; gi < G; ++gi) {
    const i64 h = kvh * G + gi, hh = map.head_copy(h);
    const i64 cr = hh * map.nk + kb;
    for (i64 t = col_start[cr]; t < col_start[cr + 1]; ++t) {
      const ColBlock cb = col[t];
      const i64 i0 = static_cast<i64>(cb.qb) * bq, nr = std::min(bq, Tq - i0);
      const bool partial = cb.partial >= 0;
      if (seg) {
        const std::int32_t* sq = p.seg_q + b * Tq + i0;
        std::int32_t lo, hi;
        id_range(sq, nr, lo, hi);
        if (hi < kseg_lo || lo > kseg_hi) continue;
      }
      const float *qr = nullptr, *orow = nullptr;
      i64 ldq = 0, ldo = 0;
      if (tiles) {
        // the tile's Q and dO rows and their transposes are packed once per call
      } else if (!convert) {
        qr = reinterpret_cast<const float*>(at(p.q, b, i0, h));
        orow = reinterpret_cast<const float*>(at(bp.dout, b, i0, h));
        ldq = p.q.stride(1), ldo = bp.dout.stride(1);
      } else {
        for (i64 r = 0; r < nr; ++r) {
          simd::convert_row(at(p.q, b, i0 + r, h), p.dtype, D, s.qpack.get() + r * D);
          simd::convert_row(at(bp.dout, b, i0 + r, h), p.dtype, Dv, s.opack.get() + r * Dv);
        }
        qr = s.qpack.get(), orow = s.opack.get(), ldq = D, ldo = Dv;
      }
      // This tile's rows in the flags ([B, Tq, Hq]: consecutive rows Hq apart), null if none.
      const std::uint8_t* qb_bad = qbad ? qbad + (b * Tq + i0) * p.Hq + h : nullptr;
      const std::uint8_t* ob_bad = obad ? obad + (b * Tq + i0) * p.Hq + h : nullptr;
      const float* lzr = lz + (b * p.Hq + h) * Tq + i0;
      const float* dir = di + (b * p.Hq + h) * Tq + i0;
      float* dbias_rows = nullptr;  // row i0 of this head's dbias, column j0
      if (dbias) {
        const i64 bb = bp.bias_B == 1 ? 0 : b, hb = bp.bias_H == 1 ? 0 : h;
        dbias_rows = dbias + ((bb * bp.bias_H + hb) * Tq + i0) * Tk + j0;
      }

      // Chunks of up to 64 keys; in a partial tile only the rows [r_lo, r_hi) that see a key of
      // the chunk, and micro-tiles with some visible bit.
      for (i64 n0 = 0; n0 < kvec; n0 += kMaxNC) {
        const int NC = static_cast<int>(std::min<i64>(kMaxNC, kvec - n0));
        const std::uint64_t keys = NC == 4 ? ~std::uint64_t{0} : (std::uint64_t{1} << (16 * NC)) - 1;
        i64 r_lo = 0, r_hi = nr;
        if (partial) {
          r_lo = nr, r_hi = 0;
          for (i64 r = 0; r < nr; ++r)
            if (map.partial_row(cb.partial, r)[n0 >> 2] & keys) r_lo = std::min(r_lo, r), r_hi = r + 1;
          if (r_lo >= r_hi) continue;
        }
#if ATTNOPS_TIER_LEVEL >= 4
        if (tiles) {  // S = Q K^T, dP = dO V^T on tiles (whole 16-row tiles around [r_lo, r_hi))
          const i64 qh = b * p.Hq + h;
          bwd_amx::rows_times_pairs(pk->q_rows_of(qh) + i0 * Dp, Dp, s.a_kp.get(), bkp, Dp, n0, NC, r_lo,
                                    r_hi, sp);
          bwd_amx::rows_times_pairs(pk->o_rows_of(qh) + i0 * Dvp, Dvp, s.a_vp.get(), bkp, Dvp, n0, NC, r_lo,
                                    r_hi, dp);
        }
#endif
        for (i64 r0 = r_lo; !tiles && r0 < r_hi; r0 += kMaxR) {
          const int R = static_cast<int>(std::min<i64>(kMaxR, r_hi - r0));
          if (partial) {
            std::uint64_t any = 0;
            for (int r = 0; r < R; ++r) any |= map.partial_row(cb.partial, r0 + r)[n0 >> 2] & keys;
            if (!any) continue;
          }
          dot_tile(R, NC, kt + n0 * 16, bkp, qr + r0 * ldq, ldq, D, sp + r0 * bkp + n0 * 16, bkp);
          dot_tile(R, NC, vt + n0 * 16, bkp, orow + r0 * ldo, ldo, Dv, dp + r0 * bkp + n0 * 16, bkp);
        }

        // P (into S) and dS (into dP), 0 where masked; dbias += P * (dP - Delta).
        for (i64 r = r_lo; r < r_hi; ++r) {
          const V16 lzv = simd::set1(lzr[r]), dv = simd::set1(dir[r]);
          const float* brow = p.bias ? p.bias_row(b, h, i0 + r) + j0 : nullptr;
          float* dbrow = dbias_rows ? dbias_rows + r * Tk : nullptr;
          const std::int32_t qseg = seg ? p.seg_q[b * Tq + i0 + r] : 0;
          for (i64 n = n0; n < n0 + NC; ++n) {
            const i64 c0 = n * 16;
            const bool edge = n == kvec - 1 && last != 0xffffu;
            // A row with lz = +inf (fully masked, or a +inf sink's) contributes nothing, even
            // where its dout is NaN or inf (P = 0 x NaN would be NaN).
            Mask16 vis = lzr[r] == kInf ? Mask16{0} : n == kvec - 1 ? last : Mask16{0xffffu};
            if (partial) vis &= bits16(map.partial_row(cb.partial, r), c0);
            if (seg) vis &= simd::eq_i32(s.segk.get() + c0, qseg);
            float* sc = sp + r * bkp + c0;
            float* dc = dp + r * bkp + c0;
            V16 x = simd::mul(simd::load(sc), scale_s), t = simd::zero();
            if (cap) {
              t = simd::tanh(simd::mul(x, inv_capv));
              x = simd::mul(capv, t);
            }
            if (brow) x = simd::add(x, edge ? simd::gather(brow + c0, 1, last) : simd::load(brow + c0));
            vis &= static_cast<Mask16>(~simd::eq(x, ninf));  // a -inf logit masks its pair
            if (qb_bad || ob_bad) vism[r * kMaxNC + (n - n0)] = vis;
            const V16 pr = simd::select(vis, simd::exp(simd::sub(x, lzv)), simd::zero());
            const V16 dsb = simd::select(vis, simd::mul(pr, simd::sub(simd::load(dc), dv)), simd::zero());
            if (dbrow) {
              if (!edge) {
                simd::store(dbrow + c0, simd::add(simd::load(dbrow + c0), dsb));
              } else {
                alignas(64) float tmp[16];
                simd::store(tmp, dsb);
                for (i64 l = 0; l < nc - c0; ++l) dbrow[c0 + l] += tmp[l];
              }
            }
            simd::store(sc, pr);
            simd::store(dc, cap ? simd::mul(dsb, simd::sub(one, simd::mul(t, t))) : dsb);
          }
        }

        // dV^T[e] += sum_r dO[r][e] * P[r];  dK^T[d] += sum_r Q[r][d] * dS[r]  (rows [r_lo, r_hi)).
        // A row of dout or q holding NaN / inf adds only in the lanes of the keys it sees.
        const i64 nrows = r_hi - r_lo;
#if ATTNOPS_TIER_LEVEL >= 4
        if (tiles) {  // P and dS as bf16 pairs of rows over [r_a, r_b), 32-row tile rows of dO^T, Q^T
          const i64 r_a = r_lo / 32 * 32, r_b = std::min(round_up(r_hi, 32), round_up(nr, 32));
          bwd_amx::store_row_pairs(sp, bkp, n0, NC, r_a, r_b, r_lo, r_hi, s.a_pp.get());
          bwd_amx::store_row_pairs(dp, bkp, n0, NC, r_a, r_b, r_lo, r_hi, s.a_dsr.get());
          const i64 qh = b * p.Hq + h;
          bwd_amx::cols_times_pairs(pk->ot_of(qh) + i0, pk->q_rows, s.a_pp.get(), bkp, dv_rows, n0, NC, r_a,
                                    r_b, dvt);
          bwd_amx::cols_times_pairs(pk->qt_of(qh) + i0, pk->q_rows, s.a_dsr.get(), bkp, dk_rows, n0, NC, r_a,
                                    r_b, dkt);
          continue;
        }
#endif
        if (ob_bad)
          guard::acc_panel_guarded(orow + r_lo * ldo, ldo, sp + r_lo * bkp + n0 * 16, bkp, nrows,
                                   dvt + n0 * 16, bkp, Dv, NC, ob_bad + r_lo * p.Hq, p.Hq,
                                   vism + r_lo * kMaxNC);
        else
          acc_panel(orow + r_lo * ldo, ldo, sp + r_lo * bkp + n0 * 16, bkp, nrows, dvt + n0 * 16, bkp, Dv,
                    NC);
        if (qb_bad)
          guard::acc_panel_guarded(qr + r_lo * ldq, ldq, dp + r_lo * bkp + n0 * 16, bkp, nrows, dkt + n0 * 16,
                                   bkp, D, NC, qb_bad + r_lo * p.Hq, p.Hq, vism + r_lo * kMaxNC);
        else
          acc_panel(qr + r_lo * ldq, ldq, dp + r_lo * bkp + n0 * 16, bkp, nrows, dkt + n0 * 16, bkp, D, NC);
      }
    }
  }

  // dk = scale * dK (K^T was pre-scaled, so the products above carry scale once, for S only).
  for (i64 c = 0; c < nc; ++c) {
    for (i64 d = 0; d < D; ++d) s.row[static_cast<std::size_t>(d)] = dkt[d * bkp + c];
    store_row(g.dk, ((b * Tk + j0 + c) * p.Hkv + kvh) * D, s.row.get(), D, scale);
    for (i64 e = 0; e < Dv; ++e) s.row[static_cast<std::size_t>(e)] = dvt[e * bkp + c];
    store_row(g.dv, ((b * Tk + j0 + c) * p.Hkv + kvh) * Dv, s.row.get(), Dv, 1.f);
  }
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::bwd
