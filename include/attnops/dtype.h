// Storage dtypes and scalar conversions.
//
// attnops stores tensors as f32, f16 (IEEE binary16) or bf16 (bfloat16); segment ids are i32
// (i64 is accepted at the API and narrowed). The 8-bit dtypes int8 (signed) and fp8_e4m3 (OCP
// e4m3fn bit patterns) exist only for the pages of a quantized KV cache (paged.h, kv_quant.h). All arithmetic accumulates in fp32 (the oracle in
// fp64). The conversions here are the portable scalar ones; kernels may use F16C / AVX-512 BF16
// where the CPU has them, and must agree bit-for-bit with these (round to nearest even).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace Eigen {
struct half;
struct bfloat16;
}  // namespace Eigen

namespace attnops {

enum class DType : std::uint8_t { f32, f16, bf16, i32, i64, i8, fp8_e4m3 };

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "f16", "bf16", "i32", "i64", "int8", "fp8_e4m3"
std::optional<DType> parse_dtype(std::string_view s);  // inverse of dtype_name ("i8", "fp8" also)
inline bool is_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }
// The 8-bit KV cache dtypes (values = code x scale, kv_quant.h).
inline bool is_kv8(DType t) { return t == DType::i8 || t == DType::fp8_e4m3; }

// The C++ element type behind each dtype; Eigen::half / Eigen::bfloat16 are layout-compatible
// with std::uint16_t, which is what the scalar conversions below take.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<Eigen::half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<Eigen::bfloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };

// IEEE binary16 <-> binary32, round to nearest even, NaN/Inf preserved, subnormals exact.
float half_bits_to_float(std::uint16_t h);
std::uint16_t float_to_half_bits(float f);

// bfloat16 <-> binary32: bf16 is the top 16 bits of f32; rounding to nearest even, NaN kept quiet.
inline float bf16_bits_to_float(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// Load element `i` of a float-typed buffer as float (f32/f16/bf16; int8 and fp8_e4m3 give the code's
// value, scale 1). Slow path; for oracles, glue and tests, not for inner loops.
float load_as_float(const void* data, DType t, std::size_t i);
void store_from_float(void* data, DType t, std::size_t i, float v);

}  // namespace attnops
