// Serving: a paged KV cache and ragged batches (operator `ragged_paged`, alias `paged`).
//
// An inference engine keeps each sequence's keys and values in fixed-size pages of two pools and
// runs one step for many sequences of different lengths at once: some decoding one token, some
// in a chunk of their prompt, some starting. Layouts (NHD pages, as vLLM and FlashInfer):
//
//   k_pages [num_pages, page_size, Hkv, D]     v_pages [num_pages, page_size, Hkv, Dv]
//   q [N, Hq, D]  (every sequence's query rows, concatenated, no padding between sequences)
//   cu_seqlens_q [S + 1]    query rows of sequence s are [cu[s], cu[s + 1]) of q
//   kv_lens [S]             keys of sequence s, this step's new tokens included
//   page_table [S, max_pages]   key j of s lives in page page_table[s][j / page_size], row j % page_size
//   out [N, Hq, Dv]  (the runtime dtype = the cache's)     lse [N, Hq] f32 (natural log)
//
// Per sequence every semantic is exactly the dense one (README, Semantics) with Tq = q_len_s and
// Tk = kv_len_s: query i sits at absolute position kv_len_s - q_len_s + i (decode, chunked
// prefill and prefill are one formula), causal is bottom-right, sliding window, chunked causal,
// soft cap, sinks, scale and GQA as for dense calls; sequences never see each other. q_len_s <=
// kv_len_s. A row with nothing visible gives output 0 and lse -inf; rows of q past
// cu[num_seqs] are padding (output 0, lse -inf).
//
//   attnops::PagedKVCache cache = attnops::PagedKVCache::host({.num_pages = 1024, .page_size = 16,
//       .num_kv_heads = 8, .head_dim = 128, .dtype = DType::bf16});
//   cache.write(k_new, v_new, slot_mapping);                 // this step's new tokens, every layer
//   attnops::PagedPlan plan = attnops::plan_paged(batch, cache.spec(), N, Hq, opts);  // once per step
//   auto attn = attnops::registry().get("paged");
//   AttentionOutput o = attn.paged(q, cache, plan);          // every layer reuses the plan and its opts
//
// The caller owns page allocation (as FlashInfer): attnops never frees, moves or allocates pages.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "attnops/device_tensor.h"
#include "attnops/metadata.h"
#include "attnops/options.h"
#include "attnops/tensor.h"

