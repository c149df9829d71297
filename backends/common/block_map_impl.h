// BlockMap: the static mask of one (Hq, Tq, Tk) reduced to tiles of bq query rows x bk key
// columns (JAX Splash's MaskInfo, FlexAttention's BlockMask).
//
// Query block qb covers rows [qb*bq, min((qb+1)*bq, Tq)), kv block kb covers columns
// [kb*bk, min((kb+1)*bk, Tk)). Every tile is classified once, exactly:
//   empty    no visible (i, j): the kernels never visit it (it is not listed at all);
//   full     every (i, j) of the tile is visible: the kernels evaluate no mask there;
//   partial  some visible: the kernels apply the tile's bitset.
// Bitsets of partial tiles are stored once per distinct content (a causal mask with bq == bk and
// Tq == Tk has one distinct diagonal tile however long the sequence), as bq rows of
// words_per_row 64-bit words; bit c of row r (word c / 64, bit c % 64) says whether local column
// c of local row r is visible. Bits outside [0, Tq) x [0, Tk) are 0.
//
// A map is per q head only when the mask is head dependent (per_head); otherwise one copy
// (heads == 1) serves every head. Segment ids are data, not part of the map.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attnops/mask.h"
#include "backends/common/block_map.h"

namespace attnops {

struct BlockMap {
  // One non-empty tile of a q block's row: the kv block index and how to mask it.
  struct Block {
    std::int32_t kv = 0;        // kv block index kb
    std::int32_t partial = -1;  // -1 = full (no mask); else the index of its bitset
    bool is_full() const { return partial < 0; }
  };

  std::int64_t Tq = 0, Tk = 0, bq = 0, bk = 0;
  std::int64_t nq = 0, nk = 0;     // number of q blocks / kv blocks (ceil division)
  std::int64_t heads = 1;          // 1 (shared by all q heads) or Hq (head dependent mask)
  std::int64_t words_per_row = 1;  // ceil(bk / 64)

  // Row (head copy hh, q block qb) lists blocks[row_start[hh*nq+qb] .. row_start[hh*nq+qb+1]),
  // in increasing kv order.
  std::vector<std::int64_t> row_start;
  std::vector<Block> blocks;
  std::vector<std::uint64_t> bits;  // num_unique_partial * bq * words_per_row words
  // The same bitsets transposed (column-major), for kernels whose vector lanes run over query
  // rows: bk columns of words_per_col = ceil(bq / 64) words; bit r of column c = (r, c).
  std::int64_t words_per_col = 1;
  std::vector<std::uint64_t> bits_t;  // num_unique_partial * bk * words_per_col words

  // Tile counts over all head copies (each copy has nq * nk tiles).
  std::int64_t num_empty = 0, num_full = 0, num_partial = 0;
  std::int64_t num_unique_partial = 0;  // distinct partial bitsets stored
  double visible_pairs = 0;             // visible (i, j) pairs summed over the head copies

  // The head copy q head h uses.
  std::int64_t head_copy(std::int64_t h) const { return heads == 1 ? 0 : h; }
  std::span<const Block> row(std::int64_t h, std::int64_t qb) const {
    const std::int64_t r = head_copy(h) * nq + qb;
    return {blocks.data() + row_start[static_cast<std::size_t>(r)],
            static_cast<std::size_t>(row_start[static_cast<std::size_t>(r) + 1] -
                                     row_start[static_cast<std::size_t>(r)])};
  }
  // Local row r of partial bitset `index` (words_per_row words).
  const std::uint64_t* partial_row(std::int32_t index, std::int64_t r) const {
    return bits.data() + (static_cast<std::int64_t>(index) * bq + r) * words_per_row;
  }
  // Local column c of partial bitset `index`, transposed (words_per_col words).
  const std::uint64_t* partial_col(std::int32_t index, std::int64_t c) const {
    return bits_t.data() + (static_cast<std::int64_t>(index) * bk + c) * words_per_col;
  }
  bool partial_visible(std::int32_t index, std::int64_t r, std::int64_t c) const {
    return (partial_row(index, r)[c >> 6] >> (c & 63)) & 1u;
  }
  // Visible pairs of one q head on average (exact per head when the map is shared); FLOP
  // accounting uses visible_pairs_per_head() * Hq.
  double visible_pairs_per_head() const { return visible_pairs / static_cast<double>(heads); }
  std::int64_t num_blocks() const { return static_cast<std::int64_t>(blocks.size()); }
};

// Builds a map without the cache (tests, and get_block_map on a miss). Throws Error
// invalid_argument for Hq, bq or bk < 1 or Tq, Tk < 0, shape_mismatch when a head dependent mask was built
// for a different number of heads than Hq.
BlockMap build_block_map(const Mask& mask, std::int64_t Hq, std::int64_t Tq, std::int64_t Tk, std::int64_t bq,
                         std::int64_t bk);

// Drops every cached map (tests).
void clear_block_map_cache();

}  // namespace attnops
