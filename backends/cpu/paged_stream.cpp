// Per-tier source (compiled once per ISA tier, see README.md): the stream items of a paged call
// (paged_problem.h, plan_paged): decode and other steps with few query rows per kv head, over
// the keys in the cache's pages. Memory bound, so every K and V byte of a step is read once:
//
//   A task is one work item: sequence s, its q rows [q_begin, q_end) (q_len of them), keys
//   [kv_begin, kv_end) (one split of the sequence). It walks the keys in blocks of kBlock
//   positions, position-major: the row of position j is page_table[s][j / page_size], row
//   j % page_size, and holds [Hkv, D] contiguous, so a page is read in address order.
//   Per block:
//     1. S[hk][r][jj] = scale * q_r . k[j0 + jj, hk]   for all G * q_len rows r of kv head hk
//        (row r = g * q_len + i is q head hk * G + g, query i: the whole GQA group shares each
//        K read), while the same positions' V rows are prefetched
//     2. per row: soft cap, the row's visible keys [lo_i, hi_i) (causal / window / chunk as one
//        interval), online softmax update of (m, l) and rescale of acc
//     3. acc[hk][r] += sum_jj P[hk][r][jj] * v[j0 + jj, hk]   (V rows through their page
//        pointers: a block may span pages of any size, down to one token)
//   A sequence with one split finalises its rows at once (sink in the normaliser, out = acc /
//   denominator, lse = m + log l); with several, each split keeps (m, l, acc) and a merge pass
//   combines them by log-sum-exp in split order.
//
// Batch invariance: an item's result depends only on its sequence (its split boundaries, block
// boundaries from kv_begin, the fixed merge order), and one thread computes a whole item, so a
// sequence's output bits are the same alone or in any batch, at any thread count.
//
// Parallelism is the caller's (paged_cpu.cpp holds the one parallel loop over the work list):
// paged_stream_begin allocates the job and every thread's scratch (std::bad_alloc there becomes
// Error(out_of_memory) in the dispatch), then any thread runs any item and, after all items, any
// merge task; nothing in those allocates or throws.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "attnops/paged_problem.h"
#include "backends/common/softmax_policy.h"
#include "backends/cpu/aligned.h"
#include "backends/cpu/tier_entry.h"
#include "backends/cpu/vanilla_rows.h"
#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu::ATTNOPS_TIER_NS {
namespace {

using vanilla::i64;
using vanilla::kNegInf;
using vanilla::OnlineRow;

// Positions per block (as the dense decode path: one max and one rescale of acc per block and
// row, the block's K and V rows stay in L1/L2).
constexpr i64 kBlock = 32;
// Keys ahead whose K rows are prefetched where the stream crosses into another page.
constexpr i64 kPageAhead = 2;

// pv over a block of value rows given by pointers (they may lie in different pages):
// acc[r * ldacc + c] += sum_j P[r * ldp + j] * vrows[j][c] for r < RR, the accumulators of one
// slice of 16 * kPvVecs columns held in registers while the rows stream through (vanilla_simd.h's
// pv_tile with a row pointer per key). kSkipZeros: a weight of 0 is skipped, not multiplied.
template <DType DT, int RR, bool kSkipZeros>
void pv_rows_tile(const float* P, i64 ldp, const char* const* vrows, i64 voff, i64 n, i64 Dv, float* acc,
                  i64 ldacc) {
  using vanilla::kPvVecs;
  for (i64 c = 0; c < Dv; c += 16 * kPvVecs) {
    int w[kPvVecs];
    for (int u = 0; u < kPvVecs; ++u) {
      const i64 left = Dv - c - 16 * u;
      w[u] = left <= 0 ? 0 : vanilla::lanes_left(left);
    }
    simd::V16 a[RR][kPvVecs];
    for (int r = 0; r < RR; ++r)
      for (int u = 0; u < kPvVecs; ++u) a[r][u] = simd::load_n(acc + r * ldacc + c + 16 * u, w[u]);
    for (i64 j = 0; j < n; ++j) {
      const char* v = vrows[j] + voff;
      simd::V16 vv[kPvVecs];
      for (int u = 0; u < kPvVecs; ++u)
        vv[u] = w[u] ? vanilla::load_elems<DT>(v, c + 16 * u, w[u]) : simd::zero();
      for (int r = 0; r < RR; ++r) {
        const float pr = P[r * ldp + j];
        if (kSkipZeros && pr == 0.f) continue;
        const simd::V16 pj = simd::set1(pr);
        for (int u = 0; u < kPvVecs; ++u) a[r][u] = simd::fma(pj, vv[u], a[r][u]);
      }
    }
    for (int r = 0; r < RR; ++r)
      for (int u = 0; u < kPvVecs; ++u) simd::store_n(acc + r * ldacc + c + 16 * u, a[r][u], w[u]);
  }
}

template <DType DT, bool kSkipZeros>
void pv_rows(const float* P, i64 ldp, i64 R, const char* const* vrows, i64 voff, i64 n, i64 Dv, float* acc,
             i64 ldacc) {
  using vanilla::kDecodeRows;
  for (i64 r0 = 0; r0 < R; r0 += kDecodeRows) {
    const float* p = P + r0 * ldp;
    float* a = acc + r0 * ldacc;
    switch (R - r0 >= kDecodeRows ? kDecodeRows : R - r0) {
      case 4:
        if constexpr (kDecodeRows >= 4) pv_rows_tile<DT, 4, kSkipZeros>(p, ldp, vrows, voff, n, Dv, a, ldacc);
        break;
      case 3:
        if constexpr (kDecodeRows >= 3) pv_rows_tile<DT, 3, kSkipZeros>(p, ldp, vrows, voff, n, Dv, a, ldacc);
        break;
      case 2:
        pv_rows_tile<DT, 2, kSkipZeros>(p, ldp, vrows, voff, n, Dv, a, ldacc);
        break;
      default:
        pv_rows_tile<DT, 1, kSkipZeros>(p, ldp, vrows, voff, n, Dv, a, ldacc);
        break;
    }
  }
}

// Everything one call shares between its tasks.
struct StreamJob {
  const PagedProblem& p;
  const PagedPlan::Data& d;
  PagedBuffers& buffers;
  const std::int32_t* items;  // indices into d.work: whole sequences, in plan order
  i64 n_items = 0;
  i64 G = 1;
  bool guard = false;
  // Partial states of the items of multi-split sequences: item k's rows start at part_row[k]
  // (-1: a single-split item, finalised in place). Rows of an item: [Hkv][G * q_len].
  AlignedArray<i64> part_row;
  AlignedArray<float> part_acc;  // [rows][Dv]
  std::vector<OnlineRow> part_state;
  // Merge groups: list positions of the first split of each multi-split sequence.
  AlignedArray<i64> merge_first;
  i64 n_merge = 0;
};

// Per-thread scratch, sized once per call for the largest item.
struct StreamScratch {
  AlignedArray<float> Qs;     // [Hq][q_len][D] pre-scaled fp32 queries (row r of kv head hk at hk * R + r)
  AlignedArray<float> S;      // [Hkv][R][kBlock]
  AlignedArray<float> acc;    // [Hkv][R][Dv] for single-split items
  std::vector<OnlineRow> st;  // [Hkv][R] for single-split items
  AlignedArray<i64> lo, hi;   // [q_len] visible keys of each query row
  AlignedArray<const char*> kr, vr;  // [kBlock] K / V row pointers (head 0) of the block
};

inline const char* q_row(const PagedProblem& p, i64 n, i64 h) {
  return static_cast<const char*>(p.q.data()) +
         (n * p.q.stride(0) + h * p.q.stride(1)) * static_cast<i64>(dtype_size(p.dtype));
}

// Writes row (n, hq) of the output from an unnormalised accumulator and its (m, l).
void finalise_row(const StreamJob& job, const float* acc, float m, float l, i64 n, i64 hq, float* tmp) {
  const PagedProblem& p = job.p;
  const float factor = policy::row_factor(m, l, p.sinks ? p.sinks + hq : nullptr);
  for (i64 c = 0; c < p.Dv; ++c) tmp[c] = policy::scaled_out(acc[c], factor);
  const i64 es = static_cast<i64>(dtype_size(p.dtype));
  vanilla::store_row(tmp, p.Dv, p.dtype,
                     static_cast<char*>(job.buffers.out.data()) + (n * p.Hq + hq) * p.Dv * es);
  if (job.buffers.lse) job.buffers.lse->data_as<float>()[n * p.Hq + hq] = policy::row_lse(m, l);
}

// Soft cap and the row's visible keys [lo, hi) over the block's logits s[0, n) (keys j0 ...).
inline void finish_logits(const PagedProblem& p, i64 lo, i64 hi, i64 j0, i64 n, float* s) {
  const i64 a = std::clamp(lo - j0, i64{0}, n), e = std::clamp(hi - j0, a, n);
  std::fill(s, s + a, kNegInf);
  std::fill(s + e, s + n, kNegInf);
  if (p.soft_cap && e > a) {
    const float cap = static_cast<float>(*p.soft_cap);
    const simd::V16 capv = simd::set1(cap), inv = simd::set1(1.f / cap);
    for (i64 j = a; j < e; j += 16) {
      const int w = vanilla::lanes_left(e - j);
      simd::store_n(s + j, simd::mul(capv, simd::tanh(simd::mul(simd::load_n(s + j, w), inv))), w);
    }
  }
}

template <DType DT>
void run_item(StreamJob& job, StreamScratch& w, i64 k) {
  const PagedProblem& p = job.p;
  const PagedPlan::Data& d = job.d;
  const PagedWorkItem& it = d.work[static_cast<std::size_t>(job.items[k])];
  const i64 s = it.seq, ql = it.q_end - it.q_begin, G = job.G, R = G * ql, D = p.D, Dv = p.Dv, Hkv = p.Hkv;
  const i64 ps = p.page_size, es = static_cast<i64>(dtype_size(DT));
  const std::int32_t* pages = d.page_ids.data() + d.page_begin[static_cast<std::size_t>(s)];

  bool all_see_all = true;  // every row sees every key of the item (no per-row masking needed)
  for (i64 i = 0; i < ql; ++i) {
    const KeyRange r = visible_keys(d, s, i);
    w.lo[i] = r.lo, w.hi[i] = r.hi;
    all_see_all = all_see_all && r.lo <= it.kv_begin && r.hi >= it.kv_end;
  }
  const float scale = static_cast<float>(p.scale);
  for (i64 hq = 0; hq < p.Hq; ++hq)  // row r of kv head hk at (hk * R + r) * D, r = g * ql + i
    vanilla::load_rows_f32(q_row(p, it.q_begin, hq), p.dtype, p.q.stride(0), ql, D, w.Qs.get() + hq * ql * D,
                           D, scale);

  const bool single = it.num_splits == 1;
  float* acc = single ? w.acc.get() : job.part_acc.get() + job.part_row[k] * Dv;
  OnlineRow* st = single ? w.st.data() : job.part_state.data() + job.part_row[k];
  std::fill(acc, acc + Hkv * R * Dv, 0.f);
  std::fill(st, st + Hkv * R, OnlineRow{});

  const char* kbase = static_cast<const char*>(p.k_pages.data());
  const char* vbase = static_cast<const char*>(p.v_pages.data());
  const i64 khs = p.k_pages.stride(2) * es, vhs = p.v_pages.stride(2) * es;  // bytes between heads
  const i64 krow_stride = p.k_pages.stride(1) * es;                          // bytes between a page's rows
  i64 pi = it.kv_begin / ps, row = it.kv_begin % ps;  // page index and row of the next key
  for (i64 j0 = it.kv_begin; j0 < it.kv_end; j0 += kBlock) {
    const i64 n = std::min(kBlock, it.kv_end - j0);
    for (i64 jj = 0; jj < n; ++jj) {  // the block's row addresses (no division per key)
      w.kr[jj] = kbase + p.k_offset(pages[pi], row, 0) * es;
      w.vr[jj] = vbase + p.v_offset(pages[pi], row, 0) * es;
      if (++row == ps) row = 0, ++pi;
    }
    // 1. Scores, position-major (a page's rows in address order), V prefetched meanwhile.
    // dot_key prefetches K a few rows ahead in memory, which at the end of a page is another
    // page's data: the first rows of the next page are asked for here instead.
    i64 next_row = row, next_pi = pi;  // the key after the block
    for (i64 jj = 0; jj < n; ++jj) {
      if (jj + kPageAhead >= n || (w.kr[jj + kPageAhead] - w.kr[jj]) != kPageAhead * krow_stride) {
        // the key kPageAhead positions on: in this block's list, or past it
        const i64 ahead = jj + kPageAhead;
        const char* kp = nullptr;
        if (ahead < n) {
          kp = w.kr[ahead];
        } else if (j0 + ahead < it.kv_end) {
          i64 r2 = next_row + (ahead - n), p2 = next_pi;
          while (r2 >= ps) r2 -= ps, ++p2;
          kp = kbase + p.k_offset(pages[p2], r2, 0) * es;
        }
        if (kp) vanilla::prefetch_bytes(kp, Hkv * khs);
      }
      for (i64 hk = 0; hk < Hkv; ++hk) {
        vanilla::dot_key<DT>(w.Qs.get() + hk * R * D, D, R, w.kr[jj] + hk * khs, D,
                             w.S.get() + hk * R * kBlock + jj, kBlock);
        vanilla::prefetch_bytes(w.vr[jj] + hk * vhs, Dv * es);
      }
    }
    // 2. Logits -> online softmax, per row.
    for (i64 hk = 0; hk < Hkv; ++hk)
      for (i64 r = 0; r < R; ++r) {
        float* sr = w.S.get() + (hk * R + r) * kBlock;
        if (!all_see_all || p.soft_cap) finish_logits(p, w.lo[r % ql], w.hi[r % ql], j0, n, sr);
        vanilla::online_update(sr, n, st[hk * R + r], acc + (hk * R + r) * Dv, Dv);
      }
    // 3. P.V, head by head, V rows from cache.
    for (i64 hk = 0; hk < Hkv; ++hk) {
      if (job.guard)  // a weight-0 key's NaN / inf value must not reach the row
        pv_rows<DT, true>(w.S.get() + hk * R * kBlock, kBlock, R, w.vr.get(), hk * vhs, n, Dv,
                          acc + hk * R * Dv, Dv);
      else
        pv_rows<DT, false>(w.S.get() + hk * R * kBlock, kBlock, R, w.vr.get(), hk * vhs, n, Dv,
                           acc + hk * R * Dv, Dv);
    }
  }
  if (!single) return;
  float* tmp = w.S.get();  // S is free now: a row's output before rounding (S holds >= Dv floats)
  for (i64 hk = 0; hk < Hkv; ++hk)
    for (i64 r = 0; r < R; ++r)
      finalise_row(job, acc + (hk * R + r) * Dv, st[hk * R + r].m, st[hk * R + r].l, it.q_begin + r % ql,
                   hk * G + r / ql, tmp);
}

// Merges the splits of row r of kv head hk of the sequence whose first split is list position
// k0, in split order, and writes the row.
void merge_row(const StreamJob& job, i64 k0, i64 hk, i64 r, float* o) {
  const PagedProblem& p = job.p;
  const PagedWorkItem& it = job.d.work[static_cast<std::size_t>(job.items[k0])];
  const i64 ql = it.q_end - it.q_begin, R = job.G * ql, Dv = p.Dv, ns = it.num_splits;
  const auto row_of = [&](i64 split) { return job.part_row[k0 + split] + hk * R + r; };
  float M = kNegInf;
  for (i64 x = 0; x < ns; ++x) M = policy::nan_max(M, job.part_state[static_cast<std::size_t>(row_of(x))].m);
  std::fill(o, o + Dv, 0.f);
  float L = 0.f;
  if (M != kNegInf) {  // else fully masked: output 0, lse -inf (l stays 0)
    for (i64 x = 0; x < ns; ++x) {
      const OnlineRow& st = job.part_state[static_cast<std::size_t>(row_of(x))];
      if (st.m == kNegInf) continue;
      const float wgt = std::exp(st.m - M);
      L += st.l * wgt;
      const float* a = job.part_acc.get() + row_of(x) * Dv;
      for (i64 c = 0; c < Dv; ++c) o[c] += wgt * a[c];
    }
  }
  // finalise_row multiplies by the factor in place of o: pass o as both acc and tmp.
  finalise_row(job, o, M, L, it.q_begin + r % ql, hk * job.G + r / ql, o);
}

}  // namespace

