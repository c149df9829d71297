// The paged cache, the plan and the operator's routing: write + gather bit for bit
// (host and device), write all or nothing, page views; each bad input a typed error
// naming the argument with nothing written; the work list; dispatch, reasons, YAML backend
// selection, ATTNOPS_LOG=dispatch, a device cache with host-only backends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>

#include "tests/paged/paged_cases.h"
#include "tests/routing/mocks.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Return;
using i64 = std::int64_t;

// The error `f` throws: its code and that the message names `what`.
void expect_error(const std::function<void()>& f, ErrorCode code, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error (expected " << error_code_name(code) << " naming " << what << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
}

Tensor index(DType dt, std::vector<i64> values, std::vector<i64> shape = {}) {
  if (shape.empty()) shape = {static_cast<i64>(values.size())};
  Tensor t(dt, shape);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dt == DType::i32)
      t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(values[i]);
    else
      t.data_as<i64>()[i] = values[i];
  }
  return t;
}

// ---- the cache ------------------------------------------------------------------------------

TEST(PagedCache, WriteThenGatherReturnsTheRowsBitForBit) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (i64 page : {1, 3, 16}) {
      PagedCaseSpec s;  // make_paged_case writes every token through write(), shuffled, with padding rows
      s.q_lens = {0, 1, 2}, s.kv_lens = {37, 5, 16}, s.page_size = page, s.dtype = dt, s.Dv = 24;
      const PagedCase c = make_paged_case(s);
      const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
      for (i64 x = 0; x < 3; ++x) {
        const TensorView row(static_cast<const char*>(c.table.data()) + x * c.table.dim(1) * 4, DType::i32,
                             {c.table.dim(1)});
        EXPECT_EQ(c.cache.gather(row, 0).k.dim(1), 0);  // kv_len 0: nothing
        const PagedKVCache::Dense g = c.cache.gather(row, plan.kv_len(x));
        EXPECT_TRUE(same_bits(g.k, c.k_seq[static_cast<std::size_t>(x)]))
            << dtype_name(dt) << " page " << page;
        EXPECT_TRUE(same_bits(g.v, c.v_seq[static_cast<std::size_t>(x)]))
            << dtype_name(dt) << " page " << page;
      }
    }
}

TEST(PagedCache, PageViewsAndWrappedStridedPools) {
  // Pools that are a slice of a larger allocation (every other page): wrap() reads and writes them.
  Tensor big_k(DType::f32, {8, 4, 2, 8}), big_v(DType::f32, {8, 4, 2, 6});
  const TensorView k(big_k.data(), DType::f32, {4, 4, 2, 8}, {2 * 4 * 2 * 8, 2 * 8, 8, 1});
  const TensorView v(big_v.data(), DType::f32, {4, 4, 2, 6}, {2 * 4 * 2 * 6, 2 * 6, 6, 1});
  PagedKVCache cache = PagedKVCache::wrap(k, v);
  EXPECT_EQ(cache.spec(), (PagedKVSpec{4, 4, 2, 8, 6, DType::f32}));
  const Tensor kn = random_tensor(DType::f32, {2, 2, 8}, 1), vn = random_tensor(DType::f32, {2, 2, 6}, 2);
  cache.write(kn, vn, index(DType::i64, {9, 14}));  // page 2 row 1, page 3 row 2
  const TensorView p2 = cache.k_page(2);
  EXPECT_EQ(p2.shape(), (std::vector<i64>{4, 2, 8}));
  EXPECT_EQ(std::memcmp(static_cast<const float*>(p2.data()) + p2.stride(0), kn.data(), 2 * 8 * 4), 0);
  // Page 2 of the wrapped pool is page 4 of the large one.
  EXPECT_EQ(std::memcmp(big_k.data_as<float>() + 4 * 4 * 2 * 8 + 2 * 8, kn.data(), 2 * 8 * 4), 0);
  EXPECT_EQ(std::memcmp(static_cast<const float*>(cache.v_page(3).data()) + 2 * 2 * 6,
                        vn.data_as<float>() + 2 * 6, 2 * 6 * 4),
            0);
  expect_error([&] { (void)cache.k_page(4); }, ErrorCode::invalid_argument, "k_page");
  // f32 rows into an f16 cache are rounded as Tensor::copy_of rounds them.
  PagedKVCache half = PagedKVCache::host({2, 2, 2, 8, 6, DType::f16});
  half.write(kn, vn, index(DType::i32, {-1, 3}));
  const Tensor want = Tensor::copy_of(kn, DType::f16);
  EXPECT_EQ(std::memcmp(static_cast<const char*>(half.k_page(1).data()) + half.k_page(1).stride(0) * 2,
                        static_cast<const char*>(want.data()) + 2 * 8 * 2, 2 * 8 * 2),
            0);
}

