#include "attnops/dist/layout.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "attnops/error.h"

namespace attnops::dist {

std::string_view layout_name(Layout l) {
  return l == Layout::zigzag ? "zigzag" : "contiguous";
}

std::optional<Layout> parse_layout(std::string_view s) {
  if (s == "zigzag") return Layout::zigzag;
  if (s == "contiguous") return Layout::contiguous;
  return std::nullopt;
}

Layout default_layout(const AttentionOptions& o) {
  return o.causal && !o.sliding_window ? Layout::zigzag : Layout::contiguous;
}

ShardLayout::ShardLayout(Layout layout, std::int64_t T, int ranks) : layout_(layout), T_(T), ranks_(ranks) {
  if (ranks < 1)
    throw Error(ErrorCode::invalid_argument, "ShardLayout: ranks must be >= 1, got " + std::to_string(ranks));
  if (T < 0)
    throw Error(ErrorCode::invalid_argument, "ShardLayout: length must be >= 0, got " + std::to_string(T));
  const std::int64_t n = layout == Layout::zigzag ? 2 * std::int64_t{ranks} : ranks;
  const auto chunk = [&](std::int64_t c) { return Chunk{c * T / n, (c + 1) * T / n}; };
  chunks_.resize(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& v = chunks_[static_cast<std::size_t>(r)];
    v.push_back(chunk(r));
    if (layout == Layout::zigzag) v.push_back(chunk(n - 1 - r));
  }
}

const std::vector<Chunk>& ShardLayout::chunks(int rank) const {
  if (rank < 0 || rank >= ranks_)
    throw Error(ErrorCode::invalid_argument, "ShardLayout: rank " + std::to_string(rank) + " outside " +
                                                 std::to_string(ranks_) + " ranks");
  return chunks_[static_cast<std::size_t>(rank)];
}

std::int64_t ShardLayout::shard_length(int rank) const {
  std::int64_t n = 0;
  for (const Chunk& c : chunks(rank)) n += c.size();
  return n;
}

std::int64_t ShardLayout::max_shard_length() const {
  std::int64_t m = 0;
  for (int r = 0; r < ranks_; ++r) m = std::max(m, shard_length(r));
  return m;
}

std::int64_t ShardLayout::global_position(int rank, std::int64_t local) const {
  for (const Chunk& c : chunks(rank)) {
    if (local < c.size()) return c.begin + local;
    local -= c.size();
  }
  throw Error(ErrorCode::invalid_argument,
              "ShardLayout: local row past rank " + std::to_string(rank) + "'s shard");
}

namespace {

// Copies rows [from, from + n) of dimension `dim` of `src` to rows [to, to + n) of `dst`
// (contiguous), element by element over the other dimensions (src may be strided).
void copy_rows(const TensorView& src, std::int64_t from, char* dst,
               const std::vector<std::int64_t>& dst_shape, std::int64_t to, std::int64_t n, int dim) {
  const std::size_t es = dtype_size(src.dtype());
  const int rank = src.rank();
  std::vector<std::int64_t> dst_strides(static_cast<std::size_t>(rank), 1);
  for (int d = rank - 2; d >= 0; --d)
    dst_strides[static_cast<std::size_t>(d)] =
        dst_strides[static_cast<std::size_t>(d + 1)] * dst_shape[static_cast<std::size_t>(d + 1)];
  // Iterate over every index except the innermost dimension, which is copied as one run when it
  // is contiguous in the source.
  std::vector<std::int64_t> shape = src.shape();
  shape[static_cast<std::size_t>(dim)] = n;
  const std::int64_t inner = shape[static_cast<std::size_t>(rank - 1)];
  const bool inner_contiguous = src.stride(rank - 1) == 1 && dim != rank - 1;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(rank), 0);
  const char* base = static_cast<const char*>(src.data());
  for (;;) {
    std::int64_t so = 0, dof = 0;
    for (int d = 0; d < rank - 1; ++d) {
      const std::int64_t i = idx[static_cast<std::size_t>(d)] + (d == dim ? from : 0);
      const std::int64_t o = idx[static_cast<std::size_t>(d)] + (d == dim ? to : 0);
      so += i * src.stride(d);
      dof += o * dst_strides[static_cast<std::size_t>(d)];
    }
    if (inner_contiguous) {
      std::memcpy(dst + static_cast<std::size_t>(dof) * es, base + static_cast<std::size_t>(so) * es,
                  static_cast<std::size_t>(inner) * es);
    } else {
      for (std::int64_t e = 0; e < inner; ++e) {
        const std::int64_t i = e + (dim == rank - 1 ? from : 0), o = e + (dim == rank - 1 ? to : 0);
        std::memcpy(dst + static_cast<std::size_t>(dof + o) * es,
                    base + static_cast<std::size_t>(so + i * src.stride(rank - 1)) * es, es);
      }
    }
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++idx[static_cast<std::size_t>(d)] < shape[static_cast<std::size_t>(d)]) break;
      idx[static_cast<std::size_t>(d)] = 0;
    }
    if (d < 0) break;
  }
}

void check_dim(const TensorView& t, int dim, const char* what) {
  if (t.on_device()) throw Error(ErrorCode::invalid_argument, std::string(what) + ": needs a host tensor");
  if (dim < 0 || dim >= t.rank())
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": dimension " + std::to_string(dim) +
                                                 " outside a tensor of rank " + std::to_string(t.rank()));
}

}  // namespace

Tensor shard(const TensorView& full, const ShardLayout& layout, int rank, int dim) {
  check_dim(full, dim, "shard");
  if (full.dim(dim) != layout.length())
    throw Error(ErrorCode::shape_mismatch,
                "shard: dimension " + std::to_string(dim) + " of " + shape_string(full.shape()) +
                    " should be the layout's length " + std::to_string(layout.length()));
  std::vector<std::int64_t> shape = full.shape();
  shape[static_cast<std::size_t>(dim)] = layout.shard_length(rank);
  Tensor out(full.dtype(), shape);
  if (out.numel() == 0) return out;
  std::int64_t at = 0;
  for (const Chunk& c : layout.chunks(rank)) {
    if (c.size() > 0) copy_rows(full, c.begin, static_cast<char*>(out.data()), shape, at, c.size(), dim);
    at += c.size();
  }
  return out;
}

void unshard_into(const TensorView& part, const ShardLayout& layout, int rank, Tensor& full, int dim) {
  check_dim(part, dim, "unshard_into");
  if (part.dtype() != full.dtype() || part.rank() != full.rank() || full.dim(dim) != layout.length() ||
      part.dim(dim) != layout.shard_length(rank))
    throw Error(ErrorCode::shape_mismatch, "unshard_into: shard " + shape_string(part.shape()) + " of rank " +
                                               std::to_string(rank) + " does not fit " +
                                               shape_string(full.shape()));
  for (int d = 0; d < part.rank(); ++d)
    if (d != dim && part.dim(d) != full.dim(d))
      throw Error(ErrorCode::shape_mismatch, "unshard_into: shard " + shape_string(part.shape()) +
                                                 " does not fit " + shape_string(full.shape()));
  std::int64_t at = 0;
  for (const Chunk& c : layout.chunks(rank)) {
    if (c.size() > 0 && part.numel() > 0)
      copy_rows(part, at, static_cast<char*>(full.data()), full.shape(), c.begin, c.size(), dim);
    at += c.size();
  }
}

}  // namespace attnops::dist
