// `attnops bench` serving rows: a ragged batch over a paged KV cache per row (bench file key
// `serving`, bench_serving_spec.h), timed through the ragged_paged operator, against a
// read-bandwidth loop measured in the same run (read_bandwidth.h).
//
// Each row: the batch (sequences, query tokens N, keys), the cache's dtype and whether shared
// prefixes were on, the backend and kernel that ran, the median time per call (each sample the
// mean of enough calls to last >= 20 ms; every row is prepared first, then the rows are sampled in
// rounds, one sample of each per round, so that their ratios see the same machine), the host cost
// of plan_paged for the batch (median, microseconds), tokens/s (N / time), KV GB/s (the K, V and scale bytes
// of every key some query of the batch sees, read once; keys of a shared item once per item / time), that
// rate over the same-run read bandwidth, GFLOP/s (2 (D + Dv) Hq per visible (query, key) pair), and the max
// error against the fp64 oracle on a cut-down batch of the same kind. Rows with `compare: dense`
// also time the same tokens as one dense call (flash_attn2, which hands a decode to vanilla) and
// give the paged / dense speed ratio.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "attnops/config.h"
#include "attnops/paged.h"
#include "benchkit/bench_spec.h"

namespace attnops::benchkit {

// One serving batch (deterministic for a seed): kv_len per sequence drawn from [kv_min, kv_max]
// (after the row's shared prefix, whose pages every sequence's table starts with), the first
// round(prefill.fraction * seqs) sequences in chunked prefill, pages handed out in a random
// permutation, q and float pools filled with values in [-1, 1); an 8-bit cache (kv_dtype int8 /
// fp8_e4m3) with random codes (no NaN) and scales 1/127 or 1/448 (per token: every one). Also
// used by bench/bench_paged.
struct ServingBatch {
  PagedKVCache cache;
  Tensor q, cu, kv, table;  // q [N, Hq, D]; cu_seqlens_q, kv_lens, page_table (i32)
  RaggedBatch batch;
  std::int64_t N = 0, S = 0, kv_tokens = 0;  // query rows, sequences, keys of all sequences
  double pairs = 0;                          // visible (query, key) pairs, causal, all sequences
  double key_bytes = 0;                      // bytes per key read: K, V and their scales, all kv heads
};
ServingBatch make_serving_batch(const ServingRowSpec& row, std::int64_t page_size, DType dtype,
                                std::uint64_t seed, std::optional<DType> kv_dtype = std::nullopt);

// Runs spec.serving x page sizes x spec.dtypes x spec.backends and prints the table to `out`.
// Returns the rows as JSON text when want_json (the caller writes it through its OutputSet, so
// --serving-json follows the program's output rules), else "". threads: 0 = OpenMP's default.
std::string run_serving_bench(const BenchSpec& spec, const Config& config, int threads, std::ostream& out,
                              bool want_json, bool progress);

}  // namespace attnops::benchkit
