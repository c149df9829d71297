// ragged_paged against the dense oracle over random batches: native equals the
// dense native call bitwise; cpu (every ISA tier this machine runs) within the dense tolerances.
// S 1..8; q_len 0, 1, several and kv_len; kv_len 0 and not a multiple of the page size; pages of
// 1, 3, 16, 128 tokens, permuted; Hq / Hkv 1, 2, 4, 8; D != Dv and not powers of two; windows
// crossing page edges, chunks, soft cap, sinks, small KV splits (merges), padding rows and
// padding sequences (whose q rows hold NaN that must reach nothing).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/paged_cpu.h"
#include "tests/paged/paged_cases.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using i64 = std::int64_t;

PagedCaseSpec random_spec(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](auto... xs) {
    const std::vector<std::common_type_t<decltype(xs)...>> v{xs...};
    return v[rng() % v.size()];
  };
  const auto uniform = [&](i64 lo, i64 hi) {
    return lo + static_cast<i64>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  PagedCaseSpec s;
  s.seed = seed;
  s.page_size = pick(i64{1}, i64{3}, i64{16}, i64{128}, i64{16}, i64{3});
  const int heads = static_cast<int>(rng() % 6);
  const i64 hq[] = {1, 2, 4, 8, 8, 4}, hkv[] = {1, 1, 2, 2, 8, 1};
  s.Hq = hq[heads], s.Hkv = hkv[heads];
  s.D = pick(i64{8}, i64{24}, i64{40}, i64{64});
  s.Dv = rng() % 3 == 0 ? pick(i64{8}, i64{20}, i64{48}) : s.D;
  s.dtype = pick(DType::f32, DType::f32, DType::f16, DType::bf16);
  s.index_dtype = rng() % 2 ? DType::i32 : DType::i64;
  const i64 S = uniform(1, 8);
  for (i64 x = 0; x < S; ++x) {
    i64 kv = 0, q = 0;
    switch (rng() % 5) {
      case 0:  // decode
        kv = uniform(1, 300), q = 1;
        break;
      case 1:  // nothing this step (or an empty sequence)
        kv = uniform(0, 40), q = 0;
        break;
      case 2:  // chunked prefill
        kv = uniform(2, 260), q = uniform(2, std::min<i64>(kv, 40));
        break;
      case 3:  // prefill
        kv = uniform(1, 150), q = kv;
        break;
      default:  // speculative decode
        kv = uniform(4, 200), q = uniform(2, 4);
        break;
    }
    s.kv_lens.push_back(kv), s.q_lens.push_back(q);
  }
  s.causal = rng() % 6 != 0;
  if (rng() % 3 == 0) s.window = Window{uniform(0, 20), s.causal ? 0 : uniform(0, 5)};
  if (rng() % 5 == 0) s.chunk = pick(i64{7}, i64{16}, i64{50});
  if (rng() % 4 == 0) s.soft_cap = pick(5.0, 30.0);
  s.sinks = rng() % 4 == 0;
  if (rng() % 2 == 0) s.split = pick(i64{16}, i64{37}, i64{64});
  s.pad_rows = rng() % 3 == 0 ? uniform(1, 3) : 0;
  s.pad_seqs = rng() % 3 == 0 ? uniform(1, 2) : 0;
  return s;
}

// The cpu paged kernel on one tier, through the lower-level entry point.
AttentionOutput run_cpu_tier(const PagedCase& c, const cpu::ForcedTier& tier, int threads = 0) {
  OperationMetadata md;
  md.num_threads = threads;
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, c.spec.Hq, c.options);
  const PagedProblem p = make_paged_problem(c.q, c.cache, plan, c.options, md);
  PagedBuffers b = allocate_paged_buffers(p);
  cpu::paged_attention(p, b, tier);
  AttentionOutput o;
  o.out = b.out;
  o.lse = b.lse;
  o.decision.run = b.run;
  return o;
}

// Rows past cu[num_seqs] are padding: output 0 and lse -inf (their q rows are NaN).
::testing::AssertionResult padding_is_empty(const PagedCase& c, const AttentionOutput& o) {
  const i64 first = c.q_begin(c.spec.q_lens.size()), Hq = c.spec.Hq, Dv = c.spec.Dv;
  for (i64 n = first; n < c.N; ++n)
    for (i64 h = 0; h < Hq; ++h) {
      for (i64 e = 0; e < Dv; ++e)
        if (o.out.at(static_cast<std::size_t>((n * Hq + h) * Dv + e)) != 0.f)
          return ::testing::AssertionFailure() << "padding row " << n << " has a non-zero output";
      if (o.lse && o.lse->data_as<float>()[n * Hq + h] != -std::numeric_limits<float>::infinity())
        return ::testing::AssertionFailure()
               << "padding row " << n << " has lse " << o.lse->data_as<float>()[n * Hq + h];
    }
  return ::testing::AssertionSuccess();
}

