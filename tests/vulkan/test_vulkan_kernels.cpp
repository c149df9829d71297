// The tiled kernels on lavapipe against the fp64 oracle, beyond the shared parity grid of
// test_vulkan_parity.cpp: the GPU shape of flash_subgroup (head dim split over lanes with
// subgroup shuffles, several subgroups and workgroup barriers, 8-key steps) forced on lavapipe,
// split-KV decode with Tk up to 32768 (and split-KV forced on prefill, with sinks), the baseline
// row-wise kernel, the non-finite-value policy, and the kernel variant in the decision.
//
// Pipelines are compiled by LLVM on lavapipe (seconds each), so the forced shapes are few and
// reuse one another's head dims.
#include <cmath>
#include <limits>
#include <string>

#include "backends/common/block_map.h"
#include "backends/native/reference.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

using vulkan::Kernel;
using vulkan::KernelOverride;
using vulkan::Variant;

// Runs one kernel under a forced variant / tile shape and returns the buffers.
AttentionBuffers run_forced(Kernel kernel, const AttentionProblem& p, const KernelOverride& force) {
  AttentionBuffers b = allocate_buffers(p);
  vulkan::debug::set_kernel_override(force);
  try {
    std::shared_ptr<const BlockMap> map;
    if (kernel != Kernel::vanilla)
      map = get_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k);
    vulkan::run(kernel, p, map.get(), software_ok(), b);
  } catch (...) {
    vulkan::debug::clear_kernel_override();
    throw;
  }
  vulkan::debug::clear_kernel_override();
  return b;
}

KernelOverride tiles(const std::string& text, std::optional<Variant> v = std::nullopt) {
  KernelOverride o = vulkan::parse_tiles(text);
  o.variant = v;
  return o;
}

// The GPU shape on lavapipe's 8-lane subgroups: 2 lanes per row (shuffle sums), 2 rows per team,
// 16 rows = 2 subgroups per workgroup (workgroup barriers), 8-key softmax steps.
const KernelOverride kGpuShape = tiles("ds=2,rpt=2,ku=8,rows=16");

class VulkanKernels : public VulkanTest {
 protected:
  void TearDown() override {
    vulkan::debug::clear_kernel_override();
    VulkanTest::TearDown();
  }
};

void expect_parity(Kernel kernel, const Case& c, const KernelOverride& force,
                   const std::string& expect_kernel) {
  const AttentionProblem p = problem_for(c);
  const AttentionBuffers b = run_forced(kernel, p, force);
  SCOPED_TRACE(c.describe() + " -> " + b.run.kernel + ": " + b.run.kernel_detail);
  EXPECT_TRUE(within_tolerance(p, b));
  if (!expect_kernel.empty()) {
    EXPECT_EQ(b.run.kernel, expect_kernel);
  }
}

TEST_F(VulkanKernels, GpuShapeWithShufflesAndBarriers) {
  std::uint64_t seed = 2000;
  // Head dims padded inside the kernel (40 = 5 vec4 over 2 lanes), masks on partial tiles, GQA
  // packing of a short query block, segments, bias, soft cap, sinks; f32 and f16.
  const Spec specs[] = {
      Spec().shape(2, 37, 53).heads(4, 2).dim(40).causal(true),
      Spec().shape(1, 53, 37).heads(4, 1).dim(40).causal(false).window(5, 2).segments(),
      Spec().shape(1, 3, 70).heads(8, 2).dim(40).causal(true).bias().soft_cap(5.0).sinks(),
      Spec().shape(1, 29, 29).heads(2, 2).dim(40, 24).causal(true).chunk(6).dtype(DType::f16),
  };
  for (const Spec& s : specs)
    for (Kernel k : {Kernel::flash, Kernel::blocksparse})
      expect_parity(k, make_case(s, ++seed), kGpuShape, "flash_subgroup");
}

TEST_F(VulkanKernels, SplitKvOnPrefillWithSinksAndLse) {
  std::uint64_t seed = 2100;
  const KernelOverride split = tiles("split=3");
  expect_parity(Kernel::flash,
                make_case(Spec().shape(1, 40, 200).heads(4, 1).dim(64).causal(true).sinks(), ++seed), split,
                "flash_subgroup+split_kv");
  // A chunk whose keys are all masked for a row (causal: the first rows see one chunk only).
  expect_parity(Kernel::flash,
                make_case(Spec().shape(2, 33, 150).heads(2, 2).dim(64).causal(true).window(20, 0), ++seed),
                split, "flash_subgroup+split_kv");
  // Split in the GPU shape too.
  expect_parity(Kernel::flash,
                make_case(Spec().shape(1, 9, 300).heads(4, 2).dim(40).causal(false).bias(), ++seed),
                tiles("ds=2,rpt=2,ku=8,rows=16,split=5"), "flash_subgroup+split_kv");
}

