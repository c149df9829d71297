// One meaning per word: explain returns a decision (plan, its old name, still compiles with a
// deprecation warning), the output is `out` (EasyDeL's attention_outputs() names the same
// tensor), and the sinks are `sinks` (EasyDeL's softmax_aux is the same option).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <utility>

#include "attnops/attnops.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using ::testing::HasSubstr;

struct Inputs {
  Tensor q = random_tensor(DType::f32, {1, 9, 4, 16}, 1);
  Tensor k = random_tensor(DType::f32, {1, 9, 2, 16}, 2);
  Tensor v = random_tensor(DType::f32, {1, 9, 2, 16}, 3);
  Tensor sinks = random_tensor(DType::f32, {4}, 4);
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(ApiNames, ExplainIsTheDecisionAndPlanStillWorks) {
  const Inputs in;
  const Attention attn = registry().get("flash_attn2");
  const AttentionOptions o{.sliding_window = {{3, 0}}};
  const DispatchDecision d = attn.explain(in.q, in.k, in.v, o);
  EXPECT_EQ(d.requested, "flash_attn2");
  EXPECT_EQ(d.backend, attn(in.q, in.k, in.v, o).decision.backend);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const DispatchDecision old = attn.plan(in.q, in.k, in.v, o);
#pragma GCC diagnostic pop
  EXPECT_EQ(old.to_json(), d.to_json());
}

TEST(ApiNames, OutAndAttentionOutputsAreOneTensor) {
  const Inputs in;
  AttentionOutput r = registry().get("vanilla")(in.q, in.k, in.v);
  ASSERT_EQ(r.out.numel(), 9 * 4 * 16);
  EXPECT_EQ(r.attention_outputs().data(), r.out.data());
  EXPECT_EQ(std::as_const(r).attention_outputs().data(), r.out.data());
  EXPECT_TRUE(r.device_attention_outputs().empty());
  EXPECT_TRUE(r.device_out.empty());
}

TEST(ApiNames, SoftmaxAuxIsSinks) {
  const Inputs in;
  const Attention attn = registry().get("flash_attn2");
  const AttentionOutput a = attn(in.q, in.k, in.v, {.sinks = in.sinks.view()});
  const AttentionOutput b = attn(in.q, in.k, in.v, {.softmax_aux = in.sinks.view()});
  const AttentionOutput none = attn(in.q, in.k, in.v);
  EXPECT_TRUE(same_bits(a.out, b.out));
  EXPECT_FALSE(same_bits(a.out, none.out));  // the sinks took effect
  try {
    (void)attn(in.q, in.k, in.v, {.sinks = in.sinks.view(), .softmax_aux = in.sinks.view()});
    ADD_FAILURE() << "sinks given twice: no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_THAT(e.what(), HasSubstr("sinks: given twice"));
  }
}

// What model code reads from an Attention without the implementor headers.
TEST(ApiNames, AttentionAnswersWhatTheOperatorCan) {
  const Attention attn = registry().get("vanilla");
  EXPECT_TRUE(attn.returns_weights());
  EXPECT_TRUE(attn.implements(Backend::native));
  EXPECT_TRUE(attn.implements_backward(Backend::native));
  EXPECT_FALSE(attn.implements_paged(Backend::native));
  EXPECT_FALSE(registry().get("flash_attn2").returns_weights());
  EXPECT_THAT(registry().get("blocksparse").aliases(), ::testing::Contains("splash"));
}

}  // namespace
}  // namespace attnops::testing
