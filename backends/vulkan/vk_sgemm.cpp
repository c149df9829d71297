// The bench's SGEMM on the Vulkan device (vulkan_sgemm.h; shader: shaders/sgemm.comp).
#include <cstring>
#include <string>

#include "attnops/error.h"
#include "backends/vulkan/vk_runtime.h"
#include "backends/vulkan/vulkan_sgemm.h"

namespace attnops::vulkan {

void sgemm(const float* a, const float* b, float* c, std::int64_t M, std::int64_t N, std::int64_t K,
           const GpuSettings& settings) {
  if (M <= 0 || N <= 0 || K <= 0 || M % 4 || N % 4 || K % 4)
    throw Error(ErrorCode::invalid_argument, "sgemm: M, N, K must be positive multiples of 4, got " +
                                                 std::to_string(M) + ", " + std::to_string(N) + ", " +
                                                 std::to_string(K));
  rt::Context& ctx = rt::context(settings);
  const std::uint64_t range = ctx.physical().info.max_storage_buffer_range;
  const std::uint64_t bytes_a = static_cast<std::uint64_t>(M * K) * 4u,
                      bytes_b = static_cast<std::uint64_t>(K * N) * 4u,
                      bytes_c = static_cast<std::uint64_t>(M * N) * 4u;
  if (bytes_a > range || bytes_b > range || bytes_c > range)
    throw Error(ErrorCode::unsupported_feature,
                "sgemm: a matrix exceeds maxStorageBufferRange (" + std::to_string(range) + " bytes)");
  const std::uint32_t groups[3] = {static_cast<std::uint32_t>((N / 4 + 7) / 8),
                                   static_cast<std::uint32_t>((M / 4 + 7) / 8), 1u};
  std::lock_guard<std::mutex> lock(ctx.mutex());
  VkDevice dev = ctx.device();
  // sgemm.comp has no specialization constants (its workgroup is fixed at 8 x 8).
  rt::PipelineKey key;
  key.shader = ShaderId::sgemm;
  const VkPipeline pipeline = ctx.pipeline(key);
  ctx.persist_cache(settings.pipeline_cache);
  // Bindings 0 (A), 1 (B), 3 (C); the others get small dummies, as every binding must be valid.
  rt::Buffer bufs[rt::Context::kBindings];
  for (std::uint32_t i = 0; i < rt::Context::kBindings; ++i)
    bufs[i] = ctx.make_buffer(i == 0 ? bytes_a : i == 1 ? bytes_b : i == 3 ? bytes_c : 16u);
  std::memcpy(bufs[0].mapped, a, bytes_a);
  std::memcpy(bufs[1].mapped, b, bytes_b);
  rt::flush(dev, bufs[0]);
  rt::flush(dev, bufs[1]);
  const std::int32_t push[3] = {static_cast<std::int32_t>(M), static_cast<std::int32_t>(N),
                                static_cast<std::int32_t>(K)};
  ctx.dispatch(pipeline, bufs, push, sizeof push, groups);
  rt::invalidate(dev, bufs[3]);
  std::memcpy(c, bufs[3].mapped, bytes_c);
}

}  // namespace attnops::vulkan
