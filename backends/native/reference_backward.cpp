// The fp64 backward oracle (see reference_backward.h). Deliberately naive and independent of the
// kernels: masks come from the options as given (native::visible), not from a block map, and the
// forward is recomputed here rather than read from the residuals.
#include "backends/native/reference_backward.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/softmax_policy.h"
#include "backends/native/reference.h"

namespace attnops::native {

ReferenceGradients reference_backward_f64(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  const std::int64_t B = p.B, Tq = p.Tq, Tk = p.Tk, Hq = p.Hq, Hkv = p.Hkv, D = p.D, Dv = p.Dv, G = p.group();
  const std::vector<double> q = to_f64(p.q), k = to_f64(p.k), v = to_f64(p.v), dout = to_f64(bp.dout);
  ReferenceGradients g;
  g.dq.assign(static_cast<std::size_t>(B * Tq * Hq * D), 0.0);
  g.dk.assign(static_cast<std::size_t>(B * Tk * Hkv * D), 0.0);
  g.dv.assign(static_cast<std::size_t>(B * Tk * Hkv * Dv), 0.0);
  if (p.sinks) g.dsinks.assign(static_cast<std::size_t>(Hq), 0.0);
  if (p.bias) g.dbias.assign(static_cast<std::size_t>(bp.bias_B * bp.bias_H * Tq * Tk), 0.0);

  const double ninf = -std::numeric_limits<double>::infinity();
  const auto idx = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  // Per row: visibility, logits after cap and bias, tanh(x / cap), probabilities, dout . v_j.
  std::vector<char> vis(idx(Tk));
  std::vector<double> s(idx(Tk)), t(idx(Tk)), pr(idx(Tk)), o(idx(Dv));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kh = h / G;  // GQA: q head h reads kv head h / (Hq / Hkv)
      for (std::int64_t i = 0; i < Tq; ++i) {
        const double* qi = &q[idx(((b * Tq + i) * Hq + h) * D)];
        const double* gi = &dout[idx(((b * Tq + i) * Hq + h) * Dv)];
        // As the forward (reference.cpp): a -inf logit masks its key, a NaN max is kept, so a
        // row with a NaN or +inf logit has NaN gradients and a fully masked row none.
        double m = ninf;
        bool any = false;
        for (std::int64_t j = 0; j < Tk; ++j) {
          vis[idx(j)] = visible(p, b, h, i, j);
          if (!vis[idx(j)]) continue;
          const double* kj = &k[idx(((b * Tk + j) * Hkv + kh) * D)];
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
          double x = p.scale * dot;
          if (p.soft_cap) {
            t[idx(j)] = std::tanh(x / *p.soft_cap);
            x = *p.soft_cap * t[idx(j)];
          }
          if (p.bias) x += static_cast<double>(p.bias_row(b, h, i)[j]);
          if (x == ninf) {  // a masked pair: contributes nothing, even with NaN / inf operands
            vis[idx(j)] = 0;
            continue;
          }
          s[idx(j)] = x;
          m = policy::nan_max(m, x);
          any = true;
        }
        if (!any) continue;  // fully masked row: zero dq, nothing to dk, dv, dsinks, dbias
        // A +inf sink takes all the mass: the row's output is 0 whatever q, k and v are, so its
        // gradients are 0 and it adds nothing to dsinks (p_sink would be inf / inf here).
        if (p.sinks && p.sinks[h] == std::numeric_limits<float>::infinity()) continue;

        double denom = 0;
        for (std::int64_t j = 0; j < Tk; ++j)
          if (vis[idx(j)]) denom += std::exp(s[idx(j)] - m);
        const double sink_mass = p.sinks ? std::exp(static_cast<double>(p.sinks[h]) - m) : 0.0;
        denom += sink_mass;  // the sink takes probability mass and contributes no value
        std::fill(o.begin(), o.end(), 0.0);
        for (std::int64_t j = 0; j < Tk; ++j) {
          pr[idx(j)] = vis[idx(j)] ? std::exp(s[idx(j)] - m) / denom : 0.0;
          if (pr[idx(j)] == 0.0) continue;
          const double* vj = &v[idx(((b * Tk + j) * Hkv + kh) * Dv)];
          for (std::int64_t e = 0; e < Dv; ++e) o[idx(e)] += pr[idx(j)] * vj[e];
        }
        double Di = 0;  // dout_i . out_i
        for (std::int64_t e = 0; e < Dv; ++e) Di += gi[e] * o[idx(e)];
        if (p.sinks) g.dsinks[idx(h)] -= sink_mass / denom * Di;

        double* dqi = &g.dq[idx(((b * Tq + i) * Hq + h) * D)];
        for (std::int64_t j = 0; j < Tk; ++j) {
          if (!vis[idx(j)]) continue;
          const double* kj = &k[idx(((b * Tk + j) * Hkv + kh) * D)];
          const double* vj = &v[idx(((b * Tk + j) * Hkv + kh) * Dv)];
          double* dkj = &g.dk[idx(((b * Tk + j) * Hkv + kh) * D)];
          double* dvj = &g.dv[idx(((b * Tk + j) * Hkv + kh) * Dv)];
          double dp = 0;
          for (std::int64_t e = 0; e < Dv; ++e) dp += gi[e] * vj[e];
          const double ds = pr[idx(j)] * (dp - Di);
          if (p.bias) {
            const std::int64_t bb = bp.bias_B == 1 ? 0 : b, hb = bp.bias_H == 1 ? 0 : h;
            g.dbias[idx(((bb * bp.bias_H + hb) * Tq + i) * Tk + j)] += ds;
          }
          const double dx = p.soft_cap ? ds * (1.0 - t[idx(j)] * t[idx(j)]) : ds;
          for (std::int64_t d = 0; d < D; ++d) {
            dqi[d] += p.scale * dx * kj[d];
            dkj[d] += p.scale * dx * qi[d];
          }
          for (std::int64_t e = 0; e < Dv; ++e) dvj[e] += pr[idx(j)] * gi[e];
        }
      }
    }
  return g;
}

void reference_backward(const BackwardProblem& bp, GradientBuffers& grads) {
  const ReferenceGradients r = reference_backward_f64(bp);
  for (std::size_t i = 0; i < r.dq.size(); ++i) grads.dq.set(i, static_cast<float>(r.dq[i]));
  for (std::size_t i = 0; i < r.dk.size(); ++i) grads.dk.set(i, static_cast<float>(r.dk[i]));
  for (std::size_t i = 0; i < r.dv.size(); ++i) grads.dv.set(i, static_cast<float>(r.dv[i]));
  if (grads.dsinks)
    for (std::size_t i = 0; i < r.dsinks.size(); ++i) grads.dsinks->set(i, static_cast<float>(r.dsinks[i]));
  if (grads.dbias)
    for (std::size_t i = 0; i < r.dbias.size(); ++i) grads.dbias->set(i, static_cast<float>(r.dbias[i]));
}

}  // namespace attnops::native
