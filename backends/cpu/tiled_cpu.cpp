// Fast tiled attention on the CPU: FlashAttention-2's algorithm (see tiled_native.cpp for the
// plain statement) with the data laid out so that every inner loop is a vector loop.
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
// Micro-kernels keep R x NC accumulators in registers (R keys or value columns, NC vectors of
// 16 query rows; at most 6 x 4 = 24 zmm). f32 K/V are read in place with their strides; f16 /
// bf16 tiles are widened to fp32 once per tile into per-thread scratch.
//
// Parallelism: OpenMP over tasks (batch, q head, q block), sorted by their number of kv blocks
// (largest first) and handed out dynamically, which balances causal and windowed work. Scratch
// is allocated once per thread per call and is O(block sizes x head dims): no S x S buffer.
#include "backends/cpu/tiled_cpu.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "attnops/error.h"
#include "backends/common/block_map_impl.h"
#include "backends/common/softmax_policy.h"
#include "backends/common/threads.h"
#include "backends/cpu/simd16.h"

namespace attnops::cpu {
namespace {

using simd::Mask16;
using simd::V16;

constexpr int kMaxR = 6;   // keys (QK) or value columns (PV) per micro-tile
constexpr int kMaxNC = 4;  // vectors of 16 query rows per micro-tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::int64_t round_up(std::int64_t x, std::int64_t m) {
  return (x + m - 1) / m * m;
}

// ---- micro-kernels --------------------------------------------------------------------------

// st[r][l] = sum_d k[r][d] * qt[d][l] for r < R, l < 16 * NC. qt rows are ldq apart, k rows ldk
// apart, st rows lds apart.
template <int R, int NC>
void qk_micro(const float* qt, std::int64_t ldq, const float* k, std::int64_t ldk, std::int64_t D, float* st,
              std::int64_t lds) {
  V16 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) acc[r][n] = simd::zero();
  for (std::int64_t d = 0; d < D; ++d) {
    V16 q[NC];
    for (int n = 0; n < NC; ++n) q[n] = simd::load(qt + d * ldq + 16 * n);
    for (int r = 0; r < R; ++r) {
      const V16 kb = simd::set1(k[r * ldk + d]);
      for (int n = 0; n < NC; ++n) acc[r][n] = simd::fma(kb, q[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) simd::store(st + r * lds + 16 * n, acc[r][n]);
}

// ot[e][l] = alpha[l] * ot[e][l] + sum_{c < nc} v[c][e] * pt[c][l] for e < R, l < 16 * NC.
// SkipZeros (p.guard_nonfinite_v): lanes whose weight is 0 are not updated, so a masked key's
// NaN / inf value cannot reach them through 0 x inf.
template <int R, int NC, bool SkipZeros>
void pv_micro(const float* pt, std::int64_t ldp, const float* v, std::int64_t ldv, std::int64_t nc,
              const float* alpha, float* ot, std::int64_t ldo) {
  V16 acc[R][NC];
  for (int n = 0; n < NC; ++n) {
    const V16 a = simd::load(alpha + 16 * n);
    for (int r = 0; r < R; ++r) acc[r][n] = simd::mul(simd::load(ot + r * ldo + 16 * n), a);
  }
  for (std::int64_t c = 0; c < nc; ++c) {
    V16 pr[NC];
    for (int n = 0; n < NC; ++n) pr[n] = simd::load(pt + c * ldp + 16 * n);
    const float* vc = v + c * ldv;
    if constexpr (SkipZeros) {
      Mask16 nz[NC];
      for (int n = 0; n < NC; ++n) nz[n] = simd::nonzero(pr[n]);
      for (int r = 0; r < R; ++r) {
        const V16 vb = simd::set1(vc[r]);
        for (int n = 0; n < NC; ++n) acc[r][n] = simd::fma_masked(nz[n], vb, pr[n], acc[r][n]);
      }
    } else {
      for (int r = 0; r < R; ++r) {
        const V16 vb = simd::set1(vc[r]);
        for (int n = 0; n < NC; ++n) acc[r][n] = simd::fma(vb, pr[n], acc[r][n]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int n = 0; n < NC; ++n) simd::store(ot + r * ldo + 16 * n, acc[r][n]);
}

using QkFn = void (*)(const float*, std::int64_t, const float*, std::int64_t, std::int64_t, float*,
                      std::int64_t);
using PvFn = void (*)(const float*, std::int64_t, const float*, std::int64_t, std::int64_t, const float*,
                      float*, std::int64_t);

template <int R>
constexpr std::array<QkFn, kMaxNC> qk_row() {
  return {qk_micro<R, 1>, qk_micro<R, 2>, qk_micro<R, 3>, qk_micro<R, 4>};
}
template <int R, bool SkipZeros>
constexpr std::array<PvFn, kMaxNC> pv_row() {
  return {pv_micro<R, 1, SkipZeros>, pv_micro<R, 2, SkipZeros>, pv_micro<R, 3, SkipZeros>,
          pv_micro<R, 4, SkipZeros>};
}
// Indexed [R - 1][NC - 1]: the edges of a tile use the smaller shapes, so no size is padded.
constexpr std::array<std::array<QkFn, kMaxNC>, kMaxR> kQk = {qk_row<1>(), qk_row<2>(), qk_row<3>(),
                                                             qk_row<4>(), qk_row<5>(), qk_row<6>()};
constexpr std::array<std::array<PvFn, kMaxNC>, kMaxR> kPv = {pv_row<1, false>(), pv_row<2, false>(),
                                                             pv_row<3, false>(), pv_row<4, false>(),
                                                             pv_row<5, false>(), pv_row<6, false>()};
constexpr std::array<std::array<PvFn, kMaxNC>, kMaxR> kPvSkipZeros = {pv_row<1, true>(), pv_row<2, true>(),
                                                                      pv_row<3, true>(), pv_row<4, true>(),
                                                                      pv_row<5, true>(), pv_row<6, true>()};

// ---- per-thread scratch ---------------------------------------------------------------------

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
std::unique_ptr<T[], FreeDeleter> aligned_array(std::int64_t n) {
  const auto bytes = static_cast<std::size_t>(round_up(std::max<std::int64_t>(n, 1) * sizeof(T), 64));
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return std::unique_ptr<T[], FreeDeleter>(static_cast<T*>(p));
}

struct Scratch {
  std::unique_ptr<float[], FreeDeleter> qt, st, ot, kpack, vpack, row, m, l, alpha;
  std::unique_ptr<std::int32_t[], FreeDeleter> segq;
  Scratch(std::int64_t bqp, std::int64_t bk, std::int64_t D, std::int64_t Dv, bool convert)
      : qt(aligned_array<float>(D * bqp)),
        st(aligned_array<float>(bk * bqp)),
        ot(aligned_array<float>(Dv * bqp)),
        kpack(aligned_array<float>(convert ? bk * D : 0)),
        vpack(aligned_array<float>(convert ? bk * Dv : 0)),
        row(aligned_array<float>(std::max(D, Dv))),
        m(aligned_array<float>(bqp)),
        l(aligned_array<float>(bqp)),
        alpha(aligned_array<float>(bqp)),
        segq(aligned_array<std::int32_t>(bqp)) {}
};

// 16 bits of a transposed partial bitset column starting at lane l0 (a multiple of 16).
inline Mask16 bits16(const std::uint64_t* col, std::int64_t l0) {
  return static_cast<Mask16>(col[l0 >> 6] >> (l0 & 63));
}

// Element pointer of a BTHD view.
inline const char* at(const TensorView& t, std::int64_t b, std::int64_t i, std::int64_t h) {
  return static_cast<const char*>(t.data()) + (b * t.stride(0) + i * t.stride(1) + h * t.stride(2)) *
                                                  static_cast<std::int64_t>(dtype_size(t.dtype()));
}

// ---- one task: (batch b, q head h, q block qb) ------------------------------------------------

struct Kernel {
  const AttentionProblem& p;
  const BlockMap& map;
  AttentionBuffers& buffers;
  std::int64_t bq, bk, bqp;

  void run(Scratch& s, std::int64_t b, std::int64_t h, std::int64_t qb) const {
    const std::int64_t D = p.D, Dv = p.Dv, Tq = p.Tq, Tk = p.Tk;
    const std::int64_t kh = h / p.group();  // GQA: kv head read in place, never copied
    const std::int64_t i0 = qb * bq, nr = std::min(bq, Tq - i0);
    const std::int64_t nvec = (nr + 15) / 16, lanes = nvec * 16;
    float *qt = s.qt.get(), *st = s.st.get(), *ot = s.ot.get(), *m = s.m.get(), *l = s.l.get(),
          *alpha = s.alpha.get();

    // Q^T [D][bqp], pre-scaled; padding lanes are 0 so their scores are finite and unused.
    const float scale = static_cast<float>(p.scale);
    for (std::int64_t r = 0; r < lanes; ++r) {
      if (r < nr) {
        simd::convert_row(at(p.q, b, i0 + r, h), p.dtype, D, s.row.get(), scale);
        for (std::int64_t d = 0; d < D; ++d) qt[d * bqp + r] = s.row[static_cast<std::size_t>(d)];
      } else {
        for (std::int64_t d = 0; d < D; ++d) qt[d * bqp + r] = 0.f;
      }
    }
    for (std::int64_t e = 0; e < Dv; ++e) std::fill(ot + e * bqp, ot + e * bqp + lanes, 0.f);
    std::fill(m, m + lanes, kNegInf);
    std::fill(l, l + lanes, 0.f);

    // Segment ids of the block's rows, and their range (a kv tile whose ids lie outside it is
    // invisible to every row and skipped).
    const bool seg = p.has_segments();
    std::int32_t qseg_lo = 0, qseg_hi = 0;
    const std::int32_t* segkv = seg ? p.seg_kv + b * Tk : nullptr;
    if (seg) {
      const std::int32_t* sq = p.seg_q + b * Tq + i0;
      for (std::int64_t r = 0; r < lanes; ++r) s.segq[static_cast<std::size_t>(r)] = sq[std::min(r, nr - 1)];
      const auto [lo, hi] = std::minmax_element(sq, sq + nr);
      qseg_lo = *lo;
      qseg_hi = *hi;
    }
    const bool cap = p.soft_cap.has_value();
    const float capf = cap ? static_cast<float>(*p.soft_cap) : 1.f;
    const V16 capv = simd::set1(capf), inv_capv = simd::set1(1.f / capf);
    const bool convert = p.dtype != DType::f32;

    for (const BlockMap::Block& blk : map.row(h, qb)) {
      const std::int64_t j0 = static_cast<std::int64_t>(blk.kv) * bk, nc = std::min(bk, Tk - j0);
      if (seg) {
        const auto [lo, hi] = std::minmax_element(segkv + j0, segkv + j0 + nc);
        if (*hi < qseg_lo || *lo > qseg_hi) continue;
      }
      // K rows and V rows of the tile, fp32: in place (f32) or widened into scratch.
      const float *kt, *vt;
      std::int64_t ldk, ldv;
      if (!convert) {
        kt = reinterpret_cast<const float*>(at(p.k, b, j0, kh));
        vt = reinterpret_cast<const float*>(at(p.v, b, j0, kh));
        ldk = p.k.stride(1);
        ldv = p.v.stride(1);
      } else {
        for (std::int64_t c = 0; c < nc; ++c) {
          simd::convert_row(at(p.k, b, j0 + c, kh), p.dtype, D, s.kpack.get() + c * D);
          simd::convert_row(at(p.v, b, j0 + c, kh), p.dtype, Dv, s.vpack.get() + c * Dv);
        }
        kt = s.kpack.get();
        vt = s.vpack.get();
        ldk = D;
        ldv = Dv;
      }

      // One chunk of up to 64 query rows (kMaxNC vectors) at a time: S^T = K Q^T, online softmax,
      // O^T update. In a partial tile only the key range [c_lo, c_hi) that some row of the chunk
      // sees is visited (a causal diagonal tile costs about 3/4 of a full one), and micro-tiles
      // in it whose bits are all 0 are not computed (the mask overwrites them with -inf unread).
      const bool partial = !blk.is_full();
      const bool rewrite = cap || p.bias || partial || seg;  // softmax pass 1 must store its result
      for (std::int64_t n0 = 0; n0 < nvec; n0 += kMaxNC) {
        const int NC = static_cast<int>(std::min<std::int64_t>(kMaxNC, nvec - n0));
        std::int64_t c_lo = 0, c_hi = nc;
        if (partial) {
          // n0 is a multiple of 4, so the chunk's 16 * NC rows are the low bits of word n0 / 4.
          const std::uint64_t rows = NC == 4 ? ~std::uint64_t{0} : (std::uint64_t{1} << (16 * NC)) - 1;
          c_lo = nc, c_hi = 0;
          for (std::int64_t c = 0; c < nc; ++c)
            if (map.partial_col(blk.partial, c)[n0 >> 2] & rows) {
              c_lo = std::min(c_lo, c);
              c_hi = c + 1;
            }
          if (c_lo >= c_hi) continue;  // nothing visible to this chunk: m, l, O^T unchanged
        }

        for (std::int64_t c0 = c_lo; c0 < c_hi; c0 += kMaxR) {
          const int R = static_cast<int>(std::min<std::int64_t>(kMaxR, c_hi - c0));
          if (partial) {
            std::uint64_t any = 0;
            for (int r = 0; r < R; ++r)
              for (int n = 0; n < NC; ++n) any |= bits16(map.partial_col(blk.partial, c0 + r), (n0 + n) * 16);
            if (!any) continue;
          }
          kQk[R - 1][NC - 1](qt + n0 * 16, bqp, kt + c0 * ldk, ldk, D, st + c0 * bqp + n0 * 16, bqp);
        }

        // Scores -> probabilities, one vector of 16 query rows at a time, online.
        for (std::int64_t n = n0; n < n0 + NC; ++n) {
          const std::int64_t l0 = n * 16;
          const Mask16 valid = static_cast<Mask16>(nr - l0 >= 16 ? 0xffffu : (1u << (nr - l0)) - 1u);
          const float* bias_base = p.bias ? p.bias_row(b, h, i0 + l0) + j0 : nullptr;
          V16 mx = simd::set1(kNegInf);
          for (std::int64_t c = c_lo; c < c_hi; ++c) {
            float* sc = st + c * bqp + l0;
            V16 x = simd::load(sc);
            if (rewrite) {
              if (cap) x = simd::mul(capv, simd::tanh(simd::mul(x, inv_capv)));
              if (bias_base)
                x = simd::add(x, simd::gather(bias_base + c, static_cast<std::int32_t>(Tk), valid));
              Mask16 vis = 0xffff;
              if (partial) vis &= bits16(map.partial_col(blk.partial, c), l0);
              if (seg) vis &= simd::eq_i32(s.segq.get() + l0, segkv[j0 + c]);
              x = simd::select(vis, x, simd::set1(kNegInf));
              simd::store(sc, x);
            }
            mx = simd::max(mx, x);
          }
          const V16 m_old = simd::load(m + l0);
          const V16 m_new = simd::max(m_old, mx);
          // Rows with nothing visible yet keep max -inf; subtract 0 instead so no -inf - -inf.
          const V16 shift = simd::select(simd::eq(m_new, simd::set1(kNegInf)), simd::zero(), m_new);
          const V16 a = simd::exp(simd::sub(m_old, shift));
          V16 sum = simd::zero();
          for (std::int64_t c = c_lo; c < c_hi; ++c) {
            float* sc = st + c * bqp + l0;
            const V16 pr = simd::exp(simd::sub(simd::load(sc), shift));
            simd::store(sc, pr);
            sum = simd::add(sum, pr);
          }
          simd::store(m + l0, m_new);
          simd::store(l + l0, simd::add(simd::mul(simd::load(l + l0), a), sum));
          simd::store(alpha + l0, a);
        }

        // O^T = alpha * O^T + V^T P^T over the chunk's keys.
        const auto& pv = p.guard_nonfinite_v ? kPvSkipZeros : kPv;
        for (std::int64_t e0 = 0; e0 < Dv; e0 += kMaxR) {
          const int R = static_cast<int>(std::min<std::int64_t>(kMaxR, Dv - e0));
          pv[R - 1][NC - 1](st + c_lo * bqp + n0 * 16, bqp, vt + c_lo * ldv + e0, ldv, c_hi - c_lo,
                            alpha + n0 * 16, ot + e0 * bqp + n0 * 16, bqp);
        }
      }
    }

    // Finalise: out = O / l (with the sink's mass in the denominator; the sink adds no value and,
    // as the oracle defines lse, is not part of lse). A row with nothing visible: 0 and -inf.
    float* lse = buffers.lse ? buffers.lse->data_as<float>() + (b * p.Hq + h) * Tq + i0 : nullptr;
    for (std::int64_t r = 0; r < nr; ++r) {
      const float mr = m[r], lr = l[r];
      const float factor = policy::row_factor(mr, lr, p.sinks ? p.sinks + h : nullptr);
      const std::int64_t obase = ((b * Tq + i0 + r) * p.Hq + h) * Dv;
      switch (p.dtype) {
        case DType::f32: {
          float* o = buffers.out.data_as<float>() + obase;
          for (std::int64_t e = 0; e < Dv; ++e) o[e] = ot[e * bqp + r] * factor;
          break;
        }
        case DType::f16: {
          std::uint16_t* o = buffers.out.data_as<std::uint16_t>() + obase;
          for (std::int64_t e = 0; e < Dv; ++e) o[e] = float_to_half_bits(ot[e * bqp + r] * factor);
          break;
        }
        default: {
          std::uint16_t* o = buffers.out.data_as<std::uint16_t>() + obase;
          for (std::int64_t e = 0; e < Dv; ++e) o[e] = float_to_bf16_bits(ot[e * bqp + r] * factor);
          break;
        }
      }
      if (lse) lse[r] = policy::row_lse(mr, lr);
    }
  }
};

}  // namespace

void tiled_attention(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers) {
  if (map.Tq != p.Tq || map.Tk != p.Tk || (map.heads != 1 && map.heads != p.Hq))
    throw Error(ErrorCode::shape_mismatch,
                "cpu tiled_attention: block map built for Tq=" + std::to_string(map.Tq) +
                    " Tk=" + std::to_string(map.Tk) + " heads=" + std::to_string(map.heads) +
                    ", expected Tq=" + std::to_string(p.Tq) + " Tk=" + std::to_string(p.Tk) + " heads=1 or " +
                    std::to_string(p.Hq));
  if (!is_float(p.dtype))
    throw Error(
        ErrorCode::unsupported_dtype,
        "cpu tiled_attention: dtype " + std::string(dtype_name(p.dtype)) + ", expected f32, f16 or bf16");
  const std::int64_t bq = map.bq, bk = map.bk, bqp = round_up(bq, 16);
  const Kernel kernel{p, map, buffers, bq, bk, bqp};

  // Tasks, heaviest (most kv blocks) first so that dynamic scheduling ends balanced.
  struct Task {
    std::int32_t b, h, qb, cost;
  };
  std::vector<Task> tasks;
  tasks.reserve(static_cast<std::size_t>(p.B * p.Hq * map.nq));
  for (std::int64_t qb = 0; qb < map.nq; ++qb)
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t h = 0; h < p.Hq; ++h)
        tasks.push_back({static_cast<std::int32_t>(b), static_cast<std::int32_t>(h),
                         static_cast<std::int32_t>(qb), static_cast<std::int32_t>(map.row(h, qb).size())});
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.cost > y.cost; });

  int nt = worker_threads(p.num_threads);
  nt = static_cast<int>(std::clamp<std::int64_t>(static_cast<std::int64_t>(tasks.size()), 1, nt));
  // Scratch for every thread, allocated before the parallel region (an allocation failure
  // throws here, not inside OpenMP).
  std::vector<Scratch> scratch;
  scratch.reserve(static_cast<std::size_t>(nt));
  for (int t = 0; t < nt; ++t) scratch.emplace_back(bqp, bk, p.D, p.Dv, p.dtype != DType::f32);

  const auto ntasks = static_cast<std::int64_t>(tasks.size());
#pragma omp parallel num_threads(nt)
  {
    Scratch& s = scratch[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < ntasks; ++t) {
      const Task& task = tasks[static_cast<std::size_t>(t)];
      kernel.run(s, task.b, task.h, task.qb);
    }
  }
}

}  // namespace attnops::cpu
