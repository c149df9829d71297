// Serving rows of a bench file (`serving:`), each one ragged batch over a paged KV cache timed
// through the ragged_paged operator (cli/bench_serving.h). Schema of one row (keys optional):
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
//       compare: dense             # also time the same tokens as one dense call (seqs must be 1)
//
// Dtypes and backends come from the file's `dtypes` and `backends` (one row each).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace YAML {
class Node;
}

namespace attnops::cli {

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
};

// The `serving` list of a bench file. Error(config_error) naming `file`, the line and the key for a
// wrong value (throws YAML exceptions for wrong types; bench_spec.cpp turns them into config_error).
std::vector<ServingRowSpec> parse_serving_rows(const YAML::Node& list, const std::string& file);

}  // namespace attnops::cli
