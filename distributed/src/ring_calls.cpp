#include "ring_calls.h"

#include <algorithm>

namespace attnops::dist::detail {

std::vector<LocalCall> step_calls(const std::vector<PairPlan>& pairs, const std::vector<Chunk>& q_chunks,
                                  const KvBlock& kv) {
  std::vector<LocalCall> calls;
  std::int64_t row = 0;
  for (std::size_t a = 0; a < q_chunks.size(); ++a) {
    const Chunk qc = q_chunks[a];
    const std::int64_t r0 = row, r1 = row + qc.size();
    row = r1;
    std::vector<const PairPlan*> mine;
    for (const PairPlan& p : pairs)
      if (p.a == static_cast<int>(a)) mine.push_back(&p);
    if (mine.empty()) continue;
    std::sort(mine.begin(), mine.end(), [](auto* x, auto* y) { return x->b < y->b; });
    // One maskless call when every pair is full and their columns are adjacent in the block.
    bool one = true;
    std::int64_t c_end = -1;
    for (const PairPlan* p : mine) {
      const std::int64_t c0 = kv.column(static_cast<std::size_t>(p->b), p->cols.lo);
      if (!p->full || (c_end >= 0 && c0 != c_end)) one = false;
      c_end = c0 + p->cols.size();
    }
    if (one) {
      LocalCall c;
      c.r0 = r0, c.r1 = r1;
      c.c0 = kv.column(static_cast<std::size_t>(mine.front()->b), mine.front()->cols.lo);
      c.c1 = c_end;
      calls.push_back(c);
      continue;
    }
    for (const PairPlan* p : mine) {
      LocalCall c;
      c.r0 = r0, c.r1 = r1;
      c.c0 = kv.column(static_cast<std::size_t>(p->b), p->cols.lo);
      c.c1 = c.c0 + p->cols.size();
      c.masked = !p->full;
      c.q_global = qc.begin;
      c.k_global = p->cols.lo;
      calls.push_back(c);
    }
  }
  // Maskless calls over the same columns on adjacent rows become one (zigzag: both chunks of a
  // rank against the visiting keys).
  std::vector<LocalCall> merged;
  for (const LocalCall& c : calls) {
    if (!merged.empty()) {
      LocalCall& m = merged.back();
      if (!m.masked && !c.masked && m.c0 == c.c0 && m.c1 == c.c1 && m.r1 == c.r0) {
        m.r1 = c.r1;
        continue;
      }
    }
    merged.push_back(c);
  }
  return merged;
}

std::vector<std::pair<std::int64_t, std::int64_t>> pieces(std::int64_t r0, std::int64_t r1,
                                                          std::int64_t rows) {
  std::vector<std::pair<std::int64_t, std::int64_t>> v;
  if (rows <= 0) rows = std::max<std::int64_t>(r1 - r0, 1);
  // Equal pieces (no thin last one): n pieces of about (r1 - r0) / n rows.
  const std::int64_t n = std::max<std::int64_t>(1, (r1 - r0 + rows - 1) / rows);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t a = r0 + (r1 - r0) * i / n, b = r0 + (r1 - r0) * (i + 1) / n;
    if (b > a) v.emplace_back(a, b);
  }
  return v;
}

bool segments_disjoint(const std::int32_t* seg_q, std::int64_t nq_total, std::int64_t r0, std::int64_t r1,
                       const std::int32_t* seg_k, std::int64_t nk_total, std::int64_t c0, std::int64_t c1,
                       std::int64_t B) {
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int32_t* q = seg_q + b * nq_total;
    const std::int32_t* k = seg_k + b * nk_total;
    const auto [qlo, qhi] = std::minmax_element(q + r0, q + r1);
    const auto [klo, khi] = std::minmax_element(k + c0, k + c1);
    if (!(*qhi < *klo || *khi < *qlo)) return false;
  }
  return true;
}

}  // namespace attnops::dist::detail
