// The bench's SGEMM on the Vulkan device (vulkan_sgemm.h; shader: shaders/sgemm.comp).
#include <cstring>
#include <string>

#include "attnops/error.h"
#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vulkan_sgemm.h"

namespace attnops::vulkan {

void sgemm(const float* a, const float* b, float* c, std::int64_t M, std::int64_t N, std::int64_t K,
           const GpuSettings& settings) {
  if (M <= 0 || N <= 0 || K <= 0 || M % 4 || N % 4 || K % 4)
    throw Error(ErrorCode::invalid_argument, "sgemm: M, N, K must be positive multiples of 4, got " +
                                                 std::to_string(M) + ", " + std::to_string(N) + ", " +
                                                 std::to_string(K));
  const auto dev = rt::device(settings);
  const std::uint64_t range = dev->caps().max_storage_buffer_range;
  const std::uint64_t bytes_a = static_cast<std::uint64_t>(M * K) * 4u,
                      bytes_b = static_cast<std::uint64_t>(K * N) * 4u,
                      bytes_c = static_cast<std::uint64_t>(M * N) * 4u;
  if (bytes_a > range || bytes_b > range || bytes_c > range)
    throw Error(ErrorCode::unsupported_feature,
                "sgemm: a matrix exceeds maxStorageBufferRange (" + std::to_string(range) + " bytes)");
  const std::uint32_t groups[3] = {static_cast<std::uint32_t>((N / 4 + 7) / 8),
                                   static_cast<std::uint32_t>((M / 4 + 7) / 8), 1u};
  std::lock_guard<std::mutex> lock(dev->mutex());
  rt::Batch batch(*dev, false);
  const rt::Slice sa = batch.scratch(bytes_a), sb = batch.scratch(bytes_b), sc = batch.scratch(bytes_c);
  batch.upload(sa, 0, bytes_a, [&](std::byte* p) { std::memcpy(p, a, bytes_a); });
  batch.upload(sb, 0, bytes_b, [&](std::byte* p) { std::memcpy(p, b, bytes_b); });
  rt::PipelineKey key;  // sgemm.comp has no specialization constants (its workgroup is 8 x 8)
  key.shader = rt::ShaderId::sgemm;
  const std::int32_t push[3] = {static_cast<std::int32_t>(M), static_cast<std::int32_t>(N),
                                static_cast<std::int32_t>(K)};
  // Bindings 0 (A), 1 (B), 3 (C); binding 2 is unused by the shader.
  batch.dispatch(key, {sa, sb, rt::Slice{}, sc}, push, sizeof push, groups, "sgemm");
  batch.download(sc, 0, bytes_c, [&](const std::byte* p) { std::memcpy(c, p, bytes_c); });
  batch.submit();
  dev->persist_cache(settings.pipeline_cache);
}

}  // namespace attnops::vulkan
