// The backward through the public API: Attention::backward on every operator and backend that
// has one, against the fp64 oracle (forward residuals from the real forward), the decision it
// returns, typed errors for bad residuals, empty problems, dtypes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "backends/native/reference_backward.h"
#include "tests/backward/grad_testing.h"

namespace attnops {
namespace {

using testing::Case;
using testing::CaseSpec;
using ::testing::HasSubstr;

Attention attention_on(const std::string& op, Backend backend) {
  OperationMetadata md = registry().entry(op).defaults;
  md.backends = {backend};
  return registry().get(op, md);
}

struct ApiCase {
  std::string op;
  Backend backend;
  bool causal;
  std::string expect_op;  // after the operator's default fallbacks
};

class BackwardApi : public ::testing::TestWithParam<ApiCase> {};

TEST_P(BackwardApi, MatchesOracleAndReportsTheOperatorTheForwardRan) {
  const ApiCase& ac = GetParam();
  CaseSpec s;
  s.B = 2, s.Tq = 256, s.Tk = 256, s.Hq = 4, s.Hkv = 2, s.D = 48;
  s.causal = ac.causal;
  s.sinks = true;
  s.bias = true;
  s.bias_broadcast = true;
  s.soft_cap = 10.0;
  Case c = testing::make_case(s, 5);
  const Tensor dout = testing::random_tensor(DType::f32, {2, 256, 4, 48}, 6);
  const Attention attn = attention_on(ac.op, ac.backend);
  AttentionOptions o = c.options;
  o.return_lse = true;
  const AttentionOutput fwd = attn(c.q, c.k, c.v, o);
  const AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, dout, o);
  EXPECT_EQ(g.decision.pass, Pass::backward);
  EXPECT_EQ(g.decision.op, fwd.decision.op);
  EXPECT_EQ(g.decision.op, ac.expect_op);
  EXPECT_EQ(g.decision.backend, ac.backend);
  const BackwardProblem bp =
      make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, o, attn.metadata());
  EXPECT_TRUE(testing::gradients_match(bp, native::reference_backward_f64(bp), g));
  ASSERT_TRUE(g.dsinks && g.dbias);
  EXPECT_EQ(g.dbias->shape(), (std::vector<std::int64_t>{1, 1, 256, 256}));
}

INSTANTIATE_TEST_SUITE_P(Operators, BackwardApi,
                         ::testing::Values(ApiCase{"vanilla", Backend::cpu, true, "vanilla"},
                                           ApiCase{"vanilla", Backend::native, false, "vanilla"},
                                           ApiCase{"blocksparse", Backend::cpu, true, "blocksparse"},
                                           ApiCase{"blocksparse", Backend::cpu, false, "vanilla"},
                                           ApiCase{"blocksparse", Backend::native, true, "blocksparse"},
                                           ApiCase{"flash_attn2", Backend::cpu, false, "flash_attn2"},
                                           ApiCase{"flash_attn2", Backend::native, true, "flash_attn2"}),
                         [](const auto& info) {
                           return info.param.op + "_" + std::string(backend_name(info.param.backend)) +
                                  (info.param.causal ? "_causal" : "_full");
                         });

// Decode (Tq = 1) falls back to vanilla for the forward and so for the backward.
TEST(BackwardApiRouting, DecodeRunsVanillaBackward) {
  CaseSpec s;
  s.Tq = 1, s.Tk = 300, s.Hq = 8, s.Hkv = 2, s.D = 64;
  const Case c = testing::make_case(s, 8);
  const Tensor dout = testing::random_tensor(DType::f32, {1, 1, 8, 64}, 9);
  const Attention attn = attention_on("flash_attn2", Backend::cpu);
  const AttentionOutput fwd = attn(c.q, c.k, c.v, {.return_lse = true});
  const AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, dout);
  EXPECT_EQ(g.decision.op, "vanilla");
  EXPECT_TRUE(g.decision.has(ReasonCode::decode));
  const BackwardProblem bp = make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, {}, {});
  EXPECT_TRUE(testing::gradients_match(bp, native::reference_backward_f64(bp), g));
}