// Decode: vanilla (what the decode fallbacks of blocksparse and flash_attn2 run) and flash take
// split-KV when no weights are asked for; the q heads of a kv head share a workgroup.
TEST_F(VulkanKernels, DecodeSplitKvUpTo32kKeys) {
  std::uint64_t seed = 2200;
  struct Shape {
    std::int64_t Tk, Hq, Hkv;
    DType t;
  };
  for (const Shape& s :
       {Shape{32768, 8, 1, DType::f32}, Shape{4097, 16, 1, DType::f16}, Shape{2500, 4, 4, DType::bf16}}) {
    Case c = make_case(Spec().shape(1, 1, s.Tk).heads(s.Hq, s.Hkv).dim(64).dtype(s.t).causal(true).sinks(),
                       ++seed);
    const AttentionProblem p = problem_for(c);
    const AttentionBuffers b = run_forced(Kernel::vanilla, p, {});
    SCOPED_TRACE(c.describe() + " -> " + b.run.kernel + ": " + b.run.kernel_detail);
    EXPECT_EQ(b.run.kernel, "flash_subgroup+split_kv");
    EXPECT_NE(b.run.kernel_detail.find("vanilla_gemm: decode-shaped"), std::string::npos);
    EXPECT_TRUE(within_tolerance(p, b));
  }
  // A sliding window over a long cache, and a few query rows (speculative decoding).
  expect_parity(Kernel::vanilla,
                make_case(Spec().shape(2, 1, 20000).heads(4, 2).dim(64).causal(true).window(3000, 0), ++seed),
                {}, "flash_subgroup+split_kv");
  expect_parity(Kernel::flash, make_case(Spec().shape(1, 4, 9000).heads(8, 2).dim(64).causal(true), ++seed),
                {}, "flash_subgroup+split_kv");
  // With the weights asked for, vanilla keeps its GEMM path.
  Case w = make_case(Spec().shape(1, 1, 3000).heads(2, 1).dim(64).causal(true), ++seed);
  w.options.return_weights = true;
  const AttentionProblem p = problem_for(w);
  const AttentionBuffers b = run_forced(Kernel::vanilla, p, {});
  EXPECT_EQ(b.run.kernel, "vanilla_gemm");
  EXPECT_TRUE(within_tolerance(p, b));
}

// The first kernel stays available (the bench's baseline, and the fallback).
TEST_F(VulkanKernels, RowwiseBaselineWhenForced) {
  KernelOverride rowwise;
  rowwise.variant = Variant::flash_rowwise;
  expect_parity(Kernel::flash,
                make_case(Spec().shape(1, 45, 60).heads(4, 2).dim(64).causal(true).sinks(), 2300), rowwise,
                "flash_rowwise");
}

// ---- non-finite inputs (the library's policy) ----

float& at(Tensor& t, std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) {
  return t.data_as<float>()[((b * t.dim(1) + i) * t.dim(2) + h) * t.dim(3) + d];
}

struct Variants {
  const char* name;
  Kernel kernel;
  KernelOverride force;
};
std::vector<Variants> all_variants() {
  KernelOverride gemm;
  gemm.variant = Variant::vanilla_gemm;
  return {{"subgroup", Kernel::flash, {}},
          {"gpu shape", Kernel::flash, kGpuShape},
          {"split", Kernel::flash, tiles("split=2")},
          {"vanilla_gemm", Kernel::vanilla, gemm}};
}

