// The non-finite policy (README "Non-finite values"; backends/common/softmax_policy.h) over the
// whole operators x backends grid: vanilla, blocksparse and flash_attn2, each on native, cpu and
// gpu (lavapipe is allowed here; without any Vulkan device the gpu cells skip), f32 and bf16,
// a prefill shape (Tq = Tk = 37: partial blocks, vanilla cpu's GEMM path) and a decode shape
// (Tq = 1, Tk = 300: vanilla cpu's streaming path with kv splits). Fallbacks are off so that
// each cell runs the named operator's own kernel.
//
// For every case the fp64 oracle is first checked against the policy stated in words (which
// rows are NaN, which are 0, which lse is -inf), then every cell must agree with the oracle
// element by element: the same class (NaN, +inf, -inf, finite) everywhere, finite values within
// the dtype's tolerance. New kernels (new shaders, new CPU tiers) are held to the policy by
// adding nothing here: they run under the same operator x backend names.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

enum class Cls { nan, pos_inf, neg_inf, finite };
Cls classify(double x) {
  if (std::isnan(x)) return Cls::nan;
  if (std::isinf(x)) return x > 0 ? Cls::pos_inf : Cls::neg_inf;
  return Cls::finite;
}
const char* cls_name(Cls c) {
  return c == Cls::nan ? "NaN" : c == Cls::pos_inf ? "+inf" : c == Cls::neg_inf ? "-inf" : "finite";
}

struct Shape {
  const char* name;
  std::int64_t Tq, Tk;
};
const Shape kShapes[] = {{"prefill", 37, 37}, {"decode", 1, 300}};

// A case of the policy: how it poisons a random input, and what the oracle must then show.
struct PolicyCase {
  const char* name;
  bool bias = false, sinks = false;
  std::function<void(Case&)> poison;
  // Checks the oracle's answer against the policy in words (out [B, Tq, Hq, Dv], lse [B, Hq, Tq]).
  std::function<void(const Case&, const native::ReferenceResult&)> expect;
};

std::size_t out_at(const Case& c, std::int64_t i, std::int64_t h, std::int64_t d) {
  return static_cast<std::size_t>((i * c.Hq + h) * c.Dv + d);  // B = 1
}
std::size_t lse_at(const Case& c, std::int64_t i, std::int64_t h) {
  return static_cast<std::size_t>(h * c.Tq + i);
}

// Whether row (i, h) of a causal case sees key j (bottom-right aligned).
bool sees(const Case& c, std::int64_t i, std::int64_t j) {
  return j <= i + c.Tk - c.Tq;
}