TEST(PagedCache, BadWritesAreTypedErrorsAndWriteNothing) {
  PagedKVCache cache = PagedKVCache::host({4, 4, 2, 8, 8, DType::f32});
  const Tensor kn = random_tensor(DType::f32, {3, 2, 8}, 1), vn = random_tensor(DType::f32, {3, 2, 8}, 2);
  const auto untouched = [&] {
    const Tensor k = Tensor::copy_of(cache.k_pages()), v = Tensor::copy_of(cache.v_pages());
    for (i64 i = 0; i < k.numel(); ++i)
      if (k.at(static_cast<std::size_t>(i)) != 0.f || v.at(static_cast<std::size_t>(i)) != 0.f) return false;
    return true;
  };
  // A slot outside the pool (16 slots): the valid rows before it are not written either.
  expect_error(
      [&] {
        cache.write(kn, vn, index(DType::i32, {0, 5, 16}));
      },
      ErrorCode::invalid_argument, "slot_mapping");
  EXPECT_TRUE(untouched());
  // Two rows writing one slot.
  expect_error(
      [&] {
        cache.write(kn, vn, index(DType::i64, {7, 2, 7}));
      },
      ErrorCode::invalid_argument, "rows 0 and 2 both write slot 7");
  EXPECT_TRUE(untouched());
  expect_error(
      [&] {
        cache.write(kn, vn, index(DType::i32, {0, 1}));
      },
      ErrorCode::shape_mismatch, "slot_mapping");
  expect_error([&] { cache.write(kn, vn, Tensor(DType::f32, {3})); }, ErrorCode::unsupported_dtype,
               "slot_mapping");
  expect_error(
      [&] {
        cache.write(random_tensor(DType::f32, {3, 1, 8}, 3), vn, index(DType::i32, {0, 1, 2}));
      },
      ErrorCode::shape_mismatch, "k_new");
  expect_error(
      [&] {
        cache.write(kn, random_tensor(DType::f32, {2, 2, 8}, 3), index(DType::i32, {0, 1, 2}));
      },
      ErrorCode::shape_mismatch, "v_new");
  expect_error(
      [&] {
        cache.write(kn, Tensor(DType::i32, {3, 2, 8}), index(DType::i32, {0, 1, 2}));
      },
      ErrorCode::unsupported_dtype, "v_new");
  EXPECT_TRUE(untouched());
  // gather's page row.
  expect_error([&] { (void)cache.gather(index(DType::i32, {0}), 5); }, ErrorCode::shape_mismatch, "page_row");
  expect_error(
      [&] {
        (void)cache.gather(index(DType::i32, {0, 4}), 5);
      },
      ErrorCode::invalid_argument, "page_row");
  // Specs and pools.
  expect_error(
      [] {
        (void)PagedKVCache::host({0, 4, 2, 8, 8, DType::f32});
      },
      ErrorCode::invalid_argument, "num_pages");
  expect_error(
      [] {
        (void)PagedKVCache::host({2, 4, 2, 8, 8, DType::i32});
      },
      ErrorCode::unsupported_dtype, "dtype");
  expect_error(
      [] {
        (void)PagedKVCache::from_tensors(Tensor(DType::f32, {2, 4, 2, 8}), Tensor(DType::f32, {2, 4, 1, 8}));
      },
      ErrorCode::shape_mismatch, "v_pages");
  expect_error(
      [] {
        (void)PagedKVCache::from_tensors(Tensor(DType::f32, {2, 4, 2, 8}), Tensor(DType::f16, {2, 4, 2, 8}));
      },
      ErrorCode::unsupported_dtype, "v_pages");
}

// ---- the plan -------------------------------------------------------------------------------

struct Batch {
  Tensor cu, kv, table;
  RaggedBatch view() const { return {cu, kv, table}; }
};
Batch batch(std::vector<i64> cu, std::vector<i64> kv, std::vector<i64> table, i64 width,
            DType dt = DType::i32) {
  const auto S = static_cast<i64>(kv.size());
  return {index(dt, cu), index(dt, kv), index(dt, table, {S, width})};
}

