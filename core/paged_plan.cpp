// plan_paged: the host-side validation of a ragged batch and its work list, once per model step.
//
// Work list. A sequence with few query rows per kv head (G * q_len <= kStreamMaxRows, or q_len
// <= kStreamMaxQ; decode and speculative steps) becomes stream items: the union of the keys its
// rows see is cut at multiples of the split size (kv_split_tokens, counted from key 0), one item
// per piece, so that a long sequence alone in a batch still spreads over every thread. A
// sequence with many query rows (prefill, chunked prefill) becomes one tile item over its
// visible keys: its query x key tiles already give every thread work. Both choices look at the
// sequence only (its q_len, kv_len and the call-wide shapes and masks), never at the rest of the
// batch or at the thread count: that is what makes a sequence's result batch invariant.
//
// Shared prefixes (paged_share.h): a split several stream sequences have in the same pages, which
// every row of theirs sees whole, becomes one shared item over the q rows of all of them; their
// other splits stay stream items. The split boundaries, and so every row's arithmetic, are those
// of the unshared plan.
//
// Cost: O(S + pages used) for the checks plus O(items); no sort (stream items are at most
// kv_split_tokens keys each, which dynamic scheduling balances without ordering them).
#include <algorithm>
#include <cstring>
#include <string>

#include "attnops/error.h"
#include "attnops/ext/paged_problem.h"
#include "core/paged_index.h"
#include "core/paged_share.h"
#include "core/sinks_option.h"

namespace attnops {

namespace {

using i64 = std::int64_t;
using paged_index::at;

constexpr i64 kMaxExtent = i64{1} << 40;  // as make_problem: windows, chunks, lengths

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, msg);
}

std::string seq_name(i64 s) {
  return "sequence " + std::to_string(s);
}

void check_options(const PagedAttentionOptions& o) {
  if (o.sliding_window) {
    const auto [l, r] = *o.sliding_window;
    if (l < 0 || r < 0 || l > kMaxExtent || r > kMaxExtent)
      fail(ErrorCode::invalid_argument,
           "sliding_window: expected (left, right) with 0 <= left, right <= 2^40, got (" + std::to_string(l) +
               ", " + std::to_string(r) + ")");
  }
  if (o.chunk_size && (*o.chunk_size < 1 || *o.chunk_size > kMaxExtent))
    fail(ErrorCode::invalid_argument,
         "chunk_size: expected an integer >= 1, got " + std::to_string(*o.chunk_size));
  if (o.kv_split_tokens && (*o.kv_split_tokens < 1 || *o.kv_split_tokens > kMaxExtent))
    fail(ErrorCode::invalid_argument,
         "kv_split_tokens: expected an integer >= 1, got " + std::to_string(*o.kv_split_tokens));
}

}  // namespace

// ---- the plan's accessors --------------------------------------------------------------------

const PagedPlanData& PagedPlan::data() const {
  if (!data_) throw Error(ErrorCode::invalid_argument, "PagedPlan: an empty plan (made by plan_paged only)");
  return *data_;
}
const PagedPlanData& plan_data(const PagedPlan& plan) {
  return plan.data();
}
const PagedAttentionOptions& PagedPlan::options() const {
  return data().options;
}
std::int64_t PagedPlan::num_seqs() const {
  return data().S;
}
std::int64_t PagedPlan::num_tokens() const {
  return data().N;
}
std::int64_t PagedPlan::num_q_heads() const {
  return data().Hq;
}
std::int64_t PagedPlan::kv_split_tokens() const {
  return data().split_tokens;
}
const PagedKVSpec& PagedPlan::cache_spec() const {
  return data().cache;
}
bool PagedPlan::causal() const {
  return data().causal;
}
const std::optional<Window>& PagedPlan::sliding_window() const {
  return data().window;
}
const std::optional<std::int64_t>& PagedPlan::chunk_size() const {
  return data().chunk;
}
const std::vector<PagedWorkItem>& PagedPlan::work() const {
  return data().work;
}
const std::vector<PagedSharedMember>& PagedPlan::members() const {
  return data().members;
}
std::int64_t PagedPlan::shared_keys() const {
  return data().shared_keys;
}

namespace {
std::size_t seq_index(const PagedPlanData& d, std::int64_t s) {
  if (s < 0 || s >= d.S)
    throw Error(ErrorCode::invalid_argument,
                "PagedPlan: sequence " + std::to_string(s) + " outside [0, " + std::to_string(d.S) + ")");
  return static_cast<std::size_t>(s);
}
}  // namespace

