// The CPU backward is deterministic: repeated runs and runs with 1, 2 and 3 threads give bitwise
// identical dq, dk, dv, dsinks and dbias (each gradient row is written by one task in a fixed
// order; a broadcast dbias is accumulated by one task per kv block, in order).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/tiled_backward.h"
#include "tests/backward/grad_testing.h"

namespace attnops {
namespace {

GradientBuffers run_cpu(testing::BackwardCase& bc, const BlockMap& map, int threads) {
  bc.bp.fwd.num_threads = threads;
  GradientBuffers g = allocate_gradient_buffers(bc.bp);
  cpu::tiled_backward(bc.bp, map, g);
  return g;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

::testing::AssertionResult bitwise_equal(const GradientBuffers& a, const GradientBuffers& b) {
  if (!same_bytes(a.dq, b.dq)) return ::testing::AssertionFailure() << "dq differs";
  if (!same_bytes(a.dk, b.dk)) return ::testing::AssertionFailure() << "dk differs";
  if (!same_bytes(a.dv, b.dv)) return ::testing::AssertionFailure() << "dv differs";
  if (a.dsinks.has_value() != b.dsinks.has_value() || (a.dsinks && !same_bytes(*a.dsinks, *b.dsinks)))
    return ::testing::AssertionFailure() << "dsinks differs";
  if (a.dbias.has_value() != b.dbias.has_value() || (a.dbias && !same_bytes(*a.dbias, *b.dbias)))
    return ::testing::AssertionFailure() << "dbias differs";
  return ::testing::AssertionSuccess();
}

TEST(BackwardDeterminism, BitwiseEqualAcrossRunsAndThreadCounts) {
  struct Variant {
    const char* name;
    DType dtype;
    bool causal, segments, bias, broadcast, sinks;
    std::int64_t Hq, Hkv, bq, bk;
  };
  for (const Variant& var :
       {Variant{"f32_causal_gqa", DType::f32, true, false, false, false, false, 4, 2, 64, 64},
        Variant{"f32_all_bias_per_head", DType::f32, true, true, true, false, true, 4, 2, 48, 80},
        Variant{"f32_bias_broadcast", DType::f32, false, false, true, true, false, 4, 2, 128, 128},
        Variant{"bf16_causal_segments", DType::bf16, true, true, false, false, true, 4, 1, 32, 64}}) {
    SCOPED_TRACE(var.name);
    testing::CaseSpec s;
    s.B = 2, s.Tq = 301, s.Tk = 333, s.Hq = var.Hq, s.Hkv = var.Hkv, s.D = 80;
    s.dtype = var.dtype;
    s.causal = var.causal;
    s.segments = var.segments;
    s.bias = var.bias;
    s.bias_broadcast = var.broadcast;
    s.sinks = var.sinks;
    const testing::Case c = testing::make_case(s, 77);
    testing::BackwardCase bc = testing::make_backward_case(c, var.bq, var.bk, 77);
    const BlockMap map = build_block_map(bc.bp.fwd.mask, s.Hq, s.Tq, s.Tk, var.bq, var.bk);
    const GradientBuffers one = run_cpu(bc, map, 1);
    const GradientBuffers two = run_cpu(bc, map, 2);
    const GradientBuffers three = run_cpu(bc, map, 3);
    const GradientBuffers two_again = run_cpu(bc, map, 2);
    EXPECT_TRUE(bitwise_equal(one, two)) << "1 thread vs 2 threads";
    EXPECT_TRUE(bitwise_equal(one, three)) << "1 thread vs 3 threads";
    EXPECT_TRUE(bitwise_equal(two, two_again)) << "repeated 2-thread runs";
    EXPECT_TRUE(testing::gradients_match(bc.bp, native::reference_backward_f64(bc.bp), two));
  }
}

}  // namespace
}  // namespace attnops