TEST(PagedPlan, BadBatchesAreTypedErrorsNamingTheArgument) {
  const PagedKVSpec spec{8, 4, 2, 8, 8, DType::f32};
  const auto plan = [&](const Batch& b, i64 N = 6, i64 Hq = 4, PagedAttentionOptions o = {}) {
    return [=] { (void)plan_paged(b.view(), spec, N, Hq, o); };
  };
  // Valid: 2 sequences, q rows [0, 1) and [1, 6), 9 and 5 keys.
  EXPECT_NO_THROW(plan(batch({0, 1, 6}, {9, 5}, {0, 1, 2, 3, 4, 99}, 3))());
  expect_error(plan(batch({1, 1, 6}, {9, 5}, {0, 1, 2, 3, 4, 5}, 3)), ErrorCode::invalid_argument,
               "cu_seqlens_q: expected cu[0] = 0");
  expect_error(plan(batch({0, 4, 3}, {9, 5}, {0, 1, 2, 3, 4, 5}, 3)), ErrorCode::invalid_argument,
               "cu_seqlens_q: decreasing");
  expect_error(plan(batch({0, 1, 7}, {9, 5}, {0, 1, 2, 3, 4, 5}, 3)), ErrorCode::invalid_argument,
               "past the N = 6");
  expect_error(plan(batch({0, 1, 6}, {9, 4}, {0, 1, 2, 3, 4, 5}, 3)), ErrorCode::invalid_argument,
               "q_len 5 > kv_len 4");
  expect_error(plan(batch({0, 1, 6}, {9, 5}, {0, 1, 8, 3, 4, 5}, 3)), ErrorCode::invalid_argument,
               "page_table");
  expect_error(plan(batch({0, 1, 6}, {9, 5}, {0, 1, 2, 3}, 2)), ErrorCode::shape_mismatch,
               "page_table: too narrow");
  expect_error(plan(batch({0, 1, 6}, {-1, 5}, {0, 1, 2, 3, 4, 5}, 3)), ErrorCode::invalid_argument,
               "kv_lens");
  expect_error(plan(batch({0, 1}, {9, 5}, {0, 1, 2, 3, 4, 5}, 3)), ErrorCode::shape_mismatch, "cu_seqlens_q");
  Batch f = batch({0, 1, 6}, {9, 5}, {0, 1, 2, 3, 4, 5}, 3);
  f.kv = Tensor(DType::f32, {2});
  expect_error(plan(f), ErrorCode::unsupported_dtype, "kv_lens");
  const Batch ok = batch({0, 1, 6}, {9, 5}, {0, 1, 2, 3, 4, 5}, 3, DType::i64);
  expect_error(plan(ok, 6, 3), ErrorCode::shape_mismatch, "num_q_heads");
  expect_error(plan(ok, 6, 4, {.sliding_window = Window{-1, 0}}), ErrorCode::invalid_argument,
               "sliding_window");
  expect_error(plan(ok, 6, 4, {.chunk_size = 0}), ErrorCode::invalid_argument, "chunk_size");
  expect_error(plan(ok, 6, 4, {.kv_split_tokens = 0}), ErrorCode::invalid_argument, "kv_split_tokens");
  RaggedBatch padded = ok.view();
  padded.num_seqs = 3;
  expect_error([&] { (void)plan_paged(padded, spec, 6, 4); }, ErrorCode::invalid_argument, "num_seqs");
}

