// Parity of the tiled kernels (native scalar and fast CPU) with the fp64 oracle on random
// inputs: odd sizes that are not multiples of any block size, Tq != Tk, head dims that are not
// powers of two, GQA 1..16, every mask kind and combination, segments, bias (full and
// broadcast), soft cap, sinks, fully masked rows, f32 / f16 / bf16, several block sizes.
// The fast CPU kernel runs on every ISA tier this machine runs (testing::cpu_kernel_tiers_to_test:
// up to the detected tier, or ATTNOPS_CPU_ISA's cap, then the emulated builds of the tiers above),
// each checked against the oracle computed once per case and against the native kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/cpu/tiled_cpu.h"
#include "backends/native/reference.h"
#include "backends/native/tiled_native.h"
#include "tests/support/testing.h"
#include "tests/tiled/tiled_cases.h"

namespace attnops {
namespace {

using testing::Case;
using testing::CaseSpec;
using tiled_test::KernelCase;

// Max |a - b| over outputs and whether lse agrees, against a precomputed fp64 oracle (computed
// once per case, shared by both kernels).
::testing::AssertionResult matches_oracle(const AttentionProblem& p, const native::ReferenceResult& ref,
                                          const AttentionBuffers& got) {
  const testing::Tolerance tol = testing::tolerance_for(p.dtype);
  double worst = 0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double g = got.out.at(i);
    const double e = std::isfinite(g) ? std::abs(g - ref.out[i]) : INFINITY;
    if (e > worst) worst = e, worst_i = i;
  }
  if (!(worst <= tol.out))
    return ::testing::AssertionFailure()
           << "max |out err| " << worst << " > " << tol.out << " at flat index " << worst_i
           << " (b,i,h,d) = (" << worst_i / (p.Dv * p.Hq * p.Tq) << "," << worst_i / (p.Dv * p.Hq) % p.Tq
           << "," << worst_i / p.Dv % p.Hq << "," << worst_i % p.Dv << "): got " << got.out.at(worst_i)
           << ", oracle " << ref.out[worst_i];
  if (!got.lse) return ::testing::AssertionFailure() << "lse missing";
  for (std::size_t i = 0; i < ref.lse.size(); ++i) {
    const double g = got.lse->data_as<float>()[i], e = ref.lse[i];
    if (std::isinf(e)) {
      if (!(std::isinf(g) && g < 0))
        return ::testing::AssertionFailure()
               << "lse[" << i << "] = " << g << ", oracle -inf (fully masked row)";
    } else if (!(std::abs(g - e) <= tol.lse)) {
      return ::testing::AssertionFailure() << "lse[" << i << "] = " << g << ", oracle " << e;
    }
  }
  return ::testing::AssertionSuccess();
}

class TiledParity : public ::testing::TestWithParam<KernelCase> {};

TEST_P(TiledParity, NativeAndCpuMatchOracle) {
  const KernelCase& kc = GetParam();
  const Case c = testing::make_case(kc.spec, kc.seed);
  const AttentionProblem p = testing::problem_for(c, kc.bq, kc.bk);
  SCOPED_TRACE(c.describe() + " bq=" + std::to_string(kc.bq) + " bk=" + std::to_string(kc.bk));
  const BlockMap map = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k);
  const native::ReferenceResult ref = native::reference_attention_f64(p, false);

  AttentionBuffers nat = allocate_buffers(p);
  native::tiled_attention(p, map, nat);
  EXPECT_TRUE(matches_oracle(p, ref, nat)) << "native tiled";

  for (const cpu::ForcedTier& tier : testing::cpu_kernel_tiers_to_test()) {
    AttentionBuffers fast = allocate_buffers(p);
    cpu::tiled_attention(p, map, fast, tier);
    EXPECT_TRUE(matches_oracle(p, ref, fast)) << "cpu tiled, " << testing::tier_label(tier);
    EXPECT_EQ(fast.run.kernel, cpu::isa_name(tier.isa)) << fast.run.kernel_detail;

    // The two kernels agree with each other at least as closely as each does with the oracle.
    double diff = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(nat.out.numel()); ++i)
      diff = std::max(diff, static_cast<double>(std::abs(nat.out.at(i) - fast.out.at(i))));
    EXPECT_LE(diff, testing::tolerance_for(p.dtype).out) << "native vs cpu, " << testing::tier_label(tier);
  }
}

