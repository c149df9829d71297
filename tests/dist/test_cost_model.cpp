// The ring's cost model: the step time is the slower of compute and communication, the fewest
// tokens that hide communication balance the two, efficiency falls once communication dominates.
#include <gtest/gtest.h>

#include <cmath>

#include "attnops/dist/cost_model.h"

namespace attnops::dist {
namespace {

TEST(CostModel, StepIsTheSlowerOfComputeAndCommunication) {
  RingShape s;
  s.B = 1, s.Hq = 16, s.Hkv = 16, s.D = s.Dv = 128, s.causal = true, s.elem_bytes = 4;
  const Link link{"l", 10.0, 10.0, false};
  const StepEstimate e = ring_step(s, 4096, 100.0, link);
  // Tl^2 / 2 pairs, 2 (D + Dv) flops per pair and head.
  EXPECT_DOUBLE_EQ(e.flops, 4096.0 * 4096.0 / 2 * 16 * 512);
  EXPECT_NEAR(e.compute_s, e.flops / 100e9, 1e-12);
  EXPECT_DOUBLE_EQ(e.bytes, 4096.0 * 16 * 256 * 4);
  EXPECT_NEAR(e.comm_s, 10e-6 + e.bytes / 10e9, 1e-15);
  EXPECT_DOUBLE_EQ(e.step_s, std::max(e.compute_s, e.comm_s));
  // The backward: 2.5x the flops, fp32 dK/dV on the wire too.
  s.backward = true;
  const StepEstimate b = ring_step(s, 4096, 100.0, link);
  EXPECT_DOUBLE_EQ(b.flops, 2.5 * e.flops);
  EXPECT_DOUBLE_EQ(b.bytes, 2 * e.bytes);
}

TEST(CostModel, FewestTokensBalanceComputeAndCommunication) {
  RingShape s;
  s.Hq = 8, s.Hkv = 2, s.D = s.Dv = 64;
  for (const Link& l : standard_links(1.0, 5.0))
    for (double gflops : {50.0, 1000.0, 100000.0}) {
      const double t = min_tokens_to_hide(s, gflops, l);
      const StepEstimate e = ring_step(s, t, gflops, l);
      EXPECT_NEAR(e.compute_s / e.comm_s, 1.0, 1e-9) << l.name << " " << gflops;
      EXPECT_DOUBLE_EQ(ring_efficiency(s, 64, 2 * t, gflops, l), 1.0);  // hidden
      EXPECT_LT(ring_efficiency(s, 64, t / 4, gflops, l), 0.5);         // exposed
    }
  // A faster rank needs more tokens to hide the same link; non-causal steps hide sooner.
  const Link l = standard_links(1.0, 5.0)[1];
  EXPECT_GT(min_tokens_to_hide(s, 1000.0, l), min_tokens_to_hide(s, 100.0, l));
  RingShape n = s;
  n.causal = false;
  EXPECT_LT(min_tokens_to_hide(n, 1000.0, l), min_tokens_to_hide(s, 1000.0, l));
  EXPECT_DOUBLE_EQ(ring_efficiency(s, 1, 10, 1000.0, l), 1.0);
}

}  // namespace
}  // namespace attnops::dist
