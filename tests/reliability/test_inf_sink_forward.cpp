// The forward of a head whose sink is +inf: the sink takes all the mass (README, Non-finite
// values), so the head's output is 0 whatever q, k and v are, an infinity in v included (every
// key has weight 0 and adds nothing, as in the oracle). The kernels multiplied the row's
// unnormalised accumulator, inf there, by its factor 0 and wrote NaN. Found by the differential
// fuzzer (attnops verify, case 1238:0 of the long run). Prefill and decode rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

int cls(double x) {
  return std::isnan(x) ? 0 : std::isinf(x) ? (x > 0 ? 1 : 2) : 3;
}

class InfSinkForward : public ::testing::TestWithParam<std::tuple<std::string, Backend, std::int64_t>> {};

TEST_P(InfSinkForward, TheHeadIsZeroWhateverVHolds) {
  const auto& [op, backend, Tq] = GetParam();
  OperationMetadata md = registry().entry(op).defaults;
  md.backends = {backend};
  md.fallbacks = FallbackPolicy{};
  md.gpu.allow_software = true;
  if (const Availability a = registry().host().availability(backend, md.gpu); !a.available)
    GTEST_SKIP() << backend_name(backend) << " is not available here: " << a.detail;
  CaseSpec spec;
  spec.Tq = Tq, spec.Tk = 40, spec.Hq = 4, spec.Hkv = 2, spec.D = 16, spec.sinks = true, spec.causal = false;
  Case c = make_case(spec, 23);
  c.sinks->set(1, kInf);                                          // q head 1 (kv head 0, shared with head 0)
  c.v.set(static_cast<std::size_t>((5 * 2 + 0) * 16 + 3), kInf);  // key 5, kv head 0, column 3
  const Attention attn = registry().get(op, md);
  const AttentionOutput got = attn(c.q, c.k, c.v, c.options);
  ASSERT_EQ(got.decision.backend, backend);
  const native::ReferenceResult want =
      native::reference_attention_f64(make_problem(c.q, c.k, c.v, c.options, md), false);
  ASSERT_EQ(static_cast<std::size_t>(got.out.numel()), want.out.size());
  for (std::size_t e = 0; e < want.out.size(); ++e) {
    const std::int64_t h = static_cast<std::int64_t>(e / 16) % 4;
    if (h == 1) {
      ASSERT_EQ(got.out.at(e), 0.f) << "out[" << e << "] of the +inf sink's head";
    }
    ASSERT_EQ(cls(got.out.at(e)), cls(want.out[e]))
        << "out[" << e << "] = " << got.out.at(e) << ", oracle " << want.out[e];
  }
}

INSTANTIATE_TEST_SUITE_P(OperatorsXBackends, InfSinkForward,
                         ::testing::Combine(::testing::Values("vanilla", "flash_attn2"),
                                            ::testing::Values(Backend::native, Backend::cpu, Backend::gpu),
                                            ::testing::Values(std::int64_t{40}, std::int64_t{1})),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(backend_name(std::get<1>(info.param))) + "_Tq" +
                                  std::to_string(std::get<2>(info.param));
                         });

}  // namespace
}  // namespace attnops::testing