std::vector<PolicyCase> policy_cases() {
  std::vector<PolicyCase> cs;
  // NaN in one q row: exactly that row (all Dv outputs) and its lse are NaN.
  cs.push_back({"nan_in_one_q_row", false, false,
                [](Case& c) {
                  const std::int64_t i = c.Tq - 1, h = 1;
                  for (std::int64_t d = 0; d < c.D; ++d)
                    c.q.set(static_cast<std::size_t>((i * c.Hq + h) * c.D + d), kNaN);
                },
                [](const Case& c, const native::ReferenceResult& r) {
                  for (std::int64_t i = 0; i < c.Tq; ++i)
                    for (std::int64_t h = 0; h < c.Hq; ++h) {
                      const bool bad = i == c.Tq - 1 && h == 1;
                      for (std::int64_t d = 0; d < c.Dv; ++d)
                        ASSERT_EQ(std::isnan(r.out[out_at(c, i, h, d)]), bad) << "i=" << i << " h=" << h;
                      ASSERT_EQ(std::isnan(r.lse[lse_at(c, i, h)]), bad);
                    }
                }});
  // +inf in one k entry (key j, kv head 0, dim 3): rows that see key j get logit +-inf: +inf
  // (q[3] > 0) makes the row NaN, -inf masks the key (row finite). Other rows are untouched.
  cs.push_back({"pos_inf_in_one_k_entry", false, false,
                [](Case& c) {
                  const std::int64_t j = c.Tk / 3;
                  c.k.set(static_cast<std::size_t>((j * c.Hkv + 0) * c.D + 3), kInf);
                },
                [](const Case& c, const native::ReferenceResult& r) {
                  const std::int64_t j = c.Tk / 3, G = c.Hq / c.Hkv;
                  for (std::int64_t i = 0; i < c.Tq; ++i)
                    for (std::int64_t h = 0; h < c.Hq; ++h) {
                      const float q3 = c.q.at(static_cast<std::size_t>((i * c.Hq + h) * c.D + 3));
                      const bool bad = h / G == 0 && sees(c, i, j) && q3 > 0;
                      ASSERT_EQ(std::isnan(r.out[out_at(c, i, h, 0)]), bad) << "i=" << i << " h=" << h;
                      ASSERT_EQ(std::isnan(r.lse[lse_at(c, i, h)]), bad);
                    }
                }});
  // bias = -inf everywhere: a -inf bias is a mask, so every row is fully masked: 0 and -inf.
  cs.push_back({"bias_neg_inf_everywhere", true, false,
                [](Case& c) {
                  for (std::int64_t e = 0; e < c.bias->numel(); ++e)
                    c.bias->set(static_cast<std::size_t>(e), -kInf);
                },
                [](const Case&, const native::ReferenceResult& r) {
                  for (double x : r.out) ASSERT_EQ(x, 0.0);
                  for (double x : r.lse) ASSERT_EQ(x, -std::numeric_limits<double>::infinity());
                }});
  // sink = +inf: it takes all the probability mass: output 0; lse excludes the sink: finite.
  cs.push_back({"sink_pos_inf", false, true,
                [](Case& c) {
                  for (std::int64_t h = 0; h < c.Hq; ++h) c.sinks->set(static_cast<std::size_t>(h), kInf);
                },
                [](const Case&, const native::ReferenceResult& r) {
                  for (double x : r.out) ASSERT_EQ(x, 0.0);
                  for (double x : r.lse) ASSERT_TRUE(std::isfinite(x));
                }});
  // NaN in one v entry (key j, kv head 1, dim 2): exactly the rows that see key j get NaN in
  // dim 2; rows that do not see it (causal) are untouched although their tiles hold key j.
  cs.push_back({"nan_in_one_v_entry", false, false,
                [](Case& c) {
                  const std::int64_t j = c.Tk - 2;
                  c.v.set(static_cast<std::size_t>((j * c.Hkv + 1) * c.Dv + 2), kNaN);
                },
                [](const Case& c, const native::ReferenceResult& r) {
                  const std::int64_t j = c.Tk - 2, G = c.Hq / c.Hkv;
                  for (std::int64_t i = 0; i < c.Tq; ++i)
                    for (std::int64_t h = 0; h < c.Hq; ++h)
                      for (std::int64_t d = 0; d < c.Dv; ++d) {
                        const bool bad = h / G == 1 && sees(c, i, j) && d == 2;
                        ASSERT_EQ(std::isnan(r.out[out_at(c, i, h, d)]), bad)
                            << "i=" << i << " h=" << h << " d=" << d;
                      }
                  for (double x : r.lse) ASSERT_TRUE(std::isfinite(x));
                }});
  // +inf in one v entry: the rows that see it get +inf in that dim (their weight is > 0).
  cs.push_back({"pos_inf_in_one_v_entry", false, false,
                [](Case& c) {
                  const std::int64_t j = c.Tk - 1;
                  c.v.set(static_cast<std::size_t>((j * c.Hkv + 0) * c.Dv + 5), kInf);
                },
                [](const Case& c, const native::ReferenceResult& r) {
                  const std::int64_t G = c.Hq / c.Hkv;
                  for (std::int64_t i = 0; i < c.Tq; ++i)
                    for (std::int64_t h = 0; h < c.Hq; ++h) {
                      const bool bad = h / G == 0 && sees(c, i, c.Tk - 1);
                      ASSERT_EQ(r.out[out_at(c, i, h, 5)] == std::numeric_limits<double>::infinity(), bad);
                    }
                }});
  // A -inf bias on some keys, and on every key of one row: those keys are masked; that row is
  // fully masked (0, -inf); the others are finite.
  cs.push_back({"bias_neg_inf_some_keys_and_one_row", true, false,
                [](Case& c) {
                  for (std::int64_t e = 0; e < c.bias->numel(); ++e) {
                    const std::int64_t i = (e / c.Tk) % c.Tq, j = e % c.Tk;
                    if (j % 3 == 1 || i == c.Tq / 2) c.bias->set(static_cast<std::size_t>(e), -kInf);
                  }
                },
                [](const Case& c, const native::ReferenceResult& r) {
                  for (std::int64_t i = 0; i < c.Tq; ++i)
                    for (std::int64_t h = 0; h < c.Hq; ++h) {
                      // A causal row that sees no key outside the -inf columns is fully masked too.
                      bool any = false;
                      for (std::int64_t j = 0; j < c.Tk; ++j) any = any || (sees(c, i, j) && j % 3 != 1);
                      const bool masked = i == c.Tq / 2 || !any;
                      ASSERT_EQ(r.lse[lse_at(c, i, h)] == -std::numeric_limits<double>::infinity(), masked);
                      if (masked) {
                        ASSERT_EQ(r.out[out_at(c, i, h, 0)], 0.0);
                      }
                      ASSERT_TRUE(std::isfinite(r.out[out_at(c, i, h, 0)]));
                    }
                }});
  // A +inf bias entry: its row's logit is +inf, so the row is NaN (exp(inf - inf)).
  cs.push_back({"bias_pos_inf_one_entry", true, false,
                [](Case& c) { c.bias->set(static_cast<std::size_t>((c.Tq - 1) * c.Tk + 0), kInf); },  // h 0
                [](const Case& c, const native::ReferenceResult& r) {
                  for (std::int64_t i = 0; i < c.Tq; ++i)
                    for (std::int64_t h = 0; h < c.Hq; ++h)
                      ASSERT_EQ(std::isnan(r.out[out_at(c, i, h, 0)]), i == c.Tq - 1 && h == 0);
                }});
  // A NaN sink: that head's outputs are NaN; lse (which excludes the sink) stays finite.
  cs.push_back({"sink_nan_one_head", false, true, [](Case& c) { c.sinks->set(2, kNaN); },
                [](const Case& c, const native::ReferenceResult& r) {
                  for (std::int64_t i = 0; i < c.Tq; ++i)
                    for (std::int64_t h = 0; h < c.Hq; ++h) {
                      ASSERT_EQ(std::isnan(r.out[out_at(c, i, h, 0)]), h == 2);
                      ASSERT_TRUE(std::isfinite(r.lse[lse_at(c, i, h)]));
                    }
                }});
  return cs;
}