// NaN / Inf in k and v of a key reach exactly the rows that see it (causal: the rows at or after
// it); a masked key's values never reach a row, not even as 0 * NaN.
TEST_F(VulkanKernels, NonFiniteKeysAndValuesReachOnlyTheRowsThatSeeThem) {
  Case c = make_case(Spec().shape(1, 40, 40).heads(2, 1).dim(64).causal(true), 2400);
  const std::int64_t bad = 21;  // key 21: rows 0..20 do not see it
  at(c.k, 0, bad, 0, 3) = std::numeric_limits<float>::quiet_NaN();
  at(c.v, 0, bad + 2, 0, 5) = std::numeric_limits<float>::infinity();  // key 23 (v only)
  const AttentionProblem p = problem_for(c);
  const native::ReferenceResult ref = native::reference_attention_f64(p, false);
  for (const Variants& v : all_variants()) {
    const AttentionBuffers b = run_forced(v.kernel, p, v.force);
    SCOPED_TRACE(std::string(v.name) + ": " + b.run.kernel);
    for (std::int64_t i = 0; i < p.Tq; ++i)
      for (std::int64_t h = 0; h < p.Hq; ++h)
        for (std::int64_t d = 0; d < p.Dv; ++d) {
          const std::size_t idx = static_cast<std::size_t>((i * p.Hq + h) * p.Dv + d);
          const double got = b.out.at(idx), want = ref.out[idx];
          if (i < bad) {
            ASSERT_TRUE(std::isfinite(got)) << "row " << i << " does not see the NaN key";
            ASSERT_NEAR(got, want, 2e-5) << "row " << i;
          } else {
            ASSERT_TRUE(std::isnan(got)) << "row " << i << " sees the NaN key: " << got;
          }
        }
  }
}

// A -inf logit is a mask (a masked key's NaN value stays out of the row); a row whose every
// logit is -inf is fully masked (out 0, lse -inf); a +inf sink takes all the mass (out 0, lse
// over the visible keys unchanged).
TEST_F(VulkanKernels, MinusInfinityBiasMasksAndInfiniteSinkTakesTheMass) {
  Case c = make_case(Spec().shape(1, 20, 30).heads(2, 2).dim(40).causal(false).bias().sinks(), 2500);
  float* bias = c.bias->data_as<float>();  // [1, 2, 20, 30]
  const float ninf = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < 30; ++j) bias[4 * 30 + j] = ninf;     // head 0, row 4: every key
  for (std::int64_t j = 0; j < 30; j += 2) bias[7 * 30 + j] = ninf;  // head 0, row 7: even keys
  at(c.v, 0, 0, 0, 2) = std::numeric_limits<float>::quiet_NaN();     // key 0 of kv head 0
  c.sinks->data_as<float>()[1] = std::numeric_limits<float>::infinity();
  const AttentionProblem p = problem_for(c);
  for (const Variants& v : all_variants()) {
    const AttentionBuffers b = run_forced(v.kernel, p, v.force);
    SCOPED_TRACE(std::string(v.name) + ": " + b.run.kernel);
    const float* lse = b.lse->data_as<float>();
    for (std::int64_t i = 0; i < p.Tq; ++i)
      for (std::int64_t h = 0; h < p.Hq; ++h)
        for (std::int64_t d = 0; d < p.Dv; ++d) {
          const float got = b.out.at(static_cast<std::size_t>((i * p.Hq + h) * p.Dv + d));
          if (h == 1 || i == 4)  // the +inf sink's head; the row of -inf logits
            ASSERT_EQ(got, 0.f) << "head " << h << " row " << i;
          else if (i == 7 || d != 2)  // row 7 masks key 0 by its -inf bias; only column 2 is NaN
            ASSERT_TRUE(std::isfinite(got)) << "row " << i << " column " << d;
          else
            ASSERT_TRUE(std::isnan(got)) << "row " << i << " sees the NaN value";
        }
    EXPECT_EQ(lse[4], ninf);
    EXPECT_TRUE(std::isfinite(lse[7]));
    for (std::int64_t i = 0; i < p.Tq; ++i) EXPECT_TRUE(std::isfinite(lse[20 + i])) << "head 1 row " << i;
  }
}

// The variant that ran, and why, reaches the caller's decision.
TEST_F(VulkanKernels, TheDecisionNamesTheKernelVariant) {
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu};
  cfg.gpu_allow_software = true;
  Registry r;
  register_builtin_operators(r);
  const Case c = make_case(Spec().shape(1, 128, 128).heads(4, 2).dim(64).causal(true), 2600);
  for (const char* op : {"flash_attn2", "vanilla"}) {
    const AttentionOutput out = r.get(op, cfg)(c.q, c.k, c.v, c.options);
    ASSERT_EQ(out.decision.backend, Backend::gpu) << out.decision.to_log_line();
    EXPECT_EQ(out.decision.run.kernel, std::string(op) == "vanilla" ? "vanilla_gemm" : "flash_subgroup");
    EXPECT_FALSE(out.decision.run.kernel_detail.empty());
    EXPECT_NE(out.decision.to_json().find("\"kernel\""), std::string::npos) << out.decision.to_json();
  }
}

}  // namespace
}  // namespace attnops::testing
