// The local operator calls of one ring step: rectangles of this rank's query rows against
// columns of the current key block. Pairs of chunks that every row sees completely become
// maskless calls (merged across chunks when their rows and columns are adjacent); the others
// carry the static mask at their global offset (Mask::at_offset). Each call is cut into pieces
// of at most `progress_rows` rows, between which the transport is progressed.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnops/dist/layout.h"
#include "attnops/mask.h"
#include "kv_block.h"
#include "ring_plan.h"

namespace attnops::dist::detail {

struct LocalCall {
  std::int64_t r0 = 0, r1 = 0;  // local query rows
  std::int64_t c0 = 0, c1 = 0;  // columns of the key block
  bool masked = false;
  std::int64_t q_global = 0, k_global = 0;  // global positions of r0 and c0 (masked calls)
  // The mask of rows [r0 + dr, ...) (pieces start further down).
  Mask mask_at(const Mask& global, std::int64_t dr, std::int64_t Tq, std::int64_t Tk) const {
    return global.at_offset(q_global + dr, k_global, Tq, Tk);
  }
};

std::vector<LocalCall> step_calls(const std::vector<PairPlan>& pairs, const std::vector<Chunk>& q_chunks,
                                  const KvBlock& kv);

// [begin, end) row ranges of at most `rows` rows covering [r0, r1) (rows <= 0: one piece).
std::vector<std::pair<std::int64_t, std::int64_t>> pieces(std::int64_t r0, std::int64_t r1,
                                                          std::int64_t rows);

// Whether segment ids rule out every (row, column) pair of a piece: per batch, the rows' and the
// columns' id ranges do not overlap (a cheap test; exact for sorted, packed-sequence ids).
bool segments_disjoint(const std::int32_t* seg_q, std::int64_t nq_total, std::int64_t r0, std::int64_t r1,
                       const std::int32_t* seg_k, std::int64_t nk_total, std::int64_t c0, std::int64_t c1,
                       std::int64_t B);

}  // namespace attnops::dist::detail
