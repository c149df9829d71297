// End to end through the public API: registry().get(op) with the backend pinned, on random
// inputs over the feature grid, checked against the fp64 oracle. The kernels' own suites go
// deeper; this proves that the glue (problem, dispatch, buffers) hands them the right data.
#include <gtest/gtest.h>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

struct E2E {
  const char* op;
  Backend backend;
};

class EndToEnd : public ::testing::TestWithParam<E2E> {};

TEST_P(EndToEnd, MatchesOracleOverFeatureGrid) {
  const auto [op, backend] = GetParam();
  OperationMetadata md;
  md.backends = {backend};
  md.disabled_backends = {Backend::gpu};
  std::uint64_t seed = 1;
  std::vector<CaseSpec> specs;
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (std::int64_t D : {1, 40, 64, 80, 96, 112, 128, 256}) {
      CaseSpec s;
      s.B = 1 + static_cast<std::int64_t>(seed % 3);
      s.Tq = 128;
      s.Tk = 128 + 37 * static_cast<std::int64_t>(seed % 2);
      s.Hq = 4;
      s.Hkv = (seed % 3 == 0) ? 1 : (seed % 3 == 1 ? 2 : 4);
      s.D = D;
      s.dtype = dt;
      s.causal = seed % 4 != 0;
      if (seed % 5 == 1) s.window = Window{17, 3};
      if (seed % 7 == 2) s.chunk = 32;
      s.segments = seed % 6 == 3;
      s.bias = seed % 4 == 2;
      s.bias_broadcast = seed % 8 == 2;
      if (seed % 3 == 2) s.soft_cap = 20.0;
      s.sinks = seed % 5 == 4;
      s.scale_inputs = 3.f;
      specs.push_back(s);
      ++seed;
    }
  for (const CaseSpec& s : specs) {
    Case c = make_case(s, seed++);
    AttentionOptions o = c.options;
    const Attention attn = registry().get(op, md);
    AttentionOutput out = attn(c.q, c.k, c.v, o);
    ASSERT_EQ(out.decision.backend, backend) << out.decision.to_json();
    // Rebuild the problem the way the dispatcher did, and compare with the oracle.
    AttentionProblem p = make_problem(c.q, c.k, c.v, o, attn.metadata());
    AttentionBuffers got{out.out, out.lse, out.attention_weights, {}, {}};
    EXPECT_TRUE(within_tolerance(p, got))
        << op << " " << backend_name(backend) << " " << c.describe() << " ran " << out.decision.to_json();
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllOperators, EndToEnd,
    ::testing::Values(E2E{"vanilla", Backend::native}, E2E{"vanilla", Backend::cpu},
                      E2E{"blocksparse", Backend::native}, E2E{"blocksparse", Backend::cpu},
                      E2E{"flash_attn2", Backend::native}, E2E{"flash_attn2", Backend::cpu}),
    [](const auto& info) {
      return std::string(info.param.op) + "_" + std::string(backend_name(info.param.backend));
    });

TEST(EndToEndWeights, VanillaWeightsMatchOracle) {
  CaseSpec s;
  s.B = 2, s.Tq = 33, s.Tk = 70, s.Hq = 4, s.Hkv = 2, s.D = 40, s.sinks = true, s.window = Window{20, 0};
  Case c = make_case(s, 99);
  c.options.return_weights = true;
  for (Backend b : {Backend::native, Backend::cpu}) {
    OperationMetadata md;
    md.backends = {b};
    md.disabled_backends = {Backend::gpu};
    AttentionOutput out = registry().get("vanilla", md)(c.q, c.k, c.v, c.options);
    ASSERT_TRUE(out.attention_weights.has_value());
    AttentionProblem p = make_problem(c.q, c.k, c.v, c.options, md);
    auto ref = native::reference_attention_f64(p, true);
    double err = 0;
    for (std::size_t i = 0; i < ref.weights.size(); ++i)
      err = std::max(err, std::abs(ref.weights[i] - out.attention_weights->at(i)));
    EXPECT_LT(err, 1e-5) << backend_name(b);
  }
}

}  // namespace
}  // namespace attnops::testing
