// FlashAttention-2 order in portable scalar C++: for each (batch, q head, q block), walk the
// block map's non-empty kv blocks in order, keep a running max m and running sum l per query
// row in fp32, rescale the fp32 output accumulator when the max grows, and divide once at the
// end. No intrinsics and no threads: this is the readable statement of what the fast CPU kernel
// (backends/cpu/tiled_cpu.cpp) does, and a second oracle for it.
//
// Layouts (BTHD, see tensor.h): q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv],
// out [B, Tq, Hq, Dv] in p.dtype, lse [B, Hq, Tq] f32. Views may have any outer strides.
#include "backends/native/tiled_native.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attnops/error.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/common/softmax_policy.h"

namespace attnops::native {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Element (b, t, h, d) of a BTHD view as float.
inline float load(const TensorView& t, std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) {
  const std::int64_t off = b * t.stride(0) + i * t.stride(1) + h * t.stride(2) + d;
  switch (t.dtype()) {
    case DType::f32:
      return t.data_as<float>()[off];
    case DType::f16:
      return half_bits_to_float(t.data_as<std::uint16_t>()[off]);
    case DType::bf16:
      return bf16_bits_to_float(t.data_as<std::uint16_t>()[off]);
    default:
      break;
  }
  throw Error(
      ErrorCode::unsupported_dtype,
      "tiled_attention: q/k/v dtype " + std::string(dtype_name(t.dtype())) + ", expected f32, f16 or bf16");
}

void check_map(const AttentionProblem& p, const BlockMap& map) {
  if (map.Tq != p.Tq || map.Tk != p.Tk || (map.heads != 1 && map.heads != p.Hq))
    throw Error(ErrorCode::shape_mismatch,
                "tiled_attention: block map built for Tq=" + std::to_string(map.Tq) +
                    " Tk=" + std::to_string(map.Tk) + " heads=" + std::to_string(map.heads) +
                    ", expected Tq=" + std::to_string(p.Tq) + " Tk=" + std::to_string(p.Tk) + " heads=1 or " +
                    std::to_string(p.Hq));
}

}  // namespace

