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
  const DispatchDecision fwd = attn.plan(q, k, v, {.causal = false});
  expect_only_backward(*bs, std::nullopt);
  expect_only_backward(*van, Backend::cpu);
  const AttentionGradients g = backward(attn, {.causal = false});
  EXPECT_EQ(g.decision.op, fwd.op);
  EXPECT_EQ(g.decision.op, "vanilla");
  EXPECT_TRUE(g.decision.has(ReasonCode::non_causal));
  EXPECT_TRUE(g.decision.has(ReasonCode::seq_multiple));
}

TEST_F(BackwardRouting, GpuWithoutBackwardIsRecordedAsNotImplemented) {
  gpu_present = true;
  shapes(128, 128);
  residuals();
  auto attn = reg.get("blocksparse");
  EXPECT_EQ(attn.plan(q, k, v).backend, Backend::gpu);  // the forward would run on the GPU
  expect_only_backward(*bs, Backend::cpu);
  const AttentionGradients g = backward(attn);
  EXPECT_EQ(g.decision.backend, Backend::cpu);
  ASSERT_EQ(g.decision.reasons.size(), 1u);
  EXPECT_EQ(g.decision.reasons[0].code, ReasonCode::not_implemented);
  EXPECT_THAT(g.decision.reasons[0].detail, HasSubstr("gpu: blocksparse has no backward_gpu"));
}

// An operator whose backward_gpu exists: the GPU runs it; a runtime failure there moves on.
class GpuBackward : public MockOp<FlashAttn2> {
 public:
  using MockOp<FlashAttn2>::MockOp;
  bool implements_backward(Backend b) const override { return b != Backend::tpu; }
};

TEST_F(BackwardRouting, GpuBackwardRunsAndARuntimeErrorFallsBackToCpu) {
  gpu_present = true;
  GpuBackward* op = nullptr;
  reg.add({"flash_attn2", {"flash"}, FlashAttn2::default_metadata(), [&](const OperationMetadata& md) {
             auto p = std::make_shared<::testing::NiceMock<GpuBackward>>(md);
             op = p.get();
             return p;
           }});
  shapes(128, 128);
  residuals();
  auto attn = reg.get("flash");
  EXPECT_CALL(*op, backward_gpu(_)).WillOnce(Return(AttentionGradients{}));
  EXPECT_EQ(backward(attn).decision.backend, Backend::gpu);
  EXPECT_CALL(*op, backward_gpu(_)).WillOnce(Throw(Error(ErrorCode::gpu_error, "VK_ERROR_DEVICE_LOST")));
  EXPECT_CALL(*op, backward_cpu(_)).WillOnce(Return(AttentionGradients{}));
  const AttentionGradients g = backward(attn);
  EXPECT_EQ(g.decision.backend, Backend::cpu);
  EXPECT_TRUE(g.decision.has(ReasonCode::gpu_error));
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
  fwd.attention_outputs = out;
  try {
    reg.get("blocksparse").backward(q, k, v, fwd, dout);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_THAT(e.what(), HasSubstr("return_lse"));
  }
  fwd.lse = lse;
  expect_only_backward(*bs, Backend::cpu);
  reg.get("blocksparse").backward(q, k, v, fwd, dout);
}

}  // namespace
}  // namespace attnops::testing
