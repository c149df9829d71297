// Per-tier source (compiled once per ISA tier, see README.md): the stream and shared items of a
// paged call (paged_problem.h, plan_paged): decode and other steps with few query rows per kv
// head, over the keys in the cache's pages. Memory bound, so every K and V byte of a step is read
// once, for every q row that needs it:
//
//   A task is one work item: keys [kv_begin, kv_end) (one split) and its members, the sequences
//   whose split it is (one for a stream item; several for a shared item, whose keys lie in the
//   same pages). Its rows are, per kv head hk, the G * q_len rows of each member (row g * q_len + i
//   is q head hk * G + g, query i: the whole GQA group shares each K read), handled in chunks of
//   members of at most kChunkRows rows (a shared item's keys are re-read per chunk, from the
//   caches). A chunk walks the keys in blocks of kBlock positions; position j lives in page
//   page_table[s][j / page_size], row j % page_size. Per block:
//     1. S[hk][r][jj] = scale * q_r . k[j0 + jj]   for every kv head, key by key (a token's row of
//        all heads in address order), the same keys' value rows prefetched into L1 meanwhile
//   then per kv head (x the keys' scales, 8-bit caches):
//     2. per row: soft cap, the row's visible keys [lo_i, hi_i), online softmax update of (m, l)
//        and rescale of acc
//     3. acc[r] += sum_jj P[r][jj] * v[j0 + jj]   (P x the value's scale, 8-bit caches)
//   while the next block's rows are prefetched into L2. A sequence with one split, in no
//   shared item, finalises its rows at once (sink in the normaliser, out = acc / denominator, lse =
//   m + log l); the others keep (m, l, acc) per split and a merge pass combines the splits by
//   log-sum-exp in split order.
//
// Batch invariance: a row's arithmetic depends only on its sequence (its split boundaries, block
// boundaries from kv_begin, the fixed merge order) and never on the rows it is computed beside
// (paged_simd.h), and one thread computes a whole task, so a sequence's output bits are the same
// alone or in any batch, at any thread count, with prefix sharing on or off.
//
// Parallelism is the caller's (paged_cpu.cpp holds the one parallel loop over the work list):
// paged_stream_begin allocates the job and every thread's scratch (std::bad_alloc there becomes
// Error(out_of_memory) in the dispatch), then any thread runs any task and, after all tasks, any
// merge task; nothing in those allocates or throws.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "attnops/ext/paged_problem.h"
#include "backends/common/softmax_policy.h"
#include "backends/cpu/aligned.h"
#include "backends/cpu/paged_simd.h"
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
// Rows per kv head in one chunk of a shared item (its scores, accumulators and weights stay in
// L2 while its keys stream through; a lone member may have more).
constexpr i64 kChunkRows = 32;

// One sequence's split inside a task.
struct Member {
  i64 seq = 0, split = 0, q_begin = 0, ql = 0;
  i64 part = -1;  // its first partial row ([Hkv][G * q_len] rows), or -1: finalised in place
};

struct Task {
  i64 kv_begin = 0, kv_end = 0;
  i64 first = 0, count = 0;  // members [first, first + count) of StreamJob::members
};

// A sequence whose splits are merged: its partial rows start at `part` ([split][Hkv][G * q_len]).
struct Merge {
  i64 seq = 0, q_begin = 0, ql = 0, splits = 0, part = 0;
};

// Everything one call shares between its tasks.
struct StreamJob {
  const PagedProblem& p;
  const PagedPlanData& d;
  PagedBuffers& buffers;
  i64 G = 1;
  bool guard = false;
  std::vector<Task> tasks;
  std::vector<Member> members;
  std::vector<Merge> merges;
  AlignedArray<float> part_acc;  // [partial rows][Dv]
  std::vector<OnlineRow> part_state;
};

// Per-thread scratch, sized once per call for the largest chunk.
struct StreamScratch {
  AlignedArray<float> Qs;               // [Hkv][rows][D] pre-scaled fp32 queries
  AlignedArray<float> S;                // [Hkv][rows][kBlock]
  AlignedArray<float> W;                // [rows][kBlock] weights times the values' scales (8-bit caches)
  AlignedArray<float> acc;              // [Hkv][rows][Dv]
  std::vector<OnlineRow> st;            // [Hkv][rows]
  AlignedArray<i64> lo, hi;             // [rows] visible keys of each row
  AlignedArray<const char*> kr, vr;     // [2][kBlock] K / V row pointers (head 0) of this and the next block
  AlignedArray<const float*> ksr, vsr;  // [kBlock] per-token scale rows (head 0) of the block
  AlignedArray<float> ks, vs;           // [kBlock] the block's scales of one kv head
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

// The row pointers (head 0) of keys [j0, j0 + n) of the pages `pages`.
inline void row_pointers(const PagedProblem& p, const std::int32_t* pages, i64 j0, i64 n, const char** kr,
                         const char** vr) {
  const i64 es = static_cast<i64>(dtype_size(p.kv_dtype)), ps = p.page_size;
  const char* kbase = static_cast<const char*>(p.k_pages.data());
  const char* vbase = static_cast<const char*>(p.v_pages.data());
  i64 pi = j0 / ps, row = j0 % ps;
  for (i64 jj = 0; jj < n; ++jj) {  // no division per key
    kr[jj] = kbase + p.k_offset(pages[pi], row, 0) * es;
    vr[jj] = vbase + p.v_offset(pages[pi], row, 0) * es;
    if (++row == ps) row = 0, ++pi;
  }
}

// Prefetches the per-token scale rows of keys [j0, j0 + n) into L2 (a page's are contiguous: a
// line holds several tokens'): the block reads them before its first P.V, as cold misses
// otherwise.
inline void prefetch_scales(const PagedProblem& p, const std::int32_t* pages, i64 j0, i64 n) {
  const i64 es = static_cast<i64>(sizeof(float)), ps = p.page_size;
  const auto* ksb = static_cast<const char*>(p.k_scales.data());
  const auto* vsb = static_cast<const char*>(p.v_scales.data());
  for (i64 j = j0; j < j0 + n;) {  // one page's rows at a time
    const i64 pi = j / ps, row = j % ps, rows = std::min(ps - row, j0 + n - j);
    const i64 kb =
        (p.ks_offset(pages[pi], row + rows - 1, p.Hkv - 1) - p.ks_offset(pages[pi], row, 0) + 1) * es;
    const i64 vb =
        (p.vs_offset(pages[pi], row + rows - 1, p.Hkv - 1) - p.vs_offset(pages[pi], row, 0) + 1) * es;
    // A caller's strided scale views may spread a page's rows: only compact spans are worth it.
    if (kb > 0 && kb <= 4096) vanilla::prefetch_bytes_l2(ksb + p.ks_offset(pages[pi], row, 0) * es, kb);
    if (vb > 0 && vb <= 4096) vanilla::prefetch_bytes_l2(vsb + p.vs_offset(pages[pi], row, 0) * es, vb);
    j += rows;
  }
}

// Whether the block's K or V codes hold an e4m3 NaN (the exact path then reads the block).
bool block_has_nan(const PagedProblem& p, const char* const* kr, const char* const* vr, i64 n) {
  for (i64 jj = 0; jj < n; ++jj)
    for (i64 hk = 0; hk < p.Hkv; ++hk)
      if (paged_simd::fp8_has_nan(kr[jj] + hk * p.k_pages.stride(2), p.D) ||
          paged_simd::fp8_has_nan(vr[jj] + hk * p.v_pages.stride(2), p.Dv))
        return true;
  return false;
}

// One block of a chunk (rows [0, R) of every kv head; their state in w) over keys [j0, j0 + n).
template <DType KT, bool Exact, bool kSkipZeros>
void run_block(const StreamJob& job, StreamScratch& w, i64 R, bool all_see_all, i64 j0, i64 n,
               const char* const* kr, const char* const* vr, const char* const* next_kr,
               const char* const* next_vr, i64 next_n) {
  const PagedProblem& p = job.p;
  const i64 D = p.D, Dv = p.Dv, es = paged_simd::kBytes<KT>;
  const i64 khs = p.k_pages.stride(2) * es, vhs = p.v_pages.stride(2) * es;  // bytes between heads
  const bool quantized = KT == DType::i8 || KT == DType::fp8_e4m3;
  const float unit = paged_simd::kCodeUnit<KT>;
  // The next block's whole rows, a few lines at every step of the score loops below (measured on
  // the AVX2 tier, 1 thread, decode of 64 sequences: 1.5-2x faster than no prefetch or the whole
  // block at once; adding this block's next head into L1 changed nothing).
  paged_simd::Prefetcher pf{next_kr, next_vr, 0, 0, p.Hkv * khs, p.Hkv * vhs, next_n};
  // AVX2's 8-score tiles for GQA groups (paged_simd.h), by the call's G, never by the chunk's rows.
  const bool tiles8 = job.G > 1;
  pf.pace(p.Hkv * paged_simd::dot_steps(R, n, tiles8));
  // 1. Scores of every kv head, key-major (each token's row of all heads in address order), the
  // same keys' value rows prefetched into L1 as they go (measured on Zen 3, 2 threads, alternating
  // runs: decode of 64 sequences 1.19x, one sequence of 32768 keys 1.34x the head-major walk);
  // then, per head, the keys' scales.
  paged_simd::dot_block<KT, Exact>(w.Qs.get(), R * D, D, R, p.Hkv, kr, khs, vr, vhs, Dv * es, n, D, w.S.get(),
                                   R * kBlock, kBlock, pf, tiles8);
  for (i64 hk = 0; hk < p.Hkv; ++hk) {
    float* S = w.S.get() + hk * R * kBlock;
    if (quantized) {
      float* ks = w.ks.get();
      if (p.per_token_scales()) {
        for (i64 jj = 0; jj < n; ++jj) ks[jj] = w.ksr[jj][hk * p.k_scales.stride(2)];
      } else {
        std::fill(ks, ks + n, p.k_scale);
      }
      for (i64 r = 0; r < R; ++r)
        for (i64 jj = 0; jj < n; ++jj) S[r * kBlock + jj] *= ks[jj];
    }
    // 2. Logits -> online softmax, per row.
    for (i64 r = 0; r < R; ++r) {
      float* sr = S + r * kBlock;
      if (!all_see_all || p.soft_cap) finish_logits(p, w.lo[r], w.hi[r], j0, n, sr);
      vanilla::online_update(sr, n, w.st[static_cast<std::size_t>(hk * R + r)],
                             w.acc.get() + (hk * R + r) * Dv, Dv);
    }
    // 3. P.V (the weights times the values' scales, 8-bit caches).
    const float* P = S;
    if (quantized) {
      float* vs = w.vs.get();
      if (p.per_token_scales()) {
        for (i64 jj = 0; jj < n; ++jj) vs[jj] = w.vsr[jj][hk * p.v_scales.stride(2)] * unit;
      } else {
        std::fill(vs, vs + n, p.v_scale * unit);
      }
      float* W = w.W.get();
      for (i64 r = 0; r < R; ++r)
        for (i64 jj = 0; jj < n; ++jj) W[r * kBlock + jj] = S[r * kBlock + jj] * vs[jj];
      P = W;
    }
    paged_simd::pv_block<KT, Exact, kSkipZeros>(P, kBlock, R, vr, hk * vhs, n, Dv, w.acc.get() + hk * R * Dv,
                                                Dv);
  }
  pf.finish();
}

// Members [m0, m1) of a task as one chunk: their rows of every kv head over the task's keys.
template <DType KT, bool kSkipZeros>
void run_chunk(StreamJob& job, StreamScratch& w, const Task& t, i64 m0, i64 m1) {
  const PagedProblem& p = job.p;
  const PagedPlanData& d = job.d;
  const i64 G = job.G, D = p.D, Dv = p.Dv, Hkv = p.Hkv;
  i64 R = 0;  // rows per kv head
  for (i64 m = m0; m < m1; ++m) R += G * job.members[static_cast<std::size_t>(m)].ql;

  // Queries (scaled; x 256 for fp8 codes read as code x 2^-8) and each row's visible keys.
  const float qmul = static_cast<float>(p.scale);
  bool all_see_all = true;  // every row sees every key of the task (no per-row masking needed)
  i64 row0 = 0;
  for (i64 m = m0; m < m1; ++m) {
    const Member& mb = job.members[static_cast<std::size_t>(m)];
    for (i64 hq = 0; hq < p.Hq; ++hq) {  // row g * ql + i of kv head hq / G
      float* dst = w.Qs.get() + ((hq / G) * R + row0 + (hq % G) * mb.ql) * D;
      vanilla::load_rows_f32(q_row(p, mb.q_begin, hq), p.dtype, p.q.stride(0), mb.ql, D, dst, D, qmul);
      if (paged_simd::kCodeUnit<KT> != 1.f)
        for (i64 x = 0; x < mb.ql * D; ++x) dst[x] *= paged_simd::kCodeUnit<KT>;
    }
    for (i64 r = 0; r < G * mb.ql; ++r) {
      const KeyRange kr = visible_keys(d, mb.seq, r % mb.ql);
      w.lo[row0 + r] = kr.lo, w.hi[row0 + r] = kr.hi;
      all_see_all = all_see_all && kr.lo <= t.kv_begin && kr.hi >= t.kv_end;
    }
    row0 += G * mb.ql;
  }
  std::fill(w.acc.get(), w.acc.get() + Hkv * R * Dv, 0.f);
  std::fill(w.st.begin(), w.st.begin() + Hkv * R, OnlineRow{});

  // Keys through the first member's pages (a shared item's members have these keys in them too).
  const Member& lead = job.members[static_cast<std::size_t>(m0)];
  const std::int32_t* pages = d.page_ids.data() + d.page_begin[static_cast<std::size_t>(lead.seq)];
  const char** kr[2] = {w.kr.get(), w.kr.get() + kBlock};
  const char** vr[2] = {w.vr.get(), w.vr.get() + kBlock};
  i64 n = std::min(kBlock, t.kv_end - t.kv_begin);
  row_pointers(p, pages, t.kv_begin, n, kr[0], vr[0]);
  for (i64 jj = 0; jj < n; ++jj) {  // the first block was not prefetched by a previous one
    vanilla::prefetch_bytes(kr[0][jj], Hkv * p.k_pages.stride(2) * paged_simd::kBytes<KT>);
    vanilla::prefetch_bytes(vr[0][jj], Hkv * p.v_pages.stride(2) * paged_simd::kBytes<KT>);
  }
  const i64 es = static_cast<i64>(sizeof(float));
  for (i64 j0 = t.kv_begin, b = 0; j0 < t.kv_end; j0 += kBlock, b ^= 1) {
    const i64 next_n = std::min(kBlock, std::max<i64>(t.kv_end - j0 - kBlock, 0));
    if (next_n > 0) {
      row_pointers(p, pages, j0 + kBlock, next_n, kr[b ^ 1], vr[b ^ 1]);
      if (p.per_token_scales()) prefetch_scales(p, pages, j0 + kBlock, next_n);
    }
    if (p.per_token_scales()) {
      const auto* ksb = static_cast<const char*>(p.k_scales.data());
      const auto* vsb = static_cast<const char*>(p.v_scales.data());
      i64 pi = j0 / p.page_size, row = j0 % p.page_size;
      for (i64 jj = 0; jj < n; ++jj) {
        w.ksr[jj] = reinterpret_cast<const float*>(ksb + p.ks_offset(pages[pi], row, 0) * es);
        w.vsr[jj] = reinterpret_cast<const float*>(vsb + p.vs_offset(pages[pi], row, 0) * es);
        if (++row == p.page_size) row = 0, ++pi;
      }
    }
    if (KT == DType::fp8_e4m3 && block_has_nan(p, kr[b], vr[b], n))
      run_block<KT, true, kSkipZeros>(job, w, R, all_see_all, j0, n, kr[b], vr[b], kr[b ^ 1], vr[b ^ 1],
                                      next_n);
    else
      run_block<KT, false, kSkipZeros>(job, w, R, all_see_all, j0, n, kr[b], vr[b], kr[b ^ 1], vr[b ^ 1],
                                       next_n);
    n = next_n;
  }

  // Finalise in place, or keep the split's state for the merge.
  float* tmp = w.W.get();  // free now: a row's output before rounding (W holds >= Dv floats)
  row0 = 0;
  for (i64 m = m0; m < m1; ++m) {
    const Member& mb = job.members[static_cast<std::size_t>(m)];
    const i64 Rm = G * mb.ql;
    for (i64 hk = 0; hk < Hkv; ++hk)
      for (i64 r = 0; r < Rm; ++r) {
        const i64 at = hk * R + row0 + r;
        const OnlineRow& st = w.st[static_cast<std::size_t>(at)];
        if (mb.part < 0) {
          finalise_row(job, w.acc.get() + at * Dv, st.m, st.l, mb.q_begin + r % mb.ql, hk * G + r / mb.ql,
                       tmp);
        } else {
          const i64 to = mb.part + hk * Rm + r;
          std::memcpy(job.part_acc.get() + to * Dv, w.acc.get() + at * Dv, static_cast<std::size_t>(Dv) * 4u);
          job.part_state[static_cast<std::size_t>(to)] = st;
        }
      }
    row0 += Rm;
  }
}

template <DType KT, bool kSkipZeros>
void run_task(StreamJob& job, StreamScratch& w, const Task& t) {
  // Chunks of whole members, at most kChunkRows rows each (a larger member alone).
  for (i64 m0 = t.first, end = t.first + t.count; m0 < end;) {
    i64 m1 = m0 + 1, rows = job.G * job.members[static_cast<std::size_t>(m0)].ql;
    while (m1 < end && rows + job.G * job.members[static_cast<std::size_t>(m1)].ql <= kChunkRows)
      rows += job.G * job.members[static_cast<std::size_t>(m1++)].ql;
    run_chunk<KT, kSkipZeros>(job, w, t, m0, m1);
    m0 = m1;
  }
}

template <DType KT>
void run_task(StreamJob& job, StreamScratch& w, const Task& t) {
  if (job.guard)  // a weight-0 key's NaN / inf value must not reach the row
    run_task<KT, true>(job, w, t);
  else
    run_task<KT, false>(job, w, t);
}

// Merges the splits of row r of kv head hk of a merged sequence, in split order, and writes it.
void merge_row(const StreamJob& job, const Merge& g, i64 hk, i64 r, float* o) {
  const PagedProblem& p = job.p;
  const i64 R = job.G * g.ql, Dv = p.Dv;
  const auto row_of = [&](i64 split) { return g.part + (split * p.Hkv + hk) * R + r; };
  float M = kNegInf;
  for (i64 x = 0; x < g.splits; ++x)
    M = policy::nan_max(M, job.part_state[static_cast<std::size_t>(row_of(x))].m);
  std::fill(o, o + Dv, 0.f);
  float L = 0.f;
  if (M != kNegInf) {  // else fully masked: output 0, lse -inf (l stays 0)
    for (i64 x = 0; x < g.splits; ++x) {
      const OnlineRow& st = job.part_state[static_cast<std::size_t>(row_of(x))];
      if (st.m == kNegInf) continue;
      const float wgt = std::exp(st.m - M);
      L += st.l * wgt;
      const float* a = job.part_acc.get() + row_of(x) * Dv;
      for (i64 c = 0; c < Dv; ++c) o[c] += wgt * a[c];
    }
  }
  // finalise_row multiplies by the factor in place of o: pass o as both acc and tmp.
  finalise_row(job, o, M, L, g.q_begin + r % g.ql, hk * job.G + r / g.ql, o);
}

// A job and every thread's scratch, made by paged_stream_begin.
struct StreamRun {
  StreamJob job;
  std::vector<StreamScratch> scratch;
  AlignedArray<float> merged;  // [threads][Dv]: one merged row per thread
};

// The partial rows of sequence s (merged: several splits, or a split in a shared item), made on
// first use: its first partial row, or -1.
i64 part_of(StreamJob& job, i64* part, i64 s, i64& rows, bool shared_counts) {
  const auto si = static_cast<std::size_t>(s);
  const PagedPlanData& d = job.d;
  if (part[si] != -2) return part[si];
  const i64 splits = d.num_splits[si];
  if (splits <= 1 && !(shared_counts && d.in_shared[si])) return part[si] = -1;
  part[si] = rows;
  const i64 R = job.G * d.q_len[si];
  job.merges.push_back({s, d.q_begin[si], d.q_len[si], splits, rows});
  rows += splits * job.p.Hkv * R;
  return part[si];
}

}  // namespace

