// Per-tier source (compiled once per ISA tier, see README.md): VanillaAttn::forward_cpu, the
// materialised-scores path. (The decode path is vanilla_decode.cpp; the choice between them and
// the tier are made by cpu_dispatch.cpp.)
//
// Work unit ("task", planned by vanilla_plan.cpp): one batch b, one kv head hk, a slice of gn of
// its G = Hq / Hkv q heads (from g0) and a chunk of q rows [i0, i1). The chunk's rows of those q
// heads are stacked, M = gn * (i1 - i0) rows:
//   row r = g * (i1 - i0) + (i - i0)  <->  q head hk * G + g0 + g, query i
// so the GQA group shares every read of K and V (no copies of K/V per q head). The working set
// is bounded by the plan (16 MiB per thread unless one row is larger). Two layouts:
//
// Lanes over rows (the common one; the tiled kernel's layout, tiled_cpu.cpp, transposed):
// 16-lane vectors run over the task's rows.
//   Q^T [D][Mp]    the rows, pre-scaled (Mp = M rounded up to 16; padding lanes are 0)
//   S^T [n][Mp]    every score of the kv columns [lo, hi) some row can see (n = hi - lo):
//                  S^T[c] = sum_d K[lo + c][d] Q^T[d]  (K rows read in place, K[c][d] broadcast)
//   softmax        per lane, over the whole column: max, exp, sum, all vertical (no reductions);
//                  soft cap, bias, the row's visible range, segments and sinks as in the spec
//   O^T [Dv][Mp]   O^T[e] = sum_c V[lo + c][e] P^T[c]  (V rows read in place)
// Both products run on micro_kernels.h; f32 K/V are read in place with the view's row stride,
// f16 / bf16 K/V are widened in blocks of the plan's convert_rows.
//
// Row-major (keys so many that 16 rows of scores would not fit the cap): S [M][n], Q [M][D],
// O [M][Dv], with the decode path's primitives (one key against the task's rows, then P.V with
// V rows read in place in their dtype) and vanilla_rows.h's row softmax.
//
// The weights output, when asked for, is P copied into [B, Hq, Tq, Tk] rows. Tasks run in
// parallel (OpenMP, dynamic schedule) with per-thread scratch allocated before the parallel
// region (std::bad_alloc there becomes Error(out_of_memory) in cpu_dispatch.cpp); nothing inside
// the region allocates or throws. Non-finite values follow backends/common/softmax_policy.h.
#include "backends/cpu/vanilla_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attnops/ext/problem.h"
#include "backends/common/softmax_policy.h"
#include "backends/common/work_pool.h"
#include "backends/cpu/aligned.h"
#include "backends/cpu/micro_kernels.h"
#include "backends/cpu/tier_entry.h"
#include "backends/cpu/vanilla_rows.h"
#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu::ATTNOPS_TIER_NS {
namespace {

using simd::Mask16;
using simd::V16;
using vanilla::i64;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

i64 round16(i64 x) {
  return (x + 15) / 16 * 16;
}

// Address of element (b, t, h, 0) of a BTHD view, in bytes.
const char* row_ptr(const TensorView& x, i64 b, i64 t, i64 h) {
  const i64 off = b * x.stride(0) + t * x.stride(1) + h * x.stride(2);
  return static_cast<const char*>(x.data()) + off * static_cast<i64>(dtype_size(x.dtype()));
}

struct Scratch {
  AlignedArray<float> qt, st, ot, kv, row;
  // [lanes] all 1: the O^T update's per-lane factor for "add to the accumulator". Never written:
  // a task's lanes may be fewer than the plan's, so nothing may live beyond a task's own Mp here.
  AlignedArray<float> ones;
  AlignedArray<float> factor;       // [lanes] 1 / denominator per lane, written by each task
  AlignedArray<float> lo, hi;       // [Mp] each lane's visible range, as floats (exact below 2^24)
  AlignedArray<std::int32_t> segq;  // [Mp]
  AlignedArray<float> bias_lane;    // [16] one key's bias for 16 lanes
  AlignedArray<i64> c_lo, c_hi;     // [chunks] each 64-lane chunk's key range
  AlignedArray<char> started;       // [chunks] the chunk's O^T holds a first product
  std::vector<vanilla::RowMask> rm;
};

// Scratch of one thread for plan `pl` (lanes over rows or row-major).
Scratch make_scratch(const AttentionProblem& p, const VanillaPlan& pl) {
  Scratch w;
  const i64 Mp = pl.lanes, n = std::max<i64>(1, p.Tk), widest = std::max(p.D, p.Dv);
  w.rm.resize(static_cast<std::size_t>(Mp));
  if (!pl.lanes_over_rows) {  // S [M][n], Q [M][D], O [M][Dv]
    w.st = aligned_array<float>(Mp * n);
    w.qt = aligned_array<float>(Mp * p.D);
    w.ot = aligned_array<float>(Mp * p.Dv);
    return w;
  }
  w.qt = aligned_array<float>(p.D * Mp);
  w.st = aligned_array<float>(n * Mp);
  w.ot = aligned_array<float>(p.Dv * Mp);
  w.kv = aligned_array<float>(p.dtype == DType::f32 ? 0 : pl.convert_rows * widest);
  w.ones = aligned_array<float>(Mp);
  std::fill(w.ones.get(), w.ones.get() + Mp, 1.f);
  w.factor = aligned_array<float>(Mp);
  w.row = aligned_array<float>(widest);
  w.lo = aligned_array<float>(Mp);
  w.hi = aligned_array<float>(Mp);
  w.segq = aligned_array<std::int32_t>(Mp);
  w.bias_lane = aligned_array<float>(16);
  w.c_lo = aligned_array<i64>((Mp + 63) / 64);
  w.c_hi = aligned_array<i64>((Mp + 63) / 64);
  w.started = aligned_array<char>((Mp + 63) / 64);
  return w;
}

// One task; see the file comment.
struct Task {
  const AttentionProblem& p;
  AttentionBuffers& buffers;
  i64 b, hk, g0, i0, nq, M, Mp;
  i64 key_block;  // K/V rows widened at a time (f16 / bf16)
  Scratch& w;

