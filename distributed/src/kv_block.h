// The keys, values and key segment ids of one source rank as a ring step sees them: either the
// rank's own shard or a received message. A message packs the columns of some ranges of the
// source's key chunks into one buffer (one send per step):
//   K   [B, ncols, Hkv, D]   in the runtime dtype
//   V   [B, ncols, Hkv, Dv]
//   seg [B, ncols] i32        (only with segment ids), 8-byte aligned
// where the columns are the ranges concatenated in chunk order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnops/dtype.h"
#include "attnops/ext/problem.h"
#include "attnops/tensor.h"
#include "ring_plan.h"

namespace attnops::dist::detail {

struct KvShape {
  std::int64_t B = 0, Hkv = 0, D = 0, Dv = 0;
  DType dtype = DType::f32;
  bool segments = false;
};

// Byte size of a message of `ncols` columns, and the offsets of its parts.
struct MessageLayout {
  std::size_t v_offset = 0, seg_offset = 0, bytes = 0;
};
MessageLayout message_layout(const KvShape& s, std::int64_t ncols);

// A view of the columns of one source: where K, V and seg live, with the global ranges they hold
// (one per key chunk of the source, possibly empty).
struct KvBlock {
  const char* k = nullptr;
  const char* v = nullptr;
  const std::int32_t* seg = nullptr;
  std::int64_t ncols = 0;     // columns in the buffer (the batch stride is ncols rows)
  std::vector<Range> ranges;  // per key chunk b: the global columns present
  // Buffer column of global column g of chunk b (g inside ranges[b]).
  std::int64_t column(std::size_t b, std::int64_t g) const;
  // Views of columns [c0, c1) of the buffer.
  TensorView k_view(const KvShape& s, std::int64_t c0, std::int64_t c1) const;
  TensorView v_view(const KvShape& s, std::int64_t c0, std::int64_t c1) const;
  TensorView seg_view(const KvShape& s, std::int64_t c0, std::int64_t c1) const;
};

// A block over a message buffer laid out by message_layout for `ranges`.
KvBlock message_block(const KvShape& s, const char* buffer, const std::vector<Range>& ranges);
// Packs the columns `ranges` (each inside the same chunk's range of `from`) into `buffer`
// (at least message_layout(...).bytes). Returns the bytes written.
std::size_t pack(const KvShape& s, const KvBlock& from, const std::vector<Range>& ranges, char* buffer);
std::int64_t total_columns(const std::vector<Range>& ranges);

// This rank's own keys as a block (every column of its chunks), viewing k / v / seg_kv of the
// normalised problem when they are contiguous, else contiguous copies kept in `storage`.
KvBlock own_block(const AttentionProblem& p, const std::vector<Range>& ranges, std::vector<Tensor>& storage);

// A growable, 64-byte aligned byte buffer.
class Buffer {
 public:
  char* reserve(std::size_t bytes);  // keeps nothing when it grows
  char* data() { return data_; }
  const char* data() const { return data_; }

 private:
  Tensor storage_;
  char* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace attnops::dist::detail