// Storage dtypes: dq, dk, dv in the runtime dtype, dsinks and dbias f32.
TEST(BackwardApiDtypes, GradientsInTheRuntimeDtype) {
  for (auto [in, runtime] :
       {std::tuple<DType, std::optional<DType>>{DType::f16, std::nullopt}, {DType::f32, DType::bf16}}) {
    CaseSpec s;
    s.Tq = s.Tk = 128, s.Hq = 2, s.Hkv = 1, s.D = 32;
    s.dtype = in;
    s.sinks = s.bias = true;
    const Case c = testing::make_case(s, 10);
    const Tensor dout = testing::random_tensor(in, {1, 128, 2, 32}, 11);
    OperationMetadata md = registry().entry("flash_attn2").defaults;
    md.backends = {Backend::cpu};
    md.runtime_dtype = runtime;
    const Attention attn = registry().get("flash_attn2", md);
    AttentionOptions o = c.options;
    o.return_lse = true;
    const AttentionOutput fwd = attn(c.q, c.k, c.v, o);
    const AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, dout, o);
    const DType want = runtime.value_or(in);
    EXPECT_EQ(g.dq.dtype(), want);
    EXPECT_EQ(g.dk.dtype(), want);
    EXPECT_EQ(g.dv.dtype(), want);
    EXPECT_EQ(g.dsinks->dtype(), DType::f32);
    EXPECT_EQ(g.dbias->dtype(), DType::f32);
    const BackwardProblem bp = make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, o, md);
    EXPECT_TRUE(testing::gradients_match(bp, native::reference_backward_f64(bp), g)) << dtype_name(want);
  }
}

// No batch, no queries or no keys: every gradient is zero and has its shape.
TEST(BackwardApiEdges, EmptyProblems) {
  for (auto [B, Tq, Tk] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 5, 0}, {2, 0, 7}, {0, 3, 3}})
    for (Backend backend : {Backend::cpu, Backend::native}) {
      CaseSpec s;
      s.B = B, s.Tq = Tq, s.Tk = Tk, s.Hq = 2, s.Hkv = 1, s.D = 8;
      s.causal = false;
      s.sinks = true;
      const Case c = testing::make_case(s, 12);
      const Tensor dout(DType::f32, {B, Tq, 2, 8});
      const Attention attn = attention_on("flash_attn2", backend);
      AttentionOptions o = c.options;
      o.return_lse = true;
      const AttentionOutput fwd = attn(c.q, c.k, c.v, o);
      const AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, dout, o);
      EXPECT_EQ(g.dq.shape(), (std::vector<std::int64_t>{B, Tq, 2, 8}));
      EXPECT_EQ(g.dk.shape(), (std::vector<std::int64_t>{B, Tk, 1, 8}));
      EXPECT_EQ(g.dv.shape(), (std::vector<std::int64_t>{B, Tk, 1, 8}));
      for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &*g.dsinks})
        for (std::int64_t i = 0; i < t->numel(); ++i) EXPECT_EQ(t->at(static_cast<std::size_t>(i)), 0.f);
    }
}

// Bad residuals: typed errors naming the argument and the expected shape.
TEST(BackwardApiErrors, BadResidualsAreTypedErrors) {
  CaseSpec s;
  s.B = 2, s.Tq = 16, s.Tk = 16, s.Hq = 4, s.Hkv = 2, s.D = 8;
  const Case c = testing::make_case(s, 13);
  const Attention attn = registry().get("flash_attn2");
  const Tensor out(DType::f32, {2, 16, 4, 8}), lse(DType::f32, {2, 4, 16}), dout(DType::f32, {2, 16, 4, 8});
  const auto expect_error = [&](const TensorView& o, const TensorView& l, const TensorView& d, ErrorCode code,
                                const std::string& text) {
    try {
      attn.backward(c.q, c.k, c.v, o, l, d);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_THAT(e.what(), HasSubstr(text));
    }
  };
  const Tensor short_dout(DType::f32, {2, 16, 4, 7}), short_out(DType::f32, {2, 15, 4, 8});
  expect_error(out, lse, short_dout, ErrorCode::shape_mismatch,
               "dout: expected shape [B=2, Tq=16, Hq=4, Dv=8]");
  expect_error(short_out, lse, dout, ErrorCode::shape_mismatch,
               "out: expected shape [B=2, Tq=16, Hq=4, Dv=8]");
  expect_error(out, Tensor(DType::f32, {2, 16, 4}), dout, ErrorCode::shape_mismatch,
               "lse: expected shape [B=2, Hq=4, Tq=16]");
  expect_error(out, TensorView{}, dout, ErrorCode::shape_mismatch, "got none");
  expect_error(out, lse, Tensor(DType::i32, {2, 16, 4, 8}), ErrorCode::unsupported_dtype,
               "dout: expected a float");
  // The forward's own validation applies to the backward's inputs and options.
  try {
    attn.backward(c.q, c.k, c.v, out, lse, dout, {.sliding_window = Window{-1, 0}});
    ADD_FAILURE() << "no error for a negative window";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  }
}

