// Batch invariance and the other invariances of ragged_paged, bitwise on native and cpu, over
// float and 8-bit caches: permuting the physical pages, changing the page size, padding rows and
// padding sequences, a sequence alone vs inside a mixed batch, 1, 2 and 3 threads. And merge_states: the
// merge of two halves of the keys equals the unsplit result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "tests/paged/paged_cases.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using i64 = std::int64_t;

// The cache of a case: q's dtype, or int8 with per-token scales, or fp8_e4m3 with one per tensor.
enum class Kv { same, int8_token, fp8_tensor };

// A mixed batch: decode (long, split), chunked prefill, prefill (a tile item), speculative.
PagedCaseSpec mixed(DType dt, Kv kv) {
  PagedCaseSpec s;
  s.q_lens = {1, 24, 70, 3, 1};
  s.kv_lens = {700, 100, 70, 45, 9};
  s.seq_seeds = {11, 12, 13, 14, 15};
  s.Hq = 8, s.Hkv = 2, s.D = 40, s.Dv = 24;
  s.dtype = dt;
  s.split = 128;
  s.window = Window{300, 0};
  s.soft_cap = 20.0;
  s.sinks = true;
  if (kv == Kv::int8_token) s.kv_dtype = DType::i8;
  if (kv == Kv::fp8_tensor) s.kv_dtype = DType::fp8_e4m3, s.scales = KVScales::per_tensor;
  return s;
}

// Sequence s's rows of out and lse, as bytes.
std::string row_bytes(const PagedCase& c, std::size_t s, const AttentionOutput& o) {
  const i64 q0 = c.q_begin(s), ql = c.spec.q_lens[s], Hq = c.spec.Hq, Dv = c.spec.Dv;
  const std::size_t es = dtype_size(c.spec.dtype);
  std::string bytes(static_cast<const char*>(o.out.data()) + q0 * Hq * Dv * es,
                    static_cast<std::size_t>(ql * Hq * Dv) * es);
  bytes.append(reinterpret_cast<const char*>(o.lse->data_as<float>() + q0 * Hq),
               static_cast<std::size_t>(ql * Hq) * 4);
  return bytes;
}

OperationMetadata threads(int n) {
  OperationMetadata md;
  md.num_threads = n;
  return md;
}

class Invariance : public ::testing::TestWithParam<std::tuple<Backend, DType, Kv>> {};

TEST_P(Invariance, PagePermutationAndPageSizeChangeNoBit) {
  const auto [b, dt, kv] = GetParam();
  PagedCaseSpec s = mixed(dt, kv);
  s.page_size = 16;
  s.permute_pages = false;
  const PagedCase base = make_paged_case(s);
  const AttentionOutput ref = run_paged(base, b, threads(2));
  for (const auto& [page, permute] :
       {std::pair{i64{16}, true}, std::pair{i64{1}, true}, std::pair{i64{3}, true},
        std::pair{i64{128}, false}, std::pair{i64{128}, true}}) {
    s.page_size = page, s.permute_pages = permute, s.seed = static_cast<std::uint64_t>(page) + 7;
    const PagedCase c = make_paged_case(s);
    const AttentionOutput o = run_paged(c, b, threads(2));
    EXPECT_TRUE(same_bits(o.out, ref.out)) << "page " << page << " permuted " << permute;
    EXPECT_TRUE(same_bits(*o.lse, *ref.lse)) << "page " << page << " permuted " << permute;
  }
}

TEST_P(Invariance, ASequenceAloneOrInsideAnyBatchGivesTheSameBits) {
  const auto [b, dt, kv] = GetParam();
  const PagedCaseSpec s = mixed(dt, kv);
  const PagedCase batch = make_paged_case(s);
  const AttentionOutput all = run_paged(batch, b, threads(2));
  for (std::size_t x = 0; x < s.q_lens.size(); ++x) {
    PagedCaseSpec one = s;
    one.q_lens = {s.q_lens[x]}, one.kv_lens = {s.kv_lens[x]}, one.seq_seeds = {s.seq_seeds[x]};
    one.seed = 99 + x;  // other page ids, another write order
    const PagedCase alone = make_paged_case(one);
    const AttentionOutput o = run_paged(alone, b, threads(1));
    EXPECT_EQ(row_bytes(alone, 0, o), row_bytes(batch, x, all)) << "sequence " << x;
  }
  // Inside another batch: the sequences reversed, with padding rows and padding sequences.
  PagedCaseSpec rev = s;
  std::reverse(rev.q_lens.begin(), rev.q_lens.end());
  std::reverse(rev.kv_lens.begin(), rev.kv_lens.end());
  std::reverse(rev.seq_seeds.begin(), rev.seq_seeds.end());
  rev.pad_rows = 3, rev.pad_seqs = 2, rev.index_dtype = DType::i64, rev.seed = 5;
  const PagedCase other = make_paged_case(rev);
  const AttentionOutput o = run_paged(other, b, threads(2));
  const std::size_t S = s.q_lens.size();
  for (std::size_t x = 0; x < S; ++x)
    EXPECT_EQ(row_bytes(other, S - 1 - x, o), row_bytes(batch, x, all)) << "sequence " << x;
}