Case make_policy_case(const PolicyCase& pc, const Shape& s, DType dtype) {
  CaseSpec spec;
  spec.B = 1, spec.Tq = s.Tq, spec.Tk = s.Tk, spec.Hq = 4, spec.Hkv = 2, spec.D = 24;
  spec.dtype = dtype;
  spec.causal = true;
  spec.bias = pc.bias;
  spec.sinks = pc.sinks;
  Case c = make_case(spec, 11);
  pc.poison(c);
  return c;
}

// Counts of the classes in a tensor, for the printed table: "NaN 32, zero 0, -inf 0, ...".
std::string census(const std::vector<double>& x) {
  std::size_t nan = 0, zero = 0, pinf = 0, ninf = 0;
  for (double e : x) {
    nan += std::isnan(e);
    zero += e == 0.0;
    pinf += e == std::numeric_limits<double>::infinity();
    ninf += e == -std::numeric_limits<double>::infinity();
  }
  std::ostringstream os;
  os << "NaN " << nan << ", zero " << zero << ", +inf " << pinf << ", -inf " << ninf << " of " << x.size();
  return os.str();
}

std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> r(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = t.at(i);
  return r;
}

// got agrees with want: same class everywhere, finite values within tol.
::testing::AssertionResult agrees(const char* what, const std::vector<double>& got,
                                  const std::vector<double>& want, double tol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": size differs";
  for (std::size_t i = 0; i < got.size(); ++i) {
    const Cls g = classify(got[i]), w = classify(want[i]);
    if (g != w)
      return ::testing::AssertionFailure() << what << "[" << i << "] is " << cls_name(g) << " (" << got[i]
                                           << "), the oracle's is " << cls_name(w) << " (" << want[i] << ")";
    if (g == Cls::finite && std::abs(got[i] - want[i]) > tol)
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << got[i] << ", oracle " << want[i]
                                           << " (tolerance " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

OperationMetadata metadata_for(const std::string& op, Backend b) {
  OperationMetadata md = registry().entry(op).defaults;
  md.backends = {b};
  md.fallbacks = FallbackPolicy{};  // every rule off: the operator's own kernel runs
  md.gpu.allow_software = true;     // lavapipe counts here
  return md;
}

class NonFinitePolicy : public ::testing::TestWithParam<std::tuple<std::string, Backend>> {};

TEST(NonFinitePolicyOracle, FollowsThePolicyInWords) {
  for (const PolicyCase& pc : policy_cases())
    for (const Shape& s : kShapes)
      for (DType dt : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(std::string(pc.name) + " " + s.name + " " + std::string(dtype_name(dt)));
        const Case c = make_policy_case(pc, s, dt);
        const native::ReferenceResult r =
            native::reference_attention_f64(make_problem(c.q, c.k, c.v, c.options, {}), false);
        pc.expect(c, r);
      }
}

TEST_P(NonFinitePolicy, AgreesWithTheOracle) {
  const auto& [op, backend] = GetParam();
  const OperationMetadata md = metadata_for(op, backend);
  if (const Availability a = registry().host().availability(backend, md.gpu); !a.available)
    GTEST_SKIP() << backend_name(backend) << " is not available here: " << a.detail;
  const Attention attn = registry().get(op, md);
  for (const PolicyCase& pc : policy_cases())
    for (const Shape& s : kShapes)
      for (DType dt : {DType::f32, DType::bf16}) {
        const std::string label = std::string(pc.name) + " " + s.name + " " + std::string(dtype_name(dt));
        SCOPED_TRACE(op + " on " + std::string(backend_name(backend)) + ": " + label);
        Case c = make_policy_case(pc, s, dt);
        c.options.return_lse = true;
        const AttentionOutput got = attn(c.q, c.k, c.v, c.options);
        ASSERT_EQ(got.decision.op, op);
        ASSERT_EQ(got.decision.backend, backend);
        const native::ReferenceResult want =
            native::reference_attention_f64(make_problem(c.q, c.k, c.v, c.options, md), false);
        const Tolerance tol = tolerance_for(dt);
        const std::vector<double> out = as_doubles(got.out), lse = as_doubles(*got.lse);
        EXPECT_TRUE(agrees("out", out, want.out, tol.out));
        EXPECT_TRUE(agrees("lse", lse, want.lse, tol.lse));
        // The policy table of the report: one line per operator x backend x case.
        if (dt == DType::f32)
          std::cout << "[policy] " << op << " | " << backend_name(backend) << " | " << label
                    << " | out: " << census(out) << " | lse: " << census(lse) << "\n";
      }
}

// vanilla's attention weights under the same cases: a NaN row has NaN weights for the keys it
// sees and 0 for the keys it does not (masked keys keep weight 0 in every row, as the oracle).
class NonFiniteWeights : public ::testing::TestWithParam<Backend> {};

TEST_P(NonFiniteWeights, AgreeWithTheOracle) {
  const Backend backend = GetParam();
  const OperationMetadata md = metadata_for("vanilla", backend);
  if (const Availability a = registry().host().availability(backend, md.gpu); !a.available)
    GTEST_SKIP() << backend_name(backend) << " is not available here: " << a.detail;
  const Attention attn = registry().get("vanilla", md);
  for (const PolicyCase& pc : policy_cases())
    for (const Shape& s : kShapes)
      for (DType dt : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(std::string(pc.name) + " " + s.name + " " + std::string(dtype_name(dt)) + " on " +
                     std::string(backend_name(backend)));
        Case c = make_policy_case(pc, s, dt);
        c.options.return_weights = true;
        const AttentionOutput got = attn(c.q, c.k, c.v, c.options);
        ASSERT_EQ(got.decision.backend, backend);
        ASSERT_TRUE(got.attention_weights.has_value());
        const native::ReferenceResult want =
            native::reference_attention_f64(make_problem(c.q, c.k, c.v, c.options, md), true);
        EXPECT_TRUE(
            agrees("weights", as_doubles(*got.attention_weights), want.weights, tolerance_for(dt).out));
      }
}

// A NaN in the v of a key that segment ids hide from some rows of a full tile (the block map
// sees the static mask only): those rows give the key weight 0 and stay finite, with and without
// the weights output (vanilla's gpu path for weights multiplied P x v unguarded in full tiles).
TEST_P(NonFiniteWeights, SegmentsKeepAMaskedKeysNaNOut) {
  const Backend backend = GetParam();
  const OperationMetadata md = metadata_for("vanilla", backend);
  if (const Availability a = registry().host().availability(backend, md.gpu); !a.available)
    GTEST_SKIP() << backend_name(backend) << " is not available here: " << a.detail;
  const Attention attn = registry().get("vanilla", md);
  CaseSpec spec;
  spec.Tq = spec.Tk = 40, spec.Hq = 2, spec.Hkv = 1, spec.D = 8, spec.causal = false, spec.segments = true;
  spec.sinks = true;
  Case c = make_case(spec, 31);
  for (std::int64_t d = 0; d < c.Dv; ++d) c.v.set(static_cast<std::size_t>(3 * c.Dv + d), kNaN);  // key 3
  for (const bool weights : {false, true}) {
    SCOPED_TRACE(std::string(weights ? "with" : "without") + " weights on " +
                 std::string(backend_name(backend)));
    c.options.return_weights = weights;
    const AttentionOutput got = attn(c.q, c.k, c.v, c.options);
    const native::ReferenceResult want =
        native::reference_attention_f64(make_problem(c.q, c.k, c.v, c.options, md), weights);
    EXPECT_TRUE(agrees("out", as_doubles(got.out), want.out, tolerance_for(c.dtype).out));
    if (weights) {
      EXPECT_TRUE(
          agrees("weights", as_doubles(*got.attention_weights), want.weights, tolerance_for(c.dtype).out));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, NonFiniteWeights,
                         ::testing::Values(Backend::native, Backend::cpu, Backend::gpu),
                         [](const auto& info) { return std::string(backend_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(OperatorsXBackends, NonFinitePolicy,
                         ::testing::Combine(::testing::Values("vanilla", "blocksparse", "flash_attn2"),
                                            ::testing::Values(Backend::native, Backend::cpu, Backend::gpu)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::string(backend_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace attnops::testing
