// The values of an 8-bit KV cache (PagedKVCache with dtype int8 or fp8_e4m3, paged.h): a stored
// code times an f32 scale, one scale per (token, kv head) or one per pool.
//
//   int8      signed integers; write() stores [-127, 127] (symmetric: -128 is never written, and
//             reads as -128 where a caller's pool holds it).
//   fp8_e4m3  OCP FP8 E4M3FN bit patterns: sign, 4 exponent bits (bias 7), 3 mantissa bits;
//             subnormals down to 2^-9, the largest finite value 448, no infinities, S.1111.111 NaN.
//
// Quantizing x with scale s (PagedKVCache::write): y = x / s as an f32 quotient (IEEE division),
//   int8: y rounded to the nearest integer, ties to even, then clamped to [-127, 127];
//   fp8:  y rounded to the nearest e4m3 value, ties to even; magnitudes past 448 (inf included)
//         saturate to +-448; the sign bit is kept (-0.0, and negatives that round to 0, give 0x80).
// The per-token scale of one row (the D or Dv values of a token's kv head) with absolute maximum
// a: s = a / 127 (int8) or a / 448 (fp8) as an f32 quotient, or s = 1 when that is not a normal f32
// number (a row of zeros, or of values below ~1e-36, which all quantize to 0).
// Dequantizing: the value is code x s, the f32 product (what PagedKVCache::gather returns and what
// every backend attends over: the kernels within the dense tolerances, the native oracle exactly).
// A valid scale is a normal f32 number > 0 whose product with the largest code (127 or 448) is
// finite; anything else (0, negative, subnormal, NaN, inf) is an Error naming the scale.
#pragma once

#include <cstdint>

#include "attnops/dtype.h"

namespace attnops {

inline constexpr float kInt8KvMax = 127.f;         // the largest int8 code write() stores
inline constexpr float kFp8E4m3Max = 448.f;        // the largest finite e4m3fn value
inline constexpr std::uint8_t kFp8E4m3NaN = 0x7f;  // S.1111.111 (either sign)

// The largest code magnitude of an 8-bit KV dtype: 127 (int8) or 448 (fp8_e4m3); 0 otherwise.
float kv_code_max(DType t);

// e4m3fn bits -> f32 (exact; NaN for S.1111.111).
float fp8_e4m3_to_float(std::uint8_t bits);
// f32 -> e4m3fn bits: round to nearest even, saturating to +-448 (inf too), sign kept; NaN -> 0x7f.
std::uint8_t fp8_e4m3_from_float(float x);
// f32 -> int8 code: round to nearest even, clamped to [-127, 127]; NaN -> 0.
std::int8_t int8_from_float(float x);

// The code of x under scale s (the rounding above) as a byte of dtype t (int8 or fp8_e4m3).
std::uint8_t kv_quantize(DType t, float x, float s);
// code x s in f32.
float kv_dequantize(DType t, std::uint8_t code, float s);
// The per-token scale of a row whose absolute maximum is `absmax` (finite, >= 0).
float kv_row_scale(DType t, float absmax);
// Whether s is a valid scale for dtype t (see above).
bool kv_scale_valid(DType t, float s);

}  // namespace attnops