  i64 head(i64 r) const { return hk * p.group() + g0 + r / nq; }
  i64 query(i64 r) const { return i0 + r % nq; }

  // K (which = 0) or V rows [lo + j, lo + j + cnt) as fp32 rows: in place for f32, else widened
  // into scratch. Returns the first row and sets ld to the row stride.
  const float* kv_rows(int which, i64 j, i64 cnt, i64& ld) const {
    const TensorView& t = which == 0 ? p.k : p.v;
    const i64 width = which == 0 ? p.D : p.Dv;
    if (p.dtype == DType::f32) {
      ld = t.stride(1);
      return reinterpret_cast<const float*>(row_ptr(t, b, j, hk));
    }
    ld = width;
    for (i64 c = 0; c < cnt; ++c)
      simd::convert_row(row_ptr(t, b, j + c, hk), p.dtype, width, w.kv.get() + c * width);
    return w.kv.get();
  }

  void run() const;       // lanes over rows
  void run_rows() const;  // row-major
  template <DType DT>
  void run_rows_typed() const;
};

void Task::run() const {
  const i64 D = p.D, Dv = p.Dv, Tq = p.Tq, Tk = p.Tk, Hq = p.Hq;
  float *qt = w.qt.get(), *st = w.st.get(), *ot = w.ot.get();
  float* lse = buffers.lse ? buffers.lse->data_as<float>() : nullptr;

  // Rows' visible ranges, and their union [lo, hi).
  i64 lo = Tk, hi = 0;
  bool exact = true;
  for (i64 r = 0; r < M; ++r) {
    w.rm[r] = vanilla::row_mask(p, head(r), query(r));
    if (w.rm[r].hi > w.rm[r].lo) lo = std::min(lo, w.rm[r].lo), hi = std::max(hi, w.rm[r].hi);
    exact = exact && w.rm[r].exact;
  }
  if (hi <= lo) {  // the whole chunk is masked: output stays 0, lse -inf, weights 0
    if (lse)
      for (i64 r = 0; r < M; ++r) lse[(b * Hq + head(r)) * Tq + query(r)] = kNegInf;
    return;
  }
  const i64 n = hi - lo;
  for (i64 r = 0; r < Mp; ++r) {  // padding lanes see nothing
    const bool real = r < M && w.rm[r].hi > w.rm[r].lo;
    w.lo[r] = real ? static_cast<float>(w.rm[r].lo - lo) : 0.f;
    w.hi[r] = real ? static_cast<float>(w.rm[r].hi - lo) : 0.f;
    if (p.seg_q) w.segq[r] = r < M ? p.seg_q[b * Tq + query(r)] : 0;
  }

  // Q^T, pre-scaled.
  const float scale = static_cast<float>(p.scale);
  for (i64 r = 0; r < Mp; ++r) {
    if (r < M) {
      simd::convert_row(row_ptr(p.q, b, query(r), head(r)), p.dtype, D, w.row.get(), scale);
      for (i64 d = 0; d < D; ++d) qt[d * Mp + r] = w.row[d];
    } else {
      for (i64 d = 0; d < D; ++d) qt[d * Mp + r] = 0.f;
    }
  }

  // Each chunk of up to 64 lanes works on the union of its rows' ranges [c_lo[k], c_hi[k]).
  const i64 nchunks = (Mp + 63) / 64;
  i64 *c_lo = w.c_lo.get(), *c_hi = w.c_hi.get();
  char* started = w.started.get();
  for (i64 k = 0; k < nchunks; ++k) {
    c_lo[k] = n;
    c_hi[k] = 0;
    started[k] = 0;
    for (i64 r = k * 64; r < std::min(Mp, (k + 1) * 64); ++r)
      if (w.hi[r] > w.lo[r]) {
        c_lo[k] = std::min(c_lo[k], static_cast<i64>(w.lo[r]));
        c_hi[k] = std::max(c_hi[k], static_cast<i64>(w.hi[r]));
      }
  }

  // S^T = K Q^T over each chunk's range, a block of keys at a time.
  for (i64 j = 0; j < n; j += key_block) {
    const i64 bw = std::min(key_block, n - j);
    i64 ldk = 0;
    const float* kr = nullptr;
    for (i64 k = 0; k < nchunks; ++k) {
      const i64 a = std::max(c_lo[k], j), e = std::min(c_hi[k], j + bw);
      if (a >= e) continue;
      if (!kr) kr = kv_rows(0, lo + j, bw, ldk);
      const int NC = static_cast<int>(std::min<i64>(micro::kMaxNC, Mp / 16 - k * micro::kMaxNC));
      for (i64 c0 = a; c0 < e; c0 += micro::kMaxR) {
        const int R = static_cast<int>(std::min<i64>(micro::kMaxR, e - c0));
        micro::kGemm<false>[R - 1][NC - 1](kr + (c0 - j) * ldk, ldk, qt + k * 64, Mp, D,
                                           st + c0 * Mp + k * 64, Mp);
      }
    }
  }

  // Softmax down each lane's column; P^T unnormalised in st, 1 / denominator per lane in `factor`.
  const bool cap = p.soft_cap.has_value(), want_weights = buffers.weights.has_value();
  const float capf = cap ? static_cast<float>(*p.soft_cap) : 1.f;
  const V16 capv = simd::set1(capf), inv_capv = simd::set1(1.f / capf);
  float* factor = w.factor.get();
  for (i64 v = 0; v < Mp / 16; ++v) {
    const i64 l0 = v * 16, k = v / micro::kMaxNC;
    const V16 vlo = simd::load(w.lo.get() + l0), vhi = simd::load(w.hi.get() + l0);
    const float* brow[16] = {};
    if (p.bias)
      for (int l = 0; l < 16; ++l)
        brow[l] = l0 + l < M ? p.bias_row(b, head(l0 + l), query(l0 + l)) + lo : nullptr;
    V16 mx = simd::set1(kNegInf);
    // Lanes with a NaN or +inf logit: their row is NaN (softmax_policy.h). Tracked only for the
    // weights output, whose masked keys stay 0 in such a row as in any other (the oracle's).
    Mask16 nan_row = 0;
    for (i64 c = c_lo[k]; c < c_hi[k]; ++c) {
      float* sc = st + c * Mp + l0;
      V16 x = simd::load(sc);
      if (cap) x = simd::mul(capv, simd::tanh(simd::mul(x, inv_capv)));
      if (p.bias) {
        for (int l = 0; l < 16; ++l) w.bias_lane[l] = brow[l] ? brow[l][c] : 0.f;
        x = simd::add(x, simd::load(w.bias_lane.get()));
      }
      const V16 cv = simd::set1(static_cast<float>(c));
      Mask16 vis = static_cast<Mask16>(simd::lt(cv, vhi) & ~simd::lt(cv, vlo));  // lo <= c < hi
      if (!exact)
        for (int l = 0; l < 16; ++l)
          if (((vis >> l) & 1) && !w.rm[l0 + l].exact &&
              !p.mask.visible(head(l0 + l), query(l0 + l), lo + c, Tq, Tk))
            vis = static_cast<Mask16>(vis & ~(1u << l));
      if (p.seg_q) vis &= simd::eq_i32(w.segq.get() + l0, p.seg_kv[b * Tk + lo + c]);
      x = simd::select(vis, x, simd::set1(kNegInf));
      simd::store(sc, x);
      mx = simd::max(mx, x);
      if (want_weights)
        nan_row |= static_cast<Mask16>(static_cast<Mask16>(~simd::eq(x, x)) | simd::eq(x, simd::set1(kInf)));
    }
    // Lanes with nothing visible keep max -inf: shift by 0, so every exp is exp(-inf) = 0.
    const V16 shift = simd::select(simd::eq(mx, simd::set1(kNegInf)), simd::zero(), mx);
    V16 sum = simd::zero();
    for (i64 c = c_lo[k]; c < c_hi[k]; ++c) {
      float* sc = st + c * Mp + l0;
      const V16 x = simd::load(sc);
      V16 pr = simd::exp(simd::sub(x, shift));
      if (nan_row)  // a NaN row's keys: NaN, its masked ones (-inf) 0
        pr = simd::select(nan_row,
                          simd::select(simd::eq(x, simd::set1(kNegInf)), simd::zero(), simd::set1(kNaN)), pr);
      simd::store(sc, pr);
      sum = simd::add(sum, pr);
    }
    float m[16], l[16];
    simd::store(m, mx);
    simd::store(l, sum);
    for (int t = 0; t < 16; ++t) {
      const i64 r = l0 + t;
      factor[r] = 0.f;
      if (r >= M) continue;
      const i64 hq = head(r);
      // The sink takes probability mass (denominator) but is not part of the lse; a fully
      // masked row gives factor 0 and lse -inf, a NaN or +inf logit NaN (softmax_policy.h).
      factor[r] = policy::row_factor(m[t], l[t], p.sinks ? p.sinks + hq : nullptr);
      if (lse) lse[(b * Hq + hq) * Tq + query(r)] = policy::row_lse(m[t], l[t]);
    }
  }
  if (buffers.weights) {  // P, normalised, back into [B, Hq, Tq, Tk] rows (other columns stay 0)
    float* wts = buffers.weights->data_as<float>();
    for (i64 r = 0; r < M; ++r) {
      const i64 k = r / 64;
      float* dst = wts + ((b * Hq + head(r)) * Tq + query(r)) * Tk + lo;
      // A weight of 0 stays 0 (a masked key of a NaN row: 0 x NaN would be NaN).
      for (i64 c = c_lo[k]; c < c_hi[k]; ++c)
        dst[c] = st[c * Mp + r] == 0.f ? 0.f : st[c * Mp + r] * factor[r];
    }
  }

  // O^T = V^T P^T over each chunk's range, a block of keys at a time (the first block a chunk
  // sees starts its accumulator from 0, later ones add to it: s = 1). p.guard_nonfinite_v:
  // weight-0 lanes are skipped, so a masked key's NaN / inf value cannot reach them.
  const auto& pv = p.guard_nonfinite_v ? micro::kScaledAccSkipZeros : micro::kScaledAcc;
  for (i64 j = 0; j < n; j += key_block) {
    const i64 bw = std::min(key_block, n - j);
    i64 ldv = 0;
    const float* vr = nullptr;
    for (i64 k = 0; k < nchunks; ++k) {
      const i64 a = std::max(c_lo[k], j), e = std::min(c_hi[k], j + bw);
      if (a >= e) continue;
      if (!vr) vr = kv_rows(1, lo + j, bw, ldv);
      const int NC = static_cast<int>(std::min<i64>(micro::kMaxNC, Mp / 16 - k * micro::kMaxNC));
      const float* s = started[k] ? w.ones.get() : nullptr;
      for (i64 e0 = 0; e0 < Dv; e0 += micro::kMaxR) {
        const int R = static_cast<int>(std::min<i64>(micro::kMaxR, Dv - e0));
        pv[R - 1][NC - 1](vr + (a - j) * ldv + e0, ldv, st + a * Mp + k * 64, Mp, e - a, s,
                          ot + e0 * Mp + k * 64, Mp);
      }
      started[k] = 1;
    }
  }

  // out = O * factor (0 for fully masked rows and for chunks that saw nothing).
  const i64 es = static_cast<i64>(dtype_size(p.dtype));
  for (i64 r = 0; r < M; ++r) {
    float* o = w.row.get();
    const bool any = started[r / 64];
    for (i64 e = 0; e < Dv; ++e) o[e] = any ? policy::scaled_out(ot[e * Mp + r], factor[r]) : 0.f;
    vanilla::store_row(
        o, Dv, p.dtype,
        static_cast<char*>(buffers.out.data()) + (((b * Tq + query(r)) * Hq + head(r)) * Dv) * es);
  }
}

void Task::run_rows() const {
  switch (p.dtype) {
    case DType::f16:
      return run_rows_typed<DType::f16>();
    case DType::bf16:
      return run_rows_typed<DType::bf16>();
    default:
      return run_rows_typed<DType::f32>();
  }
}

template <DType DT>
void Task::run_rows_typed() const {
  const i64 D = p.D, Dv = p.Dv, Tq = p.Tq, Tk = p.Tk, Hq = p.Hq;
  float *S = w.st.get(), *Q = w.qt.get(), *O = w.ot.get();
  float* lse = buffers.lse ? buffers.lse->data_as<float>() : nullptr;

  i64 lo = Tk, hi = 0;
  for (i64 r = 0; r < M; ++r) {
    w.rm[r] = vanilla::row_mask(p, head(r), query(r));
    if (w.rm[r].hi > w.rm[r].lo) lo = std::min(lo, w.rm[r].lo), hi = std::max(hi, w.rm[r].hi);
  }
  if (hi <= lo) {  // the whole task is masked: output stays 0, lse -inf, weights 0
    if (lse)
      for (i64 r = 0; r < M; ++r) lse[(b * Hq + head(r)) * Tq + query(r)] = kNegInf;
    return;
  }
  const i64 n = hi - lo;
  const float scale = static_cast<float>(p.scale);
  for (i64 r = 0; r < M; ++r)
    simd::convert_row(row_ptr(p.q, b, query(r), head(r)), p.dtype, D, Q + r * D, scale);

  // S [M][n]: one key at a time against the task's rows, K read in place in its dtype.
  const i64 es = static_cast<i64>(dtype_size(p.dtype)), ldk = p.k.stride(1) * es;
  const char* k0 = row_ptr(p.k, b, lo, hk);
  for (i64 c = 0; c < n; ++c) vanilla::dot_key<DT>(Q, D, M, k0 + c * ldk, D, S + c, n);

  float* wts = buffers.weights ? buffers.weights->data_as<float>() : nullptr;
  for (i64 r = 0; r < M; ++r) {
    const i64 hq = head(r), i = query(r);
    float* s = S + r * n;
    vanilla::finish_logits(p, b, hq, i, w.rm[r], lo, hi, s);
    const float row_lse = vanilla::softmax_row(s, n, p.sinks ? p.sinks + hq : nullptr);
    if (lse) lse[(b * Hq + hq) * Tq + i] = row_lse;
    if (wts) std::copy(s, s + n, wts + ((b * Hq + hq) * Tq + i) * Tk + lo);  // other columns stay 0
  }

  // O [M][Dv] = P V[lo:hi] (weight-0 keys skipped under p.guard_nonfinite_v).
  std::fill(O, O + M * Dv, 0.f);
  const char* v0 = row_ptr(p.v, b, lo, hk);
  if (p.guard_nonfinite_v)
    vanilla::pv_block<DT, true>(S, n, M, v0, p.v.stride(1), n, Dv, O, Dv);
  else
    vanilla::pv_block<DT, false>(S, n, M, v0, p.v.stride(1), n, Dv, O, Dv);
  for (i64 r = 0; r < M; ++r)
    vanilla::store_row(
        O + r * Dv, Dv, p.dtype,
        static_cast<char*>(buffers.out.data()) + (((b * Tq + query(r)) * Hq + head(r)) * Dv) * es);
}

}  // namespace

