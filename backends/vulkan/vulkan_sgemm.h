// An SGEMM compute shader on the Vulkan device: the bench's measure of what a plain shader
// reaches there (a ceiling to read attention GFLOP/s against). Not part of the public API.
#pragma once

#include <cstdint>

#include "attnops/metadata.h"

namespace attnops::vulkan {

// c[M, N] = a[M, K] * b[K, N], all f32 row-major; M, N, K multiples of 4. Throws
// Error(invalid_argument) for other sizes, Error(unsupported_feature) when a matrix exceeds
// maxStorageBufferRange, Error(backend_unavailable) / Error(gpu_error) as run() does.
void sgemm(const float* a, const float* b, float* c, std::int64_t M, std::int64_t N, std::int64_t K,
           const GpuSettings& settings);

}  // namespace attnops::vulkan