class RandomBatch : public ::testing::TestWithParam<int> {};

TEST_P(RandomBatch, NativeIsTheDenseOracleAndCpuTiersAreWithinTolerance) {
  const PagedCaseSpec spec = random_spec(static_cast<std::uint64_t>(GetParam()) + 100);
  SCOPED_TRACE(spec.describe());
  const PagedCase c = make_paged_case(spec);
  const AttentionOutput native = run_paged(c, Backend::native);
  ASSERT_EQ(native.decision.backend, Backend::native) << native.decision.to_json();
  EXPECT_TRUE(native.decision.run.batch_invariant);
  EXPECT_TRUE(padding_is_empty(c, native));
  std::vector<AttentionOutput> dense;
  for (std::size_t s = 0; s < spec.q_lens.size(); ++s) {
    dense.push_back(dense_oracle(c, s));
    EXPECT_TRUE(rows_match(c, s, native, dense.back(), 0, 0));
  }
  const Tolerance tol = tolerance_for(spec.dtype);
  for (const cpu::ForcedTier& tier : cpu_kernel_tiers_to_test()) {
    SCOPED_TRACE(tier_label(tier));
    const AttentionOutput cpu = run_cpu_tier(c, tier);
    EXPECT_TRUE(cpu.decision.run.batch_invariant);
    EXPECT_TRUE(padding_is_empty(c, cpu));
    for (std::size_t s = 0; s < spec.q_lens.size(); ++s)
      EXPECT_TRUE(rows_match(c, s, cpu, dense[s], tol.out, tol.lse));
  }
}

INSTANTIATE_TEST_SUITE_P(Paged, RandomBatch, ::testing::Range(0, random_case_count(36)));

// Hand-picked: a long decode split into many ranges, a prefill past a page of 128, MQA.
TEST(PagedNumerics, LongDecodeSplitsAndPrefillPastAPage) {
  PagedCaseSpec s;
  s.q_lens = {1, 1, 200, 3};
  s.kv_lens = {1500, 17, 300, 40};
  s.Hq = 8, s.Hkv = 1, s.D = 72, s.Dv = 40, s.page_size = 128;
  s.split = 100;
  s.window = Window{700, 0};
  s.sinks = true;
  for (DType dt : {DType::f32, DType::bf16}) {
    s.dtype = dt;
    SCOPED_TRACE(s.describe());
    const PagedCase c = make_paged_case(s);
    const AttentionOutput cpu = run_paged(c, Backend::cpu);
    ASSERT_EQ(cpu.decision.backend, Backend::cpu) << cpu.decision.to_json();
    const Tolerance tol = tolerance_for(dt);
    for (std::size_t x = 0; x < s.q_lens.size(); ++x)
      EXPECT_TRUE(rows_match(c, x, cpu, dense_oracle(c, x), tol.out, tol.lse));
  }
}

// A prefill large enough to run on every thread (a tile item of over 4M pairs: its keys gathered,
// its output checked and scattered in pieces of rows on the threads), beside a decode, on
// every kernel tier at 3 threads; pages handed out shuffled.
TEST(PagedNumerics, LargePrefillCopiesInPiecesOnEveryThread) {
  PagedCaseSpec s;
  s.q_lens = {1, 1100};
  s.kv_lens = {50, 1300};
  s.Hq = 4, s.Hkv = 2, s.D = 32, s.Dv = 32, s.page_size = 16;
  for (DType dt : {DType::f32, DType::bf16}) {
    s.dtype = dt;
    SCOPED_TRACE(s.describe());
    const PagedCase c = make_paged_case(s);
    const Tolerance tol = tolerance_for(dt);
    const AttentionOutput want = dense_oracle(c, 1);
    for (const cpu::ForcedTier& tier : cpu_kernel_tiers_to_test()) {
      SCOPED_TRACE(tier_label(tier));
      const AttentionOutput cpu = run_cpu_tier(c, tier, 3);
      EXPECT_NE(cpu.decision.run.kernel_detail.find("0 on one thread each"), std::string::npos)
          << cpu.decision.run.kernel_detail;
      EXPECT_TRUE(rows_match(c, 1, cpu, want, tol.out, tol.lse));
    }
  }
}

