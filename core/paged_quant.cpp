#include "core/paged_quant.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "attnops/error.h"
#include "attnops/kv_quant.h"

namespace attnops::paged_quant {

namespace {
using i64 = std::int64_t;

std::string number(float x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(x));
  return b;
}
}  // namespace

void check_scales(const TensorView& s, DType t, const char* name) {
  const i64 n = s.numel();
  std::vector<i64> idx(static_cast<std::size_t>(s.rank()), 0);
  const float* base = s.data_as<float>();
  for (i64 o = 0; o < n; ++o) {
    i64 off = 0;
    for (int i = 0; i < s.rank(); ++i) off += idx[static_cast<std::size_t>(i)] * s.stride(i);
    const float x = base[off];
    if (!kv_scale_valid(t, x)) {
      std::string at;
      for (int i = 0; i < s.rank(); ++i)
        at += (i ? ", " : "") + std::to_string(idx[static_cast<std::size_t>(i)]);
      throw Error(ErrorCode::invalid_argument,
                  std::string(name) + ": scale [" + at + "] is " + number(x) + "; a scale of an " +
                      std::string(dtype_name(t)) +
                      " cache must be a normal f32 number > 0 whose product with the largest code (" +
                      number(kv_code_max(t)) + ") is finite (0, negative, NaN and inf are not)");
    }
    for (int i = s.rank() - 1; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < s.dim(i)) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
  }
}

Rows quantize(const TensorView& x, const char* name, DType t, const float* tensor_scale,
              const std::vector<std::int64_t>& slots) {
  const i64 N = x.dim(0), H = x.dim(1), Dh = x.dim(2);
  Rows r{Tensor(t, {N, H, Dh}), Tensor(DType::f32, {N, H, 1})};
  auto* codes = static_cast<std::uint8_t*>(r.codes.data());
  float* scales = r.scales.data_as<float>();
  std::vector<float> row(static_cast<std::size_t>(Dh));
  const i64 es = static_cast<i64>(dtype_size(x.dtype()));
  const auto* src = static_cast<const char*>(x.data());
  for (i64 n = 0; n < N; ++n) {
    if (slots[static_cast<std::size_t>(n)] < 0) continue;
    for (i64 h = 0; h < H; ++h) {
      const char* p = src + (n * x.stride(0) + h * x.stride(1)) * es;
      float amax = 0.f;
      for (i64 e = 0; e < Dh; ++e) {
        const float v = load_as_float(p, x.dtype(), static_cast<std::size_t>(e * x.stride(2)));
        row[static_cast<std::size_t>(e)] = v;
        amax = std::fmax(amax, std::fabs(v));
        if (!std::isfinite(v))
          throw Error(ErrorCode::invalid_argument,
                      std::string(name) + ": row " + std::to_string(n) + ", kv head " + std::to_string(h) +
                          " holds " + number(v) + " at element " + std::to_string(e) + "; an " +
                          std::string(dtype_name(t)) +
                          " cache quantizes rows of finite values only (nothing was written)");
      }
      const float s = tensor_scale ? *tensor_scale : kv_row_scale(t, amax);
      scales[n * H + h] = s;
      std::uint8_t* c = codes + (n * H + h) * Dh;
      for (i64 e = 0; e < Dh; ++e) c[e] = kv_quantize(t, row[static_cast<std::size_t>(e)], s);
    }
  }
  return r;
}

Tensor dequantize(const Tensor& codes, DType t, const Tensor* token_scales, float tensor_scale) {
  Tensor out(DType::f32, codes.shape());
  const i64 T = codes.dim(1), H = codes.dim(2), Dh = codes.dim(3);
  const auto* c = static_cast<const std::uint8_t*>(codes.data());
  float* o = out.data_as<float>();
  // The f32 value of each code, once (kv_dequantize(t, code, 1) is exact).
  float value[256];
  for (int b = 0; b < 256; ++b) value[b] = kv_dequantize(t, static_cast<std::uint8_t>(b), 1.f);
  for (i64 j = 0; j < T * H; ++j) {
    const float s = token_scales ? token_scales->data_as<float>()[j] : tensor_scale;
    for (i64 e = 0; e < Dh; ++e) o[j * Dh + e] = value[c[j * Dh + e]] * s;
  }
  return out;
}

}  // namespace attnops::paged_quant
