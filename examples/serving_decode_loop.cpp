// A serving loop on attnops' paged KV cache, the way an inference engine drives it: sequences
// arrive with prompts, prefill in chunks, then decode one token per step, all of them in one
// ragged batch per step; the engine owns the pages (a free list) and the page tables.
//
// The cache is 8-bit (int8 codes, a scale per token and kv head: write() quantizes), and every
// sequence begins with the same system prompt, written once into pages that every page table
// starts with: the decode steps read those pages once for all the sequences (shared prefixes,
// bitwise the same results as reading them per sequence).
//
// Per step: the new tokens' slots (page table + position) -> cache.write(k_new, v_new, slots) for
// each layer -> plan_paged once -> attn.paged(q, cache, plan) for each layer, reusing the plan.
// The keys, values and queries are random (no model): what the example shows is the bookkeeping,
// and it checks it: every step's output of every sequence equals the dense call on that
// sequence's keys (gathered from the pages: the cache's values, code x scale) within the f32
// tolerance. Exit status 1 on a mismatch.
//
// usage: serving_decode_loop
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "attnops/attnops.h"

namespace {

using attnops::DType;
using attnops::Tensor;
using attnops::TensorView;
using i64 = std::int64_t;

constexpr i64 kLayers = 2, kHq = 8, kHkv = 2, kD = 64, kPage = 16, kPages = 64, kChunk = 48, kSteps = 40;
constexpr i64 kSystem = 64;  // the shared system prompt: its tokens, 4 pages
constexpr i64 kSplit = 32;   // kv_split_tokens: the prompt is 2 whole splits, which decode steps share

struct Sequence {
  i64 arrives = 0, prompt = 0;  // step it joins, prompt length
  i64 len = 0;                  // tokens in the cache
  std::vector<i64> pages;       // its page table row
};

Tensor random(std::vector<i64> shape, std::mt19937& rng) {
  Tensor t(DType::f32, std::move(shape));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (i64 i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(rng);
  return t;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  // One cache per layer; the engine's free list of page ids (shared by the layers' caches).
  std::vector<attnops::PagedKVCache> caches;
  for (i64 l = 0; l < kLayers; ++l)
    caches.push_back(attnops::PagedKVCache::host({kPages, kPage, kHkv, kD, kD, DType::i8}));
  std::vector<i64> free_pages;
  for (i64 p = kPages - 1; p >= 0; --p) free_pages.push_back(p);
  // The system prompt, written once per layer into pages every sequence's table starts with.
  std::vector<i64> system_pages;
  for (i64 p = 0; p < kSystem / kPage; ++p) system_pages.push_back(free_pages.back()), free_pages.pop_back();
  Tensor system_slots(DType::i64, {kSystem});
  for (i64 t = 0; t < kSystem; ++t)
    system_slots.data_as<i64>()[t] = system_pages[t / kPage] * kPage + t % kPage;
  for (i64 l = 0; l < kLayers; ++l)
    caches[l].write(random({kSystem, kHkv, kD}, rng), random({kSystem, kHkv, kD}, rng), system_slots);
  // Sequences: their step of arrival and prompt (the system prompt included), already in the cache.
  std::vector<Sequence> seqs = {{0, kSystem + 100, kSystem, system_pages},
                                {0, kSystem + 7, kSystem, system_pages},
                                {3, kSystem + 150, kSystem, system_pages},
                                {10, kSystem + 30, kSystem, system_pages}};

  const attnops::Attention attn = attnops::registry().get("paged");  // ragged_paged
  attnops::OperationMetadata oracle_md;
  oracle_md.backends = {attnops::Backend::native};
  const attnops::Attention oracle = attnops::registry().get("vanilla", oracle_md);
  double worst = 0;
  std::string decision;
  std::int64_t shared_keys = 0;

  for (i64 step = 0; step < kSteps; ++step) {
    // This step's tokens: a chunk of the prompt while prefilling, then one token.
    std::vector<i64> active, q_len;
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      Sequence& x = seqs[s];
      if (step < x.arrives) continue;
      const i64 n = x.len < x.prompt ? std::min(kChunk, x.prompt - x.len) : 1;
      while (static_cast<i64>(x.pages.size()) * kPage < x.len + n) {  // the engine allocates pages
        x.pages.push_back(free_pages.back());
        free_pages.pop_back();
      }
      active.push_back(static_cast<i64>(s));
      q_len.push_back(n);
    }
    const i64 S = static_cast<i64>(active.size());
    i64 N = 0, width = 1;
    for (i64 i = 0; i < S; ++i) N += q_len[i], width = std::max<i64>(width, seqs[active[i]].pages.size());

    // The batch: cu_seqlens_q, kv_lens (this step's tokens included), page table; slots of the
    // new tokens: page_table[s][pos / page] * page + pos % page.
    Tensor cu(DType::i32, {S + 1}), kv(DType::i32, {S}), table(DType::i32, {S, width}),
        slots(DType::i64, {N});
    i64 row = 0;
    for (i64 i = 0; i < S; ++i) {
      const Sequence& x = seqs[active[i]];
      cu.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(row);
      kv.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(x.len + q_len[i]);
      for (i64 j = 0; j < width; ++j)
        table.data_as<std::int32_t>()[i * width + j] = j < static_cast<i64>(x.pages.size()) ? x.pages[j] : 0;
      for (i64 t = 0; t < q_len[i]; ++t, ++row) {
        const i64 pos = x.len + t;
        slots.data_as<i64>()[row] = x.pages[pos / kPage] * kPage + pos % kPage;
      }
    }
    cu.data_as<std::int32_t>()[S] = static_cast<std::int32_t>(N);
    const attnops::RaggedBatch batch{cu, kv, table};
    attnops::PagedAttentionOptions opts;  // causal; a sliding window or soft cap would go here
    opts.kv_split_tokens = kSplit;
    // Once per step: validation and the work list, reused by every layer.
    const attnops::PagedPlan plan = attnops::plan_paged(batch, caches[0].spec(), N, kHq, opts);

    for (i64 l = 0; l < kLayers; ++l) {
      // The layer's projections of the new tokens (random here), written into its cache...
      const Tensor k_new = random({N, kHkv, kD}, rng), v_new = random({N, kHkv, kD}, rng),
                   q = random({N, kHq, kD}, rng);
      caches[l].write(k_new, v_new, slots);
      // ... then one call for the whole mixed batch.
      const attnops::AttentionOutput out = attn.paged(q, caches[l], plan, opts);
      decision = out.decision.to_log_line();
      shared_keys = std::max(shared_keys, out.decision.run.shared_keys);
      // The check: each sequence against the dense call on its gathered keys.
      for (i64 i = 0; i < S; ++i) {
        const TensorView page_row(table.data_as<std::int32_t>() + i * width, DType::i32, {width});
        const attnops::PagedKVCache::Dense d = caches[l].gather(page_row, kv.data_as<std::int32_t>()[i]);
        const i64 q0 = cu.data_as<std::int32_t>()[i];
        const TensorView qs(q.data_as<float>() + q0 * kHq * kD, DType::f32, {1, q_len[i], kHq, kD});
        const Tensor want = oracle(qs, d.k, d.v).out;
        for (i64 e = 0; e < want.numel(); ++e)
          worst = std::max(worst, static_cast<double>(std::fabs(out.out.data_as<float>()[q0 * kHq * kD + e] -
                                                                want.data_as<float>()[e])));
      }
    }
    for (i64 i = 0; i < S; ++i) seqs[active[i]].len += q_len[i];
    if (step == 0 || step == 3 || step == kSteps - 1)
      std::printf("step %2lld: %lld sequences, %lld query tokens, plan: %zu work items\n",
                  static_cast<long long>(step), static_cast<long long>(S), static_cast<long long>(N),
                  plan.work().size());
  }
  std::printf("last call: %s\n", decision.c_str());
  std::printf("keys read once for several sequences in one step: up to %lld\n",
              static_cast<long long>(shared_keys));
  std::printf("max |paged - dense| over every step, layer and sequence: %.2e\n", worst);
  attnops::release_gpu();
  if (!(worst <= 2e-5)) {
    std::printf("FAILED: the paged output differs from the dense call\n");
    return 1;
  }
  if (shared_keys < kSystem) {
    std::printf("FAILED: the decode steps did not share the system prompt's pages\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
