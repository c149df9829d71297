// The fp64 backward oracle against central finite differences of the fp64 forward oracle, on
// small shapes covering every feature: every mask kind, segments, fully masked rows, soft cap,
// sinks, bias (full and broadcast over batch and/or heads), GQA, odd head dims, Dv != D.
//
// Loss L = sum(dout * out). Each input element x (stored as f32) is moved to the f32 values
// x+ = fl(x + eps), x- = fl(x - eps) and the derivative is (L(x+) - L(x-)) / (x+ - x-) with the
// exact step, so the only error is the O(eps^2) truncation: eps = 1e-3, tolerance
// 1e-6 * max(1, max |gradient|) (the error seen is ~1e-8). Every element of q, k, v, sinks and
// bias is checked.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"
#include "tests/support/testing.h"

namespace attnops {
namespace {

using testing::Case;
using testing::CaseSpec;

double loss(const Case& c, const Tensor& dout) {
  const AttentionProblem p = make_problem(c.q, c.k, c.v, c.options, OperationMetadata{});
  const native::ReferenceResult r = native::reference_attention_f64(p, false);
  double l = 0;
  for (std::size_t i = 0; i < r.out.size(); ++i) l += static_cast<double>(dout.at(i)) * r.out[i];
  return l;
}

// Checks the analytic gradient `want` of every element of tensor `t` (f32, modified in place and
// restored) against finite differences of loss(c).
::testing::AssertionResult matches_fd(Case& c, const Tensor& dout, Tensor& t, const std::vector<double>& want,
                                      const char* name) {
  constexpr double kEps = 1e-3, kTol = 1e-6;
  if (static_cast<std::size_t>(t.numel()) != want.size())
    return ::testing::AssertionFailure()
           << name << ": gradient has " << want.size() << " elements, input " << t.numel();
  double scale = 1;
  for (double w : want) scale = std::max(scale, std::abs(w));
  float* x = t.data_as<float>();
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float x0 = x[i];
    const float xp = static_cast<float>(x0 + kEps), xm = static_cast<float>(x0 - kEps);
    x[i] = xp;
    const double lp = loss(c, dout);
    x[i] = xm;
    const double lm = loss(c, dout);
    x[i] = x0;
    const double fd = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
    if (!(std::abs(fd - want[i]) <= kTol * scale))
      return ::testing::AssertionFailure()
             << name << "[" << i << "]: analytic " << want[i] << ", finite difference " << fd
             << " (tolerance " << kTol * scale << ")";
  }
  return ::testing::AssertionSuccess();
}

void check_case(Case& c, std::uint64_t seed) {
  SCOPED_TRACE(c.describe());
  ASSERT_EQ(c.dtype, DType::f32);
  const Tensor dout = testing::random_tensor(DType::f32, {c.B, c.Tq, c.Hq, c.Dv}, seed);
  c.options.return_lse = true;
  const AttentionProblem p = make_problem(c.q, c.k, c.v, c.options, OperationMetadata{});
  AttentionBuffers fwd = allocate_buffers(p);
  native::reference_attention(p, fwd);
  const BackwardProblem bp = make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, c.options, {});
  const native::ReferenceGradients g = native::reference_backward_f64(bp);
  EXPECT_TRUE(matches_fd(c, dout, c.q, g.dq, "dq"));
  EXPECT_TRUE(matches_fd(c, dout, c.k, g.dk, "dk"));
  EXPECT_TRUE(matches_fd(c, dout, c.v, g.dv, "dv"));
  if (c.sinks) {
    EXPECT_TRUE(matches_fd(c, dout, *c.sinks, g.dsinks, "dsinks"));
  }
  if (c.bias) {
    EXPECT_TRUE(matches_fd(c, dout, *c.bias, g.dbias, "dbias"));
  }
}

CaseSpec shape(std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
               std::int64_t D) {
  CaseSpec s;
  s.B = B, s.Tq = Tq, s.Tk = Tk, s.Hq = Hq, s.Hkv = Hkv, s.D = D;
  return s;
}