namespace {
// A job and every thread's scratch, made by paged_stream_begin.
struct StreamRun {
  StreamJob job;
  std::vector<StreamScratch> scratch;
  AlignedArray<float> merged;  // [threads][Dv]: one merged row per thread
};
}  // namespace

void* paged_stream_begin(const PagedProblem& p, PagedBuffers& buffers, int threads, const std::int32_t* items,
                         std::int64_t n_items, bool guard) {
  const PagedPlan::Data& d = *p.batch;
  auto run = std::unique_ptr<StreamRun>(
      new StreamRun{StreamJob{p, d, buffers, items, n_items, p.group(), guard, {}, {}, {}, {}, 0}, {}, {}});
  StreamJob& job = run->job;
  // Partial rows for multi-split items; the largest item sizes the scratch.
  job.part_row = aligned_array<i64>(n_items);
  job.merge_first = aligned_array<i64>(n_items);
  i64 part_rows = 0, max_rows = 1, max_ql = 1;
  for (i64 k = 0; k < n_items; ++k) {
    const PagedWorkItem& it = d.work[static_cast<std::size_t>(items[k])];
    const i64 ql = it.q_end - it.q_begin, rows = p.Hkv * job.G * ql;
    max_rows = std::max(max_rows, rows), max_ql = std::max(max_ql, ql);
    if (it.num_splits == 1) {
      job.part_row[k] = -1;
    } else {
      job.part_row[k] = part_rows;
      part_rows += rows;
      if (it.split == 0) job.merge_first[job.n_merge++] = k;
    }
  }
  // Everything is allocated here, before any parallel region (see the file comment).
  job.part_acc = aligned_array<float>(part_rows * p.Dv);
  job.part_state.assign(static_cast<std::size_t>(part_rows), OnlineRow{});
  run->scratch.resize(static_cast<std::size_t>(std::max(threads, 1)));
  for (StreamScratch& w : run->scratch) {
    w.Qs = aligned_array<float>(p.Hq * max_ql * p.D);
    w.S = aligned_array<float>(std::max(max_rows * kBlock, p.Dv));
    w.acc = aligned_array<float>(max_rows * p.Dv);
    w.st.resize(static_cast<std::size_t>(max_rows));
    w.lo = aligned_array<i64>(max_ql);
    w.hi = aligned_array<i64>(max_ql);
    w.kr = aligned_array<const char*>(kBlock);
    w.vr = aligned_array<const char*>(kBlock);
  }
  run->merged = aligned_array<float>(std::max(threads, 1) * p.Dv);
  return run.release();
}

