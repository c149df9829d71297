// Per-tier source (compiled once per ISA tier, see README.md): the decode path of
// VanillaAttn::forward_cpu; see vanilla_decode.h for the design.
//
// Memory order matters more than arithmetic here. In BTHD the kv heads of one position are
// adjacent ([Hkv, D] contiguous per position), while one head's consecutive positions are
// Hkv * D elements apart (8 KiB for Hkv = 16, D = 128 f32: a new 4 KiB page per row). So a task
// owns a range of positions of one batch for ALL kv heads and walks K and V position by position,
// head by head: the reads are sequential in memory, the prefetchers and the TLB see a stream.
//
// Task = (batch b, split s of the kv range). Per task and per kv block of kBlock positions:
//   1. scores  S[hk][r][jj] = scale * q_r . k[b, j0 + jj, hk]   (position-major walk of K, with
//      prefetches of the same positions' V rows)
//   2. per row: soft cap, bias, mask, segments; online softmax update of (m, l) and acc rescale
//   3. acc[hk][r] += sum_jj P[hk][r][jj] * v[b, j0 + jj, hk]     (head by head, from cache, the
//      accumulators of a 64-column slice held in registers)
// Row r of kv head hk is q head hk * G + r / Tq, query r % Tq (all G q heads of the group share
// every K and V read). Partial (m, l, acc) of each split are merged afterwards in split order.
// bf16 K/V are widened as pairs (decode_pairs.h): the queries and accumulators of a bf16 call
// are in pair-split order until the merge stores a row.
//
// Scratch is carved from one per-thread buffer reused across calls (call_scratch.h); no
// std::vector<float> in a tier object (see aligned.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>

