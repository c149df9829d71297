// The paged problems of the fuzzer (ragged_paged): a ragged batch over a paged KV cache as an
// inference engine builds it, drawn from SEED:CASE (PagedSpec) and materialised from the spec
// alone (PagedInputs). Sequences mix decode, speculative steps, chunked prefill and prefill;
// pages are permuted through the pool, some shared between sequences (a common prefix), the
// page-table columns past a sequence's pages hold garbage the kernels must ignore, rows of q past
// the batch are padding, and kv_split_tokens and the page size come from the kernels' edges.
// A third of the caches are 8-bit (int8 or fp8_e4m3 codes with per-token or per-tensor scales,
// kv_quant.h): codes over their whole range (int8's -128, e4m3 subnormals, signed zeros, the e4m3
// NaN code where non-finite values are drawn), scales from the smallest valid one to large ones,
// rows of zero codes. The plan shares prefixes or not (PagedAttentionOptions::share_prefixes),
// and a case may run both ways.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnops/paged.h"
#include "verify/dense_problem.h"

namespace attnops::verify {

struct PagedSeq {
  std::int64_t q_len = 0, kv_len = 0;
};

struct PagedSpec {
  std::uint64_t seed = 0, index = 0;
  std::int64_t Hq = 1, Hkv = 1, D = 1, Dv = 1;
  DType dtype = DType::f32;
  std::int64_t page_size = 16;
  std::int64_t extra_pages = 0;  // pool pages no sequence uses
  std::vector<PagedSeq> seqs;
  std::int64_t num_seqs = -1;  // RaggedBatch::num_seqs (-1: all)
  std::int64_t pad_rows = 0;   // rows of q after the last sequence's
  bool shared_prefix = false;  // sequences after the first start on the first one's pages
  bool index_i64 = false;
  bool strided_pool = false;     // the pools are views into larger storage (PagedKVCache::wrap)
  std::int64_t table_extra = 0;  // page-table columns beyond the widest sequence's pages
  bool causal = true;
  std::optional<Window> window;
  std::optional<std::int64_t> chunk;
  std::optional<double> soft_cap;
  bool sinks = false;
  std::optional<double> scale;
  std::optional<std::int64_t> kv_split_tokens;
  float q_amp = 1;
  std::vector<Injection> nonfinite;  // tensors q, k (pool), v (pool), s (sinks)
  bool return_lse = true;
  // 8-bit pools: the pools hold codes of kv8 and values are code x scale; q and the output keep
  // `dtype`. Empty: the pools are of `dtype`.
  std::optional<DType> kv8;
  KVScales kv_scales = KVScales::per_token;
  float k_scale = 1, v_scale = 1;  // per tensor: the scales; per token: a typical token's
  bool scale_edges = false;        // per token: some tokens at the scale edges, some rows all zero
  std::int64_t shared_pages = -1;  // with shared_prefix: pages shared (-1: half the shorter + 1)
  bool share_prefixes = true;      // the plan's PagedAttentionOptions::share_prefixes
  bool both_ways = false;          // also run with share_prefixes flipped: the same bits

  std::int64_t rows() const;  // N, the rows of q
  std::int64_t work() const;  // sum over sequences of q_len * kv_len * Hq * (D + Dv)
  std::string describe() const;
};

// Drawn from the streams kStreamPaged (the batch, as before 8-bit caches were drawn) and
// kStreamPagedKv8 (the cache's dtype and scales, sharing), so that a float case stays the case
// it was.
PagedSpec draw_paged(std::uint64_t seed, std::uint64_t index, const Limits& limits);

struct PagedInputs {
  Tensor q;                   // [N, Hq, D]
  std::vector<Placed> pools;  // k, v page pools
  PagedKVCache cache;
  Tensor cu, kv_lens, page_table;
  RaggedBatch batch;
  std::optional<Tensor> sinks;
  PagedAttentionOptions options;
  std::vector<std::vector<std::int64_t>> pages;  // each sequence's pages
  // 8-bit pools: the codes and scales as drawn (logical order [P, page_size, Hkv, D | Dv] and
  // [P, page_size, Hkv]; per tensor one scale each), the oracle's own copy of what the cache holds.
  std::vector<std::uint8_t> k_codes, v_codes;
  std::vector<float> k_scales, v_scales;
};

PagedInputs materialize(const PagedSpec& s);

// The value of an 8-bit code (int8: the integer; fp8_e4m3: from its bit fields, NaN for
// S.1111.111), computed here rather than by the library, for the oracle.
float code_value(DType kv8, std::uint8_t code);

}  // namespace attnops::verify
