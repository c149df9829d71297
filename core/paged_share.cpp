#include "core/paged_share.h"

#include <algorithm>
#include <cstring>

#include "attnops/ext/paged_problem.h"

namespace attnops::paged_share {

namespace {

using i64 = std::int64_t;

// Split k of sequence s: its key range, whether every row sees all of it, and its pages.
struct Split {
  i64 b = 0, e = 0;
  bool whole = false;
  const std::int32_t* pages = nullptr;  // the pages of keys [b, e)
  i64 n_pages = 0;
};

Split split_of(const PagedPlanData& d, i64 s, i64 k) {
  const auto si = static_cast<std::size_t>(s);
  const KeyRange u = d.unions[si];
  const i64 T = d.split_tokens, ps = d.cache.page_size;
  Split x;
  x.b = std::max(u.lo, k * T), x.e = std::min(u.hi, (k + 1) * T);
  if (x.e <= x.b) return x;
  const i64 ql = d.q_len[si];
  // Both ends of a row's visible range grow with the row: the last row has the largest lo, the
  // first the smallest hi.
  x.whole = visible_keys(d, s, ql - 1).lo <= x.b && visible_keys(d, s, 0).hi >= x.e;
  x.pages = d.page_ids.data() + d.page_begin[si] + x.b / ps;
  x.n_pages = (x.e - 1) / ps - x.b / ps + 1;
  return x;
}

bool same(const Split& a, const Split& b) {
  return a.b == b.b && a.e == b.e &&
         (a.pages == b.pages ||
          std::memcmp(a.pages, b.pages, static_cast<std::size_t>(a.n_pages) * sizeof(std::int32_t)) == 0);
}

}  // namespace

std::vector<Group> find(PagedPlanData& d, std::vector<std::int32_t>& covered) {
  const i64 S = d.S, T = d.split_tokens, ps = d.cache.page_size;
  covered.assign(static_cast<std::size_t>(S), 0);
  d.in_shared.assign(static_cast<std::size_t>(S), 0);
  std::vector<Group> groups;
  // Candidates: stream sequences keyed by (first split, page of its first key); chains of equal
  // keys in an open-addressing table of twice the sequences (most batches share nothing: one
  // probe each).
  std::size_t cap = 16;
  int bits = 4;
  while (cap < 2 * static_cast<std::size_t>(S)) cap *= 2, ++bits;
  std::vector<std::int32_t> head(cap, -1), next(static_cast<std::size_t>(S), -1), tail(cap, -1);
  std::vector<std::int32_t> order;  // table slots in order of first use
  bool any = false;
  for (i64 s = 0; s < S; ++s) {
    const auto si = static_cast<std::size_t>(s);
    if (!d.is_stream[si] || d.unions[si].hi <= d.unions[si].lo) continue;
    const i64 lo = d.unions[si].lo, f = lo / T;
    const std::int32_t page = d.page_ids[static_cast<std::size_t>(d.page_begin[si] + lo / ps)];
    const std::uint64_t key = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(page)) << 32) ^
                              static_cast<std::uint64_t>(lo) ^ (static_cast<std::uint64_t>(f) << 48);
    // The product's top bits: its low 32 are those of lo and f alone (the page sits above them).
    std::size_t h = static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> (64 - bits));
    for (;; h = (h + 1) & (cap - 1)) {
      const std::int32_t first = head[h];
      if (first < 0) {
        head[h] = tail[h] = static_cast<std::int32_t>(s);
        order.push_back(static_cast<std::int32_t>(h));
        break;
      }
      const auto fi = static_cast<std::size_t>(first);
      if (d.unions[fi].lo == lo && d.page_ids[static_cast<std::size_t>(d.page_begin[fi] + lo / ps)] == page) {
        next[static_cast<std::size_t>(tail[h])] = static_cast<std::int32_t>(s);
        tail[h] = static_cast<std::int32_t>(s);
        any = true;
        break;
      }
    }
  }
  if (!any) return groups;

  // Each chain of two or more: split by split, the members partitioned by agreement with each
  // class's first member; classes of one stop sharing.
  std::vector<std::vector<std::int32_t>> classes, next_classes;
  for (const std::int32_t h : order) {
    const std::int32_t first = head[static_cast<std::size_t>(h)];
    if (next[static_cast<std::size_t>(first)] < 0) continue;
    classes.assign(1, {});
    for (std::int32_t s = first; s >= 0; s = next[static_cast<std::size_t>(s)]) classes[0].push_back(s);
    for (i64 k = d.unions[static_cast<std::size_t>(first)].lo / T; !classes.empty(); ++k) {
      next_classes.clear();
      for (const std::vector<std::int32_t>& c : classes) {
        std::vector<std::vector<std::int32_t>> sub;
        std::vector<Split> leader;
        for (const std::int32_t s : c) {
          const Split x = split_of(d, s, k);
          if (!x.whole) continue;  // s stops sharing here
          std::size_t j = 0;
          while (j < sub.size() && !same(leader[j], x)) ++j;
          if (j == sub.size()) sub.emplace_back(), leader.push_back(x);
          sub[j].push_back(s);
        }
        for (std::size_t j = 0; j < sub.size(); ++j) {
          if (sub[j].size() < 2) continue;
          for (std::size_t at = 0; at < sub[j].size(); at += static_cast<std::size_t>(kMaxMembers)) {
            const std::size_t end = std::min(sub[j].size(), at + static_cast<std::size_t>(kMaxMembers));
            if (end - at < 2 && at > 0) {  // a lone tail joins the previous item's members
              groups.back().member_count += 1;
            } else {
              Group g;
              g.kv_begin = leader[j].b, g.kv_end = leader[j].e;
              g.member_begin = static_cast<std::int32_t>(d.members.size());
              g.member_count = static_cast<std::int32_t>(end - at);
              groups.push_back(g);
            }
            for (std::size_t m = at; m < end; ++m) {
              const auto s = static_cast<std::size_t>(sub[j][m]);
              const i64 f = d.unions[s].lo / T;
              d.members.push_back({sub[j][m], static_cast<std::int32_t>(k - f)});
              covered[s] = static_cast<std::int32_t>(k - f + 1);
              d.in_shared[s] = 1;
            }
          }
          next_classes.push_back(std::move(sub[j]));
        }
      }
      classes.swap(next_classes);
    }
  }
  return groups;
}

}  // namespace attnops::paged_share
