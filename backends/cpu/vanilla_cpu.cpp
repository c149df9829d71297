// VanillaAttn::forward_cpu: the materialised-scores path (Eigen GEMMs + OpenMP) and the dispatch
// to the decode path (vanilla_decode.cpp).
//
// Work unit ("task"): one batch b, one kv head hk, a slice of gn of its G = Hq / Hkv q heads and
// a chunk of q rows [i0, i1). The chunk's rows of those q heads are stacked into one fp32 matrix
//   Qs [M = gn * (i1 - i0), D]     row r = g * (i1 - i0) + (i - i0)  <->  q head hk * G + g0 + g, query i
// so the GQA group shares every read of K and V (no copies of K/V per q head). Then
//   S [M, n] = Qs K[lo:hi]^T       over the kv columns [lo, hi) that some row of the chunk can see
//   S -> soft cap, bias, mask, segments, softmax with sinks (vanilla_rows.h)  -> P, lse, weights
//   O [M, Dv] = P V[lo:hi]
// f32 K/V are read in place through Eigen maps with the view's row stride (a KV-cache slice works
// as is); f16/bf16 K/V are widened to fp32 in blocks of kConvertRows keys. Tasks run in parallel
// (OpenMP, dynamic schedule) with per-thread scratch allocated before the parallel region (an
// allocation failure is an Error(out_of_memory), never an exception inside OpenMP). The working
// set is bounded: a task's rows are chosen so that M * (Tk + D + Dv) floats stay within
// kMaxWorkingFloats (16 MiB) per thread, down to one row per task when one row is larger than
// that; q chunks, then the GQA group, are split to get there, and further so that small B x Hkv
// still gives every thread work.
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

#include "attnops/error.h"
#include "backends/common/parallel_errors.h"
#include "backends/common/threads.h"
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

constexpr i64 kMaxWorkingFloats = i64{1} << 22;  // 16 MiB of scratch per thread (unless one row is larger)
constexpr i64 kConvertRows = 256;                // f16/bf16 K/V rows widened per block (at most)

// Address of element (b, t, h, 0) of a BTHD view, in bytes.
const char* row_ptr(const TensorView& x, i64 b, i64 t, i64 h) {
  const i64 off = b * x.stride(0) + t * x.stride(1) + h * x.stride(2);
  return static_cast<const char*>(x.data()) + off * static_cast<i64>(dtype_size(x.dtype()));
}

}  // namespace

VanillaPlan vanilla_plan(const AttentionProblem& p, int threads) {
  const i64 G = p.group();
  VanillaPlan pl;
  // M = G * qc rows of about 128..256 make GEMMs efficient while causal chunks stay short enough
  // that computing the chunk's whole visible kv range wastes little above the diagonal.
  pl.qc = std::min<i64>(p.Tq, std::max<i64>(16, 128 / G));
  pl.gc = G;
  // Rows of scores, queries and outputs whose floats fit the working-set cap (at least one).
  const i64 rows_cap = std::max<i64>(1, kMaxWorkingFloats / std::max<i64>(1, p.Tk + p.D + p.Dv));
  if (G * pl.qc > rows_cap) {
    pl.qc = std::max<i64>(1, std::min(pl.qc, rows_cap / G));
    if (G * pl.qc > rows_cap) pl.gc = std::max<i64>(1, rows_cap / pl.qc);  // qc == 1: split the group
  }
  auto count = [&] {
    pl.chunks = (p.Tq + pl.qc - 1) / pl.qc;
    pl.gslices = (G + pl.gc - 1) / pl.gc;
    pl.tasks = p.B * p.Hkv * pl.gslices * pl.chunks;
  };
  count();
  while (pl.tasks < 2 * threads && pl.qc > 1) {  // small B x Hkv: split q rows further
    pl.qc = (pl.qc + 1) / 2;
    count();
  }
  pl.rows = pl.gc * pl.qc;
  pl.convert_rows =
      std::clamp<i64>(kMaxWorkingFloats / std::max<i64>(1, std::max(p.D, p.Dv)), 1, kConvertRows);
  pl.scratch_floats = pl.rows * (p.D + std::max<i64>(1, p.Tk) + p.Dv) +
                      (p.dtype == DType::f32 ? 0 : pl.convert_rows * std::max(p.D, p.Dv));
  return pl;
}

