// The CPU backward (backends/cpu/tiled_backward.cpp) on every ISA tier this machine runs
// (testing::cpu_kernel_tiers_to_test: lower tiers forced through cpu::tiled_backward's tier argument,
// and the emulated builds of the tiers above),
// each against the fp64 backward oracle (native::reference_backward_f64) on small shapes: odd
// sizes, Tq != Tk, head dims that are not multiples of 16, Dv != D, GQA ratios, every mask kind,
// segments, bias (full and broadcast), soft cap, sinks, fully masked rows, f32 / f16 / bf16, block
// sizes that leave partial tiles. Tolerances: tests/backward/grad_testing.h. The decision's
// RunInfo names the tier that ran. Kept small: it runs under ASan on a 2-core CI box.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/tiled_backward.h"
#include "backends/native/reference_backward.h"
#include "tests/backward/grad_testing.h"

namespace attnops {
namespace {

using testing::CaseSpec;

struct TierCase {
  std::string name;
  CaseSpec spec;
  std::int64_t bq = 16, bk = 16;
};

std::vector<TierCase> tier_cases() {
  std::vector<TierCase> cases;
  const auto add = [&](std::string name, auto edit, std::int64_t bq, std::int64_t bk) {
    CaseSpec s;
    s.B = 1, s.Tq = 37, s.Tk = 53, s.Hq = 4, s.Hkv = 2, s.D = 24, s.causal = false;
    edit(s);
    cases.push_back({std::move(name), s, bq, bk});
  };
  add(
      "f32_dense_gqa2_odd", [](CaseSpec&) {}, 16, 16);
  add(
      "f32_causal_dv40_gqa4", [](CaseSpec& s) { s.causal = true, s.Hq = 8, s.Dv = 40, s.Tq = 53; }, 32, 16);
  add(
      "f32_window_bias_b2",
      [](CaseSpec& s) {
        s.B = 2, s.window = Window{7, 3}, s.bias = true;
      },
      16, 32);
  add(
      "f32_segments_sinks_mha", [](CaseSpec& s) { s.Hkv = 4, s.segments = true, s.sinks = true; }, 16, 16);
  add(
      "f32_chunk_softcap_d72", [](CaseSpec& s) { s.chunk = 16, s.soft_cap = 20.0, s.D = 72, s.Dv = 72; }, 32,
      32);
  add(
      "f32_masked_rows_bias_broadcast",
      [](CaseSpec& s) { s.causal = true, s.Tq = 70, s.Tk = 20, s.bias = true, s.bias_broadcast = true; }, 16,
      16);
  add(
      "f16_causal_sinks_gqa4",
      [](CaseSpec& s) { s.dtype = DType::f16, s.causal = true, s.Hq = 8, s.sinks = true; }, 16, 32);
  add(
      "bf16_window_segments_d40",
      [](CaseSpec& s) {
        s.dtype = DType::bf16, s.window = Window{5, 0}, s.segments = true, s.D = 40;
      },
      32, 16);
  // Every f32 case again in bf16: from the amx tier up its products run on tiles
  // (tiled_backward_amx.h), with the elementwise work of each feature around them.
  const std::size_t n = cases.size();
  for (std::size_t i = 0; i < n; ++i)
    if (cases[i].spec.dtype == DType::f32 && cases[i].name.rfind("f32_", 0) == 0) {
      TierCase c = cases[i];
      c.name = "bf16" + c.name.substr(3);
      c.spec.dtype = DType::bf16;
      cases.push_back(c);
    }
  // Larger than a tile in every dim, odd sizes: several q and kv blocks, full ones and the edges.
  add(
      "bf16_odd_dims", [](CaseSpec& s) { s.dtype = DType::bf16, s.D = 33, s.Dv = 17, s.Tq = 41; }, 16, 32);
  add(
      "bf16_blocks_full_and_edges",
      [](CaseSpec& s) { s.dtype = DType::bf16, s.Tq = 150, s.Tk = 170, s.D = 56, s.Dv = 36; }, 64, 48);
  return cases;
}

class BackwardTiers : public ::testing::TestWithParam<TierCase> {};

TEST_P(BackwardTiers, EveryTierMatchesOracle) {
  const TierCase& tc = GetParam();
  const testing::Case c = testing::make_case(tc.spec, 17);
  const testing::BackwardCase bc = testing::make_backward_case(c, tc.bq, tc.bk, 17);
  const AttentionProblem& p = bc.bp.fwd;
  const BlockMap map = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, tc.bq, tc.bk);
  const native::ReferenceGradients want = native::reference_backward_f64(bc.bp);
  SCOPED_TRACE(c.describe());
  for (const cpu::ForcedTier& tier : testing::cpu_kernel_tiers_to_test()) {
    GradientBuffers got = allocate_gradient_buffers(bc.bp);
    cpu::tiled_backward(bc.bp, map, got, tier);
    EXPECT_TRUE(testing::gradients_match(bc.bp, want, got)) << testing::tier_label(tier);
    EXPECT_EQ(got.run.kernel, cpu::isa_name(tier.isa)) << got.run.kernel_detail;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardTiers, ::testing::ValuesIn(tier_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace attnops
