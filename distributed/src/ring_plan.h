// The plan of one ring call, the same on every rank: which (query chunk, key chunk) pairs each
// rank computes at each step, how many steps the ring runs and which key columns each message
// carries. Built from the static mask on global positions, so blocks no row sees are neither
// computed nor sent (a sliding window's ring stops after the steps that reach a neighbour, and
// its messages carry only the keys the window reaches). Segment ids are data: blocks they mask
// are skipped at compute time only (ring_forward.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "attnops/dist/communicator.h"
#include "attnops/dist/layout.h"
#include "attnops/mask.h"

namespace attnops::dist::detail {

// Columns [lo, hi) in global key positions (empty when lo >= hi).
struct Range {
  std::int64_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
  std::int64_t size() const { return empty() ? 0 : hi - lo; }
  bool operator==(const Range&) const = default;
};

// One query chunk `a` of this rank against key chunk `b` of a source rank.
struct PairPlan {
  int a = 0, b = 0;
  bool full = false;  // every row sees every column of `cols` (no mask needed)
  Range cols;         // the columns any row of the pair sees (bounding range), within chunk b
};

class RingPlan {
 public:
  // Collective: every rank computes its own needs, one allgather shares them.
  RingPlan(Communicator& comm, const Mask& mask, std::int64_t Hq, const ShardLayout& q_layout,
           const ShardLayout& kv_layout);

  int ranks() const { return P_; }
  // Ring steps every rank runs (>= 1); step t computes the keys of source (rank - t) mod P.
  int steps() const { return S_; }
  int source(int rank, int step) const { return ((rank - step) % P_ + P_) % P_; }
  // The key columns of source s (per chunk b of s) the message of step t carries (t >= 1); step
  // 0 uses the source's own shard (every column). Empty everywhere once no later rank needs s.
  const std::vector<Range>& message(int s, int t) const;
  bool has_message(int s, int t) const;
  // Steps the keys of source s travel (1 + the last step whose rank sees them).
  int steps_of(int s) const { return steps_of_[static_cast<std::size_t>(s)]; }
  // This rank's non-empty pairs against source s.
  const std::vector<PairPlan>& pairs(int s) const { return pairs_[static_cast<std::size_t>(s)]; }
  // Visible (query, key) pairs per head this rank computes against source s (for statistics).
  double visible_pairs(int s) const { return visible_[static_cast<std::size_t>(s)]; }

 private:
  int P_ = 1, S_ = 1;
  std::vector<int> steps_of_;                         // [source]
  std::vector<std::vector<std::vector<Range>>> msg_;  // [source][step][chunk b]
  std::vector<std::vector<PairPlan>> pairs_;          // [source], this rank's
  std::vector<double> visible_;                       // [source]
};

// The columns of key chunk `kc` the rows of query chunk `qc` see under `mask` (all heads; global
// (Tq, Tk)), whether every row sees all of them, and the number of visible pairs per head
// (averaged over heads for a per-head mask).
struct PairClass {
  Range cols;
  bool full = false;
  double visible = 0;
};
PairClass classify(const Mask& mask, std::int64_t Hq, const Chunk& qc, const Chunk& kc, std::int64_t Tq,
                   std::int64_t Tk);

}  // namespace attnops::dist::detail