namespace {

// Per-thread scratch of the materialised-scores path, sized by the plan.
struct GeneralScratch {
  std::vector<float> Qs, S, O, KVc;
  std::vector<vanilla::RowMask> rm;
};

// O [M, Dv] = P [M, n] V[lo:hi] with weights of 0 skipped (guard_nonfinite_v: a masked key's
// NaN / inf value must not reach the row through 0 x inf).
template <class T>
void pv_skip_zeros(const float* P, i64 M, i64 n, const TensorView& v, i64 b, i64 lo, i64 hk, float* O) {
  const i64 Dv = v.dim(3);
  std::fill(O, O + M * Dv, 0.f);
  vanilla::pv_block_skip_zeros(P, n, M, reinterpret_cast<const T*>(row_ptr(v, b, lo, hk)), v.stride(1), n, Dv,
                               O, Dv);
}

void general_attention(const AttentionProblem& p, AttentionBuffers& buffers, int threads) {
  const i64 G = p.group(), Tq = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv, Hq = p.Hq, Hkv = p.Hkv;
  const DType dt = p.dtype;
  const float scale = static_cast<float>(p.scale);
  const VanillaPlan pl = vanilla_plan(p, threads);
  const i64 Mmax = pl.rows, nmax = std::max<i64>(1, Tk), conv = pl.convert_rows;
  threads = static_cast<int>(std::clamp<i64>(pl.tasks, 1, threads));

  char* out = static_cast<char*>(buffers.out.data());
  const i64 out_es = static_cast<i64>(dtype_size(dt));
  float* lse = buffers.lse ? buffers.lse->data_as<float>() : nullptr;
  float* weights = buffers.weights ? buffers.weights->data_as<float>() : nullptr;

  std::vector<GeneralScratch> scratch;
  try {
    scratch.resize(static_cast<std::size_t>(threads));
    for (GeneralScratch& w : scratch) {
      w.Qs.resize(static_cast<std::size_t>(Mmax * D));
      w.S.resize(static_cast<std::size_t>(Mmax * nmax));
      w.O.resize(static_cast<std::size_t>(Mmax * Dv));
      w.KVc.resize(dt == DType::f32 ? 0 : static_cast<std::size_t>(conv * std::max(D, Dv)));
      w.rm.resize(static_cast<std::size_t>(Mmax));
    }
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::out_of_memory,
                "vanilla cpu: cannot allocate " + std::to_string(pl.scratch_floats * 4) +
                    " bytes of scratch for each of " + std::to_string(threads) + " threads");
  }
  ParallelErrors errors;

#pragma omp parallel num_threads(threads)
  {
    // Our tasks are the parallelism: keep Eigen's GEMM from opening a nested parallel region
    // (it would when this team has one thread). nthreads-var is per task, so this is local.
    omp_set_num_threads(1);
    GeneralScratch& w = scratch[static_cast<std::size_t>(omp_get_thread_num())];

#pragma omp for schedule(dynamic, 1)
    for (i64 t = 0; t < pl.tasks; ++t) {
      if (errors.any()) continue;
      try {
        const i64 c = t % pl.chunks, gs = (t / pl.chunks) % pl.gslices,
                  hk = (t / (pl.chunks * pl.gslices)) % Hkv, b = t / (pl.chunks * pl.gslices * Hkv);
        const i64 i0 = c * pl.qc, nq = std::min(pl.qc, Tq - i0), g0 = gs * pl.gc,
                  gn = std::min(pl.gc, G - g0);
        const i64 M = gn * nq;
        auto head = [&](i64 r) { return hk * G + g0 + r / nq; };
        auto query = [&](i64 r) { return i0 + r % nq; };

        i64 lo = Tk, hi = 0;
        for (i64 r = 0; r < M; ++r) {
          w.rm[r] = vanilla::row_mask(p, head(r), query(r));
          if (w.rm[r].hi > w.rm[r].lo) {
            lo = std::min(lo, w.rm[r].lo);
            hi = std::max(hi, w.rm[r].hi);
          }
        }
        if (hi <= lo) {  // the whole chunk is masked: output 0 (zero-filled buffer), lse -inf, weights 0
          if (lse)
            for (i64 r = 0; r < M; ++r) lse[(b * Hq + head(r)) * Tq + query(r)] = vanilla::kNegInf;
          continue;
        }
        const i64 n = hi - lo;

        for (i64 g = 0; g < gn; ++g)
          vanilla::load_rows_f32(row_ptr(p.q, b, i0, hk * G + g0 + g), dt, p.q.stride(1), nq, D,
                                 w.Qs.data() + g * nq * D, D, scale);
        ConstMatMap Q(w.Qs.data(), M, D);
        MatMap Sm(w.S.data(), M, n);
        if (dt == DType::f32) {
          StridedMap K(reinterpret_cast<const float*>(row_ptr(p.k, b, lo, hk)), n, D,
                       Eigen::OuterStride<>(p.k.stride(1)));
          Sm.noalias() = Q * K.transpose();
        } else {
          for (i64 j = 0; j < n; j += conv) {
            const i64 cw = std::min(conv, n - j);
            vanilla::load_rows_f32(row_ptr(p.k, b, lo + j, hk), dt, p.k.stride(1), cw, D, w.KVc.data(), D);
            Sm.middleCols(j, cw).noalias() = Q * ConstMatMap(w.KVc.data(), cw, D).transpose();
          }
        }

        for (i64 r = 0; r < M; ++r) {
          const i64 hq = head(r), i = query(r);
          float* s = w.S.data() + r * n;
          vanilla::finish_logits(p, b, hq, i, w.rm[r], lo, hi, s);
          const float row_lse = vanilla::softmax_row(s, n, p.sinks ? p.sinks + hq : nullptr);
          if (lse) lse[(b * Hq + hq) * Tq + i] = row_lse;
          if (weights)  // columns outside [lo, hi) are invisible: the zero-filled buffer is right
            std::memcpy(weights + ((b * Hq + hq) * Tq + i) * Tk + lo, s,
                        static_cast<std::size_t>(n) * sizeof(float));
        }

        MatMap Om(w.O.data(), M, Dv);
        if (p.guard_nonfinite_v) {
          switch (dt) {
            case DType::f16:
              pv_skip_zeros<Eigen::half>(w.S.data(), M, n, p.v, b, lo, hk, w.O.data());
              break;
            case DType::bf16:
              pv_skip_zeros<Eigen::bfloat16>(w.S.data(), M, n, p.v, b, lo, hk, w.O.data());
              break;
            default:
              pv_skip_zeros<float>(w.S.data(), M, n, p.v, b, lo, hk, w.O.data());
              break;
          }
        } else if (dt == DType::f32) {
          StridedMap V(reinterpret_cast<const float*>(row_ptr(p.v, b, lo, hk)), n, Dv,
                       Eigen::OuterStride<>(p.v.stride(1)));
          Om.noalias() = Sm * V;
        } else {
          Om.setZero();
          for (i64 j = 0; j < n; j += conv) {
            const i64 cw = std::min(conv, n - j);
            vanilla::load_rows_f32(row_ptr(p.v, b, lo + j, hk), dt, p.v.stride(1), cw, Dv, w.KVc.data(), Dv);
            Om.noalias() += Sm.middleCols(j, cw) * ConstMatMap(w.KVc.data(), cw, Dv);
          }
        }
        for (i64 r = 0; r < M; ++r)
          vanilla::store_row(w.O.data() + r * Dv, Dv, dt,
                             out + (((b * Tq + query(r)) * Hq + head(r)) * Dv) * out_es);
      } catch (...) {
        errors.capture();
      }
    }
  }
  errors.rethrow("vanilla cpu");
}

}  // namespace

void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers) {
  if (p.B == 0 || p.Tq == 0 || p.Hq == 0) return;
  const int threads = worker_threads(p.num_threads);
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