INSTANTIATE_TEST_SUITE_P(Explicit, TiledParity, ::testing::ValuesIn(tiled_test::explicit_cases()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Random, TiledParity,
                         ::testing::ValuesIn(tiled_test::random_cases(testing::random_case_count(140),
                                                                      20261122)),
                         [](const auto& info) { return info.param.name; });

// Outer strides that are not the contiguous ones (q heads sliced out of a wider tensor, k / v
// rows of a larger cache): the kernels must use TensorView::stride, not assume packing.
TEST(TiledStrides, SlicedViewsMatchOracle) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::int64_t B = 2, Tq = 45, Tk = 77, Hq = 4, Hkv = 2, D = 40;
    const Tensor qw = testing::random_tensor(dt, {B, Tq, 2 * Hq, D}, 1);
    const Tensor kw = testing::random_tensor(dt, {B, Tk + 9, Hkv + 1, D}, 2);
    const Tensor vw = testing::random_tensor(dt, {B, Tk + 9, Hkv + 1, D}, 3);
    const TensorView q = qw.view().slice(2, Hq, 2 * Hq);
    const TensorView k = kw.view().slice(1, 9, Tk + 9).slice(2, 1, Hkv + 1);
    const TensorView v = vw.view().slice(1, 0, Tk).slice(2, 0, Hkv);
    AttentionOptions o;
    o.causal = true;
    o.return_lse = true;
    OperationMetadata md;
    md.blocksize_q = 16;
    md.blocksize_k = 32;
    const AttentionProblem p = make_problem(q, k, v, o, md);
    ASSERT_NE(p.q.stride(1), Hq * D) << "the test needs a strided view";
    const BlockMap map = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, 16, 32);
    const native::ReferenceResult ref = native::reference_attention_f64(p, false);
    AttentionBuffers nat = allocate_buffers(p);
    native::tiled_attention(p, map, nat);
    EXPECT_TRUE(matches_oracle(p, ref, nat)) << dtype_name(dt);
    for (const cpu::ForcedTier& tier : testing::cpu_kernel_tiers_to_test()) {
      AttentionBuffers fast = allocate_buffers(p);
      cpu::tiled_attention(p, map, fast, tier);
      EXPECT_TRUE(matches_oracle(p, ref, fast)) << dtype_name(dt) << " " << testing::tier_label(tier);
    }
  }
}

// The guarded re-run of the non-finite policy (p.guard_nonfinite_v: weight-0 lanes of P skipped in
// the O update) on finite inputs gives the plain result, on V rows read in place and, at >= 4 KiB
// apart, as AVX2's V^T tiles.
TEST(TiledGuard, GuardedRunMatchesOracleOnNarrowAndWideVRows) {
  for (const std::int64_t Hkv : {2, 16}) {
    CaseSpec spec;
    spec.B = 1, spec.Tq = 61, spec.Tk = 83, spec.Hq = 16, spec.Hkv = Hkv, spec.D = 72;
    const Case c = testing::make_case(spec, 31);
    AttentionProblem p = testing::problem_for(c, 32, 48);
    p.guard_nonfinite_v = true;
    const BlockMap map = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, 32, 48);
    const native::ReferenceResult ref = native::reference_attention_f64(p, false);
    for (const cpu::ForcedTier& tier : testing::cpu_kernel_tiers_to_test()) {
      AttentionBuffers fast = allocate_buffers(p);
      cpu::tiled_attention(p, map, fast, tier);
      EXPECT_TRUE(matches_oracle(p, ref, fast)) << "Hkv " << Hkv << " " << testing::tier_label(tier);
    }
  }
}

// Empty sequences: no keys means every row is fully masked (out 0, lse -inf); no queries or no
// batch means nothing to write.
TEST(TiledEdges, EmptySequences) {
  for (auto [B, Tq, Tk] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 5, 0}, {2, 0, 7}, {0, 3, 3}}) {
    CaseSpec spec;
    spec.B = B, spec.Tq = Tq, spec.Tk = Tk, spec.Hq = 2, spec.Hkv = 1, spec.D = 8;
    spec.causal = false;
    const Case c = testing::make_case(spec, 9);
    const AttentionProblem p = testing::problem_for(c, 4, 4);
    const BlockMap map = build_block_map(p.mask, p.Hq, p.Tq, p.Tk, 4, 4);
    if (Tq == 0 || Tk == 0) {
      EXPECT_EQ(map.num_blocks(), 0);
    }
    const native::ReferenceResult ref = native::reference_attention_f64(p, false);
    AttentionBuffers nat = allocate_buffers(p);
    native::tiled_attention(p, map, nat);
    EXPECT_TRUE(matches_oracle(p, ref, nat)) << "B=" << B << " Tq=" << Tq << " Tk=" << Tk;
    for (const cpu::ForcedTier& tier : testing::cpu_kernel_tiers_to_test()) {
      AttentionBuffers fast = allocate_buffers(p);
      cpu::tiled_attention(p, map, fast, tier);
      EXPECT_TRUE(matches_oracle(p, ref, fast))
          << "B=" << B << " Tq=" << Tq << " Tk=" << Tk << " " << testing::tier_label(tier);
    }
  }
}

TEST(TiledErrors, MapForAnotherShapeIsShapeMismatch) {
  CaseSpec spec;
  spec.Tq = spec.Tk = 20;
  const Case c = testing::make_case(spec, 5);
  const AttentionProblem p = testing::problem_for(c, 8, 8);
  const BlockMap wrong = build_block_map(p.mask, 1, 21, 20, 8, 8);
  AttentionBuffers buf = allocate_buffers(p);
  for (int which = 0; which < 2; ++which) {
    try {
      if (which == 0)
        native::tiled_attention(p, wrong, buf);
      else
        cpu::tiled_attention(p, wrong, buf);
      FAIL() << "expected shape_mismatch";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::shape_mismatch);
      EXPECT_NE(std::string(e.what()).find("Tq=21"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace attnops
