#include "lse_merge.h"

#include <cmath>
#include <limits>

#include "attnops/error.h"

namespace attnops::dist::detail {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

RowState::RowState(std::int64_t B, std::int64_t rows, std::int64_t Hq, std::int64_t Dv)
    : B_(B),
      rows_(rows),
      Hq_(Hq),
      Dv_(Dv),
      out_(DType::f32, {B, rows, Hq, Dv}),
      lse_(DType::f32, {B, Hq, rows}) {
  float* l = lse_.data_as<float>();
  for (std::int64_t i = 0; i < lse_.numel(); ++i) l[i] = kNegInf;
}

void RowState::merge(std::int64_t r0, const Tensor& out_in, const Tensor& lse, int threads) {
  const Tensor out = out_in.dtype() == DType::f32 ? out_in : Tensor::copy_of(out_in, DType::f32);
  const std::int64_t n = out.dim(1);
  if (out.dim(0) != B_ || out.dim(2) != Hq_ || out.dim(3) != Dv_ || r0 < 0 || r0 + n > rows_ ||
      lse.dtype() != DType::f32 || lse.dim(2) != n)
    throw Error(ErrorCode::internal, "RowState::merge: a block result of the wrong shape");
  const float* lb = lse.data_as<float>();
  float* la = lse_.data_as<float>();
  float* oa = out_.data_as<float>();
  const float* ob = out.data_as<float>();
  const std::int64_t tasks = B_ * n;
#pragma omp parallel for num_threads(threads) schedule(static) if (tasks * Hq_ * Dv_ > (1 << 16))
  for (std::int64_t t = 0; t < tasks; ++t) {
    const std::int64_t b = t / n, i = t % n;
    for (std::int64_t h = 0; h < Hq_; ++h) {
      const float l = lb[(b * Hq_ + h) * n + i];
      if (l == kNegInf) continue;  // the block holds no key this row sees
      float& a = la[(b * Hq_ + h) * rows_ + r0 + i];
      float* acc = oa + ((b * rows_ + r0 + i) * Hq_ + h) * Dv_;
      const float* blk = ob + ((b * n + i) * Hq_ + h) * Dv_;
      if (a == kNegInf) {  // the first block this row sees
        for (std::int64_t e = 0; e < Dv_; ++e) acc[e] = blk[e];
        a = l;
        continue;
      }
      // The two weights, sigmoid(a - l) and sigmoid(l - a), each from its own exp so that neither
      // is 1 - the other: a weight that is 0 in fp32 adds nothing (not 0 x inf = NaN: an infinite
      // value in one part stays infinite, README Non-finite values), and NaN propagates.
      const float d = l - a;
      float wa, wb;
      if (d > 0) {
        const float x = std::exp(-d);
        wa = x / (1.f + x), wb = 1.f / (1.f + x);
        a = l + std::log1p(x);
      } else {
        const float x = std::exp(d);
        wa = 1.f / (1.f + x), wb = x / (1.f + x);
        a = a + std::log1p(x);
      }
      for (std::int64_t e = 0; e < Dv_; ++e) {
        const float x = wa == 0.f ? 0.f : wa * acc[e], y = wb == 0.f ? 0.f : wb * blk[e];
        acc[e] = x + y;
      }
    }
  }
}

void RowState::fold_sinks(const float* sinks) {
  if (!sinks) return;
  const float* l = lse_.data_as<float>();
  float* o = out_.data_as<float>();
  for (std::int64_t b = 0; b < B_; ++b)
    for (std::int64_t i = 0; i < rows_; ++i)
      for (std::int64_t h = 0; h < Hq_; ++h) {
        const float a = l[(b * Hq_ + h) * rows_ + i];
        if (a == kNegInf) continue;  // a row that sees no key: out 0 whatever the sink
        const float f = 1.f / (1.f + std::exp(sinks[h] - a));
        float* acc = o + ((b * rows_ + i) * Hq_ + h) * Dv_;
        // A sink that takes all the mass (f = 0: a +inf sink) leaves out 0, even where the keys'
        // part holds an infinity or a NaN from v (as the one-process kernels).
        for (std::int64_t e = 0; e < Dv_; ++e) acc[e] = f == 0.f ? 0.f : acc[e] * f;
      }
}

Tensor RowState::out(DType dtype) const {
  return dtype == DType::f32 ? out_ : Tensor::copy_of(out_, dtype);
}

Tensor lse_with_sinks(const TensorView& lse, const float* sinks) {
  Tensor r = Tensor::copy_of(lse, DType::f32);
  if (!sinks) return r;
  float* l = r.data_as<float>();
  const std::int64_t B = r.dim(0), H = r.dim(1), T = r.dim(2);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        float& a = l[(b * H + h) * T + i];
        const float s = sinks[h];
        if (a == kNegInf) {
          a = s;             // nothing visible: only the sink (the row's gradients are zero either way)
        } else if (s > a) {  // logaddexp(a, s), also for s = +inf (-> +inf) and NaN (-> NaN)
          a = s + std::log1p(std::exp(a - s));
        } else {
          a = a + std::log1p(std::exp(s - a));
        }
      }
  return r;
}

}  // namespace attnops::dist::detail