TEST(PagedPlan, WorkListSplitsEachSequenceOnItsOwn) {
  const PagedKVSpec spec{64, 16, 2, 8, 8, DType::f32};
  // Decode over 1000 keys, nothing, a prefill of 40 (a tile item: G * 40 > 32), a decode of 3.
  std::vector<i64> table(4 * 63);
  std::iota(table.begin(), table.end(), 0);
  for (auto& p : table) p %= 64;
  const Batch b = batch({0, 1, 1, 41, 42}, {1000, 7, 40, 3}, table, 63);
  const PagedPlan p = plan_paged(b.view(), spec, 42, 4, {.kv_split_tokens = 256});
  EXPECT_EQ(p.num_seqs(), 4);
  EXPECT_EQ(p.kv_len(0), 1000);
  std::vector<PagedWorkItem> w = p.work();
  ASSERT_EQ(w.size(), 4u + 1u + 1u);
  for (int k = 0; k < 4; ++k) {  // [0, 256), [256, 512), [512, 768), [768, 1000)
    EXPECT_EQ(w[k].seq, 0);
    EXPECT_EQ(w[k].kind, PagedWorkKind::stream);
    EXPECT_EQ(w[k].split, k);
    EXPECT_EQ(w[k].num_splits, 4);
    EXPECT_EQ(w[k].kv_begin, 256 * k);
    EXPECT_EQ(w[k].kv_end, std::min<i64>(256 * (k + 1), 1000));
  }
  EXPECT_EQ(w[4].seq, 3);
  EXPECT_EQ(w[4].num_splits, 1);
  EXPECT_EQ(w[5].seq, 2);
  EXPECT_EQ(w[5].kind, PagedWorkKind::tile);
  EXPECT_EQ(w[5].q_begin, 1);
  EXPECT_EQ(w[5].q_end, 41);
  // A sliding window leaves the decode only the splits its window reaches.
  const PagedPlan pw =
      plan_paged(b.view(), spec, 42, 4, {.sliding_window = Window{300, 0}, .kv_split_tokens = 256});
  EXPECT_EQ(pw.work()[0].kv_begin, 699);
  EXPECT_EQ(pw.work()[0].num_splits, 2);
}

TEST(PagedPlan, RunChecksTheCallAgainstThePlan) {
  PagedCaseSpec s;
  s.q_lens = {1, 3}, s.kv_lens = {20, 9};
  const PagedCase c = make_paged_case(s);
  const Attention attn = registry().get("paged");
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
  EXPECT_NO_THROW(attn.paged(c.q, c.cache, plan, c.options));
  PagedAttentionOptions other = c.options;
  other.causal = false;
  expect_error([&] { attn.paged(c.q, c.cache, plan, other); }, ErrorCode::invalid_argument,
               "the plan was built for causal=true");
  expect_error(
      [&] {
        attn.paged(random_tensor(DType::f32, {c.N, 2, s.D}, 1), c.cache, plan, c.options);
      },
      ErrorCode::shape_mismatch, "q: expected shape");
  expect_error(
      [&] {
        attn.paged(random_tensor(DType::f16, {c.N, s.Hq, s.D}, 1), c.cache, plan, c.options);
      },
      ErrorCode::unsupported_dtype, "q: dtype f16 differs from the cache's f32");
  const PagedKVCache other_cache =
      PagedKVCache::host({c.cache.spec().num_pages, 8, s.Hkv, s.D, s.Dv, DType::f32});
  expect_error([&] { attn.paged(c.q, other_cache, plan, c.options); }, ErrorCode::shape_mismatch,
               "page_size=8 (planned 16)");
  Tensor sinks(DType::f32, {3});
  PagedAttentionOptions with_sinks = c.options;
  with_sinks.sinks = sinks.view();
  expect_error([&] { attn.paged(c.q, c.cache, plan, with_sinks); }, ErrorCode::shape_mismatch, "softmax_aux");
  OperationMetadata md;
  md.runtime_dtype = DType::bf16;
  expect_error([&] { registry().get("paged", md).paged(c.q, c.cache, plan, c.options); },
               ErrorCode::unsupported_dtype, "runtime_dtype");
  // An operator that does not serve paged batches says so.
  expect_error([&] { registry().get("flash").paged(c.q, c.cache, plan, c.options); },
               ErrorCode::not_implemented, "does not serve paged batches");
}

// ---- a plan carries its options -------------------------------------------------------------

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(PagedPlanOptions, ARunWithoutOptionsUsesThePlansOptions) {
  PagedCaseSpec s;
  s.q_lens = {1, 5, 0, 3}, s.kv_lens = {40, 9, 7, 33};
  s.window = Window{6, 0}, s.soft_cap = 4.0, s.sinks = true, s.split = 8;
  const PagedCase c = make_paged_case(s);  // c.options: those masks, soft cap, sinks, return_lse on
  PagedAttentionOptions opts = c.options;
  opts.softmax_scale = 0.3;
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, opts);
  EXPECT_TRUE(plan.options().sinks.has_value());
  EXPECT_EQ(plan.options().softmax_scale, 0.3);
  const Attention attn = registry().get("paged");
  const AttentionOutput with = attn.paged(c.q, c.cache, plan, opts);
  const AttentionOutput without = attn.paged(c.q, c.cache, plan);
  ASSERT_TRUE(without.lse.has_value());  // return_lse came from the plan
  EXPECT_TRUE(same_bits(with.out, without.out));
  EXPECT_TRUE(same_bits(*with.lse, *without.lse));
  EXPECT_EQ(attn.explain(c.q, c.cache, plan).backend, with.decision.backend);
  // The options matter: without the soft cap, sinks and scale the output differs.
  PagedAttentionOptions masks_only;
  masks_only.sliding_window = s.window, masks_only.kv_split_tokens = s.split;
  const AttentionOutput bare = attn.paged(c.q, c.cache, plan, masks_only);
  EXPECT_FALSE(same_bits(bare.out, without.out));
}

