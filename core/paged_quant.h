// The 8-bit side of PagedKVCache (internal to core/): scale views checked, rows quantized for
// write(), codes dequantized for gather(). The rounding is kv_quant.h's.
#pragma once

#include <cstdint>
#include <vector>

#include "attnops/paged.h"

namespace attnops::paged_quant {

// Every scale of a host f32 view (any rank and strides) valid for dtype t, else
// Error(invalid_argument) naming `name` and the first bad element.
void check_scales(const TensorView& scales, DType t, const char* name);

// Rows x [N, H, Dh] (host, any float dtype and strides) quantized for an 8-bit cache of dtype t:
// codes [N, H, Dh] (contiguous, dtype t) and, per token, scales [N, H, 1] f32 (each (row, head)'s
// kv_row_scale), or with `tensor_scale` that one scale. Rows whose slot is negative are skipped
// (left 0). Error(invalid_argument) naming `name`, the row and the head when a row that is written
// holds NaN or inf.
struct Rows {
  Tensor codes, scales;
};
Rows quantize(const TensorView& x, const char* name, DType t, const float* tensor_scale,
              const std::vector<std::int64_t>& slots);

// Codes [1, T, H, Dh] of dtype t times scales ([1, T, H, 1] f32 per token, or one value) as f32.
Tensor dequantize(const Tensor& codes, DType t, const Tensor* token_scales, float tensor_scale);

}  // namespace attnops::paged_quant
