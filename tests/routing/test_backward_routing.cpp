// Routing of the backward pass: the operator the forward ran (after the same fallbacks) runs the
// backward, on the first candidate backend that implements it, with its own decision. Mock
// operators and host, as test_routing.cpp; no kernel runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/routing/routing_fixture.h"

namespace attnops::testing {
namespace {

using ::testing::_;
using ::testing::HasSubstr;
using ::testing::Return;
using ::testing::Throw;

// Expects exactly one call of `op`'s backward for backend `b` and none of its other backwards.
template <class Op>
void expect_only_backward(Op& op, std::optional<Backend> b) {
  EXPECT_CALL(op, backward_native(_)).Times(b == Backend::native ? 1 : 0);
  EXPECT_CALL(op, backward_cpu(_)).Times(b == Backend::cpu ? 1 : 0);
  EXPECT_CALL(op, backward_gpu(_)).Times(b == Backend::gpu ? 1 : 0);
  EXPECT_CALL(op, backward_tpu(_)).Times(b == Backend::tpu ? 1 : 0);
}

class BackwardRouting : public Routing {
 protected:
  // Residuals and upstream gradient of the shapes() call: out / dout [1, Tq, 4, 16], lse [1, 4, Tq].
  void residuals() {
    out = Tensor(DType::f32, {1, q.dim(1), 4, 16});
    dout = Tensor(DType::f32, {1, q.dim(1), 4, 16});
    lse = Tensor(DType::f32, {1, 4, q.dim(1)});
  }
  AttentionGradients backward(const Attention& attn, const AttentionOptions& o = {}) {
    return attn.backward(q, k, v, out, lse, dout, o);
  }
  Tensor out, dout, lse;
};

TEST_F(BackwardRouting, RunsTheRequestedOperatorOnCpuWithItsOwnDecision) {
  shapes(256, 256);
  residuals();
  auto attn = reg.get("flash");
  expect_only_backward(*fl, Backend::cpu);
  expect_only_backward(*van, std::nullopt);
  expect_only(*fl, std::nullopt);  // the backward never runs a forward
  const AttentionGradients g = backward(attn);
  EXPECT_EQ(g.decision.pass, Pass::backward);
  EXPECT_EQ(g.decision.requested, "flash_attn2");
  EXPECT_EQ(g.decision.op, "flash_attn2");
  EXPECT_EQ(g.decision.backend, Backend::cpu);
  ASSERT_EQ(g.decision.reasons.size(), 1u);
  EXPECT_EQ(g.decision.reasons[0].code, ReasonCode::backend_unavailable);
  EXPECT_THAT(g.decision.to_json(), HasSubstr("\"pass\": \"backward\""));
}

TEST_F(BackwardRouting, FallbacksPickTheOperatorTheForwardRan) {
  shapes(200, 200);  // blocksparse: seq_multiple and non_causal -> vanilla, forward and backward
  residuals();
  auto attn = reg.get("blocksparse");
  const DispatchDecision fwd = attn.explain(q, k, v, {.causal = false});
  expect_only_backward(*bs, std::nullopt);
  expect_only_backward(*van, Backend::cpu);
  const AttentionGradients g = backward(attn, {.causal = false});
  EXPECT_EQ(g.decision.op, fwd.op);
  EXPECT_EQ(g.decision.op, "vanilla");
  EXPECT_TRUE(g.decision.has(ReasonCode::non_causal));
  EXPECT_TRUE(g.decision.has(ReasonCode::seq_multiple));
}

// The built-in operators have a backward_gpu: where the forward would run on the GPU, so does
// the backward (vanilla after the forward's fallbacks too).
TEST_F(BackwardRouting, GpuRunsTheBackwardOfEveryBuiltInOperator) {
  gpu_present = true;
  shapes(128, 128);
  residuals();
  for (const char* name : {"blocksparse", "flash_attn2", "vanilla"})
    EXPECT_TRUE(reg.get(name).implements_backward(Backend::gpu)) << name;
  auto attn = reg.get("blocksparse");
  EXPECT_EQ(attn.explain(q, k, v).backend, Backend::gpu);
  expect_only_backward(*bs, Backend::gpu);
  const AttentionGradients g = backward(attn);
  EXPECT_EQ(g.decision.backend, Backend::gpu);
  EXPECT_TRUE(g.decision.reasons.empty()) << g.decision.to_log_line();

  shapes(1, 128);  // decode: blocksparse -> vanilla, forward and backward
  residuals();
  expect_only_backward(*van, Backend::gpu);
  EXPECT_EQ(backward(attn).decision.op, "vanilla");
}

// The gpu's gate (device limits) rejects a call: recorded, and the cpu runs it.
TEST_F(BackwardRouting, GpuGateRejectionIsRecorded) {
  gpu_present = true;
  shapes(128, 128);
  residuals();
  auto attn = reg.get("flash");
  ON_CALL(*fl, check_backward_inputs(Backend::gpu, _))
      .WillByDefault(Return(Reason{ReasonCode::unsupported_feature, "head_dim D=512 (mock)"}));
  expect_only_backward(*fl, Backend::cpu);
  const AttentionGradients g = backward(attn);
  EXPECT_EQ(g.decision.backend, Backend::cpu);
  ASSERT_EQ(g.decision.reasons.size(), 1u);
  EXPECT_EQ(g.decision.reasons[0].code, ReasonCode::unsupported_feature);
  EXPECT_THAT(g.decision.reasons[0].detail, HasSubstr("gpu: head_dim D=512 (mock)"));
}

TEST_F(BackwardRouting, GpuBackwardRunsAndARuntimeErrorFallsBackToCpu) {
  gpu_present = true;
  shapes(128, 128);
  residuals();
  auto attn = reg.get("flash");
  EXPECT_CALL(*fl, backward_gpu(_)).WillOnce(Return(AttentionGradients{}));
  EXPECT_EQ(backward(attn).decision.backend, Backend::gpu);
  EXPECT_CALL(*fl, backward_gpu(_)).WillOnce(Throw(Error(ErrorCode::gpu_error, "VK_ERROR_DEVICE_LOST")));
  EXPECT_CALL(*fl, backward_cpu(_)).WillOnce(Return(AttentionGradients{}));
  const AttentionGradients g = backward(attn);
  EXPECT_EQ(g.decision.backend, Backend::cpu);
  EXPECT_TRUE(g.decision.has(ReasonCode::gpu_error));
}

// Auto's cost rule applies to the backward with its own FLOPs (2.5x) and bytes, and the same
// rates: a call the rule keeps on the cpu has its backward there too, with the estimate.
TEST_F(BackwardRouting, CostRuleAppliesToTheBackward) {
  gpu_present = true;
  shapes(128, 128);
  residuals();
  Config cfg;
  cfg.gpu_cost_rates = CostRates{100, 1000, 10, 10, 50};  // 50 us per gpu call: small calls stay on the cpu
  auto attn = reg.get("flash_attn2", cfg);
  EXPECT_EQ(attn.explain(q, k, v).backend, Backend::cpu);
  expect_only_backward(*fl, Backend::cpu);
  const AttentionGradients g = backward(attn);
  EXPECT_EQ(g.decision.backend, Backend::cpu);
  ASSERT_TRUE(g.decision.has(ReasonCode::cpu_faster)) << g.decision.to_log_line();
  ASSERT_TRUE(g.decision.cost.has_value());
  const DispatchDecision fwd = attn.explain(q, k, v);
  ASSERT_TRUE(fwd.cost.has_value());
  // 2.5 times the forward's FLOPs at the same cpu rate.
  EXPECT_NEAR(g.decision.cost->cpu_us, 2.5 * fwd.cost->cpu_us, 1e-9 * fwd.cost->cpu_us);
  EXPECT_GT(g.decision.cost->upload_us, fwd.cost->upload_us);  // out, dout and lse go up too

  // A gpu named by the config is tried as named; a large call stays on the gpu.
  Config named = cfg;
  named.backends = std::vector<Backend>{Backend::gpu, Backend::cpu};
  auto attn_named = reg.get("flash_attn2", named);  // (a new mock operator)
  expect_only_backward(*fl, Backend::gpu);
  const AttentionGradients gn = backward(attn_named);
  EXPECT_EQ(gn.decision.backend, Backend::gpu);
  EXPECT_FALSE(gn.decision.cost.has_value());
  cfg.gpu_cost_rates = CostRates{100, 10000, 10, 10, 50};
  shapes(4096, 4096);
  residuals();
  auto attn_large = reg.get("flash_attn2", cfg);
  expect_only_backward(*fl, Backend::gpu);
  const AttentionGradients gl = backward(attn_large);
  EXPECT_EQ(gl.decision.backend, Backend::gpu);
  ASSERT_TRUE(gl.decision.cost.has_value());
  EXPECT_LT(gl.decision.cost->gpu_us, gl.decision.cost->cpu_us);
}

TEST_F(BackwardRouting, PreferenceDisabledAndForcedNativeApply) {
  shapes(128, 128);
  residuals();
  auto native_first = reg.get("blocksparse", parse_config("backend: native\n"));
  expect_only_backward(*bs, Backend::native);
  EXPECT_EQ(backward(native_first).decision.backend, Backend::native);

  auto no_cpu = reg.get("blocksparse", parse_config("disabled_backends: [cpu]\n"));
  expect_only_backward(*bs, Backend::native);
  EXPECT_TRUE(backward(no_cpu).decision.has(ReasonCode::disabled_by_config));

  setenv("ATTNOPS_FORCE_NATIVE", "1", 1);
  attnops::reload_environment();
  auto attn = reg.get("blocksparse");
  expect_only_backward(*bs, Backend::native);
  EXPECT_TRUE(backward(attn).decision.has(ReasonCode::forced_native));
}

// An operator without backward_* overrides is forward-only: every candidate is rejected.
class ForwardOnly : public VanillaAttn {
 public:
  using VanillaAttn::VanillaAttn;
  std::string name() const override { return "forward_only"; }
  bool implements_backward(Backend) const override { return false; }
};

TEST_F(BackwardRouting, ForwardOnlyOperatorIsATypedError) {
  reg.add({"forward_only", {}, OperationMetadata{}, [](const OperationMetadata& md) {
             return std::make_shared<ForwardOnly>(md);
           }});
  shapes(8, 8);
  residuals();
  try {
    backward(reg.get("forward_only"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::backend_unavailable);
    EXPECT_THAT(e.what(), HasSubstr("the backward of 'forward_only'"));
    EXPECT_THAT(e.what(), HasSubstr("cpu: forward_only has no backward_cpu"));
  }
}

TEST_F(BackwardRouting, DispatchLogLineNamesTheBackward) {
  setenv("ATTNOPS_LOG", "dispatch", 1);
  attnops::reload_environment();
  shapes(128, 128);
  residuals();
  auto attn = reg.get("blocksparse");
  ::testing::internal::CaptureStderr();
  backward(attn);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "attnops,dispatch_backward,blocksparse,cpu,backend_unavailable:gpu: no Vulkan device (mock)\n");
}

TEST_F(BackwardRouting, ForwardOutputWithoutLseIsRejected) {
  shapes(128, 128);
  residuals();
  AttentionOutput fwd;
  fwd.out = out;
  // `bs` points into this Attention's operator: keep it alive for the whole test.
  const Attention attn = reg.get("blocksparse");
  try {
    attn.backward(q, k, v, fwd, dout);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_THAT(e.what(), HasSubstr("return_lse"));
  }
  fwd.lse = lse;
  expect_only_backward(*bs, Backend::cpu);
  attn.backward(q, k, v, fwd, dout);
}

}  // namespace
}  // namespace attnops::testing
