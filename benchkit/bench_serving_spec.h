// Serving rows of a bench file (`serving:`), each one ragged batch over a paged KV cache timed
// through the ragged_paged operator (bench_serving.h). Schema of one row (keys optional):
//
//   serving:
//     - label: decode64            # shown in the table
//       seqs: 64                   # sequences in the batch
//       kv_len: [128, 8192]        # keys per sequence: a number, or [lo, hi] drawn uniformly (seeded)
//       q_len: 1                   # query rows of a decoding sequence
//       prefill: {fraction: 0.25, q_len: 256}   # this fraction of the sequences is in chunked prefill
//       heads: [32, 8]             # Hq, Hkv
//       head_dim: 128
//       page_size: [16, 128]       # one row per page size
//       kv_split_tokens: 512       # default: the library's
//       compare: dense             # also time the same tokens as one dense call (one kv_len, no prefill)
//       kv_dtype: [same, int8, fp8_e4m3]   # the cache's dtype, one row each (same: the row's dtype)
//       scales: per_token          # 8-bit caches: per_token or per_tensor
//       shared_prefix: 4096        # every sequence begins with these keys in the same pages
//                                  # (then kv_len of its own)
//       share: [on, off]           # PagedAttentionOptions::share_prefixes, one row each
//
// Dtypes and backends come from the file's `dtypes` and `backends` (one row each): the queries'
// (and a float cache's) dtype.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/paged.h"

namespace YAML {
class Node;
}

namespace attnops::benchkit {

struct ServingRowSpec {
  std::string label = "serving";
  std::int64_t seqs = 64;
  std::int64_t kv_min = 128, kv_max = 8192;
  std::int64_t q_len = 1;
  double prefill_fraction = 0;
  std::int64_t prefill_q_len = 256;
  std::int64_t Hq = 32, Hkv = 8, D = 128;
  std::vector<std::int64_t> page_sizes{16};
  std::optional<std::int64_t> kv_split_tokens;
  bool compare_dense = false;
  std::vector<std::optional<DType>> kv_dtypes{std::nullopt};  // nullopt: the row's dtype
  KVScales scales = KVScales::per_token;
  std::int64_t shared_prefix = 0;
  std::vector<bool> share{true};
};

// The `serving` list of a bench file. Error(config_error) naming `file`, the line and the key for a
// wrong value (throws YAML exceptions for wrong types; bench_spec.cpp turns them into config_error).
std::vector<ServingRowSpec> parse_serving_rows(const YAML::Node& list, const std::string& file);

}  // namespace attnops::benchkit
