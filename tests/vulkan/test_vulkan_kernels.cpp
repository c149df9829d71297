// The tiled kernels on lavapipe against the fp64 oracle, beyond the shared parity grid of
// test_vulkan_parity.cpp: the GPU shape of flash_subgroup (head dim split over lanes with
// subgroup shuffles, several subgroups and workgroup barriers, 8-key steps) forced on lavapipe,
// split-KV decode (Tk up to 32768 with ATTNOPS_TEST_BIG=1), decode on device-resident KV caches,
// split-KV forced on prefill (with sinks), the baseline row-wise kernel, the non-finite-value
// policy, and the kernel variant in the decision.
//
// Pipelines are compiled by LLVM on lavapipe (seconds each), so the forced shapes are few and
// reuse one another's head dims.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "attnops/ext/problem.h"
#include "attnops/gpu.h"
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
// split-KV when no weights are asked for; the q heads of a kv head share a workgroup. The long
// caches (Tk 32768, a 20000-key window) run with ATTNOPS_TEST_BIG=1 only: on lavapipe each takes
// seconds, mostly the fp64 oracle; the default shapes cover the same paths.
bool big_tests() {
  const char* e = std::getenv("ATTNOPS_TEST_BIG");
  return e != nullptr && std::string(e) == "1";
}

TEST_F(VulkanKernels, DecodeSplitKv) {
  std::uint64_t seed = 2200;
  struct Shape {
    std::int64_t Tk, Hq, Hkv;
    DType t;
  };
  std::vector<Shape> shapes = {Shape{3001, 8, 1, DType::f32}, Shape{4097, 16, 1, DType::f16},
                               Shape{2500, 4, 2, DType::bf16}};
  if (big_tests()) shapes.push_back(Shape{32768, 8, 1, DType::f32});
  for (const Shape& s : shapes) {
    Case c = make_case(Spec().shape(1, 1, s.Tk).heads(s.Hq, s.Hkv).dim(64).dtype(s.t).causal(true).sinks(),
                       ++seed);
    const AttentionProblem p = problem_for(c);
    const AttentionBuffers b = run_forced(Kernel::vanilla, p, {});
    SCOPED_TRACE(c.describe() + " -> " + b.run.kernel + ": " + b.run.kernel_detail);
    EXPECT_EQ(b.run.kernel, "flash_subgroup+split_kv");
    EXPECT_NE(b.run.kernel_detail.find("vanilla_gemm: decode-shaped"), std::string::npos);
    EXPECT_TRUE(within_tolerance(p, b));
  }
  // A sliding window over a long cache (a chunk whose keys are all outside the window), and a
  // few query rows (speculative decoding).
  const std::int64_t window_tk = big_tests() ? 20000 : 3000;
  expect_parity(
      Kernel::vanilla,
      make_case(Spec().shape(2, 1, window_tk).heads(4, 2).dim(64).causal(true).window(700, 0), ++seed), {},
      "flash_subgroup+split_kv");
  expect_parity(
      Kernel::flash,
      make_case(Spec().shape(1, 4, big_tests() ? 9000 : 2000).heads(8, 2).dim(64).causal(true), ++seed), {},
      "flash_subgroup+split_kv");
  // With the weights asked for, vanilla keeps its GEMM path.
  Case w = make_case(Spec().shape(1, 1, 1000).heads(2, 1).dim(64).causal(true), ++seed);
  w.options.return_weights = true;
  const AttentionProblem p = problem_for(w);
  const AttentionBuffers b = run_forced(Kernel::vanilla, p, {});
  EXPECT_EQ(b.run.kernel, "vanilla_gemm");
  EXPECT_TRUE(within_tolerance(p, b));
}