namespace attnops {

// How the codes of an 8-bit cache are scaled (kv_quant.h); float caches have no scales.
enum class KVScales : std::uint8_t {
  per_token,   // one f32 scale per (token, kv head): scale pools [num_pages, page_size, Hkv] beside
               // the page pools (a page stays one strided view); write() sets them from each row
  per_tensor,  // one f32 scale per pool (vLLM's k_scale / v_scale), fixed when the cache is made
};
std::string_view kv_scales_name(KVScales s);  // "per_token", "per_tensor"

// The shape of a paged KV cache.
struct PagedKVSpec {
  std::int64_t num_pages = 0;             // >= 1
  std::int64_t page_size = 0;             // tokens per page, >= 1
  std::int64_t num_kv_heads = 0;          // Hkv >= 1
  std::int64_t head_dim = 0;              // D >= 1
  std::int64_t head_dim_v = 0;            // Dv; 0 = head_dim
  DType dtype = DType::f32;               // f32, f16, bf16, or the 8-bit int8 / fp8_e4m3 (kv_quant.h)
  KVScales scales = KVScales::per_token;  // 8-bit dtypes only (float caches ignore it)
  std::int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool quantized() const { return is_kv8(dtype); }
  bool operator==(const PagedKVSpec&) const = default;
};

// The two scales of a per-tensor 8-bit cache (values = code x scale).
struct KVTensorScales {
  float k = 1.f, v = 1.f;
};

// Two page pools, K and V (separate, so Dv != D works and a page is an ordinary strided view),
// on the host or on the GPU (device-resident, DeviceTensor storage). Copies share the pools.
//
// 8-bit caches (dtype int8 or fp8_e4m3) hold codes; their values are code x scale (kv_quant.h),
// and attention over them is exactly attention over those values (gather() returns them). The
// scales are f32: pools k_scales / v_scales [num_pages, page_size, Hkv] (per token), or one
// value each (per tensor, shape [1]). A scale must be a normal f32 number > 0 whose product with
// the largest code is finite: every constructor checks every scale it is given (Error
// invalid_argument naming it), and host() / device() start per-token scales at 1.
class PagedKVCache {
 public:
  PagedKVCache() = default;
  // Zero-filled pools; 8-bit caches: per-token scales 1, per-tensor ones `tensor_scales` (default
  // 1, as vLLM's). Error (invalid_argument) for a bad spec, a bad scale or tensor_scales given to a
  // cache that is not per-tensor, (out_of_memory) on the host, (backend_unavailable / gpu_error) on
  // the device as DeviceTensor::zeros.
  static PagedKVCache host(const PagedKVSpec& spec,
                           std::optional<KVTensorScales> tensor_scales = std::nullopt);
  static PagedKVCache device(const PagedKVSpec& spec, const GpuSettings& gpu = {},
                             std::optional<KVTensorScales> tensor_scales = std::nullopt);
  // Pools the caller already holds (shared storage, no copy): host tensors or device tensors,
  // k [P, page, Hkv, D] and v [P, page, Hkv, Dv] of one dtype. 8-bit pools take their scales
  // too, f32: [P, page, Hkv] each (per token, where the pools are) or [1] each (per tensor, on the
  // host for host pools; either for device pools). Float pools take none.
  static PagedKVCache from_tensors(Tensor k_pages, Tensor v_pages, Tensor k_scales = {},
                                   Tensor v_scales = {});
  static PagedKVCache from_device(DeviceTensor k_pages, DeviceTensor v_pages, DeviceTensor k_scales = {},
                                  DeviceTensor v_scales = {});
  // Views of memory the caller owns (e.g. a framework's tensors, a slice of a larger pool; any
  // outer strides, innermost dimension contiguous): nothing is copied, the memory must outlive
  // the cache, and write() writes into it (scales too). Per-tensor scales are read once, here.
  static PagedKVCache wrap(const TensorView& k_pages, const TensorView& v_pages,
                           const TensorView& k_scales = {}, const TensorView& v_scales = {});

  bool empty() const { return spec_.num_pages == 0; }
  const PagedKVSpec& spec() const { return spec_; }
  bool on_device() const { return k_.on_device(); }
  TensorView k_pages() const { return k_; }  // [P, page_size, Hkv, D]
  TensorView v_pages() const { return v_; }  // [P, page_size, Hkv, Dv]
  // 8-bit caches: the scales, [P, page_size, Hkv] (per token) or [1] (per tensor, on the host);
  // empty views for float caches.
  TensorView k_scales() const { return ks_; }
  TensorView v_scales() const { return vs_; }
  // Per-tensor caches: the two scales (1 otherwise).
  KVTensorScales tensor_scales() const { return tensor_; }
  // One page as a view [page_size, Hkv, D] / [page_size, Hkv, Dv] (Error invalid_argument when
  // page is outside [0, num_pages)).
  TensorView k_page(std::int64_t page) const;
  TensorView v_page(std::int64_t page) const;

  // Puts row t of k_new [N, Hkv, D] / v_new [N, Hkv, Dv] at slot slot_mapping[t] (i32 or i64 [N]):
  // page slot / page_size, row slot % page_size. A negative slot skips the row (padding tokens,
  // as vLLM's reshape_and_cache). Float inputs of another dtype are rounded to the cache's
  // (round to nearest even); an 8-bit cache quantizes them (kv_quant.h: per token, each (row, kv
  // head) gets the scale of its absolute maximum; per tensor, the cache's scale). Everything is
  // checked before anything is written (all or nothing): shapes, dtypes, slots past the pool
  // (Error invalid_argument naming the row), two rows writing one slot in one call
  // (invalid_argument naming both), for 8-bit caches a row that is written holding NaN or inf
  // (invalid_argument naming it). Device caches: the rows are copied in runs of consecutive
  // slots, one submission per pool.
  void write(const TensorView& k_new, const TensorView& v_new, const TensorView& slot_mapping);

