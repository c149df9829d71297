// Per-row logit and softmax steps of VanillaAttn::forward_cpu (per-tier header, private to
// backends/cpu/vanilla_*.cpp).
//
// Both vanilla paths (materialised scores, decode streaming) turn raw scaled scores into
// probabilities with the same steps, in the order of the spec:
//   s = scale * q.k  ->  s = cap * tanh(s / cap)  ->  s += bias  ->  s = -inf where masked
//   (static mask, then segment ids)  ->  softmax over the visible columns plus the sink logit.
// A row with no visible column gives probabilities 0 (so output 0) and lse -inf, never NaN.
// Non-finite logits follow backends/common/softmax_policy.h: a NaN or +inf logit makes the row's
// probabilities, output and lse NaN (as exp(inf - inf) does), a -inf logit has probability 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attnops/ext/problem.h"
#include "backends/common/softmax_policy.h"
#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::vanilla {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The visible columns of one (q head, q row) under the static mask: all lie in [lo, hi); when
// `exact` they are exactly [lo, hi), otherwise Mask::visible decides per column inside it.
struct RowMask {
  i64 lo = 0, hi = 0;
  bool exact = true;
};

inline RowMask row_mask(const AttentionProblem& p, i64 hq, i64 i) {
  if (!p.has_mask()) return {0, p.Tk, true};
  if (auto iv = p.mask.row_interval(hq, i, p.Tq, p.Tk))
    return {iv->first, std::max(iv->first, iv->second), true};
  return {0, p.Tk, false};
}

// Final logits of row (b, hq, i) for columns [j0, j1): s[0 .. j1-j0) holds scale * q.k on entry.
// Soft cap and bias are evaluated only on columns the static mask can show (tanh is not free).
inline void finish_logits(const AttentionProblem& p, i64 b, i64 hq, i64 i, const RowMask& rm, i64 j0, i64 j1,
                          float* s) {
  const i64 a = std::clamp(rm.lo, j0, j1), e = std::clamp(rm.hi, a, j1);
  std::fill(s, s + (a - j0), kNegInf);
  std::fill(s + (e - j0), s + (j1 - j0), kNegInf);
  if (e <= a) return;
  float* sv = s + (a - j0);
  const i64 n = e - a;
  if (p.soft_cap) {
    const float cap = static_cast<float>(*p.soft_cap);
    const simd::V16 capv = simd::set1(cap), inv = simd::set1(1.f / cap);
    for (i64 j = 0; j < n; j += 16) {
      const int w = lanes_left(n - j);
      simd::store_n(sv + j, simd::mul(capv, simd::tanh(simd::mul(simd::load_n(sv + j, w), inv))), w);
    }
  }
  if (p.bias) {
    const float* bias = p.bias_row(b, hq, i) + a;
    for (i64 j = 0; j < n; j += 16) {
      const int w = lanes_left(n - j);
      simd::store_n(sv + j, simd::add(simd::load_n(sv + j, w), simd::load_n(bias + j, w)), w);
    }
  }
  if (!rm.exact) {
    for (i64 j = a; j < e; ++j)
      if (!p.mask.visible(hq, i, j, p.Tq, p.Tk)) sv[j - a] = kNegInf;
  }
  if (p.seg_q) {
    const std::int32_t sq = p.seg_q[b * p.Tq + i];
    const std::int32_t* sk = p.seg_kv + b * p.Tk;
    for (i64 j = a; j < e; ++j)
      if (sk[j] != sq) sv[j - a] = kNegInf;
  }
}

// max over s[0..n) (-inf for n == 0). It may skip a NaN (vector max returns its second operand
// when either is NaN): callers carry NaN through exp_shift_sum, and check any_nan when the max
// came out -inf.
inline float row_max(const float* s, i64 n) {
  simd::V16 m = simd::set1(kNegInf);
  for (i64 j = 0; j < n; j += 16) {
    const int w = lanes_left(n - j);
    m = simd::max(m, simd::select(first_lanes(w), simd::load_n(s + j, w), simd::set1(kNegInf)));
  }
  return simd::reduce_max(m);
}

// Whether any of s[0..n) is NaN (only asked on the rare paths below).
inline bool any_nan(const float* s, i64 n) {
  for (i64 j = 0; j < n; ++j)
    if (s[j] != s[j]) return true;
  return false;
}

// s[0..n) *= f.
inline void scale_row(float* s, i64 n, float f) {
  const simd::V16 fv = simd::set1(f);
  for (i64 j = 0; j < n; j += 16) {
    const int w = lanes_left(n - j);
    simd::store_n(s + j, simd::mul(simd::load_n(s + j, w), fv), w);
  }
}

// Softmax of one fully materialised row in place (sink: the q head's sink logit or null).
// Returns the row's lse = log(sum over visible keys of exp(s)): the sink joins the normaliser of
// the probabilities but not the lse (as the oracle defines it). A fully masked row becomes all
// zeros with lse -inf, sink or not. The shift is the visible max, so a sink far above every
// logit cannot flush the lse to -inf; exp(sink - m) overflowing only drives the weights to 0,
// which is their limit.
inline float softmax_row(float* s, i64 n, const float* sink) {
  const float m = row_max(s, n);
  if (m == kNegInf && !any_nan(s, n)) {
    std::fill(s, s + n, 0.f);
    return kNegInf;
  }
  if (!std::isfinite(m)) {  // a NaN or +inf logit: the whole row is NaN
    std::fill(s, s + n, std::numeric_limits<float>::quiet_NaN());
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float l = exp_shift_sum(s, n, m);  // NaN when a NaN logit hid from the max
  scale_row(s, n, policy::row_factor(m, l, sink));
  return policy::row_lse(m, l);
}

// Online-softmax state of one row over a stream of kv blocks (decode path): running max m,
// running sum l of exp(s - m), and the unnormalised output acc [Dv].
struct OnlineRow {
  float m = kNegInf;
  float l = 0.f;
};

// Folds one block of final logits s[0..n) into (st, acc): s becomes exp(s - m_new) (0 where
// masked) for the P.V step, acc and l are rescaled to the new max.
// A NaN or +inf logit makes the row NaN for good (m, l and acc NaN; the merge keeps NaN); a NaN
// the max skipped reaches l and acc through exp_shift_sum and P.V.
inline void online_update(float* s, i64 n, OnlineRow& st, float* acc, i64 Dv) {
  float bm = row_max(s, n);
  if (bm == kNegInf) {
    if (!any_nan(s, n)) {  // nothing visible in this block
      std::fill(s, s + n, 0.f);
      return;
    }
    bm = std::numeric_limits<float>::quiet_NaN();
  }
  if (!std::isfinite(bm) || std::isnan(st.m)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    st.m = st.l = nan;
    std::fill(acc, acc + Dv, nan);
    std::fill(s, s + n, 0.f);  // acc is NaN already; P.V must not fold anything else in
    return;
  }
  const float mn = std::max(st.m, bm);
  const float corr = std::exp(st.m - mn);  // 0 on the first visible block (st.m == -inf)
  const float sum = exp_shift_sum(s, n, mn);
  if (corr != 1.f) {
    st.l *= corr;
    scale_row(acc, Dv, corr);
  }
  st.l += sum;
  st.m = mn;
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::vanilla