// -inf in the bias masks those logits (IEEE): they get P = 0, zero dbias, no NaN anywhere.
TEST(BackwardApiEdges, MinusInfinityBiasActsAsAMask) {
  CaseSpec s;
  s.Tq = s.Tk = 128, s.Hq = 2, s.Hkv = 1, s.D = 32;
  s.causal = false;
  Case c = testing::make_case(s, 16);
  Tensor bias = testing::random_tensor(DType::f32, {1, 2, 128, 128}, 17);
  for (std::int64_t i = 0; i < bias.numel(); i += 7) bias.set(static_cast<std::size_t>(i), -INFINITY);
  c.options.bias = bias.view();
  const Tensor dout = testing::random_tensor(DType::f32, {1, 128, 2, 32}, 18);
  for (Backend backend : {Backend::cpu, Backend::native}) {
    const Attention attn = attention_on("flash_attn2", backend);
    AttentionOptions o = c.options;
    o.return_lse = true;
    const AttentionOutput fwd = attn(c.q, c.k, c.v, o);
    const AttentionGradients g = attn.backward(c.q, c.k, c.v, fwd, dout, o);
    for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &*g.dbias})
      for (std::int64_t i = 0; i < t->numel(); ++i)
        ASSERT_TRUE(std::isfinite(t->at(static_cast<std::size_t>(i)))) << backend_name(backend);
    for (std::int64_t i = 0; i < bias.numel(); i += 7)
      EXPECT_EQ(g.dbias->at(static_cast<std::size_t>(i)), 0.f);
    const BackwardProblem bp =
        make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, o, attn.metadata());
    EXPECT_TRUE(testing::gradients_match(bp, native::reference_backward_f64(bp), g)) << backend_name(backend);
  }
}

// Residuals in other float dtypes and strided views are accepted (converted as q is).
TEST(BackwardApiInputs, ResidualsOfOtherDtypesAreConverted) {
  CaseSpec s;
  s.Tq = s.Tk = 64, s.Hq = 2, s.Hkv = 2, s.D = 16;
  const Case c = testing::make_case(s, 14);
  const Attention attn = attention_on("flash_attn2", Backend::cpu);
  const AttentionOutput fwd = attn(c.q, c.k, c.v, {.return_lse = true});
  const Tensor dout = testing::random_tensor(DType::f32, {1, 64, 2, 16}, 15);
  const AttentionGradients want = attn.backward(c.q, c.k, c.v, fwd, dout);
  const Tensor out16 = Tensor::copy_of(fwd.out, DType::f16);
  const Tensor lse16 = Tensor::copy_of(*fwd.lse, DType::bf16);
  const AttentionGradients got = attn.backward(c.q, c.k, c.v, out16, lse16, dout);
  double diff = 0;
  for (std::int64_t i = 0; i < want.dq.numel(); ++i)
    diff = std::max(diff, static_cast<double>(std::abs(want.dq.at(i) - got.dq.at(i))));
  EXPECT_LT(diff, 5e-2);  // bf16 lse and f16 out: close, not equal
  EXPECT_GT(diff, 0.0);
}

}  // namespace
}  // namespace attnops