  // The keys and values of one sequence as dense host tensors k [1, kv_len, Hkv, D] and v [1,
  // kv_len, Hkv, Dv] in the cache's dtype (f32 values code x scale for 8-bit caches; a copy, for
  // tests and oracles). page_row: i32 or i64 [max_pages] (a row of a page table); entries past
  // ceil(kv_len / page_size) are ignored. 0 <= kv_len <= 2^40 (Error invalid_argument naming
  // kv_len otherwise).
  struct Dense {
    Tensor k, v;
  };
  Dense gather(const TensorView& page_row, std::int64_t kv_len) const;

 private:
  PagedKVSpec spec_;
  TensorView k_, v_;
  TensorView ks_, vs_;
  KVTensorScales tensor_;
  std::shared_ptr<const void> keep_;  // the storage the views point into, when the cache holds it
};

// One model step's batch (host index arrays, i32 or i64, any strides).
struct RaggedBatch {
  TensorView cu_seqlens_q;     // [S + 1]: cu[0] = 0, non-decreasing, cu[num_seqs] <= N
  TensorView kv_lens;          // [S]: kv_len_s >= q_len_s (keys including this step's tokens)
  TensorView page_table;       // [S, max_pages]: entries past ceil(kv_len_s / page_size) are ignored
  std::int64_t num_seqs = -1;  // -1: all S; else only the first num_seqs (0..S) sequences (static
                               // shapes); another negative is Error invalid_argument naming num_seqs
};

// Per-call options of a paged call; the same meaning as AttentionOptions, applied per sequence,
// per-call settings included. Bias, segment ids and user masks have no ragged form and are not
// offered.
struct PagedAttentionOptions {
  bool causal = true;                        // bottom-right aligned per sequence
  std::optional<Window> sliding_window{};    // (left, right), both >= 0
  std::optional<std::int64_t> chunk_size{};  // chunked causal, >= 1
  std::optional<double> logits_soft_cap{};   // s = cap * tanh(s / cap), cap > 0
  std::optional<TensorView> sinks{};         // one logit per q head, [Hq]
  std::optional<TensorView> softmax_aux{};   // EasyDeL's name for sinks: set one (both: Error)
  bool return_lse = false;                   // lse [N, Hq] f32
  // Batch invariance: a sequence's keys are split into ranges of this many tokens (from key 0),
  // computed independently and merged in range order. The split depends only on the sequence,
  // so a sequence's output is bitwise the same alone or inside any batch, at any thread count.
  // Default kDefaultKvSplitTokens; >= 1.
  std::optional<std::int64_t> kv_split_tokens{};
  // Shared prefixes (cascade attention without its numerical drift): plan_paged finds the
  // sequences whose keys of one whole split lie in the same pages (a common prompt, sharing pages
  // being legal) and makes that split one item that reads the keys once for the q rows of all of
  // them; each row's arithmetic, and the merge of its splits, stay those of the unshared run, so
  // outputs are bitwise the same with sharing on or off. A plan-time choice (run calls ignore it).
  bool share_prefixes = true;

