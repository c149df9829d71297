// VanillaAttn::forward_cpu, materialised-scores path (q_len > 4 or weights requested), against the
// fp64 oracle on random inputs: odd sizes, head dims that are not powers of two, Dv != D, GQA,
// every mask kind, soft cap, sinks, bias (full and broadcast), fully masked rows, f32/f16/bf16,
// one and two threads; and the attention weights against the oracle's.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <random>

#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "tests/vanilla_cpu/vanilla_test_util.h"

namespace attnops::testing::vanilla {
namespace {

constexpr std::int64_t kHeadDims[] = {1, 40, 64, 80, 96, 112, 128, 256};
constexpr std::int64_t kGroups[] = {1, 2, 4, 8};
constexpr DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

// One random prefill-shaped case per seed; the mask kind cycles with the seed so every kind
// appears with every dtype over the sweep.
CaseSpec random_prefill_spec(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  CaseSpec s;
  s.B = pick(1, 3);
  s.Hkv = pick(1, 2);
  s.Hq = s.Hkv * kGroups[pick(0, 3)];
  s.D = kHeadDims[pick(0, 7)];
  s.Dv = pick(0, 2) == 0 ? kHeadDims[pick(0, 7)] : -1;
  // Up to ~2.5 key blocks (256 keys) and q-row tails after full 128-row chunks, so that tasks of
  // different widths run on one thread over several key blocks.
  s.Tq = pick(5, 300);
  s.Tk = pick(0, 3) == 0 ? s.Tq : pick(1, 640);  // Tq > Tk causal gives fully masked rows
  s.dtype = kDtypes[seed % 3];
  apply_mask_kind(s, static_cast<MaskKind>(seed % static_cast<int>(MaskKind::count)), rng);
  apply_random_features(s, rng);
  fit_budget(s, 3e7, 5);
  return s;
}

class VanillaGeneralRandom : public ::testing::TestWithParam<int> {};

TEST_P(VanillaGeneralRandom, MatchesOracleWithOneAndTwoThreads) {
  const auto seed = static_cast<std::uint64_t>(GetParam());
  const CaseSpec spec = random_prefill_spec(seed);
  const Case c = make_case(spec, seed);
  AttentionProblem p = problem_for(c);
  expect_all_tiers_match(p, {1, 2}, c.describe());
}

INSTANTIATE_TEST_SUITE_P(Sweep, VanillaGeneralRandom, ::testing::Range(0, random_case_count(150)));

// A narrow task (a q-row tail) then a wide one on the same thread, each over more keys than one
// key block: the O^T update's "add" factors in per-thread scratch must not keep the narrow task's
// 1 / denominators (1 call in 5 of ordinary shapes was wrong that way).
TEST(VanillaGeneral, NarrowThenWideTasksOnOneThreadOverSeveralKeyBlocks) {
  for (DType dt : kDtypes)
    for (bool causal : {false, true}) {
      const CaseSpec s = shape_spec(2, 300, 300, 4, 4, 32, dt, causal);
      const Case c = make_case(s, 101);
      AttentionProblem p = problem_for(c);
      expect_all_tiers_match(p, {1, 2, 3}, c.describe());
    }
}

// Large logits (q scaled by 12) stress the max subtraction of the softmax.
TEST(VanillaGeneral, LargeLogitsStayAccurate) {
  for (DType dt : kDtypes) {
    CaseSpec s = shape_spec(2, 33, 47, 4, 2, 80, dt, false, 40);
    s.scale_inputs = 12.f;
    const Case c = make_case(s, 11);
    AttentionProblem p = problem_for(c);
    expect_all_tiers_match(p, {2}, c.describe());
  }
}

// Causal with Tq > Tk: the first Tq - Tk query rows sit before every key.
TEST(VanillaGeneral, CausalRowsBeforeAllKeysAreZeroWithLseMinusInf) {
  CaseSpec s = shape_spec(2, 40, 25, 4, 1, 96, DType::f32);
  s.sinks = true;
  const Case c = make_case(s, 5);
  AttentionProblem p = problem_for(c);
  const AttentionBuffers got = run_cpu(p, 2);
  EXPECT_TRUE(within_tolerance(p, got)) << c.describe();
  const float* out = got.out.data_as<float>();
  const float* lse = got.lse->data_as<float>();
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.Hq; ++h)
      for (std::int64_t i = 0; i < s.Tq - s.Tk; ++i) {
        EXPECT_EQ(lse[(b * s.Hq + h) * s.Tq + i], -std::numeric_limits<float>::infinity());
        for (std::int64_t d = 0; d < s.D; ++d) EXPECT_EQ(out[((b * s.Tq + i) * s.Hq + h) * s.D + d], 0.f);
      }
}

// Segment ids on the q side that appear nowhere on the kv side: every row of batch 1 is empty.
TEST(VanillaGeneral, SegmentsThatMatchNothingGiveZeroRows) {
  for (DType dt : kDtypes) {
    CaseSpec s = shape_spec(2, 20, 30, 2, 2, 40, dt, false);
    Case c = make_case(s, 3);
    Tensor seg_q(DType::i32, {2, 20}), seg_kv(DType::i32, {2, 30});
    for (std::int64_t i = 0; i < 20; ++i) {
      seg_q.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(i / 7);  // batch 0: ids 0..2
      seg_q.data_as<std::int32_t>()[20 + i] = 99;                           // batch 1: no match
    }
    for (std::int64_t j = 0; j < 30; ++j) {
      seg_kv.data_as<std::int32_t>()[j] = static_cast<std::int32_t>(j / 10);
      seg_kv.data_as<std::int32_t>()[30 + j] = static_cast<std::int32_t>(j / 10);
    }
    c.options.segment_ids_q = seg_q.view();
    c.options.segment_ids_kv = seg_kv.view();
    AttentionProblem p = problem_for(c);
    const AttentionBuffers got = run_cpu(p, 2);
    EXPECT_TRUE(within_tolerance(p, got)) << c.describe();
    for (std::int64_t i = 0; i < 20; ++i)
      for (std::int64_t h = 0; h < 2; ++h) {
        EXPECT_EQ(got.lse->data_as<float>()[(1 * 2 + h) * 20 + i], -std::numeric_limits<float>::infinity());
        for (std::int64_t d = 0; d < 40; ++d)
          EXPECT_EQ(got.out.at(static_cast<std::size_t>(((20 + i) * 2 + h) * 40 + d)), 0.f);
      }
  }
}

// A window that ends before every key (Tq > Tk, local(0, 0) with causal): all rows masked, in
// whole chunks, which the kernel skips without computing.
TEST(VanillaGeneral, FullyMaskedChunksAreSkippedCorrectly) {
  CaseSpec s = shape_spec(1, 300, 10, 2, 1, 64, DType::f32);
  s.window = Window{0, 0};
  const Case c = make_case(s, 8);
  AttentionProblem p = problem_for(c);
  expect_all_tiers_match(p, {2}, c.describe());
}

// The kernel's own parallel region must not change the caller's OpenMP state.
TEST(VanillaGeneral, LeavesCallerThreadCountAlone) {
  const int before = omp_get_max_threads();
  const Case c = make_case(shape_spec(1, 64, 64, 4, 4, 64, DType::f32), 2);
  AttentionProblem p = problem_for(c);
  EXPECT_TRUE(within_tolerance(p, run_cpu(p, 1)));
  EXPECT_TRUE(within_tolerance(p, run_cpu(p, 2)));
  EXPECT_EQ(omp_get_max_threads(), before);
}

// Attention weights [B, Hq, Tq, Tk]: the softmax probabilities (sink mass in the normaliser only).
class VanillaWeights : public ::testing::TestWithParam<int> {};

TEST_P(VanillaWeights, EqualOracleWeights) {
  const auto seed = static_cast<std::uint64_t>(GetParam()) + 1000;
  CaseSpec spec = random_prefill_spec(seed);
  if (seed % 4 == 0) spec.Tq = 1;  // weights with q_len 1 run the GEMM path too
  const Case c = make_case(spec, seed);
  AttentionProblem p = problem_for(c);
  p.want_weights = true;
  const AttentionBuffers got = run_cpu(p, 2);
  ASSERT_TRUE(got.weights.has_value());
  const native::ReferenceResult ref = native::reference_attention_f64(p, true);
  for (const cpu::ForcedTier& tier : cpu_kernel_tiers_to_test()) {
    const AttentionBuffers g = run_cpu(p, 2, tier);
    EXPECT_TRUE(within_tolerance(p, ref, g)) << c.describe() << " " << tier_label(tier);
    ASSERT_EQ(ref.weights.size(), static_cast<std::size_t>(g.weights->numel()));
    double worst = 0;
    for (std::size_t i = 0; i < ref.weights.size(); ++i) {
      const double e = std::abs(static_cast<double>(g.weights->data_as<float>()[i]) - ref.weights[i]);
      worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
    }
    // Probabilities are in [0, 1] and the inputs are the same rounded values: fp32 rounding only.
    EXPECT_LE(worst, 2e-5) << c.describe() << " " << tier_label(tier);
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, VanillaWeights, ::testing::Range(0, 32));

// The plan's two layouts and its GQA-group splits (vanilla_plan.cpp), forced on small shapes by
// a small working-set cap: lanes over rows with one q head of a group per task, and the
// row-major layout (16 rows of scores would not fit), with weights, on every tier.
TEST(VanillaPlanLayouts, SmallCapsMatchOracle) {
  // Rows of Tk + D + Dv = 125 floats; the lanes layout needs 16 * (125 + 6) + 56 = 2152 floats.
  struct Cap {
    std::int64_t floats, Hq;
    bool lanes_over_rows;
  };
  for (DType dt : kDtypes)
    for (const Cap cap : {Cap{2200, 32, true}, Cap{300, 8, false}, Cap{50, 8, false}}) {
      CaseSpec s = shape_spec(2, 23, 61, cap.Hq, cap.Hq / 4, 24, dt, true, 40);
      if (cap.lanes_over_rows) s.Hkv = 1;  // G = 32 rows per query: more than the 16 lanes that fit
      s.bias = true;
      s.sinks = true;
      const Case c = make_case(s, 31);
      AttentionProblem p = problem_for(c);
      p.want_weights = true;
      p.num_threads = 2;
      const cpu::VanillaPlan pl = cpu::vanilla_plan(p, 2, cap.floats);
      ASSERT_EQ(pl.lanes_over_rows, cap.lanes_over_rows) << cap.floats;
      EXPECT_LT(pl.gc, p.group()) << "the cap should split the GQA group, cap " << cap.floats;
      const native::ReferenceResult ref = native::reference_attention_f64(p, true);
      for (const cpu::ForcedTier& tier : cpu_kernel_tiers_to_test()) {
        AttentionBuffers got = allocate_buffers(p);
        cpu::vanilla_general(p, got, tier, pl);
        EXPECT_TRUE(within_tolerance(p, ref, got))
            << c.describe() << " cap=" << cap.floats << " " << tier_label(tier);
        double worst = 0;
        for (std::size_t i = 0; i < ref.weights.size(); ++i) {
          const double e = std::abs(static_cast<double>(got.weights->data_as<float>()[i]) - ref.weights[i]);
          worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
        }
        EXPECT_LE(worst, 2e-5) << c.describe() << " cap=" << cap.floats << " " << tier_label(tier);
      }
    }
}

}  // namespace
}  // namespace attnops::testing::vanilla