#include "attnops/ext/problem.h"
#include "backends/common/call_scratch.h"
#include "backends/common/softmax_policy.h"
#include "backends/common/work_pool.h"
#include "backends/cpu/decode_pairs.h"
#include "backends/cpu/tier_entry.h"
#include "backends/cpu/vanilla_rows.h"
#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu::ATTNOPS_TIER_NS {
namespace {

using vanilla::i64;

// bf16 q.k on VDPBF16PS (decode_pairs.h) from the avx512bf16 tier up; below, pairs of fp32 FMAs.
constexpr bool kDotBf16 = ATTNOPS_TIER_LEVEL >= 3;
constexpr i64 round_up32(i64 x) {
  return (x + 31) / 32 * 32;
}

// Positions per block: scores of a block are turned into probabilities together (one max, one
// rescale of acc per block and row), while K and V of the block (32 x Hkv x D: 256 KiB each at
// Hkv = 16, D = 128, f32) stay in L2. Measured: 32 beats 16 (per-block overheads) and 64.
constexpr i64 kBlock = 32;

// Address of element (b, t, h, 0) of a BTHD view, in bytes.
const char* row_ptr(const TensorView& x, i64 b, i64 t, i64 h) {
  const i64 off = b * x.stride(0) + t * x.stride(1) + h * x.stride(2);
  return static_cast<const char*>(x.data()) + off * static_cast<i64>(dtype_size(x.dtype()));
}

// Everything one decode call shares between its tasks.
struct DecodeJob {
  const AttentionProblem& p;
  i64 G, R, nsplit, tasks;
  // Partial results per (task, kv head, row): unnormalised output [Dv] and (max, sum).
  float* part_acc = nullptr;
  vanilla::OnlineRow* part_state = nullptr;
};

// Per-thread scratch, sized once per call.
struct DecodeScratch {
  float* Qs = nullptr;                         // [Hkv][R][D], pre-scaled fp32 queries (bf16: split)
  float* row = nullptr;                        // [D] one query row before it is split
  std::uint16_t* Qh = nullptr;                 // [Hkv][R][Dp32] bf16 queries (VDPBF16PS tiers)
  float* S = nullptr;                          // [Hkv][R][kBlock] logits, then probabilities
  vanilla::RowMask* rm = nullptr;              // [Hkv][R]
  i64 *head_lo = nullptr, *head_hi = nullptr;  // [Hkv] union of the visible ranges of a head's rows
  char* head_active = nullptr;                 // [Hkv] head has visible columns in the current block
};

// Carves the call's memory out of one buffer (call_scratch.h) in 64-byte aligned pieces; with a
// null base it only counts the bytes.
struct Carve {
  char* base = nullptr;
  std::size_t used = 0;
  template <class T>
  T* take(i64 n) {
    T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
    used += (static_cast<std::size_t>(std::max<i64>(n, 1)) * sizeof(T) + 63) / 64 * 64;
    return p;
  }
};

// Scores one key (dtype DT) against the R query rows of kv head hk, in the layout DT's queries
// are kept in (bf16: the bits of q for VDPBF16PS, or split fp32 rows; else fp32 rows), into
// s[r * kBlock].
template <DType DT, i64 kD>
void score_key(const DecodeScratch& w, i64 hk, i64 R, i64 D, float scale, const char* k, float* s) {
#if ATTNOPS_TIER_LEVEL >= 3
  if constexpr (DT == DType::bf16) {
    const i64 ld = round_up32(D);
    return vanilla::pairs::dot_key_bf16<kD>(w.Qh + hk * R * ld, ld, R, k, D, scale, s, kBlock);
  }
#endif
  (void)scale;
  if constexpr (DT == DType::bf16)
    vanilla::pairs::dot_key<kD>(w.Qs + hk * R * D, D, R, k, D, s, kBlock);
  else
    vanilla::dot_key<DT, kD>(w.Qs + hk * R * D, D, R, k, D, s, kBlock);
}

template <DType DT, i64 kD>
void run_task(DecodeJob& job, DecodeScratch& w, i64 t) {
  const AttentionProblem& p = job.p;
  const i64 G = job.G, R = job.R, Tq = p.Tq, Tk = p.Tk, D = p.D, Dv = p.Dv, Hkv = p.Hkv;
  const i64 b = t / job.nsplit, split = t % job.nsplit;

  // Visible kv ranges: per head (to skip blocks a head cannot see) and their union over the
  // heads, which the splits divide (so a sliding-window decode spreads its window, not [0, Tk)).
  i64 lo = Tk, hi = 0;
  for (i64 hk = 0; hk < Hkv; ++hk) {
    i64 hl = Tk, hh = 0;
    for (i64 r = 0; r < R; ++r) {
      const vanilla::RowMask m = vanilla::row_mask(p, hk * G + r / Tq, r % Tq);
      w.rm[hk * R + r] = m;
      if (m.hi > m.lo) {
        hl = std::min(hl, m.lo);
        hh = std::max(hh, m.hi);
      }
    }
    w.head_lo[hk] = hl;
    w.head_hi[hk] = hh;
    if (hh > hl) {
      lo = std::min(lo, hl);
      hi = std::max(hi, hh);
    }
  }
  if (hi <= lo) return;  // every row fully masked: partial states stay (-inf, 0)
  const i64 s0 = lo + (hi - lo) * split / job.nsplit, s1 = lo + (hi - lo) * (split + 1) / job.nsplit;
  if (s1 <= s0) return;

  const float scale = static_cast<float>(p.scale);
  [[maybe_unused]] const i64 Dp32 = round_up32(D);
  for (i64 hq = 0; hq < p.Hq; ++hq) {  // row r of head hk sits at (hk * R + r) * D, r = g * Tq + i
    if constexpr (DT == DType::bf16 && kDotBf16) {
      for (i64 i = 0; i < Tq; ++i) {  // the bits of q, zero past D
        std::uint16_t* dst = w.Qh + (hq * Tq + i) * Dp32;
        std::memcpy(dst, row_ptr(p.q, b, i, hq), static_cast<std::size_t>(D) * 2);
        std::fill(dst + D, dst + Dp32, std::uint16_t{0});
      }
    } else if constexpr (DT == DType::bf16) {
      for (i64 i = 0; i < Tq; ++i) {
        vanilla::load_rows_f32(row_ptr(p.q, b, i, hq), p.dtype, p.q.stride(1), 1, D, w.row, D, scale);
        vanilla::pairs::split_row(w.row, D, w.Qs + (hq * Tq + i) * D);
      }
    } else {
      vanilla::load_rows_f32(row_ptr(p.q, b, 0, hq), p.dtype, p.q.stride(1), Tq, D, w.Qs + hq * Tq * D, D,
                             scale);
    }
  }
  float* acc = job.part_acc + t * Hkv * R * Dv;
  vanilla::OnlineRow* st = job.part_state + t * Hkv * R;
  const i64 es = static_cast<i64>(dtype_size(DT));
  const i64 ldk = p.k.stride(1) * es, ldv = p.v.stride(1) * es;  // bytes between positions

  for (i64 j0 = s0; j0 < s1; j0 += kBlock) {
    const i64 n = std::min(kBlock, s1 - j0);
    for (i64 hk = 0; hk < Hkv; ++hk) w.head_active[hk] = j0 < w.head_hi[hk] && j0 + n > w.head_lo[hk];

    const char* krow = row_ptr(p.k, b, j0, 0);
    const char* vrow = row_ptr(p.v, b, j0, 0);
    for (i64 jj = 0; jj < n; ++jj, krow += ldk, vrow += ldv) {
      for (i64 hk = 0; hk < Hkv; ++hk) {
        if (!w.head_active[hk]) continue;
        score_key<DT, kD>(w, hk, R, D, scale, krow + hk * p.k.stride(2) * es, w.S + hk * R * kBlock + jj);
        // This block's V rows, in address order, while the keys are scored: step 3 below then
        // reads them head by head from cache.
        vanilla::prefetch_bytes(vrow + hk * p.v.stride(2) * es, Dv * es);
      }
    }

    for (i64 hk = 0; hk < Hkv; ++hk) {
      if (!w.head_active[hk]) continue;
      for (i64 r = 0; r < R; ++r) {
        float* s = w.S + (hk * R + r) * kBlock;
        vanilla::finish_logits(p, b, hk * G + r / Tq, r % Tq, w.rm[hk * R + r], j0, j0 + n, s);
        vanilla::online_update(s, n, st[hk * R + r], acc + (hk * R + r) * Dv, Dv);
      }
    }

    const char* v0 = row_ptr(p.v, b, j0, 0);
    for (i64 hk = 0; hk < Hkv; ++hk) {
      if (!w.head_active[hk]) continue;
      const float* P = w.S + hk * R * kBlock;
      const char* V = v0 + hk * p.v.stride(2) * es;
      float* a = acc + hk * R * Dv;
      if constexpr (DT == DType::bf16) {
        if (p.guard_nonfinite_v)  // a weight-0 key's NaN / inf value must not reach the row
          vanilla::pairs::pv_block<true>(P, kBlock, R, V, p.v.stride(1), n, Dv, a, Dv);
        else
          vanilla::pairs::pv_block(P, kBlock, R, V, p.v.stride(1), n, Dv, a, Dv);
      } else {
        if (p.guard_nonfinite_v)
          vanilla::pv_block<DT, true>(P, kBlock, R, V, p.v.stride(1), n, Dv, a, Dv);
        else
          vanilla::pv_block<DT>(P, kBlock, R, V, p.v.stride(1), n, Dv, a, Dv);
      }
    }
  }
}

// The common head dims as compile-time constants: the dot product of one key and row is then
// straight-line code (at D = 128 and one row per kv head, the loop and call overheads around the
// 8 multiply-adds took longer than the multiply-adds).
template <DType DT>
void run_for_head_dim(DecodeJob& job, DecodeScratch& w, i64 t) {
  switch (job.p.D) {
    case 64:
      return run_task<DT, 64>(job, w, t);
    case 128:
      return run_task<DT, 128>(job, w, t);
    default:
      return run_task<DT, 0>(job, w, t);
  }
}

// Merges the splits of row r of (b, hk) in split order (fixed, so the result is deterministic
// for a given thread count), adds the sink to the normaliser, normalises and stores. o: 2 * Dv
// floats (bf16: the accumulators' pair-split order is undone into the second half).
void merge_row(const DecodeJob& job, AttentionBuffers& buffers, i64 b, i64 hk, i64 r, float* o) {
  const AttentionProblem& p = job.p;
  const i64 Hkv = p.Hkv, R = job.R, Dv = p.Dv, Tq = p.Tq;
  const i64 hq = hk * job.G + r / Tq, i = r % Tq;
  auto state = [&](i64 s) -> const vanilla::OnlineRow& {
    return job.part_state[static_cast<std::size_t>(((b * job.nsplit + s) * Hkv + hk) * R + r)];
  };
  float M = vanilla::kNegInf;
  for (i64 s = 0; s < job.nsplit; ++s) M = policy::nan_max(M, state(s).m);  // a NaN split makes the row NaN
  float row_lse = vanilla::kNegInf;
  std::fill(o, o + Dv, 0.f);
  if (M != vanilla::kNegInf) {  // else fully masked: output 0, lse -inf
    float L = 0.f;
    for (i64 s = 0; s < job.nsplit; ++s) {
      if (state(s).m == vanilla::kNegInf) continue;
      const float w = std::exp(state(s).m - M);
      L += state(s).l * w;
      const float* a = job.part_acc + (((b * job.nsplit + s) * Hkv + hk) * R + r) * Dv;
      for (i64 c = 0; c < Dv; ++c) o[c] += w * a[c];
    }
    // The sink takes probability mass (normaliser) but is not part of the lse.
    const float factor = policy::row_factor(M, L, p.sinks ? p.sinks + hq : nullptr);
    for (i64 c = 0; c < Dv; ++c) o[c] = policy::scaled_out(o[c], factor);
    row_lse = policy::row_lse(M, L);
  }
  const i64 es = static_cast<i64>(dtype_size(p.dtype));
  if (p.dtype == DType::bf16) {
    vanilla::pairs::unsplit_row(o, Dv, o + Dv);
    o += Dv;
  }
  vanilla::store_row(o, Dv, p.dtype,
                     static_cast<char*>(buffers.out.data()) + (((b * Tq + i) * p.Hq + hq) * Dv) * es);
  if (buffers.lse) buffers.lse->data_as<float>()[(b * p.Hq + hq) * Tq + i] = row_lse;
}

}  // namespace

