// The Vulkan backward (vulkan::run_backward) against the fp64 backward oracle, on lavapipe under
// the validation layer with synchronization validation (the fixture fails a test on any
// message). The grid is the CPU backward's (tests/tiled/tiled_cases: every mask kind and
// combination, segments, bias full and broadcast, soft cap, sinks, GQA 1..16, head dims up to 256
// that are not powers of two, Dv != D, Tq != Tk, fully masked rows, f32 / f16 / bf16), less the
// cases that differ only in the CPU's block sizes (the GPU always uses its 32 x 32 tiles), and
// a seeded random sample. Residuals (out, lse) are the oracle's; tolerances in grad_testing.h.
// Also: bias broadcast over batches only and over heads only (the dk/dv pass's loop_b /
// loop_h), bitwise determinism, fully masked rows, one submission per call, the operators'
// backward_gpu under the dispatcher, and the fallback to the cpu when the gpu fails.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"
#include "tests/backward/grad_testing.h"
#include "tests/tiled/tiled_cases.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

GradientBuffers run_gpu(const BackwardProblem& bp, bool profile = false) {
  BackwardProblem call = bp;  // tensors are shared, not copied
  call.fwd.profile = profile;
  GradientBuffers g = allocate_gradient_buffers(bp);
  vulkan::run_backward(call, software_ok(), g);
  return g;
}

// The gpu backward of the case against the oracle; false when the device rejects the case
// (then the reason must be the head dim, the one limit the grid reaches).
bool expect_gradient_parity(const tiled_test::KernelCase& kc) {
  const Case c = make_case(kc.spec, kc.seed);
  SCOPED_TRACE(kc.name + ": " + c.describe());
  const BackwardCase bc = make_backward_case(c, kc.bq, kc.bk, kc.seed);
  if (const auto why = vulkan::check_backward_inputs(bc.bp, software_ok())) {
    EXPECT_GT(std::max(c.D, c.Dv), 256) << why->detail;
    EXPECT_NE(why->detail.find("head_dim"), std::string::npos) << why->detail;
    return false;
  }
  const GradientBuffers got = run_gpu(bc.bp);
  EXPECT_TRUE(gradients_match(bc.bp, native::reference_backward_f64(bc.bp), got));
  return true;
}

using VulkanBackward = VulkanTest;

TEST_F(VulkanBackward, ExplicitGrid) {
  int ran = 0;
  for (const tiled_test::KernelCase& kc : tiled_test::explicit_cases()) {
    if (kc.name.rfind("blocks_", 0) == 0 && kc.name != "blocks_17x23") continue;  // CPU block sizes only
    ran += expect_gradient_parity(kc) ? 1 : 0;
  }
  EXPECT_GE(ran, 35);
}

// A seeded sample of random combinations (ATTNOPS_VK_BWD_CASES: how many, default 40).
TEST_F(VulkanBackward, RandomCombinations) {
  const char* env = std::getenv("ATTNOPS_VK_BWD_CASES");
  const int count = env ? std::atoi(env) : 40;
  for (const tiled_test::KernelCase& kc : tiled_test::random_cases(count, 20261123))
    expect_gradient_parity(kc);
}

// A bias broadcast along one axis only: over batches ([1, Hq, Tq, Tk]: the dk/dv invocation walks
// every batch) or over heads ([B, 1, Tq, Tk] with several kv heads: it walks every kv head).
TEST_F(VulkanBackward, BiasBroadcastAlongOneAxis) {
  for (const bool over_batches : {true, false}) {
    Case c =
        make_case(Spec().shape(3, 45, 70).heads(4, 2).dim(24).causal(false).window(20, 9).bias().sinks(), 5);
    c.bias = random_tensor(DType::f32, {over_batches ? 1 : 3, over_batches ? 4 : 1, 45, 70}, 9, -2.f, 2.f);
    c.options.bias = c.bias->view();
    SCOPED_TRACE(c.describe());
    const BackwardCase bc = make_backward_case(c, 32, 32, 5);
    ASSERT_EQ(bc.bp.bias_B, over_batches ? 1 : 3);
    ASSERT_EQ(bc.bp.bias_H, over_batches ? 4 : 1);
    const GradientBuffers got = run_gpu(bc.bp);
    EXPECT_TRUE(gradients_match(bc.bp, native::reference_backward_f64(bc.bp), got));
  }
}