TEST_P(Invariance, OneTwoAndThreeThreadsGiveTheSameBits) {
  const auto [b, dt, kv] = GetParam();
  const PagedCase c = make_paged_case(mixed(dt, kv));
  const AttentionOutput one = run_paged(c, b, threads(1));
  for (int n : {2, 3}) {
    const AttentionOutput o = run_paged(c, b, threads(n));
    EXPECT_TRUE(same_bits(one.out, o.out)) << n << " threads";
    EXPECT_TRUE(same_bits(*one.lse, *o.lse)) << n << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Paged, Invariance,
                         ::testing::Combine(::testing::Values(Backend::native, Backend::cpu),
                                            ::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(Kv::same, Kv::int8_token, Kv::fp8_tensor)),
                         [](const auto& info) {
                           const Kv kv = std::get<2>(info.param);
                           return std::string(backend_name(std::get<0>(info.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param))) +
                                  (kv == Kv::int8_token   ? "_kv_int8"
                                   : kv == Kv::fp8_tensor ? "_kv_fp8_tensor"
                                                          : "");
                         });

// merge_states of the results over two halves of the keys equals the result over all of them
// (non-causal, so each half is an ordinary key set; the halves split at a page boundary).
TEST(MergeStates, TwoHalvesEqualTheWhole) {
  PagedCaseSpec s;
  s.q_lens = {1, 5, 2};
  s.kv_lens = {96, 64, 160};
  s.Hq = 4, s.Hkv = 2, s.D = 24, s.Dv = 16, s.page_size = 16;
  s.causal = false;
  s.soft_cap = 10.0;
  const PagedCase c = make_paged_case(s);
  for (Backend b : {Backend::native, Backend::cpu}) {
    SCOPED_TRACE(std::string(backend_name(b)));
    const AttentionOutput whole = run_paged(c, b);
    // The halves: every sequence's first 32 keys (two pages), then the rest, from the same pages.
    const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
    const i64 S = 3, width = 10;
    Tensor kv_a(DType::i64, {S}), kv_b(DType::i64, {S}), t_a(DType::i64, {S, width}),
        t_b(DType::i64, {S, width});
    for (i64 x = 0; x < S; ++x) {
      kv_a.data_as<i64>()[x] = 32, kv_b.data_as<i64>()[x] = plan.kv_len(x) - 32;
      const i64 pages = (plan.kv_len(x) + 15) / 16;
      for (i64 j = 0; j < width; ++j) {
        t_a.data_as<i64>()[x * width + j] = j < 2 ? plan.pages(x)[j] : 0;
        t_b.data_as<i64>()[x * width + j] = j + 2 < pages ? plan.pages(x)[j + 2] : 0;
      }
    }
    OperationMetadata md;
    md.backends = {b};
    const Attention attn = registry().get("paged", md);
    const AttentionOutput a = attn.paged(c.q, c.cache, RaggedBatch{c.cu, kv_a, t_a}, c.options);
    const AttentionOutput z = attn.paged(c.q, c.cache, RaggedBatch{c.cu, kv_b, t_b}, c.options);
    const MergedState m = merge_states(a.out, *a.lse, z.out, *z.lse);
    for (i64 i = 0; i < whole.out.numel(); ++i)
      EXPECT_NEAR(m.out.at(static_cast<std::size_t>(i)), whole.out.at(static_cast<std::size_t>(i)), 4e-6)
          << "out element " << i;
    for (i64 i = 0; i < whole.lse->numel(); ++i)
      EXPECT_NEAR(m.lse.data_as<float>()[i], whole.lse->data_as<float>()[i], 2e-5) << "lse element " << i;
  }
}

TEST(MergeStates, EmptyStatesAndNaN) {
  const float ninf = -std::numeric_limits<float>::infinity();
  Tensor oa(DType::f32, {3, 1, 2}), la(DType::f32, {3, 1}), ob(DType::f32, {3, 1, 2}), lb(DType::f32, {3, 1});
  // Row 0: a empty (its out NaN must not leak), b = (1, 2) with lse 0.5 -> exactly b.
  oa.set(0, NAN), oa.set(1, NAN), la.set(0, ninf), ob.set(0, 1.f), ob.set(1, 2.f), lb.set(0, 0.5f);
  // Row 1: both empty -> 0 and -inf. Row 2: a NaN lse -> NaN.
  la.set(1, ninf), lb.set(1, ninf);
  la.set(2, NAN), lb.set(2, 0.f), ob.set(4, 3.f), ob.set(5, 4.f);
  const MergedState m = merge_states(oa, la, ob, lb);
  EXPECT_EQ(m.out.at(0), 1.f);
  EXPECT_EQ(m.out.at(1), 2.f);
  EXPECT_EQ(m.lse.at(0), 0.5f);
  EXPECT_EQ(m.out.at(2), 0.f);
  EXPECT_EQ(m.lse.at(1), ninf);
  EXPECT_TRUE(std::isnan(m.out.at(4)) && std::isnan(m.lse.at(2)));
  // Commutative, and a typed error naming the argument for bad shapes.
  const MergedState r = merge_states(ob, lb, oa, la);
  EXPECT_EQ(r.out.at(0), 1.f);
  try {
    merge_states(oa, lb, ob, Tensor(DType::f32, {2, 1}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
    EXPECT_NE(std::string(e.what()).find("lse_b"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnops::testing
