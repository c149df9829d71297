#include "verify/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "attnops/ext/problem.h"

namespace attnops::verify {

namespace {

using i64 = std::int64_t;

// Max over rows of the Euclidean norm of a BTHD view's rows (finite elements), and max |x|.
struct RowStats {
  double max_norm = 0, max_abs = 0;
};
RowStats row_stats(const TensorView& t) {
  RowStats r;
  if (t.empty() || t.numel() == 0) return r;
  for (i64 b = 0; b < t.dim(0); ++b)
    for (i64 i = 0; i < t.dim(1); ++i)
      for (i64 h = 0; h < t.dim(2); ++h) {
        const i64 base = t.offset({b, i, h, 0});
        double ss = 0;
        for (i64 d = 0; d < t.dim(3); ++d) {
          const double x = load_as_float(t.data(), t.dtype(), static_cast<std::size_t>(base + d));
          if (!std::isfinite(x)) continue;
          ss += x * x;
          r.max_abs = std::max(r.max_abs, std::abs(x));
        }
        r.max_norm = std::max(r.max_norm, std::sqrt(ss));
      }
  return r;
}

enum class Cls { nan, pos_inf, neg_inf, finite };
Cls classify(double x) {
  if (std::isnan(x)) return Cls::nan;
  if (std::isinf(x)) return x > 0 ? Cls::pos_inf : Cls::neg_inf;
  return Cls::finite;
}

std::string num(double x) {
  std::ostringstream os;
  os.precision(6);
  os << x;
  return os.str();
}

}  // namespace

Tolerance base_tolerance(DType t) {
  switch (t) {
    case DType::f16:
      return {2e-3, 1e-3, 4e-3};
    case DType::bf16:
      return {1.6e-2, 1e-3, 2.5e-2};
    default:
      return {2e-5, 1e-4, 4e-5};
  }
}

namespace {

// A bound on |logit| (Cauchy-Schwarz over q and k rows, the soft cap, the bias).
// `capped`: after the soft cap (the logits' size); else before it (what an error in q . k scales with).
double logit_bound(const AttentionProblem& p, const RowStats& q, const RowStats& k, bool capped = true) {
  double L = std::abs(p.scale) * q.max_norm * k.max_norm;
  if (p.soft_cap && capped) L = std::min(L, *p.soft_cap);
  if (p.bias != nullptr) {
    double bmax = 0;
    for (i64 b = 0; b < (p.bias_stride_b ? p.B : 1); ++b)
      for (i64 h = 0; h < (p.bias_stride_h ? p.Hq : 1); ++h)
        for (i64 i = 0; i < p.Tq; ++i) {
          const float* row = p.bias_row(b, h, i);
          for (i64 j = 0; j < p.Tk; ++j)
            if (std::isfinite(row[j])) bmax = std::max(bmax, static_cast<double>(std::abs(row[j])));
        }
    L += bmax;
  }
  return L;
}

}  // namespace

Tolerance rounded_kv_tolerance(const AttentionProblem& p, DType dtype) {
  const double u = dtype == DType::f16 ? 0x1p-11 : dtype == DType::bf16 ? 0x1p-8 : 0;
  if (u == 0) return {};
  const RowStats q = row_stats(p.q), k = row_stats(p.k), v = row_stats(p.v);
  // The rounding moves q . k before the soft cap, which then shrinks the move (tanh' <= 1) but
  // never past 2 cap.
  double d = u * logit_bound(p, q, k, false);
  if (p.soft_cap) d = std::min(d, 2 * *p.soft_cap);
  return {(std::expm1(2 * d) + u) * std::max(1.0, v.max_abs), d, 0};
}

Tolerance problem_tolerance(const AttentionProblem& p, std::optional<DType> out_dtype) {
  Tolerance t = base_tolerance(out_dtype.value_or(p.dtype));
  const RowStats q = row_stats(p.q), k = row_stats(p.k), v = row_stats(p.v);
  const double L = logit_bound(p, q, k);
  // Forward: the dtype's own tolerance (its rounding of out, and of P on the bf16 paths) plus the
  // fp32 logits' rounding error, which grows with the logits whatever the storage dtype.
  // Backward: the residuals out and dout are stored in the dtype, and D = dout . out carries their
  // rounding into dS = P (dP - D), scaled by q or k (as large as the logits): the dtype's
  // tolerance grows with L, and with Dv.
  const Tolerance f32 = base_tolerance(DType::f32);
  const double f = L / 16;
  t.out = (t.out + f32.out * f) * std::max(1.0, v.max_abs);
  t.lse += f32.lse * f;
  // D sums Dv products: its rounding grows as sqrt(Dv), beyond the tests' head dims of up to 128.
  t.grad *= (1 + f) * std::sqrt(std::max(1.0, static_cast<double>(p.Dv) / 128));
  return t;
}

std::string Mismatch::line() const {
  std::ostringstream os;
  os << what << ": ";
  if (tol > 0 || err > 0) os << "max err " << num(err) << " > tol " << num(tol);
  if (!where.empty()) os << (tol > 0 || err > 0 ? " at " : "") << where;
  return os.str();
}

std::string index_text(i64 flat, const std::vector<i64>& shape, const char* names) {
  std::vector<i64> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    const i64 n = std::max<i64>(1, shape[d]);
    idx[d] = flat % n;
    flat /= n;
  }
  std::ostringstream os;
  os << "[";
  for (std::size_t d = 0; d < idx.size(); ++d)
    os << (d ? ", " : "") << (d < std::strlen(names) ? std::string(1, names[d]) + "=" : "") << idx[d];
  os << "]";
  return os.str();
}

