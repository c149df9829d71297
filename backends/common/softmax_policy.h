// The non-finite policy (README, "Non-finite values") in scalar form, shared by the kernels'
// softmax steps and the fp64 oracle, so that every backend finishes a row the same way:
//  - NaN or inf in q, k, v, bias or sinks propagates as IEEE arithmetic does (as in PyTorch):
//    a NaN logit, or a +inf one (exp(inf - inf)), makes its row NaN, output and lse;
//  - a logit of -inf is a mask: that key gets weight 0; a row whose every logit is -inf (or that
//    the mask hides entirely) is fully masked: output 0, lse -inf;
//  - a key of weight 0 contributes nothing, even when its v holds NaN or inf (0 x inf is skipped,
//    not computed);
//  - the sink joins the denominator only: a sink of +inf takes all the mass (output 0, lse as
//    without the sink), a NaN sink makes the output NaN.
//
// Included by baseline code (namespace attnops::policy) and by the CPU's per-tier kernel sources
// (backends/cpu/README.md), where it lands in the tier's namespace, attnops::cpu::<tier>::policy:
// its templates are then private to each tier's objects, never link-once code shared between an
// AVX-512 object and a baseline caller. Code inside either namespace writes `policy::...`.
#pragma once

#include <cmath>
#include <limits>

#if defined(ATTNOPS_TIER_NS)
namespace attnops::cpu::ATTNOPS_TIER_NS::policy {
#else
namespace attnops::policy {
#endif

// max(a, b) that returns NaN when either is NaN (std::max and vmaxps drop a NaN operand).
template <class T>
inline T nan_max(T a, T b) {
  return (a > b || a != a) ? a : b;
}

// The factor that turns a row's unnormalised accumulator into its output: out = acc * factor.
// m: the max of the row's visible logits, l: sum of exp(s - m) over them, sink: the q head's
// sink logit or null. A fully masked row (l == 0) gives 0. With a sink the denominator is
// l + exp(sink - m), evaluated relative to max(m, sink) so that neither exponential overflows
// (a +inf sink then gives exactly 0 instead of inf / inf).
template <class T>
inline T row_factor(T m, T l, const float* sink) {
  if (l == T(0)) return T(0);
  if (!sink) return T(1) / l;
  const T s = static_cast<T>(*sink);
  if (s > m) {
    const T e = std::exp(m - s);
    return e / (l * e + T(1));
  }
  return T(1) / (l + std::exp(s - m));  // NaN sink or NaN m: NaN
}

// One output element: acc * factor, except that a factor of 0 (a fully masked row, or a +inf
// sink that takes all the mass) gives 0 whatever the accumulator holds: every key of the row has
// weight 0, so an infinity or NaN in a value (0 x inf) adds nothing, as in the oracle.
template <class T>
inline T scaled_out(T acc, T factor) {
  return factor == T(0) ? T(0) : acc * factor;
}

// lse of a row: log sum over the visible keys of exp(s) (the sink is not part of it); -inf for
// a fully masked row.
template <class T>
inline T row_lse(T m, T l) {
  return l == T(0) ? -std::numeric_limits<T>::infinity() : m + std::log(l);
}

}  // namespace attnops::policy (or the tier's policy namespace)
