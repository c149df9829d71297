// Index arrays of the paged cache and the ragged batch (slot mappings, page tables, cu_seqlens,
// kv_lens): i32 or i64 host views of any strides, read and checked here, each failure a typed
// Error naming the argument. Internal to core/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnops/paged.h"

namespace attnops::paged_index {

// Element i of a rank-1 integer view / element (r, c) of a rank-2 one.
inline std::int64_t at(const TensorView& t, std::int64_t i) {
  const std::int64_t off = i * t.stride(0);
  return t.dtype() == DType::i32 ? static_cast<const std::int32_t*>(t.data())[off]
                                 : static_cast<const std::int64_t*>(t.data())[off];
}
inline std::int64_t at(const TensorView& t, std::int64_t r, std::int64_t c) {
  const std::int64_t off = r * t.stride(0) + c * t.stride(1);
  return t.dtype() == DType::i32 ? static_cast<const std::int32_t*>(t.data())[off]
                                 : static_cast<const std::int64_t*>(t.data())[off];
}

// A host i32 / i64 view of rank `rank` (Error naming `name` otherwise: unsupported_dtype,
// shape_mismatch, invalid_argument for a device view or a null pointer).
void check_index_view(const TensorView& t, const char* name, int rank, const char* layout);

// A cache shape attnops can hold: every size >= 1 (head_dim_v >= 0, 0 = head_dim), at most 2^31 - 1
// pages (page ids are i32 in plans), a float or 8-bit KV dtype. Error naming the field otherwise.
void check_spec(const PagedKVSpec& spec);

// Error(invalid_argument) unless 0 <= page < num_pages.
void check_page(const PagedKVSpec& spec, std::int64_t page, const char* what);

// slot_mapping [N] as int64, checked: every slot below num_pages * page_size (negative = skip),
// no slot twice.
std::vector<std::int64_t> read_slots(const TensorView& slot_mapping, std::int64_t n, const PagedKVSpec& spec);

// The first ceil(kv_len / page_size) entries of a page-table row [max_pages], checked.
std::vector<std::int32_t> read_page_row(const TensorView& page_row, std::int64_t kv_len,
                                        const PagedKVSpec& spec);

}  // namespace attnops::paged_index