// Head dims whose rows are not whole 16-byte vectors take the one-row-at-a-time path; with
// 16-bit storage a row then starts in the middle of a 32-bit word.
TEST_F(VulkanBackward, RowsThatAreNotWholeVectors) {
  std::uint64_t seed = 40;
  for (DType t : {DType::f16, DType::bf16, DType::f32})
    for (auto [D, Dv] : {std::pair<std::int64_t, std::int64_t>{5, 5}, {12, 7}, {64, 6}}) {
      const Case c = make_case(
          Spec().shape(2, 37, 41).heads(4, 2).dim(D, Dv).dtype(t).causal(true).window(9, 0).bias().sinks(),
          ++seed);
      SCOPED_TRACE(c.describe());
      const BackwardCase bc = make_backward_case(c, 32, 32, seed);
      EXPECT_TRUE(gradients_match(bc.bp, native::reference_backward_f64(bc.bp), run_gpu(bc.bp)));
    }
}

// Outer strides that are not the contiguous ones, for q, k, v and dout (packed on upload).
TEST_F(VulkanBackward, SlicedViewsMatchOracle) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::int64_t B = 2, Tq = 45, Tk = 77, Hq = 4, Hkv = 2, D = 40;
    const Tensor qw = random_tensor(dt, {B, Tq, 2 * Hq, D}, 1);
    const Tensor kw = random_tensor(dt, {B, Tk + 9, Hkv + 1, D}, 2);
    const Tensor vw = random_tensor(dt, {B, Tk + 9, Hkv + 1, D}, 3);
    const Tensor gw = random_tensor(dt, {B, Tq, Hq + 3, D}, 4);
    const TensorView q = qw.view().slice(2, Hq, 2 * Hq);
    const TensorView k = kw.view().slice(1, 9, Tk + 9).slice(2, 1, Hkv + 1);
    const TensorView v = vw.view().slice(1, 0, Tk).slice(2, 0, Hkv);
    const TensorView dout = gw.view().slice(2, 1, Hq + 1);
    AttentionOptions o;
    o.return_lse = true;
    const AttentionProblem fp = make_problem(q, k, v, o, OperationMetadata{});
    AttentionBuffers fwd = allocate_buffers(fp);
    native::reference_attention(fp, fwd);
    const BackwardProblem bp =
        make_backward_problem(q, k, v, fwd.out, *fwd.lse, dout, o, OperationMetadata{});
    ASSERT_NE(bp.dout.stride(1), Hq * D) << "the test needs a strided dout";
    EXPECT_TRUE(gradients_match(bp, native::reference_backward_f64(bp), run_gpu(bp))) << dtype_name(dt);
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// No atomics: repeated runs give bitwise identical gradients (GQA sums, broadcast dbias, dsinks).
TEST_F(VulkanBackward, BitwiseDeterministic) {
  for (DType t : {DType::f32, DType::bf16}) {
    const Case c = make_case(Spec()
                                 .shape(2, 77, 93)
                                 .heads(8, 2)
                                 .dim(40)
                                 .dtype(t)
                                 .causal(true)
                                 .segments()
                                 .bias(true)
                                 .sinks()
                                 .soft_cap(10.0),
                             31);
    const BackwardCase bc = make_backward_case(c, 32, 32, 31);
    const GradientBuffers a = run_gpu(bc.bp), b = run_gpu(bc.bp), d = run_gpu(bc.bp);
    for (const GradientBuffers* o : {&b, &d}) {
      EXPECT_TRUE(same_bytes(a.dq, o->dq)) << "dq";
      EXPECT_TRUE(same_bytes(a.dk, o->dk)) << "dk";
      EXPECT_TRUE(same_bytes(a.dv, o->dv)) << "dv";
      EXPECT_TRUE(same_bytes(*a.dsinks, *o->dsinks)) << "dsinks";
      EXPECT_TRUE(same_bytes(*a.dbias, *o->dbias)) << "dbias";
    }
    EXPECT_TRUE(gradients_match(bc.bp, native::reference_backward_f64(bc.bp), a));
  }
}

// Fully masked rows: exactly zero dq, nothing elsewhere, no NaN; every row masked: all zero.
TEST_F(VulkanBackward, FullyMaskedRowsGiveZeroGradients) {
  const Case c = make_case(Spec().shape(1, 90, 30).heads(2, 1).dim(16).causal(true).sinks().bias(), 3);
  const BackwardCase bc = make_backward_case(c, 32, 32, 3);
  const GradientBuffers got = run_gpu(bc.bp);
  for (std::int64_t i = 0; i < 60; ++i)  // bottom-right causal, Tq = 90 > Tk = 30: rows 0..59 see nothing
    for (std::int64_t e = 0; e < 2 * 16; ++e) ASSERT_EQ(got.dq.at(static_cast<std::size_t>(i * 32 + e)), 0.f);
  for (const Tensor* t : {&got.dq, &got.dk, &got.dv, &*got.dsinks, &*got.dbias})
    for (std::int64_t i = 0; i < t->numel(); ++i)
      ASSERT_TRUE(std::isfinite(t->at(static_cast<std::size_t>(i))));
  EXPECT_TRUE(gradients_match(bc.bp, native::reference_backward_f64(bc.bp), got));

  // Segment ids that never match: no row sees a key.
  Case none =
      make_case(Spec().shape(2, 40, 35).heads(2, 1).dim(8).causal(false).segments().sinks().bias(), 4);
  std::fill_n(none.seg_q->data_as<std::int32_t>(), none.seg_q->numel(), 1);
  std::fill_n(none.seg_kv->data_as<std::int32_t>(), none.seg_kv->numel(), 2);
  const BackwardCase bn = make_backward_case(none, 32, 32, 4);
  const GradientBuffers z = run_gpu(bn.bp);
  for (const Tensor* t : {&z.dq, &z.dk, &z.dv, &*z.dsinks, &*z.dbias})
    for (std::int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->at(static_cast<std::size_t>(i)), 0.f);
}

