// VanillaAttn::forward_cpu: the materialised-scores path (Eigen GEMMs + OpenMP) and the dispatch
// to the decode path (vanilla_decode.cpp).
//
// Work unit ("task"): one batch b, one kv head hk and a chunk of q rows [i0, i1). The chunk's
// rows of all G = Hq / Hkv q heads of that kv head are stacked into one fp32 matrix
//   Qs [M = G * (i1 - i0), D]      row r = g * (i1 - i0) + (i - i0)  <->  q head hk * G + g, query i
// so the GQA group shares every read of K and V (no copies of K/V per q head). Then
//   S [M, n] = Qs K[lo:hi]^T       over the kv columns [lo, hi) that some row of the chunk can see
//   S -> soft cap, bias, mask, segments, softmax with sinks (vanilla_rows.h)  -> P, lse, weights
//   O [M, Dv] = P V[lo:hi]
// f32 K/V are read in place through Eigen maps with the view's row stride (a KV-cache slice works
// as is); f16/bf16 K/V are widened to fp32 in blocks of kConvertRows keys. Tasks run in parallel
// (OpenMP, dynamic schedule) with per-thread scratch; q chunks are sized so that S stays bounded
// (at most kMaxScoreFloats) and so that small B x Hkv still gives every thread work.
#include "backends/cpu/vanilla_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics (_mm512_undefined_ps)
// once Eigen's GEMM packing is inlined here; a false positive in system headers, silenced so
// the build stays warning-clean.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>

