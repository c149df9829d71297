// VanillaAttn::forward_cpu on strided views: K/V as a slice of a bigger KV cache (rows of the
// cache further apart than Hkv * D, batches further apart than Tk rows), q as a slice of the heads
// of a fused qkv-like buffer. Both the GEMM path (f32 maps with an outer stride) and the decode
// path must read the views in place and agree with the oracle.
#include <gtest/gtest.h>

#include <cstring>

#include "attnops/ext/problem.h"
#include "tests/vanilla_cpu/vanilla_test_util.h"

namespace attnops::testing::vanilla {
namespace {

// Copies the contiguous [B, T, H, D] tensor `src` into `big` [B, Tbig, Hbig, D] at time offset
// t0 and head offset h0; returns the strided view of that region.
TensorView embed(const Tensor& src, Tensor& big, std::int64_t t0, std::int64_t h0) {
  const std::int64_t B = src.dim(0), T = src.dim(1), H = src.dim(2), D = src.dim(3);
  const std::int64_t Tb = big.dim(1), Hb = big.dim(2);
  const std::size_t es = dtype_size(src.dtype());
  const auto* s = static_cast<const std::byte*>(src.data());
  auto* d = static_cast<std::byte*>(big.data());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        std::memcpy(d + static_cast<std::size_t>(((b * Tb + t0 + t) * Hb + h0 + h) * D) * es,
                    s + static_cast<std::size_t>(((b * T + t) * H + h) * D) * es,
                    static_cast<std::size_t>(D) * es);
  const std::byte* origin = d + static_cast<std::size_t>((t0 * Hb + h0) * D) * es;
  return TensorView(origin, src.dtype(), {B, T, H, D}, {Tb * Hb * D, Hb * D, D, 1});
}

struct ViewCase {
  std::int64_t Tq, Tk;
  DType dtype;
  bool causal;
};

class VanillaViews : public ::testing::TestWithParam<ViewCase> {};

TEST_P(VanillaViews, KvCacheSliceAndHeadSliceMatchOracle) {
  const ViewCase vc = GetParam();
  CaseSpec s = shape_spec(2, vc.Tq, vc.Tk, 8, 2, 80, vc.dtype, vc.causal, 96);
  s.sinks = true;
  const Case c = make_case(s, 21);
  // The cache holds 3 kv heads and 2 * Tk + 5 positions; our keys start at position 3, head 1.
  Tensor kcache(vc.dtype, {2, 2 * vc.Tk + 5, 3, 80}), vcache(vc.dtype, {2, 2 * vc.Tk + 5, 3, 96});
  // q lives in a buffer with 20 heads (as in a fused projection); ours are heads 4..11.
  Tensor qbig(vc.dtype, {2, vc.Tq, 20, 80});
  const TensorView kv = embed(c.k, kcache, 3, 1), vv = embed(c.v, vcache, 3, 1), qv = embed(c.q, qbig, 0, 4);
  OperationMetadata md;
  AttentionProblem strided = make_problem(qv, kv, vv, c.options, md);
  ASSERT_NE(strided.k.stride(1), 2 * 80) << "the kernel must see the cache's strides, not a copy";
  AttentionProblem dense = problem_for(c);
  const native::ReferenceResult ref = native::reference_attention_f64(dense, false);
  for (const cpu::ForcedTier& tier : cpu_kernel_tiers_to_test())
    for (int threads : {1, 2}) {
      const AttentionBuffers a = run_cpu(strided, threads, tier);
      EXPECT_TRUE(within_tolerance(dense, ref, a))
          << c.describe() << " threads=" << threads << " " << tier_label(tier);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, VanillaViews,
    ::testing::Values(ViewCase{37, 53, DType::f32, true}, ViewCase{37, 53, DType::f16, false},
                      ViewCase{16, 16, DType::bf16, true}, ViewCase{1, 1500, DType::f32, true},
                      ViewCase{2, 700, DType::bf16, false}, ViewCase{1, 2100, DType::f16, true}));

}  // namespace
}  // namespace attnops::testing::vanilla
