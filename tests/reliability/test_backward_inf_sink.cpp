// The backward of a head whose sink is +inf. The sink takes all the mass (README, Non-finite
// values): the head's outputs are 0 whatever q, k and v are, so its rows' gradients are 0 and
// they add nothing to dk, dv or dsinks, also where their dout holds a NaN or an infinity. The cpu
// and gpu backwards computed the row's log-denominator as m + log(e^(lse - m) + e^(sink - m))
// with m = +inf, a NaN, and returned NaN gradients; the oracle's dsinks was inf / inf. Found by
// the differential fuzzer (attnops verify, case 1056:6 of the long run).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

int cls(double x) {
  return std::isnan(x) ? 0 : std::isinf(x) ? (x > 0 ? 1 : 2) : 3;
}

class BackwardInfSink : public ::testing::TestWithParam<std::tuple<std::string, Backend>> {};

TEST_P(BackwardInfSink, TheHeadHasZeroGradients) {
  const auto& [op, backend] = GetParam();
  OperationMetadata md = registry().entry(op).defaults;
  md.backends = {backend};
  md.fallbacks = FallbackPolicy{};
  md.gpu.allow_software = true;
  if (const Availability a = registry().host().availability(backend, md.gpu); !a.available)
    GTEST_SKIP() << backend_name(backend) << " is not available here: " << a.detail;
  CaseSpec spec;
  spec.Tq = spec.Tk = 40, spec.Hq = 4, spec.Hkv = 2, spec.D = 16, spec.sinks = true;
  Case c = make_case(spec, 21);
  c.sinks->set(1, kInf);  // q head 1 (kv head 0, shared with head 0)
  Tensor dout = random_tensor(DType::f32, {1, 40, 4, 16}, 22);
  dout.set(static_cast<std::size_t>((7 * 4 + 1) * 16 + 3), std::nanf(""));  // a NaN in head 1's dout
  const Attention attn = registry().get(op, md);
  AttentionOptions o = c.options;
  o.return_lse = true;
  const AttentionOutput f = attn(c.q, c.k, c.v, o);
  const AttentionGradients g = attn.backward(c.q, c.k, c.v, f, dout, o);
  ASSERT_EQ(g.decision.backend, backend);
  const native::ReferenceGradients want =
      native::reference_backward_f64(make_backward_problem(c.q, c.k, c.v, f.out, *f.lse, dout, o, md));
  const auto check = [&](const char* name, const Tensor& got, const std::vector<double>& w) {
    ASSERT_EQ(static_cast<std::size_t>(got.numel()), w.size()) << name;
    double scale = 1;
    for (double x : w) scale = std::isfinite(x) ? std::max(scale, std::abs(x)) : scale;
    for (std::size_t i = 0; i < w.size(); ++i) {
      ASSERT_TRUE(std::isfinite(w[i])) << name << "[" << i << "]: the oracle's is " << w[i];
      ASSERT_EQ(cls(got.at(i)), cls(w[i])) << name << "[" << i << "] = " << got.at(i) << ", oracle " << w[i];
      ASSERT_NEAR(got.at(i), w[i], 4e-5 * scale) << name << "[" << i << "]";
    }
  };
  check("dq", g.dq, want.dq);
  check("dk", g.dk, want.dk);
  check("dv", g.dv, want.dv);
  ASSERT_TRUE(g.dsinks.has_value());
  check("dsinks", *g.dsinks, want.dsinks);
  for (std::int64_t i = 0; i < 40; ++i)
    for (std::int64_t d = 0; d < 16; ++d)
      ASSERT_EQ(g.dq.at(static_cast<std::size_t>((i * 4 + 1) * 16 + d)), 0.f);
  EXPECT_EQ(g.dsinks->at(1), 0.f);
}

INSTANTIATE_TEST_SUITE_P(OperatorsXBackends, BackwardInfSink,
                         ::testing::Combine(::testing::Values("vanilla", "flash_attn2"),
                                            ::testing::Values(Backend::native, Backend::cpu, Backend::gpu)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(backend_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace attnops::testing
