// The fp64 oracle. Deliberately naive and independent of the kernels: it evaluates the mask
// semantics from the options as given (causal, window, chunk, user mask, segments), not from
// the combined Mask or a block map, so a bug there cannot hide in both.
#include "backends/native/reference.h"

#include <cmath>
#include <limits>

#include "attnops/ext/problem.h"
#include "backends/common/softmax_policy.h"

namespace attnops::native {

namespace {

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

}  // namespace

std::vector<double> to_f64(const TensorView& t) {
  const std::int64_t B = t.dim(0), T = t.dim(1), H = t.dim(2), D = t.dim(3);
  std::vector<double> r(static_cast<std::size_t>(B * T * H * D));
  std::size_t o = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          r[o++] = load_as_float(t.data(), t.dtype(), static_cast<std::size_t>(t.offset({b, i, h, d})));
  return r;
}

bool visible(const AttentionProblem& p, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const std::int64_t pos = i + p.Tk - p.Tq;  // bottom-right alignment
  if (p.causal && j > pos) return false;
  if (p.window && (j < pos - p.window->left || j > pos + p.window->right)) return false;
  if (p.chunk && (j > pos || floor_div(j, *p.chunk) != floor_div(pos, *p.chunk))) return false;
  if (p.user_mask && !p.user_mask->visible(h, i, j, p.Tq, p.Tk)) return false;
  if (p.seg_q && p.seg_q[b * p.Tq + i] != p.seg_kv[b * p.Tk + j]) return false;
  return true;
}

ReferenceResult reference_attention_f64(const AttentionProblem& p, bool want_weights) {
  const std::int64_t B = p.B, Tq = p.Tq, Tk = p.Tk, Hq = p.Hq, D = p.D, Dv = p.Dv, G = p.group();
  const std::int64_t Hkv = p.Hkv;
  const std::vector<double> q = to_f64(p.q), k = to_f64(p.k), v = to_f64(p.v);
  ReferenceResult r;
  r.out.assign(static_cast<std::size_t>(B * Tq * Hq * Dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(B * Hq * Tq), -std::numeric_limits<double>::infinity());
  if (want_weights) r.weights.assign(static_cast<std::size_t>(B * Hq * Tq * Tk), 0.0);
  std::vector<double> s(static_cast<std::size_t>(Tk));
  std::vector<char> vis(static_cast<std::size_t>(Tk));
  const double ninf = -std::numeric_limits<double>::infinity();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t kh = h / G;  // GQA: q head h reads kv head h / (Hq / Hkv)
      for (std::int64_t i = 0; i < Tq; ++i) {
        const double* qi = &q[static_cast<std::size_t>(((b * Tq + i) * Hq + h) * D)];
        // The non-finite policy (backends/common/softmax_policy.h): a -inf logit is a mask, NaN
        // and +inf propagate (nan_max keeps a NaN max), weight-0 keys add nothing.
        double m = ninf;
        bool any = false;
        for (std::int64_t j = 0; j < Tk; ++j) {
          char& vj = vis[static_cast<std::size_t>(j)];
          vj = visible(p, b, h, i, j);
          if (!vj) continue;
          const double* kj = &k[static_cast<std::size_t>(((b * Tk + j) * Hkv + kh) * D)];
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
          double x = p.scale * dot;
          if (p.soft_cap) x = *p.soft_cap * std::tanh(x / *p.soft_cap);
          if (p.bias) x += static_cast<double>(p.bias_row(b, h, i)[j]);
          if (x == ninf) {  // a -inf logit masks its key
            vj = 0;
            continue;
          }
          s[static_cast<std::size_t>(j)] = x;
          m = policy::nan_max(m, x);
          any = true;
        }
        if (!any) continue;  // fully masked row: out 0, lse -inf
        double l = 0;        // sum over visible keys, relative to m
        for (std::int64_t j = 0; j < Tk; ++j)
          if (vis[static_cast<std::size_t>(j)]) l += std::exp(s[static_cast<std::size_t>(j)] - m);
        r.lse[static_cast<std::size_t>((b * Hq + h) * Tq + i)] = policy::row_lse(m, l);
        // The sink takes probability mass (denominator) without value.
        const double factor = policy::row_factor(m, l, p.sinks ? p.sinks + h : nullptr);
        double* oi = &r.out[static_cast<std::size_t>(((b * Tq + i) * Hq + h) * Dv)];
        for (std::int64_t j = 0; j < Tk; ++j) {
          if (!vis[static_cast<std::size_t>(j)]) continue;
          const double w = std::exp(s[static_cast<std::size_t>(j)] - m) * factor;
          if (want_weights) r.weights[static_cast<std::size_t>(((b * Hq + h) * Tq + i) * Tk + j)] = w;
          if (w == 0) continue;  // weight 0 adds nothing, even a NaN / inf value
          const double* vj = &v[static_cast<std::size_t>(((b * Tk + j) * Hkv + kh) * Dv)];
          for (std::int64_t d = 0; d < Dv; ++d) oi[d] += w * vj[d];
        }
      }
    }
  return r;
}

void reference_attention(const AttentionProblem& p, AttentionBuffers& buffers) {
  const ReferenceResult r = reference_attention_f64(p, buffers.weights.has_value());
  for (std::size_t i = 0; i < r.out.size(); ++i) buffers.out.set(i, static_cast<float>(r.out[i]));
  if (buffers.lse)
    for (std::size_t i = 0; i < r.lse.size(); ++i)
      buffers.lse->data_as<float>()[i] = static_cast<float>(r.lse[i]);
  if (buffers.weights)
    for (std::size_t i = 0; i < r.weights.size(); ++i)
      buffers.weights->data_as<float>()[i] = static_cast<float>(r.weights[i]);
}

}  // namespace attnops::native