// One submission per call; in steady state no Vulkan object is created. With profiling, the
// timings name the passes.
TEST_F(VulkanBackward, OneSubmissionPerCallAndPassTimings) {
  const Case c = make_case(Spec().shape(1, 64, 64).heads(2, 1).dim(32).causal(true).sinks(), 8);
  const BackwardCase bc = make_backward_case(c, 32, 32, 8);
  run_gpu(bc.bp);  // pipelines, pool blocks
  const vulkan::debug::ObjectCounts before = vulkan::debug::object_counts();
  const GradientBuffers g = run_gpu(bc.bp, /*profile=*/true);
  vulkan::debug::ObjectCounts after = vulkan::debug::object_counts();
  EXPECT_EQ(after.submissions, before.submissions + 1);
  after.submissions = before.submissions;
  after.query_pools = before.query_pools;  // the first profiled call may create the query pool
  EXPECT_EQ(after, before) << "a call in steady state creates no Vulkan object";
  EXPECT_EQ(g.run.kernel, "backward");
  ASSERT_TRUE(g.run.timings.has_value());
  if (g.run.timings->device_timestamps) {
    std::vector<std::string> names;
    for (const auto& pass : g.run.timings->passes) names.push_back(pass.name);
    EXPECT_EQ(names, (std::vector<std::string>{"backward_dq", "backward_dkdv", "backward_dsinks"}));
  }
}

// Buffers over the device's maxStorageBufferRange (capped here to reach the limit with small
// problems) are refused by the gate, naming the buffer, and run_backward throws the same reason.
TEST_F(VulkanBackward, BufferLimitsAreCheckedBeforeRunning) {
  const Case c = make_case(Spec().shape(1, 200, 300).heads(4, 1).dim(16).causal(false).bias(), 21);
  const BackwardCase bc = make_backward_case(c, 32, 32, 21);
  vulkan::debug::set_max_buffer_bytes(640 * 1024);  // the bias / dbias [1, 4, 200, 300] f32 take 937.5 KiB
  const auto why = vulkan::check_backward_inputs(bc.bp, software_ok());
  GradientBuffers g = allocate_gradient_buffers(bc.bp);
  bool threw = false;
  try {
    vulkan::run_backward(bc.bp, software_ok(), g);
  } catch (const Error& e) {
    threw = e.code() == ErrorCode::unsupported_feature;
  }
  vulkan::debug::set_max_buffer_bytes(0);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->code, ReasonCode::unsupported_feature);
  EXPECT_NE(why->detail.find("maxStorageBufferRange"), std::string::npos) << why->detail;
  EXPECT_TRUE(threw);
  EXPECT_FALSE(vulkan::check_backward_inputs(bc.bp, software_ok()).has_value());
}

Config gpu_first() {
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  cfg.gpu_allow_software = true;
  return cfg;
}