#include "backends/cpu/vanilla_decode.h"
#include "backends/cpu/vanilla_rows.h"
#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu {
namespace {

using vanilla::i64;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
using StridedMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

constexpr i64 kMaxScoreFloats = i64{1} << 22;  // 16 MiB of scores per thread at most
constexpr i64 kConvertRows = 256;              // f16/bf16 K/V rows widened per block

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
  pl.qc = std::max<i64>(1, std::min(pl.qc, kMaxScoreFloats / std::max<i64>(1, G * p.Tk)));
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

void general_attention(const AttentionProblem& p, AttentionBuffers& buffers, int threads) {
  const i64 G = p.group(), Tq = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv, Hq = p.Hq, Hkv = p.Hkv;
  const DType dt = p.dtype;
  const float scale = static_cast<float>(p.scale);
  const Plan pl = plan_tasks(p, threads);
  const i64 Mmax = G * pl.qc;
  const i64 nmax = std::max<i64>(1, Tk);

  char* out = static_cast<char*>(buffers.out.data());
  const i64 out_es = static_cast<i64>(dtype_size(dt));
  float* lse = buffers.lse ? buffers.lse->data_as<float>() : nullptr;
  float* weights = buffers.weights ? buffers.weights->data_as<float>() : nullptr;

#pragma omp parallel num_threads(threads)
  {
    // Our tasks are the parallelism: keep Eigen's GEMM from opening a nested parallel region
    // (it would when this team has one thread). nthreads-var is per task, so this is local.
    omp_set_num_threads(1);
    std::vector<float> Qs(static_cast<std::size_t>(Mmax * D)), S(static_cast<std::size_t>(Mmax * nmax));
    std::vector<float> O(static_cast<std::size_t>(Mmax * Dv));
    std::vector<float> KVc(dt == DType::f32 ? 0 : static_cast<std::size_t>(kConvertRows * std::max(D, Dv)));
    std::vector<vanilla::RowMask> rm(static_cast<std::size_t>(Mmax));

#pragma omp for schedule(dynamic, 1)
    for (i64 t = 0; t < pl.tasks; ++t) {
      const i64 b = t / (Hkv * pl.chunks), hk = (t / pl.chunks) % Hkv, c = t % pl.chunks;
      const i64 i0 = c * pl.qc, nq = std::min(pl.qc, Tq - i0), M = G * nq;
      auto head = [&](i64 r) { return hk * G + r / nq; };
      auto query = [&](i64 r) { return i0 + r % nq; };

      i64 lo = Tk, hi = 0;
      for (i64 r = 0; r < M; ++r) {
        rm[r] = vanilla::row_mask(p, head(r), query(r));
        if (rm[r].hi > rm[r].lo) {
          lo = std::min(lo, rm[r].lo);
          hi = std::max(hi, rm[r].hi);
        }
      }
      if (hi <= lo) {  // the whole chunk is masked: output stays 0, lse -inf, weights 0
        if (lse)
          for (i64 r = 0; r < M; ++r) lse[(b * Hq + head(r)) * Tq + query(r)] = vanilla::kNegInf;
        continue;
      }
      const i64 n = hi - lo;

      for (i64 g = 0; g < G; ++g)
        vanilla::load_rows_f32(row_ptr(p.q, b, i0, hk * G + g), dt, p.q.stride(1), nq, D,
                               Qs.data() + g * nq * D, D, scale);
      ConstMatMap Q(Qs.data(), M, D);
      MatMap Sm(S.data(), M, n);
      if (dt == DType::f32) {
        StridedMap K(reinterpret_cast<const float*>(row_ptr(p.k, b, lo, hk)), n, D,
                     Eigen::OuterStride<>(p.k.stride(1)));
        Sm.noalias() = Q * K.transpose();
      } else {
        for (i64 j = 0; j < n; j += kConvertRows) {
          const i64 w = std::min(kConvertRows, n - j);
          vanilla::load_rows_f32(row_ptr(p.k, b, lo + j, hk), dt, p.k.stride(1), w, D, KVc.data(), D);
          Sm.middleCols(j, w).noalias() = Q * ConstMatMap(KVc.data(), w, D).transpose();
        }
      }

      for (i64 r = 0; r < M; ++r) {
        const i64 hq = head(r), i = query(r);
        float* s = S.data() + r * n;
        vanilla::finish_logits(p, b, hq, i, rm[r], lo, hi, s);
        const float row_lse = vanilla::softmax_row(s, n, p.sinks ? p.sinks + hq : nullptr);
        if (lse) lse[(b * Hq + hq) * Tq + i] = row_lse;
        if (weights)  // columns outside [lo, hi) are invisible: the zero-filled buffer is right
          std::memcpy(weights + ((b * Hq + hq) * Tq + i) * Tk + lo, s,
                      static_cast<std::size_t>(n) * sizeof(float));
      }

      MatMap Om(O.data(), M, Dv);
      if (dt == DType::f32) {
        StridedMap V(reinterpret_cast<const float*>(row_ptr(p.v, b, lo, hk)), n, Dv,
                     Eigen::OuterStride<>(p.v.stride(1)));
        Om.noalias() = Sm * V;
      } else {
        Om.setZero();
        for (i64 j = 0; j < n; j += kConvertRows) {
          const i64 w = std::min(kConvertRows, n - j);
          vanilla::load_rows_f32(row_ptr(p.v, b, lo + j, hk), dt, p.v.stride(1), w, Dv, KVc.data(), Dv);
          Om.noalias() += Sm.middleCols(j, w) * ConstMatMap(KVc.data(), w, Dv);
        }
      }
      for (i64 r = 0; r < M; ++r)
        vanilla::store_row(O.data() + r * Dv, Dv, dt,
                           out + (((b * Tq + query(r)) * Hq + head(r)) * Dv) * out_es);
    }
  }
}

}  // namespace

void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers) {
  if (p.B == 0 || p.Tq == 0 || p.Hq == 0) return;
  const int threads = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
  if (p.Tk == 0) {  // nothing to attend to: output stays 0, every lse is -inf
    if (buffers.lse) {
      float* l = buffers.lse->data_as<float>();
      std::fill(l, l + buffers.lse->numel(), vanilla::kNegInf);
    }
    return;
  }
  // The decode path cannot return the weights (it never materialises a whole row).
  if (p.Tq <= kDecodeMaxQ && !p.want_weights) {
    vanilla_decode(p, buffers, threads);
  } else {
    general_attention(p, buffers, threads);
  }
}

}  // namespace attnops::cpu