void paged_stream_item(void* handle, int thread, std::int64_t k) {
  auto* run = static_cast<StreamRun*>(handle);
  StreamScratch& w = run->scratch[static_cast<std::size_t>(thread)];
  switch (run->job.p.dtype) {
    case DType::f16:
      run_item<DType::f16>(run->job, w, k);
      break;
    case DType::bf16:
      run_item<DType::bf16>(run->job, w, k);
      break;
    default:
      run_item<DType::f32>(run->job, w, k);
      break;
  }
}

std::int64_t paged_stream_merges(const void* handle) {
  const auto* run = static_cast<const StreamRun*>(handle);
  return run->job.n_merge * run->job.p.Hkv;
}

void paged_stream_merge(void* handle, int thread, std::int64_t m) {
  auto* run = static_cast<StreamRun*>(handle);
  const StreamJob& job = run->job;
  const i64 k0 = job.merge_first[m / job.p.Hkv], hk = m % job.p.Hkv;
  const PagedWorkItem& it = job.d.work[static_cast<std::size_t>(job.items[k0])];
  float* o = run->merged.get() + thread * job.p.Dv;
  for (i64 r = 0; r < job.G * (it.q_end - it.q_begin); ++r) merge_row(job, k0, hk, r, o);
}

void paged_stream_end(void* handle) {
  delete static_cast<StreamRun*>(handle);
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
