// Per-tier source (compiled once per ISA tier, see README.md): VanillaAttn::forward_cpu, the
// materialised-scores path. (The decode path is vanilla_decode.cpp; the choice between them and
// the tier are made by cpu_dispatch.cpp.)
//
// Work unit ("task"): one batch b, one kv head hk and a chunk of q rows [i0, i1). The chunk's
// rows of all G = Hq / Hkv q heads of that kv head are stacked into one fp32 matrix
//   Qs [M = G * (i1 - i0), D]      row r = g * (i1 - i0) + (i - i0)  <->  q head hk * G + g, query i
// so the GQA group shares every read of K and V (no copies of K/V per q head). Then, over the kv
// columns [lo, hi) that some row of the chunk can see (n = hi - lo, n16 = n rounded up to 16):
//   S [M, n16] = Qs Kt            Kt [D][256]: a block of 256 keys transposed (and widened)
//   S -> soft cap, bias, mask, segments, softmax with sinks (vanilla_rows.h)  -> P, lse, weights
//   O [M, Dv16] = P Vp            Vp [256][Dv16]: a block of value rows, zero-padded to 16 columns
// Both products run on the register-blocked micro-kernels of micro_kernels.h (the same as the
// tiled kernel's), so every tier gets its own vector width: there is no Eigen in tier objects
// (its GEMM templates would be one link-once copy for all tiers). Padding columns of Kt and rows
// of Vp are zero, so the padded scores and products stay finite and add nothing.
// Tasks run in parallel (OpenMP, dynamic schedule) with per-thread scratch; q chunks are sized so
// that S stays bounded (at most kMaxScoreFloats) and so that small B x Hkv still gives every
// thread work.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/aligned.h"
#include "backends/cpu/micro_kernels.h"
#include "backends/cpu/tier_entry.h"
#include "backends/cpu/vanilla_rows.h"
#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu::ATTNOPS_TIER_NS {
namespace {

using vanilla::i64;

constexpr i64 kMaxScoreFloats = i64{1} << 22;  // 16 MiB of scores per thread at most
constexpr i64 kKeyBlock = 256;                 // keys per packed K^T / V block

i64 round16(i64 x) {
  return (x + 15) / 16 * 16;
}

// Address of element (b, t, h, 0) of a BTHD view, in bytes.
const char* row_ptr(const TensorView& x, i64 b, i64 t, i64 h) {
  const i64 off = b * x.stride(0) + t * x.stride(1) + h * x.stride(2);
  return static_cast<const char*>(x.data()) + off * static_cast<i64>(dtype_size(x.dtype()));
}

struct Plan {
  i64 qc = 1;      // q rows per task
  i64 chunks = 1;  // ceil(Tq / qc)
  i64 tasks = 0;   // B * Hkv * chunks
};

Plan plan_tasks(const AttentionProblem& p, int threads) {
  const i64 G = p.group();
  Plan pl;
  // M = G * qc rows of about 128..256 make GEMMs efficient while causal chunks stay short enough
  // that computing the chunk's whole visible kv range wastes little above the diagonal.
  pl.qc = std::min<i64>(p.Tq, std::max<i64>(16, 128 / G));
  pl.qc = std::max<i64>(1, std::min(pl.qc, kMaxScoreFloats / std::max<i64>(1, G * round16(p.Tk))));
  auto count = [&] {
    pl.chunks = (p.Tq + pl.qc - 1) / pl.qc;
    pl.tasks = p.B * p.Hkv * pl.chunks;
  };
  count();
  while (pl.tasks < 2 * threads && pl.qc > 1) {  // small B x Hkv: split q rows further
    pl.qc = (pl.qc + 1) / 2;
    count();
  }
  return pl;
}

// c [M][N16] (= or +=) a [M][K] b [K][N16]: rows lda / ldb / ldc apart, N16 a multiple of 16.
// Column panels of 64 outside, so one panel of b stays in cache for all rows of a.
void gemm(const float* a, i64 lda, const float* b, i64 ldb, i64 M, i64 N16, i64 K, float* c, i64 ldc,
          bool accumulate) {
  for (i64 v0 = 0; v0 < N16 / 16; v0 += micro::kMaxNC) {
    const int NC = static_cast<int>(std::min<i64>(micro::kMaxNC, N16 / 16 - v0));
    for (i64 r0 = 0; r0 < M; r0 += micro::kMaxR) {
      const int R = static_cast<int>(std::min<i64>(micro::kMaxR, M - r0));
      const float* ar = a + r0 * lda;
      float* cr = c + r0 * ldc + v0 * 16;
      if (accumulate)
        micro::kGemm<true>[R - 1][NC - 1](ar, lda, b + v0 * 16, ldb, K, cr, ldc);
      else
        micro::kGemm<false>[R - 1][NC - 1](ar, lda, b + v0 * 16, ldb, K, cr, ldc);
    }
  }
}

struct Scratch {
  AlignedArray<float> Qs, S, O, Kt, Vp, row;
  std::vector<vanilla::RowMask> rm;
};

}  // namespace

