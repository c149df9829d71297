// VanillaAttn::forward_cpu, decode path (q_len <= 4): K/V streamed once for the whole GQA group
// of each kv head, online softmax, kv axis split across threads with a log-sum-exp merge when
// the batch is small. Checked against the fp64 oracle for Tk from 1 to ~5000, GQA up to 8:1, every
// mask kind (windows and segments are real in decode), bias, soft cap, sinks, all dtypes, with
// one, two and three threads; and bitwise determinism for a fixed thread count.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "attnops/ext/problem.h"
#include "backends/cpu/vanilla_decode.h"
#include "tests/vanilla_cpu/vanilla_test_util.h"

namespace attnops::testing::vanilla {
namespace {

constexpr std::int64_t kKvLens[] = {1, 2, 17, 63, 64, 65, 200, 511, 1024, 1500, 3001, 4999};
constexpr DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

// Random decode case: even seeds use B = 1, Hkv = 1 (GQA 8:1), which takes the split-kv path for
// Tk >= 256 (splits of at least 128 keys).
CaseSpec random_decode_spec(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  CaseSpec s;
  if (seed % 2 == 0) {
    s.B = 1, s.Hkv = 1, s.Hq = 8;
  } else {
    s.B = pick(1, 3), s.Hkv = pick(1, 3), s.Hq = s.Hkv * (std::int64_t{1} << pick(0, 3));
  }
  s.Tq = pick(0, 2) == 0 ? pick(2, 4) : 1;
  s.Tk = kKvLens[pick(0, 11)];
  constexpr std::int64_t dims[] = {1, 40, 64, 80, 96, 112, 128, 256};
  s.D = dims[pick(0, 7)];
  s.Dv = pick(0, 2) == 0 ? dims[pick(0, 7)] : -1;
  s.dtype = kDtypes[(seed / 2) % 3];
  apply_mask_kind(s, static_cast<MaskKind>(seed % static_cast<int>(MaskKind::count)), rng);
  // Decode-sized windows and chunks: scale them with Tk so they cut real ranges.
  if (s.window) s.window->left = pick(0, std::max<std::int64_t>(1, s.Tk / 3));
  if (s.chunk) s.chunk = pick(1, std::max<std::int64_t>(1, s.Tk / 2));
  apply_random_features(s, rng);
  fit_budget(s, 1.2e7, 1);
  return s;
}

class VanillaDecodeRandom : public ::testing::TestWithParam<int> {};

TEST_P(VanillaDecodeRandom, MatchesOracleWithOneTwoAndThreeThreads) {
  const auto seed = static_cast<std::uint64_t>(GetParam());
  const CaseSpec spec = random_decode_spec(seed);
  const Case c = make_case(spec, seed);
  AttentionProblem p = problem_for(c);
  ASSERT_LE(p.Tq, cpu::kDecodeMaxQ);
  expect_all_tiers_match(
      p, {1, 2, 3}, c.describe() + " splits(2 threads)=" + std::to_string(cpu::vanilla_decode_splits(p, 2)));
}

INSTANTIATE_TEST_SUITE_P(Sweep, VanillaDecodeRandom, ::testing::Range(0, random_case_count(150)));

// GQA 8:1, B = 1: one batch, so the threads split the kv axis; every mask kind and feature
// through the split path at a long cache.
class VanillaDecodeSplit : public ::testing::TestWithParam<int> {};

TEST_P(VanillaDecodeSplit, LongCacheSplitAcrossThreadsMatchesOracle) {
  const auto kind = static_cast<MaskKind>(GetParam());
  std::mt19937_64 rng(static_cast<std::uint64_t>(GetParam()) + 77);
  CaseSpec s = shape_spec(1, 1, 4093, 8, 1, 128, DType::f32);
  apply_mask_kind(s, kind, rng);
  if (s.window) s.window->left = 1500;  // a window spanning several splits
  if (s.chunk) s.chunk = 1000;
  s.soft_cap = 30.0;
  s.sinks = true;
  s.bias = true;
  const Case c = make_case(s, 31);
  AttentionProblem p = problem_for(c);
  ASSERT_GT(cpu::vanilla_decode_splits(p, 2), 1);
  expect_all_tiers_match(p, {1, 2}, c.describe());
}

INSTANTIATE_TEST_SUITE_P(EveryMaskKind, VanillaDecodeSplit,
                         ::testing::Range(0, static_cast<int>(MaskKind::count)),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return mask_kind_name(static_cast<MaskKind>(info.param));
                         });

// The split-kv merge runs in a fixed order: the same thread count gives the same bits.
TEST(VanillaDecode, SplitResultIsDeterministicForAThreadCount) {
  CaseSpec s = shape_spec(1, 1, 5000, 8, 1, 112, DType::bf16);
  s.sinks = true;
  const Case c = make_case(s, 4);
  AttentionProblem p = problem_for(c);
  ASSERT_GT(cpu::vanilla_decode_splits(p, 2), 1);
  const native::ReferenceResult ref = native::reference_attention_f64(p, false);
  for (const cpu::ForcedTier& tier : cpu_kernel_tiers_to_test()) {
    const AttentionBuffers a = run_cpu(p, 2, tier);
    EXPECT_TRUE(within_tolerance(p, ref, a)) << c.describe() << " " << tier_label(tier);
    for (int rep = 0; rep < 3; ++rep) {
      const AttentionBuffers b = run_cpu(p, 2, tier);
      EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.nbytes()), 0) << tier_label(tier);
      EXPECT_EQ(std::memcmp(a.lse->data(), b.lse->data(), a.lse->nbytes()), 0) << tier_label(tier);
    }
  }
}

// Decode rows with nothing to see: segments that match no key, and a causal row before every
// key (Tq > Tk); output 0 and lse -inf, never NaN, on the split path too.
TEST(VanillaDecode, FullyMaskedRowsGiveZeroAndMinusInf) {
  for (DType dt : kDtypes) {
    CaseSpec s = shape_spec(1, 3, 2, 4, 2, 40, dt);
    s.sinks = true;
    const Case c = make_case(s, 9);
    AttentionProblem p = problem_for(c);
    expect_all_tiers_match(p, {2}, c.describe());

    CaseSpec t = shape_spec(1, 1, 3000, 8, 1, 64, dt, false);
    Case d = make_case(t, 10);
    Tensor seg_q(DType::i32, {1, 1}), seg_kv(DType::i32, {1, 3000});
    seg_q.data_as<std::int32_t>()[0] = 5;
    for (std::int64_t j = 0; j < 3000; ++j)
      seg_kv.data_as<std::int32_t>()[j] = static_cast<std::int32_t>(j % 5);
    d.options.segment_ids_q = seg_q.view();
    d.options.segment_ids_kv = seg_kv.view();
    AttentionProblem q = problem_for(d);
    for (const cpu::ForcedTier& tier : cpu_kernel_tiers_to_test()) {
      const AttentionBuffers got = run_cpu(q, 2, tier);
      EXPECT_TRUE(within_tolerance(q, got)) << d.describe() << " " << tier_label(tier);
      for (std::int64_t i = 0; i < got.out.numel(); ++i)
        EXPECT_EQ(got.out.at(static_cast<std::size_t>(i)), 0.f) << tier_label(tier);
    }
  }
}

}  // namespace
}  // namespace attnops::testing::vanilla