  // Per-call settings, as AttentionOptions' (unset = the operator's metadata). runtime_dtype must
  // be the cache's dtype: a paged call never converts the cache.
  std::optional<double> softmax_scale{};
  std::optional<std::vector<Backend>> backends{};
  std::optional<int> num_threads{};
  std::optional<DType> runtime_dtype{};
};

inline constexpr std::int64_t kDefaultKvSplitTokens = 512;

// How a backend processes a work item (see PagedPlan).
enum class PagedWorkKind : std::uint8_t {
  stream,  // few query rows (decode, speculative tokens): K/V streamed once, split along the keys
  tile,    // many query rows (prefill, chunked prefill): the whole sequence in query x key tiles
  shared,  // one split of several stream sequences whose keys there lie in the same pages: read
           // once for the q rows of all of them (PagedPlan::members)
};

// One unit of work: rows [q_begin, q_end) of q (all of sequence seq's rows) against its keys
// [kv_begin, kv_end), split `split` of `num_splits` (num_splits > 1: partial results merged by
// log-sum-exp in split order). A shared item is split `split` of each of its members (seq is the
// first), every row of which sees all of [kv_begin, kv_end).
struct PagedWorkItem {
  std::int32_t seq = 0;
  std::int32_t split = 0, num_splits = 1;
  PagedWorkKind kind = PagedWorkKind::stream;
  std::int64_t q_begin = 0, q_end = 0;
  std::int64_t kv_begin = 0, kv_end = 0;
  std::int32_t member_begin = 0, member_count = 0;  // shared items: PagedPlan::members()[begin, +count)
};

// A member of a shared item: sequence seq, which is its split `split` (of its num_splits).
struct PagedSharedMember {
  std::int32_t seq = 0, split = 0;
};

// The kernels' form of a plan (attnops/ext/paged_problem.h); opaque to model code.
struct PagedPlanData;

// A validated batch, its work list and its options, built once per model step on the host and
// reused by every layer (as FlashInfer's plan/run: a run takes the plan and tensors). Immutable;
// copies share the data. Index arrays and sinks are copied in: the batch's tensors need not
// outlive it.
class PagedPlan {
 public:
  PagedPlan() = default;
  bool empty() const { return data_ == nullptr; }
  std::int64_t num_seqs() const;
  std::int64_t num_tokens() const;   // N, the rows of q
  std::int64_t num_q_heads() const;  // Hq
  std::int64_t kv_split_tokens() const;
  const PagedKVSpec& cache_spec() const;
  bool causal() const;
  const std::optional<Window>& sliding_window() const;
  const std::optional<std::int64_t>& chunk_size() const;
  // Sequence s: its query rows [q_begin, q_begin + q_len), keys and pages (page_size apart).
  std::int64_t q_begin(std::int64_t s) const;
  std::int64_t q_len(std::int64_t s) const;
  std::int64_t kv_len(std::int64_t s) const;
  const std::int32_t* pages(std::int64_t s) const;  // ceil(kv_len / page_size) page ids
  // The work list: shared items, then stream items, then tile items.
  const std::vector<PagedWorkItem>& work() const;
  // The members of the shared items (PagedWorkItem::member_begin / member_count index it).
  const std::vector<PagedSharedMember>& members() const;
  // Keys read once for several sequences (the summed key ranges of the shared items).
  std::int64_t shared_keys() const;
  // The options the plan was made with (the sinks copied in): a run given no options uses them.
  const PagedAttentionOptions& options() const;

 private:
  friend const PagedPlanData& plan_data(const PagedPlan& plan);  // attnops/ext/paged_problem.h
  friend PagedPlan plan_paged(const RaggedBatch&, const PagedKVSpec&, std::int64_t, std::int64_t,
                              const PagedAttentionOptions&);
  const PagedPlanData& data() const;
  std::shared_ptr<const PagedPlanData> data_;
};

// Validates a batch on the host and builds its work list: cu_seqlens_q starting at 0,
// non-decreasing, at most num_tokens; q_len_s <= kv_len_s; page tables wide enough for kv_len;
// page ids inside the cache; the mask options as make_problem checks them. Each a typed Error
// naming the argument. num_tokens = N and num_q_heads = Hq of the q the plan will run with.
// The plan keeps `options` (masks, soft cap, sinks, lse, per-call settings): every run of it
// uses them, so a layer loop passes only tensors (Attention::paged(q, cache, plan)).
PagedPlan plan_paged(const RaggedBatch& batch, const PagedKVSpec& cache, std::int64_t num_tokens,
                     std::int64_t num_q_heads, const PagedAttentionOptions& options = {});

// Cascade attention: the attention states (out, lse) of one set of query rows over two disjoint
// key sets (e.g. a shared prefix and each sequence's own suffix) merged into the state over
// their union: out = (out_a e^lse_a + out_b e^lse_b) / (e^lse_a + e^lse_b), lse = log(e^lse_a +
// e^lse_b), computed relative to the larger lse. out_* [N, H, Dv] (float dtypes; the result has
// out_a's dtype), lse_* [N, H] (float dtypes, natural log; -inf = no visible key). A state with
// lse -inf contributes nothing; NaN propagates. Sinks belong to neither part: pass sink-free
// states and add the sink after. Commutative; the same merge the cpu kernel applies to splits.
struct MergedState {
  Tensor out;  // [N, H, Dv]
  Tensor lse;  // [N, H] f32
};
MergedState merge_states(const TensorView& out_a, const TensorView& lse_a, const TensorView& out_b,
                         const TensorView& lse_b);

}  // namespace attnops
