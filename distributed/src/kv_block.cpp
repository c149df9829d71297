#include "kv_block.h"

#include <cstring>

#include "attnops/error.h"
#include "attnops/ext/problem.h"

namespace attnops::dist::detail {

namespace {
std::size_t align8(std::size_t x) {
  return (x + 7) & ~std::size_t{7};
}
}  // namespace

std::int64_t total_columns(const std::vector<Range>& ranges) {
  std::int64_t n = 0;
  for (const Range& r : ranges) n += r.size();
  return n;
}

MessageLayout message_layout(const KvShape& s, std::int64_t ncols) {
  const std::size_t es = dtype_size(s.dtype);
  const auto rows = static_cast<std::size_t>(s.B * ncols * s.Hkv);
  MessageLayout m;
  m.v_offset = rows * static_cast<std::size_t>(s.D) * es;
  m.seg_offset = align8(m.v_offset + rows * static_cast<std::size_t>(s.Dv) * es);
  m.bytes = m.seg_offset + (s.segments ? static_cast<std::size_t>(s.B * ncols) * sizeof(std::int32_t) : 0);
  return m;
}

KvBlock message_block(const KvShape& s, const char* buffer, const std::vector<Range>& ranges) {
  KvBlock b;
  b.ncols = total_columns(ranges);
  b.ranges = ranges;
  const MessageLayout m = message_layout(s, b.ncols);
  b.k = buffer;
  b.v = buffer + m.v_offset;
  b.seg = s.segments ? reinterpret_cast<const std::int32_t*>(buffer + m.seg_offset) : nullptr;
  return b;
}

std::int64_t KvBlock::column(std::size_t b, std::int64_t g) const {
  std::int64_t at = 0;
  for (std::size_t c = 0; c < b; ++c) at += ranges[c].size();
  return at + (g - ranges[b].lo);
}

TensorView KvBlock::k_view(const KvShape& s, std::int64_t c0, std::int64_t c1) const {
  const std::size_t es = dtype_size(s.dtype);
  return TensorView(k + static_cast<std::size_t>(c0 * s.Hkv * s.D) * es, s.dtype, {s.B, c1 - c0, s.Hkv, s.D},
                    {ncols * s.Hkv * s.D, s.Hkv * s.D, s.D, 1});
}

TensorView KvBlock::v_view(const KvShape& s, std::int64_t c0, std::int64_t c1) const {
  const std::size_t es = dtype_size(s.dtype);
  return TensorView(v + static_cast<std::size_t>(c0 * s.Hkv * s.Dv) * es, s.dtype,
                    {s.B, c1 - c0, s.Hkv, s.Dv}, {ncols * s.Hkv * s.Dv, s.Hkv * s.Dv, s.Dv, 1});
}

TensorView KvBlock::seg_view(const KvShape& s, std::int64_t c0, std::int64_t c1) const {
  return TensorView(seg + c0, DType::i32, {s.B, c1 - c0}, {ncols, 1});
}

std::size_t pack(const KvShape& s, const KvBlock& from, const std::vector<Range>& ranges, char* buffer) {
  if (ranges.size() != from.ranges.size()) throw Error(ErrorCode::internal, "pack: chunk counts differ");
  const std::int64_t ncols = total_columns(ranges);
  const MessageLayout m = message_layout(s, ncols);
  const std::size_t es = dtype_size(s.dtype);
  const auto kr = static_cast<std::size_t>(s.Hkv * s.D) * es,
             vr = static_cast<std::size_t>(s.Hkv * s.Dv) * es;
  std::int64_t to = 0;
  for (std::size_t b = 0; b < ranges.size(); ++b) {
    const Range r = ranges[b];
    if (r.empty()) continue;
    if (r.lo < from.ranges[b].lo || r.hi > from.ranges[b].hi)
      throw Error(ErrorCode::internal, "pack: a message range outside the columns at hand");
    const std::int64_t c = from.column(b, r.lo), n = r.size();
    for (std::int64_t bi = 0; bi < s.B; ++bi) {
      std::memcpy(buffer + static_cast<std::size_t>(bi * ncols + to) * kr,
                  from.k + static_cast<std::size_t>(bi * from.ncols + c) * kr,
                  static_cast<std::size_t>(n) * kr);
      std::memcpy(buffer + m.v_offset + static_cast<std::size_t>(bi * ncols + to) * vr,
                  from.v + static_cast<std::size_t>(bi * from.ncols + c) * vr,
                  static_cast<std::size_t>(n) * vr);
      if (s.segments)
        std::memcpy(buffer + m.seg_offset + static_cast<std::size_t>(bi * ncols + to) * sizeof(std::int32_t),
                    from.seg + bi * from.ncols + c, static_cast<std::size_t>(n) * sizeof(std::int32_t));
    }
    to += n;
  }
  return m.bytes;
}

KvBlock own_block(const AttentionProblem& p, const std::vector<Range>& ranges, std::vector<Tensor>& storage) {
  const auto contiguous = [&](const TensorView& t) -> const char* {
    if (t.is_contiguous()) return static_cast<const char*>(t.data());
    storage.push_back(Tensor::copy_of(t));
    return static_cast<const char*>(storage.back().data());
  };
  KvBlock b;
  b.k = contiguous(p.k);
  b.v = contiguous(p.v);
  b.seg = p.seg_kv;  // contiguous i32 [B, Tk] (make_problem)
  b.ncols = p.Tk;
  b.ranges = ranges;
  return b;
}

char* Buffer::reserve(std::size_t bytes) {
  if (bytes > capacity_ || !data_) {
    const auto words = static_cast<std::int64_t>((bytes + 3) / 4 + 1);
    storage_ = Tensor(DType::i32, {words});
    data_ = static_cast<char*>(storage_.data());
    capacity_ = static_cast<std::size_t>(words) * 4;
  }
  return data_;
}

}  // namespace attnops::dist::detail
