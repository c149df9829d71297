// Random ragged batches over a paged cache for the paged tests, and their dense oracle.
//
// A case: S sequences with given q_len / kv_len; each sequence's keys, values and queries come
// from its own seed (so a sequence is the same data alone or inside another batch, at any page
// size); the pool holds the pages the sequences need plus spare ones, handed out in a random
// permutation; the cache is filled through PagedKVCache::write with the tokens of every sequence
// in a shuffled order plus padding rows (slot -1). The page table's unused columns hold page ids
// far outside the pool (they must be ignored).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/paged_problem.h"

namespace attnops::testing {

struct PagedCaseSpec {
  std::vector<std::int64_t> q_lens, kv_lens;  // one entry per sequence (q_len <= kv_len)
  std::vector<std::uint64_t> seq_seeds;       // per sequence; default: seed * 1000 + s
  std::int64_t Hq = 4, Hkv = 2, D = 16, Dv = 16, page_size = 16;
  DType dtype = DType::f32;
  DType index_dtype = DType::i32;
  std::int64_t spare_pages = 3;  // pages in the pool no sequence uses
  std::int64_t pad_rows = 0;     // rows of q past cu[num_seqs]
  std::int64_t pad_seqs = 0;     // rows of the index arrays past num_seqs (num_seqs set when > 0)
  bool permute_pages = true;
  std::uint64_t seed = 1;
  // Options.
  bool causal = true;
  std::optional<Window> window;
  std::optional<std::int64_t> chunk;
  std::optional<double> soft_cap;
  bool sinks = false;
  std::optional<std::int64_t> split;  // kv_split_tokens
  bool share_prefixes = true;         // PagedAttentionOptions::share_prefixes
  // An 8-bit cache (int8 / fp8_e4m3) under queries of `dtype`: the sequences' keys and values are
  // written through write() (quantized), and k_seq / v_seq become the cache's values (gather()).
  std::optional<DType> kv_dtype;
  KVScales scales = KVScales::per_token;
  std::optional<KVTensorScales> tensor_scales;  // per tensor: default 1.1 / the largest code
  // Shared prefixes: sequence s begins with the first share_tokens[s] keys (whole pages) of
  // sequence share_from[s] < s, in the same pages (missing or -1: none).
  std::vector<std::int64_t> share_from, share_tokens;
  std::string describe() const;
};

struct PagedCase {
  PagedCaseSpec spec;
  PagedKVCache cache;
  Tensor q;                     // [N, Hq, D]
  Tensor cu, kv, table;         // the index arrays
  std::optional<Tensor> sinks;  // [Hq] f32
  RaggedBatch batch;
  PagedAttentionOptions options;     // return_lse on
  std::vector<Tensor> k_seq, v_seq;  // each sequence's keys / values, [1, kv_len, Hkv, D|Dv]
  std::int64_t N = 0;
  std::int64_t q_begin(std::size_t s) const;
};

PagedCase make_paged_case(const PagedCaseSpec& spec);

// Sequence s's queries as a dense view [1, q_len, Hq, D] of c.q.
TensorView q_of(const PagedCase& c, std::size_t s);

// The dense call's options for a case (return_lse on).
AttentionOptions dense_options(const PagedCase& c);

// The dense native (vanilla, fp64 oracle) call on sequence s's keys (8-bit caches: their values in
// f32 with q widened to f32, the output rounded to q's dtype: what the paged oracle computes).
AttentionOutput dense_oracle(const PagedCase& c, std::size_t s, const OperationMetadata& md = {});

// Runs the ragged_paged operator on a case with backend `b` (metadata md, b added in front).
AttentionOutput run_paged(const PagedCase& c, Backend b, OperationMetadata md = {});

// The batch of the case's sequence s alone: its own index arrays over the same cache, for q =
// its rows of c.q (q_of(c, s) seen as [q_len, Hq, D]).
struct SubBatch {
  Tensor cu, kv, table;
  RaggedBatch batch;
};
SubBatch alone(const PagedCase& c, std::size_t s);

// out [N, Hq, Dv] / lse [N, Hq] rows of sequence s against a dense result [1, q_len, Hq, Dv] /
// [1, Hq, q_len]: bitwise (tol = 0) or within tol; the message names the worst element.
::testing::AssertionResult rows_match(const PagedCase& c, std::size_t s, const AttentionOutput& paged,
                                      const AttentionOutput& dense, double tol_out, double tol_lse);

// Whether two tensors hold the same bytes.
bool same_bits(const Tensor& a, const Tensor& b);

}  // namespace attnops::testing
