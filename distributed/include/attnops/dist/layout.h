// How a sequence is split over ranks, and helpers to shard and unshard tensors.
//
//   contiguous  P chunks; rank r holds chunk r. For non-causal attention and sliding windows
//               (every rank's rows cost the same; a window needs only its neighbour's keys).
//   zigzag      2P chunks; rank r holds chunks r and 2P-1-r (in that order). Causal attention
//               then costs every rank the same at every ring step (a contiguous causal ring
//               gives rank P-1 about twice the mean work: max/mean = (2P-1)/P).
// Chunk c of n covers positions [floor(c*T/n), floor((c+1)*T/n)): T need not divide by n, chunk
// sizes differ by at most one (a chunk may be empty when T < n). A rank's shard is its chunks'
// positions concatenated in its local order, along the sequence dimension of every tensor:
// q / k / v / out / dq / dk / dv [B, T, H, D] (dim 1), segment ids [B, T] (dim 1), lse [B, H, T]
// (dim 2).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "attnops/options.h"
#include "attnops/tensor.h"

namespace attnops::dist {

enum class Layout { contiguous, zigzag };
std::string_view layout_name(Layout l);  // "contiguous", "zigzag"
std::optional<Layout> parse_layout(std::string_view s);
// The layout `ring` uses when none is given: zigzag for causal attention without a sliding
// window, contiguous otherwise (non-causal rows cost the same; a window's keys are neighbours').
Layout default_layout(const AttentionOptions& options);

struct Chunk {
  std::int64_t begin = 0, end = 0;  // global positions [begin, end)
  std::int64_t size() const { return end - begin; }
};

class ShardLayout {
 public:
  ShardLayout() = default;
  // Error(invalid_argument) for ranks < 1 or T < 0.
  ShardLayout(Layout layout, std::int64_t T, int ranks);
  Layout layout() const { return layout_; }
  std::int64_t length() const { return T_; }
  int ranks() const { return ranks_; }
  // Rank r's chunks, in its local order (1 for contiguous, 2 for zigzag).
  const std::vector<Chunk>& chunks(int rank) const;
  std::int64_t shard_length(int rank) const;
  std::int64_t max_shard_length() const;
  // Global position of rank r's local row i.
  std::int64_t global_position(int rank, std::int64_t local) const;

 private:
  Layout layout_ = Layout::contiguous;
  std::int64_t T_ = 0;
  int ranks_ = 1;
  std::vector<std::vector<Chunk>> chunks_;  // [rank]
};

// Rank `rank`'s shard of a full tensor, along dimension `dim` (a contiguous copy, same dtype).
// Error(shape_mismatch) when full.dim(dim) != layout.length().
Tensor shard(const TensorView& full, const ShardLayout& layout, int rank, int dim = 1);
// Writes rank `rank`'s shard into its rows of `full` (same dtype, full.dim(dim) == length()).
void unshard_into(const TensorView& shard, const ShardLayout& layout, int rank, Tensor& full, int dim = 1);

}  // namespace attnops::dist