TEST(PagedPlanOptions, ThePlanKeepsACopyOfTheSinks) {
  PagedCaseSpec s;
  s.q_lens = {2, 1}, s.kv_lens = {20, 9};
  s.sinks = true;
  const PagedCase c = make_paged_case(s);
  const Attention attn = registry().get("paged");
  Tensor sinks = Tensor::copy_of(*c.options.sinks);
  PagedAttentionOptions opts = c.options;
  opts.sinks = sinks.view();
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, opts);
  const AttentionOutput before = attn.paged(c.q, c.cache, plan);
  for (std::size_t i = 0; i < 4; ++i) sinks.set(i, 50.f);  // the caller reuses its buffer
  const AttentionOutput after = attn.paged(c.q, c.cache, plan);
  EXPECT_TRUE(same_bits(before.out, after.out));
  // Bad sinks are refused when planning, naming them.
  Tensor three(DType::f32, {3});
  opts.sinks = three.view();
  expect_error([&] { plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, opts); }, ErrorCode::shape_mismatch,
               "sinks");
}

TEST(PagedPlanOptions, MismatchedRunOptionsNameThePlanOnlyRun) {
  PagedCaseSpec s;
  s.q_lens = {1}, s.kv_lens = {12};
  s.window = Window{4, 0};
  const PagedCase c = make_paged_case(s);
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
  const Attention attn = registry().get("paged");
  PagedAttentionOptions other = c.options;
  other.sliding_window = Window{2, 0};
  expect_error([&] { attn.paged(c.q, c.cache, plan, other); }, ErrorCode::invalid_argument,
               "run it as paged(q, cache, plan)");
}

TEST(PagedPlanOptions, SinksAndSoftmaxAuxAreOneOption) {
  PagedCaseSpec s;
  s.q_lens = {2, 1}, s.kv_lens = {20, 9};
  s.sinks = true;
  const PagedCase c = make_paged_case(s);
  const Attention attn = registry().get("paged");
  PagedAttentionOptions aux = c.options;
  aux.softmax_aux = aux.sinks;
  aux.sinks.reset();
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
  EXPECT_TRUE(
      same_bits(attn.paged(c.q, c.cache, plan, aux).out, attn.paged(c.q, c.cache, plan, c.options).out));
  PagedAttentionOptions both = c.options;
  both.softmax_aux = both.sinks;
  expect_error([&] { attn.paged(c.q, c.cache, plan, both); }, ErrorCode::invalid_argument, "given twice");
  expect_error([&] { plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, both); }, ErrorCode::invalid_argument,
               "given twice");
}

// Any paged entry point on an operator that is not ragged_paged fails at the call, before it looks
// at its arguments (here a batch plan_paged would refuse for another reason).
TEST(PagedPlanOptions, OnlyRaggedPagedServesPagedCalls) {
  PagedCaseSpec s;
  s.q_lens = {1}, s.kv_lens = {12};
  const PagedCase c = make_paged_case(s);
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
  const RaggedBatch bad{};  // no index arrays
  for (const char* name : {"flash_attn2", "blocksparse", "vanilla"}) {
    const Attention attn = registry().get(name);
    EXPECT_FALSE(attn.implements_paged(Backend::cpu));
    expect_error([&] { attn.paged(c.q, c.cache, bad, c.options); }, ErrorCode::not_implemented,
                 "does not serve paged batches");
    expect_error([&] { attn.paged(c.q, c.cache, plan); }, ErrorCode::not_implemented, "ragged_paged");
    expect_error([&] { attn.explain(c.q, c.cache, plan); }, ErrorCode::not_implemented, "ragged_paged");
  }
  EXPECT_TRUE(registry().get("paged").implements_paged(Backend::cpu));
}