std::int64_t PagedPlan::q_begin(std::int64_t s) const {
  return data().q_begin[seq_index(data(), s)];
}
std::int64_t PagedPlan::q_len(std::int64_t s) const {
  return data().q_len[seq_index(data(), s)];
}
std::int64_t PagedPlan::kv_len(std::int64_t s) const {
  return data().kv_len[seq_index(data(), s)];
}
const std::int32_t* PagedPlan::pages(std::int64_t s) const {
  const PagedPlanData& d = data();
  return d.page_ids.data() + d.page_begin[seq_index(d, s)];
}

// ---- plan_paged ------------------------------------------------------------------------------

PagedPlan plan_paged(const RaggedBatch& batch, const PagedKVSpec& cache, std::int64_t num_tokens,
                     std::int64_t num_q_heads, const PagedAttentionOptions& options) {
  paged_index::check_spec(cache);
  if (num_tokens < 0)
    fail(ErrorCode::invalid_argument,
         "num_tokens: expected N >= 0 (the rows of q), got " + std::to_string(num_tokens));
  if (num_q_heads < 1 || num_q_heads % cache.num_kv_heads != 0)
    fail(ErrorCode::shape_mismatch, "num_q_heads: expected Hq >= 1 and a multiple of the cache's Hkv=" +
                                        std::to_string(cache.num_kv_heads) + " (GQA/MQA), got " +
                                        std::to_string(num_q_heads));
  check_options(options);
  paged_index::check_index_view(batch.kv_lens, "kv_lens", 1, "[S]");
  const i64 rows = batch.kv_lens.dim(0);
  paged_index::check_index_view(batch.cu_seqlens_q, "cu_seqlens_q", 1, "[S + 1]");
  if (batch.cu_seqlens_q.dim(0) != rows + 1)
    fail(ErrorCode::shape_mismatch, "cu_seqlens_q: expected shape [S + 1 = " + std::to_string(rows + 1) +
                                        "] (S from kv_lens " + shape_string(batch.kv_lens.shape()) +
                                        "), got " + shape_string(batch.cu_seqlens_q.shape()));
  paged_index::check_index_view(batch.page_table, "page_table", 2, "[S, max_pages]");
  if (batch.page_table.dim(0) != rows)
    fail(ErrorCode::shape_mismatch, "page_table: expected shape [S = " + std::to_string(rows) +
                                        ", max_pages] (S from kv_lens), got " +
                                        shape_string(batch.page_table.shape()));
  if (batch.num_seqs < -1)
    fail(ErrorCode::invalid_argument,
         "num_seqs: expected -1 (all the sequences of kv_lens) or a count >= 0, got " +
             std::to_string(batch.num_seqs));
  const i64 S = batch.num_seqs < 0 ? rows : batch.num_seqs;
  if (S > rows)
    fail(ErrorCode::invalid_argument, "num_seqs: " + std::to_string(batch.num_seqs) + " is more than the " +
                                          std::to_string(rows) + " sequences kv_lens holds");

  auto d = std::make_shared<PagedPlanData>();
  d->cache = cache;
  d->S = S, d->N = num_tokens, d->Hq = num_q_heads;
  d->split_tokens = options.kv_split_tokens.value_or(kDefaultKvSplitTokens);
  d->causal = options.causal, d->window = options.sliding_window, d->chunk = options.chunk_size;
  d->options = options;
  if (const std::optional<TensorView>& sinks = sinks_option(options.sinks, options.softmax_aux)) {
    // The plan outlives the caller's sinks tensor: it keeps a copy (checked as a run checks it).
    check_sinks(*sinks, num_q_heads, /*host_only=*/true);
    d->sinks = Tensor::copy_of(*sinks);
    d->options.sinks = d->sinks.view();
    d->options.softmax_aux.reset();
  }
  const auto n = static_cast<std::size_t>(S);
  d->q_begin.resize(n), d->q_len.resize(n), d->kv_len.resize(n), d->page_begin.resize(n + 1);

  // Sequences: query rows, key counts and pages, checked.
  const i64 ps = cache.page_size, width = batch.page_table.dim(1);
  if (rows >= 0 && at(batch.cu_seqlens_q, 0) != 0)
    fail(ErrorCode::invalid_argument,
         "cu_seqlens_q: expected cu[0] = 0, got " + std::to_string(at(batch.cu_seqlens_q, 0)));
  i64 total_pages = 0;
  for (i64 s = 0; s < S; ++s) {
    const i64 c0 = at(batch.cu_seqlens_q, s), c1 = at(batch.cu_seqlens_q, s + 1), kv = at(batch.kv_lens, s);
    if (c1 < c0)
      fail(ErrorCode::invalid_argument, "cu_seqlens_q: decreasing at " + seq_name(s) + ": cu[" +
                                            std::to_string(s) + "] = " + std::to_string(c0) + " > cu[" +
                                            std::to_string(s + 1) + "] = " + std::to_string(c1));
    if (c1 > num_tokens)
      fail(ErrorCode::invalid_argument, "cu_seqlens_q: cu[" + std::to_string(s + 1) +
                                            "] = " + std::to_string(c1) +
                                            " is past the N = " + std::to_string(num_tokens) + " rows of q");
    if (kv < 0 || kv > kMaxExtent)
      fail(ErrorCode::invalid_argument, "kv_lens: " + seq_name(s) + " has kv_len " + std::to_string(kv) +
                                            ", expected 0 <= kv_len <= 2^40");
    if (c1 - c0 > kv)
      fail(ErrorCode::invalid_argument,
           "kv_lens: " + seq_name(s) + " has q_len " + std::to_string(c1 - c0) + " > kv_len " +
               std::to_string(kv) +
               " (kv_len counts this step's tokens: its queries are its last q_len keys)");
    const i64 need = (kv + ps - 1) / ps;
    if (need > width)
      fail(ErrorCode::shape_mismatch, "page_table: too narrow for " + seq_name(s) + ": kv_len " +
                                          std::to_string(kv) + " at page_size " + std::to_string(ps) +
                                          " needs " + std::to_string(need) + " pages, the table has " +
                                          std::to_string(width) + " columns");
    const auto si = static_cast<std::size_t>(s);
    d->q_begin[si] = c0, d->q_len[si] = c1 - c0, d->kv_len[si] = kv;
    d->page_begin[si] = total_pages;
    total_pages += need;
  }
  d->page_begin[n] = total_pages;
  d->page_ids.resize(static_cast<std::size_t>(total_pages));
  for (i64 s = 0; s < S; ++s) {
    std::int32_t* out = d->page_ids.data() + d->page_begin[static_cast<std::size_t>(s)];
    const i64 need =
        d->page_begin[static_cast<std::size_t>(s) + 1] - d->page_begin[static_cast<std::size_t>(s)];
    // The common case (a contiguous row) in loops the compiler vectorises: copy, then one range
    // check over the row (as unsigned: a negative id is out of range too); the element-wise walk
    // below names the offending column.
    const TensorView& t = batch.page_table;
    if (t.stride(1) == 1 && need > 0) {
      i64 lo = 0, hi = 0;
      if (t.dtype() == DType::i32) {
        const std::int32_t* row = t.data_as<std::int32_t>() + s * t.stride(0);
        std::memcpy(out, row, static_cast<std::size_t>(need) * sizeof(std::int32_t));
        std::int32_t mn = row[0], mx = row[0];
        for (i64 j = 0; j < need; ++j) mn = std::min(mn, row[j]), mx = std::max(mx, row[j]);
        lo = mn, hi = mx;
      } else {
        const i64* row = t.data_as<i64>() + s * t.stride(0);
        i64 mn = row[0], mx = row[0];
        for (i64 j = 0; j < need; ++j) mn = std::min(mn, row[j]), mx = std::max(mx, row[j]);
        for (i64 j = 0; j < need; ++j) out[j] = static_cast<std::int32_t>(row[j]);
        lo = mn, hi = mx;
      }
      if (lo >= 0 && hi < cache.num_pages) continue;
    }
    for (i64 j = 0; j < need; ++j) {
      const i64 p = at(batch.page_table, s, j);
      if (p < 0 || p >= cache.num_pages)
        fail(ErrorCode::invalid_argument, "page_table: " + seq_name(s) + ", column " + std::to_string(j) +
                                              " holds page " + std::to_string(p) +
                                              ", outside the cache's pages [0, " +
                                              std::to_string(cache.num_pages) + ")");
      out[j] = static_cast<std::int32_t>(p);
    }
  }

  // The work list: shared items, then stream items, then tile items.
  const i64 G = num_q_heads / cache.num_kv_heads, T = d->split_tokens;
  d->unions.assign(n, KeyRange{});
  d->num_splits.assign(n, 0);
  d->is_stream.assign(n, 0);
  i64 n_stream = 0, n_tile = 0;
  for (i64 s = 0; s < S; ++s) {
    const auto si = static_cast<std::size_t>(s);
    const i64 ql = d->q_len[si];
    if (ql == 0) continue;
    // The union of the rows' visible keys: both ends of a row's range grow with its position,
    // so the first and the last row bound it (every row sees at least its own key).
    const KeyRange first_row = visible_keys(*d, s, 0), last_row = visible_keys(*d, s, ql - 1);
    const KeyRange u{std::min(first_row.lo, last_row.lo), std::max(first_row.hi, last_row.hi)};
    if (u.hi <= u.lo) continue;  // every row fully masked: output 0, lse -inf
    d->unions[si] = u;
    if (ql <= kPagedStreamMaxQ || G * ql <= kPagedStreamMaxRows) {
      d->is_stream[si] = 1;
      d->num_splits[si] = static_cast<std::int32_t>((u.hi - 1) / T - u.lo / T + 1);
      n_stream += d->num_splits[si];
    } else {
      ++n_tile;
    }
  }
  std::vector<std::int32_t> covered;
  std::vector<paged_share::Group> groups;
  if (options.share_prefixes && n_stream > 1) groups = paged_share::find(*d, covered);
  if (covered.empty()) {
    covered.assign(n, 0);
    d->in_shared.assign(n, 0);
  }
  for (i64 s = 0; s < S; ++s) n_stream -= covered[static_cast<std::size_t>(s)];
  const i64 n_shared = static_cast<i64>(groups.size());
  // Two passes: count the items, then write them in place (building each on the stack and
  // copying it in cost more than everything else here: store-forwarding stalls).
  d->work.resize(static_cast<std::size_t>(n_shared + n_stream + n_tile));
  PagedWorkItem* shared = d->work.data();
  PagedWorkItem* stream = shared + n_shared;
  PagedWorkItem* tile = stream + n_stream;
  for (const paged_share::Group& g : groups) {
    const PagedSharedMember& m0 = d->members[static_cast<std::size_t>(g.member_begin)];
    const auto s0 = static_cast<std::size_t>(m0.seq);
    shared->seq = m0.seq;
    shared->split = m0.split;
    shared->num_splits = d->num_splits[s0];
    shared->kind = PagedWorkKind::shared;
    shared->q_begin = d->q_begin[s0], shared->q_end = d->q_begin[s0] + d->q_len[s0];
    shared->kv_begin = g.kv_begin, shared->kv_end = g.kv_end;
    shared->member_begin = g.member_begin, shared->member_count = g.member_count;
    d->shared_keys += g.kv_end - g.kv_begin;
    ++shared;
  }
  for (i64 s = 0; s < S; ++s) {
    const auto si = static_cast<std::size_t>(s);
    const KeyRange u = d->unions[si];
    if (u.hi <= u.lo) continue;
    const i64 ql = d->q_len[si], q0 = d->q_begin[si];
    if (d->is_stream[si]) {
      const i64 first = u.lo / T, last = (u.hi - 1) / T;
      for (i64 k = first + covered[si]; k <= last; ++k, ++stream) {
        stream->seq = static_cast<std::int32_t>(s);
        stream->split = static_cast<std::int32_t>(k - first);
        stream->num_splits = static_cast<std::int32_t>(last - first + 1);
        stream->kind = PagedWorkKind::stream;
        stream->q_begin = q0, stream->q_end = q0 + ql;
        stream->kv_begin = std::max(u.lo, k * T), stream->kv_end = std::min(u.hi, (k + 1) * T);
      }
    } else {
      tile->seq = static_cast<std::int32_t>(s);
      tile->kind = PagedWorkKind::tile;
      tile->q_begin = q0, tile->q_end = q0 + ql;
      tile->kv_begin = u.lo, tile->kv_end = u.hi;
      ++tile;
    }
  }
  d->num_shared_items = n_shared;
  d->num_stream_items = n_shared + n_stream;
  PagedPlan plan;
  plan.data_ = std::move(d);
  return plan;
}

}  // namespace attnops