const char* vanilla_general_forward(const AttentionProblem& p, AttentionBuffers& buffers, int threads,
                                    const VanillaPlan& pl) {
  threads = static_cast<int>(std::clamp<i64>(pl.tasks, 1, threads));
  // Per-thread scratch, allocated before the parallel region (an allocation failure throws
  // std::bad_alloc here, which cpu_dispatch.cpp turns into Error(out_of_memory)).
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) scratch.push_back(make_scratch(p, pl));

  // Tasks handed out one at a time to whichever threads run (work_pool.h); each writes its own
  // rows, so the result does not depend on which thread took it.
  struct Ctx {
    const AttentionProblem& p;
    AttentionBuffers& buffers;
    const VanillaPlan& pl;
    Scratch* scratch;
  } ctx{p, buffers, pl, scratch.data()};
  run_tasks(
      threads, pl.tasks,
      [](void* c, std::int64_t t, int slot) {
        Ctx& x = *static_cast<Ctx*>(c);
        const AttentionProblem& p = x.p;
        const VanillaPlan& pl = x.pl;
        const i64 G = p.group();
        const i64 ch = t % pl.chunks, gs = (t / pl.chunks) % pl.gslices,
                  hk = (t / (pl.chunks * pl.gslices)) % p.Hkv, b = t / (pl.chunks * pl.gslices * p.Hkv);
        const i64 i0 = ch * pl.qc, nq = std::min(pl.qc, p.Tq - i0), g0 = gs * pl.gc,
                  gn = std::min(pl.gc, G - g0);
        const i64 M = gn * nq;
        const Task task{p,
                        x.buffers,
                        b,
                        hk,
                        g0,
                        i0,
                        nq,
                        M,
                        pl.lanes_over_rows ? round16(M) : M,
                        pl.convert_rows,
                        x.scratch[slot]};
        if (pl.lanes_over_rows)
          task.run();
        else
          task.run_rows();
      },
      &ctx);
  return pl.lanes_over_rows ? "materialised scores (S^T, lanes over query rows), micro-kernel products"
                            : "materialised scores, row-major (too many keys for the lanes layout)";
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