// The operators' backward_gpu under the dispatcher: each operator's backward runs on the gpu
// (with the forward's fallbacks), matches the oracle; an injected device loss moves it to the
// cpu with the reason recorded.
TEST_F(VulkanBackward, OperatorsUnderTheDispatcherAndFallbackToCpu) {
  const Case c = make_case(Spec().shape(1, 128, 160).heads(4, 2).dim(64).causal(true).bias(), 12);
  Registry r;
  register_builtin_operators(r);
  for (const char* name : {"vanilla", "blocksparse", "flash_attn2"}) {
    const Attention attn = r.get(name, gpu_first());
    const AttentionOutput fwd = attn(c.q, c.k, c.v, c.options);
    const Tensor dout = random_tensor(DType::f32, {1, 128, 4, 64}, 13);
    const AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, dout, c.options);
    EXPECT_EQ(g.decision.backend, Backend::gpu) << g.decision.to_log_line();
    EXPECT_EQ(g.decision.op, fwd.decision.op) << g.decision.to_log_line();
    EXPECT_EQ(g.decision.run.kernel, "backward");
    const BackwardProblem bp =
        make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, c.options, attn.metadata());
    EXPECT_TRUE(gradients_match(bp, native::reference_backward_f64(bp), g)) << name;

    vulkan::debug::set_inject_fault(true);
    AttentionGradients fb;
    EXPECT_NO_THROW(fb = attn.backward(c.q, c.k, c.v, fwd, dout, c.options));
    vulkan::debug::set_inject_fault(false);
    EXPECT_EQ(fb.decision.backend, Backend::cpu) << fb.decision.to_log_line();
    EXPECT_TRUE(fb.decision.has(ReasonCode::gpu_error)) << fb.decision.to_log_line();
    EXPECT_NE(fb.decision.to_log_line().find("VK_ERROR_DEVICE_LOST"), std::string::npos)
        << fb.decision.to_log_line();
    EXPECT_TRUE(gradients_match(bp, native::reference_backward_f64(bp), fb)) << name << " on the cpu";
  }
}

// Whether the device the tests run on is a software one (lavapipe): every qualifying device is.
bool software_device() {
  bool any = false, all = true;
  for (const GpuDeviceInfo& d : vulkan::list_devices(software_ok()))
    if (d.qualifies) any = true, all = all && d.software;
  return any && all;
}

// llvmpipe stops every loop of an invocation after 65535 iterations in all, silently: a dq row
// over ~800 keys (D 32, Dv 13: no four-at-a-time path) or a dk/dv key over ~800 rows (~11000 on
// the four-at-a-time path) kept stale gradient elements. On a software device such problems go to the cpu
// (the gate names the limit); one just under the bound still runs on the gpu. Every result matches the
// oracle.
TEST_F(VulkanBackward, LongRowsOverTheSoftwareLoopLimitGoToTheCpu) {
  const bool software = software_device();
  Registry r;
  register_builtin_operators(r);
  const Attention attn = r.get("flash_attn2", gpu_first());
  struct Shape {
    std::int64_t Tq, Tk, Dv;
    DType dtype;
    bool causal, over;
  };
  // Row by row (Dv 13), then four at a time (bf16, D = Dv = 32: a key is cut off past ~11000 rows).
  for (const Shape s :
       {Shape{1, 900, 13, DType::f16, true, true}, Shape{900, 3, 13, DType::f16, false, true},
        Shape{1, 640, 13, DType::f16, true, false}, Shape{14000, 1, 32, DType::bf16, false, true},
        Shape{6000, 1, 32, DType::bf16, false, false}}) {
    const Case c =
        make_case(Spec().shape(1, s.Tq, s.Tk).heads(1, 1).dim(32, s.Dv).dtype(s.dtype).causal(s.causal), 16);
    SCOPED_TRACE(c.describe());
    const AttentionOutput fwd = attn(c.q, c.k, c.v, c.options);
    const Tensor dout = random_tensor(s.dtype, {1, s.Tq, 1, s.Dv}, 17);
    const BackwardProblem bp =
        make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, c.options, attn.metadata());
    const AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, dout, c.options);
    EXPECT_TRUE(gradients_match(bp, native::reference_backward_f64(bp), g));
    const bool refused = software && s.over;
    EXPECT_EQ(g.decision.backend, refused ? Backend::cpu : Backend::gpu) << g.decision.to_log_line();
    const auto why = vulkan::check_backward_inputs(bp, software_ok());
    EXPECT_EQ(why.has_value(), refused) << (why ? why->detail : "runs on the gpu");
    if (why) {
      EXPECT_NE(why->detail.find("loop iterations"), std::string::npos) << why->detail;
    }
  }
}

// A head dim the shaders do not take is rejected by the gate (unsupported_feature) and the
// backward runs on the cpu.
TEST_F(VulkanBackward, HeadDimOverTheLimitGoesToTheCpu) {
  const Case c = make_case(Spec().shape(1, 16, 16).heads(1, 1).dim(320).causal(true), 14);
  Registry r;
  register_builtin_operators(r);
  const Attention attn = r.get("flash_attn2", gpu_first());
  const AttentionOutput fwd = attn(c.q, c.k, c.v, c.options);
  const Tensor dout = random_tensor(DType::f32, {1, 16, 1, 320}, 15);
  const AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, dout, c.options);
  EXPECT_EQ(g.decision.backend, Backend::cpu) << g.decision.to_log_line();
  EXPECT_TRUE(g.decision.has(ReasonCode::unsupported_feature)) << g.decision.to_log_line();
}

}  // namespace
}  // namespace attnops::testing