// Decode against a KV cache on the device: split-KV reads the cache views in place (offsets and
// strides in the push constants), appends do not re-upload it, and a device q keeps the output
// on the device (the merge, then convert.comp to f16, in the same submission).
TEST_F(VulkanKernels, DeviceResidentKvCacheDecodeTakesSplitKv) {
  const std::int64_t B = 1, Hq = 8, Hkv = 2, D = 64, Tmax = 700, T0 = 600;
  const DType dt = DType::f16;
  const Tensor k_all = random_tensor(dt, {B, Tmax, Hkv, D}, 2700);
  const Tensor v_all = random_tensor(dt, {B, Tmax, Hkv, D}, 2701);
  DeviceTensor ck = DeviceTensor::zeros(dt, {B, Tmax, Hkv, D}, software_ok());
  DeviceTensor cv = DeviceTensor::zeros(dt, {B, Tmax, Hkv, D}, software_ok());
  ck.slice(1, 0, T0).copy_from(k_all.view().slice(1, 0, T0));
  cv.slice(1, 0, T0).copy_from(v_all.view().slice(1, 0, T0));
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu};
  cfg.gpu_allow_software = true;
  Registry r;
  register_builtin_operators(r);
  const std::uint64_t kv_bytes = static_cast<std::uint64_t>(B * Tmax * Hkv * D) * 2u;
  for (const char* op : {"flash_attn2", "vanilla"}) {
    const Attention attn = r.get(op, cfg);
    for (std::int64_t T = T0; T < T0 + 2; ++T) {
      SCOPED_TRACE(std::string(op) + " T=" + std::to_string(T + 1));
      ck.slice(1, T, T + 1).copy_from(k_all.view().slice(1, T, T + 1));  // append
      cv.slice(1, T, T + 1).copy_from(v_all.view().slice(1, T, T + 1));
      const Tensor q = random_tensor(dt, {B, 1, Hq, D}, 2800 + static_cast<std::uint64_t>(T));
      AttentionOptions o;
      o.return_lse = true;
      const DeviceTensor kview = ck.slice(1, 0, T + 1), vview = cv.slice(1, 0, T + 1);
      const AttentionOutput out = attn(q, kview, vview, o);
      ASSERT_EQ(out.decision.backend, Backend::gpu) << out.decision.to_log_line();
      EXPECT_EQ(out.decision.run.kernel, "flash_subgroup+split_kv") << out.decision.run.kernel_detail;
      EXPECT_EQ(out.decision.run.inputs, "mixed");
      EXPECT_LT(out.decision.run.bytes_to_device, kv_bytes / 4) << out.decision.to_json();
      const Tensor kh = Tensor::copy_of(k_all.view().slice(1, 0, T + 1)),
                   vh = Tensor::copy_of(v_all.view().slice(1, 0, T + 1));
      const AttentionProblem p = make_problem(q, kh, vh, o, attn.metadata());
      AttentionBuffers got{out.out, out.lse, std::nullopt, {}, {}};
      EXPECT_TRUE(within_tolerance(p, got));
      // q on the device too: the output stays there, rounded as the host path rounds it.
      const AttentionOutput dev = attn(to_device(q, software_ok()), kview, vview, o);
      EXPECT_EQ(dev.decision.run.output, "device");
      EXPECT_EQ(dev.decision.run.kernel, "flash_subgroup+split_kv");
      const Tensor back = dev.device_out.to_host();
      ASSERT_EQ(back.nbytes(), out.out.nbytes());
      EXPECT_EQ(std::memcmp(back.data(), out.out.data(), back.nbytes()), 0);
    }
  }
}

// flash_decode (taken on GPUs for decode shapes, forced here: lavapipe keeps flash_subgroup's
// lane-per-row regime) on decode shapes and beyond: GQA packing, several q blocks, head dims not a
// multiple of 8 (element loads) or of 4, 16-byte loads of 16-bit rows, every mask kind, bias, soft
// cap, sinks, segments, split-KV forced and derived, fewer lanes per key than the head needs.
KernelOverride decode_forced(const std::string& text = "") {
  return tiles(text, Variant::flash_decode);
}

TEST_F(VulkanKernels, FlashDecodeMatchesTheOracle) {
  std::uint64_t seed = 2350;
  struct Row {
    Spec spec;
    Kernel kernel;
    std::string tiles, expect;
  };
  // Lavapipe compiles each pipeline with LLVM, whose time grows steeply with the unrolled rows x
  // keys-per-team body: on a software device the derived tiles are 8-key tiles (2 keys per
  // team) and at most 2 rows; rows are forced up to 8 here (the 8 q heads of a kv head).
  const Row rows[] = {
      {Spec().shape(1, 1, 300).heads(8, 1).dim(64).causal(true).sinks(), Kernel::vanilla, "rows=8",
       "flash_decode+split_kv"},
      {Spec().shape(1, 1, 200).heads(4, 2).dim(64).causal(true), Kernel::flash, "", "flash_decode+split_kv"},
      {Spec().shape(2, 1, 1000).heads(4, 4).dim(128).dtype(DType::f16).causal(true), Kernel::flash, "bc=8",
       "flash_decode+split_kv"},
      {Spec()
           .shape(1, 3, 257)
           .heads(8, 2)
           .dim(40, 24)
           .dtype(DType::bf16)
           .causal(true)
           .window(100, 0)
           .bias()
           .soft_cap(5.0),
       Kernel::flash, "bc=8,rows=4,split=1", "flash_decode"},
      {Spec().shape(1, 5, 77).heads(2, 1).dim(37, 19).causal(false).segments(), Kernel::blocksparse,
       "bc=8,rows=2,split=1", "flash_decode"},
      {Spec().shape(1, 2, 500).heads(4, 1).dim(64).dtype(DType::f16).causal(true).chunk(96).sinks(),
       Kernel::flash, "bc=8,rows=2,split=5", "flash_decode+split_kv"},
      {Spec().shape(1, 20, 90).heads(2, 1).dim(64).causal(true), Kernel::flash, "ds=2,bc=8,rows=2",
       "flash_decode"},
  };
  for (const Row& r : rows) {
    const Case c = make_case(r.spec, ++seed);
    const AttentionProblem p = problem_for(c);
    const AttentionBuffers b = run_forced(r.kernel, p, decode_forced(r.tiles));
    SCOPED_TRACE(c.describe() + " -> " + b.run.kernel + ": " + b.run.kernel_detail);
    EXPECT_EQ(b.run.kernel, r.expect);
    EXPECT_TRUE(within_tolerance(p, b));
  }
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
          {"decode", Kernel::flash, decode_forced("bc=8,rows=2")},
          {"decode split", Kernel::flash, decode_forced("bc=8,rows=2,split=2")},
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
    EXPECT_EQ(out.decision.run.kernel, "flash_subgroup");  // vanilla without weights: the same function
    EXPECT_FALSE(out.decision.run.kernel_detail.empty());
    EXPECT_NE(out.decision.to_json().find("\"kernel\""), std::string::npos) << out.decision.to_json();
  }
}

}  // namespace
}  // namespace attnops::testing