// The dense form of the operator (attn(q, k, v)) runs the paged cpu kernels.
TEST(PagedNumerics, DenseCallsRunThePagedKernels) {
  OperationMetadata md;
  md.backends = {Backend::cpu};
  const Attention attn = registry().get("paged", md);
  for (const auto& [B, Tq, Tk, window] : {std::tuple{2, 1, 77, false}, std::tuple{1, 64, 64, false},
                                          std::tuple{3, 5, 40, true}, std::tuple{1, 150, 150, true}}) {
    CaseSpec cs;
    cs.B = B, cs.Tq = Tq, cs.Tk = Tk, cs.Hq = 4, cs.Hkv = 2, cs.D = 24;
    if (window) cs.window = Window{9, 0};
    const Case c = make_case(cs, static_cast<std::uint64_t>(B * 100 + Tq));
    SCOPED_TRACE(c.describe());
    const AttentionOutput o = attn(c.q, c.k, c.v, c.options);
    ASSERT_EQ(o.decision.backend, Backend::cpu) << o.decision.to_json();
    EXPECT_TRUE(o.decision.run.batch_invariant);
    AttentionBuffers b;
    b.out = o.out;
    b.lse = o.lse;
    EXPECT_TRUE(within_tolerance(problem_for(c), b));
  }
  // What a ragged batch has no form for runs on the native oracle, with the reason recorded.
  CaseSpec cs;
  cs.Tq = 8, cs.Tk = 8, cs.bias = true;
  const Case c = make_case(cs, 3);
  const AttentionOutput o = attn(c.q, c.k, c.v, c.options);
  EXPECT_EQ(o.decision.backend, Backend::native);
  EXPECT_TRUE(o.decision.has(ReasonCode::unsupported_feature)) << o.decision.to_json();
}

// NaN / inf in a value the window hides from some rows reaches only the rows that see it (the
// non-finite policy, per sequence); the other sequences are bitwise what they are without it.
TEST(PagedNumerics, NonFiniteValuesReachOnlyTheRowsThatSeeThem) {
  PagedCaseSpec s;
  s.q_lens = {1, 6, 1};
  s.kv_lens = {90, 30, 50};
  s.window = Window{10, 0};
  s.page_size = 16;
  s.split = 32;
  const PagedCase clean = make_paged_case(s);
  PagedCase c = make_paged_case(s);
  // Key 3 of sequence 0 (outside every row's window) and key 26 of sequence 1 (seen by its last
  // rows only): their value rows become NaN / inf in the cache.
  const auto poison = [&](i64 seq, i64 j, float x) {
    const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
    const i64 page = plan.pages(seq)[j / s.page_size];
    const TensorView v = c.cache.v_page(page);
    auto* row = static_cast<float*>(const_cast<void*>(v.data())) + (j % s.page_size) * v.stride(0);
    for (i64 e = 0; e < s.Hkv * s.Dv; ++e) row[e] = x;
    Tensor& dense = c.v_seq[static_cast<std::size_t>(seq)];  // the oracle's copy
    for (i64 e = 0; e < s.Hkv * s.Dv; ++e) dense.set(static_cast<std::size_t>(j * s.Hkv * s.Dv + e), x);
  };
  poison(0, 3, NAN);
  poison(1, 26, std::numeric_limits<float>::infinity());
  for (Backend b : {Backend::native, Backend::cpu}) {
    SCOPED_TRACE(std::string(backend_name(b)));
    const AttentionOutput o = run_paged(c, b), ref = run_paged(clean, b);
    for (std::size_t x = 0; x < 2; ++x) {
      const Tolerance tol = b == Backend::native ? Tolerance{0, 0} : tolerance_for(s.dtype);
      EXPECT_TRUE(rows_match(c, x, o, dense_oracle(c, x), tol.out, tol.lse));
    }
    // Sequence 0 sees no poisoned key: finite. Sequence 2 is untouched, bitwise.
    for (i64 e = 0; e < s.Hq * s.Dv; ++e) EXPECT_TRUE(std::isfinite(o.out.at(static_cast<std::size_t>(e))));
    const i64 row2 = c.q_begin(2) * s.Hq * s.Dv;
    for (i64 e = row2; e < row2 + s.Hq * s.Dv; ++e)
      EXPECT_EQ(o.out.at(static_cast<std::size_t>(e)), ref.out.at(static_cast<std::size_t>(e)));
  }
}

}  // namespace
}  // namespace attnops::testing
