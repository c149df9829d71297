#include "attnops/dtype.h"

#include <cmath>

#include "attnops/kv_quant.h"

namespace attnops {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::i8: return 1;
    case DType::fp8_e4m3: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::i8: return "int8";
    case DType::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::i8, DType::fp8_e4m3})
    if (dtype_name(t) == s) return t;
  if (s == "i8") return DType::i8;
  if (s == "fp8") return DType::fp8_e4m3;
  return std::nullopt;
}

float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint16_t float_to_half_bits(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan
    return static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520 -> inf
  if (ax < 0x38800000u) {
    // Result is subnormal (or zero) in binary16: value / 2^-24, rounded to nearest even.
    if (ax < 0x33000000u) return sign;  // < 2^-25: rounds to 0
    const std::uint32_t e = ax >> 23;
    const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const int shift = static_cast<int>(126 - e);  // 14 + (113 - e) ... bits to drop from 24-bit mantissa
    // value = m * 2^(e-150); half subnormal unit = 2^-24 -> count = m * 2^(e-126) = m >> (126-e)
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  // Normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even.
  std::uint32_t r = ax - 0x38000000u;  // exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

float load_as_float(const void* data, DType t, std::size_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::f16: return half_bits_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::i32: return static_cast<float>(static_cast<const std::int32_t*>(data)[i]);
    case DType::i64: return static_cast<float>(static_cast<const std::int64_t*>(data)[i]);
    case DType::i8: return static_cast<float>(static_cast<const std::int8_t*>(data)[i]);
    case DType::fp8_e4m3: return fp8_e4m3_to_float(static_cast<const std::uint8_t*>(data)[i]);
  }
  return 0.f;
}

void store_from_float(void* data, DType t, std::size_t i, float v) {
  switch (t) {
    case DType::f32: static_cast<float*>(data)[i] = v; return;
    case DType::f16: static_cast<std::uint16_t*>(data)[i] = float_to_half_bits(v); return;
    case DType::bf16: static_cast<std::uint16_t*>(data)[i] = float_to_bf16_bits(v); return;
    case DType::i32: static_cast<std::int32_t*>(data)[i] = static_cast<std::int32_t>(v); return;
    case DType::i64: static_cast<std::int64_t*>(data)[i] = static_cast<std::int64_t>(v); return;
    case DType::i8: static_cast<std::int8_t*>(data)[i] = static_cast<std::int8_t>(int8_from_float(v)); return;
    case DType::fp8_e4m3: static_cast<std::uint8_t*>(data)[i] = fp8_e4m3_from_float(v); return;
  }
}

}  // namespace attnops