// The old names still compile (with a deprecation warning) and do what explain does.
TEST(PagedPlanOptions, DeprecatedExplainPagedStillWorks) {
  PagedCaseSpec s;
  s.q_lens = {1, 3}, s.kv_lens = {12, 30};
  const PagedCase c = make_paged_case(s);
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
  const Attention attn = registry().get("paged");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const DispatchDecision old = attn.explain_paged(c.q, c.cache, plan, c.options);
#pragma GCC diagnostic pop
  EXPECT_EQ(old.to_json(), attn.explain(c.q, c.cache, plan, c.options).to_json());
}

// ---- routing --------------------------------------------------------------------------------

TEST(PagedRouting, DecisionReasonsConfigAndLog) {
  PagedCaseSpec s;
  s.q_lens = {1, 4}, s.kv_lens = {33, 4};
  const PagedCase c = make_paged_case(s);
  // A host with a gpu: auto keeps a host cache off it (it would be uploaded whole every call).
  auto host = std::make_shared<::testing::NiceMock<MockHost>>();
  ON_CALL(*host, availability).WillByDefault(Return(Availability{true, "mock"}));
  ON_CALL(*host, cost_rates).WillByDefault(Return(std::nullopt));
  Registry reg(host);
  register_builtin_operators(reg);
  const AttentionOutput o = reg.get("paged").paged(c.q, c.cache, c.batch, c.options);
  EXPECT_EQ(o.decision.requested, "ragged_paged");
  EXPECT_EQ(o.decision.op, "ragged_paged");
  EXPECT_EQ(o.decision.backend, Backend::cpu);
  ASSERT_EQ(o.decision.reasons.size(), 1u);
  EXPECT_EQ(o.decision.reasons[0].code, ReasonCode::cpu_faster);
  EXPECT_THAT(o.decision.reasons[0].detail, HasSubstr("gpu: a host cache would be uploaded whole"));
  EXPECT_THAT(o.decision.to_json(), HasSubstr("\"batch_invariant\": true"));
  EXPECT_FALSE(o.decision.run.kernel.empty());
  // The decision without running it.
  EXPECT_EQ(reg.get("paged")
                .explain(c.q, c.cache, plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options), c.options)
                .backend,
            Backend::cpu);
  // YAML: the operator's backend, by alias.
  const Config cfg = parse_config("operators:\n  paged:\n    backend: native\n");
  EXPECT_EQ(reg.get("ragged_paged", cfg).paged(c.q, c.cache, c.batch, c.options).decision.backend,
            Backend::native);
  const Config off = parse_config("disabled_backends: [cpu]\n");
  const AttentionOutput n = reg.get("ragged_paged", off).paged(c.q, c.cache, c.batch, c.options);
  EXPECT_EQ(n.decision.backend, Backend::native);
  EXPECT_TRUE(n.decision.has(ReasonCode::disabled_by_config));
  // ATTNOPS_LOG=dispatch: one line per call.
  ::setenv("ATTNOPS_LOG", "dispatch", 1);
  attnops::reload_environment();
  ::testing::internal::CaptureStderr();
  (void)reg.get("paged").paged(c.q, c.cache, c.batch, c.options);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ::unsetenv("ATTNOPS_LOG");
  attnops::reload_environment();
  EXPECT_THAT(log, HasSubstr("attnops,dispatch,ragged_paged,cpu/"));
  EXPECT_THAT(log, HasSubstr("cpu_faster:gpu: a host cache would be uploaded whole"));
  // ATTNOPS_FORCE_NATIVE.
  ::setenv("ATTNOPS_FORCE_NATIVE", "1", 1);
  attnops::reload_environment();
  const AttentionOutput f = reg.get("paged").paged(c.q, c.cache, c.batch, c.options);
  ::unsetenv("ATTNOPS_FORCE_NATIVE");
  attnops::reload_environment();
  EXPECT_EQ(f.decision.backend, Backend::native);
  EXPECT_TRUE(f.decision.has(ReasonCode::forced_native));
  // tpu named first: unavailable, as for every operator.
  OperationMetadata md;
  md.backends = {Backend::tpu};
  ON_CALL(*host, availability(Backend::tpu, ::testing::_))
      .WillByDefault(Return(Availability{false, "no TPU runtime"}));
  EXPECT_TRUE(reg.get("paged", md)
                  .paged(c.q, c.cache, c.batch, c.options)
                  .decision.has(ReasonCode::backend_unavailable));
}

