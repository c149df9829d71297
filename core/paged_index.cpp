#include "core/paged_index.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "attnops/error.h"
#include "core/checked_size.h"

namespace attnops::paged_index {

namespace {
// As plan_paged's bound on kv_lens: (kv_len + page_size - 1) cannot overflow below it.
constexpr std::int64_t kMaxKvLen = std::int64_t{1} << 40;
[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, msg);
}
}  // namespace

void check_index_view(const TensorView& t, const char* name, int rank, const char* layout) {
  if (t.on_device())
    fail(ErrorCode::invalid_argument,
         std::string(name) + ": a device tensor; index arrays are read on the host (pass a host tensor)");
  if (t.dtype() != DType::i32 && t.dtype() != DType::i64)
    fail(ErrorCode::unsupported_dtype,
         std::string(name) + ": expected dtype i32 or i64, got " + std::string(dtype_name(t.dtype())));
  if (t.rank() != rank)
    fail(ErrorCode::shape_mismatch, std::string(name) + ": expected rank " + std::to_string(rank) + " " +
                                        layout + ", got " +
                                        (t.empty() ? std::string("none") : shape_string(t.shape())));
  if (t.data() == nullptr && t.numel() != 0)
    fail(ErrorCode::invalid_argument, std::string(name) + ": null data pointer");
}

void check_spec(const PagedKVSpec& s) {
  if (s.num_pages < 1 || s.page_size < 1 || s.num_kv_heads < 1 || s.head_dim < 1 || s.head_dim_v < 0 ||
      s.num_pages > std::numeric_limits<std::int32_t>::max())
    fail(ErrorCode::invalid_argument,
         "PagedKVSpec: expected 1 <= num_pages < 2^31, page_size, num_kv_heads, head_dim >= 1 and head_dim_v "
         ">= "
         "0 (0 = head_dim), got num_pages=" +
             std::to_string(s.num_pages) + " page_size=" + std::to_string(s.page_size) +
             " num_kv_heads=" + std::to_string(s.num_kv_heads) + " head_dim=" + std::to_string(s.head_dim) +
             " head_dim_v=" + std::to_string(s.head_dim_v));
  if (!is_float(s.dtype) && !is_kv8(s.dtype))
    fail(ErrorCode::unsupported_dtype, "PagedKVSpec: dtype must be f32, f16, bf16, int8 or fp8_e4m3, got " +
                                           std::string(dtype_name(s.dtype)));
  if (s.scales != KVScales::per_token && s.scales != KVScales::per_tensor)
    fail(ErrorCode::invalid_argument, "PagedKVSpec: scales must be per_token or per_tensor");
  // Every slot index (page * page_size + row) and pool size must stay an exact int64.
  const auto slots = checked_mul(s.num_pages, s.page_size);
  const auto row = checked_mul(s.num_kv_heads, std::max(s.head_dim, s.head_dim_v));
  if (!slots || !row || !checked_mul(*slots, *row))
    fail(ErrorCode::invalid_argument,
         "PagedKVSpec: num_pages x page_size x num_kv_heads x head_dim overflows int64");
}

void check_page(const PagedKVSpec& spec, std::int64_t page, const char* what) {
  if (page < 0 || page >= spec.num_pages)
    fail(ErrorCode::invalid_argument, std::string(what) + ": page " + std::to_string(page) +
                                          " is outside the cache's pages [0, " +
                                          std::to_string(spec.num_pages) + ")");
}

std::vector<std::int64_t> read_slots(const TensorView& slot_mapping, std::int64_t n,
                                     const PagedKVSpec& spec) {
  check_index_view(slot_mapping, "slot_mapping", 1, "[N]");
  if (slot_mapping.dim(0) != n)
    fail(ErrorCode::shape_mismatch, "slot_mapping: expected shape [N=" + std::to_string(n) +
                                        "] (one slot per row of k_new), got " +
                                        shape_string(slot_mapping.shape()));
  const std::int64_t slots = *checked_mul(spec.num_pages, spec.page_size);  // both < 2^47 / 2
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  std::vector<std::pair<std::int64_t, std::int64_t>> used;  // (slot, row) of rows that write
  used.reserve(static_cast<std::size_t>(n));
  for (std::int64_t t = 0; t < n; ++t) {
    const std::int64_t s = at(slot_mapping, t);
    out[static_cast<std::size_t>(t)] = s;
    if (s < 0) continue;  // a padding token: skipped
    if (s >= slots)
      fail(ErrorCode::invalid_argument,
           "slot_mapping: row " + std::to_string(t) + " has slot " + std::to_string(s) +
               ", outside the cache's slots [0, " + std::to_string(slots) + ") (num_pages " +
               std::to_string(spec.num_pages) + " x page_size " + std::to_string(spec.page_size) +
               "; a negative slot skips the row)");
    used.emplace_back(s, t);
  }
  std::sort(used.begin(), used.end());
  for (std::size_t i = 1; i < used.size(); ++i)
    if (used[i].first == used[i - 1].first)
      fail(ErrorCode::invalid_argument,
           "slot_mapping: rows " + std::to_string(used[i - 1].second) + " and " +
               std::to_string(used[i].second) + " both write slot " + std::to_string(used[i].first) +
               " (page " + std::to_string(used[i].first / spec.page_size) + ", row " +
               std::to_string(used[i].first % spec.page_size) + "); one call writes each slot at most once");
  return out;
}

std::vector<std::int32_t> read_page_row(const TensorView& page_row, std::int64_t kv_len,
                                        const PagedKVSpec& spec) {
  check_index_view(page_row, "page_row", 1, "[max_pages]");
  if (kv_len < 0 || kv_len > kMaxKvLen)
    fail(ErrorCode::invalid_argument, "kv_len: expected 0 <= kv_len <= 2^40, got " + std::to_string(kv_len));
  const std::int64_t need = (kv_len + spec.page_size - 1) / spec.page_size;
  if (need > page_row.dim(0))
    fail(ErrorCode::shape_mismatch, "page_row: kv_len " + std::to_string(kv_len) + " at page_size " +
                                        std::to_string(spec.page_size) + " needs " + std::to_string(need) +
                                        " pages, the row has " + std::to_string(page_row.dim(0)));
  std::vector<std::int32_t> pages(static_cast<std::size_t>(need));
  for (std::int64_t j = 0; j < need; ++j) {
    const std::int64_t p = at(page_row, j);
    if (p < 0 || p >= spec.num_pages)
      fail(ErrorCode::invalid_argument, "page_row: entry " + std::to_string(j) + " is page " +
                                            std::to_string(p) + ", outside the cache's pages [0, " +
                                            std::to_string(spec.num_pages) + ")");
    pages[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(p);
  }
  return pages;
}

}  // namespace attnops::paged_index