void* paged_stream_begin(const PagedProblem& p, PagedBuffers& buffers, int threads, const std::int32_t* items,
                         std::int64_t n_items, bool guard) {
  const PagedPlanData& d = *p.batch;
  auto run = std::unique_ptr<StreamRun>(
      new StreamRun{StreamJob{p, d, buffers, p.group(), guard, {}, {}, {}, {}, {}}, {}, {}});
  StreamJob& job = run->job;
  // Partial rows are laid out per merged sequence, [split][Hkv][G * q_len], in order of first use.
  AlignedArray<i64> part_of_seq = aligned_array<i64>(d.S);
  i64* part = part_of_seq.get();
  std::fill(part, part + d.S, i64{-2});
  i64 part_rows = 0, max_rows = 1;
  const auto add_member = [&](i64 s, i64 split, bool shared_counts) {
    const auto si = static_cast<std::size_t>(s);
    Member mb;
    mb.seq = s, mb.split = split, mb.q_begin = d.q_begin[si], mb.ql = d.q_len[si];
    const i64 base = part_of(job, part, s, part_rows, shared_counts);
    mb.part = base < 0 ? -1 : base + split * p.Hkv * job.G * mb.ql;
    job.members.push_back(mb);
  };
  const i64 T = d.split_tokens;
  for (i64 k = 0; k < n_items; ++k) {
    Task t;
    t.first = static_cast<i64>(job.members.size());
    if (!guard) {  // work items: shared or stream
      const PagedWorkItem& it = d.work[static_cast<std::size_t>(items[k])];
      t.kv_begin = it.kv_begin, t.kv_end = it.kv_end;
      if (it.kind == PagedWorkKind::shared) {
        for (i64 m = 0; m < it.member_count; ++m) {
          const PagedSharedMember& sm = d.members[static_cast<std::size_t>(it.member_begin + m)];
          add_member(sm.seq, sm.split, true);
        }
      } else {
        add_member(it.seq, it.split, true);
      }
      t.count = static_cast<i64>(job.members.size()) - t.first;
      job.tasks.push_back(t);
    } else {  // a stream sequence, split by split, unshared
      const i64 s = items[k];
      const KeyRange u = d.unions[static_cast<std::size_t>(s)];
      for (i64 x = u.lo / T; x * T < u.hi; ++x) {
        t.first = static_cast<i64>(job.members.size());
        t.kv_begin = std::max(u.lo, x * T), t.kv_end = std::min(u.hi, (x + 1) * T);
        add_member(s, x - u.lo / T, false);
        t.count = 1;
        job.tasks.push_back(t);
      }
    }
  }
  // The largest chunk sizes the scratch (run_task's chunking, replayed).
  for (const Task& t : job.tasks)
    for (i64 m0 = t.first, end = t.first + t.count; m0 < end;) {
      i64 m1 = m0 + 1, rows = job.G * job.members[static_cast<std::size_t>(m0)].ql;
      while (m1 < end && rows + job.G * job.members[static_cast<std::size_t>(m1)].ql <= kChunkRows)
        rows += job.G * job.members[static_cast<std::size_t>(m1++)].ql;
      max_rows = std::max(max_rows, rows);
      m0 = m1;
    }
  // Everything is allocated here, before any parallel region (see the file comment).
  job.part_acc = aligned_array<float>(part_rows * p.Dv);
  job.part_state.assign(static_cast<std::size_t>(part_rows), OnlineRow{});
  run->scratch.resize(static_cast<std::size_t>(std::max(threads, 1)));
  for (StreamScratch& w : run->scratch) {
    w.Qs = aligned_array<float>(p.Hkv * max_rows * p.D);
    w.S = aligned_array<float>(p.Hkv * max_rows * kBlock);
    w.W = aligned_array<float>(std::max(max_rows * kBlock, p.Dv));
    w.acc = aligned_array<float>(p.Hkv * max_rows * p.Dv);
    w.st.resize(static_cast<std::size_t>(p.Hkv * max_rows));
    w.lo = aligned_array<i64>(max_rows);
    w.hi = aligned_array<i64>(max_rows);
    w.kr = aligned_array<const char*>(2 * kBlock);
    w.vr = aligned_array<const char*>(2 * kBlock);
    w.ksr = aligned_array<const float*>(kBlock);
    w.vsr = aligned_array<const float*>(kBlock);
    w.ks = aligned_array<float>(kBlock);
    w.vs = aligned_array<float>(kBlock);
  }
  run->merged = aligned_array<float>(std::max(threads, 1) * p.Dv);
  return run.release();
}