void tiled_attention(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers) {
  check_map(p, map);
  const std::int64_t D = p.D, Dv = p.Dv, bq = map.bq, bk = map.bk, G = p.group();
  const float scale = static_cast<float>(p.scale);
  const float cap = p.soft_cap ? static_cast<float>(*p.soft_cap) : 0.f;
  float* lse = buffers.lse ? buffers.lse->data_as<float>() : nullptr;

  // Scratch for one q block: its queries (fp32), scores of one tile, the output accumulator
  // and the per-row softmax statistics.
  std::vector<float> qf(static_cast<std::size_t>(bq * D)), kf(static_cast<std::size_t>(bk * D)),
      vf(static_cast<std::size_t>(bk * Dv)), s(static_cast<std::size_t>(bq * bk)),
      acc(static_cast<std::size_t>(bq * Dv));
  std::vector<float> m(static_cast<std::size_t>(bq)), l(static_cast<std::size_t>(bq));

  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      const std::int64_t kh = h / G;  // GQA: read kv head h / group in place, never copied per q head
      for (std::int64_t qb = 0; qb < map.nq; ++qb) {
        const std::int64_t i0 = qb * bq, nr = std::min(bq, p.Tq - i0);
        for (std::int64_t r = 0; r < nr; ++r)
          for (std::int64_t d = 0; d < D; ++d)
            qf[static_cast<std::size_t>(r * D + d)] = load(p.q, b, i0 + r, h, d);
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.f);
        std::fill(acc.begin(), acc.end(), 0.f);

        for (const BlockMap::Block& blk : map.row(h, qb)) {
          const std::int64_t j0 = static_cast<std::int64_t>(blk.kv) * bk, nc = std::min(bk, p.Tk - j0);
          for (std::int64_t c = 0; c < nc; ++c) {
            for (std::int64_t d = 0; d < D; ++d)
              kf[static_cast<std::size_t>(c * D + d)] = load(p.k, b, j0 + c, kh, d);
            for (std::int64_t d = 0; d < Dv; ++d)
              vf[static_cast<std::size_t>(c * Dv + d)] = load(p.v, b, j0 + c, kh, d);
          }
          for (std::int64_t r = 0; r < nr; ++r) {
            const std::int64_t i = i0 + r;
            float* srow = &s[static_cast<std::size_t>(r * bk)];
            const float* brow = p.bias ? p.bias_row(b, h, i) + j0 : nullptr;
            // Scores of the tile row: scale, soft cap, bias, then the mask (-inf = not visible).
            float tile_max = kNegInf;
            for (std::int64_t c = 0; c < nc; ++c) {
              bool vis = blk.is_full() || map.partial_visible(blk.partial, r, c);
              if (vis && p.seg_q) vis = p.seg_q[b * p.Tq + i] == p.seg_kv[b * p.Tk + j0 + c];
              if (!vis) {
                srow[c] = kNegInf;
                continue;
              }
              float dot = 0.f;
              for (std::int64_t d = 0; d < D; ++d)
                dot += qf[static_cast<std::size_t>(r * D + d)] * kf[static_cast<std::size_t>(c * D + d)];
              float x = scale * dot;
              if (p.soft_cap) x = cap * std::tanh(x / cap);
              if (brow) x += brow[c];
              srow[c] = x;  // -inf (a -inf bias) acts as a mask: weight 0 below
              tile_max = policy::nan_max(tile_max, x);
            }
            if (tile_max == kNegInf) continue;  // nothing visible in this tile row: no update
            // Online softmax: raise the running max, rescale what was accumulated so far. A NaN
            // max (a NaN logit) makes alpha, l and acc NaN for good: the row ends NaN.
            const float m_new = policy::nan_max(m[static_cast<std::size_t>(r)], tile_max);
            const float alpha = m[static_cast<std::size_t>(r)] == kNegInf
                                    ? 0.f  // first visible tile; exp(-inf - NaN) would be NaN
                                    : std::exp(m[static_cast<std::size_t>(r)] - m_new);
            m[static_cast<std::size_t>(r)] = m_new;
            float* arow = &acc[static_cast<std::size_t>(r * Dv)];
            for (std::int64_t d = 0; d < Dv; ++d) arow[d] *= alpha;
            float sum = 0.f;
            for (std::int64_t c = 0; c < nc; ++c) {
              if (srow[c] == kNegInf) continue;
              const float pr = std::exp(srow[c] - m_new);
              sum += pr;
              if (pr == 0.f) continue;  // weight 0 adds nothing, even a NaN / inf value
              for (std::int64_t d = 0; d < Dv; ++d) arow[d] += pr * vf[static_cast<std::size_t>(c * Dv + d)];
            }
            l[static_cast<std::size_t>(r)] = l[static_cast<std::size_t>(r)] * alpha + sum;
          }
        }

        // Finalise: one division per row. The sink takes probability mass (it joins the
        // denominator) but adds no value and, as the oracle defines it, is not part of lse.
        for (std::int64_t r = 0; r < nr; ++r) {
          const std::int64_t i = i0 + r;
          const float mr = m[static_cast<std::size_t>(r)], lr = l[static_cast<std::size_t>(r)];
          const bool empty = lr == 0.f;  // fully masked row: out 0, lse -inf
          const float factor = policy::row_factor(mr, lr, p.sinks ? p.sinks + h : nullptr);
          const std::int64_t obase = ((b * p.Tq + i) * p.Hq + h) * Dv;
          for (std::int64_t d = 0; d < Dv; ++d) {
            const float o =
                empty ? 0.f : policy::scaled_out(acc[static_cast<std::size_t>(r * Dv + d)], factor);
            store_from_float(buffers.out.data(), p.dtype, static_cast<std::size_t>(obase + d), o);
          }
          if (lse) lse[(b * p.Hq + h) * p.Tq + i] = policy::row_lse(mr, lr);
        }
      }
    }
  }
}

}  // namespace attnops::native