const char* vanilla_general_forward(const AttentionProblem& p, AttentionBuffers& buffers, int threads) {
  const i64 G = p.group(), Tq = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv, Hq = p.Hq, Hkv = p.Hkv;
  const i64 Dv16 = round16(Dv);
  const DType dt = p.dtype;
  const float scale = static_cast<float>(p.scale);
  const Plan pl = plan_tasks(p, threads);
  const i64 Mmax = G * pl.qc;

  char* out = static_cast<char*>(buffers.out.data());
  const i64 out_es = static_cast<i64>(dtype_size(dt));
  float* lse = buffers.lse ? buffers.lse->data_as<float>() : nullptr;
  float* weights = buffers.weights ? buffers.weights->data_as<float>() : nullptr;

  // Per-thread scratch, allocated before the parallel region (an allocation failure throws here).
  std::vector<Scratch> scratch(static_cast<std::size_t>(threads));
  for (Scratch& w : scratch) {
    w.Qs = aligned_array<float>(Mmax * D);
    w.S = aligned_array<float>(Mmax * round16(Tk));
    w.O = aligned_array<float>(Mmax * Dv16);
    w.Kt = aligned_array<float>(D * kKeyBlock);
    w.Vp = aligned_array<float>(kKeyBlock * Dv16);
    w.row = aligned_array<float>(std::max(D, Dv));
    w.rm.resize(static_cast<std::size_t>(Mmax));
  }

#pragma omp parallel num_threads(threads)
  {
    Scratch& w = scratch[static_cast<std::size_t>(omp_get_thread_num())];
    float *Qs = w.Qs.get(), *S = w.S.get(), *O = w.O.get(), *Kt = w.Kt.get(), *Vp = w.Vp.get(),
          *row = w.row.get();
#pragma omp for schedule(dynamic, 1)
    for (i64 t = 0; t < pl.tasks; ++t) {
      const i64 b = t / (Hkv * pl.chunks), hk = (t / pl.chunks) % Hkv, c = t % pl.chunks;
      const i64 i0 = c * pl.qc, nq = std::min(pl.qc, Tq - i0), M = G * nq;
      auto head = [&](i64 r) { return hk * G + r / nq; };
      auto query = [&](i64 r) { return i0 + r % nq; };

      i64 lo = Tk, hi = 0;
      for (i64 r = 0; r < M; ++r) {
        w.rm[r] = vanilla::row_mask(p, head(r), query(r));
        if (w.rm[r].hi > w.rm[r].lo) {
          lo = std::min(lo, w.rm[r].lo);
          hi = std::max(hi, w.rm[r].hi);
        }
      }
      if (hi <= lo) {  // the whole chunk is masked: output stays 0, lse -inf, weights 0
        if (lse)
          for (i64 r = 0; r < M; ++r) lse[(b * Hq + head(r)) * Tq + query(r)] = vanilla::kNegInf;
        continue;
      }
      const i64 n = hi - lo, lds = round16(n);

      for (i64 g = 0; g < G; ++g)
        vanilla::load_rows_f32(row_ptr(p.q, b, i0, hk * G + g), dt, p.q.stride(1), nq, D, Qs + g * nq * D, D,
                               scale);
      // S = Qs K^T, one block of keys at a time.
      for (i64 j = 0; j < n; j += kKeyBlock) {
        const i64 bw = std::min(kKeyBlock, n - j), bw16 = round16(bw);
        for (i64 cc = 0; cc < bw; ++cc) {
          simd::convert_row(row_ptr(p.k, b, lo + j + cc, hk), dt, D, row);
          for (i64 d = 0; d < D; ++d) Kt[d * bw16 + cc] = row[d];
        }
        for (i64 d = 0; d < D; ++d) std::fill(Kt + d * bw16 + bw, Kt + (d + 1) * bw16, 0.f);
        gemm(Qs, D, Kt, bw16, M, bw16, D, S + j, lds, false);
      }

      for (i64 r = 0; r < M; ++r) {
        const i64 hq = head(r), i = query(r);
        float* s = S + r * lds;
        vanilla::finish_logits(p, b, hq, i, w.rm[r], lo, hi, s);
        const float row_lse = vanilla::softmax_row(s, n, p.sinks ? p.sinks + hq : nullptr);
        if (lse) lse[(b * Hq + hq) * Tq + i] = row_lse;
        if (weights)  // columns outside [lo, hi) are invisible: the zero-filled buffer is right
          std::memcpy(weights + ((b * Hq + hq) * Tq + i) * Tk + lo, s, static_cast<std::size_t>(n) * sizeof(float));
      }

      // O = P V, one block of value rows at a time (the scores' padding columns hold 0).
      for (i64 j = 0; j < n; j += kKeyBlock) {
        const i64 bw = std::min(kKeyBlock, n - j), bw16 = round16(bw);
        for (i64 cc = 0; cc < bw16; ++cc) {
          float* vr = Vp + cc * Dv16;
          i64 filled = 0;
          if (cc < bw) {
            simd::convert_row(row_ptr(p.v, b, lo + j + cc, hk), dt, Dv, vr);
            filled = Dv;
          }
          std::fill(vr + filled, vr + Dv16, 0.f);
        }
        gemm(S + j, lds, Vp, Dv16, M, Dv16, bw16, O, Dv16, j > 0);
      }
      for (i64 r = 0; r < M; ++r)
        vanilla::store_row(O + r * Dv16, Dv, dt, out + (((b * Tq + query(r)) * Hq + head(r)) * Dv) * out_es);
    }
  }
  return "materialised scores, micro-kernel GEMMs";
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
