#include "tests/backward/grad_testing.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"

namespace attnops::testing {

double gradient_tolerance(DType t) {
  switch (t) {
    case DType::f16:
      return 4e-3;
    case DType::bf16:
      return 2.5e-2;
    default:
      return 4e-5;
  }
}

BackwardCase make_backward_case(const Case& c, std::int64_t bq, std::int64_t bk, std::uint64_t seed) {
  BackwardCase r;
  const AttentionProblem p = problem_for(c, bq, bk);
  AttentionProblem with_lse = p;
  with_lse.want_lse = true;
  r.forward = allocate_buffers(with_lse);
  native::reference_attention(with_lse, r.forward);
  r.dout = random_tensor(c.dtype, {c.B, c.Tq, c.Hq, c.Dv}, seed * 11 + 5);
  OperationMetadata md;
  md.blocksize_q = bq;
  md.blocksize_k = bk;
  r.bp = make_backward_problem(c.q, c.k, c.v, r.forward.out, *r.forward.lse, r.dout, c.options, md);
  return r;
}

namespace {

struct Named {
  const char* name;
  const Tensor* got;
  const std::vector<double>* want;
};

::testing::AssertionResult compare(const std::vector<Named>& grads, double tol) {
  std::ostringstream fail;
  for (const Named& g : grads) {
    if (g.got == nullptr) {
      if (!g.want->empty()) fail << g.name << ": missing; ";
      continue;
    }
    if (static_cast<std::size_t>(g.got->numel()) != g.want->size()) {
      fail << g.name << ": " << g.got->numel() << " elements, want " << g.want->size() << "; ";
      continue;
    }
    double scale = 1, worst = 0;
    std::size_t worst_i = 0;
    for (double w : *g.want) scale = std::max(scale, std::abs(w));
    for (std::size_t i = 0; i < g.want->size(); ++i) {
      const double v = g.got->at(i);
      const double e = std::isfinite(v) ? std::abs(v - (*g.want)[i]) : INFINITY;
      if (e > worst) worst = e, worst_i = i;
    }
    if (!(worst <= tol * scale))
      fail << g.name << ": max err " << worst << " > " << tol << " * " << scale << " at flat index "
           << worst_i << " (got " << g.got->at(worst_i) << ", want " << (*g.want)[worst_i] << "); ";
  }
  if (fail.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << fail.str();
}

}  // namespace

::testing::AssertionResult gradients_match(const BackwardProblem& bp, const native::ReferenceGradients& want,
                                           const GradientBuffers& got, std::optional<double> tol) {
  return compare({{"dq", &got.dq, &want.dq},
                  {"dk", &got.dk, &want.dk},
                  {"dv", &got.dv, &want.dv},
                  {"dsinks", got.dsinks ? &*got.dsinks : nullptr, &want.dsinks},
                  {"dbias", got.dbias ? &*got.dbias : nullptr, &want.dbias}},
                 tol.value_or(gradient_tolerance(bp.fwd.dtype)));
}

::testing::AssertionResult gradients_match(const BackwardProblem& bp, const native::ReferenceGradients& want,
                                           const AttentionGradients& got, std::optional<double> tol) {
  return compare({{"dq", &got.dq, &want.dq},
                  {"dk", &got.dk, &want.dk},
                  {"dv", &got.dv, &want.dv},
                  {"dsinks", got.dsinks ? &*got.dsinks : nullptr, &want.dsinks},
                  {"dbias", got.dbias ? &*got.dbias : nullptr, &want.dbias}},
                 tol.value_or(gradient_tolerance(bp.fwd.dtype)));
}

}  // namespace attnops::testing