std::int64_t paged_stream_tasks(const void* handle) {
  return static_cast<std::int64_t>(static_cast<const StreamRun*>(handle)->job.tasks.size());
}

void paged_stream_item(void* handle, int thread, std::int64_t k) {
  auto* run = static_cast<StreamRun*>(handle);
  StreamScratch& w = run->scratch[static_cast<std::size_t>(thread)];
  const Task& t = run->job.tasks[static_cast<std::size_t>(k)];
  switch (run->job.p.kv_dtype) {
    case DType::f16:
      run_task<DType::f16>(run->job, w, t);
      break;
    case DType::bf16:
      run_task<DType::bf16>(run->job, w, t);
      break;
    case DType::i8:
      run_task<DType::i8>(run->job, w, t);
      break;
    case DType::fp8_e4m3:
      run_task<DType::fp8_e4m3>(run->job, w, t);
      break;
    default:
      run_task<DType::f32>(run->job, w, t);
      break;
  }
}

std::int64_t paged_stream_merges(const void* handle) {
  const auto* run = static_cast<const StreamRun*>(handle);
  return static_cast<std::int64_t>(run->job.merges.size()) * run->job.p.Hkv;
}

void paged_stream_merge(void* handle, int thread, std::int64_t m) {
  auto* run = static_cast<StreamRun*>(handle);
  const StreamJob& job = run->job;
  const Merge& g = job.merges[static_cast<std::size_t>(m / job.p.Hkv)];
  const i64 hk = m % job.p.Hkv;
  float* o = run->merged.get() + thread * job.p.Dv;
  for (i64 r = 0; r < job.G * g.ql; ++r) merge_row(job, g, hk, r, o);
}

void paged_stream_end(void* handle) {
  delete static_cast<StreamRun*>(handle);
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS
