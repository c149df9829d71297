// The 8-bit KV conversions of kv_quant.h, scalar and bit-exact (the reference every kernel and
// test meets).
#include "attnops/kv_quant.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace attnops {

namespace {
std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
}  // namespace

float kv_code_max(DType t) {
  return t == DType::i8 ? kInt8KvMax : t == DType::fp8_e4m3 ? kFp8E4m3Max : 0.f;
}

float fp8_e4m3_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t e = (b >> 3) & 15u, m = b & 7u;
  if (e == 15u && m == 7u) return float_of(sign | 0x7fc00000u);
  if (e == 0u) return float_of(sign | bits_of(static_cast<float>(m) * (1.f / 512.f)));  // m x 2^-9
  return float_of(sign | ((e + 120u) << 23) | (m << 20));
}

std::uint8_t fp8_e4m3_from_float(float x) {
  const std::uint32_t u = bits_of(x);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint8_t>(sign | kFp8E4m3NaN);
  if (a >= 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7eu);  // >= 448 (inf too): saturate
  if (a < 0x3c800000u) {  // below 2^-6, the smallest normal: multiples of 2^-9 (8 x 2^-9 is 2^-6)
    const float units = std::nearbyint(std::fabs(x) * 512.f);  // exact scaling, then ties to even
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(units));
  }
  a += 0x7ffffu + ((a >> 20) & 1u);              // the mantissa to 3 bits, ties to even
  std::uint32_t code = (a >> 20) - (120u << 3);  // exponent bias 127 -> 7
  if (code > 0x7eu) code = 0x7eu;                // rounded up past 448
  return static_cast<std::uint8_t>(sign | code);
}

std::int8_t int8_from_float(float x) {
  if (std::isnan(x)) return 0;
  const float r = std::nearbyint(x);
  return static_cast<std::int8_t>(r > kInt8KvMax ? kInt8KvMax : r < -kInt8KvMax ? -kInt8KvMax : r);
}

std::uint8_t kv_quantize(DType t, float x, float s) {
  const float y = x / s;
  if (t == DType::i8) return static_cast<std::uint8_t>(int8_from_float(y));
  return fp8_e4m3_from_float(y);
}

float kv_dequantize(DType t, std::uint8_t code, float s) {
  if (t == DType::i8) return static_cast<float>(static_cast<std::int8_t>(code)) * s;
  return fp8_e4m3_to_float(code) * s;
}

float kv_row_scale(DType t, float absmax) {
  const float s = absmax / kv_code_max(t);
  return s >= std::numeric_limits<float>::min() ? s : 1.f;
}

bool kv_scale_valid(DType t, float s) {
  return std::isfinite(s) && s >= std::numeric_limits<float>::min() && std::isfinite(s * kv_code_max(t));
}

}  // namespace attnops