GpuSettings software_gpu() {
  GpuSettings g;
  g.allow_software = true;
  return g;
}

TEST(PagedDevice, WriteThenGatherOnTheDeviceAndHostOnlyBackendsRefuseIt) {
  if (!registry().host().availability(Backend::gpu, software_gpu()).available)
    GTEST_SKIP() << "no Vulkan device (lavapipe) here";
  PagedCaseSpec s;
  s.q_lens = {1, 2}, s.kv_lens = {21, 6}, s.page_size = 4, s.dtype = DType::f16, s.Dv = 12;
  const PagedCase c = make_paged_case(s);
  const PagedKVSpec spec = c.cache.spec();
  PagedKVCache dev = PagedKVCache::device(spec, software_gpu());
  EXPECT_TRUE(dev.on_device());
  // The host cache's pools, written into the device one through write() (one slot per row).
  const i64 slots = spec.num_pages * spec.page_size;
  std::vector<i64> all(static_cast<std::size_t>(slots));
  std::iota(all.begin(), all.end(), 0);
  std::reverse(all.begin(), all.end());  // backwards: runs of one row
  const TensorView kp = c.cache.k_pages(), vp = c.cache.v_pages();
  Tensor kn(spec.dtype, {slots, spec.num_kv_heads, spec.head_dim}),
      vn(spec.dtype, {slots, spec.num_kv_heads, spec.dv()});
  const std::size_t krow = static_cast<std::size_t>(spec.num_kv_heads * spec.head_dim) * 2,
                    vrow = static_cast<std::size_t>(spec.num_kv_heads * spec.dv()) * 2;
  for (i64 t = 0; t < slots; ++t) {
    std::memcpy(static_cast<char*>(kn.data()) + t * krow, static_cast<const char*>(kp.data()) + all[t] * krow,
                krow);
    std::memcpy(static_cast<char*>(vn.data()) + t * vrow, static_cast<const char*>(vp.data()) + all[t] * vrow,
                vrow);
  }
  dev.write(kn, vn, index(DType::i64, all));
  for (std::size_t x = 0; x < 2; ++x) {
    const TensorView row(static_cast<const char*>(c.table.data()) + x * c.table.dim(1) * 4, DType::i32,
                         {c.table.dim(1)});
    const PagedKVCache::Dense g = dev.gather(row, s.kv_lens[x]);
    EXPECT_TRUE(same_bits(g.k, c.k_seq[x]));
    EXPECT_TRUE(same_bits(g.v, c.v_seq[x]));
  }
  // Runs of consecutive slots, and the all-or-nothing check before any byte moves.
  dev.write(kn.view().slice(0, 0, 3), vn.view().slice(0, 0, 3), index(DType::i32, {4, 5, 6}));
  const auto d0 = dev.gather(index(DType::i32, {1, 0}), 7);
  EXPECT_EQ(std::memcmp(static_cast<const char*>(d0.k.data()) + 0, kn.data(), 3 * krow), 0);
  expect_error(
      [&] {
        dev.write(kn.view().slice(0, 0, 2), vn.view().slice(0, 0, 2), index(DType::i32, {1, slots}));
      },
      ErrorCode::invalid_argument, "slot_mapping");
  // Host-only backends cannot read it: a typed error naming the cache, never a silent copy (auto
  // runs it on the gpu: tests/paged/paged_gpu_test.cpp).
  OperationMetadata md;
  md.gpu = software_gpu();
  md.backends = {Backend::cpu};
  expect_error([&] { registry().get("paged", md).paged(c.q, dev, c.batch, c.options); },
               ErrorCode::invalid_argument,
               "the cache (k_pages, v_pages) is device-resident and the backend asked for is cpu");
  md.backends = {Backend::native};
  expect_error([&] { registry().get("paged", md).paged(c.q, dev, c.batch, c.options); },
               ErrorCode::invalid_argument,
               "the cache (k_pages, v_pages) is device-resident and the backend asked for is native");
  ::setenv("ATTNOPS_FORCE_NATIVE", "1", 1);
  attnops::reload_environment();
  expect_error([&] { registry().get("paged").paged(c.q, dev, c.batch, c.options); },
               ErrorCode::invalid_argument, "device-resident and ATTNOPS_FORCE_NATIVE=1");
  ::unsetenv("ATTNOPS_FORCE_NATIVE");
  attnops::reload_environment();
}

}  // namespace
}  // namespace attnops::testing