struct FdCase {
  std::string name;
  CaseSpec spec;
};

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> v;
  auto add = [&](std::string name, CaseSpec s, const std::function<void(CaseSpec&)>& f) {
    f(s);
    v.push_back({std::move(name), s});
  };
  add("causal_gqa_odd_d", shape(1, 9, 11, 4, 2, 5), [](CaseSpec&) {});
  add("full_dv_larger", shape(1, 7, 5, 2, 1, 3), [](CaseSpec& s) {
    s.causal = false;
    s.Dv = 6;
  });
  add("dv_smaller_mqa", shape(2, 6, 8, 3, 1, 7), [](CaseSpec& s) { s.Dv = 2; });
  add("window", shape(1, 10, 10, 2, 2, 4), [](CaseSpec& s) {
    s.causal = false;
    s.window = Window{2, 1};
  });
  add("window_causal_empty_rows", shape(1, 12, 6, 1, 1, 4), [](CaseSpec& s) { s.window = Window{1, 0}; });
  add("chunk", shape(1, 11, 11, 2, 1, 4), [](CaseSpec& s) { s.chunk = 3; });
  add("per_head_mask", shape(1, 8, 9, 3, 1, 4), [](CaseSpec& s) {
    s.causal = false;
    s.mask = Mask::per_head({Mask::causal(), Mask::local(1, 2), Mask::chunked_causal(4)});
  });
  add("and_or_mask", shape(1, 10, 12, 1, 1, 3), [](CaseSpec& s) {
    s.causal = false;
    s.mask = (Mask::local(2, 0) & Mask::causal()) | Mask::chunked_causal(5);
  });
  add("segments_fully_masked_rows", shape(2, 10, 9, 2, 1, 4), [](CaseSpec& s) {
    s.causal = false;
    s.segments = true;
  });
  add("soft_cap", shape(1, 8, 8, 2, 1, 6), [](CaseSpec& s) {
    s.soft_cap = 1.5;
    s.scale_inputs = 3.f;
  });
  add("sinks_tq_gt_tk", shape(1, 9, 5, 2, 1, 4), [](CaseSpec& s) { s.sinks = true; });
  add("bias_full", shape(2, 6, 7, 2, 2, 3), [](CaseSpec& s) {
    s.causal = false;
    s.bias = true;
  });
  add("bias_broadcast", shape(2, 6, 7, 4, 2, 3), [](CaseSpec& s) {
    s.bias = true;
    s.bias_broadcast = true;
  });
  add("everything", shape(2, 9, 10, 4, 2, 5), [](CaseSpec& s) {
    s.Dv = 3;
    s.window = Window{4, 1};
    s.segments = s.sinks = s.bias = true;
    s.soft_cap = 2.0;
    s.scale_inputs = 2.f;
  });
  return v;
}

class BackwardFiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(BackwardFiniteDifferences, OracleMatches) {
  Case c = testing::make_case(GetParam().spec, 31);
  check_case(c, 32);
}

INSTANTIATE_TEST_SUITE_P(Features, BackwardFiniteDifferences, ::testing::ValuesIn(fd_cases()),
                         [](const auto& info) { return info.param.name; });

// A bias broadcast over heads only ([B, 1, Tq, Tk]) and over batch only ([1, Hq, Tq, Tk]): dbias
// sums over exactly the broadcast dimension.
TEST(BackwardFiniteDifferencesBias, PartialBroadcasts) {
  for (auto [bb, bh] : {std::pair<std::int64_t, std::int64_t>{2, 1}, {1, 3}}) {
    CaseSpec s = shape(2, 5, 6, 3, 1, 4);
    s.causal = false;
    Case c = testing::make_case(s, 41);
    c.bias = testing::random_tensor(DType::f32, {bb, bh, 5, 6}, 42, -2.f, 2.f);
    c.options.bias = c.bias->view();
    check_case(c, 43);
  }
}

}  // namespace
}  // namespace attnops