std::optional<Mismatch> compare_values(const std::string& name, const Tensor& got,
                                       const std::vector<double>& want, const std::vector<i64>& shape,
                                       double tol, bool relative_to_max) {
  if (static_cast<std::size_t>(got.numel()) != want.size()) {
    return Mismatch{name, std::numeric_limits<double>::infinity(), tol,
                    std::to_string(got.numel()) + " elements " + shape_string(got.shape()) +
                        ", the oracle has " + std::to_string(want.size())};
  }
  double scale = 1;
  if (relative_to_max)
    for (double w : want)
      if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  const double bound = tol * scale;
  double worst = 0;
  i64 worst_i = -1;
  bool class_wrong = false;
  const char* names = name == "lse"                          ? "bhi"
                      : name == "dsinks"                     ? "h"
                      : name == "weights" || name == "dbias" ? "bhij"
                                                             : "bihd";
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got.at(i), w = want[i];
    const Cls cg = classify(g), cw = classify(w);
    if (cg != cw) {
      if (!class_wrong) worst_i = static_cast<i64>(i);
      class_wrong = true;
      worst = std::numeric_limits<double>::infinity();
      continue;
    }
    if (cg != Cls::finite || class_wrong) continue;
    const double e = std::abs(g - w);
    if (e > worst) worst = e, worst_i = static_cast<i64>(i);
  }
  if (!class_wrong && worst <= bound) return std::nullopt;
  Mismatch m{name, worst, bound, ""};
  const std::size_t u = static_cast<std::size_t>(worst_i);
  m.where =
      name + index_text(worst_i, shape, names) + " = " + num(got.at(u)) + " (oracle " + num(want[u]) + ")";
  if (class_wrong) m.where += ": the oracle's class (NaN, +inf, -inf, finite) differs";
  return m;
}

std::optional<Mismatch> compare_bitwise(const std::string& name, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return Mismatch{name, 0, 0, "shapes " + shape_string(a.shape()) + " vs " + shape_string(b.shape())};
  if (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0) return std::nullopt;
  const std::size_t n = static_cast<std::size_t>(a.numel()), es = dtype_size(a.dtype());
  std::size_t first = 0, count = 0;
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(a.data()) + i * es, static_cast<const char*>(b.data()) + i * es,
                    es) == 0)
      continue;
    if (count++ == 0) first = i;
    const double d = std::abs(static_cast<double>(a.at(i)) - b.at(i));
    worst = std::isnan(d) ? worst : std::max(worst, d);
  }
  return Mismatch{name, worst, 0,
                  std::to_string(count) + " of " + std::to_string(n) + " elements differ bitwise, first " +
                      name + index_text(static_cast<i64>(first), a.shape()) + ": " + num(a.at(first)) +
                      " vs " + num(b.at(first))};
}

std::optional<Mismatch> compare_bitwise_rows(const std::string& name, const Tensor& whole, i64 row0,
                                             const Tensor& part) {
  if (whole.rank() != part.rank() || whole.dtype() != part.dtype() || row0 + part.dim(0) > whole.dim(0))
    return Mismatch{name, 0, 0,
                    "shapes " + shape_string(whole.shape()) + " vs " + shape_string(part.shape())};
  const std::size_t row_bytes = part.dim(0) > 0 ? part.nbytes() / static_cast<std::size_t>(part.dim(0)) : 0;
  const char* w = static_cast<const char*>(whole.data()) + static_cast<std::size_t>(row0) * row_bytes;
  for (i64 r = 0; r < part.dim(0); ++r) {
    const std::size_t off = static_cast<std::size_t>(r) * row_bytes;
    if (std::memcmp(w + off, static_cast<const char*>(part.data()) + off, row_bytes) != 0)
      return Mismatch{
          name, 0, 0,
          "row " + std::to_string(row0 + r) + " differs bitwise between the batch and the sequence alone"};
  }
  return std::nullopt;
}

}  // namespace attnops::verify