const char* vanilla_decode_forward(const AttentionProblem& p, AttentionBuffers& buffers, int threads,
                                   std::int64_t splits) {
  DecodeJob job{p, p.group(), p.group() * p.Tq, splits, 0, nullptr, nullptr};
  job.tasks = p.B * job.nsplit;
  const i64 rows = job.tasks * p.Hkv * job.R;
  threads = static_cast<int>(std::clamp<i64>(job.tasks, 1, threads));
  // All of the call's memory is one per-thread buffer reused from call to call (call_scratch.h:
  // a warmed-up decode step allocates nothing), taken here, before the tasks run: a failure is
  // std::bad_alloc thrown to the dispatch (an Error(out_of_memory) there). Nothing in a task
  // allocates or throws.
  DecodeScratch* scratch = nullptr;
  float* merged = nullptr;
  i64* remaining = nullptr;
  const auto carve = [&](Carve& c) {
    job.part_acc = c.take<float>(rows * p.Dv);
    job.part_state = c.take<vanilla::OnlineRow>(rows);
    scratch = c.take<DecodeScratch>(threads);
    for (int t = 0; t < threads; ++t) {
      DecodeScratch w;
      w.Qs = c.take<float>(p.Hq * p.Tq * p.D);
      w.row = c.take<float>(p.D);
      w.Qh = c.take<std::uint16_t>(kDotBf16 && p.dtype == DType::bf16 ? p.Hq * p.Tq * round_up32(p.D) : 0);
      w.S = c.take<float>(p.Hkv * job.R * kBlock);
      w.rm = c.take<vanilla::RowMask>(p.Hkv * job.R);
      w.head_lo = c.take<i64>(p.Hkv);
      w.head_hi = c.take<i64>(p.Hkv);
      w.head_active = c.take<char>(p.Hkv);
      if (scratch) new (&scratch[t]) DecodeScratch(w);  // trivially copyable: the storage is raw
    }
    merged = c.take<float>(threads * 2 * p.Dv);
    remaining = c.take<i64>(p.B);
  };
  Carve count;
  carve(count);
  Carve real{static_cast<char*>(call_scratch(count.used)), 0};
  carve(real);
  std::fill(job.part_acc, job.part_acc + rows * p.Dv, 0.f);
  std::uninitialized_fill(job.part_state, job.part_state + rows, vanilla::OnlineRow{});
  // Splits of each batch still running: the task that finishes a batch's last split merges that
  // batch (in split order, so the result depends on the split count alone), with no barrier
  // between the partials and the merge for a descheduled thread to hold up.
  std::fill(remaining, remaining + p.B, job.nsplit);

  struct Ctx {
    DecodeJob& job;
    AttentionBuffers& buffers;
    DecodeScratch* scratch;
    float* merged;
    i64* remaining;
  } ctx{job, buffers, scratch, merged, remaining};
  run_tasks(
      threads, job.tasks,
      [](void* c, std::int64_t t, int slot) {
        Ctx& x = *static_cast<Ctx*>(c);
        const AttentionProblem& q = x.job.p;
        DecodeScratch& w = x.scratch[slot];
        switch (q.dtype) {
          case DType::f16:
            run_for_head_dim<DType::f16>(x.job, w, t);
            break;
          case DType::bf16:
            run_for_head_dim<DType::bf16>(x.job, w, t);
            break;
          default:
            run_for_head_dim<DType::f32>(x.job, w, t);
            break;
        }
        const i64 b = t / x.job.nsplit;
        // acq_rel: the last one sees every other split's partials of batch b.
        if (__atomic_sub_fetch(&x.remaining[b], 1, __ATOMIC_ACQ_REL) != 0) return;
        float* o = x.merged + slot * 2 * q.Dv;
        for (i64 hk = 0; hk < q.Hkv; ++hk)
          for (i64 r = 0; r < x.job.R; ++r) merge_row(x.job, x.buffers, b, hk, r, o);
      },
      &ctx);
  return "decode: K/V streamed once, kv split across threads";
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
