// Parity of the CPU backward kernel with the fp64 backward oracle over the forward's parity grid
// (tests/tiled/tiled_cases): odd sizes, Tq != Tk, head dims that are not powers of two, Dv != D,
// GQA 1..16, every mask kind and combination, segments, bias (full and broadcast), soft cap,
// sinks, fully masked rows, f32 / f16 / bf16, many block sizes. The residuals (out, lse) are the
// oracle's, rounded as a forward stores them; tolerances in grad_testing.h.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/tiled_backward.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"
#include "tests/backward/grad_testing.h"
#include "tests/support/testing.h"
#include "tests/tiled/tiled_cases.h"

namespace attnops {
namespace {

using testing::Case;
using testing::CaseSpec;
using tiled_test::KernelCase;

class BackwardParity : public ::testing::TestWithParam<KernelCase> {};

TEST_P(BackwardParity, CpuMatchesOracle) {
  const KernelCase& kc = GetParam();
  const Case c = testing::make_case(kc.spec, kc.seed);
  SCOPED_TRACE(c.describe() + " bq=" + std::to_string(kc.bq) + " bk=" + std::to_string(kc.bk));
  const testing::BackwardCase bc = testing::make_backward_case(c, kc.bq, kc.bk, kc.seed);
  const AttentionProblem& p = bc.bp.fwd;
  const BlockMap map = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, kc.bq, kc.bk);
  const native::ReferenceGradients want = native::reference_backward_f64(bc.bp);
  GradientBuffers got = allocate_gradient_buffers(bc.bp);
  cpu::tiled_backward(bc.bp, map, got);
  EXPECT_TRUE(testing::gradients_match(bc.bp, want, got));
}

INSTANTIATE_TEST_SUITE_P(Explicit, BackwardParity, ::testing::ValuesIn(tiled_test::explicit_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Random, BackwardParity,
                         ::testing::ValuesIn(tiled_test::random_cases(testing::random_case_count(140),
                                                                      20261122)),
                         [](const auto& info) { return info.param.name; });

// Outer strides that are not the contiguous ones, for q, k, v and dout (out copied as is).
TEST(BackwardStrides, SlicedViewsMatchOracle) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::int64_t B = 2, Tq = 45, Tk = 77, Hq = 4, Hkv = 2, D = 40;
    const Tensor qw = testing::random_tensor(dt, {B, Tq, 2 * Hq, D}, 1);
    const Tensor kw = testing::random_tensor(dt, {B, Tk + 9, Hkv + 1, D}, 2);
    const Tensor vw = testing::random_tensor(dt, {B, Tk + 9, Hkv + 1, D}, 3);
    const Tensor gw = testing::random_tensor(dt, {B, Tq, Hq + 3, D}, 4);
    const TensorView q = qw.view().slice(2, Hq, 2 * Hq);
    const TensorView k = kw.view().slice(1, 9, Tk + 9).slice(2, 1, Hkv + 1);
    const TensorView v = vw.view().slice(1, 0, Tk).slice(2, 0, Hkv);
    const TensorView dout = gw.view().slice(2, 1, Hq + 1);
    AttentionOptions o;
    o.return_lse = true;
    OperationMetadata md;
    md.blocksize_q = 16;
    md.blocksize_k = 32;
    const AttentionProblem fp = make_problem(q, k, v, o, md);
    AttentionBuffers fwd = allocate_buffers(fp);
    native::reference_attention(fp, fwd);
    const BackwardProblem bp = make_backward_problem(q, k, v, fwd.out, *fwd.lse, dout, o, md);
    ASSERT_NE(bp.fwd.q.stride(1), Hq * D) << "the test needs a strided view";
    ASSERT_NE(bp.dout.stride(1), Hq * D) << "the test needs a strided dout";
    const BlockMap map = build_block_map(bp.fwd.mask, Hq, Tq, Tk, 16, 32);
    GradientBuffers got = allocate_gradient_buffers(bp);
    cpu::tiled_backward(bp, map, got);
    EXPECT_TRUE(testing::gradients_match(bp, native::reference_backward_f64(bp), got)) << dtype_name(dt);
  }
}

// Fully masked rows (segments that match no key, a window that misses every key, Tq > Tk causal)
// get exactly zero dq, contribute nothing to dk / dv / dsinks, and nothing is NaN.
TEST(BackwardEdges, FullyMaskedRowsGiveZeroGradients) {
  CaseSpec s;
  s.B = 1, s.Tq = 90, s.Tk = 30, s.Hq = 2, s.Hkv = 1, s.D = 16;
  s.sinks = true;
  s.bias = true;
  const Case c = testing::make_case(s, 3);
  const testing::BackwardCase bc = testing::make_backward_case(c, 32, 16, 3);
  const BlockMap map = build_block_map(bc.bp.fwd.mask, 2, 90, 30, 32, 16);
  GradientBuffers got = allocate_gradient_buffers(bc.bp);
  cpu::tiled_backward(bc.bp, map, got);
  // Causal bottom-right with Tq = 90 > Tk = 30: rows 0..59 see no key.
  for (std::int64_t i = 0; i < 60; ++i)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t d = 0; d < 16; ++d)
        ASSERT_EQ(got.dq.at(static_cast<std::size_t>((i * 2 + h) * 16 + d)), 0.f) << "row " << i;
  for (const Tensor* t : {&got.dq, &got.dk, &got.dv, &*got.dsinks, &*got.dbias})
    for (std::int64_t i = 0; i < t->numel(); ++i)
      ASSERT_TRUE(std::isfinite(t->at(static_cast<std::size_t>(i))));
  EXPECT_TRUE(testing::gradients_match(bc.bp, native::reference_backward_f64(bc.bp), got));
}

TEST(BackwardErrors, MapForAnotherShapeIsShapeMismatch) {
  CaseSpec s;
  s.Tq = s.Tk = 20;
  const Case c = testing::make_case(s, 5);
  const testing::BackwardCase bc = testing::make_backward_case(c, 8, 8, 5);
  const BlockMap wrong = build_block_map(bc.bp.fwd.mask, 1, 21, 20, 8, 8);
  GradientBuffers g = allocate_gradient_buffers(bc.bp);
  try {
    cpu::tiled_backward(bc.bp, wrong, g);
    FAIL() << "expected shape_mismatch";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
    EXPECT_NE(std::string(e.what()).find("Tq=21"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnops
