#include "ring_plan.h"

#include <algorithm>

#include "attnops/error.h"

namespace attnops::dist::detail {

PairClass classify(const Mask& mask, std::int64_t Hq, const Chunk& qc, const Chunk& kc, std::int64_t Tq,
                   std::int64_t Tk) {
  PairClass r;
  if (qc.size() <= 0 || kc.size() <= 0) return r;
  const std::int64_t heads = mask.head_dependent() ? Hq : 1;
  std::int64_t lo = kc.end, hi = kc.begin, visible = 0;
  bool full = true;
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t i = qc.begin; i < qc.end; ++i) {
      if (auto iv = mask.row_interval(h, i, Tq, Tk)) {
        const std::int64_t a = std::max(iv->first, kc.begin), b = std::min(iv->second, kc.end);
        if (a < b) {
          lo = std::min(lo, a), hi = std::max(hi, b);
          visible += b - a;
        }
        if (a != kc.begin || b != kc.end) full = false;
      } else {  // not an interval (an | with a gap): column by column
        for (std::int64_t j = kc.begin; j < kc.end; ++j) {
          if (mask.visible(h, i, j, Tq, Tk)) {
            lo = std::min(lo, j), hi = std::max(hi, j + 1);
            ++visible;
          } else {
            full = false;
          }
        }
      }
    }
  if (hi <= lo) return r;
  r.cols = {lo, hi};
  r.full = full;
  r.visible = static_cast<double>(visible) / static_cast<double>(heads);
  return r;
}

RingPlan::RingPlan(Communicator& comm, const Mask& mask, std::int64_t Hq, const ShardLayout& ql,
                   const ShardLayout& kl)
    : P_(comm.size()) {
  const int me = comm.rank();
  const auto P = static_cast<std::size_t>(P_);
  const std::size_t nb = kl.chunks(0).size();  // key chunks per rank (the same on every rank)
  const std::int64_t Tq = ql.length(), Tk = kl.length();

  // This rank's pairs and, per source and key chunk, the columns it needs.
  pairs_.resize(P);
  visible_.assign(P, 0.0);
  std::vector<std::int64_t> mine(P * nb * 2, 0);  // [source][b] (lo, hi)
  for (int s = 0; s < P_; ++s) {
    const auto su = static_cast<std::size_t>(s);
    const auto& kcs = kl.chunks(s);
    std::vector<Range> need(nb);
    for (std::size_t a = 0; a < ql.chunks(me).size(); ++a)
      for (std::size_t b = 0; b < nb; ++b) {
        const PairClass c = classify(mask, Hq, ql.chunks(me)[a], kcs[b], Tq, Tk);
        if (c.cols.empty()) continue;
        pairs_[su].push_back({static_cast<int>(a), static_cast<int>(b), c.full, c.cols});
        visible_[su] += c.visible;
        Range& n = need[b];
        n = n.empty() ? c.cols : Range{std::min(n.lo, c.cols.lo), std::max(n.hi, c.cols.hi)};
      }
    for (std::size_t b = 0; b < nb; ++b) {
      mine[(su * nb + b) * 2] = need[b].lo;
      mine[(su * nb + b) * 2 + 1] = need[b].hi;
    }
  }
  std::vector<std::int64_t> all(P * mine.size());
  comm.allgather(mine.data(), mine.size() * sizeof(std::int64_t), all.data());
  const auto need = [&](int r, int s, std::size_t b) {
    const std::size_t at =
        static_cast<std::size_t>(r) * mine.size() + (static_cast<std::size_t>(s) * nb + b) * 2;
    return Range{all[at], all[at + 1]};
  };

  // Per source: how far its keys travel, and what each message carries (the union of what every
  // later rank on the ring needs).
  steps_of_.assign(P, 1);
  msg_.assign(P, {});
  S_ = 1;
  for (int s = 0; s < P_; ++s) {
    const auto su = static_cast<std::size_t>(s);
    int last = 0;
    for (int t = 1; t < P_; ++t)
      for (std::size_t b = 0; b < nb; ++b)
        if (!need((s + t) % P_, s, b).empty()) last = t;
    steps_of_[su] = last + 1;
    S_ = std::max(S_, last + 1);
    msg_[su].assign(P, std::vector<Range>(nb));
    for (int t = last; t >= 1; --t)
      for (std::size_t b = 0; b < nb; ++b) {
        Range u = t < last ? msg_[su][static_cast<std::size_t>(t + 1)][b] : Range{};
        const Range n = need((s + t) % P_, s, b);
        if (!n.empty()) u = u.empty() ? n : Range{std::min(u.lo, n.lo), std::max(u.hi, n.hi)};
        msg_[su][static_cast<std::size_t>(t)][b] = u;
      }
  }
}

const std::vector<Range>& RingPlan::message(int s, int t) const {
  if (s < 0 || s >= P_ || t < 1 || t >= P_)
    throw Error(ErrorCode::internal, "RingPlan::message out of range");
  return msg_[static_cast<std::size_t>(s)][static_cast<std::size_t>(t)];
}

bool RingPlan::has_message(int s, int t) const {
  if (t < 1 || t >= steps_of(s)) return false;
  for (const Range& r : message(s, t))
    if (!r.empty()) return true;
  return false;
}

}  // namespace attnops::dist::detail
